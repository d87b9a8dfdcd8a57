/* layout_util.h - private helpers of the CPU kernels that take
 * channels-last activations (models/passes_layout.c marks them with the
 * node attribute kiln_layout): a tensor's NCHW dims viewed in NHWC memory
 * order, and the two transposes between the layouts. Static inline, as
 * shape_util.h is, so that each family shares one definition. */
#ifndef KILN_CPU_LAYOUT_UTIL_H
#define KILN_CPU_LAYOUT_UTIL_H

#include <stdint.h>

#include "kernels/ops.h"

/* The node's kiln_layout (0: plain). Read at prepare, or at run by
 * attribute-less elementwise nodes where it is one string compare. */
static inline int64_t layout_of(const struct graph_node *n) {
    return n->nattr ? node_attr_int(n, "kiln_layout", 0) : 0;
}

/* t's NCHW dims, right-aligned to rank 4, in channels-last memory order
 * [N,H,W,C]: what a channels-last tensor is, and what a layout-neutral one
 * ([N,C,1,1], one channel, a scalar) is too. */
static inline void layout_nhwc_view(struct tensor *v, const struct tensor *t) {
    int64_t d[4] = {1, 1, 1, 1};
    for (int i = 0; i < t->ndim && i < 4; i++) d[4 - t->ndim + i] = t->dims[i];
    *v = *t;
    v->ndim = 4;
    v->dims[0] = d[0];
    v->dims[1] = d[2];
    v->dims[2] = d[3];
    v->dims[3] = d[1];
}

/* dst[b][j][i] = src[b][i][j] for a batch of rows x cols matrices of
 * es-byte elements, in cache-sized tiles, on up to nt threads (ops_shape.c:
 * Transpose's own, shared with the kernels that change layout around a
 * GEMM). */
void cpu_transpose_2d(const void *src, void *dst, int64_t batch, int64_t rows, int64_t cols, size_t es, int nt);

/* dst[n][c][p] = src[n][p][c] over n images of c channels and hw pixels. */
static inline void layout_nchw_from_nhwc(float *dst, const float *src, int64_t n, int64_t c, int64_t hw) {
    for (int64_t b = 0; b < n; b++)
        for (int64_t p = 0; p < hw; p++)
            for (int64_t k = 0; k < c; k++) dst[(b * c + k) * hw + p] = src[(b * hw + p) * c + k];
}

/* dst[n][p][c] = src[n][c][p]. */
static inline void layout_nhwc_from_nchw(float *dst, const float *src, int64_t n, int64_t c, int64_t hw) {
    for (int64_t b = 0; b < n; b++)
        for (int64_t k = 0; k < c; k++)
            for (int64_t p = 0; p < hw; p++) dst[(b * hw + p) * c + k] = src[(b * c + k) * hw + p];
}

#endif
