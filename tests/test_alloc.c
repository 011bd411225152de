/* test_alloc — first-fit allocator: alignment, order, merging, exhaustion, fragmentation. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "kb_alloc.h"

#define GiB (UINT64_C(1) << 30)

static void test_create_destroy(void **state)
{
    kb_alloc *a = kb_alloc_create("tcm", 0x1000, 0x10000);
    uint64_t x = 0;

    (void)state;
    assert_non_null(a);
    assert_int_equal(kb_alloc_base(a), 0x1000);
    assert_int_equal(kb_alloc_size(a), 0x10000);
    assert_int_equal(kb_alloc_used(a), 0);
    assert_int_equal(kb_alloc_largest_free(a), 0x10000);
    assert_int_equal(kb_alloc_nblocks(a), 0);
    kb_alloc_destroy(a);
    kb_alloc_destroy(NULL);
    /* The region must end at or below UINT64_MAX (its end address must be representable). */
    assert_null(kb_alloc_create("wrap", UINT64_MAX - 10, 11));
    a = kb_alloc_create("top", UINT64_MAX - 10, 10);
    assert_non_null(a);
    /* Aligning up past 2^64 must not wrap to address 0. */
    assert_int_equal(kb_alloc_alloc(a, 4, UINT64_C(1) << 63, &x, NULL), KB_ERR_NOSPACE);
    assert_int_equal(kb_alloc_alloc(a, 10, 2, &x, NULL), KB_ERR_NOSPACE);
    assert_int_equal(kb_alloc_alloc(a, 10, 1, &x, NULL), 0);
    assert_int_equal(x, UINT64_MAX - 10);
    kb_alloc_destroy(a);
}

static void test_alignment(void **state)
{
    kb_alloc *a = kb_alloc_create("hbm", 0x1003, 0x10000);
    kb_errbuf eb;
    uint64_t x, y, z;

    (void)state;
    /* align 0 means 1: the first byte. */
    assert_int_equal(kb_alloc_alloc(a, 5, 0, &x, &eb), 0);
    assert_int_equal(x, 0x1003);
    /* Next free byte is 0x1008; aligned to 0x100 => 0x1100, leaving [0x1008,0x1100) free. */
    assert_int_equal(kb_alloc_alloc(a, 0x10, 0x100, &y, &eb), 0);
    assert_int_equal(y, 0x1100);
    /* The leading gap went back to the free list: first fit finds it. */
    assert_int_equal(kb_alloc_alloc(a, 8, 8, &z, &eb), 0);
    assert_int_equal(z, 0x1008);
    assert_int_equal(kb_alloc_used(a), 5 + 0x10 + 8);
    assert_int_equal(kb_alloc_nblocks(a), 3);
    /* Non-power-of-two alignment and zero size are invalid and change nothing. */
    assert_int_equal(kb_alloc_alloc(a, 8, 12, &x, &eb), KB_ERR_INVAL);
    assert_non_null(strstr(eb.msg, "power of two"));
    assert_int_equal(kb_alloc_alloc(a, 0, 8, &x, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_alloc_alloc(a, 8, 8, NULL, &eb), KB_ERR_INVAL);
    assert_int_equal(kb_alloc_used(a), 5 + 0x10 + 8);
    assert_int_equal(kb_alloc_nblocks(a), 3);
    assert_int_equal(kb_alloc_free(a, y, &eb), 0);
    assert_int_equal(kb_alloc_free(a, x = 0x1003, &eb), 0);
    assert_int_equal(kb_alloc_free(a, z, NULL), 0);
    assert_int_equal(kb_alloc_used(a), 0);
    assert_int_equal(kb_alloc_largest_free(a), 0x10000);
    kb_alloc_destroy(a);
}

static void test_first_fit_order(void **state)
{
    kb_alloc *a = kb_alloc_create("sram", 0, 1000);
    uint64_t p[5], q;
    int i;

    (void)state;
    for (i = 0; i < 5; i++) {
        assert_int_equal(kb_alloc_alloc(a, 100, 1, &p[i], NULL), 0);
        assert_int_equal(p[i], (uint64_t)i * 100);
    }
    /* Holes at 100 (100 bytes) and 300 (100 bytes); tail [500,1000). */
    assert_int_equal(kb_alloc_free(a, 100, NULL), 0);
    assert_int_equal(kb_alloc_free(a, 300, NULL), 0);
    /* 150 bytes fit in no hole: goes to the tail. */
    assert_int_equal(kb_alloc_alloc(a, 150, 1, &q, NULL), 0);
    assert_int_equal(q, 500);
    /* 60 bytes: the lowest hole, then the remainder of it, then the next hole. */
    assert_int_equal(kb_alloc_alloc(a, 60, 1, &q, NULL), 0);
    assert_int_equal(q, 100);
    assert_int_equal(kb_alloc_alloc(a, 40, 1, &q, NULL), 0);
    assert_int_equal(q, 160);
    assert_int_equal(kb_alloc_alloc(a, 41, 1, &q, NULL), 0);
    assert_int_equal(q, 300);
    assert_int_equal(kb_alloc_nblocks(a), 3 + 4);
    assert_int_equal(kb_alloc_used(a), 300 + 150 + 60 + 40 + 41);
    assert_int_equal(kb_alloc_largest_free(a), 1000 - 650);
    kb_alloc_destroy(a);
}

static void test_merge_on_free(void **state)
{
    kb_alloc *a = kb_alloc_create("scratch", 0x4000, 0x3000);
    uint64_t x, y, z, big;
    kb_errbuf eb;

    (void)state;
    assert_int_equal(kb_alloc_alloc(a, 0x1000, 0x1000, &x, NULL), 0);
    assert_int_equal(kb_alloc_alloc(a, 0x1000, 0x1000, &y, NULL), 0);
    assert_int_equal(kb_alloc_alloc(a, 0x1000, 0x1000, &z, NULL), 0);
    assert_int_equal(x, 0x4000);
    assert_int_equal(y, 0x5000);
    assert_int_equal(z, 0x6000);
    assert_int_equal(kb_alloc_largest_free(a), 0);
    /* b then a: a merges forward with b into one 0x2000 block. */
    assert_int_equal(kb_alloc_free(a, y, NULL), 0);
    assert_int_equal(kb_alloc_largest_free(a), 0x1000);
    assert_int_equal(kb_alloc_free(a, x, NULL), 0);
    assert_int_equal(kb_alloc_largest_free(a), 0x2000);
    assert_int_equal(kb_alloc_alloc(a, 0x2000, 1, &big, NULL), 0);
    assert_int_equal(big, 0x4000);
    assert_int_equal(kb_alloc_free(a, big, NULL), 0);
    /* Freeing c merges backward: the whole region is one block again. */
    assert_int_equal(kb_alloc_free(a, z, NULL), 0);
    assert_int_equal(kb_alloc_largest_free(a), 0x3000);
    assert_int_equal(kb_alloc_used(a), 0);
    /* Double free and unknown / interior addresses are rejected. */
    assert_int_equal(kb_alloc_free(a, z, &eb), KB_ERR_INVAL);
    assert_non_null(strstr(eb.msg, "scratch"));
    assert_non_null(strstr(eb.msg, "0x6000"));
    assert_int_equal(kb_alloc_alloc(a, 0x100, 1, &x, NULL), 0);
    assert_int_equal(kb_alloc_free(a, x + 1, NULL), KB_ERR_INVAL);
    assert_int_equal(kb_alloc_nblocks(a), 1);
    /* Free y, then z between two free blocks (merges both sides), then x (merges forward). */
    assert_int_equal(kb_alloc_alloc(a, 0x100, 1, &y, NULL), 0);
    assert_int_equal(kb_alloc_alloc(a, 0x100, 1, &z, NULL), 0);
    assert_int_equal(y, 0x4100);
    assert_int_equal(z, 0x4200);
    assert_int_equal(kb_alloc_free(a, y, NULL), 0);
    assert_int_equal(kb_alloc_largest_free(a), 0x3000 - 0x300);
    assert_int_equal(kb_alloc_free(a, z, NULL), 0);
    assert_int_equal(kb_alloc_largest_free(a), 0x3000 - 0x100);
    assert_int_equal(kb_alloc_free(a, x, NULL), 0);
    assert_int_equal(kb_alloc_largest_free(a), 0x3000);
    kb_alloc_destroy(a);
}

static void test_exhaustion(void **state)
{
    kb_alloc *a = kb_alloc_create("hbm slice sip0/cube0/pe0", 0, 6 * GiB);
    kb_errbuf eb;
    uint64_t x = 12345, y;

    (void)state;
    memset(&eb, 0, sizeof eb);
    assert_int_equal(kb_alloc_alloc(a, 7 * GiB, 64, &x, &eb), KB_ERR_NOSPACE);
    assert_string_equal(eb.msg, "hbm slice sip0/cube0/pe0: cannot allocate 7.00 GiB: 6.00 GiB "
                                "free, largest free block 6.00 GiB of 6.00 GiB");
    assert_int_equal(x, 12345);
    assert_int_equal(kb_alloc_used(a), 0);
    assert_int_equal(kb_alloc_nblocks(a), 0);
    /* After a partial allocation, the numbers follow and nothing changes on failure. */
    assert_int_equal(kb_alloc_alloc(a, GiB + GiB / 2, 0, &y, &eb), 0);
    assert_int_equal(kb_alloc_alloc(a, 5 * GiB, 0, &x, &eb), KB_ERR_NOSPACE);
    assert_string_equal(eb.msg, "hbm slice sip0/cube0/pe0: cannot allocate 5.00 GiB: 4.50 GiB "
                                "free, largest free block 4.50 GiB of 6.00 GiB");
    assert_int_equal(kb_alloc_used(a), GiB + GiB / 2);
    assert_int_equal(kb_alloc_nblocks(a), 1);
    assert_int_equal(kb_alloc_alloc(a, 6 * GiB - (GiB + GiB / 2), 0, &x, &eb), 0);
    assert_int_equal(kb_alloc_largest_free(a), 0);
    assert_int_equal(kb_alloc_alloc(a, 1, 0, &x, NULL), KB_ERR_NOSPACE);
    kb_alloc_destroy(a);
}

static void test_fragmentation(void **state)
{
    kb_alloc *a = kb_alloc_create("tcm pe3", 0x400, 4096);
    uint64_t p[4], x;
    kb_errbuf eb;
    int i;

    (void)state;
    for (i = 0; i < 4; i++)
        assert_int_equal(kb_alloc_alloc(a, 1024, 0, &p[i], NULL), 0);
    assert_int_equal(kb_alloc_free(a, p[0], NULL), 0);
    assert_int_equal(kb_alloc_free(a, p[2], NULL), 0);
    /* 2 KiB free in total, but in two 1 KiB blocks. */
    assert_int_equal(kb_alloc_alloc(a, 1536, 0, &x, &eb), KB_ERR_NOSPACE);
    assert_string_equal(eb.msg, "tcm pe3: cannot allocate 1.50 KiB: 2.00 KiB free, largest free "
                                "block 1.00 KiB of 4.00 KiB");
    assert_int_equal(kb_alloc_used(a), 2048);
    assert_int_equal(kb_alloc_nblocks(a), 2);
    /* Alignment alone can make a large-enough block unusable; the message says so. */
    assert_int_equal(kb_alloc_free(a, p[1], NULL), 0); /* [0x400, 0x1000) free */
    assert_int_equal(kb_alloc_alloc(a, 2048, 4096, &x, &eb), KB_ERR_NOSPACE);
    assert_non_null(strstr(eb.msg, "cannot allocate 2.00 KiB: 3.00 KiB free, largest free "
                                    "block 3.00 KiB of 4.00 KiB"));
    assert_non_null(strstr(eb.msg, "alignment 4.00 KiB"));
    assert_int_equal(kb_alloc_alloc(a, 2048, 2048, &x, &eb), 0);
    assert_int_equal(x, 0x800);
    kb_alloc_destroy(a);
}

static void test_fmt_bytes(void **state)
{
    char buf[32];

    (void)state;
    assert_string_equal(kb_fmt_bytes(0, buf, sizeof buf), "0 B");
    assert_string_equal(kb_fmt_bytes(512, buf, sizeof buf), "512 B");
    assert_string_equal(kb_fmt_bytes(1023, buf, sizeof buf), "1023 B");
    assert_string_equal(kb_fmt_bytes(1024, buf, sizeof buf), "1.00 KiB");
    assert_string_equal(kb_fmt_bytes(3 * 1024 * 1024 / 2, buf, sizeof buf), "1.50 MiB");
    assert_string_equal(kb_fmt_bytes(7 * GiB, buf, sizeof buf), "7.00 GiB");
    assert_string_equal(kb_fmt_bytes(GiB / 4 * 5, buf, sizeof buf), "1.25 GiB");
    assert_string_equal(kb_fmt_bytes(UINT64_C(2) << 40, buf, sizeof buf), "2.00 TiB");
    assert_string_equal(kb_fmt_bytes(UINT64_MAX, buf, sizeof buf), "16.00 EiB");
    assert_string_equal(kb_fmt_bytes(7 * GiB, buf, 5), "7.00");
}

/* Many allocations and frees in a scrambled order end with one free block again. */
static void test_many(void **state)
{
    enum { N = 200 };
    kb_alloc *a = kb_alloc_create("va", 0x10000, N * 0x1000);
    uint64_t p[N];
    int i;

    (void)state;
    for (i = 0; i < N; i++) {
        assert_int_equal(kb_alloc_alloc(a, 0x1000, 0x1000, &p[i], NULL), 0);
        assert_int_equal(p[i], 0x10000 + (uint64_t)i * 0x1000);
    }
    for (i = 0; i < N; i++) {
        int k = (i * 37) % N; /* 37 is coprime with 200: a permutation */
        assert_int_equal(kb_alloc_free(a, p[k], NULL), 0);
    }
    assert_int_equal(kb_alloc_nblocks(a), 0);
    assert_int_equal(kb_alloc_largest_free(a), N * 0x1000);
    kb_alloc_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_destroy),
        cmocka_unit_test(test_alignment),
        cmocka_unit_test(test_first_fit_order),
        cmocka_unit_test(test_merge_on_free),
        cmocka_unit_test(test_exhaustion),
        cmocka_unit_test(test_fragmentation),
        cmocka_unit_test(test_fmt_bytes),
        cmocka_unit_test(test_many),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
