/* http_coding.c - gzip and deflate for HTTP bodies. See http_coding.h.
 *
 * zlib counts its buffers in uInt (32 bits): inputs and outputs of any size
 * go through it in pieces of at most ZPIECE bytes. */
#include "server/http_coding.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <zlib.h>

#include "common/status.h"

#ifndef ZPIECE /* a unit test feeds zlib in small pieces */
#define ZPIECE (1u << 30)
#endif

static uInt piece(size_t n) { return n > ZPIECE ? ZPIECE : (uInt)n; }

/* ==== Accept-Encoding ===================================================== */

/* A qvalue (RFC 9110 12.4.2: "0" or "1", then up to 3 decimals) in
 * thousandths, *p moved past it; -1 when malformed. */
static int parse_qvalue(const char **p) {
    const char *s = *p;
    if (*s != '0' && *s != '1') return -1;
    int q = (*s++ - '0') * 1000;
    if (*s == '.') {
        s++;
        for (int scale = 100, k = 0; k < 3 && *s >= '0' && *s <= '9'; k++, scale /= 10) q += (*s++ - '0') * scale;
    }
    *p = s;
    return q > 1000 ? -1 : q;
}

enum http_coding http_coding_accepted(const char *ae) {
    int q_gzip = -1, q_deflate = -1, q_any = -1;
    for (const char *p = ae; p && *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        const char *name = p;
        while (*p && *p != ',' && *p != ';' && *p != ' ' && *p != '\t') p++;
        size_t nlen = (size_t)(p - name);
        int q = 1000;
        while (*p && *p != ',') { /* parameters: only q counts */
            if (*p++ != ';') continue;
            while (*p == ' ' || *p == '\t') p++;
            if ((*p == 'q' || *p == 'Q') && p[1] == '=') {
                p += 2;
                q = parse_qvalue(&p);
            }
        }
        if (nlen == 0 || q < 0) continue; /* a malformed member names nothing */
        int *slot = (nlen == 4 && strncasecmp(name, "gzip", 4) == 0) || (nlen == 6 && strncasecmp(name, "x-gzip", 6) == 0)
                        ? &q_gzip
                    : nlen == 7 && strncasecmp(name, "deflate", 7) == 0 ? &q_deflate
                    : nlen == 1 && *name == '*'                          ? &q_any
                                                                         : NULL;
        if (slot && q > *slot) *slot = q;
    }
    int g = q_gzip >= 0 ? q_gzip : q_any > 0 ? q_any : 0;
    int d = q_deflate >= 0 ? q_deflate : q_any > 0 ? q_any : 0;
    if (g > 0 && g >= d) return HTTP_CODING_GZIP;
    return d > 0 ? HTTP_CODING_DEFLATE : HTTP_CODING_IDENTITY;
}

const char *http_coding_name(enum http_coding c) {
    return c == HTTP_CODING_GZIP ? "gzip" : c == HTTP_CODING_DEFLATE ? "deflate" : NULL;
}

/* ==== inflate ============================================================= */

/* One try at inflating with zlib's windowBits w. Z_STREAM_END with *extra
 * the input bytes after the coded data's end; Z_MEM_ERROR past limit (or
 * out of memory: *out NULL); another zlib code for data that is not valid. */
static int inflate_once(int w, const unsigned char *in, size_t n, size_t limit, unsigned char **out, size_t *used,
                        size_t *extra) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    *out = NULL;
    *used = 0;
    if (inflateInit2(&zs, w) != Z_OK) return Z_MEM_ERROR;
    /* Room for one byte past the limit tells "exactly the limit" from "more". */
    size_t cap = limit > 4096 && n <= (limit - 4096) / 4 ? n * 4 + 4096 : limit + 1, left = n;
    unsigned char *o = malloc(cap + 1);
    int rc = o ? Z_OK : Z_MEM_ERROR;
    while (o) {
        if (zs.avail_in == 0 && left) {
            zs.next_in = (Bytef *)(in + (n - left));
            zs.avail_in = piece(left);
            left -= zs.avail_in;
        }
        if (*used == cap) {
            if (cap > limit) {
                rc = Z_MEM_ERROR;
                break;
            }
            size_t nc = cap <= limit / 2 ? cap * 2 : limit + 1;
            unsigned char *no = realloc(o, nc + 1);
            if (!no) {
                rc = Z_MEM_ERROR;
                break;
            }
            o = no;
            cap = nc;
        }
        uInt room = piece(cap - *used);
        zs.next_out = o + *used;
        zs.avail_out = room;
        rc = inflate(&zs, Z_NO_FLUSH);
        *used += room - zs.avail_out;
        if (rc == Z_STREAM_END) break;
        if (rc != Z_OK && rc != Z_BUF_ERROR) break;
        if (rc == Z_BUF_ERROR && zs.avail_in == 0 && left == 0 && *used < cap) break; /* truncated */
    }
    if (rc == Z_STREAM_END && *used > limit) rc = Z_MEM_ERROR; /* it ended in the byte past the limit */
    *extra = zs.avail_in + left;
    inflateEnd(&zs);
    *out = o;
    return rc;
}

int http_coding_unpack(enum http_coding c, const unsigned char *in, size_t n, size_t limit, unsigned char **out,
                       size_t *out_len, size_t *extra) {
    if (c == HTTP_CODING_IDENTITY) return STATUS_INVALID;
    int window = c == HTTP_CODING_GZIP ? 15 + 16 : 15 + 32; /* deflate: zlib-wrapped, raw tried below */
    *extra = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        unsigned char *o;
        size_t used;
        int rc = inflate_once(attempt ? -15 : window, in, n, limit, &o, &used, extra);
        if (rc == Z_STREAM_END && *extra == 0) {
            *out = o;
            *out_len = used;
            return 0;
        }
        free(o);
        if (rc == Z_STREAM_END) return STATUS_INVALID;
        if (rc == Z_MEM_ERROR && used > limit) return STATUS_TOO_LARGE;
        if (rc == Z_MEM_ERROR && !o) return STATUS_NOMEM;
        if (c != HTTP_CODING_DEFLATE) break; /* only deflate has a raw fallback */
    }
    *extra = 0;
    return STATUS_INVALID;
}

int http_coding_inflate(const char *enc, const unsigned char *in, size_t n, size_t limit, unsigned char **out,
                        size_t *out_len, char *err, size_t err_len) {
    enum http_coding c;
    if (strcasecmp(enc, "gzip") == 0 || strcasecmp(enc, "x-gzip") == 0) c = HTTP_CODING_GZIP;
    else if (strcasecmp(enc, "deflate") == 0) c = HTTP_CODING_DEFLATE;
    else {
        snprintf(err, err_len, "Content-Encoding '%s' is not supported (use gzip or deflate)", enc);
        return STATUS_MEDIA_TYPE;
    }
    if (limit < 4096) limit = 4096;
    size_t extra;
    int rc = http_coding_unpack(c, in, n, limit, out, out_len, &extra);
    if (rc == STATUS_INVALID && extra)
        snprintf(err, err_len,
                 "the request body has %zu bytes after the end of its %s data (one %s stream, nothing after it)",
                 extra, enc, c == HTTP_CODING_GZIP ? "gzip member" : "deflate");
    else if (rc == STATUS_TOO_LARGE)
        snprintf(err, err_len, "the decompressed request body exceeds --max-request-size (%zu bytes)", limit);
    else if (rc == STATUS_NOMEM) snprintf(err, err_len, "out of memory decompressing the request body");
    else if (rc) snprintf(err, err_len, "the request body is not valid %s data (Content-Encoding)", enc);
    return rc;
}

/* ==== deflate ============================================================= */

int http_coding_deflate(enum http_coding c, const unsigned char *in, size_t n, unsigned char **out, size_t *out_len) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (c == HTTP_CODING_IDENTITY || deflateInit2(&zs, 1, Z_DEFLATED, c == HTTP_CODING_GZIP ? 15 + 16 : 15, 8,
                                                  Z_DEFAULT_STRATEGY) != Z_OK)
        return -1;
    /* deflateBound is exact for one call; fed in pieces, the output may
     * need a little more, and grows. */
    size_t cap = (size_t)deflateBound(&zs, (uLong)n) + 64, used = 0, left = n;
    unsigned char *o = malloc(cap);
    int rc = Z_OK;
    while (o) {
        if (zs.avail_in == 0 && left) {
            zs.next_in = (Bytef *)(in + (n - left));
            zs.avail_in = piece(left);
            left -= zs.avail_in;
        }
        if (used == cap) {
            unsigned char *no = realloc(o, cap + cap / 8 + 4096);
            if (!no) break;
            o = no;
            cap += cap / 8 + 4096;
        }
        uInt room = piece(cap - used);
        zs.next_out = o + used;
        zs.avail_out = room;
        rc = deflate(&zs, left ? Z_NO_FLUSH : Z_FINISH);
        used += room - zs.avail_out;
        if (rc == Z_STREAM_END || (rc != Z_OK && rc != Z_BUF_ERROR)) break;
    }
    deflateEnd(&zs);
    if (!o || rc != Z_STREAM_END) {
        free(o);
        return -1;
    }
    *out = o;
    *out_len = used;
    return 0;
}
