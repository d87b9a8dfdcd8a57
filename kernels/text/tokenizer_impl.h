/* tokenizer_impl.h - the parts of a tokenizer, shared by its files:
 * tokenizer.c (loading, the pipeline, added tokens, post-processing,
 * truncation), tokenizer_text.c (Unicode classes, normalizers,
 * pre-tokenizers) and tokenizer_models.c (the vocabularies, WordPiece, BPE,
 * Unigram). Not a public header. */
#ifndef KILN_TOKENIZER_IMPL_H
#define KILN_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>

#include "common/buf.h"
#include "kernels/text/tokenizer.h"

/* ---- pieces: spans of one text buffer ------------------------------------ */

/* A piece of the input on its way through the pipeline: len bytes at off
 * in its list's text. id >= 0: an added token, already encoded, that no
 * later stage touches. at_start: the piece begins the original text (the
 * library's offsets_original().0 == 0, which Metaspace's "first" reads). */
struct tok_piece {
    size_t off, len;
    int32_t id;
    uint8_t at_start;
};

struct tok_pieces {
    struct tok_piece *v;
    size_t n, cap;
    struct buf text;
};

/* An array v of *cap elements of size bytes, doubled (first elements when
 * it has none): the new array, *cap updated, or NULL (v kept) when out of
 * memory. */
void *tok_grow(void *v, size_t *cap, size_t size, size_t first);

/* Appends a piece of len bytes copied from s; empty pieces are dropped, as
 * the library drops them after every split. 0 or STATUS_NOMEM. */
int tok_pieces_add(struct tok_pieces *p, const char *s, size_t len, int32_t id, int at_start);
void tok_pieces_reset(struct tok_pieces *p);
void tok_pieces_free(struct tok_pieces *p);

/* Per-call scratch: match data for the regexes, the spans of a split and
 * buffers, kept across the pieces of one encode. Zeroed is empty. */
struct tok_span {
    size_t s, e;
    int match;
};

struct tok_work {
    pcre2_match_data *md;
    struct tok_span *sp;
    size_t nsp, capsp;
    struct buf b1, b2, b3;
};

void tok_work_free(struct tok_work *w);

/* ---- Unicode ------------------------------------------------------------- */

/* Decodes the code point at s[*i] (s valid UTF-8, *i < n) and advances *i. */
static inline int32_t tok_utf8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s + *i;
    (void)n;
    if (u[0] < 0x80) {
        (*i)++;
        return u[0];
    }
    if (u[0] < 0xE0) {
        *i += 2;
        return (u[0] & 0x1F) << 6 | (u[1] & 0x3F);
    }
    if (u[0] < 0xF0) {
        *i += 3;
        return (u[0] & 0x0F) << 12 | (u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    }
    *i += 4;
    return (u[0] & 0x07) << 18 | (u[1] & 0x3F) << 12 | (u[2] & 0x3F) << 6 | (u[3] & 0x3F);
}
size_t tok_utf8_put(char *out, int32_t cp); /* 1-4 bytes written */
/* 1 if s[0..n) is valid UTF-8 (no surrogates, nothing past U+10FFFF). */
int tok_utf8_valid(const char *s, size_t n);

/* The library's character classes (see tokenizer_tables.h for why they
 * are utf8proc's, corrected). */
int tok_is_whitespace(int32_t c); /* Rust's char::is_whitespace */
int tok_is_punct(int32_t c);      /* ASCII punctuation or a P* category */
int tok_is_numeric(int32_t c);    /* Rust's char::is_numeric */
/* The end of the whitespace that starts at s[i] (within end), and the
 * start of the whitespace that ends at s[end] (not before from). */
size_t tok_space_after(const char *s, size_t i, size_t end);
size_t tok_space_before(const char *s, size_t from, size_t end);

/* ---- normalizers --------------------------------------------------------- */

enum tok_norm_kind {
    TOK_NORM_BERT,
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_STRIP_ACCENTS,
    TOK_NORM_REPLACE,
    TOK_NORM_PREPEND,
    TOK_NORM_STRIP,
    TOK_NORM_SEQUENCE,
};

struct tok_norm {
    enum tok_norm_kind kind;
    int clean_text, chinese, strip_accents, lowercase; /* BertNormalizer */
    pcre2_code *re;                                  /* Replace with a regex */
    char *pattern, *content;                         /* Replace (literal pattern), Prepend */
    size_t pattern_len, content_len;
    int left, right;                                 /* Strip */
    struct tok_norm *seq;
    int nseq;
};

int tok_norm_parse(const cJSON *j, struct tok_norm *n, const char *file, char *err, size_t err_len);
void tok_norm_clear(struct tok_norm *n);
/* Normalizes s[0..len) into out (emptied first; not w's buffers). 0 or
 * STATUS_NOMEM. */
int tok_normalize(const struct tok_norm *n, const char *s, size_t len, struct buf *out, struct tok_work *w);

/* ---- pre-tokenizers ------------------------------------------------------ */

enum tok_pre_kind {
    TOK_PRE_BERT,
    TOK_PRE_BYTE_LEVEL,
    TOK_PRE_METASPACE,
    TOK_PRE_WHITESPACE,
    TOK_PRE_WHITESPACE_SPLIT,
    TOK_PRE_SPLIT,
    TOK_PRE_DIGITS,
    TOK_PRE_PUNCTUATION,
    TOK_PRE_SEQUENCE,
};

/* The library's SplitDelimiterBehavior. */
enum tok_split {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS,
};

enum tok_prepend { TOK_PREPEND_NEVER, TOK_PREPEND_FIRST, TOK_PREPEND_ALWAYS };

struct tok_pre {
    enum tok_pre_kind kind;
    int add_prefix_space, use_regex; /* ByteLevel */
    char repl[8];                    /* Metaspace's replacement, UTF-8 */
    size_t repl_len;
    enum tok_prepend prepend;
    int split;                       /* Metaspace */
    pcre2_code *re;                  /* Split (regex), ByteLevel */
    char *literal;                   /* Split (string) */
    size_t literal_len;
    enum tok_split behavior;
    int invert, individual;          /* Split; Digits */
    struct tok_pre *seq;
    int nseq;
};

int tok_pre_parse(const cJSON *j, struct tok_pre *p, const char *file, char *err, size_t err_len);
void tok_pre_clear(struct tok_pre *p);
/* Splits the pieces of in (those without an id) into out (emptied first);
 * in is left as scratch. 0 or STATUS_NOMEM. */
int tok_pre_tokenize(const struct tok_pre *p, struct tok_pieces *in, struct tok_pieces *out, struct tok_work *w);
/* Applies ByteLevel's byte-to-character map to s[0..len), into out. */
void tok_byte_level_map(const char *s, size_t len, struct buf *out);

/* Compiles a regex the way the library's (Oniguruma's) reads it: UTF-8,
 * Unicode classes, \s as White_Space. NULL with err set. */
pcre2_code *tok_regex_compile(const char *pattern, size_t len, const char *what, char *err, size_t err_len);

/* ---- the vocabulary: a string -> id map ---------------------------------- */

struct tok_vocab {
    struct tok_vocab_slot {
        const char *s; /* owned, NUL-terminated */
        uint32_t len;
        int32_t id;
    } *slots;
    size_t mask, n;
};

/* Adds s -> id; an existing s gets the new id (the library's maps keep the
 * last). 0 or STATUS_NOMEM. */
int tok_vocab_put(struct tok_vocab *v, const char *s, size_t len, int32_t id);
int32_t tok_vocab_get(const struct tok_vocab *v, const char *s, size_t len); /* -1 if absent */
void tok_vocab_free(struct tok_vocab *v);
/* A string of the file as the vocabulary holds it: tokenizer_load turned
 * "\u0000" into the byte 0xFF, which becomes NUL again here. Copies s into
 * b (emptied first); 0 or STATUS_NOMEM. */
int tok_key(const char *s, struct buf *b);

/* ---- models -------------------------------------------------------------- */

enum tok_model_kind { TOK_MODEL_WORDPIECE, TOK_MODEL_BPE, TOK_MODEL_UNIGRAM };

struct tok_merge {
    uint64_t key; /* a << 32 | b; 0 with rank -1: empty slot */
    int32_t rank, id;
};

struct tok_model {
    enum tok_model_kind kind;
    struct tok_vocab vocab;
    int32_t unk_id; /* -1: none */
    /* WordPiece */
    char *prefix;   /* continuing_subword_prefix (WordPiece, BPE) */
    size_t prefix_len;
    int max_chars;
    /* BPE */
    char *suffix;   /* end_of_word_suffix */
    size_t suffix_len;
    int fuse_unk, byte_fallback, ignore_merges;
    struct tok_merge *merges;
    size_t merges_mask;
    int32_t byte_ids[256]; /* <0xXX> tokens for byte_fallback, -1 if absent */
    /* Unigram */
    double *scores;
    size_t nscores;
    double min_score;
    size_t max_piece; /* longest piece, bytes */
};

int tok_model_parse(const cJSON *j, struct tok_model *m, const char *file, char *err, size_t err_len);
void tok_model_clear(struct tok_model *m);

/* Ids of one piece, appended to a growing int32 array. */
struct tok_ids {
    int32_t *v;
    size_t n, cap;
};
int tok_ids_push(struct tok_ids *ids, int32_t id);

/* Encodes one pre-tokenized word, appending its ids. 0, STATUS_INVALID (a
 * character the vocabulary cannot express and no unk token) or
 * STATUS_NOMEM; err set. */
int tok_model_encode(const struct tok_model *m, const char *s, size_t len, struct tok_ids *out, char *err,
                     size_t err_len);

#endif
