/* tokenize.c - `kiln tokenize`: a tokenizer.json run over lines of text.
 *
 *   kiln tokenize TOKENIZER_JSON [--max-length N] [--pairs] [--bench N]
 *
 * Reads lines from stdin (split on '\n' only, so any other byte, '\r' and
 * control characters included, belongs to the text). With --pairs a line
 * is "text\x1fpair" (the ASCII unit separator). For each line it prints
 * "ids<TAB>type_ids" (space-separated numbers), or "ERROR<TAB>message" for
 * a line the tokenizer refuses. The tests compare this with the `tokenizers`
 * library line by line; --bench N encodes every line N times instead and
 * prints the time, lines and tokens per second on stderr. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands/commands.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/file.h"
#include "common/status.h"
#include "kernels/text/tokenizer.h"

static int usage(FILE *f) {
    fprintf(f, "usage: kiln tokenize TOKENIZER_JSON [--max-length N] [--pairs] [--bench N]\n"
               "  Encodes each line of stdin with a Hugging Face tokenizer.json and prints\n"
               "  its ids and type ids, tab-separated (--pairs: a line is text \\x1f pair).\n"
               "  --max-length N  truncate to N tokens (default: the file's truncation)\n"
               "  --bench N       encode every line N times and print the throughput\n");
    return f == stdout ? 0 : 2;
}

static void print_ids(struct buf *o, const int64_t *v, size_t n) {
    char num[24];
    for (size_t i = 0; i < n; i++) {
        int k = snprintf(num, sizeof num, i ? " %" PRId64 : "%" PRId64, v[i]);
        buf_add(o, num, (size_t)k);
    }
}

int cmd_tokenize(int argc, char **argv) {
    const char *path = NULL;
    int64_t max_length = 0;
    int pairs = 0, bench = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return usage(stdout);
        if (strcmp(argv[i], "--pairs") == 0) pairs = 1;
        else if (strcmp(argv[i], "--max-length") == 0 && i + 1 < argc) max_length = strtoll(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--bench") == 0 && i + 1 < argc) bench = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else return usage(stderr);
    }
    if (!path || max_length < 0 || bench < 0) return usage(stderr);
    char err[512], *json = NULL;
    size_t len = 0;
    if (file_read_regular(path, (int64_t)1 << 30, &json, &len, err, sizeof err)) {
        fprintf(stderr, "kiln tokenize: %s\n", err);
        return 1;
    }
    struct tokenizer_params tp = {.json = json, .len = len, .name = path, .max_length = max_length};
    struct tokenizer *t = tokenizer_load(&tp, err, sizeof err);
    free(json);
    if (!t) {
        fprintf(stderr, "kiln tokenize: %s\n", err);
        return 1;
    }
    /* All of stdin, then the lines in place. */
    struct buf in = {0};
    char chunk[1 << 16];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, stdin)) > 0) buf_add(&in, chunk, got);
    if (in.failed) {
        fprintf(stderr, "kiln tokenize: out of memory reading stdin\n");
        tokenizer_free(t);
        return 1;
    }
    struct buf out = {0};
    struct tokenizer_encoding enc = {0};
    uint64_t tokens = 0, lines = 0, t0 = clock_now_ns();
    int rounds = bench ? bench : 1;
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < in.len;) {
            char *nl = memchr(in.data + i, '\n', in.len - i);
            size_t e = nl ? (size_t)(nl - in.data) : in.len;
            const char *a = in.data + i, *b = NULL;
            size_t al = e - i, bl = 0;
            if (pairs) {
                char *us = memchr(a, '\x1f', al);
                if (us) {
                    b = us + 1;
                    bl = (size_t)(a + al - b);
                    al = (size_t)(us - a);
                }
            }
            int rc = tokenizer_encode(t, a, al, b, bl, &enc, err, sizeof err);
            lines++;
            tokens += rc ? 0 : enc.n;
            if (!bench) {
                if (rc) {
                    buf_str(&out, "ERROR\t");
                    buf_str(&out, err);
                } else {
                    print_ids(&out, enc.ids, enc.n);
                    buf_add(&out, "\t", 1);
                    print_ids(&out, enc.type_ids, enc.n);
                }
                buf_add(&out, "\n", 1);
                if (out.len > (1 << 20)) {
                    fwrite(out.data, 1, out.len, stdout);
                    out.len = 0;
                }
            }
            i = e + 1;
        }
    }
    double secs = (double)(clock_now_ns() - t0) / 1e9;
    if (out.len) fwrite(out.data, 1, out.len, stdout);
    if (bench)
        fprintf(stderr, "%.3f s, %" PRIu64 " lines, %.0f lines/s, %.0f tokens/s\n", secs, lines,
                (double)lines / secs, (double)tokens / secs);
    int failed = out.failed;
    buf_free(&out);
    buf_free(&in);
    tokenizer_encoding_free(&enc);
    tokenizer_free(t);
    return failed ? 1 : 0;
}
