/* The tokenizer (kernels/text) on small hand-made tokenizer.json files whose
 * answers can be worked out by hand: WordPiece with BERT's pipeline and its
 * pair template, BPE merges by rank, Unigram's best path with unknown pieces
 * fused, added tokens, truncation strategies, NUL in a vocabulary, and the
 * refusals at load that name what the file asks for. The comparison with
 * the `tokenizers` library on 100,000 lines is tests/e2e/test_tokenizers.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "common/status.h"
#include "kernels/text/tokenizer.h"

static const char bert_json[] =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
    "\"added_tokens\":[{\"id\":1,\"content\":\"[CLS]\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},{\"id\":2,\"content\":\"[SEP]\",\"single_word\":false,\"lstrip\":false,"
    "\"rstrip\":false,\"normalized\":false,\"special\":true}],"
    "\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,"
    "\"strip_accents\":null,\"lowercase\":true},"
    "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
    "\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",2],\"cls\":[\"[CLS]\",1]},"
    "\"decoder\":null,"
    "\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\","
    "\"max_input_chars_per_word\":10,\"vocab\":{\"[UNK]\":0,\"[CLS]\":1,\"[SEP]\":2,\"hello\":3,\",\":4,"
    "\"wor\":5,\"##ld\":6,\"!\":7,\"cafe\":8,\"\\u4e2d\":9,\"\\u0000x\":10}}}";

static struct tokenizer *load(const char *json, int64_t max_length, char *err, size_t err_len) {
    struct tokenizer_params p = {.json = json, .len = strlen(json), .name = "tokenizer.json", .max_length = max_length};
    return tokenizer_load(&p, err, err_len);
}

/* Loads json or fails the test with the loader's message. */
static struct tokenizer *must_load(const char *json, int64_t max_length) {
    char err[256] = "";
    struct tokenizer *t = load(json, max_length, err, sizeof err);
    if (!t) fail_msg("%s", err);
    return t;
}

/* Encodes text a (len bytes, alone) and expects STATUS_INVALID with needle
 * in the message. */
static void expect_invalid(const struct tokenizer *t, const char *a, size_t len, const char *needle) {
    struct tokenizer_encoding e = {0};
    char err[256] = "";
    assert_int_equal(tokenizer_encode(t, a, len, NULL, 0, &e, err, sizeof err), STATUS_INVALID);
    if (!strstr(err, needle)) fail_msg("'%s': expected '%s'", err, needle);
    tokenizer_encoding_free(&e);
}

/* Encodes and checks the ids (and, when types is given, the type ids). */
static void expect(const struct tokenizer *t, const char *a, const char *b, const int64_t *ids, const int64_t *types,
                   size_t n) {
    struct tokenizer_encoding e = {0};
    char err[256] = "";
    int rc = tokenizer_encode(t, a, strlen(a), b, b ? strlen(b) : 0, &e, err, sizeof err);
    if (rc) fail_msg("encode '%s': %s", a, err);
    if (e.n != n) {
        for (size_t i = 0; i < e.n; i++) fprintf(stderr, "%lld ", (long long)e.ids[i]);
        fail_msg("'%s': %zu ids, expected %zu", a, e.n, n);
    }
    assert_memory_equal(e.ids, ids, n * sizeof *ids);
    if (types) assert_memory_equal(e.type_ids, types, n * sizeof *types);
    tokenizer_encoding_free(&e);
}

static void test_wordpiece_bert(void **state) {
    (void)state;
    struct tokenizer *t = must_load(bert_json, 0);
    /* Lowercased, accents stripped (café -> cafe), punctuation split, ##
     * pieces, a word over max_input_chars_per_word is [UNK], CJK apart. */
    expect(t, "Hello, World! Caf\xc3\xa9", NULL, (int64_t[]){1, 3, 4, 5, 6, 7, 8, 2}, NULL, 8);
    expect(t, "helloworldxx \xe4\xb8\xad\xe4\xb8\xad", NULL, (int64_t[]){1, 0, 9, 9, 2}, NULL, 5);
    /* The special tokens' own text is matched before normalizing. */
    expect(t, "[CLS]hello[SEP]", NULL, (int64_t[]){1, 1, 3, 2, 2}, NULL, 5);
    /* Pairs: [CLS] A [SEP] B [SEP], the second part type 1. */
    expect(t, "hello", "world", (int64_t[]){1, 3, 2, 5, 6, 2}, (int64_t[]){0, 0, 0, 1, 1, 1}, 6);
    expect(t, "", NULL, (int64_t[]){1, 2}, NULL, 2);
    /* Control characters go (clean_text): the NUL-bearing vocab entry is
     * loaded but unreachable through BERT's normalizer. */
    expect(t, "hel\x01lo\x7f", NULL, (int64_t[]){1, 3, 2}, NULL, 3);
    expect_invalid(t, "\xff", 1, "not valid UTF-8");
    /* Ids 0 to 10: a token id of 11 names nothing. */
    assert_int_equal(tokenizer_vocab_size(t), 11);
    assert_true(tokenizer_utf8_valid("caf\xc3\xa9", 5));
    assert_false(tokenizer_utf8_valid("caf\xc3", 4));
    assert_false(tokenizer_utf8_valid("\xed\xa0\x80", 3)); /* a surrogate */
    tokenizer_free(t);
}

static void test_truncation(void **state) {
    (void)state;
    /* max_length 6 with BERT's pair template (3 specials): 3 ids remain;
     * longest first takes them from the longer text, then splits evenly. */
    struct tokenizer *t = must_load(bert_json, 6);
    assert_int_equal(tokenizer_max_length(t), 6);
    expect(t, "hello", "world world", (int64_t[]){1, 3, 2, 5, 6, 2}, (int64_t[]){0, 0, 0, 1, 1, 1}, 6);
    expect(t, "hello hello hello", "world", (int64_t[]){1, 3, 3, 2, 5, 2}, NULL, 6);
    expect(t, "hello , ! hello hello", NULL, (int64_t[]){1, 3, 4, 7, 3, 2}, NULL, 6);
    tokenizer_free(t);
    /* only_second on a text alone cannot truncate: an error, not a crash. */
    char doc[sizeof bert_json + 128];
    snprintf(doc, sizeof doc, "%s", bert_json);
    char *tr = strstr(doc, "\"truncation\":null");
    const char repl[] = "\"truncation\":{\"max_length\":5,\"strategy\":\"OnlySecond\",\"direction\":\"Left\",\"stride\":0}";
    memmove(tr + sizeof repl - 1, tr + 17, strlen(tr + 17) + 1);
    memcpy(tr, repl, sizeof repl - 1);
    t = must_load(doc, 0);
    expect_invalid(t, "hello hello hello hello", 23, "needs a pair");
    /* Left: the pair keeps its last id. */
    expect(t, "hello", "hello world", (int64_t[]){1, 3, 2, 6, 2}, NULL, 5);
    tokenizer_free(t);
}

static void test_bpe_merges_by_rank(void **state) {
    (void)state;
    static const char json[] =
        "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"?\",\"fuse_unk\":true,\"vocab\":{\"?\":0,\"a\":1,\"b\":2,"
        "\"c\":3,\"ab\":4,\"bc\":5,\"abc\":6,\"\\u0000\":7},\"merges\":[\"b c\",[\"a\",\"b\"],\"a bc\"]},"
        "\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"}}";
    char err[256];
    struct tokenizer *t = must_load(json, 0);
    /* b c (rank 0) first, then a bc; "ab" alone merges by rank 1; unknown
     * characters fuse into one "?"; NUL is in the vocabulary. */
    expect(t, "abc ab xyz c", NULL, (int64_t[]){6, 4, 0, 3}, NULL, 4);
    struct tokenizer_encoding e = {0};
    assert_int_equal(tokenizer_encode(t, "a\0b", 3, NULL, 0, &e, err, sizeof err), 0);
    assert_int_equal(e.n, 3);
    assert_int_equal(e.ids[1], 7);
    tokenizer_encoding_free(&e);
    assert_int_equal(tokenizer_vocab_size(t), 8);
    tokenizer_free(t);
}

static void test_unigram_best_path(void **state) {
    (void)state;
    static const char json[] =
        "{\"normalizer\":{\"type\":\"NFKC\"},"
        "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"always\","
        "\"split\":true},"
        "\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":[[\"<unk>\",0.0],[\"\\u2581\",-2.0],[\"a\",-3.0],"
        "[\"b\",-3.0],[\"ab\",-4.0],[\"\\u2581ab\",-5.5],[\"\\u2581a\",-1.0]]}}";
    struct tokenizer *t = must_load(json, 0);
    /* "▁ab": ▁a + b = -4 beats ▁ab = -5.5 and ▁ + ab = -6; the unknown
     * "xy" fuses into one <unk>; NFKC makes the fullwidth ａ an "a". */
    expect(t, "ab", NULL, (int64_t[]){6, 3}, NULL, 2);
    expect(t, "abxy", NULL, (int64_t[]){6, 3, 0}, NULL, 3);
    expect(t, "\xef\xbd\x81" "b", NULL, (int64_t[]){6, 3}, NULL, 2);
    assert_int_equal(tokenizer_vocab_size(t), 7);
    tokenizer_free(t);
}

static void test_refusals_name_what_is_missing(void **state) {
    (void)state;
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}},\"pre_tokenizer\":{\"type\":\"UnicodeScripts\"}}",
         "tokenizer.json: pre_tokenizer 'UnicodeScripts' is not supported"},
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}},\"normalizer\":{\"type\":\"Precompiled\"}}",
         "tokenizer.json: normalizer 'Precompiled' is not supported"},
        {"{\"model\":{\"type\":\"WordLevel\",\"vocab\":{}}}", "model 'WordLevel' is not supported"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}", "not in the vocab ('b')"},
        {"{\"model\":{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":{},\"merges\":[]}}", "'dropout' is not supported"},
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}},\"something\":1}", "'something' is not supported"},
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}},\"pre_tokenizer\":{\"type\":\"Split\","
         "\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}}", "does not compile"},
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}},\"added_tokens\":[{\"id\":0,\"content\":\"x\","
         "\"single_word\":true}]}", "single_word is not supported"},
        {"[1,2]", "not a JSON object"},
        {"{\"model\":", "does not parse"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "";
        struct tokenizer *t = load(cases[i].json, 0, err, sizeof err);
        if (t || !strstr(err, cases[i].msg)) fail_msg("case %zu: got '%s', expected '%s'", i, err, cases[i].msg);
    }
}

static void test_no_unk_is_an_error(void **state) {
    (void)state;
    static const char json[] = "{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",-1.0]]}}";
    struct tokenizer *t = must_load(json, 0);
    expect_invalid(t, "ab", 2, "no unk token");
    expect(t, "aa", NULL, (int64_t[]){0, 0}, NULL, 2);
    tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wordpiece_bert),        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_bpe_merges_by_rank),    cmocka_unit_test(test_unigram_best_path),
        cmocka_unit_test(test_refusals_name_what_is_missing), cmocka_unit_test(test_no_unk_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
