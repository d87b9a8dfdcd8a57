/* Unit tests of the cache's shared part: keys, LRU, codec, single-flight. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/hmac.h>
#include <sodium.h>

#include "cache/cache.h"

static cache_t *make(size_t bytes, int shards, const char *secret) {
    struct cache_params p = {.lru_bytes = bytes, .shards = shards, .secret = secret};
    char err[256];
    cache_t *c = cache_create(&p, err, sizeof err);
    assert_non_null(c);
    return c;
}

static void key_of(cache_t *c, const char *model, enum dtype dt, const int64_t *shape, int nd, const void *data,
                   size_t len, struct cache_key *k) {
    struct cache_key_state s;
    cache_key_begin(c, &s, model, 1);
    cache_key_add_input(&s, "x", dt, shape, nd, data, len);
    cache_key_add_output(&s, "y", 1, 0);
    cache_key_end(&s, k);
}

static void test_key_covers_shape_dtype_and_secret(void **state) {
    (void)state;
    cache_t *a = make(1 << 20, 4, "s1"), *b = make(1 << 20, 4, "s1"), *c = make(1 << 20, 4, "s2");
    float data[6] = {1, 2, 3, 4, 5, 6};
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
    struct cache_key k1, k2, k3, k4, k5;
    key_of(a, "m", DT_FP32, s23, 2, data, sizeof data, &k1);
    key_of(b, "m", DT_FP32, s23, 2, data, sizeof data, &k2);
    key_of(a, "m", DT_FP32, s32, 2, data, sizeof data, &k3);
    key_of(a, "m", DT_INT32, s23, 2, data, sizeof data, &k4);
    key_of(c, "m", DT_FP32, s23, 2, data, sizeof data, &k5);
    assert_memory_equal(k1.b, k2.b, CACHE_KEY_BYTES); /* same secret: replicas agree */
    assert_memory_not_equal(k1.b, k3.b, CACHE_KEY_BYTES);
    assert_memory_not_equal(k1.b, k4.b, CACHE_KEY_BYTES);
    assert_memory_not_equal(k1.b, k5.b, CACHE_KEY_BYTES);
    /* Framing: moving bytes between the model name and the data changes the key. */
    struct cache_key k6, k7;
    struct cache_key_state s;
    cache_key_begin(a, &s, "ab", 1);
    cache_key_add_input(&s, "c", DT_UINT8, s23, 0, "", 0);
    cache_key_end(&s, &k6);
    cache_key_begin(a, &s, "a", 1);
    cache_key_add_input(&s, "bc", DT_UINT8, s23, 0, "", 0);
    cache_key_end(&s, &k7);
    assert_memory_not_equal(k6.b, k7.b, CACHE_KEY_BYTES);
    cache_free(a);
    cache_free(b);
    cache_free(c);
}

static struct cache_value *blob(size_t n, uint8_t fill) {
    uint8_t *b = malloc(n);
    memset(b, fill, n);
    struct cache_value *v = cache_value_new(b, n);
    free(b);
    return v;
}

static void test_lru_hit_and_byte_bound(void **state) {
    (void)state;
    /* One shard so eviction order is exact. */
    cache_t *c = make(64 * 1024, 1, NULL);
    struct cache_key keys[40];
    for (int i = 0; i < 40; i++) {
        memset(&keys[i], 0, sizeof keys[i]);
        keys[i].b[0] = (uint8_t)i;
        keys[i].b[9] = (uint8_t)(i * 7);
        struct cache_value *v = blob(4000, (uint8_t)i);
        cache_lru_put(c, &keys[i], v);
        cache_value_unref(v);
    }
    struct cache_stats st;
    cache_get_stats(c, &st);
    assert_true(st.lru_bytes <= 64 * 1024);
    assert_true(st.lru_evictions > 0);
    /* The newest entry is there with its bytes, the oldest is gone. */
    struct cache_value *v = cache_lru_get(c, &keys[39]);
    assert_non_null(v);
    assert_int_equal(v->len, 4000);
    assert_int_equal(v->data[123], 39);
    cache_value_unref(v);
    assert_null(cache_lru_get(c, &keys[0]));
    /* Touching an entry protects it from the next eviction. */
    uint64_t n = st.lru_entries;
    int oldest = 40 - (int)n;
    v = cache_lru_get(c, &keys[oldest]);
    assert_non_null(v);
    cache_value_unref(v);
    struct cache_key extra = {{0xee}};
    v = blob(4000, 1);
    cache_lru_put(c, &extra, v);
    cache_value_unref(v);
    v = cache_lru_get(c, &keys[oldest]);
    assert_non_null(v);
    cache_value_unref(v);
    assert_null(cache_lru_get(c, &keys[oldest + 1]));
    /* A value bigger than the budget is not stored. */
    struct cache_key big = {{0xbb}};
    v = blob(100 * 1024, 2);
    cache_lru_put(c, &big, v);
    cache_value_unref(v);
    assert_null(cache_lru_get(c, &big));
    cache_free(c);
}

static void test_codec_round_trip_and_corruption(void **state) {
    (void)state;
    float f[6] = {1, -2, 3.5f, 4, 5, 6};
    int64_t l[2] = {7, 9};
    struct tensor outs[2] = {
        {.dtype = DT_FP32, .ndim = 2, .dims = {2, 3}, .data = f},
        {.dtype = DT_INT64, .ndim = 1, .dims = {2}, .data = l},
    };
    const char *names[2] = {"probabilities", "label"};
    struct cache_value *v = cache_value_encode(outs, names, 2);
    assert_non_null(v);
    struct cache_view view;
    assert_int_equal(cache_value_view(v, &view), 0);
    assert_int_equal(view.n, 2);
    assert_string_equal(view.out[0].name, "probabilities");
    assert_string_equal(view.out[1].name, "label");
    assert_int_equal(view.out[0].dtype, DT_FP32);
    assert_int_equal(view.out[0].ndim, 2);
    assert_int_equal(view.out[0].dims[1], 3);
    assert_int_equal(view.out[0].len, sizeof f);
    assert_memory_equal(view.out[0].data, f, sizeof f);
    assert_int_equal(view.out[1].len, sizeof l);
    assert_memory_equal(view.out[1].data, l, sizeof l);
    /* Every truncation is rejected by the codec alone. */
    for (size_t i = 0; i < v->len; i++) {
        struct cache_value *t = cache_value_new(v->data, i);
        assert_int_equal(cache_value_view(t, &view), -1);
        cache_value_unref(t);
    }
    cache_value_unref(v);
}

/* v's Redis form under c and k: its bytes and their MAC (malloc'd). */
static uint8_t *seal(cache_t *c, const struct cache_key *k, const struct cache_value *v, size_t *len) {
    *len = v->len + CACHE_MAC_BYTES;
    uint8_t *wire = malloc(*len);
    assert_non_null(wire);
    memcpy(wire, v->data, v->len);
    cache_value_mac(c, k, v->data, v->len, wire + v->len);
    return wire;
}

/* The Redis form: value + MAC under the secret, over the key and the value.
 * Every flipped byte, every truncation, another key and another secret are
 * refused before decoding. */
static void test_mac_seals_value_to_key_and_secret(void **state) {
    (void)state;
    char err[256];
    cache_t *c = cache_create(&(struct cache_params){.secret = "s1"}, err, sizeof err);
    cache_t *c2 = cache_create(&(struct cache_params){.secret = "s2"}, err, sizeof err);
    float f[3] = {1, 2, 3};
    struct tensor t = {.dtype = DT_FP32, .ndim = 1, .dims = {3}, .data = f};
    const char *n = "y";
    struct cache_value *v = cache_value_encode(&t, &n, 1);
    struct cache_key k = {{1, 2, 3}}, k2 = {{1, 2, 4}};
    size_t len;
    uint8_t *wire = seal(c, &k, v, &len);
    struct cache_value *o = cache_value_open(c, &k, wire, len);
    assert_non_null(o);
    assert_int_equal(o->len, v->len);
    assert_memory_equal(o->data, v->data, v->len);
    cache_value_unref(o);
    assert_null(cache_value_open(c, &k2, wire, len));
    assert_null(cache_value_open(c2, &k, wire, len));
    for (size_t i = 0; i < len; i++) {
        wire[i] ^= 0x40;
        assert_null(cache_value_open(c, &k, wire, len));
        wire[i] ^= 0x40;
        assert_null(cache_value_open(c, &k, wire, i));
    }
    free(wire);
    cache_value_unref(v);
    cache_free(c);
    cache_free(c2);
}

/* Well-formed framing with a string length past the tensor's bytes, a count
 * that does not match the shape, or dims whose product overflows: refused. */
static void test_decode_checks_strings_and_counts(void **state) {
    (void)state;
    struct tensor_str sv[2] = {{"ab", 2}, {"cde", 3}};
    struct tensor t = {.dtype = DT_STRING, .ndim = 1, .dims = {2}, .data = sv};
    const char *n = "s";
    struct cache_value *v = cache_value_encode(&t, &n, 1);
    struct cache_view view;
    assert_int_equal(cache_value_view(v, &view), 0);
    assert_int_equal(view.n, 1);
    assert_int_equal(view.out[0].dtype, DT_STRING);
    /* The view's bytes are exactly the two strings, length-prefixed. */
    assert_int_equal(view.out[0].len, 4 + 2 + 4 + 3);
    assert_memory_equal((const char *)view.out[0].data + 4, "ab", 2);
    /* The first string's length prefix sits 13 bytes before the end. */
    size_t first = v->len - (4 + 2 + 4 + 3);
    uint32_t big = 1000;
    struct cache_value *w = cache_value_new(v->data, v->len);
    memcpy(w->data + first, &big, 4);
    assert_int_equal(cache_value_view(w, &view), -1);
    cache_value_unref(w);
    /* Three strings claimed by the shape, two present. */
    w = cache_value_new(v->data, v->len);
    uint64_t three = 3;
    size_t dim0 = 12 + 4 + 2 + 8;
    memcpy(w->data + dim0, &three, 8);
    assert_int_equal(cache_value_view(w, &view), -1);
    cache_value_unref(w);
    cache_value_unref(v);
    /* FP32 [65536 x 65536 x 65536 x 65536] claims 2^64 elements: no overflow to 0. */
    float f = 1;
    struct tensor u = {.dtype = DT_FP32, .ndim = 4, .dims = {1, 1, 1, 1}, .data = &f};
    v = cache_value_encode(&u, &n, 1);
    w = cache_value_new(v->data, v->len);
    uint64_t d = 65536;
    for (int i = 0; i < 4; i++) memcpy(w->data + 12 + 4 + 2 + 8 + 8 * i, &d, 8);
    assert_int_equal(cache_value_view(w, &view), -1);
    cache_value_unref(w);
    cache_value_unref(v);
}

/* A value holds at most CACHE_MAX_OUTPUTS outputs: one claiming more is
 * refused whole, however well formed, and one sealed with a good MAC is
 * still checked by the view (the MAC says who wrote it, not that it is
 * well formed). */
static void test_view_refuses_too_many_outputs(void **state) {
    (void)state;
    enum { N = CACHE_MAX_OUTPUTS + 1 };
    float f = 1;
    struct tensor outs[N];
    const char *names[N];
    for (int i = 0; i < N; i++) {
        outs[i] = (struct tensor){.dtype = DT_FP32, .ndim = 1, .dims = {1}, .data = &f};
        names[i] = "y";
    }
    struct cache_value *v = cache_value_encode(outs, names, N);
    assert_non_null(v);
    struct cache_view view;
    assert_int_equal(cache_value_view(v, &view), -1);
    char err[256];
    cache_t *c = cache_create(&(struct cache_params){.secret = "s1"}, err, sizeof err);
    struct cache_key k = {{5}};
    size_t len;
    uint8_t *wire = seal(c, &k, v, &len);
    struct cache_value *o = cache_value_open(c, &k, wire, len);
    assert_non_null(o);
    assert_int_equal(cache_value_view(o, &view), -1);
    cache_value_unref(o);
    free(wire);
    cache_free(c);
    cache_value_unref(v);
    v = cache_value_encode(outs, names, CACHE_MAX_OUTPUTS);
    assert_int_equal(cache_value_view(v, &view), 0);
    assert_int_equal(view.n, CACHE_MAX_OUTPUTS);
    cache_value_unref(v);
}

static int g_calls;
static struct cache_value *g_seen;
static void on_flight(void *arg, struct cache_value *v) {
    (void)arg;
    g_calls++;
    g_seen = v;
    cache_value_unref(v);
}

static void test_single_flight(void **state) {
    (void)state;
    cache_t *c = make(1 << 20, 4, NULL);
    struct cache_key k = {{1, 2, 3}};
    struct cache_flight_node n[6];
    assert_int_equal(cache_flight_join(c, &k, &n[0], on_flight, NULL), 1); /* leader */
    for (int i = 0; i < 5; i++) assert_int_equal(cache_flight_join(c, &k, &n[1 + i], on_flight, NULL), 0);
    struct cache_value *v = blob(10, 3);
    cache_flight_done(c, &k, v);
    assert_int_equal(g_calls, 5);
    assert_ptr_equal(g_seen, v);
    cache_value_unref(v);
    /* After done, the next caller leads again; a failed leader wakes waiters with NULL. */
    assert_int_equal(cache_flight_join(c, &k, &n[0], on_flight, NULL), 1);
    assert_int_equal(cache_flight_join(c, &k, &n[1], on_flight, NULL), 0);
    cache_flight_done(c, &k, NULL);
    assert_int_equal(g_calls, 6);
    assert_null(g_seen);
    /* done on a key nobody leads is harmless. */
    v = blob(10, 3);
    cache_flight_done(c, &k, v);
    assert_int_equal(g_calls, 6);
    cache_value_unref(v);
    struct cache_stats st;
    cache_get_stats(c, &st);
    assert_int_equal(st.flight_joined, 6);
    cache_free(c);
}

static void test_bad_redis_urls(void **state) {
    (void)state;
    const char *bad[] = {"http://x:1", "redis://:notaport", "redis://h:0", "redis://h:1/x", "redis://"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct cache_params p = {.lru_bytes = 1024, .redis_url = bad[i]};
        char err[256] = "";
        assert_null(cache_create(&p, err, sizeof err));
        assert_non_null(strstr(err, "--redis-url"));
    }
    struct cache_params p = {.lru_bytes = 1024, .redis_url = "redis://user:pw@10.0.0.1:7000/3"};
    cache_t *c = cache_create(&p, NULL, 0);
    assert_non_null(c);
    assert_true(cache_has_redis(c));
    cache_free(c);
    cache_free(NULL);
}

/* The key is plain HMAC-SHA-256 (keyed with the stretched secret) over the
 * framed fields: recomputed here with OpenSSL's one-shot HMAC. */
static size_t frame(uint8_t *out, size_t at, const void *p, size_t n) {
    uint64_t len = n;
    memcpy(out + at, &len, 8);
    if (n) memcpy(out + at + 8, p, n);
    return at + 8 + n;
}

static void test_key_is_standard_hmac_sha256(void **state) {
    (void)state;
    cache_t *c = make(1 << 20, 4, "replica-secret");
    uint8_t x[300];
    for (size_t i = 0; i < sizeof x; i++) x[i] = (uint8_t)(i * 31 + 7);
    int64_t shape[2] = {3, 100}, version = 7;
    int32_t dt = DT_UINT8, params[2] = {1, 3}, params_all[2] = {0, 0};
    struct cache_key_state s;
    struct cache_key k;
    cache_key_begin(c, &s, "model-a", version);
    cache_key_add_input(&s, "pixels", DT_UINT8, shape, 2, x, sizeof x);
    cache_key_add_output(&s, "scores", 1, 3);
    cache_key_add_output(&s, "*", 0, 0);
    cache_key_end(&s, &k);

    uint8_t msg[1024];
    size_t n = 0;
    n = frame(msg, n, "kiln-v1", 7);
    n = frame(msg, n, "model-a", 7);
    n = frame(msg, n, &version, 8);
    n = frame(msg, n, "in", 2);
    n = frame(msg, n, "pixels", 6);
    n = frame(msg, n, &dt, 4);
    n = frame(msg, n, shape, sizeof shape);
    n = frame(msg, n, x, sizeof x);
    n = frame(msg, n, "out", 3);
    n = frame(msg, n, "scores", 6);
    n = frame(msg, n, params, sizeof params);
    n = frame(msg, n, "out", 3);
    n = frame(msg, n, "*", 1);
    n = frame(msg, n, params_all, sizeof params_all);
    uint8_t secret[32], want[32];
    const char *cfg = "replica-secret";
    crypto_generichash(secret, sizeof secret, (const unsigned char *)cfg, strlen(cfg),
                       (const unsigned char *)"kiln-cache-secret-v1", 20);
    unsigned int wl = 0;
    assert_non_null(HMAC(EVP_sha256(), secret, sizeof secret, msg, n, want, &wl));
    assert_int_equal(wl, CACHE_KEY_BYTES);
    assert_memory_equal(k.b, want, CACHE_KEY_BYTES);
    cache_free(c);
}

/* Random puts and gets on one shard whose keys crowd a few home buckets
 * (some at the table's last bucket, so probe runs wrap), checked against a
 * plain LRU list: every hit returns its own bytes, and exactly the most
 * recently used entries are present. */
static void rkey(struct cache_key *k, int id) {
    static const uint64_t homes[] = {0, 1, 5, 0xffff, 0xfffe};
    memset(k, 0, sizeof *k);
    uint64_t h = homes[id % 5] | ((uint64_t)id << 20);
    memcpy(k->b, &h, 8);
    memcpy(k->b + 8, &id, sizeof id);
}

static void test_lru_matches_reference(void **state) {
    (void)state;
    cache_t *c = make(256 * 1024, 1, NULL);
    struct cache_key k;
    /* Capacity in entries for 1000-byte values: fill until the first eviction. */
    int cap = 0;
    for (;; cap++) {
        struct cache_value *v = blob(1000, (uint8_t)cap);
        rkey(&k, 100000 + cap);
        cache_lru_put(c, &k, v);
        cache_value_unref(v);
        struct cache_stats st;
        cache_get_stats(c, &st);
        if (st.lru_evictions) break;
    }
    assert_true(cap > 100);
    cache_free(c);
    c = make(256 * 1024, 1, NULL);
    enum { IDS = 600 };
    int order[IDS]; /* reference recency list, most recent first */
    int n = 0;
    uint32_t rnd = 12345;
    for (int op = 0; op < 20000; op++) {
        rnd = rnd * 1103515245u + 12345u;
        int id = (int)((rnd >> 8) % IDS);
        rkey(&k, id);
        int pos = -1;
        for (int i = 0; i < n; i++)
            if (order[i] == id) pos = i;
        if ((rnd >> 4) & 1) {
            struct cache_value *v = blob(1000, (uint8_t)id);
            cache_lru_put(c, &k, v);
            cache_value_unref(v);
            if (pos < 0) pos = n < cap ? n++ : cap - 1; /* new, or the least recent falls out */
            memmove(order + 1, order, (size_t)pos * sizeof *order);
            order[0] = id;
        } else {
            struct cache_value *v = cache_lru_get(c, &k);
            if (pos < 0) {
                assert_null(v);
            } else {
                assert_non_null(v);
                assert_int_equal(v->len, 1000);
                assert_int_equal(v->data[999], (uint8_t)id);
                cache_value_unref(v);
                memmove(order + 1, order, (size_t)pos * sizeof *order);
                order[0] = id;
            }
        }
    }
    struct cache_stats st;
    cache_get_stats(c, &st);
    assert_int_equal(st.lru_entries, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        rkey(&k, order[i]);
        struct cache_value *v = cache_lru_get(c, &k);
        assert_non_null(v);
        cache_value_unref(v);
    }
    cache_free(c);
}

/* One value stored under two keys (the second entry cannot use the slot
 * embedded in the value), outliving both entries. */
static void test_value_under_two_keys(void **state) {
    (void)state;
    cache_t *c = make(8 * 1024, 1, NULL);
    struct cache_key a = {{1}}, b = {{2}}, other = {{3}};
    struct cache_value *v = blob(3000, 9);
    cache_lru_put(c, &a, v);
    cache_lru_put(c, &b, v);
    struct cache_value *ga = cache_lru_get(c, &a), *gb = cache_lru_get(c, &b);
    assert_ptr_equal(ga, v);
    assert_ptr_equal(gb, v);
    cache_value_unref(ga);
    cache_value_unref(gb);
    /* A third value pushes both out; v is still ours, then stored again. */
    struct cache_value *w = blob(6000, 4);
    cache_lru_put(c, &other, w);
    cache_value_unref(w);
    assert_null(cache_lru_get(c, &a));
    assert_null(cache_lru_get(c, &b));
    assert_int_equal(v->data[2999], 9);
    cache_lru_put(c, &a, v);
    cache_value_unref(v);
    ga = cache_lru_get(c, &a);
    assert_non_null(ga);
    assert_int_equal(ga->data[0], 9);
    cache_value_unref(ga);
    cache_free(c);
}


int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_covers_shape_dtype_and_secret),
        cmocka_unit_test(test_lru_hit_and_byte_bound),
        cmocka_unit_test(test_codec_round_trip_and_corruption),
        cmocka_unit_test(test_mac_seals_value_to_key_and_secret),
        cmocka_unit_test(test_view_refuses_too_many_outputs),
        cmocka_unit_test(test_decode_checks_strings_and_counts),
        cmocka_unit_test(test_single_flight),
        cmocka_unit_test(test_bad_redis_urls),
        cmocka_unit_test(test_key_is_standard_hmac_sha256),
        cmocka_unit_test(test_lru_matches_reference),
        cmocka_unit_test(test_value_under_two_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
