/*
 * Tests of the roofline modules (host/kb_roofline, ccl/kb_ccl_roofline, tp/kb_tp_roofline)
 * against closed forms computed by hand in the comments, on the default machine
 * (configs/topology.yaml: 2 SIPs on a ring, 4 x 4 cubes of 8 PEs on a 4 x 2 NoC mesh; PE_GEMM
 * 4096 flops/ns, HBM ports 256 GB/s, inter-SIP links 100 GB/s and 500 + 5 ns, UCIe 256 GB/s
 * and 20 ns, NoC links 512 GB/s and 5 ns): a gemm, all-reduces, the other kinds' cuts, and
 * the tiny decoder model (configs/models/tiny.yaml) in prefill and decode.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kb_ccl_roofline.h"
#include "kb_config.h"
#include "kb_machine.h"
#include "kb_model.h"
#include "kb_roofline.h"
#include "kb_tp_roofline.h"

#include "kb_test_util.h"

/* The default machine with the assignments sets[0..n). */
static kb_machine *machine_with(const char *const *sets, int n)
{
    kb_config cfg;
    kb_machine *m = NULL;
    kb_errbuf eb = { { 0 } };
    kb_config_defaults(&cfg);
    for (int i = 0; i < n; i++)
        kbt_config_set(&cfg, sets[i]);
    if (kb_machine_create(&cfg.topo, &m, &eb) != 0)
        fail_msg("%s", eb.msg);
    return m;
}

static void near(double got, double want)
{
    if (fabs(got - want) > 1e-9 * (fabs(want) + 1.0))
        fail_msg("got %.12g, expected %.12g", got, want);
}

/* The bound of one collective of n ranks on PEs 0 .. n-1 (rank = PE), bytes per rank. */
static kb_roofline coll(const kb_machine *m, kb_coll_kind k, int n, int root, double bytes)
{
    kb_roofline_acc *a;
    kb_roofline r;
    kb_errbuf eb = { { 0 } };
    int *gid = malloc(sizeof *gid * (size_t)n);
    assert_non_null(gid);
    for (int i = 0; i < n; i++)
        gid[i] = i;
    assert_int_equal(kb_roofline_acc_create(m, &a, &eb), 0);
    assert_int_equal(kb_ccl_roofline_add(a, k, n, gid, root, bytes, 0, &eb), 0);
    kb_roofline_result(a, &r);
    kb_roofline_acc_destroy(a);
    free(gid);
    return r;
}

/*
 * The gemm bench's layout, 256³ f16 on one PE: 2·256³ = 33 554 432 flops at 4096 per ns =
 * 8192 ns; A and B, 2 · 256² · 2 B = 262 144 B read at 256 GB/s = 1024 ns, C 131 072 B
 * written (the other side of the port) 512 ns: compute-bound at 8192 ns (the gemm's
 * bound_ns too, test_bench's test_bound). 4096³ on 128 PEs: 2·4096³ / (128 · 4096) =
 * 262 144 ns; A and B, 2 · 4096² · 2 B = 67 108 864 B over 128 ports = 2048 ns, but C,
 * 33 554 432 B, all into PE 0's slice: 131 072 ns. An int8 2:4 gemm runs at 4096 · 2 · 2.
 */
static void test_gemm(void **s)
{
    kb_machine *m = machine_with(NULL, 0);
    kb_roofline_acc *a;
    kb_roofline r;
    kb_errbuf eb = { { 0 } };
    (void)s;
    assert_int_equal(kb_roofline_acc_create(m, &a, &eb), 0);
    kb_roofline_gemm(a, 256, 256, 256, 2, 1, 0);
    kb_roofline_result(a, &r);
    kb_roofline_acc_destroy(a);
    near(r.compute_ns, 8192);
    near(r.memory_ns, 1024);
    near(r.comm_ns, 0);
    near(r.ns, 8192);
    assert_int_equal(r.bound, KB_ROOF_COMPUTE);
    assert_string_equal(kb_roofline_bound_name(r.bound), "compute");
    near(kb_roofline_efficiency(&r, 13680), 8192.0 / 13680.0);

    assert_int_equal(kb_roofline_acc_create(m, &a, &eb), 0);
    kb_roofline_gemm(a, 4096, 4096, 4096, 2, 128, 0);
    kb_roofline_result(a, &r);
    kb_roofline_acc_destroy(a);
    near(r.compute_ns, 262144);
    near(r.memory_ns, 131072);
    assert_int_equal(r.bound, KB_ROOF_COMPUTE);

    assert_int_equal(kb_roofline_acc_create(m, &a, &eb), 0);
    kb_roofline_flops(a, KB_QF_INT8, 1, 2.0 * 256 * 256 * 256, 1);
    kb_roofline_result(a, &r);
    kb_roofline_acc_destroy(a);
    near(r.compute_ns, 2048);
    kb_machine_destroy(m);
}

/*
 * all_reduce, 256 ranks = every PE of both SIPs, 64 MiB each (B = 67 108 864 B).
 * SIP level: two groups of 128; each must send B over its one link to the other SIP (two SIPs
 * on a ring: E and W reach the same peer) at 100 GB/s: 671 088.64 ns (the total, 2(m-1)B =
 * 2B over both SIPs' 200 GB/s, is the same), plus the last byte's link, 505 ns: 671 593.64.
 * HBM: every rank reads and writes B at 256 GB/s: 262 144 ns. Comm-bound at 671 593.64 ns —
 * what a bandwidth-optimal schedule needs; a ring over 256 ranks crosses each link twice.
 */
static void test_allreduce_two_sips(void **s)
{
    kb_machine *m = machine_with(NULL, 0);
    kb_roofline r = coll(m, KB_COLL_ALLREDUCE, 256, 0, 67108864.0);
    (void)s;
    near(r.comm_ns, 671593.64);
    assert_int_equal(r.comm_level, KB_ROOF_SIP);
    assert_string_equal(kb_roofline_level_name(r.comm_level), "inter_sip");
    near(r.memory_ns, 262144);
    near(r.compute_ns, 0);
    near(r.ns, 671593.64);
    assert_int_equal(r.bound, KB_ROOF_COMM);
    kb_machine_destroy(m);
}

/*
 * all_reduce, 8 ranks on the 8 PEs of cube 0 (a 4 x 2 NoC mesh), 1 MiB each (B = 1 048 576).
 * HBM: B read and B written per port: 4096 ns. NoC level: eight groups of one PE; a corner
 * router without other links (routers 4 and 7: two NoC links, 1024 GB/s) must pass B: 1024 ns;
 * in all 2·7·B = 14 680 064 B over every router's egress: 20 directed NoC links (10 240 GB/s),
 * the E and S UCIe links at routers 3 and 5 (512) and the inter-SIP link at router 0 (100):
 * 10 852 GB/s, 1352.7519... ns; plus 5 ns. Memory-bound at 4096 ns.
 */
static void test_allreduce_one_cube(void **s)
{
    kb_machine *m = machine_with(NULL, 0);
    kb_roofline r = coll(m, KB_COLL_ALLREDUCE, 8, 0, 1048576.0);
    (void)s;
    near(r.memory_ns, 4096);
    near(r.comm_ns, 14680064.0 / 10852.0 + 5.0);
    assert_int_equal(r.comm_level, KB_ROOF_PE);
    assert_int_equal(r.bound, KB_ROOF_MEMORY);
    near(r.ns, 4096);
    /* with the bus NoC there is no PE level: nothing crosses a modelled link */
    {
        static const char *const bus[] = { "cube.noc.topology=bus", "pe.dma.channels=1" };
        kb_machine *mb = machine_with(bus, 2);
        kb_roofline rb = coll(mb, KB_COLL_ALLREDUCE, 8, 0, 1048576.0);
        near(rb.comm_ns, 0);
        assert_int_equal(rb.comm_level, -1);
        near(rb.memory_ns, 8192); /* one side for both directions */
        kb_machine_destroy(mb);
    }
    kb_machine_destroy(m);
}

/*
 * The other kinds at the SIP level, 256 ranks over the two SIPs, c = B = 1 MiB (1 048 576 B):
 * all_gather and reduce_scatter: a SIP of k = 128 of n = 256 sends (or receives) max(k, n-k)
 * chunks: 128 MiB / 100 GB/s = 1 342 177.28 ns, + 505; all_to_all k(n-k) = 16 384 chunks:
 * 171 798 691.84 ns, + 505; broadcast and reduce: B: 10 485.76 + 505 = 10 990.76 ns (and the
 * root's link, or latency, at most that); sendrecv (rank r to r + 1): rank 127 leaves SIP 0
 * and rank 255 leaves SIP 1, one B each way: 10 990.76 ns.
 */
static void test_kinds(void **s)
{
    kb_machine *m = machine_with(NULL, 0);
    const double B = 1048576.0;
    (void)s;
    near(coll(m, KB_COLL_ALLGATHER, 256, 0, B).comm_ns, 128.0 * B / 100.0 + 505.0);
    near(coll(m, KB_COLL_REDUCE_SCATTER, 256, 0, B).comm_ns, 128.0 * B / 100.0 + 505.0);
    near(coll(m, KB_COLL_ALLTOALL, 256, 0, B).comm_ns, 128.0 * 128.0 * B / 100.0 + 505.0);
    near(coll(m, KB_COLL_BROADCAST, 256, 3, B).comm_ns, B / 100.0 + 505.0);
    near(coll(m, KB_COLL_REDUCE, 256, 200, B).comm_ns, B / 100.0 + 505.0);
    near(coll(m, KB_COLL_SENDRECV, 256, 0, B).comm_ns, B / 100.0 + 505.0);
    /* HBM: all_gather reads c and writes 255 c per rank; reduce_scatter reads 256 c */
    near(coll(m, KB_COLL_ALLGATHER, 256, 0, B).memory_ns, 255.0 * B / 256.0);
    near(coll(m, KB_COLL_REDUCE_SCATTER, 256, 0, B).memory_ns, B);
    /* one rank moves nothing */
    near(coll(m, KB_COLL_ALLREDUCE, 1, 0, B).ns, 0);
    kb_machine_destroy(m);
}

/*
 * Latency: a 4-SIP ring (diameter 2 hops of 505 ns) and a short all_reduce of 4096 B among
 * its 512 PEs: bandwidth 2·3·4096 B over 4 SIPs' 2 links of 100 GB/s = 30.72 ns + 505, but
 * data from the farthest SIP cross 2 links: 1010 ns. Two dependent all-reduces (steps 0 and
 * 1): 2020 ns; two side by side (one step): 1010.
 */
static void test_depth(void **s)
{
    static const char *const four[] = { "system.sips.count=4" };
    kb_machine *m = machine_with(four, 1);
    kb_roofline_acc *a;
    kb_roofline r;
    kb_errbuf eb = { { 0 } };
    int gid[512];
    (void)s;
    for (int i = 0; i < 512; i++)
        gid[i] = i;
    for (int serial = 0; serial < 2; serial++) {
        assert_int_equal(kb_roofline_acc_create(m, &a, &eb), 0);
        assert_int_equal(kb_ccl_roofline_add(a, KB_COLL_ALLREDUCE, 512, gid, 0, 4096, 0, &eb), 0);
        assert_int_equal(kb_ccl_roofline_add(a, KB_COLL_ALLREDUCE, 512, gid, 0, 4096, serial,
                                             &eb), 0);
        kb_roofline_result(a, &r);
        kb_roofline_acc_destroy(a);
        near(r.comm_ns, serial ? 2020 : 1010);
    }
    kb_machine_destroy(m);
}

static void tiny(kb_model_cfg *mc)
{
    char path[1024];
    kb_errbuf eb = { { 0 } };
    if (kb_model_load(mc, kbt_source_path("configs/models/tiny.yaml", path, sizeof path), &eb))
        fail_msg("%s", eb.msg);
}

/*
 * The tiny model (d 64, 4 query heads, 2 KV heads of 32, MLP 128, f16) on the default machine:
 * TP 2, a rank holds nq = 2, nkv = 1, 64 MLP columns, its SIP's S = 128 PEs.
 * Prefill, seq 16: projections 2·16·64·(2 + 2)·32 + 2·16·64·64 + 3·2·16·64·64 = 786 432
 * flops, attention 2 heads · 16·17/2 pairs · 4·32 = 34 816: 821 248 / (128 · 4096) =
 * 1.56640625 ns. HBM: per rank the weights 64·128·2 + 64·64·2 + 2·64·64·2 + 64·64·2 = 49 152 B
 * and x 16·64·2 = 2048 read, y 16·64·4 = 4096 written; every PE's partial block of the two
 * all-reduces, 16·64·4 = 4096 B, read and written twice. Over the 256 ports: reads
 * 2·51 200 + 256·8192 = 2 199 552 B / (256 · 256 GB/s) = 33.5625 ns (writes less). Comm: the
 * two all-reduces, each SIP sending 4096 B twice over its link, 81.92 ns + 505, but each
 * waits one link for the other's data: 2 · 505 = 1010 ns, the bound.
 */
static void test_decoder_prefill(void **s)
{
    kb_machine *m = machine_with(NULL, 0);
    kb_model_cfg mc;
    kb_decoder_opts o = { 1, 16, 0, 0, 0, KB_QF_F16, 0, KB_DEC_MAP_NAIVE, 0 };
    kb_roofline r;
    kb_errbuf eb = { { 0 } };
    (void)s;
    tiny(&mc);
    assert_int_equal(kb_tp_roofline_decoder(m, &mc, &o, &r, &eb), 0);
    near(r.compute_ns, 821248.0 / 524288.0);
    near(r.memory_ns, 2199552.0 / 65536.0);
    near(r.comm_ns, 1010);
    assert_int_equal(r.bound, KB_ROOF_COMM);
    /* 2:4 int8 weights: the projections at 4096 · 2 · 2, the attention at the base rate */
    o.fmt = KB_QF_INT8;
    o.sparse = 1;
    assert_int_equal(kb_tp_roofline_decoder(m, &mc, &o, &r, &eb), 0);
    near(r.compute_ns, 786432.0 / (128.0 * 16384.0) + 34816.0 / 524288.0);
    kb_machine_destroy(m);
}

/*
 * Decode, kv_len 64: projections 2·64·128 + 2·64·64 + 3·2·64·64 = 49 152 flops, attention
 * 2 heads · 65 keys · 4·32 = 16 640: 65 792 / 524 288 ns. HBM per rank: weights 49 152 B, the
 * cache 2 · 64 · 32 · 2 = 8192 B and x 128 B read; the new K and V 128 B and y 256 B written;
 * every PE's block 64·4 = 256 B read and written twice: reads 2 · 57 472 + 256 · 512 =
 * 246 016 B / 65 536 = 3.75390625 ns.
 */
static void test_decoder_decode(void **s)
{
    kb_machine *m = machine_with(NULL, 0);
    kb_model_cfg mc;
    kb_decoder_opts o = { 1, 1, 1, 64, 0, KB_QF_F16, 0, KB_DEC_MAP_NAIVE, 0 };
    kb_roofline r;
    kb_errbuf eb = { { 0 } };
    (void)s;
    tiny(&mc);
    assert_int_equal(kb_tp_roofline_decoder(m, &mc, &o, &r, &eb), 0);
    near(r.compute_ns, 65792.0 / 524288.0);
    near(r.memory_ns, 246016.0 / 65536.0);
    near(r.comm_ns, 1010);
    /* a layout the plan refuses is the plan's usage error */
    o.decode = 0;
    o.seq = 16;
    o.seq_parallel = 1;
    o.batch = 1;
    {
        static const char *const three[] = { "system.sips.count=3" };
        kb_machine *m3 = machine_with(three, 1);
        assert_int_equal(kb_tp_roofline_decoder(m3, &mc, &o, &r, &eb), KB_ERR_USAGE);
        kb_machine_destroy(m3);
    }
    kb_machine_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_allreduce_two_sips),
        cmocka_unit_test(test_allreduce_one_cube),
        cmocka_unit_test(test_kinds),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_decoder_prefill),
        cmocka_unit_test(test_decoder_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
