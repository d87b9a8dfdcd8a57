/* model_padding.c - kiln's sequence_padding field (config/model_config.h):
 *
 *   "sequence_padding": {"enable": true,
 *     "inputs":  [{"name": "input_ids", "axis": 1, "value": 0}, ...],
 *     "outputs": [{"name": "last_hidden_state", "axis": 1, "input": "input_ids", "input_axis": 1}],
 *     "buckets": [16, 32, 64, 128], "max_length": 512, "warmup": true}
 *
 * Everything but enable may be left out: the inputs and outputs are then
 * proposed from the ONNX file's symbolic dim names (an input axis whose name
 * another input shares, or that names a sequence: seq, len, token, time,
 * frame; an output axis of the same name follows it), the buckets are the
 * powers of two from 8 up to max_length, and warmup is on. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/model_io.h"
#include "common/status.h"
#include "config/model_config.h"

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)
#define FIELD "config field 'sequence_padding"
#define DEFAULT_MAX_LENGTH 512
#define FIRST_BUCKET 8

void model_padding_clear(struct model_config *c) {
    struct model_padding *p = &c->padding;
    for (int i = 0; i < p->ninputs; i++) free(p->inputs[i].name);
    for (int i = 0; i < p->noutputs; i++) {
        free(p->outputs[i].name);
        free(p->outputs[i].input);
    }
    memset(p, 0, sizeof *p);
}

static int int_of(const cJSON *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble || v->valuedouble < (double)lo ||
        v->valuedouble > (double)hi)
        return -1;
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int parse_inputs(struct model_padding *p, const cJSON *arr, char *err, size_t err_len) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) > MODEL_PAD_MAX)
        return INVALID(FIELD ".inputs' must be an array of at most %d inputs", MODEL_PAD_MAX);
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        struct model_pad_input *in = &p->inputs[p->ninputs];
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *value = cJSON_GetObjectItemCaseSensitive(e, "value");
        int64_t axis;
        if (!cJSON_IsString(name) || !*name->valuestring ||
            int_of(cJSON_GetObjectItemCaseSensitive(e, "axis"), 1, TENSOR_MAX_DIMS - 1, &axis) ||
            (value && !cJSON_IsNumber(value)))
            return INVALID(FIELD ".inputs[%d]' must be {\"name\": \"...\", \"axis\": 1-%d, \"value\": a number}",
                           p->ninputs, TENSOR_MAX_DIMS - 1);
        in->name = strdup(name->valuestring);
        in->axis = (int)axis;
        in->value = value ? value->valuedouble : 0;
        p->ninputs++;
        if (!in->name) return STATUS_NOMEM;
    }
    return 0;
}

static int parse_outputs(struct model_padding *p, const cJSON *arr, char *err, size_t err_len) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) > MODEL_PAD_MAX)
        return INVALID(FIELD ".outputs' must be an array of at most %d outputs", MODEL_PAD_MAX);
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        struct model_pad_output *o = &p->outputs[p->noutputs];
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *input = cJSON_GetObjectItemCaseSensitive(e, "input");
        int64_t axis, in_axis;
        if (!cJSON_IsString(name) || !*name->valuestring || !cJSON_IsString(input) || !*input->valuestring ||
            int_of(cJSON_GetObjectItemCaseSensitive(e, "axis"), 1, TENSOR_MAX_DIMS - 1, &axis) ||
            int_of(cJSON_GetObjectItemCaseSensitive(e, "input_axis"), 1, TENSOR_MAX_DIMS - 1, &in_axis))
            return INVALID(FIELD ".outputs[%d]' must be {\"name\": \"...\", \"axis\": N, \"input\": \"...\", "
                           "\"input_axis\": N} (axes from 1: 0 is the batch)", p->noutputs);
        o->name = strdup(name->valuestring);
        o->input = strdup(input->valuestring);
        o->axis = (int)axis;
        o->input_axis = (int)in_axis;
        p->noutputs++;
        if (!o->name || !o->input) return STATUS_NOMEM;
    }
    return 0;
}

static int parse_buckets(struct model_padding *p, const cJSON *arr, char *err, size_t err_len) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) < 1 || cJSON_GetArraySize(arr) > MODEL_PAD_MAX_BUCKETS)
        return INVALID(FIELD ".buckets' must be an array of 1 to %d lengths", MODEL_PAD_MAX_BUCKETS);
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        int64_t len;
        if (int_of(e, 1, (int64_t)1 << 32, &len) || (p->nbuckets && len <= p->buckets[p->nbuckets - 1]))
            return INVALID(FIELD ".buckets' must hold increasing lengths >= 1");
        p->buckets[p->nbuckets++] = len;
    }
    return 0;
}

int model_padding_parse(struct model_config *c, const cJSON *obj, char *err, size_t err_len) {
    struct model_padding *p = &c->padding;
    model_padding_clear(c);
    if (!cJSON_IsObject(obj)) return INVALID(FIELD "' must be an object");
    p->given = 1;
    p->warmup = 1;
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(obj, "enable")) && !cJSON_IsBool(v))
        return INVALID(FIELD ".enable' must be true or false");
    p->enable = cJSON_IsTrue(v);
    if ((v = cJSON_GetObjectItemCaseSensitive(obj, "warmup")) && !cJSON_IsBool(v))
        return INVALID(FIELD ".warmup' must be true or false");
    if (v) p->warmup = cJSON_IsTrue(v);
    if ((v = cJSON_GetObjectItemCaseSensitive(obj, "max_length")) && int_of(v, 1, (int64_t)1 << 32, &p->max_length))
        return INVALID(FIELD ".max_length' must be an integer >= 1");
    int rc = 0;
    if ((v = cJSON_GetObjectItemCaseSensitive(obj, "inputs"))) rc = parse_inputs(p, v, err, err_len);
    if (!rc && (v = cJSON_GetObjectItemCaseSensitive(obj, "outputs"))) rc = parse_outputs(p, v, err, err_len);
    if (!rc && (v = cJSON_GetObjectItemCaseSensitive(obj, "buckets"))) rc = parse_buckets(p, v, err, err_len);
    return rc;
}

/* ---- the proposal ---------------------------------------------------------- */

static int names_a_sequence(const char *name) {
    static const char *const words[] = {"seq", "len", "token", "time", "frame"};
    char low[64];
    size_t n = 0;
    for (; name[n] && n < sizeof low - 1; n++) low[n] = (char)tolower((unsigned char)name[n]);
    low[n] = 0;
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strstr(low, words[i])) return 1;
    return 0;
}

/* 1 if axis d of inputs[i] is a variable dim whose name another input
 * shares or that names a sequence. */
static int proposed_axis(const struct model_io *inputs, int ninputs, int i, int d) {
    const char *name = inputs[i].dim_param[d];
    if (inputs[i].dims[d] != -1 || !name || !*name) return 0;
    if (names_a_sequence(name)) return 1;
    for (int j = 0; j < ninputs; j++)
        for (int e = 1; j != i && e < inputs[j].ndim; e++)
            if (inputs[j].dim_param[e] && strcmp(inputs[j].dim_param[e], name) == 0) return 1;
    return 0;
}

static int propose(struct model_padding *p, const struct model_io *inputs, int ninputs,
                   const struct model_io *outputs, int noutputs) {
    for (int i = 0; i < ninputs; i++) {
        if (inputs[i].dtype == DT_STRING) continue;
        for (int d = 1; d < inputs[i].ndim && p->ninputs < MODEL_PAD_MAX; d++) {
            if (!proposed_axis(inputs, ninputs, i, d)) continue;
            p->inputs[p->ninputs] = (struct model_pad_input){.name = strdup(inputs[i].name), .axis = d};
            if (!p->inputs[p->ninputs++].name) return STATUS_NOMEM;
        }
    }
    for (int o = 0; o < noutputs; o++)
        for (int d = 1; d < outputs[o].ndim && p->noutputs < MODEL_PAD_MAX; d++) {
            const char *name = outputs[o].dim_param[d];
            for (int k = 0; name && k < p->ninputs; k++) {
                int i = 0;
                while (strcmp(inputs[i].name, p->inputs[k].name)) i++;
                const char *in_name = inputs[i].dim_param[p->inputs[k].axis];
                if (strcmp(in_name, name)) continue;
                p->outputs[p->noutputs] = (struct model_pad_output){
                    .name = strdup(outputs[o].name), .axis = d, .input = strdup(inputs[i].name),
                    .input_axis = p->inputs[k].axis};
                if (!p->outputs[p->noutputs].name || !p->outputs[p->noutputs].input) return STATUS_NOMEM;
                p->noutputs++;
                break;
            }
        }
    return 0;
}

/* ---- the checks ------------------------------------------------------------- */

static const struct model_io *find_io(const struct model_io *io, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(io[i].name, name) == 0) return &io[i];
    return NULL;
}

static int check(const struct model_config *c, const struct model_io *inputs, int ninputs,
                 const struct model_io *outputs, int noutputs, char *err, size_t err_len) {
    const struct model_padding *p = &c->padding;
    if (c->max_batch_size < 1)
        return INVALID(FIELD "' pads requests into batches: the model must batch (max_batch_size > 0)");
    if (p->ninputs == 0)
        return INVALID(FIELD ".inputs' is empty and no input has a symbolic dim to propose: name the inputs and "
                       "axes to pad");
    for (int k = 0; k < p->ninputs; k++) {
        const struct model_pad_input *in = &p->inputs[k];
        const struct model_io *io = find_io(inputs, ninputs, in->name);
        if (!io) return INVALID(FIELD ".inputs[%d]': the model has no input '%s'", k, in->name);
        if (io->dtype == DT_STRING) return INVALID(FIELD ".inputs[%d]': string input '%s' cannot be padded", k, in->name);
        if (io->ndim >= 0 && (in->axis >= io->ndim || io->dims[in->axis] != -1))
            return INVALID(FIELD ".inputs[%d]': axis %d of input '%s' is not a variable dim", k, in->axis, in->name);
        for (int j = 0; j < k; j++)
            if (strcmp(p->inputs[j].name, in->name) == 0)
                return INVALID(FIELD ".inputs': input '%s' is named twice (one padded axis per input)", in->name);
    }
    for (int k = 0; k < p->noutputs; k++) {
        const struct model_pad_output *o = &p->outputs[k];
        const struct model_io *io = find_io(outputs, noutputs, o->name);
        if (!io) return INVALID(FIELD ".outputs[%d]': the model has no output '%s'", k, o->name);
        if (io->ndim >= 0 && o->axis >= io->ndim)
            return INVALID(FIELD ".outputs[%d]': output '%s' has no axis %d", k, o->name, o->axis);
        if (io->ndim >= 0 && io->dims[o->axis] != -1)
            return INVALID(FIELD ".outputs[%d]': axis %d of output '%s' is not a variable dim", k, o->axis, o->name);
        int found = 0;
        for (int j = 0; j < p->ninputs; j++)
            found |= strcmp(p->inputs[j].name, o->input) == 0 && p->inputs[j].axis == o->input_axis;
        if (!found)
            return INVALID(FIELD ".outputs[%d]': axis %d of input '%s' is not a padded axis", k, o->input_axis,
                           o->input);
        for (int j = 0; j < k; j++)
            if (strcmp(p->outputs[j].name, o->name) == 0)
                return INVALID(FIELD ".outputs': output '%s' is named twice", o->name);
    }
    return 0;
}

int model_padding_complete(struct model_config *c, const struct model_io *inputs, int ninputs,
                           const struct model_io *outputs, int noutputs, char *err, size_t err_len) {
    struct model_padding *p = &c->padding;
    if (!p->given) p->warmup = 1;
    if (!p->max_length) p->max_length = DEFAULT_MAX_LENGTH;
    if (!p->nbuckets) {
        for (int64_t len = FIRST_BUCKET; p->nbuckets < MODEL_PAD_MAX_BUCKETS; len *= 2) {
            p->buckets[p->nbuckets++] = len < p->max_length ? len : p->max_length;
            if (len >= p->max_length) break;
        }
    }
    /* The proposal: inputs (and outputs) from the file when none are named. */
    if (!p->ninputs && c->max_batch_size > 0) {
        int rc = propose(p, inputs, ninputs, outputs, noutputs);
        if (rc) return rc;
    }
    return p->enable ? check(c, inputs, ninputs, outputs, noutputs, err, err_len) : 0;
}

cJSON *model_padding_to_json(const struct model_config *c) {
    const struct model_padding *p = &c->padding;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "enable", p->enable);
    cJSON *ins = cJSON_AddArrayToObject(o, "inputs");
    for (int i = 0; i < p->ninputs; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", p->inputs[i].name);
        cJSON_AddNumberToObject(x, "axis", p->inputs[i].axis);
        cJSON_AddNumberToObject(x, "value", p->inputs[i].value);
        cJSON_AddItemToArray(ins, x);
    }
    cJSON *outs = cJSON_AddArrayToObject(o, "outputs");
    for (int i = 0; i < p->noutputs; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", p->outputs[i].name);
        cJSON_AddNumberToObject(x, "axis", p->outputs[i].axis);
        cJSON_AddStringToObject(x, "input", p->outputs[i].input);
        cJSON_AddNumberToObject(x, "input_axis", p->outputs[i].input_axis);
        cJSON_AddItemToArray(outs, x);
    }
    cJSON *b = cJSON_AddArrayToObject(o, "buckets");
    for (int i = 0; i < p->nbuckets; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((double)p->buckets[i]));
    cJSON_AddNumberToObject(o, "max_length", (double)p->max_length);
    cJSON_AddBoolToObject(o, "warmup", p->warmup);
    return o;
}
