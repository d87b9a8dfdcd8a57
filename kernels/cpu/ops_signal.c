/* ops_signal.c - the signal operators that audio front ends export
 * (log-mel spectrograms: torch.stft, Whisper's preprocessing):
 *     DFT STFT HannWindow HammingWindow BlackmanWindow MelWeightMatrix
 * After onnx's reference implementation. The transforms compute in double
 * precision (kernels/cpu/fft.h) and store in the input's dtype. */
#include <complex.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/fft.h"
#include "kernels/cpu/params_util.h"
#include "kernels/cpu/shape_util.h"
#include "kernels/ops.h"

static const double pi = 3.14159265358979323846;

/* Reads the integer scalar input i (a one-element int32/int64 tensor known
 * now) into *v. */
static int read_scalar_int(struct op_call *c, int i, const char *what, int64_t *v) {
    int n = read_int_input(c, i, what, v, 1);
    if (n < 0) return n;
    if (n != 1) return op_error(c, "%s must hold one value, has %d", what, n);
    return 0;
}

static int signal_dtype_ok(struct op_call *c, const struct tensor *x, const char *what) {
    if (x->dtype != DT_FP32 && x->dtype != DT_FP64 && x->dtype != DT_FP16)
        return op_error(c, "%s dtype %s is not supported (float, double, float16)", what, dtype_name(x->dtype));
    return 0;
}

/* The output_datatype attribute of the generators: a numeric dtype. */
static int out_datatype(struct op_call *c, enum dtype *dt) {
    int64_t v = node_attr_int(c->node, "output_datatype", DT_FP32);
    if (v <= DT_UNDEFINED || v >= DT_MAX_ || v == DT_STRING || !dtype_size((enum dtype)v))
        return op_error(c, "output_datatype %lld is not a numeric dtype kiln supports", (long long)v);
    *dt = (enum dtype)v;
    return 0;
}

/* ---- windows ------------------------------------------------------------------
 * w[k] = a0 - a1 cos(2 pi k / N) + a2 cos(4 pi k / N), N = size when periodic
 * and size - 1 when symmetric. */

struct window_def {
    const char *op_type;
    double a0, a1, a2;
};

static const struct window_def window_defs[] = {
    {"HannWindow", 0.5, 0.5, 0},
    {"HammingWindow", 25.0 / 46.0, 21.0 / 46.0, 0},
    {"BlackmanWindow", 0.42, 0.5, 0.08},
};

static int window_infer(struct op_call *c) {
    int64_t size;
    enum dtype dt;
    int rc = read_scalar_int(c, 0, "size", &size);
    if (rc || (rc = out_datatype(c, &dt))) return rc;
    if (size < 0 || size > SHAPE_MAX_DIM) return op_error(c, "size %lld is out of range", (long long)size);
    return set_shape(c, c->out[0], dt, 1, &size);
}

/* The window and its denominator, decoded at prepare. */
struct window_params {
    const struct window_def *w;
    int periodic;
};

static int window_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct window_params p = {NULL, node_attr_int(c->node, "periodic", 1) != 0};
    for (size_t k = 0; k < sizeof window_defs / sizeof window_defs[0]; k++)
        if (!strcmp(window_defs[k].op_type, c->node->op_type)) p.w = &window_defs[k];
    if (!p.w) return op_error(c, "not a window operator");
    return params_keep(c, &p, sizeof p, state);
}

static int window_run(struct op_call *c) {
    const struct window_params *p = c->state;
    const struct window_def *w = p->w;
    struct tensor *y = c->out[0];
    int64_t size = y->dims[0];
    double den = (double)(p->periodic ? size : size - 1);
    for (int64_t k = 0; k < size; k++) {
        double v = den > 0 ? w->a0 - w->a1 * cos(2 * pi * (double)k / den) + w->a2 * cos(4 * pi * (double)k / den) : 1;
        shape_store_double(y->dtype, y->data, k, v);
    }
    return 0;
}

/* ---- MelWeightMatrix ------------------------------------------------------------ */

static int mel_infer(struct op_call *c) {
    int64_t bins, dft;
    enum dtype dt;
    int rc = read_scalar_int(c, 0, "num_mel_bins", &bins);
    if (rc || (rc = read_scalar_int(c, 1, "dft_length", &dft)) || (rc = out_datatype(c, &dt))) return rc;
    if (bins < 1 || bins > 1 << 20) return op_error(c, "num_mel_bins %lld is out of range", (long long)bins);
    if (dft < 1 || dft > 1 << 26) return op_error(c, "dft_length %lld is out of range", (long long)dft);
    for (int i = 2; i < 5; i++)
        if ((rc = need_input(c, i, i == 2 ? "sample_rate" : i == 3 ? "lower_edge_hertz" : "upper_edge_hertz")))
            return rc;
    int64_t d[2] = {dft / 2 + 1, bins};
    return set_shape(c, c->out[0], dt, 2, d);
}

/* Triangular filters between mel-spaced edges, mapped to DFT bins as the
 * reference does (floor((dft_length + 1) f / sample_rate)). */
static int mel_run(struct op_call *c) {
    struct tensor *y = c->out[0];
    int64_t nspec = y->dims[0], bins = y->dims[1], dft = op_int_at(c->in[1], 0);
    int64_t rate = op_int_at(c->in[2], 0);
    double lo = op_double_at(c->in[3], 0), hi = op_double_at(c->in[4], 0);
    if (rate <= 0) return op_error(c, "sample_rate %lld must be positive", (long long)rate);
    if (!(lo >= 0 && hi > lo)) return op_error(c, "the edges must satisfy 0 <= lower_edge_hertz < upper_edge_hertz, got %g and %g", lo, hi);
    int64_t *edge = c->scratch;
    double mlo = 2595 * log10(1 + lo / 700), mhi = 2595 * log10(1 + hi / 700);
    double step = (mhi - mlo) / (double)(bins + 2);
    for (int64_t i = 0; i < bins + 2; i++) {
        double hz = 700 * (pow(10, ((double)i * step + mlo) / 2595) - 1);
        edge[i] = (int64_t)floor((double)(dft + 1) * hz / (double)rate);
        if (edge[i] < 0 || edge[i] >= nspec)
            return op_error(c, "mel edge %lld falls on DFT bin %lld, outside the %lld bins of dft_length %lld "
                               "(upper_edge_hertz above sample_rate / 2?)",
                            (long long)i, (long long)edge[i], (long long)nspec, (long long)dft);
    }
    for (int64_t k = 0; k < nspec * bins; k++) shape_store_double(y->dtype, y->data, k, 0);
    for (int64_t i = 0; i < bins; i++) {
        int64_t l = edge[i], m = edge[i + 1], r = edge[i + 2];
        if (m == l) {
            shape_store_double(y->dtype, y->data, m * bins + i, 1);
        } else {
            for (int64_t j = l; j <= m; j++)
                shape_store_double(y->dtype, y->data, j * bins + i, (double)(j - l) / (double)(m - l));
        }
        for (int64_t j = m; j < r; j++)
            shape_store_double(y->dtype, y->data, j * bins + i, (double)(r - j) / (double)(r - m));
    }
    return 0;
}

static int mel_prepare(struct op_call *c, void **state, size_t *scratch) {
    *scratch = (size_t)(c->out[0]->dims[1] + 2) * sizeof(int64_t);
    return 0;
}

/* ---- DFT and STFT ------------------------------------------------------------------ */

/* Shared by DFT and STFT: the transform, its length and direction, and the
 * geometry of the loops around it. */
struct dft_params {
    struct fft_plan *fft;
    int64_t n;          /* transform length */
    int axis;           /* DFT: signal axis */
    int inverse, onesided;
    int nthreads;
    size_t work;        /* scratch bytes per thread */
    int64_t step;       /* STFT: frame step */
};

static void dft_free(void *state) {
    struct dft_params *p = state;
    if (p) fft_plan_free(p->fft);
    op_params_free(p);
}

static inline double load_at(const struct tensor *t, int64_t i) {
    switch (t->dtype) {
    case DT_FP32: return ((const float *)t->data)[i];
    case DT_FP64: return ((const double *)t->data)[i];
    default: return op_double_at(t, i);
    }
}

static inline void store_at(struct tensor *t, int64_t i, double v) {
    switch (t->dtype) {
    case DT_FP32: ((float *)t->data)[i] = (float)v; break;
    case DT_FP64: ((double *)t->data)[i] = v; break;
    default: shape_store_double(t->dtype, t->data, i, v);
    }
}

/* Makes the plan for length n with per-thread work for one signal of n
 * values next to the transform's own. */
static int dft_plan(struct op_call *c, struct dft_params *p, void **state, size_t *scratch) {
    p->fft = fft_plan_create(p->n);
    if (!p->fft) return op_error(c, "out of memory for a length-%lld transform", (long long)p->n);
    p->nthreads = c->nthreads > 0 ? c->nthreads : 1;
    p->work = ((size_t)p->n * sizeof(double complex) + fft_work_size(p->fft) + 63) & ~(size_t)63;
    *scratch = p->work * (size_t)p->nthreads;
    int rc = params_keep(c, p, sizeof *p, state);
    if (rc) fft_plan_free(p->fft);
    return rc;
}

/* The DFT's axis, length and direction from its inputs and attributes
 * (opset 20 takes the axis as input 2, opset 17 as an attribute). */
static int dft_decode(struct op_call *c, struct dft_params *p) {
    const struct tensor *x = c->in[0];
    int rc = signal_dtype_ok(c, x, "input");
    if (rc) return rc;
    if (x->ndim < 2) return op_error(c, "input rank %d: need a signal axis and a last axis of 1 (real) or 2 (complex)", x->ndim);
    if (x->dims[x->ndim - 1] != 1 && x->dims[x->ndim - 1] != 2)
        return op_error(c, "the last axis must be 1 (real) or 2 (complex), got %lld", (long long)x->dims[x->ndim - 1]);
    int64_t axis = c->node->opset >= 20 ? -2 : node_attr_int(c->node, "axis", 1);
    if (c->node->opset >= 20 && in_opt(c, 2) && (rc = read_scalar_int(c, 2, "axis", &axis))) return rc;
    if (axis < 0) axis += x->ndim;
    if (axis < 0 || axis > x->ndim - 2)
        return op_error(c, "axis %lld is out of range: it must name a signal axis, not the last (complex) one", (long long)axis);
    p->axis = (int)axis;
    p->inverse = node_attr_int(c->node, "inverse", 0) != 0;
    p->onesided = node_attr_int(c->node, "onesided", 0) != 0;
    int64_t len = x->dims[axis];
    p->n = p->inverse && p->onesided ? 2 * (len - 1) : len;
    if (in_opt(c, 1) && (rc = read_scalar_int(c, 1, "dft_length", &p->n))) return rc;
    if (p->n < 1 || p->n > ((int64_t)1 << 30)) return op_error(c, "dft_length %lld is out of range", (long long)p->n);
    return 0;
}

static int dft_infer(struct op_call *c) {
    struct dft_params p = {0};
    int rc = dft_decode(c, &p);
    if (rc) return rc;
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0];
    *y = (struct tensor){.dtype = x->dtype, .ndim = x->ndim};
    memcpy(y->dims, x->dims, sizeof x->dims);
    y->dims[p.axis] = p.onesided && !p.inverse ? p.n / 2 + 1 : p.n;
    y->dims[x->ndim - 1] = p.inverse && p.onesided ? 1 : 2;
    return 0;
}

static int dft_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct dft_params p = {0};
    int rc = dft_decode(c, &p);
    return rc ? rc : dft_plan(c, &p, state, scratch);
}

/* One DFT along the axis: gathers the (padded or cut) signal, transforms
 * it and scatters the bins kept. */
static void dft_one(const struct dft_params *p, const struct tensor *x, struct tensor *y, int64_t o, int64_t i,
                    int64_t inner, double complex *buf, double complex *work) {
    int64_t n = p->n, len = x->dims[p->axis], lout = y->dims[p->axis];
    int cin = (int)x->dims[x->ndim - 1], cout = (int)y->dims[y->ndim - 1];
    int64_t base_in = o * len * inner + i, base_out = o * lout * inner + i;
    if (p->inverse && p->onesided) {
        /* Hermitian extension of the half spectrum (numpy's irfft): bins past
         * the input are zero, and the imaginary parts of the bins that must
         * be real are dropped. */
        int64_t half = n / 2 + 1;
        for (int64_t k = 0; k < half; k++) {
            double re = 0, im = 0;
            if (k < len) {
                int64_t e = (base_in + k * inner) * cin;
                re = load_at(x, e);
                im = cin == 2 ? load_at(x, e + 1) : 0;
            }
            if (k == 0 || (n % 2 == 0 && k == n / 2)) im = 0;
            buf[k] = re + I * im;
        }
        for (int64_t k = half; k < n; k++) buf[k] = conj(buf[n - k]);
    } else {
        for (int64_t k = 0; k < n; k++) {
            if (k >= len) {
                buf[k] = 0;
                continue;
            }
            int64_t e = (base_in + k * inner) * cin;
            buf[k] = load_at(x, e) + I * (cin == 2 ? load_at(x, e + 1) : 0);
        }
    }
    fft_run(p->fft, buf, p->inverse, work);
    double scale = p->inverse ? 1.0 / (double)n : 1.0;
    for (int64_t k = 0; k < lout; k++) {
        int64_t e = (base_out + k * inner) * cout;
        store_at(y, e, creal(buf[k]) * scale);
        if (cout == 2) store_at(y, e + 1, cimag(buf[k]) * scale);
    }
}

static int dft_run(struct op_call *c) {
    const struct dft_params *p = c->state;
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0];
    int64_t outer = prod(x->dims, 0, p->axis), inner = prod(x->dims, p->axis + 1, x->ndim - 1);
    int64_t count = outer * inner;
    char *scratch = c->scratch;
#pragma omp parallel for num_threads(p->nthreads) if (count > 1 && count * p->n > 4096)
    for (int64_t t = 0; t < count; t++) {
        double complex *buf = (double complex *)(void *)(scratch + (size_t)omp_get_thread_num() * p->work);
        dft_one(p, x, y, t / inner, t % inner, inner, buf, buf + p->n);
    }
    return 0;
}

/* STFT: signal [batch, length, 1 or 2] (or [batch, length], real, as
 * torch.onnx exports torch.stft), frame_step, optional window
 * [frame_length] and frame_length; output [batch, frames, bins, 2] with
 * frames = 1 + (length - frame_length) / frame_step. */
static int stft_decode(struct op_call *c, struct dft_params *p, int64_t *frames) {
    const struct tensor *x = c->in[0], *w = in_opt(c, 2);
    int rc = signal_dtype_ok(c, x, "signal");
    if (rc) return rc;
    if (!(x->ndim == 2 || (x->ndim == 3 && (x->dims[2] == 1 || x->dims[2] == 2))))
        return op_error(c, "signal must be [batch, length, 1 or 2] or [batch, length], got rank %d", x->ndim);
    if ((rc = read_scalar_int(c, 1, "frame_step", &p->step))) return rc;
    if (p->step < 1) return op_error(c, "frame_step %lld must be positive", (long long)p->step);
    if (w && (w->ndim != 1 || w->dtype != x->dtype))
        return op_error(c, "window must be 1-D and of the signal's dtype %s", dtype_name(x->dtype));
    p->n = w ? w->dims[0] : x->dims[1];
    if (in_opt(c, 3)) {
        int64_t fl;
        if ((rc = read_scalar_int(c, 3, "frame_length", &fl))) return rc;
        if (w && fl != w->dims[0])
            return op_error(c, "frame_length %lld differs from the window's length %lld", (long long)fl, (long long)w->dims[0]);
        p->n = fl;
    }
    if (p->n < 1 || p->n > x->dims[1])
        return op_error(c, "frame_length %lld must be between 1 and the signal's length %lld", (long long)p->n,
                        (long long)x->dims[1]);
    p->onesided = node_attr_int(c->node, "onesided", 1) != 0;
    *frames = 1 + (x->dims[1] - p->n) / p->step;
    return 0;
}

static int stft_infer(struct op_call *c) {
    struct dft_params p = {0};
    int64_t frames;
    int rc = stft_decode(c, &p, &frames);
    if (rc) return rc;
    int64_t d[4] = {c->in[0]->dims[0], frames, p.onesided ? p.n / 2 + 1 : p.n, 2};
    return set_shape(c, c->out[0], c->in[0]->dtype, 4, d);
}

static int stft_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct dft_params p = {0};
    int64_t frames;
    int rc = stft_decode(c, &p, &frames);
    return rc ? rc : dft_plan(c, &p, state, scratch);
}

static int stft_run(struct op_call *c) {
    const struct dft_params *p = c->state;
    const struct tensor *x = c->in[0], *w = in_opt(c, 2);
    struct tensor *y = c->out[0];
    int64_t frames = y->dims[1], bins = y->dims[2], len = x->dims[1], n = p->n;
    int cin = x->ndim == 3 ? (int)x->dims[2] : 1;
    int64_t count = x->dims[0] * frames;
    char *scratch = c->scratch;
#pragma omp parallel for num_threads(p->nthreads) if (count > 1 && count * n > 4096)
    for (int64_t t = 0; t < count; t++) {
        double complex *buf = (double complex *)(void *)(scratch + (size_t)omp_get_thread_num() * p->work);
        int64_t b = t / frames, f = t % frames, start = b * len + f * p->step;
        for (int64_t k = 0; k < n; k++) {
            int64_t e = (start + k) * cin;
            double wk = w ? load_at(w, k) : 1;
            buf[k] = wk * load_at(x, e) + I * (cin == 2 ? wk * load_at(x, e + 1) : 0);
        }
        fft_run(p->fft, buf, 0, buf + n);
        for (int64_t k = 0; k < bins; k++) {
            store_at(y, (t * bins + k) * 2, creal(buf[k]));
            store_at(y, (t * bins + k) * 2 + 1, cimag(buf[k]));
        }
    }
    return 0;
}

const struct op_def op_defs_signal[] = {
    {"DFT", "", dft_infer, dft_prepare, dft_run, dft_free, 0},
    {"STFT", "", stft_infer, stft_prepare, stft_run, dft_free, 0},
    {"HannWindow", "", window_infer, window_prepare, window_run, op_params_free, 0},
    {"HammingWindow", "", window_infer, window_prepare, window_run, op_params_free, 0},
    {"BlackmanWindow", "", window_infer, window_prepare, window_run, op_params_free, 0},
    {"MelWeightMatrix", "", mel_infer, mel_prepare, mel_run, NULL, 0},
    {NULL, NULL, NULL, NULL, NULL, NULL, 0},
};
