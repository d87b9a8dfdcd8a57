#include "config/model_config.h"

#include <errno.h>
#include <strings.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/file.h"
#include "common/model_io.h"
#include "common/status.h"
#include "config/config_json.h"
#include "config/model_fields.h"
#include "config/pbtxt.h"

void model_config_init(struct model_config *c, const char *name) {
    memset(c, 0, sizeof *c);
    c->name = strdup(name ? name : "");
    c->platform = strdup("onnxruntime_onnx");
    c->version_policy = MODEL_VERSIONS_LATEST;
    c->num_versions = 1;
    c->instance_count = 1;
    c->instance_kind = strdup("KIND_AUTO");
    c->default_priority_level = 0;
    c->cuda_graphs = 1;
}

static void io_clear(struct model_config_io *io, int n) {
    for (int i = 0; i < n; i++) {
        free(io[i].name);
        free(io[i].label_filename);
        for (int j = 0; j < io[i].nlabels; j++) free(io[i].labels[j]);
        free(io[i].labels);
    }
    free(io);
}

void model_config_clear(struct model_config *c) {
    if (!c) return;
    free(c->name);
    free(c->platform);
    free(c->instance_kind);
    io_clear(c->inputs, c->ninputs);
    io_clear(c->outputs, c->noutputs);
    model_warmup_clear(c);
    model_padding_clear(c);
    model_embedding_clear(c);
    model_ensemble_clear(c);
    model_sequence_clear(c);
    free(c->warnings);
    memset(c, 0, sizeof *c);
}

/* ---- parsing ------------------------------------------------------------ */

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)

int config_get_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return 0;
    double d;
    if (cJSON_IsNumber(v)) d = v->valuedouble;
    else if (cJSON_IsString(v)) {
        char *end;
        errno = 0;
        long long x = strtoll(v->valuestring, &end, 10);
        if (errno || end == v->valuestring || *end) return -1;
        d = (double)x;
    } else return -1;
    if (d != (double)(int64_t)d || d < (double)lo || d > (double)hi) return -1;
    *out = (int64_t)d;
    return 1;
}

static int get_bool(const cJSON *obj, const char *key, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return -1;
    *out = cJSON_IsTrue(v);
    return 1;
}

/* Elements in a shape, or -1 when a dim is -1. */
static int64_t shape_count(const int64_t *dims, int ndim) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (dims[d] < 0) return -1;
        n *= dims[d];
    }
    return n;
}

static int count_any(const int64_t *dims, int ndim) {
    int n = 0;
    for (int d = 0; d < ndim; d++) n += dims[d] < 0;
    return n;
}

int model_config_fit_shape(const int64_t *dims, int ndim, int64_t count, int64_t *out) {
    int64_t known = 1;
    int any = -1;
    for (int d = 0; d < ndim; d++) {
        out[d] = dims[d];
        if (dims[d] < 0) {
            if (any >= 0) return -1;
            any = d;
        } else known *= dims[d];
    }
    if (any < 0) return known == count ? 0 : -1;
    if (known == 0 ? count != 0 : count % known) return -1;
    out[any] = known ? count / known : 0;
    return 0;
}

int model_config_reshape(struct tensor *t, int skip, const int64_t *shape, int ndim) {
    int64_t per = 1;
    for (int d = skip; d < t->ndim; d++) per *= t->dims[d];
    int64_t dims[TENSOR_MAX_DIMS];
    if (skip + ndim > TENSOR_MAX_DIMS || model_config_fit_shape(shape, ndim, per, dims + skip)) return -1;
    if (skip) dims[0] = t->dims[0];
    t->ndim = skip + ndim;
    memcpy(t->dims, dims, (size_t)t->ndim * sizeof *dims);
    return 0;
}

/* An array of dims (integers >= -1, JSON numbers or, as protobuf's JSON
 * writes int64, strings) into out; field names it in messages. */
static int parse_dims(const cJSON *arr, const char *what, int i, const char *name, const char *field, int64_t *out,
                      int *nout, char *err, size_t err_len) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) > TENSOR_MAX_DIMS)
        return INVALID("config field '%s[%d].%s' of '%s' must be an array of at most %d integers", what, i, field,
                       name, TENSOR_MAX_DIMS);
    int n = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, arr) {
        double v = cJSON_IsNumber(d) ? d->valuedouble : cJSON_IsString(d) ? strtod(d->valuestring, NULL) : -2;
        if (v != (double)(int64_t)v || v < -1 || v > (double)(1LL << 40))
            return INVALID("config field '%s[%d].%s' of '%s' must hold integers >= -1", what, i, field, name);
        out[n++] = (int64_t)v;
    }
    *nout = n;
    return 0;
}

static int parse_io(const cJSON *arr, const char *what, struct model_config_io **out, int *nout,
                    char *err, size_t err_len) {
    if (!cJSON_IsArray(arr)) return INVALID("config field '%s' must be an array", what);
    int n = cJSON_GetArraySize(arr);
    struct model_config_io *io = calloc((size_t)(n ? n : 1), sizeof *io);
    if (!io) return STATUS_NOMEM;
    int i = 0, rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        struct model_config_io *x = &io[i++];
        x->ndim = -1;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (!cJSON_IsString(name) || !*name->valuestring) {
            rc = INVALID("config field '%s[%d].name' must be a non-empty string", what, i - 1);
            break;
        }
        x->name = strdup(name->valuestring);
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "data_type");
        if (dt) {
            if (!cJSON_IsString(dt) || (x->dtype = dtype_from_config(dt->valuestring)) == DT_UNDEFINED) {
                rc = INVALID("config field '%s[%d].data_type' of '%s' must be a type such as TYPE_FP32",
                             what, i - 1, x->name);
                break;
            }
        }
        const cJSON *dims = cJSON_GetObjectItemCaseSensitive(e, "dims");
        if (dims && (rc = parse_dims(dims, what, i - 1, x->name, "dims", x->dims, &x->ndim, err, err_len))) break;
        x->reshape_ndim = -1;
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(e, "reshape");
        if (rs) {
            /* protobuf's JSON drops an empty shape: {} is shape []. */
            const cJSON *sh = cJSON_IsObject(rs) ? cJSON_GetObjectItemCaseSensitive(rs, "shape") : NULL;
            if (!cJSON_IsObject(rs)) {
                rc = INVALID("config field '%s[%d].reshape' of '%s' must be {\"shape\": [...]}", what, i - 1, x->name);
                break;
            }
            x->reshape_ndim = 0;
            if (sh && (rc = parse_dims(sh, what, i - 1, x->name, "reshape.shape", x->reshape, &x->reshape_ndim, err,
                                       err_len)))
                break;
            if (!dims) {
                rc = INVALID("config field '%s[%d].reshape' of '%s' needs dims (the shape clients use)", what, i - 1,
                             x->name);
                break;
            }
            if (count_any(x->dims, x->ndim) > 1 || count_any(x->reshape, x->reshape_ndim) > 1) {
                rc = INVALID("config field '%s[%d]' of '%s': with reshape, dims and reshape.shape may each hold at "
                             "most one -1", what, i - 1, x->name);
                break;
            }
            int64_t a = shape_count(x->dims, x->ndim), b = shape_count(x->reshape, x->reshape_ndim);
            if (a > 0 && b > 0 && a != b) {
                rc = INVALID("config field '%s[%d].reshape' of '%s': shape holds %lld elements but dims %lld", what,
                             i - 1, x->name, (long long)b, (long long)a);
                break;
            }
        }
        if (get_bool(e, "optional", &x->optional) < 0) {
            rc = INVALID("config field '%s[%d].optional' of '%s' must be true or false", what, i - 1, x->name);
            break;
        }
        const cJSON *lf = cJSON_GetObjectItemCaseSensitive(e, "label_filename");
        if (cJSON_IsString(lf) && *lf->valuestring) {
            if (strchr(lf->valuestring, '/')) {
                rc = INVALID("config field '%s[%d].label_filename' must be a file name in the model's folder", what, i - 1);
                break;
            }
            x->label_filename = strdup(lf->valuestring);
        }
    }
    for (int a = 0; !rc && a < i; a++)
        for (int b = a + 1; b < i; b++)
            if (strcmp(io[a].name, io[b].name) == 0) rc = INVALID("config field '%s' names '%s' twice", what, io[a].name);
    if (rc) {
        io_clear(io, i);
        return rc;
    }
    *out = io;
    *nout = n;
    return 0;
}

int model_config_parse(struct model_config *c, const char *json, size_t len, char *err, size_t err_len) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        /* cJSON leaves end at the first byte it could not parse. */
        size_t at = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        return INVALID("the configuration is not valid JSON (error at byte %zu)", at);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return INVALID("the configuration is not a JSON object");
    }
    free(c->warnings);
    c->warnings = NULL;
    model_fields_snake_case(root);
    int rc = model_fields_check(root, &c->warnings, err, err_len);
    if (rc) goto out;
    int64_t x;
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "name"))) {
        if (!cJSON_IsString(v)) { rc = INVALID("config field 'name' must be a string"); goto out; }
        if (*v->valuestring && strcmp(v->valuestring, c->name)) {
            rc = INVALID("config field 'name' is '%s' but the model's folder is '%s'", v->valuestring, c->name);
            goto out;
        }
    }
    /* Triton picks the backend from these two; kiln is the onnxruntime
     * backend's stand-in, and a model meant for another (TensorRT, Python,
     * PyTorch) would be served wrongly, so any other value is refused. */
    static const char *const served[][2] = {{"platform", "onnxruntime_onnx"}, {"backend", "onnxruntime"}};
    /* The one other platform: an ensemble runs other models, no file of
     * its own, so it names no backend. */
    v = cJSON_GetObjectItemCaseSensitive(root, "platform");
    if (cJSON_IsString(v) && strcmp(v->valuestring, "ensemble") == 0) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "backend");
        if (cJSON_IsString(b) && *b->valuestring) {
            rc = INVALID("ensemble '%s' must not name a backend (config field 'backend' is '%s')", c->name, b->valuestring);
            goto out;
        }
        c->ensemble = 1;
        free(c->platform);
        if (!(c->platform = strdup("ensemble"))) { rc = STATUS_NOMEM; goto out; }
    }
    /* kiln's own backend: a tokenizer.json served as a model. */
    v = cJSON_GetObjectItemCaseSensitive(root, "backend");
    c->tokenizer = cJSON_IsString(v) && strcmp(v->valuestring, "tokenizer") == 0;
    for (size_t f = 0; !c->ensemble && f < sizeof served / sizeof served[0]; f++) {
        if (c->tokenizer && strcmp(served[f][0], "backend") == 0) continue;
        if (!(v = cJSON_GetObjectItemCaseSensitive(root, served[f][0]))) continue;
        if (!cJSON_IsString(v)) { rc = INVALID("config field '%s' must be a string", served[f][0]); goto out; }
        if (*v->valuestring && strcmp(v->valuestring, served[f][1])) {
            rc = INVALID("config field '%s' is '%s': kiln serves ONNX models, as Triton's '%s' %s", served[f][0],
                         v->valuestring, served[f][1], served[f][0]);
            goto out;
        }
    }
    int r = config_get_int(root, "max_batch_size", 0, MODEL_CONFIG_MAX_BATCH_SIZE, &x);
    if (r < 0) {
        rc = INVALID("config field 'max_batch_size' must be an integer from 0 to %d", MODEL_CONFIG_MAX_BATCH_SIZE);
        goto out;
    }
    if (r) { c->max_batch_size = (int)x; c->max_batch_size_set = 1; }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "input")) && (rc = parse_io(v, "input", &c->inputs, &c->ninputs, err, err_len)))
        goto out;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "output")) && (rc = parse_io(v, "output", &c->outputs, &c->noutputs, err, err_len)))
        goto out;

    if ((v = cJSON_GetObjectItemCaseSensitive(root, "version_policy"))) {
        const cJSON *p;
        if (!cJSON_IsObject(v)) { rc = INVALID("config field 'version_policy' must be an object"); goto out; }
        if ((p = cJSON_GetObjectItemCaseSensitive(v, "latest"))) {
            c->version_policy = MODEL_VERSIONS_LATEST;
            r = config_get_int(p, "num_versions", 1, 1 << 20, &x);
            if (r < 0) { rc = INVALID("config field 'version_policy.latest.num_versions' must be an integer >= 1"); goto out; }
            c->num_versions = r ? (int)x : 1;
        } else if (cJSON_GetObjectItemCaseSensitive(v, "all")) {
            c->version_policy = MODEL_VERSIONS_ALL;
        } else if ((p = cJSON_GetObjectItemCaseSensitive(v, "specific"))) {
            c->version_policy = MODEL_VERSIONS_SPECIFIC;
            const cJSON *vs = cJSON_GetObjectItemCaseSensitive(p, "versions"), *e;
            if (!cJSON_IsArray(vs) || cJSON_GetArraySize(vs) == 0 || cJSON_GetArraySize(vs) > MODEL_CONFIG_MAX_VERSIONS) {
                rc = INVALID("config field 'version_policy.specific.versions' must be a non-empty array of versions");
                goto out;
            }
            cJSON_ArrayForEach(e, vs) {
                double d = cJSON_IsNumber(e) ? e->valuedouble : cJSON_IsString(e) ? strtod(e->valuestring, NULL) : -1;
                if (d < 1 || d != (double)(int64_t)d) {
                    rc = INVALID("config field 'version_policy.specific.versions' must hold integers >= 1");
                    goto out;
                }
                c->versions[c->nversions++] = (int64_t)d;
            }
        } else {
            rc = INVALID("config field 'version_policy' must hold one of 'latest', 'all', 'specific'");
            goto out;
        }
    }

    if ((v = cJSON_GetObjectItemCaseSensitive(root, "dynamic_batching"))) {
        if (!cJSON_IsObject(v)) { rc = INVALID("config field 'dynamic_batching' must be an object"); goto out; }
        c->dynamic_batching = 1;
        const cJSON *pb = cJSON_GetObjectItemCaseSensitive(v, "preferred_batch_size"), *e;
        if (pb) {
            if (!cJSON_IsArray(pb) || cJSON_GetArraySize(pb) > MODEL_CONFIG_MAX_PREFERRED) {
                rc = INVALID("config field 'dynamic_batching.preferred_batch_size' must be an array of at most %d sizes",
                             MODEL_CONFIG_MAX_PREFERRED);
                goto out;
            }
            cJSON_ArrayForEach(e, pb) {
                if (!cJSON_IsNumber(e) || e->valuedouble < 1 || e->valuedouble > MODEL_CONFIG_MAX_BATCH_SIZE) {
                    rc = INVALID("config field 'dynamic_batching.preferred_batch_size' must hold integers >= 1");
                    goto out;
                }
                c->preferred_batch_size[c->npreferred++] = (int)e->valuedouble;
            }
        }
        if ((r = config_get_int(v, "max_queue_delay_microseconds", 0, INT64_MAX / 2, &x)) < 0) {
            rc = INVALID("config field 'dynamic_batching.max_queue_delay_microseconds' must be an integer >= 0");
            goto out;
        } else if (r) c->max_queue_delay_us = (uint64_t)x;
        if ((r = config_get_int(v, "latency_budget_microseconds", 0, INT64_MAX / 2, &x)) < 0) {
            rc = INVALID("config field 'dynamic_batching.latency_budget_microseconds' must be an integer >= 0");
            goto out;
        } else if (r) c->latency_budget_us = (uint64_t)x;
        if (get_bool(v, "preserve_ordering", &c->preserve_ordering) < 0) {
            rc = INVALID("config field 'dynamic_batching.preserve_ordering' must be true or false");
            goto out;
        }
        if ((r = config_get_int(v, "priority_levels", 0, MODEL_CONFIG_MAX_PRIORITIES, &x)) < 0) {
            rc = INVALID("config field 'dynamic_batching.priority_levels' must be an integer 0-%d",
                         MODEL_CONFIG_MAX_PRIORITIES);
            goto out;
        } else if (r) c->priority_levels = (int)x;
        if ((r = config_get_int(v, "default_priority_level", 0, MODEL_CONFIG_MAX_PRIORITIES, &x)) < 0) {
            rc = INVALID("config field 'dynamic_batching.default_priority_level' must be an integer 0-%d",
                         MODEL_CONFIG_MAX_PRIORITIES);
            goto out;
        } else if (r) c->default_priority_level = (int)x;
        const cJSON *qp = cJSON_GetObjectItemCaseSensitive(v, "default_queue_policy");
        if (qp) {
            const cJSON *ta = cJSON_GetObjectItemCaseSensitive(qp, "timeout_action");
            if (ta) {
                if (!cJSON_IsString(ta) || (strcmp(ta->valuestring, "REJECT") && strcmp(ta->valuestring, "DELAY"))) {
                    rc = INVALID("config field 'dynamic_batching.default_queue_policy.timeout_action' must be REJECT or DELAY");
                    goto out;
                }
                c->timeout_action_delay = strcmp(ta->valuestring, "DELAY") == 0;
            }
            if ((r = config_get_int(qp, "default_timeout_microseconds", 0, INT64_MAX / 2, &x)) < 0) {
                rc = INVALID("config field 'dynamic_batching.default_queue_policy.default_timeout_microseconds' must be an integer >= 0");
                goto out;
            } else if (r) c->default_timeout_us = (uint64_t)x;
            if (get_bool(qp, "allow_timeout_override", &c->allow_timeout_override) < 0) {
                rc = INVALID("config field 'dynamic_batching.default_queue_policy.allow_timeout_override' must be true or false");
                goto out;
            }
            if ((r = config_get_int(qp, "max_queue_size", 0, 1 << 30, &x)) < 0) {
                rc = INVALID("config field 'dynamic_batching.default_queue_policy.max_queue_size' must be an integer >= 0");
                goto out;
            } else if (r) c->max_queue_size = (int)x;
        }
    }

    /* Triton runs every group's count instances (count defaults to 1 per
     * group); kiln runs one kind per model, so groups must agree on it. */
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "instance_group"))) {
        if (!cJSON_IsArray(v)) {
            rc = INVALID("config field 'instance_group' must be an array of objects");
            goto out;
        }
        int gi = 0, total = 0;
        const cJSON *g;
        cJSON_ArrayForEach(g, v) {
            if (!cJSON_IsObject(g)) {
                rc = INVALID("config field 'instance_group' must be an array of objects");
                goto out;
            }
            if ((r = config_get_int(g, "count", 1, 256, &x)) < 0) {
                rc = INVALID("config field 'instance_group[%d].count' must be an integer 1-256", gi);
                goto out;
            }
            total += r ? (int)x : 1;
            const cJSON *k = cJSON_GetObjectItemCaseSensitive(g, "kind");
            const char *kind = cJSON_IsString(k) ? k->valuestring : "KIND_AUTO";
            if ((k && !cJSON_IsString(k)) ||
                (strcmp(kind, "KIND_AUTO") && strcmp(kind, "KIND_CPU") && strcmp(kind, "KIND_GPU"))) {
                rc = INVALID("config field 'instance_group[%d].kind' must be KIND_AUTO, KIND_CPU or KIND_GPU", gi);
                goto out;
            }
            if (gi > 0 && strcmp(kind, c->instance_kind)) {
                rc = INVALID("config field 'instance_group[%d].kind' is %s but group 0's is %s: kiln runs one kind "
                             "of instance per model", gi, kind, c->instance_kind);
                goto out;
            }
            free(c->instance_kind);
            c->instance_kind = strdup(kind);
            gi++;
        }
        if (total > 256) {
            rc = INVALID("config field 'instance_group' asks for %d instances in all; at most 256", total);
            goto out;
        }
        if (gi) c->instance_count = total;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "response_cache"))) {
        if (!cJSON_IsObject(v) || get_bool(v, "enable", &c->response_cache) < 0) {
            rc = INVALID("config field 'response_cache.enable' must be true or false");
            goto out;
        }
    }
    /* Triton's free-form parameters: string values under string_value.
     * kiln reads intra_op_thread_count (as Triton's onnxruntime backend
     * does) and the embedding keys (config/model_embedding.c); other keys
     * are warned (config/model_fields.c). */
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "parameters"))) {
        if (!cJSON_IsObject(v)) {
            rc = INVALID("config field 'parameters' must be an object of {\"string_value\": \"...\"} values");
            goto out;
        }
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "intra_op_thread_count");
        if (t) {
            const cJSON *sv = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, "string_value") : NULL;
            char *end = NULL;
            long n = sv && cJSON_IsString(sv) ? strtol(sv->valuestring, &end, 10) : -1;
            if (!sv || !cJSON_IsString(sv) || end == sv->valuestring || *end || n < 0 || n > 1024) {
                rc = INVALID("config field 'parameters.intra_op_thread_count' must be {\"string_value\": \"N\"} with N "
                             "an integer 0-1024 (0: kiln chooses)");
                goto out;
            }
            c->intra_op_threads = (int)n;
        }
        const cJSON *ml = cJSON_GetObjectItemCaseSensitive(v, "max_length");
        if (ml && c->tokenizer) {
            const cJSON *sv = cJSON_IsObject(ml) ? cJSON_GetObjectItemCaseSensitive(ml, "string_value") : NULL;
            char *end = NULL;
            long long n = sv && cJSON_IsString(sv) ? strtoll(sv->valuestring, &end, 10) : -1;
            if (!sv || !cJSON_IsString(sv) || end == sv->valuestring || *end || n < 1 || n > 1000000) {
                rc = INVALID("config field 'parameters.max_length' must be {\"string_value\": \"N\"} with N an "
                             "integer 1-1000000 (the tokenizer's truncation length)");
                goto out;
            }
            c->tokenizer_max_length = n;
        }
        if ((rc = model_embedding_parse(c, v, err, err_len))) goto out;
    }
    /* An ensemble runs no instances of its own: what would shape them is
     * a mistake, refused as Triton refuses it. */
    static const char *const not_for_ensembles[] = {"instance_group", "model_warmup", "sequence_padding"};
    for (size_t f = 0; c->ensemble && f < sizeof not_for_ensembles / sizeof not_for_ensembles[0]; f++)
        if ((v = cJSON_GetObjectItemCaseSensitive(root, not_for_ensembles[f])) && cJSON_GetArraySize(v) > 0) {
            rc = INVALID("config field '%s' cannot be given for ensemble '%s': it runs no instances of its own (its "
                         "steps' models have theirs)", not_for_ensembles[f], c->name);
            goto out;
        }
    v = cJSON_GetObjectItemCaseSensitive(root, "ensemble_scheduling");
    if ((v || c->ensemble) && (rc = model_ensemble_parse(c, v, err, err_len))) goto out;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "sequence_padding")) &&
        (rc = model_padding_parse(c, v, err, err_len)))
        goto out;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "model_warmup")) &&
        (rc = model_warmup_parse(c, v, err, err_len)))
        goto out;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "sequence_batching")) &&
        (rc = model_sequence_parse(c, v, err, err_len)))
        goto out;
    /* kiln's own: {"precision": "fp32"|"fp16", "cuda_graphs": bool}. Other
     * keys (Triton's optimization.cuda, priority...) are ignored. */
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "optimization"))) {
        if (!cJSON_IsObject(v)) {
            rc = INVALID("config field 'optimization' must be an object");
            goto out;
        }
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(v, "precision");
        if (pr) {
            if (cJSON_IsString(pr) && strcasecmp(pr->valuestring, "fp32") == 0) c->precision_fp16 = 0;
            else if (cJSON_IsString(pr) && strcasecmp(pr->valuestring, "fp16") == 0) c->precision_fp16 = 1;
            else {
                rc = INVALID("config field 'optimization.precision' must be \"fp32\" or \"fp16\"");
                goto out;
            }
        }
        if (get_bool(v, "cuda_graphs", &c->cuda_graphs) < 0) {
            rc = INVALID("config field 'optimization.cuda_graphs' must be true or false");
            goto out;
        }
    }
out:
    cJSON_Delete(root);
    return rc;
}

/* ---- the model folder's file ------------------------------------------ */

int model_config_read_file(const char *dir, char **json, size_t *len, const char **file, char *err, size_t err_len) {
    static const char *const names[2] = {"config.json", "config.pbtxt"};
    char *text[2] = {NULL, NULL};
    size_t tlen[2] = {0, 0};
    char path[4200];
    *json = NULL;
    *len = 0;
    *file = names[0];
    if (err_len) err[0] = 0;
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        int rc = file_read_regular(path, MODEL_CONFIG_MAX_FILE_BYTES, &text[i], &tlen[i], err, err_len);
        if (rc == STATUS_NOT_FOUND) {
            if (err_len) err[0] = 0;
            continue;
        }
        if (rc) {
            free(text[0]);
            *file = names[i];
            return rc;
        }
    }
    if (text[0] && text[1]) {
        free(text[0]);
        free(text[1]);
        return INVALID("the model's folder has both config.json and config.pbtxt: keep one");
    }
    if (text[0]) {
        *json = text[0];
        *len = tlen[0];
        return 0;
    }
    if (!text[1]) return STATUS_NOT_FOUND;
    *file = names[1];
    cJSON *root = NULL;
    int rc = pbtxt_parse(model_fields_descriptor(), text[1], tlen[1], names[1], &root, err, err_len);
    free(text[1]);
    if (rc) return rc;
    *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!*json) return status_set(err, err_len, STATUS_NOMEM, "config.pbtxt: out of memory");
    *len = strlen(*json);
    return 0;
}

/* ---- auto-complete ------------------------------------------------------ */

static int complete_list(struct model_config *c, struct model_config_io **list, int *n, const char *what,
                         const struct model_io *mio, int nm, char *err, size_t err_len) {
    if (*n == 0) {
        *list = calloc((size_t)(nm > 0 ? nm : 1), sizeof **list);
        if (!*list) return STATUS_NOMEM;
        for (int i = 0; i < nm; i++) {
            (*list)[i].name = strdup(mio[i].name);
            (*list)[i].ndim = -1;
            (*list)[i].reshape_ndim = -1;
        }
        *n = nm;
    }
    for (int i = 0; i < *n; i++) {
        struct model_config_io *x = &(*list)[i];
        const struct model_io *m = NULL;
        for (int j = 0; j < nm; j++)
            if (strcmp(mio[j].name, x->name) == 0) m = &mio[j];
        if (!m) {
            char names[512] = "";
            for (int j = 0; j < nm; j++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s'%s'", j ? ", " : "", mio[j].name);
            return INVALID("config field '%s' names '%s' but the model has no such %s (it has %s)", what, x->name, what, names);
        }
        if (x->dtype == DT_UNDEFINED) x->dtype = m->dtype;
        else if (x->dtype != m->dtype)
            return INVALID("config field '%s' of '%s': data_type is %s but the model says %s", what, x->name,
                           dtype_config_name(x->dtype), dtype_config_name(m->dtype));
        /* With a reshape the model's shape is reshape.shape; dims stays the
         * clients' (parse_io checked the two hold as many elements). */
        int skip = c->max_batch_size > 0 ? 1 : 0, rs = x->reshape_ndim >= 0;
        int *xnd = rs ? &x->reshape_ndim : &x->ndim;
        int64_t *xd = rs ? x->reshape : x->dims;
        const char *field = rs ? "reshape.shape" : "dims";
        if (m->ndim >= 0) {
            int mnd = m->ndim - skip;
            if (*xnd < 0) {
                *xnd = mnd < 0 ? 0 : mnd;
                for (int d = 0; d < *xnd; d++) xd[d] = m->dims[d + skip];
            } else if (*xnd != mnd) {
                return INVALID("config field '%s' of '%s': %s has %d entries but the model's %s has rank %d%s", what,
                               x->name, field, *xnd, what, m->ndim,
                               skip ? " (the batch dim is not listed)" : "");
            } else {
                for (int d = 0; d < *xnd; d++) {
                    int64_t md = m->dims[d + skip];
                    if (md >= 0 && xd[d] >= 0 && md != xd[d])
                        return INVALID("config field '%s' of '%s': %s[%d] is %lld but the model says %lld", what,
                                       x->name, field, d, (long long)xd[d], (long long)md);
                    if (xd[d] < 0 && !rs) xd[d] = md; /* the model may know more */
                }
            }
        }
        /* Unknown rank in both: x->ndim stays -1 and any shape is accepted; the engine checks. */
    }
    /* Put the list in the model's order (adding what the file left out), so
     * that index i of the config is index i of the model everywhere else. */
    struct model_config_io *sorted = calloc((size_t)(nm > 0 ? nm : 1), sizeof *sorted);
    if (!sorted) return STATUS_NOMEM;
    for (int j = 0; j < nm; j++) {
        int found = 0;
        for (int i = 0; i < *n; i++)
            if ((*list)[i].name && strcmp((*list)[i].name, mio[j].name) == 0) {
                sorted[j] = (*list)[i];
                (*list)[i].name = NULL;
                found = 1;
            }
        if (!found) {
            sorted[j].name = strdup(mio[j].name);
            sorted[j].reshape_ndim = -1;
            sorted[j].dtype = mio[j].dtype;
            sorted[j].ndim = mio[j].ndim < 0 ? -1 : mio[j].ndim - (c->max_batch_size > 0);
            for (int d = 0; d < sorted[j].ndim; d++) sorted[j].dims[d] = mio[j].dims[d + (c->max_batch_size > 0)];
        }
    }
    free(*list); /* every entry moved into sorted */
    *list = sorted;
    *n = nm;
    return 0;
}

/* Whether the dims listed in a file mean a batch dim is left out (1) or
 * not (0), for a model that may batch and a file without max_batch_size:
 * each listed tensor's rank (its reshape's where it has one) against the
 * model's. *hint stays -1 when nothing is listed; two that disagree are
 * an error naming the second. */
static int batch_hint(const struct model_config_io *io, int n, const char *what, const struct model_io *mio, int nm,
                      int *hint, char *err, size_t err_len) {
    for (int i = 0; i < n; i++) {
        int nd = io[i].reshape_ndim >= 0 ? io[i].reshape_ndim : io[i].ndim;
        for (int j = 0; j < nm && nd >= 0; j++) {
            if (strcmp(mio[j].name, io[i].name) || (nd != mio[j].ndim && nd + 1 != mio[j].ndim)) continue;
            int h = nd + 1 == mio[j].ndim;
            if (*hint >= 0 && *hint != h)
                return INVALID("config field '%s' of '%s': its dims %s the batch dim but another tensor's %s; give "
                               "max_batch_size", what, io[i].name, h ? "leave out" : "hold", h ? "hold it" : "leave it out");
            *hint = h;
        }
    }
    return 0;
}

int model_config_complete(struct model_config *c, const struct model_io *inputs, int ninputs,
                          const struct model_io *outputs, int noutputs, char *err, size_t err_len) {
    /* Triton's onnxruntime backend: max_batch_size absent and 0 are the same
     * (protobuf has no "absent"; its JSON drops a 0). A model whose every
     * input and output has a symbolic first dim may batch; then the dims the
     * file lists say which it means: the model's rank less the batch dim
     * (batch), or its whole rank (no batching: whole tensors of any length).
     * A file that lists no dims leaves it to the graph: batch. So a
     * configuration read back from GET .../config loads as the same one. */
    if (c->max_batch_size == 0) {
        int ok = ninputs > 0, hint = -1, rc = 0;
        for (int i = 0; i < ninputs; i++)
            if (inputs[i].ndim < 1 || inputs[i].dims[0] != -1) ok = 0;
        for (int i = 0; i < noutputs; i++)
            if (outputs[i].ndim < 1 || outputs[i].dims[0] != -1) ok = 0;
        if (ok && (rc = batch_hint(c->inputs, c->ninputs, "input", inputs, ninputs, &hint, err, err_len)) == 0)
            rc = batch_hint(c->outputs, c->noutputs, "output", outputs, noutputs, &hint, err, err_len);
        if (rc) return rc;
        ok = ok && hint != 0;
        c->max_batch_size = ok ? MODEL_CONFIG_DEFAULT_MAX_BATCH : 0;
        if (ok && !c->dynamic_batching) c->dynamic_batching = 1;
    } else if (c->max_batch_size > 0) {
        for (int i = 0; i < ninputs; i++)
            if (inputs[i].ndim == 0 || (inputs[i].ndim > 0 && inputs[i].dims[0] != -1 && inputs[i].dims[0] < c->max_batch_size))
                return INVALID("config field 'max_batch_size' is %d but input '%s' has no batch dim (its first dim is %lld)",
                               c->max_batch_size, inputs[i].name, inputs[i].ndim ? (long long)inputs[i].dims[0] : 0LL);
    }
    int rc = complete_list(c, &c->inputs, &c->ninputs, "input", inputs, ninputs, err, err_len);
    if (rc) return rc;
    for (int i = 0; i < ninputs; i++)
        if (model_config_find_input(c, inputs[i].name) < 0)
            return INVALID("config field 'input' does not list the model's input '%s'", inputs[i].name);
    rc = complete_list(c, &c->outputs, &c->noutputs, "output", outputs, noutputs, err, err_len);
    if (!rc) rc = model_sequence_complete(c, inputs, ninputs, outputs, noutputs, err, err_len);
    if (!rc) rc = model_padding_complete(c, inputs, ninputs, outputs, noutputs, err, err_len);
    if (!rc) rc = model_embedding_check(c, err, err_len);
    return rc ? rc : model_warmup_check(c, err, err_len);
}

int model_config_load_labels(struct model_config *c, const char *dir, char *err, size_t err_len) {
    for (int i = 0; i < c->noutputs; i++) {
        struct model_config_io *o = &c->outputs[i];
        if (!o->label_filename) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, o->label_filename);
        int64_t size;
        int st;
        char e2[4200];
        FILE *f = file_open_regular(path, MODEL_CONFIG_MAX_FILE_BYTES, &size, &st, e2, sizeof e2);
        if (!f) return INVALID("config field 'output' of '%s': label_filename: %s", o->name, e2);
        char line[1024];
        int cap = 0;
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\r\n")] = 0;
            if (o->nlabels == cap) {
                cap = cap ? cap * 2 : 64;
                char **nl = realloc(o->labels, (size_t)cap * sizeof *nl);
                if (!nl) { fclose(f); return STATUS_NOMEM; }
                o->labels = nl;
            }
            o->labels[o->nlabels++] = strdup(line);
        }
        fclose(f);
    }
    return 0;
}

int model_config_version_wanted(const struct model_config *c, int64_t version, const int64_t *present, int npresent) {
    switch (c->version_policy) {
    case MODEL_VERSIONS_ALL: return 1;
    case MODEL_VERSIONS_SPECIFIC:
        for (int i = 0; i < c->nversions; i++)
            if (c->versions[i] == version) return 1;
        return 0;
    default: {
        int newer = 0;
        for (int i = 0; i < npresent; i++)
            if (present[i] > version) newer++;
        return newer < c->num_versions;
    }
    }
}

int model_config_find_input(const struct model_config *c, const char *name) {
    for (int i = 0; i < c->ninputs; i++)
        if (strcmp(c->inputs[i].name, name) == 0) return i;
    return -1;
}

int model_config_find_output(const struct model_config *c, const char *name) {
    for (int i = 0; i < c->noutputs; i++)
        if (strcmp(c->outputs[i].name, name) == 0) return i;
    return -1;
}

/* ---- output ------------------------------------------------------------- */

static cJSON *io_json(const struct model_config_io *io, int n) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        if (io[i].hidden) continue; /* sequence_batching's, listed there */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", io[i].name);
        cJSON_AddStringToObject(o, "data_type", dtype_config_name(io[i].dtype) ? dtype_config_name(io[i].dtype) : "TYPE_INVALID");
        cJSON *dims = cJSON_AddArrayToObject(o, "dims");
        for (int d = 0; d < io[i].ndim; d++) cJSON_AddItemToArray(dims, cJSON_CreateNumber((double)io[i].dims[d]));
        if (io[i].reshape_ndim >= 0) {
            cJSON *sh = cJSON_AddArrayToObject(cJSON_AddObjectToObject(o, "reshape"), "shape");
            for (int d = 0; d < io[i].reshape_ndim; d++)
                cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)io[i].reshape[d]));
        }
        if (io[i].optional) cJSON_AddBoolToObject(o, "optional", 1);
        if (io[i].label_filename) cJSON_AddStringToObject(o, "label_filename", io[i].label_filename);
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

cJSON *model_config_to_json(const struct model_config *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddStringToObject(o, "platform", c->platform);
    if (!c->ensemble) cJSON_AddStringToObject(o, "backend", c->tokenizer ? "tokenizer" : "onnxruntime");
    cJSON *vp = cJSON_AddObjectToObject(o, "version_policy");
    if (c->version_policy == MODEL_VERSIONS_ALL) cJSON_AddObjectToObject(vp, "all");
    else if (c->version_policy == MODEL_VERSIONS_SPECIFIC) {
        cJSON *vs = cJSON_AddArrayToObject(cJSON_AddObjectToObject(vp, "specific"), "versions");
        for (int i = 0; i < c->nversions; i++) cJSON_AddItemToArray(vs, cJSON_CreateNumber((double)c->versions[i]));
    } else cJSON_AddNumberToObject(cJSON_AddObjectToObject(vp, "latest"), "num_versions", c->num_versions);
    cJSON_AddNumberToObject(o, "max_batch_size", c->max_batch_size);
    cJSON_AddItemToObject(o, "input", io_json(c->inputs, c->ninputs));
    cJSON_AddItemToObject(o, "output", io_json(c->outputs, c->noutputs));
    if (c->dynamic_batching) {
        cJSON *db = cJSON_AddObjectToObject(o, "dynamic_batching");
        cJSON *pb = cJSON_AddArrayToObject(db, "preferred_batch_size");
        for (int i = 0; i < c->npreferred; i++) cJSON_AddItemToArray(pb, cJSON_CreateNumber(c->preferred_batch_size[i]));
        cJSON_AddNumberToObject(db, "max_queue_delay_microseconds", (double)c->max_queue_delay_us);
        if (c->latency_budget_us)
            cJSON_AddNumberToObject(db, "latency_budget_microseconds", (double)c->latency_budget_us);
        cJSON_AddBoolToObject(db, "preserve_ordering", c->preserve_ordering);
        cJSON_AddNumberToObject(db, "priority_levels", c->priority_levels);
        cJSON_AddNumberToObject(db, "default_priority_level", c->default_priority_level);
        cJSON *qp = cJSON_AddObjectToObject(db, "default_queue_policy");
        cJSON_AddStringToObject(qp, "timeout_action", c->timeout_action_delay ? "DELAY" : "REJECT");
        cJSON_AddNumberToObject(qp, "default_timeout_microseconds", (double)c->default_timeout_us);
        cJSON_AddBoolToObject(qp, "allow_timeout_override", c->allow_timeout_override);
        cJSON_AddNumberToObject(qp, "max_queue_size", c->max_queue_size);
    }
    if (c->ensemble) {
        /* Nothing that shapes instances: an ensemble has none (above). */
        cJSON_AddBoolToObject(cJSON_AddObjectToObject(o, "response_cache"), "enable", c->response_cache);
        cJSON_AddItemToObject(o, "ensemble_scheduling", model_ensemble_to_json(c));
        return o;
    }
    cJSON *ig = cJSON_AddArrayToObject(o, "instance_group");
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "name", c->name);
    cJSON_AddStringToObject(g, "kind", c->instance_kind);
    cJSON_AddNumberToObject(g, "count", c->instance_count);
    cJSON_AddItemToArray(ig, g);
    cJSON_AddBoolToObject(cJSON_AddObjectToObject(o, "response_cache"), "enable", c->response_cache);
    cJSON *op = cJSON_AddObjectToObject(o, "optimization");
    cJSON_AddStringToObject(op, "precision", c->precision_fp16 ? "fp16" : "fp32");
    cJSON_AddBoolToObject(op, "cuda_graphs", c->cuda_graphs);
    if (c->intra_op_threads > 0 || c->embedding.enabled) {
        cJSON *pa = cJSON_AddObjectToObject(o, "parameters");
        if (c->intra_op_threads > 0) {
            char n[16];
            snprintf(n, sizeof n, "%d", c->intra_op_threads);
            cJSON_AddStringToObject(cJSON_AddObjectToObject(pa, "intra_op_thread_count"), "string_value", n);
        }
        model_embedding_to_json(c, pa);
    }
    if (c->tokenizer_max_length > 0) {
        char n[24];
        snprintf(n, sizeof n, "%lld", (long long)c->tokenizer_max_length);
        cJSON *pa = cJSON_GetObjectItemCaseSensitive(o, "parameters");
        if (!pa) pa = cJSON_AddObjectToObject(o, "parameters");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(pa, "max_length"), "string_value", n);
    }
    if (c->padding.given || c->padding.ninputs)
        cJSON_AddItemToObject(o, "sequence_padding", model_padding_to_json(c));
    if (c->nwarmup) cJSON_AddItemToObject(o, "model_warmup", model_warmup_to_json(c));
    if (c->sequence.enable) cJSON_AddItemToObject(o, "sequence_batching", model_sequence_to_json(c));
    return o;
}
