/* test_http_guard.c - the request framing checker: what it lets through to
 * evhttp, what it refuses (with which status), and that the answer does not
 * depend on how the stream is cut into reads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "server/http_guard.h"

static const struct http_guard_limits LIM = {.max_header = 1024, .max_body = 100};

/* Feeds s in pieces of step bytes as a connection would (leftovers offered
 * again); returns the bytes let through, or -1 with *status the HTTP code
 * of the refusal (the guard's status through common/status.h's table). */
static long run(const char *s, size_t n, size_t step, int *status, uint64_t *requests, char *msg, size_t msg_len) {
    struct http_guard g;
    http_guard_init(&g, &LIM);
    size_t have = 0, passed = 0, at = 0;
    char buf[4096];
    while (at < n || have) {
        size_t k = n - at < step ? n - at : step;
        memcpy(buf + have, s + at, k);
        have += k;
        at += k;
        for (;;) {
            ssize_t r = http_guard_feed(&g, buf, have);
            if (r < 0) {
                *status = status_http(g.status);
                if (msg) snprintf(msg, msg_len, "%s", g.msg);
                return -1;
            }
            if (r == 0) break;
            memmove(buf, buf + r, have - (size_t)r);
            have -= (size_t)r;
            passed += (size_t)r;
        }
        if (k == 0) break; /* all fed, the rest is an incomplete head */
    }
    *status = 0;
    if (requests) *requests = g.requests;
    return (long)passed;
}

/* Every way of cutting s gives the same verdict. */
static int verdict(const char *s, uint64_t *requests, char *msg, size_t msg_len) {
    size_t n = strlen(s);
    int first = -2;
    for (size_t step = 1; step <= n; step++) {
        int status;
        uint64_t rq = 0;
        long r = run(s, n, step, &status, &rq, step == n ? msg : NULL, msg_len);
        int v = r < 0 ? status : 0;
        if (first == -2) first = v;
        assert_int_equal(v, first);
        if (r >= 0) {
            assert_int_equal(r, (long)n);
            if (requests) *requests = rq;
        }
    }
    return first;
}

static void test_accepts_good_requests(void **state) {
    uint64_t rq;
    assert_int_equal(verdict("GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", &rq, NULL, 0), 0);
    assert_int_equal(rq, 1);
    assert_int_equal(verdict("POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
                             "GET / HTTP/1.0\r\n\r\n", &rq, NULL, 0), 0);
    assert_int_equal(rq, 2);
    /* Chunked with a trailer, bare LF line ends, mixed-case names, tabs around values. */
    assert_int_equal(verdict("POST /a HTTP/1.1\r\nhost:\tx \r\ntransfer-encoding: Chunked\r\n\r\n"
                             "5\r\nhello\r\nA\nabcdefghij\n0\r\nX-Sum: 1\r\n\r\n", &rq, NULL, 0), 0);
    assert_int_equal(rq, 1);
    assert_int_equal(verdict("POST /a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n", &rq, NULL, 0), 0);
}

static void test_refuses_smuggling(void **state) {
    char msg[256];
    assert_int_equal(verdict("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 30\r\n\r\nabc", NULL, msg,
                             sizeof msg), 400);
    assert_non_null(strstr(msg, "Content-Length"));
    assert_int_equal(verdict("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", NULL, NULL, 0), 400);
    assert_int_equal(verdict("POST / HTTP/1.1\r\nHost: x\r\nContent-Length : 3\r\n\r\nabc", NULL, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "whitespace before its colon"));
    assert_int_equal(verdict("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", NULL, NULL, 0), 400);
    assert_int_equal(verdict("POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", NULL, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "Host"));
    assert_int_equal(verdict("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", NULL, NULL, 0), 400);
    assert_int_equal(verdict("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\nabc", NULL, NULL, 0), 400);
    assert_int_equal(verdict("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 3\r\n\r\nabc", NULL, NULL, 0), 400);
    assert_int_equal(verdict("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: \r\n\r\n", NULL, NULL, 0), 400);
    assert_int_equal(verdict("HEAD / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", NULL, NULL, 0), 400);
    assert_int_equal(verdict("POST / HTTP/1.1\r\nHost: x\r\n Content-Length: 3\r\n\r\nabc", NULL, NULL, 0), 400);
    assert_int_equal(verdict("POST / HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n", NULL, NULL, 0), 400);
    assert_int_equal(verdict("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", NULL, NULL, 0), 400);
    assert_int_equal(verdict("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", NULL, NULL, 0), 501);
}

static void test_refuses_bad_lines(void **state) {
    assert_int_equal(verdict("BREW / HTTP/1.1\r\nHost: x\r\n\r\n", NULL, NULL, 0), 501);
    assert_int_equal(verdict("GET / HTTP/2.0\r\nHost: x\r\n\r\n", NULL, NULL, 0), 505);
    assert_int_equal(verdict("GET / FTP/1.1\r\nHost: x\r\n\r\n", NULL, NULL, 0), 400);
    assert_int_equal(verdict("GET  / HTTP/1.1\r\nHost: x\r\n\r\n", NULL, NULL, 0), 400);
    assert_int_equal(verdict("GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", NULL, NULL, 0), 400);
    assert_int_equal(verdict("GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n", NULL, NULL, 0), 400);
    assert_int_equal(verdict("\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n", NULL, NULL, 0), 400);
    assert_int_equal(verdict("GET / HTTP/1.1\r\nHost: x\r\nExpect: tea\r\n\r\n", NULL, NULL, 0), 417);
    assert_int_equal(verdict("GET / HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n", NULL, NULL, 0), 400);
    /* A NUL anywhere in the header. */
    static const char nul[] = "GET / HTTP/1.1\r\nHost: x\0y\r\n\r\n";
    int status;
    assert_int_equal(run(nul, sizeof nul - 1, sizeof nul, &status, NULL, NULL, 0), -1);
    assert_int_equal(status, 400);
}

static void test_refuses_bad_chunks(void **state) {
    const char *h = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    const char *bad[] = {"zz\r\n", "5;ext=1\r\nhello\r\n0\r\n\r\n", "-5\r\n", "0x5\r\nhello\r\n", " 5\r\nhello\r\n",
                         "5\r\nhelloXX\r\n0\r\n\r\n", "\r\n5\r\nhello\r\n"};
    char buf[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(buf, sizeof buf, "%s%s", h, bad[i]);
        assert_int_equal(verdict(buf, NULL, NULL, 0), 400);
    }
    /* Sizes past --max-request-size, one chunk or the sum; a huge one does not overflow. */
    snprintf(buf, sizeof buf, "%s%s", h, "65\r\n");
    assert_int_equal(verdict(buf, NULL, NULL, 0), 413);
    snprintf(buf, sizeof buf, "%s%s", h, "32\r\n" "01234567890123456789012345678901234567890123456789\r\n33\r\n");
    assert_int_equal(verdict(buf, NULL, NULL, 0), 413);
    snprintf(buf, sizeof buf, "%s%s", h, "ffffffffffffffff\r\n");
    assert_int_equal(verdict(buf, NULL, NULL, 0), 413);
}

static void test_limits(void **state) {
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "GET / HTTP/1.1\r\nHost: x\r\nX: %01100d\r\n\r\n", 0);
    int status;
    assert_int_equal(run(buf, (size_t)n, (size_t)n, &status, NULL, NULL, 0), -1);
    assert_int_equal(status, 431);
    /* An endless header line with no LF is refused once past the limit, not buffered forever. */
    memset(buf, 'a', sizeof buf);
    memcpy(buf, "GET /", 5);
    assert_int_equal(run(buf, sizeof buf, 100, &status, NULL, NULL, 0), -1);
    assert_int_equal(status, 431);
    assert_int_equal(verdict("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n", NULL, NULL, 0), 413);
}

static void test_phases(void **state) {
    struct http_guard g;
    http_guard_init(&g, &LIM);
    assert_int_equal(http_guard_phase(&g, 0), HTTP_GUARD_IDLE);
    const char *h = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab";
    assert_int_equal(http_guard_feed(&g, h, 10), 0);
    assert_int_equal(http_guard_phase(&g, 1), HTTP_GUARD_HEADER);
    assert_int_equal(http_guard_feed(&g, h, strlen(h)), (ssize_t)strlen(h));
    assert_int_equal(http_guard_phase(&g, 0), HTTP_GUARD_BODY);
    assert_int_equal(http_guard_data_left(&g), 2);
    http_guard_skip(&g, 2);
    assert_int_equal(http_guard_phase(&g, 0), HTTP_GUARD_IDLE);
    assert_int_equal(g.requests, 1);
    /* A good request before a bad one goes through first; the next call refuses. */
    http_guard_init(&g, &LIM);
    const char *two = "GET / HTTP/1.1\r\nHost: x\r\n\r\nBREW / HTTP/1.1\r\n\r\n";
    assert_int_equal(http_guard_feed(&g, two, strlen(two)), 27);
    assert_int_equal(http_guard_feed(&g, two + 27, strlen(two) - 27), -1);
    assert_int_equal(g.status, STATUS_UNSUPPORTED);
}

/* With a head attached the guard says where the request line's parts and
 * each field lie, and stops after the header block. */
static void test_head_record(void **state) {
    struct http_guard g;
    static struct http_guard_head h;
    http_guard_init(&g, &LIM);
    http_guard_attach_head(&g, &h);
    const char *req = "POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Close\r\n"
                      "X-Empty:\r\nContent-Length:  3 \r\nExpect: 100-continue\r\n\r\nabc";
    size_t head_len = strlen(req) - 3;
    assert_int_equal(http_guard_feed(&g, req, strlen(req)), (ssize_t)head_len);
    assert_int_equal(h.len, head_len);
    assert_int_equal(h.method, HTTP_POST);
    assert_int_equal(h.minor, 1);
    assert_int_equal(h.target_len, strlen("/v2/models/m/infer?x=1"));
    assert_memory_equal(req + h.target, "/v2/models/m/infer?x=1", h.target_len);
    assert_true(h.conn_close);
    assert_true(h.conn_keep_alive);
    assert_true(h.expect_continue);
    assert_true(h.has_body);
    assert_int_equal(h.nfields, 5);
    assert_memory_equal(req + h.fields[1].name, "Connection", h.fields[1].name_len);
    assert_int_equal(h.fields[2].value_len, 0);
    assert_memory_equal(req + h.fields[3].value, "3", h.fields[3].value_len);
    assert_int_equal(http_guard_data_left(&g), 3);
    http_guard_skip(&g, 3);
    assert_int_equal(g.requests, 1);
    /* HTTP/1.0 and no body. */
    const char *old = "GET / HTTP/1.0\r\n\r\n";
    assert_int_equal(http_guard_feed(&g, old, strlen(old)), (ssize_t)strlen(old));
    assert_int_equal(h.minor, 0);
    assert_false(h.has_body);
    assert_false(h.conn_close);
    assert_int_equal(g.requests, 2);
    /* More fields than a head holds: 431. */
    char big[4096];
    size_t n = (size_t)snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: a\r\n");
    for (int i = 0; i < HTTP_GUARD_MAX_FIELDS; i++) n += (size_t)snprintf(big + n, sizeof big - n, "A%d: 1\r\n", i);
    n += (size_t)snprintf(big + n, sizeof big - n, "\r\n");
    http_guard_init(&g, &(struct http_guard_limits){.max_header = sizeof big, .max_body = 100});
    http_guard_attach_head(&g, &h);
    assert_int_equal(http_guard_feed(&g, big, n), -1);
    assert_int_equal(status_http(g.status), 431);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepts_good_requests), cmocka_unit_test(test_refuses_smuggling), cmocka_unit_test(test_head_record),
        cmocka_unit_test(test_refuses_bad_lines),     cmocka_unit_test(test_refuses_bad_chunks),
        cmocka_unit_test(test_limits),                cmocka_unit_test(test_phases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
