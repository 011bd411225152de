/* test_mmu — segment mapping, translation with contiguity, overlap and unmap rules. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "kb_mmu.h"

static void test_map_translate(void **state)
{
    kb_mmu *m = kb_mmu_create();
    kb_pa p0 = kb_pa_pe_hbm(0, 0, 0, 0x100, UINT64_C(1) << 30);
    kb_pa p1 = kb_pa_pe_hbm(0, 1, 3, 0, UINT64_C(1) << 30);
    kb_pa pa = 0;
    uint64_t contig = 0;
    kb_errbuf eb;

    (void)state;
    assert_non_null(m);
    assert_int_equal(kb_mmu_nsegments(m), 0);
    /* Inserted out of order: the table keeps them sorted. */
    assert_int_equal(kb_mmu_map(m, 0x20000, 0x1000, p1, &eb), 0);
    assert_int_equal(kb_mmu_map(m, 0x10000, 0x1000, p0, &eb), 0);
    assert_int_equal(kb_mmu_nsegments(m), 2);

    assert_int_equal(kb_mmu_translate(m, 0x10000, &pa, &contig, &eb), 0);
    assert_int_equal(pa, p0);
    assert_int_equal(contig, 0x1000);
    assert_int_equal(kb_mmu_translate(m, 0x10fff, &pa, &contig, &eb), 0);
    assert_int_equal(pa, p0 + 0xfff);
    assert_int_equal(contig, 1);
    assert_int_equal(kb_mmu_translate(m, 0x20800, &pa, NULL, &eb), 0);
    assert_int_equal(pa, p1 + 0x800);

    /* Just outside each segment, before the first and after the last. */
    pa = 42;
    assert_int_equal(kb_mmu_translate(m, 0x11000, &pa, &contig, &eb), KB_ERR_NOTFOUND);
    assert_string_equal(eb.msg, "unmapped virtual address 0x11000");
    assert_int_equal(pa, 42);
    assert_int_equal(kb_mmu_translate(m, 0xffff, &pa, &contig, &eb), KB_ERR_NOTFOUND);
    assert_string_equal(eb.msg, "unmapped virtual address 0xffff");
    assert_int_equal(kb_mmu_translate(m, 0x21000, &pa, NULL, NULL), KB_ERR_NOTFOUND);
    assert_int_equal(kb_mmu_translate(m, 0, &pa, NULL, NULL), KB_ERR_NOTFOUND);
    kb_mmu_destroy(m);
    kb_mmu_destroy(NULL);
}

static void test_overlap(void **state)
{
    kb_mmu *m = kb_mmu_create();
    kb_pa p = kb_pa_hbm(0, 0, 0);
    kb_errbuf eb;

    (void)state;
    assert_int_equal(kb_mmu_map(m, 0x1000, 0x1000, p, &eb), 0);
    assert_int_equal(kb_mmu_map(m, 0x3000, 0x1000, p, &eb), 0);
    /* Overlap the tail of the first, the head of the second, contain one, be contained. */
    assert_int_equal(kb_mmu_map(m, 0x1fff, 0x10, p, &eb), KB_ERR_INVAL);
    assert_string_equal(eb.msg, "mmu: [0x1fff, 0x200f) overlaps the mapped segment "
                                "[0x1000, 0x2000)");
    assert_int_equal(kb_mmu_map(m, 0x2800, 0x801, p, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_mmu_map(m, 0x0, 0x10000, p, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_mmu_map(m, 0x3100, 0x10, p, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_mmu_map(m, 0x1000, 0x1000, p, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_mmu_nsegments(m), 2);
    /* Exactly filling the gap touches both neighbours but overlaps neither. */
    assert_int_equal(kb_mmu_map(m, 0x2000, 0x1000, p + 0x5000, &eb), 0);
    assert_int_equal(kb_mmu_nsegments(m), 3);
    /* Bad arguments. */
    assert_int_equal(kb_mmu_map(m, 0x9000, 0, p, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_mmu_map(m, UINT64_MAX - 4, 0x10, p, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_mmu_map(m, 0x9000, 0x10, KB_PA_INVALID_ADDR, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_mmu_nsegments(m), 3);
    kb_mmu_destroy(m);
}

static void test_contig_across_segments(void **state)
{
    kb_mmu *m = kb_mmu_create();
    kb_pa a = kb_pa_pe_tcm(1, 2, 3, 0);
    kb_pa b = kb_pa_pe_scratch(1, 2, 4, 0x40);
    kb_pa pa;
    uint64_t contig;

    (void)state;
    /* Adjacent VA segments stay separate: contig stops at each segment's end. */
    assert_int_equal(kb_mmu_map(m, 0x100000, 0x300, a, NULL), 0);
    assert_int_equal(kb_mmu_map(m, 0x100300, 0x200, b, NULL), 0);
    assert_int_equal(kb_mmu_translate(m, 0x100100, &pa, &contig, NULL), 0);
    assert_int_equal(pa, a + 0x100);
    assert_int_equal(contig, 0x200);
    assert_int_equal(kb_mmu_translate(m, 0x100300, &pa, &contig, NULL), 0);
    assert_int_equal(pa, b);
    assert_int_equal(contig, 0x200);
    kb_mmu_destroy(m);
}

static void test_unmap(void **state)
{
    kb_mmu *m = kb_mmu_create();
    kb_pa p = kb_pa_cube_sram(0, 0, 0);
    kb_pa pa;
    kb_errbuf eb;
    int i;

    (void)state;
    for (i = 0; i < 4; i++)
        assert_int_equal(kb_mmu_map(m, 0x1000 * (uint64_t)(i + 1), 0x800, p + 0x800 * (uint64_t)i,
                                    NULL),
                         0);
    /* A range cutting a segment in half is refused and removes nothing. */
    assert_int_equal(kb_mmu_unmap(m, 0x1000, 0x2400, &eb), KB_ERR_INVAL);
    assert_non_null(strstr(eb.msg, "[0x3000, 0x3800)"));
    assert_int_equal(kb_mmu_unmap(m, 0x1400, 0x1000, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_mmu_nsegments(m), 4);
    /* Nothing mapped there. */
    assert_int_equal(kb_mmu_unmap(m, 0x1800, 0x800, &eb), KB_ERR_NOTFOUND);
    assert_int_equal(kb_mmu_unmap(m, 0x1000, 0, &eb), KB_ERR_INVAL);
    /* One range holding the middle two segments (and the holes around them). */
    assert_int_equal(kb_mmu_unmap(m, 0x1800, 0x2800, &eb), 0);
    assert_int_equal(kb_mmu_nsegments(m), 2);
    assert_int_equal(kb_mmu_translate(m, 0x2000, &pa, NULL, NULL), KB_ERR_NOTFOUND);
    assert_int_equal(kb_mmu_translate(m, 0x3000, &pa, NULL, NULL), KB_ERR_NOTFOUND);
    assert_int_equal(kb_mmu_translate(m, 0x1010, &pa, NULL, NULL), 0);
    assert_int_equal(pa, p + 0x10);
    assert_int_equal(kb_mmu_translate(m, 0x4010, &pa, NULL, NULL), 0);
    assert_int_equal(pa, p + 0x1800 + 0x10);
    /* Exact unmap, then the VA can be mapped again elsewhere. */
    assert_int_equal(kb_mmu_unmap(m, 0x1000, 0x800, &eb), 0);
    assert_int_equal(kb_mmu_map(m, 0x1000, 0x1000, p + 0x4000, &eb), 0);
    assert_int_equal(kb_mmu_translate(m, 0x1800, &pa, NULL, NULL), 0);
    assert_int_equal(pa, p + 0x4800);
    assert_int_equal(kb_mmu_nsegments(m), 2);
    kb_mmu_destroy(m);
}

/* Many segments: every one translates, binary search finds first, middle and last. */
static void test_many_segments(void **state)
{
    enum { N = 1000 };
    kb_mmu *m = kb_mmu_create();
    kb_pa base = kb_pa_hbm(3, 7, 0);
    kb_pa pa;
    uint64_t contig;
    int i;

    (void)state;
    /* Insert in a scrambled order (7 is coprime with 1000). */
    for (i = 0; i < N; i++) {
        uint64_t k = (uint64_t)((i * 7) % N);
        assert_int_equal(kb_mmu_map(m, 0x10000 + k * 0x100, 0x80, base + k * 0x1000, NULL), 0);
    }
    assert_int_equal(kb_mmu_nsegments(m), N);
    for (i = 0; i < N; i++) {
        uint64_t va = 0x10000 + (uint64_t)i * 0x100;
        assert_int_equal(kb_mmu_translate(m, va + 0x7f, &pa, &contig, NULL), 0);
        assert_int_equal(pa, base + (uint64_t)i * 0x1000 + 0x7f);
        assert_int_equal(contig, 1);
        assert_int_equal(kb_mmu_translate(m, va + 0x80, &pa, NULL, NULL), KB_ERR_NOTFOUND);
    }
    kb_mmu_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_translate),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_contig_across_segments),
        cmocka_unit_test(test_unmap),
        cmocka_unit_test(test_many_segments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
