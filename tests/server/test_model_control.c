/* test_model_control.c - load and unload as both front ends run them,
 * through a real runtime (loop and control thread) and repository: the
 * check in its order (permission, then the drain), a load and an unload
 * answered on the caller's loop, a failed load's status and message, and
 * a call still queued at exit released, not answered. Uses the digits
 * model from model_repository/ (run from the repository root). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "config/server_config.h"
#include "server/model_control.h"
#include "server/runtime.h"

static void set(struct server_config *c, const char *name, const char *value) {
    char err[256];
    assert_int_equal(server_config_set(c, name, value, "flag", err, sizeof err), 0);
}

static void test_check_permission_then_drain(void **state) {
    struct server_config cfg;
    server_config_init(&cfg);
    set(&cfg, "http-threads", "1");
    char err[300];
    struct runtime_params p = {.config = &cfg};
    runtime_t *rt = runtime_create(&p, err, sizeof err);
    assert_non_null(rt);
    set(&cfg, "model-control-mode", "none");
    assert_int_equal(model_control_check(rt, &cfg, NULL, ACCESS_VIA_HTTP, err, sizeof err), STATUS_DISABLED);
    set(&cfg, "model-control-mode", "explicit");
    set(&cfg, "control-token", "s3cret");
    assert_int_equal(model_control_check(rt, &cfg, NULL, ACCESS_VIA_GRPC, err, sizeof err), STATUS_UNAUTHENTICATED);
    assert_int_equal(model_control_check(rt, &cfg, "Bearer s3cret", ACCESS_VIA_GRPC, err, sizeof err), STATUS_OK);
    runtime_begin_drain(rt);
    /* The permission is asked first: a refused caller learns nothing of the drain. */
    assert_int_equal(model_control_check(rt, &cfg, NULL, ACCESS_VIA_HTTP, err, sizeof err), STATUS_UNAUTHENTICATED);
    assert_int_equal(model_control_check(rt, &cfg, "Bearer s3cret", ACCESS_VIA_HTTP, err, sizeof err),
                     STATUS_UNAVAILABLE);
    assert_non_null(strstr(err, "shutting down"));
    runtime_free(rt);
    server_config_clear(&cfg);
}

/* ---- a front end's call around struct model_control ---- */

struct call {
    struct model_control mc;     /* first, as the front ends have it */
    pthread_t answered_on;
    int answered, released;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int answers;

static void call_done(struct model_control *mc) {
    struct call *c = (struct call *)mc;
    model_control_clear(mc);
    pthread_mutex_lock(&mu);
    c->answered_on = pthread_self();
    c->answered++;
    answers++;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

static void call_release(struct model_control *mc) {
    struct call *c = (struct call *)mc;
    model_control_clear(mc);
    c->released++;
}

static void start(runtime_t *rt, repository_t *repo, struct call *c, const char *name, int load, const char *config) {
    memset(c, 0, sizeof *c);
    c->mc = (struct model_control){.loop = runtime_loop(rt, 0), .repo = repo, .load = load,
                                   .config = config ? strdup(config) : NULL, .done = call_done,
                                   .release = call_release};
    snprintf(c->mc.name, sizeof c->mc.name, "%s", name);
    model_control_start(rt, &c->mc);
}

static void wait_answers(int n) {
    pthread_mutex_lock(&mu);
    while (answers < n) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void test_load_and_unload_answer_on_the_loop(void **state) {
    struct server_config cfg;
    server_config_init(&cfg);
    set(&cfg, "http-threads", "1");
    char err[512];
    struct repository_params rp = {.root = "model_repository", .backend = "cpu"};
    repository_t *repo = repository_create(&rp, err, sizeof err);
    assert_non_null(repo);
    struct runtime_params p = {.config = &cfg, .repo = repo};
    runtime_t *rt = runtime_create(&p, err, sizeof err);
    assert_non_null(rt);
    assert_int_equal(runtime_start(rt, err, sizeof err), 0);
    answers = 0;

    static struct call load, missing, bad_config, unload;
    start(rt, repo, &load, "digits", 1, NULL);
    wait_answers(1);
    assert_int_equal(load.mc.status, STATUS_OK);
    assert_false(pthread_equal(load.answered_on, pthread_self()));
    int st;
    struct repo_version *v = repository_acquire(repo, "digits", 0, &st, err, sizeof err);
    assert_non_null(v);
    repository_release(v);

    start(rt, repo, &missing, "no_such_model", 1, NULL);
    wait_answers(2);
    assert_int_equal(missing.mc.status, STATUS_NOT_FOUND);
    assert_non_null(strstr(missing.mc.err, "no_such_model"));

    start(rt, repo, &bad_config, "digits", 1, "{not json");
    wait_answers(3);
    assert_int_not_equal(bad_config.mc.status, STATUS_OK);
    assert_null(bad_config.mc.config); /* freed by model_control_clear */

    start(rt, repo, &unload, "digits", 0, NULL);
    wait_answers(4);
    assert_int_equal(unload.mc.status, STATUS_OK);
    struct call *calls[] = {&load, &missing, &bad_config, &unload};
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        assert_int_equal(calls[i]->answered, 1);
        assert_int_equal(calls[i]->released, 0);
    }

    /* A call queued after the threads stopped is released at exit, never answered. */
    runtime_stop(rt);
    static struct call late;
    start(rt, repo, &late, "digits", 1, "{}");
    runtime_free(rt);
    assert_int_equal(late.answered, 0);
    assert_int_equal(late.released, 1);
    assert_null(late.mc.config);
    repository_free(repo);
    server_config_clear(&cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_permission_then_drain),
        cmocka_unit_test(test_load_and_unload_answer_on_the_loop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
