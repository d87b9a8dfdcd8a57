/* test_kserve.c - the KServe v2 codec alone: parsing (JSON, nested data,
 * binary payloads, BYTES), binding to a model configuration, and response
 * encoding (JSON, binary, classification). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "config/model_config.h"
#include "models/model.h"
#include "server/kserve.h"

static char g_err[512];

static int parse(struct kserve_request *r, const char *json, const void *bin, size_t bin_len, int with_header) {
    size_t jl = strlen(json);
    char *body = malloc(jl + bin_len + 1);
    memcpy(body, json, jl);
    if (bin_len) memcpy(body + jl, bin, bin_len);
    g_err[0] = 0;
    int rc = kserve_request_parse(r, body, jl + bin_len, with_header ? (int64_t)jl : -1, g_err, sizeof g_err);
    free(body);
    return rc;
}

/* x FP32 [N,4] batched; outputs probs FP32 [N,3], label INT64 [N]. */
static void tiny_config(struct model_config *c) {
    model_config_init(c, "tiny");
    struct model_io ins[1] = {{.name = "x", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 4}}};
    struct model_io outs[2] = {{.name = "probs", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 3}},
                               {.name = "label", .dtype = DT_INT64, .ndim = 1, .dims = {-1}}};
    char err[256];
    assert_int_equal(model_config_complete(c, ins, 1, outs, 2, err, sizeof err), 0);
}

static void test_parse_json_nested_and_flat(void **state) {
    struct kserve_request r;
    assert_int_equal(parse(&r, "{\"id\":\"q\",\"inputs\":[{\"name\":\"x\",\"shape\":[2,2],\"datatype\":\"FP32\","
                               "\"data\":[[1,2],[3,4.5]]}]}", NULL, 0, 0), 0);
    assert_string_equal(r.id, "q");
    assert_int_equal(r.ninputs, 1);
    float *f = r.inputs[0].t.data;
    assert_true(f[0] == 1 && f[3] == 4.5f);
    kserve_request_clear(&r);
    assert_int_equal(parse(&r, "{\"inputs\":[{\"name\":\"x\",\"shape\":[4],\"datatype\":\"INT8\",\"data\":[-128,0,1,127]}]}",
                           NULL, 0, 0), 0);
    assert_int_equal(((int8_t *)r.inputs[0].t.data)[0], -128);
    assert_null(r.id);
    kserve_request_clear(&r);
}

/* Names and inputs beyond the request's own room (KSERVE_INLINE_INPUTS,
 * KSERVE_INLINE_STRINGS) are allocated, and freed by clear with the rest. */
static void test_parse_beyond_inline_room(void **state) {
    char longname[200], json[1024];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    snprintf(json, sizeof json,
             "{\"id\":\"%s\",\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[1]},"
             "{\"name\":\"%s\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[2]},"
             "{\"name\":\"c\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[3]}],"
             "\"outputs\":[{\"name\":\"%s\"}]}", longname, longname, longname);
    struct kserve_request r;
    assert_int_equal(parse(&r, json, NULL, 0, 0), 0);
    assert_int_equal(r.ninputs, 3);
    assert_ptr_not_equal(r.inputs, r.inputs_l);
    assert_string_equal(r.id, longname);
    assert_string_equal(r.inputs[0].name, "a");
    assert_string_equal(r.inputs[1].name, longname);
    assert_string_equal(r.inputs[2].name, "c");
    assert_string_equal(r.outputs[0].name, longname);
    assert_int_equal(((int32_t *)r.inputs[2].t.data)[0], 3);
    kserve_request_clear(&r);
    assert_null(r.inputs);
}

static void test_parse_binary_and_bytes(void **state) {
    struct kserve_request r;
    float v[4] = {1, 2, 3, 4};
    assert_int_equal(parse(&r, "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,4],\"datatype\":\"FP32\","
                               "\"parameters\":{\"binary_data_size\":16}}]}", v, 16, 1), 0);
    assert_memory_equal(r.inputs[0].t.data, v, 16);
    kserve_request_clear(&r);
    const uint8_t b[] = {2, 0, 0, 0, 'h', 'i', 0, 0, 0, 0};
    assert_int_equal(parse(&r, "{\"inputs\":[{\"name\":\"s\",\"shape\":[2],\"datatype\":\"BYTES\","
                               "\"parameters\":{\"binary_data_size\":10}}]}", b, sizeof b, 1), 0);
    const struct tensor_str *s = tensor_strs(&r.inputs[0].t);
    assert_true(tensor_str_eq(s[0], tensor_str_of("hi")));
    assert_int_equal(s[1].len, 0);
    kserve_request_clear(&r);
}

/* BYTES in JSON carry \u0000 as a byte, and 0x01 bytes as sent; a NUL
 * anywhere but in BYTES data (a name, a key, an id) is refused, naming the
 * field. */
static void test_parse_json_nul_bytes(void **state) {
    (void)state;
    struct kserve_request r;
    assert_int_equal(parse(&r, "{\"inputs\":[{\"name\":\"s\",\"shape\":[6],\"datatype\":\"BYTES\",\"data\":"
                               "[\"ab\\u0000cd\",\"\\u0000\",\"\\u0001\",\"\\u00010\",\"\x01\x01\\\\u0000\",\"\"]}],"
                               "\"outputs\":[{\"name\":\"o\\u0001\"}]}", NULL, 0, 0), 0);
    const struct tensor_str *s = tensor_strs(&r.inputs[0].t);
    assert_int_equal(s[0].len, 5);
    assert_memory_equal(s[0].p, "ab\0cd", 5);
    assert_int_equal(s[1].len, 1);
    assert_int_equal(s[1].p[0], 0);
    assert_int_equal(s[2].len, 1);
    assert_int_equal(s[2].p[0], 1);
    assert_int_equal(s[3].len, 2);
    assert_memory_equal(s[3].p, "\x01" "0", 2);
    assert_int_equal(s[4].len, 8); /* two raw 0x01 bytes and an escaped backslash before u0000 */
    assert_memory_equal(s[4].p, "\x01\x01\\u0000", 8);
    assert_int_equal(s[5].len, 0);
    assert_string_equal(r.outputs[0].name, "o\x01");
    kserve_request_clear(&r);
    /* Nested data arrays too. */
    assert_int_equal(parse(&r, "{\"inputs\":[{\"name\":\"s\",\"shape\":[1,2],\"datatype\":\"BYTES\",\"data\":"
                               "[[\"\\u0000x\",\"y\"]]}]}", NULL, 0, 0), 0);
    assert_int_equal(tensor_strs(&r.inputs[0].t)[0].len, 2);
    kserve_request_clear(&r);
    static const char *bad[] = {
        "{\"inputs\":[{\"name\":\"s\\u0000junk\",\"shape\":[1],\"datatype\":\"BYTES\",\"data\":[\"a\"]}]}",
        "{\"id\":\"\\u0000\",\"inputs\":[{\"name\":\"s\",\"shape\":[1],\"datatype\":\"BYTES\",\"data\":[\"a\"]}]}",
        "{\"parameters\":{\"k\\u0000\":1},\"inputs\":[{\"name\":\"s\",\"shape\":[1],\"datatype\":\"BYTES\",\"data\":[\"a\"]}]}",
        "{\"inputs\":[{\"name\":\"s\",\"shape\":[1],\"datatype\":\"BYTES\",\"data\":[\"a\"],"
        "\"parameters\":{\"shared_memory_region\":\"r\\u0000x\"}}]}",
    };
    static const char *what[] = {"'name'", "'id'", "key", "'shared_memory_region'"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(parse(&r, bad[i], NULL, 0, 0), STATUS_INVALID);
        if (!strstr(g_err, "NUL") || !strstr(g_err, what[i])) fail_msg("case %d: %s", i, g_err);
        kserve_request_clear(&r);
    }
}

static void test_parse_errors_name_the_field(void **state) {
    struct kserve_request r;
    static const struct { const char *json; const char *word; } cases[] = {
        {"{", "malformed JSON"},
        {"{\"inputs\":[]}", "'inputs'"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP32\",\"data\":[1]}]}", "1 elements"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"NOPE\",\"data\":[1]}]}", "datatype"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"UINT8\",\"data\":[256]}]}", "data[0]"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"BOOL\",\"data\":[1]}]}", "true or false"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"BF16\",\"data\":[1]}]}", "BF16"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP16\",\"data\":[70000]}]}", "range for FP16"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\"}]}", "neither"},
        {"{\"id\":1,\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}", "'id'"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}],\"outputs\":[{}]}",
         "outputs[0].name"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(parse(&r, cases[i].json, NULL, 0, 0), STATUS_INVALID);
        if (!strstr(g_err, cases[i].word)) fail_msg("case %zu: '%s' does not mention %s", i, g_err, cases[i].word);
    }
    /* Binary sizes that do not add up, and a header length beyond the body. */
    float v[5] = {0};
    assert_int_equal(parse(&r, "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,4],\"datatype\":\"FP32\","
                               "\"parameters\":{\"binary_data_size\":16}}]}", v, 20, 1), STATUS_INVALID);
    assert_non_null(strstr(g_err, "add up"));
    assert_int_equal(kserve_request_parse(&r, "{}", 2, 3, g_err, sizeof g_err), STATUS_INVALID);
    assert_non_null(strstr(g_err, "Inference-Header-Content-Length"));
    int64_t hl;
    assert_int_equal(kserve_parse_header_length("12", &hl, g_err, sizeof g_err), 0);
    assert_int_equal(hl, 12);
    assert_int_equal(kserve_parse_header_length("-1", &hl, g_err, sizeof g_err), STATUS_INVALID);
    assert_int_equal(kserve_parse_header_length("99999999999999999999999", &hl, g_err, sizeof g_err), STATUS_INVALID);
}

static void test_bind(void **state) {
    struct model_config c;
    tiny_config(&c);
    struct kserve_request r;
    struct tensor ord[1];
    int64_t rows;
    assert_int_equal(parse(&r, "{\"inputs\":[{\"name\":\"x\",\"shape\":[2,4],\"datatype\":\"FP32\",\"data\":[1,2,3,4,5,6,7,8]}]}",
                           NULL, 0, 0), 0);
    assert_int_equal(kserve_request_bind(&r, &c, ord, &rows, g_err, sizeof g_err), 0);
    assert_int_equal(rows, 2);
    assert_ptr_equal(ord[0].data, r.inputs[0].t.data);
    kserve_request_clear(&r);
    static const struct { const char *json; const char *word; } bad[] = {
        {"{\"inputs\":[{\"name\":\"y\",\"shape\":[1,4],\"datatype\":\"FP32\",\"data\":[1,2,3,4]}]}", "'y'"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,4],\"datatype\":\"FP64\",\"data\":[1,2,3,4]}]}", "FP64"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,5],\"datatype\":\"FP32\",\"data\":[1,2,3,4,5]}]}", "[-1,4]"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[4],\"datatype\":\"FP32\",\"data\":[1,2,3,4]}]}", "[-1,4]"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[0,4],\"datatype\":\"FP32\",\"data\":[]}]}", "batch size 0"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,4],\"datatype\":\"FP32\",\"data\":[1,2,3,4]}],"
         "\"outputs\":[{\"name\":\"zz\"}]}", "'zz'"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,4],\"datatype\":\"FP32\",\"data\":[1,2,3,4]}],"
         "\"outputs\":[{\"name\":\"label\",\"parameters\":{\"classification\":1}}]}", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(parse(&r, bad[i].json, NULL, 0, 0), 0);
        int rc = kserve_request_bind(&r, &c, ord, &rows, g_err, sizeof g_err);
        if (bad[i].word) {
            assert_int_equal(rc, STATUS_INVALID);
            if (!strstr(g_err, bad[i].word)) fail_msg("case %zu: '%s' does not mention %s", i, g_err, bad[i].word);
        } else {
            assert_int_equal(rc, 0); /* classification of an integer output is allowed */
        }
        kserve_request_clear(&r);
    }
    model_config_clear(&c);
}

/* Parses json, binds it to c and clears it: bind's status, g_err its message. */
static int bind_json(const struct model_config *c, const char *json, struct tensor *ord, int64_t *rows) {
    struct kserve_request r;
    assert_int_equal(parse(&r, json, NULL, 0, 0), 0);
    int rc = kserve_request_bind(&r, c, ord, rows, g_err, sizeof g_err);
    kserve_request_clear(&r);
    return rc;
}

/* What the batcher and the model no longer check on the server's path:
 * inputs whose batch dims disagree, and a dim the configuration leaves open
 * (-1) beyond the engine's bound. */
static void test_bind_batch_and_dim_bounds(void **state) {
    struct model_config c;
    model_config_init(&c, "two");
    struct model_io ins[2] = {{.name = "a", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 2}},
                              {.name = "b", .dtype = DT_FP32, .ndim = 3, .dims = {-1, -1, -1}}};
    struct model_io outs[1] = {{.name = "y", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 2}}};
    assert_int_equal(model_config_complete(&c, ins, 2, outs, 1, g_err, sizeof g_err), 0);
    struct tensor ord[2];
    int64_t rows = 0;
    assert_int_equal(bind_json(&c, "{\"inputs\":[{\"name\":\"b\",\"shape\":[2,1,1],\"datatype\":\"FP32\",\"data\":[1,2]},"
                                   "{\"name\":\"a\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[1,2,3,4]}]}",
                               ord, &rows), 0);
    assert_int_equal(rows, 2);
    assert_int_equal(ord[0].dims[1], 2); /* a, in the model's order */
    assert_int_equal(bind_json(&c, "{\"inputs\":[{\"name\":\"a\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[1,2,3,4]},"
                                   "{\"name\":\"b\",\"shape\":[1,1,1],\"datatype\":\"FP32\",\"data\":[1]}]}",
                               ord, &rows), STATUS_INVALID);
    assert_string_equal(g_err, "input 'b': batch size 1 differs from the other inputs' 2");
    /* A zero dim keeps the data empty however large the other. */
    assert_int_equal(bind_json(&c, "{\"inputs\":[{\"name\":\"a\",\"shape\":[1,2],\"datatype\":\"FP32\",\"data\":[1,2]},"
                                   "{\"name\":\"b\",\"shape\":[1,0,16777217],\"datatype\":\"FP32\",\"data\":[]}]}",
                               ord, &rows), STATUS_INVALID);
    assert_string_equal(g_err, "input 'b': dim 2 is 16777217, outside [0, 16777216]");
    model_config_clear(&c);
}

/* body with each spliced output's block put back at its place. */
static struct buf join_splices(const struct buf *body, const struct kserve_splice *sp, int n,
                                      const struct tensor *outs) {
    size_t total = body->len;
    for (int i = 0; i < n; i++) total += sp[i].len;
    struct buf j = {.data = malloc(total), .cap = total};
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        memcpy(j.data + j.len, body->data + at, sp[i].at - at);
        j.len += sp[i].at - at;
        memcpy(j.data + j.len, outs[sp[i].output].data, sp[i].len);
        j.len += sp[i].len;
        at = sp[i].at;
    }
    memcpy(j.data + j.len, body->data + at, body->len - at);
    j.len += body->len - at;
    return j;
}

/* The spliced encoding sends the same bytes: the body with each listed
 * output block put back at its place is the plain encoding's body. A
 * classification (encoded) stays in the body; at most max_splices are listed. */
static void test_encode_spliced_same_bytes(void **state) {
    struct model_config c;
    tiny_config(&c);
    struct kserve_request r;
    assert_int_equal(parse(&r, "{\"inputs\":[{\"name\":\"x\",\"shape\":[2,4],\"datatype\":\"FP32\","
                               "\"data\":[1,2,3,4,5,6,7,8]}],\"outputs\":[{\"name\":\"label\",\"parameters\":"
                               "{\"classification\":1,\"binary_data\":true}},{\"name\":\"probs\"}],"
                               "\"parameters\":{\"binary_data_output\":true}}", NULL, 0, 0), 0);
    float probs[6] = {0.1f, 0.7f, 0.2f, 0.5f, 0.2f, 0.3f};
    int64_t label[2] = {1, 0};
    struct tensor outs[2] = {{.dtype = DT_FP32, .ndim = 2, .dims = {2, 3}, .data = probs},
                             {.dtype = DT_INT64, .ndim = 1, .dims = {2}, .data = label}};
    struct buf plain = {0}, body = {0}, joined;
    size_t jl_plain, jl;
    struct kserve_splice sp[2];
    int n = -1;
    assert_int_equal(kserve_response_encode(&r, &c, "tiny", "1", outs, &plain, &jl_plain, g_err, sizeof g_err), 0);
    assert_int_equal(kserve_response_encode_spliced(&r, &c, "tiny", "1", outs, &body, &jl, sp, 0, &n, g_err,
                                                    sizeof g_err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(body.len, plain.len);
    buf_free(&body);
    assert_int_equal(kserve_response_encode_spliced(&r, &c, "tiny", "1", outs, &body, &jl, sp, 2, &n, g_err,
                                                    sizeof g_err), 0);
    assert_int_equal(jl, jl_plain);
    assert_int_equal(n, 1);
    assert_int_equal(sp[0].output, 0); /* probs, raw; label is classified */
    assert_int_equal(sp[0].len, sizeof probs);
    joined = join_splices(&body, sp, n, outs);
    assert_int_equal(joined.len, plain.len);
    assert_memory_equal(joined.data, plain.data, plain.len);
    buf_free(&plain);
    buf_free(&body);
    buf_free(&joined);
    kserve_request_clear(&r);
    model_config_clear(&c);
}

static void test_encode_json_binary_classification(void **state) {
    struct model_config c;
    tiny_config(&c);
    struct kserve_request r;
    assert_int_equal(parse(&r, "{\"id\":\"z\",\"inputs\":[{\"name\":\"x\",\"shape\":[2,4],\"datatype\":\"FP32\","
                               "\"data\":[1,2,3,4,5,6,7,8]}],\"outputs\":[{\"name\":\"label\"},"
                               "{\"name\":\"probs\",\"parameters\":{\"classification\":2}},"
                               "{\"name\":\"probs\",\"parameters\":{\"binary_data\":true}}]}", NULL, 0, 0),
                     STATUS_INVALID); /* the same output twice */
    assert_int_equal(parse(&r, "{\"id\":\"z\",\"inputs\":[{\"name\":\"x\",\"shape\":[2,4],\"datatype\":\"FP32\","
                               "\"data\":[1,2,3,4,5,6,7,8]}],\"outputs\":[{\"name\":\"label\",\"parameters\":"
                               "{\"binary_data\":true}},{\"name\":\"probs\",\"parameters\":{\"classification\":2}}]}",
                           NULL, 0, 0), 0);
    float probs[6] = {0.1f, 0.7f, 0.2f, 0.5f, 0.2f, 0.3f};
    int64_t label[2] = {1, 0};
    struct tensor outs[2] = {{.dtype = DT_FP32, .ndim = 2, .dims = {2, 3}, .data = probs},
                             {.dtype = DT_INT64, .ndim = 1, .dims = {2}, .data = label}};
    struct buf b = {0};
    size_t jl;
    assert_int_equal(kserve_response_encode(&r, &c, "tiny", "1", outs, &b, &jl, g_err, sizeof g_err), 0);
    assert_int_equal(b.len, jl + 16);
    assert_memory_equal(b.data + jl, label, 16);
    char *json = strndup(b.data, jl);
    assert_non_null(strstr(json, "\"id\":\"z\""));
    assert_non_null(strstr(json, "\"binary_data_size\":16"));
    assert_non_null(strstr(json, "\"datatype\":\"BYTES\",\"shape\":[2,2]"));
    assert_non_null(strstr(json, "\"0.700000:1\",\"0.200000:2\",\"0.500000:0\",\"0.300000:2\""));
    free(json);
    buf_free(&b);
    kserve_request_clear(&r);
    model_config_clear(&c);
}

/* ---- random bodies ------------------------------------------------------- */

static uint64_t g_rs = 0x2545f4914f6cdd1dULL;
static unsigned rnd(unsigned n) {
    g_rs ^= g_rs << 13;
    g_rs ^= g_rs >> 7;
    g_rs ^= g_rs << 17;
    return (unsigned)(g_rs % n);
}

struct text {
    char b[4096];
    size_t n;
};

static void put(struct text *t, const char *s) {
    size_t l = strlen(s);
    if (t->n + l < sizeof t->b) {
        memcpy(t->b + t->n, s, l);
        t->n += l;
    }
}

static void ws(struct text *t) {
    static const char *w[] = {"", "", "", " ", "\n", "\t", "\r\n  ", "\x01"};
    put(t, w[rnd(50) ? rnd(7) : 7]);
}

static void leaf(struct text *t) {
    static const char *tok[] = {
        "0", "-0", "1", "-1", "7", "255", "256", "-128", "-129", "65535", "1.5", "-2.25", "1e2", "1E-3", "2.5e+1",
        "3.4028235e38", "3.5e38", "1e400", "-1e400", "1e-400", "9007199254740991", "9007199254740993",
        "18446744073709551615", "4294967296", "0.30000001192092896", "0.1", "12345678901234567890123",
        "0.000001234", "123456789012345678.5e-10", "2147483647", "-2147483648", "01", "1.", "-", ".5", "1e", "+1",
        "-01.5", "1.5.5", "\"a\"", "\"NaN\"", "\"Infinity\"", "\"-Infinity\"", "NaN", "Infinity", "-Infinity",
        "true", "false", "null", "{}", "[]", "\"\\u0041\\n\"",
        "\"\\uZZZZ\"", "\"\\ud800\"", "\"\\q\""}; /* escapes JSON refuses */
    size_t n = sizeof tok / sizeof tok[0];
    /* Mostly numbers. */
    put(t, tok[rnd(4) ? rnd(31) : rnd((unsigned)n)]);
}

static void data_array(struct text *t, int depth) {
    put(t, "[");
    int n = (int)rnd(5);
    for (int i = 0; i < n; i++) {
        if (i) put(t, ",");
        ws(t);
        if (depth < 3 && !rnd(4)) data_array(t, depth + 1);
        else leaf(t);
        ws(t);
    }
    put(t, "]");
}

/* An input that is mostly right: a datatype, a shape and that many values
 * a JSON client would send for it, flat or nested by rows. */
static void good_input(struct text *t) {
    static const char *types[] = {"FP32", "FP64", "INT8", "UINT8", "INT16", "INT32", "UINT32", "INT64", "UINT64"};
    static const char *ints[] = {"0", "1", "-1", "7", "100", "-100", "127", "-0", "2.0", "1e2", "65"};
    static const char *floats[] = {"0.30000001192092896", "0.1", "-2.5", "1e-7", "3.4028235e38", "123456.789",
                                   "0.9999999403953552", "1.1754943508222875e-38", "12345678901234567890",
                                   "1.00000000000000000001", "4.9406564584124654e-324", "1e23", "5e-1", "0"};
    int ti = (int)rnd(9);
    int rows = (int)rnd(3) + 1, cols = (int)rnd(5);
    char b[128];
    snprintf(b, sizeof b, "{\"name\":\"in%u\",\"datatype\":\"%s\",\"shape\":[%d,%d],", rnd(4), types[ti], rows, cols);
    put(t, b);
    put(t, rnd(8) ? "\"data\":" : "\"data\" : ");
    int nested = (int)rnd(2);
    put(t, "[");
    for (int r = 0; r < rows; r++) {
        if (r) put(t, ",");
        if (nested) put(t, "[");
        for (int c = 0; c < cols; c++) {
            if (c || (r && !nested)) put(t, ",");
            if (!rnd(10)) ws(t);
            if (!rnd(60)) leaf(t);
            else put(t, ti < 2 ? floats[rnd(14)] : ints[rnd(11)]);
        }
        if (nested) put(t, "]");
    }
    put(t, "]}");
}

static void input_obj(struct text *t) {
    if (rnd(3)) {
        good_input(t);
        return;
    }
    static const char *types[] = {"FP32", "FP64", "INT8", "UINT8", "INT16", "UINT16", "INT32", "UINT32",
                                  "INT64", "UINT64", "BOOL", "BYTES", "FP16", "NOPE"};
    static const char *names[] = {"x", "y", "x"};
    char b[128];
    put(t, "{");
    ws(t);
    snprintf(b, sizeof b, "\"name\":\"%s\",\"datatype\":\"%s\",", names[rnd(3)], types[rnd(14)]);
    put(t, b);
    int dims = (int)rnd(3) + 1;
    put(t, "\"shape\":[");
    for (int d = 0; d < dims; d++) {
        snprintf(b, sizeof b, "%s%u", d ? "," : "", rnd(4));
        put(t, b);
    }
    put(t, "]");
    static const char *key[] = {"\"data\"", "\"data\"", "\"data\"", "\"data\"", "\"d\\u0061ta\"", "\"dat\""};
    int nkeys = rnd(6) ? 1 : 2; /* sometimes a second "data" */
    for (int k = 0; k < nkeys; k++) {
        put(t, ",");
        ws(t);
        put(t, key[rnd(6)]);
        ws(t);
        put(t, ":");
        ws(t);
        if (rnd(8)) data_array(t, 0);
        else leaf(t);
    }
    if (!rnd(8)) put(t, ",\"parameters\":{\"binary_data_size\":4}");
    ws(t);
    put(t, "}");
}

static void random_body(struct text *t) {
    t->n = 0;
    ws(t);
    put(t, "{");
    static const char *ikey[] = {"\"inputs\"", "\"inputs\"", "\"inputs\"", "\"\\u0069nputs\""};
    int nkeys = rnd(5) ? 1 : 2; /* sometimes a second "inputs" */
    static const char *ids[] = {"\"id\":\"q\\\"1\",", "\"id\":\"\\ud800\",", "\"id\":\"\\x\","};
    if (rnd(2)) put(t, ids[rnd(20) ? 0 : 1 + rnd(2)]);
    for (int k = 0; k < nkeys; k++) {
        if (k) put(t, ",");
        put(t, ikey[rnd(4)]);
        put(t, ":");
        ws(t);
        if (rnd(10)) {
            put(t, "[");
            int n = (int)rnd(3) + 1;
            for (int i = 0; i < n; i++) {
                if (i) put(t, ",");
                if (rnd(30)) input_obj(t);
                else leaf(t);
            }
            put(t, "]");
        } else input_obj(t);
    }
    if (rnd(3) == 0) put(t, ",\"outputs\":[{\"name\":\"p\",\"parameters\":{\"data\":[1,2]}}]");
    if (rnd(4) == 0) put(t, ",\"parameters\":{\"inputs\":[{\"data\":[1]}],\"priority\":2}");
    put(t, "}");
    ws(t);
    if (!rnd(40)) put(t, "x");
    if (!rnd(20)) t->n = rnd((unsigned)t->n + 1); /* truncated */
}

/* Random requests, valid and not: each is read, or refused with a message
 * (malformed JSON at a byte inside the body); what is read holds tensors
 * of the size their shape says. ASan builds check the rest. */
static void test_random_bodies(void **state) {
    static struct text t;
    int ok = 0, malformed = 0, refused = 0;
    for (int it = 0; it < 100000; it++) {
        random_body(&t);
        char body[4200];
        memcpy(body, t.b, t.n);
        body[t.n] = 0;
        struct kserve_request a;
        char ea[512] = "";
        int ra = kserve_request_parse(&a, body, t.n, -1, ea, sizeof ea);
        if (ra == 0) {
            for (int i = 0; i < a.ninputs; i++)
                if (!a.inputs[i].binary && !a.inputs[i].t.data) fail_msg("input %d has no data: %s", i, body);
            ok++;
            kserve_request_clear(&a);
            continue;
        }
        assert_int_equal(ra, STATUS_INVALID);
        assert_true(ea[0] != 0);
        size_t at;
        if (sscanf(ea, "malformed JSON in the request body at byte %zu", &at) == 1) {
            if (at > t.n) fail_msg("offset %zu past %zu: %s", at, t.n, body);
            malformed++;
        } else refused++;
    }
    if (ok < 5000 || malformed < 3000 || refused < 5000) fail_msg("ok %d, malformed %d, refused %d", ok, malformed, refused);
}

/* A large tensor: the values outgrow every local room; each reads back as
 * the value printed. */
static void test_large_tensor(void **state) {
    size_t cap = 200000, n = 0;
    char *body = malloc(cap);
    n += (size_t)snprintf(body, cap, "{\"inputs\":[{\"name\":\"x\",\"shape\":[5000],\"datatype\":\"FP64\",\"data\":[");
    for (int i = 0; i < 5000; i++)
        n += (size_t)snprintf(body + n, cap - n, "%s%.17g", i ? "," : "", (double)(float)i / 3.0f - 50);
    n += (size_t)snprintf(body + n, cap - n, "]}]}");
    struct kserve_request a;
    assert_int_equal(kserve_request_parse(&a, body, n, -1, g_err, sizeof g_err), 0);
    for (int i = 0; i < 5000; i++) assert_true(((double *)a.inputs[0].t.data)[i] == (double)(float)i / 3.0f - 50);
    kserve_request_clear(&a);
    free(body);
}

/* A long mantissa whose scale cancels part of a long exponent: read as
 * strtod reads it, here infinity (refused for FP32) and zero (accepted for
 * FP64), not 1 from a capped exponent. */
static void test_long_mantissa_long_exponent(void **state) {
    static const struct { const char *dt, *lead; const char *tail; int rc; const char *err; } cases[] = {
        {"FP32", "0.", "1e1000000", STATUS_INVALID, "input 'x': data[1] = inf is out of range for FP32"},
        {"FP64", "1", "e-1000000", 0, ""},
    };
    size_t zeros = 100000, cap = zeros + 256;
    char *body = malloc(cap);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = (size_t)snprintf(body, cap, "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"%s\",\"shape\":[2],\"data\":[2,%s",
                                    cases[c].dt, cases[c].lead);
        memset(body + n, '0', zeros);
        n += zeros;
        n += (size_t)snprintf(body + n, cap - n, "%s]}]}", cases[c].tail);
        struct kserve_request a;
        char ea[512] = "";
        assert_int_equal(kserve_request_parse(&a, body, n, -1, ea, sizeof ea), cases[c].rc);
        assert_string_equal(ea, cases[c].err);
        if (cases[c].rc == 0) {
            assert_true(((double *)a.inputs[0].t.data)[1] == 0);
            kserve_request_clear(&a);
        }
    }
    free(body);
}

/* ---- the one-pass reader's errors and values ---------------------------- */

#define IN1(dt, shape, data) "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"" dt "\",\"shape\":" shape ",\"data\":" data "}]}"

/* Every kind of error, with its message (a malformed body's byte offset
 * included): the first request error is the one told, unless the body is
 * not JSON at all. */
static void test_reader_errors(void **state) {
    static const struct { const char *json, *err; } cases[] = {
        {"{", "malformed JSON in the request body at byte 1"},
        {"{\"inputs\":[}", "malformed JSON in the request body at byte 11"},
        {"{\"inputs\":[{\"name\":\"x\",}]}", "malformed JSON in the request body at byte 23"},
        {"{\"id\":\"a\\qb\",\"inputs\":[]}", "malformed JSON in the request body at byte 8"},
        {"{\"id\":\"\\ud800\",\"inputs\":[]}", "malformed JSON in the request body at byte 7"},
        {"{\"id\":\"\\ud800\\u0041\",\"inputs\":[]}", "malformed JSON in the request body at byte 7"},
        {"{\"id\":\"abc", "malformed JSON in the request body at byte 10"},
        {IN1("INT32", "[1]", "[01]"), "malformed JSON in the request body at byte 63"},
        {IN1("INT32", "[1]", "[1.]"), "malformed JSON in the request body at byte 62"},
        {IN1("INT32", "[1]", "[+1]"), "malformed JSON in the request body at byte 62"},
        {IN1("INT32", "[1]", "[1,]"), "malformed JSON in the request body at byte 64"},
        {IN1("INT32", "[1]", "[tru]"), "malformed JSON in the request body at byte 62"},
        /* A request error before a syntax error: the syntax error is told. */
        {"{\"id\":1,\"inputs\":[", "malformed JSON in the request body at byte 18"},
        {IN1("INT8", "[1]", "[300]") " x", "unexpected bytes after the JSON header at byte 69"},
        {"[1]", "the request body must be a JSON object"},
        {"{\"id\":1,\"inputs\":[]}", "field 'id' must be a string"},
        {"{\"inputs\":{}}", "field 'inputs' must be an array"},
        {"{\"parameters\":[]}", "field 'parameters' must be an object"},
        {"{\"parameters\":{\"priority\":-1},\"inputs\":[]}", "parameters.priority must be an integer >= 0"},
        {"{\"parameters\":{\"timeout\":18446744073709551616},\"inputs\":[]}", "parameters.timeout must be an integer >= 0"},
        {"{\"parameters\":{\"binary_data_output\":1},\"inputs\":[]}", "parameters.binary_data_output must be true or false"},
        {"{\"parameters\":{\"cache\":\"no\"},\"inputs\":[]}", "parameters.cache must be true or false"},
        {"{\"parameters\":{\"sequence_id\":-3},\"inputs\":[]}", "parameters.sequence_id must be an integer >= 0 or a string"},
        {"{\"parameters\":{\"sequence_id\":\"\"},\"inputs\":[]}", "parameters.sequence_id must be a non-empty string or an integer > 0"},
        {"{\"parameters\":{\"sequence_start\":1},\"inputs\":[]}", "parameters.sequence_start must be true or false"},
        {"{\"outputs\":[]}", "field 'inputs' is missing"},
        {"{\"inputs\":[1]}", "field 'inputs[0]' must be an object"},
        {"{\"inputs\":[{\"name\":\"\"}]}", "field 'inputs[0].name' must be a non-empty string"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":3}]}", "input 'x': field 'datatype' is missing or not a string"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT\"}]}", "input 'x': datatype 'INT' is not one of BOOL, UINT8, "
         "UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, BF16, FP32, FP64, BYTES"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":1}]}", "input 'x': field 'shape' is missing or not an array"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1,-2]}]}", "input 'x': shape[1] must be an integer >= 0"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1,1,1,1,1,1,1,1,1]}]}",
         "input 'x': field 'shape' has more than 8 dims"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"parameters\":[]}]}",
         "input 'x': field 'parameters' must be an object"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"data\":[1],\"parameters\":{\"binary_data_size\":1}}]}",
         "input 'x': has both 'data' and parameters.binary_data_size; send one"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"parameters\":{\"binary_data_size\":1.5}}]}",
         "input 'x': parameters.binary_data_size must be an integer >= 0"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"parameters\":{\"shared_memory_region\":\"r\"}}]}",
         "input 'x': parameters.shared_memory_byte_size is missing (shared memory needs it)"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"parameters\":{\"shared_memory_region\":\"r\","
         "\"shared_memory_byte_size\":1,\"shared_memory_offset\":\"0\"}}]}",
         "input 'x': parameters.shared_memory_offset must be an integer >= 0"},
        {IN1("FP32", "[1]", "null"), "input 'x': 'data' must be an array of values (flat or nested), not null"},
        {IN1("FP32", "[1]", "{}"), "input 'x': 'data' must be an array of values (flat or nested), not an object"},
        {IN1("BF16", "[1]", "[1]"), "input 'x': datatype BF16 cannot be sent as JSON data; use the binary tensor extension"},
        {IN1("INT8", "[3]", "[1,2]"), "input 'x': 'data' has 2 elements but shape [3] needs 3"},
        {IN1("INT8", "[3]", "[1000,2]"), "input 'x': 'data' has 2 elements but shape [3] needs 3"},
        {IN1("INT8", "[1000000000]", "[1]"), "input 'x': 'data' has 1 elements but shape [1000000000] needs 1000000000"},
        {IN1("INT8", "[2]", "[1,[2,[3]]]"), "input 'x': 'data' has 3 elements but shape [2] needs 2"},
        {IN1("INT8", "[2]", "[1,128]"), "input 'x': data[1] = 128 is out of range for INT8"},
        {IN1("INT8", "[2]", "[1,-129]"), "input 'x': data[1] = -129 is out of range for INT8"},
        {IN1("UINT8", "[1]", "[-1]"), "input 'x': data[0] = -1 is out of range for UINT8"},
        {IN1("INT8", "[1]", "[1.5]"), "input 'x': data[0] = 1.5 is not a valid INT8"},
        {IN1("INT32", "[1]", "[NaN]"), "input 'x': data[0] must be a number (datatype INT32)"},
        {IN1("INT32", "[1]", "[\"1\"]"), "input 'x': data[0] must be a number (datatype INT32)"},
        {IN1("BOOL", "[1]", "[1]"), "input 'x': data[0] must be true or false (datatype BOOL)"},
        {IN1("BYTES", "[1]", "[1]"), "input 'x': data[0] must be a string (datatype BYTES)"},
        {IN1("FP32", "[1]", "[\"Inf\"]"), "input 'x': data[0] must be a number (datatype FP32)"},
        {IN1("FP32", "[2]", "[1,1e39]"), "input 'x': data[1] = 1e+39 is out of range for FP32"},
        {IN1("FP64", "[1]", "[1e999]"), "input 'x': data[0] = inf is out of range for FP64"},
        {IN1("FP16", "[1]", "[65520]"), "input 'x': data[0] = 65520 is out of range for FP16"},
        {IN1("INT32", "[1]", "[1]") "\n", NULL},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"data\":[1]},"
         "{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"data\":[1]}]}", "input 'x' already exists in request (it appears twice in 'inputs')"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"data\":[1]}],\"outputs\":[{\"name\":\"y\","
         "\"parameters\":{\"binary_data\":\"yes\"}}]}", "output 'y': parameters.binary_data must be true or false"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"data\":[1]}],\"outputs\":[{\"name\":\"y\","
         "\"parameters\":{\"classification\":1000001}}]}", "output 'y': parameters.classification must be an integer >= 0"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"data\":[1]}],\"outputs\":[{\"name\":\"y\","
         "\"parameters\":{\"classification\":1,\"shared_memory_region\":\"r\",\"shared_memory_byte_size\":4}}]}",
         "output 'y': parameters.shared_memory_region and parameters.classification cannot both be set"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"data\":[1]}],\"outputs\":[{\"name\":\"y\"},"
         "{\"name\":\"y\"}]}", "output 'y' already exists in request (it appears twice in 'outputs')"},
        {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"data\":[1]}],\"junk\":{\"k\":\"a\\u0000\"}}",
         "field 'k' holds a NUL byte (\\u0000): names, ids and parameters may not; only BYTES data may"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct kserve_request r;
        char err[512] = "";
        /* With the header: no hint about binary data after a syntax error. */
        int rc = kserve_request_parse(&r, cases[i].json, strlen(cases[i].json), (int64_t)strlen(cases[i].json), err,
                                      sizeof err);
        if (!cases[i].err) {
            if (rc) fail_msg("case %zu: %s", i, err);
            kserve_request_clear(&r);
            continue;
        }
        if (rc != STATUS_INVALID || strcmp(err, cases[i].err))
            fail_msg("case %zu: %d '%s', expected '%s'", i, rc, err, cases[i].err);
        assert_null(r.inputs); /* cleared */
    }
    /* Without the header a syntax error says what binary data needs. */
    assert_int_equal(parse(&(struct kserve_request){0}, "{", NULL, 0, 0), STATUS_INVALID);
    assert_string_equal(g_err, "malformed JSON in the request body at byte 1 (binary data needs the "
                               "Inference-Header-Content-Length header)");
    /* Nesting: in 'data' and anywhere else. */
    char deep[512];
    size_t n = (size_t)snprintf(deep, sizeof deep, "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"data\":");
    for (int k = 0; k < 110; k++) deep[n++] = '[';
    deep[n++] = '1';
    for (int k = 0; k < 110; k++) deep[n++] = ']';
    n += (size_t)snprintf(deep + n, sizeof deep - n, "}]}");
    struct kserve_request r;
    assert_int_equal(kserve_request_parse(&r, deep, n, -1, g_err, sizeof g_err), STATUS_INVALID);
    assert_string_equal(g_err, "input 'x': JSON nesting depth exceeds maximum allowed limit (100) in 'data'");
    n = (size_t)snprintf(deep, sizeof deep, "{\"junk\":");
    for (int k = 0; k < 110; k++) deep[n++] = '[';
    for (int k = 0; k < 110; k++) deep[n++] = ']';
    n += (size_t)snprintf(deep + n, sizeof deep - n, ",\"inputs\":[]}");
    assert_int_equal(kserve_request_parse(&r, deep, n, -1, g_err, sizeof g_err), STATUS_INVALID);
    assert_string_equal(g_err, "JSON nesting depth exceeds maximum allowed limit (100)");
}

/* INT64 and UINT64 over their whole range, exactly; one past either end is
 * refused, naming the input and the element. */
static void test_int64_exact(void **state) {
    struct kserve_request r;
    assert_int_equal(parse(&r, IN1("INT64", "[6]", "[9223372036854775807,-9223372036854775808,9007199254740993,"
                                   "-9007199254740993,0,-0]"), NULL, 0, 0), 0);
    const int64_t *i = r.inputs[0].t.data;
    assert_true(i[0] == INT64_MAX && i[1] == INT64_MIN && i[2] == 9007199254740993LL && i[3] == -9007199254740993LL &&
                i[4] == 0 && i[5] == 0);
    kserve_request_clear(&r);
    assert_int_equal(parse(&r, IN1("UINT64", "[2,2]", "[[18446744073709551615,9223372036854775808],[1e3,-0]]"), NULL, 0,
                           0), 0);
    const uint64_t *u = r.inputs[0].t.data;
    assert_true(u[0] == UINT64_MAX && u[1] == 9223372036854775808ULL && u[2] == 1000 && u[3] == 0);
    kserve_request_clear(&r);
    static const struct { const char *json, *err; } bad[] = {
        {IN1("INT64", "[2]", "[1,9223372036854775808]"), "input 'x': data[1] = 9223372036854775808 is out of range for INT64"},
        {IN1("INT64", "[2]", "[1,-9223372036854775809]"), "input 'x': data[1] = -9223372036854775809 is out of range for INT64"},
        {IN1("UINT64", "[1]", "[18446744073709551616]"), "input 'x': data[0] = 18446744073709551616 is out of range for UINT64"},
        {IN1("UINT64", "[1]", "[123456789012345678901234567890]"),
         "input 'x': data[0] = 123456789012345678901234567890 is out of range for UINT64"},
        {IN1("UINT64", "[1]", "[-1]"), "input 'x': data[0] = -1 is out of range for UINT64"},
        {IN1("INT64", "[1]", "[9.3e18]"), "input 'x': data[0] = 9.3e+18 is not a valid INT64"},
        {IN1("INT64", "[1]", "[9007199254740993.0]"), "input 'x': data[0] = 9007199254740992 is outside +-(2^53 - 1), "
         "where a number with a fraction or an exponent stops being exact: write INT64 values this large as plain integers"},
        {IN1("INT32", "[1]", "[2147483648]"), "input 'x': data[0] = 2147483648 is out of range for INT32"},
        {IN1("UINT32", "[1]", "[4294967296]"), "input 'x': data[0] = 4294967296 is out of range for UINT32"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        assert_int_equal(parse(&r, bad[k].json, NULL, 0, 0), STATUS_INVALID);
        if (strcmp(g_err, bad[k].err)) fail_msg("case %zu: '%s', expected '%s'", k, g_err, bad[k].err);
    }
    /* Exact in parameters too. */
    assert_int_equal(parse(&r, "{\"parameters\":{\"timeout\":17999999999999999999,\"priority\":7},"
                               "\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"data\":[1]}]}", NULL, 0, 0), 0);
    assert_true(r.timeout_us == 17999999999999999999ULL && r.priority == 7);
    kserve_request_clear(&r);
    /* The sequence batcher's parameters: an integer or a string ID, and the flags. */
    assert_int_equal(parse(&r, "{\"parameters\":{\"sequence_id\":18446744073709551615,\"sequence_start\":true,"
                               "\"sequence_end\":false},\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\","
                               "\"shape\":[1],\"data\":[1]}]}", NULL, 0, 0), 0);
    assert_true(r.seq_id == 18446744073709551615ULL && !r.seq_sid && r.seq_start && !r.seq_end);
    kserve_request_clear(&r);
    assert_int_equal(parse(&r, "{\"parameters\":{\"sequence_id\":\"a session id longer than the request's inline "
                               "room for names\",\"sequence_end\":true},\"inputs\":[{\"name\":\"x\",\"datatype\":"
                               "\"INT8\",\"shape\":[1],\"data\":[1]}]}", NULL, 0, 0), 0);
    assert_string_equal(r.seq_sid, "a session id longer than the request's inline room for names");
    assert_true(r.seq_end && !r.seq_start);
    kserve_request_clear(&r);
}

/* Keys in any order (data before the shape that sizes it), escaped keys,
 * duplicate keys (the first counts, as cJSON's lookups had it), unknown
 * keys skipped, non-finite floats as words and strings. */
static void test_reader_key_order_and_escapes(void **state) {
    struct kserve_request r;
    assert_int_equal(parse(&r, "{\"outputs\":[{\"parameters\":{\"binary_data\":true},\"name\":\"o\"}],\"junk\":[{\"a\":null}],"
                               "\"\\u0069nputs\":[{\"data\":[[1,2],[3,4]],\"extra\":{\"n\":[1,2]},\"shape\":[2,2],"
                               "\"datatype\":\"INT16\",\"name\":\"\\u0078\\n\",\"data\":[9]}],\"inputs\":[],"
                               "\"id\":\"\\\"\\u00e9\\ud83d\\ude00\"}", NULL, 0, 0), 0);
    assert_string_equal(r.inputs[0].name, "x\n");
    assert_string_equal(r.id, "\"\xc3\xa9\xf0\x9f\x98\x80");
    const int16_t *v = r.inputs[0].t.data;
    assert_true(v[0] == 1 && v[3] == 4);
    assert_int_equal(r.noutputs, 1);
    assert_int_equal(r.outputs[0].binary, 1);
    kserve_request_clear(&r);
    assert_int_equal(parse(&r, IN1("FP32", "[6]", "[NaN,Infinity,-Infinity,\"NaN\",\"-Infinity\",-0.0]"), NULL, 0, 0), 0);
    const float *f = r.inputs[0].t.data;
    assert_true(isnan(f[0]) && f[1] == INFINITY && f[2] == -INFINITY && isnan(f[3]) && f[4] == -INFINITY && f[5] == 0 &&
                signbit(f[5]));
    kserve_request_clear(&r);
    /* A scalar 'data' is one element; a BYTES element may be empty. */
    assert_int_equal(parse(&r, IN1("BYTES", "[3]", "[\"\",\"ab\",\"\\u0000\"]"), NULL, 0, 0), 0);
    const struct tensor_str *s = tensor_strs(&r.inputs[0].t);
    assert_true(s[0].len == 0 && s[1].len == 2 && !memcmp(s[1].p, "ab", 2) && s[2].len == 1 && s[2].p[0] == 0);
    kserve_request_clear(&r);
    assert_int_equal(parse(&r, IN1("BOOL", "[1]", "true"), NULL, 0, 0), 0);
    assert_int_equal(((uint8_t *)r.inputs[0].t.data)[0], 1);
    kserve_request_clear(&r);
}

/* Inference-Header-Content-Length 0: the body is the one input's bytes;
 * bind gives them the model's datatype and shape. */
static void test_raw_binary(void **state) {
    struct model_config c;
    tiny_config(&c); /* x FP32 [-1,4], batched */
    float v[4] = {1, 2, 3, 4};
    struct kserve_request r;
    struct tensor ord[1];
    int64_t rows;
    assert_int_equal(kserve_request_parse(&r, v, sizeof v, 0, g_err, sizeof g_err), 0);
    assert_int_equal(r.raw, 1);
    assert_int_equal(r.binary_data_output, 1);
    assert_int_equal(kserve_request_bind(&r, &c, ord, &rows, g_err, sizeof g_err), 0);
    assert_int_equal(rows, 1);
    assert_int_equal(ord[0].dtype, DT_FP32);
    assert_int_equal(ord[0].ndim, 2);
    assert_true(ord[0].dims[0] == 1 && ord[0].dims[1] == 4);
    assert_memory_equal(ord[0].data, v, sizeof v);
    kserve_request_clear(&r);
    assert_int_equal(kserve_request_parse(&r, v, 12, 0, g_err, sizeof g_err), 0);
    assert_int_equal(kserve_request_bind(&r, &c, ord, &rows, g_err, sizeof g_err), STATUS_INVALID);
    assert_string_equal(g_err, "the raw binary request has 12 bytes, which input 'x' of model 'tiny' (FP32, shape "
                               "[-1,4]) cannot hold");
    kserve_request_clear(&r);
    model_config_clear(&c);
    /* One variable dim is found from the byte count; BYTES takes the body whole. */
    struct model_io ins[1] = {{.name = "t", .dtype = DT_INT64, .ndim = 2, .dims = {2, -1}}};
    struct model_io outs[1] = {{.name = "y", .dtype = DT_INT64, .ndim = 1, .dims = {-1}}};
    model_config_init(&c, "open");
    assert_int_equal(model_config_complete(&c, ins, 1, outs, 1, g_err, sizeof g_err), 0);
    int64_t w[6] = {INT64_MIN, 1, 2, 3, 4, INT64_MAX};
    assert_int_equal(kserve_request_parse(&r, w, sizeof w, 0, g_err, sizeof g_err), 0);
    assert_int_equal(kserve_request_bind(&r, &c, ord, &rows, g_err, sizeof g_err), 0);
    assert_true(ord[0].ndim == 2 && ord[0].dims[0] == 2 && ord[0].dims[1] == 3);
    assert_memory_equal(ord[0].data, w, sizeof w);
    kserve_request_clear(&r);
    model_config_clear(&c);
    ins[0] = (struct model_io){.name = "s", .dtype = DT_STRING, .ndim = 1, .dims = {1}};
    model_config_init(&c, "str");
    assert_int_equal(model_config_complete(&c, ins, 1, outs, 1, g_err, sizeof g_err), 0);
    assert_int_equal(kserve_request_parse(&r, "a\0b", 3, 0, g_err, sizeof g_err), 0);
    assert_int_equal(kserve_request_bind(&r, &c, ord, &rows, g_err, sizeof g_err), 0);
    assert_int_equal(tensor_strs(&ord[0])[0].len, 3);
    assert_memory_equal(tensor_strs(&ord[0])[0].p, "a\0b", 3);
    kserve_request_clear(&r);
    model_config_clear(&c);
    /* A model of two inputs takes no raw request. */
    struct model_io two[2] = {{.name = "a", .dtype = DT_FP32, .ndim = 1, .dims = {1}},
                              {.name = "b", .dtype = DT_FP32, .ndim = 1, .dims = {1}}};
    model_config_init(&c, "two");
    assert_int_equal(model_config_complete(&c, two, 2, outs, 1, g_err, sizeof g_err), 0);
    assert_int_equal(kserve_request_parse(&r, v, 4, 0, g_err, sizeof g_err), 0);
    assert_int_equal(kserve_request_bind(&r, &c, ord, &rows, g_err, sizeof g_err), STATUS_INVALID);
    assert_non_null(strstr(g_err, "needs a model with one input"));
    kserve_request_clear(&r);
    model_config_clear(&c);
}

/* Response floats read back exactly; non-finite ones as tritonclient writes them. */
static void test_encode_floats_round_trip(void **state) {
    struct model_config c;
    tiny_config(&c);
    struct kserve_request r;
    assert_int_equal(parse(&r, "{\"inputs\":[{\"name\":\"x\",\"shape\":[2,4],\"datatype\":\"FP32\","
                               "\"data\":[1,2,3,4,5,6,7,8]}]}", NULL, 0, 0), 0);
    float probs[6] = {0.1f, 1.0f / 3, 1e-30f, -0.0f, NAN, -INFINITY};
    int64_t label[2] = {INT64_MIN, 9007199254740993LL};
    struct tensor outs[2] = {{.dtype = DT_FP32, .ndim = 2, .dims = {2, 3}, .data = probs},
                             {.dtype = DT_INT64, .ndim = 1, .dims = {2}, .data = label}};
    struct buf b = {0};
    size_t jl;
    assert_int_equal(kserve_response_encode(&r, &c, "tiny", "1", outs, &b, &jl, g_err, sizeof g_err), 0);
    char *json = strndup(b.data, jl);
    assert_non_null(strstr(json, "\"shape\":[2,3],\"data\":[0.1,0.33333334,1e-30,-0,NaN,-Infinity]"));
    assert_non_null(strstr(json, "\"shape\":[2],\"data\":[-9223372036854775808,9007199254740993]"));
    free(json);
    buf_free(&b);
    kserve_request_clear(&r);
    model_config_clear(&c);
}

/* A body of n copies of item (joined by commas) at the %s of fmt. */
static char *repeat_body(const char *fmt, const char *item, size_t n, size_t *len) {
    size_t il = strlen(item), cap = strlen(fmt) + n * (il + 1) + 1;
    char *many = malloc(n * (il + 1) + 1), *body = malloc(cap);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (i) many[k++] = ',';
        memcpy(many + k, item, il);
        k += il;
    }
    many[k] = 0;
    *len = (size_t)snprintf(body, cap, fmt, many);
    free(many);
    return body;
}

/* The request memory bound: values the reader ignores cost no tree (their
 * body parses within a bound it could not build nodes for), values it reads
 * stop at the bound with an error that names it, and so do input copies. */
static void test_request_memory_bound(void **state) {
    kserve_set_max_request_memory(1 << 20);
    struct kserve_request r;
    size_t len;
    char *body = repeat_body("{\"junk\":[%s],\"parameters\":{\"x\":[[1,2,3]],\"priority\":3},\"inputs\":[{\"name\":\"x\","
                             "\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1],\"parameters\":{\"other\":\"a long ignored "
                             "string\"}}]}", "{\"a\":[1,2,3]}", 35000, &len);
    assert_true(len < (1 << 20) / 2); /* its tree would take over 10 MB */
    assert_int_equal(kserve_request_parse(&r, body, len, -1, g_err, sizeof g_err), 0);
    assert_int_equal(r.priority, 3);
    assert_int_equal(r.ninputs, 1);
    kserve_request_clear(&r);
    free(body);
    /* BYTES elements: their decoded bytes count too. */
    body = repeat_body("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"BYTES\",\"shape\":[2000],\"data\":[%s]}]}",
                       "\"a long enough string of bytes, 1 KB over 2000 elements: 2 MB in all ....................."
                       "............................................................................................"
                       "............................................................................................"
                       "............................................................................................"
                       "............................................................................................"
                       "............................................................................................"
                       "............................................................................................"
                       "............................................................................................"
                       "............................................................................................"
                       "............................................................................................"
                       "...........................................................................................\"",
                       2000, &len);
    assert_int_equal(kserve_request_parse(&r, body, len, -1, g_err, sizeof g_err), STATUS_INVALID);
    assert_non_null(strstr(g_err, "--max-request-memory"));
    free(body);
    /* 300k FP64 values: 2.4 MB as a tensor from a 600 KB body. */
    body = repeat_body("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP64\",\"shape\":[300000],\"data\":[%s]}]}", "1",
                       300000, &len);
    assert_int_equal(kserve_request_parse(&r, body, len, -1, g_err, sizeof g_err), STATUS_INVALID);
    assert_non_null(strstr(g_err, "--max-request-memory"));
    free(body);
    /* More inputs than the reader takes: refused by count, as before. */
    body = repeat_body("{\"inputs\":[%s]}", "{}", 2000, &len);
    assert_int_equal(kserve_request_parse(&r, body, len, -1, g_err, sizeof g_err), STATUS_INVALID);
    assert_string_equal(g_err, "field 'inputs' has more than 1024 entries");
    free(body);
    kserve_set_max_request_memory(0);
}

/* Bytes that are not UTF-8 are written as U+FFFD; valid sequences pass. */
static void test_json_string_replaces_bad_utf8(void **state) {
    static const struct { const char *in, *out; } cases[] = {
        {"ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "\"ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""},
        {"\xff", "\"\xef\xbf\xbd\""},
        {"a\xc3", "\"a\xef\xbf\xbd\""},
        {"\xc0\xaf", "\"\xef\xbf\xbd\xef\xbf\xbd\""},
        {"\xed\xa0\x80", "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\""},
        {"\xf4\x90\x80\x80", "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\""},
        {"\x80q\"", "\"\xef\xbf\xbdq\\\"\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct buf b = {0};
        kserve_buf_json_string(&b, cases[i].in, strlen(cases[i].in));
        assert_int_equal(b.len, strlen(cases[i].out));
        assert_memory_equal(b.data, cases[i].out, b.len);
        buf_free(&b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_json_nested_and_flat),
        cmocka_unit_test(test_parse_binary_and_bytes),
        cmocka_unit_test(test_parse_json_nul_bytes),
        cmocka_unit_test(test_parse_errors_name_the_field),
        cmocka_unit_test(test_parse_beyond_inline_room),
        cmocka_unit_test(test_bind),
        cmocka_unit_test(test_encode_spliced_same_bytes),
        cmocka_unit_test(test_bind_batch_and_dim_bounds),
        cmocka_unit_test(test_encode_json_binary_classification),
        cmocka_unit_test(test_random_bodies),
        cmocka_unit_test(test_large_tensor),
        cmocka_unit_test(test_long_mantissa_long_exponent),
        cmocka_unit_test(test_reader_errors),
        cmocka_unit_test(test_int64_exact),
        cmocka_unit_test(test_reader_key_order_and_escapes),
        cmocka_unit_test(test_raw_binary),
        cmocka_unit_test(test_encode_floats_round_trip),
        cmocka_unit_test(test_request_memory_bound),
        cmocka_unit_test(test_json_string_replaces_bad_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
