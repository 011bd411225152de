/*
 * test_oplog — op log storage: seq assignment, records kept intact across chunk boundaries
 * with stable pointers, payload offsets (8-byte aligned) and contents, the replayed mark, cuts,
 * and kind names.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "kb_oplog.h"

static kb_rec make_rec(uint32_t i)
{
    kb_rec r;
    memset(&r, 0, sizeof r);
    r.t_start = (kb_time)(1000 + 7 * (int64_t)i);
    r.t_end = r.t_start + 5;
    r.seq = 999999; /* must be overwritten by append */
    r.kind = (uint8_t)(i % KB_REC_NKINDS);
    r.nsrc = 1;
    r.pe = i;
    r.imm[0] = (float)i;
    r.dst = kb_opnd_make(0x1000u + 64u * i, 1, 16, KB_F16);
    r.src[0] = kb_opnd_make(0x900000u + 32u * i, 1, 8, KB_F32);
    return r;
}

static void test_seq_and_count(void **state)
{
    (void)state;
    kb_oplog *log = kb_oplog_create();
    assert_non_null(log);
    assert_int_equal(kb_oplog_count(log), 0);
    assert_int_equal(kb_oplog_payload_size(log), 0);
    for (uint32_t i = 0; i < 5; i++) {
        kb_rec r = make_rec(i);
        uint64_t seq = 77;
        assert_int_equal(kb_oplog_append(log, &r, &seq), 0);
        assert_int_equal(seq, i);
    }
    kb_rec r = make_rec(5);
    assert_int_equal(kb_oplog_append(log, &r, NULL), 0);
    assert_int_equal(kb_oplog_count(log), 6);
    for (size_t i = 0; i < 6; i++) {
        const kb_rec *p = kb_oplog_at(log, i);
        assert_int_equal(p->seq, i);
        assert_int_equal(p->pe, i);
        assert_int_equal(p->dst.addr, 0x1000u + 64u * i);
        assert_int_equal(p->src[0].dtype, KB_F32);
    }
    kb_oplog_destroy(log);
    kb_oplog_destroy(NULL);
}

static void test_chunk_pointer_stability(void **state)
{
    (void)state;
    enum { N = 12345 };
    kb_oplog *log = kb_oplog_create();
    const kb_rec *early[3] = { NULL, NULL, NULL };
    assert_non_null(log);
    for (uint32_t i = 0; i < N; i++) {
        kb_rec r = make_rec(i);
        assert_int_equal(kb_oplog_append(log, &r, NULL), 0);
        if (i == 0)
            early[0] = kb_oplog_at(log, 0);
        if (i == 4095)
            early[1] = kb_oplog_at(log, 4095);
        if (i == 4096)
            early[2] = kb_oplog_at(log, 4096);
    }
    assert_int_equal(kb_oplog_count(log), N);
    assert_ptr_equal(early[0], kb_oplog_at(log, 0));
    assert_ptr_equal(early[1], kb_oplog_at(log, 4095));
    assert_ptr_equal(early[2], kb_oplog_at(log, 4096));
    assert_int_equal(early[1]->seq, 4095);
    assert_int_equal(early[2]->pe, 4096);
    for (uint32_t i = 0; i < N; i++) {
        const kb_rec *p = kb_oplog_at(log, i);
        kb_rec want = make_rec(i);
        want.seq = i;
        assert_memory_equal(p, &want, sizeof want);
    }
    kb_oplog_destroy(log);
}

static void test_payload(void **state)
{
    (void)state;
    kb_oplog *log = kb_oplog_create();
    uint8_t a[3] = { 1, 2, 3 }, b[10], big[100000];
    uint64_t off = 1;
    assert_non_null(log);
    for (size_t i = 0; i < sizeof b; i++)
        b[i] = (uint8_t)(100 + i);
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 7u);

    assert_int_equal(kb_oplog_add_payload(log, a, 3, &off), 0);
    assert_int_equal(off, 0);
    assert_int_equal(kb_oplog_payload_size(log), 3);
    assert_int_equal(kb_oplog_add_payload(log, b, sizeof b, &off), 0);
    assert_int_equal(off, 8);
    assert_int_equal(kb_oplog_payload_size(log), 18);
    assert_int_equal(kb_oplog_add_payload(log, NULL, 0, &off), 0);
    assert_int_equal(off, 24);
    assert_int_equal(kb_oplog_add_payload(log, big, sizeof big, &off), 0);
    assert_int_equal(off, 24);
    assert_int_equal(kb_oplog_payload_size(log), 24 + sizeof big);
    assert_int_equal(kb_oplog_add_payload(log, a, 1, &off), 0);
    assert_int_equal(off, 24 + sizeof big); /* 100024 is already a multiple of 8 */
    assert_int_equal(kb_oplog_add_payload(log, NULL, 5, &off), KB_ERR_INVAL);

    const uint8_t *p = kb_oplog_payload(log);
    assert_memory_equal(p, a, 3);
    assert_memory_equal(p + 8, b, sizeof b);
    assert_memory_equal(p + 24, big, sizeof big);
    assert_int_equal(p[24 + sizeof big], 1);
    kb_oplog_destroy(log);
}

static void test_replayed_mark(void **state)
{
    (void)state;
    kb_oplog *log = kb_oplog_create();
    assert_non_null(log);
    assert_int_equal(kb_oplog_replayed(log), 0);
    for (uint32_t i = 0; i < 4; i++) {
        kb_rec r = make_rec(i);
        assert_int_equal(kb_oplog_append(log, &r, NULL), 0);
    }
    kb_oplog_set_replayed(log, 3);
    assert_int_equal(kb_oplog_replayed(log), 3);
    kb_oplog_set_replayed(log, 4);
    assert_int_equal(kb_oplog_replayed(log), 4);
    kb_oplog_destroy(log);
}

static void test_cuts(void **state)
{
    (void)state;
    kb_oplog *log = kb_oplog_create();
    const uint64_t *c = NULL;
    assert_non_null(log);
    assert_int_equal(kb_oplog_cut(log), 0); /* empty: nothing to cut */
    assert_int_equal(kb_oplog_cuts_in(log, 0, 100, &c), 0);
    for (uint32_t i = 0; i < 5; i++) {
        kb_rec r = make_rec(i);
        assert_int_equal(kb_oplog_append(log, &r, NULL), 0);
        if (i == 2 || i == 4) {
            assert_int_equal(kb_oplog_cut(log), 0);
            assert_int_equal(kb_oplog_cut(log), 0); /* the same place again: one cut */
        }
    }
    /* cuts at 3 and 5; a range gets those strictly inside it */
    assert_int_equal(kb_oplog_cuts_in(log, 0, 5, &c), 1);
    assert_int_equal(c[0], 3);
    assert_int_equal(kb_oplog_cuts_in(log, 0, 6, &c), 2);
    assert_int_equal(c[0], 3);
    assert_int_equal(c[1], 5);
    assert_int_equal(kb_oplog_cuts_in(log, 3, 5, &c), 0);
    assert_int_equal(kb_oplog_cuts_in(log, 4, 9, &c), 1);
    assert_int_equal(c[0], 5);
    kb_oplog_destroy(log);
}

static void test_kind_names(void **state)
{
    (void)state;
    assert_string_equal(kb_rec_kind_name(KB_REC_COPY), "copy");
    assert_string_equal(kb_rec_kind_name(KB_REC_GEMM), "gemm");
    assert_string_equal(kb_rec_kind_name(KB_REC_SOFTMAX), "softmax");
    assert_string_equal(kb_rec_kind_name(KB_REC_NKINDS), "?");
}

static void test_span(void **state)
{
    (void)state;
    kb_opnd o = kb_opnd_make(0, 3, 5, KB_F16);
    assert_int_equal(kb_opnd_span(&o), 30);
    o.ld = 8;
    assert_int_equal(kb_opnd_span(&o), (2 * 8 + 5) * 2);
    o.dtype = KB_F32;
    assert_int_equal(kb_opnd_span(&o), (2 * 8 + 5) * 4);
    o.rows = 0;
    assert_int_equal(kb_opnd_span(&o), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seq_and_count),
        cmocka_unit_test(test_chunk_pointer_stability),
        cmocka_unit_test(test_payload),
        cmocka_unit_test(test_replayed_mark),
        cmocka_unit_test(test_cuts),
        cmocka_unit_test(test_kind_names),
        cmocka_unit_test(test_span),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
