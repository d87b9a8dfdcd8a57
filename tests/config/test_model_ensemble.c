/* test_model_ensemble.c - ensemble_scheduling parsing (config/model_ensemble.c):
 * the steps and their maps, the data-flow checks that need no other model
 * (each tensor produced once, read only once produced, no cycle, outputs
 * produced) with messages that name the step and the tensor, protobuf's
 * JSON names, and the JSON form read back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/status.h"
#include "config/model_config.h"

static char g_err[512];

#define IO "\"max_batch_size\": 4, \"input\": [{\"name\": \"IN\", \"data_type\": \"TYPE_FP32\", \"dims\": [4]}], " \
           "\"output\": [{\"name\": \"OUT\", \"data_type\": \"TYPE_FP32\", \"dims\": [4]}]"

static int parse(struct model_config *c, const char *json) {
    model_config_init(c, "e");
    g_err[0] = 0;
    return model_config_parse(c, json, strlen(json), g_err, sizeof g_err);
}

static void test_two_steps(void **state) {
    struct model_config c;
    const char *j = "{\"platform\": \"ensemble\", " IO ", \"ensemble_scheduling\": {\"max_inflight_requests\": 3, "
                    "\"step\": [{\"model_name\": \"a\", \"input_map\": {\"x\": \"IN\"}, \"output_map\": {\"y\": \"t\"}}, "
                    "{\"model_name\": \"b\", \"model_version\": \"2\", \"input_map\": {\"x\": \"t\"}, "
                    "\"output_map\": {\"y\": \"OUT\"}}]}}";
    assert_int_equal(parse(&c, j), 0);
    assert_true(c.ensemble);
    assert_string_equal(c.platform, "ensemble");
    assert_int_equal(c.nsteps, 2);
    assert_int_equal(c.max_inflight_requests, 3);
    assert_int_equal(c.steps[0].model_version, -1);
    assert_int_equal(c.steps[1].model_version, 2);
    assert_string_equal(c.steps[1].input_map[0].key, "x");
    assert_string_equal(c.steps[1].input_map[0].value, "t");
    /* The JSON form reads back as the same configuration. */
    cJSON *o = model_config_to_json(&c);
    assert_null(cJSON_GetObjectItem(o, "backend"));
    char *text = cJSON_PrintUnformatted(o);
    struct model_config d;
    assert_int_equal(parse(&d, text), 0);
    assert_int_equal(d.nsteps, 2);
    assert_string_equal(d.steps[1].output_map[0].value, "OUT");
    free(text);
    cJSON_Delete(o);
    model_config_clear(&d);
    model_config_clear(&c);
}

static void test_camel_case(void **state) {
    struct model_config c;
    const char *j = "{\"platform\": \"ensemble\", " IO ", \"ensembleScheduling\": {\"step\": [{\"modelName\": \"a\", "
                    "\"modelVersion\": \"-1\", \"inputMap\": {\"x\": \"IN\"}, \"outputMap\": {\"y\": \"OUT\"}}]}}";
    assert_int_equal(parse(&c, j), 0);
    assert_int_equal(c.nsteps, 1);
    assert_string_equal(c.steps[0].model_name, "a");
    model_config_clear(&c);
}

struct refusal {
    const char *steps;
    const char *words[3];
};

static void test_refusals_name_step_and_tensor(void **state) {
    static const struct refusal cases[] = {
        /* A cycle between steps 0 and 1. */
        {"{\"model_name\": \"a\", \"input_map\": {\"x\": \"v\"}, \"output_map\": {\"y\": \"u\"}}, "
         "{\"model_name\": \"b\", \"input_map\": {\"x\": \"u\"}, \"output_map\": {\"y\": \"v\"}}, "
         "{\"model_name\": \"c\", \"input_map\": {\"x\": \"IN\"}, \"output_map\": {\"y\": \"OUT\"}}",
         {"cycle", "step 0 (model 'a')", "'v'"}},
        /* A tensor nobody produces. */
        {"{\"model_name\": \"a\", \"input_map\": {\"x\": \"nowhere\"}, \"output_map\": {\"y\": \"OUT\"}}",
         {"step 0 (model 'a')", "'nowhere'", "input 'x'"}},
        /* Produced twice. */
        {"{\"model_name\": \"a\", \"input_map\": {\"x\": \"IN\"}, \"output_map\": {\"y\": \"OUT\"}}, "
         "{\"model_name\": \"b\", \"input_map\": {\"x\": \"IN\"}, \"output_map\": {\"y\": \"OUT\"}}",
         {"'OUT'", "step 0 (model 'a')", "step 1 (model 'b')"}},
        /* An ensemble input produced again. */
        {"{\"model_name\": \"a\", \"input_map\": {\"x\": \"IN\"}, \"output_map\": {\"y\": \"IN\"}}",
         {"step 0", "'IN'", "ensemble input"}},
        /* The output produced by no step. */
        {"{\"model_name\": \"a\", \"input_map\": {\"x\": \"IN\"}, \"output_map\": {\"y\": \"other\"}}",
         {"output 'OUT'", "no step", NULL}},
        /* The ensemble as its own step. */
        {"{\"model_name\": \"e\", \"input_map\": {\"x\": \"IN\"}, \"output_map\": {\"y\": \"OUT\"}}",
         {"step 0", "cycle", NULL}},
        /* No output_map. */
        {"{\"model_name\": \"a\", \"input_map\": {\"x\": \"IN\"}}", {"step 0 (model 'a')", "output_map", NULL}},
        /* A tensor nothing reads. */
        {"{\"model_name\": \"a\", \"input_map\": {\"x\": \"IN\"}, \"output_map\": {\"y\": \"OUT\", \"z\": \"spare\"}}",
         {"'spare'", "step 0 (model 'a')", "unused"}},
        /* No input_map. */
        {"{\"model_name\": \"a\", \"output_map\": {\"y\": \"OUT\"}}", {"step 0 (model 'a')", "input_map", NULL}},
        {"{\"model_name\": \"a\", \"model_version\": 0, \"input_map\": {\"x\": \"IN\"}, \"output_map\": {\"y\": \"OUT\"}}",
         {"step[0].model_version", NULL, NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char j[2048];
        snprintf(j, sizeof j, "{\"platform\": \"ensemble\", " IO ", \"ensemble_scheduling\": {\"step\": [%s]}}",
                 cases[i].steps);
        struct model_config c;
        assert_int_equal(parse(&c, j), STATUS_INVALID);
        for (int w = 0; w < 3 && cases[i].words[w]; w++)
            if (!strstr(g_err, cases[i].words[w])) fail_msg("case %zu: '%s' not in: %s", i, cases[i].words[w], g_err);
        model_config_clear(&c);
    }
}

static void test_platform_and_field_agree(void **state) {
    struct model_config c;
    /* An ensemble without steps, steps without the platform, a backend. */
    assert_int_equal(parse(&c, "{\"platform\": \"ensemble\", " IO "}"), STATUS_INVALID);
    assert_non_null(strstr(g_err, "ensemble_scheduling"));
    model_config_clear(&c);
    assert_int_equal(parse(&c, "{" IO ", \"ensemble_scheduling\": {\"step\": [{\"model_name\": \"a\"}]}}"), STATUS_INVALID);
    assert_non_null(strstr(g_err, "needs platform"));
    model_config_clear(&c);
    assert_int_equal(parse(&c, "{\"platform\": \"ensemble\", \"backend\": \"onnxruntime\", " IO "}"), STATUS_INVALID);
    assert_non_null(strstr(g_err, "backend"));
    model_config_clear(&c);
    /* Inputs without dims: an ensemble has no file to complete them from. */
    assert_int_equal(parse(&c, "{\"platform\": \"ensemble\", \"input\": [{\"name\": \"IN\", \"data_type\": \"TYPE_FP32\"}], "
                               "\"output\": [{\"name\": \"OUT\", \"data_type\": \"TYPE_FP32\", \"dims\": [1]}], "
                               "\"ensemble_scheduling\": {\"step\": [{\"model_name\": \"a\", \"input_map\": {\"x\": \"IN\"}, "
                               "\"output_map\": {\"y\": \"OUT\"}}]}}"), STATUS_INVALID);
    assert_non_null(strstr(g_err, "input 'IN' needs data_type and dims"));
    model_config_clear(&c);
    /* What shapes instances: an ensemble has none. */
    assert_int_equal(parse(&c, "{\"platform\": \"ensemble\", " IO ", \"instance_group\": [{\"count\": 2}], "
                               "\"ensemble_scheduling\": {\"step\": [{\"model_name\": \"a\", \"input_map\": "
                               "{\"x\": \"IN\"}, \"output_map\": {\"y\": \"OUT\"}}]}}"), STATUS_INVALID);
    assert_non_null(strstr(g_err, "'instance_group' cannot be given for ensemble 'e'"));
    model_config_clear(&c);
    /* Namespaces are refused by the fates table. */
    assert_int_equal(parse(&c, "{\"platform\": \"ensemble\", " IO ", \"ensemble_scheduling\": {\"step\": [{\"model_name\": "
                               "\"a\", \"model_namespace\": \"ns\", \"input_map\": {\"x\": \"IN\"}, \"output_map\": "
                               "{\"y\": \"OUT\"}}]}}"), STATUS_INVALID);
    assert_non_null(strstr(g_err, "model_namespace"));
    model_config_clear(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_steps),
        cmocka_unit_test(test_camel_case),
        cmocka_unit_test(test_refusals_name_step_and_tensor),
        cmocka_unit_test(test_platform_and_field_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
