/*
 * dist_collectives — the example of docs/distributed.md: one rank worker per SIP (kb_spawn),
 * a process group on intercube_allreduce, then all_reduce, all_gather, reduce_scatter,
 * all_to_all and a send/recv pipeline through every rank on tensors laid out as kb_dist.h
 * requires, each result checked exactly on the host.
 *
 * The main build makes it build/examples/dist_collectives; CTest's example_dist_collectives
 * checks that it prints what docs/distributed.md §3 quotes. By hand, from the repository root
 * after `cmake --build build` (it uses the kb_ccl layer and the three below it):
 *   gcc -I sched -I cl -I host -I host/config -I host/hw -I host/mem -I ccl \
 *       docs/examples/dist_collectives.c build/libkb_ccl.a build/libkb_host.a build/libkb_cl.a \
 *       build/libkb_sched.a -lcjson -lyaml -lOpenCL -lm -o /tmp/dist_collectives
 *   /tmp/dist_collectives [SIPS [TOPOLOGY]]      e.g. /tmp/dist_collectives 4 torus_2d
 * Against an installed kbcl (docs/plugins.md "Installing kbcl"): docs/examples/CMakeLists.txt,
 * or cc docs/examples/dist_collectives.c $(pkg-config --cflags --libs kbcl) -o /tmp/dist_collectives
 * Limits: an example; values are small integers so every sum is exact in f16.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kbcl_ccl.h"

#define MAXR 16
#define N 8      /* all_reduce: elements per shard */
#define M 2      /* all_gather: rows */
#define K 32     /* all_gather: columns per rank (a multiple of the shards per rank) */

typedef struct shared {
    int bad;                 /* wrong values seen by any rank */
    double t_comm_ns;        /* rank 0's simulated time inside collectives */
} shared;

/* all_gather input element i of rank r: small, distinct across neighbours, exact in f16 even
 * after reduce_scatter multiplies it by S * ws (<= 256 ranks x shards) */
static float val(int r, int i) { return (float)((r * M * K + i) % 61); }

static int check(kb_ctx *ctx, kb_tensor *t, const float *want, size_t n, shared *sh)
{
    float *got = malloc(n * sizeof *got);
    int rc;
    if (!got)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
    if ((rc = kb_tensor_read(t, got)) == 0)
        for (size_t i = 0; i < n; i++)
            sh->bad += got[i] != want[i];
    free(got);
    return rc;
}

static int worker(kb_ctx *ctx, int rank, void *arg)
{
    shared *sh = arg;
    int rc, ws, S;
    kb_tensor *t, *in, *wide, *out;

    if ((rc = kb_ctx_set_device(ctx, rank)) != 0 ||   /* this rank's tensors go to SIP rank */
        (rc = kb_dist_init_process_group(ctx, "ahbm", "intercube_allreduce")) != 0)
        return rc;
    ws = kb_dist_get_world_size(ctx);
    S = kb_dist_shards_per_rank(ctx);                 /* intercube: one shard per cube */

    /* all_reduce: S x N, row s on cube s's PE 0, element = (rank + 1) * (s + 1) */
    {
        static float x[MAXR * 64 * N], want[64 * N];
        kb_tensor_desc d = { "t", S, N, KB_F16, kb_dist_policy(ctx), KB_MEM_HBM };
        for (int s = 0; s < S; s++)
            for (int i = 0; i < N; i++) {
                x[rank * S * N + s * N + i] = (float)((rank + 1) * (s + 1));
                /* every shard ends with the sum over all shards of all ranks */
                want[s * N + i] = (float)(ws * (ws + 1) / 2 * S * (S + 1) / 2);
            }
        if ((rc = kb_tensor_from_host(ctx, &d, &x[rank * S * N], &t)) != 0 ||
            (rc = kb_dist_all_reduce(ctx, t, KB_DIST_SUM)) != 0 ||
            (rc = check(ctx, t, want, (size_t)(S * N), sh)) != 0)
            return rc;
    }
    /* all_gather: in (M x K) column-wise over the S participating PEs -> wide (S*M x ws*K),
     * every PE's M x ws*K block = the gathered matrix */
    {
        static float x[MAXR * M * K], want[64 * M * MAXR * K];
        kb_dp_policy cols = kb_dp(KB_DP_COLUMN_WISE, KB_DP_REPLICATE, 0, 1);
        kb_tensor_desc di = { "in", M, K, KB_F16, cols, KB_MEM_HBM };
        kb_tensor_desc dw = { "wide", (int64_t)S * M, (int64_t)ws * K, KB_F16,
                              kb_dist_policy(ctx), KB_MEM_HBM };
        for (int i = 0; i < M * K; i++)
            x[rank * M * K + i] = val(rank, i);
        for (int b = 0; b < S; b++)
            for (int r = 0; r < M; r++)
                for (int c = 0; c < ws * K; c++)
                    want[(b * M + r) * ws * K + c] = val(c / K, r * K + c % K);
        if ((rc = kb_tensor_from_host(ctx, &di, &x[rank * M * K], &in)) != 0 ||
            (rc = kb_tensor_empty(ctx, &dw, &wide)) != 0 ||
            (rc = kb_dist_all_gather(ctx, wide, in)) != 0 ||
            (rc = check(ctx, wide, want, (size_t)(S * M * ws * K), sh)) != 0)
            return rc;
    }
    /* reduce_scatter of that wide tensor: a sum over all S * ws blocks, of which this rank
     * keeps columns [rank*K, (rank+1)*K): S * ws * its own input (wide is staging after) */
    {
        static float want_of[MAXR][M * K];   /* per rank: ranks interleave at every call */
        float *want = want_of[rank];
        kb_tensor_desc d = { "out", M, K, KB_F16, kb_dp(KB_DP_COLUMN_WISE, KB_DP_REPLICATE, 0, 1),
                             KB_MEM_HBM };
        for (int i = 0; i < M * K; i++)
            want[i] = (float)(S * ws) * val(rank, i);
        if ((rc = kb_tensor_empty(ctx, &d, &out)) != 0 ||
            (rc = kb_dist_reduce_scatter(ctx, out, wide)) != 0 ||
            (rc = check(ctx, out, want, (size_t)(M * K), sh)) != 0)
            return rc;
    }
    /* all_to_all: S x A per rank (A = 2 * ws: every shard is ws blocks of 2), block i of
     * shard s goes to rank i, which keeps it as its block `rank` */
    {
        static float x[MAXR][64 * 2 * MAXR], want_of[MAXR][64 * 2 * MAXR];
        int64_t A = 2 * (int64_t)ws;
        kb_tensor *a_in, *a_out;
        kb_tensor_desc d = { "a2a_in", S, A, KB_F16, kb_dist_policy(ctx), KB_MEM_HBM };
        kb_tensor_desc dout = { "a2a_out", S, A, KB_F16, kb_dist_policy(ctx), KB_MEM_HBM };
        for (int s = 0; s < S; s++)
            for (int64_t i = 0; i < A; i++) {
                x[rank][s * A + i] = (float)((rank * 7 + s * 3 + i) % 61);
                /* block i / 2 comes from rank i / 2, which sent its block `rank` */
                want_of[rank][s * A + i] = (float)(((i / 2) * 7 + s * 3 + rank * 2 + i % 2) % 61);
            }
        if ((rc = kb_tensor_from_host(ctx, &d, x[rank], &a_in)) != 0 ||
            (rc = kb_tensor_empty(ctx, &dout, &a_out)) != 0 ||
            (rc = kb_dist_all_to_all(ctx, a_out, a_in)) != 0 ||
            (rc = check(ctx, a_out, want_of[rank], (size_t)(S * A), sh)) != 0)
            return rc;
    }
    /* send / recv: rank 0's S x N tensor handed down a pipeline 0 -> 1 -> ... -> ws-1 */
    {
        static float x[64 * N];
        kb_tensor *p;
        kb_tensor_desc d = { "stage", S, N, KB_F16, kb_dist_policy(ctx), KB_MEM_HBM };
        for (int i = 0; i < S * N; i++)
            x[i] = (float)(i % 53 + 1);
        if ((rc = rank == 0 ? kb_tensor_from_host(ctx, &d, x, &p) : kb_tensor_empty(ctx, &d, &p)) != 0 ||
            (rank > 0 && (rc = kb_dist_recv(ctx, p, rank - 1)) != 0) ||
            (rank + 1 < ws && (rc = kb_dist_send(ctx, p, rank + 1)) != 0) ||
            (rc = check(ctx, p, x, (size_t)(S * N), sh)) != 0)
            return rc;
    }
    if ((rc = kb_dist_barrier(ctx)) != 0)
        return rc;
    if (rank == 0)
        sh->t_comm_ns = kb_time_to_ns(kb_dist_comm_time(ctx));
    return 0;
}

static int host(kb_ctx *ctx, void *arg)
{
    return kb_spawn(ctx, worker, arg, kb_ctx_machine_shape(ctx).sips);
}

int main(int argc, char **argv)
{
    shared sh = { 0, 0.0 };
    kb_config *cfg = NULL;
    const char *topo = argc > 2 ? argv[2] : "ring_1d";
    kb_ctx_opts opts = { .device = KB_DEV_REF };
    kb_ctx *ctx = NULL;
    kb_errbuf eb;
    char kv[96];
    int rc;

    if (kb_config_create(&cfg, &eb) != 0) {          /* 2 SIPs on ring_1d */
        fprintf(stderr, "%s\n", eb.msg);
        return 1;
    }
    if (argc > 1) {
        snprintf(kv, sizeof kv, "system.sips.count=%s", argv[1]);
        if (kb_config_set(cfg, kv, &eb) != 0 || atoi(argv[1]) > MAXR) {
            fprintf(stderr, "%s: %s\n", kv, atoi(argv[1]) > MAXR ? "too many SIPs" : eb.msg);
            kb_config_destroy(cfg);
            return 2;
        }
    }
    if (argc > 2) {
        snprintf(kv, sizeof kv, "system.sips.topology=%s", argv[2]);
        if (kb_config_set(cfg, kv, &eb) != 0) {
            fprintf(stderr, "%s\n", eb.msg);
            kb_config_destroy(cfg);
            return 2;
        }
    }
    rc = kb_ctx_create(cfg, &opts, &ctx, &eb);
    kb_config_destroy(cfg);                          /* the context has its copy */
    if (rc != 0) {
        fprintf(stderr, "kb_ctx_create: %s\n", eb.msg);
        return 1;
    }
    rc = kb_ctx_run_host(ctx, host, &sh);
    if (rc) {
        fprintf(stderr, "%s: %s\n", kb_strerror(rc), kb_ctx_errmsg(ctx));
        kb_ctx_destroy(ctx);
        return 1;
    }
    printf("ws=%d %s: all_reduce, all_gather, reduce_scatter, all_to_all, send/recv: %s "
           "(%d wrong), "
           "%.3f ns in collectives\n", kb_ctx_machine_shape(ctx).sips, topo,
           sh.bad ? "FAIL" : "OK", sh.bad, sh.t_comm_ns);
    kb_ctx_destroy(ctx);
    return sh.bad ? 1 : 0;
}
