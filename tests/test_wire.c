/*
 * test_wire — kb_wire: values written come back in order and width; a reader that runs past
 * the end reads zeros and says so; an empty writer reads as nothing; a large append grows the
 * buffer.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "kb_wire.h"

static void test_round_trip(void **state)
{
    kb_wire w;
    kb_wire_rd r;
    uint8_t big[5000], back[5000];
    (void)state;
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 7 + 3);
    kb_wire_init(&w);
    kb_wire_u32(&w, 0xdeadbeefu);
    kb_wire_u64(&w, 0x0123456789abcdefull);
    kb_wire_put(&w, big, sizeof big);
    kb_wire_put(&w, NULL, 3); /* zeros */
    assert_int_equal(kb_wire_ok(&w), 0);
    assert_int_equal(w.n, 4 + 8 + sizeof big + 3);
    kb_wire_rd_init(&r, w.p, w.n);
    assert_int_equal(kb_wire_get_u32(&r), 0xdeadbeefu);
    assert_true(kb_wire_get_u64(&r) == 0x0123456789abcdefull);
    kb_wire_get(&r, back, sizeof back);
    assert_memory_equal(back, big, sizeof big);
    assert_int_equal(kb_wire_get_u32(&r) & 0xffffffu, 0); /* 3 zeros, then past the end */
    assert_false(kb_wire_rd_ok(&r));
    kb_wire_free(&w);
    kb_wire_free(NULL);
}

static void test_past_the_end(void **state)
{
    kb_wire w;
    kb_wire_rd r;
    (void)state;
    kb_wire_init(&w);
    kb_wire_u32(&w, 7);
    kb_wire_rd_init(&r, w.p, w.n);
    assert_false(kb_wire_rd_done(&r));
    assert_int_equal(kb_wire_get_u32(&r), 7);
    assert_true(kb_wire_rd_done(&r));
    assert_true(kb_wire_rd_ok(&r));
    assert_true(kb_wire_get_u64(&r) == 0); /* nothing left: zeros, and the flag */
    assert_false(kb_wire_rd_ok(&r));
    assert_int_equal(kb_wire_get_u32(&r), 0); /* stays bad */
    kb_wire_free(&w);
    kb_wire_init(&w); /* an empty writer: nothing to read */
    kb_wire_rd_init(&r, w.p, w.n);
    assert_true(kb_wire_rd_done(&r));
    kb_wire_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_past_the_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
