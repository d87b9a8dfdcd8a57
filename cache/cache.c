/* cache.c - the shared part of the result cache: secret and keys, the
 * sharded LRU, the value codec, single-flight and statistics. The Redis
 * tier is in cache/redis.c. */
#include "cache/cache.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "cache/cache_impl.h"
#include "common/log.h"
#include "common/status.h"

/* The key is HMAC-SHA-256 (OpenSSL). Measured against keyed BLAKE2b
 * (libsodium) in docs/benchmarks.md: BLAKE2b is faster below ~1 KiB by a
 * fraction of a microsecond, while SHA-256 with the CPU's SHA instructions is
 * 2-2.7x faster from 4 KiB up, where hashing actually costs something (an
 * image input is hundreds of KiB). */
struct key_ctx {
    EVP_MAC_CTX *mac; /* NULL after an allocation failure: the key is then random */
};
_Static_assert(sizeof(struct cache_key_state) >= sizeof(struct key_ctx), "key state too small");

/* ======================================================================
 * values
 * ====================================================================== */

struct cache_value *cache_value_new(const void *bytes, size_t len) {
    struct cache_value *v = malloc(sizeof *v + len);
    if (!v) return NULL;
    atomic_init(&v->refs, 1);
    v->len = len;
    if (len) memcpy(v->data, bytes, len);
    return v;
}

void cache_value_ref(struct cache_value *v) { atomic_fetch_add_explicit(&v->refs, 1, memory_order_relaxed); }

void cache_value_unref(struct cache_value *v) {
    if (v && atomic_fetch_sub_explicit(&v->refs, 1, memory_order_acq_rel) == 1) free(v);
}

/* ======================================================================
 * create / free / stats
 * ====================================================================== */

static uint64_t key_hash(const struct cache_key *k) {
    uint64_t h;
    memcpy(&h, k->b, sizeof h); /* the key is already a keyed hash */
    return h;
}

cache_t *cache_create(const struct cache_params *p, char *err, size_t err_len) {
    if (sodium_init() < 0) {
        status_set(err, err_len, STATUS_INTERNAL, "libsodium failed to initialize");
        return NULL;
    }
    cache_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->nshards = p->shards > 0 ? p->shards : 16;
    c->shards = calloc((size_t)c->nshards, sizeof *c->shards);
    c->flights = calloc(CACHE_FLIGHT_SHARDS, sizeof *c->flights);
    if (!c->shards || !c->flights) goto fail;
    c->lru_bytes = p->lru_bytes;
    c->max_value_bytes = p->max_value_bytes ? p->max_value_bytes : (4u << 20);
    c->ttl_secs = p->ttl_secs;
    c->redis_timeout_ms = p->redis_timeout_ms ? p->redis_timeout_ms : 5;
    c->breaker_failures = p->breaker_failures ? p->breaker_failures : 5;
    c->breaker_open_ms = p->breaker_open_ms ? p->breaker_open_ms : 1000;
    for (int i = 0; i < c->nshards; i++) {
        pthread_mutex_init(&c->shards[i].lock, NULL);
        c->shards[i].budget = c->lru_bytes / (size_t)c->nshards;
    }
    for (int i = 0; i < CACHE_FLIGHT_SHARDS; i++) pthread_mutex_init(&c->flights[i].lock, NULL);
    if (p->secret && *p->secret) {
        /* A configured secret is stretched to the key size so replicas agree. */
        crypto_generichash(c->secret, sizeof c->secret, (const unsigned char *)p->secret, strlen(p->secret),
                           (const unsigned char *)"kiln-cache-secret-v1", 20);
    } else {
        randombytes_buf(c->secret, sizeof c->secret);
    }
    c->hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    c->hmac_proto = c->hmac ? EVP_MAC_CTX_new(c->hmac) : NULL;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
                           OSSL_PARAM_construct_end()};
    if (!c->hmac_proto || !EVP_MAC_init(c->hmac_proto, c->secret, sizeof c->secret, params)) {
        status_set(err, err_len, STATUS_INTERNAL, "OpenSSL's HMAC-SHA-256 is not available");
        goto fail;
    }
    if (p->redis_url && *p->redis_url) {
        if (cache_redis_parse_url(p->redis_url, &c->redis, err, err_len) < 0) goto fail;
        c->has_redis = 1;
    }
    return c;
fail:
    cache_free(c);
    return NULL;
}

void cache_free(cache_t *c) {
    if (!c) return;
    if (c->shards) {
        for (int i = 0; i < c->nshards; i++) {
            struct cache_shard *s = &c->shards[i];
            for (size_t b = 0; b < s->nbuckets; b++) {
                struct cache_entry *e = s->buckets[b];
                while (e) {
                    struct cache_entry *next = e->hnext;
                    cache_value_unref(e->value);
                    free(e);
                    e = next;
                }
            }
            free(s->buckets);
            pthread_mutex_destroy(&s->lock);
        }
        free(c->shards);
    }
    if (c->flights) {
        for (int i = 0; i < CACHE_FLIGHT_SHARDS; i++) {
            struct cache_flight *f = c->flights[i].head;
            while (f) {
                struct cache_flight *next = f->next;
                struct cache_waiter *w = f->waiters;
                while (w) {
                    struct cache_waiter *wn = w->next;
                    free(w);
                    w = wn;
                }
                free(f);
                f = next;
            }
            pthread_mutex_destroy(&c->flights[i].lock);
        }
        free(c->flights);
    }
    cache_redis_url_free(&c->redis);
    EVP_MAC_CTX_free(c->hmac_proto);
    EVP_MAC_free(c->hmac);
    sodium_memzero(c->secret, sizeof c->secret);
    free(c);
}

int cache_has_redis(const cache_t *c) { return c && c->has_redis; }

#define LOAD(x) atomic_load_explicit(&c->stats.x, memory_order_relaxed)

void cache_get_stats(cache_t *c, struct cache_stats *o) {
    memset(o, 0, sizeof *o);
    o->lru_hits = LOAD(lru_hits);
    o->lru_misses = LOAD(lru_misses);
    o->lru_inserts = LOAD(lru_inserts);
    o->lru_evictions = LOAD(lru_evictions);
    o->redis_hits = LOAD(redis_hits);
    o->redis_misses = LOAD(redis_misses);
    o->redis_errors = LOAD(redis_errors);
    o->redis_timeouts = LOAD(redis_timeouts);
    o->redis_sets = LOAD(redis_sets);
    o->redis_skipped = LOAD(redis_skipped);
    o->redis_corrupt = LOAD(redis_corrupt);
    o->redis_too_large = LOAD(redis_too_large);
    o->flight_joined = LOAD(flight_joined);
    o->lookup_ns_total = LOAD(lookup_ns_total);
    o->lookup_count = LOAD(lookup_count);
    o->insert_ns_total = LOAD(insert_ns_total);
    o->insert_count = LOAD(insert_count);
    o->redis_connected = (int)LOAD(redis_connected);
    o->circuit_open = (int)LOAD(circuit_open);
    for (int i = 0; i < c->nshards; i++) {
        pthread_mutex_lock(&c->shards[i].lock);
        o->lru_bytes += c->shards[i].used;
        o->lru_entries += c->shards[i].count;
        pthread_mutex_unlock(&c->shards[i].lock);
    }
}

void cache_record_lookup(cache_t *c, uint64_t ns) {
    atomic_fetch_add_explicit(&c->stats.lookup_ns_total, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->stats.lookup_count, 1, memory_order_relaxed);
}

void cache_record_insert(cache_t *c, uint64_t ns) {
    atomic_fetch_add_explicit(&c->stats.insert_ns_total, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->stats.insert_count, 1, memory_order_relaxed);
}

/* ======================================================================
 * keys
 * ====================================================================== */

static void key_field(struct key_ctx *k, const void *p, size_t n) {
    uint64_t len = n;
    if (!k->mac) return;
    EVP_MAC_update(k->mac, (const unsigned char *)&len, sizeof len);
    if (n) EVP_MAC_update(k->mac, p, n);
}

void cache_key_begin(const cache_t *c, struct cache_key_state *s, const char *model, int64_t version) {
    struct key_ctx *k = (struct key_ctx *)s->st;
    k->mac = EVP_MAC_CTX_dup(c->hmac_proto);
    key_field(k, "kiln-v1", 7);
    key_field(k, model, strlen(model));
    key_field(k, &version, sizeof version);
}

void cache_key_add_input(struct cache_key_state *s, const char *name, enum dtype dt, const int64_t *shape,
                         int ndim, const void *data, size_t len) {
    struct key_ctx *k = (struct key_ctx *)s->st;
    int32_t d = (int32_t)dt;
    key_field(k, "in", 2);
    key_field(k, name, strlen(name));
    key_field(k, &d, sizeof d);
    key_field(k, shape, sizeof(int64_t) * (size_t)ndim);
    key_field(k, data, len);
}

void cache_key_add_output(struct cache_key_state *s, const char *name, int binary, int classification) {
    struct key_ctx *k = (struct key_ctx *)s->st;
    int32_t params[2] = {binary, classification};
    key_field(k, "out", 3);
    key_field(k, name, strlen(name));
    key_field(k, params, sizeof params);
}

void cache_key_end(struct cache_key_state *s, struct cache_key *out) {
    struct key_ctx *k = (struct key_ctx *)s->st;
    size_t n = 0;
    if (!k->mac || !EVP_MAC_final(k->mac, out->b, &n, CACHE_KEY_BYTES) || n != CACHE_KEY_BYTES) {
        /* Out of memory: a random key is a miss that nothing else can hit. */
        randombytes_buf(out->b, CACHE_KEY_BYTES);
    }
    EVP_MAC_CTX_free(k->mac);
    k->mac = NULL;
}

void cache_key_hex(const struct cache_key *k, char out[2 * CACHE_KEY_BYTES + 1]) {
    sodium_bin2hex(out, 2 * CACHE_KEY_BYTES + 1, k->b, CACHE_KEY_BYTES);
}

/* ======================================================================
 * tier 1: sharded LRU (hash chains + a doubly linked recency list per shard)
 * ====================================================================== */

static struct cache_shard *shard_of(cache_t *c, const struct cache_key *k) {
    return &c->shards[(key_hash(k) >> 32) % (uint64_t)c->nshards];
}

static struct cache_entry **bucket_of(struct cache_shard *s, const struct cache_key *k) {
    return &s->buckets[key_hash(k) & (s->nbuckets - 1)];
}

static void lru_unlink(struct cache_shard *s, struct cache_entry *e) {
    if (e->prev) e->prev->next = e->next;
    else s->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else s->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(struct cache_shard *s, struct cache_entry *e) {
    e->prev = NULL;
    e->next = s->head;
    if (s->head) s->head->prev = e;
    s->head = e;
    if (!s->tail) s->tail = e;
}

static size_t entry_cost(const struct cache_entry *e) { return sizeof *e + sizeof(struct cache_value) + e->value->len; }

static void shard_remove(cache_t *c, struct cache_shard *s, struct cache_entry *e) {
    struct cache_entry **pp = bucket_of(s, &e->key);
    while (*pp != e) pp = &(*pp)->hnext;
    *pp = e->hnext;
    lru_unlink(s, e);
    s->used -= entry_cost(e);
    s->count--;
    cache_value_unref(e->value);
    free(e);
    (void)c;
}

static int shard_grow(struct cache_shard *s) {
    size_t n = s->nbuckets ? s->nbuckets * 2 : 64;
    struct cache_entry **b = calloc(n, sizeof *b);
    if (!b) return -1;
    for (size_t i = 0; i < s->nbuckets; i++) {
        struct cache_entry *e = s->buckets[i];
        while (e) {
            struct cache_entry *next = e->hnext;
            size_t j = key_hash(&e->key) & (n - 1);
            e->hnext = b[j];
            b[j] = e;
            e = next;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
    return 0;
}

struct cache_value *cache_lru_get(cache_t *c, const struct cache_key *k) {
    if (!c->lru_bytes) return NULL;
    struct cache_shard *s = shard_of(c, k);
    struct cache_value *v = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->nbuckets) {
        for (struct cache_entry *e = *bucket_of(s, k); e; e = e->hnext) {
            if (memcmp(e->key.b, k->b, CACHE_KEY_BYTES) == 0) {
                lru_unlink(s, e);
                lru_push_front(s, e);
                v = e->value;
                cache_value_ref(v);
                break;
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    atomic_fetch_add_explicit(v ? &c->stats.lru_hits : &c->stats.lru_misses, 1, memory_order_relaxed);
    return v;
}

void cache_lru_put(cache_t *c, const struct cache_key *k, struct cache_value *v) {
    if (!c->lru_bytes || !v || v->len > c->max_value_bytes) return;
    struct cache_shard *s = shard_of(c, k);
    size_t cost = sizeof(struct cache_entry) + sizeof(struct cache_value) + v->len;
    if (cost > s->budget) return;
    struct cache_entry *ne = calloc(1, sizeof *ne);
    if (!ne) return;
    ne->key = *k;
    ne->value = v;
    cache_value_ref(v);
    uint64_t evicted = 0;
    pthread_mutex_lock(&s->lock);
    if (s->count + 1 > s->nbuckets * 2 && shard_grow(s) < 0) {
        pthread_mutex_unlock(&s->lock);
        cache_value_unref(v);
        free(ne);
        return;
    }
    for (struct cache_entry *e = *bucket_of(s, k); e; e = e->hnext) {
        if (memcmp(e->key.b, k->b, CACHE_KEY_BYTES) == 0) {
            shard_remove(c, s, e);
            break;
        }
    }
    while (s->used + cost > s->budget && s->tail) {
        shard_remove(c, s, s->tail);
        evicted++;
    }
    struct cache_entry **b = bucket_of(s, k);
    ne->hnext = *b;
    *b = ne;
    lru_push_front(s, ne);
    s->used += cost;
    s->count++;
    pthread_mutex_unlock(&s->lock);
    atomic_fetch_add_explicit(&c->stats.lru_inserts, 1, memory_order_relaxed);
    if (evicted) atomic_fetch_add_explicit(&c->stats.lru_evictions, evicted, memory_order_relaxed);
}

/* ======================================================================
 * value codec
 * ====================================================================== */

#define CODEC_MAGIC "KLNC"
#define CODEC_VERSION 1

struct wbuf {
    uint8_t *p;
    size_t n, cap;
    int failed;
};

static void wput(struct wbuf *w, const void *src, size_t n) {
    if (w->failed) return;
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->n + n) cap *= 2;
        uint8_t *p = realloc(w->p, cap);
        if (!p) {
            w->failed = 1;
            return;
        }
        w->p = p;
        w->cap = cap;
    }
    memcpy(w->p + w->n, src, n);
    w->n += n;
}

static void wu32(struct wbuf *w, uint32_t x) { wput(w, &x, 4); }
static void wu64(struct wbuf *w, uint64_t x) { wput(w, &x, 8); }

struct cache_value *cache_value_encode(const struct tensor *outs, const char *const *names, int n) {
    struct wbuf w = {0};
    wput(&w, CODEC_MAGIC, 4);
    wu32(&w, CODEC_VERSION);
    wu32(&w, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        const struct tensor *t = &outs[i];
        size_t nl = strlen(names[i]) + 1; /* with its NUL, so decoded names are C strings */
        wu32(&w, (uint32_t)nl);
        wput(&w, names[i], nl);
        wu32(&w, (uint32_t)t->dtype);
        wu32(&w, (uint32_t)t->ndim);
        for (int d = 0; d < t->ndim; d++) wu64(&w, (uint64_t)t->dims[d]);
        if (t->dtype == DT_STRING) {
            /* Strings as 4-byte length + bytes, the binary tensor layout. */
            int64_t cnt = tensor_numel(t);
            size_t total = 0;
            char *const *sv = t->data;
            for (int64_t j = 0; j < cnt; j++) total += 4 + strlen(sv[j]);
            wu64(&w, total);
            for (int64_t j = 0; j < cnt; j++) {
                uint32_t l = (uint32_t)strlen(sv[j]);
                wu32(&w, l);
                wput(&w, sv[j], l);
            }
        } else {
            size_t nb = tensor_nbytes(t);
            wu64(&w, nb);
            wput(&w, t->data, nb);
        }
    }
    uint32_t crc = (uint32_t)crc32(0L, w.p, (uInt)w.n);
    wu32(&w, crc);
    struct cache_value *v = w.failed ? NULL : cache_value_new(w.p, w.n);
    free(w.p);
    return v;
}

int cache_value_decode(const struct cache_value *v, struct tensor *outs, const char **names, int max) {
    const uint8_t *p = v->data, *end = v->data + v->len;
    if (v->len < 16 || memcmp(p, CODEC_MAGIC, 4) != 0) return -1;
    uint32_t crc;
    memcpy(&crc, end - 4, 4);
    if ((uint32_t)crc32(0L, v->data, (uInt)(v->len - 4)) != crc) return -1;
    end -= 4;
    uint32_t ver, n;
    memcpy(&ver, p + 4, 4);
    memcpy(&n, p + 8, 4);
    p += 12;
    if (ver != CODEC_VERSION || n > (uint32_t)max) return -1;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t nl, dt, nd;
        if ((size_t)(end - p) < 4) return -1;
        memcpy(&nl, p, 4);
        p += 4;
        if (nl == 0 || (size_t)(end - p) < (size_t)nl + 8 || p[nl - 1] != 0) return -1;
        names[i] = (const char *)p;
        p += nl;
        memcpy(&dt, p, 4);
        memcpy(&nd, p + 4, 4);
        p += 8;
        if (dt >= DT_MAX_ || dtype_size((enum dtype)dt) == 0 || nd > TENSOR_MAX_DIMS) return -1;
        if ((size_t)(end - p) < (size_t)nd * 8 + 8) return -1;
        struct tensor *t = &outs[i];
        t->dtype = (enum dtype)dt;
        t->ndim = (int)nd;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t x;
            memcpy(&x, p, 8);
            p += 8;
            if (x > (uint64_t)INT32_MAX) return -1;
            t->dims[d] = (int64_t)x;
        }
        uint64_t nb;
        memcpy(&nb, p, 8);
        p += 8;
        if (nb > (uint64_t)(end - p)) return -1;
        if (t->dtype != DT_STRING && nb != tensor_nbytes(t)) return -1;
        t->data = (void *)p;
        p += nb;
    }
    return p == end ? (int)n : -1;
}

/* ======================================================================
 * single-flight
 * ====================================================================== */

int cache_flight_join(cache_t *c, const struct cache_key *k, void (*cb)(void *arg, struct cache_value *v), void *arg) {
    struct cache_flight_shard *s = &c->flights[key_hash(k) % CACHE_FLIGHT_SHARDS];
    pthread_mutex_lock(&s->lock);
    for (struct cache_flight *f = s->head; f; f = f->next) {
        if (memcmp(f->key.b, k->b, CACHE_KEY_BYTES) == 0) {
            struct cache_waiter *w = malloc(sizeof *w);
            if (!w) break; /* cannot wait: compute it yourself */
            w->cb = cb;
            w->arg = arg;
            w->next = f->waiters;
            f->waiters = w;
            pthread_mutex_unlock(&s->lock);
            atomic_fetch_add_explicit(&c->stats.flight_joined, 1, memory_order_relaxed);
            return 0;
        }
    }
    struct cache_flight *f = calloc(1, sizeof *f);
    if (f) {
        f->key = *k;
        f->next = s->head;
        s->head = f;
    }
    pthread_mutex_unlock(&s->lock);
    /* Without a flight record the caller still leads; followers just miss it. */
    return 1;
}

void cache_flight_done(cache_t *c, const struct cache_key *k, struct cache_value *v) {
    struct cache_flight_shard *s = &c->flights[key_hash(k) % CACHE_FLIGHT_SHARDS];
    struct cache_flight *found = NULL;
    pthread_mutex_lock(&s->lock);
    for (struct cache_flight **pp = &s->head; *pp; pp = &(*pp)->next) {
        if (memcmp((*pp)->key.b, k->b, CACHE_KEY_BYTES) == 0) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (!found) return;
    /* Callbacks run outside the lock: they may join new flights. */
    struct cache_waiter *w = found->waiters;
    while (w) {
        struct cache_waiter *next = w->next;
        if (v) cache_value_ref(v);
        w->cb(w->arg, v);
        free(w);
        w = next;
    }
    free(found);
}
