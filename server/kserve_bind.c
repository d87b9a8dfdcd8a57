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
#include "models/model_tokenizer.h"
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

/* A raw binary request's one input: the body's bytes (r->inputs[0], one
 * BYTES element) as the model's one input, of batch 1 when it batches; at
 * most one dim the configuration leaves open is found from the byte count,
 * and a BYTES input takes the body as its one element (Triton's rules). */
static int bind_raw(const struct kserve_request *r, const struct model_config *mc, struct tensor *ordered,
                    int64_t *rows, char *err, size_t err_len) {
    char msh[128];
    if (mc->ninputs != 1)
        return INVALID("Raw request must only have 1 input (found 1) to be deduced but got %d inputs in '%s' model "
                       "configuration (a raw binary request, Inference-Header-Content-Length 0, needs a model with one "
                       "input)", mc->ninputs, mc->name);
    const struct model_config_io *io = &mc->inputs[0];
    cfg_shape_str(mc, io, msh, sizeof msh);
    if (io->ndim < 0)
        return INVALID("a raw binary request cannot give input '%s' of model '%s' a shape: its configuration "
                       "leaves the rank open", io->name, mc->name);
    struct tensor v = {.dtype = io->dtype};
    if (mc->max_batch_size > 0) v.dims[v.ndim++] = 1;
    int open = -1;
    for (int d = 0; d < io->ndim && v.ndim < TENSOR_MAX_DIMS; d++) {
        if (io->dims[d] < 0 && open >= 0)
            return INVALID("The shape of the raw input '%s' can not be deduced because there are more than one "
                           "variable-sized dimension (model '%s' has shape %s)", io->name, mc->name, msh);
        if (io->dims[d] < 0) open = v.ndim;
        v.dims[v.ndim++] = io->dims[d] < 0 ? 1 : io->dims[d];
    }
    struct tensor_str body = tensor_strs(&r->inputs[0].t)[0];
    if (io->dtype == DT_STRING) {
        if (tensor_numel(&v) != 1 || open >= 0)
            return INVALID("For BYTE datatype raw input '%s', the model must have input shape [1] (a raw binary "
                           "request sends one BYTES element; model '%s' has shape %s)", io->name, mc->name, msh);
        v.data = r->inputs[0].t.data;
    } else {
        size_t each = (size_t)tensor_numel(&v) * dtype_size(io->dtype);
        if (open >= 0 && each && body.len % each == 0) v.dims[open] = (int64_t)(body.len / each);
        else if (open >= 0 || body.len != each)
            return INVALID("the raw binary request has %zu bytes, which input '%s' of model '%s' (%s, shape %s) "
                           "cannot hold", body.len, io->name, mc->name, dtype_kserve_name(io->dtype), msh);
        v.data = (void *)body.p;
    }
    ordered[0] = v;
    *rows = 1;
    return check_dims(ordered, mc, err, err_len);
}

void kserve_reshape_outputs(const struct model_config *mc, struct tensor *outputs) {
    int skip = mc->max_batch_size > 0;
    for (int i = 0; i < mc->noutputs; i++) {
        const struct model_config_io *io = &mc->outputs[i];
        /* The config's checks at load make the fit certain for any shape
         * the model's rank allows; a model that breaks them keeps its own. */
        if (io->reshape_ndim >= 0 && outputs[i].ndim >= skip)
            model_config_reshape(&outputs[i], skip, io->dims, io->ndim);
    }
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
    int want = 0;
    for (int i = 0; i < mc->ninputs; i++) want += !mc->inputs[i].hidden;
    for (int i = 0, n = 0; i < mc->ninputs; i++)
        if (ordered[i].ndim < 0 && !mc->inputs[i].hidden)
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s'%s'", n++ ? "," : "",
                     mc->inputs[i].name);
    return INVALID("expected %d inputs but got %d inputs for model '%s'. Got input(s) [%s], but missing required "
                   "input(s) [%s]. Please provide all required input(s).", want, r->ninputs, mc->name, got,
                   missing);
}

int kserve_request_bind(const struct kserve_request *r, const struct model_config *mc,
                        struct tensor *ordered, int64_t *rows, char *err, size_t err_len) {
    char names[512], sh[128], msh[128];
    if (r->raw) return bind_raw(r, mc, ordered, rows, err, err_len);
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
        if (io->hidden)
            return INVALID("input '%s' of model '%s' is filled by the sequence batcher (a control or implicit state "
                           "input of sequence_batching): a request does not send it", in->name, mc->name);
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
        if (mc->tokenizer && model_tokenizer_check(&in->t, in->name, err, err_len)) return STATUS_INVALID;
        if (io->reshape_ndim >= 0 && model_config_reshape(&ordered[k], skip, io->reshape, io->reshape_ndim)) {
            cfg_shape_str(mc, io, msh, sizeof msh);
            return INVALID("input '%s': shape %s does not fit model '%s' reshape of %s", in->name,
                           tensor_shape_str(&in->t, sh, sizeof sh), mc->name, msh);
        }
    }
    /* An optional input left out runs with the model's default for it (a
     * view of the model's own tensor, which outlives the request). */
    for (int i = 0; i < mc->ninputs; i++)
        if (ordered[i].ndim < 0 && mc->inputs[i].dflt) ordered[i] = *mc->inputs[i].dflt;
        else if (ordered[i].ndim < 0 && mc->inputs[i].optional)
            return INVALID("optional input '%s' of model '%s' is missing: the graph needs it and has no default for "
                           "it (an initializer the graph lists as an input), so the request must give it",
                           mc->inputs[i].name, mc->name);
    for (int i = 0; i < mc->ninputs; i++)
        if (ordered[i].ndim < 0 && !mc->inputs[i].hidden) return missing_inputs(r, mc, ordered, err, err_len);
    for (int i = 0; i < r->noutputs; i++) {
        int k = model_config_find_output(mc, r->outputs[i].name);
        if (k >= 0 && mc->outputs[k].hidden)
            return INVALID("unexpected inference output '%s' for model '%s': it is implicit state, kept by the "
                           "server between a sequence's requests (list it under 'output' in the configuration to "
                           "have it sent too)", r->outputs[i].name, mc->name);
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
