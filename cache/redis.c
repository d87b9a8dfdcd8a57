/* redis.c - tier 2 of the result cache: one hiredis async connection per I/O
 * thread, attached to that thread's event_base through hiredis's libevent
 * adapter. Nothing here blocks: connects, DNS (evdns) and commands are all
 * asynchronous; every command and every connect has a libevent timer because
 * hiredis 0.14 has no async timeouts. Failures open a circuit breaker; a
 * broken or absent Redis, or a value that fails its MAC or is too large, is
 * a miss, never an error. */
#include <arpa/inet.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/cache.h"
#include "cache/cache_impl.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"

#define REDIS_MAX_INFLIGHT 4096
/* Reconnecting (see "reconnecting" below): the probe's delay doubles from
 * MIN to MAX, each drawn at random from [d/2, d] so that replicas that lost
 * Redis together do not retry together; threads that do not probe look every
 * FOLLOW ms or so. Caching is thus back within about MAX + 2 x FOLLOW ms of
 * Redis answering. CONNECT bounds one attempt (a SYN to a host that went away
 * is not refused: it would hang for minutes). */
#define REDIS_BACKOFF_MIN_MS 100
#define REDIS_BACKOFF_MAX_MS 1000
#define REDIS_FOLLOW_MS 200
#define REDIS_CONNECT_MS 1000
#define REDIS_SETUP_LOG_NS (10ull * 1000000000ull)

struct cache_redis {
    cache_t *c;
    struct event_base *base;
    redisAsyncContext *ac;
    int connected;
    int freeing;
    struct event *reconnect_ev;
    struct event *connect_ev; /* the pending connect's deadline */
    struct event *breaker_ev; /* the open breaker's end */
    int setup_pending;        /* AUTH and SELECT replies awaited before the connection counts */
    int setup_failed;         /* one of them failed: the connection is being dropped */
    int probing;              /* this thread owns the cache's probe */
    uint64_t connects_seen;   /* c->redis_connects when this connection went down */
    struct evdns_base *dns;
    struct evdns_getaddrinfo_request *dns_req;
    char ip[64];
    uint32_t failures;
    uint64_t open_until_ns;
    int open;
    int inflight;
    int warned;
};

struct pending_get {
    struct cache_redis *r;
    struct cache_key key;
    void (*cb)(void *arg, struct cache_value *v);
    void *arg;
    struct event *timer;
    int done;
};

#define STAT_ADD(r, f, n) atomic_fetch_add_explicit(&(r)->c->stats.f, (n), memory_order_relaxed)
#define STAT_SUB(r, f, n) atomic_fetch_sub_explicit(&(r)->c->stats.f, (n), memory_order_relaxed)

/* ---- URL ---------------------------------------------------------------- */

int cache_redis_parse_url(const char *url, struct cache_redis_url *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    out->port = 6379;
    const char *p = url;
    if (strncmp(p, "redis://", 8) == 0) p += 8;
    else if (strstr(p, "://"))
        return status_set(err, err_len, STATUS_INVALID, "--redis-url '%s': only redis:// URLs are supported", url);
    const char *at = strrchr(p, '@');
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon) {
            out->user = colon > p ? strndup(p, (size_t)(colon - p)) : NULL;
            out->pass = strndup(colon + 1, (size_t)(at - colon - 1));
        } else {
            out->pass = strndup(p, (size_t)(at - p));
        }
        p = at + 1;
    }
    const char *slash = strchr(p, '/');
    size_t hostport_len = slash ? (size_t)(slash - p) : strlen(p);
    const char *colon = memchr(p, ':', hostport_len);
    size_t host_len = colon ? (size_t)(colon - p) : hostport_len;
    if (host_len == 0) {
        cache_redis_url_free(out);
        return status_set(err, err_len, STATUS_INVALID, "--redis-url '%s': no host", url);
    }
    out->host = strndup(p, host_len);
    if (colon) {
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (end != p + hostport_len || port <= 0 || port > 65535) {
            cache_redis_url_free(out);
            return status_set(err, err_len, STATUS_INVALID, "--redis-url '%s': bad port", url);
        }
        out->port = (int)port;
    }
    if (slash && slash[1]) {
        char *end;
        long db = strtol(slash + 1, &end, 10);
        if (*end || db < 0 || db > 100000) {
            cache_redis_url_free(out);
            return status_set(err, err_len, STATUS_INVALID, "--redis-url '%s': bad database number", url);
        }
        out->db = (int)db;
    }
    return 0;
}

void cache_redis_url_free(struct cache_redis_url *u) {
    free(u->host);
    free(u->user);
    free(u->pass);
    memset(u, 0, sizeof *u);
}

/* ---- circuit breaker ------------------------------------------------------ */

/* The breaker guards lookups only: a lookup waits for its reply (up to
 * --redis-timeout-ms), a store does not, so stores go on while it is open
 * and the other replicas still find what this one computed. It closes on
 * its timer, so kiln_cache_redis_circuit_open says what is true now, not
 * what was true when this thread last talked to Redis. */
static void breaker_close(struct cache_redis *r) {
    if (!r->open) return;
    r->open = 0;
    evtimer_del(r->breaker_ev);
    STAT_SUB(r, circuit_open, 1);
}

static void on_breaker_timer(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    /* Half-open: lookups go through again; one success keeps it closed,
     * breaker_failures more failures reopen it. */
    breaker_close(arg);
}

static int breaker_allows(struct cache_redis *r) {
    if (!r->open) return 1;
    if (clock_now_ns() < r->open_until_ns) return 0;
    breaker_close(r); /* its timer has not run yet: the loop is busy */
    return 1;
}

static void breaker_success(struct cache_redis *r) { r->failures = 0; }

static void arm_ms(struct event *ev, uint32_t ms);

static void breaker_failure(struct cache_redis *r) {
    if (++r->failures >= r->c->breaker_failures && !r->open) {
        r->open = 1;
        r->open_until_ns = clock_now_ns() + (uint64_t)r->c->breaker_open_ms * 1000000u;
        arm_ms(r->breaker_ev, r->c->breaker_open_ms);
        STAT_ADD(r, circuit_open, 1);
        log_warn("redis cache: %u failures in a row, not asking Redis for %u ms", r->failures, r->c->breaker_open_ms);
    }
}

/* ---- reconnecting -----------------------------------------------------------
 * While Redis is down one I/O thread at a time probes it (connects), no
 * sooner than c->redis_probe_at_ns, which each failed probe pushes out by the
 * doubling, jittered delay; every thread that lost its connection looks every
 * REDIS_FOLLOW_MS or so whether it may probe, or whether a connect succeeded
 * since it lost its own, and then connects at once. A process thus sends at
 * most two connects a second (MAX/2 apart) to a Redis that is down, however
 * many I/O threads it has, and its threads follow the first that gets back. */

static void start_connect(struct cache_redis *r);

static uint32_t jittered_ms(uint32_t ms) { return ms / 2 + randombytes_uniform(ms / 2 + 1); }

static void arm_ms(struct event *ev, uint32_t ms) {
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(ev, &tv);
}

static void probe_release(struct cache_redis *r) {
    if (!r->probing) return;
    r->probing = 0;
    atomic_store_explicit(&r->c->redis_prober, 0, memory_order_release);
}

/* After a failed connect or a lost connection: look again soon. */
static void schedule_reconnect(struct cache_redis *r) {
    cache_t *c = r->c;
    if (r->probing) {
        /* The probe failed: the next one, from whichever thread, waits. */
        uint32_t d = atomic_load_explicit(&c->redis_backoff_ms, memory_order_relaxed);
        atomic_store_explicit(&c->redis_probe_at_ns, clock_now_ns() + (uint64_t)jittered_ms(d) * 1000000u,
                              memory_order_relaxed);
        atomic_store_explicit(&c->redis_backoff_ms, d * 2 > REDIS_BACKOFF_MAX_MS ? REDIS_BACKOFF_MAX_MS : d * 2,
                              memory_order_relaxed);
        probe_release(r);
    }
    if (r->freeing) return;
    r->connects_seen = atomic_load_explicit(&c->redis_connects, memory_order_acquire);
    arm_ms(r->reconnect_ev, jittered_ms(REDIS_FOLLOW_MS));
}

static void on_reconnect_timer(evutil_socket_t fd, short what, void *arg) {
    struct cache_redis *r = arg;
    cache_t *c = r->c;
    (void)fd;
    (void)what;
    if (atomic_load_explicit(&c->redis_connects, memory_order_acquire) == r->connects_seen) {
        /* Nobody got through since: probe if it is time and nobody does. */
        int idle = 0;
        if (clock_now_ns() < atomic_load_explicit(&c->redis_probe_at_ns, memory_order_relaxed) ||
            !atomic_compare_exchange_strong_explicit(&c->redis_prober, &idle, 1, memory_order_acq_rel,
                                                     memory_order_acquire)) {
            arm_ms(r->reconnect_ev, jittered_ms(REDIS_FOLLOW_MS));
            return;
        }
        r->probing = 1;
    }
    start_connect(r);
}

static void on_connect_deadline(evutil_socket_t fd, short what, void *arg) {
    struct cache_redis *r = arg;
    (void)fd;
    (void)what;
    if (!r->ac || r->connected) return;
    /* Still connecting: no callback of ours runs from this free (hiredis
     * calls the disconnect callback for connected contexts only). */
    redisAsyncFree(r->ac);
    r->ac = NULL;
    if (!r->warned) {
        log_warn("redis cache: cannot connect to %s:%d (no answer in %d ms); serving without it and retrying",
                 r->c->redis.host, r->c->redis.port, REDIS_CONNECT_MS);
        r->warned = 1;
    }
    schedule_reconnect(r);
}

/* ---- connection ------------------------------------------------------------- */

/* The connection counts (kiln_cache_redis_connected, lookups and stores
 * sent) only once Redis accepted AUTH and SELECT: a wrong password must not
 * look like a working cache. */
static void setup_done(struct cache_redis *r) {
    r->connected = 1;
    probe_release(r);
    atomic_store_explicit(&r->c->redis_backoff_ms, REDIS_BACKOFF_MIN_MS, memory_order_relaxed);
    atomic_store_explicit(&r->c->redis_probe_at_ns, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->c->redis_connects, 1, memory_order_release);
    /* A new connection starts with a closed breaker: the failures that
     * opened it were the old connection's. */
    r->failures = 0;
    breaker_close(r);
    STAT_ADD(r, redis_connected, 1);
    if (r->warned) log_info("redis cache: connected to %s:%d", r->c->redis.host, r->c->redis.port);
    r->warned = 0;
}

/* A refused AUTH or SELECT drops the connection; it is tried again like a
 * failed connect (the probe's backoff, up to REDIS_BACKOFF_MAX_MS), and
 * logged at most once every REDIS_SETUP_LOG_NS for the whole process,
 * however many I/O threads retry. */
static void setup_reply(redisAsyncContext *ac, redisReply *rep, struct cache_redis *r, const char *what) {
    if (!rep || r->setup_failed || r->ac != ac) return; /* the connection is going: on_disconnect follows */
    if (rep->type == REDIS_REPLY_ERROR) {
        r->setup_failed = 1;
        STAT_ADD(r, redis_errors, 1);
        unsigned n;
        if (log_every_due(&r->c->redis_setup_log, REDIS_SETUP_LOG_NS, &n))
            log_warn("redis cache: %s failed at %s:%d: %s; serving without Redis, retrying (%u refusal%s in the last "
                     "%llu s)", what, r->c->redis.host, r->c->redis.port, rep->str, n, n == 1 ? "" : "s",
                     REDIS_SETUP_LOG_NS / 1000000000ull);
        redisAsyncDisconnect(ac);
        return;
    }
    if (--r->setup_pending == 0) setup_done(r);
}

static void on_auth_reply(redisAsyncContext *ac, void *reply, void *privdata) {
    setup_reply(ac, reply, privdata, "AUTH");
}

static void on_select_reply(redisAsyncContext *ac, void *reply, void *privdata) {
    setup_reply(ac, reply, privdata, "SELECT");
}

static void on_connect(const redisAsyncContext *ac, int status) {
    struct cache_redis *r = ac->data;
    evtimer_del(r->connect_ev);
    if (status != REDIS_OK) {
        /* hiredis frees the context after this callback. */
        if (!r->warned) {
            log_warn("redis cache: cannot connect to %s:%d (%s); serving without it and retrying",
                     r->c->redis.host, r->c->redis.port, ac->errstr);
            r->warned = 1;
        }
        r->ac = NULL;
        schedule_reconnect(r);
        return;
    }
    redisAsyncContext *mac = (redisAsyncContext *)ac;
    const struct cache_redis_url *u = &r->c->redis;
    r->setup_failed = 0;
    r->setup_pending = (u->pass ? 1 : 0) + (u->db ? 1 : 0);
    if (u->pass) {
        if (u->user) redisAsyncCommand(mac, on_auth_reply, r, "AUTH %s %s", u->user, u->pass);
        else redisAsyncCommand(mac, on_auth_reply, r, "AUTH %s", u->pass);
    }
    if (u->db) redisAsyncCommand(mac, on_select_reply, r, "SELECT %d", u->db);
    if (!r->setup_pending) setup_done(r);
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
    struct cache_redis *r = ac->data;
    (void)status;
    if (r->connected) {
        r->connected = 0;
        STAT_SUB(r, redis_connected, 1);
        if (!r->freeing) log_warn("redis cache: lost connection to %s:%d; retrying", r->c->redis.host, r->c->redis.port);
    }
    r->ac = NULL;
    schedule_reconnect(r);
}

/* hiredis 0.14's reader buffers a reply until it is whole, whatever length
 * its header announces (it has no bulk length limit; maxbuf only trims its
 * spare buffer): a server announcing "$1073741824" would be buffered up to
 * 1 GiB. Replies are therefore read through on_readable rather than the
 * libevent adapter's callback: after hiredis took what the socket had (16
 * KiB a read), the reply still incomplete in its buffer is looked at, and
 * one longer than any reply kiln asks for (a GETRANGE of at most the largest
 * cached value, sealed) drops the connection: the lookups waiting on it are
 * misses, and it reconnects as after any failure. */
static int reply_too_long(const redisReader *rd, size_t limit) {
    size_t n = rd->len - rd->pos;
    if (n > limit) return 1;
    /* A bulk string whose type byte ('$') the reader took: its length follows. */
    if (rd->ridx < 0 || rd->rstack[rd->ridx].type != REDIS_REPLY_STRING) return 0;
    const char *p = rd->buf + rd->pos;
    unsigned long long len = 0;
    for (size_t i = 0; i < n && p[i] >= '0' && p[i] <= '9'; i++)
        if ((len = len * 10 + (unsigned long long)(p[i] - '0')) > limit) return 1;
    return 0;
}

static void on_readable(evutil_socket_t fd, short what, void *arg) {
    struct cache_redis *r = arg;
    redisAsyncContext *ac = r->ac;
    (void)fd;
    (void)what;
    if (!ac) return;
    redisAsyncHandleRead(ac);
    if (r->ac != ac) return; /* it went, its callbacks ran */
    size_t limit = r->c->max_value_bytes + CACHE_MAC_BYTES + 32; /* and the reply's "$<length>" and CRLFs */
    if (!ac->c.reader || !reply_too_long(ac->c.reader, limit)) return;
    log_warn("redis cache: %s:%d sent a reply longer than any kiln asks for (values are at most %zu bytes): "
             "dropping the connection", r->c->redis.host, r->c->redis.port, r->c->max_value_bytes);
    STAT_ADD(r, redis_rejected, 1);
    breaker_failure(r);
    redisAsyncFree(ac); /* the waiting lookups' callbacks (misses), then on_disconnect */
    if (r->ac == ac) { /* not connected yet: no on_disconnect */
        r->ac = NULL;
        schedule_reconnect(r);
    }
}

/* Replaces the adapter's read event with on_readable. */
static void guard_reads(struct cache_redis *r, redisAsyncContext *ac) {
    redisLibeventEvents *e = ac->ev.data;
    struct event *rev = e ? event_new(r->base, ac->c.fd, EV_READ, on_readable, r) : NULL;
    if (!rev) return;
    event_free(e->rev);
    e->rev = rev;
    event_add(rev, NULL);
}

static void connect_ip(struct cache_redis *r) {
    redisAsyncContext *ac = redisAsyncConnect(r->ip, r->c->redis.port);
    if (!ac || ac->err) {
        if (!r->warned) {
            log_warn("redis cache: cannot connect to %s:%d (%s); serving without it and retrying", r->c->redis.host,
                     r->c->redis.port, ac ? ac->errstr : "out of memory");
            r->warned = 1;
        }
        if (ac) redisAsyncFree(ac);
        schedule_reconnect(r);
        return;
    }
    ac->data = r;
    r->ac = ac;
    redisLibeventAttach(ac, r->base);
    guard_reads(r, ac);
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    arm_ms(r->connect_ev, REDIS_CONNECT_MS);
}

static void on_resolved(int result, struct evutil_addrinfo *res, void *arg) {
    struct cache_redis *r = arg;
    r->dns_req = NULL;
    if (result != 0 || !res) {
        if (result != EVUTIL_EAI_CANCEL) {
            if (!r->warned) {
                log_warn("redis cache: cannot resolve '%s' (%s); serving without it and retrying", r->c->redis.host,
                         evutil_gai_strerror(result));
                r->warned = 1;
            }
            schedule_reconnect(r);
        }
        if (res) evutil_freeaddrinfo(res);
        return;
    }
    const struct sockaddr_in *sin = (const struct sockaddr_in *)res->ai_addr;
    inet_ntop(AF_INET, &sin->sin_addr, r->ip, sizeof r->ip);
    evutil_freeaddrinfo(res);
    connect_ip(r);
}

static void start_connect(struct cache_redis *r) {
    if (r->freeing || r->ac) return;
    const char *host = r->c->redis.host;
    struct in_addr a4;
    if (strcmp(host, "localhost") == 0) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &a4) == 1) {
        snprintf(r->ip, sizeof r->ip, "%s", host);
        connect_ip(r);
        return;
    }
    if (!r->dns) r->dns = evdns_base_new(r->base, EVDNS_BASE_INITIALIZE_NAMESERVERS);
    if (!r->dns) {
        log_warn("redis cache: no DNS resolver for '%s'", host);
        schedule_reconnect(r);
        return;
    }
    struct evutil_addrinfo hints = {0};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    r->dns_req = evdns_getaddrinfo(r->dns, host, NULL, &hints, on_resolved, r);
}

cache_redis_t *cache_redis_create(cache_t *c, struct event_base *base) {
    if (!c || !c->has_redis) return NULL;
    struct cache_redis *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->c = c;
    r->base = base;
    atomic_store_explicit(&c->redis_backoff_ms, REDIS_BACKOFF_MIN_MS, memory_order_relaxed); /* 0 would never grow */
    r->reconnect_ev = evtimer_new(base, on_reconnect_timer, r);
    r->connect_ev = evtimer_new(base, on_connect_deadline, r);
    r->breaker_ev = evtimer_new(base, on_breaker_timer, r);
    if (!r->reconnect_ev || !r->connect_ev || !r->breaker_ev) {
        if (r->reconnect_ev) event_free(r->reconnect_ev);
        if (r->connect_ev) event_free(r->connect_ev);
        if (r->breaker_ev) event_free(r->breaker_ev);
        free(r);
        return NULL;
    }
    start_connect(r);
    return r;
}

void cache_redis_free(cache_redis_t *r) {
    if (!r) return;
    r->freeing = 1;
    if (r->dns_req) evdns_getaddrinfo_cancel(r->dns_req);
    if (r->ac) {
        /* Calls every pending reply callback with NULL, then on_disconnect. */
        redisAsyncFree(r->ac);
        r->ac = NULL;
    }
    if (r->connected) STAT_SUB(r, redis_connected, 1);
    if (r->open) STAT_SUB(r, circuit_open, 1);
    probe_release(r);
    event_free(r->reconnect_ev);
    event_free(r->connect_ev);
    event_free(r->breaker_ev);
    if (r->dns) evdns_base_free(r->dns, 1);
    free(r);
}

int cache_redis_connected(const cache_redis_t *r) { return r && r->connected; }

void cache_redis_rejected(cache_t *c) {
    atomic_fetch_add_explicit(&c->stats.redis_rejected, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&c->stats.redis_hits, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->stats.redis_misses, 1, memory_order_relaxed);
}

/* ---- commands --------------------------------------------------------------- */

static void redis_key(const struct cache_key *k, char out[5 + 2 * CACHE_KEY_BYTES + 1]) {
    memcpy(out, "kiln:", 5);
    cache_key_hex(k, out + 5);
}

static void on_get_timeout(evutil_socket_t fd, short what, void *arg) {
    struct pending_get *p = arg;
    (void)fd;
    (void)what;
    /* The reply may still come; on_get_reply frees p then. */
    p->done = 1;
    STAT_ADD(p->r, redis_timeouts, 1);
    breaker_failure(p->r);
    event_free(p->timer);
    p->timer = NULL;
    p->cb(p->arg, NULL);
}

static void on_get_reply(redisAsyncContext *ac, void *reply, void *privdata) {
    struct pending_get *p = privdata;
    struct cache_redis *r = p->r;
    redisReply *rep = reply;
    (void)ac;
    r->inflight--;
    size_t limit = r->c->max_value_bytes + CACHE_MAC_BYTES;
    if (p->done) {
        /* Timed out: a value near the limit may take longer than the
         * timeout to arrive. One over it is still counted as refused. */
        if (rep && rep->type == REDIS_REPLY_STRING && (size_t)rep->len > limit) STAT_ADD(r, redis_rejected, 1);
        free(p);
        return;
    }
    event_free(p->timer);
    struct cache_value *v = NULL;
    if (!rep) {
        STAT_ADD(r, redis_errors, 1);
        breaker_failure(r);
    } else if (rep->type == REDIS_REPLY_ERROR) {
        STAT_ADD(r, redis_errors, 1);
        breaker_failure(r);
        log_debug("redis cache: GET failed: %s", rep->str);
    } else if (rep->type == REDIS_REPLY_STRING && rep->len > 0) {
        breaker_success(r);
        /* Over the limit (GETRANGE sent one byte more than a value may have)
         * or not sealed with our secret under this key: a miss, dropped at
         * once; the caller's later SET overwrites it. */
        if ((size_t)rep->len <= limit) v = cache_value_open(r->c, &p->key, rep->str, (size_t)rep->len);
        if (!v) STAT_ADD(r, redis_rejected, 1);
        STAT_ADD(r, redis_hits, v ? 1 : 0);
        STAT_ADD(r, redis_misses, v ? 0 : 1);
    } else {
        breaker_success(r);
        STAT_ADD(r, redis_misses, 1);
    }
    p->cb(p->arg, v);
    free(p);
}

void cache_redis_get(cache_redis_t *r, const struct cache_key *k, void (*cb)(void *arg, struct cache_value *v),
                     void *arg) {
    if (!r->connected || !r->ac || !breaker_allows(r) || r->inflight >= REDIS_MAX_INFLIGHT) {
        STAT_ADD(r, redis_skipped, 1);
        cb(arg, NULL);
        return;
    }
    struct pending_get *p = calloc(1, sizeof *p);
    if (!p) {
        cb(arg, NULL);
        return;
    }
    p->r = r;
    p->key = *k;
    p->cb = cb;
    p->arg = arg;
    p->timer = evtimer_new(r->base, on_get_timeout, p);
    char key[5 + 2 * CACHE_KEY_BYTES + 1];
    redis_key(k, key);
    /* GETRANGE, not GET: Redis sends at most one byte more than the largest
     * value kiln stores, so a huge value planted under the key (20 MiB,
     * 200 MiB) never crosses the network nor fills hiredis's read buffer;
     * the reply is one byte too long and dropped. hiredis 0.14's reader has
     * no bulk length limit of its own: it would buffer any length the
     * server announces. A missing key reads as "", a miss. */
    unsigned long long last = (unsigned long long)r->c->max_value_bytes + CACHE_MAC_BYTES;
    if (!p->timer || redisAsyncCommand(r->ac, on_get_reply, p, "GETRANGE %s 0 %llu", key, last) != REDIS_OK) {
        if (p->timer) event_free(p->timer);
        free(p);
        STAT_ADD(r, redis_errors, 1);
        breaker_failure(r);
        cb(arg, NULL);
        return;
    }
    r->inflight++;
    uint32_t ms = r->c->redis_timeout_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(p->timer, &tv);
}

static void on_set_reply(redisAsyncContext *ac, void *reply, void *privdata) {
    struct cache_redis *r = privdata;
    redisReply *rep = reply;
    (void)ac;
    r->inflight--;
    /* Not the breaker's business (it guards lookups): a lost connection
     * shows itself through on_disconnect. */
    if (!rep || rep->type == REDIS_REPLY_ERROR) {
        STAT_ADD(r, redis_errors, 1);
    } else {
        STAT_ADD(r, redis_sets, 1);
    }
}

void cache_redis_set(cache_redis_t *r, const struct cache_key *k, const struct cache_value *v) {
    if (v->len > r->c->max_value_bytes) {
        STAT_ADD(r, redis_too_large, 1);
        return;
    }
    /* Sent while the breaker is open: a store waits for nothing, and one
     * slow lookup must not keep this replica's results from the others. */
    if (!r->connected || !r->ac || r->inflight >= REDIS_MAX_INFLIGHT) {
        STAT_ADD(r, redis_skipped, 1);
        return;
    }
    char key[5 + 2 * CACHE_KEY_BYTES + 1];
    redis_key(k, key);
    /* The MAC only now that the value leaves the process; "%b%b" makes the
     * value and its MAC one argument. */
    uint8_t mac[CACHE_MAC_BYTES];
    cache_value_mac(r->c, k, v->data, v->len, mac);
    int rc;
    if (r->c->ttl_secs)
        rc = redisAsyncCommand(r->ac, on_set_reply, r, "SET %s %b%b EX %u", key, (const char *)v->data, v->len,
                               (const char *)mac, sizeof mac, (unsigned)r->c->ttl_secs);
    else
        rc = redisAsyncCommand(r->ac, on_set_reply, r, "SET %s %b%b", key, (const char *)v->data, v->len,
                               (const char *)mac, sizeof mac);
    if (rc == REDIS_OK) r->inflight++;
}
