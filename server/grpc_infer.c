/* grpc_infer.c - ModelInfer and ModelStreamInfer through the inference core.
 *
 * A ModelInferRequest is decoded into the same struct kserve_request HTTP
 * fills (server/kserve.h), so the core checks it the same way (names, data
 * types, shapes: kserve_request_bind's messages) and runs it through the
 * same cache, batcher and statistics. Inputs come as raw_input_contents
 * (the tensor's bytes, BYTES elements length-prefixed) or typed contents
 * (fp32_contents, int64_contents, bytes_contents...); outputs go back as
 * raw_output_contents, which is what tritonclient.grpc reads.
 *
 * A streaming call may have many requests in the core at once; each answer
 * is a ModelStreamInferResponse sent as it finishes, an error as its
 * error_message, and the stream ends once the client half-closed and the
 * last one answered. */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/status.h"
#include "server/grpc_impl.h"
#include "server/kserve.h"
#include "triton/grpc_service.pb-c.h"

/* As many tensors as an HTTP request may name. */
#define MAX_TENSORS 1024

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)

/* One request in the core: the reply interface's ctx. */
struct grpc_infer {
    struct grpc_stream *st;      /* NULL once the stream is gone */
    struct grpc_loop *loop;
    struct infer_request *r;
    int streaming;
    uint64_t deadline_ns;        /* the stream's grpc-timeout; 0 = none */
    uint8_t *reply;              /* the framed answer, between encode and send */
    size_t reply_len;
    struct grpc_infer *next, *prev;
};

/* ==== decoding =========================================================== */

typedef Inference__ModelInferRequest__InferInputTensor input_pb;
typedef Inference__InferTensorContents contents_pb;

/* An integer parameter: int64_param or uint64_param. -1 when it is another type. */
static int param_uint(const Inference__InferParameter *p, uint64_t *out) {
    if (p->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM) *out = p->uint64_param;
    else if (p->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM &&
             p->int64_param >= 0)
        *out = (uint64_t)p->int64_param;
    else return -1;
    return 0;
}

static int decode_params(struct kserve_request *r, const Inference__ModelInferRequest *q, char *err, size_t err_len) {
    for (size_t i = 0; i < q->n_parameters; i++) {
        const char *k = q->parameters[i]->key;
        const Inference__InferParameter *p = q->parameters[i]->value;
        uint64_t v;
        if (!k || !p) continue;
        if (strcmp(k, "priority") == 0) {
            if (param_uint(p, &v)) return INVALID("parameters.priority must be an integer >= 0");
            r->priority = (int64_t)(v > 1000000 ? 1000000 : v);
        } else if (strcmp(k, "timeout") == 0) {
            if (param_uint(p, &v)) return INVALID("parameters.timeout must be an integer >= 0");
            r->timeout_us = v;
        } else if (strcmp(k, "cache") == 0) {
            if (p->parameter_choice_case != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM)
                return INVALID("parameters.cache must be true or false");
            r->no_cache = !p->bool_param;
        }
    }
    return 0;
}

/* Which typed field carries a data type, and how many elements it holds. */
static const char *typed_field(const contents_pb *c, enum dtype dt, size_t *n) {
    switch (dt) {
    case DT_BOOL: *n = c->n_bool_contents; return "bool_contents";
    case DT_INT8: case DT_INT16: case DT_INT32: *n = c->n_int_contents; return "int_contents";
    case DT_INT64: *n = c->n_int64_contents; return "int64_contents";
    case DT_UINT8: case DT_UINT16: case DT_UINT32: *n = c->n_uint_contents; return "uint_contents";
    case DT_UINT64: *n = c->n_uint64_contents; return "uint64_contents";
    case DT_FP32: *n = c->n_fp32_contents; return "fp32_contents";
    case DT_FP64: *n = c->n_fp64_contents; return "fp64_contents";
    case DT_STRING: *n = c->n_bytes_contents; return "bytes_contents";
    default: *n = 0; return NULL;
    }
}

static size_t contents_count(const contents_pb *c) {
    return c->n_bool_contents + c->n_int_contents + c->n_int64_contents + c->n_uint_contents + c->n_uint64_contents +
           c->n_fp32_contents + c->n_fp64_contents + c->n_bytes_contents;
}

/* Element i of the typed field, stored as the tensor's data type. */
static void put_typed(void *d, enum dtype dt, const contents_pb *c, size_t i) {
    switch (dt) {
    case DT_BOOL: ((uint8_t *)d)[i] = c->bool_contents[i] != 0; break;
    case DT_INT8: ((int8_t *)d)[i] = (int8_t)c->int_contents[i]; break;
    case DT_INT16: ((int16_t *)d)[i] = (int16_t)c->int_contents[i]; break;
    case DT_INT32: ((int32_t *)d)[i] = c->int_contents[i]; break;
    case DT_INT64: ((int64_t *)d)[i] = c->int64_contents[i]; break;
    case DT_UINT8: ((uint8_t *)d)[i] = (uint8_t)c->uint_contents[i]; break;
    case DT_UINT16: ((uint16_t *)d)[i] = (uint16_t)c->uint_contents[i]; break;
    case DT_UINT32: ((uint32_t *)d)[i] = c->uint_contents[i]; break;
    case DT_UINT64: ((uint64_t *)d)[i] = c->uint64_contents[i]; break;
    case DT_FP32: ((float *)d)[i] = c->fp32_contents[i]; break;
    case DT_FP64: ((double *)d)[i] = c->fp64_contents[i]; break;
    default: break;
    }
}

static int decode_typed(struct kserve_input *in, const contents_pb *c, char *err, size_t err_len) {
    struct tensor *t = &in->t;
    size_t n;
    char sh[128];
    const char *field = typed_field(c, t->dtype, &n);
    if (!field)
        return INVALID("input '%s': datatype %s cannot be sent in 'contents'; use raw_input_contents", in->name,
                       dtype_kserve_name(t->dtype));
    if (contents_count(c) != n)
        return INVALID("input '%s': data of datatype %s goes in contents.%s, and only there", in->name,
                       dtype_kserve_name(t->dtype), field);
    int64_t numel = tensor_numel(t);
    if ((int64_t)n != numel)
        return INVALID("input '%s': contents.%s has %zu elements but shape %s needs %lld", in->name, field, n,
                       tensor_shape_str(t, sh, sizeof sh), (long long)numel);
    if (t->dtype == DT_STRING) {
        const char **s = calloc(n + 1, sizeof *s);
        size_t *len = calloc(n + 1, sizeof *len);
        for (size_t i = 0; s && len && i < n; i++) {
            s[i] = (const char *)c->bytes_contents[i].data;
            len[i] = c->bytes_contents[i].len;
        }
        int rc = s && len ? tensor_strings_pack(t, s, len) : STATUS_NOMEM;
        free(s);
        free(len);
        return rc;
    }
    if (tensor_alloc_data(t)) return STATUS_NOMEM;
    for (size_t i = 0; i < n; i++) put_typed(t->data, t->dtype, c, i);
    return 0;
}

static int decode_raw(struct kserve_input *in, const ProtobufCBinaryData *raw, char *err, size_t err_len) {
    struct tensor *t = &in->t;
    char sh[128];
    if (t->dtype == DT_STRING) {
        char why[160];
        int rc = tensor_strings_from_prefixed(t, raw->data, raw->len, why, sizeof why);
        if (rc == STATUS_INVALID)
            return INVALID("input '%s' of shape %s: %s", in->name, tensor_shape_str(t, sh, sizeof sh), why);
        return rc;
    }
    int64_t numel = tensor_numel(t);
    size_t need = tensor_nbytes(t);
    if (numel == INT64_MAX || need != raw->len)
        return INVALID("input '%s': raw_input_contents has %zu bytes but shape %s of %s needs %zu bytes", in->name,
                       raw->len, tensor_shape_str(t, sh, sizeof sh), dtype_kserve_name(t->dtype),
                       numel == INT64_MAX ? SIZE_MAX : need);
    if (tensor_alloc_data(t)) return STATUS_NOMEM;
    if (need) memcpy(t->data, raw->data, need);
    return 0;
}

/* Name, data type and shape, then the data: raw when raw is not NULL. */
static int decode_input(struct kserve_input *in, const input_pb *p, const ProtobufCBinaryData *raw, int idx,
                        char *err, size_t err_len) {
    if (!p->name || !*p->name) return INVALID("inputs[%d]: 'name' must be a non-empty string", idx);
    if (!(in->name = strdup(p->name))) return STATUS_NOMEM;
    in->t.dtype = dtype_from_kserve(p->datatype ? p->datatype : "");
    if (in->t.dtype == DT_UNDEFINED)
        return INVALID("input '%s': datatype '%.32s' is not one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, "
                       "INT32, INT64, FP16, BF16, FP32, FP64, BYTES", in->name, p->datatype ? p->datatype : "");
    if (p->n_shape > TENSOR_MAX_DIMS) return INVALID("input '%s': 'shape' has more than %d dims", in->name, TENSOR_MAX_DIMS);
    for (size_t d = 0; d < p->n_shape; d++) {
        if (p->shape[d] < 0) return INVALID("input '%s': shape[%zu] must be an integer >= 0", in->name, d);
        in->t.dims[in->t.ndim++] = p->shape[d];
    }
    for (size_t i = 0; i < p->n_parameters; i++)
        if (p->parameters[i]->key && strcmp(p->parameters[i]->key, "shared_memory_region") == 0)
            return INVALID("input '%s': parameters.shared_memory_region: shared memory is not supported by kiln",
                           in->name);
    int typed = p->contents && contents_count(p->contents) > 0;
    if (raw && typed) return INVALID("input '%s': has both raw_input_contents and contents; send one", in->name);
    if (raw) return decode_raw(in, raw, err, err_len);
    if (p->contents) return decode_typed(in, p->contents, err, err_len);
    return INVALID("input '%s': has neither raw_input_contents nor contents", in->name);
}

static int decode_output(struct kserve_output *o, const Inference__ModelInferRequest__InferRequestedOutputTensor *p,
                         int idx, char *err, size_t err_len) {
    if (!p->name || !*p->name) return INVALID("outputs[%d]: 'name' must be a non-empty string", idx);
    if (!(o->name = strdup(p->name))) return STATUS_NOMEM;
    o->binary = 1;
    for (size_t i = 0; i < p->n_parameters; i++) {
        const char *k = p->parameters[i]->key;
        const Inference__InferParameter *v = p->parameters[i]->value;
        uint64_t x;
        if (!k || !v) continue;
        if (strcmp(k, "classification") == 0) {
            if (param_uint(v, &x) || x > 1000000)
                return INVALID("output '%s': parameters.classification must be an integer >= 0", o->name);
            o->classification = (int)x;
        } else if (strcmp(k, "shared_memory_region") == 0)
            return INVALID("output '%s': parameters.shared_memory_region: shared memory is not supported by kiln",
                           o->name);
    }
    return 0;
}

/* Fills r from q. Errors name the field, as HTTP's do. */
static int decode(struct kserve_request *r, const Inference__ModelInferRequest *q, char *err, size_t err_len) {
    if (q->id && *q->id && !(r->id = strdup(q->id))) return STATUS_NOMEM;
    int rc = decode_params(r, q, err, err_len);
    if (rc) return rc;
    if (q->n_inputs == 0) return INVALID("field 'inputs' is empty");
    if (q->n_inputs > MAX_TENSORS || q->n_outputs > MAX_TENSORS)
        return INVALID("a request may name at most %d inputs and %d outputs", MAX_TENSORS, MAX_TENSORS);
    if (q->n_raw_input_contents && q->n_raw_input_contents != q->n_inputs)
        return INVALID("raw_input_contents has %zu entries for %zu inputs: give one per input, or none",
                       q->n_raw_input_contents, q->n_inputs);
    r->binary_data_output = 1;
    r->inputs = calloc(q->n_inputs, sizeof *r->inputs);
    r->outputs = calloc(q->n_outputs + 1, sizeof *r->outputs);
    if (!r->inputs || !r->outputs) return STATUS_NOMEM;
    for (size_t i = 0; i < q->n_inputs; i++) {
        const ProtobufCBinaryData *raw = q->n_raw_input_contents ? &q->raw_input_contents[i] : NULL;
        if ((rc = decode_input(&r->inputs[r->ninputs++], q->inputs[i], raw, (int)i, err, err_len))) return rc;
        for (int k = 0; k < r->ninputs - 1; k++)
            if (strcmp(r->inputs[k].name, r->inputs[i].name) == 0)
                return INVALID("input '%s' appears twice in 'inputs'", r->inputs[k].name);
    }
    for (size_t i = 0; i < q->n_outputs; i++) {
        if ((rc = decode_output(&r->outputs[r->noutputs++], q->outputs[i], (int)i, err, err_len))) return rc;
        for (int k = 0; k < r->noutputs - 1; k++)
            if (strcmp(r->outputs[k].name, r->outputs[i].name) == 0)
                return INVALID("output '%s' appears twice in 'outputs'", r->outputs[k].name);
    }
    return 0;
}

/* ==== encoding =========================================================== */

typedef Inference__ModelInferResponse__InferOutputTensor output_pb;

/* One output: its metadata in o, its bytes in raw (borrowed from t, or
 * made in the pool for BYTES). */
static int encode_output(output_pb *o, ProtobufCBinaryData *raw, const char *name, const struct tensor *t,
                         struct grpc_pool *pool) {
    inference__model_infer_response__infer_output_tensor__init(o);
    o->name = (char *)name;
    o->datatype = (char *)dtype_kserve_name(t->dtype);
    o->n_shape = (size_t)t->ndim;
    o->shape = (int64_t *)t->dims;
    if (t->dtype != DT_STRING) {
        raw->data = t->data;
        raw->len = tensor_nbytes(t);
        return 0;
    }
    size_t n = tensor_strings_prefixed_size(t);
    raw->data = n != SIZE_MAX ? grpc_pool_alloc(pool, n + 1) : NULL;
    if (!raw->data) return STATUS_NOMEM;
    tensor_strings_prefixed_write(t, raw->data);
    raw->len = n;
    return 0;
}

/* The outputs the request asked for (all when it named none), in its order;
 * classified ones are new tensors in owned[]. */
static int select_outputs(const struct infer_result *res, const struct tensor **sel, struct tensor *owned,
                          const char **names, int nsel, char *err, size_t err_len) {
    const struct kserve_request *r = res->request;
    const struct model_config *mc = res->config;
    for (int i = 0; i < nsel; i++) {
        int k = r->noutputs ? model_config_find_output(mc, r->outputs[i].name) : i;
        if (k < 0)
            return status_set(err, err_len, STATUS_INVALID, "unexpected inference output '%s' for model '%s'",
                              r->outputs[i].name, mc->name);
        names[i] = mc->outputs[k].name;
        sel[i] = &res->outputs[k];
        int cls = r->noutputs ? r->outputs[i].classification : 0;
        if (cls > 0) {
            int rc = kserve_classify(&res->outputs[k], cls, mc, k, &owned[i]);
            if (rc) return rc;
            sel[i] = &owned[i];
        }
    }
    return 0;
}

/* The ModelInferResponse for res, framed (in a ModelStreamInferResponse when streaming). */
static int encode_response(const struct infer_result *res, int streaming, struct grpc_pool *pool, uint8_t **out,
                           size_t *out_len, char *err, size_t err_len) {
    const struct kserve_request *r = res->request;
    int nsel = r->noutputs ? r->noutputs : res->config->noutputs;
    const struct tensor **sel = grpc_pool_alloc(pool, sizeof *sel * (size_t)(nsel + 1));
    struct tensor *owned = grpc_pool_alloc(pool, sizeof *owned * (size_t)(nsel + 1));
    const char **names = grpc_pool_alloc(pool, sizeof *names * (size_t)(nsel + 1));
    output_pb *outs = grpc_pool_alloc(pool, sizeof *outs * (size_t)(nsel + 1));
    output_pb **outp = grpc_pool_alloc(pool, sizeof *outp * (size_t)(nsel + 1));
    ProtobufCBinaryData *raw = grpc_pool_alloc(pool, sizeof *raw * (size_t)(nsel + 1));
    if (!sel || !owned || !names || !outs || !outp || !raw) return STATUS_NOMEM;
    int rc = select_outputs(res, sel, owned, names, nsel, err, err_len);
    for (int i = 0; !rc && i < nsel; i++) {
        outp[i] = &outs[i];
        rc = encode_output(&outs[i], &raw[i], names[i], sel[i], pool);
    }
    if (!rc) {
        Inference__ModelInferResponse m = INFERENCE__MODEL_INFER_RESPONSE__INIT;
        m.model_name = (char *)res->model_name;
        m.model_version = (char *)res->model_version;
        m.id = r->id ? r->id : "";
        m.n_outputs = m.n_raw_output_contents = (size_t)nsel;
        m.outputs = outp;
        m.raw_output_contents = raw;
        Inference__ModelStreamInferResponse sm = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
        sm.infer_response = &m;
        *out = grpc_frame(streaming ? &sm.base : &m.base, out_len);
        if (!*out) rc = STATUS_NOMEM;
    }
    for (int i = 0; i < nsel; i++) tensor_free_data(&owned[i]);
    return rc;
}

/* ==== the reply interface ================================================ */

static void infer_post(void *thread, void (*fn)(void *), void *arg) {
    struct grpc_loop *l = thread;
    http_server_post(l->srv->http, l->index, fn, arg);
}

static int infer_encode(void *ctx, const struct infer_result *res, char *err, size_t err_len) {
    struct grpc_infer *c = ctx;
    struct grpc_pool pool = {0};
    int rc = encode_response(res, c->streaming, &pool, &c->reply, &c->reply_len, err, err_len);
    grpc_pool_free(&pool);
    if (rc == STATUS_NOMEM) status_set(err, err_len, rc, "out of memory encoding the response");
    return rc;
}

static void call_unlink(struct grpc_infer *c) {
    struct grpc_stream *st = c->st;
    if (c->prev) c->prev->next = c->next;
    else st->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    st->ncalls--;
}

/* A streaming call's error is a message of the stream, not its end. */
static void stream_error(struct grpc_stream *st, const char *msg) {
    Inference__ModelStreamInferResponse sm = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    sm.error_message = (char *)msg;
    size_t len;
    uint8_t *buf = grpc_frame(&sm.base, &len);
    if (buf) grpc_stream_queue(st, buf, len);
}

static void infer_send(void *ctx, int status, const char *msg) {
    struct grpc_infer *c = ctx;
    struct grpc_stream *st = c->st;
    uint8_t *reply = c->reply;
    size_t len = c->reply_len;
    int streaming = c->streaming;
    /* Dropped in the queue at the client's deadline: Triton's DEADLINE_EXCEEDED. */
    int late = status == STATUS_UNAVAILABLE && c->deadline_ns && clock_now_ns() >= c->deadline_ns;
    if (st) call_unlink(c);
    free(c);
    if (!st) {
        free(reply);
        return;
    }
    if (!streaming) {
        if (status) {
            free(reply);
            grpc_stream_finish(st, late ? GRPC_DEADLINE_EXCEEDED : grpc_code_of(status), msg);
            return;
        }
        grpc_stream_queue(st, reply, len);
        grpc_stream_finish(st, GRPC_OK, NULL);
        return;
    }
    if (status) {
        free(reply);
        stream_error(st, msg);
    } else grpc_stream_queue(st, reply, len);
    if (st->remote_done && st->ncalls == 0) grpc_stream_finish(st, GRPC_OK, NULL);
    else grpc_stream_flush(st);
}

static const struct infer_reply_i grpc_infer_reply = {infer_post, infer_encode, infer_send};

/* ==== the RPCs =========================================================== */

static void start(struct grpc_stream *st, const uint8_t *msg, size_t len, int streaming) {
    grpc_server_t *s = grpc_stream_server(st);
    Inference__ModelInferRequest *q = inference__model_infer_request__unpack(NULL, len, msg);
    if (!q) {
        if (streaming) stream_error(st, "the request is not a valid ModelInferRequest message");
        else grpc_stream_errorf(st, GRPC_INVALID_ARGUMENT, "the request is not a valid ModelInferRequest message");
        return;
    }
    char err[512];
    int status = 0;
    int64_t version = 0;
    if (q->model_version && *q->model_version) {
        char *end;
        long long v = strtoll(q->model_version, &end, 10);
        version = *end || v < 1 ? -1 : v;
    }
    if (version < 0)
        status = status_set(err, sizeof err, STATUS_INVALID, "version '%.100s' of model '%.200s' is not a positive integer",
                            q->model_version, q->model_name);
    else if (http_server_draining(s->http))
        status = status_set(err, sizeof err, STATUS_UNAVAILABLE,
                            "the server is shutting down: no new requests are accepted");
    struct grpc_infer *c = status ? NULL : calloc(1, sizeof *c);
    if (!status && !c) status = status_set(err, sizeof err, STATUS_NOMEM, "out of memory");
    struct grpc_loop *l = grpc_stream_loop(st);
    if (c) {
        *c = (struct grpc_infer){.st = st, .loop = l, .streaming = streaming, .deadline_ns = st->deadline_ns};
        c->r = infer_request_begin(s->core, q->model_name ? q->model_name : "", version, &grpc_infer_reply, c, l,
                                   http_server_loop_redis(s->http, l->index), &status, err, sizeof err);
        if (!c->r) {
            free(c);
            c = NULL;
        }
    }
    if (!c) {
        inference__model_infer_request__free_unpacked(q, NULL);
        if (streaming) stream_error(st, err);
        else grpc_stream_finish(st, grpc_code_of(status), err);
        return;
    }
    c->next = st->calls;
    if (st->calls) st->calls->prev = c;
    st->calls = c;
    st->ncalls++;
    infer_request_set_deadline(c->r, c->deadline_ns);
    int rc = decode(infer_request_decoded(c->r), q, err, sizeof err);
    inference__model_infer_request__free_unpacked(q, NULL);
    if (rc) infer_request_fail(c->r, rc, err);
    else infer_request_start(c->r);
}

void grpc_model_infer(struct grpc_stream *st, const uint8_t *msg, size_t len) { start(st, msg, len, 0); }

void grpc_model_stream_infer(struct grpc_stream *st, const uint8_t *msg, size_t len) { start(st, msg, len, 1); }

void grpc_infer_stream_done(struct grpc_stream *st) {
    if (st->ncalls == 0) grpc_stream_finish(st, GRPC_OK, NULL);
}

void grpc_infer_detach(struct grpc_stream *st) {
    for (struct grpc_infer *c = st->calls; c; c = c->next) {
        c->st = NULL;
        infer_request_cancel(c->r);
    }
    st->calls = NULL;
    st->ncalls = 0;
}
