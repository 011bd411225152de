/*
 * kb_tp_roofline — the TP workloads' rooflines (kb_tp_roofline.h): their flops, HBM bytes and
 * collectives, fed to kb_roofline's accumulator.
 */
#include "kb_tp_roofline.h"

#include <stdlib.h>

#include "kb_ccl_roofline.h"
#include "kb_tp.h"

/* Every PE of the machine's SIPs in order: the process group's all_pes ranks. */
static int *all_pes(const kb_machine *m, int *n)
{
    int *gid;
    *n = m->nsips * m->ncubes * m->npes;
    if (!(gid = malloc(sizeof *gid * (size_t)*n)))
        return NULL;
    for (int i = 0; i < *n; i++)
        gid[i] = i;
    return gid;
}

/* The collectives of a layer, one after another: kinds[i] with bytes[i] per PE. */
static int add_colls(kb_roofline_acc *a, int nc, const kb_coll_kind *kinds,
                     const double *bytes, kb_errbuf *eb)
{
    int n, rc = 0, *gid = all_pes(kb_roofline_machine(a), &n);
    if (!gid)
        return kb_err_set(eb, KB_ERR_NOMEM, "roofline: out of memory for %d PEs", n);
    for (int i = 0; i < nc && rc == 0; i++)
        rc = kb_ccl_roofline_add(a, kinds[i], n, gid, 0, bytes[i], i, eb);
    free(gid);
    return rc;
}

/* The decoder's flops per rank: the projections in the format, the attention at the base
 * rate (prefill: the causal triangle, sum over positions of (position + 1) keys). */
static void decoder_flops(kb_roofline_acc *a, const kb_decoder_plan *pl,
                          const kb_decoder_opts *o)
{
    double T = (double)pl->T, d = (double)pl->d, hd = (double)pl->hd, nq = (double)pl->nq;
    double proj = 2.0 * T * d * (double)(pl->nq + 2 * pl->nkv) * hd + 2.0 * T * nq * hd * d +
                  3.0 * 2.0 * T * d * (double)pl->Floc;
    /* query-key pairs per sequence and query head: Q·Kᵀ and P·V take 2·hd flops each */
    double pairs = o->decode ? (double)(o->kv_len + 1)
                             : (double)o->seq * (double)(o->seq + 1) / 2.0;
    double att = (double)o->batch * nq * pairs * 4.0 * hd;
    kb_roofline_flops(a, o->fmt, o->sparse, proj, pl->S);
    kb_roofline_flops(a, KB_QF_F16, 0, att, pl->S);
}

/* The decoder's HBM bytes of every rank, spread over its PEs: weights once, the decode
 * cache, the input read and the output (f32) written. */
static void decoder_memory(kb_roofline_acc *a, const kb_decoder_plan *pl,
                           const kb_decoder_opts *o, double act)
{
    int64_t d = pl->d, hd = pl->hd, F = pl->Floc;
    double w = (double)(kb_qweight_bytes(o->fmt, o->sparse, d, (pl->nq + 2 * pl->nkv) * hd) +
                        kb_qweight_bytes(o->fmt, o->sparse, pl->nq * hd, d) +
                        2 * kb_qweight_bytes(o->fmt, o->sparse, d, F) +
                        kb_qweight_bytes(o->fmt, o->sparse, F, d));
    double kv = o->decode ? 2.0 * (double)(o->batch * pl->nkv * hd) * act : 0.0;
    double rd = w + kv * (double)o->kv_len + (double)(pl->Tl * d) * act;
    double wr = kv + (double)(pl->Tl * d) * 4.0;
    kb_roofline_mem_spread(a, rd * pl->ws, wr * pl->ws);
    kb_roofline_mem_pes(a, pl->ws * pl->S);
}

int kb_tp_roofline_decoder(const kb_machine *m, const kb_model_cfg *mc, const kb_decoder_opts *o,
                           kb_roofline *out, kb_errbuf *eb)
{
    kb_decoder_plan pl;
    kb_roofline_acc *a = NULL;
    double act = 2.0; /* f16, or bf16 for bf16 weights */
    int rc;

    if ((rc = kb_decoder_plan_make(mc, o, m->nsips, 0, m->ncubes, m->npes, &pl, eb)) != 0 ||
        (rc = kb_roofline_acc_create(m, &a, eb)) != 0)
        goto fail;
    decoder_flops(a, &pl, o);
    decoder_memory(a, &pl, o, act);
    if (o->seq_parallel) {
        /* all_gather the normalised chunk, reduce_scatter the attention's partials, again
         * for the MLP: pieces of Tl·d / S elements per PE */
        const kb_coll_kind k[4] = { KB_COLL_ALLGATHER, KB_COLL_REDUCE_SCATTER,
                                    KB_COLL_ALLGATHER, KB_COLL_REDUCE_SCATTER };
        double p = (double)pl.piece, b[4] = { p * act, p * 4.0, p * act, p * 4.0 };
        rc = add_colls(a, 4, k, b, eb);
    } else {
        const kb_coll_kind k[2] = { KB_COLL_ALLREDUCE, KB_COLL_ALLREDUCE };
        double b[2] = { (double)(pl.T * pl.d) * 4.0, (double)(pl.T * pl.d) * 4.0 };
        rc = add_colls(a, 2, k, b, eb);
    }
    if (rc)
        goto fail;
    kb_roofline_result(a, out);
fail:
    kb_roofline_acc_destroy(a);
    return rc;
}

int kb_tp_roofline_mlp(const kb_machine *m, int64_t tokens, int64_t d, int64_t hidden,
                       kb_roofline *out, kb_errbuf *eb)
{
    int ws = m->nsips, S = m->ncubes * m->npes, cubes, pes, rc;
    kb_roofline_acc *a = NULL;
    if (hidden % ws)
        return kb_err_set(eb, KB_ERR_RANGE, "tp_mlp roofline: hidden %lld over %d ranks",
                          (long long)hidden, ws);
    int64_t loc = hidden / ws;
    kb_tp_pick_pes(m, loc, &cubes, &pes);
    if ((rc = kb_roofline_acc_create(m, &a, eb)) != 0)
        return rc;
    double t = (double)tokens, dd = (double)d, l = (double)loc;
    kb_roofline_flops(a, KB_QF_F16, 0, 2.0 * 2.0 * t * dd * l, cubes * pes);
    /* per rank: W1, b1, W2 once, b2 on every PE (replicated), x on each fc1 PE, y (f16) on
     * every PE */
    double rd = 2.0 * (2.0 * dd * l + l) + 2.0 * dd * S + 2.0 * t * dd * cubes * pes;
    kb_roofline_mem_spread(a, rd * ws, 2.0 * t * dd * S * ws);
    kb_roofline_mem_pes(a, ws * S);
    {
        const kb_coll_kind k = KB_COLL_ALLREDUCE;
        double b = t * dd * 4.0;
        rc = add_colls(a, 1, &k, &b, eb);
    }
    if (rc == 0)
        kb_roofline_result(a, out);
    kb_roofline_acc_destroy(a);
    return rc;
}

int kb_tp_roofline_attention(const kb_machine *m, int64_t seq, int64_t d, int64_t heads,
                             kb_roofline *out, kb_errbuf *eb)
{
    int ws = m->nsips, S = m->ncubes * m->npes, cubes, pes, rc;
    kb_roofline_acc *a = NULL;
    if (heads < 1 || d % heads || heads % ws)
        return kb_err_set(eb, KB_ERR_RANGE, "tp_attention roofline: d %lld, %lld heads over "
                          "%d ranks", (long long)d, (long long)heads, ws);
    int64_t hr = heads / ws;
    kb_tp_pick_pes(m, hr, &cubes, &pes);
    if ((rc = kb_roofline_acc_create(m, &a, eb)) != 0)
        return rc;
    double s = (double)seq, dd = (double)d, dh = (double)(d / heads), h = (double)hr;
    /* per head: q, kᵀ, v and the output rows (4 · 2·s·d·dh), then Q Kᵀ and P V (2 · 2·s²·dh) */
    kb_roofline_flops(a, KB_QF_F16, 0, h * (8.0 * s * dd * dh + 4.0 * s * s * dh), cubes * pes);
    /* per rank: x and xᵀ on each head's PE, its four weight blocks, bo on every PE (f16);
     * y (f16) on every PE */
    double rd = 2.0 * (2.0 * s * dd * h + 4.0 * dd * dh * h + dd * S);
    kb_roofline_mem_spread(a, rd * ws, 2.0 * s * dd * S * ws);
    kb_roofline_mem_pes(a, ws * S);
    {
        const kb_coll_kind k = KB_COLL_ALLREDUCE;
        double b = s * dd * 4.0;
        rc = add_colls(a, 1, &k, &b, eb);
    }
    if (rc == 0)
        kb_roofline_result(a, out);
    kb_roofline_acc_destroy(a);
    return rc;
}
