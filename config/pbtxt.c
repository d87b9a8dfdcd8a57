/* pbtxt.c - protobuf text format read straight into the JSON tree that
 * config.json would hold, one reader for every message, driven by its
 * protobuf-c descriptor.
 *
 * Why text -> JSON, and not text -> protobuf-c message -> JSON: kiln reads a
 * model configuration in one place, model_config_parse over Triton's JSON
 * shape, and checks every field's fate (config/model_schema.c) on that same
 * tree. A config.pbtxt that becomes the very JSON a config.json would hold
 * has one meaning by construction: same checks, same messages, same
 * in-memory config, and GET .../config prints it the same way. Building a
 * protobuf-c message first would add a second walk (message -> JSON) and a
 * message allocator for nothing the descriptor does not already give here:
 * each field's type, repetition, map-ness and oneof come from the
 * ProtobufCFieldDescriptor, so the text is type-checked while it is read and
 * an error can still point at its line and column.
 *
 * The syntax (protobuf's text format, as Triton's repositories use it):
 *   # comments to the end of the line
 *   field: value              scalars need the colon
 *   field { ... }  field: { ... }  field < ... >    messages, colon optional
 *   field: [1, 2]  field [ {..}, {..} ]            lists; repeating the line appends
 *   enum_field: TYPE_FP32     enums by name or number
 *   map_field { key: "k" value: { ... } }          maps (a later key replaces an earlier)
 *   "strings" or 'strings' with C escapes (\n \t \" \\ \x41 \101 \u00e9), adjacent ones joined
 *   integers (decimal, 0x hex, 0 octal), floats (1.5, 1e3, 2.5f), true/false/t/f/1/0
 * A non-repeated field given twice, two members of one oneof, an unknown
 * field, a value of the wrong type or out of the field's range are errors
 * that name the file, line:column and the field's path. */
#include "config/pbtxt.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/status.h"

/* ---- tokens ------------------------------------------------------------- */

enum tok_kind { T_END, T_WORD, T_STRING, T_PUNCT };

struct tok {
    enum tok_kind kind;
    const char *text; /* T_WORD, T_PUNCT: in the input; T_STRING: the decoded bytes in lex.str */
    size_t len;
    int line, col;
};

struct lex {
    const char *p, *end;
    int line;
    const char *line_start;
    const char *file;
    struct tok tok;           /* the current token */
    char *str;                /* decoded string of the current T_STRING */
    size_t str_len, str_cap;
    char path[512];           /* the field being read, for errors */
    char *err;
    size_t err_len;
};

static int fail(struct lex *l, const struct tok *t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct lex *l, const struct tok *t, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (l->path[0])
        return status_set(l->err, l->err_len, STATUS_INVALID, "%s:%d:%d: field '%s': %s", l->file, t->line, t->col,
                          l->path, what);
    return status_set(l->err, l->err_len, STATUS_INVALID, "%s:%d:%d: %s", l->file, t->line, t->col, what);
}

static int str_put(struct lex *l, const char *s, size_t n) {
    if (l->str_len + n + 1 > l->str_cap) {
        size_t cap = l->str_cap ? l->str_cap : 64;
        while (cap < l->str_len + n + 1) cap *= 2;
        char *s2 = realloc(l->str, cap);
        if (!s2) return STATUS_NOMEM;
        l->str = s2;
        l->str_cap = cap;
    }
    memcpy(l->str + l->str_len, s, n);
    l->str_len += n;
    l->str[l->str_len] = 0;
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One escape after a backslash at l->p; appends its bytes. */
static int unescape(struct lex *l, const struct tok *t) {
    char c = *l->p++;
    char out[4];
    size_t n = 1;
    switch (c) {
    case 'n': out[0] = '\n'; break;
    case 't': out[0] = '\t'; break;
    case 'r': out[0] = '\r'; break;
    case 'a': out[0] = '\a'; break;
    case 'b': out[0] = '\b'; break;
    case 'f': out[0] = '\f'; break;
    case 'v': out[0] = '\v'; break;
    case '\\': case '\'': case '"': case '?': out[0] = c; break;
    case 'x': {
        int v = 0, k = 0;
        while (k < 2 && l->p < l->end && hexval(*l->p) >= 0) v = v * 16 + hexval(*l->p++), k++;
        if (!k) return fail(l, t, "\\x needs a hex digit");
        out[0] = (char)v;
        break;
    }
    case 'u': {
        unsigned v = 0;
        for (int k = 0; k < 4; k++) {
            if (l->p >= l->end || hexval(*l->p) < 0) return fail(l, t, "\\u needs 4 hex digits");
            v = v * 16 + (unsigned)hexval(*l->p++);
        }
        if (v >= 0xd800 && v <= 0xdfff) return fail(l, t, "\\u%04x is a lone surrogate", v);
        if (v < 0x80) out[0] = (char)v;
        else if (v < 0x800) out[0] = (char)(0xc0 | v >> 6), out[1] = (char)(0x80 | (v & 0x3f)), n = 2;
        else out[0] = (char)(0xe0 | v >> 12), out[1] = (char)(0x80 | ((v >> 6) & 0x3f)),
             out[2] = (char)(0x80 | (v & 0x3f)), n = 3;
        break;
    }
    default:
        if (c >= '0' && c <= '7') {
            int v = c - '0', k = 1;
            while (k < 3 && l->p < l->end && *l->p >= '0' && *l->p <= '7') v = v * 8 + (*l->p++ - '0'), k++;
            if (v > 255) return fail(l, t, "octal escape \\%o is over \\377", (unsigned)v);
            out[0] = (char)v;
            break;
        }
        return fail(l, t, "unknown escape '\\%c' in a string", c);
    }
    for (size_t i = 0; i < n; i++)
        if (!out[i]) return fail(l, t, "a string holds a NUL byte, which a configuration cannot carry");
    return str_put(l, out, n);
}

static int is_word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
           c == '-' || c == '+';
}

/* Moves to the next token: skips blanks and # comments, reads a word, a
 * quoted string (decoded into l->str) or one punctuation character. */
static int advance(struct lex *l) {
    for (;;) {
        while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\r' || *l->p == '\n' || *l->p == '\f' ||
                                 *l->p == '\v')) {
            if (*l->p == '\n') l->line++, l->line_start = l->p + 1;
            l->p++;
        }
        if (l->p < l->end && *l->p == '#') {
            while (l->p < l->end && *l->p != '\n') l->p++;
            continue;
        }
        break;
    }
    struct tok *t = &l->tok;
    t->line = l->line;
    t->col = (int)(l->p - l->line_start) + 1;
    t->text = l->p;
    if (l->p >= l->end) {
        t->kind = T_END;
        t->len = 0;
        return 0;
    }
    char c = *l->p;
    if (c == '"' || c == '\'') {
        t->kind = T_STRING;
        l->str_len = 0;
        if (str_put(l, "", 0)) return STATUS_NOMEM;
        l->p++;
        for (;;) {
            if (l->p >= l->end || *l->p == '\n') return fail(l, t, "a string has no closing %c", c);
            if (*l->p == c) break;
            if (*l->p == '\\') {
                l->p++;
                if (l->p >= l->end) return fail(l, t, "a string ends in a backslash");
                int rc = unescape(l, t);
                if (rc) return rc;
                continue;
            }
            if (!*l->p) return fail(l, t, "a string holds a NUL byte, which a configuration cannot carry");
            const char *s = l->p;
            while (l->p < l->end && *l->p != c && *l->p != '\\' && *l->p != '\n' && *l->p) l->p++;
            if (str_put(l, s, (size_t)(l->p - s))) return STATUS_NOMEM;
        }
        l->p++;
        t->len = (size_t)(l->p - t->text);
        return 0;
    }
    if (is_word_char(c)) {
        t->kind = T_WORD;
        while (l->p < l->end && is_word_char(*l->p)) l->p++;
        t->len = (size_t)(l->p - t->text);
        return 0;
    }
    if (strchr("{}[]<>:,;", c) && c) {
        t->kind = T_PUNCT;
        t->len = 1;
        l->p++;
        return 0;
    }
    return fail(l, t, "unexpected character '%s%c'", (unsigned char)c < 0x20 || (unsigned char)c >= 0x7f ? "\\x" : "",
                (unsigned char)c < 0x20 || (unsigned char)c >= 0x7f ? '?' : c);
}

static int is_punct(const struct lex *l, char c) {
    return l->tok.kind == T_PUNCT && l->tok.text[0] == c;
}

/* The current token as text for a message: at most 40 bytes. */
static const char *tok_show(const struct lex *l, char *buf, size_t n) {
    const struct tok *t = &l->tok;
    if (t->kind == T_END) return "the end of the file";
    size_t k = t->len < 40 ? t->len : 40;
    snprintf(buf, n, "'%.*s%s'", (int)k, t->text, t->len > k ? "..." : "");
    return buf;
}

/* ---- values ------------------------------------------------------------- */

/* Integers beyond 2^53 do not survive a JSON number (a double): they travel
 * as decimal strings, as protobuf's JSON mapping writes 64-bit integers. */
static cJSON *json_int(int64_t v) {
    if (v > (INT64_C(1) << 53) || v < -(INT64_C(1) << 53)) {
        char s[32];
        snprintf(s, sizeof s, "%lld", (long long)v);
        return cJSON_CreateString(s);
    }
    return cJSON_CreateNumber((double)v);
}

static cJSON *json_uint(uint64_t v) {
    if (v > (UINT64_C(1) << 53)) {
        char s[32];
        snprintf(s, sizeof s, "%llu", (unsigned long long)v);
        return cJSON_CreateString(s);
    }
    return cJSON_CreateNumber((double)v);
}

static const char *type_name(ProtobufCType t) {
    switch (t) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32: return "a 32-bit integer";
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32: return "an unsigned 32-bit integer";
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64: return "a 64-bit integer";
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: return "an unsigned 64-bit integer";
    case PROTOBUF_C_TYPE_FLOAT: case PROTOBUF_C_TYPE_DOUBLE: return "a number";
    case PROTOBUF_C_TYPE_BOOL: return "true or false";
    case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_BYTES: return "a quoted string";
    case PROTOBUF_C_TYPE_ENUM: return "an enum value";
    case PROTOBUF_C_TYPE_MESSAGE: return "a message in { }";
    }
    return "a value";
}

/* Reads the current token as a value of scalar field f into *out. */
static int scalar_value(struct lex *l, const ProtobufCFieldDescriptor *f, cJSON **out) {
    const struct tok t = l->tok;
    char shown[64];
    if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES) {
        if (t.kind != T_STRING) return fail(l, &t, "expected a quoted string, got %s", tok_show(l, shown, sizeof shown));
        /* Adjacent strings are one: "ab" "cd" is "abcd". */
        char *s = strdup(l->str);
        if (!s) return STATUS_NOMEM;
        int rc = advance(l);
        while (!rc && l->tok.kind == T_STRING) {
            size_t n = strlen(s), m = strlen(l->str);
            char *s2 = realloc(s, n + m + 1);
            if (!s2) { rc = STATUS_NOMEM; break; }
            memcpy(s2 + n, l->str, m + 1);
            s = s2;
            rc = advance(l);
        }
        if (!rc && !(*out = cJSON_CreateString(s))) rc = STATUS_NOMEM;
        free(s);
        return rc;
    }
    if (t.kind != T_WORD)
        return fail(l, &t, "expected %s, got %s", type_name(f->type), tok_show(l, shown, sizeof shown));
    char w[64];
    if (t.len >= sizeof w) return fail(l, &t, "expected %s, got %s", type_name(f->type), tok_show(l, shown, sizeof shown));
    memcpy(w, t.text, t.len);
    w[t.len] = 0;
    char *end = NULL;
    errno = 0;
    switch (f->type) {
    case PROTOBUF_C_TYPE_BOOL:
        if (!strcmp(w, "true") || !strcmp(w, "True") || !strcmp(w, "t") || !strcmp(w, "1")) *out = cJSON_CreateTrue();
        else if (!strcmp(w, "false") || !strcmp(w, "False") || !strcmp(w, "f") || !strcmp(w, "0")) *out = cJSON_CreateFalse();
        else return fail(l, &t, "expected true or false, got '%s'", w);
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *ed = f->descriptor;
        const ProtobufCEnumValue *ev;
        if ((w[0] >= '0' && w[0] <= '9') || w[0] == '-') {
            long long v = strtoll(w, &end, 0);
            ev = !errno && *end == 0 && v >= INT32_MIN && v <= INT32_MAX ? protobuf_c_enum_descriptor_get_value(ed, (int)v)
                                                                        : NULL;
        } else ev = protobuf_c_enum_descriptor_get_value_by_name(ed, w);
        if (!ev) {
            char names[400] = "";
            for (unsigned i = 0; i < ed->n_values && strlen(names) < sizeof names - 40; i++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", ed->values[i].name);
            return fail(l, &t, "'%s' is not a value of %s (%s%s)", w, ed->short_name, names,
                        ed->n_values > 0 && strlen(names) >= sizeof names - 40 ? ", ..." : "");
        }
        *out = cJSON_CreateString(ev->name);
        break;
    }
    case PROTOBUF_C_TYPE_FLOAT: case PROTOBUF_C_TYPE_DOUBLE: {
        size_t n = strlen(w);
        if (n > 1 && (w[n - 1] == 'f' || w[n - 1] == 'F') && strncmp(w, "0x", 2)) w[n - 1] = 0;
        double v = strtod(w, &end);
        if (end == w || *end || !isfinite(v) || (f->type == PROTOBUF_C_TYPE_FLOAT && fabs(v) > FLT_MAX))
            return fail(l, &t, "expected a finite number, got '%.*s'", (int)t.len, t.text);
        *out = cJSON_CreateNumber(v);
        break;
    }
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: {
        unsigned long long v = w[0] == '-' ? (errno = ERANGE, 0) : strtoull(w, &end, 0);
        uint64_t hi = f->type == PROTOBUF_C_TYPE_UINT64 || f->type == PROTOBUF_C_TYPE_FIXED64 ? UINT64_MAX : UINT32_MAX;
        if (errno || end == w || *end || v > hi)
            return fail(l, &t, "expected %s, got '%s'", type_name(f->type), w);
        *out = json_uint(v);
        break;
    }
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64: {
        long long v = strtoll(w, &end, 0);
        int wide = f->type == PROTOBUF_C_TYPE_INT64 || f->type == PROTOBUF_C_TYPE_SINT64 || f->type == PROTOBUF_C_TYPE_SFIXED64;
        if (errno || end == w || *end || (!wide && (v < INT32_MIN || v > INT32_MAX)))
            return fail(l, &t, "expected %s, got '%s'", type_name(f->type), w);
        *out = json_int(v);
        break;
    }
    default:
        return fail(l, &t, "fields of this type are not supported");
    }
    if (!*out) return STATUS_NOMEM;
    int rc = advance(l);
    if (rc) {
        cJSON_Delete(*out);
        *out = NULL;
    }
    return rc;
}

/* The value a map entry without one has: the value field's default. */
static cJSON *default_value(const ProtobufCFieldDescriptor *f) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_MESSAGE: return cJSON_CreateObject();
    case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_BYTES: return cJSON_CreateString("");
    case PROTOBUF_C_TYPE_BOOL: return cJSON_CreateFalse();
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, 0);
        return ev ? cJSON_CreateString(ev->name) : cJSON_CreateNumber(0);
    }
    default: return cJSON_CreateNumber(0);
    }
}

/* ---- messages ----------------------------------------------------------- */

int pbtxt_is_map(const ProtobufCFieldDescriptor *f) {
    const ProtobufCMessageDescriptor *d = f->type == PROTOBUF_C_TYPE_MESSAGE ? f->descriptor : NULL;
    size_t n = d ? strlen(d->short_name) : 0;
    return d && f->label == PROTOBUF_C_LABEL_REPEATED && d->n_fields == 2 && n > 5 &&
           strcmp(d->short_name + n - 5, "Entry") == 0 && strcmp(d->fields[0].name, "key") == 0 &&
           strcmp(d->fields[1].name, "value") == 0;
}

static int fields(struct lex *l, const ProtobufCMessageDescriptor *d, cJSON *obj, char close, int depth);

/* Stores v (owned) as field f of obj: appended to a list, keyed into a
 * map, or set. */
static int store(struct lex *l, const struct tok *at, const ProtobufCFieldDescriptor *f, cJSON *obj, cJSON *v) {
    if (pbtxt_is_map(f)) {
        const ProtobufCMessageDescriptor *ed = f->descriptor;
        cJSON *key = cJSON_GetObjectItemCaseSensitive(v, "key");
        cJSON *val = cJSON_DetachItemFromObjectCaseSensitive(v, "value");
        if (!val) val = default_value(&ed->fields[1]);
        char kbuf[32];
        const char *k = cJSON_IsString(key) ? key->valuestring : "";
        if (cJSON_IsNumber(key)) snprintf(kbuf, sizeof kbuf, "%.17g", key->valuedouble), k = kbuf;
        else if (cJSON_IsBool(key)) k = cJSON_IsTrue(key) ? "true" : "false";
        cJSON *m = cJSON_GetObjectItemCaseSensitive(obj, f->name);
        if (!m && !(m = cJSON_AddObjectToObject(obj, f->name))) {
            cJSON_Delete(val);
            cJSON_Delete(v);
            return STATUS_NOMEM;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(m, k); /* a later entry replaces an earlier one */
        cJSON_AddItemToObject(m, k, val);
        cJSON_Delete(v);
        return val ? 0 : STATUS_NOMEM;
    }
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        cJSON *a = cJSON_GetObjectItemCaseSensitive(obj, f->name);
        if (!a && !(a = cJSON_AddArrayToObject(obj, f->name))) {
            cJSON_Delete(v);
            return STATUS_NOMEM;
        }
        cJSON_AddItemToArray(a, v);
        return 0;
    }
    (void)at;
    cJSON_AddItemToObject(obj, f->name, v);
    return 0;
}

/* A message value: { fields } or < fields >. */
static int message_value(struct lex *l, const ProtobufCFieldDescriptor *f, cJSON *obj, int depth) {
    char shown[64];
    struct tok at = l->tok;
    if (!is_punct(l, '{') && !is_punct(l, '<'))
        return fail(l, &at, "expected '{' to open the message, got %s", tok_show(l, shown, sizeof shown));
    if (depth >= PBTXT_MAX_DEPTH) return fail(l, &at, "messages nest deeper than %d", PBTXT_MAX_DEPTH);
    char close = l->tok.text[0] == '{' ? '}' : '>';
    cJSON *child = cJSON_CreateObject();
    if (!child) return STATUS_NOMEM;
    int rc = advance(l);
    if (!rc) rc = fields(l, f->descriptor, child, close, depth + 1);
    if (!rc) rc = advance(l); /* the closing bracket */
    if (rc) {
        cJSON_Delete(child);
        return rc;
    }
    return store(l, &at, f, obj, child);
}

static int one_value(struct lex *l, const ProtobufCFieldDescriptor *f, cJSON *obj, int depth) {
    if (f->type == PROTOBUF_C_TYPE_MESSAGE) return message_value(l, f, obj, depth);
    struct tok at = l->tok;
    cJSON *v = NULL;
    int rc = scalar_value(l, f, &v);
    if (rc) return rc;
    return store(l, &at, f, obj, v);
}

/* [ v, v, ... ] for a repeated field (the current token is '['). */
static int list_value(struct lex *l, const ProtobufCFieldDescriptor *f, cJSON *obj, int depth) {
    char shown[64];
    if (f->label != PROTOBUF_C_LABEL_REPEATED)
        return fail(l, &l->tok, "the field is not repeated: a list [ ] is not allowed");
    int rc = advance(l);
    if (rc) return rc;
    /* An empty list still says the field is present. */
    if (!cJSON_GetObjectItemCaseSensitive(obj, f->name) &&
        !(pbtxt_is_map(f) ? cJSON_AddObjectToObject(obj, f->name) : cJSON_AddArrayToObject(obj, f->name)))
        return STATUS_NOMEM;
    if (is_punct(l, ']')) return advance(l);
    for (;;) {
        if ((rc = one_value(l, f, obj, depth))) return rc;
        if (is_punct(l, ',')) {
            if ((rc = advance(l))) return rc;
            continue;
        }
        if (is_punct(l, ']')) return advance(l);
        return fail(l, &l->tok, "expected ',' or ']' in the list, got %s", tok_show(l, shown, sizeof shown));
    }
}

static int valid_name(const struct tok *t) {
    if (t->kind != T_WORD || !((t->text[0] >= 'a' && t->text[0] <= 'z') || (t->text[0] >= 'A' && t->text[0] <= 'Z') ||
                               t->text[0] == '_'))
        return 0;
    for (size_t i = 0; i < t->len; i++)
        if (t->text[i] == '.' || t->text[i] == '-' || t->text[i] == '+') return 0;
    return t->len < 128;
}

/* The fields of message d up to close ('}' or '>'; 0: the end of the text),
 * which is left as the current token. */
static int fields(struct lex *l, const ProtobufCMessageDescriptor *d, cJSON *obj, char close, int depth) {
    char shown[64];
    size_t plen = strlen(l->path);
    for (;;) {
        l->path[plen] = 0;
        struct tok at = l->tok;
        if (close ? is_punct(l, close) : at.kind == T_END) return 0;
        if (at.kind == T_END) return fail(l, &at, "expected '%c' to close the message, got the end of the file", close);
        if (is_punct(l, '['))
            return fail(l, &at, "extensions and Any ([type.name]) are not supported in %s", d->short_name);
        if (!valid_name(&at))
            return fail(l, &at, "expected a field name of %s, got %s", d->short_name, tok_show(l, shown, sizeof shown));
        char name[128];
        memcpy(name, at.text, at.len);
        name[at.len] = 0;
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, name);
        if (!f) {
            if (plen) return fail(l, &at, "%s has no field '%s'", d->short_name, name);
            return fail(l, &at, "unknown field '%s' (%s has no such field)", name, d->short_name);
        }
        snprintf(l->path + plen, sizeof l->path - plen, "%s%s", plen ? "." : "", name);
        if (f->label != PROTOBUF_C_LABEL_REPEATED && cJSON_GetObjectItemCaseSensitive(obj, f->name))
            return fail(l, &at, "given twice (it is not repeated)");
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
            for (unsigned i = 0; i < d->n_fields; i++) {
                const ProtobufCFieldDescriptor *g = &d->fields[i];
                if (g != f && (g->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && g->quantifier_offset == f->quantifier_offset &&
                    cJSON_GetObjectItemCaseSensitive(obj, g->name))
                    return fail(l, &at, "'%s' is already given and the two are alternatives (one of them only)",
                                g->name);
            }
        int rc = advance(l);
        if (rc) return rc;
        if (is_punct(l, ':')) {
            if ((rc = advance(l))) return rc;
        } else if (f->type != PROTOBUF_C_TYPE_MESSAGE) {
            return fail(l, &l->tok, "expected ':' after the field name, got %s", tok_show(l, shown, sizeof shown));
        }
        rc = is_punct(l, '[') ? list_value(l, f, obj, depth) : one_value(l, f, obj, depth);
        if (rc) return rc;
        /* protobuf's text format allows a separator after a field. */
        if ((is_punct(l, ',') || is_punct(l, ';')) && (rc = advance(l))) return rc;
    }
}

int pbtxt_parse(const ProtobufCMessageDescriptor *d, const char *text, size_t len, const char *file, cJSON **out,
                char *err, size_t err_len) {
    struct lex l = {.p = text, .end = text + len, .line = 1, .line_start = text, .file = file ? file : "<text>",
                    .err = err, .err_len = err_len};
    *out = NULL;
    cJSON *obj = cJSON_CreateObject();
    if (!obj) return STATUS_NOMEM;
    int rc = advance(&l);
    if (!rc) rc = fields(&l, d, obj, 0, 0);
    free(l.str);
    if (rc) {
        if (rc == STATUS_NOMEM) status_set(err, err_len, STATUS_NOMEM, "%s: out of memory", l.file);
        cJSON_Delete(obj);
        return rc;
    }
    *out = obj;
    return 0;
}
