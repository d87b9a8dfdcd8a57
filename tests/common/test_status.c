/* The status table (common/status.h): every row has a name, an HTTP code
 * with its phrase, a gRPC code, a metrics reason and a description; the
 * values run without a gap; the cases callers tell apart map apart; and
 * Triton's mapping holds at both edges. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "common/status.h"

static const int all[] = {
#define ROW_(name, value, http, phrase, grpc, reason, desc) STATUS_##name,
    STATUS_MAP(ROW_)
#undef ROW_
};
#define NALL ((int)(sizeof all / sizeof all[0]))

static int is_grpc_code(enum grpc_code c) {
    switch (c) {
    case GRPC_OK: case GRPC_CANCELLED: case GRPC_INVALID_ARGUMENT: case GRPC_DEADLINE_EXCEEDED: case GRPC_NOT_FOUND:
    case GRPC_RESOURCE_EXHAUSTED: case GRPC_UNIMPLEMENTED: case GRPC_INTERNAL: case GRPC_UNAVAILABLE:
    case GRPC_UNAUTHENTICATED: return 1;
    }
    return 0;
}

static void test_every_row_is_whole(void **state) {
    (void)state;
    assert_int_equal(NALL, STATUS_N_);
    for (int i = 0; i < NALL; i++) {
        int s = all[i];
        assert_int_equal(s, -i); /* no gap: the lookup indexes by -status */
        assert_true(strlen(status_str(s)) > 0);
        assert_string_not_equal(status_str(s), "UNKNOWN");
        assert_true(strlen(status_desc(s)) > 0);
        int h = status_http(s);
        assert_true(h >= 200 && h <= 599);
        assert_true(strlen(status_http_phrase(h)) > 0);
        assert_string_not_equal(status_http_phrase(h), "Error");
        assert_true(is_grpc_code(status_grpc(s)));
        enum status_reason r = status_reason(s);
        assert_true((unsigned)r < STATUS_REASON_N_);
        /* Success and only success has no failure reason, HTTP 200, gRPC OK. */
        assert_int_equal(s == STATUS_OK, r == STATUS_REASON_NONE);
        assert_int_equal(s == STATUS_OK, h == 200);
        assert_int_equal(s == STATUS_OK, status_grpc(s) == GRPC_OK);
        if (s != STATUS_OK) assert_true(strlen(status_reason_str(r)) > 0);
        for (int j = 0; j < i; j++) assert_string_not_equal(status_str(s), status_str(all[j]));
    }
}

/* The sub-codes exist because a caller must tell the cases apart: each
 * pair differs somewhere the client or the metrics can see. */
static void test_sub_codes_are_distinct(void **state) {
    (void)state;
    struct {
        int a, b;
    } pairs[] = {
        {STATUS_TIMEOUT, STATUS_UNAVAILABLE},     {STATUS_DEADLINE, STATUS_TIMEOUT},
        {STATUS_CANCELLED, STATUS_INVALID},       {STATUS_TOO_LARGE, STATUS_INVALID},
        {STATUS_UNSUPPORTED, STATUS_INTERNAL},    {STATUS_UNAUTHENTICATED, STATUS_INVALID},
        {STATUS_NOT_FOUND, STATUS_INVALID},       {STATUS_DISABLED, STATUS_INVALID},
        {STATUS_EXHAUSTED, STATUS_UNAVAILABLE},   {STATUS_IO_TIMEOUT, STATUS_INVALID},
        {STATUS_METHOD, STATUS_INVALID},          {STATUS_MEDIA_TYPE, STATUS_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        int a = pairs[i].a, b = pairs[i].b;
        assert_int_not_equal(a, b);
        assert_true(status_http(a) != status_http(b) || status_grpc(a) != status_grpc(b) ||
                    status_reason(a) != status_reason(b));
    }
    /* Rows that share an HTTP code share its phrase (the first row's). */
    for (int i = 0; i < NALL; i++)
        for (int j = 0; j < NALL; j++)
            if (status_http(all[i]) == status_http(all[j]))
                assert_string_equal(status_http_phrase(status_http(all[i])), status_http_phrase(status_http(all[j])));
}

/* ARCHITECTURE.md "Errors" and Triton's gRPC codes. */
static void test_triton_mapping(void **state) {
    (void)state;
    assert_int_equal(status_http(STATUS_INVALID), 400);
    assert_int_equal(status_http(STATUS_NOT_FOUND), 404);
    assert_int_equal(status_http(STATUS_UNAVAILABLE), 503);
    assert_int_equal(status_http(STATUS_QUEUE_FULL), 503);
    assert_int_equal(status_http(STATUS_TIMEOUT), 503);
    assert_int_equal(status_http(STATUS_DEADLINE), 503);
    assert_int_equal(status_http(STATUS_INTERNAL), 500);
    assert_int_equal(status_http(STATUS_NOMEM), 500);
    assert_int_equal(status_http(STATUS_UNSUPPORTED), 501);
    assert_int_equal(status_http(STATUS_CANCELLED), 400);
    assert_int_equal(status_http(STATUS_UNAUTHENTICATED), 401);
    assert_int_equal(status_grpc(STATUS_INVALID), GRPC_INVALID_ARGUMENT);
    assert_int_equal(status_grpc(STATUS_NOT_FOUND), GRPC_NOT_FOUND);
    assert_int_equal(status_grpc(STATUS_TIMEOUT), GRPC_UNAVAILABLE);
    assert_int_equal(status_grpc(STATUS_DEADLINE), GRPC_DEADLINE_EXCEEDED);
    assert_int_equal(status_grpc(STATUS_CANCELLED), GRPC_CANCELLED);
    assert_int_equal(status_grpc(STATUS_DISABLED), GRPC_UNAVAILABLE);
    assert_int_equal(status_grpc(STATUS_TOO_LARGE), GRPC_RESOURCE_EXHAUSTED);
    assert_int_equal(status_grpc(STATUS_DATA_DEPENDENT), GRPC_UNIMPLEMENTED);
    assert_string_equal(status_reason_str(status_reason(STATUS_TIMEOUT)), "timeout");
    assert_string_equal(status_reason_str(status_reason(STATUS_DEADLINE)), "timeout");
    assert_string_equal(status_reason_str(status_reason(STATUS_QUEUE_FULL)), "unavailable");
    assert_string_equal(status_reason_str(status_reason(STATUS_NOT_FOUND)), "invalid");
    assert_string_equal(status_reason_str(status_reason(STATUS_CANCELLED)), "cancelled");
    assert_string_equal(status_reason_str(status_reason(STATUS_NOMEM)), "internal");
    assert_string_equal(status_http_phrase(503), "Service Unavailable");
    assert_string_equal(status_http_phrase(401), "Unauthorized");
}

/* A value outside the table is an internal failure, never a crash. */
static void test_unknown_values(void **state) {
    (void)state;
    int odd[] = {1, -STATUS_N_, -1000, 1 << 30};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        assert_string_equal(status_str(odd[i]), "UNKNOWN");
        assert_int_equal(status_http(odd[i]), 500);
        assert_int_equal(status_grpc(odd[i]), GRPC_INTERNAL);
        assert_int_equal(status_reason(odd[i]), STATUS_REASON_INTERNAL);
    }
    assert_string_equal(status_http_phrase(299), "Error");
    assert_string_equal(status_reason_str(STATUS_REASON_N_), "internal");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_row_is_whole),
        cmocka_unit_test(test_sub_codes_are_distinct),
        cmocka_unit_test(test_triton_mapping),
        cmocka_unit_test(test_unknown_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
