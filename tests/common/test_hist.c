/* The log-linear histogram: bucket bounds, quantiles, relative error, merge. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>

#include "common/hist.h"

static void test_buckets_are_contiguous(void **state) {
    (void)state;
    for (unsigned b = 0; b + 1 < HIST_BUCKETS - HIST_SUB; b++) {
        assert_true(hist_bucket_lo(b) <= hist_bucket_hi(b));
        assert_int_equal(hist_bucket_hi(b) + 1, hist_bucket_lo(b + 1));
    }
    uint64_t vals[] = {0, 1, 127, 128, 129, 255, 256, 1000, 123456789, UINT64_MAX / 3};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        unsigned b = hist_bucket(vals[i]);
        assert_true(hist_bucket_lo(b) <= vals[i] && vals[i] <= hist_bucket_hi(b));
        /* Relative width under 1%. */
        assert_true((double)(hist_bucket_hi(b) - hist_bucket_lo(b)) <= (double)vals[i] / HIST_SUB + 1);
    }
}

static void test_quantiles_of_uniform(void **state) {
    (void)state;
    struct hist *h = malloc(sizeof *h);
    hist_reset(h);
    for (uint64_t v = 1; v <= 100000; v++) hist_record(h, v);
    assert_int_equal(h->count, 100000);
    assert_int_equal(h->min, 1);
    assert_int_equal(h->max, 100000);
    double qs[] = {0.5, 0.9, 0.99, 0.999};
    for (int i = 0; i < 4; i++) {
        double want = qs[i] * 100000, got = (double)hist_quantile(h, qs[i]);
        assert_true(got >= want && got <= want * 1.01);
    }
    assert_int_equal(hist_quantile(h, 1.0), 100000);
    assert_true(hist_mean(h) > 50000 && hist_mean(h) < 50001);
    free(h);
}

static void test_tail_is_not_hidden(void **state) {
    (void)state;
    struct hist *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    hist_reset(a);
    hist_reset(b);
    hist_record_n(a, 1000, 989);
    hist_record_n(b, 500000, 11); /* 1.1% of samples stalled */
    hist_merge(a, b);
    assert_int_equal(a->count, 1000);
    assert_true(hist_quantile(a, 0.5) <= 1010);
    assert_true(hist_quantile(a, 0.99) >= 500000);
    assert_int_equal(a->max, 500000);
    struct hist *e = malloc(sizeof *e);
    hist_reset(e);
    assert_int_equal(hist_quantile(e, 0.99), 0);
    free(a);
    free(b);
    free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_are_contiguous),
        cmocka_unit_test(test_quantiles_of_uniform),
        cmocka_unit_test(test_tail_is_not_hidden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
