/* plan_exec.c - executors: a plan bound to an arena, run step by step on a
 * backend (CPU fallback steps, device graph capture and replay). */
#include "models/plan_impl.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"

/* ---- executors ------------------------------------------------------------------ */

struct prof_entry {
    const char *op_type;
    double ms;
    int64_t calls;
    int64_t calls_one; /* of them on one thread (see "threads per step") */
};

static void prof_add(struct plan_exec *x, const char *op_type, double ms, int nthreads) {
    for (int i = 0; i < x->nprof; i++)
        if (strcmp(x->prof[i].op_type, op_type) == 0) {
            x->prof[i].ms += ms;
            x->prof[i].calls++;
            x->prof[i].calls_one += nthreads == 1;
            return;
        }
    struct prof_entry *np = realloc(x->prof, (size_t)(x->nprof + 1) * sizeof *np);
    if (!np) return;
    x->prof = np;
    x->prof[x->nprof++] = (struct prof_entry){op_type, ms, 1, nthreads == 1};
}

static int prof_cmp(const void *a, const void *b) {
    double x = ((const struct prof_entry *)a)->ms, y = ((const struct prof_entry *)b)->ms;
    return x > y ? -1 : (x < y ? 1 : 0);
}

static void prof_dump(struct plan_exec *x) {
    if (!x->nprof || !x->nruns) return;
    qsort(x->prof, (size_t)x->nprof, sizeof *x->prof, prof_cmp);
    double total = 0;
    for (int i = 0; i < x->nprof; i++) total += x->prof[i].ms;
    log_info("profile over %llu runs: %.3f ms per run in kernels", (unsigned long long)x->nruns, total / (double)x->nruns);
    for (int i = 0; i < x->nprof; i++)
        log_info("  %-24s %9.3f ms/run %5.1f%% %6lld calls, %6lld on 1 thread", x->prof[i].op_type,
                 x->prof[i].ms / (double)x->nruns, 100.0 * x->prof[i].ms / (total > 0 ? total : 1),
                 (long long)x->prof[i].calls, (long long)x->prof[i].calls_one);
}

struct plan_exec *plan_exec_create(struct backend *be, int nthreads) {
    if (!be) return NULL;
    struct plan_exec *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    x->be = be;
    x->host = be->host_memory;
    x->nthreads = nthreads > 0 ? nthreads : 1;
    if (!(x->strings = op_strpool_create())) {
        free(x);
        return NULL;
    }
    const char *pe = getenv("KILN_PROFILE");
    x->profile = pe && *pe && strcmp(pe, "0") != 0;
    return x;
}

static void drop_graph(struct plan_exec *x) {
    if (x->graph && x->be->iface->graph_free) x->be->iface->graph_free(x->be, x->graph);
    x->graph = NULL;
    x->graph_runs = 0;
    x->graph_off = 0;
}

static void arena_free(struct plan_exec *x) {
    if (!x->arena) return;
    if (x->host) free(x->arena);
    else x->be->iface->buffer_free(x->be, x->arena);
    x->arena = NULL;
    x->arena_cap = 0;
}

void plan_exec_free(struct plan_exec *x) {
    if (!x) return;
    prof_dump(x);
    free(x->prof);
    drop_graph(x);
    plan_release(x->bound);
    arena_free(x);
    free(x->mirror);
    free(x->stage);
    free(x->tv);
    free(x->tvh);
    free(x->calls);
    op_strpool_free(x->strings);
    free(x);
}

struct backend *plan_exec_backend(const struct plan_exec *x) { return x->be; }
int plan_exec_nthreads(const struct plan_exec *x) { return x->nthreads; }
struct plan *plan_exec_bound(const struct plan_exec *x) { return x->bound; }

void plan_exec_set_cuda_graphs(struct plan_exec *x, int on) {
    x->graphs_disabled = !on;
    if (!on) drop_graph(x);
}

static void fill_call(struct op_call *c, const struct plan *p, const struct pstep *s, struct tensor *tv,
                      char *base, size_t scratch_off, struct op_strpool *strings) {
    const struct graph_node *n = &p->g->nodes[s->node];
    memset(c, 0, sizeof *c);
    c->node = n;
    c->nin = n->nin;
    c->nout = n->nout;
    for (int k = 0; k < n->nin; k++) c->in[k] = n->in[k] >= 0 ? &tv[n->in[k]] : NULL;
    for (int k = 0; k < n->nout; k++) c->out[k] = n->out[k] >= 0 ? &tv[n->out[k]] : NULL;
    c->state = step_state(s, &c->nthreads);
    c->scratch = s->scratch_size ? base + scratch_off : NULL;
    c->scratch_size = s->scratch_size;
    c->strings = strings;
}

/* Whether every call of the bound plan runs on the calling thread alone. */
static void note_one_thread(struct plan_exec *x, const struct plan *p) {
    int one = x->host && x->choices_bound;
    for (int si = 0; one && si < p->nsteps; si++) one = x->calls[si].nthreads <= 1;
    x->one_thread = one;
}

/* Points the calls of measured steps at the variant their timing chose. */
void plan_exec_bind_choices(struct plan_exec *x, const struct plan *p) {
    /* the generation first: choices newer than it are caught at the next run */
    x->bound_gen = atomic_load_explicit(&((struct plan *)p)->gen, memory_order_acquire);
    for (int si = 0; si < p->nsteps; si++)
        if (p->steps[si].measured) x->calls[si].state = step_state(&p->steps[si], &x->calls[si].nthreads);
    x->choices_bound = 1;
    note_one_thread(x, p);
}

int plan_exec_one_thread(const struct plan_exec *x, const struct tensor *inputs, int ninputs) {
    return x->bound && x->one_thread && plan_matches(x->bound, inputs, ninputs);
}

/* Points the executor's tensors and call records at p and the arena. Done
 * when the plan or the arena changes, never per run. */
static int bind(struct plan_exec *x, struct plan *p, char *err, size_t err_len) {
    drop_graph(x); /* it holds the old arena's and plan's pointers */
    /* Unbound until this succeeds, so a half-done bind is never trusted. */
    plan_release(x->bound);
    x->bound = NULL;
    if (p->arena_size > x->arena_cap || !x->arena) {
        arena_free(x);
        size_t cap = align_up(p->arena_size ? p->arena_size : PLAN_ALIGN);
        x->arena = x->host ? aligned_alloc(PLAN_ALIGN, cap) : x->be->iface->buffer_alloc(x->be, cap);
        if (!x->arena)
            return status_set(err, err_len, STATUS_NOMEM, "out of memory for a %zu-byte arena", cap);
        x->arena_cap = cap;
    }
    if (p->nfallback && p->mirror_size > x->mirror_cap) {
        free(x->mirror);
        x->mirror = aligned_alloc(PLAN_ALIGN, align_up(p->mirror_size));
        x->mirror_cap = x->mirror ? align_up(p->mirror_size) : 0;
        if (!x->mirror) return status_set(err, err_len, STATUS_NOMEM, "out of memory for a host arena");
    }
    int nv = p->nvals > 0 ? p->nvals : 1;
    /* For each absent output a node has, a dummy tensor sits past the values. */
    int nextra = OP_MAX_IO;
    if (nv + nextra > x->tv_cap) {
        free(x->tv);
        free(x->tvh);
        x->tv_cap = 0;
        x->tv = malloc((size_t)(nv + nextra) * sizeof *x->tv);
        x->tvh = malloc((size_t)(nv + nextra) * sizeof *x->tvh);
        if (!x->tv || !x->tvh) return status_set(err, err_len, STATUS_NOMEM, "out of memory binding a plan");
        x->tv_cap = nv + nextra;
    }
    if (p->nsteps > x->calls_cap) {
        free(x->calls);
        x->calls_cap = 0;
        x->calls = malloc((size_t)p->nsteps * sizeof *x->calls);
        if (!x->calls) return status_set(err, err_len, STATUS_NOMEM, "out of memory binding a plan");
        x->calls_cap = p->nsteps;
    }
    char *base = x->arena, *hbase = x->mirror;
    for (int v = 0; v < p->nvals; v++) {
        const struct pval *pv = &p->vals[v];
        x->tv[v] = pv->t;
        x->tv[v].dtype = pv->ddt ? pv->ddt : pv->t.dtype;
        x->tvh[v] = pv->t;
        switch (pv->kind) {
        case PLAN_VALUE_CONST:
            x->tv[v].data = x->host ? pv->t.data
                                    : pv->dev ? pv->dev : (pv->size ? (char *)p->dev_consts + pv->off : NULL);
            break;
        case PLAN_VALUE_ARENA:
            x->tv[v].data = base + pv->off;
            x->tvh[v].data = hbase ? hbase + pv->hoff : NULL;
            break;
        default:
            x->tv[v].data = NULL;
            x->tvh[v].data = NULL;
        }
    }
    x->bound_gen = atomic_load_explicit(&p->gen, memory_order_acquire); /* before the choices fill_call reads */
    for (int si = 0; si < p->nsteps; si++) {
        const struct pstep *s = &p->steps[si];
        fill_call(&x->calls[si], p, s, s->on_host ? x->tvh : x->tv, s->on_host ? hbase : base,
                  s->on_host ? s->hscratch_off : s->scratch_off, x->strings);
        const struct graph_node *n = &p->g->nodes[s->node];
        for (int k = 0; k < n->nout; k++) /* absent optional outputs still get somewhere to be described */
            if (n->out[k] < 0) {
                struct tensor *d = &(s->on_host ? x->tvh : x->tv)[p->nvals + k];
                memset(d, 0, sizeof *d);
                x->calls[si].out[k] = d;
            }
    }
    x->choices_bound = !p->nmeasured || atomic_load_explicit(&p->timed, memory_order_acquire) == 2;
    note_one_thread(x, p);
    plan_retain(p);
    x->bound = p;
    return 0;
}

static int copy_output(struct plan_exec *x, struct plan *p, int o, struct tensor *dst, const struct tensor *inputs,
                       char *err, size_t err_len) {
    const struct graph *g = p->g;
    int v = g->outputs[o];
    const struct pval *pv = &p->vals[v];
    const struct tensor *src = &x->tv[v];
    *dst = pv->t;
    dst->data = NULL;
    size_t nb = tensor_nbytes(&pv->t);
    const void *from = NULL;
    if (pv->kind == PLAN_VALUE_CONST) from = pv->t.data;
    else if (pv->kind == PLAN_VALUE_INPUT) from = inputs[pv->input].data;
    else if (pv->kind == PLAN_VALUE_ARENA && x->host) from = src->data;
    if (pv->t.dtype == DT_STRING) {
        /* The arena holds elements pointing at strings owned elsewhere:
         * the output gets its own block (common/tensor.h). */
        if (!from) return status_set(err, err_len, STATUS_UNSUPPORTED, "output '%s': strings on a device backend", g->values[v].name);
        if (tensor_strings_pack(dst, from))
            return status_set(err, err_len, STATUS_NOMEM, "out of memory for output '%s'", g->values[v].name);
        return 0;
    }
    dst->data = malloc(nb ? nb : 1);
    if (!dst->data) return status_set(err, err_len, STATUS_NOMEM, "out of memory for output '%s' (%zu bytes)", g->values[v].name, nb);
    if (!nb) return 0;
    if (from) {
        memcpy(dst->data, from, nb);
        return 0;
    }
    /* FP16 values come back as FP16 into the first half of the buffer and
     * are widened after the final synchronize (plan_exec_run). */
    int rc = x->be->iface->copy_to_host(x->be, dst->data, src->data, pv->ddt == DT_FP16 && pv->t.dtype == DT_FP32 ? nb / 2 : nb);
    if (rc) status_set(err, err_len, rc, "copying output '%s' from the device failed", g->values[v].name);
    return rc;
}

static int run_device_fallback(struct plan_exec *x, struct plan *p, int si, char *err, size_t err_len) {
    const struct backend_i *be = x->be->iface;
    const struct graph_node *n = &p->g->nodes[p->steps[si].node];
    int rc;
    /* In FP16 plans the CPU still computes in FP32: FP16 inputs are widened
     * in the mirror after the copy (once per root: an input read twice, or
     * through a view, shares its bytes) and outputs narrowed before theirs. */
    int widen[OP_MAX_IO], nwiden = 0;
    for (int k = 0; k < n->nin; k++) {
        int v = n->in[k];
        if (v < 0 || p->vals[v].kind != PLAN_VALUE_ARENA) continue;
        int dup = 0;
        for (int j = 0; j < k; j++)
            if (n->in[j] >= 0 && p->vals[n->in[j]].kind == PLAN_VALUE_ARENA && p->vals[n->in[j]].root == p->vals[v].root)
                dup = 1;
        if (dup) continue;
        size_t nb = dev_nbytes(&p->vals[v]);
        if (nb && (rc = be->copy_to_host(x->be, x->tvh[v].data, x->tv[v].data, nb))) goto fail;
        if (p->vals[v].ddt != p->vals[v].t.dtype) widen[nwiden++] = v;
    }
    if (be->synchronize && (rc = be->synchronize(x->be))) goto fail;
    for (int i = 0; i < nwiden; i++) widen_in_place(x->tvh[widen[i]].data, (size_t)tensor_numel(&p->vals[widen[i]].t));
    struct op_call *c = &x->calls[si];
    c->err = err;
    c->err_len = err_len;
    if ((rc = n->op->run(c))) return rc;
    for (int k = 0; k < n->nout; k++) {
        int v = n->out[k];
        if (v < 0 || p->vals[v].kind != PLAN_VALUE_ARENA) continue;
        size_t nb = dev_nbytes(&p->vals[v]);
        if (p->vals[v].ddt != p->vals[v].t.dtype) narrow_in_place(x->tvh[v].data, (size_t)tensor_numel(&p->vals[v].t));
        if (nb && (rc = be->copy_to_device(x->be, x->tv[v].data, x->tvh[v].data, nb))) goto fail;
    }
    return 0;
fail:
    return status_set(err, err_len, rc, "node '%s' (%s): copying between host and device failed", n->name, n->op_type);
}

/* Runs the plan's steps. times (if not NULL) gets each host step's time in
 * milliseconds, the kernel and its activation. */
int plan_exec_steps(struct plan_exec *x, struct plan *p, double *times, char *err, size_t err_len) {
    const struct backend_i *be = x->be->iface;
    int rc;
    for (int si = 0; si < p->nsteps; si++) {
        struct op_call *c = &x->calls[si];
        double t0 = x->profile || times ? now_ms() : 0;
        if (!x->host && p->steps[si].on_host) rc = run_device_fallback(x, p, si, err, err_len);
        else {
            c->err = err;
            c->err_len = err_len;
            rc = be->run_node(x->be, c);
        }
        if (x->profile) {
            if (!x->host && be->synchronize) be->synchronize(x->be);
            prof_add(x, c->node->op_type, now_ms() - t0, c->nthreads);
        }
        if (rc) {
            if (err && err_len && !err[0])
                status_set(err, err_len, rc, "node '%s' (%s) failed (%s)", c->node->name, c->node->op_type,
                           status_str(rc));
            return rc < 0 ? rc : STATUS_INTERNAL;
        }
        const struct pstep *s = &p->steps[si];
        if (s->post_act != ACT_NONE) {
            struct graph_node an = *c->node;
            an.act = s->post_act;
            an.act_alpha = s->act_a;
            an.act_beta = s->act_b;
            op_apply_act(&an, c->out[0]->data, tensor_numel(c->out[0]));
        }
        if (times) times[si] = now_ms() - t0;
    }
    return 0;
}

int plan_exec_run(struct plan_exec *x, struct plan *p, const struct tensor *inputs, struct tensor *outputs,
                  char *err, size_t err_len) {
    const struct graph *g = p->g;
    int rc;
    for (int o = 0; o < g->noutputs; o++) outputs[o].data = NULL;
    /* The last run's outputs were copied out: its strings can go. */
    op_strpool_reset(x->strings);
    if (x->bound != p || !x->arena || p->arena_size > x->arena_cap) {
        if ((rc = bind(x, p, err, err_len))) return rc;
    }
    const struct backend_i *be = x->be->iface;
    if (x->host) {
        for (int i = 0; i < p->nin_vals; i++) {
            int v = p->in_vals[i];
            x->tv[v].data = inputs[p->vals[v].input].data;
        }
    } else {
        /* FP16 plans: FP32 inputs are narrowed on the host into one staging
         * buffer (each input its own part, as copies may still be queued). */
        size_t need = 0;
        for (int i = 0; i < g->ninputs; i++) {
            const struct pval *pv = &p->vals[g->inputs[i]];
            if (pv->kind == PLAN_VALUE_ARENA && pv->ddt != pv->t.dtype) need += align_up(dev_nbytes(pv));
        }
        if (need > x->stage_cap) {
            free(x->stage);
            x->stage_cap = 0;
            if (!(x->stage = aligned_alloc(PLAN_ALIGN, need)))
                return status_set(err, err_len, STATUS_NOMEM, "out of memory for %zu bytes of FP16 inputs", need);
            x->stage_cap = need;
        }
        size_t so = 0;
        for (int i = 0; i < g->ninputs; i++) {
            const struct pval *pv = &p->vals[g->inputs[i]];
            size_t nb = dev_nbytes(pv);
            if (pv->kind != PLAN_VALUE_ARENA || !nb) continue;
            const void *src = inputs[i].data;
            if (pv->ddt != pv->t.dtype) {
                uint16_t *h = (uint16_t *)((char *)x->stage + so);
                const float *f = inputs[i].data;
                for (int64_t e = 0, ne = tensor_numel(&pv->t); e < ne; e++) h[e] = fp32_to_fp16(f[e]);
                src = h;
                so += align_up(nb);
            }
            if ((rc = be->copy_to_device(x->be, (char *)x->arena + pv->off, src, nb)))
                return status_set(err, err_len, rc, "copying input '%s' to the device failed", g->values[g->inputs[i]].name);
        }
    }
    if (err && err_len) err[0] = 0;
    if (x->profile) x->nruns++;
    /* Device plans without CPU fallback are captured on their second run
     * (the first may have tuned algorithms) and replayed from then on: the
     * arena, constants and scratch never move while the plan stays bound.
     * Capture may or may not execute; replaying right after is right in
     * both cases, since every step recomputes its outputs from its inputs. */
    if (!x->host && be->graph_begin && be->graph_end && be->graph_replay && !p->nfallback && !x->profile &&
        !x->graph_off && !x->graphs_disabled) {
        if (x->graph) {
            if ((rc = be->graph_replay(x->be, x->graph)))
                return status_set(err, err_len, rc, "replaying the captured device graph failed");
        } else if (x->graph_runs++ == 0) {
            if ((rc = plan_exec_steps(x, p, NULL, err, err_len))) return rc;
        } else if (be->graph_begin(x->be) != 0) {
            x->graph_off = 1;
            if ((rc = plan_exec_steps(x, p, NULL, err, err_len))) return rc;
        } else {
            rc = plan_exec_steps(x, p, NULL, err, err_len);
            void *gr = NULL;
            int erc = be->graph_end(x->be, &gr);
            if (rc || erc || !gr) {
                if (gr && be->graph_free) be->graph_free(x->be, gr);
                x->graph_off = 1;
                if (rc) return rc;
                log_debug("device graph capture failed; running node by node");
                if ((rc = plan_exec_steps(x, p, NULL, err, err_len))) return rc;
            } else {
                x->graph = gr;
                if ((rc = be->graph_replay(x->be, x->graph)))
                    return status_set(err, err_len, rc, "replaying the captured device graph failed");
            }
        }
    } else if ((rc = x->host && p->nmeasured ? plan_threads_run_measured(x, p, err, err_len)
                                             : plan_exec_steps(x, p, NULL, err, err_len))) {
        return rc;
    }
    if (!x->host && be->synchronize && (rc = be->synchronize(x->be)))
        return status_set(err, err_len, rc, "the device failed while running the model");
    for (int o = 0; o < g->noutputs; o++)
        if ((rc = copy_output(x, p, o, &outputs[o], inputs, err, err_len))) goto fail;
    if (!x->host && be->synchronize && (rc = be->synchronize(x->be))) {
        status_set(err, err_len, rc, "copying outputs from the device failed");
        goto fail;
    }
    for (int o = 0; o < g->noutputs; o++) {
        const struct pval *pv = &p->vals[g->outputs[o]];
        if (!x->host && pv->kind == PLAN_VALUE_ARENA && pv->ddt != pv->t.dtype)
            widen_in_place(outputs[o].data, (size_t)tensor_numel(&pv->t));
    }
    /* An arena that an input's value made large (ConstantOfShape of a
     * client's number) goes back now that the outputs are copied out: one
     * request must not leave the server holding what it asked for. Arenas
     * sized by shapes alone stay, so a model's steady runs allocate nothing;
     * the next run of this plan binds a new one. */
    if (x->host && p->bind && x->arena_cap > PLAN_VALUE_ARENA_KEEP) arena_free(x);
    return 0;
fail:
    for (int o = 0; o < g->noutputs; o++) {
        free(outputs[o].data);
        outputs[o].data = NULL;
    }
    return rc;
}

