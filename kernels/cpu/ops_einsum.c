/* ops_einsum.c - Einsum (opset 12): any number of operands, explicit
 * ("ij,jk->ik") and implicit ("ij,jk") outputs, an ellipsis broadcast as
 * numpy broadcasts, labels repeated within an operand (diagonals) and
 * labels summed away.
 *
 * The equation is parsed once, at prepare, into strides: every distinct
 * label gets a size, and each operand a stride per label (the sum of its
 * dims' strides where the label repeats, 0 where a broadcast dim has size
 * 1). An output element is then a sum, over the odometer of the summed
 * labels, of the operands' product at offsets that advance by those
 * strides. Floating point sums in double, integers in 64 bits.
 *
 * Two float32 operands (a matmul, attention's scores) go to oneDNN's sgemm
 * instead: see ein_gemm_plan. */
#include <stdint.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/shape_util.h"
#include "kernels/ops.h"

/* Labels: 'a'-'z' are 0-25, 'A'-'Z' 26-51, then one per ellipsis dim. */
#define EIN_LETTERS 52
#define EIN_MAX_LABELS (EIN_LETTERS + TENSOR_MAX_DIMS)

/* Element counts below this sum on the calling thread. */
#define EIN_PAR_MIN 32768

/* A strided view of a tensor: element (i_0..i_nd-1) sits at the sum of
 * i_j * str[j] (elements). */
struct ein_view {
    int nd;
    int64_t dims[SHAPE_MAX_VIEW_DIMS], str[SHAPE_MAX_VIEW_DIMS];
};

/* Two float32 operands as one batched GEMM (ein_gemm_plan). */
struct ein_gemm {
    int on;
    int64_t batch, m, n, k;
    struct ein_view a, b; /* A as [batch, M, K], B as [batch, K, N] */
    struct ein_view y;    /* the output, read from C [batch, M, N] */
    size_t off_b, off_c;  /* scratch: packed A at 0, then B, then C */
};

struct ein_params {
    int nin;
    int nlabels;                            /* EIN_LETTERS + ellipsis rank */
    int64_t size[EIN_MAX_LABELS];           /* -1: label unused */
    int nout, nsum;
    int out_label[TENSOR_MAX_DIMS];
    int sum_label[EIN_MAX_LABELS];
    int64_t ostride[OP_MAX_IO][TENSOR_MAX_DIMS]; /* operand k's stride along output dim j */
    int64_t sstride[OP_MAX_IO][EIN_MAX_LABELS];  /* along summed label j */
    struct ein_gemm gemm;
};

/* One operand's term: a label per dim, ellipsis dims expanded. */
struct ein_term {
    int ndim;
    int label[TENSOR_MAX_DIMS];
};

static int ein_letter(char ch) {
    if (ch >= 'a' && ch <= 'z') return ch - 'a';
    if (ch >= 'A' && ch <= 'Z') return 26 + ch - 'A';
    return -1;
}

/* Parses one subscript string s[0..n) (spaces dropped) with an ellipsis
 * of rank erank at most once, into labels; the ellipsis of an operand of
 * rank r < ellipsis rank E takes the last r of the E ellipsis labels. */
static int ein_parse_term(struct op_call *c, const char *s, size_t n, int rank, int erank, int total_erank,
                          struct ein_term *t) {
    int seen_ellipsis = 0;
    t->ndim = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') continue;
        if (s[i] == '.') {
            if (seen_ellipsis || i + 2 >= n || s[i + 1] != '.' || s[i + 2] != '.')
                return op_error(c, "malformed ellipsis in the equation");
            seen_ellipsis = 1;
            i += 2;
            for (int e = 0; e < erank; e++) {
                if (t->ndim >= TENSOR_MAX_DIMS) return op_error(c, "a term has more than %d dims", TENSOR_MAX_DIMS);
                t->label[t->ndim++] = EIN_LETTERS + total_erank - erank + e;
            }
            continue;
        }
        int l = ein_letter(s[i]);
        if (l < 0) return op_error(c, "unexpected '%c' in the equation", s[i]);
        if (t->ndim >= TENSOR_MAX_DIMS) return op_error(c, "a term has more than %d dims", TENSOR_MAX_DIMS);
        t->label[t->ndim++] = l;
    }
    if (rank >= 0 && t->ndim != rank)
        return op_error(c, "a term names %d dims for an operand of rank %d", t->ndim, rank);
    return 0;
}

/* Letters in s[0..n) and whether it holds an ellipsis. */
static int ein_count_letters(const char *s, size_t n, int *has_ellipsis) {
    int k = 0;
    *has_ellipsis = 0;
    for (size_t i = 0; i < n; i++) {
        if (ein_letter(s[i]) >= 0) k++;
        if (s[i] == '.') *has_ellipsis = 1;
    }
    return k;
}

/* Records operand k's dims as label sizes; ellipsis labels broadcast
 * (size 1 against any), letters must agree. */
static int ein_sizes(struct op_call *c, struct ein_params *p, const struct ein_term *t, const struct tensor *x) {
    for (int d = 0; d < t->ndim; d++) {
        int l = t->label[d];
        int64_t n = x->dims[d], *have = &p->size[l];
        if (*have < 0 || *have == n) *have = n;
        else if (l >= EIN_LETTERS && (*have == 1 || n == 1)) *have = *have == 1 ? n : *have;
        else return op_error(c, "label sizes disagree: %lld against %lld", (long long)*have, (long long)n);
    }
    return 0;
}

/* The output's labels: the explicit right-hand side, or (implicit) the
 * ellipsis then each letter used once, in ASCII order as numpy has it. */
static int ein_output(struct op_call *c, struct ein_params *p, const char *rhs, int erank, const int *uses) {
    struct ein_term t;
    if (rhs) {
        int rc = ein_parse_term(c, rhs, strlen(rhs), -1, erank, erank, &t);
        if (rc) return rc;
        for (int d = 0; d < t.ndim; d++) {
            if (p->size[t.label[d]] < 0) return op_error(c, "an output label is on no operand");
            for (int e = 0; e < d; e++)
                if (t.label[e] == t.label[d]) return op_error(c, "an output label repeats");
        }
    } else {
        t.ndim = 0;
        for (int e = 0; e < erank; e++) t.label[t.ndim++] = EIN_LETTERS + e;
        static const int ascii[EIN_LETTERS] = {26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43,
                                               44, 45, 46, 47, 48, 49, 50, 51, 0,  1,  2,  3,  4,  5,  6,  7,  8,  9,
                                               10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25};
        for (int i = 0; i < EIN_LETTERS; i++)
            if (uses[ascii[i]] == 1) {
                if (t.ndim >= TENSOR_MAX_DIMS) return op_error(c, "the output has more than %d dims", TENSOR_MAX_DIMS);
                t.label[t.ndim++] = ascii[i];
            }
    }
    p->nout = t.ndim;
    memcpy(p->out_label, t.label, sizeof(int) * (size_t)t.ndim);
    return 0;
}

/* Strides of every operand along the output dims and the summed labels. */
static void ein_strides(struct ein_params *p, const struct ein_term *terms, const struct tensor *const *in) {
    int is_out[EIN_MAX_LABELS] = {0};
    for (int j = 0; j < p->nout; j++) is_out[p->out_label[j]] = 1;
    p->nsum = 0;
    for (int l = 0; l < p->nlabels; l++)
        if (p->size[l] >= 0 && !is_out[l]) p->sum_label[p->nsum++] = l;
    for (int k = 0; k < p->nin; k++) {
        int64_t by_label[EIN_MAX_LABELS] = {0}, st = 1;
        for (int d = terms[k].ndim - 1; d >= 0; d--) {
            int l = terms[k].label[d];
            if (!(in[k]->dims[d] == 1 && p->size[l] != 1)) by_label[l] += st;
            st *= in[k]->dims[d];
        }
        for (int j = 0; j < p->nout; j++) p->ostride[k][j] = by_label[p->out_label[j]];
        for (int j = 0; j < p->nsum; j++) p->sstride[k][j] = by_label[p->sum_label[j]];
    }
}

static int ein_decode(struct op_call *c, struct ein_params *p) {
    const char *eq = node_attr_str(c->node, "equation", NULL);
    if (!eq) return op_error(c, "attribute 'equation' is required");
    if (c->nin < 1) return op_error(c, "Einsum needs at least one operand");
    p->nin = c->nin;
    const char *arrow = strstr(eq, "->");
    size_t lhs_len = arrow ? (size_t)(arrow - eq) : strlen(eq);
    /* Operand k's subscripts are lhs[starts[k], ends[k]). */
    size_t starts[OP_MAX_IO], ends[OP_MAX_IO];
    int nterms = 0;
    for (size_t i = 0, s = 0; i <= lhs_len; i++)
        if (i == lhs_len || eq[i] == ',') {
            if (nterms == OP_MAX_IO) return op_error(c, "too many terms in the equation");
            starts[nterms] = s, ends[nterms++] = i, s = i + 1;
        }
    if (nterms != c->nin) return op_error(c, "the equation has %d terms for %d operands", nterms, c->nin);
    int erank = 0, eranks[OP_MAX_IO];
    for (int k = 0; k < c->nin; k++) {
        const struct tensor *x = c->in[k];
        if (!x || x->dtype != c->in[0]->dtype) return op_error(c, "every operand must be present and of one dtype");
        int has_e, letters = ein_count_letters(eq + starts[k], ends[k] - starts[k], &has_e);
        eranks[k] = has_e ? x->ndim - letters : 0;
        if (eranks[k] < 0 || (!has_e && letters != x->ndim))
            return op_error(c, "term %d names %d dims for an operand of rank %d", k, letters, x->ndim);
        if (eranks[k] > erank) erank = eranks[k];
    }
    p->nlabels = EIN_LETTERS + erank;
    for (int l = 0; l < EIN_MAX_LABELS; l++) p->size[l] = -1;
    struct ein_term terms[OP_MAX_IO];
    int uses[EIN_MAX_LABELS] = {0}, rc;
    for (int k = 0; k < c->nin; k++) {
        if ((rc = ein_parse_term(c, eq + starts[k], ends[k] - starts[k], c->in[k]->ndim, eranks[k], erank, &terms[k])) ||
            (rc = ein_sizes(c, p, &terms[k], c->in[k])))
            return rc;
        for (int d = 0; d < terms[k].ndim; d++) uses[terms[k].label[d]]++;
    }
    if ((rc = ein_output(c, p, arrow ? arrow + 2 : NULL, erank, uses))) return rc;
    ein_strides(p, terms, c->in);
    return 0;
}

static int ein_dtype_ok(enum dtype dt) {
    switch (dt) {
    case DT_FP32: case DT_FP64: case DT_FP16: case DT_BF16: case DT_INT32: case DT_INT64: case DT_UINT32:
    case DT_UINT64: return 1;
    default: return 0;
    }
}

/* The summed-label space's size. */
static int64_t ein_sum_count(const struct ein_params *p) {
    int64_t n = 1;
    for (int j = 0; j < p->nsum; j++) n *= p->size[p->sum_label[j]];
    return n;
}

/* ---- two float32 operands: one batched GEMM ---------------------------- */

static int ein_view_add(struct ein_view *v, int64_t n, int64_t stride) {
    if (v->nd == SHAPE_MAX_VIEW_DIMS) return -1;
    v->dims[v->nd] = n;
    v->str[v->nd++] = stride;
    return 0;
}

enum { EIN_BATCH, EIN_M, EIN_N };

/* Output labels on both operands are the batch, those on A alone the rows
 * (M), on B alone the columns (N); the summed labels are the inner dim (K).
 * The operands are gathered into [batch, M, K] and [batch, K, N] by their
 * label strides, where a repeated label (a stride sum) or a broadcast dim
 * (stride 0) need nothing special; the
 * product is then read into the output's order. A label of stride 0 in
 * both operands (size 1) goes with M. Off when a view would need more
 * dims than a strided copy takes, and when a summed label is missing from
 * one operand: the gather would repeat the other operand along it, where
 * the general loop needs no copy. */
static void ein_gemm_plan(struct ein_params *p, enum dtype dt) {
    struct ein_gemm *g = &p->gemm;
    memset(g, 0, sizeof *g);
    if (p->nin != 2 || dt != DT_FP32) return;
    for (int s = 0; s < p->nsum; s++)
        if (p->size[p->sum_label[s]] > 1 && (!p->sstride[0][s] || !p->sstride[1][s])) return;
    int cls[TENSOR_MAX_DIMS];
    int64_t cnt[3] = {1, 1, 1};
    for (int j = 0; j < p->nout; j++) {
        int64_t sa = p->ostride[0][j], sb = p->ostride[1][j];
        cls[j] = sa && sb ? EIN_BATCH : sb ? EIN_N : EIN_M;
        cnt[cls[j]] *= p->size[p->out_label[j]];
    }
    g->batch = cnt[EIN_BATCH], g->m = cnt[EIN_M], g->n = cnt[EIN_N], g->k = ein_sum_count(p);
    /* C is packed [batch, M, N], each group's labels in output order. */
    int64_t inner[3] = {g->m * g->n, g->n, 1}, cstr[TENSOR_MAX_DIMS];
    for (int j = p->nout - 1; j >= 0; j--) {
        cstr[j] = inner[cls[j]];
        inner[cls[j]] *= p->size[p->out_label[j]];
    }
    int bad = 0;
    for (int j = 0; j < p->nout; j++) bad |= ein_view_add(&g->y, p->size[p->out_label[j]], cstr[j]);
    for (int j = 0; j < p->nout; j++)
        if (cls[j] == EIN_BATCH) {
            bad |= ein_view_add(&g->a, p->size[p->out_label[j]], p->ostride[0][j]);
            bad |= ein_view_add(&g->b, p->size[p->out_label[j]], p->ostride[1][j]);
        }
    for (int j = 0; j < p->nout; j++)
        if (cls[j] == EIN_M) bad |= ein_view_add(&g->a, p->size[p->out_label[j]], p->ostride[0][j]);
    for (int s = 0; s < p->nsum; s++) {
        bad |= ein_view_add(&g->a, p->size[p->sum_label[s]], p->sstride[0][s]);
        bad |= ein_view_add(&g->b, p->size[p->sum_label[s]], p->sstride[1][s]);
    }
    for (int j = 0; j < p->nout; j++)
        if (cls[j] == EIN_N) bad |= ein_view_add(&g->b, p->size[p->out_label[j]], p->ostride[1][j]);
    g->off_b = dnnl_util_align(sizeof(float) * (size_t)(g->batch * g->m * g->k));
    g->off_c = g->off_b + dnnl_util_align(sizeof(float) * (size_t)(g->batch * g->k * g->n));
    g->on = !bad;
}

static int ein_gemm_run(struct op_call *c, const struct ein_gemm *g) {
    float *a = c->scratch, *b = (float *)((char *)c->scratch + g->off_b), *cm = (float *)((char *)c->scratch + g->off_c);
    int nt = c->nthreads;
    shape_strided_copy(a, c->in[0]->data, 0, g->a.nd, g->a.dims, g->a.str, sizeof(float), nt);
    shape_strided_copy(b, c->in[1]->data, 0, g->b.nd, g->b.dims, g->b.str, sizeof(float), nt);
    dnnl_util_set_threads(nt);
    for (int64_t i = 0; i < g->batch && g->m && g->n; i++) {
        float *ci = cm + i * g->m * g->n;
        if (!g->k) memset(ci, 0, sizeof(float) * (size_t)(g->m * g->n));
        else DNNL_CHECK(dnnl_sgemm('N', 'N', g->m, g->n, g->k, 1.0f, a + i * g->m * g->k, g->k, b + i * g->k * g->n, g->n,
                                   0.0f, ci, g->n));
    }
    shape_strided_copy(c->out[0]->data, cm, 0, g->y.nd, g->y.dims, g->y.str, sizeof(float), nt);
    return 0;
}

static int einsum_infer(struct op_call *c) {
    struct ein_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    int rc = ein_decode(c, p);
    if (!rc && !ein_dtype_ok(c->in[0]->dtype)) {
        op_error(c, "unsupported dtype %s", dtype_name(c->in[0]->dtype));
        rc = STATUS_UNSUPPORTED;
    }
    if (!rc) {
        struct tensor *y = c->out[0];
        y->dtype = c->in[0]->dtype;
        y->ndim = p->nout;
        for (int j = 0; j < p->nout; j++) y->dims[j] = p->size[p->out_label[j]];
    }
    op_params_free(p);
    return rc;
}

static int einsum_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct ein_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    int rc = ein_decode(c, p);
    if (rc) {
        op_params_free(p);
        return rc;
    }
    ein_gemm_plan(p, c->in[0]->dtype);
    if (p->gemm.on) *scratch = p->gemm.off_c + sizeof(float) * (size_t)(p->gemm.batch * p->gemm.m * p->gemm.n);
    *state = p;
    return 0;
}

/* Offsets of output element o in each operand. */
static void ein_out_offsets(const struct ein_params *p, int64_t o, int64_t *off) {
    for (int k = 0; k < p->nin; k++) off[k] = 0;
    for (int j = p->nout - 1; j >= 0; j--) {
        int64_t n = p->size[p->out_label[j]], i = o % n;
        o /= n;
        for (int k = 0; k < p->nin; k++) off[k] += i * p->ostride[k][j];
    }
}

/* Advances the summed labels' odometer by one, moving the offsets. */
static void ein_sum_next(const struct ein_params *p, int64_t *idx, int64_t *off) {
    for (int j = p->nsum - 1; j >= 0; j--) {
        int64_t n = p->size[p->sum_label[j]];
        if (++idx[j] < n) {
            for (int k = 0; k < p->nin; k++) off[k] += p->sstride[k][j];
            return;
        }
        idx[j] = 0;
        for (int k = 0; k < p->nin; k++) off[k] -= (n - 1) * p->sstride[k][j];
    }
}

#define EIN_LOOP(T, ACC, LOAD, STORE)                                                          \
    do {                                                                                       \
        T *y_ = c->out[0]->data;                                                               \
        _Pragma("omp parallel for if (nout * nsum >= EIN_PAR_MIN)")                            \
        for (int64_t o = 0; o < nout; o++) {                                                   \
            int64_t off[OP_MAX_IO], idx[EIN_MAX_LABELS] = {0};                                 \
            ein_out_offsets(p, o, off);                                                        \
            ACC acc = 0;                                                                       \
            for (int64_t s = 0; s < nsum; s++) {                                               \
                ACC v = LOAD(((const T *)c->in[0]->data)[off[0]]);                             \
                for (int k = 1; k < p->nin; k++) v *= LOAD(((const T *)c->in[k]->data)[off[k]]); \
                acc += v;                                                                      \
                ein_sum_next(p, idx, off);                                                     \
            }                                                                                  \
            y_[o] = STORE(acc);                                                                \
        }                                                                                      \
    } while (0)
#define EIN_ID(v) (v)

static int einsum_run(struct op_call *c) {
    const struct ein_params *p = c->state;
    if (p->gemm.on) return ein_gemm_run(c, &p->gemm);
    int64_t nout = tensor_numel(c->out[0]), nsum = ein_sum_count(p);
    switch (c->out[0]->dtype) {
    case DT_FP32: EIN_LOOP(float, double, EIN_ID, (float)); break;
    case DT_FP64: EIN_LOOP(double, double, EIN_ID, EIN_ID); break;
    case DT_FP16: EIN_LOOP(uint16_t, double, fp16_to_fp32, fp32_to_fp16); break;
    case DT_BF16: EIN_LOOP(uint16_t, double, bf16_to_fp32, fp32_to_bf16); break;
    case DT_INT32: EIN_LOOP(int32_t, int64_t, EIN_ID, (int32_t)); break;
    case DT_INT64: EIN_LOOP(int64_t, int64_t, EIN_ID, EIN_ID); break;
    case DT_UINT32: EIN_LOOP(uint32_t, uint64_t, EIN_ID, (uint32_t)); break;
    case DT_UINT64: EIN_LOOP(uint64_t, uint64_t, EIN_ID, EIN_ID); break;
    default: return op_error(c, "unsupported dtype %s", dtype_name(c->out[0]->dtype));
    }
    return 0;
}

const struct op_def op_defs_einsum[] = {
    {"Einsum", "", einsum_infer, einsum_prepare, einsum_run, op_params_free, 0},
    {NULL, NULL, NULL, NULL, NULL, NULL, 0},
};
