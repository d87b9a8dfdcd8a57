/* test_access.c - the one permission check of model control and client
 * shared memory (server/access.c), as both transports ask it: the feature
 * off is DISABLED, a missing, malformed or wrong token UNAUTHENTICATED, the
 * right one (or none configured) OK; the shared-memory scope follows the
 * token. Configurations are built through server_config_set, as the
 * command line builds them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "common/status.h"
#include "config/server_config.h"
#include "server/access.h"

static void set(struct server_config *c, const char *name, const char *value) {
    char err[256];
    assert_int_equal(server_config_set(c, name, value, "flag", err, sizeof err), 0);
}

static void test_model_control(void **state) {
    (void)state;
    struct server_config c;
    server_config_init(&c);
    char err[300];
    /* Not explicit: refused whatever the caller carries. */
    set(&c, "model-control-mode", "none");
    assert_int_equal(access_check(&c, NULL, ACCESS_MODEL_CONTROL, ACCESS_VIA_HTTP, err, sizeof err), STATUS_DISABLED);
    assert_non_null(strstr(err, "--model-control-mode explicit"));
    set(&c, "model-control-mode", "explicit");
    /* No token configured: open. */
    assert_int_equal(access_check(&c, NULL, ACCESS_MODEL_CONTROL, ACCESS_VIA_HTTP, err, sizeof err), STATUS_OK);
    set(&c, "control-token", "s3cret");
    const char *bad[] = {NULL, "", "s3cret", "Bearer", "Bearer ", "Bearer s3cre", "Bearer s3cret ", "Bearer S3CRET",
                         "bearer s3cret", "Basic s3cret"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(access_check(&c, bad[i], ACCESS_MODEL_CONTROL, ACCESS_VIA_HTTP, err, sizeof err),
                         STATUS_UNAUTHENTICATED);
        assert_non_null(strstr(err, "header 'Authorization: Bearer <control token>'"));
        assert_int_equal(access_check(&c, bad[i], ACCESS_MODEL_CONTROL, ACCESS_VIA_GRPC, err, sizeof err),
                         STATUS_UNAUTHENTICATED);
        assert_non_null(strstr(err, "metadata 'authorization: Bearer <control token>'"));
        assert_false(access_token_ok(&c, bad[i]));
    }
    assert_int_equal(access_check(&c, "Bearer s3cret", ACCESS_MODEL_CONTROL, ACCESS_VIA_GRPC, err, sizeof err),
                     STATUS_OK);
    assert_true(access_token_ok(&c, "Bearer s3cret"));
    server_config_clear(&c);
}

static void test_shared_memory(void **state) {
    (void)state;
    struct server_config c;
    server_config_init(&c);
    char err[300];
    shm_owner_t conn = 42;
    /* Off by default: DISABLED, token or not. */
    assert_int_equal(access_check(&c, "Bearer x", ACCESS_SHM, ACCESS_VIA_HTTP, err, sizeof err), STATUS_DISABLED);
    assert_string_equal(err, SHM_DISABLED_MSG);
    /* Status is answered (empty: nothing can be registered), as Triton's. */
    assert_int_equal(access_check(&c, NULL, ACCESS_SHM_STATUS, ACCESS_VIA_HTTP, err, sizeof err), STATUS_OK);
    set(&c, "allow-client-shm", "true");
    /* On without a token: anyone, each connection its own scope. */
    assert_int_equal(access_check(&c, NULL, ACCESS_SHM, ACCESS_VIA_GRPC, err, sizeof err), STATUS_OK);
    assert_int_equal(access_shm_owner(&c, NULL, conn), conn);
    assert_int_equal(access_shm_owner(&c, "Bearer x", conn), conn);
    set(&c, "control-token", "tok");
    assert_int_equal(access_check(&c, "Bearer nope", ACCESS_SHM, ACCESS_VIA_GRPC, err, sizeof err),
                     STATUS_UNAUTHENTICATED);
    assert_non_null(strstr(err, "need the control token"));
    assert_int_equal(access_check(&c, NULL, ACCESS_SHM, ACCESS_VIA_HTTP, err, sizeof err), STATUS_UNAUTHENTICATED);
    assert_int_equal(access_check(&c, NULL, ACCESS_SHM_STATUS, ACCESS_VIA_HTTP, err, sizeof err),
                     STATUS_UNAUTHENTICATED);
    /* The token's holders share one scope across connections. */
    assert_int_equal(access_check(&c, "Bearer tok", ACCESS_SHM, ACCESS_VIA_HTTP, err, sizeof err), STATUS_OK);
    assert_int_equal(access_shm_owner(&c, "Bearer tok", conn), SHM_OWNER_TOKEN);
    assert_int_equal(access_shm_owner(&c, "Bearer nope", conn), conn);
    server_config_clear(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_control),
        cmocka_unit_test(test_shared_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
