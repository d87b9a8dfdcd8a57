/* model_control.c - load and unload for every front end: see model_control.h. */
#include "server/model_control.h"

#include <stdlib.h>

#include "common/log.h"
#include "common/status.h"

int model_control_check(runtime_t *rt, const struct server_config *cfg, const char *authorization,
                        enum access_via via, char *err, size_t err_len) {
    int rc = access_check(cfg, authorization, ACCESS_MODEL_CONTROL, via, err, err_len);
    if (!rc && runtime_draining(rt)) rc = status_set(err, err_len, STATUS_UNAVAILABLE, "the server is shutting down");
    return rc;
}

void model_control_clear(struct model_control *mc) {
    free(mc->config);
    mc->config = NULL;
    upload_set_clear(&mc->files);
}

static void answer(void *arg) {
    struct model_control *mc = arg;
    mc->done(mc);
}

static void release(void *arg) {
    struct model_control *mc = arg;
    mc->release(mc);
}

/* On the control thread. */
static void run(void *arg) {
    struct model_control *mc = arg;
    if (mc->load)
        mc->status = repository_load_files(mc->repo, mc->name, mc->config, &mc->files, mc->err, sizeof mc->err);
    else {
        mc->status = repository_unload(mc->repo, mc->name, mc->err, sizeof mc->err);
        if (!mc->status) log_info("unload of model '%s' requested", mc->name);
    }
    runtime_job_init(&mc->job, answer, release, mc);
    runtime_post(mc->loop, &mc->job);
}

void model_control_start(runtime_t *rt, struct model_control *mc) {
    runtime_job_init(&mc->job, run, release, mc);
    runtime_control_post(rt, &mc->job);
}
