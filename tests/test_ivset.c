/*
 * test_ivset — sorted disjoint intervals: merging on add (overlap and touch), splitting on
 * remove, batch adds, lookups, and a property test of random adds, batch adds and removes
 * against a byte map of a 4 KiB window.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kb_ivset.h"
#include "kb_test_util.h"

static void expect(const kb_ivset *s, const uint64_t *pairs, size_t n)
{
    uint64_t bytes = 0;
    assert_int_equal(s->n, n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(s->v[i].lo, pairs[2 * i]);
        assert_int_equal(s->v[i].hi, pairs[2 * i + 1]);
        bytes += pairs[2 * i + 1] - pairs[2 * i];
    }
    assert_int_equal(s->bytes, bytes);
}

static void test_add_remove(void **state)
{
    kb_ivset s;
    (void)state;
    kb_ivset_init(&s);
    assert_int_equal(kb_ivset_add(&s, 10, 20), 0);
    assert_int_equal(kb_ivset_add(&s, 30, 40), 0);
    assert_int_equal(kb_ivset_add(&s, 5, 5), 0); /* empty: nothing */
    expect(&s, (const uint64_t[]){ 10, 20, 30, 40 }, 2);
    assert_int_equal(kb_ivset_add(&s, 20, 25), 0); /* touches: merges */
    expect(&s, (const uint64_t[]){ 10, 25, 30, 40 }, 2);
    assert_int_equal(kb_ivset_add(&s, 0, 1), 0);
    assert_int_equal(kb_ivset_add(&s, 24, 31), 0); /* bridges two */
    expect(&s, (const uint64_t[]){ 0, 1, 10, 40 }, 2);
    assert_int_equal(kb_ivset_remove(&s, 15, 20), 0); /* splits */
    expect(&s, (const uint64_t[]){ 0, 1, 10, 15, 20, 40 }, 3);
    assert_int_equal(kb_ivset_remove(&s, 0, 12), 0); /* drops one, cuts the next's head */
    expect(&s, (const uint64_t[]){ 12, 15, 20, 40 }, 2);
    assert_int_equal(kb_ivset_remove(&s, 14, 30), 0); /* tail of one, head of the next */
    expect(&s, (const uint64_t[]){ 12, 14, 30, 40 }, 2);
    assert_int_equal(kb_ivset_remove(&s, 50, 60), 0); /* nothing there */
    assert_int_equal(kb_ivset_find(&s, 0), 0);
    assert_int_equal(kb_ivset_find(&s, 14), 1);
    assert_int_equal(kb_ivset_find(&s, 40), 2);
    assert_true(kb_ivset_overlaps(&s, 13, 31));
    assert_false(kb_ivset_overlaps(&s, 14, 30));
    assert_false(kb_ivset_overlaps(&s, 40, 41));
    const kb_range batch[] = { { 0, 2 }, { 1, 5 }, { 14, 16 }, { 40, 41 }, { 45, 46 } };
    assert_int_equal(kb_ivset_add_sorted(&s, batch, 5), 0);
    expect(&s, (const uint64_t[]){ 0, 5, 12, 16, 30, 41, 45, 46 }, 4);
    assert_int_equal(kb_ivset_remove(&s, 0, UINT64_MAX), 0);
    expect(&s, NULL, 0);
    kb_ivset_free(&s);
    kb_ivset_free(&s); /* an emptied set may be freed again */
}

static void test_property(void **state)
{
    enum { W = 4096 };
    kbt_rng g = { 7 };
    uint8_t map[W];
    kb_ivset s;
    (void)state;
    kb_ivset_init(&s);
    memset(map, 0, sizeof map);
    for (int step = 0; step < 20000; step++) {
        uint32_t op = kbt_rng_below(&g, 10);
        if (op == 9) { /* a sorted batch of up to 8 */
            kb_range b[8];
            size_t k = 1 + kbt_rng_below(&g, 8);
            uint64_t at = kbt_rng_below(&g, W / 2);
            for (size_t i = 0; i < k; i++) {
                b[i].lo = at;
                b[i].hi = at + 1 + kbt_rng_below(&g, 64);
                if (b[i].hi > W)
                    b[i].hi = W;
                at += kbt_rng_below(&g, 96);
                if (at >= W)
                    at = W - 1;
            }
            assert_int_equal(kb_ivset_add_sorted(&s, b, k), 0);
            for (size_t i = 0; i < k; i++)
                memset(map + b[i].lo, 1, b[i].hi - b[i].lo);
        } else {
            uint64_t lo = kbt_rng_below(&g, W), hi = lo + kbt_rng_below(&g, 200);
            if (hi > W)
                hi = W;
            if (op < 5) {
                assert_int_equal(kb_ivset_add(&s, lo, hi), 0);
                if (hi > lo)
                    memset(map + lo, 1, hi - lo);
            } else {
                assert_int_equal(kb_ivset_remove(&s, lo, hi), 0);
                if (hi > lo)
                    memset(map + lo, 0, hi - lo);
            }
        }
        /* the set is exactly the map's runs */
        size_t k = 0;
        uint64_t bytes = 0;
        for (uint64_t a = 0; a < W;) {
            if (!map[a]) {
                a++;
                continue;
            }
            uint64_t b = a;
            while (b < W && map[b])
                b++;
            assert_true(k < s.n);
            assert_int_equal(s.v[k].lo, a);
            assert_int_equal(s.v[k].hi, b);
            bytes += b - a;
            k++;
            a = b;
        }
        assert_int_equal(k, s.n);
        assert_int_equal(s.bytes, bytes);
    }
    kb_ivset_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_remove),
        cmocka_unit_test(test_property),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
