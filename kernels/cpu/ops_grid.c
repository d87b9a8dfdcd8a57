/* ops_grid.c - sampling at computed locations: GridSample reads an input
 * at the points of a grid, and AffineGrid makes such a grid from affine
 * matrices. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/params_util.h"
#include "kernels/cpu/shape_util.h"
#include "kernels/ops.h"

/* ------------------------------------------------------------------------
 * GridSample: each output point reads the input at a normalized location
 * from grid ([-1, 1] per spatial axis, innermost axis first), with nearest,
 * linear or cubic weights over 1, 2 or 4 taps per axis; taps outside the
 * input read zeros, the border, or a reflection, as padding_mode says.
 * ------------------------------------------------------------------------ */

enum gs_mode { GS_NEAREST, GS_LINEAR, GS_CUBIC };
enum gs_pad { GS_ZEROS, GS_BORDER, GS_REFLECTION };

static int gs_params(struct op_call *c, enum gs_mode *mode, enum gs_pad *pad) {
    const struct tensor *x = c->in[0], *g = in_opt(c, 1);
    if (!g) return op_error(c, "input 1 (grid) is required");
    const char *m = node_attr_str(c->node, "mode", c->node->opset >= 20 ? "linear" : "bilinear");
    if (!strcmp(m, "nearest")) *mode = GS_NEAREST;
    else if (!strcmp(m, "linear") || !strcmp(m, "bilinear")) *mode = GS_LINEAR;
    else if (!strcmp(m, "cubic") || !strcmp(m, "bicubic")) *mode = GS_CUBIC;
    else return op_error(c, "unknown mode '%s'", m);
    const char *p = node_attr_str(c->node, "padding_mode", "zeros");
    if (!strcmp(p, "zeros")) *pad = GS_ZEROS;
    else if (!strcmp(p, "border")) *pad = GS_BORDER;
    else if (!strcmp(p, "reflection")) *pad = GS_REFLECTION;
    else return op_error(c, "unknown padding_mode '%s'", p);
    int sp = x->ndim - 2;
    if (sp < 1 || sp > 3) return op_error(c, "input must be [N, C, ...] with 1 to 3 spatial axes, got rank %d", x->ndim);
    if (g->ndim != x->ndim || g->dims[0] != x->dims[0] || g->dims[g->ndim - 1] != sp)
        return op_error(c, "grid must be [N, ..., %d] with the input's batch and rank", sp);
    if (!is_float_dtype(x->dtype) || !is_float_dtype(g->dtype)) return op_error(c, "input and grid must be floating point");
    return 0;
}

static int gs_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    enum gs_mode mode;
    enum gs_pad pad;
    int rc = gs_params(c, &mode, &pad);
    if (rc) return rc;
    const struct tensor *g = c->in[1];
    int64_t d[TENSOR_MAX_DIMS];
    d[0] = x->dims[0];
    d[1] = x->dims[1];
    for (int k = 1; k < g->ndim - 1; k++) d[k + 1] = g->dims[k];
    return set_shape(c, c->out[0], x->dtype, x->ndim, d);
}

/* Folds x into [lo, hi] by reflecting at the nearer border, as ONNX's
 * reference does. */
static double gs_reflect(double x, double lo, double hi) {
    double rng = hi - lo;
    if (rng <= 0) return lo;
    if (x < lo) {
        double dx = lo - x;
        int64_t n = (int64_t)(dx / rng);
        double r = dx - (double)n * rng;
        return n % 2 == 0 ? lo + r : hi - r;
    }
    if (x > hi) {
        double dx = x - hi;
        int64_t n = (int64_t)(dx / rng);
        double r = dx - (double)n * rng;
        return n % 2 == 0 ? hi - r : lo + r;
    }
    return x;
}

static void gs_cubic(double t, double *w) {
    const double A = -0.75;
    t = fabs(t);
    w[0] = ((A * (t + 1) - 5 * A) * (t + 1) + 8 * A) * (t + 1) - 4 * A;
    w[1] = ((A + 2) * t - (A + 3)) * t * t + 1;
    w[2] = ((A + 2) * (1 - t) - (A + 3)) * (1 - t) * (1 - t) + 1;
    w[3] = ((A * (2 - t) - 5 * A) * (2 - t) + 8 * A) * (2 - t) - 4 * A;
}

/* GridSample's mode, padding and align_corners, decoded at prepare. */
struct gs_params {
    enum gs_mode mode;
    enum gs_pad pad;
    int align_corners;
};

static int gs_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct gs_params p;
    int rc = gs_params(c, &p.mode, &p.pad);
    if (rc) return rc;
    p.align_corners = (int)node_attr_int(c->node, "align_corners", 0);
    return params_keep(c, &p, sizeof p, state);
}

static int gs_run(struct op_call *c) {
    const struct tensor *x = c->in[0], *g = c->in[1];
    struct tensor *o = c->out[0];
    const struct gs_params *gp = c->state;
    enum gs_mode mode = gp->mode;
    enum gs_pad pad = gp->pad;
    int sp = x->ndim - 2, ac = gp->align_corners;
    int64_t N = x->dims[0], C = x->dims[1], in_sp = prod(x->dims, 2, x->ndim), npts = prod(g->dims, 1, g->ndim - 1);
    const int64_t *dims = x->dims + 2;
    double lo[3], hi[3];
    for (int k = 0; k < sp; k++) {
        lo[k] = ac ? 0 : -0.5;
        hi[k] = ac ? (double)dims[k] - 1 : (double)dims[k] - 0.5;
    }
    int ntap = mode == GS_NEAREST ? 1 : (mode == GS_LINEAR ? 2 : 4);
#pragma omp parallel for if (N * npts * C > 4096) num_threads(c->nthreads > 0 ? c->nthreads : 1)
    for (int64_t q = 0; q < N * npts; q++) {
        int64_t n = q / npts, p = q % npts;
        /* Source coordinate per spatial axis (axis k reads grid component sp-1-k). */
        double pos[3];
        for (int k = 0; k < sp; k++) {
            float v = (float)op_double_at(g, q * sp + (sp - 1 - k));
            float len = (float)dims[k];
            float xf = ac ? (v + 1) / 2.0f * (len - 1) : ((v + 1) * len - 1) / 2.0f;
            double xv = xf;
            if (mode == GS_NEAREST) xv = rint(xv);
            if (xv < lo[k] || xv > hi[k]) {
                if (pad == GS_BORDER) xv = xv < 0 ? 0 : (xv > (double)dims[k] - 1 ? (double)dims[k] - 1 : xv);
                else if (pad == GS_REFLECTION) xv = gs_reflect(xv, lo[k], hi[k]);
            }
            pos[k] = xv;
        }
        /* Taps and weights per axis. */
        int64_t tidx[3][4];
        double tw[3][4];
        for (int k = 0; k < sp; k++) {
            int64_t base;
            if (mode == GS_NEAREST) {
                base = (int64_t)pos[k];
                tw[k][0] = 1;
            } else {
                base = (int64_t)floor(pos[k]);
                double f = pos[k] - (double)base;
                if (mode == GS_LINEAR) {
                    tw[k][0] = 1 - f;
                    tw[k][1] = f;
                } else {
                    gs_cubic(f, tw[k]);
                    base -= 1;
                }
            }
            for (int j = 0; j < ntap; j++) {
                int64_t i = base + j;
                if (i < 0 || i >= dims[k]) {
                    if (pad == GS_ZEROS) i = -1;
                    else if (pad == GS_BORDER) i = i < 0 ? 0 : dims[k] - 1;
                    else i = (int64_t)gs_reflect((double)i, lo[k], hi[k]);
                    if (i >= dims[k]) i = dims[k] - 1;
                    if (i < -1) i = 0;
                }
                tidx[k][j] = i;
            }
        }
        int total = 1;
        for (int k = 0; k < sp; k++) total *= ntap;
        for (int64_t ch = 0; ch < C; ch++) {
            int64_t xbase = (n * C + ch) * in_sp;
            double acc = 0;
            for (int t = 0; t < total; t++) {
                int rem = t;
                int64_t off = 0;
                double w = 1;
                int zero = 0;
                for (int k = sp - 1; k >= 0; k--) {
                    int j = rem % ntap;
                    rem /= ntap;
                    int64_t i = tidx[k][j];
                    if (i < 0) {
                        zero = 1;
                        break;
                    }
                    off += i * prod(dims, k + 1, sp);
                    w *= tw[k][j];
                }
                if (!zero && w != 0) acc += w * op_double_at(x, xbase + off);
            }
            shape_store_double(o->dtype, o->data, (n * C + ch) * npts + p, acc);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * AffineGrid: the sampling grid of theta applied to a regular grid of the
 * requested size (the counterpart of GridSample).
 * ------------------------------------------------------------------------ */

static int ag_size(struct op_call *c, int64_t *sz) {
    int n = read_int_input(c, 1, "size", sz, 5);
    if (n < 0) return n;
    if (n != 4 && n != 5) return op_error(c, "size must be [N, C, H, W] or [N, C, D, H, W]");
    const struct tensor *th = c->in[0];
    int sp = n - 2;
    if (th->ndim != 3 || th->dims[0] != sz[0] || th->dims[1] != sp || th->dims[2] != sp + 1)
        return op_error(c, "theta must be [N, %d, %d] for size with %d spatial axes", sp, sp + 1, sp);
    if (!is_float_dtype(th->dtype)) return op_error(c, "theta must be floating point");
    for (int k = 0; k < n; k++)
        if (dim_ok(c, (double)sz[k], "a size value")) return STATUS_INVALID;
    return n;
}

static int ag_infer(struct op_call *c) {
    int64_t sz[5], d[5];
    int n = ag_size(c, sz);
    if (n < 0) return n;
    d[0] = sz[0];
    for (int k = 2; k < n; k++) d[k - 1] = sz[k];
    d[n - 1] = n - 2;
    return set_shape(c, c->out[0], c->in[0]->dtype, n, d);
}

static double ag_coord(int64_t i, int64_t len, int ac) {
    if (ac) return len > 1 ? -1 + (double)i * 2.0 / (double)(len - 1) : -1;
    return -1 + (2.0 * (double)i + 1) / (double)len;
}

/* AffineGrid's size (a constant input) and align_corners, decoded at
 * prepare. */
struct ag_params {
    int n, align_corners;
    int64_t sz[5];
};

static int ag_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct ag_params p;
    p.n = ag_size(c, p.sz);
    if (p.n < 0) return p.n;
    p.align_corners = (int)node_attr_int(c->node, "align_corners", 0);
    return params_keep(c, &p, sizeof p, state);
}

static int ag_run(struct op_call *c) {
    const struct ag_params *p = c->state;
    const int64_t *sz = p->sz;
    int n = p->n;
    const struct tensor *th = c->in[0];
    struct tensor *o = c->out[0];
    int sp = n - 2, ac = p->align_corners;
    int64_t D = sp == 3 ? sz[2] : 1, H = sz[n - 2], W = sz[n - 1], at = 0;
    for (int64_t b = 0; b < sz[0]; b++)
        for (int64_t z = 0; z < D; z++)
            for (int64_t y = 0; y < H; y++)
                for (int64_t x = 0; x < W; x++) {
                    /* homogeneous point: (x, y[, z], 1), innermost axis first */
                    double hp[4] = {ag_coord(x, W, ac), ag_coord(y, H, ac), sp == 3 ? ag_coord(z, D, ac) : 1, 1};
                    for (int r = 0; r < sp; r++) {
                        double acc = 0;
                        for (int k = 0; k <= sp; k++) acc += op_double_at(th, (b * sp + r) * (sp + 1) + k) * hp[k];
                        shape_store_double(o->dtype, o->data, at++, acc);
                    }
                }
    return 0;
}

/* ------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------ */

const struct op_def op_defs_grid[] = {
    {"GridSample", "", gs_infer, gs_prepare, gs_run, op_params_free, 0},
    {"AffineGrid", "", ag_infer, ag_prepare, ag_run, op_params_free, 0},
    {0},
};
