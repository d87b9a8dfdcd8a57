/* shape_util.h - private helpers of the shape-family kernels: byte-moving
 * loops that work for every dtype (they only know the element size), and
 * small readers for the integer lists ops take as constant inputs.
 * Everything here is static inline so that ops_shape.c and its unit test
 * share one definition without a new public symbol. */
#ifndef KILN_CPU_SHAPE_UTIL_H
#define KILN_CPU_SHAPE_UTIL_H

#include <stdint.h>
#include <string.h>

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

/* Copies a strided view of src into the contiguous dst: dst element
 * (i0..in-1) is src[base + sum(i_k * strides[k])], strides in elements and
 * possibly zero (broadcast) or negative (reversed slices). The inner axis
 * becomes one memcpy when its stride is 1 and a fill when it is 0. Rows are
 * independent, so the outer loop runs on up to nt OpenMP threads for large
 * copies. */
static inline void shape_strided_copy(void *dst, const void *src, int64_t base, int nd, const int64_t *dims,
                                      const int64_t *strides, size_t es, int nt) {
    if (nd == 0) {
        memcpy(dst, (const char *)src + base * (int64_t)es, es);
        return;
    }
    int64_t inner = dims[nd - 1], istride = strides[nd - 1];
    int64_t rows = 1;
    for (int k = 0; k < nd - 1; k++) rows *= dims[k];
    if (rows == 0 || inner == 0) return;
    const char *s = src;
    char *d = dst;
#pragma omp parallel for if (rows * inner > 32768 && rows > 1) num_threads(nt > 0 ? nt : 1)
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = base, rem = r;
        for (int k = nd - 2; k >= 0; k--) {
            int64_t ik = rem % dims[k];
            rem /= dims[k];
            off += ik * strides[k];
        }
        char *drow = d + r * inner * (int64_t)es;
        if (istride == 1) {
            memcpy(drow, s + off * (int64_t)es, (size_t)inner * es);
        } else if (istride == 0) {
            if (es == 4) {
                uint32_t v;
                memcpy(&v, s + off * 4, 4);
                uint32_t *dp = (uint32_t *)(void *)drow;
                for (int64_t i = 0; i < inner; i++) dp[i] = v;
            } else if (es == 8) {
                uint64_t v;
                memcpy(&v, s + off * 8, 8);
                uint64_t *dp = (uint64_t *)(void *)drow;
                for (int64_t i = 0; i < inner; i++) dp[i] = v;
            } else {
                for (int64_t i = 0; i < inner; i++) shape_copy_elem(drow + i * (int64_t)es, s + off * (int64_t)es, es);
            }
        } else {
            switch (es) {
            case 4: {
                const uint32_t *sp = (const uint32_t *)(const void *)s;
                uint32_t *dp = (uint32_t *)(void *)drow;
                for (int64_t i = 0; i < inner; i++) memcpy(dp + i, sp + off + i * istride, 4);
                break;
            }
            case 8: {
                const uint64_t *sp = (const uint64_t *)(const void *)s;
                uint64_t *dp = (uint64_t *)(void *)drow;
                for (int64_t i = 0; i < inner; i++) memcpy(dp + i, sp + off + i * istride, 8);
                break;
            }
            default:
                for (int64_t i = 0; i < inner; i++)
                    shape_copy_elem(drow + i * (int64_t)es, s + (off + i * istride) * (int64_t)es, es);
            }
        }
    }
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

#endif
