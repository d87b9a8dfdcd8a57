/* ensemble.c - an ensemble's checks at load and its requests' runs. See
 * ensemble.h for the contract.
 *
 * A run is one allocation: the run, a step_run per step (each with its
 * step model's input views, room for its outputs and its batcher request)
 * and the pool of the ensemble's tensors (its inputs as views of the
 * client's, each step's outputs as the blocks its instance wrote). A step
 * is WAITING until every tensor it reads exists, then SUBMITTED to its
 * model's batcher (or, with max_inflight_requests, to that step's waiting
 * list first), then DONE. Its done() runs on an instance thread: it takes
 * the step's outputs into the pool under the run's lock, finds the steps
 * that became ready, and submits them after unlocking (a batcher may run a
 * step inline, calling its done() inside the submit). The last step to
 * finish calls the ensemble's done(); nothing touches the run after that,
 * since the core frees it (ensemble_run_free) on the request's thread.
 *
 * Lock order: a run's mutex, then a batcher's or a nested ensemble run's
 * (ensemble_unschedule under it); no done() is called with a run's mutex
 * held. The ensemble's own mutex guards only the waiting lists. */
#include "server/ensemble.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "server/infer_cache.h"
#include "server/kserve.h"
#include "server/metrics.h"

#define ERR(st, ...) status_set(err, err_len, st, __VA_ARGS__)

enum { STEP_WAITING = 0, STEP_SUBMITTED = 1, STEP_DONE = 2 };

struct ens_step {
    int *in_tensor;                 /* per input_map entry: the pool tensor read */
    int *out_tensor;                /* per output_map entry: the pool tensor produced */
    int nwait;                      /* input_map entries that read a step's output */
    /* max_inflight_requests: runs of this step submitted now, and the
     * steps of other runs waiting for one to finish (under e->mu). */
    int inflight;
    struct step_run *whead, *wtail;
    /* This step's requests that succeeded and failed, and the time they
     * took, submission to done, summed (ensemble_step_stats). */
    atomic_uint_fast64_t success, failure, ns;
};

struct ensemble {
    repository_t *repo;
    const struct model_config *c;
    int ntensors;
    const char **names;             /* tensor names: the ensemble's inputs first */
    int *producer;                  /* per tensor: its step, -1 for an ensemble input */
    int *out_tensor;                /* per ensemble output: its tensor */
    struct ens_step *steps;
    pthread_mutex_t mu;
};

struct step_run {
    struct ensemble_run *run;
    int index;
    int state;
    int nwait;
    int slot;                       /* holds one of max_inflight_requests */
    int cached;                     /* the step model's response_cache: key is its entry */
    struct cache_key key;
    uint64_t t_launch;
    struct repo_version *v;         /* the step's model, referenced for the run */
    struct ensemble_run *sub;       /* a nested ensemble's run (under the run's mutex) */
    int queued;                     /* its batcher (or nested run) has it: cancel may reach it */
    struct tensor *ordered;         /* v->config.ninputs: the step's inputs, views */
    struct tensor *outputs;         /* v->config.noutputs */
    struct kserve_input *kin;       /* input_map's views, for kserve_request_bind */
    struct batcher_request br;
    struct step_run *wnext;
};

struct ensemble_run {
    ensemble_t *e;
    struct batcher_request *br;     /* the ensemble's request */
    cache_t *cache;                 /* for steps whose model has response_cache; NULL: none */
    pthread_mutex_t mu;
    int ninflight;                  /* steps submitted and not done */
    int cancelled;
    int status;
    char err[256];
    uint64_t t0;
    struct tensor *pool;
    unsigned char *owned;           /* pool blocks the run frees */
    struct step_run *steps;
};

/* ==== load =============================================================== */

static int tensor_index(const ensemble_t *e, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(e->names[i], name) == 0) return i;
    return -1;
}

/* The shape a tensor has on the wire: a batching model's dims with its
 * batch dim (-1) in front. -1 when the rank is not known. */
static int full_dims(const struct model_config *mc, const struct model_config_io *io, int64_t *out) {
    if (io->ndim < 0) return -1;
    int skip = mc->max_batch_size > 0, n = 0;
    if (skip) out[n++] = -1;
    for (int d = 0; d < io->ndim && n < TENSOR_MAX_DIMS; d++) out[n++] = io->dims[d];
    return n;
}

static int dims_agree(const int64_t *a, int na, const int64_t *b, int nb) {
    if (na < 0 || nb < 0) return 1;
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (a[i] >= 0 && b[i] >= 0 && a[i] != b[i]) return 0;
    return 1;
}

static void dims_str(const int64_t *d, int n, char *buf, size_t len) {
    size_t k = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < n && k < len; i++) k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? "," : "", (long long)d[i]);
    if (k < len) snprintf(buf + k, len - k, "]");
    if (n < 0) snprintf(buf, len, "any");
}

/* What one tensor is, as the configuration that gives it says: its data
 * type, its dims without a batch dim and its whole shape (with one when
 * that configuration batches). */
struct tinfo {
    enum dtype dtype;
    int ndim, nfull;
    int64_t dims[TENSOR_MAX_DIMS], full[TENSOR_MAX_DIMS];
};

static void tinfo_set(struct tinfo *t, const struct model_config *mc, const struct model_config_io *io) {
    t->dtype = io->dtype;
    t->ndim = io->ndim;
    for (int d = 0; d < io->ndim; d++) t->dims[d] = io->dims[d];
    t->nfull = full_dims(mc, io, t->full);
}

/* Triton's rule: the shapes agree without the batch dim, or whole (a
 * tensor a non-batching model gives as [-1, d...] to one that batches
 * [d...], and the other way). */
static int tinfo_agree(const struct tinfo *a, const struct tinfo *b) {
    return dims_agree(a->dims, a->ndim, b->dims, b->ndim) || dims_agree(a->full, a->nfull, b->full, b->nfull);
}

/* A tensor handed between a model that batches and one that does not:
 * given to a batching model with the rank of its dims (no batch dim), it
 * gets a batch of 1; given to a non-batching one as a batch of 1 with one
 * dim too many, it loses it. A view: the data stays. */
void ensemble_fit_batch(const struct model_config *mc, const struct model_config_io *io, struct tensor *t) {
    if (io->ndim < 0) return;
    if (mc->max_batch_size > 0 && t->ndim == io->ndim && t->ndim < TENSOR_MAX_DIMS) {
        memmove(t->dims + 1, t->dims, (size_t)t->ndim * sizeof t->dims[0]);
        t->dims[0] = 1;
        t->ndim++;
    } else if (mc->max_batch_size == 0 && t->ndim == io->ndim + 1 && t->dims[0] == 1) {
        memmove(t->dims, t->dims + 1, (size_t)(t->ndim - 1) * sizeof t->dims[0]);
        t->ndim--;
    }
}

void ensemble_free(ensemble_t *e) {
    if (!e) return;
    for (int s = 0; e->steps && s < e->c->nsteps; s++) {
        free(e->steps[s].in_tensor);
        free(e->steps[s].out_tensor);
    }
    free(e->steps);
    free(e->names);
    free(e->producer);
    free(e->out_tensor);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* An ensemble output without labels of its own takes those of the step
 * model output that produces it, as Triton's classification does. */
static int inherit_labels(struct model_config_io *out, const struct model_config_io *from) {
    if (out->nlabels || !from->nlabels) return 0;
    out->labels = calloc((size_t)from->nlabels, sizeof *out->labels);
    if (!out->labels) return STATUS_NOMEM;
    for (int i = 0; i < from->nlabels; i++) {
        if (!(out->labels[i] = strdup(from->labels[i]))) return STATUS_NOMEM;
        out->nlabels = i + 1;
    }
    return 0;
}

/* The step models against the ensemble (ensemble_create's checks after the
 * data flow, which the configuration's parser made). */
static int check_steps(ensemble_t *e, struct model_config *c, char *err, size_t err_len) {
    struct tinfo *ti = calloc((size_t)e->ntensors, sizeof *ti);
    if (!ti) return ERR(STATUS_NOMEM, "out of memory");
    for (int i = 0; i < c->ninputs; i++) tinfo_set(&ti[i], c, &c->inputs[i]);
    int rc = 0;
    struct repo_version **sv = calloc((size_t)c->nsteps, sizeof *sv);
    if (!sv) rc = ERR(STATUS_NOMEM, "out of memory");
    char e2[512], a[96], b[96];
    /* Each step's model, and what its outputs are. */
    for (int s = 0; !rc && s < c->nsteps; s++) {
        const struct model_ensemble_step *st = &c->steps[s];
        int status;
        sv[s] = repository_acquire(e->repo, st->model_name, st->model_version > 0 ? st->model_version : 0, &status, e2,
                                   sizeof e2);
        if (!sv[s]) {
            rc = ERR(STATUS_UNAVAILABLE, "ensemble '%s' step %d: model '%s'%s%.0lld is not loaded (%s)", c->name, s,
                     st->model_name, st->model_version > 0 ? " version " : "",
                     (long long)(st->model_version > 0 ? st->model_version : 0), e2);
            break;
        }
        const struct model_config *mc = &sv[s]->config;
        if (c->max_batch_size > 0 && mc->max_batch_size > 0 && mc->max_batch_size < c->max_batch_size) {
            rc = ERR(STATUS_INVALID, "ensemble '%s' step %d: model '%s' has max_batch_size %d, less than the "
                     "ensemble's %d: a step that batches must take the ensemble's batches", c->name, s, st->model_name,
                     mc->max_batch_size, c->max_batch_size);
            break;
        }
        for (int k = 0; !rc && k < st->noutput_map; k++) {
            int j = model_config_find_output(mc, st->output_map[k].key);
            if (j < 0) {
                rc = ERR(STATUS_INVALID, "ensemble '%s' step %d: output_map names output '%s', which model '%s' does "
                         "not have", c->name, s, st->output_map[k].key, st->model_name);
                break;
            }
            tinfo_set(&ti[e->steps[s].out_tensor[k]], mc, &mc->outputs[j]);
            int o = model_config_find_output(c, st->output_map[k].value);
            if (o >= 0 && inherit_labels(&c->outputs[o], &mc->outputs[j])) rc = ERR(STATUS_NOMEM, "out of memory");
        }
    }
    /* What each step reads, against its model's inputs. */
    for (int s = 0; !rc && s < c->nsteps; s++) {
        const struct model_ensemble_step *st = &c->steps[s];
        const struct model_config *mc = &sv[s]->config;
        for (int k = 0; !rc && k < st->ninput_map; k++) {
            const char *in = st->input_map[k].key, *tn = st->input_map[k].value;
            int j = model_config_find_input(mc, in);
            if (j < 0) {
                rc = ERR(STATUS_INVALID, "ensemble '%s' step %d: input_map names input '%s', which model '%s' does "
                         "not have", c->name, s, in, st->model_name);
                break;
            }
            const struct tinfo *t = &ti[e->steps[s].in_tensor[k]];
            struct tinfo m;
            tinfo_set(&m, mc, &mc->inputs[j]);
            if (t->dtype != mc->inputs[j].dtype)
                rc = ERR(STATUS_INVALID, "ensemble '%s' step %d: tensor '%s' is %s but input '%s' of model '%s' is %s",
                         c->name, s, tn, dtype_kserve_name(t->dtype), in, st->model_name,
                         dtype_kserve_name(mc->inputs[j].dtype));
            else if (!tinfo_agree(t, &m)) {
                dims_str(t->full, t->nfull, a, sizeof a);
                dims_str(m.full, m.nfull, b, sizeof b);
                rc = ERR(STATUS_INVALID, "ensemble '%s' step %d: tensor '%s' has shape %s but input '%s' of model "
                         "'%s' takes %s", c->name, s, tn, a, in, st->model_name, b);
            }
        }
        for (int j = 0; !rc && j < mc->ninputs; j++) {
            int mapped = 0;
            for (int k = 0; k < st->ninput_map && !mapped; k++) mapped = strcmp(st->input_map[k].key, mc->inputs[j].name) == 0;
            if (!mapped && !mc->inputs[j].optional)
                rc = ERR(STATUS_INVALID, "ensemble '%s' step %d: input '%s' of model '%s' is not in the step's "
                         "input_map", c->name, s, mc->inputs[j].name, st->model_name);
        }
    }
    /* The ensemble's outputs, against what produces them. */
    for (int i = 0; !rc && i < c->noutputs; i++) {
        const struct tinfo *t = &ti[e->out_tensor[i]];
        struct tinfo o;
        tinfo_set(&o, c, &c->outputs[i]);
        int s = e->producer[e->out_tensor[i]];
        if (t->dtype != c->outputs[i].dtype)
            rc = ERR(STATUS_INVALID, "ensemble '%s': output '%s' is %s but step %d (model '%s') produces %s", c->name,
                     c->outputs[i].name, dtype_kserve_name(c->outputs[i].dtype), s, c->steps[s].model_name,
                     dtype_kserve_name(t->dtype));
        else if (!tinfo_agree(t, &o)) {
            dims_str(o.full, o.nfull, a, sizeof a);
            dims_str(t->full, t->nfull, b, sizeof b);
            rc = ERR(STATUS_INVALID, "ensemble '%s': output '%s' has shape %s but step %d (model '%s') produces %s",
                     c->name, c->outputs[i].name, a, s, c->steps[s].model_name, b);
        }
    }
    for (int s = 0; sv && s < c->nsteps; s++) repository_release(sv[s]);
    free(sv);
    free(ti);
    return rc;
}

ensemble_t *ensemble_create(repository_t *repo, struct model_config *c, char *err, size_t err_len) {
    ensemble_t *e = calloc(1, sizeof *e);
    if (!e) {
        ERR(STATUS_NOMEM, "out of memory");
        return NULL;
    }
    e->repo = repo;
    e->c = c;
    pthread_mutex_init(&e->mu, NULL);
    int max = c->ninputs;
    for (int s = 0; s < c->nsteps; s++) max += c->steps[s].noutput_map;
    e->names = calloc((size_t)max + 1, sizeof *e->names);
    e->producer = calloc((size_t)max + 1, sizeof *e->producer);
    e->out_tensor = calloc((size_t)c->noutputs + 1, sizeof *e->out_tensor);
    e->steps = calloc((size_t)c->nsteps, sizeof *e->steps);
    int ok = e->names && e->producer && e->out_tensor && e->steps;
    for (int i = 0; ok && i < c->ninputs; i++) {
        e->names[e->ntensors] = c->inputs[i].name;
        e->producer[e->ntensors++] = -1;
    }
    for (int s = 0; ok && s < c->nsteps; s++) {
        const struct model_ensemble_step *st = &c->steps[s];
        struct ens_step *es = &e->steps[s];
        es->in_tensor = calloc((size_t)st->ninput_map + 1, sizeof *es->in_tensor);
        es->out_tensor = calloc((size_t)st->noutput_map + 1, sizeof *es->out_tensor);
        if (!(ok = es->in_tensor && es->out_tensor)) break;
        /* The parser made each produced once. */
        for (int k = 0; k < st->noutput_map; k++) {
            e->names[e->ntensors] = st->output_map[k].value;
            e->producer[e->ntensors] = s;
            es->out_tensor[k] = e->ntensors++;
        }
    }
    if (!ok) {
        ensemble_free(e);
        ERR(STATUS_NOMEM, "out of memory");
        return NULL;
    }
    /* The parser made every tensor read exist. */
    for (int s = 0; s < c->nsteps; s++) {
        const struct model_ensemble_step *st = &c->steps[s];
        for (int k = 0; k < st->ninput_map; k++) {
            int t = tensor_index(e, e->ntensors, st->input_map[k].value);
            e->steps[s].in_tensor[k] = t;
            if (e->producer[t] >= 0) e->steps[s].nwait++;
        }
    }
    for (int i = 0; i < c->noutputs; i++) e->out_tensor[i] = tensor_index(e, e->ntensors, c->outputs[i].name);
    if (check_steps(e, c, err, err_len)) {
        ensemble_free(e);
        return NULL;
    }
    return e;
}

int ensemble_nsteps(const ensemble_t *e) { return e ? e->c->nsteps : 0; }

void ensemble_step_stats(ensemble_t *e, int step, struct ensemble_step_stats *out) {
    struct ens_step *es = &e->steps[step];
    out->model = e->c->steps[step].model_name;
    out->success = atomic_load_explicit(&es->success, memory_order_relaxed);
    out->failure = atomic_load_explicit(&es->failure, memory_order_relaxed);
    out->ns = atomic_load_explicit(&es->ns, memory_order_relaxed);
}

int ensemble_uses(const ensemble_t *e, const char *name) {
    for (int s = 0; e && s < e->c->nsteps; s++)
        if (strcmp(e->c->steps[s].model_name, name) == 0) return 1;
    return 0;
}

/* ==== a run ============================================================== */

static void step_launch(struct step_run *s);

/* The ensemble's request is over: its outputs (the blocks the producing
 * steps wrote) or its error, then done(). Nothing may touch run after. */
static void run_complete(struct ensemble_run *run) {
    ensemble_t *e = run->e;
    struct batcher_request *br = run->br;
    int status = run->status;
    if (!status && run->cancelled) {
        status = STATUS_CANCELLED;
        snprintf(run->err, sizeof run->err, "request cancelled: the client went away");
    }
    br->noutputs = 0;
    if (!status) {
        /* An output no step ran for (not asked for: prune_steps) is empty. */
        for (int k = 0; k < e->c->noutputs; k++) {
            int t = e->out_tensor[k];
            br->outputs[k] = run->pool[t];
            ensemble_fit_batch(e->c, &e->c->outputs[k], &br->outputs[k]);
            run->owned[t] = 0;
        }
        br->noutputs = e->c->noutputs;
    }
    for (int t = 0; t < e->ntensors; t++)
        if (run->owned[t]) {
            tensor_free_data(&run->pool[t]);
            run->owned[t] = 0;
        }
    br->status = status;
    snprintf(br->err, sizeof br->err, "%s", status ? run->err : "");
    uint64_t now = clock_now_ns();
    br->enqueue_ns = br->start_ns = run->t0;
    br->end_ns = now;
    br->compute_input_ns = br->compute_output_ns = 0;
    br->compute_infer_ns = now - run->t0;
    br->batch_size = (int)br->rows;
    br->done(br);
}

/* Step s is over (status 0: its outputs are in s->outputs). On the thread
 * that finished it. */
static void step_finish(struct step_run *s, int status, const char *msg) {
    struct ensemble_run *run = s->run;
    ensemble_t *e = run->e;
    const struct model_ensemble_step *st = &e->c->steps[s->index];
    struct ens_step *es = &e->steps[s->index];
    /* A slot of max_inflight_requests goes to the oldest step waiting. */
    struct step_run *w = NULL;
    if (s->slot) {
        pthread_mutex_lock(&e->mu);
        s->slot = 0;
        es->inflight--;
        if ((w = es->whead)) {
            es->whead = w->wnext;
            if (!es->whead) es->wtail = NULL;
            es->inflight++;
            w->slot = 1;
        }
        pthread_mutex_unlock(&e->mu);
    }
    struct step_run *ready[MODEL_ENSEMBLE_MAX_STEPS];
    int nready = 0;
    const struct model_config *mc = &s->v->config;
    if (s->t_launch) {
        atomic_fetch_add_explicit(status ? &es->failure : &es->success, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&es->ns, clock_now_ns() - s->t_launch, memory_order_relaxed);
    }
    pthread_mutex_lock(&run->mu);
    if (!status) {
        for (int k = 0; k < st->noutput_map && !status; k++) {
            int j = model_config_find_output(mc, st->output_map[k].key);
            if (j < 0) {
                status = STATUS_INTERNAL;
                msg = "the model has no such output (reloaded since the ensemble was checked)";
                break;
            }
            int t = es->out_tensor[k];
            run->pool[t] = s->outputs[j];
            run->owned[t] = 1;
            s->outputs[j].data = NULL;
        }
        for (int j = 0; j < s->br.noutputs; j++) tensor_free_data(&s->outputs[j]);
    }
    if (status) {
        if (!run->status) {
            run->status = status;
            snprintf(run->err, sizeof run->err, "in ensemble '%s', step %d (model '%s'): %s", e->c->name, s->index,
                     st->model_name, msg);
        }
        /* The steps still queued have nothing left to do. */
        for (int i = 0; i < e->c->nsteps; i++) {
            struct step_run *t = &run->steps[i];
            if (t != s && t->state == STEP_SUBMITTED && t->queued) ensemble_unschedule(t->v, &t->br, t->sub);
        }
    } else if (!run->status && !run->cancelled) {
        for (int i = 0; i < e->c->nsteps; i++) {
            struct step_run *t = &run->steps[i];
            if (t->state != STEP_WAITING) continue;
            for (int k = 0; k < e->c->steps[i].ninput_map; k++)
                if (e->producer[e->steps[i].in_tensor[k]] == s->index) t->nwait--;
            if (t->nwait == 0) {
                t->state = STEP_SUBMITTED;
                run->ninflight++;
                ready[nready++] = t;
            }
        }
    }
    s->state = STEP_DONE;
    int finished = --run->ninflight == 0;
    pthread_mutex_unlock(&run->mu);
    /* Each step launched keeps the run alive until it finishes: the last
     * one launched may end it, so nothing of run is read after. */
    for (int i = 0; i < nready; i++) step_launch(ready[i]);
    if (finished) run_complete(run);
    if (w) step_launch(w);
}

/* A step model's batcher is done with step s (an instance thread, or the
 * batcher's timer for a timeout or a cancellation). */
static void step_done(struct batcher_request *br) {
    struct step_run *s = br->user;
    struct metrics_model *m = s->v->metrics;
    uint64_t now = clock_now_ns();
    if (!br->status) {
        kserve_reshape_outputs(&s->v->config, s->outputs);
        /* The step's model counts the request as its own (Triton's
         * statistics show composing models' inferences). */
        metrics_record_success(m, now - br->enqueue_ns, br->start_ns - br->enqueue_ns, br->compute_input_ns,
                               br->compute_infer_ns, br->compute_output_ns, br->rows, br->batch_size);
        if (s->cached) infer_cache_lru_store(s->run->cache, &s->key, &s->v->config, s->outputs);
    } else metrics_record_failure(m, br->status, now - br->enqueue_ns);
    step_finish(s, br->status, br->err);
}

/* A step whose model has response_cache, bound as kr: answered from the
 * in-process tier (the step then finishes here, as its model would count a
 * cached request) or keyed for its result to be stored there. */
static int step_cache_hit(struct step_run *s, const struct kserve_request *kr) {
    const struct model_config *mc = &s->v->config;
    cache_t *cache = s->run->cache;
    if (infer_cache_key(cache, s->v->name, s->v->version, mc, s->ordered, kr, &s->key)) return 0;
    uint64_t t0 = clock_now_ns();
    int hit = infer_cache_lru_lookup(cache, &s->key, mc, mc->max_batch_size > 0 ? s->br.rows : -1, s->outputs);
    metrics_record_cache(s->v->metrics, hit, clock_now_ns() - t0);
    if (!hit) {
        s->cached = 1;
        return 0;
    }
    s->br.noutputs = mc->noutputs;
    metrics_record_cached(s->v->metrics, clock_now_ns() - t0, s->br.rows);
    step_finish(s, 0, NULL);
    return 1;
}

static void step_launch(struct step_run *s) {
    struct ensemble_run *run = s->run;
    ensemble_t *e = run->e;
    const struct model_ensemble_step *st = &e->c->steps[s->index];
    struct ens_step *es = &e->steps[s->index];
    int max = e->c->max_inflight_requests;
    if (max > 0 && !s->slot) {
        pthread_mutex_lock(&e->mu);
        if (es->inflight >= max) {
            s->wnext = NULL;
            if (es->wtail) es->wtail->wnext = s;
            else es->whead = s;
            es->wtail = s;
            pthread_mutex_unlock(&e->mu);
            return;
        }
        es->inflight++;
        s->slot = 1;
        pthread_mutex_unlock(&e->mu);
    }
    pthread_mutex_lock(&run->mu);
    int stop = run->cancelled || run->status;
    pthread_mutex_unlock(&run->mu);
    if (stop) {
        step_finish(s, STATUS_CANCELLED, "request cancelled: the client went away");
        return;
    }
    /* The tensors the step reads, as they are, bound as a client's request
     * to the step model is: data types, shapes, batch size, reshapes. */
    struct kserve_request kr;
    memset(&kr, 0, sizeof kr);
    kr.inputs = s->kin;
    kr.ninputs = st->ninput_map;
    const struct model_config *mc = &s->v->config;
    for (int k = 0; k < st->ninput_map; k++) {
        s->kin[k].name = st->input_map[k].key;
        s->kin[k].t = run->pool[es->in_tensor[k]];
        int j = model_config_find_input(mc, st->input_map[k].key);
        if (j >= 0) ensemble_fit_batch(mc, &mc->inputs[j], &s->kin[k].t);
    }
    char err[256];
    s->t_launch = clock_now_ns();
    int rc = kserve_request_bind(&kr, mc, s->ordered, &s->br.rows, err, sizeof err);
    if (rc) {
        step_finish(s, rc, err);
        return;
    }
    if (run->cache && mc->response_cache && step_cache_hit(s, &kr)) return;
    struct batcher_request *br = &s->br;
    br->inputs = s->ordered;
    br->ninputs = s->v->config.ninputs;
    br->outputs = s->outputs;
    br->priority = run->br->priority;
    br->timeout_us = run->br->timeout_us;
    br->deadline_ns = run->br->deadline_ns;
    br->done = step_done;
    br->user = s;
    /* The launch holds the run open (one more in flight) until its own
     * bookkeeping after the submit is done: the step may finish, and the
     * run with it, inside the submit (an inline run) or on another thread
     * meanwhile. Only a step its batcher has may be cancelled there. */
    pthread_mutex_lock(&run->mu);
    run->ninflight++;
    pthread_mutex_unlock(&run->mu);
    struct ensemble_run *sub = NULL;
    if ((rc = ensemble_schedule(s->v, br, run->cache, NULL, &sub))) step_finish(s, rc, br->err);
    pthread_mutex_lock(&run->mu);
    s->sub = sub;
    if (!rc && s->state == STEP_SUBMITTED) {
        s->queued = 1;
        if (run->cancelled || run->status) ensemble_unschedule(s->v, br, sub);
    }
    int finished = --run->ninflight == 0;
    pthread_mutex_unlock(&run->mu);
    if (finished) run_complete(run);
}

/* Allocates a run of e for br: the step models referenced, the pool with
 * the ensemble's inputs. NULL with br->err set. */
static struct ensemble_run *run_new(ensemble_t *e, struct batcher_request *br, int *status) {
    const struct model_config *c = e->c;
    struct repo_version *sv[MODEL_ENSEMBLE_MAX_STEPS];
    size_t extra = 0;
    for (int s = 0; s < c->nsteps; s++) {
        const struct model_ensemble_step *st = &c->steps[s];
        char e2[200];
        sv[s] = repository_acquire(e->repo, st->model_name, st->model_version > 0 ? st->model_version : 0, status, e2,
                                   sizeof e2);
        if (!sv[s]) {
            snprintf(br->err, sizeof br->err, "in ensemble '%s', step %d (model '%s'): %s", c->name, s, st->model_name,
                     e2);
            while (s-- > 0) repository_release(sv[s]);
            return NULL;
        }
        extra += (size_t)(sv[s]->config.ninputs + sv[s]->config.noutputs) * sizeof(struct tensor) +
                 (size_t)st->ninput_map * sizeof(struct kserve_input);
    }
    size_t size = sizeof(struct ensemble_run) + (size_t)c->nsteps * sizeof(struct step_run) +
                  (size_t)e->ntensors * sizeof(struct tensor) + extra + (size_t)e->ntensors;
    struct ensemble_run *run = calloc(1, size);
    if (!run) {
        for (int s = 0; s < c->nsteps; s++) repository_release(sv[s]);
        *status = STATUS_NOMEM;
        snprintf(br->err, sizeof br->err, "out of memory");
        return NULL;
    }
    /* The parts in order of alignment: tensors, kserve inputs, bytes. */
    char *p = (char *)(run + 1);
    run->steps = (struct step_run *)p;
    p += (size_t)c->nsteps * sizeof(struct step_run);
    run->pool = (struct tensor *)p;
    p += (size_t)e->ntensors * sizeof(struct tensor);
    for (int s = 0; s < c->nsteps; s++) {
        struct step_run *t = &run->steps[s];
        t->ordered = (struct tensor *)p;
        p += (size_t)sv[s]->config.ninputs * sizeof(struct tensor);
        t->outputs = (struct tensor *)p;
        p += (size_t)sv[s]->config.noutputs * sizeof(struct tensor);
    }
    for (int s = 0; s < c->nsteps; s++) {
        run->steps[s].kin = (struct kserve_input *)p;
        p += (size_t)c->steps[s].ninput_map * sizeof(struct kserve_input);
    }
    run->owned = (unsigned char *)p;
    run->e = e;
    run->br = br;
    run->t0 = clock_now_ns();
    pthread_mutex_init(&run->mu, NULL);
    for (int i = 0; i < c->ninputs; i++) run->pool[i] = br->inputs[i];
    for (int s = 0; s < c->nsteps; s++) {
        struct step_run *t = &run->steps[s];
        t->run = run;
        t->index = s;
        t->v = sv[s];
        t->nwait = e->steps[s].nwait;
        atomic_init(&t->br.cancelled, 0);
    }
    return run;
}

/* Marks the steps a request that asks for some outputs only (kr) needs:
 * those that produce them, and those that produce what these read, and so
 * on; the others are DONE before they start (Triton skips them too). */
static void prune_steps(struct ensemble_run *run, const struct kserve_request *kr) {
    ensemble_t *e = run->e;
    const struct model_config *c = e->c;
    unsigned char need[MODEL_ENSEMBLE_MAX_STEPS] = {0}, *want = run->owned; /* room: ntensors bytes, unused yet */
    for (int i = 0; i < kr->noutputs; i++) {
        int k = model_config_find_output(c, kr->outputs[i].name);
        if (k >= 0) want[e->out_tensor[k]] = 1;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int s = 0; s < c->nsteps; s++) {
            int used = 0;
            for (int k = 0; k < c->steps[s].noutput_map && !used; k++) used = want[e->steps[s].out_tensor[k]];
            if (!used || need[s]) continue;
            need[s] = changed = 1;
            for (int k = 0; k < c->steps[s].ninput_map; k++) want[e->steps[s].in_tensor[k]] = 1;
        }
    }
    memset(want, 0, (size_t)e->ntensors);
    for (int s = 0; s < c->nsteps; s++)
        if (!need[s]) run->steps[s].state = STEP_DONE;
}

int ensemble_schedule(struct repo_version *v, struct batcher_request *br, cache_t *cache,
                      const struct kserve_request *kr, struct ensemble_run **out) {
    *out = NULL;
    if (!v->ensemble) return batcher_submit(v->batcher, br);
    if (br->ninputs != v->config.ninputs || br->rows < 1)
        return status_set(br->err, sizeof br->err, STATUS_INVALID, "ensemble '%s': a request that was not bound to it",
                          v->name);
    int status = 0;
    struct ensemble_run *run = run_new(v->ensemble, br, &status);
    if (!run) return status;
    run->cache = cache;
    *out = run;
    ensemble_t *e = v->ensemble;
    if (kr && kr->noutputs > 0) prune_steps(run, kr);
    struct step_run *ready[MODEL_ENSEMBLE_MAX_STEPS];
    int nready = 0;
    pthread_mutex_lock(&run->mu);
    for (int s = 0; s < e->c->nsteps; s++)
        if (run->steps[s].nwait == 0 && run->steps[s].state == STEP_WAITING) {
            run->steps[s].state = STEP_SUBMITTED;
            ready[nready++] = &run->steps[s];
        }
    run->ninflight = nready;
    pthread_mutex_unlock(&run->mu);
    for (int i = 0; i < nready; i++) step_launch(ready[i]);
    return 0;
}

void ensemble_unschedule(struct repo_version *v, struct batcher_request *br, struct ensemble_run *run) {
    if (!v->ensemble) {
        batcher_cancel(v->batcher, br);
        return;
    }
    if (!run) return;
    pthread_mutex_lock(&run->mu);
    run->cancelled = 1;
    for (int i = 0; i < run->e->c->nsteps; i++) {
        struct step_run *t = &run->steps[i];
        if (t->state == STEP_SUBMITTED && t->queued) ensemble_unschedule(t->v, &t->br, t->sub);
    }
    pthread_mutex_unlock(&run->mu);
}

void ensemble_run_free(struct ensemble_run *run) {
    if (!run) return;
    for (int s = 0; s < run->e->c->nsteps; s++) {
        ensemble_run_free(run->steps[s].sub);
        repository_release(run->steps[s].v);
    }
    pthread_mutex_destroy(&run->mu);
    free(run);
}
