/* http_conn.c - the HTTP transport's connections: what every connection's
 * bytes pass through before evhttp reads them, and accept() at the open
 * file limit. See http_impl.h.
 *
 * evhttp reads each connection through a filter bufferevent over the
 * socket's (evhttp_set_bevcb): the input filter runs http_guard over the
 * bytes before evhttp parses them, so framing evhttp would read differently
 * than RFC 9112 (or answer with an HTML page) never reaches it; it also keeps
 * the header and body deadlines (from a request's first byte, and from the
 * end of its header: a connection that sends nothing is left to the idle
 * --http-timeout-secs, as clients keep pooled ones open) and counts connections against
 * --max-connections. A refused connection is answered by kiln itself with a
 * KServe JSON error, written straight to the socket, which is then
 * half-closed and drained (bounded) so the client reads the answer instead of
 * a reset; evhttp is told the connection failed only then.
 *
 * The output filter writes evhttp's replies straight to the socket, so
 * evhttp's "reply written" (and a Connection: close) comes when the kernel
 * has the bytes, not when they moved between two buffers. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "server/http_impl.h"
#include "server/infer.h"
#include "server/kserve.h"


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
#define CONN_RETRY_MAX_MS 1000
#define RATELOG_NS (10ull * 1000000000ull)

enum conn_state { CONN_OPEN, CONN_FAILING, CONN_LINGER, CONN_DONE };
enum conn_deadline { DEADLINE_NONE, DEADLINE_HEADER, DEADLINE_BODY };

struct http_conn {
    struct io_thread *io;        /* not in conn_free: the base may finalize c after the server is freed */
    runtime_t *rt;               /* for conn_free: they outlive the bases */
    shm_registry_t *shm;
    struct bufferevent *filter;  /* evhttp's end */
    struct bufferevent *sock;    /* the socket's end */
    struct event *timer;         /* a deadline, the retry of a pending answer, the end of the linger */
    struct event *kick;          /* writes a reply evhttp queued while its writing was off */
    struct event *writable;      /* the socket can take the rest of a reply (made when first needed) */
    struct http_guard g;
    enum conn_state state;
    enum conn_deadline deadline;
    int counted;                 /* holds one of --max-connections */
    int shed;
    int wrote;                   /* the error answer is in the kernel and the write side shut */
    int retry_ms;
    int kicked;                  /* kick is active: later additions need not activate it again */
    size_t cur_fwd;              /* bytes of the request in progress already given to evhttp */
    uint64_t discarded, discard_max;
    int status;                  /* the refusal to answer (common/status.h) */
    char msg[300];
};

static struct log_every accept_log;

/* evhttp still holds the connection. Between evhttp freeing it and the
 * filter's destructor (which frees c) the callbacks are already cleared. */
static int conn_alive(struct http_conn *c) {
    bufferevent_event_cb ecb = NULL;
    bufferevent_getcb(c->filter, NULL, NULL, &ecb, NULL);
    return ecb != NULL;
}

/* evhttp waits for the bytes of the request in progress (its input holds
 * no earlier, complete request) and has nothing to write: an answer from
 * kiln now cannot overtake or interleave with one of evhttp's. */
static int conn_quiet(struct http_conn *c) {
    return bufferevent_getfd(c->sock) >= 0 && (bufferevent_get_enabled(c->filter) & EV_READ) &&
           evbuffer_get_length(bufferevent_get_input(c->filter)) <= c->cur_fwd &&
           !evbuffer_get_length(bufferevent_get_output(c->filter)) && !evbuffer_get_length(bufferevent_get_output(c->sock));
}

static void conn_set_deadline(struct http_conn *c, enum conn_deadline d) {
    if (d == c->deadline) return;
    c->deadline = d;
    const struct server_config *cfg = c->io->srv->cfg;
    int secs = d == DEADLINE_HEADER ? cfg->http_header_timeout_secs : d == DEADLINE_BODY ? cfg->http_body_timeout_secs : 0;
    if (secs <= 0) {
        evtimer_del(c->timer);
        return;
    }
    struct timeval tv = {secs, 0};
    evtimer_add(c->timer, &tv);
}

static void conn_finish(struct http_conn *c) {
    if (c->state == CONN_DONE) return;
    c->state = CONN_DONE;
    bufferevent_setcb(c->sock, NULL, NULL, NULL, NULL);
    bufferevent_disable(c->sock, EV_READ | EV_WRITE);
    if (c->writable) event_del(c->writable);
    evtimer_del(c->timer);
    event_active(c->timer, EV_TIMEOUT, 1); /* hands the connection back to evhttp to free, outside any callback of its */
}

static void conn_linger_read_cb(struct bufferevent *bev, void *arg) {
    struct http_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    c->discarded += evbuffer_get_length(in);
    evbuffer_drain(in, evbuffer_get_length(in));
    if (c->discarded > c->discard_max) conn_finish(c);
}

static void conn_linger_write_cb(struct bufferevent *bev, void *arg) {
    struct http_conn *c = arg;
    if (!c->wrote && !evbuffer_get_length(bufferevent_get_output(bev))) {
        shutdown(bufferevent_getfd(bev), SHUT_WR);
        c->wrote = 1;
    }
}

static void conn_linger_event_cb(struct bufferevent *bev, short what, void *arg) { conn_finish(arg); }

/* The head of a JSON error answer with status (its code and reason phrase
 * from common/status.h's table) that closes the connection. */
static int error_head(char *head, size_t len, int status, size_t body_len) {
    int code = status_http(status);
    return snprintf(head, len,
                    "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                    code, status_http_phrase(code), body_len);
}

/* Writes the pending error answer, shuts the write side and drains what the
 * client still sends, on the socket's bufferevent, which stops feeding evhttp. */
static void conn_emit(struct http_conn *c) {
    c->state = CONN_LINGER;
    struct buf b = {0};
    kserve_error_body(&b, c->msg);
    char head[256];
    int hl = error_head(head, sizeof head, c->status, b.len);
    struct iovec iov[2] = {{head, (size_t)hl}, {b.data, b.len}};
    evutil_socket_t fd = bufferevent_getfd(c->sock);
    evbuffer_drain(bufferevent_get_input(c->sock), evbuffer_get_length(bufferevent_get_input(c->sock)));
    bufferevent_setcb(c->sock, conn_linger_read_cb, conn_linger_write_cb, conn_linger_event_cb, c);
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
    ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) w = errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    if (w >= 0) {
        size_t total = (size_t)hl + b.len, at = (size_t)w;
        if (at < (size_t)hl) bufferevent_write(c->sock, head + at, (size_t)hl - at);
        if (at < total) bufferevent_write(c->sock, b.data + (at > (size_t)hl ? at - (size_t)hl : 0),
                                          b.len - (at > (size_t)hl ? at - (size_t)hl : 0));
        else {
            shutdown(fd, SHUT_WR);
            c->wrote = 1;
        }
    }
    buf_free(&b);
    if (w < 0) {
        conn_finish(c);
        return;
    }
    uint64_t mrs = CONN_LINGER_413_LIMITS * (uint64_t)c->io->srv->cfg->max_request_size;
    int big = c->status == STATUS_TOO_LARGE;
    int ms = c->shed ? CONN_SHED_LINGER_MS : big ? CONN_LINGER_413_MS : CONN_LINGER_MS;
    c->discard_max = c->shed ? CONN_SHED_LINGER_BYTES
                     : big   ? (mrs > CONN_LINGER_413_MIN_BYTES ? mrs : CONN_LINGER_413_MIN_BYTES)
                             : CONN_LINGER_BYTES;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    bufferevent_enable(c->sock, EV_READ | EV_WRITE);
    evtimer_add(c->timer, &tv);
}

/* Answers when evhttp is quiet, else retries soon (backing off). */
static void conn_try_answer(struct http_conn *c) {
    if (conn_quiet(c)) {
        conn_emit(c);
        return;
    }
    struct timeval tv = {c->retry_ms / 1000, (c->retry_ms % 1000) * 1000};
    evtimer_add(c->timer, &tv);
    c->retry_ms = c->retry_ms ? (c->retry_ms * 2 > CONN_RETRY_MAX_MS ? CONN_RETRY_MAX_MS : c->retry_ms * 2) : 10;
}

/* Refuses the connection: status and msg are answered and it is closed. */
static void conn_fail(struct http_conn *c, int status, const char *msg) {
    if (c->state != CONN_OPEN) return;
    c->state = CONN_FAILING;
    c->status = status;
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    evtimer_del(c->timer);
    c->deadline = DEADLINE_NONE;
    conn_try_answer(c);
}

static void conn_timer_cb(evutil_socket_t fd, short what, void *arg) {
    struct http_conn *c = arg;
    if (!conn_alive(c)) return;
    char msg[160];
    switch (c->state) {
    case CONN_OPEN:
        if (c->deadline == DEADLINE_HEADER)
            snprintf(msg, sizeof msg, "the request header did not arrive within --http-header-timeout-secs (%d s)",
                     c->io->srv->cfg->http_header_timeout_secs);
        else
            snprintf(msg, sizeof msg, "the request body did not arrive within --http-body-timeout-secs (%d s)",
                     c->io->srv->cfg->http_body_timeout_secs);
        c->deadline = DEADLINE_NONE;
        conn_fail(c, STATUS_IO_TIMEOUT, msg);
        break;
    case CONN_FAILING: conn_try_answer(c); break;
    case CONN_LINGER: conn_finish(c); break;
    case CONN_DONE:
        /* evhttp frees a connection whose read failed while it waits for a request. */
        bufferevent_trigger_event(c->filter, BEV_EVENT_ERROR | BEV_EVENT_READING, 0);
        break;
    }
}

static enum bufferevent_filter_result conn_input(struct evbuffer *src, struct evbuffer *dst, ev_ssize_t limit,
                                                 enum bufferevent_flush_mode mode, void *arg) {
    struct http_conn *c = arg;
    if (c->state != CONN_OPEN) {
        evbuffer_drain(src, evbuffer_get_length(src));
        return BEV_NEED_MORE;
    }
    int moved = 0;
    size_t len;
    while ((len = evbuffer_get_length(src)) > 0) {
        uint64_t d = http_guard_data_left(&c->g);
        uint64_t done = c->g.requests;
        if (d) {
            size_t k = d < len ? (size_t)d : len;
            evbuffer_remove_buffer(src, dst, k);
            http_guard_skip(&c->g, k);
            c->cur_fwd = c->g.requests == done ? c->cur_fwd + k : 0;
            moved = 1;
            continue;
        }
        /* A header block needs up to CONN_MAX_HEADER bytes in view; a chunk-size line a few. */
        size_t big = CONN_MAX_HEADER + 2, want = http_guard_phase(&c->g, 1) == HTTP_GUARD_BODY ? 64 : big;
        if (want > len) want = len;
        ssize_t r = http_guard_feed(&c->g, (const char *)evbuffer_pullup(src, (ev_ssize_t)want), want);
        if (r == 0 && want < len && want < big) {
            want = len < big ? len : big;
            r = http_guard_feed(&c->g, (const char *)evbuffer_pullup(src, (ev_ssize_t)want), want);
        }
        if (r < 0) {
            conn_fail(c, c->g.status, c->g.msg);
            break;
        }
        if (r == 0) break;
        evbuffer_remove_buffer(src, dst, (size_t)r);
        c->cur_fwd = c->g.requests == done ? c->cur_fwd + (size_t)r : 0;
        moved = 1;
    }
    if (c->state == CONN_OPEN) {
        enum http_guard_phase ph = http_guard_phase(&c->g, evbuffer_get_length(src) > 0);
        conn_set_deadline(c, ph == HTTP_GUARD_HEADER ? DEADLINE_HEADER : ph == HTTP_GUARD_BODY ? DEADLINE_BODY
                                                                                              : DEADLINE_NONE);
    }
    return moved ? BEV_OK : BEV_NEED_MORE;
}

static void conn_kick_cb(evutil_socket_t fd, short what, void *arg);

static enum bufferevent_filter_result conn_output(struct evbuffer *src, struct evbuffer *dst, ev_ssize_t limit,
                                                  enum bufferevent_flush_mode mode, void *arg) {
    struct http_conn *c = arg;
    if (c->state >= CONN_LINGER) {
        evbuffer_drain(src, evbuffer_get_length(src));
        return BEV_OK;
    }
    evutil_socket_t fd = bufferevent_getfd(c->sock);
    if (evbuffer_write(src, fd) < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        /* The peer is gone: what is left is dropped, and evhttp hears of it
         * from the socket's bufferevent (an error on its next read). */
        evbuffer_drain(src, evbuffer_get_length(src));
        return BEV_OK;
    }
    if (!evbuffer_get_length(src)) return BEV_OK;
    /* The kernel took only part. The rest stays in evhttp's buffer until
     * the socket is writable (conn_kick_cb flushes it, holding a reference
     * on the filter), so evhttp hears of completion only when all is out. */
    if (!c->writable) c->writable = event_new(c->io->base, fd, EV_WRITE, conn_kick_cb, c);
    if (c->writable) event_add(c->writable, NULL);
    return BEV_NEED_MORE;
}

/* evhttp queued reply bytes while its writing was off; it turns writing on
 * right after, which does not run the filter by itself. A reply is added
 * in several pieces (status line, headers, body): the kick is activated
 * once for them all (event_active takes the base's lock each time). */
static void conn_outbuf_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg) {
    struct http_conn *c = arg;
    if (info->n_added && !c->kicked && !(bufferevent_get_enabled(c->filter) & EV_WRITE)) {
        c->kicked = 1;
        event_active(c->kick, EV_TIMEOUT, 1);
    }
}

/* bufferevent_flush holds a reference on the filter while evhttp's write
 * callback runs (and may free the connection). */
static void conn_kick_cb(evutil_socket_t fd, short what, void *arg) {
    struct http_conn *c = arg;
    c->kicked = 0;
    if (conn_alive(c) && evbuffer_get_length(bufferevent_get_output(c->filter)))
        bufferevent_flush(c->filter, EV_WRITE, BEV_NORMAL);
}

/* The filter's destructor. libevent may defer it to runtime_free's
 * event_base_free, after http_server_free: c->io is gone by then. */
static void conn_free(void *arg) {
    struct http_conn *c = arg;
    /* The connection's shared-memory regions go with it (server/shm.h). */
    shm_drop_owner(c->shm, shm_owner_of(c->filter));
    event_free(c->timer);
    event_free(c->kick);
    if (c->writable) event_free(c->writable);
    if (c->counted) runtime_conn_release(c->rt);
    free(c);
}

/* evhttp's bevcb: the bufferevent of a connection just accepted (its socket
 * is set by evhttp right after). Over --max-connections the connection is
 * answered 503 and closed at once rather than left waiting. */
struct bufferevent *http_conn_new(struct event_base *base, void *arg) {
    struct io_thread *io = arg;
    http_server_t *s = io->srv;
    struct http_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->io = io;
    c->rt = s->rt;
    c->shm = infer_core_shm(s->core);
    http_guard_init(&c->g, &s->guard);
    c->sock = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    c->timer = evtimer_new(base, conn_timer_cb, c);
    c->kick = event_new(base, -1, 0, conn_kick_cb, c);
    c->filter = c->sock && c->timer && c->kick
                    ? bufferevent_filter_new(c->sock, conn_input, conn_output, BEV_OPT_CLOSE_ON_FREE, conn_free, c)
                    : NULL;
    if (!c->filter) {
        if (c->sock) bufferevent_free(c->sock);
        if (c->timer) event_free(c->timer);
        if (c->kick) event_free(c->kick);
        free(c);
        return NULL; /* evhttp makes a plain bufferevent */
    }
    evbuffer_add_cb(bufferevent_get_output(c->filter), conn_outbuf_cb, c);
    /* Replies go out through conn_output, never through the socket's
     * bufferevent: it does not watch writability, and the filter's write
     * callback on it goes. libevent 2.1's runs evhttp's write callback
     * without holding a reference on the filter, so a reply that closes the
     * connection would free the filter there and then re-arm its write
     * timeout, leaving a freed event in the timer heap. */
    bufferevent_disable(c->sock, EV_WRITE);
    bufferevent_data_cb rcb;
    bufferevent_event_cb ecb;
    void *farg;
    bufferevent_getcb(c->sock, &rcb, NULL, &ecb, &farg);
    bufferevent_setcb(c->sock, rcb, NULL, ecb, farg);
    if (!runtime_conn_admit(s->rt, "HTTP, answered 503")) {
        c->shed = 1;
        char msg[200];
        snprintf(msg, sizeof msg, "the server has --max-connections (%d) connections open: try again later",
                 runtime_max_connections(s->rt));
        conn_fail(c, STATUS_UNAVAILABLE, msg);
    } else c->counted = 1;
    return c->filter;
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
void http_conn_accept_error(struct evconnlistener *lev, void *arg) {
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
