/* shape_util.h - private helpers of the shape-family kernels: byte-moving
 * loops that work for every dtype (they only know the element size), and
 * the checks and readers for the inputs and attributes that decide a
 * shape. Everything here is static inline so that ops_shape.c, the
 * families kept in files of their own beside it and their unit tests
 * share one definition without a new public symbol. */
#ifndef KILN_CPU_SHAPE_UTIL_H
#define KILN_CPU_SHAPE_UTIL_H

#include <stdint.h>
#include <string.h>

#include "kernels/cpu/par_util.h"
#include "kernels/ops.h"

/* Strided copies may view a tensor with twice its rank (Tile, DepthToSpace). */
#define SHAPE_MAX_VIEW_DIMS (2 * TENSOR_MAX_DIMS)

static inline void shape_copy_elem(void *dst, const void *src, size_t es) {
    switch (es) {
    case 1: *(uint8_t *)dst = *(const uint8_t *)src; break;
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    case 8: memcpy(dst, src, 8); break;
    default: memcpy(dst, src, es); break;
    }
}

/* One row of shape_strided_copy: inner elements from s + off, stride
 * istride, into d. */
static inline void shape_copy_row(char *d, const char *s, int64_t off, int64_t inner, int64_t istride, size_t es) {
    if (istride == 1 && inner * (int64_t)es > 64) {
        memcpy(d, s + off * (int64_t)es, (size_t)inner * es);
    } else if (es == 4) {
        const uint32_t *sp = (const uint32_t *)(const void *)s + off;
        uint32_t *dp = (uint32_t *)(void *)d;
        for (int64_t i = 0; i < inner; i++) memcpy(dp + i, sp + i * istride, 4);
    } else if (es == 8) {
        const uint64_t *sp = (const uint64_t *)(const void *)s + off;
        uint64_t *dp = (uint64_t *)(void *)d;
        for (int64_t i = 0; i < inner; i++) memcpy(dp + i, sp + i * istride, 8);
    } else if (es == 2) {
        const uint16_t *sp = (const uint16_t *)(const void *)s + off;
        uint16_t *dp = (uint16_t *)(void *)d;
        for (int64_t i = 0; i < inner; i++) memcpy(dp + i, sp + i * istride, 2);
    } else if (es == 1) {
        const uint8_t *sp = (const uint8_t *)s + off;
        uint8_t *dp = (uint8_t *)d;
        for (int64_t i = 0; i < inner; i++) dp[i] = sp[i * istride];
    } else {
        for (int64_t i = 0; i < inner; i++) shape_copy_elem(d + i * (int64_t)es, s + (off + i * istride) * (int64_t)es, es);
    }
}

/* Rows [r0, r1) of shape_strided_copy (nd >= 1 merged axes, the last the
 * row's). */
static inline void shape_strided_rows(char *d, const char *s, int64_t base, int nd, const int64_t *dims,
                                      const int64_t *strides, size_t es, int64_t r0, int64_t r1) {
    const int64_t inner = dims[nd - 1], istride = strides[nd - 1];
    int64_t idx[SHAPE_MAX_VIEW_DIMS], off = base, rem = r0;
    for (int k = nd - 2; k >= 0; k--) {
        idx[k] = rem % dims[k];
        rem /= dims[k];
        off += idx[k] * strides[k];
    }
    for (int64_t r = r0; r < r1; r++) {
        shape_copy_row(d + r * inner * (int64_t)es, s, off, inner, istride, es);
        for (int k = nd - 2; k >= 0; k--) {
            off += strides[k];
            if (++idx[k] < dims[k]) break;
            off -= strides[k] * dims[k];
            idx[k] = 0;
        }
    }
}

/* Copies a strided view of src into the contiguous dst: dst element
 * (i0..in-1) is src[base + sum(i_k * strides[k])], strides in elements and
 * possibly zero (broadcast) or negative (reversed slices). The inner axis
 * becomes one memcpy when its stride is 1 and a fill when it is 0. Rows are
 * independent, so the outer loop runs on up to nt OpenMP threads for large
 * copies. */
static inline void shape_strided_copy(void *dst, const void *src, int64_t base, int nd, const int64_t *dims,
                                      const int64_t *strides, size_t es, int nt) {
    /* Axes of one element dropped, and an axis merged into the one outside
     * it where they walk memory as one: tf2onnx's Slices of [1, 512, 508, 1]
     * were 260,096 rows of one element each, 1.2 ms for 1 MB, and are now
     * one memcpy. */
    int64_t md[SHAPE_MAX_VIEW_DIMS], ms[SHAPE_MAX_VIEW_DIMS];
    int n = 0;
    for (int k = 0; k < nd; k++) {
        if (dims[k] == 0) return;
        if (dims[k] == 1) continue;
        if (n > 0 && ms[n - 1] == strides[k] * dims[k]) {
            md[n - 1] *= dims[k];
            ms[n - 1] = strides[k];
        } else {
            md[n] = dims[k];
            ms[n++] = strides[k];
        }
    }
    nd = n, dims = md, strides = ms;
    if (nd == 0) {
        memcpy(dst, (const char *)src + base * (int64_t)es, es);
        return;
    }
    const int64_t inner = dims[nd - 1];
    int64_t rows = 1;
    for (int k = 0; k < nd - 1; k++) rows *= dims[k];
    if (rows == 0 || inner == 0) return;
    /* Rows in chunks, a chunk's first row found by division and the next
     * ones by stepping the index like an odometer: MobileViT's patch
     * unfolding ([0, 2, 1, 3] of rows of 2 floats) spent more on a division
     * per axis per row, and a memcpy call per 8 bytes, than on the bytes. */
    const int64_t nchunk = rows * inner > 32768 && rows > 1 && nt > 1 ? (rows < 4 * (int64_t)nt ? rows : 4 * (int64_t)nt)
                                                                     : 1;
    PAR_FOR(nchunk > 1, nt, ,
        for (int64_t ch = 0; ch < nchunk; ch++)
            shape_strided_rows((char *)dst, (const char *)src, base, nd, dims, strides, es, rows * ch / nchunk,
                               rows * (ch + 1) / nchunk););
}

/* Row-major strides (in elements) of dims. */
static inline void shape_strides(int nd, const int64_t *dims, int64_t *strides) {
    int64_t s = 1;
    for (int k = nd - 1; k >= 0; k--) {
        strides[k] = s;
        s *= dims[k];
    }
}

/* Writes v converted to dtype at element i of p; 0, or -1 for a dtype that
 * has no numeric meaning (string, undefined). */
static inline int shape_store_double(enum dtype dt, void *p, int64_t i, double v) {
    switch (dt) {
    case DT_FP32: ((float *)p)[i] = (float)v; return 0;
    case DT_FP64: ((double *)p)[i] = v; return 0;
    case DT_FP16: ((uint16_t *)p)[i] = fp32_to_fp16((float)v); return 0;
    case DT_BF16: ((uint16_t *)p)[i] = fp32_to_bf16((float)v); return 0;
    case DT_INT64: ((int64_t *)p)[i] = (int64_t)v; return 0;
    case DT_INT32: ((int32_t *)p)[i] = (int32_t)v; return 0;
    case DT_INT16: ((int16_t *)p)[i] = (int16_t)v; return 0;
    case DT_INT8: ((int8_t *)p)[i] = (int8_t)v; return 0;
    case DT_UINT64: ((uint64_t *)p)[i] = (uint64_t)v; return 0;
    case DT_UINT32: ((uint32_t *)p)[i] = (uint32_t)v; return 0;
    case DT_UINT16: ((uint16_t *)p)[i] = (uint16_t)v; return 0;
    case DT_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; return 0;
    case DT_BOOL: ((uint8_t *)p)[i] = v != 0; return 0;
    default: return -1;
    }
}

/* ---- checks and readers the shape families share (infer and prepare) ---- */

static inline const struct tensor *in_opt(const struct op_call *c, int i) { return i < c->nin ? c->in[i] : NULL; }

static inline int need_input(struct op_call *c, int i, const char *what) {
    if (!in_opt(c, i)) return op_error(c, "input %d (%s) is required", i, what);
    return 0;
}

/* Fails unless input i is present and its values are known now: when they
 * are computed at run time, with STATUS_DATA_DEPENDENT (the model then runs
 * node by node, every value known). */
static inline int need_const(struct op_call *c, int i, const char *what) {
    int rc = need_input(c, i, what);
    if (rc) return rc;
    if (!c->in[i]->data) {
        op_error(c, "input %d (%s) is computed at run time, and the output's shape depends on its values", i, what);
        return STATUS_DATA_DEPENDENT;
    }
    return 0;
}

static inline int need_bytes_dtype(struct op_call *c, const struct tensor *t, const char *what) {
    if (t->dtype == DT_STRING || dtype_size(t->dtype) == 0)
        return op_error(c, "%s has dtype %s, which this operator does not support", what, dtype_name(t->dtype));
    return 0;
}

/* Reads the integer values of input i (which must be constant now) into v;
 * returns the count or a negative status. */
static inline int read_int_input(struct op_call *c, int i, const char *what, int64_t *v, int max) {
    int rc = need_const(c, i, what);
    if (rc) return rc;
    const struct tensor *t = c->in[i];
    if (t->dtype != DT_INT64 && t->dtype != DT_INT32)
        return op_error(c, "%s must be int64 or int32, got %s", what, dtype_name(t->dtype));
    int64_t n = tensor_numel(t);
    if (n < 0 || n > max) return op_error(c, "%s has %lld values; at most %d are supported", what, (long long)n, max);
    for (int64_t k = 0; k < n; k++) v[k] = op_int_at(t, k);
    return (int)n;
}

/* Reads an int list from attribute name; returns the count, -1 if absent. */
static inline int read_int_attr(struct op_call *c, const char *name, int64_t *v, int max) {
    const int64_t *a;
    int n = node_attr_ints(c->node, name, &a);
    if (n < 0) return -1;
    if (n > max) return op_error(c, "attribute '%s' has %d values; at most %d are supported", name, n, max);
    for (int k = 0; k < n; k++) v[k] = a[k];
    return n;
}

static inline int set_shape(struct op_call *c, struct tensor *o, enum dtype dt, int nd, const int64_t *dims) {
    if (nd > TENSOR_MAX_DIMS) return op_error(c, "output rank %d exceeds kiln's limit of %d", nd, TENSOR_MAX_DIMS);
    o->dtype = dt;
    o->ndim = nd;
    for (int k = 0; k < nd; k++) o->dims[k] = dims[k];
    return 0;
}

static inline int64_t prod(const int64_t *d, int from, int to) {
    int64_t p = 1;
    for (int k = from; k < to; k++) p *= d[k];
    return p;
}

/* Computed dimensions beyond this are refused before any arithmetic on
 * them can overflow; no real tensor comes near it. */
#define SHAPE_MAX_DIM ((int64_t)1 << 40)

static inline int dim_ok(struct op_call *c, double v, const char *what) {
    if (!(v >= 0 && v <= (double)SHAPE_MAX_DIM)) return op_error(c, "%s = %g is out of range", what, v);
    return 0;
}

static inline int is_float_dtype(enum dtype dt) { return dt == DT_FP32 || dt == DT_FP64 || dt == DT_FP16 || dt == DT_BF16; }

#endif
