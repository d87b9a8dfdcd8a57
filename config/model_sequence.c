/* model_sequence.c - Triton's sequence_batching field (config/model_config.h):
 *
 *   "sequence_batching": {"max_sequence_idle_microseconds": 5000000,
 *     "direct": {"max_queue_delay_microseconds": 0} | "oldest": {"max_candidate_sequences": 4, ...},
 *     "control_input": [{"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START",
 *                                                      "fp32_false_true": [0, 1]}]}, ...],
 *     "state": [{"input_name": "INPUT_STATE", "output_name": "OUTPUT_STATE", "data_type": "TYPE_FP32",
 *                "dims": [1], "initial_state": [{"name": "zeros", "data_type": "TYPE_FP32", "dims": [1],
 *                                                "zero_data": true}]}]}
 *
 * protobuf's JSON form leaves out a field at its default, so a control
 * without "kind" is CONTROL_SEQUENCE_START (the enum's zero). Control and
 * state inputs and state outputs are the model's own inputs and outputs:
 * model_sequence_complete checks them against it and marks them hidden in
 * the configuration's lists, where the file need not list them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/model_io.h"
#include "common/status.h"
#include "config/config_json.h"
#include "config/model_config.h"

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)
#define FIELD "config field 'sequence_batching"
#define DEFAULT_IDLE_US 1000000ull

static const char *const kind_names[] = {"CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_END",
                                         "CONTROL_SEQUENCE_CORRID"};

void model_sequence_clear(struct model_config *c) {
    struct model_sequence *s = &c->sequence;
    for (int i = 0; i < s->ncontrols; i++) free(s->controls[i].input);
    for (int i = 0; i < s->nstates; i++) {
        free(s->states[i].input);
        free(s->states[i].output);
        free(s->states[i].file);
    }
    memset(s, 0, sizeof *s);
}

/* A JSON array of dims (numbers or strings, >= -1) into out. */
static int dims_of(const cJSON *arr, int64_t *out, int *n) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) > TENSOR_MAX_DIMS) return -1;
    *n = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, arr) {
        double v = cJSON_IsNumber(d) ? d->valuedouble : cJSON_IsString(d) ? strtod(d->valuestring, NULL) : -2;
        if (v != (double)(int64_t)v || v < -1 || v > (double)(1LL << 40)) return -1;
        out[(*n)++] = (int64_t)v;
    }
    return 0;
}

/* One control_input entry: its name and its one control. */
static int parse_control(struct model_sequence *s, const cJSON *e, int i, char *err, size_t err_len) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *ctl = cJSON_GetObjectItemCaseSensitive(e, "control");
    if (!cJSON_IsObject(e) || !cJSON_IsString(name) || !*name->valuestring)
        return INVALID(FIELD ".control_input[%d].name' must be a non-empty string", i);
    if (!cJSON_IsArray(ctl) || cJSON_GetArraySize(ctl) != 1)
        return INVALID(FIELD ".control_input[%d].control' of '%s' must be an array of one control", i,
                       name->valuestring);
    if (s->ncontrols == MODEL_SEQ_MAX_CONTROLS)
        return INVALID(FIELD ".control_input' has more than %d inputs", MODEL_SEQ_MAX_CONTROLS);
    const cJSON *c = cJSON_GetArrayItem(ctl, 0);
    struct model_seq_control *x = &s->controls[s->ncontrols];
    memset(x, 0, sizeof *x);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(c, "kind");
    int k = kind ? -1 : MODEL_SEQ_START;
    for (int j = 0; kind && cJSON_IsString(kind) && j < 4; j++)
        if (strcmp(kind->valuestring, kind_names[j]) == 0) k = j;
    if (k < 0)
        return INVALID(FIELD ".control_input[%d].control[0].kind' of '%s' must be CONTROL_SEQUENCE_START, _READY, "
                       "_END or _CORRID", i, name->valuestring);
    x->kind = (enum model_seq_control_kind)k;
    if (k == MODEL_SEQ_CORRID) {
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(c, "data_type");
        x->dtype = cJSON_IsString(dt) ? dtype_from_config(dt->valuestring) : DT_UNDEFINED;
        if (x->dtype != DT_UINT64 && x->dtype != DT_INT64 && x->dtype != DT_UINT32 && x->dtype != DT_INT32 &&
            x->dtype != DT_STRING)
            return INVALID(FIELD ".control_input[%d].control[0].data_type' of CORRID input '%s' must be TYPE_UINT64, "
                           "TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING", i, name->valuestring);
    } else {
        static const char *const lists[] = {"fp32_false_true", "int32_false_true", "bool_false_true"};
        static const enum dtype types[] = {DT_FP32, DT_INT32, DT_BOOL};
        int found = 0;
        for (int j = 0; j < 3; j++) {
            const cJSON *l = cJSON_GetObjectItemCaseSensitive(c, lists[j]);
            if (!l) continue;
            if (found++ || !cJSON_IsArray(l) || cJSON_GetArraySize(l) != 2)
                return INVALID(FIELD ".control_input[%d].control[0]' of '%s' must have one of fp32_false_true, "
                               "int32_false_true, bool_false_true, holding two values (false, true)", i,
                               name->valuestring);
            for (int v = 0; v < 2; v++) {
                const cJSON *e2 = cJSON_GetArrayItem(l, v);
                if (j == 2 ? !cJSON_IsBool(e2) : !cJSON_IsNumber(e2))
                    return INVALID(FIELD ".control_input[%d].control[0].%s' of '%s' must hold two %s", i, lists[j],
                                   name->valuestring, j == 2 ? "booleans" : "numbers");
                x->value[v] = j == 2 ? (double)cJSON_IsTrue(e2) : e2->valuedouble;
            }
            x->dtype = types[j];
        }
        if (!found)
            return INVALID(FIELD ".control_input[%d].control[0]' of '%s' (%s) must give its false and true values "
                           "(fp32_false_true, int32_false_true or bool_false_true)", i, name->valuestring, kind_names[k]);
    }
    for (int j = 0; j < s->ncontrols; j++) {
        if (strcmp(s->controls[j].input, name->valuestring) == 0)
            return INVALID(FIELD ".control_input' names '%s' twice", name->valuestring);
        if (s->controls[j].kind == x->kind)
            return INVALID(FIELD ".control_input' has two %s controls ('%s' and '%s')", kind_names[k],
                           s->controls[j].input, name->valuestring);
    }
    if (!(x->input = strdup(name->valuestring))) return STATUS_NOMEM;
    s->ncontrols++;
    return 0;
}

static int parse_state(const struct model_config *c, struct model_sequence *s, const cJSON *e, int i, char *err,
                       size_t err_len) {
    if (s->nstates == MODEL_SEQ_MAX_STATES) return INVALID(FIELD ".state' has more than %d states", MODEL_SEQ_MAX_STATES);
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(e, "input_name");
    const cJSON *out = cJSON_GetObjectItemCaseSensitive(e, "output_name");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "data_type");
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(e, "dims");
    if (!cJSON_IsObject(e) || !cJSON_IsString(in) || !*in->valuestring || !cJSON_IsString(out) || !*out->valuestring)
        return INVALID(FIELD ".state[%d]' must have input_name and output_name", i);
    struct model_seq_state *x = &s->states[s->nstates];
    memset(x, 0, sizeof *x);
    x->init_ndim = -1;
    x->dtype = cJSON_IsString(dt) ? dtype_from_config(dt->valuestring) : DT_UNDEFINED;
    if (x->dtype == DT_UNDEFINED)
        return INVALID(FIELD ".state[%d].data_type' of '%s' must be a type such as TYPE_FP32", i, in->valuestring);
    if (!dims || dims_of(dims, x->dims, &x->ndim))
        return INVALID(FIELD ".state[%d].dims' of '%s' must be an array of at most %d integers >= -1", i,
                       in->valuestring, TENSOR_MAX_DIMS);
    const cJSON *init = cJSON_GetObjectItemCaseSensitive(e, "initial_state");
    if (init && (!cJSON_IsArray(init) || cJSON_GetArraySize(init) > 1))
        return INVALID(FIELD ".state[%d].initial_state' of '%s' must be an array of at most one initial state", i,
                       in->valuestring);
    const cJSON *is = init ? cJSON_GetArrayItem(init, 0) : NULL;
    if (is) {
        const cJSON *idt = cJSON_GetObjectItemCaseSensitive(is, "data_type");
        const cJSON *idims = cJSON_GetObjectItemCaseSensitive(is, "dims");
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(is, "data_file");
        const cJSON *zero = cJSON_GetObjectItemCaseSensitive(is, "zero_data");
        if (idt && (!cJSON_IsString(idt) || dtype_from_config(idt->valuestring) != x->dtype))
            return INVALID(FIELD ".state[%d].initial_state[0].data_type' of '%s' must be the state's, %s", i,
                           in->valuestring, dtype_config_name(x->dtype));
        if (!idims || dims_of(idims, x->init_dims, &x->init_ndim))
            return INVALID(FIELD ".state[%d].initial_state[0].dims' of '%s' must be an array of integers", i,
                           in->valuestring);
        for (int d = 0; d < x->init_ndim; d++)
            if (x->init_dims[d] < 0)
                return INVALID(FIELD ".state[%d].initial_state[0].dims' of '%s' must be concrete (no -1)", i,
                               in->valuestring);
        if (!!file == !!(zero && cJSON_IsTrue(zero)))
            return INVALID(FIELD ".state[%d].initial_state[0]' of '%s' must have zero_data true or a data_file", i,
                           in->valuestring);
        if (file) {
            if (!cJSON_IsString(file) || !*file->valuestring || strchr(file->valuestring, '/'))
                return INVALID(FIELD ".state[%d].initial_state[0].data_file' of '%s' must be a file name in the "
                               "model's initial_state/ folder", i, in->valuestring);
            if (!(x->file = strdup(file->valuestring))) return STATUS_NOMEM;
        }
    }
    if (!(x->input = strdup(in->valuestring)) || !(x->output = strdup(out->valuestring))) return STATUS_NOMEM;
    /* Triton sends a state output to clients when the configuration lists it as an output. */
    x->output_listed = model_config_find_output(c, x->output) >= 0;
    s->nstates++;
    for (int j = 0; j < s->nstates - 1; j++)
        if (!strcmp(s->states[j].input, x->input) || !strcmp(s->states[j].output, x->output))
            return INVALID(FIELD ".state' names '%s' twice", strcmp(s->states[j].input, x->input) ? x->output : x->input);
    return 0;
}

/* direct or oldest's fields. */
static int parse_strategy(struct model_sequence *s, const cJSON *o, const char *name, char *err, size_t err_len) {
    int64_t x;
    int r;
    if (!cJSON_IsObject(o)) return INVALID(FIELD ".%s' must be an object", name);
    if ((r = config_get_int(o, "max_queue_delay_microseconds", 0, INT64_MAX / 2, &x)) < 0)
        return INVALID(FIELD ".%s.max_queue_delay_microseconds' must be an integer >= 0", name);
    if (r) s->max_queue_delay_us = (uint64_t)x;
    if (!s->oldest) return 0;
    if ((r = config_get_int(o, "max_candidate_sequences", 0, 1 << 20, &x)) < 0)
        return INVALID(FIELD ".oldest.max_candidate_sequences' must be an integer >= 0");
    if (r) s->max_candidates = (int)x;
    const cJSON *pb = cJSON_GetObjectItemCaseSensitive(o, "preferred_batch_size"), *e;
    if (pb) {
        if (!cJSON_IsArray(pb) || cJSON_GetArraySize(pb) > MODEL_CONFIG_MAX_PREFERRED)
            return INVALID(FIELD ".oldest.preferred_batch_size' must be an array of at most %d sizes",
                           MODEL_CONFIG_MAX_PREFERRED);
        cJSON_ArrayForEach(e, pb) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 1 || e->valuedouble > MODEL_CONFIG_MAX_BATCH_SIZE)
                return INVALID(FIELD ".oldest.preferred_batch_size' must hold integers >= 1");
            s->preferred_batch_size[s->npreferred++] = (int)e->valuedouble;
        }
    }
    const cJSON *po = cJSON_GetObjectItemCaseSensitive(o, "preserve_ordering");
    if (po && !cJSON_IsBool(po)) return INVALID(FIELD ".oldest.preserve_ordering' must be true or false");
    s->preserve_ordering = po && cJSON_IsTrue(po);
    return 0;
}

int model_sequence_parse(struct model_config *c, const cJSON *obj, char *err, size_t err_len) {
    struct model_sequence *s = &c->sequence;
    model_sequence_clear(c);
    if (!cJSON_IsObject(obj)) return INVALID(FIELD "' must be an object");
    s->enable = 1;
    s->max_idle_us = DEFAULT_IDLE_US;
    int64_t x;
    int r = config_get_int(obj, "max_sequence_idle_microseconds", 0, INT64_MAX / 2, &x);
    if (r < 0) return INVALID(FIELD ".max_sequence_idle_microseconds' must be an integer >= 0");
    if (r && x > 0) s->max_idle_us = (uint64_t)x;
    const cJSON *direct = cJSON_GetObjectItemCaseSensitive(obj, "direct");
    const cJSON *oldest = cJSON_GetObjectItemCaseSensitive(obj, "oldest");
    if (direct && oldest) return INVALID(FIELD "' has both direct and oldest: choose one strategy");
    s->oldest = oldest != NULL;
    int rc = 0;
    if (direct || oldest) rc = parse_strategy(s, direct ? direct : oldest, direct ? "direct" : "oldest", err, err_len);
    const cJSON *ci = cJSON_GetObjectItemCaseSensitive(obj, "control_input"), *e;
    if (!rc && ci && !cJSON_IsArray(ci)) rc = INVALID(FIELD ".control_input' must be an array");
    int i = 0;
    if (!rc && ci) cJSON_ArrayForEach(e, ci) if (!rc) rc = parse_control(s, e, i++, err, err_len);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(obj, "state");
    if (!rc && st && !cJSON_IsArray(st)) rc = INVALID(FIELD ".state' must be an array");
    i = 0;
    if (!rc && st) cJSON_ArrayForEach(e, st) if (!rc) rc = parse_state(c, s, e, i++, err, err_len);
    if (rc) {
        model_sequence_clear(c);
        return rc;
    }
    return 0;
}

/* Marks the list entry named name hidden; its index, or -1. */
static int hide(struct model_config_io *io, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(io[i].name, name) == 0) {
            io[i].hidden = 1;
            return i;
        }
    return -1;
}

int model_sequence_complete(struct model_config *c, const struct model_io *inputs, int ninputs,
                            const struct model_io *outputs, int noutputs, char *err, size_t err_len) {
    (void)inputs;
    (void)ninputs;
    (void)outputs;
    (void)noutputs;
    struct model_sequence *s = &c->sequence;
    if (!s->enable) return 0;
    for (int i = 0; i < s->ncontrols; i++) {
        const struct model_seq_control *x = &s->controls[i];
        int k = hide(c->inputs, c->ninputs, x->input);
        if (k < 0) return INVALID(FIELD ".control_input' names '%s' but the model has no such input", x->input);
        enum dtype want = c->inputs[k].dtype;
        if (want != x->dtype)
            return INVALID(FIELD ".control_input' '%s' (%s) gives %s values but the model's input is %s", x->input,
                           kind_names[x->kind], dtype_config_name(x->dtype), dtype_config_name(want));
    }
    for (int i = 0; i < s->nstates; i++) {
        const struct model_seq_state *x = &s->states[i];
        int k = hide(c->inputs, c->ninputs, x->input);
        if (k < 0) return INVALID(FIELD ".state' input_name '%s' is not an input of the model", x->input);
        if (c->inputs[k].dtype != x->dtype)
            return INVALID(FIELD ".state' '%s' is %s but the model's input is %s", x->input,
                           dtype_config_name(x->dtype), dtype_config_name(c->inputs[k].dtype));
        int o = x->output_listed ? model_config_find_output(c, x->output) : hide(c->outputs, c->noutputs, x->output);
        if (o < 0) return INVALID(FIELD ".state' output_name '%s' is not an output of the model", x->output);
        if (c->outputs[o].dtype != x->dtype)
            return INVALID(FIELD ".state' '%s' is %s but the model's output '%s' is %s", x->input,
                           dtype_config_name(x->dtype), x->output, dtype_config_name(c->outputs[o].dtype));
    }
    int visible = 0;
    for (int i = 0; i < c->ninputs; i++) visible += !c->inputs[i].hidden;
    if (!visible) return INVALID(FIELD "' fills every input of the model: a request would have nothing to send");
    if (c->response_cache)
        return INVALID("config field 'response_cache' is on, but a sequence model's answers depend on its state: "
                       "turn one of them off");
    return 0;
}

cJSON *model_sequence_to_json(const struct model_config *c) {
    const struct model_sequence *s = &c->sequence;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "max_sequence_idle_microseconds", (double)s->max_idle_us);
    cJSON *strat = cJSON_AddObjectToObject(o, s->oldest ? "oldest" : "direct");
    cJSON_AddNumberToObject(strat, "max_queue_delay_microseconds", (double)s->max_queue_delay_us);
    if (s->oldest) {
        cJSON_AddNumberToObject(strat, "max_candidate_sequences", s->max_candidates);
        cJSON *pb = cJSON_AddArrayToObject(strat, "preferred_batch_size");
        for (int i = 0; i < s->npreferred; i++) cJSON_AddItemToArray(pb, cJSON_CreateNumber(s->preferred_batch_size[i]));
        cJSON_AddBoolToObject(strat, "preserve_ordering", s->preserve_ordering);
    }
    cJSON *ci = cJSON_AddArrayToObject(o, "control_input");
    for (int i = 0; i < s->ncontrols; i++) {
        const struct model_seq_control *x = &s->controls[i];
        cJSON *e = cJSON_CreateObject(), *ctl = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", x->input);
        cJSON_AddStringToObject(ctl, "kind", kind_names[x->kind]);
        if (x->kind == MODEL_SEQ_CORRID) cJSON_AddStringToObject(ctl, "data_type", dtype_config_name(x->dtype));
        else {
            const char *list = x->dtype == DT_FP32 ? "fp32_false_true" : x->dtype == DT_INT32 ? "int32_false_true"
                                                                                              : "bool_false_true";
            cJSON *l = cJSON_AddArrayToObject(ctl, list);
            for (int v = 0; v < 2; v++)
                cJSON_AddItemToArray(l, x->dtype == DT_BOOL ? cJSON_CreateBool(x->value[v] != 0)
                                                            : cJSON_CreateNumber(x->value[v]));
        }
        cJSON_AddItemToArray(cJSON_AddArrayToObject(e, "control"), ctl);
        cJSON_AddItemToArray(ci, e);
    }
    cJSON *st = cJSON_AddArrayToObject(o, "state");
    for (int i = 0; i < s->nstates; i++) {
        const struct model_seq_state *x = &s->states[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "input_name", x->input);
        cJSON_AddStringToObject(e, "output_name", x->output);
        cJSON_AddStringToObject(e, "data_type", dtype_config_name(x->dtype));
        cJSON *d = cJSON_AddArrayToObject(e, "dims");
        for (int k = 0; k < x->ndim; k++) cJSON_AddItemToArray(d, cJSON_CreateNumber((double)x->dims[k]));
        if (x->init_ndim >= 0) {
            cJSON *is = cJSON_CreateObject();
            cJSON_AddStringToObject(is, "data_type", dtype_config_name(x->dtype));
            cJSON *id = cJSON_AddArrayToObject(is, "dims");
            for (int k = 0; k < x->init_ndim; k++) cJSON_AddItemToArray(id, cJSON_CreateNumber((double)x->init_dims[k]));
            if (x->file) cJSON_AddStringToObject(is, "data_file", x->file);
            else cJSON_AddBoolToObject(is, "zero_data", 1);
            cJSON_AddItemToArray(cJSON_AddArrayToObject(e, "initial_state"), is);
        }
        cJSON_AddItemToArray(st, e);
    }
    return o;
}
