#include "server/http_guard.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/status.h"

enum { HG_HEAD, HG_BODY, HG_CHUNK_SIZE, HG_CHUNK_DATA, HG_CHUNK_END, HG_TRAILER, HG_FAILED };

/* The longest chunk-size line accepted: 16 hex digits and a CRLF. */
#define HG_MAX_CHUNK_LINE 18

void http_guard_init(struct http_guard *g, const struct http_guard_limits *lim) {
    memset(g, 0, sizeof *g);
    g->lim = *lim;
    g->state = HG_HEAD;
}

static ssize_t fail(struct http_guard *g, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->msg, sizeof g->msg, fmt, ap);
    va_end(ap);
    g->status = status;
    g->state = HG_FAILED;
    g->left = 0;
    return -1;
}

/* RFC 9110 tchar: the characters of a method or a header field name. */
static int is_tchar(unsigned char c) {
    if (c >= '0' && c <= '9') return 1;
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 1;
    if (c == '-') return 1; /* the one most names hold ("Content-Type"), without strchr's call */
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* A field value's bytes: visible ASCII, obs-text, space and tab. */
static int is_value_char(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

/* A line of p ending before its LF at p[end]; a CR right before the LF is not part of it. */
static size_t line_len(const char *p, size_t end) { return end > 0 && p[end - 1] == '\r' ? end - 1 : end; }

static int equals_ci(const char *p, size_t n, const char *lit) { return strlen(lit) == n && strncasecmp(p, lit, n) == 0; }

/* Printable excerpt of untrusted bytes for a message. */
static const char *excerpt(const char *p, size_t n, char *buf, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 5 < cap; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') buf[k++] = (char)c;
        else k += (size_t)snprintf(buf + k, cap - k, "\\x%02x", c);
    }
    if (k >= cap) k = cap - 1;
    buf[k] = 0;
    return buf;
}

static const char *const methods[] = {"GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE", "CONNECT", "PATCH"};
static const unsigned char method_lens[] = {3, 4, 4, 3, 6, 7, 5, 7, 5}; /* strlen of each, not taken per request */
_Static_assert(sizeof method_lens == sizeof methods / sizeof methods[0], "one length per method");

/* Checks one field line "name: value" (a header or a trailer). */
static ssize_t check_field(struct http_guard *g, const char *p, size_t n, const char *what, const char **name,
                           size_t *name_len, const char **value, size_t *value_len) {
    char ex[80];
    if (p[0] == ' ' || p[0] == '\t')
        return fail(g, STATUS_INVALID, "%s line '%s' starts with whitespace (obsolete line folding is not accepted)", what,
                    excerpt(p, n < 40 ? n : 40, ex, sizeof ex));
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)p[i])) i++;
    if (i == n || p[i] != ':') {
        if (i < n && (p[i] == ' ' || p[i] == '\t'))
            return fail(g, STATUS_INVALID, "%s '%s' has whitespace before its colon", what, excerpt(p, i < 60 ? i : 60, ex, sizeof ex));
        if (i == n) return fail(g, STATUS_INVALID, "%s line '%s' has no colon", what, excerpt(p, n < 60 ? n : 60, ex, sizeof ex));
        return fail(g, STATUS_INVALID, "%s name '%s' holds a character that is not allowed", what,
                    excerpt(p, i + 1 < 60 ? i + 1 : 60, ex, sizeof ex));
    }
    if (i == 0) return fail(g, STATUS_INVALID, "%s line with an empty name", what);
    *name = p;
    *name_len = i;
    size_t v = i + 1, e = n;
    for (size_t k = v; k < n; k++)
        if (!is_value_char((unsigned char)p[k]))
            return fail(g, STATUS_INVALID, "%s '%s' holds a control character (byte 0x%02x)", what, excerpt(p, i, ex, sizeof ex),
                        (unsigned char)p[k]);
    while (v < e && (p[v] == ' ' || p[v] == '\t')) v++;
    while (e > v && (p[e - 1] == ' ' || p[e - 1] == '\t')) e--;
    *value = p + v;
    *value_len = e - v;
    return 0;
}

/* The tokens of a Connection header's value that decide whether the
 * connection stays open. */
static void connection_tokens(struct http_guard_head *h, const char *v, size_t n) {
    for (size_t i = 0; i < n;) {
        while (i < n && (v[i] == ',' || v[i] == ' ' || v[i] == '\t')) i++;
        size_t s = i;
        while (i < n && v[i] != ',' && v[i] != ' ' && v[i] != '\t') i++;
        if (equals_ci(v + s, i - s, "close")) h->conn_close = 1;
        else if (equals_ci(v + s, i - s, "keep-alive")) h->conn_keep_alive = 1;
    }
}

/* Parses a complete header block p[0..n) (ending with its blank line) and
 * sets up the body's framing. */
static ssize_t parse_head(struct http_guard *g, const char *p, size_t n) {
    char ex[80];
    const char *nl = memchr(p, '\n', n);
    size_t end = (size_t)(nl - p), len = line_len(p, end);
    /* Request line: method SP request-target SP HTTP-version, nothing else. */
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)p[i] < 0x21 && p[i] != ' ')
            return fail(g, STATUS_INVALID, "the request line holds a control character (byte 0x%02x)", (unsigned char)p[i]);
    const char *sp1 = memchr(p, ' ', len);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', len - (size_t)(sp1 + 1 - p)) : NULL;
    if (!sp1 || !sp2 || memchr(sp2 + 1, ' ', len - (size_t)(sp2 + 1 - p)) || sp1 == p || sp2 == sp1 + 1)
        return fail(g, STATUS_INVALID, "the request line '%s' is not 'METHOD /path HTTP/1.1'", excerpt(p, len < 60 ? len : 60, ex, sizeof ex));
    size_t mlen = (size_t)(sp1 - p);
    int method = -1;
    for (int i = 0; i < (int)(sizeof methods / sizeof methods[0]); i++)
        if (method_lens[i] == mlen && memcmp(methods[i], p, mlen) == 0) method = i;
    if (method < 0) {
        for (size_t i = 0; i < mlen; i++)
            if (!is_tchar((unsigned char)p[i]))
                return fail(g, STATUS_INVALID, "the request method '%s' is not a token", excerpt(p, mlen < 40 ? mlen : 40, ex, sizeof ex));
        return fail(g, STATUS_UNSUPPORTED, "method '%s' is not supported", excerpt(p, mlen < 40 ? mlen : 40, ex, sizeof ex));
    }
    const char *target = sp1 + 1;
    size_t tlen = (size_t)(sp2 - target);
    for (size_t i = 0; i < tlen; i++)
        if ((unsigned char)target[i] > 0x7e)
            return fail(g, STATUS_INVALID, "the request target holds a byte that is not ASCII (0x%02x): percent-encode it",
                        (unsigned char)target[i]);
    if (target[0] != '/' || (tlen > 1 && target[1] == '/'))
        return fail(g, STATUS_INVALID, "the request target '%s' is not a path starting with a single '/'",
                    excerpt(target, tlen < 60 ? tlen : 60, ex, sizeof ex));
    const char *ver = sp2 + 1;
    size_t vlen = len - (size_t)(ver - p);
    int minor;
    if (equals_ci(ver, vlen, "HTTP/1.1") && memcmp(ver, "HTTP", 4) == 0) minor = 1;
    else if (equals_ci(ver, vlen, "HTTP/1.0") && memcmp(ver, "HTTP", 4) == 0) minor = 0;
    else if (vlen > 5 && memcmp(ver, "HTTP/", 5) == 0)
        return fail(g, STATUS_HTTP_VERSION, "HTTP version '%s' is not supported: use HTTP/1.1", excerpt(ver, vlen < 20 ? vlen : 20, ex, sizeof ex));
    else return fail(g, STATUS_INVALID, "the request line ends in '%s', not an HTTP version", excerpt(ver, vlen < 20 ? vlen : 20, ex, sizeof ex));

    struct http_guard_head *h = g->head;
    if (h) {
        h->len = n;
        h->method = method;
        h->minor = minor;
        h->target = (uint32_t)(target - p);
        h->target_len = (uint32_t)tlen;
        h->conn_close = h->conn_keep_alive = h->expect_continue = h->has_body = 0;
        h->nfields = 0;
    }
    int n_cl = 0, n_te = 0, n_host = 0;
    uint64_t cl = 0;
    for (size_t at = end + 1; at < n;) {
        nl = memchr(p + at, '\n', n - at);
        end = (size_t)(nl - p);
        const char *line = p + at;
        len = line_len(line, end - at);
        at = end + 1;
        if (len == 0) break; /* the blank line */
        if (memchr(line, '\r', len)) return fail(g, STATUS_INVALID, "a header line holds a CR that does not end it");
        const char *name, *value;
        size_t nlen, vlen2;
        if (check_field(g, line, len, "header", &name, &nlen, &value, &vlen2)) return -1;
        if (h) {
            if (h->nfields == HTTP_GUARD_MAX_FIELDS)
                return fail(g, STATUS_HEADERS_TOO_LARGE, "the request has more than %d header fields", HTTP_GUARD_MAX_FIELDS);
            h->fields[h->nfields++] = (struct http_guard_field){(uint32_t)(name - p), (uint32_t)nlen,
                                                                (uint32_t)(value - p), (uint32_t)vlen2};
            if (equals_ci(name, nlen, "Connection")) connection_tokens(h, value, vlen2);
        }
        if (equals_ci(name, nlen, "Content-Length")) {
            if (++n_cl > 1) return fail(g, STATUS_INVALID, "more than one Content-Length header");
            if (vlen2 == 0 || vlen2 > 18)
                return fail(g, STATUS_INVALID, "Content-Length '%s' is not a number of bytes", excerpt(value, vlen2 < 30 ? vlen2 : 30, ex, sizeof ex));
            for (size_t k = 0; k < vlen2; k++) {
                if (value[k] < '0' || value[k] > '9')
                    return fail(g, STATUS_INVALID, "Content-Length '%s' is not a number of bytes", excerpt(value, vlen2 < 30 ? vlen2 : 30, ex, sizeof ex));
                cl = cl * 10 + (uint64_t)(value[k] - '0');
            }
        } else if (equals_ci(name, nlen, "Transfer-Encoding")) {
            if (++n_te > 1) return fail(g, STATUS_INVALID, "more than one Transfer-Encoding header");
            if (!equals_ci(value, vlen2, "chunked"))
                return fail(g, STATUS_UNSUPPORTED, "Transfer-Encoding '%s' is not supported: send chunked or a Content-Length",
                            excerpt(value, vlen2 < 40 ? vlen2 : 40, ex, sizeof ex));
        } else if (equals_ci(name, nlen, "Host")) {
            if (++n_host > 1) return fail(g, STATUS_INVALID, "more than one Host header");
        } else if (equals_ci(name, nlen, "Expect")) {
            if (h && minor == 1) h->expect_continue = 1;
            if (minor == 1 && !equals_ci(value, vlen2, "100-continue"))
                return fail(g, STATUS_EXPECTATION, "Expect '%s' is not supported (only 100-continue)", excerpt(value, vlen2 < 40 ? vlen2 : 40, ex, sizeof ex));
        }
    }
    if (n_cl && n_te) return fail(g, STATUS_INVALID, "a request may not have both Content-Length and Transfer-Encoding");
    if (minor == 1 && n_host == 0) return fail(g, STATUS_INVALID, "an HTTP/1.1 request needs a Host header");
    if (n_te && minor == 0) return fail(g, STATUS_INVALID, "Transfer-Encoding needs HTTP/1.1");
    /* No body for HEAD and TRACE: a client's or a proxy's reading could differ (one would run as the next request). */
    if ((method == 2 || method == 6) && (n_te || cl > 0))
        return fail(g, STATUS_INVALID, "a %s request cannot have a body", methods[method]);
    if (cl > g->lim.max_body)
        return fail(g, STATUS_TOO_LARGE, "request JSON size of %llu bytes exceeds the maximum allowed input size: "
                    "--max-request-size (%llu bytes)", (unsigned long long)cl, (unsigned long long)g->lim.max_body);
    if (h) h->has_body = n_te || cl > 0;
    if (n_te) {
        g->state = HG_CHUNK_SIZE;
        g->body = 0;
        g->trailer = 0;
    } else if (cl > 0) {
        g->state = HG_BODY;
        g->left = cl;
    } else {
        g->requests++;
    }
    return 0;
}

/* Finds the end of the line starting at p[from] within p[0..n): the offset
 * just past its LF, or 0 when it is not complete. */
static size_t find_line_end(const char *p, size_t n, size_t from) {
    const char *nl = from < n ? memchr(p + from, '\n', n - from) : NULL;
    return nl ? (size_t)(nl - p) + 1 : 0;
}

static ssize_t feed(struct http_guard *g, const char *p, size_t n, size_t *atp) {
    char ex[80];
    uint64_t done = g->requests;
    while ((*atp) < n && g->requests == done) {
        const char *q = p + (*atp);
        size_t avail = n - (*atp);
        switch (g->state) {
        case HG_FAILED:
            return -1;
        case HG_HEAD: {
            /* Scan whole lines from g->scanned until an empty one. */
            size_t pos = g->scanned;
            size_t head_end = 0;
            for (;;) {
                size_t e = find_line_end(q, avail, pos);
                if (!e) break;
                size_t l = line_len(q + pos, e - 1 - pos);
                if (l == 0) {
                    if (pos == 0) return fail(g, STATUS_INVALID, "the request starts with an empty line");
                    head_end = e;
                    break;
                }
                pos = e;
                if (pos > g->lim.max_header) break;
            }
            if (!head_end) {
                if (pos > g->lim.max_header || avail > g->lim.max_header)
                    return fail(g, STATUS_HEADERS_TOO_LARGE, "the request header exceeds %zu bytes", g->lim.max_header);
                for (size_t i = g->scanned; i < avail; i++)
                    if (q[i] == 0) return fail(g, STATUS_INVALID, "the request header holds a NUL byte");
                g->scanned = pos;
                return (ssize_t)*atp;
            }
            if (head_end > g->lim.max_header) return fail(g, STATUS_HEADERS_TOO_LARGE, "the request header exceeds %zu bytes", g->lim.max_header);
            if (memchr(q, 0, head_end)) return fail(g, STATUS_INVALID, "the request header holds a NUL byte");
            g->scanned = 0;
            if (parse_head(g, q, head_end)) return -1;
            (*atp) += head_end;
            if (g->head) return (ssize_t)*atp; /* the block alone: the caller tells it from the body */
            break;
        }
        case HG_BODY:
        case HG_CHUNK_DATA: {
            uint64_t k = g->left < avail ? g->left : avail;
            http_guard_skip(g, k);
            (*atp) += (size_t)k;
            break;
        }
        case HG_CHUNK_SIZE: {
            size_t e = find_line_end(q, avail < HG_MAX_CHUNK_LINE + 1 ? avail : HG_MAX_CHUNK_LINE + 1, 0);
            if (!e) {
                if (avail > HG_MAX_CHUNK_LINE) {
                    size_t k = 0;
                    while (k < avail && k < 40 && q[k] != '\r' && q[k] != '\n') k++;
                    const char *semi = memchr(q, ';', k);
                    if (semi) return fail(g, STATUS_INVALID, "chunk extensions ('%s') are not supported", excerpt(q, k, ex, sizeof ex));
                    return fail(g, STATUS_INVALID, "chunk size line '%s' is not a hexadecimal size", excerpt(q, k, ex, sizeof ex));
                }
                return (ssize_t)*atp;
            }
            size_t l = line_len(q, e - 1);
            uint64_t size = 0;
            if (l == 0 || l > 16) return fail(g, STATUS_INVALID, "chunk size line '%s' is not a hexadecimal size", excerpt(q, l, ex, sizeof ex));
            for (size_t i = 0; i < l; i++) {
                unsigned char c = (unsigned char)q[i];
                int d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
                if (d < 0) {
                    if (c == ';') return fail(g, STATUS_INVALID, "chunk extensions ('%s') are not supported", excerpt(q, l, ex, sizeof ex));
                    return fail(g, STATUS_INVALID, "chunk size line '%s' is not a hexadecimal size", excerpt(q, l, ex, sizeof ex));
                }
                if (size > (g->lim.max_body >> 4) + 1) size = g->lim.max_body + 1; /* saturate: over the limit anyway */
                else size = size * 16 + (uint64_t)d;
            }
            if (size > g->lim.max_body || g->body + size > g->lim.max_body)
                return fail(g, STATUS_TOO_LARGE, "request JSON size (chunked) exceeds the maximum allowed input size: "
                            "--max-request-size (%llu bytes)", (unsigned long long)g->lim.max_body);
            g->body += size;
            (*atp) += e;
            if (size == 0) g->state = HG_TRAILER;
            else {
                g->state = HG_CHUNK_DATA;
                g->left = size;
            }
            break;
        }
        case HG_CHUNK_END:
            if (q[0] == '\n') (*atp) += 1;
            else if (q[0] == '\r') {
                if (avail < 2) return (ssize_t)*atp;
                if (q[1] != '\n') return fail(g, STATUS_INVALID, "chunk data is not followed by CRLF (the chunk size does not match its data)");
                (*atp) += 2;
            } else return fail(g, STATUS_INVALID, "chunk data is not followed by CRLF (the chunk size does not match its data)");
            g->state = HG_CHUNK_SIZE;
            break;
        case HG_TRAILER: {
            size_t lim = g->lim.max_header - g->trailer + 1;
            size_t e = find_line_end(q, avail < lim ? avail : lim, 0);
            if (!e) {
                if (avail >= lim) return fail(g, STATUS_HEADERS_TOO_LARGE, "the request trailer exceeds %zu bytes", g->lim.max_header);
                return (ssize_t)*atp;
            }
            size_t l = line_len(q, e - 1);
            g->trailer += e;
            if (g->trailer > g->lim.max_header) return fail(g, STATUS_HEADERS_TOO_LARGE, "the request trailer exceeds %zu bytes", g->lim.max_header);
            (*atp) += e;
            if (l == 0) {
                g->state = HG_HEAD;
                g->requests++;
                break;
            }
            if (memchr(q, '\r', l) || memchr(q, 0, l)) return fail(g, STATUS_INVALID, "a trailer line holds a CR or NUL byte");
            const char *name, *value;
            size_t nlen, vlen;
            if (check_field(g, q, l, "trailer", &name, &nlen, &value, &vlen)) return -1;
            break;
        }
        }
    }
    return (ssize_t)*atp;
}

/* A violation after accepted bytes returns those first: they are whole
 * requests (or the start of the refused one's body) the caller may serve. */
ssize_t http_guard_feed(struct http_guard *g, const char *p, size_t n) {
    size_t at = 0;
    ssize_t r = feed(g, p, n, &at);
    return r < 0 && at > 0 ? (ssize_t)at : r;
}

void http_guard_skip(struct http_guard *g, uint64_t k) {
    g->left -= k;
    if (g->left) return;
    if (g->state == HG_BODY) {
        g->state = HG_HEAD;
        g->requests++;
    } else if (g->state == HG_CHUNK_DATA) g->state = HG_CHUNK_END;
}

enum http_guard_phase http_guard_phase(const struct http_guard *g, int pending) {
    if (g->state == HG_HEAD) return pending || g->scanned ? HTTP_GUARD_HEADER : HTTP_GUARD_IDLE;
    if (g->state == HG_FAILED) return HTTP_GUARD_IDLE;
    return HTTP_GUARD_BODY;
}
