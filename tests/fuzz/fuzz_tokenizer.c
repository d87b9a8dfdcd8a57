/* fuzz_tokenizer.c - libFuzzer target for tokenizer.json loading
 * (kernels/text/tokenizer.c) and the encoding of what a loaded file makes.
 *
 * Input layout: the file's bytes, then optionally a NUL and a text. A file
 * the loader refuses must say why, naming the file; one it loads encodes
 * the text (alone, and as a pair with itself, with and without a
 * truncation length from the text's first byte): an encoding has as many
 * type ids as ids and, truncated, no more ids than the length and the
 * template's special tokens allow. Built by tools/fuzz.sh:
 */
// fuzz-sources: common/*.c kernels/text/*.c
// fuzz-corpus: tests/fuzz/corpus/tokenizer/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *json = (const char *)data, *text = "";
    size_t jl = size, tl = 0;
    const uint8_t *nul = memchr(data, 0, size);
    if (nul) {
        jl = (size_t)(nul - data);
        text = (const char *)nul + 1;
        tl = size - jl - 1;
    }
    char err[512] = "";
    for (int pass = 0; pass < 2; pass++) {
        int64_t max = pass && tl ? 1 + (unsigned char)text[0] % 40 : 0;
        struct tokenizer_params p = {.json = json, .len = jl, .name = "tokenizer.json", .max_length = max};
        struct tokenizer *t = tokenizer_load(&p, err, sizeof err);
        if (!t) {
            if (!strstr(err, "tokenizer.json") && !strstr(err, "out of memory")) abort();
            return 0;
        }
        struct tokenizer_encoding e = {0};
        for (int pair = 0; pair < 2; pair++) {
            int rc = tokenizer_encode(t, text, tl, pair ? text : NULL, tl, &e, err, sizeof err);
            if (rc && !err[0]) abort();
            if (rc) continue;
            if (max && tokenizer_max_length(t) != max) abort();
            /* Truncation leaves the sequences at most max ids, plus what a
             * template adds (a handful in real files: 64 is far above). */
            if (max && e.n > (size_t)max + 64) abort();
            for (size_t i = 0; i < e.n; i++)
                if (e.ids[i] < 0 || e.type_ids[i] < 0) abort();
        }
        tokenizer_encoding_free(&e);
        tokenizer_free(t);
    }
    return 0;
}
