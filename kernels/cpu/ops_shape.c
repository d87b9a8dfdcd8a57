/* ops_shape.c - operators that move bytes rather than compute, and their
 * geometric kin:
 *   views and layout: Reshape Flatten Squeeze Unsqueeze Identity Dropout
 *     BitCast Transpose DepthToSpace SpaceToDepth
 *   joining and cutting: Concat Split Slice Expand Tile Pad CenterCropPad
 *     Compress ReverseSequence
 *   indexing: Gather GatherElements GatherND Scatter ScatterElements
 *     ScatterND TensorScatter OneHot Trilu TopK NonZero Unique
 *   generators: Shape Size Constant ConstantOfShape Range EyeLike
 * The families that compute rather than move live beside it: the scans
 * (CumSum, CumProd) in ops_scan.c, NonMaxSuppression in ops_nms.c, Resize
 * and Upsample in ops_resize.c, GridSample and AffineGrid in ops_grid.c.
 * Most kernels only know the element size, so they serve every dtype; the
 * ops that only move elements also move strings, as the pointers a plan's
 * tensors borrow for one run, and the ops that make new values refuse them.
 *
 * Shapes that depend on an input's values (Reshape's shape, Slice's starts,
 * Tile's repeats, NonZero's count...) are read in infer() from inputs known
 * when the plan is built (constants, or inputs the plan is built per value
 * of); otherwise infer() fails with STATUS_UNSUPPORTED, since kiln plans
 * memory before running. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels/cpu/layout_util.h"
#include "kernels/cpu/par_util.h"
#include "kernels/cpu/params_util.h"
#include "kernels/cpu/shape_util.h"
#include "kernels/ops.h"

/* ------------------------------------------------------------------------
 * Common helpers
 * ------------------------------------------------------------------------ */

static struct tensor *out_opt(const struct op_call *c, int i) { return i < c->nout ? c->out[i] : NULL; }

/* For ops that only move elements: strings move too, as the pointers a
 * plan's tensors borrow for the duration of one run. */
static int need_movable_dtype(struct op_call *c, const struct tensor *t, const char *what) {
    if (t->dtype == DT_STRING) return 0;
    return need_bytes_dtype(c, t, what);
}

static int need_int_dtype(struct op_call *c, const struct tensor *t, const char *what) {
    if (t->dtype != DT_INT64 && t->dtype != DT_INT32)
        return op_error(c, "%s must be int64 or int32, got %s", what, dtype_name(t->dtype));
    return 0;
}

/* Copies input 0 to output 0 unless the plan made them share bytes. */
static int run_copy0(struct op_call *c) {
    if (c->out[0]->data != c->in[0]->data) {
        size_t n = tensor_nbytes(c->out[0]);
        if (n) memmove(c->out[0]->data, c->in[0]->data, n);
    }
    return 0;
}

static int check_same_numel(struct op_call *c, const struct tensor *x, const struct tensor *o) {
    if (tensor_numel(x) != tensor_numel(o)) {
        char a[128], b[128];
        return op_error(c, "cannot reshape %s to %s", tensor_shape_str(x, a, sizeof a), tensor_shape_str(o, b, sizeof b));
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout
 * ------------------------------------------------------------------------ */

static int reshape_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t sh[TENSOR_MAX_DIMS + 1];
    int n;
    if (c->node->opset < 5) n = read_int_attr(c, "shape", sh, TENSOR_MAX_DIMS);
    else n = read_int_input(c, 1, "shape", sh, TENSOR_MAX_DIMS);
    if (n < 0) return n == -1 ? op_error(c, "the target shape is missing") : n;
    int allowzero = c->node->opset >= 14 ? (int)node_attr_int(c->node, "allowzero", 0) : 0;
    int64_t known = 1;
    int neg = -1;
    for (int k = 0; k < n; k++) {
        int64_t v = sh[k];
        if (v == 0 && !allowzero) {
            if (k >= x->ndim) return op_error(c, "shape[%d] is 0 (copy) but the input has rank %d", k, x->ndim);
            v = x->dims[k];
        } else if (v == -1) {
            if (neg >= 0) return op_error(c, "the target shape has more than one -1");
            neg = k;
            continue;
        } else if (v < 0 || v > SHAPE_MAX_DIM) {
            return op_error(c, "shape[%d] is %lld", k, (long long)v);
        }
        sh[k] = v;
        known *= v;
    }
    int64_t numel = tensor_numel(x);
    if (neg >= 0) {
        if (known == 0) {
            if (numel != 0) return op_error(c, "cannot infer the -1 dimension next to a 0 dimension");
            sh[neg] = 0;
        } else {
            if (numel % known) {
                char a[128];
                return op_error(c, "cannot reshape %s: %lld elements are not divisible by %lld",
                                tensor_shape_str(x, a, sizeof a), (long long)numel, (long long)known);
            }
            sh[neg] = numel / known;
        }
    }
    int rc = set_shape(c, c->out[0], x->dtype, n, sh);
    return rc ? rc : check_same_numel(c, x, c->out[0]);
}

static int flatten_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t axis = node_attr_int(c->node, "axis", 1);
    if (axis < 0) axis += x->ndim;
    if (axis < 0 || axis > x->ndim) return op_error(c, "axis %lld is out of range for rank %d", (long long)node_attr_int(c->node, "axis", 1), x->ndim);
    int64_t d[2] = {prod(x->dims, 0, (int)axis), prod(x->dims, (int)axis, x->ndim)};
    return set_shape(c, c->out[0], x->dtype, 2, d);
}

static int squeeze_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t axes[TENSOR_MAX_DIMS];
    int n;
    if (c->node->opset < 13) n = read_int_attr(c, "axes", axes, TENSOR_MAX_DIMS);
    else if (in_opt(c, 1)) n = read_int_input(c, 1, "axes", axes, TENSOR_MAX_DIMS);
    else n = -1;
    if (n < -1) return n;
    int drop[TENSOR_MAX_DIMS] = {0};
    if (n < 0) {
        for (int k = 0; k < x->ndim; k++) drop[k] = x->dims[k] == 1;
    } else {
        for (int k = 0; k < n; k++) {
            int a = op_axis(c, axes[k], x->ndim);
            if (a < 0) return STATUS_INVALID;
            if (x->dims[a] != 1) return op_error(c, "cannot squeeze axis %d of size %lld", a, (long long)x->dims[a]);
            drop[a] = 1;
        }
    }
    int64_t d[TENSOR_MAX_DIMS];
    int m = 0;
    for (int k = 0; k < x->ndim; k++)
        if (!drop[k]) d[m++] = x->dims[k];
    return set_shape(c, c->out[0], x->dtype, m, d);
}

static int unsqueeze_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t axes[TENSOR_MAX_DIMS];
    int n;
    if (c->node->opset < 13) n = read_int_attr(c, "axes", axes, TENSOR_MAX_DIMS);
    else n = read_int_input(c, 1, "axes", axes, TENSOR_MAX_DIMS);
    if (n < 0) return n == -1 ? op_error(c, "attribute 'axes' is required") : n;
    int r = x->ndim + n;
    if (r > TENSOR_MAX_DIMS) return op_error(c, "output rank %d exceeds kiln's limit of %d", r, TENSOR_MAX_DIMS);
    int ins[TENSOR_MAX_DIMS] = {0};
    for (int k = 0; k < n; k++) {
        int a = op_axis(c, axes[k], r);
        if (a < 0) return STATUS_INVALID;
        if (ins[a]) return op_error(c, "axis %d is repeated", a);
        ins[a] = 1;
    }
    int64_t d[TENSOR_MAX_DIMS];
    int j = 0;
    for (int k = 0; k < r; k++) d[k] = ins[k] ? 1 : x->dims[j++];
    return set_shape(c, c->out[0], x->dtype, r, d);
}

static int identity_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    return set_shape(c, c->out[0], x->dtype, x->ndim, x->dims);
}

/* Optional values: kiln has none, but a tensor is an optional that holds
 * one and an absent input an optional that holds none, which covers the
 * graphs whose optionals are plain tensor inputs. */
static int optional_get_infer(struct op_call *c) {
    if (!in_opt(c, 0)) return op_error(c, "the optional input holds no value");
    return identity_infer(c);
}

static int optional_has_infer(struct op_call *c) { return set_shape(c, c->out[0], DT_BOOL, 0, NULL); }

static int optional_has_run(struct op_call *c) {
    *(uint8_t *)c->out[0]->data = in_opt(c, 0) != NULL;
    return 0;
}

static int dropout_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    const struct tensor *ratio = in_opt(c, 1), *train = in_opt(c, 2);
    if (train) {
        if (!train->data) {
            op_error(c, "training_mode must be a constant; kiln runs Dropout for inference only");
            return STATUS_UNSUPPORTED;
        }
        double r = 0.5;
        if (ratio) {
            if (!ratio->data) {
                op_error(c, "ratio must be a constant when training_mode is given");
                return STATUS_UNSUPPORTED;
            }
            r = op_double_at(ratio, 0);
        }
        if (op_int_at(train, 0) && r != 0) {
            op_error(c, "training_mode is true with ratio %g; kiln runs Dropout for inference only", r);
            return STATUS_UNSUPPORTED;
        }
    }
    int rc = set_shape(c, c->out[0], x->dtype, x->ndim, x->dims);
    if (rc) return rc;
    struct tensor *mask = out_opt(c, 1);
    if (mask) rc = set_shape(c, mask, c->node->opset >= 10 ? DT_BOOL : x->dtype, x->ndim, x->dims);
    return rc;
}

static int dropout_run(struct op_call *c) {
    run_copy0(c);
    struct tensor *mask = out_opt(c, 1);
    if (mask && mask->data) {
        int64_t n = tensor_numel(mask);
        if (mask->dtype == DT_BOOL) memset(mask->data, 1, (size_t)n);
        else
            for (int64_t i = 0; i < n; i++) shape_store_double(mask->dtype, mask->data, i, 1.0);
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Shape, Size, Constant, ConstantOfShape
 * ------------------------------------------------------------------------ */

static void shape_range(const struct op_call *c, int *start, int *end) {
    int r = c->in[0]->ndim;
    int64_t s = 0, e = r;
    if (c->node->opset >= 15) {
        s = node_attr_int(c->node, "start", 0);
        e = node_attr_int(c->node, "end", r);
    }
    if (s < 0) s += r;
    if (e < 0) e += r;
    s = s < 0 ? 0 : (s > r ? r : s);
    e = e < 0 ? 0 : (e > r ? r : e);
    *start = (int)s;
    *end = (int)(e > s ? e : s);
}

static int shape_infer(struct op_call *c) {
    int s, e;
    shape_range(c, &s, &e);
    int64_t d = e - s;
    return set_shape(c, c->out[0], DT_INT64, 1, &d);
}

/* Shape's clamped range of axes, decoded at prepare. */
struct shape_params {
    int start, end;
};

static int shape_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct shape_params p;
    shape_range(c, &p.start, &p.end);
    return params_keep(c, &p, sizeof p, state);
}

static int shape_run(struct op_call *c) {
    const struct shape_params *p = c->state;
    int64_t *o = c->out[0]->data;
    for (int k = p->start; k < p->end; k++) o[k - p->start] = c->in[0]->dims[k];
    return 0;
}

static int size_infer(struct op_call *c) { return set_shape(c, c->out[0], DT_INT64, 0, NULL); }

static int size_run(struct op_call *c) {
    *(int64_t *)c->out[0]->data = tensor_numel(c->in[0]);
    return 0;
}

/* The value of a Constant node as a tensor view; scalar attributes are
 * viewed in place (graph_attr keeps i and f). */
static int constant_value(struct op_call *c, struct tensor *v) {
    const struct graph_attr *a;
    memset(v, 0, sizeof *v);
    if ((a = node_attr(c->node, "value")) && a->type == ATTR_TENSOR && a->t) {
        *v = *a->t;
        if (v->dtype == DT_STRING) {
            op_error(c, "string constants are not supported");
            return STATUS_UNSUPPORTED;
        }
        return 0;
    }
    if ((a = node_attr(c->node, "value_float")) && a->type == ATTR_FLOAT) {
        v->dtype = DT_FP32;
        v->data = (void *)&a->f;
        return 0;
    }
    if ((a = node_attr(c->node, "value_int")) && a->type == ATTR_INT) {
        v->dtype = DT_INT64;
        v->data = (void *)&a->i;
        return 0;
    }
    if ((a = node_attr(c->node, "value_floats")) && a->type == ATTR_FLOATS) {
        v->dtype = DT_FP32;
        v->ndim = 1;
        v->dims[0] = a->n;
        v->data = a->floats;
        return 0;
    }
    if ((a = node_attr(c->node, "value_ints")) && a->type == ATTR_INTS) {
        v->dtype = DT_INT64;
        v->ndim = 1;
        v->dims[0] = a->n;
        v->data = a->ints;
        return 0;
    }
    if (node_attr(c->node, "value_string") || node_attr(c->node, "value_strings")) {
        op_error(c, "string constants are not supported");
        return STATUS_UNSUPPORTED;
    }
    if (node_attr(c->node, "sparse_value")) {
        op_error(c, "sparse constants are not supported");
        return STATUS_UNSUPPORTED;
    }
    return op_error(c, "no value attribute (value, value_float(s), value_int(s))");
}

static int constant_infer(struct op_call *c) {
    struct tensor v;
    int rc = constant_value(c, &v);
    if (rc) return rc;
    return set_shape(c, c->out[0], v.dtype, v.ndim, v.dims);
}

/* Constant's and ConstantOfShape's value, decoded at prepare: a view of
 * the node's attribute (or of a static zero), which outlives the plan. */
struct value_params {
    struct tensor v;
};

static int value_keep(struct op_call *c, int (*value)(struct op_call *, struct tensor *), void **state) {
    struct value_params p;
    int rc = value(c, &p.v);
    return rc ? rc : params_keep(c, &p, sizeof p, state);
}

static int constant_prepare(struct op_call *c, void **state, size_t *scratch) { return value_keep(c, constant_value, state); }

static int constant_run(struct op_call *c) {
    const struct tensor *v = &((const struct value_params *)c->state)->v;
    size_t n = tensor_nbytes(v);
    if (n) memcpy(c->out[0]->data, v->data, n);
    return 0;
}

static int cos_value(struct op_call *c, struct tensor *v) {
    const struct tensor *t = node_attr_tensor(c->node, "value");
    static const float zero = 0;
    memset(v, 0, sizeof *v);
    if (!t) {
        v->dtype = DT_FP32;
        v->data = (void *)&zero;
        return 0;
    }
    if (tensor_numel(t) != 1 || !t->data) return op_error(c, "attribute 'value' must hold exactly one element");
    if (need_bytes_dtype(c, t, "attribute 'value'")) return STATUS_INVALID;
    *v = *t;
    return 0;
}

static int cos_infer(struct op_call *c) {
    int64_t d[TENSOR_MAX_DIMS];
    int n = read_int_input(c, 0, "shape", d, TENSOR_MAX_DIMS);
    if (n < 0) return n;
    for (int k = 0; k < n; k++)
        if (dim_ok(c, (double)d[k], "a shape value")) return STATUS_INVALID;
    struct tensor v;
    int rc = cos_value(c, &v);
    return rc ? rc : set_shape(c, c->out[0], v.dtype, n, d);
}

static int cos_prepare(struct op_call *c, void **state, size_t *scratch) { return value_keep(c, cos_value, state); }

static int cos_run(struct op_call *c) {
    struct tensor v = ((const struct value_params *)c->state)->v;
    size_t es = dtype_size(v.dtype);
    int64_t n = tensor_numel(c->out[0]);
    char *o = c->out[0]->data;
    int zero = 1;
    for (size_t b = 0; b < es; b++) zero &= ((const unsigned char *)v.data)[b] == 0;
    if (zero) memset(o, 0, (size_t)n * es);
    else
        for (int64_t i = 0; i < n; i++) memcpy(o + i * (int64_t)es, v.data, es);
    return 0;
}

/* ------------------------------------------------------------------------
 * Transpose (and the permutations behind DepthToSpace / SpaceToDepth)
 * ------------------------------------------------------------------------ */

#define TRANSPOSE_TILE 32

/* dst[b][j][i] = src[b][i][j] for a batch of rows x cols matrices, in
 * cache-sized tiles whose full B x B blocks move at once (BLOCK(s, src row
 * stride, d, dst row stride): through registers where B > 1), the tiles'
 * ragged edges element by element. */
#define TRANSPOSE_2D_BLOCKS(T, B, BLOCK, PAR_MIN)                                                         \
    do {                                                                                                  \
        int64_t nti = (rows + TRANSPOSE_TILE - 1) / TRANSPOSE_TILE;                                       \
        PAR_FOR(batch * rows * cols > (PAR_MIN), nt, collapse(2),                                         \
            for (int64_t b = 0; b < batch; b++)                                                           \
                for (int64_t ti = 0; ti < nti; ti++) {                                                    \
                    const T *sb = s_ + b * rows * cols;                                                   \
                    T *db = d_ + b * rows * cols;                                                         \
                    int64_t i0 = ti * TRANSPOSE_TILE;                                                     \
                    int64_t i1 = i0 + TRANSPOSE_TILE < rows ? i0 + TRANSPOSE_TILE : rows;                 \
                    for (int64_t j0 = 0; j0 < cols; j0 += TRANSPOSE_TILE) {                               \
                        int64_t j1 = j0 + TRANSPOSE_TILE < cols ? j0 + TRANSPOSE_TILE : cols;             \
                        int64_t i = i0;                                                                   \
                        for (; i + (B) <= i1; i += (B)) {                                                 \
                            int64_t j = j0;                                                               \
                            for (; j + (B) <= j1; j += (B)) BLOCK(sb + i * cols + j, cols, db + j * rows + i, rows); \
                            for (; j < j1; j++)                                                           \
                                for (int64_t k = i; k < i + (B); k++) db[j * rows + k] = sb[k * cols + j]; \
                        }                                                                                 \
                        for (; i < i1; i++)                                                               \
                            for (int64_t j = j0; j < j1; j++) db[j * rows + i] = sb[i * cols + j];        \
                    }                                                                                     \
                });                                                                                       \
    } while (0)

#define TRANSPOSE_ONE(s, ss, d, ds) (*(d) = *(s))
#define TRANSPOSE_2D(T)                                                                                   \
    do {                                                                                                  \
        const T *s_ = src;                                                                                \
        T *d_ = dst;                                                                                      \
        TRANSPOSE_2D_BLOCKS(T, 1, TRANSPOSE_ONE, 32768);                                                  \
    } while (0)

#if defined(__SSE2__)
/* 32-bit elements in 4x4 blocks: the shuffle network of _MM_TRANSPOSE4_PS,
 * in integer form. */
static inline void transpose_block_32(const uint32_t *s, int64_t ss, uint32_t *d, int64_t ds) {
    __m128i r0 = _mm_loadu_si128((const __m128i *)(const void *)s);
    __m128i r1 = _mm_loadu_si128((const __m128i *)(const void *)(s + ss));
    __m128i r2 = _mm_loadu_si128((const __m128i *)(const void *)(s + 2 * ss));
    __m128i r3 = _mm_loadu_si128((const __m128i *)(const void *)(s + 3 * ss));
    __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpacklo_epi32(r2, r3);
    __m128i t2 = _mm_unpackhi_epi32(r0, r1), t3 = _mm_unpackhi_epi32(r2, r3);
    _mm_storeu_si128((__m128i *)(void *)d, _mm_unpacklo_epi64(t0, t1));
    _mm_storeu_si128((__m128i *)(void *)(d + ds), _mm_unpackhi_epi64(t0, t1));
    _mm_storeu_si128((__m128i *)(void *)(d + 2 * ds), _mm_unpacklo_epi64(t2, t3));
    _mm_storeu_si128((__m128i *)(void *)(d + 3 * ds), _mm_unpackhi_epi64(t2, t3));
}

/* Bytes in 8x8 blocks: 8 bytes of 8 rows in, interleaved by bytes, pairs
 * and quads, 8 bytes of 8 columns out. */
static inline void transpose_block_8(const uint8_t *s, int64_t ss, uint8_t *d, int64_t ds) {
    __m128i r[8];
    for (int k = 0; k < 8; k++) r[k] = _mm_loadl_epi64((const __m128i *)(const void *)(s + k * ss));
    __m128i a0 = _mm_unpacklo_epi8(r[0], r[1]), a1 = _mm_unpacklo_epi8(r[2], r[3]);
    __m128i a2 = _mm_unpacklo_epi8(r[4], r[5]), a3 = _mm_unpacklo_epi8(r[6], r[7]);
    __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
    __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
    __m128i c[4] = {_mm_unpacklo_epi32(b0, b2), _mm_unpackhi_epi32(b0, b2), _mm_unpacklo_epi32(b1, b3),
                    _mm_unpackhi_epi32(b1, b3)};
    for (int k = 0; k < 4; k++) {
        _mm_storel_epi64((__m128i *)(void *)(d + 2 * k * ds), c[k]);
        _mm_storel_epi64((__m128i *)(void *)(d + (2 * k + 1) * ds), _mm_unpackhi_epi64(c[k], c[k]));
    }
}

static void transpose_2d_32(const uint32_t *s_, uint32_t *d_, int64_t batch, int64_t rows, int64_t cols, int nt) {
    TRANSPOSE_2D_BLOCKS(uint32_t, 4, transpose_block_32, 32768);
}

static void transpose_2d_8(const uint8_t *s_, uint8_t *d_, int64_t batch, int64_t rows, int64_t cols, int nt) {
    TRANSPOSE_2D_BLOCKS(uint8_t, 8, transpose_block_8, 65536);
}
#endif

void cpu_transpose_2d(const void *src, void *dst, int64_t batch, int64_t rows, int64_t cols, size_t es, int nt) {
    switch (es) {
#if defined(__SSE2__)
    case 1: transpose_2d_8(src, dst, batch, rows, cols, nt); break;
#else
    case 1: TRANSPOSE_2D(uint8_t); break;
#endif
    case 2: TRANSPOSE_2D(uint16_t); break;
#if defined(__SSE2__)
    case 4: transpose_2d_32(src, dst, batch, rows, cols, nt); break;
#else
    case 4: TRANSPOSE_2D(uint32_t); break;
#endif
    case 8: TRANSPOSE_2D(uint64_t); break;
    default: {
        int64_t dims[3] = {batch, cols, rows}, strides[3] = {rows * cols, 1, cols};
        shape_strided_copy(dst, src, 0, 3, dims, strides, es, nt);
    }
    }
}

/* Writes the permutation of src (dims, nd axes) into dst: output axis j is
 * input axis perm[j]. Size-1 axes are dropped and input axes that stay
 * adjacent are merged first, so that the common transformer and layout
 * permutations become either row copies ([0,2,1,3]) or a batched 2-D
 * transpose ([0,2,3,1], [0,1,3,2]); the rest is one strided copy. */
static void transpose_bytes(const void *src, void *dst, int nd, const int64_t *dims, const int64_t *perm, size_t es,
                            int nt) {
    nt = nt > 0 ? nt : 1;
    int64_t d[SHAPE_MAX_VIEW_DIMS];
    int map[SHAPE_MAX_VIEW_DIMS], p[SHAPE_MAX_VIEW_DIMS], m = 0, q = 0;
    int64_t total = 1;
    for (int k = 0; k < nd; k++) {
        total *= dims[k];
        map[k] = dims[k] != 1 ? m : -1;
        if (dims[k] != 1) d[m++] = dims[k];
    }
    if (total == 0) return;
    for (int j = 0; j < nd; j++)
        if (map[perm[j]] >= 0) p[q++] = map[perm[j]];
    int gs[SHAPE_MAX_VIEW_DIMS], gl[SHAPE_MAX_VIEW_DIMS], ng = 0;
    for (int j = 0; j < q; j++) {
        if (ng && p[j] == gs[ng - 1] + gl[ng - 1]) {
            gl[ng - 1]++;
        } else {
            gs[ng] = p[j];
            gl[ng++] = 1;
        }
    }
    if (ng <= 1) {
        memcpy(dst, src, (size_t)total * es);
        return;
    }
    int rp[SHAPE_MAX_VIEW_DIMS];
    int64_t rd[SHAPE_MAX_VIEW_DIMS], rs[SHAPE_MAX_VIEW_DIMS];
    for (int g = 0; g < ng; g++) {
        int r = 0;
        for (int h = 0; h < ng; h++) r += gs[h] < gs[g];
        rp[g] = r;
        rd[r] = prod(d, gs[g], gs[g] + gl[g]);
    }
    shape_strides(ng, rd, rs);
    if (ng == 2) {
        cpu_transpose_2d(src, dst, 1, rd[0], rd[1], es, nt);
        return;
    }
    if (ng == 3 && rp[0] == 0 && rp[1] == 2) {
        cpu_transpose_2d(src, dst, rd[0], rd[1], rd[2], es, nt);
        return;
    }
    int64_t od[SHAPE_MAX_VIEW_DIMS], os[SHAPE_MAX_VIEW_DIMS];
    for (int g = 0; g < ng; g++) {
        od[g] = rd[rp[g]];
        os[g] = rs[rp[g]];
    }
    shape_strided_copy(dst, src, 0, ng, od, os, es, nt);
}

static int transpose_perm(struct op_call *c, int64_t *perm) {
    int r = c->in[0]->ndim;
    int n = read_int_attr(c, "perm", perm, TENSOR_MAX_DIMS);
    if (n < -1) return n;
    if (n < 0) {
        for (int k = 0; k < r; k++) perm[k] = r - 1 - k;
        return 0;
    }
    if (n != r) return op_error(c, "perm has %d entries for an input of rank %d", n, r);
    int seen[TENSOR_MAX_DIMS] = {0};
    for (int k = 0; k < r; k++) {
        if (perm[k] < 0) perm[k] += r;
        if (perm[k] < 0 || perm[k] >= r || seen[perm[k]]++) return op_error(c, "perm is not a permutation of 0..%d", r - 1);
    }
    return 0;
}

static int transpose_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t perm[TENSOR_MAX_DIMS], d[TENSOR_MAX_DIMS];
    int rc = transpose_perm(c, perm);
    if (rc) return rc;
    if ((rc = need_movable_dtype(c, x, "input"))) return rc;
    for (int k = 0; k < x->ndim; k++) d[k] = x->dims[perm[k]];
    return set_shape(c, c->out[0], x->dtype, x->ndim, d);
}

/* Transpose's permutation, decoded at prepare. same: the layout planner
 * (models/passes_layout.c) found that the node's input and output are the
 * same bytes: NCHW to NHWC of an input stored channels-last (kiln_layout 1)
 * or NHWC to NCHW into an output stored so (2). The plan makes such a node
 * a view; run copies where it could not. */
struct transpose_params {
    int64_t perm[TENSOR_MAX_DIMS];
    int same;
};

static int transpose_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct transpose_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    int rc = transpose_perm(c, p->perm);
    if (rc) {
        op_params_free(p);
        return rc;
    }
    p->same = layout_of(c->node) != 0;
    *state = p;
    return 0;
}

static int transpose_run(struct op_call *c) {
    const struct transpose_params *p = c->state;
    const struct tensor *x = c->in[0];
    if (p->same) {
        if (c->out[0]->data != x->data) memcpy(c->out[0]->data, x->data, tensor_nbytes(x));
        return 0;
    }
    transpose_bytes(x->data, c->out[0]->data, x->ndim, x->dims, p->perm, dtype_size(x->dtype), c->nthreads);
    return 0;
}

static int d2s_params(struct op_call *c, int64_t *b, int *crd) {
    const struct tensor *x = c->in[0];
    *b = node_attr_int(c->node, "blocksize", 0);
    if (*b <= 0) return op_error(c, "attribute 'blocksize' must be positive");
    if (x->ndim != 4) return op_error(c, "input must be 4-D (N,C,H,W), got rank %d", x->ndim);
    const char *mode = node_attr_str(c->node, "mode", "DCR");
    if (strcmp(mode, "DCR") && strcmp(mode, "CRD")) return op_error(c, "unknown mode '%s'", mode);
    *crd = strcmp(mode, "CRD") == 0;
    return need_movable_dtype(c, x, "input");
}

static int d2s_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t b;
    int crd;
    int rc = d2s_params(c, &b, &crd);
    if (rc) return rc;
    if (x->dims[1] % (b * b)) return op_error(c, "channels %lld are not divisible by blocksize^2 = %lld", (long long)x->dims[1], (long long)(b * b));
    int64_t d[4] = {x->dims[0], x->dims[1] / (b * b), x->dims[2] * b, x->dims[3] * b};
    return set_shape(c, c->out[0], x->dtype, 4, d);
}

/* DepthToSpace's and SpaceToDepth's block size (and DepthToSpace's mode),
 * decoded at prepare. */
struct d2s_params {
    int64_t b;
    int crd;
};

static int d2s_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct d2s_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    int rc = d2s_params(c, &p->b, &p->crd);
    if (rc) {
        op_params_free(p);
        return rc;
    }
    *state = p;
    return 0;
}

static int d2s_run(struct op_call *c) {
    const struct tensor *x = c->in[0];
    const struct d2s_params *p = c->state;
    int64_t b = p->b;
    int crd = p->crd;
    int64_t n = x->dims[0], cc = x->dims[1] / (b * b), h = x->dims[2], w = x->dims[3];
    if (crd) {
        int64_t v[6] = {n, cc, b, b, h, w}, perm[6] = {0, 1, 4, 2, 5, 3};
        transpose_bytes(x->data, c->out[0]->data, 6, v, perm, dtype_size(x->dtype), c->nthreads);
    } else {
        int64_t v[6] = {n, b, b, cc, h, w}, perm[6] = {0, 3, 4, 1, 5, 2};
        transpose_bytes(x->data, c->out[0]->data, 6, v, perm, dtype_size(x->dtype), c->nthreads);
    }
    return 0;
}

static int s2d_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t b = node_attr_int(c->node, "blocksize", 0);
    if (b <= 0) return op_error(c, "attribute 'blocksize' must be positive");
    if (x->ndim != 4) return op_error(c, "input must be 4-D (N,C,H,W), got rank %d", x->ndim);
    if (x->dims[2] % b || x->dims[3] % b) return op_error(c, "height and width must be divisible by blocksize %lld", (long long)b);
    int rc = need_movable_dtype(c, x, "input");
    if (rc) return rc;
    int64_t d[4] = {x->dims[0], x->dims[1] * b * b, x->dims[2] / b, x->dims[3] / b};
    return set_shape(c, c->out[0], x->dtype, 4, d);
}

static int s2d_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct d2s_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    p->b = node_attr_int(c->node, "blocksize", 1);
    *state = p;
    return 0;
}

static int s2d_run(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t b = ((const struct d2s_params *)c->state)->b;
    int64_t v[6] = {x->dims[0], x->dims[1], x->dims[2] / b, b, x->dims[3] / b, b}, perm[6] = {0, 3, 5, 1, 2, 4};
    transpose_bytes(x->data, c->out[0]->data, 6, v, perm, dtype_size(x->dtype), c->nthreads);
    return 0;
}

/* ------------------------------------------------------------------------
 * Concat, Split
 * ------------------------------------------------------------------------ */

static int concat_infer(struct op_call *c) {
    const struct tensor *x0 = c->in[0];
    if (!x0) return op_error(c, "input 0 is required");
    int a = op_axis(c, node_attr_int(c->node, "axis", 0), x0->ndim);
    if (a < 0) return STATUS_INVALID;
    int rc = need_movable_dtype(c, x0, "input 0");
    if (rc) return rc;
    int64_t d[TENSOR_MAX_DIMS];
    memcpy(d, x0->dims, sizeof d);
    d[a] = 0;
    for (int i = 0; i < c->nin; i++) {
        const struct tensor *x = c->in[i];
        if (!x) return op_error(c, "input %d is missing", i);
        if (x->dtype != x0->dtype) return op_error(c, "input %d is %s but input 0 is %s", i, dtype_name(x->dtype), dtype_name(x0->dtype));
        if (x->ndim != x0->ndim) return op_error(c, "input %d has rank %d but input 0 has rank %d", i, x->ndim, x0->ndim);
        for (int k = 0; k < x->ndim; k++)
            if (k != a && x->dims[k] != x0->dims[k]) {
                char s0[128], s1[128];
                return op_error(c, "input %d %s does not match input 0 %s outside axis %d", i, tensor_shape_str(x, s1, sizeof s1),
                                tensor_shape_str(x0, s0, sizeof s0), a);
            }
        d[a] += x->dims[a];
    }
    return set_shape(c, c->out[0], x0->dtype, x0->ndim, d);
}

/* Concat's geometry, decoded at prepare: rows before the axis, bytes of
 * an output row, and where each input's part of a row starts. */
struct concat_params {
    int64_t outer, orow;
    int64_t off[OP_MAX_IO + 1];
};

static int concat_prepare(struct op_call *c, void **state, size_t *scratch) {
    const struct tensor *o = c->out[0];
    int a = op_axis(c, node_attr_int(c->node, "axis", 0), o->ndim);
    if (a < 0) return STATUS_INVALID;
    struct concat_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    size_t es = dtype_size(o->dtype);
    /* Channels-last (passes_layout): the channels are the last axis of
     * memory. */
    struct tensor ov = *o, iv;
    int cl = layout_of(c->node) == 3 && o->ndim == 4 && a == 1;
    if (cl) {
        layout_nhwc_view(&ov, o);
        a = 3;
    }
    p->outer = prod(ov.dims, 0, a);
    p->orow = prod(ov.dims, a, ov.ndim) * (int64_t)es;
    p->off[0] = 0;
    for (int i = 0; i < c->nin; i++) {
        iv = *c->in[i];
        if (cl) layout_nhwc_view(&iv, c->in[i]);
        p->off[i + 1] = p->off[i] + prod(iv.dims, a, ov.ndim) * (int64_t)es;
    }
    *state = p;
    return 0;
}

static int concat_run(struct op_call *c) {
    const struct concat_params *p = c->state;
    const struct tensor *o = c->out[0];
    int64_t outer = p->outer, orow = p->orow;
    const int64_t *off = p->off;
    char *dst = o->data;
    PAR_FOR(outer * orow > 65536 && outer > 1, c->nthreads, ,
        for (int64_t r = 0; r < outer; r++)
            for (int i = 0; i < c->nin; i++) {
                int64_t n = off[i + 1] - off[i];
                if (n) memcpy(dst + r * orow + off[i], (const char *)c->in[i]->data + r * n, (size_t)n);
            });
    return 0;
}

/* The split sizes along axis *axis; returns the count or a negative status. */
static int split_sizes(struct op_call *c, int *axis, int64_t *sz) {
    const struct tensor *x = c->in[0];
    int a = op_axis(c, node_attr_int(c->node, "axis", 0), x->ndim);
    if (a < 0) return STATUS_INVALID;
    *axis = a;
    int64_t dim = x->dims[a];
    int n;
    if (c->node->opset < 13) n = read_int_attr(c, "split", sz, OP_MAX_IO);
    else if (in_opt(c, 1)) n = read_int_input(c, 1, "split", sz, OP_MAX_IO);
    else n = -1;
    if (n < -1) return n;
    if (n >= 0) {
        int64_t sum = 0;
        for (int k = 0; k < n; k++) {
            if (sz[k] < 0 || sz[k] > SHAPE_MAX_DIM) return op_error(c, "split[%d] is %lld", k, (long long)sz[k]);
            sum += sz[k];
        }
        if (n != c->nout) return op_error(c, "split has %d entries for %d outputs", n, c->nout);
        if (sum != dim) return op_error(c, "split sizes add up to %lld but axis %d has %lld", (long long)sum, a, (long long)dim);
        return n;
    }
    n = c->nout;
    const struct graph_attr *no = c->node->opset >= 18 ? node_attr(c->node, "num_outputs") : NULL;
    if (no) {
        if (no->i != n) return op_error(c, "num_outputs is %lld but the node has %d outputs", (long long)no->i, n);
        int64_t chunk = (dim + n - 1) / n;
        for (int k = 0; k < n; k++) {
            int64_t left = dim - chunk * k;
            sz[k] = left < 0 ? 0 : (left < chunk ? left : chunk);
        }
        return n;
    }
    if (dim % n) return op_error(c, "axis %d of size %lld cannot be split into %d equal parts", a, (long long)dim, n);
    for (int k = 0; k < n; k++) sz[k] = dim / n;
    return n;
}

static int split_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int rc = need_movable_dtype(c, x, "input");
    if (rc) return rc;
    int a;
    int64_t sz[OP_MAX_IO];
    int n = split_sizes(c, &a, sz);
    if (n < 0) return n;
    for (int k = 0; k < n; k++) {
        if (!c->out[k]) continue;
        int64_t d[TENSOR_MAX_DIMS];
        memcpy(d, x->dims, sizeof d);
        d[a] = sz[k];
        if ((rc = set_shape(c, c->out[k], x->dtype, x->ndim, d))) return rc;
    }
    return 0;
}

/* Split's geometry, decoded at prepare: rows before the axis, bytes of an
 * input row, and each output's bytes of a row. */
struct split_params {
    int n;
    int64_t outer, irow;
    int64_t len[OP_MAX_IO];
};

static int split_prepare(struct op_call *c, void **state, size_t *scratch) {
    const struct tensor *x = c->in[0];
    int a;
    int64_t sz[OP_MAX_IO];
    int n = split_sizes(c, &a, sz);
    if (n < 0) return n;
    struct split_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    int64_t inner = prod(x->dims, a + 1, x->ndim) * (int64_t)dtype_size(x->dtype);
    p->n = n;
    p->outer = prod(x->dims, 0, a);
    p->irow = x->dims[a] * inner;
    for (int k = 0; k < n; k++) p->len[k] = sz[k] * inner;
    *state = p;
    return 0;
}

static int split_run(struct op_call *c) {
    const struct split_params *p = c->state;
    const struct tensor *x = c->in[0];
    int64_t outer = p->outer, irow = p->irow;
    int64_t off = 0;
    for (int k = 0; k < p->n; k++) {
        int64_t len = p->len[k];
        if (c->out[k] && len) {
            char *dst = c->out[k]->data;
            const char *src = (const char *)x->data + off;
            PAR_FOR(outer * len > 65536 && outer > 1, c->nthreads, ,
                for (int64_t r = 0; r < outer; r++) memcpy(dst + r * len, src + r * irow, (size_t)len););
        }
        off += len;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Slice
 * ------------------------------------------------------------------------ */

/* Slice's per-axis start, step and output length, decoded at infer and
 * again at prepare (starts, ends, axes and steps are attributes or
 * constant inputs). */
struct slice_params {
    int64_t start[TENSOR_MAX_DIMS], step[TENSOR_MAX_DIMS], len[TENSOR_MAX_DIMS];
};

/* Fills g following numpy's clamping. */
static int slice_params(struct op_call *c, struct slice_params *g) {
    const struct tensor *x = c->in[0];
    int64_t *start = g->start, *step = g->step, *len = g->len;
    int r = x->ndim;
    int64_t st[TENSOR_MAX_DIMS], en[TENSOR_MAX_DIMS], ax[TENSOR_MAX_DIMS], sp[TENSOR_MAX_DIMS];
    int ns, ne, na, np;
    if (c->node->opset < 10) {
        ns = read_int_attr(c, "starts", st, TENSOR_MAX_DIMS);
        ne = read_int_attr(c, "ends", en, TENSOR_MAX_DIMS);
        na = read_int_attr(c, "axes", ax, TENSOR_MAX_DIMS);
        np = -1;
        if (ns == -1 || ne == -1) return op_error(c, "attributes 'starts' and 'ends' are required");
    } else {
        ns = read_int_input(c, 1, "starts", st, TENSOR_MAX_DIMS);
        if (ns < 0) return ns;
        ne = read_int_input(c, 2, "ends", en, TENSOR_MAX_DIMS);
        if (ne < 0) return ne;
        na = in_opt(c, 3) ? read_int_input(c, 3, "axes", ax, TENSOR_MAX_DIMS) : -1;
        np = in_opt(c, 4) ? read_int_input(c, 4, "steps", sp, TENSOR_MAX_DIMS) : -1;
    }
    if (ns < 0) return ns;
    if (ne < 0) return ne;
    if (na < -1) return na;
    if (np < -1) return np;
    if (ns != ne) return op_error(c, "starts has %d values but ends has %d", ns, ne);
    if (na >= 0 && na != ns) return op_error(c, "axes has %d values but starts has %d", na, ns);
    if (np >= 0 && np != ns) return op_error(c, "steps has %d values but starts has %d", np, ns);
    int used[TENSOR_MAX_DIMS] = {0};
    for (int k = 0; k < r; k++) {
        start[k] = 0;
        step[k] = 1;
        len[k] = x->dims[k];
    }
    for (int k = 0; k < ns; k++) {
        int a = na >= 0 ? op_axis(c, ax[k], r) : k;
        if (a < 0) return STATUS_INVALID;
        if (a >= r) return op_error(c, "starts has more values than the input's rank %d", r);
        if (used[a]++) return op_error(c, "axis %d is repeated", a);
        int64_t d = x->dims[a], s = st[k], e = en[k], p = np >= 0 ? sp[k] : 1;
        if (p == 0) return op_error(c, "steps[%d] is 0", k);
        /* Steps beyond any dimension take one element; clamping keeps the arithmetic in range. */
        p = p > SHAPE_MAX_DIM ? SHAPE_MAX_DIM : (p < -SHAPE_MAX_DIM ? -SHAPE_MAX_DIM : p);
        if (s < 0) s += d;
        if (e < 0) e += d;
        int64_t n;
        if (p > 0) {
            s = s < 0 ? 0 : (s > d ? d : s);
            e = e < 0 ? 0 : (e > d ? d : e);
            n = e > s ? (e - s + p - 1) / p : 0;
        } else {
            s = s < 0 ? 0 : (s > d - 1 ? d - 1 : s);
            e = e < -1 ? -1 : (e > d - 1 ? d - 1 : e);
            n = s > e ? (s - e + (-p) - 1) / (-p) : 0;
        }
        start[a] = s;
        step[a] = p;
        len[a] = n;
    }
    return 0;
}

static int slice_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    struct slice_params g;
    int rc = need_movable_dtype(c, x, "input");
    if (rc || (rc = slice_params(c, &g))) return rc;
    return set_shape(c, c->out[0], x->dtype, x->ndim, g.len);
}

static int slice_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct slice_params g;
    int rc = slice_params(c, &g);
    return rc ? rc : params_keep(c, &g, sizeof g, state);
}

static int slice_run(struct op_call *c) {
    const struct slice_params *p = c->state;
    const struct tensor *x = c->in[0];
    const int64_t *start = p->start, *step = p->step, *len = p->len;
    int64_t xs[TENSOR_MAX_DIMS], ss[TENSOR_MAX_DIMS];
    shape_strides(x->ndim, x->dims, xs);
    int64_t base = 0;
    for (int k = 0; k < x->ndim; k++) {
        if (len[k] == 0) return 0;
        base += start[k] * xs[k];
        ss[k] = step[k] * xs[k];
    }
    shape_strided_copy(c->out[0]->data, x->data, base, x->ndim, len, ss, dtype_size(x->dtype), c->nthreads);
    return 0;
}

/* ------------------------------------------------------------------------
 * Expand, Tile
 * ------------------------------------------------------------------------ */

static int expand_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    struct tensor s = {0};
    int n = read_int_input(c, 1, "shape", s.dims, TENSOR_MAX_DIMS);
    if (n < 0) return n;
    int rc = need_movable_dtype(c, x, "input");
    if (rc) return rc;
    s.ndim = n;
    s.dtype = x->dtype;
    for (int k = 0; k < n; k++)
        if (dim_ok(c, (double)s.dims[k], "a shape value")) return STATUS_INVALID;
    c->out[0]->dtype = x->dtype;
    return op_broadcast_shape(c, x, &s, c->out[0]);
}

static int expand_run(struct op_call *c) {
    const struct tensor *x = c->in[0], *o = c->out[0];
    int64_t xs[TENSOR_MAX_DIMS], ss[TENSOR_MAX_DIMS];
    shape_strides(x->ndim, x->dims, xs);
    int off = o->ndim - x->ndim;
    for (int k = 0; k < o->ndim; k++) {
        int j = k - off;
        ss[k] = (j < 0 || x->dims[j] == 1) ? 0 : xs[j];
    }
    shape_strided_copy(o->data, x->data, 0, o->ndim, o->dims, ss, dtype_size(x->dtype), c->nthreads);
    return 0;
}

static int tile_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t rep[TENSOR_MAX_DIMS], d[TENSOR_MAX_DIMS];
    int n = read_int_input(c, 1, "repeats", rep, TENSOR_MAX_DIMS);
    if (n < 0) return n;
    int rc = need_movable_dtype(c, x, "input");
    if (rc) return rc;
    if (n != x->ndim) return op_error(c, "repeats has %d values for an input of rank %d", n, x->ndim);
    for (int k = 0; k < n; k++) {
        if (rep[k] < 0) return op_error(c, "repeats[%d] is negative", k);
        if (dim_ok(c, (double)x->dims[k] * (double)rep[k], "a tiled dimension")) return STATUS_INVALID;
        d[k] = x->dims[k] * rep[k];
    }
    return set_shape(c, c->out[0], x->dtype, n, d);
}

/* The output viewed as [r0, d0, r1, d1, ...] reads the input with stride 0
 * over each repeat axis. */
static int tile_run(struct op_call *c) {
    const struct tensor *x = c->in[0], *o = c->out[0];
    int64_t xs[TENSOR_MAX_DIMS], vd[SHAPE_MAX_VIEW_DIMS], vs[SHAPE_MAX_VIEW_DIMS];
    shape_strides(x->ndim, x->dims, xs);
    for (int k = 0; k < x->ndim; k++) {
        if (x->dims[k] == 0) return 0;
        vd[2 * k] = o->dims[k] / x->dims[k];
        vs[2 * k] = 0;
        vd[2 * k + 1] = x->dims[k];
        vs[2 * k + 1] = xs[k];
    }
    shape_strided_copy(o->data, x->data, 0, 2 * x->ndim, vd, vs, dtype_size(x->dtype), c->nthreads);
    return 0;
}

/* ------------------------------------------------------------------------
 * Gather, GatherElements, GatherND
 * ------------------------------------------------------------------------ */

/* Normalizes index v against dim; fails with a message naming it. */
static int index_check(struct op_call *c, int64_t v, int64_t dim, int axis, int64_t *out) {
    int64_t w = v < 0 ? v + dim : v;
    *out = 0;
    if (w < 0 || w >= dim)
        return op_error(c, "index %lld is out of range [-%lld, %lld) on axis %d", (long long)v, (long long)dim, (long long)dim, axis);
    *out = w;
    return 0;
}

static int gather_infer(struct op_call *c) {
    const struct tensor *x = c->in[0], *idx = c->in[1];
    int rc;
    if ((rc = need_input(c, 1, "indices")) || (rc = need_movable_dtype(c, x, "data")) || (rc = need_int_dtype(c, idx, "indices")))
        return rc;
    int a = op_axis(c, node_attr_int(c->node, "axis", 0), x->ndim);
    if (a < 0) return STATUS_INVALID;
    int r = x->ndim - 1 + idx->ndim;
    if (r > TENSOR_MAX_DIMS) return op_error(c, "output rank %d exceeds kiln's limit of %d", r, TENSOR_MAX_DIMS);
    int64_t d[TENSOR_MAX_DIMS];
    int m = 0;
    for (int k = 0; k < a; k++) d[m++] = x->dims[k];
    for (int k = 0; k < idx->ndim; k++) d[m++] = idx->dims[k];
    for (int k = a + 1; k < x->ndim; k++) d[m++] = x->dims[k];
    return set_shape(c, c->out[0], x->dtype, m, d);
}

/* The normalized axis of Gather, GatherElements and OneHot, decoded at
 * prepare. */
struct axis_params {
    int axis;
};

/* Gather's and GatherElements' axis counts in the data's rank. */
static int gather_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct axis_params p = {op_axis(c, node_attr_int(c->node, "axis", 0), c->in[0]->ndim)};
    return p.axis < 0 ? STATUS_INVALID : params_keep(c, &p, sizeof p, state);
}

static int gather_run(struct op_call *c) {
    const struct tensor *x = c->in[0], *idx = c->in[1];
    int a = ((const struct axis_params *)c->state)->axis;
    size_t es = dtype_size(x->dtype);
    int64_t outer = prod(x->dims, 0, a), dim = x->dims[a], inner = prod(x->dims, a + 1, x->ndim);
    int64_t ni = tensor_numel(idx);
    /* Bounds are checked for every index before any byte moves. */
    for (int64_t i = 0; i < ni; i++) {
        int64_t w;
        if (index_check(c, op_int_at(idx, i), dim, a, &w)) return STATUS_INVALID;
    }
    const char *src = x->data;
    char *dst = c->out[0]->data;
    size_t row = (size_t)inner * es;
    int64_t total = outer * ni;
    PAR_FOR(total * inner > 32768 && total > 1, c->nthreads, ,
        for (int64_t t = 0; t < total; t++) {
            int64_t o = t / ni, i = t % ni, v = op_int_at(idx, i);
            if (v < 0) v += dim;
            const char *s = src + ((o * dim + v) * inner) * (int64_t)es;
            char *d = dst + t * (int64_t)row;
            if (row == 4) memcpy(d, s, 4);
            else if (row == 8) memcpy(d, s, 8);
            else memcpy(d, s, row);
        });
    return 0;
}

static int gather_elements_infer(struct op_call *c) {
    const struct tensor *x = c->in[0], *idx = c->in[1];
    int rc;
    if ((rc = need_input(c, 1, "indices")) || (rc = need_movable_dtype(c, x, "data")) || (rc = need_int_dtype(c, idx, "indices")))
        return rc;
    if (idx->ndim != x->ndim) return op_error(c, "indices have rank %d but data has rank %d", idx->ndim, x->ndim);
    if (op_axis(c, node_attr_int(c->node, "axis", 0), x->ndim) < 0) return STATUS_INVALID;
    return set_shape(c, c->out[0], x->dtype, idx->ndim, idx->dims);
}

static int gather_elements_run(struct op_call *c) {
    const struct tensor *x = c->in[0], *idx = c->in[1];
    int a = ((const struct axis_params *)c->state)->axis, r = x->ndim;
    size_t es = dtype_size(x->dtype);
    int64_t xs[TENSOR_MAX_DIMS], n = tensor_numel(idx);
    shape_strides(r, x->dims, xs);
    char *dst = c->out[0]->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, off = 0, v;
        for (int k = r - 1; k >= 0; k--) {
            int64_t ik = rem % idx->dims[k];
            rem /= idx->dims[k];
            if (k != a) {
                if (ik >= x->dims[k]) return op_error(c, "indices shape exceeds data on axis %d", k);
                off += ik * xs[k];
            }
        }
        if (index_check(c, op_int_at(idx, i), x->dims[a], a, &v)) return STATUS_INVALID;
        off += v * xs[a];
        shape_copy_elem(dst + i * (int64_t)es, (const char *)x->data + off * (int64_t)es, es);
    }
    return 0;
}

static int gather_nd_infer(struct op_call *c) {
    const struct tensor *x = c->in[0], *idx = c->in[1];
    int rc;
    if ((rc = need_input(c, 1, "indices")) || (rc = need_movable_dtype(c, x, "data")) || (rc = need_int_dtype(c, idx, "indices")))
        return rc;
    int b = (int)node_attr_int(c->node, "batch_dims", 0);
    if (idx->ndim < 1) return op_error(c, "indices must have rank >= 1");
    int64_t k = idx->dims[idx->ndim - 1];
    if (b < 0 || b >= idx->ndim || b >= x->ndim) return op_error(c, "batch_dims %d is out of range", b);
    if (k < 1 || k > x->ndim - b) return op_error(c, "indices' last dimension %lld must be in [1, %d]", (long long)k, x->ndim - b);
    for (int j = 0; j < b; j++)
        if (idx->dims[j] != x->dims[j]) return op_error(c, "batch dimension %d differs between data and indices", j);
    int64_t d[TENSOR_MAX_DIMS + TENSOR_MAX_DIMS];
    int m = 0;
    for (int j = 0; j < idx->ndim - 1; j++) d[m++] = idx->dims[j];
    for (int j = b + (int)k; j < x->ndim; j++) d[m++] = x->dims[j];
    return set_shape(c, c->out[0], x->dtype, m, d);
}

/* Shared by GatherND and ScatterND: the element offset in data of index
 * tuple t (of k values) within batch bi. */
static int nd_offset(struct op_call *c, const struct tensor *x, const struct tensor *idx, int b, int64_t k, int64_t bi,
                     int64_t tuple, const int64_t *xs, int64_t *off) {
    int64_t o = bi * (b ? xs[b - 1] : 0);
    for (int64_t j = 0; j < k; j++) {
        int64_t v;
        if (index_check(c, op_int_at(idx, tuple * k + j), x->dims[b + j], b + (int)j, &v)) return STATUS_INVALID;
        o += v * xs[b + j];
    }
    *off = o;
    return 0;
}

/* GatherND's batch_dims, decoded at prepare. */
struct gather_nd_params {
    int batch_dims;
};

static int gather_nd_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct gather_nd_params p = {(int)node_attr_int(c->node, "batch_dims", 0)};
    return params_keep(c, &p, sizeof p, state);
}

static int gather_nd_run(struct op_call *c) {
    const struct tensor *x = c->in[0], *idx = c->in[1];
    int b = ((const struct gather_nd_params *)c->state)->batch_dims;
    int64_t k = idx->dims[idx->ndim - 1], xs[TENSOR_MAX_DIMS];
    shape_strides(x->ndim, x->dims, xs);
    size_t es = dtype_size(x->dtype);
    int64_t nb = prod(x->dims, 0, b), per = prod(idx->dims, b, idx->ndim - 1), slice = prod(x->dims, b + (int)k, x->ndim);
    char *dst = c->out[0]->data;
    for (int64_t bi = 0; bi < nb; bi++)
        for (int64_t t = 0; t < per; t++) {
            int64_t off, tuple = bi * per + t;
            if (nd_offset(c, x, idx, b, k, bi, tuple, xs, &off)) return STATUS_INVALID;
            memcpy(dst + tuple * slice * (int64_t)es, (const char *)x->data + off * (int64_t)es, (size_t)slice * es);
        }
    return 0;
}

/* ------------------------------------------------------------------------
 * ScatterElements (and the older Scatter), ScatterND
 * ------------------------------------------------------------------------ */

enum scatter_red { RED_NONE, RED_ADD, RED_MUL, RED_MAX, RED_MIN };

static int scatter_reduction(struct op_call *c, enum scatter_red *r) {
    const char *s = node_attr_str(c->node, "reduction", "none");
    if (!strcmp(s, "none")) *r = RED_NONE;
    else if (!strcmp(s, "add")) *r = RED_ADD;
    else if (!strcmp(s, "mul")) *r = RED_MUL;
    else if (!strcmp(s, "max")) *r = RED_MAX;
    else if (!strcmp(s, "min")) *r = RED_MIN;
    else return op_error(c, "unknown reduction '%s'", s);
    return 0;
}

/* dst[i] = dst[i] (op) src[j]; reductions go through double, exact for
 * every float type and for integers below 2^53. */
static void scatter_apply(enum dtype dt, void *dst, int64_t i, const void *src, int64_t j, enum scatter_red r) {
    size_t es = dtype_size(dt);
    if (r == RED_NONE) {
        shape_copy_elem((char *)dst + i * (int64_t)es, (const char *)src + j * (int64_t)es, es);
        return;
    }
    struct tensor td = {.dtype = dt, .data = dst}, ts = {.dtype = dt, .data = (void *)src};
    double a = op_double_at(&td, i), b = op_double_at(&ts, j), v;
    switch (r) {
    case RED_ADD: v = a + b; break;
    case RED_MUL: v = a * b; break;
    case RED_MAX: v = a > b ? a : b; break;
    default: v = a < b ? a : b; break;
    }
    shape_store_double(dt, dst, i, v);
}

static int scatter_elements_infer(struct op_call *c) {
    const struct tensor *x = c->in[0], *idx = c->in[1], *upd = c->in[2];
    int rc;
    enum scatter_red red;
    if ((rc = need_input(c, 1, "indices")) || (rc = need_input(c, 2, "updates")) || (rc = need_movable_dtype(c, x, "data")) ||
        (rc = need_int_dtype(c, idx, "indices")) || (rc = scatter_reduction(c, &red)))
        return rc;
    if (x->dtype == DT_STRING && red != RED_NONE) return op_error(c, "reduction on strings is not supported");
    if (!tensor_same_shape(idx, upd) && !(idx->ndim == upd->ndim && !memcmp(idx->dims, upd->dims, sizeof(int64_t) * (size_t)idx->ndim)))
        return op_error(c, "indices and updates must have the same shape");
    if (upd->dtype != x->dtype) return op_error(c, "updates are %s but data is %s", dtype_name(upd->dtype), dtype_name(x->dtype));
    if (idx->ndim != x->ndim) return op_error(c, "indices have rank %d but data has rank %d", idx->ndim, x->ndim);
    if (op_axis(c, node_attr_int(c->node, "axis", 0), x->ndim) < 0) return STATUS_INVALID;
    return set_shape(c, c->out[0], x->dtype, x->ndim, x->dims);
}

/* A scatter's reduction (and ScatterElements' normalized axis), decoded
 * at prepare. */
struct scatter_params {
    enum scatter_red red;
    int axis;
};

static int scatter_elements_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct scatter_params p = {RED_NONE, op_axis(c, node_attr_int(c->node, "axis", 0), c->in[0]->ndim)};
    if (p.axis < 0) return STATUS_INVALID;
    int rc = scatter_reduction(c, &p.red);
    return rc ? rc : params_keep(c, &p, sizeof p, state);
}

static int scatter_elements_run(struct op_call *c) {
    const struct tensor *x = c->in[0], *idx = c->in[1], *upd = c->in[2];
    const struct scatter_params *p = c->state;
    enum scatter_red red = p->red;
    int a = p->axis, r = x->ndim;
    int64_t xs[TENSOR_MAX_DIMS], n = tensor_numel(idx);
    shape_strides(r, x->dims, xs);
    for (int64_t i = 0; i < n; i++) { /* validate before writing anything */
        int64_t v;
        if (index_check(c, op_int_at(idx, i), x->dims[a], a, &v)) return STATUS_INVALID;
    }
    run_copy0(c);
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, off = 0, v;
        for (int k = r - 1; k >= 0; k--) {
            int64_t ik = rem % idx->dims[k];
            rem /= idx->dims[k];
            if (k != a) {
                if (ik >= x->dims[k]) return op_error(c, "indices shape exceeds data on axis %d", k);
                off += ik * xs[k];
            }
        }
        index_check(c, op_int_at(idx, i), x->dims[a], a, &v);
        off += v * xs[a];
        scatter_apply(x->dtype, c->out[0]->data, off, upd->data, i, red);
    }
    return 0;
}

static int scatter_nd_infer(struct op_call *c) {
    const struct tensor *x = c->in[0], *idx = c->in[1], *upd = c->in[2];
    int rc;
    enum scatter_red red;
    if ((rc = need_input(c, 1, "indices")) || (rc = need_input(c, 2, "updates")) || (rc = need_movable_dtype(c, x, "data")) ||
        (rc = need_int_dtype(c, idx, "indices")) || (rc = scatter_reduction(c, &red)))
        return rc;
    if (x->dtype == DT_STRING && red != RED_NONE) return op_error(c, "reduction on strings is not supported");
    if (idx->ndim < 1) return op_error(c, "indices must have rank >= 1");
    int64_t k = idx->dims[idx->ndim - 1];
    if (k < 1 || k > x->ndim) return op_error(c, "indices' last dimension %lld must be in [1, %d]", (long long)k, x->ndim);
    int ur = idx->ndim - 1 + x->ndim - (int)k;
    int ok = upd->ndim == ur && upd->dtype == x->dtype;
    for (int j = 0; ok && j < idx->ndim - 1; j++) ok = upd->dims[j] == idx->dims[j];
    for (int j = 0; ok && j < x->ndim - k; j++) ok = upd->dims[idx->ndim - 1 + j] == x->dims[k + j];
    if (!ok) return op_error(c, "updates must be %s of shape indices.shape[:-1] + data.shape[%lld:]", dtype_name(x->dtype), (long long)k);
    return set_shape(c, c->out[0], x->dtype, x->ndim, x->dims);
}

static int scatter_nd_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct scatter_params p = {RED_NONE, 0};
    int rc = scatter_reduction(c, &p.red);
    return rc ? rc : params_keep(c, &p, sizeof p, state);
}

static int scatter_nd_run(struct op_call *c) {
    const struct tensor *x = c->in[0], *idx = c->in[1], *upd = c->in[2];
    enum scatter_red red = ((const struct scatter_params *)c->state)->red;
    int64_t k = idx->dims[idx->ndim - 1], xs[TENSOR_MAX_DIMS];
    shape_strides(x->ndim, x->dims, xs);
    int64_t nt = prod(idx->dims, 0, idx->ndim - 1), slice = prod(x->dims, (int)k, x->ndim);
    for (int64_t t = 0; t < nt; t++) {
        int64_t off;
        if (nd_offset(c, x, idx, 0, k, 0, t, xs, &off)) return STATUS_INVALID;
    }
    run_copy0(c);
    size_t es = dtype_size(x->dtype);
    for (int64_t t = 0; t < nt; t++) {
        int64_t off;
        nd_offset(c, x, idx, 0, k, 0, t, xs, &off);
        if (red == RED_NONE) {
            memcpy((char *)c->out[0]->data + off * (int64_t)es, (const char *)upd->data + t * slice * (int64_t)es, (size_t)slice * es);
        } else {
            for (int64_t j = 0; j < slice; j++) scatter_apply(x->dtype, c->out[0]->data, off + j, upd->data, t * slice + j, red);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Range, OneHot, NonZero, EyeLike, Trilu
 * ------------------------------------------------------------------------ */

static int range_infer(struct op_call *c) {
    int rc;
    if ((rc = need_const(c, 0, "start")) || (rc = need_const(c, 1, "limit")) || (rc = need_const(c, 2, "delta"))) return rc;
    const struct tensor *s = c->in[0];
    if (need_bytes_dtype(c, s, "start")) return STATUS_INVALID;
    for (int i = 0; i < 3; i++)
        if (tensor_numel(c->in[i]) != 1) return op_error(c, "input %d must be a scalar", i);
    int64_t n;
    if (is_float_dtype(s->dtype)) {
        double a = op_double_at(c->in[0], 0), l = op_double_at(c->in[1], 0), d = op_double_at(c->in[2], 0);
        if (d == 0) return op_error(c, "delta is 0");
        double f = ceil((l - a) / d);
        if (!(f < 1e12)) return op_error(c, "the range has too many elements");
        if (dim_ok(c, f < 0 ? 0 : f, "the range's length")) return STATUS_INVALID;
        n = f > 0 ? (int64_t)f : 0;
    } else {
        int64_t a = op_int_at(c->in[0], 0), l = op_int_at(c->in[1], 0), d = op_int_at(c->in[2], 0);
        if (d == 0) return op_error(c, "delta is 0");
        double span = ((double)l - (double)a) / (double)d;
        if (dim_ok(c, span < 0 ? 0 : span, "the range's length")) return STATUS_INVALID;
        n = d > 0 ? (l > a ? (l - a + d - 1) / d : 0) : (a > l ? (a - l + (-d) - 1) / (-d) : 0);
    }
    return set_shape(c, c->out[0], s->dtype, 1, &n);
}

static int range_run(struct op_call *c) {
    struct tensor *o = c->out[0];
    int64_t n = o->dims[0];
    if (is_float_dtype(o->dtype)) {
        double a = op_double_at(c->in[0], 0), d = op_double_at(c->in[2], 0);
        for (int64_t i = 0; i < n; i++) shape_store_double(o->dtype, o->data, i, a + (double)i * d);
    } else {
        int64_t a = op_int_at(c->in[0], 0), d = op_int_at(c->in[2], 0);
        for (int64_t i = 0; i < n; i++) {
            int64_t v = a + i * d;
            switch (o->dtype) {
            case DT_INT64: ((int64_t *)o->data)[i] = v; break;
            case DT_UINT64: ((uint64_t *)o->data)[i] = (uint64_t)v; break;
            default: shape_store_double(o->dtype, o->data, i, (double)v);
            }
        }
    }
    return 0;
}

static int onehot_infer(struct op_call *c) {
    const struct tensor *idx = c->in[0];
    int rc;
    if ((rc = need_const(c, 1, "depth")) || (rc = need_input(c, 2, "values"))) return rc;
    const struct tensor *depth = c->in[1], *vals = c->in[2];
    if (tensor_numel(depth) != 1) return op_error(c, "depth must hold one value");
    if (tensor_numel(vals) != 2) return op_error(c, "values must hold two values [off, on]");
    if ((rc = need_bytes_dtype(c, vals, "values"))) return rc;
    if (dim_ok(c, op_double_at(depth, 0), "depth")) return STATUS_INVALID;
    int64_t dep = (int64_t)op_double_at(depth, 0);
    if (dep < 1) return op_error(c, "depth %lld must be positive", (long long)dep);
    int r = idx->ndim + 1;
    int a = op_axis(c, node_attr_int(c->node, "axis", -1), r);
    if (a < 0) return STATUS_INVALID;
    int64_t d[TENSOR_MAX_DIMS + 1];
    for (int k = 0, j = 0; k < r; k++) d[k] = k == a ? dep : idx->dims[j++];
    return set_shape(c, c->out[0], vals->dtype, r, d);
}

/* OneHot's axis counts in the output's rank, one more than the indices'. */
static int onehot_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct axis_params p = {op_axis(c, node_attr_int(c->node, "axis", -1), c->in[0]->ndim + 1)};
    return p.axis < 0 ? STATUS_INVALID : params_keep(c, &p, sizeof p, state);
}

static int onehot_run(struct op_call *c) {
    const struct tensor *idx = c->in[0], *vals = c->in[2];
    struct tensor *o = c->out[0];
    int a = ((const struct axis_params *)c->state)->axis;
    int64_t dep = o->dims[a], outer = prod(o->dims, 0, a), inner = prod(o->dims, a + 1, o->ndim);
    size_t es = dtype_size(o->dtype);
    const char *off = vals->data, *on = off + es;
    char *dst = o->data;
    int64_t n = tensor_numel(o);
    for (int64_t i = 0; i < n; i++) memcpy(dst + i * (int64_t)es, off, es);
    for (int64_t p = 0; p < outer; p++)
        for (int64_t q = 0; q < inner; q++) {
            int64_t v = (int64_t)op_double_at(idx, p * inner + q);
            if (v < 0) v += dep;
            if (v < 0 || v >= dep) continue; /* out-of-range classes stay all "off", as ONNX says */
            memcpy(dst + ((p * dep + v) * inner + q) * (int64_t)es, on, es);
        }
    return 0;
}

static int is_nonzero(const struct tensor *t, int64_t i) {
    if (t->dtype == DT_FP32 || t->dtype == DT_FP64 || t->dtype == DT_FP16 || t->dtype == DT_BF16) return op_double_at(t, i) != 0;
    size_t es = dtype_size(t->dtype);
    const unsigned char *p = (const unsigned char *)t->data + i * (int64_t)es;
    for (size_t b = 0; b < es; b++)
        if (p[b]) return 1;
    return 0;
}

static int nonzero_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    if (!x->data) {
        op_error(c, "NonZero's output shape depends on its input's values, which are computed at run time");
        return STATUS_DATA_DEPENDENT;
    }
    int rc = need_bytes_dtype(c, x, "input");
    if (rc) return rc;
    int64_t n = tensor_numel(x), nz = 0;
    for (int64_t i = 0; i < n; i++) nz += is_nonzero(x, i);
    int64_t d[2] = {x->ndim, nz};
    return set_shape(c, c->out[0], DT_INT64, 2, d);
}

static int nonzero_run(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t n = tensor_numel(x), nz = c->out[0]->dims[1], j = 0;
    int64_t *o = c->out[0]->data;
    for (int64_t i = 0; i < n; i++) {
        if (!is_nonzero(x, i)) continue;
        if (j >= nz) return op_error(c, "the input changed since the plan was built");
        int64_t rem = i;
        for (int k = x->ndim - 1; k >= 0; k--) {
            o[k * nz + j] = rem % x->dims[k];
            rem /= x->dims[k];
        }
        j++;
    }
    return 0;
}

static int eyelike_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    if (x->ndim != 2) return op_error(c, "input must be 2-D, got rank %d", x->ndim);
    enum dtype dt = (enum dtype)node_attr_int(c->node, "dtype", x->dtype);
    if (dt <= DT_UNDEFINED || dt >= DT_MAX_ || dt == DT_STRING || !dtype_size(dt)) return op_error(c, "unsupported dtype %d", (int)dt);
    return set_shape(c, c->out[0], dt, 2, x->dims);
}

/* EyeLike's diagonal k, decoded at prepare. */
struct eyelike_params {
    int64_t k;
};

static int eyelike_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct eyelike_params p = {node_attr_int(c->node, "k", 0)};
    return params_keep(c, &p, sizeof p, state);
}

static int eyelike_run(struct op_call *c) {
    struct tensor *o = c->out[0];
    int64_t k = ((const struct eyelike_params *)c->state)->k, r = o->dims[0], cols = o->dims[1];
    k = k > SHAPE_MAX_DIM ? SHAPE_MAX_DIM : (k < -SHAPE_MAX_DIM ? -SHAPE_MAX_DIM : k);
    memset(o->data, 0, tensor_nbytes(o));
    for (int64_t i = 0; i < r; i++) {
        int64_t j = i + k;
        if (j >= 0 && j < cols) shape_store_double(o->dtype, o->data, i * cols + j, 1.0);
    }
    return 0;
}

static int trilu_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    if (x->ndim < 2) return op_error(c, "input must have rank >= 2, got %d", x->ndim);
    int rc = need_bytes_dtype(c, x, "input");
    return rc ? rc : set_shape(c, c->out[0], x->dtype, x->ndim, x->dims);
}

/* Trilu's upper, decoded at prepare (k is an input, read at run time). */
struct trilu_params {
    int upper;
};

static int trilu_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct trilu_params p = {(int)node_attr_int(c->node, "upper", 1)};
    return params_keep(c, &p, sizeof p, state);
}

static int trilu_run(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t k = in_opt(c, 1) && c->in[1]->data ? op_int_at(c->in[1], 0) : 0;
    k = k > SHAPE_MAX_DIM ? SHAPE_MAX_DIM : (k < -SHAPE_MAX_DIM ? -SHAPE_MAX_DIM : k);
    int upper = ((const struct trilu_params *)c->state)->upper;
    int64_t rows = x->dims[x->ndim - 2], cols = x->dims[x->ndim - 1], nb = prod(x->dims, 0, x->ndim - 2);
    size_t es = dtype_size(x->dtype);
    run_copy0(c);
    char *o = c->out[0]->data;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t i = 0; i < rows; i++) {
            char *row = o + (b * rows + i) * cols * (int64_t)es;
            /* upper keeps j >= i + k, lower keeps j <= i + k */
            int64_t lo = upper ? 0 : i + k + 1, hi = upper ? i + k : cols;
            lo = lo < 0 ? 0 : (lo > cols ? cols : lo);
            hi = hi < 0 ? 0 : (hi > cols ? cols : hi);
            if (hi > lo) memset(row + lo * (int64_t)es, 0, (size_t)(hi - lo) * es);
        }
    return 0;
}

/* ------------------------------------------------------------------------
 * Pad
 * ------------------------------------------------------------------------ */

enum pad_mode { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP };

/* Pad's mode and per-axis pads, decoded at infer and again at prepare,
 * where the constant of opsets before 11 (an attribute) joins them. */
struct pad_params {
    enum pad_mode mode;
    int64_t begin[TENSOR_MAX_DIMS], end[TENSOR_MAX_DIMS];
    double value;
};

static int pad_params(struct op_call *c, struct pad_params *pp) {
    const struct tensor *x = c->in[0];
    int r = x->ndim;
    const char *mode = node_attr_str(c->node, "mode", "constant");
    if (!strcmp(mode, "constant")) pp->mode = PAD_CONSTANT;
    else if (!strcmp(mode, "reflect")) pp->mode = PAD_REFLECT;
    else if (!strcmp(mode, "edge")) pp->mode = PAD_EDGE;
    else if (!strcmp(mode, "wrap")) pp->mode = PAD_WRAP;
    else return op_error(c, "unknown mode '%s'", mode);
    int64_t pads[2 * TENSOR_MAX_DIMS], axes[TENSOR_MAX_DIMS];
    int n, na = -1;
    if (c->node->opset < 11) {
        n = read_int_attr(c, "pads", pads, 2 * TENSOR_MAX_DIMS);
        if (n == -1) n = read_int_attr(c, "paddings", pads, 2 * TENSOR_MAX_DIMS);
        if (n == -1) return op_error(c, "attribute 'pads' is required");
    } else {
        n = read_int_input(c, 1, "pads", pads, 2 * TENSOR_MAX_DIMS);
        if (in_opt(c, 3)) na = read_int_input(c, 3, "axes", axes, TENSOR_MAX_DIMS);
    }
    if (n < 0) return n;
    if (na < -1) return na;
    if (na < 0) {
        na = r;
        for (int k = 0; k < r; k++) axes[k] = k;
    }
    if (n != 2 * na) return op_error(c, "pads has %d values; expected %d (2 per axis)", n, 2 * na);
    memset(pp->begin, 0, sizeof pp->begin);
    memset(pp->end, 0, sizeof pp->end);
    for (int k = 0; k < na; k++) {
        int a = op_axis(c, axes[k], r);
        if (a < 0) return STATUS_INVALID;
        pp->begin[a] = pads[k];
        pp->end[a] = pads[na + k];
        if (dim_ok(c, (double)x->dims[a] + (double)pads[k] + (double)pads[na + k], "a padded dimension") ||
            dim_ok(c, fabs((double)pads[k]), "a pad") || dim_ok(c, fabs((double)pads[na + k]), "a pad"))
            return STATUS_INVALID;
        int64_t od = x->dims[a] + pads[k] + pads[na + k];
        if (od < 0) return op_error(c, "pads shrink axis %d below zero", a);
        if (pp->mode != PAD_CONSTANT && x->dims[a] == 0 && od > 0)
            return op_error(c, "axis %d is empty; only constant mode can pad it", a);
    }
    return 0;
}

static int pad_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    struct pad_params pp;
    int rc = need_bytes_dtype(c, x, "input");
    if (rc || (rc = pad_params(c, &pp))) return rc;
    const struct tensor *cv = in_opt(c, 2);
    if (c->node->opset >= 11 && cv && cv->dtype != x->dtype)
        return op_error(c, "constant_value is %s but data is %s", dtype_name(cv->dtype), dtype_name(x->dtype));
    int64_t d[TENSOR_MAX_DIMS];
    for (int k = 0; k < x->ndim; k++) d[k] = x->dims[k] + pp.begin[k] + pp.end[k];
    return set_shape(c, c->out[0], x->dtype, x->ndim, d);
}

/* The input coordinate that output coordinate o reads on an axis of size d
 * padded by b in front; -1 means "the constant". */
static inline int64_t pad_src(int64_t o, int64_t b, int64_t d, enum pad_mode m) {
    int64_t x = o - b;
    if (x >= 0 && x < d) return x;
    switch (m) {
    case PAD_CONSTANT: return -1;
    case PAD_EDGE: return x < 0 ? 0 : d - 1;
    case PAD_WRAP: return ((x % d) + d) % d;
    case PAD_REFLECT: {
        if (d == 1) return 0;
        int64_t p = 2 * (d - 1);
        x = ((x % p) + p) % p;
        return x >= d ? p - x : x;
    }
    }
    return -1;
}

static int pad_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct pad_params pp;
    int rc = pad_params(c, &pp);
    if (rc) return rc;
    pp.value = c->node->opset < 11 ? node_attr_float(c->node, "value", 0) : 0;
    return params_keep(c, &pp, sizeof pp, state);
}

static int pad_run(struct op_call *c) {
    const struct tensor *x = c->in[0];
    struct tensor *o = c->out[0];
    const struct pad_params pp = *(const struct pad_params *)c->state;
    size_t es = dtype_size(x->dtype);
    unsigned char fill[16] = {0};
    if (c->node->opset < 11) {
        shape_store_double(x->dtype, fill, 0, pp.value);
    } else {
        const struct tensor *cv = in_opt(c, 2);
        if (cv && cv->data && tensor_numel(cv) >= 1) memcpy(fill, cv->data, es);
    }
    int r = x->ndim;
    if (r == 0) {
        memcpy(o->data, x->data, es);
        return 0;
    }
    int64_t xs[TENSOR_MAX_DIMS];
    shape_strides(r, x->dims, xs);
    int64_t cols = o->dims[r - 1], rows = prod(o->dims, 0, r - 1), dl = x->dims[r - 1], bl = pp.begin[r - 1];
    if (rows == 0 || cols == 0) return 0;
    char *dst = o->data;
    const char *src = x->data;
    PAR_FOR(rows * cols > 65536, c->nthreads, ,
        for (int64_t row = 0; row < rows; row++) {
            int64_t rem = row, base = 0;
            int constant = 0;
            for (int k = r - 2; k >= 0; k--) {
                int64_t ok = rem % o->dims[k];
                rem /= o->dims[k];
                int64_t s = pad_src(ok, pp.begin[k], x->dims[k], pp.mode);
                if (s < 0) constant = 1;
                else base += s * xs[k];
            }
            char *drow = dst + row * cols * (int64_t)es;
            if (constant || dl == 0) {
                for (int64_t j = 0; j < cols; j++) memcpy(drow + j * (int64_t)es, fill, es);
                continue;
            }
            /* The interior is one contiguous run; only the borders need mapping. */
            int64_t j0 = bl < 0 ? 0 : bl, j1 = bl + dl < cols ? bl + dl : cols;
            for (int64_t j = 0; j < j0 && j < cols; j++) {
                int64_t s = pad_src(j, bl, dl, pp.mode);
                memcpy(drow + j * (int64_t)es, s < 0 ? (const char *)fill : src + (base + s) * (int64_t)es, es);
            }
            if (j1 > j0) memcpy(drow + j0 * (int64_t)es, src + (base + j0 - bl) * (int64_t)es, (size_t)(j1 - j0) * es);
            for (int64_t j = j1 > j0 ? j1 : j0; j < cols; j++) {
                int64_t s = pad_src(j, bl, dl, pp.mode);
                memcpy(drow + j * (int64_t)es, s < 0 ? (const char *)fill : src + (base + s) * (int64_t)es, es);
            }
        });
    return 0;
}

/* ------------------------------------------------------------------------
 * TopK
 * ------------------------------------------------------------------------ */

struct topk_item {
    union {
        double f;
        int64_t i;
        uint64_t u;
    } v;
    int64_t idx;
};

/* Ties keep the lower index first, as ONNX specifies. */
#define TOPK_CMP(NAME, FIELD, GT)                                                   \
    static int NAME(const void *pa, const void *pb) {                               \
        const struct topk_item *a = pa, *b = pb;                                    \
        if (a->v.FIELD != b->v.FIELD) return (a->v.FIELD GT b->v.FIELD) ? -1 : 1;   \
        return a->idx < b->idx ? -1 : (a->idx > b->idx);                            \
    }
TOPK_CMP(topk_f_large, f, >)
TOPK_CMP(topk_f_small, f, <)
TOPK_CMP(topk_i_large, i, >)
TOPK_CMP(topk_i_small, i, <)
TOPK_CMP(topk_u_large, u, >)
TOPK_CMP(topk_u_small, u, <)

/* Sifts h[i] down the heap h[0..n) whose root is its last item in cmp's
 * order (the one the next better candidate replaces). */
static void topk_sift(struct topk_item *h, int64_t n, int64_t i, int (*cmp)(const void *, const void *)) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && cmp(&h[l], &h[m]) > 0) m = l;
        if (r < n && cmp(&h[r], &h[m]) > 0) m = r;
        if (m == i) return;
        struct topk_item t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* The first k of it[0..n) in cmp's order, in it[0..k): the whole row
 * sorted, or for a few of many (detectors' candidates: 1000 of millions) a
 * heap of the k best so far, which most items leave after one comparison. */
static void topk_select(struct topk_item *it, int64_t n, int64_t k, int (*cmp)(const void *, const void *)) {
    if (k == 0) return;
    if (k * 8 > n) {
        qsort(it, (size_t)n, sizeof *it, cmp);
        return;
    }
    for (int64_t i = k / 2 - 1; i >= 0; i--) topk_sift(it, k, i, cmp);
    for (int64_t j = k; j < n; j++) {
        if (cmp(&it[j], &it[0]) >= 0) continue;
        it[0] = it[j];
        topk_sift(it, k, 0, cmp);
    }
    qsort(it, (size_t)k, sizeof *it, cmp);
}

static int topk_k(struct op_call *c, int64_t *k) {
    if (c->node->opset < 10) {
        *k = node_attr_int(c->node, "k", -1);
        return 0;
    }
    int64_t v[1] = {0};
    int n = read_int_input(c, 1, "K", v, 1);
    if (n < 0) return n;
    if (n != 1) return op_error(c, "K must hold one value");
    *k = v[0];
    return 0;
}

static int topk_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int64_t k = 0;
    int rc = topk_k(c, &k);
    if (rc) return rc;
    if ((rc = need_bytes_dtype(c, x, "input"))) return rc;
    if (x->dtype == DT_BOOL) return op_error(c, "unsupported dtype bool");
    int a = op_axis(c, node_attr_int(c->node, "axis", -1), x->ndim);
    if (a < 0) return STATUS_INVALID;
    if (k < 0 || k > x->dims[a]) return op_error(c, "k = %lld is out of range for axis %d of size %lld", (long long)k, a, (long long)x->dims[a]);
    int64_t d[TENSOR_MAX_DIMS];
    memcpy(d, x->dims, sizeof d);
    d[a] = k;
    if ((rc = set_shape(c, c->out[0], x->dtype, x->ndim, d))) return rc;
    if (out_opt(c, 1)) rc = set_shape(c, c->out[1], DT_INT64, x->ndim, d);
    return rc;
}

/* TopK's normalized axis and direction, decoded at prepare (k is the
 * output's length on the axis). */
struct topk_params {
    int axis, largest;
};

static int topk_prepare(struct op_call *c, void **state, size_t *scratch) {
    const struct tensor *x = c->in[0];
    struct topk_params p = {op_axis(c, node_attr_int(c->node, "axis", -1), x->ndim), (int)node_attr_int(c->node, "largest", 1)};
    if (p.axis < 0) return STATUS_INVALID;
    *scratch = (size_t)(x->dims[p.axis] + 1) * sizeof(struct topk_item);
    return params_keep(c, &p, sizeof p, state);
}

static int topk_run(struct op_call *c) {
    const struct topk_params *p = c->state;
    const struct tensor *x = c->in[0];
    int a = p->axis, largest = p->largest;
    int64_t k = c->out[0]->dims[a], n = x->dims[a], outer = prod(x->dims, 0, a), inner = prod(x->dims, a + 1, x->ndim);
    struct topk_item *it = c->scratch;
    if (!it || c->scratch_size < (size_t)n * sizeof *it) return op_error(c, "scratch buffer too small");
    size_t es = dtype_size(x->dtype);
    int kind = is_float_dtype(x->dtype) ? 0 : (x->dtype == DT_UINT64 ? 2 : 1);
    int (*cmp)(const void *, const void *) = kind == 0 ? (largest ? topk_f_large : topk_f_small)
                                             : kind == 1 ? (largest ? topk_i_large : topk_i_small)
                                                         : (largest ? topk_u_large : topk_u_small);
    char *vals = c->out[0]->data;
    int64_t *idxs = out_opt(c, 1) ? c->out[1]->data : NULL;
    for (int64_t p = 0; p < outer; p++)
        for (int64_t q = 0; q < inner; q++) {
            for (int64_t j = 0; j < n; j++) {
                int64_t at = (p * n + j) * inner + q;
                if (kind == 0) it[j].v.f = op_double_at(x, at);
                else if (kind == 1) it[j].v.i = op_int_at(x, at);
                else it[j].v.u = ((const uint64_t *)x->data)[at];
                it[j].idx = j;
            }
            topk_select(it, n, k, cmp);
            for (int64_t j = 0; j < k; j++) {
                int64_t at = (p * k + j) * inner + q;
                memcpy(vals + at * (int64_t)es, (const char *)x->data + ((p * n + it[j].idx) * inner + q) * (int64_t)es, es);
                if (idxs) idxs[at] = it[j].idx;
            }
        }
    return 0;
}

/* ------------------------------------------------------------------------
 * CenterCropPad, BitCast
 * ------------------------------------------------------------------------ */

/* CenterCropPad's crop start, pad offset and output size per axis,
 * decoded at infer and again at prepare. */
struct ccp_params {
    int64_t start[TENSOR_MAX_DIMS], pad[TENSOR_MAX_DIMS], out[TENSOR_MAX_DIMS];
};

/* CenterCropPad: each listed axis is cropped or zero-padded around its
 * centre to the requested size (crop offset rounds down, pad offset too). */
static int ccp_params(struct op_call *c, struct ccp_params *g) {
    const struct tensor *x = c->in[0];
    int64_t *start = g->start, *pad = g->pad, *out = g->out;
    int64_t shape[TENSOR_MAX_DIMS], axes[TENSOR_MAX_DIMS];
    int n = read_int_input(c, 1, "shape", shape, TENSOR_MAX_DIMS);
    if (n < 0) return n;
    int na = read_int_attr(c, "axes", axes, TENSOR_MAX_DIMS);
    if (na < -1) return na;
    if (na < 0) {
        na = x->ndim;
        for (int k = 0; k < na; k++) axes[k] = k;
    }
    if (n != na) return op_error(c, "shape has %d values for %d axes", n, na);
    for (int k = 0; k < x->ndim; k++) {
        start[k] = pad[k] = 0;
        out[k] = x->dims[k];
    }
    for (int k = 0; k < na; k++) {
        int a = op_axis(c, axes[k], x->ndim);
        if (a < 0) return STATUS_INVALID;
        if (dim_ok(c, (double)shape[k], "a shape value")) return STATUS_INVALID;
        int64_t d = x->dims[a], s = shape[k];
        out[a] = s;
        if (s < d) start[a] = (d - s) / 2;
        else pad[a] = (s - d) / 2;
    }
    return 0;
}

static int ccp_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    struct ccp_params g;
    int rc = need_bytes_dtype(c, x, "input");
    if (rc || (rc = ccp_params(c, &g))) return rc;
    return set_shape(c, c->out[0], x->dtype, x->ndim, g.out);
}

static int ccp_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct ccp_params g;
    int rc = ccp_params(c, &g);
    return rc ? rc : params_keep(c, &g, sizeof g, state);
}

static int ccp_run(struct op_call *c) {
    const struct ccp_params *p = c->state;
    const struct tensor *x = c->in[0];
    struct tensor *o = c->out[0];
    const int64_t *st = p->start, *pd = p->pad, *out = p->out;
    int64_t xs[TENSOR_MAX_DIMS], os[TENSOR_MAX_DIMS];
    size_t es = dtype_size(x->dtype);
    memset(o->data, 0, tensor_nbytes(o));
    /* The copied block: min(in, out) per axis, from st in x to pd in o. */
    int64_t len[TENSOR_MAX_DIMS], base_x = 0, base_o = 0;
    shape_strides(x->ndim, x->dims, xs);
    shape_strides(o->ndim, o->dims, os);
    for (int k = 0; k < x->ndim; k++) {
        len[k] = x->dims[k] < out[k] ? x->dims[k] : out[k];
        if (len[k] == 0) return 0;
        base_x += st[k] * xs[k];
        base_o += pd[k] * os[k];
    }
    int r = x->ndim;
    int64_t rows = prod(len, 0, r - 1), inner = r ? len[r - 1] : 1;
    for (int64_t row = 0; row < rows; row++) {
        int64_t rem = row, ox = base_x, oo = base_o;
        for (int k = r - 2; k >= 0; k--) {
            int64_t i = rem % len[k];
            rem /= len[k];
            ox += i * xs[k];
            oo += i * os[k];
        }
        memcpy((char *)o->data + oo * (int64_t)es, (const char *)x->data + ox * (int64_t)es, (size_t)inner * es);
    }
    return 0;
}


static int bitcast_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int rc = need_bytes_dtype(c, x, "input");
    if (rc) return rc;
    int64_t to = node_attr_int(c->node, "to", 0);
    if (to <= DT_UNDEFINED || to >= DT_MAX_ || to == DT_STRING || !dtype_size((enum dtype)to))
        return op_error(c, "unsupported target dtype %lld", (long long)to);
    if (dtype_size((enum dtype)to) != dtype_size(x->dtype))
        return op_error(c, "%s and %s differ in bit width", dtype_name(x->dtype), dtype_name((enum dtype)to));
    return set_shape(c, c->out[0], (enum dtype)to, x->ndim, x->dims);
}

/* Compress keeps the slices whose condition is true; the condition decides
 * the output shape, so it must be known when the plan is built. */
static int compress_params(struct op_call *c, int *axis, int64_t *kept) {
    const struct tensor *x = c->in[0];
    int rc = need_const(c, 1, "condition");
    if (rc) return rc;
    const struct tensor *cond = c->in[1];
    if (cond->ndim != 1) return op_error(c, "condition must be 1-D, got rank %d", cond->ndim);
    const struct graph_attr *a = node_attr(c->node, "axis");
    int ax = -1;
    if (a) {
        ax = op_axis(c, a->i, x->ndim);
        if (ax < 0) return STATUS_INVALID;
    }
    int64_t len = ax >= 0 ? x->dims[ax] : tensor_numel(x), n = tensor_numel(cond), k = 0;
    if (n > len) return op_error(c, "condition has %lld values but the axis has %lld", (long long)n, (long long)len);
    for (int64_t i = 0; i < n; i++) k += op_int_at(cond, i) != 0;
    *axis = ax;
    *kept = k;
    return 0;
}

static int compress_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int ax;
    int64_t k;
    int rc = need_movable_dtype(c, x, "input");
    if (rc || (rc = compress_params(c, &ax, &k))) return rc;
    if (ax < 0) return set_shape(c, c->out[0], x->dtype, 1, &k);
    int64_t d[TENSOR_MAX_DIMS];
    memcpy(d, x->dims, sizeof d);
    d[ax] = k;
    return set_shape(c, c->out[0], x->dtype, x->ndim, d);
}

/* Compress's normalized axis (-1: the flattened input), decoded at
 * prepare. */
struct compress_params {
    int axis;
};

static int compress_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct compress_params p;
    int64_t kept;
    int rc = compress_params(c, &p.axis, &kept);
    return rc ? rc : params_keep(c, &p, sizeof p, state);
}

static int compress_run(struct op_call *c) {
    const struct tensor *x = c->in[0], *cond = c->in[1];
    int ax = ((const struct compress_params *)c->state)->axis;
    size_t es = dtype_size(x->dtype);
    int64_t outer = ax < 0 ? 1 : prod(x->dims, 0, ax), len = ax < 0 ? tensor_numel(x) : x->dims[ax];
    int64_t inner = ax < 0 ? 1 : prod(x->dims, ax + 1, x->ndim), n = tensor_numel(cond);
    char *dst = c->out[0]->data;
    for (int64_t p = 0; p < outer; p++)
        for (int64_t i = 0; i < n; i++) {
            if (!op_int_at(cond, i)) continue;
            memcpy(dst, (const char *)x->data + (p * len + i) * inner * (int64_t)es, (size_t)inner * es);
            dst += inner * (int64_t)es;
        }
    return 0;
}

/* ------------------------------------------------------------------------
 * Unique: its output shapes depend on the values, so the input must be
 * known when the plan is built (a constant, or an input the plan is built
 * per value of). Items are elements, or slices along axis; a stable sort
 * groups equal items, the first of each group is its first occurrence.
 * ------------------------------------------------------------------------ */

struct unique_ctx {
    const struct tensor *x;
    int64_t len, outer, inner;
};

static int unique_cmp(const void *pa, const void *pb, void *arg) {
    const struct unique_ctx *u = arg;
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    for (int64_t o = 0; o < u->outer; o++)
        for (int64_t i = 0; i < u->inner; i++) {
            double va = op_double_at(u->x, (o * u->len + a) * u->inner + i);
            double vb = op_double_at(u->x, (o * u->len + b) * u->inner + i);
            if (va != vb) return va < vb ? -1 : 1;
        }
    return a < b ? -1 : (a > b); /* stable: equal items keep their order */
}

static int unique_first_cmp(const void *pa, const void *pb, void *arg) {
    const int64_t *first = arg;
    int64_t a = first[*(const int64_t *)pa], b = first[*(const int64_t *)pb];
    return a < b ? -1 : (a > b);
}

/* Fills ord (n item indices, sorted), grp (group of each sorted position)
 * and first (first occurrence per group, in output order via perm);
 * returns the number of unique items. */
static int64_t unique_groups(const struct unique_ctx *u, int sorted, int64_t *ord, int64_t *grp, int64_t *first, int64_t *perm) {
    int64_t n = u->len, ng = 0;
    for (int64_t k = 0; k < n; k++) ord[k] = k;
    qsort_r(ord, (size_t)n, sizeof *ord, unique_cmp, (void *)u);
    for (int64_t k = 0; k < n; k++) {
        int64_t a = ord[k];
        if (k == 0) {
            first[ng++] = a;
        } else {
            int64_t b = ord[k - 1];
            struct unique_ctx v = *u;
            int same = 1;
            for (int64_t o = 0; same && o < v.outer; o++)
                for (int64_t i = 0; same && i < v.inner; i++)
                    same = op_double_at(v.x, (o * v.len + a) * v.inner + i) == op_double_at(v.x, (o * v.len + b) * v.inner + i);
            if (!same) first[ng++] = a;
        }
        grp[k] = ng - 1;
    }
    for (int64_t g = 0; g < ng; g++) perm[g] = g;
    if (!sorted) qsort_r(perm, (size_t)ng, sizeof *perm, unique_first_cmp, first);
    return ng;
}

/* The items of x: slices along axis, or its elements when axis is -1. */
static void unique_view(const struct tensor *x, int axis, struct unique_ctx *u) {
    u->x = x;
    if (axis >= 0) {
        u->len = x->dims[axis];
        u->outer = prod(x->dims, 0, axis);
        u->inner = prod(x->dims, axis + 1, x->ndim);
    } else {
        u->len = tensor_numel(x);
        u->outer = u->inner = 1;
    }
}

static int unique_ctx(struct op_call *c, struct unique_ctx *u, int *axis) {
    const struct tensor *x = c->in[0];
    if (!x->data) {
        op_error(c, "Unique's output shape depends on its input's values, which are computed at run time");
        return STATUS_DATA_DEPENDENT;
    }
    int rc = need_bytes_dtype(c, x, "input");
    if (rc) return rc;
    const struct graph_attr *a = node_attr(c->node, "axis");
    *axis = -1;
    if (a) {
        *axis = op_axis(c, a->i, x->ndim);
        if (*axis < 0) return STATUS_INVALID;
    }
    unique_view(x, *axis, u);
    return 0;
}

static int unique_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    struct unique_ctx u;
    int axis, rc = unique_ctx(c, &u, &axis);
    if (rc) return rc;
    int64_t n = u.len > 0 ? u.len : 1;
    int64_t *buf = malloc(sizeof(int64_t) * (size_t)n * 4);
    if (!buf) return STATUS_NOMEM;
    int64_t ng = u.len ? unique_groups(&u, 1, buf, buf + n, buf + 2 * n, buf + 3 * n) : 0;
    free(buf);
    int64_t d[TENSOR_MAX_DIMS];
    if (axis < 0) {
        rc = set_shape(c, c->out[0], x->dtype, 1, &ng);
    } else {
        memcpy(d, x->dims, sizeof d);
        d[axis] = ng;
        rc = set_shape(c, c->out[0], x->dtype, x->ndim, d);
    }
    if (!rc && out_opt(c, 1)) rc = set_shape(c, c->out[1], DT_INT64, 1, &ng);
    if (!rc && out_opt(c, 2)) rc = set_shape(c, c->out[2], DT_INT64, 1, &u.len);
    if (!rc && out_opt(c, 3)) rc = set_shape(c, c->out[3], DT_INT64, 1, &ng);
    return rc;
}

/* Unique's normalized axis (-1: the flattened input) and sorted,
 * decoded at prepare. */
struct unique_params {
    int axis, sorted;
};

static int unique_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct unique_ctx u;
    struct unique_params p;
    int rc = unique_ctx(c, &u, &p.axis);
    if (rc) return rc;
    p.sorted = (int)node_attr_int(c->node, "sorted", 1);
    *scratch = sizeof(int64_t) * (size_t)(u.len + 1) * 5;
    return params_keep(c, &p, sizeof p, state);
}

static int unique_run(struct op_call *c) {
    const struct unique_params *p = c->state;
    struct unique_ctx u;
    int axis = p->axis;
    unique_view(c->in[0], axis, &u);
    int64_t n = u.len;
    if (c->scratch_size < sizeof(int64_t) * (size_t)(n + 1) * 5) return op_error(c, "scratch buffer too small");
    int64_t *ord = c->scratch, *grp = ord + n + 1, *first = grp + n + 1, *perm = first + n + 1, *rank = perm + n + 1;
    int64_t ng = n ? unique_groups(&u, p->sorted, ord, grp, first, perm) : 0;
    int64_t want = axis < 0 ? c->out[0]->dims[0] : c->out[0]->dims[axis];
    if (ng != want) return op_error(c, "the input changed since the plan was built");
    for (int64_t j = 0; j < ng; j++) rank[perm[j]] = j; /* output position of each group */
    size_t es = dtype_size(u.x->dtype);
    char *y = c->out[0]->data;
    for (int64_t j = 0; j < ng; j++) {
        int64_t item = first[perm[j]];
        for (int64_t o = 0; o < u.outer; o++)
            memcpy(y + ((o * ng + j) * u.inner) * (int64_t)es, (const char *)u.x->data + ((o * n + item) * u.inner) * (int64_t)es,
                   (size_t)u.inner * es);
    }
    int64_t *idx = out_opt(c, 1) ? c->out[1]->data : NULL, *inv = out_opt(c, 2) ? c->out[2]->data : NULL;
    int64_t *cnt = out_opt(c, 3) ? c->out[3]->data : NULL;
    if (idx)
        for (int64_t j = 0; j < ng; j++) idx[j] = first[perm[j]];
    if (cnt) memset(cnt, 0, sizeof(int64_t) * (size_t)ng);
    for (int64_t k = 0; k < n; k++) {
        int64_t j = rank[grp[k]];
        if (inv) inv[ord[k]] = j;
        if (cnt) cnt[j]++;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * ReverseSequence, TensorScatter
 * ------------------------------------------------------------------------ */

static int revseq_axes(struct op_call *c, int *bax, int *tax) {
    const struct tensor *x = c->in[0];
    *bax = (int)node_attr_int(c->node, "batch_axis", 1);
    *tax = (int)node_attr_int(c->node, "time_axis", 0);
    if (x->ndim < 2) return op_error(c, "input must have rank >= 2, got %d", x->ndim);
    if (!((*bax == 0 && *tax == 1) || (*bax == 1 && *tax == 0))) return op_error(c, "batch_axis and time_axis must be 0 and 1 in some order");
    return 0;
}

static int revseq_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int bax, tax, rc = need_input(c, 1, "sequence_lens");
    if (rc || (rc = revseq_axes(c, &bax, &tax)) || (rc = need_movable_dtype(c, x, "input")) ||
        (rc = need_int_dtype(c, c->in[1], "sequence_lens")))
        return rc;
    if (tensor_numel(c->in[1]) != x->dims[bax]) return op_error(c, "sequence_lens must have one value per batch entry (%lld)", (long long)x->dims[bax]);
    return set_shape(c, c->out[0], x->dtype, x->ndim, x->dims);
}

/* ReverseSequence's batch and time axes, decoded at prepare. */
struct revseq_params {
    int bax, tax;
};

static int revseq_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct revseq_params p;
    int rc = revseq_axes(c, &p.bax, &p.tax);
    return rc ? rc : params_keep(c, &p, sizeof p, state);
}

static int revseq_run(struct op_call *c) {
    const struct tensor *x = c->in[0], *lens = c->in[1];
    const struct revseq_params *p = c->state;
    int bax = p->bax, tax = p->tax;
    int64_t nb = x->dims[bax], nt = x->dims[tax], inner = prod(x->dims, 2, x->ndim);
    for (int64_t b = 0; b < nb; b++) {
        int64_t l = op_int_at(lens, b);
        if (l < 0 || l > nt) return op_error(c, "sequence_lens[%lld] = %lld is outside [0, %lld]", (long long)b, (long long)l, (long long)nt);
    }
    size_t es = dtype_size(x->dtype);
    size_t row = (size_t)inner * es;
    for (int64_t b = 0; b < nb; b++) {
        int64_t l = op_int_at(lens, b);
        for (int64_t t = 0; t < nt; t++) {
            int64_t src_t = t < l ? l - 1 - t : t;
            int64_t di = tax == 0 ? t * nb + b : b * nt + t, si = tax == 0 ? src_t * nb + b : b * nt + src_t;
            memcpy((char *)c->out[0]->data + di * (int64_t)row, (const char *)x->data + si * (int64_t)row, row);
        }
    }
    return 0;
}

/* TensorScatter writes update into a copy of the cache at each batch
 * entry's write index (KV-cache appends). */
static int tscatter_params(struct op_call *c, int *axis, int *circular) {
    const struct tensor *past = c->in[0], *upd = in_opt(c, 1);
    if (!upd) return op_error(c, "input 1 (update) is required");
    int a = op_axis(c, node_attr_int(c->node, "axis", -2), past->ndim);
    if (a < 0) return STATUS_INVALID;
    if (a == 0) return op_error(c, "axis cannot be the batch axis 0");
    const char *mode = node_attr_str(c->node, "mode", "linear");
    if (strcmp(mode, "linear") && strcmp(mode, "circular")) return op_error(c, "unknown mode '%s'", mode);
    *circular = !strcmp(mode, "circular");
    *axis = a;
    if (upd->ndim != past->ndim || upd->dtype != past->dtype) return op_error(c, "update must match past_cache in rank and dtype");
    for (int k = 0; k < past->ndim; k++)
        if (k != a && upd->dims[k] != past->dims[k]) return op_error(c, "update and past_cache differ on axis %d", k);
    if (upd->dims[a] > past->dims[a]) return op_error(c, "update is longer than the cache on axis %d", a);
    const struct tensor *wi = in_opt(c, 2);
    if (wi && tensor_numel(wi) != past->dims[0]) return op_error(c, "write_indices must have one value per batch entry");
    return 0;
}

static int tscatter_infer(struct op_call *c) {
    const struct tensor *past = c->in[0];
    int a, circ, rc = need_movable_dtype(c, past, "past_cache");
    if (rc || (rc = tscatter_params(c, &a, &circ))) return rc;
    if (in_opt(c, 2) && (rc = need_int_dtype(c, c->in[2], "write_indices"))) return rc;
    return set_shape(c, c->out[0], past->dtype, past->ndim, past->dims);
}

/* TensorScatter's normalized axis and mode, decoded at prepare. */
struct tscatter_params {
    int axis, circular;
};

static int tscatter_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct tscatter_params p;
    int rc = tscatter_params(c, &p.axis, &p.circular);
    return rc ? rc : params_keep(c, &p, sizeof p, state);
}

static int tscatter_run(struct op_call *c) {
    const struct tensor *past = c->in[0], *upd = c->in[1], *wi = in_opt(c, 2);
    const struct tscatter_params *p = c->state;
    int a = p->axis, circ = p->circular;
    int64_t nb = past->dims[0], maxs = past->dims[a], seq = upd->dims[a];
    int64_t mid = prod(past->dims, 1, a), inner = prod(past->dims, a + 1, past->ndim);
    for (int64_t b = 0; b < nb && !circ; b++) {
        int64_t w = wi ? op_int_at(wi, b) : 0;
        if (w < 0 || w + seq > maxs)
            return op_error(c, "write index %lld + %lld updates exceeds the cache length %lld", (long long)w, (long long)seq, (long long)maxs);
    }
    run_copy0(c);
    size_t es = dtype_size(past->dtype), row = (size_t)inner * es;
    char *dst = c->out[0]->data;
    const char *src = upd->data;
    for (int64_t b = 0; b < nb; b++) {
        int64_t w = wi ? op_int_at(wi, b) : 0;
        for (int64_t m = 0; m < mid; m++)
            for (int64_t s = 0; s < seq; s++) {
                int64_t t = w + s;
                if (circ) t = ((t % maxs) + maxs) % maxs;
                memcpy(dst + ((b * mid + m) * maxs + t) * (int64_t)row, src + ((b * mid + m) * seq + s) * (int64_t)row, row);
            }
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------ */

const struct op_def op_defs_shape[] = {
    {"Reshape", "", reshape_infer, NULL, run_copy0, NULL, OP_ALIAS_INPUT0},
    {"Flatten", "", flatten_infer, NULL, run_copy0, NULL, OP_ALIAS_INPUT0},
    {"Squeeze", "", squeeze_infer, NULL, run_copy0, NULL, OP_ALIAS_INPUT0},
    {"Unsqueeze", "", unsqueeze_infer, NULL, run_copy0, NULL, OP_ALIAS_INPUT0},
    {"Identity", "", identity_infer, NULL, run_copy0, NULL, OP_ALIAS_INPUT0},
    {"OptionalGetElement", "", optional_get_infer, NULL, run_copy0, NULL, OP_ALIAS_INPUT0},
    {"OptionalHasElement", "", optional_has_infer, NULL, optional_has_run, NULL, OP_SHAPE_ONLY},
    {"Dropout", "", dropout_infer, NULL, dropout_run, NULL, OP_ALIAS_INPUT0},
    {"Shape", "", shape_infer, shape_prepare, shape_run, op_params_free, OP_SHAPE_ONLY},
    {"Size", "", size_infer, NULL, size_run, NULL, OP_SHAPE_ONLY},
    {"Constant", "", constant_infer, constant_prepare, constant_run, op_params_free, 0},
    {"ConstantOfShape", "", cos_infer, cos_prepare, cos_run, op_params_free, 0},
    {"Transpose", "", transpose_infer, transpose_prepare, transpose_run, op_params_free, 0},
    {"DepthToSpace", "", d2s_infer, d2s_prepare, d2s_run, op_params_free, 0},
    {"SpaceToDepth", "", s2d_infer, s2d_prepare, s2d_run, op_params_free, 0},
    {"Concat", "", concat_infer, concat_prepare, concat_run, op_params_free, 0},
    {"Split", "", split_infer, split_prepare, split_run, op_params_free, 0},
    {"Slice", "", slice_infer, slice_prepare, slice_run, op_params_free, 0},
    {"Expand", "", expand_infer, NULL, expand_run, NULL, 0},
    {"Tile", "", tile_infer, NULL, tile_run, NULL, 0},
    {"Gather", "", gather_infer, gather_prepare, gather_run, op_params_free, 0},
    {"GatherElements", "", gather_elements_infer, gather_prepare, gather_elements_run, op_params_free, 0},
    {"GatherND", "", gather_nd_infer, gather_nd_prepare, gather_nd_run, op_params_free, 0},
    {"ScatterElements", "", scatter_elements_infer, scatter_elements_prepare, scatter_elements_run, op_params_free, 0},
    {"Scatter", "", scatter_elements_infer, scatter_elements_prepare, scatter_elements_run, op_params_free, 0},
    {"ScatterND", "", scatter_nd_infer, scatter_nd_prepare, scatter_nd_run, op_params_free, 0},
    {"Range", "", range_infer, NULL, range_run, NULL, 0},
    {"OneHot", "", onehot_infer, onehot_prepare, onehot_run, op_params_free, 0},
    {"NonZero", "", nonzero_infer, NULL, nonzero_run, NULL, 0},
    {"EyeLike", "", eyelike_infer, eyelike_prepare, eyelike_run, op_params_free, 0},
    {"Trilu", "", trilu_infer, trilu_prepare, trilu_run, op_params_free, 0},
    {"Pad", "", pad_infer, pad_prepare, pad_run, op_params_free, 0},
    {"TopK", "", topk_infer, topk_prepare, topk_run, op_params_free, 0},
    {"CenterCropPad", "", ccp_infer, ccp_prepare, ccp_run, op_params_free, 0},
    {"BitCast", "", bitcast_infer, NULL, run_copy0, NULL, OP_ALIAS_INPUT0},
    {"Compress", "", compress_infer, compress_prepare, compress_run, op_params_free, 0},
    {"Unique", "", unique_infer, unique_prepare, unique_run, op_params_free, 0},
    {"ReverseSequence", "", revseq_infer, revseq_prepare, revseq_run, op_params_free, 0},
    {"TensorScatter", "", tscatter_infer, tscatter_prepare, tscatter_run, op_params_free, 0},
    {0},
};
