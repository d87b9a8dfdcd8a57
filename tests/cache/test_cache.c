/* Unit tests of the cache's shared part: keys, LRU, codec, single-flight. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

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
    struct tensor dec[4];
    const char *dn[4];
    assert_int_equal(cache_value_decode(v, dec, dn, 4), 2);
    assert_string_equal(dn[0], "probabilities");
    assert_string_equal(dn[1], "label");
    assert_int_equal(dec[0].dims[1], 3);
    assert_memory_equal(dec[0].data, f, sizeof f);
    assert_memory_equal(dec[1].data, l, sizeof l);
    /* Every single flipped byte and every truncation is rejected. */
    for (size_t i = 0; i < v->len; i++) {
        struct cache_value *w = cache_value_new(v->data, v->len);
        w->data[i] ^= 0x40;
        assert_int_equal(cache_value_decode(w, dec, dn, 4), -1);
        cache_value_unref(w);
        struct cache_value *t = cache_value_new(v->data, i);
        assert_int_equal(cache_value_decode(t, dec, dn, 4), -1);
        cache_value_unref(t);
    }
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
    assert_int_equal(cache_flight_join(c, &k, on_flight, NULL), 1); /* leader */
    for (int i = 0; i < 5; i++) assert_int_equal(cache_flight_join(c, &k, on_flight, NULL), 0);
    struct cache_value *v = blob(10, 3);
    cache_flight_done(c, &k, v);
    assert_int_equal(g_calls, 5);
    assert_ptr_equal(g_seen, v);
    cache_value_unref(v);
    /* After done, the next caller leads again; a failed leader wakes waiters with NULL. */
    assert_int_equal(cache_flight_join(c, &k, on_flight, NULL), 1);
    assert_int_equal(cache_flight_join(c, &k, on_flight, NULL), 0);
    cache_flight_done(c, &k, NULL);
    assert_int_equal(g_calls, 6);
    assert_null(g_seen);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_covers_shape_dtype_and_secret),
        cmocka_unit_test(test_lru_hit_and_byte_bound),
        cmocka_unit_test(test_codec_round_trip_and_corruption),
        cmocka_unit_test(test_single_flight),
        cmocka_unit_test(test_bad_redis_urls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
