/* plan_threads.c - the thread count of each step of a host plan: estimated
 * from its work when the plan is built, timed on the plan's first run. */
#include "models/plan_impl.h"

#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"

/* ---- threads per step: the estimate when the plan is built ------------------
 * Starting an OpenMP team for a parallel region costs microseconds (more on a
 * busy machine, where the sleeping thread must be woken), as much as a small
 * node's whole work: at two threads every node of a small model paid it and
 * the model ran slower than on one. So each step of a host plan gets its own
 * thread count, fixed before its kernel is prepared (oneDNN sizes a
 * primitive's work split for the threads in force at its creation). A node
 * with little work runs on the calling thread alone; one with much work on
 * all the plan's threads; one in between is prepared both ways and timed on
 * the plan's first run, with that run's real inputs, and keeps the faster
 * (choose_threads: measured, so it holds on every CPU whatever its vector
 * width or core count, and on a machine other work shares).
 *
 * KILN_STEP_THREADS: unset or "measure" as above; "static" decides by the
 * estimate alone (a step in between keeps all the threads); "0" runs every
 * step on all the threads. */

/* Work (elements read and written, or multiply-adds) below which a node runs
 * on one thread, and above which on all without timing: a few microseconds
 * of work at most, and milliseconds. */
#define STEP_WORK_ONE 8192.0
#define STEP_WORK_ALL 67108864.0

enum step_threads_mode plan_threads_mode(void) {
    const char *e = getenv("KILN_STEP_THREADS");
    if (!e || !*e || !strcmp(e, "measure")) return STEP_THREADS_MEASURE;
    if (!strcmp(e, "static")) return STEP_THREADS_STATIC;
    if (!strcmp(e, "0") || !strcmp(e, "off")) return STEP_THREADS_OFF;
    log_warn("KILN_STEP_THREADS=%s: expected measure, static or 0; measuring", e);
    return STEP_THREADS_MEASURE;
}

static double value_numel(const struct plan *p, int v) {
    return v >= 0 ? (double)tensor_numel(&p->vals[v].t) : 0;
}

/* A rough size of node n's work: the elements it reads and writes, or for a
 * node that contracts a dimension (MatMul, Gemm, convolutions and their
 * fused and quantized forms) its multiply-adds, whichever is larger. */
static double step_work(const struct plan *p, const struct graph_node *n) {
    double elems = 0, macs = 0;
    for (int k = 0; k < n->nin; k++) elems += value_numel(p, n->in[k]);
    for (int k = 0; k < n->nout; k++) elems += value_numel(p, n->out[k]);
    double out = n->nout > 0 ? value_numel(p, n->out[0]) : 0;
    const struct tensor *x = n->nin > 0 && n->in[0] >= 0 ? &p->vals[n->in[0]].t : NULL;
    const struct tensor *w = n->nin > 1 && n->in[1] >= 0 ? &p->vals[n->in[1]].t : NULL;
    if (strstr(n->op_type, "Conv") && w && w->ndim >= 3 && w->dims[0] > 0)
        macs = out * ((double)tensor_numel(w) / (double)w->dims[0]);
    else if ((strstr(n->op_type, "MatMul") || strstr(n->op_type, "Gemm")) && x && x->ndim >= 1)
        macs = out * (double)x->dims[x->ndim - 1];
    return macs > elems ? macs : elems;
}

/* Nodes whose work does not show in their tensors: subgraphs (If, Loop,
 * Scan) and the ai.onnx.ml models, whose trees and vectors are attributes. */
static int work_hidden(const struct graph_node *n) {
    if (n->domain && !strcmp(n->domain, "ai.onnx.ml")) return 1;
    for (int a = 0; a < n->nattr; a++)
        if (n->attrs[a].graphs) return 1;
    return 0;
}

/* Decides step s's thread count (and whether it is measured) before its
 * kernel is prepared. Device plans and one-thread plans keep the plan's. */
void plan_threads_decide(struct plan *p, struct pstep *s, enum step_threads_mode mode) {
    s->nthreads = p->nthreads;
    s->measured = 0;
    if (!p->host || p->nthreads < 2 || mode == STEP_THREADS_OFF) return;
    const struct graph_node *n = &p->g->nodes[s->node];
    double work = step_work(p, n);
    if (work >= STEP_WORK_ALL) return;
    if (work < STEP_WORK_ONE && !work_hidden(n)) s->nthreads = 1;
    else if (mode == STEP_THREADS_MEASURE) s->measured = 1;
}

/* ---- threads per step: timing on the plan's first run ---------------------------- */

/* Whole timed runs per configuration of the measured steps, at most, and
 * the time they may take together (the plan's first run pays it, once per
 * input shape): a large model gets fewer runs (at least one each), and none
 * when the plan's first run alone took longer, and then its measured steps
 * keep all the threads (the static choice). The first run is cold (page
 * faults in a new arena, caches), often ten times a warm one: a small
 * model's first run does not exclude it. */
#define TIMING_RUNS 9
#define TIMING_BUDGET_MS 100.0

/* A choice that leaves threads idle may have been timed while other work
 * held the other cores (a shared VM's neighbour, another process): the runs
 * on all threads then wait for a core and lose to one thread, and the plan
 * kept running at one core's speed after the burst was over (MobileViT-XXS
 * at two threads: 14.0 ms a run timed on all threads, 13.7 on one, so 14.3
 * ms a run for the whole process where a quiet timing gives 7.7). Such a
 * choice is timed again, on a run's real inputs like the first: RECHECK_MS
 * after it, then ten and a hundred times that, until all threads win or
 * RECHECKS timings were made. Each costs one run what the first timing cost
 * (TIMING_BUDGET_MS at most); the outputs of the runs after a change of
 * choice may differ in the last bits, as between thread counts. */
#define RECHECK_MS 250.0
#define RECHECKS 3

/* Points the calls of the measured steps at the variant for all the
 * threads, for one, or at the one each chose. */
static void configure_measured(struct plan_exec *x, const struct plan *p, enum step_config cfg) {
    for (int si = 0; si < p->nsteps; si++) {
        const struct pstep *s = &p->steps[si];
        if (!s->measured) continue;
        int one = cfg == MEASURED_ONE ||
                  (cfg == MEASURED_CHOSEN && atomic_load_explicit(&s->chosen, memory_order_relaxed) == 1);
        x->calls[si].state = one ? s->state_one : s->state;
        x->calls[si].nthreads = one ? 1 : s->nthreads;
    }
}

/* Runs the plan n times more in configuration cfg (every step recomputes
 * its outputs from its inputs, so the results stay those of this run),
 * keeping each step's fastest time in best[] (if not NULL) and returning
 * the fastest whole run in *run_ms. */
static int timed_runs(struct plan_exec *x, struct plan *p, enum step_config cfg, int n, double *times, double *best,
                      double *run_ms, char *err, size_t err_len) {
    configure_measured(x, p, cfg);
    *run_ms = 1e300;
    for (int r = 0; r < n; r++) {
        double t0 = now_ms();
        int rc = plan_exec_steps(x, p, times, err, err_len);
        if (rc) return rc;
        double ms = now_ms() - t0;
        if (ms < *run_ms) *run_ms = ms;
        for (int si = 0; best && si < p->nsteps; si++)
            if (times[si] < best[si]) best[si] = times[si];
    }
    return 0;
}

/* Chooses the thread count of each measured step by timing whole runs of
 * the plan on this run's inputs: the measured steps all on all threads, all
 * on one, and each on its own best count (all threads where they took at
 * most 85% of its time on one). Whole runs, not one step again and again,
 * because a step's cost depends on its neighbours: a step reads its input
 * from the other cores' caches when the step before ran on other threads,
 * and the team's threads sleep, or lose their cores on a busy machine, over
 * a long stretch on one. So a plan of large tensors may do best with every
 * step on all threads and a small plan with every step on one. The fastest
 * of the three wins; one that uses more threads must be 3% faster than one
 * that uses fewer (within the noise, a thread left idle serves other
 * instances and requests). Each configuration runs twice in a row and keeps
 * its faster run: the first after the other configuration pays for data in
 * the other core's cache and sleeping workers (efficientnet_b0 on 2 threads
 * timed 9.0-9.4 ms so, 7.6-7.9 in steady runs, and lost to one thread). */
static int choose_threads(struct plan_exec *x, struct plan *p, double first_ms, char *err, size_t err_len) {
    if (first_ms > TIMING_BUDGET_MS) {
        log_debug("one run takes %.1f ms: the %d measured steps keep %d threads untimed", first_ms, p->nmeasured,
                  p->nthreads);
        atomic_store_explicit(&p->recheck, 0, memory_order_relaxed);
        return 0;
    }
    int ns = p->nsteps > 0 ? p->nsteps : 1;
    double *times = malloc((size_t)ns * 3 * sizeof *times);
    if (!times) return status_set(err, err_len, STATUS_NOMEM, "out of memory timing the plan's steps");
    double *best_all = times + ns, *best_one = times + 2 * ns;
    for (int si = 0; si < ns; si++) best_all[si] = best_one[si] = 1e300;
    int profile = x->profile; /* these runs are not the caller's */
    x->profile = 0;
    double all_ms = 0, one_ms = 0, chosen_ms = 0, t0 = now_ms();
    int rc = 0, nall = 0;
    for (int r = 0; r < TIMING_RUNS && !rc && (r == 0 || now_ms() - t0 + all_ms + one_ms <= TIMING_BUDGET_MS); r++) {
        double ms;
        rc = timed_runs(x, p, MEASURED_ALL, 2, times, best_all, &ms, err, err_len);
        if (!rc) all_ms = r ? (ms < all_ms ? ms : all_ms) : ms;
        if (!rc) rc = timed_runs(x, p, MEASURED_ONE, 2, times, best_one, &ms, err, err_len);
        if (!rc) one_ms = r ? (ms < one_ms ? ms : one_ms) : ms;
    }
    for (int si = 0; si < p->nsteps && !rc; si++) {
        struct pstep *s = &p->steps[si];
        if (!s->measured) continue;
        int nt = best_all[si] <= 0.85 * best_one[si] ? s->nthreads : 1;
        nall += nt > 1;
        atomic_store_explicit(&s->chosen, nt, memory_order_relaxed);
        log_debug("step %d '%s' (%s): %.1f us on %d threads, %.1f us on 1: runs on %d", si,
                  p->g->nodes[s->node].name, p->g->nodes[s->node].op_type, best_all[si] * 1e3, s->nthreads,
                  best_one[si] * 1e3, nt);
    }
    int mixed = nall > 0 && nall < p->nmeasured;
    if (!rc && mixed) {
        double left = TIMING_BUDGET_MS - (now_ms() - t0), run = all_ms < one_ms ? all_ms : one_ms;
        int n = left > run * TIMING_RUNS ? TIMING_RUNS : left > run ? (int)(left / run) : 1;
        rc = timed_runs(x, p, MEASURED_CHOSEN, n, times, NULL, &chosen_ms, err, err_len);
    }
    x->profile = profile;
    free(times);
    if (rc) return rc;
    enum step_config pick = MEASURED_ONE;
    double pick_ms = one_ms;
    if (mixed && chosen_ms < 0.97 * pick_ms) {
        pick = MEASURED_CHOSEN;
        pick_ms = chosen_ms;
    }
    if (all_ms < 0.97 * pick_ms) pick = MEASURED_ALL;
    for (int si = 0; si < p->nsteps && pick != MEASURED_CHOSEN; si++)
        if (p->steps[si].measured)
            atomic_store_explicit(&p->steps[si].chosen, pick == MEASURED_ALL ? p->steps[si].nthreads : 1,
                                  memory_order_relaxed);
    log_debug("measured steps all on %d threads: %.3f ms a run; all on 1: %.3f ms; %d of %d on %d: %.3f ms; "
              "runs %s", p->nthreads, all_ms, one_ms, nall, p->nmeasured, p->nthreads, mixed ? chosen_ms : 0.0,
              pick == MEASURED_ALL ? "all on all" : pick == MEASURED_ONE ? "all on 1" : "each on its own");
    /* Other executors read the choices after p->timed's release store
     * (run_host_measured), which publishes them, or after gen's when they
     * were made again. */
    atomic_store_explicit(&p->pick, 1 + (int)pick, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    plan_exec_bind_choices(x, p);
    if (pick != MEASURED_ALL && p->nrechecks < RECHECKS) {
        double wait = RECHECK_MS;
        for (int i = 0; i < p->nrechecks; i++) wait *= 10;
        p->recheck_at = now_ms() + wait;
        atomic_store_explicit(&p->recheck, 1, memory_order_release);
    } else {
        atomic_store_explicit(&p->recheck, 0, memory_order_relaxed);
    }
    /* The caller's outputs come from the configuration kept, as the next
     * runs' will: oneDNN's AVX2 GEMM rounds differently per thread count. */
    if (pick != (mixed ? MEASURED_CHOSEN : MEASURED_ONE)) {
        x->profile = 0;
        rc = plan_exec_steps(x, p, NULL, err, err_len);
        x->profile = profile;
    }
    return rc;
}

/* Logs how a plan's steps divide between one thread and all of them: at
 * info level under KILN_PROFILE, with the profile. */
static void log_threads(const struct plan *p, int profile) {
    if (!profile && !log_enabled(LOG_DEBUG)) return;
    int one = 0, timed_one = 0;
    for (int si = 0; si < p->nsteps; si++) {
        int nt;
        step_state(&p->steps[si], &nt);
        one += nt == 1;
        timed_one += p->steps[si].measured && nt == 1;
    }
    log_write(profile ? LOG_INFO : LOG_DEBUG, __func__,
              "plan threads: %d of %d steps on 1 thread, %d on %d; %d measured (%d of them on 1)", one, p->nsteps,
              p->nsteps - one, p->nthreads, p->nmeasured, timed_one);
}

/* Host plans with measured steps: the first executor to run the plan runs
 * it, then times it again on the same inputs to choose their thread counts
 * (choose_threads: a few milliseconds of a small model's first run, a few
 * whole runs of a large one's); another executor running the plan meanwhile
 * uses all the threads for them, and the choices once made. */
int plan_threads_run_measured(struct plan_exec *x, struct plan *p, char *err, size_t err_len) {
    if (!x->choices_bound) {
        int st = atomic_load_explicit(&p->timed, memory_order_acquire);
        if (st == 2) {
            plan_exec_bind_choices(x, p);
        } else if (st == 0 && atomic_compare_exchange_strong(&p->timed, &st, 1)) {
            double t0 = now_ms();
            int rc = plan_exec_steps(x, p, NULL, err, err_len);
            if (!rc) rc = choose_threads(x, p, now_ms() - t0, err, err_len);
            atomic_store_explicit(&p->timed, rc ? 0 : 2, memory_order_release);
            if (rc) return rc;
            x->choices_bound = 1;
            log_threads(p, x->profile);
            return 0;
        }
    } else if (x->bound_gen != atomic_load_explicit(&p->gen, memory_order_acquire)) {
        plan_exec_bind_choices(x, p); /* made again by another executor */
    }
    int due = 1;
    if (x->choices_bound && atomic_load_explicit(&p->recheck, memory_order_acquire) == 1 && now_ms() >= p->recheck_at &&
        atomic_compare_exchange_strong(&p->recheck, &due, 2)) {
        p->nrechecks++;
        log_debug("timing the %d measured steps again (%d of %d): the last choice left threads idle", p->nmeasured,
                  p->nrechecks, RECHECKS);
        double t0 = now_ms();
        int rc = plan_exec_steps(x, p, NULL, err, err_len);
        if (!rc) rc = choose_threads(x, p, now_ms() - t0, err, err_len);
        if (rc) atomic_store_explicit(&p->recheck, 0, memory_order_relaxed);
        else log_threads(p, x->profile);
        return rc;
    }
    return plan_exec_steps(x, p, NULL, err, err_len);
}

