/* test_kserve.c - the KServe v2 codec alone: parsing (JSON, nested data,
 * binary payloads, BYTES), binding to a model configuration, and response
 * encoding (JSON, binary, classification). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "config/model_config.h"
#include "models/model.h"
/* The reader itself, to reach parse_body, which can read without the numeric prescan. */
#include "server/kserve_read.c"

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

/* BYTES in JSON carry \u0000 as a byte; the 0x01 bytes the decoder uses
 * to carry it through cJSON come back as sent; a NUL anywhere but in BYTES
 * data (a name, a key, an id) is refused, naming the field. */
/* The check that sends a body through the NUL rewrite: no false negative
 * whatever escapes come before a \u0000; an escaped backslash followed by
 * the text u0000 is no NUL. */
static void test_json_may_hold_nul(void **state) {
    static const struct { const char *text; int nul; } cases[] = {
        {"{\"data\":[1,2,3]}", 0},
        {"[\"a\\u0000b\"]", 1},
        {"[\"\\\\u0000\"]", 0},          /* \\ then the letters u0000 */
        {"[\"\\\\\\u0000\"]", 1},      /* \\ then \u0000 */
        {"[\"\\n\\u0001\\u0000\"]", 1},
        {"[\"\\u000\"]", 0},
        {"\\u0000", 1},
        {"\\", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(json_may_hold_nul(cases[i].text, strlen(cases[i].text)), cases[i].nul);
    assert_int_equal(json_may_hold_nul("ab\0c", 4), 1); /* a raw NUL byte */
}

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

/* ---- the prescan against cJSON alone ------------------------------------ */

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
        "\"\\uZZZZ\"", "\"\\ud800\"", "\"\\q\""}; /* escapes the prescan passes over but cJSON refuses */
    size_t n = sizeof tok / sizeof tok[0];
    /* Mostly numbers: the path the prescan takes. */
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

static void assert_same_request(const struct kserve_request *a, const struct kserve_request *b, const char *body) {
    if ((a->id == NULL) != (b->id == NULL) || (a->id && strcmp(a->id, b->id)) || a->priority != b->priority ||
        a->ninputs != b->ninputs || a->noutputs != b->noutputs)
        fail_msg("requests differ for %s", body);
    for (int i = 0; i < a->ninputs; i++) {
        const struct kserve_input *x = &a->inputs[i], *y = &b->inputs[i];
        if (strcmp(x->name, y->name) || x->t.dtype != y->t.dtype || x->t.ndim != y->t.ndim || x->binary != y->binary ||
            memcmp(x->t.dims, y->t.dims, sizeof x->t.dims[0] * (size_t)x->t.ndim))
            fail_msg("input %d differs for %s", i, body);
        if (x->binary) continue;
        int64_t n = tensor_numel(&x->t);
        if (x->t.dtype == DT_STRING) {
            for (int64_t k = 0; k < n; k++)
                if (!tensor_str_eq(tensor_strs(&x->t)[k], tensor_strs(&y->t)[k])) fail_msg("input %d string %lld differs for %s", i, (long long)k, body);
        } else if (n && memcmp(x->t.data, y->t.data, (size_t)n * dtype_size(x->t.dtype)))
            fail_msg("input %d data differs for %s", i, body);
    }
}

/* Random requests, valid and not, read with the numeric prescan and with
 * cJSON alone: the same tensors (bit for bit), or the same error message. */
static void test_prescan_matches_cjson(void **state) {
    static struct text t;
    int ok = 0, fast = 0, refused = 0;
    for (int it = 0; it < 100000; it++) {
        random_body(&t);
        char body[4200];
        memcpy(body, t.b, t.n);
        body[t.n] = 0;
        struct fast_data fd;
        fast_data_init(&fd);
        char local[64]; /* small: the malloc'd copy is exercised too */
        char *copy = prescan(body, t.n, &fd, local, sizeof local);
        int took = copy != NULL;
        if (copy != local) free(copy);
        fast_data_free(&fd);
        struct kserve_request a, b;
        char ea[512] = "", eb[512] = "";
        int ra = kserve_request_parse(&a, body, t.n, -1, ea, sizeof ea);
        int rb = parse_body(&b, body, t.n, -1, 0, eb, sizeof eb);
        if (ra != rb || strcmp(ea, eb)) fail_msg("%s\nprescan: %d '%s'\ncJSON: %d '%s'", body, ra, ea, rb, eb);
        if (ra == 0) {
            assert_same_request(&a, &b, body);
            ok++;
            fast += took;
            kserve_request_clear(&a);
            kserve_request_clear(&b);
        } else refused++;
    }
    /* Both kinds of body were exercised, and many valid ones took the prescan. */
    if (ok < 5000 || fast < 3000 || refused < 5000) fail_msg("ok %d, through the prescan %d, refused %d", ok, fast, refused);
}

/* A large tensor: the values outgrow the prescan's local room and the body
 * its stack copy; the result matches cJSON's, value for value. */
static void test_prescan_large_tensor(void **state) {
    size_t cap = 200000, n = 0;
    char *body = malloc(cap);
    n += (size_t)snprintf(body, cap, "{\"inputs\":[{\"name\":\"x\",\"shape\":[5000],\"datatype\":\"FP64\",\"data\":[");
    for (int i = 0; i < 5000; i++)
        n += (size_t)snprintf(body + n, cap - n, "%s%.17g", i ? "," : "", (double)(float)i / 3.0f - 50);
    n += (size_t)snprintf(body + n, cap - n, "]}]}");
    struct kserve_request a, b;
    assert_int_equal(kserve_request_parse(&a, body, n, -1, g_err, sizeof g_err), 0);
    assert_int_equal(parse_body(&b, body, n, -1, 0, g_err, sizeof g_err), 0);
    assert_same_request(&a, &b, "(5000 FP64 values)");
    assert_true(((double *)a.inputs[0].t.data)[4999] == 4999.0 / 3.0 - 50);
    kserve_request_clear(&a);
    kserve_request_clear(&b);
    free(body);
}

/* A long mantissa whose scale cancels part of a long exponent: the prescan
 * reads the value strtod (and so cJSON) gives, here infinity (refused for
 * FP32) and zero (accepted for FP64), not 1 from a capped exponent. */
static void test_prescan_long_mantissa_long_exponent(void **state) {
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
        struct kserve_request a, b;
        char ea[512] = "", eb[512] = "";
        int ra = kserve_request_parse(&a, body, n, -1, ea, sizeof ea);
        int rb = parse_body(&b, body, n, -1, 0, eb, sizeof eb);
        assert_int_equal(rb, cases[c].rc);
        assert_string_equal(eb, cases[c].err);
        assert_int_equal(ra, rb);
        assert_string_equal(ea, eb);
        if (ra == 0) {
            assert_same_request(&a, &b, cases[c].dt);
            assert_true(((double *)a.inputs[0].t.data)[1] == 0);
            kserve_request_clear(&a);
            kserve_request_clear(&b);
        }
    }
    free(body);
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
    /* The same body read by cJSON whole would pass the bound. */
    assert_int_equal(parse_body(&r, body, len, -1, 0, g_err, sizeof g_err), STATUS_INVALID);
    assert_non_null(strstr(g_err, "--max-request-memory"));
    free(body);
    body = repeat_body("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[%s]}]}", "{}", 100000, &len);
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
    kserve_global_init(); /* the request memory bound sees the parse tree through its hooks */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_json_nested_and_flat),
        cmocka_unit_test(test_parse_binary_and_bytes),
        cmocka_unit_test(test_parse_json_nul_bytes),
        cmocka_unit_test(test_json_may_hold_nul),
        cmocka_unit_test(test_parse_errors_name_the_field),
        cmocka_unit_test(test_parse_beyond_inline_room),
        cmocka_unit_test(test_bind),
        cmocka_unit_test(test_encode_spliced_same_bytes),
        cmocka_unit_test(test_bind_batch_and_dim_bounds),
        cmocka_unit_test(test_encode_json_binary_classification),
        cmocka_unit_test(test_prescan_matches_cjson),
        cmocka_unit_test(test_prescan_large_tensor),
        cmocka_unit_test(test_prescan_long_mantissa_long_exponent),
        cmocka_unit_test(test_encode_floats_round_trip),
        cmocka_unit_test(test_request_memory_bound),
        cmocka_unit_test(test_json_string_replaces_bad_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
