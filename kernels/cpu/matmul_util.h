/* matmul_util.h - the matrix products of the neural-network family
 * (ops_nn.c), shared with the contrib operators that are matrix products
 * too (ops_contrib_matmul.c): the float product on a oneDNN matmul
 * primitive and the exact 8-bit integer product, with numpy's shape rule.
 * Private to kernels/cpu/. */
#ifndef KILN_CPU_MATMUL_UTIL_H
#define KILN_CPU_MATMUL_UTIL_H

#include <stdint.h>

#include "kernels/cpu/dnnl_util.h"
#include "kernels/ops.h"

/* A oneDNN matmul: dst = alpha * (A x B) [+ bias] [+ beta * dst] then the
 * node's fused activation. Made by cpu_mm_build in prepare (calloc'ed by
 * the caller), freed by cpu_mm_release (NULL is a no-op). */
struct cpu_mm_state {
    struct dnnl_prim *prim;
    void *wbuf;         /* B in the primitive's layout (shared), or NULL */
    float *bias;        /* Gemm: beta * C precomputed (owned), or NULL */
    int act_after;
    int nargs;
    int fill_c;         /* Gemm: dst starts as beta * broadcast(C), summed into */
    float beta;         /* Gemm's beta, for fill_c */
    int64_t m, n;
    /* A few rows by a small constant B (ops_nn.c: MatMul and Gemm) run on
     * cpu_gemv (gemv.h) instead of prim: B packed for it (owned), A's
     * width, and Gemm's alpha. */
    float *packed;
    int64_t k;
    float alpha;
};

/* Builds s's primitive for the src/weights/bias/dst descriptors (bias_md
 * may be NULL). b_const, when not NULL, is B's constant data in b_md's
 * layout: it is reordered once into the layout oneDNN prefers (shared by
 * the plans that ask for the same bytes) and must outlive s. Execute with
 * dnnl_prim_exec and args {A, B, dst, bias}. */
int cpu_mm_build(struct op_call *c, struct cpu_mm_state *s, const dnnl_memory_desc_t *a_md,
                 const dnnl_memory_desc_t *b_md, const void *b_const, const dnnl_memory_desc_t *bias_md,
                 const dnnl_memory_desc_t *dst_md, float alpha, int with_sum, size_t *scratch_size);
void cpu_mm_release(void *st);

/* numpy matmul shapes: a 1-D A is [1,K] and a 1-D B is [K,1], their extra
 * dim dropped from the result; batch dims broadcast. */
struct cpu_mm_shape {
    int r;                                    /* rank of the padded operands */
    int64_t a[TENSOR_MAX_DIMS], b[TENSOR_MAX_DIMS], y[TENSOR_MAX_DIMS];
};

/* Fills sh from A's and B's shapes, and y's shape (float32) when y is not
 * NULL; op_error when they do not multiply. */
int cpu_mm_shapes(struct op_call *c, const struct tensor *a, const struct tensor *b, struct cpu_mm_shape *sh,
                  struct tensor *y);

/* ---- 8-bit integer products ---- */

int cpu_is_q8(enum dtype t);
/* t must be uint8 or int8 (STATUS_UNSUPPORTED after op_error otherwise). */
int cpu_need_q8(struct op_call *c, const struct tensor *t, const char *what);
/* A zero point or scale: absent (0 / 1), one value, or one per index. */
int cpu_qparam_ok(struct op_call *c, const struct tensor *t, int64_t per, const char *what);
double cpu_qparam_at(const struct tensor *t, int64_t i, double def);
/* Rounds v half to even and saturates it into element i of y (uint8 or int8). */
void cpu_q8_store(void *y, enum dtype dt, int64_t i, double v);
/* Widens an 8-bit tensor to int32 minus its zero point; zp is indexed by
 * (i / zp_div) % zp_mod. */
void cpu_q8_widen(const struct tensor *t, const struct tensor *zp, int64_t zp_div, int64_t zp_mod, int32_t *out);
/* int32 batched matmul with numpy broadcasting over widened operands. */
void cpu_imm_run(const struct cpu_mm_shape *sh, const int32_t *a, const int32_t *b, int32_t *acc, int nthreads);
/* Scratch of an integer matmul: widened A and B, and (with_acc) the int32 sums. */
size_t cpu_imm_scratch(const struct tensor *a, const struct tensor *b, const struct tensor *y, int with_acc);
/* Widens A and B (minus their zero points) into c's scratch and points
 * *a32, *b32 (and *acc, when acc is not NULL) into it. */
int cpu_imm_widened(struct op_call *c, const struct cpu_mm_shape *sh, const struct tensor *a, const struct tensor *za,
                    const struct tensor *b, const struct tensor *zb, int32_t **a32, int32_t **b32, int32_t **acc);

/* ---- the exact 8-bit product on oneDNN (qgemm.c) ---- */

/* Y[M, N] (int32) = sum_k (A[m, k] - za) (B[k, n] - zb[n]) for a constant
 * 2-D B (uint8 or int8) and zero point zb (absent, one value or N), A of
 * either 8-bit type with one zero point given at run time: oneDNN's u8 x s8
 * int32 matmul with the zero points and type shifts taken out
 * algebraically (see qgemm.c), exact on every ISA. Built in prepare, freed
 * by cpu_qgemm_free (which zeroes it; a zeroed one is a no-op). */
struct cpu_qgemm {
    struct dnnl_prim *prim;
    void *wbuf;          /* B (- 128) as int8 in the primitive's layout (shared) */
    int32_t *colsum;     /* per column: sum_k B'[k, n] */
    int32_t *zb;         /* per column: zb[n] (- 128) */
    int64_t m, k, n;
    int a_s8;            /* A is int8: shifted by +128 at run time */
    int split;           /* no VNNI: A runs as two 4-bit halves */
    int nthreads;        /* the threads it was built for (and runs on) */
    size_t dnnl_scratch;
};

/* Whether B and zb allow cpu_qgemm: constant, 2-D, 8-bit. */
int cpu_qgemm_usable(const struct tensor *b, const struct tensor *zb);
/* Builds q for A of m rows and type a_dt; sets *scratch_size (the run's
 * scratch). 0, or a negative status after op_error (q then zeroed). */
int cpu_qgemm_build(struct op_call *c, struct cpu_qgemm *q, int64_t m, enum dtype a_dt, const struct tensor *b,
                    const struct tensor *zb, size_t *scratch_size);
/* The same with B given as its transpose: bt [N, K] row-major (a
 * convolution's weights [M, C * kernel]); zb per row of bt. */
int cpu_qgemm_build_bt(struct op_call *c, struct cpu_qgemm *q, int64_t m, enum dtype a_dt, const struct tensor *bt,
                       const struct tensor *zb, size_t *scratch_size);
size_t cpu_qgemm_scratch(const struct cpu_qgemm *q);
/* The float epilogue of the dynamic-quantization operators: y =
 * act((float)sum * (a_scale * b_scale[n]) + bias[n]), the float
 * operations of quantize_dynamic's Cast, Mul and Add. */
struct cpu_qgemm_epi {
    float a_scale;
    const float *b_scale; /* 1 value, or n (b_scale_per) */
    int b_scale_per;
    const float *bias;    /* n values, or NULL */
    enum act_kind act;
    float act_a, act_b;
};

/* Y = the product of A (m x k, row-major, a_dt as built) with zero point
 * za and q's B, into y (m x n int32; with epi, the float results of the
 * epilogue in the same bytes); uses c->scratch (cpu_qgemm_scratch bytes).
 * Safe from several threads at once on different scratch. */
int cpu_qgemm_run(struct op_call *c, const struct cpu_qgemm *q, const void *a, enum dtype a_dt, int32_t za,
                  int32_t *y, const struct cpu_qgemm_epi *epi);
void cpu_qgemm_free(struct cpu_qgemm *q);

/* DynamicQuantizeLinear of n floats: y = saturate(round(x / scale) + zp)
 * over [min(0, min x), max(0, max x)] mapped onto [0, 255], as ONNX's
 * reference computes it; returns the scale and sets *zp. */
float cpu_dynquant_u8(const float *x, int64_t n, uint8_t *y, uint8_t *zp);

#endif
