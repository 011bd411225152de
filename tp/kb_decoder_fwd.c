/*
 * kb_decoder_fwd — the decoder layer's forward pass on a TP rank (part of the decoder,
 * kb_decoder.h; shared names in kb_decoder_int.h): the launches of its kernels in order (input
 * norm, QKV + RoPE, attention with its W_o rows, residual + norms, MLP, residual), the
 * collectives between them (all_reduce of the partials, or with seq_parallel reduce_scatter
 * and all_gather), and the time split of the rank's critical path into compute (the busiest
 * PE's PE_GEMM + PE_MATH time of each launch), memory (the rest of the launch) and
 * communication, with the projection gemms' PE_GEMM time measured and in closed form.
 * Limits: one forward per kb_decoder (the partial blocks are zeroed once at creation).
 */
#include "kb_decoder_int.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "kb_dist.h"
#include "kb_machine.h"

typedef struct phase {
    kb_time t0;
    kb_time *busy0;   /* per PE of the rank's SIP: PE_GEMM + PE_MATH busy */
    kb_time gemm0;    /* sum of PE_GEMM busy over the SIP */
} phase;

static void snap(kb_ctx *ctx, kb_time *per_pe, kb_time *gemm_sum)
{
    kb_machine *m = kb_ctx_machine(ctx);
    const kb_sip_hw *s = &m->sips[kb_ctx_current_device(ctx)];
    kb_time g = 0;
    for (int c = 0; c < m->ncubes; c++)
        for (int p = 0; p < m->npes; p++) {
            const kb_pe_hw *pe = &s->cubes[c].pes[p];
            per_pe[c * m->npes + p] = pe->gemm.busy + pe->math.busy;
            g += pe->gemm.busy;
        }
    *gemm_sum = g;
}

static int launch_timed(kb_ctx *ctx, kb_decoder *dec, phase *ph, const char *name,
                        kb_kernel_fn fn, const kb_kargs *a, const kb_dec_grid *g, int proj)
{
    kb_machine *m = kb_ctx_machine(ctx);
    int S = m->ncubes * m->npes, rc;
    kb_time *now_busy = ph->busy0 + S, gemm1;
    kb_grid grid = { g->pes, g->cubes, 1, -1 };
    snap(ctx, ph->busy0, &ph->gemm0);
    ph->t0 = kb_sim_now(kb_ctx_sim(ctx));
    if ((rc = kb_launch(ctx, name, fn, a, &grid)) != 0)
        return rc;
    kb_time dt = kb_sim_now(kb_ctx_sim(ctx)) - ph->t0, cmax = 0;
    snap(ctx, now_busy, &gemm1);
    /* a resource's busy time only grows: the difference is this launch's share */
    assert(gemm1 >= ph->gemm0);
    for (int i = 0; i < S; i++)
        assert(now_busy[i] >= ph->busy0[i]);
    for (int i = 0; i < S; i++)
        if (now_busy[i] - ph->busy0[i] > cmax)
            cmax = now_busy[i] - ph->busy0[i];
    if (cmax > dt)
        cmax = dt;
    dec->st.compute_ns += kb_time_to_ns(cmax);
    dec->st.memory_ns += kb_time_to_ns(dt - cmax);
    if (proj)
        dec->st.proj_gemm_busy_ns += kb_time_to_ns(gemm1 - ph->gemm0);
    return 0;
}

enum { C_AR, C_RS, C_AG };
static int coll_timed(kb_ctx *ctx, kb_decoder *dec, int kind, kb_tensor *out, kb_tensor *in)
{
    kb_time t0 = kb_sim_now(kb_ctx_sim(ctx));
    int rc = kind == C_AR   ? kb_dist_all_reduce(ctx, in, KB_DIST_SUM)
             : kind == C_RS ? kb_dist_reduce_scatter(ctx, out, in)
                            : kb_dist_all_gather(ctx, out, in);
    dec->st.comm_ns += kb_time_to_ns(kb_sim_now(kb_ctx_sim(ctx)) - t0);
    return rc;
}

double kb_decoder_gemm_closed_ns(const kb_topo_cfg *c, kb_qfmt fmt, int sparse, uint64_t m,
                                  uint64_t n, uint64_t k)
{
    uint64_t tm = (uint64_t)c->sched_tile_m, tn = (uint64_t)c->sched_tile_n,
             tk = (uint64_t)c->sched_tile_k;
    double t = 0;
    assert(tm > 0 && tn > 0 && tk > 0); /* the schema's ranges: tiles of at least one */
    for (uint64_t m0 = 0; m0 < m; m0 += tm)
        for (uint64_t n0 = 0; n0 < n; n0 += tn)
            for (uint64_t k0 = 0; k0 < k; k0 += tk)
                t += kb_qgemm_ns(c, fmt, sparse, m - m0 < tm ? m - m0 : tm,
                                 n - n0 < tn ? n - n0 : tn, k - k0 < tk ? k - k0 : tk);
    return t;
}

/* The closed form of the projection gemms of the QKV and MLP kernels on one rank. */
static double proj_closed(kb_ctx *ctx, const kb_decoder *dec)
{
    const kb_topo_cfg *c = &kb_ctx_machine(ctx)->cfg;
    const kb_decoder_plan *pl = &dec->pl;
    kb_qfmt f = dec->o.fmt;
    int sp = dec->o.sparse;
    double t = 0;
    assert(pl->tb > 0); /* kb_decoder_plan_make picks row blocks of at least one row */
    for (int64_t r0 = 0; r0 < pl->T; r0 += pl->tb) {
        uint64_t n = (uint64_t)(pl->T - r0 < pl->tb ? pl->T - r0 : pl->tb);
        t += pl->qkv.n * kb_decoder_gemm_closed_ns(c, f, sp, n, (uint64_t)pl->c, (uint64_t)pl->d);
        t += pl->mlp.n *
             (2 * kb_decoder_gemm_closed_ns(c, f, sp, n, (uint64_t)pl->cf, (uint64_t)pl->d) +
              kb_decoder_gemm_closed_ns(c, f, sp, n, (uint64_t)pl->d, (uint64_t)pl->cf));
    }
    return t;
}

/* The VAs of a weight's three parts (values, scales, metadata; 0 where it has none). */
static void wptrs(const kb_qweight *w, kb_va *p)
{
    p[0] = kb_tensor_va(w->q);
    p[1] = w->scale ? kb_tensor_va(w->scale) : 0;
    p[2] = w->meta ? kb_tensor_va(w->meta) : 0;
}

/* The row owners' arguments that their three launches share. */
static kb_kargs rows_args(const kb_decoder *dec)
{
    const kb_decoder_plan *pl = &dec->pl;
    kb_kargs ra;
    memset(&ra, 0, sizeof ra);
    ra.i[RK_RC] = pl->rc;
    ra.i[RK_D] = pl->d;
    ra.i[RK_SP] = dec->o.seq_parallel;
    ra.i[RK_PIECE] = pl->piece;
    ra.i[RK_POST] = dec->mc.post_norms;
    ra.i[RK_T] = pl->T;
    ra.i[RK_ACT] = dec->act;
    ra.f[0] = dec->mc.norm_eps;
    ra.f[1] = dec->mc.norm_unit_offset;
    return ra;
}

/* 1. input norm -> the QKV PEs' input */
static int fwd_norm_in(kb_ctx *ctx, kb_decoder *dec, phase *ph, const kb_kargs *ra)
{
    const kb_decoder_plan *pl = &dec->pl;
    int sp = dec->o.seq_parallel, rc;
    kb_kargs a = *ra;
    a.i[RK_MODE] = 0;
    a.i[RK_NCOPY] = pl->qkv.n;
    a.ptr[RP_X] = kb_tensor_va(dec->x);
    a.ptr[RP_LNB] = kb_tensor_va(dec->ln[0]);
    a.ptr[RP_NORM] = kb_tensor_va(sp ? dec->ag1_in : dec->hn1);
    if ((rc = launch_timed(ctx, dec, ph, "dec_norm_in", kb_decoder_rows_kernel, &a, &pl->rows,
                           0)) != 0 ||
        (sp && (rc = coll_timed(ctx, dec, C_AG, dec->ag1, dec->ag1_in)) != 0))
        return rc;
    return 0;
}

/* 2. QKV + RoPE */
static int fwd_qkv(kb_ctx *ctx, kb_decoder *dec, phase *ph, int64_t flags)
{
    const kb_decoder_plan *pl = &dec->pl;
    int sp = dec->o.seq_parallel;
    kb_kargs a;
    memset(&a, 0, sizeof a);
    a.i[QK_T] = pl->T;
    a.i[QK_D] = pl->d;
    a.i[QK_C] = pl->c;
    a.i[QK_P] = pl->p;
    a.i[QK_NROPE] = pl->nq + pl->nkv;
    a.i[QK_HD] = pl->hd;
    a.i[QK_TB] = pl->tb;
    a.i[QK_FLAGS] = flags;
    a.ptr[QP_IN] = kb_tensor_va(sp ? dec->ag1 : dec->hn1);
    wptrs(&dec->wqkv, &a.ptr[QP_W]);
    a.ptr[QP_COS] = kb_tensor_va(dec->cosq);
    a.ptr[QP_SIN] = kb_tensor_va(dec->sinq);
    a.ptr[QP_OUT] = kb_tensor_va(dec->qkv);
    return launch_timed(ctx, dec, ph, "dec_qkv", kb_decoder_qkv_kernel, &a, &pl->qkv, 1);
}

/* 3. prefill attention (+ its W_o rows) into the attention partials */
static int fwd_attn_prefill(kb_ctx *ctx, kb_decoder *dec, phase *ph, int64_t flags)
{
    const kb_decoder_plan *pl = &dec->pl;
    kb_kargs a;
    memset(&a, 0, sizeof a);
    a.f[0] = kb_model_qscale(&dec->mc);
    a.f[1] = dec->mc.attn_softcap;
    a.i[AK_SEQ] = dec->o.seq;
    a.i[AK_QROWS] = pl->qrows;
    a.i[AK_QB] = pl->qb;
    a.i[AK_NQ] = pl->nq;
    a.i[AK_NKV] = pl->nkv;
    a.i[AK_P] = pl->p;
    a.i[AK_C] = pl->c;
    a.i[AK_HD] = pl->hd;
    a.i[AK_T] = pl->T;
    a.i[AK_D] = pl->d;
    a.i[AK_FLAGS] = flags;
    a.i[AK_ITEMS] = pl->items;
    a.ptr[AP_QKV] = kb_tensor_va(dec->qkv);
    wptrs(&dec->wo, &a.ptr[AP_WO]);
    a.ptr[AP_PART] = kb_tensor_va(dec->po);
    return launch_timed(ctx, dec, ph, "dec_attention", kb_decoder_attn_kernel, &a, &pl->att, 0);
}

/* 3. decode: split-KV attention over the cache chunks, then their combination (+ the W_o
 * rows) into the attention partials */
static int fwd_attn_decode(kb_ctx *ctx, kb_decoder *dec, phase *ph, int64_t flags)
{
    const kb_decoder_plan *pl = &dec->pl;
    int rc;
    kb_kargs a;
    memset(&a, 0, sizeof a);
    a.f[0] = kb_model_qscale(&dec->mc);
    a.f[1] = dec->mc.attn_softcap;
    a.i[DK_CH] = pl->chunks;
    a.i[DK_CLEN] = pl->clen;
    a.i[DK_KVLEN] = dec->o.kv_len;
    a.i[DK_NQ] = pl->nq;
    a.i[DK_NKV] = pl->nkv;
    a.i[DK_P] = pl->p;
    a.i[DK_C] = pl->c;
    a.i[DK_HD] = pl->hd;
    a.i[DK_T] = pl->T;
    a.i[DK_FLAGS] = flags;
    a.i[DK_ITEMS] = pl->items;
    a.ptr[DP_QKV] = kb_tensor_va(dec->qkv);
    a.ptr[DP_KC] = kb_tensor_va(dec->kc);
    a.ptr[DP_VC] = kb_tensor_va(dec->vc);
    a.ptr[DP_OUT] = kb_tensor_va(dec->dpart);
    if ((rc = launch_timed(ctx, dec, ph, "dec_attention_chunks", kb_decoder_dattn_kernel, &a,
                           &pl->att, 0)) != 0)
        return rc;
    memset(&a, 0, sizeof a);
    a.i[CK_CH] = pl->chunks;
    a.i[CK_NQ] = pl->nq;
    a.i[CK_NKV] = pl->nkv;
    a.i[CK_HD] = pl->hd;
    a.i[CK_T] = pl->T;
    a.i[CK_D] = pl->d;
    a.i[CK_FLAGS] = flags;
    a.i[CK_ITEMS] = pl->citems;
    a.ptr[CP_DPART] = kb_tensor_va(dec->dpart);
    wptrs(&dec->wo, &a.ptr[CP_WO]);
    a.ptr[CP_PART] = kb_tensor_va(dec->po);
    return launch_timed(ctx, dec, ph, "dec_attention_combine", kb_decoder_dcomb_kernel, &a,
                        &pl->comb, 0);
}

/* 4. residual + norms -> the MLP PEs' input */
static int fwd_residual_attn(kb_ctx *ctx, kb_decoder *dec, phase *ph, const kb_kargs *ra)
{
    const kb_decoder_plan *pl = &dec->pl;
    int sp = dec->o.seq_parallel, rc;
    kb_kargs a = *ra;
    a.i[RK_MODE] = 1;
    a.i[RK_NCOPY] = pl->mlp.n;
    a.ptr[RP_X] = kb_tensor_va(dec->x);
    a.ptr[RP_LNA] = dec->ln[1] ? kb_tensor_va(dec->ln[1]) : 0;
    a.ptr[RP_LNB] = kb_tensor_va(dec->ln[2]);
    a.ptr[RP_SUM] = kb_tensor_va(sp ? dec->rs_o : dec->po);
    a.ptr[RP_OUT] = kb_tensor_va(dec->h);
    a.ptr[RP_NORM] = kb_tensor_va(sp ? dec->ag2_in : dec->hn2);
    if ((rc = launch_timed(ctx, dec, ph, "dec_residual_attn", kb_decoder_rows_kernel, &a,
                           &pl->rows, 0)) != 0 ||
        (sp && (rc = coll_timed(ctx, dec, C_AG, dec->ag2, dec->ag2_in)) != 0))
        return rc;
    return 0;
}

/* 5. MLP into the MLP partials, summed over the PEs and ranks */
static int fwd_mlp(kb_ctx *ctx, kb_decoder *dec, phase *ph, int64_t flags)
{
    const kb_decoder_plan *pl = &dec->pl;
    int sp = dec->o.seq_parallel, rc;
    kb_kargs a;
    memset(&a, 0, sizeof a);
    a.i[MK_T] = pl->T;
    a.i[MK_D] = pl->d;
    a.i[MK_CF] = pl->cf;
    a.i[MK_TB] = pl->tb;
    a.i[MK_FLAGS] = flags;
    a.i[MK_ACT] = kb_model_act(&dec->mc);
    a.ptr[MP_IN] = kb_tensor_va(sp ? dec->ag2 : dec->hn2);
    wptrs(&dec->wg, &a.ptr[MP_WG]);
    wptrs(&dec->wu, &a.ptr[MP_WU]);
    wptrs(&dec->wd, &a.ptr[MP_WD]);
    a.ptr[MP_PART] = kb_tensor_va(dec->pd);
    if ((rc = launch_timed(ctx, dec, ph, "dec_mlp", kb_decoder_mlp_kernel, &a, &pl->mlp, 1)) != 0 ||
        (rc = coll_timed(ctx, dec, sp ? C_RS : C_AR, dec->rs_d, dec->pd)) != 0)
        return rc;
    return 0;
}

/* 6. residual */
static int fwd_residual_mlp(kb_ctx *ctx, kb_decoder *dec, phase *ph, const kb_kargs *ra)
{
    int sp = dec->o.seq_parallel;
    kb_kargs a = *ra;
    a.i[RK_MODE] = 2;
    a.ptr[RP_X] = kb_tensor_va(dec->h);
    a.ptr[RP_LNA] = dec->ln[3] ? kb_tensor_va(dec->ln[3]) : 0;
    a.ptr[RP_SUM] = kb_tensor_va(sp ? dec->rs_d : dec->pd);
    a.ptr[RP_OUT] = kb_tensor_va(dec->y);
    return launch_timed(ctx, dec, ph, "dec_residual_mlp", kb_decoder_rows_kernel, &a,
                        &dec->pl.rows, 0);
}

int kb_decoder_forward(kb_ctx *ctx, kb_decoder *dec)
{
    kb_machine *m = kb_ctx_machine(ctx);
    const kb_decoder_opts *o = &dec->o;
    int sp = o->seq_parallel, rc = 0;
    int64_t flags = FLAGS(o->fmt, o->sparse, dec->act);
    phase ph;
    memset(&dec->st, 0, sizeof dec->st);
    ph.busy0 = calloc(2 * (size_t)m->ncubes * (size_t)m->npes, sizeof(kb_time));
    if (!ph.busy0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");

    kb_kargs ra = rows_args(dec);
    if ((rc = fwd_norm_in(ctx, dec, &ph, &ra)) != 0 ||
        (rc = fwd_qkv(ctx, dec, &ph, flags)) != 0 ||
        (rc = o->decode ? fwd_attn_decode(ctx, dec, &ph, flags)
                        : fwd_attn_prefill(ctx, dec, &ph, flags)) != 0 ||
        /* the attention partials summed over the PEs and ranks */
        (rc = coll_timed(ctx, dec, sp ? C_RS : C_AR, dec->rs_o, dec->po)) != 0 ||
        (rc = fwd_residual_attn(ctx, dec, &ph, &ra)) != 0 ||
        (rc = fwd_mlp(ctx, dec, &ph, flags)) != 0)
        goto out;
    rc = fwd_residual_mlp(ctx, dec, &ph, &ra);
    dec->st.proj_gemm_closed_ns = proj_closed(ctx, dec);
out:
    free(ph.busy0);
    return rc;
}
