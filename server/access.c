/* access.c - the permission check of model control and client shared
 * memory (server/access.h). */
#include "server/access.h"

#include <string.h>

#include <sodium.h>

#include "common/status.h"
#include "config/server_config.h"

/* 1 when auth is "Bearer " and then tok[0..n): constant time in the token's content. */
static int bearer_is(const char *auth, const char *tok, size_t n) {
    if (!auth || strncmp(auth, "Bearer ", 7) != 0) return 0;
    auth += 7;
    return strlen(auth) == n && sodium_memcmp(auth, tok, n) == 0;
}

int access_token_ok(const struct server_config *cfg, const char *auth) {
    const char *tok = cfg->control_token;
    return !tok || bearer_is(auth, tok, strlen(tok));
}

int access_api_key_ok(const struct server_config *cfg, const char *auth) {
    const char *keys = cfg->openai_api_keys;
    if (!keys) return 1;
    int ok = 0;
    /* Every key is compared, so that the time does not say which matched. */
    for (const char *p = keys; *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        ok |= bearer_is(auth, p, n);
        p += n + (e ? 1 : 0);
    }
    return ok;
}

int access_check(const struct server_config *cfg, const char *auth, enum access_action action, enum access_via via,
                 char *err, size_t err_len) {
    if (action == ACCESS_SHM || action == ACCESS_SHM_STATUS) {
        if (action == ACCESS_SHM && !cfg->allow_client_shm)
            return status_set(err, err_len, STATUS_DISABLED, "%s", SHM_DISABLED_MSG);
        if (!access_token_ok(cfg, auth))
            return status_set(err, err_len, STATUS_UNAUTHENTICATED,
                              "shared memory register, status and unregister need the control token: "
                              "'Authorization: Bearer <control token>'");
        return STATUS_OK;
    }
    if (cfg->model_control_mode != SERVER_CONTROL_EXPLICIT)
        return status_set(err, err_len, STATUS_DISABLED,
                          "explicit model load / unload is not allowed: start kiln with --model-control-mode explicit");
    if (!access_token_ok(cfg, auth))
        return status_set(err, err_len, STATUS_UNAUTHENTICATED, "load and unload need the %s",
                          via == ACCESS_VIA_GRPC ? "metadata 'authorization: Bearer <control token>'"
                                                 : "header 'Authorization: Bearer <control token>'");
    return STATUS_OK;
}

shm_owner_t access_shm_owner(const struct server_config *cfg, const char *auth, shm_owner_t conn) {
    return cfg->control_token && access_token_ok(cfg, auth) ? SHM_OWNER_TOKEN : conn;
}
