/* fuzz_http_guard.c - libFuzzer target for the HTTP request framing checker
 * (server/http_guard.c): any byte stream, cut into reads at places chosen by
 * the input's first byte, must get the same verdict and let through the same
 * bytes as the stream fed whole, and never more bytes than it holds.
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
static long run(const uint8_t *data, size_t n, unsigned step, int *status, uint64_t *requests) {
    struct http_guard g;
    http_guard_init(&g, &LIM);
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
            ssize_t r = http_guard_feed(&g, (const char *)buf, have);
            if (r < 0) {
                result = -1;
                goto out;
            }
            if (r == 0) break;
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
    int s1, s2;
    uint64_t q1, q2;
    long a = run(data, size, 0, &s1, &q1);
    long b = run(data, size, step ? step : 1, &s2, &q2);
    if (a != b || s1 != s2 || q1 != q2) abort();
    if (a > (long)size) abort();
    /* A refusal is a status whose HTTP code is a 4xx or 5xx. */
    if (a < 0 && (s1 >= 0 || status_http(s1) < 400 || status_http(s1) > 599)) abort();
    return 0;
}
