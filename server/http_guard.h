/* http_guard.h - a strict HTTP/1.1 request framing checker.
 *
 * Lenient parsers accept framing that RFC 9112 says a server must refuse,
 * and that a proxy in front may read differently (request smuggling): two
 * Content-Length headers, whitespace before a header's colon, Content-Length
 * next to Transfer-Encoding, HTTP/1.1 without Host, a body on a HEAD
 * request. The guard lets through only requests with one reading: a request
 * line, header fields, then exactly the body the framing declares
 * (Content-Length bytes or chunks). Anything else is a violation with a
 * status (its HTTP code from common/status.h's table) and a message for the
 * client.
 *
 * kiln's own HTTP/1.1 connection (http_conn.c) reads requests through the
 * guard alone: with a head attached (http_guard_attach_head) the guard also
 * records where the request line's parts and each header field lie in the
 * header block it accepted, and stops after that block, so the caller can
 * tell the header from the body's bytes.
 *
 * The guard copies nothing: http_guard_feed examines bytes and says how many
 * may go on to the parser; a header block or a chunk-size line that is not
 * complete yet is left for the next call, which is given those bytes again
 * with more after them. Plain value, one per connection, no allocation, not
 * thread-safe (a connection lives on one I/O thread). */
#ifndef KILN_HTTP_GUARD_H
#define KILN_HTTP_GUARD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct http_guard_limits {
    size_t max_header;   /* request line + header fields + blank line, bytes (and the trailer's) */
    uint64_t max_body;   /* body bytes (Content-Length, or the chunks' sum) */
};

enum http_guard_phase {
    HTTP_GUARD_IDLE,     /* between requests: nothing of the next one seen */
    HTTP_GUARD_HEADER,   /* the request line and header fields are arriving */
    HTTP_GUARD_BODY,     /* the header was accepted; its body (or trailer) is arriving */
};

/* The most header fields one request may have (a header block of
 * CONN_MAX_HEADER bytes could hold thousands): more is a 431. */
#define HTTP_GUARD_MAX_FIELDS 128

/* The request methods, in the guard's order. */
enum http_method { HTTP_GET, HTTP_POST, HTTP_HEAD, HTTP_PUT, HTTP_DELETE, HTTP_OPTIONS, HTTP_TRACE, HTTP_CONNECT, HTTP_PATCH };

/* Offsets into the accepted header block. */
struct http_guard_field {
    uint32_t name, name_len, value, value_len; /* the value without its surrounding whitespace */
};

/* What the last accepted header block holds. */
struct http_guard_head {
    size_t len;                 /* the block's bytes, its blank line included */
    int method;                 /* enum http_method */
    int minor;                  /* HTTP/1.minor */
    uint32_t target, target_len;
    int conn_close;             /* a Connection header names "close" */
    int conn_keep_alive;        /* ... or "keep-alive" */
    int expect_continue;        /* Expect: 100-continue */
    int has_body;               /* a Content-Length > 0 or chunked: body bytes follow */
    int nfields;
    struct http_guard_field fields[HTTP_GUARD_MAX_FIELDS];
};

struct http_guard {
    struct http_guard_limits lim;
    struct http_guard_head *head; /* NULL, or where accepted header blocks are described */
    int state;           /* internal: what the next bytes are */
    uint64_t left;       /* bytes of the body or of the current chunk not seen yet */
    uint64_t body;       /* chunked: the sum of the chunk sizes so far */
    size_t scanned;      /* bytes of the pending header block / line known to hold no end */
    size_t trailer;      /* chunked: trailer bytes so far */
    uint64_t requests;   /* complete requests accepted */
    int status;          /* after a violation: the status (common/status.h) to answer */
    char msg[240];       /* after a violation: what was wrong, for the client */
};

void http_guard_init(struct http_guard *g, const struct http_guard_limits *lim);

/* Records each accepted header block in *head, and makes http_guard_feed
 * return right after it (the bytes it returns are then the block alone). */
static inline void http_guard_attach_head(struct http_guard *g, struct http_guard_head *head) { g->head = head; }

/* Examines p[0..n), the connection's next bytes (the first of them the bytes
 * left over by the previous call). Returns how many may go to the parser
 * (0..n; the rest is an incomplete header block or line to offer again with
 * more data), or -1 on a violation (g->status and g->msg say which; the
 * connection must be answered with them and closed). Bytes accepted before a
 * violation in the same call are returned first; the call after returns -1,
 * as does every later one. A call stops at the end of a request (requests
 * counts one more), so the bytes it returns belong to one request at most. */
ssize_t http_guard_feed(struct http_guard *g, const char *p, size_t n);

/* Body bytes that may be passed on without being looked at (Content-Length
 * body, chunk data); 0 when the next bytes need http_guard_feed. */
static inline uint64_t http_guard_data_left(const struct http_guard *g) { return g->status ? 0 : g->left; }

/* Takes k <= http_guard_data_left() bytes as passed on. */
void http_guard_skip(struct http_guard *g, uint64_t k);

/* Where the connection is, for the header and body deadlines; pending is
 * whether bytes of an incomplete header block are waiting for more. */
enum http_guard_phase http_guard_phase(const struct http_guard *g, int pending);

#endif
