/*
 * kb_par: every item runs exactly once, on however many threads, and all have finished when
 * kb_par_run returns (n = 0, 1, a few, more than KB_PAR_MAX).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>

#include "kb_par.h"

typedef struct item {
    uint64_t lo, hi, sum; /* the sum of [lo, hi) */
    int runs;
} item;

static void *sum_range(void *arg)
{
    item *it = arg;
    for (uint64_t v = it->lo; v < it->hi; v++)
        it->sum += v;
    it->runs++;
    return NULL;
}

static void check(size_t n)
{
    item *it = calloc(n ? n : 1, sizeof *it);
    uint64_t total = 0, N = 100000;
    assert_non_null(it);
    for (size_t i = 0; i < n; i++) {
        it[i].lo = N * i / n;
        it[i].hi = N * (i + 1) / n;
    }
    kb_par_run(sum_range, it, sizeof *it, n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(it[i].runs, 1);
        total += it[i].sum;
    }
    if (n)
        assert_int_equal(total, N * (N - 1) / 2); /* the closed form: every value once */
    free(it);
}

static void test_par_counts(void **state)
{
    (void)state;
    check(0);
    check(1);
    check(3);
    check(KB_PAR_MAX);
    check(KB_PAR_MAX + 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_par_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
