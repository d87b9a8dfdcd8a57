/* kserve_bind.c - kserve_request_bind: a parsed request checked against a
 * model's configuration (names, data types, shapes, batch size, outputs
 * asked for), the one owner of those checks on the server's path. The
 * contract is server/kserve.h. */
#include "server/kserve.h"

#include <stdio.h>
#include <string.h>

#include "common/status.h"
#include "config/model_config.h"
#include "models/model.h"
#include "server/kserve_impl.h"

/* ---- binding to a model ------------------------------------------------- */

static void names_list(char *buf, size_t cap, const struct model_config_io *io, int n) {
    buf[0] = 0;
    for (int i = 0; i < n; i++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s'%s'", i ? ", " : "", io[i].name);
}

static void cfg_shape_str(const struct model_config *mc, const struct model_config_io *io, char *buf, size_t cap) {
    struct tensor t = {.ndim = 0};
    if (mc->max_batch_size > 0) t.dims[t.ndim++] = -1;
    for (int d = 0; d < io->ndim && t.ndim < TENSOR_MAX_DIMS; d++) t.dims[t.ndim++] = io->dims[d];
    tensor_shape_str(&t, buf, cap);
}

/* The engine's bound on any dim (MODEL_MAX_DIM), which a configuration's -1
 * leaves open: checked here, after everything else, because the model runs
 * these inputs unchecked (model_run_unchecked). */
static int check_dims(const struct tensor *ordered, const struct model_config *mc, char *err, size_t err_len) {
    for (int i = 0; i < mc->ninputs; i++)
        for (int d = 0; d < ordered[i].ndim; d++)
            if (ordered[i].dims[d] < 0 || ordered[i].dims[d] > MODEL_MAX_DIM)
                return INVALID("input '%s': dim %d is %lld, outside [0, %lld]", mc->inputs[i].name, d,
                               (long long)ordered[i].dims[d], (long long)MODEL_MAX_DIM);
    return 0;
}

/* Triton's words for inputs left out, which its clients' tests compare
 * whole: "expected 3 inputs but got 1 inputs for model 'm'. Got input(s)
 * ['a'], but missing required input(s) ['b','c']. Please provide all
 * required input(s)." */
static int missing_inputs(const struct kserve_request *r, const struct model_config *mc, const struct tensor *ordered,
                          char *err, size_t err_len) {
    char got[512] = "", missing[512] = "";
    for (int i = 0, n = 0; i < r->ninputs; i++, n++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s'%s'", n ? "," : "", r->inputs[i].name);
    for (int i = 0, n = 0; i < mc->ninputs; i++)
        if (ordered[i].ndim < 0)
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s'%s'", n++ ? "," : "",
                     mc->inputs[i].name);
    return INVALID("expected %d inputs but got %d inputs for model '%s'. Got input(s) [%s], but missing required "
                   "input(s) [%s]. Please provide all required input(s).", mc->ninputs, r->ninputs, mc->name, got,
                   missing);
}

int kserve_request_bind(const struct kserve_request *r, const struct model_config *mc,
                        struct tensor *ordered, int64_t *rows, char *err, size_t err_len) {
    char names[512], sh[128], msh[128];
    /* ndim -1 marks an input the request has not supplied yet. */
    for (int i = 0; i < mc->ninputs; i++) {
        memset(&ordered[i], 0, sizeof ordered[i]);
        ordered[i].ndim = -1;
    }
    int64_t batch = -1;
    for (int i = 0; i < r->ninputs; i++) {
        const struct kserve_input *in = &r->inputs[i];
        int k = model_config_find_input(mc, in->name);
        if (k < 0) {
            names_list(names, sizeof names, mc->inputs, mc->ninputs);
            return INVALID("unexpected inference input '%s' for model '%s': it has inputs %s", in->name, mc->name, names);
        }
        const struct model_config_io *io = &mc->inputs[k];
        if (in->t.dtype != io->dtype)
            return INVALID("input '%s': datatype is %s but model '%s' expects %s", in->name,
                           dtype_kserve_name(in->t.dtype), mc->name, dtype_kserve_name(io->dtype));
        int skip = mc->max_batch_size > 0;
        int bad = 0;
        if (io->ndim >= 0) {
            if (in->t.ndim != io->ndim + skip) bad = 1;
            for (int d = 0; !bad && d < io->ndim; d++)
                if (io->dims[d] >= 0 && in->t.dims[d + skip] != io->dims[d]) bad = 1;
        } else if (skip && in->t.ndim < 1) bad = 1;
        if (bad) {
            cfg_shape_str(mc, io, msh, sizeof msh);
            return INVALID("input '%s': shape %s does not match model '%s' shape %s", in->name,
                           tensor_shape_str(&in->t, sh, sizeof sh), mc->name, msh);
        }
        if (skip) {
            int64_t b = in->t.dims[0];
            if (b < 1 || b > mc->max_batch_size)
                return INVALID("input '%s': batch size %lld (shape[0]) must be 1 to max_batch_size %d of model '%s'",
                               in->name, (long long)b, mc->max_batch_size, mc->name);
            if (batch >= 0 && b != batch)
                return INVALID("input '%s': batch size %lld differs from the other inputs' %lld", in->name,
                               (long long)b, (long long)batch);
            batch = b;
        }
        ordered[k] = in->t;
    }
    for (int i = 0; i < mc->ninputs; i++)
        if (ordered[i].ndim < 0) return missing_inputs(r, mc, ordered, err, err_len);
    for (int i = 0; i < r->noutputs; i++) {
        int k = model_config_find_output(mc, r->outputs[i].name);
        if (k < 0) {
            names_list(names, sizeof names, mc->outputs, mc->noutputs);
            return INVALID("unexpected inference output '%s' for model '%s': it has outputs %s", r->outputs[i].name,
                           mc->name, names);
        }
        enum dtype dt = mc->outputs[k].dtype;
        if (r->outputs[i].classification > 0 && (dt == DT_STRING || dt == DT_BOOL))
            return INVALID("output '%s': parameters.classification needs a numeric output, not %s", r->outputs[i].name,
                           dtype_kserve_name(dt));
    }
    *rows = batch > 0 ? batch : 1;
    return check_dims(ordered, mc, err, err_len);
}
