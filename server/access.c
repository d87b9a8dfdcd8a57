/* access.c - the permission check of model control and client shared
 * memory (server/access.h). */
#include "server/access.h"

#include <string.h>

#include <sodium.h>

#include "common/status.h"
#include "config/server_config.h"

int access_token_ok(const struct server_config *cfg, const char *auth) {
    const char *tok = cfg->control_token;
    if (!tok) return 1;
    if (!auth || strncmp(auth, "Bearer ", 7) != 0) return 0;
    auth += 7;
    size_t a = strlen(auth), b = strlen(tok);
    /* Constant time in the token's content. */
    return a == b && sodium_memcmp(auth, tok, b) == 0;
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
