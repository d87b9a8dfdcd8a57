#include "server/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RLX memory_order_relaxed

const double metrics_bucket_bounds_s[METRICS_NBUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60,
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(struct metrics_model *) g_head;

char *metrics_label_escape(const char *value) {
    size_t n = 0;
    for (const char *p = value; *p; p++) n += *p == '\\' || *p == '"' || *p == '\n' ? 2 : 1;
    char *out = malloc(n + 1), *o = out;
    if (!out) return NULL;
    for (const char *p = value; *p; p++) {
        if (*p == '\\' || *p == '"') *o++ = '\\', *o++ = *p;
        else if (*p == '\n') *o++ = '\\', *o++ = 'n';
        else *o++ = *p;
    }
    *o = 0;
    return out;
}

struct metrics_model *metrics_model_get(const char *model, const char *version) {
    /* Lock-free lookup: records are only ever prepended, never removed. */
    for (struct metrics_model *m = atomic_load(&g_head); m; m = m->next)
        if (strcmp(m->model, model) == 0 && strcmp(m->version, version) == 0) return m;
    pthread_mutex_lock(&g_lock);
    struct metrics_model *m;
    for (m = atomic_load(&g_head); m; m = m->next)
        if (strcmp(m->model, model) == 0 && strcmp(m->version, version) == 0) break;
    if (!m && (m = calloc(1, sizeof *m))) {
        m->model = strdup(model);
        m->version = strdup(version);
        m->model_label = metrics_label_escape(model);
        m->version_label = metrics_label_escape(version);
        if (!m->model || !m->version || !m->model_label || !m->version_label) {
            free(m->model);
            free(m->version);
            free(m->model_label);
            free(m->version_label);
            free(m);
            pthread_mutex_unlock(&g_lock);
            return NULL;
        }
        m->next = atomic_load(&g_head);
        atomic_store(&g_head, m);
    }
    pthread_mutex_unlock(&g_lock);
    return m;
}

void metrics_foreach(int (*fn)(void *arg, struct metrics_model *m), void *arg) {
    for (struct metrics_model *m = atomic_load(&g_head); m; m = m->next)
        if (fn(arg, m)) break;
}

static void hist_add(struct metrics_hist *h, uint64_t ns) {
    double s = (double)ns / 1e9;
    int b = 0;
    while (b < METRICS_NBUCKETS && s > metrics_bucket_bounds_s[b]) b++;
    atomic_fetch_add_explicit(&h->bucket[b], 1, RLX);
    atomic_fetch_add_explicit(&h->sum_ns, ns, RLX);
    atomic_fetch_add_explicit(&h->count, 1, RLX);
}

static void dur_add(struct metrics_duration *d, uint64_t ns) {
    atomic_fetch_add_explicit(&d->count, 1, RLX);
    atomic_fetch_add_explicit(&d->ns, ns, RLX);
}

/* What every answered request records, run or cached. */
void metrics_record_cached(struct metrics_model *m, uint64_t request_ns, int64_t rows) {
    if (!m) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    atomic_fetch_add_explicit(&m->success, 1, RLX);
    atomic_fetch_add_explicit(&m->inference_count, (uint64_t)rows, RLX);
    atomic_store_explicit(&m->last_inference_ms, (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000, RLX);
    dur_add(&m->d_success, request_ns);
    hist_add(&m->h_request, request_ns);
}

void metrics_record_success(struct metrics_model *m, uint64_t request_ns, uint64_t queue_ns, uint64_t input_ns,
                            uint64_t infer_ns, uint64_t output_ns, int64_t rows, int batch_size) {
    if (!m) return;
    metrics_record_cached(m, request_ns, rows);
    dur_add(&m->d_queue, queue_ns);
    dur_add(&m->d_input, input_ns);
    dur_add(&m->d_infer, infer_ns);
    dur_add(&m->d_output, output_ns);
    hist_add(&m->h_queue, queue_ns);
    hist_add(&m->h_compute, input_ns + infer_ns + output_ns);
    int b = batch_size < 1 ? 1 : batch_size > METRICS_MAX_BATCH ? METRICS_MAX_BATCH : batch_size;
    atomic_fetch_add_explicit(&m->batch_input_ns[b], input_ns, RLX);
    atomic_fetch_add_explicit(&m->batch_infer_ns[b], infer_ns, RLX);
    atomic_fetch_add_explicit(&m->batch_output_ns[b], output_ns, RLX);
    atomic_fetch_add_explicit(&m->batch_requests[b], 1, RLX);
}

void metrics_record_failure(struct metrics_model *m, int status, uint64_t request_ns) {
    enum status_reason why = status_reason(status);
    if (!m || why == STATUS_REASON_NONE) return;
    atomic_fetch_add_explicit(&m->fail[why], 1, RLX);
    dur_add(&m->d_fail, request_ns);
    hist_add(&m->h_request, request_ns);
}

void metrics_record_cache(struct metrics_model *m, int hit, uint64_t ns) {
    if (m) dur_add(hit ? &m->d_cache_hit : &m->d_cache_miss, ns);
}

void metrics_record_load(struct metrics_model *m, uint64_t load_ns) {
    if (m) atomic_store_explicit(&m->load_ns, load_ns, RLX);
}

/* ---- rendering ---------------------------------------------------------- */

char *metrics_appendf(char *buf, size_t *len, size_t *cap, const char *fmt, ...) {
    for (;;) {
        if (!buf || *cap - *len < 256) {
            size_t nc = *cap ? *cap * 2 : 16384;
            char *nb = realloc(buf, nc);
            if (!nb) return buf;
            buf = nb;
            *cap = nc;
        }
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (n < 0) return buf;
        if ((size_t)n < *cap - *len) {
            *len += (size_t)n;
            return buf;
        }
        size_t nc = *len + (size_t)n + 256;
        char *nb = realloc(buf, nc);
        if (!nb) return buf;
        buf = nb;
        *cap = nc;
    }
}

#define LOAD(x) ((unsigned long long)atomic_load_explicit(&(x), RLX))

static char *render_hist(char *buf, size_t *len, size_t *cap, const char *name, const char *help,
                         size_t off) {
    buf = metrics_appendf(buf, len, cap, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (struct metrics_model *m = atomic_load(&g_head); m; m = m->next) {
        struct metrics_hist *h = (struct metrics_hist *)((char *)m + off);
        unsigned long long cum = 0;
        for (int b = 0; b < METRICS_NBUCKETS; b++) {
            cum += LOAD(h->bucket[b]);
            buf = metrics_appendf(buf, len, cap, "%s_bucket{model=\"%s\",version=\"%s\",le=\"%g\"} %llu\n", name,
                                  m->model_label, m->version_label, metrics_bucket_bounds_s[b], cum);
        }
        cum += LOAD(h->bucket[METRICS_NBUCKETS]);
        buf = metrics_appendf(buf, len, cap, "%s_bucket{model=\"%s\",version=\"%s\",le=\"+Inf\"} %llu\n", name,
                              m->model_label, m->version_label, cum);
        buf = metrics_appendf(buf, len, cap, "%s_sum{model=\"%s\",version=\"%s\"} %.9f\n", name, m->model_label, m->version_label,
                              (double)LOAD(h->sum_ns) / 1e9);
        buf = metrics_appendf(buf, len, cap, "%s_count{model=\"%s\",version=\"%s\"} %llu\n", name, m->model_label,
                              m->version_label, LOAD(h->count));
    }
    return buf;
}

static char *render_counter(char *buf, size_t *len, size_t *cap, const char *name, const char *type,
                            const char *help, size_t off, double scale) {
    buf = metrics_appendf(buf, len, cap, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    for (struct metrics_model *m = atomic_load(&g_head); m; m = m->next) {
        atomic_uint_fast64_t *v = (atomic_uint_fast64_t *)((char *)m + off);
        if (scale == 1)
            buf = metrics_appendf(buf, len, cap, "%s{model=\"%s\",version=\"%s\"} %llu\n", name, m->model_label, m->version_label,
                                  LOAD(*v));
        else
            buf = metrics_appendf(buf, len, cap, "%s{model=\"%s\",version=\"%s\"} %.6f\n", name, m->model_label, m->version_label,
                                  (double)LOAD(*v) * scale);
    }
    return buf;
}

char *metrics_render(char *(*extra)(void *arg, char *buf, size_t *len, size_t *cap), void *arg) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
#define OFF(f) offsetof(struct metrics_model, f)
    buf = render_counter(buf, &len, &cap, "kiln_inference_request_success", "counter",
                         "Inference requests that succeeded", OFF(success), 1);
    buf = metrics_appendf(buf, &len, &cap,
                          "# HELP kiln_inference_request_failure Inference requests that failed, by reason\n"
                          "# TYPE kiln_inference_request_failure counter\n");
    for (struct metrics_model *m = atomic_load(&g_head); m; m = m->next)
        for (int r = STATUS_REASON_NONE + 1; r < STATUS_REASON_N_; r++)
            buf = metrics_appendf(buf, &len, &cap,
                                  "kiln_inference_request_failure{model=\"%s\",version=\"%s\",reason=\"%s\"} %llu\n",
                                  m->model_label, m->version_label, status_reason_str(r), LOAD(m->fail[r]));
    buf = render_counter(buf, &len, &cap, "kiln_inference_count", "counter",
                         "Inferences performed (a batch of n rows counts n)", OFF(inference_count), 1);
    buf = render_counter(buf, &len, &cap, "kiln_inference_request_duration_us", "counter",
                         "Cumulative time successful requests spent in the server", OFF(d_success.ns), 1e-3);
    buf = render_counter(buf, &len, &cap, "kiln_inference_queue_duration_us", "counter",
                         "Cumulative time requests waited in the queue", OFF(d_queue.ns), 1e-3);
    buf = render_counter(buf, &len, &cap, "kiln_inference_compute_input_duration_us", "counter",
                         "Cumulative time gathering inputs", OFF(d_input.ns), 1e-3);
    buf = render_counter(buf, &len, &cap, "kiln_inference_compute_infer_duration_us", "counter",
                         "Cumulative time running the model", OFF(d_infer.ns), 1e-3);
    buf = render_counter(buf, &len, &cap, "kiln_inference_compute_output_duration_us", "counter",
                         "Cumulative time scattering outputs", OFF(d_output.ns), 1e-3);
    buf = render_counter(buf, &len, &cap, "kiln_cache_num_hits_per_model", "counter", "Result cache hits",
                         OFF(d_cache_hit.count), 1);
    buf = render_counter(buf, &len, &cap, "kiln_cache_num_misses_per_model", "counter", "Result cache misses",
                         OFF(d_cache_miss.count), 1);
    buf = metrics_appendf(buf, &len, &cap,
                          "# HELP kiln_inference_pending_request_count Requests accepted and not yet answered\n"
                          "# TYPE kiln_inference_pending_request_count gauge\n");
    for (struct metrics_model *m = atomic_load(&g_head); m; m = m->next)
        buf = metrics_appendf(buf, &len, &cap, "kiln_inference_pending_request_count{model=\"%s\",version=\"%s\"} %lld\n",
                              m->model_label, m->version_label, (long long)atomic_load_explicit(&m->pending, RLX));
    buf = render_counter(buf, &len, &cap, "kiln_model_load_duration_seconds", "gauge",
                         "Time the last load of the model took", OFF(load_ns), 1e-9);
    buf = render_hist(buf, &len, &cap, "kiln_request_duration_seconds",
                      "Time from a request's arrival to its answer", OFF(h_request));
    buf = render_hist(buf, &len, &cap, "kiln_queue_duration_seconds", "Time requests waited for a batch",
                      OFF(h_queue));
    buf = render_hist(buf, &len, &cap, "kiln_compute_duration_seconds",
                      "Time of the batch a request ran in (input + infer + output)", OFF(h_compute));
#undef OFF
    if (extra) buf = extra(arg, buf, &len, &cap);
    if (!buf) return strdup("");
    return buf;
}
