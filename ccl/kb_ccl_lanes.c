/*
 * kb_ccl_lanes — rank = SIP collectives in lanes (kb_ccl_lanes.h): the tensors, the install
 * plan of one topology per lane, the wrapper kernel that runs the rank = PE kernel on its lane,
 * and the read-back into every rank's logical buffer.
 */
#include "kb_ccl_lanes.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_runtime_ext.h"

/* the wrapper's own argument: the job (host memory that outlives the launch) */
enum { KB_LN_JOB = KB_KARGS_MAX - 1 };

int64_t kb_ccl_lane_share(int64_t count, int lanes, int l, int64_t *off)
{
    int64_t q = count / lanes, rem = count % lanes;
    assert(lanes >= 1 && l >= 0 && l < lanes);
    if (off)
        *off = (int64_t)l * q + (l < rem ? l : rem);
    return q + (l < rem ? 1 : 0);
}

/* Lanes that hold at least one element (they come first, among the channels). */
static int lanes_used(const kb_ccl_lanes *job)
{
    return job->count < job->channels ? (int)job->count : job->channels;
}

/* Lane l's share of the count (kb_ccl_lane_share over the channels; 0 past them). */
static int64_t lane_share(const kb_ccl_lanes *job, int l, int64_t *off)
{
    if (l >= job->channels) {
        if (off)
            *off = job->count;
        return 0;
    }
    return kb_ccl_lane_share(job->count, job->channels, l, off);
}

/* Rank s's lanes: row l, element e of the lane's tile = element j * count + off_l + k of the
 * rank's logical buffer (chunk j = e / share_l, k = e mod share_l); past the tile, zeros. */
typedef struct lanes_src {
    const kb_ccl_lanes *job;
    int sip;
} lanes_src;

static void lanes_fill(void *ud, int64_t row, int64_t col, int64_t rows, int64_t cols,
                       float *out)
{
    const lanes_src *ls = ud;
    const kb_ccl_lanes *job = ls->job;
    int64_t total = job->count * job->chunks;

    for (int64_t k = 0; k < rows; k++) {
        int64_t off, share = lane_share(job, (int)(row + k), &off);
        int64_t tile = share * job->chunks;
        float *o = out + k * cols;
        for (int64_t e = col; e < col + cols;) {
            if (e >= tile) {
                memset(o + (e - col), 0, sizeof(float) * (size_t)(col + cols - e));
                break;
            }
            int64_t j = e / share, in = e % share, len = share - in;
            if (len > col + cols - e)
                len = col + cols - e;
            kb_ccl_input_op_span(o + (e - col), KB_CCL_INPUT_SEED, job->op, job->dtype, job->ws,
                                 ls->sip, j * job->count + off + in, len, total);
            e += len;
        }
    }
}

/* One topology per used lane: lane l's rank r is PE l of SIP r. */
static int lanes_install(kb_ctx *ctx, const kb_ccl_lanes *job)
{
    kb_errbuf *eb = kb_ctx_err(ctx);
    kb_machine *m = kb_ctx_machine(ctx);
    kb_ccl_geom g = { 1, 1, job->root, 0 };
    int used = lanes_used(job), ws = job->ws;
    int ndirs = kb_topo_ndirs(job->topo, ws), np = ndirs - KB_NDIRS;
    int *nbr = malloc(2 * (size_t)ndirs * sizeof *nbr), *pnbr = nbr ? nbr + ndirs : NULL;
    char lbl[KB_DIR_LABEL_LEN];
    size_t n = 0, cap = (size_t)used * (size_t)ws * 2u;
    kb_ipcq_link *links = malloc((cap ? cap : 1) * sizeof *links);
    int rc = 0;

    if (!links || !nbr) {
        free(links);
        free(nbr);
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    }
    /* a full mesh among the SIPs: each lane PE holds ws - 1 rings */
    if (np > 0 && used > 0)
        rc = kb_ipcq_check_fit(ctx, &job->icfg, kb_machine_pe(m, 0, 0, 0), np);
    for (int r = 0; r < ws && rc == 0; r++) {
        if ((rc = kb_topo_neighbors_n(job->topo, ws, r, &g, nbr, ndirs, eb)) != 0)
            break;
        for (int d = 0; d < ndirs && rc == 0; d++) {
            if (nbr[d] == KB_TOPO_NONE)
                continue;
            if ((rc = kb_topo_neighbors_n(job->topo, ws, nbr[d], &g, pnbr, ndirs, eb)) != 0)
                break;
            int rd = kb_topo_reverse_n(pnbr, ndirs, r, (kb_dir)d);
            if (rd < 0) {
                rc = kb_err_set(eb, KB_ERR_CONFIG, "topology %s: SIP rank %d's %s points at "
                                "rank %d, which has no direction back", job->topo, r,
                                kb_dir_label((kb_dir)d, lbl, sizeof lbl), nbr[d]);
                break;
            }
            for (int l = 0; l < used; l++) {
                if (n == cap) {
                    kb_ipcq_link *nl = realloc(links, cap * 2 * sizeof *nl);
                    if (!nl) {
                        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
                        break;
                    }
                    links = nl;
                    cap *= 2;
                }
                unsigned cube = (unsigned)(l / m->npes), pe = (unsigned)(l % m->npes);
                links[n].pe = kb_machine_pe(m, (unsigned)r, cube, pe);
                links[n].dir = (kb_dir)d;
                links[n].peer = kb_machine_pe(m, (unsigned)nbr[d], cube, pe);
                links[n].peer_dir = (kb_dir)rd;
                n++;
            }
        }
    }
    if (rc == 0)
        rc = kb_ipcq_install(ctx, &job->icfg, links, n);
    free(links);
    free(nbr);
    return rc;
}

int kb_ccl_lanes_prepare(kb_ctx *ctx, kb_ccl_lanes *job, const kb_ccl_algo_impl *impl,
                         const char *name, const char *topo, int64_t count, int channels,
                         const kb_ccl_job_opts *o, const kb_ipcq_cfg *icfg)
{
    kb_machine *m = kb_ctx_machine(ctx);
    kb_errbuf *eb = kb_ctx_err(ctx);
    int rc;

    memset(job, 0, sizeof *job);
    job->impl = impl;
    snprintf(job->name, sizeof job->name, "%s", name);
    snprintf(job->topo, sizeof job->topo, "%s", topo);
    job->ws = m->nsips;
    job->lanes = m->npes * m->ncubes;
    job->channels = channels > 0 ? channels : job->lanes;
    job->chunks = kb_coll_tile_ranks(impl->kind, job->ws);
    job->root = o->root;
    job->op = o->op;
    job->dtype = o->dtype;
    job->count = count;
    job->icfg = *icfg;
    if ((rc = kb_ccl_job_check_opts(impl, name, o, job->ws, eb)) != 0)
        return rc;
    if (job->ws > KB_MAX_GSIPS)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: %d SIPs, at most %d", name, job->ws,
                          KB_MAX_GSIPS);
    if (job->channels > job->lanes)
        return kb_err_set(eb, KB_ERR_CONFIG, "%s: channels = %d but a SIP has %d PEs", name,
                          job->channels, job->lanes);
    if (count < 1 || count > UINT32_MAX / 4 / job->chunks)
        return kb_err_set(eb, KB_ERR_RANGE, "%s: count %lld out of range", name,
                          (long long)count);
    /* the algorithm's own rule, for the longest and the shortest lane that runs */
    kb_ccl_geom g = { 1, 1, o->root, 0 };
    int64_t hi = lane_share(job, 0, NULL);
    int64_t lo = lane_share(job, lanes_used(job) - 1, NULL);
    if (impl->check && ((rc = impl->check(job->ws, hi * job->chunks, &g, eb)) != 0 ||
                        (rc = impl->check(job->ws, lo * job->chunks, &g, eb)) != 0))
        return rc;
    job->width = hi * job->chunks;

    lanes_src ls = { job, 0 };
    kb_fill fill = { lanes_fill, &ls, NULL, 0, 0, 0, NULL };
    for (int s = 0; s < job->ws && rc == 0; s++) {
        kb_tensor_desc d = { "lanes", job->lanes, job->width, o->dtype,
                             kb_dp(KB_DP_ROW_WISE, KB_DP_ROW_WISE, m->ncubes, m->npes),
                             KB_MEM_HBM };
        ls.sip = s;
        if ((rc = kb_ctx_set_device(ctx, s)) == 0)
            rc = kb_tensor_from_fill(ctx, &d, &fill, &job->t[s]);
        /* one row per PE, on that PE: the lane's tile is where the wrapper looks for it */
        for (size_t i = 0; rc == 0 && i < kb_tensor_nshards(job->t[s]); i++) {
            const kb_shard_spec *sh = kb_tensor_shard(job->t[s], i);
            if (sh->nbytes != (uint64_t)job->width * kb_dtype_size(o->dtype) ||
                (int)sh->sip != s)
                rc = kb_err_set(eb, KB_ERR_STATE, "lanes: shard %zu of SIP %d is not one lane's "
                                "row", i, s);
        }
    }
    if (rc == 0)
        rc = kb_ctx_set_device(ctx, 0);
    if (rc == 0)
        rc = lanes_install(ctx, job);
    return rc;
}

/* Runs the algorithm's kernel as rank `SIP` of a world of ws ranks on this PE's lane. */
static void lane_kernel(kb_tl *tl, const kb_kargs *a)
{
    const kb_ccl_lanes *job = (const kb_ccl_lanes *)(uintptr_t)a->i[KB_LN_JOB];
    int l = tl_program_id(tl, 1) * tl_num_programs(tl, 0) + tl_program_id(tl, 0);
    int64_t share = lane_share(job, l, NULL);
    int pid[3] = { 0, 0, tl_program_id(tl, 2) }, np[3] = { 1, 1, job->ws }, opid[3], onp[3];
    kb_kargs b;

    if (share == 0)
        return;
    /* lane l's row of the SIP's tensor holds its tile: lane 0 has the longest share */
    assert(l < job->lanes && share * job->chunks <= job->width);
    memset(&b, 0, sizeof b);
    b.ptr[KB_CCL_PTR_TILE] = a->ptr[KB_CCL_PTR_TILE] +
                             (kb_va)l * (kb_va)job->width * (kb_va)kb_dtype_size(job->dtype);
    b.i[KB_CCL_ARG_N] = share * job->chunks;
    b.i[KB_CCL_ARG_WS] = job->ws;
    b.i[KB_CCL_ARG_PES] = 1;
    b.i[KB_CCL_ARG_CUBES] = 1;
    b.i[KB_CCL_ARG_SIPS] = job->ws;
    b.i[KB_CCL_ARG_DTYPE] = job->dtype;
    b.i[KB_CCL_ARG_ROOT] = job->root;
    b.i[KB_CCL_ARG_OP] = job->op;
    kb_tl_view(tl, pid, np, opid, onp);
    job->impl->kernel(tl, &b);
    kb_tl_view(tl, opid, onp, NULL, NULL);
}

int kb_ccl_lanes_launch(kb_ctx *ctx, kb_ccl_lanes *job)
{
    kb_machine *m = kb_ctx_machine(ctx);
    kb_grid g = { m->npes, m->ncubes, job->ws, 0 };
    assert(job->ws <= KB_MAX_GSIPS); /* kb_ccl_lanes_prepare */
    memset(job->args, 0, sizeof job->args);
    for (int s = 0; s < job->ws; s++) {
        job->args[s].ptr[KB_CCL_PTR_TILE] = kb_tensor_va(job->t[s]);
        job->args[s].i[KB_LN_JOB] = (int64_t)(uintptr_t)job;
    }
    return kb_launch_per_sip(ctx, job->name, lane_kernel, job->args, &g);
}

int kb_ccl_lanes_read_raw(kb_ctx *ctx, kb_ccl_lanes *job, void *raw)
{
    size_t es = kb_dtype_size(job->dtype);
    size_t row = (size_t)job->width * es, per = (size_t)job->chunks * (size_t)job->count * es;
    unsigned char *buf = malloc((size_t)job->lanes * row), *dst = raw;
    int rc = 0;

    if (!buf)
        return kb_err_set(kb_ctx_err(ctx), KB_ERR_NOMEM, "out of memory");
    for (int s = 0; s < job->ws && rc == 0; s++) {
        if ((rc = kb_tensor_read_raw(job->t[s], buf)) != 0)
            break;
        for (int l = 0; l < lanes_used(job); l++) {
            int64_t off, share = lane_share(job, l, &off);
            assert(off + share <= job->count); /* the lane's slice of every chunk */
            for (int j = 0; j < job->chunks; j++)
                memcpy(dst + (size_t)s * per + ((size_t)j * (size_t)job->count + (size_t)off) * es,
                       buf + (size_t)l * row + (size_t)j * (size_t)share * es, (size_t)share * es);
        }
    }
    free(buf);
    return rc;
}

int kb_ccl_lanes_verify_ordered(const kb_ccl_lanes *job, const void *raw, double acc_bound,
                                kb_ccl_verdict *v)
{
    int ws = job->ws, used = lanes_used(job), rc = 1;
    int64_t total = job->chunks * job->count, hi = lane_share(job, 0, NULL);
    size_t es = kb_dtype_size(job->dtype), cap = (size_t)ws * (size_t)(hi * job->chunks);
    float *in = malloc(cap * sizeof *in), *rel = malloc(cap * sizeof *rel);
    double *out = malloc(cap * sizeof *out), *want = malloc(cap * sizeof *want);
    unsigned char *lane = malloc(cap * es), *bad = calloc((size_t)ws, 1);
    double got_sum = 0.0, want_sum = 0.0, cnt = 0.0;

    memset(v, 0, sizeof *v);
    v->ntiles = ws;
    v->first_bad_tile = -1;
    if (!in || !rel || !out || !want || !lane || !bad) {
        rc = KB_ERR_NOMEM;
        goto out;
    }
    for (int l = 0; l < used; l++) {
        int64_t off, share = lane_share(job, l, &off);
        int64_t nl = share * job->chunks;
        kb_ccl_verdict lv;
        assert(nl <= hi * job->chunks); /* the buffers are sized for the longest lane */
        for (int r = 0; r < ws; r++)
            for (int j = 0; j < job->chunks; j++) {
                size_t at = (size_t)r * (size_t)nl + (size_t)(j * share);
                size_t lg = (size_t)r * (size_t)total + (size_t)(j * job->count + off);
                kb_ccl_input_op_span(in + at, KB_CCL_INPUT_SEED, job->op, job->dtype, ws, r,
                                     j * job->count + off, share, total);
                memcpy(lane + at * es, (const unsigned char *)raw + lg * es, (size_t)share * es);
            }
        /* a root relabels the ranks: the reference runs rooted at its rank 0 */
        for (int t = 0; t < ws; t++)
            memcpy(rel + (size_t)t * (size_t)nl, in + (size_t)((t + job->root) % ws) * (size_t)nl,
                   (size_t)nl * sizeof *rel);
        job->impl->ordered(rel, ws, nl, 0, nl, job->dtype, job->op, out);
        for (int r = 0; r < ws; r++)
            memcpy(want + (size_t)r * (size_t)nl,
                   out + (size_t)((r - job->root + ws) % ws) * (size_t)nl,
                   (size_t)nl * sizeof *want);
        if (kb_ccl_verify(job->dtype, lane, want, ws, nl, acc_bound, &lv) != 1 &&
            lv.first_bad_tile >= 0) {
            /* lv only names its first bad rank: recheck the others to know which failed */
            for (int r = 0; r < ws; r++) {
                kb_ccl_verdict one;
                if (kb_ccl_verify(job->dtype, lane + (size_t)r * (size_t)nl * es,
                                  want + (size_t)r * (size_t)nl, 1, nl, acc_bound, &one) != 1)
                    bad[r] = 1;
            }
            if (v->first_bad_tile < 0 || lv.first_bad_tile < v->first_bad_tile) {
                int64_t e = lv.first_bad_elem;
                v->first_bad_tile = lv.first_bad_tile;
                v->first_bad_elem = e / share * job->count + off + e % share;
                v->first_got = lv.first_got;
                v->first_want = lv.first_want;
            }
        }
        if (lv.max_abs_err > v->max_abs_err) {
            v->max_abs_err = lv.max_abs_err;
            v->err_bound = lv.err_bound;
        }
        if (lv.err_bound > v->err_bound && lv.max_abs_err >= v->max_abs_err)
            v->err_bound = lv.err_bound;
        v->nwrong += lv.nwrong;
        got_sum += lv.got_mean * (double)ws * (double)nl;
        want_sum += lv.want_mean * (double)ws * (double)nl;
        cnt += (double)ws * (double)nl;
    }
    for (int r = 0; r < ws; r++)
        v->ok_tiles += !bad[r];
    v->got_mean = cnt > 0 ? got_sum / cnt : 0.0;
    v->want_mean = cnt > 0 ? want_sum / cnt : 0.0;
    rc = v->ok_tiles == ws;
out:
    free(in);
    free(rel);
    free(out);
    free(want);
    free(lane);
    free(bad);
    return rc;
}
