/* tokenizer.c - a Hugging Face tokenizer.json loaded and run: the added
 * tokens, the pipeline (normalizer, pre-tokenizer, model), truncation and
 * the post-processor's special tokens, in the `tokenizers` library's order:
 *
 *   text -> split on added tokens that match the raw text
 *        -> each other piece normalized, then split on added tokens that
 *           match normalized text
 *        -> pre-tokenized into words -> the model's ids per word
 *        -> (with a pair, the same for it) -> truncation -> template.
 *
 * Offsets (where each token came from) are not kept: kiln's outputs are
 * ids, masks and type ids, and a stage that reads offsets (Metaspace's
 * "first") needs only whether a piece begins the text. */
#include "kernels/text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "kernels/text/tokenizer_impl.h"

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)
#define NOMEM() status_set(err, err_len, STATUS_NOMEM, "out of memory")

struct added {
    char *match; /* what is matched: the content, normalized for a normalized token */
    size_t len;
    int32_t id;
    int normalized, lstrip, rstrip;
};

/* One item of a template: special ids, or sequence A (0) or B (1). */
struct tmpl_item {
    int seq; /* -1: special tokens */
    int32_t *ids;
    int nids;
    int64_t type_id;
};

struct tmpl {
    struct tmpl_item *v;
    int n;
    int nspecial; /* ids the template adds */
};

enum trunc_strategy { TRUNC_LONGEST_FIRST, TRUNC_ONLY_FIRST, TRUNC_ONLY_SECOND };

struct tokenizer {
    char *name;
    struct added *added;
    int nadded;
    int has_norm, has_pre, has_post;
    struct tok_norm norm;
    struct tok_pre pre;
    struct tok_model model;
    struct tmpl single, pair;
    int64_t max_length; /* 0: no truncation */
    enum trunc_strategy strategy;
    int trunc_left;
    int64_t pad_id, pad_type_id;
    int pad_left;
    int64_t vocab_size; /* 1 + the largest id it can give */
};

/* ---- post-processors ----------------------------------------------------- */

static int tmpl_add(struct tmpl *t, int seq, const int32_t *ids, int nids, int64_t type_id) {
    struct tmpl_item *v = realloc(t->v, (size_t)(t->n + 1) * sizeof *v);
    if (!v) return STATUS_NOMEM;
    t->v = v;
    struct tmpl_item *it = &v[t->n];
    *it = (struct tmpl_item){.seq = seq, .type_id = type_id};
    if (nids) {
        if (!(it->ids = malloc((size_t)nids * sizeof *it->ids))) return STATUS_NOMEM;
        memcpy(it->ids, ids, (size_t)nids * sizeof *ids);
        it->nids = nids;
        t->nspecial += nids;
    }
    t->n++;
    return 0;
}

static void tmpl_clear(struct tmpl *t) {
    for (int i = 0; i < t->n; i++) free(t->v[i].ids);
    free(t->v);
    memset(t, 0, sizeof *t);
}

/* ["[SEP]", 102] of BertProcessing and RobertaProcessing. */
static int token_pair(const cJSON *j, const char *k, int32_t *id, const char *what, char *err, size_t err_len) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, k);
    const cJSON *n = cJSON_GetArrayItem(a, 1);
    if (!cJSON_IsArray(a) || !cJSON_IsNumber(n) || n->valuedouble < 0 || n->valuedouble > INT32_MAX)
        return INVALID("%s: '%s' must be [token, id]", what, k);
    *id = (int32_t)n->valuedouble;
    return 0;
}

static int parse_template(const cJSON *arr, const cJSON *specials, struct tmpl *t, const char *what, char *err,
                          size_t err_len) {
    if (!cJSON_IsArray(arr)) return INVALID("%s: 'single' and 'pair' must be arrays", what);
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(e, "Sequence");
        const cJSON *o = sp ? sp : sq;
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type_id");
        if (!o || !cJSON_IsString(id) || !cJSON_IsNumber(ty))
            return INVALID("%s: a template item must be {\"SpecialToken\"|\"Sequence\": {\"id\", \"type_id\"}}", what);
        int64_t type_id = (int64_t)ty->valuedouble;
        if (sq) {
            int which = strcmp(id->valuestring, "A") == 0 ? 0 : strcmp(id->valuestring, "B") == 0 ? 1 : -1;
            if (which < 0) return INVALID("%s: sequence '%s' is neither A nor B", what, id->valuestring);
            if (tmpl_add(t, which, NULL, 0, type_id)) return NOMEM();
            continue;
        }
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(specials, id->valuestring);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(st, "ids");
        if (!cJSON_IsArray(ids)) return INVALID("%s: special token '%s' has no ids", what, id->valuestring);
        int n = cJSON_GetArraySize(ids), k = 0;
        int32_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
        if (!v) return NOMEM();
        const cJSON *x;
        cJSON_ArrayForEach(x, ids) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > INT32_MAX) {
                free(v);
                return INVALID("%s: special token '%s' has an id that is not a count", what, id->valuestring);
            }
            v[k++] = (int32_t)x->valuedouble;
        }
        int rc = tmpl_add(t, -1, v, n, type_id);
        free(v);
        if (rc) return NOMEM();
    }
    return 0;
}

static int parse_post(struct tokenizer *t, const cJSON *j, char *err, size_t err_len) {
    const char *type = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "type"))
                           ? cJSON_GetObjectItemCaseSensitive(j, "type")->valuestring : NULL;
    char what[160];
    snprintf(what, sizeof what, "%s: post_processor '%s'", t->name, type ? type : "?");
    if (!type) return INVALID("%s: the post_processor has no 'type'", t->name);
    if (strcmp(type, "ByteLevel") == 0) return 0; /* offsets only */
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "processors")) {
            int rc = parse_post(t, e, err, err_len);
            if (rc) return rc;
        }
        return 0;
    }
    if (t->has_post) return INVALID("%s: a second post-processor that adds tokens is not supported", what);
    t->has_post = 1;
    int32_t cls, sep;
    int rc;
    if (strcmp(type, "BertProcessing") == 0 || strcmp(type, "RobertaProcessing") == 0) {
        if ((rc = token_pair(j, "cls", &cls, what, err, err_len)) || (rc = token_pair(j, "sep", &sep, what, err, err_len)))
            return rc;
        int roberta = type[0] == 'R';
        int64_t b = roberta ? 0 : 1;
        if (tmpl_add(&t->single, -1, &cls, 1, 0) || tmpl_add(&t->single, 0, NULL, 0, 0) ||
            tmpl_add(&t->single, -1, &sep, 1, 0) || tmpl_add(&t->pair, -1, &cls, 1, 0) ||
            tmpl_add(&t->pair, 0, NULL, 0, 0) || tmpl_add(&t->pair, -1, &sep, 1, 0) ||
            (roberta && tmpl_add(&t->pair, -1, &sep, 1, 0)) || tmpl_add(&t->pair, 1, NULL, 0, b) ||
            tmpl_add(&t->pair, -1, &sep, 1, b))
            return NOMEM();
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
        if ((rc = parse_template(cJSON_GetObjectItemCaseSensitive(j, "single"), sp, &t->single, what, err, err_len)) ||
            (rc = parse_template(cJSON_GetObjectItemCaseSensitive(j, "pair"), sp, &t->pair, what, err, err_len)))
            return rc;
        return 0;
    }
    return INVALID("%s: post_processor '%s' is not supported", t->name, type);
}

/* ---- loading ------------------------------------------------------------- */

static int parse_added(struct tokenizer *t, const cJSON *arr, char *err, size_t err_len) {
    if (!arr || cJSON_IsNull(arr)) return 0;
    if (!cJSON_IsArray(arr)) return INVALID("%s: 'added_tokens' must be an array", t->name);
    int n = cJSON_GetArraySize(arr);
    if (n && !(t->added = calloc((size_t)n, sizeof *t->added))) return NOMEM();
    const cJSON *e;
    struct tok_work w = {0};
    struct buf nb = {0}, kb = {0};
    int rc = 0;
    cJSON_ArrayForEach(e, arr) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!cJSON_IsString(c) || !cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > INT32_MAX) {
            rc = INVALID("%s: added token %d needs a 'content' string and an 'id'", t->name, t->nadded);
            break;
        }
        const cJSON *sw = cJSON_GetObjectItemCaseSensitive(e, "single_word");
        if (cJSON_IsTrue(sw)) {
            rc = INVALID("%s: added token '%.80s': single_word is not supported", t->name, c->valuestring);
            break;
        }
        if (tok_key(c->valuestring, &kb)) {
            rc = NOMEM();
            break;
        }
        size_t cl = kb.len;
        if (!cl || !tok_utf8_valid(kb.data, cl)) {
            rc = INVALID("%s: added token %d: its content must be non-empty UTF-8", t->name, t->nadded);
            break;
        }
        struct added *a = &t->added[t->nadded++];
        a->id = (int32_t)id->valuedouble;
        a->normalized = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "normalized"));
        a->lstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "lstrip"));
        a->rstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "rstrip"));
        const char *m = kb.data;
        size_t ml = cl;
        /* A normalized token matches the normalized text: its content goes
         * through the same normalizer. */
        if (a->normalized && t->has_norm) {
            if ((rc = tok_normalize(&t->norm, m, ml, &nb, &w))) break;
            m = nb.data ? nb.data : "";
            ml = nb.len;
        }
        if (!(a->match = malloc(ml + 1))) {
            rc = NOMEM();
            break;
        }
        memcpy(a->match, m, ml);
        a->match[ml] = 0;
        a->len = ml;
    }
    tok_work_free(&w);
    buf_free(&nb);
    buf_free(&kb);
    return rc;
}

static int parse_truncation(struct tokenizer *t, const cJSON *j, int64_t max_length, char *err, size_t err_len) {
    t->max_length = 0;
    if (j && !cJSON_IsNull(j)) {
        const cJSON *ml = cJSON_GetObjectItemCaseSensitive(j, "max_length");
        const char *st = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "strategy"))
                             ? cJSON_GetObjectItemCaseSensitive(j, "strategy")->valuestring : "LongestFirst";
        const char *dir = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "direction"))
                              ? cJSON_GetObjectItemCaseSensitive(j, "direction")->valuestring : "Right";
        if (!cJSON_IsNumber(ml) || ml->valuedouble < 1)
            return INVALID("%s: truncation's 'max_length' must be a positive count", t->name);
        t->max_length = ml->valuedouble > 1e12 ? (int64_t)1e12 : (int64_t)ml->valuedouble;
        if (strcmp(st, "LongestFirst") == 0) t->strategy = TRUNC_LONGEST_FIRST;
        else if (strcmp(st, "OnlyFirst") == 0) t->strategy = TRUNC_ONLY_FIRST;
        else if (strcmp(st, "OnlySecond") == 0) t->strategy = TRUNC_ONLY_SECOND;
        else return INVALID("%s: truncation strategy '%s' is not supported", t->name, st);
        if (strcmp(dir, "Left") == 0) t->trunc_left = 1;
        else if (strcmp(dir, "Right") != 0) return INVALID("%s: truncation direction '%s' is not supported", t->name, dir);
    }
    if (max_length > 0) t->max_length = max_length;
    return 0;
}

static int parse_padding(struct tokenizer *t, const cJSON *j, char *err, size_t err_len) {
    if (!j || cJSON_IsNull(j)) return 0;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "pad_id");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "pad_type_id");
    const cJSON *dir = cJSON_GetObjectItemCaseSensitive(j, "direction");
    if (cJSON_IsNumber(id)) t->pad_id = (int64_t)id->valuedouble;
    if (cJSON_IsNumber(ty)) t->pad_type_id = (int64_t)ty->valuedouble;
    if (cJSON_IsString(dir) && strcmp(dir->valuestring, "Left") == 0) t->pad_left = 1;
    return 0;
}

/* Members of the file kiln reads; others with a non-null value (a decoder
 * is fine: decoding is not kiln's) are named in the refusal. */
static int check_members(const struct tokenizer *t, const cJSON *root, char *err, size_t err_len) {
    static const char *const known[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                        "pre_tokenizer", "model", "post_processor", "decoder"};
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        size_t i = 0;
        while (i < sizeof known / sizeof known[0] && strcmp(e->string, known[i])) i++;
        if (i == sizeof known / sizeof known[0] && !cJSON_IsNull(e))
            return INVALID("%s: '%s' is not supported", t->name, e->string);
    }
    return 0;
}

/* 1 + the largest id of the model's vocabulary and the added tokens. */
static int64_t vocab_size(const struct tokenizer *t) {
    int64_t top = -1;
    const struct tok_vocab *v = &t->model.vocab;
    for (size_t i = 0; v->slots && i <= v->mask; i++)
        if (v->slots[i].s && v->slots[i].id > top) top = v->slots[i].id;
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].id > top) top = t->added[i].id;
    if ((int64_t)t->model.nscores - 1 > top) top = (int64_t)t->model.nscores - 1;
    return top + 1;
}

struct tokenizer *tokenizer_load(const struct tokenizer_params *p, char *err, size_t err_len) {
    struct tokenizer *t = calloc(1, sizeof *t);
    cJSON *root = NULL;
    if (!t || !(t->name = strdup(p->name ? p->name : "tokenizer.json"))) {
        NOMEM();
        goto fail;
    }
    /* cJSON's strings end at a NUL, and vocabularies trained on raw text
     * hold "\u0000": such escapes become the byte 0xFF (never in UTF-8),
     * which the vocabulary readers turn back into NUL (tok_key). */
    char *json = malloc(p->len + 1);
    if (!json) {
        NOMEM();
        goto fail;
    }
    size_t jl = 0;
    for (size_t i = 0; i < p->len; i++) {
        if (p->json[i] == '\\' && i + 5 < p->len && memcmp(p->json + i + 1, "u0000", 5) == 0) {
            json[jl++] = (char)0xFF;
            i += 5;
            continue;
        }
        json[jl++] = p->json[i];
        if (p->json[i] == '\\' && i + 1 < p->len) json[jl++] = p->json[++i];
    }
    root = cJSON_ParseWithLength(json, jl);
    free(json);
    if (!root || !cJSON_IsObject(root)) {
        INVALID("%s: not a JSON object%s", t->name, root ? "" : " (the JSON does not parse)");
        goto fail;
    }
    if (check_members(t, root, err, err_len)) goto fail;
    const cJSON *nj = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pj = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *post = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    if (nj && !cJSON_IsNull(nj)) {
        t->has_norm = 1;
        if (tok_norm_parse(nj, &t->norm, t->name, err, err_len)) goto fail;
    }
    if (pj && !cJSON_IsNull(pj)) {
        t->has_pre = 1;
        if (tok_pre_parse(pj, &t->pre, t->name, err, err_len)) goto fail;
    }
    if (tok_model_parse(cJSON_GetObjectItemCaseSensitive(root, "model"), &t->model, t->name, err, err_len) ||
        parse_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), err, err_len) ||
        (post && !cJSON_IsNull(post) && parse_post(t, post, err, err_len)) ||
        parse_truncation(t, cJSON_GetObjectItemCaseSensitive(root, "truncation"), p->max_length, err, err_len) ||
        parse_padding(t, cJSON_GetObjectItemCaseSensitive(root, "padding"), err, err_len))
        goto fail;
    cJSON_Delete(root);
    t->vocab_size = vocab_size(t);
    return t;
fail:
    cJSON_Delete(root);
    tokenizer_free(t);
    return NULL;
}

void tokenizer_free(struct tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->nadded; i++) free(t->added[i].match);
    free(t->added);
    if (t->has_norm) tok_norm_clear(&t->norm);
    if (t->has_pre) tok_pre_clear(&t->pre);
    tok_model_clear(&t->model);
    tmpl_clear(&t->single);
    tmpl_clear(&t->pair);
    free(t->name);
    free(t);
}

void tokenizer_pad(const struct tokenizer *t, int64_t *pad_id, int64_t *pad_type_id, int *left) {
    *pad_id = t->pad_id;
    *pad_type_id = t->pad_type_id;
    *left = t->pad_left;
}

int64_t tokenizer_max_length(const struct tokenizer *t) { return t->max_length; }

int64_t tokenizer_vocab_size(const struct tokenizer *t) { return t->vocab_size; }

int tokenizer_utf8_valid(const char *s, size_t len) { return tok_utf8_valid(s, len); }

/* ---- encoding ------------------------------------------------------------ */

/* Splits s[0..len) on the added tokens whose normalized flag is norm
 * (leftmost, then longest), with lstrip and rstrip taking the whitespace
 * beside a match, into out: tokens as pieces with their id. */
static int split_added(const struct tokenizer *t, int norm, const char *s, size_t len, int at_start,
                       struct tok_pieces *out) {
    size_t done = 0;
    for (size_t i = 0; i < len; i++) {
        const struct added *best = NULL;
        for (int k = 0; k < t->nadded; k++) {
            const struct added *a = &t->added[k];
            if (a->normalized != norm || a->len > len - i || a->match[0] != s[i]) continue;
            if (memcmp(a->match, s + i, a->len) == 0 && (!best || a->len > best->len)) best = a;
        }
        if (!best) continue;
        size_t st = i, e = i + best->len;
        /* lstrip: back over whitespace, not into the previous match. */
        if (best->lstrip) st = tok_space_before(s, done, st);
        if (best->rstrip) e = tok_space_after(s, e, len);
        if (tok_pieces_add(out, s + done, st - done, -1, at_start && done == 0) ||
            tok_pieces_add(out, s + st, e - st, best->id, at_start && st == 0))
            return STATUS_NOMEM;
        done = e;
        i = e - 1;
    }
    return tok_pieces_add(out, s + done, len - done, -1, at_start && done == 0);
}

struct encode_work {
    struct tok_pieces a, b;
    struct tok_work w;
    struct buf norm;
};

static void encode_work_free(struct encode_work *x) {
    tok_pieces_free(&x->a);
    tok_pieces_free(&x->b);
    tok_work_free(&x->w);
    buf_free(&x->norm);
}

/* One sequence's ids (no special tokens) into ids. */
static int encode_sequence(const struct tokenizer *t, const char *s, size_t len, struct encode_work *x,
                           struct tok_ids *ids, char *err, size_t err_len) {
    struct tok_pieces *a = &x->a, *b = &x->b;
    tok_pieces_reset(a);
    tok_pieces_reset(b);
    if (split_added(t, 0, s, len, 1, a)) return NOMEM();
    /* Normalize the pieces, then split them on the normalized tokens. */
    for (size_t i = 0; i < a->n; i++) {
        const struct tok_piece *pc = &a->v[i];
        const char *ps = a->text.data + pc->off;
        int rc;
        if (pc->id >= 0) rc = tok_pieces_add(b, ps, pc->len, pc->id, pc->at_start);
        else if (t->has_norm) {
            if ((rc = tok_normalize(&t->norm, ps, pc->len, &x->norm, &x->w)))
                return rc == STATUS_NOMEM ? NOMEM() : INVALID("the normalizer failed on this text (PCRE2's match limits)");
            rc = split_added(t, 1, x->norm.data ? x->norm.data : "", x->norm.len, pc->at_start, b);
        } else rc = split_added(t, 1, ps, pc->len, pc->at_start, b);
        if (rc) return NOMEM();
    }
    struct tok_pieces *words = b;
    if (t->has_pre) {
        int rc = tok_pre_tokenize(&t->pre, b, a, &x->w);
        if (rc == STATUS_NOMEM) return NOMEM();
        if (rc) return INVALID("the pre-tokenizer's regex failed on this text (PCRE2's match limits)");
        words = a;
    }
    for (size_t i = 0; i < words->n; i++) {
        const struct tok_piece *pc = &words->v[i];
        int rc = pc->id >= 0 ? (tok_ids_push(ids, pc->id) ? NOMEM() : 0)
                             : tok_model_encode(&t->model, words->text.data + pc->off, pc->len, ids, err, err_len);
        if (rc) return rc;
    }
    return 0;
}

/* The library's truncate_encodings, on lengths: how many ids of each
 * sequence to keep (n2 < 0: no pair). */
static int truncate_lengths(const struct tokenizer *t, size_t *n1, size_t *n2, int pair, char *err, size_t err_len) {
    const struct tmpl *tp = pair ? &t->pair : &t->single;
    int64_t max = t->max_length - (t->has_post ? tp->nspecial : 0);
    if (max < 0) max = 0;
    size_t m = (size_t)max, total = *n1 + (pair ? *n2 : 0);
    if (total <= m) return 0;
    size_t remove = total - m;
    if (t->strategy == TRUNC_LONGEST_FIRST) {
        if (!pair) {
            *n1 = m;
            return 0;
        }
        size_t a = *n1, b = *n2;
        int swap = a > b;
        if (swap) {
            size_t x = a;
            a = b;
            b = x;
        }
        if (a > m) b = a;
        else b = a > m - a ? a : m - a;
        if (a + b > m) {
            a = m / 2;
            b = a + m % 2;
        }
        if (swap) {
            size_t x = a;
            a = b;
            b = x;
        }
        if (a < *n1) *n1 = a;
        if (b < *n2) *n2 = b;
        return 0;
    }
    size_t *target = t->strategy == TRUNC_ONLY_FIRST ? n1 : pair ? n2 : NULL;
    if (!target) return INVALID("truncation only_second needs a pair of texts");
    if (*target <= remove)
        return INVALID("truncation to %lld tokens: the sequence to truncate is too short (%zu tokens, %zu to remove)",
                       (long long)t->max_length, *target, remove);
    *target -= remove;
    return 0;
}

static int out_push(struct tokenizer_encoding *o, int64_t id, int64_t type_id) {
    if (o->n == o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 64;
        int64_t *a = realloc(o->ids, nc * sizeof *a);
        if (!a) return STATUS_NOMEM;
        o->ids = a;
        int64_t *b = realloc(o->type_ids, nc * sizeof *b);
        if (!b) return STATUS_NOMEM;
        o->type_ids = b;
        o->cap = nc;
    }
    o->ids[o->n] = id;
    o->type_ids[o->n++] = type_id;
    return 0;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, const char *pair, size_t pair_len,
                     struct tokenizer_encoding *out, char *err, size_t err_len) {
    out->n = 0;
    if (!tok_utf8_valid(text, len)) return INVALID("the text is not valid UTF-8");
    if (pair && !tok_utf8_valid(pair, pair_len)) return INVALID("the second text of the pair is not valid UTF-8");
    struct encode_work x = {0};
    struct tok_ids ids[2] = {{0}};
    int rc = encode_sequence(t, text, len, &x, &ids[0], err, err_len);
    if (!rc && pair) rc = encode_sequence(t, pair, pair_len, &x, &ids[1], err, err_len);
    encode_work_free(&x);
    size_t n[2] = {ids[0].n, ids[1].n};
    if (!rc && t->max_length > 0) rc = truncate_lengths(t, &n[0], &n[1], pair != NULL, err, err_len);
    /* Right truncation keeps the first n ids, left the last n. */
    size_t from[2] = {t->trunc_left ? ids[0].n - n[0] : 0, t->trunc_left ? ids[1].n - n[1] : 0};
    if (!rc && !t->has_post) {
        for (int s = 0; s < (pair ? 2 : 1) && !rc; s++)
            for (size_t i = 0; i < n[s] && !rc; i++) rc = out_push(out, ids[s].v[from[s] + i], s) ? NOMEM() : 0;
    } else if (!rc) {
        const struct tmpl *tp = pair ? &t->pair : &t->single;
        for (int k = 0; k < tp->n && !rc; k++) {
            const struct tmpl_item *it = &tp->v[k];
            if (it->seq < 0)
                for (int i = 0; i < it->nids && !rc; i++) rc = out_push(out, it->ids[i], it->type_id) ? NOMEM() : 0;
            else
                for (size_t i = 0; i < n[it->seq] && !rc; i++)
                    rc = out_push(out, ids[it->seq].v[from[it->seq] + i], it->type_id) ? NOMEM() : 0;
        }
    }
    free(ids[0].v);
    free(ids[1].v);
    if (rc) out->n = 0;
    return rc;
}

void tokenizer_encoding_free(struct tokenizer_encoding *e) {
    if (!e) return;
    free(e->ids);
    free(e->type_ids);
    memset(e, 0, sizeof *e);
}
