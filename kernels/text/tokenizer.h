/* tokenizer.h - Hugging Face tokenizers (tokenizer.json) in C.
 *
 * tokenizer_load reads the JSON a `tokenizers` library saves (its
 * Tokenizer.save, the tokenizer.json beside a checkpoint) and keeps what
 * encoding needs: the added tokens, the normalizer, the pre-tokenizer, the
 * model (WordPiece, BPE, Unigram), the post-processor and the truncation.
 * Everything a file names that kiln does not implement is refused at load,
 * by name ("tokenizer.json: pre_tokenizer 'UnicodeScripts' is not
 * supported"), so that no text is ever encoded differently from the library
 * without a word. Decoding (ids back to text) is not part of it.
 *
 * tokenizer_encode gives the ids and type ids the library's
 * Tokenizer.encode(text, pair, add_special_tokens=True) gives, truncated as
 * the file (or tokenizer_params.max_length) says; padding is the caller's
 * (tokenizer_pad gives the file's pad id and type id).
 *
 * Threads: a loaded tokenizer is immutable; any number of threads may
 * encode with it at once. Text must be UTF-8: other bytes are
 * STATUS_INVALID, as the library accepts only Python str. */
#ifndef KILN_TOKENIZER_H
#define KILN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;

struct tokenizer_params {
    const char *json; /* the file's bytes */
    size_t len;
    const char *name; /* for messages: "tokenizer.json" or a path */
    /* Truncation: > 0 replaces the file's max_length (and turns truncation
     * on, longest_first, if the file has none); 0 keeps the file's. */
    int64_t max_length;
};

/* One encoding: n ids and as many type ids, owned by the struct. A zeroed
 * struct is empty; tokenizer_encoding_free frees and zeroes it, and it may
 * be reused by the next tokenizer_encode (its memory is kept). */
struct tokenizer_encoding {
    int64_t *ids;
    int64_t *type_ids;
    size_t n, cap;
};

struct tokenizer *tokenizer_load(const struct tokenizer_params *p, char *err, size_t err_len);
void tokenizer_free(struct tokenizer *t); /* NULL is a no-op */

/* Encodes text (a pair when pair is not NULL) into out, replacing what it
 * held. 0, STATUS_INVALID (text that is not UTF-8, a truncation the file's
 * strategy cannot do) or STATUS_NOMEM, with err set. */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, const char *pair, size_t pair_len,
                     struct tokenizer_encoding *out, char *err, size_t err_len);
void tokenizer_encoding_free(struct tokenizer_encoding *e);

/* The file's padding: pad id and pad type id (0 and 0 when it has none),
 * and 1 if it pads on the left. */
void tokenizer_pad(const struct tokenizer *t, int64_t *pad_id, int64_t *pad_type_id, int *left);
/* The truncation length in effect (0: none). */
int64_t tokenizer_max_length(const struct tokenizer *t);
/* 1 + the largest id an encoding can hold (the model's vocabulary and the
 * added tokens): ids at or past it name no token. */
int64_t tokenizer_vocab_size(const struct tokenizer *t);
/* 1 if s[0..len) is UTF-8 that tokenizer_encode takes (no surrogates,
 * nothing past U+10FFFF): a caller checks texts before it batches them. */
int tokenizer_utf8_valid(const char *s, size_t len);

#endif
