/* model_config.h - a model's configuration: Triton's ModelConfig as JSON.
 *
 * <repo>/<model>/config.json uses Triton's field names (name, platform,
 * max_batch_size, input/output with data_type "TYPE_FP32" and dims without the
 * batch dim, version_policy, dynamic_batching, instance_group, response_cache).
 * The file is optional: model_config_complete() fills what is missing from the
 * ONNX model's inputs and outputs the way Triton's auto-complete does, and
 * checks what the file says against the model, naming the field that is wrong.
 *
 * A struct model_config is a plain value: it owns its strings and arrays and
 * is freed with model_config_clear(). */
#ifndef KILN_MODEL_CONFIG_H
#define KILN_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "common/tensor.h"

struct model_io;
typedef struct cJSON cJSON;

#define MODEL_CONFIG_MAX_VERSIONS 64
/* max_batch_size given to a model whose first dims are symbolic and whose
 * config does not say (Triton's auto-complete uses the same idea). */
#define MODEL_CONFIG_DEFAULT_MAX_BATCH 32
/* Limits on dynamic batching, checked here and relied on by the batcher
 * (server/batcher.h): max_batch_size (and so every batch size: preferred
 * sizes, warmup batch sizes) at most MODEL_CONFIG_MAX_BATCH_SIZE; at most
 * MODEL_CONFIG_MAX_PREFERRED preferred sizes; priority_levels and
 * default_priority_level at most MODEL_CONFIG_MAX_PRIORITIES. */
#define MODEL_CONFIG_MAX_BATCH_SIZE (1 << 20)
#define MODEL_CONFIG_MAX_PREFERRED 16
#define MODEL_CONFIG_MAX_PRIORITIES 16

struct model_config_io {
    char *name;
    enum dtype dtype;
    int ndim;                       /* -1 = not known yet */
    int64_t dims[TENSOR_MAX_DIMS];  /* without the batch dim when max_batch_size > 0; -1 = any */
    /* Triton's reshape.shape: the shape the model takes or gives, where dims
     * is the one clients send or see (same elements; without the batch dim
     * when max_batch_size > 0; at most one -1 in each, worked out from the
     * element count). -1 = no reshape; 0 = one value per row. */
    int reshape_ndim;
    int64_t reshape[TENSOR_MAX_DIMS];
    int optional;                   /* inputs: a request may leave it out */
    /* An optional input's default: the model's initializer for it, owned
     * by the model (server/repository.c sets it); NULL: none. */
    const struct tensor *dflt;
    /* A sequence model's control or state input, or state output
     * (sequence_batching): the server fills or keeps it, so clients
     * neither send nor see it (metadata, the config they read, answers). */
    int hidden;
    char *label_filename;           /* outputs: labels for classification, one per line */
    char **labels;                  /* loaded by model_config_load_labels */
    int nlabels;
};

/* model_warmup, as Triton has it: samples run on every instance while the
 * model loads, before it is ready, so that no request pays for building a
 * plan. Each input's data is zeros, random values or a file in the model's
 * warmup/ folder (raw row-major bytes; strings as 4-byte little-endian
 * lengths each followed by its bytes). */
enum warmup_source { WARMUP_ZERO = 0, WARMUP_RANDOM = 1, WARMUP_FILE = 2 };

struct model_warmup_input {
    char *name;
    enum dtype dtype;
    int ndim;
    int64_t dims[TENSOR_MAX_DIMS];  /* without the batch dim when max_batch_size > 0 */
    enum warmup_source source;
    char *file;                     /* WARMUP_FILE: a file name in <model>/warmup/ */
};

struct model_warmup {
    char *name;
    int batch_size;                 /* rows (the inputs repeated); 1 for a model that does not batch */
    int count;                      /* runs on each instance, >= 1 */
    struct model_warmup_input *inputs;
    int ninputs;
};

/* kiln's sequence_padding: requests whose shapes differ only along the
 * named input axes share batches. A batch is padded with each input's pad
 * value to the smallest length bucket that holds its requests (requests
 * share a batch only within one bucket), and each output axis that follows
 * an input axis is cut back to each request's own length. Axes count the
 * batch dim (input_ids [N, S]: axis 1). A model whose file has symbolic dims
 * named alike gets a proposal (enable false), shown by GET .../config;
 * nothing is padded unless enable is true. */
#define MODEL_PAD_MAX 16
#define MODEL_PAD_MAX_BUCKETS 32

struct model_pad_input {
    char *name;
    int axis;
    double value;                   /* the pad value, converted to the input's data type */
};

struct model_pad_output {
    char *name;
    int axis;
    char *input;                    /* the padded input whose length this axis has */
    int input_axis;
};

struct model_padding {
    int enable;
    int given;                      /* the file has the field */
    struct model_pad_input inputs[MODEL_PAD_MAX];
    int ninputs;
    struct model_pad_output outputs[MODEL_PAD_MAX];
    int noutputs;
    int64_t buckets[MODEL_PAD_MAX_BUCKETS]; /* ascending; default powers of two from 8 to max_length */
    int nbuckets;
    int64_t max_length;             /* default 512 */
    int warmup;                     /* build every (batch size, bucket) plan at load; default 1 */
};

/* A model served as text embeddings (config/model_embedding.c, from
 * Triton's parameters: embedding_output and the keys beside it). */
enum model_pooling { MODEL_POOL_AUTO = 0, MODEL_POOL_NONE, MODEL_POOL_MEAN, MODEL_POOL_CLS, MODEL_POOL_LAST };

struct model_embedding {
    int enabled;                    /* parameters.embedding_output given */
    char *output;                   /* the output holding the embedding */
    enum model_pooling pooling;     /* AUTO until checked: NONE for [H] per text, MEAN for [T, H] */
    int normalize;                  /* L2; default 1 */
    int truncate_dims;              /* a request's dimensions cut the vector (Matryoshka); default 0 */
    char *tokenizer_file;           /* in the model's folder; default tokenizer.json */
    int64_t max_tokens;             /* truncation; 0 = the tokenizer file's */
    /* Set by model_embedding_check: the model's indices (-1: none). */
    int output_index, ids, mask, types;
};

/* Triton's ensemble_scheduling (config/model_ensemble.c): a model whose
 * platform is "ensemble" runs no file of its own but steps, each a request
 * to another model. A step's input_map names, for each of its model's
 * inputs, the ensemble tensor it reads (an ensemble input or another step's
 * output); its output_map names, for each model output it keeps, the
 * ensemble tensor it produces. The parser checks what needs no other model:
 * every tensor produced once, read only after it is produced, no cycle,
 * every ensemble output produced; the server checks the rest against the
 * step models when it loads the ensemble (server/ensemble.h). */
#define MODEL_ENSEMBLE_MAX_STEPS 64
#define MODEL_ENSEMBLE_MAX_MAP 64

struct model_ensemble_map {
    char *key;                      /* the step model's input or output */
    char *value;                    /* the ensemble's tensor */
};

struct model_ensemble_step {
    char *model_name;
    int64_t model_version;          /* -1: the highest loaded */
    struct model_ensemble_map *input_map, *output_map;
    int ninput_map, noutput_map;
};

/* Triton's sequence_batching (config/model_sequence.c): requests that
 * carry a correlation ID go, in order, to their sequence; the server fills
 * the control inputs and keeps the implicit state (an input fed with the
 * same sequence's last value of an output) between requests. */
#define MODEL_SEQ_MAX_CONTROLS 8
#define MODEL_SEQ_MAX_STATES 16

enum model_seq_control_kind { MODEL_SEQ_START = 0, MODEL_SEQ_READY = 1, MODEL_SEQ_END = 2, MODEL_SEQ_CORRID = 3 };

struct model_seq_control {
    char *input;                    /* the model input it fills */
    enum model_seq_control_kind kind;
    enum dtype dtype;               /* START/READY/END: FP32, INT32 or BOOL; CORRID: its data_type */
    double value[2];                /* START/READY/END: the false and true values */
};

struct model_seq_state {
    char *input, *output;           /* the pair: output's value is input's next value */
    int output_listed;              /* the file lists output in 'output': it is also sent to clients */
    enum dtype dtype;
    int ndim;
    int64_t dims[TENSOR_MAX_DIMS];  /* without the batch dim when max_batch_size > 0; -1 any */
    /* initial_state: zeros of init_dims (default: dims, which must then be
     * concrete), or the raw bytes of file (in the model's initial_state/). */
    char *file;
    int init_ndim;                  /* -1: dims */
    int64_t init_dims[TENSOR_MAX_DIMS];
};

struct model_sequence {
    int enable;                     /* the section is present */
    int oldest;                     /* strategy oldest; else direct */
    uint64_t max_idle_us;           /* max_sequence_idle_microseconds; default 1000000 */
    uint64_t max_queue_delay_us;    /* the strategy's */
    int max_candidates;             /* oldest.max_candidate_sequences; 0 = max_batch_size per instance */
    int preferred_batch_size[MODEL_CONFIG_MAX_PREFERRED];
    int npreferred;
    int preserve_ordering;
    struct model_seq_control controls[MODEL_SEQ_MAX_CONTROLS];
    int ncontrols;
    struct model_seq_state states[MODEL_SEQ_MAX_STATES];
    int nstates;
};

enum model_version_policy { MODEL_VERSIONS_LATEST = 0, MODEL_VERSIONS_ALL = 1, MODEL_VERSIONS_SPECIFIC = 2 };

struct model_config {
    char *name;
    char *platform;                 /* "onnxruntime_onnx" */
    int max_batch_size;             /* 0 = the model takes no batch dim */
    int max_batch_size_set;         /* 1 if the file said */
    struct model_config_io *inputs, *outputs;
    int ninputs, noutputs;

    enum model_version_policy version_policy;
    int num_versions;               /* latest */
    int64_t versions[MODEL_CONFIG_MAX_VERSIONS]; /* specific */
    int nversions;

    int dynamic_batching;           /* 1 if the section is present */
    int preferred_batch_size[MODEL_CONFIG_MAX_PREFERRED];
    int npreferred;
    uint64_t max_queue_delay_us;
    uint64_t latency_budget_us;     /* kiln's dynamic_batching.latency_budget_microseconds; 0 = off */
    int preserve_ordering;
    int priority_levels;
    int default_priority_level;
    int timeout_action_delay;       /* default_queue_policy.timeout_action == DELAY */
    uint64_t default_timeout_us;
    int allow_timeout_override;
    int max_queue_size;

    int instance_count;             /* every instance_group's count (1 each by default), summed; default 1 */
    char *instance_kind;            /* "KIND_AUTO", "KIND_CPU", "KIND_GPU" */
    int response_cache;             /* response_cache.enable */
    /* kiln's optimization object: {"precision": "fp32"|"fp16",
     * "cuda_graphs": true|false}; they apply to device backends only. */
    int precision_fp16;             /* "fp16"; default "fp32" */
    int cuda_graphs;                /* default 1 */
    /* parameters.intra_op_thread_count.string_value (the key Triton's
     * onnxruntime backend reads): CPU threads per instance; 0 = kiln
     * chooses (see batcher.h). */
    int intra_op_threads;
    struct model_warmup *warmup;    /* model_warmup samples, in the file's order */
    int nwarmup;
    struct model_padding padding;   /* sequence_padding */
    /* backend "tokenizer": kiln's tokenizer model kind, a tokenizer.json
     * in the version folder (docs/text.md); parameters.max_length's
     * string_value, when given, replaces the file's truncation. */
    int tokenizer;
    int64_t tokenizer_max_length;
    struct model_embedding embedding; /* parameters.embedding_output and the keys beside it */
    int ensemble;                   /* platform "ensemble": steps instead of a model file */
    struct model_ensemble_step *steps;
    int nsteps;
    int max_inflight_requests;      /* ensemble_scheduling.max_inflight_requests; 0 = no bound */
    struct model_sequence sequence; /* sequence_batching */
    /* Fields accepted but ignored (config/model_fields.h), one line each
     * naming the field; NULL when none. Logged once at load. */
    char *warnings;
};

void model_config_init(struct model_config *c, const char *name);
void model_config_clear(struct model_config *c);

/* Parses config.json text into c (which model_config_init prepared). Every
 * field meets its fate first (config/model_fields.h): a refused or unknown
 * field is an error naming it, a warned one a line in c->warnings; known
 * keys of the wrong type are errors naming the key. Keys may be protobuf's
 * JSON names too (maxBatchSize, as json_format writes them). */
int model_config_parse(struct model_config *c, const char *json, size_t len, char *err, size_t err_len);

/* Completes c from the model's inputs and outputs and checks the two agree:
 * fills missing input/output lists, data types and dims, picks
 * max_batch_size when every input and output has a symbolic first dim. */
int model_config_complete(struct model_config *c, const struct model_io *inputs, int ninputs,
                          const struct model_io *outputs, int noutputs, char *err, size_t err_len);

/* The largest config.json or label file read from a repository. */
#define MODEL_CONFIG_MAX_FILE_BYTES ((int64_t)16 << 20)

/* Reads a model folder's configuration: config.json, or config.pbtxt
 * (protobuf text, config/pbtxt.h) turned into the same JSON. *json
 * (malloc'd, NUL-terminated, *len bytes) is what model_config_parse takes;
 * *file names the file read, for messages. Returns STATUS_NOT_FOUND when the
 * folder has neither (err empty), STATUS_INVALID when it has both or the
 * file is unreadable or malformed (err names the file, for config.pbtxt the
 * line:column and field). */
int model_config_read_file(const char *dir, char **json, size_t *len, const char **file, char *err, size_t err_len);

/* Reads each output's label_filename from dir: regular files only, each of
 * at most MODEL_CONFIG_MAX_FILE_BYTES. */
int model_config_load_labels(struct model_config *c, const char *dir, char *err, size_t err_len);

/* 1 if this version should be loaded given every version present (sorted
 * ascending), by the version policy. */
int model_config_version_wanted(const struct model_config *c, int64_t version,
                                const int64_t *present, int npresent);

/* The configuration as Triton prints it (GET .../config). Caller deletes. */
cJSON *model_config_to_json(const struct model_config *c);

/* model_warmup (config/model_warmup.c): parses the config field (an array)
 * into c; checks each sample against the completed inputs (every input
 * named once, its data type, concrete dims that fit, batch_size within
 * max_batch_size); the field as JSON for GET .../config. */
int model_warmup_parse(struct model_config *c, const cJSON *arr, char *err, size_t err_len);
int model_warmup_check(const struct model_config *c, char *err, size_t err_len);
void model_warmup_clear(struct model_config *c);
cJSON *model_warmup_to_json(const struct model_config *c);

/* ensemble_scheduling (config/model_ensemble.c): parses the field into c
 * (c->ensemble already set from platform) and checks the steps' data flow
 * with the ensemble's inputs and outputs (listed, with data types and
 * dims: an ensemble has no file to complete them from); its JSON form. */
int model_ensemble_parse(struct model_config *c, const cJSON *obj, char *err, size_t err_len);
void model_ensemble_clear(struct model_config *c);
cJSON *model_ensemble_to_json(const struct model_config *c);

/* sequence_padding (config/model_padding.c): parses the field; completes it
 * against the model (the proposal from symbolic dim names; default buckets)
 * and checks it (inputs and axes that exist and vary, outputs that follow a
 * padded input axis, a model that batches); its JSON form. */
int model_padding_parse(struct model_config *c, const cJSON *obj, char *err, size_t err_len);
int model_padding_complete(struct model_config *c, const struct model_io *inputs, int ninputs,
                           const struct model_io *outputs, int noutputs, char *err, size_t err_len);
void model_padding_clear(struct model_config *c);
cJSON *model_padding_to_json(const struct model_config *c);

/* The embedding parameters (config/model_embedding.c): parses them from
 * the parameters object; checks them against the completed inputs and
 * outputs (and picks the pooling); adds them to a parameters object. */
int model_embedding_parse(struct model_config *c, const cJSON *params, char *err, size_t err_len);
int model_embedding_check(struct model_config *c, char *err, size_t err_len);
void model_embedding_clear(struct model_config *c);
void model_embedding_to_json(const struct model_config *c, cJSON *params);
const char *model_embedding_pooling_name(enum model_pooling p);
/* sequence_batching (config/model_sequence.c): parses the field; completes
 * it against the model (each control and state input and state output must
 * be the model's, of the data type said; they join the configuration's
 * inputs and outputs marked hidden); its JSON form. */
int model_sequence_parse(struct model_config *c, const cJSON *obj, char *err, size_t err_len);
int model_sequence_complete(struct model_config *c, const struct model_io *inputs, int ninputs,
                            const struct model_io *outputs, int noutputs, char *err, size_t err_len);
void model_sequence_clear(struct model_config *c);
cJSON *model_sequence_to_json(const struct model_config *c);

/* Shape out[0..ndim) from dims (at most one -1) holding count elements:
 * 0, or -1 when no such shape holds them. */
int model_config_fit_shape(const int64_t *dims, int ndim, int64_t count, int64_t *out);

/* Gives t (its batch dim kept when skip) the shape, holding the same
 * elements in the same order: a view, the data does not move. 0, or -1
 * (t unchanged) when they do not fit. */
int model_config_reshape(struct tensor *t, int skip, const int64_t *shape, int ndim);

/* Index of the input/output with this name, or -1. */
int model_config_find_input(const struct model_config *c, const char *name);
int model_config_find_output(const struct model_config *c, const char *name);

#endif
