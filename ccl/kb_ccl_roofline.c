/*
 * kb_ccl_roofline — a collective's lower bound from its kind and its ranks' PEs
 * (kb_ccl_roofline.h lists what each kind must move; docs/decoder.md derives it).
 */
#include "kb_ccl_roofline.h"

#include <stdlib.h>
#include <string.h>

/* HBM bytes rank r must read from and write to its tile. */
static void tile_bytes(kb_coll_kind k, int n, int r, int root, double b, double *rd,
                       double *wr)
{
    switch (k) {
    case KB_COLL_ALLGATHER:
        *rd = b, *wr = (n - 1) * b;
        break;
    case KB_COLL_REDUCE_SCATTER:
        *rd = n * b, *wr = b;
        break;
    case KB_COLL_ALLTOALL:
        *rd = *wr = (n - 1) * b;
        break;
    case KB_COLL_BROADCAST:
        *rd = r == root ? b : 0.0, *wr = r == root ? 0.0 : b;
        break;
    case KB_COLL_REDUCE:
        *rd = b, *wr = r == root ? b : 0.0;
        break;
    default: /* all_reduce, sendrecv */
        *rd = *wr = b;
        break;
    }
}

/* Bytes that must cross the edge of a group of k of the n ranks (0 < k < n); for sendrecv,
 * out and in count its ranks whose next / previous rank is elsewhere. */
static double cut_bytes(kb_coll_kind kind, int n, int k, int out, int in, double b)
{
    switch (kind) {
    case KB_COLL_ALLGATHER:
    case KB_COLL_REDUCE_SCATTER:
        return (k > n - k ? k : n - k) * b;
    case KB_COLL_ALLTOALL:
        return (double)k * (n - k) * b;
    case KB_COLL_SENDRECV:
        return (out > in ? out : in) * b;
    default: /* all_reduce, broadcast, reduce */
        return b;
    }
}

/* Bytes that must cross the level in all, given the groups' sum of cuts `sum_cut`. */
static double total_bytes(kb_coll_kind kind, int n, int groups, double sum_cut, double b)
{
    switch (kind) {
    case KB_COLL_ALLREDUCE:
        return 2.0 * (groups - 1) * b;
    case KB_COLL_ALLGATHER:
    case KB_COLL_REDUCE_SCATTER:
        return (double)n * (groups - 1) * b;
    case KB_COLL_BROADCAST:
    case KB_COLL_REDUCE:
        return (groups - 1) * b;
    default: /* all_to_all, sendrecv: every cut is its own traffic */
        return sum_cut;
    }
}

static int cmp_int(const void *x, const void *y)
{
    int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

/* The farthest two of the ranks' groups at a level, rep[0..n) one PE per group in increasing
 * order: at the cube level pairs within a SIP directly (the PE level: within a cube; the
 * level does not separate other pairs) and, across SIPs, through both gateway cubes: the two
 * largest distances to cube 0 in different SIPs. */
static int diameter(const kb_machine *m, int level, int n, const int *rep)
{
    int best = 0, per_sip = m->ncubes * m->npes, top[2] = { 0, 0 }, top_sip = -1, nsip = 0;
    for (int i = 0; i < n; i++) {
        int si = rep[i] / per_sip;
        for (int j = i + 1; j < n; j++) {
            if (level == KB_ROOF_CUBE && rep[j] / per_sip != si)
                break;
            if (level == KB_ROOF_PE && rep[j] / m->npes != rep[i] / m->npes)
                break;
            int h = kb_roofline_hops(m, level, rep[i], rep[j]);
            best = h > best ? h : best;
        }
        if (level != KB_ROOF_CUBE)
            continue;
        int h0 = kb_machine_cube_hops(m, (unsigned)(rep[i] / m->npes % m->ncubes), 0);
        if (i == 0 || rep[i - 1] / per_sip != si)
            nsip++;
        if (si == top_sip) {
            top[0] = h0 > top[0] ? h0 : top[0];
        } else if (top_sip < 0 || h0 > top[0]) {
            top[1] = top[0];
            top[0] = h0;
            top_sip = si;
        } else if (h0 > top[1]) {
            top[1] = h0;
        }
    }
    if (nsip > 1 && top[0] + top[1] > best)
        best = top[0] + top[1];
    return best;
}

/* The hops a kind's data must travel at a level: between the farthest ranks, or from / to
 * the root, or between neighbours. */
static int depth_hops(const kb_machine *m, int level, kb_coll_kind kind, int n, const int *gid,
                      int root, int *scratch)
{
    int best = 0, nrep = 0;
    if (kind == KB_COLL_BROADCAST || kind == KB_COLL_REDUCE || kind == KB_COLL_SENDRECV) {
        for (int r = 0; r < n; r++) {
            int h = kind == KB_COLL_SENDRECV
                        ? kb_roofline_hops(m, level, gid[r], gid[(r + 1) % n])
                        : kb_roofline_hops(m, level, gid[root], gid[r]);
            best = h > best ? h : best;
        }
        return best;
    }
    /* one PE per group of the level, in order: the pairs are then few */
    memcpy(scratch, gid, sizeof *gid * (size_t)n);
    qsort(scratch, (size_t)n, sizeof *scratch, cmp_int);
    for (int r = 0; r < n; r++)
        if (!nrep || kb_roofline_group(m, level, scratch[r]) !=
                         kb_roofline_group(m, level, scratch[nrep - 1]))
            scratch[nrep++] = scratch[r];
    return diameter(m, level, nrep, scratch);
}

/* One level: the ranks' groups, their cuts, the total and the depth. cnt, nout, nin: zeroed
 * per-group scratch of the level's size; list: room for n groups. */
static void add_level(kb_roofline_acc *a, int level, kb_coll_kind kind, int n, const int *gid,
                      int root, double b, int step, int *cnt, int *nout, int *nin, int *list,
                      int *scratch)
{
    const kb_machine *m = kb_roofline_machine(a);
    int ng = 0;
    double sum = 0.0;
    for (int r = 0; r < n; r++) {
        int g = kb_roofline_group(m, level, gid[r]);
        if (!cnt[g]++)
            list[ng++] = g;
        if (kind == KB_COLL_SENDRECV) {
            nout[g] += kb_roofline_group(m, level, gid[(r + 1) % n]) != g;
            nin[g] += kb_roofline_group(m, level, gid[(r + n - 1) % n]) != g;
        }
    }
    if (ng > 1) {
        for (int i = 0; i < ng; i++) {
            int g = list[i];
            double c = cut_bytes(kind, n, cnt[g], nout[g], nin[g], b);
            kb_roofline_use(a, level, g);
            kb_roofline_cut(a, level, g, c);
            sum += c;
        }
        kb_roofline_total(a, level, total_bytes(kind, n, ng, sum, b));
        kb_roofline_depth(a, level, step, depth_hops(m, level, kind, n, gid, root, scratch));
    }
    for (int i = 0; i < ng; i++)
        cnt[list[i]] = nout[list[i]] = nin[list[i]] = 0;
}

int kb_ccl_roofline_add(kb_roofline_acc *a, kb_coll_kind kind, int n, const int *gid, int root,
                        double bytes, int step, kb_errbuf *eb)
{
    const kb_machine *m = kb_roofline_machine(a);
    int np = kb_roofline_ngroups(m, KB_ROOF_PE), rc = 0;
    int *cnt = NULL, *nout = NULL, *nin = NULL, *list = NULL, *scratch = NULL;

    if ((unsigned)kind >= KB_COLL_NKINDS || n < 0 || (kb_coll_rooted(kind) && (root < 0 ||
                                                                              root >= n)))
        return kb_err_set(eb, KB_ERR_INVAL, "roofline: collective %d of %d ranks, root %d",
                          (int)kind, n, root);
    if (n < 2 || bytes <= 0.0)
        return 0; /* nothing has to move */
    for (int r = 0; r < n; r++) {
        double rd, wr;
        if (gid[r] < 0 || gid[r] >= np)
            return kb_err_set(eb, KB_ERR_INVAL, "roofline: rank %d on PE %d of %d", r, gid[r],
                              np);
        tile_bytes(kind, n, r, root, bytes, &rd, &wr);
        kb_roofline_mem_pe(a, gid[r], rd, wr);
    }
    cnt = calloc((size_t)np, sizeof *cnt);
    nout = calloc((size_t)np, sizeof *nout);
    nin = calloc((size_t)np, sizeof *nin);
    list = malloc(sizeof *list * (size_t)n);
    scratch = malloc(sizeof *scratch * (size_t)n);
    if (!cnt || !nout || !nin || !list || !scratch) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "roofline: out of memory for %d ranks", n);
        goto out;
    }
    for (int l = 0; l < KB_ROOF_NLEVELS; l++)
        if (kb_roofline_level_modelled(m, l))
            add_level(a, l, kind, n, gid, root, bytes, step, cnt, nout, nin, list, scratch);
out:
    free(scratch);
    free(cnt);
    free(nout);
    free(nin);
    free(list);
    return rc;
}

int kb_ccl_roofline_job(kb_roofline_acc *a, const kb_ccl_job *job, kb_errbuf *eb)
{
    const kb_machine *m = kb_roofline_machine(a);
    int ws = job->layout.ws, rc;
    int *gid = malloc(sizeof *gid * (size_t)(ws > 0 ? ws : 1));
    if (!gid)
        return kb_err_set(eb, KB_ERR_NOMEM, "roofline: out of memory for %d ranks", ws);
    for (int r = 0; r < ws; r++)
        gid[r] = (int)kb_ccl_rank_pe(m, &job->layout, r)->gid;
    rc = kb_ccl_roofline_add(a, job->impl->kind, ws, gid, job->layout.root,
                             (double)(job->n / kb_coll_tile_ranks(job->impl->kind, ws)) *
                                 (double)kb_dtype_size(job->dtype),
                             0, eb);
    free(gid);
    return rc;
}

int kb_ccl_roofline_lanes(kb_roofline_acc *a, const kb_ccl_lanes *job, kb_errbuf *eb)
{
    int *gid = malloc(sizeof *gid * (size_t)job->ws), rc = 0;
    if (!gid)
        return kb_err_set(eb, KB_ERR_NOMEM, "roofline: out of memory for %d ranks", job->ws);
    for (int l = 0; l < job->channels && rc == 0; l++) {
        int64_t share = kb_ccl_lane_share(job->count, job->channels, l, NULL);
        for (int s = 0; s < job->ws; s++) {
            /* lane l is the row of SIP s's tensor held by one of its PEs */
            const kb_shard_spec *sh = NULL;
            for (size_t i = 0; i < kb_tensor_nshards(job->t[s]); i++)
                if (kb_tensor_shard(job->t[s], i)->row0 == (uint64_t)l)
                    sh = kb_tensor_shard(job->t[s], i);
            if (!sh) {
                rc = kb_err_set(eb, KB_ERR_INVAL, "roofline: SIP %d has no lane %d", s, l);
                break;
            }
            gid[s] = kb_roofline_gid(kb_roofline_machine(a), (int)sh->sip, (int)sh->cube,
                                     (int)sh->pe);
        }
        if (rc == 0)
            rc = kb_ccl_roofline_add(a, job->impl->kind, job->ws, gid, job->root,
                                     (double)share * (double)kb_dtype_size(job->dtype), 0, eb);
    }
    free(gid);
    return rc;
}

int kb_ccl_roofline_shards(kb_roofline_acc *a, kb_coll_kind kind, int ws,
                           kb_tensor *const *t, double bytes, kb_errbuf *eb)
{
    int per = ws > 0 ? (int)kb_tensor_nshards(t[0]) : 0, n = ws * per, rc;
    int *gid = malloc(sizeof *gid * (size_t)(n > 0 ? n : 1));
    if (!gid)
        return kb_err_set(eb, KB_ERR_NOMEM, "roofline: out of memory for %d shards", n);
    for (int r = 0; r < ws; r++)
        for (int i = 0; i < per; i++) {
            const kb_shard_spec *sh = kb_tensor_shard(t[r], (size_t)i);
            gid[r * per + i] = kb_roofline_gid(kb_roofline_machine(a), (int)sh->sip,
                                               (int)sh->cube, (int)sh->pe);
        }
    rc = kb_ccl_roofline_add(a, kind, n, gid, 0, bytes, 0, eb);
    free(gid);
    return rc;
}
