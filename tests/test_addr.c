/* test_addr — PhysAddr factories, decode/encode round trips, validation and formatting. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "kb_addr.h"

static const unsigned gsips[] = {0, 1, 15, 16, 17, 254, 255};
static const unsigned cubes[] = {0, 1, 31};
static const unsigned pes[] = {0, 7, 15};

/* Decodes pa, checks the node fields, and checks that encode gives pa back. */
static kb_pa_fields roundtrip(kb_pa pa, unsigned gsip, unsigned cube)
{
    kb_pa_fields f = kb_pa_decode(pa);
    kb_pa_fields copy;

    assert_true(kb_pa_valid(pa));
    assert_true(pa <= KB_PA_MAX);
    assert_int_equal(f.rack, gsip / 16);
    assert_int_equal(f.sip, gsip % 16);
    assert_int_equal(f.cube, cube);
    assert_int_equal(kb_pa_gsip(pa), gsip);
    assert_int_equal(kb_pa_cube(pa), cube);
    copy = f;
    assert_int_equal(kb_pa_encode(&copy), pa);
    return f;
}

static void test_hbm_roundtrip(void **state)
{
    const uint64_t offs[] = {0, 1, 0x40000000, KB_HBM_WINDOW_BYTES - 1};
    size_t g, c, o;

    (void)state;
    for (g = 0; g < sizeof gsips / sizeof gsips[0]; g++)
        for (c = 0; c < sizeof cubes / sizeof cubes[0]; c++)
            for (o = 0; o < sizeof offs / sizeof offs[0]; o++) {
                kb_pa pa = kb_pa_hbm(gsips[g], cubes[c], offs[o]);
                kb_pa_fields f = roundtrip(pa, gsips[g], cubes[c]);
                assert_int_equal(f.kind, KB_PA_HBM);
                assert_int_equal(f.offset, offs[o]);
            }
    /* Exact bit layout: rack 15, sip 15, cube 31, HBM bit, top offset => every bit set. */
    assert_int_equal(kb_pa_hbm(255, 31, KB_HBM_WINDOW_BYTES - 1), KB_PA_MAX);
    assert_int_equal(kb_pa_hbm(0, 0, 0), UINT64_C(1) << 37);
    assert_int_equal(kb_pa_hbm(17, 2, 0x10),
                     (UINT64_C(1) << 47) | (UINT64_C(1) << 43) | (UINT64_C(2) << 38) |
                         (UINT64_C(1) << 37) | 0x10);
}

static void test_pe_hbm(void **state)
{
    const uint64_t slice = UINT64_C(6) << 30; /* 6 GiB per PE */
    size_t g, c, p;

    (void)state;
    for (g = 0; g < sizeof gsips / sizeof gsips[0]; g++)
        for (c = 0; c < sizeof cubes / sizeof cubes[0]; c++)
            for (p = 0; p < sizeof pes / sizeof pes[0]; p++) {
                kb_pa pa = kb_pa_pe_hbm(gsips[g], cubes[c], pes[p], slice - 1, slice);
                kb_pa_fields f = roundtrip(pa, gsips[g], cubes[c]);
                assert_int_equal(f.kind, KB_PA_HBM);
                assert_int_equal(f.offset, pes[p] * slice + slice - 1);
                assert_int_equal(pa, kb_pa_hbm(gsips[g], cubes[c], pes[p] * slice + slice - 1));
            }
    /* 16 slices of 8 GiB fill the 128 GiB window exactly; 8 GiB + 1 does not fit for pe 15. */
    assert_true(kb_pa_valid(kb_pa_pe_hbm(0, 0, 15, (UINT64_C(8) << 30) - 1, UINT64_C(8) << 30)));
    assert_int_equal(kb_pa_pe_hbm(0, 0, 15, UINT64_C(8) << 30, (UINT64_C(8) << 30) + 1),
                     KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_pe_hbm(0, 0, 0, slice, slice), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_pe_hbm(0, 0, 0, 0, 0), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_pe_hbm(0, 0, 16, 0, 1), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_pe_hbm(0, 0, 1, 0, UINT64_MAX), KB_PA_INVALID_ADDR);
}

typedef kb_pa (*pe_factory)(unsigned, unsigned, unsigned, uint64_t);

static void test_pe_ranges_roundtrip(void **state)
{
    const pe_factory fac[KB_PE_NRANGES] = {kb_pa_pe_tcm, kb_pa_pe_ipcq, kb_pa_pe_scratch};
    const uint64_t offs[] = {0, 0x1200, KB_PE_RANGE_BYTES - 1};
    size_t g, c, p, o;
    int r;

    (void)state;
    for (r = 0; r < KB_PE_NRANGES; r++)
        for (g = 0; g < sizeof gsips / sizeof gsips[0]; g++)
            for (c = 0; c < sizeof cubes / sizeof cubes[0]; c++)
                for (p = 0; p < sizeof pes / sizeof pes[0]; p++)
                    for (o = 0; o < sizeof offs / sizeof offs[0]; o++) {
                        kb_pa pa = fac[r](gsips[g], cubes[c], pes[p], offs[o]);
                        kb_pa_fields f = roundtrip(pa, gsips[g], cubes[c]);
                        assert_int_equal(f.kind, KB_PA_PE_RES);
                        assert_int_equal(f.pe, pes[p]);
                        assert_int_equal(f.range, r);
                        assert_int_equal(f.offset, offs[o]);
                        assert_int_equal(pa, kb_pa_pe_range(gsips[g], cubes[c], pes[p],
                                                            (kb_pe_range)r, offs[o]));
                    }
    /* Bit layout: resource window, unit PE (0), pe id at 30, range at 27. */
    assert_int_equal(kb_pa_pe_ipcq(1, 3, 5, 0x1200),
                     (UINT64_C(1) << 43) | (UINT64_C(3) << 38) | (UINT64_C(5) << 30) |
                         (UINT64_C(1) << 27) | 0x1200);
    assert_int_equal(kb_pa_pe_scratch(0, 0, 0, 0), UINT64_C(2) << 27);
}

static void test_sram_mcpu_roundtrip(void **state)
{
    const uint64_t offs[] = {0, 0x100, KB_SUB_OFFSET_BYTES - 1};
    size_t g, c, o;

    (void)state;
    for (g = 0; g < sizeof gsips / sizeof gsips[0]; g++)
        for (c = 0; c < sizeof cubes / sizeof cubes[0]; c++)
            for (o = 0; o < sizeof offs / sizeof offs[0]; o++) {
                kb_pa s = kb_pa_cube_sram(gsips[g], cubes[c], offs[o]);
                kb_pa m = kb_pa_mcpu(gsips[g], cubes[c], offs[o]);
                kb_pa_fields fs = roundtrip(s, gsips[g], cubes[c]);
                kb_pa_fields fm = roundtrip(m, gsips[g], cubes[c]);
                assert_int_equal(fs.kind, KB_PA_SRAM);
                assert_int_equal(fs.offset, offs[o]);
                assert_int_equal(fs.pe, 0);
                assert_int_equal(fm.kind, KB_PA_MCPU);
                assert_int_equal(fm.offset, offs[o]);
                assert_int_not_equal(s, m);
            }
    assert_int_equal(kb_pa_cube_sram(0, 0, 0), UINT64_C(2) << 34);
    assert_int_equal(kb_pa_mcpu(0, 0, 0), UINT64_C(1) << 34);
}

static void test_factories_reject_out_of_range(void **state)
{
    (void)state;
    assert_int_equal(kb_pa_hbm(256, 0, 0), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_hbm(0, 32, 0), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_hbm(0, 0, KB_HBM_WINDOW_BYTES), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_pe_tcm(256, 0, 0, 0), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_pe_tcm(0, 32, 0, 0), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_pe_tcm(0, 0, 16, 0), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_pe_tcm(0, 0, 0, KB_PE_RANGE_BYTES), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_pe_ipcq(0, 0, 0, KB_PE_RANGE_BYTES), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_pe_scratch(0, 0, 0, KB_PE_RANGE_BYTES), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_pe_range(0, 0, 0, KB_PE_NRANGES, 0), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_cube_sram(0, 0, KB_SUB_OFFSET_BYTES), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_cube_sram(0, 32, 0), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_mcpu(256, 0, 0), KB_PA_INVALID_ADDR);
    assert_int_equal(kb_pa_mcpu(0, 0, KB_SUB_OFFSET_BYTES), KB_PA_INVALID_ADDR);
    assert_false(kb_pa_valid(KB_PA_INVALID_ADDR));
    assert_int_equal(kb_pa_decode(KB_PA_INVALID_ADDR).kind, KB_PA_INVALID);
}

static void test_decode_rejects_bad_bits(void **state)
{
    kb_pa good = kb_pa_pe_tcm(3, 4, 5, 0x10);

    (void)state;
    assert_true(kb_pa_valid(good));
    /* Any bit above 50. */
    assert_int_equal(kb_pa_decode(good | (UINT64_C(1) << 51)).kind, KB_PA_INVALID);
    assert_int_equal(kb_pa_decode(good | (UINT64_C(1) << 63)).kind, KB_PA_INVALID);
    assert_int_equal(kb_pa_decode(KB_PA_MAX + 1).kind, KB_PA_INVALID);
    /* ext bit. */
    assert_int_equal(kb_pa_decode(good | (UINT64_C(1) << 29)).kind, KB_PA_INVALID);
    assert_int_equal(kb_pa_decode(kb_pa_cube_sram(0, 0, 0) | (UINT64_C(1) << 29)).kind,
                     KB_PA_INVALID);
    /* Unit types 3..7 are unknown. */
    for (uint64_t u = 3; u < 8; u++)
        assert_int_equal(kb_pa_decode(u << 34).kind, KB_PA_INVALID);
    /* pe id with MCPU / SRAM. */
    assert_int_equal(kb_pa_decode(kb_pa_mcpu(0, 0, 0) | (UINT64_C(1) << 30)).kind, KB_PA_INVALID);
    assert_int_equal(kb_pa_decode(kb_pa_cube_sram(0, 0, 0) | (UINT64_C(15) << 30)).kind,
                     KB_PA_INVALID);
    /* The reserved fourth PE range. */
    assert_int_equal(kb_pa_decode(UINT64_C(3) << 27).kind, KB_PA_INVALID);
    assert_int_equal(kb_pa_decode((UINT64_C(3) << 27) | (KB_PE_RANGE_BYTES - 1)).kind,
                     KB_PA_INVALID);
    /* The HBM window uses the ext/unit bits as offset, so the same bits are valid there. */
    assert_int_equal(kb_pa_decode((UINT64_C(1) << 37) | (UINT64_C(7) << 34) |
                                  (UINT64_C(1) << 29))
                         .kind,
                     KB_PA_HBM);
}

static void test_encode_rejects_bad_fields(void **state)
{
    kb_pa_fields f;

    (void)state;
    assert_int_equal(kb_pa_encode(NULL), KB_PA_INVALID_ADDR);
    memset(&f, 0, sizeof f);
    f.kind = KB_PA_INVALID;
    assert_int_equal(kb_pa_encode(&f), KB_PA_INVALID_ADDR);
    f.kind = KB_PA_HBM;
    assert_int_equal(kb_pa_encode(&f), UINT64_C(1) << 37);
    f.rack = 16;
    assert_int_equal(kb_pa_encode(&f), KB_PA_INVALID_ADDR);
    f.rack = 0;
    f.sip = 16;
    assert_int_equal(kb_pa_encode(&f), KB_PA_INVALID_ADDR);
    f.sip = 0;
    f.cube = 32;
    assert_int_equal(kb_pa_encode(&f), KB_PA_INVALID_ADDR);
    f.cube = 0;
    f.kind = KB_PA_PE_RES;
    f.range = KB_PE_NRANGES;
    assert_int_equal(kb_pa_encode(&f), KB_PA_INVALID_ADDR);
    f.range = KB_PE_IPCQ;
    f.pe = 16;
    assert_int_equal(kb_pa_encode(&f), KB_PA_INVALID_ADDR);
    f.pe = 2;
    f.offset = KB_PE_RANGE_BYTES;
    assert_int_equal(kb_pa_encode(&f), KB_PA_INVALID_ADDR);
    f.offset = 7;
    assert_int_equal(kb_pa_encode(&f), kb_pa_pe_ipcq(0, 0, 2, 7));
    f.kind = KB_PA_SRAM;
    f.offset = KB_SUB_OFFSET_BYTES;
    assert_int_equal(kb_pa_encode(&f), KB_PA_INVALID_ADDR);
}

static void test_range_names(void **state)
{
    (void)state;
    assert_string_equal(kb_pe_range_name(KB_PE_TCM), "tcm");
    assert_string_equal(kb_pe_range_name(KB_PE_IPCQ), "ipcq");
    assert_string_equal(kb_pe_range_name(KB_PE_SCRATCH), "scratch");
    assert_null(kb_pe_range_name(KB_PE_NRANGES));
    assert_int_equal(kb_pe_range_from_name("tcm"), KB_PE_TCM);
    assert_int_equal(kb_pe_range_from_name("ipcq"), KB_PE_IPCQ);
    assert_int_equal(kb_pe_range_from_name("scratch"), KB_PE_SCRATCH);
    assert_int_equal(kb_pe_range_from_name("TCM"), -1);
    assert_int_equal(kb_pe_range_from_name(""), -1);
    assert_int_equal(kb_pe_range_from_name(NULL), -1);
}

static void test_format(void **state)
{
    char buf[96];

    (void)state;
    assert_string_equal(kb_pa_format(kb_pa_pe_ipcq(1, 3, 5, 0x1200), buf, sizeof buf),
                        "sip=1 cube=3 pe=5 ipcq+0x1200");
    assert_string_equal(kb_pa_format(kb_pa_hbm(0, 2, 0x40000000), buf, sizeof buf),
                        "sip=0 cube=2 hbm+0x40000000");
    assert_string_equal(kb_pa_format(kb_pa_cube_sram(18, 0, 0x100), buf, sizeof buf),
                        "rack=1 sip=2 cube=0 sram+0x100");
    assert_string_equal(kb_pa_format(kb_pa_pe_tcm(0, 0, 0, 0), buf, sizeof buf),
                        "sip=0 cube=0 pe=0 tcm+0x0");
    assert_string_equal(kb_pa_format(kb_pa_pe_scratch(255, 31, 15, KB_PE_RANGE_BYTES - 1), buf,
                                     sizeof buf),
                        "rack=15 sip=15 cube=31 pe=15 scratch+0x7ffffff");
    assert_string_equal(kb_pa_format(kb_pa_mcpu(4, 7, 0xabc), buf, sizeof buf),
                        "sip=4 cube=7 mcpu+0xabc");
    assert_string_equal(kb_pa_format(KB_PA_INVALID_ADDR, buf, sizeof buf),
                        "invalid(0xffffffffffffffff)");
    assert_string_equal(kb_pa_format(UINT64_C(3) << 27, buf, sizeof buf), "invalid(0x18000000)");
    /* Truncation keeps the NUL inside n bytes. */
    memset(buf, 'x', sizeof buf);
    assert_string_equal(kb_pa_format(kb_pa_hbm(0, 2, 0x40000000), buf, 8), "sip=0 c");
    assert_int_equal(buf[8], 'x');
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hbm_roundtrip),
        cmocka_unit_test(test_pe_hbm),
        cmocka_unit_test(test_pe_ranges_roundtrip),
        cmocka_unit_test(test_sram_mcpu_roundtrip),
        cmocka_unit_test(test_factories_reject_out_of_range),
        cmocka_unit_test(test_decode_rejects_bad_bits),
        cmocka_unit_test(test_encode_rejects_bad_fields),
        cmocka_unit_test(test_range_names),
        cmocka_unit_test(test_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
