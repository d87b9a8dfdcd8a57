#include "kernels/ops.h"

#include "kernels/cpu/elementwise_util.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct op_def *const g_tables[] = {
    op_defs_elementwise, op_defs_reduce, op_defs_shape, op_defs_grid, op_defs_resize, op_defs_nms, op_defs_scan, op_defs_nn, op_defs_ml, op_defs_ml_encode,
    op_defs_rnn, op_defs_einsum, op_defs_softmax_fused, op_defs_attention, op_defs_signal, op_defs_string, op_defs_image,
    op_defs_contrib, op_defs_contrib_matmul, op_defs_contrib_qlinear,
};

static int domain_eq(const char *a, const char *b) {
    if (!a || strcmp(a, "ai.onnx") == 0) a = "";
    if (!b || strcmp(b, "ai.onnx") == 0) b = "";
    return strcmp(a, b) == 0;
}

const struct op_def *op_find(const char *domain, const char *op_type) {
    for (size_t t = 0; t < sizeof g_tables / sizeof g_tables[0]; t++)
        for (const struct op_def *d = g_tables[t]; d->op_type; d++)
            if (strcmp(d->op_type, op_type) == 0 && domain_eq(d->domain, domain)) return d;
    return NULL;
}

void op_foreach(void (*fn)(const struct op_def *op, void *arg), void *arg) {
    for (size_t t = 0; t < sizeof g_tables / sizeof g_tables[0]; t++)
        for (const struct op_def *d = g_tables[t]; d->op_type; d++) fn(d, arg);
}

int op_error(struct op_call *c, const char *fmt, ...) {
    if (c->err && c->err_len) {
        int n = snprintf(c->err, c->err_len, "node '%s' (%s): ", c->node ? c->node->name : "?",
                         c->node ? c->node->op_type : "?");
        if (n < 0) n = 0;
        if ((size_t)n < c->err_len) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(c->err + n, c->err_len - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return STATUS_INVALID;
}

void op_apply_act(const struct graph_node *node, float *x, int64_t n) {
    if (node->act == ACT_NONE && !node->act_affine) return;
    /* Blocks of 16K values, on the team when there are several. */
    const int64_t blk = 16384, nb = (n + blk - 1) / blk;
    const float s = node->act_scale, t = node->act_shift;
#pragma omp parallel for if (nb > 1)
    for (int64_t k = 0; k < nb; k++) {
        float *p = x + k * blk;
        int64_t len = k == nb - 1 ? n - k * blk : blk;
        ew_act_f32(p, len, node->act, node->act_alpha, node->act_beta);
        if (node->act_affine) /* the Mul, then the Add, each rounded (no FMA contraction in ISO C) */
            for (int64_t i = 0; i < len; i++) {
                float v = p[i] * s;
                p[i] = v + t;
            }
    }
}

int op_broadcast_shape(struct op_call *c, const struct tensor *a, const struct tensor *b, struct tensor *out) {
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < nd; i++) {
        int ia = a->ndim - nd + i, ib = b->ndim - nd + i;
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da == db || db == 1) out->dims[i] = da;
        else if (da == 1) out->dims[i] = db;
        else {
            char sa[128], sb[128];
            return op_error(c, "shapes %s and %s cannot be broadcast", tensor_shape_str(a, sa, sizeof sa),
                            tensor_shape_str(b, sb, sizeof sb));
        }
    }
    out->ndim = nd;
    return 0;
}

int op_axis(struct op_call *c, int64_t axis, int rank) {
    if (axis < -rank || axis >= (rank ? rank : 1)) {
        op_error(c, "axis %lld is out of range for rank %d", (long long)axis, rank);
        return -1;
    }
    return (int)(axis < 0 ? axis + rank : axis);
}

/* ---- string pool ----------------------------------------------------------- */

struct strblock {
    struct strblock *next;
    size_t cap, used;
    char data[];
};

struct op_strpool {
    struct strblock *head; /* a string goes into the first block with room for it */
};

#define STRPOOL_BLOCK (64 * 1024)

struct op_strpool *op_strpool_create(void) { return calloc(1, sizeof(struct op_strpool)); }

void op_strpool_free(struct op_strpool *pool) {
    if (!pool) return;
    for (struct strblock *b = pool->head, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    free(pool);
}

void op_strpool_reset(struct op_strpool *pool) {
    if (!pool) return;
    for (struct strblock *b = pool->head; b; b = b->next) b->used = 0;
}

char *op_string_alloc(struct op_call *c, size_t len) {
    struct op_strpool *pool = c->strings;
    if (!pool) {
        op_error(c, "no string storage for this call");
        return NULL;
    }
    if (len >= SIZE_MAX / 2) {
        op_error(c, "a string of %zu bytes is too long", len);
        return NULL;
    }
    struct strblock *b = pool->head;
    while (b && b->cap - b->used < len + 1) b = b->next;
    if (!b) {
        size_t cap = len + 1 > STRPOOL_BLOCK ? len + 1 : STRPOOL_BLOCK;
        b = malloc(sizeof *b + cap);
        if (!b) {
            op_error(c, "out of memory for a %zu-byte string", len);
            return NULL;
        }
        b->cap = cap;
        b->used = 0;
        b->next = pool->head;
        pool->head = b;
    }
    char *out = b->data + b->used;
    out[len] = 0;
    b->used += len + 1;
    return out;
}

char *op_string_new(struct op_call *c, const char *s, size_t len) {
    char *out = op_string_alloc(c, len);
    if (out && len) memcpy(out, s, len);
    return out;
}

void *op_params_alloc(struct op_call *c, size_t size) {
    void *p = calloc(1, size);
    if (!p) op_error(c, "out of memory for the op's parameters");
    return p;
}

void op_params_free(void *params) { free(params); }

int64_t op_int_at(const struct tensor *t, int64_t i) {
    switch (t->dtype) {
    case DT_INT64: return ((const int64_t *)t->data)[i];
    case DT_INT32: return ((const int32_t *)t->data)[i];
    case DT_INT16: return ((const int16_t *)t->data)[i];
    case DT_INT8: return ((const int8_t *)t->data)[i];
    case DT_INT4: case DT_INT2: return ((const int8_t *)t->data)[i];
    case DT_UINT8: case DT_BOOL: case DT_UINT4: case DT_UINT2: return ((const uint8_t *)t->data)[i];
    case DT_UINT16: return ((const uint16_t *)t->data)[i];
    case DT_UINT32: return ((const uint32_t *)t->data)[i];
    case DT_UINT64: return (int64_t)((const uint64_t *)t->data)[i];
    case DT_FP32: return (int64_t)((const float *)t->data)[i];
    case DT_FP64: return (int64_t)((const double *)t->data)[i];
    default: return 0;
    }
}

double op_double_at(const struct tensor *t, int64_t i) {
    switch (t->dtype) {
    case DT_FP32: return ((const float *)t->data)[i];
    case DT_FP64: return ((const double *)t->data)[i];
    case DT_FP16: return fp16_to_fp32(((const uint16_t *)t->data)[i]);
    case DT_BF16: return bf16_to_fp32(((const uint16_t *)t->data)[i]);
    default: return (double)op_int_at(t, i);
    }
}
