/* eval.c - one node evaluated on the CPU: constant folding's kernel call. */

#include "models/eval.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/ops.h"

/* Scratch alignment, as a plan's arena gives its kernels. */
#define EVAL_ALIGN 64

static _Thread_local size_t eval_budget;

void eval_set_max_bytes(size_t bytes) { eval_budget = bytes; }
size_t eval_max_bytes(void) { return eval_budget; }

int eval_check_shape(const struct graph_node *n, const struct tensor *t, const char *vname, char *err,
                       size_t err_len) {
    if (t->dtype <= DT_UNDEFINED || t->dtype >= DT_MAX_ || dtype_size(t->dtype) == 0)
        return status_set(err, err_len, STATUS_INTERNAL, "node '%s' (%s): output '%s' has no datatype after shape inference",
                          n->name, n->op_type, vname);
    if (t->ndim < 0 || t->ndim > TENSOR_MAX_DIMS)
        return status_set(err, err_len, STATUS_INTERNAL, "node '%s' (%s): output '%s' has rank %d after shape inference",
                          n->name, n->op_type, vname, t->ndim);
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->dims[d] < 0)
            return status_set(err, err_len, STATUS_INVALID, "node '%s' (%s): output '%s' has unknown dim %d",
                              n->name, n->op_type, vname, d);
        if (t->dims[d] && numel > INT64_MAX / t->dims[d]) numel = INT64_MAX;
        else numel *= t->dims[d];
    }
    char s[160];
    if (numel != INT64_MAX && eval_budget && (uint64_t)numel > eval_budget / dtype_size(t->dtype) &&
        (uint64_t)numel <= EVAL_MAX_TENSOR_BYTES / dtype_size(t->dtype))
        return status_set(err, err_len, STATUS_INVALID,
                          "node '%s' (%s): output '%s' of shape %s needs %llu bytes, over the %zu bytes one request "
                          "may use (--max-request-memory)", n->name, n->op_type, vname,
                          tensor_shape_str(t, s, sizeof s), (unsigned long long)numel * dtype_size(t->dtype),
                          eval_budget);
    if (numel != INT64_MAX && (uint64_t)numel <= EVAL_MAX_TENSOR_BYTES / dtype_size(t->dtype)) return 0;
    return status_set(err, err_len, STATUS_INVALID, "node '%s' (%s): output '%s' of shape %s is too large",
                      n->name, n->op_type, vname, tensor_shape_str(t, s, sizeof s));
}

int eval_node(const struct graph_node *n, const struct tensor *const *in, int nin, struct tensor *out,
                   int nout, size_t max_bytes, char *err, size_t err_len) {
    const struct op_def *op = n->op;
    if (!op || !op->infer || !op->run)
        return status_set(err, err_len, STATUS_UNSUPPORTED, "node '%s' (%s): no kernel", n->name, n->op_type);
    if (nin > OP_MAX_IO || nout > OP_MAX_IO)
        return status_set(err, err_len, STATUS_UNSUPPORTED, "node '%s' (%s): more than %d inputs or outputs",
                          n->name, n->op_type, OP_MAX_IO);
    struct op_call c;
    op_call_init(&c, n, omp_get_max_threads(), err, err_len);
    c.nin = nin;
    c.nout = nout;
    for (int i = 0; i < nin; i++) c.in[i] = in[i];
    for (int i = 0; i < nout; i++) {
        out[i].data = NULL;
        c.out[i] = &out[i];
    }
    if (err && err_len) err[0] = 0;
    int rc = op->infer(&c);
    if (rc) return rc;
    size_t total = 0, in_bytes = 0;
    for (int i = 0; i < nout; i++) {
        if ((rc = eval_check_shape(n, &out[i], "", err, err_len))) return rc;
        total += tensor_nbytes(&out[i]);
    }
    for (int i = 0; i < nin; i++)
        if (in[i] && in[i]->data) in_bytes += tensor_nbytes(in[i]);
    /* Transposing or reshaping a large weight is fine: the limit is on what
     * folding would add, not on the size of the model's own constants. */
    if (total > max_bytes && total > 2 * in_bytes) return EVAL_TOO_LARGE;
    for (int i = 0; i < nout; i++) {
        size_t nb = tensor_nbytes(&out[i]);
        out[i].data = calloc(1, nb ? nb : 1);
        if (!out[i].data) {
            rc = status_set(err, err_len, STATUS_NOMEM, "node '%s' (%s): out of memory", n->name, n->op_type);
            goto fail;
        }
    }
    void *state = NULL;
    size_t scratch = 0;
    if (!(c.strings = op_strpool_create())) {
        rc = status_set(err, err_len, STATUS_NOMEM, "node '%s' (%s): out of memory", n->name, n->op_type);
        goto fail;
    }
    if (op->prepare && (rc = op->prepare(&c, &state, &scratch))) goto fail;
    void *sbuf = NULL;
    if (scratch) {
        sbuf = aligned_alloc(EVAL_ALIGN, (scratch + EVAL_ALIGN - 1) & ~(size_t)(EVAL_ALIGN - 1));
        if (!sbuf) {
            if (op->release) op->release(state);
            rc = status_set(err, err_len, STATUS_NOMEM, "node '%s' (%s): out of memory for scratch", n->name,
                            n->op_type);
            goto fail;
        }
    }
    c.state = state;
    c.scratch = sbuf;
    c.scratch_size = scratch;
    rc = op->run(&c);
    if (rc && err && err_len && !err[0])
        status_set(err, err_len, rc, "node '%s' (%s): kernel failed (%s)", n->name, n->op_type, status_str(rc));
    /* A kernel writes a string output as elements pointing at strings its inputs,
     * attributes, state or string pool own: the result gets its own block
     * (common/tensor.h) before the state and the pool are released. */
    for (int i = 0; i < nout && !rc; i++) {
        if (out[i].dtype != DT_STRING) continue;
        struct tensor_str *view = out[i].data;
        if (tensor_strings_pack(&out[i], view))
            rc = status_set(err, err_len, STATUS_NOMEM, "node '%s' (%s): out of memory", n->name, n->op_type);
        else free(view);
    }
    if (op->release && op->prepare) op->release(state);
    free(sbuf);
    if (rc) goto fail;
    op_strpool_free(c.strings);
    return 0;
fail:
    op_strpool_free(c.strings);
    for (int i = 0; i < nout; i++) tensor_free_data(&out[i]);
    return rc;
}
