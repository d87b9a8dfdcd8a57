/* http_conn.c - the HTTP transport's connections: kiln's own HTTP/1.1 on
 * the socket, and accept() at the open file limit. See http_impl.h.
 *
 * A connection reads its socket into one evbuffer and frames requests with
 * http_guard (server/http_guard.h), the strict RFC 9112 checker, which also
 * says where the request line's parts and the header fields lie: nothing
 * else parses a request's head. The header block is copied once into the
 * connection's own block and NUL-terminated in place; the body's bytes move
 * to the request's body buffer without a copy (chunked bodies lose their
 * framing on the way). One request at a time is served: pipelined bytes
 * wait in the input until its answer is written. The answer's head is
 * written in one piece before its body and both leave in one writev; only
 * what the kernel does not take waits for the socket to be writable.
 *
 * Reading stays on while a request is served, so a client that goes away is
 * seen at once (an error or a reset), or after INFER_HANGUP_AFTER_US for
 * an orderly close (a client that half-closes after a quick request still
 * gets its answer, as from any HTTP/1.1 server). Pipelined input past
 * CONN_MAX_PIPELINED bytes pauses reading until the answer is out.
 *
 * Deadlines: the header (from a request's first byte) and the body (from
 * the end of its header) are answered 408 and closed; a connection idle
 * between requests (kept open by a client's pool) or an answer the client
 * does not read is closed after --http-timeout-secs. A refused connection
 * (framing, limits, deadlines, --max-connections) is answered with a KServe
 * JSON error, its write side shut, and what the client still sends drained
 * (bounded) so that it reads the answer instead of a reset.
 *
 * Why not libevent's evhttp: it parsed every request a second time after the
 * guard, allocated a request, a URI and a header list per request, and
 * formatted its reply through printf; with the filter bufferevent that put
 * the guard in front of it, it was half of the server's instructions for a
 * small inference request (docs/benchmarks.md). http-parser (Debian's
 * libhttp-parser) is archived upstream and would still be a second pass
 * beside the guard the server needs anyway. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "server/http_impl.h"
#include "server/infer.h"
#include "server/kserve.h"
#include "server/shm.h"

/* After its answer, a refused connection is drained so the client reads the
 * answer rather than a reset: a 413's client is typically still sending the
 * whole body (clients such as Python's http.client read only once it is all
 * sent): up to 4 x --max-request-size or 64 MiB, whichever is more, for at
 * most 10 s; others get 1 s, and a shed connection 200 ms for its first
 * request. */
#define CONN_LINGER_413_MS 10000
#define CONN_LINGER_413_MIN_BYTES (64u << 20)
#define CONN_LINGER_413_LIMITS 4
#define CONN_LINGER_MS 1000
#define CONN_LINGER_BYTES (1u << 20)
#define CONN_SHED_LINGER_MS 200
#define CONN_SHED_LINGER_BYTES (64u << 10)
#define RATELOG_NS (10ull * 1000000000ull)
/* Bytes read per read(2) at most. */
#define CONN_READ_MAX (256 * 1024)
/* Input held beyond the request being served before reading pauses. */
#define CONN_PIPELINED_MAX (2 * CONN_MAX_HEADER)
/* An orderly close (EOF) while a request is served counts as the client
 * leaving once the request has waited this long. */
#define INFER_HANGUP_AFTER_US 2000

enum conn_state { CONN_OPEN, CONN_LINGER, CONN_DONE };
enum conn_phase { PHASE_READ, PHASE_SERVE, PHASE_WRITE };
enum conn_deadline { DEADLINE_IDLE, DEADLINE_HEADER, DEADLINE_BODY, DEADLINE_WRITE, DEADLINE_HANGUP, DEADLINE_NONE };

struct http_conn {
    struct io_thread *io;
    struct http_conn *prev, *next; /* the I/O thread's connections */
    evutil_socket_t fd;
    struct event *rd, *wr, *timer;
    struct evbuffer *in, *out;
    struct http_guard g;
    struct http_guard_head head;
    struct http_req req;           /* the request in progress */
    char *block;                   /* its header block, NUL-terminated in place */
    size_t block_cap;
    struct http_field *fields;     /* HTTP_GUARD_MAX_FIELDS of them */
    enum conn_state state;
    enum conn_phase phase;
    enum conn_deadline deadline;
    int in_body;                   /* the request's header is read; its body is arriving */
    int reading;                   /* rd is added */
    int peer_eof;                  /* the client closed its sending side */
    int gone;                      /* the socket is closed; waiting for the handler's answer to free */
    int close_after;               /* close once the answer is written */
    int processing;                /* conn_process is on the stack */
    int counted;                   /* holds one of --max-connections */
    int shed;
    int wrote;                     /* linger: the error answer is in the kernel and the write side shut */
    uint64_t serve_ns;             /* when the request in progress was handed over */
    uint64_t discarded, discard_max;
};

static struct log_every accept_log;

/* ==== lifetime ============================================================ */

static void conn_close_socket(struct http_conn *c) {
    if (c->fd < 0) return;
    event_del(c->rd);
    event_del(c->wr);
    evtimer_del(c->timer);
    c->reading = 0;
    close(c->fd);
    c->fd = -1;
    if (c->counted) {
        runtime_conn_release(c->io->srv->rt);
        c->counted = 0;
    }
}

static void conn_free(struct http_conn *c) {
    conn_close_socket(c);
    struct io_thread *io = c->io;
    if (c->prev) c->prev->next = c->next;
    else io->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    /* The connection's shared-memory regions go with it (server/shm.h). */
    shm_drop_owner(infer_core_shm(io->srv->core), shm_owner_of(c));
    event_free(c->rd);
    event_free(c->wr);
    event_free(c->timer);
    evbuffer_free(c->in);
    evbuffer_free(c->out);
    evbuffer_free(c->req.body);
    evbuffer_free(c->req.out);
    buf_free(&c->req.ohdr);
    free(c->block);
    free(c->fields);
    free(c);
}

/* Closes the connection: at once, or, while a handler still holds its
 * request, once that answers (http_req_reply frees it then). */
static void conn_end(struct http_conn *c) {
    if (c->phase == PHASE_SERVE) {
        conn_close_socket(c);
        c->gone = 1;
        return;
    }
    conn_free(c);
}

/* The client left while its request is served: the handler hears of it. */
static void conn_hangup(struct http_conn *c) {
    conn_close_socket(c);
    c->gone = 1;
    void (*cb)(void *) = c->req.on_hangup;
    c->req.on_hangup = NULL;
    if (cb) cb(c->req.hangup_arg);
}

static void conn_set_deadline(struct http_conn *c, enum conn_deadline d) {
    if (d == c->deadline || c->fd < 0) return;
    c->deadline = d;
    const struct server_config *cfg = c->io->srv->cfg;
    int idle = cfg->http_timeout_secs > 0 ? cfg->http_timeout_secs : 60;
    int secs = d == DEADLINE_HEADER ? cfg->http_header_timeout_secs
               : d == DEADLINE_BODY ? cfg->http_body_timeout_secs
               : d == DEADLINE_IDLE || d == DEADLINE_WRITE ? idle : 0;
    if (secs <= 0 && (d == DEADLINE_HEADER || d == DEADLINE_BODY)) secs = idle;
    if (d == DEADLINE_NONE) {
        evtimer_del(c->timer);
        return;
    }
    struct timeval tv = {secs, 0};
    if (d == DEADLINE_HANGUP) {
        uint64_t waited = (clock_now_ns() - c->serve_ns) / 1000;
        uint64_t left = waited >= INFER_HANGUP_AFTER_US ? 0 : INFER_HANGUP_AFTER_US - waited;
        tv = (struct timeval){0, (suseconds_t)left};
    }
    evtimer_add(c->timer, &tv);
}

/* ==== refusals ============================================================ */

/* The head of a JSON error answer with status (its code and reason phrase
 * from common/status.h's table) that closes the connection. */
static int error_head(char *head, size_t len, int status, size_t body_len) {
    int code = status_http(status);
    return snprintf(head, len,
                    "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                    code, status_http_phrase(code), body_len);
}

static void conn_linger_finish_write(struct http_conn *c) {
    if (!c->wrote && !evbuffer_get_length(c->out)) {
        shutdown(c->fd, SHUT_WR);
        c->wrote = 1;
    }
}

/* Answers status and msg, shuts the write side and drains what the client
 * still sends, for a while. Only between requests (no answer of ours is
 * in progress, so this one cannot interleave with it). */
static int conn_refuse(struct http_conn *c, int status, const char *msg) {
    if (c->state != CONN_OPEN || c->fd < 0) return 0;
    c->state = CONN_LINGER;
    struct buf b = {0};
    kserve_error_body(&b, msg);
    char head[256];
    int hl = error_head(head, sizeof head, status, b.len);
    evbuffer_drain(c->in, evbuffer_get_length(c->in));
    evbuffer_add(c->out, head, (size_t)hl);
    evbuffer_add(c->out, b.data, b.len);
    buf_free(&b);
    if (evbuffer_write(c->out, c->fd) < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        conn_free(c);
        return 1;
    }
    conn_linger_finish_write(c);
    if (!c->wrote) event_add(c->wr, NULL);
    uint64_t mrs = CONN_LINGER_413_LIMITS * (uint64_t)c->io->srv->cfg->max_request_size;
    int big = status == STATUS_TOO_LARGE;
    int ms = c->shed ? CONN_SHED_LINGER_MS : big ? CONN_LINGER_413_MS : CONN_LINGER_MS;
    c->discard_max = c->shed ? CONN_SHED_LINGER_BYTES
                     : big   ? (mrs > CONN_LINGER_413_MIN_BYTES ? mrs : CONN_LINGER_413_MIN_BYTES)
                             : CONN_LINGER_BYTES;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    c->deadline = DEADLINE_NONE;
    evtimer_add(c->timer, &tv);
    if (!c->reading) {
        event_add(c->rd, NULL);
        c->reading = 1;
    }
    return 0;
}

/* ==== requests ============================================================ */

static void conn_process(struct http_conn *c);

/* The request's header block, now in view at the start of the input: copied
 * into the connection's block and described in c->req. */
static int conn_take_head(struct http_conn *c) {
    const struct http_guard_head *h = &c->head;
    if (h->len + 1 > c->block_cap) {
        size_t cap = h->len + 1 < 1024 ? 1024 : h->len + 1;
        char *nb = realloc(c->block, cap);
        if (!nb) return -1;
        c->block = nb;
        c->block_cap = cap;
    }
    evbuffer_remove(c->in, c->block, h->len);
    char *b = c->block;
    b[h->len] = 0;
    struct http_req *r = &c->req;
    r->method = h->method;
    r->minor = h->minor;
    r->target = b + h->target;
    b[h->target + h->target_len] = 0;
    r->path = r->target;
    r->query = NULL;
    char *q = strpbrk(r->target, "?#");
    if (q) {
        if (*q == '?') r->query = q + 1;
        *q = 0;
        char *frag = r->query ? strchr(r->query, '#') : NULL;
        if (frag) *frag = 0;
    }
    r->nfields = h->nfields;
    for (int i = 0; i < h->nfields; i++) {
        const struct http_guard_field *f = &h->fields[i];
        b[f->name + f->name_len] = 0;  /* its colon */
        b[f->value + f->value_len] = 0; /* whitespace, CR or LF after the value */
        c->fields[i] = (struct http_field){b + f->name, b + f->value};
    }
    r->fields = c->fields;
    r->close = h->conn_close || (h->minor == 0 && !h->conn_keep_alive);
    r->keep_alive_10 = h->minor == 0 && h->conn_keep_alive && !h->conn_close;
    return 0;
}

/* Hands the complete request to the router. */
static void conn_dispatch(struct http_conn *c) {
    c->in_body = 0;
    c->phase = PHASE_SERVE;
    c->serve_ns = clock_now_ns();
    conn_set_deadline(c, DEADLINE_NONE);
    if (c->peer_eof) conn_set_deadline(c, DEADLINE_HANGUP);
    http_route(c->io, &c->req);
}

/* Frames what the input holds; dispatches a request once it is complete.
 * Returns with the connection freed only when it says so (1). */
static int conn_frame(struct http_conn *c) {
    size_t len;
    while (c->phase == PHASE_READ && c->state == CONN_OPEN && (len = evbuffer_get_length(c->in)) > 0) {
        uint64_t d = http_guard_data_left(&c->g);
        uint64_t done = c->g.requests;
        if (d) {
            size_t k = d < len ? (size_t)d : len;
            evbuffer_remove_buffer(c->in, c->req.body, k);
            http_guard_skip(&c->g, k);
        } else if (!c->in_body) {
            /* A header block needs up to CONN_MAX_HEADER bytes in view. */
            size_t big = CONN_MAX_HEADER + 2, want = len < big ? len : big;
            ssize_t r = http_guard_feed(&c->g, (const char *)evbuffer_pullup(c->in, (ev_ssize_t)want), want);
            if (r < 0) return conn_refuse(c, c->g.status, c->g.msg);
            if (r == 0) break;
            if (conn_take_head(c)) return conn_refuse(c, STATUS_NOMEM, "out of memory reading the request header");
            c->in_body = c->head.has_body;
            /* 100-continue before any of the body is here, as RFC 9110 asks. */
            if (c->in_body && c->head.expect_continue && !evbuffer_get_length(c->in)) {
                static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
                (void)!send(c->fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            }
        } else {
            /* Chunk framing: the next line at most (a chunk size, the CRLF
             * after a chunk's data, a trailer line). */
            size_t want = len < CONN_MAX_HEADER + 2 ? len : CONN_MAX_HEADER + 2;
            const char *p = (const char *)evbuffer_pullup(c->in, (ev_ssize_t)want);
            const char *nl = memchr(p, '\n', want);
            size_t n = nl ? (size_t)(nl - p) + 1 : want;
            ssize_t r = http_guard_feed(&c->g, p, n);
            if (r < 0) return conn_refuse(c, c->g.status, c->g.msg);
            if (r == 0) break;
            evbuffer_drain(c->in, (size_t)r);
        }
        if (c->g.requests != done) conn_dispatch(c);
    }
    return 0;
}

/* Reads what the socket has, CONN_READ_MAX bytes at most: the input is
 * framed (or reading paused) before the next read, so a client sending
 * faster than the server frames holds no more than that in the input. 1
 * when the connection was freed. */
static int conn_read(struct http_conn *c) {
    for (;;) {
        int n = evbuffer_read(c->in, c->fd, CONN_READ_MAX);
        if (n > 0) return 0;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) {
            /* Complete requests still in the input are answered first; one
             * served now is dropped if the close stands (DEADLINE_HANGUP),
             * and the connection closes once its answer is out. */
            c->peer_eof = 1;
            event_del(c->rd);
            c->reading = 0;
            if (c->phase == PHASE_SERVE) conn_set_deadline(c, DEADLINE_HANGUP);
            return 0;
        }
        /* A reset or another error: nobody reads an answer. */
        if (c->phase == PHASE_SERVE) conn_hangup(c);
        else conn_free(c);
        return 1;
    }
}

/* Frames the input and, between requests, decides what the connection
 * waits for next. Reentrant calls (an answer sent from inside the router)
 * leave the work to the outer one. */
static void conn_process(struct http_conn *c) {
    if (c->processing) return;
    c->processing = 1;
    int freed = conn_frame(c);
    if (freed) return;
    c->processing = 0;
    if (c->state == CONN_DONE) { /* answered with Connection: close inside the router */
        conn_free(c);
        return;
    }
    if (c->state != CONN_OPEN || c->phase != PHASE_READ) return;
    if (c->peer_eof) {
        /* Nothing more comes: a partial request is dropped, as the client left it. */
        conn_free(c);
        return;
    }
    enum http_guard_phase ph = http_guard_phase(&c->g, evbuffer_get_length(c->in) > 0);
    conn_set_deadline(c, ph == HTTP_GUARD_HEADER ? DEADLINE_HEADER : ph == HTTP_GUARD_BODY ? DEADLINE_BODY : DEADLINE_IDLE);
    if (!c->reading) {
        event_add(c->rd, NULL);
        c->reading = 1;
    }
}

/* The answer is all in the kernel: the next request, or the end. Inside
 * conn_frame (answered before the router returned), that one goes on with
 * the next request itself, and frees a closing connection as it unwinds. */
static void conn_answered(struct http_conn *c) {
    struct http_req *r = &c->req;
    void (*flushed)(void *) = r->on_flushed;
    void *arg = r->flushed_arg;
    r->on_flushed = NULL;
    if (flushed) flushed(arg);
    c->phase = PHASE_READ;
    if (c->close_after) {
        if (c->processing) c->state = CONN_DONE;
        else conn_free(c);
        return;
    }
    conn_process(c);
}

static void conn_write_cb(evutil_socket_t fd, short what, void *arg) {
    struct http_conn *c = arg;
    if (evbuffer_write(c->out, c->fd) < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        conn_free(c);
        return;
    }
    if (c->state == CONN_LINGER) {
        conn_linger_finish_write(c);
        if (!c->wrote) event_add(c->wr, NULL);
        return;
    }
    if (evbuffer_get_length(c->out)) {
        /* Bytes went out: the client reads, slowly maybe. The write deadline
         * is --http-timeout-secs without progress, not for the whole answer. */
        c->deadline = DEADLINE_NONE;
        conn_set_deadline(c, DEADLINE_WRITE);
        event_add(c->wr, NULL);
        return;
    }
    conn_answered(c);
}

static void conn_read_cb(evutil_socket_t fd, short what, void *arg) {
    struct http_conn *c = arg;
    if (c->state == CONN_LINGER) {
        char sink[16384];
        ssize_t n;
        while ((n = recv(c->fd, sink, sizeof sink, MSG_DONTWAIT)) > 0) {
            c->discarded += (uint64_t)n;
            if (c->discarded > c->discard_max) break;
        }
        if (n == 0 || c->discarded > c->discard_max || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            conn_free(c);
        return;
    }
    if (conn_read(c)) return;
    if (c->phase == PHASE_READ) conn_process(c);
    else if (evbuffer_get_length(c->in) > CONN_PIPELINED_MAX && c->reading) {
        event_del(c->rd); /* back pressure: resumed between requests */
        c->reading = 0;
    }
}

static void conn_timer_cb(evutil_socket_t fd, short what, void *arg) {
    struct http_conn *c = arg;
    if (c->state == CONN_LINGER) {
        conn_free(c);
        return;
    }
    const struct server_config *cfg = c->io->srv->cfg;
    char msg[160];
    switch (c->deadline) {
    case DEADLINE_HEADER:
    case DEADLINE_BODY:
        if (c->deadline == DEADLINE_HEADER)
            snprintf(msg, sizeof msg, "the request header did not arrive within --http-header-timeout-secs (%d s)",
                     cfg->http_header_timeout_secs);
        else
            snprintf(msg, sizeof msg, "the request body did not arrive within --http-body-timeout-secs (%d s)",
                     cfg->http_body_timeout_secs);
        c->deadline = DEADLINE_NONE;
        (void)conn_refuse(c, STATUS_IO_TIMEOUT, msg);
        break;
    case DEADLINE_HANGUP:
        c->deadline = DEADLINE_NONE;
        if (c->phase == PHASE_SERVE) conn_hangup(c);
        break;
    case DEADLINE_IDLE:
    case DEADLINE_WRITE:
        conn_end(c);
        break;
    case DEADLINE_NONE: break;
    }
}

/* ==== answers ============================================================= */

/* The Date header's value, formatted once a second per I/O thread. */
static const char *http_date(void) {
    static _Thread_local time_t last = -1;
    static _Thread_local char text[40];
    static const char wday[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char mon[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                    "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    struct tm tm;
    if (now != last && gmtime_r(&now, &tm)) {
        snprintf(text, sizeof text, "%s, %02d %s %d %02d:%02d:%02d GMT", wday[tm.tm_wday % 7], tm.tm_mday,
                 mon[tm.tm_mon % 12], 1900 + tm.tm_year, tm.tm_hour, tm.tm_min, tm.tm_sec);
        last = now;
    }
    return text;
}

const char *http_req_header(const struct http_req *r, const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < r->nfields; i++)
        if (strncasecmp(r->fields[i].name, name, n) == 0 && r->fields[i].name[n] == 0) return r->fields[i].value;
    return NULL;
}

int http_req_header_count(const struct http_req *r, const char *name) {
    int k = 0;
    for (int i = 0; i < r->nfields; i++) k += strcasecmp(r->fields[i].name, name) == 0;
    return k;
}

void http_req_add_header(struct http_req *r, const char *name, const char *value) {
    buf_str(&r->ohdr, name);
    buf_add(&r->ohdr, ": ", 2);
    buf_str(&r->ohdr, value);
    buf_add(&r->ohdr, "\r\n", 2);
}

/* A decimal number into the end of a buffer; returns its start. */
static char *utoa_end(char *end, uint64_t v) {
    do *--end = (char)('0' + v % 10);
    while ((v /= 10));
    return end;
}

void http_req_reply(struct http_req *r, int code, const char *ctype) {
    struct http_conn *c = r->conn;
    r->on_hangup = NULL;
    if (c->gone || c->fd < 0) {
        r->on_flushed = NULL;
        conn_free(c);
        return;
    }
    size_t body = evbuffer_get_length(r->out);
    int no_body = code == 204 || code == 304 || (code >= 100 && code < 200);
    if (!no_body && !ctype) ctype = "application/json";
    c->close_after = r->close || !runtime_ready(c->io->srv->rt) || c->peer_eof;
    struct buf *h = &r->ohdr;
    char head[256], num[24];
    size_t at = 0;
    const char *phrase = status_http_phrase(code);
    at += (size_t)snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nDate: %s\r\n", code, phrase, http_date());
    evbuffer_add(c->out, head, at);
    if (ctype) {
        evbuffer_add(c->out, "Content-Type: ", 14);
        evbuffer_add(c->out, ctype, strlen(ctype));
        evbuffer_add(c->out, "\r\n", 2);
    }
    if (!no_body) {
        char *s = utoa_end(num + sizeof num, body);
        evbuffer_add(c->out, "Content-Length: ", 16);
        evbuffer_add(c->out, s, (size_t)(num + sizeof num - s));
        evbuffer_add(c->out, "\r\n", 2);
    }
    if (h->len && !h->failed) evbuffer_add(c->out, h->data, h->len);
    if (c->close_after) evbuffer_add(c->out, "Connection: close\r\n", 19);
    else if (r->keep_alive_10) evbuffer_add(c->out, "Connection: keep-alive\r\n", 24);
    evbuffer_add(c->out, "\r\n", 2);
    h->len = 0;
    h->failed = 0;
    if (r->method == HTTP_HEAD || no_body) evbuffer_drain(r->out, body);
    else evbuffer_add_buffer(c->out, r->out);
    evbuffer_drain(r->body, evbuffer_get_length(r->body));
    c->phase = PHASE_WRITE;
    if (evbuffer_write(c->out, c->fd) < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        r->on_flushed = NULL;
        c->phase = PHASE_READ;
        conn_free(c);
        return;
    }
    if (evbuffer_get_length(c->out)) {
        conn_set_deadline(c, DEADLINE_WRITE);
        event_add(c->wr, NULL);
        return;
    }
    conn_answered(c);
}

shm_owner_t http_req_shm_owner(const struct http_req *r) { return shm_owner_of(r->conn); }

/* ==== connections ========================================================= */

static void conn_accept_cb(struct evconnlistener *lev, evutil_socket_t fd, struct sockaddr *sa, int socklen, void *arg) {
    struct io_thread *io = arg;
    http_server_t *s = io->srv;
    struct http_conn *c = calloc(1, sizeof *c);
    if (c) {
        c->io = io;
        c->fd = fd;
        c->rd = event_new(io->base, fd, EV_READ | EV_PERSIST, conn_read_cb, c);
        c->wr = event_new(io->base, fd, EV_WRITE, conn_write_cb, c);
        c->timer = evtimer_new(io->base, conn_timer_cb, c);
        c->in = evbuffer_new();
        c->out = evbuffer_new();
        c->req.body = evbuffer_new();
        c->req.out = evbuffer_new();
        c->fields = malloc(HTTP_GUARD_MAX_FIELDS * sizeof *c->fields);
    }
    if (!c || !c->rd || !c->wr || !c->timer || !c->in || !c->out || !c->req.body || !c->req.out || !c->fields) {
        if (c) {
            if (c->rd) event_free(c->rd);
            if (c->wr) event_free(c->wr);
            if (c->timer) event_free(c->timer);
            if (c->in) evbuffer_free(c->in);
            if (c->out) evbuffer_free(c->out);
            if (c->req.body) evbuffer_free(c->req.body);
            if (c->req.out) evbuffer_free(c->req.out);
            free(c->fields);
            free(c);
        }
        close(fd);
        return;
    }
    c->req.conn = c;
    http_guard_init(&c->g, &s->guard);
    http_guard_attach_head(&c->g, &c->head);
    c->deadline = DEADLINE_NONE;
    c->next = io->conns;
    if (io->conns) io->conns->prev = c;
    io->conns = c;
    if (!runtime_conn_admit(s->rt, "HTTP, answered 503")) {
        c->shed = 1;
        char msg[200];
        snprintf(msg, sizeof msg, "the server has --max-connections (%d) connections open: try again later",
                 runtime_max_connections(s->rt));
        (void)conn_refuse(c, STATUS_UNAVAILABLE, msg);
        return;
    }
    c->counted = 1;
    event_add(c->rd, NULL);
    c->reading = 1;
    conn_set_deadline(c, DEADLINE_IDLE);
}

void http_conn_close_all(struct io_thread *io) {
    while (io->conns) conn_free(io->conns);
}

static void accept_resume_cb(evutil_socket_t fd, short what, void *arg) {
    runtime_spare_reserve();
    evconnlistener_enable(arg);
}

/* Accepts one waiting connection with the spare descriptor and answers it 503. */
static int accept_shed_one(struct evconnlistener *lev) {
    /* The loop's spare descriptor (server/runtime.h) makes room for one. */
    if (!runtime_spare_release()) return 0;
    int fd = accept4(evconnlistener_get_fd(lev), NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
        static const char body[] = "{\"error\":\"the server is out of file descriptors (open file limit): try again later\"}";
        char resp[320];
        int n = error_head(resp, sizeof resp, STATUS_UNAVAILABLE, sizeof body - 1);
        n += snprintf(resp + n, sizeof resp - (size_t)n, "%s", body);
        (void)!send(fd, resp, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
        shutdown(fd, SHUT_WR);
        /* What the client already sent is read first: closing over unread
         * bytes would reset the connection and could lose the answer. */
        char sink[4096];
        for (int i = 0; i < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {
        }
        close(fd);
    }
    runtime_spare_reserve();
    return fd >= 0;
}

/* accept() failed for a reason other than a retriable one: at the open file
 * limit (EMFILE, ENFILE) the pending connection stays queued and the socket
 * stays readable, so retrying at once would spin. The waiting connection is
 * answered with the spare descriptor; when that fails too, accepting pauses
 * briefly. Either way one log line per interval. */
static void conn_accept_error(struct evconnlistener *lev, void *arg) {
    int err = EVUTIL_SOCKET_ERROR();
    /* The I/O threads share one descriptor table: another thread may have
     * taken the slot a spare gave up. It is taken back as soon as one frees. */
    runtime_spare_reserve();
    int shed = (err == EMFILE || err == ENFILE) && accept_shed_one(lev);
    if (!shed) {
        struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};
        evconnlistener_disable(lev);
        if (event_base_once(evconnlistener_get_base(lev), -1, EV_TIMEOUT, accept_resume_cb, lev, &tv))
            evconnlistener_enable(lev);
    }
    unsigned n;
    if (log_every_due(&accept_log, RATELOG_NS, &n))
        log_warn("accept failed: %s%s (%u time%s in the last %llu s; waiting connections are answered 503, or "
                 "accepting pauses %d ms)", strerror(err),
                 err == EMFILE || err == ENFILE ? " (the open file limit: raise ulimit -n or lower --max-connections)" : "",
                 n, n == 1 ? "" : "s", RATELOG_NS / 1000000000ull, ACCEPT_PAUSE_MS);
}

int http_conn_listen(struct io_thread *io) {
    io->listener = evconnlistener_new(io->base, conn_accept_cb, io, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, io->fd);
    if (!io->listener) return -1;
    io->fd = -1; /* the listener's now */
    evconnlistener_set_error_cb(io->listener, conn_accept_error);
    return 0;
}
