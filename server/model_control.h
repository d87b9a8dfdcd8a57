/* model_control.h - a model load or unload asked by a client, the same
 * for every front end: the check (permission, then the drain), the
 * repository call on the runtime's control thread (it may take seconds),
 * and the answer back on the caller's loop.
 *
 * A front end embeds struct model_control in its own call (its request,
 * its stream) and gives the two ends: done answers the client on the loop,
 * release frees the front end's call when the runtime goes before done
 * ran (exiting). The load is not undone when the client has left by then.
 *
 * Threads: check from any thread; start on a loop; done on that loop. */
#ifndef KILN_MODEL_CONTROL_H
#define KILN_MODEL_CONTROL_H

#include <stddef.h>

#include "server/access.h"
#include "server/repository.h"
#include "server/runtime.h"
#include "server/upload.h"

struct model_control {
    struct runtime_job job;      /* on the control thread, then back on loop */
    struct runtime_loop *loop;   /* where done runs */
    repository_t *repo;
    char name[256];
    char *config;                /* load parameter "config": JSON text replacing config.json; freed here */
    struct upload_set files;     /* load parameters "file:<version>/<name>" (server/upload.h); cleared here */
    int load;                    /* 1 load, 0 unload */
    int status;                  /* the repository's answer, for done */
    char err[512];
    void (*done)(struct model_control *mc);    /* answers, frees the front end's call (model_control_clear first) */
    void (*release)(struct model_control *mc); /* frees it unanswered (model_control_clear first) */
};

/* The checks a load or unload passes, each owned elsewhere and asked here
 * for both transports: the permission (access_check: --model-control-mode
 * explicit and the control token), then the drain (runtime_draining).
 * STATUS_OK, or a status with err saying why. */
int model_control_check(runtime_t *rt, const struct server_config *cfg, const char *authorization,
                        enum access_via via, char *err, size_t err_len);
/* The model name a load or unload names, as Triton checks it: empty or
 * only white space is "Model name cannot be empty...", and a load's name
 * with a '/' or '\\', or "..", once spaces around it are trimmed, "model name
 * must not contain path traversal characters" (an unload only looks the
 * name up). STATUS_OK or STATUS_INVALID with err set. */
int model_control_name_check(const char *name, int load, char *err, size_t err_len);
/* Runs the load or unload of mc->name on the control thread, then mc->done
 * on mc->loop. mc's fields up to done and release are set by the caller;
 * mc->config (malloc'd or NULL) and mc->files are taken. */
void model_control_start(runtime_t *rt, struct model_control *mc);
/* Frees what mc holds (its config and files), not mc. */
void model_control_clear(struct model_control *mc);

#endif
