/*
 * kb_hostgemm — the benches' host reference for gemm: the f64 product C = A @ B of f32
 * inputs with the f32-accumulation error allowance, fast enough for 4096^3 (68.7 G
 * multiply-adds) — blocked over rows, columns and K, vectorised (an AVX2 copy beside the
 * baseline one, KB_VECTOR_CLONES), rows split over threads — and a checker that compares a
 * read-back output with it block by block without holding the whole product.
 *
 * Every element is computed exactly as the plain triple loop does: s = sum over k in
 * ascending order of (double)a_ik * (double)b_kj, sa = the same sum of |products|, each
 * product and addition rounded once (no contraction: C11 mode), so the results do not depend
 * on the blocking or on the number of threads. bound = K * 2^-24 * sa (docs/phase2.md).
 * When the inputs lie on grids coarse enough that every sum is exact in f32 (small integers
 * times powers of two, as the benches' patterns are), the same loops run in f32 at twice the
 * width: exact sums, so the same values.
 * Limits: row-major dense inputs; threads only for products of at least 2^24 multiply-adds
 * (one per online CPU, at most KB_HOSTGEMM_THREADS).
 */
#ifndef KB_HOSTGEMM_H
#define KB_HOSTGEMM_H

#include <stddef.h>

#include "kb_bench.h"

#define KB_HOSTGEMM_THREADS 16

/* ref (M x N) = a (M x K) @ b (K x N) in f64; bound[i] = K * 2^-24 * sum|a||b|. Returns 0 or
 * KB_ERR_NOMEM. */
int kb_hostgemm_ref(const float *a, const float *b, size_t M, size_t N, size_t K, double *ref,
                    double *bound);

/*
 * Checks got (M x N: the output read back as f32, stored as dt) against that reference, as
 * kb_bench_check(r, dt, got, ref, bound, M * N, what) would: the same worst error in r, the
 * same first failing element (its row-major index) in r->detail. Returns 1 when every
 * element passes, 0 when one fails, KB_ERR_NOMEM (< 0) when out of memory.
 */
int kb_hostgemm_check(kb_bench_result *r, kb_dtype dt, const float *got, const float *a,
                      const float *b, size_t M, size_t N, size_t K, const char *what);

#endif
