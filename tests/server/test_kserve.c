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
    char **s = r.inputs[0].t.data;
    assert_string_equal(s[0], "hi");
    assert_string_equal(s[1], "");
    kserve_request_clear(&r);
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
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP16\",\"data\":[1]}]}", "FP16"},
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
    struct kserve_buf b = {0};
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
    kserve_buf_free(&b);
    kserve_request_clear(&r);
    model_config_clear(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_json_nested_and_flat),
        cmocka_unit_test(test_parse_binary_and_bytes),
        cmocka_unit_test(test_parse_errors_name_the_field),
        cmocka_unit_test(test_bind),
        cmocka_unit_test(test_encode_json_binary_classification),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
