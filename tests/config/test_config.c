/* test_config.c - server configuration (flags, KILN_* environment, JSON file,
 * precedence) and model configuration (Triton JSON, auto-complete, version
 * policy, messages that name the field). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "common/status.h"
#include "config/model_config.h"
#include "config/server_config.h"
#include "models/model.h"

static char g_err[512];

static int load(struct server_config *c, int argc, char **argv) {
    server_config_init(c);
    g_err[0] = 0;
    return server_config_load(c, argc, argv, g_err, sizeof g_err);
}

static void test_defaults(void **state) {
    struct server_config c;
    char *argv[] = {"serve"};
    assert_int_equal(load(&c, 1, argv), 0);
    assert_int_equal(c.http_port, 8000);
    assert_string_equal(c.backend, "auto");
    assert_int_equal(c.max_request_size, 64 << 20);
    assert_int_equal(c.model_control_mode, SERVER_CONTROL_NONE);
    assert_null(c.control_token);
    server_config_clear(&c);
}

static void test_precedence(void **state) {
    char path[] = "/tmp/kiln_test_config_XXXXXX";
    int fd = mkstemp(path);
    const char *json = "{\"http_port\": 7000, \"http-threads\": 3, \"log_format\": \"json\", \"cache_size\": \"2M\","
                       " \"model_control_mode\": \"explicit\", \"http_address\": \"127.0.0.1\", \"load_model\": [\"a\", \"b\"], \"redis_url\": \"redis://r:6379\"}";
    assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    struct server_config c;
    char *argv[] = {"serve", "--config", path, "--http-port", "9000", "--load-model=c"};
    setenv("KILN_HTTP_PORT", "8500", 1);
    setenv("KILN_HTTP_THREADS", "5", 1);
    setenv("KILN_LOAD_MODEL", "x,y", 1);
    assert_int_equal(load(&c, 6, argv), 0);
    assert_int_equal(c.http_port, 9000);          /* flag > env > file */
    assert_int_equal(c.http_threads, 5);          /* env > file */
    assert_string_equal(c.log_format, "json");    /* file > default */
    assert_int_equal(c.cache_size, 2 << 20);
    assert_string_equal(c.redis_url, "redis://r:6379");
    assert_int_equal(c.nload_model, 1);           /* the flag's list replaces the others */
    assert_string_equal(c.load_model[0], "c");
    server_config_clear(&c);
    char *argv2[] = {"serve", "--config", path};
    assert_int_equal(load(&c, 3, argv2), 0);
    assert_int_equal(c.nload_model, 2);           /* env's list replaces the file's */
    assert_string_equal(c.load_model[1], "y");
    server_config_clear(&c);
    unsetenv("KILN_HTTP_PORT");
    unsetenv("KILN_HTTP_THREADS");
    unsetenv("KILN_LOAD_MODEL");
    unlink(path);
}

static void test_errors_name_the_source(void **state) {
    struct server_config c;
    char *a1[] = {"serve", "--http-port", "70000"};
    assert_int_equal(load(&c, 3, a1), STATUS_INVALID);
    assert_non_null(strstr(g_err, "--http-port"));
    server_config_clear(&c);
    char *a2[] = {"serve", "--bogus", "1"};
    assert_int_equal(load(&c, 3, a2), STATUS_INVALID);
    assert_non_null(strstr(g_err, "--bogus"));
    server_config_clear(&c);
    setenv("KILN_BACKEND", "tpu", 1);
    char *a3[] = {"serve"};
    assert_int_equal(load(&c, 1, a3), STATUS_INVALID);
    assert_non_null(strstr(g_err, "KILN_BACKEND"));
    unsetenv("KILN_BACKEND");
    server_config_clear(&c);
    char *a4[] = {"serve", "--config", "/nonexistent/kiln.json"};
    assert_int_equal(load(&c, 3, a4), STATUS_INVALID);
    assert_non_null(strstr(g_err, "/nonexistent/kiln.json"));
    server_config_clear(&c);
    /* A FIFO as --config is refused at once instead of blocking the start. */
    char fifo[] = "/tmp/kiln_test_config_fifo_XXXXXX";
    assert_non_null(mkdtemp(fifo));
    char fpath[64];
    snprintf(fpath, sizeof fpath, "%s/kiln.json", fifo);
    assert_int_equal(mkfifo(fpath, 0600), 0);
    char *a5[] = {"serve", "--config", fpath};
    alarm(10);
    assert_int_equal(load(&c, 3, a5), STATUS_INVALID);
    alarm(0);
    assert_non_null(strstr(g_err, "not a regular file"));
    server_config_clear(&c);
    unlink(fpath);
    rmdir(fifo);
}

/* Explicit or poll control off loopback needs a token or the operator's word;
 * an empty token never means "open". */
static void test_control_auth(void **state) {
    struct server_config c;
    char *open_any[] = {"serve", "--model-control-mode", "explicit"}; /* default address 0.0.0.0 */
    assert_int_equal(load(&c, 3, open_any), STATUS_INVALID);
    assert_non_null(strstr(g_err, "--control-token"));
    assert_non_null(strstr(g_err, "--allow-unauthenticated-control"));
    server_config_clear(&c);
    char *poll_any[] = {"serve", "--model-control-mode", "poll", "--http-address", "::"};
    assert_int_equal(load(&c, 5, poll_any), STATUS_INVALID);
    server_config_clear(&c);
    char *loop[] = {"serve", "--model-control-mode", "explicit", "--http-address", "127.0.0.1"};
    assert_int_equal(load(&c, 5, loop), 0);
    server_config_clear(&c);
    char *allowed[] = {"serve", "--model-control-mode", "explicit", "--allow-unauthenticated-control"};
    assert_int_equal(load(&c, 4, allowed), 0);
    assert_int_equal(c.allow_unauthenticated_control, 1);
    server_config_clear(&c);
    char *token[] = {"serve", "--model-control-mode", "explicit", "--control-token", "t"};
    assert_int_equal(load(&c, 5, token), 0);
    server_config_clear(&c);
    char *none[] = {"serve"};
    assert_int_equal(load(&c, 1, none), 0); /* no control API: nothing to protect */
    server_config_clear(&c);
    char *empty[] = {"serve", "--control-token="};
    assert_int_equal(load(&c, 2, empty), STATUS_INVALID);
    assert_non_null(strstr(g_err, "empty"));
    server_config_clear(&c);
    setenv("KILN_CONTROL_TOKEN", "", 1);
    assert_int_equal(load(&c, 1, none), STATUS_INVALID);
    assert_non_null(strstr(g_err, "KILN_CONTROL_TOKEN"));
    unsetenv("KILN_CONTROL_TOKEN");
    server_config_clear(&c);
    assert_true(server_config_is_loopback("127.0.0.1"));
    assert_true(server_config_is_loopback("127.1.2.3"));
    assert_true(server_config_is_loopback("::1"));
    assert_true(server_config_is_loopback("::ffff:127.0.0.1"));
    assert_true(server_config_is_loopback("localhost"));
    assert_false(server_config_is_loopback("0.0.0.0"));
    assert_false(server_config_is_loopback("::"));
    assert_false(server_config_is_loopback("10.0.0.1"));
    assert_false(server_config_is_loopback("example.com"));
}

/* An integer flag: its field, default, a value it takes (given as
 * "--flag=v" when eq, else as two words) and one it refuses, naming it. */
struct int_flag {
    const char *flag;
    size_t off;
    int def, set, eq;
    const char *bad;
};

static int int_field(const struct server_config *c, size_t off) { return *(const int *)((const char *)c + off); }

static void expect_int_flags(const struct int_flag *f, int n) {
    struct server_config c;
    char *none[] = {"serve"};
    assert_int_equal(load(&c, 1, none), 0);
    for (int i = 0; i < n; i++) assert_int_equal(int_field(&c, f[i].off), f[i].def);
    server_config_clear(&c);
    for (int i = 0; i < n; i++) {
        char v[64];
        if (f[i].eq) snprintf(v, sizeof v, "%s=%d", f[i].flag, f[i].set);
        else snprintf(v, sizeof v, "%d", f[i].set);
        char *set[] = {"serve", f[i].eq ? v : (char *)f[i].flag, v};
        assert_int_equal(load(&c, f[i].eq ? 2 : 3, set), 0);
        assert_int_equal(int_field(&c, f[i].off), f[i].set);
        server_config_clear(&c);
        char *bad[] = {"serve", (char *)f[i].flag, (char *)f[i].bad};
        assert_int_equal(load(&c, 3, bad), STATUS_INVALID);
        assert_non_null(strstr(g_err, f[i].flag + 2));
        server_config_clear(&c);
    }
}

static void test_model_bounds_flags(void **state) {
    /* 0 by default: resolved from the cores at start. */
    static const struct int_flag f[] = {
        {"--max-model-instances", offsetof(struct server_config, max_model_instances), 0, 3, 0, "0"},
        {"--max-intra-op-threads", offsetof(struct server_config, max_intra_op_threads), 0, 2, 1, "0"},
    };
    expect_int_flags(f, 2);
}

/* Leaving a fleet and the Redis tier: defaults, values, bounds named. */
static void test_fleet_flags(void **state) {
    static const struct int_flag f[] = {
        {"--shutdown-delay-secs", offsetof(struct server_config, shutdown_delay_secs), 5, 0, 0, "86400"},
        {"--redis-timeout-ms", offsetof(struct server_config, redis_timeout_ms), 50, 250, 1, "0"},
    };
    expect_int_flags(f, 2);
}

/* The gRPC message limit: --max-request-size's unless set (0 here means
 * "the same"), with size suffixes, from a flag or the environment. */
static void test_grpc_max_message_size(void **state) {
    struct server_config c;
    char *none[] = {"serve"};
    assert_int_equal(load(&c, 1, none), 0);
    assert_int_equal(c.grpc_max_message_size, 0);
    server_config_clear(&c);
    char *set[] = {"serve", "--grpc-max-message-size", "8M"};
    assert_int_equal(load(&c, 3, set), 0);
    assert_int_equal(c.grpc_max_message_size, 8 << 20);
    assert_int_equal(c.max_request_size, 64 << 20);
    server_config_clear(&c);
    setenv("KILN_GRPC_MAX_MESSAGE_SIZE", "100", 1);
    assert_int_equal(load(&c, 1, none), STATUS_INVALID);
    assert_non_null(strstr(g_err, "KILN_GRPC_MAX_MESSAGE_SIZE"));
    assert_non_null(strstr(g_err, "1024"));
    unsetenv("KILN_GRPC_MAX_MESSAGE_SIZE");
    server_config_clear(&c);
}

/* Client shared memory: off by default; the flag, KILN_ALLOW_CLIENT_SHM and
 * the JSON key turn it on; the bounds and the key prefix are checked. */
static void test_client_shm_flags(void **state) {
    struct server_config c;
    char *none[] = {"serve"};
    assert_int_equal(load(&c, 1, none), 0);
    assert_false(c.allow_client_shm);
    assert_null(c.shm_key_prefix);
    assert_int_equal(c.shm_max_regions, 0); /* 0: the registry's defaults */
    assert_int_equal(c.shm_max_bytes, 0);
    server_config_clear(&c);
    char *set[] = {"serve", "--allow-client-shm", "--shm-key-prefix", "/app_", "--shm-max-regions=10",
                   "--shm-max-regions-per-client", "3", "--shm-max-bytes", "2G"};
    assert_int_equal(load(&c, 9, set), 0);
    assert_true(c.allow_client_shm);
    assert_string_equal(c.shm_key_prefix, "/app_");
    assert_int_equal(c.shm_max_regions, 10);
    assert_int_equal(c.shm_max_regions_per_client, 3);
    assert_int_equal(c.shm_max_bytes, 2ll << 30);
    server_config_clear(&c);
    setenv("KILN_ALLOW_CLIENT_SHM", "true", 1);
    assert_int_equal(load(&c, 1, none), 0);
    assert_true(c.allow_client_shm);
    unsetenv("KILN_ALLOW_CLIENT_SHM");
    server_config_clear(&c);
    assert_int_equal(server_config_set(&c, "allow_client_shm", "1", "kiln.json", g_err, sizeof g_err), 0);
    assert_true(c.allow_client_shm);
    server_config_clear(&c);
    char *slash[] = {"serve", "--shm-key-prefix", "a/b"};
    assert_int_equal(load(&c, 3, slash), STATUS_INVALID);
    assert_non_null(strstr(g_err, "cannot hold '/' after the first byte"));
    server_config_clear(&c);
    char *zero[] = {"serve", "--shm-max-regions-per-client", "0"};
    assert_int_equal(load(&c, 3, zero), STATUS_INVALID);
    assert_non_null(strstr(g_err, "shm-max-regions-per-client"));
    server_config_clear(&c);
}

/* --max-request-memory: the machine's default (a quarter of RAM within
 * [64M, 4G]) unless set; at least 1M. */
static void test_max_request_memory(void **state) {
    struct server_config c;
    char *none[] = {"serve"};
    assert_int_equal(load(&c, 1, none), 0);
    assert_int_equal(c.max_request_memory, 0);
    int64_t d = server_config_max_request_memory(&c);
    assert_true(d >= (64LL << 20) && d <= (4LL << 30));
    server_config_clear(&c);
    char *set[] = {"serve", "--max-request-memory", "256M"};
    assert_int_equal(load(&c, 3, set), 0);
    assert_int_equal(server_config_max_request_memory(&c), 256LL << 20);
    server_config_clear(&c);
    setenv("KILN_MAX_REQUEST_MEMORY", "1000", 1);
    assert_int_equal(load(&c, 1, none), STATUS_INVALID);
    assert_non_null(strstr(g_err, "KILN_MAX_REQUEST_MEMORY"));
    assert_non_null(strstr(g_err, "at least 1M"));
    unsetenv("KILN_MAX_REQUEST_MEMORY");
    server_config_clear(&c);
}

/* c initialised (model "m") and json parsed into it, which must succeed. */
static void parse_ok(struct model_config *c, const char *json) {
    model_config_init(c, "m");
    assert_int_equal(model_config_parse(c, json, strlen(json), g_err, sizeof g_err), 0);
}

static void test_model_config_parse_and_json(void **state) {
    struct model_config c;
    model_config_init(&c, "m");
    const char *json = "{\"name\":\"m\",\"max_batch_size\":8,\"input\":[{\"name\":\"x\",\"data_type\":\"TYPE_FP32\","
                       "\"dims\":[4]}],\"dynamic_batching\":{\"preferred_batch_size\":[4,8],"
                       "\"max_queue_delay_microseconds\":100,\"default_queue_policy\":{\"max_queue_size\":5}},"
                       "\"instance_group\":[{\"count\":2,\"kind\":\"KIND_CPU\"}],"
                       "\"version_policy\":{\"specific\":{\"versions\":[1,3]}},\"response_cache\":{\"enable\":true}}";
    assert_int_equal(model_config_parse(&c, json, strlen(json), g_err, sizeof g_err), 0);
    assert_int_equal(c.max_batch_size, 8);
    assert_int_equal(c.npreferred, 2);
    assert_int_equal(c.max_queue_delay_us, 100);
    assert_int_equal(c.max_queue_size, 5);
    assert_int_equal(c.instance_count, 2);
    assert_true(c.response_cache);
    /* Every group's instances, as Triton runs them (count 1 by default). */
    struct model_config g;
    model_config_init(&g, "m");
    const char *groups = "{\"instance_group\":[{\"count\":2,\"kind\":\"KIND_CPU\"},{\"kind\":\"KIND_CPU\"}]}";
    assert_int_equal(model_config_parse(&g, groups, strlen(groups), g_err, sizeof g_err), 0);
    assert_int_equal(g.instance_count, 3);
    assert_string_equal(g.instance_kind, "KIND_CPU");
    model_config_clear(&g);
    int64_t present[] = {1, 2, 3};
    assert_true(model_config_version_wanted(&c, 1, present, 3));
    assert_false(model_config_version_wanted(&c, 2, present, 3));
    struct model_io ins[1] = {{.name = "x", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 4}}};
    struct model_io outs[1] = {{.name = "y", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 2}}};
    assert_int_equal(model_config_complete(&c, ins, 1, outs, 1, g_err, sizeof g_err), 0);
    assert_int_equal(c.noutputs, 1);
    assert_int_equal(c.outputs[0].ndim, 1);
    assert_int_equal(c.outputs[0].dims[0], 2);
    cJSON *j = model_config_to_json(&c);
    char *txt = cJSON_PrintUnformatted(j);
    assert_non_null(strstr(txt, "\"max_batch_size\":8"));
    assert_non_null(strstr(txt, "\"data_type\":\"TYPE_FP32\",\"dims\":[2]"));
    assert_non_null(strstr(txt, "\"kind\":\"KIND_CPU\",\"count\":2"));
    free(txt);
    cJSON_Delete(j);
    model_config_clear(&c);
}

static void test_model_config_autocomplete(void **state) {
    struct model_io ins[2] = {{.name = "a", .dtype = DT_INT64, .ndim = 2, .dims = {-1, 3}},
                              {.name = "b", .dtype = DT_FP32, .ndim = 1, .dims = {-1}}};
    struct model_io outs[1] = {{.name = "y", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 7}}};
    struct model_config c;
    model_config_init(&c, "m");
    assert_int_equal(model_config_complete(&c, ins, 2, outs, 1, g_err, sizeof g_err), 0);
    assert_int_equal(c.max_batch_size, MODEL_CONFIG_DEFAULT_MAX_BATCH);
    assert_true(c.dynamic_batching);
    assert_int_equal(c.inputs[1].ndim, 0);
    model_config_clear(&c);
    /* A fixed first dim: no batching, dims are the full shape. */
    ins[0].dims[0] = 2;
    model_config_init(&c, "m");
    assert_int_equal(model_config_complete(&c, ins, 2, outs, 1, g_err, sizeof g_err), 0);
    assert_int_equal(c.max_batch_size, 0);
    assert_int_equal(c.inputs[0].ndim, 2);
    model_config_clear(&c);
    /* The file's order is replaced by the model's. */
    ins[0].dims[0] = -1;
    model_config_init(&c, "m");
    const char *json = "{\"input\":[{\"name\":\"b\"},{\"name\":\"a\"}]}";
    assert_int_equal(model_config_parse(&c, json, strlen(json), g_err, sizeof g_err), 0);
    assert_int_equal(model_config_complete(&c, ins, 2, outs, 1, g_err, sizeof g_err), 0);
    assert_string_equal(c.inputs[0].name, "a");
    model_config_clear(&c);
}

static void test_model_config_errors(void **state) {
    struct model_io ins[1] = {{.name = "x", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 4}}};
    struct model_io outs[1] = {{.name = "y", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 2}}};
    static const struct { const char *json; const char *word; int at_complete; } cases[] = {
        {"{\"max_batch_size\":-1}", "max_batch_size", 0},
        {"{\"input\":[{\"name\":\"x\",\"data_type\":\"FLOAT\"}]}", "data_type", 0},
        {"{\"name\":\"other\"}", "'name'", 0},
        {"{\"platform\":\"tensorflow_savedmodel\"}", "platform", 0},
        {"{\"backend\":\"kiln\"}", "'backend' is 'kiln'", 0},
        {"{\"instance_group\":[{\"kind\":\"KIND_CPU\"},{\"count\":2,\"kind\":\"KIND_GPU\"}]}", "one kind", 0},
        {"{\"instance_group\":[{\"count\":1},{\"count\":\"x\"}]}", "instance_group[1].count", 0},
        {"{\"instance_group\":[{\"count\":200},{\"count\":100}]}", "300 instances", 0},
        {"{\"platform\":\"kiln_onnx\"}", "'platform' is 'kiln_onnx'", 0},
        {"{\"input\":[{\"name\":\"x\",\"reshape\":{\"shape\":[4]}}]}", "needs dims", 0},
        {"{\"input\":[{\"name\":\"x\",\"dims\":[4],\"reshape\":{\"shape\":[3]}}]}", "3 elements but dims 4", 0},
        {"{\"input\":[{\"name\":\"x\",\"dims\":[-1,-1],\"reshape\":{\"shape\":[-1]}}]}", "at most one -1", 0},
        {"{\"input\":[{\"name\":\"x\",\"dims\":[4],\"reshape\":[4]}]}", "input[0].reshape", 0},
        {"{\"input\":[{\"name\":\"x\",\"optional\":1}]}", "input[0].optional", 0},
        {"{\"max_batch_size\":4,\"input\":[{\"name\":\"x\",\"dims\":[4],\"reshape\":{\"shape\":[2,2]}}]}",
         "reshape.shape has 2 entries", 1},
        {"{\"input\":[{\"name\":\"x\",\"dims\":[4]}],\"output\":[{\"name\":\"y\",\"dims\":[-1,2]}]}",
         "give max_batch_size", 1},
        {"{\"version_policy\":{\"sometimes\":{}}}", "version_policy", 0},
        {"{\"instance_group\":[{\"count\":0}]}", "instance_group[0].count", 0},
        {"{\"dynamic_batching\":{\"preferred_batch_size\":[0]}}", "preferred_batch_size", 0},
        {"{\"input\":[{\"name\":\"z\"}]}", "'z'", 1},
        {"{\"input\":[{\"name\":\"x\",\"data_type\":\"TYPE_INT32\"}]}", "TYPE_INT32", 1},
        {"{\"input\":[{\"name\":\"x\",\"dims\":[5]}]}", "dims[0]", 1},
        {"{\"max_batch_size\":4,\"input\":[{\"name\":\"x\",\"dims\":[1,4]}]}", "dims has 2 entries", 1},
        {"{\"optimization\":[]}", "'optimization'", 0},
        {"{\"optimization\":{\"precision\":\"int8\"}}", "optimization.precision", 0},
        {"{\"optimization\":{\"precision\":16}}", "optimization.precision", 0},
        {"{\"optimization\":{\"cuda_graphs\":\"yes\"}}", "optimization.cuda_graphs", 0},
        {"{\"parameters\":[]}", "'parameters'", 0},
        {"{\"parameters\":{\"intra_op_thread_count\":\"2\"}}", "parameters.intra_op_thread_count", 0},
        {"{\"parameters\":{\"intra_op_thread_count\":{\"string_value\":\"two\"}}}", "parameters.intra_op_thread_count", 0},
        {"{\"parameters\":{\"intra_op_thread_count\":{\"string_value\":\"-1\"}}}", "parameters.intra_op_thread_count", 0},
        {"{\"parameters\":{\"intra_op_thread_count\":{\"string_value\":\"\"}}}", "parameters.intra_op_thread_count", 0},
        {"{\"backend\":\"python\"}", "'python'", 0},
        {"{\"backend\":\"tokenizer\",\"parameters\":{\"max_length\":{\"string_value\":\"0\"}}}", "parameters.max_length", 0},
        {"{\"backend\":\"tokenizer\",\"parameters\":{\"max_length\":\"8\"}}", "parameters.max_length", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct model_config c;
        model_config_init(&c, "m");
        g_err[0] = 0;
        int rc = model_config_parse(&c, cases[i].json, strlen(cases[i].json), g_err, sizeof g_err);
        if (cases[i].at_complete) {
            assert_int_equal(rc, 0);
            rc = model_config_complete(&c, ins, 1, outs, 1, g_err, sizeof g_err);
        }
        assert_int_equal(rc, STATUS_INVALID);
        if (!strstr(g_err, cases[i].word)) fail_msg("case %zu: '%s' does not mention %s", i, g_err, cases[i].word);
        model_config_clear(&c);
    }
}

/* max_batch_size absent or 0, as Triton's onnxruntime backend reads it:
 * the dims a file lists say whether they leave the batch dim out. */
static void test_model_config_batch_hint(void **state) {
    struct model_io ins[1] = {{.name = "x", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 4}}};
    struct model_io outs[1] = {{.name = "y", .dtype = DT_FP32, .ndim = 2, .dims = {-1, 2}}};
    static const struct { const char *json; int mbs; } cases[] = {
        {"{}", MODEL_CONFIG_DEFAULT_MAX_BATCH},
        {"{\"max_batch_size\":0}", MODEL_CONFIG_DEFAULT_MAX_BATCH},
        {"{\"input\":[{\"name\":\"x\"}],\"output\":[{\"name\":\"y\"}]}", MODEL_CONFIG_DEFAULT_MAX_BATCH},
        {"{\"input\":[{\"name\":\"x\",\"dims\":[4]}]}", MODEL_CONFIG_DEFAULT_MAX_BATCH},
        {"{\"input\":[{\"name\":\"x\",\"dims\":[-1,4]}],\"output\":[{\"name\":\"y\",\"dims\":[-1,2]}]}", 0},
        {"{\"max_batch_size\":0,\"output\":[{\"name\":\"y\",\"dims\":[-1,2]}]}", 0},
        {"{\"max_batch_size\":3}", 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct model_config c;
        model_config_init(&c, "m");
        assert_int_equal(model_config_parse(&c, cases[i].json, strlen(cases[i].json), g_err, sizeof g_err), 0);
        assert_int_equal(model_config_complete(&c, ins, 1, outs, 1, g_err, sizeof g_err), 0);
        if (c.max_batch_size != cases[i].mbs) fail_msg("case %zu: max_batch_size %d", i, c.max_batch_size);
        assert_int_equal(c.inputs[0].ndim, cases[i].mbs ? 1 : 2);
        model_config_clear(&c);
    }
}

/* reshape: dims are the clients', reshape.shape the model's; both printed
 * back, and what is printed parses to the same configuration. */
static void test_model_config_reshape(void **state) {
    struct model_io ins[1] = {{.name = "x", .dtype = DT_FP32, .ndim = 3, .dims = {-1, 2, 3}}};
    struct model_io outs[1] = {{.name = "y", .dtype = DT_FP32, .ndim = 1, .dims = {-1}}};
    const char *json = "{\"max_batch_size\":8,\"input\":[{\"name\":\"x\",\"dims\":[\"6\"],\"reshape\":{\"shape\":[2,-1]},"
                       "\"optional\":true}],\"output\":[{\"name\":\"y\",\"dims\":[1],\"reshape\":{}}]}";
    char *txt[2];
    for (int round = 0; round < 2; round++) {
        struct model_config c;
        model_config_init(&c, "m");
        assert_int_equal(model_config_parse(&c, round ? txt[0] : json, strlen(round ? txt[0] : json), g_err,
                                            sizeof g_err), 0);
        assert_int_equal(model_config_complete(&c, ins, 1, outs, 1, g_err, sizeof g_err), 0);
        assert_int_equal(c.inputs[0].ndim, 1);
        assert_int_equal(c.inputs[0].dims[0], 6);
        assert_int_equal(c.inputs[0].reshape_ndim, 2);
        assert_int_equal(c.inputs[0].reshape[1], -1); /* the model's 3 is not copied: it stays worked out */
        assert_true(c.inputs[0].optional);
        assert_int_equal(c.outputs[0].reshape_ndim, 0);
        cJSON *j = model_config_to_json(&c);
        txt[round] = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        model_config_clear(&c);
    }
    assert_string_equal(txt[0], txt[1]);
    assert_non_null(strstr(txt[0], "\"dims\":[6],\"reshape\":{\"shape\":[2,-1]},\"optional\":true"));
    assert_non_null(strstr(txt[0], "\"dims\":[1],\"reshape\":{\"shape\":[]}"));
    assert_non_null(strstr(txt[0], "\"backend\":\"onnxruntime\""));
    free(txt[0]);
    free(txt[1]);
    int64_t out[4];
    static const int64_t any_mid[] = {2, -1, 3};
    assert_int_equal(model_config_fit_shape(any_mid, 3, 24, out), 0);
    assert_int_equal(out[1], 4);
    assert_int_equal(model_config_fit_shape(any_mid, 3, 25, out), -1);
    assert_int_equal(model_config_fit_shape(any_mid, 2, 0, out), 0); /* 2 x 0 */
    assert_int_equal(out[1], 0);
    static const int64_t fixed[] = {2, 3};
    assert_int_equal(model_config_fit_shape(fixed, 2, 6, out), 0);
    assert_int_equal(model_config_fit_shape(fixed, 2, 7, out), -1);
    assert_int_equal(model_config_fit_shape(fixed, 0, 1, out), 0); /* a scalar per row */
    /* A view: [4, 6] -> [4, 2, 3] keeping the batch dim, [4, 1] -> [4]; a misfit leaves t as it was. */
    struct tensor t = {.dtype = DT_FP32, .ndim = 2, .dims = {4, 6}};
    assert_int_equal(model_config_reshape(&t, 1, fixed, 2), 0);
    assert_int_equal(t.ndim, 3);
    assert_true(t.dims[0] == 4 && t.dims[1] == 2 && t.dims[2] == 3);
    static const int64_t seven[] = {7};
    assert_int_equal(model_config_reshape(&t, 1, seven, 1), -1);
    assert_int_equal(t.ndim, 3);
    struct tensor col = {.dtype = DT_FP32, .ndim = 2, .dims = {4, 1}};
    assert_int_equal(model_config_reshape(&col, 1, fixed, 0), 0);
    assert_true(col.ndim == 1 && col.dims[0] == 4);
}

/* kiln's optimization object: defaults, values, the /config echo, and
 * Triton's own optimization keys left alone. */
static void test_model_config_optimization(void **state) {
    struct model_config c;
    model_config_init(&c, "m");
    assert_int_equal(c.precision_fp16, 0);
    assert_int_equal(c.cuda_graphs, 1);
    cJSON *j = model_config_to_json(&c);
    char *txt = cJSON_PrintUnformatted(j);
    assert_non_null(strstr(txt, "\"optimization\":{\"precision\":\"fp32\",\"cuda_graphs\":true}"));
    free(txt);
    cJSON_Delete(j);
    const char *json = "{\"optimization\":{\"precision\":\"fp16\",\"cuda_graphs\":false,\"cuda\":{\"graphs\":true}}}";
    assert_int_equal(model_config_parse(&c, json, strlen(json), g_err, sizeof g_err), 0);
    assert_int_equal(c.precision_fp16, 1);
    assert_int_equal(c.cuda_graphs, 0);
    j = model_config_to_json(&c);
    txt = cJSON_PrintUnformatted(j);
    assert_non_null(strstr(txt, "\"optimization\":{\"precision\":\"fp16\",\"cuda_graphs\":false}"));
    free(txt);
    cJSON_Delete(j);
    model_config_clear(&c);
    /* Only what is given changes; "FP32" in capitals is the same value. */
    parse_ok(&c, "{\"optimization\":{\"precision\":\"FP32\"}}");
    assert_int_equal(c.precision_fp16, 0);
    assert_int_equal(c.cuda_graphs, 1);
    model_config_clear(&c);
}

/* Triton's parameters: intra_op_thread_count read as its onnxruntime
 * backend reads it, echoed by /config; other keys ignored. */
static void test_model_config_parameters(void **state) {
    struct model_config c;
    model_config_init(&c, "m");
    assert_int_equal(c.intra_op_threads, 0);
    const char *json = "{\"parameters\":{\"intra_op_thread_count\":{\"string_value\":\"3\"},"
                       "\"execution_mode\":{\"string_value\":\"0\"}}}";
    assert_int_equal(model_config_parse(&c, json, strlen(json), g_err, sizeof g_err), 0);
    assert_int_equal(c.intra_op_threads, 3);
    cJSON *j = model_config_to_json(&c);
    char *txt = cJSON_PrintUnformatted(j);
    assert_non_null(strstr(txt, "\"parameters\":{\"intra_op_thread_count\":{\"string_value\":\"3\"}}"));
    free(txt);
    cJSON_Delete(j);
    model_config_clear(&c);
}

static void test_version_policy_latest(void **state) {
    struct model_config c;
    model_config_init(&c, "m");
    const char *json = "{\"version_policy\":{\"latest\":{\"num_versions\":2}}}";
    assert_int_equal(model_config_parse(&c, json, strlen(json), g_err, sizeof g_err), 0);
    int64_t present[] = {1, 4, 9};
    assert_false(model_config_version_wanted(&c, 1, present, 3));
    assert_true(model_config_version_wanted(&c, 4, present, 3));
    assert_true(model_config_version_wanted(&c, 9, present, 3));
    model_config_clear(&c);
}

/* kiln's tokenizer backend: the one backend besides onnxruntime's, with
 * its truncation length, printed back as it was given. */
static void test_model_config_tokenizer_backend(void **state) {
    (void)state;
    struct model_config c;
    model_config_init(&c, "m");
    const char *json = "{\"backend\":\"tokenizer\",\"parameters\":{\"max_length\":{\"string_value\":\"256\"}}}";
    assert_int_equal(model_config_parse(&c, json, strlen(json), g_err, sizeof g_err), 0);
    assert_int_equal(c.tokenizer, 1);
    assert_int_equal(c.tokenizer_max_length, 256);
    cJSON *o = model_config_to_json(&c);
    assert_string_equal(cJSON_GetObjectItem(o, "backend")->valuestring, "tokenizer");
    cJSON *ml = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "parameters"), "max_length");
    assert_string_equal(cJSON_GetObjectItem(ml, "string_value")->valuestring, "256");
    cJSON_Delete(o);
    model_config_clear(&c);
    /* An ONNX model's max_length parameter is Triton's free-form: ignored. */
    parse_ok(&c, "{\"parameters\":{\"max_length\":{\"string_value\":\"x\"}}}");
    assert_int_equal(c.tokenizer, 0);
    model_config_clear(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_config_tokenizer_backend),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_errors_name_the_source),
        cmocka_unit_test(test_control_auth),
        cmocka_unit_test(test_model_bounds_flags),
        cmocka_unit_test(test_fleet_flags),
        cmocka_unit_test(test_grpc_max_message_size),
        cmocka_unit_test(test_client_shm_flags),
        cmocka_unit_test(test_model_config_parse_and_json),
        cmocka_unit_test(test_model_config_autocomplete),
        cmocka_unit_test(test_model_config_errors),
        cmocka_unit_test(test_model_config_batch_hint),
        cmocka_unit_test(test_model_config_reshape),
        cmocka_unit_test(test_model_config_optimization),
        cmocka_unit_test(test_model_config_parameters),
        cmocka_unit_test(test_version_policy_latest),
        cmocka_unit_test(test_max_request_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
