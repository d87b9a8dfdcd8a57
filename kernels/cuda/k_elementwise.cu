/* k_elementwise.cu - unary and binary elementwise ops with numpy
 * broadcasting, Where, bias + activation epilogues, inference BatchNorm. */
#include "kernels/cuda/kcommon.cuh"

int kc_bcast_init(struct kc_bcast *bc, int out_ndim, const int64_t *out_dims, int nin, const int *in_ndim,
                  const int64_t *const *in_dims) {
    if (out_ndim < 0 || out_ndim > KC_MAX_DIMS || nin < 1 || nin > 3) return -1;
    memset(bc, 0, sizeof *bc);
    bc->ndim = out_ndim;
    bc->nin = nin;
    bc->n = 1;
    for (int d = 0; d < out_ndim; d++) {
        bc->dims[d] = out_dims[d];
        bc->n *= out_dims[d];
    }
    for (int k = 0; k < nin; k++) {
        int nd = in_ndim[k];
        if (nd > out_ndim) return -1;
        int64_t st = 1;
        bc->same[k] = nd == out_ndim;
        for (int d = out_ndim - 1; d >= 0; d--) {
            int id = d - (out_ndim - nd);
            int64_t dim = id >= 0 ? in_dims[k][id] : 1;
            if (dim != out_dims[d] && dim != 1) return -1;
            if (dim != out_dims[d]) bc->same[k] = 0;
            bc->stride[k][d] = dim == 1 ? 0 : st;
            st *= dim;
        }
    }
    return 0;
}

/* Offset of output element i in input k. */
__device__ __forceinline__ int64_t kc_bcast_off(const kc_bcast &bc, int k, int64_t i) {
    if (bc.same[k]) return i;
    int64_t off = 0;
    for (int d = bc.ndim - 1; d >= 0; d--) {
        int64_t dim = bc.dims[d];
        int64_t c = i % dim;
        i /= dim;
        off += c * bc.stride[k][d];
    }
    return off;
}

/* ---- unary ------------------------------------------------------------- */

__device__ __forceinline__ float kc_unary_f(int op, float x, float a, float b) {
    switch (op) {
    case KU_IDENTITY: return x;
    case KU_NEG: return -x;
    case KU_ABS: return fabsf(x);
    case KU_EXP: return expf(x);
    case KU_LOG: return logf(x);
    case KU_SQRT: return sqrtf(x);
    case KU_RECIPROCAL: return 1.0f / x;
    case KU_FLOOR: return floorf(x);
    case KU_CEIL: return ceilf(x);
    case KU_ROUND: return rintf(x); /* ONNX Round: half to even */
    case KU_ERF: return erff(x);
    case KU_SIN: return sinf(x);
    case KU_COS: return cosf(x);
    case KU_TAN: return tanf(x);
    case KU_ASIN: return asinf(x);
    case KU_ACOS: return acosf(x);
    case KU_ATAN: return atanf(x);
    case KU_SINH: return sinhf(x);
    case KU_COSH: return coshf(x);
    case KU_ASINH: return asinhf(x);
    case KU_ACOSH: return acoshf(x);
    case KU_ATANH: return atanhf(x);
    case KU_SIGN: return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
    case KU_SOFTPLUS: return x > 20.0f ? x : log1pf(expf(x));
    case KU_SOFTSIGN: return x / (1.0f + fabsf(x));
    case KU_ELU: return x >= 0.0f ? x : a * (expf(x) - 1.0f);
    case KU_SELU: return x > 0.0f ? b * x : b * (a * expf(x) - a);
    case KU_CELU: return fmaxf(0.0f, x) + fminf(0.0f, a * (expf(x / a) - 1.0f));
    case KU_MISH: return x * tanhf(x > 20.0f ? x : log1pf(expf(x)));
    case KU_THRESHOLDED_RELU: return x > a ? x : 0.0f;
    case KU_SCALE: return x * a;
    case KU_ISNAN: return isnan(x) ? 1.0f : 0.0f;
    case KU_ISINF: return isinf(x) ? 1.0f : 0.0f;
    }
    if (op >= KU_ACT_BASE) return kc_act_apply(op - KU_ACT_BASE, x, a, b);
    return x;
}

template <class T>
__global__ void k_unary(int op, const T *x, T *y, int64_t n, float a, float b, kc_act act) {
    KC_GRID_STRIDE(i, n) {
        float v = kc_unary_f(op, kc_ld(x + i), a, b);
        kc_st(y + i, kc_act_apply(act.kind, v, act.a, act.b));
    }
}

template <class T>
__global__ void k_unary_int(int op, const T *x, T *y, int64_t n) {
    KC_GRID_STRIDE(i, n) {
        int64_t v = (int64_t)x[i]; /* int64: no pointless sign tests on unsigned types */
        switch (op) {
        case KU_NEG: v = -v; break;
        case KU_ABS: v = v < 0 ? -v : v; break;
        case KU_SIGN: v = v > 0 ? 1 : (v < 0 ? -1 : 0); break;
        case KU_NOT: v = !v; break;
        default: break;
        }
        y[i] = (T)v;
    }
}

/* IsNaN / IsInf write bool. */
template <class T>
__global__ void k_unary_pred(int op, const T *x, uint8_t *y, int64_t n) {
    KC_GRID_STRIDE(i, n) y[i] = kc_unary_f(op, kc_ld(x + i), 0.0f, 0.0f) != 0.0f;
}

cudaError_t kc_unary(int op, enum dtype dt, const void *x, void *y, int64_t n, float a, float b, struct kc_act act,
                     cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    unsigned g = kc_blocks(n, KC_THREADS);
    int pred = op == KU_ISNAN || op == KU_ISINF;
    if (dt == DT_FP32 && pred) {
        auto k = k_unary_pred<float>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, op, (const float *)x, (uint8_t *)y, n);
    } else if (dt == DT_FP16 && pred) {
        auto k = k_unary_pred<kc_half>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, op, (const kc_half *)x, (uint8_t *)y, n);
    } else if (dt == DT_FP32) {
        auto k = k_unary<float>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, op, (const float *)x, (float *)y, n, a, b, act);
    } else if (dt == DT_FP16) {
        auto k = k_unary<kc_half>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, op, (const kc_half *)x, (kc_half *)y, n, a, b, act);
    } else if (dt == DT_INT64) {
        auto k = k_unary_int<int64_t>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, op, (const int64_t *)x, (int64_t *)y, n);
    } else if (dt == DT_INT32) {
        auto k = k_unary_int<int32_t>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, op, (const int32_t *)x, (int32_t *)y, n);
    } else if (dt == DT_BOOL || dt == DT_UINT8) {
        auto k = k_unary_int<uint8_t>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, op, (const uint8_t *)x, (uint8_t *)y, n);
    } else {
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ---- binary ------------------------------------------------------------ */

__device__ __forceinline__ float kc_binary_f(int op, float a, float b) {
    switch (op) {
    case KB_ADD: return a + b;
    case KB_SUB: return a - b;
    case KB_MUL: return a * b;
    case KB_DIV: return a / b;
    case KB_POW: return powf(a, b);
    case KB_MAX: return (isnan(a) || isnan(b)) ? NAN : fmaxf(a, b);
    case KB_MIN: return (isnan(a) || isnan(b)) ? NAN : fminf(a, b);
    case KB_FMOD: return fmodf(a, b);
    case KB_MOD: { float r = fmodf(a, b); return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r; }
    case KB_PRELU: return a < 0.0f ? a * b : a;
    }
    return 0.0f;
}

__device__ __forceinline__ int64_t kc_binary_i(int op, int64_t a, int64_t b) {
    switch (op) {
    case KB_ADD: return a + b;
    case KB_SUB: return a - b;
    case KB_MUL: return a * b;
    case KB_DIV: return b == 0 ? 0 : a / b; /* truncation, like C and onnxruntime */
    case KB_POW: {
        if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
        int64_t r = 1;
        for (int64_t e = b, x = a; e; e >>= 1, x *= x)
            if (e & 1) r *= x;
        return r;
    }
    case KB_MAX: return a > b ? a : b;
    case KB_MIN: return a < b ? a : b;
    case KB_FMOD: return b == 0 ? 0 : a % b;
    case KB_MOD: { if (b == 0) return 0; int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
    case KB_PRELU: return a < 0 ? a * b : a;
    case KB_BITSHIFT_LEFT: return (int64_t)((uint64_t)a << (b & 63));
    case KB_BITSHIFT_RIGHT: return (int64_t)((uint64_t)a >> (b & 63));
    }
    return 0;
}

template <class T>
__device__ __forceinline__ uint8_t kc_compare(int op, T a, T b) {
    switch (op) {
    case KB_EQUAL: return a == b;
    case KB_LESS: return a < b;
    case KB_GREATER: return a > b;
    case KB_LESS_EQUAL: return a <= b;
    case KB_GREATER_EQUAL: return a >= b;
    case KB_AND: return (a != 0) && (b != 0);
    case KB_OR: return (a != 0) || (b != 0);
    case KB_XOR: return (a != 0) != (b != 0);
    }
    return 0;
}

template <class T>
__global__ void k_binary_f(int op, const T *a, const T *b, T *y, kc_bcast bc, kc_act act) {
    KC_GRID_STRIDE(i, bc.n) {
        float v = kc_binary_f(op, kc_ld(a + kc_bcast_off(bc, 0, i)), kc_ld(b + kc_bcast_off(bc, 1, i)));
        kc_st(y + i, kc_act_apply(act.kind, v, act.a, act.b));
    }
}

template <class T>
__global__ void k_binary_i(int op, const T *a, const T *b, T *y, kc_bcast bc) {
    KC_GRID_STRIDE(i, bc.n) y[i] = (T)kc_binary_i(op, (int64_t)a[kc_bcast_off(bc, 0, i)], (int64_t)b[kc_bcast_off(bc, 1, i)]);
}

template <class T>
__global__ void k_compare(int op, const T *a, const T *b, uint8_t *y, kc_bcast bc) {
    KC_GRID_STRIDE(i, bc.n) y[i] = kc_compare<T>(op, a[kc_bcast_off(bc, 0, i)], b[kc_bcast_off(bc, 1, i)]);
}

__global__ void k_compare_h(int op, const kc_half *a, const kc_half *b, uint8_t *y, kc_bcast bc) {
    KC_GRID_STRIDE(i, bc.n) y[i] = kc_compare<float>(op, kc_ld(a + kc_bcast_off(bc, 0, i)), kc_ld(b + kc_bcast_off(bc, 1, i)));
}

template <class T>
static cudaError_t launch_compare(int op, const void *a, const void *b, void *y, const kc_bcast *bc, cudaStream_t s) {
    auto k = k_compare<T>;
    KC_LAUNCH(k, kc_blocks(bc->n, KC_THREADS), KC_THREADS, 0, s, op, (const T *)a, (const T *)b, (uint8_t *)y, *bc);
    return cudaGetLastError();
}

template <class T>
static cudaError_t launch_binary_i(int op, const void *a, const void *b, void *y, const kc_bcast *bc, cudaStream_t s) {
    auto k = k_binary_i<T>;
    KC_LAUNCH(k, kc_blocks(bc->n, KC_THREADS), KC_THREADS, 0, s, op, (const T *)a, (const T *)b, (T *)y, *bc);
    return cudaGetLastError();
}

cudaError_t kc_binary(int op, enum dtype dt, const void *a, const void *b, void *y, const struct kc_bcast *bc,
                      struct kc_act act, cudaStream_t s) {
    if (bc->n <= 0) return cudaSuccess;
    unsigned g = kc_blocks(bc->n, KC_THREADS);
    if (op >= KB_EQUAL && op <= KB_XOR) {
        switch (dt) {
        case DT_FP32: return launch_compare<float>(op, a, b, y, bc, s);
        case DT_FP64: return launch_compare<double>(op, a, b, y, bc, s);
        case DT_INT64: return launch_compare<int64_t>(op, a, b, y, bc, s);
        case DT_INT32: return launch_compare<int32_t>(op, a, b, y, bc, s);
        case DT_INT8: return launch_compare<int8_t>(op, a, b, y, bc, s);
        case DT_BOOL:
        case DT_UINT8: return launch_compare<uint8_t>(op, a, b, y, bc, s);
        case DT_FP16:
            KC_LAUNCH(k_compare_h, g, KC_THREADS, 0, s, op, (const kc_half *)a, (const kc_half *)b, (uint8_t *)y, *bc);
            return cudaGetLastError();
        default: return cudaErrorInvalidValue;
        }
    }
    switch (dt) {
    case DT_FP32: {
        auto k = k_binary_f<float>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, op, (const float *)a, (const float *)b, (float *)y, *bc, act);
        return cudaGetLastError();
    }
    case DT_FP16: {
        auto k = k_binary_f<kc_half>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, op, (const kc_half *)a, (const kc_half *)b, (kc_half *)y, *bc, act);
        return cudaGetLastError();
    }
    case DT_INT64: return launch_binary_i<int64_t>(op, a, b, y, bc, s);
    case DT_INT32: return launch_binary_i<int32_t>(op, a, b, y, bc, s);
    case DT_UINT8: return launch_binary_i<uint8_t>(op, a, b, y, bc, s);
    default: return cudaErrorInvalidValue;
    }
}

/* ---- Where --------------------------------------------------------------- */

template <class T>
__global__ void k_where(const uint8_t *c, const T *x, const T *yv, T *out, kc_bcast bc) {
    KC_GRID_STRIDE(i, bc.n) out[i] = c[kc_bcast_off(bc, 0, i)] ? x[kc_bcast_off(bc, 1, i)] : yv[kc_bcast_off(bc, 2, i)];
}

template <class T>
static cudaError_t launch_where(const void *c, const void *x, const void *yv, void *out, const kc_bcast *bc,
                                cudaStream_t s) {
    auto k = k_where<T>;
    KC_LAUNCH(k, kc_blocks(bc->n, KC_THREADS), KC_THREADS, 0, s, (const uint8_t *)c, (const T *)x, (const T *)yv,
              (T *)out, *bc);
    return cudaGetLastError();
}

cudaError_t kc_where(size_t elem, const void *cond, const void *x, const void *yv, void *out, const struct kc_bcast *bc,
                     cudaStream_t s) {
    if (bc->n <= 0) return cudaSuccess;
    switch (elem) {
    case 1: return launch_where<uint8_t>(cond, x, yv, out, bc, s);
    case 2: return launch_where<uint16_t>(cond, x, yv, out, bc, s);
    case 4: return launch_where<uint32_t>(cond, x, yv, out, bc, s);
    case 8: return launch_where<uint64_t>(cond, x, yv, out, bc, s);
    }
    return cudaErrorInvalidValue;
}

/* ---- bias + activation, BatchNormalization ------------------------------- */

template <class T>
__global__ void k_bias_act(T *y, const T *bias, int64_t n, int64_t channels, int64_t inner, kc_act act) {
    KC_GRID_STRIDE(i, n) {
        float v = kc_ld(y + i);
        if (bias) v += kc_ld(bias + (i / inner) % channels);
        kc_st(y + i, kc_act_apply(act.kind, v, act.a, act.b));
    }
}

cudaError_t kc_bias_act(enum dtype dt, void *y, const void *bias, int64_t n, int64_t channels, int64_t inner,
                        struct kc_act act, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (channels < 1 || inner < 1) return cudaErrorInvalidValue;
    unsigned g = kc_blocks(n, KC_THREADS);
    if (dt == DT_FP32) {
        auto k = k_bias_act<float>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (float *)y, (const float *)bias, n, channels, inner, act);
    } else if (dt == DT_FP16) {
        auto k = k_bias_act<kc_half>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (kc_half *)y, (const kc_half *)bias, n, channels, inner, act);
    } else {
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

template <class T, class P>
__global__ void k_batchnorm(const T *x, const P *scale, const P *bias, const P *mean, const P *var, T *y, int64_t total,
                            int64_t c, int64_t inner, float eps, kc_act act) {
    KC_GRID_STRIDE(i, total) {
        int64_t ch = (i / inner) % c;
        float v = (kc_ld(x + i) - kc_ld(mean + ch)) * (kc_ld(scale + ch) / sqrtf(kc_ld(var + ch) + eps)) + kc_ld(bias + ch);
        kc_st(y + i, kc_act_apply(act.kind, v, act.a, act.b));
    }
}

template <class T, class P>
static cudaError_t launch_batchnorm(const void *x, const void *scale, const void *bias, const void *mean, const void *var,
                                    void *y, int64_t total, int64_t c, int64_t inner, float eps, kc_act act,
                                    cudaStream_t s) {
    auto k = k_batchnorm<T, P>;
    KC_LAUNCH(k, kc_blocks(total, KC_THREADS), KC_THREADS, 0, s, (const T *)x, (const P *)scale, (const P *)bias,
              (const P *)mean, (const P *)var, (T *)y, total, c, inner, eps, act);
    return cudaGetLastError();
}

cudaError_t kc_batchnorm(enum dtype dt, enum dtype param_dt, const void *x, const void *scale, const void *bias,
                         const void *mean, const void *var, void *y, int64_t n, int64_t c, int64_t inner, float eps,
                         struct kc_act act, cudaStream_t s) {
    int64_t total = n * c * inner;
    if (total <= 0) return cudaSuccess;
    if (dt == DT_FP32 && param_dt == DT_FP32) return launch_batchnorm<float, float>(x, scale, bias, mean, var, y, total, c, inner, eps, act, s);
    if (dt == DT_FP16 && param_dt == DT_FP32) return launch_batchnorm<kc_half, float>(x, scale, bias, mean, var, y, total, c, inner, eps, act, s);
    if (dt == DT_FP16 && param_dt == DT_FP16) return launch_batchnorm<kc_half, kc_half>(x, scale, bias, mean, var, y, total, c, inner, eps, act, s);
    return cudaErrorInvalidValue;
}
