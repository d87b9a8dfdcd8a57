/* test_http_coding.c - content codings: Accept-Encoding with q-values, a
 * request body inflated under its limit (bytes after the coded data, data
 * that is not the coding, past the limit), and compression round trips.
 * The module is included with zlib fed in pieces of 1000 bytes, so that
 * the loops that take sizes past 4 GiB run here too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <zlib.h>

#define ZPIECE 1000u
#include "server/http_coding.c"

static void test_accept_encoding(void **state) {
    (void)state;
    static const struct {
        const char *ae;
        enum http_coding want;
    } cases[] = {
        {NULL, HTTP_CODING_IDENTITY},
        {"", HTTP_CODING_IDENTITY},
        {"gzip", HTTP_CODING_GZIP},
        {"x-gzip", HTTP_CODING_GZIP},
        {"gzip;q=0", HTTP_CODING_IDENTITY},
        {"gzip; q=0.0", HTTP_CODING_IDENTITY},
        {"gzip;q=0.001", HTTP_CODING_GZIP},
        {"deflate", HTTP_CODING_DEFLATE},
        {"gzip;q=0.2,deflate;q=0.3", HTTP_CODING_DEFLATE},
        {"deflate, gzip", HTTP_CODING_GZIP}, /* a tie: gzip */
        {"*", HTTP_CODING_GZIP},
        {"*;q=0", HTTP_CODING_IDENTITY},
        {"gzip;q=0, *;q=0.5", HTTP_CODING_DEFLATE},
        {"identity;q=0", HTTP_CODING_IDENTITY}, /* nothing else acceptable: uncompressed anyway */
        {"identity;q=0, gzip;q=0", HTTP_CODING_IDENTITY},
        {"br;q=1, gzip;q=0.5", HTTP_CODING_GZIP},
        {"gzip;q=1.001", HTTP_CODING_IDENTITY}, /* malformed members name nothing */
        {"gzip;q=", HTTP_CODING_IDENTITY},
        {"gzip;level=1;q=0", HTTP_CODING_IDENTITY},
        {"gzipx, deflatey", HTTP_CODING_IDENTITY},
        {" , ,gzip ;q=1 , ", HTTP_CODING_GZIP},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (http_coding_accepted(cases[i].ae) != cases[i].want) fail_msg("Accept-Encoding '%s'", cases[i].ae);
    }
    assert_string_equal(http_coding_name(HTTP_CODING_GZIP), "gzip");
    assert_null(http_coding_name(HTTP_CODING_IDENTITY));
}

/* in compressed with c (zlib's own code, not the module's). */
static size_t pack(int window, const unsigned char *in, size_t n, unsigned char *out, size_t cap) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    assert_int_equal(deflateInit2(&zs, 6, Z_DEFLATED, window, 8, Z_DEFAULT_STRATEGY), Z_OK);
    zs.next_in = (Bytef *)in;
    zs.avail_in = (uInt)n;
    zs.next_out = out;
    zs.avail_out = (uInt)cap;
    assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
    size_t k = cap - zs.avail_out;
    deflateEnd(&zs);
    return k;
}

static void test_inflate(void **state) {
    (void)state;
    static const unsigned char text[] = "{\"inputs\": []} and some more text to compress";
    unsigned char z[512], *out;
    size_t n, len;
    char err[256];
    struct {
        const char *enc;
        int window;
    } kinds[] = {{"gzip", 15 + 16}, {"deflate", 15}, {"deflate", -15}};
    for (int k = 0; k < 3; k++) {
        n = pack(kinds[k].window, text, sizeof text, z, sizeof z);
        assert_int_equal(http_coding_inflate(kinds[k].enc, z, n, 1 << 20, &out, &len, err, sizeof err), 0);
        assert_int_equal(len, sizeof text);
        assert_memory_equal(out, text, len);
        free(out);
        /* Truncated. */
        assert_int_equal(http_coding_inflate(kinds[k].enc, z, n - 3, 1 << 20, &out, &len, err, sizeof err), STATUS_INVALID);
        assert_non_null(strstr(err, "not valid"));
    }
    /* Bytes after the end: refused, and counted. */
    n = pack(15 + 16, text, sizeof text, z, sizeof z);
    memcpy(z + n, "junk", 4);
    assert_int_equal(http_coding_inflate("gzip", z, n + 4, 1 << 20, &out, &len, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "4 bytes after the end of its gzip data"));
    n = pack(15, text, sizeof text, z, sizeof z);
    z[n] = 0;
    assert_int_equal(http_coding_inflate("deflate", z, n + 1, 1 << 20, &out, &len, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "1 bytes after the end of its deflate data"));
    /* Past the limit: 413; exactly the limit passes. */
    unsigned char *zeros = calloc(1, 100000), *big = malloc(100000);
    n = pack(15 + 16, zeros, 100000, big, 100000);
    assert_int_equal(http_coding_inflate("gzip", big, n, 99999, &out, &len, err, sizeof err), STATUS_TOO_LARGE);
    assert_non_null(strstr(err, "--max-request-size"));
    assert_int_equal(http_coding_inflate("gzip", big, n, 100000, &out, &len, err, sizeof err), 0);
    assert_int_equal(len, 100000);
    free(out);
    free(zeros);
    free(big);
    assert_int_equal(http_coding_inflate("br", text, 4, 1 << 20, &out, &len, err, sizeof err), STATUS_MEDIA_TYPE);
    assert_non_null(strstr(err, "'br'"));
}

static void test_deflate_round_trip(void **state) {
    (void)state;
    size_t n = 3u << 20;
    unsigned char *in = malloc(n), *z, *back;
    for (size_t i = 0; i < n; i++) in[i] = (unsigned char)(i * 7 / 5);
    size_t zlen, len;
    char err[256];
    enum http_coding cs[] = {HTTP_CODING_GZIP, HTTP_CODING_DEFLATE};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(http_coding_deflate(cs[k], in, n, &z, &zlen), 0);
        assert_int_equal(http_coding_inflate(http_coding_name(cs[k]), z, zlen, n, &back, &len, err, sizeof err), 0);
        assert_int_equal(len, n);
        assert_memory_equal(back, in, n);
        free(back);
        free(z);
    }
    assert_int_equal(http_coding_deflate(HTTP_CODING_IDENTITY, in, n, &z, &zlen), -1);
    free(in);
}

/* The helper gRPC's messages go through: any limit, however small (no
 * floor as for HTTP bodies), never passed; the status alone, no text. */
static void test_unpack_small_limits(void **state) {
    (void)state;
    unsigned char zeros[1000] = {0}, *z, *out;
    size_t zlen, len, extra;
    assert_int_equal(http_coding_deflate(HTTP_CODING_DEFLATE, zeros, sizeof zeros, &z, &zlen), 0);
    assert_int_equal(http_coding_unpack(HTTP_CODING_DEFLATE, z, zlen, 999, &out, &len, &extra), STATUS_TOO_LARGE);
    assert_int_equal(http_coding_unpack(HTTP_CODING_DEFLATE, z, zlen, 10, &out, &len, &extra), STATUS_TOO_LARGE);
    assert_int_equal(http_coding_unpack(HTTP_CODING_DEFLATE, z, zlen, 1000, &out, &len, &extra), 0);
    assert_int_equal(len, 1000);
    assert_memory_equal(out, zeros, 1000);
    free(out);
    /* gzip data is not deflate's zlib format here, nor the reverse, and
     * identity is no coding to inflate. */
    assert_int_equal(http_coding_unpack(HTTP_CODING_GZIP, z, zlen, 1000, &out, &len, &extra), STATUS_INVALID);
    assert_int_equal(http_coding_unpack(HTTP_CODING_IDENTITY, z, zlen, 1000, &out, &len, &extra), STATUS_INVALID);
    free(z);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accept_encoding),
        cmocka_unit_test(test_unpack_small_limits),
        cmocka_unit_test(test_inflate),
        cmocka_unit_test(test_deflate_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
