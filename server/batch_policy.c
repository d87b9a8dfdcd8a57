/* batch_policy.c - the dynamic batcher's policy: which queued requests form
 * the next batch and when it runs (preferred sizes, queue delay, latency
 * budget, priorities, shapes and length buckets), and the execution profile
 * the latency budget predicts from. Pure functions of their arguments: no
 * lock, no thread, no clock (see batch_policy.h). */
#include "server/batch_policy.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "common/status.h"
#include "server/padding.h"

/* How many queued requests one batch formation may look at: bounds the
 * cost of skipping requests whose shapes differ from the head's. */
#define BATCH_SCAN_LIMIT 4096
/* The latency budget aims to finish this fraction (1/N) of it early. */
#define BATCH_BUDGET_SLACK 10
/* Under a latency budget, a free instance waits for a larger batch only
 * when running batches of the current size would keep the instances at
 * least this busy (execution time per request over the time between
 * requests): below it, they keep up without waiting. */
#define BATCH_BUDGET_BUSY 0.5
/* A batch size whose profiled run time (runs that built a plan and single
 * stalled runs left out) is at least BATCH_HEAVY_NS per request and
 * BATCH_HEAVY_RUN_NS per run marks the model heavy: the I/O threads then
 * need a small fraction of a core (a request costs them tens of
 * microseconds), and a run is long enough to pay for an OpenMP team's
 * fork and join at each of its operators, so instances whose thread count
 * kiln chose move to every core (see batcher_create). A BERT-class model of
 * 2 layers, hidden 128, on 2 cores: batches of 8-16 padded sequences (0.3-
 * 0.5 ms a request, runs of 3 ms and more) served 1.4x the requests on 2
 * threads; single sequences (runs under 1 ms) 1.35x on 1. */
#define BATCH_HEAVY_NS 250000ull
#define BATCH_HEAVY_RUN_NS 2000000ull
/* Weight of a new sample in the execution-time profile. */
#define BATCH_EWMA_NEW 0.25

/* ---- queues -------------------------------------------------------------- */

void batch_fifo_push(struct batch_fifo *f, struct batcher_request *r) {
    r->q_.next = NULL;
    r->q_.prev = f->tail;
    if (f->tail)
        f->tail->q_.next = r;
    else
        f->head = r;
    f->tail = r;
    f->n++;
}

void batch_fifo_remove(struct batch_fifo *f, struct batcher_request *r) {
    if (r->q_.prev)
        r->q_.prev->q_.next = r->q_.next;
    else
        f->head = r->q_.next;
    if (r->q_.next)
        r->q_.next->q_.prev = r->q_.prev;
    else
        f->tail = r->q_.prev;
    r->q_.prev = r->q_.next = NULL;
    f->n--;
}

/* ---- execution profile --------------------------------------------------- */

int batch_profile_init(struct batch_profile *pr, int nbuckets, int64_t cap_rows) {
    size_t n = (size_t)nbuckets * (size_t)(cap_rows + 1);
    pr->nbuckets = nbuckets;
    pr->cap_rows = cap_rows;
    pr->ns = calloc(n, sizeof *pr->ns);
    pr->n = calloc(n, sizeof *pr->n);
    if (!pr->ns || !pr->n) {
        batch_profile_release(pr);
        return STATUS_NOMEM;
    }
    return 0;
}

void batch_profile_release(struct batch_profile *pr) {
    free(pr->ns);
    free(pr->n);
    pr->ns = NULL;
    pr->n = NULL;
}

/* Predicted execution time of a batch of n rows from the profile. Time
 * grows with rows, so any size >= n seen bounds it: the smallest running
 * mean over sizes >= n (a size that ran slow once cannot block itself and
 * every smaller one). Else, from the two largest smaller sizes seen, their
 * line; from one, its time scaled by rows (pessimistic); else 0 (nothing
 * learnt yet). */
uint64_t batch_predict_ns(const struct batch_profile *pr, int bi, int64_t n) {
    const uint64_t *profile = pr->ns + (size_t)bi * (size_t)(pr->cap_rows + 1);
    if (n > pr->cap_rows)
        n = pr->cap_rows;
    if (n < 1)
        n = 1;
    uint64_t up = 0;
    for (int64_t k = n; k <= pr->cap_rows; k++)
        if (profile[k] && (!up || profile[k] < up))
            up = profile[k];
    if (up)
        return up;
    int64_t k1 = 0, k0 = 0;
    for (int64_t k = n - 1; k >= 1 && !k0; k--)
        if (profile[k]) {
            if (!k1)
                k1 = k;
            else
                k0 = k;
        }
    if (!k1)
        return 0;
    if (!k0)
        return (uint64_t)((double)profile[k1] * (double)n / (double)k1);
    /* The line through the two largest sizes seen: a fixed cost per batch
     * plus a cost per row (never negative). */
    double slope = ((double)profile[k1] - (double)profile[k0]) / (double)(k1 - k0);
    if (slope < 0)
        slope = 0;
    return (uint64_t)((double)profile[k1] + slope * (double)(n - k1));
}

/* The first run of a batch size usually builds its plan (kernels, memory):
 * the second sample replaces the first when lower. Later samples count at
 * most twice the running mean, so that a run the scheduler stalled does not
 * shrink batches for the next many runs; a real slowdown still shows, in a
 * few runs. */
void batch_profile_add(struct batch_profile *pr, int bi, int64_t rows, uint64_t ns) {
    if (rows < 1 || rows > pr->cap_rows)
        return;
    if (!ns)
        ns = 1;
    uint64_t *profile = pr->ns + (size_t)bi * (size_t)(pr->cap_rows + 1);
    uint32_t *profile_n = pr->n + (size_t)bi * (size_t)(pr->cap_rows + 1);
    uint64_t old = profile[rows];
    uint32_t n = profile_n[rows]++;
    if (n >= 2 && ns > 2 * old)
        ns = 2 * old;
    if (n == 0 || (n == 1 && ns < old))
        profile[rows] = ns;
    else
        profile[rows] = (uint64_t)((1.0 - BATCH_EWMA_NEW) * (double)old + BATCH_EWMA_NEW * (double)ns);
}

/* From the profile, not one run: one run that the scheduler stalled must
 * not move a small model to threads (where each tiny run then pays a
 * fork-join). */
int batch_profile_heavy(const struct batch_profile *pr, int bi, int64_t rows, int nreq) {
    if (rows < 1 || rows > pr->cap_rows)
        return 0;
    size_t at = (size_t)bi * (size_t)(pr->cap_rows + 1) + (size_t)rows;
    return pr->n[at] >= 2 && pr->ns[at] >= BATCH_HEAVY_NS * (uint64_t)nreq && pr->ns[at] >= BATCH_HEAVY_RUN_NS;
}

/* ---- arrivals and wake-ups ----------------------------------------------- */

void batch_note_arrival(struct batch_rates *rt, uint64_t now) {
    if (rt->last_arrival_ns) {
        uint64_t gap = now - rt->last_arrival_ns;
        rt->gap_ewma_ns = rt->gap_ewma_ns ? (rt->gap_ewma_ns * 7 + gap) / 8 : (gap ? gap : 1);
    }
    rt->last_arrival_ns = now;
}

/* Rises fast and decays slowly: tracks the high end of the lateness, which
 * is what a budget at p99 must allow for. */
void batch_note_wakeup(struct batch_rates *rt, uint64_t wake, uint64_t t) {
    uint64_t late = t >= wake ? t - wake : 0;
    if (late > rt->late_ewma_ns)
        rt->late_ewma_ns += (late - rt->late_ewma_ns) / 4;
    else
        rt->late_ewma_ns -= (rt->late_ewma_ns - late) / 32;
}

/* ---- batch formation ----------------------------------------------------- */

/* 1 if a and b may share a batch: same inputs, dtypes, ranks and non-batch
 * dims (the batch dim is dims[0] when batching); with padding, padded dims
 * in one length bucket (server/padding.h). */
static int compatible(const struct batch_config *cfg, const struct batcher_request *a,
                      const struct batcher_request *c) {
    if (a->ninputs != c->ninputs)
        return 0;
    if (cfg->pad)
        return pad_compatible(cfg->pad, a->inputs, c->inputs, a->ninputs);
    int first = cfg->max_batch_size > 0 ? 1 : 0;
    for (int i = 0; i < a->ninputs; i++) {
        const struct tensor *x = &a->inputs[i], *y = &c->inputs[i];
        if (x->dtype != y->dtype || x->ndim != y->ndim)
            return 0;
        for (int d = first; d < x->ndim; d++)
            if (x->dims[d] != y->dims[d])
                return 0;
    }
    return 1;
}

/* When r must finish under the latency budget: a margin early, a tenth of
 * the budget plus twice the usual lateness of the instances' timed
 * wake-ups, which a busy machine makes long. */
static uint64_t budget_due(const struct batch_config *c, const struct batch_rates *rt,
                           const struct batcher_request *r) {
    uint64_t budget = c->latency_budget_us * 1000ull;
    uint64_t margin = budget / BATCH_BUDGET_SLACK + 2 * rt->late_ewma_ns;
    if (margin > budget / 2)
        margin = budget / 2;
    return r->enqueue_ns + budget - margin;
}

/* r's length bucket: the profile's row for batches it leads. */
static int req_bucket(const struct batch_config *c, const struct batcher_request *r) {
    const struct pad_spec *p = c->pad;
    if (!p)
        return 0;
    const struct tensor *t = &r->inputs[p->in[0].input];
    return p->in[0].axis < t->ndim ? pad_bucket_index(p, t->dims[p->in[0].axis]) : 0;
}

/* Notes a cancelled request for the caller to fail: 1 while there is room. */
static int drop_add(struct batch_decision *d, struct batcher_request *r) {
    if (d->ndrop == BATCH_DROP_MAX)
        return 0;
    d->drop[d->ndrop++] = r;
    return 1;
}

/* Cuts the batch back to its first n requests. */
static void keep_first(struct batch_decision *d, int n) {
    while (d->nsel > n) {
        d->nsel--;
        d->rows -= d->sel[d->nsel]->rows;
    }
}

/* The latency budget's decision on a batch formed but not full: run it now
 * (maybe cut to the prefix that still makes the head's budget) or wait for
 * more rows while a larger batch could still make it. */
static int decide_budget(const struct batch_config *c, const struct batch_profile *pr, const struct batch_rates *rt,
                         uint64_t now, struct batch_decision *d) {
    const struct batcher_request *h = d->sel[0];
    /* Latest start for the head to finish within its budget with the
     * batch we have; wait for more rows only while a larger batch could
     * still make it. */
    uint64_t due = budget_due(c, rt, h);
    /* Already too late for all of it: the largest prefix that still
     * makes it, if what is cut off can make it after that batch too;
     * else everything (shrinking would only make the rest late). */
    if (d->nsel > 1 && now + batch_predict_ns(pr, d->bucket, d->rows) > due) {
        int n = d->nsel;
        int64_t rows = d->rows;
        while (n > 1 && now + batch_predict_ns(pr, d->bucket, rows) > due)
            rows -= d->sel[--n]->rows;
        if (now + batch_predict_ns(pr, d->bucket, rows) <= due &&
            now + batch_predict_ns(pr, d->bucket, rows) + batch_predict_ns(pr, d->bucket, d->rows - rows) <=
                budget_due(c, rt, d->sel[n])) {
            d->nsel = n;
            d->rows = rows;
        }
        return BATCH_SEND;
    }
    uint64_t exec_now = batch_predict_ns(pr, d->bucket, d->rows);
    uint64_t exec_more = batch_predict_ns(pr, d->bucket, d->rows + 1);
    if (now + exec_more > due || now + exec_now >= due)
        return BATCH_SEND;
    uint64_t latest = due - exec_more;
    /* Waiting pays only if another request is likely to come before
     * the latest start: at a low rate, go now instead of spending the
     * budget on waiting. Nor does it pay while the instances keep up
     * with arrivals at this batch size with room to spare: batches
     * then grow by themselves whenever the instances are busy, and
     * waiting would only add its time to every request's latency (and
     * cut throughput in a closed loop). */
    if (rt->gap_ewma_ns) {
        double load = (double)exec_now / ((double)d->nsel * (double)rt->gap_ewma_ns * (double)c->instances);
        if (load < BATCH_BUDGET_BUSY)
            return BATCH_SEND;
        uint64_t next = rt->last_arrival_ns + rt->gap_ewma_ns;
        if (next < now)
            next = now;
        if (next > latest)
            return BATCH_SEND;
    }
    d->wake = latest;
    return BATCH_WAIT;
}

/* Selects into d->sel the requests of the next batch: the oldest request
 * of the highest non-empty priority level, then compatible requests in
 * priority then arrival order while the rows fit. Returns BATCH_SEND to run
 * them now, BATCH_WAIT with d->wake set to the clock time at which to
 * decide again (earlier if a request arrives), or BATCH_IDLE when nothing
 * is queued. Requests already marked cancelled go to d->drop, to be failed
 * before they can run (BATCH_DROP when there are more than it holds). */
static int batch_select(const struct batch_config *c, const struct batch_profile *pr, const struct batch_rates *rt,
                        const struct batch_queue *q, uint64_t now, struct batch_decision *d) {
    int64_t cap_rows = batch_cap_rows(c);
    struct batcher_request *h = NULL;
    int hl = 0;
    for (int l = 0; l < q->nfifo && !h; l++)
        for (struct batcher_request *r = q->fifo[l].head; r; r = r->q_.next) {
            if (!atomic_load(&r->cancelled)) {
                h = r;
                hl = l;
                break;
            }
            if (!drop_add(d, r))
                return BATCH_DROP;
        }
    if (!h)
        return BATCH_IDLE;
    d->sel[d->nsel++] = h;
    d->rows = h->rows;
    d->bucket = req_bucket(c, h);
    if (c->max_batch_size <= 0 || !c->dynamic_batching)
        return BATCH_SEND;

    /* Fill in order; stop at the first compatible request that does not fit
     * so that a large request is not starved by smaller later ones. */
    int best_pref_n = 0;
    for (int k = 0; k < c->npreferred; k++)
        if (c->preferred_batch_size[k] == d->rows)
            best_pref_n = 1;
    int scanned = 0, full = 0;
    for (int l = hl; l < q->nfifo && !full; l++) {
        struct batcher_request *r = l == hl ? h->q_.next : q->fifo[l].head;
        while (r && !full && scanned++ < BATCH_SCAN_LIMIT) {
            if (atomic_load(&r->cancelled)) {
                if (!drop_add(d, r)) {
                    d->nsel = 0;
                    d->rows = 0;
                    return BATCH_DROP;
                }
            } else if (compatible(c, h, r)) {
                if (d->rows + r->rows > cap_rows) {
                    full = 1;
                    break;
                }
                d->sel[d->nsel++] = r;
                d->rows += r->rows;
                for (int k = 0; k < c->npreferred; k++)
                    if (c->preferred_batch_size[k] == d->rows)
                        best_pref_n = d->nsel;
                if (d->rows == cap_rows)
                    full = 1;
            }
            r = r->q_.next;
        }
    }
    if (full || q->draining)
        return BATCH_SEND;

    if (c->latency_budget_us)
        return decide_budget(c, pr, rt, now, d);

    int64_t target = cap_rows;
    if (c->npreferred > 0) {
        int64_t maxp = 0;
        for (int k = 0; k < c->npreferred; k++)
            if (c->preferred_batch_size[k] > maxp)
                maxp = c->preferred_batch_size[k];
        if (maxp < target)
            target = maxp;
        if (best_pref_n > 0 && d->rows >= target) {
            keep_first(d, best_pref_n);
            return BATCH_SEND;
        }
    }
    if (d->rows >= target || c->max_queue_delay_us == 0)
        return BATCH_SEND;
    uint64_t due = h->enqueue_ns + c->max_queue_delay_us * 1000ull;
    if (now >= due) {
        /* The delay ran out: the largest preferred size we can form, if
         * any, else everything we have. */
        if (best_pref_n > 0)
            keep_first(d, best_pref_n);
        return BATCH_SEND;
    }
    d->wake = due;
    return BATCH_WAIT;
}

/* 1 if a batch of n rows is one of the sizes batches are rounded down to:
 * the preferred sizes if any are configured, else the powers of two; and
 * max_batch_size itself. */
static int is_bucket(const struct batch_config *c, int64_t n) {
    if (n == batch_cap_rows(c))
        return 1;
    if (c->npreferred > 0) {
        for (int k = 0; k < c->npreferred; k++)
            if (c->preferred_batch_size[k] == n)
                return 1;
        return 0;
    }
    return n > 0 && (n & (n - 1)) == 0;
}

/* The policy plus rounding. The engine builds (and caches, a bounded
 * number of) plans per input shape: a batch of a new size costs a plan
 * build, hundreds of times a small model's run. So a batch about to go is
 * cut back to its longest prefix whose rows are a bucket size (at most
 * log2(max_batch_size) + 1 sizes); the requests cut off lead the next
 * batch, formed at once by this or another instance. any_batch_size turns
 * this off. */
int batch_decide(const struct batch_config *c, const struct batch_profile *pr, const struct batch_rates *rt,
                 const struct batch_queue *q, uint64_t now, struct batch_decision *d) {
    d->nsel = 0;
    d->rows = 0;
    d->bucket = 0;
    d->wake = 0;
    d->ndrop = 0;
    int a = batch_select(c, pr, rt, q, now, d);
    if (a != BATCH_SEND || d->nsel < 2 || c->any_batch_size || is_bucket(c, d->rows))
        return a;
    int64_t rows = d->rows;
    for (int k = d->nsel - 1; k >= 1; k--) {
        rows -= d->sel[k]->rows;
        if (is_bucket(c, rows)) {
            /* Under a latency budget, only if what is cut off can still
             * make its budget after this batch. */
            if (c->latency_budget_us &&
                now + batch_predict_ns(pr, d->bucket, rows) + batch_predict_ns(pr, d->bucket, d->rows - rows) >
                    budget_due(c, rt, d->sel[k]))
                break;
            d->nsel = k;
            d->rows = rows;
            break;
        }
    }
    return a;
}
