/* fuzz_http_guard.c - libFuzzer target for the HTTP request framing checker
 * (server/http_guard.c): any byte stream, cut into reads at places chosen by
 * the input's first byte, must get the same verdict and let through the same
 * bytes as the stream fed whole, and never more bytes than it holds; with a
 * head attached (as kiln's connections read requests) the same again, each
 * recorded head the block just accepted and every offset in it inside it.
 * Built by tools/fuzz.sh:
 */
// fuzz-sources: server/http_guard.c common/status.c
// fuzz-corpus: tests/fuzz/corpus/http_guard/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "server/http_guard.h"

static const struct http_guard_limits LIM = {.max_header = 4096, .max_body = 1 << 16};

/* Feeds data in reads of step bytes (0: all at once), leftovers offered again. */
/* A head just recorded for the block buf[0..r). */
static void check_head(const struct http_guard_head *h, const uint8_t *buf, ssize_t r) {
    if ((ssize_t)h->len != r || h->len < 4 || h->target + h->target_len > h->len || buf[h->target] != '/') abort();
    if (h->nfields < 0 || h->nfields > HTTP_GUARD_MAX_FIELDS || h->method < HTTP_GET || h->method > HTTP_PATCH) abort();
    for (int i = 0; i < h->nfields; i++) {
        const struct http_guard_field *f = &h->fields[i];
        if (f->name_len == 0 || f->name + f->name_len >= h->len || buf[f->name + f->name_len] != ':') abort();
        if (f->value < f->name + f->name_len || f->value + f->value_len > h->len) abort();
    }
}

static long run(const uint8_t *data, size_t n, unsigned step, int with_head, int *status, uint64_t *requests) {
    struct http_guard g;
    static struct http_guard_head head;
    http_guard_init(&g, &LIM);
    if (with_head) http_guard_attach_head(&g, &head);
    uint8_t *buf = malloc(n + 1);
    size_t have = 0, at = 0, passed = 0;
    long result = 0;
    while (at < n) {
        size_t k = step && n - at > step ? step : n - at;
        memcpy(buf + have, data + at, k);
        have += k;
        at += k;
        for (;;) {
            uint64_t d = http_guard_data_left(&g);
            if (d) {
                size_t m = d < have ? (size_t)d : have;
                if (!m) break;
                http_guard_skip(&g, m);
                memmove(buf, buf + m, have - m);
                have -= m;
                passed += m;
                continue;
            }
            head.len = 0;
            ssize_t r = http_guard_feed(&g, (const char *)buf, have);
            if (r < 0) {
                result = -1;
                goto out;
            }
            if (r == 0) break;
            if (with_head && head.len) check_head(&head, buf, r);
            if ((size_t)r > have) abort();
            memmove(buf, buf + r, have - (size_t)r);
            have -= (size_t)r;
            passed += (size_t)r;
        }
    }
    result = (long)passed;
out:
    *status = g.status;
    *requests = g.requests;
    free(buf);
    return result;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    unsigned step = data[0] % 17;
    data++;
    size--;
    int s1, s2, s3;
    uint64_t q1, q2, q3;
    long a = run(data, size, 0, 0, &s1, &q1);
    long b = run(data, size, step ? step : 1, 0, &s2, &q2);
    if (a != b || s1 != s2 || q1 != q2) abort();
    /* A head has room for HTTP_GUARD_MAX_FIELDS fields; more is refused only with one attached. */
    long c = run(data, size, step ? step : 1, 1, &s3, &q3);
    int fields_431 = c < 0 && status_http(s3) == 431 && s1 != s3;
    if (!fields_431 && (c != a || s3 != s1 || q3 != q1)) abort();
    if (a > (long)size) abort();
    /* A refusal is a status whose HTTP code is a 4xx or 5xx. */
    if (a < 0 && (s1 >= 0 || status_http(s1) < 400 || status_http(s1) > 599)) abort();
    return 0;
}
