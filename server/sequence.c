/* sequence.c - the sequence batcher in front of a model's batcher. See
 * sequence.h.
 *
 * One mutex guards the table of sequences, the slots, the waiting list and
 * the counters; the batcher is called without it (its done() may run on the
 * calling thread and come back here).
 *
 * A sequence's requests form a FIFO (its backlog); at most one of them is
 * in the batcher (running). A request's done() is intercepted (seq_done):
 * the state outputs move into the sequence, the next request of the
 * backlog is taken (under the lock, so no other thread can release the
 * sequence meanwhile) and submitted after the request's own done() has
 * been called. */
#include "server/sequence.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/file.h"
#include "common/log.h"
#include "common/status.h"

#define SEQ_BUCKETS 1024
#define SEQ_TOMBS 512      /* released IDs remembered, to say why a late request is refused */

enum seq_gone { GONE_ENDED = 1, GONE_IDLE = 2 };

struct seq {
    uint64_t id;
    char *sid;                           /* string ID (owned), or NULL */
    struct seq *hnext;                   /* hash chain */
    struct seq *prev, *next;             /* every sequence of the sequencer */
    struct seq *wnext;                   /* waiting for a slot */
    int slot;                            /* -1: waiting */
    int in_table;                        /* found by its ID (a new START of an ended one takes its place) */
    int ended;                           /* its END request was accepted: no more requests */
    struct sequence_item *head, *tail;   /* backlog, in arrival order */
    struct sequence_item *running;       /* in the batcher */
    uint64_t last_ns;                    /* last request accepted or answered */
    struct tensor state[MODEL_SEQ_MAX_STATES];
    int state_owned[MODEL_SEQ_MAX_STATES];
    /* The control inputs' values (one element each) and tensors. */
    union {
        float f;
        int32_t i32;
        uint8_t b;
        uint64_t u64;
        int64_t i64;
        uint32_t u32;
        struct tensor_str s;
    } ctrl_val[MODEL_SEQ_MAX_CONTROLS];
};

struct tomb {
    uint64_t id;
    char *sid;
    int why;
};

struct sequencer {
    struct sequencer_params p;
    const struct model_config *mc;
    const struct model_sequence *cfg;
    char name[128];
    int batching;                        /* max_batch_size > 0: tensors have a batch dim */
    int ctrl_in[MODEL_SEQ_MAX_CONTROLS]; /* the config's input index of each control */
    int state_in[MODEL_SEQ_MAX_STATES], state_out[MODEL_SEQ_MAX_STATES];
    struct tensor init[MODEL_SEQ_MAX_STATES]; /* initial states (owned blocks) */

    pthread_mutex_t mu;
    pthread_cond_t cv;                   /* the idle thread: exit */
    struct seq *buckets[SEQ_BUCKETS];
    struct seq *all;
    struct seq *wait_head, *wait_tail;
    int nslots;
    int ninst, per_inst;                 /* instances; direct: slots per instance (max_batch_size or 1) */
    uint8_t *slot_used;
    uint64_t *slot_requests;
    struct tomb tombs[SEQ_TOMBS];
    int ntomb;                           /* next tomb to write (a ring) */
    uint64_t live, waiting, started, ended, idle_released;
    pthread_t idle;
    int idle_started, exiting;
};

/* ---- the table ------------------------------------------------------------ */

static uint64_t id_hash(uint64_t id, const char *sid) {
    uint64_t h = 1469598103934665603ull;
    if (sid)
        for (const char *p = sid; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    else
        h = (id ^ (id >> 29)) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 32);
}

static int id_eq(uint64_t a, const char *as, uint64_t b, const char *bs) {
    if (!as != !bs) return 0;
    return as ? strcmp(as, bs) == 0 : a == b;
}

static struct seq **bucket(sequencer_t *s, uint64_t id, const char *sid) {
    return &s->buckets[id_hash(id, sid) % SEQ_BUCKETS];
}

static struct seq *seq_find(sequencer_t *s, uint64_t id, const char *sid) {
    for (struct seq *q = *bucket(s, id, sid); q; q = q->hnext)
        if (id_eq(q->id, q->sid, id, sid)) return q;
    return NULL;
}

static void seq_unhash(sequencer_t *s, struct seq *q) {
    if (!q->in_table) return;
    for (struct seq **pp = bucket(s, q->id, q->sid); *pp; pp = &(*pp)->hnext)
        if (*pp == q) {
            *pp = q->hnext;
            break;
        }
    q->in_table = 0;
}

/* "42" or "'abc'", for messages. A long string ID is cut short: a
 * request's error has 256 bytes, and the reason must fit beside it. */
static const char *id_str(uint64_t id, const char *sid, char *buf, size_t cap) {
    size_t n = sid ? strlen(sid) : 0;
    if (n > 48) snprintf(buf, cap, "'%.40s...' (%zu bytes)", sid, n);
    else if (sid) snprintf(buf, cap, "'%s'", sid);
    else snprintf(buf, cap, "%llu", (unsigned long long)id);
    return buf;
}

static void tomb_drop(sequencer_t *s, uint64_t id, const char *sid);

/* Remembers why q's ID went (the latest reason only). */
static void tomb_add(sequencer_t *s, const struct seq *q, int why) {
    tomb_drop(s, q->id, q->sid);
    struct tomb *t = &s->tombs[s->ntomb];
    free(t->sid);
    t->id = q->id;
    t->sid = q->sid ? strdup(q->sid) : NULL;
    t->why = q->sid && !t->sid ? 0 : why;
    s->ntomb = (s->ntomb + 1) % SEQ_TOMBS;
}

static void tomb_drop(sequencer_t *s, uint64_t id, const char *sid) {
    for (int i = 0; i < SEQ_TOMBS; i++)
        if (s->tombs[i].why && id_eq(s->tombs[i].id, s->tombs[i].sid, id, sid)) s->tombs[i].why = 0;
}

static int tomb_find(const sequencer_t *s, uint64_t id, const char *sid) {
    for (int i = 0; i < SEQ_TOMBS; i++)
        if (s->tombs[i].why && id_eq(s->tombs[i].id, s->tombs[i].sid, id, sid)) return s->tombs[i].why;
    return 0;
}

/* ---- state and controls ------------------------------------------------------ */

/* An owned copy of src in *dst (strings included); a scalar too. 0 or STATUS_NOMEM. */
static int state_copy(struct tensor *dst, const struct tensor *src) {
    struct tensor v = *src;
    if (v.ndim == 0) {
        v.ndim = 1;
        v.dims[0] = 1;
    }
    struct tensor_rows rows = {&v, 0, v.dims[0]};
    if (tensor_copy_rows(dst, &rows, 1)) return STATUS_NOMEM;
    dst->ndim = src->ndim;
    memcpy(dst->dims, src->dims, sizeof dst->dims);
    return 0;
}

static void state_set_initial(sequencer_t *s, struct seq *q) {
    for (int k = 0; k < s->cfg->nstates; k++) {
        if (q->state_owned[k]) tensor_free_data(&q->state[k]);
        q->state[k] = s->init[k]; /* a view of the sequencer's block */
        q->state_owned[k] = 0;
    }
}

static void seq_free(struct seq *q) {
    for (int k = 0; k < MODEL_SEQ_MAX_STATES; k++)
        if (q->state_owned[k]) tensor_free_data(&q->state[k]);
    free(q->sid);
    free(q);
}

/* Shape of a one-element control input: the config's dims (each 1), with
 * the batch dim. */
static void ctrl_shape(const sequencer_t *s, int in, struct tensor *t) {
    const struct model_config_io *io = &s->mc->inputs[in];
    t->ndim = 0;
    if (s->batching) t->dims[t->ndim++] = 1;
    for (int d = 0; d < io->ndim && t->ndim < TENSOR_MAX_DIMS; d++) t->dims[t->ndim++] = 1;
}

/* Fills item's hidden inputs: controls for its flags, the sequence's state. */
static void fill_inputs(sequencer_t *s, struct seq *q, struct sequence_item *it) {
    const struct model_sequence *c = s->cfg;
    if (it->start) state_set_initial(s, q);
    for (int k = 0; k < c->ncontrols; k++) {
        const struct model_seq_control *x = &c->controls[k];
        struct tensor *t = &it->inputs_[s->ctrl_in[k]];
        memset(t, 0, sizeof *t);
        t->dtype = x->dtype;
        ctrl_shape(s, s->ctrl_in[k], t);
        t->data = &q->ctrl_val[k];
        if (x->kind == MODEL_SEQ_CORRID) {
            switch (x->dtype) {
            case DT_STRING: q->ctrl_val[k].s = tensor_str_of(q->sid ? q->sid : ""); break;
            case DT_UINT64: q->ctrl_val[k].u64 = q->id; break;
            case DT_INT64: q->ctrl_val[k].i64 = (int64_t)q->id; break;
            case DT_UINT32: q->ctrl_val[k].u32 = (uint32_t)q->id; break;
            default: q->ctrl_val[k].i32 = (int32_t)q->id; break;
            }
            continue;
        }
        /* READY is always true: kiln runs a sequence's row only when it has a request. */
        int on = x->kind == MODEL_SEQ_START ? it->start : x->kind == MODEL_SEQ_END ? it->end : 1;
        double v = x->value[on];
        if (x->dtype == DT_FP32) q->ctrl_val[k].f = (float)v;
        else if (x->dtype == DT_INT32) q->ctrl_val[k].i32 = (int32_t)v;
        else q->ctrl_val[k].b = v != 0;
    }
    for (int k = 0; k < c->nstates; k++) it->inputs_[s->state_in[k]] = q->state[k];
}

/* ---- slots and release ------------------------------------------------------- */

static int slot_take(sequencer_t *s) {
    for (int i = 0; i < s->nslots; i++)
        if (!s->slot_used[i]) {
            s->slot_used[i] = 1;
            return i;
        }
    return -1;
}

/* Takes the next request of q to run, if q holds a slot and runs nothing
 * (lock held): marked running, its inputs filled. NULL: nothing to run. */
static struct sequence_item *next_item(sequencer_t *s, struct seq *q) {
    if (q->slot < 0 || q->running || !q->head) return NULL;
    struct sequence_item *it = q->head;
    q->head = it->next_;
    if (!q->head) q->tail = NULL;
    q->running = it;
    fill_inputs(s, q, it);
    /* The sequence runs on its slot's instance, always the same one. */
    it->r_->pin = (s->cfg->oldest ? q->slot % s->ninst : q->slot / s->per_inst) + 1;
    if (q->slot < 256) s->slot_requests[q->slot]++;
    return it;
}

/* Frees q's slot and q (lock held; nothing running or waiting in it). The
 * slot goes to the first sequence waiting for one, whose next request is
 * returned to be submitted. */
static struct sequence_item *seq_release(sequencer_t *s, struct seq *q, int why) {
    int slot = q->slot;
    seq_unhash(s, q);
    if (q->prev) q->prev->next = q->next;
    else s->all = q->next;
    if (q->next) q->next->prev = q->prev;
    if (why) tomb_add(s, q, why);
    if (why == GONE_IDLE) s->idle_released++;
    else s->ended++;
    if (slot >= 0) s->live--;
    seq_free(q);
    if (slot < 0) return NULL;
    struct seq *w = s->wait_head;
    if (!w) {
        s->slot_used[slot] = 0;
        return NULL;
    }
    s->wait_head = w->wnext;
    if (!s->wait_head) s->wait_tail = NULL;
    s->waiting--;
    s->live++;
    w->slot = slot;
    return next_item(s, w);
}

/* ---- running ------------------------------------------------------------------- */

static void seq_done(struct batcher_request *r);

/* Ends its turn (lock NOT held): a successful run's state outputs move
 * into the sequence, the sequence's next request is taken (under the lock,
 * so that nothing releases the sequence meanwhile) and the request's own
 * done() is called. Returns the next request to submit, or NULL. */
static struct sequence_item *finish_item(sequencer_t *s, struct sequence_item *it) {
    struct batcher_request *r = it->r_;
    pthread_mutex_lock(&s->mu);
    struct seq *q = it->seq_;
    if (r->status == 0 && r->noutputs > 0)
        for (int k = 0; k < s->cfg->nstates; k++) {
            struct tensor *o = &r->outputs[s->state_out[k]];
            struct tensor kept = *o;
            /* A state output the client also gets is copied; else its block moves. */
            if (s->cfg->states[k].output_listed ? state_copy(&kept, o) : (o->data = NULL, 0)) {
                r->status = status_set(r->err, sizeof r->err, STATUS_NOMEM, "out of memory keeping state '%s'",
                                       s->cfg->states[k].input);
                break;
            }
            if (q->state_owned[k]) tensor_free_data(&q->state[k]);
            q->state[k] = kept;
            q->state_owned[k] = 1;
        }
    q->running = NULL;
    q->last_ns = clock_now_ns();
    struct sequence_item *next;
    if (it->end && !q->head) next = seq_release(s, q, GONE_ENDED);
    else next = next_item(s, q);
    pthread_mutex_unlock(&s->mu);
    r->done = it->done_;
    r->user = it->user_;
    r->done(r);
    return next;
}

/* Submits it (lock NOT held); a request the batcher refuses is answered at
 * once (its status and err are the batcher's) and the sequence's next one
 * tried. */
static void submit_item(sequencer_t *s, struct sequence_item *it) {
    while (it) {
        struct batcher_request *r = it->r_;
        r->done = seq_done;
        r->user = it;
        if (batcher_submit(s->p.batcher, r) == 0) return;
        if (!r->status) r->status = STATUS_UNAVAILABLE;
        r->noutputs = 0;
        it = finish_item(s, it);
    }
}

/* A request of a sequence is done (an instance's or the timer's thread);
 * the sequence's next request goes to the batcher after its done(). */
static void seq_done(struct batcher_request *r) {
    struct sequence_item *it = r->user;
    sequencer_t *s = it->s_;
    struct sequence_item *next = finish_item(s, it);
    if (next) submit_item(s, next);
}

/* A request without START for a sequence that is not running: Triton's
 * words (its clients' tests compare them), then why (why: how it went, 0
 * if it never ran or is forgotten). */
static int no_start(const sequencer_t *s, struct batcher_request *r, const char *ids, int why) {
    char tail[256];
    if (why == GONE_IDLE)
        snprintf(tail, sizeof tail, "the sequence was released after %llu us without a request "
                 "(max_sequence_idle_microseconds) and its state is gone", (unsigned long long)s->cfg->max_idle_us);
    else if (why == GONE_ENDED)
        snprintf(tail, sizeof tail, "the sequence has ended (a request with sequence_end came before)");
    else
        snprintf(tail, sizeof tail, "no sequence with this ID is running");
    return status_set(r->err, sizeof r->err, STATUS_INVALID,
                      "inference request for sequence %s to model '%s' must specify the START flag on the first "
                      "request of the sequence: %s", ids, s->name, tail);
}

int sequencer_submit(sequencer_t *s, struct sequence_item *it, struct batcher_request *r, struct tensor *inputs) {
    char ids[256];
    r->status = 0;
    r->err[0] = 0;
    if (!it->sid && !it->id)
        return status_set(r->err, sizeof r->err, STATUS_INVALID,
                          "inference request to model '%s' must specify a non-zero or non-empty correlation ID "
                          "(parameters.sequence_id): the model keeps state per sequence (sequence_batching)", s->name);
    id_str(it->id, it->sid, ids, sizeof ids);
    if (r->rows != 1)
        return status_set(r->err, sizeof r->err, STATUS_INVALID,
                          "inference request to model '%s' must specify batch-size 1 due to requirements of "
                          "sequence batcher (sequence %s sent %lld rows: a request is one step of its sequence)",
                          s->name, ids, (long long)r->rows);
    for (int k = 0; k < s->cfg->ncontrols; k++) {
        const struct model_seq_control *x = &s->cfg->controls[k];
        if (x->kind == MODEL_SEQ_CORRID && !it->sid != (x->dtype != DT_STRING))
            return status_set(r->err, sizeof r->err, STATUS_INVALID,
                              "inference request for sequence %s to model '%s' has %s correlation ID but the "
                              "model's CORRID input '%s' is %s", ids, s->name, it->sid ? "a string" : "an integer",
                              x->input, dtype_config_name(x->dtype));
    }
    it->r_ = r;
    it->inputs_ = inputs;
    it->done_ = r->done;
    it->user_ = r->user;
    it->s_ = s;
    it->next_ = NULL;
    pthread_mutex_lock(&s->mu);
    struct seq *q = seq_find(s, it->id, it->sid);
    if (q && q->ended) { /* its END is accepted: a START begins a new one, anything else is late */
        if (!it->start) {
            pthread_mutex_unlock(&s->mu);
            return no_start(s, r, ids, GONE_ENDED);
        }
        seq_unhash(s, q);
        q = NULL;
    }
    if (it->start && q) {
        pthread_mutex_unlock(&s->mu);
        return status_set(r->err, sizeof r->err, STATUS_INVALID,
                          "inference request for sequence %s to model '%s' has sequence_start, but that sequence "
                          "is running and has not ended: end it first (sequence_end) or use another ID", ids,
                          s->name);
    }
    if (!q && !it->start) {
        int why = tomb_find(s, it->id, it->sid);
        pthread_mutex_unlock(&s->mu);
        return no_start(s, r, ids, why);
    }
    if (!q) {
        q = calloc(1, sizeof *q);
        if (!q || (it->sid && !(q->sid = strdup(it->sid)))) {
            free(q);
            pthread_mutex_unlock(&s->mu);
            return status_set(r->err, sizeof r->err, STATUS_NOMEM, "out of memory starting sequence %s", ids);
        }
        q->id = it->id;
        struct seq **b = bucket(s, q->id, q->sid);
        q->hnext = *b;
        *b = q;
        q->in_table = 1;
        q->next = s->all;
        if (s->all) s->all->prev = q;
        s->all = q;
        tomb_drop(s, q->id, q->sid);
        state_set_initial(s, q);
        s->started++;
        q->slot = slot_take(s);
        if (q->slot >= 0) s->live++;
        else {
            if (s->wait_tail) s->wait_tail->wnext = q;
            else s->wait_head = q;
            s->wait_tail = q;
            s->waiting++;
        }
    }
    it->seq_ = q;
    if (q->tail) q->tail->next_ = it;
    else q->head = it;
    q->tail = it;
    if (it->end) q->ended = 1;
    q->last_ns = clock_now_ns();
    struct sequence_item *run = next_item(s, q);
    pthread_mutex_unlock(&s->mu);
    if (run) submit_item(s, run);
    return 0;
}

/* ---- idle release ------------------------------------------------------------- */

static void *idle_main(void *arg) {
    sequencer_t *s = arg;
    uint64_t idle_ns = s->cfg->max_idle_us * 1000ull;
    /* Checked a few times per idle period (at most every 100 ms, at least every 1 ms). */
    uint64_t tick = idle_ns / 4;
    if (tick > 100000000ull) tick = 100000000ull;
    if (tick < 1000000ull) tick = 1000000ull;
    pthread_mutex_lock(&s->mu);
    while (!s->exiting) {
        uint64_t now = clock_now_ns();
        struct sequence_item *run[16];
        int nrun = 0;
        for (struct seq *q = s->all, *nx; q; q = nx) {
            nx = q->next;
            if (q->running || q->head || q->slot < 0 || now - q->last_ns < idle_ns) continue;
            char ids[256];
            log_info("model '%s': sequence %s released after %.1f ms without a request", s->name,
                     id_str(q->id, q->sid, ids, sizeof ids), (double)(now - q->last_ns) / 1e6);
            struct sequence_item *it = seq_release(s, q, GONE_IDLE);
            if (it) run[nrun++] = it;
            if (nrun == 16) break; /* the rest on the next pass */
        }
        if (nrun) {
            pthread_mutex_unlock(&s->mu);
            for (int i = 0; i < nrun; i++) submit_item(s, run[i]);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        uint64_t wake = clock_now_ns() + tick;
        struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000ull), .tv_nsec = (long)(wake % 1000000000ull)};
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- making and freeing ------------------------------------------------------- */

/* The initial value of state k: zeros or the file's bytes, of its
 * initial_state dims (else its dims, each -1 taken as 1), with a batch dim
 * of 1. */
static int init_state(sequencer_t *s, int k, char *err, size_t err_len) {
    const struct model_seq_state *x = &s->cfg->states[k];
    struct tensor *t = &s->init[k];
    t->dtype = x->dtype;
    t->ndim = 0;
    if (s->batching) t->dims[t->ndim++] = 1;
    int nd = x->init_ndim >= 0 ? x->init_ndim : x->ndim;
    const int64_t *dims = x->init_ndim >= 0 ? x->init_dims : x->dims;
    /* Without initial_state a variable dim is 1 (as Triton's first request of a sequence has it). */
    for (int d = 0; d < nd; d++) t->dims[t->ndim++] = dims[d] < 0 ? 1 : dims[d];
    if (x->dtype == DT_STRING) { /* zeros are empty strings; a file holds 4-byte-length-prefixed strings */
        if (!x->file) {
            int64_t n = tensor_numel(t);
            struct tensor_str *e = calloc((size_t)(n > 0 ? n : 1), sizeof *e);
            for (int64_t k = 0; e && k < n; k++) e[k] = tensor_str_of("");
            int rc = e ? tensor_strings_pack(t, e) : STATUS_NOMEM;
            free(e);
            return rc ? status_set(err, err_len, STATUS_NOMEM, "out of memory") : 0;
        }
        return status_set(err, err_len, STATUS_INVALID, "config field 'sequence_batching.state' '%s': a TYPE_STRING "
                          "state starts from zero_data (empty strings); kiln reads no data_file for one", x->input);
    }
    size_t bytes = (size_t)tensor_numel(t) * dtype_size(x->dtype);
    t->data = calloc(1, bytes ? bytes : 1);
    if (!t->data) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    if (!x->file) return 0;
    char path[4096], e2[4200];
    snprintf(path, sizeof path, "%s/initial_state/%s", s->p.model_dir ? s->p.model_dir : ".", x->file);
    int64_t size;
    int st;
    FILE *f = file_open_regular(path, (int64_t)bytes + 1, &size, &st, e2, sizeof e2);
    if (!f)
        return status_set(err, err_len, STATUS_INVALID, "config field 'sequence_batching.state' '%s': initial_state "
                          "data_file: %s", x->input, e2);
    size_t got = fread(t->data, 1, bytes, f);
    fclose(f);
    if ((int64_t)got != size || got != bytes)
        return status_set(err, err_len, STATUS_INVALID, "config field 'sequence_batching.state' '%s': initial_state "
                          "data_file '%s' holds %lld bytes but the state (%s, %lld elements) needs %zu", x->input,
                          x->file, (long long)size, dtype_config_name(x->dtype), (long long)tensor_numel(t), bytes);
    return 0;
}

void sequencer_free(sequencer_t *s) {
    if (!s) return;
    if (s->idle_started) {
        pthread_mutex_lock(&s->mu);
        s->exiting = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->idle, NULL);
    }
    /* The batcher is gone: what is left waits in backlogs (sequences that
     * never got a slot). Each is answered once. */
    for (;;) {
        pthread_mutex_lock(&s->mu);
        struct seq *q = s->all;
        struct sequence_item *it = q ? q->head : NULL;
        if (it) {
            q->head = it->next_;
            if (!q->head) q->tail = NULL;
        } else if (q) {
            s->all = q->next;
            seq_unhash(s, q);
            seq_free(q);
        }
        pthread_mutex_unlock(&s->mu);
        if (!q) break;
        if (!it) continue;
        struct batcher_request *r = it->r_;
        r->status = status_set(r->err, sizeof r->err, STATUS_UNAVAILABLE, "model '%s' is unloading", s->name);
        r->noutputs = 0;
        r->done = it->done_;
        r->user = it->user_;
        r->done(r);
    }
    for (int k = 0; k < MODEL_SEQ_MAX_STATES; k++) tensor_free_data(&s->init[k]);
    for (int i = 0; i < SEQ_TOMBS; i++) free(s->tombs[i].sid);
    free(s->slot_used);
    free(s->slot_requests);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

sequencer_t *sequencer_create(const struct sequencer_params *p, char *err, size_t err_len) {
    const struct model_config *mc = p->config;
    sequencer_t *s = calloc(1, sizeof *s);
    if (!s) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        return NULL;
    }
    s->p = *p;
    s->mc = mc;
    s->cfg = &mc->sequence;
    snprintf(s->name, sizeof s->name, "%s", mc->name);
    s->batching = mc->max_batch_size > 0;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    int per = mc->max_batch_size > 0 ? mc->max_batch_size : 1;
    int inst = p->instances > 0 ? p->instances : 1;
    s->nslots = s->cfg->oldest && s->cfg->max_candidates > 0 ? s->cfg->max_candidates : per * inst;
    s->ninst = inst;
    s->per_inst = per;
    s->slot_used = calloc((size_t)s->nslots, 1);
    s->slot_requests = calloc(256, sizeof *s->slot_requests);
    if (!s->slot_used || !s->slot_requests) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        goto fail;
    }
    for (int k = 0; k < s->cfg->ncontrols; k++) s->ctrl_in[k] = model_config_find_input(mc, s->cfg->controls[k].input);
    for (int k = 0; k < s->cfg->nstates; k++) {
        s->state_in[k] = model_config_find_input(mc, s->cfg->states[k].input);
        s->state_out[k] = model_config_find_output(mc, s->cfg->states[k].output);
        if (init_state(s, k, err, err_len)) goto fail;
    }
    if (pthread_create(&s->idle, NULL, idle_main, s)) {
        status_set(err, err_len, STATUS_INTERNAL, "model '%s': cannot start the sequence idle thread", s->name);
        goto fail;
    }
    s->idle_started = 1;
    log_info("model '%s': sequence batcher, strategy %s, %d slot(s), %d control input(s), %d implicit state(s), "
             "idle release after %llu us", s->name, s->cfg->oldest ? "oldest" : "direct", s->nslots,
             s->cfg->ncontrols, s->cfg->nstates, (unsigned long long)s->cfg->max_idle_us);
    return s;
fail:
    sequencer_free(s);
    return NULL;
}

void sequencer_get_stats(sequencer_t *s, struct sequencer_stats *out, uint8_t *slot_room, int room) {
    memset(out, 0, sizeof *out);
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    out->live = s->live;
    out->waiting = s->waiting;
    out->started = s->started;
    out->ended = s->ended;
    out->idle_released = s->idle_released;
    out->nslots = s->nslots < room ? s->nslots : room;
    if (slot_room) memcpy(slot_room, s->slot_used, (size_t)out->nslots);
    out->slot_used = slot_room;
    memcpy(out->slot_requests, s->slot_requests, sizeof out->slot_requests);
    pthread_mutex_unlock(&s->mu);
}
