/* serve.c - `kiln serve`: configuration, backend choice, model repository,
 * the inference core and the runtime (I/O loops, control thread), the HTTP
 * and gRPC front ends attached to it as peers, and the signal-driven
 * graceful shutdown.
 *
 * Signals are blocked in every thread and taken synchronously by the main
 * thread with sigtimedwait, so no handler runs inside libevent or a kernel.
 * First SIGTERM: ready turns false while work is still served for
 * --shutdown-delay-secs (balancers take the server out meanwhile); then, as
 * at once on SIGINT, new work gets 503 and the main thread waits for every
 * accepted request to be answered, then exits 0. A second signal, or
 * --exit-timeout-secs (from the drain's start), forces the exit with status 1. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "config/server_config.h"
#include "kernels/backend.h"
#include "server/repository.h"
#include "commands/commands.h"
#include "server/grpc.h"
#include "server/http.h"
#include "server/infer.h"
#include "server/kserve.h"
#include "server/runtime.h"

static uint64_t mono_ms(void) { return clock_now_ns() / 1000000; }

/* Picks "cpu" or "cuda" from --backend; NULL (error logged) when cuda was required but is unusable. */
static const char *choose_backend(const char *want) {
    if (strcmp(want, "cpu") == 0) return "cpu";
    char why[512] = "";
    int n = backend_available("cuda", why, sizeof why);
    if (n > 0) {
        log_info("backend: cuda (%d device%s)", n, n == 1 ? "" : "s");
        return "cuda";
    }
    if (strcmp(want, "cuda") == 0) {
        log_error("--backend cuda: no usable GPU: %s", why[0] ? why : "no device found");
        return NULL;
    }
    log_info("backend auto: using the CPU (%s)", why[0] ? why : "no usable GPU");
    return "cpu";
}

static int load_initial(repository_t *repo, const struct server_config *cfg) {
    if (cfg->model_control_mode != SERVER_CONTROL_EXPLICIT) return repository_load_all(repo);
    int failed = 0;
    char err[512];
    for (int i = 0; i < cfg->nload_model; i++) {
        if (strcmp(cfg->load_model[i], "*") == 0) failed += repository_load_all(repo);
        else {
            int rc = repository_load(repo, cfg->load_model[i], err, sizeof err);
            /* The repository logs every other failure itself. */
            if (rc == STATUS_NOT_FOUND) log_error("--load-model %s: %s", cfg->load_model[i], err);
            if (rc) failed++;
        }
    }
    return failed;
}

/* Connections each take a file descriptor, and the soft limit (often 1024)
 * is far below what a server needs: take the hard limit. */
static void raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return;
    unsigned long long was = (unsigned long long)rl.rlim_cur;
    if (rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl)) {
            log_warn("open file limit stays at %llu: cannot raise it to the hard limit %llu: %s", was,
                     (unsigned long long)rl.rlim_max, strerror(errno));
            return;
        }
        log_info("open file limit raised from %llu to the hard limit %llu", was, (unsigned long long)rl.rlim_cur);
    } else log_info("open file limit: %llu (the hard limit)", was);
}

/* SIGTERM's first phase: ready is false already, and every request is still
 * served for --shutdown-delay-secs, the time a load balancer's health checks
 * (or an orchestrator's endpoint update) take to stop sending here. A server
 * that refused work at once would fail the requests the balancer still
 * routes to it: HAProxy, like most, retries refused connections only, never
 * a 503. 1 when a second signal asks for the exit now. */
static int leave_delay(sigset_t *sigs, const struct server_config *cfg, infer_core_t *core) {
    log_info("received SIGTERM: not ready; serving for %d s more (--shutdown-delay-secs) while balancers take this "
             "server out, then draining (%d request%s in flight)", cfg->shutdown_delay_secs, infer_core_inflight(core),
             infer_core_inflight(core) == 1 ? "" : "s");
    uint64_t until = mono_ms() + (uint64_t)cfg->shutdown_delay_secs * 1000;
    struct timespec tick = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
    while (mono_ms() < until) {
        int sig = sigtimedwait(sigs, NULL, &tick);
        if (sig == SIGTERM || sig == SIGINT) {
            log_error("second signal during --shutdown-delay-secs: forcing the exit");
            return 1;
        }
    }
    return 0;
}

int cmd_serve(int argc, char **argv) {
    struct server_config cfg;
    server_config_init(&cfg);
    char err[512];
    int rc = server_config_load(&cfg, argc, argv, err, sizeof err);
    if (rc) {
        if (rc < 0) fprintf(stderr, "kiln serve: %s\n", err);
        server_config_clear(&cfg);
        return rc == 1 ? 0 : 2;
    }
    log_set_level((enum log_level)log_level_parse(cfg.log_level));
    log_set_json(strcmp(cfg.log_format, "json") == 0);
    raise_fd_limit();
    if (server_config_control_unprotected(&cfg))
        log_warn("model control %s without --control-token on %s: anyone who reaches the port can load and unload "
                 "models (--allow-unauthenticated-control)", server_control_mode_name(cfg.model_control_mode),
                 cfg.http_address);

    /* Every thread created from here on inherits the blocked set. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int exit_code = 1;
    repository_t *repo = NULL;
    infer_core_t *core = NULL;
    runtime_t *rt = NULL;
    http_server_t *srv = NULL;
    grpc_server_t *grpc = NULL;
    const char *backend = choose_backend(cfg.backend);
    if (!backend) goto out;
    /* More instances or intra-op threads than this only oversubscribe the
     * cores; the bounds keep a load request from starting thousands. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    if (cfg.max_model_instances <= 0) cfg.max_model_instances = (int)(4 * cores > 1024 ? 1024 : 4 * cores);
    if (cfg.max_intra_op_threads <= 0) cfg.max_intra_op_threads = (int)(cores > 1024 ? 1024 : cores);
    struct repository_params rp = {.root = cfg.model_repository,
                                   .backend = backend,
                                   .max_instances = cfg.max_model_instances,
                                   .max_intra_op_threads = cfg.max_intra_op_threads,
                                   .inline_max_us = (uint64_t)cfg.inline_max_us,
                                   .max_request_memory = (size_t)server_config_max_request_memory(&cfg)};
    /* Before the core: the result cache's keys and the token check use it. */
    if (sodium_init() < 0) {
        log_error("libsodium failed to initialize");
        goto out;
    }
    kserve_set_max_request_memory(rp.max_request_memory);
    repo = repository_create(&rp, err, sizeof err);
    if (!repo) {
        log_error("%s", err);
        goto out;
    }
    log_info("kiln %s: model repository %s, model control %s", KILN_VERSION, cfg.model_repository,
             server_control_mode_name(cfg.model_control_mode));
    int failed = load_initial(repo, &cfg);
    if (failed) log_warn("%d model%s failed to load (see above); serving the others", failed, failed == 1 ? "" : "s");
    cJSON *index = repository_index(repo, 0);
    if (cJSON_GetArraySize(index) == 0)
        log_warn("model repository %s holds no model folder (expected %s/<model>/1/model.onnx): no model to serve",
                 cfg.model_repository, cfg.model_repository);
    cJSON_Delete(index);
    /* The core, then the runtime; the front ends attach to its loops before
     * they run. */
    struct infer_core_params ip = {.config = &cfg, .repo = repo};
    core = infer_core_create(&ip, err, sizeof err);
    struct runtime_params tp = {.config = &cfg, .core = core, .repo = repo};
    rt = core ? runtime_create(&tp, err, sizeof err) : NULL;
    struct http_server_params hp = {.config = &cfg, .runtime = rt, .repo = repo};
    srv = rt ? http_server_create(&hp, err, sizeof err) : NULL;
    struct grpc_server_params gp = {.config = &cfg, .repo = repo, .runtime = rt};
    if (!srv || (cfg.allow_grpc && !(grpc = grpc_server_create(&gp, err, sizeof err))) ||
        runtime_start(rt, err, sizeof err)) {
        log_error("%s", err);
        goto out;
    }
    /* Only now: a client that read the line finds the server answering. */
    int loops = runtime_loops(rt);
    log_info("listening on http://%s:%d (%d I/O thread%s, backend %s)", cfg.http_address, http_server_port(srv), loops,
             loops == 1 ? "" : "s", backend);
    if (grpc)
        log_info("listening on grpc://%s:%d (on the %d I/O thread%s)", cfg.grpc_address ? cfg.grpc_address : cfg.http_address,
                 grpc_server_port(grpc), loops, loops == 1 ? "" : "s");

    struct timespec tick = {.tv_sec = 0, .tv_nsec = 20 * 1000 * 1000};
    int sig;
    do sig = sigwaitinfo(&sigs, NULL);
    while (sig != SIGTERM && sig != SIGINT);
    runtime_leave(rt);
    grpc_server_begin_drain(grpc); /* health watchers hear NOT_SERVING now */
    if (sig == SIGTERM && cfg.shutdown_delay_secs > 0 && leave_delay(&sigs, &cfg, core)) _exit(1);
    log_info("received %s: draining (%d request%s in flight); a second signal forces the exit",
             sig == SIGTERM ? "SIGTERM" : "SIGINT", infer_core_inflight(core), infer_core_inflight(core) == 1 ? "" : "s");
    runtime_begin_drain(rt);
    uint64_t deadline = mono_ms() + (uint64_t)cfg.exit_timeout_secs * 1000, idle_since = 0;
    for (;;) {
        /* Text work first: its done begins requests before the count drops. */
        int work = runtime_work_pending(rt), inflight = infer_core_inflight(core), pending = repository_pending(repo);
        if (work == 0 && inflight == 0 && pending == 0) {
            /* Answered; wait for the bytes to be written (bounded: a reply to a
             * client that vanished mid-write never reports completion). */
            if (!idle_since) idle_since = mono_ms();
            if (http_server_unflushed(srv) == 0 || mono_ms() - idle_since > 2000) break;
        }
        if (mono_ms() >= deadline) {
            log_error("exit timeout (%d s) with %d request%s still in flight: forcing the exit", cfg.exit_timeout_secs,
                      inflight, inflight == 1 ? "" : "s");
            _exit(1);
        }
        int sig = sigtimedwait(&sigs, NULL, &tick);
        if (sig == SIGTERM || sig == SIGINT) {
            log_error("second signal with %d request%s in flight: forcing the exit", inflight, inflight == 1 ? "" : "s");
            _exit(1);
        }
    }
    log_info("drained: every accepted request was answered; exiting");
    exit_code = 0;
out:
    /* The loops stop first: then the front ends close their connections
     * from here, and the jobs still queued are dropped with the runtime. */
    runtime_stop(rt);
    grpc_server_free(grpc);
    http_server_free(srv);
    runtime_free(rt);
    infer_core_free(core);
    repository_free(repo);
    server_config_clear(&cfg);
    return exit_code;
}
