/* Tier-2 tests against a real redis-server started on a free loopback port:
 * miss then hit, corrupted, forged, moved and oversized values, TTL, Redis
 * killed and restarted (and how soon every connection is back), Redis
 * paused (SIGSTOP), and the circuit breaker. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "common/clock.h"

static int g_port;
static pid_t g_redis;

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof a);
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

static uint64_t now_ms(void) { return clock_now_ns() / 1000000; }

static redisContext *sync_client(void) {
    for (int i = 0; i < 200; i++) {
        redisContext *rc = redisConnect("127.0.0.1", g_port);
        if (rc && !rc->err) return rc;
        if (rc) redisFree(rc);
        usleep(20000);
    }
    return NULL;
}

static void start_redis(void) {
    char port[16];
    snprintf(port, sizeof port, "%d", g_port);
    g_redis = fork();
    if (g_redis == 0) {
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly",
               "no", "--loglevel", "warning", (char *)NULL);
        _exit(127);
    }
    redisContext *rc = sync_client();
    assert_non_null(rc);
    redisFree(rc);
}

static void stop_redis(void) {
    if (g_redis > 0) {
        kill(g_redis, SIGKILL);
        waitpid(g_redis, NULL, 0);
        g_redis = 0;
    }
}

static int setup(void **state) {
    (void)state;
    g_port = free_port();
    start_redis();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (g_redis > 0) kill(g_redis, SIGCONT);
    stop_redis();
    return 0;
}

struct env {
    cache_t *c;
    struct event_base *base;
    cache_redis_t *r;
};

static void env_open(struct env *e, uint32_t ttl, uint32_t timeout_ms) {
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/0", g_port);
    struct cache_params p = {.lru_bytes = 0, .redis_url = url, .ttl_secs = ttl, .redis_timeout_ms = timeout_ms,
                             .breaker_failures = 3, .breaker_open_ms = 200};
    e->c = cache_create(&p, NULL, 0);
    assert_non_null(e->c);
    e->base = event_base_new();
    e->r = cache_redis_create(e->c, e->base);
    assert_non_null(e->r);
}

static void env_close(struct env *e) {
    cache_redis_free(e->r);
    event_base_free(e->base);
    cache_free(e->c);
}

/* Runs the loop until cond() or the deadline. */
static int run_until(struct env *e, int (*cond)(struct env *), uint64_t ms) {
    uint64_t end = now_ms() + ms;
    while (!cond(e) && now_ms() < end) {
        struct timeval tv = {0, 5000};
        event_base_loopexit(e->base, &tv);
        event_base_dispatch(e->base);
    }
    return cond(e);
}

static int connected(struct env *e) { return cache_redis_connected(e->r); }

struct got {
    int done;
    struct cache_value *v;
};

static void on_get(void *arg, struct cache_value *v) {
    struct got *g = arg;
    g->done = 1;
    g->v = v;
}

static struct got *g_cur;
static int got_done(struct env *e) {
    (void)e;
    return g_cur->done;
}

static struct cache_value *get(struct env *e, const struct cache_key *k) {
    struct got g = {0};
    g_cur = &g;
    cache_redis_get(e->r, k, on_get, &g);
    assert_true(run_until(e, got_done, 3000));
    return g.v;
}

static struct cache_value *sample(float x) {
    float f[4] = {x, x + 1, x + 2, x + 3};
    struct tensor t = {.dtype = DT_FP32, .ndim = 2, .dims = {1, 4}, .data = f};
    const char *n = "y";
    return cache_value_encode(&t, &n, 1);
}

static void wait_ms(struct env *e, uint64_t ms) {
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    event_base_loopexit(e->base, &tv);
    event_base_dispatch(e->base);
}

static void test_miss_then_hit_and_corruption(void **state) {
    (void)state;
    struct env e;
    env_open(&e, 0, 200);
    assert_true(run_until(&e, connected, 3000));
    struct cache_key k = {{42, 1}};
    assert_null(get(&e, &k));
    struct cache_value *v = sample(1);
    cache_redis_set(e.r, &k, v);
    wait_ms(&e, 50);
    struct cache_value *h = get(&e, &k);
    assert_non_null(h);
    assert_int_equal(h->len, v->len);
    assert_memory_equal(h->data, v->data, v->len);
    cache_value_unref(h);
    /* Corrupt it behind kiln's back: a miss, counted, then overwritten. */
    char key[80] = "kiln:";
    cache_key_hex(&k, key + 5);
    redisContext *rc = sync_client();
    redisReply *rep = redisCommand(rc, "SET %s %b", key, "KLNC-garbage", (size_t)12);
    freeReplyObject(rep);
    assert_null(get(&e, &k));
    struct cache_stats st;
    cache_get_stats(e.c, &st);
    assert_int_equal(st.redis_rejected, 1);
    /* A well-formed value without a MAC (anyone can write one). */
    struct cache_value *forged = sample(100);
    rep = redisCommand(rc, "SET %s %b", key, forged->data, forged->len);
    freeReplyObject(rep);
    assert_null(get(&e, &k));
    cache_value_unref(forged);
    /* A value sealed for another key, moved under this one. */
    struct cache_key other = {{43}};
    cache_redis_set(e.r, &other, v);
    wait_ms(&e, 50);
    char okey[80] = "kiln:";
    cache_key_hex(&other, okey + 5);
    rep = redisCommand(rc, "COPY %s %s REPLACE", okey, key);
    int copied = rep && rep->type == REDIS_REPLY_INTEGER;
    freeReplyObject(rep);
    if (!copied) { /* Redis before 6.2: read and write */
        rep = redisCommand(rc, "GET %s", okey);
        redisReply *w = redisCommand(rc, "SET %s %b", key, rep->str, (size_t)rep->len);
        freeReplyObject(w);
        freeReplyObject(rep);
    }
    assert_null(get(&e, &k));
    /* 20 MiB under the key: GETRANGE brings back the limit + 1 byte, dropped. */
    size_t huge = 20u << 20;
    char *junk = malloc(huge);
    memset(junk, 'x', huge);
    rep = redisCommand(rc, "SET %s %b", key, junk, huge);
    freeReplyObject(rep);
    free(junk);
    assert_null(get(&e, &k));
    cache_get_stats(e.c, &st);
    assert_int_equal(st.redis_rejected, 4);
    assert_int_equal(st.redis_hits, 1);
    cache_redis_set(e.r, &k, v);
    wait_ms(&e, 50);
    h = get(&e, &k);
    assert_non_null(h);
    cache_value_unref(h);
    redisFree(rc);
    cache_value_unref(v);
    env_close(&e);
}

static void test_ttl_expiry(void **state) {
    (void)state;
    struct env e;
    env_open(&e, 1, 200);
    assert_true(run_until(&e, connected, 3000));
    struct cache_key k = {{7, 7, 7}};
    struct cache_value *v = sample(2);
    cache_redis_set(e.r, &k, v);
    wait_ms(&e, 50);
    struct cache_value *h = get(&e, &k);
    assert_non_null(h);
    cache_value_unref(h);
    wait_ms(&e, 1300);
    assert_null(get(&e, &k));
    cache_value_unref(v);
    env_close(&e);
}

static int disconnected(struct env *e) { return !cache_redis_connected(e->r); }

static void test_killed_and_restarted(void **state) {
    (void)state;
    struct env e;
    env_open(&e, 0, 50);
    assert_true(run_until(&e, connected, 3000));
    struct cache_key k = {{9}};
    struct cache_value *v = sample(3);
    stop_redis();
    assert_true(run_until(&e, disconnected, 3000));
    /* Down: every lookup is an immediate miss, never an error. */
    for (int i = 0; i < 20; i++) assert_null(get(&e, &k));
    cache_redis_set(e.r, &k, v);
    start_redis();
    assert_true(run_until(&e, connected, 10000));
    cache_redis_set(e.r, &k, v);
    wait_ms(&e, 50);
    struct cache_value *h = get(&e, &k);
    assert_non_null(h);
    cache_value_unref(h);
    cache_value_unref(v);
    env_close(&e);
}

/* Several I/O threads' connections lose Redis for 8 s (where a delay
 * doubling to 5 s left them off for up to 5 s more): all are back within
 * 2 s of Redis answering again. */
#define NCONN 4
static cache_redis_t *g_conns[NCONN];
static int all_connected(struct env *e) {
    (void)e;
    for (int i = 0; i < NCONN; i++)
        if (!cache_redis_connected(g_conns[i])) return 0;
    return 1;
}
static int none_connected(struct env *e) {
    (void)e;
    for (int i = 0; i < NCONN; i++)
        if (cache_redis_connected(g_conns[i])) return 0;
    return 1;
}

static void test_long_outage_resumes_within_2s(void **state) {
    (void)state;
    struct env e;
    env_open(&e, 0, 50);
    for (int i = 0; i < NCONN; i++) g_conns[i] = i ? cache_redis_create(e.c, e.base) : e.r;
    assert_true(run_until(&e, all_connected, 3000));
    stop_redis();
    assert_true(run_until(&e, none_connected, 3000));
    wait_ms(&e, 8000);
    start_redis();
    uint64_t t0 = now_ms();
    assert_true(run_until(&e, all_connected, 10000));
    uint64_t took = now_ms() - t0;
    print_message("all %d connections back %llu ms after Redis answered\n", NCONN, (unsigned long long)took);
    assert_true(took <= 2000);
    for (int i = 1; i < NCONN; i++) cache_redis_free(g_conns[i]);
    env_close(&e);
}

static void test_paused_times_out_and_breaker_opens(void **state) {
    (void)state;
    struct env e;
    env_open(&e, 0, 20);
    assert_true(run_until(&e, connected, 3000));
    struct cache_key k = {{11}};
    kill(g_redis, SIGSTOP);
    uint64_t t0 = now_ms();
    for (int i = 0; i < 10; i++) assert_null(get(&e, &k));
    uint64_t took = now_ms() - t0;
    struct cache_stats st;
    cache_get_stats(e.c, &st);
    /* Three timeouts open the breaker; the rest are skipped at once. */
    assert_int_equal(st.redis_timeouts, 3);
    assert_true(st.redis_skipped >= 7);
    assert_int_equal(st.circuit_open, 1);
    assert_true(took < 2000);
    kill(g_redis, SIGCONT);
    wait_ms(&e, 300);
    struct cache_value *v = sample(4);
    assert_null(get(&e, &k)); /* half-open: asks Redis again, gets a real miss */
    cache_redis_set(e.r, &k, v);
    wait_ms(&e, 50);
    struct cache_value *h = get(&e, &k);
    assert_non_null(h);
    cache_value_unref(h);
    cache_value_unref(v);
    cache_get_stats(e.c, &st);
    assert_int_equal(st.circuit_open, 0);
    env_close(&e);
}

/* The breaker guards lookups only: a store made while it is open reaches
 * Redis; and it closes on its timer, with no call in between, so the gauge
 * tells what holds now. */
static void test_breaker_lets_stores_through_and_closes_on_time(void **state) {
    (void)state;
    struct env e;
    env_open(&e, 0, 20);
    assert_true(run_until(&e, connected, 3000));
    struct cache_key k = {{12}}, k2 = {{13}};
    kill(g_redis, SIGSTOP);
    for (int i = 0; i < 3; i++) assert_null(get(&e, &k));
    kill(g_redis, SIGCONT);
    struct cache_stats st;
    cache_get_stats(e.c, &st);
    assert_int_equal(st.circuit_open, 1);
    struct cache_value *v = sample(7);
    cache_redis_set(e.r, &k2, v); /* while open */
    cache_value_unref(v);
    wait_ms(&e, 50);
    cache_get_stats(e.c, &st);
    assert_int_equal(st.circuit_open, 1); /* 200 ms not over */
    assert_int_equal(st.redis_sets, 1);
    char hex[2 * CACHE_KEY_BYTES + 1];
    cache_key_hex(&k2, hex);
    redisContext *rc = sync_client();
    redisReply *rep = redisCommand(rc, "EXISTS kiln:%s", hex);
    assert_int_equal(rep->integer, 1);
    freeReplyObject(rep);
    redisFree(rc);
    wait_ms(&e, 300); /* no lookup, no store: only the timer */
    cache_get_stats(e.c, &st);
    assert_int_equal(st.circuit_open, 0);
    env_close(&e);
}

static void test_absent_at_start(void **state) {
    (void)state;
    struct cache_params p = {.redis_url = "redis://127.0.0.1:1/0", .redis_timeout_ms = 20};
    cache_t *c = cache_create(&p, NULL, 0);
    assert_non_null(c);
    struct env e = {.c = c, .base = event_base_new()};
    e.r = cache_redis_create(c, e.base);
    assert_non_null(e.r);
    struct cache_key k = {{1}};
    assert_null(get(&e, &k));
    env_close(&e);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_miss_then_hit_and_corruption),
        cmocka_unit_test(test_ttl_expiry),
        cmocka_unit_test(test_killed_and_restarted),
        cmocka_unit_test(test_long_outage_resumes_within_2s),
        cmocka_unit_test(test_paused_times_out_and_breaker_opens),
        cmocka_unit_test(test_breaker_lets_stores_through_and_closes_on_time),
        cmocka_unit_test(test_absent_at_start),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
