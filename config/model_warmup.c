/* model_warmup.c - the model_warmup field of a model's configuration:
 * parsing, the checks against the model's inputs, and its JSON form.
 *
 * Triton's form:
 *   "model_warmup": [{"name": "s", "batch_size": 8, "count": 2,
 *                     "inputs": {"input_ids": {"data_type": "TYPE_INT64", "dims": [128],
 *                                              "zero_data": true}}}]
 * with one of zero_data, random_data (true) or input_data_file (a file name
 * in the model's warmup/ folder) per input. count 0 means once. Running the
 * samples is the server's (server/warmup.c). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "config/config_json.h"
#include "config/model_config.h"

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)

/* Samples in one configuration, and inputs in one sample. */
#define WARMUP_MAX_SAMPLES 256
#define WARMUP_MAX_COUNT 1000
/* The bytes of every sample's inputs together (batch included): the server
 * builds and fills them on its control thread before the model serves, so
 * dims whose product is unbounded would hold it (and the memory) for
 * minutes. A sample of this size already takes seconds to fill. */
#define WARMUP_MAX_BYTES ((uint64_t)1 << 30)

void model_warmup_clear(struct model_config *c) {
    for (int i = 0; i < c->nwarmup; i++) {
        struct model_warmup *w = &c->warmup[i];
        for (int k = 0; k < w->ninputs; k++) {
            free(w->inputs[k].name);
            free(w->inputs[k].file);
        }
        free(w->inputs);
        free(w->name);
    }
    free(c->warmup);
    c->warmup = NULL;
    c->nwarmup = 0;
}

/* One entry of a sample's "inputs" object; where names the sample. */
static int parse_input(const cJSON *e, struct model_warmup_input *in, const char *where, char *err, size_t err_len) {
    in->name = strdup(e->string);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "data_type");
    if (!cJSON_IsString(dt) || (in->dtype = dtype_from_config(dt->valuestring)) == DT_UNDEFINED)
        return INVALID("%s input '%s': data_type must be a type such as TYPE_FP32", where, e->string);
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(e, "dims"), *d;
    if (!cJSON_IsArray(dims) || cJSON_GetArraySize(dims) > TENSOR_MAX_DIMS)
        return INVALID("%s input '%s': dims must be an array of at most %d integers", where, e->string,
                       TENSOR_MAX_DIMS);
    cJSON_ArrayForEach(d, dims) {
        double v = cJSON_IsNumber(d) ? d->valuedouble : cJSON_IsString(d) ? strtod(d->valuestring, NULL) : -1;
        if (v != (double)(int64_t)v || v < 0 || v > (double)(1LL << 32))
            return INVALID("%s input '%s': dims must hold integers >= 0 (a warmup sample has a concrete shape)",
                           where, e->string);
        in->dims[in->ndim++] = (int64_t)v;
    }
    const cJSON *zero = cJSON_GetObjectItemCaseSensitive(e, "zero_data");
    const cJSON *rnd = cJSON_GetObjectItemCaseSensitive(e, "random_data");
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(e, "input_data_file");
    int given = cJSON_IsTrue(zero) + cJSON_IsTrue(rnd) + (file != NULL);
    if (given != 1)
        return INVALID("%s input '%s': give exactly one of zero_data, random_data (true) or input_data_file", where,
                       e->string);
    if (file) {
        if (!cJSON_IsString(file) || !*file->valuestring || strchr(file->valuestring, '/') ||
            strcmp(file->valuestring, "..") == 0 || strcmp(file->valuestring, ".") == 0)
            return INVALID("%s input '%s': input_data_file must be a file name in the model's warmup folder", where,
                           e->string);
        in->source = WARMUP_FILE;
        in->file = strdup(file->valuestring);
    } else {
        in->source = cJSON_IsTrue(rnd) ? WARMUP_RANDOM : WARMUP_ZERO;
    }
    return in->name && (in->source != WARMUP_FILE || in->file) ? 0 : STATUS_NOMEM;
}

static int parse_sample(const cJSON *e, int index, struct model_warmup *w, char *err, size_t err_len) {
    char where[160];
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    if (!cJSON_IsObject(e) || !cJSON_IsString(name) || !*name->valuestring)
        return INVALID("config field 'model_warmup[%d]' must be an object with a non-empty name", index);
    w->name = strdup(name->valuestring);
    snprintf(where, sizeof where, "config field 'model_warmup[%d]' ('%.64s'):", index, name->valuestring);
    int64_t x;
    int r = config_get_int(e, "batch_size", 1, MODEL_CONFIG_MAX_BATCH_SIZE, &x);
    if (r < 0) return INVALID("%s batch_size must be an integer >= 1", where);
    w->batch_size = r ? (int)x : 1;
    r = config_get_int(e, "count", 0, WARMUP_MAX_COUNT, &x);
    if (r < 0) return INVALID("%s count must be an integer 0-%d", where, WARMUP_MAX_COUNT);
    w->count = r && x > 0 ? (int)x : 1;
    const cJSON *ins = cJSON_GetObjectItemCaseSensitive(e, "inputs"), *in;
    if (!cJSON_IsObject(ins) || cJSON_GetArraySize(ins) == 0)
        return INVALID("%s inputs must be an object naming every input of the model", where);
    w->inputs = calloc((size_t)cJSON_GetArraySize(ins), sizeof *w->inputs);
    if (!w->name || !w->inputs) return STATUS_NOMEM;
    cJSON_ArrayForEach(in, ins) {
        if (!cJSON_IsObject(in)) return INVALID("%s input '%s' must be an object", where, in->string);
        int rc = parse_input(in, &w->inputs[w->ninputs++], where, err, err_len);
        if (rc) return rc;
    }
    return 0;
}

int model_warmup_parse(struct model_config *c, const cJSON *arr, char *err, size_t err_len) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) > WARMUP_MAX_SAMPLES)
        return INVALID("config field 'model_warmup' must be an array of at most %d samples", WARMUP_MAX_SAMPLES);
    model_warmup_clear(c);
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return 0;
    c->warmup = calloc((size_t)n, sizeof *c->warmup);
    if (!c->warmup) return STATUS_NOMEM;
    const cJSON *e;
    int rc = 0;
    cJSON_ArrayForEach(e, arr) {
        rc = parse_sample(e, c->nwarmup, &c->warmup[c->nwarmup], err, err_len);
        c->nwarmup++;
        if (rc) break;
    }
    if (rc) model_warmup_clear(c);
    return rc;
}

/* One sample input against the model's input io (dims without the batch dim
 * when the model batches). */
static int check_input(const struct model_warmup_input *in, const struct model_config_io *io, const char *where,
                       char *err, size_t err_len) {
    if (io->dtype != DT_UNDEFINED && in->dtype != io->dtype)
        return INVALID("%s input '%s' is %s but the model's is %s", where, in->name, dtype_config_name(in->dtype),
                       dtype_config_name(io->dtype));
    if (io->ndim >= 0 && in->ndim != io->ndim)
        return INVALID("%s input '%s' has %d dims but the model's has %d%s", where, in->name, in->ndim, io->ndim,
                       " (without the batch dim when max_batch_size > 0)");
    for (int d = 0; io->ndim >= 0 && d < in->ndim; d++)
        if (io->dims[d] >= 0 && io->dims[d] != in->dims[d])
            return INVALID("%s input '%s': dim %d is %lld but the model's is %lld", where, in->name, d,
                           (long long)in->dims[d], (long long)io->dims[d]);
    return 0;
}

/* The bytes a sample's inputs take (a string element counted as 32), at
 * most limit + 1 (no overflow, whatever the dims). */
static uint64_t sample_bytes(const struct model_warmup *w, uint64_t limit) {
    uint64_t total = 0;
    for (int k = 0; k < w->ninputs; k++) {
        const struct model_warmup_input *in = &w->inputs[k];
        uint64_t n = (uint64_t)w->batch_size * (in->dtype == DT_STRING ? 32 : dtype_size(in->dtype));
        for (int d = 0; d < in->ndim && n; d++)
            n = in->dims[d] && n > limit / (uint64_t)in->dims[d] ? limit + 1 : n * (uint64_t)in->dims[d];
        total = n > limit - total ? limit + 1 : total + n;
        if (total > limit) break;
    }
    return total;
}

int model_warmup_check(const struct model_config *c, char *err, size_t err_len) {
    uint64_t total = 0;
    for (int i = 0; i < c->nwarmup; i++) {
        const struct model_warmup *w = &c->warmup[i];
        char where[160];
        snprintf(where, sizeof where, "config field 'model_warmup[%d]' ('%.64s'):", i, w->name);
        if (c->max_batch_size == 0 && w->batch_size != 1)
            return INVALID("%s batch_size must be 1: the model does not batch (max_batch_size 0)", where);
        if (c->max_batch_size > 0 && w->batch_size > c->max_batch_size)
            return INVALID("%s batch_size %d is over max_batch_size (%d)", where, w->batch_size, c->max_batch_size);
        for (int k = 0; k < w->ninputs; k++) {
            int at = model_config_find_input(c, w->inputs[k].name);
            if (at < 0) return INVALID("%s the model has no input '%s'", where, w->inputs[k].name);
            int rc = check_input(&w->inputs[k], &c->inputs[at], where, err, err_len);
            if (rc) return rc;
        }
        for (int k = 0; k < c->ninputs; k++) {
            int named = 0;
            for (int j = 0; j < w->ninputs; j++) named += strcmp(w->inputs[j].name, c->inputs[k].name) == 0;
            if (named != 1)
                return INVALID("%s input '%s' of the model is %s", where, c->inputs[k].name,
                               named ? "named more than once" : "not given");
        }
        uint64_t n = sample_bytes(w, WARMUP_MAX_BYTES - total);
        if (n > WARMUP_MAX_BYTES - total)
            return INVALID("%s its inputs (dims times batch_size %d) bring the samples' inputs over %llu bytes, the "
                           "most a warm-up may build", where, w->batch_size, (unsigned long long)WARMUP_MAX_BYTES);
        total += n;
    }
    return 0;
}

cJSON *model_warmup_to_json(const struct model_config *c) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < c->nwarmup; i++) {
        const struct model_warmup *w = &c->warmup[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", w->name);
        cJSON_AddNumberToObject(o, "batch_size", w->batch_size);
        cJSON_AddNumberToObject(o, "count", w->count);
        cJSON *ins = cJSON_AddObjectToObject(o, "inputs");
        for (int k = 0; k < w->ninputs; k++) {
            const struct model_warmup_input *in = &w->inputs[k];
            cJSON *x = cJSON_AddObjectToObject(ins, in->name);
            cJSON_AddStringToObject(x, "data_type", dtype_config_name(in->dtype));
            cJSON *dims = cJSON_AddArrayToObject(x, "dims");
            for (int d = 0; d < in->ndim; d++) cJSON_AddItemToArray(dims, cJSON_CreateNumber((double)in->dims[d]));
            if (in->source == WARMUP_FILE) cJSON_AddStringToObject(x, "input_data_file", in->file);
            else cJSON_AddBoolToObject(x, in->source == WARMUP_RANDOM ? "random_data" : "zero_data", 1);
        }
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}
