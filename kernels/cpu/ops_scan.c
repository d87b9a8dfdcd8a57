/* ops_scan.c - running scans along one axis: CumSum and CumProd, one loop
 * that differs only in the operation and its identity. The axis is an
 * input read at run time; exclusive and reverse are decoded at prepare. */

#include "kernels/cpu/shape_util.h"
#include "kernels/ops.h"

static int cumsum_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int rc = need_input(c, 1, "axis");
    if (rc) return rc;
    switch (x->dtype) {
    case DT_FP32: case DT_FP64: case DT_INT32: case DT_INT64: case DT_UINT32: case DT_UINT64: case DT_FP16: case DT_BF16: break;
    default: return op_error(c, "unsupported dtype %s", dtype_name(x->dtype));
    }
    if (c->in[1]->data && op_axis(c, op_int_at(c->in[1], 0), x->ndim) < 0) return STATUS_INVALID;
    return set_shape(c, c->out[0], x->dtype, x->ndim, x->dims);
}

/* CumSum and CumProd: one running scan along the axis, starting from the
 * operation's identity; exclusive writes the value before adding the
 * element, reverse walks the axis from its end. */
#define SCAN_LOOP(T, ACC, LOAD, STORE)                                                         \
    do {                                                                                       \
        const T *s_ = x->data;                                                                 \
        T *d_ = c->out[0]->data;                                                               \
        for (int64_t p = 0; p < outer; p++)                                                    \
            for (int64_t q = 0; q < inner; q++) {                                              \
                ACC acc = mul ? 1 : 0;                                                         \
                for (int64_t t = 0; t < n; t++) {                                              \
                    int64_t j = rev ? n - 1 - t : t, at = (p * n + j) * inner + q;             \
                    ACC v = LOAD(s_[at]);                                                      \
                    if (excl) d_[at] = STORE(acc);                                             \
                    if (mul) acc *= v;                                                         \
                    else acc += v;                                                             \
                    if (!excl) d_[at] = STORE(acc);                                            \
                }                                                                              \
            }                                                                                  \
    } while (0)
#define ID(v) (v)

/* A scan's attributes, decoded at prepare (the axis is an input). */
struct scan_params {
    int excl, rev;
};

static int scan_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct scan_params *p = op_params_alloc(c, sizeof *p);
    if (!p) return STATUS_NOMEM;
    p->excl = node_attr_int(c->node, "exclusive", 0) != 0;
    p->rev = node_attr_int(c->node, "reverse", 0) != 0;
    *state = p;
    return 0;
}

static int scan_run(struct op_call *c, int mul) {
    const struct scan_params *sp = c->state;
    const struct tensor *x = c->in[0];
    int a = op_axis(c, op_int_at(c->in[1], 0), x->ndim);
    if (a < 0) return STATUS_INVALID;
    int excl = sp->excl, rev = sp->rev;
    int64_t outer = prod(x->dims, 0, a), n = x->ndim ? x->dims[a] : 1, inner = prod(x->dims, a + 1, x->ndim);
    switch (x->dtype) {
    case DT_FP32: SCAN_LOOP(float, double, ID, (float)); break;
    case DT_FP64: SCAN_LOOP(double, double, ID, ID); break;
    case DT_INT32: SCAN_LOOP(int32_t, int64_t, ID, (int32_t)); break;
    case DT_INT64: SCAN_LOOP(int64_t, int64_t, ID, ID); break;
    case DT_UINT32: SCAN_LOOP(uint32_t, uint64_t, ID, (uint32_t)); break;
    case DT_UINT64: SCAN_LOOP(uint64_t, uint64_t, ID, ID); break;
    case DT_FP16: SCAN_LOOP(uint16_t, float, fp16_to_fp32, fp32_to_fp16); break;
    case DT_BF16: SCAN_LOOP(uint16_t, float, bf16_to_fp32, fp32_to_bf16); break;
    default: return op_error(c, "unsupported dtype %s", dtype_name(x->dtype));
    }
    return 0;
}
static int cumsum_run(struct op_call *c) { return scan_run(c, 0); }
static int cumprod_run(struct op_call *c) { return scan_run(c, 1); }

/* ------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------ */

const struct op_def op_defs_scan[] = {
    {"CumSum", "", cumsum_infer, scan_prepare, cumsum_run, op_params_free, 0},
    {"CumProd", "", cumsum_infer, scan_prepare, cumprod_run, op_params_free, 0},
    {0},
};
