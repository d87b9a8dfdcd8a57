/* clock.h - the process's one monotonic clock.
 *
 * Every duration kiln measures (request latency, queue time, timeouts,
 * Redis back-off, the load generator's schedule) is a difference of two
 * clock_now_ns() readings: CLOCK_MONOTONIC, in nanoseconds, never going
 * back with the wall clock. Thread-safe; no state. */
#ifndef KILN_CLOCK_H
#define KILN_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t clock_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
