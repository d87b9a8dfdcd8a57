/* model_control.c - load and unload for every front end: see model_control.h. */
#include "server/model_control.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"

int model_control_check(runtime_t *rt, const struct server_config *cfg, const char *authorization,
                        enum access_via via, char *err, size_t err_len) {
    int rc = access_check(cfg, authorization, ACCESS_MODEL_CONTROL, via, err, err_len);
    if (!rc && runtime_draining(rt)) rc = status_set(err, err_len, STATUS_UNAVAILABLE, "the server is shutting down");
    return rc;
}

int model_control_name_check(const char *name, int load, char *err, size_t err_len) {
    const char *a = name ? name : "", *b;
    while (*a && strchr(" \t\n\r\f\v", *a)) a++;
    for (b = a + strlen(a); b > a && strchr(" \t\n\r\f\v", b[-1]); b--) {}
    if (a == b) return status_set(err, err_len, STATUS_INVALID, "Model name cannot be empty. Please enter a valid name to deploy.");
    if (load && (memchr(a, '/', (size_t)(b - a)) || memchr(a, '\\', (size_t)(b - a)) || (b - a == 2 && !memcmp(a, "..", 2))))
        return status_set(err, err_len, STATUS_INVALID,
                          "model name must not contain path traversal characters: '%.200s' is not a folder of the "
                          "model repository", name);
    return STATUS_OK;
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
    if (mc->load) {
        char why[sizeof mc->err];
        mc->status = repository_load_files(mc->repo, mc->name, mc->config, &mc->files, why, sizeof why);
        /* Triton's words first: its clients look for "failed to load". */
        if (mc->status) snprintf(mc->err, sizeof mc->err, "failed to load '%s': %s", mc->name, why);
    }
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
