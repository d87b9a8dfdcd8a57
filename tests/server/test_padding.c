/* test_padding.c - padded batching: buckets, which requests may share a
 * batch, the padded gather and the cut back, the configuration's proposal
 * and checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/model_io.h"
#include "common/status.h"
#include "config/model_config.h"
#include "server/padding.h"

static struct pad_spec spec(void) {
    struct pad_spec s;
    memset(&s, 0, sizeof s);
    s.nin = 2;
    s.in[0].input = 0;
    s.in[0].axis = 1;
    s.in[1].input = 1;
    s.in[1].axis = 1;
    s.in[1].value = -1;
    s.nout = 1;
    s.out[0].output = 0;
    s.out[0].axis = 1;
    s.buckets[0] = 8;
    s.buckets[1] = 16;
    s.buckets[2] = 32;
    s.nbuckets = 3;
    return s;
}

static void test_buckets(void **state) {
    (void)state;
    struct pad_spec s = spec();
    assert_int_equal(pad_bucket(&s, 1), 8);
    assert_int_equal(pad_bucket(&s, 8), 8);
    assert_int_equal(pad_bucket(&s, 9), 16);
    assert_int_equal(pad_bucket(&s, 32), 32);
    assert_int_equal(pad_bucket(&s, 33), 33); /* past the last: its own length */
    assert_int_equal(pad_bucket_index(&s, 9), 1);
    assert_int_equal(pad_bucket_index(&s, 40), 3);
}

static struct tensor t2(enum dtype dt, int64_t rows, int64_t len, void *data) {
    struct tensor t = {.dtype = dt, .ndim = 2, .dims = {rows, len}, .data = data};
    return t;
}

static void test_compatible(void **state) {
    (void)state;
    struct pad_spec s = spec();
    struct tensor a[3] = {t2(DT_INT64, 1, 9, NULL), t2(DT_INT64, 1, 9, NULL), t2(DT_FP32, 1, 4, NULL)};
    struct tensor b[3] = {t2(DT_INT64, 2, 16, NULL), t2(DT_INT64, 2, 16, NULL), t2(DT_FP32, 2, 4, NULL)};
    assert_true(pad_compatible(&s, a, b, 3));
    b[0].dims[1] = b[1].dims[1] = 17; /* the next bucket */
    assert_false(pad_compatible(&s, a, b, 3));
    b[0].dims[1] = b[1].dims[1] = 12;
    b[2].dims[1] = 5; /* an unpadded input must agree */
    assert_false(pad_compatible(&s, a, b, 3));
    b[2].dims[1] = 4;
    b[2].dtype = DT_FP64;
    assert_false(pad_compatible(&s, a, b, 3));
    /* Past the last bucket only equal lengths share. */
    b[2].dtype = DT_FP32;
    a[0].dims[1] = a[1].dims[1] = 40;
    b[0].dims[1] = b[1].dims[1] = 41;
    assert_false(pad_compatible(&s, a, b, 3));
    b[0].dims[1] = b[1].dims[1] = 40;
    assert_true(pad_compatible(&s, a, b, 3));
}

static void test_gather_and_cut(void **state) {
    (void)state;
    /* Two requests: 1 row of 3 and 2 rows of 5, padded to 8 with -1. */
    int64_t x[3] = {1, 2, 3}, y[10] = {10, 11, 12, 13, 14, 20, 21, 22, 23, 24};
    struct tensor a = t2(DT_INT64, 1, 3, x), b = t2(DT_INT64, 2, 5, y);
    const struct tensor *src[2] = {&a, &b};
    size_t need = pad_gather_size(src, 2, 1, 8);
    assert_int_equal(need, 3 * 8 * sizeof(int64_t));
    int64_t buf[24];
    struct tensor dst;
    assert_int_equal(pad_gather(&dst, buf, sizeof buf, src, 2, 1, 8, -1), 0);
    assert_int_equal(dst.dims[0], 3);
    assert_int_equal(dst.dims[1], 8);
    const int64_t want[24] = {1, 2, 3, -1, -1, -1, -1, -1, 10, 11, 12, 13, 14, -1, -1, -1,
                              20, 21, 22, 23, 24, -1, -1, -1};
    assert_memory_equal(buf, want, sizeof want);
    assert_int_equal(pad_gather(&dst, buf, sizeof buf - 1, src, 2, 1, 8, -1), STATUS_INVALID);
    /* An output [3, 8, 2] cut back: rows 1-2 to length 5. */
    float out[48];
    for (int i = 0; i < 48; i++) out[i] = (float)i;
    struct tensor o = {.dtype = DT_FP32, .ndim = 3, .dims = {3, 8, 2}, .data = out};
    struct tensor cut;
    assert_int_equal(pad_cut(&cut, &o, 1, 2, 1, 5), 0);
    assert_int_equal(cut.dims[0], 2);
    assert_int_equal(cut.dims[1], 5);
    assert_int_equal(cut.dims[2], 2);
    const float *c = cut.data;
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 10; k++) assert_true(c[r * 10 + k] == (float)(16 * (r + 1) + k));
    tensor_free_data(&cut);
    assert_int_equal(pad_cut(&cut, &o, 2, 2, 1, 5), STATUS_INVALID); /* rows out of range */
    assert_int_equal(pad_cut(&cut, &o, 0, 1, 1, 9), STATUS_INVALID); /* longer than the batch */
}

static void test_pad_value_types(void **state) {
    (void)state;
    float x[2] = {1, 2};
    struct tensor a = t2(DT_FP32, 1, 2, x);
    const struct tensor *src[1] = {&a};
    float buf[4];
    struct tensor dst;
    assert_int_equal(pad_gather(&dst, buf, sizeof buf, src, 1, 1, 4, 0.5), 0);
    assert_true(buf[2] == 0.5f && buf[3] == 0.5f);
    unsigned char m[2] = {1, 1}, mb[4];
    struct tensor bm = t2(DT_BOOL, 1, 2, m);
    src[0] = &bm;
    assert_int_equal(pad_gather(&dst, mb, sizeof mb, src, 1, 1, 4, 0), 0);
    assert_int_equal(mb[2], 0);
    assert_int_equal(mb[3], 0);
}

/* The configuration: a proposal from dim names, nothing padded unless asked,
 * and the checks of what a file says. */
static const struct model_io *bert_io(struct model_io *in, struct model_io *out) {
    const char *names[3] = {"input_ids", "attention_mask", "token_type_ids"};
    for (int i = 0; i < 3; i++) {
        in[i] = (struct model_io){.name = names[i], .dtype = DT_INT64, .ndim = 2, .dims = {-1, -1}};
        in[i].dim_param[0] = "batch";
        in[i].dim_param[1] = "sequence";
    }
    out[0] = (struct model_io){.name = "last_hidden_state", .dtype = DT_FP32, .ndim = 3, .dims = {-1, -1, 128}};
    out[0].dim_param[0] = "batch";
    out[0].dim_param[1] = "sequence";
    out[1] = (struct model_io){.name = "pooler_output", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 128}};
    out[1].dim_param[0] = "batch";
    return in;
}

static int load(struct model_config *c, const char *json, char *err, size_t n) {
    struct model_io in[3], out[2];
    bert_io(in, out);
    model_config_init(c, "bert");
    int rc = json ? model_config_parse(c, json, strlen(json), err, n) : 0;
    return rc ? rc : model_config_complete(c, in, 3, out, 2, err, n);
}

static void test_config_proposal(void **state) {
    (void)state;
    struct model_config c;
    char err[512] = "";
    assert_int_equal(load(&c, NULL, err, sizeof err), 0);
    assert_false(c.padding.enable);
    assert_int_equal(c.padding.ninputs, 3);
    assert_int_equal(c.padding.inputs[1].axis, 1);
    assert_int_equal(c.padding.noutputs, 1);
    assert_string_equal(c.padding.outputs[0].name, "last_hidden_state");
    assert_string_equal(c.padding.outputs[0].input, "input_ids");
    assert_int_equal(c.padding.nbuckets, 7); /* 8 .. 512 */
    struct pad_spec s;
    assert_int_equal(pad_spec_make(&s, &c, err, sizeof err), 0); /* not enabled */
    cJSON *j = model_config_to_json(&c);
    cJSON *sp = cJSON_GetObjectItem(j, "sequence_padding");
    assert_non_null(sp);
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(sp, "enable")));
    cJSON_Delete(j);
    model_config_clear(&c);

    assert_int_equal(load(&c, "{\"sequence_padding\": {\"enable\": true, \"buckets\": [16, 64]}}", err, sizeof err), 0);
    assert_int_equal(pad_spec_make(&s, &c, err, sizeof err), 1);
    assert_int_equal(s.nin, 3);
    assert_int_equal(s.nout, 1);
    assert_int_equal(s.out[0].output, 0);
    assert_int_equal(s.nbuckets, 2);
    model_config_clear(&c);
}

static void test_config_checks(void **state) {
    (void)state;
    static const struct {
        const char *json, *words;
    } bad[] = {
        {"{\"sequence_padding\": {\"enable\": true, \"inputs\": [{\"name\": \"nope\", \"axis\": 1}]}}", "no input 'nope'"},
        {"{\"sequence_padding\": {\"enable\": true, \"inputs\": [{\"name\": \"input_ids\", \"axis\": 0}]}}", "axis"},
        {"{\"sequence_padding\": {\"enable\": true, \"buckets\": [32, 16]}}", "increasing"},
        /* No batching, said as Triton reads it: dims with the first dim. */
        {"{\"output\": [{\"name\": \"pooler_output\", \"dims\": [-1, 128]}], \"sequence_padding\": {\"enable\": true}}",
         "must batch"},
        {"{\"sequence_padding\": {\"enable\": true, \"inputs\": [{\"name\": \"input_ids\", \"axis\": 1}], "
         "\"outputs\": [{\"name\": \"last_hidden_state\", \"axis\": 1, \"input\": \"attention_mask\", \"input_axis\": 1}]}}",
         "not a padded axis"},
        {"{\"sequence_padding\": {\"enable\": true, \"inputs\": [{\"name\": \"input_ids\", \"axis\": 1}], "
         "\"outputs\": [{\"name\": \"pooler_output\", \"axis\": 2, \"input\": \"input_ids\", \"input_axis\": 1}]}}",
         "has no axis 2"},
        {"{\"sequence_padding\": {\"enable\": \"yes\"}}", "enable"},
        {"{\"sequence_padding\": []}", "must be an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct model_config c;
        char err[512] = "";
        assert_int_equal(load(&c, bad[i].json, err, sizeof err), STATUS_INVALID);
        if (!strstr(err, bad[i].words)) fail_msg("case %zu: '%s' lacks '%s'", i, err, bad[i].words);
        model_config_clear(&c);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets),          cmocka_unit_test(test_compatible),
        cmocka_unit_test(test_gather_and_cut),   cmocka_unit_test(test_pad_value_types),
        cmocka_unit_test(test_config_proposal),  cmocka_unit_test(test_config_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
