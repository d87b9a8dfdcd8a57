#include "common/buf.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- test hook: KILN_FAULT_ALLOC_ENCODE --------------------------------
 * Read once before main. Every growth pays one relaxed atomic decrement only
 * when the hook is set; a server started without it pays one load. */
static atomic_long fault_countdown; /* > 0: growths left until the failing one */

__attribute__((constructor)) static void buf_fault_init(void) {
    const char *v = getenv("KILN_FAULT_ALLOC_ENCODE");
    long n = v ? strtol(v, NULL, 10) : 0;
    atomic_init(&fault_countdown, n > 0 ? n : 0);
}

static int fault_now(void) {
    if (atomic_load_explicit(&fault_countdown, memory_order_relaxed) <= 0) return 0;
    return atomic_fetch_sub_explicit(&fault_countdown, 1, memory_order_relaxed) == 1;
}

/* ---- the buffer ----------------------------------------------------------- */

int buf_grow(struct buf *b, size_t extra) {
    if (b->failed) return -1;
    if (extra <= b->cap - b->len) return 0;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->failed = BUF_NOMEM;
        return -1;
    }
    size_t need = b->len + extra;
    if (b->limit && need > b->limit) {
        b->failed = BUF_OVER_LIMIT;
        return -1;
    }
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < need) cap *= 2;
    if (b->limit && cap > b->limit) cap = b->limit; /* need fits: the limit is the last growth */
    char *d = fault_now() ? NULL : realloc(b->data, cap);
    if (!d) {
        b->failed = BUF_NOMEM;
        return -1;
    }
    b->data = d;
    b->cap = cap;
    return 0;
}

void buf_printf(struct buf *b, const char *fmt, ...) {
    if (buf_reserve(b, 64)) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= b->cap - b->len) {
        if (buf_reserve(b, (size_t)n + 1)) return;
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

void buf_free(struct buf *b) {
    if (!b) return;
    free(b->data);
    memset(b, 0, sizeof *b);
}
