/* bench_schedule.h - arrival schedules for open-loop load and the bookkeeping that
 * keeps latency honest: a request's latency is measured from the time it was
 * SCHEDULED to be sent, not from when a connection was free to send it, so a
 * server that stalls shows up in the tail (no coordinated omission).
 *
 * Pure logic over nanosecond timestamps the caller supplies, so tests drive
 * it with a fake clock. */
#ifndef KILN_BENCH_SCHEDULE_H
#define KILN_BENCH_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

struct bench_schedule {
    double rate;        /* requests per second */
    int poisson;        /* 0 = constant spacing, 1 = exponential gaps */
    uint64_t start_ns;
    uint64_t next_ns;   /* scheduled time of the next request */
    uint64_t seq;
    uint64_t rng;
};

void schedule_init(struct bench_schedule *s, double rate, int poisson, uint64_t start_ns, uint64_t seed);
/* Returns the scheduled time of the next request and advances. Constant
 * spacing is computed from the start (no drift); Poisson adds exponential gaps. */
uint64_t schedule_next(struct bench_schedule *s);
/* Time of the next request without advancing. */
static inline uint64_t schedule_peek(const struct bench_schedule *s) { return s->next_ns; }

/* A FIFO of scheduled-but-unsent send times (the backlog while every
 * connection is busy). Fixed capacity; push fails when full (the caller
 * counts that request as dropped by the generator). */
struct bench_backlog {
    uint64_t *t;
    size_t cap, head, len;
};
int backlog_init(struct bench_backlog *b, size_t cap);
void backlog_free(struct bench_backlog *b);
int backlog_push(struct bench_backlog *b, uint64_t t);
int backlog_pop(struct bench_backlog *b, uint64_t *t);

/* Parses "1:64:x2" (start:end:xfactor), "1:64:+8" (step), "8" or "1,4,16"
 * into levels; returns the count or -1. */
int parse_levels(const char *s, int *out, int max);
/* Parses a budget list "p99=20ms,p50=5ms" (units ns, us, ms, s; default ms)
 * into quantiles and microseconds; returns the count or -1. */
int parse_budget(const char *s, double *q, double *us, int max);

#endif
