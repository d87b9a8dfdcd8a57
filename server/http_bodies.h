/* http_bodies.h - bodies of the read-only endpoints: server and model
 * metadata, statistics (Triton's JSON) and the Prometheus metrics page.
 *
 * Each builds a fresh body the caller owns (cJSON_Delete, free). They read
 * shared state through its own thread-safe accessors, so any thread may
 * call them. */
#ifndef KILN_HTTP_BODIES_H
#define KILN_HTTP_BODIES_H

#include <stdint.h>

#include "cache/cache.h"
#include "server/repository.h"

typedef struct cJSON cJSON;

/* GET /v2: name, version, extensions. */
cJSON *http_body_server_metadata(void);
/* GET /v2/models/<name>[/versions/<v>]: versions loaded, platform, inputs, outputs. */
cJSON *http_body_model_metadata(repository_t *repo, const struct repo_version *v);
/* GET /v2/models[/<name>[/versions/<v>]]/stats: every loaded version, or
 * those of model (version 0 = each). NULL with *status and err set when
 * model is given and none of its versions is loaded. */
cJSON *http_body_stats(repository_t *repo, const char *model, int64_t version, int *status, char *err,
                       size_t err_len);
/* GET /metrics: Prometheus text, malloc'd; cache may be NULL. */
char *http_body_metrics(repository_t *repo, cache_t *cache);

#endif
