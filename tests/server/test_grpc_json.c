/* test_grpc_json.c - protobuf messages from Triton's JSON (server/grpc_json.c):
 * scalars, enums by name, repeated fields, nested messages, a oneof, a map,
 * 64-bit integers given as strings, members with no field skipped; each
 * message packed and unpacked again as a client would read it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/grpc_impl.h"
#include "triton/grpc_service.pb-c.h"

/* j's message of type d, packed and unpacked by protobuf-c. */
static ProtobufCMessage *round_trip(const ProtobufCMessageDescriptor *d, const char *json) {
    cJSON *j = cJSON_Parse(json);
    assert_non_null(j);
    struct grpc_pool pool = {0};
    ProtobufCMessage *m = grpc_json_message(d, j, &pool);
    assert_non_null(m);
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n + 1);
    protobuf_c_message_pack(m, buf);
    ProtobufCMessage *back = protobuf_c_message_unpack(d, NULL, n, buf);
    assert_non_null(back);
    free(buf);
    grpc_pool_free(&pool);
    cJSON_Delete(j);
    return back;
}

static void test_model_config(void **state) {
    Inference__ModelConfigResponse *r = (Inference__ModelConfigResponse *)round_trip(
        &inference__model_config_response__descriptor,
        "{\"config\": {\"name\": \"m\", \"platform\": \"onnxruntime_onnx\", \"max_batch_size\": 8,"
        " \"version_policy\": {\"specific\": {\"versions\": [1, 3]}},"
        " \"input\": [{\"name\": \"x\", \"data_type\": \"TYPE_FP32\", \"dims\": [4, -1]}],"
        " \"output\": [{\"name\": \"y\", \"data_type\": \"TYPE_STRING\", \"dims\": [2], \"label_filename\": \"l.txt\"}],"
        " \"dynamic_batching\": {\"preferred_batch_size\": [2, 4], \"max_queue_delay_microseconds\": 100},"
        " \"instance_group\": [{\"name\": \"m\", \"kind\": \"KIND_CPU\", \"count\": 2}],"
        " \"parameters\": {\"intra_op_thread_count\": {\"string_value\": \"4\"}},"
        " \"optimization\": {\"precision\": \"fp16\"}, \"no_such_field\": [1, 2], \"backend\": null}}");
    Inference__ModelConfig *c = r->config;
    assert_non_null(c);
    assert_string_equal(c->name, "m");
    assert_string_equal(c->platform, "onnxruntime_onnx");
    assert_int_equal(c->max_batch_size, 8);
    assert_int_equal(c->version_policy->policy_choice_case, INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_SPECIFIC);
    assert_int_equal(c->version_policy->specific->n_versions, 2);
    assert_int_equal(c->version_policy->specific->versions[1], 3);
    assert_int_equal(c->n_input, 1);
    assert_int_equal(c->input[0]->data_type, INFERENCE__DATA_TYPE__TYPE_FP32);
    assert_int_equal(c->input[0]->n_dims, 2);
    assert_int_equal(c->input[0]->dims[1], -1);
    assert_int_equal(c->output[0]->data_type, INFERENCE__DATA_TYPE__TYPE_STRING);
    assert_string_equal(c->output[0]->label_filename, "l.txt");
    assert_int_equal(c->dynamic_batching->n_preferred_batch_size, 2);
    assert_int_equal(c->dynamic_batching->max_queue_delay_microseconds, 100);
    assert_int_equal(c->instance_group[0]->kind, INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_CPU);
    assert_int_equal(c->instance_group[0]->count, 2);
    assert_int_equal(c->n_parameters, 1);
    assert_string_equal(c->parameters[0]->key, "intra_op_thread_count");
    assert_string_equal(c->parameters[0]->value->string_value, "4");
    assert_string_equal(c->backend, "");
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void test_statistics(void **state) {
    Inference__ModelStatisticsResponse *r = (Inference__ModelStatisticsResponse *)round_trip(
        &inference__model_statistics_response__descriptor,
        "{\"model_stats\": [{\"name\": \"m\", \"version\": \"2\", \"inference_count\": \"9007199254740993\","
        " \"execution_count\": 3, \"inference_stats\": {\"success\": {\"count\": 5, \"ns\": 1234567}},"
        " \"batch_stats\": [{\"batch_size\": 4, \"compute_infer\": {\"count\": 1, \"ns\": 10}}]}]}");
    assert_int_equal(r->n_model_stats, 1);
    Inference__ModelStatistics *s = r->model_stats[0];
    assert_string_equal(s->version, "2");
    assert_true(s->inference_count == 9007199254740993ull); /* past a double's integers: read as a string */
    assert_int_equal(s->execution_count, 3);
    assert_int_equal(s->inference_stats->success->count, 5);
    assert_int_equal(s->inference_stats->success->ns, 1234567);
    assert_null(s->inference_stats->fail);
    assert_int_equal(s->batch_stats[0]->batch_size, 4);
    assert_int_equal(s->batch_stats[0]->compute_infer->ns, 10);
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void test_not_an_object(void **state) {
    struct grpc_pool pool = {0};
    cJSON *j = cJSON_Parse("[1, 2]");
    assert_null(grpc_json_message(&inference__server_metadata_response__descriptor, j, &pool));
    cJSON_Delete(j);
    /* A member of message type that is not an object is skipped, not a crash. */
    j = cJSON_Parse("{\"config\": \"text\"}");
    Inference__ModelConfigResponse *r =
        (Inference__ModelConfigResponse *)grpc_json_message(&inference__model_config_response__descriptor, j, &pool);
    assert_non_null(r);
    assert_null(r->config);
    cJSON_Delete(j);
    grpc_pool_free(&pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_config),
        cmocka_unit_test(test_statistics),
        cmocka_unit_test(test_not_an_object),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
