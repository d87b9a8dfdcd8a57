/* test_pbtxt.c - config.pbtxt: the protobuf text reader (every field kind,
 * both list syntaxes, comments, enums, maps, errors with line:column), its
 * equivalence with config.json, a model folder's file, and the fate of
 * every ModelConfig field (the table covers the descriptors). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/status.h"
#include "config/model_config.h"
#include "config/model_fields.h"
#include "config/pbtxt.h"
#include "triton/model_config.pb-c.h"

static char g_err[512];

/* The text as ModelConfig JSON, printed compactly; NULL on error (g_err). */
static char *to_json(const char *text) {
    cJSON *o = NULL;
    g_err[0] = 0;
    if (pbtxt_parse(model_fields_descriptor(), text, strlen(text), "config.pbtxt", &o, g_err, sizeof g_err)) return NULL;
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void expect_json(const char *text, const char *json) {
    char *s = to_json(text);
    if (!s) fail_msg("%s", g_err);
    assert_string_equal(s, json);
    free(s);
}

/* The text fails; the error holds each of the words. */
static void expect_error(const char *text, ...) {
    char *s = to_json(text);
    if (s) fail_msg("parsed: %s", s);
    va_list ap;
    va_start(ap, text);
    for (const char *w; (w = va_arg(ap, const char *));)
        if (!strstr(g_err, w)) fail_msg("'%s' not in: %s", w, g_err);
    va_end(ap);
}

static void test_scalars(void **state) {
    expect_json("name: \"m\" max_batch_size: 8 platform: 'onnxruntime_onnx'",
                "{\"name\":\"m\",\"max_batch_size\":8,\"platform\":\"onnxruntime_onnx\"}");
    /* int64 dims, negative and hex; uint64; bool spellings; adjacent strings. */
    expect_json("input { name: \"a\" \"b\" dims: [ -1, 0x10, 3 ] optional: true is_shape_tensor: f }",
                "{\"input\":[{\"name\":\"ab\",\"dims\":[-1,16,3],\"optional\":true,\"is_shape_tensor\":false}]}");
    expect_json("dynamic_batching { max_queue_delay_microseconds: 18446744073709551615 preserve_ordering: True }",
                "{\"dynamic_batching\":{\"max_queue_delay_microseconds\":\"18446744073709551615\","
                "\"preserve_ordering\":true}}");
    /* floats (a repeated float, with the f suffix and an exponent). */
    expect_json("model_metrics { metric_control { histogram_options { buckets: [0.5, 1e1, 2.5f, 3] } } }",
                "{\"model_metrics\":{\"metric_control\":[{\"histogram_options\":{\"buckets\":[0.5,10,2.5,3]}}]}}");
    /* Escapes: \n \t \" \\ \' \x41 \101 \u00e9. */
    expect_json("name: \"a\\n\\t\\\"\\\\\\'\\x41\\101\\u00e9\"", "{\"name\":\"a\\n\\t\\\"\\\\'AA\xc3\xa9\"}");
}

static void test_enums(void **state) {
    expect_json("input { name: \"x\" data_type: TYPE_FP32 format: FORMAT_NCHW }",
                "{\"input\":[{\"name\":\"x\",\"data_type\":\"TYPE_FP32\",\"format\":\"FORMAT_NCHW\"}]}");
    /* By number: TYPE_INT64 is 9. */
    expect_json("output { name: \"y\" data_type: 9 }", "{\"output\":[{\"name\":\"y\",\"data_type\":\"TYPE_INT64\"}]}");
    expect_error("input { name: \"x\"\n  data_type: TYPE_FLOAT }", "config.pbtxt:2:14", "input.data_type",
                 "'TYPE_FLOAT' is not a value of DataType", "TYPE_FP32", NULL);
    expect_error("output { data_type: 99 }", "'99' is not a value of DataType", NULL);
}

static void test_lists_and_messages(void **state) {
    const char *json = "{\"input\":[{\"name\":\"a\",\"dims\":[1,2]},{\"name\":\"b\",\"dims\":[3]}],"
                       "\"dynamic_batching\":{\"preferred_batch_size\":[2,4]}}";
    /* Repeated lines, and the list forms; the colon before a message is optional. */
    expect_json("input { name: \"a\" dims: 1 dims: 2 }\ninput: { name: \"b\" dims: 3 }\n"
                "dynamic_batching { preferred_batch_size: 2 preferred_batch_size: 4 }", json);
    expect_json("input [ { name: \"a\" dims: [1, 2] }, { name: \"b\", dims: [3] } ]\n"
                "dynamic_batching: { preferred_batch_size: [ 2, 4 ] }", json);
    expect_json("input: [ < name: \"a\"; dims: [1,2] >, {name:\"b\" dims:[3]} ] dynamic_batching < preferred_batch_size: [2, 4] >",
                json);
    /* An empty list still says the field is there. */
    expect_json("instance_group [ ] input { dims: [] }", "{\"instance_group\":[],\"input\":[{\"dims\":[]}]}");
    expect_json("version_policy { specific { versions: [1, 3] } }",
                "{\"version_policy\":{\"specific\":{\"versions\":[1,3]}}}");
}

static void test_comments(void **state) {
    expect_json("# a Triton config\nname: \"m\"  # trailing\n#max_batch_size: 4\n  # indented\nmax_batch_size: 2 # end",
                "{\"name\":\"m\",\"max_batch_size\":2}");
    expect_json("name: \"a # not a comment\"", "{\"name\":\"a # not a comment\"}");
    expect_json("", "{}");
}

static void test_maps(void **state) {
    expect_json("parameters { key: \"intra_op_thread_count\" value: { string_value: \"2\" } }\n"
                "parameters [ { key: \"b\" value { string_value: \"y\" } } ]\n"
                "parameters { key: \"b\" value { string_value: \"z\" } }", /* a later key replaces an earlier */
                "{\"parameters\":{\"intra_op_thread_count\":{\"string_value\":\"2\"},\"b\":{\"string_value\":\"z\"}}}");
    /* A map of strings, and one keyed by an integer (priority_queue_policy: uint64). */
    expect_json("metric_tags { key: \"team\" value: \"a\" } metric_tags { key: \"x\" }",
                "{\"metric_tags\":{\"team\":\"a\",\"x\":\"\"}}");
    expect_json("dynamic_batching { priority_queue_policy { key: 2 value { max_queue_size: 5 } } }",
                "{\"dynamic_batching\":{\"priority_queue_policy\":{\"2\":{\"max_queue_size\":5}}}}");
    expect_json("model_warmup { name: \"w\" batch_size: 2 inputs { key: \"x\" value { data_type: TYPE_FP32 dims: 4 "
                "zero_data: true } } }",
                "{\"model_warmup\":[{\"name\":\"w\",\"batch_size\":2,\"inputs\":{\"x\":{\"data_type\":\"TYPE_FP32\","
                "\"dims\":[4],\"zero_data\":true}}}]}");
    expect_error("parameters { key: \"a\" value { int_value: 3 } }", "parameters.value", "ModelParameter has no field 'int_value'",
                 NULL);
}

static void test_errors_name_line_column_and_field(void **state) {
    expect_error("name: \"m\"\nmax_batch_sise: 8", "config.pbtxt:2:1", "unknown field 'max_batch_sise'", NULL);
    expect_error("max_batch_size: 8x", "config.pbtxt:1:17", "field 'max_batch_size'", "expected a 32-bit integer", NULL);
    expect_error("max_batch_size: 4294967296", "max_batch_size", "32-bit", NULL);
    expect_error("max_batch_size 8", "1:16", "expected ':' after the field name", NULL);
    expect_error("dynamic_batching {\n  max_queue_delay_microseconds: -5\n}", "config.pbtxt:2:33",
                 "dynamic_batching.max_queue_delay_microseconds", "unsigned 64-bit", NULL);
    expect_error("input {\n  name: \"x\"\n", "config.pbtxt:3:1", "expected '}' to close the message", NULL);
    expect_error("name: \"m\nx\"", "1:7", "no closing", NULL);
    expect_error("name: \"a\\qb\"", "1:7", "unknown escape", NULL);
    expect_error("name: \"a\\000b\"", "NUL", NULL);
    expect_error("name: \"a\" name: \"b\"", "1:11", "field 'name'", "given twice", NULL);
    expect_error("max_batch_size: [1, 2]", "not repeated", NULL);
    expect_error("version_policy { latest { } all { } }", "1:29", "version_policy.all", "'latest' is already given",
                 NULL);
    expect_error("dynamic_batching { } sequence_batching { }", "sequence_batching", "'dynamic_batching'", NULL);
    expect_error("input [ { name: \"a\" } { name: \"b\" } ]", "1:23", "expected ',' or ']'", NULL);
    expect_error("name: foo", "1:7", "expected a quoted string, got 'foo'", NULL);
    expect_error("response_cache { enable: yes }", "response_cache.enable", "true or false", NULL);
    expect_error("[ext.field]: 1", "not supported", NULL);
    expect_error("name: \"m\" }", "1:11", "expected a field name", NULL);
    expect_error("name: \"m\" @", "1:11", "unexpected character '@'", NULL);
    expect_error("input { name: \"x\" dims: [1, nan] }", "input.dims", "64-bit integer", NULL);
    expect_error("model_metrics { metric_control { histogram_options { buckets: inf } } }", "finite", NULL);
    expect_error("optimization { graph { level: 1 } cuda { graphs: 1 busy_wait_events: 2 } }",
                 "optimization.cuda.busy_wait_events", "true or false", NULL);
}

/* ---- equivalence with config.json --------------------------------------- */

static char *config_json(const char *json) {
    struct model_config c;
    model_config_init(&c, "m");
    if (model_config_parse(&c, json, strlen(json), g_err, sizeof g_err)) fail_msg("%s", g_err);
    cJSON *o = model_config_to_json(&c);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    model_config_clear(&c);
    return s;
}

static void test_same_config_as_json(void **state) {
    const char *pbtxt =
        "name: \"m\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 8\n"
        "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
        "output { name: \"probs\" data_type: TYPE_FP32 dims: 3 label_filename: \"labels.txt\" }\n"
        "version_policy: { specific: { versions: [1, 2] } }\n"
        "dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 500\n"
        "  default_queue_policy { timeout_action: DELAY max_queue_size: 16 } }\n"
        "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
        "response_cache { enable: true }\n"
        "parameters { key: \"intra_op_thread_count\" value: { string_value: \"2\" } }\n";
    const char *json =
        "{\"name\": \"m\", \"platform\": \"onnxruntime_onnx\", \"max_batch_size\": 8,"
        " \"input\": [{\"name\": \"x\", \"data_type\": \"TYPE_FP32\", \"dims\": [4]}],"
        " \"output\": [{\"name\": \"probs\", \"data_type\": \"TYPE_FP32\", \"dims\": [3], \"label_filename\": \"labels.txt\"}],"
        " \"version_policy\": {\"specific\": {\"versions\": [1, 2]}},"
        " \"dynamic_batching\": {\"preferred_batch_size\": [4, 8], \"max_queue_delay_microseconds\": 500,"
        "   \"default_queue_policy\": {\"timeout_action\": \"DELAY\", \"max_queue_size\": 16}},"
        " \"instance_group\": [{\"count\": 2, \"kind\": \"KIND_CPU\"}], \"response_cache\": {\"enable\": true},"
        " \"parameters\": {\"intra_op_thread_count\": {\"string_value\": \"2\"}}}";
    char *from_text = to_json(pbtxt);
    if (!from_text) fail_msg("%s", g_err);
    char *a = config_json(from_text), *b = config_json(json);
    assert_string_equal(a, b);
    assert_non_null(strstr(a, "\"max_batch_size\":8"));
    assert_non_null(strstr(a, "\"count\":2"));
    assert_non_null(strstr(a, "\"max_queue_delay_microseconds\":500"));
    free(a);
    free(b);
    free(from_text);
}

/* ---- a model folder's file ------------------------------------------------ */

static void put(const char *dir, const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_model_folder(void **state) {
    char dir[] = "/tmp/kiln_test_pbtxt_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *json = NULL;
    size_t len = 0;
    const char *file = NULL;
    assert_int_equal(model_config_read_file(dir, &json, &len, &file, g_err, sizeof g_err), STATUS_NOT_FOUND);
    put(dir, "config.pbtxt", "# Triton's\nmax_batch_size: 4\ninstance_group { count: 2 }\n");
    assert_int_equal(model_config_read_file(dir, &json, &len, &file, g_err, sizeof g_err), 0);
    assert_string_equal(file, "config.pbtxt");
    assert_string_equal(json, "{\"max_batch_size\":4,\"instance_group\":[{\"count\":2}]}");
    assert_int_equal(len, strlen(json));
    free(json);
    put(dir, "config.json", "{}");
    assert_int_equal(model_config_read_file(dir, &json, &len, &file, g_err, sizeof g_err), STATUS_INVALID);
    assert_non_null(strstr(g_err, "config.json"));
    assert_non_null(strstr(g_err, "config.pbtxt"));
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    put(dir, "config.pbtxt", "max_batch_size: 4\ninstance_group { count: two }\n");
    assert_int_equal(model_config_read_file(dir, &json, &len, &file, g_err, sizeof g_err), STATUS_INVALID);
    if (!strstr(g_err, "config.pbtxt:2:25: field 'instance_group.count'")) fail_msg("%s", g_err);
    snprintf(p, sizeof p, "%s/config.pbtxt", dir);
    unlink(p);
    rmdir(dir);
}

/* ---- every field's fate -------------------------------------------------- */

static int g_missing;

/* Every field under d has a fate; honoured messages are walked into (a map's
 * value fields follow the map's name), refused and warned ones cover theirs. */
static void walk_fates(const ProtobufCMessageDescriptor *d, const char *prefix, int depth) {
    assert_true(depth < 12);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        char path[300];
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", f->name);
        const struct model_field *e = model_field_find(path);
        if (!e) {
            print_error("ModelConfig field '%s' has no fate in config/model_fields.c\n", path);
            g_missing++;
            continue;
        }
        assert_false(e->flags & MODEL_FIELD_KILN);
        if (e->fate != MODEL_FIELD_HONOURED || f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
        const ProtobufCMessageDescriptor *sub = f->descriptor;
        if (pbtxt_is_map(f)) {
            const ProtobufCFieldDescriptor *v = &sub->fields[1];
            if (v->type != PROTOBUF_C_TYPE_MESSAGE) continue;
            sub = v->descriptor;
        }
        walk_fates(sub, path, depth + 1);
    }
}

static void test_every_field_has_a_fate(void **state) {
    g_missing = 0;
    walk_fates(model_fields_descriptor(), "", 0);
    assert_int_equal(g_missing, 0);
    /* And every entry is a field (or kiln's own): walk each path down the descriptors. */
    size_t n;
    const struct model_field *t = model_fields(&n);
    for (size_t i = 0; i < n; i++) {
        assert_non_null(t[i].why);
        if (t[i].fate != MODEL_FIELD_HONOURED) assert_true(strlen(t[i].why) > 0);
        if (t[i].flags & MODEL_FIELD_KILN) continue;
        char path[300], *save = NULL;
        snprintf(path, sizeof path, "%s", t[i].path);
        const ProtobufCMessageDescriptor *d = model_fields_descriptor();
        const ProtobufCFieldDescriptor *f = NULL;
        for (char *p = strtok_r(path, ".", &save); p; p = strtok_r(NULL, ".", &save)) {
            if (f) {
                assert_int_equal(f->type, PROTOBUF_C_TYPE_MESSAGE);
                d = f->descriptor;
                if (pbtxt_is_map(f)) d = d->fields[1].descriptor;
            }
            f = protobuf_c_message_descriptor_get_field_by_name(d, p);
            if (!f) fail_msg("table entry '%s' is not a ModelConfig field", t[i].path);
        }
    }
}

/* The docs' table lists every entry (docs/models.md, from the repository root). */
static void test_docs_list_every_field(void **state) {
    FILE *f = fopen("docs/models.md", "r");
    if (!f) skip();
    static char doc[1 << 18];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    doc[n] = 0;
    fclose(f);
    size_t nf;
    const struct model_field *t = model_fields(&nf);
    for (size_t i = 0; i < nf; i++) {
        char cell[320];
        snprintf(cell, sizeof cell, "| `%s` |", t[i].path);
        if (!strstr(doc, cell)) fail_msg("docs/models.md has no row for '%s'", t[i].path);
    }
}

static int check(const char *json, char **warnings) {
    cJSON *o = cJSON_Parse(json);
    assert_non_null(o);
    g_err[0] = 0;
    int rc = model_fields_check(o, warnings, g_err, sizeof g_err);
    cJSON_Delete(o);
    return rc;
}

static void test_fates_applied(void **state) {
    char *w = NULL;
    /* Honoured, kiln's own, and defaults that say nothing. */
    assert_int_equal(check("{\"max_batch_size\": 4, \"input\": [{\"name\": \"x\", \"format\": \"FORMAT_NONE\", "
                           "\"is_shape_tensor\": false}], \"optimization\": {\"precision\": \"fp16\"}, "
                           "\"default_model_filename\": \"model.onnx\", \"sequence_padding\": {\"enable\": false}}", &w), 0);
    assert_null(w);
    /* Refused, named. */
    assert_int_equal(check("{\"sequence_batching\": {\"iterative_sequence\": true}}", &w), STATUS_INVALID);
    assert_non_null(strstr(g_err, "config field 'sequence_batching.iterative_sequence' is not supported: kiln has no "
                                  "iterative sequences"));
    /* The sequence batcher's own fields are honoured, an empty section too. */
    assert_int_equal(check("{\"sequence_batching\": {}}", &w), 0);
    assert_int_equal(check("{\"sequence_batching\": {\"oldest\": {\"max_candidate_sequences\": 4}, \"state\": "
                           "[{\"input_name\": \"a\", \"output_name\": \"b\", \"initial_state\": [{\"zero_data\": "
                           "true}]}]}}", &w), 0);
    assert_int_equal(check("{\"input\": [{\"name\": \"x\", \"allow_ragged_batch\": true}]}", &w), STATUS_INVALID);
    assert_non_null(strstr(g_err, "'input.allow_ragged_batch'"));
    assert_int_equal(check("{\"default_model_filename\": \"model.plan\"}", &w), STATUS_INVALID);
    assert_int_equal(check("{\"model_transaction_policy\": {\"decoupled\": true}}", &w), STATUS_INVALID);
    assert_non_null(strstr(g_err, "'model_transaction_policy.decoupled'"));
    /* Several instance groups are Triton's too: their counts add up. */
    assert_int_equal(check("{\"instance_group\": [{\"count\": 1}, {\"count\": 2}]}", &w), 0);
    /* Unknown keys, a typo among them, are not dropped. */
    assert_int_equal(check("{\"max_batch_sise\": 4}", &w), STATUS_INVALID);
    assert_non_null(strstr(g_err, "'max_batch_sise' is not a field"));
    assert_int_equal(check("{\"dynamic_batching\": {\"max_queue_delay\": 4}}", &w), STATUS_INVALID);
    assert_non_null(strstr(g_err, "'dynamic_batching.max_queue_delay'"));
    /* Warned, one line each. */
    assert_int_equal(check("{\"optimization\": {\"execution_accelerators\": {}, \"priority\": \"PRIORITY_MAX\"}, "
                           "\"model_operations\": {\"op_library_filename\": [\"a.so\"]}, "
                           "\"parameters\": {\"intra_op_thread_count\": {\"string_value\": \"2\"}, \"x\": {}}}", &w), 0);
    assert_non_null(w);
    assert_string_equal(w, "config field 'optimization.execution_accelerators' is accepted but ignored: TensorRT/OpenVINO "
                           "accelerators; kiln runs its own kernels\n"
                           "config field 'optimization.priority' is accepted but ignored: instance thread priority; "
                           "kiln's instance threads share one priority\n"
                           "config field 'model_operations' is accepted but ignored: custom operator libraries are for "
                           "framework backends; kiln refuses unknown ops\n"
                           "config field 'parameters.x' is accepted but ignored: kiln reads no such key");
    free(w);
}

/* model_config_parse holds both formats to the table: the warnings land in
 * the config for the loader to log once. */
static void test_parse_keeps_warnings(void **state) {
    struct model_config c;
    model_config_init(&c, "m");
    const char *j = "{\"metric_tags\": {\"team\": \"a\"}, \"max_batch_size\": 2}";
    assert_int_equal(model_config_parse(&c, j, strlen(j), g_err, sizeof g_err), 0);
    assert_int_equal(c.max_batch_size, 2);
    assert_non_null(c.warnings);
    assert_non_null(strstr(c.warnings, "'metric_tags'"));
    const char *k = "{\"ensemble_scheduling\": {\"step\": []}}";
    assert_int_equal(model_config_parse(&c, k, strlen(k), g_err, sizeof g_err), STATUS_INVALID);
    assert_non_null(strstr(g_err, "'ensemble_scheduling' needs platform \"ensemble\""));
    model_config_clear(&c);
}

/* protobuf's JSON names (json_format.MessageToJson) mean the .proto's names. */
static void test_camel_case_json(void **state) {
    struct model_config c;
    model_config_init(&c, "m");
    const char *j = "{\"maxBatchSize\": 4, \"dynamicBatching\": {\"maxQueueDelayMicroseconds\": \"700\", "
                    "\"defaultQueuePolicy\": {\"maxQueueSize\": 3}}, \"instanceGroup\": [{\"count\": 2}], "
                    "\"parameters\": {\"intra_op_thread_count\": {\"stringValue\": \"2\"}}}";
    assert_int_equal(model_config_parse(&c, j, strlen(j), g_err, sizeof g_err), 0);
    assert_int_equal(c.max_batch_size, 4);
    assert_int_equal(c.max_queue_delay_us, 700);
    assert_int_equal(c.max_queue_size, 3);
    assert_int_equal(c.instance_count, 2);
    assert_int_equal(c.intra_op_threads, 2);
    assert_null(c.warnings);
    /* A map's keys are names, not fields: left as they are (and warned). */
    const char *k = "{\"parameters\": {\"intraOpThreadCount\": {\"stringValue\": \"2\"}}}";
    assert_int_equal(model_config_parse(&c, k, strlen(k), g_err, sizeof g_err), 0);
    assert_non_null(c.warnings);
    assert_non_null(strstr(c.warnings, "'parameters.intraOpThreadCount'"));
    model_config_clear(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_enums),
        cmocka_unit_test(test_lists_and_messages),
        cmocka_unit_test(test_comments),
        cmocka_unit_test(test_maps),
        cmocka_unit_test(test_errors_name_line_column_and_field),
        cmocka_unit_test(test_same_config_as_json),
        cmocka_unit_test(test_model_folder),
        cmocka_unit_test(test_every_field_has_a_fate),
        cmocka_unit_test(test_docs_list_every_field),
        cmocka_unit_test(test_fates_applied),
        cmocka_unit_test(test_parse_keeps_warnings),
        cmocka_unit_test(test_camel_case_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
