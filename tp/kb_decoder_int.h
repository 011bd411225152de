/*
 * kb_decoder_int — what the files of the decoder layer share with each other and nobody else:
 * the argument structs of its kernels (what each kernel reads, by name and type), the
 * flags word that carries the number formats, and the kernels themselves, which
 * kb_decoder_fwd.c launches. The files: kb_decoder.c (the plan, the rank's tensors and
 * weights), kb_decoder_kernels.c (the kernels), kb_decoder_fwd.c (the forward pass and its
 * time split) and kb_decoder_ref.c (the host f64 reference). Internal: not installed
 * (CMakeLists.txt leaves it out of include/kbcl) and included by those files only.
 */
#ifndef KB_DECODER_INT_H
#define KB_DECODER_INT_H

#include "kb_decoder.h"
#include "kb_tl.h"

/* flags word: fmt | sparse << 8 | act dtype << 16 */
#define FLAGS(fmt, sp, act) ((int64_t)(fmt) | (int64_t)(sp) << 8 | (int64_t)(act) << 16)
#define F_FMT(x) ((kb_qfmt)((x)&0xff))
#define F_SPARSE(x) ((int)(((x) >> 8) & 0xff))
#define F_ACT(x) ((kb_dtype)(((x) >> 16) & 0xff))
/* SchedulerV2 stages the kernel takes (kb_tl_set_stages; 0: the default) */
#define F_STAGES(x) ((int)(((x) >> 24) & 0xff))
/* the kernel's stores to other PEs go posted, several at once (tl_store_async; machine) */
#define F_POSTED ((int64_t)1 << 32)
#define F_IS_POSTED(x) (((x)&F_POSTED) != 0)

/* Each kernel's arguments (kb_kargs' typed block: KB_KARGS_PUT / KB_KARGS_GET). Shapes are
 * the plan's (kb_decoder_plan); flags is FLAGS(); weights take three VAs. */

/* A weight's parts: its values, scales and metadata (kb_qweight; 0 where it has none). */
typedef struct kb_dec_wva {
    kb_va q, scale, meta;
} kb_dec_wva;

/* row owners: norms and residual adds. mode 0: the input norm (lnb) of x into norm; 1: the
 * summed partials (sum; normed with lna when post) plus the residual x into out, its norm
 * (lnb) into norm; 2: the same sum plus the f32 residual x into out, no norm. */
typedef struct kb_dec_rows_args {
    kb_va x, lna, lnb, sum, out, norm;
    int64_t rc, d, piece, T;
    int64_t ncopy;      /* the gemm PEs' copies of norm per token group (without seq_parallel) */
    int64_t cstride;    /* copy k of group g is block (g ncopy + k) cstride: 1, or with shared
                           copies the gemm grid's PEs per cube (one copy per cube) */
    int64_t tr;         /* rows of a token group (the copies hold a group's rows; naive: T) */
    int64_t sblock;     /* row owner j's sum rows start at j * sblock + r0 (naive: the
                           all-reduced per-PE blocks, T; machine: the SIP sum's, 0) */
    int mode, sp, post; /* sp: seq_parallel; post: the model's post norms */
    int posted;         /* stores posted, all in flight at once (tl_store_async; machine) */
    kb_dtype act;
    double eps, off;    /* the norm's eps and unit offset */
} kb_dec_rows_args;

/* QKV + RoPE */
typedef struct kb_dec_qkv_args {
    kb_va in, cos, sin, out;
    kb_dec_wva w;
    int64_t T, d, c, p, hd, tb, flags;
    int64_t nrope;      /* head units that take RoPE (the queries' and keys') */
    int64_t ncol, tr;   /* token groups: column blocks per group, rows per group */
    int shared;         /* machine decode: PE j reads its cube's copy, block (j / shared) shared
                           (shared: the grid's PEs per cube); 0: its own block j */
    /* machine: the K and V blocks also into every attention cube's copy (rep: rep_cubes
     * copies of 2 nkv T rows of hd, K of each local KV head then V, rep_rows per PE) */
    kb_va rep;
    int64_t rep_cubes, rep_rows, nq, nkv;
    int64_t seq, qb, qrows, apes, items; /* a cube's items, to copy only the rows they read */
    int64_t ocol;       /* PEs per attention item (kb_decoder_plan) */
} kb_dec_qkv_args;

/* prefill attention + its W_o rows */
typedef struct kb_dec_attn_args {
    kb_va qkv, part;
    kb_dec_wva wo;
    int64_t seq, qrows, qb, nq, nkv, p, c, hd, T, d, flags, items;
    int64_t ncol, tr;   /* the QKV blocks' token groups (kb_dec_qkv_args) */
    int own;            /* machine: items of every head (K, V from the cube's copy rep, rows
                           of rep_rows per PE, apes PEs per cube), W_o's rank rows, the SIP's
                           O rows straight into sum (row owners' blocks of rc rows) */
    kb_va rep, sum;
    int64_t rep_rows, apes, rc;
    int64_t ocol;       /* machine: PEs per item, each with d / ocol columns of W_o */
    double qscale, softcap;
} kb_dec_attn_args;

/* decode: split-KV attention (qscale, softcap as for prefill) and its combination */
typedef struct kb_dec_dattn_args {
    kb_va qkv, kc, vc, out;
    int64_t chunks, clen, kv_len, nq, nkv, p, c, hd, T, flags, items;
    int fast;           /* machine: the query and new K/V blocks loaded at once, one store */
    double qscale, softcap;
} kb_dec_dattn_args;
typedef struct kb_dec_dcomb_args {
    kb_va dpart, part;
    kb_dec_wva wo;
    int64_t chunks, nq, nkv, hd, T, d, flags, items;
    int64_t ccol;       /* PEs per item, each with d / ccol columns of W_o (kb_decoder_plan) */
    int fast;           /* machine: every chunk's partials loaded at once, combined in bulk */
    kb_va sum;          /* dsum: the SIP's sum rows (T x d f32), each PE's column block of its
                           sequence's row stored there instead of into its own partial */
} kb_dec_dcomb_args;

/* MLP: gate/up columns and down rows of one PE */
typedef struct kb_dec_mlp_args {
    kb_va in, part;
    kb_dec_wva wg, wu, wd;
    int64_t T, d, cf, tb, flags;
    int64_t ncol, tr;   /* token groups (kb_dec_qkv_args); the partial holds the group's rows */
    int shared;         /* kb_dec_qkv_args */
    int act;            /* the gated activation (kb_model_act) */
} kb_dec_mlp_args;

/* machine: row owner j's rows [j*rc, (j+1)*rc) of the MLP PEs' partials (token group g's
 * ncol PEs, tr rows each) summed into its block of out. */
typedef struct kb_dec_gsum_args {
    kb_va src, out;
    int64_t rc, d;
    int64_t ncol, tr;
} kb_dec_gsum_args;

/* kb_decoder_kernels.c: the kernels (kb_kernel_fn), one per launch of the forward pass. */
void kb_decoder_rows_kernel(kb_tl *tl, const kb_kargs *a);
void kb_decoder_qkv_kernel(kb_tl *tl, const kb_kargs *a);
void kb_decoder_attn_kernel(kb_tl *tl, const kb_kargs *a);
void kb_decoder_dattn_kernel(kb_tl *tl, const kb_kargs *a);
void kb_decoder_dcomb_kernel(kb_tl *tl, const kb_kargs *a);
void kb_decoder_mlp_kernel(kb_tl *tl, const kb_kargs *a);
void kb_decoder_gsum_kernel(kb_tl *tl, const kb_kargs *a);

#endif
