/* http_bodies.c - the JSON and text bodies of kiln's read-only endpoints:
 * server and model metadata, statistics, the metrics page. They read the
 * repository, the batchers' and the cache's counters; none touches a
 * connection, so any transport may serve them. */
#include "server/http_bodies.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "server/batcher.h"
#include "common/version.h"
#include "server/ensemble.h"
#include "models/model.h"
#include "server/infer_cache.h"
#include "server/metrics.h"
#include "server/shm.h"

#if defined(__has_include)
#if __has_include("server/gpu_metrics.h")
#include "server/gpu_metrics.h"
#define KILN_HAVE_GPU_METRICS 1
#endif
#endif

/* ==== metadata =========================================================== */

cJSON *http_body_server_metadata(void) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", "kiln");
    cJSON_AddStringToObject(o, "version", KILN_VERSION);
    cJSON *ext = cJSON_AddArrayToObject(o, "extensions");
    static const char *exts[] = {"classification", "model_repository", "model_configuration", "schedule_policy",
                                 "binary_tensor_data", "statistics", "system_shared_memory"};
    for (size_t i = 0; i < sizeof exts / sizeof exts[0]; i++) cJSON_AddItemToArray(ext, cJSON_CreateString(exts[i]));
    if (shm_cuda_usable()) cJSON_AddItemToArray(ext, cJSON_CreateString("cuda_shared_memory"));
    return o;
}

static cJSON *io_meta(const struct model_config *c, const struct model_config_io *io, int n) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        if (io[i].hidden) continue; /* the sequence batcher fills or keeps it */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", io[i].name);
        cJSON_AddStringToObject(o, "datatype", dtype_kserve_name(io[i].dtype));
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        if (c->max_batch_size > 0) cJSON_AddItemToArray(sh, cJSON_CreateNumber(-1));
        for (int d = 0; d < io[i].ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)io[i].dims[d]));
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

cJSON *http_body_model_metadata(repository_t *repo, const struct repo_version *v) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", v->name);
    cJSON *vs = cJSON_AddArrayToObject(o, "versions");
    struct repo_version **all;
    int n = repository_list(repo, &all);
    for (int i = 0; i < n; i++) {
        if (strcmp(all[i]->name, v->name) == 0) cJSON_AddItemToArray(vs, cJSON_CreateString(all[i]->version_str));
        repository_release(all[i]);
    }
    free(all);
    cJSON_AddStringToObject(o, "platform", v->config.platform);
    cJSON_AddItemToObject(o, "inputs", io_meta(&v->config, v->config.inputs, v->config.ninputs));
    cJSON_AddItemToObject(o, "outputs", io_meta(&v->config, v->config.outputs, v->config.noutputs));
    return o;
}

/* ==== statistics ========================================================= */

static void add_duration(cJSON *parent, const char *key, struct metrics_duration *d) {
    cJSON *o = cJSON_AddObjectToObject(parent, key);
    cJSON_AddNumberToObject(o, "count", (double)atomic_load_explicit(&d->count, memory_order_relaxed));
    cJSON_AddNumberToObject(o, "ns", (double)atomic_load_explicit(&d->ns, memory_order_relaxed));
}

/* kiln's own, beside Triton's fields: padded batching per length bucket
 * (the last, length 0, holds requests longer than every bucket). */
static cJSON *padding_stats(const struct batcher_stats *bs) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < bs->npad; i++) {
        const struct batcher_pad_stats *p = &bs->pad[i];
        if (!p->batches) continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "bucket", (double)p->length);
        cJSON_AddNumberToObject(e, "batches", (double)p->batches);
        cJSON_AddNumberToObject(e, "rows", (double)p->rows);
        cJSON_AddNumberToObject(e, "real_elements", (double)p->real);
        cJSON_AddNumberToObject(e, "padded_elements", (double)p->padded);
        cJSON_AddItemToArray(arr, e);
    }
    return arr;
}

/* kiln's own, beside Triton's fields: an ensemble's steps, each with its
 * model, the requests that ran it and their time in it (its model's own
 * statistics count them too, as any request). */
static cJSON *ensemble_stats(ensemble_t *e) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < ensemble_nsteps(e); i++) {
        struct ensemble_step_stats st;
        ensemble_step_stats(e, i, &st);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "step", i);
        cJSON_AddStringToObject(o, "model_name", st.model);
        cJSON_AddNumberToObject(o, "success_count", (double)st.success);
        cJSON_AddNumberToObject(o, "failure_count", (double)st.failure);
        cJSON_AddNumberToObject(o, "ns", (double)st.ns);
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

static cJSON *model_stats(struct repo_version *v) {
    struct metrics_model *m = v->metrics;
    struct batcher_stats bs;
    memset(&bs, 0, sizeof bs);
    batcher_get_stats(v->batcher, &bs);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", v->name);
    cJSON_AddStringToObject(o, "version", v->version_str);
    cJSON_AddNumberToObject(o, "last_inference", (double)atomic_load(&m->last_inference_ms));
    cJSON_AddNumberToObject(o, "inference_count", (double)atomic_load(&m->inference_count));
    cJSON_AddNumberToObject(o, "execution_count", (double)bs.executions);
    cJSON *is = cJSON_AddObjectToObject(o, "inference_stats");
    add_duration(is, "success", &m->d_success);
    add_duration(is, "fail", &m->d_fail);
    add_duration(is, "queue", &m->d_queue);
    add_duration(is, "compute_input", &m->d_input);
    add_duration(is, "compute_infer", &m->d_infer);
    add_duration(is, "compute_output", &m->d_output);
    add_duration(is, "cache_hit", &m->d_cache_hit);
    add_duration(is, "cache_miss", &m->d_cache_miss);
    cJSON *bst = cJSON_AddArrayToObject(o, "batch_stats");
    for (int b = 1; b <= METRICS_MAX_BATCH; b++) {
        uint64_t execs = bs.batch_hist[b];
        uint64_t reqs = atomic_load(&m->batch_requests[b]);
        if (!execs && !reqs) continue;
        /* Requests of one batch share its compute time: divide the per-request sums by b. */
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "batch_size", b);
        struct { const char *k; atomic_uint_fast64_t *ns; } parts[] = {
            {"compute_input", &m->batch_input_ns[b]}, {"compute_infer", &m->batch_infer_ns[b]},
            {"compute_output", &m->batch_output_ns[b]}};
        for (int p = 0; p < 3; p++) {
            cJSON *d = cJSON_AddObjectToObject(e, parts[p].k);
            cJSON_AddNumberToObject(d, "count", (double)execs);
            cJSON_AddNumberToObject(d, "ns", (double)(atomic_load(parts[p].ns) / (uint64_t)b));
        }
        cJSON_AddItemToArray(bst, e);
    }
    if (bs.npad) cJSON_AddItemToObject(o, "padding_stats", padding_stats(&bs));
    if (v->ensemble) cJSON_AddItemToObject(o, "ensemble_steps", ensemble_stats(v->ensemble));
    return o;
}

cJSON *http_body_stats(repository_t *repo, const char *model, int64_t version, int *status, char *err,
                       size_t err_len) {
    struct repo_version **all;
    int n = repository_list(repo, &all), found = 0;
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "model_stats");
    for (int i = 0; i < n; i++) {
        if ((!model || strcmp(all[i]->name, model) == 0) && (version <= 0 || all[i]->version == version)) {
            cJSON_AddItemToArray(arr, model_stats(all[i]));
            found++;
        }
        repository_release(all[i]);
    }
    free(all);
    if (model && !found) {
        cJSON_Delete(o);
        *status = 0;
        struct repo_version *v = repository_acquire(repo, model, version, status, err, err_len);
        repository_release(v);
        if (!*status) *status = status_set(err, err_len, STATUS_NOT_FOUND, "no statistics");
        return NULL;
    }
    return o;
}

/* ==== metrics ============================================================ */

struct metrics_page {
    repository_t *repo;
    cache_t *cache;
};

/* A model's name as a Prometheus label value: a folder may be named q"x. */
static const char *model_label(const struct repo_version *v) {
    return v->metrics ? v->metrics->model_label : "";
}

/* Padded batching per model and length bucket ("longer": past the last). */
static char *padding_metrics(char *buf, size_t *len, size_t *cap, struct repo_version **all,
                             const struct batcher_stats *st, int n) {
    static const struct {
        const char *name, *help;
        size_t off;
    } series[] = {
        {"kiln_padding_batches_total", "Padded batching: batches run at a length bucket",
         offsetof(struct batcher_pad_stats, batches)},
        {"kiln_padding_rows_total", "Padded batching: rows run at a length bucket (rows / batches = mean batch size)",
         offsetof(struct batcher_pad_stats, rows)},
        {"kiln_padding_real_elements_total",
         "Padded batching: elements of the first padded input that the requests sent",
         offsetof(struct batcher_pad_stats, real)},
        {"kiln_padding_padded_elements_total",
         "Padded batching: elements of the first padded input that batches ran (padding waste = 1 - real / padded)",
         offsetof(struct batcher_pad_stats, padded)},
    };
    for (size_t k = 0; k < sizeof series / sizeof series[0]; k++) {
        int any = 0;
        for (int i = 0; i < n && !any; i++) any = st[i].npad > 0;
        if (!any) break;
        buf = metrics_appendf(buf, len, cap, "# HELP %s %s\n# TYPE %s counter\n", series[k].name, series[k].help,
                              series[k].name);
        for (int i = 0; i < n; i++)
            for (int b = 0; b < st[i].npad; b++) {
                const struct batcher_pad_stats *p = &st[i].pad[b];
                char bucket[24];
                if (p->length) snprintf(bucket, sizeof bucket, "%lld", (long long)p->length);
                else snprintf(bucket, sizeof bucket, "longer");
                buf = metrics_appendf(buf, len, cap, "%s{model=\"%s\",version=\"%s\",bucket=\"%s\"} %llu\n",
                                      series[k].name, model_label(all[i]), all[i]->version_str, bucket,
                                      (unsigned long long)*(const uint64_t *)((const char *)p + series[k].off));
            }
    }
    return buf;
}

/* An ensemble's steps: kiln_ensemble_step_*{model, version, step, step_model}. */
static char *ensemble_metrics(char *buf, size_t *len, size_t *cap, struct repo_version **all, int n) {
    static const struct { const char *name, *help; } series[] = {
        {"kiln_ensemble_step_success_total", "Requests of an ensemble whose step succeeded"},
        {"kiln_ensemble_step_failure_total", "Requests of an ensemble whose step failed (its model's error, a "
                                             "cancellation, a deadline)"},
        {"kiln_ensemble_step_duration_us_total", "Time requests of an ensemble spent in a step, submission to done"}};
    for (size_t k = 0; k < sizeof series / sizeof series[0]; k++) {
        int any = 0;
        for (int i = 0; i < n; i++) {
            for (int s = 0; s < ensemble_nsteps(all[i]->ensemble); s++) {
                struct ensemble_step_stats st;
                ensemble_step_stats(all[i]->ensemble, s, &st);
                if (!any++)
                    buf = metrics_appendf(buf, len, cap, "# HELP %s %s\n# TYPE %s counter\n", series[k].name,
                                          series[k].help, series[k].name);
                char *step_model = metrics_label_escape(st.model);
                uint64_t v = k == 0 ? st.success : k == 1 ? st.failure : st.ns / 1000;
                buf = metrics_appendf(buf, len, cap, "%s{model=\"%s\",version=\"%s\",step=\"%d\",step_model=\"%s\"} %llu\n",
                                      series[k].name, model_label(all[i]), all[i]->version_str, s,
                                      step_model ? step_model : "", (unsigned long long)v);
                free(step_model);
            }
        }
    }
    return buf;
}

/* The sequence batchers' series (server/sequence.h): live and waiting
 * sequences, starts, ends and idle releases, and per slot whether a
 * sequence holds it and how many requests ran in it. */
static char *sequence_metrics(char *buf, size_t *len, size_t *cap, struct repo_version **all, int n) {
    static const struct {
        const char *name, *type, *help;
    } series[] = {
        {"kiln_sequence_live", "gauge", "Sequences holding a slot"},
        {"kiln_sequence_waiting", "gauge", "Sequences started and waiting for a slot"},
        {"kiln_sequence_started", "counter", "Sequences started"},
        {"kiln_sequence_ended", "counter", "Sequences released after their END request"},
        {"kiln_sequence_idle_released", "counter", "Sequences released after max_sequence_idle_microseconds without a request"},
        {"kiln_sequence_slot_occupied", "gauge", "1 while a sequence holds the slot"},
        {"kiln_sequence_slot_requests", "counter", "Requests run in the slot (the first 256 slots)"},
    };
    uint8_t room[4096];
    struct sequencer_stats st;
    for (size_t k = 0; k < sizeof series / sizeof series[0]; k++) {
        int any = 0;
        for (int i = 0; i < n; i++) {
            if (!all[i]->sequencer) continue;
            if (!any++)
                buf = metrics_appendf(buf, len, cap, "# HELP %s %s\n# TYPE %s %s\n", series[k].name, series[k].help,
                                      series[k].name, series[k].type);
            sequencer_get_stats(all[i]->sequencer, &st, room, (int)sizeof room);
            const uint64_t v[] = {st.live, st.waiting, st.started, st.ended, st.idle_released};
            if (k < 5) {
                buf = metrics_appendf(buf, len, cap, "%s{model=\"%s\",version=\"%s\"} %llu\n", series[k].name,
                                      model_label(all[i]), all[i]->version_str, (unsigned long long)v[k]);
                continue;
            }
            for (int sl = 0; sl < st.nslots && (k == 5 || sl < 256); sl++)
                buf = metrics_appendf(buf, len, cap, "%s{model=\"%s\",version=\"%s\",slot=\"%d\"} %llu\n",
                                      series[k].name, model_label(all[i]), all[i]->version_str, sl,
                                      (unsigned long long)(k == 5 ? st.slot_used[sl] : st.slot_requests[sl]));
        }
    }
    return buf;
}

static char *metrics_extra(void *arg, char *buf, size_t *len, size_t *cap) {
    const struct metrics_page *pg = arg;
    struct repo_version **all;
    int n = repository_list(pg->repo, &all);
    buf = metrics_appendf(buf, len, cap, "# HELP kiln_inference_exec_count Batches executed\n"
                                         "# TYPE kiln_inference_exec_count counter\n");
    struct batcher_stats *st = calloc((size_t)n + 1, sizeof *st);
    for (int i = 0; st && i < n; i++) {
        batcher_get_stats(all[i]->batcher, &st[i]);
        buf = metrics_appendf(buf, len, cap, "kiln_inference_exec_count{model=\"%s\",version=\"%s\"} %llu\n",
                              model_label(all[i]), all[i]->version_str, (unsigned long long)st[i].executions);
    }
    buf = metrics_appendf(buf, len, cap, "# HELP kiln_inline_exec_count Batches executed on the request's I/O thread "
                                         "(--inline-max-us)\n# TYPE kiln_inline_exec_count counter\n");
    for (int i = 0; st && i < n; i++)
        buf = metrics_appendf(buf, len, cap, "kiln_inline_exec_count{model=\"%s\",version=\"%s\"} %llu\n",
                              model_label(all[i]), all[i]->version_str, (unsigned long long)st[i].inline_runs);
    buf = metrics_appendf(buf, len, cap, "# HELP kiln_queue_size Requests waiting in the batcher's queue\n"
                                         "# TYPE kiln_queue_size gauge\n");
    for (int i = 0; st && i < n; i++)
        buf = metrics_appendf(buf, len, cap, "kiln_queue_size{model=\"%s\",version=\"%s\"} %llu\n", model_label(all[i]),
                              all[i]->version_str, (unsigned long long)st[i].queued);
    buf = metrics_appendf(buf, len, cap, "# HELP kiln_batch_size Rows per executed batch\n"
                                         "# TYPE kiln_batch_size histogram\n");
    static const int bounds[] = {1, 2, 4, 8, 16, 32, 64};
    for (int i = 0; st && i < n; i++) {
        unsigned long long cum = 0, sum = 0, count = 0;
        for (int b = 1; b <= 64; b++) {
            count += st[i].batch_hist[b];
            sum += st[i].batch_hist[b] * (unsigned long long)b;
        }
        int k = 0;
        for (int b = 1; b <= 64; b++) {
            cum += st[i].batch_hist[b];
            if (k < 7 && b == bounds[k]) {
                buf = metrics_appendf(buf, len, cap, "kiln_batch_size_bucket{model=\"%s\",version=\"%s\",le=\"%d\"} %llu\n",
                                      model_label(all[i]), all[i]->version_str, b, cum);
                k++;
            }
        }
        buf = metrics_appendf(buf, len, cap,
                              "kiln_batch_size_bucket{model=\"%s\",version=\"%s\",le=\"+Inf\"} %llu\n"
                              "kiln_batch_size_sum{model=\"%s\",version=\"%s\"} %llu\n"
                              "kiln_batch_size_count{model=\"%s\",version=\"%s\"} %llu\n",
                              model_label(all[i]), all[i]->version_str, count, model_label(all[i]), all[i]->version_str, sum,
                              model_label(all[i]), all[i]->version_str, count);
    }
    buf = metrics_appendf(buf, len, cap, "# HELP kiln_plan_builds Execution plans built for the model (a new "
                                         "shape, or a new value of an input that decides one)\n"
                                         "# TYPE kiln_plan_builds counter\n");
    for (int i = 0; i < n; i++)
        if (all[i]->model) /* an ensemble has none */
            buf = metrics_appendf(buf, len, cap, "kiln_plan_builds{model=\"%s\",version=\"%s\"} %llu\n",
                                  model_label(all[i]), all[i]->version_str,
                                  (unsigned long long)model_plan_builds(all[i]->model));
    if (st) buf = padding_metrics(buf, len, cap, all, st, n);
    buf = ensemble_metrics(buf, len, cap, all, n);
    buf = sequence_metrics(buf, len, cap, all, n);
    free(st);
    for (int i = 0; i < n; i++) repository_release(all[i]);
    free(all);
    if (pg->cache) buf = infer_cache_metrics(pg->cache, buf, len, cap);
#ifdef KILN_HAVE_GPU_METRICS
    char *g = gpu_metrics_text();
    if (g) {
        buf = metrics_appendf(buf, len, cap, "%s", g);
        free(g);
    }
#endif
    return buf;
}

char *http_body_metrics(repository_t *repo, cache_t *cache) {
    struct metrics_page pg = {repo, cache};
    return metrics_render(metrics_extra, &pg);
}
