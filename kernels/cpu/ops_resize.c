/* ops_resize.c - Resize and Upsample (its older form): interpolation of
 * an N-D tensor to new sizes or by scales, one axis at a time. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/layout_util.h"
#include "kernels/cpu/par_util.h"
#include "kernels/cpu/params_util.h"
#include "kernels/cpu/shape_util.h"
#include "kernels/ops.h"

/* ------------------------------------------------------------------------
 * Resize, Upsample
 *
 * Interpolation is separable, so the kernel resizes one axis at a time
 * (as ONNX's reference does), in double precision between two scratch
 * buffers. Each axis gets a table of taps (source index, weight) per output
 * coordinate; nearest, linear and cubic, with or without antialiasing, only
 * differ in how that table is filled.
 * ------------------------------------------------------------------------ */

enum resize_mode { RZ_NEAREST, RZ_LINEAR, RZ_CUBIC };
enum resize_ctm { CT_HALF_PIXEL, CT_ASYMMETRIC, CT_ALIGN_CORNERS, CT_PYTORCH_HALF_PIXEL, CT_TF_HALF_PIXEL_NEAREST,
                  CT_TF_CROP_AND_RESIZE, CT_HALF_PIXEL_SYMMETRIC };
enum resize_round { RN_PREFER_FLOOR, RN_PREFER_CEIL, RN_FLOOR, RN_CEIL };

struct resize_params {
    int r;
    int64_t out[TENSOR_MAX_DIMS];
    double scale[TENSOR_MAX_DIMS], roi0[TENSOR_MAX_DIMS], roi1[TENSOR_MAX_DIMS];
    int active[TENSOR_MAX_DIMS];
    enum resize_mode mode;
    enum resize_ctm ctm;
    enum resize_round nearest;
    double cubic_a, extrapolation;
    int exclude_outside, antialias;
    int nhwc; /* X and Y channels-last (kiln_layout 3): the per-axis fields above are in NHWC order */
};

static int resize_read_floats(struct op_call *c, int i, const char *what, double *v, int max) {
    int rc = need_const(c, i, what);
    if (rc) return rc;
    const struct tensor *t = c->in[i];
    int64_t n = tensor_numel(t);
    if (n > max) return op_error(c, "%s has %lld values; at most %d are supported", what, (long long)n, max);
    for (int64_t k = 0; k < n; k++) v[k] = op_double_at(t, k);
    return (int)n;
}

static int resize_params(struct op_call *c, struct resize_params *p) {
    const struct tensor *x = c->in[0];
    int r = x->ndim, upsample = strcmp(c->node->op_type, "Upsample") == 0, opset = c->node->opset;
    memset(p, 0, sizeof *p);
    p->r = r;
    const char *mode = node_attr_str(c->node, "mode", "nearest");
    if (!strcmp(mode, "nearest")) p->mode = RZ_NEAREST;
    else if (!strcmp(mode, "linear") || !strcmp(mode, "bilinear")) p->mode = RZ_LINEAR;
    else if (!strcmp(mode, "cubic") && !upsample) p->mode = RZ_CUBIC;
    else return op_error(c, "unknown mode '%s'", mode);
    double scales[2 * TENSOR_MAX_DIMS], roi[2 * TENSOR_MAX_DIMS];
    int64_t sizes[TENSOR_MAX_DIMS], axes[TENSOR_MAX_DIMS];
    int ns = -1, nz = -1, nr = -1, na = -1;
    if (upsample || opset < 11) {
        /* Upsample and Resize-10: scales only, asymmetric coordinates, floor. */
        p->ctm = CT_ASYMMETRIC;
        p->nearest = RN_FLOOR;
        p->cubic_a = -0.75;
        if (upsample && opset < 9) {
            const float *f;
            ns = node_attr_floats(c->node, "scales", &f);
            if (ns < 0) return op_error(c, "attribute 'scales' is required");
            if (ns > TENSOR_MAX_DIMS) return op_error(c, "too many scales");
            for (int k = 0; k < ns; k++) scales[k] = f[k];
        } else {
            ns = resize_read_floats(c, 1, "scales", scales, TENSOR_MAX_DIMS);
            if (ns < 0) return ns;
        }
    } else {
        const char *ctm = node_attr_str(c->node, "coordinate_transformation_mode", "half_pixel");
        if (!strcmp(ctm, "half_pixel")) p->ctm = CT_HALF_PIXEL;
        else if (!strcmp(ctm, "asymmetric")) p->ctm = CT_ASYMMETRIC;
        else if (!strcmp(ctm, "align_corners")) p->ctm = CT_ALIGN_CORNERS;
        else if (!strcmp(ctm, "pytorch_half_pixel")) p->ctm = CT_PYTORCH_HALF_PIXEL;
        else if (!strcmp(ctm, "tf_half_pixel_for_nearest")) p->ctm = CT_TF_HALF_PIXEL_NEAREST;
        else if (!strcmp(ctm, "tf_crop_and_resize")) p->ctm = CT_TF_CROP_AND_RESIZE;
        else if (!strcmp(ctm, "half_pixel_symmetric")) p->ctm = CT_HALF_PIXEL_SYMMETRIC;
        else return op_error(c, "unknown coordinate_transformation_mode '%s'", ctm);
        const char *nm = node_attr_str(c->node, "nearest_mode", "round_prefer_floor");
        if (!strcmp(nm, "round_prefer_floor")) p->nearest = RN_PREFER_FLOOR;
        else if (!strcmp(nm, "round_prefer_ceil")) p->nearest = RN_PREFER_CEIL;
        else if (!strcmp(nm, "floor")) p->nearest = RN_FLOOR;
        else if (!strcmp(nm, "ceil")) p->nearest = RN_CEIL;
        else return op_error(c, "unknown nearest_mode '%s'", nm);
        p->cubic_a = node_attr_float(c->node, "cubic_coeff_a", -0.75f);
        p->exclude_outside = (int)node_attr_int(c->node, "exclude_outside", 0);
        p->extrapolation = node_attr_float(c->node, "extrapolation_value", 0);
        p->antialias = opset >= 18 ? (int)node_attr_int(c->node, "antialias", 0) : 0;
        if (in_opt(c, 1) && tensor_numel(c->in[1]) > 0) {
            nr = resize_read_floats(c, 1, "roi", roi, 2 * TENSOR_MAX_DIMS);
            if (nr < 0) return nr;
        }
        if (in_opt(c, 2) && tensor_numel(c->in[2]) > 0) {
            ns = resize_read_floats(c, 2, "scales", scales, TENSOR_MAX_DIMS);
            if (ns < 0) return ns;
        }
        if (in_opt(c, 3) && tensor_numel(c->in[3]) > 0) {
            nz = read_int_input(c, 3, "sizes", sizes, TENSOR_MAX_DIMS);
            if (nz < 0) return nz;
        }
        if (opset >= 18) {
            na = read_int_attr(c, "axes", axes, TENSOR_MAX_DIMS);
            if (na < -1) return na;
        }
    }
    if ((ns >= 0) == (nz >= 0)) return op_error(c, "exactly one of scales and sizes must be given");
    if (na < 0) {
        na = r;
        for (int k = 0; k < r; k++) axes[k] = k;
    }
    int n = ns >= 0 ? ns : nz;
    if (n != na) return op_error(c, "%s has %d values for %d axes", ns >= 0 ? "scales" : "sizes", n, na);
    if (nr >= 0 && nr != 2 * na) return op_error(c, "roi has %d values; expected %d", nr, 2 * na);
    int is_axis[TENSOR_MAX_DIMS] = {0};
    for (int k = 0; k < r; k++) {
        p->scale[k] = 1;
        p->out[k] = x->dims[k];
        p->roi0[k] = 0;
        p->roi1[k] = 1;
    }
    for (int k = 0; k < na; k++) {
        int a = op_axis(c, axes[k], r);
        if (a < 0) return STATUS_INVALID;
        is_axis[a] = 1;
        if (nr >= 0) {
            p->roi0[a] = roi[k];
            p->roi1[a] = roi[na + k];
        }
        if (ns >= 0) {
            if (!(scales[k] > 0)) return op_error(c, "scales[%d] = %g must be positive", k, scales[k]);
            p->scale[a] = scales[k];
            if (dim_ok(c, scales[k] * (double)x->dims[a], "a resized dimension")) return STATUS_INVALID;
            p->out[a] = (int64_t)(scales[k] * (double)x->dims[a]);
        } else {
            if (dim_ok(c, (double)sizes[k], "sizes")) return STATUS_INVALID;
            p->out[a] = sizes[k];
            p->scale[a] = x->dims[a] ? (double)sizes[k] / (double)x->dims[a] : 1;
        }
    }
    if (nz >= 0 && opset >= 18) {
        const char *pol = node_attr_str(c->node, "keep_aspect_ratio_policy", "stretch");
        int larger = !strcmp(pol, "not_larger"), smaller = !strcmp(pol, "not_smaller");
        if (!larger && !smaller && strcmp(pol, "stretch")) return op_error(c, "unknown keep_aspect_ratio_policy '%s'", pol);
        if (larger || smaller) {
            double s = larger ? INFINITY : -INFINITY;
            for (int a = 0; a < r; a++)
                if (is_axis[a]) s = larger ? fmin(s, p->scale[a]) : fmax(s, p->scale[a]);
            for (int a = 0; a < r; a++)
                if (is_axis[a]) {
                    p->scale[a] = s;
                    if (dim_ok(c, s * (double)x->dims[a] + 0.5, "a resized dimension")) return STATUS_INVALID;
                    p->out[a] = (int64_t)(s * (double)x->dims[a] + 0.5);
                }
        }
    }
    for (int a = 0; a < r; a++) {
        int same = fabs(p->scale[a] - 1) <= 1e-9 && p->out[a] == x->dims[a] &&
                   (p->ctm != CT_TF_CROP_AND_RESIZE || (fabs(p->roi0[a]) <= 1e-9 && fabs(p->roi1[a] - 1) <= 1e-9));
        p->active[a] = !same;
        if (p->active[a] && x->dims[a] == 0 && p->out[a] > 0) return op_error(c, "cannot resize empty axis %d", a);
    }
    return 0;
}

static int resize_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    struct resize_params p;
    int rc = need_bytes_dtype(c, x, "input");
    if (rc || (rc = resize_params(c, &p))) return rc;
    if (x->dtype == DT_BOOL) return op_error(c, "unsupported dtype bool");
    return set_shape(c, c->out[0], x->dtype, x->ndim, p.out);
}

/* The number of taps each output coordinate of axis a uses. */
static int64_t resize_ntaps(const struct resize_params *p, int a) {
    double s = p->scale[a] < 1 ? p->scale[a] : 1;
    if (p->mode == RZ_NEAREST) return 2;
    if (p->mode == RZ_LINEAR) return p->antialias ? 2 - 2 * (int64_t)(floor(-1 / s) + 1) : 2;
    return p->antialias ? 2 - 2 * (int64_t)(floor(-2 / s) + 1) : 4;
}

static double cubic_w(double x, double A) {
    x = fabs(x);
    if (x <= 1) return ((A + 2) * x - (A + 3)) * x * x + 1;
    if (x < 2) return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
    return 0;
}

/* Fills idx/w (n taps per output) for axis a; ext[y] marks coordinates
 * outside the input under tf_crop_and_resize. */
static void resize_taps(const struct resize_params *p, int a, int64_t in, int64_t *idx, double *w, char *ext) {
    int64_t out = p->out[a], n = resize_ntaps(p, a);
    double s = p->scale[a], ow = s * (double)in;
    for (int64_t y = 0; y < out; y++) {
        double yy = (double)y, x;
        ext[y] = 0;
        switch (p->ctm) {
        case CT_ALIGN_CORNERS: x = ow == 1 ? 0 : yy * (double)(in - 1) / (ow - 1); break;
        case CT_ASYMMETRIC: x = yy / s; break;
        case CT_TF_CROP_AND_RESIZE:
            x = ow == 1 ? (p->roi1[a] - p->roi0[a]) * (double)(in - 1) / 2
                        : yy * (p->roi1[a] - p->roi0[a]) * (double)(in - 1) / (ow - 1);
            x += p->roi0[a] * (double)(in - 1);
            ext[y] = x < 0 || x > (double)(in - 1);
            break;
        case CT_PYTORCH_HALF_PIXEL: x = ow == 1 ? -0.5 : (yy + 0.5) / s - 0.5; break;
        case CT_TF_HALF_PIXEL_NEAREST: x = (yy + 0.5) / s; break;
        case CT_HALF_PIXEL_SYMMETRIC: {
            double adj = (double)out / ow, center = (double)in / 2, off = center * (1 - adj);
            x = off + (yy + 0.5) / s - 0.5;
            break;
        }
        default: x = (yy + 0.5) / s - 0.5; break;
        }
        double fl = floor(x), ratio = x == fl ? 1 : x - fl;
        double *cw = w + y * n;
        if (p->mode == RZ_NEAREST) {
            int hi;
            if (ratio == 1) hi = 1;
            else if (p->nearest == RN_PREFER_FLOOR) hi = ratio > 0.5;
            else if (p->nearest == RN_PREFER_CEIL) hi = ratio >= 0.5;
            else hi = p->nearest == RN_CEIL;
            cw[0] = !hi;
            cw[1] = hi;
        } else if (p->mode == RZ_LINEAR && !p->antialias) {
            cw[0] = 1 - ratio;
            cw[1] = ratio;
        } else if (p->mode == RZ_CUBIC && !p->antialias) {
            for (int64_t j = 0; j < 4; j++) cw[j] = cubic_w(ratio + 1 - (double)j, p->cubic_a);
        } else {
            double sc = s < 1 ? s : 1, sum = 0;
            int64_t start = (int64_t)(floor((p->mode == RZ_LINEAR ? -1 : -2) / sc) + 1);
            for (int64_t j = 0; j < n; j++) {
                double arg = ((double)(start + j) - ratio) * sc;
                cw[j] = p->mode == RZ_LINEAR ? fmax(0, fmin(1, 1 - fabs(arg))) : cubic_w(arg, p->cubic_a);
                sum += cw[j];
            }
            for (int64_t j = 0; j < n; j++) cw[j] /= sum;
        }
        /* Neighbour positions, as the reference finds them in an edge-padded row. */
        int64_t pad = (n + 1) / 2;
        double xp = x + (double)pad, pp = floor(xp), frac = xp - pp;
        int64_t off;
        if (n % 2 == 0) off = frac == 0 ? -(n / 2) : -(n / 2) + 1;
        else off = frac <= 0.5 ? -((n - 1) / 2) : -((n - 1) / 2) + 1;
        int64_t start = (int64_t)pp + off - pad;
        double sum = 0;
        for (int64_t j = 0; j < n; j++) {
            int64_t k = start + j;
            if (p->exclude_outside && (k < 0 || k >= in)) cw[j] = 0;
            sum += cw[j];
            idx[y * n + j] = k < 0 ? 0 : (k >= in ? in - 1 : k);
        }
        if (p->exclude_outside && sum != 0)
            for (int64_t j = 0; j < n; j++) cw[j] /= sum;
    }
}

/* Scratch: two double buffers of the largest intermediate, then the taps
 * of the largest axis. */
/* X's dims in memory order. */
static void resize_in_dims(const struct tensor *x, const struct resize_params *p, int64_t *cur) {
    struct tensor v = *x;
    if (p->nhwc) layout_nhwc_view(&v, x);
    memcpy(cur, v.dims, sizeof v.dims);
}

/* Channels-last X and Y (passes_layout) resize only H and W: the per-axis
 * parameters are permuted into memory order, [N,H,W,C]. */
static void resize_to_nhwc(struct resize_params *p) {
    static const int perm[4] = {0, 2, 3, 1};
    struct resize_params q = *p;
    for (int i = 0; i < 4; i++) {
        q.out[i] = p->out[perm[i]];
        q.scale[i] = p->scale[perm[i]];
        q.roi0[i] = p->roi0[perm[i]];
        q.roi1[i] = p->roi1[perm[i]];
        q.active[i] = p->active[perm[i]];
    }
    q.nhwc = 1;
    *p = q;
}

static size_t resize_scratch(const struct tensor *x, const struct resize_params *p, int64_t *maxel) {
    int64_t cur[TENSOR_MAX_DIMS], big = tensor_numel(x), taps = 0;
    resize_in_dims(x, p, cur);
    for (int a = 0; a < p->r; a++) {
        if (!p->active[a]) continue;
        cur[a] = p->out[a];
        int64_t n = prod(cur, 0, p->r);
        big = n > big ? n : big;
        int64_t t = p->out[a] * resize_ntaps(p, a);
        taps = t > taps ? t : taps;
    }
    *maxel = big;
    int64_t outs = 0; /* resize_2d's taps of every axis */
    for (int a = 0; a < p->r; a++) outs += 2 * p->out[a];
    return (size_t)(2 * big + 2 * taps + p->r + 8 + 2 * outs) * sizeof(double) + (size_t)(taps + outs + 64);
}

/* The axis a such that only a and a + 1 may be resized, for the float
 * path below; -1 when another is, or the taps are not two per output
 * (cubic, antialiased) or can fall outside (tf_crop_and_resize). */
static int resize_2d_axis(const struct tensor *x, const struct resize_params *p) {
    if (x->dtype != DT_FP32 || p->mode == RZ_CUBIC || p->antialias || p->ctm == CT_TF_CROP_AND_RESIZE || p->r < 2)
        return -1;
    int first = -1, last = -1;
    for (int a = 0; a < p->r; a++)
        if (p->active[a]) {
            if (first < 0) first = a;
            last = a;
        }
    if (first < 0 || last - first > 1) return -1;
    return first + 1 < p->r ? first : first - 1;
}

/* Float Resize of two adjacent axes (H and W, in either layout) with two
 * taps per output along each: one pass, each output a weighted sum of four
 * inputs, over memory viewed as [outer, H, W, inner] (inner: the channels
 * of a channels-last tensor). The separable double passes below give the
 * same values to float rounding. */
static void resize_2d(struct op_call *c, const struct resize_params *p, const int64_t *cur, int a, double *buf) {
    int64_t ih = cur[a], iw = cur[a + 1], oh = p->out[a], ow = p->out[a + 1];
    int64_t outer = prod(cur, 0, a), inner = prod(cur, a + 2, p->r);
    double *wy = buf, *wx = wy + 2 * oh;
    int64_t *iy = (int64_t *)(void *)(wx + 2 * ow), *ix = iy + 2 * oh;
    char *ext = (char *)(ix + 2 * ow);
    resize_taps(p, a, ih, iy, wy, ext);
    resize_taps(p, a + 1, iw, ix, wx, ext);
    const float *src = c->in[0]->data;
    float *dst = c->out[0]->data;
    PAR_FOR(outer * oh * ow * inner > 16384, c->nthreads, ,
        for (int64_t qy = 0; qy < outer * oh; qy++) {
            int64_t q = qy / oh, y = qy % oh;
            const float *r0 = src + (q * ih + iy[2 * y]) * iw * inner, *r1 = src + (q * ih + iy[2 * y + 1]) * iw * inner;
            float wy0 = (float)wy[2 * y], wy1 = (float)wy[2 * y + 1];
            float *d = dst + (q * oh + y) * ow * inner;
            if (inner == 1) { /* plain NCHW: rows of single values */
                for (int64_t xo = 0; xo < ow; xo++) {
                    int64_t x0 = ix[2 * xo], x1 = ix[2 * xo + 1];
                    float a = (float)wx[2 * xo], b = (float)wx[2 * xo + 1];
                    d[xo] = wy0 * (a * r0[x0] + b * r0[x1]) + wy1 * (a * r1[x0] + b * r1[x1]);
                }
                continue;
            }
            for (int64_t xo = 0; xo < ow; xo++) {
                int64_t x0 = ix[2 * xo] * inner, x1 = ix[2 * xo + 1] * inner;
                float w00 = wy0 * (float)wx[2 * xo], w01 = wy0 * (float)wx[2 * xo + 1];
                float w10 = wy1 * (float)wx[2 * xo], w11 = wy1 * (float)wx[2 * xo + 1];
                float *dd = d + xo * inner;
                for (int64_t i = 0; i < inner; i++)
                    dd[i] = w00 * r0[x0 + i] + w01 * r0[x1 + i] + w10 * r1[x0 + i] + w11 * r1[x1 + i];
            }
        });
}

/* The parameters (attributes, and the constant roi, scales and sizes)
 * are decoded once, at prepare. */
static int resize_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct resize_params p;
    int64_t big;
    int rc = resize_params(c, &p);
    if (rc) return rc;
    if (layout_of(c->node) == 3) {
        if (p.r != 4 || p.active[0] || p.active[1])
            return op_error(c, "a channels-last input can be resized along H and W only");
        resize_to_nhwc(&p);
    }
    *scratch = resize_scratch(c->in[0], &p, &big);
    return params_keep(c, &p, sizeof p, state);
}

static int resize_run(struct op_call *c) {
    const struct tensor *x = c->in[0];
    struct tensor *o = c->out[0];
    const struct resize_params p = *(const struct resize_params *)c->state;
    int64_t big;
    if (!c->scratch || c->scratch_size < resize_scratch(x, &p, &big)) return op_error(c, "scratch buffer too small");
    if (tensor_numel(o) == 0) return 0;
    double *b0 = c->scratch, *b1 = b0 + big, *w = b1 + big;
    int64_t maxtaps = 0;
    for (int a = 0; a < p.r; a++)
        if (p.active[a] && p.out[a] * resize_ntaps(&p, a) > maxtaps) maxtaps = p.out[a] * resize_ntaps(&p, a);
    int64_t *idx = (int64_t *)(void *)(w + maxtaps);
    char *ext = (char *)(idx + maxtaps);
    int64_t cur[TENSOR_MAX_DIMS];
    resize_in_dims(x, &p, cur);
    int a2 = resize_2d_axis(x, &p);
    if (a2 >= 0) {
        resize_2d(c, &p, cur, a2, b0);
        return 0;
    }
    int64_t n = tensor_numel(x);
    for (int64_t i = 0; i < n; i++) b0[i] = op_double_at(x, i);
    double *src = b0, *dst = b1;
    for (int a = 0; a < p.r; a++) {
        if (!p.active[a]) continue;
        int64_t in = cur[a], out = p.out[a], nt = resize_ntaps(&p, a);
        int64_t outer = prod(cur, 0, a), inner = prod(cur, a + 1, p.r);
        resize_taps(&p, a, in, idx, w, ext);
        PAR_FOR(outer * out * inner > 16384, c->nthreads, ,
            for (int64_t q = 0; q < outer; q++)
                for (int64_t y = 0; y < out; y++) {
                    double *d = dst + (q * out + y) * inner;
                    if (ext[y]) {
                        for (int64_t i = 0; i < inner; i++) d[i] = p.extrapolation;
                        continue;
                    }
                    for (int64_t i = 0; i < inner; i++) d[i] = 0;
                    for (int64_t j = 0; j < nt; j++) {
                        double cw = w[y * nt + j];
                        if (cw == 0) continue;
                        const double *s = src + (q * in + idx[y * nt + j]) * inner;
                        for (int64_t i = 0; i < inner; i++) d[i] += cw * s[i];
                    }
                });
        cur[a] = out;
        double *t = src;
        src = dst;
        dst = t;
    }
    int64_t m = tensor_numel(o);
    int isint = !is_float_dtype(o->dtype);
    for (int64_t i = 0; i < m; i++) {
        double v = src[i];
        if (isint) v = nearbyint(v);
        switch (o->dtype) { /* saturate integers, as ONNX's reference does */
        case DT_UINT8: v = v < 0 ? 0 : (v > 255 ? 255 : v); break;
        case DT_INT8: v = v < -128 ? -128 : (v > 127 ? 127 : v); break;
        default: break;
        }
        shape_store_double(o->dtype, o->data, i, v);
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------ */

const struct op_def op_defs_resize[] = {
    {"Resize", "", resize_infer, resize_prepare, resize_run, op_params_free, 0},
    {"Upsample", "", resize_infer, resize_prepare, resize_run, op_params_free, 0},
    {0},
};
