/* access.h - who may change the server: the one permission check of model
 * control (load, unload) and client shared memory (register, status,
 * unregister), for both transports.
 *
 * The decision is the server's, not a transport's: HTTP and gRPC ask here
 * and answer the status in their own codes (common/status.h): DISABLED is
 * HTTP 400 / gRPC UNAVAILABLE, UNAUTHENTICATED is HTTP 401 (with
 * WWW-Authenticate: Bearer) / gRPC UNAUTHENTICATED. Whether the server is
 * draining is not a permission and stays with the transports. Pure
 * functions of the configuration: any thread. */
#ifndef KILN_ACCESS_H
#define KILN_ACCESS_H

#include <stddef.h>

#include "server/shm.h"

struct server_config;

enum access_action {
    ACCESS_MODEL_CONTROL, /* load, unload: --model-control-mode explicit and the token */
    ACCESS_SHM,           /* shared-memory register, unregister: --allow-client-shm and the token */
    ACCESS_SHM_STATUS,    /* shared-memory status: the token (without --allow-client-shm the answer is
                           * empty, as Triton's, so that a client may ask before registering) */
};

/* Where the caller's token travels, for the message that names it. */
enum access_via { ACCESS_VIA_HTTP, ACCESS_VIA_GRPC };

/* 1 when this Authorization value ("Bearer TOKEN", NULL when absent)
 * carries --control-token (compared in constant time in the token's
 * content), or no token is set. */
int access_token_ok(const struct server_config *cfg, const char *authorization);

/* 1 when this Authorization value carries one of --openai-api-keys
 * ("Bearer KEY", each compared in constant time in its content), or none is
 * set: the check of OpenAI's API (/v1/). */
int access_api_key_ok(const struct server_config *cfg, const char *authorization);

/* STATUS_OK when a call carrying this Authorization value may do action;
 * else STATUS_DISABLED (the server was started without the feature) or
 * STATUS_UNAUTHENTICATED (the token is missing or wrong), with err saying
 * why. */
int access_check(const struct server_config *cfg, const char *authorization, enum access_action action,
                 enum access_via via, char *err, size_t err_len);

/* The shared-memory scope (server/shm.h) of a call on connection conn with
 * this Authorization value: SHM_OWNER_TOKEN when --control-token is set and
 * the call carries it, else the connection's own. */
shm_owner_t access_shm_owner(const struct server_config *cfg, const char *authorization, shm_owner_t conn);

#endif
