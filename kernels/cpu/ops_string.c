/* ops_string.c - string operators of text preprocessing graphs:
 *     StringConcat StringSplit StringNormalizer RegexFullMatch TfIdfVectorizer
 * and com.microsoft's Tokenizer, which skl2onnx emits for scikit-learn's
 * text vectorizers. After onnxruntime's kernels and onnx's reference. New strings (a concat,
 * a split's pieces, a case change) are made in the executor's string pool
 * (kernels/ops.h); the others point at their input's strings.
 *
 * RegexFullMatch's pattern is RE2 syntax in the ONNX spec; kiln compiles it
 * with PCRE2 (UTF mode, anchored at both ends), which reads every RE2
 * construct the same way (classes, \w \d \s \b, Perl flags (?i), non-greedy
 * repeats, named groups (?P<name>...)) except: PCRE2 also accepts
 * backreferences, lookaround and possessive repeats, which RE2 rejects, and
 * matches in backtracking time where RE2 guarantees linear time; \C and
 * RE2's \pN one-letter classes behave as in PCRE2. */
#include <ctype.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/log.h"
#include "kernels/cpu/params_util.h"
#include "kernels/cpu/shape_util.h"
#include "kernels/ops.h"

static int need_strings(struct op_call *c, const struct tensor *t, const char *what) {
    if (t->dtype != DT_STRING) return op_error(c, "%s must be a string tensor, got %s", what, dtype_name(t->dtype));
    return 0;
}

/* Elements are (bytes, length): a NUL inside a string is one of its bytes. */
static inline struct tensor_str str_at(const struct tensor *t, int64_t i) {
    struct tensor_str s = tensor_strs(t)[i];
    if (!s.p) s.p = "";
    return s;
}
static inline void str_set(struct tensor *t, int64_t i, const char *s, size_t len) {
    tensor_strs_mut(t)[i] = (struct tensor_str){s, len};
}

/* ---- UTF-8 ------------------------------------------------------------------- */

/* Decodes the code point at s (avail > 0 bytes left) into *cp; its length
 * in bytes, or -1 when s does not start with a valid UTF-8 sequence. */
static int utf8_decode(const unsigned char *s, size_t avail, unsigned *cp) {
    if (s[0] < 0x80) return *cp = s[0], 1;
    int n = s[0] >= 0xf0 && s[0] < 0xf5 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : 0;
    if (!n || (size_t)n > avail) return -1;
    unsigned v = s[0] & (0x7f >> n);
    for (int k = 1; k < n; k++) {
        if ((s[k] & 0xc0) != 0x80) return -1;
        v = v << 6 | (s[k] & 0x3f);
    }
    if ((n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > 0x10ffff)) || (v >= 0xd800 && v < 0xe000)) return -1;
    *cp = v;
    return n;
}

static int utf8_encode(unsigned cp, char *out) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), 2;
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---- StringConcat ------------------------------------------------------------ */

static int concat_infer(struct op_call *c) {
    int rc = need_strings(c, c->in[0], "X");
    if (rc || (rc = need_strings(c, c->in[1], "Y"))) return rc;
    c->out[0]->dtype = DT_STRING;
    return op_broadcast_shape(c, c->in[0], c->in[1], c->out[0]);
}

/* Element strides of t seen with out's rank: 0 along broadcast axes. */
static void broadcast_strides(const struct tensor *t, const struct tensor *out, int64_t *st) {
    int64_t s = 1;
    for (int k = out->ndim - 1; k >= 0; k--) {
        int kt = t->ndim - out->ndim + k;
        int64_t d = kt >= 0 ? t->dims[kt] : 1;
        st[k] = d == 1 ? 0 : s;
        s *= d;
    }
}

static int concat_run(struct op_call *c) {
    const struct tensor *a = c->in[0], *b = c->in[1];
    struct tensor *y = c->out[0];
    int64_t sa[TENSOR_MAX_DIMS], sb[TENSOR_MAX_DIMS];
    broadcast_strides(a, y, sa);
    broadcast_strides(b, y, sb);
    for (int64_t i = 0, n = tensor_numel(y); i < n; i++) {
        int64_t ia = 0, ib = 0, rem = i;
        for (int k = y->ndim - 1; k >= 0; k--) {
            int64_t ik = rem % y->dims[k];
            rem /= y->dims[k];
            ia += ik * sa[k];
            ib += ik * sb[k];
        }
        struct tensor_str x1 = str_at(a, ia), x2 = str_at(b, ib);
        char *s = op_string_alloc(c, x1.len + x2.len);
        if (!s) return STATUS_NOMEM;
        memcpy(s, x1.p, x1.len);
        memcpy(s + x1.len, x2.p, x2.len);
        str_set(y, i, s, x1.len + x2.len);
    }
    return 0;
}

/* ---- StringSplit ------------------------------------------------------------------
 * Python's str.split: with a delimiter, every occurrence splits ("a,,b" is
 * three pieces, "" one); without one (absent or empty), runs of whitespace
 * split and leading and trailing whitespace yields nothing ("" is no piece).
 * maxsplit caps the splits; the rest of the string is the last piece. */

struct split_params {
    const char *delim; /* NULL: whitespace */
    size_t dlen;
    int64_t maxsplit;  /* < 0: no cap */
};

static void split_decode(const struct graph_node *n, struct split_params *p) {
    const struct graph_attr *d = node_attr(n, "delimiter"); /* counted bytes: a NUL may be the delimiter */
    p->delim = d && d->type == ATTR_STRING && d->s && d->s_len ? d->s : NULL;
    p->dlen = p->delim ? d->s_len : 0;
    p->maxsplit = node_attr_int(n, "maxsplit", -1);
}

static int is_space(char ch) { return ch == ' ' || (ch >= '\t' && ch <= '\r') || (ch >= 0x1c && ch <= 0x1f); }

/* Calls emit(arg, start, len) for each piece of s; returns the count. */
static int64_t split_one(const struct split_params *p, struct tensor_str s,
                         int (*emit)(void *arg, int64_t k, const char *start, size_t len), void *arg, int *rc) {
    int64_t k = 0;
    const char *at = s.p, *stop = s.p + s.len;
    if (p->delim) {
        for (;;) {
            const char *hit = p->maxsplit < 0 || k < p->maxsplit ? memmem(at, (size_t)(stop - at), p->delim, p->dlen) : NULL;
            size_t len = hit ? (size_t)(hit - at) : (size_t)(stop - at);
            if (emit && (*rc = emit(arg, k, at, len))) return -1;
            k++;
            if (!hit) return k;
            at = hit + p->dlen;
        }
    }
    for (;;) {
        while (at < stop && is_space(*at)) at++;
        if (at == stop) return k;
        const char *end = at;
        if (p->maxsplit >= 0 && k >= p->maxsplit) end = stop;
        else
            while (end < stop && !is_space(*end)) end++;
        if (emit && (*rc = emit(arg, k, at, (size_t)(end - at)))) return -1;
        k++;
        at = end;
    }
}

static int split_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int rc = need_strings(c, x, "X");
    if (rc || (rc = need_const(c, 0, "X"))) return rc;
    if (x->ndim + 1 > TENSOR_MAX_DIMS) return op_error(c, "input rank %d is too high", x->ndim);
    struct split_params p;
    split_decode(c->node, &p);
    int64_t most = 0;
    for (int64_t i = 0, n = tensor_numel(x); i < n; i++) {
        int64_t k = split_one(&p, str_at(x, i), NULL, NULL, &rc);
        if (k > most) most = k;
    }
    struct tensor *y = c->out[0], *z = c->out[1];
    *y = (struct tensor){.dtype = DT_STRING, .ndim = x->ndim + 1};
    memcpy(y->dims, x->dims, sizeof x->dims);
    y->dims[x->ndim] = most;
    if (z) {
        *z = (struct tensor){.dtype = DT_INT64, .ndim = x->ndim};
        memcpy(z->dims, x->dims, sizeof x->dims);
    }
    return 0;
}

static int split_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct split_params p;
    split_decode(c->node, &p);
    return params_keep(c, &p, sizeof p, state);
}

struct split_row {
    struct op_call *c;
    struct tensor *y;
    int64_t base;
};

static int split_emit(void *arg, int64_t k, const char *start, size_t len) {
    struct split_row *r = arg;
    char *s = op_string_new(r->c, start, len);
    if (!s) return STATUS_NOMEM;
    str_set(r->y, r->base + k, s, len);
    return 0;
}

static int split_run(struct op_call *c) {
    const struct split_params *p = c->state;
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0], *z = c->nout > 1 ? c->out[1] : NULL;
    int64_t most = y->dims[y->ndim - 1];
    for (int64_t i = 0, n = tensor_numel(x); i < n; i++) {
        struct split_row r = {c, y, i * most};
        int rc = 0;
        int64_t k = split_one(p, str_at(x, i), split_emit, &r, &rc);
        if (rc) return rc;
        if (k > most) return op_error(c, "element %lld splits into %lld pieces, more than the %lld planned", (long long)i, (long long)k, (long long)most);
        for (int64_t j = k; j < most; j++) str_set(y, i * most + j, "", 0);
        if (z && z->data) ((int64_t *)z->data)[i] = k;
    }
    return 0;
}

/* ---- StringNormalizer -------------------------------------------------------------
 * Drops the elements equal to a stopword (compared after lower-casing both
 * unless is_case_sensitive), then changes the case of the others. Input
 * [C] or [1, C]; when every element is dropped the output is one "".
 * Case mapping uses the C library's towlower_l/towupper_l in the locale
 * named by the attribute (with ".UTF-8" appended when needed); a locale the
 * machine lacks falls back to C.UTF-8, whose mapping is the same outside
 * the few language-specific rules (Turkish dotted i). */

enum case_action { CASE_NONE, CASE_LOWER, CASE_UPPER };

struct norm_params {
    enum case_action action;
    int sensitive;
    char **stops; /* the stopwords; lower-cased when !sensitive */
    size_t *stop_lens;
    int nstops;
    locale_t loc;
};

/* Frees what norm_build made in p (not p itself). */
static void norm_clear(struct norm_params *p) {
    for (int i = 0; i < p->nstops; i++) free(p->stops[i]);
    free(p->stops);
    free(p->stop_lens);
    if (p->loc) freelocale(p->loc);
    memset(p, 0, sizeof *p);
}

static void norm_free(void *state) {
    if (state) norm_clear(state);
    op_params_free(state);
}

static unsigned map_case(const struct norm_params *p, enum case_action a, unsigned cp) {
    if (a == CASE_LOWER) return (unsigned)towlower_l((wint_t)cp, p->loc);
    if (a == CASE_UPPER) return (unsigned)towupper_l((wint_t)cp, p->loc);
    return cp;
}

/* The case-mapped copy of s into out (NULL: only measure); its length, or
 * -1 when s is not valid UTF-8. */
static int64_t case_copy(const struct norm_params *p, enum case_action a, struct tensor_str s, char *out) {
    int64_t len = 0;
    const unsigned char *u = (const unsigned char *)s.p, *end = u + s.len;
    while (u < end) {
        unsigned cp;
        int n = utf8_decode(u, (size_t)(end - u), &cp);
        if (n < 0) return -1;
        u += n;
        char buf[4];
        int m = utf8_encode(map_case(p, a, cp), buf);
        if (out) memcpy(out + len, buf, (size_t)m);
        len += m;
    }
    return len;
}

/* 1 when s equals the (already folded) stopword w after folding s; every
 * byte counts, a NUL too. */
static int folded_eq(const struct norm_params *p, struct tensor_str s, struct tensor_str w) {
    if (p->sensitive) return tensor_str_eq(s, w);
    const unsigned char *a = (const unsigned char *)s.p, *b = (const unsigned char *)w.p;
    const unsigned char *ae = a + s.len, *be = b + w.len;
    while (a < ae && b < be) {
        unsigned ca, cb;
        int na = utf8_decode(a, (size_t)(ae - a), &ca), nb = utf8_decode(b, (size_t)(be - b), &cb);
        if (na < 0 || nb < 0) return 0;
        if (map_case(p, CASE_LOWER, ca) != cb) return 0;
        a += na;
        b += nb;
    }
    return a == ae && b == be;
}

static int is_stop(const struct norm_params *p, struct tensor_str s) {
    for (int i = 0; i < p->nstops; i++)
        if (folded_eq(p, s, (struct tensor_str){p->stops[i], p->stop_lens[i]})) return 1;
    return 0;
}

/* Decodes the attributes into p: the action, the locale and the
 * stopwords (folded when the comparison ignores case). On failure p holds
 * nothing. */
static int norm_build(struct op_call *c, struct norm_params *p) {
    const char *act = node_attr_str(c->node, "case_change_action", "NONE");
    if (!strcmp(act, "NONE")) p->action = CASE_NONE;
    else if (!strcmp(act, "LOWER")) p->action = CASE_LOWER;
    else if (!strcmp(act, "UPPER")) p->action = CASE_UPPER;
    else return op_error(c, "case_change_action '%s' is not one of NONE, LOWER, UPPER", act);
    p->sensitive = node_attr_int(c->node, "is_case_sensitive", 0) != 0;
    const char *name = node_attr_str(c->node, "locale", "");
    char full[128];
    if (*name) {
        p->loc = newlocale(LC_CTYPE_MASK, name, (locale_t)0);
        if (!p->loc && !strchr(name, '.') && snprintf(full, sizeof full, "%s.UTF-8", name) < (int)sizeof full)
            p->loc = newlocale(LC_CTYPE_MASK, full, (locale_t)0);
        if (!p->loc) log_debug("node '%s': locale '%s' is not installed; case mapping uses C.UTF-8", c->node->name, name);
    }
    if (!p->loc) p->loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    if (!p->loc) return op_error(c, "the C.UTF-8 locale is not available for case mapping");
    const struct graph_attr *sw = node_attr(c->node, "stopwords");
    if (!sw || sw->type != ATTR_STRINGS || sw->n <= 0) return 0;
    p->stops = calloc((size_t)sw->n, sizeof *p->stops);
    p->stop_lens = calloc((size_t)sw->n, sizeof *p->stop_lens);
    if (!p->stops || !p->stop_lens) goto nomem;
    p->nstops = sw->n;
    for (int k = 0; k < sw->n; k++) {
        struct tensor_str w = graph_attr_str(sw, k);
        int64_t len = p->sensitive ? (int64_t)w.len : case_copy(p, CASE_LOWER, w, NULL);
        if (len < 0) {
            norm_clear(p);
            return op_error(c, "stopword %d is not valid UTF-8", k);
        }
        if (!(p->stops[k] = malloc((size_t)len + 1))) goto nomem;
        if (p->sensitive) memcpy(p->stops[k], w.p, (size_t)len);
        else case_copy(p, CASE_LOWER, w, p->stops[k]);
        p->stops[k][len] = 0;
        p->stop_lens[k] = (size_t)len;
    }
    return 0;
nomem:
    norm_clear(p);
    return op_error(c, "out of memory");
}

static int norm_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int rc = need_strings(c, x, "X");
    if (rc) return rc;
    if (x->ndim != 1 && !(x->ndim == 2 && x->dims[0] == 1))
        return op_error(c, "input must be [C] or [1, C], got rank %d", x->ndim);
    int64_t keep = x->dims[x->ndim - 1];
    const struct graph_attr *sw = node_attr(c->node, "stopwords");
    if (sw && sw->type == ATTR_STRINGS && sw->n > 0) {
        if ((rc = need_const(c, 0, "X (with stopwords the output's length depends on its values)"))) return rc;
        struct norm_params p = {0};
        if ((rc = norm_build(c, &p))) return rc;
        keep = 0;
        for (int64_t i = 0, n = tensor_numel(x); i < n; i++) keep += !is_stop(&p, str_at(x, i));
        norm_clear(&p);
        if (!keep) keep = 1; /* one "" */
    }
    struct tensor *y = c->out[0];
    *y = (struct tensor){.dtype = DT_STRING, .ndim = x->ndim};
    if (x->ndim == 2) y->dims[0] = 1;
    y->dims[x->ndim - 1] = keep;
    return 0;
}

static int norm_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct norm_params p = {0};
    int rc = norm_build(c, &p);
    if (!rc && (rc = params_keep(c, &p, sizeof p, state))) norm_clear(&p);
    return rc;
}

static int norm_run(struct op_call *c) {
    const struct norm_params *p = c->state;
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0];
    int64_t cap = y->dims[y->ndim - 1], k = 0;
    for (int64_t i = 0, n = tensor_numel(x); i < n; i++) {
        struct tensor_str s = str_at(x, i);
        if (p->nstops && is_stop(p, s)) continue;
        if (k >= cap) return op_error(c, "more elements are kept than the %lld planned", (long long)cap);
        if (p->action != CASE_NONE) {
            int64_t len = case_copy(p, p->action, s, NULL);
            if (len < 0) return op_error(c, "element %lld is not valid UTF-8", (long long)i);
            char *o = op_string_alloc(c, (size_t)len);
            if (!o) return STATUS_NOMEM;
            case_copy(p, p->action, s, o);
            s = (struct tensor_str){o, (size_t)len};
        }
        str_set(y, k++, s.p, s.len);
    }
    if (k == 0 && cap == 1) str_set(y, k++, "", 0);
    if (k != cap) return op_error(c, "%lld elements are kept, %lld were planned", (long long)k, (long long)cap);
    return 0;
}

/* ---- RegexFullMatch ------------------------------------------------------------- */

struct regex_params {
    pcre2_code *code;
};

static void regex_free(void *state) {
    struct regex_params *p = state;
    if (p) pcre2_code_free(p->code);
    op_params_free(p);
}

static int regex_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int rc = need_strings(c, x, "X");
    if (rc) return rc;
    if (!node_attr(c->node, "pattern")) return op_error(c, "attribute 'pattern' is required");
    *c->out[0] = *x;
    c->out[0]->dtype = DT_BOOL;
    c->out[0]->data = NULL;
    return 0;
}

static int regex_prepare(struct op_call *c, void **state, size_t *scratch) {
    const struct graph_attr *a = node_attr(c->node, "pattern");
    if (!a || a->type != ATTR_STRING) return op_error(c, "attribute 'pattern' must be a string");
    int err;
    PCRE2_SIZE off;
    struct regex_params p = {0};
    p.code = pcre2_compile((PCRE2_SPTR)a->s, a->s_len, PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &err, &off, NULL);
    if (!p.code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return op_error(c, "pattern '%s' does not compile at offset %zu: %s", a->s, (size_t)off, (const char *)msg);
    }
    pcre2_jit_compile(p.code, PCRE2_JIT_COMPLETE); /* when JIT is unavailable, matching interprets */
    int rc = params_keep(c, &p, sizeof p, state);
    if (rc) pcre2_code_free(p.code);
    return rc;
}

static int regex_run(struct op_call *c) {
    const struct regex_params *p = c->state;
    const struct tensor *x = c->in[0];
    uint8_t *y = c->out[0]->data;
    int64_t n = tensor_numel(x);
    if (!n) return 0;
    /* Match data is per run: the compiled pattern is shared by every thread
     * that runs the plan. */
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->code, NULL);
    if (!md) return op_error(c, "out of memory for regex match data");
    int rc = 0;
    for (int64_t i = 0; i < n && !rc; i++) {
        struct tensor_str s = str_at(x, i);
        int m = pcre2_match(p->code, (PCRE2_SPTR)s.p, s.len, 0, 0, md, NULL);
        if (m >= 0) y[i] = 1;
        else if (m == PCRE2_ERROR_NOMATCH) y[i] = 0;
        else {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            rc = op_error(c, "matching element %lld failed: %s", (long long)i, (const char *)msg);
        }
    }
    pcre2_match_data_free(md);
    return rc;
}

/* ---- Tokenizer (com.microsoft) -----------------------------------------------------
 * Splits each string of [C] or [N, C] into tokens along a new last axis:
 * the matches of tokenexp, or the text between matches of any of the
 * separators (regular expressions), or with separators [""] each UTF-8
 * character. Tokens shorter than mincharnum characters are dropped; with
 * mark the tokens are enclosed in "\x02" and "\x03"; short rows are then
 * padded with pad_value (after the end mark, as onnxruntime does). When no string has a token,
 * the new axis is 0 long. Patterns compile with PCRE2, as RegexFullMatch's. */

enum tok_mode { TOK_CHARS, TOK_SEPARATORS, TOK_EXP };

struct tok_params {
    enum tok_mode mode;
    pcre2_code *re;
    int mark;
    int64_t mincharnum;
    struct tensor_str pad;
};

static void tok_clear(struct tok_params *p) {
    pcre2_code_free(p->re);
    p->re = NULL;
}

static void tok_free(void *state) {
    if (state) tok_clear(state);
    op_params_free(state);
}

static int tok_build(struct op_call *c, struct tok_params *p) {
    p->mark = node_attr_int(c->node, "mark", 0) != 0;
    p->mincharnum = node_attr_int(c->node, "mincharnum", 1);
    const struct graph_attr *pad = node_attr(c->node, "pad_value");
    p->pad = pad && pad->type == ATTR_STRING && pad->s ? (struct tensor_str){pad->s, pad->s_len} : tensor_str_of("#");
    const char *exp = node_attr_str(c->node, "tokenexp", NULL);
    const struct graph_attr *seps = node_attr(c->node, "separators");
    int nseps = seps && seps->type == ATTR_STRINGS ? seps->n : 0;
    if (!exp && !nseps) return op_error(c, "one of tokenexp and separators is required");
    if (!exp && nseps == 1 && !seps->strings[0][0]) {
        p->mode = TOK_CHARS;
        return 0;
    }
    /* The separators become one alternation, in their order. */
    size_t len = exp ? strlen(exp) : 0;
    for (int k = 0; !exp && k < nseps; k++) len += strlen(seps->strings[k]) + 5;
    char *pat = malloc(len + 1);
    if (!pat) return op_error(c, "out of memory");
    if (exp) {
        p->mode = TOK_EXP;
        memcpy(pat, exp, len + 1);
    } else {
        p->mode = TOK_SEPARATORS;
        size_t o = 0;
        for (int k = 0; k < nseps; k++) {
            if (!seps->strings[k][0]) {
                free(pat);
                return op_error(c, "separator %d is empty (only a lone \"\" separator, for characters, may be)", k);
            }
            o += (size_t)sprintf(pat + o, "%s(?:%s)", k ? "|" : "", seps->strings[k]);
        }
    }
    int err;
    PCRE2_SIZE off;
    p->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &off, NULL);
    if (!p->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        int rc = op_error(c, "%s '%s' does not compile at offset %zu: %s", exp ? "tokenexp" : "the separators", pat,
                          (size_t)off, (const char *)msg);
        free(pat);
        return rc;
    }
    free(pat);
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE);
    return 0;
}

/* Characters (UTF-8 sequences) in s[0..len). */
static int64_t utf8_count(const char *s, size_t len) {
    int64_t n = 0;
    for (size_t i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xc0) != 0x80;
    return n;
}

/* Emits the token s[0..len) unless it is empty or too short. */
static int tok_emit(const struct tok_params *p, const char *s, size_t len, int64_t *k,
                    int (*emit)(void *arg, int64_t k, const char *start, size_t len), void *arg) {
    if (!len || utf8_count(s, len) < p->mincharnum) return 0;
    int rc = emit ? emit(arg, *k, s, len) : 0;
    ++*k;
    return rc;
}

/* Tokenizes s, emitting each token (no marks, no padding); the count, or
 * a negative status after op_error. */
static int64_t tok_one(struct op_call *c, const struct tok_params *p, pcre2_match_data *md, struct tensor_str str,
                       int (*emit)(void *arg, int64_t k, const char *start, size_t len), void *arg) {
    int64_t k = 0;
    const char *s = str.p;
    size_t len = str.len, at = 0, prev = 0;
    int rc = 0;
    if (p->mode == TOK_CHARS) {
        while (at < len && !rc) {
            unsigned cp;
            int n = utf8_decode((const unsigned char *)s + at, len - at, &cp);
            if (n < 0) return op_error(c, "'%.*s' is not valid UTF-8", (int)(len < 64 ? len : 64), s);
            rc = tok_emit(p, s + at, (size_t)n, &k, emit, arg);
            at += (size_t)n;
        }
        return rc ? rc : k;
    }
    while (at <= len && !rc) {
        int m = pcre2_match(p->re, (PCRE2_SPTR)s, len, at, 0, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            return op_error(c, "tokenizing '%.*s' failed: %s", (int)(len < 64 ? len : 64), s, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t b = ov[0], e = ov[1];
        if (p->mode == TOK_EXP) rc = tok_emit(p, s + b, e - b, &k, emit, arg);
        else if (e > b) {
            rc = tok_emit(p, s + prev, b - prev, &k, emit, arg);
            prev = e;
        }
        /* An empty match moves on by one character. */
        at = e > b ? e : e + 1;
        while (at < len && ((unsigned char)s[at] & 0xc0) == 0x80) at++;
    }
    if (!rc && p->mode == TOK_SEPARATORS) rc = tok_emit(p, s + prev, len - prev, &k, emit, arg);
    return rc ? rc : k;
}

static int tok_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    int rc = need_strings(c, x, "X");
    if (rc || (rc = need_const(c, 0, "X (the token count depends on its values)"))) return rc;
    if (x->ndim != 1 && x->ndim != 2) return op_error(c, "input must be [C] or [N, C], got rank %d", x->ndim);
    struct tok_params p = {0};
    if ((rc = tok_build(c, &p))) return rc;
    pcre2_match_data *md = p.re ? pcre2_match_data_create_from_pattern(p.re, NULL) : NULL;
    if (p.re && !md) rc = op_error(c, "out of memory for regex match data");
    int64_t most = 0;
    for (int64_t i = 0, n = tensor_numel(x); i < n && !rc; i++) {
        int64_t k = tok_one(c, &p, md, str_at(x, i), NULL, NULL);
        if (k < 0) rc = (int)k;
        else if (k > most) most = k;
    }
    pcre2_match_data_free(md);
    tok_clear(&p);
    if (rc) return rc;
    struct tensor *y = c->out[0];
    *y = (struct tensor){.dtype = DT_STRING, .ndim = x->ndim + 1};
    memcpy(y->dims, x->dims, sizeof x->dims);
    y->dims[x->ndim] = most ? most + 2 * p.mark : 0;
    return 0;
}

static int tok_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct tok_params p = {0};
    int rc = tok_build(c, &p);
    if (!rc && (rc = params_keep(c, &p, sizeof p, state))) tok_clear(&p);
    return rc;
}

static int tok_run(struct op_call *c) {
    const struct tok_params *p = c->state;
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0];
    int64_t width = y->dims[y->ndim - 1], room = width - 2 * p->mark;
    if (!width) return 0;
    pcre2_match_data *md = p->re ? pcre2_match_data_create_from_pattern(p->re, NULL) : NULL;
    if (p->re && !md) return op_error(c, "out of memory for regex match data");
    int rc = 0;
    for (int64_t i = 0, n = tensor_numel(x); i < n && !rc; i++) {
        int64_t base = i * width;
        struct split_row r = {c, y, base + p->mark};
        int64_t k = tok_one(c, p, md, str_at(x, i), split_emit, &r);
        if (k < 0) rc = (int)k;
        else if (k > room) rc = op_error(c, "element %lld has %lld tokens, more than the %lld planned", (long long)i, (long long)k, (long long)room);
        else {
            if (p->mark) {
                str_set(y, base, "\x02", 1);
                str_set(y, base + 1 + k, "\x03", 1);
            }
            for (int64_t j = 2 * p->mark + k; j < width; j++) str_set(y, base + j, p->pad.p, p->pad.len);
        }
    }
    pcre2_match_data_free(md);
    return rc;
}

/* ---- TfIdfVectorizer -------------------------------------------------------------
 * The pool's n-grams go into a trie keyed by token (an int64 value, or for
 * strings the index of the string in the sorted pool); each trie node that
 * ends an n-gram of a counted length carries the n-gram's id. A row is
 * scanned from every start position, for each skip distance, following
 * the trie as far as it goes (onnxruntime's algorithm). */

struct trie_edge {
    int64_t token;
    int node;
};

struct trie_node {
    int64_t id;    /* 1-based n-gram id, 0 if no counted n-gram ends here */
    int nchild, cap;
    struct trie_edge *child; /* sorted by token once built */
};

enum tfidf_mode { TFIDF_TF, TFIDF_IDF, TFIDF_TFIDF };

struct tfidf_params {
    struct trie_node *nodes;
    int nnodes, cap;
    const int64_t *indexes; /* ngram_indexes: id - 1 -> output column */
    int nindexes;
    const float *weights;
    int nweights;
    int64_t out_size;
    int min_n, max_n, max_skip;
    enum tfidf_mode mode;
    struct tensor_str *strs; /* strings: the pool sorted, unique; a token is an index into it */
    int nstrs;
};

/* The pool attributes: n-gram start offsets per length, and the tokens. */
struct tfidf_pool {
    const int64_t *counts;
    int ncounts;
    const int64_t *ints;
    const struct graph_attr *strs; /* pool_strings */
    int n;
};

static void tfidf_clear(struct tfidf_params *p) {
    for (int i = 0; i < p->nnodes; i++) free(p->nodes[i].child);
    free(p->nodes);
    free(p->strs);
}

static void tfidf_free(void *state) {
    if (state) tfidf_clear(state);
    op_params_free(state);
}

static int trie_find(const struct trie_node *n, int64_t token) {
    int lo = 0, hi = n->nchild - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (n->child[mid].token == token) return n->child[mid].node;
        if (n->child[mid].token < token) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* arr with room for element n (cap doubled from first when full); NULL
 * when out of memory, arr and *cap then unchanged. */
static void *grow(void *arr, int *cap, int n, size_t size, int first) {
    if (n < *cap) return arr;
    int c = *cap ? 2 * *cap : first;
    void *a = realloc(arr, (size_t)c * size);
    if (a) *cap = c;
    return a;
}

/* The child of node at token, made when absent (children unsorted while
 * building); -1 when out of memory. */
static int trie_child(struct tfidf_params *p, int node, int64_t token) {
    struct trie_node *n = &p->nodes[node];
    for (int k = 0; k < n->nchild; k++)
        if (n->child[k].token == token) return n->child[k].node;
    struct trie_node *nodes = grow(p->nodes, &p->cap, p->nnodes, sizeof *nodes, 64);
    if (!nodes) return -1;
    p->nodes = nodes;
    n = &p->nodes[node];
    struct trie_edge *child = grow(n->child, &n->cap, n->nchild, sizeof *child, 4);
    if (!child) return -1;
    n->child = child;
    int id = p->nnodes++;
    p->nodes[id] = (struct trie_node){0};
    n->child[n->nchild++] = (struct trie_edge){token, id};
    return id;
}

static int cmp_edge(const void *a, const void *b) {
    int64_t x = ((const struct trie_edge *)a)->token, y = ((const struct trie_edge *)b)->token;
    return (x > y) - (x < y);
}

static int cmp_str(const void *a, const void *b) {
    return tensor_str_cmp(*(const struct tensor_str *)a, *(const struct tensor_str *)b);
}

/* The token of a string: its index in the sorted pool, or -1. Every byte
 * counts: "a\0b" is not the pool's "a". */
static int64_t str_token(const struct tfidf_params *p, struct tensor_str s) {
    int lo = 0, hi = p->nstrs - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, cmp = tensor_str_cmp(s, p->strs[mid]);
        if (!cmp) return mid;
        if (cmp < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return -1;
}

/* Decodes and checks the attributes against input X. */
static int tfidf_attrs(struct op_call *c, struct tfidf_params *p, struct tfidf_pool *pool) {
    const struct tensor *x = c->in[0];
    if (x->dtype != DT_STRING && x->dtype != DT_INT64 && x->dtype != DT_INT32)
        return op_error(c, "input dtype %s is not supported (string, int64, int32)", dtype_name(x->dtype));
    if (x->ndim > 2) return op_error(c, "input must be [C] or [B, C], got rank %d", x->ndim);
    const char *mode = node_attr_str(c->node, "mode", "");
    if (!strcmp(mode, "TF")) p->mode = TFIDF_TF;
    else if (!strcmp(mode, "IDF")) p->mode = TFIDF_IDF;
    else if (!strcmp(mode, "TFIDF")) p->mode = TFIDF_TFIDF;
    else return op_error(c, "mode '%s' is not one of TF, IDF, TFIDF", mode);
    p->min_n = (int)node_attr_int(c->node, "min_gram_length", 0);
    p->max_n = (int)node_attr_int(c->node, "max_gram_length", 0);
    p->max_skip = (int)node_attr_int(c->node, "max_skip_count", 0);
    if (p->min_n < 1 || p->max_n < p->min_n)
        return op_error(c, "min_gram_length %d and max_gram_length %d must satisfy 1 <= min <= max", p->min_n, p->max_n);
    if (p->max_skip < 0) return op_error(c, "max_skip_count %d is negative", p->max_skip);
    pool->ncounts = node_attr_ints(c->node, "ngram_counts", &pool->counts);
    p->nindexes = node_attr_ints(c->node, "ngram_indexes", &p->indexes);
    if (pool->ncounts < 1 || p->nindexes < 1) return op_error(c, "ngram_counts and ngram_indexes are required");
    int ni = node_attr_ints(c->node, "pool_int64s", &pool->ints);
    const struct graph_attr *ps = node_attr(c->node, "pool_strings");
    int ns = ps && ps->type == ATTR_STRINGS ? ps->n : -1;
    if ((ni >= 0) == (ns >= 0)) return op_error(c, "exactly one of pool_int64s and pool_strings must be given");
    pool->strs = ns >= 0 ? ps : NULL;
    pool->n = ns >= 0 ? ns : ni;
    if ((x->dtype == DT_STRING) != (pool->strs != NULL))
        return op_error(c, "a %s input needs %s", dtype_name(x->dtype), x->dtype == DT_STRING ? "pool_strings" : "pool_int64s");
    p->nweights = node_attr_floats(c->node, "weights", &p->weights);
    if (p->nweights < 0) p->nweights = 0;
    p->out_size = 0;
    for (int i = 0; i < p->nindexes; i++) {
        if (p->indexes[i] < 0) return op_error(c, "ngram_indexes[%d] = %lld is negative", i, (long long)p->indexes[i]);
        if (p->indexes[i] + 1 > p->out_size) p->out_size = p->indexes[i] + 1;
    }
    if (p->nweights && p->nweights < p->out_size)
        return op_error(c, "weights has %d values, fewer than the %lld outputs", p->nweights, (long long)p->out_size);
    for (int i = 0; i < pool->ncounts; i++)
        if (pool->counts[i] < 0 || pool->counts[i] > pool->n || (i && pool->counts[i] < pool->counts[i - 1]))
            return op_error(c, "ngram_counts[%d] = %lld is not a position in the pool of %d", i,
                            (long long)pool->counts[i], pool->n);
    return 0;
}

static int tfidf_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    struct tfidf_params p = {0};
    struct tfidf_pool pool;
    int rc = tfidf_attrs(c, &p, &pool);
    if (rc) return rc;
    struct tensor *y = c->out[0];
    *y = (struct tensor){.dtype = DT_FP32, .ndim = x->ndim == 2 ? 2 : 1};
    if (x->ndim == 2) y->dims[0] = x->dims[0];
    y->dims[y->ndim - 1] = p.out_size;
    return 0;
}

static int tfidf_build(struct op_call *c, struct tfidf_params *p, const struct tfidf_pool *pool) {
    const struct graph_attr *strs = pool->strs;
    const int64_t *counts = pool->counts, *ints = pool->ints;
    int ncounts = pool->ncounts, npool = pool->n;
    if (strs) {
        p->strs = malloc((size_t)(npool ? npool : 1) * sizeof *p->strs);
        if (!p->strs) return op_error(c, "out of memory");
        for (int i = 0; i < npool; i++) p->strs[i] = graph_attr_str(strs, i);
        if (npool > 1) qsort(p->strs, (size_t)npool, sizeof *p->strs, cmp_str);
        int u = 0;
        for (int i = 0; i < npool; i++)
            if (!u || !tensor_str_eq(p->strs[u - 1], p->strs[i])) p->strs[u++] = p->strs[i];
        p->nstrs = u;
    }
    if (!(p->nodes = grow(NULL, &p->cap, 0, sizeof *p->nodes, 64))) return op_error(c, "out of memory");
    p->nodes[0] = (struct trie_node){0};
    p->nnodes = 1; /* the root */
    int64_t id = 1;
    for (int i = 0; i < ncounts; i++) {
        int size = i + 1;
        int64_t start = counts[i], end = i + 1 < ncounts ? counts[i + 1] : npool;
        int64_t ngrams = (end - start) / size;
        if (size < p->min_n || size > p->max_n) {
            id += ngrams;
            continue;
        }
        for (int64_t g = 0; g < ngrams; g++, id++) {
            int node = 0;
            for (int k = 0; k < size; k++) {
                int64_t e = start + g * size + k;
                int64_t token = strs ? str_token(p, graph_attr_str(strs, (int)e)) : ints[e];
                if ((node = trie_child(p, node, token)) < 0) return op_error(c, "out of memory");
            }
            if (id > p->nindexes)
                return op_error(c, "n-gram %lld has no entry in ngram_indexes (%d entries)", (long long)id, p->nindexes);
            p->nodes[node].id = id;
        }
    }
    for (int i = 0; i < p->nnodes; i++)
        if (p->nodes[i].nchild > 1) /* a leaf has no array to sort (qsort takes no NULL) */
            qsort(p->nodes[i].child, (size_t)p->nodes[i].nchild, sizeof *p->nodes[i].child, cmp_edge);
    return 0;
}

static int tfidf_prepare(struct op_call *c, void **state, size_t *scratch) {
    struct tfidf_params p = {0};
    struct tfidf_pool pool;
    int rc = tfidf_attrs(c, &p, &pool);
    if (!rc && !(rc = tfidf_build(c, &p, &pool)) && !(rc = params_keep(c, &p, sizeof p, state))) return 0;
    tfidf_clear(&p);
    return rc;
}

static inline int64_t token_at(const struct tfidf_params *p, const struct tensor *x, int64_t i) {
    if (x->dtype == DT_STRING) return str_token(p, str_at(x, i));
    return op_int_at(x, i);
}

/* Counts row r's n-grams into out (out_size floats, zeroed). */
static void tfidf_row(const struct tfidf_params *p, const struct tensor *x, int64_t base, int64_t len, float *out) {
    int start_n = p->min_n;
    for (int skip = 1; skip <= p->max_skip + 1; skip++) {
        for (int64_t s = 0; s < len; s++) {
            if (s + (int64_t)skip * (start_n - 1) >= len) break;
            int node = 0, n = 1;
            for (int64_t at = s; p->nodes[node].nchild && n <= p->max_n && at < len; at += skip, n++) {
                int next = trie_find(&p->nodes[node], token_at(p, x, base + at));
                if (next < 0) break;
                int64_t id = p->nodes[next].id;
                if (n >= start_n && id) out[p->indexes[id - 1]] += 1;
                node = next;
            }
        }
        /* Unigrams do not depend on the skip: counted once. */
        if (start_n == 1 && ++start_n > p->max_n) break;
    }
}

static int tfidf_run(struct op_call *c) {
    const struct tfidf_params *p = c->state;
    const struct tensor *x = c->in[0];
    struct tensor *y = c->out[0];
    int64_t rows = x->ndim == 2 ? x->dims[0] : 1, len = x->ndim == 0 ? 1 : x->dims[x->ndim - 1];
    float *out = y->data;
    memset(out, 0, (size_t)tensor_numel(y) * sizeof *out);
#pragma omp parallel for num_threads(c->nthreads) if (rows > 1 && rows * len > 4096)
    for (int64_t r = 0; r < rows; r++) {
        float *o = out + r * p->out_size;
        if (len) tfidf_row(p, x, r * len, len, o);
        for (int64_t k = 0; k < p->out_size; k++) {
            float w = p->nweights ? p->weights[k] : 1;
            if (p->mode == TFIDF_IDF) o[k] = o[k] > 0 ? w : 0;
            else if (p->mode == TFIDF_TFIDF) o[k] *= w;
        }
    }
    return 0;
}

const struct op_def op_defs_string[] = {
    {"StringConcat", "", concat_infer, NULL, concat_run, NULL, 0},
    {"StringSplit", "", split_infer, split_prepare, split_run, op_params_free, 0},
    {"StringNormalizer", "", norm_infer, norm_prepare, norm_run, norm_free, 0},
    {"RegexFullMatch", "", regex_infer, regex_prepare, regex_run, regex_free, 0},
    {"TfIdfVectorizer", "", tfidf_infer, tfidf_prepare, tfidf_run, tfidf_free, 0},
    {"Tokenizer", "com.microsoft", tok_infer, tok_prepare, tok_run, tok_free, 0},
    {NULL, NULL, NULL, NULL, NULL, NULL, 0},
};
