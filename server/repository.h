/* repository.h - the model repository: Triton's folder layout, versions,
 * load/unload with reference-counted swap.
 *
 *   <root>/<model>/config.json          optional (model_config.h)
 *   <root>/<model>/<version>/model.onnx  version = a positive integer
 *
 * An ensemble (platform "ensemble", server/ensemble.h) has a configuration
 * and version folders without files (none: version 1). It loads after the
 * other models at start, is refused while a step's model is not loaded
 * (the index gives the reason), is loaded again, checked anew, after each
 * load of a model one of its steps names, and is unloaded with it.
 *
 * A loaded version is a struct repo_version: the engine's model, its
 * completed configuration and its batcher. Requests take a reference with
 * repository_acquire and drop it with repository_release; a reload swaps the
 * table's entry atomically, so requests in flight finish on the old version
 * while new ones see the new one, and the old version is freed (its batcher
 * drained and joined) on the repository's own reaper thread once the last
 * reference goes. Nothing that can block runs on the caller of release.
 *
 * Threads: every function is thread-safe. repository_load/unload/poll block
 * for as long as a load takes: call them from a control thread, never from
 * an I/O loop. */
#ifndef KILN_REPOSITORY_H
#define KILN_REPOSITORY_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "config/model_config.h"
#include "server/batcher.h"
#include "server/padding.h"
#include "server/sequence.h"

typedef struct repository repository_t;
typedef struct cJSON cJSON;
struct metrics_model;
struct upload_set;
struct tokenizer;

struct repo_version {
    const char *name;            /* the model's name */
    int64_t version;
    char version_str[24];
    struct model *model;         /* NULL for an ensemble */
    batcher_t *batcher;          /* NULL for an ensemble */
    struct ensemble *ensemble;   /* an ensemble's steps (server/ensemble.h), else NULL */
    sequencer_t *sequencer;      /* sequence_batching's, in front of the batcher; NULL without */
    struct model_config config;  /* completed; inputs/outputs in the model's order */
    struct pad_spec pad;         /* padded batching, when config.padding.enable */
    struct metrics_model *metrics;
    /* The model's tokenizer (kernels/text/tokenizer.h), when its
     * configuration serves embeddings (config.embedding); NULL otherwise. */
    struct tokenizer *tokenizer;
    uint64_t load_ns;
    int64_t loaded_at;           /* when it became ready, Unix seconds */
    atomic_int refs;             /* private */
    repository_t *repo_;         /* private */
    char *name_;                 /* private: owns name */
};

struct repository_params {
    const char *root;
    const char *backend;         /* "cpu" or "cuda": where instances run */
    int max_versions;            /* 0 = 64 */
    int max_instances;           /* bound on a model's instances (instance_group counts summed); 0 = none */
    int max_intra_op_threads;    /* bound on parameters.intra_op_thread_count; 0 = none */
    uint64_t inline_max_us;      /* batcher_params.inline_max_ns, in us (0 = never) */
    size_t max_request_memory;   /* bytes one request may make a model allocate (model_params.max_run_bytes)
                                  * and a model's warm-up samples may take; 0 = none */
};

repository_t *repository_create(const struct repository_params *p, char *err, size_t err_len);
/* Unloads everything, waits until every reference is released, frees. NULL is a no-op. */
void repository_free(repository_t *r);

/* Loads (or reloads) a model by name. Returns 0 or a negative status with
 * err naming what was wrong (files relative to the repository, never by
 * their absolute path: err goes to clients); on error a previously loaded
 * version keeps serving. A configuration over the bounds in the params is
 * STATUS_INVALID naming the field and the bound. Logs one line per version
 * with its load time. */
int repository_load(repository_t *r, const char *name, char *err, size_t err_len);
/* The same with a configuration given as JSON text instead of the model's
 * config.json (Triton's load request parameter "config"). */
int repository_load_with_config(repository_t *r, const char *name, const char *config_json, char *err,
                                size_t err_len);
/* The same with model files from the load request (Triton's parameters
 * "file:<version>/<name>"; config_json is then required): they are written
 * into <root>/<name>/ first (server/upload.h: no path outside it, no
 * symbolic link followed; the folder is made for a new model), and the
 * load sees only the versions they name. The files stay in the
 * repository. */
int repository_load_files(repository_t *r, const char *name, const char *config_json, const struct upload_set *files,
                          char *err, size_t err_len);
/* Unloads a model: new requests get NOT_FOUND/UNAVAILABLE, requests in flight finish. */
int repository_unload(repository_t *r, const char *name, char *err, size_t err_len);
/* Loads every model folder; returns the number that failed (each logged). */
int repository_load_all(repository_t *r);
/* Poll mode: loads new folders, reloads changed ones, unloads removed ones. */
void repository_poll(repository_t *r);

/* A reference to version `version` of `name` (0 = the highest loaded
 * version), or NULL with *status STATUS_NOT_FOUND / STATUS_UNAVAILABLE and err set. */
struct repo_version *repository_acquire(repository_t *r, const char *name, int64_t version, int *status,
                                        char *err, size_t err_len);
void repository_release(struct repo_version *v); /* NULL is a no-op */

/* Every loaded version, referenced: the caller releases each and frees the array. */
int repository_list(repository_t *r, struct repo_version ***out);

/* [{"name","version","state","reason"}] for every model folder and loaded version. */
cJSON *repository_index(repository_t *r, int ready_only);

/* Drain: every batcher stops admitting; then pending counts what is left. */
void repository_stop_admission(repository_t *r);
int repository_pending(repository_t *r);

#endif
