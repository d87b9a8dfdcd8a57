/* par_util.h - a loop split over OpenMP threads only where that pays.
 *
 * `#pragma omp parallel for if (small)` is not free when its condition is
 * false: libgomp still enters GOMP_parallel, builds a team of one and calls
 * the outlined loop through it, about 0.27 us a node, as much as a small
 * node's whole work on the tiny graphs of streaming and recurrent models. It
 * is the same at one thread with the condition true. PAR_FOR runs the loop
 * straight on the calling thread below its condition or at one thread, and
 * opens the parallel region only above it. Static inline by way of a macro,
 * as shape_util.h's helpers are, so that each kernel keeps its loop in
 * place. */
#ifndef KILN_CPU_PAR_UTIL_H
#define KILN_CPU_PAR_UTIL_H

#define PAR_PRAGMA_(x) _Pragma(#x)

/* Runs the for loop given last (a whole `for (...) body`, commas and all)
 * as `#pragma omp parallel for num_threads(nt) clauses` when cond holds and
 * nt > 1, and as a plain loop otherwise. clauses may be empty or hold
 * collapse(), schedule(), reduction() and the like; the loop must not read
 * omp_get_thread_num() (inline, it is the caller's). cond and nt are
 * evaluated at most once, nt first. */
#define PAR_FOR(cond, nt, clauses, ...)                                       \
    do {                                                                      \
        int par_nt_ = (nt);                                                   \
        if (par_nt_ > 1 && (cond)) {                                          \
            PAR_PRAGMA_(omp parallel for num_threads(par_nt_) clauses)        \
            __VA_ARGS__                                                       \
        } else {                                                              \
            __VA_ARGS__                                                       \
        }                                                                     \
    } while (0)

#endif
