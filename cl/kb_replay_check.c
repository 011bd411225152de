/*
 * kb_replay_check — what a record must satisfy before the replay plans or runs it (part of the
 * Phase-2 replay: kb_replay.c plans, kb_replay_flush.c runs; shared names in kb_replay_int.h):
 * a known kind with its number of sources, operands with a valid dtype, space and row stride
 * whose bytes neither pass 2^64 nor wrap the address space, shapes that fit the kind
 * (broadcasts, transposes, gemm chains, dequant layouts, reduce axes), payload sources inside
 * the payload, and, for a record already placed in an arena (a device server's flush,
 * kb_rec_check_placed), operands inside the arena and the payload. Limits: it checks records
 * one at a time; conflicts between records are the planner's business.
 */
#include "kb_replay_int.h"

#include "kb_mathfn.h"
#include "kb_seedgen.h"

static unsigned nsrc_of(unsigned kind)
{
    static const unsigned n[KB_REC_NKINDS] = { 1, 0, 1, 2, 3, 1, 1, 1, 2, 1, 1, 2,
                                               /* dequant: at least (see check_dequant) */ 1,
                                               /* gen: parameters, no operands */ 0 };
    return kind < KB_REC_NKINDS ? n[kind] : 0;
}

static int bad(const kb_rec *r, kb_errbuf *eb, const char *what)
{
    return kb_err_set(eb, KB_ERR_INVAL, "op log record seq %llu (%s): %s",
                      (unsigned long long)r->seq, kb_rec_kind_name((kb_rec_kind)r->kind), what);
}

static int check_opnd(const kb_rec *r, const kb_opnd *o, kb_errbuf *eb)
{
    if (o->dtype >= KB_NDTYPES)
        return bad(r, eb, "operand dtype out of range");
    if (o->space != KB_SPACE_MEM && o->space != KB_SPACE_PAYLOAD)
        return bad(r, eb, "operand space out of range");
    if (o->rows > 1 && o->ld < o->cols)
        return bad(r, eb, "operand row stride ld < cols");
    /* (rows - 1) * ld + cols fits in 64 bits for any 32-bit shape, its bytes need not: a
     * kb_opnd_span that wrapped would plan a few bytes for an operand the kernels then walk
     * far past (found by tests/fuzz/fuzz_replay.c) */
    if (o->rows > 0 && o->cols > 0 &&
        (uint64_t)(o->rows - 1) * o->ld + o->cols > UINT64_MAX / kb_dtype_size((kb_dtype)o->dtype))
        return bad(r, eb, "operand spans more than 2^64 bytes");
    if (o->addr > UINT64_MAX - kb_opnd_span(o))
        return bad(r, eb, "operand wraps around the address space");
    return 0;
}

static int bcasts(const kb_opnd *s, const kb_opnd *d)
{
    return (s->rows == d->rows || s->rows == 1) && (s->cols == d->cols || s->cols == 1);
}

/* The kinds of kb_tl_nn (kb_oplog.h): shapes and ops. */
static int check_nn_rec(const kb_rec *r, kb_errbuf *eb)
{
    const kb_opnd *d = &r->dst, *s = r->src;

    switch (r->kind) {
    case KB_REC_TRANSPOSE:
        if (s[0].rows != d->cols || s[0].cols != d->rows)
            return bad(r, eb, "transpose needs a C x R destination for an R x C source");
        return 0;
    case KB_REC_ATTN_SOFTMAX:
        if (r->op > 1)
            return bad(r, eb, "attn_softmax causal flag must be 0 or 1");
        if (s[0].rows != d->rows || s[0].cols != d->cols)
            return bad(r, eb, "attn_softmax source and destination shapes differ");
        return 0;
    case KB_REC_GATHER:
        if (s[0].cols != d->cols)
            return bad(r, eb, "gather table and destination widths differ");
        if (!((s[1].rows == 1 && s[1].cols == d->rows) || (s[1].cols == 1 && s[1].rows == d->rows)))
            return bad(r, eb, "gather needs one id per destination row (1 x n or n x 1)");
        return 0;
    default:
        return bad(r, eb, "not a kb_tl_nn kind");
    }
}

/* DEQUANT (kb_oplog.h): the elements, the 2:4 metadata and the scale fit the destination. */
static int check_dequant(const kb_rec *r, kb_errbuf *eb)
{
    const kb_opnd *d = &r->dst, *s = r->src;
    if (r->flags & KB_REC_QSPARSE) {
        if (d->rows % 4 != 0 || s[0].rows * 2 != d->rows || s[0].cols != d->cols)
            return bad(r, eb, "sparse dequant needs R % 4 == 0 and R/2 x C kept values");
        if (s[1].rows != (d->rows + 7) / 8 || s[1].cols != d->cols || s[1].dtype != KB_I8)
            return bad(r, eb, "sparse dequant needs ceil(R/8) x C i8 metadata");
    } else if (s[0].rows != d->rows || s[0].cols != d->cols) {
        return bad(r, eb, "dequant elements and destination shapes differ");
    }
    if (r->flags & KB_REC_QSCALE) {
        const kb_opnd *sc = &s[r->nsrc - 1];
        if (sc->rows == 0 || sc->cols == 0 || d->rows % sc->rows != 0 ||
            d->cols % sc->cols != 0)
            return bad(r, eb, "dequant scale shape does not divide the destination's");
    }
    return 0;
}

/* GEN op KB_GEN_QW (kb_oplog.h): two maps in the payload, a part and format whose layout the
 * copy's rows allow, a destination of the part's dtype. */
static int check_gen_qw(const kb_rec *r, kb_errbuf *eb)
{
    const kb_opnd *m = r->src;
    unsigned part = r->src[2].rows, fmt = r->src[2].cols;
    int sparse = (r->flags & KB_REC_QSPARSE) != 0;
    uint64_t k = m[0].cols / 8u, nb = m[1].cols / KB_SEEDGEN_COL_BYTES;
    for (unsigned i = 0; i < 2; i++)
        if (m[i].space != KB_SPACE_PAYLOAD || m[i].dtype != KB_I8 || m[i].rows != 1)
            return bad(r, eb, "gen qw: its maps are 1 x bytes i8 operands in the payload");
    if (k == 0 || m[0].cols % 8u != 0 || nb == 0 || m[1].cols % KB_SEEDGEN_COL_BYTES != 0)
        return bad(r, eb, "gen qw: a row map of 8-byte entries and a column map of 32-byte "
                          "entries, neither empty");
    if (kb_seedgen_qw_dtype(fmt, part) < 0)
        return bad(r, eb, "gen qw: format or part out of range (or a scale for f16/bf16)");
    if ((int)r->dst.dtype != kb_seedgen_qw_dtype(fmt, part))
        return bad(r, eb, "gen qw: destination dtype is not the part's");
    if ((fmt == KB_MF_QF_MXINT8 && k % KB_MF_MX_BLOCK != 0) || (sparse && k % 4 != 0))
        return bad(r, eb, "gen qw: mxint8 needs k % 32 == 0, 2:4 sparsity k % 4 == 0");
    if (part == KB_SEEDGEN_QW_META && !sparse)
        return bad(r, eb, "gen qw: 2:4 metadata of a dense weight");
    if (r->src[2].ld >= nb)
        return bad(r, eb, "gen qw: first column past the column map");
    return 0;
}

int kb_replay_check_rec(const kb_rec *r, kb_errbuf *eb)
{
    const kb_opnd *d = &r->dst, *s = r->src;
    int rc;

    if (r->kind >= KB_REC_NKINDS)
        return kb_err_set(eb, KB_ERR_INVAL, "op log record seq %llu: unknown kind %u",
                          (unsigned long long)r->seq, (unsigned)r->kind);
    if (r->kind == KB_REC_DEQUANT
            ? r->nsrc != 1u + !!(r->flags & KB_REC_QSPARSE) + !!(r->flags & KB_REC_QSCALE)
        : r->kind == KB_REC_GEN && r->op == KB_GEN_QW ? r->nsrc != 2u /* the two maps */
                                                      : r->nsrc != nsrc_of(r->kind))
        return bad(r, eb, "wrong number of sources");
    if (d->space != KB_SPACE_MEM)
        return bad(r, eb, "destination not in memory");
    if ((rc = check_opnd(r, d, eb)) != 0)
        return rc;
    for (unsigned i = 0; i < r->nsrc; i++)
        if ((rc = check_opnd(r, &s[i], eb)) != 0)
            return rc;
    switch (r->kind) {
    case KB_REC_MATH1:
        if (r->op >= KB_M1_NOPS)
            return bad(r, eb, "math1 op out of range");
        break;
    case KB_REC_MATH2:
        if (r->op >= KB_M2_NOPS)
            return bad(r, eb, "math2 op out of range");
        break;
    case KB_REC_SOFTMAX:
        if (r->op > 1)
            return bad(r, eb, "softmax axis must be 0 or 1");
        if (s[0].rows != d->rows || s[0].cols != d->cols)
            return bad(r, eb, "softmax source and destination shapes differ");
        return 0;
    case KB_REC_REDUCE:
        if (r->op >= KB_RED_NOPS)
            return bad(r, eb, "reduce op out of range");
        if (r->flags & KB_REC_AXIS0) {
            if (d->rows != 1 || d->cols != s[0].cols)
                return bad(r, eb, "axis-0 reduce needs a 1 x cols destination");
        } else if (d->cols != 1 || d->rows != s[0].rows) {
            return bad(r, eb, "axis-1 reduce needs a rows x 1 destination");
        }
        return 0;
    case KB_REC_GEMM:
        if (s[0].rows != d->rows || s[1].cols != d->cols || s[0].cols != s[1].rows)
            return bad(r, eb, "gemm shapes do not chain (MxK @ KxN -> MxN)");
        return 0;
    case KB_REC_TRANSPOSE:
    case KB_REC_ATTN_SOFTMAX:
    case KB_REC_GATHER:
        return check_nn_rec(r, eb);
    case KB_REC_DEQUANT:
        return check_dequant(r, eb);
    case KB_REC_GEN:
        if (r->op > KB_GEN_QW)
            return bad(r, eb, "gen op out of range");
        if (r->op == KB_GEN_QW)
            return check_gen_qw(r, eb);
        if (r->op == KB_GEN_PAT) {
            if (r->src[0].cols > KB_SEEDGEN_PAT_MAX_RANGE || r->src[1].rows > 1)
                return bad(r, eb, "gen pattern: range above 2^24 or transpose flag not 0/1");
            if (!kb_seedgen_pattern_ok(r->src[0].cols, r->imm[0], r->imm[1]))
                return bad(r, eb, "gen pattern: the scale must be a power of two from 2^-100 "
                                  "to 2^100, the term finite and 0 or of at least 2^-100");
            return 0;
        }
        if (r->op == KB_GEN_SIGN && r->src[0].cols == 0)
            return bad(r, eb, "gen sign variant needs ntiles >= 1");
        return 0;
    default:
        break;
    }
    for (unsigned i = 0; i < r->nsrc; i++)
        if (!bcasts(&s[i], d))
            return bad(r, eb, "source shape does not broadcast to the destination");
    return 0;
}

int kb_rec_check_placed(const kb_rec *r, uint64_t arena_bytes, uint64_t payload_bytes,
                        kb_errbuf *eb)
{
    const kb_opnd *o[4] = { &r->dst, &r->src[0], &r->src[1], &r->src[2] };
    int rc = kb_replay_check_rec(r, eb);

    if (rc)
        return rc;
    /* GEN's parameters: the first tile and element get a 32-bit index added as int64_t */
    if (r->kind == KB_REC_GEN)
        for (unsigned i = 0; i < 3; i++)
            if (r->src[i].addr > (uint64_t)INT64_MAX - UINT32_MAX)
                return bad(r, eb, "gen parameter out of range");
    /* check_rec bounds nsrc by 3; the span is computed here without kb_opnd_span, whose
     * product by the element size can wrap for rows and ld near 2^32 */
    for (unsigned i = 0; i <= r->nsrc; i++) {
        uint64_t lim = o[i]->space == KB_SPACE_PAYLOAD ? payload_bytes : arena_bytes;
        uint64_t esz = kb_dtype_size((kb_dtype)o[i]->dtype), elems;
        if (o[i]->rows == 0 || o[i]->cols == 0) {
            /* no bytes, but a backend may still loop over its other extent: no longer than
             * over an operand the space could hold (a 1 x 0 one fits anywhere) */
            uint64_t cap = lim / esz > 0 ? lim / esz : 1;
            if (o[i]->rows > cap || o[i]->cols > cap)
                return bad(r, eb, "empty operand with an extent its space could not hold");
            if (o[i]->addr > lim) /* its base is still computed */
                return bad(r, eb, "empty operand beyond its space");
            continue;
        }
        elems = (uint64_t)(o[i]->rows - 1) * o[i]->ld + o[i]->cols; /* < 2^64: no wrap */
        if (elems > lim / esz || o[i]->addr > lim - elems * esz)
            return bad(r, eb, o[i]->space == KB_SPACE_PAYLOAD ? "operand beyond the payload"
                                                              : "operand beyond the arena");
    }
    return 0;
}

int kb_replay_check_payload(const kb_rec *const *recs, size_t n, size_t payload_bytes,
                            kb_errbuf *eb)
{
    for (size_t i = 0; i < n; i++) {
        const kb_rec *r = recs[i];
        for (unsigned s = 0; s < r->nsrc && s < 3; s++) {
            const kb_opnd *o = &r->src[s];
            uint64_t span = kb_opnd_span(o);
            if (o->space == KB_SPACE_PAYLOAD && span > 0 &&
                (o->addr > payload_bytes || span > payload_bytes - o->addr))
                return bad(r, eb, "payload source beyond the payload area");
        }
    }
    return 0;
}
