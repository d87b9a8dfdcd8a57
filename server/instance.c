/* instance.c - the model's executor: instances that gather a batch's
 * inputs, run the model on their own backend and execution context, and
 * scatter the outputs back to the requests. See instance.h. */
#include "server/instance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "server/batcher.h"
#include "server/padding.h"

struct instance {
    int index;
    struct backend *be;
    struct model_exec *x;
    int nthreads;        /* of be and x */
    int threads_heavy;   /* more threads to move to for heavy runs; 0 = none */
    /* Gather buffers reused across batches (grown, never shrunk). */
    struct tensor_rows *rows_of; /* a batch's requests: gather's sources */
    void **in_buf;
    size_t *in_cap;
    int nbuf;            /* entries of in_buf/in_cap/in */
    struct tensor *in;   /* ninputs descriptors of the batch */
    struct tensor *out;  /* noutputs results of the batch */
    const struct tensor **pad_src; /* a padded input's requests: pad_gather's sources */
    int padded;          /* this batch ran padded: its outputs are cut back */
};

struct instances {
    struct instances_params p;
    char name[128];
    char backend[32];
    int noutputs;
    struct instance *inst;
    int n;
};

/* ---- one batch ----------------------------------------------------------- */

static int ensure_buf(void **buf, size_t *cap, size_t need) {
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 4096;
    while (n < need)
        n *= 2;
    void *p = realloc(*buf, n);
    if (!p)
        return STATUS_NOMEM;
    *buf = p;
    *cap = n;
    return 0;
}

/* Frees the blocks of outputs[0..n) (NULL data: none). */
static void free_outputs(struct tensor *out, int n) {
    for (int i = 0; i < n; i++)
        tensor_free_data(&out[i]);
}

/* Pads input slot k of the spec into the instance's buffer for its input
 * when some request is shorter than the batch's length; counts slot 0's
 * elements. 1 if it padded, 0 if the requests need none, or a status. */
static int gather_padded(const struct pad_spec *pad, int k, struct instance *inst, struct executor_batch *bt) {
    int i = pad->in[k].input, axis = pad->in[k].axis;
    const struct tensor *in0 = bt->reqs[0]->inputs;
    if (axis >= in0[i].ndim)
        return 0;
    int64_t len = pad_length(pad, in0, k), real = 0, one = 1;
    int short_one = 0;
    for (int d = 1; d < in0[i].ndim; d++)
        if (d != axis)
            one *= in0[i].dims[d];
    for (int r = 0; r < bt->n; r++) {
        const struct tensor *t = &bt->reqs[r]->inputs[i];
        inst->pad_src[r] = t;
        short_one |= t->dims[axis] != len;
        real += t->dims[0] * t->dims[axis] * one;
    }
    if (k == 0) {
        bt->pad_real = (uint64_t)real;
        bt->pad_total = (uint64_t)(bt->rows * len * one);
    }
    if (!short_one)
        return 0;
    size_t need = pad_gather_size(inst->pad_src, bt->n, axis, len);
    if (need == SIZE_MAX || ensure_buf(&inst->in_buf[i], &inst->in_cap[i], need) ||
        pad_gather(&inst->in[i], inst->in_buf[i], inst->in_cap[i], inst->pad_src, bt->n, axis, len, pad->in[k].value))
        return STATUS_NOMEM;
    return 1;
}

/* Gathers the batch's inputs into one block per input, in the common
 * tensor layout (strings included). A batch of one request uses its
 * buffers directly, unless it is padded. */
static int gather(const struct instances *s, struct instance *inst, struct executor_batch *bt, char *err,
                  size_t err_len) {
    struct batcher_request *r0 = bt->reqs[0];
    inst->padded = 0;
    unsigned long long done = 0; /* inputs gathered padded */
    for (int k = 0; s->p.pad && k < s->p.pad->nin; k++) {
        int rc = gather_padded(s->p.pad, k, inst, bt);
        if (rc < 0)
            return status_set(err, err_len, STATUS_NOMEM, "out of memory padding a batch of %lld rows",
                              (long long)bt->rows);
        if (rc) {
            inst->padded = 1;
            done |= 1ull << s->p.pad->in[k].input;
        }
    }
    for (int i = 0; i < r0->ninputs; i++) {
        if (i < 64 && (done >> i & 1)) /* padded inputs are among the first 64 (pad_spec_make) */
            continue;
        inst->in[i] = r0->inputs[i];
        if (bt->n == 1)
            continue;
        for (int k = 0; k < bt->n; k++)
            inst->rows_of[k] = (struct tensor_rows){&bt->reqs[k]->inputs[i], 0, bt->reqs[k]->inputs[i].dims[0]};
        size_t need = tensor_rows_size(inst->rows_of, bt->n);
        if (need == SIZE_MAX || ensure_buf(&inst->in_buf[i], &inst->in_cap[i], need) ||
            tensor_rows_write(&inst->in[i], inst->in_buf[i], inst->in_cap[i], inst->rows_of, bt->n))
            return status_set(err, err_len, STATUS_NOMEM, "out of memory gathering a batch of %lld rows",
                              (long long)bt->rows);
    }
    return 0;
}

/* The spec's out[] entry for output o, or -1 (not cut back). */
static int cut_axis(const struct pad_spec *pad, int o) {
    for (int m = 0; m < pad->nout; m++)
        if (pad->out[m].output == o)
            return m;
    return -1;
}

/* Request r's own length of the spec's padded input slot. */
static int64_t req_length(const struct pad_spec *pad, const struct batcher_request *r, int slot) {
    const struct tensor *t = &r->inputs[pad->in[slot].input];
    return t->dims[pad->in[slot].axis];
}

/* The output that out[m] names must have the batch's padded length on its
 * axis: else the configuration maps it wrongly. */
static int pad_check_output(const struct instances *s, const struct instance *inst, const struct executor_batch *bt,
                            int m, char *err, size_t err_len) {
    const struct pad_spec *pad = s->p.pad;
    const struct tensor *t = &inst->out[pad->out[m].output];
    int axis = pad->out[m].axis;
    int64_t len = pad_length(pad, bt->reqs[0]->inputs, pad->out[m].slot);
    if (axis < t->ndim && t->dims[axis] == len && t->dtype != DT_STRING)
        return 0;
    return status_set(err, err_len, STATUS_INTERNAL,
                      "model '%s': output %d axis %d is not the padded length %lld (sequence_padding.outputs "
                      "says it follows a padded input axis)", s->name, pad->out[m].output, axis, (long long)len);
}

/* Splits the batch outputs by rows into the requests' outputs (their own
 * arrays), one owned block each (common/tensor.h), cut back to each
 * request's length along the axes that follow a padded input when the
 * batch was padded. On failure nothing is left allocated in any request. */
static int scatter(struct instances *s, struct instance *inst, const struct executor_batch *bt, char *err,
                   size_t err_len) {
    int no = s->noutputs;
    for (int o = 0; o < no; o++) {
        const struct tensor *t = &inst->out[o];
        if (t->ndim < 1 || t->dims[0] != bt->rows)
            return status_set(err, err_len, STATUS_INTERNAL,
                              "output %d of model '%s' has no batch dimension of %lld rows", o, s->name,
                              (long long)bt->rows);
    }
    for (int k = 0; k < bt->n; k++)
        memset(bt->reqs[k]->outputs, 0, sizeof(struct tensor) * (size_t)no);
    for (int o = 0; o < no; o++) {
        int64_t first = 0;
        int m = inst->padded ? cut_axis(s->p.pad, o) : -1;
        if (m >= 0 && pad_check_output(s, inst, bt, m, err, err_len))
            goto fail_msg;
        for (int k = 0; k < bt->n; k++) {
            struct batcher_request *r = bt->reqs[k];
            struct tensor_rows rows = {&inst->out[o], first, r->rows};
            if (m >= 0 ? pad_cut(&r->outputs[o], &inst->out[o], first, r->rows, s->p.pad->out[m].axis,
                                 req_length(s->p.pad, r, s->p.pad->out[m].slot))
                       : tensor_copy_rows(&r->outputs[o], &rows, 1))
                goto fail;
            first += r->rows;
        }
    }
    return 0;
fail_msg:
    for (int k = 0; k < bt->n; k++)
        free_outputs(bt->reqs[k]->outputs, no);
    return STATUS_INTERNAL;
fail:
    for (int k = 0; k < bt->n; k++)
        free_outputs(bt->reqs[k]->outputs, no);
    return status_set(err, err_len, STATUS_NOMEM, "out of memory splitting a batch of %lld rows",
                      (long long)bt->rows);
}

/* Runs the gathered batch. A request alone in its batch, unpadded, gets the
 * model's outputs in its own array as they are; a batch's are split
 * (scatter). */
static int execute(struct instances *s, struct instance *inst, int index, const struct executor_batch *bt,
                   char *err, size_t err_len) {
    int no = s->noutputs, nin = bt->reqs[0]->ninputs, alone = bt->n == 1 && !inst->padded;
    struct tensor *out = alone ? bt->reqs[0]->outputs : inst->out;
    memset(out, 0, sizeof(struct tensor) * (size_t)no);
    if (!s->p.execute) model_exec_set_requests(inst->x, bt->n);
    int rc = s->p.execute ? s->p.execute(s->p.execute_arg, index, inst->in, nin, out, no, err, err_len)
                          : model_run_unchecked(inst->x, inst->in, nin, out, no, err, err_len);
    if (rc || alone)
        return rc;
    rc = scatter(s, inst, bt, err, err_len);
    free_outputs(inst->out, no);
    return rc;
}

static void instances_run(void *ctx, int index, struct executor_batch *bt) {
    struct instances *s = ctx;
    struct instance *inst = &s->inst[index];
    char err[256] = "";
    uint64_t t0 = bt->now_ns(bt->now_arg);
    int rc = gather(s, inst, bt, err, sizeof err);
    uint64_t t1 = bt->now_ns(bt->now_arg), t2 = t1, builds = model_exec_builds(inst->x);
    if (rc == 0) {
        rc = execute(s, inst, index, bt, err, sizeof err);
        t2 = bt->now_ns(bt->now_arg);
    }
    bt->planned = model_exec_builds(inst->x) != builds;
    uint64_t t3 = bt->now_ns(bt->now_arg);
    bt->exec_ns = t2 - t1;
    for (int k = 0; k < bt->n; k++) {
        struct batcher_request *r = bt->reqs[k];
        r->status = rc;
        r->noutputs = rc ? 0 : s->noutputs;
        if (rc)
            snprintf(r->err, sizeof r->err, "%s", err);
        else
            r->err[0] = 0;
        r->end_ns = t3;
        r->compute_input_ns = t1 - t0;
        r->compute_infer_ns = t2 - t1;
        r->compute_output_ns = t3 - t2;
        r->batch_size = (int)bt->rows;
    }
}

/* Whether the instance would run r alone on the calling thread: a CPU
 * model whose plan for r's shapes is bound and runs every step on one
 * thread (the batcher's inline run; a test executor never). */
static int instances_inline_ok(void *ctx, int index, const struct batcher_request *r) {
    struct instances *s = ctx;
    struct instance *inst = &s->inst[index];
    return !s->p.execute && inst->x && !strcmp(s->backend, "cpu") &&
           model_exec_one_thread(inst->x, r->inputs, r->ninputs);
}

/* ---- thread growth --------------------------------------------------------- */

/* Moves a heavy model's instance to more threads: a new backend context
 * and execution context (plans are built for a thread count), made and
 * swapped by the instance's own thread between batches. Tried once; on
 * failure the instance keeps what it has. */
static void instances_heavy(void *ctx, int index, const struct executor_batch *bt) {
    struct instances *s = ctx;
    struct instance *inst = &s->inst[index];
    if (inst->threads_heavy <= inst->nthreads)
        return;
    int n = inst->threads_heavy;
    inst->threads_heavy = 0;
    struct backend_params bp = {.device = -1, .nthreads = n};
    char why[256] = "";
    struct backend *be = backend_create(s->backend, &bp, why, sizeof why);
    struct model_exec *x = be ? model_exec_create(s->p.model, be, n) : NULL;
    if (!x) {
        backend_free(be);
        log_warn("model '%s' instance %d: staying at %d thread(s): cannot make a context with %d%s%s", s->name,
                 inst->index, inst->nthreads, n, why[0] ? ": " : "", why);
        return;
    }
    log_info("model '%s' instance %d: a batch took %.1f ms per request, so the I/O threads need little CPU: "
             "%d thread(s) instead of %d (set parameters.intra_op_thread_count to choose)",
             s->name, inst->index, (double)bt->exec_ns / 1e6 / (double)(bt->n > 0 ? bt->n : 1), n, inst->nthreads);
    model_exec_free(inst->x);
    backend_free(inst->be);
    inst->be = be;
    inst->x = x;
    inst->nthreads = n;
}

/* ---- making and freeing ------------------------------------------------------ */

static void instance_release(struct instance *inst) {
    model_exec_free(inst->x);
    backend_free(inst->be);
    if (inst->in_buf)
        for (int i = 0; i < inst->nbuf; i++)
            free(inst->in_buf[i]);
    free(inst->in_buf);
    free(inst->in_cap);
    free(inst->in);
    free(inst->out);
    free(inst->rows_of);
    free(inst->pad_src);
}

static void instances_free(void *ctx) {
    struct instances *s = ctx;
    if (!s)
        return;
    for (int i = 0; s->inst && i < s->n; i++)
        instance_release(&s->inst[i]);
    free(s->inst);
    free(s);
}

static const struct executor_i instances_iface = {
    .run = instances_run,
    .heavy = instances_heavy,
    .inline_ok = instances_inline_ok,
    .free = instances_free,
};

static int instance_setup(struct instances *s, struct instance *inst, int ninputs, int nthreads, char *err,
                          size_t err_len) {
    int nsel = s->p.max_rows > 0 ? s->p.max_rows : 1;
    /* Without a model the input count is known per request only. */
    int nin = ninputs > 0 ? ninputs : EXECUTOR_MAX_INPUTS, nout = s->noutputs > 0 ? s->noutputs : 1;
    inst->nbuf = nin;
    inst->rows_of = calloc((size_t)nsel, sizeof(*inst->rows_of));
    inst->pad_src = calloc((size_t)nsel, sizeof(*inst->pad_src));
    inst->in_buf = calloc((size_t)nin, sizeof(void *));
    inst->in_cap = calloc((size_t)nin, sizeof(size_t));
    inst->in = calloc((size_t)nin, sizeof(struct tensor));
    inst->out = calloc((size_t)nout, sizeof(struct tensor));
    if (!inst->rows_of || !inst->pad_src || !inst->in_buf || !inst->in_cap || !inst->in || !inst->out)
        return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    if (!s->p.model)
        return 0;
    struct backend_params bp = {.device = strcmp(s->backend, "cpu") == 0 ? -1 : 0, .nthreads = nthreads};
    char why[256] = "";
    inst->be = backend_create(s->backend, &bp, why, sizeof why);
    if (!inst->be)
        return status_set(err, err_len, STATUS_UNAVAILABLE, "model '%s' instance %d: backend '%s' not available: %s",
                          s->name, inst->index, s->backend, why);
    inst->x = model_exec_create(s->p.model, inst->be, nthreads);
    inst->nthreads = nthreads;
    if (!inst->x)
        return status_set(err, err_len, STATUS_INTERNAL, "model '%s' instance %d: cannot create an execution context",
                          s->name, inst->index);
    return 0;
}

int instances_create(const struct instances_params *p, struct executor *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    const char *name = p->model_name ? p->model_name : "?";
    if (!p->model && !p->execute) {
        status_set(err, err_len, STATUS_INVALID, "model '%s': no model to run", name);
        return STATUS_INVALID;
    }
    if (p->count < 0 || p->threads < 0 || p->max_rows < 0) {
        status_set(err, err_len, STATUS_INVALID, "model '%s': instance parameters out of range", name);
        return STATUS_INVALID;
    }
    struct instances *s = calloc(1, sizeof *s);
    if (!s)
        return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    s->p = *p;
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->backend, sizeof s->backend, "%s", p->backend && p->backend[0] ? p->backend : "cpu");
    s->p.model_name = s->name;
    s->p.backend = s->backend;
    s->n = p->count > 0 ? p->count : 1;
    int ninputs = p->model ? model_ninputs(p->model) : -1;
    s->noutputs = p->model ? model_noutputs(p->model) : p->execute_noutputs;
    s->inst = calloc((size_t)s->n, sizeof *s->inst);
    int rc = 0;
    if (!s->inst) {
        rc = status_set(err, err_len, STATUS_NOMEM, "out of memory");
        goto fail;
    }
    int nthreads = p->threads, heavy = 0;
    if (nthreads == 0) {
        /* The cores less one, which the I/O threads need, shared by the
         * instances. An OpenMP team larger than the cores free for it
         * stalls at every barrier: on 2 busy cores the digits model at
         * batch 32 took 0.75 ms on average with 2 threads and 0.027 ms
         * with 1. A heavy model (BATCHER_HEAVY_NS per request) leaves the
         * I/O threads little to do, and a core kept for them idles: its
         * instances move to all the cores once a run shows it (ResNet-50,
         * one instance on 2 cores: 30 ms a request instead of 39). */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = cores > 1 ? (int)((cores - 1) / s->n) : 1;
        if (nthreads < 1)
            nthreads = 1;
        heavy = cores > 1 ? (int)(cores / s->n) : 1;
        if (heavy <= nthreads || strcmp(s->backend, "cpu") != 0 || !p->model)
            heavy = 0;
    }
    for (int i = 0; i < s->n; i++) {
        s->inst[i].index = i;
        s->inst[i].threads_heavy = heavy;
        rc = instance_setup(s, &s->inst[i], ninputs, nthreads, err, err_len);
        if (rc)
            goto fail;
    }
    *out = (struct executor){.iface = &instances_iface, .ctx = s, .instances = s->n, .ninputs = ninputs,
                             .noutputs = s->noutputs, .threads = nthreads};
    snprintf(out->backend, sizeof out->backend, "%s", s->backend);
    return 0;
fail:
    log_error("%s", err);
    instances_free(s);
    return rc;
}

void executor_free(struct executor *ex) {
    if (!ex || !ex->iface)
        return;
    if (ex->iface->free)
        ex->iface->free(ex->ctx);
    memset(ex, 0, sizeof *ex);
}
