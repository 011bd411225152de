/*
 * kb_decoder_fwd — the decoder layer's forward pass on a TP rank (part of the decoder,
 * kb_decoder.h; shared names in kb_decoder_int.h): the launches of its kernels in order (input
 * norm, QKV + RoPE, attention with its W_o rows, residual + norms, MLP, residual), the
 * collectives between them (all_reduce of the partials, or with seq_parallel reduce_scatter
 * and all_gather), and the time split of the rank's critical path into compute (the busiest
 * PE's PE_GEMM + PE_MATH time of each launch), memory (the rest of its kernels' span), the
 * launches' command path (the rest of the launch) and communication, with the projection
 * gemms' PE_GEMM time measured and in closed form. Mapping machine gathers the kernels and
 * the lane all-reduces into one launch (kb_launch_seq; a process-group collective ends
 * one), unless asked for a launch per kernel.
 * Limits: one forward per kb_decoder (the partial blocks are zeroed once at creation).
 */
#include "kb_decoder_int.h"

#include <assert.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "kb_dist.h"
#include "kb_machine.h"
#include "kb_runtime_ext.h"

/* Kernels (and lane all-reduces) that run as one launch (kb_launch_seq) until a collective
 * of the process group or the layer's end: the stages so far, their names joined, which of
 * them are projections and which all-reduces. */
#define FUSE_MAX 12
typedef struct phase {
    kb_time t0;
    kb_time *busy0;   /* per PE of the rank's SIP: PE_GEMM + PE_MATH busy */
    kb_time gemm0;    /* sum of PE_GEMM busy over the SIP */
    int fuse;         /* gather the launches between collectives into one */
    int nst;
    kb_stage st[FUSE_MAX];
    int proj[FUSE_MAX];
    int coll[FUSE_MAX]; /* a collective's stage (kb_dist_all_reduce_shards_stage) */
    char name[128];
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

/* One launch (a kernel, or with ph->fuse the stages gathered so far), timed: its busiest
 * PE's PE_GEMM + PE_MATH time is compute, the rest of its kernels' span memory, the rest of
 * the launch its command path; the projections' PE_GEMM time is summed apart. */
static int launch_timed_now(kb_ctx *ctx, kb_decoder *dec, phase *ph, const char *name,
                            kb_kernel_fn fn, const kb_kargs *a, const kb_dec_grid *g, int proj)
{
    kb_machine *m = kb_ctx_machine(ctx);
    int S = m->ncubes * m->npes, rc, nst = ph->nst;
    kb_time *now_busy = ph->busy0 + S, gemm1;
    kb_grid grid = { g ? g->pes : 0, g ? g->cubes : 0, 1, -1 };
    snap(ctx, ph->busy0, &ph->gemm0);
    ph->t0 = kb_sim_now(kb_ctx_sim(ctx));
    ph->nst = 0;
    if ((rc = nst ? kb_launch_seq(ctx, name, ph->st, nst, &grid)
                  : kb_launch(ctx, name, fn, a, &grid)) != 0)
        return rc;
    kb_time dt = kb_sim_now(kb_ctx_sim(ctx)) - ph->t0, cmax = 0, k0, k1;
    if ((rc = kb_launch_span(ctx, &k0, &k1)) != 0)
        return rc;
    /* the kernels run inside the launch: their span is what the command path leaves */
    assert(k0 >= ph->t0 && k1 >= k0 && k1 - k0 <= dt);
    kb_time span = k1 - k0;
    snap(ctx, now_busy, &gemm1);
    /* a resource's busy time only grows: the difference is this launch's share */
    assert(gemm1 >= ph->gemm0);
    for (int i = 0; i < S; i++)
        assert(now_busy[i] >= ph->busy0[i]);
    for (int i = 0; i < S; i++)
        if (now_busy[i] - ph->busy0[i] > cmax)
            cmax = now_busy[i] - ph->busy0[i];
    if (cmax > span)
        cmax = span;
    dec->st.compute_ns += kb_time_to_ns(cmax);
    dec->st.memory_ns += kb_time_to_ns(span - cmax);
    dec->st.launch_ns += kb_time_to_ns(dt - span);
    if (nst) { /* the projections' share and the collectives' time: their stages' own */
        for (int k = 0; k < nst; k++) {
            kb_stage_stats ss;
            if ((rc = kb_launch_stage_stats(ctx, k, &ss)) != 0)
                return rc;
            if (ph->proj[k])
                dec->st.proj_gemm_busy_ns += kb_time_to_ns(ss.gemm_busy);
            if (ph->coll[k]) { /* comm, not the kernels' compute or memory */
                kb_time c = ss.last - ss.first;
                kb_time mem = span - cmax;
                c = c > mem ? mem : c;
                dec->st.comm_ns += kb_time_to_ns(c);
                dec->st.memory_ns -= kb_time_to_ns(c);
            }
        }
    } else if (proj) {
        dec->st.proj_gemm_busy_ns += kb_time_to_ns(gemm1 - ph->gemm0);
    }
    return 0;
}

/* The stages gathered so far as one launch (none: nothing). */
static int fuse_flush(kb_ctx *ctx, kb_decoder *dec, phase *ph)
{
    if (!ph->nst)
        return 0;
    if (ph->nst == 1 && !ph->coll[0]) { /* alone: a launch of its own, under its own name */
        kb_stage st = ph->st[0];
        kb_dec_grid g = { .pes = st.pes, .cubes = st.cubes };
        ph->nst = 0;
        return launch_timed_now(ctx, dec, ph, ph->name, st.kernel, &st.args, &g, ph->proj[0]);
    }
    return launch_timed_now(ctx, dec, ph, ph->name, NULL, NULL, NULL, 0);
}

/* The next stage of the fused launch (st, its name a literal), the ones before it launched
 * first when the launch is full; short is its part of the launch's name. */
static int fuse_add(kb_ctx *ctx, kb_decoder *dec, phase *ph, const kb_stage *st,
                    const char *short_name, int proj, int coll)
{
    int rc;
    if (ph->nst == FUSE_MAX && (rc = fuse_flush(ctx, dec, ph)) != 0)
        return rc;
    if (!ph->nst)
        snprintf(ph->name, sizeof ph->name, "%s", st->name);
    else /* "dec_norm_in+qkv+...+ars+..." (cut at the buffer's end) */
        snprintf(ph->name + strlen(ph->name), sizeof ph->name - strlen(ph->name), "+%s",
                 short_name);
    ph->st[ph->nst] = *st;
    ph->coll[ph->nst] = coll;
    ph->proj[ph->nst++] = proj;
    return 0;
}

static int launch_timed(kb_ctx *ctx, kb_decoder *dec, phase *ph, const char *name,
                        kb_kernel_fn fn, const kb_kargs *a, const kb_dec_grid *g, int proj)
{
    if (!ph->fuse)
        return launch_timed_now(ctx, dec, ph, name, fn, a, g, proj);
    kb_stage st = { .kernel = fn, .args = *a, .pes = g->pes, .cubes = g->cubes, .name = name };
    return fuse_add(ctx, dec, ph, &st, strncmp(name, "dec_", 4) ? name : name + 4, proj, 0);
}

enum { C_AR, C_RS, C_AG, C_ARS };
static int coll_timed(kb_ctx *ctx, kb_decoder *dec, phase *ph, int kind, kb_tensor *out,
                      kb_tensor *in)
{
    int rc;
    if (ph->fuse && kind == C_ARS) { /* a stage of the fused launch */
        kb_stage st;
        if ((rc = kb_dist_all_reduce_shards_stage(ctx, in, &st)) != 0)
            return rc;
        st.name = "all_reduce_shards";
        return fuse_add(ctx, dec, ph, &st, "ars", 0, 1);
    }
    if ((rc = fuse_flush(ctx, dec, ph)) != 0) /* the kernels before it have run */
        return rc;
    kb_time t0 = kb_sim_now(kb_ctx_sim(ctx));
    rc = kind == C_AR    ? kb_dist_all_reduce(ctx, in, KB_DIST_SUM)
             : kind == C_ARS ? kb_dist_all_reduce_shards(ctx, in)
             : kind == C_RS  ? kb_dist_reduce_scatter(ctx, out, in)
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
    if (pl->machine) { /* every PE its group's rows, in row blocks */
        for (int64_t r0 = 0; r0 < pl->qtr; r0 += pl->tb) {
            uint64_t n = (uint64_t)(pl->qtr - r0 < pl->tb ? pl->qtr - r0 : pl->tb);
            t += pl->qkv.n * kb_decoder_gemm_closed_ns(c, f, sp, n, (uint64_t)pl->c, (uint64_t)pl->d);
        }
        for (int64_t r0 = 0; r0 < pl->mtr; r0 += pl->tb) {
            uint64_t n = (uint64_t)(pl->mtr - r0 < pl->tb ? pl->mtr - r0 : pl->tb);
            t += pl->mlp.n *
                 (2 * kb_decoder_gemm_closed_ns(c, f, sp, n, (uint64_t)pl->cf, (uint64_t)pl->d) +
                  kb_decoder_gemm_closed_ns(c, f, sp, n, (uint64_t)pl->d, (uint64_t)pl->cf));
        }
        return t;
    }
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
static kb_dec_wva wvas(const kb_qweight *w)
{
    return (kb_dec_wva){ .q = kb_tensor_va(w->q), .scale = w->scale ? kb_tensor_va(w->scale) : 0,
                         .meta = w->meta ? kb_tensor_va(w->meta) : 0 };
}

/* The row owners' arguments that their three launches share. */
static kb_dec_rows_args rows_args(const kb_decoder *dec)
{
    const kb_decoder_plan *pl = &dec->pl;
    return (kb_dec_rows_args){ .rc = pl->rc, .d = pl->d, .sp = dec->o.seq_parallel,
                               .piece = pl->piece, .post = dec->mc.post_norms, .T = pl->T,
                               .sblock = pl->machine ? 0 : pl->T, .cstride = 1,
                               .posted = pl->machine || pl->dmachine,
                               .act = dec->act, .eps = dec->mc.norm_eps,
                               .off = dec->mc.norm_unit_offset };
}

/* 1. input norm -> the QKV PEs' input */
static int fwd_norm_in(kb_ctx *ctx, kb_decoder *dec, phase *ph, const kb_dec_rows_args *ra)
{
    const kb_decoder_plan *pl = &dec->pl;
    int sp = dec->o.seq_parallel, rc;
    kb_dec_rows_args r = *ra;
    kb_kargs a;
    r.mode = 0;
    /* shared: one copy per cube of the QKV grid, its PEs reading it together */
    r.ncopy = pl->shared ? (pl->qkv.n + pl->qkv.pes - 1) / pl->qkv.pes : pl->qncol;
    r.cstride = pl->shared ? pl->qkv.pes : 1;
    r.tr = pl->qtr;
    r.x = kb_tensor_va(dec->x);
    r.lnb = kb_tensor_va(dec->ln[0]);
    r.norm = kb_tensor_va(sp ? dec->ag1_in : dec->hn1);
    memset(&a, 0, sizeof a);
    KB_KARGS_PUT(&a, r);
    if ((rc = launch_timed(ctx, dec, ph, "dec_norm_in", kb_decoder_rows_kernel, &a, &pl->rows,
                           0)) != 0 ||
        (sp && (rc = coll_timed(ctx, dec, ph, C_AG, dec->ag1, dec->ag1_in)) != 0))
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
    KB_KARGS_PUT(&a, (kb_dec_qkv_args){
        .T = pl->T, .d = pl->d, .c = pl->c, .p = pl->p, .nrope = pl->nq + pl->nkv,
        .hd = pl->hd, .tb = pl->tb, .flags = flags, .ncol = pl->qncol, .tr = pl->qtr,
        .shared = pl->shared ? pl->qkv.pes : 0,
        .rep = dec->kv_rep ? kb_tensor_va(dec->kv_rep) : 0, .rep_cubes = pl->att.cubes,
        .rep_rows = pl->rep_rows, .nq = pl->nq, .nkv = pl->nkv, .seq = dec->o.seq,
        .qb = pl->qb, .qrows = pl->qrows, .apes = pl->att.pes, .items = pl->items,
        .ocol = pl->ocol, .in = kb_tensor_va(sp ? dec->ag1 : dec->hn1), .w = wvas(&dec->wqkv),
        .cos = kb_tensor_va(dec->cosq), .sin = kb_tensor_va(dec->sinq),
        .out = kb_tensor_va(dec->qkv) });
    return launch_timed(ctx, dec, ph, "dec_qkv", kb_decoder_qkv_kernel, &a, &pl->qkv, 1);
}

/* 3. prefill attention (+ its W_o rows) into the attention partials */
static int fwd_attn_prefill(kb_ctx *ctx, kb_decoder *dec, phase *ph, int64_t flags)
{
    const kb_decoder_plan *pl = &dec->pl;
    kb_kargs a;
    memset(&a, 0, sizeof a);
    KB_KARGS_PUT(&a, (kb_dec_attn_args){
        .qscale = kb_model_qscale(&dec->mc), .softcap = dec->mc.attn_softcap,
        .seq = dec->o.seq, .qrows = pl->qrows, .qb = pl->qb, .nq = pl->nq, .nkv = pl->nkv,
        .p = pl->p, .c = pl->c, .hd = pl->hd, .T = pl->T, .d = pl->d, .flags = flags,
        .items = pl->items, .ncol = pl->qncol, .tr = pl->qtr, .own = pl->machine,
        .rep = dec->kv_rep ? kb_tensor_va(dec->kv_rep) : 0, .rep_rows = pl->rep_rows,
        .apes = pl->att.pes, .rc = pl->rc, .sum = dec->sum_o ? kb_tensor_va(dec->sum_o) : 0,
        .ocol = pl->ocol,
        .qkv = kb_tensor_va(dec->qkv), .wo = wvas(&dec->wo),
        .part = dec->po ? kb_tensor_va(dec->po) : 0 });
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
    KB_KARGS_PUT(&a, (kb_dec_dattn_args){
        .qscale = kb_model_qscale(&dec->mc), .softcap = dec->mc.attn_softcap,
        .chunks = pl->chunks, .clen = pl->clen, .kv_len = dec->o.kv_len, .nq = pl->nq,
        .nkv = pl->nkv, .p = pl->p, .c = pl->c, .hd = pl->hd, .T = pl->T, .flags = flags,
        .items = pl->items, .qkv = kb_tensor_va(dec->qkv), .kc = kb_tensor_va(dec->kc),
        .vc = kb_tensor_va(dec->vc), .out = kb_tensor_va(dec->dpart), .fast = pl->dmachine });
    if ((rc = launch_timed(ctx, dec, ph, "dec_attention_chunks", kb_decoder_dattn_kernel, &a,
                           &pl->att, 0)) != 0)
        return rc;
    memset(&a, 0, sizeof a);
    KB_KARGS_PUT(&a, (kb_dec_dcomb_args){
        .chunks = pl->chunks, .nq = pl->nq, .nkv = pl->nkv, .hd = pl->hd, .T = pl->T,
        .d = pl->d, .flags = flags, .items = pl->citems, .dpart = kb_tensor_va(dec->dpart),
        .fast = pl->dmachine, .ccol = pl->ccol,
        .sum = pl->dsum ? kb_tensor_va(dec->sum_o) : 0,
        .wo = wvas(&dec->wo), .part = kb_tensor_va(dec->po) });
    return launch_timed(ctx, dec, ph, "dec_attention_combine", kb_decoder_dcomb_kernel, &a,
                        &pl->comb, 0);
}

/* machine: the MLP PEs' partials summed inside the SIP into the row owners' blocks, then
 * over the SIPs lane by lane */
static int fwd_sum_mlp(kb_ctx *ctx, kb_decoder *dec, phase *ph)
{
    const kb_decoder_plan *pl = &dec->pl;
    int rc;
    kb_kargs a;
    memset(&a, 0, sizeof a);
    KB_KARGS_PUT(&a, (kb_dec_gsum_args){
        .src = kb_tensor_va(dec->pd), .out = kb_tensor_va(dec->sum_d), .rc = pl->rc,
        .d = pl->d, .ncol = pl->mncol, .tr = pl->mtr });
    if ((rc = launch_timed(ctx, dec, ph, "dec_sum_mlp", kb_decoder_gsum_kernel, &a, &pl->rows,
                           0)) != 0)
        return rc;
    return coll_timed(ctx, dec, ph, C_ARS, NULL, dec->sum_d);
}

/* 4. residual + norms -> the MLP PEs' input */
static int fwd_residual_attn(kb_ctx *ctx, kb_decoder *dec, phase *ph,
                             const kb_dec_rows_args *ra)
{
    const kb_decoder_plan *pl = &dec->pl;
    int sp = dec->o.seq_parallel, rc;
    kb_dec_rows_args r = *ra;
    kb_kargs a;
    r.mode = 1;
    r.ncopy = pl->shared ? (pl->mlp.n + pl->mlp.pes - 1) / pl->mlp.pes : pl->mncol;
    r.cstride = pl->shared ? pl->mlp.pes : 1;
    r.tr = pl->mtr;
    r.x = kb_tensor_va(dec->x);
    r.lna = dec->ln[1] ? kb_tensor_va(dec->ln[1]) : 0;
    r.lnb = kb_tensor_va(dec->ln[2]);
    r.sum = kb_tensor_va(sp ? dec->rs_o : pl->machine || pl->dsum ? dec->sum_o : dec->po);
    if (pl->dsum) /* the row owners' sum rows, not a block per PE */
        r.sblock = 0;
    r.out = kb_tensor_va(dec->h);
    r.norm = kb_tensor_va(sp ? dec->ag2_in : dec->hn2);
    memset(&a, 0, sizeof a);
    KB_KARGS_PUT(&a, r);
    if ((rc = launch_timed(ctx, dec, ph, "dec_residual_attn", kb_decoder_rows_kernel, &a,
                           &pl->rows, 0)) != 0 ||
        (sp && (rc = coll_timed(ctx, dec, ph, C_AG, dec->ag2, dec->ag2_in)) != 0))
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
    KB_KARGS_PUT(&a, (kb_dec_mlp_args){
        .T = pl->T, .d = pl->d, .cf = pl->cf, .tb = pl->tb, .flags = flags,
        .ncol = pl->mncol, .tr = pl->mtr, .shared = pl->shared ? pl->mlp.pes : 0,
        .act = kb_model_act(&dec->mc), .in = kb_tensor_va(sp ? dec->ag2 : dec->hn2),
        .wg = wvas(&dec->wg), .wu = wvas(&dec->wu), .wd = wvas(&dec->wd),
        .part = kb_tensor_va(dec->pd) });
    if ((rc = launch_timed(ctx, dec, ph, "dec_mlp", kb_decoder_mlp_kernel, &a, &pl->mlp, 1)) != 0)
        return rc;
    if (pl->machine || pl->dmsum)
        return fwd_sum_mlp(ctx, dec, ph);
    return coll_timed(ctx, dec, ph, sp ? C_RS : C_AR, dec->rs_d, dec->pd);
}

/* 6. residual */
static int fwd_residual_mlp(kb_ctx *ctx, kb_decoder *dec, phase *ph, const kb_dec_rows_args *ra)
{
    int sp = dec->o.seq_parallel;
    kb_dec_rows_args r = *ra;
    kb_kargs a;
    r.mode = 2;
    r.x = kb_tensor_va(dec->h);
    r.lna = dec->ln[3] ? kb_tensor_va(dec->ln[3]) : 0;
    r.sum = kb_tensor_va(sp ? dec->rs_d : dec->pl.machine || dec->pl.dmsum ? dec->sum_d : dec->pd);
    if (dec->pl.dmsum) /* the row owners' sum rows, not a block per PE */
        r.sblock = 0;
    r.out = kb_tensor_va(dec->y);
    memset(&a, 0, sizeof a);
    KB_KARGS_PUT(&a, r);
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
    /* machine's kernels stream their gemms with two tile loads in flight per DMA channel, one
     * transferring while the next one's HBM access is under way (a decode PE's weight tiles
     * of 8 KiB move in 64 ns against 120 of setup and latency), as many as SchedulerV2 keeps;
     * naive keeps its double buffering. Their small stores go posted (F_POSTED). */
    if (dec->pl.machine || dec->pl.dmachine) {
        int st = 2 * m->cfg.dma_channels;
        flags |= (int64_t)(st < 2 ? 2 : st > KB_TL_MAX_STAGES ? KB_TL_MAX_STAGES : st) << 24 |
                 F_POSTED;
    }
    memset(&dec->st, 0, sizeof dec->st);
    ph.busy0 = calloc(2 * (size_t)m->ncubes * (size_t)m->npes, sizeof(kb_time));
    if (!ph.busy0)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");

    kb_dec_rows_args ra = rows_args(dec);
    /* machine: the layer's launches queued on the device, back to back, the host told once
     * at the end (kb_launch_queue); naive: a host round trip per launch */
    int queued = dec->pl.machine || dec->pl.dmachine;
    /* and the kernels and lane all-reduces one launch, a barrier between them
     * (kb_launch_seq), unless asked for a launch per kernel */
    ph.fuse = queued && !o->launch_per_kernel;
    ph.nst = 0;
    if ((queued && (rc = kb_launch_queue(ctx, 1)) != 0) ||
        (rc = fwd_norm_in(ctx, dec, &ph, &ra)) != 0 ||
        (rc = fwd_qkv(ctx, dec, &ph, flags)) != 0 ||
        (rc = o->decode ? fwd_attn_decode(ctx, dec, &ph, flags)
                        : fwd_attn_prefill(ctx, dec, &ph, flags)) != 0 ||
        /* the attention partials summed over the PEs and ranks */
        (rc = dec->pl.machine || dec->pl.dsum ? coll_timed(ctx, dec, &ph, C_ARS, NULL, dec->sum_o)
                              : coll_timed(ctx, dec, &ph, sp ? C_RS : C_AR, dec->rs_o, dec->po)) != 0 ||
        (rc = fwd_residual_attn(ctx, dec, &ph, &ra)) != 0 ||
        (rc = fwd_mlp(ctx, dec, &ph, flags)) != 0)
        goto out;
    if ((rc = fwd_residual_mlp(ctx, dec, &ph, &ra)) != 0 || (rc = fuse_flush(ctx, dec, &ph)) != 0)
        goto out;
    dec->st.proj_gemm_closed_ns = proj_closed(ctx, dec);
out:
    if (queued) { /* off on every path: the host's later writes and reads need it */
        kb_time t_up = kb_sim_now(kb_ctx_sim(ctx));
        int rq = kb_launch_queue(ctx, 0);
        dec->st.launch_ns += kb_time_to_ns(kb_sim_now(kb_ctx_sim(ctx)) - t_up);
        rc = rc ? rc : rq;
    }
    free(ph.busy0);
    return rc;
}
