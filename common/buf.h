/* buf.h - a growable byte buffer with a sticky failure.
 *
 * The answer encoders append many small pieces (a number, a comma) and check
 * once at the end. So a failed growth is remembered rather than returned:
 * b->failed is set, every later append is a no-op (no retried realloc per
 * element, no half-written text that looks complete), and the caller answers
 * with an error when it is set.
 *
 * A buffer may also carry a limit: growth past limit bytes fails the same
 * way, with failed = BUF_OVER_LIMIT, so an encoder's memory is bounded by
 * what the caller allows rather than by what malloc gives.
 *
 * Test hook: KILN_FAULT_ALLOC_ENCODE=N (read once, at start) makes the Nth
 * growth of any buffer in the process fail as if realloc had, so tests can
 * check that an encoder turns a failed allocation into an error answer.
 *
 * A zeroed struct buf is empty and valid; buf_free(NULL) is a no-op. One
 * thread at a time per buffer. */
#ifndef KILN_BUF_H
#define KILN_BUF_H

#include <stddef.h>
#include <string.h>

enum buf_failure {
    BUF_OK = 0,
    BUF_NOMEM = 1,      /* realloc failed (or the fault hook said so) */
    BUF_OVER_LIMIT = 2, /* growth past b->limit */
};

struct buf {
    char *data;
    size_t len, cap;
    size_t limit; /* 0: none */
    int failed;   /* enum buf_failure; once set, appends do nothing */
};

/* Room for extra more bytes after len: 0, or -1 with b->failed set (and
 * then always -1). Appends reserve one byte more than they write, so data
 * may be NUL-terminated in place. */
int buf_grow(struct buf *b, size_t extra); /* buf_reserve's growth (and failure) */
static inline int buf_reserve(struct buf *b, size_t extra) {
    return !b->failed && extra <= b->cap - b->len ? 0 : buf_grow(b, extra);
}

/* Appends n bytes (buf_str: a string without its NUL). Inline, as the
 * encoders append many short pieces: a literal's length and copy are then
 * known where it is appended, and only a growth makes a call. */
static inline void buf_add(struct buf *b, const void *p, size_t n) {
    if (buf_reserve(b, n + 1)) return;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
}
static inline void buf_str(struct buf *b, const char *s) { buf_add(b, s, strlen(s)); }

void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Frees the bytes and zeroes b (limit included). */
void buf_free(struct buf *b);

#endif
