/* blas.cpp - the library-backed ops of the CUDA backend: MatMul and Gemm
 * through cuBLASLt (bias and ReLU epilogues fused), Conv through cuDNN (bias +
 * ReLU fused where cuDNN allows it), MaxPool/AveragePool through cuDNN.
 *
 * Row-major trick: kiln's tensors are row-major, cuBLASLt is column-major.
 * A row-major [M,K] matrix is a column-major [K,M] one, so C = A.B is
 * computed as C^T = B^T.A^T: cuBLASLt's "A" is kiln's B and vice versa, and
 * the epilogue's bias (one per row of column-major D) is one per column of C.
 *
 * cuDNN's legacy (v7-style) API is used: it is still shipped by cuDNN 9, is
 * what its pooling and convolution heuristics are exposed through, and it is
 * deprecated there, hence -Wno-deprecated-declarations for this file. */
#include <float.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/kernels.h"

enum lib_kind { LIB_GEMM = 1, LIB_CONV, LIB_POOL };

static const char *const g_lib_ops[] = {"MatMul", "Gemm", "Conv", "MaxPool", "AveragePool", NULL};

int kc_lib_handles(const char *op_type) {
    for (int i = 0; g_lib_ops[i]; i++)
        if (strcmp(g_lib_ops[i], op_type) == 0) return 1;
    return 0;
}

/* snprintf into why unless it is NULL. */
static void kc_why(char *why, size_t why_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void kc_why(char *why, size_t why_len, const char *fmt, ...) {
    if (!why || !why_len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
}

static int is_float(enum dtype dt) { return dt == DT_FP32 || dt == DT_FP16; }

/* Alignment promised to cuBLASLt for A, B, C, D (bytes), and the alignment
 * of the workspace pointers handed to the libraries (scratch is asked for
 * with this much slack and aligned up at run time). */
#define KC_GEMM_ALIGN 16u
#define KC_WS_ALIGN 256u

static void *ws_align(void *p) { return (void *)(((uintptr_t)p + KC_WS_ALIGN - 1) & ~(uintptr_t)(KC_WS_ALIGN - 1)); }
static int aligned(const void *p) { return ((uintptr_t)p % KC_GEMM_ALIGN) == 0; }

/* ---- MatMul / Gemm --------------------------------------------------------- */

struct gemm_state {
    int kind;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    size_t workspace;
    float alpha, beta;
    int bias_input;      /* index of the bias input fused by the epilogue, -1 */
    int c_input;         /* Gemm's C used as a full matrix (beta), -1 */
    struct kc_act post;  /* activation applied after the matmul (kernel), kind 0 = none */
    int64_t m, n;
    enum dtype dt;
};

/* The GEMM a node describes, in row-major terms. */
struct gemm_shape {
    int64_t m, n, k, batch;
    int64_t stride_a, stride_b, stride_c; /* elements between batches (0 = broadcast) */
    int trans_a, trans_b;
    int bias_input, c_input;
    float alpha, beta;
};

static int gemm_shape_of(const struct op_call *c, struct gemm_shape *g, char *why, size_t why_len) {
#define GNO(...) do { if (why && why_len) kc_why(why, why_len, __VA_ARGS__); return -1; } while (0)
    const struct graph_node *n = c->node;
    const struct tensor *a = c->in[0], *b = c->nin > 1 ? c->in[1] : NULL;
    const struct tensor *y = c->out[0];
    memset(g, 0, sizeof *g);
    g->bias_input = g->c_input = -1;
    g->alpha = 1;
    g->beta = 0;
    if (!a || !b || !is_float(a->dtype) || b->dtype != a->dtype || y->dtype != a->dtype) GNO("dtypes");
    if (!strcmp(n->op_type, "Gemm")) {
        if (a->ndim != 2 || b->ndim != 2) GNO("Gemm operands not 2-D");
        g->trans_a = (int)node_attr_int(n, "transA", 0);
        g->trans_b = (int)node_attr_int(n, "transB", 0);
        g->alpha = node_attr_float(n, "alpha", 1.0f);
        g->beta = node_attr_float(n, "beta", 1.0f);
        g->m = g->trans_a ? a->dims[1] : a->dims[0];
        g->k = g->trans_a ? a->dims[0] : a->dims[1];
        g->n = g->trans_b ? b->dims[0] : b->dims[1];
        if ((g->trans_b ? b->dims[1] : b->dims[0]) != g->k) GNO("Gemm inner dims");
        g->batch = 1;
        const struct tensor *cc = c->nin > 2 ? c->in[2] : NULL;
        if (cc && g->beta != 0.0f) {
            if (cc->dtype != a->dtype) GNO("Gemm C dtype");
            int64_t cn = tensor_numel(cc);
            int last = cc->ndim ? (int)cc->dims[cc->ndim - 1] : 1;
            if (cn == g->n && last == g->n && g->beta == 1.0f && (cc->ndim == 1 || cc->dims[0] == 1)) g->bias_input = 2;
            else if (cc->ndim == 2 && cc->dims[0] == g->m && cc->dims[1] == g->n) g->c_input = 2;
            else GNO("Gemm C of this shape");
        }
    } else { /* MatMul, with the engine's optional fused bias in[2] */
        if (a->ndim < 1 || b->ndim < 1) GNO("scalar MatMul");
        int64_t am = a->ndim == 1 ? 1 : a->dims[a->ndim - 2], ak = a->dims[a->ndim - 1];
        int64_t bk = b->ndim == 1 ? b->dims[0] : b->dims[b->ndim - 2], bn = b->ndim == 1 ? 1 : b->dims[b->ndim - 1];
        if (ak != bk) GNO("MatMul inner dims");
        g->k = ak;
        g->n = bn;
        int64_t abatch = 1, bbatch = 1;
        for (int d = 0; d < a->ndim - 2; d++) abatch *= a->dims[d];
        for (int d = 0; d < b->ndim - 2; d++) bbatch *= b->dims[d];
        if (bbatch == 1) { /* B shared: fold A's batch into M */
            g->m = am * abatch;
            g->batch = 1;
        } else {
            /* Equal batch dims (after dropping leading ones), or A 2-D. */
            if (abatch != 1 && abatch != bbatch) GNO("MatMul batch broadcasting");
            if (abatch != 1) {
                int da = a->ndim - 2, db = b->ndim - 2, i = da - 1, j = db - 1;
                for (; i >= 0 && j >= 0; i--, j--)
                    if (a->dims[i] != b->dims[j]) GNO("MatMul batch broadcasting");
            }
            g->m = am;
            g->batch = bbatch;
            g->stride_a = abatch == 1 ? 0 : am * ak;
            g->stride_b = bk * bn;
            g->stride_c = am * bn;
        }
        if (c->nin > 2 && c->in[2]) {
            const struct tensor *bias = c->in[2];
            if (bias->dtype != a->dtype || tensor_numel(bias) != g->n) GNO("MatMul bias");
            g->bias_input = 2;
        }
    }
    if (tensor_numel(y) != g->m * g->n * g->batch) GNO("output size");
    if (g->m <= 0 || g->n <= 0 || g->k <= 0) GNO("empty GEMM");
    if (g->m > INT32_MAX || g->n > INT32_MAX || g->k > INT32_MAX || g->batch > INT32_MAX) GNO("GEMM too large");
    return 0;
#undef GNO
}

static void gemm_free(struct gemm_state *s) {
    if (!s) return;
    if (s->la) cublasLtMatrixLayoutDestroy(s->la);
    if (s->lb) cublasLtMatrixLayoutDestroy(s->lb);
    if (s->lc) cublasLtMatrixLayoutDestroy(s->lc);
    if (s->desc) cublasLtMatmulDescDestroy(s->desc);
    free(s);
}

static int gemm_prepare(struct kc_instance *in, struct op_call *c, void **state, size_t *workspace) {
    char why[200];
    struct gemm_shape g;
    if (gemm_shape_of(c, &g, why, sizeof why)) return op_error(c, "cuBLASLt cannot run this node: %s", why);
    struct gemm_state *s = (struct gemm_state *)calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory");
    s->kind = LIB_GEMM;
    s->alpha = g.alpha;
    s->beta = g.c_input >= 0 ? g.beta : 0.0f;
    s->bias_input = g.bias_input;
    s->c_input = g.c_input;
    s->m = g.m;
    s->n = g.n;
    s->dt = c->in[0]->dtype;
    cudaDataType_t dt = s->dt == DT_FP16 ? CUDA_R_16F : CUDA_R_32F;
    cublasComputeType_t ct = CUBLAS_COMPUTE_32F; /* FP32 accumulation in both modes */
    const struct graph_node *n = c->node;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    int act = n->act;
    if (act == ACT_RELU) epi = s->bias_input >= 0 ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    else if (act == ACT_GELU && s->dt == DT_FP16)
        /* cuBLASLt's GELU is the tanh form: within FP16's precision of the
         * exact one, not within FP32's, so FP32 applies it in a kernel. */
        epi = s->bias_input >= 0 ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    else {
        if (s->bias_input >= 0) epi = CUBLASLT_EPILOGUE_BIAS;
        if (act != ACT_NONE) {
            s->post.kind = act;
            s->post.a = n->act_alpha;
            s->post.b = n->act_beta;
        }
    }
    cublasOperation_t opa = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* Lt's A is kiln's B */
    cublasOperation_t opb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    /* Column-major views: kiln B as (n x k) or, transposed, stored (k x n). */
    uint64_t a_rows = g.trans_b ? (uint64_t)g.k : (uint64_t)g.n, a_cols = g.trans_b ? (uint64_t)g.n : (uint64_t)g.k;
    uint64_t b_rows = g.trans_a ? (uint64_t)g.m : (uint64_t)g.k, b_cols = g.trans_a ? (uint64_t)g.k : (uint64_t)g.m;
    int rc = 0;
    if (!KC_CUBLAS_OK(cublasLtMatmulDescCreate(&s->desc, ct, CUDA_R_32F)) ||
        !KC_CUBLAS_OK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa)) ||
        !KC_CUBLAS_OK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb)) ||
        !KC_CUBLAS_OK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)) ||
        !KC_CUBLAS_OK(cublasLtMatrixLayoutCreate(&s->la, dt, a_rows, a_cols, (int64_t)a_rows)) ||
        !KC_CUBLAS_OK(cublasLtMatrixLayoutCreate(&s->lb, dt, b_rows, b_cols, (int64_t)b_rows)) ||
        !KC_CUBLAS_OK(cublasLtMatrixLayoutCreate(&s->lc, dt, (uint64_t)g.n, (uint64_t)g.m, g.n)))
        rc = -1;
    if (!rc && g.batch > 1) {
        int32_t bc = (int32_t)g.batch;
        if (!KC_CUBLAS_OK(cublasLtMatrixLayoutSetAttribute(s->la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc)) ||
            !KC_CUBLAS_OK(cublasLtMatrixLayoutSetAttribute(s->la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &g.stride_b, sizeof g.stride_b)) ||
            !KC_CUBLAS_OK(cublasLtMatrixLayoutSetAttribute(s->lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc)) ||
            !KC_CUBLAS_OK(cublasLtMatrixLayoutSetAttribute(s->lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &g.stride_a, sizeof g.stride_a)) ||
            !KC_CUBLAS_OK(cublasLtMatrixLayoutSetAttribute(s->lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc)) ||
            !KC_CUBLAS_OK(cublasLtMatrixLayoutSetAttribute(s->lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &g.stride_c, sizeof g.stride_c)))
            rc = -1;
    }
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[8];
    int nres = 0;
    if (!rc) {
        size_t limit = in->workspace_limit;
        /* cuBLASLt assumes 256-byte aligned matrices unless told otherwise;
         * kiln's arena aligns to 64, and gemm_run checks the 16 promised here. */
        uint32_t align = KC_GEMM_ALIGN;
        if (!KC_CUBLAS_OK(cublasLtMatmulPreferenceCreate(&pref)) ||
            !KC_CUBLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &limit, sizeof limit)) ||
            !KC_CUBLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, sizeof align)) ||
            !KC_CUBLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, sizeof align)) ||
            !KC_CUBLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align, sizeof align)) ||
            !KC_CUBLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align, sizeof align)) ||
            !KC_CUBLAS_OK(cublasLtMatmulAlgoGetHeuristic(in->lt, s->desc, s->la, s->lb, s->lc, s->lc, pref, 8, res, &nres)))
            rc = -1;
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
    }
    if (rc) {
        gemm_free(s);
        return op_error(c, "cuBLASLt: %s", kc_last_error());
    }
    int pick = -1;
    for (int i = 0; i < nres; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS) { pick = i; break; }
    if (pick < 0) {
        gemm_free(s);
        return op_error(c, "cuBLASLt has no algorithm for this GEMM (m=%lld n=%lld k=%lld batch=%lld)", (long long)g.m,
                        (long long)g.n, (long long)g.k, (long long)g.batch);
    }
    s->algo = res[pick].algo;
    s->workspace = res[pick].workspaceSize;
    *workspace = s->workspace ? s->workspace + KC_WS_ALIGN : 0;
    *state = s;
    return 0;
}

static int gemm_run(struct kc_instance *in, struct op_call *c, struct gemm_state *s) {
    const struct tensor *a = c->in[0], *b = c->in[1];
    struct tensor *y = c->out[0];
    if (s->bias_input >= 0) {
        const void *bias = c->in[s->bias_input]->data;
        if (!KC_CUBLAS_OK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)))
            return op_error(c, "cuBLASLt: %s", kc_last_error());
    }
    const void *cmat = s->c_input >= 0 ? c->in[s->c_input]->data : y->data;
    if (s->workspace && c->scratch_size < s->workspace + KC_WS_ALIGN)
        return op_error(c, "cuBLASLt workspace missing (%zu < %zu bytes)", c->scratch_size, s->workspace + KC_WS_ALIGN);
    if (!aligned(a->data) || !aligned(b->data) || !aligned(cmat) || !aligned(y->data))
        return op_error(c, "cuBLASLt operands must be %u-byte aligned", KC_GEMM_ALIGN);
    void *ws = s->workspace ? ws_align(c->scratch) : NULL;
    if (!KC_CUBLAS_OK(cublasLtMatmul(in->lt, s->desc, &s->alpha, b->data, s->la, a->data, s->lb, &s->beta, cmat, s->lc,
                                     y->data, s->lc, &s->algo, ws, s->workspace, in->stream)))
        return op_error(c, "cuBLASLt: %s", kc_last_error());
    if (s->post.kind) {
        cudaError_t e = kc_bias_act(s->dt, y->data, NULL, tensor_numel(y), 1, 1, s->post, in->stream);
        if (e != cudaSuccess) return op_error(c, "activation kernel: %s", cudaGetErrorString(e));
    }
    return 0;
}

/* ---- Conv and pooling (cuDNN) ------------------------------------------------ */

struct conv_state {
    int kind;
    cudnnTensorDescriptor_t xd, yd, bd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnActivationDescriptor_t ad;
    cudnnConvolutionFwdAlgo_t algo;
    size_t workspace;
    int fused;           /* cudnnConvolutionBiasActivationForward with ReLU */
    int has_bias;
    struct kc_act post;  /* bias and/or activation applied by a kernel after */
    int64_t channels, inner;
    enum dtype dt;
    /* pooling */
    cudnnPoolingDescriptor_t pd;
};

/* Spatial geometry shared by Conv and the pools: rank-2 only (1-D maps to
 * H = 1). Pads must be symmetric (cuDNN's legacy API). */
struct geom {
    int nsp;
    int k[2], s[2], d[2], pad[2];
};

static int geom_of(const struct op_call *c, const struct tensor *x, const struct tensor *y, const int64_t *kshape,
                   struct geom *g, char *why, size_t why_len) {
#define GNO(...) do { if (why && why_len) kc_why(why, why_len, __VA_ARGS__); return -1; } while (0)
    const struct graph_node *n = c->node;
    int nsp = x->ndim - 2;
    if (nsp < 1 || nsp > 2 || y->ndim != x->ndim) GNO("%d-D spatial dims", nsp);
    g->nsp = nsp;
    const int64_t *st = NULL, *dl = NULL, *pads = NULL;
    int nst = node_attr_ints(n, "strides", &st), ndl = node_attr_ints(n, "dilations", &dl);
    int np = node_attr_ints(n, "pads", &pads);
    const char *auto_pad = node_attr_str(n, "auto_pad", "NOTSET");
    for (int i = 0; i < 2; i++) {
        g->k[i] = 1;
        g->s[i] = 1;
        g->d[i] = 1;
        g->pad[i] = 0;
    }
    for (int i = 0; i < nsp; i++) {
        int j = i + 2 - nsp; /* 1-D fills the W slot */
        g->k[j] = (int)kshape[i];
        g->s[j] = nst == nsp ? (int)st[i] : 1;
        g->d[j] = ndl == nsp ? (int)dl[i] : 1;
        int64_t in = x->dims[2 + i], out = y->dims[2 + i], begin = 0, end = 0;
        if (!strcmp(auto_pad, "SAME_UPPER") || !strcmp(auto_pad, "SAME_LOWER")) {
            int64_t total = (out - 1) * g->s[j] + (g->k[j] - 1) * g->d[j] + 1 - in;
            if (total < 0) total = 0;
            begin = !strcmp(auto_pad, "SAME_UPPER") ? total / 2 : total - total / 2;
            end = total - begin;
        } else if (!strcmp(auto_pad, "NOTSET")) {
            if (np == 2 * nsp) {
                begin = pads[i];
                end = pads[i + nsp];
            } else if (np >= 0) GNO("pads");
        } else if (strcmp(auto_pad, "VALID")) GNO("auto_pad %s", auto_pad);
        if (begin != end) GNO("asymmetric padding");
        /* The output must be what cuDNN's floor rule gives (ceil_mode etc.). */
        int64_t expect = (in + 2 * begin - ((int64_t)(g->k[j] - 1) * g->d[j] + 1)) / g->s[j] + 1;
        if (expect != out) GNO("output size %lld differs from cuDNN's %lld (ceil_mode?)", (long long)out, (long long)expect);
        g->pad[j] = (int)begin;
    }
    return 0;
#undef GNO
}

static int set4d(cudnnTensorDescriptor_t d, cudnnDataType_t dt, const struct tensor *t) {
    int h = t->ndim == 4 ? (int)t->dims[2] : 1, w = (int)t->dims[t->ndim - 1];
    return KC_CUDNN_OK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, dt, (int)t->dims[0], (int)t->dims[1], h, w));
}

static void conv_free(struct conv_state *s) {
    if (!s) return;
    if (s->xd) cudnnDestroyTensorDescriptor(s->xd);
    if (s->yd) cudnnDestroyTensorDescriptor(s->yd);
    if (s->bd) cudnnDestroyTensorDescriptor(s->bd);
    if (s->wd) cudnnDestroyFilterDescriptor(s->wd);
    if (s->cd) cudnnDestroyConvolutionDescriptor(s->cd);
    if (s->ad) cudnnDestroyActivationDescriptor(s->ad);
    if (s->pd) cudnnDestroyPoolingDescriptor(s->pd);
    free(s);
}

static int conv_check(const struct op_call *c, struct geom *g, char *why, size_t why_len) {
    const struct tensor *x = c->in[0], *w = c->nin > 1 ? c->in[1] : NULL, *y = c->out[0];
    if (!w || !is_float(x->dtype) || w->dtype != x->dtype || y->dtype != x->dtype) {
        kc_why(why, why_len, "dtypes");
        return -1;
    }
    if (w->ndim != x->ndim) {
        kc_why(why, why_len, "weight rank");
        return -1;
    }
    for (int d = 0; d < x->ndim; d++)
        if (x->dims[d] > INT32_MAX || y->dims[d] > INT32_MAX || w->dims[d] > INT32_MAX) {
            kc_why(why, why_len, "dims beyond int32");
            return -1;
        }
    int64_t group = node_attr_int(c->node, "group", 1);
    if (group < 1 || x->dims[1] != w->dims[1] * group || w->dims[0] % group) {
        kc_why(why, why_len, "group/channels");
        return -1;
    }
    if (c->nin > 2 && c->in[2] && (c->in[2]->dtype != x->dtype || tensor_numel(c->in[2]) != w->dims[0])) {
        kc_why(why, why_len, "bias");
        return -1;
    }
    return geom_of(c, x, y, w->dims + 2, g, why, why_len);
}

static int conv_prepare(struct kc_instance *in, struct op_call *c, void **state, size_t *workspace) {
    char why[200] = "";
    struct geom g;
    if (conv_check(c, &g, why, sizeof why)) return op_error(c, "cuDNN cannot run this Conv: %s", why);
    const struct tensor *x = c->in[0], *w = c->in[1], *y = c->out[0];
    struct conv_state *s = (struct conv_state *)calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory");
    s->kind = LIB_CONV;
    s->dt = x->dtype;
    s->has_bias = c->nin > 2 && c->in[2] != NULL;
    s->channels = y->dims[1];
    s->inner = 1;
    for (int d = 2; d < y->ndim; d++) s->inner *= y->dims[d];
    cudnnDataType_t dt = s->dt == DT_FP16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
    int kh = w->ndim == 4 ? (int)w->dims[2] : 1, kw = (int)w->dims[w->ndim - 1];
    int ok = KC_CUDNN_OK(cudnnCreateTensorDescriptor(&s->xd)) && KC_CUDNN_OK(cudnnCreateTensorDescriptor(&s->yd)) &&
             KC_CUDNN_OK(cudnnCreateTensorDescriptor(&s->bd)) && KC_CUDNN_OK(cudnnCreateFilterDescriptor(&s->wd)) &&
             KC_CUDNN_OK(cudnnCreateConvolutionDescriptor(&s->cd)) && KC_CUDNN_OK(cudnnCreateActivationDescriptor(&s->ad)) &&
             set4d(s->xd, dt, x) && set4d(s->yd, dt, y) &&
             KC_CUDNN_OK(cudnnSetTensor4dDescriptor(s->bd, CUDNN_TENSOR_NCHW, dt, 1, (int)s->channels, 1, 1)) &&
             KC_CUDNN_OK(cudnnSetFilter4dDescriptor(s->wd, dt, CUDNN_TENSOR_NCHW, (int)w->dims[0], (int)w->dims[1], kh, kw)) &&
             KC_CUDNN_OK(cudnnSetConvolution2dDescriptor(s->cd, g.pad[0], g.pad[1], g.s[0], g.s[1], g.d[0], g.d[1],
                                                         CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)) &&
             KC_CUDNN_OK(cudnnSetConvolutionGroupCount(s->cd, (int)node_attr_int(c->node, "group", 1))) &&
             /* FP32 stays FP32 (no TF32); FP16 uses tensor cores. */
             KC_CUDNN_OK(cudnnSetConvolutionMathType(s->cd, s->dt == DT_FP16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH)) &&
             KC_CUDNN_OK(cudnnSetActivationDescriptor(s->ad, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    if (!ok) {
        conv_free(s);
        return op_error(c, "cuDNN: %s", kc_last_error());
    }
    /* cuDNN ranks the algorithms; take the best that fits the workspace limit. */
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int nperf = 0;
    if (!KC_CUDNN_OK(cudnnGetConvolutionForwardAlgorithm_v7(in->dnn, s->xd, s->wd, s->cd, s->yd,
                                                             CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &nperf, perf))) {
        conv_free(s);
        return op_error(c, "cuDNN: %s", kc_last_error());
    }
    int pick = -1;
    for (int i = 0; i < nperf; i++)
        if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= in->workspace_limit) { pick = i; break; }
    if (pick < 0) {
        conv_free(s);
        return op_error(c, "cuDNN has no convolution algorithm within the %zu-byte workspace limit", in->workspace_limit);
    }
    s->algo = perf[pick].algo;
    s->workspace = perf[pick].memory;
    /* cuDNN advises running an algorithm with the math type it was ranked
     * with; FP32 keeps FMA math so that no TF32 rounding creeps in. */
    if (s->dt == DT_FP16 && !KC_CUDNN_OK(cudnnSetConvolutionMathType(s->cd, perf[pick].mathType))) {
        conv_free(s);
        return op_error(c, "cuDNN: %s", kc_last_error());
    }
    /* Bias + ReLU fused in one cuDNN call (FP32; cuDNN wants the identity
     * activation only with IMPLICIT_PRECOMP_GEMM, so bias alone is a kernel). */
    int act = c->node->act;
    if (s->dt == DT_FP32 && s->has_bias && act == ACT_RELU) s->fused = 1;
    else if (s->has_bias || act != ACT_NONE) {
        s->post.kind = act;
        s->post.a = c->node->act_alpha;
        s->post.b = c->node->act_beta;
    }
    *workspace = s->workspace ? s->workspace + KC_WS_ALIGN : 0;
    *state = s;
    return 0;
}

static int conv_run(struct kc_instance *in, struct op_call *c, struct conv_state *s) {
    const float one = 1.0f, zero = 0.0f;
    struct tensor *y = c->out[0];
    if (s->workspace && c->scratch_size < s->workspace + KC_WS_ALIGN) return op_error(c, "cuDNN workspace missing");
    void *ws = s->workspace ? ws_align(c->scratch) : NULL;
    if (!KC_CUDNN_OK(cudnnSetStream(in->dnn, in->stream))) return op_error(c, "cuDNN: %s", kc_last_error());
    if (s->fused) {
        if (!KC_CUDNN_OK(cudnnConvolutionBiasActivationForward(in->dnn, &one, s->xd, c->in[0]->data, s->wd, c->in[1]->data,
                                                               s->cd, s->algo, ws, s->workspace, &zero, s->yd,
                                                               y->data, s->bd, c->in[2]->data, s->ad, s->yd, y->data)))
            return op_error(c, "cuDNN: %s", kc_last_error());
        return 0;
    }
    if (!KC_CUDNN_OK(cudnnConvolutionForward(in->dnn, &one, s->xd, c->in[0]->data, s->wd, c->in[1]->data, s->cd, s->algo,
                                             ws, s->workspace, &zero, s->yd, y->data)))
        return op_error(c, "cuDNN: %s", kc_last_error());
    if (s->has_bias || s->post.kind) {
        cudaError_t e = kc_bias_act(s->dt, y->data, s->has_bias ? c->in[2]->data : NULL, tensor_numel(y), s->channels,
                                    s->inner, s->post, in->stream);
        if (e != cudaSuccess) return op_error(c, "bias kernel: %s", cudaGetErrorString(e));
    }
    return 0;
}

static int pool_check(const struct op_call *c, struct geom *g, char *why, size_t why_len) {
    const struct tensor *x = c->in[0], *y = c->out[0];
    if (!is_float(x->dtype) || y->dtype != x->dtype) { kc_why(why, why_len, "dtype"); return -1; }
    if (c->nout > 1 && c->out[1]) { kc_why(why, why_len, "MaxPool Indices output"); return -1; }
    const int64_t *ks = NULL;
    int nk = node_attr_ints(c->node, "kernel_shape", &ks);
    if (nk != x->ndim - 2) { kc_why(why, why_len, "kernel_shape"); return -1; }
    if (geom_of(c, x, y, ks, g, why, why_len)) return -1;
    if (g->d[0] != 1 || g->d[1] != 1) { kc_why(why, why_len, "dilated pooling"); return -1; }
    return 0;
}

static int pool_prepare(struct kc_instance *in, struct op_call *c, void **state, size_t *workspace) {
    char why[200] = "";
    struct geom g;
    if (pool_check(c, &g, why, sizeof why)) return op_error(c, "cuDNN cannot run this pooling: %s", why);
    struct conv_state *s = (struct conv_state *)calloc(1, sizeof *s);
    if (!s) return op_error(c, "out of memory");
    s->kind = LIB_POOL;
    s->dt = c->in[0]->dtype;
    cudnnDataType_t dt = s->dt == DT_FP16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
    cudnnPoolingMode_t mode = CUDNN_POOLING_MAX_DETERMINISTIC;
    if (!strcmp(c->node->op_type, "AveragePool"))
        mode = node_attr_int(c->node, "count_include_pad", 0) ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                               : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    int ok = KC_CUDNN_OK(cudnnCreateTensorDescriptor(&s->xd)) && KC_CUDNN_OK(cudnnCreateTensorDescriptor(&s->yd)) &&
             KC_CUDNN_OK(cudnnCreatePoolingDescriptor(&s->pd)) && set4d(s->xd, dt, c->in[0]) && set4d(s->yd, dt, c->out[0]) &&
             KC_CUDNN_OK(cudnnSetPooling2dDescriptor(s->pd, mode, CUDNN_NOT_PROPAGATE_NAN, g.k[0], g.k[1], g.pad[0],
                                                     g.pad[1], g.s[0], g.s[1]));
    if (!ok) {
        conv_free(s);
        return op_error(c, "cuDNN: %s", kc_last_error());
    }
    if (c->node->act != ACT_NONE) {
        s->post.kind = c->node->act;
        s->post.a = c->node->act_alpha;
        s->post.b = c->node->act_beta;
    }
    (void)in;
    *workspace = 0;
    *state = s;
    return 0;
}

static int pool_run(struct kc_instance *in, struct op_call *c, struct conv_state *s) {
    const float one = 1.0f, zero = 0.0f;
    if (!KC_CUDNN_OK(cudnnSetStream(in->dnn, in->stream)) ||
        !KC_CUDNN_OK(cudnnPoolingForward(in->dnn, s->pd, &one, s->xd, c->in[0]->data, &zero, s->yd, c->out[0]->data)))
        return op_error(c, "cuDNN: %s", kc_last_error());
    if (s->post.kind) {
        cudaError_t e = kc_bias_act(s->dt, c->out[0]->data, NULL, tensor_numel(c->out[0]), 1, 1, s->post, in->stream);
        if (e != cudaSuccess) return op_error(c, "activation kernel: %s", cudaGetErrorString(e));
    }
    return 0;
}

/* ---- entry points ---------------------------------------------------------- */

int kc_lib_supports(struct kc_instance *in, const struct op_call *c, char *why, size_t why_len) {
    (void)in;
    const char *t = c->node->op_type;
    if (c->node->domain && c->node->domain[0] && strcmp(c->node->domain, "ai.onnx")) return 0;
    if (!c->in[0] || !c->out[0]) return 0;
    struct geom g;
    if (!strcmp(t, "MatMul") || !strcmp(t, "Gemm")) {
        struct gemm_shape gs;
        return gemm_shape_of(c, &gs, why, why_len) == 0;
    }
    if (!strcmp(t, "Conv")) return conv_check(c, &g, why, why_len) == 0;
    if (!strcmp(t, "MaxPool") || !strcmp(t, "AveragePool")) return pool_check(c, &g, why, why_len) == 0;
    return 0;
}

int kc_lib_prepare(struct kc_instance *in, struct op_call *c, void **state, size_t *workspace) {
    const char *t = c->node->op_type;
    *state = NULL;
    *workspace = 0;
    if (!strcmp(t, "MatMul") || !strcmp(t, "Gemm")) return gemm_prepare(in, c, state, workspace);
    if (!strcmp(t, "Conv")) return conv_prepare(in, c, state, workspace);
    if (!strcmp(t, "MaxPool") || !strcmp(t, "AveragePool")) return pool_prepare(in, c, state, workspace);
    return op_error(c, "not a library op");
}

int kc_lib_run(struct kc_instance *in, struct op_call *c, void *state) {
    switch (*(int *)state) {
    case LIB_GEMM: return gemm_run(in, c, (struct gemm_state *)state);
    case LIB_CONV: return conv_run(in, c, (struct conv_state *)state);
    case LIB_POOL: return pool_run(in, c, (struct conv_state *)state);
    }
    return op_error(c, "bad library op state");
}

void kc_lib_release(void *state) {
    if (!state) return;
    if (*(int *)state == LIB_GEMM) gemm_free((struct gemm_state *)state);
    else conv_free((struct conv_state *)state);
}
