/* grpc_conn.c - the gRPC transport's connections: listeners on the HTTP
 * server's I/O loops, HTTP/2 (nghttp2) over a bufferevent per connection,
 * and gRPC's framing of messages (a 1-byte compressed flag, a 4-byte
 * big-endian length, the protobuf bytes) and of statuses (grpc-status and
 * grpc-message trailers).
 *
 * Sections: request buffers; connections; deadlines; streams and their
 * answers; nghttp2's callbacks; listeners and the loops' jobs; the server.
 *
 * Limits: a connection takes one of --max-connections (shared with HTTP;
 * see conn_open for one past them); it has the HTTP
 * front end's deadlines (see conn_deadlines); and the request bytes its
 * calls hold before their messages are whole are capped per connection
 * (--grpc-max-buffered-bytes) and for the server (--grpc-max-buffered-total).
 *
 * nghttp2 may not be driven (nghttp2_session_send) from inside its own
 * callbacks, and a handler may answer inside one (an error, a cache hit):
 * so answering only queues, and the connection sends when control returns
 * to its read callback, or at once when nothing of nghttp2 is on the stack
 * (a completion posted by the inference core). */
#include "server/grpc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <nghttp2/nghttp2.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "server/grpc_impl.h"
#include "server/http_coding.h"
#include "server/listen.h"

/* Bytes of answers queued on a socket before nghttp2 is asked to wait. */
#define CONN_OUT_HIGH (1 << 20)
/* Flow-control windows: large tensors arrive without waiting for a window
 * update every 64 KiB. */
#define STREAM_WINDOW (1 << 20)
#define CONN_WINDOW (16 << 20)
#define MAX_HEADER_LIST (64 * 1024)
/* Flood limits (nghttp2's options): SETTINGS and PING frames whose ACKs
 * wait unsent, entries in one SETTINGS frame, CONTINUATION frames of one
 * header block, and streams a client may reset (a token bucket: a burst,
 * then so many a second). Past one the connection gets GOAWAY. */
#define MAX_OUTBOUND_ACK 256
#define MAX_SETTINGS 32
#define MAX_CONTINUATIONS 8
#define RESET_BURST 1000
#define RESET_RATE 100
/* How long an aborted connection waits for its GOAWAY to leave, then for
 * the client to close its side; one refused at --max-connections waits less,
 * and lives at most that long, since it holds a descriptor outside the count. */
#define CONN_ABORT_SECS 5
#define CONN_SHED_SECS 1
/* A stream's input buffer: the first block, the size from which blocks are
 * mmap'd, and the most an idle streaming call keeps between messages. */
#define INBUF_MIN (16u << 10)
#define INBUF_MMAP_MIN (256u << 10)
#define INBUF_KEEP (64u << 10)

struct grpc_conn {
    struct grpc_loop *loop;
    struct bufferevent *bev;
    nghttp2_session *h2;
    struct grpc_stream *streams;
    struct event *timer; /* the next of its deadlines (see conn_arm) */
    int busy;      /* inside nghttp2_session_mem_recv: send and close wait */
    int dead;      /* close when no longer busy */
    int closing;   /* aborted: 1 while its GOAWAY is on its way out, 2 after (lingering) */
    int counted;   /* holds one of --max-connections */
    int shed;      /* past --max-connections: its calls are refused, then it closes */
    int got_request; /* the preface and a first request's headers arrived */
    uint64_t opened_ns, last_io_ns; /* accepted; a byte last read or written */
    size_t in_bytes; /* request bytes held in its streams' in buffers (their capacity) */
    struct evbuffer *pend; /* frames nghttp2 made since the last flush */
    struct grpc_conn *next, *prev;
};

/* ==== request buffers ==================================================== */

/* Moves reserved bytes between nothing and the stream: growth that would
 * pass the connection's limit (-1) or the server's (-2) is refused and
 * counted nowhere. */
static int inbuf_account(struct grpc_stream *st, size_t old_cap, size_t new_cap) {
    struct grpc_conn *c = st->conn;
    grpc_server_t *s = c->loop->srv;
    if (new_cap <= old_cap) {
        c->in_bytes -= old_cap - new_cap;
        atomic_fetch_sub(&s->buffered, old_cap - new_cap);
        return 0;
    }
    size_t d = new_cap - old_cap;
    if (c->in_bytes + d > s->max_buffered) return -1;
    if (atomic_fetch_add(&s->buffered, d) + d > s->max_buffered_total) {
        atomic_fetch_sub(&s->buffered, d);
        return -2;
    }
    c->in_bytes += d;
    return 0;
}

/* A block of cap bytes holding old's first keep bytes (old is given up). A
 * large block is its own mapping, so freeing it returns it to the system. */
static uint8_t *inbuf_block(uint8_t *old, size_t old_cap, size_t keep, size_t cap) {
    if (cap < INBUF_MMAP_MIN) return realloc(old, cap);
    if (old_cap >= INBUF_MMAP_MIN) {
        void *p = mremap(old, old_cap, cap, MREMAP_MAYMOVE);
        return p == MAP_FAILED ? NULL : p;
    }
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    if (keep) memcpy(p, old, keep);
    free(old);
    return p;
}

static void inbuf_release(struct grpc_stream *st) {
    struct grpc_inbuf *b = &st->in;
    if (b->cap >= INBUF_MMAP_MIN) munmap(b->data, b->cap);
    else free(b->data);
    if (b->cap) inbuf_account(st, b->cap, 0);
    *b = (struct grpc_inbuf){0};
}

/* The length a gRPC message prefix (5 bytes) announces. */
static size_t prefix_len(const uint8_t *h) {
    return (size_t)h[1] << 24 | (size_t)h[2] << 16 | (size_t)h[3] << 8 | h[4];
}

/* Appends a DATA frame's bytes to the stream's input. The block grows by
 * doubling, but not past the message in progress, so a whole message of
 * the largest size fits the default per-connection limit twice. 0, or -1
 * with the call ended (a limit, out of memory). */
static int inbuf_append(struct grpc_stream *st, const uint8_t *data, size_t len) {
    struct grpc_inbuf *b = &st->in;
    if (b->off) {
        memmove(b->data, b->data + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
    }
    if (b->len + len > b->cap) {
        size_t need = b->len + len, cap = b->cap * 2 > INBUF_MIN ? b->cap * 2 : INBUF_MIN;
        if (b->len >= 5 && cap > prefix_len(b->data) + 5) cap = prefix_len(b->data) + 5;
        if (cap < need) cap = need;
        if (cap >= INBUF_MMAP_MIN) cap = (cap + 4095) & ~(size_t)4095;
        grpc_server_t *s = grpc_stream_server(st);
        int rc = inbuf_account(st, b->cap, cap);
        if (rc == -1) {
            grpc_stream_errorf(st, STATUS_EXHAUSTED,
                               "the connection holds more than --grpc-max-buffered-bytes (%zu bytes) of unfinished "
                               "request messages: finish or cancel its other calls first", s->max_buffered);
            return -1;
        }
        if (rc == -2) {
            grpc_stream_errorf(st, STATUS_EXHAUSTED,
                               "the server holds more than --grpc-max-buffered-total (%zu bytes) of unfinished "
                               "request messages: try again later", s->max_buffered_total);
            return -1;
        }
        uint8_t *p = inbuf_block(b->data, b->cap, b->len, cap);
        if (!p) {
            inbuf_account(st, cap, b->cap);
            grpc_stream_errorf(st, STATUS_NOMEM, "out of memory");
            return -1;
        }
        b->data = p;
        b->cap = cap;
    }
    if (b->len == 0) b->since_ns = clock_now_ns();
    memcpy(b->data + b->len, data, len);
    b->len += len;
    return 0;
}

/* A message of n bytes (and its prefix) was taken: what follows, if any,
 * is the next message begun; an emptied large block is given back. */
static void inbuf_consume(struct grpc_stream *st, size_t n) {
    struct grpc_inbuf *b = &st->in;
    b->off += n;
    if (b->off < b->len) {
        b->since_ns = clock_now_ns();
        return;
    }
    b->off = b->len = 0;
    b->since_ns = 0;
    if (b->cap > INBUF_KEEP) inbuf_release(st);
}

/* ==== connections ======================================================== */

static void conn_close(struct grpc_conn *c);
static void conn_arm(struct grpc_conn *c);

static void stream_free(struct grpc_stream *st) {
    grpc_infer_detach(st);
    grpc_control_detach(st);
    grpc_health_detach(st);
    if (st->conn) inbuf_release(st);
    if (st->out) evbuffer_free(st->out);
    free(st->path);
    free(st->authorization);
    free(st->coding_unknown);
    free(st->plain);
    free(st->message);
    free(st);
}

static void stream_unlink(struct grpc_conn *c, struct grpc_stream *st) {
    if (st->prev) st->prev->next = st->next;
    else c->streams = st->next;
    if (st->next) st->next->prev = st->prev;
}

/* Moves the frames nghttp2 made to the bufferevent's output, behind what
 * it still holds. */
static void conn_out_move(struct grpc_conn *c) {
    if (evbuffer_get_length(c->pend) && evbuffer_add_buffer(bufferevent_get_output(c->bev), c->pend)) c->dead = 1;
}

/* The frames nghttp2 made go to the socket now when nothing waits before
 * them, rather than through the bufferevent, whose writable event costs
 * another epoll round per answer: an answer leaves as soon as it is made,
 * as HTTP's do. What the kernel does not take, and any error, go to the
 * bufferevent. */
static size_t conn_write_now(struct grpc_conn *c) {
    size_t n = evbuffer_get_length(c->pend);
    if (n && !evbuffer_get_length(bufferevent_get_output(c->bev)) && evbuffer_write(c->pend, bufferevent_getfd(c->bev)) > 0)
        c->last_io_ns = clock_now_ns();
    conn_out_move(c);
    return n;
}

/* Hands nghttp2's pending frames to the socket; closes the connection when
 * neither side has anything left to say, or on a protocol error. */
static void conn_flush(struct grpc_conn *c) {
    if (c->busy) return;
    if (c->closing && !c->dead) {
        /* The GOAWAY left: half-close and read (and drop) what the client
         * still sends until it closes too. Closing with its bytes unread
         * would reset the connection, and a reset may discard the GOAWAY
         * before the client reads it. */
        if (c->closing == 1 && evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
            c->closing = 2;
            shutdown(bufferevent_getfd(c->bev), SHUT_WR);
            struct timeval tv = {c->counted ? CONN_ABORT_SECS : CONN_SHED_SECS, 0};
            bufferevent_set_timeouts(c->bev, &tv, NULL);
            bufferevent_enable(c->bev, EV_READ);
        }
        return;
    }
    /* nghttp2 stops at the output's high-water mark; when the socket then
     * took everything, no writable event follows to resume it: go on here. */
    for (int more = 1; more && !c->dead;) {
        if (nghttp2_session_send(c->h2) != 0) c->dead = 1;
        else
            more = conn_write_now(c) && !evbuffer_get_length(bufferevent_get_output(c->bev)) &&
                   nghttp2_session_want_write(c->h2);
    }
    if (!c->dead && !nghttp2_session_want_read(c->h2) && !nghttp2_session_want_write(c->h2) &&
        evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        c->dead = 1;
    if (c->dead) conn_close(c);
}

/* Frees the connection's streams; their calls in the core answer nobody
 * and those still queued are dropped. */
static void streams_free(struct grpc_conn *c) {
    while (c->streams) {
        struct grpc_stream *st = c->streams;
        stream_unlink(c, st);
        nghttp2_session_set_stream_user_data(c->h2, st->id, NULL);
        stream_free(st);
    }
}

/* Ends the connection with a GOAWAY whose debug data is why (NULL: none):
 * a fatal error in what the client sent, which nghttp2 reports without a
 * GOAWAY of its own (a SETTINGS, PING or CONTINUATION flood, too many
 * resets), a deadline, or --max-connections. The GOAWAY is written here,
 * since the session may take no more calls, the streams go at once, and
 * the connection closes once the frame left and the client closed too. */
static void conn_abort(struct grpc_conn *c, uint32_t code, const char *why) {
    uint32_t last = (uint32_t)nghttp2_session_get_last_proc_stream_id(c->h2);
    size_t dlen = why ? strlen(why) : 0;
    uint8_t f[17] = {0, (uint8_t)((8 + dlen) >> 8), (uint8_t)(8 + dlen), NGHTTP2_GOAWAY, 0, 0, 0, 0, 0,
                     (uint8_t)(last >> 24), (uint8_t)(last >> 16), (uint8_t)(last >> 8), (uint8_t)last,
                     (uint8_t)(code >> 24), (uint8_t)(code >> 16), (uint8_t)(code >> 8), (uint8_t)code};
    streams_free(c);
    conn_out_move(c); /* what nghttp2 made before the error goes first */
    c->closing = 1;
    evtimer_del(c->timer);
    bufferevent_disable(c->bev, EV_READ);
    struct timeval tv = {c->counted ? CONN_ABORT_SECS : CONN_SHED_SECS, 0};
    bufferevent_set_timeouts(c->bev, NULL, &tv);
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (evbuffer_add(out, f, sizeof f) || (dlen && evbuffer_add(out, why, dlen))) c->dead = 1;
}

/* Frees the connection and its streams; their calls in the core answer nobody. */
static void conn_close(struct grpc_conn *c) {
    if (c->busy) {
        c->dead = 1;
        return;
    }
    streams_free(c);
    nghttp2_session_del(c->h2);
    bufferevent_free(c->bev);
    evbuffer_free(c->pend);
    event_free(c->timer);
    if (c->counted) runtime_conn_release(c->loop->srv->rt);
    struct grpc_loop *l = c->loop;
    if (c->prev) c->prev->next = c->next;
    else l->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    shm_drop_owner(infer_core_shm(l->srv->core), shm_owner_of(c)); /* its shared-memory regions go with it */
    free(c);
}

static void conn_read_cb(struct bufferevent *bev, void *arg) {
    struct grpc_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t n = evbuffer_get_length(in);
    if (c->closing) {
        evbuffer_drain(in, n);
        return;
    }
    unsigned char *data = evbuffer_pullup(in, -1);
    c->last_io_ns = clock_now_ns();
    c->busy = 1;
    ssize_t used = nghttp2_session_mem_recv(c->h2, data, n);
    c->busy = 0;
    if (used < 0) {
        log_debug("grpc: closing a connection: %s", nghttp2_strerror((int)used));
        conn_abort(c, used == NGHTTP2_ERR_FLOODED || used == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS
                          ? NGHTTP2_ENHANCE_YOUR_CALM
                          : NGHTTP2_PROTOCOL_ERROR, NULL);
    } else {
        evbuffer_drain(in, (size_t)used);
        if (!c->dead) conn_arm(c);
    }
    conn_flush(c);
}

/* The socket took everything queued: nghttp2 may have more for it. */
static void conn_write_cb(struct bufferevent *bev, void *arg) {
    struct grpc_conn *c = arg;
    c->last_io_ns = clock_now_ns();
    conn_flush(c);
}

static void conn_event_cb(struct bufferevent *bev, short what, void *arg) {
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) conn_close(arg);
}

static void conn_timer_cb(evutil_socket_t fd, short what, void *arg);

static void conn_open(struct grpc_loop *l, evutil_socket_t fd) {
    struct grpc_conn *c = calloc(1, sizeof *c);
    if (c) c->bev = bufferevent_socket_new(l->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (c) c->pend = evbuffer_new();
    if (c) c->timer = evtimer_new(l->base, conn_timer_cb, c);
    if (!c || !c->bev || !c->pend || !c->timer ||
        nghttp2_session_server_new2(&c->h2, l->srv->h2_callbacks, c, l->srv->h2_options) != 0) {
        log_error("grpc: out of memory accepting a connection");
        if (c && c->bev) bufferevent_free(c->bev);
        else close(fd);
        if (c && c->pend) evbuffer_free(c->pend);
        if (c && c->timer) event_free(c->timer);
        free(c);
        return;
    }
    c->loop = l;
    c->opened_ns = c->last_io_ns = clock_now_ns();
    c->next = l->conns;
    if (l->conns) l->conns->prev = c;
    l->conns = c;
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, GRPC_MAX_STREAMS},
                                   {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW},
                                   {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST}};
    nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, iv, sizeof iv / sizeof iv[0]);
    nghttp2_session_set_local_window_size(c->h2, NGHTTP2_FLAG_NONE, 0, CONN_WINDOW);
    bufferevent_setcb(c->bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    /* One past --max-connections is not closed at once: a GOAWAY before
     * any call would have gRPC clients retry the call on a new connection at
     * once, again and again. Its first call is answered UNAVAILABLE, saying
     * why, as HTTP answers 503, with a GOAWAY after it (stream_check); one
     * that sends no call within CONN_SHED_SECS gets the GOAWAY alone. */
    c->counted = runtime_conn_admit(l->srv->rt, "gRPC, calls answered UNAVAILABLE");
    c->shed = !c->counted;
    conn_arm(c);
    conn_flush(c);
}

static void shed_reason(const struct grpc_conn *c, char *why, size_t len) {
    snprintf(why, len, "the server has --max-connections (%d) connections open: try again later",
             runtime_max_connections(c->loop->srv->rt));
}

/* ==== deadlines ========================================================== */

/* The connection's deadlines, those of HTTP (a slow client holds a
 * descriptor and buffers as long as it likes otherwise):
 * - the connection preface and a first call's headers within
 *   --http-header-timeout-secs of the accept, and any header block, once
 *   begun, whole within it (nothing else may come between its frames);
 * - a unary call's request within --http-body-timeout-secs of its headers,
 *   and each message of a streaming call within it of its first byte;
 * - with no call open (one waiting for its answer, or a streaming call, is
 *   open), a byte read or written within --http-timeout-secs.
 * Returns the next one to come (clock_now_ns time; 0 = none). With expire,
 * those passed first take effect: the connection is closed with a GOAWAY
 * (header deadlines, idle), or the call ends with DEADLINE_EXCEEDED and its
 * buffer is freed; the caller holds c->busy and flushes after. */
/* Whether deadline d takes effect now (expire, and it passed); else it
 * is a candidate for *next. */
static int passed(uint64_t d, int expire, uint64_t due, uint64_t *next) {
    if (expire && d <= due) return 1;
    if (d < *next) *next = d;
    return 0;
}

static uint64_t conn_deadlines(struct grpc_conn *c, int expire) {
    const grpc_server_t *s = c->loop->srv;
    /* The timer fires at the armed time, not before, but not to the nanosecond either. */
    uint64_t now = clock_now_ns(), due = now + 1000000, next = UINT64_MAX;
    uint64_t hdr = (uint64_t)s->header_secs * 1000000000ull, body = (uint64_t)s->body_secs * 1000000000ull;
    char why[200];
    int open = 0;
    if (c->shed && passed(c->opened_ns + CONN_SHED_SECS * 1000000000ull, expire, due, &next)) {
        shed_reason(c, why, sizeof why);
        conn_abort(c, NGHTTP2_ENHANCE_YOUR_CALM, why);
        return 0;
    }
    if (!c->got_request && hdr && passed(c->opened_ns + hdr, expire, due, &next)) {
        snprintf(why, sizeof why, "the connection preface and a request's headers did not arrive within "
                 "--http-header-timeout-secs (%d s)", s->header_secs);
        conn_abort(c, NGHTTP2_ENHANCE_YOUR_CALM, why);
        return 0;
    }
    for (struct grpc_stream *st = c->streams, *nx; st; st = nx) {
        nx = st->next;
        if (!st->headers_done && hdr && passed(st->opened_ns + hdr, expire, due, &next)) {
            snprintf(why, sizeof why, "a request's header block was not whole within --http-header-timeout-secs (%d s)",
                     s->header_secs);
            conn_abort(c, NGHTTP2_ENHANCE_YOUR_CALM, why);
            return 0;
        }
        if (st->finished || !st->headers_done) continue;
        open = 1;
        uint64_t since = !st->method ? 0 : !st->method->streaming ? (st->remote_done ? 0 : st->opened_ns) : st->in.since_ns;
        if (since && body && passed(since + body, expire, due, &next))
            grpc_stream_errorf(st, STATUS_IO_TIMEOUT,
                               "the request message did not arrive within --http-body-timeout-secs (%d s)", s->body_secs);
    }
    if (!open && s->idle_secs > 0 &&
        passed(c->last_io_ns + (uint64_t)s->idle_secs * 1000000000ull, expire, due, &next)) {
        snprintf(why, sizeof why, "idle for --http-timeout-secs (%d s)", s->idle_secs);
        conn_abort(c, NGHTTP2_NO_ERROR, why);
        return 0;
    }
    return next == UINT64_MAX ? 0 : next;
}

/* Sets the timer to the next deadline. */
static void conn_arm(struct grpc_conn *c) {
    uint64_t next = conn_deadlines(c, 0);
    if (!next) {
        evtimer_del(c->timer);
        return;
    }
    uint64_t now = clock_now_ns(), wait = next > now ? next - now : 0;
    struct timeval tv = {(time_t)(wait / 1000000000ull), (suseconds_t)(wait % 1000000000ull / 1000)};
    evtimer_add(c->timer, &tv);
}

static void conn_timer_cb(evutil_socket_t fd, short what, void *arg) {
    struct grpc_conn *c = arg;
    if (c->closing || c->dead) return;
    c->busy = 1;
    conn_deadlines(c, 1);
    c->busy = 0;
    if (!c->closing && !c->dead) conn_arm(c);
    conn_flush(c);
}

/* ==== streams and their answers ========================================= */

grpc_server_t *grpc_stream_server(const struct grpc_stream *st) { return st->conn->loop->srv; }

struct grpc_loop *grpc_stream_loop(const struct grpc_stream *st) { return st->conn->loop; }

/* nghttp2 pulls a stream's answer from here; trailers go after the last
 * byte once the status is known, and an empty queue defers the stream. */
static ssize_t data_read_cb(nghttp2_session *h2, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                            nghttp2_data_source *src, void *user) {
    struct grpc_stream *st = src->ptr;
    int n = evbuffer_remove(st->out, buf, len);
    if (n < 0) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (evbuffer_get_length(st->out) > 0) return n;
    if (!st->finished) return n ? n : NGHTTP2_ERR_DEFERRED;
    char code[16];
    snprintf(code, sizeof code, "%d", st->code);
    nghttp2_nv tr[2] = {{(uint8_t *)"grpc-status", (uint8_t *)code, 11, strlen(code), NGHTTP2_NV_FLAG_NONE},
                        {(uint8_t *)"grpc-message", (uint8_t *)st->message, 12,
                         st->message ? strlen(st->message) : 0, NGHTTP2_NV_FLAG_NONE}};
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    if (nghttp2_submit_trailer(h2, id, tr, st->message ? 2 : 1) == 0) *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    return n;
}

#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, NGHTTP2_NV_FLAG_NONE}
/* The message codings kiln reads (grpc-encoding), in every answer's headers. */
#define ACCEPT_ENCODING "identity,deflate,gzip"

/* Response headers, once per stream, with the answer's data provider. */
static void stream_start(struct grpc_stream *st) {
    if (st->started) {
        nghttp2_session_resume_data(st->conn->h2, st->id);
        return;
    }
    const char *coding = http_coding_name(st->coding_out);
    nghttp2_nv hdrs[] = {NV(":status", "200"), NV("content-type", "application/grpc"),
                         NV("grpc-accept-encoding", ACCEPT_ENCODING),
                         {(uint8_t *)"grpc-encoding", (uint8_t *)coding, 13, coding ? strlen(coding) : 0,
                          NGHTTP2_NV_FLAG_NONE}};
    nghttp2_data_provider prd = {.source.ptr = st, .read_callback = data_read_cb};
    st->started = 1;
    nghttp2_submit_response(st->conn->h2, st->id, hdrs, coding ? 4 : 3, &prd);
}

static void free_cb(const void *data, size_t len, void *arg) { free(arg); }

/* A framed message in the answer's coding: buf replaced by the compressed
 * frame (flag 1), or kept as it is when compressing fails (flag 0 is
 * allowed whatever grpc-encoding says). */
static void frame_compress(struct grpc_stream *st, uint8_t **buf, size_t *len) {
    unsigned char *z;
    size_t zlen;
    if (*len < 5 || http_coding_deflate(st->coding_out, *buf + 5, *len - 5, &z, &zlen)) return;
    uint8_t *f = zlen <= UINT32_MAX ? malloc(zlen + 5) : NULL;
    if (f) {
        grpc_prefix_write(f, 1, zlen);
        memcpy(f + 5, z, zlen);
        free(*buf);
        *buf = f;
        *len = zlen + 5;
    }
    free(z);
}

void grpc_stream_queue(struct grpc_stream *st, uint8_t *buf, size_t len) {
    if (!st->finished && st->coding_out != HTTP_CODING_IDENTITY) frame_compress(st, &buf, &len);
    if (st->finished || evbuffer_add_reference(st->out, buf, len, free_cb, buf)) {
        free(buf);
        return;
    }
    stream_start(st);
}

void grpc_stream_flush(struct grpc_stream *st) { conn_flush(st->conn); }

void grpc_loop_flush(struct grpc_loop *l) {
    for (struct grpc_conn *c = l->conns, *next; c; c = next) {
        next = c->next; /* conn_flush may free c, and only c */
        conn_flush(c);
    }
}

/* grpc-message is percent-encoded: bytes outside printable ASCII, and '%'. */
static char *percent_encode(const char *msg) {
    size_t n = strlen(msg);
    char *out = malloc(3 * n + 1), *o = out;
    for (const unsigned char *p = (const unsigned char *)msg; out && *p; p++) {
        if (*p >= 0x20 && *p <= 0x7e && *p != '%') *o++ = (char)*p;
        else o += sprintf(o, "%%%02X", *p);
    }
    if (out) *o = 0;
    return out;
}

void grpc_stream_finish(struct grpc_stream *st, int status, const char *msg) {
    if (st->finished) return;
    enum grpc_code code = status_grpc(status);
    st->finished = 1;
    st->code = code;
    /* What the client sent and nobody will read no longer counts against
     * the limits (a handler still reading its message frees it after). */
    if (!st->handling) inbuf_release(st);
    st->message = msg && *msg ? percent_encode(msg) : NULL;
    if (!st->started && code != GRPC_OK) {
        /* Trailers-Only: the status in the one HEADERS frame. */
        char c[16];
        snprintf(c, sizeof c, "%d", code);
        nghttp2_nv hdrs[] = {NV(":status", "200"), NV("content-type", "application/grpc"),
                             NV("grpc-accept-encoding", ACCEPT_ENCODING),
                             {(uint8_t *)"grpc-status", (uint8_t *)c, 11, strlen(c), NGHTTP2_NV_FLAG_NONE},
                             {(uint8_t *)"grpc-message", (uint8_t *)st->message, 12,
                              st->message ? strlen(st->message) : 0, NGHTTP2_NV_FLAG_NONE}};
        st->started = 1;
        /* No RST_STREAM for a client still sending (a message over the
         * limit): it could reach the client before the status and turn it
         * into INTERNAL. What it still sends is dropped as it arrives. */
        nghttp2_submit_response(st->conn->h2, st->id, hdrs, st->message ? 5 : 4, NULL);
    } else stream_start(st);
    struct grpc_conn *c = st->conn;
    if (!c->busy) conn_arm(c); /* the last open call ended: the idle deadline may apply (else done after the read) */
    conn_flush(c);
}

void grpc_stream_reply(struct grpc_stream *st, const ProtobufCMessage *m) {
    size_t len;
    uint8_t *buf = grpc_frame(m, &len);
    if (!buf) {
        grpc_stream_finish(st, STATUS_NOMEM, "out of memory");
        return;
    }
    grpc_stream_queue(st, buf, len);
    grpc_stream_finish(st, STATUS_OK, NULL);
}

void grpc_stream_errorf(struct grpc_stream *st, int status, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    grpc_stream_finish(st, status, msg);
}

/* A compressed message (grpc-encoding) inflated into st->plain, never
 * past --grpc-max-message-size: 1, or -1 with the call ended. */
static int message_inflate(struct grpc_stream *st, const uint8_t *z, size_t n, const uint8_t **msg, size_t *len) {
    size_t max = grpc_stream_server(st)->max_message, extra;
    const char *name = http_coding_name(st->coding_in);
    unsigned char *out;
    int rc = http_coding_unpack(st->coding_in, z, n, max, &out, len, &extra);
    if (rc == STATUS_TOO_LARGE)
        grpc_stream_errorf(st, rc,
                           "the request message decompressed (grpc-encoding %s) exceeds --grpc-max-message-size "
                           "(%zu bytes)", name, max);
    else if (rc == STATUS_NOMEM) grpc_stream_errorf(st, rc, "out of memory decompressing the request message");
    else if (rc)
        grpc_stream_errorf(st, rc, "the request message is not valid %s data (grpc-encoding)%s", name,
                           extra ? ": bytes follow the end of its compressed stream" : "");
    if (rc) return -1;
    st->plain = out;
    *msg = out;
    return 1;
}

/* The one check of the message at the head of st->in, made as soon as its
 * 5-byte prefix is there (before the message is), by every path: its
 * compressed flag, and its declared length against --grpc-max-message-size.
 * 0 when it passes or the prefix is not all there yet, -1 with the call
 * ended. */
static int head_check(struct grpc_stream *st) {
    const struct grpc_inbuf *b = &st->in;
    if (b->len - b->off < 5) return 0;
    const uint8_t *h = b->data + b->off;
    size_t n = prefix_len(h), max = grpc_stream_server(st)->max_message;
    if (h[0] > 1 || (h[0] == 1 && st->coding_in == HTTP_CODING_IDENTITY)) {
        grpc_stream_errorf(st, STATUS_INVALID,
                           h[0] > 1 ? "the message's compressed flag is %u: it must be 0 or 1"
                                    : "the message's compressed flag is %u but the call has no grpc-encoding",
                           h[0]);
        return -1;
    }
    if (n > max) {
        grpc_stream_errorf(st, STATUS_TOO_LARGE,
                           "the request message has %zu bytes, more than --grpc-max-message-size (%zu bytes)", n, max);
        return -1;
    }
    return 0;
}

/* The next whole message in st->in: 1 with *msg and *len (in the buffer,
 * or inflated into st->plain: valid until stream_handle consumes it) and
 * *wire (its bytes in the buffer, prefix included), 0 when it has not all
 * arrived, -1 when the call was ended (too large, or badly compressed). */
static int next_message(struct grpc_stream *st, const uint8_t **msg, size_t *len, size_t *wire) {
    const struct grpc_inbuf *b = &st->in;
    if (head_check(st)) return -1;
    if (b->len - b->off < 5) return 0;
    const uint8_t *h = b->data + b->off;
    size_t n = prefix_len(h);
    if (b->len - b->off < n + 5) return 0;
    *wire = n + 5;
    if (h[0] == 0) {
        *msg = h + 5;
        *len = n;
        return 1;
    }
    return message_inflate(st, h + 5, n, msg, len);
}

/* Runs the method's handler on a message from next_message, then takes it
 * out of the buffer (or frees the buffer, when the call ended). */
static void stream_handle(struct grpc_stream *st, const uint8_t *msg, size_t len, size_t wire) {
    st->handling = 1;
    st->method->handle(st, msg, len);
    st->handling = 0;
    free(st->plain);
    st->plain = NULL;
    if (st->finished) inbuf_release(st);
    else inbuf_consume(st, wire);
}

/* A streaming method takes each message as it arrives. */
static void stream_messages(struct grpc_stream *st) {
    const uint8_t *msg;
    size_t len, wire;
    while (!st->finished && next_message(st, &msg, &len, &wire) > 0) stream_handle(st, msg, len, wire);
}

/* The client half-closed: a unary call runs with its one message. */
static void stream_end(struct grpc_stream *st) {
    st->remote_done = 1;
    if (st->finished) return;
    if (st->method->streaming) {
        stream_messages(st);
        if (!st->finished && st->in.len > st->in.off)
            grpc_stream_errorf(st, STATUS_INVALID, "the stream ended inside a message");
        if (!st->finished) grpc_infer_stream_done(st);
        return;
    }
    const uint8_t *msg;
    size_t len, wire;
    int rc = next_message(st, &msg, &len, &wire);
    if (rc < 0) return;
    if (rc == 0 || st->in.len - st->in.off > wire) {
        grpc_stream_errorf(st, STATUS_INVALID, "%s takes exactly one request message",
                           strrchr(st->method->name, '/') + 1);
        return;
    }
    stream_handle(st, msg, len, wire);
}

/* The request headers arrived: is this a call kiln can answer? */
static void stream_check(struct grpc_stream *st) {
    if (st->conn->shed) {
        char why[160];
        shed_reason(st->conn, why, sizeof why);
        grpc_stream_errorf(st, STATUS_UNAVAILABLE, "%s", why);
        nghttp2_submit_goaway(st->conn->h2, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_NO_ERROR, (const uint8_t *)why,
                              strlen(why));
        return;
    }
    if (st->bad_request) {
        grpc_stream_errorf(st, STATUS_INVALID, "not a gRPC request: content-type must be application/grpc");
        return;
    }
    if (st->deadline_ns == UINT64_MAX) {
        grpc_stream_errorf(st, STATUS_INVALID,
                           "grpc-timeout must be 1 to 8 digits and a unit (H, M, S, m, u or n)");
        return;
    }
    if (st->coding_in < 0) {
        /* The gRPC spec's answer: UNIMPLEMENTED, and grpc-accept-encoding
         * (in every answer's headers) lists what would do. */
        grpc_stream_errorf(st, STATUS_UNSUPPORTED, "grpc-encoding '%.100s' is not supported (supported: %s)",
                           st->coding_unknown ? st->coding_unknown : "", ACCEPT_ENCODING);
        return;
    }
    if (st->coding_in != HTTP_CODING_IDENTITY && (st->coding_accepted & (1u << st->coding_in)))
        st->coding_out = st->coding_in;
    st->method = st->path ? grpc_method_find(st->path) : NULL;
    if (!st->method)
        grpc_stream_errorf(st, STATUS_UNSUPPORTED, "unknown or unsupported method %.300s",
                           st->path ? st->path : "(no :path)");
}

/* ==== nghttp2's callbacks ================================================ */

static ssize_t send_cb(nghttp2_session *h2, const uint8_t *data, size_t len, int flags, void *user) {
    struct grpc_conn *c = user;
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) + evbuffer_get_length(c->pend) >= CONN_OUT_HIGH)
        return NGHTTP2_ERR_WOULDBLOCK;
    if (evbuffer_add(c->pend, data, len)) return NGHTTP2_ERR_CALLBACK_FAILURE;
    return (ssize_t)len;
}

static int begin_headers_cb(nghttp2_session *h2, const nghttp2_frame *frame, void *user) {
    struct grpc_conn *c = user;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    struct grpc_stream *st = calloc(1, sizeof *st);
    if (st) st->out = evbuffer_new();
    if (!st || !st->out) {
        if (st) stream_free(st);
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    st->conn = c;
    st->id = frame->hd.stream_id;
    st->opened_ns = clock_now_ns();
    st->next = c->streams;
    if (c->streams) c->streams->prev = st;
    c->streams = st;
    nghttp2_session_set_stream_user_data(h2, st->id, st);
    return 0;
}

/* grpc-timeout: "<1 to 8 digits><unit>", H M S for hours, minutes,
 * seconds, m u n for milli-, micro-, nanoseconds. The deadline, from now on
 * the monotonic clock; UINT64_MAX when the value is malformed. */
static uint64_t parse_timeout(const uint8_t *v, size_t n) {
    static const char units[] = "HMSmun";
    static const uint64_t ns[] = {3600000000000ull, 60000000000ull, 1000000000ull, 1000000ull, 1000ull, 1ull};
    if (n < 2 || n > 9) return UINT64_MAX;
    uint64_t x = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (v[i] < '0' || v[i] > '9') return UINT64_MAX;
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    const char *u = v[n - 1] ? memchr(units, v[n - 1], sizeof units - 1) : NULL;
    if (!u) return UINT64_MAX;
    /* 99999999 hours overflows 64 bits of nanoseconds: such a deadline is none. */
    uint64_t unit = ns[u - units];
    if (x > (UINT64_MAX / 2) / unit) return 0;
    uint64_t d = clock_now_ns() + x * unit;
    return d ? d : 1;
}

/* A message coding's name (grpc-encoding, an item of grpc-accept-encoding):
 * enum http_coding, or -1 for one kiln lacks. */
static int coding_parse(const uint8_t *v, size_t n) {
    if (n == 8 && memcmp(v, "identity", 8) == 0) return HTTP_CODING_IDENTITY;
    if (n == 4 && memcmp(v, "gzip", 4) == 0) return HTTP_CODING_GZIP;
    if (n == 7 && memcmp(v, "deflate", 7) == 0) return HTTP_CODING_DEFLATE;
    return -1;
}

static void header_coding(struct grpc_stream *st, const uint8_t *v, size_t n) {
    st->coding_in = coding_parse(v, n);
    if (st->coding_in < 0 && !st->coding_unknown) st->coding_unknown = strndup((const char *)v, n);
}

/* grpc-accept-encoding: a comma-separated list of names. */
static unsigned codings_accepted(const uint8_t *v, size_t n) {
    unsigned bits = 0;
    for (size_t i = 0; i < n;) {
        while (i < n && (v[i] == ' ' || v[i] == ',')) i++;
        size_t j = i;
        while (j < n && v[j] != ',' && v[j] != ' ') j++;
        int c = coding_parse(v + i, j - i);
        if (c >= 0) bits |= 1u << c;
        i = j;
    }
    return bits;
}

static int header_cb(nghttp2_session *h2, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user) {
    struct grpc_stream *st = nghttp2_session_get_stream_user_data(h2, frame->hd.stream_id);
    if (!st || frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    /* The limit this side advertised (SETTINGS_MAX_HEADER_LIST_SIZE), as
     * RFC 9113 counts it: a header block past it resets the stream. */
    st->header_bytes += namelen + valuelen + 32;
    if (st->header_bytes > MAX_HEADER_LIST) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (namelen == 5 && memcmp(name, ":path", 5) == 0 && !st->path) st->path = strndup((const char *)value, valuelen);
    else if (namelen == 12 && memcmp(name, "grpc-timeout", 12) == 0) st->deadline_ns = parse_timeout(value, valuelen);
    else if (namelen == 13 && memcmp(name, "authorization", 13) == 0 && !st->authorization)
        st->authorization = strndup((const char *)value, valuelen);
    else if (namelen == 13 && memcmp(name, "grpc-encoding", 13) == 0) header_coding(st, value, valuelen);
    else if (namelen == 20 && memcmp(name, "grpc-accept-encoding", 20) == 0)
        st->coding_accepted = codings_accepted(value, valuelen);
    else if (namelen == 7 && memcmp(name, ":method", 7) == 0) st->bad_request |= valuelen != 4 || memcmp(value, "POST", 4);
    else if (namelen == 12 && memcmp(name, "content-type", 12) == 0)
        st->bad_request |= valuelen < 16 || memcmp(value, "application/grpc", 16) != 0;
    return 0;
}

static int data_chunk_cb(nghttp2_session *h2, uint8_t flags, int32_t id, const uint8_t *data, size_t len,
                         void *user) {
    struct grpc_stream *st = nghttp2_session_get_stream_user_data(h2, id);
    if (!st || st->finished || !st->method) return 0; /* answered already: the rest is dropped */
    if (inbuf_append(st, data, len)) return 0;
    if (st->method->streaming) {
        stream_messages(st);
        return 0;
    }
    /* A unary call's message is checked as soon as its prefix is in, and
     * nothing may follow it: the call runs when the client half-closes. */
    if (head_check(st) == 0 && st->in.len - st->in.off >= 5 &&
        st->in.len - st->in.off > prefix_len(st->in.data + st->in.off) + 5)
        grpc_stream_errorf(st, STATUS_INVALID, "%s takes exactly one request message",
                           strrchr(st->method->name, '/') + 1);
    return 0;
}

static int frame_recv_cb(nghttp2_session *h2, const nghttp2_frame *frame, void *user) {
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
    struct grpc_stream *st = nghttp2_session_get_stream_user_data(h2, frame->hd.stream_id);
    if (!st) return 0;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
        st->headers_done = 1;
        st->conn->got_request = 1;
        stream_check(st);
    }
    if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) stream_end(st);
    return 0;
}

/* An answer that ended before its request did (an error, a message over a
 * limit, a deadline): once it is out, RST_STREAM NO_ERROR asks the client
 * to stop sending the rest (RFC 9113, 8.1) and frees the stream, which
 * would otherwise stay open for as long as the client likes. */
static int frame_send_cb(nghttp2_session *h2, const nghttp2_frame *frame, void *user) {
    if ((frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) ||
        !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    struct grpc_stream *st = nghttp2_session_get_stream_user_data(h2, frame->hd.stream_id);
    if (st && !st->remote_done) nghttp2_submit_rst_stream(h2, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_NO_ERROR);
    return 0;
}

static int stream_close_cb(nghttp2_session *h2, int32_t id, uint32_t error_code, void *user) {
    struct grpc_conn *c = user;
    struct grpc_stream *st = nghttp2_session_get_stream_user_data(h2, id);
    if (!st) return 0;
    nghttp2_session_set_stream_user_data(h2, id, NULL);
    stream_unlink(c, st);
    stream_free(st);
    return 0;
}

static nghttp2_session_callbacks *callbacks_new(void) {
    nghttp2_session_callbacks *cb;
    if (nghttp2_session_callbacks_new(&cb)) return NULL;
    nghttp2_session_callbacks_set_send_callback(cb, send_cb);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, begin_headers_cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, header_cb);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, data_chunk_cb);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, frame_recv_cb);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, frame_send_cb);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, stream_close_cb);
    return cb;
}

static nghttp2_option *options_new(void) {
    nghttp2_option *o;
    if (nghttp2_option_new(&o)) return NULL;
    nghttp2_option_set_max_outbound_ack(o, MAX_OUTBOUND_ACK);
    nghttp2_option_set_max_settings(o, MAX_SETTINGS);
    nghttp2_option_set_max_continuations(o, MAX_CONTINUATIONS);
    nghttp2_option_set_stream_reset_rate_limit(o, RESET_BURST, RESET_RATE);
    return o;
}

/* ==== listeners and the loops' jobs ====================================== */

static void accept_cb(struct evconnlistener *lev, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg) {
    struct grpc_loop *l = arg;
    if (runtime_draining(l->srv->rt)) {
        close(fd); /* draining: clients go elsewhere */
        return;
    }
    conn_open(l, fd);
}

static void accept_error_cb(struct evconnlistener *lev, void *arg) {
    log_warn("grpc: accept failed: %s", strerror(errno));
}

/* Before the loops run: nothing else touches the base yet. */
static int loop_listen(struct grpc_loop *l) {
    l->lev = evconnlistener_new(l->base, accept_cb, l, LEV_OPT_CLOSE_ON_FREE, -1, l->fd);
    if (!l->lev) return -1;
    l->fd = -1; /* the listener owns it */
    evconnlistener_set_error_cb(l->lev, accept_error_cb);
    return 0;
}

/* At exit, after the drain: answers may still wait in a connection's
 * buffers (the loop had not written them yet). GOAWAY, then what the socket
 * takes at once; a client too slow to take it loses it. */
static void conn_shutdown(struct grpc_conn *c) {
    if (!c->closing) {
        nghttp2_session_terminate_session(c->h2, NGHTTP2_NO_ERROR);
        if (!c->dead) nghttp2_session_send(c->h2);
    }
    conn_out_move(c);
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    evbuffer_write(bufferevent_get_output(c->bev), fd);
    /* A FIN after the answers, and what the client sent meanwhile read and
     * dropped: closing with unread bytes would reset the connection, and a
     * reset may discard the answers before the client reads them. */
    shutdown(fd, SHUT_WR);
    char sink[4096];
    for (int i = 0; i < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {}
    conn_close(c);
}

/* After the loops stopped (runtime_stop): from the freeing thread. */
static void loop_close(struct grpc_loop *l) {
    if (l->lev) evconnlistener_free(l->lev);
    l->lev = NULL;
    while (l->conns) conn_shutdown(l->conns);
}

/* ==== the server ========================================================= */

static void loop_drain(void *arg) { grpc_health_notify(arg); }

grpc_server_t *grpc_server_create(const struct grpc_server_params *p, char *err, size_t err_len) {
    grpc_server_t *s = calloc(1, sizeof *s);
    if (!s) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        return NULL;
    }
    s->cfg = p->config;
    s->repo = p->repo;
    s->rt = p->runtime;
    s->core = runtime_core(p->runtime);
    const struct server_config *cfg = p->config;
    s->max_message = (size_t)(cfg->grpc_max_message_size > 0 ? cfg->grpc_max_message_size : cfg->max_request_size);
    s->max_buffered = cfg->grpc_max_buffered_bytes > 0 ? (size_t)cfg->grpc_max_buffered_bytes : 2 * (s->max_message + 5);
    s->max_buffered_total =
        cfg->grpc_max_buffered_total > 0 ? (size_t)cfg->grpc_max_buffered_total : 8 * (s->max_message + 5);
    s->idle_secs = cfg->http_timeout_secs > 0 ? cfg->http_timeout_secs : 60; /* as HTTP's idle connections */
    s->header_secs = cfg->http_header_timeout_secs;
    s->body_secs = cfg->http_body_timeout_secs;
    const char *addr = p->config->grpc_address ? p->config->grpc_address : p->config->http_address;
    int n = runtime_loops(p->runtime), port = p->config->grpc_port;
    s->loops = calloc((size_t)n, sizeof *s->loops);
    s->h2_callbacks = callbacks_new();
    s->h2_options = options_new();
    if (!s->loops || !s->h2_callbacks || !s->h2_options) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        goto fail;
    }
    int probe = listen_socket("grpc", addr, port, 1, &port, err, err_len);
    if (probe < 0) goto fail;
    close(probe);
    for (int i = 0; i < n; i++) {
        struct grpc_loop *l = &s->loops[i];
        struct runtime_loop *rl = runtime_loop(p->runtime, i);
        *l = (struct grpc_loop){.srv = s, .rl = rl, .base = runtime_loop_base(rl)};
        runtime_job_init(&l->drain, loop_drain, NULL, l);
        l->fd = listen_socket("grpc", addr, port, 0, &s->port, err, err_len);
        if (l->fd < 0) goto fail;
        s->nloops++;
        port = s->port; /* the others join the port the first one got */
        if (loop_listen(l)) {
            status_set(err, err_len, STATUS_INTERNAL, "libevent could not listen for gRPC on loop %d", i);
            goto fail;
        }
    }
    return s;
fail:
    grpc_server_free(s);
    return NULL;
}

int grpc_server_port(const grpc_server_t *s) { return s->port; }

void grpc_server_begin_drain(grpc_server_t *s) {
    if (!s) return;
    /* Not waited for: the loops run them before they stop. */
    for (int i = 0; i < s->nloops; i++) runtime_post(s->loops[i].rl, &s->loops[i].drain);
}

void grpc_server_free(grpc_server_t *s) {
    if (!s) return;
    for (int i = 0; i < s->nloops; i++) {
        loop_close(&s->loops[i]);
        if (s->loops[i].fd >= 0) close(s->loops[i].fd);
    }
    if (s->h2_callbacks) nghttp2_session_callbacks_del(s->h2_callbacks);
    if (s->h2_options) nghttp2_option_del(s->h2_options);
    free(s->loops);
    free(s);
}
