/* kserve_read.c - the KServe v2 request reader: the JSON header read in one
 * pass straight into a struct kserve_request, the binary tensor payloads
 * after it, Triton's raw binary request, and the bound on what one request
 * may make the server hold. The contract is server/kserve.h.
 *
 * The JSON reader is written here rather than taken from a library because
 * no library Debian 12 packages gives, in one pass, what a request needs:
 * 64-bit integers read exactly, the byte offset of a syntax error, and
 * strings that carry their length (a BYTES element may hold NUL). cJSON
 * reads every number as a double (exact only up to 2^53) and keeps no
 * string length; json-c and jansson build a tree of allocated values
 * first (jansson's integers stop at INT64_MAX). yyjson would do, but it is
 * not in bookworm. cJSON still builds the server's other JSON (metadata,
 * configuration, statistics); no request body goes through it.
 *
 * One pass: each value is read where it stands and stored where it goes. A
 * 'data' array is decoded element by element into the input's own tensor,
 * of its datatype, while the text is read (a number is parsed once, with
 * jsonnum's exact readers); keys the request does not use are checked for
 * syntax and skipped without being kept. The one exception is an input
 * whose 'data' comes before its 'name', 'datatype' or 'shape' (clients
 * write it last): its array is checked when met and decoded when the
 * input's object closes. A request error (a wrong type, a value out of
 * range) is kept as the first one found and the reading goes on, so that a
 * body that is not JSON at all is reported as such, with the byte where
 * the JSON goes wrong. */
#include "server/kserve.h"

#include <float.h>
#include <malloc.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/jsonnum.h"
#include "common/status.h"
#include "config/model_config.h"
#include "models/model.h"
#include "server/kserve_impl.h"
#include "server/shm.h"

size_t kserve_max_request_memory;

void kserve_set_max_request_memory(size_t bytes) { kserve_max_request_memory = bytes; }

#define KSERVE_MAX_TENSORS 1024
#define KSERVE_MAX_JSON_DEPTH 100 /* Triton's limit, and its words below */

/* A parse that held more than this gives the freed memory back to the
 * system (glibc keeps it in the thread's heap otherwise: 20M values left
 * 1.7 GB resident after their request). So does a body past the second
 * bound, whatever the parse held: it came in as many small buffers, freed
 * when the transport made it one block, and glibc keeps those too (a 40 MB
 * body of 20M ignored values left 120 MB resident). */
#define KSERVE_TRIM_BYTES ((size_t)64 << 20)
#define KSERVE_TRIM_BODY_BYTES ((size_t)32 << 20)

/* ---- tensors ------------------------------------------------------------ */

/* A NUL-terminated copy of s[0..n) in r's own room while it lasts (names
 * and ids are short), else malloc'd; NULL when out of memory. */
static char *keep_string(struct kserve_request *r, const char *s, size_t n) {
    char *p;
    if (n + 1 <= sizeof r->strings_l - r->strings_used) {
        p = r->strings_l + r->strings_used;
        r->strings_used += n + 1;
    } else if (!(p = malloc(n + 1))) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static void drop_string(struct kserve_request *r, char *s) {
    uintptr_t a = (uintptr_t)s, room = (uintptr_t)r->strings_l;
    if (a - room >= sizeof r->strings_l) free(s);
}

static void drop_shm(struct kserve_request *r, struct kserve_shm *s) {
    drop_string(r, s->region);
    shm_region_release(s->ref);
}

void kserve_request_clear(struct kserve_request *r) {
    if (!r) return;
    drop_string(r, r->id);
    drop_string(r, r->seq_sid);
    for (int i = 0; i < r->ninputs; i++) {
        struct kserve_input *in = &r->inputs[i];
        drop_string(r, in->name);
        tensor_free_data(&in->t);
        drop_shm(r, &in->shm);
    }
    if (r->inputs != r->inputs_l) free(r->inputs);
    for (int i = 0; i < r->noutputs; i++) {
        drop_string(r, r->outputs[i].name);
        drop_shm(r, &r->outputs[i].shm);
        tensor_free_data(&r->outputs[i].classified);
    }
    free(r->outputs);
    memset(r, 0, sizeof *r);
}

int kserve_request_name_outputs(struct kserve_request *r, const struct model_config *mc) {
    if (r->noutputs) return 0;
    int n = 0;
    for (int i = 0; i < mc->noutputs; i++) n += !mc->outputs[i].hidden;
    if (n == mc->noutputs) return 0;
    struct kserve_output *o = calloc((size_t)n + 1, sizeof *o);
    if (!o) return STATUS_NOMEM;
    free(r->outputs); /* an empty array (gRPC's decoder makes one), or NULL */
    r->outputs = o;
    for (int i = 0; i < mc->noutputs; i++) {
        if (mc->outputs[i].hidden) continue;
        o->binary = -1;
        if (!(o->name = keep_string(r, mc->outputs[i].name, strlen(mc->outputs[i].name)))) return STATUS_NOMEM;
        o++;
        r->noutputs++;
    }
    return 0;
}

int kserve_parse_header_length(const char *value, int64_t *out, char *err, size_t err_len) {
    const char *p = value;
    while (*p == ' ' || *p == '\t') p++;
    int64_t v = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (v > (INT64_MAX - 9) / 10) { digits = 0; break; }
        v = v * 10 + (*p - '0');
    }
    while (*p == ' ' || *p == '\t') p++;
    if (!digits || *p)
        return INVALID("Inference-Header-Content-Length '%.40s' is not a non-negative integer", value);
    *out = v;
    return 0;
}

/* ---- the reader's state and its errors ---------------------------------- */

struct rd {
    const char *base, *p, *end; /* the JSON text; p: the next byte to read */
    int depth;                  /* objects and arrays open, 'data' arrays apart */
    int failed;                 /* err holds the request's first error; later ones are not written */
    int stop;                   /* reading stopped (malformed JSON, nesting, memory): err says why */
    int status;                 /* the error's status */
    int no_header;              /* no Inference-Header-Content-Length header */
    int in_cap, out_cap;        /* room in r->inputs, r->outputs */
    size_t charged;             /* what this request holds, against kserve_max_request_memory */
    struct kserve_request *r;
    struct buf tmp;             /* the latest string with escapes, decoded */
    struct buf bytes;           /* a BYTES input's elements, decoded, until packed */
    char *err;
    size_t err_len;
};

/* A request error: kept when it is the first. */
__attribute__((format(printf, 2, 3))) static void rd_fail(struct rd *d, const char *fmt, ...) {
    if (d->failed) return;
    d->failed = 1;
    d->status = STATUS_INVALID;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err, d->err_len, fmt, ap);
    va_end(ap);
}

/* An error that ends the reading (and replaces any kept one): -1. */
__attribute__((format(printf, 3, 4))) static int stop(struct rd *d, int status, const char *fmt, ...) {
    d->failed = d->stop = 1;
    d->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err, d->err_len, fmt, ap);
    va_end(ap);
    return -1;
}

static int bad_json(struct rd *d, const char *at) {
    return stop(d, STATUS_INVALID, "malformed JSON in the request body at byte %zu%s", (size_t)(at - d->base),
                d->no_header ? " (binary data needs the Inference-Header-Content-Length header)" : "");
}

static int no_memory(struct rd *d) { return stop(d, STATUS_NOMEM, "out of memory reading the request"); }

static int over_budget(struct rd *d) {
    return stop(d, STATUS_INVALID, "reading the request's JSON takes more than the %zu bytes one request may use "
                "(--max-request-memory): send large tensors as binary data", kserve_max_request_memory);
}

/* n more bytes held for this request: 0, or -1 past the bound. */
static int charge(struct rd *d, size_t n) {
    size_t max = kserve_max_request_memory;
    if (max && (d->charged > max || n > max - d->charged)) return -1;
    d->charged += n;
    return 0;
}

/* An input's copy, counted against the request's bound. */
static int charge_input(struct rd *d, const struct kserve_input *in, size_t bytes) {
    if (!charge(d, bytes)) return 0;
    char sh[128];
    return stop(d, STATUS_INVALID, "input '%s' of shape %s: its %zu bytes pass the %zu bytes one request may use "
                "(--max-request-memory)", in->name, tensor_shape_str(&in->t, sh, sizeof sh), bytes,
                kserve_max_request_memory);
}

/* b grew from cap0 bytes of room: counted, or an error. */
static int charge_growth(struct rd *d, const struct buf *b, size_t cap0) {
    if (b->failed) return no_memory(d);
    return b->cap > cap0 && charge(d, b->cap - cap0) ? over_budget(d) : 0;
}

static void nul_error(struct rd *d, const char *key) {
    rd_fail(d, "field '%s' holds a NUL byte (\\u0000): names, ids and parameters may not; only BYTES data may", key);
}

/* ---- JSON lexing -------------------------------------------------------- */

static inline int peek(const struct rd *d) { return d->p < d->end ? (unsigned char)*d->p : -1; }

/* The first byte at or after q that is not JSON whitespace. */
static inline const char *ws_at(const char *q, const char *end) {
    while (q < end && (*q == ' ' || *q == '\n' || *q == '\r' || *q == '\t')) q++;
    return q;
}

static inline void ws(struct rd *d) { d->p = ws_at(d->p, d->end); }

/* The 4 hex digits at p (before end) as a number, or -1. */
static long hex4(const char *p, const char *end) {
    if (end - p < 4) return -1;
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int c = (unsigned char)p[i], x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (x < 0) return -1;
        v = v * 16 + x;
    }
    return v;
}

/* Code point u as UTF-8 in o; its length. */
static size_t utf8_put(long u, unsigned char *o) {
    if (u < 0x80) { o[0] = (unsigned char)u; return 1; }
    if (u < 0x800) { o[0] = (unsigned char)(0xC0 | u >> 6); o[1] = (unsigned char)(0x80 | (u & 0x3F)); return 2; }
    if (u < 0x10000) {
        o[0] = (unsigned char)(0xE0 | u >> 12);
        o[1] = (unsigned char)(0x80 | (u >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (u & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | u >> 18);
    o[1] = (unsigned char)(0x80 | (u >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (u >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (u & 0x3F));
    return 4;
}

/* The string at d->p (its opening quote): its bytes in [*s, *s + *n), in
 * the body when it has no escape, else decoded into d->tmp (good until the
 * next string); *nul says whether one of them is NUL. Bytes below 0x20 pass
 * as they are, as cJSON let them; a UTF-16 surrogate must come as a pair. */
/* The first byte at or after q (before end) that ends a string's plain
 * run: '"', '\\' or NUL. Eight bytes a step where eight remain: a byte
 * equal to c is a zero byte of x ^ c..c, and (v - 0x01..01) & ~v marks the
 * lowest zero byte of v exactly (a borrow only reaches the bytes above
 * it). Keys and names are most of a request's strings. */
static inline const char *str_stop(const char *q, const char *end) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    for (; end - q >= 8; q += 8) {
        uint64_t x, qx, bx;
        memcpy(&x, q, 8);
        qx = x ^ (ones * '"');
        bx = x ^ (ones * '\\');
        uint64_t t = (((x - ones) & ~x) | ((qx - ones) & ~qx) | ((bx - ones) & ~bx)) & high;
        if (t) return q + (__builtin_ctzll(t) >> 3);
    }
#endif
    while (q < end && *q != '"' && *q != '\\' && *q) q++;
    return q;
}

static int rd_string(struct rd *d, const char **s, size_t *n, int *nul) {
    const char *a = d->p + 1, *q = str_stop(a, d->end), *end = d->end;
    if (q < end && *q == '"') {
        *s = a;
        *n = (size_t)(q - a);
        *nul = 0;
        d->p = q + 1;
        return 0;
    }
    size_t cap0 = d->tmp.cap;
    d->tmp.len = 0;
    *nul = 0;
    for (q = a;;) {
        const char *run = q;
        while (q < end && *q != '"' && *q != '\\') q++;
        if (q > run) {
            if (memchr(run, 0, (size_t)(q - run))) *nul = 1;
            buf_add(&d->tmp, run, (size_t)(q - run));
        }
        if (q >= end) return bad_json(d, end);
        if (*q == '"') break;
        if (end - q < 2) return bad_json(d, q);
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *e = q[1] ? strchr(from, q[1]) : NULL;
        if (e) {
            buf_add(&d->tmp, &to[e - from], 1);
            q += 2;
            continue;
        }
        long u = q[1] == 'u' ? hex4(q + 2, end) : -1;
        if (u < 0 || (u >= 0xDC00 && u <= 0xDFFF)) return bad_json(d, q);
        size_t adv = 6;
        if (u >= 0xD800 && u <= 0xDBFF) {
            long lo = end - q >= 12 && q[6] == '\\' && q[7] == 'u' ? hex4(q + 8, end) : -1;
            if (lo < 0xDC00 || lo > 0xDFFF) return bad_json(d, q);
            u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            adv = 12;
        }
        if (!u) *nul = 1;
        unsigned char o[4];
        buf_add(&d->tmp, o, utf8_put(u, o));
        q += adv;
    }
    if (charge_growth(d, &d->tmp, cap0)) return -1;
    *s = d->tmp.data ? d->tmp.data : "";
    *n = d->tmp.len;
    d->p = q + 1;
    return 0;
}

static int literal(struct rd *d, const char *lit, size_t n) {
    if ((size_t)(d->end - d->p) < n || memcmp(d->p, lit, n)) return bad_json(d, d->p);
    d->p += n;
    return 0;
}

/* tritonclient (python-rapidjson) writes non-finite floats as the bare words
 * NaN, Infinity and -Infinity: their length at p, and *v, or 0. */
static size_t nonfinite(const char *p, const char *end, double *v) {
    size_t n = (size_t)(end - p);
    if (n >= 3 && !memcmp(p, "NaN", 3)) { *v = NAN; return 3; }
    if (n >= 8 && !memcmp(p, "Infinity", 8)) { *v = INFINITY; return 8; }
    if (n >= 9 && !memcmp(p, "-Infinity", 9)) { *v = -INFINITY; return 9; }
    return 0;
}

/* A number (or one of the words above, *word then set) at d->p as a double. */
static int rd_double(struct rd *d, double *v, int *word) {
    size_t k = nonfinite(d->p, d->end, v);
    *word = k != 0;
    if (k) d->p += k;
    else if (jsonnum_parse(d->p, d->end, v, &d->p)) return bad_json(d, d->p);
    return 0;
}

/* Opens the object or array at d->p. */
static int enter(struct rd *d) {
    if (++d->depth > KSERVE_MAX_JSON_DEPTH)
        return stop(d, STATUS_INVALID, "JSON nesting depth exceeds maximum allowed limit (%d)", KSERVE_MAX_JSON_DEPTH);
    d->p++;
    ws(d);
    return 0;
}

/* Between the items of an object or array (close is '}' or ']'; first:
 * none read yet): 1 with d->p at the next item, 0 when the container
 * closes here, -1 on an error. */
static inline int next_item(struct rd *d, int first, int close) {
    if (!first) {
        ws(d);
        if (peek(d) != close) {
            if (peek(d) != ',') return bad_json(d, d->p);
            d->p++;
            ws(d);
            return d->p < d->end ? 1 : bad_json(d, d->p);
        }
    } else if (peek(d) != close) return d->p < d->end ? 1 : bad_json(d, d->p);
    d->p++;
    d->depth--;
    return 0;
}

/* The next member of the object being read (*count read so far, 0 right
 * after enter): 1 with its key in [*k, *k + *kn) and d->p at its value, 0
 * when the object closes here, -1 on an error. `in` names the object. */
static int next_member(struct rd *d, int *count, const char **k, size_t *kn, const char *in) {
    int rc = next_item(d, !*count, '}');
    if (rc <= 0) return rc;
    if (peek(d) != '"') return bad_json(d, d->p);
    int nul;
    if (rd_string(d, k, kn, &nul)) return -1;
    if (nul) rd_fail(d, "a JSON key in '%s' holds a NUL byte (\\u0000): keys and names may not", in);
    ws(d);
    if (peek(d) != ':') return bad_json(d, d->p);
    d->p++;
    ws(d);
    ++*count;
    return 1;
}

/* The next element of the array being read: 1 with d->p at it, 0 when the
 * array closes, -1 on an error. */
static int next_elem(struct rd *d, int64_t *count) {
    int rc = next_item(d, !*count, ']');
    if (rc > 0) ++*count;
    return rc;
}

#define KEY(k, kn, lit) ((kn) == sizeof(lit) - 1 && !memcmp((k), (lit), sizeof(lit) - 1))

/* Reads past the value at d->p, checking its syntax; key names it in an
 * error. A string holding NUL is an error unless nul_ok (BYTES data). */
static int skip_value(struct rd *d, const char *key, int nul_ok) {
    const char *s;
    size_t n;
    int nul, rc, word;
    double v;
    switch (peek(d)) {
    case '{': {
        if (enter(d)) return -1;
        int c = 0;
        while ((rc = next_member(d, &c, &s, &n, key)) == 1) {
            char kb[48];
            snprintf(kb, sizeof kb, "%.*s", (int)(n < 40 ? n : 40), s);
            if (skip_value(d, kb, nul_ok)) return -1;
        }
        return rc;
    }
    case '[': {
        if (enter(d)) return -1;
        int64_t c = 0;
        while ((rc = next_elem(d, &c)) == 1)
            if (skip_value(d, key, nul_ok)) return -1;
        return rc;
    }
    case '"':
        if (rd_string(d, &s, &n, &nul)) return -1;
        if (nul && !nul_ok) nul_error(d, key);
        return 0;
    case 't': return literal(d, "true", 4);
    case 'f': return literal(d, "false", 5);
    case 'n': return literal(d, "null", 4);
    case -1: return bad_json(d, d->p);
    default: return rd_double(d, &v, &word);
    }
}

/* Skips the value of a member the request does not use. */
static int skip_member(struct rd *d, const char *k, size_t kn) {
    char kb[48];
    snprintf(kb, sizeof kb, "%.*s", (int)(kn < 40 ? kn : 40), k);
    return skip_value(d, kb, 0);
}

/* An unsigned integer of at most max at d->p, exact for a plain integer (a
 * double's for a number with a fraction or an exponent): *ok says whether
 * the value is one; anything else is read past. */
static int rd_uint(struct rd *d, const char *key, double max, uint64_t *out, int *ok) {
    *ok = 0;
    int c = peek(d);
    if (c != '-' && (c < '0' || c > '9')) return skip_value(d, key, 0);
    int neg;
    uint64_t mag;
    int k = jsonnum_parse_int(d->p, d->end, &neg, &mag, &d->p);
    if (k == JSONNUM_INT) {
        *ok = (!neg || !mag) && (double)mag <= max;
        *out = neg ? 0 : mag;
        return 0;
    }
    if (k == JSONNUM_INT_BIG) return 0;
    double v;
    int word;
    if (rd_double(d, &v, &word)) return -1;
    *ok = v >= 0 && v == floor(v) && v <= max && v < 18446744073709551616.0; /* 2^64 == (double)UINT64_MAX */
    if (*ok) *out = (uint64_t)v;
    return 0;
}

/* true or false at d->p: *ok says whether it is one. */
static int rd_bool(struct rd *d, const char *key, int *out, int *ok) {
    *ok = peek(d) == 't' || peek(d) == 'f';
    if (!*ok) return skip_value(d, key, 0);
    *out = peek(d) == 't';
    return *out ? literal(d, "true", 4) : literal(d, "false", 5);
}

/* A string without NUL at d->p, copied into r: *out set, or left NULL
 * when the value is not a non-empty string. */
static int rd_name(struct rd *d, const char *key, char **out) {
    if (peek(d) != '"') return skip_value(d, key, 0);
    const char *s;
    size_t n;
    int nul;
    if (rd_string(d, &s, &n, &nul)) return -1;
    if (nul) nul_error(d, key);
    else if (n && !(*out = keep_string(d->r, s, n))) return no_memory(d);
    return 0;
}

/* ---- typed data --------------------------------------------------------- */

/* A 'data' array being decoded into its input's tensor. */
struct dfill {
    struct kserve_input *in;
    int64_t i;        /* elements read */
    int64_t numel;    /* elements the shape needs */
    int store;        /* decode (else count only: an error was found, or the shape cannot fit) */
};

/* The integer datatypes' bounds: the largest magnitude above and below zero. */
static int int_range(enum dtype dt, uint64_t *pos, uint64_t *neg) {
    switch (dt) {
    case DT_INT8: *pos = INT8_MAX; *neg = 128; return 0;
    case DT_UINT8: *pos = UINT8_MAX; *neg = 0; return 0;
    case DT_INT16: *pos = INT16_MAX; *neg = 32768; return 0;
    case DT_UINT16: *pos = UINT16_MAX; *neg = 0; return 0;
    case DT_INT32: *pos = INT32_MAX; *neg = (uint64_t)INT32_MAX + 1; return 0;
    case DT_UINT32: *pos = UINT32_MAX; *neg = 0; return 0;
    case DT_INT64: *pos = INT64_MAX; *neg = (uint64_t)INT64_MAX + 1; return 0;
    case DT_UINT64: *pos = UINT64_MAX; *neg = 0; return 0;
    default: return -1;
    }
}

static void type_error(struct rd *d, struct dfill *f, int64_t i) {
    const struct kserve_input *in = f->in;
    enum dtype dt = in->t.dtype;
    f->store = 0;
    if (dt == DT_STRING) rd_fail(d, "input '%s': data[%lld] must be a string (datatype BYTES)", in->name, (long long)i);
    else if (dt == DT_BOOL)
        rd_fail(d, "input '%s': data[%lld] must be true or false (datatype BOOL)", in->name, (long long)i);
    else rd_fail(d, "input '%s': data[%lld] must be a number (datatype %s)", in->name, (long long)i, dtype_kserve_name(dt));
}

/* Element i of a floating-point input: v, read from a number or (word) from
 * one of the non-finite words or strings. A finite number past the type's
 * range would silently become infinity: refused; the words send one. */
static void put_float(struct rd *d, struct dfill *f, int64_t i, double v, int word) {
    struct tensor *t = &f->in->t;
    double max = t->dtype == DT_FP32 ? FLT_MAX : t->dtype == DT_FP16 ? 65504 : DBL_MAX;
    if (!word && !(fabs(v) <= max)) {
        f->store = 0;
        rd_fail(d, "input '%s': data[%lld] = %g is out of range for %s", f->in->name, (long long)i, v,
             dtype_kserve_name(t->dtype));
        return;
    }
    if (t->dtype == DT_FP32) ((float *)t->data)[i] = (float)v;
    else if (t->dtype == DT_FP64) ((double *)t->data)[i] = v;
    else ((uint16_t *)t->data)[i] = fp32_to_fp16((float)v);
}

/* Element i of an integer input, -mag when neg: exact over the type's whole
 * range (64 bits included); [a, b) is its text, for the error. */
static void put_int(struct rd *d, struct dfill *f, int64_t i, int neg, uint64_t mag, int big, const char *a,
                    const char *b) {
    struct tensor *t = &f->in->t;
    uint64_t pos, negmax;
    int_range(t->dtype, &pos, &negmax);
    if (big || mag > (neg ? negmax : pos)) {
        f->store = 0;
        rd_fail(d, "input '%s': data[%lld] = %.*s is out of range for %s", f->in->name, (long long)i,
             (int)(b - a < 48 ? b - a : 48), a, dtype_kserve_name(t->dtype));
        return;
    }
    uint64_t u = neg ? 0 - mag : mag; /* two's complement: the signed types take their bits */
    switch (t->dtype) {
    case DT_INT8: case DT_UINT8: ((uint8_t *)t->data)[i] = (uint8_t)u; break;
    case DT_INT16: case DT_UINT16: ((uint16_t *)t->data)[i] = (uint16_t)u; break;
    case DT_INT32: case DT_UINT32: ((uint32_t *)t->data)[i] = (uint32_t)u; break;
    default: ((uint64_t *)t->data)[i] = u; break;
    }
}

/* Element i of an integer input written with a fraction or an exponent
 * ("2.0", "1e3"): its double must be integral, and for the 64-bit types
 * within +-(2^53 - 1), where such a double stops being exact. */
static void put_int_double(struct rd *d, struct dfill *f, int64_t i, double v) {
    struct tensor *t = &f->in->t;
    const char *dn = dtype_kserve_name(t->dtype);
    uint64_t pos, negmax;
    int_range(t->dtype, &pos, &negmax);
    int wide = t->dtype == DT_INT64 || t->dtype == DT_UINT64;
    if (v != floor(v) || !isfinite(v) || v < -(double)negmax || v > (double)pos) {
        f->store = 0;
        rd_fail(d, "input '%s': data[%lld] = %g is not a valid %s", f->in->name, (long long)i, v, dn);
        return;
    }
    if (wide && fabs(v) > 9007199254740991.0) {
        f->store = 0;
        rd_fail(d, "input '%s': data[%lld] = %.17g is outside +-(2^53 - 1), where a number with a fraction or an "
             "exponent stops being exact: write %s values this large as plain integers", f->in->name, (long long)i,
             v, dn);
        return;
    }
    put_int(d, f, i, v < 0, (uint64_t)fabs(v), 0, NULL, NULL);
}

/* A string element: a BYTES one (its bytes kept in d->bytes, in element
 * order), or a floating-point one that names a non-finite value. */
static int data_string(struct rd *d, struct dfill *f, int64_t i, int store) {
    const char *s;
    size_t n;
    int nul;
    if (rd_string(d, &s, &n, &nul)) return -1;
    if (!store) return 0;
    struct tensor *t = &f->in->t;
    if (t->dtype == DT_STRING) {
        size_t cap0 = d->bytes.cap;
        buf_add(&d->bytes, s, n);
        if (charge_growth(d, &d->bytes, cap0)) return -1;
        ((struct tensor_str *)t->data)[i] = (struct tensor_str){NULL, n}; /* p set once the array ends */
        return 0;
    }
    double v = 0;
    if ((t->dtype == DT_FP32 || t->dtype == DT_FP64 || t->dtype == DT_FP16) && nonfinite(s, s + n, &v) == n)
        put_float(d, f, i, v, 1);
    else type_error(d, f, i);
    return 0;
}

/* One element that is not an array. */
static int data_leaf(struct rd *d, struct dfill *f) {
    int64_t i = f->i++;
    int store = f->store && i < f->numel;
    struct tensor *t = &f->in->t;
    int c = peek(d);
    double v;
    if (c == '"') return data_string(d, f, i, store);
    if (c == 't' || c == 'f' || c == 'n' || c == '{') {
        if (c == 't' ? literal(d, "true", 4) : c == 'f' ? literal(d, "false", 5) : skip_value(d, "data", 1)) return -1;
        if (!store) return 0;
        if (t->dtype == DT_BOOL && c != 'n' && c != '{') ((uint8_t *)t->data)[i] = c == 't';
        else type_error(d, f, i);
        return 0;
    }
    int word;
    uint64_t pos, negmax;
    if (t->dtype != DT_BOOL && t->dtype != DT_STRING && !int_range(t->dtype, &pos, &negmax)) {
        const char *a = d->p;
        int neg;
        uint64_t mag;
        int k = jsonnum_parse_int(d->p, d->end, &neg, &mag, &d->p);
        if (k == JSONNUM_INT || k == JSONNUM_INT_BIG) {
            if (store) put_int(d, f, i, neg, mag, k == JSONNUM_INT_BIG, a, d->p);
            return 0;
        }
        if (rd_double(d, &v, &word)) return -1;
        if (!store) return 0;
        if (word) type_error(d, f, i);
        else put_int_double(d, f, i, v);
        return 0;
    }
    if (rd_double(d, &v, &word)) return -1;
    if (!store) return 0;
    if (t->dtype == DT_FP32 || t->dtype == DT_FP64 || t->dtype == DT_FP16) put_float(d, f, i, v, word);
    else type_error(d, f, i);
    return 0;
}

/* The common case in a tight loop: the run of finite numbers that starts
 * an FP32 array (d->p at its first element), stored as they are read. The
 * count read, with d->p after the last; data_leaf takes anything else. */
static int64_t fp32_run(struct rd *d, struct dfill *f) {
    if (!f->store || f->i >= f->numel) return 0;
    float *out = f->in->t.data;
    size_t c = jsonnum_parse_f32_run(d->p, d->end, out + f->i, (size_t)(f->numel - f->i), &d->p);
    f->i += (int64_t)c;
    return (int64_t)c;
}

/* The array at d->p, nested `level` deep in 'data': its leaves in order. */
static int data_array(struct rd *d, struct dfill *f, int level) {
    if (level > KSERVE_MAX_JSON_DEPTH)
        return stop(d, STATUS_INVALID, "input '%s': JSON nesting depth exceeds maximum allowed limit (%d) in 'data'",
                    f->in->name, KSERVE_MAX_JSON_DEPTH);
    d->p++;
    d->depth++; /* closed by next_elem; 'data' has its own bound */
    ws(d);
    int64_t c = f->in->t.dtype == DT_FP32 ? fp32_run(d, f) : 0;
    int rc;
    while ((rc = next_elem(d, &c)) == 1)
        if (peek(d) == '[' ? data_array(d, f, level + 1) : data_leaf(d, f)) return -1;
    return rc;
}

/* An input's 'data' (at d->p), flat or nested, decoded into in->t, whose
 * name, datatype and shape are known. */
static int read_data(struct rd *d, struct kserve_input *in) {
    struct tensor *t = &in->t;
    int64_t numel = tensor_numel(t);
    int had = d->failed;
    /* Each element takes at least two bytes of the text ("1,"): a shape
     * that needs more elements than that is not what the array holds, and
     * is not allocated; the array is only counted, for the error. */
    int64_t room = (int64_t)((d->end - d->p) / 2 + 1);
    struct dfill f = {.in = in, .numel = numel, .store = !had && numel >= 0 && numel <= room};
    if (f.store) {
        int str = t->dtype == DT_STRING;
        if (charge_input(d, in, (size_t)numel * (str ? 2 * sizeof(struct tensor_str) : dtype_size(t->dtype))))
            return -1;
        if (str) t->data = calloc((size_t)numel + 1, sizeof(struct tensor_str));
        else tensor_alloc_data(t);
        if (!t->data) return no_memory(d);
        d->bytes.len = 0;
    }
    if (peek(d) == '[' ? data_array(d, &f, 1) : data_leaf(d, &f)) return -1;
    if (f.i != numel) {
        char sh[128];
        d->failed = had; /* a count that differs outweighs an element's error */
        rd_fail(d, "input '%s': 'data' has %lld elements but shape %s needs %lld", in->name, (long long)f.i,
             tensor_shape_str(t, sh, sizeof sh), (long long)numel);
        return 0;
    }
    if (!f.store || t->dtype != DT_STRING) return 0;
    /* The elements' bytes lie in d->bytes one after the other; the tensor
     * gets its own block of them. */
    struct tensor_str *strs = t->data;
    const char *at = d->bytes.data;
    for (int64_t k = 0; at && k < numel; k++) {
        strs[k].p = at;
        at += strs[k].len;
    }
    if (tensor_strings_pack(t, strs)) return no_memory(d);
    free(strs);
    return 0;
}

/* ---- inputs and outputs ------------------------------------------------- */

/* A tensor's 'parameters', as read: each one's presence and whether its
 * value is one the reader takes. The checks come once the tensor's object
 * closes, in a fixed order, whatever order the keys came in. */
struct tparams {
    int seen, not_object;
    int bds, bds_ok;        /* binary_data_size */
    int region, region_ok;  /* shared_memory_region (kept in the tensor's kserve_shm) */
    int size, size_ok;      /* shared_memory_byte_size */
    int off, off_ok;        /* shared_memory_offset */
    int bin, bin_ok, bin_v; /* binary_data */
    int cls, cls_ok;        /* classification */
    uint64_t bds_v, size_v, off_v, cls_v;
};

static int read_tparams(struct rd *d, struct kserve_shm *shm, struct tparams *tp) {
    tp->seen = 1;
    if (peek(d) != '{') {
        tp->not_object = 1;
        return skip_value(d, "parameters", 0);
    }
    if (enter(d)) return -1;
    int c = 0, rc;
    const char *k;
    size_t kn;
    while ((rc = next_member(d, &c, &k, &kn, "parameters")) == 1) {
        if (KEY(k, kn, "binary_data_size") && !tp->bds++) rc = rd_uint(d, "binary_data_size", 9e15, &tp->bds_v, &tp->bds_ok);
        else if (KEY(k, kn, "shared_memory_byte_size") && !tp->size++)
            rc = rd_uint(d, "shared_memory_byte_size", 2e19, &tp->size_v, &tp->size_ok);
        else if (KEY(k, kn, "shared_memory_offset") && !tp->off++)
            rc = rd_uint(d, "shared_memory_offset", 2e19, &tp->off_v, &tp->off_ok);
        else if (KEY(k, kn, "classification") && !tp->cls++) rc = rd_uint(d, "classification", 1e6, &tp->cls_v, &tp->cls_ok);
        else if (KEY(k, kn, "binary_data") && !tp->bin++) rc = rd_bool(d, "binary_data", &tp->bin_v, &tp->bin_ok);
        else if (KEY(k, kn, "shared_memory_region") && !tp->region++) {
            rc = rd_name(d, "shared_memory_region", &shm->region);
            tp->region_ok = shm->region != NULL;
        } else rc = skip_member(d, k, kn);
        if (rc) return -1;
    }
    return rc;
}

/* The shared-memory checks of a tensor whose parameters name a region. */
static void check_shm(struct rd *d, const struct tparams *tp, struct kserve_shm *s, const char *what, const char *n) {
    if (!tp->region_ok) rd_fail(d, "%s '%s': parameters.shared_memory_region must be a non-empty string", what, n);
    else if (!tp->size) rd_fail(d, "%s '%s': parameters.shared_memory_byte_size is missing (shared memory needs it)", what, n);
    else if (!tp->size_ok || (tp->off && !tp->off_ok))
        rd_fail(d, "%s '%s': parameters.%s must be an integer >= 0", what, n,
             tp->size_ok ? "shared_memory_offset" : "shared_memory_byte_size");
    s->byte_size = tp->size_v;
    s->offset = tp->off ? tp->off_v : 0;
}

/* What an input's object said about it, checked when it closes. */
struct tdesc {
    int dt;                 /* datatype: 0 absent, 1 read (in->t.dtype), 2 not a string */
    char dt_text[40];
    int shape;              /* shape: 0 absent, 1 read, 2 not an array */
    int shape_over;         /* more than TENSOR_MAX_DIMS dims */
    int bad_dim;            /* the first dim that is not an integer >= 0, or -1 */
    const char *data;       /* where 'data' is, NULL when absent */
    int data_read;
    struct tparams tp;
};

static int read_shape(struct rd *d, struct kserve_input *in, struct tdesc *t) {
    t->shape = 2;
    if (peek(d) != '[') return skip_value(d, "shape", 0);
    if (enter(d)) return -1;
    t->shape = 1;
    int64_t c = 0;
    int rc;
    while ((rc = next_elem(d, &c)) == 1) {
        if (c > TENSOR_MAX_DIMS) {
            t->shape_over = 1;
            if (skip_value(d, "shape", 0)) return -1;
            continue;
        }
        uint64_t v = 0;
        int ok;
        /* Any dim an int64 holds: what the shape's product may be is
         * checked when the input closes (Triton's overflow messages). */
        if (rd_uint(d, "shape", 9.2e18, &v, &ok)) return -1;
        if (!ok && t->bad_dim < 0) t->bad_dim = (int)c - 1;
        in->t.dims[in->t.ndim++] = (int64_t)v;
    }
    return rc;
}

/* Whether an input's 'data' can be decoded where it stands: what the
 * checks at its end need is known and good. */
static int data_ready(const struct rd *d, const struct kserve_input *in, const struct tdesc *t) {
    int c = peek(d);
    return !d->failed && in->name && t->dt == 1 && in->t.dtype != DT_UNDEFINED && in->t.dtype != DT_BF16 &&
           t->shape == 1 && !t->shape_over && t->bad_dim < 0 && !t->tp.bds && !t->tp.region && c != 'n' && c != '{' &&
           tensor_numel(&in->t) <= INT64_MAX / 16; /* else finish_input names the overflow */
}

/* The checks at the end of input i's object, in the order they are made
 * whatever order the keys came in; then its data when it is still unread. */
static int finish_input(struct rd *d, struct kserve_input *in, int i, struct tdesc *t) {
    const char *n = in->name;
    char sh[128];
    const struct tparams *tp = &t->tp;
    if (!n) {
        rd_fail(d, "field 'inputs[%d].name' must be a non-empty string", i);
        return 0;
    }
    if (t->dt != 1) rd_fail(d, "input '%s': field 'datatype' is missing or not a string", n);
    else if (in->t.dtype == DT_UNDEFINED)
        rd_fail(d, "input '%s': datatype '%.32s' is not one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, "
             "INT32, INT64, FP16, BF16, FP32, FP64, BYTES", n, t->dt_text);
    else if (t->shape != 1) rd_fail(d, "input '%s': field 'shape' is missing or not an array", n);
    else if (t->shape_over) rd_fail(d, "input '%s': field 'shape' has more than %d dims", n, TENSOR_MAX_DIMS);
    else if (t->bad_dim >= 0) rd_fail(d, "input '%s': shape[%d] must be an integer >= 0", n, t->bad_dim);
    else if (tensor_numel(&in->t) == INT64_MAX)
        rd_fail(d, "input '%s': shape %s causes total element count to exceed maximum size of %lld", n,
                tensor_shape_str(&in->t, sh, sizeof sh), (long long)INT64_MAX);
    else if (in->t.dtype != DT_STRING && tensor_numel(&in->t) > INT64_MAX / (int64_t)dtype_size(in->t.dtype))
        rd_fail(d, "byte size overflow for input '%s': shape %s of %s needs more than %lld bytes", n,
                tensor_shape_str(&in->t, sh, sizeof sh), dtype_kserve_name(in->t.dtype), (long long)INT64_MAX);
    else if (tp->not_object) rd_fail(d, "input '%s': field 'parameters' must be an object", n);
    else if (!t->data && !tp->bds && !tp->region)
        rd_fail(d, "input '%s': has neither 'data' nor parameters.binary_data_size nor parameters.shared_memory_region", n);
    else if (!!t->data + !!tp->bds + !!tp->region > 1)
        rd_fail(d, "input '%s': has both %s and %s; send one", n, t->data ? "'data'" : "parameters.binary_data_size",
             tp->region ? "parameters.shared_memory_region" : "parameters.binary_data_size");
    else if (tp->region) check_shm(d, tp, &in->shm, "input", n);
    else if (tp->bds && !tp->bds_ok) rd_fail(d, "input '%s': parameters.binary_data_size must be an integer >= 0", n);
    else if (tp->bds) {
        in->binary = 1;
        in->binary_size = (size_t)tp->bds_v;
    } else if (in->t.dtype == DT_BF16)
        /* FP16 as JSON numbers, as tritonclient sends them; BF16 has no JSON
         * form there (numpy has no bfloat16). */
        rd_fail(d, "input '%s': datatype %s cannot be sent as JSON data; use the binary tensor extension", n,
             dtype_kserve_name(in->t.dtype));
    else if (*t->data == 'n' || *t->data == '{')
        rd_fail(d, "input '%s': 'data' must be an array of values (flat or nested), not %s", n,
             *t->data == 'n' ? "null" : "an object");
    else if (!t->data_read && !d->failed) {
        const char *resume = d->p;
        int depth = d->depth;
        d->p = t->data;
        if (read_data(d, in)) return -1;
        d->p = resume;
        d->depth = depth;
    }
    return 0;
}

static int read_input(struct rd *d, struct kserve_input *in, int i) {
    if (peek(d) != '{') {
        rd_fail(d, "field 'inputs[%d]' must be an object", i);
        return skip_value(d, "inputs", 0);
    }
    if (enter(d)) return -1;
    struct tdesc t = {.bad_dim = -1};
    int c = 0, rc;
    const char *k;
    size_t kn;
    while ((rc = next_member(d, &c, &k, &kn, "inputs")) == 1) {
        if (KEY(k, kn, "name") && !in->name) rc = rd_name(d, "name", &in->name);
        else if (KEY(k, kn, "datatype") && !t.dt) {
            const char *s;
            size_t n;
            int nul;
            t.dt = 2;
            if (peek(d) != '"') rc = skip_value(d, "datatype", 0);
            else if (!(rc = rd_string(d, &s, &n, &nul))) {
                t.dt = 1;
                n = n < 32 ? n : 32;
                memcpy(t.dt_text, s, n);
                t.dt_text[n] = 0;
                if (nul) nul_error(d, "datatype");
                in->t.dtype = nul ? DT_UNDEFINED : dtype_from_kserve(t.dt_text);
            }
        } else if (KEY(k, kn, "shape") && !t.shape) rc = read_shape(d, in, &t);
        else if (KEY(k, kn, "parameters") && !t.tp.seen) rc = read_tparams(d, &in->shm, &t.tp);
        else if (KEY(k, kn, "data") && !t.data) {
            t.data = d->p;
            t.data_read = data_ready(d, in, &t);
            rc = t.data_read ? read_data(d, in) : skip_value(d, "data", 1);
        } else rc = skip_member(d, k, kn);
        if (rc) return -1;
    }
    if (rc) return -1;
    return finish_input(d, in, i, &t);
}

static int read_output(struct rd *d, struct kserve_output *o, int i) {
    o->binary = -1;
    if (peek(d) != '{') {
        rd_fail(d, "field 'outputs[%d]' must be an object", i);
        return skip_value(d, "outputs", 0);
    }
    if (enter(d)) return -1;
    struct tparams tp = {0};
    int c = 0, rc;
    const char *k;
    size_t kn;
    while ((rc = next_member(d, &c, &k, &kn, "outputs")) == 1) {
        if (KEY(k, kn, "name") && !o->name) rc = rd_name(d, "name", &o->name);
        else if (KEY(k, kn, "parameters") && !tp.seen) rc = read_tparams(d, &o->shm, &tp);
        else rc = skip_member(d, k, kn);
        if (rc) return -1;
    }
    if (rc) return -1;
    const char *n = o->name;
    if (!n) rd_fail(d, "field 'outputs[%d].name' must be a non-empty string", i);
    else if (tp.not_object) rd_fail(d, "output '%s': field 'parameters' must be an object", n);
    else if (tp.bin && !tp.bin_ok) rd_fail(d, "output '%s': parameters.binary_data must be true or false", n);
    else if (tp.cls && !tp.cls_ok) rd_fail(d, "output '%s': parameters.classification must be an integer >= 0", n);
    if (d->failed) return 0;
    if (tp.bin) o->binary = tp.bin_v;
    if (tp.cls) o->classification = (int)tp.cls_v;
    if (!tp.region) return 0;
    if (o->classification)
        rd_fail(d, "output '%s': parameters.shared_memory_region and parameters.classification cannot both be set", n);
    else if (o->binary == 1)
        rd_fail(d, "output '%s': parameters.shared_memory_region and parameters.binary_data true cannot both be set", n);
    else check_shm(d, &tp, &o->shm, "output", n);
    return 0;
}

/* One more entry in r->inputs (outputs): zeroed, and counted at once so
 * that clear frees what reading it makes. */
static void *add_tensor(struct rd *d, int outputs) {
    struct kserve_request *r = d->r;
    int *n = outputs ? &r->noutputs : &r->ninputs, *cap = outputs ? &d->out_cap : &d->in_cap;
    size_t size = outputs ? sizeof *r->outputs : sizeof *r->inputs;
    void **arr = outputs ? (void **)&r->outputs : (void **)&r->inputs;
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 4;
        if (c > KSERVE_MAX_TENSORS) c = KSERVE_MAX_TENSORS;
        int inline_room = *arr == (void *)r->inputs_l;
        void *a = inline_room ? malloc((size_t)c * size) : realloc(*arr, (size_t)c * size);
        if (!a) return NULL;
        if (inline_room) memcpy(a, r->inputs_l, sizeof r->inputs_l);
        *arr = a;
        *cap = c;
    }
    char *e = (char *)*arr + (size_t)*n * size;
    memset(e, 0, size);
    ++*n;
    return e;
}

/* 'inputs' or 'outputs'. */
static int read_tensors(struct rd *d, int outputs) {
    const char *what = outputs ? "outputs" : "inputs";
    struct kserve_request *r = d->r;
    if (peek(d) != '[') {
        rd_fail(d, "field '%s' must be an array", what);
        return skip_value(d, what, 0);
    }
    if (enter(d)) return -1;
    int64_t c = 0;
    int rc;
    while ((rc = next_elem(d, &c)) == 1) {
        if (c == KSERVE_MAX_TENSORS + 1) {
            d->failed = 0; /* said first, as the count was checked first before */
            rd_fail(d, "field '%s' has more than %d entries", what, KSERVE_MAX_TENSORS);
        }
        if (d->failed) {
            if (skip_value(d, what, 1)) return -1;
            continue;
        }
        void *e = add_tensor(d, outputs);
        if (!e) return no_memory(d);
        int i = (int)c - 1;
        if (outputs ? read_output(d, e, i) : read_input(d, e, i)) return -1;
        if (d->failed) continue;
        const char *name = outputs ? r->outputs[i].name : r->inputs[i].name;
        for (int k = 0; k < i; k++)
            if (!strcmp(outputs ? r->outputs[k].name : r->inputs[k].name, name)) {
                rd_fail(d, "%s '%s' already exists in request (it appears twice in '%s')", outputs ? "output" : "input", name,
                        what);
                break;
            }
    }
    if (rc) return -1;
    if (!outputs && c == 0) rd_fail(d, "field 'inputs' is empty");
    return 0;
}

/* The request's own 'parameters'. */
static int read_params(struct rd *d) {
    struct kserve_request *r = d->r;
    if (peek(d) != '{') {
        rd_fail(d, "field 'parameters' must be an object");
        return skip_value(d, "parameters", 0);
    }
    if (enter(d)) return -1;
    int c = 0, rc, ok, b;
    unsigned seen = 0;
    const char *k;
    size_t kn;
    uint64_t v;
    /* Integers first (priority, timeout, sequence_id), then booleans. */
    static const char *const keys[] = {"priority", "timeout", "sequence_id", "binary_data_output", "cache",
                                       "sequence_start", "sequence_end"};
    while ((rc = next_member(d, &c, &k, &kn, "parameters")) == 1) {
        int w = -1;
        for (int j = 0; j < 7 && w < 0; j++)
            if (kn == strlen(keys[j]) && !memcmp(k, keys[j], kn) && !(seen >> j & 1)) w = j;
        if (w < 0) {
            if (skip_member(d, k, kn)) return -1;
            continue;
        }
        seen |= 1u << w;
        if (w == 2 && peek(d) == '"') { /* a string correlation ID */
            const char *sv;
            size_t n;
            int nul;
            if (rd_string(d, &sv, &n, &nul)) return -1;
            if (nul) nul_error(d, "parameters.sequence_id");
            else if (!n) rd_fail(d, "parameters.sequence_id must be a non-empty string or an integer > 0");
            else if (!(r->seq_sid = keep_string(r, sv, n))) return no_memory(d);
            continue;
        }
        /* A correlation ID takes any uint64 (Triton's); priority and timeout are bounded as before. */
        if (w < 3 ? rd_uint(d, keys[w], w == 2 ? 18446744073709551615.0 : 1.8e19, &v, &ok) : rd_bool(d, keys[w], &b, &ok))
            return -1;
        if (!ok) rd_fail(d, "parameters.%s must be %s", keys[w],
                         w == 2 ? "an integer >= 0 or a string" : w < 2 ? "an integer >= 0" : "true or false");
        else if (w == 0) r->priority = (int64_t)(v > 1000000 ? 1000000 : v);
        else if (w == 1) r->timeout_us = v;
        else if (w == 2) r->seq_id = v;
        else if (w == 3) r->binary_data_output = b;
        else if (w == 4) r->no_cache = !b;
        else if (w == 5) r->seq_start = b;
        else r->seq_end = b;
    }
    return rc;
}

static int read_root(struct rd *d) {
    ws(d);
    if (peek(d) != '{') {
        if (skip_value(d, "the request", 0)) return -1;
        rd_fail(d, "the request body must be a JSON object");
        return 0;
    }
    if (enter(d)) return -1;
    int c = 0, rc;
    unsigned seen = 0;
    const char *k;
    size_t kn;
    while ((rc = next_member(d, &c, &k, &kn, "the request")) == 1) {
        int w = KEY(k, kn, "id") ? 1 : KEY(k, kn, "parameters") ? 2 : KEY(k, kn, "inputs") ? 3 : KEY(k, kn, "outputs") ? 4 : 0;
        if (!w || (seen >> w & 1)) rc = skip_member(d, k, kn);
        else if (w == 1) {
            const char *s;
            size_t n;
            int nul;
            if (peek(d) != '"') {
                rd_fail(d, "field 'id' must be a string");
                rc = skip_value(d, "id", 0);
            } else if (!(rc = rd_string(d, &s, &n, &nul))) {
                if (nul) nul_error(d, "id");
                else if (!(d->r->id = keep_string(d->r, s, n))) rc = no_memory(d);
            }
        } else if (w == 2) rc = read_params(d);
        else rc = read_tensors(d, w == 4);
        if (rc) return -1;
        seen |= 1u << w;
    }
    if (rc) return -1;
    if (!(seen >> 3 & 1)) rd_fail(d, "field 'inputs' is missing");
    return 0;
}

/* ---- the body ----------------------------------------------------------- */

static int read_binary(struct rd *d, struct kserve_input *in, const uint8_t *p, size_t avail) {
    const char *n = in->name;
    char sh[128];
    if (in->binary_size > avail)
        return stop(d, STATUS_INVALID, "input '%s': parameters.binary_data_size is %zu but only %zu bytes of binary "
                    "data are left in the body", n, in->binary_size, avail);
    int64_t numel = tensor_numel(&in->t);
    if (in->t.dtype != DT_STRING) {
        size_t need = tensor_nbytes(&in->t);
        if (numel == INT64_MAX || need != in->binary_size)
            return stop(d, STATUS_INVALID, "input '%s': parameters.binary_data_size is %zu but shape %s of %s needs "
                        "%zu bytes", n, in->binary_size, tensor_shape_str(&in->t, sh, sizeof sh),
                        dtype_kserve_name(in->t.dtype), numel == INT64_MAX ? SIZE_MAX : need);
        if (charge_input(d, in, need)) return -1;
        if (tensor_alloc_data(&in->t)) return no_memory(d);
        memcpy(in->t.data, p, need);
        return 0;
    }
    char why[160];
    int rc = tensor_strings_from_prefixed(&in->t, p, in->binary_size, why, sizeof why);
    if (rc == STATUS_INVALID)
        return stop(d, STATUS_INVALID, "input '%s' of shape %s: %s", n, tensor_shape_str(&in->t, sh, sizeof sh), why);
    return rc ? no_memory(d) : 0;
}

/* The binary tensor data after the JSON header, input by input. */
static int read_payloads(struct rd *d, const uint8_t *p, size_t json_len, size_t len, int64_t header_len) {
    struct kserve_request *r = d->r;
    size_t pos = json_len;
    for (int i = 0; i < r->ninputs; i++) {
        if (!r->inputs[i].binary) continue;
        if (header_len < 0)
            return stop(d, STATUS_INVALID, "input '%s' has parameters.binary_data_size but the request has no "
                        "Inference-Header-Content-Length header", r->inputs[i].name);
        if (read_binary(d, &r->inputs[i], p + pos, len - pos)) return -1;
        pos += r->inputs[i].binary_size;
    }
    if (pos != len)
        return stop(d, STATUS_INVALID, "the body has %zu bytes of binary data after the JSON header but the inputs' "
                    "parameters.binary_data_size add up to %zu", len - json_len, pos - json_len);
    return 0;
}

/* Triton's raw binary request (Inference-Header-Content-Length: 0): the
 * body is the one input's bytes, with no JSON. They are kept as one BYTES
 * element; kserve_request_bind gives them the model's input name, datatype
 * and shape. Every output is answered as binary data. */
static int read_raw(struct kserve_request *r, const void *body, size_t len, char *err, size_t err_len) {
    if (kserve_max_request_memory && len > kserve_max_request_memory)
        return INVALID("the raw binary request's %zu bytes pass the %zu bytes one request may use "
                       "(--max-request-memory)", len, kserve_max_request_memory);
    r->raw = 1;
    r->binary_data_output = 1;
    r->inputs = r->inputs_l;
    r->ninputs = 1;
    struct kserve_input *in = &r->inputs[0];
    in->t = (struct tensor){.dtype = DT_STRING, .ndim = 1, .dims = {1}};
    in->binary = 1;
    in->binary_size = len;
    struct tensor_str s = {len ? body : NULL, len};
    if (tensor_strings_pack(&in->t, &s)) {
        kserve_request_clear(r);
        return status_set(err, err_len, STATUS_NOMEM, "out of memory for the raw binary request");
    }
    return 0;
}

int kserve_request_parse(struct kserve_request *r, const void *body, size_t len, int64_t header_len,
                         char *err, size_t err_len) {
    memset(r, 0, sizeof *r);
    size_t json_len = len;
    if (header_len >= 0) {
        if ((uint64_t)header_len > len)
            return INVALID("Inference-Header-Content-Length %lld is out of range: the body has %zu bytes",
                           (long long)header_len, len);
        if (header_len == 0) {
            int rc = read_raw(r, body, len, err, err_len);
            if (len > KSERVE_TRIM_BODY_BYTES) malloc_trim(0);
            return rc;
        }
        json_len = (size_t)header_len;
    }
    if (json_len == 0) return INVALID("the request body is empty: expected a JSON inference request");
    struct rd d = {.base = body, .p = body, .end = (const char *)body + json_len, .no_header = header_len < 0,
                   .in_cap = KSERVE_INLINE_INPUTS, .r = r, .err = err, .err_len = err_len};
    r->inputs = r->inputs_l;
    if (!read_root(&d)) {
        ws(&d);
        if (d.p < d.end)
            stop(&d, STATUS_INVALID, "unexpected bytes after the JSON header at byte %zu%s", (size_t)(d.p - d.base),
                 d.no_header ? " (binary data needs the Inference-Header-Content-Length header)" : "");
    }
    buf_free(&d.tmp);
    buf_free(&d.bytes);
    if (!d.failed) read_payloads(&d, body, json_len, len, header_len);
    if (d.charged > KSERVE_TRIM_BYTES || len > KSERVE_TRIM_BODY_BYTES) malloc_trim(0);
    if (d.failed) {
        kserve_request_clear(r);
        return d.status;
    }
    return 0;
}
