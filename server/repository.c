#include "server/repository.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common/clock.h"
#include "common/file.h"
#include "common/log.h"
#include "common/status.h"
#include "kernels/text/tokenizer.h"
#include "models/model.h"
#include "server/ensemble.h"
#include "server/instance.h"
#include "server/metrics.h"
#include "server/upload.h"
#include "server/warmup.h"

enum entry_state { ST_UNAVAILABLE = 0, ST_LOADING, ST_READY, ST_UNLOADING };
static const char *g_state_names[] = {"UNAVAILABLE", "LOADING", "READY", "UNLOADING"};

struct entry {
    char *name;
    enum entry_state state;
    char reason[512];
    struct repo_version **versions; /* ascending */
    int nversions;
    uint64_t signature;             /* poll: hash of file names, sizes and mtimes */
    /* An ensemble's step models ("\n" after each name), from its last load
     * attempt, loaded or refused: a load of one of them loads it again. */
    char *steps;
};

struct repository {
    char *root;
    char *backend;
    int max_versions;
    int max_instances, max_intra_op_threads;
    uint64_t inline_max_us;
    size_t max_request_memory;

    pthread_rwlock_t lock;          /* guards entries */
    struct entry *entries;
    int nentries, cap;

    pthread_mutex_t control;        /* one load/unload/poll at a time */

    /* Reaper: frees versions whose last reference went away. */
    pthread_mutex_t reap_lock;
    pthread_cond_t reap_cond, reap_idle;
    struct repo_version **reap;
    int nreap, reap_cap;
    int live;                       /* versions created and not yet freed */
    int stopping;
    pthread_t reaper;
};

#define ERR(st, ...) status_set(err, err_len, st, __VA_ARGS__)

/* ---- versions and the reaper -------------------------------------------- */

static void version_destroy(struct repo_version *v) {
    ensemble_free(v->ensemble);
    batcher_free(v->batcher); /* drains what is queued and joins the instances */
    sequencer_free(v->sequencer); /* after: a sequence's next request is refused by the stopped batcher */
    model_free(v->model);
    tokenizer_free(v->tokenizer);
    model_config_clear(&v->config);
    log_info("unloaded model '%s' version %s", v->name_, v->version_str);
    free(v->name_);
    free(v);
}

static void *reaper_main(void *arg) {
    repository_t *r = arg;
    pthread_mutex_lock(&r->reap_lock);
    for (;;) {
        while (r->nreap == 0 && !r->stopping) pthread_cond_wait(&r->reap_cond, &r->reap_lock);
        if (r->nreap == 0 && r->stopping) break;
        struct repo_version *v = r->reap[--r->nreap];
        pthread_mutex_unlock(&r->reap_lock);
        version_destroy(v);
        pthread_mutex_lock(&r->reap_lock);
        r->live--;
        pthread_cond_broadcast(&r->reap_idle);
    }
    pthread_mutex_unlock(&r->reap_lock);
    return NULL;
}

void repository_release(struct repo_version *v) {
    if (!v) return;
    if (atomic_fetch_sub(&v->refs, 1) != 1) return;
    repository_t *r = v->repo_;
    pthread_mutex_lock(&r->reap_lock);
    /* reserve_reap_slot made room for every live version when it was
     * counted, so nothing can fail here: a version dropped for want of
     * memory would never be freed, and repository_free would wait for it
     * forever. */
    r->reap[r->nreap++] = v;
    pthread_cond_signal(&r->reap_cond);
    pthread_mutex_unlock(&r->reap_lock);
}

/* Counts a new live version, first making room for it in the reap list (under
 * reap_lock), so that its release cannot fail. Returns 0 or STATUS_NOMEM. */
static int reserve_reap_slot(repository_t *r) {
    pthread_mutex_lock(&r->reap_lock);
    int rc = 0;
    if (r->live + 1 > r->reap_cap) {
        int nc = r->reap_cap ? r->reap_cap * 2 : 16;
        struct repo_version **n = realloc(r->reap, (size_t)nc * sizeof *n);
        if (n) {
            r->reap = n;
            r->reap_cap = nc;
        } else rc = STATUS_NOMEM;
    }
    if (!rc) r->live++;
    pthread_mutex_unlock(&r->reap_lock);
    return rc;
}

/* Client-facing messages name files relative to the repository: drops every
 * "<root>/" that starts a path in msg (at its start, or after a space, a quote
 * or a parenthesis), in place. A root such as "." or "models" also occurs
 * inside other words and paths ("../x"), which stay as they are. */
static void relative_to_root(const repository_t *r, char *msg) {
    size_t rl = strlen(r->root);
    for (char *p = msg; (p = strstr(p, r->root));) {
        int starts_path = p == msg || strchr(" '\"(", p[-1]) != NULL;
        if (!starts_path || p[rl] != '/') {
            p++;
            continue;
        }
        memmove(p, p + rl + 1, strlen(p + rl + 1) + 1);
    }
}

/* ---- folder scanning ---------------------------------------------------- */

/* floor(log2(n)) for n >= 1. */
static int ilog2(int n) {
    int k = 0;
    while (n > 1) {
        n >>= 1;
        k++;
    }
    return k;
}

static int valid_name(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 200 || name[0] == '.') return 0;
    for (size_t i = 0; i < n; i++)
        if (name[i] == '/' || name[i] == '\\' || (unsigned char)name[i] < 0x20) return 0;
    return 1;
}

static int is_version_dir(const char *s, int64_t *v) {
    if (!*s || strlen(s) > 18) return 0;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    *v = strtoll(s, NULL, 10);
    return *v > 0;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The file a version folder holds: a model.onnx, or the tokenizer.json of
 * a tokenizer model (backend "tokenizer"). */
static const char *version_file(const struct model_config *c) { return c && c->tokenizer ? "tokenizer.json" : "model.onnx"; }

/* Versions present under dir (with a model.onnx or a tokenizer.json, unless
 * ensemble: an ensemble's version folders hold nothing), ascending. */
static int scan_versions(const char *dir, int64_t *out, int max, int ensemble) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        int64_t v;
        if (!is_version_dir(e->d_name, &v)) continue;
        char path[4096];
        struct stat st;
        int found = 0;
        if (ensemble) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            found = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
        }
        for (int k = 0; !ensemble && k < 2 && !found; k++) {
            snprintf(path, sizeof path, "%s/%s/%s", dir, e->d_name, k ? "tokenizer.json" : "model.onnx");
            found = stat(path, &st) == 0 && S_ISREG(st.st_mode);
        }
        if (found) out[n++] = v;
    }
    closedir(d);
    qsort(out, (size_t)n, sizeof *out, cmp_i64);
    return n;
}

/* A cheap change detector for poll mode: names, sizes and mtimes two levels deep. */
static uint64_t dir_signature(const char *dir, int depth) {
    uint64_t h = 1469598103934665603ull;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &st)) continue;
        uint64_t x = 1469598103934665603ull;
        for (const char *p = e->d_name; *p; p++) x = (x ^ (uint8_t)*p) * 1099511628211ull;
        x ^= (uint64_t)st.st_size * 31 + (uint64_t)st.st_mtim.tv_sec * 1000000007ull + (uint64_t)st.st_mtim.tv_nsec;
        if (S_ISDIR(st.st_mode) && depth > 0) x ^= dir_signature(path, depth - 1) * 3;
        h += x * 0x9e3779b97f4a7c15ull; /* order-independent */
    }
    closedir(d);
    return h;
}

/* ---- loading one version ------------------------------------------------ */

/* Loading a version runs in phases, each its own function: the version's
 * identity (version_new); the load phase, which reads the files, parses the
 * configuration and builds the model (version_read); the runtime around the
 * model, instances, batcher and warm-up (version_start); and its admission
 * to the repository's lifecycle (version_admit). load_locked then publishes
 * the versions or retires them (versions_publish). Each phase returns 0 or
 * -1 with err set; version_discard undoes whatever the phases made. */

static struct repo_version *version_new(repository_t *r, const char *name, int64_t ver) {
    struct repo_version *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->name_ = strdup(name);
    v->name = v->name_;
    v->version = ver;
    snprintf(v->version_str, sizeof v->version_str, "%lld", (long long)ver);
    v->repo_ = r;
    atomic_init(&v->refs, 1);
    model_config_init(&v->config, name);
    return v;
}

static void version_discard(struct repo_version *v) {
    ensemble_free(v->ensemble);
    batcher_free(v->batcher); /* its instances use the model */
    sequencer_free(v->sequencer);
    model_free(v->model);
    tokenizer_free(v->tokenizer);
    model_config_clear(&v->config);
    free(v->name_);
    free(v);
}

/* The load phase: the configuration (cfg_file's JSON, or the override) parsed, the ONNX file loaded
 * for the backend the configuration picks (*be_out), the configuration
 * completed with the model's inputs and outputs and its labels. */
static int version_read(repository_t *r, struct repo_version *v, const char *mdir, const char *cfg, size_t cfg_len,
                        const char *cfg_file,
                        const char **be_out, char *err, size_t err_len) {
    const char *name = v->name;
    int64_t ver = v->version;
    char path[4096], e2[512];
    /* The configuration first: its optimization settings shape the engine. */
    if (cfg && model_config_parse(&v->config, cfg, cfg_len, e2, sizeof e2)) {
        ERR(STATUS_INVALID, "model '%s' version %lld: %s: %s", name, (long long)ver, cfg_file, e2);
        return -1;
    }
    snprintf(path, sizeof path, "%s/%lld/%s", mdir, (long long)ver, version_file(&v->config));
    const char *be = r->backend;
    if (strcmp(v->config.instance_kind, "KIND_CPU") == 0) be = "cpu";
    /* Triton's optional inputs: an initializer the graph also lists as an
     * input stays an input, its initializer the value a request that
     * leaves it out runs with. */
    const char **defaults = calloc((size_t)v->config.ninputs + 1, sizeof *defaults);
    int ndefaults = 0;
    if (!defaults) {
        ERR(STATUS_NOMEM, "model '%s': out of memory", name);
        return -1;
    }
    for (int i = 0; i < v->config.ninputs; i++)
        if (v->config.inputs[i].optional) defaults[ndefaults++] = v->config.inputs[i].name;
    struct model_params mp = {.path = path,
                              .defaults = defaults,
                              .ndefaults = ndefaults,
                              .fp16 = v->config.precision_fp16,
                              .cuda_graphs = v->config.cuda_graphs ? 1 : -1,
                              .cpu_only = strcmp(be, "cpu") == 0,
                              .max_run_bytes = r->max_request_memory,
                              .tokenizer = v->config.tokenizer,
                              .tokenizer_batched = v->config.max_batch_size > 0,
                              .tokenizer_max_length = v->config.tokenizer_max_length};
    for (int i = 0; i < v->config.ninputs; i++) /* a tokenizer takes pairs when its config lists TEXT_PAIR */
        mp.tokenizer_pair |= strcmp(v->config.inputs[i].name, "TEXT_PAIR") == 0;
    v->model = model_load(&mp, e2, sizeof e2);
    free(defaults);
    if (!v->model) {
        ERR(STATUS_INVALID, "model '%s' version %lld: %s", name, (long long)ver, e2);
        return -1;
    }
    int ni = model_ninputs(v->model), no = model_noutputs(v->model);
    struct model_io *ins = calloc((size_t)ni + 1, sizeof *ins), *outs = calloc((size_t)no + 1, sizeof *outs);
    if (!ins || !outs) {
        free(ins);
        free(outs);
        ERR(STATUS_NOMEM, "model '%s': out of memory", name);
        return -1;
    }
    for (int i = 0; i < ni; i++) ins[i] = *model_input(v->model, i);
    for (int i = 0; i < no; i++) outs[i] = *model_output(v->model, i);
    /* A tensor that crosses the protocol needs a KServe datatype: float8,
     * float4 and the 4- and 2-bit integers have none (in Triton neither). */
    for (int i = 0; i < ni + no; i++) {
        const struct model_io *io = i < ni ? &ins[i] : &outs[i - ni];
        if (dtype_kserve_name(io->dtype)) continue;
        ERR(STATUS_INVALID, "model '%s' version %lld: %s '%s' has element type %s, which no KServe datatype carries; "
            "only the graph's inside may use it (cast to or from a KServe type at the model's edge)", name,
            (long long)ver, i < ni ? "input" : "output", io->name, dtype_name(io->dtype));
        free(ins);
        free(outs);
        return -1;
    }
    int rc = model_config_complete(&v->config, ins, ni, outs, no, e2, sizeof e2);
    if (!rc) rc = model_config_load_labels(&v->config, mdir, e2, sizeof e2);
    for (int i = 0; !rc && i < v->config.ninputs; i++) { /* the config is in the model's order now */
        struct model_config_io *in = &v->config.inputs[i];
        in->dflt = in->optional ? model_input_default(v->model, i) : NULL;
        /* A default is one request's value: batched rows would each need one. */
        if (in->dflt && v->config.max_batch_size > 0)
            rc = status_set(e2, sizeof e2, STATUS_INVALID, "config field 'input' of '%s': an optional input with a "
                            "default (the graph's %s) cannot be left out of a batch; a model that batches (max_batch_size "
                            "%d) needs it in every request: drop optional or batching", in->name,
                            tensor_numel(in->dflt) ? "initializer" : "unread input", v->config.max_batch_size);
    }
    free(ins);
    free(outs);
    if (rc) {
        ERR(STATUS_INVALID, "model '%s' version %lld: %s%s%s", name, (long long)ver, cfg ? cfg_file : "", cfg ? ": " : "",
            e2);
        return -1;
    }
    /* The KServe metadata has no way to say "any rank": such an input shows
     * shape [] to clients (and load generators build scalars from it). */
    for (int i = 0; i < v->config.ninputs; i++)
        if (v->config.inputs[i].ndim < 0)
            log_warn("model '%s' version %lld: input '%s' has no shape in the ONNX file or config.json; clients see "
                     "shape [] and any shape is accepted: give its dims in config.json", name, (long long)ver,
                     v->config.inputs[i].name);
    if (strcmp(v->config.instance_kind, "KIND_GPU") == 0 && strcmp(be, "cuda") != 0) {
        ERR(STATUS_UNAVAILABLE, "model '%s': instance_group kind KIND_GPU needs the CUDA backend (kiln runs on %s)",
            name, be);
        return -1;
    }
    *be_out = be;
    if (v->config.precision_fp16 && strcmp(be, "cpu") == 0)
        log_info("model '%s': precision fp16 applies to the CUDA backend; the CPU runs FP32", name);
    else if (v->config.precision_fp16 || !v->config.cuda_graphs)
        log_info("model '%s' on %s: precision %s (weights and activations%s), CUDA graphs %s", name, be,
                 v->config.precision_fp16 ? "fp16" : "fp32",
                 v->config.precision_fp16 ? " in FP16, FP32 accumulation; inputs and outputs FP32" : " in FP32",
                 v->config.cuda_graphs ? "on" : "off");
    return 0;
}

/* The largest tokenizer.json read (a large vocabulary's is ~20 MB). */
#define TOKENIZER_MAX_FILE_BYTES ((int64_t)256 << 20)

/* A model that serves embeddings: its tokenizer file, loaded. */
static int version_tokenizer(struct repo_version *v, const char *mdir, char *err, size_t err_len) {
    const struct model_embedding *e = &v->config.embedding;
    if (!e->enabled) return 0;
    char path[4096], e2[512], *json = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", mdir, e->tokenizer_file);
    int rc = file_read_regular(path, TOKENIZER_MAX_FILE_BYTES, &json, &len, e2, sizeof e2);
    if (!rc) {
        struct tokenizer_params tp = {.json = json, .len = len, .name = e->tokenizer_file, .max_length = e->max_tokens};
        v->tokenizer = tokenizer_load(&tp, e2, sizeof e2);
        if (!v->tokenizer) rc = STATUS_INVALID;
    }
    free(json);
    if (rc)
        ERR(rc, "model '%s' version %lld: parameters.embedding_output needs the tokenizer %s in the model's "
            "folder: %s", v->name, (long long)v->version, e->tokenizer_file, e2);
    return rc ? -1 : 0;
}

/* The runtime around the model: the padding buckets and room for their
 * plans, the instances on backend be and the batcher (inline runs as rep
 * says), warmed up before any request comes. */
static int version_start(const repository_t *rep, struct repo_version *v, const char *mdir, const char *be, char *err,
                         size_t err_len) {
    const char *name = v->name;
    int64_t ver = v->version;
    char e2[512];
    int rc;
    const struct model_config *c = &v->config;
    int padded = pad_spec_make(&v->pad, c, e2, sizeof e2);
    if (padded < 0) {
        ERR(padded, "model '%s' version %lld: %s", name, (long long)ver, e2);
        return -1;
    }
    /* Room for a plan per (bucket, batch size) besides the usual few, so
     * that padded batches never rebuild an evicted plan. */
    int sizes = c->npreferred > 0 ? c->npreferred + 1 : 2 + ilog2(c->max_batch_size);
    if (padded && model_grow_plans(v->model, 16 + v->pad.nbuckets * sizes)) {
        ERR(STATUS_NOMEM, "model '%s': out of memory", name);
        return -1;
    }
    /* Output shapes that follow input values differ per request: one
     * batch's rows could not share them. */
    int follow_values = model_shapes_follow_values(v->model);
    if (follow_values && c->dynamic_batching)
        log_info("model '%s': output shapes depend on input values; dynamic batching is off", name);
    struct instances_params ip = {
        .model = v->model,
        .model_name = v->name,
        .backend = be,
        .count = c->instance_count,
        .threads = c->intra_op_threads,
        .max_rows = c->max_batch_size > 0 ? c->max_batch_size : 1,
        .pad = padded ? &v->pad : NULL,
    };
    struct batcher_params bp = {
        .model_name = v->name,
        .pad = padded ? &v->pad : NULL,
        .max_batch_size = c->max_batch_size,
        .dynamic_batching = c->dynamic_batching && !follow_values,
        .npreferred = c->npreferred,
        .max_queue_delay_us = c->max_queue_delay_us,
        .latency_budget_us = c->latency_budget_us,
        .inline_max_ns = rep->inline_max_us * 1000,
        .preserve_ordering = c->preserve_ordering,
        .priority_levels = c->priority_levels,
        .default_priority_level = c->default_priority_level,
        .default_queue_policy = {.timeout_action = c->timeout_action_delay ? BATCHER_TIMEOUT_DELAY : BATCHER_TIMEOUT_REJECT,
                                 .default_timeout_us = c->default_timeout_us,
                                 .allow_timeout_override = c->allow_timeout_override,
                                 .max_queue_size = c->max_queue_size},
    };
    for (int i = 0; i < c->npreferred && i < MODEL_CONFIG_MAX_PREFERRED; i++) bp.preferred_batch_size[i] = c->preferred_batch_size[i];
    /* A sequence model batches its sequences' requests with the strategy's
     * delay and sizes (server/sequence.h: one request per sequence at a time). */
    if (c->sequence.enable) {
        bp.dynamic_batching = c->max_batch_size > 0 && !follow_values;
        bp.max_queue_delay_us = c->sequence.max_queue_delay_us;
        bp.npreferred = c->sequence.npreferred;
        bp.preserve_ordering = c->sequence.preserve_ordering;
        memcpy(bp.preferred_batch_size, c->sequence.preferred_batch_size, sizeof bp.preferred_batch_size);
    }
    v->batcher = instances_create(&ip, &bp.executor, e2, sizeof e2) ? NULL : batcher_create(&bp, e2, sizeof e2);
    if (!v->batcher) {
        ERR(STATUS_INVALID, "model '%s' version %lld: %s", name, (long long)ver, e2);
        return -1;
    }
    if (c->sequence.enable) {
        struct sequencer_params sp = {.config = c, .batcher = v->batcher, .model_dir = mdir,
                                      .instances = c->instance_count};
        if (!(v->sequencer = sequencer_create(&sp, e2, sizeof e2))) {
            ERR(STATUS_INVALID, "model '%s' version %lld: %s", name, (long long)ver, e2);
            return -1;
        }
    }
    /* Before the model is ready: no request pays for a warmed shape's plan. */
    if ((rc = warmup_run(v->batcher, c, mdir, e2, sizeof e2)) ||
        (padded && c->padding.warmup && (rc = warmup_buckets(v->batcher, c, &v->pad, e2, sizeof e2)))) {
        ERR(rc, "model '%s' version %lld: %s", name, (long long)ver, e2);
        return -1;
    }
    return 0;
}

/* Admission to the repository's lifecycle: room for the reaper to retire the
 * version later, its metrics and the load's log line (t0: when loading began). */
static int version_admit(repository_t *r, struct repo_version *v, const char *be, uint64_t t0, char *err,
                         size_t err_len) {
    const char *name = v->name;
    int64_t ver = v->version;
    const struct model_config *c = &v->config;
    if (reserve_reap_slot(r)) {
        ERR(STATUS_NOMEM, "model '%s': out of memory", name);
        return -1;
    }
    v->load_ns = clock_now_ns() - t0;
    v->loaded_at = (int64_t)time(NULL);
    v->metrics = metrics_model_get(name, v->version_str);
    metrics_record_load(v->metrics, v->load_ns);
    if (v->ensemble)
        log_info("loaded ensemble '%s' version %lld in %.1f ms (%d steps, max_batch_size %d)", name, (long long)ver,
                 (double)v->load_ns / 1e6, c->nsteps, c->max_batch_size);
    else
        log_info("loaded model '%s' version %lld in %.1f ms (%d nodes, max_batch_size %d, %d instance%s on %s)", name,
                 (long long)ver, (double)v->load_ns / 1e6, model_node_count(v->model), c->max_batch_size,
                 c->instance_count, c->instance_count == 1 ? "" : "s", be);
    return 0;
}

/* An ensemble's load phase: its configuration, its output labels and its
 * steps checked against the step models loaded now (server/ensemble.h). */
static int version_read_ensemble(repository_t *r, struct repo_version *v, const char *mdir, const char *cfg,
                                 size_t cfg_len, const char *cfg_file, char *err, size_t err_len) {
    char e2[512];
    int rc = model_config_parse(&v->config, cfg, cfg_len, e2, sizeof e2);
    if (!rc) rc = model_config_load_labels(&v->config, mdir, e2, sizeof e2);
    if (rc) {
        ERR(rc, "model '%s' version %lld: %s: %s", v->name, (long long)v->version, cfg_file, e2);
        return -1;
    }
    if (!(v->ensemble = ensemble_create(r, &v->config, e2, sizeof e2))) {
        ERR(STATUS_UNAVAILABLE, "model '%s' version %lld: %s", v->name, (long long)v->version, e2);
        return -1;
    }
    return 0;
}

static struct repo_version *version_load(repository_t *r, const char *name, const char *mdir, int64_t ver,
                                         const char *cfg, size_t cfg_len, const char *cfg_file, int ensemble,
                                         char *err, size_t err_len) {
    uint64_t t0 = clock_now_ns();
    struct repo_version *v = version_new(r, name, ver);
    if (!v) return NULL;
    const char *be = NULL;
    if (ensemble) {
        if (version_read_ensemble(r, v, mdir, cfg, cfg_len, cfg_file, err, err_len) ||
            version_admit(r, v, "ensemble", t0, err, err_len)) {
            version_discard(v);
            return NULL;
        }
        return v;
    }
    if (version_read(r, v, mdir, cfg, cfg_len, cfg_file, &be, err, err_len) ||
        version_tokenizer(v, mdir, err, err_len) ||
        version_start(r, v, mdir, be, err, err_len) ||
        version_admit(r, v, be, t0, err, err_len)) {
        version_discard(v);
        return NULL;
    }
    return v;
}

/* ---- the table ---------------------------------------------------------- */

static struct entry *entry_find(repository_t *r, const char *name) {
    for (int i = 0; i < r->nentries; i++)
        if (strcmp(r->entries[i].name, name) == 0) return &r->entries[i];
    return NULL;
}

/* Under the write lock. */
static struct entry *entry_get(repository_t *r, const char *name) {
    struct entry *e = entry_find(r, name);
    if (e) return e;
    if (r->nentries == r->cap) {
        int nc = r->cap ? r->cap * 2 : 16;
        struct entry *n = realloc(r->entries, (size_t)nc * sizeof *n);
        if (!n) return NULL;
        r->entries = n;
        r->cap = nc;
    }
    e = &r->entries[r->nentries++];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    snprintf(e->reason, sizeof e->reason, "unloaded");
    return e;
}

/* Replaces an entry's versions; the old ones are released outside the lock. */
static void entry_swap(repository_t *r, const char *name, struct repo_version **nv, int n, enum entry_state st,
                       const char *reason, uint64_t sig) {
    pthread_rwlock_wrlock(&r->lock);
    struct entry *e = entry_get(r, name);
    struct repo_version **old = NULL;
    int nold = 0;
    if (e) {
        old = e->versions;
        nold = e->nversions;
        e->versions = nv;
        e->nversions = n;
        e->state = st;
        e->signature = sig;
        snprintf(e->reason, sizeof e->reason, "%s", reason ? reason : "");
        relative_to_root(r, e->reason);
    }
    pthread_rwlock_unlock(&r->lock);
    for (int i = 0; i < nold; i++) repository_release(old[i]);
    free(old);
}

static void entry_set_state(repository_t *r, const char *name, enum entry_state st, const char *reason) {
    pthread_rwlock_wrlock(&r->lock);
    struct entry *e = entry_get(r, name);
    if (e) {
        e->state = st;
        if (reason) {
            snprintf(e->reason, sizeof e->reason, "%s", reason);
            relative_to_root(r, e->reason);
        }
    }
    pthread_rwlock_unlock(&r->lock);
}

static int load_checked(repository_t *r, const char *name, const char *override, const struct upload_set *up,
                        char *err, size_t err_len);

/* Remembers which models an ensemble's steps name (none: not an ensemble). */
static void entry_set_steps(repository_t *r, const char *name, const struct model_config *c) {
    size_t n = 1;
    for (int s = 0; s < c->nsteps; s++) n += strlen(c->steps[s].model_name) + 1;
    char *steps = c->nsteps ? malloc(n) : NULL;
    if (steps) {
        steps[0] = 0;
        for (int s = 0; s < c->nsteps; s++) strcat(strcat(steps, c->steps[s].model_name), "\n");
    }
    pthread_rwlock_wrlock(&r->lock);
    struct entry *e = entry_get(r, name);
    if (e) {
        free(e->steps);
        e->steps = steps;
        steps = NULL;
    }
    pthread_rwlock_unlock(&r->lock);
    free(steps);
}

/* The ensembles whose steps name model `name` (with loaded, 1: only those
 * with versions loaded): *out, their names, each and the array malloc'd
 * (an entry may be NULL for want of memory). Returns how many. */
static int dependents(repository_t *r, const char *name, int loaded, char ***out) {
    char line[256];
    snprintf(line, sizeof line, "%s\n", name);
    pthread_rwlock_rdlock(&r->lock);
    char **deps = calloc((size_t)r->nentries + 1, sizeof *deps);
    int n = 0;
    for (int i = 0; deps && i < r->nentries; i++) {
        const char *st = r->entries[i].steps;
        if (loaded && !r->entries[i].nversions) continue;
        /* A name at the list's start or after a newline. */
        for (const char *p = st; p && (p = strstr(p, line)); p++)
            if (p == st || p[-1] == '\n') {
                deps[n++] = strdup(r->entries[i].name);
                break;
            }
    }
    pthread_rwlock_unlock(&r->lock);
    *out = deps;
    return n;
}

/* Unloads every loaded ensemble whose steps name model `name`, just
 * unloaded: its requests could only fail. The index says why; a load of
 * the model loads it again (reload_dependents). */
static void unload_dependents(repository_t *r, const char *name, int depth) {
    char **deps = NULL;
    int n = depth > 4 ? 0 : dependents(r, name, 1, &deps);
    for (int i = 0; i < n; i++) {
        if (deps[i]) {
            char reason[512];
            snprintf(reason, sizeof reason, "unloaded: model '%s', which a step of the ensemble runs, was unloaded",
                     name);
            entry_swap(r, deps[i], NULL, 0, ST_UNAVAILABLE, reason, 0);
            log_info("ensemble '%s' %s", deps[i], reason);
            unload_dependents(r, deps[i], depth + 1);
        }
        free(deps[i]);
    }
    free(deps);
}

/* Loads again every ensemble whose steps name model `name`, just loaded:
 * one refused while it was missing now loads, one loaded is checked
 * against the new version. Ensembles of ensembles follow, a few levels. */
static void reload_dependents(repository_t *r, const char *name, int depth) {
    if (depth > 4) return;
    char **deps;
    int n = dependents(r, name, 0, &deps);
    for (int i = 0; i < n; i++) {
        char err[512];
        if (!deps[i]) continue;
        if (load_checked(r, deps[i], NULL, NULL, err, sizeof err) == 0) {
            log_info("ensemble '%s' loaded again after model '%s' was", deps[i], name);
            reload_dependents(r, deps[i], depth + 1);
        } else log_warn("ensemble '%s' not loaded after model '%s' was: %s", deps[i], name, err);
        free(deps[i]);
    }
    free(deps);
}

/* The lifecycle phase of a load: the versions loaded (nv[0..nw), rc 0)
 * replace the entry's, which retire once their last request is done; after
 * a failure (rc) the ones loaded are released and the old versions keep
 * serving. Returns rc. */
static int versions_publish(repository_t *r, const char *name, struct repo_version **nv, int nw, int rc,
                            int was_ready, uint64_t sig, const char *err) {
    if (rc) {
        for (int i = 0; nv && i < nw; i++) repository_release(nv[i]);
        free(nv);
        /* A failed reload keeps the old versions serving. */
        if (!was_ready) entry_set_state(r, name, ST_UNAVAILABLE, err);
        return rc;
    }
    entry_swap(r, name, nv, nw, ST_READY, "", sig);
    return 0;
}

/* Every failed load is logged once, whatever step refused it (a missing version
 * folder or a bad config.json as much as a broken model file): the startup
 * summary "N models failed to load (see above)" points at these lines. An
 * unknown name is the caller's mistake, answered to it and not logged. */
static int load_locked(repository_t *r, const char *name, const char *override, const struct upload_set *up,
                       char *err, size_t err_len) {
    int rc = load_checked(r, name, override, up, err, err_len);
    if (!rc) reload_dependents(r, name, 0);
    if (rc && rc != STATUS_NOT_FOUND) log_error("%s", err);
    if (rc && err) relative_to_root(r, err);
    return rc;
}

/* The server's bounds on what a configuration may ask for: a load request's
 * config as much as a config.json, so no client can start threads by the
 * thousand. */
static int check_bounds(const repository_t *r, const struct model_config *c, char *err, size_t err_len) {
    if (r->max_instances > 0 && c->instance_count > r->max_instances)
        return ERR(STATUS_INVALID, "config field 'instance_group' asks for %d instances (its groups' counts summed), "
                   "over this server's bound of %d (--max-model-instances)", c->instance_count, r->max_instances);
    if (r->max_intra_op_threads > 0 && c->intra_op_threads > r->max_intra_op_threads)
        return ERR(STATUS_INVALID, "config field 'parameters.intra_op_thread_count' is %d, over this server's bound "
                   "of %d (--max-intra-op-threads)", c->intra_op_threads, r->max_intra_op_threads);
    return 0;
}

/* The versions a load with uploaded files sees: only those it uploaded,
 * as Triton loads such a model from a folder of the uploaded files alone.
 * Keeps present[0..np) that are in up; the new count. */
static int versions_uploaded(const struct upload_set *up, int64_t *present, int np) {
    int k = 0;
    for (int i = 0; i < np; i++) {
        int found = 0;
        for (int j = 0; j < up->n && !found; j++) {
            int64_t v;
            found = upload_path_check(up->files[j].path, &v, NULL, 0) == 0 && v == present[i];
        }
        if (found) present[k++] = present[i];
    }
    return k;
}

static int load_checked(repository_t *r, const char *name, const char *override, const struct upload_set *up,
                        char *err, size_t err_len) {
    if (!valid_name(name))
        return ERR(STATUS_INVALID, "failed to poll from model repository: '%s' is not a valid model name (a folder "
                   "name not starting with '.', without '/', '\\\\' or control bytes, at most 200 bytes)", name);
    if (up && up->n) {
        if (!override)
            return ERR(STATUS_INVALID, "model '%s': a load with model files (parameters \"file:...\") needs "
                       "parameters.config, the model configuration JSON, as Triton's does", name);
        int urc = upload_write(r->root, name, up, err, err_len);
        if (urc) return urc;
        log_info("model '%s': %d file%s (%zu bytes) written from the load request", name, up->n, up->n == 1 ? "" : "s",
                 up->bytes);
    }
    char mdir[4096];
    snprintf(mdir, sizeof mdir, "%s/%s", r->root, name);
    struct stat st;
    if (stat(mdir, &st) || !S_ISDIR(st.st_mode))
        return ERR(STATUS_NOT_FOUND, "failed to poll from model repository: model '%s' is not in it", name);
    uint64_t sig = dir_signature(mdir, 2);
    size_t cfg_len = 0;
    char e2[4400];
    char *cfg = NULL;
    const char *cfg_file = "parameters.config";
    if (override) {
        cfg = strdup(override);
        cfg_len = strlen(override);
    } else {
        /* config.json or config.pbtxt, the latter as the same JSON. */
        int frc = model_config_read_file(mdir, &cfg, &cfg_len, &cfg_file, e2, sizeof e2);
        if (frc && frc != STATUS_NOT_FOUND) {
            ERR(STATUS_INVALID, "model '%s': %s", name, e2);
            entry_set_state(r, name, ST_UNAVAILABLE, err);
            return STATUS_INVALID;
        }
    }
    /* The policy comes from the config; parse it once without the model. */
    struct model_config pc;
    model_config_init(&pc, name);
    if (cfg && (model_config_parse(&pc, cfg, cfg_len, e2, sizeof e2) || check_bounds(r, &pc, e2, sizeof e2))) {
        ERR(STATUS_INVALID, "model '%s': %s: %s", name, cfg_file, e2);
        model_config_clear(&pc);
        free(cfg);
        entry_set_state(r, name, ST_UNAVAILABLE, err);
        return STATUS_INVALID;
    }
    /* An ensemble's versions are folders without files; none is version 1. */
    int ensemble = pc.ensemble;
    entry_set_steps(r, name, &pc);
    int64_t present[256];
    int np = scan_versions(mdir, present, 256, ensemble);
    if (up && up->n && np > 0) np = versions_uploaded(up, present, np);
    if (np <= 0 && ensemble) present[np = 0, np++] = 1;
    if (np <= 0) {
        ERR(STATUS_INVALID, "model '%s' has no version folder with a model.onnx (expected %s/1/model.onnx)", name, mdir);
        model_config_clear(&pc);
        free(cfg);
        entry_set_state(r, name, ST_UNAVAILABLE, err);
        return STATUS_INVALID;
    }
    /* Fields accepted but ignored are said once per load, here. */
    for (const char *w = pc.warnings; w && *w;) {
        size_t n = strcspn(w, "\n");
        log_warn("model '%s': %s: %.*s", name, cfg_file, (int)n, w);
        w += n + (w[n] == '\n');
    }
    int64_t want[256];
    int nw = 0;
    for (int i = 0; i < np; i++)
        if (model_config_version_wanted(&pc, present[i], present, np) && nw < r->max_versions) want[nw++] = present[i];
    model_config_clear(&pc);
    if (nw == 0) {
        free(cfg);
        char have[256] = "";
        for (int i = 0; i < np; i++)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", i ? ", " : "", (long long)present[i]);
        ERR(STATUS_INVALID, "model '%s': the version_policy selects none of the versions present (%s)", name, have);
        entry_set_state(r, name, ST_UNAVAILABLE, err);
        return STATUS_INVALID;
    }
    pthread_rwlock_rdlock(&r->lock);
    struct entry *e = entry_find(r, name);
    int was_ready = e && e->state == ST_READY;
    pthread_rwlock_unlock(&r->lock);
    if (!was_ready) entry_set_state(r, name, ST_LOADING, "");

    struct repo_version **nv = calloc((size_t)nw, sizeof *nv);
    int rc = nv ? 0 : STATUS_NOMEM;
    for (int i = 0; !rc && i < nw; i++) {
        nv[i] = version_load(r, name, mdir, want[i], cfg, cfg_len, cfg_file, ensemble, err, err_len);
        if (!nv[i]) rc = STATUS_INVALID;
    }
    free(cfg);
    return versions_publish(r, name, nv, nw, rc, was_ready, sig, err);
}

int repository_load(repository_t *r, const char *name, char *err, size_t err_len) {
    return repository_load_with_config(r, name, NULL, err, err_len);
}

int repository_load_files(repository_t *r, const char *name, const char *config_json, const struct upload_set *files,
                          char *err, size_t err_len) {
    pthread_mutex_lock(&r->control);
    int rc = load_locked(r, name, config_json, files, err, err_len);
    pthread_mutex_unlock(&r->control);
    return rc;
}

int repository_load_with_config(repository_t *r, const char *name, const char *config_json, char *err,
                                size_t err_len) {
    pthread_mutex_lock(&r->control);
    int rc = load_locked(r, name, config_json, NULL, err, err_len);
    pthread_mutex_unlock(&r->control);
    return rc;
}

static int unload_locked(repository_t *r, const char *name, char *err, size_t err_len) {
    pthread_rwlock_rdlock(&r->lock);
    struct entry *e = entry_find(r, name);
    int known = e != NULL;
    pthread_rwlock_unlock(&r->lock);
    if (!known) {
        char mdir[4096];
        struct stat st;
        snprintf(mdir, sizeof mdir, "%s/%s", r->root, name);
        if (!valid_name(name) || stat(mdir, &st) || !S_ISDIR(st.st_mode))
            return ERR(STATUS_NOT_FOUND, "model '%s' is not in the model repository", name);
    }
    entry_swap(r, name, NULL, 0, ST_UNAVAILABLE, "unloaded", 0);
    /* An ensemble unloaded on request stays unloaded: no load of a step's
     * model brings it back (unload_dependents' do come back). */
    pthread_rwlock_wrlock(&r->lock);
    if ((e = entry_find(r, name))) {
        free(e->steps);
        e->steps = NULL;
    }
    pthread_rwlock_unlock(&r->lock);
    unload_dependents(r, name, 0);
    return 0;
}

int repository_unload(repository_t *r, const char *name, char *err, size_t err_len) {
    pthread_mutex_lock(&r->control);
    int rc = unload_locked(r, name, err, err_len);
    pthread_mutex_unlock(&r->control);
    return rc;
}

/* Model folder names in the root, sorted; caller frees each and the array. */
static int list_folders(repository_t *r, char ***out) {
    DIR *d = opendir(r->root);
    if (!d) return -1;
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!valid_name(e->d_name)) continue;
        char p[4096];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", r->root, e->d_name);
        if (stat(p, &st) || !S_ISDIR(st.st_mode)) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(names, (size_t)cap * sizeof *nn);
            if (!nn) break;
            names = nn;
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: repositories are small */
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *t = names[j]; names[j] = names[j - 1]; names[j - 1] = t;
        }
    *out = names;
    return n;
}

/* The folder's configuration parsed into c (model_config_init'ed): 1 if
 * it is an ensemble's, else 0 (whatever its errors: the load says them). */
static int folder_ensemble(const repository_t *r, const char *name, struct model_config *c) {
    char mdir[4096], e2[512];
    snprintf(mdir, sizeof mdir, "%s/%s", r->root, name);
    char *cfg = NULL;
    size_t len = 0;
    const char *file;
    if (model_config_read_file(mdir, &cfg, &len, &file, e2, sizeof e2)) return 0;
    int yes = model_config_parse(c, cfg, len, e2, sizeof e2) == 0 && c->ensemble;
    free(cfg);
    return yes;
}

/* Whether ensemble c (folder i) must wait for another ensemble folder of
 * names, not yet loaded, that one of its steps names. */
static int waits_for_ensemble(const struct model_config *c, char **names, const int *pending, int n, int i) {
    for (int s = 0; s < c->nsteps; s++)
        for (int j = 0; j < n; j++)
            if (j != i && pending[j] && strcmp(names[j], c->steps[s].model_name) == 0) return 1;
    return 0;
}

int repository_load_all(repository_t *r) {
    char **names;
    int n = list_folders(r, &names), failed = 0;
    if (n < 0) {
        log_error("model repository %s: %s", r->root, strerror(errno));
        return 1;
    }
    /* Models first, then ensembles, each after the ensembles its steps
     * name (a cycle among them loads as it is, and is refused). */
    char err[512];
    struct model_config *cs = calloc((size_t)n + 1, sizeof *cs);
    int *pending = calloc((size_t)n + 1, sizeof *pending);
    for (int i = 0; i < n; i++) {
        if (cs && pending) {
            model_config_init(&cs[i], names[i]);
            pending[i] = folder_ensemble(r, names[i], &cs[i]);
        }
        if (!(pending && pending[i]) && repository_load(r, names[i], err, sizeof err)) failed++;
    }
    for (int progress = 1; cs && pending && progress;) {
        progress = 0;
        for (int i = 0; i < n; i++) {
            if (!pending[i] || waits_for_ensemble(&cs[i], names, pending, n, i)) continue;
            pending[i] = 0;
            progress = 1;
            if (repository_load(r, names[i], err, sizeof err)) failed++;
        }
    }
    for (int i = 0; cs && pending && i < n; i++)
        if (pending[i] && repository_load(r, names[i], err, sizeof err)) failed++;
    for (int i = 0; i < n; i++) {
        if (cs) model_config_clear(&cs[i]);
        free(names[i]);
    }
    free(cs);
    free(pending);
    free(names);
    return failed;
}

void repository_poll(repository_t *r) {
    pthread_mutex_lock(&r->control);
    char **names;
    int n = list_folders(r, &names);
    char err[512];
    for (int i = 0; i < n; i++) {
        char mdir[4096];
        snprintf(mdir, sizeof mdir, "%s/%s", r->root, names[i]);
        uint64_t sig = dir_signature(mdir, 2);
        pthread_rwlock_rdlock(&r->lock);
        struct entry *e = entry_find(r, names[i]);
        int changed = !e || e->signature != sig;
        pthread_rwlock_unlock(&r->lock);
        if (changed) {
            if (load_locked(r, names[i], NULL, NULL, err, sizeof err)) {
                /* Remember the failed signature so a broken model is retried only when it changes. */
                pthread_rwlock_wrlock(&r->lock);
                if ((e = entry_find(r, names[i]))) e->signature = sig;
                pthread_rwlock_unlock(&r->lock);
            }
        }
    }
    /* Folders that went away. */
    pthread_rwlock_rdlock(&r->lock);
    int ne = r->nentries;
    char **gone = calloc((size_t)ne + 1, sizeof *gone);
    int ng = 0;
    for (int i = 0; gone && i < ne; i++) {
        int found = 0;
        for (int j = 0; j < n && !found; j++) found = strcmp(names[j], r->entries[i].name) == 0;
        if (!found && r->entries[i].nversions) gone[ng++] = strdup(r->entries[i].name);
    }
    pthread_rwlock_unlock(&r->lock);
    for (int i = 0; i < ng; i++) {
        log_info("model '%s' left the repository: unloading", gone[i]);
        entry_swap(r, gone[i], NULL, 0, ST_UNAVAILABLE, "removed from the repository", 0);
        unload_dependents(r, gone[i], 0);
        free(gone[i]);
    }
    free(gone);
    for (int i = 0; i < n; i++) free(names[i]);
    if (n > 0) free(names);
    pthread_mutex_unlock(&r->control);
}

/* ---- lookups ------------------------------------------------------------ */

struct repo_version *repository_acquire(repository_t *r, const char *name, int64_t version, int *status,
                                        char *err, size_t err_len) {
    struct repo_version *v = NULL;
    pthread_rwlock_rdlock(&r->lock);
    struct entry *e = entry_find(r, name);
    if (!e) {
        /* In explicit mode a model can be in the repository without having been loaded yet. */
        char mdir[4096];
        struct stat st;
        snprintf(mdir, sizeof mdir, "%s/%s", r->root, name);
        if (valid_name(name) && stat(mdir, &st) == 0 && S_ISDIR(st.st_mode))
            *status = ERR(STATUS_NOT_FOUND, "Request for unknown model: '%s' is not found (its folder is in the "
                          "repository but the model is not loaded; in explicit mode: POST "
                          "/v2/repository/models/%s/load)", name, name);
        else *status = ERR(STATUS_NOT_FOUND, "Request for unknown model: '%s' is not found", name);
    }
    /* Triton's words, which its clients and tests match ("... has no
     * available versions", "... version 1 is not at ready state"), then why. */
    else if (e->nversions == 0 && version > 0)
        *status = ERR(STATUS_UNAVAILABLE, "Request for unknown model: '%s' version %lld is not at ready state (not "
                      "ready: %s)", name, (long long)version,
                      e->state == ST_LOADING ? "loading" : e->reason[0] ? e->reason : "unloaded");
    else if (e->nversions == 0)
        *status = ERR(STATUS_UNAVAILABLE, "Request for unknown model: '%s' has no available versions (not ready: %s)",
                      name, e->state == ST_LOADING ? "loading" : e->reason[0] ? e->reason : "unloaded");
    else if (version <= 0) v = e->versions[e->nversions - 1];
    else {
        for (int i = 0; i < e->nversions; i++)
            if (e->versions[i]->version == version) v = e->versions[i];
        if (!v) {
            char have[200] = "";
            for (int i = 0; i < e->nversions; i++)
                snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", i ? ", " : "", e->versions[i]->version_str);
            *status = ERR(STATUS_NOT_FOUND, "Request for unknown model: '%s' version %lld is not found (versions "
                          "loaded: %s)", name, (long long)version, have);
        }
    }
    if (v) atomic_fetch_add(&v->refs, 1);
    pthread_rwlock_unlock(&r->lock);
    return v;
}

int repository_list(repository_t *r, struct repo_version ***out) {
    pthread_rwlock_rdlock(&r->lock);
    int n = 0;
    for (int i = 0; i < r->nentries; i++) n += r->entries[i].nversions;
    struct repo_version **a = calloc((size_t)n + 1, sizeof *a);
    int k = 0;
    for (int i = 0; a && i < r->nentries; i++)
        for (int j = 0; j < r->entries[i].nversions; j++) {
            a[k] = r->entries[i].versions[j];
            atomic_fetch_add(&a[k]->refs, 1);
            k++;
        }
    pthread_rwlock_unlock(&r->lock);
    *out = a;
    return a ? k : 0;
}

cJSON *repository_index(repository_t *r, int ready_only) {
    cJSON *arr = cJSON_CreateArray();
    char **names;
    int n = list_folders(r, &names);
    if (n < 0) n = 0;
    pthread_rwlock_rdlock(&r->lock);
    /* Folders, plus entries whose folder is gone but which still serve. */
    for (int pass = 0; pass < 2; pass++) {
        int count = pass == 0 ? n : r->nentries;
        for (int i = 0; i < count; i++) {
            const char *name = pass == 0 ? names[i] : r->entries[i].name;
            if (pass == 1) {
                int listed = 0;
                for (int j = 0; j < n && !listed; j++) listed = strcmp(names[j], name) == 0;
                if (listed || r->entries[i].nversions == 0) continue;
            }
            struct entry *e = entry_find(r, name);
            if (e && e->nversions) {
                for (int j = 0; j < e->nversions; j++) {
                    cJSON *o = cJSON_CreateObject();
                    cJSON_AddStringToObject(o, "name", name);
                    cJSON_AddStringToObject(o, "version", e->versions[j]->version_str);
                    cJSON_AddStringToObject(o, "state", "READY");
                    cJSON_AddStringToObject(o, "reason", "");
                    cJSON_AddItemToArray(arr, o);
                }
            } else if (!ready_only) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "name", name);
                cJSON_AddStringToObject(o, "version", "");
                cJSON_AddStringToObject(o, "state", g_state_names[e ? e->state : ST_UNAVAILABLE]);
                cJSON_AddStringToObject(o, "reason", e ? e->reason : "unloaded");
                cJSON_AddItemToArray(arr, o);
            }
        }
    }
    pthread_rwlock_unlock(&r->lock);
    for (int i = 0; i < n; i++) free(names[i]);
    if (n > 0) free(names);
    return arr;
}

void repository_stop_admission(repository_t *r) {
    pthread_rwlock_rdlock(&r->lock);
    for (int i = 0; i < r->nentries; i++)
        for (int j = 0; j < r->entries[i].nversions; j++) batcher_stop_admission(r->entries[i].versions[j]->batcher);
    pthread_rwlock_unlock(&r->lock);
}

int repository_pending(repository_t *r) {
    int n = 0;
    pthread_rwlock_rdlock(&r->lock);
    for (int i = 0; i < r->nentries; i++)
        for (int j = 0; j < r->entries[i].nversions; j++) n += batcher_pending(r->entries[i].versions[j]->batcher);
    pthread_rwlock_unlock(&r->lock);
    return n;
}

/* ---- life cycle --------------------------------------------------------- */

repository_t *repository_create(const struct repository_params *p, char *err, size_t err_len) {
    struct stat st;
    if (!p->root || stat(p->root, &st) || !S_ISDIR(st.st_mode)) {
        ERR(STATUS_INVALID, "model repository '%s' is not a folder", p->root ? p->root : "(none)");
        return NULL;
    }
    repository_t *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->root = strdup(p->root);
    /* "repo/" and "repo" name the same folder; messages strip "<root>/". */
    for (size_t n = r->root ? strlen(r->root) : 0; n > 1 && r->root[n - 1] == '/'; n--) r->root[n - 1] = 0;
    r->max_instances = p->max_instances;
    r->max_intra_op_threads = p->max_intra_op_threads;
    r->inline_max_us = p->inline_max_us;
    r->max_request_memory = p->max_request_memory;
    r->backend = strdup(p->backend ? p->backend : "cpu");
    r->max_versions = p->max_versions > 0 ? p->max_versions : 64;
    pthread_rwlock_init(&r->lock, NULL);
    pthread_mutex_init(&r->control, NULL);
    pthread_mutex_init(&r->reap_lock, NULL);
    pthread_cond_init(&r->reap_cond, NULL);
    pthread_cond_init(&r->reap_idle, NULL);
    if (pthread_create(&r->reaper, NULL, reaper_main, r)) {
        ERR(STATUS_INTERNAL, "cannot start the repository's reaper thread");
        free(r->root);
        free(r->backend);
        free(r);
        return NULL;
    }
    return r;
}

void repository_free(repository_t *r) {
    if (!r) return;
    pthread_mutex_lock(&r->control);
    pthread_rwlock_rdlock(&r->lock);
    int n = r->nentries;
    char **names = calloc((size_t)n + 1, sizeof *names);
    for (int i = 0; names && i < n; i++) names[i] = strdup(r->entries[i].name);
    pthread_rwlock_unlock(&r->lock);
    for (int i = 0; names && i < n; i++) {
        entry_swap(r, names[i], NULL, 0, ST_UNAVAILABLE, "server exiting", 0);
        free(names[i]);
    }
    free(names);
    pthread_mutex_unlock(&r->control);
    /* Wait for the last references (requests still being answered) to go. */
    pthread_mutex_lock(&r->reap_lock);
    while (r->live > 0) pthread_cond_wait(&r->reap_idle, &r->reap_lock);
    r->stopping = 1;
    pthread_cond_signal(&r->reap_cond);
    pthread_mutex_unlock(&r->reap_lock);
    pthread_join(r->reaper, NULL);
    for (int i = 0; i < r->nentries; i++) {
        free(r->entries[i].name);
        free(r->entries[i].steps);
        free(r->entries[i].versions);
    }
    free(r->entries);
    free(r->reap);
    pthread_rwlock_destroy(&r->lock);
    pthread_mutex_destroy(&r->control);
    pthread_mutex_destroy(&r->reap_lock);
    pthread_cond_destroy(&r->reap_cond);
    pthread_cond_destroy(&r->reap_idle);
    free(r->root);
    free(r->backend);
    free(r);
}
