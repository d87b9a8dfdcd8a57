/* kernels.h - kiln's custom CUDA kernels, one launcher per kernel family.
 *
 * Each family lives in its own kernels/cuda/k_<family>.cu, built by nvcc for
 * the GPU and, with -DKILN_CUDA_EMU, as host C++ for the emulation harness
 * (tests/kernels/test_cuda_emu). Launchers take device pointers, queue the
 * work on the stream and return cudaSuccess or the launch error; they never
 * synchronize and never allocate.
 *
 * Shapes are described on the host (descriptors passed to the kernel by
 * value); dtypes are common/tensor.h's enum dtype. Float kernels handle
 * DT_FP32 and DT_FP16 storage (FP16 computes in FP32). */
#ifndef KILN_CUDA_KERNELS_H
#define KILN_CUDA_KERNELS_H

#include "kernels/cuda/kcuda.h"

extern "C" {
#include "common/tensor.h"
}

#define KC_MAX_DIMS TENSOR_MAX_DIMS

/* FP16 storage, distinct from uint16_t so templates can tell them apart. */
struct kc_half {
    uint16_t bits;
};

/* A fused activation (graph.h's enum act_kind with its parameters). */
struct kc_act {
    int kind;
    float a, b;
};

/* Output element i -> offsets of up to three broadcast inputs (stride 0 on
 * broadcast dims). same[k] = 1 when input k is laid out like the output. */
struct kc_bcast {
    int ndim;
    int nin;
    int64_t n;
    int64_t dims[KC_MAX_DIMS];
    int64_t stride[3][KC_MAX_DIMS];
    int same[3];
};

/* Fills bc for an output of out_ndim/out_dims from inputs of the given
 * shapes (numpy broadcasting, inputs right-aligned). Returns 0, or -1 when a
 * shape does not broadcast to the output. */
int kc_bcast_init(struct kc_bcast *bc, int out_ndim, const int64_t *out_dims, int nin, const int *in_ndim,
                  const int64_t *const *in_dims);

enum kc_unary_op {
    KU_IDENTITY, KU_NEG, KU_ABS, KU_EXP, KU_LOG, KU_SQRT, KU_RECIPROCAL, KU_FLOOR, KU_CEIL, KU_ROUND,
    KU_ERF, KU_SIN, KU_COS, KU_TAN, KU_SIGN, KU_SOFTPLUS, KU_SOFTSIGN, KU_ELU, KU_SELU, KU_CELU, KU_MISH,
    KU_THRESHOLDED_RELU, KU_SCALE, KU_NOT, KU_ISNAN, KU_ISINF, KU_ASIN, KU_ACOS, KU_ATAN, KU_SINH, KU_COSH,
    KU_ASINH, KU_ACOSH, KU_ATANH,
    /* activations: the same codes as enum act_kind plus KU_ACT_BASE */
    KU_ACT_BASE = 100,
};

enum kc_binary_op {
    KB_ADD, KB_SUB, KB_MUL, KB_DIV, KB_POW, KB_MAX, KB_MIN, KB_MOD, KB_FMOD, KB_PRELU,
    /* comparisons and logic: the output is DT_BOOL */
    KB_EQUAL, KB_LESS, KB_GREATER, KB_LESS_EQUAL, KB_GREATER_EQUAL, KB_AND, KB_OR, KB_XOR,
    KB_BITSHIFT_LEFT, KB_BITSHIFT_RIGHT,
};

enum kc_reduce_op {
    KR_SUM, KR_MEAN, KR_MAX, KR_MIN, KR_PROD, KR_L1, KR_L2, KR_SUM_SQUARE, KR_LOG_SUM, KR_LOG_SUM_EXP,
};

/* Output element -> input offset for a pure data movement (Transpose, Slice,
 * Pad, Expand, Tile): for each output dim d with coordinate c,
 *   KM_LINEAR: in coordinate start[d] + c * step[d]   (Slice, Transpose, Expand with in_dims 1 -> step 0)
 *   KM_MOD:    c mod in_dims[d]                       (Tile, Expand)
 *   KM_PAD_*:  c - start[d], then outside [0, in_dims[d]) constant / edge / reflect / wrap
 * and the input offset is the sum of in coordinate * in_stride[d]. */
enum kc_map_mode { KM_LINEAR, KM_MOD, KM_PAD_CONSTANT, KM_PAD_EDGE, KM_PAD_REFLECT, KM_PAD_WRAP };
struct kc_remap_desc {
    int ndim;
    int64_t n;
    int64_t out_dims[KC_MAX_DIMS];
    int64_t in_dims[KC_MAX_DIMS];
    int64_t in_stride[KC_MAX_DIMS];
    int64_t start[KC_MAX_DIMS];
    int64_t step[KC_MAX_DIMS];
    int mode[KC_MAX_DIMS];
    uint64_t pad_bits; /* the constant for KM_PAD_CONSTANT, in the element's bytes */
};

/* Reduction: kept dims (output coordinates) and reduced dims of the input. */
struct kc_reduce_desc {
    int nk, nr;
    int64_t kdims[KC_MAX_DIMS], kstride[KC_MAX_DIMS];
    int64_t rdims[KC_MAX_DIMS], rstride[KC_MAX_DIMS];
    int64_t out_n, r_n;
};

cudaError_t kc_unary(int op, enum dtype dt, const void *x, void *y, int64_t n, float a, float b, struct kc_act act,
                     cudaStream_t s);
/* y = a op b (with broadcasting per bc); bool output for comparisons. */
cudaError_t kc_binary(int op, enum dtype dt, const void *a, const void *b, void *y, const struct kc_bcast *bc,
                      struct kc_act act, cudaStream_t s);
/* y = cond ? x : y_ (bc: inputs 0 cond, 1 x, 2 y). */
cudaError_t kc_where(size_t elem, const void *cond, const void *x, const void *yv, void *out, const struct kc_bcast *bc,
                     cudaStream_t s);
cudaError_t kc_softmax(enum dtype dt, const void *x, void *y, int64_t outer, int64_t axis_len, int64_t inner, int log,
                       cudaStream_t s);
/* mean/inv_std (FP32, rows values) may be NULL. row_channels 0: scale and
 * bias have cols values (LayerNormalization); > 0: one per row, indexed by
 * row % row_channels (InstanceNormalization over [N*C, spatial]). */
cudaError_t kc_layernorm(enum dtype dt, const void *x, const void *scale, const void *bias, void *y, float *mean,
                         float *inv_std, int64_t rows, int64_t cols, float eps, int64_t row_channels, cudaStream_t s);
/* Pooling over 1-3 spatial dims (unused trailing dims: in/out/k 1); n is
 * the output element count; in/out are spatial sizes. */
struct kc_pool_desc {
    int nsp, is_max, include_pad;
    int64_t n;
    int64_t in[3], out[3];
    int k[3], s[3], dil[3], pb[3], pe[3];
};
cudaError_t kc_pool(enum dtype dt, const void *x, void *y, const struct kc_pool_desc *p, cudaStream_t s);
/* LRN across the channels of [n, c, inner]. */
cudaError_t kc_lrn(enum dtype dt, const void *x, void *y, int64_t n, int64_t c, int64_t inner, int size, float alpha,
                   float beta, float bias, cudaStream_t s);
cudaError_t kc_reduce(int op, enum dtype dt, const void *x, void *y, const struct kc_reduce_desc *d, cudaStream_t s);
/* ArgMax/ArgMin over the middle dim of [outer, axis_len, inner]; y is int64. */
cudaError_t kc_argmax(enum dtype dt, const void *x, int64_t *y, int64_t outer, int64_t axis_len, int64_t inner,
                      int is_min, int select_last, cudaStream_t s);
cudaError_t kc_remap(size_t elem, const void *x, void *y, const struct kc_remap_desc *m, cudaStream_t s);
/* rows x cols elements: dst[r * dst_ld + c] = src[r * src_ld + c] (Concat, Split). */
cudaError_t kc_copy2d(size_t elem, void *dst, int64_t dst_ld, const void *src, int64_t src_ld, int64_t rows,
                      int64_t cols, cudaStream_t s);
/* y[o, j, i] = x[o, idx[j], i] for x of [outer, axis_dim, inner]; negative
 * indices count from the end; an index out of range writes zeros. */
cudaError_t kc_gather(size_t elem, const void *x, const void *idx, enum dtype idx_dt, void *y, int64_t outer,
                      int64_t axis_dim, int64_t inner, int64_t nidx, cudaStream_t s);
/* GatherElements: the output has the indices' shape (dims); xstride are the
 * input's strides; axis_dim the input's size along axis. */
struct kc_gather_el_desc {
    int ndim, axis;
    int64_t n, axis_dim;
    int64_t dims[KC_MAX_DIMS], xstride[KC_MAX_DIMS];
};
cudaError_t kc_gather_elements(size_t elem, const void *x, const void *idx, enum dtype idx_dt, void *y,
                               const struct kc_gather_el_desc *d, cudaStream_t s);
/* Converts n elements; 1 if the pair is supported (kc_cast_supported). */
int kc_cast_supported(enum dtype from, enum dtype to);
cudaError_t kc_cast(enum dtype from, enum dtype to, const void *x, void *y, int64_t n, cudaStream_t s);
/* Inference BatchNormalization over [n, c, inner]; parameters in param_dt
 * (FP32, or FP16 with FP16 data as FP16 plans have them). */
cudaError_t kc_batchnorm(enum dtype dt, enum dtype param_dt, const void *x, const void *scale, const void *bias,
                         const void *mean, const void *var, void *y, int64_t n, int64_t c, int64_t inner, float eps,
                         struct kc_act act, cudaStream_t s);
/* y[i] = act(y[i] + bias[(i / inner) % channels]) in place over n elements:
 * a bias per column for Gemm (inner 1), per channel for NCHW (inner H*W);
 * bias may be NULL (activation only). */
cudaError_t kc_bias_act(enum dtype dt, void *y, const void *bias, int64_t n, int64_t channels, int64_t inner,
                        struct kc_act act, cudaStream_t s);

#endif
