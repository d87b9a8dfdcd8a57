/* The model API on real ONNX files: metadata, results against ONNX's own
 * expected outputs, input checks with messages that name the input, plan
 * reuse and LRU eviction, and several threads sharing one model. The test
 * includes model.c to look at the plan cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.c"

#define DATA ".venv/lib/python3.11/site-packages/onnx/backend/test/data"
#define DIGITS "model_repository/digits/1/model.onnx"

static struct model *load(const char *path, int max_plans) {
    char err[512] = "";
    struct model_params p = {.path = path, .max_plans = max_plans};
    struct model *m = model_load(&p, err, sizeof err);
    if (!m) fail_msg("model_load %s: %s", path, err);
    return m;
}

static void load_pb(const char *path, struct tensor *t) {
    char err[512];
    if (onnx_load_tensor_file(path, t, NULL, err, sizeof err)) fail_msg("%s: %s", path, err);
}

static void expect_close(const struct tensor *got, const struct tensor *want, double atol, double rtol) {
    assert_int_equal(got->dtype, want->dtype);
    assert_true(tensor_same_shape(got, want));
    int64_t n = tensor_numel(got);
    for (int64_t i = 0; i < n; i++) {
        double a = op_double_at(got, i), b = op_double_at(want, i);
        if (fabs(a - b) > atol + rtol * fabs(b)) fail_msg("element %lld: got %g, expected %g", (long long)i, a, b);
    }
}

/* Runs a node test's model on test_data_set_0 and compares every output. */
static void run_node_test(const char *name) {
    char path[512];
    snprintf(path, sizeof path, DATA "/node/%s/model.onnx", name);
    struct model *m = load(path, 0);
    struct model_exec *x = model_exec_create(m, NULL, 1);
    assert_non_null(x);
    int ni = model_ninputs(m), no = model_noutputs(m);
    struct tensor in[8], out[8], want[8];
    for (int i = 0; i < ni; i++) {
        snprintf(path, sizeof path, DATA "/node/%s/test_data_set_0/input_%d.pb", name, i);
        load_pb(path, &in[i]);
    }
    char err[512] = "";
    int rc = model_run(x, in, ni, out, no, err, sizeof err);
    if (rc) fail_msg("%s: %s", name, err);
    for (int o = 0; o < no; o++) {
        snprintf(path, sizeof path, DATA "/node/%s/test_data_set_0/output_%d.pb", name, o);
        load_pb(path, &want[o]);
        expect_close(&out[o], &want[o], 1e-5, 1e-4);
        free(out[o].data);
        onnx_tensor_clear(&want[o]);
    }
    for (int i = 0; i < ni; i++) onnx_tensor_clear(&in[i]);
    model_exec_free(x);
    model_free(m);
}

static void test_node_models(void **state) {
    (void)state;
    run_node_test("test_add");
    run_node_test("test_identity");          /* the output is a view of the input */
    run_node_test("test_constant");          /* the output is a folded constant */
    run_node_test("test_reshape_reordered_all_dims"); /* shape comes in as an input */
    run_node_test("test_conv_with_strides_padding");
    run_node_test("test_gemm_all_attributes");
    run_node_test("test_top_k");             /* K is an input: bound by value */
}

static void test_metadata(void **state) {
    (void)state;
    struct model *m = load(DATA "/node/test_add/model.onnx", 0);
    assert_int_equal(model_ninputs(m), 2);
    assert_int_equal(model_noutputs(m), 1);
    const struct model_io *x = model_input(m, 0);
    assert_string_equal(x->name, "x");
    assert_int_equal(x->dtype, DT_FP32);
    assert_int_equal(x->ndim, 3);
    assert_int_equal(x->dims[2], 5);
    assert_int_equal(model_find_input(m, "y"), 1);
    assert_int_equal(model_find_output(m, "sum"), 0);
    assert_int_equal(model_find_input(m, "nope"), -1);
    assert_null(model_input(m, 2));
    assert_int_equal(model_node_count(m), 1);
    model_free(m);
    model_free(NULL);
    model_exec_free(NULL);
}

static void test_input_errors(void **state) {
    (void)state;
    struct model *m = load(DATA "/node/test_add/model.onnx", 0);
    struct model_exec *x = model_exec_create(m, NULL, 1);
    float a[60] = {0}, b[60] = {0};
    struct tensor in[2] = {{.dtype = DT_FP32, .ndim = 3, .dims = {3, 4, 5}, .data = a},
                           {.dtype = DT_FP32, .ndim = 3, .dims = {3, 4, 5}, .data = b}};
    struct tensor out[1] = {{.data = (void *)1}};
    char err[512];

    in[1].dtype = DT_INT64;
    assert_int_equal(model_run(x, in, 2, out, 1, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "input 'y'"));
    assert_non_null(strstr(err, "float"));
    assert_non_null(strstr(err, "int64"));
    assert_null(out[0].data); /* nothing left allocated on error */
    in[1].dtype = DT_FP32;

    in[0].dims[2] = 6;
    assert_int_equal(model_run(x, in, 2, out, 1, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "input 'x'"));
    assert_non_null(strstr(err, "[3,4,5]"));
    assert_non_null(strstr(err, "[3,4,6]"));
    in[0].dims[2] = 5;

    in[0].ndim = 2;
    assert_int_equal(model_run(x, in, 2, out, 1, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "rank 3"));
    in[0].ndim = 3;

    assert_int_equal(model_run(x, in, 1, out, 1, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "2 inputs"));

    in[0].data = NULL;
    assert_int_equal(model_run(x, in, 2, out, 1, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "no data"));
    in[0].data = a;

    assert_int_equal(model_run(x, in, 2, out, 1, err, sizeof err), 0);
    free(out[0].data);
    model_exec_free(x);
    model_free(m);
}

/* The digits MLP has a symbolic batch dim: absurd values are refused, and
 * each batch size gets one plan, reused. */
static void test_plan_reuse_and_lru(void **state) {
    (void)state;
    struct model *m = load(DIGITS, 2);
    const struct model_io *io = model_input(m, 0);
    assert_int_equal(io->dims[0], -1);
    int feat = (int)io->dims[1];
    struct model_exec *x = model_exec_create(m, NULL, 1);
    float *data = calloc((size_t)8 * feat, sizeof(float));
    for (int i = 0; i < 8 * feat; i++) data[i] = (float)(i % 17);
    struct tensor in = {.dtype = DT_FP32, .ndim = 2, .dims = {1, feat}, .data = data};
    int no = model_noutputs(m);
    struct tensor out[4], first[4];
    char err[512];

    in.dims[0] = (int64_t)1 << 30;
    assert_int_equal(model_run(x, &in, 1, out, no, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "dim 0"));

    in.dims[0] = 1;
    assert_int_equal(model_run(x, &in, 1, first, no, err, sizeof err), 0);
    assert_int_equal(plan_cache_builds(m->plans), 1);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(model_run(x, &in, 1, out, no, err, sizeof err), 0);
        for (int o = 0; o < no; o++) {
            assert_memory_equal(out[o].data, first[o].data, tensor_nbytes(&first[o]));
            free(out[o].data);
        }
    }
    assert_int_equal(plan_cache_builds(m->plans), 1);
    for (int b = 2; b <= 4; b++) {
        in.dims[0] = b;
        assert_int_equal(model_run(x, &in, 1, out, no, err, sizeof err), 0);
        assert_int_equal(out[0].dims[0], b);
        for (int o = 0; o < no; o++) free(out[o].data);
    }
    assert_int_equal(plan_cache_builds(m->plans), 4);
    assert_int_equal(plan_cache_size(m->plans), 2);
    assert_int_equal(plan_cache_evictions(m->plans), 2);
    /* Batch 1 again: rebuilt after eviction, same answer. */
    in.dims[0] = 1;
    assert_int_equal(model_run(x, &in, 1, out, no, err, sizeof err), 0);
    for (int o = 0; o < no; o++) {
        assert_memory_equal(out[o].data, first[o].data, tensor_nbytes(&first[o]));
        free(out[o].data);
        free(first[o].data);
    }
    assert_int_equal(plan_cache_builds(m->plans), 5);
    free(data);
    model_exec_free(x);
    model_free(m);
}

/* Plans are made for a thread count (oneDNN splits the work and sizes its
 * scratchpad when a primitive is made): contexts with another count get
 * plans of their own, with the same answers. */
static void test_plans_per_thread_count(void **state) {
    (void)state;
    struct model *m = load(DIGITS, 8);
    int feat = (int)model_input(m, 0)->dims[1];
    struct model_exec *x1 = model_exec_create(m, NULL, 1), *x2 = model_exec_create(m, NULL, 2);
    float *data = calloc((size_t)4 * feat, sizeof(float));
    for (int i = 0; i < 4 * feat; i++) data[i] = (float)(i % 13);
    struct tensor in = {.dtype = DT_FP32, .ndim = 2, .dims = {4, feat}, .data = data};
    int no = model_noutputs(m);
    struct tensor a[4], b[4];
    char err[512];
    assert_int_equal(model_run(x1, &in, 1, a, no, err, sizeof err), 0);
    assert_int_equal(model_run(x1, &in, 1, b, no, err, sizeof err), 0);
    assert_int_equal(plan_cache_builds(m->plans), 1);
    for (int o = 0; o < no; o++) free(b[o].data);
    assert_int_equal(model_run(x2, &in, 1, b, no, err, sizeof err), 0);
    assert_int_equal(plan_cache_builds(m->plans), 2);
    for (int o = 0; o < no; o++) {
        assert_int_equal(a[o].dtype, b[o].dtype);
        assert_int_equal(tensor_numel(&a[o]), tensor_numel(&b[o]));
        if (a[o].dtype == DT_FP32) { /* another split may sum in another order */
            for (int64_t i = 0; i < tensor_numel(&a[o]); i++) {
                float u = ((float *)a[o].data)[i], v = ((float *)b[o].data)[i];
                if (fabsf(u - v) > 1e-5f * (1.0f + fabsf(u))) fail_msg("output %d[%lld]: %g vs %g", o, (long long)i, u, v);
            }
        } else {
            assert_memory_equal(a[o].data, b[o].data, tensor_nbytes(&a[o]));
        }
        free(a[o].data);
        free(b[o].data);
    }
    free(data);
    model_exec_free(x1);
    model_exec_free(x2);
    model_free(m);
}

/* Threads share one model whose cache holds one plan, each with its own
 * context and batch size: plans are evicted while other threads run them. */
struct worker {
    struct model *m;
    int batch;
    int feat;
    int iters;
    const float *ref; /* expected probabilities for rows 0..7 */
    int failures;
};

static void *worker_main(void *arg) {
    struct worker *w = arg;
    struct model_exec *x = model_exec_create(w->m, NULL, 1);
    float *data = malloc((size_t)w->batch * w->feat * sizeof(float));
    for (int i = 0; i < w->batch * w->feat; i++) data[i] = (float)(i % (8 * w->feat) % 17);
    struct tensor in = {.dtype = DT_FP32, .ndim = 2, .dims = {w->batch, w->feat}, .data = data}, out[4];
    int no = model_noutputs(w->m), prob = model_find_output(w->m, "probabilities");
    char err[512];
    for (int it = 0; it < w->iters; it++) {
        if (model_run(x, &in, 1, out, no, err, sizeof err)) {
            w->failures++;
            continue;
        }
        const float *p = out[prob].data;
        for (int r = 0; r < w->batch; r++)
            for (int k = 0; k < 10; k++)
                if (fabsf(p[r * 10 + k] - w->ref[(r % 8) * 10 + k]) > 1e-5f) w->failures++;
        for (int o = 0; o < no; o++) free(out[o].data);
    }
    free(data);
    model_exec_free(x);
    return NULL;
}

static void test_threads_share_a_model(void **state) {
    (void)state;
    struct model *m = load(DIGITS, 1);
    int feat = (int)model_input(m, 0)->dims[1], no = model_noutputs(m), prob = model_find_output(m, "probabilities");
    assert_true(prob >= 0);
    float *data = malloc((size_t)8 * feat * sizeof(float));
    for (int i = 0; i < 8 * feat; i++) data[i] = (float)(i % 17);
    struct tensor in = {.dtype = DT_FP32, .ndim = 2, .dims = {8, feat}, .data = data}, out[4];
    struct model_exec *x = model_exec_create(m, NULL, 1);
    char err[512];
    assert_int_equal(model_run(x, &in, 1, out, no, err, sizeof err), 0);
    float ref[80];
    memcpy(ref, out[prob].data, sizeof ref);
    for (int o = 0; o < no; o++) free(out[o].data);
    model_exec_free(x);

    pthread_t th[4];
    struct worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){m, i + 1 + (i == 3 ? 4 : 0), feat, 200, ref, 0};
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    assert_int_equal(plan_cache_size(m->plans), 1);
    free(data);
    model_free(m);
}

/* A real network end to end against ONNX's expected output. */
static void test_squeezenet(void **state) {
    (void)state;
    struct model *m = load(DATA "/light/light_squeezenet.onnx", 0);
    struct model_exec *x = model_exec_create(m, NULL, 0);
    const struct model_io *io = model_input(m, 0);
    struct tensor in = {.dtype = DT_FP32, .ndim = io->ndim};
    for (int d = 0; d < io->ndim; d++) in.dims[d] = io->dims[d] > 0 ? io->dims[d] : 1;
    int64_t n = tensor_numel(&in);
    float *data = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) data[i] = (float)i / (float)n;
    in.data = data;
    struct tensor out, want;
    char err[512];
    if (model_run(x, &in, 1, &out, 1, err, sizeof err)) fail_msg("%s", err);
    load_pb(DATA "/light/light_squeezenet_output_0.pb", &want);
    expect_close(&out, &want, 1e-4, 1e-3);
    free(out.data);
    onnx_tensor_clear(&want);
    free(data);
    model_exec_free(x);
    model_free(m);
}

/* torchvision's full SSDlite export: NonZero on computed scores, so no plan
 * holds it. The model says its shapes follow values (digits' do not); the
 * first run finds out, caches no plan and runs node by node, and a second
 * run of the same image, on that path from the start, answers the same. */
static void test_value_driven_model(void **state) {
    (void)state;
    struct model *digits = load(DIGITS, 0);
    assert_int_equal(model_shapes_follow_values(digits), 0);
    model_free(digits);
    struct model *m = load("tests/data/detection/ssdlite_full.onnx", 0);
    assert_int_equal(model_shapes_follow_values(m), 1);
    assert_int_equal(atomic_load(&m->value_driven), 0);
    struct model_exec *x = model_exec_create(m, NULL, 2);
    struct tensor in = {.dtype = DT_FP32, .ndim = 4, .dims = {1, 3, 320, 320}};
    int64_t n = tensor_numel(&in);
    float *data = malloc((size_t)n * sizeof(float));
    unsigned seed = 7;
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        data[i] = (float)(seed >> 8) / 16777216.0f;
    }
    in.data = data;
    struct tensor out[2][3];
    char err[512];
    for (int r = 0; r < 2; r++)
        if (model_run(x, &in, 1, out[r], 3, err, sizeof err)) fail_msg("run %d: %s", r, err);
    assert_int_equal(atomic_load(&m->value_driven), 1);
    assert_int_equal(plan_cache_size(m->plans), 0);
    int64_t d = out[0][1].dims[0];
    assert_true(d > 0 && d <= 300);
    assert_int_equal(out[0][0].ndim, 2);
    assert_int_equal(out[0][0].dims[0], d);
    assert_int_equal(out[0][0].dims[1], 4);
    assert_int_equal(out[0][2].dtype, DT_INT64);
    for (int o = 0; o < 3; o++) {
        assert_true(tensor_same_shape(&out[0][o], &out[1][o]));
        assert_memory_equal(out[0][o].data, out[1][o].data, tensor_nbytes(&out[0][o]));
    }
    for (int r = 0; r < 2; r++)
        for (int o = 0; o < 3; o++) tensor_free_data(&out[r][o]);
    /* A wrong input is still refused with its name. */
    in.dims[2] = 300;
    assert_int_equal(model_run(x, &in, 1, out[0], 3, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "images"));
    free(data);
    model_exec_free(x);
    model_free(m);
}

/* One run of control_if_rate.onnx (tests/models/make_bind_models.py) on
 * x = base + 0..7 at rate: the output elements that are not the branch's
 * (x * 2 at 16 kHz, else x + 1; *ndim gets the output's rank), or -1 when
 * the run fails. */
static int if_rate_run(struct model_exec *x, float base, int64_t rate, int *ndim) {
    float xs[8];
    for (int i = 0; i < 8; i++) xs[i] = base + (float)i;
    struct tensor in[2] = {{.dtype = DT_FP32, .ndim = 2, .dims = {1, 8}, .data = xs},
                           {.dtype = DT_INT64, .ndim = 0, .data = &rate}};
    struct tensor out;
    char err[512];
    if (model_run(x, in, 2, &out, 1, err, sizeof err)) return -1;
    int bad = 0;
    for (int i = 0; i < 8; i++) bad += ((float *)out.data)[i] != (rate == 16000 ? 2.0f * xs[i] : xs[i] + 1.0f);
    *ndim = out.ndim;
    tensor_free_data(&out);
    return bad;
}

/* A shape that follows one small input's value (an If on rate) binds that
 * input alone into the plans: new values of x reuse the plan, a new rate
 * builds one. */
static void test_binds_only_deciding_inputs(void **state) {
    (void)state;
    struct model *m = load("tests/data/control/control_if_rate.onnx", 0);
    struct model_exec *x = model_exec_create(m, NULL, 1);
    uint64_t builds = 0;
    int ndim;
    for (int r = 0; r < 6; r++) {
        assert_int_equal(if_rate_run(x, (float)(r * 8), 16000, &ndim), 0);
        assert_int_equal(ndim, 2);
        if (r == 0) builds = plan_cache_builds(m->plans);
    }
    assert_int_equal(plan_cache_builds(m->plans), builds); /* x's values: no new plan */
    assert_int_equal(atomic_load(&m->bind_values), 2);    /* rate (input 1) alone */
    assert_int_equal(if_rate_run(x, 100, 8000, &ndim), 0);
    assert_int_equal(ndim, 1);
    assert_int_equal(plan_cache_builds(m->plans), builds + 1);
    model_exec_free(x);
    model_free(m);
}

/* Threads running one plan's If at once, each with its own values: every
 * result is its own (the If's branch executors are the shared plan's;
 * models/control.c gives each run a lane). */
struct if_worker {
    struct model *m;
    int seed, failures;
};

static void *if_worker_main(void *arg) {
    struct if_worker *w = arg;
    struct model_exec *x = model_exec_create(w->m, NULL, 1);
    int ndim;
    for (int r = 0; r < 3000; r++) w->failures += if_rate_run(x, (float)(w->seed * 100000 + r * 8), 16000, &ndim) != 0;
    model_exec_free(x);
    return NULL;
}

static void test_threads_share_an_if(void **state) {
    (void)state;
    struct model *m = load("tests/data/control/control_if_rate.onnx", 0);
    pthread_t th[4];
    struct if_worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct if_worker){m, i + 1, 0};
        pthread_create(&th[i], NULL, if_worker_main, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    model_free(m);
}

static void test_load_errors(void **state) {
    (void)state;
    char err[512] = "";
    struct model_params p = {.path = "/nonexistent/model.onnx"};
    assert_null(model_load(&p, err, sizeof err));
    assert_true(strlen(err) > 0);
    assert_null(model_load(NULL, err, sizeof err));
    assert_null(model_exec_create(NULL, NULL, 1));
}

static void test_backend_registry(void **state) {
    (void)state;
    char why[512];
    assert_int_equal(backend_available("cpu", why, sizeof why), 1);
    struct backend *be = backend_create("cpu", &(struct backend_params){.nthreads = 1}, why, sizeof why);
    assert_non_null(be);
    assert_string_equal(be->iface->name, "cpu");
    assert_true(be->host_memory);
    void *buf = be->iface->buffer_alloc(be, 100);
    assert_non_null(buf);
    assert_int_equal((uintptr_t)buf % 64, 0);
    be->iface->buffer_free(be, buf);
    /* A model run on a borrowed backend. */
    struct model *m = load(DATA "/node/test_add/model.onnx", 0);
    struct model_exec *x = model_exec_create(m, be, 1);
    float a[60], b[60];
    for (int i = 0; i < 60; i++) a[i] = (float)i, b[i] = 1;
    struct tensor in[2] = {{.dtype = DT_FP32, .ndim = 3, .dims = {3, 4, 5}, .data = a},
                           {.dtype = DT_FP32, .ndim = 3, .dims = {3, 4, 5}, .data = b}}, out;
    assert_int_equal(model_run(x, in, 2, &out, 1, why, sizeof why), 0);
    assert_float_equal(((float *)out.data)[59], 60, 0);
    free(out.data);
    model_exec_free(x);
    model_free(m);
    backend_free(be);
    backend_free(NULL);
    assert_null(backend_create("tpu", NULL, why, sizeof why));
    assert_non_null(strstr(why, "tpu"));
    /* Without a GPU the CUDA backend is absent with a reason, never a crash. */
    if (backend_available("cuda", why, sizeof why) == 0) {
        assert_true(strlen(why) > 0);
        assert_null(backend_create("cuda", NULL, why, sizeof why));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_models),
        cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_input_errors),
        cmocka_unit_test(test_plan_reuse_and_lru),
        cmocka_unit_test(test_plans_per_thread_count),
        cmocka_unit_test(test_threads_share_a_model),
        cmocka_unit_test(test_squeezenet),
        cmocka_unit_test(test_value_driven_model),
        cmocka_unit_test(test_binds_only_deciding_inputs),
        cmocka_unit_test(test_threads_share_an_if),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_backend_registry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
