/* model_embedding.c - a model served as text embeddings (OpenAI's
 * /v1/embeddings, server/openai.h), from Triton's free-form parameters, so
 * that config.json and config.pbtxt say it the same way:
 *
 *   parameters: { key: "embedding_output"    value: { string_value: "last_hidden_state" } }
 *   parameters: { key: "embedding_pooling"   value: { string_value: "mean" } }   # mean, cls, last, none
 *   parameters: { key: "embedding_normalize" value: { string_value: "true" } }
 *   parameters: { key: "embedding_dimensions" value: { string_value: "truncate" } }
 *   parameters: { key: "tokenizer_file"      value: { string_value: "tokenizer.json" } }
 *   parameters: { key: "max_length"          value: { string_value: "256" } }
 *
 * embedding_output alone exposes the model: its text is tokenized by the
 * tokenizer.json in the model's folder, and fed as input_ids (with
 * attention_mask and token_type_ids where the model has them). An output of
 * one vector per text ([H] after the batch dim) is the embedding as it is
 * (pooling none); one of a vector per token ([T, H]) is pooled: the mean
 * over the text's tokens by default (sentence-transformers' default), or the
 * first token's (CLS) or the last token's. The vector is L2-normalised
 * unless embedding_normalize is false. embedding_dimensions "truncate" lets
 * a request ask for fewer dimensions (Matryoshka-trained models): the
 * vector is cut, then normalised again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "config/model_config.h"

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)

void model_embedding_clear(struct model_config *c) {
    free(c->embedding.output);
    free(c->embedding.tokenizer_file);
    memset(&c->embedding, 0, sizeof c->embedding);
}

/* parameters.<key>.string_value, or NULL; -1 when the key is there in another form. */
static int param(const cJSON *params, const char *key, const char **out) {
    *out = NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(params, key);
    if (!t) return 0;
    const cJSON *sv = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, "string_value") : NULL;
    if (!cJSON_IsString(sv)) return -1;
    *out = sv->valuestring;
    return 0;
}

static const char *const pool_names[] = {"auto", "none", "mean", "cls", "last"};

const char *model_embedding_pooling_name(enum model_pooling p) {
    return (unsigned)p < sizeof pool_names / sizeof pool_names[0] ? pool_names[p] : "?";
}

int model_embedding_parse(struct model_config *c, const cJSON *params, char *err, size_t err_len) {
    static const char *const keys[] = {"embedding_output", "embedding_pooling", "embedding_normalize",
                                       "embedding_dimensions", "tokenizer_file", "max_length"};
    const char *v[6];
    for (int i = 0; i < 6; i++)
        if (param(params, keys[i], &v[i]))
            return INVALID("config field 'parameters.%s' must be {\"string_value\": \"...\"}", keys[i]);
    struct model_embedding *e = &c->embedding;
    if (!v[0]) {
        /* max_length is a tokenizer model's own key too (backend
         * "tokenizer"), and on any other model Triton's free-form
         * parameter, ignored. */
        for (int i = 1; i < 5; i++)
            if (v[i])
                return INVALID("config field 'parameters.%s' needs 'parameters.embedding_output' (the output that "
                               "holds the embedding)", keys[i]);
        return 0;
    }
    if (!*v[0]) return INVALID("config field 'parameters.embedding_output' must name an output");
    e->enabled = 1;
    e->normalize = 1;
    e->output = strdup(v[0]);
    e->tokenizer_file = strdup(v[4] ? v[4] : "tokenizer.json");
    if (!e->output || !e->tokenizer_file) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    if (v[4] && (!*v[4] || strchr(v[4], '/') || strcmp(v[4], ".") == 0 || strcmp(v[4], "..") == 0))
        return INVALID("config field 'parameters.tokenizer_file' must be a file name in the model's folder (no '/'), "
                       "got '%s'", v[4]);
    if (v[1]) {
        int found = 0;
        for (int p = MODEL_POOL_NONE; p <= MODEL_POOL_LAST; p++)
            if (strcmp(v[1], pool_names[p]) == 0) e->pooling = (enum model_pooling)p, found = 1;
        if (!found)
            return INVALID("config field 'parameters.embedding_pooling' must be mean, cls, last or none, got '%s'", v[1]);
    }
    if (v[2]) {
        if (strcmp(v[2], "true") == 0) e->normalize = 1;
        else if (strcmp(v[2], "false") == 0) e->normalize = 0;
        else return INVALID("config field 'parameters.embedding_normalize' must be true or false, got '%s'", v[2]);
    }
    if (v[3]) {
        if (strcmp(v[3], "truncate") == 0) e->truncate_dims = 1;
        else if (strcmp(v[3], "fixed") == 0) e->truncate_dims = 0;
        else return INVALID("config field 'parameters.embedding_dimensions' must be truncate or fixed, got '%s'", v[3]);
    }
    if (v[5]) {
        char *end = NULL;
        long long n = strtoll(v[5], &end, 10);
        if (end == v[5] || *end || n < 1 || n > (1 << 20))
            return INVALID("config field 'parameters.max_length' must be an integer 1-1048576, got '%s'", v[5]);
        e->max_tokens = n;
    }
    return 0;
}

/* The model's input with this name, or -1. */
static int input_named(const struct model_config *c, const char *name) { return model_config_find_input(c, name); }

int model_embedding_check(struct model_config *c, char *err, size_t err_len) {
    struct model_embedding *e = &c->embedding;
    if (!e->enabled) return 0;
    int o = model_config_find_output(c, e->output);
    if (o < 0)
        return INVALID("config field 'parameters.embedding_output': the model has no output '%s'", e->output);
    const struct model_config_io *out = &c->outputs[o];
    if (out->dtype != DT_FP32 && out->dtype != DT_FP16 && out->dtype != DT_BF16 && out->dtype != DT_FP64)
        return INVALID("config field 'parameters.embedding_output': output '%s' is %s; an embedding is floating point",
                       e->output, dtype_name(out->dtype));
    /* The output's dims after one text's batch row: [H] or [T, H]. */
    int rank = out->ndim - (c->max_batch_size > 0 ? 0 : 1);
    if (out->ndim >= 0 && rank != 1 && rank != 2)
        return INVALID("config field 'parameters.embedding_output': output '%s' has %d dims per text; an embedding "
                       "output has one ([hidden]) or two ([tokens, hidden])", e->output, rank);
    if (e->pooling == MODEL_POOL_AUTO) e->pooling = rank == 1 ? MODEL_POOL_NONE : MODEL_POOL_MEAN;
    if (rank == 1 && e->pooling != MODEL_POOL_NONE)
        return INVALID("config field 'parameters.embedding_pooling' is %s, but output '%s' has one vector per text "
                       "already: pooling none", model_embedding_pooling_name(e->pooling), e->output);
    if (rank == 2 && e->pooling == MODEL_POOL_NONE)
        return INVALID("config field 'parameters.embedding_pooling' is none, but output '%s' has a vector per token: "
                       "mean, cls or last", e->output);
    e->output_index = o;
    e->ids = input_named(c, "input_ids");
    e->mask = input_named(c, "attention_mask");
    e->types = input_named(c, "token_type_ids");
    if (e->ids < 0)
        return INVALID("parameters.embedding_output: the model has no input 'input_ids' for the text's tokens "
                       "(its inputs must be named as Hugging Face's: input_ids, attention_mask, token_type_ids)");
    for (int i = 0; i < c->ninputs; i++) {
        const struct model_config_io *in = &c->inputs[i];
        if (i == e->ids || i == e->mask || i == e->types) {
            if (in->dtype != DT_INT64 && in->dtype != DT_INT32)
                return INVALID("parameters.embedding_output: input '%s' is %s; token inputs are INT64 or INT32",
                               in->name, dtype_name(in->dtype));
            int r = in->ndim - (c->max_batch_size > 0 ? 0 : 1);
            if (in->ndim >= 0 && r != 1)
                return INVALID("parameters.embedding_output: input '%s' has %d dims per text; token inputs have "
                               "one ([tokens])", in->name, r);
            continue;
        }
        if (!in->optional)
            return INVALID("parameters.embedding_output: input '%s' is neither input_ids, attention_mask nor "
                           "token_type_ids, and not optional: kiln would have nothing to give it", in->name);
    }
    return 0;
}

void model_embedding_to_json(const struct model_config *c, cJSON *params) {
    const struct model_embedding *e = &c->embedding;
    if (!e->enabled) return;
    char n[24];
    cJSON_AddStringToObject(cJSON_AddObjectToObject(params, "embedding_output"), "string_value", e->output);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(params, "embedding_pooling"), "string_value",
                            model_embedding_pooling_name(e->pooling));
    cJSON_AddStringToObject(cJSON_AddObjectToObject(params, "embedding_normalize"), "string_value",
                            e->normalize ? "true" : "false");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(params, "embedding_dimensions"), "string_value",
                            e->truncate_dims ? "truncate" : "fixed");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(params, "tokenizer_file"), "string_value", e->tokenizer_file);
    if (e->max_tokens) {
        snprintf(n, sizeof n, "%lld", (long long)e->max_tokens);
        cJSON_AddStringToObject(cJSON_AddObjectToObject(params, "max_length"), "string_value", n);
    }
}
