/* kserve_read.c - the KServe v2 request reader: the numeric prescan ahead
 * of cJSON, the JSON header into a struct kserve_request, the binary tensor
 * payloads after it, and the per-thread parse arena that bounds what one
 * request may make the server hold. The contract is server/kserve.h. */
#include "server/kserve.h"

#include <float.h>
#include <malloc.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/buf.h"
#include "common/jsonnum.h"
#include "common/status.h"
#include "config/model_config.h"
#include "models/model.h"
#include "server/kserve_impl.h"
#include "server/shm.h"

size_t kserve_max_request_memory;

void kserve_set_max_request_memory(size_t bytes) { kserve_max_request_memory = bytes; }

static int parse_charge(size_t n);
#define KSERVE_MAX_TENSORS 1024
#define KSERVE_MAX_JSON_DEPTH 64

/* ---- tensors ------------------------------------------------------------ */

/* A copy of s in r's own room while it lasts (names and ids are short),
 * else strdup'd; NULL when out of memory. */
static char *keep_string(struct kserve_request *r, const char *s) {
    size_t n = strlen(s) + 1;
    if (n > sizeof r->strings_l - r->strings_used) return strdup(s);
    char *p = memcpy(r->strings_l + r->strings_used, s, n);
    r->strings_used += n;
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

/* ---- request parsing ---------------------------------------------------- */

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

/* Counts the leaves of a (possibly nested) JSON array; -1 if too deep. */
static int64_t count_leaves(const cJSON *a, int depth) {
    if (depth > KSERVE_MAX_JSON_DEPTH) return -1;
    if (!cJSON_IsArray(a)) return 1;
    int64_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        int64_t k = count_leaves(e, depth + 1);
        if (k < 0) return -1;
        n += k;
    }
    return n;
}

/* ---- NUL in JSON strings ------------------------------------------------
 *
 * cJSON decodes "\u0000" to a NUL byte inside valuestring but keeps no
 * length, so every reader would stop at it: the BYTES element "ab\u0000cd"
 * would become "ab", an input named "x\u0000junk" would bind to x. A
 * request whose JSON holds a NUL (escaped, or raw where the transport lets
 * one through) is therefore rewritten before cJSON reads it so that no
 * string decodes to a NUL: inside strings a NUL becomes the bytes 0x01 '0'
 * and a 0x01 becomes 0x01 0x01 (escaped ones as escapes, raw ones raw, which
 * cJSON copies as they are: the text at most doubles). After the parse
 * json_nul_decode undoes that in place, keeps each string's length in the
 * node's valuedouble (which cJSON leaves 0 in a string node) and refuses a
 * NUL anywhere but in the strings of a 'data' array (BYTES elements): in a
 * name, an id, a key or a parameter it is an error. Requests without a NUL,
 * nearly all, skip both steps; in those that have one, a JSON error's byte
 * offset counts the rewritten text. */

static const char nul_as[] = "\\u00010", one_as[] = "\\u0001\\u0001", raw_nul_as[] = "\x01" "0",
                  raw_one_as[] = "\x01\x01";

static int json_may_hold_nul(const void *text, size_t len) {
    if (memchr(text, 0, len)) return 1;
    /* Backslash by backslash (a body of numbers has none: one memchr pass),
     * not memmem's search at every byte. A backslash always starts a pair,
     * so the byte after it is never the start of another escape. */
    const char *p = text, *end = p + len;
    while ((p = memchr(p, '\\', (size_t)(end - p)))) {
        if (end - p >= 6 && !memcmp(p + 1, "u0000", 5)) return 1;
        p += end - p >= 2 ? 2 : 1;
    }
    return 0;
}

/* The JSON text[0..len) rewritten as above, followed by the tail bytes
 * (binary tensor data) unchanged; *out_len is the JSON's new length. NULL
 * when out of memory. */
static char *nul_escape(const char *text, size_t len, const void *tail, size_t tail_len, size_t *out_len) {
    char *out = NULL;
    size_t o = 0;
    for (int pass = 0; pass < 2; pass++) {
        int in_str = 0;
        o = 0;
        for (size_t i = 0; i < len;) {
            unsigned char c = (unsigned char)text[i];
            const char *rep = NULL;
            size_t adv = 1;
            if (!in_str) in_str = c == '"';
            else if (c == '"') in_str = 0;
            else if (c == '\\' && len - i >= 6 && text[i + 1] == 'u' && !memcmp(text + i + 2, "000", 3) &&
                     (text[i + 5] == '0' || text[i + 5] == '1')) {
                rep = text[i + 5] == '0' ? nul_as : one_as;
                adv = 6;
            } else if (c == '\\') adv = len - i >= 2 ? 2 : 1; /* any other escape is copied whole */
            else if (c <= 1) rep = c ? raw_one_as : raw_nul_as;
            size_t n = rep ? strlen(rep) : adv;
            if (out) memcpy(out + o, rep ? rep : text + i, n);
            o += n;
            i += adv;
        }
        if (!pass && !(out = malloc(o + tail_len + 1))) return NULL;
    }
    if (tail_len) memcpy(out + o, tail, tail_len);
    *out_len = o;
    return out;
}

/* Undoes nul_escape in the C string s, in place; its length in bytes. */
static size_t nul_unescape(char *s) {
    char *w = s;
    for (const char *r = s; *r; r++) {
        if (r[0] == 1 && (r[1] == '0' || r[1] == 1)) *w++ = *++r == '0' ? 0 : 1;
        else *w++ = *r;
    }
    *w = 0;
    return (size_t)(w - s);
}

/* Decodes every key and string under node (see above); in_data: node is a
 * 'data' array or nested in one. key names node's field for errors. */
static int json_nul_decode(cJSON *node, const char *key, int in_data, char *err, size_t err_len) {
    for (cJSON *c = node->child; c; c = c->next) {
        const char *k = key;
        if (c->string) {
            if (nul_unescape(c->string) != strlen(c->string))
                return INVALID("a JSON key holds a NUL byte (\\u0000) after '%s' (in '%s'): names may not hold NUL",
                               c->string, key ? key : "the request");
            k = c->string;
        }
        if (cJSON_IsString(c) && c->valuestring) {
            size_t n = nul_unescape(c->valuestring);
            if (n != strlen(c->valuestring) && !in_data)
                return INVALID("field '%s' holds a NUL byte (\\u0000): names, ids and parameters may not; only BYTES "
                               "data may", k ? k : "?");
            c->valuedouble = (double)n + 1;
        }
        int data = cJSON_IsArray(c) && (c->string ? !strcmp(c->string, "data") : in_data);
        int rc = c->child ? json_nul_decode(c, k, data, err, err_len) : 0;
        if (rc) return rc;
    }
    return 0;
}

/* The byte length of string node v: json_nul_decode's count when the
 * request held a NUL, else its C string's (which then has none inside). */
static size_t json_str_len(const cJSON *v) {
    return v->valuedouble >= 1 ? (size_t)v->valuedouble - 1 : strlen(v->valuestring);
}

struct fill {
    struct kserve_input *in;
    int64_t i;
    char *err;
    size_t err_len;
};

static int fill_number(struct fill *f, double d);

static int fill_leaf(struct fill *f, const cJSON *v) {
    if (cJSON_IsNumber(v)) return fill_number(f, v->valuedouble);
    struct tensor *t = &f->in->t;
    int64_t i = f->i++;
    const char *dn = dtype_kserve_name(t->dtype);
    if (t->dtype == DT_STRING) {
        if (!cJSON_IsString(v))
            return status_set(f->err, f->err_len, STATUS_INVALID, "input '%s': data[%lld] must be a string (datatype BYTES)",
                              f->in->name, (long long)i);
        /* Borrowed from the JSON tree until parse_input packs the strings. */
        tensor_strs_mut(t)[i] = (struct tensor_str){v->valuestring, json_str_len(v)};
        return 0;
    }
    if (t->dtype == DT_BOOL) {
        if (!cJSON_IsBool(v))
            return status_set(f->err, f->err_len, STATUS_INVALID, "input '%s': data[%lld] must be true or false (datatype BOOL)",
                              f->in->name, (long long)i);
        ((uint8_t *)t->data)[i] = cJSON_IsTrue(v) ? 1 : 0;
        return 0;
    }
    double d;
    if (cJSON_IsString(v) && (t->dtype == DT_FP32 || t->dtype == DT_FP64 || t->dtype == DT_FP16) &&
        (!strcmp(v->valuestring, "NaN") || !strcmp(v->valuestring, "Infinity") || !strcmp(v->valuestring, "-Infinity"))) {
        /* Non-finite floats as tritonclient writes them (see quote_nonfinite). */
        d = v->valuestring[0] == 'N' ? NAN : v->valuestring[0] == '-' ? -INFINITY : INFINITY;
        if (t->dtype == DT_FP32) ((float *)t->data)[i] = (float)d;
        else if (t->dtype == DT_FP16) ((uint16_t *)t->data)[i] = fp32_to_fp16((float)d);
        else ((double *)t->data)[i] = d;
        return 0;
    }
    return status_set(f->err, f->err_len, STATUS_INVALID, "input '%s': data[%lld] must be a number (datatype %s)",
                      f->in->name, (long long)i, dn);
}

/* Stores the number d as data element f->i of the input's datatype, or says
 * why it cannot be one. */
static int fill_number(struct fill *f, double d) {
    struct tensor *t = &f->in->t;
    int64_t i = f->i++;
    const char *dn = dtype_kserve_name(t->dtype);
    if (t->dtype == DT_STRING)
        return status_set(f->err, f->err_len, STATUS_INVALID, "input '%s': data[%lld] must be a string (datatype BYTES)",
                          f->in->name, (long long)i);
    if (t->dtype == DT_BOOL)
        return status_set(f->err, f->err_len, STATUS_INVALID, "input '%s': data[%lld] must be true or false (datatype BOOL)",
                          f->in->name, (long long)i);
    int integral = d == floor(d) && isfinite(d);
#define RANGE(lo, hi)                                                                                          \
    do {                                                                                                        \
        if (!integral || d < (double)(lo) || d > (double)(hi))                                                  \
            return status_set(f->err, f->err_len, STATUS_INVALID, "input '%s': data[%lld] = %g is not a valid %s", \
                              f->in->name, (long long)i, d, dn);                                                \
    } while (0)
#define BIG64(lo, hi)                                                                                          \
    do {                                                                                                        \
        if (d < (lo) || d > (hi))                                                                               \
            return status_set(f->err, f->err_len, STATUS_INVALID,                                               \
                              "input '%s': data[%lld] = %.17g is outside +-(2^53 - 1), where JSON numbers stop "  \
                              "being exact: send %s values this large as binary data", f->in->name, (long long)i, d, dn); \
    } while (0)
    switch (t->dtype) {
    case DT_FP32:
        /* A finite JSON number beyond FLT_MAX would silently become infinity. */
        if (fabs(d) > FLT_MAX)
            return status_set(f->err, f->err_len, STATUS_INVALID, "input '%s': data[%lld] = %g is out of range for FP32",
                              f->in->name, (long long)i, d);
        ((float *)t->data)[i] = (float)d;
        break;
    case DT_FP64:
        /* A JSON number past the double range (1e999) reads as infinity:
         * refused as for FP32; "Infinity" as a string is the way to send one. */
        if (!isfinite(d))
            return status_set(f->err, f->err_len, STATUS_INVALID, "input '%s': data[%lld] = %g is out of range for FP64",
                              f->in->name, (long long)i, d);
        ((double *)t->data)[i] = d;
        break;
    case DT_FP16:
        /* tritonclient writes an FP16 tensor's exact values; past 65504 is infinity. */
        if (fabs(d) > 65504)
            return status_set(f->err, f->err_len, STATUS_INVALID, "input '%s': data[%lld] = %g is out of range for FP16",
                              f->in->name, (long long)i, d);
        ((uint16_t *)t->data)[i] = fp32_to_fp16((float)d);
        break;
    case DT_INT8: RANGE(INT8_MIN, INT8_MAX); ((int8_t *)t->data)[i] = (int8_t)d; break;
    case DT_UINT8: RANGE(0, UINT8_MAX); ((uint8_t *)t->data)[i] = (uint8_t)d; break;
    case DT_INT16: RANGE(INT16_MIN, INT16_MAX); ((int16_t *)t->data)[i] = (int16_t)d; break;
    case DT_UINT16: RANGE(0, UINT16_MAX); ((uint16_t *)t->data)[i] = (uint16_t)d; break;
    case DT_INT32: RANGE(INT32_MIN, INT32_MAX); ((int32_t *)t->data)[i] = (int32_t)d; break;
    case DT_UINT32: RANGE(0, UINT32_MAX); ((uint32_t *)t->data)[i] = (uint32_t)d; break;
    /* JSON numbers are parsed as doubles: beyond 2^53 the value read may not be the
     * value sent (9007199254740993 reads as ...992, like 2^53 itself), so such values are refused
     * rather than silently changed; the binary extension carries any 64-bit value. */
    case DT_INT64:
        RANGE(-9223372036854775808.0, 9223372036854774784.0); /* 2^63 is the first double beyond int64 */
        BIG64(-9007199254740991.0, 9007199254740991.0);
        ((int64_t *)t->data)[i] = (int64_t)d;
        break;
    case DT_UINT64:
        RANGE(0, 18446744073709549568.0);
        BIG64(0, 9007199254740991.0);
        ((uint64_t *)t->data)[i] = (uint64_t)d;
        break;
    default:
        return status_set(f->err, f->err_len, STATUS_INVALID, "input '%s': datatype %s cannot be sent as JSON data", f->in->name, dn);
    }
#undef RANGE
#undef BIG64
    return 0;
}

static int fill_rec(struct fill *f, const cJSON *a) {
    if (!cJSON_IsArray(a)) return fill_leaf(f, a);
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        int rc = fill_rec(f, e);
        if (rc) return rc;
    }
    return 0;
}

/* ---- numeric data arrays, read ahead of cJSON --------------------------
 *
 * cJSON reads each number by copying it, asking localeconv for the decimal
 * point and calling strtod: for a tensor sent as JSON that was most of the
 * request's parse time. So before cJSON sees the body, prescan walks it once
 * (strict JSON, no tree) and reads the 'data' arrays that hold only numbers
 * (nested or flat) with jsonnum_parse, which gives strtod's exact result.
 * cJSON then parses a copy of the body in which each such array is replaced
 * by "[]" padded with spaces to the same length, so every other byte, and
 * every error offset, is where it was; parse_input takes the values from
 * here instead of from the (empty) array.
 *
 * The prescan reads only what cJSON's lookups would find: the first
 * "inputs" key of the root object, and the first "data" key of each object
 * in that array (cJSON_GetObjectItemCaseSensitive returns the first match).
 * Anything it is unsure of leaves the body to cJSON alone, as before: a
 * document it finds invalid (cJSON then reports the error, or reads
 * tritonclient's bare NaN), an escaped key where the lookups happen (cJSON
 * would compare it unescaped), an array holding anything but numbers (read
 * by cJSON as before), a copy cJSON refuses.
 *
 * The copy also leaves out what the request's reader never looks at, so
 * that cJSON builds no nodes for it (a node is 64 bytes: a 60 MB array of
 * numbers under an unknown key took 2.6 GB): the value of a key that is not
 * one the reader looks up, at the top level, in its 'parameters', in an
 * input or in an input's 'parameters' (and of a later duplicate of one that
 * is, as cJSON's lookups find the first), becomes 0 padded with spaces.
 * And the entries of an 'inputs' or 'outputs' array past the first that
 * the reader refuses are left out. */
#define KSERVE_FAST_INPUTS 16 /* inputs beyond this many are read by cJSON */
#define KSERVE_FAST_DEPTH 32  /* so are data arrays nested deeper (count_leaves refuses past 64) */

struct fast_data {
    int nspans;
    struct {
        int input;          /* index in 'inputs' */
        size_t start, end;  /* the array's bytes in the body */
        size_t off, count;  /* its values in vals[] */
    } spans[KSERVE_FAST_INPUTS];
    double *vals;
    size_t nvals, cap;
    double local[256];
    struct buf skips;       /* scan_skip's (start, end, whole) of size_t: what the reader ignores */
};

static void fast_data_init(struct fast_data *fd) {
    fd->nspans = 0;
    fd->vals = fd->local;
    fd->nvals = 0;
    fd->cap = sizeof fd->local / sizeof fd->local[0];
    memset(&fd->skips, 0, sizeof fd->skips);
}

static void fast_data_free(struct fast_data *fd) {
    if (fd->vals != fd->local) free(fd->vals);
    buf_free(&fd->skips);
    fast_data_init(fd);
}

/* The values read for input idx, or NULL when cJSON holds its data. */
static const double *fast_find(const struct fast_data *fd, int idx, int64_t *count) {
    for (int i = 0; fd && i < fd->nspans; i++)
        if (fd->spans[i].input == idx) {
            *count = (int64_t)fd->spans[i].count;
            return fd->vals + fd->spans[i].off;
        }
    return NULL;
}

enum { SCAN_ANY, SCAN_ROOT, SCAN_INPUTS, SCAN_INPUT, SCAN_OUTPUTS, SCAN_PARAMS, SCAN_INPUT_PARAMS };

/* The keys the request's reader looks up in an object of each kind (parse_doc,
 * parse_input, parse_shm); NULL: any object, whose keys are all kept. */
static const char *const *scan_keys(int ctx) {
    static const char *const root[] = {"id", "parameters", "inputs", "outputs", NULL};
    static const char *const params[] = {"priority", "timeout", "binary_data_output", "cache", NULL};
    static const char *const input[] = {"name", "datatype", "shape", "parameters", "data", NULL};
    static const char *const iparams[] = {"binary_data_size", "shared_memory_region", "shared_memory_byte_size",
                                          "shared_memory_offset", NULL};
    switch (ctx) {
    case SCAN_ROOT: return root;
    case SCAN_PARAMS: return params;
    case SCAN_INPUT: return input;
    case SCAN_INPUT_PARAMS: return iparams;
    default: return NULL;
    }
}

/* Index of the key [k, k + n) in keys, or -1. */
static int scan_key_index(const char *const *keys, const char *k, size_t n) {
    for (int i = 0; keys[i]; i++)
        if (strlen(keys[i]) == n && !memcmp(keys[i], k, n)) return i;
    return -1;
}

/* A value the reader ignores: short ones stay (blanking them saves nothing). */
#define KSERVE_SKIP_MIN 16

struct scan {
    const char *base, *p, *end;
    int depth;
    struct fast_data *fd;
};

static void scan_ws(struct scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

/* The 4 hex digits at p (before end) as a number, or -1. */
static long scan_hex4(const char *p, const char *end) {
    if (end - p < 4) return -1;
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int c = (unsigned char)p[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The escape after the backslash at p is one cJSON reads (a skipped value
 * must be one cJSON would have accepted): its length after the backslash,
 * or -1. A UTF-16 surrogate must come as a pair. */
static int scan_escape(const char *p, const char *end) {
    if (end - p < 2) return -1;
    if (strchr("\"\\/bfnrt", p[1]) && p[1]) return 1;
    if (p[1] != 'u') return -1;
    long u = scan_hex4(p + 2, end);
    if (u < 0 || (u >= 0xDC00 && u <= 0xDFFF)) return -1;
    if (u < 0xD800 || u > 0xDBFF) return 5;
    if (end - p < 12 || p[6] != '\\' || p[7] != 'u') return -1;
    long lo = scan_hex4(p + 8, end);
    return lo >= 0xDC00 && lo <= 0xDFFF ? 11 : -1;
}

/* A string at s->p: its raw bytes in [*k, *k + *n), *esc when it has escapes. */
static int scan_string(struct scan *s, const char **k, size_t *n, int *esc) {
    if (s->p >= s->end || *s->p != '"') return -1;
    const char *a = ++s->p;
    *esc = 0;
    while (s->p < s->end) {
        unsigned char c = (unsigned char)*s->p;
        if (c == '"') {
            *k = a;
            *n = (size_t)(s->p - a);
            s->p++;
            return 0;
        }
        if (c < 0x20) return -1;
        if (c == '\\') {
            int e = scan_escape(s->p, s->end);
            if (e < 0) return -1;
            *esc = 1;
            s->p += e;
        }
        s->p++;
    }
    return -1;
}

/* An array (at s->p) of numbers only, flat or nested: its values are
 * appended to fd->vals in order. -1 at anything else. */
static int scan_fast_array(struct scan *s, int depth) {
    if (depth > KSERVE_FAST_DEPTH) return -1;
    s->p++; /* '[' */
    scan_ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        return 0;
    }
    struct fast_data *fd = s->fd;
    for (;;) {
        if (s->p >= s->end) return -1;
        if (*s->p == '[') {
            if (scan_fast_array(s, depth + 1)) return -1;
        } else {
            if (fd->nvals == fd->cap) {
                size_t cap = fd->cap * 2;
                if (parse_charge(fd->cap * sizeof *fd->vals)) return -1;
                double *v = fd->vals == fd->local ? malloc(cap * sizeof *v) : realloc(fd->vals, cap * sizeof *v);
                if (!v) return -1;
                if (fd->vals == fd->local) memcpy(v, fd->local, sizeof fd->local);
                fd->vals = v;
                fd->cap = cap;
            }
            if (jsonnum_parse(s->p, s->end, &fd->vals[fd->nvals], &s->p)) return -1;
            fd->nvals++;
        }
        scan_ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == ']') {
            s->p++;
            return 0;
        }
        if (*s->p++ != ',') return -1;
        scan_ws(s);
    }
}

static int scan_value(struct scan *s, int ctx, int idx);

/* Bytes [a, b) of the body that cJSON need not see: a value (becomes 0 and
 * spaces) or, with whole, array entries (all spaces). */
static void scan_skip(struct scan *s, const char *a, const char *b, int whole) {
    size_t span[3] = {(size_t)(a - s->base), (size_t)(b - s->base), (size_t)whole};
    buf_add(&s->fd->skips, span, sizeof span);
}

/* The value of an input's first "data" key. */
static int scan_data(struct scan *s, int idx) {
    struct fast_data *fd = s->fd;
    const char *start = s->p;
    if (s->p < s->end && *s->p == '[' && fd->nspans < KSERVE_FAST_INPUTS) {
        size_t mark = fd->nvals;
        if (scan_fast_array(s, 0) == 0) {
            int k = fd->nspans++;
            fd->spans[k].input = idx;
            fd->spans[k].start = (size_t)(start - s->base);
            fd->spans[k].end = (size_t)(s->p - s->base);
            fd->spans[k].off = mark;
            fd->spans[k].count = fd->nvals - mark;
            return 0;
        }
        s->p = start; /* not numbers only: cJSON reads it */
        fd->nvals = mark;
    }
    return scan_value(s, SCAN_ANY, 0);
}

static int scan_object(struct scan *s, int ctx, int idx) {
    if (++s->depth > KSERVE_MAX_JSON_DEPTH) return -1;
    s->p++; /* '{' */
    scan_ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        s->depth--;
        return 0;
    }
    const char *const *keys = scan_keys(ctx);
    unsigned seen = 0;
    for (;;) {
        const char *k;
        size_t n;
        int esc, rc;
        if (scan_string(s, &k, &n, &esc)) return -1;
        if (esc && ctx != SCAN_ANY) return -1;
        scan_ws(s);
        if (s->p >= s->end || *s->p++ != ':') return -1;
        scan_ws(s);
        int ki = keys ? scan_key_index(keys, k, n) : -1;
        const char *v = s->p;
        if (ki >= 0 && !(seen >> ki & 1)) {
            seen |= 1u << ki;
            const char *key = keys[ki];
            if (ctx == SCAN_ROOT && !strcmp(key, "inputs")) rc = scan_value(s, SCAN_INPUTS, 0);
            else if (ctx == SCAN_ROOT && !strcmp(key, "outputs")) rc = scan_value(s, SCAN_OUTPUTS, 0);
            else if (ctx == SCAN_ROOT && !strcmp(key, "parameters")) rc = scan_value(s, SCAN_PARAMS, 0);
            else if (ctx == SCAN_INPUT && !strcmp(key, "parameters")) rc = scan_value(s, SCAN_INPUT_PARAMS, 0);
            else if (ctx == SCAN_INPUT && !strcmp(key, "data")) rc = scan_data(s, idx);
            else rc = scan_value(s, SCAN_ANY, 0);
        } else {
            rc = scan_value(s, SCAN_ANY, 0);
            if (!rc && keys && s->p - v >= KSERVE_SKIP_MIN) {
                scan_skip(s, v, s->p, 0);
                if (s->fd->skips.failed) return -1;
            }
        }
        if (rc) return -1;
        scan_ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == '}') {
            s->p++;
            s->depth--;
            return 0;
        }
        if (*s->p++ != ',') return -1;
        scan_ws(s);
    }
}

static int scan_array(struct scan *s, int ctx) {
    if (++s->depth > KSERVE_MAX_JSON_DEPTH) return -1;
    s->p++; /* '[' */
    scan_ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        s->depth--;
        return 0;
    }
    /* Past KSERVE_MAX_TENSORS + 1 entries of 'inputs' or 'outputs' the
     * reader refuses the request, whatever the rest holds: the rest is left
     * out (spaces), so that its error comes without a node per entry. */
    int tensors = ctx == SCAN_INPUTS || ctx == SCAN_OUTPUTS;
    const char *cut = NULL;
    for (int i = 0;; i++) {
        if (scan_value(s, ctx == SCAN_INPUTS ? SCAN_INPUT : SCAN_ANY, i)) return -1;
        scan_ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == ']') {
            if (cut) scan_skip(s, cut, s->p, 1);
            s->p++;
            s->depth--;
            return s->fd->skips.failed ? -1 : 0;
        }
        if (tensors && i == KSERVE_MAX_TENSORS && !cut) cut = s->p;
        if (*s->p++ != ',') return -1;
        scan_ws(s);
    }
}

static int scan_literal(struct scan *s, const char *lit, size_t n) {
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, lit, n)) return -1;
    s->p += n;
    return 0;
}

static int scan_value(struct scan *s, int ctx, int idx) {
    if (s->p >= s->end) return -1;
    const char *k;
    size_t n;
    int esc;
    double d;
    switch (*s->p) {
    case '{': return scan_object(s, scan_keys(ctx) ? ctx : SCAN_ANY, idx);
    case '[': return scan_array(s, ctx == SCAN_INPUTS || ctx == SCAN_OUTPUTS ? ctx : SCAN_ANY);
    case '"': return scan_string(s, &k, &n, &esc);
    case 't': return scan_literal(s, "true", 4);
    case 'f': return scan_literal(s, "false", 5);
    case 'n': return scan_literal(s, "null", 4);
    default: return jsonnum_parse(s->p, s->end, &d, &s->p);
    }
}

/* Walks the JSON text; when it holds numeric data arrays, returns a copy
 * with each blanked to "[]" and spaces (fd then holds their values): in
 * local (local_len bytes) when it fits, else from malloc. NULL when cJSON
 * should read the text as it is. */
static char *prescan(const char *text, size_t len, struct fast_data *fd, char *local, size_t local_len) {
    struct scan s = {text, text, text + len, 0, fd};
    scan_ws(&s);
    int rc = s.p < s.end && *s.p == '{' ? scan_object(&s, SCAN_ROOT, 0) : -1;
    if (!rc) scan_ws(&s);
    char *copy = NULL;
    if (!rc && s.p == s.end && (fd->nspans > 0 || fd->skips.len))
        copy = len <= local_len ? local : parse_charge(len) ? NULL : malloc(len);
    if (!copy) {
        fast_data_free(fd);
        return NULL;
    }
    memcpy(copy, text, len);
    for (int i = 0; i < fd->nspans; i++) {
        size_t a = fd->spans[i].start, b = fd->spans[i].end; /* b - a >= 2: "[...]" */
        copy[a] = '[';
        copy[a + 1] = ']';
        memset(copy + a + 2, ' ', b - a - 2);
    }
    const size_t *sk = (const size_t *)(void *)fd->skips.data;
    for (size_t i = 0; i < fd->skips.len / (3 * sizeof *sk); i++) {
        size_t a = sk[3 * i], b = sk[3 * i + 1];
        memset(copy + a, ' ', b - a);
        if (!sk[3 * i + 2]) copy[a] = '0';
    }
    buf_free(&fd->skips);
    return copy;
}

/* An unsigned integer member of params, at most max: 0 and *out untouched
 * when absent. Errors name the tensor when what is set ("input", n). */
static int param_u64(const cJSON *params, const char *key, double max, uint64_t *out, const char *what, const char *n,
                     char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(params, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble) || v->valuedouble > max) {
        if (what) return INVALID("%s '%s': parameters.%s must be an integer >= 0", what, n, key);
        return INVALID("parameters.%s must be an integer >= 0", key);
    }
    *out = (uint64_t)v->valuedouble;
    return 0;
}

/* A tensor's shared-memory parameters (params has shared_memory_region). */
static int parse_shm(struct kserve_request *r, const cJSON *params, struct kserve_shm *s, const char *what,
                     const char *n, char *err, size_t err_len) {
    const cJSON *region = cJSON_GetObjectItemCaseSensitive(params, "shared_memory_region");
    if (!cJSON_IsString(region) || !*region->valuestring)
        return INVALID("%s '%s': parameters.shared_memory_region must be a non-empty string", what, n);
    if (!cJSON_GetObjectItemCaseSensitive(params, "shared_memory_byte_size"))
        return INVALID("%s '%s': parameters.shared_memory_byte_size is missing (shared memory needs it)", what, n);
    int rc = param_u64(params, "shared_memory_byte_size", 9e15, &s->byte_size, what, n, err, err_len);
    if (!rc) rc = param_u64(params, "shared_memory_offset", 9e15, &s->offset, what, n, err, err_len);
    if (!rc && !(s->region = keep_string(r, region->valuestring))) rc = STATUS_NOMEM;
    return rc;
}

/* An input's copy, counted with the parse against the request's bound. */
static int charge_input(const struct kserve_input *in, size_t bytes, char *err, size_t err_len) {
    if (!parse_charge(bytes)) return 0;
    char sh[128];
    return INVALID("input '%s' of shape %s: its %zu bytes pass the %zu bytes one request may use "
                   "(--max-request-memory)", in->name, tensor_shape_str(&in->t, sh, sizeof sh), bytes,
                   kserve_max_request_memory);
}

static int parse_input(struct kserve_request *r, const cJSON *j, int idx, const struct fast_data *fd, char *err,
                       size_t err_len) {
    struct kserve_input *in = &r->inputs[idx];
    if (!cJSON_IsObject(j)) return INVALID("field 'inputs[%d]' must be an object", idx);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    if (!cJSON_IsString(name) || !*name->valuestring)
        return INVALID("field 'inputs[%d].name' must be a non-empty string", idx);
    in->name = keep_string(r, name->valuestring);
    if (!in->name) return STATUS_NOMEM;
    const char *n = in->name;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "datatype");
    if (!cJSON_IsString(dt)) return INVALID("input '%s': field 'datatype' is missing or not a string", n);
    in->t.dtype = dtype_from_kserve(dt->valuestring);
    if (in->t.dtype == DT_UNDEFINED)
        return INVALID("input '%s': datatype '%.32s' is not one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, "
                       "INT32, INT64, FP16, BF16, FP32, FP64, BYTES", n, dt->valuestring);
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
    if (!cJSON_IsArray(shape)) return INVALID("input '%s': field 'shape' is missing or not an array", n);
    if (cJSON_GetArraySize(shape) > TENSOR_MAX_DIMS)
        return INVALID("input '%s': field 'shape' has more than %d dims", n, TENSOR_MAX_DIMS);
    const cJSON *d;
    cJSON_ArrayForEach(d, shape) {
        if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble != floor(d->valuedouble) || d->valuedouble > 9e15)
            return INVALID("input '%s': shape[%d] must be an integer >= 0", n, in->t.ndim);
        in->t.dims[in->t.ndim++] = (int64_t)d->valuedouble;
    }
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    const cJSON *bds = NULL, *region = NULL;
    if (params) {
        if (!cJSON_IsObject(params)) return INVALID("input '%s': field 'parameters' must be an object", n);
        bds = cJSON_GetObjectItemCaseSensitive(params, "binary_data_size");
        region = cJSON_GetObjectItemCaseSensitive(params, "shared_memory_region");
    }
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(j, "data");
    if (!data && !bds && !region)
        return INVALID("input '%s': has neither 'data' nor parameters.binary_data_size nor "
                       "parameters.shared_memory_region", n);
    if (!!data + !!bds + !!region > 1)
        return INVALID("input '%s': has both %s and %s; send one", n, data ? "'data'" : "parameters.binary_data_size",
                       region ? "parameters.shared_memory_region" : "parameters.binary_data_size");
    if (region) return parse_shm(r, params, &in->shm, "input", n, err, err_len);
    int64_t numel = tensor_numel(&in->t);
    int rc;
    if (bds) {
        if (!cJSON_IsNumber(bds) || bds->valuedouble < 0 || bds->valuedouble != floor(bds->valuedouble) ||
            bds->valuedouble > 9e15)
            return INVALID("input '%s': parameters.binary_data_size must be an integer >= 0", n);
        in->binary = 1;
        in->binary_size = (size_t)bds->valuedouble;
        return 0;
    }
    /* FP16 as JSON numbers, as tritonclient sends them; BF16 has no JSON
     * form there (numpy has no bfloat16). */
    if (in->t.dtype == DT_BF16)
        return INVALID("input '%s': datatype %s cannot be sent as JSON data; use the binary tensor extension", n,
                       dtype_kserve_name(in->t.dtype));
    if (cJSON_IsNull(data) || cJSON_IsObject(data))
        return INVALID("input '%s': 'data' must be an array of values (flat or nested), not %s", n,
                       cJSON_IsNull(data) ? "null" : "an object");
    int64_t count;
    const double *vals = fast_find(fd, idx, &count);
    if (!vals) count = count_leaves(data, 0);
    if (count < 0) return INVALID("input '%s': 'data' is nested deeper than %d", n, KSERVE_MAX_JSON_DEPTH);
    if (count != numel) {
        char sh[128];
        return INVALID("input '%s': 'data' has %lld elements but shape %s needs %lld", n, (long long)count,
                       tensor_shape_str(&in->t, sh, sizeof sh), (long long)numel);
    }
    /* Strings are gathered as elements pointing into the JSON tree, then
     * packed into the tensor's own block. */
    struct tensor_str *strs = NULL;
    if ((rc = charge_input(in, (size_t)numel * (in->t.dtype == DT_STRING ? 2 * sizeof *strs : dtype_size(in->t.dtype)),
                           err, err_len)))
        return rc;
    if (in->t.dtype == DT_STRING) in->t.data = strs = calloc((size_t)numel + 1, sizeof *strs);
    else tensor_alloc_data(&in->t);
    if (!in->t.data) return STATUS_NOMEM;
    struct fill f = {in, 0, err, err_len};
    if (!vals) rc = fill_rec(&f, data);
    for (int64_t i = 0; vals && i < count && !rc; i++) rc = fill_number(&f, vals[i]);
    if (!rc && strs && (rc = tensor_strings_pack(&in->t, strs)) == 0) free(strs);
    return rc;
}

static int read_binary(struct kserve_input *in, const uint8_t *p, size_t avail, char *err, size_t err_len) {
    const char *n = in->name;
    char sh[128];
    if (in->binary_size > avail)
        return INVALID("input '%s': parameters.binary_data_size is %zu but only %zu bytes of binary data are left in the body",
                       n, in->binary_size, avail);
    int64_t numel = tensor_numel(&in->t);
    if (in->t.dtype != DT_STRING) {
        size_t need = tensor_nbytes(&in->t);
        if (numel == INT64_MAX || need != in->binary_size)
            return INVALID("input '%s': parameters.binary_data_size is %zu but shape %s of %s needs %zu bytes", n,
                           in->binary_size, tensor_shape_str(&in->t, sh, sizeof sh), dtype_kserve_name(in->t.dtype),
                           numel == INT64_MAX ? SIZE_MAX : need);
        int rc = charge_input(in, need, err, err_len);
        if (rc) return rc;
        if (tensor_alloc_data(&in->t)) return STATUS_NOMEM;
        memcpy(in->t.data, p, need);
        return 0;
    }
    char why[160];
    int rc = tensor_strings_from_prefixed(&in->t, p, in->binary_size, why, sizeof why);
    if (rc == STATUS_INVALID) return INVALID("input '%s' of shape %s: %s", n, tensor_shape_str(&in->t, sh, sizeof sh), why);
    return rc;
}

static int parse_output(struct kserve_request *r, const cJSON *j, int idx, char *err, size_t err_len) {
    struct kserve_output *o = &r->outputs[idx];
    if (!cJSON_IsObject(j)) return INVALID("field 'outputs[%d]' must be an object", idx);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    if (!cJSON_IsString(name) || !*name->valuestring)
        return INVALID("field 'outputs[%d].name' must be a non-empty string", idx);
    o->name = keep_string(r, name->valuestring);
    if (!o->name) return STATUS_NOMEM;
    o->binary = -1;
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    if (!params) return 0;
    if (!cJSON_IsObject(params)) return INVALID("output '%s': field 'parameters' must be an object", o->name);
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(params, "binary_data");
    if (b) {
        if (!cJSON_IsBool(b)) return INVALID("output '%s': parameters.binary_data must be true or false", o->name);
        o->binary = cJSON_IsTrue(b);
    }
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(params, "classification");
    if (c) {
        if (!cJSON_IsNumber(c) || c->valuedouble < 0 || c->valuedouble != floor(c->valuedouble) || c->valuedouble > 1e6)
            return INVALID("output '%s': parameters.classification must be an integer >= 0", o->name);
        o->classification = (int)c->valuedouble;
    }
    if (!cJSON_GetObjectItemCaseSensitive(params, "shared_memory_region")) return 0;
    if (o->classification)
        return INVALID("output '%s': parameters.shared_memory_region and parameters.classification cannot both be set",
                       o->name);
    if (o->binary == 1)
        return INVALID("output '%s': parameters.shared_memory_region and parameters.binary_data true cannot both be set",
                       o->name);
    return parse_shm(r, params, &o->shm, "output", o->name, err, err_len);
}

static int parse_uint_param(const cJSON *params, const char *key, uint64_t *out, char *err, size_t err_len) {
    return param_u64(params, key, 1.8e19, out, NULL, NULL, err, err_len);
}

static int parse_doc(struct kserve_request *r, const cJSON *root, const struct fast_data *fd, char *err,
                     size_t err_len) {
    if (!cJSON_IsObject(root)) return INVALID("the request body must be a JSON object");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "id");
    if (id) {
        if (!cJSON_IsString(id)) return INVALID("field 'id' must be a string");
        if (!(r->id = keep_string(r, id->valuestring))) return STATUS_NOMEM;
    }
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "parameters");
    if (params) {
        if (!cJSON_IsObject(params)) return INVALID("field 'parameters' must be an object");
        uint64_t prio = 0;
        int rc = parse_uint_param(params, "priority", &prio, err, err_len);
        if (!rc) rc = parse_uint_param(params, "timeout", &r->timeout_us, err, err_len);
        if (rc) return rc;
        r->priority = (int64_t)(prio > 1000000 ? 1000000 : prio);
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(params, "binary_data_output");
        if (b) {
            if (!cJSON_IsBool(b)) return INVALID("parameters.binary_data_output must be true or false");
            r->binary_data_output = cJSON_IsTrue(b);
        }
        const cJSON *cache = cJSON_GetObjectItemCaseSensitive(params, "cache");
        if (cache) {
            if (!cJSON_IsBool(cache)) return INVALID("parameters.cache must be true or false");
            r->no_cache = cJSON_IsFalse(cache);
        }
    }
    const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(root, "inputs");
    if (!inputs) return INVALID("field 'inputs' is missing");
    if (!cJSON_IsArray(inputs)) return INVALID("field 'inputs' must be an array");
    int n = cJSON_GetArraySize(inputs);
    if (n == 0) return INVALID("field 'inputs' is empty");
    if (n > KSERVE_MAX_TENSORS) return INVALID("field 'inputs' has more than %d entries", KSERVE_MAX_TENSORS);
    r->inputs = n <= KSERVE_INLINE_INPUTS ? r->inputs_l : calloc((size_t)n, sizeof *r->inputs);
    if (!r->inputs) return STATUS_NOMEM;
    const cJSON *e;
    cJSON_ArrayForEach(e, inputs) {
        int rc = parse_input(r, e, r->ninputs, fd, err, err_len);
        r->ninputs++;
        if (rc) return rc;
        for (int k = 0; k < r->ninputs - 1; k++)
            if (strcmp(r->inputs[k].name, r->inputs[r->ninputs - 1].name) == 0)
                return INVALID("input '%s' already exists in request (it appears twice in 'inputs')",
                               r->inputs[k].name);
    }
    const cJSON *outputs = cJSON_GetObjectItemCaseSensitive(root, "outputs");
    if (outputs) {
        if (!cJSON_IsArray(outputs)) return INVALID("field 'outputs' must be an array");
        n = cJSON_GetArraySize(outputs);
        if (n > KSERVE_MAX_TENSORS) return INVALID("field 'outputs' has more than %d entries", KSERVE_MAX_TENSORS);
        r->outputs = calloc((size_t)(n ? n : 1), sizeof *r->outputs);
        if (!r->outputs) return STATUS_NOMEM;
        cJSON_ArrayForEach(e, outputs) {
            int rc = parse_output(r, e, r->noutputs, err, err_len);
            r->noutputs++;
            if (rc) return rc;
            for (int k = 0; k < r->noutputs - 1; k++)
                if (strcmp(r->outputs[k].name, r->outputs[r->noutputs - 1].name) == 0)
                    return INVALID("output '%s' already exists in request (it appears twice in 'outputs')",
                                   r->outputs[k].name);
        }
    }
    return 0;
}

/* tritonclient (python-rapidjson) writes non-finite floats as the bare tokens
 * NaN, Infinity and -Infinity, which cJSON does not read. This copy of the
 * JSON text quotes them outside strings ("NaN"), and fill_leaf reads those
 * strings for floating-point inputs. NULL when there is nothing to quote. */
static char *quote_nonfinite(const char *p, size_t n, size_t *out_len) {
    static const char *toks[] = {"-Infinity", "Infinity", "NaN"};
    size_t found = 0;
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        if (in_str) {
            if (p[i] == '\\') i++;
            else if (p[i] == '"') in_str = 0;
        } else if (p[i] == '"') in_str = 1;
        else if (p[i] == 'N' || p[i] == 'I') found++;
    }
    if (!found) return NULL;
    char *o = malloc(n + 2 * found + 1);
    if (!o) return NULL;
    size_t k = 0;
    in_str = 0;
    for (size_t i = 0; i < n; i++) {
        if (in_str) {
            if (p[i] == '\\' && i + 1 < n) o[k++] = p[i++];
            else if (p[i] == '"') in_str = 0;
        } else if (p[i] == '"') {
            in_str = 1;
        } else {
            int hit = 0;
            for (int t = 0; t < 3 && !hit; t++) {
                size_t L = strlen(toks[t]);
                if (i + L <= n && memcmp(p + i, toks[t], L) == 0) {
                    o[k++] = '"';
                    memcpy(o + k, toks[t], L);
                    k += L;
                    o[k++] = '"';
                    i += L - 1;
                    hit = 1;
                }
            }
            if (hit) continue;
        }
        o[k++] = p[i];
    }
    o[k] = 0;
    *out_len = k;
    return o;
}

/* cJSON allocates every node, key and string of a request, and a scratch
 * copy of every number, one malloc/free each: for a small tensor in JSON
 * that was a quarter of the request's CPU time on the I/O thread. The parse
 * tree never outlives kserve_request_parse, so it is carved from a
 * per-thread buffer instead: a bump allocator that also takes back the
 * latest block (cJSON frees each number's scratch copy right away). Blocks
 * that do not fit, and every cJSON allocation outside a parse (or on
 * another thread), go to malloc as before; the free hook tells them apart
 * by address. kserve_global_init installs the hooks at start, before any
 * thread can be using cJSON. */
#define KSERVE_ARENA_BYTES (16 * 1024) /* a few hundred values; larger requests spill to malloc */

static _Thread_local struct {
    int active;
    size_t used, last;
    /* What this parse made kiln hold (parse tree, copies of the body, input
     * tensors), counted against kserve_max_request_memory: a block freed
     * right after it was made (cJSON's number scratch) is taken back, the
     * rest counts until the parse ends, so this bounds its peak. */
    size_t charged;
    void *latest;       /* the latest block from malloc, and its size */
    size_t latest_n;
    int over;           /* a charge was refused */
    _Alignas(16) unsigned char mem[KSERVE_ARENA_BYTES];
} parse_arena;

/* n more bytes for this thread's parse: 0, or -1 (over set) past the bound. */
static int parse_charge(size_t n) {
    if (!parse_arena.active) return 0;
    size_t max = kserve_max_request_memory;
    if (max && (parse_arena.charged > max || n > max - parse_arena.charged)) {
        parse_arena.over = 1;
        return -1;
    }
    parse_arena.charged += n;
    return 0;
}

static void parse_uncharge(size_t n) {
    if (parse_arena.active) parse_arena.charged -= n < parse_arena.charged ? n : parse_arena.charged;
}

/* AddressSanitizer builds (GCC's macro, clang's feature test) keep plain
 * malloc, so it still sees every block; they count it all the same. */
#if defined(__SANITIZE_ADDRESS__)
#define KSERVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KSERVE_ASAN 1
#endif
#endif

static void *arena_malloc(size_t n) {
    if (!parse_arena.active) return malloc(n);
    size_t a = (n + 15) & ~(size_t)15;
    if (a < n || parse_charge(a)) return NULL; /* cJSON then fails the parse */
#ifndef KSERVE_ASAN
    if (a <= KSERVE_ARENA_BYTES - parse_arena.used) {
        parse_arena.last = parse_arena.used;
        parse_arena.used += a;
        return parse_arena.mem + parse_arena.last;
    }
#endif
    void *p = malloc(n);
    if (!p) {
        parse_uncharge(a);
        return NULL;
    }
    parse_arena.latest = p;
    parse_arena.latest_n = a;
    return p;
}

static void arena_free(void *p) {
    unsigned char *b = p;
    if (b >= parse_arena.mem && b < parse_arena.mem + KSERVE_ARENA_BYTES) {
        if (b == parse_arena.mem + parse_arena.last && parse_arena.last < parse_arena.used) {
            parse_uncharge(parse_arena.used - parse_arena.last);
            parse_arena.used = parse_arena.last; /* the latest block: reuse its room */
        }
        return;
    }
    if (p && p == parse_arena.latest) {
        parse_uncharge(parse_arena.latest_n);
        parse_arena.latest = NULL;
    }
    free(p);
}

void kserve_global_init(void) {
    cJSON_Hooks h = {.malloc_fn = arena_malloc, .free_fn = arena_free};
    cJSON_InitHooks(&h);
}

/* Starts carving parse trees from this thread's buffer, and counting. */
static void arena_begin(void) {
    parse_arena.active = 1;
    parse_arena.used = parse_arena.last = 0;
    parse_arena.charged = 0;
    parse_arena.latest = NULL;
    parse_arena.over = 0;
}

/* Every tree from the buffer has been deleted: later cJSON calls on this
 * thread allocate with malloc again. */
static void arena_end(void) { parse_arena.active = 0; }

/* A parse that held more than this gives the freed memory back to the
 * system (glibc keeps it in the thread's heap otherwise: 20M empty objects
 * left 1.7 GB resident after their request). */
#define KSERVE_TRIM_BYTES ((size_t)64 << 20)

static int request_parse(struct kserve_request *r, const void *body, size_t len, int64_t header_len,
                         int nul_escaped, int use_prescan, char *err, size_t err_len);
static int over_budget(char *err, size_t err_len);

/* kserve_request_parse, with the numeric prescan or without it (cJSON then
 * reads every number: the tests compare the two). */
static int parse_body(struct kserve_request *r, const void *body, size_t len, int64_t header_len, int use_prescan,
                      char *err, size_t err_len) {
    size_t json_len = header_len >= 0 && (uint64_t)header_len <= len ? (size_t)header_len : len;
    char *esc = NULL;
    if ((header_len < 0 || (uint64_t)header_len <= len) && json_may_hold_nul(body, json_len)) {
        size_t esc_len;
        esc = nul_escape(body, json_len, (const char *)body + json_len, len - json_len, &esc_len);
        if (!esc) return status_set(err, err_len, STATUS_NOMEM, "out of memory for the request's JSON");
        len = esc_len + (len - json_len);
        if (header_len >= 0) header_len = (int64_t)esc_len;
        body = esc;
    }
    arena_begin();
    /* The rewritten copy of a body with NULs counts against the request's
     * memory as the parse tree does. */
    int rc = esc && parse_charge(len) ? over_budget(err, err_len)
                                      : request_parse(r, body, len, header_len, esc != NULL, use_prescan, err,
                                                      err_len);
    size_t held = parse_arena.charged;
    arena_end();
    free(esc);
    if (held > KSERVE_TRIM_BYTES) malloc_trim(0);
    return rc;
}

int kserve_request_parse(struct kserve_request *r, const void *body, size_t len, int64_t header_len,
                         char *err, size_t err_len) {
    return parse_body(r, body, len, header_len, 1, err, err_len);
}

static int over_budget(char *err, size_t err_len) {
    return INVALID("reading the request's JSON takes more than the %zu bytes one request may use "
                   "(--max-request-memory): send large tensors as binary data", kserve_max_request_memory);
}

static int request_parse(struct kserve_request *r, const void *body, size_t len, int64_t header_len,
                         int nul_escaped, int use_prescan, char *err, size_t err_len) {
    memset(r, 0, sizeof *r);
    const uint8_t *p = body;
    size_t json_len = len;
    if (header_len >= 0) {
        if ((uint64_t)header_len > len)
            return INVALID("Inference-Header-Content-Length %lld is out of range: the body has %zu bytes",
                           (long long)header_len, len);
        json_len = (size_t)header_len;
    }
    if (json_len == 0) return INVALID("the request body is empty: expected a JSON inference request");
    struct fast_data fd;
    fast_data_init(&fd);
    cJSON *root = NULL;
    char local[8192]; /* most JSON headers: no allocation for the copy */
    char *blanked = use_prescan ? prescan((const char *)p, json_len, &fd, local, sizeof local) : NULL;
    if (blanked) {
        const char *bend = NULL;
        root = cJSON_ParseWithLengthOpts(blanked, json_len, &bend, 0);
        size_t off = root ? (size_t)(bend - blanked) : 0;
        while (off < json_len && (blanked[off] == ' ' || blanked[off] == '\n' || blanked[off] == '\r' || blanked[off] == '\t'))
            off++;
        if (root && off < json_len) {
            cJSON_Delete(root);
            root = NULL;
        }
        if (blanked != local) free(blanked);
        if (!root) fast_data_free(&fd); /* cJSON reads the body as sent below, and names what is wrong */
        if (parse_arena.over) return over_budget(err, err_len);
    }
    if (!root) {
        const char *end = NULL, *text = (const char *)p;
        size_t text_len = json_len;
        root = cJSON_ParseWithLengthOpts(text, text_len, &end, 0);
        char *quoted = NULL;
        if (!root && (quoted = quote_nonfinite(text, text_len, &text_len)) != NULL) {
            text = quoted;
            root = cJSON_ParseWithLengthOpts(text, text_len, &end, 0);
            if (!root) { /* report the position in the text as sent */
                free(quoted);
                quoted = NULL;
                text = (const char *)p;
                text_len = json_len;
                cJSON_Delete(cJSON_ParseWithLengthOpts(text, text_len, &end, 0));
            }
        }
        if (!root && parse_arena.over) {
            free(quoted);
            return over_budget(err, err_len);
        }
        if (!root) {
            size_t off = end && end >= text ? (size_t)(end - text) : 0;
            /* cJSON reports the position where parsing stopped; name it. */
            return INVALID("malformed JSON in the request body at byte %zu%s", off,
                           header_len < 0 ? " (binary data needs the Inference-Header-Content-Length header)" : "");
        }
        size_t off = (size_t)(end - text);
        while (off < text_len && (text[off] == ' ' || text[off] == '\n' || text[off] == '\r' || text[off] == '\t')) off++;
        free(quoted);
        if (off < text_len) {
            cJSON_Delete(root);
            return INVALID("unexpected bytes after the JSON header at byte %zu%s", off,
                           header_len < 0 ? " (binary data needs the Inference-Header-Content-Length header)" : "");
        }
    }
    int rc = nul_escaped ? json_nul_decode(root, NULL, 0, err, err_len) : 0;
    if (!rc) rc = parse_doc(r, root, &fd, err, err_len);
    cJSON_Delete(root);
    fast_data_free(&fd);
    if (rc) {
        kserve_request_clear(r);
        return rc;
    }
    size_t pos = json_len;
    for (int i = 0; i < r->ninputs; i++) {
        if (!r->inputs[i].binary) continue;
        if (header_len < 0) {
            rc = INVALID("input '%s' has parameters.binary_data_size but the request has no "
                         "Inference-Header-Content-Length header", r->inputs[i].name);
            kserve_request_clear(r);
            return rc;
        }
        if ((rc = read_binary(&r->inputs[i], p + pos, len - pos, err, err_len))) {
            kserve_request_clear(r);
            return rc;
        }
        pos += r->inputs[i].binary_size;
    }
    if (pos != len) {
        rc = INVALID("the body has %zu bytes of binary data after the JSON header but the inputs' "
                     "parameters.binary_data_size add up to %zu", len - json_len, pos - json_len);
        kserve_request_clear(r);
        return rc;
    }
    return 0;
}
