/* test_infer.c - the inference core without a transport: a fake one posts
 * completions to a queue the test thread runs and records what the core
 * asks it to encode and send. The digits model from model_repository/
 * (input [N,64] FP32; outputs label [N] INT64, probabilities [N,10] FP32)
 * runs on the CPU. Unknown models, bind errors, transport errors, a
 * computed answer, and a second identical request answered by the result
 * cache before infer_request_start returns. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "server/infer.h"
#include "server/metrics.h"

/* ---- a fake transport ------------------------------------------------------ */

#define MAX_JOBS 64

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct runtime_job *job[MAX_JOBS];
    int n;
} io = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void fake_post(void *thread, struct runtime_job *job) {
    assert_ptr_equal(thread, &io);
    pthread_mutex_lock(&io.mu);
    assert_true(io.n < MAX_JOBS);
    io.job[io.n++] = job;
    pthread_cond_signal(&io.cv);
    pthread_mutex_unlock(&io.mu);
}

/* What the core asked of the transport for one request. */
struct reply {
    int encoded, sent, status;
    char msg[512];
    int64_t label_rows, prob_dims[2];
    int64_t labels[8];
};

static int fake_encode(void *ctx, const struct infer_result *res, char *err, size_t err_len) {
    struct reply *r = ctx;
    assert_int_equal(res->config->noutputs, 2);
    assert_string_equal(res->model_name, "digits");
    const struct tensor *label = &res->outputs[0], *prob = &res->outputs[1];
    assert_int_equal(label->dtype, DT_INT64);
    r->label_rows = label->dims[0];
    r->prob_dims[0] = prob->dims[0];
    r->prob_dims[1] = prob->dims[1];
    for (int64_t i = 0; i < label->dims[0] && i < 8; i++) r->labels[i] = ((const int64_t *)label->data)[i];
    r->encoded++;
    return 0;
}

static void fake_send(void *ctx, int status, const char *msg) {
    struct reply *r = ctx;
    r->sent++;
    r->status = status;
    snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
}

static const struct infer_reply_i fake_reply = {fake_post, fake_encode, fake_send};

/* Runs posted completions on this thread until r is answered. */
static void pump(struct reply *r) {
    while (!r->sent) {
        pthread_mutex_lock(&io.mu);
        while (!io.n) pthread_cond_wait(&io.cv, &io.mu);
        struct runtime_job *job = io.job[0];
        memmove(io.job, io.job + 1, sizeof io.job[0] * (size_t)(io.n - 1));
        io.n--;
        pthread_mutex_unlock(&io.mu);
        job->run(job->arg);
    }
}

/* ---- fixtures --------------------------------------------------------------- */

static repository_t *repo;

static int setup(void **state) {
    char err[512];
    struct repository_params rp = {.root = "model_repository", .backend = "cpu"};
    repo = repository_create(&rp, err, sizeof err);
    if (!repo || repository_load(repo, "digits", err, sizeof err)) {
        fprintf(stderr, "digits: %s (run from the repository root)\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    repository_free(repo);
    return 0;
}

static infer_core_t *core_new(int64_t cache_bytes) {
    static struct server_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.cache_size = cache_bytes;
    char err[256];
    struct infer_core_params p = {.config = &cfg, .repo = repo};
    infer_core_t *core = infer_core_create(&p, err, sizeof err);
    if (!core) fail_msg("infer_core_create: %s", err);
    return core;
}

/* A request body of rows x 64 values (seeded), with the input named name. */
static char *body_of(const char *name, int rows, int seed) {
    size_t cap = 256 + (size_t)rows * 64 * 16, len = 0;
    char *b = malloc(cap);
    len += (size_t)snprintf(b + len, cap - len,
                            "{\"inputs\":[{\"name\":\"%s\",\"shape\":[%d,64],\"datatype\":\"FP32\",\"data\":[", name,
                            rows);
    for (int i = 0; i < rows * 64; i++)
        len += (size_t)snprintf(b + len, cap - len, "%s%d", i ? "," : "", (i * 7 + seed) % 17);
    snprintf(b + len, cap - len, "]}]}");
    return b;
}

/* Begins a request for digits and decodes body into it. */
static struct infer_request *begin(infer_core_t *core, struct reply *rep, const char *body) {
    char err[512];
    int status = 0;
    struct infer_request *r = infer_request_begin(core, "digits", 0, &fake_reply, rep, &io, NULL, &status, err,
                                                  sizeof err);
    if (!r) fail_msg("infer_request_begin: %s", err);
    if (kserve_request_parse(infer_request_decoded(r), body, strlen(body), -1, err, sizeof err))
        fail_msg("kserve_request_parse: %s", err);
    return r;
}

/* ---- tests ------------------------------------------------------------------- */

static void test_unknown_model(void **state) {
    infer_core_t *core = core_new(0);
    struct reply rep = {0};
    char err[512] = "";
    int status = 0;
    assert_null(infer_request_begin(core, "nope", 0, &fake_reply, &rep, &io, NULL, &status, err, sizeof err));
    assert_int_equal(status, STATUS_NOT_FOUND);
    assert_non_null(strstr(err, "nope"));
    assert_int_equal(rep.sent, 0);
    assert_int_equal(infer_core_inflight(core), 0);
    infer_core_free(core);
}

static void test_computed_answer(void **state) {
    infer_core_t *core = core_new(0);
    char *body = body_of("input", 3, 1);
    struct reply rep = {0};
    struct infer_request *r = begin(core, &rep, body);
    assert_int_equal(infer_core_inflight(core), 1);
    infer_request_start(r);
    pump(&rep);
    assert_int_equal(rep.status, 0);
    assert_int_equal(rep.encoded, 1);
    assert_int_equal(rep.sent, 1);
    assert_int_equal(rep.label_rows, 3);
    assert_int_equal(rep.prob_dims[0], 3);
    assert_int_equal(rep.prob_dims[1], 10);
    assert_int_equal(infer_core_inflight(core), 0);
    free(body);
    infer_core_free(core);
}

/* Validation against the model is the core's: a bad input name is
 * answered inside infer_request_start, never encoded. */
static void test_bind_error_answered_at_start(void **state) {
    infer_core_t *core = core_new(0);
    char *body = body_of("not_an_input", 1, 0);
    struct reply rep = {0};
    struct infer_request *r = begin(core, &rep, body);
    infer_request_start(r);
    assert_int_equal(rep.sent, 1);
    assert_int_equal(rep.encoded, 0);
    assert_int_equal(rep.status, STATUS_INVALID);
    assert_non_null(strstr(rep.msg, "unexpected inference input 'not_an_input'"));
    assert_int_equal(infer_core_inflight(core), 0);
    free(body);
    infer_core_free(core);
}

/* A transport's own decoding error: fail answers through send, drop does not. */
static void test_fail_and_drop(void **state) {
    infer_core_t *core = core_new(0);
    char err[512];
    int status = 0;
    struct reply rep = {0};
    struct infer_request *r =
        infer_request_begin(core, "digits", 0, &fake_reply, &rep, &io, NULL, &status, err, sizeof err);
    assert_non_null(r);
    infer_request_fail(r, STATUS_INVALID, "the header is bad");
    assert_int_equal(rep.sent, 1);
    assert_int_equal(rep.status, STATUS_INVALID);
    assert_string_equal(rep.msg, "the header is bad");
    struct reply rep2 = {0};
    r = infer_request_begin(core, "digits", 0, &fake_reply, &rep2, &io, NULL, &status, err, sizeof err);
    assert_non_null(r);
    assert_int_equal(infer_core_inflight(core), 1);
    infer_request_drop(r);
    assert_int_equal(rep2.sent, 0);
    assert_int_equal(infer_core_inflight(core), 0);
    infer_core_free(core);
}

/* The second identical request is answered from the in-process cache
 * before infer_request_start returns, with the same outputs. */
static void test_cache_hit(void **state) {
    infer_core_t *core = core_new(1 << 20);
    assert_non_null(infer_core_cache(core));
    struct metrics_model *m = metrics_model_get("digits", "1");
    uint64_t hits = atomic_load(&m->d_cache_hit.count);
    char *body = body_of("input", 2, 5);
    struct reply first = {0}, second = {0};
    struct infer_request *r = begin(core, &first, body);
    infer_request_start(r);
    pump(&first);
    assert_int_equal(first.status, 0);
    r = begin(core, &second, body);
    infer_request_start(r);
    assert_int_equal(second.sent, 1);
    assert_int_equal(second.status, 0);
    assert_int_equal(second.label_rows, 2);
    assert_memory_equal(second.labels, first.labels, sizeof(int64_t) * 2);
    assert_int_equal(atomic_load(&m->d_cache_hit.count), hits + 1);
    assert_int_equal(infer_core_inflight(core), 0);
    free(body);
    infer_core_free(core);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_model),
        cmocka_unit_test(test_computed_answer),
        cmocka_unit_test(test_bind_error_answered_at_start),
        cmocka_unit_test(test_fail_and_drop),
        cmocka_unit_test(test_cache_hit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
