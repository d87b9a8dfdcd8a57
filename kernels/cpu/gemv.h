/* gemv.h - kiln's own product of one row by a small constant matrix, for
 * the products where a call into oneDNN costs more than the arithmetic:
 * the recurrent ops' per-step product of the hidden state by R^T
 * (ops_rnn.c), and MatMul and Gemm of a few rows by constant weights
 * (ops_nn.c), as a small model serves one request. Private to
 * kernels/cpu/.
 *
 * The matrix is packed once (cpu_gemv_pack, in an op's prepare) into
 * panels of CPU_GEMV_PANEL columns (the last one narrower), each panel's k
 * rows stored one after another with the panel's width as row stride: a
 * panel streams from cache as one run of memory, where a plain row-major
 * matrix would have its rows a whole n apart. A packed k x n matrix takes
 * k * n floats, as the plain one.
 *
 * Each output sums over k in order on every path (AVX-512, AVX2 and the
 * baseline, picked by the ISA oneDNN runs: dnnl_util_isa_level, so
 * ONEDNN_MAX_CPU_ISA reaches these loops too), so the paths differ only by
 * FMA's single rounding. No state; any thread. */
#ifndef KILN_CPU_GEMV_H
#define KILN_CPU_GEMV_H

#include <stdint.h>

/* Columns per panel: the outputs one pass of the AVX-512 loop holds in
 * registers (8 x 16). */
#define CPU_GEMV_PANEL 128

/* Packs the k x n matrix whose element (j, c) (row j, column c) is
 * src[j * sk + c * sn] into dst (k * n floats), in the panels
 * cpu_gemv reads. sk = n, sn = 1 for a row-major [k, n] matrix; sk = 1,
 * sn = k for its transpose stored as [n, k]. */
void cpu_gemv_pack(const float *src, int64_t k, int64_t n, int64_t sk, int64_t sn, float *dst);

/* out[0, n) = x[0, k) times the packed k x n matrix pk. */
void cpu_gemv(const float *x, int64_t k, const float *pk, int64_t n, float *out);

#endif
