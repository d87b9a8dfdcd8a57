#include "server/infer_cache.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "server/metrics.h"

/* ---- key ---------------------------------------------------------------- */

/* Sorts idx[0..n) by names[idx[i]]. Insertion sort: a model has a handful
 * of inputs, often declared in name order already (n-1 compares), and it
 * needs no context pointer (qsort has none, so it needed thread-locals). */
#define NAME_OF(base, stride, i) (*(const char *const *)(const void *)((const char *)(base) + (size_t)(i) * (stride)))
static void order_by_name(int *idx, int n, const void *base, size_t stride) {
    for (int i = 0; i < n; i++) idx[i] = i;
    for (int i = 1; i < n; i++) {
        int x = idx[i], j = i;
        const char *nx = NAME_OF(base, stride, x);
        while (j > 0 && strcmp(NAME_OF(base, stride, idx[j - 1]), nx) > 0) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = x;
    }
}

int infer_cache_key(cache_t *c, const char *model, int64_t version, const struct model_config *mc,
                    const struct tensor *ordered, const struct kserve_request *kr, struct cache_key *out) {
    /* Every input and every requested output is hashed, however many: two
     * requests that differ in any one never share a key. */
    int stack_order[64];
    int most = mc->ninputs > kr->noutputs ? mc->ninputs : kr->noutputs;
    int *order = stack_order;
    if (most > 64 && !(order = malloc((size_t)most * sizeof *order))) return -1;
    struct cache_key_state s;
    cache_key_begin(c, &s, model, version);
    int n = mc->ninputs;
    if (n) order_by_name(order, n, &mc->inputs[0].name, sizeof mc->inputs[0]);
    for (int k = 0; k < n; k++) {
        const struct tensor *t = &ordered[order[k]];
        if (!t->data && tensor_numel(t) != 0) continue; /* optional input absent */
        if (t->dtype == DT_STRING) {
            cache_key_add_input(&s, mc->inputs[order[k]].name, t->dtype, t->dims, t->ndim, NULL, 0);
            int64_t cnt = tensor_numel(t);
            const struct tensor_str *sv = tensor_strs(t); /* every byte: "a\0b" and "a" are two keys */
            for (int64_t j = 0; j < cnt; j++) cache_key_add_input(&s, "", DT_STRING, NULL, 0, sv[j].p, sv[j].len);
        } else {
            cache_key_add_input(&s, mc->inputs[order[k]].name, t->dtype, t->dims, t->ndim, t->data, tensor_nbytes(t));
        }
    }
    int m = kr->noutputs;
    if (m) order_by_name(order, m, &kr->outputs[0].name, sizeof kr->outputs[0]);
    for (int k = 0; k < m; k++) {
        const struct kserve_output *o = &kr->outputs[order[k]];
        cache_key_add_output(&s, o->name, o->binary, o->classification);
    }
    cache_key_add_output(&s, m ? "" : "*", kr->binary_data_output, 0);
    cache_key_end(&s, out);
    if (order != stack_order) free(order);
    return 0;
}

/* ---- values ↔ outputs ------------------------------------------------------ */

/* Whether a value's output can be output cfg of a request with rows rows
 * (rows < 0: the model takes no batch dim): its dtype, rank and every dim
 * the model fixes. cache_value_view checked its bytes already. */
static int output_fits(const struct cache_view_output *t, const struct model_config_io *cfg,
                       const struct model_config *mc, int64_t rows) {
    if (t->dtype != cfg->dtype) return 0;
    int lead = mc->max_batch_size > 0;
    if (lead && (t->ndim < 1 || (rows >= 0 && t->dims[0] != rows))) return 0;
    if (cfg->ndim < 0) return 1; /* the model's file leaves the rank open */
    if (t->ndim != cfg->ndim + lead) return 0;
    for (int d = 0; d < cfg->ndim; d++)
        if (cfg->dims[d] >= 0 && t->dims[d + lead] != cfg->dims[d]) return 0;
    return 1;
}

/* Copies a cached value into o[mc->noutputs], one malloc'd block each (the
 * value may be evicted while the answer is encoded); -1, with no block left,
 * if the value is malformed or does not hold every output of the model, each
 * as the model and the request (rows) make it. The value is decoded and
 * checked once, by cache_value_view; what it hands out is copied as it is. */
static int value_to_outputs(const struct cache_value *v, const struct model_config *mc, int64_t rows,
                            struct tensor *o) {
    struct cache_view view;
    if (cache_value_view(v, &view) || view.n != mc->noutputs) return -1;
    memset(o, 0, sizeof *o * (size_t)mc->noutputs);
    for (int i = 0; i < mc->noutputs; i++) {
        int j = 0;
        while (j < view.n && strcmp(view.out[j].name, mc->outputs[i].name) != 0) j++;
        if (j == view.n || !output_fits(&view.out[j], &mc->outputs[i], mc, rows)) goto fail;
        const struct cache_view_output *vo = &view.out[j];
        o[i].dtype = vo->dtype;
        o[i].ndim = vo->ndim;
        memcpy(o[i].dims, vo->dims, sizeof vo->dims);
        if (vo->dtype == DT_STRING) {
            if (tensor_strings_from_prefixed(&o[i], vo->data, vo->len, NULL, 0)) goto fail;
        } else {
            o[i].data = malloc(vo->len ? vo->len : 1);
            if (!o[i].data) goto fail;
            memcpy(o[i].data, vo->data, vo->len);
        }
    }
    return 0;
fail:
    for (int i = 0; i < mc->noutputs; i++) tensor_free_data(&o[i]);
    return -1;
}

/* ---- the lookup chain ------------------------------------------------------- */

static void finish(struct infer_cache_op *op, int hit) {
    op->lookup_ns = clock_now_ns() - op->t0;
    cache_record_lookup(op->cache, op->lookup_ns);
    op->done(op->arg, hit);
}

/* Tries to answer from v (a referenced value, consumed). */
static int answer_from(struct infer_cache_op *op, struct cache_value *v) {
    if (!v) return 0;
    int ok = value_to_outputs(v, op->mc, op->rows, op->outputs) == 0;
    cache_value_unref(v);
    return ok;
}

static void follower_resume(void *arg) {
    struct infer_cache_op *op = arg;
    struct cache_value *v = op->value;
    op->value = NULL;
    /* A failed leader leaves the followers to compute for themselves. */
    finish(op, answer_from(op, v));
}

static void on_flight(void *arg, struct cache_value *v) {
    struct infer_cache_op *op = arg;
    op->value = v;
    runtime_job_init(&op->job, follower_resume, NULL, op);
    op->post(op->io, &op->job);
}

static void after_tiers(struct infer_cache_op *op) {
    if (cache_flight_join(op->cache, &op->key, &op->flight, on_flight, op)) {
        op->leader = 1;
        finish(op, 0);
    }
}

static void on_redis(void *arg, struct cache_value *v) {
    struct infer_cache_op *op = arg;
    if (v) {
        /* Into tier 1 only once it fits the model: a value that does not
         * is refused, counted, and overwritten by this request's result. */
        if (value_to_outputs(v, op->mc, op->rows, op->outputs) == 0) {
            cache_lru_put(op->cache, &op->key, v);
            cache_value_unref(v);
            finish(op, 1);
            return;
        }
        cache_redis_rejected(op->cache);
        cache_value_unref(v);
    }
    after_tiers(op);
}

void infer_cache_start(struct infer_cache_op *op) {
    op->t0 = clock_now_ns();
    op->leader = 0;
    if (answer_from(op, cache_lru_get(op->cache, &op->key))) {
        finish(op, 1);
        return;
    }
    if (op->redis) cache_redis_get(op->redis, &op->key, on_redis, op);
    else after_tiers(op);
}

/* The value of mc's outputs, put in the in-process tier under k; NULL when
 * out of memory or when the model has more outputs than a value holds (not
 * cached). The caller unrefs it. */
static struct cache_value *store_lru(cache_t *c, const struct cache_key *k, const struct model_config *mc,
                                     const struct tensor *outputs) {
    const char *names[CACHE_MAX_OUTPUTS];
    int n = mc->noutputs;
    for (int i = 0; i < n && i < CACHE_MAX_OUTPUTS; i++) names[i] = mc->outputs[i].name;
    struct cache_value *v = n <= CACHE_MAX_OUTPUTS ? cache_value_encode(outputs, names, n) : NULL;
    if (v) cache_lru_put(c, k, v);
    return v;
}

void infer_cache_store(struct infer_cache_op *op, const struct tensor *outputs) {
    uint64_t t0 = clock_now_ns();
    struct cache_value *v = store_lru(op->cache, &op->key, op->mc, outputs);
    if (v && op->redis) cache_redis_set(op->redis, &op->key, v);
    if (op->leader) cache_flight_done(op->cache, &op->key, v);
    op->leader = 0;
    cache_value_unref(v);
    cache_record_insert(op->cache, clock_now_ns() - t0);
}

int infer_cache_lru_lookup(cache_t *c, const struct cache_key *k, const struct model_config *mc, int64_t rows,
                           struct tensor *outputs) {
    uint64_t t0 = clock_now_ns();
    struct cache_value *v = cache_lru_get(c, k);
    int hit = v && value_to_outputs(v, mc, rows, outputs) == 0;
    cache_value_unref(v);
    cache_record_lookup(c, clock_now_ns() - t0);
    return hit;
}

void infer_cache_lru_store(cache_t *c, const struct cache_key *k, const struct model_config *mc,
                           const struct tensor *outputs) {
    uint64_t t0 = clock_now_ns();
    cache_value_unref(store_lru(c, k, mc, outputs));
    cache_record_insert(c, clock_now_ns() - t0);
}

void infer_cache_abandon(struct infer_cache_op *op) {
    if (op->leader) cache_flight_done(op->cache, &op->key, NULL);
    op->leader = 0;
}

char *infer_cache_metrics(cache_t *c, char *buf, size_t *len, size_t *cap) {
    struct cache_stats s;
    cache_get_stats(c, &s);
    buf = metrics_appendf(buf, len, cap,
                          "# HELP kiln_cache_hits_total Result cache hits by tier\n"
                          "# TYPE kiln_cache_hits_total counter\n"
                          "kiln_cache_hits_total{tier=\"local\"} %llu\nkiln_cache_hits_total{tier=\"redis\"} %llu\n"
                          "# HELP kiln_cache_misses_total Result cache misses by tier\n"
                          "# TYPE kiln_cache_misses_total counter\n"
                          "kiln_cache_misses_total{tier=\"local\"} %llu\nkiln_cache_misses_total{tier=\"redis\"} %llu\n"
                          "# HELP kiln_cache_single_flight_waits_total Requests that waited for an identical one in flight\n"
                          "# TYPE kiln_cache_single_flight_waits_total counter\n"
                          "kiln_cache_single_flight_waits_total %llu\n"
                          "# HELP kiln_cache_evictions_total Entries evicted from the in-process cache\n"
                          "# TYPE kiln_cache_evictions_total counter\n"
                          "kiln_cache_evictions_total %llu\n"
                          "# HELP kiln_cache_bytes Bytes held by the in-process cache\n"
                          "# TYPE kiln_cache_bytes gauge\n"
                          "kiln_cache_bytes %llu\n"
                          "# HELP kiln_cache_entries Entries in the in-process cache\n"
                          "# TYPE kiln_cache_entries gauge\n"
                          "kiln_cache_entries %llu\n",
                          (unsigned long long)s.lru_hits, (unsigned long long)s.redis_hits,
                          (unsigned long long)s.lru_misses, (unsigned long long)s.redis_misses,
                          (unsigned long long)s.flight_joined, (unsigned long long)s.lru_evictions,
                          (unsigned long long)s.lru_bytes, (unsigned long long)s.lru_entries);
    if (cache_has_redis(c))
        buf = metrics_appendf(buf, len, cap,
                              "# HELP kiln_cache_redis_errors_total Redis commands that failed\n"
                              "# TYPE kiln_cache_redis_errors_total counter\n"
                              "kiln_cache_redis_errors_total %llu\n"
                              "# HELP kiln_cache_redis_timeouts_total Redis commands that timed out\n"
                              "# TYPE kiln_cache_redis_timeouts_total counter\n"
                              "kiln_cache_redis_timeouts_total %llu\n"
                              "# HELP kiln_cache_redis_skipped_total Lookups and stores not sent (down, circuit open)\n"
                              "# TYPE kiln_cache_redis_skipped_total counter\n"
                              "kiln_cache_redis_skipped_total %llu\n"
                              "# HELP kiln_cache_redis_rejected_total Redis values refused (bad MAC, malformed, too large or not "
                              "fitting the model; treated as misses)\n"
                              "# TYPE kiln_cache_redis_rejected_total counter\n"
                              "kiln_cache_redis_rejected_total %llu\n"
                              "# HELP kiln_cache_redis_stores_total Values written to Redis\n"
                              "# TYPE kiln_cache_redis_stores_total counter\n"
                              "kiln_cache_redis_stores_total %llu\n"
                              "# HELP kiln_cache_redis_connected I/O threads connected to Redis\n"
                              "# TYPE kiln_cache_redis_connected gauge\n"
                              "kiln_cache_redis_connected %d\n"
                              "# HELP kiln_cache_redis_circuit_open I/O threads whose Redis circuit breaker is open\n"
                              "# TYPE kiln_cache_redis_circuit_open gauge\n"
                              "kiln_cache_redis_circuit_open %d\n",
                              (unsigned long long)s.redis_errors, (unsigned long long)s.redis_timeouts,
                              (unsigned long long)s.redis_skipped, (unsigned long long)s.redis_rejected,
                              (unsigned long long)s.redis_sets, s.redis_connected, s.circuit_open);
    double lk = s.lookup_count ? (double)s.lookup_ns_total / (double)s.lookup_count / 1e3 : 0;
    double in = s.insert_count ? (double)s.insert_ns_total / (double)s.insert_count / 1e3 : 0;
    buf = metrics_appendf(buf, len, cap,
                          "# HELP kiln_cache_lookup_duration_us_avg Mean time of a cache lookup (all tiers)\n"
                          "# TYPE kiln_cache_lookup_duration_us_avg gauge\n"
                          "kiln_cache_lookup_duration_us_avg %.3f\n"
                          "# HELP kiln_cache_insert_duration_us_avg Mean time of a cache insert\n"
                          "# TYPE kiln_cache_insert_duration_us_avg gauge\n"
                          "kiln_cache_insert_duration_us_avg %.3f\n",
                          lk, in);
    return buf;
}
