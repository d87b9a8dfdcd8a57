/* test_ops_string.c - the string operators on answers worked out by hand:
 * StringConcat broadcasting UTF-8, StringSplit's Python semantics
 * (whitespace runs, a delimiter, maxsplit), StringNormalizer's case change
 * beyond ASCII and case-blind stopwords, RegexFullMatch with RE2 classes
 * and its messages, Tokenizer's three modes, TfIdfVectorizer on an int64 pool with skips and
 * weights. New strings come from the harness's string pool, as from a
 * plan executor's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/ops.h"
#include "tests/kernels/harness.h"

#define S(t) ((const struct tensor_str *)(t).data)

#define F(t) ((float *)(t).data)

static int call(struct tnode *tn, const struct tensor **in, int nin, struct tensor **out, int nout) {
    return tn_call(&tn->n, in, nin, out, nout, 1);
}

/* Checks n strings of t: element at[i] is want[i]. */
static void check_strs(const struct tensor *t, int n, const int *at, const char *const *want) {
    for (int i = 0; i < n; i++) assert_tstr(S(*t)[at[i]], want[i]);
}

static void test_concat_broadcast(void **st) {
    (void)st;
    struct tensor_str a[2] = {TN_STR("caf"), TN_STR("na")}, b[1] = {TN_STR("é!")};
    struct tensor A = {DT_STRING, 2, {2, 1}, a}, B = {DT_STRING, 1, {1}, b}, Y = {0};
    struct tnode tn;
    tn_init(&tn, "StringConcat", 20);
    const struct tensor *in[2] = {&A, &B};
    struct tensor *out[1] = {&Y};
    assert_int_equal(call(&tn, in, 2, out, 1), 0);
    assert_int_equal(Y.ndim, 2);
    assert_tstr(S(Y)[0], "café!");
    assert_tstr(S(Y)[1], "naé!");
    free(Y.data);
}

static void test_split(void **st) {
    (void)st;
    struct tensor_str x[3] = {TN_STR("  a b\tc "), TN_STR(""), TN_STR("one")};
    struct tensor X = {DT_STRING, 1, {3}, x}, Y = {0}, Z = {0};
    struct tnode tn;
    const struct tensor *in[1] = {&X};
    struct tensor *out[2] = {&Y, &Z};
    /* Whitespace: runs split, the ends yield nothing, "" has no piece. */
    tn_init(&tn, "StringSplit", 20);
    assert_int_equal(call(&tn, in, 1, out, 2), 0);
    assert_int_equal(Y.dims[1], 3);
    assert_tstr(S(Y)[0], "a");
    assert_tstr(S(Y)[2], "c");
    assert_tstr(S(Y)[3], "");
    assert_tstr(S(Y)[6], "one");
    assert_int_equal(((int64_t *)Z.data)[0], 3);
    assert_int_equal(((int64_t *)Z.data)[1], 0);
    assert_int_equal(((int64_t *)Z.data)[2], 1);
    free(Y.data);
    free(Z.data);
    /* maxsplit 1: the rest, trailing space included, is the last piece. */
    tn_init(&tn, "StringSplit", 20);
    tn_int(&tn, "maxsplit", 1);
    assert_int_equal(call(&tn, in, 1, out, 2), 0);
    assert_int_equal(Y.dims[1], 2);
    assert_tstr(S(Y)[1], "b\tc ");
    free(Y.data);
    free(Z.data);
    /* A delimiter: every occurrence splits, "" is one empty piece. */
    struct tensor_str d[2] = {TN_STR("a,,b"), TN_STR("")};
    struct tensor D = {DT_STRING, 1, {2}, d};
    const struct tensor *din[1] = {&D};
    tn_init(&tn, "StringSplit", 20);
    tn_str(&tn, "delimiter", ",");
    assert_int_equal(call(&tn, din, 1, out, 2), 0);
    assert_int_equal(Y.dims[1], 3);
    assert_tstr(S(Y)[1], "");
    assert_tstr(S(Y)[2], "b");
    assert_int_equal(((int64_t *)Z.data)[1], 1);
    free(Y.data);
    free(Z.data);
}

static void test_normalizer(void **st) {
    (void)st;
    struct tensor_str x[4] = {TN_STR("Café"), TN_STR("THE"), TN_STR("Über"), TN_STR("the")};
    char *stops[1] = {"the"};
    struct tensor X = {DT_STRING, 2, {1, 4}, x}, Y = {0};
    struct tnode tn;
    tn_init(&tn, "StringNormalizer", 10);
    tn_str(&tn, "case_change_action", "UPPER");
    tn_strs(&tn, "stopwords", 1, stops);
    const struct tensor *in[1] = {&X};
    struct tensor *out[1] = {&Y};
    assert_int_equal(call(&tn, in, 1, out, 1), 0);
    assert_int_equal(Y.dims[1], 2);
    assert_tstr(S(Y)[0], "CAFÉ");
    assert_tstr(S(Y)[1], "ÜBER");
    free(Y.data);
    /* Case-sensitive: only the exact "the" goes; LOWER keeps bytes valid. */
    tn_init(&tn, "StringNormalizer", 10);
    tn_str(&tn, "case_change_action", "LOWER");
    tn_int(&tn, "is_case_sensitive", 1);
    tn_strs(&tn, "stopwords", 1, stops);
    tn_str(&tn, "locale", "en_US");
    assert_int_equal(call(&tn, in, 1, out, 1), 0);
    assert_int_equal(Y.dims[1], 3);
    check_strs(&Y, 3, (const int[]){0, 1, 2}, (const char *const[]){"café", "the", "über"});
    free(Y.data);
    /* Every element a stopword: one empty string. */
    struct tensor_str only[2] = {TN_STR("The"), TN_STR("THE")};
    struct tensor O = {DT_STRING, 1, {2}, only};
    const struct tensor *oin[1] = {&O};
    tn_init(&tn, "StringNormalizer", 10);
    tn_strs(&tn, "stopwords", 1, stops);
    assert_int_equal(call(&tn, oin, 1, out, 1), 0);
    assert_int_equal(Y.ndim, 1);
    assert_int_equal(Y.dims[0], 1);
    assert_tstr(S(Y)[0], "");
    free(Y.data);
    tn_init(&tn, "StringNormalizer", 10);
    tn_str(&tn, "case_change_action", "TITLE");
    tn_expect_error(&tn.n, oin, 1, out, 1, "case_change_action 'TITLE'");
}

/* A NUL is one byte of a string like any other: no operator ends a string
 * at it, compares, hashes or matches only the bytes before it. */
static void test_nul_is_a_byte(void **st) {
    (void)st;
    struct tnode tn;
    struct tensor Y = {0}, Z = {0};
    struct tensor *out[2] = {&Y, &Z};
    /* StringConcat keeps both sides whole. */
    struct tensor_str a[1] = {TN_STR("a\0b")}, b[1] = {TN_STR("\0c")};
    struct tensor A = {DT_STRING, 1, {1}, a}, B = {DT_STRING, 1, {1}, b};
    tn_init(&tn, "StringConcat", 20);
    assert_int_equal(call(&tn, (const struct tensor *[]){&A, &B}, 2, out, 1), 0);
    assert_int_equal(S(Y)[0].len, 5);
    assert_memory_equal(S(Y)[0].p, "a\0b\0c", 5);
    free(Y.data);
    /* StringSplit finds the delimiter past a NUL; whitespace does not take NUL for a space. */
    struct tensor_str x[2] = {TN_STR("a\0,b"), TN_STR("\0 x\0")};
    struct tensor X = {DT_STRING, 1, {2}, x};
    tn_init(&tn, "StringSplit", 20);
    tn_str(&tn, "delimiter", ",");
    assert_int_equal(call(&tn, (const struct tensor *[]){&X}, 1, out, 2), 0);
    assert_int_equal(Y.dims[1], 2);
    assert_int_equal(S(Y)[0].len, 2);
    assert_memory_equal(S(Y)[0].p, "a\0", 2);
    assert_tstr(S(Y)[1], "b");
    assert_int_equal(S(Y)[2].len, 4); /* no comma: the whole element */
    free(Y.data);
    free(Z.data);
    tn_init(&tn, "StringSplit", 20);
    assert_int_equal(call(&tn, (const struct tensor *[]){&X}, 1, out, 2), 0);
    assert_int_equal(((int64_t *)Z.data)[1], 2);
    assert_int_equal(S(Y)[2].len, 1);
    assert_int_equal(S(Y)[3].len, 2);
    free(Y.data);
    free(Z.data);
    /* StringNormalizer: "the\0x" is no stopword "the"; case changes keep the NUL. */
    char *stops[1] = {"the"};
    struct tensor_str w[3] = {TN_STR("the\0x"), TN_STR("THE"), TN_STR("AB\0\xc3\x89")};
    struct tensor W = {DT_STRING, 1, {3}, w};
    tn_init(&tn, "StringNormalizer", 10);
    tn_str(&tn, "case_change_action", "LOWER");
    tn_strs(&tn, "stopwords", 1, stops);
    assert_int_equal(call(&tn, (const struct tensor *[]){&W}, 1, out, 1), 0);
    assert_int_equal(Y.dims[0], 2);
    assert_int_equal(S(Y)[0].len, 5);
    assert_memory_equal(S(Y)[0].p, "the\0x", 5);
    assert_int_equal(S(Y)[1].len, 5);
    assert_memory_equal(S(Y)[1].p, "ab\0\xc3\xa9", 5);
    free(Y.data);
    /* RegexFullMatch sees every byte: "ab\0cd" is not [a-z]+. */
    struct tensor_str r[3] = {TN_STR("ab\0cd"), TN_STR("abcd"), TN_STR("a\0b")};
    struct tensor R = {DT_STRING, 1, {3}, r};
    tn_init(&tn, "RegexFullMatch", 20);
    tn_str(&tn, "pattern", "[a-z]+");
    assert_int_equal(call(&tn, (const struct tensor *[]){&R}, 1, out, 1), 0);
    assert_memory_equal(Y.data, ((uint8_t[]){0, 1, 0}), 3);
    free(Y.data);
    tn_init(&tn, "RegexFullMatch", 20);
    tn_str(&tn, "pattern", "a.b");
    assert_int_equal(call(&tn, (const struct tensor *[]){&R}, 1, out, 1), 0);
    assert_memory_equal(Y.data, ((uint8_t[]){0, 0, 1}), 3);
    free(Y.data);
    /* Equal: "admin\0; drop" is not "admin"; NULs compare as bytes. */
    struct tensor_str e[4] = {TN_STR("admin"), TN_STR("admin\0; drop"), TN_STR("adm"), TN_STR("\0")};
    struct tensor_str admin[1] = {TN_STR("admin")};
    struct tensor E = {DT_STRING, 1, {4}, e}, K = {DT_STRING, 1, {1}, admin};
    tn_init(&tn, "Equal", 19);
    assert_int_equal(call(&tn, (const struct tensor *[]){&E, &K}, 2, out, 1), 0);
    assert_memory_equal(Y.data, ((uint8_t[]){1, 0, 0, 0}), 4);
    free(Y.data);
    /* LabelEncoder: "admin\0garbage" is not the key "admin"; a key with a
     * NUL (counted bytes in the attribute) matches only itself. */
    char *keys[3] = {"admin", "ad\0min", ""};
    size_t klens[3] = {5, 6, 0};
    int64_t ids[3] = {1, 2, 3};
    struct tensor_str l[5] = {TN_STR("admin"), TN_STR("admin\0garbage"), TN_STR("ad\0min"), TN_STR("ad"),
                              TN_STR("")};
    struct tensor L = {DT_STRING, 1, {5}, l};
    tn_init_domain(&tn, "ai.onnx.ml", "LabelEncoder", 2);
    tn_strs_len(&tn, "keys_strings", 3, keys, klens);
    tn_ints(&tn, "values_int64s", 3, ids);
    assert_int_equal(call(&tn, (const struct tensor *[]){&L}, 1, out, 1), 0);
    assert_memory_equal(Y.data, ((int64_t[]){1, -1, 2, -1, 3}), 5 * sizeof(int64_t));
    free(Y.data);
}

static void test_regex(void **st) {
    (void)st;
    struct tensor_str x[4] = {TN_STR("abc123"), TN_STR("123"), TN_STR("ab_9"), TN_STR("héllo")};
    struct tensor X = {DT_STRING, 1, {4}, x}, Y = {0};
    struct tnode tn;
    tn_init(&tn, "RegexFullMatch", 20);
    tn_str(&tn, "pattern", "[a-z]+\\d+");
    const struct tensor *in[1] = {&X};
    struct tensor *out[1] = {&Y};
    assert_int_equal(call(&tn, in, 1, out, 1), 0);
    const uint8_t *y = Y.data;
    assert_int_equal(y[0], 1);
    assert_int_equal(y[1], 0); /* a full match, not a search */
    assert_int_equal(y[2], 0);
    free(Y.data);
    /* \w in a class and a non-ASCII letter under UTF mode. */
    tn_init(&tn, "RegexFullMatch", 20);
    tn_str(&tn, "pattern", "(?i)H.LLO|[\\w]+_\\d");
    assert_int_equal(call(&tn, in, 1, out, 1), 0);
    y = Y.data;
    assert_int_equal(y[2], 1);
    assert_int_equal(y[3], 1);
    free(Y.data);
    tn_init(&tn, "RegexFullMatch", 20);
    tn_str(&tn, "pattern", "(unclosed");
    tn_expect_error(&tn.n, in, 1, out, 1, "does not compile");
    struct tensor_str bad[1] = {TN_STR("\xff\xfe")};
    struct tensor B = {DT_STRING, 1, {1}, bad};
    const struct tensor *bin[1] = {&B};
    tn_init(&tn, "RegexFullMatch", 20);
    tn_str(&tn, "pattern", ".*");
    tn_expect_error(&tn.n, bin, 1, out, 1, "matching element 0 failed");
}

/* Tokenizer: tokenexp matches, regex separators with mincharnum, and
 * characters with start/end marks and padding. */
static void test_tokenizer(void **st) {
    (void)st;
    struct tensor_str x[2] = {TN_STR("it's a dog-eat-dog world"), TN_STR("héllo, wörld")};
    struct tensor X = {DT_STRING, 1, {2}, x}, Y = {0};
    struct tnode tn;
    const struct tensor *in[1] = {&X};
    struct tensor *out[1] = {&Y};
    tn_init_domain(&tn, "com.microsoft", "Tokenizer", 1);
    tn_str(&tn, "tokenexp", "[a-zA-Z0-9_]+");
    tn_str(&tn, "pad_value", "#");
    tn_int(&tn, "mincharnum", 1);
    assert_int_equal(call(&tn, in, 1, out, 1), 0);
    assert_int_equal(Y.ndim, 2);
    assert_int_equal(Y.dims[1], 7); /* it s a dog eat dog world */
    assert_tstr(S(Y)[1], "s");
    assert_tstr(S(Y)[6], "world");
    assert_tstr(S(Y)[7], "h"); /* é is no ASCII word character */
    assert_tstr(S(Y)[8], "llo");
    assert_tstr(S(Y)[12], "#");
    free(Y.data);
    char *seps[2] = {" ", "[-,]"};
    tn_init_domain(&tn, "com.microsoft", "Tokenizer", 1);
    tn_strs(&tn, "separators", 2, seps);
    tn_str(&tn, "pad_value", "");
    tn_int(&tn, "mincharnum", 2);
    assert_int_equal(call(&tn, in, 1, out, 1), 0);
    assert_int_equal(Y.dims[1], 5); /* it's dog eat dog world: "a" is too short */
    assert_tstr(S(Y)[0], "it's");
    assert_tstr(S(Y)[5], "héllo");
    assert_tstr(S(Y)[6], "wörld");
    assert_tstr(S(Y)[7], "");
    free(Y.data);
    struct tensor_str c1[1] = {TN_STR("añb")};
    struct tensor C = {DT_STRING, 2, {1, 1}, c1};
    const struct tensor *cin[1] = {&C};
    char *chars[1] = {""};
    tn_init_domain(&tn, "com.microsoft", "Tokenizer", 1);
    tn_strs(&tn, "separators", 1, chars);
    tn_str(&tn, "pad_value", "#");
    tn_int(&tn, "mark", 1);
    tn_int(&tn, "mincharnum", 1);
    assert_int_equal(call(&tn, cin, 1, out, 1), 0);
    assert_int_equal(Y.ndim, 3);
    assert_int_equal(Y.dims[2], 5);
    assert_tstr(S(Y)[0], "\x02");
    assert_tstr(S(Y)[2], "ñ");
    assert_tstr(S(Y)[4], "\x03");
    free(Y.data);
    /* Padding follows the end mark. */
    struct tensor_str two[2] = {TN_STR("ab"), TN_STR("a")};
    struct tensor T = {DT_STRING, 1, {2}, two};
    const struct tensor *tin[1] = {&T};
    assert_int_equal(call(&tn, tin, 1, out, 1), 0);
    assert_int_equal(Y.dims[1], 4);
    check_strs(&Y, 3, (const int[]){5, 6, 7}, (const char *const[]){"a", "\x03", "#"});
    free(Y.data);
}

/* Pool: unigrams {2, 3}, bigrams {(2, 3), (3, 4)}; ids 1..4 map to columns
 * 0..3. Row [2, 3, 4, 2, 9, 3]: unigrams 2 twice and 3 twice; bigrams
 * (2, 3) and (3, 4) once each next to each other, and with one skip
 * allowed (2, 3) once more (positions 3 and 5). Unigrams count once
 * whatever the skip. */
/* The node of test_tfidf's pool, in mode with skips up to max_skip and
 * nw weights (0: none). */
static void tfidf_node(struct tnode *tn, const char *mode, int max_skip, int nw, const float *w) {
    static const int64_t pool[6] = {2, 3, 2, 3, 3, 4}, counts[2] = {0, 2}, idx[4] = {0, 1, 2, 3};
    tn_init(tn, "TfIdfVectorizer", 9);
    tn_str(tn, "mode", mode);
    tn_int(tn, "min_gram_length", 1);
    tn_int(tn, "max_gram_length", 2);
    tn_int(tn, "max_skip_count", max_skip);
    tn_ints(tn, "ngram_counts", 2, counts);
    tn_ints(tn, "ngram_indexes", 4, idx);
    tn_ints(tn, "pool_int64s", 6, pool);
    if (nw) tn_floats(tn, "weights", nw, w);
}

static void test_tfidf(void **st) {
    (void)st;
    int64_t x[6] = {2, 3, 4, 2, 9, 3};
    float w[4] = {0.5f, 1, 2, 4};
    struct tensor X = {DT_INT64, 2, {1, 6}, x}, Y = {0};
    struct tnode tn;
    const struct tensor *in[1] = {&X};
    struct tensor *out[1] = {&Y};
    tfidf_node(&tn, "TF", 0, 0, NULL);
    assert_int_equal(call(&tn, in, 1, out, 1), 0);
    assert_int_equal(Y.ndim, 2);
    assert_int_equal(Y.dims[1], 4);
    const float tf[4] = {2, 2, 1, 1};
    for (int k = 0; k < 4; k++) assert_float_equal(F(Y)[k], tf[k], 0);
    free(Y.data);
    tfidf_node(&tn, "TFIDF", 1, 4, w);
    assert_int_equal(call(&tn, in, 1, out, 1), 0);
    const float tfidf[4] = {2 * 0.5f, 2 * 1, 2 * 2, 1 * 4};
    for (int k = 0; k < 4; k++) assert_float_equal(F(Y)[k], tfidf[k], 0);
    free(Y.data);
    tfidf_node(&tn, "BM25", 0, 0, NULL);
    tn_expect_error(&tn.n, in, 1, out, 1, "mode 'BM25'");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concat_broadcast), cmocka_unit_test(test_split), cmocka_unit_test(test_normalizer),
        cmocka_unit_test(test_regex),            cmocka_unit_test(test_tokenizer),
        cmocka_unit_test(test_tfidf),            cmocka_unit_test(test_nul_is_a_byte),
    };
    g_run_without_attrs = 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
