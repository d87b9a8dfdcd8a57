/* cache.h - the result cache: keyed hashing, an in-process LRU (tier 1),
 * Redis through hiredis's async API (tier 2), single-flight, fail-open.
 *
 * What is cached is a model's encoded outputs for one request (the tensors
 * after output selection and classification), in cache_value_encode's
 * versioned binary form; in Redis it carries a MAC under the cache secret. The response is rebuilt from it
 * per request, so request ids and transport choices stay the caller's.
 *
 * Threads: a cache_t (LRU, secret, single-flight table, stats) is shared by
 * every thread; each shard has one lock. A cache_redis_t belongs to one I/O
 * thread's event_base and is used only from that thread; its callbacks run
 * there. Redis being down, slow or returning garbage is never an error to the
 * caller: it is a miss. */
#ifndef KILN_CACHE_H
#define KILN_CACHE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/tensor.h"

struct event_base;
typedef struct cache cache_t;
typedef struct cache_redis cache_redis_t;

#define CACHE_KEY_BYTES 32

struct cache_key {
    uint8_t b[CACHE_KEY_BYTES];
};

struct cache_params {
    size_t lru_bytes;          /* tier-1 budget in bytes; 0 disables tier 1 */
    int shards;                /* 0 = 16 */
    const char *secret;        /* key secret shared by replicas; NULL or "" = random per process */
    const char *redis_url;     /* redis://[user:pass@]host:port/db; NULL = no tier 2 */
    uint32_t ttl_secs;         /* Redis TTL; 0 = none */
    uint32_t redis_timeout_ms; /* a lookup's wait for its reply; 0 = 50 */
    size_t max_value_bytes;    /* values above are not stored; 0 = 4 MiB */
    uint32_t breaker_failures; /* consecutive failures that open the circuit; 0 = 5 */
    uint32_t breaker_open_ms;  /* how long it stays open; 0 = 1000 */
};

/* A reference-counted immutable value from the LRU or Redis. Every value is
 * allocated with room for one LRU entry in front of it, so storing a fresh
 * value in tier 1 costs no allocation beyond the value's own. */
struct cache_value {
    atomic_int refs;
    atomic_int slot_taken; /* the embedded LRU entry is in use */
    size_t len;
    uint8_t data[];
};
struct cache_value *cache_value_new(const void *bytes, size_t len);
void cache_value_ref(struct cache_value *v);
void cache_value_unref(struct cache_value *v); /* NULL is a no-op */

struct cache_stats {
    uint64_t lru_hits, lru_misses, lru_inserts, lru_evictions, lru_bytes, lru_entries;
    uint64_t redis_hits, redis_misses, redis_errors, redis_timeouts, redis_sets, redis_skipped;
    uint64_t redis_rejected, redis_too_large;
    uint64_t flight_joined;
    int redis_connected;       /* I/O threads with a connection Redis accepted (AUTH, SELECT) */
    int circuit_open;          /* I/O threads whose breaker is open now (it closes on a timer) */
    uint64_t lookup_ns_total, lookup_count, insert_ns_total, insert_count;
};

cache_t *cache_create(const struct cache_params *p, char *err, size_t err_len);
void cache_free(cache_t *c); /* NULL is a no-op */
int cache_has_redis(const cache_t *c);
void cache_get_stats(cache_t *c, struct cache_stats *out);
/* Records lookup/insert latencies measured by the caller (ns). */
void cache_record_lookup(cache_t *c, uint64_t ns);
void cache_record_insert(cache_t *c, uint64_t ns);

/* ---- keys ---------------------------------------------------------------
 * HMAC-SHA-256 keyed with the secret over a framed sequence of fields: every
 * field carries its length, so no two different requests frame to the same
 * bytes. Callers add inputs sorted by name and outputs sorted by name, and
 * always finish with cache_key_end. The state is a plain struct on the
 * caller's stack (no allocation): an abandoned one needs no cleanup. */
struct cache_key_state {
    uint8_t st[128] __attribute__((aligned(16)));
};
void cache_key_begin(const cache_t *c, struct cache_key_state *s, const char *model, int64_t version);
void cache_key_add_input(struct cache_key_state *s, const char *name, enum dtype dt, const int64_t *shape,
                         int ndim, const void *data, size_t len);
void cache_key_add_output(struct cache_key_state *s, const char *name, int binary, int classification);
void cache_key_end(struct cache_key_state *s, struct cache_key *out);
/* Hex form for logs and Redis keys: 64 chars + NUL. */
void cache_key_hex(const struct cache_key *k, char out[2 * CACHE_KEY_BYTES + 1]);

/* ---- tier 1: in-process LRU --------------------------------------------- */
/* Returns a referenced value (cache_value_unref it) or NULL. */
struct cache_value *cache_lru_get(cache_t *c, const struct cache_key *k);
/* Stores (replaces) a value; values above max_value_bytes or the shard's
 * budget are ignored. Evicts least recently used entries to fit. */
void cache_lru_put(cache_t *c, const struct cache_key *k, struct cache_value *v);

/* ---- value encoding ------------------------------------------------------
 * "KLNC" magic, version, tensor count, then per tensor its name, dtype,
 * shape and bytes (BYTES tensors as 4-byte-length-prefixed strings). */
#define CACHE_MAX_OUTPUTS 64 /* tensors in one value */
struct cache_value *cache_value_encode(const struct tensor *outs, const char *const *names, int n);
/* A checked value, decoded once: each output's name, dtype, shape and bytes,
 * pointing into the value (valid while it is referenced). */
struct cache_view_output {
    const char *name; /* a C string */
    enum dtype dtype;
    int ndim;
    int64_t dims[TENSOR_MAX_DIMS];
    const void *data; /* the tensor's bytes; for BYTES its length-prefixed strings */
    size_t len;       /* bytes at data: elements x dtype size, or exactly the
                         element count of length-prefixed strings */
};
struct cache_view {
    int n;
    struct cache_view_output out[CACHE_MAX_OUTPUTS];
};
/* The one decoder of a value: checks all of it against its own bytes (magic,
 * version, output count, every name, dtype and dim, each output's byte count
 * against its element count, a BYTES output's string framing through
 * tensor_strings_check, nothing left over) and fills view. 0, or -1 when the
 * value is malformed or truncated (view is then not to be read). A Redis
 * value's MAC is checked before it becomes a value (cache_value_open).
 * Checks nothing against a model: that is the caller's (infer_cache), which
 * reads the view without checking its bytes again. */
int cache_value_view(const struct cache_value *v, struct cache_view *view);

/* ---- the Redis form --------------------------------------------------------
 * What Redis holds under a key is the encoded value followed by
 * CACHE_MAC_BYTES of HMAC-SHA-256 keyed with the cache secret over the key
 * and the value. Anyone who can write to Redis can still not make a value
 * that passes, nor move one to another key: a value is never decoded before
 * its MAC is checked. */
#define CACHE_MAC_BYTES 32
void cache_value_mac(const cache_t *c, const struct cache_key *k, const void *bytes, size_t len,
                     uint8_t mac[CACHE_MAC_BYTES]);
/* Checks the MAC at the end of bytes in constant time; returns a new
 * referenced value without the MAC, or NULL. The value is decoded (and its
 * structure checked) once, by its reader through cache_value_view. */
struct cache_value *cache_value_open(const cache_t *c, const struct cache_key *k, const void *bytes, size_t len);
/* Counts a Redis value the caller refused after cache_redis_get handed it
 * over (it does not fit the model): a rejection and a miss, not a hit. */
void cache_redis_rejected(cache_t *c);

/* ---- tier 2: Redis, per I/O thread --------------------------------------- */
/* Attaches a Redis connection to base (connects in the background; never
 * blocks). NULL when the cache has no Redis URL. */
cache_redis_t *cache_redis_create(cache_t *c, struct event_base *base);
/* Must be called on base's thread, before the base is freed. NULL no-op. */
void cache_redis_free(cache_redis_t *r);
/* Looks k up. cb runs exactly once on the loop thread, possibly before
 * cache_redis_get returns (when the circuit is open or not connected), with
 * a referenced value (the callee unrefs it) or NULL on miss/error/timeout. */
void cache_redis_get(cache_redis_t *r, const struct cache_key *k,
                     void (*cb)(void *arg, struct cache_value *v), void *arg);
/* Stores v (with TTL) unless it is too large or Redis is not connected;
 * the breaker (which guards lookups) does not hold stores back. */
void cache_redis_set(cache_redis_t *r, const struct cache_key *k, const struct cache_value *v);
int cache_redis_connected(const cache_redis_t *r);

/* ---- single-flight -------------------------------------------------------
 * cache_flight_join: if nobody computes k, makes the caller the leader and
 * returns 1; otherwise queues cb(arg, value) and returns 0. The leader must
 * call cache_flight_done(k, value-or-NULL) exactly once; every queued cb then
 * runs on the leader's thread (it must hand off to its own thread) with a
 * referenced value (unref it) or NULL when the leader failed (compute it
 * yourself). node is caller-owned storage (no allocation): the flight's
 * record while its caller leads, or its place in the queue while it waits;
 * it must stay valid until cache_flight_done (leader) or until cb has run
 * (follower). */
struct cache_flight_node {
    struct cache_key key;
    void (*cb)(void *arg, struct cache_value *v);
    void *arg;
    struct cache_flight_node *next;    /* next flight in its shard, or next waiter */
    struct cache_flight_node *waiters; /* on a flight record */
};
int cache_flight_join(cache_t *c, const struct cache_key *k, struct cache_flight_node *node,
                      void (*cb)(void *arg, struct cache_value *v), void *arg);
void cache_flight_done(cache_t *c, const struct cache_key *k, struct cache_value *v);

#endif
