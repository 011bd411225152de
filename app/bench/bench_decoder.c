/*
 * decoder_layer — one transformer decoder layer of a model file (--model, configs/models/)
 * with Megatron tensor parallelism over the SIPs (rank = SIP, TP size = system.sips.count),
 * prefill of batch x seq tokens or one KV-cache decode step (decode=1, kv_len), optional
 * sequence parallelism, weights and activations in --dtype (f16 bf16 int8 mxint8 fp8e4m3
 * fp8e5m2), 2:4-sparse weights (sparse=1). The layer and its placement: tp/kb_decoder.h;
 * definitions of the reported numbers: docs/decoder.md.
 *
 * Inputs are kb_bench_pattern matrices written through fills (nothing is built unless the
 * run records). --verify-data compares the output rows of every rank with a host f64
 * reference of the whole layer computed from the same inputs and the weights' device values
 * (dequantized, pruned); the bound per element is tol(fmt) * (|ref| + rms(ref)), tol from
 * docs/decoder.md. The digest is FNV-1a over the T x d f32 output in token order.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_bench.h"
#include "kb_decoder.h"
#include "kb_dist.h"
#include "kb_machine.h"
#include "kb_model.h"
#include "kb_par.h"
#include "kb_tp.h"
#include "kb_tp_roofline.h"

enum { P_SEQ, P_BATCH, P_DECODE, P_KVLEN, P_SP, P_SPARSE, P_MAPPING, P_FUSE };

/* the inputs: pattern (seed, range, den) per matrix */
enum { I_X, I_LN0, I_LN1, I_LN2, I_LN3, I_WQ, I_WK, I_WV, I_WO, I_WG, I_WU, I_WD, I_KC, I_VC,
       NIN };
static const struct { uint32_t seed; int range; float den; } pats[NIN] = {
    [I_X] = { 71, 16, 16.0f },  [I_LN0] = { 72, 8, 32.0f }, [I_LN1] = { 73, 8, 32.0f },
    [I_LN2] = { 74, 8, 32.0f }, [I_LN3] = { 75, 8, 32.0f }, [I_WQ] = { 76, 8, 128.0f },
    [I_WK] = { 77, 8, 128.0f },  [I_WV] = { 78, 8, 64.0f },  [I_WO] = { 79, 8, 64.0f },
    [I_WG] = { 80, 8, 64.0f },  [I_WU] = { 81, 8, 64.0f },  [I_WD] = { 82, 8, 64.0f },
    [I_KC] = { 83, 16, 8.0f },  [I_VC] = { 84, 16, 8.0f },
};

/* A pattern plus a constant (the norm weights: around 1 for plain RMSNorm, around 0 for
 * Gemma's (1 + w)). */
typedef struct add_fill {
    kb_fill inner;
    float add;
    kb_fill_gen gen; /* the inner pattern's generator with the term, when it has one */
} add_fill;

static void add_fn(void *ud, int64_t row, int64_t col, int64_t rows, int64_t cols, float *out)
{
    add_fill *a = ud;
    a->inner.fn(a->inner.ud, row, col, rows, cols, out);
    for (int64_t i = 0; i < rows * cols; i++)
        out[i] += a->add;
}

typedef struct dec_state {
    kb_model_cfg mc;
    kb_decoder_opts o;
    int ws;
    kb_bench_pat pat[NIN];
    add_fill lnf[4];
    kb_decoder_fills fills;
    kb_decoder dec[KB_MAX_GSIPS];
    kb_bench_result *res;
    /* measured region, rank 0: inter-SIP bytes per collective, resource counters */
    uint64_t sip_bytes[3];
    uint64_t cls0[5], cls1[5];
    kb_time gemm0, gemm1, math0, math1;
} dec_state;

static const kb_coll_kind dec_colls[3] = { KB_COLL_ALLREDUCE, KB_COLL_ALLGATHER,
                                           KB_COLL_REDUCE_SCATTER };

/* Bytes moved over each link class of the whole machine so far (HBM ports, NoC hops, UCIe
 * links, inter-SIP links, TCM ports) and the PE_GEMM / PE_MATH busy time of every PE. */
/* Bytes through each link class (HBM ports, NoCs, UCIe links, inter-SIP links, TCM ports) and
 * the PE_GEMM / PE_MATH busy time, summed over the machine (kb_machine_each_res). */
typedef struct dec_counts {
    uint64_t *cls;
    kb_time *gemm, *math;
} dec_counts;

static void count_res(void *ud, const kb_res *r, const char *where)
{
    static const char *const classes[5] = { "hbm", "noc", "ucie", "inter_sip", "tcm" };
    dec_counts *c = ud;
    (void)where;
    for (int i = 0; i < 5; i++)
        if (!strcmp(r->name, classes[i]))
            c->cls[i] += r->bytes;
    if (!strcmp(r->name, "pe_gemm"))
        *c->gemm += r->busy;
    else if (!strcmp(r->name, "pe_math"))
        *c->math += r->busy;
}

static void counters(const kb_machine *m, uint64_t cls[5], kb_time *gemm, kb_time *math)
{
    dec_counts c = { cls, gemm, math };
    memset(cls, 0, 5 * sizeof cls[0]);
    *gemm = *math = 0;
    kb_machine_each_res(m, count_res, &c);
}

static const char *dec_algorithm(kb_ctx *ctx)
{
    return kb_ccl_config_find(kb_ccl_config_of(ctx), "hierarchical_allreduce_sip")
               ? "hierarchical_allreduce_sip" : "hierarchical_allreduce";
}

static int mark(kb_ctx *ctx, dec_state *st, int rank, int end)
{
    int rc = kb_dist_barrier(ctx);
    if (rc == 0 && rank == 0) {
        kb_machine *m = kb_ctx_machine(ctx);
        if (end) {
            kb_bench_mark_end(ctx, st->res);
            counters(m, st->cls1, &st->gemm1, &st->math1);
        } else {
            kb_bench_mark_begin(ctx, st->res);
            counters(m, st->cls0, &st->gemm0, &st->math0);
        }
        for (int i = 0; i < 3; i++) {
            uint64_t calls, bytes;
            kb_dist_traffic(ctx, dec_colls[i], &calls, &bytes);
            st->sip_bytes[i] = end ? bytes - st->sip_bytes[i] : bytes;
        }
    }
    return rc;
}

static int worker(kb_ctx *ctx, int rank, void *arg)
{
    dec_state *st = arg;
    int rc;
    if ((rc = kb_ctx_set_device(ctx, rank)) != 0 ||
        (rc = kb_dist_init_process_group(ctx, "ahbm", dec_algorithm(ctx))) != 0 ||
        (rc = kb_tp_initialize_model_parallel(ctx, st->ws)) != 0 ||
        (rc = kb_decoder_create(ctx, &st->mc, &st->o, &st->fills, &st->dec[rank])) != 0 ||
        (rc = mark(ctx, st, rank, 0)) != 0 ||
        (rc = kb_decoder_forward(ctx, &st->dec[rank])) != 0)
        return rc;
    return mark(ctx, st, rank, 1);
}

/* The inputs as fills, full-size layouts of kb_decoder_fills. */
static void make_fills(dec_state *st)
{
    const kb_model_cfg *mc = &st->mc;
    int64_t d = mc->d_model, hd = mc->head_dim, F = mc->mlp_hidden;
    int64_t ld[NIN] = { [I_X] = d, [I_LN0] = d, [I_LN1] = d, [I_LN2] = d, [I_LN3] = d,
                        [I_WQ] = mc->n_heads * hd, [I_WK] = mc->n_kv_heads * hd,
                        [I_WV] = mc->n_kv_heads * hd, [I_WO] = d, [I_WG] = F, [I_WU] = F,
                        [I_WD] = d, [I_KC] = hd, [I_VC] = hd };
    kb_fill f[NIN];
    for (int i = 0; i < NIN; i++) {
        kb_bench_pat p = { .seed = pats[i].seed, .range = pats[i].range, .den = pats[i].den,
                           .ld = ld[i] };
        st->pat[i] = p;
        f[i] = kb_bench_pattern_fill(&st->pat[i]);
    }
    for (int i = 0; i < 4; i++) {
        st->lnf[i].inner = f[I_LN0 + i];
        st->lnf[i].add = (float)(1.0 - mc->norm_unit_offset);
        kb_fill a = { add_fn, &st->lnf[i], NULL, 0, 0, 0, NULL };
        if (f[I_LN0 + i].gen) { /* generated where it replays, the term included */
            st->lnf[i].gen = *f[I_LN0 + i].gen;
            st->lnf[i].gen.add = st->lnf[i].add;
            a.gen = &st->lnf[i].gen;
        }
        st->fills.ln[i] = a;
    }
    st->fills.x = f[I_X];
    st->fills.wq = f[I_WQ];
    st->fills.wk = f[I_WK];
    st->fills.wv = f[I_WV];
    st->fills.wo = f[I_WO];
    st->fills.wg = f[I_WG];
    st->fills.wu = f[I_WU];
    st->fills.wd = f[I_WD];
    st->fills.kc = f[I_KC];
    st->fills.vc = f[I_VC];
}

static int dec_run(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    dec_state *st = state;
    kb_machine *m = kb_ctx_machine(ctx);
    kb_errbuf *eb = kb_ctx_err(ctx);
    int rc, fmt;
    if (!a->model)
        return kb_err_set(eb, KB_ERR_USAGE, "decoder_layer needs --model FILE (e.g. "
                          "configs/models/gemma2-2b.yaml)");
    if ((rc = kb_model_load(&st->mc, a->model, eb)) != 0)
        return rc;
    fmt = a->dtype ? kb_qfmt_from_name(a->dtype) : (int)KB_QF_F16;
    if (fmt < 0)
        return kb_err_set(eb, KB_ERR_USAGE, "--dtype %s: decoder_layer takes f16, bf16, int8, "
                          "mxint8, fp8e4m3 or fp8e5m2", a->dtype);
    st->ws = m->nsips;
    st->res = res;
    st->o.seq = a->p[P_SEQ];
    st->o.batch = a->p[P_BATCH];
    st->o.decode = (int)a->p[P_DECODE];
    st->o.kv_len = a->p[P_KVLEN];
    st->o.seq_parallel = (int)a->p[P_SP];
    st->o.sparse = (int)a->p[P_SPARSE];
    st->o.mapping = (int)a->p[P_MAPPING];
    st->o.launch_per_kernel = !a->p[P_FUSE];
    st->o.fmt = (kb_qfmt)fmt;
    make_fills(st);
    /* plan every rank first: a layout that does not fit is a usage error, not a failing
     * rank (every rank's plan takes the same mapping: the shapes are alike) */
    kb_decoder_plan pl;
    for (int r = 0; r < st->ws; r++)
        if ((rc = kb_decoder_plan_make(&st->mc, &st->o, st->ws, r, m->ncubes, m->npes, &pl,
                                       eb)) != 0)
            return rc;
    int64_t T = st->o.decode ? st->o.batch : st->o.batch * st->o.seq;
    const char *map = pl.machine || pl.dmachine ? ", mapping machine" : ", mapping naive";
    if (st->o.decode)
        snprintf(res->line, sizeof res->line,
                 "  decoder_layer (%s, tp=%d, %s%s, decode batch=%lld kv_len=%lld%s%s)",
                 st->mc.name, st->ws, kb_qfmt_name(st->o.fmt), st->o.sparse ? " 2:4" : "",
                 (long long)st->o.batch, (long long)st->o.kv_len,
                 st->o.seq_parallel ? ", seq_parallel" : "", map);
    else
        snprintf(res->line, sizeof res->line,
                 "  decoder_layer (%s, tp=%d, %s%s, prefill batch=%lld seq=%lld%s%s)",
                 st->mc.name, st->ws, kb_qfmt_name(st->o.fmt), st->o.sparse ? " 2:4" : "",
                 (long long)st->o.batch, (long long)st->o.seq,
                 st->o.seq_parallel ? ", seq_parallel" : "", map);
    kb_roofline rl;
    if ((rc = kb_spawn(ctx, worker, st, st->ws)) != 0 ||
        (rc = kb_tp_roofline_decoder(m, &st->mc, &st->o, &rl, eb)) != 0)
        return rc;
    kb_bench_set_roofline(res, &rl);
    /* the numbers of docs/decoder.md */
    const kb_decoder_stats *ds = &st->dec[0].st;
    double total = kb_time_to_ns(res->t_end - res->t_begin);
    double pes = (double)m->nsips * m->ncubes * m->npes;
    /* seventeen extras (KB_BENCH_MAX_EXTRAS 24): the mapping that ran is in the result line */
    kb_bench_add_extra(res, "world_size", st->ws);
    kb_bench_add_extra(res, "tokens", (double)T);
    kb_bench_add_extra(res, "compute_ns", ds->compute_ns);
    kb_bench_add_extra(res, "memory_ns", total - ds->compute_ns - ds->comm_ns - ds->launch_ns);
    kb_bench_add_extra(res, "comm_ns", ds->comm_ns);
    kb_bench_add_extra(res, "launch_ns", ds->launch_ns);
    kb_bench_add_extra(res, "tokens_per_s", total > 0 ? (double)T * 1e9 / total : 0);
    kb_bench_add_extra(res, "gemm_util", total > 0 ? kb_time_to_ns(st->gemm1 - st->gemm0) /
                                                         (pes * total) : 0);
    kb_bench_add_extra(res, "math_util", total > 0 ? kb_time_to_ns(st->math1 - st->math0) /
                                                         (pes * total) : 0);
    kb_bench_add_extra(res, "hbm_bytes", (double)(st->cls1[0] - st->cls0[0]));
    kb_bench_add_extra(res, "noc_bytes", (double)(st->cls1[1] - st->cls0[1]));
    kb_bench_add_extra(res, "ucie_bytes", (double)(st->cls1[2] - st->cls0[2]));
    kb_bench_add_extra(res, "inter_sip_bytes", (double)(st->cls1[3] - st->cls0[3]));
    kb_bench_add_extra(res, "all_reduce_sip_bytes", (double)st->sip_bytes[0]);
    kb_bench_add_extra(res, "all_gather_sip_bytes", (double)st->sip_bytes[1]);
    kb_bench_add_extra(res, "reduce_scatter_sip_bytes", (double)st->sip_bytes[2]);
    kb_bench_add_extra(res, "proj_gemm_ns", ds->proj_gemm_busy_ns);
    return 0;
}

/* ---- verification ---- */

static float *values(const kb_fill *f, int64_t rows, int64_t cols)
{
    float *p = malloc(sizeof(float) * (size_t)(rows * cols) + 4);
    if (!p)
        return NULL;
    for (int64_t r0 = 0; r0 < rows; r0 += 64) {
        int64_t n = rows - r0 < 64 ? rows - r0 : 64;
        if (f->fn)
            f->fn(f->ud, f->row0 + r0, f->col0, n, cols, p + r0 * cols);
    }
    return p;
}

/* What the device holds of an activation / cache written in dt. */
static void round_to(float *p, size_t n, kb_dtype dt)
{
    for (size_t i = 0; i < n; i++)
        p[i] = dt == KB_BF16 ? kb_bf16_to_f32(kb_f32_to_bf16(p[i]))
                             : kb_f16_to_f32(kb_f32_to_f16(p[i]));
}

/* Tolerance relative to |ref| + rms(ref) per format (docs/decoder.md): the reference rounds
 * and quantizes as the device does, so what is left is f32 against f64 arithmetic and the
 * activation that rounds to the neighbouring step, whose effect grows with the step. */
static double tolerance(kb_qfmt f)
{
    switch (f) {
    case KB_QF_F16:
    case KB_QF_BF16:
        return 1.0 / 128;
    case KB_QF_INT8:
    case KB_QF_MXINT8:
        return 1.0 / 16;
    case KB_QF_FP8E4M3:
        return 1.0 / 8; /* a step is an eighth of the value */
    default:
        return 1.0 / 4; /* fp8e5m2: a step is a quarter of the value */
    }
}

/* A projection weight as kb_decoder_ref_weight takes it: K x N, split over the ranks by
 * columns or, for the output projections (O, down), by rows. */
typedef struct dec_weight {
    int buf;              /* I_W* */
    int64_t k, n;
    int row_parallel;
    const kb_fill *fill;
} dec_weight;

#define DEC_NWEIGHTS 7

static void weight_shapes(const dec_state *st, dec_weight w[DEC_NWEIGHTS])
{
    const kb_model_cfg *mc = &st->mc;
    int64_t d = mc->d_model, hd = mc->head_dim, F = mc->mlp_hidden;
    int64_t nq = mc->n_heads * hd, nk = mc->n_kv_heads * hd;
    w[0] = (dec_weight){ I_WQ, d, nq, 0, &st->fills.wq };
    w[1] = (dec_weight){ I_WK, d, nk, 0, &st->fills.wk };
    w[2] = (dec_weight){ I_WV, d, nk, 0, &st->fills.wv };
    w[3] = (dec_weight){ I_WO, nq, d, 1, &st->fills.wo };
    w[4] = (dec_weight){ I_WG, d, F, 0, &st->fills.wg };
    w[5] = (dec_weight){ I_WU, d, F, 0, &st->fills.wu };
    w[6] = (dec_weight){ I_WD, F, d, 1, &st->fills.wd };
}

/* One weight's host values (the fills are pure functions of the position: the seven are
 * built at once, on threads of their own). */
typedef struct weight_job {
    const dec_state *st;
    const dec_weight *w;
    float *out;
    int rc;
} weight_job;

static void *weight_values(void *p)
{
    weight_job *j = p;
    j->rc = kb_decoder_ref_weight(j->st->o.fmt, j->st->o.sparse, j->w->k, j->w->n, j->st->ws,
                                  j->w->row_parallel, j->w->fill, j->out);
    return NULL;
}

/* buf[]: the layer's inputs on the host as the device holds them: x and the caches rounded to
 * the activation dtype, the norm weights, the projection weights dequantized and pruned as
 * each rank's slice is (the caches only when decoding). The caller frees buf[], also on
 * failure. */
static int host_inputs(const dec_state *st, float *buf[NIN], kb_errbuf *eb)
{
    const kb_model_cfg *mc = &st->mc;
    const kb_decoder_opts *o = &st->o;
    int64_t d = mc->d_model, hd = mc->head_dim;
    int64_t T = o->decode ? o->batch : o->batch * o->seq;
    int64_t ncache = o->decode ? o->batch * mc->n_kv_heads * o->kv_len : 0;
    kb_dtype act = st->dec[0].act;
    dec_weight w[DEC_NWEIGHTS];
    int rc = 0;

    weight_shapes(st, w);
    buf[I_X] = values(&st->fills.x, T, d);
    for (int i = 0; i < 4; i++)
        buf[I_LN0 + i] = values(&st->fills.ln[i], 1, d);
    for (int i = 0; i < DEC_NWEIGHTS; i++)
        buf[w[i].buf] = malloc(sizeof(float) * (size_t)(w[i].k * w[i].n));
    if (o->decode) {
        buf[I_KC] = values(&st->fills.kc, ncache, hd);
        buf[I_VC] = values(&st->fills.vc, ncache, hd);
    }
    for (int i = 0; i < NIN; i++)
        if (!buf[i] && (i < I_KC || o->decode))
            return kb_err_set(eb, KB_ERR_NOMEM, "decoder_layer verify: out of memory");
    round_to(buf[I_X], (size_t)(T * d), act);
    if (o->decode) {
        round_to(buf[I_KC], (size_t)(ncache * hd), act);
        round_to(buf[I_VC], (size_t)(ncache * hd), act);
    }
    weight_job jobs[DEC_NWEIGHTS];
    for (int i = 0; i < DEC_NWEIGHTS; i++)
        jobs[i] = (weight_job){ .st = st, .w = &w[i], .out = buf[w[i].buf], .rc = 0 };
    kb_par_run(weight_values, jobs, sizeof jobs[0], DEC_NWEIGHTS);
    for (int i = 0; i < DEC_NWEIGHTS && rc == 0; i++)
        rc = jobs[i].rc;
    if (rc != 0 && (rc > 0 || !eb->msg[0]))
        rc = kb_err_set(eb, KB_ERR_INVAL, "decoder_layer verify: weight values failed");
    return rc;
}

/* The reference's inputs: the host's buffers, the activation dtype, the plan's segments. */
static void ref_inputs(const dec_state *st, float *const buf[NIN], kb_decoder_ref_in *in)
{
    int64_t hd = st->mc.head_dim;

    memset(in, 0, sizeof *in);
    in->x = buf[I_X];
    for (int i = 0; i < 4; i++)
        in->ln[i] = buf[I_LN0 + i];
    in->wq = buf[I_WQ];
    in->wk = buf[I_WK];
    in->wv = buf[I_WV];
    in->wo = buf[I_WO];
    in->wg = buf[I_WG];
    in->wu = buf[I_WU];
    in->wd = buf[I_WD];
    in->kc = buf[I_KC];
    in->vc = buf[I_VC];
    in->act = st->dec[0].act;
    in->o_seg = st->o.decode ? st->dec[0].pl.nrep * hd : st->dec[0].pl.hg * hd;
    in->mlp_seg = st->dec[0].pl.cf;
}

/* Rank 0's normalized activations as its first gemm PE reads them (kb_decoder_ref_in.n_dev),
 * T x d each in ndev[0] (attention) and ndev[1] (MLP), read through raw (T x d of the
 * activation dtype). */
static int device_norms(const dec_state *st, int64_t n, void *raw, float *ndev[2],
                        kb_decoder_ref_in *in)
{
    int rc;

    const kb_decoder_plan *pl = &st->dec[0].pl;
    for (int i = 0; i < 2; i++) {
        kb_tensor *t = st->o.seq_parallel ? (i ? st->dec[0].ag2 : st->dec[0].ag1)
                                          : (i ? st->dec[0].hn2 : st->dec[0].hn1);
        /* the first PE of every token group holds the group's rows (naive: one group) */
        int64_t ncol = i ? pl->mncol : pl->qncol, tr = i ? pl->mtr : pl->qtr;
        int64_t groups = st->o.seq_parallel ? 1 : pl->T / tr, per = n / groups;
        for (int64_t g = 0; g < groups; g++) {
            if ((rc = kb_tensor_read_shard_raw(t, (size_t)(g * ncol), raw)) != 0)
                return rc;
            kb_dtype_load_n(in->act, raw, 0, ndev[i] + g * per, (size_t)per);
        }
        in->n_dev[i] = ndev[i];
    }
    return 0;
}

/* got (T x d): the output rows, every rank's chunk in token order with seq_parallel, else
 * rank 0's T rows, which every other rank's must equal (res->verified 0 and the detail when
 * one does not). first holds a rank's Tl x d. */
static int read_outputs(const dec_state *st, int64_t n, float *got, float *first,
                        kb_bench_result *res)
{
    int64_t nl = st->dec[0].pl.Tl * st->mc.d_model;
    int rc;

    for (int r = 0; r < st->ws; r++) {
        float *dst = st->o.seq_parallel ? got + (size_t)r * (size_t)nl : first;
        if ((rc = kb_tensor_read(st->dec[r].y, dst)) != 0)
            return rc;
        if (!st->o.seq_parallel) {
            if (r == 0)
                memcpy(got, first, sizeof(float) * (size_t)n);
            else if (memcmp(got, first, sizeof(float) * (size_t)n) != 0 && res->verified) {
                snprintf(res->detail, sizeof res->detail,
                         "rank %d's output differs from rank 0's", r);
                res->verified = 0;
            }
        }
    }
    return 0;
}

/* The n outputs against the reference, each within tol(fmt) * (|ref| + rms(ref))
 * (docs/decoder.md; bound holds n). Returns 1 when all are. */
static int within_tolerance(kb_bench_result *res, kb_qfmt fmt, const float *got,
                            const double *ref, double *bound, int64_t n)
{
    double ss = 0, tol = tolerance(fmt);
    for (int64_t i = 0; i < n; i++)
        ss += ref[i] * ref[i];
    double rms = sqrt(ss / (double)n);
    for (int64_t i = 0; i < n; i++)
        bound[i] = tol * (fabs(ref[i]) + rms);
    return kb_bench_check(res, KB_F32, got, ref, bound, (size_t)n, "y");
}

static int dec_verify(kb_ctx *ctx, const kb_bench_args *a, void *state, kb_bench_result *res)
{
    dec_state *st = state;
    const kb_decoder_opts *o = &st->o;
    kb_errbuf *eb = kb_ctx_err(ctx);
    int64_t d = st->mc.d_model, T = o->decode ? o->batch : o->batch * o->seq;
    int64_t Tl = st->dec[0].pl.Tl;
    kb_decoder_ref_in in;
    float *buf[NIN] = { 0 }, *got = NULL, *first = NULL;
    double *ref = NULL, *bound = NULL;
    float *ndev[2] = { NULL, NULL };
    void *raw = NULL;
    int64_t far = -1;
    int rc = 0;
    (void)a;
    got = malloc(sizeof(float) * (size_t)(T * d));
    first = malloc(sizeof(float) * (size_t)(Tl * d));
    ref = malloc(sizeof(double) * (size_t)(T * d));
    bound = malloc(sizeof(double) * (size_t)(T * d));
    ndev[0] = malloc(sizeof(float) * (size_t)(T * d));
    ndev[1] = malloc(sizeof(float) * (size_t)(T * d));
    raw = malloc(kb_dtype_size(st->dec[0].act) * (size_t)(T * d));
    if (!got || !first || !ref || !bound || !ndev[0] || !ndev[1] || !raw) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "decoder_layer verify: out of memory");
        goto out;
    }
    if ((rc = host_inputs(st, buf, eb)) != 0)
        goto out;
    ref_inputs(st, buf, &in);
    if ((rc = device_norms(st, T * d, raw, ndev, &in)) != 0)
        goto out;
    in.n_tol = tolerance(o->fmt); /* the same bound as the output's */
    in.n_far = &far;
    if ((rc = kb_decoder_reference(&st->mc, o, &in, ref, eb)) != 0)
        goto out;
    res->verified = 1;
    if ((rc = read_outputs(st, T * d, got, first, res)) != 0)
        goto out;
    if (far >= 0 && res->verified) {
        snprintf(res->detail, sizeof res->detail,
                 "normalized activation %lld (token %lld) is further from the reference's "
                 "than the format's bound", (long long)far, (long long)(far % (T * d) / d));
        res->verified = 0;
    }
    if (!within_tolerance(res, o->fmt, got, ref, bound, T * d))
        res->verified = 0;
    res->digest = kb_fnv1a64(got, sizeof(float) * (size_t)(T * d), KB_FNV1A64_INIT);
    res->have_digest = 1;
    snprintf(res->ok_text, sizeof res->ok_text, "%lld x %lld, %d ranks OK", (long long)T,
             (long long)d, st->ws);
out:
    for (int i = 0; i < NIN; i++)
        free(buf[i]);
    free(ndev[0]);
    free(ndev[1]);
    free(raw);
    free(got);
    free(first);
    free(ref);
    free(bound);
    return rc;
}

const kb_bench kb_bench_decoder_layer = {
    .name = "decoder_layer",
    .summary = "transformer decoder layer of --model (RMSNorm, RoPE, GQA attention, gated MLP) "
               "with Megatron TP over the SIPs; --dtype f16|bf16|int8|mxint8|fp8e4m3|fp8e5m2",
    .params = {
        { "seq", 128, 1, 65536, "prefill tokens per sequence (unused with decode=1)" },
        { "batch", 1, 1, 4096, "sequences" },
        { "decode", 0, 0, 1, "1: one decode step (a new token per sequence after kv_len cached)" },
        { "kv_len", 2048, 1, 1048576, "decode: cached positions per sequence" },
        { "seq_parallel", 0, 0, 1, "1: reduce_scatter + all_gather instead of all_reduce" },
        { "sparse", 0, 0, 1, "1: 2:4-sparse weights (magnitude pruned along K)" },
        { "mapping", 2, 0, 2, "how the layer goes onto a rank's PEs: machine (without "
                              "seq_parallel) puts prefill in token groups with the partials "
                              "summed in the SIP and combines decode's chunks in bulk, auto "
                              "takes it where it applies (docs/decoder.md)" },
        { "fuse", 1, 0, 1, "mapping machine: 1 runs the layer's kernels and its lane "
                           "all-reduces as one launch, a barrier between them; 0 a launch "
                           "per kernel and per all-reduce (as before the fused launch)" },
    },
    .nparams = 8,
    .param_names = { [P_MAPPING] = (const char *const[]){ "naive", "machine", "auto", NULL } },
    .state_size = sizeof(dec_state),
    .run = dec_run,
    .verify = dec_verify,
    /* no --size (size_elem_bytes 0); takes --model and a number format in --dtype
     * (kb_bench_takes_model) */
};
