/*
 * kb_decoder_int — what the files of the decoder layer share with each other and nobody else:
 * the argument layout of its kernels (the kb_kargs slots each kernel reads, by name), the
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

/* Each kernel's slots: a->i[*K_*] integers, a->ptr[*P_*] VAs (a weight takes three: its
 * values, scales and metadata, kb_qweight), a->f[] as the kernel says. */

/* row owners (norms and residual adds; RK_MODE 0: input norm, 1: residual + norms, 2: the
 * last residual; f[0]: the norm's eps, f[1]: its unit offset) */
enum { RK_MODE, RK_RC, RK_D, RK_SP, RK_PIECE, RK_POST, RK_T, RK_ACT, RK_NCOPY };
enum { RP_X, RP_LNA, RP_LNB, RP_SUM, RP_OUT, RP_NORM };

/* QKV + RoPE */
enum { QK_T, QK_D, QK_C, QK_P, QK_NROPE, QK_HD, QK_TB, QK_FLAGS };
enum { QP_IN, QP_W, QP_WS, QP_WM, QP_COS, QP_SIN, QP_OUT };

/* prefill attention + its W_o rows (f[0]: the query scale, f[1]: the soft-cap) */
enum { AK_SEQ, AK_QROWS, AK_QB, AK_NQ, AK_NKV, AK_P, AK_C, AK_HD, AK_T, AK_D, AK_FLAGS,
       AK_ITEMS };
enum { AP_QKV, AP_WO, AP_WOS, AP_WOM, AP_PART };

/* decode: split-KV attention (f[0], f[1] as for prefill) and its combination */
enum { DK_CH, DK_CLEN, DK_KVLEN, DK_NQ, DK_NKV, DK_P, DK_C, DK_HD, DK_T, DK_FLAGS, DK_ITEMS };
enum { DP_QKV, DP_KC, DP_VC, DP_OUT };
enum { CK_CH, CK_NQ, CK_NKV, CK_HD, CK_T, CK_D, CK_FLAGS, CK_ITEMS };
enum { CP_DPART, CP_WO, CP_WOS, CP_WOM, CP_PART };

/* MLP: gate/up columns and down rows of one PE */
enum { MK_T, MK_D, MK_CF, MK_TB, MK_FLAGS, MK_ACT };
enum { MP_IN, MP_WG, MP_WGS, MP_WGM, MP_WU, MP_WUS, MP_WUM, MP_WD, MP_WDS, MP_WDM, MP_PART };

/* kb_decoder_kernels.c: the kernels (kb_kernel_fn), one per launch of the forward pass. */
void kb_decoder_rows_kernel(kb_tl *tl, const kb_kargs *a);
void kb_decoder_qkv_kernel(kb_tl *tl, const kb_kargs *a);
void kb_decoder_attn_kernel(kb_tl *tl, const kb_kargs *a);
void kb_decoder_dattn_kernel(kb_tl *tl, const kb_kargs *a);
void kb_decoder_dcomb_kernel(kb_tl *tl, const kb_kargs *a);
void kb_decoder_mlp_kernel(kb_tl *tl, const kb_kargs *a);

#endif
