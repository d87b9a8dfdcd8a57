/* test_repository.c - the repository's reaper under failing allocations:
 * every release reaches the reaper, so repository_free always returns.
 * Includes repository.c to count live versions and to fail realloc. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static int g_fail_realloc;

static void *failing_realloc(void *p, size_t n) { return g_fail_realloc ? NULL : realloc(p, n); }

#define realloc failing_realloc
#include "server/repository.c"
#undef realloc

static struct repo_version *fake_version(repository_t *r, int64_t ver) {
    struct repo_version *v = calloc(1, sizeof *v);
    assert_non_null(v);
    v->name_ = strdup("m");
    v->name = v->name_;
    v->version = ver;
    snprintf(v->version_str, sizeof v->version_str, "%lld", (long long)ver);
    v->repo_ = r;
    atomic_init(&v->refs, 1);
    model_config_init(&v->config, "m");
    return v;
}

static void test_release_never_drops_a_version(void **state) {
    char dir[] = "/tmp/kiln_test_repository_XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct repository_params p = {.root = dir, .backend = "cpu"};
    char err[512];
    repository_t *r = repository_create(&p, err, sizeof err);
    assert_non_null(r);
    enum { N = 40 };
    struct repo_version *vs[N];
    for (int i = 0; i < N; i++) {
        vs[i] = fake_version(r, i + 1);
        assert_int_equal(reserve_reap_slot(r), 0);
    }
    /* Out of memory from here on: a new version cannot be counted... */
    g_fail_realloc = 1;
    int extra = 0;
    while (reserve_reap_slot(r) == 0) extra++;
    assert_int_equal(r->live, r->reap_cap);
    pthread_mutex_lock(&r->reap_lock);
    r->live -= extra;
    pthread_mutex_unlock(&r->reap_lock);
    /* ...but every counted one is released to the reaper, and free returns. */
    for (int i = 0; i < N; i++) repository_release(vs[i]);
    alarm(20); /* a dropped version would make repository_free wait forever */
    repository_free(r);
    alarm(0);
    g_fail_realloc = 0;
    rmdir(dir);
}

static void expect_relative(const char *root, const char *msg, const char *want) {
    repository_t r = {.root = (char *)root};
    char buf[512];
    snprintf(buf, sizeof buf, "%s", msg);
    relative_to_root(&r, buf);
    assert_string_equal(buf, want);
}

/* Clients see paths relative to the repository, whatever the root looks like. */
static void test_messages_relative_to_root(void **state) {
    expect_relative("/srv/models", "cannot open '/srv/models/m/1/model.onnx': No such file",
                    "cannot open 'm/1/model.onnx': No such file");
    expect_relative("/srv/models", "expected /srv/models/m/1/model.onnx (and /srv/models/m/config.json)",
                    "expected m/1/model.onnx (and m/config.json)");
    expect_relative("/srv/models", "'/srv/models2/x' and /srv/modelsx", "'/srv/models2/x' and /srv/modelsx");
    expect_relative(".", "cannot open './m/labels.txt'; location '../x' escapes", "cannot open 'm/labels.txt'; "
                    "location '../x' escapes");
    expect_relative("models", "'models/m/1/model.onnx' in othermodels/x", "'m/1/model.onnx' in othermodels/x");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_release_never_drops_a_version),
                                       cmocka_unit_test(test_messages_relative_to_root)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
