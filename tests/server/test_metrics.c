/* test_metrics.c - per model-version records and their Prometheus text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/metrics.h"

static unsigned long long value_of(const char *text, const char *series) {
    const char *p = strstr(text, series);
    if (!p) fail_msg("no series %s", series);
    return strtoull(p + strlen(series), NULL, 10);
}

static char *extra(void *arg, char *buf, size_t *len, size_t *cap) {
    return metrics_appendf(buf, len, cap, "kiln_test_extra %d\n", *(int *)arg);
}

static void test_records_and_render(void **state) {
    struct metrics_model *m = metrics_model_get("m", "1");
    assert_non_null(m);
    assert_ptr_equal(metrics_model_get("m", "1"), m); /* one record per (model, version) */
    assert_ptr_not_equal(metrics_model_get("m", "2"), m);
    metrics_record_success(m, 300000, 1000, 10, 200000, 20, 4, 8);    /* 0.3 ms */
    metrics_record_success(m, 30000000, 1000, 10, 200000, 20, 1, 8);  /* 30 ms */
    metrics_record_failure(m, STATUS_INVALID, 5000);
    metrics_record_failure(m, STATUS_TIMEOUT, 5000);
    metrics_record_load(m, 1500000000ull);
    int x = 7;
    char *t = metrics_render(extra, &x);
    assert_int_equal(value_of(t, "kiln_inference_request_success{model=\"m\",version=\"1\"} "), 2);
    assert_int_equal(value_of(t, "kiln_inference_count{model=\"m\",version=\"1\"} "), 5);
    assert_int_equal(value_of(t, "kiln_inference_request_failure{model=\"m\",version=\"1\",reason=\"invalid\"} "), 1);
    assert_int_equal(value_of(t, "kiln_inference_request_failure{model=\"m\",version=\"1\",reason=\"timeout\"} "), 1);
    /* Cumulative buckets: 0.3 ms and two 5 us failures are <= 0.5 ms; the 30 ms one is not. */
    assert_int_equal(value_of(t, "kiln_request_duration_seconds_bucket{model=\"m\",version=\"1\",le=\"0.0005\"} "), 3);
    assert_int_equal(value_of(t, "kiln_request_duration_seconds_bucket{model=\"m\",version=\"1\",le=\"+Inf\"} "), 4);
    assert_int_equal(value_of(t, "kiln_request_duration_seconds_count{model=\"m\",version=\"1\"} "), 4);
    assert_non_null(strstr(t, "kiln_model_load_duration_seconds{model=\"m\",version=\"1\"} 1.500000"));
    assert_non_null(strstr(t, "# TYPE kiln_request_duration_seconds histogram"));
    assert_non_null(strstr(t, "kiln_test_extra 7\n"));
    assert_int_equal(atomic_load(&m->batch_requests[8]), 2);
    assert_int_equal(atomic_load(&m->d_infer.ns), 400000);
    free(t);
}

/* A cache hit is a success with its rows, and a request in the duration
 * histogram, but no queue, compute or batch sample: those describe runs. */
static void test_cached_counts_as_success_not_execution(void **state) {
    struct metrics_model *m = metrics_model_get("c", "1");
    assert_non_null(m);
    metrics_record_success(m, 300000, 1000, 10, 200000, 20, 2, 4);
    metrics_record_cached(m, 20000, 3);
    assert_int_equal(atomic_load(&m->success), 2);
    assert_int_equal(atomic_load(&m->inference_count), 5);
    assert_int_equal(atomic_load(&m->d_success.count), 2);
    assert_int_equal(atomic_load(&m->d_success.ns), 320000);
    assert_int_equal(atomic_load(&m->h_request.count), 2);
    assert_int_equal(atomic_load(&m->d_queue.count), 1);
    assert_int_equal(atomic_load(&m->d_infer.count), 1);
    assert_int_equal(atomic_load(&m->h_compute.count), 1);
    assert_int_equal(atomic_load(&m->batch_requests[4]), 1);
    assert_int_equal(atomic_load(&m->batch_requests[1]), 0);
}

/* A model folder may be named q"x: label values are escaped as the text
 * format wants (backslash, double quote, newline), so /metrics still parses. */
static void test_label_values_escaped(void **state) {
    char *e = metrics_label_escape("a\\b\"c\nd");
    assert_string_equal(e, "a\\\\b\\\"c\\nd");
    free(e);
    struct metrics_model *m = metrics_model_get("q\"x", "1");
    assert_non_null(m);
    metrics_record_cached(m, 1000, 1);
    char *t = metrics_render(NULL, NULL);
    assert_non_null(strstr(t, "kiln_inference_request_success{model=\"q\\\"x\",version=\"1\"} 1\n"));
    assert_null(strstr(t, "model=\"q\"x\""));
    free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_records_and_render),
                                       cmocka_unit_test(test_cached_counts_as_success_not_execution),
                                       cmocka_unit_test(test_label_values_escaped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
