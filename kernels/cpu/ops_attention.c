/* ops_attention.c - the attention family: ONNX's Attention and
 * RotaryEmbedding (opset 23), and onnxruntime's com.microsoft Attention
 * (fused QKV projection, as its BERT optimizer emits it),
 * MultiHeadAttention, GroupQueryAttention and RotaryEmbedding.
 *
 * Every op reduces to one core: for each (batch, query head), scores =
 * Q K^T * scale (one sgemm), softcap, masks (additive or keep/fill,
 * broadcast over batch, head and query row), key ranges per batch row,
 * causal masking from each batch row's past length, softmax (with an
 * optional sink logit), then scores V (one sgemm) written through a
 * strided view, so [B, S, N*H] and [B, N, S, H] layouts are read and
 * written in place. Query heads map onto key/value heads in groups
 * (GQA). The (batch, head) pairs run in parallel, each on its own slice
 * of the scratch.
 *
 * The ops compute in float32; FP16 and BF16 inputs are widened into the
 * scratch first and the outputs narrowed back (attn_run_staged). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno")
#endif

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/elementwise_util.h"
#include "kernels/cpu/sigmoid_vec.h"
#include "kernels/cpu/matmul_util.h"
#include "kernels/cpu/params_util.h"
#include "kernels/ops.h"

#define ATTN_MAX_IN 16
#define ATTN_MAX_OUT 4

/* ---- the core ----------------------------------------------------------- */

/* Rows of a [batch, head, seq, dim] tensor in any layout: row (b, h, s)
 * starts at p + b*sb + h*sh + s*ss; its dim values are contiguous. */
struct attn_view {
    float *p;
    int64_t sb, sh, ss;
};

enum attn_mask_kind { ATTN_MASK_NONE, ATTN_MASK_ADD, ATTN_MASK_KEEP };

/* A mask over (batch, head, query row, key): value at p + b*sb + h*sh +
 * s*ss + key, strides 0 where it broadcasts. ADD adds the value; KEEP
 * adds fill where the value is zero. Keys at or past len are masked out. */
struct attn_mask {
    enum attn_mask_kind kind;
    const void *p;
    enum dtype dt;
    int64_t sb, sh, ss, len;
    float fill;
};

struct attn_core {
    int64_t batch, heads, kv_heads, q_len, kv_len, head_size, v_head_size;
    float scale, softcap; /* softcap 0: none */
    struct attn_view q, k, v, y;
    struct attn_mask mask[2];
    const int64_t *key_begin, *key_end; /* per batch row, keys outside [begin, end) get range_fill; NULL: all keys */
    float range_fill;
    int causal;            /* query s of row b sees keys up to q_pos(b) + s */
    const int64_t *q_pos;  /* per batch row: position of query 0 among the keys; NULL: q_pos0 */
    int64_t q_pos0;
    int64_t window;        /* > 0: also only the window keys before the query's position */
    float causal_fill;
    const float *sink;     /* per head extra logit (head_sink), or NULL */
    int sink_zero;         /* an extra logit of 0 (smooth_softmax) */
    float *qk;             /* [batch, heads, q_len, kv_len] or NULL */
    int qk_mode;           /* ONNX: 0 QK*scale, 1 after softcap, 2 after masks, 3 after softmax */
};

static float attn_mask_value(const struct attn_mask *m, int64_t off) {
    switch (m->dt) {
    case DT_FP32: return ((const float *)m->p)[off];
    case DT_BOOL: case DT_UINT8: return ((const uint8_t *)m->p)[off] ? 1.0f : 0.0f;
    case DT_INT32: return (float)((const int32_t *)m->p)[off];
    case DT_INT64: return (float)((const int64_t *)m->p)[off];
    default: return 0;
    }
}

/* Adds masks, key ranges and the causal limit to the scores of query
 * row s of (b, h). */
static void attn_mask_row(const struct attn_core *a, int64_t b, int64_t h, int64_t s, float *row) {
    int64_t T = a->kv_len;
    for (int i = 0; i < 2; i++) {
        const struct attn_mask *m = &a->mask[i];
        if (m->kind == ATTN_MASK_NONE) continue;
        int64_t base = b * m->sb + h * m->sh + s * m->ss, n = m->len < T ? m->len : T;
        if (m->kind == ATTN_MASK_ADD && m->dt == DT_FP32) {
            const float *mp = (const float *)m->p + base;
            for (int64_t t = 0; t < n; t++) row[t] += mp[t];
        } else {
            for (int64_t t = 0; t < n; t++) {
                float v = attn_mask_value(m, base + t);
                row[t] += m->kind == ATTN_MASK_ADD ? v : (v != 0 ? 0.0f : m->fill);
            }
        }
        for (int64_t t = n; t < T; t++) row[t] = -INFINITY;
    }
    if (a->key_end) {
        int64_t lo = a->key_begin ? a->key_begin[b] : 0, hi = a->key_end[b];
        for (int64_t t = 0; t < T; t++)
            if (t < lo || t >= hi) row[t] += a->range_fill;
    }
    if (a->causal) {
        int64_t pos = (a->q_pos ? a->q_pos[b] : a->q_pos0) + s;
        for (int64_t t = pos + 1; t < T; t++) row[t] += a->causal_fill;
        if (a->window > 0)
            for (int64_t t = 0; t < T && t <= pos - a->window; t++) row[t] += a->causal_fill;
    }
}

/* Softmax of one row in place, with an optional extra logit. A row with
 * every key masked out to -inf becomes NaN, as the formula gives. Built for
 * the CPU's vector width, picked by the ISA oneDNN runs (the row loops are
 * most of unmasked attention's time outside its two products). */
static inline __attribute__((always_inline)) void attn_softmax_row_body(float *row, int64_t T, int has_sink, float sink) {
    float mx = has_sink ? sink : -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t t = 0; t < T; t++) mx = row[t] > mx ? row[t] : mx;
    if (mx == -INFINITY) {
        for (int64_t t = 0; t < T; t++) row[t] = NAN;
        return;
    }
    float sum = exp_shift_sum(row, T, mx);
    if (has_sink) sum += ew_exp_f(sink - mx);
    float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t t = 0; t < T; t++) row[t] *= inv;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("arch=x86-64-v4"))) static void attn_softmax_row_v4(float *row, int64_t T, int has_sink,
                                                                          float sink) {
    attn_softmax_row_body(row, T, has_sink, sink);
}
__attribute__((target("arch=x86-64-v3"))) static void attn_softmax_row_v3(float *row, int64_t T, int has_sink,
                                                                          float sink) {
    attn_softmax_row_body(row, T, has_sink, sink);
}
#endif

static void attn_softmax_row(float *row, int64_t T, int has_sink, float sink) {
#if defined(__x86_64__) && defined(__GNUC__)
    int l = dnnl_util_isa_level();
    if (l >= 4) return attn_softmax_row_v4(row, T, has_sink, sink);
    if (l == 3) return attn_softmax_row_v3(row, T, has_sink, sink);
#endif
    attn_softmax_row_body(row, T, has_sink, sink);
}

static void attn_keep_qk(const struct attn_core *a, int stage, int64_t bh, const float *scores) {
    if (!a->qk || a->qk_mode != stage) return;
    size_t n = (size_t)(a->q_len * a->kv_len);
    memcpy(a->qk + bh * (int64_t)n, scores, n * sizeof(float));
}

/* One (batch, query head): scores in buf [q_len, kv_len]. */
static int attn_head(const struct attn_core *a, int64_t bh, float *buf) {
    int64_t b = bh / a->heads, h = bh % a->heads, kvh = h / (a->heads / a->kv_heads);
    int64_t S = a->q_len, T = a->kv_len;
    const float *q = a->q.p + b * a->q.sb + h * a->q.sh;
    const float *k = a->k.p + b * a->k.sb + kvh * a->k.sh;
    const float *v = a->v.p + b * a->v.sb + kvh * a->v.sh;
    float *y = a->y.p + b * a->y.sb + h * a->y.sh;
    if (dnnl_sgemm('N', 'T', S, T, a->head_size, a->scale, q, a->q.ss, k, a->k.ss, 0.0f, buf, T) != dnnl_success)
        return -1;
    attn_keep_qk(a, 0, bh, buf);
    if (a->softcap > 0) {
        float cap = a->softcap, inv = 1.0f / cap;
        for (int64_t i = 0; i < S * T; i++) buf[i] = cap * ew_tanh_f(buf[i] * inv);
    }
    attn_keep_qk(a, 1, bh, buf);
    for (int64_t s = 0; s < S; s++) attn_mask_row(a, b, h, s, buf + s * T);
    attn_keep_qk(a, 2, bh, buf);
    int has_sink = a->sink || a->sink_zero;
    float sink = a->sink ? a->sink[h] : 0.0f;
    for (int64_t s = 0; s < S; s++) attn_softmax_row(buf + s * T, T, has_sink, sink);
    attn_keep_qk(a, 3, bh, buf);
    if (dnnl_sgemm('N', 'N', S, a->v_head_size, T, 1.0f, buf, T, v, a->v.ss, 0.0f, y, a->y.ss) != dnnl_success)
        return -1;
    return 0;
}

/* Scratch floats the core needs with nthreads threads. */
static size_t attn_core_scratch(int64_t q_len, int64_t kv_len, int nthreads) {
    return dnnl_util_align(sizeof(float) * (size_t)(q_len * kv_len > 0 ? q_len * kv_len : 1)) * (size_t)nthreads;
}

static int attn_core_run(struct op_call *c, const struct attn_core *a, void *scratch, int nthreads) {
    int64_t n = a->batch * a->heads, S = a->q_len, T = a->kv_len;
    if (n == 0 || S == 0) return 0;
    if (T == 0) { /* nothing to attend to: the softmax of no scores */
        for (int64_t bh = 0; bh < n; bh++)
            for (int64_t s = 0; s < S; s++) {
                float *y = a->y.p + (bh / a->heads) * a->y.sb + (bh % a->heads) * a->y.sh + s * a->y.ss;
                for (int64_t j = 0; j < a->v_head_size; j++) y[j] = NAN;
            }
        return 0;
    }
    size_t per = attn_core_scratch(S, T, 1);
    int nt = nthreads < 1 ? 1 : nthreads, failed = 0;
    if (n < nt) nt = (int)n;
    dnnl_util_set_threads(c->nthreads);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) reduction(| : failed)
    for (int64_t bh = 0; bh < n; bh++) {
        float *buf = (float *)(void *)((char *)scratch + per * (size_t)omp_get_thread_num());
        failed |= attn_head(a, bh, buf) != 0;
    }
    if (failed) return op_error(c, "oneDNN's sgemm failed");
    return 0;
}

/* Copies rows (b, h, s) of src into dst for b < B, h < N, s < L, n
 * values each, adding bias[h*n ..] when bias is given. */
static void attn_copy_rows(struct attn_view dst, struct attn_view src, int64_t B, int64_t N, int64_t L, int64_t n,
                           const float *bias) {
#pragma omp parallel for collapse(2) if (B * N * L * n > 65536)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < N; h++)
            for (int64_t s = 0; s < L; s++) {
                float *d = dst.p + b * dst.sb + h * dst.sh + s * dst.ss;
                const float *x = src.p + b * src.sb + h * src.sh + s * src.ss;
                if (bias)
                    for (int64_t j = 0; j < n; j++) d[j] = x[j] + bias[h * n + j];
                else
                    memmove(d, x, sizeof(float) * (size_t)n);
            }
}

/* Views of the common layouts. */
static struct attn_view attn_bnsh(float *p, int64_t N, int64_t S, int64_t H) {
    return (struct attn_view){p, N * S * H, S * H, H};
}
static struct attn_view attn_bsnh(float *p, int64_t N, int64_t S, int64_t H) {
    return (struct attn_view){p, S * N * H, H, N * H};
}

/* ---- rotary embedding --------------------------------------------------- */

/* Rotates the first rot values of one head x into y (which may be x),
 * with cos and sin (rot/2 values each): halves, or pairs when
 * interleaved. The rest of the head is copied. */
static void attn_rotate(float *y, const float *x, int64_t D, int64_t rot, const float *cs, const float *sn,
                        int interleaved) {
    int64_t half = rot / 2;
    for (int64_t i = 0; i < half; i++) {
        int64_t i1 = interleaved ? 2 * i : i, i2 = interleaved ? 2 * i + 1 : i + half;
        float x1 = x[i1], x2 = x[i2];
        y[i1] = x1 * cs[i] - x2 * sn[i];
        y[i2] = x1 * sn[i] + x2 * cs[i];
    }
    if (y != x) memcpy(y + rot, x + rot, sizeof(float) * (size_t)(D - rot));
}

/* What a rotation reads: cos and sin caches of rows of rot/2 values and,
 * per (batch, position), the cache row to use. */
struct attn_rope {
    const float *cos, *sin;
    int64_t rows;   /* rows in the caches */
    int64_t rot;    /* values rotated per head */
    int interleaved;
};

/* Rotates rows (b, h, s) of src into dst for every head; row_of[b*S + s]
 * names the cache row. Fails on a row outside the caches. */
static int attn_rope_apply(struct op_call *c, const struct attn_rope *r, struct attn_view dst, struct attn_view src,
                           int64_t B, int64_t N, int64_t S, int64_t D, const int64_t *row_of) {
    for (int64_t i = 0; i < B * S; i++)
        if (row_of[i] < 0 || row_of[i] >= r->rows)
            return op_error(c, "position %lld is outside the cos/sin caches (%lld rows)", (long long)row_of[i],
                            (long long)r->rows);
    int64_t half = r->rot / 2;
#pragma omp parallel for collapse(2) if (B * N * S * D > 65536)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < N; h++)
            for (int64_t s = 0; s < S; s++) {
                int64_t row = row_of[b * S + s];
                attn_rotate(dst.p + b * dst.sb + h * dst.sh + s * dst.ss, src.p + b * src.sb + h * src.sh + s * src.ss,
                            D, r->rot, r->cos + row * half, r->sin + row * half, r->interleaved);
            }
    return 0;
}

static const struct tensor *attn_in(const struct op_call *c, int i) { return i < c->nin ? c->in[i] : NULL; }
/* Output i, or NULL when the node leaves it out (a plan still describes
 * an absent output, in a tensor without data). */
static struct tensor *attn_out(const struct op_call *c, int i) {
    if (i >= c->nout || !c->out[i]) return NULL;
    if (c->node && c->node->out && i < c->node->nout && c->node->out[i] < 0) return NULL;
    return c->out[i];
}

/* ---- FP16 / BF16 staging ---------------------------------------------- */

static int attn_half(const struct tensor *t) { return t && (t->dtype == DT_FP16 || t->dtype == DT_BF16); }

/* Bytes of float32 copies of the half-precision inputs and outputs. */
static size_t attn_stage_bytes(const struct op_call *c) {
    size_t n = 0;
    for (int i = 0; i < c->nin; i++)
        if (attn_half(c->in[i])) n += dnnl_util_align(sizeof(float) * (size_t)tensor_numel(c->in[i]) + 1);
    for (int i = 0; i < c->nout; i++)
        if (attn_half(attn_out(c, i))) n += dnnl_util_align(sizeof(float) * (size_t)tensor_numel(c->out[i]) + 1);
    return n;
}

static void attn_widen(float *dst, const struct tensor *t) {
    const uint16_t *h = t->data;
    int64_t n = tensor_numel(t);
    for (int64_t i = 0; i < n; i++) dst[i] = t->dtype == DT_FP16 ? fp16_to_fp32(h[i]) : bf16_to_fp32(h[i]);
}

static void attn_narrow(struct tensor *t, const float *src) {
    uint16_t *h = t->data;
    int64_t n = tensor_numel(t);
    for (int64_t i = 0; i < n; i++) h[i] = t->dtype == DT_FP16 ? fp32_to_fp16(src[i]) : fp32_to_bf16(src[i]);
}

/* Runs body on a copy of the call whose half-precision inputs and outputs
 * are float32 tensors in the front of the scratch; body gets the rest. */
static int attn_run_staged(struct op_call *c, int (*body)(struct op_call *fc, void *scratch)) {
    struct op_call fc = *c;
    struct tensor tin[ATTN_MAX_IN], tout[ATTN_MAX_OUT];
    char *p = c->scratch;
    for (int i = 0; i < c->nin && i < ATTN_MAX_IN; i++)
        if (attn_half(c->in[i])) {
            tin[i] = *c->in[i];
            tin[i].dtype = DT_FP32;
            tin[i].data = p;
            attn_widen((float *)(void *)p, c->in[i]);
            p += dnnl_util_align(sizeof(float) * (size_t)tensor_numel(c->in[i]) + 1);
            fc.in[i] = &tin[i];
        }
    for (int i = 0; i < c->nout && i < ATTN_MAX_OUT; i++)
        if (attn_half(attn_out(c, i))) {
            tout[i] = *c->out[i];
            tout[i].dtype = DT_FP32;
            tout[i].data = p;
            p += dnnl_util_align(sizeof(float) * (size_t)tensor_numel(c->out[i]) + 1);
            fc.out[i] = &tout[i];
        }
    int rc = body(&fc, p);
    for (int i = 0; !rc && i < c->nout && i < ATTN_MAX_OUT; i++)
        if (attn_half(attn_out(c, i))) attn_narrow(c->out[i], tout[i].data);
    return rc;
}

/* ---- shared checks ------------------------------------------------------ */

static int attn_is_float(const struct tensor *t) { return t->dtype == DT_FP32 || attn_half(t); }

/* Fails unless input i, when present, is a float tensor of rank in
 * [lo, hi]. */
static int attn_check(struct op_call *c, int i, const char *what, int lo, int hi) {
    const struct tensor *t = attn_in(c, i);
    if (!t) return 0;
    if (!attn_is_float(t))
        return op_error(c, "%s must be float32, float16 or bfloat16 (got %s)", what, dtype_name(t->dtype));
    if (t->ndim < lo || t->ndim > hi) {
        if (lo == hi) return op_error(c, "%s must have %d dims (got %d)", what, lo, t->ndim);
        return op_error(c, "%s must have %d to %d dims (got %d)", what, lo, hi, t->ndim);
    }
    return 0;
}

/* Describes output i, absent ones included (the plan asks for them). */
static int attn_set_out(struct op_call *c, int i, enum dtype dt, int nd, const int64_t *dims) {
    struct tensor *o = i < c->nout ? c->out[i] : NULL;
    if (!o) return 0;
    o->dtype = dt;
    o->ndim = nd;
    for (int k = 0; k < nd; k++) o->dims[k] = dims[k];
    return 0;
}

static int attn_dims_eq(struct op_call *c, const struct tensor *t, const char *what, int nd, const int64_t *dims) {
    int ok = t->ndim == nd;
    for (int k = 0; ok && k < nd; k++) ok = t->dims[k] == dims[k];
    if (ok) return 0;
    char got[128], want[128];
    struct tensor e = {.dtype = t->dtype, .ndim = nd};
    memcpy(e.dims, dims, sizeof(int64_t) * (size_t)nd);
    return op_error(c, "%s has shape %s; expected %s", what, tensor_shape_str(t, got, sizeof got),
                    tensor_shape_str(&e, want, sizeof want));
}

/* A mask or bias of rank 1 to 4 broadcast onto (batch, heads, q_len,
 * keys): its dims aligned to the right, each 1 or the target's, its last
 * dim at most keys. */
static int attn_bcast_mask(struct op_call *c, const struct tensor *m, const char *what, const int64_t *target,
                           struct attn_mask *out) {
    if (m->ndim < 1 || m->ndim > 4) return op_error(c, "%s must have 1 to 4 dims (got %d)", what, m->ndim);
    int64_t d[4] = {1, 1, 1, 1}, st[4];
    for (int k = 0; k < m->ndim; k++) d[4 - m->ndim + k] = m->dims[k];
    for (int k = 0; k < 3; k++)
        if (d[k] != 1 && d[k] != target[k]) {
            char got[128];
            return op_error(c, "%s of shape %s does not broadcast to (%lld, %lld, %lld, %lld)", what,
                            tensor_shape_str(m, got, sizeof got), (long long)target[0], (long long)target[1],
                            (long long)target[2], (long long)target[3]);
        }
    if (d[3] > target[3])
        return op_error(c, "%s covers %lld keys; there are only %lld", what, (long long)d[3], (long long)target[3]);
    st[3] = 1;
    for (int k = 2; k >= 0; k--) st[k] = st[k + 1] * d[k + 1];
    out->p = m->data;
    out->dt = m->dtype;
    out->sb = d[0] == 1 ? 0 : st[0];
    out->sh = d[1] == 1 ? 0 : st[1];
    out->ss = d[2] == 1 ? 0 : st[2];
    out->len = d[3];
    return 0;
}

/* Threads the core may use, fixed at prepare (its scratch is per thread). */
static int attn_threads(const struct op_call *c) { return c->nthreads > 0 ? c->nthreads : 1; }

/* The scratch of run: staging, then a body's regions laid out by sizes. */
static void *attn_carve(void **p, size_t bytes) {
    void *r = *p;
    *p = (char *)*p + dnnl_util_align(bytes ? bytes : 1);
    return r;
}

/* ==== ONNX Attention (opset 23, 24) ===================================== */

enum { AT_Q, AT_K, AT_V, AT_MASK, AT_PAST_K, AT_PAST_V, AT_NONPAD };
enum { AT_Y, AT_PRESENT_K, AT_PRESENT_V, AT_QK };

struct onnx_attn_params {
    int rank;      /* 3 or 4 */
    int64_t B, Nq, Nkv, S, L, P, T, D, Dv;
    float scale, softcap;
    int causal, qk_mode;
    int nthreads;
};

static int onnx_attn_decode(struct op_call *c, struct onnx_attn_params *p) {
    int rc;
    if ((rc = attn_check(c, AT_Q, "Q", 3, 4)) || (rc = attn_check(c, AT_K, "K", 3, 4)) ||
        (rc = attn_check(c, AT_V, "V", 3, 4)) || (rc = attn_check(c, AT_PAST_K, "past_key", 4, 4)) ||
        (rc = attn_check(c, AT_PAST_V, "past_value", 4, 4)))
        return rc;
    const struct tensor *q = attn_in(c, AT_Q), *k = attn_in(c, AT_K), *v = attn_in(c, AT_V);
    if (!q || !k || !v) return op_error(c, "Q, K and V are required");
    if (q->ndim != k->ndim || q->ndim != v->ndim) return op_error(c, "Q, K and V must have the same rank");
    p->rank = q->ndim;
    p->B = q->dims[0];
    if (k->dims[0] != p->B || v->dims[0] != p->B) return op_error(c, "Q, K and V must have the same batch size");
    if (p->rank == 4) {
        p->Nq = q->dims[1], p->S = q->dims[2], p->D = q->dims[3];
        p->Nkv = k->dims[1], p->L = k->dims[2];
        if (k->dims[3] != p->D) return op_error(c, "K's head size %lld differs from Q's %lld", (long long)k->dims[3], (long long)p->D);
        if (v->dims[1] != p->Nkv || v->dims[2] != p->L) return op_error(c, "V's heads and sequence must match K's");
        p->Dv = v->dims[3];
    } else {
        p->Nq = node_attr_int(c->node, "q_num_heads", 0);
        p->Nkv = node_attr_int(c->node, "kv_num_heads", 0);
        if (p->Nq <= 0 || p->Nkv <= 0) return op_error(c, "3-D inputs need q_num_heads and kv_num_heads");
        if (q->dims[2] % p->Nq || k->dims[2] % p->Nkv || v->dims[2] % p->Nkv)
            return op_error(c, "the hidden sizes of Q, K, V do not divide by q_num_heads, kv_num_heads");
        p->S = q->dims[1], p->D = q->dims[2] / p->Nq, p->L = k->dims[1], p->Dv = v->dims[2] / p->Nkv;
        if (k->dims[2] / p->Nkv != p->D) return op_error(c, "K's head size differs from Q's");
        if (v->dims[1] != p->L) return op_error(c, "V's sequence length must match K's");
    }
    if (p->Nkv <= 0 || p->Nq % p->Nkv) return op_error(c, "q heads (%lld) must be a multiple of kv heads (%lld)", (long long)p->Nq, (long long)p->Nkv);
    const struct tensor *pk = attn_in(c, AT_PAST_K), *pv = attn_in(c, AT_PAST_V);
    if (!pk != !pv) return op_error(c, "past_key and past_value go together");
    p->P = pk ? pk->dims[2] : 0;
    if (pk && ((rc = attn_dims_eq(c, pk, "past_key", 4, (int64_t[]){p->B, p->Nkv, p->P, p->D})) ||
               (rc = attn_dims_eq(c, pv, "past_value", 4, (int64_t[]){p->B, p->Nkv, p->P, p->Dv}))))
        return rc;
    p->T = p->P + p->L;
    const struct graph_attr *sc = node_attr(c->node, "scale");
    p->scale = sc ? sc->f : 1.0f / sqrtf((float)p->D);
    p->softcap = node_attr_float(c->node, "softcap", 0.0f);
    p->causal = node_attr_int(c->node, "is_causal", 0) != 0;
    p->qk_mode = (int)node_attr_int(c->node, "qk_matmul_output_mode", 0);
    if (p->qk_mode < 0 || p->qk_mode > 3) return op_error(c, "qk_matmul_output_mode must be 0 to 3 (got %d)", p->qk_mode);
    const struct tensor *m = attn_in(c, AT_MASK);
    if (m && m->dtype != DT_BOOL && !attn_is_float(m))
        return op_error(c, "attn_mask must be bool or float (got %s)", dtype_name(m->dtype));
    struct attn_mask tmp;
    if (m && (rc = attn_bcast_mask(c, m, "attn_mask", (int64_t[]){p->B, p->Nq, p->S, p->T}, &tmp))) return rc;
    const struct tensor *np = attn_in(c, AT_NONPAD);
    if (np && (np->dtype != DT_INT64 || np->ndim != 1 || np->dims[0] != p->B))
        return op_error(c, "nonpad_kv_seqlen must be int64 of shape (%lld)", (long long)p->B);
    return 0;
}

static int onnx_attn_infer(struct op_call *c) {
    struct onnx_attn_params p;
    memset(&p, 0, sizeof p);
    int rc = onnx_attn_decode(c, &p);
    if (rc) return rc;
    enum dtype dt = c->in[AT_Q]->dtype;
    int64_t y4[4] = {p.B, p.Nq, p.S, p.Dv}, y3[3] = {p.B, p.S, p.Nq * p.Dv};
    attn_set_out(c, AT_Y, dt, p.rank, p.rank == 4 ? y4 : y3);
    attn_set_out(c, AT_PRESENT_K, dt, 4, (int64_t[]){p.B, p.Nkv, p.T, p.D});
    attn_set_out(c, AT_PRESENT_V, dt, 4, (int64_t[]){p.B, p.Nkv, p.T, p.Dv});
    attn_set_out(c, AT_QK, dt, 4, (int64_t[]){p.B, p.Nq, p.S, p.T});
    return 0;
}

/* Scratch of the body: present K and V when the outputs are absent,
 * nonpad lengths, the core's buffers. */
static size_t onnx_attn_body_bytes(const struct onnx_attn_params *p) {
    size_t f = sizeof(float);
    return dnnl_util_align(f * (size_t)(p->B * p->Nkv * p->T * p->D) + 1) +
           dnnl_util_align(f * (size_t)(p->B * p->Nkv * p->T * p->Dv) + 1) +
           dnnl_util_align(sizeof(int64_t) * (size_t)p->B + 1) + attn_core_scratch(p->S, p->T, p->nthreads);
}

static int onnx_attn_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct onnx_attn_params p;
    memset(&p, 0, sizeof p);
    int rc = onnx_attn_decode(c, &p);
    if (rc) return rc;
    p.nthreads = attn_threads(c);
    *scratch_size = attn_stage_bytes(c) + onnx_attn_body_bytes(&p);
    return params_keep(c, &p, sizeof p, state);
}

/* The view of K or V as given: [B, N, L, H] or [B, L, N*H]. */
static struct attn_view onnx_attn_input_view(const struct tensor *t, int rank, int64_t N, int64_t L, int64_t H) {
    return rank == 4 ? attn_bnsh(t->data, N, L, H) : attn_bsnh(t->data, N, L, H);
}

/* present = concat(past, new) along the sequence, into dst [B, N, T, H]. */
static void onnx_attn_present(float *dst, const struct tensor *past, struct attn_view cur, int64_t B, int64_t N,
                              int64_t P, int64_t L, int64_t H) {
    int64_t T = P + L;
    if (P) attn_copy_rows(attn_bnsh(dst, N, T, H), attn_bnsh(past->data, N, P, H), B, N, P, H, NULL);
    struct attn_view d = attn_bnsh(dst + P * H, N, T, H);
    attn_copy_rows(d, cur, B, N, L, H, NULL);
}

static int onnx_attn_body(struct op_call *c, void *scratch) {
    const struct onnx_attn_params *p = c->state;
    void *s = scratch;
    float *pk_buf = attn_carve(&s, sizeof(float) * (size_t)(p->B * p->Nkv * p->T * p->D) + 1);
    float *pv_buf = attn_carve(&s, sizeof(float) * (size_t)(p->B * p->Nkv * p->T * p->Dv) + 1);
    int64_t *ends = attn_carve(&s, sizeof(int64_t) * (size_t)p->B + 1);
    struct attn_core a;
    memset(&a, 0, sizeof a);
    a.batch = p->B, a.heads = p->Nq, a.kv_heads = p->Nkv, a.q_len = p->S, a.kv_len = p->T;
    a.head_size = p->D, a.v_head_size = p->Dv, a.scale = p->scale, a.softcap = p->softcap;
    a.q = onnx_attn_input_view(c->in[AT_Q], p->rank, p->Nq, p->S, p->D);
    a.k = onnx_attn_input_view(c->in[AT_K], p->rank, p->Nkv, p->L, p->D);
    a.v = onnx_attn_input_view(c->in[AT_V], p->rank, p->Nkv, p->L, p->Dv);
    struct tensor *ok = attn_out(c, AT_PRESENT_K), *ov = attn_out(c, AT_PRESENT_V);
    if (p->P || ok) {
        float *dst = ok ? ok->data : pk_buf;
        onnx_attn_present(dst, attn_in(c, AT_PAST_K), a.k, p->B, p->Nkv, p->P, p->L, p->D);
        a.k = attn_bnsh(dst, p->Nkv, p->T, p->D);
    }
    if (p->P || ov) {
        float *dst = ov ? ov->data : pv_buf;
        onnx_attn_present(dst, attn_in(c, AT_PAST_V), a.v, p->B, p->Nkv, p->P, p->L, p->Dv);
        a.v = attn_bnsh(dst, p->Nkv, p->T, p->Dv);
    }
    a.y = p->rank == 4 ? attn_bnsh(c->out[AT_Y]->data, p->Nq, p->S, p->Dv)
                       : attn_bsnh(c->out[AT_Y]->data, p->Nq, p->S, p->Dv);
    const struct tensor *m = attn_in(c, AT_MASK);
    if (m) {
        int rc = attn_bcast_mask(c, m, "attn_mask", (int64_t[]){p->B, p->Nq, p->S, p->T}, &a.mask[0]);
        if (rc) return rc;
        a.mask[0].kind = m->dtype == DT_BOOL ? ATTN_MASK_KEEP : ATTN_MASK_ADD;
        a.mask[0].fill = -INFINITY;
    }
    const struct tensor *np = attn_in(c, AT_NONPAD);
    if (np) {
        for (int64_t b = 0; b < p->B; b++) {
            ends[b] = op_int_at(np, b);
            if (ends[b] < 0 || ends[b] > p->T)
                return op_error(c, "nonpad_kv_seqlen[%lld] is %lld; expected 0 to %lld", (long long)b,
                                (long long)ends[b], (long long)p->T);
        }
        a.key_end = ends;
        a.range_fill = -INFINITY;
    }
    a.causal = p->causal, a.q_pos0 = p->P, a.causal_fill = -INFINITY;
    struct tensor *qk = attn_out(c, AT_QK);
    a.qk = qk ? qk->data : NULL;
    a.qk_mode = p->qk_mode;
    return attn_core_run(c, &a, s, p->nthreads);
}

static int onnx_attn_run(struct op_call *c) { return attn_run_staged(c, onnx_attn_body); }

/* ==== ONNX RotaryEmbedding (opset 23) ================================== */

enum { RE_X, RE_COS, RE_SIN, RE_POS };

struct rope_params {
    int64_t B, N, S, D, rot;
    int rank, interleaved;
    int ms;            /* com.microsoft: inputs (x, position_ids, cos, sin) */
    int pos_offset;    /* com.microsoft: position_ids of shape (1), an offset */
};

static int rope_decode_common(struct op_call *c, struct rope_params *p, int ix, int icos, int isin) {
    int rc;
    if ((rc = attn_check(c, ix, "input", 3, 4)) || (rc = attn_check(c, icos, "cos_cache", 2, 3)) ||
        (rc = attn_check(c, isin, "sin_cache", 2, 3)))
        return rc;
    const struct tensor *x = attn_in(c, ix), *cs = attn_in(c, icos), *sn = attn_in(c, isin);
    if (!x || !cs || !sn) return op_error(c, "input, cos_cache and sin_cache are required");
    p->rank = x->ndim;
    p->B = x->dims[0];
    int64_t heads = node_attr_int(c->node, "num_heads", 0);
    if (p->rank == 4) {
        p->N = x->dims[1], p->S = x->dims[2], p->D = x->dims[3];
    } else {
        p->S = x->dims[1];
        if (heads <= 0) {
            /* the head size follows from the caches when num_heads is absent */
            int64_t rot = 2 * cs->dims[cs->ndim - 1];
            if (rot <= 0 || x->dims[2] % rot) return op_error(c, "3-D input needs num_heads");
            heads = x->dims[2] / rot;
        }
        if (x->dims[2] % heads) return op_error(c, "hidden size %lld does not divide by num_heads %lld", (long long)x->dims[2], (long long)heads);
        p->N = heads, p->D = x->dims[2] / heads;
    }
    p->rot = node_attr_int(c->node, "rotary_embedding_dim", 0);
    if (p->rot == 0) p->rot = p->D;
    if (p->rot < 0 || p->rot > p->D || p->rot % 2)
        return op_error(c, "rotary_embedding_dim %lld must be even and at most the head size %lld", (long long)p->rot, (long long)p->D);
    if (cs->dims[cs->ndim - 1] != p->rot / 2 || sn->ndim != cs->ndim || sn->dims[sn->ndim - 1] != p->rot / 2)
        return op_error(c, "cos_cache and sin_cache must end in rotary_embedding_dim / 2 = %lld values", (long long)(p->rot / 2));
    for (int k = 0; k < cs->ndim; k++)
        if (sn->dims[k] != cs->dims[k]) return op_error(c, "cos_cache and sin_cache must have the same shape");
    p->interleaved = node_attr_int(c->node, "interleaved", 0) != 0;
    return 0;
}

static int rope_decode(struct op_call *c, struct rope_params *p) {
    int rc = rope_decode_common(c, p, RE_X, RE_COS, RE_SIN);
    if (rc) return rc;
    const struct tensor *cs = c->in[RE_COS], *pos = attn_in(c, RE_POS);
    if (pos) {
        if (pos->dtype != DT_INT64 && pos->dtype != DT_INT32) return op_error(c, "position_ids must be int64");
        if ((rc = attn_dims_eq(c, pos, "position_ids", 2, (int64_t[]){p->B, p->S}))) return rc;
        if (cs->ndim != 2) return op_error(c, "with position_ids, cos_cache must have 2 dims (max_position, rot/2)");
    } else if ((rc = attn_dims_eq(c, cs, "cos_cache", 3, (int64_t[]){p->B, p->S, p->rot / 2}))) {
        return rc;
    }
    return 0;
}

static int rope_ms_decode(struct op_call *c, struct rope_params *p) {
    p->ms = 1;
    if (node_attr_int(c->node, "is_packed_batching", 0))
        return op_error(c, "is_packed_batching=1 is not supported");
    int rc = rope_decode_common(c, p, 0, 2, 3);
    if (rc) return rc;
    const struct tensor *pos = attn_in(c, 1);
    if (!pos) return op_error(c, "position_ids is required");
    if (pos->dtype != DT_INT64 && pos->dtype != DT_INT32) return op_error(c, "position_ids must be int64");
    if (c->in[2]->ndim != 2) return op_error(c, "cos_cache must have 2 dims (max_sequence_length, rot/2)");
    if (tensor_numel(pos) == 1 && !(pos->ndim == 2 && p->B * p->S == 1)) p->pos_offset = 1;
    else if ((rc = attn_dims_eq(c, pos, "position_ids", 2, (int64_t[]){p->B, p->S}))) return rc;
    return 0;
}

static int rope_infer_with(struct op_call *c, int (*decode)(struct op_call *, struct rope_params *)) {
    struct rope_params p;
    memset(&p, 0, sizeof p);
    int rc = decode(c, &p);
    if (rc) return rc;
    const struct tensor *x = c->in[0];
    return attn_set_out(c, 0, x->dtype, x->ndim, x->dims);
}
static int rope_infer(struct op_call *c) { return rope_infer_with(c, rope_decode); }
static int rope_ms_infer(struct op_call *c) { return rope_infer_with(c, rope_ms_decode); }

static int rope_prepare_with(struct op_call *c, void **state, size_t *scratch_size,
                             int (*decode)(struct op_call *, struct rope_params *)) {
    struct rope_params p;
    memset(&p, 0, sizeof p);
    int rc = decode(c, &p);
    if (rc) return rc;
    *scratch_size = attn_stage_bytes(c) + dnnl_util_align(sizeof(int64_t) * (size_t)(p.B * p.S) + 1);
    return params_keep(c, &p, sizeof p, state);
}
static int rope_prepare(struct op_call *c, void **s, size_t *n) { return rope_prepare_with(c, s, n, rope_decode); }
static int rope_ms_prepare(struct op_call *c, void **s, size_t *n) { return rope_prepare_with(c, s, n, rope_ms_decode); }

static int rope_body(struct op_call *c, void *scratch) {
    const struct rope_params *p = c->state;
    int ix = 0, icos = p->ms ? 2 : RE_COS, isin = p->ms ? 3 : RE_SIN, ipos = p->ms ? 1 : RE_POS;
    const struct tensor *x = c->in[ix], *cs = c->in[icos], *pos = attn_in(c, ipos);
    int64_t *rows = scratch;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t s = 0; s < p->S; s++)
            rows[b * p->S + s] = !pos ? b * p->S + s : p->pos_offset ? op_int_at(pos, 0) + s : op_int_at(pos, b * p->S + s);
    struct attn_rope r = {c->in[icos]->data, c->in[isin]->data, pos ? cs->dims[0] : p->B * p->S, p->rot, p->interleaved};
    struct attn_view in = p->rank == 4 ? attn_bnsh(x->data, p->N, p->S, p->D) : attn_bsnh(x->data, p->N, p->S, p->D);
    struct attn_view out = in;
    out.p = c->out[0]->data;
    return attn_rope_apply(c, &r, out, in, p->B, p->N, p->S, p->D, rows);
}

static int rope_run(struct op_call *c) { return attn_run_staged(c, rope_body); }

/* ==== com.microsoft: masks of Attention and MultiHeadAttention ========== */

/* mask_index (Attention) or key_padding_mask (MultiHeadAttention), int32:
 * (batch) key lengths, (2 * batch) ends then starts, (batch, keys) or
 * (batch, q_len, keys) of 1 (attend) and 0 (masked). */
static int ms_mask_check(struct op_call *c, const struct tensor *m, const char *what, int64_t B, int64_t S, int64_t T) {
    if (!m) return 0;
    if (m->dtype != DT_INT32 && m->dtype != DT_INT64 && m->dtype != DT_BOOL)
        return op_error(c, "%s must be int32 (got %s)", what, dtype_name(m->dtype));
    if (m->ndim == 1 && (m->dims[0] == B || m->dims[0] == 2 * B)) return 0;
    if (m->ndim == 2 && m->dims[0] == B && m->dims[1] == T) return 0;
    if (m->ndim == 3 && m->dims[0] == B && m->dims[1] == S && m->dims[2] == T) return 0;
    char got[128];
    return op_error(c, "%s of shape %s is not supported: kiln takes (%lld), (%lld), (%lld, %lld) or (%lld, %lld, %lld)",
                    what, tensor_shape_str(m, got, sizeof got), (long long)B, (long long)(2 * B), (long long)B,
                    (long long)T, (long long)B, (long long)S, (long long)T);
}

/* Sets the core's mask[0] or key ranges from a checked mask; begin and
 * end have room for B values each. */
static int ms_mask_apply(struct op_call *c, const struct tensor *m, struct attn_core *a, float fill, int64_t *begin,
                         int64_t *end) {
    if (!m) return 0;
    int64_t B = a->batch, T = a->kv_len;
    if (m->ndim == 1) {
        for (int64_t b = 0; b < B; b++) {
            end[b] = op_int_at(m, b);
            begin[b] = m->dims[0] == 2 * B ? op_int_at(m, B + b) : 0;
            if (end[b] < 0 || end[b] > T || begin[b] < 0 || begin[b] > end[b])
                return op_error(c, "mask_index of batch row %lld is [%lld, %lld); expected within [0, %lld]",
                                (long long)b, (long long)begin[b], (long long)end[b], (long long)T);
        }
        a->key_begin = begin, a->key_end = end, a->range_fill = fill;
        return 0;
    }
    a->mask[0] = (struct attn_mask){ATTN_MASK_KEEP, m->data, m->dtype, m->ndim == 2 ? T : a->q_len * T, 0,
                                    m->ndim == 2 ? 0 : T, T, fill};
    return 0;
}

/* attention_bias (batch or 1, heads or 1, q_len, keys) into mask[1]. */
static int ms_bias_check(struct op_call *c, const struct tensor *t, int64_t B, int64_t N, int64_t S, int64_t T,
                         struct attn_mask *out) {
    if (!t) return 0;
    if (!attn_is_float(t)) return op_error(c, "attention_bias must be float");
    if (t->ndim != 4 || (t->dims[0] != 1 && t->dims[0] != B) || (t->dims[1] != 1 && t->dims[1] != N) ||
        t->dims[2] != S || t->dims[3] != T) {
        char got[128];
        return op_error(c, "attention_bias has shape %s; expected (%lld or 1, %lld or 1, %lld, %lld)",
                        tensor_shape_str(t, got, sizeof got), (long long)B, (long long)N, (long long)S, (long long)T);
    }
    struct attn_mask m;
    int rc = attn_bcast_mask(c, t, "attention_bias", (int64_t[]){B, N, S, T}, &m);
    if (rc) return rc;
    m.kind = ATTN_MASK_ADD;
    if (out) *out = m;
    return 0;
}

/* ==== com.microsoft MultiHeadAttention and Attention =================== */

/* Shapes and attributes of both: Attention projects its input through
 * weights first; then both are the same attention over [B, N, *, H]. */
struct ms_attn_params {
    int fused;            /* Attention (fused QKV projection) */
    int64_t B, N, S, L, P, T, H, Hv, Din;
    int q_form;           /* MHA: 0 (B,S,N*H), 1 packed QKV (B,S,N,3,H) */
    int k_form;           /* MHA: 0 (B,L,N*H), 1 (B,N,L,H), 2 packed KV (B,L,N,2,H) */
    int v_form;           /* MHA: 0 (B,L,N*Hv), 1 (B,N,L,Hv) */
    float scale, fill;
    int causal;
    int nthreads;
};

enum { MHA_Q, MHA_K, MHA_V, MHA_BIAS, MHA_MASK, MHA_ABIAS, MHA_PAST_K, MHA_PAST_V, MHA_PAST_LEN };
enum { MSA_X, MSA_W, MSA_BIAS, MSA_MASK, MSA_PAST, MSA_ABIAS, MSA_PAST_LEN };

static int ms_attn_common_attrs(struct op_call *c, struct ms_attn_params *p) {
    p->N = node_attr_int(c->node, "num_heads", 0);
    if (p->N <= 0) return op_error(c, "num_heads must be positive");
    p->fill = node_attr_float(c->node, "mask_filter_value", -10000.0f);
    p->causal = node_attr_int(c->node, "unidirectional", 0) != 0;
    return 0;
}

static void ms_attn_scale(struct op_call *c, struct ms_attn_params *p) {
    float s = node_attr_float(c->node, "scale", 0.0f);
    p->scale = s != 0 ? s : 1.0f / sqrtf((float)p->H);
}

static int mha_decode(struct op_call *c, struct ms_attn_params *p) {
    int rc = ms_attn_common_attrs(c, p);
    if (rc) return rc;
    if ((rc = attn_check(c, MHA_Q, "query", 3, 5)) || (rc = attn_check(c, MHA_K, "key", 3, 5)) ||
        (rc = attn_check(c, MHA_V, "value", 3, 4)) || (rc = attn_check(c, MHA_BIAS, "bias", 1, 1)) ||
        (rc = attn_check(c, MHA_PAST_K, "past_key", 4, 4)) || (rc = attn_check(c, MHA_PAST_V, "past_value", 4, 4)))
        return rc;
    const struct tensor *q = attn_in(c, MHA_Q), *k = attn_in(c, MHA_K), *v = attn_in(c, MHA_V);
    if (!q) return op_error(c, "query is required");
    p->B = q->dims[0], p->S = q->dims[1];
    if (q->ndim == 5) {
        if (k || v || q->dims[2] != p->N || q->dims[3] != 3) return op_error(c, "packed QKV query must be (B, S, num_heads, 3, head_size) with no key or value");
        p->q_form = 1, p->H = p->Hv = q->dims[4], p->L = p->S;
    } else if (q->ndim == 3) {
        if (q->dims[2] % p->N) return op_error(c, "query's hidden size does not divide by num_heads");
        p->H = q->dims[2] / p->N;
        if (!k) return op_error(c, "key is required unless query is packed QKV");
        if (k->ndim == 5) {
            if (v || k->dims[2] != p->N || k->dims[3] != 2 || k->dims[4] != p->H) return op_error(c, "packed KV key must be (B, L, num_heads, 2, head_size) with no value");
            p->k_form = 2, p->L = k->dims[1], p->Hv = p->H;
        } else {
            if (!v) return op_error(c, "value is required");
            if (k->ndim == 4) {
                if (k->dims[1] != p->N || k->dims[3] != p->H) return op_error(c, "key of 4 dims must be (B, num_heads, L, head_size)");
                p->k_form = 1, p->L = k->dims[2];
            } else if (k->ndim == 3) {
                if (k->dims[2] != p->N * p->H) return op_error(c, "key's hidden size must equal query's");
                p->L = k->dims[1];
            } else {
                return op_error(c, "key must have 3, 4 or 5 dims");
            }
            if (v->ndim == 4) {
                if (v->dims[1] != p->N || v->dims[2] != p->L) return op_error(c, "value of 4 dims must be (B, num_heads, L, v_head_size)");
                p->v_form = 1, p->Hv = v->dims[3];
            } else {
                if (v->dims[1] != p->L || v->dims[2] % p->N) return op_error(c, "value must be (B, L, num_heads * v_head_size)");
                p->Hv = v->dims[2] / p->N;
            }
        }
        if (k->dims[0] != p->B || (v && v->dims[0] != p->B)) return op_error(c, "query, key and value must have the same batch size");
    } else {
        return op_error(c, "query must have 3 or 5 dims");
    }
    const struct tensor *bias = attn_in(c, MHA_BIAS);
    if (bias && bias->dims[0] != p->N * (2 * p->H + p->Hv)) return op_error(c, "bias must have %lld values", (long long)(p->N * (2 * p->H + p->Hv)));
    if (bias && (p->k_form || p->v_form)) return op_error(c, "bias with a key or value of 4 or 5 dims is not supported");
    const struct tensor *pk = attn_in(c, MHA_PAST_K), *pv = attn_in(c, MHA_PAST_V);
    if (!pk != !pv) return op_error(c, "past_key and past_value go together");
    p->P = pk ? pk->dims[2] : 0;
    if (pk && ((rc = attn_dims_eq(c, pk, "past_key", 4, (int64_t[]){p->B, p->N, p->P, p->H})) ||
               (rc = attn_dims_eq(c, pv, "past_value", 4, (int64_t[]){p->B, p->N, p->P, p->Hv}))))
        return rc;
    if (attn_in(c, 9)) return op_error(c, "cache_indirection is not supported");
    if (attn_out(c, 3)) return op_error(c, "output qk is not supported");
    p->T = p->P + p->L;
    ms_attn_scale(c, p);
    if ((rc = ms_mask_check(c, attn_in(c, MHA_MASK), "key_padding_mask", p->B, p->S, p->T))) return rc;
    return ms_bias_check(c, attn_in(c, MHA_ABIAS), p->B, p->N, p->S, p->T, NULL);
}

static int msa_decode(struct op_call *c, struct ms_attn_params *p) {
    p->fused = 1;
    int rc = ms_attn_common_attrs(c, p);
    if (rc) return rc;
    if ((rc = attn_check(c, MSA_X, "input", 3, 3)) || (rc = attn_check(c, MSA_W, "weights", 2, 2)) ||
        (rc = attn_check(c, MSA_BIAS, "bias", 1, 1)) || (rc = attn_check(c, MSA_PAST, "past", 5, 5)))
        return rc;
    const struct tensor *x = attn_in(c, MSA_X), *w = attn_in(c, MSA_W), *bias = attn_in(c, MSA_BIAS);
    if (!x || !w) return op_error(c, "input and weights are required");
    if (node_attr_int(c->node, "do_rotary", 0)) return op_error(c, "do_rotary=1 is not supported");
    if (node_attr_int(c->node, "past_present_share_buffer", 0)) return op_error(c, "past_present_share_buffer=1 is not supported");
    p->B = x->dims[0], p->S = p->L = x->dims[1], p->Din = x->dims[2];
    if (w->dims[0] != p->Din) return op_error(c, "weights has %lld rows; input has %lld features", (long long)w->dims[0], (long long)p->Din);
    int64_t hq = w->dims[1] / 3, hk = hq, hv = hq;
    const int64_t *sizes;
    int nsizes = node_attr_ints(c->node, "qkv_hidden_sizes", &sizes);
    if (nsizes >= 0) {
        if (nsizes != 3) return op_error(c, "qkv_hidden_sizes must have 3 values");
        hq = sizes[0], hk = sizes[1], hv = sizes[2];
    }
    if (hq != hk) return op_error(c, "Q and K hidden sizes must be equal");
    if (hq + hk + hv != w->dims[1]) return op_error(c, "weights has %lld columns; qkv_hidden_sizes add up to %lld", (long long)w->dims[1], (long long)(hq + hk + hv));
    if (hq % p->N || hv % p->N) return op_error(c, "hidden sizes do not divide by num_heads");
    p->H = hq / p->N, p->Hv = hv / p->N;
    if (bias && bias->dims[0] != w->dims[1]) return op_error(c, "bias must have %lld values", (long long)w->dims[1]);
    const struct tensor *past = attn_in(c, MSA_PAST);
    p->P = past ? past->dims[3] : 0;
    if (past && p->H != p->Hv) return op_error(c, "past needs equal Q, K and V hidden sizes");
    if (past && (rc = attn_dims_eq(c, past, "past", 5, (int64_t[]){2, p->B, p->N, p->P, p->H}))) return rc;
    p->T = p->P + p->L;
    ms_attn_scale(c, p);
    if ((rc = ms_mask_check(c, attn_in(c, MSA_MASK), "mask_index", p->B, p->S, p->T))) return rc;
    return ms_bias_check(c, attn_in(c, MSA_ABIAS), p->B, p->N, p->S, p->T, NULL);
}

static int ms_attn_infer_with(struct op_call *c, int (*decode)(struct op_call *, struct ms_attn_params *)) {
    struct ms_attn_params p;
    memset(&p, 0, sizeof p);
    int rc = decode(c, &p);
    if (rc) return rc;
    enum dtype dt = c->in[0]->dtype;
    attn_set_out(c, 0, dt, 3, (int64_t[]){p.B, p.S, p.N * p.Hv});
    if (p.fused) return attn_set_out(c, 1, dt, 5, (int64_t[]){2, p.B, p.N, p.T, p.H});
    attn_set_out(c, 1, dt, 4, (int64_t[]){p.B, p.N, p.T, p.H});
    return attn_set_out(c, 2, dt, 4, (int64_t[]){p.B, p.N, p.T, p.Hv});
}
static int mha_infer(struct op_call *c) { return ms_attn_infer_with(c, mha_decode); }
static int msa_infer(struct op_call *c) { return ms_attn_infer_with(c, msa_decode); }

/* Body scratch: the projection (Attention), Q, present K and V, mask
 * ranges, the core's buffers. */
static size_t ms_attn_body_bytes(const struct ms_attn_params *p) {
    size_t f = sizeof(float);
    size_t proj = p->fused ? f * (size_t)(p->B * p->S * p->N * (2 * p->H + p->Hv)) : 0;
    return dnnl_util_align(proj + 1) + dnnl_util_align(f * (size_t)(p->B * p->N * p->S * p->H) + 1) +
           dnnl_util_align(f * (size_t)(p->B * p->N * p->T * p->H) + 1) +
           dnnl_util_align(f * (size_t)(p->B * p->N * p->T * p->Hv) + 1) +
           2 * dnnl_util_align(sizeof(int64_t) * (size_t)p->B + 1) + attn_core_scratch(p->S, p->T, p->nthreads);
}

static int ms_attn_prepare_with(struct op_call *c, void **state, size_t *scratch_size,
                                int (*decode)(struct op_call *, struct ms_attn_params *)) {
    struct ms_attn_params p;
    memset(&p, 0, sizeof p);
    int rc = decode(c, &p);
    if (rc) return rc;
    p.nthreads = attn_threads(c);
    *scratch_size = attn_stage_bytes(c) + ms_attn_body_bytes(&p);
    return params_keep(c, &p, sizeof p, state);
}
static int mha_prepare(struct op_call *c, void **s, size_t *n) { return ms_attn_prepare_with(c, s, n, mha_decode); }
static int msa_prepare(struct op_call *c, void **s, size_t *n) { return ms_attn_prepare_with(c, s, n, msa_decode); }

/* Where the new Q, K and V rows are read from (before the bias). */
struct ms_qkv_src {
    struct attn_view q, k, v;
    const float *bias; /* [N*H q | N*H k | N*Hv v] or NULL */
};

static void mha_sources(const struct op_call *c, const struct ms_attn_params *p, struct ms_qkv_src *src) {
    int64_t N = p->N, H = p->H, Hv = p->Hv, S = p->S, L = p->L;
    float *q = c->in[MHA_Q]->data;
    const struct tensor *bias = attn_in(c, MHA_BIAS);
    src->bias = bias ? bias->data : NULL;
    if (p->q_form == 1) { /* (B, S, N, 3, H) */
        src->q = (struct attn_view){q, S * N * 3 * H, 3 * H, N * 3 * H};
        src->k = (struct attn_view){q + H, S * N * 3 * H, 3 * H, N * 3 * H};
        src->v = (struct attn_view){q + 2 * H, S * N * 3 * H, 3 * H, N * 3 * H};
        return;
    }
    src->q = attn_bsnh(q, N, S, H);
    float *k = c->in[MHA_K]->data;
    if (p->k_form == 2) { /* (B, L, N, 2, H) */
        src->k = (struct attn_view){k, L * N * 2 * H, 2 * H, N * 2 * H};
        src->v = (struct attn_view){k + H, L * N * 2 * H, 2 * H, N * 2 * H};
        return;
    }
    src->k = p->k_form == 1 ? attn_bnsh(k, N, L, H) : attn_bsnh(k, N, L, H);
    float *v = c->in[MHA_V]->data;
    src->v = p->v_form == 1 ? attn_bnsh(v, N, L, Hv) : attn_bsnh(v, N, L, Hv);
}

/* Attention: input (B*S, Din) times weights into proj (B*S, 3 parts). */
static int msa_sources(struct op_call *c, const struct ms_attn_params *p, float *proj, struct ms_qkv_src *src) {
    int64_t N = p->N, H = p->H, Hv = p->Hv, S = p->S, W = N * (2 * H + Hv);
    dnnl_util_set_threads(c->nthreads);
    DNNL_CHECK(dnnl_sgemm('N', 'N', p->B * S, W, p->Din, 1.0f, c->in[MSA_X]->data, p->Din, c->in[MSA_W]->data, W,
                          0.0f, proj, W));
    const struct tensor *bias = attn_in(c, MSA_BIAS);
    src->bias = bias ? bias->data : NULL;
    src->q = (struct attn_view){proj, S * W, H, W};
    src->k = (struct attn_view){proj + N * H, S * W, H, W};
    src->v = (struct attn_view){proj + 2 * N * H, S * W, Hv, W};
    return 0;
}

/* Present K or V: past rows, then the new ones with their bias. */
static void ms_present(float *dst, const float *past, struct attn_view cur, const float *bias, int64_t B, int64_t N,
                       int64_t P, int64_t L, int64_t H) {
    int64_t T = P + L;
    if (P) attn_copy_rows(attn_bnsh(dst, N, T, H), attn_bnsh((float *)past, N, P, H), B, N, P, H, NULL);
    attn_copy_rows(attn_bnsh(dst + P * H, N, T, H), cur, B, N, L, H, bias);
}

static int ms_attn_body(struct op_call *c, void *scratch) {
    const struct ms_attn_params *p = c->state;
    int64_t B = p->B, N = p->N, H = p->H, Hv = p->Hv, S = p->S, T = p->T, P = p->P, L = p->L;
    void *s = scratch;
    float *proj = attn_carve(&s, p->fused ? sizeof(float) * (size_t)(B * S * N * (2 * H + Hv)) : 0);
    float *qb = attn_carve(&s, sizeof(float) * (size_t)(B * N * S * H) + 1);
    float *kb = attn_carve(&s, sizeof(float) * (size_t)(B * N * T * H) + 1);
    float *vb = attn_carve(&s, sizeof(float) * (size_t)(B * N * T * Hv) + 1);
    int64_t *begin = attn_carve(&s, sizeof(int64_t) * (size_t)B + 1);
    int64_t *end = attn_carve(&s, sizeof(int64_t) * (size_t)B + 1);
    struct ms_qkv_src src;
    memset(&src, 0, sizeof src);
    int rc = 0;
    if (p->fused) rc = msa_sources(c, p, proj, &src);
    else mha_sources(c, p, &src);
    if (rc) return rc;
    const float *pk = NULL, *pv = NULL;
    float *ok = NULL, *ov = NULL;
    if (p->fused) {
        const struct tensor *past = attn_in(c, MSA_PAST);
        struct tensor *present = attn_out(c, 1);
        if (past) pk = past->data, pv = (const float *)past->data + B * N * P * H;
        if (present) ok = present->data, ov = (float *)present->data + B * N * T * H;
    } else {
        const struct tensor *tk = attn_in(c, MHA_PAST_K), *tv = attn_in(c, MHA_PAST_V);
        pk = tk ? tk->data : NULL, pv = tv ? tv->data : NULL;
        ok = attn_out(c, 1) ? attn_out(c, 1)->data : NULL;
        ov = attn_out(c, 2) ? attn_out(c, 2)->data : NULL;
    }
    const float *bias = src.bias;
    attn_copy_rows(attn_bnsh(qb, N, S, H), src.q, B, N, S, H, bias);
    float *kd = ok ? ok : kb, *vd = ov ? ov : vb;
    ms_present(kd, pk, src.k, bias ? bias + N * H : NULL, B, N, P, L, H);
    ms_present(vd, pv, src.v, bias ? bias + 2 * N * H : NULL, B, N, P, L, Hv);
    struct attn_core a;
    memset(&a, 0, sizeof a);
    a.batch = B, a.heads = a.kv_heads = N, a.q_len = S, a.kv_len = T, a.head_size = H, a.v_head_size = Hv;
    a.scale = p->scale;
    a.q = attn_bnsh(qb, N, S, H), a.k = attn_bnsh(kd, N, T, H), a.v = attn_bnsh(vd, N, T, Hv);
    a.y = attn_bsnh(c->out[0]->data, N, S, Hv);
    if ((rc = ms_mask_apply(c, attn_in(c, p->fused ? MSA_MASK : MHA_MASK), &a, p->fill, begin, end))) return rc;
    if ((rc = ms_bias_check(c, attn_in(c, p->fused ? MSA_ABIAS : MHA_ABIAS), B, N, S, T, &a.mask[1]))) return rc;
    a.causal = p->causal, a.q_pos0 = P, a.causal_fill = p->fill;
    return attn_core_run(c, &a, s, p->nthreads);
}

static int ms_attn_run(struct op_call *c) { return attn_run_staged(c, ms_attn_body); }

/* ==== com.microsoft GroupQueryAttention ================================ */

enum { GQA_Q, GQA_K, GQA_V, GQA_PAST_K, GQA_PAST_V, GQA_SEQLENS, GQA_TOTAL, GQA_COS, GQA_SIN, GQA_POS, GQA_ABIAS,
       GQA_SINK, GQA_KSCALE, GQA_VSCALE, GQA_QNORM, GQA_KNORM };

struct gqa_params {
    int64_t B, N, Nkv, S, H, P, T; /* T: present length, P + S */
    int packed, causal, rotary, interleaved, smooth;
    int64_t window, rot;
    float scale, softcap;
    int nthreads;
};

static int gqa_decode(struct op_call *c, struct gqa_params *p) {
    int rc;
    p->N = node_attr_int(c->node, "num_heads", 0);
    p->Nkv = node_attr_int(c->node, "kv_num_heads", 0);
    if (p->N <= 0 || p->Nkv <= 0 || p->N % p->Nkv)
        return op_error(c, "num_heads (%lld) must be a positive multiple of kv_num_heads (%lld)", (long long)p->N, (long long)p->Nkv);
    if ((rc = attn_check(c, GQA_Q, "query", 3, 3)) || (rc = attn_check(c, GQA_K, "key", 3, 3)) ||
        (rc = attn_check(c, GQA_V, "value", 3, 3)) || (rc = attn_check(c, GQA_PAST_K, "past_key", 4, 4)) ||
        (rc = attn_check(c, GQA_PAST_V, "past_value", 4, 4)) || (rc = attn_check(c, GQA_COS, "cos_cache", 2, 2)) ||
        (rc = attn_check(c, GQA_SIN, "sin_cache", 2, 2)) || (rc = attn_check(c, GQA_SINK, "head_sink", 1, 1)))
        return rc;
    for (int i = GQA_KSCALE; i <= GQA_KNORM; i++)
        if (attn_in(c, i)) return op_error(c, "input %d (quantized KV cache scales, q/k norm weights) is not supported", i);
    if (attn_out(c, 3)) return op_error(c, "output_qk is not supported");
    if (node_attr_int(c->node, "sliding_window_cache", 0)) return op_error(c, "sliding_window_cache=1 is not supported");
    const struct tensor *q = attn_in(c, GQA_Q), *k = attn_in(c, GQA_K), *v = attn_in(c, GQA_V);
    if (!q) return op_error(c, "query is required");
    p->B = q->dims[0], p->S = q->dims[1];
    p->packed = !k;
    if (p->packed) {
        if (v) return op_error(c, "value without key");
        if (q->dims[2] % (p->N + 2 * p->Nkv)) return op_error(c, "packed QKV's last dim does not divide by num_heads + 2 * kv_num_heads");
        p->H = q->dims[2] / (p->N + 2 * p->Nkv);
    } else {
        if (!v) return op_error(c, "key and value go together");
        if (q->dims[2] % p->N) return op_error(c, "query's hidden size does not divide by num_heads");
        p->H = q->dims[2] / p->N;
        if ((rc = attn_dims_eq(c, k, "key", 3, (int64_t[]){p->B, p->S, p->Nkv * p->H})) ||
            (rc = attn_dims_eq(c, v, "value", 3, (int64_t[]){p->B, p->S, p->Nkv * p->H})))
            return rc;
    }
    const struct tensor *pk = attn_in(c, GQA_PAST_K), *pv = attn_in(c, GQA_PAST_V);
    if (!pk != !pv) return op_error(c, "past_key and past_value go together");
    p->P = pk ? pk->dims[2] : 0;
    if (pk && ((rc = attn_dims_eq(c, pk, "past_key", 4, (int64_t[]){p->B, p->Nkv, p->P, p->H})) ||
               (rc = attn_dims_eq(c, pv, "past_value", 4, (int64_t[]){p->B, p->Nkv, p->P, p->H}))))
        return rc;
    p->T = p->P + p->S;
    const struct tensor *sl = attn_in(c, GQA_SEQLENS), *tot = attn_in(c, GQA_TOTAL);
    if (!sl || !tot) return op_error(c, "seqlens_k and total_sequence_length are required");
    if (sl->dtype != DT_INT32 || sl->ndim != 1 || sl->dims[0] != p->B)
        return op_error(c, "seqlens_k must be int32 of shape (%lld)", (long long)p->B);
    if (tot->dtype != DT_INT32 || tensor_numel(tot) != 1) return op_error(c, "total_sequence_length must be one int32");
    p->causal = node_attr_int(c->node, "causal", 1) != 0;
    p->window = node_attr_int(c->node, "local_window_size", -1);
    p->softcap = node_attr_float(c->node, "softcap", 0.0f);
    p->smooth = node_attr_int(c->node, "smooth_softmax", 0) != 0;
    float s = node_attr_float(c->node, "scale", 0.0f);
    p->scale = s != 0 ? s : 1.0f / sqrtf((float)p->H);
    p->rotary = node_attr_int(c->node, "do_rotary", 0) != 0;
    p->interleaved = node_attr_int(c->node, "rotary_interleaved", 0) != 0;
    if (p->rotary) {
        const struct tensor *cs = attn_in(c, GQA_COS), *sn = attn_in(c, GQA_SIN);
        if (!cs || !sn) return op_error(c, "do_rotary=1 needs cos_cache and sin_cache");
        p->rot = 2 * cs->dims[1];
        if (p->rot > p->H || sn->dims[0] != cs->dims[0] || sn->dims[1] != cs->dims[1])
            return op_error(c, "cos_cache and sin_cache must be (max_sequence_length, rotary_dim / 2) with rotary_dim <= head size %lld", (long long)p->H);
        const struct tensor *pos = attn_in(c, GQA_POS);
        if (pos && (rc = attn_dims_eq(c, pos, "position_ids", 2, (int64_t[]){p->B, p->S}))) return rc;
    }
    const struct tensor *sink = attn_in(c, GQA_SINK);
    if (sink && sink->dims[0] != p->N) return op_error(c, "head_sink must have num_heads values");
    return ms_bias_check(c, attn_in(c, GQA_ABIAS), p->B, p->N, p->S, p->T, NULL);
}

static int gqa_infer(struct op_call *c) {
    struct gqa_params p;
    memset(&p, 0, sizeof p);
    int rc = gqa_decode(c, &p);
    if (rc) return rc;
    enum dtype dt = c->in[0]->dtype;
    attn_set_out(c, 0, dt, 3, (int64_t[]){p.B, p.S, p.N * p.H});
    attn_set_out(c, 1, dt, 4, (int64_t[]){p.B, p.Nkv, p.T, p.H});
    return attn_set_out(c, 2, dt, 4, (int64_t[]){p.B, p.Nkv, p.T, p.H});
}

static size_t gqa_body_bytes(const struct gqa_params *p) {
    size_t f = sizeof(float), i8 = sizeof(int64_t);
    return dnnl_util_align(f * (size_t)(p->B * p->N * p->S * p->H) + 1) +
           2 * dnnl_util_align(f * (size_t)(p->B * p->Nkv * p->T * p->H) + 1) +
           2 * dnnl_util_align(i8 * (size_t)p->B + 1) + dnnl_util_align(i8 * (size_t)(p->B * p->S) + 1) +
           attn_core_scratch(p->S, p->T, p->nthreads);
}

static int gqa_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct gqa_params p;
    memset(&p, 0, sizeof p);
    int rc = gqa_decode(c, &p);
    if (rc) return rc;
    p.nthreads = attn_threads(c);
    *scratch_size = attn_stage_bytes(c) + gqa_body_bytes(&p);
    return params_keep(c, &p, sizeof p, state);
}

/* Each batch row's past length from seqlens_k (its total length - 1):
 * the first prompt (no past, sequence_length == total_sequence_length)
 * starts at 0 with its padding on the right. */
static int gqa_positions(struct op_call *c, const struct gqa_params *p, int64_t *past, int64_t *total) {
    int64_t tot = op_int_at(c->in[GQA_TOTAL], 0);
    int first = p->P == 0 && p->S == tot;
    if (tot > p->T)
        return op_error(c, "total_sequence_length %lld exceeds past length %lld + sequence length %lld; kiln keeps past "
                        "and present KV caches apart (no shared buffer)", (long long)tot, (long long)p->P, (long long)p->S);
    for (int64_t b = 0; b < p->B; b++) {
        total[b] = op_int_at(c->in[GQA_SEQLENS], b) + 1;
        past[b] = first ? 0 : total[b] - p->S;
        if (total[b] < 1 || total[b] > tot || past[b] < 0 || past[b] > p->P)
            return op_error(c, "seqlens_k[%lld] = %lld does not fit sequence length %lld, past length %lld and "
                            "total_sequence_length %lld", (long long)b, (long long)(total[b] - 1), (long long)p->S,
                            (long long)p->P, (long long)tot);
    }
    return 0;
}

static int gqa_body(struct op_call *c, void *scratch) {
    const struct gqa_params *p = c->state;
    int64_t B = p->B, N = p->N, Nkv = p->Nkv, S = p->S, H = p->H, P = p->P, T = p->T;
    void *s = scratch;
    float *qb = attn_carve(&s, sizeof(float) * (size_t)(B * N * S * H) + 1);
    float *kb = attn_carve(&s, sizeof(float) * (size_t)(B * Nkv * T * H) + 1);
    float *vb = attn_carve(&s, sizeof(float) * (size_t)(B * Nkv * T * H) + 1);
    int64_t *past = attn_carve(&s, sizeof(int64_t) * (size_t)B + 1);
    int64_t *total = attn_carve(&s, sizeof(int64_t) * (size_t)B + 1);
    int64_t *rows = attn_carve(&s, sizeof(int64_t) * (size_t)(B * S) + 1);
    int rc = gqa_positions(c, p, past, total);
    if (rc) return rc;
    float *q = c->in[GQA_Q]->data;
    struct attn_view sq, sk, sv;
    if (p->packed) {
        int64_t W = (N + 2 * Nkv) * H;
        sq = (struct attn_view){q, S * W, H, W};
        sk = (struct attn_view){q + N * H, S * W, H, W};
        sv = (struct attn_view){q + (N + Nkv) * H, S * W, H, W};
    } else {
        sq = attn_bsnh(q, N, S, H);
        sk = attn_bsnh(c->in[GQA_K]->data, Nkv, S, H);
        sv = attn_bsnh(c->in[GQA_V]->data, Nkv, S, H);
    }
    struct tensor *ok = attn_out(c, 1), *ov = attn_out(c, 2);
    float *kd = ok ? ok->data : kb, *vd = ov ? ov->data : vb;
    const struct tensor *pk = attn_in(c, GQA_PAST_K), *pv = attn_in(c, GQA_PAST_V);
    memset(kd, 0, sizeof(float) * (size_t)(B * Nkv * T * H));
    memset(vd, 0, sizeof(float) * (size_t)(B * Nkv * T * H));
    if (P) {
        attn_copy_rows(attn_bnsh(kd, Nkv, T, H), attn_bnsh(pk->data, Nkv, P, H), B, Nkv, P, H, NULL);
        attn_copy_rows(attn_bnsh(vd, Nkv, T, H), attn_bnsh(pv->data, Nkv, P, H), B, Nkv, P, H, NULL);
    }
    /* the new rows of batch row b go after its own past */
    for (int64_t b = 0; b < B; b++) {
        struct attn_view dk = attn_bnsh(kd + b * Nkv * T * H + past[b] * H, Nkv, T, H);
        struct attn_view dv = attn_bnsh(vd + b * Nkv * T * H + past[b] * H, Nkv, T, H);
        struct attn_view bk = sk, bv = sv;
        bk.p += b * sk.sb, bv.p += b * sv.sb;
        attn_copy_rows(dk, bk, 1, Nkv, S, H, NULL);
        attn_copy_rows(dv, bv, 1, Nkv, S, H, NULL);
    }
    attn_copy_rows(attn_bnsh(qb, N, S, H), sq, B, N, S, H, NULL);
    if (p->rotary) {
        const struct tensor *cs = c->in[GQA_COS], *pos = attn_in(c, GQA_POS);
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < S; i++) rows[b * S + i] = pos ? op_int_at(pos, b * S + i) : past[b] + i;
        struct attn_rope r = {cs->data, c->in[GQA_SIN]->data, cs->dims[0], p->rot, p->interleaved};
        struct attn_view vq = attn_bnsh(qb, N, S, H);
        if ((rc = attn_rope_apply(c, &r, vq, vq, B, N, S, H, rows))) return rc;
        for (int64_t b = 0; b < B; b++) {
            struct attn_view vk = attn_bnsh(kd + b * Nkv * T * H + past[b] * H, Nkv, T, H);
            if ((rc = attn_rope_apply(c, &r, vk, vk, 1, Nkv, S, H, rows + b * S))) return rc;
        }
    }
    struct attn_core a;
    memset(&a, 0, sizeof a);
    a.batch = B, a.heads = N, a.kv_heads = Nkv, a.q_len = S, a.kv_len = T, a.head_size = a.v_head_size = H;
    a.scale = p->scale, a.softcap = p->softcap;
    a.q = attn_bnsh(qb, N, S, H), a.k = attn_bnsh(kd, Nkv, T, H), a.v = attn_bnsh(vd, Nkv, T, H);
    a.y = attn_bsnh(c->out[0]->data, N, S, H);
    a.key_end = total, a.range_fill = -INFINITY;
    a.causal = p->causal, a.q_pos = past, a.window = p->window, a.causal_fill = -INFINITY;
    const struct tensor *sink = attn_in(c, GQA_SINK);
    a.sink = sink ? sink->data : NULL;
    a.sink_zero = p->smooth;
    if ((rc = ms_bias_check(c, attn_in(c, GQA_ABIAS), B, N, S, T, &a.mask[1]))) return rc;
    return attn_core_run(c, &a, s, p->nthreads);
}

static int gqa_run(struct op_call *c) { return attn_run_staged(c, gqa_body); }

/* ---- kiln.SoftmaxAttention: exported attention without a mask ---------- */

/* Y = softmax(scale * A B) V over the last axis, as models/passes.c fuses
 * MatMul -> [Mul/Div by a scalar] -> Softmax -> MatMul when nothing else
 * reads the scores: A [..., S, D], B [..., D, T] (the keys transposed, as
 * exporters write them), V [..., T, Dv], leading axes broadcast as MatMul
 * does; Y [..., S, Dv]. The scores ([S, T] per head, 9 MB for 1500 audio
 * frames) never reach memory: blocks of query rows whose scores fit the
 * core's cache go through both products and the softmax in turn. */
#define SA_BLOCK_FLOATS (64 * 1024) /* 256 KiB of scores per block */

struct sa_shape {
    int nd;                         /* leading axes */
    int64_t lead[TENSOR_MAX_DIMS];  /* Y's */
    int64_t sa[TENSOR_MAX_DIMS], sb[TENSOR_MAX_DIMS], sv[TENSOR_MAX_DIMS]; /* element strides, 0 broadcast */
    int64_t nbatch, S, D, T, Dv, rb; /* rb: query rows a block */
};

static int sa_shape(struct op_call *c, struct sa_shape *sh) {
    const struct tensor *a = c->in[0], *b = c->in[1], *v = c->in[2];
    const struct tensor *t3[3] = {a, b, v};
    static const char *const names[3] = {"A", "B", "V"};
    for (int i = 0; i < 3; i++)
        if (t3[i]->dtype != DT_FP32 || t3[i]->ndim < 2)
            return op_error(c, "%s must be a float tensor of rank 2 or more", names[i]);
    sh->S = a->dims[a->ndim - 2], sh->D = a->dims[a->ndim - 1];
    sh->T = b->dims[b->ndim - 1], sh->Dv = v->dims[v->ndim - 1];
    if (b->dims[b->ndim - 2] != sh->D || v->dims[v->ndim - 2] != sh->T)
        return op_error(c, "A [.., %lld, %lld], B [.., %lld, %lld] and V [.., %lld, %lld] do not chain",
                        (long long)sh->S, (long long)sh->D, (long long)b->dims[b->ndim - 2], (long long)sh->T,
                        (long long)v->dims[v->ndim - 2], (long long)sh->Dv);
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    nd = (nd > v->ndim ? nd : v->ndim) - 2;
    sh->nd = nd;
    sh->nbatch = 1;
    int64_t mat[3] = {sh->S * sh->D, sh->D * sh->T, sh->T * sh->Dv};
    int64_t acc[3] = {mat[0], mat[1], mat[2]};
    for (int i = nd - 1; i >= 0; i--) {
        int64_t d = 1;
        for (int k = 0; k < 3; k++) {
            int j = t3[k]->ndim - 2 - nd + i;
            int64_t dk = j >= 0 ? t3[k]->dims[j] : 1;
            if (dk != 1 && d != 1 && dk != d) return op_error(c, "the leading axes of A, B and V do not broadcast");
            if (dk != 1) d = dk;
        }
        int64_t *st[3] = {sh->sa, sh->sb, sh->sv};
        for (int k = 0; k < 3; k++) {
            int j = t3[k]->ndim - 2 - nd + i;
            int64_t dk = j >= 0 ? t3[k]->dims[j] : 1;
            st[k][i] = dk == 1 ? 0 : acc[k];
            acc[k] *= dk;
        }
        sh->lead[i] = d;
        sh->nbatch *= d;
    }
    int64_t rb = sh->T > 0 ? SA_BLOCK_FLOATS / sh->T : sh->S;
    if (rb < 8) rb = 8;
    sh->rb = rb < sh->S ? rb : sh->S;
    return 0;
}

static int sa_infer(struct op_call *c) {
    struct sa_shape sh;
    int rc = sa_shape(c, &sh);
    if (rc) return rc;
    struct tensor *y = c->out[0];
    y->dtype = DT_FP32;
    y->ndim = sh.nd + 2;
    for (int i = 0; i < sh.nd; i++) y->dims[i] = sh.lead[i];
    y->dims[sh.nd] = sh.S;
    y->dims[sh.nd + 1] = sh.Dv;
    return 0;
}

/* Keys under this many, the scores of a head stay in the core's cache
 * anyway: the two products run as oneDNN matmul primitives over every head
 * at once (faster on small matrices than a call per head and block), and
 * the softmax between them over all the rows. */
#define SA_BLOCKED_MIN_KEYS 512

struct sa_state {
    int small;
    struct cpu_mm_state *mm1, *mm2; /* small: scale * A B, then P V */
    struct dnnl_prim *smax;         /* small: oneDNN's softmax over the rows of the scores, in place */
    size_t off1, off2, off3;        /* small: scratch offsets of the primitives' scratch (the scores at 0) */
};

static void sa_release(void *st) {
    struct sa_state *s = st;
    if (!s) return;
    cpu_mm_release(s->mm1);
    cpu_mm_release(s->mm2);
    dnnl_prim_free(s->smax);
    free(s);
}

/* The small path's two primitives: plain layouts, numpy broadcasting. */
static int sa_build_small(struct op_call *c, struct sa_state *s, const struct sa_shape *sh, size_t *scratch_size) {
    struct tensor scores = {.dtype = DT_FP32};
    struct cpu_mm_shape m1, m2;
    int rc = cpu_mm_shapes(c, c->in[0], c->in[1], &m1, &scores);
    if (!rc) rc = cpu_mm_shapes(c, &scores, c->in[2], &m2, NULL);
    if (rc) return rc;
    dnnl_memory_desc_t a_md, b_md, y_md, p_md, v_md, o_md;
    dnnl_util_plain_md(&a_md, m1.r, m1.a);
    dnnl_util_plain_md(&b_md, m1.r, m1.b);
    dnnl_util_plain_md(&y_md, m1.r, m1.y);
    dnnl_util_plain_md(&p_md, m2.r, m2.a);
    dnnl_util_plain_md(&v_md, m2.r, m2.b);
    dnnl_util_plain_md(&o_md, m2.r, m2.y);
    size_t s1 = 0, s2 = 0;
    float scale = node_attr_float(c->node, "scale", 1.0f);
    if (!(s->mm1 = calloc(1, sizeof *s->mm1)) || !(s->mm2 = calloc(1, sizeof *s->mm2)))
        return op_error(c, "out of memory"), STATUS_NOMEM;
    if ((rc = cpu_mm_build(c, s->mm1, &a_md, &b_md, NULL, NULL, &y_md, scale, 0, &s1)) ||
        (rc = cpu_mm_build(c, s->mm2, &p_md, &v_md, NULL, NULL, &o_md, 1.0f, 0, &s2)))
        return rc;
    int64_t sd[3] = {sh->nbatch * sh->S, sh->T, 1};
    size_t s3 = 0;
    dnnl_memory_desc_t md;
    dnnl_softmax_v2_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = dnnl_util_attr();
    dnnl_status_t st = attr && dnnl_util_plain_md(&md, 3, sd) == 0
                           ? dnnl_softmax_v2_forward_desc_init(&d, dnnl_forward_inference, dnnl_softmax_accurate, &md,
                                                               &md, 1)
                           : dnnl_out_of_memory;
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &d, attr, dnnl_util_engine(), NULL);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st == dnnl_success) { /* else the rows below do it */
        int ids[2] = {DNNL_ARG_SRC, DNNL_ARG_DST};
        s->smax = dnnl_prim_create(c, pd, 2, ids, &s3);
        dnnl_primitive_desc_destroy(pd);
    }
    s->off1 = dnnl_util_align(sizeof(float) * (size_t)(sh->nbatch * sh->S * sh->T > 0 ? sh->nbatch * sh->S * sh->T : 1));
    s->off2 = s->off1 + dnnl_util_align(s1);
    s->off3 = s->off2 + dnnl_util_align(s2);
    *scratch_size = s->off3 + dnnl_util_align(s3);
    return 0;
}

static int sa_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct sa_shape sh;
    int rc = sa_shape(c, &sh);
    if (rc) return rc;
    struct sa_state *s = calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory"), STATUS_NOMEM;
    s->small = sh.T < SA_BLOCKED_MIN_KEYS;
    if (s->small) rc = sa_build_small(c, s, &sh, scratch_size);
    else
        *scratch_size = dnnl_util_align(sizeof(float) * (size_t)(sh.rb * sh.T > 0 ? sh.rb * sh.T : 1)) *
                        (size_t)attn_threads(c);
    if (rc) {
        sa_release(s);
        return rc;
    }
    *state = s;
    return 0;
}

static int sa_run_small(struct op_call *c, const struct sa_state *s, const struct sa_shape *sh) {
    float *scores = c->scratch;
    void *a1[4] = {c->in[0]->data, c->in[1]->data, scores, NULL};
    void *a2[4] = {scores, c->in[2]->data, c->out[0]->data, NULL};
    int rc = dnnl_prim_exec(c, s->mm1->prim, a1, (char *)c->scratch + s->off1);
    if (rc) return rc;
    int64_t rows = sh->nbatch * sh->S, T = sh->T;
    if (s->smax) {
        void *p[2] = {scores, scores};
        if ((rc = dnnl_prim_exec(c, s->smax, p, (char *)c->scratch + s->off3))) return rc;
    } else {
#pragma omp parallel for num_threads(attn_threads(c)) if (rows * T >= 65536)
        for (int64_t r = 0; r < rows; r++) attn_softmax_row(scores + r * T, T, 0, 0.0f);
    }
    return dnnl_prim_exec(c, s->mm2->prim, a2, (char *)c->scratch + s->off2);
}

static int sa_run(struct op_call *c) {
    struct sa_shape sh;
    int rc = sa_shape(c, &sh);
    if (rc) return rc;
    const float *a = c->in[0]->data, *b = c->in[1]->data, *v = c->in[2]->data;
    float *y = c->out[0]->data;
    float scale = node_attr_float(c->node, "scale", 1.0f);
    int64_t S = sh.S, T = sh.T, D = sh.D, Dv = sh.Dv, rb = sh.rb;
    if (sh.nbatch == 0 || S == 0 || Dv == 0) return 0;
    if (T == 0) { /* the softmax of no scores */
        for (int64_t i = 0, n = tensor_numel(c->out[0]); i < n; i++) y[i] = NAN;
        return 0;
    }
    const struct sa_state *st = c->state;
    if (st->small) return sa_run_small(c, st, &sh);
    int64_t nblk = (S + rb - 1) / rb, n = sh.nbatch * nblk;
    size_t per = dnnl_util_align(sizeof(float) * (size_t)(rb * T));
    int nt = attn_threads(c), failed = 0;
    if (n < nt) nt = (int)n;
    dnnl_util_set_threads(c->nthreads);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) reduction(| : failed)
    for (int64_t w = 0; w < n; w++) {
        int64_t bi = w / nblk, r0 = (w % nblk) * rb, rows = S - r0 < rb ? S - r0 : rb;
        int64_t oa = 0, ob = 0, ov = 0, rest = bi;
        for (int i = sh.nd - 1; i >= 0; i--) {
            int64_t k = rest % sh.lead[i];
            rest /= sh.lead[i];
            oa += k * sh.sa[i], ob += k * sh.sb[i], ov += k * sh.sv[i];
        }
        float *buf = (float *)(void *)((char *)c->scratch + per * (size_t)omp_get_thread_num());
        const float *ap = a + oa + r0 * D;
        float *yp = y + bi * S * Dv + r0 * Dv;
        if (dnnl_sgemm('N', 'N', rows, T, D, scale, ap, D, b + ob, T, 0.0f, buf, T) != dnnl_success) {
            failed = 1;
            continue;
        }
        for (int64_t r = 0; r < rows; r++) attn_softmax_row(buf + r * T, T, 0, 0.0f);
        failed |= dnnl_sgemm('N', 'N', rows, Dv, T, 1.0f, buf, T, v + ov, Dv, 0.0f, yp, Dv) != dnnl_success;
    }
    if (failed) return op_error(c, "oneDNN's sgemm failed");
    return 0;
}

const struct op_def op_defs_attention[] = {
    {"Attention", "", onnx_attn_infer, onnx_attn_prepare, onnx_attn_run, op_params_free, 0},
    {"RotaryEmbedding", "", rope_infer, rope_prepare, rope_run, op_params_free, 0},
    {"Attention", "com.microsoft", msa_infer, msa_prepare, ms_attn_run, op_params_free, 0},
    {"MultiHeadAttention", "com.microsoft", mha_infer, mha_prepare, ms_attn_run, op_params_free, 0},
    {"GroupQueryAttention", "com.microsoft", gqa_infer, gqa_prepare, gqa_run, op_params_free, 0},
    {"RotaryEmbedding", "com.microsoft", rope_ms_infer, rope_ms_prepare, rope_run, op_params_free, 0},
    {"SoftmaxAttention", "kiln", sa_infer, sa_prepare, sa_run, sa_release, 0},
    {NULL, NULL, NULL, NULL, NULL, NULL, 0},
};
