/* model_fields.c - what kiln does with each ModelConfig field: the table,
 * and the walk that holds a configuration to it (model_fields.h).
 *
 * The walk runs over the JSON tree, which both config.json and config.pbtxt
 * become (config/pbtxt.c), with ModelConfig's protobuf-c descriptor beside
 * it: the descriptor says which keys are fields and their types, the table
 * says their fates. It descends only into honoured messages: a refused or
 * warned message's fields share its fate. */
#include "config/model_fields.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "config/pbtxt.h"
#include "triton/model_config.pb-c.h"

#define H MODEL_FIELD_HONOURED
#define R MODEL_FIELD_REFUSED
#define W MODEL_FIELD_WARNED
#define KILN MODEL_FIELD_KILN
#define ONE MODEL_FIELD_ONE

static const struct model_field fields[] = {
    {"name", H, 0, NULL, "must match the model's folder"},
    {"platform", H, 0, NULL, "onnxruntime_onnx or ensemble; other platforms are refused, naming the value"},
    {"backend", H, 0, NULL, "onnxruntime, or kiln's own tokenizer (a tokenizer.json, docs/text.md); other backends "
                           "are refused, naming the value"},
    {"runtime", W, 0, NULL, "kiln runs the model with its own engine, not a backend's shared library"},
    {"version_policy", H, 0, NULL, "which versions load"},
    {"version_policy.latest", H, 0, NULL, "the newest num_versions versions"},
    {"version_policy.latest.num_versions", H, 0, NULL, ""},
    {"version_policy.all", H, 0, NULL, "every version"},
    {"version_policy.specific", H, 0, NULL, "the versions listed"},
    {"version_policy.specific.versions", H, 0, NULL, ""},
    {"max_batch_size", H, 0, NULL, "0: the model takes no batch dim"},
    {"input", H, 0, NULL, "checked against the model and completed from it"},
    {"input.name", H, 0, NULL, ""},
    {"input.data_type", H, 0, NULL, ""},
    {"input.format", W, 0, NULL, "an image layout hint for clients; kiln reads the shape from dims"},
    {"input.dims", H, 0, NULL, "without the batch dim; -1 any"},
    {"input.reshape", H, 0, NULL, "the shape the model sees"},
    {"input.reshape.shape", H, 0, NULL, ""},
    {"input.is_shape_tensor", R, 0, NULL, "kiln has no shape tensors (TensorRT)"},
    {"input.allow_ragged_batch", R, 0, NULL, "kiln batches only inputs of one shape; ragged batches would be refused or padded"},
    {"input.optional", H, 0, NULL, "an input a request may leave out"},
    {"input.is_non_linear_format_io", R, 0, NULL, "kiln has no non-linear tensor formats (TensorRT)"},
    {"output", H, 0, NULL, "checked against the model and completed from it"},
    {"output.name", H, 0, NULL, ""},
    {"output.data_type", H, 0, NULL, ""},
    {"output.dims", H, 0, NULL, "without the batch dim; -1 any"},
    {"output.reshape", H, 0, NULL, "the shape clients see"},
    {"output.reshape.shape", H, 0, NULL, ""},
    {"output.label_filename", H, 0, NULL, "labels for the classification extension"},
    {"output.is_shape_tensor", R, 0, NULL, "kiln has no shape tensors (TensorRT)"},
    {"output.is_non_linear_format_io", R, 0, NULL, "kiln has no non-linear tensor formats (TensorRT)"},
    {"batch_input", R, 0, NULL, "kiln does not make batch inputs (ragged batching)"},
    {"batch_output", R, 0, NULL, "kiln does not scatter batch outputs (ragged batching)"},
    {"optimization", H, 0, NULL, "kiln's own precision and cuda_graphs; Triton's fields warned"},
    {"optimization.precision", H, KILN, NULL, "kiln's own: fp32 or fp16 on device backends"},
    {"optimization.cuda_graphs", H, KILN, NULL, "kiln's own: CUDA graph capture on the CUDA backend"},
    {"optimization.graph", W, 0, NULL, "a framework's graph optimisation level; kiln optimises its plans its own way"},
    {"optimization.priority", W, 0, NULL, "instance thread priority; kiln's instance threads share one priority"},
    {"optimization.cuda", W, 0, NULL, "Triton's CUDA graph specs; kiln's own cuda_graphs decides capture"},
    {"optimization.execution_accelerators", W, 0, NULL, "TensorRT/OpenVINO accelerators; kiln runs its own kernels"},
    {"optimization.input_pinned_memory", W, 0, NULL, "kiln stages copies its own way"},
    {"optimization.output_pinned_memory", W, 0, NULL, "kiln stages copies its own way"},
    {"optimization.gather_kernel_buffer_threshold", W, 0, NULL, "kiln gathers batch rows its own way"},
    {"optimization.eager_batching", W, 0, NULL, "kiln's batcher decides when a batch starts"},
    {"dynamic_batching", H, 0, NULL, "the dynamic batcher (docs/batching.md)"},
    {"dynamic_batching.preferred_batch_size", H, 0, NULL, ""},
    {"dynamic_batching.max_queue_delay_microseconds", H, 0, NULL, ""},
    {"dynamic_batching.latency_budget_microseconds", H, KILN, NULL, "kiln's own: the batcher's latency budget"},
    {"dynamic_batching.preserve_ordering", H, 0, NULL, ""},
    {"dynamic_batching.priority_levels", H, 0, NULL, ""},
    {"dynamic_batching.default_priority_level", H, 0, NULL, ""},
    {"dynamic_batching.default_queue_policy", H, 0, NULL, ""},
    {"dynamic_batching.default_queue_policy.timeout_action", H, 0, NULL, ""},
    {"dynamic_batching.default_queue_policy.default_timeout_microseconds", H, 0, NULL, ""},
    {"dynamic_batching.default_queue_policy.allow_timeout_override", H, 0, NULL, ""},
    {"dynamic_batching.default_queue_policy.max_queue_size", H, 0, NULL, ""},
    {"dynamic_batching.priority_queue_policy", R, 0, NULL,
     "kiln has one queue policy for every priority (default_queue_policy)"},
    {"sequence_batching", H, 0, NULL, "the sequence batcher: correlation IDs, control inputs, implicit state (docs/sequences.md)"},
    {"sequence_batching.max_sequence_idle_microseconds", H, 0, NULL, "an idle sequence is released; default 1 s"},
    {"sequence_batching.control_input", H, 0, NULL, "inputs the server fills: START, END, READY, CORRID"},
    {"sequence_batching.control_input.name", H, 0, NULL, ""},
    {"sequence_batching.control_input.control", H, 0, NULL, ""},
    {"sequence_batching.control_input.control.kind", H, 0, NULL, ""},
    {"sequence_batching.control_input.control.int32_false_true", H, 0, NULL, ""},
    {"sequence_batching.control_input.control.fp32_false_true", H, 0, NULL, ""},
    {"sequence_batching.control_input.control.bool_false_true", H, 0, NULL, ""},
    {"sequence_batching.control_input.control.data_type", H, 0, NULL, "CORRID: TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING"},
    {"sequence_batching.state", H, 0, NULL, "implicit state: an input/output pair kept by the server per sequence"},
    {"sequence_batching.state.input_name", H, 0, NULL, ""},
    {"sequence_batching.state.output_name", H, 0, NULL, ""},
    {"sequence_batching.state.data_type", H, 0, NULL, ""},
    {"sequence_batching.state.dims", H, 0, NULL, "without the batch dim; -1 any"},
    {"sequence_batching.state.initial_state", H, 0, NULL, "zeros or a file in the model's initial_state/ folder; one per state"},
    {"sequence_batching.state.initial_state.data_type", H, 0, NULL, ""},
    {"sequence_batching.state.initial_state.dims", H, 0, NULL, ""},
    {"sequence_batching.state.initial_state.name", H, 0, NULL, ""},
    {"sequence_batching.state.initial_state.zero_data", H, 0, NULL, ""},
    {"sequence_batching.state.initial_state.data_file", H, 0, NULL, ""},
    {"sequence_batching.state.use_same_buffer_for_input_output", W, 0, NULL, "kiln keeps a state's output as the next input without a copy already"},
    {"sequence_batching.state.use_growable_memory", W, 0, NULL, "a state grows as its output does"},
    {"sequence_batching.iterative_sequence", R, 0, NULL, "kiln has no iterative sequences (decoupled rescheduling)"},
    {"sequence_batching.direct", H, 0, NULL, "a slot per live sequence: max_batch_size slots per instance"},
    {"sequence_batching.direct.max_queue_delay_microseconds", H, 0, NULL, ""},
    {"sequence_batching.direct.minimum_slot_utilization", W, 0, NULL, "kiln runs what is ready when an instance is free"},
    {"sequence_batching.oldest", H, 0, NULL, "batches of the oldest sequences' ready requests"},
    {"sequence_batching.oldest.max_candidate_sequences", H, 0, NULL, "live sequences at once; default max_batch_size per instance"},
    {"sequence_batching.oldest.preferred_batch_size", H, 0, NULL, ""},
    {"sequence_batching.oldest.max_queue_delay_microseconds", H, 0, NULL, ""},
    {"sequence_batching.oldest.preserve_ordering", H, 0, NULL, ""},
    {"ensemble_scheduling", H, 0, NULL, "the steps of an ensemble (platform \"ensemble\", docs/ensembles.md)"},
    {"ensemble_scheduling.step", H, 0, NULL, "each a request to a model of the repository"},
    {"ensemble_scheduling.step.model_name", H, 0, NULL, ""},
    {"ensemble_scheduling.step.model_version", H, 0, NULL, "-1: the highest loaded"},
    {"ensemble_scheduling.step.input_map", H, 0, NULL, "step model input -> ensemble tensor"},
    {"ensemble_scheduling.step.output_map", H, 0, NULL, "step model output -> ensemble tensor"},
    {"ensemble_scheduling.step.model_namespace", R, 0, NULL, "kiln has one namespace of model names"},
    {"ensemble_scheduling.max_inflight_requests", H, 0, NULL, "requests in flight at each step, per ensemble"},
    {"instance_group", H, 0, NULL, "every group's count instances, summed (groups of one kind)"},
    {"instance_group.name", H, 0, NULL, "a label"},
    {"instance_group.kind", H, 0, NULL, "KIND_AUTO, KIND_CPU or KIND_GPU"},
    {"instance_group.count", H, 0, NULL, ""},
    {"instance_group.rate_limiter", W, 0, NULL, "kiln has no rate limiter; instances run whenever a batch is ready"},
    {"instance_group.gpus", W, 0, NULL, "kiln's instances run on the device of the backend it was started with"},
    {"instance_group.secondary_devices", R, 0, NULL, "kiln has no secondary devices (NVDLA)"},
    {"instance_group.profile", W, 0, NULL, "TensorRT optimisation profiles; kiln builds a plan per shape"},
    {"instance_group.passive", R, 0, NULL, "kiln schedules every instance; a passive group would take work"},
    {"instance_group.host_policy", W, 0, NULL, "kiln has no host policies"},
    {"default_model_filename", R, 0, "model.onnx", "kiln loads <version>/model.onnx"},
    {"cc_model_filenames", W, 0, NULL, "per-GPU model files (TensorRT); kiln loads model.onnx"},
    {"metric_tags", W, 0, NULL, "kiln's metrics carry no custom labels"},
    {"parameters", H, 0,
     "intra_op_thread_count embedding_output embedding_pooling embedding_normalize embedding_dimensions tokenizer_file "
     "max_length",
     "intra_op_thread_count: CPU threads per instance; embedding_output and the keys beside it: the model on "
     "/v1/embeddings (docs/embeddings.md); other keys warned"},
    {"parameters.string_value", H, 0, NULL, ""},
    {"model_warmup", H, 0, NULL, "samples run on every instance at load"},
    {"model_warmup.name", H, 0, NULL, ""},
    {"model_warmup.batch_size", H, 0, NULL, ""},
    {"model_warmup.inputs", H, 0, NULL, ""},
    {"model_warmup.inputs.data_type", H, 0, NULL, ""},
    {"model_warmup.inputs.dims", H, 0, NULL, ""},
    {"model_warmup.inputs.zero_data", H, 0, NULL, ""},
    {"model_warmup.inputs.random_data", H, 0, NULL, ""},
    {"model_warmup.inputs.input_data_file", H, 0, NULL, "a file in the model's warmup/ folder"},
    {"model_warmup.count", H, 0, NULL, ""},
    {"model_operations", W, 0, NULL, "custom operator libraries are for framework backends; kiln refuses unknown ops"},
    {"model_transaction_policy", H, 0, NULL, "one response per request"},
    {"model_transaction_policy.decoupled", R, 0, NULL, "kiln answers each request with one response"},
    {"model_repository_agents", R, 0, NULL, "kiln runs no repository agents (checksum, decryption)"},
    {"response_cache", H, 0, NULL, "the result cache (docs/cache.md)"},
    {"response_cache.enable", H, 0, NULL, ""},
    {"model_metrics", W, 0, NULL, "kiln's metrics have fixed histograms"},
    {"sequence_padding", H, KILN, NULL, "kiln's own: padded batching (docs/batching.md)"},
};

#undef H
#undef R
#undef W
#undef KILN
#undef ONE

const struct model_field *model_fields(size_t *n) {
    *n = sizeof fields / sizeof fields[0];
    return fields;
}

const struct model_field *model_field_find(const char *path) {
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (strcmp(fields[i].path, path) == 0) return &fields[i];
    return NULL;
}

const ProtobufCMessageDescriptor *model_fields_descriptor(void) {
    return &inference__model_config__descriptor;
}

/* ---- the walk ----------------------------------------------------------- */

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)

struct walk {
    char *warnings;
    size_t len;
    char *err;
    size_t err_len;
};

static int warn(struct walk *w, const char *path, const char *why) {
    char line[512];
    int n = snprintf(line, sizeof line, "%sconfig field '%s' is accepted but ignored: %s", w->len ? "\n" : "", path, why);
    if (n < 0) return 0;
    if ((size_t)n >= sizeof line) n = sizeof line - 1;
    char *s = realloc(w->warnings, w->len + (size_t)n + 1);
    if (!s) return STATUS_NOMEM;
    memcpy(s + w->len, line, (size_t)n + 1);
    w->warnings = s;
    w->len += (size_t)n;
    return 0;
}

/* A scalar (or list of scalars) at the field's default says no more than
 * its absence. Messages are not: an empty sequence_batching {} still picks
 * the sequence batcher. */
static int is_default(const ProtobufCFieldDescriptor *f, const cJSON *v) {
    if (cJSON_IsNull(v)) return 1;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) return cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0;
    if (f->type == PROTOBUF_C_TYPE_MESSAGE) return 0;
    if (cJSON_IsBool(v)) return cJSON_IsFalse(v);
    if (cJSON_IsNumber(v)) return v->valuedouble == 0;
    if (cJSON_IsString(v)) {
        if (!*v->valuestring) return 1;
        if (f->type == PROTOBUF_C_TYPE_ENUM) {
            const ProtobufCEnumValue *e = protobuf_c_enum_descriptor_get_value_by_name(f->descriptor, v->valuestring);
            return e && e->value == 0;
        }
        return f->type != PROTOBUF_C_TYPE_STRING && strcmp(v->valuestring, "0") == 0;
    }
    return 0;
}

static int walk_message(struct walk *w, const ProtobufCMessageDescriptor *d, const cJSON *obj, const char *prefix);

/* 1 if key is one of the space-separated words of list. */
static int key_listed(const char *list, const char *key) {
    size_t n = strlen(key);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ' ');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && memcmp(p, key, n) == 0) return 1;
        p += len + (e ? 1 : 0);
    }
    return 0;
}

/* An honoured message field's value(s): each message of a list or map is
 * walked with the field's path. */
static int walk_value(struct walk *w, const struct model_field *e, const ProtobufCFieldDescriptor *f, const cJSON *v,
                      const char *path) {
    char *err = w->err;
    size_t err_len = w->err_len;
    if (f->type != PROTOBUF_C_TYPE_MESSAGE) return 0;
    if (pbtxt_is_map(f)) {
        const ProtobufCFieldDescriptor *vf = &((const ProtobufCMessageDescriptor *)f->descriptor)->fields[1];
        const cJSON *m;
        cJSON_ArrayForEach(m, v) {
            if (e->ok && m->string && !key_listed(e->ok, m->string)) {
                char kp[300];
                snprintf(kp, sizeof kp, "%s.%s", path, m->string);
                int rc = warn(w, kp, "kiln reads no such key");
                if (rc) return rc;
                continue;
            }
            if (vf->type == PROTOBUF_C_TYPE_MESSAGE && cJSON_IsObject(m)) {
                int rc = walk_message(w, vf->descriptor, m, path);
                if (rc) return rc;
            }
        }
        return 0;
    }
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        if (!cJSON_IsArray(v)) return 0; /* the reader names the wrong type */
        if ((e->flags & MODEL_FIELD_ONE) && cJSON_GetArraySize(v) > 1)
            return INVALID("config field '%s' has %d entries: kiln runs one (%s)", path, cJSON_GetArraySize(v), e->why);
        const cJSON *m;
        cJSON_ArrayForEach(m, v) {
            int rc = cJSON_IsObject(m) ? walk_message(w, f->descriptor, m, path) : 0;
            if (rc) return rc;
        }
        return 0;
    }
    return cJSON_IsObject(v) ? walk_message(w, f->descriptor, v, path) : 0;
}

static int walk_message(struct walk *w, const ProtobufCMessageDescriptor *d, const cJSON *obj, const char *prefix) {
    char *err = w->err;
    size_t err_len = w->err_len;
    const cJSON *v;
    cJSON_ArrayForEach(v, obj) {
        char path[300];
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", v->string ? v->string : "");
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, v->string ? v->string : "");
        const struct model_field *e = model_field_find(path);
        if (!e) {
            if (f) return INVALID("config field '%s' is not supported by kiln", path);
            return INVALID("config field '%s' is not a field of Triton's ModelConfig (%s)", path, d->short_name);
        }
        if ((e->flags & MODEL_FIELD_KILN) || !f) continue; /* kiln's own readers check theirs */
        if (is_default(f, v) || (e->ok && !pbtxt_is_map(f) && cJSON_IsString(v) && strcmp(v->valuestring, e->ok) == 0))
            continue;
        int rc = 0;
        switch (e->fate) {
        case MODEL_FIELD_REFUSED: return INVALID("config field '%s' is not supported: %s", path, e->why);
        case MODEL_FIELD_WARNED: rc = warn(w, path, e->why); break;
        case MODEL_FIELD_HONOURED: rc = walk_value(w, e, f, v, path); break;
        }
        if (rc) return rc;
    }
    return 0;
}

/* ---- protobuf's JSON names ------------------------------------------------ */

/* protobuf's JSON mapping writes lowerCamelCase names (json_format's
 * MessageToJson: maxBatchSize) and its parsers take either form; kiln's
 * readers use the .proto's names. The descriptors say which keys are fields,
 * so map keys (parameters' names) are never touched. */
static void snake_case(cJSON *obj, const ProtobufCMessageDescriptor *d, int depth) {
    if (!cJSON_IsObject(obj) || depth > 16) return;
    for (cJSON *v = obj->child, *next; v; v = next) {
        next = v->next;
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, v->string);
        if (!f && v->string && strlen(v->string) < 100) {
            char snake[256];
            size_t n = 0;
            for (const char *c = v->string; *c; c++) {
                if (*c >= 'A' && *c <= 'Z') snake[n++] = '_', snake[n++] = (char)(*c - 'A' + 'a');
                else snake[n++] = *c;
            }
            snake[n] = 0;
            f = protobuf_c_message_descriptor_get_field_by_name(d, snake);
            if (f && !cJSON_GetObjectItemCaseSensitive(obj, snake)) {
                cJSON_DetachItemViaPointer(obj, v);
                cJSON_AddItemToObject(obj, snake, v);
            } else f = NULL;
        }
        if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
        const ProtobufCMessageDescriptor *sub = f->descriptor;
        if (pbtxt_is_map(f)) {
            if (sub->fields[1].type != PROTOBUF_C_TYPE_MESSAGE) continue;
            sub = sub->fields[1].descriptor;
        }
        if (cJSON_IsArray(v) || pbtxt_is_map(f)) {
            cJSON *e;
            cJSON_ArrayForEach(e, v) snake_case(e, sub, depth + 1);
        } else snake_case(v, sub, depth + 1);
    }
}

void model_fields_snake_case(cJSON *root) {
    snake_case(root, model_fields_descriptor(), 0);
}

int model_fields_check(const cJSON *root, char **warnings, char *err, size_t err_len) {
    struct walk w = {.err = err, .err_len = err_len};
    int rc = cJSON_IsObject(root) ? walk_message(&w, model_fields_descriptor(), root, "") : 0;
    if (rc || !warnings) {
        free(w.warnings);
        if (warnings) *warnings = NULL;
        return rc;
    }
    *warnings = w.warnings;
    return 0;
}
