/* http_guard.h - a strict HTTP/1.1 request framing checker.
 *
 * kiln's HTTP parser (libevent's evhttp) accepts framing that RFC 9112 says a
 * server must refuse: two Content-Length headers (the first wins and the rest
 * of the body runs as a second request), whitespace before a header's colon,
 * Content-Length next to Transfer-Encoding, HTTP/1.1 without Host, a body on
 * a HEAD request. The guard sees the byte stream of a connection before the
 * parser does and lets through only requests whose framing both read the same
 * way: a request line, header fields, then exactly the body the framing
 * declares (Content-Length bytes or chunks). Everything it accepts evhttp
 * parses identically; anything else is a violation with a status (its HTTP
 * code from common/status.h's table) and a message for the client.
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

struct http_guard {
    struct http_guard_limits lim;
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
