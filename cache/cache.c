/* cache.c - the shared part of the result cache: secret and keys, the
 * sharded LRU, the value codec, single-flight and statistics. The Redis
 * tier is in cache/redis.c. */
#include "cache/cache.h"

/* SHA256_Init/Update/Final are deprecated by OpenSSL 3 in favour of EVP, but
 * EVP allocates on every context copy; the low-level calls run the same
 * assembly (SHA extensions included) on a caller-owned state. */
#define OPENSSL_API_COMPAT 10101
#include <openssl/sha.h>
#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <zlib.h>

#include "cache/cache_impl.h"
#include "common/log.h"
#include "common/status.h"

/* The key is HMAC-SHA-256 (OpenSSL). Measured against keyed BLAKE2b
 * (libsodium) in docs/benchmarks.md: BLAKE2b is faster below ~1 KiB by a
 * fraction of a microsecond, while SHA-256 with the CPU's SHA instructions is
 * 2-2.7x faster from 4 KiB up, where hashing actually costs something (an
 * image input is hundreds of KiB).
 *
 * HMAC(K, m) = H((K ^ opad) || H((K ^ ipad) || m)). The SHA-256 states after
 * the two pad blocks are computed once per cache: a key then starts from a
 * copy of the inner state (a struct copy, no allocation, no key schedule)
 * and ends with one more compression from the outer state. The result is
 * standard HMAC-SHA-256, so replicas sharing a secret and a Redis agree. */
struct cache_hmac {
    SHA256_CTX inner, outer;
};
struct key_ctx {
    SHA256_CTX sha;
    const struct cache_hmac *hmac;
};
_Static_assert(sizeof(struct cache_key_state) >= sizeof(struct key_ctx), "key state too small");

static struct cache_hmac *hmac_create(const uint8_t *secret, size_t len) {
    struct cache_hmac *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    uint8_t pad[SHA256_CBLOCK];
    /* The secret is 32 bytes, below the block size: pad with zeros. */
    memset(pad, 0, sizeof pad);
    memcpy(pad, secret, len);
    for (size_t i = 0; i < sizeof pad; i++) pad[i] ^= 0x36;
    SHA256_Init(&h->inner);
    SHA256_Update(&h->inner, pad, sizeof pad);
    for (size_t i = 0; i < sizeof pad; i++) pad[i] ^= 0x36 ^ 0x5c;
    SHA256_Init(&h->outer);
    SHA256_Update(&h->outer, pad, sizeof pad);
    sodium_memzero(pad, sizeof pad);
    return h;
}

static void hmac_free(struct cache_hmac *h) {
    if (!h) return;
    sodium_memzero(h, sizeof *h);
    free(h);
}

/* ======================================================================
 * values
 * ====================================================================== */

/* ---- value memory --------------------------------------------------------
 * Values live long (until evicted) and are allocated on the I/O threads
 * between the request path's short-lived allocations. From glibc's heap they
 * interleave with those and fragment it: every later malloc on the thread
 * then sorts through split free chunks, which cost the whole request path
 * more than the cache itself did. So values come from size-classed slabs of
 * their own (mmap'd, outside the heap), one free list per class. Slab memory
 * is kept for reuse, never returned: the LRU's byte budget bounds what is
 * live, so the slabs stay within that budget plus the classes' rounding. */
#define SLAB_BYTES (256u << 10)
#define SLAB_LARGE UINT32_MAX /* above the largest class: plain malloc */

static const uint32_t slab_class_bytes[] = {
    128,  160,  192,  224,  256,  320,  384,  448,  512,  640,  768,  896,
    1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 8192,
};
#define SLAB_CLASSES (sizeof slab_class_bytes / sizeof slab_class_bytes[0])

struct slab_free {
    struct slab_free *next;
};

static struct slab_class {
    pthread_mutex_t lock;
    struct slab_free *free;
    char *bump, *end; /* the unused tail of the newest slab */
} g_slab[SLAB_CLASSES] = {[0 ... SLAB_CLASSES - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};

/* Under AddressSanitizer every value is a plain malloc, so the sanitizer
 * still sees each one's bounds and lifetime. */
#if defined(__SANITIZE_ADDRESS__)
#define SLAB_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLAB_SANITIZED 1
#endif
#endif
#ifndef SLAB_SANITIZED
#define SLAB_SANITIZED 0
#endif

static uint32_t slab_class_of(size_t n) {
    if (SLAB_SANITIZED || n > slab_class_bytes[SLAB_CLASSES - 1]) return SLAB_LARGE;
    uint32_t i = 0;
    while (slab_class_bytes[i] < n) i++;
    return i;
}

static void *slab_alloc(uint32_t cls) {
    struct slab_class *sc = &g_slab[cls];
    size_t size = slab_class_bytes[cls];
    void *p = NULL;
    pthread_mutex_lock(&sc->lock);
    if (sc->free) {
        p = sc->free;
        sc->free = sc->free->next;
    } else {
        if ((size_t)(sc->end - sc->bump) < size) {
            /* Populated at once: one fault instead of one per page as the
             * slab fills. */
            void *m = mmap(NULL, SLAB_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
            if (m != MAP_FAILED) {
                sc->bump = m;
                sc->end = sc->bump + SLAB_BYTES;
            }
        }
        if ((size_t)(sc->end - sc->bump) >= size) {
            p = sc->bump;
            sc->bump += size;
        }
    }
    pthread_mutex_unlock(&sc->lock);
    return p;
}

static void slab_release(uint32_t cls, void *p) {
    struct slab_class *sc = &g_slab[cls];
    struct slab_free *f = p;
    pthread_mutex_lock(&sc->lock);
    f->next = sc->free;
    sc->free = f;
    pthread_mutex_unlock(&sc->lock);
}

/* One block: [value_head (the LRU entry slot)][struct cache_value][data].
 * The slot lets cache_lru_put store the value without an allocation of its
 * own; it lives and dies with the value (the LRU entry holds a reference). */
struct value_head {
    struct cache_entry slot;
    uint32_t cls; /* slab class, or SLAB_LARGE */
};
#define VALUE_HEAD_BYTES ((sizeof(struct value_head) + 15) & ~(size_t)15)

static struct value_head *value_head(struct cache_value *v) {
    return (struct value_head *)(void *)((char *)v - VALUE_HEAD_BYTES);
}

static struct cache_entry *value_slot(struct cache_value *v) { return &value_head(v)->slot; }

static void entry_release(struct cache_entry *e);

static struct cache_value *value_alloc(size_t len) {
    size_t total = VALUE_HEAD_BYTES + sizeof(struct cache_value) + len;
    uint32_t cls = slab_class_of(total);
    struct value_head *h = cls == SLAB_LARGE ? malloc(total) : slab_alloc(cls);
    if (!h) return NULL;
    h->cls = cls;
    struct cache_value *v = (struct cache_value *)(void *)((char *)h + VALUE_HEAD_BYTES);
    atomic_init(&v->refs, 1);
    atomic_init(&v->slot_taken, 0);
    v->len = len;
    return v;
}

static void value_release(struct cache_value *v) {
    struct value_head *h = value_head(v);
    if (h->cls == SLAB_LARGE) free(h);
    else slab_release(h->cls, h);
}

struct cache_value *cache_value_new(const void *bytes, size_t len) {
    struct cache_value *v = value_alloc(len);
    if (v && len) memcpy(v->data, bytes, len);
    return v;
}

void cache_value_ref(struct cache_value *v) { atomic_fetch_add_explicit(&v->refs, 1, memory_order_relaxed); }

void cache_value_unref(struct cache_value *v) {
    if (v && atomic_fetch_sub_explicit(&v->refs, 1, memory_order_acq_rel) == 1) value_release(v);
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
    c->redis_timeout_ms = p->redis_timeout_ms ? p->redis_timeout_ms : 50;
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
    c->hmac = hmac_create(c->secret, sizeof c->secret);
    if (!c->hmac) {
        status_set(err, err_len, STATUS_INTERNAL, "out of memory for the cache key state");
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
            for (size_t b = 0; b < s->nbuckets; b++)
                if (s->buckets[b].e) entry_release(s->buckets[b].e);
            free(s->buckets);
            pthread_mutex_destroy(&s->lock);
        }
        free(c->shards);
    }
    if (c->flights) {
        /* Flight records and waiters are their callers' storage. */
        for (int i = 0; i < CACHE_FLIGHT_SHARDS; i++) pthread_mutex_destroy(&c->flights[i].lock);
        free(c->flights);
    }
    cache_redis_url_free(&c->redis);
    hmac_free(c->hmac);
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
    o->redis_rejected = LOAD(redis_rejected);
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
    SHA256_Update(&k->sha, &len, sizeof len);
    if (n) SHA256_Update(&k->sha, p, n);
}

void cache_key_begin(const cache_t *c, struct cache_key_state *s, const char *model, int64_t version) {
    struct key_ctx *k = (struct key_ctx *)s->st;
    k->sha = c->hmac->inner;
    k->hmac = c->hmac;
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

/* Ends an HMAC: the inner digest, hashed on from the outer state. */
static void key_ctx_final(struct key_ctx *k, uint8_t out[SHA256_DIGEST_LENGTH]) {
    uint8_t inner[SHA256_DIGEST_LENGTH];
    SHA256_Final(inner, &k->sha);
    k->sha = k->hmac->outer;
    SHA256_Update(&k->sha, inner, sizeof inner);
    SHA256_Final(out, &k->sha);
}

void cache_key_end(struct cache_key_state *s, struct cache_key *out) {
    key_ctx_final((struct key_ctx *)s->st, out->b);
    _Static_assert(SHA256_DIGEST_LENGTH == CACHE_KEY_BYTES, "key is a SHA-256 digest");
}

void cache_key_hex(const struct cache_key *k, char out[2 * CACHE_KEY_BYTES + 1]) {
    sodium_bin2hex(out, 2 * CACHE_KEY_BYTES + 1, k->b, CACHE_KEY_BYTES);
}

/* ======================================================================
 * tier 1: sharded LRU (an open-addressing table + a doubly linked recency
 * list per shard)
 * ====================================================================== */

static struct cache_shard *shard_of(cache_t *c, const struct cache_key *k) {
    return &c->shards[(key_hash(k) >> 32) % (uint64_t)c->nshards];
}

/* The bucket holding k, or -1. */
static ptrdiff_t shard_find(const struct cache_shard *s, const struct cache_key *k, uint64_t h) {
    if (!s->nbuckets) return -1;
    size_t mask = s->nbuckets - 1;
    for (size_t i = h & mask; s->buckets[i].e; i = (i + 1) & mask)
        if (s->buckets[i].h == h && memcmp(s->buckets[i].e->key.b, k->b, CACHE_KEY_BYTES) == 0) return (ptrdiff_t)i;
    return -1;
}

static void shard_place(struct cache_shard *s, uint64_t h, struct cache_entry *e) {
    size_t mask = s->nbuckets - 1, i = h & mask;
    while (s->buckets[i].e) i = (i + 1) & mask;
    s->buckets[i] = (struct cache_bucket){h, e};
}

/* Empties bucket i, shifting later members of its probe run back so that
 * every entry stays reachable from its home bucket (no tombstones). */
static void shard_unplace(struct cache_shard *s, size_t i) {
    size_t mask = s->nbuckets - 1;
    for (size_t j = (i + 1) & mask; s->buckets[j].e; j = (j + 1) & mask) {
        size_t home = s->buckets[j].h & mask;
        /* j's entry may move to i unless its home lies cyclically in (i, j]. */
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            s->buckets[i] = s->buckets[j];
            i = j;
        }
    }
    s->buckets[i].e = NULL;
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

/* Drops an unlinked entry: its reference to the value, and its memory
 * (an embedded slot goes with the value's last reference). */
static void entry_release(struct cache_entry *e) {
    struct cache_value *v = e->value;
    if (e->embedded) {
        atomic_store_explicit(&v->slot_taken, 0, memory_order_release);
    } else {
        free(e);
    }
    cache_value_unref(v);
}

static size_t entry_cost(const struct cache_entry *e) { return sizeof *e + sizeof(struct cache_value) + e->value->len; }

static void shard_remove(cache_t *c, struct cache_shard *s, struct cache_entry *e) {
    uint64_t h = key_hash(&e->key);
    size_t mask = s->nbuckets - 1, i = h & mask;
    while (s->buckets[i].e != e) i = (i + 1) & mask;
    shard_unplace(s, i);
    lru_unlink(s, e);
    s->used -= entry_cost(e);
    s->count--;
    entry_release(e);
    (void)c;
}

static int shard_grow(struct cache_shard *s) {
    size_t n = s->nbuckets ? s->nbuckets * 2 : 64;
    struct cache_bucket *b = calloc(n, sizeof *b), *old = s->buckets;
    if (!b) return -1;
    size_t on = s->nbuckets;
    s->buckets = b;
    s->nbuckets = n;
    for (size_t i = 0; i < on; i++)
        if (old[i].e) shard_place(s, old[i].h, old[i].e);
    free(old);
    return 0;
}

struct cache_value *cache_lru_get(cache_t *c, const struct cache_key *k) {
    if (!c->lru_bytes) return NULL;
    struct cache_shard *s = shard_of(c, k);
    struct cache_value *v = NULL;
    pthread_mutex_lock(&s->lock);
    ptrdiff_t i = shard_find(s, k, key_hash(k));
    if (i >= 0) {
        struct cache_entry *e = s->buckets[i].e;
        if (s->head != e) {
            lru_unlink(s, e);
            lru_push_front(s, e);
        }
        v = e->value;
        cache_value_ref(v);
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
    /* The slot in front of the value, unless another entry (the same value
     * under a second key) already uses it. */
    struct cache_entry *ne;
    if (!atomic_exchange_explicit(&v->slot_taken, 1, memory_order_acquire)) {
        ne = value_slot(v);
        ne->embedded = 1;
    } else {
        ne = malloc(sizeof *ne);
        if (!ne) return;
        ne->embedded = 0;
    }
    ne->key = *k;
    ne->value = v;
    ne->prev = ne->next = NULL;
    cache_value_ref(v);
    uint64_t evicted = 0;
    pthread_mutex_lock(&s->lock);
    if ((s->count + 1) * 2 > s->nbuckets && shard_grow(s) < 0) {
        pthread_mutex_unlock(&s->lock);
        entry_release(ne);
        return;
    }
    uint64_t h = key_hash(k);
    ptrdiff_t old = shard_find(s, k, h);
    if (old >= 0) shard_remove(c, s, s->buckets[old].e);
    while (s->used + cost > s->budget && s->tail) {
        shard_remove(c, s, s->tail);
        evicted++;
    }
    shard_place(s, h, ne);
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
#define CODEC_VERSION 2 /* 2: no CRC; the Redis form carries a MAC instead */

/* The encoder runs twice: once without a buffer to size the value, once
 * writing into the value itself (one allocation, no copy). */
struct wbuf {
    uint8_t *p; /* NULL while sizing */
    size_t n;
};

static void wput(struct wbuf *w, const void *src, size_t n) {
    if (w->p) memcpy(w->p + w->n, src, n);
    w->n += n;
}

static void wu32(struct wbuf *w, uint32_t x) { wput(w, &x, 4); }
static void wu64(struct wbuf *w, uint64_t x) { wput(w, &x, 8); }

static void encode_into(struct wbuf *w, const struct tensor *outs, const char *const *names, int n);

struct cache_value *cache_value_encode(const struct tensor *outs, const char *const *names, int n) {
    struct wbuf w = {0};
    encode_into(&w, outs, names, n);
    struct cache_value *v = value_alloc(w.n);
    if (!v) return NULL;
    w = (struct wbuf){.p = v->data};
    encode_into(&w, outs, names, n);
    return v;
}

static void encode_into(struct wbuf *w_, const struct tensor *outs, const char *const *names, int n) {
    struct wbuf w = *w_;
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
            /* Strings length-prefixed, the binary tensor layout (common/tensor.h). */
            size_t nb = tensor_strings_prefixed_size(t);
            wu64(&w, nb);
            if (w.p) tensor_strings_prefixed_write(t, w.p + w.n);
            w.n += nb;
        } else {
            size_t nb = tensor_nbytes(t);
            wu64(&w, nb);
            wput(&w, t->data, nb);
        }
    }
    *w_ = w;
}

int cache_value_view(const struct cache_value *v, struct cache_view *view) {
    const uint8_t *p = v->data, *end = v->data + v->len;
    if (v->len < 12 || memcmp(p, CODEC_MAGIC, 4) != 0) return -1;
    uint32_t ver, n;
    memcpy(&ver, p + 4, 4);
    memcpy(&n, p + 8, 4);
    p += 12;
    if (ver != CODEC_VERSION || n > CACHE_MAX_OUTPUTS) return -1;
    for (uint32_t i = 0; i < n; i++) {
        struct cache_view_output *o = &view->out[i];
        uint32_t nl, dt, nd;
        if ((size_t)(end - p) < 4) return -1;
        memcpy(&nl, p, 4);
        p += 4;
        if (nl == 0 || (size_t)(end - p) < (size_t)nl + 8 || p[nl - 1] != 0) return -1;
        o->name = (const char *)p;
        p += nl;
        memcpy(&dt, p, 4);
        memcpy(&nd, p + 4, 4);
        p += 8;
        if (dt >= DT_MAX_ || dtype_size((enum dtype)dt) == 0 || nd > TENSOR_MAX_DIMS) return -1;
        if ((size_t)(end - p) < (size_t)nd * 8 + 8) return -1;
        o->dtype = (enum dtype)dt;
        o->ndim = (int)nd;
        /* The element count is bounded by the value's length before any
         * product can overflow: every element takes at least one byte (four
         * for a string's length). */
        uint64_t numel = 1, room = (uint64_t)(end - p);
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t x;
            memcpy(&x, p, 8);
            p += 8;
            if (x > (uint64_t)INT32_MAX) return -1;
            o->dims[d] = (int64_t)x;
            if (numel && x > room / numel) numel = UINT64_MAX;
            else numel *= x;
        }
        uint64_t nb;
        memcpy(&nb, p, 8);
        p += 8;
        if (nb > (uint64_t)(end - p)) return -1;
        if (o->dtype == DT_STRING) {
            /* Exactly numel strings in nb bytes, none left over. */
            if (numel > nb / 4 || tensor_strings_check(p, nb, (int64_t)numel, NULL, NULL, 0)) return -1;
        } else if (numel > nb || nb != numel * dtype_size(o->dtype)) {
            return -1;
        }
        o->data = p;
        o->len = (size_t)nb;
        p += nb;
    }
    if (p != end) return -1;
    view->n = (int)n;
    return 0;
}

/* ---- the Redis form --------------------------------------------------------
 * HMAC-SHA-256 from the same pre-keyed states as the keys, over a framed
 * domain tag, the key and the value: a value is only good under the key it
 * was stored with, and nobody without the secret can write one. */
void cache_value_mac(const cache_t *c, const struct cache_key *k, const void *bytes, size_t len,
                     uint8_t mac[CACHE_MAC_BYTES]) {
    struct key_ctx x = {.sha = c->hmac->inner, .hmac = c->hmac};
    key_field(&x, "kiln-value-v1", 13);
    key_field(&x, k->b, CACHE_KEY_BYTES);
    key_field(&x, bytes, len);
    key_ctx_final(&x, mac);
    _Static_assert(SHA256_DIGEST_LENGTH == CACHE_MAC_BYTES, "the MAC is a SHA-256 digest");
}

struct cache_value *cache_value_open(const cache_t *c, const struct cache_key *k, const void *bytes, size_t len) {
    if (len < CACHE_MAC_BYTES) return NULL;
    size_t body = len - CACHE_MAC_BYTES;
    uint8_t mac[CACHE_MAC_BYTES];
    cache_value_mac(c, k, bytes, body, mac);
    /* Constant time: the comparison says nothing about how much matched. */
    if (sodium_memcmp(mac, (const uint8_t *)bytes + body, CACHE_MAC_BYTES) != 0) return NULL;
    return cache_value_new(bytes, body);
}

/* ======================================================================
 * single-flight
 * ====================================================================== */

int cache_flight_join(cache_t *c, const struct cache_key *k, struct cache_flight_node *node,
                      void (*cb)(void *arg, struct cache_value *v), void *arg) {
    struct cache_flight_shard *s = &c->flights[key_hash(k) % CACHE_FLIGHT_SHARDS];
    node->key = *k;
    node->cb = cb;
    node->arg = arg;
    node->waiters = NULL;
    pthread_mutex_lock(&s->lock);
    for (struct cache_flight_node *f = s->head; f; f = f->next) {
        if (memcmp(f->key.b, k->b, CACHE_KEY_BYTES) == 0) {
            node->next = f->waiters;
            f->waiters = node;
            pthread_mutex_unlock(&s->lock);
            atomic_fetch_add_explicit(&c->stats.flight_joined, 1, memory_order_relaxed);
            return 0;
        }
    }
    node->next = s->head;
    s->head = node;
    pthread_mutex_unlock(&s->lock);
    return 1;
}

void cache_flight_done(cache_t *c, const struct cache_key *k, struct cache_value *v) {
    struct cache_flight_shard *s = &c->flights[key_hash(k) % CACHE_FLIGHT_SHARDS];
    struct cache_flight_node *found = NULL;
    pthread_mutex_lock(&s->lock);
    for (struct cache_flight_node **pp = &s->head; *pp; pp = &(*pp)->next) {
        if (memcmp((*pp)->key.b, k->b, CACHE_KEY_BYTES) == 0) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (!found) return;
    /* Callbacks run outside the lock: they may join new flights. A waiter's
     * node may be reused or freed by its callback: read next first. */
    struct cache_flight_node *w = found->waiters;
    while (w) {
        struct cache_flight_node *next = w->next;
        if (v) cache_value_ref(v);
        w->cb(w->arg, v);
        w = next;
    }
}
