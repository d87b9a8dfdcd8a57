/* tokenizer_models.c - the models of a tokenizer: a word (a pre-tokenized
 * piece) to ids. WordPiece (BERT's greedy longest match), BPE (merges by
 * rank, GPT-2's and RoBERTa's byte-level vocabularies among them) and
 * Unigram (SentencePiece's best segmentation by score), each as the
 * `tokenizers` library computes it, ties and unknown characters included. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/text/tokenizer_impl.h"

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)
#define NOMEM() status_set(err, err_len, STATUS_NOMEM, "out of memory")

/* ---- the vocabulary ------------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t k;
        memcpy(&k, s, 8);
        h = (h ^ k) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t k = 0;
    memcpy(&k, s, n);
    h = (h ^ k) * 0x94d049bb133111ebull;
    return h ^ (h >> 29);
}

static int vocab_grow(struct tok_vocab *v) {
    size_t nc = v->slots ? (v->mask + 1) * 2 : 1024;
    struct tok_vocab_slot *ns = calloc(nc, sizeof *ns);
    if (!ns) return STATUS_NOMEM;
    for (size_t i = 0; v->slots && i <= v->mask; i++) {
        if (!v->slots[i].s) continue;
        size_t j = hash_bytes(v->slots[i].s, v->slots[i].len) & (nc - 1);
        while (ns[j].s) j = (j + 1) & (nc - 1);
        ns[j] = v->slots[i];
    }
    free(v->slots);
    v->slots = ns;
    v->mask = nc - 1;
    return 0;
}

int tok_vocab_put(struct tok_vocab *v, const char *s, size_t len, int32_t id) {
    if ((!v->slots || (v->n + 1) * 2 > v->mask + 1) && vocab_grow(v)) return STATUS_NOMEM;
    size_t j = hash_bytes(s, len) & v->mask;
    for (; v->slots[j].s; j = (j + 1) & v->mask)
        if (v->slots[j].len == len && memcmp(v->slots[j].s, s, len) == 0) {
            v->slots[j].id = id;
            return 0;
        }
    char *c = malloc(len + 1);
    if (!c) return STATUS_NOMEM;
    memcpy(c, s, len);
    c[len] = 0;
    v->slots[j] = (struct tok_vocab_slot){c, (uint32_t)len, id};
    v->n++;
    return 0;
}

int32_t tok_vocab_get(const struct tok_vocab *v, const char *s, size_t len) {
    if (!v->slots) return -1;
    for (size_t j = hash_bytes(s, len) & v->mask; v->slots[j].s; j = (j + 1) & v->mask)
        if (v->slots[j].len == len && memcmp(v->slots[j].s, s, len) == 0) return v->slots[j].id;
    return -1;
}

void tok_vocab_free(struct tok_vocab *v) {
    for (size_t i = 0; v->slots && i <= v->mask; i++) free((char *)v->slots[i].s);
    free(v->slots);
    memset(v, 0, sizeof *v);
}

int tok_key(const char *s, struct buf *b) {
    b->len = 0;
    size_t n = strlen(s);
    buf_add(b, s, n);
    if (b->failed) return STATUS_NOMEM;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)b->data[i] == 0xFF) b->data[i] = 0;
    if (!b->data) buf_add(b, "", 0);
    return b->failed ? STATUS_NOMEM : 0;
}

int tok_ids_push(struct tok_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        int32_t *v = tok_grow(ids->v, &ids->cap, sizeof *v, 64);
        if (!v) return STATUS_NOMEM;
        ids->v = v;
    }
    ids->v[ids->n++] = id;
    return 0;
}

/* ---- BPE merges: (left id, right id) -> (rank, merged id) ---------------- */

static uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static const struct tok_merge *merge_get(const struct tok_model *m, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t j = mix64(key) & m->merges_mask; m->merges[j].rank >= 0; j = (j + 1) & m->merges_mask)
        if (m->merges[j].key == key) return &m->merges[j];
    return NULL;
}

/* Later merges of the same pair replace earlier ones, as in the library's map. */
static void merge_put(struct tok_model *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t j = mix64(key) & m->merges_mask;
    while (m->merges[j].rank >= 0 && m->merges[j].key != key) j = (j + 1) & m->merges_mask;
    m->merges[j] = (struct tok_merge){key, rank, id};
}

/* ---- WordPiece ----------------------------------------------------------- */

static int missing_unk(const char *model, char *err, size_t err_len) {
    return INVALID("the text has a character that the %s vocabulary lacks, and the tokenizer has no unk token", model);
}

static int wordpiece_encode(const struct tok_model *m, const char *s, size_t len, struct tok_ids *out, char *err,
                            size_t err_len) {
    size_t nchars = 0;
    for (size_t i = 0; i < len; i++) nchars += ((unsigned char)s[i] & 0xC0) != 0x80;
    size_t mark = out->n;
    if (nchars <= (size_t)m->max_chars) {
        char stackbuf[512], *tmp = stackbuf;
        if (m->prefix_len + len > sizeof stackbuf && !(tmp = malloc(m->prefix_len + len))) return NOMEM();
        memcpy(tmp, m->prefix, m->prefix_len);
        size_t start = 0;
        int bad = 0;
        while (start < len && !bad) {
            size_t end = len;
            int32_t id = -1;
            while (start < end) {
                if (start > 0) {
                    memcpy(tmp + m->prefix_len, s + start, end - start);
                    id = tok_vocab_get(&m->vocab, tmp, m->prefix_len + end - start);
                } else id = tok_vocab_get(&m->vocab, s, end);
                if (id >= 0) break;
                do end--;
                while (end > start && ((unsigned char)s[end] & 0xC0) == 0x80);
            }
            if (id < 0) bad = 1;
            else if (tok_ids_push(out, id)) {
                if (tmp != stackbuf) free(tmp);
                return NOMEM();
            }
            start = end;
        }
        if (tmp != stackbuf) free(tmp);
        if (!bad) return 0;
    }
    out->n = mark;
    if (m->unk_id < 0) return missing_unk("WordPiece", err, err_len);
    return tok_ids_push(out, m->unk_id) ? NOMEM() : 0;
}

/* ---- BPE ----------------------------------------------------------------- */

/* A symbol of the word being merged: its id, and its neighbours (-1: none;
 * a merged-away symbol has id -1). */
struct bpe_sym {
    int32_t id;
    int32_t prev, next;
};

/* A candidate merge: the pair starting at symbol pos, of this rank, making
 * id. The heap orders by rank, then position, as the library's does; an
 * entry whose pair changed since it was pushed is skipped when popped. */
struct bpe_cand {
    int32_t rank, pos, id;
};

static int cand_less(const struct bpe_cand *a, const struct bpe_cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct bpe_cand *h, size_t *n, struct bpe_cand c) {
    size_t i = (*n)++;
    while (i > 0 && cand_less(&c, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static struct bpe_cand heap_pop(struct bpe_cand *h, size_t *n) {
    struct bpe_cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= *n) break;
        if (k + 1 < *n && cand_less(&h[k + 1], &h[k])) k++;
        if (!cand_less(&h[k], &last)) break;
        h[i] = h[k];
        i = k;
    }
    if (*n) h[i] = last;
    return top;
}

/* Pushes the pair starting at symbol i, if the merges have it. */
static void bpe_candidate(const struct tok_model *m, const struct bpe_sym *sy, int32_t i, struct bpe_cand *h,
                          size_t *nh) {
    if (i < 0 || sy[i].next < 0) return;
    const struct tok_merge *mg = merge_get(m, sy[i].id, sy[sy[i].next].id);
    if (mg) heap_push(h, nh, (struct bpe_cand){mg->rank, i, mg->id});
}

/* Merges the word's symbols by rank (a heap of candidates: n log n, so a
 * long word without spaces costs no more than its length's worth). */
static void bpe_merge(const struct tok_model *m, struct bpe_sym *sy, size_t n, struct bpe_cand *h) {
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) {
        sy[i].prev = (int32_t)i - 1;
        sy[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) bpe_candidate(m, sy, (int32_t)i, h, &nh);
    while (nh) {
        struct bpe_cand c = heap_pop(h, &nh);
        struct bpe_sym *a = &sy[c.pos];
        if (a->id < 0 || a->next < 0) continue;
        const struct tok_merge *mg = merge_get(m, a->id, sy[a->next].id);
        if (!mg || mg->id != c.id || mg->rank != c.rank) continue;
        int32_t b = a->next;
        a->id = c.id;
        a->next = sy[b].next;
        if (a->next >= 0) sy[a->next].prev = c.pos;
        sy[b].id = -1;
        bpe_candidate(m, sy, a->prev, h, &nh);
        bpe_candidate(m, sy, c.pos, h, &nh);
    }
}

static int bpe_encode(const struct tok_model *m, const char *s, size_t len, struct tok_ids *out, char *err,
                      size_t err_len) {
    if (m->ignore_merges) {
        int32_t id = tok_vocab_get(&m->vocab, s, len);
        if (id >= 0) return tok_ids_push(out, id) ? NOMEM() : 0;
    }
    /* Each character gives at most its bytes with the prefix and suffix
     * (byte fallback), and a pending unk. A merge pushes two candidates
     * and removes a symbol: the heap holds at most 3 per symbol. */
    size_t cap = len * (2 + m->prefix_len + m->suffix_len) + 1;
    struct bpe_sym stacksy[256], *sy = stacksy;
    struct bpe_cand stackh[768], *h = stackh;
    if (cap > 256 && (!(sy = malloc(cap * sizeof *sy)) || !(h = malloc(3 * cap * sizeof *h)))) {
        if (sy != stacksy) free(sy);
        return NOMEM();
    }
    size_t n = 0;
    char stackbuf[256], *tmp = stackbuf;
    size_t tcap = m->prefix_len + m->suffix_len + 4;
    int rc = 0;
    if (tcap > sizeof stackbuf && !(tmp = malloc(tcap))) {
        rc = NOMEM();
        goto out;
    }
    int32_t unk = -1; /* a pending unk, fused with the next when fuse_unk */
    for (size_t i = 0; i < len;) {
        size_t b = i;
        tok_utf8_next(s, len, &i);
        size_t k = 0;
        if (b > 0 && m->prefix_len) memcpy(tmp, m->prefix, m->prefix_len), k = m->prefix_len;
        memcpy(tmp + k, s + b, i - b);
        k += i - b;
        if (i == len && m->suffix_len) memcpy(tmp + k, m->suffix, m->suffix_len), k += m->suffix_len;
        int32_t id = tok_vocab_get(&m->vocab, tmp, k);
        if (id >= 0) {
            if (unk >= 0) sy[n++].id = unk, unk = -1;
            sy[n++].id = id;
            continue;
        }
        if (m->byte_fallback) {
            int all = 1;
            for (size_t j = 0; j < k; j++) all &= m->byte_ids[(unsigned char)tmp[j]] >= 0;
            if (all) {
                for (size_t j = 0; j < k; j++) sy[n++].id = m->byte_ids[(unsigned char)tmp[j]];
                continue;
            }
        }
        if (m->unk_id >= 0) {
            if (unk >= 0 && !m->fuse_unk) sy[n++].id = unk;
            unk = m->unk_id;
        }
    }
    if (unk >= 0) sy[n++].id = unk;
    bpe_merge(m, sy, n, h);
    for (int32_t i = n ? 0 : -1; i >= 0 && !rc; i = sy[i].next)
        if (tok_ids_push(out, sy[i].id)) rc = NOMEM();
out:
    if (sy != stacksy) free(sy);
    if (h != stackh) free(h);
    if (tmp != stackbuf) free(tmp);
    return rc;
}

/* ---- Unigram ------------------------------------------------------------- */

struct uni_node {
    double score;
    int64_t start; /* -1: no path ends here yet */
    int32_t id;
};

static int unigram_push(const struct tok_model *m, const char *p, size_t n, struct tok_ids *out, char *err,
                        size_t err_len) {
    int32_t id = tok_vocab_get(&m->vocab, p, n);
    if (id < 0 && m->byte_fallback) {
        int all = 1;
        for (size_t j = 0; j < n; j++) all &= m->byte_ids[(unsigned char)p[j]] >= 0;
        if (all) {
            for (size_t j = 0; j < n; j++)
                if (tok_ids_push(out, m->byte_ids[(unsigned char)p[j]])) return NOMEM();
            return 0;
        }
    }
    if (id < 0) id = m->unk_id;
    if (id < 0) return missing_unk("Unigram", err, err_len);
    return tok_ids_push(out, id) ? NOMEM() : 0;
}

static int unigram_encode(const struct tok_model *m, const char *s, size_t len, struct tok_ids *out, char *err,
                          size_t err_len) {
    if (!len) return 0;
    struct uni_node *best = malloc((len + 1) * sizeof *best);
    int64_t *ends = malloc((len + 1) * sizeof *ends);
    if (!best || !ends) {
        free(best);
        free(ends);
        return NOMEM();
    }
    for (size_t i = 0; i <= len; i++) best[i] = (struct uni_node){0, -1, -1};
    double unk_score = m->min_score - 10.0;
    int rc = 0;
    for (size_t at = 0; at < len;) {
        double base = best[at].score;
        size_t j = at;
        tok_utf8_next(s, len, &j);
        size_t mblen = j - at;
        int single = 0;
        size_t lim = len - at < m->max_piece ? len - at : m->max_piece;
        for (size_t l = mblen; l <= lim;) {
            int32_t id = tok_vocab_get(&m->vocab, s + at, l);
            if (id >= 0) {
                struct uni_node *t = &best[at + l];
                double c = m->scores[id] + base;
                if (t->start < 0 || c > t->score) *t = (struct uni_node){c, (int64_t)at, id};
                if (l == mblen) single = 1;
            }
            if (at + l >= len) break;
            size_t q = at + l;
            tok_utf8_next(s, len, &q);
            l = q - at;
        }
        if (!single) {
            if (m->unk_id < 0) {
                rc = missing_unk("Unigram", err, err_len);
                break;
            }
            struct uni_node *t = &best[at + mblen];
            double c = unk_score + base;
            if (t->start < 0 || c > t->score) *t = (struct uni_node){c, (int64_t)at, m->unk_id};
        }
        at = j;
    }
    /* Back from the end; runs of unknown pieces fuse into one. */
    size_t ne = 0;
    for (int64_t e = (int64_t)len; !rc && e > 0; e = best[e].start) ends[ne++] = e;
    size_t mark = out->n;
    for (size_t k = ne; !rc && k-- > 0;) {
        size_t e = (size_t)ends[k], st = (size_t)best[e].start;
        if (best[e].id == m->unk_id && m->unk_id >= 0) {
            while (k > 0 && best[ends[k - 1]].id == m->unk_id) e = (size_t)ends[--k];
        }
        rc = unigram_push(m, s + st, e - st, out, err, err_len);
    }
    if (rc) out->n = mark;
    free(best);
    free(ends);
    return rc;
}

int tok_model_encode(const struct tok_model *m, const char *s, size_t len, struct tok_ids *out, char *err,
                     size_t err_len) {
    switch (m->kind) {
    case TOK_MODEL_WORDPIECE: return wordpiece_encode(m, s, len, out, err, err_len);
    case TOK_MODEL_BPE: return bpe_encode(m, s, len, out, err, err_len);
    case TOK_MODEL_UNIGRAM: return unigram_encode(m, s, len, out, err, err_len);
    }
    return 0;
}

/* ---- parsing ------------------------------------------------------------- */

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int jflag(const cJSON *o, const char *k, int *out, const char *what, char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    *out = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return INVALID("%s: '%s' must be true or false", what, k);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* An optional string member: NULL or a copy in *out. */
static int jdup(const cJSON *o, const char *k, char **out, size_t *len, const char *what, char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    *out = NULL;
    *len = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return INVALID("%s: '%s' must be a string", what, k);
    *len = strlen(v->valuestring);
    return (*out = strdup(v->valuestring)) ? 0 : NOMEM();
}

/* {"token": id, ...} */
static int parse_vocab_map(const cJSON *j, struct tok_model *m, const char *what, char *err, size_t err_len) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(j, "vocab");
    if (!cJSON_IsObject(vocab)) return INVALID("%s: 'vocab' must be an object of token: id", what);
    const cJSON *e;
    struct buf kb = {0};
    int rc = 0;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > INT32_MAX ||
            e->valuedouble != floor(e->valuedouble)) {
            rc = INVALID("%s: vocab entry '%.80s' must have an id from 0 to %d", what, e->string, INT32_MAX);
            break;
        }
        if (tok_key(e->string, &kb)) {
            rc = NOMEM();
            break;
        }
        if (!tok_utf8_valid(kb.data, kb.len)) {
            rc = INVALID("%s: vocab entry is not valid UTF-8", what);
            break;
        }
        if (tok_vocab_put(&m->vocab, kb.data, kb.len, (int32_t)e->valuedouble)) {
            rc = NOMEM();
            break;
        }
    }
    buf_free(&kb);
    return rc;
}

static void byte_tokens(struct tok_model *m) {
    for (int b = 0; b < 256; b++) {
        char t[8];
        snprintf(t, sizeof t, "<0x%02X>", b);
        m->byte_ids[b] = tok_vocab_get(&m->vocab, t, 6);
    }
}

static int parse_merges(const cJSON *j, struct tok_model *m, const char *what, char *err, size_t err_len) {
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(j, "merges");
    if (!merges || cJSON_IsNull(merges)) return 0;
    if (!cJSON_IsArray(merges)) return INVALID("%s: 'merges' must be an array", what);
    size_t n = (size_t)cJSON_GetArraySize(merges), cap = 16;
    while (cap < n * 2 + 2) cap *= 2;
    if (!(m->merges = malloc(cap * sizeof *m->merges))) return NOMEM();
    for (size_t i = 0; i < cap; i++) m->merges[i] = (struct tok_merge){0, -1, -1};
    m->merges_mask = cap - 1;
    const cJSON *e;
    int32_t rank = 0;
    struct buf tb = {0}, ka = {0}, kb2 = {0};
    int rc = 0;
    cJSON_ArrayForEach(e, merges) {
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = INVALID("%s: merge %d ('%.80s') must be two tokens separated by one space", what, rank + 1,
                             e->valuestring);
                break;
            }
            if (tok_key(e->valuestring, &ka)) {
                rc = NOMEM();
                break;
            }
            a = ka.data, al = (size_t)(sp - e->valuestring), b = a + al + 1, bl = ka.len - al - 1;
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            if (tok_key(cJSON_GetArrayItem(e, 0)->valuestring, &ka) ||
                tok_key(cJSON_GetArrayItem(e, 1)->valuestring, &kb2)) {
                rc = NOMEM();
                break;
            }
            a = ka.data, al = ka.len, b = kb2.data, bl = kb2.len;
        } else {
            rc = INVALID("%s: merge %d must be \"a b\" or [\"a\", \"b\"]", what, rank + 1);
            break;
        }
        int32_t ai = tok_vocab_get(&m->vocab, a, al), bi = tok_vocab_get(&m->vocab, b, bl);
        if (ai < 0 || bi < 0 || bl < m->prefix_len) {
            rc = INVALID("%s: merge %d names a token that is not in the vocab ('%.*s')", what, rank + 1,
                         (int)(ai < 0 ? (al > 80 ? 80 : al) : (bl > 80 ? 80 : bl)), ai < 0 ? a : b);
            break;
        }
        tb.len = 0;
        buf_add(&tb, a, al);
        buf_add(&tb, b + m->prefix_len, bl - m->prefix_len);
        if (tb.failed) {
            rc = NOMEM();
            break;
        }
        int32_t id = tok_vocab_get(&m->vocab, tb.data, tb.len);
        if (id < 0) {
            rc = INVALID("%s: merge %d makes '%.*s', which is not in the vocab", what, rank + 1,
                         (int)(tb.len > 80 ? 80 : tb.len), tb.data);
            break;
        }
        merge_put(m, ai, bi, rank++, id);
    }
    buf_free(&tb);
    buf_free(&ka);
    buf_free(&kb2);
    return rc;
}

static int parse_unigram(const cJSON *j, struct tok_model *m, const char *what, char *err, size_t err_len) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(j, "vocab");
    if (!cJSON_IsArray(vocab)) return INVALID("%s: 'vocab' must be an array of [piece, score]", what);
    size_t n = (size_t)cJSON_GetArraySize(vocab);
    if (!(m->scores = calloc(n ? n : 1, sizeof *m->scores))) return NOMEM();
    m->nscores = n;
    m->min_score = INFINITY;
    const cJSON *e;
    int32_t id = 0;
    struct buf kb = {0};
    cJSON_ArrayForEach(e, vocab) {
        const cJSON *p = cJSON_GetArrayItem(e, 0), *s = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || !cJSON_IsString(p) || !cJSON_IsNumber(s)) {
            buf_free(&kb);
            return INVALID("%s: vocab entry %d must be [piece, score]", what, id);
        }
        if (tok_key(p->valuestring, &kb)) break;
        size_t l = kb.len;
        if (!tok_utf8_valid(kb.data, l)) {
            buf_free(&kb);
            return INVALID("%s: vocab entry %d is not valid UTF-8", what, id);
        }
        if (tok_vocab_put(&m->vocab, kb.data, l, id)) break;
        m->scores[id] = s->valuedouble;
        if (s->valuedouble < m->min_score) m->min_score = s->valuedouble;
        if (l > m->max_piece) m->max_piece = l;
        id++;
    }
    int full = id == (int32_t)n;
    buf_free(&kb);
    if (!full) return NOMEM();
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "unk_id");
    m->unk_id = -1;
    if (u && !cJSON_IsNull(u)) {
        if (!cJSON_IsNumber(u) || u->valuedouble < 0 || u->valuedouble >= (double)n)
            return INVALID("%s: 'unk_id' must be an index into the vocab", what);
        m->unk_id = (int32_t)u->valuedouble;
    }
    return jflag(j, "byte_fallback", &m->byte_fallback, what, err, err_len);
}

int tok_model_parse(const cJSON *j, struct tok_model *m, const char *file, char *err, size_t err_len) {
    memset(m, 0, sizeof *m);
    m->unk_id = -1;
    const char *type = jstr(j, "type");
    char what[160];
    snprintf(what, sizeof what, "%s: model '%s'", file, type ? type : "?");
    if (!cJSON_IsObject(j) || !type) return INVALID("%s: 'model' must be an object with a 'type'", file);
    int rc;
    size_t l;
    if (strcmp(type, "WordPiece") == 0) {
        m->kind = TOK_MODEL_WORDPIECE;
        if ((rc = parse_vocab_map(j, m, what, err, err_len))) return rc;
        const char *unk = jstr(j, "unk_token");
        if (!unk) unk = "[UNK]";
        m->unk_id = tok_vocab_get(&m->vocab, unk, strlen(unk));
        const char *pre = jstr(j, "continuing_subword_prefix");
        if (!pre) pre = "##";
        m->prefix_len = strlen(pre);
        if (!(m->prefix = strdup(pre))) return NOMEM();
        const cJSON *mc = cJSON_GetObjectItemCaseSensitive(j, "max_input_chars_per_word");
        m->max_chars = 100;
        if (mc && !cJSON_IsNull(mc)) {
            if (!cJSON_IsNumber(mc) || mc->valuedouble < 0)
                return INVALID("%s: 'max_input_chars_per_word' must be a count", what);
            m->max_chars = mc->valuedouble > 1e9 ? 1000000000 : (int)mc->valuedouble;
        }
        return 0;
    }
    if (strcmp(type, "BPE") == 0) {
        m->kind = TOK_MODEL_BPE;
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "dropout");
        if (d && !cJSON_IsNull(d) && !(cJSON_IsNumber(d) && d->valuedouble == 0))
            return INVALID("%s: 'dropout' is not supported (kiln encodes the same text the same way every time)", what);
        if ((rc = parse_vocab_map(j, m, what, err, err_len)) ||
            (rc = jdup(j, "continuing_subword_prefix", &m->prefix, &m->prefix_len, what, err, err_len)) ||
            (rc = jdup(j, "end_of_word_suffix", &m->suffix, &m->suffix_len, what, err, err_len)) ||
            (rc = jflag(j, "fuse_unk", &m->fuse_unk, what, err, err_len)) ||
            (rc = jflag(j, "byte_fallback", &m->byte_fallback, what, err, err_len)) ||
            (rc = jflag(j, "ignore_merges", &m->ignore_merges, what, err, err_len)))
            return rc;
        char *unk = NULL;
        if ((rc = jdup(j, "unk_token", &unk, &l, what, err, err_len))) return rc;
        if (unk) {
            m->unk_id = tok_vocab_get(&m->vocab, unk, l);
            free(unk);
            if (m->unk_id < 0) return INVALID("%s: 'unk_token' is not in the vocab", what);
        }
        byte_tokens(m);
        return parse_merges(j, m, what, err, err_len);
    }
    if (strcmp(type, "Unigram") == 0) {
        m->kind = TOK_MODEL_UNIGRAM;
        if ((rc = parse_unigram(j, m, what, err, err_len))) return rc;
        byte_tokens(m);
        return 0;
    }
    return INVALID("%s: model '%s' is not supported", file, type);
}

void tok_model_clear(struct tok_model *m) {
    if (!m) return;
    tok_vocab_free(&m->vocab);
    free(m->prefix);
    free(m->suffix);
    free(m->merges);
    free(m->scores);
    memset(m, 0, sizeof *m);
}
