/*
 * test_bigmem — large-buffer allocation: both paths (calloc-backed below KB_BIGMEM_HUGE,
 * mapped at or above it) return zeroed, 64-byte aligned, fully writable memory; the mapped
 * path leaves no mapping behind after free (checked through /proc/self/maps where present);
 * impossible sizes fail cleanly; freeing NULL does nothing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "kb_bigmem.h"

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

static void check_buffer(size_t n)
{
    unsigned char *p = kb_bigmem_alloc(n);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    assert_true(all_zero(p, n));
    memset(p, 0xA5, n);
    assert_int_equal(p[0], 0xA5);
    assert_int_equal(p[n - 1], 0xA5);
    kb_bigmem_free(p);
}

static void test_small_and_big(void **state)
{
    (void)state;
    check_buffer(1);
    check_buffer(4096);
    check_buffer(KB_BIGMEM_HUGE - 1);
    check_buffer(KB_BIGMEM_HUGE);
    check_buffer(((size_t)2 << 20) - 64);  /* exactly one huge page with the header */
    check_buffer(((size_t)2 << 20) - 63);  /* one byte more: two */
    check_buffer((size_t)7 << 20);
}

/* Number of lines in /proc/self/maps, or -1 where it does not exist. */
static long map_count(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    long n = 0;
    int c;
    if (!f)
        return -1;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

static void test_big_free_unmaps(void **state)
{
    (void)state;
    void *warm = kb_bigmem_alloc(16); /* stdio and malloc set up before counting */
    kb_bigmem_free(warm);
    long before = map_count();
    if (before < 0)
        skip();
    void *p[8];
    for (int i = 0; i < 8; i++) {
        p[i] = kb_bigmem_alloc((size_t)(i + 1) << 20);
        assert_non_null(p[i]);
    }
    assert_true(map_count() > before);
    for (int i = 0; i < 8; i++)
        kb_bigmem_free(p[i]);
    assert_int_equal(map_count(), before);
}

static void test_limits(void **state)
{
    (void)state;
    assert_null(kb_bigmem_alloc(SIZE_MAX));
    assert_null(kb_bigmem_alloc(SIZE_MAX - 100));
    kb_bigmem_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_and_big),
        cmocka_unit_test(test_big_free_unmaps),
        cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
