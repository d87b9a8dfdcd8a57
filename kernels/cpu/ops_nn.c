/* ops_nn.c - the neural-network family: Conv, ConvTranspose, MatMul, Gemm,
 * their integer and quantized forms (ConvInteger, QLinearConv,
 * MatMulInteger, QLinearMatMul),
 * DeformConv, MaxPool, AveragePool, LpPool, MaxUnpool, the global pools,
 * RoiAlign, Col2Im, BatchNormalization, InstanceNormalization,
 * GroupNormalization, LRN.
 *
 * The heavy ops (Conv, MatMul, Gemm, MaxPool, AveragePool) run on oneDNN:
 * prepare() builds the primitive once per plan with the concrete shapes,
 * reorders constant weights once into the layout the primitive prefers, and
 * asks for the scratchpad (and any reorder buffers) as plan scratch; run()
 * only hands pointers over (see dnnl_util.h). Activations between ops stay
 * in the plain ONNX layout (NCHW...); a convolution that is faster on
 * oneDNN's blocked layouts reorders in and out of scratch around itself.
 * Memory-bound ops whose oneDNN versions gain nothing (BatchNormalization in
 * inference, global pools, the normalizations, LRN), the rare ones, the
 * ConvTranspose and pooling corners oneDNN does not express are C loops.
 *
 * Every op here computes in float32 (MaxPool also passes 8-bit integers
 * through exactly; without FMA, a Conv's quantization round trip sums its
 * near ties again in double: conv_qdq_after). */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define NN_X86 1
#endif

#include "common/log.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/elementwise_util.h"
#include "kernels/cpu/gemv.h"
#include "kernels/cpu/layout_util.h"
#include "kernels/cpu/matmul_util.h"
#include "kernels/cpu/par_util.h"
#include "kernels/ops.h"

/* ==== shared helpers ==================================================== */

static int need_f32(struct op_call *c, const struct tensor *t, const char *what) {
    if (t->dtype != DT_FP32) {
        op_error(c, "%s must be float32 (got %s)", what, dtype_name(t->dtype));
        return STATUS_UNSUPPORTED;
    }
    return 0;
}

static const struct tensor *opt_in(const struct op_call *c, int i) {
    return i < c->nin ? c->in[i] : NULL;
}

static int has_out(const struct op_call *c, int i) {
    return i < c->nout && c->out[i] != NULL;
}

/* Sliding-window geometry shared by Conv, ConvTranspose and the pools. */
#define WIN_MAX 3
struct win {
    int nsp;                                      /* spatial dims (1..3) */
    int64_t in[WIN_MAX], k[WIN_MAX], s[WIN_MAX], d[WIN_MAX];
    int64_t pl[WIN_MAX], pr[WIN_MAX];            /* ONNX pads (begin, end) */
    int64_t out[WIN_MAX];
};

enum win_pad { WIN_PAD_NOTSET, WIN_PAD_SAME_UPPER, WIN_PAD_SAME_LOWER, WIN_PAD_VALID };

/* A window's attributes as the node gives them, their lengths checked
 * against nsp spatial dims; a length is -1 where the attribute is absent. */
struct win_attrs {
    int nk, ns, nd, np;
    const int64_t *ks, *st, *dl, *pd;
    enum win_pad pad;
};

static int win_attrs_read(struct op_call *c, int nsp, struct win_attrs *a) {
    const struct graph_node *n = c->node;
    a->ks = a->st = a->dl = a->pd = NULL;
    a->nk = node_attr_ints(n, "kernel_shape", &a->ks);
    a->ns = node_attr_ints(n, "strides", &a->st);
    a->nd = node_attr_ints(n, "dilations", &a->dl);
    a->np = node_attr_ints(n, "pads", &a->pd);
    if (a->nk >= 0 && a->nk != nsp) return op_error(c, "kernel_shape has %d values for %d spatial dims", a->nk, nsp);
    if (a->ns >= 0 && a->ns != nsp) return op_error(c, "strides has %d values for %d spatial dims", a->ns, nsp);
    if (a->nd >= 0 && a->nd != nsp) return op_error(c, "dilations has %d values for %d spatial dims", a->nd, nsp);
    if (a->np >= 0 && a->np != 2 * nsp) return op_error(c, "pads has %d values, expected %d", a->np, 2 * nsp);
    const char *ap = node_attr_str(n, "auto_pad", "NOTSET");
    if (strcmp(ap, "SAME_UPPER") == 0) a->pad = WIN_PAD_SAME_UPPER;
    else if (strcmp(ap, "SAME_LOWER") == 0) a->pad = WIN_PAD_SAME_LOWER;
    else if (strcmp(ap, "VALID") == 0) a->pad = WIN_PAD_VALID;
    else if (strcmp(ap, "NOTSET") == 0 || ap[0] == '\0') a->pad = WIN_PAD_NOTSET;
    else return op_error(c, "unknown auto_pad '%s'", ap);
    return 0;
}

/* Stride, dilation and explicit pads along spatial dim i: 1, 1 and 0 where
 * the attributes are absent, no pads under VALID. Returns whether they and
 * the kernel extent k are sane (positive, pads >= 0, none above 2^20). */
static int win_attrs_dim(const struct win_attrs *a, int nsp, int i, int64_t k, int64_t *s, int64_t *d, int64_t *pl,
                         int64_t *pr) {
    int pads = a->np >= 0 && a->pad != WIN_PAD_VALID;
    *s = a->ns >= 0 ? a->st[i] : 1;
    *d = a->nd >= 0 ? a->dl[i] : 1;
    *pl = pads ? a->pd[i] : 0;
    *pr = pads ? a->pd[nsp + i] : 0;
    const int64_t lim = 1 << 20;
    return k >= 1 && *s >= 1 && *d >= 1 && *pl >= 0 && *pr >= 0 && k <= lim && *s <= lim && *d <= lim && *pl <= lim &&
           *pr <= lim;
}

/* Reads kernel_shape (or takes kshape when the op derives it, as Conv does
 * from W), strides, dilations, pads and auto_pad, and computes the output
 * extents of x's spatial dims. ceil_mode applies to the pools. */
static int win_setup(struct op_call *c, const struct tensor *x, const int64_t *kshape, int ceil_mode, struct win *w) {
    memset(w, 0, sizeof *w);
    w->nsp = x->ndim - 2;
    if (w->nsp < 1 || w->nsp > WIN_MAX)
        return op_error(c, "input must have 1 to 3 spatial dims (rank 3 to 5), got rank %d", x->ndim);
    struct win_attrs a;
    int rc = win_attrs_read(c, w->nsp, &a);
    if (rc) return rc;
    if (a.nk < 0 && !kshape) return op_error(c, "kernel_shape attribute is required");
    for (int i = 0; i < w->nsp; i++) {
        w->in[i] = x->dims[2 + i];
        w->k[i] = kshape ? kshape[i] : a.ks[i];
        if (kshape && a.nk >= 0 && a.ks[i] != kshape[i])
            return op_error(c, "kernel_shape[%d] = %lld disagrees with the weights (%lld)", i, (long long)a.ks[i],
                            (long long)kshape[i]);
        if (!win_attrs_dim(&a, w->nsp, i, w->k[i], &w->s[i], &w->d[i], &w->pl[i], &w->pr[i]))
            return op_error(c, "bad window along spatial dim %d: kernel %lld, stride %lld, dilation %lld, pads %lld/%lld",
                            i, (long long)w->k[i], (long long)w->s[i], (long long)w->d[i], (long long)w->pl[i],
                            (long long)w->pr[i]);
        int64_t dk = (w->k[i] - 1) * w->d[i] + 1;
        if (w->in[i] < 0) {
            w->out[i] = -1;
            continue;
        }
        if (a.pad == WIN_PAD_SAME_UPPER || a.pad == WIN_PAD_SAME_LOWER) {
            w->out[i] = (w->in[i] + w->s[i] - 1) / w->s[i];
            int64_t total = (w->out[i] - 1) * w->s[i] + dk - w->in[i];
            if (total < 0) total = 0;
            w->pl[i] = a.pad == WIN_PAD_SAME_UPPER ? total / 2 : total - total / 2;
            w->pr[i] = total - w->pl[i];
            continue;
        }
        int64_t span = w->in[i] + w->pl[i] + w->pr[i] - dk;
        if (span < 0)
            return op_error(c, "window %lld is larger than the padded input %lld along spatial dim %d", (long long)dk,
                            (long long)(w->in[i] + w->pl[i] + w->pr[i]), i);
        if (ceil_mode) {
            w->out[i] = (span + w->s[i] - 1) / w->s[i] + 1;
            /* The last window must start inside the input or its left padding. */
            if ((w->out[i] - 1) * w->s[i] >= w->in[i] + w->pl[i]) w->out[i]--;
        } else {
            w->out[i] = span / w->s[i] + 1;
        }
    }
    return 0;
}

/* Right padding that makes oneDNN's floor rule produce exactly w->out. */
static int64_t win_dnnl_pr(const struct win *w, int i) {
    return (w->out[i] - 1) * w->s[i] + (w->k[i] - 1) * w->d[i] + 1 - w->in[i] - w->pl[i];
}

static int64_t prod(const int64_t *d, int n) {
    int64_t p = 1;
    for (int i = 0; i < n; i++) p *= d[i];
    return p;
}

/* A convolution's geometry, decoded once at prepare: the window and the
 * groups. For ConvTranspose, in and out are X's and Y's spatial extents
 * and pr the right padding they imply (see ctr_setup). */
struct conv_geom {
    struct win win;
    int64_t group;
};

/* Reads the groups and the window of W's kernel over X (Conv, ConvInteger,
 * QLinearConv, DeformConv). */
static int conv_geom_read(struct op_call *c, const struct tensor *x, const struct tensor *w, struct conv_geom *g) {
    g->group = node_attr_int(c->node, "group", 1);
    if (g->group < 1) return op_error(c, "group must be >= 1 (got %lld)", (long long)g->group);
    return win_setup(c, x, w->dims + 2, 0, &g->win);
}

/* ==== Conv ============================================================== */

/* A live tap of a dilated convolution run as products (conv_taps_build). */
struct conv_tap {
    int64_t oy0, oy1, ox0, ox1; /* output rectangle the tap reads inside the map */
    int64_t dy, dx;             /* input position = output position + (dy, dx) */
    int64_t k;                  /* the tap's index in the window, row-major */
};
struct conv_taps {
    int ntap;
    struct conv_tap tap[64];
    float *w;          /* [ntap][M][C] */
    int64_t maxp;      /* the largest rectangle, positions */
    int64_t lay;       /* the node's kiln_layout: X (1) and Y (2) channels-last */
};

/* Conv's and ConvTranspose's prepared state. */
struct conv_state {
    struct conv_geom g;
    struct dnnl_prim *conv;                      /* NULL: ConvTranspose's loop */
    struct dnnl_prim *src_reorder, *dst_reorder; /* plain <-> blocked, when used */
    struct dnnl_prim *w_reorder;                 /* weights known only at run time, to blocked */
    struct dnnl_prim *z_reorder;                 /* a residual Z into the blocked destination (sum, dst_reorder) */
    int sum;                                     /* Y = conv + Z (input 3, passes_fuse_residual): a sum post-op */
    void *wbuf;                                  /* weights in the primitive's layout (shared, see dnnl_util_weights_acquire) */
    float *wcrop;                                /* constant weights without their dead taps (conv_crop) */
    int const_weights;
    int act_after;                               /* apply node->act after oneDNN */
    int qdq_after;                               /* apply ACT_QDQ after oneDNN, near ties summed exactly */
    int nargs;
    size_t off_src, off_dst, off_w, off_pad;     /* scratch layout */
    struct convi_state *exact;                   /* QLinearConv's exact 8-bit GEMM, or NULL */
    int patches;                                 /* ConvTranspose as one product and a scatter (ctr_patches_ok) */
    size_t src_t2d, dst_t2d;                     /* element size when a reorder is plain <-> channels-last */
    struct conv_taps *taps;                      /* a product per live tap instead of oneDNN (conv_taps_build) */
};

static void convi_release(void *st);

static int conv_infer(struct op_call *c) {
    const struct tensor *x = c->in[0], *w = c->in[1], *b = opt_in(c, 2);
    int rc;
    if ((rc = need_f32(c, x, "X")) || (rc = need_f32(c, w, "W"))) return rc;
    if (w->ndim != x->ndim) return op_error(c, "W has rank %d, X has rank %d", w->ndim, x->ndim);
    struct conv_geom g;
    if ((rc = conv_geom_read(c, x, w, &g))) return rc;
    if (x->dims[1] >= 0 && x->dims[1] != w->dims[1] * g.group)
        return op_error(c, "X has %lld channels but W expects %lld x group %lld", (long long)x->dims[1],
                        (long long)w->dims[1], (long long)g.group);
    if (w->dims[0] % g.group) return op_error(c, "W has %lld output channels, not a multiple of group %lld",
                                              (long long)w->dims[0], (long long)g.group);
    if (b && (b->ndim != 1 || b->dims[0] != w->dims[0]))
        return op_error(c, "B must be 1-D of %lld values", (long long)w->dims[0]);
    if (b && (rc = need_f32(c, b, "B"))) return rc;
    struct tensor *y = c->out[0];
    y->dtype = DT_FP32;
    y->ndim = x->ndim;
    y->dims[0] = x->dims[0];
    y->dims[1] = w->dims[0];
    for (int i = 0; i < g.win.nsp; i++) y->dims[2 + i] = g.win.out[i];
    /* The residual Z that passes_fuse_residual moved in from an Add: Y's
     * shape exactly (the pass checks it; a file's Conv has no input 3). */
    const struct tensor *z = opt_in(c, 3);
    if (z) {
        char sz[128], sy[128];
        if (!node_attr_int(c->node, "kiln_residual", 0))
            return op_error(c, "Conv takes 2 or 3 inputs, not %d", c->nin);
        if (z->dtype != DT_FP32 || !tensor_same_shape(z, y))
            return op_error(c, "residual Z %s must be float32 of the output's shape %s",
                            tensor_shape_str(z, sz, sizeof sz), tensor_shape_str(y, sy, sizeof sy));
    }
    return 0;
}

static void conv_release(void *st) {
    struct conv_state *s = st;
    if (!s) return;
    dnnl_prim_free(s->conv);
    dnnl_prim_free(s->src_reorder);
    dnnl_prim_free(s->dst_reorder);
    dnnl_prim_free(s->w_reorder);
    dnnl_prim_free(s->z_reorder);
    dnnl_util_weights_release(s->wbuf);
    free(s->wcrop);
    convi_release(s->exact);
    if (s->taps) free(s->taps->w);
    free(s->taps);
    free(s);
}

/* Whether to run a convolution on oneDNN's blocked layouts (its brgemm
 * kernels), reordering the plain activations in and out around it, or on
 * the plain layout (oneDNN's GEMM path). Measured on ResNet-50's layers at
 * batch 1 and 8: spatial kernels run 1.3-1.9x faster blocked, reorders
 * included; 1x1 convolutions are a GEMM over the plain layout already and
 * only win blocked on small maps that expand channels.
 *
 * Where oneDNN runs AVX2 code every convolution runs blocked. Its AVX2 GEMM
 * puts output channels along the columns that its tail kernels round
 * differently (see dnnl_util_isa_avx2), so identical filters gave unequal
 * channels: ONNX's light SqueezeNet ties its 1000 logits at ~1e10, where
 * one rounding step is 1024, and Softmax turned that last bit into wrong
 * probabilities. The blocked kernels keep channels in vector lanes that run
 * the same instructions, and on AVX2 they cost nothing: with one thread,
 * SqueezeNet, ResNet-50, Inception v1 and DenseNet-121 took 0-3% less CPU
 * time all blocked than with their 1x1 convolutions on the GEMM (SqueezeNet
 * at batch 8 too). Grouped convolutions whose groups are not whole blocks
 * of 8 channels have no blocked kernel there and stay on the GEMM.
 *
 * KILN_CONV_LAYOUT=plain|blocked overrides the choice (for measurements);
 * Winograd (below) also needs the blocked layout. */
static int conv_use_blocked(const struct win *win, int64_t ic, int64_t oc) {
    const char *e = getenv("KILN_CONV_LAYOUT");
    if (e && strcmp(e, "plain") == 0) return 0;
    if (e && strcmp(e, "blocked") == 0) return 1;
    if (dnnl_util_isa_avx2()) return 1;
    int64_t kvol = 1, ovol = 1;
    for (int i = 0; i < win->nsp; i++) {
        kvol *= win->k[i];
        ovol *= win->out[i];
    }
    if (kvol > 1) return 1;
    return ovol <= 64 && oc > ic;
}

/* Whether to try oneDNN's Winograd kernels (F(2x2,3x3), F(4x4,3x3)): 3x3
 * stride-1 undilated 2-D convolutions then do about half the
 * multiplications, measured 1.7-2x faster on ResNet-50's 3x3 layers at
 * batch 1, differing from direct by at most 3e-6 of the output's range on
 * those layers. oneDNN refuses the shapes it has no kernel for (few
 * channels, groups), and those run direct. An input of few channels (an
 * image's first layer, a CRNN's grey line: 1 channel) saves almost no
 * multiplications and still pays every tile's transforms: the 1-to-16
 * channel 3x3 layer of a 32x128 line took 0.17 ms in Winograd, 3x direct.
 * KILN_CONV_WINOGRAD=0 turns it off. */
static int conv_use_winograd(const struct win *win, int64_t batch, int64_t group, int64_t ic) {
    const char *e = getenv("KILN_CONV_WINOGRAD");
    if (e && strcmp(e, "0") == 0) return 0;
    if (win->nsp != 2 || group != 1 || ic < 8) return 0;
    for (int i = 0; i < 2; i++)
        if (win->k[i] != 3 || win->s[i] != 1 || win->d[i] != 1) return 0;
    /* oneDNN transforms the weights slowly (~100 ms for 512x512x3x3, at
     * every plan: its layout depends on the batch), and a 7x7 map at batch
     * 1 gains only ~0.1 ms per run: skip maps that small. */
    return batch * win->out[0] * win->out[1] >= 196;
}

/* Creates a reorder between two layouts as a dnnl_prim (args FROM, TO). */
static struct dnnl_prim *reorder_prim(struct op_call *c, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                                      size_t *scratch) {
    dnnl_primitive_attr_t attr = dnnl_util_attr();
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s = attr ? dnnl_reorder_primitive_desc_create(&pd, from, dnnl_util_engine(), to, dnnl_util_engine(), attr)
                           : dnnl_out_of_memory;
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) {
        dnnl_util_fail(c, "dnnl_reorder_primitive_desc_create", s);
        return NULL;
    }
    int ids[2] = {DNNL_ARG_FROM, DNNL_ARG_TO};
    struct dnnl_prim *p = dnnl_prim_create(c, pd, 2, ids, scratch);
    dnnl_primitive_desc_destroy(pd);
    return p;
}

/* Builds the attribute of a primitive that fuses node->act; sets *after
 * when the activation must be applied by op_apply_act() instead. */
static dnnl_primitive_attr_t act_attr(struct op_call *c, int with_sum, float sum_scale, int *after) {
    dnnl_primitive_attr_t attr = dnnl_util_attr();
    dnnl_post_ops_t po = NULL;
    *after = 0;
    if (!attr || dnnl_post_ops_create(&po) != dnnl_success) goto fail;
    if (with_sum && dnnl_post_ops_append_sum(po, sum_scale) != dnnl_success) goto fail;
    /* GELU after a MatMul or Gemm on kiln's own loop (op_apply_act) with
     * AVX-512: 0.39-0.44 ns a value against 0.59-0.66 for oneDNN 2.6's
     * gelu_erf post-op on the same products (transformers' first MLP
     * layer, 64 to 1500 rows, an AMD EPYC; with AVX2 neither is ahead).
     * SiLU too where the step runs on one thread (sigmoid_vec.c): the
     * convolutions of YOLOv8s 3.6 -> 2.9 ms a run, MobileViT-XXS's 6.3 ->
     * 5.5, EfficientNet-B0's 12.3-13.3 -> 11.4-11.9 against oneDNN's
     * swish post-op. On two threads the pass after the primitive, a second
     * parallel region that reads what the other core wrote, lost as often
     * as it won (YOLOv8s 1.9 -> 2.5 ms); with AVX2 neither was ahead. */
    const int isa = dnnl_util_isa_level();
    int r = (c->node->act == ACT_GELU && !c->node->domain[0] &&
             (!strcmp(c->node->op_type, "MatMul") || !strcmp(c->node->op_type, "Gemm")) && isa >= 4) ||
                    (c->node->act == ACT_SILU && c->nthreads <= 1 && isa >= 4)
                ? 0
                : dnnl_util_append_act(po, c->node->act, c->node->act_alpha, c->node->act_beta);
    if (r < 0) goto fail;
    if (r == 0) *after = 1;
    /* the scale and shift after the activation: one linear post-op (op_apply_act's when the activation runs after) */
    if (r > 0 && c->node->act_affine &&
        dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, c->node->act_scale, c->node->act_shift) != dnnl_success)
        goto fail;
    if (dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success) goto fail;
    dnnl_post_ops_destroy(po);
    return attr;
fail:
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    op_error(c, "could not build oneDNN attributes");
    return NULL;
}

/* What Conv and ConvTranspose hand oneDNN: the activations plain (ONNX's
 * layout) and "any" (the primitive's choice), the weights as the op lays
 * them out (w_user) and "any", the bias, and the window's strides,
 * dilations (less one, oneDNN's convention) and pads. */
struct conv_desc {
    dnnl_memory_desc_t src_plain, dst_plain, src_any, dst_any, w_user, w_any, b;
    int has_b;
    dnnl_dims_t strides, dil, pl, pr;
};

/* Fills d for X, Y, the optional bias B, the weights w_user and window w;
 * -1 when oneDNN cannot describe a tensor. */
static int conv_desc_init(struct conv_desc *d, const struct tensor *x, const struct tensor *y, const struct tensor *b,
                          const dnnl_memory_desc_t *w_user, const struct win *w) {
    d->w_user = *w_user;
    d->has_b = b != NULL;
    for (int i = 0; i < w->nsp; i++) {
        d->strides[i] = w->s[i];
        d->dil[i] = w->d[i] - 1;
        d->pl[i] = w->pl[i];
        d->pr[i] = w->pr[i];
    }
    if (dnnl_util_plain_md(&d->src_plain, x->ndim, x->dims) || dnnl_util_plain_md(&d->dst_plain, y->ndim, y->dims) ||
        (b && dnnl_util_plain_md(&d->b, 1, b->dims)) || dnnl_util_any_md(&d->src_any, x->ndim, x->dims) ||
        dnnl_util_any_md(&d->dst_any, y->ndim, y->dims) || dnnl_util_any_md(&d->w_any, w_user->ndims, w_user->dims))
        return -1;
    return 0;
}

/* X (bit 1 of lay, the node's kiln_layout) and Y (bit 2) stored
 * channels-last (passes_layout, passes_qdq_layout): src_plain and
 * dst_plain describe them so, and the primitive takes them as they are. */
static int conv_desc_layout(struct conv_desc *d, const struct tensor *x, const struct tensor *y, int64_t lay) {
    if ((lay & 1) && (x->ndim != 4 || dnnl_util_nhwc_md(&d->src_plain, x->dims, d->src_plain.data_type))) return -1;
    if ((lay & 2) && (y->ndim != 4 || dnnl_util_nhwc_md(&d->dst_plain, y->dims, d->dst_plain.data_type))) return -1;
    return 0;
}

/* A reorder between a plain layout and the primitive's (into the
 * primitive's when to_prim), or none when they are the same; *bytes is
 * the scratch the primitive-side buffer takes, *scr the reorder's
 * scratchpad. */
/* The element size when prim is plain's dims stored densely channels-last
 * (nwc, nhwc, ndhwc), else 0: a reorder between them is a transpose of each
 * image's [C, spatial] matrix, which cpu_transpose_2d does in cache-sized
 * tiles (oneDNN's reorder took 0.66 ms for magika's 512 x 508 output, 3 GB/s). */
static size_t conv_t2d(const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *prim) {
    static const dnnl_format_tag_t cl[6] = {0, 0, 0, dnnl_acb, dnnl_acdb, dnnl_acdeb};
    dnnl_memory_desc_t m;
    if (plain->ndims < 3 || plain->ndims > 5 ||
        dnnl_memory_desc_init_by_tag(&m, plain->ndims, plain->dims, plain->data_type, cl[plain->ndims]) != dnnl_success ||
        !dnnl_memory_desc_equal(&m, prim))
        return 0;
    return dnnl_data_type_size(plain->data_type);
}

static int conv_reorder(struct op_call *c, const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *prim, int to_prim,
                        struct dnnl_prim **p, size_t *bytes, size_t *scr) {
    if (dnnl_memory_desc_equal(prim, plain)) return 0;
    *p = to_prim ? reorder_prim(c, plain, prim, scr) : reorder_prim(c, prim, plain, scr);
    *bytes = dnnl_memory_desc_get_size(prim);
    return *p ? 0 : STATUS_INTERNAL;
}

/* Completes s from the convolution's primitive descriptor: the primitive;
 * constant weights (w, when s->const_weights) reordered once into its
 * layout and bound; weights computed at run time reordered at every run,
 * as blocked activations are (with plain weights oneDNN would pick its
 * GEMM); and the scratch layout: src, dst and weights buffers, then one
 * scratchpad the primitive and the reorders share. */
static int conv_finish(struct op_call *c, struct conv_state *s, const_dnnl_primitive_desc_t pd,
                       const struct conv_desc *d, const void *w, size_t *scratch_size) {
    int ids[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    size_t conv_scr = 0, r1 = 0, r2 = 0, r3 = 0, src_bytes = 0, dst_bytes = 0, w_bytes = 0;
    s->nargs = d->has_b ? 4 : 3;
    s->conv = dnnl_prim_create(c, pd, s->nargs, ids, &conv_scr);
    if (!s->conv) return STATUS_INTERNAL;
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *dmd = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    int rc;
    if (s->const_weights) {
        if (!dnnl_memory_desc_equal(wmd, &d->w_user) && !(s->wbuf = dnnl_util_weights_acquire(c, &d->w_user, w, wmd)))
            return STATUS_INTERNAL;
        dnnl_prim_bind(s->conv, 1, s->wbuf ? s->wbuf : (void *)w);
    } else if ((rc = conv_reorder(c, &d->w_user, wmd, 1, &s->w_reorder, &w_bytes, &r3))) {
        return rc;
    }
    if ((rc = conv_reorder(c, &d->src_plain, smd, 1, &s->src_reorder, &src_bytes, &r1)) ||
        (rc = conv_reorder(c, &d->dst_plain, dmd, 0, &s->dst_reorder, &dst_bytes, &r2)))
        return rc;
    if (s->src_reorder) s->src_t2d = conv_t2d(&d->src_plain, smd);
    if (s->dst_reorder) s->dst_t2d = conv_t2d(&d->dst_plain, dmd);
    size_t r4 = 0, z_bytes = 0;
    if (s->sum && s->dst_reorder && (rc = conv_reorder(c, &d->dst_plain, dmd, 1, &s->z_reorder, &z_bytes, &r4)))
        return rc;
    size_t pad = conv_scr > r1 ? conv_scr : r1;
    if (r4 > pad) pad = r4;
    if (r2 > pad) pad = r2;
    if (r3 > pad) pad = r3;
    s->off_src = 0;
    s->off_dst = dnnl_util_align(src_bytes);
    s->off_w = s->off_dst + dnnl_util_align(dst_bytes);
    s->off_pad = s->off_w + dnnl_util_align(w_bytes);
    *scratch_size = s->off_pad + dnnl_util_align(pad);
    return 0;
}

/* Conv's W [M, C/group, k...] in oneDNN's logical order, grouped as
 * [group, M/group, C/group, k...]. */
static int conv_w_md(dnnl_memory_desc_t *md, const struct tensor *w, int64_t group) {
    int64_t wd[TENSOR_MAX_DIMS + 1];
    int nd = w->ndim, wnd = nd;
    if (group > 1) {
        wd[0] = group;
        wd[1] = w->dims[0] / group;
        for (int i = 1; i < nd; i++) wd[i + 1] = w->dims[i];
        wnd = nd + 1;
    } else {
        memcpy(wd, w->dims, sizeof(int64_t) * nd);
    }
    return dnnl_util_plain_md(md, wnd, wd);
}

/* Conv's primitive descriptor: Winograd where conv_use_winograd says so
 * and oneDNN has a kernel, else direct, on the blocked or the plain
 * layouts (conv_use_blocked); weights known at plan time take the
 * primitive's own layout. */
static int conv_pd(struct op_call *c, struct conv_state *s, const struct conv_desc *d, int blocked, int64_t lay,
                   int64_t batch, dnnl_primitive_desc_t *pd) {
    dnnl_primitive_attr_t attr = s->qdq_after ? dnnl_util_attr() : act_attr(c, s->sum, 1.0f, &s->act_after);
    if (!attr) return op_error(c, "could not build oneDNN attributes"), STATUS_INTERNAL;
    const dnnl_memory_desc_t *b = d->has_b ? &d->b : NULL;
    dnnl_convolution_desc_t cd;
    dnnl_status_t st = dnnl_unimplemented;
    if (blocked && s->const_weights && conv_use_winograd(&s->g.win, batch, s->g.group, c->in[1]->dims[1])) {
        st = dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_winograd,
                                                        &d->src_any, &d->w_any, b, &d->dst_any, d->strides, d->dil,
                                                        d->pl, d->pr);
        if (st == dnnl_success) st = dnnl_primitive_desc_create(pd, &cd, attr, dnnl_util_engine(), NULL);
    }
    /* Direct: always available. Channels-last ends are taken as they are
     * unless oneDNN has only its reference loop for them (grouped
     * convolutions of a few channels per group), ~50x slower than
     * reordering to the layout its kernels want. */
    for (int64_t keep = lay, tries = lay ? 2 : 1; st != dnnl_success && tries > 0; keep = 0, tries--) {
        st = dnnl_dilated_convolution_forward_desc_init(
            &cd, dnnl_forward_inference, dnnl_convolution_direct,
            blocked && !(keep & 1) ? &d->src_any : &d->src_plain, s->const_weights || blocked ? &d->w_any : &d->w_user,
            b, blocked && !(keep & 2) ? &d->dst_any : &d->dst_plain, d->strides, d->dil, d->pl, d->pr);
        if (st == dnnl_success) st = dnnl_primitive_desc_create(pd, &cd, attr, dnnl_util_engine(), NULL);
        if (st == dnnl_success && keep && tries > 1 && dnnl_util_is_ref(*pd)) {
            dnnl_primitive_desc_destroy(*pd);
            *pd = NULL;
            st = dnnl_unimplemented;
        }
    }
    dnnl_primitive_attr_destroy(attr);
    return st == dnnl_success ? 0 : dnnl_util_fail(c, "convolution primitive descriptor", st);
}

/* Kernel taps that read only padding, for every output position: a dilated
 * 3x3 whose dilation reaches past the map (DeepLabV3's ASPP: dilation 24 and
 * 36 on 16x16 features) is a 1x1 convolution of its centre tap. oneDNN's
 * AVX-512 kernels skip such taps, its AVX2 path (an im2col GEMM) computes
 * them: 12 ms for each of DeepLabV3's, against 1 ms as the 1x1 it is. With
 * constant weights, the window is cut to its live taps along each axis
 * (padding reduced to keep the output's size and positions) and a copy of
 * the weights to match taken into *wc; 0 when there is nothing to cut (or
 * it would take negative padding), 1 when cut, <0 on error. */
static int conv_crop(struct op_call *c, struct conv_state *s, const struct tensor *w, struct tensor *wc) {
    struct win *win = &s->g.win;
    int64_t t0[WIN_MAX], t1[WIN_MAX], kn[WIN_MAX], npl[WIN_MAX], npr[WIN_MAX];
    int cut = 0;
    if (!w->data) return 0;
    for (int i = 0; i < win->nsp; i++) {
        int64_t k = win->k[i], st = win->s[i], d = win->d[i], pl = win->pl[i], in = win->in[i], o = win->out[i];
        t0[i] = 0;
        t1[i] = k - 1;
        /* Tap t reads [t*d - pl, (o-1)*st + t*d - pl]: live if that meets [0, in). */
        while (t0[i] <= t1[i] && (o - 1) * st + t0[i] * d - pl < 0) t0[i]++;
        while (t1[i] >= t0[i] && t1[i] * d - pl >= in) t1[i]--;
        if (t0[i] > t1[i]) return 0;
        kn[i] = t1[i] - t0[i] + 1;
        npl[i] = pl - t0[i] * d;
        npr[i] = (o - 1) * st + (kn[i] - 1) * d + 1 - in - npl[i];
        if (npl[i] < 0 || npr[i] < 0) return 0;
        cut |= kn[i] != k;
    }
    if (!cut) return 0;
    *wc = *w;
    int64_t kvol = 1, nvol = 1;
    for (int i = 0; i < win->nsp; i++) {
        kvol *= win->k[i];
        nvol *= kn[i];
        wc->dims[2 + i] = kn[i];
    }
    int64_t rows = w->dims[0] * w->dims[1];
    if (!(s->wcrop = malloc((size_t)(rows * nvol) * sizeof(float)))) return op_error(c, "out of memory"), STATUS_NOMEM;
    const float *src = w->data;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < nvol; j++) {
            /* j over the cut window, row-major; its tap in the full one. */
            int64_t rem = j, off = 0, stride = 1;
            for (int i = win->nsp - 1; i >= 0; i--) {
                int64_t t = rem % kn[i];
                rem /= kn[i];
                off += (t0[i] + t) * stride;
                stride *= win->k[i];
            }
            s->wcrop[r * nvol + j] = src[r * kvol + off];
        }
    wc->data = s->wcrop;
    for (int i = 0; i < win->nsp; i++) {
        win->pl[i] = npl[i];
        win->pr[i] = npr[i];
        win->k[i] = kn[i];
        if (kn[i] == 1) win->d[i] = 1;
    }
    return 1;
}

/* ---- a dilated convolution whose taps read the map in part ---- */

/* A 2-D stride-1 convolution whose dilation reaches past most of the map
 * reads the input with only a corner, an edge or the centre of its window
 * at most output positions: DeepLabV3's ASPP, dilation 12 on 16 x 16
 * features, is 25% live taps. oneDNN 2.6's AVX-512 kernels skip the
 * padding; without AVX-512 its only kernel is an im2col GEMM that computes
 * every tap (11 ms for the 960 -> 256 channel one on an AMD EPYC with AVX2,
 * 2.7 ms with AVX-512). So below AVX-512, each live tap is a product of its
 * weights [M, C] by the input over the output rectangle it reaches (the
 * centre tap the whole map: straight into Y), gathered and added in.
 *
 * conv_tap_range: the live output positions of tap t along axis i, [o0, o1),
 * and the input's offset from them. */
static void conv_tap_range(const struct win *win, int i, int64_t t, int64_t *o0, int64_t *o1, int64_t *off) {
    *off = t * win->d[i] - win->pl[i];
    int64_t a = -*off, b = win->in[i] - *off;
    *o0 = a > 0 ? a : 0;
    *o1 = b < win->out[i] ? b : win->out[i];
    if (*o1 < *o0) *o1 = *o0;
}

/* Sets s->taps when the tap products pay (see above): 0, or <0 on error. */
static int conv_taps_build(struct op_call *c, struct conv_state *s, const struct tensor *w, int64_t lay,
                           size_t *scratch_size) {
    const struct win *win = &s->g.win;
    if (dnnl_util_isa_level() >= 4 || !w->data || win->nsp != 2 || s->g.group != 1 || win->s[0] != 1 ||
        win->s[1] != 1 || (win->d[0] == 1 && win->d[1] == 1) || win->k[0] * win->k[1] > 64 ||
        c->node->act == ACT_QDQ)
        return 0;
    struct conv_taps t = {.lay = lay};
    int64_t live = 0, M = w->dims[0], C = w->dims[1], kvol = win->k[0] * win->k[1];
    for (int64_t k = 0; k < kvol; k++) { /* a tap of no area is overwritten by the next */
        struct conv_tap *p = &t.tap[t.ntap];
        conv_tap_range(win, 0, k / win->k[1], &p->oy0, &p->oy1, &p->dy);
        conv_tap_range(win, 1, k % win->k[1], &p->ox0, &p->ox1, &p->dx);
        p->k = k;
        const int64_t area = (p->oy1 - p->oy0) * (p->ox1 - p->ox0);
        if (area == 0) continue;
        live += area;
        if (area > t.maxp) t.maxp = area;
        t.ntap++;
    }
    if (2 * live > kvol * win->out[0] * win->out[1]) return 0;
    if (!(t.w = malloc(sizeof(float) * (size_t)(t.ntap * M * C)))) return op_error(c, "out of memory"), STATUS_NOMEM;
    const float *src = w->data;
    for (int j = 0; j < t.ntap; j++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t ch = 0; ch < C; ch++) t.w[(j * M + m) * C + ch] = src[(m * C + ch) * kvol + t.tap[j].k];
    if (!(s->taps = malloc(sizeof t))) {
        free(t.w);
        return op_error(c, "out of memory"), STATUS_NOMEM;
    }
    *s->taps = t;
    s->act_after = 1;
    *scratch_size = sizeof(float) * (size_t)(t.maxp * (C + M));
    log_debug("Conv '%s': %d live taps as products (%.0f%% of the window's work), not oneDNN's im2col", c->node->name,
              t.ntap, 100.0 * (double)live / (double)(kvol * win->out[0] * win->out[1]));
    return 1;
}

/* Y = B (+ Z, a residual of Y's layout, maybe Y's own bytes) + the live
 * taps' products, per image. X and Y plain or channels-last (the node's
 * kiln_layout): a tap's input rectangle is gathered as [C, P] or [P, C]
 * (rows of the map copied whole), its product made [M, P] or [P, M] to
 * match Y, then added in. */
static int conv_taps_run(struct op_call *c, const struct conv_state *s, const struct tensor *z) {
    const struct conv_taps *t = s->taps;
    const struct win *win = &s->g.win;
    const struct tensor *x = c->in[0], *b = opt_in(c, 2);
    struct tensor *y = c->out[0];
    const int64_t N = x->dims[0], C = x->dims[1], M = y->dims[1], H = win->in[0], W = win->in[1];
    const int64_t OH = win->out[0], OW = win->out[1], isp = H * W, osp = OH * OW;
    const int xl = (t->lay & 1) != 0, yl = (t->lay & 2) != 0; /* channels-last */
    const float *bias = b ? b->data : NULL;
    float *g = c->scratch, *tmp = g + t->maxp * C;
    for (int64_t n = 0; n < N; n++) {
        const float *xn = (const float *)x->data + n * C * isp;
        float *yn = (float *)y->data + n * M * osp;
        const float *zn = z ? (const float *)z->data + n * M * osp : NULL;
        for (int64_t i = 0; i < M * osp; i++) {
            const int64_t m = yl ? i % M : i / osp;
            yn[i] = (bias ? bias[m] : 0.0f) + (zn ? zn[i] : 0.0f);
        }
        for (int j = 0; j < t->ntap; j++) {
            const struct conv_tap *p = &t->tap[j];
            const float *wj = t->w + (int64_t)j * M * C;
            const int64_t rh = p->oy1 - p->oy0, rw = p->ox1 - p->ox0, P = rh * rw;
            const int whole = rh == OH && rw == OW && OH == H && OW == W && p->dy == 0 && p->dx == 0;
            const float *gj = xn;
            if (!whole) { /* gather: G [P, C] from a channels-last X, else [C, P] */
                for (int64_t r = 0; r < rh; r++) {
                    const int64_t at = (p->oy0 + r + p->dy) * W + p->ox0 + p->dx;
                    if (xl) memcpy(g + r * rw * C, xn + at * C, sizeof(float) * (size_t)(rw * C));
                    else
                        for (int64_t ch = 0; ch < C; ch++)
                            memcpy(g + ch * P + r * rw, xn + ch * isp + at, sizeof(float) * (size_t)rw);
                }
                gj = g;
            }
            float *out = whole ? yn : tmp;
            const float beta = whole ? 1.0f : 0.0f;
            if (yl) /* [P, M] = G . W^T */
                DNNL_CHECK(dnnl_sgemm(xl ? 'N' : 'T', 'T', P, M, C, 1.0f, gj, xl ? C : P, wj, C, beta, out, M));
            else /* [M, P] = W . G */
                DNNL_CHECK(dnnl_sgemm('N', xl ? 'T' : 'N', M, P, C, 1.0f, wj, C, gj, xl ? C : P, beta, out, P));
            if (whole) continue;
            for (int64_t r = 0; r < rh; r++) {
                const int64_t at = (p->oy0 + r) * OW + p->ox0;
                if (yl) {
                    float *yr = yn + at * M;
                    const float *tr = tmp + r * rw * M;
                    for (int64_t q = 0; q < rw * M; q++) yr[q] += tr[q];
                } else {
                    for (int64_t m = 0; m < M; m++) {
                        float *yr = yn + m * osp + at;
                        const float *tr = tmp + m * P + r * rw;
                        for (int64_t q = 0; q < rw; q++) yr[q] += tr[q];
                    }
                }
            }
        }
    }
    return 0;
}

/* A 1-D convolution written as 2-D along H, its W a single column (kernel
 * [k, 1] over [N, C, H, 1], as tf2onnx writes Conv1D): oneDNN's kernels
 * block the output along W, so every block is one column wide and the
 * convolution runs as products of one row: magika's 256 -> 512 channel,
 * kernel-5 layer over 512 positions took 15 ms, 43 GFLOPS. The same bytes
 * read as [N, C, 1, H] (NCHW or NHWC alike: a dimension of one moves
 * nothing) with the window's axes swapped put the positions along W. Swaps
 * x, y and w (copies in xs, ys, ws) and s's window; 1 when swapped. */
static int conv_swap_1d(struct win *win, const struct tensor **x, const struct tensor **y, const struct tensor **w,
                        struct tensor *xs, struct tensor *ys, struct tensor *ws) {
    if (win->nsp != 2 || win->in[1] != 1 || win->k[1] != 1 || win->out[1] != 1 || win->pl[1] || win->pr[1] ||
        win->in[0] <= 1)
        return 0;
    const struct tensor *t[3] = {*x, *y, *w};
    struct tensor *u[3] = {xs, ys, ws};
    for (int i = 0; i < 3; i++) {
        *u[i] = *t[i];
        u[i]->dims[2] = t[i]->dims[3];
        u[i]->dims[3] = t[i]->dims[2];
    }
    *x = xs, *y = ys, *w = ws;
    struct win o = *win;
#define SWAP_AXES(f) (win->f[0] = o.f[1], win->f[1] = o.f[0])
    SWAP_AXES(in), SWAP_AXES(k), SWAP_AXES(s), SWAP_AXES(d), SWAP_AXES(pl), SWAP_AXES(pr), SWAP_AXES(out);
#undef SWAP_AXES
    return 1;
}

static int conv_build(struct op_call *c, struct conv_state *s, size_t *scratch_size) {
    const struct tensor *x = c->in[0], *w = c->in[1], *y = c->out[0];
    struct tensor wc, xs, ys, ws;
    int cut = conv_crop(c, s, w, &wc);
    if (cut < 0) return cut;
    if (cut) w = &wc;
    conv_swap_1d(&s->g.win, &x, &y, &w, &xs, &ys, &ws);
    dnnl_util_set_threads(c->nthreads);
    s->sum = opt_in(c, 3) != NULL;
    const int taps = conv_taps_build(c, s, w, node_attr_int(c->node, "kiln_layout", 0), scratch_size);
    if (taps) return taps < 0 ? taps : 0;
    if (!dnnl_util_engine()) return op_error(c, "oneDNN CPU engine unavailable"), STATUS_INTERNAL;
    s->const_weights = w->data != NULL;
    s->qdq_after = c->node->act == ACT_QDQ && dnnl_util_isa_level() < 3;
    dnnl_memory_desc_t w_user;
    struct conv_desc d;
    int64_t lay = node_attr_int(c->node, "kiln_layout", 0);
    if (conv_w_md(&w_user, w, s->g.group) || conv_desc_init(&d, x, y, opt_in(c, 2), &w_user, &s->g.win) ||
        conv_desc_layout(&d, x, y, lay))
        return op_error(c, "could not describe the tensors to oneDNN");
    /* A channels-last end takes the primitive's layouts (the other end's
     * "any" then lets oneDNN match it). */
    int blocked = lay || conv_use_blocked(&s->g.win, x->dims[1], w->dims[0]);
    dnnl_primitive_desc_t pd = NULL;
    int rc = conv_pd(c, s, &d, blocked, lay, x->dims[0], &pd);
    if (!rc) rc = conv_finish(c, s, pd, &d, w->data, scratch_size);
    if (pd) dnnl_primitive_desc_destroy(pd);
    return rc;
}

static int conv_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct conv_state *s = calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory"), STATUS_NOMEM;
    int rc = conv_geom_read(c, c->in[0], c->in[1], &s->g);
    if (!rc) rc = conv_build(c, s, scratch_size);
    if (rc) {
        conv_release(s);
        return rc;
    }
    *state = s;
    return 0;
}

/* Y's bytes := Z's (same layout and size), split over the step's threads. */
static void conv_copy_z(const struct op_call *c, const struct tensor *z, void *dst) {
    const size_t nb = tensor_nbytes(z), chunk = (size_t)1 << 16;
    const int64_t nchunks = (int64_t)((nb + chunk - 1) / chunk);
    PAR_FOR(nchunks > 1, c->nthreads, ,
            for (int64_t i = 0; i < nchunks; i++) {
                const size_t at = (size_t)i * chunk, len = nb - at < chunk ? nb - at : chunk;
                memcpy((char *)dst + at, (const char *)z->data + at, len);
            });
}

/* Runs the convolution of s (Conv's or QLinearConv's) on X (input 0), the
 * weights w and the bias b (NULL if none), reordering around it. With
 * s->sum, z (Y's shape and layout) is put where the primitive writes, and
 * its sum post-op adds the products to it: nothing to do when the plan
 * gave Y Z's bytes (plan_build's sum_in_place), a copy otherwise, a
 * reorder into a blocked destination. */
static int conv_exec(struct op_call *c, const struct conv_state *s, void *w, const struct tensor *b,
                     const struct tensor *z) {
    struct tensor *y = c->out[0];
    if (tensor_numel(y) == 0) return 0;
    char *scr = c->scratch;
    void *pad = s->off_pad < c->scratch_size ? scr + s->off_pad : NULL;
    void *src = c->in[0]->data, *dst = y->data;
    int rc;
    if (s->w_reorder) {
        void *p[2] = {w, scr + s->off_w};
        if ((rc = dnnl_prim_exec(c, s->w_reorder, p, pad))) return rc;
        w = scr + s->off_w;
    }
    const struct tensor *x = c->in[0];
    if (s->src_t2d) { /* [C, spatial] -> [spatial, C] per image */
        cpu_transpose_2d(src, scr + s->off_src, x->dims[0], x->dims[1], prod(x->dims + 2, x->ndim - 2), s->src_t2d,
                         c->nthreads);
        src = scr + s->off_src;
    } else if (s->src_reorder) {
        void *p[2] = {src, scr + s->off_src};
        if ((rc = dnnl_prim_exec(c, s->src_reorder, p, pad))) return rc;
        src = scr + s->off_src;
    }
    if (s->dst_reorder) dst = scr + s->off_dst;
    if (s->z_reorder) { /* only with s->sum */
        void *p[2] = {z->data, dst};
        if ((rc = dnnl_prim_exec(c, s->z_reorder, p, pad))) return rc;
    } else if (s->sum && z->data != dst) {
        conv_copy_z(c, z, dst);
    }
    void *args[4] = {src, w, dst, b ? b->data : NULL};
    if ((rc = dnnl_prim_exec(c, s->conv, args, pad))) return rc;
    if (s->dst_t2d) {
        cpu_transpose_2d(dst, y->data, y->dims[0], prod(y->dims + 2, y->ndim - 2), y->dims[1], s->dst_t2d, c->nthreads);
    } else if (s->dst_reorder) {
        void *p[2] = {dst, y->data};
        if ((rc = dnnl_prim_exec(c, s->dst_reorder, p, pad))) return rc;
    }
    return 0;
}

/* ---- a quantization round trip without FMA ---- */

/* Output i of the convolution of s summed exactly (products and sums of
 * float32 values in double, then rounded once to float32): the float32
 * nearest the true sum. X and Y may be channels-last (the node's
 * kiln_layout); the weights are the ones the primitive got (cropped by
 * conv_crop, or W at run time). */
static float conv_exact_at(const struct op_call *c, const struct conv_state *s, const float *w, int64_t lay, int64_t i) {
    const struct win *win = &s->g.win;
    const struct tensor *x = c->in[0], *y = c->out[0], *b = opt_in(c, 2);
    int64_t M = y->dims[1], C = x->dims[1], cg = C / s->g.group, mg = M / s->g.group;
    int64_t osp = prod(y->dims + 2, win->nsp), isp = prod(x->dims + 2, win->nsp), kvol = prod(win->k, win->nsp);
    int64_t n = i / (M * osp), m = (lay & 2) ? i % M : i / osp % M, o = (lay & 2) ? i / M % osp : i % osp;
    int64_t opos[WIN_MAX];
    for (int k = win->nsp - 1; k >= 0; k--) {
        opos[k] = o % win->out[k];
        o /= win->out[k];
    }
    const float *xd = x->data, *wm = w + m * cg * kvol;
    double acc = b ? ((const float *)b->data)[m] : 0.0;
    int64_t tap[WIN_MAX] = {0}, c0 = m / mg * cg; /* tap: t's position in the window, counted up */
    for (int64_t t = 0; t < kvol; t++) {
        int64_t pos = 0, inside = 1;
        for (int k = 0; k < win->nsp; k++) {
            int64_t p = opos[k] * win->s[k] + tap[k] * win->d[k] - win->pl[k];
            inside &= p >= 0 && p < win->in[k];
            pos = pos * win->in[k] + p;
        }
        for (int k = win->nsp - 1; k >= 0 && ++tap[k] == win->k[k]; k--) tap[k] = 0;
        if (!inside) continue;
        for (int64_t ch = 0; ch < cg; ch++) {
            float xv = (lay & 1) ? xd[(n * isp + pos) * C + c0 + ch] : xd[(n * C + c0 + ch) * isp + pos];
            acc += (double)wm[ch * kvol + t] * xv;
        }
    }
    return (float)acc;
}

/* ACT_QDQ where oneDNN runs without FMA (SSE4.1: dnnl_util_isa_level 2).
 * Its kernels round every product before adding it, so a sum can land a
 * unit in the last place from the one an FMA (AVX2, AVX-512) or onnx's
 * reference computes; that moves a value one quantization step where it
 * lies on a half step, and a quantized network carries the step on: the
 * QDQ MobileNetV2 of the model set ended 13 steps off its reference (one
 * 1x1 convolution sum, 46.5 steps exactly, came out 46.500004 and rounded
 * to 47). So oneDNN's Conv stops at the sum there; outputs within 1/1024
 * step of a half (about 2 in 1000), 30 times the largest such error seen on
 * that model (3e-5 step), are summed again exactly before the
 * quantization, and the others cannot round differently. That model took
 * 1.45 ms instead of 1.1 ms (one thread), and every tensor of it is now
 * the same as with AVX2. */
static void conv_qdq_after(struct op_call *c, const struct conv_state *s) {
    const float a = c->node->act_alpha, lo = c->node->act_beta, hi = lo + 255.0f;
    const float *w = s->wcrop ? s->wcrop : c->in[1]->data;
    float *y = c->out[0]->data;
    int64_t n = tensor_numel(c->out[0]), lay = node_attr_int(c->node, "kiln_layout", 0);
    int32_t near[1024]; /* a chunk's marks, in a vector loop; the rare sums again in a scalar one */
    for (int64_t i0 = 0; i0 < n; i0 += 1024) {
        int64_t len = n - i0 < 1024 ? n - i0 : 1024;
        float *yc = y + i0;
        _Pragma("omp simd") for (int64_t i = 0; i < len; i++) { /* act_apply's ACT_QDQ, in a form that vectorizes */
            float q = yc[i] / a, r = nearbyintf(q);
            near[i] = fabsf(q - r) >= 0.5f - 1.0f / 1024;
            r = r < lo ? lo : r;
            yc[i] = a * (r > hi ? hi : r);
        }
        for (int64_t i = 0; i < len; i++)
            if (near[i]) yc[i] = act_apply(ACT_QDQ, conv_exact_at(c, s, w, lay, i0 + i), a, lo);
    }
}

static int conv_run(struct op_call *c) {
    const struct conv_state *s = c->state;
    const struct tensor *z = s->sum ? c->in[3] : NULL;
    int rc = s->taps ? conv_taps_run(c, s, z) : conv_exec(c, s, c->in[1]->data, opt_in(c, 2), z);
    if (!rc && s->act_after) op_apply_act(c->node, c->out[0]->data, tensor_numel(c->out[0]));
    if (!rc && s->qdq_after) conv_qdq_after(c, s);
    return rc;
}

/* ==== ConvTranspose ===================================================== */

/* The gradient of Conv: every input pixel scatters kernel * value into the
 * output. Computed as a gather per output pixel (no write races): output o
 * along a dim takes input i = (o + pl - t*d) / s for each tap t where that
 * divides exactly. ConvTranspose is rare in the models kiln serves; this
 * loop keeps every ONNX variant (output_shape, output_padding, negative
 * implied pads, groups, 1-D to 3-D) exact. */

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* ConvTranspose's geometry: the window's in and out are X's and Y's
 * spatial extents, pl the left padding (from pads, or split from what
 * output_shape or SAME_* leave over) and pr the right padding in and out
 * imply, negative where output_padding reaches past the pads. */
static int ctr_setup(struct op_call *c, struct conv_geom *g) {
    const struct tensor *x = c->in[0], *w = c->in[1];
    struct win *wn = &g->win;
    memset(g, 0, sizeof *g);
    int nsp = wn->nsp = x->ndim - 2;
    if (nsp < 1 || nsp > WIN_MAX) return op_error(c, "input must have rank 3 to 5 (got %d)", x->ndim);
    if (w->ndim != x->ndim) return op_error(c, "W has rank %d, X has rank %d", w->ndim, x->ndim);
    g->group = node_attr_int(c->node, "group", 1);
    if (g->group < 1) return op_error(c, "group must be >= 1");
    struct win_attrs a;
    int rc = win_attrs_read(c, nsp, &a);
    if (rc) return rc;
    const int64_t *op = NULL, *os = NULL;
    int nop = node_attr_ints(c->node, "output_padding", &op), nos = node_attr_ints(c->node, "output_shape", &os);
    if (nop >= 0 && nop != nsp) return op_error(c, "output_padding has %d values for %d spatial dims", nop, nsp);
    if (nos >= 0 && nos < nsp) return op_error(c, "output_shape has %d values for %d spatial dims", nos, nsp);
    for (int i = 0; i < nsp; i++) {
        wn->in[i] = x->dims[2 + i];
        wn->k[i] = w->dims[2 + i];
        if (a.nk >= 0 && a.ks[i] != wn->k[i]) return op_error(c, "kernel_shape disagrees with W");
        int64_t opad = nop >= 0 ? op[i] : 0, pl, pr;
        if (!win_attrs_dim(&a, nsp, i, wn->k[i], &wn->s[i], &wn->d[i], &pl, &pr) || opad < 0 || opad > (1 << 20))
            return op_error(c, "bad window along spatial dim %d", i);
        int64_t dk = (wn->k[i] - 1) * wn->d[i] + 1, full = wn->s[i] * (wn->in[i] - 1) + opad + dk;
        if (nos >= 0 || a.pad == WIN_PAD_SAME_UPPER || a.pad == WIN_PAD_SAME_LOWER) {
            int64_t out = nos >= 0 ? os[nos - nsp + i] : wn->in[i] * wn->s[i];
            int64_t total = full - out;
            wn->pl[i] = a.pad == WIN_PAD_SAME_UPPER ? floor_div(total, 2) : total - floor_div(total, 2);
            wn->out[i] = out;
        } else {
            wn->pl[i] = pl;
            wn->out[i] = full - pl - pr;
        }
        if (wn->in[i] >= 0 && wn->out[i] < 0) return op_error(c, "output size along dim %d is negative", i);
        if (wn->in[i] < 0) wn->out[i] = -1;
        wn->pr[i] = full - opad - wn->pl[i] - wn->out[i];
    }
    return 0;
}

static int ctr_infer(struct op_call *c) {
    const struct tensor *x = c->in[0], *w = c->in[1], *b = opt_in(c, 2);
    int rc;
    if ((rc = need_f32(c, x, "X")) || (rc = need_f32(c, w, "W"))) return rc;
    struct conv_geom g;
    if ((rc = ctr_setup(c, &g))) return rc;
    if (x->dims[1] >= 0 && x->dims[1] != w->dims[0])
        return op_error(c, "X has %lld channels but W has %lld", (long long)x->dims[1], (long long)w->dims[0]);
    if (w->dims[0] % g.group) return op_error(c, "W's %lld input channels are not a multiple of group %lld",
                                              (long long)w->dims[0], (long long)g.group);
    int64_t m = w->dims[1] * g.group;
    if (b && (b->ndim != 1 || b->dims[0] != m)) return op_error(c, "B must be 1-D of %lld values", (long long)m);
    struct tensor *y = c->out[0];
    y->dtype = DT_FP32;
    y->ndim = x->ndim;
    y->dims[0] = x->dims[0];
    y->dims[1] = m;
    for (int i = 0; i < g.win.nsp; i++) y->dims[2 + i] = g.win.out[i];
    return 0;
}

/* ONNX W is [C, M/group, k...]; oneDNN's logical order is [group,]
 * out-channels, in-channels, k..., so it is described by strides. */
static int ctr_w_md(dnnl_memory_desc_t *md, const struct tensor *w, const struct conv_geom *g) {
    int64_t group = g->group, cg = w->dims[0] / group, mg = w->dims[1], ksz = prod(w->dims + 2, w->ndim - 2);
    dnnl_dims_t wd, ws;
    int wnd = 0;
    if (group > 1) {
        wd[wnd] = group;
        ws[wnd++] = cg * mg * ksz;
    }
    wd[wnd] = mg;
    ws[wnd++] = ksz;
    wd[wnd] = cg;
    ws[wnd++] = mg * ksz;
    int64_t st = ksz;
    for (int i = 0; i < g->win.nsp; i++) {
        st /= g->win.k[i];
        wd[wnd] = g->win.k[i];
        ws[wnd++] = st;
    }
    return dnnl_memory_desc_init_by_strides(md, wnd, wd, dnnl_f32, ws) == dnnl_success ? 0 : -1;
}

/* oneDNN's deconvolution, on the layouts it prefers (activations reordered
 * around it as for Conv). Leaves s->conv NULL, for the loop, where oneDNN
 * cannot describe the tensors or has no kernel. */
static int ctr_build(struct op_call *c, struct conv_state *s, size_t *scratch_size) {
    const struct tensor *w = c->in[1];
    dnnl_util_set_threads(c->nthreads);
    s->const_weights = 1;
    dnnl_memory_desc_t w_user;
    struct conv_desc d;
    if (ctr_w_md(&w_user, w, &s->g) || conv_desc_init(&d, c->in[0], c->out[0], opt_in(c, 2), &w_user, &s->g.win))
        return 0;
    dnnl_primitive_attr_t attr = act_attr(c, 0, 0.0f, &s->act_after);
    if (!attr) return STATUS_INTERNAL;
    dnnl_deconvolution_desc_t dsc;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t r = dnnl_dilated_deconvolution_forward_desc_init(&dsc, dnnl_forward_inference,
                                                                   dnnl_deconvolution_direct, &d.src_any, &d.w_any,
                                                                   d.has_b ? &d.b : NULL, &d.dst_any, d.strides,
                                                                   d.dil, d.pl, d.pr);
    if (r == dnnl_success) r = dnnl_primitive_desc_create(&pd, &dsc, attr, dnnl_util_engine(), NULL);
    dnnl_primitive_attr_destroy(attr);
    if (r != dnnl_success) return 0; /* a case oneDNN has no kernel for: the loop */
    int rc = conv_finish(c, s, pd, &d, w->data, scratch_size);
    dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* Whether oneDNN's deconvolution takes this ConvTranspose: padding it can
 * express (implied pads >= 0 on both sides), weights known at plan time
 * and an output that is not empty. */
static int ctr_use_dnnl(const struct op_call *c, const struct conv_geom *g) {
    for (int i = 0; i < g->win.nsp; i++)
        if (g->win.pl[i] < 0 || g->win.pr[i] < 0) return 0;
    return c->in[1]->data && tensor_numel(c->out[0]) > 0 && dnnl_util_engine();
}

/* A ConvTranspose whose windows do not overlap (kernel = stride, no
 * dilation, padding or output padding, one group) with few output
 * channels: every input pixel writes its own k0 x k1 x ... patch of the
 * output, so Y is one product, patches [M k, HW] = W^T [M k, C] X [C, HW],
 * scattered into place with the bias. oneDNN's deconvolution vectorizes
 * over output channels in 16s and ran DBNet's last one (24 channels to 1,
 * 2x2 stride 2, PaddleOCR's detector) at 3 GFLOPS. */
#define CTR_PATCHES_MAX_OUT 8
static int ctr_patches_ok(const struct op_call *c, const struct conv_geom *g) {
    const struct tensor *y = c->out[0];
    if (g->group != 1 || y->dims[1] > CTR_PATCHES_MAX_OUT || tensor_numel(y) <= 0 || !dnnl_util_engine()) return 0;
    for (int i = 0; i < g->win.nsp; i++)
        if (g->win.k[i] != g->win.s[i] || g->win.d[i] != 1 || g->win.pl[i] || g->win.pr[i] ||
            g->win.out[i] != g->win.in[i] * g->win.s[i])
            return 0;
    return 1;
}

static int ctr_patches_run(struct op_call *c, const struct conv_state *s) {
    const struct tensor *x = c->in[0], *w = c->in[1], *b = opt_in(c, 2);
    struct tensor *y = c->out[0];
    const struct win *g = &s->g.win;
    const int nsp = g->nsp;
    const int64_t N = x->dims[0], C = x->dims[1], M = y->dims[1];
    const int64_t isz = prod(g->in, nsp), osz = prod(g->out, nsp), ksz = prod(g->k, nsp), rows = M * ksz;
    const float *bd = b ? b->data : NULL;
    float *pt = c->scratch;
    for (int64_t n = 0; n < N; n++) {
        /* W is [C, M k...] row-major: its transpose times X's [C, HW] */
        if (dnnl_sgemm('T', 'N', rows, isz, C, 1.0f, w->data, rows, (const float *)x->data + n * C * isz, isz, 0.0f, pt,
                       isz) != dnnl_success)
            return op_error(c, "oneDNN's sgemm failed");
        float *yn = (float *)y->data + n * M * osz;
        PAR_FOR(rows * isz > 65536, c->nthreads, ,
            for (int64_t r = 0; r < rows; r++) {
                int64_t m = r / ksz, t = r % ksz, tap[WIN_MAX], inc[WIN_MAX];
                for (int i = nsp - 1; i >= 0; i--) {
                    tap[i] = t % g->k[i];
                    t /= g->k[i];
                }
                /* output offset of input pixel 0 and the step per input index, per dim */
                int64_t base = 0, os = 1;
                for (int i = nsp - 1; i >= 0; i--) {
                    base += tap[i] * os;
                    inc[i] = g->s[i] * os;
                    os *= g->out[i];
                }
                const float bias = bd ? bd[m] : 0.0f, *src = pt + r * isz;
                float *dst = yn + m * osz + base;
                int64_t inner = g->in[nsp - 1], step = inc[nsp - 1], outer = isz / inner;
                for (int64_t q = 0; q < outer; q++) {
                    int64_t off = 0, rest = q;
                    for (int i = nsp - 2; i >= 0; i--) {
                        off += rest % g->in[i] * inc[i];
                        rest /= g->in[i];
                    }
                    const float *sp = src + q * inner;
                    float *dp = dst + off;
                    for (int64_t j = 0; j < inner; j++) dp[j * step] = sp[j] + bias;
                }
            });
    }
    op_apply_act(c->node, y->data, tensor_numel(y));
    return 0;
}

/* The state holds oneDNN's deconvolution where it applies, otherwise only
 * the geometry, and run() uses the loop. */
static int ctr_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct conv_state *s = calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory"), STATUS_NOMEM;
    int rc = ctr_setup(c, &s->g);
    *scratch_size = 0;
    if (!rc && ctr_patches_ok(c, &s->g)) {
        s->patches = 1;
        *scratch_size = sizeof(float) * (size_t)(c->out[0]->dims[1] * prod(s->g.win.k, s->g.win.nsp) *
                                                 prod(s->g.win.in, s->g.win.nsp));
    } else if (!rc && ctr_use_dnnl(c, &s->g))
        rc = ctr_build(c, s, scratch_size);
    if (rc) {
        conv_release(s);
        return rc;
    }
    *state = s;
    return 0;
}

static int ctr_run(struct op_call *c) {
    const struct conv_state *s = c->state;
    if (s->patches) return ctr_patches_run(c, s);
    if (s->conv) return conv_run(c);
    const struct tensor *x = c->in[0], *w = c->in[1], *b = opt_in(c, 2);
    struct tensor *y = c->out[0];
    const struct win *g = &s->g.win;
    int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1}, st[3] = {1, 1, 1}, d[3] = {1, 1, 1}, pl[3] = {0};
    for (int i = 0; i < g->nsp; i++) {
        in[i] = g->in[i]; out[i] = g->out[i]; k[i] = g->k[i]; st[i] = g->s[i]; d[i] = g->d[i]; pl[i] = g->pl[i];
    }
    int64_t group = s->g.group;
    int64_t N = x->dims[0], C = x->dims[1], M = y->dims[1], cg = C / group, mg = M / group;
    int64_t isz = in[0] * in[1] * in[2], osz = out[0] * out[1] * out[2], ksz = k[0] * k[1] * k[2];
    const float *xd = x->data, *wd = w->data, *bd = b ? b->data : NULL;
    float *yd = y->data;
    PAR_FOR(N * M * osz > 4096, c->nthreads, collapse(2),
        for (int64_t nn = 0; nn < N; nn++)
            for (int64_t m = 0; m < M; m++) {
                int64_t gi = m / mg, mm = m % mg;
                float *yp = yd + (nn * M + m) * osz;
                for (int64_t o0 = 0; o0 < out[0]; o0++)
                    for (int64_t o1 = 0; o1 < out[1]; o1++)
                        for (int64_t o2 = 0; o2 < out[2]; o2++) {
                            float acc = bd ? bd[m] : 0.0f;
                            for (int64_t t0 = 0; t0 < k[0]; t0++) {
                                int64_t q0 = o0 + pl[0] - t0 * d[0];
                                if (q0 < 0 || q0 % st[0] || q0 / st[0] >= in[0]) continue;
                                for (int64_t t1 = 0; t1 < k[1]; t1++) {
                                    int64_t q1 = o1 + pl[1] - t1 * d[1];
                                    if (q1 < 0 || q1 % st[1] || q1 / st[1] >= in[1]) continue;
                                    for (int64_t t2 = 0; t2 < k[2]; t2++) {
                                        int64_t q2 = o2 + pl[2] - t2 * d[2];
                                        if (q2 < 0 || q2 % st[2] || q2 / st[2] >= in[2]) continue;
                                        int64_t ip = (q0 / st[0] * in[1] + q1 / st[1]) * in[2] + q2 / st[2];
                                        int64_t tp = (t0 * k[1] + t1) * k[2] + t2;
                                        for (int64_t ci = 0; ci < cg; ci++) {
                                            int64_t cc = gi * cg + ci;
                                            acc += xd[(nn * C + cc) * isz + ip] * wd[(cc * mg + mm) * ksz + tp];
                                        }
                                    }
                                }
                            }
                            yp[(o0 * out[1] + o1) * out[2] + o2] = acc;
                        }
            });
    op_apply_act(c->node, yd, tensor_numel(y));
    return 0;
}

/* ==== MatMul and Gemm =================================================== */

void cpu_mm_release(void *st) {
    struct cpu_mm_state *s = st;
    if (!s) return;
    dnnl_prim_free(s->prim);
    dnnl_util_weights_release(s->wbuf);
    free(s->bias);
    free(s->packed);
    free(s);
}

/* A product of up to MM_GEMV_ROWS rows by a constant B of at most
 * MM_GEMV_MAX_B values runs on cpu_gemv over B packed in prepare, not on
 * oneDNN: at these sizes a primitive's execution (its argument list, its
 * dispatch, the thread team) costs more than the arithmetic, and a small
 * model serving one request at a time is made of such products (the
 * digits model's 1 x 64 x 64 and 1 x 64 x 10: ~7,000 instructions of
 * oneDNN's per call against ~1,000 of products). The bound keeps B within
 * L2 and one thread's share within a few microseconds, where oneDNN's
 * threads would gain nothing. */
#define MM_GEMV_ROWS 4
#define MM_GEMV_MAX_B 65536

static int mm_gemv_fits(int64_t m, int64_t k, int64_t n) {
    return m >= 1 && m <= MM_GEMV_ROWS && k >= 1 && n >= 1 && k <= MM_GEMV_MAX_B / n;
}

/* Ends prepare for the product of m rows by B (element (j, c) at
 * b[j * sk + c * sn]): packs B into s and hands s over as the state, or
 * frees s and returns the error. */
static int mm_gemv_prepare(struct op_call *c, struct cpu_mm_state *s, const float *b, int64_t m, int64_t k,
                           int64_t n, int64_t sk, int64_t sn, float alpha, void **state, size_t *scratch_size) {
    s->packed = aligned_alloc(64, dnnl_util_align(sizeof(float) * (size_t)(k * n)));
    if (!s->packed) {
        cpu_mm_release(s);
        return op_error(c, "out of memory"), STATUS_NOMEM;
    }
    cpu_gemv_pack(b, k, n, sk, sn, s->packed);
    s->m = m, s->k = k, s->n = n;
    s->alpha = alpha;
    *scratch_size = 0;
    *state = s;
    return 0;
}

/* y [m, n] = alpha * A B + beta * C, then the node's activation, in the
 * order oneDNN's bias and sum post-op take (the product scaled, C added):
 * A's rows lda apart, C broadcast from [cr, cc] (none when cv is NULL).
 * The activation runs per row on this thread (op_apply_act would start a
 * team of one for these few values). */
static void mm_gemv_run(struct op_call *c, const struct cpu_mm_state *s, const float *a, int64_t lda,
                        const float *cv, int64_t cr, int64_t cc, float beta, float *y) {
    const int64_t n = s->n;
    const struct graph_node *nd = c->node;
    for (int64_t i = 0; i < s->m; i++) {
        float *o = y + i * n;
        cpu_gemv(a + i * lda, s->k, s->packed, n, o);
        if (s->alpha != 1.0f)
            for (int64_t j = 0; j < n; j++) o[j] *= s->alpha;
        if (cv) {
            /* omp simd: no element depends on another (C and Y are
             * distinct, or the same buffer element for element). */
            const float *row = cv + (cr == 1 ? 0 : i) * cc;
            if (cc == 1) {
                const float add = beta * row[0];
#pragma omp simd
                for (int64_t j = 0; j < n; j++) o[j] += add;
            } else {
#pragma omp simd
                for (int64_t j = 0; j < n; j++) o[j] += beta * row[j];
            }
        }
        if (nd->act != ACT_NONE) ew_act_f32(o, n, nd->act, nd->act_alpha, nd->act_beta);
    }
}

/* Whether md is a plain row-major 2-D matrix. */
static int mm_plain_2d(const dnnl_memory_desc_t *md) {
    return md->ndims == 2 && md->format_kind == dnnl_blocked && md->format_desc.blocking.inner_nblks == 0 &&
           md->format_desc.blocking.strides[1] == 1 && md->format_desc.blocking.strides[0] == md->dims[1];
}

/* The same product as a 1x1 convolution over one channels-last image whose
 * width is A's rows: A [M, K] is src [1, K, M] (acb), Y [M, N] dst
 * [1, N, M], B [K, N] the weights [N, K, 1], all the same bytes. Without
 * AVX-512 (oneDNN 2.x) matmul and inner product run on oneDNN's sgemm,
 * which leaves B plain and packs it again on every call; its 1x1
 * convolution keeps the weights packed once in its blocked layout and
 * ran MiniLM's three product shapes at 87-96% of the FMA peak from 16
 * rows up, against 40-85% for the sgemm (bench/embeddings/gemm.c on an
 * AVX2 AMD EPYC). Returns a convolution descriptor run by oneDNN's jit
 * 1x1 kernel, or NULL (then the matmul stays). *w_md is B as the
 * convolution's weights. */
static dnnl_primitive_desc_t mm_conv1x1_pd(const dnnl_memory_desc_t *a_md, const dnnl_memory_desc_t *b_md,
                                           const dnnl_memory_desc_t *bias_md, const dnnl_memory_desc_t *dst_md,
                                           dnnl_primitive_attr_t attr, dnnl_memory_desc_t *w_md) {
    if (!mm_plain_2d(a_md) || !mm_plain_2d(dst_md) || b_md->ndims != 2 || b_md->format_kind != dnnl_blocked ||
        b_md->format_desc.blocking.inner_nblks != 0)
        return NULL;
    const dnnl_dim_t m = a_md->dims[0], k = a_md->dims[1], n = b_md->dims[1];
    const dnnl_dim_t *bs = b_md->format_desc.blocking.strides;
    dnnl_memory_desc_t src, dst, wany, bias;
    dnnl_dims_t sd = {1, k, m}, ss = {m * k, 1, k}, dd = {1, n, m}, ds = {m * n, 1, n};
    dnnl_dims_t wd = {n, k, 1}, ws = {bs[1], bs[0], k * n}, bd = {n}, one = {1}, zero = {0};
    if (dnnl_memory_desc_init_by_strides(&src, 3, sd, dnnl_f32, ss) ||
        dnnl_memory_desc_init_by_strides(&dst, 3, dd, dnnl_f32, ds) ||
        dnnl_memory_desc_init_by_strides(w_md, 3, wd, dnnl_f32, ws) ||
        dnnl_memory_desc_init_by_tag(&wany, 3, wd, dnnl_f32, dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&bias, 1, bd, dnnl_f32, dnnl_a))
        return NULL;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct, &src, &wany,
                                           bias_md ? &bias : NULL, &dst, one, zero, zero) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &cd, attr, dnnl_util_engine(), NULL) != dnnl_success)
        return NULL;
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl ||
        strncmp(impl, "jit_1x1", 7) != 0) {
        dnnl_primitive_desc_destroy(pd);
        return NULL;
    }
    return pd;
}

/* Builds the matmul for src/weights/bias/dst descriptors; B constant gets
 * oneDNN's preferred layout and is reordered once (as a 1x1 convolution's
 * weights where oneDNN's matmul would run on its sgemm: mm_conv1x1_pd). */
int cpu_mm_build(struct op_call *c, struct cpu_mm_state *s, const dnnl_memory_desc_t *a_md,
                    const dnnl_memory_desc_t *b_md, const void *b_const, const dnnl_memory_desc_t *bias_md,
                    const dnnl_memory_desc_t *dst_md, float alpha, int with_sum, size_t *scratch_size) {
    dnnl_memory_desc_t b_any;
    if (b_const) dnnl_util_any_md(&b_any, b_md->ndims, b_md->dims);
    dnnl_util_set_threads(c->nthreads);
    if (!dnnl_util_engine()) return op_error(c, "oneDNN CPU engine unavailable"), STATUS_INTERNAL;
    dnnl_primitive_attr_t attr = act_attr(c, with_sum, 1.0f, &s->act_after);
    if (!attr) return STATUS_INTERNAL;
    if (alpha != 1.0f && dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha) != dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        return op_error(c, "could not set oneDNN output scale");
    }
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = dnnl_matmul_desc_init(&md, a_md, b_const ? &b_any : b_md, bias_md, dst_md);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &md, attr, dnnl_util_engine(), NULL);
    if (st != dnnl_success && b_const) { /* no preferred layout: keep B as it is */
        b_const = NULL;
        st = dnnl_matmul_desc_init(&md, a_md, b_md, bias_md, dst_md);
        if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &md, attr, dnnl_util_engine(), NULL);
    }
    dnnl_memory_desc_t conv_w;
    const char *impl = NULL;
    if (st == dnnl_success && b_const &&
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
        strncmp(impl, "gemm", 4) == 0) {
        dnnl_primitive_desc_t cpd = mm_conv1x1_pd(a_md, b_md, bias_md, dst_md, attr, &conv_w);
        if (cpd) {
            dnnl_primitive_desc_destroy(pd);
            pd = cpd;
            b_md = &conv_w;
        }
    }
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return dnnl_util_fail(c, "matmul primitive descriptor", st);
    int ids[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    s->nargs = bias_md ? 4 : 3;
    s->prim = dnnl_prim_create(c, pd, s->nargs, ids, scratch_size);
    int rc = s->prim ? 0 : STATUS_INTERNAL;
    if (!rc && b_const) {
        const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        if (!dnnl_memory_desc_equal(wmd, b_md)) {
            s->wbuf = dnnl_util_weights_acquire(c, b_md, b_const, wmd);
            if (!s->wbuf) rc = STATUS_INTERNAL;
        }
        if (!rc) dnnl_prim_bind(s->prim, 1, s->wbuf ? s->wbuf : (void *)b_const);
    }
    dnnl_primitive_desc_destroy(pd);
    return rc;
}

int cpu_mm_shapes(struct op_call *c, const struct tensor *a, const struct tensor *b, struct cpu_mm_shape *sh,
                     struct tensor *y) {
    if (a->ndim < 1 || b->ndim < 1) return op_error(c, "MatMul operands must have rank >= 1");
    int64_t ad[TENSOR_MAX_DIMS], bd[TENSOR_MAX_DIMS];
    int ra = a->ndim, rb = b->ndim;
    if (ra == 1) { ad[0] = 1; ad[1] = a->dims[0]; ra = 2; } else memcpy(ad, a->dims, sizeof(int64_t) * ra);
    if (rb == 1) { bd[0] = b->dims[0]; bd[1] = 1; rb = 2; } else memcpy(bd, b->dims, sizeof(int64_t) * rb);
    int r = ra > rb ? ra : rb;
    if (r > TENSOR_MAX_DIMS) return op_error(c, "rank too large");
    sh->r = r;
    for (int i = 0; i < r; i++) {
        sh->a[i] = i < r - ra ? 1 : ad[i - (r - ra)];
        sh->b[i] = i < r - rb ? 1 : bd[i - (r - rb)];
    }
    int64_t k = sh->a[r - 1];
    if (k >= 0 && sh->b[r - 2] >= 0 && k != sh->b[r - 2]) {
        char s1[128], s2[128];
        return op_error(c, "inner dims differ: A %s, B %s", tensor_shape_str(a, s1, sizeof s1),
                        tensor_shape_str(b, s2, sizeof s2));
    }
    for (int i = 0; i < r - 2; i++) {
        int64_t da = sh->a[i], db = sh->b[i];
        if (da == db || db == 1) sh->y[i] = da;
        else if (da == 1) sh->y[i] = db;
        else {
            char s1[128], s2[128];
            return op_error(c, "batch dims of A %s and B %s cannot be broadcast", tensor_shape_str(a, s1, sizeof s1),
                            tensor_shape_str(b, s2, sizeof s2));
        }
    }
    sh->y[r - 2] = sh->a[r - 2];
    sh->y[r - 1] = sh->b[r - 1];
    if (y) {
        y->dtype = DT_FP32;
        int nd = 0;
        for (int i = 0; i < r - 2; i++) y->dims[nd++] = sh->y[i];
        if (a->ndim > 1) y->dims[nd++] = sh->y[r - 2];
        if (b->ndim > 1) y->dims[nd++] = sh->y[r - 1];
        y->ndim = nd;
    }
    return 0;
}

static int matmul_infer(struct op_call *c) {
    const struct tensor *a = c->in[0], *b = c->in[1], *bias = opt_in(c, 2);
    int rc;
    if ((rc = need_f32(c, a, "A")) || (rc = need_f32(c, b, "B"))) return rc;
    struct cpu_mm_shape sh;
    if ((rc = cpu_mm_shapes(c, a, b, &sh, c->out[0]))) return rc;
    if (bias && ((rc = need_f32(c, bias, "bias")) || bias->ndim != 1 || bias->dims[0] != sh.y[sh.r - 1]))
        return rc ? rc : op_error(c, "fused bias must be 1-D of %lld values", (long long)sh.y[sh.r - 1]);
    return 0;
}

static int matmul_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    const struct tensor *a = c->in[0], *b = c->in[1], *bias = opt_in(c, 2);
    struct cpu_mm_shape sh;
    int rc = cpu_mm_shapes(c, a, b, &sh, NULL);
    if (rc) return rc;
    struct cpu_mm_state *s = calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory"), STATUS_NOMEM;
    int b_batch = 0;
    for (int i = 0; i < sh.r - 2; i++) b_batch |= sh.b[i] != 1;
    /* A B without batch dims of its own multiplies every row of A alike:
     * A's batch dims fold into its rows (the same bytes), one 2-D product.
     * Left batched, oneDNN ran [1,56,56,384] x [384,96] (a ConvNeXt
     * block's Linear, channels-last) as 56 small products on unpacked
     * weights, at a sixth of the 2-D product's speed. */
    if (!b_batch && sh.r > 2) {
        int64_t rows = 1;
        for (int i = 0; i < sh.r - 1; i++) rows *= sh.a[i];
        int64_t k = sh.a[sh.r - 1], n = sh.b[sh.r - 1];
        sh.r = 2;
        sh.a[0] = rows, sh.a[1] = k;
        sh.b[0] = k, sh.b[1] = n;
        sh.y[0] = rows, sh.y[1] = n;
    }
    dnnl_memory_desc_t a_md, b_md, y_md, bias_md;
    int64_t bd[TENSOR_MAX_DIMS];
    for (int i = 0; i < sh.r; i++) bd[i] = 1;
    if (bias) bd[sh.r - 1] = bias->dims[0];
    dnnl_util_plain_md(&a_md, sh.r, sh.a);
    dnnl_util_plain_md(&b_md, sh.r, sh.b);
    dnnl_util_plain_md(&y_md, sh.r, sh.y);
    dnnl_util_plain_md(&bias_md, sh.r, bd);
    /* A constant B with no batch of its own gets a packed layout. */
    const void *b_const = b->data && !b_batch ? b->data : NULL;
    if (b_const && mm_gemv_fits(sh.a[0], sh.a[1], sh.b[1])) /* folded to 2-D above */
        return mm_gemv_prepare(c, s, b_const, sh.a[0], sh.a[1], sh.b[1], sh.b[1], 1, 1.0f, state, scratch_size);
    rc = cpu_mm_build(c, s, &a_md, &b_md, b_const, bias ? &bias_md : NULL, &y_md, 1.0f, 0, scratch_size);
    if (rc) {
        cpu_mm_release(s);
        return rc;
    }
    *state = s;
    return 0;
}

static int matmul_run(struct op_call *c) {
    struct cpu_mm_state *s = c->state;
    const struct tensor *bias = opt_in(c, 2);
    struct tensor *y = c->out[0];
    if (tensor_numel(y) == 0) return 0;
    if (s->packed) {
        mm_gemv_run(c, s, c->in[0]->data, s->k, bias ? bias->data : NULL, 1, s->n, 1.0f, y->data);
        return 0;
    }
    void *args[4] = {c->in[0]->data, c->in[1]->data, y->data, bias ? bias->data : NULL};
    int rc = dnnl_prim_exec(c, s->prim, args, c->scratch);
    if (!rc && s->act_after) op_apply_act(c->node, y->data, tensor_numel(y));
    return rc;
}

static int gemm_dims(struct op_call *c, int64_t *m, int64_t *k, int64_t *n) {
    const struct tensor *a = c->in[0], *b = c->in[1];
    if (a->ndim != 2 || b->ndim != 2) return op_error(c, "A and B must be 2-D (ranks %d and %d)", a->ndim, b->ndim);
    int ta = node_attr_int(c->node, "transA", 0) != 0, tb = node_attr_int(c->node, "transB", 0) != 0;
    *m = a->dims[ta ? 1 : 0];
    *k = a->dims[ta ? 0 : 1];
    *n = b->dims[tb ? 0 : 1];
    int64_t kb = b->dims[tb ? 1 : 0];
    if (*k >= 0 && kb >= 0 && *k != kb)
        return op_error(c, "inner dims differ: %lld (A) vs %lld (B)", (long long)*k, (long long)kb);
    return 0;
}

/* C must broadcast to [M, N] one way: returns its dims padded to 2. */
static int gemm_c_dims(struct op_call *c, const struct tensor *C, int64_t m, int64_t n, int64_t cd[2]) {
    if (C->ndim > 2) return op_error(c, "C must have rank <= 2 (got %d)", C->ndim);
    cd[0] = C->ndim == 2 ? C->dims[0] : 1;
    cd[1] = C->ndim >= 1 ? C->dims[C->ndim - 1] : 1;
    if ((cd[0] != 1 && cd[0] != m && m >= 0) || (cd[1] != 1 && cd[1] != n && n >= 0))
        return op_error(c, "C of shape [%lld,%lld] does not broadcast to [%lld,%lld]", (long long)cd[0],
                        (long long)cd[1], (long long)m, (long long)n);
    return 0;
}

static int gemm_infer(struct op_call *c) {
    const struct tensor *C = opt_in(c, 2);
    int rc;
    if ((rc = need_f32(c, c->in[0], "A")) || (rc = need_f32(c, c->in[1], "B"))) return rc;
    int64_t m, k, n, cd[2];
    if ((rc = gemm_dims(c, &m, &k, &n))) return rc;
    if (C && ((rc = need_f32(c, C, "C")) || (rc = gemm_c_dims(c, C, m, n, cd)))) return rc;
    struct tensor *y = c->out[0];
    y->dtype = DT_FP32;
    y->ndim = 2;
    y->dims[0] = m;
    y->dims[1] = n;
    return 0;
}

static int gemm_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    const struct tensor *b = c->in[1], *C = opt_in(c, 2);
    int64_t m, k, n, cd[2] = {1, 1};
    int rc = gemm_dims(c, &m, &k, &n);
    if (rc || (C && (rc = gemm_c_dims(c, C, m, n, cd)))) return rc;
    float alpha = node_attr_float(c->node, "alpha", 1.0f), beta = node_attr_float(c->node, "beta", 1.0f);
    int ta = node_attr_int(c->node, "transA", 0) != 0, tb = node_attr_int(c->node, "transB", 0) != 0;
    struct cpu_mm_state *s = calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory"), STATUS_NOMEM;
    s->m = m;
    s->n = n;
    /* A transposed A of one row is that row itself. */
    if (b->data && (!ta || m == 1) && mm_gemv_fits(m, k, n)) {
        s->fill_c = C && beta != 0.0f;
        s->beta = beta;
        return mm_gemv_prepare(c, s, b->data, m, k, n, tb ? 1 : n, tb ? k : 1, alpha, state, scratch_size);
    }
    dnnl_memory_desc_t a_md, b_md, y_md, bias_md;
    dnnl_dims_t ad = {m, k}, bdims = {k, n}, yd = {m, n}, biasd = {1, n};
    dnnl_dims_t as = {ta ? 1 : k, ta ? m : 1}, bs = {tb ? 1 : n, tb ? k : 1};
    dnnl_memory_desc_init_by_strides(&a_md, 2, ad, dnnl_f32, as);
    dnnl_memory_desc_init_by_strides(&b_md, 2, bdims, dnnl_f32, bs);
    dnnl_memory_desc_init_by_tag(&y_md, 2, yd, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&bias_md, 2, biasd, dnnl_f32, dnnl_ab);
    int use_bias = 0;
    if (C && beta != 0.0f) {
        /* A row of N values is oneDNN's bias when nothing scales it
         * differently from the product; otherwise dst is seeded with beta*C. */
        int row = cd[0] == 1 && cd[1] == n;
        if (row && alpha == 1.0f && (beta == 1.0f || C->data)) {
            use_bias = 1;
            if (beta != 1.0f) {
                s->bias = aligned_alloc(64, dnnl_util_align(sizeof(float) * (size_t)n));
                if (!s->bias) {
                    cpu_mm_release(s);
                    return op_error(c, "out of memory"), STATUS_NOMEM;
                }
                for (int64_t j = 0; j < n; j++) s->bias[j] = beta * ((const float *)C->data)[j];
            }
        } else {
            s->fill_c = 1;
            s->beta = beta;
        }
    }
    rc = cpu_mm_build(c, s, &a_md, &b_md, b->data, use_bias ? &bias_md : NULL, &y_md, alpha, s->fill_c, scratch_size);
    if (rc) {
        cpu_mm_release(s);
        return rc;
    }
    *state = s;
    return 0;
}

static int gemm_run(struct op_call *c) {
    struct cpu_mm_state *s = c->state;
    const struct tensor *C = opt_in(c, 2);
    struct tensor *y = c->out[0];
    if (tensor_numel(y) == 0) return 0;
    float *yd = y->data;
    int64_t cr = C && C->ndim == 2 ? C->dims[0] : 1, cc = C && C->ndim >= 1 ? C->dims[C->ndim - 1] : 1;
    if (s->packed) {
        mm_gemv_run(c, s, c->in[0]->data, s->k, s->fill_c ? C->data : NULL, cr, cc, s->beta, yd);
        return 0;
    }
    if (s->fill_c) {
        float beta = s->beta;
        const float *cv = C->data;
        for (int64_t i = 0; i < s->m; i++) {
            const float *row = cv + (cr == 1 ? 0 : i) * cc;
            float *out = yd + i * s->n;
            if (cc == 1)
                for (int64_t j = 0; j < s->n; j++) out[j] = beta * row[0];
            else
                for (int64_t j = 0; j < s->n; j++) out[j] = beta * row[j];
        }
    }
    void *bias = s->bias ? (void *)s->bias : (s->nargs == 4 ? C->data : NULL);
    void *args[4] = {c->in[0]->data, c->in[1]->data, yd, bias};
    int rc = dnnl_prim_exec(c, s->prim, args, c->scratch);
    if (!rc && s->act_after) op_apply_act(c->node, yd, tensor_numel(y));
    return rc;
}

/* ==== integer and quantized MatMul and Conv ============================= */

/* MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv on 8-bit
 * integers: products of zero-point-shifted values summed in int32, then
 * (QLinear*) scaled by x_scale * w_scale / y_scale in float32 as ONNX's
 * reference does, rounded half to even, shifted by y_zero_point and
 * saturated. Operands are widened to int32 (zero points subtracted) in
 * scratch, then summed by vectorizable loops: exact and parallel, without
 * the int8 GEMM kernels a quantized-model workload would want. */

int cpu_is_q8(enum dtype t) { return t == DT_UINT8 || t == DT_INT8; }

int cpu_need_q8(struct op_call *c, const struct tensor *t, const char *what) {
    if (!t || !cpu_is_q8(t->dtype)) {
        op_error(c, "%s must be uint8 or int8 (got %s)", what, t ? dtype_name(t->dtype) : "nothing");
        return STATUS_UNSUPPORTED;
    }
    return 0;
}

/* A zero point or scale: absent (0 / 1), one value, or one per index. */
int cpu_qparam_ok(struct op_call *c, const struct tensor *t, int64_t per, const char *what) {
    if (!t) return 0;
    int64_t n = tensor_numel(t);
    if (n != 1 && n != per) return op_error(c, "%s must hold 1 or %lld values (got %lld)", what, (long long)per, (long long)n);
    return 0;
}
double cpu_qparam_at(const struct tensor *t, int64_t i, double def) {
    if (!t) return def;
    return op_double_at(t, tensor_numel(t) == 1 ? 0 : i);
}

/* Requantizes an int32 sum the way ONNX's reference does. */
void cpu_q8_store(void *y, enum dtype dt, int64_t i, double v) {
    double r = nearbyint(v);
    if (dt == DT_UINT8) ((uint8_t *)y)[i] = (uint8_t)(r < 0 ? 0 : r > 255 ? 255 : r);
    else ((int8_t *)y)[i] = (int8_t)(r < -128 ? -128 : r > 127 ? 127 : r);
}

/* Widens an 8-bit tensor to int32 minus its zero point; zp is indexed by
 * (i / zp_div) % zp_mod (rows of A: div K, mod M; columns of B: div 1,
 * mod N; channels of W: div per-channel size). */
void cpu_q8_widen(const struct tensor *t, const struct tensor *zp, int64_t zp_div, int64_t zp_mod, int32_t *out) {
    int64_t n = tensor_numel(t);
    int scalar = !zp || tensor_numel(zp) == 1;
    int32_t z0 = (int32_t)cpu_qparam_at(zp, 0, 0);
    if (t->dtype == DT_UINT8) {
        const uint8_t *p = t->data;
        for (int64_t i = 0; i < n; i++) out[i] = (int32_t)p[i] - (scalar ? z0 : (int32_t)cpu_qparam_at(zp, (i / zp_div) % zp_mod, 0));
    } else {
        const int8_t *p = t->data;
        for (int64_t i = 0; i < n; i++) out[i] = (int32_t)p[i] - (scalar ? z0 : (int32_t)cpu_qparam_at(zp, (i / zp_div) % zp_mod, 0));
    }
}

/* int32 batched matmul with numpy broadcasting over operands already
 * shifted by their zero points. */
void cpu_imm_run(const struct cpu_mm_shape *sh, const int32_t *a, const int32_t *b, int32_t *acc, int nthreads) {
    int r = sh->r;
    int64_t M = sh->a[r - 2], K = sh->a[r - 1], N = sh->b[r - 1], nb = prod(sh->y, r - 2);
#pragma omp parallel for collapse(2) if (nb * M * N * K > 65536) num_threads(nthreads > 0 ? nthreads : 1)
    for (int64_t bi = 0; bi < nb; bi++)
        for (int64_t m = 0; m < M; m++) {
            int64_t rem = bi, ao = 0, bo = 0, as = 1, bs = 1;
            for (int i = r - 3; i >= 0; i--) {
                int64_t ix = rem % sh->y[i];
                rem /= sh->y[i];
                ao += (sh->a[i] == 1 ? 0 : ix) * as;
                bo += (sh->b[i] == 1 ? 0 : ix) * bs;
                as *= sh->a[i];
                bs *= sh->b[i];
            }
            int32_t *row = acc + (bi * M + m) * N;
            const int32_t *ar = a + (ao * M + m) * K, *bm = b + bo * K * N;
            for (int64_t n = 0; n < N; n++) row[n] = 0;
            for (int64_t k = 0; k < K; k++) {
                int32_t av = ar[k];
                if (!av) continue;
                const int32_t *br = bm + k * N;
#pragma omp simd
                for (int64_t n = 0; n < N; n++) row[n] += av * br[n];
            }
        }
}

/* Scratch of the integer matmuls: widened A and B, then (QLinear) the sums. */
size_t cpu_imm_scratch(const struct tensor *a, const struct tensor *b, const struct tensor *y, int with_acc) {
    return dnnl_util_align(sizeof(int32_t) * (size_t)tensor_numel(a)) + dnnl_util_align(sizeof(int32_t) * (size_t)tensor_numel(b)) +
           (with_acc ? sizeof(int32_t) * (size_t)tensor_numel(y) : 0);
}

int cpu_imm_widened(struct op_call *c, const struct cpu_mm_shape *sh, const struct tensor *a, const struct tensor *za,
                       const struct tensor *b, const struct tensor *zb, int32_t **a32, int32_t **b32, int32_t **acc) {
    size_t need = cpu_imm_scratch(a, b, c->out[0], acc != NULL);
    if (c->scratch_size < need) return op_error(c, "internal: scratch too small");
    char *p = c->scratch;
    *a32 = (int32_t *)p;
    *b32 = (int32_t *)(p + dnnl_util_align(sizeof(int32_t) * (size_t)tensor_numel(a)));
    if (acc) *acc = (int32_t *)((char *)*b32 + dnnl_util_align(sizeof(int32_t) * (size_t)tensor_numel(b)));
    int64_t M = sh->a[sh->r - 2], K = sh->a[sh->r - 1], N = sh->b[sh->r - 1];
    cpu_q8_widen(a, za, K, M, *a32);
    cpu_q8_widen(b, zb, 1, N, *b32);
    return 0;
}

static int mmi_infer(struct op_call *c) {
    const struct tensor *a = c->in[0], *b = c->in[1];
    int rc;
    if ((rc = cpu_need_q8(c, a, "A")) || (rc = cpu_need_q8(c, b, "B"))) return rc;
    struct cpu_mm_shape sh;
    if ((rc = cpu_mm_shapes(c, a, b, &sh, c->out[0]))) return rc;
    if ((rc = cpu_qparam_ok(c, opt_in(c, 2), sh.a[sh.r - 2], "a_zero_point")) ||
        (rc = cpu_qparam_ok(c, opt_in(c, 3), sh.b[sh.r - 1], "b_zero_point")))
        return rc;
    c->out[0]->dtype = DT_INT32;
    return 0;
}

/* oneDNN's int8 matmul (qgemm.c) for a constant 2-D B and one zero
 * point of A; the loop above otherwise (state NULL). */
static void mmi_release(void *st) {
    cpu_qgemm_free(st);
    free(st);
}

static int mmi_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    *state = NULL;
    const struct tensor *a = c->in[0], *b = c->in[1], *za = opt_in(c, 2);
    if (cpu_qgemm_usable(b, opt_in(c, 3)) && (!za || tensor_numel(za) == 1) && tensor_numel(a) > 0 && b->dims[1] > 0) {
        struct cpu_qgemm *q = calloc(1, sizeof *q);
        if (!q) return op_error(c, "out of memory"), STATUS_NOMEM;
        if (!cpu_qgemm_build(c, q, tensor_numel(a) / b->dims[0], a->dtype, b, opt_in(c, 3), scratch_size)) {
            *state = q;
            return 0;
        }
        log_debug("MatMulInteger '%s': no oneDNN int8 matmul (%s), the exact loop runs", c->node->name, c->err ? c->err : "");
        free(q);
    }
    *scratch_size = cpu_imm_scratch(c->in[0], c->in[1], c->out[0], 0);
    return 0;
}

static int mmi_run(struct op_call *c) {
    if (c->state)
        return cpu_qgemm_run(c, c->state, c->in[0]->data, c->in[0]->dtype, (int32_t)cpu_qparam_at(opt_in(c, 2), 0, 0),
                             c->out[0]->data, NULL);
    struct cpu_mm_shape sh;
    int32_t *a32, *b32;
    int rc = cpu_mm_shapes(c, c->in[0], c->in[1], &sh, NULL);
    if (rc || (rc = cpu_imm_widened(c, &sh, c->in[0], opt_in(c, 2), c->in[1], opt_in(c, 3), &a32, &b32, NULL))) return rc;
    cpu_imm_run(&sh, a32, b32, c->out[0]->data, c->nthreads);
    return 0;
}

/* QLinearMatMul: a, a_scale, a_zero_point, b, b_scale, b_zero_point,
 * y_scale, y_zero_point. */
static int qmm_infer(struct op_call *c) {
    if (c->nin < 8) return op_error(c, "needs 8 inputs, got %d", c->nin);
    const struct tensor *a = c->in[0], *b = c->in[3], *yz = c->in[7];
    int rc;
    if ((rc = cpu_need_q8(c, a, "a")) || (rc = cpu_need_q8(c, b, "b"))) return rc;
    if (!c->in[1] || !c->in[4] || !c->in[6]) return op_error(c, "a_scale, b_scale and y_scale are required");
    struct cpu_mm_shape sh;
    if ((rc = cpu_mm_shapes(c, a, b, &sh, c->out[0]))) return rc;
    int64_t M = sh.a[sh.r - 2], N = sh.b[sh.r - 1];
    if ((rc = cpu_qparam_ok(c, c->in[1], M, "a_scale")) || (rc = cpu_qparam_ok(c, c->in[2], M, "a_zero_point")) ||
        (rc = cpu_qparam_ok(c, c->in[4], N, "b_scale")) || (rc = cpu_qparam_ok(c, c->in[5], N, "b_zero_point")) ||
        (rc = cpu_qparam_ok(c, c->in[6], 1, "y_scale")) || (rc = cpu_qparam_ok(c, yz, 1, "y_zero_point")))
        return rc;
    c->out[0]->dtype = yz ? yz->dtype : a->dtype;
    if (!cpu_is_q8(c->out[0]->dtype)) return op_error(c, "y_zero_point must be uint8 or int8"), STATUS_UNSUPPORTED;
    return 0;
}

static int qmm_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    *state = NULL;
    *scratch_size = cpu_imm_scratch(c->in[0], c->in[3], c->out[0], 1);
    return 0;
}

static int qmm_run(struct op_call *c) {
    struct cpu_mm_shape sh;
    int rc = cpu_mm_shapes(c, c->in[0], c->in[3], &sh, NULL);
    if (rc) return rc;
    struct tensor *y = c->out[0];
    int64_t ny = tensor_numel(y), M = sh.a[sh.r - 2], N = sh.b[sh.r - 1];
    int32_t *a32, *b32, *acc;
    if ((rc = cpu_imm_widened(c, &sh, c->in[0], c->in[2], c->in[3], c->in[5], &a32, &b32, &acc))) return rc;
    cpu_imm_run(&sh, a32, b32, acc, c->nthreads);
    float ys = (float)cpu_qparam_at(c->in[6], 0, 1.0);
    double yz = cpu_qparam_at(c->in[7], 0, 0.0);
    for (int64_t i = 0; i < ny; i++) {
        int64_t m = (i / N) % M, n = i % N;
        float mult = (float)cpu_qparam_at(c->in[1], m, 1.0) * (float)cpu_qparam_at(c->in[4], n, 1.0) / ys;
        cpu_q8_store(y->data, y->dtype, i, (double)acc[i] * mult + yz);
    }
    return 0;
}

/* A window of 1 to 3 spatial dims as three, the missing ones of extent 1,
 * so that one loop nest serves every rank. */
struct win3 {
    int64_t in[3], out[3], k[3], s[3], d[3], pl[3];
};

static void win3_of(const struct win *win, struct win3 *w) {
    for (int i = 0; i < 3; i++) {
        int on = i < win->nsp;
        w->in[i] = on ? win->in[i] : 1;
        w->out[i] = on ? win->out[i] : 1;
        w->k[i] = on ? win->k[i] : 1;
        w->s[i] = on ? win->s[i] : 1;
        w->d[i] = on ? win->d[i] : 1;
        w->pl[i] = on ? win->pl[i] : 0;
    }
}

/* The outputs o in [*lo, *hi) of one axis whose tap reads inside x:
 * 0 <= o * s + b < in, for a tap at offset b (t * d - pad). */
static inline void iconv_span(int64_t out, int64_t in, int64_t s, int64_t b, int64_t *lo, int64_t *hi) {
    int64_t l = b >= 0 ? 0 : (-b + s - 1) / s, h = in - 1 - b < 0 ? 0 : (in - 1 - b) / s + 1;
    if (h > out) h = out;
    *lo = l;
    *hi = h > l ? h : l;
}

/* One output row of the integer convolution's tap: y[i] += w * (x[i * s]
 * - xz) for i < n, x 8-bit of type T. The vector forms take 8 (AVX2) or 4
 * (SSE4.1) outputs a step, at stride 1 and 2 (a stride-2 step loads 16 or
 * 8 bytes and keeps the even ones, only while the last of them is inside
 * the row); the rest, and other strides, one at a time. */
#define ICONV_ROW_C(T)                                                                                        \
    static inline __attribute__((always_inline)) void iconv_row_c_##T(int32_t *restrict y, const T *restrict x, \
                                                                      int64_t n, int64_t s, int32_t w,         \
                                                                      int32_t xz) {                            \
        for (int64_t i = 0; i < n; i++) y[i] += w * ((int32_t)x[i * s] - xz);                                 \
    }
ICONV_ROW_C(uint8_t)
ICONV_ROW_C(int8_t)
#ifdef NN_X86
#define ICONV_ROW_SIMD(NAME, T, ATTR, VI, W, LOAD, CVT, SET1, SUB, MUL, ADD, LD, ST, EVEN)                       \
    ATTR static inline __attribute__((always_inline)) void NAME(int32_t *restrict y, const T *restrict x,      \
                                                                int64_t n, int64_t s, int32_t w, int32_t xz) { \
        const VI vw = SET1(w), vz = SET1(xz);                                                                 \
        int64_t i = 0;                                                                                        \
        if (s == 1)                                                                                           \
            for (; i + W <= n; i += W) {                                                                      \
                VI v = CVT(LOAD(x + i));                                                                      \
                ST((VI *)(void *)(y + i), ADD(LD((const VI *)(const void *)(y + i)), MUL(SUB(v, vz), vw)));    \
            }                                                                                                 \
        else if (s == 2)                                                                                      \
            for (; i + W < n; i += W) {                                                                       \
                VI v = CVT(EVEN(x + 2 * i));                                                                  \
                ST((VI *)(void *)(y + i), ADD(LD((const VI *)(const void *)(y + i)), MUL(SUB(v, vz), vw)));    \
            }                                                                                                 \
        for (; i < n; i++) y[i] += w * ((int32_t)x[i * s] - xz);                                              \
    }
/* The even bytes of 16 (AVX2: 8 of them) or of 8 (SSE4.1: 4 of them). */
#define ICONV_EVEN16(p)                                                                                       \
    _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p)),                                     \
                     _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1))
#define ICONV_EVEN8(p)                                                                                        \
    _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)(const void *)(p)),                                     \
                     _mm_setr_epi8(0, 2, 4, 6, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1))
#define ICONV_LOAD8(p) _mm_loadl_epi64((const __m128i *)(const void *)(p))
static inline __m128i iconv_load4(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm_cvtsi32_si128(v);
}
#define ICONV_LOAD4(p) iconv_load4(p)
ICONV_ROW_SIMD(iconv_row_avx2_uint8_t, uint8_t, __attribute__((target("arch=x86-64-v3"))), __m256i, 8, ICONV_LOAD8,
               _mm256_cvtepu8_epi32, _mm256_set1_epi32, _mm256_sub_epi32, _mm256_mullo_epi32, _mm256_add_epi32,
               _mm256_loadu_si256, _mm256_storeu_si256, ICONV_EVEN16)
ICONV_ROW_SIMD(iconv_row_avx2_int8_t, int8_t, __attribute__((target("arch=x86-64-v3"))), __m256i, 8, ICONV_LOAD8,
               _mm256_cvtepi8_epi32, _mm256_set1_epi32, _mm256_sub_epi32, _mm256_mullo_epi32, _mm256_add_epi32,
               _mm256_loadu_si256, _mm256_storeu_si256, ICONV_EVEN16)
/* The SSE4.1 rows where the build's baseline has it (x86-64-v2, kiln's
 * default; a build for plain x86-64, as the TSan one, keeps the C rows). */
#ifdef __SSE4_1__
ICONV_ROW_SIMD(iconv_row_sse_uint8_t, uint8_t, , __m128i, 4, ICONV_LOAD4, _mm_cvtepu8_epi32, _mm_set1_epi32,
               _mm_sub_epi32, _mm_mullo_epi32, _mm_add_epi32, _mm_loadu_si128, _mm_storeu_si128, ICONV_EVEN8)
ICONV_ROW_SIMD(iconv_row_sse_int8_t, int8_t, , __m128i, 4, ICONV_LOAD4, _mm_cvtepi8_epi32, _mm_set1_epi32,
               _mm_sub_epi32, _mm_mullo_epi32, _mm_add_epi32, _mm_loadu_si128, _mm_storeu_si128, ICONV_EVEN8)
#define ICONV_ROW_V2_U8 iconv_row_sse_uint8_t
#define ICONV_ROW_V2_S8 iconv_row_sse_int8_t
#endif
#endif
#ifndef ICONV_ROW_V2_U8
#define ICONV_ROW_V2_U8 iconv_row_c_uint8_t
#define ICONV_ROW_V2_S8 iconv_row_c_int8_t
#endif

/* One output plane of the integer convolution: yp [osz] += the taps of
 * cg input planes of 8-bit x (xp, isz apart, less their zero point xz)
 * times their widened weights (wp [cg, ksz]). Loops over the taps
 * outermost, each adding a weight times a run of x to a run of y (ROW), so
 * that the innermost loop is one output row along the last axis (the
 * geometry right-aligned: iconv_run); where a tap reads the padding is
 * worked out per tap, not per element. Integer sums, so any order and any
 * ISA gives the same result. */
#define ICONV_PLANE_BODY(NAME, T, ROW, ATTR)                                                                  \
    ATTR static void NAME(int32_t *yp, const void *xv, int32_t xz, const int32_t *wp, int64_t cg, int64_t isz, \
                          const struct win3 *w) {                                                             \
        const T *xp = xv;                                                                                     \
        const int64_t ksz = w->k[0] * w->k[1] * w->k[2];                                                      \
        for (int64_t ci = 0; ci < cg; ci++, xp += isz, wp += ksz)                                             \
            for (int64_t t0 = 0; t0 < w->k[0]; t0++) {                                                        \
                const int64_t b0 = t0 * w->d[0] - w->pl[0];                                                   \
                int64_t lo0, hi0;                                                                             \
                iconv_span(w->out[0], w->in[0], w->s[0], b0, &lo0, &hi0);                                     \
                for (int64_t t1 = 0; t1 < w->k[1]; t1++) {                                                    \
                    const int64_t b1 = t1 * w->d[1] - w->pl[1];                                               \
                    int64_t lo1, hi1;                                                                         \
                    iconv_span(w->out[1], w->in[1], w->s[1], b1, &lo1, &hi1);                                 \
                    for (int64_t t2 = 0; t2 < w->k[2]; t2++) {                                                \
                        const int32_t wv = wp[(t0 * w->k[1] + t1) * w->k[2] + t2];                            \
                        const int64_t b2 = t2 * w->d[2] - w->pl[2], s2 = w->s[2];                             \
                        int64_t lo2, hi2;                                                                     \
                        iconv_span(w->out[2], w->in[2], s2, b2, &lo2, &hi2);                                  \
                        if (!wv || lo2 == hi2 || lo1 == hi1) continue;                                        \
                        if (s2 == 1 && w->s[1] == 1 && w->out[2] == w->in[2]) {                               \
                            /* Rows as long as x's: the tap's rows are one run of the plane, less what it     \
                             * added at the row ends from the next or the last row (padding, really). */      \
                            const int64_t W = w->in[2], p0 = lo1 * W + lo2, p1 = (hi1 - 1) * W + hi2;           \
                            for (int64_t o0 = lo0; o0 < hi0; o0++) {                                          \
                                const int64_t i0 = o0 * w->s[0] + b0;                                         \
                                int32_t *y0 = yp + o0 * w->out[1] * W;                                        \
                                /* x at the run's first output (a tap inside x); output q reads xr[q - p0] */ \
                                const T *xr = xp + (i0 * w->in[1] + lo1 + b1) * W + lo2 + b2;                 \
                                ROW(y0 + p0, xr, p1 - p0, 1, wv, xz);                                         \
                                for (int64_t o1 = lo1; o1 < hi1; o1++) {                                      \
                                    const int64_t r = o1 * W - p0;                                            \
                                    for (int64_t o2 = 0; o2 < lo2 && o1 > lo1; o2++)                          \
                                        y0[p0 + r + o2] -= wv * ((int32_t)xr[r + o2] - xz);                   \
                                    for (int64_t o2 = hi2; o2 < W && o1 < hi1 - 1; o2++)                      \
                                        y0[p0 + r + o2] -= wv * ((int32_t)xr[r + o2] - xz);                   \
                                }                                                                             \
                            }                                                                                 \
                            continue;                                                                         \
                        }                                                                                     \
                        for (int64_t o0 = lo0; o0 < hi0; o0++)                                                \
                            for (int64_t o1 = lo1; o1 < hi1; o1++) {                                          \
                                const int64_t i0 = o0 * w->s[0] + b0, i1 = o1 * w->s[1] + b1;                 \
                                ROW(yp + (o0 * w->out[1] + o1) * w->out[2] + lo2,                             \
                                    xp + (i0 * w->in[1] + i1) * w->in[2] + lo2 * s2 + b2, hi2 - lo2, s2, wv, xz); \
                            }                                                                                 \
                    }                                                                                         \
                }                                                                                             \
            }                                                                                                 \
    }

typedef void (*iconv_plane_fn)(int32_t *yp, const void *xp, int32_t xz, const int32_t *wp, int64_t cg, int64_t isz,
                               const struct win3 *w);
ICONV_PLANE_BODY(iconv_plane_u8_v2, uint8_t, ICONV_ROW_V2_U8, )
ICONV_PLANE_BODY(iconv_plane_s8_v2, int8_t, ICONV_ROW_V2_S8, )
#ifdef NN_X86
ICONV_PLANE_BODY(iconv_plane_u8_v3, uint8_t, iconv_row_avx2_uint8_t, __attribute__((target("arch=x86-64-v3"))))
ICONV_PLANE_BODY(iconv_plane_s8_v3, int8_t, iconv_row_avx2_int8_t, __attribute__((target("arch=x86-64-v3"))))
static const iconv_plane_fn iconv_planes[2][2] = {{iconv_plane_u8_v2, iconv_plane_u8_v3},
                                                  {iconv_plane_s8_v2, iconv_plane_s8_v3}};
#else
static const iconv_plane_fn iconv_planes[2][2] = {{iconv_plane_u8_v2, iconv_plane_u8_v2},
                                                  {iconv_plane_s8_v2, iconv_plane_s8_v2}};
#endif

/* Integer convolution: y[n,m,o] = sum (x - xz) * (w - wz[m]) (+ bias),
 * w widened into scratch first (w32: numel int32), x read as it is.
 * The exact path where no 8-bit GEMM or oneDNN kernel applies: grouped
 * and depthwise ConvInteger, weights known only at run time, QLinearConv
 * without a oneDNN kernel that sums exactly. */
static void iconv_run(struct op_call *c, const struct tensor *x, const struct tensor *w, const struct tensor *xz,
                      const struct tensor *wz, const struct tensor *bias, const struct conv_geom *geom,
                      int32_t *w32, int32_t *acc) {
    const int64_t group = geom->group;
    /* The spatial axes right-aligned (a 1-D window is axis 2, the rows). */
    struct win3 w3;
    const int off = 3 - geom->win.nsp;
    for (int i = 0; i < 3; i++) {
        const int j = i - off, on = j >= 0;
        w3.in[i] = on ? geom->win.in[j] : 1;
        w3.out[i] = on ? geom->win.out[j] : 1;
        w3.k[i] = on ? geom->win.k[j] : 1;
        w3.s[i] = on ? geom->win.s[j] : 1;
        w3.d[i] = on ? geom->win.d[j] : 1;
        w3.pl[i] = on ? geom->win.pl[j] : 0;
    }
    const int64_t N = x->dims[0], C = x->dims[1], M = w->dims[0], cg = C / group, mg = M / group;
    const int64_t isz = w3.in[0] * w3.in[1] * w3.in[2], osz = w3.out[0] * w3.out[1] * w3.out[2];
    const int64_t ksz = w3.k[0] * w3.k[1] * w3.k[2];
    const int level = dnnl_util_isa_level();
    const iconv_plane_fn plane = iconv_planes[x->dtype == DT_INT8][level >= 3];
    const int32_t x0 = (int32_t)cpu_qparam_at(xz, 0, 0);
    cpu_q8_widen(w, wz, cg * ksz, M, w32);
#pragma omp parallel for collapse(2) if (N * M * osz * cg * ksz > 65536) num_threads(c->nthreads > 0 ? c->nthreads : 1)
    for (int64_t nn = 0; nn < N; nn++)
        for (int64_t m = 0; m < M; m++) {
            const int32_t bv = bias ? (int32_t)op_int_at(bias, m) : 0;
            int32_t *yp = acc + (nn * M + m) * osz;
            for (int64_t o = 0; o < osz; o++) yp[o] = bv;
            plane(yp, (const char *)x->data + (nn * C + m / mg * cg) * isz, x0, w32 + m * cg * ksz, cg, isz, &w3);
        }
}

/* Scratch of the integer convolutions: widened w, then the sums. */
static size_t iconv_scratch(const struct tensor *w, const struct tensor *y, int with_acc) {
    return dnnl_util_align(sizeof(int32_t) * (size_t)tensor_numel(w)) + (with_acc ? sizeof(int32_t) * (size_t)tensor_numel(y) : 0);
}

/* Geometry shared by ConvInteger (x at 0, w at 1) and QLinearConv (x at
 * 0, w at 3). */
static int iconv_geom(struct op_call *c, int wi, struct conv_geom *g) {
    const struct tensor *x = c->in[0], *w = opt_in(c, wi);
    int rc;
    if ((rc = cpu_need_q8(c, x, "x")) || (rc = cpu_need_q8(c, w, "w"))) return rc;
    if (w->ndim != x->ndim) return op_error(c, "w has rank %d, x has rank %d", w->ndim, x->ndim);
    if ((rc = conv_geom_read(c, x, w, g))) return rc;
    if (x->dims[1] != w->dims[1] * g->group || w->dims[0] % g->group)
        return op_error(c, "channels do not match: x has %lld, w expects %lld x group %lld", (long long)x->dims[1],
                        (long long)w->dims[1], (long long)g->group);
    return 0;
}

static int iconv_shape(struct op_call *c, int wi) {
    struct conv_geom g;
    int rc = iconv_geom(c, wi, &g);
    if (rc) return rc;
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0];
    y->ndim = x->ndim;
    y->dims[0] = x->dims[0];
    y->dims[1] = c->in[wi]->dims[0];
    for (int i = 0; i < g.win.nsp; i++) y->dims[2 + i] = g.win.out[i];
    return 0;
}

/* ConvInteger (x, w, x_zero_point?, w_zero_point?) and its dynamic
 * quantization's chain as one node, kiln.ConvIntegerToFloat (x, w,
 * x_scale, w_scale, x_zero_point?, w_zero_point?, bias?; Conv's attributes;
 * models/passes_dynq.c): the same int32 sums, then in the same kernel what
 * the graph did in float after them, (float)sum * (x_scale * w_scale[m]),
 * + bias[m], and a fused activation, with the same float operations. */
struct convi_io {
    int to_float;
    int w, xz, wz, xs, ws, bias; /* input indices */
};

/* QLinearConv's sums take the same paths (x_zero_point 2, w 3, w_zero_point 5). */
static struct convi_io convi_io(const struct op_call *c) {
    if (strcmp(c->node->op_type, "ConvIntegerToFloat") == 0) return (struct convi_io){1, 1, 4, 5, 2, 3, 6};
    if (strcmp(c->node->op_type, "QLinearConv") == 0) return (struct convi_io){0, 3, 2, 5, -1, -1, -1};
    return (struct convi_io){0, 1, 2, 3, -1, -1, -1};
}

static int convi_infer(struct op_call *c) {
    const struct convi_io io = convi_io(c);
    int rc = iconv_shape(c, 1);
    if (rc) return rc;
    const int64_t M = c->in[1]->dims[0];
    if ((rc = cpu_qparam_ok(c, opt_in(c, io.xz), 1, "x_zero_point")) || (rc = cpu_qparam_ok(c, opt_in(c, io.wz), M, "w_zero_point")))
        return rc;
    c->out[0]->dtype = DT_INT32;
    if (!io.to_float) return 0;
    const struct tensor *xs = opt_in(c, io.xs), *ws = opt_in(c, io.ws), *b = opt_in(c, io.bias);
    if (!xs || !ws) return op_error(c, "the scales are required");
    if (xs->dtype != DT_FP32 || tensor_numel(xs) != 1) return op_error(c, "x_scale must be one float32");
    if (ws->dtype != DT_FP32 || (tensor_numel(ws) != 1 && tensor_numel(ws) != M))
        return op_error(c, "w_scale must be float32 with 1 or M=%lld values", (long long)M);
    if (b && (b->dtype != DT_FP32 || tensor_numel(b) != M))
        return op_error(c, "bias must be float32 with M=%lld values", (long long)M);
    c->out[0]->dtype = DT_FP32;
    return 0;
}

/* The float epilogue of kiln.ConvIntegerToFloat, as the GEMM path's rows
 * run it (struct cpu_qgemm_epi), or NULL for ConvInteger. */
static const struct cpu_qgemm_epi *convi_epi(const struct op_call *c, struct convi_io io, struct cpu_qgemm_epi *e) {
    if (!io.to_float) return NULL;
    const struct tensor *ws = c->in[io.ws], *b = opt_in(c, io.bias);
    *e = (struct cpu_qgemm_epi){(float)cpu_qparam_at(c->in[io.xs], 0, 1.0), ws->data, tensor_numel(ws) > 1,
                                b ? b->data : NULL, c->node->act, c->node->act_alpha, c->node->act_beta};
    return e;
}

/* ConvInteger as one 8-bit GEMM: x's windows laid out as rows (im2col,
 * [N * out pixels, kernel * C] in 8 bits, a padded tap holding x's zero
 * point so that it adds nothing) times W^T, on cpu_qgemm (qgemm.c): oneDNN's
 * u8 x s8 int32 matmul with the zero points and a uint8 W's shift taken out
 * algebraically and, without VNNI, A in two 4-bit halves, so the sums are
 * exact on every ISA (onnxruntime's own ConvInteger is im2col and its
 * 8-bit GEMM too). oneDNN's int8 convolution is not used: its weights take
 * no zero point (a uint8 W shifted to int8 has one: a per-window
 * compensation), and without VNNI its int16 pair sums saturate (see
 * QLinearConv below). x is first transposed to channels-last, so that a
 * tap of a window is one run of C bytes (a 1x1 convolution without stride
 * or padding is that transpose alone), and W's columns are permuted to
 * (tap, channel) once at prepare. The sums [pixels, M] are then transposed
 * into y [N, M, pixels]. Grouped convolutions and weights known only at
 * run time keep the widened loop (state q zeroed). */
struct convi_state {
    struct conv_geom g;
    struct cpu_qgemm q;
    uint8_t *wp;         /* W as [M, kernel, C] (owned; NULL for a 1x1 kernel: W itself) */
    int64_t rows, kcols; /* N * output pixels; kernel extent * C */
    int direct;          /* 1x1, stride 1, no padding: x channels-last is A */
    size_t q_scratch;    /* q's scratch, before x channels-last, the columns and the sums */
    size_t scratch;      /* all of it */
    struct convi_io io;  /* the node's inputs (convi_io), read once at prepare */
};

static void convi_release(void *st) {
    struct convi_state *s = st;
    if (s) cpu_qgemm_free(&s->q);
    if (s) free(s->wp);
    free(s);
}

static size_t convi_xt_bytes(const struct tensor *x) { return dnnl_util_align((size_t)tensor_numel(x)); }

/* Builds s->q when the GEMM applies; 0 with s->q zeroed when it does not. */
static int convi_gemm_build(struct op_call *c, struct convi_state *s, size_t *scratch_size) {
    const struct convi_io io = s->io = convi_io(c);
    const struct tensor *x = c->in[0], *w = c->in[io.w], *wz = opt_in(c, io.wz);
    struct win3 w3;
    win3_of(&s->g.win, &w3);
    const int64_t M = w->dims[0], C = w->dims[1], ksz = w3.k[0] * w3.k[1] * w3.k[2];
    s->kcols = C * ksz;
    s->rows = x->dims[0] * w3.out[0] * w3.out[1] * w3.out[2];
    if (s->g.group != 1 || !w->data || (wz && !wz->data) || s->rows <= 0 || s->kcols <= 0 || M <= 0) return 0;
    s->direct = ksz == 1;
    for (int i = 0; i < 3; i++) s->direct &= w3.s[i] == 1 && w3.pl[i] == 0 && w3.out[i] == w3.in[i];
    struct tensor bt = {w->dtype, 2, {M, s->kcols}, w->data};
    if (ksz > 1) {
        if (!(s->wp = malloc((size_t)(M * s->kcols)))) return op_error(c, "out of memory"), STATUS_NOMEM;
        const uint8_t *wd = w->data;
        for (int64_t m = 0; m < M; m++)
            for (int64_t ci = 0; ci < C; ci++)
                for (int64_t t = 0; t < ksz; t++) s->wp[(m * ksz + t) * C + ci] = wd[(m * C + ci) * ksz + t];
        bt.data = s->wp;
    }
    size_t qs = 0;
    if (cpu_qgemm_build_bt(c, &s->q, s->rows, x->dtype, &bt, wz, &qs)) {
        log_debug("ConvInteger '%s': no oneDNN int8 matmul (%s), the exact loop runs", c->node->name, c->err ? c->err : "");
        if (c->err && c->err_len) c->err[0] = 0;
        return 0;
    }
    s->q_scratch = dnnl_util_align(qs);
    *scratch_size = s->scratch = s->q_scratch + convi_xt_bytes(x) + (s->direct ? 0 : dnnl_util_align((size_t)(s->rows * s->kcols))) +
                    sizeof(int32_t) * (size_t)(s->rows * M);
    return 0;
}

static int convi_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct convi_state *s = calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory"), STATUS_NOMEM;
    int rc = iconv_geom(c, 1, &s->g);
    if (!rc) rc = convi_gemm_build(c, s, scratch_size);
    if (rc) {
        convi_release(s);
        return rc;
    }
    if (!s->q.prim) *scratch_size = iconv_scratch(c->in[1], c->out[0], 0);
    *state = s;
    return 0;
}

/* The windows of xt (channels-last) as rows of cols [N * out pixels,
 * kernel * C]; a tap in the padding holds pad (x's zero point, whose
 * difference is 0). */
static void convi_columns(const uint8_t *xt, int64_t C, uint8_t pad, const struct win3 *w, int64_t rows,
                          uint8_t *cols, int nthreads) {
    const int64_t isz = w->in[0] * w->in[1] * w->in[2], osz = w->out[0] * w->out[1] * w->out[2];
    const int64_t kcols = C * w->k[0] * w->k[1] * w->k[2];
#pragma omp parallel for if (rows * kcols > (1 << 20)) num_threads(nthreads > 0 ? nthreads : 1)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = r / osz, o = r % osz;
        const int64_t o2 = o % w->out[2], o1 = (o / w->out[2]) % w->out[1], o0 = o / (w->out[2] * w->out[1]);
        uint8_t *row = cols + r * kcols;
        for (int64_t t0 = 0; t0 < w->k[0]; t0++) {
            const int64_t i0 = o0 * w->s[0] - w->pl[0] + t0 * w->d[0];
            for (int64_t t1 = 0; t1 < w->k[1]; t1++) {
                const int64_t i1 = o1 * w->s[1] - w->pl[1] + t1 * w->d[1];
                for (int64_t t2 = 0; t2 < w->k[2]; t2++, row += C) {
                    const int64_t i2 = o2 * w->s[2] - w->pl[2] + t2 * w->d[2];
                    if (i0 >= 0 && i0 < w->in[0] && i1 >= 0 && i1 < w->in[1] && i2 >= 0 && i2 < w->in[2])
                        memcpy(row, xt + (n * isz + (i0 * w->in[1] + i1) * w->in[2] + i2) * C, (size_t)C);
                    else
                        memset(row, pad, (size_t)C);
                }
            }
        }
    }
}

/* The sums (or, with ConvIntegerToFloat's epilogue, the floats) into dst
 * [N, M, out pixels]. */
static int convi_gemm_run(struct op_call *c, const struct convi_state *s, void *dst) {
    const struct tensor *x = c->in[0];
    const int64_t N = x->dims[0], C = x->dims[1], M = c->in[s->io.w]->dims[0], rows = s->rows;
    char *base = c->scratch;
    uint8_t *xt = (uint8_t *)(base + s->q_scratch), *cols = xt + convi_xt_bytes(x);
    int32_t *acc = (int32_t *)(s->direct ? cols : cols + dnnl_util_align((size_t)(rows * s->kcols)));
    if (c->scratch_size < (size_t)((char *)(acc + rows * M) - base)) return op_error(c, "internal: scratch too small");
    struct win3 w3;
    win3_of(&s->g.win, &w3);
    const int64_t isz = w3.in[0] * w3.in[1] * w3.in[2], osz = w3.out[0] * w3.out[1] * w3.out[2];
    const int32_t xz = (int32_t)cpu_qparam_at(opt_in(c, s->io.xz), 0, 0);
    cpu_transpose_2d(x->data, xt, N, C, isz, 1, c->nthreads);
    if (!s->direct) convi_columns(xt, C, (uint8_t)xz, &w3, rows, cols, c->nthreads);
    struct op_call qc = *c;
    qc.scratch_size = s->q_scratch;
    struct cpu_qgemm_epi e;
    int rc = cpu_qgemm_run(&qc, &s->q, s->direct ? xt : cols, x->dtype, xz, acc, convi_epi(c, s->io, &e));
    if (rc) return rc;
    /* [N, pixels, M] -> [N, M, pixels] (int32 sums or, with the epilogue,
     * floats: 4 bytes either way). */
    cpu_transpose_2d(acc, dst, N, osz, M, sizeof(int32_t), c->nthreads);
    return 0;
}

static int convi_run(struct op_call *c) {
    const struct convi_state *s = c->state;
    if (s->q.prim) return convi_gemm_run(c, s, c->out[0]->data);
    if (c->scratch_size < iconv_scratch(c->in[1], c->out[0], 0)) return op_error(c, "internal: scratch too small");
    iconv_run(c, c->in[0], c->in[1], opt_in(c, s->io.xz), opt_in(c, s->io.wz), NULL, &s->g, c->scratch,
              c->out[0]->data);
    struct cpu_qgemm_epi e;
    if (!convi_epi(c, s->io, &e)) return 0;
    /* The sums into floats in place, plane by plane, as the GEMM path's
     * epilogue computes them per row. */
    struct tensor *y = c->out[0];
    const int64_t M = y->dims[1], planes = y->dims[0] * M, osz = planes > 0 ? tensor_numel(y) / planes : 0;
#pragma omp parallel for if (planes * osz > 65536) num_threads(c->nthreads > 0 ? c->nthreads : 1)
    for (int64_t p = 0; p < planes; p++) {
        const int64_t m = p % M;
        const float mult = e.a_scale * e.b_scale[e.b_scale_per ? m : 0], b = e.bias ? e.bias[m] : 0.0f;
        int32_t *acc = (int32_t *)y->data + p * osz;
        float *yf = (float *)y->data + p * osz;
        if (e.bias) {
#pragma omp simd
            for (int64_t o = 0; o < osz; o++) {
                float v = (float)acc[o] * mult;
                yf[o] = v + b;
            }
        } else {
#pragma omp simd
            for (int64_t o = 0; o < osz; o++) yf[o] = (float)acc[o] * mult;
        }
        ew_act_f32(yf, osz, e.act, e.act_a, e.act_b);
    }
    return 0;
}

/* QLinearConv: x, x_scale, x_zero_point, w, w_scale, w_zero_point,
 * y_scale, y_zero_point, B (int32, optional). */
static int qconv_infer(struct op_call *c) {
    if (c->nin < 8) return op_error(c, "needs at least 8 inputs, got %d", c->nin);
    int rc = iconv_shape(c, 3);
    if (rc) return rc;
    int64_t M = c->in[3]->dims[0];
    const struct tensor *b = opt_in(c, 8), *yz = c->in[7];
    if (!c->in[1] || !c->in[4] || !c->in[6]) return op_error(c, "x_scale, w_scale and y_scale are required");
    if ((rc = cpu_qparam_ok(c, c->in[1], 1, "x_scale")) || (rc = cpu_qparam_ok(c, c->in[2], 1, "x_zero_point")) ||
        (rc = cpu_qparam_ok(c, c->in[4], M, "w_scale")) || (rc = cpu_qparam_ok(c, c->in[5], M, "w_zero_point")) ||
        (rc = cpu_qparam_ok(c, c->in[6], 1, "y_scale")) || (rc = cpu_qparam_ok(c, yz, 1, "y_zero_point")))
        return rc;
    if (b && (b->dtype != DT_INT32 || tensor_numel(b) != M)) return op_error(c, "B must be int32 with %lld values", (long long)M);
    c->out[0]->dtype = yz ? yz->dtype : c->in[0]->dtype;
    if (!cpu_is_q8(c->out[0]->dtype)) return op_error(c, "y_zero_point must be uint8 or int8"), STATUS_UNSUPPORTED;
    return 0;
}

/* QLinearConv on oneDNN's int8 convolution (u8s8 or s8s8, int32 sums)
 * where it applies: s8 weights with zero points 0 (what quantize_static
 * writes), constant scales and zero points, the activation of a fused
 * QDQ Relu or Clip. oneDNN scales each int32 sum (bias added) by x_scale *
 * w_scale / y_scale once, applies the activation there (Clip's bounds in
 * steps of y_scale), adds y_zero_point and rounds half to even: ONNX's
 * order up to the float rounding of that one product. Elsewhere (uint8
 * weights, weight zero points, scales computed at run time) the sums are
 * exact: ConvInteger's 8-bit GEMM for group 1 with constant weights, the
 * exact loop above otherwise, then requantized in double (qconv_run).
 *
 * Without VNNI (AVX2, AVX-512 before Cascade Lake) oneDNN multiplies u8 by
 * s8 with vpmaddubsw, which sums pairs of products into int16 and
 * saturates, and for s8 inputs halves the weights: measured up to 2
 * output steps off ONNX's reference on the small ResNet of the tests. There
 * the int8 convolution runs only when no pair can saturate (u8 input,
 * 2 * 255 * max|w| <= 32767: dnnl_util_int8_conv_exact). */
static int qconv_dnnl_usable(struct op_call *c) {
    const struct tensor *x = c->in[0], *w = c->in[3];
    if (x->ndim < 3 || x->ndim > 5 || !dnnl_util_int8_conv_exact(x->dtype, w, opt_in(c, 5))) return 0;
    for (int k = 1; k < 8; k++)
        if (k != 3 && c->in[k] && !c->in[k]->data) return 0;
    enum act_kind a = c->node->act;
    return a == ACT_NONE || a == ACT_RELU || a == ACT_CLIP;
}

static dnnl_data_type_t q8_dnnl(enum dtype t) { return t == DT_UINT8 ? dnnl_u8 : dnnl_s8; }

/* The attribute of the int8 convolution: output scales, zero points, the
 * activation in output steps. NULL on failure. */
static dnnl_primitive_attr_t qconv_attr(struct op_call *c) {
    int64_t m = c->in[3]->dims[0];
    const struct tensor *ws = c->in[4];
    float xs = (float)cpu_qparam_at(c->in[1], 0, 1.0), ys = (float)cpu_qparam_at(c->in[6], 0, 1.0);
    int32_t xz = (int32_t)cpu_qparam_at(opt_in(c, 2), 0, 0), yz = (int32_t)cpu_qparam_at(opt_in(c, 7), 0, 0);
    int per = tensor_numel(ws) != 1;
    float *sc = malloc(sizeof(float) * (size_t)(per ? m : 1));
    dnnl_primitive_attr_t attr = sc ? dnnl_util_attr() : NULL;
    dnnl_post_ops_t po = NULL;
    int ok = attr != NULL;
    for (int64_t i = 0; ok && i < (per ? m : 1); i++) sc[i] = xs * (float)cpu_qparam_at(ws, i, 1.0) / ys;
    ok = ok && dnnl_primitive_attr_set_output_scales(attr, per ? m : 1, per ? 1 << 1 : 0, sc) == dnnl_success;
    ok = ok && (!xz || dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_SRC, 1, 0, &xz) == dnnl_success);
    ok = ok && (!yz || dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_DST, 1, 0, &yz) == dnnl_success);
    if (ok && c->node->act != ACT_NONE) {
        int clip = c->node->act == ACT_CLIP;
        ok = dnnl_post_ops_create(&po) == dnnl_success &&
             dnnl_post_ops_append_eltwise(po, 1.0f, clip ? dnnl_eltwise_clip : dnnl_eltwise_relu,
                                          clip ? c->node->act_alpha / ys : 0.0f,
                                          clip ? c->node->act_beta / ys : 0.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    }
    if (po) dnnl_post_ops_destroy(po);
    free(sc);
    if (!ok && attr) {
        dnnl_primitive_attr_destroy(attr);
        attr = NULL;
    }
    return attr;
}

/* Builds s's int8 convolution; nonzero when oneDNN has none for it. */
static int qconv_build(struct op_call *c, struct conv_state *s, size_t *scratch_size) {
    const struct tensor *x = c->in[0], *w = c->in[3], *b = opt_in(c, 8);
    dnnl_util_set_threads(c->nthreads);
    if (!dnnl_util_engine()) return -1;
    s->const_weights = 1;
    dnnl_memory_desc_t w_user;
    struct conv_desc d;
    if (conv_w_md(&w_user, w, s->g.group) || conv_desc_init(&d, x, c->out[0], b, &w_user, &s->g.win)) return -1;
    /* conv_desc_init describes float32 tensors: the same layouts in 8 bits. */
    d.w_user.data_type = d.w_any.data_type = dnnl_s8;
    d.src_plain.data_type = d.src_any.data_type = q8_dnnl(x->dtype);
    d.dst_plain.data_type = d.dst_any.data_type = q8_dnnl(c->out[0]->dtype);
    d.b.data_type = dnnl_s32;
    int64_t lay = node_attr_int(c->node, "kiln_layout", 0);
    if (conv_desc_layout(&d, x, c->out[0], lay)) return -1;
    if (lay & 1) d.src_any = d.src_plain;
    if (lay & 2) d.dst_any = d.dst_plain;
    dnnl_primitive_attr_t attr = qconv_attr(c);
    if (!attr) return -1;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct,
                                                                  &d.src_any, &d.w_any, b ? &d.b : NULL, &d.dst_any,
                                                                  d.strides, d.dil, d.pl, d.pr);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &cd, attr, dnnl_util_engine(), NULL);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return -1;
    int rc = conv_finish(c, s, pd, &d, w->data, scratch_size);
    dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* The int8 convolution where oneDNN has one, else the exact loop (state:
 * the geometry, s->conv NULL). */
static int qconv_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct conv_state *s = calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory"), STATUS_NOMEM;
    int rc = iconv_geom(c, 3, &s->g);
    if (rc) {
        free(s);
        return rc;
    }
    int usable = qconv_dnnl_usable(c);
    if (node_attr_int(c->node, "kiln_layout", 0) && (!usable || qconv_build(c, s, scratch_size))) {
        conv_release(s);
        return op_error(c, "internal: x or y is stored NHWC but oneDNN has no int8 convolution for this node");
    }
    if (s->conv) {
        *state = s;
        return 0;
    }
    if (usable && qconv_build(c, s, scratch_size)) {
        log_debug("QLinearConv '%s': no oneDNN int8 convolution, the exact loop runs", c->node->name);
        struct conv_geom g = s->g;
        conv_release(s);
        if (!(s = calloc(1, sizeof *s))) return op_error(c, "out of memory"), STATUS_NOMEM;
        s->g = g;
    }
    if (!s->conv) {
        /* Exact: the 8-bit GEMM of ConvInteger where it applies (group 1,
         * constant weights), else the loop; both sum into int32 first. */
        *scratch_size = iconv_scratch(c->in[3], c->out[0], 1);
        struct convi_state *e = calloc(1, sizeof *e);
        if (!e) {
            conv_release(s);
            return op_error(c, "out of memory"), STATUS_NOMEM;
        }
        e->g = s->g;
        size_t es = 0;
        int rc2 = convi_gemm_build(c, e, &es);
        if (rc2) {
            convi_release(e);
            conv_release(s);
            return rc2;
        }
        if (e->q.prim) {
            s->exact = e;
            *scratch_size = dnnl_util_align(e->scratch) + sizeof(int32_t) * (size_t)tensor_numel(c->out[0]);
        } else {
            convi_release(e);
        }
    }
    *state = s;
    return 0;
}

/* One output plane of QLinearConv's exact path: y = saturate(round(act((a
 * + bv) * mult) + yz)), act a clamp to [lo, hi] (infinite for none, [0, inf)
 * for Relu, the fused activation's bounds in output steps for Clip), round
 * half to even (cpu_q8_store's arithmetic), in one loop per type that the
 * compiler can vectorise. */
#define QCONV_REQUANT_LOOP(T, QLO, QHI)                                                                       \
    do {                                                                                                      \
        T *restrict yt = y;                                                                                   \
        _Pragma("omp simd") for (int64_t o = 0; o < n; o++) {                                                 \
            double v = (double)(int32_t)((uint32_t)a[o] + (uint32_t)bv) * mult;                               \
            v = v < lo ? lo : v > hi ? hi : v;                                                                \
            double r = nearbyint(v + yz);                                                                     \
            yt[o] = (T)(r < QLO ? QLO : r > QHI ? QHI : r);                                                   \
        }                                                                                                     \
    } while (0)

static inline __attribute__((always_inline)) void qconv_requant_body(const int32_t *restrict a, int32_t bv,
                                                                     double mult, double lo, double hi, double yz,
                                                                     void *restrict y, enum dtype dt, int64_t n) {
    if (dt == DT_UINT8) QCONV_REQUANT_LOOP(uint8_t, 0, 255);
    else QCONV_REQUANT_LOOP(int8_t, -128, 127);
}

typedef void (*qconv_requant_fn)(const int32_t *a, int32_t bv, double mult, double lo, double hi, double yz, void *y,
                                 enum dtype dt, int64_t n);
#define QCONV_REQUANT(SUF, ATTR)                                                                              \
    ATTR static void qconv_requant_##SUF(const int32_t *a, int32_t bv, double mult, double lo, double hi,     \
                                         double yz, void *y, enum dtype dt, int64_t n) {                      \
        qconv_requant_body(a, bv, mult, lo, hi, yz, y, dt, n);                                                \
    }
QCONV_REQUANT(v2, )
#ifdef NN_X86
QCONV_REQUANT(v3, __attribute__((target("arch=x86-64-v3"))))
#else
#define qconv_requant_v3 qconv_requant_v2
#endif

static int qconv_run(struct op_call *c) {
    const struct conv_state *s = c->state;
    if (s->conv) return conv_exec(c, s, c->in[3]->data, opt_in(c, 8), NULL);
    struct tensor *y = c->out[0];
    const int64_t ny = tensor_numel(y), M = y->dims[1], planes = y->dims[0] * M, osz = planes > 0 ? ny / planes : 0;
    int32_t *acc;
    const struct tensor *bias = NULL; /* the GEMM's sums come without it */
    if (s->exact) {
        const size_t es = dnnl_util_align(s->exact->scratch);
        if (c->scratch_size < es + sizeof(int32_t) * (size_t)ny) return op_error(c, "internal: scratch too small");
        acc = (int32_t *)((char *)c->scratch + es);
        struct op_call ec = *c;
        ec.scratch_size = s->exact->scratch;
        int rc = convi_gemm_run(&ec, s->exact, acc);
        if (rc) return rc;
        bias = opt_in(c, 8);
    } else {
        if (c->scratch_size < iconv_scratch(c->in[3], y, 1)) return op_error(c, "internal: scratch too small");
        int32_t *w32 = c->scratch;
        acc = (int32_t *)((char *)w32 + dnnl_util_align(sizeof(int32_t) * (size_t)tensor_numel(c->in[3])));
        iconv_run(c, c->in[0], c->in[3], c->in[2], c->in[5], opt_in(c, 8), &s->g, w32, acc);
    }
    const float xs = (float)cpu_qparam_at(c->in[1], 0, 1.0), ys = (float)cpu_qparam_at(c->in[6], 0, 1.0);
    const double yz = cpu_qparam_at(c->in[7], 0, 0.0);
    /* qconv_act's clamp as bounds */
    double lo = -INFINITY, hi = INFINITY;
    if (c->node->act == ACT_RELU) lo = 0;
    if (c->node->act == ACT_CLIP) lo = c->node->act_alpha / ys, hi = c->node->act_beta / ys;
    const qconv_requant_fn requant = dnnl_util_isa_level() >= 3 ? qconv_requant_v3 : qconv_requant_v2;
#pragma omp parallel for if (ny > 65536) num_threads(c->nthreads > 0 ? c->nthreads : 1)
    for (int64_t p = 0; p < planes; p++) {
        const int64_t m = p % M;
        const float mult = xs * (float)cpu_qparam_at(c->in[4], m, 1.0) / ys;
        const int32_t bv = bias ? (int32_t)op_int_at(bias, m) : 0;
        requant(acc + p * osz, bv, mult, lo, hi, yz, (char *)y->data + p * osz, y->dtype, osz);
    }
    return 0;
}

/* ==== MaxPool and AveragePool ========================================== */

enum pool_kind { POOL_MAX, POOL_AVG, POOL_LP };

struct pool_state {
    struct dnnl_prim *prim; /* NULL: the C loop below */
    struct win win;
    enum pool_kind kind;
    int include_pad;
    int col_major;          /* MaxPool storage_order = 1 */
    int nhwc;               /* X and Y channels-last (kiln_layout 3) */
    int nhwc8;              /* the same for an 8-bit MaxPool (its own loop) */
    int plain2d;            /* float 2-D max or average pool, no dilation, no Indices: pool2d_rows */
    float p;                /* LpPool */
};

static int pool_read(struct op_call *c, enum pool_kind kind, struct win *w, int *include_pad, int *col_major) {
    const struct tensor *x = c->in[0];
    int rc = 0;
    /* MaxPool also takes 8-bit integers (opset 12): exact through float. */
    if (!(kind == POOL_MAX && (x->dtype == DT_UINT8 || x->dtype == DT_INT8)) && (rc = need_f32(c, x, "X"))) return rc;
    int64_t ceil_mode = node_attr_int(c->node, "ceil_mode", 0);
    *include_pad = kind == POOL_AVG && node_attr_int(c->node, "count_include_pad", 0) != 0;
    int64_t so = node_attr_int(c->node, "storage_order", 0);
    if (so != 0 && so != 1) return op_error(c, "storage_order must be 0 or 1 (got %lld)", (long long)so);
    *col_major = so == 1;
    return win_setup(c, x, NULL, ceil_mode != 0, w);
}

static int pool_infer(struct op_call *c, enum pool_kind kind) {
    struct win w;
    int inc, cm, rc = pool_read(c, kind, &w, &inc, &cm);
    if (rc) return rc;
    const struct tensor *x = c->in[0];
    for (int o = 0; o < c->nout && o < 2; o++) {
        struct tensor *y = c->out[o];
        if (!y) continue;
        y->dtype = o == 0 ? x->dtype : DT_INT64;
        y->ndim = x->ndim;
        y->dims[0] = x->dims[0];
        y->dims[1] = x->dims[1];
        for (int i = 0; i < w.nsp; i++) y->dims[2 + i] = w.out[i];
    }
    return 0;
}
static int maxpool_infer(struct op_call *c) { return pool_infer(c, POOL_MAX); }
static int avgpool_infer(struct op_call *c) { return pool_infer(c, POOL_AVG); }
static int lppool_infer(struct op_call *c) { return pool_infer(c, POOL_LP); }

static void pool_release(void *st) {
    struct pool_state *s = st;
    if (!s) return;
    dnnl_prim_free(s->prim);
    free(s);
}

static int pool_prepare_any(struct op_call *c, enum pool_kind kind, void **state, size_t *scratch_size) {
    struct pool_state *s = calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory"), STATUS_NOMEM;
    int rc = pool_read(c, kind, &s->win, &s->include_pad, &s->col_major);
    if (rc) {
        free(s);
        return rc;
    }
    s->kind = kind;
    s->nhwc = layout_of(c->node) == 3 && c->in[0]->ndim == 4 && c->in[0]->dtype == DT_FP32;
    s->nhwc8 = layout_of(c->node) == 3 && c->in[0]->ndim == 4 && c->in[0]->dtype != DT_FP32 && kind == POOL_MAX &&
               !has_out(c, 1);
    s->p = (float)node_attr_int(c->node, "p", 2);
    s->plain2d = (kind == POOL_MAX || kind == POOL_AVG) && s->win.nsp == 2 && s->win.d[0] == 1 && s->win.d[1] == 1 &&
                 c->in[0]->dtype == DT_FP32 && c->in[0]->ndim == 4 && !has_out(c, 1);
    *state = s;
    *scratch_size = 0;
    if (kind == POOL_LP) {
        if (s->p <= 0) return op_error(c, "p must be positive (got %g)", (double)s->p);
        return 0; /* oneDNN has no Lp pooling: the C loop */
    }
    const struct win *w = &s->win;
    /* oneDNN divides by the whole kernel when padding counts; ONNX clips the
     * window to the padded input, which differs once a ceil-mode window
     * hangs past the end padding. Those, dilated averages and the Indices
     * output take the C loop. 8-bit MaxPool takes pool_max_*: oneDNN's
     * int8 pooling on ONNX's NCHW layout is its reference loop, ~100x
     * slower. */
    int use_dnnl = !has_out(c, 1) && c->in[0]->dtype == DT_FP32;
    if (c->in[0]->dtype != DT_FP32)
        *scratch_size = dnnl_util_align(sizeof(float) * (size_t)tensor_numel(c->in[0])) +
                        sizeof(float) * (size_t)tensor_numel(c->out[0]);
    for (int i = 0; i < w->nsp; i++) {
        if (win_dnnl_pr(w, i) < 0) use_dnnl = 0;
        if (kind == POOL_AVG && w->d[i] != 1) use_dnnl = 0;
        if (kind == POOL_AVG && s->include_pad &&
            (w->out[i] - 1) * w->s[i] + w->k[i] > w->in[i] + w->pl[i] + w->pr[i])
            use_dnnl = 0;
    }
    if (!use_dnnl || !dnnl_util_engine()) return 0;
    dnnl_util_set_threads(c->nthreads);
    dnnl_memory_desc_t x_md, y_md;
    if (s->nhwc) {
        dnnl_util_nhwc_md(&x_md, c->in[0]->dims, dnnl_f32);
        dnnl_util_nhwc_md(&y_md, c->out[0]->dims, dnnl_f32);
    } else {
        dnnl_util_plain_md(&x_md, c->in[0]->ndim, c->in[0]->dims);
        dnnl_util_plain_md(&y_md, c->out[0]->ndim, c->out[0]->dims);
    }
    dnnl_dims_t st, k, dl, pl, pr;
    for (int i = 0; i < w->nsp; i++) {
        st[i] = w->s[i];
        k[i] = w->k[i];
        dl[i] = w->d[i] - 1;
        pl[i] = w->pl[i];
        pr[i] = win_dnnl_pr(w, i);
    }
    dnnl_alg_kind_t alg = kind == POOL_MAX ? dnnl_pooling_max
                          : s->include_pad ? dnnl_pooling_avg_include_padding
                                           : dnnl_pooling_avg_exclude_padding;
    dnnl_pooling_v2_desc_t pdsc;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = dnnl_util_attr();
    if (!attr) return 0;
    dnnl_status_t r = dnnl_pooling_v2_forward_desc_init(&pdsc, dnnl_forward_inference, alg, &x_md, &y_md, st, k, dl, pl, pr);
    if (r == dnnl_success) r = dnnl_primitive_desc_create(&pd, &pdsc, attr, dnnl_util_engine(), NULL);
    dnnl_primitive_attr_destroy(attr);
    if (r != dnnl_success) return 0; /* a shape oneDNN refuses: the C loop does it */
    /* Without AVX-512 oneDNN pools plain NCHW in its generic C loop
     * ("simple_nchw": 0.26 ms for a 32x16x64 MaxPool that its AVX-512 JIT
     * does in 0.015); kiln's own row loop is what runs then. Channels-last,
     * its AVX2 JIT took 1.1 ms for SqueezeNet's first MaxPool (64 channels,
     * 111x111, 3x3 stride 2) where kiln's channel-vector loop takes 0.41
     * (GoogLeNet's pools 9.9 -> 2.7 ms a run on an AVX2 AMD EPYC):
     * pool2d_nhwc runs those. */
    if (s->plain2d && s->nhwc && dnnl_util_isa_avx2()) {
        dnnl_primitive_desc_destroy(pd);
        return 0;
    }
    if (s->plain2d && !s->nhwc && !dnnl_util_is_jit(pd)) {
        dnnl_primitive_desc_destroy(pd);
        return 0;
    }
    int ids[2] = {DNNL_ARG_SRC, DNNL_ARG_DST};
    s->prim = dnnl_prim_create(c, pd, 2, ids, scratch_size);
    dnnl_primitive_desc_destroy(pd);
    if (!s->prim) *scratch_size = 0;
    return 0;
}
/* Channels-last pools that oneDNN does not run take the C loop on plain
 * copies in scratch. */
static int pool_prepare(struct op_call *c, enum pool_kind kind, void **state, size_t *scratch_size) {
    int rc = pool_prepare_any(c, kind, state, scratch_size);
    const struct pool_state *s = rc ? NULL : *state;
    if (s && s->nhwc && !s->prim && !s->plain2d)
        *scratch_size = dnnl_util_align(sizeof(float) * (size_t)tensor_numel(c->in[0])) +
                        sizeof(float) * (size_t)tensor_numel(c->out[0]);
    return rc;
}

static int maxpool_prepare(struct op_call *c, void **st, size_t *ss) { return pool_prepare(c, POOL_MAX, st, ss); }
static int avgpool_prepare(struct op_call *c, void **st, size_t *ss) { return pool_prepare(c, POOL_AVG, st, ss); }
static int lppool_prepare(struct op_call *c, void **st, size_t *ss) { return pool_prepare(c, POOL_LP, st, ss); }

/* The reference loop: any rank, dilation, ceil overhang and Indices. Spatial
 * dims are padded to three with size-1 dims. */
static void pool_loop(const struct pool_state *s, const struct tensor *x, float *y, int64_t *idx) {
    const struct win *w = &s->win;
    int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1}, st[3] = {1, 1, 1}, dl[3] = {1, 1, 1};
    int64_t pl[3] = {0, 0, 0}, pr[3] = {0, 0, 0};
    for (int i = 0; i < w->nsp; i++) {
        in[i] = w->in[i]; out[i] = w->out[i]; k[i] = w->k[i]; st[i] = w->s[i]; dl[i] = w->d[i];
        pl[i] = w->pl[i]; pr[i] = w->pr[i];
    }
    int64_t nc = x->dims[0] * x->dims[1], isz = in[0] * in[1] * in[2], osz = out[0] * out[1] * out[2];
    const float *xd = x->data;
#pragma omp parallel for if (nc * osz > 4096)
    for (int64_t p = 0; p < nc; p++) {
        const float *xp = xd + p * isz;
        for (int64_t o0 = 0; o0 < out[0]; o0++)
            for (int64_t o1 = 0; o1 < out[1]; o1++)
                for (int64_t o2 = 0; o2 < out[2]; o2++) {
                    int64_t b0 = o0 * st[0] - pl[0], b1 = o1 * st[1] - pl[1], b2 = o2 * st[2] - pl[2];
                    float best = -INFINITY, sum = 0;
                    int64_t bi = -1, cnt = 0, cnt_pad = 1;
                    int64_t pc[3];
                    int64_t bb[3] = {b0, b1, b2};
                    for (int d = 0; d < 3; d++) { /* taps inside the padded input */
                        pc[d] = 0;
                        for (int64_t t = 0; t < k[d]; t++) {
                            int64_t q = bb[d] + t * dl[d];
                            if (q >= -pl[d] && q < in[d] + pr[d]) pc[d]++;
                        }
                        cnt_pad *= pc[d];
                    }
                    for (int64_t t0 = 0; t0 < k[0]; t0++) {
                        int64_t i0 = b0 + t0 * dl[0];
                        if (i0 < 0 || i0 >= in[0]) continue;
                        for (int64_t t1 = 0; t1 < k[1]; t1++) {
                            int64_t i1 = b1 + t1 * dl[1];
                            if (i1 < 0 || i1 >= in[1]) continue;
                            for (int64_t t2 = 0; t2 < k[2]; t2++) {
                                int64_t i2 = b2 + t2 * dl[2];
                                if (i2 < 0 || i2 >= in[2]) continue;
                                float v = xp[(i0 * in[1] + i1) * in[2] + i2];
                                if (bi < 0 || v > best) {
                                    best = v;
                                    /* storage_order 1 numbers spatial elements column-major */
                                    bi = s->col_major ? i0 + in[0] * (i1 + in[1] * i2) : (i0 * in[1] + i1) * in[2] + i2;
                                }
                                sum += s->kind == POOL_LP ? (s->p == 2.0f ? v * v : powf(fabsf(v), s->p)) : v;
                                cnt++;
                            }
                        }
                    }
                    int64_t oi = p * osz + (o0 * out[1] + o1) * out[2] + o2;
                    if (s->kind == POOL_MAX) {
                        y[oi] = best;
                        if (idx) idx[oi] = p * isz + (bi < 0 ? 0 : bi);
                    } else if (s->kind == POOL_LP) {
                        y[oi] = s->p == 2.0f ? sqrtf(sum) : powf(sum, 1.0f / s->p);
                    } else {
                        int64_t div = s->include_pad ? cnt_pad : cnt;
                        y[oi] = div > 0 ? sum / (float)div : 0.0f;
                    }
                }
    }
}

/* MaxPool over 8-bit integers (no Indices): the max of the taps inside the
 * input, compared as integers. Along the last axis the outputs whose taps
 * all lie inside take a loop without bounds checks, which the compiler
 * vectorizes over outputs. */
#define POOL_MAX_Q8(T)                                                                                        \
    static void pool_max_##T(const struct win *w, int64_t nc, const T *xd, T *yd) {                          \
        int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1}, st[3] = {1, 1, 1}, dl[3] = {1, 1, 1}; \
        int64_t pl[3] = {0, 0, 0};                                                                            \
        int off = 3 - w->nsp; /* right-aligned: the last axis is always [2] */                               \
        for (int i = 0; i < w->nsp; i++) {                                                                    \
            in[off + i] = w->in[i]; out[off + i] = w->out[i]; k[off + i] = w->k[i];                           \
            st[off + i] = w->s[i]; dl[off + i] = w->d[i]; pl[off + i] = w->pl[i];                             \
        }                                                                                                     \
        int64_t isz = in[0] * in[1] * in[2], osz = out[0] * out[1] * out[2];                                  \
        /* outputs [lo2, hi2) along the last axis have every tap inside */                                    \
        int64_t lo2 = 0, hi2 = 0;                                                                             \
        while (lo2 < out[2] && lo2 * st[2] - pl[2] < 0) lo2++;                                                \
        for (hi2 = out[2]; hi2 > lo2 && (hi2 - 1) * st[2] - pl[2] + (k[2] - 1) * dl[2] >= in[2]; hi2--) {}    \
        for (int64_t p = 0; p < nc; p++) {                                                                    \
            const T *xp = xd + p * isz;                                                                       \
            T *yp = yd + p * osz;                                                                             \
            for (int64_t o0 = 0; o0 < out[0]; o0++)                                                           \
                for (int64_t o1 = 0; o1 < out[1]; o1++) {                                                     \
                    T *yr = yp + (o0 * out[1] + o1) * out[2];                                                 \
                    int any = 0;                                                                              \
                    for (int64_t t0 = 0; t0 < k[0]; t0++) {                                                   \
                        int64_t i0 = o0 * st[0] - pl[0] + t0 * dl[0];                                         \
                        if (i0 < 0 || i0 >= in[0]) continue;                                                  \
                        for (int64_t t1 = 0; t1 < k[1]; t1++) {                                               \
                            int64_t i1 = o1 * st[1] - pl[1] + t1 * dl[1];                                     \
                            if (i1 < 0 || i1 >= in[1]) continue;                                              \
                            const T *row = xp + (i0 * in[1] + i1) * in[2];                                    \
                            for (int64_t o2 = 0; o2 < out[2]; o2++) {                                         \
                                T m = any ? yr[o2] : (T)(sizeof(T) == 1 && (T)-1 < 0 ? -128 : 0);             \
                                if (o2 >= lo2 && o2 < hi2) {                                                  \
                                    const T *r = row + o2 * st[2] - pl[2];                                    \
                                    for (int64_t t2 = 0; t2 < k[2]; t2++)                                     \
                                        m = r[t2 * dl[2]] > m ? r[t2 * dl[2]] : m;                            \
                                } else {                                                                      \
                                    for (int64_t t2 = 0; t2 < k[2]; t2++) {                                   \
                                        int64_t i2 = o2 * st[2] - pl[2] + t2 * dl[2];                         \
                                        if (i2 >= 0 && i2 < in[2] && row[i2] > m) m = row[i2];                \
                                    }                                                                         \
                                }                                                                             \
                                yr[o2] = m;                                                                   \
                            }                                                                                 \
                            any = 1;                                                                          \
                        }                                                                                     \
                    }                                                                                         \
                    if (!any)                                                                                 \
                        for (int64_t o2 = 0; o2 < out[2]; o2++) yr[o2] = 0;                                   \
                }                                                                                             \
        }                                                                                                     \
    }
POOL_MAX_Q8(uint8_t)
POOL_MAX_Q8(int8_t)

/* The same on channels-last memory (kiln_layout 3 from the layout planners:
 * dims NCHW, bytes NHWC), 2 spatial dims: each output pixel the max of its
 * taps' channel rows, a loop over the channels the compiler vectorizes.
 * A pixel with no tap inside is 0, as above. */
#define POOL_MAX_Q8_NHWC(T)                                                                                   \
    static void pool_max_nhwc_##T(const struct win *w, int64_t nb, int64_t ch, const T *xd, T *yd, int nt) {  \
        const int64_t ih = w->in[0], iw = w->in[1], oh = w->out[0], ow = w->out[1];                          \
        const int64_t k0 = w->k[0], k1 = w->k[1], s0 = w->s[0], s1 = w->s[1], d0 = w->d[0], d1 = w->d[1];    \
        const int64_t p0 = w->pl[0], p1 = w->pl[1];                                                           \
        const T lowest = (T)((T)-1 < 0 ? -128 : 0);                                                           \
        _Pragma("omp parallel for collapse(2) if (nb * oh * ow * ch >= 65536) num_threads(nt)")               \
        for (int64_t b = 0; b < nb; b++)                                                                      \
            for (int64_t y0 = 0; y0 < oh; y0++)                                                               \
                for (int64_t x0 = 0; x0 < ow; x0++) {                                                         \
                    T *restrict yr = yd + ((b * oh + y0) * ow + x0) * ch;                                     \
                    int any = 0;                                                                              \
                    _Pragma("omp simd")                                                                       \
                    for (int64_t c = 0; c < ch; c++) yr[c] = lowest;                                          \
                    for (int64_t t0 = 0; t0 < k0; t0++) {                                                     \
                        const int64_t i0 = y0 * s0 - p0 + t0 * d0;                                            \
                        if (i0 < 0 || i0 >= ih) continue;                                                     \
                        for (int64_t t1 = 0; t1 < k1; t1++) {                                                 \
                            const int64_t i1 = x0 * s1 - p1 + t1 * d1;                                        \
                            if (i1 < 0 || i1 >= iw) continue;                                                 \
                            const T *restrict xr = xd + ((b * ih + i0) * iw + i1) * ch;                       \
                            _Pragma("omp simd")                                                               \
                            for (int64_t c = 0; c < ch; c++) yr[c] = xr[c] > yr[c] ? xr[c] : yr[c];           \
                            any = 1;                                                                          \
                        }                                                                                     \
                    }                                                                                         \
                    if (!any) memset(yr, 0, (size_t)ch);                                                      \
                }                                                                                             \
    }
POOL_MAX_Q8_NHWC(uint8_t)
POOL_MAX_Q8_NHWC(int8_t)

/* A float 2-D max or average pool without dilation over NCHW rows: each
 * output element from the window's taps clipped to the input, as pool_loop
 * computes them (the first tap starts the max, a later one replaces it only
 * when greater, so NaNs fall where they do there; an average divides by the
 * taps inside the input, or inside the padded input with count_include_pad),
 * with none of its per-element generality. */
/* The max of pool2d_rows in two passes per output row: the window's input
 * rows folded into one row first (a vector loop along the row), then each
 * output from its columns of that row. The same floats: in either order
 * an output is NaN exactly when its first tap is, else the greatest of
 * its taps that are numbers. 2.4 -> 0.89 ms for a 64x111x111 map,
 * 3x3 stride 2. Returns 0 when the row does not fit its buffer. */
static int pool2d_rows_max(const struct win *w, const float *xd, float *y, int64_t nc, int nthreads) {
    const int64_t ih = w->in[0], iw = w->in[1], oh = w->out[0], ow = w->out[1];
    const int64_t kh = w->k[0], kw = w->k[1], sh = w->s[0], sw = w->s[1], ph = w->pl[0], pw = w->pl[1];
    enum { ROW_MAX = 2048 };
    if (iw > ROW_MAX) return 0;
    PAR_FOR(nc * oh * ow > 4096, nthreads, ,
    for (int64_t p = 0; p < nc; p++) {
        float row[ROW_MAX];
        const float *xp = xd + p * ih * iw;
        float *yp = y + p * oh * ow;
        for (int64_t a = 0; a < oh; a++) {
            int64_t r0 = a * sh - ph, r1 = r0 + kh;
            if (r0 < 0) r0 = 0;
            if (r1 > ih) r1 = ih;
            float *yr = yp + a * ow;
            if (r1 <= r0) {
                for (int64_t b = 0; b < ow; b++) yr[b] = -INFINITY;
                continue;
            }
            memcpy(row, xp + r0 * iw, sizeof(float) * (size_t)iw);
            for (int64_t r = r0 + 1; r < r1; r++) {
                const float *restrict xr = xp + r * iw;
                _Pragma("omp simd")
                for (int64_t q = 0; q < iw; q++) row[q] = xr[q] > row[q] ? xr[q] : row[q];
            }
            for (int64_t b = 0; b < ow; b++) {
                int64_t c0 = b * sw - pw, c1 = c0 + kw;
                if (c0 < 0) c0 = 0;
                if (c1 > iw) c1 = iw;
                float best = c1 > c0 ? row[c0] : -INFINITY;
                for (int64_t q = c0 + 1; q < c1; q++) best = row[q] > best ? row[q] : best;
                yr[b] = best;
            }
        }
    });
    return 1;
}

static void pool2d_rows(const struct pool_state *s, const float *xd, float *y, int64_t nc, int nthreads) {
    const struct win *w = &s->win;
    const int64_t ih = w->in[0], iw = w->in[1], oh = w->out[0], ow = w->out[1];
    const int64_t kh = w->k[0], kw = w->k[1], sh = w->s[0], sw = w->s[1], ph = w->pl[0], pw = w->pl[1];
    const int64_t ph_end = ih + w->pr[0], pw_end = iw + w->pr[1];
    const int is_max = s->kind == POOL_MAX, incl = s->include_pad;
    if (is_max && pool2d_rows_max(w, xd, y, nc, nthreads)) return;
    PAR_FOR(nc * oh * ow > 4096, nthreads, ,
    for (int64_t p = 0; p < nc; p++) {
        const float *xp = xd + p * ih * iw;
        float *yp = y + p * oh * ow;
        for (int64_t a = 0; a < oh; a++) {
            int64_t r0 = a * sh - ph, r1 = r0 + kh;
            int64_t pr0 = r0 < -ph ? -ph : r0, pr1 = r1 > ph_end ? ph_end : r1; /* inside the padded input */
            if (r0 < 0) r0 = 0;
            if (r1 > ih) r1 = ih;
            for (int64_t b = 0; b < ow; b++) {
                int64_t c0 = b * sw - pw, c1 = c0 + kw;
                int64_t pc0 = c0 < -pw ? -pw : c0, pc1 = c1 > pw_end ? pw_end : c1;
                if (c0 < 0) c0 = 0;
                if (c1 > iw) c1 = iw;
                if (is_max) {
                    float best = -INFINITY;
                    int first = 1;
                    for (int64_t r = r0; r < r1; r++)
                        for (int64_t q = c0; q < c1; q++) {
                            float v = xp[r * iw + q];
                            if (first || v > best) best = v;
                            first = 0;
                        }
                    yp[a * ow + b] = best;
                } else {
                    float sum = 0;
                    for (int64_t r = r0; r < r1; r++)
                        for (int64_t q = c0; q < c1; q++) sum += xp[r * iw + q];
                    int64_t div = incl ? (pr1 > pr0 ? pr1 - pr0 : 0) * (pc1 > pc0 ? pc1 - pc0 : 0)
                                       : (r1 > r0 ? r1 - r0 : 0) * (c1 > c0 ? c1 - c0 : 0);
                    yp[a * ow + b] = div > 0 ? sum / (float)div : 0.0f;
                }
            }
        }
    });
}

/* pool2d_rows on channels-last memory: each output pixel's channels from
 * its window's taps clipped to the input, a vector of channels at a time
 * (the same floats: the first tap starts the max, a later one replaces it
 * only when greater; an average divides as there). One output row (image
 * n, output row a) per call, built per ISA: the baseline's 4 lanes left
 * GoogLeNet's pools at 1.07-1.17 ms a run with AVX2 (0.96 built for it;
 * onnxruntime 1.06). */
static inline __attribute__((always_inline)) void pool2d_nhwc_row_body(const struct pool_state *s, const float *xd,
                                                                       float *y, int64_t row, int64_t ch) {
    const struct win *w = &s->win;
    const int64_t ih = w->in[0], iw = w->in[1], oh = w->out[0], ow = w->out[1];
    const int64_t kh = w->k[0], kw = w->k[1], sh = w->s[0], sw = w->s[1], ph = w->pl[0], pw = w->pl[1];
    const int64_t ph_end = ih + w->pr[0], pw_end = iw + w->pr[1];
    const int is_max = s->kind == POOL_MAX, incl = s->include_pad;
    const int64_t n = row / oh, a = row % oh;
    const float *xn = xd + n * ih * iw * ch;
    int64_t r0 = a * sh - ph, r1 = r0 + kh;
    int64_t pr0 = r0 < -ph ? -ph : r0, pr1 = r1 > ph_end ? ph_end : r1;
    if (r0 < 0) r0 = 0;
    if (r1 > ih) r1 = ih;
    for (int64_t b = 0; b < ow; b++) {
        float *restrict yr = y + (row * ow + b) * ch;
        int64_t c0 = b * sw - pw, c1 = c0 + kw;
        int64_t pc0 = c0 < -pw ? -pw : c0, pc1 = c1 > pw_end ? pw_end : c1;
        if (c0 < 0) c0 = 0;
        if (c1 > iw) c1 = iw;
        if (r1 <= r0 || c1 <= c0) {
            const float v = is_max ? -INFINITY : 0.0f;
            for (int64_t k = 0; k < ch; k++) yr[k] = v;
            continue;
        }
        memcpy(yr, xn + (r0 * iw + c0) * ch, sizeof(float) * (size_t)ch);
        for (int64_t r = r0; r < r1; r++)
            for (int64_t q = r == r0 ? c0 + 1 : c0; q < c1; q++) {
                const float *restrict xr = xn + (r * iw + q) * ch;
                if (is_max) {
_Pragma("omp simd")
                    for (int64_t k = 0; k < ch; k++) yr[k] = xr[k] > yr[k] ? xr[k] : yr[k];
                } else {
_Pragma("omp simd")
                    for (int64_t k = 0; k < ch; k++) yr[k] += xr[k];
                }
            }
        if (!is_max) {
            int64_t div = incl ? (pr1 - pr0) * (pc1 - pc0) : (r1 - r0) * (c1 - c0);
_Pragma("omp simd")
            for (int64_t k = 0; k < ch; k++) yr[k] = yr[k] / (float)div;
        }
    }
}

DNNL_UTIL_ISA_CLONES(pool2d_nhwc_row, pool2d_nhwc_row_body,
                     (const struct pool_state *s, const float *xd, float *y, int64_t row, int64_t ch),
                     (s, xd, y, row, ch))

static void pool2d_nhwc(const struct pool_state *s, const float *xd, float *y, int64_t nb, int64_t ch, int nthreads) {
    const struct win *w = &s->win;
    PAR_FOR(nb * w->out[0] * w->out[1] * ch > 65536, nthreads, ,
            for (int64_t row = 0; row < nb * w->out[0]; row++) pool2d_nhwc_row(s, xd, y, row, ch););
}

static int pool_run(struct op_call *c) {
    struct pool_state *s = c->state;
    struct tensor *y = c->out[0];
    if (tensor_numel(y) == 0) return 0;
    if (s->prim) {
        void *args[2] = {c->in[0]->data, y->data};
        return dnnl_prim_exec(c, s->prim, args, c->scratch);
    }
    int64_t *idx = has_out(c, 1) ? c->out[1]->data : NULL;
    if (s->nhwc && s->plain2d) {
        const int64_t *d = c->in[0]->dims;
        pool2d_nhwc(s, c->in[0]->data, y->data, d[0], d[1], c->nthreads);
        return 0;
    }
    if (s->nhwc) {
        const struct tensor *x = c->in[0];
        struct tensor xf = *x;
        float *yf = (float *)((char *)c->scratch + dnnl_util_align(sizeof(float) * (size_t)tensor_numel(x)));
        xf.data = c->scratch;
        layout_nchw_from_nhwc(xf.data, x->data, x->dims[0], x->dims[1], x->dims[2] * x->dims[3]);
        pool_loop(s, &xf, yf, NULL);
        layout_nhwc_from_nchw(y->data, yf, y->dims[0], y->dims[1], y->dims[2] * y->dims[3]);
        return 0;
    }
    if (s->plain2d) {
        pool2d_rows(s, c->in[0]->data, y->data, c->in[0]->dims[0] * c->in[0]->dims[1], c->nthreads);
        return 0;
    }
    if (c->in[0]->dtype == DT_FP32) {
        pool_loop(s, c->in[0], y->data, idx);
        return 0;
    }
    int64_t nx = tensor_numel(c->in[0]), ny = tensor_numel(y);
    if (!idx && s->kind == POOL_MAX && s->nhwc8) {
        const int64_t *d = c->in[0]->dims;
        if (y->dtype == DT_UINT8) pool_max_nhwc_uint8_t(&s->win, d[0], d[1], c->in[0]->data, y->data, c->nthreads);
        else pool_max_nhwc_int8_t(&s->win, d[0], d[1], c->in[0]->data, y->data, c->nthreads);
        return 0;
    }
    if (!idx && s->kind == POOL_MAX) {
        int64_t nc = c->in[0]->dims[0] * c->in[0]->dims[1];
        if (y->dtype == DT_UINT8) pool_max_uint8_t(&s->win, nc, c->in[0]->data, y->data);
        else pool_max_int8_t(&s->win, nc, c->in[0]->data, y->data);
        return 0;
    }
    struct tensor xf = *c->in[0];
    float *yf = (float *)((char *)c->scratch + dnnl_util_align(sizeof(float) * (size_t)nx));
    xf.dtype = DT_FP32;
    xf.data = c->scratch;
    for (int64_t i = 0; i < nx; i++) ((float *)xf.data)[i] = (float)op_int_at(c->in[0], i);
    pool_loop(s, &xf, yf, idx);
    for (int64_t i = 0; i < ny; i++) {
        if (y->dtype == DT_UINT8) ((uint8_t *)y->data)[i] = (uint8_t)yf[i];
        else ((int8_t *)y->data)[i] = (int8_t)yf[i];
    }
    return 0;
}

/* ==== MaxUnpool ========================================================= */

/* Scatters X into zeros at MaxPool's flat Indices. The output shape is the
 * optional output_shape input (needed at plan time) or the inverse of the
 * pooling geometry. */
static int unpool_infer(struct op_call *c) {
    const struct tensor *x = c->in[0], *idx = c->in[1], *os = opt_in(c, 2);
    int rc = need_f32(c, x, "X");
    if (rc) return rc;
    if (!idx || idx->dtype != DT_INT64) return op_error(c, "I must be int64 indices");
    if (idx->ndim != x->ndim || tensor_numel(x) != tensor_numel(idx))
        return op_error(c, "I must have the shape of X");
    struct tensor *y = c->out[0];
    y->dtype = DT_FP32;
    y->ndim = x->ndim;
    if (os) {
        if (!os->data) return op_error(c, "output_shape must be known when the plan is built");
        if (tensor_numel(os) != x->ndim) return op_error(c, "output_shape must have %d values", x->ndim);
        for (int i = 0; i < x->ndim; i++) {
            y->dims[i] = op_int_at(os, i);
            if (y->dims[i] < 0) return op_error(c, "output_shape has a negative dim");
        }
        return 0;
    }
    /* the pooled geometry run backwards */
    struct win w;
    if ((rc = win_setup(c, x, NULL, 0, &w))) return rc;
    y->dims[0] = x->dims[0];
    y->dims[1] = x->dims[1];
    for (int i = 0; i < w.nsp; i++) y->dims[2 + i] = (x->dims[2 + i] - 1) * w.s[i] - w.pl[i] - w.pr[i] + w.k[i];
    return 0;
}

/* Indices number the elements of the inferred (pooling-inverse) shape; a
 * larger output_shape holds that block in its leading corner, as ONNX's
 * reference does. */
struct unpool_params {
    int64_t inf[TENSOR_MAX_DIMS]; /* the inferred shape */
};

static int unpool_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    const struct tensor *x = c->in[0], *y = c->out[0];
    struct win w;
    int rc = win_setup(c, x, NULL, 0, &w);
    if (rc) return rc;
    int64_t inf[TENSOR_MAX_DIMS];
    inf[0] = x->dims[0];
    inf[1] = x->dims[1];
    for (int i = 0; i < w.nsp; i++) {
        inf[2 + i] = (x->dims[2 + i] - 1) * w.s[i] - w.pl[i] - w.pr[i] + w.k[i];
        if (inf[2 + i] > y->dims[2 + i]) return op_error(c, "output_shape is smaller than the unpooled shape");
    }
    if (inf[0] != y->dims[0] || inf[1] != y->dims[1]) return op_error(c, "output_shape must keep N and C");
    struct unpool_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    memcpy(p->inf, inf, sizeof inf);
    *state = p;
    return 0;
}

static int unpool_run(struct op_call *c) {
    const struct tensor *x = c->in[0], *idx = c->in[1];
    struct tensor *y = c->out[0];
    const int64_t *inf = ((const struct unpool_params *)c->state)->inf;
    int64_t ninf = prod(inf, x->ndim), ny = tensor_numel(y), nx = tensor_numel(x);
    float *yd = y->data;
    const float *xd = x->data;
    const int64_t *id = idx->data;
    memset(yd, 0, sizeof(float) * (size_t)ny);
    for (int64_t i = 0; i < nx; i++) {
        if (id[i] < 0 || id[i] >= ninf)
            return op_error(c, "index %lld at position %lld is outside the unpooled tensor (%lld elements)",
                            (long long)id[i], (long long)i, (long long)ninf);
        int64_t rem = id[i], off = 0, stride = 1;
        for (int d = x->ndim - 1; d >= 0; d--) {
            off += (rem % inf[d]) * stride;
            rem /= inf[d];
            stride *= y->dims[d];
        }
        yd[off] = xd[i];
    }
    return 0;
}

/* ==== GlobalAveragePool and GlobalMaxPool ================================ */

static int global_pool_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int rc = need_f32(c, x, "X");
    if (rc) return rc;
    if (x->ndim < 2) return op_error(c, "input must have rank >= 2 (got %d)", x->ndim);
    struct tensor *y = c->out[0];
    y->dtype = DT_FP32;
    y->ndim = x->ndim;
    y->dims[0] = x->dims[0];
    y->dims[1] = x->dims[1];
    for (int i = 2; i < x->ndim; i++) y->dims[i] = 1;
    return 0;
}

/* X channels-last (kiln_layout 1): each image's pixels are rows of C
 * values, summed or maxed into Y's [N,C,1,1] (the same bytes either way). */
static inline __attribute__((always_inline)) void global_pool_nhwc_body(const struct tensor *x, float *y, int is_max) {
    int64_t n = x->dims[0], ch = x->dims[1], sp = x->dims[2] * x->dims[3];
    const float *xd = x->data;
    for (int64_t b = 0; b < n; b++) {
        float *yb = y + b * ch;
        for (int64_t k = 0; k < ch; k++) yb[k] = sp > 0 ? (is_max ? xd[b * sp * ch + k] : 0.0f) : 0.0f;
        for (int64_t p = is_max ? 1 : 0; p < sp; p++) {
            const float *row = xd + (b * sp + p) * ch;
            if (is_max)
                for (int64_t k = 0; k < ch; k++) yb[k] = row[k] > yb[k] ? row[k] : yb[k];
            else
#pragma omp simd
                for (int64_t k = 0; k < ch; k++) yb[k] += row[k];
        }
        if (!is_max && sp > 0)
            for (int64_t k = 0; k < ch; k++) yb[k] /= (float)sp;
    }
}

/* Built per ISA, as the pools above (the baseline's 4 lanes left
 * EfficientNet-B0's 16 squeeze-excitation means at 0.4 ms a run). */
DNNL_UTIL_ISA_CLONES(global_pool_nhwc, global_pool_nhwc_body, (const struct tensor *x, float *y, int is_max),
                     (x, y, is_max))

/* The inner loops of the per-channel kernels below, as functions: the
 * loops around them are PAR_FOR's arguments, where a #pragma cannot be. */
static inline float nn_sum_f32(const float *x, int64_t n) {
    float acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; i++) acc += x[i];
    return acc;
}

/* y = x * a + b for n floats. */
static inline void nn_affine_f32(const float *x, float *y, int64_t n, float a, float b) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * a + b;
}

/* y[i] = x[i] * a[i] + b[i] for n floats (a channels-last pixel). */
static inline void nn_affine_rows_f32(const float *x, float *y, int64_t n, const float *a, const float *b) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * a[i] + b[i];
}

/* acc[i] += x[i]^2 for n floats. */
static inline void nn_add_squares_f32(float *acc, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) acc[i] += x[i] * x[i];
}

static int global_pool_run(struct op_call *c, int is_max) {
    const struct tensor *x = c->in[0];
    float *y = c->out[0]->data;
    const float *xd = x->data;
    if (x->ndim == 4 && (layout_of(c->node) & 1)) {
        global_pool_nhwc(x, y, is_max);
        return 0;
    }
    int64_t nc = x->dims[0] * x->dims[1], sp = prod(x->dims + 2, x->ndim - 2);
    PAR_FOR(nc * sp > 65536, c->nthreads, ,
        for (int64_t p = 0; p < nc; p++) {
            const float *xp = xd + p * sp;
            if (is_max) {
                float m = sp > 0 ? xp[0] : -INFINITY;
                for (int64_t i = 1; i < sp; i++) m = xp[i] > m ? xp[i] : m;
                y[p] = m;
            } else {
                y[p] = sp > 0 ? nn_sum_f32(xp, sp) / (float)sp : 0.0f;
            }
        });
    return 0;
}
static int gap_run(struct op_call *c) { return global_pool_run(c, 0); }

struct glp_params {
    float p;
};

static int glp_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    float p = (float)node_attr_int(c->node, "p", 2);
    if (p <= 0) return op_error(c, "p must be positive (got %g)", (double)p);
    struct glp_params *gp = op_params_alloc(c, sizeof *gp);
    if (!gp) return STATUS_NOMEM;
    gp->p = p;
    *state = gp;
    return 0;
}

static int glp_run(struct op_call *c) {
    const struct glp_params *gp = c->state;
    const struct tensor *x = c->in[0];
    float *y = c->out[0]->data, p = gp->p;
    const float *xd = x->data;
    int64_t nc = x->dims[0] * x->dims[1], sp = prod(x->dims + 2, x->ndim - 2);
    PAR_FOR(nc * sp > 65536, c->nthreads, ,
        for (int64_t i = 0; i < nc; i++) {
            double acc = 0;
            for (int64_t k = 0; k < sp; k++) acc += pow(fabs(xd[i * sp + k]), p);
            y[i] = (float)pow(acc, 1.0 / p);
        });
    return 0;
}
static int gmp_run(struct op_call *c) { return global_pool_run(c, 1); }

/* ==== BatchNormalization (inference) ===================================== */

/* y = x * a[c] + b[c] with a = scale / sqrt(var + eps), b = B - mean * a. */
struct bn_state {
    float *ab; /* 2*C values when every parameter is constant, else NULL */
    int training;
    int nhwc;  /* X and Y channels-last (kiln_layout 3; inference only) */
    float eps, momentum;
};

/* training_mode=1 (opset 14+) normalizes with the batch's own statistics
 * and also returns the updated running mean and variance. */
static int bn_training(const struct op_call *c) { return node_attr_int(c->node, "training_mode", 0) != 0; }

static int bn_params_ok(struct op_call *c) {
    const struct tensor *x = c->in[0];
    if (c->nin < 5) return op_error(c, "needs 5 inputs (X, scale, B, mean, var), got %d", c->nin);
    if (!bn_training(c))
        for (int o = 1; o < c->nout; o++)
            if (c->out[o])
                return op_error(c, "outputs beyond Y (training statistics) need training_mode=1 (opset 14+)"),
                       STATUS_UNSUPPORTED;
    if (c->nout > 3 && bn_training(c)) return op_error(c, "at most 3 outputs in training mode");
    int rc = need_f32(c, x, "X");
    if (rc) return rc;
    if (x->ndim < 2) return op_error(c, "X must have rank >= 2 (got %d)", x->ndim);
    static const char *names[] = {"", "scale", "B", "input_mean", "input_var"};
    for (int i = 1; i < 5; i++) {
        const struct tensor *t = c->in[i];
        if (!t) return op_error(c, "input %s is missing", names[i]);
        if ((rc = need_f32(c, t, names[i]))) return rc;
        if (tensor_numel(t) != x->dims[1] && x->dims[1] >= 0)
            return op_error(c, "%s must hold %lld values (one per channel)", names[i], (long long)x->dims[1]);
    }
    return 0;
}

static int bn_infer(struct op_call *c) {
    int rc = bn_params_ok(c);
    if (rc) return rc;
    struct tensor *y = c->out[0];
    *y = *c->in[0];
    y->data = NULL;
    for (int o = 1; o < c->nout && o < 3; o++)
        if (c->out[o]) {
            c->out[o]->dtype = DT_FP32;
            c->out[o]->ndim = 1;
            c->out[o]->dims[0] = c->in[0]->dims[1];
        }
    return 0;
}

/* Batch statistics per channel; writes mean and variance (population) into
 * the running-statistics form the caller wants. */
static void bn_batch_stats(struct op_call *c, float *mean, float *var) {
    const struct tensor *x = c->in[0];
    int64_t n = x->dims[0], C = x->dims[1], sp = prod(x->dims + 2, x->ndim - 2);
    const float *xd = x->data;
    for (int64_t ch = 0; ch < C; ch++) {
        double s1 = 0, s2 = 0, cnt = (double)(n * sp);
        for (int64_t b = 0; b < n; b++)
            for (int64_t i = 0; i < sp; i++) s1 += xd[(b * C + ch) * sp + i];
        double mu = cnt > 0 ? s1 / cnt : 0;
        for (int64_t b = 0; b < n; b++)
            for (int64_t i = 0; i < sp; i++) {
                double dv = xd[(b * C + ch) * sp + i] - mu;
                s2 += dv * dv;
            }
        mean[ch] = (float)mu;
        var[ch] = (float)(cnt > 0 ? s2 / cnt : 0);
    }
}

static void bn_coeffs(struct op_call *c, float eps, float *ab, const float *mu, const float *var) {
    int64_t C = c->in[0]->dims[1];
    const float *sc = c->in[1]->data, *b = c->in[2]->data;
    for (int64_t i = 0; i < C; i++) {
        float a = sc[i] / sqrtf(var[i] + eps);
        ab[i] = a;
        ab[C + i] = b[i] - mu[i] * a;
    }
}

static void bn_release(void *st) {
    struct bn_state *s = st;
    if (!s) return;
    free(s->ab);
    free(s);
}

static int bn_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    int rc = bn_params_ok(c);
    if (rc) return rc;
    struct bn_state *s = calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory"), STATUS_NOMEM;
    int64_t C = c->in[0]->dims[1];
    s->training = bn_training(c);
    s->nhwc = !s->training && layout_of(c->node) == 3 && c->in[0]->ndim == 4;
    s->eps = node_attr_float(c->node, "epsilon", 1e-5f);
    s->momentum = node_attr_float(c->node, "momentum", 0.9f);
    int all_const = c->in[1]->data && c->in[2]->data && c->in[3]->data && c->in[4]->data && !s->training;
    if (all_const) {
        s->ab = malloc(sizeof(float) * 2 * (size_t)(C > 0 ? C : 1));
        if (!s->ab) {
            free(s);
            return op_error(c, "out of memory"), STATUS_NOMEM;
        }
        bn_coeffs(c, s->eps, s->ab, c->in[3]->data, c->in[4]->data);
        *scratch_size = 0;
    } else {
        *scratch_size = sizeof(float) * 4 * (size_t)C;
    }
    *state = s;
    return 0;
}

static int bn_run(struct op_call *c) {
    struct bn_state *s = c->state;
    if (tensor_numel(c->out[0]) == 0) return 0;
    const struct tensor *x = c->in[0];
    float *ab = s->ab;
    int64_t C = x->dims[1];
    if (!ab) {
        if (c->scratch_size < sizeof(float) * 4 * (size_t)C) return op_error(c, "internal: no scratch for the coefficients");
        ab = c->scratch;
        const float *mu = c->in[3]->data, *var = c->in[4]->data;
        if (s->training) {
            float *bm = ab + 2 * C, *bv = ab + 3 * C;
            bn_batch_stats(c, bm, bv);
            float mom = s->momentum;
            for (int64_t ch = 0; ch < C; ch++) {
                if (has_out(c, 1)) ((float *)c->out[1]->data)[ch] = mu[ch] * mom + bm[ch] * (1 - mom);
                if (has_out(c, 2)) ((float *)c->out[2]->data)[ch] = var[ch] * mom + bv[ch] * (1 - mom);
            }
            mu = bm;
            var = bv;
        }
        bn_coeffs(c, s->eps, ab, mu, var);
    }
    int64_t n = x->dims[0], sp = prod(x->dims + 2, x->ndim - 2);
    const float *xd = x->data;
    float *y = c->out[0]->data;
    if (s->nhwc) { /* pixels are rows of C values */
        PAR_FOR(n * C * sp > 65536, c->nthreads, ,
            for (int64_t p = 0; p < n * sp; p++) nn_affine_rows_f32(xd + p * C, y + p * C, C, ab, ab + C););
        return 0;
    }
    PAR_FOR(n * C * sp > 65536, c->nthreads, ,
        for (int64_t p = 0; p < n * C; p++) nn_affine_f32(xd + p * sp, y + p * sp, sp, ab[p % C], ab[C + p % C]););
    return 0;
}

/* ==== InstanceNormalization ============================================= */

static int inorm_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int rc;
    if (c->nin < 3 || !c->in[1] || !c->in[2]) return op_error(c, "needs inputs input, scale and B");
    if ((rc = need_f32(c, x, "input")) || (rc = need_f32(c, c->in[1], "scale")) || (rc = need_f32(c, c->in[2], "B")))
        return rc;
    if (x->ndim < 3) return op_error(c, "input must have rank >= 3 (got %d)", x->ndim);
    if (tensor_numel(c->in[1]) != x->dims[1] || tensor_numel(c->in[2]) != x->dims[1])
        return op_error(c, "scale and B must hold %lld values", (long long)x->dims[1]);
    *c->out[0] = *x;
    c->out[0]->data = NULL;
    return 0;
}

/* InstanceNormalization's and GroupNormalization's attributes. */
struct norm_params {
    float eps;
    int64_t groups; /* GroupNormalization's num_groups */
};

static int norm_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct norm_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    p->eps = node_attr_float(c->node, "epsilon", 1e-5f);
    p->groups = node_attr_int(c->node, "num_groups", 1);
    *state = p;
    return 0;
}

static int inorm_run(struct op_call *c) {
    const struct norm_params *p = c->state;
    const struct tensor *x = c->in[0];
    const float *sc = c->in[1]->data, *b = c->in[2]->data, *xd = x->data;
    float *y = c->out[0]->data;
    float eps = p->eps;
    int64_t C = x->dims[1], nc = x->dims[0] * C, sp = prod(x->dims + 2, x->ndim - 2);
    PAR_FOR(nc * sp > 65536, c->nthreads, ,
        for (int64_t p = 0; p < nc; p++) {
            const float *xp = xd + p * sp;
            float *yp = y + p * sp;
            double sum = 0, sq = 0;
            for (int64_t i = 0; i < sp; i++) sum += xp[i];
            double mean = sp ? sum / (double)sp : 0;
            for (int64_t i = 0; i < sp; i++) {
                double d = xp[i] - mean;
                sq += d * d;
            }
            double var = sp ? sq / (double)sp : 0;
            float a = (float)(sc[p % C] / sqrt(var + eps)), sh = b[p % C] - (float)mean * a;
            nn_affine_f32(xp, yp, sp, a, sh);
        });
    return 0;
}

/* ==== RoiAlign ========================================================== */

/* Average (or max) of bilinear samples on a grid inside each bin of each
 * region, following ONNX's reference (and onnxruntime): samples more than
 * one pixel outside the image count as zero, the others clamp to it. */
struct roialign_params {
    int is_max, half; /* mode "max"; coordinate_transformation_mode "half_pixel" */
    int64_t sr;       /* sampling_ratio (0: adaptive) */
    float scale;      /* spatial_scale */
    int64_t oh, ow;
};

static int roialign_decode(struct op_call *c, struct roialign_params *p) {
    const char *mode = node_attr_str(c->node, "mode", "avg");
    if (strcmp(mode, "avg") && strcmp(mode, "max")) return op_error(c, "unknown mode '%s'", mode);
    const char *ctm = node_attr_str(c->node, "coordinate_transformation_mode", c->node->opset >= 16 ? "half_pixel" : "output_half_pixel");
    if (strcmp(ctm, "half_pixel") && strcmp(ctm, "output_half_pixel"))
        return op_error(c, "unknown coordinate_transformation_mode '%s'", ctm);
    p->is_max = strcmp(mode, "max") == 0;
    p->half = strcmp(ctm, "half_pixel") == 0;
    p->sr = node_attr_int(c->node, "sampling_ratio", 0);
    p->scale = node_attr_float(c->node, "spatial_scale", 1.0f);
    p->oh = node_attr_int(c->node, "output_height", 1);
    p->ow = node_attr_int(c->node, "output_width", 1);
    if (p->oh < 1 || p->ow < 1 || p->oh > (1 << 16) || p->ow > (1 << 16))
        return op_error(c, "bad output size %lldx%lld", (long long)p->oh, (long long)p->ow);
    return 0;
}

static int roialign_infer(struct op_call *c) {
    const struct tensor *x = c->in[0], *rois = opt_in(c, 1), *bi = opt_in(c, 2);
    int rc = need_f32(c, x, "X");
    if (rc) return rc;
    if (x->ndim != 4) return op_error(c, "X must be 4-D (got rank %d)", x->ndim);
    if (!rois || (rc = need_f32(c, rois, "rois"))) return rc ? rc : op_error(c, "rois is required");
    if (rois->ndim != 2 || rois->dims[1] != 4) return op_error(c, "rois must be [num_rois, 4]");
    if (!bi || bi->ndim != 1 || bi->dims[0] != rois->dims[0] || (bi->dtype != DT_INT64 && bi->dtype != DT_INT32))
        return op_error(c, "batch_indices must be integers, one per roi");
    struct roialign_params p;
    if ((rc = roialign_decode(c, &p))) return rc;
    int64_t oh = p.oh, ow = p.ow;
    struct tensor *y = c->out[0];
    y->dtype = DT_FP32;
    y->ndim = 4;
    y->dims[0] = rois->dims[0];
    y->dims[1] = x->dims[1];
    y->dims[2] = oh;
    y->dims[3] = ow;
    return 0;
}

static int roialign_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct roialign_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    int rc = roialign_decode(c, p);
    if (rc) {
        op_params_free(p);
        return rc;
    }
    *state = p;
    return 0;
}

static int roialign_run(struct op_call *c) {
    const struct roialign_params *p = c->state;
    const struct tensor *x = c->in[0], *rois = c->in[1], *bi = c->in[2];
    struct tensor *y = c->out[0];
    const int is_max = p->is_max, half = p->half;
    const int64_t sr = p->sr;
    const float scale = p->scale;
    int64_t R = y->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3], oh = y->dims[2], ow = y->dims[3];
    const float *xd = x->data, *rd = rois->data;
    float *yd = y->data;
    for (int64_t r = 0; r < R; r++) {
        int64_t b = op_int_at(bi, r);
        if (b < 0 || b >= x->dims[0]) return op_error(c, "batch index %lld of roi %lld is out of range", (long long)b, (long long)r);
    }
    PAR_FOR(R * C * oh * ow > 4096, c->nthreads, collapse(2),
        for (int64_t r = 0; r < R; r++)
            for (int64_t ch = 0; ch < C; ch++) {
                float off = half ? 0.5f : 0.0f;
                float x0 = rd[r * 4] * scale - off, y0 = rd[r * 4 + 1] * scale - off;
                float rw = rd[r * 4 + 2] * scale - off - x0, rh = rd[r * 4 + 3] * scale - off - y0;
                if (!half) {
                    rw = rw > 1.0f ? rw : 1.0f;
                    rh = rh > 1.0f ? rh : 1.0f;
                }
                float bh = rh / (float)oh, bw = rw / (float)ow;
                int64_t gh = sr > 0 ? sr : (int64_t)ceilf(rh / (float)oh), gw = sr > 0 ? sr : (int64_t)ceilf(rw / (float)ow);
                int64_t count = gh * gw > 1 ? gh * gw : 1;
                const float *xp = xd + (op_int_at(bi, r) * C + ch) * H * W;
                for (int64_t ph = 0; ph < oh; ph++)
                    for (int64_t pw = 0; pw < ow; pw++) {
                        float acc = 0;
                        int first = 1;
                        for (int64_t iy = 0; iy < gh; iy++) {
                            float yy = y0 + (float)ph * bh + ((float)iy + 0.5f) * bh / (float)gh;
                            for (int64_t ix = 0; ix < gw; ix++) {
                                float xx = x0 + (float)pw * bw + ((float)ix + 0.5f) * bw / (float)gw;
                                float v1 = 0, v2 = 0, v3 = 0, v4 = 0;
                                if (!(yy < -1.0f || yy > (float)H || xx < -1.0f || xx > (float)W)) {
                                    float yv = yy > 0 ? yy : 0, xv = xx > 0 ? xx : 0;
                                    int64_t yl = (int64_t)yv, xl = (int64_t)xv, yh, xh;
                                    if (yl >= H - 1) { yh = yl = H - 1; yv = (float)yl; } else yh = yl + 1;
                                    if (xl >= W - 1) { xh = xl = W - 1; xv = (float)xl; } else xh = xl + 1;
                                    float ly = yv - (float)yl, lx = xv - (float)xl, hy = 1 - ly, hx = 1 - lx;
                                    v1 = hy * hx * xp[yl * W + xl];
                                    v2 = hy * lx * xp[yl * W + xh];
                                    v3 = ly * hx * xp[yh * W + xl];
                                    v4 = ly * lx * xp[yh * W + xh];
                                }
                                if (is_max) {
                                    float m = fmaxf(fmaxf(v1, v2), fmaxf(v3, v4));
                                    acc = first ? m : fmaxf(acc, m);
                                    first = 0;
                                } else {
                                    acc += v1 + v2 + v3 + v4;
                                }
                            }
                        }
                        yd[((r * C + ch) * oh + ph) * ow + pw] = is_max ? acc : acc / (float)count;
                    }
            });
    return 0;
}

/* ==== DeformConv ========================================================= */

/* 2-D convolution whose taps sample the input at learned offsets
 * (bilinear, zero outside the image), optionally weighted by a mask:
 * X [N,C,H,W], W [M,C/group,kh,kw], offset [N, offset_group*kh*kw*2, oh, ow],
 * B [M], mask [N, offset_group*kh*kw, oh, ow]. */
struct dconv_params {
    struct conv_geom g;
    int64_t og; /* offset_group */
};

static int dconv_geom(struct op_call *c, struct dconv_params *p) {
    const struct tensor *x = c->in[0], *w = opt_in(c, 1), *off = opt_in(c, 2), *b = opt_in(c, 3), *mask = opt_in(c, 4);
    int rc;
    if ((rc = need_f32(c, x, "X")) || !w || (rc = need_f32(c, w, "W")) || !off || (rc = need_f32(c, off, "offset")))
        return rc ? rc : op_error(c, "X, W and offset are required");
    if (x->ndim != 4 || w->ndim != 4 || off->ndim != 4) return op_error(c, "only 2-D DeformConv is supported (4-D X, W, offset)"), STATUS_UNSUPPORTED;
    if ((rc = conv_geom_read(c, x, w, &p->g))) return rc;
    const struct win *win = &p->g.win;
    const int64_t group = p->g.group, og = p->og = node_attr_int(c->node, "offset_group", 1);
    if (x->dims[1] != w->dims[1] * group || w->dims[0] % group)
        return op_error(c, "channels do not match: X has %lld, W expects %lld x group %lld", (long long)x->dims[1],
                        (long long)w->dims[1], (long long)group);
    if (og < 1 || x->dims[1] % og) return op_error(c, "offset_group %lld must divide the channels", (long long)og);
    int64_t kv = win->k[0] * win->k[1];
    if (off->dims[0] != x->dims[0] || off->dims[1] != og * kv * 2 || off->dims[2] != win->out[0] || off->dims[3] != win->out[1])
        return op_error(c, "offset must be [%lld, %lld, %lld, %lld]", (long long)x->dims[0], (long long)(og * kv * 2),
                        (long long)win->out[0], (long long)win->out[1]);
    if (b && (b->dtype != DT_FP32 || tensor_numel(b) != w->dims[0])) return op_error(c, "B must hold %lld floats", (long long)w->dims[0]);
    if (mask && (mask->dtype != DT_FP32 || mask->ndim != 4 || mask->dims[1] != og * kv || mask->dims[2] != win->out[0] ||
                 mask->dims[3] != win->out[1] || mask->dims[0] != x->dims[0]))
        return op_error(c, "mask must be [N, %lld, %lld, %lld]", (long long)(og * kv), (long long)win->out[0], (long long)win->out[1]);
    return 0;
}

static int dconv_infer(struct op_call *c) {
    struct dconv_params p;
    int rc = dconv_geom(c, &p);
    if (rc) return rc;
    struct tensor *y = c->out[0];
    y->dtype = DT_FP32;
    y->ndim = 4;
    y->dims[0] = c->in[0]->dims[0];
    y->dims[1] = c->in[1]->dims[0];
    y->dims[2] = p.g.win.out[0];
    y->dims[3] = p.g.win.out[1];
    return 0;
}

static int dconv_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct dconv_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    int rc = dconv_geom(c, p);
    if (rc) {
        op_params_free(p);
        return rc;
    }
    *state = p;
    return 0;
}

static int dconv_run(struct op_call *c) {
    const struct dconv_params *p = c->state;
    const struct win win = p->g.win;
    const int64_t g = p->g.group, og = p->og;
    const struct tensor *x = c->in[0], *w = c->in[1], *b = opt_in(c, 3), *mask = opt_in(c, 4);
    int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3], M = w->dims[0];
    int64_t kh = win.k[0], kw = win.k[1], oh = win.out[0], ow = win.out[1], cg = C / g, mg = M / g, cog = C / og;
    const float *xd = x->data, *wd = w->data, *od = c->in[2]->data, *md = mask ? mask->data : NULL, *bd = b ? b->data : NULL;
    float *yd = c->out[0]->data;
    PAR_FOR(N * M * oh * ow > 1024, c->nthreads, collapse(2),
        for (int64_t n = 0; n < N; n++)
            for (int64_t m = 0; m < M; m++) {
                int64_t gi = m / mg;
                for (int64_t i = 0; i < oh; i++)
                    for (int64_t j = 0; j < ow; j++) {
                        float acc = bd ? bd[m] : 0.0f;
                        for (int64_t ci = 0; ci < cg; ci++) {
                            int64_t cc = gi * cg + ci, o = cc / cog;
                            const float *xp = xd + (n * C + cc) * H * W;
                            for (int64_t a = 0; a < kh; a++)
                                for (int64_t t = 0; t < kw; t++) {
                                    int64_t tap = a * kw + t;
                                    float dy = od[((n * og + o) * kh * kw * 2 + tap * 2) * oh * ow + i * ow + j];
                                    float dx = od[((n * og + o) * kh * kw * 2 + tap * 2 + 1) * oh * ow + i * ow + j];
                                    float py = (float)(i * win.s[0] - win.pl[0] + a * win.d[0]) + dy;
                                    float px = (float)(j * win.s[1] - win.pl[1] + t * win.d[1]) + dx;
                                    float y0f = floorf(py), x0f = floorf(px), ly = py - y0f, lx = px - x0f;
                                    int64_t y0 = (int64_t)y0f, x0 = (int64_t)x0f;
                                    float v = 0;
                                    for (int q = 0; q < 4; q++) {
                                        int64_t yy = y0 + (q >> 1), xx = x0 + (q & 1);
                                        if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
                                        v += ((q >> 1) ? ly : 1 - ly) * ((q & 1) ? lx : 1 - lx) * xp[yy * W + xx];
                                    }
                                    if (md) v *= md[((n * og + o) * kh * kw + tap) * oh * ow + i * ow + j];
                                    acc += v * wd[((m * cg + ci) * kh + a) * kw + t];
                                }
                        }
                        yd[((n * M + m) * oh + i) * ow + j] = acc;
                    }
            });
    return 0;
}

/* ==== GroupNormalization ================================================ */

/* Mean and variance over each group of C/num_groups channels (and all
 * spatial positions), then per-channel scale and bias (opset 21; opset 18
 * gave them per group, which is told apart by their length). */
static int gnorm_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int rc;
    if (c->nin < 3 || !c->in[1] || !c->in[2]) return op_error(c, "needs inputs X, scale and bias");
    if ((rc = need_f32(c, x, "X")) || (rc = need_f32(c, c->in[1], "scale")) || (rc = need_f32(c, c->in[2], "bias")))
        return rc;
    if (x->ndim < 2) return op_error(c, "X must have rank >= 2 (got %d)", x->ndim);
    int64_t g = node_attr_int(c->node, "num_groups", 0), C = x->dims[1];
    if (g < 1 || (C >= 0 && C % g)) return op_error(c, "num_groups %lld must divide the %lld channels", (long long)g, (long long)C);
    int64_t ns = tensor_numel(c->in[1]), nb = tensor_numel(c->in[2]);
    if ((ns != C && ns != g) || nb != ns) return op_error(c, "scale and bias must hold %lld (or %lld) values", (long long)C, (long long)g);
    *c->out[0] = *x;
    c->out[0]->data = NULL;
    return 0;
}

static int gnorm_run(struct op_call *c) {
    const struct norm_params *p = c->state;
    const struct tensor *x = c->in[0];
    const float *xd = x->data, *sc = c->in[1]->data, *bi = c->in[2]->data;
    float *y = c->out[0]->data;
    float eps = p->eps;
    int64_t g = p->groups, n = x->dims[0], C = x->dims[1];
    int64_t sp = prod(x->dims + 2, x->ndim - 2), cg = C / g, len = cg * sp;
    int per_channel = tensor_numel(c->in[1]) == C;
    PAR_FOR(n * C * sp > 65536, c->nthreads, collapse(2),
        for (int64_t b = 0; b < n; b++)
            for (int64_t gi = 0; gi < g; gi++) {
                const float *xp = xd + (b * C + gi * cg) * sp;
                float *yp = y + (b * C + gi * cg) * sp;
                double s1 = 0, s2 = 0;
                for (int64_t i = 0; i < len; i++) s1 += xp[i];
                double mean = len ? s1 / (double)len : 0;
                for (int64_t i = 0; i < len; i++) s2 += (xp[i] - mean) * (xp[i] - mean);
                double inv = 1.0 / sqrt((len ? s2 / (double)len : 0) + eps);
                for (int64_t ch = 0; ch < cg; ch++) {
                    int64_t k = per_channel ? gi * cg + ch : gi;
                    float a = (float)(sc[k] * inv), sh = bi[k] - (float)mean * a;
                    for (int64_t i = 0; i < sp; i++) yp[ch * sp + i] = xp[ch * sp + i] * a + sh;
                }
            });
    return 0;
}

/* ==== Col2Im ============================================================ */

/* Folds columns of sliding blocks back into an image, summing overlaps:
 * input [N, C*prod(block), L] with L blocks on the grid the image, pads,
 * dilations and strides define. image_shape and block_shape are inputs
 * that must be known when the plan is built. */
struct col2im_geom {
    int nsp;
    int64_t img[WIN_MAX], blk[WIN_MAX], s[WIN_MAX], d[WIN_MAX], pl[WIN_MAX], grid[WIN_MAX];
    int64_t ch, kvol, nblocks;
};

static int col2im_setup(struct op_call *c, struct col2im_geom *g) {
    const struct tensor *x = c->in[0], *is = opt_in(c, 1), *bs = opt_in(c, 2);
    int rc = need_f32(c, x, "input");
    if (rc) return rc;
    if (!is || !bs || !is->data || !bs->data) return op_error(c, "image_shape and block_shape must be known when the plan is built");
    memset(g, 0, sizeof *g);
    g->nsp = (int)tensor_numel(is);
    if (g->nsp < 1 || g->nsp > WIN_MAX || tensor_numel(bs) != g->nsp)
        return op_error(c, "image_shape and block_shape must have the same length, 1 to 3");
    if (x->ndim != 3) return op_error(c, "input must be [N, C*prod(block_shape), L] (rank %d given)", x->ndim);
    const int64_t *st = NULL, *dl = NULL, *pd = NULL;
    int ns = node_attr_ints(c->node, "strides", &st), nd = node_attr_ints(c->node, "dilations", &dl);
    int np = node_attr_ints(c->node, "pads", &pd);
    if ((ns >= 0 && ns != g->nsp) || (nd >= 0 && nd != g->nsp) || (np >= 0 && np != 2 * g->nsp))
        return op_error(c, "strides/dilations/pads do not match %d spatial dims", g->nsp);
    g->kvol = 1;
    g->nblocks = 1;
    for (int i = 0; i < g->nsp; i++) {
        g->img[i] = op_int_at(is, i);
        g->blk[i] = op_int_at(bs, i);
        g->s[i] = ns >= 0 ? st[i] : 1;
        g->d[i] = nd >= 0 ? dl[i] : 1;
        g->pl[i] = np >= 0 ? pd[i] : 0;
        int64_t pr = np >= 0 ? pd[g->nsp + i] : 0;
        if (g->img[i] < 1 || g->blk[i] < 1 || g->s[i] < 1 || g->d[i] < 1 || g->pl[i] < 0 || pr < 0 ||
            g->img[i] > (1 << 24) || g->blk[i] > (1 << 20) || g->s[i] > (1 << 20) || g->d[i] > (1 << 20))
            return op_error(c, "bad image/block geometry along dim %d", i);
        int64_t span = g->img[i] + g->pl[i] + pr - (g->blk[i] - 1) * g->d[i] - 1;
        if (span < 0) return op_error(c, "block larger than the padded image along dim %d", i);
        g->grid[i] = span / g->s[i] + 1;
        g->kvol *= g->blk[i];
        g->nblocks *= g->grid[i];
    }
    if (x->dims[1] % g->kvol) return op_error(c, "input dim 1 (%lld) is not a multiple of prod(block_shape) %lld",
                                              (long long)x->dims[1], (long long)g->kvol);
    if (x->dims[2] != g->nblocks)
        return op_error(c, "input has %lld blocks, the geometry gives %lld", (long long)x->dims[2], (long long)g->nblocks);
    g->ch = x->dims[1] / g->kvol;
    return 0;
}

static int col2im_infer(struct op_call *c) {
    struct col2im_geom g;
    int rc = col2im_setup(c, &g);
    if (rc) return rc;
    struct tensor *y = c->out[0];
    y->dtype = DT_FP32;
    y->ndim = 2 + g.nsp;
    y->dims[0] = c->in[0]->dims[0];
    y->dims[1] = g.ch;
    for (int i = 0; i < g.nsp; i++) y->dims[2 + i] = g.img[i];
    return 0;
}

static int col2im_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct col2im_geom *g = op_params_alloc(c, sizeof *g);
    if (!g) return STATUS_NOMEM;
    int rc = col2im_setup(c, g);
    if (rc) {
        op_params_free(g);
        return rc;
    }
    *state = g;
    return 0;
}

static int col2im_run(struct op_call *c) {
    const struct col2im_geom g = *(const struct col2im_geom *)c->state;
    const float *xd = c->in[0]->data;
    float *y = c->out[0]->data;
    int64_t n = c->in[0]->dims[0], isz = prod(g.img, g.nsp);
    memset(y, 0, sizeof(float) * (size_t)(n * g.ch * isz));
    PAR_FOR(n * g.ch * isz > 65536, c->nthreads, collapse(2),
        for (int64_t b = 0; b < n; b++)
            for (int64_t ch = 0; ch < g.ch; ch++) {
                float *yp = y + (b * g.ch + ch) * isz;
                for (int64_t k = 0; k < g.kvol; k++) {
                    int64_t kk[WIN_MAX], rem = k;
                    for (int i = g.nsp - 1; i >= 0; i--) {
                        kk[i] = rem % g.blk[i];
                        rem /= g.blk[i];
                    }
                    const float *xp = xd + ((b * g.ch + ch) * g.kvol + k) * g.nblocks;
                    for (int64_t l = 0; l < g.nblocks; l++) {
                        int64_t rl = l, off = 0, stride = 1, inside = 1;
                        for (int i = g.nsp - 1; i >= 0; i--) {
                            int64_t pos = (rl % g.grid[i]) * g.s[i] - g.pl[i] + kk[i] * g.d[i];
                            rl /= g.grid[i];
                            if (pos < 0 || pos >= g.img[i]) inside = 0;
                            off += pos * stride;
                            stride *= g.img[i];
                        }
                        if (inside) yp[off] += xp[l];
                    }
                }
            });
    return 0;
}

/* ==== LRN ================================================================ */

/* y = x / (bias + alpha / size * sum of x^2 over the channel window)^beta,
 * the window being [c - floor((size-1)/2), c + ceil((size-1)/2)]. */
static int lrn_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int rc = need_f32(c, x, "X");
    if (rc) return rc;
    if (x->ndim < 2) return op_error(c, "X must have rank >= 2 (got %d)", x->ndim);
    int64_t size = node_attr_int(c->node, "size", 0);
    if (size < 1) return op_error(c, "attribute size must be >= 1 (got %lld)", (long long)size);
    *c->out[0] = *x;
    c->out[0]->data = NULL;
    return 0;
}

struct lrn_params {
    int64_t size;
    float alpha, beta, bias;
};

static int lrn_prepare(struct op_call *c, void **state, size_t *scratch_size) {
    struct lrn_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    p->size = node_attr_int(c->node, "size", 1);
    p->alpha = node_attr_float(c->node, "alpha", 1e-4f);
    p->beta = node_attr_float(c->node, "beta", 0.75f);
    p->bias = node_attr_float(c->node, "bias", 1.0f);
    *state = p;
    return 0;
}

static int lrn_run(struct op_call *c) {
    const struct lrn_params *p = c->state;
    const struct tensor *x = c->in[0];
    int64_t size = p->size;
    float alpha = p->alpha, beta = p->beta, bias = p->bias;
    int64_t n = x->dims[0], C = x->dims[1], sp = prod(x->dims + 2, x->ndim - 2);
    int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
    const float *xd = x->data;
    float *y = c->out[0]->data;
    float an = alpha / (float)size;
    int b75 = beta == 0.75f;
    /* Blocks of pixels keep the window sum in a small stack buffer. */
    enum { BLK = 256 };
    int64_t nblk = (sp + BLK - 1) / BLK;
    PAR_FOR(n * C * sp > 32768, c->nthreads, collapse(2),
        for (int64_t b = 0; b < n; b++)
            for (int64_t blk = 0; blk < nblk; blk++) {
                int64_t p0 = blk * BLK, len = sp - p0 < BLK ? sp - p0 : BLK;
                const float *xb = xd + b * C * sp + p0;
                float *yb = y + b * C * sp + p0;
                for (int64_t ch = 0; ch < C; ch++) {
                    float acc[BLK];
                    for (int64_t i = 0; i < len; i++) acc[i] = 0;
                    int64_t c0 = ch - lo < 0 ? 0 : ch - lo, c1 = ch + hi >= C ? C - 1 : ch + hi;
                    for (int64_t cc = c0; cc <= c1; cc++) nn_add_squares_f32(acc, xb + cc * sp, len);
                    const float *xc = xb + ch * sp;
                    float *yc = yb + ch * sp;
                    if (b75) {
                        for (int64_t i = 0; i < len; i++) {
                            float t = bias + an * acc[i], r = sqrtf(t);
                            yc[i] = xc[i] / (r * sqrtf(r));
                        }
                    } else {
                        for (int64_t i = 0; i < len; i++) yc[i] = xc[i] * powf(bias + an * acc[i], -beta);
                    }
                }
            });
    return 0;
}

/* ==== op table ========================================================== */

const struct op_def op_defs_nn[] = {
    {"Conv", "", conv_infer, conv_prepare, conv_run, conv_release, OP_FUSE_ACT},
    {"ConvInteger", "", convi_infer, convi_prepare, convi_run, convi_release, 0},
    {"ConvIntegerToFloat", "kiln", convi_infer, convi_prepare, convi_run, convi_release, OP_FUSE_ACT},
    {"QLinearConv", "", qconv_infer, qconv_prepare, qconv_run, conv_release, 0},
    {"MatMulInteger", "", mmi_infer, mmi_prepare, mmi_run, mmi_release, 0},
    {"QLinearMatMul", "", qmm_infer, qmm_prepare, qmm_run, NULL, 0},
    {"ConvTranspose", "", ctr_infer, ctr_prepare, ctr_run, conv_release, OP_FUSE_ACT},
    {"MatMul", "", matmul_infer, matmul_prepare, matmul_run, cpu_mm_release, OP_FUSE_ACT | OP_BIAS_INPUT},
    {"Gemm", "", gemm_infer, gemm_prepare, gemm_run, cpu_mm_release, OP_FUSE_ACT},
    {"MaxPool", "", maxpool_infer, maxpool_prepare, pool_run, pool_release, 0},
    {"AveragePool", "", avgpool_infer, avgpool_prepare, pool_run, pool_release, 0},
    {"LpPool", "", lppool_infer, lppool_prepare, pool_run, pool_release, 0},
    {"MaxUnpool", "", unpool_infer, unpool_prepare, unpool_run, op_params_free, 0},
    {"GlobalAveragePool", "", global_pool_infer, NULL, gap_run, NULL, 0},
    {"GlobalLpPool", "", global_pool_infer, glp_prepare, glp_run, op_params_free, 0},
    {"GlobalMaxPool", "", global_pool_infer, NULL, gmp_run, NULL, 0},
    {"BatchNormalization", "", bn_infer, bn_prepare, bn_run, bn_release, 0},
    {"InstanceNormalization", "", inorm_infer, norm_prepare, inorm_run, op_params_free, 0},
    {"LRN", "", lrn_infer, lrn_prepare, lrn_run, op_params_free, 0},
    {"RoiAlign", "", roialign_infer, roialign_prepare, roialign_run, op_params_free, 0},
    {"DeformConv", "", dconv_infer, dconv_prepare, dconv_run, op_params_free, 0},
    {"GroupNormalization", "", gnorm_infer, norm_prepare, gnorm_run, op_params_free, 0},
    {"Col2Im", "", col2im_infer, col2im_prepare, col2im_run, op_params_free, 0},
    {0},
};
