/* kserve.h - the KServe v2 inference request/response codec.
 *
 * A request body is a JSON header, optionally followed by raw tensor bytes
 * (the binary tensor data extension): header_len is the value of the
 * Inference-Header-Content-Length header, or -1 when absent (the whole body is
 * JSON). kserve_request_parse decodes everything the body says into tensors
 * without knowing the model; kserve_request_bind then checks the request
 * against a model's configuration (names, data types, shapes with -1
 * wildcards, batch size) and orders the inputs as the model wants them.
 *
 * Every error is STATUS_INVALID (or STATUS_NOT_FOUND for an unknown output)
 * with a message that names the field. Nothing here touches the network or
 * libevent, so the parser can be unit-tested and fuzzed alone.
 *
 * Threads: no shared state; a request belongs to one thread at a time.
 *
 * Three files implement it: kserve_read.c (kserve_request_parse, _clear,
 * kserve_parse_header_length, the request memory bound), kserve_bind.c (kserve_request_bind) and kserve_encode.c (the
 * answer, kserve_classify, the JSON string helpers); kserve_impl.h is what
 * they share. */
#ifndef KILN_KSERVE_H
#define KILN_KSERVE_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/tensor.h"

struct model_config;
struct shm_region;

/* Triton's system shared-memory extension: a tensor's bytes in a registered
 * region (server/shm.h) rather than in the message. The codec reads the
 * parameters; the inference core resolves them (server/infer_shm.h). */
struct kserve_shm {
    char *region;           /* parameters.shared_memory_region; NULL = not in shared memory */
    uint64_t offset;        /* parameters.shared_memory_offset */
    uint64_t byte_size;     /* parameters.shared_memory_byte_size */
    struct shm_region *ref; /* held from resolving until the request is cleared */
    void *addr;             /* the tensor's bytes: [offset, offset + byte_size) of the region */
};

struct kserve_input {
    char *name;
    struct tensor t;        /* dtype, shape and data (owned, common/tensor.h's layout) */
    size_t binary_size;     /* parameters.binary_data_size, when binary */
    int binary;
    struct kserve_shm shm;
};

struct kserve_output {
    char *name;
    int binary;             /* parameters.binary_data; -1 = not said (request default) */
    int classification;     /* parameters.classification: top-k; 0 = off */
    struct kserve_shm shm;  /* the answer goes into this region instead of the message */
    /* The classification already made (an owned BYTES tensor, data NULL
     * when not): the inference core makes it on the instance thread that
     * computed the output, so a large top-k does not hold the request's I/O
     * thread; the encoders use it instead of classifying again. */
    struct tensor classified;
};

/* What a request holds in itself: one input and short names need no
 * allocation. Kept small: the inference core's request, which holds this
 * one, stays within the size malloc serves from its per-thread cache
 * (glibc's tcache, up to 1032 bytes). */
#define KSERVE_INLINE_INPUTS 1
#define KSERVE_INLINE_STRINGS 64

struct kserve_request {
    char *id;               /* NULL when the request had none */
    int64_t priority;       /* parameters.priority; 0 = default */
    uint64_t timeout_us;    /* parameters.timeout; 0 = none */
    int binary_data_output; /* parameters.binary_data_output */
    int no_cache;           /* parameters.cache == false: bypass the result cache */
    /* The sequence batcher's parameters: sequence_id (an integer, or a
     * string in seq_sid), sequence_start, sequence_end; a model without
     * sequence_batching ignores them, as Triton does. */
    uint64_t seq_id;
    char *seq_sid;          /* NULL: the id is seq_id */
    int seq_start, seq_end;
    struct kserve_input *inputs;
    int ninputs;
    int raw;                /* a raw binary request: inputs[0] is the body as one BYTES element */
    struct kserve_output *outputs; /* empty = every output */
    int noutputs;
    /* Room the fields above may point into (inputs, the names, id): a
     * parsed request is not copied, only cleared. */
    struct kserve_input inputs_l[KSERVE_INLINE_INPUTS];
    char strings_l[KSERVE_INLINE_STRINGS];
    size_t strings_used;
};

/* Parses a request body. On error, r is left cleared. A tensor's element
 * count is bounded by what the body holds. An input in shared memory is
 * left without data (t.data NULL) for the core to resolve. JSON numbers
 * are read exactly: INT64 and UINT64 data over their whole range.
 *
 * header_len 0 is Triton's raw binary request: the whole body is the bytes
 * of the model's one input, with no JSON; r->raw is set, inputs[0] holds
 * the bytes as one BYTES element with no name, and kserve_request_bind
 * gives them the model's input (its datatype; its shape, batch 1, with at
 * most one variable dim found from the byte count; a BYTES input takes the
 * body as its one element). Every output is then answered as binary. */
int kserve_request_parse(struct kserve_request *r, const void *body, size_t len, int64_t header_len,
                         char *err, size_t err_len);
/* Frees what r owns and drops its shared-memory references. */
void kserve_request_clear(struct kserve_request *r);

/* A request that names no output, for a model with hidden outputs
 * (sequence_batching's state): the visible outputs are listed in r, as if
 * it had named them, so that the encoders send those only. 0 or
 * STATUS_NOMEM. */
int kserve_request_name_outputs(struct kserve_request *r, const struct model_config *mc);

/* Parses the Inference-Header-Content-Length header value (a non-negative
 * decimal integer); returns 0 or STATUS_INVALID with err naming the header. */
int kserve_parse_header_length(const char *value, int64_t *out, char *err, size_t err_len);

/* Checks r against the model configuration (whose inputs and outputs are in
 * the model's order; for a raw binary request, see above) and fills
 * ordered[mc->ninputs] with borrowed views of r's tensors (in the shape of
 * the input's reshape where it has one; an optional input left out is a
 * view of its default, mc's dflt) and *rows with the batch size (1 when the
 * model does not batch). Also checks the requested outputs exist. This is the one check of
 * a request's inputs on the server's path: the batcher and the model take
 * what it accepts as it is (every dim within MODEL_MAX_DIM included). */
int kserve_request_bind(const struct kserve_request *r, const struct model_config *mc,
                        struct tensor *ordered, int64_t *rows, char *err, size_t err_len);

/* Turns each output that has a reshape in mc from the model's shape to the
 * one clients see (the config's dims), in place: dims only, the data stays. */
void kserve_reshape_outputs(const struct model_config *mc, struct tensor *outputs);

/* Encodes the response for r given every model output (outputs[mc->noutputs],
 * in the model's order). r is a request kserve_request_bind accepted for mc:
 * the outputs it asks for are not checked again here. body receives the JSON
 * header followed by the binary outputs; *json_len is the header's length,
 * equal to body->len when there is no binary output (the response is then
 * plain application/json). */
int kserve_response_encode(const struct kserve_request *r, const struct model_config *mc,
                           const char *model_name, const char *model_version,
                           const struct tensor *outputs, struct buf *body, size_t *json_len,
                           char *err, size_t err_len);

/* A binary output that kserve_response_encode_spliced left out of the body:
 * its wire bytes are its tensor's own block as it is (outputs[output].data,
 * len bytes), sent at offset `at` of the body. */
struct kserve_splice {
    int output;             /* the model's index, in outputs[] */
    size_t at;
    size_t len;
};

/* kserve_response_encode, except that up to max_splices binary outputs whose
 * wire bytes are their tensor's block (neither BYTES nor a classification)
 * are not copied into body but listed in splices (*nsplices, in body order),
 * so that a transport can send them from the tensors themselves. */
int kserve_response_encode_spliced(const struct kserve_request *r, const struct model_config *mc,
                                   const char *model_name, const char *model_version,
                                   const struct tensor *outputs, struct buf *body, size_t *json_len,
                                   struct kserve_splice *splices, int max_splices, int *nsplices,
                                   char *err, size_t err_len);

/* The classification extension's answer for output `index` of mc, whose
 * tensor is in: each row's top k as BYTES "value:index[:label]", in a new
 * owned tensor (tensor_free_data). 0 or STATUS_NOMEM. */
int kserve_classify(const struct tensor *in, int k, const struct model_config *mc, int index, struct tensor *out);

/* The most one request may make the codec hold: its input tensors and
 * decoded strings while parsing, an answer while encoding (a larger one is
 * refused, STATUS_INVALID naming the output). 0 = no bound (the default).
 * Set once at start, before any I/O thread runs. */
void kserve_set_max_request_memory(size_t bytes);

/* Appends s to b as a JSON string literal (quotes included). */
void kserve_buf_json_string(struct buf *b, const char *s, size_t n);
/* {"error": msg} */
void kserve_error_body(struct buf *b, const char *msg);

#endif
