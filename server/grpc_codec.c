/* grpc_codec.c - the gRPC transport's messages, apart from its
 * connections: a ModelInferRequest decoded into the struct kserve_request
 * HTTP fills (server/kserve.h), a result encoded as a ModelInferResponse,
 * gRPC's message framing, and grpc.health.v1's one-field request read
 * without generated code. Nothing here knows nghttp2 or the event loops,
 * so tests/fuzz/fuzz_grpc_message.c runs it on its own.
 *
 * Inputs come as raw_input_contents (the tensor's bytes, BYTES elements
 * length-prefixed) or typed contents (fp32_contents, int64_contents,
 * bytes_contents...); outputs go back as raw_output_contents, which is
 * what tritonclient.grpc reads. */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "server/grpc_impl.h"
#include "server/kserve.h"
#include "triton/grpc_service.pb-c.h"

/* As many tensors as an HTTP request may name. */
#define MAX_TENSORS 1024

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)

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

/* A tensor's parameter k when it is one of the shared-memory extension's:
 * stored in s. 0 also for any other key (left to the caller). */
static int shm_param(struct kserve_shm *s, const char *k, const Inference__InferParameter *v, const char *what,
                     const char *n, char *err, size_t err_len) {
    uint64_t x;
    if (strcmp(k, "shared_memory_region") == 0) {
        if (v->parameter_choice_case != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM || !v->string_param ||
            !*v->string_param)
            return INVALID("%s '%s': parameters.shared_memory_region must be a non-empty string", what, n);
        free(s->region);
        if (!(s->region = strdup(v->string_param))) return STATUS_NOMEM;
    } else if (strcmp(k, "shared_memory_byte_size") == 0 || strcmp(k, "shared_memory_offset") == 0) {
        if (param_uint(v, &x)) return INVALID("%s '%s': parameters.%s must be an integer >= 0", what, n, k);
        if (strcmp(k, "shared_memory_byte_size") == 0) s->byte_size = x;
        else s->offset = x;
    }
    return 0;
}

/* Whether input p names a shared-memory region. */
static int input_in_shm(const Inference__ModelInferRequest__InferInputTensor *p) {
    for (size_t i = 0; i < p->n_parameters; i++)
        if (p->parameters[i]->key && strcmp(p->parameters[i]->key, "shared_memory_region") == 0) return 1;
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
        } else if (strcmp(k, "sequence_id") == 0) {
            if (p->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM) {
                if (!p->string_param || !*p->string_param)
                    return INVALID("parameters.sequence_id must be a non-empty string or an integer > 0");
                if (!(r->seq_sid = strdup(p->string_param))) return STATUS_NOMEM;
            } else if (param_uint(p, &r->seq_id)) {
                return INVALID("parameters.sequence_id must be an integer >= 0 or a string");
            }
        } else if (strcmp(k, "sequence_start") == 0 || strcmp(k, "sequence_end") == 0) {
            if (p->parameter_choice_case != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM)
                return INVALID("parameters.%s must be true or false", k);
            *(k[9] == 's' ? &r->seq_start : &r->seq_end) = p->bool_param;
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
        struct tensor_str *s = calloc(n + 1, sizeof *s);
        for (size_t i = 0; s && i < n; i++)
            s[i] = (struct tensor_str){(const char *)c->bytes_contents[i].data, c->bytes_contents[i].len};
        int rc = s ? tensor_strings_pack(t, s) : STATUS_NOMEM;
        free(s);
        return rc;
    }
    if (tensor_alloc_data(t)) return STATUS_NOMEM;
    for (size_t i = 0; i < n; i++) put_typed(t->data, t->dtype, c, i);
    return 0;
}

static int decode_raw(struct kserve_input *in, const char *model, const ProtobufCBinaryData *raw, char *err,
                      size_t err_len) {
    struct tensor *t = &in->t;
    char sh[128];
    if (t->dtype == DT_STRING) {
        /* Triton's words for a count that is not the shape's, which its
         * clients' tests match (it names one element past the shape's for
         * too many: where it stopped reading). */
        int64_t have = tensor_strings_count(raw->data, raw->len), want = tensor_numel(t);
        if (have >= 0 && have < want)
            return INVALID("expected %lld string elements for inference input '%s' for model '%s', got %lld "
                           "(shape %s)", (long long)want, in->name, model, (long long)have,
                           tensor_shape_str(t, sh, sizeof sh));
        if (have > want)
            return INVALID("unexpected number of string elements %lld for inference input '%s' for model '%s', "
                           "expecting %lld (shape %s; the data holds %lld)", (long long)want + 1, in->name, model,
                           (long long)want, tensor_shape_str(t, sh, sizeof sh), (long long)have);
        char why[160];
        int rc = tensor_strings_from_prefixed(t, raw->data, raw->len, why, sizeof why);
        if (rc == STATUS_INVALID)
            return INVALID("input '%s' of shape %s: %s", in->name, tensor_shape_str(t, sh, sizeof sh), why);
        return rc;
    }
    int64_t numel = tensor_numel(t);
    size_t need = tensor_nbytes(t);
    if (numel == INT64_MAX || need != raw->len) /* Triton's words first: its clients' tests match them */
        return INVALID("input byte size mismatch for input '%s' for model '%s'. Expected %zu, got %zu "
                       "(raw_input_contents; shape %s of %s)", in->name, model, numel == INT64_MAX ? SIZE_MAX : need,
                       raw->len, tensor_shape_str(t, sh, sizeof sh), dtype_kserve_name(t->dtype));
    if (tensor_alloc_data(t)) return STATUS_NOMEM;
    if (need) memcpy(t->data, raw->data, need);
    return 0;
}

/* Name, data type and shape, then the data: raw when raw is not NULL. */
static int decode_input(struct kserve_input *in, const input_pb *p, const char *model, const ProtobufCBinaryData *raw,
                        int idx, char *err, size_t err_len) {
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
    for (size_t i = 0; i < p->n_parameters; i++) {
        const char *k = p->parameters[i]->key;
        int rc = k && p->parameters[i]->value ? shm_param(&in->shm, k, p->parameters[i]->value, "input", in->name, err,
                                                          err_len) : 0;
        if (rc) return rc;
    }
    int typed = p->contents && contents_count(p->contents) > 0;
    if (in->shm.region) {
        if (raw || typed)
            return INVALID("input '%s': has parameters.shared_memory_region and data in the message; send one", in->name);
        return 0;
    }
    if (raw && typed) return INVALID("input '%s': has both raw_input_contents and contents; send one", in->name);
    if (raw) return decode_raw(in, model, raw, err, err_len);
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
        } else {
            int rc = shm_param(&o->shm, k, v, "output", o->name, err, err_len);
            if (rc) return rc;
        }
    }
    if (o->shm.region && o->classification)
        return INVALID("output '%s': parameters.shared_memory_region and parameters.classification cannot both be set",
                       o->name);
    return 0;
}

/* Fills r from q. Errors name the field, as HTTP's do. */
int grpc_infer_request_decode(struct kserve_request *r, const Inference__ModelInferRequest *q, char *err, size_t err_len) {
    if (q->id && *q->id && !(r->id = strdup(q->id))) return STATUS_NOMEM;
    int rc = decode_params(r, q, err, err_len);
    if (rc) return rc;
    /* No inputs at all is left to the binding, which answers in Triton's
     * words ("expected 2 inputs but got 0 inputs ... Got input(s) []"). */
    if (q->n_inputs > MAX_TENSORS || q->n_outputs > MAX_TENSORS)
        return INVALID("a request may name at most %d inputs and %d outputs", MAX_TENSORS, MAX_TENSORS);
    /* raw_input_contents holds the inputs that are not in shared memory, in order. */
    size_t in_msg = 0;
    for (size_t i = 0; i < q->n_inputs; i++) in_msg += !input_in_shm(q->inputs[i]);
    if (q->n_raw_input_contents && q->n_raw_input_contents != in_msg)
        return INVALID("raw_input_contents has %zu entries for %zu inputs not in shared memory: give one per input, "
                       "or none", q->n_raw_input_contents, in_msg);
    r->binary_data_output = 1;
    r->inputs = calloc(q->n_inputs + 1, sizeof *r->inputs);
    r->outputs = calloc(q->n_outputs + 1, sizeof *r->outputs);
    if (!r->inputs || !r->outputs) return STATUS_NOMEM;
    for (size_t i = 0, next_raw = 0; i < q->n_inputs; i++) {
        const ProtobufCBinaryData *raw =
            q->n_raw_input_contents && !input_in_shm(q->inputs[i]) ? &q->raw_input_contents[next_raw++] : NULL;
        if ((rc = decode_input(&r->inputs[r->ninputs++], q->inputs[i], q->model_name ? q->model_name : "", raw, (int)i,
                               err, err_len)))
            return rc;
        for (int k = 0; k < r->ninputs - 1; k++)
            if (strcmp(r->inputs[k].name, r->inputs[i].name) == 0)
                return INVALID("input '%s' already exists in request (it appears twice in 'inputs')",
                               r->inputs[k].name);
    }
    for (size_t i = 0; i < q->n_outputs; i++) {
        if ((rc = decode_output(&r->outputs[r->noutputs++], q->outputs[i], (int)i, err, err_len))) return rc;
        for (int k = 0; k < r->noutputs - 1; k++)
            if (strcmp(r->outputs[k].name, r->outputs[i].name) == 0)
                return INVALID("output '%s' already exists in request (it appears twice in 'outputs')",
                               r->outputs[k].name);
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

typedef Inference__ModelInferResponse__InferOutputTensor__ParametersEntry output_param_pb;

/* An output written into shared memory: its metadata and the region's
 * parameters, and (as Triton) an empty raw_output_contents entry, so that
 * the others keep their places. */
static int encode_shm_output(output_pb *o, ProtobufCBinaryData *raw, const char *name, const struct tensor *t,
                             const struct kserve_shm *sm, struct grpc_pool *pool) {
    inference__model_infer_response__infer_output_tensor__init(o);
    o->name = (char *)name;
    o->datatype = (char *)dtype_kserve_name(t->dtype);
    o->n_shape = (size_t)t->ndim;
    o->shape = (int64_t *)t->dims;
    raw->data = NULL;
    raw->len = 0;
    int n = sm->offset ? 3 : 2;
    output_param_pb **pp = grpc_pool_alloc(pool, sizeof *pp * 3);
    output_param_pb *e = grpc_pool_alloc(pool, sizeof *e * 3);
    Inference__InferParameter *v = grpc_pool_alloc(pool, sizeof *v * 3);
    if (!pp || !e || !v) return STATUS_NOMEM;
    static const char *keys[] = {"shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"};
    for (int i = 0; i < n; i++) {
        inference__model_infer_response__infer_output_tensor__parameters_entry__init(&e[i]);
        inference__infer_parameter__init(&v[i]);
        e[i].key = (char *)keys[i];
        e[i].value = &v[i];
        pp[i] = &e[i];
    }
    v[0].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
    v[0].string_param = sm->region;
    v[1].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
    v[1].int64_param = (int64_t)(t->dtype == DT_STRING ? tensor_strings_prefixed_size(t) : tensor_nbytes(t));
    v[2].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
    v[2].int64_param = (int64_t)sm->offset;
    o->n_parameters = (size_t)n;
    o->parameters = pp;
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
        if (cls > 0 && r->outputs[i].classified.data) sel[i] = &r->outputs[i].classified;
        else if (cls > 0) {
            int rc = kserve_classify(&res->outputs[k], cls, mc, k, &owned[i]);
            if (rc) return rc;
            sel[i] = &owned[i];
        }
    }
    return 0;
}

/* The ModelInferResponse for res, framed (in a ModelStreamInferResponse when streaming). */
int grpc_infer_response_encode(const struct infer_result *res, int streaming, struct grpc_pool *pool, uint8_t **out,
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
        const struct kserve_shm *sm = r->noutputs ? &r->outputs[i].shm : NULL;
        if (sm && sm->region) rc = encode_shm_output(&outs[i], &raw[i], names[i], sel[i], sm, pool);
        else rc = encode_output(&outs[i], &raw[i], names[i], sel[i], pool);
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

/* ==== framing, message pools and grpc.health.v1 ========================== */

struct pool_block {
    struct pool_block *next;
    max_align_t data[];
};

void *grpc_pool_alloc(struct grpc_pool *p, size_t size) {
    struct pool_block *b = calloc(1, sizeof *b + size);
    if (!b) return NULL;
    b->next = p->blocks;
    p->blocks = b;
    return b->data;
}

char *grpc_pool_strdup(struct grpc_pool *p, const char *s) {
    size_t n = strlen(s) + 1;
    char *d = grpc_pool_alloc(p, n);
    if (d) memcpy(d, s, n);
    return d;
}

void grpc_pool_free(struct grpc_pool *p) {
    for (struct pool_block *b = p->blocks, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    p->blocks = NULL;
}

void grpc_prefix_write(uint8_t *h, int compressed, size_t n) {
    h[0] = (uint8_t)compressed;
    h[1] = (uint8_t)(n >> 24);
    h[2] = (uint8_t)(n >> 16);
    h[3] = (uint8_t)(n >> 8);
    h[4] = (uint8_t)n;
}

uint8_t *grpc_frame(const ProtobufCMessage *m, size_t *len) {
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = n <= UINT32_MAX ? malloc(n + 5) : NULL;
    if (!buf) return NULL;
    grpc_prefix_write(buf, 0, n);
    protobuf_c_message_pack(m, buf + 5);
    *len = n + 5;
    return buf;
}

/* A varint at *p (below end): 0, or -1 when it does not end in 10 bytes. */
static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return 0;
    }
    return -1;
}

/* grpc_strings_nul over [p, end), messages nested at most 64 deep. */
static const char *strings_nul(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end, int depth) {
    while (p < end && depth < 64) {
        uint64_t key, n;
        if (read_varint(&p, end, &key)) return NULL;
        switch (key & 7) {
        case 0: if (read_varint(&p, end, &n)) return NULL; break;
        case 1: if (end - p < 8) return NULL; p += 8; break;
        case 5: if (end - p < 4) return NULL; p += 4; break;
        case 2: {
            if (read_varint(&p, end, &n) || n > (uint64_t)(end - p)) return NULL;
            const ProtobufCFieldDescriptor *f =
                key >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)n)) return f->name;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                const char *bad = strings_nul(f->descriptor, p, p + n, depth + 1);
                if (bad) return bad;
            }
            p += n;
            break;
        }
        default: return NULL; /* groups and reserved wire types: the unpack refuses them */
        }
    }
    return NULL;
}

const char *grpc_strings_nul(const ProtobufCMessageDescriptor *d, const uint8_t *msg, size_t len) {
    return strings_nul(d, msg, msg + len, 0);
}

int grpc_health_request_service(const uint8_t *msg, size_t len, const uint8_t **service, size_t *service_len) {
    const uint8_t *p = msg, *end = msg + len;
    *service = msg;
    *service_len = 0;
    while (p < end) {
        uint64_t key, n;
        if (read_varint(&p, end, &key) || key >> 3 == 0 || key >> 3 > 0x1fffffff) return -1;
        switch (key & 7) {
        case 0: if (read_varint(&p, end, &n)) return -1; break;
        case 1: if (end - p < 8) return -1; p += 8; break;
        case 5: if (end - p < 4) return -1; p += 4; break;
        case 2:
            if (read_varint(&p, end, &n) || n > (uint64_t)(end - p)) return -1;
            if (key >> 3 == 1) {  /* string service = 1: the last one wins */
                *service = p;
                *service_len = (size_t)n;
            }
            p += n;
            break;
        default: return -1;  /* groups and reserved wire types */
        }
    }
    return 0;
}
