/* ops_elementwise.c - elementwise arithmetic, activations, comparisons and
 * logic, Cast, the softmax family, the normalizations over trailing axes and
 * the (de)quantization operators.
 *
 * Every elementwise kernel runs through one broadcast driver (ew_drive, over
 * the walk of elementwise_util.h) and is a typed inner loop over a run of
 * elements in which each input advances by 1 or 0. Kernels come in tables
 * indexed by dtype; FP16 and BF16 tensors reuse the float kernels through a
 * converter that widens a chunk at a time on the stack, so every float
 * operator serves the half types without a third copy of each loop.
 *
 * Integer arithmetic wraps (two's complement, as numpy and onnxruntime do)
 * instead of invoking C's undefined behaviour on overflow, and integer
 * division or modulo by zero yields 0 rather than trapping: a bad input must
 * never bring the server down. */

/* Kernels here never read the floating-point exception flags; without this
 * GCC refuses to if-convert the selects of the branch-free exp/tanh and the
 * clamps, and those loops stay scalar. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno")
#endif
/* `omp simd` is a request: loops whose body calls libm stay scalar, which
 * clang would otherwise report as an error under -Werror. */
#ifdef __clang__
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/par_util.h"
#include "kernels/cpu/elementwise_util.h"
#include "kernels/cpu/sigmoid_vec.h"
#include "kernels/cpu/layout_util.h"
#include "kernels/cpu/matmul_util.h"
#include "kernels/cpu/params_util.h"
#include "kernels/ops.h"

/* ------------------------------------------------------------------------
 * The driver
 * ------------------------------------------------------------------------ */

struct ew_args;
typedef void (*ew_fn)(const void *const *in, const int64_t *s, void *out, int64_t n, const struct ew_args *a);

struct ew_args {
    float alpha, beta, gamma;
    int nin;
    unsigned char lo[8], hi[8]; /* Clip bounds, in the input's dtype */
    enum dtype in_dt[EW_MAX_IN], out_dt;
    ew_fn inner;                /* the float kernel behind the half converter */
    enum act_kind act;          /* fused activation on a float output, applied per run while in cache */
    float act_a, act_b;
};

static const struct tensor *in_opt(const struct op_call *c, int i) { return i < c->nin ? c->in[i] : NULL; }
static struct tensor *out_opt(const struct op_call *c, int i) { return i < c->nout ? c->out[i] : NULL; }

#define HALF_CHUNK 256

static void half_load(const void *p, enum dtype dt, float *dst, int64_t n) {
    const uint16_t *h = p;
    if (dt == DT_FP16)
        for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_fp32(h[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32(h[i]);
}

static void half_store(const float *src, enum dtype dt, void *p, int64_t n) {
    uint16_t *h = p;
    if (dt == DT_FP16)
        for (int64_t i = 0; i < n; i++) h[i] = fp32_to_fp16(src[i]);
    else
        for (int64_t i = 0; i < n; i++) h[i] = fp32_to_bf16(src[i]);
}

/* Runs the float kernel a->inner over half-precision operands, widening a
 * chunk of each half input (and narrowing the output) at a time. */
static void ew_half_adapter(const void *const *in, const int64_t *s, void *out, int64_t n, const struct ew_args *a) {
    float buf[EW_MAX_IN][HALF_CHUNK], obuf[HALF_CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += HALF_CHUNK) {
        int64_t m = n - i0 < HALF_CHUNK ? n - i0 : HALF_CHUNK;
        const void *p[EW_MAX_IN];
        for (int k = 0; k < a->nin; k++) {
            size_t es = dtype_size(a->in_dt[k]);
            const char *src = (const char *)in[k] + (s[k] ? (size_t)i0 * es : 0);
            if (ew_is_half(a->in_dt[k])) {
                half_load(src, a->in_dt[k], buf[k], s[k] ? m : 1);
                p[k] = buf[k];
            } else {
                p[k] = src;
            }
        }
        if (ew_is_half(a->out_dt)) {
            a->inner(p, s, obuf, m, a);
            half_store(obuf, a->out_dt, (uint16_t *)out + i0, m);
        } else {
            a->inner(p, s, (char *)out + (size_t)i0 * dtype_size(a->out_dt), m, a);
        }
    }
}

/* Picks the kernel for dtype dt from tbl, falling back on the float kernel
 * behind the half converter; NULL if the dtype is not served. */
static ew_fn ew_pick(const ew_fn *tbl, enum dtype dt, struct ew_args *a) {
    if (dt <= DT_UNDEFINED || dt >= DT_MAX_) return NULL;
    if (tbl[dt]) return tbl[dt];
    if (ew_is_half(dt) && tbl[DT_FP32]) {
        if (a) a->inner = tbl[DT_FP32];
        return ew_half_adapter;
    }
    return NULL;
}

/* A fused activation over n floats in place: one loop per kind, on the
 * branch-free exp, tanh and erf above, so that each vectorizes (libm's
 * expf, tanhf and erff are opaque calls, 5-15x slower per value). */
static inline __attribute__((always_inline)) void act_f32_body(float *x, int64_t n, enum act_kind act, float a, float b) {
    switch (act) {
    case ACT_NONE: return;
    case ACT_RELU: _Pragma("omp simd") for (int64_t i = 0; i < n; i++) x[i] = x[i] > 0 ? x[i] : 0; return;
    case ACT_LEAKY_RELU:
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) x[i] = x[i] >= 0 ? x[i] : a * x[i];
        return;
    case ACT_CLIP:
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) x[i] = x[i] < a ? a : (x[i] > b ? b : x[i]);
        return;
    case ACT_SIGMOID: _Pragma("omp simd") for (int64_t i = 0; i < n; i++) x[i] = ew_sigmoid_f(x[i]); return;
    case ACT_SILU: _Pragma("omp simd") for (int64_t i = 0; i < n; i++) x[i] = x[i] * ew_sigmoid_f(x[i]); return;
    case ACT_QDQ: /* QuantizeLinear's quotient, then DequantizeLinear's product: the unfused pair's bits */
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) x[i] = act_apply(ACT_QDQ, x[i], a, b);
        return;
    case ACT_TANH: _Pragma("omp simd") for (int64_t i = 0; i < n; i++) x[i] = ew_tanh_f(x[i]); return;
    case ACT_GELU:
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) x[i] =
            0.5f * x[i] * (1.0f + ew_erf_f(x[i] * 0.70710678118654752f));
        return;
    case ACT_HARD_SIGMOID:
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {
            float y = a * x[i] + b;
            x[i] = y < 0 ? 0 : (y > 1 ? 1 : y);
        }
        return;
    case ACT_HARD_SWISH:
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {
            float y = x[i] / 6.0f + 0.5f;
            x[i] = x[i] * (y < 0 ? 0 : (y > 1 ? 1 : y));
        }
        return;
    }
}

typedef void (*act_f32_fn)(float *x, int64_t n, enum act_kind act, float a, float b);
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("arch=x86-64-v4"))) static void act_f32_v4(float *x, int64_t n, enum act_kind act, float a,
                                                                 float b) {
    act_f32_body(x, n, act, a, b);
}
__attribute__((target("arch=x86-64-v3"))) static void act_f32_v3(float *x, int64_t n, enum act_kind act, float a,
                                                                 float b) {
    act_f32_body(x, n, act, a, b);
}
#endif
static void act_f32_v2(float *x, int64_t n, enum act_kind act, float a, float b) { act_f32_body(x, n, act, a, b); }

void ew_act_f32(float *x, int64_t n, enum act_kind act, float a, float b) {
    if ((act == ACT_SIGMOID && sigmoid_vec(SIGV_SIGMOID, 1.0f, x, NULL, x, n)) ||
        (act == ACT_SILU && sigmoid_vec(SIGV_SWISH, 1.0f, x, NULL, x, n)) ||
        (act == ACT_GELU && sigmoid_vec(SIGV_GELU_ERF, 1.0f, x, NULL, x, n)))
        return;
#if defined(__x86_64__) && defined(__GNUC__)
    int level = dnnl_util_isa_level();
    act_f32_fn fn = level >= 4 ? act_f32_v4 : level == 3 ? act_f32_v3 : act_f32_v2;
#else
    act_f32_fn fn = act_f32_v2;
#endif
    fn(x, n, act, a, b);
}

static void ew_act(float *o, int64_t n, enum act_kind act, float aa, float ab) { ew_act_f32(o, n, act, aa, ab); }

static void ew_item(const struct ew_bcast *b, ew_fn fn, const struct ew_args *a, const void *const *base,
                    const size_t *esz, char *out, size_t oesz, int64_t row, int64_t i0, int64_t n) {
    int64_t off[EW_MAX_IN];
    const void *p[EW_MAX_IN];
    ew_bcast_row(b, row, off);
    for (int k = 0; k < b->nin; k++) p[k] = (const char *)base[k] + (size_t)(off[k] + i0 * b->istr[k]) * esz[k];
    char *o = out + (size_t)(row * b->inner + i0) * oesz;
    fn(p, b->istr, o, n, a);
    if (a->act != ACT_NONE) ew_act((float *)o, n, a->act, a->act_a, a->act_b);
}

/* Computes out from the nin inputs with kernel fn over the broadcast walk,
 * threaded when the output is large. */
static void ew_drive(const struct op_call *c, ew_fn fn, struct ew_args *a, const struct tensor *const *in, int nin,
                     struct tensor *out) {
    struct ew_bcast b;
    const void *base[EW_MAX_IN];
    size_t esz[EW_MAX_IN];
    a->nin = nin;
    for (int k = 0; k < nin; k++) {
        base[k] = in[k]->data;
        esz[k] = dtype_size(in[k]->dtype);
        a->in_dt[k] = in[k]->dtype;
    }
    a->out_dt = out->dtype;
    size_t oesz = dtype_size(out->dtype);
    int64_t total = tensor_numel(out);
    if (total <= 0) return;
    ew_bcast_init(&b, out, in, nin);
    int nt = c->nthreads;
    if (total < EW_PAR_MIN || nt <= 1) {
        for (int64_t r = 0; r < b.outer; r++) ew_item(&b, fn, a, base, esz, out->data, oesz, r, 0, b.inner);
        return;
    }
    int64_t pieces = 1, chunk = b.inner;
    if (b.inner > EW_PIECE) {
        pieces = (b.inner + EW_PIECE - 1) / EW_PIECE;
        chunk = (b.inner + pieces - 1) / pieces;
    }
    int64_t items = b.outer * pieces;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t it = 0; it < items; it++) {
        int64_t row = it / pieces, i0 = (it % pieces) * chunk;
        int64_t n = b.inner - i0 < chunk ? b.inner - i0 : chunk;
        ew_item(&b, fn, a, base, esz, out->data, oesz, row, i0, n);
    }
}

/* ------------------------------------------------------------------------
 * Kernel generators
 * ------------------------------------------------------------------------ */

#define DTOF_f32 DT_FP32
#define DTOF_f64 DT_FP64
#define DTOF_i8 DT_INT8
#define DTOF_i16 DT_INT16
#define DTOF_i32 DT_INT32
#define DTOF_i64 DT_INT64
#define DTOF_u8 DT_UINT8
#define DTOF_u16 DT_UINT16
#define DTOF_u32 DT_UINT32
#define DTOF_u64 DT_UINT64
#define DTOF_b DT_BOOL
#define DTOF_f16 DT_FP16
#define DTOF_bf16 DT_BF16

#define LIST_FLT(X, OP) X(OP, f32, float) X(OP, f64, double)
#define LIST_SINT(X, OP) X(OP, i8, int8_t) X(OP, i16, int16_t) X(OP, i32, int32_t) X(OP, i64, int64_t)
#define LIST_UINT(X, OP) X(OP, u8, uint8_t) X(OP, u16, uint16_t) X(OP, u32, uint32_t) X(OP, u64, uint64_t)
#define LIST_INT(X, OP) LIST_SINT(X, OP) LIST_UINT(X, OP)

#define ENT(OP, suf, T) [DTOF_##suf] = k_##OP##_##suf,

/* A binary kernel: the four stride cases are separate loops so that each
 * compiles to a straight vectorizable loop. EXPR reads x and y. */
#define BIN_KERNEL(NAME, TA, TB, TO, EXPR)                                                                          \
    static void NAME(const void *const *in, const int64_t *s, void *out, int64_t n, const struct ew_args *a) {      \
        const TA *pa = in[0];                                                                                       \
        const TB *pb = in[1];                                                                                       \
        TO *o = out;                                                                                                \
        (void)a;                                                                                                    \
        if (s[0] && s[1]) {                                                                                         \
            _Pragma("omp simd")                                                                                     \
            for (int64_t i = 0; i < n; i++) {                                                                       \
                TA x = pa[i];                                                                                       \
                TB y = pb[i];                                                                                       \
                o[i] = (TO)(EXPR);                                                                                  \
            }                                                                                                       \
        } else if (s[0]) {                                                                                          \
            TB y = pb[0];                                                                                           \
            _Pragma("omp simd")                                                                                     \
            for (int64_t i = 0; i < n; i++) {                                                                       \
                TA x = pa[i];                                                                                       \
                o[i] = (TO)(EXPR);                                                                                  \
            }                                                                                                       \
        } else if (s[1]) {                                                                                          \
            TA x = pa[0];                                                                                           \
            _Pragma("omp simd")                                                                                     \
            for (int64_t i = 0; i < n; i++) {                                                                       \
                TB y = pb[i];                                                                                       \
                o[i] = (TO)(EXPR);                                                                                  \
            }                                                                                                       \
        } else {                                                                                                    \
            TA x = pa[0];                                                                                           \
            TB y = pb[0];                                                                                           \
            TO v = (TO)(EXPR);                                                                                      \
            _Pragma("omp simd")                                                                                     \
            for (int64_t i = 0; i < n; i++) o[i] = v;                                                               \
        }                                                                                                           \
    }

#define DEF_BIN(OP, suf, T) BIN_KERNEL(k_##OP##_##suf, T, T, T, OP(T, x, y))
/* The float arithmetic built per ISA as the unary kernels below are: rows
 * of L1- and L2-resident activations (a residual Add, a squeeze-excitation
 * Mul over channels-last rows) run 2-4 times the baseline's 4 lanes. One
 * operation per element, so the results do not depend on the width. */
#if defined(__x86_64__) && defined(__GNUC__)
#define BIN_KERNEL_ISA(NAME, T, EXPR)                                                                              \
    BIN_KERNEL(NAME##_v2, T, T, T, EXPR)                                                                            \
    __attribute__((target("arch=x86-64-v4"))) BIN_KERNEL(NAME##_v4, T, T, T, EXPR)                                  \
    __attribute__((target("arch=x86-64-v3"))) BIN_KERNEL(NAME##_v3, T, T, T, EXPR)                                  \
    static void NAME(const void *const *in, const int64_t *s, void *out, int64_t n, const struct ew_args *a) {      \
        int l = dnnl_util_isa_level();                                                                              \
        (l >= 4 ? NAME##_v4 : l == 3 ? NAME##_v3 : NAME##_v2)(in, s, out, n, a);                                    \
    }
#define DEF_BIN_ISA(OP, suf, T) BIN_KERNEL_ISA(k_##OP##_##suf, T, OP(T, x, y))
#else
#define DEF_BIN_ISA DEF_BIN
#endif
#define DEF_CMP(OP, suf, T) BIN_KERNEL(k_##OP##_##suf, T, T, uint8_t, OP(T, x, y))

/* A unary kernel; EXPR reads x and the attributes A, B, G in the kernel's type. */
#define UN_KERNEL(NAME, T, TO, EXPR)                                                                                \
    static void NAME(const void *const *in, const int64_t *s, void *out, int64_t n, const struct ew_args *a) {      \
        const T *p = in[0];                                                                                         \
        TO *o = out;                                                                                                \
        const T A = (T)a->alpha, B = (T)a->beta, G = (T)a->gamma;                                                   \
        (void)s;                                                                                                    \
        (void)A;                                                                                                    \
        (void)B;                                                                                                    \
        (void)G;                                                                                                    \
        _Pragma("omp simd")                                                                                         \
        for (int64_t i = 0; i < n; i++) {                                                                           \
            T x = p[i];                                                                                             \
            o[i] = (TO)(EXPR);                                                                                      \
        }                                                                                                           \
    }
#define DEF_UN(OP, suf, T) UN_KERNEL(k_##OP##_##suf, T, T, OP(T, x))
/* The same built three times, for AVX-512, AVX2 and the baseline, picked
 * per call by the ISA oneDNN runs (dnnl_util_isa_level: ONEDNN_MAX_CPU_ISA
 * caps both): the transcendental kernels (exp, tanh, sigmoid, erf) are
 * compute-bound and run 2-4x faster per added vector width. The results
 * do not depend on the width: no reductions, and no FMA contraction in
 * ISO C mode. */
#if defined(__x86_64__) && defined(__GNUC__)
#define UN_KERNEL_ISA(NAME, T, TO, EXPR)                                                                            \
    UN_KERNEL(NAME##_v2, T, TO, EXPR)                                                                               \
    __attribute__((target("arch=x86-64-v4"))) UN_KERNEL(NAME##_v4, T, TO, EXPR)                                     \
    __attribute__((target("arch=x86-64-v3"))) UN_KERNEL(NAME##_v3, T, TO, EXPR)                                     \
    static void NAME(const void *const *in, const int64_t *s, void *out, int64_t n, const struct ew_args *a) {      \
        int l = dnnl_util_isa_level();                                                                              \
        (l >= 4 ? NAME##_v4 : l == 3 ? NAME##_v3 : NAME##_v2)(in, s, out, n, a);                                    \
    }
#else
#define UN_KERNEL_ISA UN_KERNEL
#endif
#define DEF_UN_ISA(OP, suf, T) UN_KERNEL_ISA(k_##OP##_##suf, T, T, OP(T, x))
#define DEF_UNB(OP, suf, T) UN_KERNEL(k_##OP##_##suf, T, uint8_t, OP(T, x))

/* ------------------------------------------------------------------------
 * Binary arithmetic
 * ------------------------------------------------------------------------ */

#define ADD_F(T, x, y) ((x) + (y))
#define SUB_F(T, x, y) ((x) - (y))
#define MUL_F(T, x, y) ((x) * (y))
#define DIV_F(T, x, y) ((x) / (y))
/* Wrapping integer arithmetic through uint64 (exact modulo 2^bits for every width). */
#define ADD_I(T, x, y) ((T)((uint64_t)(x) + (uint64_t)(y)))
#define SUB_I(T, x, y) ((T)((uint64_t)(x) - (uint64_t)(y)))
#define MUL_I(T, x, y) ((T)((uint64_t)(x) * (uint64_t)(y)))
#define DIV_S(T, x, y) ((y) == 0 ? (T)0 : (y) == -1 ? (T)(0 - (uint64_t)(x)) : (T)((x) / (y)))
#define DIV_U(T, x, y) ((y) == 0 ? (T)0 : (T)((x) / (y)))
/* Min and Max propagate NaN like numpy's minimum/maximum. */
#define MIN_F(T, x, y) (((x) != (x) || (x) < (y)) ? (x) : (y))
#define MAX_F(T, x, y) (((x) != (x) || (x) > (y)) ? (x) : (y))
#define MIN_I(T, x, y) ((x) < (y) ? (x) : (y))
#define MAX_I(T, x, y) ((x) > (y) ? (x) : (y))
/* Mod: fmod=0 takes the divisor's sign (Python's %), fmod=1 the dividend's (C's). */
static inline double mod_py_d(double x, double y) {
    double r = fmod(x, y);
    return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
}
#define MODPY_F(T, x, y) ((T)mod_py_d((double)(x), (double)(y)))
#define FMOD_F(T, x, y) (fmod((x), (y)))
#define MODPY_S(T, x, y) (mod_py_s64((int64_t)(x), (int64_t)(y)))
#define FMOD_S(T, x, y) ((y) == 0 || (y) == -1 ? (T)0 : (T)((x) % (y)))
#define MOD_U(T, x, y) ((y) == 0 ? (T)0 : (T)((x) % (y)))
static inline int64_t mod_py_s64(int64_t x, int64_t y) {
    if (y == 0 || y == -1) return 0;
    int64_t r = x % y;
    return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
}
#define PRELU_F(T, x, y) ((x) < 0 ? (y) * (x) : (x))
#define PRELU_I(T, x, y) ((x) < 0 ? MUL_I(T, y, x) : (x))
#define POW_F(T, x, y) (pow((x), (y)))
#define BAND(T, x, y) ((x) & (y))
#define BOR(T, x, y) ((x) | (y))
#define BXOR(T, x, y) ((x) ^ (y))
#define SHL(T, x, y) ((uint64_t)(y) >= sizeof(T) * 8 ? (T)0 : (T)((uint64_t)(x) << (y)))
#define SHR(T, x, y) ((uint64_t)(y) >= sizeof(T) * 8 ? (T)0 : (T)((x) >> (y)))
#define LAND(T, x, y) ((x) && (y))
#define LOR(T, x, y) ((x) || (y))
#define LXOR(T, x, y) ((!(x)) != (!(y)))

LIST_FLT(DEF_BIN_ISA, ADD_F) LIST_INT(DEF_BIN, ADD_I)
LIST_FLT(DEF_BIN_ISA, SUB_F) LIST_INT(DEF_BIN, SUB_I)
LIST_FLT(DEF_BIN_ISA, MUL_F) LIST_INT(DEF_BIN, MUL_I)
LIST_FLT(DEF_BIN_ISA, DIV_F) LIST_SINT(DEF_BIN, DIV_S) LIST_UINT(DEF_BIN, DIV_U)
LIST_FLT(DEF_BIN, MIN_F) LIST_INT(DEF_BIN, MIN_I)
LIST_FLT(DEF_BIN, MAX_F) LIST_INT(DEF_BIN, MAX_I)
LIST_FLT(DEF_BIN, MODPY_F) LIST_SINT(DEF_BIN, MODPY_S) LIST_UINT(DEF_BIN, MOD_U)
LIST_FLT(DEF_BIN, FMOD_F) LIST_SINT(DEF_BIN, FMOD_S)
LIST_FLT(DEF_BIN, PRELU_F) LIST_SINT(DEF_BIN, PRELU_I)
LIST_FLT(DEF_BIN, POW_F)
LIST_INT(DEF_BIN, BAND) LIST_INT(DEF_BIN, BOR) LIST_INT(DEF_BIN, BXOR)
LIST_UINT(DEF_BIN, SHL) LIST_UINT(DEF_BIN, SHR)
DEF_BIN(LAND, b, uint8_t) DEF_BIN(LOR, b, uint8_t) DEF_BIN(LXOR, b, uint8_t)

static const ew_fn tbl_add[DT_MAX_] = {LIST_FLT(ENT, ADD_F) LIST_INT(ENT, ADD_I)};
static const ew_fn tbl_sub[DT_MAX_] = {LIST_FLT(ENT, SUB_F) LIST_INT(ENT, SUB_I)};
static const ew_fn tbl_mul[DT_MAX_] = {LIST_FLT(ENT, MUL_F) LIST_INT(ENT, MUL_I)};
static const ew_fn tbl_div[DT_MAX_] = {LIST_FLT(ENT, DIV_F) LIST_SINT(ENT, DIV_S) LIST_UINT(ENT, DIV_U)};
static const ew_fn tbl_min[DT_MAX_] = {LIST_FLT(ENT, MIN_F) LIST_INT(ENT, MIN_I)};
static const ew_fn tbl_max[DT_MAX_] = {LIST_FLT(ENT, MAX_F) LIST_INT(ENT, MAX_I)};
static const ew_fn tbl_modpy[DT_MAX_] = {LIST_FLT(ENT, MODPY_F) LIST_SINT(ENT, MODPY_S) LIST_UINT(ENT, MOD_U)};
static const ew_fn tbl_fmod[DT_MAX_] = {LIST_FLT(ENT, FMOD_F) LIST_SINT(ENT, FMOD_S) LIST_UINT(ENT, MOD_U)};
static const ew_fn tbl_prelu[DT_MAX_] = {LIST_FLT(ENT, PRELU_F) LIST_SINT(ENT, PRELU_I)};
static const ew_fn tbl_pow[DT_MAX_] = {LIST_FLT(ENT, POW_F)};
static const ew_fn tbl_band[DT_MAX_] = {LIST_INT(ENT, BAND)};
static const ew_fn tbl_bor[DT_MAX_] = {LIST_INT(ENT, BOR)};
static const ew_fn tbl_bxor[DT_MAX_] = {LIST_INT(ENT, BXOR)};
static const ew_fn tbl_shl[DT_MAX_] = {LIST_UINT(ENT, SHL)};
static const ew_fn tbl_shr[DT_MAX_] = {LIST_UINT(ENT, SHR)};
static const ew_fn tbl_and[DT_MAX_] = {[DT_BOOL] = k_LAND_b};
static const ew_fn tbl_or[DT_MAX_] = {[DT_BOOL] = k_LOR_b};
static const ew_fn tbl_xor[DT_MAX_] = {[DT_BOOL] = k_LXOR_b};

/* ------------------------------------------------------------------------
 * Comparisons (output bool)
 * ------------------------------------------------------------------------ */

#define CMP_EQ(T, x, y) ((x) == (y))
#define CMP_LT(T, x, y) ((x) < (y))
#define CMP_GT(T, x, y) ((x) > (y))
#define CMP_LE(T, x, y) ((x) <= (y))
#define CMP_GE(T, x, y) ((x) >= (y))
/* Strings are equal when their lengths and bytes are: "admin\0x" is not "admin". */
#define CMP_STR(T, x, y) tensor_str_eq((x), (y))

#define DEF_CMPS(X, OP) LIST_FLT(X, OP) LIST_INT(X, OP)
DEF_CMPS(DEF_CMP, CMP_EQ) DEF_CMPS(DEF_CMP, CMP_LT) DEF_CMPS(DEF_CMP, CMP_GT) DEF_CMPS(DEF_CMP, CMP_LE)
DEF_CMPS(DEF_CMP, CMP_GE)
typedef struct tensor_str ew_str;
BIN_KERNEL(k_CMP_STR, ew_str, ew_str, uint8_t, CMP_STR(T, x, y))

static const ew_fn tbl_eq[DT_MAX_] = {DEF_CMPS(ENT, CMP_EQ)[DT_BOOL] = k_CMP_EQ_u8, [DT_STRING] = k_CMP_STR};
static const ew_fn tbl_lt[DT_MAX_] = {DEF_CMPS(ENT, CMP_LT)};
static const ew_fn tbl_gt[DT_MAX_] = {DEF_CMPS(ENT, CMP_GT)};
static const ew_fn tbl_le[DT_MAX_] = {DEF_CMPS(ENT, CMP_LE)};
static const ew_fn tbl_ge[DT_MAX_] = {DEF_CMPS(ENT, CMP_GE)};

/* ------------------------------------------------------------------------
 * Unary operators
 * ------------------------------------------------------------------------ */

static inline double sigmoid_d(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }
/* float kernels use the vectorizable exp/tanh/sigmoid of elementwise_util.h,
 * double ones libm */
#define EXPT(x) _Generic((x), float: ew_exp_f, default: exp)(x)
#define TANHT(x) _Generic((x), float: ew_tanh_f, default: tanh)(x)
#define ERFT(x) _Generic((x), float: ew_erf_f, default: erf)(x)
#define SIGMOID(x) _Generic((x), float: ew_sigmoid_f, default: sigmoid_d)(x)
/* log(1 + e^x) without overflow for large x */
#define SOFTPLUS(x) ((x) > 0 ? (x) + log1p(EXPT(-(x))) : log1p(EXPT(x)))

#define U_NEG_F(T, x) (-(x))
#define U_NEG_I(T, x) ((T)(0 - (uint64_t)(x)))
#define U_ABS_F(T, x) (fabs(x))
#define U_ABS_S(T, x) ((x) < 0 ? (T)(0 - (uint64_t)(x)) : (x))
#define U_ABS_U(T, x) (x)
#define U_RELU(T, x) ((x) > 0 ? (x) : (T)0)
#define U_SIGN(T, x) ((T)(((x) > 0) - ((x) < 0)))
#define U_SIGN_U(T, x) ((T)((x) > 0))
#define U_SQRT(T, x) (sqrt(x))
#define U_EXP(T, x) (EXPT(x))
#define U_LOG(T, x) (log(x))
#define U_ERF(T, x) (ERFT(x))
#define U_SIGMOID(T, x) (SIGMOID(x))
#define U_TANH(T, x) (TANHT(x))
#define U_LEAKY(T, x) ((x) >= 0 ? (x) : A * (x))
/* clamps as selects (fmax/fmin keep them from vectorizing); NaN gives 0 as fmax would */
#define CLAMP01(v) ((v) > 0 ? ((v) < 1 ? (v) : 1) : 0)
#define U_HSIG(T, x) ((T)CLAMP01(A * (x) + B))
#define U_HSWISH(T, x) ((x) * (T)CLAMP01((x) / (T)6 + (T)0.5))
#define U_GELU(T, x) ((T)0.5 * (x) * ((T)1 + ERFT((x) * (T)0.70710678118654752440)))
/* 0.5 x (1 + tanh(u)) is x sigmoid(2u) = x / (1 + e^-2u): one exponential
 * and one division, where the tanh took an exponential, a polynomial and a
 * division (0.83 -> 0.54 ns a value with AVX-512, 1.21 -> 0.77 with AVX2,
 * an AMD EPYC; GPT-2's MLP); no 1 + tanh(u) cancelling for negative u. */
#define U_GELU_TANH(T, x) ((x) / ((T)1 + EXPT((T)-1.59576912160573071176 * ((x) + (T)0.044715 * (x) * (x) * (x)))))
#define U_SOFTPLUS(T, x) (SOFTPLUS(x))
#define U_SOFTSIGN(T, x) ((x) / ((T)1 + fabs(x)))
#define U_ELU(T, x) ((x) >= 0 ? (x) : A * (EXPT(x) - (T)1))
#define U_SELU(T, x) ((x) > 0 ? G * (x) : G * (A * EXPT(x) - A))
#define U_CELU(T, x) ((x) > 0 ? (x) : A * (EXPT((x) / A) - (T)1))
#define U_MISH(T, x) ((x) * TANHT(SOFTPLUS(x)))
#define U_THRELU(T, x) ((x) > A ? (x) : (T)0)
#define U_FLOOR(T, x) (floor(x))
#define U_CEIL(T, x) (ceil(x))
#define U_ROUND(T, x) (nearbyint(x)) /* half to even in the default rounding mode */
#define U_RECIP(T, x) ((T)1 / (x))
#define U_SIN(T, x) (sin(x))
#define U_COS(T, x) (cos(x))
#define U_TAN(T, x) (tan(x))
#define U_ASIN(T, x) (asin(x))
#define U_ACOS(T, x) (acos(x))
#define U_ATAN(T, x) (atan(x))
#define U_SINH(T, x) (sinh(x))
#define U_COSH(T, x) (cosh(x))
#define U_ASINH(T, x) (asinh(x))
#define U_ACOSH(T, x) (acosh(x))
#define U_ATANH(T, x) (atanh(x))
#define U_SHRINK(T, x) ((x) < -A ? (x) + B : ((x) > A ? (x) - B : (T)0))
#define U_SWISH(T, x) ((x) * SIGMOID(A * (x)))
#define U_BNOT(T, x) ((T) ~(x))
#define U_NOT(T, x) (!(x))
#define U_ISNAN(T, x) (isnan(x))
/* IsInf: alpha and beta carry detect_positive and detect_negative. */
#define U_ISINF(T, x) (isinf(x) && (((x) > 0 && A != 0) || ((x) < 0 && B != 0)))

#define FLT_UN(NAME, OP) LIST_FLT(DEF_UN_ISA, OP) static const ew_fn tbl_##NAME[DT_MAX_] = {LIST_FLT(ENT, OP)};
FLT_UN(sqrt, U_SQRT)
FLT_UN(exp, U_EXP)
FLT_UN(log, U_LOG)
FLT_UN(erf, U_ERF)
FLT_UN(tanh, U_TANH)
FLT_UN(leaky, U_LEAKY)
FLT_UN(hsig, U_HSIG)
FLT_UN(hswish, U_HSWISH)
FLT_UN(softplus, U_SOFTPLUS)
FLT_UN(softsign, U_SOFTSIGN)
FLT_UN(elu, U_ELU)
FLT_UN(selu, U_SELU)
FLT_UN(celu, U_CELU)
FLT_UN(mish, U_MISH)
FLT_UN(threlu, U_THRELU)
FLT_UN(floor, U_FLOOR)
FLT_UN(ceil, U_CEIL)
FLT_UN(round, U_ROUND)
FLT_UN(recip, U_RECIP)
FLT_UN(sin, U_SIN)
FLT_UN(cos, U_COS)
FLT_UN(tan, U_TAN)
FLT_UN(asin, U_ASIN)
FLT_UN(acos, U_ACOS)
FLT_UN(atan, U_ATAN)
FLT_UN(sinh, U_SINH)
FLT_UN(cosh, U_COSH)
FLT_UN(asinh, U_ASINH)
FLT_UN(acosh, U_ACOSH)
FLT_UN(atanh, U_ATANH)

/* Float's logistic family on sigmoid_vec.h's AVX-512 and AVX2 loops, the
 * baseline's plain loop where the ISA has neither; double on libm. */
#define FLT_UN_SIGV(NAME, OP, KIND, ALPHA)                                                                          \
    LIST_FLT(DEF_UN, OP)                                                                                            \
    static void k_sigv_##NAME(const void *const *in, const int64_t *s, void *out, int64_t n,                      \
                              const struct ew_args *a) {                                                            \
        if (!sigmoid_vec(KIND, (ALPHA), in[0], NULL, out, n)) k_##OP##_f32(in, s, out, n, a);                       \
    }                                                                                                               \
    static const ew_fn tbl_##NAME[DT_MAX_] = {[DT_FP32] = k_sigv_##NAME, [DT_FP64] = k_##OP##_f64};
FLT_UN_SIGV(sigmoid, U_SIGMOID, SIGV_SIGMOID, 1.0f)
FLT_UN_SIGV(gelu, U_GELU, SIGV_GELU_ERF, 1.0f)
FLT_UN_SIGV(gelu_tanh, U_GELU_TANH, SIGV_GELU_TANH, 1.0f)
FLT_UN_SIGV(swish, U_SWISH, SIGV_SWISH, (float)a->alpha)

LIST_FLT(DEF_UN, U_NEG_F) LIST_SINT(DEF_UN, U_NEG_I)
LIST_FLT(DEF_UN, U_ABS_F) LIST_SINT(DEF_UN, U_ABS_S) LIST_UINT(DEF_UN, U_ABS_U)
LIST_FLT(DEF_UN, U_RELU) LIST_SINT(DEF_UN, U_RELU)
LIST_FLT(DEF_UN, U_SIGN) LIST_SINT(DEF_UN, U_SIGN) LIST_UINT(DEF_UN, U_SIGN_U)
LIST_FLT(DEF_UN, U_SHRINK) LIST_SINT(DEF_UN, U_SHRINK)
LIST_INT(DEF_UN, U_BNOT)
DEF_UN(U_NOT, b, uint8_t)
LIST_FLT(DEF_UNB, U_ISNAN) LIST_FLT(DEF_UNB, U_ISINF)

static const ew_fn tbl_neg[DT_MAX_] = {LIST_FLT(ENT, U_NEG_F) LIST_SINT(ENT, U_NEG_I)};
static const ew_fn tbl_abs[DT_MAX_] = {LIST_FLT(ENT, U_ABS_F) LIST_SINT(ENT, U_ABS_S) LIST_UINT(ENT, U_ABS_U)};
static const ew_fn tbl_relu[DT_MAX_] = {LIST_FLT(ENT, U_RELU) LIST_SINT(ENT, U_RELU)};
static const ew_fn tbl_sign[DT_MAX_] = {LIST_FLT(ENT, U_SIGN) LIST_SINT(ENT, U_SIGN) LIST_UINT(ENT, U_SIGN_U)};
static const ew_fn tbl_shrink[DT_MAX_] = {LIST_FLT(ENT, U_SHRINK) LIST_SINT(ENT, U_SHRINK)};
static const ew_fn tbl_bnot[DT_MAX_] = {LIST_INT(ENT, U_BNOT)};
static const ew_fn tbl_not[DT_MAX_] = {[DT_BOOL] = k_U_NOT_b};
static const ew_fn tbl_isnan[DT_MAX_] = {LIST_FLT(ENT, U_ISNAN)};
static const ew_fn tbl_isinf[DT_MAX_] = {LIST_FLT(ENT, U_ISINF)};

/* Copies by element size (the first step of the variadic operators, Where). */
#define DEF_COPY(NAME, T)                                                                                           \
    static void NAME(const void *const *in, const int64_t *s, void *out, int64_t n, const struct ew_args *a) {      \
        const T *restrict p = in[0];                                                                                \
        T *restrict o = out;                                                                                        \
        (void)a;                                                                                                    \
        if (s[0]) {                                                                                                 \
            memmove(o, p, (size_t)n * sizeof(T));                                                                   \
        } else {                                                                                                    \
            T v = p[0];                                                                                             \
            for (int64_t i = 0; i < n; i++) o[i] = v;                                                               \
        }                                                                                                           \
    }
DEF_COPY(k_copy_1, uint8_t)
DEF_COPY(k_copy_2, uint16_t)
DEF_COPY(k_copy_4, uint32_t)
DEF_COPY(k_copy_8, uint64_t)

static ew_fn copy_kernel(size_t esz) {
    switch (esz) {
    case 1: return k_copy_1;
    case 2: return k_copy_2;
    case 4: return k_copy_4;
    case 8: return k_copy_8;
    default: return NULL;
    }
}

/* ------------------------------------------------------------------------
 * Shared infer/run helpers
 * ------------------------------------------------------------------------ */

static int need_in(struct op_call *c, int i, const char *what) {
    if (!in_opt(c, i)) return op_error(c, "input %d (%s) is required", i, what);
    if (c->in[i]->dtype == DT_UNDEFINED || c->in[i]->ndim < 0)
        return op_error(c, "input %d (%s) has no known dtype or rank", i, what);
    return 0;
}

static int need_out(struct op_call *c) {
    if (!out_opt(c, 0)) return op_error(c, "output 0 is required");
    return 0;
}

static int unsupported_dtype(struct op_call *c, enum dtype dt) {
    op_error(c, "dtype %s is not supported by this operator", dtype_name(dt));
    return STATUS_UNSUPPORTED;
}

static void copy_shape(struct tensor *o, const struct tensor *t, enum dtype dt) {
    o->dtype = dt;
    o->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) o->dims[i] = t->dims[i];
}

/* Sets up node->act (ops declaring OP_FUSE_ACT) for the driver to apply. */
static int fused_act(struct op_call *c, struct ew_args *a) {
    if (c->node->act == ACT_NONE) return 0;
    if (c->out[0]->dtype != DT_FP32)
        return op_error(c, "a fused activation needs a float output, not %s", dtype_name(c->out[0]->dtype));
    a->act = c->node->act;
    a->act_a = c->node->act_alpha;
    a->act_b = c->node->act_beta;
    return 0;
}

/* Same dtype for every present input; broadcast shape of all into out. */
static int infer_nary(struct op_call *c, const ew_fn *tbl, enum dtype out_dt_or_0) {
    int rc = need_in(c, 0, "A");
    if (rc || (rc = need_out(c))) return rc;
    if (c->nin > OP_MAX_IO) return op_error(c, "too many inputs");
    enum dtype dt = c->in[0]->dtype;
    struct tensor acc = *c->in[0];
    for (int i = 1; i < c->nin; i++) {
        if ((rc = need_in(c, i, "operand"))) return rc;
        if (c->in[i]->dtype != dt)
            return op_error(c, "input %d has dtype %s but input 0 has %s; they must match", i,
                            dtype_name(c->in[i]->dtype), dtype_name(dt));
        struct tensor next = {0};
        if ((rc = op_broadcast_shape(c, &acc, c->in[i], &next))) return rc;
        acc.ndim = next.ndim;
        memcpy(acc.dims, next.dims, sizeof acc.dims);
    }
    if (!ew_pick(tbl, dt, NULL)) return unsupported_dtype(c, dt);
    copy_shape(c->out[0], &acc, out_dt_or_0 ? out_dt_or_0 : dt);
    return 0;
}

static int run_binary_tbl(struct op_call *c, const ew_fn *tbl) {
    struct ew_args a = {0};
    int rc = fused_act(c, &a);
    if (rc) return rc;
    ew_fn fn = ew_pick(tbl, c->in[0]->dtype, &a);
    if (!fn) return unsupported_dtype(c, c->in[0]->dtype);
    const struct tensor *in[2] = {c->in[0], c->in[1]};
    struct tensor *out = c->out[0], view[3];
    /* Channels-last operands (passes_layout): broadcast over memory order. */
    if (layout_of(c->node) == 3 && out->ndim == 4) {
        for (int k = 0; k < 2; k++) {
            layout_nhwc_view(&view[k], in[k]);
            in[k] = &view[k];
        }
        layout_nhwc_view(&view[2], out);
        out = &view[2];
    }
    ew_drive(c, fn, &a, in, 2, out);
    return 0;
}

#define BINARY_OP(NAME, TBL)                                                                                        \
    static int infer_##NAME(struct op_call *c) {                                                                    \
        if (c->nin != 2) return op_error(c, "expects 2 inputs, got %d", c->nin);                                    \
        return infer_nary(c, TBL, 0);                                                                               \
    }                                                                                                               \
    static int run_##NAME(struct op_call *c) { return run_binary_tbl(c, TBL); }
BINARY_OP(add, tbl_add)
BINARY_OP(sub, tbl_sub)
BINARY_OP(mul, tbl_mul)
BINARY_OP(div, tbl_div)
BINARY_OP(prelu7, tbl_prelu)

/* Before opset 7, PRelu applied a 1-D slope of C values along axis 1 (the
 * channels), not numpy-style from the last axis: view it as [C,1,...,1]. */
static const struct op_call *prelu_call(struct op_call *c, struct op_call *tmp, struct tensor *view) {
    const struct tensor *x = c->in[0], *sl = c->nin == 2 ? c->in[1] : NULL;
    if (c->node->opset >= 7 || !x || !sl || x->ndim < 3 || sl->ndim != 1 || sl->dims[0] == 1 ||
        sl->dims[0] != x->dims[1])
        return c;
    *view = *sl;
    view->ndim = x->ndim - 1;
    for (int i = 1; i < view->ndim; i++) view->dims[i] = 1;
    *tmp = *c;
    tmp->in[1] = view;
    return tmp;
}
static int infer_prelu(struct op_call *c) {
    struct op_call tmp;
    struct tensor view;
    return infer_prelu7((struct op_call *)prelu_call(c, &tmp, &view));
}
static int run_prelu(struct op_call *c) {
    struct op_call tmp;
    struct tensor view;
    return run_prelu7((struct op_call *)prelu_call(c, &tmp, &view));
}
BINARY_OP(band, tbl_band)
BINARY_OP(bor, tbl_bor)
BINARY_OP(bxor, tbl_bxor)
BINARY_OP(and, tbl_and)
BINARY_OP(or, tbl_or)
BINARY_OP(xor, tbl_xor)

#define COMPARE_OP(NAME, TBL)                                                                                       \
    static int infer_##NAME(struct op_call *c) {                                                                    \
        if (c->nin != 2) return op_error(c, "expects 2 inputs, got %d", c->nin);                                    \
        return infer_nary(c, TBL, DT_BOOL);                                                                         \
    }                                                                                                               \
    static int run_##NAME(struct op_call *c) { return run_binary_tbl(c, TBL); }
COMPARE_OP(eq, tbl_eq)
COMPARE_OP(lt, tbl_lt)
COMPARE_OP(gt, tbl_gt)
COMPARE_OP(le, tbl_le)
COMPARE_OP(ge, tbl_ge)

/* A table op's decoded parameters: its kernel table, when an attribute
 * picks it (Mod, BitShift, Gelu), and the arguments its kernels read (the
 * unary ops' alpha, beta, gamma), decoded at prepare. */
struct tbl_params {
    const ew_fn *tbl;
    struct ew_args a;
};

/* Keeps tbl and a as the op's state; a NULL tbl is a picker's refusal,
 * already reported with op_error. */
static int tbl_keep(struct op_call *c, const ew_fn *tbl, const struct ew_args *a, void **state) {
    if (!tbl) return STATUS_INVALID;
    struct tbl_params p = {tbl, *a};
    return params_keep(c, &p, sizeof p, state);
}

static int run_binary_params(struct op_call *c) {
    return run_binary_tbl(c, ((const struct tbl_params *)c->state)->tbl);
}

/* Mod: the fmod attribute picks C's or Python's sign convention. */
static const ew_fn *mod_tbl(const struct op_call *c) {
    return node_attr_int(c->node, "fmod", 0) ? tbl_fmod : tbl_modpy;
}
static int infer_mod(struct op_call *c) {
    if (c->nin != 2) return op_error(c, "expects 2 inputs, got %d", c->nin);
    return infer_nary(c, mod_tbl(c), 0);
}
static int prepare_mod(struct op_call *c, void **state, size_t *scratch) {
    struct ew_args a = {0};
    return tbl_keep(c, mod_tbl(c), &a, state);
}
static int run_mod(struct op_call *c) { return run_binary_params(c); }

/* BitShift: direction "LEFT" or "RIGHT", unsigned integers only. */
static const ew_fn *shift_tbl(struct op_call *c) {
    const char *d = node_attr_str(c->node, "direction", "");
    if (strcmp(d, "LEFT") == 0) return tbl_shl;
    if (strcmp(d, "RIGHT") == 0) return tbl_shr;
    op_error(c, "attribute 'direction' must be \"LEFT\" or \"RIGHT\", got \"%s\"", d);
    return NULL;
}
static int infer_shift(struct op_call *c) {
    const ew_fn *t = shift_tbl(c);
    if (!t) return STATUS_INVALID;
    if (c->nin != 2) return op_error(c, "expects 2 inputs, got %d", c->nin);
    return infer_nary(c, t, 0);
}
static int prepare_shift(struct op_call *c, void **state, size_t *scratch) {
    struct ew_args a = {0};
    return tbl_keep(c, shift_tbl(c), &a, state);
}
static int run_shift(struct op_call *c) { return run_binary_params(c); }

/* ------------------------------------------------------------------------
 * Pow: base and exponent may have different dtypes (opset 12+); the output
 * has the base's. Same float types take the typed kernel; the other
 * combinations compute in double, element by element.
 * ------------------------------------------------------------------------ */

static double load_d(const void *p, enum dtype dt) {
    switch (dt) {
    case DT_FP32: return *(const float *)p;
    case DT_FP64: return *(const double *)p;
    case DT_FP16: return fp16_to_fp32(*(const uint16_t *)p);
    case DT_BF16: return bf16_to_fp32(*(const uint16_t *)p);
    case DT_INT8: return *(const int8_t *)p;
    case DT_INT16: return *(const int16_t *)p;
    case DT_INT32: return *(const int32_t *)p;
    case DT_INT64: return (double)*(const int64_t *)p;
    case DT_UINT8: case DT_BOOL: return *(const uint8_t *)p;
    case DT_UINT16: return *(const uint16_t *)p;
    case DT_UINT32: return *(const uint32_t *)p;
    case DT_UINT64: return (double)*(const uint64_t *)p;
    case DT_FP8E4M3FN: case DT_FP8E4M3FNUZ: case DT_FP8E5M2: case DT_FP8E5M2FNUZ: case DT_FP4E2M1: case DT_FP8E8M0:
        return fp8_to_fp32(*(const uint8_t *)p, dt);
    case DT_INT4: case DT_INT2: return *(const int8_t *)p;
    case DT_UINT4: case DT_UINT2: return *(const uint8_t *)p;
    default: return 0;
    }
}

static int64_t sat_i64(double v, int64_t lo, int64_t hi) {
    if (v != v) return 0;
    if (v <= (double)lo) return lo;
    if (v >= (double)hi) return hi;
    return (int64_t)v;
}

/* Stores v as dt: integers saturate (NaN gives 0), except the 4- and 2-bit
 * ones, which keep v's low bits as ONNX's Cast does; float8 saturates as
 * saturate says. */
static void store_d_sat(void *p, enum dtype dt, double v, int saturate) {
    switch (dt) {
    case DT_FP8E4M3FN: case DT_FP8E4M3FNUZ: case DT_FP8E5M2: case DT_FP8E5M2FNUZ: case DT_FP4E2M1:
        *(uint8_t *)p = fp8_from_double(v, dt, saturate);
        break;
    case DT_INT4: case DT_UINT4: case DT_INT2: case DT_UINT2: *(uint8_t *)p = lowbit_from_double(v, dt); break;
    case DT_FP32: *(float *)p = (float)v; break;
    case DT_FP64: *(double *)p = v; break;
    case DT_FP16: *(uint16_t *)p = fp32_to_fp16((float)v); break;
    case DT_BF16: *(uint16_t *)p = fp32_to_bf16((float)v); break;
    case DT_INT8: *(int8_t *)p = (int8_t)sat_i64(v, INT8_MIN, INT8_MAX); break;
    case DT_INT16: *(int16_t *)p = (int16_t)sat_i64(v, INT16_MIN, INT16_MAX); break;
    case DT_INT32: *(int32_t *)p = (int32_t)sat_i64(v, INT32_MIN, INT32_MAX); break;
    case DT_INT64: *(int64_t *)p = sat_i64(v, INT64_MIN, INT64_MAX); break;
    case DT_UINT8: *(uint8_t *)p = (uint8_t)sat_i64(v, 0, UINT8_MAX); break;
    case DT_UINT16: *(uint16_t *)p = (uint16_t)sat_i64(v, 0, UINT16_MAX); break;
    case DT_UINT32: *(uint32_t *)p = (uint32_t)sat_i64(v, 0, UINT32_MAX); break;
    case DT_UINT64:
        *(uint64_t *)p = v <= 0 || v != v ? 0 : v >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)v;
        break;
    case DT_BOOL: *(uint8_t *)p = v != 0; break;
    default: break;
    }
}

static void store_d(void *p, enum dtype dt, double v) { store_d_sat(p, dt, v, 1); }

static void k_pow_mixed(const void *const *in, const int64_t *s, void *out, int64_t n, const struct ew_args *a) {
    size_t ea = dtype_size(a->in_dt[0]), eb = dtype_size(a->in_dt[1]), eo = dtype_size(a->out_dt);
    for (int64_t i = 0; i < n; i++) {
        double x = load_d((const char *)in[0] + (size_t)(i * s[0]) * ea, a->in_dt[0]);
        double y = load_d((const char *)in[1] + (size_t)(i * s[1]) * eb, a->in_dt[1]);
        store_d((char *)out + (size_t)i * eo, a->out_dt, pow(x, y));
    }
}

static int infer_pow(struct op_call *c) {
    int rc;
    if (c->nin != 2) return op_error(c, "expects 2 inputs, got %d", c->nin);
    if ((rc = need_in(c, 0, "X")) || (rc = need_in(c, 1, "Y")) || (rc = need_out(c))) return rc;
    if (!ew_is_number(c->in[0]->dtype)) return unsupported_dtype(c, c->in[0]->dtype);
    if (!ew_is_number(c->in[1]->dtype)) return unsupported_dtype(c, c->in[1]->dtype);
    if ((rc = op_broadcast_shape(c, c->in[0], c->in[1], c->out[0]))) return rc;
    c->out[0]->dtype = c->in[0]->dtype;
    return 0;
}

/* x^2 and x^3 on float as products: exporters write RMSNorm's square and
 * GELU's cube as Pow by a constant, and powf costs tens of cycles. */
UN_KERNEL(k_square_f32, float, float, x * x)
UN_KERNEL(k_cube_f32, float, float, x * x * x)

static int run_pow(struct op_call *c) {
    struct ew_args a = {0};
    const struct tensor *in[2] = {c->in[0], c->in[1]};
    if (in[0]->dtype == DT_FP32 && tensor_numel(in[1]) == 1 && in[1]->data && ew_is_number(in[1]->dtype)) {
        double y = load_d(in[1]->data, in[1]->dtype);
        ew_fn fn = y == 2.0 ? k_square_f32 : y == 3.0 ? k_cube_f32 : NULL;
        if (fn) {
            ew_drive(c, fn, &a, in, 1, c->out[0]);
            return 0;
        }
    }
    ew_fn fn = NULL;
    if (in[0]->dtype == in[1]->dtype) fn = ew_pick(tbl_pow, in[0]->dtype, &a);
    if (!fn) fn = k_pow_mixed;
    ew_drive(c, fn, &a, in, 2, c->out[0]);
    return 0;
}

/* ------------------------------------------------------------------------
 * Variadic: Sum Mean Min Max (numpy broadcasting across all inputs)
 * ------------------------------------------------------------------------ */

UN_KERNEL(k_scale_f32, float, float, x * A)
UN_KERNEL(k_scale_f64, double, double, x * A)
static const ew_fn tbl_scale[DT_MAX_] = {[DT_FP32] = k_scale_f32, [DT_FP64] = k_scale_f64};

static int run_variadic(struct op_call *c, const ew_fn *tbl, int mean) {
    struct tensor *o = c->out[0];
    struct ew_args a = {0};
    ew_fn fn = ew_pick(tbl, o->dtype, &a);
    if (!fn) return unsupported_dtype(c, o->dtype);
    if (c->nin == 1 || !tensor_same_shape(c->in[0], o)) {
        ew_fn cp = copy_kernel(dtype_size(o->dtype));
        struct ew_args ca = {0};
        const struct tensor *in[1] = {c->in[0]};
        ew_drive(c, cp, &ca, in, 1, o);
        for (int i = 1; i < c->nin; i++) {
            const struct tensor *bin[2] = {o, c->in[i]};
            ew_drive(c, fn, &a, bin, 2, o);
        }
    } else {
        const struct tensor *bin[2] = {c->in[0], c->in[1]};
        ew_drive(c, fn, &a, bin, 2, o);
        for (int i = 2; i < c->nin; i++) {
            const struct tensor *bin2[2] = {o, c->in[i]};
            ew_drive(c, fn, &a, bin2, 2, o);
        }
    }
    if (mean && c->nin > 1) {
        struct ew_args sa = {.alpha = 1.0f / (float)c->nin};
        ew_fn sf = ew_pick(tbl_scale, o->dtype, &sa);
        if (!sf) return unsupported_dtype(c, o->dtype);
        const struct tensor *in[1] = {o};
        if (o->dtype == DT_FP64) {
            /* full double precision for the divisor */
            double *d = o->data, inv = 1.0 / c->nin;
            int64_t n = tensor_numel(o);
            for (int64_t i = 0; i < n; i++) d[i] *= inv;
        } else {
            ew_drive(c, sf, &sa, in, 1, o);
        }
    }
    return 0;
}

#define VARIADIC_OP(NAME, TBL, MEAN)                                                                                \
    static int infer_##NAME(struct op_call *c) {                                                                    \
        if (c->nin < 1) return op_error(c, "expects at least one input");                                           \
        if (MEAN && !ew_is_float(c->in[0] ? c->in[0]->dtype : DT_UNDEFINED))                                        \
            return unsupported_dtype(c, c->in[0] ? c->in[0]->dtype : DT_UNDEFINED);                                 \
        return infer_nary(c, TBL, 0);                                                                               \
    }                                                                                                               \
    static int run_##NAME(struct op_call *c) { return run_variadic(c, TBL, MEAN); }
VARIADIC_OP(sum, tbl_add, 0)
VARIADIC_OP(mean, tbl_add, 1)
VARIADIC_OP(min, tbl_min, 0)
VARIADIC_OP(max, tbl_max, 0)

/* ------------------------------------------------------------------------
 * Unary operators with their attributes
 * ------------------------------------------------------------------------ */

static int infer_unary_tbl(struct op_call *c, const ew_fn *tbl, enum dtype out_dt) {
    int rc = need_in(c, 0, "X");
    if (rc || (rc = need_out(c))) return rc;
    if (!ew_pick(tbl, c->in[0]->dtype, NULL)) return unsupported_dtype(c, c->in[0]->dtype);
    copy_shape(c->out[0], c->in[0], out_dt ? out_dt : c->in[0]->dtype);
    return 0;
}

static int run_unary_tbl(struct op_call *c, const ew_fn *tbl, struct ew_args *a) {
    ew_fn fn = ew_pick(tbl, c->in[0]->dtype, a);
    if (!fn) return unsupported_dtype(c, c->in[0]->dtype);
    const struct tensor *in[1] = {c->in[0]};
    ew_drive(c, fn, a, in, 1, c->out[0]);
    return 0;
}

/* Runs a unary table op on the table and arguments its prepare decoded;
 * the kernels' arguments are copied, since the drive writes into them. */
static int run_unary_params(struct op_call *c) {
    const struct tbl_params *p = c->state;
    struct ew_args a = p->a;
    return run_unary_tbl(c, p->tbl, &a);
}

/* A unary op without attributes: nothing to decode, no state. */
#define UNARY_OP(NAME, TBL, OUT_DT)                                                                                 \
    static int infer_##NAME(struct op_call *c) { return infer_unary_tbl(c, TBL, OUT_DT); }                          \
    static int run_##NAME(struct op_call *c) {                                                                      \
        struct ew_args a = {0};                                                                                     \
        return run_unary_tbl(c, TBL, &a);                                                                           \
    }
/* A unary op with attributes: SETUP fills struct ew_args a from them, at
 * prepare. */
#define UNARY_OP_ATTR(NAME, TBL, OUT_DT, SETUP)                                                                     \
    static int infer_##NAME(struct op_call *c) { return infer_unary_tbl(c, TBL, OUT_DT); }                          \
    static int prepare_##NAME(struct op_call *c, void **state, size_t *scratch) {                                   \
        struct ew_args a = {0};                                                                                     \
        SETUP;                                                                                                      \
        return tbl_keep(c, TBL, &a, state);                                                                         \
    }                                                                                                               \
    static int run_##NAME(struct op_call *c) { return run_unary_params(c); }
#define ATTR_F(field, name, def) a.field = node_attr_float(c->node, name, def)

UNARY_OP(neg, tbl_neg, 0)
UNARY_OP(abs, tbl_abs, 0)
UNARY_OP(relu, tbl_relu, 0)
UNARY_OP(sign, tbl_sign, 0)
UNARY_OP(sqrt, tbl_sqrt, 0)
UNARY_OP(exp, tbl_exp, 0)
UNARY_OP(log, tbl_log, 0)
UNARY_OP(erf, tbl_erf, 0)
UNARY_OP(sigmoid, tbl_sigmoid, 0)
UNARY_OP(tanh, tbl_tanh, 0)
UNARY_OP_ATTR(leaky, tbl_leaky, 0, ATTR_F(alpha, "alpha", 0.01f))
UNARY_OP_ATTR(hsig, tbl_hsig, 0, ATTR_F(alpha, "alpha", 0.2f); ATTR_F(beta, "beta", 0.5f))
UNARY_OP(hswish, tbl_hswish, 0)
UNARY_OP(softplus, tbl_softplus, 0)
UNARY_OP(softsign, tbl_softsign, 0)
UNARY_OP_ATTR(elu, tbl_elu, 0, ATTR_F(alpha, "alpha", 1.0f))
UNARY_OP_ATTR(selu, tbl_selu, 0,
              ATTR_F(alpha, "alpha", 1.67326319217681884765625f);
              ATTR_F(gamma, "gamma", 1.05070102214813232421875f))
UNARY_OP_ATTR(celu, tbl_celu, 0, ATTR_F(alpha, "alpha", 1.0f))
UNARY_OP(mish, tbl_mish, 0)
UNARY_OP_ATTR(threlu, tbl_threlu, 0, ATTR_F(alpha, "alpha", 1.0f))
UNARY_OP(floor, tbl_floor, 0)
UNARY_OP(ceil, tbl_ceil, 0)
UNARY_OP(round, tbl_round, 0)
UNARY_OP(recip, tbl_recip, 0)
UNARY_OP(sin, tbl_sin, 0)
UNARY_OP(cos, tbl_cos, 0)
UNARY_OP(tan, tbl_tan, 0)
UNARY_OP(asin, tbl_asin, 0)
UNARY_OP(acos, tbl_acos, 0)
UNARY_OP(atan, tbl_atan, 0)
UNARY_OP(sinh, tbl_sinh, 0)
UNARY_OP(cosh, tbl_cosh, 0)
UNARY_OP(asinh, tbl_asinh, 0)
UNARY_OP(acosh, tbl_acosh, 0)
UNARY_OP(atanh, tbl_atanh, 0)
UNARY_OP_ATTR(shrink, tbl_shrink, 0, ATTR_F(alpha, "lambd", 0.5f); ATTR_F(beta, "bias", 0.0f))
UNARY_OP_ATTR(swish, tbl_swish, 0, ATTR_F(alpha, "alpha", 1.0f))
UNARY_OP(bnot, tbl_bnot, 0)
UNARY_OP(not, tbl_not, 0)
UNARY_OP(isnan, tbl_isnan, DT_BOOL)
UNARY_OP_ATTR(isinf, tbl_isinf, DT_BOOL,
              a.alpha = (float)node_attr_int(c->node, "detect_positive", 1);
              a.beta = (float)node_attr_int(c->node, "detect_negative", 1))

/* Gelu (opset 20): approximate = "none" (erf) or "tanh". */
static const ew_fn *gelu_tbl(struct op_call *c) {
    const char *ap = node_attr_str(c->node, "approximate", "none");
    if (strcmp(ap, "none") == 0) return tbl_gelu;
    if (strcmp(ap, "tanh") == 0) return tbl_gelu_tanh;
    op_error(c, "attribute 'approximate' must be \"none\" or \"tanh\", got \"%s\"", ap);
    return NULL;
}
static int infer_gelu(struct op_call *c) {
    const ew_fn *t = gelu_tbl(c);
    return t ? infer_unary_tbl(c, t, 0) : STATUS_INVALID;
}
static int prepare_gelu(struct op_call *c, void **state, size_t *scratch) {
    struct ew_args a = {0};
    return tbl_keep(c, gelu_tbl(c), &a, state);
}
static int run_gelu(struct op_call *c) { return run_unary_params(c); }

/* ------------------------------------------------------------------------
 * Clip: bounds are attributes before opset 11 and optional scalar inputs
 * since; an absent bound is the dtype's range.
 * ------------------------------------------------------------------------ */

#define DEF_CLIP(OP, suf, T)                                                                                        \
    static void k_clip_##suf(const void *const *in, const int64_t *s, void *out, int64_t n,                         \
                             const struct ew_args *a) {                                                             \
        const T *restrict p = in[0];                                                                                \
        T *restrict o = out, lo, hi;                                                                                \
        (void)s;                                                                                                    \
        memcpy(&lo, a->lo, sizeof(T));                                                                              \
        memcpy(&hi, a->hi, sizeof(T));                                                                              \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                                       \
            T v = p[i] < lo ? lo : p[i];                                                                            \
            o[i] = v > hi ? hi : v;                                                                                 \
        }                                                                                                           \
    }
LIST_FLT(DEF_CLIP, _) LIST_INT(DEF_CLIP, _)
#define ENT_CLIP(OP, suf, T) [DTOF_##suf] = k_clip_##suf,
static const ew_fn tbl_clip[DT_MAX_] = {LIST_FLT(ENT_CLIP, _) LIST_INT(ENT_CLIP, _)};

static int infer_clip(struct op_call *c) {
    int rc;
    if ((rc = infer_unary_tbl(c, tbl_clip, 0))) return rc;
    for (int i = 1; i < 3; i++) {
        const struct tensor *t = in_opt(c, i);
        if (!t) continue;
        if (t->dtype != c->in[0]->dtype)
            return op_error(c, "input %d (%s) has dtype %s but input has %s", i, i == 1 ? "min" : "max",
                            dtype_name(t->dtype), dtype_name(c->in[0]->dtype));
        if (tensor_numel(t) != 1)
            return op_error(c, "input %d (%s) must be a scalar", i, i == 1 ? "min" : "max");
    }
    return 0;
}

/* Stores the bound (input i, or the attribute/default value def) into dst
 * as the run dtype (float for the half types, which run as float). */
static void clip_bound(const struct op_call *c, int i, double def, enum dtype dt, unsigned char *dst) {
    const struct tensor *t = in_opt(c, i);
    double v = def;
    enum dtype run_dt = ew_is_half(dt) ? DT_FP32 : dt;
    if (t && t->data && tensor_numel(t) == 1) {
        if (t->dtype == run_dt) {
            memcpy(dst, t->data, dtype_size(run_dt));
            return;
        }
        v = load_d(t->data, t->dtype);
    } else if (ew_is_int(dt)) {
        /* absent bound: the whole range of the integer type */
        switch (dt) {
        case DT_INT8: v = def < 0 ? INT8_MIN : INT8_MAX; break;
        case DT_INT16: v = def < 0 ? INT16_MIN : INT16_MAX; break;
        case DT_INT32: v = def < 0 ? INT32_MIN : INT32_MAX; break;
        case DT_UINT8: v = def < 0 ? 0 : UINT8_MAX; break;
        case DT_UINT16: v = def < 0 ? 0 : UINT16_MAX; break;
        case DT_UINT32: v = def < 0 ? 0 : UINT32_MAX; break;
        case DT_INT64: {
            int64_t x = def < 0 ? INT64_MIN : INT64_MAX;
            memcpy(dst, &x, 8);
            return;
        }
        case DT_UINT64: {
            uint64_t x = def < 0 ? 0 : UINT64_MAX;
            memcpy(dst, &x, 8);
            return;
        }
        default: break;
        }
    }
    store_d(dst, run_dt, v);
}

/* Clip's bounds, decoded at prepare: before opset 11 the attributes
 * (no input holds them), since then the inputs read at run time, with the
 * dtype's range where one is absent. */
struct clip_params {
    int lo_in, hi_in;
    double lo, hi;
};

static int prepare_clip(struct op_call *c, void **state, size_t *scratch) {
    struct clip_params p = {1, 2, -INFINITY, INFINITY};
    if (c->node->opset < 11) {
        p.lo_in = p.hi_in = 99;
        p.lo = node_attr_float(c->node, "min", -FLT_MAX);
        p.hi = node_attr_float(c->node, "max", FLT_MAX);
    }
    return params_keep(c, &p, sizeof p, state);
}

static int run_clip(struct op_call *c) {
    const struct clip_params *p = c->state;
    struct ew_args a = {0};
    enum dtype dt = c->in[0]->dtype;
    clip_bound(c, p->lo_in, p->lo, dt, a.lo);
    clip_bound(c, p->hi_in, p->hi, dt, a.hi);
    return run_unary_tbl(c, tbl_clip, &a);
}

/* ------------------------------------------------------------------------
 * Where (bool condition, broadcast over three inputs)
 * ------------------------------------------------------------------------ */

#define DEF_WHERE(suf, T)                                                                                           \
    static void k_where_##suf(const void *const *in, const int64_t *s, void *out, int64_t n,                        \
                              const struct ew_args *a) {                                                            \
        const uint8_t *cond = in[0];                                                                                \
        const T *x = in[1], *y = in[2];                                                                             \
        T *o = out;                                                                                                 \
        (void)a;                                                                                                    \
        for (int64_t i = 0; i < n; i++) o[i] = cond[i * s[0]] ? x[i * s[1]] : y[i * s[2]];                          \
    }
DEF_WHERE(1, uint8_t)
DEF_WHERE(2, uint16_t)
DEF_WHERE(4, uint32_t)
DEF_WHERE(8, uint64_t)

static int infer_where(struct op_call *c) {
    int rc;
    if (c->nin != 3) return op_error(c, "expects 3 inputs, got %d", c->nin);
    if ((rc = need_in(c, 0, "condition")) || (rc = need_in(c, 1, "X")) || (rc = need_in(c, 2, "Y")) ||
        (rc = need_out(c)))
        return rc;
    if (c->in[0]->dtype != DT_BOOL) return op_error(c, "condition must be bool, got %s", dtype_name(c->in[0]->dtype));
    enum dtype dt = c->in[1]->dtype;
    if (c->in[2]->dtype != dt)
        return op_error(c, "X has dtype %s but Y has %s; they must match", dtype_name(dt),
                        dtype_name(c->in[2]->dtype));
    size_t es = dtype_size(dt);
    if (dt == DT_STRING || (es != 1 && es != 2 && es != 4 && es != 8)) return unsupported_dtype(c, dt);
    struct tensor t = {0};
    if ((rc = op_broadcast_shape(c, c->in[0], c->in[1], &t))) return rc;
    if ((rc = op_broadcast_shape(c, &t, c->in[2], c->out[0]))) return rc;
    c->out[0]->dtype = dt;
    return 0;
}

static int run_where(struct op_call *c) {
    ew_fn fn;
    switch (dtype_size(c->in[1]->dtype)) {
    case 1: fn = k_where_1; break;
    case 2: fn = k_where_2; break;
    case 4: fn = k_where_4; break;
    case 8: fn = k_where_8; break;
    default: return unsupported_dtype(c, c->in[1]->dtype);
    }
    struct ew_args a = {0};
    const struct tensor *in[3] = {c->in[0], c->in[1], c->in[2]};
    ew_drive(c, fn, &a, in, 3, c->out[0]);
    return 0;
}

/* ------------------------------------------------------------------------
 * Cast and CastLike: every pair of numeric dtypes, bool, the half types and
 * strings.
 * Float to integer conversions saturate (NaN gives 0) instead of invoking
 * C's undefined behaviour on out-of-range values.
 * ------------------------------------------------------------------------ */

typedef void (*cast_fn)(const void *src, void *dst, int64_t n);

struct cast_params {
    int saturate;
    enum e8m0_round round; /* to float8e8m0 */
};

#define DEF_TOINT(D, T, LO, HI)                                                                                     \
    static inline T fto_##D(double v) {                                                                             \
        return v != v ? (T)0 : v <= (double)(LO) ? (T)(LO) : v >= (double)(HI) ? (T)(HI) : (T)v;                    \
    }                                                                                                               \
    static inline T ito_##D(int64_t v) { return (T)v; }                                                             \
    static inline T uto_##D(uint64_t v) { return (T)v; }
DEF_TOINT(i8, int8_t, INT8_MIN, INT8_MAX)
DEF_TOINT(i16, int16_t, INT16_MIN, INT16_MAX)
DEF_TOINT(i32, int32_t, INT32_MIN, INT32_MAX)
DEF_TOINT(i64, int64_t, INT64_MIN, INT64_MAX)
DEF_TOINT(u8, uint8_t, 0, UINT8_MAX)
DEF_TOINT(u16, uint16_t, 0, UINT16_MAX)
DEF_TOINT(u32, uint32_t, 0, UINT32_MAX)
DEF_TOINT(u64, uint64_t, 0, UINT64_MAX)

#define TO_INT(D, v) _Generic((v), float: fto_##D, double: fto_##D, uint64_t: uto_##D, default: ito_##D)(v)
#define TO_f32(v) ((float)(v))
#define TO_f64(v) ((double)(v))
#define TO_f16(v) fp32_to_fp16((float)(v))
#define TO_bf16(v) fp32_to_bf16((float)(v))
#define TO_b(v) ((uint8_t)((v) != 0))
#define TO_i8(v) TO_INT(i8, v)
#define TO_i16(v) TO_INT(i16, v)
#define TO_i32(v) TO_INT(i32, v)
#define TO_i64(v) TO_INT(i64, v)
#define TO_u8(v) TO_INT(u8, v)
#define TO_u16(v) TO_INT(u16, v)
#define TO_u32(v) TO_INT(u32, v)
#define TO_u64(v) TO_INT(u64, v)
#define LD_f32(v) (v)
#define LD_f64(v) (v)
#define LD_f16(v) fp16_to_fp32(v)
#define LD_bf16(v) bf16_to_fp32(v)
#define LD_b(v) ((v) != 0)
#define LD_i8(v) (v)
#define LD_i16(v) (v)
#define LD_i32(v) (v)
#define LD_i64(v) (v)
#define LD_u8(v) (v)
#define LD_u16(v) (v)
#define LD_u32(v) (v)
#define LD_u64(v) (v)

#define CAST_SRC_LIST(X)                                                                                            \
    X(f32, float) X(f64, double) X(f16, uint16_t) X(bf16, uint16_t) X(i8, int8_t) X(i16, int16_t)                   \
    X(i32, int32_t) X(i64, int64_t) X(u8, uint8_t) X(u16, uint16_t) X(u32, uint32_t) X(u64, uint64_t)               \
    X(b, uint8_t)
#define CAST_DST_LIST(X, S, ST)                                                                                     \
    X(S, ST, f32, float) X(S, ST, f64, double) X(S, ST, f16, uint16_t) X(S, ST, bf16, uint16_t)                     \
    X(S, ST, i8, int8_t) X(S, ST, i16, int16_t) X(S, ST, i32, int32_t) X(S, ST, i64, int64_t)                       \
    X(S, ST, u8, uint8_t) X(S, ST, u16, uint16_t) X(S, ST, u32, uint32_t) X(S, ST, u64, uint64_t)                   \
    X(S, ST, b, uint8_t)

#define CAST_ONE(S, ST, D, DT)                                                                                      \
    static void cast_##S##_##D(const void *src, void *dst, int64_t n) {                                             \
        const ST *restrict s = src;                                                                                 \
        DT *restrict d = dst;                                                                                       \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) d[i] = TO_##D(LD_##S(s[i]));                            \
    }
#define CAST_FROM(S, ST) CAST_DST_LIST(CAST_ONE, S, ST)
CAST_SRC_LIST(CAST_FROM)

#define CASE_DST(S, ST, D, DT) case DTOF_##D: return cast_##S##_##D;
#define CASE_SRC(S, ST)                                                                                             \
    case DTOF_##S:                                                                                                  \
        switch (d) {                                                                                                \
            CAST_DST_LIST(CASE_DST, S, ST)                                                                          \
        default: return NULL;                                                                                       \
        }

static cast_fn cast_pick(enum dtype s, enum dtype d) {
    switch (s) {
        CAST_SRC_LIST(CASE_SRC)
    default: return NULL;
    }
}

/* The float8 (float8e8m0 included), float4 and 4- and 2-bit integer dtypes. */
static int cast_lowprec(enum dtype dt) { return dt >= DT_FP8E4M3FN && dt <= DT_INT2 && dtype_size(dt); }
static int cast_lowbit_int(enum dtype dt) {
    return dt == DT_INT4 || dt == DT_UINT4 || dt == DT_INT2 || dt == DT_UINT2;
}

/* Casts from or to a low-precision dtype, element by element through
 * double (exact for every source but 64-bit integers beyond 2^53, which no
 * low-precision dtype distinguishes): one rounding to the target. An
 * integer going to a 4- or 2-bit integer keeps its low bits. */
static void cast_lowprec_run(const struct tensor *x, struct tensor *o, int64_t n, const struct cast_params *p) {
    const int saturate = p->saturate;
    const size_t es = dtype_size(x->dtype), eo = dtype_size(o->dtype);
    const int int_to_int = cast_lowbit_int(o->dtype) && (ew_is_int(x->dtype) || x->dtype == DT_BOOL ||
                                                         cast_lowbit_int(x->dtype));
    const char *src = x->data;
    char *dst = o->data;
    for (int64_t i = 0; i < n; i++) {
        if (o->dtype == DT_FP8E8M0) /* from float32's bits, as ONNX's reference rounds */
            dst[i] = (char)fp8e8m0_from_float((float)load_d(src + (size_t)i * es, x->dtype), saturate, p->round);
        else if (int_to_int)
            dst[i] = (char)lowbit_from_int(cast_lowbit_int(x->dtype) ? lowbit_value(((const uint8_t *)src)[i], x->dtype)
                                                                     : op_int_at(x, i), o->dtype);
        else
            store_d_sat(dst + (size_t)i * eo, o->dtype, load_d(src + (size_t)i * es, x->dtype), saturate);
    }
}

/* ---- Cast to and from strings -------------------------------------------
 * As onnxruntime casts (ONNX leaves the text unspecified beyond "decimal"):
 * an integer becomes its decimal digits, bool "1" or "0"; a floating value
 * (every float dtype, widened to double) "%.8g", numpy's default
 * precision, with NaN "NaN" whatever its sign and the infinities "INF" and
 * "-INF". A string becomes a number as C's strtoll, strtoull and strtod read
 * it in base 10: white space before it is skipped, a sign is read, and the
 * bytes after the number are ignored ("12abc" is 12; "0x10" is 0 as an
 * integer, 16 as a float). Signed integers go through int64 and unsigned
 * ones and bool through uint64 ("-1" is 255 as a uint8), keeping the
 * target's low bits; floats go through double, then float for every
 * narrower float dtype (saturate and round_mode apply as for a float
 * source), the 4- and 2-bit integers through double as from a float. A
 * string with no number at its start, or one beyond int64, uint64 or double
 * (ERANGE: too large, or too small to be a normal double), is an error
 * naming the element, where onnxruntime throws. */

static int cast_is_float(enum dtype dt) {
    return dt == DT_FP32 || dt == DT_FP64 || dt == DT_FP16 || dt == DT_BF16 || dt == DT_FP8E8M0 ||
           dtype_is_minifloat(dt);
}

/* Element i of x as text into buf (at least 32 bytes); its length. */
static size_t cast_format(const struct tensor *x, int64_t i, char *buf, size_t cap) {
    int n;
    if (cast_is_float(x->dtype)) {
        double v = load_d((const char *)x->data + (size_t)i * dtype_size(x->dtype), x->dtype);
        n = v != v ? snprintf(buf, cap, "NaN") : isinf(v) ? snprintf(buf, cap, v < 0 ? "-INF" : "INF")
                                                          : snprintf(buf, cap, "%.8g", v);
    } else if (x->dtype == DT_UINT64) {
        n = snprintf(buf, cap, "%llu", (unsigned long long)((const uint64_t *)x->data)[i]);
    } else {
        n = snprintf(buf, cap, "%lld", (long long)op_int_at(x, i));
    }
    return n > 0 ? (size_t)n : 0;
}

static int cast_to_string(struct op_call *c, const struct tensor *x, struct tensor *o, int64_t n) {
    struct tensor_str *d = tensor_strs_mut(o);
    for (int64_t i = 0; i < n; i++) {
        char buf[40];
        size_t len = cast_format(x, i, buf, sizeof buf);
        const char *s = op_string_new(c, buf, len);
        if (!s) return STATUS_NOMEM;
        d[i] = (struct tensor_str){s, len};
    }
    return 0;
}

/* The first bytes of s for a message: printable ASCII as it is (quote and
 * backslash escaped), other bytes as \xNN, "..." after 32 bytes. */
static const char *cast_excerpt(struct tensor_str s, char *buf, size_t cap) {
    size_t k = 0;
    for (size_t j = 0; j < s.len && k + 8 < cap; j++) {
        unsigned char ch = (unsigned char)s.p[j];
        if (j == 32) {
            k += (size_t)snprintf(buf + k, cap - k, "...");
            break;
        }
        if (ch == '"' || ch == '\\') buf[k++] = '\\', buf[k++] = (char)ch;
        else if (ch < 0x20 || ch >= 0x7f) k += (size_t)snprintf(buf + k, cap - k, "\\x%02x", ch);
        else buf[k++] = (char)ch;
    }
    buf[k] = 0;
    return buf;
}

/* Reads string element i into *p as dtype dt, or fails naming it. */
static int cast_parse(struct op_call *c, struct tensor_str s, int64_t i, void *p, enum dtype dt,
                      const struct cast_params *cp) {
    /* strto* want a C string; a view's bytes need not end in a NUL. */
    char small[128];
    const char *z = small;
    if (s.len < sizeof small) {
        if (s.len) memcpy(small, s.p, s.len);
        small[s.len] = 0;
    } else if (!(z = op_string_new(c, s.p, s.len))) {
        return STATUS_NOMEM;
    }
    const int is_signed = dt == DT_INT8 || dt == DT_INT16 || dt == DT_INT32 || dt == DT_INT64;
    const int is_unsigned = dt == DT_UINT8 || dt == DT_UINT16 || dt == DT_UINT32 || dt == DT_UINT64 || dt == DT_BOOL;
    char *end;
    errno = 0;
    long long sv = 0;
    unsigned long long uv = 0;
    double dv = 0;
    if (is_signed) sv = strtoll(z, &end, 10);
    else if (is_unsigned) uv = strtoull(z, &end, 10);
    else dv = strtod(z, &end);
    char ex[160];
    if (end == z)
        return op_error(c, "string element %lld \"%s\" is not a number", (long long)i,
                        cast_excerpt(s, ex, sizeof ex));
    if (errno == ERANGE)
        return op_error(c, "string element %lld \"%s\" is out of the range of %s", (long long)i,
                        cast_excerpt(s, ex, sizeof ex), is_signed ? "int64" : is_unsigned ? "uint64" : "double");
    switch (dt) {
    case DT_INT8: *(int8_t *)p = (int8_t)sv; break;
    case DT_INT16: *(int16_t *)p = (int16_t)sv; break;
    case DT_INT32: *(int32_t *)p = (int32_t)sv; break;
    case DT_INT64: *(int64_t *)p = (int64_t)sv; break;
    case DT_UINT8: *(uint8_t *)p = (uint8_t)uv; break;
    case DT_UINT16: *(uint16_t *)p = (uint16_t)uv; break;
    case DT_UINT32: *(uint32_t *)p = (uint32_t)uv; break;
    case DT_UINT64: *(uint64_t *)p = (uint64_t)uv; break;
    case DT_BOOL: *(uint8_t *)p = uv != 0; break;
    case DT_FP64: *(double *)p = dv; break;
    case DT_FP8E8M0: *(uint8_t *)p = fp8e8m0_from_float((float)dv, cp->saturate, cp->round); break;
    default: store_d_sat(p, dt, cast_is_float(dt) ? (double)(float)dv : dv, cp->saturate); break;
    }
    return 0;
}

static int cast_from_string(struct op_call *c, const struct tensor *x, struct tensor *o, int64_t n,
                            const struct cast_params *cp) {
    const struct tensor_str *s = tensor_strs(x);
    const size_t eo = dtype_size(o->dtype);
    for (int64_t i = 0; i < n; i++) {
        struct tensor_str e = s[i];
        if (!e.p) e.p = "";
        int rc = cast_parse(c, e, i, (char *)o->data + (size_t)i * eo, o->dtype, cp);
        if (rc) return rc;
    }
    return 0;
}

static int cast_check(struct op_call *c, enum dtype from, enum dtype to) {
    if (from == to || from == DT_STRING || to == DT_STRING) return 0; /* every dtype reads and writes as text */
    if (!cast_pick(from, to) && !cast_lowprec(from) && !cast_lowprec(to)) {
        op_error(c, "Cast from %s to %s is not supported", dtype_name(from), dtype_name(to));
        return STATUS_UNSUPPORTED;
    }
    return 0;
}

static int cast_infer_to(struct op_call *c, enum dtype to) {
    int rc = need_in(c, 0, "input");
    if (rc || (rc = need_out(c))) return rc;
    if ((rc = cast_check(c, c->in[0]->dtype, to))) return rc;
    copy_shape(c->out[0], c->in[0], to);
    return 0;
}

static int cast_run_to(struct op_call *c) {
    const struct tensor *x = c->in[0];
    struct tensor *o = c->out[0];
    int64_t n = tensor_numel(x);
    if (n <= 0) return 0;
    if (x->dtype == o->dtype) {
        if (o->data != x->data) memcpy(o->data, x->data, (size_t)n * dtype_size(x->dtype));
        return 0;
    }
    static const struct cast_params dflt = {1, E8M0_ROUND_UP};
    const struct cast_params *cp = c->state ? (const struct cast_params *)c->state : &dflt;
    if (o->dtype == DT_STRING) return cast_to_string(c, x, o, n);
    if (x->dtype == DT_STRING) return cast_from_string(c, x, o, n, cp);
    if (cast_lowprec(x->dtype) || cast_lowprec(o->dtype)) {
        cast_lowprec_run(x, o, n, cp);
        return 0;
    }
    cast_fn fn = cast_pick(x->dtype, o->dtype);
    if (!fn) return cast_check(c, x->dtype, o->dtype);
    size_t es = dtype_size(x->dtype), eo = dtype_size(o->dtype);
    if (n < EW_PAR_MIN || c->nthreads <= 1) {
        fn(x->data, o->data, n);
        return 0;
    }
    int64_t pieces = (n + EW_PIECE - 1) / EW_PIECE;
#pragma omp parallel for num_threads(c->nthreads) schedule(static)
    for (int64_t p = 0; p < pieces; p++) {
        int64_t i0 = p * EW_PIECE, m = n - i0 < EW_PIECE ? n - i0 : EW_PIECE;
        fn((const char *)x->data + (size_t)i0 * es, (char *)o->data + (size_t)i0 * eo, m);
    }
    return 0;
}

static int infer_cast(struct op_call *c) {
    const struct graph_attr *to = node_attr(c->node, "to");
    if (!to || to->type != ATTR_INT) return op_error(c, "attribute 'to' (an int dtype) is required");
    if (to->i <= DT_UNDEFINED || to->i >= DT_MAX_ || dtype_size((enum dtype)to->i) == 0) {
        op_error(c, "attribute 'to' = %lld is not a dtype kiln supports", (long long)to->i);
        return STATUS_UNSUPPORTED;
    }
    return cast_infer_to(c, (enum dtype)to->i);
}

static int infer_castlike(struct op_call *c) {
    int rc = need_in(c, 1, "target_type");
    if (rc) return rc;
    return cast_infer_to(c, c->in[1]->dtype);
}

/* saturate (Cast and CastLike since opset 19) matters for float8 targets
 * only, round_mode (since 24) for float8e8m0 only. */
static int prepare_cast(struct op_call *c, void **state, size_t *scratch) {
    struct cast_params p = {.saturate = node_attr_int(c->node, "saturate", 1) != 0, .round = E8M0_ROUND_UP};
    const struct graph_attr *rm = node_attr(c->node, "round_mode");
    if (rm && rm->type == ATTR_STRING) {
        if (!strcmp(rm->s, "up")) p.round = E8M0_ROUND_UP;
        else if (!strcmp(rm->s, "down")) p.round = E8M0_ROUND_DOWN;
        else if (!strcmp(rm->s, "nearest")) p.round = E8M0_ROUND_NEAREST;
        else return op_error(c, "attribute 'round_mode' is '%s'; it must be 'up', 'down' or 'nearest'", rm->s);
    }
    return params_keep(c, &p, sizeof p, state);
}

/* ------------------------------------------------------------------------
 * Softmax, LogSoftmax, Hardmax.
 * Before opset 13 the input is coerced to 2-D at axis (default 1) and the
 * operation runs over the flattened second dimension; since 13 it runs over
 * the single axis (default -1).
 * ------------------------------------------------------------------------ */

enum smax_mode { SMAX_SOFT, SMAX_LOG, SMAX_HARD };
/* Columns a block of the non-last-axis loop holds (smax_cols). */
#define SMAX_COLS 64

#define DEF_SOFTMAX(suf, T)                                                                                         \
    static void smax_row_##suf(const T *x, T *y, int64_t len, int64_t st, enum smax_mode mode) {                    \
        T m = x[0];                                                                                                 \
        int64_t am = 0;                                                                                             \
        for (int64_t j = 1; j < len; j++)                                                                           \
            if (x[j * st] > m) {                                                                                    \
                m = x[j * st];                                                                                      \
                am = j;                                                                                             \
            }                                                                                                       \
        if (mode == SMAX_HARD) {                                                                                    \
            for (int64_t j = 0; j < len; j++) y[j * st] = (T)(j == am);                                             \
            return;                                                                                                 \
        }                                                                                                           \
        double sum = 0;                                                                                             \
        if (st == 1) { /* the common case: contiguous rows, vectorized */                                           \
            if (mode == SMAX_SOFT) {                                                                                \
                _Pragma("omp simd reduction(+ : sum)") for (int64_t j = 0; j < len; j++) {                          \
                    T e = EXPT(x[j] - m);                                                                           \
                    y[j] = e;                                                                                       \
                    sum += e;                                                                                       \
                }                                                                                                   \
                T inv = (T)(1.0 / sum);                                                                             \
                _Pragma("omp simd") for (int64_t j = 0; j < len; j++) y[j] *= inv;                                  \
            } else {                                                                                                \
                _Pragma("omp simd reduction(+ : sum)") for (int64_t j = 0; j < len; j++) sum +=                     \
                    EXPT(x[j] - m);                                                                                 \
                T l = (T)log(sum) + m;                                                                              \
                _Pragma("omp simd") for (int64_t j = 0; j < len; j++) y[j] = x[j] - l;                              \
            }                                                                                                       \
            return;                                                                                                 \
        }                                                                                                           \
        if (mode == SMAX_SOFT) {                                                                                    \
            for (int64_t j = 0; j < len; j++) {                                                                     \
                T e = EXPT(x[j * st] - m);                                                                          \
                y[j * st] = e;                                                                                      \
                sum += e;                                                                                           \
            }                                                                                                       \
            T inv = (T)(1.0 / sum);                                                                                 \
            for (int64_t j = 0; j < len; j++) y[j * st] *= inv;                                                     \
        } else {                                                                                                    \
            for (int64_t j = 0; j < len; j++) sum += EXPT(x[j * st] - m);                                           \
            T l = (T)log(sum) + m;                                                                                  \
            for (int64_t j = 0; j < len; j++) y[j * st] = x[j * st] - l;                                            \
        }                                                                                                           \
    }                                                                                                               \
    /* Softmax or LogSoftmax over a non-last axis: len rows of inner contiguous                                 \
     * values, a block of SMAX_COLS columns at a time, so that every pass reads                                  \
     * rows in order instead of one strided column at a time. Per column the                                     \
     * same operations in the same order as smax_row, so the same values. */                                     \
    static void smax_cols_##suf(const T *x, T *y, int64_t len, int64_t inner, int64_t i0, enum smax_mode mode) {    \
        int64_t n = inner - i0 < SMAX_COLS ? inner - i0 : SMAX_COLS;                                                \
        T m[SMAX_COLS], l[SMAX_COLS];                                                                               \
        double sum[SMAX_COLS];                                                                                      \
        x += i0;                                                                                                    \
        y += i0;                                                                                                    \
        for (int64_t k = 0; k < n; k++) {                                                                           \
            m[k] = x[k];                                                                                            \
            sum[k] = 0;                                                                                             \
        }                                                                                                           \
        for (int64_t j = 1; j < len; j++)                                                                           \
            for (int64_t k = 0; k < n; k++)                                                                         \
                if (x[j * inner + k] > m[k]) m[k] = x[j * inner + k];                                               \
        if (mode == SMAX_SOFT) {                                                                                    \
            for (int64_t j = 0; j < len; j++)                                                                       \
                for (int64_t k = 0; k < n; k++) {                                                                   \
                    T e = EXPT(x[j * inner + k] - m[k]);                                                            \
                    y[j * inner + k] = e;                                                                           \
                    sum[k] += e;                                                                                    \
                }                                                                                                   \
            for (int64_t k = 0; k < n; k++) l[k] = (T)(1.0 / sum[k]);                                               \
            for (int64_t j = 0; j < len; j++)                                                                       \
                for (int64_t k = 0; k < n; k++) y[j * inner + k] *= l[k];                                           \
        } else {                                                                                                    \
            for (int64_t j = 0; j < len; j++)                                                                       \
                for (int64_t k = 0; k < n; k++) sum[k] += EXPT(x[j * inner + k] - m[k]);                            \
            for (int64_t k = 0; k < n; k++) l[k] = (T)log(sum[k]) + m[k];                                           \
            for (int64_t j = 0; j < len; j++)                                                                       \
                for (int64_t k = 0; k < n; k++) y[j * inner + k] = x[j * inner + k] - l[k];                         \
        }                                                                                                           \
    }                                                                                                               \
    static void smax_##suf(const T *x, T *y, int64_t outer, int64_t len, int64_t inner,                             \
                           enum smax_mode mode, int nt) {                                                           \
        if (inner > 1 && mode != SMAX_HARD) {                                                                       \
            int64_t nb = (inner + SMAX_COLS - 1) / SMAX_COLS, blocks = outer * nb;                                  \
            PAR_FOR(blocks * len * SMAX_COLS >= EW_PAR_MIN && blocks > 1, nt, schedule(static),                     \
            for (int64_t b = 0; b < blocks; b++) {                                                                  \
                int64_t o = b / nb;                                                                                 \
                smax_cols_##suf(x + o * len * inner, y + o * len * inner, len, inner, (b % nb) * SMAX_COLS, mode);  \
            });                                                                                                     \
            return;                                                                                                 \
        }                                                                                                           \
        int64_t rows = outer * inner;                                                                               \
        if (rows * len < EW_PAR_MIN || nt <= 1 || rows < 2) {                                                       \
            for (int64_t r = 0; r < rows; r++) {                                                                    \
                int64_t o = r / inner, i = r % inner;                                                               \
                smax_row_##suf(x + o * len * inner + i, y + o * len * inner + i, len, inner, mode);                 \
            }                                                                                                       \
            return;                                                                                                 \
        }                                                                                                           \
        _Pragma("omp parallel for num_threads(nt) schedule(static)")                                                \
        for (int64_t r = 0; r < rows; r++) {                                                                        \
            int64_t o = r / inner, i = r % inner;                                                                   \
            smax_row_##suf(x + o * len * inner + i, y + o * len * inner + i, len, inner, mode);                     \
        }                                                                                                           \
    }
DEF_SOFTMAX(f32, float)
DEF_SOFTMAX(f64, double)

static int smax_geometry(struct op_call *c, const struct tensor *x, int64_t *outer, int64_t *len, int64_t *inner) {
    int legacy = c->node->opset < 13;
    int axis = op_axis(c, node_attr_int(c->node, "axis", legacy ? 1 : -1), x->ndim);
    if (axis < 0) return STATUS_INVALID;
    *outer = 1;
    *len = 1;
    *inner = 1;
    for (int i = 0; i < x->ndim; i++) {
        if (i < axis) *outer *= x->dims[i];
        else if (i == axis || legacy) *len *= x->dims[i];
        else *inner *= x->dims[i];
    }
    return 0;
}

static int infer_smax(struct op_call *c) {
    int rc = need_in(c, 0, "input");
    if (rc || (rc = need_out(c))) return rc;
    enum dtype dt = c->in[0]->dtype;
    if (dt != DT_FP32 && dt != DT_FP64) return unsupported_dtype(c, dt);
    int64_t o, l, i;
    if ((rc = smax_geometry(c, c->in[0], &o, &l, &i))) return rc;
    copy_shape(c->out[0], c->in[0], dt);
    return 0;
}

/* Softmax's geometry around its axis, decoded at prepare, and for FP32
 * Softmax and LogSoftmax oneDNN's primitive over the [outer, len, inner]
 * view (its exp is vectorized; the loops below call expf per element).
 * Below SMAX_DNNL_MIN values the loops run: a classifier's ten logits cost
 * ~3,200 instructions through the primitive's call (callgrind, the digits
 * model) and a few hundred in the loop; the crossover, with expf at some
 * twenty instructions a value, is above this. */
#define SMAX_DNNL_MIN 128
struct smax_params {
    int64_t outer, len, inner;
    struct dnnl_prim *prim;
};

static void release_smax(void *state) {
    struct smax_params *p = state;
    if (p) dnnl_prim_free(p->prim);
    op_params_free(p);
}

static struct dnnl_prim *smax_prim(struct op_call *c, const struct smax_params *p, int log, size_t *scratch) {
    int64_t dims[3] = {p->outer, p->len, p->inner};
    dnnl_memory_desc_t md;
    dnnl_softmax_v2_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = dnnl_util_attr();
    dnnl_util_set_threads(c->nthreads);
    dnnl_status_t st = attr && dnnl_util_engine() && dnnl_util_plain_md(&md, 3, dims) == 0
                           ? dnnl_softmax_v2_forward_desc_init(&d, dnnl_forward_inference,
                                                               log ? dnnl_softmax_log : dnnl_softmax_accurate, &md, &md, 1)
                           : dnnl_out_of_memory;
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &d, attr, dnnl_util_engine(), NULL);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return NULL; /* the loops below run it */
    /* Over an axis that is not the last, oneDNN runs its reference loop
     * (YOLOv8's DFL: a [1, 16, 2100] softmax over 16, 1.8 ms); the column
     * loop above does it in a tenth of that. */
    if (!dnnl_util_is_jit(pd)) {
        dnnl_primitive_desc_destroy(pd);
        return NULL;
    }
    int ids[2] = {DNNL_ARG_SRC, DNNL_ARG_DST};
    struct dnnl_prim *prim = dnnl_prim_create(c, pd, 2, ids, scratch);
    dnnl_primitive_desc_destroy(pd);
    return prim;
}

static int prepare_smax(struct op_call *c, void **state, size_t *scratch) {
    struct smax_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    int rc = smax_geometry(c, c->in[0], &p->outer, &p->len, &p->inner);
    if (rc) {
        op_params_free(p);
        return rc;
    }
    const char *op = c->node->op_type;
    if (c->in[0]->dtype == DT_FP32 && p->outer * p->len * p->inner >= SMAX_DNNL_MIN && strcmp(op, "Hardmax") != 0)
        p->prim = smax_prim(c, p, strcmp(op, "LogSoftmax") == 0, scratch);
    *state = p;
    return 0;
}

static int run_smax(struct op_call *c, enum smax_mode mode) {
    const struct smax_params *p = c->state;
    if (p->outer * p->len * p->inner <= 0) return 0;
    if (p->prim) {
        void *ptrs[2] = {(void *)c->in[0]->data, c->out[0]->data};
        return dnnl_prim_exec(c, p->prim, ptrs, c->scratch);
    }
    if (c->in[0]->dtype == DT_FP32)
        smax_f32(c->in[0]->data, c->out[0]->data, p->outer, p->len, p->inner, mode, c->nthreads);
    else if (c->in[0]->dtype == DT_FP64)
        smax_f64(c->in[0]->data, c->out[0]->data, p->outer, p->len, p->inner, mode, c->nthreads);
    else
        return unsupported_dtype(c, c->in[0]->dtype);
    return 0;
}
static int run_softmax(struct op_call *c) { return run_smax(c, SMAX_SOFT); }
static int run_logsoftmax(struct op_call *c) { return run_smax(c, SMAX_LOG); }
static int run_hardmax(struct op_call *c) { return run_smax(c, SMAX_HARD); }

/* ------------------------------------------------------------------------
 * LayerNormalization (opset 17) and RMSNormalization (opset 23): normalize
 * over the trailing axes from `axis`; Scale and B are either full over
 * those axes or a single value.
 * ------------------------------------------------------------------------ */

static int norm_infer(struct op_call *c, int rms) {
    int rc;
    if ((rc = need_in(c, 0, "X")) || (rc = need_in(c, 1, "Scale")) || (rc = need_out(c))) return rc;
    const struct tensor *x = c->in[0];
    enum dtype dt = x->dtype;
    if (dt != DT_FP32 && dt != DT_FP64) return unsupported_dtype(c, dt);
    int axis = op_axis(c, node_attr_int(c->node, "axis", -1), x->ndim);
    if (axis < 0) return STATUS_INVALID;
    int64_t n = 1;
    for (int i = axis; i < x->ndim; i++) n *= x->dims[i];
    for (int i = 1; i < (rms ? 2 : 3); i++) {
        const struct tensor *t = in_opt(c, i);
        if (!t) continue;
        if (t->dtype != dt)
            return op_error(c, "input %d has dtype %s but X has %s", i, dtype_name(t->dtype), dtype_name(dt));
        int64_t m = tensor_numel(t);
        if (m != n && m != 1)
            return op_error(c, "input %d has %lld elements; it must have 1 or %lld (the normalized axes)", i,
                            (long long)m, (long long)n);
    }
    copy_shape(c->out[0], x, dt);
    for (int k = 1; k < 3 && !rms; k++) {
        struct tensor *o = out_opt(c, k);
        if (!o) continue;
        copy_shape(o, x, dt == DT_FP64 ? DT_FP64 : DT_FP32);
        for (int i = axis; i < x->ndim; i++) o->dims[i] = 1;
    }
    return 0;
}

#define DEF_NORM(suf, T)                                                                                            \
    static void norm_row_##suf(const T *xr, const T *sc, int64_t nsc, const T *b, int64_t nb, T *yr,                \
                               T *mean, T *inv, int64_t n, double eps, int rms) {                                   \
        double mu = 0, var = 0;                                                                                     \
        if (!rms) {                                                                                                 \
            _Pragma("omp simd reduction(+ : mu)") for (int64_t j = 0; j < n; j++) mu += xr[j];                      \
            mu /= (double)n;                                                                                        \
        }                                                                                                           \
        _Pragma("omp simd reduction(+ : var)") for (int64_t j = 0; j < n; j++) {                                    \
            double d = xr[j] - mu;                                                                                  \
            var += d * d;                                                                                           \
        }                                                                                                           \
        var /= (double)n;                                                                                           \
        double is = 1.0 / sqrt(var + eps);                                                                          \
        T m = (T)mu, s = (T)is;                                                                                     \
        if (nsc == n && b && nb == n) { /* the usual full scale and bias, vectorized */                             \
            _Pragma("omp simd") for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - m) * s * sc[j] + b[j];             \
        } else {                                                                                                    \
            for (int64_t j = 0; j < n; j++) {                                                                       \
                T v = (xr[j] - m) * s * sc[nsc == 1 ? 0 : j];                                                       \
                yr[j] = b ? v + b[nb == 1 ? 0 : j] : v;                                                             \
            }                                                                                                       \
        }                                                                                                           \
        if (mean) *mean = m;                                                                                        \
        if (inv) *inv = s;                                                                                          \
    }                                                                                                               \
    static void norm_##suf(const T *x, const T *sc, int64_t nsc, const T *b, int64_t nb, T *y, T *mean,             \
                           T *inv, int64_t outer, int64_t n, double eps, int rms, int nt) {                         \
        if (outer * n < EW_PAR_MIN || nt <= 1 || outer < 2) {                                                       \
            for (int64_t r = 0; r < outer; r++)                                                                     \
                norm_row_##suf(x + r * n, sc, nsc, b, nb, y + r * n, mean ? mean + r : NULL,                        \
                               inv ? inv + r : NULL, n, eps, rms);                                                  \
            return;                                                                                                 \
        }                                                                                                           \
        _Pragma("omp parallel for num_threads(nt) schedule(static)")                                                \
        for (int64_t r = 0; r < outer; r++)                                                                         \
            norm_row_##suf(x + r * n, sc, nsc, b, nb, y + r * n, mean ? mean + r : NULL,                            \
                           inv ? inv + r : NULL, n, eps, rms);                                                      \
    }
DEF_NORM(f64, double)

/* Float rows sum in float across the vector's lanes (the generic row's
 * double sums halve the width and convert every element), and are built
 * for AVX-512, AVX2 and the baseline, the CPU's pick (dnnl_util_isa_level)
 * taken per call: normalization is a transformer's busiest op after its
 * products. */
typedef void (*norm_row_f32_fn)(const float *xr, const float *sc, int64_t nsc, const float *b, int64_t nb, float *yr,
                                float *mean, float *inv, int64_t n, float eps, int rms);

static inline __attribute__((always_inline)) void norm_row_f32_body(const float *xr, const float *sc, int64_t nsc,
                                                                    const float *b, int64_t nb, float *yr, float *mean,
                                                                    float *inv, int64_t n, float eps, int rms) {
    float mu = 0, var = 0;
    if (!rms) {
        _Pragma("omp simd reduction(+ : mu)") for (int64_t j = 0; j < n; j++) mu += xr[j];
        mu /= (float)n;
    }
    _Pragma("omp simd reduction(+ : var)") for (int64_t j = 0; j < n; j++) {
        float d = xr[j] - mu;
        var += d * d;
    }
    var /= (float)n;
    float s = 1.0f / sqrtf(var + eps);
    if (nsc == n && b && nb == n) {
        _Pragma("omp simd") for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - mu) * s * sc[j] + b[j];
    } else if (nsc == n && !b) {
        _Pragma("omp simd") for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - mu) * s * sc[j];
    } else {
        for (int64_t j = 0; j < n; j++) {
            float v = (xr[j] - mu) * s * sc[nsc == 1 ? 0 : j];
            yr[j] = b ? v + b[nb == 1 ? 0 : j] : v;
        }
    }
    if (mean) *mean = mu;
    if (inv) *inv = s;
}

#define NORM_ROW_ARGS                                                                                               \
    const float *xr, const float *sc, int64_t nsc, const float *b, int64_t nb, float *yr, float *mean, float *inv, \
        int64_t n, float eps, int rms
#if defined(__x86_64__) && defined(__GNUC__)
/* AVX-512: a row's ragged end is one masked vector. The generic loops end
 * in a scalar epilogue per pass, which on the short rows of a LayerNorm
 * over channels (ConvNeXt's 24 to 96) cost as much as the vector part. */
__attribute__((target("arch=x86-64-v4"))) static void norm_row_f32_v4(NORM_ROW_ARGS) {
    if (nsc != n || (b && nb != n)) {
        norm_row_f32_body(xr, sc, nsc, b, nb, yr, mean, inv, n, eps, rms);
        return;
    }
    const int64_t full = n & ~(int64_t)15;
    const __mmask16 tail = (__mmask16)((1u << (n - full)) - 1);
    __m512 acc = _mm512_setzero_ps();
    float mu = 0;
    if (!rms) {
        for (int64_t j = 0; j < full; j += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(xr + j));
        acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(tail, xr + full));
        mu = _mm512_reduce_add_ps(acc) / (float)n;
        acc = _mm512_setzero_ps();
    }
    const __m512 vmu = _mm512_set1_ps(mu);
    for (int64_t j = 0; j < full; j += 16) {
        __m512 d = _mm512_sub_ps(_mm512_loadu_ps(xr + j), vmu);
        acc = _mm512_fmadd_ps(d, d, acc);
    }
    __m512 d = _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, xr + full), vmu);
    acc = _mm512_fmadd_ps(d, d, acc);
    float s = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)n + eps);
    const __m512 vs = _mm512_set1_ps(s);
    for (int64_t j = 0; j <= full; j += 16) {
        __mmask16 m = j < full ? (__mmask16)0xffff : tail;
        __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, xr + j), vmu), vs),
                                 _mm512_maskz_loadu_ps(m, sc + j));
        if (b) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, b + j));
        _mm512_mask_storeu_ps(yr + j, m, y);
    }
    if (mean) *mean = mu;
    if (inv) *inv = s;
}
__attribute__((target("arch=x86-64-v3"))) static void norm_row_f32_v3(NORM_ROW_ARGS) {
    norm_row_f32_body(xr, sc, nsc, b, nb, yr, mean, inv, n, eps, rms);
}
#endif
static void norm_row_f32_v2(NORM_ROW_ARGS) { norm_row_f32_body(xr, sc, nsc, b, nb, yr, mean, inv, n, eps, rms); }

static norm_row_f32_fn norm_row_f32_pick(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    int level = dnnl_util_isa_level();
    return level >= 4 ? norm_row_f32_v4 : level == 3 ? norm_row_f32_v3 : norm_row_f32_v2;
#else
    return norm_row_f32_v2;
#endif
}

void ew_norm_row_f32(const float *xr, const float *sc, int64_t nsc, const float *b, int64_t nb, float *yr, float *mean,
                     float *inv, int64_t n, float eps, int rms) {
    norm_row_f32_pick()(xr, sc, nsc, b, nb, yr, mean, inv, n, eps, rms);
}

static void norm_f32(const float *x, const float *sc, int64_t nsc, const float *b, int64_t nb, float *y, float *mean,
                     float *inv, int64_t outer, int64_t n, double eps, int rms, int nt) {
    norm_row_f32_fn row = norm_row_f32_pick();
    float e = (float)eps;
    if (outer * n < EW_PAR_MIN || nt <= 1 || outer < 2) {
        for (int64_t r = 0; r < outer; r++)
            row(x + r * n, sc, nsc, b, nb, y + r * n, mean ? mean + r : NULL, inv ? inv + r : NULL, n, e, rms);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < outer; r++)
        row(x + r * n, sc, nsc, b, nb, y + r * n, mean ? mean + r : NULL, inv ? inv + r : NULL, n, e, rms);
}

/* A normalization's rows (before axis) and row length (from axis on),
 * and its epsilon, decoded at prepare. */
struct norm_params {
    int64_t outer, n;
    double eps;
};

static int prepare_norm(struct op_call *c, void **state, size_t *scratch) {
    const struct tensor *x = c->in[0];
    int axis = op_axis(c, node_attr_int(c->node, "axis", -1), x->ndim);
    if (axis < 0) return STATUS_INVALID;
    struct norm_params p = {1, 1, node_attr_float(c->node, "epsilon", 1e-5f)};
    for (int i = 0; i < x->ndim; i++) {
        if (i < axis) p.outer *= x->dims[i];
        else p.n *= x->dims[i];
    }
    return params_keep(c, &p, sizeof p, state);
}

static int norm_run(struct op_call *c, int rms) {
    const struct norm_params *p = c->state;
    const struct tensor *x = c->in[0], *sc = c->in[1], *b = rms ? NULL : in_opt(c, 2);
    int64_t outer = p->outer, n = p->n;
    if (outer * n <= 0) return 0;
    double eps = p->eps;
    struct tensor *om = rms ? NULL : out_opt(c, 1), *oi = rms ? NULL : out_opt(c, 2);
    int64_t nsc = tensor_numel(sc), nb = b ? tensor_numel(b) : 0;
    if (x->dtype == DT_FP32) {
        if ((om && om->dtype != DT_FP32) || (oi && oi->dtype != DT_FP32))
            return op_error(c, "Mean and InvStdDev outputs must be float for float X");
        norm_f32(x->data, sc->data, nsc, b ? b->data : NULL, nb, c->out[0]->data, om ? om->data : NULL,
                 oi ? oi->data : NULL, outer, n, eps, rms, c->nthreads);
    } else if (x->dtype == DT_FP64) {
        if ((om && om->dtype != DT_FP64) || (oi && oi->dtype != DT_FP64))
            return op_error(c, "Mean and InvStdDev outputs must be double for double X");
        norm_f64(x->data, sc->data, nsc, b ? b->data : NULL, nb, c->out[0]->data, om ? om->data : NULL,
                 oi ? oi->data : NULL, outer, n, eps, rms, c->nthreads);
    } else {
        return unsupported_dtype(c, x->dtype);
    }
    return 0;
}
static int infer_layernorm(struct op_call *c) { return norm_infer(c, 0); }
static int run_layernorm(struct op_call *c) { return norm_run(c, 0); }
static int infer_rmsnorm(struct op_call *c) { return norm_infer(c, 1); }
static int run_rmsnorm(struct op_call *c) { return norm_run(c, 1); }

/* ------------------------------------------------------------------------
 * QuantizeLinear, DequantizeLinear (per tensor, per axis, blocked) and
 * DynamicQuantizeLinear: 16-, 8-, 4- and 2-bit integers, float8 and
 * float4e2m1. Integers round half to even and saturate, as ONNX specifies;
 * float8 rounds once to the target and saturates as 'saturate' says (a
 * float8 zero point is 0 by definition and is ignored); float4e2m1 adds its
 * zero point before the one rounding and always saturates.
 * ------------------------------------------------------------------------ */

static int q_int_dtype(enum dtype dt) {
    return dt == DT_UINT8 || dt == DT_INT8 || dt == DT_UINT16 || dt == DT_INT16 || cast_lowbit_int(dt);
}

static double q_lo(enum dtype dt) {
    switch (dt) {
    case DT_INT8: return INT8_MIN;
    case DT_INT16: return INT16_MIN;
    case DT_INT4: return -8;
    case DT_INT2: return -2;
    default: return 0;
    }
}
static double q_hi(enum dtype dt) {
    switch (dt) {
    case DT_INT8: return INT8_MAX;
    case DT_INT16: return INT16_MAX;
    case DT_UINT8: return UINT8_MAX;
    case DT_INT4: return 7;
    case DT_UINT4: return 15;
    case DT_INT2: return 1;
    case DT_UINT2: return 3;
    default: return UINT16_MAX;
    }
}

/* Where scale/zero point element for data element (outer o, axis a, inner i) lives. */
struct q_geom {
    int64_t outer, len, inner; /* data split at axis */
    int64_t block;             /* 0: per tensor or per axis */
    int per_tensor;
    int64_t nblocks;
    int saturate; /* QuantizeLinear to float8 */
};

static int q_geometry(struct op_call *c, const struct tensor *x, const struct tensor *scale, struct q_geom *g) {
    memset(g, 0, sizeof *g);
    int64_t ns = tensor_numel(scale);
    int64_t bs = node_attr_int(c->node, "block_size", 0);
    if (ns == 1 && bs == 0) {
        g->per_tensor = 1;
        g->outer = 1;
        g->len = 1;
        g->inner = tensor_numel(x);
        return 0;
    }
    int ax = op_axis(c, node_attr_int(c->node, "axis", 1), x->ndim);
    if (ax < 0) return STATUS_INVALID;
    g->outer = g->len = g->inner = 1;
    for (int i = 0; i < x->ndim; i++) {
        if (i < ax) g->outer *= x->dims[i];
        else if (i == ax) g->len = x->dims[i];
        else g->inner *= x->dims[i];
    }
    if (bs <= 0) {
        if (scale->ndim != 1 || scale->dims[0] != g->len)
            return op_error(c, "scale must be a scalar or a 1-D tensor of %lld (the axis' size)", (long long)g->len);
        return 0;
    }
    g->block = bs;
    g->nblocks = (g->len + bs - 1) / bs;
    if (scale->ndim != x->ndim) return op_error(c, "blocked scale must have the data's rank");
    for (int i = 0; i < x->ndim; i++) {
        int64_t want = i == ax ? g->nblocks : x->dims[i];
        if (scale->dims[i] != want)
            return op_error(c, "blocked scale dim %d is %lld, expected %lld", i, (long long)scale->dims[i],
                            (long long)want);
    }
    return 0;
}

static inline int64_t q_sidx(const struct q_geom *g, int64_t o, int64_t a, int64_t i) {
    if (g->per_tensor) return 0;
    if (!g->block) return a;
    return (o * g->nblocks + a / g->block) * g->inner + i;
}

static int q_check_zp(struct op_call *c, const struct tensor *scale, const struct tensor *zp) {
    if (!zp) return 0;
    if (tensor_numel(zp) != tensor_numel(scale) || (zp->ndim != scale->ndim && tensor_numel(zp) != 1))
        return op_error(c, "zero point must have the scale's shape");
    return 0;
}

static int infer_quant(struct op_call *c) {
    int rc;
    if ((rc = need_in(c, 0, "x")) || (rc = need_in(c, 1, "y_scale")) || (rc = need_out(c))) return rc;
    const struct tensor *x = c->in[0], *scale = c->in[1], *zp = in_opt(c, 2);
    if (!ew_is_float(x->dtype)) return unsupported_dtype(c, x->dtype);
    if (scale->dtype != x->dtype && !(scale->dtype == DT_FP32))
        return op_error(c, "y_scale has dtype %s; it must be float or x's dtype", dtype_name(scale->dtype));
    enum dtype out = zp ? zp->dtype : (enum dtype)node_attr_int(c->node, "output_dtype", 0);
    if (out == DT_UNDEFINED) out = DT_UINT8;
    if (!q_int_dtype(out) && !dtype_is_minifloat(out)) {
        op_error(c, "quantizing to %s is not supported (8-, 16-, 4- and 2-bit integers, float8 and float4e2m1 are)",
                 dtype_name(out));
        return STATUS_UNSUPPORTED;
    }
    struct q_geom g;
    if ((rc = q_geometry(c, x, scale, &g)) || (rc = q_check_zp(c, scale, zp))) return rc;
    copy_shape(c->out[0], x, out);
    return 0;
}

/* QuantizeLinear's and DequantizeLinear's geometry (axis, block_size,
 * the data's and the scale's shapes), decoded at prepare. */
static int prepare_q(struct op_call *c, void **state, size_t *scratch) {
    struct q_geom g;
    int rc = q_geometry(c, c->in[0], c->in[1], &g);
    g.saturate = node_attr_int(c->node, "saturate", 1) != 0;
    return rc ? rc : params_keep(c, &g, sizeof g, state);
}

/* Per-tensor float32 to 8 bits, the common case (a quantized model's
 * input): one vectorizable loop. The float quotient is the general loop's:
 * double rounding of a division through double is innocuous (53 >= 2 * 24
 * + 2 bits). */
/* One float32 scale and zero point, 8-bit y: the quantization between the
 * layers of a QDQ model that runs in float (where oneDNN has no exact
 * integer kernel: AVX2). Built per ISA like the unary kernels (100k floats:
 * 64 us on the baseline build, 40 with AVX2); the same bits on every width. */
#define QUANT_F32_BODY(T, LO, HI)                                                              \
    (const float *x, int64_t n, float s, float z, T *y) {                                      \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                  \
            float v = nearbyintf(x[i] / s) + z;                                                \
            y[i] = (T)(v != v ? 0.0f : v < (LO) ? (LO) : v > (HI) ? (HI) : v);                 \
        }                                                                                      \
    }
#if defined(__x86_64__) && defined(__GNUC__)
#define QUANT_F32(T, LO, HI)                                                                   \
    static void quant_f32_##T##_v2 QUANT_F32_BODY(T, LO, HI)                                   \
    __attribute__((target("arch=x86-64-v3"))) static void quant_f32_##T##_v3 QUANT_F32_BODY(T, LO, HI) \
    __attribute__((target("arch=x86-64-v4"))) static void quant_f32_##T##_v4 QUANT_F32_BODY(T, LO, HI) \
    static void quant_f32_##T(const float *x, int64_t n, float s, float z, T *y) {             \
        int l = dnnl_util_isa_level();                                                         \
        (l >= 4 ? quant_f32_##T##_v4 : l == 3 ? quant_f32_##T##_v3 : quant_f32_##T##_v2)(x, n, s, z, y); \
    }
#else
#define QUANT_F32(T, LO, HI) static void quant_f32_##T QUANT_F32_BODY(T, LO, HI)
#endif
QUANT_F32(uint8_t, 0.0f, 255.0f)
QUANT_F32(int8_t, -128.0f, 127.0f)

static int run_quant(struct op_call *c) {
    const struct tensor *x = c->in[0], *scale = c->in[1], *zp = in_opt(c, 2);
    struct tensor *y = c->out[0];
    if (x->dtype == DT_FP32 && scale->dtype == DT_FP32 && tensor_numel(scale) == 1 &&
        (y->dtype == DT_UINT8 || y->dtype == DT_INT8) && (!zp || tensor_numel(zp) == 1)) {
        float s = *(const float *)scale->data, z = zp ? (float)op_int_at(zp, 0) : 0.0f;
        if (y->dtype == DT_UINT8) quant_f32_uint8_t(x->data, tensor_numel(x), s, z, y->data);
        else quant_f32_int8_t(x->data, tensor_numel(x), s, z, y->data);
        return 0;
    }
    const struct q_geom g = *(const struct q_geom *)c->state;
    const double lo = q_lo(y->dtype), hi = q_hi(y->dtype);
    const int mf = dtype_is_minifloat(y->dtype);
    unsigned char *yp = y->data;
    const size_t ye = dtype_size(y->dtype);
    for (int64_t o = 0; o < g.outer; o++)
        for (int64_t a = 0; a < g.len; a++)
            for (int64_t i = 0; i < g.inner; i++) {
                const int64_t e = (o * g.len + a) * g.inner + i, si = q_sidx(&g, o, a, i);
                double v = load_d((const char *)x->data + e * dtype_size(x->dtype), x->dtype) /
                           load_d((const char *)scale->data + si * dtype_size(scale->dtype), scale->dtype);
                /* the quotient in the scale's precision: halves must round as they do in float */
                if (scale->dtype != DT_FP64) v = (float)v;
                if (mf) {
                    if (zp && y->dtype == DT_FP4E2M1) v += load_d((const uint8_t *)zp->data + si, DT_FP4E2M1);
                    store_d_sat(yp + e, y->dtype, v, g.saturate);
                    continue;
                }
                v = nearbyint(v);
                if (zp) v += (double)op_int_at(zp, si);
                v = v != v ? 0 : v < lo ? lo : v > hi ? hi : v;
                store_d(yp + (size_t)e * ye, y->dtype, v);
            }
    return 0;
}

static int infer_dequant(struct op_call *c) {
    int rc;
    if ((rc = need_in(c, 0, "x")) || (rc = need_in(c, 1, "x_scale")) || (rc = need_out(c))) return rc;
    const struct tensor *x = c->in[0], *scale = c->in[1], *zp = in_opt(c, 2);
    if (!q_int_dtype(x->dtype) && x->dtype != DT_INT32 && !dtype_is_minifloat(x->dtype)) {
        op_error(c, "dequantizing %s is not supported (8-, 16-, 32-, 4- and 2-bit integers, float8 and float4e2m1 are)",
                 dtype_name(x->dtype));
        return STATUS_UNSUPPORTED;
    }
    if (!ew_is_float(scale->dtype)) return unsupported_dtype(c, scale->dtype);
    if (zp && zp->dtype != x->dtype)
        return op_error(c, "zero point has dtype %s but x has %s", dtype_name(zp->dtype), dtype_name(x->dtype));
    struct q_geom g;
    if ((rc = q_geometry(c, x, scale, &g)) || (rc = q_check_zp(c, scale, zp))) return rc;
    enum dtype out = (enum dtype)node_attr_int(c->node, "output_dtype", 0);
    if (out != DT_UNDEFINED && out != scale->dtype)
        return op_error(c, "output_dtype must be the scale's dtype (%s)", dtype_name(scale->dtype));
    copy_shape(c->out[0], x, scale->dtype);
    return 0;
}

/* The common case on its own vectorised loop: 8-bit x, one float32 scale
 * and zero point, float32 y (the dequantized embeddings of
 * quantize_dynamic's models). (x - zp) * scale is exact before its one
 * rounding in float as in double, so the bits are the generic loop's.
 * 0 when the case is another. */
static int dequant_8bit_f32(const struct tensor *x, const struct tensor *scale, const struct tensor *zp,
                            struct tensor *y) {
    if ((x->dtype != DT_UINT8 && x->dtype != DT_INT8) || y->dtype != DT_FP32 || scale->dtype != DT_FP32 ||
        tensor_numel(scale) != 1 || (zp && (zp->dtype != x->dtype || tensor_numel(zp) != 1)))
        return 0;
    const int64_t n = tensor_numel(x);
    const float s = *(const float *)scale->data;
    float *yd = y->data;
    if (x->dtype == DT_UINT8) {
        const uint8_t *xd = x->data;
        const float z = zp ? (float)*(const uint8_t *)zp->data : 0.0f;
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) yd[i] = ((float)xd[i] - z) * s;
    } else {
        const int8_t *xd = x->data;
        const float z = zp ? (float)*(const int8_t *)zp->data : 0.0f;
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) yd[i] = ((float)xd[i] - z) * s;
    }
    return 1;
}

static int run_dequant(struct op_call *c) {
    const struct tensor *x = c->in[0], *scale = c->in[1], *zp = in_opt(c, 2);
    struct tensor *y = c->out[0];
    const struct q_geom g = *(const struct q_geom *)c->state;
    const int mf = dtype_is_minifloat(x->dtype);
    unsigned char *yp = y->data;
    const size_t ye = dtype_size(y->dtype);
    if (dequant_8bit_f32(x, scale, zp, y)) return 0;
    for (int64_t o = 0; o < g.outer; o++)
        for (int64_t a = 0; a < g.len; a++)
            for (int64_t i = 0; i < g.inner; i++) {
                const int64_t e = (o * g.len + a) * g.inner + i, si = q_sidx(&g, o, a, i);
                /* a float8 or float4 zero point is 0 (ONNX's reference ignores it) */
                double v = mf ? load_d((const uint8_t *)x->data + e, x->dtype)
                              : (double)op_int_at(x, e) - (zp ? (double)op_int_at(zp, si) : 0);
                v *= load_d((const char *)scale->data + si * dtype_size(scale->dtype), scale->dtype);
                store_d(yp + (size_t)e * ye, y->dtype, v);
            }
    return 0;
}

/* DynamicQuantizeLinear: uint8 with a scale and zero point that map
 * [min(0, min x), max(0, max x)] onto [0, 255]. */
static int infer_dynquant(struct op_call *c) {
    int rc;
    if ((rc = need_in(c, 0, "x")) || (rc = need_out(c))) return rc;
    if (c->in[0]->dtype != DT_FP32) return unsupported_dtype(c, c->in[0]->dtype);
    copy_shape(c->out[0], c->in[0], DT_UINT8);
    struct tensor *s = out_opt(c, 1), *z = out_opt(c, 2);
    if (s) *s = (struct tensor){DT_FP32, 0, {0}, NULL};
    if (z) *z = (struct tensor){DT_UINT8, 0, {0}, NULL};
    return 0;
}

static int run_dynquant(struct op_call *c) {
    uint8_t zp;
    float scale = cpu_dynquant_u8(c->in[0]->data, tensor_numel(c->in[0]), c->out[0]->data, &zp);
    struct tensor *s = out_opt(c, 1), *z = out_opt(c, 2);
    if (s) *(float *)s->data = scale;
    if (z) *(uint8_t *)z->data = zp;
    return 0;
}

/* ------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------ */

#define OPDEF(NAME, FN, FLAGS) {NAME, "", infer_##FN, NULL, run_##FN, NULL, FLAGS}
/* An op that decodes its attributes at prepare. */
#define OPDEF_P(NAME, FN, FLAGS) {NAME, "", infer_##FN, prepare_##FN, run_##FN, op_params_free, FLAGS}

const struct op_def op_defs_elementwise[] = {
    OPDEF("Add", add, OP_FUSE_ACT),
    OPDEF("Sub", sub, OP_FUSE_ACT),
    OPDEF("Mul", mul, OP_FUSE_ACT),
    OPDEF("Div", div, OP_FUSE_ACT),
    OPDEF("Pow", pow, 0),
    OPDEF_P("Mod", mod, 0),
    OPDEF("PRelu", prelu, 0),
    OPDEF("BitwiseAnd", band, 0),
    OPDEF("BitwiseOr", bor, 0),
    OPDEF("BitwiseXor", bxor, 0),
    OPDEF("BitwiseNot", bnot, 0),
    OPDEF_P("BitShift", shift, 0),
    OPDEF("And", and, 0),
    OPDEF("Or", or, 0),
    OPDEF("Xor", xor, 0),
    OPDEF("Not", not, 0),
    OPDEF("Equal", eq, 0),
    OPDEF("Less", lt, 0),
    OPDEF("Greater", gt, 0),
    OPDEF("LessOrEqual", le, 0),
    OPDEF("GreaterOrEqual", ge, 0),
    OPDEF("Sum", sum, 0),
    OPDEF("Mean", mean, 0),
    OPDEF("Min", min, 0),
    OPDEF("Max", max, 0),
    OPDEF("Neg", neg, 0),
    OPDEF("Abs", abs, 0),
    OPDEF("Relu", relu, 0),
    OPDEF("Sign", sign, 0),
    OPDEF("Sqrt", sqrt, 0),
    OPDEF("Exp", exp, 0),
    OPDEF("Log", log, 0),
    OPDEF("Erf", erf, 0),
    OPDEF("Sigmoid", sigmoid, 0),
    OPDEF("Tanh", tanh, 0),
    OPDEF_P("LeakyRelu", leaky, 0),
    OPDEF_P("HardSigmoid", hsig, 0),
    OPDEF("HardSwish", hswish, 0),
    OPDEF_P("Gelu", gelu, 0),
    OPDEF("Softplus", softplus, 0),
    OPDEF("Softsign", softsign, 0),
    OPDEF_P("Elu", elu, 0),
    OPDEF_P("Selu", selu, 0),
    OPDEF_P("Celu", celu, 0),
    OPDEF("Mish", mish, 0),
    OPDEF_P("ThresholdedRelu", threlu, 0),
    OPDEF_P("Shrink", shrink, 0),
    OPDEF_P("Swish", swish, 0),
    OPDEF("Floor", floor, 0),
    OPDEF("Ceil", ceil, 0),
    OPDEF("Round", round, 0),
    OPDEF("Reciprocal", recip, 0),
    OPDEF("Sin", sin, 0),
    OPDEF("Cos", cos, 0),
    OPDEF("Tan", tan, 0),
    OPDEF("Asin", asin, 0),
    OPDEF("Acos", acos, 0),
    OPDEF("Atan", atan, 0),
    OPDEF("Sinh", sinh, 0),
    OPDEF("Cosh", cosh, 0),
    OPDEF("Asinh", asinh, 0),
    OPDEF("Acosh", acosh, 0),
    OPDEF("Atanh", atanh, 0),
    OPDEF("IsNaN", isnan, 0),
    OPDEF_P("IsInf", isinf, 0),
    OPDEF_P("Clip", clip, 0),
    OPDEF("Where", where, 0),
    {"Cast", "", infer_cast, prepare_cast, cast_run_to, op_params_free, 0},
    {"CastLike", "", infer_castlike, prepare_cast, cast_run_to, op_params_free, 0},
    {"Softmax", "", infer_smax, prepare_smax, run_softmax, release_smax, 0},
    {"LogSoftmax", "", infer_smax, prepare_smax, run_logsoftmax, release_smax, 0},
    {"Hardmax", "", infer_smax, prepare_smax, run_hardmax, release_smax, 0},
    {"LayerNormalization", "", infer_layernorm, prepare_norm, run_layernorm, op_params_free, 0},
    {"RMSNormalization", "", infer_rmsnorm, prepare_norm, run_rmsnorm, op_params_free, 0},
    {"QuantizeLinear", "", infer_quant, prepare_q, run_quant, op_params_free, 0},
    {"DequantizeLinear", "", infer_dequant, prepare_q, run_dequant, op_params_free, 0},
    OPDEF("DynamicQuantizeLinear", dynquant, 0),
    /* onnxruntime's contrib copies, which its quantization tools write for
     * 16-bit types before ONNX had them (same inputs and axis) */
    {"QuantizeLinear", "com.microsoft", infer_quant, prepare_q, run_quant, op_params_free, 0},
    {"DequantizeLinear", "com.microsoft", infer_dequant, prepare_q, run_dequant, op_params_free, 0},
    {0},
};
