/*
 * replay.cl — the OpenCL C 1.2 kernels of the Phase-2 replay (cl/kb_opencl.c drives them).
 *
 * The program text is cl/kb_mathfn.h followed by this file; the library embeds both at build
 * time. Every kernel serves one record kind and a whole group of records in one launch: it
 * receives the arena (up to four of its buffers, see kb_base), the payload and an argument
 * table (kb_ent, one per record, laid out exactly like kb_clent in kb_opencl.c) whose `start`
 * fields number the launch's work units (elementwise chunks, groups of lines, gemm tiles)
 * record after record. Element
 * arithmetic is the shared kb_mathfn.h code with f16/bf16 converted in software, so results
 * equal the C reference bit for bit (gemm included, see kb_gemm). Limits: little-endian
 * devices only (the arena holds host bytes); reductions and softmax run one line per
 * work-item in ascending order, which is exact but slow for very long lines.
 */

#ifndef KB_EW_LOCAL
#define KB_EW_LOCAL 256 /* work-items per elementwise work-group */
#endif
#ifndef KB_EW_PER
#define KB_EW_PER 8     /* elements per work-item and chunk */
#endif
#ifndef KB_LN_LOCAL
#define KB_LN_LOCAL 64  /* lines (softmax, reduce) per work-group */
#endif
#ifndef KB_GEMM_TM
#define KB_GEMM_TM 128  /* output tile rows per work-group */
#endif
#ifndef KB_GEMM_TN
#define KB_GEMM_TN 128  /* output tile columns per work-group */
#endif
#ifndef KB_GEMM_TK
#define KB_GEMM_TK 16   /* k per local-memory step */
#endif
#ifndef KB_GEMM_WM
#define KB_GEMM_WM 8    /* output rows per work-item (multiple of 4) */
#endif
#ifndef KB_GEMM_WN
#define KB_GEMM_WN 8    /* output columns per work-item (multiple of 4) */
#endif
#ifndef KB_GEMM_GM
#define KB_GEMM_GM 8    /* tile rows per swizzle group (L2 reuse) */
#endif

#define KB_EW_CHUNK (KB_EW_LOCAL * KB_EW_PER)
#define KB_GEMM_NTX (KB_GEMM_TN / KB_GEMM_WN)
#define KB_GEMM_NTY (KB_GEMM_TM / KB_GEMM_WM)
#define KB_GEMM_NT (KB_GEMM_NTX * KB_GEMM_NTY)
#define KB_GEMM_LDA (KB_GEMM_TM + 4) /* padded local row: fewer bank conflicts on stores */
#define KB_GEMM_LDB KB_GEMM_TN
#define KB_GEMM_AL ((KB_GEMM_TM * KB_GEMM_TK + KB_GEMM_NT - 1) / KB_GEMM_NT)
#define KB_GEMM_BL ((KB_GEMM_TN * KB_GEMM_TK + KB_GEMM_NT - 1) / KB_GEMM_NT)

/* Operand descriptor bits, one byte per operand in kb_ent.dt (0 dst, 1..3 sources). */
#define KB_DT_F16 0u
#define KB_DT_BF16 1u
#define KB_DT_F32 2u
#define KB_DT_I8 3u
#define KB_DT_E4M3 4u
#define KB_DT_E5M2 5u
#define KB_DT_E8M0 6u
#define KB_DT_I32 7u
#define KB_DT_TYPE 7u       /* the kb_dtype code */
#define KB_DT_PAYLOAD 8u
#define KB_DT_UNALIGNED 16u

/* kb_ent.flags */
#define KB_EF_ACC 1u
#define KB_EF_FLAT 2u
#define KB_EF_BIG 4u
#define KB_EF_FMA 8u
#define KB_EF_PAIR 16u
#define KB_EF_QUAD 32u

typedef struct kb_ent {
    ulong start;   /* first work unit of this record in the launch */
    ulong off[4];  /* byte offsets of dst and sources in the arena or the payload */
    uint rows, cols, kdim, flags;
    uint rs[4];    /* element stride between rows (lines); 0 broadcasts */
    uint cs[4];    /* element stride between columns (elements of a line); 0 broadcasts */
    uint dt;       /* operand descriptors, KB_DT_* */
    uint op;
    float imm0, imm1;
} kb_ent;

/* The entry owning work unit g: the last one whose start is <= g. */
static uint kb_find(global const kb_ent *t, uint n, ulong g)
{
    uint lo = 0, hi = n;
    while (hi - lo > 1u) {
        uint mid = lo + (hi - lo) / 2u;
        if (t[mid].start <= g)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/*
 * The resident arena is several buffers (kb_resident.h's blocks): a launch binds up to four,
 * arena0-3, and an operand's descriptor names its slot (KB_DT_SLOT, bits 5-6; bit 7 is the
 * host's). A host-arena flush binds its one buffer to every slot.
 */
#define KB_ARENA_PARAMS global uchar *arena, global uchar *arena1, global uchar *arena2, \
                        global uchar *arena3
#define KB_ARENA_ARGS arena, arena1, arena2, arena3
#define KB_DT_SLOT(d) (((d) >> 5) & 3u)
/* A record's destination (slot 0; never the payload); the function has `payload` in scope. */
#define KB_DST(e) kb_base(KB_ARENA_ARGS, payload, (e)->dt & 0xFFu, (e)->off[0])

static global uchar *kb_base(KB_ARENA_PARAMS, global const uchar *payload, uint d, ulong off)
{
    uint s = KB_DT_SLOT(d);
    /* Payload operands are only ever read; the cast drops const for a uniform return type. */
    if (d & KB_DT_PAYLOAD)
        return (global uchar *)payload + off;
    return (s == 0u ? arena : s == 1u ? arena1 : s == 2u ? arena2 : arena3) + off;
}

static uint kb_ld16(global const uchar *b, uint d, ulong i)
{
    if (d & KB_DT_UNALIGNED) {
        global const uchar *p = b + 2u * i;
        return (uint)p[0] | ((uint)p[1] << 8);
    }
    return ((global const ushort *)b)[i];
}

static uint kb_ld32(global const uchar *b, uint d, ulong i)
{
    if (d & KB_DT_UNALIGNED) {
        global const uchar *p = b + 4u * i;
        return (uint)p[0] | ((uint)p[1] << 8) | ((uint)p[2] << 16) | ((uint)p[3] << 24);
    }
    return ((global const uint *)b)[i];
}

static void kb_st16(global uchar *b, uint d, ulong i, uint v)
{
    if (d & KB_DT_UNALIGNED) {
        global uchar *p = b + 2u * i;
        p[0] = (uchar)v;
        p[1] = (uchar)(v >> 8);
        return;
    }
    ((global ushort *)b)[i] = (ushort)v;
}

static void kb_st32(global uchar *b, uint d, ulong i, uint v)
{
    if (d & KB_DT_UNALIGNED) {
        global uchar *p = b + 4u * i;
        p[0] = (uchar)v;
        p[1] = (uchar)(v >> 8);
        p[2] = (uchar)(v >> 16);
        p[3] = (uchar)(v >> 24);
        return;
    }
    ((global uint *)b)[i] = v;
}

/* Bytes per element of type t: 1 for the 8-bit formats, 4 for f32 and i32, else 2. */
static uint kb_esize(uint t)
{
    return t >= KB_DT_I8 && t <= KB_DT_E8M0 ? 1u : (t == KB_DT_F32 || t == KB_DT_I32) ? 4u : 2u;
}

/* The bits of element i (an 8- or 16-bit code or 32 bits); kb_cvt turns them into f32. */
static uint kb_ldraw(global const uchar *b, uint d, ulong i)
{
    uint s = kb_esize(d & KB_DT_TYPE);
    return s == 4u ? kb_ld32(b, d, i) : s == 2u ? kb_ld16(b, d, i) : (uint)b[i];
}

static float kb_cvt(uint d, uint x)
{
    switch (d & KB_DT_TYPE) {
    case KB_DT_F32: return as_float(x);
    case KB_DT_F16: return kb_mf_h2f(x);
    case KB_DT_BF16: return kb_mf_bf2f(x);
    case KB_DT_I8: return kb_mf_i82f(x);
    case KB_DT_E4M3: return kb_mf_e4m32f(x);
    case KB_DT_E5M2: return kb_mf_e5m22f(x);
    case KB_DT_E8M0: return kb_mf_e8m02f(x);
    default: return kb_mf_i322f(x);
    }
}

/* Element i of an operand as f32. */
static float kb_ld(global const uchar *b, uint d, ulong i)
{
    return kb_cvt(d, kb_ldraw(b, d, i));
}

/* f32 -> the bits stored for an operand of descriptor d (rounding once). */
static uint kb_enc(uint d, float v)
{
    switch (d & KB_DT_TYPE) {
    case KB_DT_F32: return as_uint(v);
    case KB_DT_F16: return kb_mf_f2h(v);
    case KB_DT_BF16: return kb_mf_f2bf(v);
    case KB_DT_I8: return kb_mf_f2i8(v);
    case KB_DT_E4M3: return kb_mf_f2e4m3(v);
    case KB_DT_E5M2: return kb_mf_f2e5m2(v);
    case KB_DT_E8M0: return kb_mf_f2e8m0(v);
    default: return kb_mf_f2i32(v);
    }
}

static void kb_st_raw(global uchar *b, uint d, ulong i, uint v)
{
    uint s = kb_esize(d & KB_DT_TYPE);
    if (s == 4u)
        kb_st32(b, d, i, v);
    else if (s == 2u)
        kb_st16(b, d, i, v);
    else
        b[i] = (uchar)v;
}

/* Stores v into element i, rounding once to the operand's type. */
static void kb_st(global uchar *b, uint d, ulong i, float v)
{
    kb_st_raw(b, d, i, kb_enc(d, v));
}

/* ---------------------------------------------------------------- elementwise kinds */

#define KB_K_COPY 0u
#define KB_K_FILL 1u
#define KB_K_MATH1 2u
#define KB_K_MATH2 3u
#define KB_K_FMA 4u
#define KB_K_CLAMP 5u

/* Sources each kind reads. */
#define KB_NSRC(kind) ((kind) == KB_K_FILL ? 0u : (kind) == KB_K_MATH2 ? 2u : (kind) == KB_K_FMA ? 3u : 1u)

/*
 * The dst bits of one element from its sources' bits. A same-type copy moves bits (16-bit
 * NaNs are quieted, as the reference's round trip through f32 does).
 */
static uint kb_ew_val(uint kind, global const kb_ent *e, uint d0, uint d1, uint d2, uint d3,
                      uint x1, uint x2, uint x3)
{
    float v;
    if (kind == KB_K_COPY && (d0 & KB_DT_TYPE) == (d1 & KB_DT_TYPE) &&
        (d0 & KB_DT_TYPE) <= KB_DT_F32) {
        uint emask = (d0 & KB_DT_TYPE) == KB_DT_F16 ? 0x7C00u : 0x7F80u;
        if ((d0 & KB_DT_TYPE) != KB_DT_F32 && (x1 & emask) == emask && (x1 & (emask ^ 0x7FFFu)) != 0u)
            x1 |= (d0 & KB_DT_TYPE) == KB_DT_F16 ? 0x0200u : 0x0040u;
        return x1;
    }
    if (kind == KB_K_COPY)
        v = kb_cvt(d1, x1);
    else if (kind == KB_K_FILL)
        v = e->imm0;
    else if (kind == KB_K_MATH1)
        v = kb_mf_math1(e->op, kb_cvt(d1, x1), e->imm0, e->imm1);
    else if (kind == KB_K_MATH2)
        v = kb_mf_math2(e->op, kb_cvt(d1, x1), kb_cvt(d2, x2));
    else if (kind == KB_K_FMA)
        v = kb_mf_fma(kb_cvt(d1, x1), kb_cvt(d2, x2), kb_cvt(d3, x3));
    else
        v = kb_mf_fmin(kb_mf_fmax(kb_cvt(d1, x1), e->imm0), e->imm1);
    return kb_enc(d0, v);
}

/* Elements i and i + 1 (i even, the operand aligned to two elements) as raw bits. */
static uint2 kb_ld2(global const uchar *b, uint d, ulong i)
{
    if (kb_esize(d & KB_DT_TYPE) == 4u)
        return ((global const uint2 *)b)[i / 2u];
    uint x = ((global const uint *)b)[i / 2u];
    return (uint2)(x & 0xFFFFu, x >> 16);
}

static void kb_st2(global uchar *b, uint d, ulong i, uint2 v)
{
    if (kb_esize(d & KB_DT_TYPE) == 4u)
        ((global uint2 *)b)[i / 2u] = v;
    else
        ((global uint *)b)[i / 2u] = v.x | (v.y << 16);
}

/*
 * One chunk (KB_EW_CHUNK consecutive elements in row-major order of dst) of one record. All
 * loads are issued before the first store (the compiler cannot prove that dst and the sources
 * do not alias, so interleaving would serialize them); that is safe because dst is either
 * disjoint from the sources or exactly the first one (in place). `kind` is a literal at every
 * call site, so each kernel keeps only its own branch.
 *
 * Quad path (KB_EF_QUAD: contiguous 16-bit operands aligned to 8 bytes) and pair path
 * (KB_EF_PAIR: contiguous operands aligned to two elements): each work-item moves four or two
 * neighbouring elements per access, 8 bytes where it can, because the device sustains far
 * more bytes per second with wide accesses than with 2-byte ones. Otherwise each
 * work-item takes every KB_EW_LOCAL-th element, with row/column arithmetic for strides and
 * broadcasting.
 */
static void kb_ew_chunk(uint kind, global const kb_ent *e, KB_ARENA_PARAMS,
                        global const uchar *payload, ulong chunk)
{
    ulong n = (ulong)e->rows * e->cols;
    ulong cbase = chunk * KB_EW_CHUNK;
    uint lid = get_local_id(0);
    uint dt = e->dt, flags = e->flags, cols = e->cols;
    uint d0 = dt & 0xFFu, d1 = (dt >> 8) & 0xFFu, d2 = (dt >> 16) & 0xFFu, d3 = (dt >> 24) & 0xFFu;
    global uchar *b0 = KB_DST(e);
    global uchar *b1 = kb_base(KB_ARENA_ARGS, payload, d1, e->off[1]);
    global uchar *b2 = kb_base(KB_ARENA_ARGS, payload, d2, e->off[2]);
    global uchar *b3 = kb_base(KB_ARENA_ARGS, payload, d3, e->off[3]);

    if (flags & KB_EF_QUAD) {
        uint2 y1[KB_EW_PER / 4], y2[KB_EW_PER / 4], y3[KB_EW_PER / 4];
        _Pragma("unroll") for (uint it = 0; it < KB_EW_PER / 4; it++) {
            ulong idx = cbase + 4u * (lid + it * KB_EW_LOCAL);
            y1[it] = y2[it] = y3[it] = (uint2)(0u, 0u);
            if (idx + 3u >= n) { /* the last 1 to 3 elements */
                for (uint k = 0; k < 3u && idx + k < n; k++) {
                    uint sh = 16u * (k & 1u);
                    if (KB_NSRC(kind) >= 1u) {
                        if (k < 2u) y1[it].x |= kb_ld16(b1, d1, idx + k) << sh;
                        else y1[it].y = kb_ld16(b1, d1, idx + k);
                    }
                    if (KB_NSRC(kind) >= 2u) {
                        if (k < 2u) y2[it].x |= kb_ld16(b2, d2, idx + k) << sh;
                        else y2[it].y = kb_ld16(b2, d2, idx + k);
                    }
                    if (KB_NSRC(kind) >= 3u) {
                        if (k < 2u) y3[it].x |= kb_ld16(b3, d3, idx + k) << sh;
                        else y3[it].y = kb_ld16(b3, d3, idx + k);
                    }
                }
                continue;
            }
            if (KB_NSRC(kind) >= 1u)
                y1[it] = ((global const uint2 *)b1)[idx / 4u];
            if (KB_NSRC(kind) >= 2u)
                y2[it] = ((global const uint2 *)b2)[idx / 4u];
            if (KB_NSRC(kind) >= 3u)
                y3[it] = ((global const uint2 *)b3)[idx / 4u];
        }
        _Pragma("unroll") for (uint it = 0; it < KB_EW_PER / 4; it++) {
            ulong idx = cbase + 4u * (lid + it * KB_EW_LOCAL);
            uint v[4];
            if (idx >= n)
                continue;
            _Pragma("unroll") for (uint k = 0; k < 4u; k++) {
                uint w1 = k < 2u ? y1[it].x : y1[it].y, w2 = k < 2u ? y2[it].x : y2[it].y;
                uint w3 = k < 2u ? y3[it].x : y3[it].y, sh = 16u * (k & 1u);
                v[k] = kb_ew_val(kind, e, d0, d1, d2, d3, (w1 >> sh) & 0xFFFFu, (w2 >> sh) & 0xFFFFu,
                                 (w3 >> sh) & 0xFFFFu);
            }
            if (idx + 3u >= n) {
                for (uint k = 0; k < 3u && idx + k < n; k++)
                    kb_st16(b0, d0, idx + k, v[k]);
                continue;
            }
            ((global uint2 *)b0)[idx / 4u] = (uint2)(v[0] | (v[1] << 16), v[2] | (v[3] << 16));
        }
        return;
    }
    if (flags & KB_EF_PAIR) {
        uint2 y1[KB_EW_PER / 2], y2[KB_EW_PER / 2], y3[KB_EW_PER / 2];
        _Pragma("unroll") for (uint it = 0; it < KB_EW_PER / 2; it++) {
            ulong idx = cbase + 2u * (lid + it * KB_EW_LOCAL);
            y1[it] = y2[it] = y3[it] = (uint2)(0u, 0u);
            if (idx + 1u >= n) {
                if (idx < n) { /* the odd last element */
                    if (KB_NSRC(kind) >= 1u)
                        y1[it].x = kb_ldraw(b1, d1, idx);
                    if (KB_NSRC(kind) >= 2u)
                        y2[it].x = kb_ldraw(b2, d2, idx);
                    if (KB_NSRC(kind) >= 3u)
                        y3[it].x = kb_ldraw(b3, d3, idx);
                }
                continue;
            }
            if (KB_NSRC(kind) >= 1u)
                y1[it] = kb_ld2(b1, d1, idx);
            if (KB_NSRC(kind) >= 2u)
                y2[it] = kb_ld2(b2, d2, idx);
            if (KB_NSRC(kind) >= 3u)
                y3[it] = kb_ld2(b3, d3, idx);
        }
        _Pragma("unroll") for (uint it = 0; it < KB_EW_PER / 2; it++) {
            ulong idx = cbase + 2u * (lid + it * KB_EW_LOCAL);
            uint2 r;
            if (idx >= n)
                continue;
            r.x = kb_ew_val(kind, e, d0, d1, d2, d3, y1[it].x, y2[it].x, y3[it].x);
            if (idx + 1u >= n) {
                kb_st_raw(b0, d0, idx, r.x);
                continue;
            }
            r.y = kb_ew_val(kind, e, d0, d1, d2, d3, y1[it].y, y2[it].y, y3[it].y);
            kb_st2(b0, d0, idx, r);
        }
        return;
    }
    {
        ulong first = cbase + lid;
        uint cnt = first >= n ? 0u
                              : (uint)min((ulong)KB_EW_PER, (n - first + KB_EW_LOCAL - 1) / KB_EW_LOCAL);
        uint x1[KB_EW_PER], x2[KB_EW_PER], x3[KB_EW_PER];
        ulong od[KB_EW_PER];

        _Pragma("unroll") for (uint it = 0; it < KB_EW_PER; it++) {
            ulong idx = first + (ulong)it * KB_EW_LOCAL;
            ulong o1, o2, o3;
            x1[it] = x2[it] = x3[it] = 0u;
            od[it] = 0;
            if (it >= cnt)
                continue;
            if (flags & KB_EF_FLAT) {
                od[it] = o1 = o2 = o3 = idx;
            } else {
                ulong row, col;
                if (flags & KB_EF_BIG) {
                    row = idx / cols;
                    col = idx - row * cols;
                } else {
                    uint r32 = (uint)idx / cols;
                    row = r32;
                    col = (uint)idx - r32 * cols;
                }
                od[it] = row * e->rs[0] + col * e->cs[0];
                o1 = row * e->rs[1] + col * e->cs[1];
                o2 = row * e->rs[2] + col * e->cs[2];
                o3 = row * e->rs[3] + col * e->cs[3];
            }
            if (KB_NSRC(kind) >= 1u)
                x1[it] = kb_ldraw(b1, d1, o1);
            if (KB_NSRC(kind) >= 2u)
                x2[it] = kb_ldraw(b2, d2, o2);
            if (KB_NSRC(kind) >= 3u)
                x3[it] = kb_ldraw(b3, d3, o3);
        }
        _Pragma("unroll") for (uint it = 0; it < KB_EW_PER; it++) {
            if (it >= cnt)
                continue;
            kb_st_raw(b0, d0, od[it], kb_ew_val(kind, e, d0, d1, d2, d3, x1[it], x2[it], x3[it]));
        }
    }
}

/*
 * Grid kernels (all but gemm): a fixed number of work-groups, each walking a contiguous range
 * of the launch's work units. One binary search finds the first unit's record; after that the
 * record index only advances (every entry has at least one unit), so a unit costs no search.
 */
#define KB_GRID_KERNEL(name, local, fn, kind)                                              \
    __attribute__((reqd_work_group_size(local, 1, 1)))                                    \
    kernel void name(KB_ARENA_PARAMS, global const uchar *payload,                         \
                     global const kb_ent *tab, uint first, uint n, ulong units)            \
    {                                                                                      \
        ulong per = (units + get_num_groups(0) - 1) / get_num_groups(0);                   \
        ulong g = get_group_id(0) * per, g1 = min(g + per, units), st, nxt;                \
        uint i;                                                                            \
        if (g >= g1)                                                                       \
            return;                                                                        \
        tab += first;                                                                      \
        i = kb_find(tab, n, g);                                                            \
        st = tab[i].start;                                                                 \
        nxt = i + 1u < n ? tab[i + 1u].start : units;                                      \
        for (; g < g1; g++) {                                                              \
            if (g >= nxt) {                                                                \
                i++;                                                                       \
                st = nxt;                                                                  \
                nxt = i + 1u < n ? tab[i + 1u].start : units;                              \
            }                                                                              \
            fn(kind, tab + i, KB_ARENA_ARGS, payload, g - st);                             \
        }                                                                                  \
    }

/*
 * A batch's elementwise records of several kinds in one launch (kb_replay.h's launch groups):
 * each entry's kind in flags, and the same specialised chunk code per kind as the one-kind
 * kernels below, so the bits are theirs.
 */
#define KB_EF_KIND_SHIFT 8u

static void kb_ew_any(uint kind, global const kb_ent *e, KB_ARENA_PARAMS,
                      global const uchar *payload, ulong chunk)
{
    (void)kind;
    switch ((e->flags >> KB_EF_KIND_SHIFT) & 7u) {
    case KB_K_COPY: kb_ew_chunk(KB_K_COPY, e, KB_ARENA_ARGS, payload, chunk); break;
    case KB_K_FILL: kb_ew_chunk(KB_K_FILL, e, KB_ARENA_ARGS, payload, chunk); break;
    case KB_K_MATH1: kb_ew_chunk(KB_K_MATH1, e, KB_ARENA_ARGS, payload, chunk); break;
    case KB_K_MATH2: kb_ew_chunk(KB_K_MATH2, e, KB_ARENA_ARGS, payload, chunk); break;
    case KB_K_FMA: kb_ew_chunk(KB_K_FMA, e, KB_ARENA_ARGS, payload, chunk); break;
    default: kb_ew_chunk(KB_K_CLAMP, e, KB_ARENA_ARGS, payload, chunk); break;
    }
}

KB_GRID_KERNEL(kb_ew, KB_EW_LOCAL, kb_ew_any, 0u)
KB_GRID_KERNEL(kb_copy, KB_EW_LOCAL, kb_ew_chunk, KB_K_COPY)
KB_GRID_KERNEL(kb_fill, KB_EW_LOCAL, kb_ew_chunk, KB_K_FILL)
KB_GRID_KERNEL(kb_math1, KB_EW_LOCAL, kb_ew_chunk, KB_K_MATH1)
KB_GRID_KERNEL(kb_math2, KB_EW_LOCAL, kb_ew_chunk, KB_K_MATH2)
KB_GRID_KERNEL(kb_fma, KB_EW_LOCAL, kb_ew_chunk, KB_K_FMA)
KB_GRID_KERNEL(kb_clamp, KB_EW_LOCAL, kb_ew_chunk, KB_K_CLAMP)

/* ---------------------------------------------------------------- number formats */

#define KB_EF_QSPARSE 64u
#define KB_EF_QSCALE 128u

/*
 * DEQUANT (kb_oplog.h): each work-item every KB_EW_LOCAL-th element of a chunk, with the
 * reference's arithmetic (kb_mf_sparse_slot, kb_mf_deq). Slots: 1 elements, 2 the 2:4
 * metadata (raw bytes), 3 the scale; cs[1] / cs[2] are the scale's row / column blocks.
 */
static void kb_dequant_chunk(uint kind, global const kb_ent *e, KB_ARENA_PARAMS,
                             global const uchar *payload, ulong chunk)
{
    ulong n = (ulong)e->rows * e->cols, cbase = chunk * KB_EW_CHUNK;
    uint lid = get_local_id(0), cols = e->cols, flags = e->flags;
    uint d0 = e->dt & 0xFFu, d1 = (e->dt >> 8) & 0xFFu, d2 = (e->dt >> 16) & 0xFFu;
    uint d3 = (e->dt >> 24) & 0xFFu;
    int scaled = (flags & KB_EF_QSCALE) != 0u;
    global uchar *b0 = KB_DST(e);
    global const uchar *b1 = kb_base(KB_ARENA_ARGS, payload, d1, e->off[1]);
    global const uchar *b2 = kb_base(KB_ARENA_ARGS, payload, d2, e->off[2]);
    global const uchar *b3 = kb_base(KB_ARENA_ARGS, payload, d3, e->off[3]);

    (void)kind;
    for (uint it = 0; it < KB_EW_PER; it++) {
        ulong idx = cbase + lid + (ulong)it * KB_EW_LOCAL, row, col;
        float v, s = 0.0f;
        if (idx >= n)
            break;
        if (flags & KB_EF_BIG) {
            row = idx / cols;
            col = idx - row * cols;
        } else {
            uint r32 = (uint)idx / cols;
            row = r32;
            col = (uint)idx - r32 * cols;
        }
        if (scaled)
            s = kb_ld(b3, d3, (row / e->cs[1]) * e->rs[3] + col / e->cs[2]);
        if (flags & KB_EF_QSPARSE) {
            uint g = (uint)(row / 4u);
            int k = kb_mf_sparse_slot((uint)b2[(ulong)(g / 2u) * e->rs[2] + col], g,
                                      (uint)(row % 4u));
            v = k < 0 ? 0.0f : kb_ld(b1, d1, (ulong)(2u * g + (uint)k) * e->rs[1] + col);
        } else {
            v = kb_ld(b1, d1, row * e->rs[1] + col);
        }
        kb_st(b0, d0, row * e->rs[0] + col, kb_mf_deq(v, s, e->imm0, scaled));
    }
}

KB_GRID_KERNEL(kb_dequant, KB_EW_LOCAL, kb_dequant_chunk, 0u)

/* ---------------------------------------------------------------- softmax and reduce */

/*
 * Softmax of the KB_LN_LOCAL lines of unit u (one per work-item), in the reference's order:
 * max, then the sum of exp(x - max) in ascending order, then each exp(x - max) / sum.
 */
static void kb_softmax_unit(uint kind, global const kb_ent *e, KB_ARENA_PARAMS,
                            global const uchar *payload, ulong u)
{
    ulong line = u * KB_LN_LOCAL + get_local_id(0);
    uint d0 = e->dt & 0xFFu, d1 = (e->dt >> 8) & 0xFFu;
    global uchar *db = KB_DST(e);
    global const uchar *sb = kb_base(KB_ARENA_ARGS, payload, d1, e->off[1]);
    uint len = e->cols;
    float m = 0.0f, sum = 0.0f;

    (void)kind;
    if (line >= e->rows)
        return;
    ulong s0 = line * e->rs[1], d0o = line * e->rs[0];
    ulong ss = e->cs[1], ds = e->cs[0];
    for (uint k = 0; k < len; k++) {
        float x = kb_ld(sb, d1, s0 + k * ss);
        m = k == 0 ? x : kb_mf_fmax(m, x);
    }
    for (uint k = 0; k < len; k++)
        sum = kb_mf_add(sum, kb_mf_exp(kb_mf_sub(kb_ld(sb, d1, s0 + k * ss), m)));
    for (uint k = 0; k < len; k++) {
        float x = kb_ld(sb, d1, s0 + k * ss);
        kb_st(db, d0, d0o + k * ds, kb_mf_div(kb_mf_exp(kb_mf_sub(x, m)), sum));
    }
}

/* Sum or max reductions: each work-item one output, its line in ascending order. */
static void kb_reduce_unit(uint kind, global const kb_ent *e, KB_ARENA_PARAMS,
                           global const uchar *payload, ulong u)
{
    ulong line = u * KB_LN_LOCAL + get_local_id(0);
    uint d0 = e->dt & 0xFFu, d1 = (e->dt >> 8) & 0xFFu;
    global uchar *db = KB_DST(e);
    global const uchar *sb = kb_base(KB_ARENA_ARGS, payload, d1, e->off[1]);
    uint len = e->cols;
    int is_max = e->op == 1u;
    float acc = 0.0f;

    (void)kind;
    if (line >= e->rows)
        return;
    ulong s0 = line * e->rs[1], ss = e->cs[1];
    for (uint k = 0; k < len; k++) {
        float x = kb_ld(sb, d1, s0 + k * ss);
        if (is_max)
            acc = k == 0 ? x : kb_mf_fmax(acc, x);
        else
            acc = kb_mf_add(acc, x);
    }
    if (is_max && len == 0u)
        acc = -as_float(KB_MF_INF_BITS);
    kb_st(db, d0, line * e->rs[0], acc);
}

KB_GRID_KERNEL(kb_softmax, KB_LN_LOCAL, kb_softmax_unit, 0u)
KB_GRID_KERNEL(kb_reduce, KB_LN_LOCAL, kb_reduce_unit, 0u)

/* ---------------------------------------------------------------- gemm */

/*
 * One KB_GEMM_TM x KB_GEMM_TN tile of dst per work-group; each work-item owns WM x WN
 * elements (two groups of 4 rows and of 4 columns half a tile apart, so local-memory reads
 * are float4 and conflict-free) and accumulates each of them over k in ascending order,
 * starting from 0 or dst: exactly the reference's sequence of roundings. The product and the
 * sum round separately (FP_CONTRACT OFF), except for f16 x f16 where a * b is exact in f32 and
 * fma gives the same bits at twice the rate. Tiles of A (transposed) and B are converted to
 * f32 in local memory; the next tile's global loads are issued before the current tile is
 * used. The last, partial k step stops at K (no zero padding: adding +0 would turn a -0 sum
 * into +0). A NaN result is stored as the canonical NaN, as ref does: NaN-ness is the same
 * everywhere, the payload a sum propagates is not.
 */
#define KB_GEMM_STEP(k, FMA_)                                                              \
    {                                                                                      \
        float a_[KB_GEMM_WM], b_[KB_GEMM_WN];                                              \
        _Pragma("unroll") for (uint g_ = 0; g_ < KB_GEMM_WM / 4; g_++) {                   \
            float4 v_ = As[((k) * KB_GEMM_LDA + g_ * (KB_GEMM_TM * 4 / KB_GEMM_WM) + ty * 4) / 4]; \
            a_[4 * g_] = v_.x; a_[4 * g_ + 1] = v_.y; a_[4 * g_ + 2] = v_.z; a_[4 * g_ + 3] = v_.w; \
        }                                                                                  \
        _Pragma("unroll") for (uint g_ = 0; g_ < KB_GEMM_WN / 4; g_++) {                   \
            float4 v_ = Bs[((k) * KB_GEMM_LDB + g_ * (KB_GEMM_TN * 4 / KB_GEMM_WN) + tx * 4) / 4]; \
            b_[4 * g_] = v_.x; b_[4 * g_ + 1] = v_.y; b_[4 * g_ + 2] = v_.z; b_[4 * g_ + 3] = v_.w; \
        }                                                                                  \
        _Pragma("unroll") for (uint i_ = 0; i_ < KB_GEMM_WM; i_++)                         \
            _Pragma("unroll") for (uint j_ = 0; j_ < KB_GEMM_WN; j_++)                     \
                FMA_(acc[i_][j_], a_[i_], b_[j_]);                                         \
    }

#define KB_GEMM_FMA(c, a, b) c = fma((a), (b), (c))
#define KB_GEMM_MULADD(c, a, b) c = (c) + (a) * (b)

/* The k loop over all tiles, with FMA_ one of the two update rules above. */
#define KB_GEMM_KLOOP(FMA_)                                                                \
    for (uint kt = 0; kt < ntiles; kt++) {                                                 \
        uint k0 = kt * KB_GEMM_TK;                                                         \
        barrier(CLK_LOCAL_MEM_FENCE);                                                      \
        _Pragma("unroll") for (uint i = 0; i < KB_GEMM_AL; i++) {                          \
            uint x = lid + i * KB_GEMM_NT;                                                 \
            if (x < KB_GEMM_TM * KB_GEMM_TK)                                               \
                ((local float *)As)[(x % KB_GEMM_TK) * KB_GEMM_LDA + x / KB_GEMM_TK] = kb_cvt(da, ra[i]); \
        }                                                                                  \
        _Pragma("unroll") for (uint i = 0; i < KB_GEMM_BL; i++) {                          \
            uint x = lid + i * KB_GEMM_NT;                                                 \
            if (x < KB_GEMM_TN * KB_GEMM_TK)                                               \
                ((local float *)Bs)[(x / KB_GEMM_TN) * KB_GEMM_LDB + x % KB_GEMM_TN] = kb_cvt(dbt, rb[i]); \
        }                                                                                  \
        barrier(CLK_LOCAL_MEM_FENCE);                                                      \
        if (kt + 1u < ntiles)                                                              \
            KB_GEMM_FETCH(k0 + KB_GEMM_TK);                                                \
        if (k0 + KB_GEMM_TK <= K) {                                                        \
            _Pragma("unroll") for (uint kk = 0; kk < KB_GEMM_TK; kk++)                     \
                KB_GEMM_STEP(kk, FMA_)                                                     \
        } else {                                                                           \
            for (uint kk = 0; kk < K - k0; kk++)                                           \
                KB_GEMM_STEP(kk, FMA_)                                                     \
        }                                                                                  \
    }

/*
 * Global loads of the A and B tiles starting at k = kb into ra / rb as raw bits (0 outside
 * the matrix); they are converted when stored to local memory, so no conversion sits between
 * a load and the next one.
 */
#define KB_GEMM_FETCH(kb)                                                                  \
    {                                                                                      \
        _Pragma("unroll") for (uint i = 0; i < KB_GEMM_AL; i++) {                          \
            uint x = lid + i * KB_GEMM_NT;                                                 \
            uint am = x / KB_GEMM_TK, ak = (kb) + x % KB_GEMM_TK;                          \
            ra[i] = (x < KB_GEMM_TM * KB_GEMM_TK && m0 + am < M && ak < K)                 \
                        ? kb_ldraw(ab, da, (ulong)(m0 + am) * lda + ak) : 0u;              \
        }                                                                                  \
        _Pragma("unroll") for (uint i = 0; i < KB_GEMM_BL; i++) {                          \
            uint x = lid + i * KB_GEMM_NT;                                                 \
            uint bk = (kb) + x / KB_GEMM_TN, bn = x % KB_GEMM_TN;                          \
            rb[i] = (x < KB_GEMM_TN * KB_GEMM_TK && bk < K && n0 + bn < N)                 \
                        ? kb_ldraw(bb, dbt, (ulong)bk * ldb + n0 + bn) : 0u;               \
        }                                                                                  \
    }

__attribute__((reqd_work_group_size(KB_GEMM_NT, 1, 1)))
kernel void kb_gemm(KB_ARENA_PARAMS, global const uchar *payload,
                    global const kb_ent *tab, uint first, uint n, ulong units)
{
    local float4 As[KB_GEMM_TK * KB_GEMM_LDA / 4];
    local float4 Bs[KB_GEMM_TK * KB_GEMM_LDB / 4];
    float acc[KB_GEMM_WM][KB_GEMM_WN];
    uint ra[KB_GEMM_AL], rb[KB_GEMM_BL];
    ulong g = get_group_id(0);
    global const kb_ent *e = tab + first + kb_find(tab + first, n, g);
    uint lid = get_local_id(0), tx = lid % KB_GEMM_NTX, ty = lid / KB_GEMM_NTX;
    uint M = e->rows, N = e->cols, K = e->kdim;
    uint tiles_m = (M + KB_GEMM_TM - 1) / KB_GEMM_TM, tiles_n = (N + KB_GEMM_TN - 1) / KB_GEMM_TN;
    uint t = (uint)(g - e->start);
    /* Swizzle: groups of GM tile rows walk the columns together, for L2 reuse of B. */
    uint per_group = KB_GEMM_GM * tiles_n, grp = t / per_group;
    uint first_m = grp * KB_GEMM_GM, gsz = min(tiles_m - first_m, (uint)KB_GEMM_GM);
    uint in_grp = t - grp * per_group;
    uint m0 = (first_m + in_grp % gsz) * KB_GEMM_TM, n0 = (in_grp / gsz) * KB_GEMM_TN;
    uint dd = e->dt & 0xFFu, da = (e->dt >> 8) & 0xFFu, dbt = (e->dt >> 16) & 0xFFu;
    global uchar *db = KB_DST(e);
    global const uchar *ab = kb_base(KB_ARENA_ARGS, payload, da, e->off[1]);
    global const uchar *bb = kb_base(KB_ARENA_ARGS, payload, dbt, e->off[2]);
    ulong ldd = e->rs[0], lda = e->rs[1], ldb = e->rs[2];
    uint ntiles = (K + KB_GEMM_TK - 1) / KB_GEMM_TK;

    (void)units;
    _Pragma("unroll") for (uint i = 0; i < KB_GEMM_WM; i++) {
        uint m = m0 + (i / 4) * (KB_GEMM_TM * 4 / KB_GEMM_WM) + ty * 4 + i % 4;
        _Pragma("unroll") for (uint j = 0; j < KB_GEMM_WN; j++) {
            uint c = n0 + (j / 4) * (KB_GEMM_TN * 4 / KB_GEMM_WN) + tx * 4 + j % 4;
            acc[i][j] = ((e->flags & KB_EF_ACC) && m < M && c < N)
                            ? kb_ld(db, dd, (ulong)m * ldd + c) : 0.0f;
        }
    }
    if (ntiles > 0u)
        KB_GEMM_FETCH(0u);
    if (e->flags & KB_EF_FMA) {
        KB_GEMM_KLOOP(KB_GEMM_FMA)
    } else {
        KB_GEMM_KLOOP(KB_GEMM_MULADD)
    }
    _Pragma("unroll") for (uint i = 0; i < KB_GEMM_WM; i++) {
        uint m = m0 + (i / 4) * (KB_GEMM_TM * 4 / KB_GEMM_WM) + ty * 4 + i % 4;
        _Pragma("unroll") for (uint j = 0; j < KB_GEMM_WN; j++) {
            uint c = n0 + (j / 4) * (KB_GEMM_TN * 4 / KB_GEMM_WN) + tx * 4 + j % 4;
            if (m < M && c < N)
                kb_st(db, dd, (ulong)m * ldd + c, kb_mf_canon(acc[i][j]));
        }
    }
}

/* ---------------------------------------------------------------- kb_tl_nn kinds */

/* Transpose: kb_ew_chunk's strided path; the entry reads the source with swapped strides. */
KB_GRID_KERNEL(kb_transpose, KB_EW_LOCAL, kb_ew_chunk, KB_K_COPY)

/* Unmasked prefix of row i of an ATTN_SOFTMAX record (kb_ref.c's attn_valid); off[2] holds
 * the causal offset as int64 bits. */
static uint kb_attn_valid(global const kb_ent *e, ulong i)
{
    long off = (long)e->off[2], lim;
    uint cols = e->cols;
    if (e->op == 0u || off >= (long)cols)
        return cols;
    if (off < -(long)0xFFFFFFFFul - 1)
        return 0u;
    lim = (long)i + off + 1;
    return lim <= 0 ? 0u : lim >= (long)cols ? cols : (uint)lim;
}

/* Fused attention softmax, one row per work-item, in the reference's order. */
static void kb_attn_softmax_unit(uint kind, global const kb_ent *e, KB_ARENA_PARAMS,
                                 global const uchar *payload, ulong u)
{
    ulong line = u * KB_LN_LOCAL + get_local_id(0);
    uint d0 = e->dt & 0xFFu, d1 = (e->dt >> 8) & 0xFFu;
    global uchar *db = KB_DST(e);
    global const uchar *sb = kb_base(KB_ARENA_ARGS, payload, d1, e->off[1]);
    float scale = e->imm0, cap = e->imm1;
    float m = 0.0f, sum = 0.0f;
    uint nv;

    (void)kind;
    if (line >= e->rows)
        return;
    nv = kb_attn_valid(e, line);
    ulong s0 = line * e->rs[1], d0o = line * e->rs[0];
    for (uint k = 0; k < nv; k++) {
        float y = kb_mf_attn_score(kb_ld(sb, d1, s0 + k), scale, cap);
        m = k == 0 ? y : kb_mf_fmax(m, y);
    }
    for (uint k = 0; k < nv; k++)
        sum = kb_mf_add(sum, kb_mf_exp(kb_mf_sub(kb_mf_attn_score(kb_ld(sb, d1, s0 + k), scale,
                                                                  cap), m)));
    for (uint k = 0; k < e->cols; k++) {
        float v = 0.0f;
        if (k < nv)
            v = kb_mf_div(kb_mf_exp(kb_mf_sub(kb_mf_attn_score(kb_ld(sb, d1, s0 + k), scale,
                                                               cap), m)), sum);
        kb_st(db, d0, d0o + k, v);
    }
}

KB_GRID_KERNEL(kb_attn_softmax, KB_LN_LOCAL, kb_attn_softmax_unit, 0u)

/*
 * Gather (embedding rows): one chunk of KB_EW_CHUNK destination elements per unit; element
 * (i, j) reads id i (off[2], stride rs[2]) and then table element (id, j) (off[1], row
 * stride rs[1], kdim rows). An id that is not an integer in [0, kdim) gives +0.
 */
static void kb_gather_unit(uint kind, global const kb_ent *e, KB_ARENA_PARAMS,
                           global const uchar *payload, ulong chunk)
{
    ulong n = (ulong)e->rows * e->cols;
    uint d0 = e->dt & 0xFFu, d1 = (e->dt >> 8) & 0xFFu, d2 = (e->dt >> 16) & 0xFFu;
    global uchar *db = KB_DST(e);
    global const uchar *tb = kb_base(KB_ARENA_ARGS, payload, d1, e->off[1]);
    global const uchar *ib = kb_base(KB_ARENA_ARGS, payload, d2, e->off[2]);
    ulong first = chunk * KB_EW_CHUNK + get_local_id(0);

    (void)kind;
    for (uint it = 0; it < KB_EW_PER; it++) {
        ulong idx = first + (ulong)it * KB_EW_LOCAL, row, col;
        float x, v;
        if (idx >= n)
            break;
        row = idx / e->cols;
        col = idx - row * e->cols;
        x = kb_ld(ib, d2, row * e->rs[2]);
        v = 0.0f;
        if (x >= 0.0f && x < 4294967296.0f) {
            ulong id = (ulong)x;
            if ((float)id == x && id < (ulong)e->kdim)
                v = kb_ld(tb, d1, id * e->rs[1] + col);
        }
        kb_st(db, d0, row * e->rs[0] + col, v);
    }
}

KB_GRID_KERNEL(kb_gather, KB_EW_LOCAL, kb_gather_unit, 0u)

/* ---------------------------------------------------------------- test data */

/* cl/kb_seedgen.c's generator, the same integer steps (keep the two in step). */
static uint kb_gen_mix(ulong x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdUL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53UL;
    x ^= x >> 33;
    return (uint)x;
}

static float kb_gen_value(uint seed, ulong p)
{
    uint key = kb_gen_mix(((ulong)seed << 32) ^ (p >> 12) ^ 0x9e3779b97f4a7c15UL);
    uint x = (uint)(p & 0xfffUL);
    for (uint r = 0; r < 4u; r++) {
        x = (x + (key >> (r * 5u))) & 0xfffu;
        x = (x * 0x9e5u) & 0xfffu;
        x ^= x >> 5;
        x = (x * 0x2c1u) & 0xfffu;
        x ^= x >> 7;
    }
    return (float)((int)x - 2048) * 0x1p-7f;
}

/* cl/kb_seedgen.c's kb_seedgen_pattern, the same integer steps (keep the two in step). */
static int kb_gen_pattern(ulong i, uint seed, uint range)
{
    uint h = (uint)i * 2654435761u ^ (seed * 0x9e3779b9u + 0x7f4a7c15u);
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    return (int)(h % (2u * range + 1u)) - (int)range;
}

/* ---- GEN op 3 (KB_GEN_QW): a quantized weight's part, generated and quantized here; the
 * same steps as kb_ref.c's exec_gen_qw (keep the two in step). off[1] the row map, off[2] the
 * column map (payload offsets), kdim k, rs[1] nb, rs[2] the part, rs[3] the format, cs[1] the
 * first column, off[3] the first part row, flags EF_QSPARSE. One column per work-item. */

typedef struct kb_qw {
    global const uchar *rows;
    ulong off, rmul, k, blk;
    uint seed, range, fmt;
    int sparse;
    float inv, bsv, bd;
} kb_qw;

static ulong kb_rd64(global const uchar *p)
{
    ulong v = 0;
    for (uint b = 0; b < 8u; b++)
        v |= (ulong)p[b] << (8u * b);
    return v;
}

static float kb_qw_raw(const kb_qw *q, ulong i)
{
    ulong row = kb_rd64(q->rows + 8u * i);
    if (row == 0xFFFFFFFFFFFFFFFFUL)
        return 0.0f;
    return (float)kb_gen_pattern(row * q->rmul + q->off, q->seed, q->range) * q->inv;
}

static uint kb_qw_group(const kb_qw *q, ulong g, float *v)
{
    uint keep;
    for (uint p = 0; p < 4u; p++)
        v[p] = kb_qw_raw(q, 4u * g + p);
    keep = kb_mf_q24_keep(v[0], v[1], v[2], v[3]);
    for (uint p = 0; q->sparse && p < 4u; p++)
        if (p != (keep & 3u) && p != keep >> 2)
            v[p] = 0.0f;
    return keep;
}

static float kb_qw_amax(const kb_qw *q, ulong a, ulong b)
{
    float m = 0.0f, v[4];
    for (ulong i = a; i < b; i++) {
        float x, ab;
        if (q->sparse) {
            if ((i - a) % 4u == 0u)
                kb_qw_group(q, i / 4u, v);
            x = v[i % 4u];
        } else {
            x = kb_qw_raw(q, i);
        }
        ab = kb_mf_math1(KB_MF_M1_ABS, x, 0.0f, 0.0f);
        m = i == a ? ab : kb_mf_fmax(m, ab);
    }
    return m;
}

static void kb_qw_block(kb_qw *q, ulong b)
{
    if (q->blk == b)
        return;
    q->blk = b;
    q->bsv = kb_mf_qmx_scale(kb_qw_amax(q, b * KB_MF_MX_BLOCK, (b + 1u) * KB_MF_MX_BLOCK));
    q->bd = kb_mf_qmx_div(q->bsv);
}

static float kb_qw_elem(kb_qw *q, ulong i, float x, float chan)
{
    if (q->fmt == KB_MF_QF_F16 || q->fmt == KB_MF_QF_BF16)
        return kb_mf_qround(q->fmt, x);
    if (q->fmt == KB_MF_QF_MXINT8) {
        kb_qw_block(q, i / KB_MF_MX_BLOCK);
        return kb_mf_qelem(q->fmt, x, q->bd);
    }
    return kb_mf_qelem(q->fmt, x, chan);
}

static void kb_gen_qw_col(global const kb_ent *e, global uchar *db, global const uchar *payload,
                          uint j)
{
    uint d0 = e->dt & 0xFFu, part = e->rs[2];
    global const uchar *c = payload + e->off[2] + 32u * (ulong)((e->cs[1] + (ulong)j) % e->rs[1]);
    kb_qw q;
    ulong prows;
    float s = 0.0f, v[4];
    int chan;

    q.rows = payload + e->off[1];
    q.off = kb_rd64(c);
    q.rmul = kb_rd64(c + 8);
    q.seed = (uint)kb_rd64(c + 16) & 0xFFFFFFFFu;
    q.range = (uint)(kb_rd64(c + 16) >> 32);
    q.inv = as_float((uint)kb_rd64(c + 24) & 0xFFFFFFFFu);
    q.k = e->kdim;
    q.fmt = e->rs[3];
    q.sparse = (e->flags & KB_EF_QSPARSE) != 0u;
    q.blk = 0xFFFFFFFFFFFFFFFFUL;
    prows = part == 0u ? (q.sparse ? q.k / 2u : q.k)
          : part == 1u ? (q.fmt == KB_MF_QF_MXINT8 ? q.k / KB_MF_MX_BLOCK : 1u) : (q.k + 7u) / 8u;
    chan = q.fmt != KB_MF_QF_F16 && q.fmt != KB_MF_QF_BF16 && q.fmt != KB_MF_QF_MXINT8;
    if (chan && part != 2u)
        s = kb_mf_qchan_scale(q.fmt, kb_qw_amax(&q, 0, q.k));
    for (uint i = 0; i < e->rows; i++) {
        ulong pr = (e->off[3] + i) % prows;
        float out;
        if (part == 1u) {
            if (q.fmt == KB_MF_QF_MXINT8)
                kb_qw_block(&q, pr);
            out = q.fmt == KB_MF_QF_MXINT8 ? q.bsv : s;
        } else if (part == 2u) {
            uint byte = kb_qw_group(&q, 2u * pr, v);
            if (2u * pr + 1u < q.k / 4u)
                byte |= kb_qw_group(&q, 2u * pr + 1u, v) << 4;
            out = (float)(byte >= 128u ? (int)byte - 256 : (int)byte);
        } else if (q.sparse) {
            uint keep = kb_qw_group(&q, pr / 2u, v), at = pr % 2u ? keep >> 2 : keep & 3u;
            out = kb_qw_elem(&q, 4u * (pr / 2u) + at, v[at], s);
        } else {
            out = kb_qw_elem(&q, pr, kb_qw_raw(&q, pr), s);
        }
        kb_st(db, d0, (ulong)i * e->rs[0] + j, out);
    }
}

/*
 * GEN (kb_oplog.h): one chunk of KB_EW_CHUNK destination elements per unit. off[1] tile0,
 * off[2] i0, off[3] n, kdim the seed, rs[1] ntiles (op 1: the sign variant). Op 2 (the
 * benches' pattern): off[1] row0, off[2] col0, off[3] ld, kdim the seed, rs[1] range, cs[1]
 * transposed, imm0 1/den (a power of two: the product is exact), imm1 the term added.
 */
static void kb_gen_unit(uint kind, global const kb_ent *e, KB_ARENA_PARAMS,
                        global const uchar *payload, ulong chunk)
{
    ulong n = (ulong)e->rows * e->cols;
    uint d0 = e->dt & 0xFFu;
    global uchar *db = KB_DST(e);
    ulong first = chunk * KB_EW_CHUNK + get_local_id(0);

    (void)kind;
    if (e->op == 3u) { /* a column per work-item */
        ulong j = chunk * KB_EW_LOCAL + get_local_id(0);
        if (j < e->cols)
            kb_gen_qw_col(e, db, payload, (uint)j);
        return;
    }
    for (uint it = 0; it < KB_EW_PER; it++) {
        ulong idx = first + (ulong)it * KB_EW_LOCAL, row, col, tile, i;
        float v;
        if (idx >= n)
            break;
        row = idx / e->cols;
        col = idx - row * e->cols;
        if (e->op == 2u) {
            ulong r = e->off[1] + row, c = e->off[2] + col;
            ulong p = e->cs[1] ? c * e->off[3] + r : r * e->off[3] + c;
            v = (float)kb_gen_pattern(p, e->kdim, e->rs[1]) * e->imm0 + e->imm1;
            kb_st(db, d0, row * e->rs[0] + col, v);
            continue;
        }
        tile = e->off[1] + row;
        i = e->off[2] + col;
        v = kb_gen_value(e->kdim, tile * e->off[3] + i);
        if (e->op == 1u && i % (ulong)e->rs[1] != tile)
            v = v < 0.0f ? -1.0f : 1.0f;
        kb_st(db, d0, row * e->rs[0] + col, v);
    }
}

KB_GRID_KERNEL(kb_gen, KB_EW_LOCAL, kb_gen_unit, 0u)

/* ---------------------------------------------------------------- device queries */

/*
 * cl/kb_vquery.h: the digest of tiles laid end to end and the check of a seeded all-reduce
 * (CHECK) or other collective (COLL), answered where the data is. kb_vquery.c's plain-C code defines every bit of the results.
 */
#define KB_VQ_BLOCK 65536UL
#define KB_VQ_LOCAL 256

/* Block b's FNV-1a 64 (blocks of KB_VQ_BLOCK bytes of the stream of `total` bytes; tile t of
 * tb bytes at arena + toff[t]): one work-item per block. */
kernel void kb_vq_digest(global const uchar *arena, global const ulong *toff, ulong tb,
                         ulong total, ulong nblocks, global ulong *bh)
{
    for (ulong b = get_global_id(0); b < nblocks; b += get_global_size(0)) {
        ulong a = b * KB_VQ_BLOCK, e = min(total, a + KB_VQ_BLOCK), h = 0xcbf29ce484222325UL;
        while (a < e) {
            ulong t = a / tb, in = a - t * tb, k = min(tb - in, e - a), j = 0;
            global const uchar *p = arena + toff[t] + in;
            if (((size_t)p & 7u) == 0u) {
                for (; j + 8u <= k; j += 8u) {
                    ulong w = *(global const ulong *)(p + j);
                    for (uint q = 0; q < 8u; q++) {
                        h ^= (w >> (8u * q)) & 0xffUL;
                        h *= 0x100000001b3UL;
                    }
                }
            }
            for (; j < k; j++) {
                h ^= (ulong)p[j];
                h *= 0x100000001b3UL;
            }
            a += k;
        }
        bh[b] = h;
    }
}

#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable

/* kb_vq_tile of kb_vquery.h (eight 8-byte fields). */
typedef struct kb_vq_tile {
    double max_err, bound;
    long bad_elem;
    double bad_got, bad_want;
    long nwrong, gq, offgrid;
} kb_vq_tile;

/* The ring chunk of n in T chunks (the first n % T one longer) that holds i. */
static uint kb_vq_chunk(ulong n, uint T, ulong i)
{
    ulong base = n / T, extra = n % T, split = extra * (base + 1UL);
    return (uint)(i < split ? i / (base + 1UL) : extra + (i - split) / base);
}

static long kb_vq_q(float got, long *off)
{
    float q = got * 128.0f;
    if (isfinite(q) && q == floor(q))
        return (long)q;
    *off = 1;
    return 0;
}

/* kb_f16_ulp (cl/kb_dtype.c). */
static float kb_vq_f16ulp(float v)
{
    int ex;
    float a = fabs(v);
    if (isnan(v))
        return v;
    if (isinf(v))
        return INFINITY;
    if (a < 0x1p-14f)
        return 0x1p-24f;
    (void)frexp(a, &ex);
    return ldexp(1.0f, ex - 11);
}

/* Column references ref[i] (kb_vquery.h), and per work-group the grid sum of the references
 * rounded to f16 and whether one is off the grid: wpart[2g], wpart[2g + 1]. */
__attribute__((reqd_work_group_size(KB_VQ_LOCAL, 1, 1)))
kernel void kb_vq_colref(uint seed, uint T, ulong n, uint ordered, global double *ref,
                         global long *wpart)
{
    local long lq[KB_VQ_LOCAL], lo[KB_VQ_LOCAL];
    uint lid = get_local_id(0);
    long q = 0, off = 0;

    for (ulong i = get_global_id(0); i < n; i += get_global_size(0)) {
        double r;
        if (!ordered) {
            double s = 0.0;
            for (uint t = 0; t < T; t++)
                s += (double)kb_gen_value(seed, (ulong)t * n + i);
            r = s;
        } else {
            uint st = kb_vq_chunk(n, T, i), t = st;
            float acc = kb_gen_value(seed, (ulong)st * n + i);
            for (uint k = 1; k < T; k++) {
                float v;
                t = t + 1u == T ? 0u : t + 1u;
                v = acc + kb_gen_value(seed, (ulong)t * n + i);
                acc = k + 1u < T ? kb_cvt(KB_DT_F16, kb_enc(KB_DT_F16, v)) : v;
            }
            r = (double)acc;
        }
        ref[i] = r;
        q += kb_vq_q(kb_cvt(KB_DT_F16, kb_enc(KB_DT_F16, (float)r)), &off);
    }
    lq[lid] = q;
    lo[lid] = off;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint s = KB_VQ_LOCAL / 2; s > 0; s >>= 1) {
        if (lid < s) {
            lq[lid] += lq[lid + s];
            lo[lid] |= lo[lid + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) {
        wpart[2 * get_group_id(0)] = lq[0];
        wpart[2 * get_group_id(0) + 1] = lo[0];
    }
}

/*
 * Work-group g checks columns [s * slab, (s + 1) * slab) of tile g / nslab (s = g % nslab)
 * against ref and writes its kb_vq_tile part: the largest error with the smallest column
 * among equals (the first occurrence), the first failing column, the counts and sums.
 */
/* The work-group's reduction of its items' parts of a tile (first worst error, first failing
 * column, counts and sums) into part: the same bits whatever the order the items ran in. */
static void kb_vq_tile_reduce(uint lid, local double *lme, local double *lmb, local long *lmi,
                              local long *lbi, local double *lbg, local double *lbw,
                              local long *lnw, local long *lgq, local long *lof,
                              global kb_vq_tile *p)
{
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint s = KB_VQ_LOCAL / 2; s > 0; s >>= 1) {
        if (lid < s) {
            uint o = lid + s;
            if (lme[o] > lme[lid] || (lme[o] == lme[lid] && lmi[o] < lmi[lid])) {
                lme[lid] = lme[o];
                lmb[lid] = lmb[o];
                lmi[lid] = lmi[o];
            }
            if (lbi[o] < lbi[lid]) {
                lbi[lid] = lbi[o];
                lbg[lid] = lbg[o];
                lbw[lid] = lbw[o];
            }
            lnw[lid] += lnw[o];
            lgq[lid] += lgq[o];
            lof[lid] |= lof[o];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) {
        p->max_err = lme[0];
        p->bound = lmb[0];
        p->bad_elem = lbi[0] == LONG_MAX ? -1L : lbi[0];
        p->bad_got = lbg[0];
        p->bad_want = lbw[0];
        p->nwrong = lnw[0];
        p->gq = lgq[0];
        p->offgrid = lof[0];
    }
}

__attribute__((reqd_work_group_size(KB_VQ_LOCAL, 1, 1)))
kernel void kb_vq_check(global const uchar *arena, global const ulong *toff, ulong n, ulong slab,
                        uint nslab, double acc_bound, global const double *ref,
                        global kb_vq_tile *part)
{
    local double lme[KB_VQ_LOCAL], lmb[KB_VQ_LOCAL], lbg[KB_VQ_LOCAL], lbw[KB_VQ_LOCAL];
    local long lmi[KB_VQ_LOCAL], lbi[KB_VQ_LOCAL], lnw[KB_VQ_LOCAL], lgq[KB_VQ_LOCAL],
        lof[KB_VQ_LOCAL];
    uint g = get_group_id(0), lid = get_local_id(0);
    ulong c0 = (ulong)(g % nslab) * slab, c1 = min(n, c0 + slab);
    global const uchar *tile = arena + toff[g / nslab];
    double me = -1.0, mb = 0.0, bg = 0.0, bw = 0.0;
    long mi = LONG_MAX, bi = LONG_MAX, nw = 0, gq = 0, off = 0;

    for (ulong i = c0 + lid; i < c1; i += KB_VQ_LOCAL) {
        uint h = (uint)tile[2 * i] | ((uint)tile[2 * i + 1] << 8);
        float gf = kb_cvt(KB_DT_F16, h);
        double ex = ref[i];
        uint wb = kb_enc(KB_DT_F16, (float)ex);
        double bound = 0.5 * (double)kb_vq_f16ulp((float)ex) + acc_bound;
        double e = fabs((double)gf - ex);
        int ok = acc_bound > 0.0 ? e <= bound : h == wb;
        if (isnan(e))
            e = INFINITY;
        if (e > me) {
            me = e;
            mb = bound;
            mi = (long)i;
        }
        nw += !ok;
        if (!ok && bi == LONG_MAX) {
            bi = (long)i;
            bg = (double)gf;
            bw = (double)kb_cvt(KB_DT_F16, wb);
        }
        gq += kb_vq_q(gf, &off);
    }
    lme[lid] = me;
    lmb[lid] = mb;
    lmi[lid] = mi;
    lbi[lid] = bi;
    lbg[lid] = bg;
    lbw[lid] = bw;
    lnw[lid] = nw;
    lgq[lid] = gq;
    lof[lid] = off;
    kb_vq_tile_reduce(lid, lme, lmb, lmi, lbi, lbg, lbw, lnw, lgq, lof, part + g);
}

/* The sum of column i over the T ranks (kb_vquery.c's column_sum): ordered, the ring's chain
 * from rank `start`, in f32 rounded to f16 after every hop but the last; else in ascending
 * rank order, in double. */
static double kb_vq_colsum(uint seed, uint T, ulong n, uint ordered, uint start, ulong i)
{
    if (!ordered) {
        double s = 0.0;
        for (uint t = 0; t < T; t++)
            s += (double)kb_gen_value(seed, (ulong)t * n + i);
        return s;
    }
    uint t = start;
    float acc = kb_gen_value(seed, (ulong)t * n + i);
    for (uint k = 1; k < T; k++) {
        float v;
        t = t + 1u == T ? 0u : t + 1u;
        v = acc + kb_gen_value(seed, (ulong)t * n + i);
        acc = k + 1u < T ? kb_cvt(KB_DT_F16, kb_enc(KB_DT_F16, v)) : v;
    }
    return (double)acc;
}

/* KB_VQ_COLL's reference of element (t, i) (kb_vquery_coll_ref; coll: KB_VQ_C_*). */
static double kb_vq_collref(uint coll, uint seed, uint T, ulong n, uint root, uint ordered,
                            uint t, ulong i)
{
    ulong c = n / T, j = i;
    uint src = t;
    switch (coll) {
    case 1u: /* all-gather */
        src = (uint)(i / c);
        break;
    case 5u: /* all-to-all */
        src = (uint)(i / c);
        j = (ulong)t * c + i % c;
        break;
    case 3u: /* broadcast */
        src = root;
        break;
    case 6u: /* send/recv east */
        src = T < 2u ? t : (t + T - 1u) % T;
        break;
    case 2u: /* reduce-scatter */
        if (i / c == (ulong)t)
            return kb_vq_colsum(seed, T, n, ordered, (t + 1u) % T, i);
        break;
    case 4u: /* reduce */
        if (t == root)
            return kb_vq_colsum(seed, T, n, ordered, (root + 1u) % T, i);
        break;
    default:
        break;
    }
    return (double)kb_gen_value(seed, (ulong)src * n + j);
}

/*
 * KB_VQ_COLL: work-group g checks columns [s * slab, (s + 1) * slab) of tile g / nslab
 * (s = g % nslab), each against its reference computed here, and writes its kb_vq_tile part
 * (as kb_vq_check) and the grid sum of its rounded references and whether one is off the
 * grid: wpart[2g], wpart[2g + 1].
 */
__attribute__((reqd_work_group_size(KB_VQ_LOCAL, 1, 1)))
kernel void kb_vq_coll(global const uchar *arena, global const ulong *toff, ulong n, ulong slab,
                       uint nslab, double acc_bound, uint coll, uint seed, uint T, uint root,
                       uint ordered, global kb_vq_tile *part, global long *wpart)
{
    local double lme[KB_VQ_LOCAL], lmb[KB_VQ_LOCAL], lbg[KB_VQ_LOCAL], lbw[KB_VQ_LOCAL];
    local long lmi[KB_VQ_LOCAL], lbi[KB_VQ_LOCAL], lnw[KB_VQ_LOCAL], lgq[KB_VQ_LOCAL],
        lof[KB_VQ_LOCAL], lwq[KB_VQ_LOCAL], lwo[KB_VQ_LOCAL];
    uint g = get_group_id(0), lid = get_local_id(0), t = g / nslab;
    ulong c0 = (ulong)(g % nslab) * slab, c1 = min(n, c0 + slab);
    global const uchar *tile = arena + toff[t];
    double me = -1.0, mb = 0.0, bg = 0.0, bw = 0.0;
    long mi = LONG_MAX, bi = LONG_MAX, nw = 0, gq = 0, off = 0, wq = 0, wo = 0;

    for (ulong i = c0 + lid; i < c1; i += KB_VQ_LOCAL) {
        uint h = (uint)tile[2 * i] | ((uint)tile[2 * i + 1] << 8);
        float gf = kb_cvt(KB_DT_F16, h);
        double ex = kb_vq_collref(coll, seed, T, n, root, ordered, t, i);
        uint wb = kb_enc(KB_DT_F16, (float)ex);
        float wf = kb_cvt(KB_DT_F16, wb);
        double bound = 0.5 * (double)kb_vq_f16ulp((float)ex) + acc_bound;
        double e = fabs((double)gf - ex);
        int ok = acc_bound > 0.0 ? e <= bound : h == wb;
        if (isnan(e))
            e = INFINITY;
        if (e > me) {
            me = e;
            mb = bound;
            mi = (long)i;
        }
        nw += !ok;
        if (!ok && bi == LONG_MAX) {
            bi = (long)i;
            bg = (double)gf;
            bw = (double)wf;
        }
        gq += kb_vq_q(gf, &off);
        wq += kb_vq_q(wf, &wo);
    }
    lme[lid] = me;
    lmb[lid] = mb;
    lmi[lid] = mi;
    lbi[lid] = bi;
    lbg[lid] = bg;
    lbw[lid] = bw;
    lnw[lid] = nw;
    lgq[lid] = gq;
    lof[lid] = off;
    lwq[lid] = wq;
    lwo[lid] = wo;
    kb_vq_tile_reduce(lid, lme, lmb, lmi, lbi, lbg, lbw, lnw, lgq, lof, part + g);
    /* the reference's grid sum too (the barrier at the helper's end orders these) */
    for (uint s = KB_VQ_LOCAL / 2; s > 0; s >>= 1) {
        if (lid < s) {
            lwq[lid] += lwq[lid + s];
            lwo[lid] |= lwo[lid + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) {
        wpart[2 * g] = lwq[0];
        wpart[2 * g + 1] = lwo[0];
    }
}
#endif

/* ---------------------------------------------------------------- byte fill */

/*
 * n bytes from byte offset off of a set to `byte` (the resident arena's poison fill). Used
 * instead of clEnqueueFillBuffer, which on NVIDIA's OpenCL (CUDA 13.0 driver, H100) kills
 * the queue for a 1-byte pattern at offsets of 2 GiB and more. 16-byte stores on the
 * aligned middle, single bytes at the ends; any global size works (grid-stride loop).
 */
kernel void kb_fill_bytes(global uchar *a, ulong off, ulong n, uint byte)
{
    ulong gid = get_global_id(0), gsz = get_global_size(0);
    ulong head = min((16ul - (off & 15ul)) & 15ul, n);
    ulong body = (n - head) / 16ul, tail0 = head + body * 16ul;
    uint w = (byte & 0xFFu) * 0x01010101u;
    global uint4 *p = (global uint4 *)(a + off + head);

    if (gid < head)
        a[off + gid] = (uchar)byte;
    for (ulong i = gid; i < body; i += gsz)
        p[i] = (uint4)(w, w, w, w);
    if (gid < n - tail0)
        a[off + tail0 + gid] = (uchar)byte;
}
