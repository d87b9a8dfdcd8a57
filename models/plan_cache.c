/* plan_cache.c - plans per input shape signature: the signature, and the
 * LRU cache of plans that grows when plans are rebuilt. */
#include "models/plan_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"

uint64_t plan_signature_hash(const struct tensor *inputs, int ninputs, uint64_t bind_values) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < ninputs; i++) {
        h = (h ^ (uint64_t)(inputs[i].ndim + 1)) * 1099511628211ull;
        for (int d = 0; d < inputs[i].ndim && d < TENSOR_MAX_DIMS; d++)
            h = (h ^ (uint64_t)inputs[i].dims[d]) * 1099511628211ull;
        if (i < 64 && (bind_values >> i & 1) && inputs[i].data && inputs[i].dtype == DT_STRING) {
            const struct tensor_str *sv = tensor_strs(&inputs[i]);
            /* Each element's bytes and length: "ab","c" differs from "a","bc", "a\0" from "a". */
            for (int64_t e = 0, ne = tensor_numel(&inputs[i]); e < ne; e++)
                h = ((h ^ tensor_str_hash(sv[e])) * 1099511628211ull ^ sv[e].len) * 1099511628211ull;
        } else if (i < 64 && (bind_values >> i & 1) && inputs[i].data) {
            const unsigned char *b = inputs[i].data;
            size_t nb = tensor_nbytes(&inputs[i]);
            for (size_t k = 0; k < nb; k++) h = (h ^ b[k]) * 1099511628211ull;
        }
    }
    return h;
}

int plan_matches(const struct plan *p, const struct tensor *inputs, int ninputs) {
    if (ninputs != p->ninputs) return 0;
    for (int i = 0; i < ninputs; i++) {
        if (inputs[i].ndim != p->sig[i].ndim) return 0;
        for (int d = 0; d < inputs[i].ndim; d++)
            if (inputs[i].dims[d] != p->sig[i].dims[d]) return 0;
        if (!p->sig[i].data || inputs[i].data == p->sig[i].data) continue;
        if (!inputs[i].data) return 0;
        if (inputs[i].dtype == DT_STRING) {
            const struct tensor_str *a = tensor_strs(&inputs[i]), *b = tensor_strs(&p->sig[i]);
            for (int64_t e = 0, ne = tensor_numel(&inputs[i]); e < ne; e++)
                if (!tensor_str_eq(a[e], b[e])) return 0;
        } else if (memcmp(inputs[i].data, p->sig[i].data, tensor_nbytes(&inputs[i]))) {
            return 0;
        }
    }
    return 1;
}

/* ---- the plan cache ---------------------------------------------------------------- */

/* Hashes of recently evicted plans: a build of one of them is a rebuild. */
#define EVICTED_RING 64

struct plan_cache {
    pthread_mutex_t mu;
    int max;
    int limit; /* max grows up to this when plans are rebuilt (plan_cache_set_limit) */
    int n;
    struct plan **plans;
    atomic_ullong tick;
    uint64_t builds, evictions, rebuilds;
    uint64_t evicted[EVICTED_RING];
    int nevicted, rebuilt_since_growth;
    struct plan_devstore *ds; /* device caches: the graph's constants on the device */
    int fp16;                 /* device plans store FP32 values as FP16 */
};

struct plan_cache *plan_cache_create(int max_plans) {
    struct plan_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->max = max_plans > 0 ? max_plans : 16;
    c->limit = c->max;
    c->plans = calloc((size_t)c->max, sizeof *c->plans);
    if (!c->plans || pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c->plans);
        free(c);
        return NULL;
    }
    atomic_init(&c->tick, 0);
    return c;
}

void plan_cache_free(struct plan_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) plan_release(c->plans[i]);
    plan_devstore_free(c->ds); /* after the plans, which borrow from it */
    pthread_mutex_destroy(&c->mu);
    free(c->plans);
    free(c);
}

static struct plan *cache_find(struct plan_cache *c, uint64_t h, const struct tensor *inputs, int ninputs,
                               int nthreads) {
    for (int i = 0; i < c->n; i++) {
        struct plan *p = c->plans[i];
        if (p->hash == h && p->nthreads == nthreads && plan_matches(p, inputs, ninputs)) {
            plan_retain(p);
            atomic_store(&p->last_used, atomic_fetch_add(&c->tick, 1) + 1);
            return p;
        }
    }
    return NULL;
}

/* Timing a new plan's thread counts costs a few of its runs (up to
 * TIMING_BUDGET_MS), once per input shape: a model fed many shapes (text of
 * every length) would pay it over and over as its plans are evicted and
 * rebuilt. Once this many of the cache's plans were timed, a new plan takes
 * what most of them kept for their measured steps, all on one thread or all
 * on all, untimed (lock held). */
#define TIMED_PLANS_ENOUGH 4

static void inherit_threads(struct plan_cache *c, struct plan *np) {
    if (!np->nmeasured) return;
    int n = 0, one = 0, all = 0;
    for (int i = 0; i < c->n; i++) {
        int pk = atomic_load_explicit(&c->plans[i]->pick, memory_order_relaxed);
        n += pk > 0;
        one += pk == 1 + MEASURED_ONE;
        all += pk == 1 + MEASURED_ALL;
    }
    if (n < TIMED_PLANS_ENOUGH || one == all) return;
    for (int si = 0; si < np->nsteps; si++)
        if (np->steps[si].measured)
            atomic_store_explicit(&np->steps[si].chosen, one > all ? 1 : np->steps[si].nthreads, memory_order_relaxed);
    atomic_store_explicit(&np->pick, -1, memory_order_relaxed);
    atomic_store_explicit(&np->timed, 2, memory_order_release);
    log_debug("plan threads: %d of the model's %d timed plans keep their measured steps on %s: a new plan does, "
              "untimed", one > all ? one : all, n, one > all ? "1 thread" : "all threads");
}

/* Raises the bound to max_plans (lock held): 0 or STATUS_NOMEM. */
static int cache_resize(struct plan_cache *c, int max_plans) {
    struct plan **p = realloc(c->plans, (size_t)max_plans * sizeof *p);
    if (!p) return STATUS_NOMEM;
    c->plans = p;
    c->max = max_plans;
    if (c->limit < max_plans) c->limit = max_plans;
    return 0;
}

/* A model fed more input shapes than the cache holds (text of every length,
 * unpadded) evicts plans it soon needs again and rebuilds them on every
 * other request: BERT fed 121 lengths served a third fewer requests a second
 * for it. When half as many rebuilds as the cache holds plans happened since
 * it last grew, it doubles, up to its limit (lock held). */
static void cache_note_rebuild(struct plan_cache *c, uint64_t h) {
    int n = c->nevicted < EVICTED_RING ? c->nevicted : EVICTED_RING;
    int hit = 0;
    for (int i = 0; i < n && !hit; i++) hit = c->evicted[i] == h;
    if (!hit) return;
    c->rebuilds++;
    if (++c->rebuilt_since_growth < (c->max + 1) / 2 || c->max >= c->limit) return;
    int want = c->max * 2 < c->limit ? c->max * 2 : c->limit, was = c->max;
    if (cache_resize(c, want)) return; /* stays as it is: rebuilding is slower, not wrong */
    log_info("plan cache: %d plans rebuilt after eviction since it held %d; it holds %d now (at most %d)",
             c->rebuilt_since_growth, was, want, c->limit);
    c->rebuilt_since_growth = 0;
}

int plan_cache_get(struct plan_cache *c, const struct graph *g, const struct tensor *inputs, uint64_t bind_values,
                   struct backend *be, int nthreads, struct plan **out, int *built, char *err, size_t err_len) {
    uint64_t h = plan_signature_hash(inputs, g->ninputs, bind_values);
    if (nthreads < 1) nthreads = 1;
    if (built) *built = 0;
    pthread_mutex_lock(&c->mu);
    struct plan *p = cache_find(c, h, inputs, g->ninputs, nthreads);
    pthread_mutex_unlock(&c->mu);
    if (p) {
        *out = p;
        return 0;
    }
    struct plan *np;
    if (be && !be->host_memory && !c->ds && !(c->ds = plan_devstore_create(be, g->nvalues)))
        return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    int rc = plan_build_ds(g, inputs, bind_values, 0, be, nthreads, c->fp16, be && !be->host_memory ? c->ds : NULL, &np,
                           err, err_len);
    if (rc) return rc;
    pthread_mutex_lock(&c->mu);
    c->builds++;
    p = cache_find(c, h, inputs, g->ninputs, nthreads); /* another thread may have built it meanwhile */
    if (p) {
        pthread_mutex_unlock(&c->mu);
        plan_release(np);
        *out = p;
        return 0;
    }
    cache_note_rebuild(c, h);
    struct plan *evicted = NULL;
    if (c->n == c->max) {
        int lru = 0;
        for (int i = 1; i < c->n; i++)
            if (atomic_load(&c->plans[i]->last_used) < atomic_load(&c->plans[lru]->last_used)) lru = i;
        evicted = c->plans[lru];
        c->plans[lru] = c->plans[--c->n];
        c->evictions++;
        c->evicted[c->nevicted++ % EVICTED_RING] = evicted->hash;
    }
    inherit_threads(c, np);
    atomic_store(&np->last_used, atomic_fetch_add(&c->tick, 1) + 1);
    plan_retain(np); /* the cache's reference */
    c->plans[c->n++] = np;
    pthread_mutex_unlock(&c->mu);
    plan_release(evicted); /* a run still holding it keeps it alive */
    if (built) *built = 1;
    *out = np;
    return 0;
}

void plan_cache_set_fp16(struct plan_cache *c, int on) { c->fp16 = on; }

int plan_cache_grow(struct plan_cache *c, int max_plans) {
    pthread_mutex_lock(&c->mu);
    int rc = max_plans > c->max ? cache_resize(c, max_plans) : 0;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void plan_cache_set_limit(struct plan_cache *c, int limit) {
    pthread_mutex_lock(&c->mu);
    c->limit = limit > c->max ? limit : c->max;
    pthread_mutex_unlock(&c->mu);
}

void plan_cache_touch(struct plan_cache *c, struct plan *p) {
    atomic_store(&p->last_used, atomic_fetch_add(&c->tick, 1) + 1);
}

/* The counters, read under the lock. */
static uint64_t cache_read(struct plan_cache *c, const uint64_t *field) {
    pthread_mutex_lock(&c->mu);
    uint64_t n = *field;
    pthread_mutex_unlock(&c->mu);
    return n;
}

int plan_cache_size(struct plan_cache *c) {
    pthread_mutex_lock(&c->mu);
    int n = c->n;
    pthread_mutex_unlock(&c->mu);
    return n;
}

int plan_cache_max(struct plan_cache *c) {
    pthread_mutex_lock(&c->mu);
    int n = c->max;
    pthread_mutex_unlock(&c->mu);
    return n;
}

uint64_t plan_cache_builds(struct plan_cache *c) { return cache_read(c, &c->builds); }
uint64_t plan_cache_evictions(struct plan_cache *c) { return cache_read(c, &c->evictions); }
uint64_t plan_cache_rebuilds(struct plan_cache *c) { return cache_read(c, &c->rebuilds); }
