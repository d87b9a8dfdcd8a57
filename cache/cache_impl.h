/* cache_impl.h - private structures shared by cache/cache.c and cache/redis.c. */
#ifndef KILN_CACHE_IMPL_H
#define KILN_CACHE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "cache/cache.h"
#include "common/log.h"

#define CACHE_FLIGHT_SHARDS 16

struct cache_entry {
    struct cache_key key;
    struct cache_value *value;
    struct cache_entry *prev, *next; /* recency list, head = most recent */
    int embedded;                    /* the slot in front of value, not malloc'd */
};

/* An open-addressing slot: the key's first 64 bits beside the entry, so a
 * lookup that misses reads the table alone and never the entries. */
struct cache_bucket {
    uint64_t h;
    struct cache_entry *e; /* NULL = empty */
};

struct cache_shard {
    pthread_mutex_t lock;
    struct cache_bucket *buckets; /* linear probing, at most half full */
    size_t nbuckets;              /* power of two */
    struct cache_entry *head, *tail;
    size_t used, budget, count;
};

struct cache_flight_shard {
    pthread_mutex_t lock;
    struct cache_flight_node *head;
};

struct cache_redis_url {
    char *host;
    int port;
    char *user, *pass;
    int db;
};

struct cache_counters {
    atomic_uint_fast64_t lru_hits, lru_misses, lru_inserts, lru_evictions;
    atomic_uint_fast64_t redis_hits, redis_misses, redis_errors, redis_timeouts, redis_sets, redis_skipped;
    atomic_uint_fast64_t redis_rejected, redis_too_large, flight_joined;
    atomic_uint_fast64_t lookup_ns_total, lookup_count, insert_ns_total, insert_count;
    atomic_uint_fast64_t redis_connected, circuit_open;
};

struct cache {
    uint8_t secret[32];
    struct cache_hmac *hmac;             /* SHA-256 states after the HMAC pads (cache.c) */
    struct cache_shard *shards;
    int nshards;
    size_t lru_bytes, max_value_bytes;
    struct cache_flight_shard *flights;
    int has_redis;
    struct cache_redis_url redis;
    uint32_t ttl_secs, redis_timeout_ms, breaker_failures, breaker_open_ms;
    /* While Redis is down one I/O thread probes it and the others wait for
     * a connect to succeed (redis.c, "reconnecting"). */
    atomic_int redis_prober;                /* 1 while a thread owns the probe */
    atomic_uint_fast64_t redis_connects;    /* successful connects so far */
    atomic_uint_fast64_t redis_probe_at_ns; /* no probe before (CLOCK_MONOTONIC) */
    atomic_uint redis_backoff_ms;           /* the next failed probe's delay */
    struct log_every redis_setup_log;       /* AUTH/SELECT refusals, logged once an interval */
    struct cache_counters stats;
};

int cache_redis_parse_url(const char *url, struct cache_redis_url *out, char *err, size_t err_len);
void cache_redis_url_free(struct cache_redis_url *u);

#endif
