/* metrics.h - per model-version counters and histograms, Prometheus text.
 *
 * One struct metrics_model per (model, version), created on first use and
 * kept for the life of the process, so a pointer to it never dangles while a
 * request that holds it is in flight across an unload. Updates are relaxed
 * atomics: any thread may record, any thread may render. Durations are in
 * nanoseconds. The names are Triton's with a kiln_ prefix (see PROTOCOL.md). */
#ifndef KILN_METRICS_H
#define KILN_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define METRICS_NBUCKETS 18
#define METRICS_MAX_BATCH 64

struct metrics_hist {
    atomic_uint_fast64_t bucket[METRICS_NBUCKETS + 1]; /* last = +Inf */
    atomic_uint_fast64_t sum_ns, count;
};

struct metrics_duration {        /* Triton's {"count", "ns"} */
    atomic_uint_fast64_t count, ns;
};

struct metrics_model {
    char *model, *version;
    char *model_label, *version_label;        /* escaped for a Prometheus label value */
    atomic_uint_fast64_t success, fail[STATUS_REASON_N_]; /* by status_reason */
    atomic_uint_fast64_t inference_count;     /* rows */
    atomic_uint_fast64_t last_inference_ms;   /* wall clock, ms since the epoch */
    atomic_int_fast64_t pending;              /* accepted, not yet answered */
    struct metrics_duration d_success, d_fail, d_queue, d_input, d_infer, d_output, d_cache_hit, d_cache_miss;
    struct metrics_hist h_request, h_queue, h_compute;
    /* Per batch size (1..64, 64 = 64 and more): compute time summed over requests. */
    atomic_uint_fast64_t batch_input_ns[METRICS_MAX_BATCH + 1], batch_infer_ns[METRICS_MAX_BATCH + 1],
        batch_output_ns[METRICS_MAX_BATCH + 1], batch_requests[METRICS_MAX_BATCH + 1];
    atomic_uint_fast64_t load_ns;             /* time the last load of this version took */
    struct metrics_model *next;
};

/* value escaped for a Prometheus label value (backslash, double quote and
 * newline, as the text format wants); malloc'd, NULL when out of memory. */
char *metrics_label_escape(const char *value);

/* The record for (model, version); created on first use. Never NULL unless
 * out of memory. Thread-safe. */
struct metrics_model *metrics_model_get(const char *model, const char *version);

/* A request that ran: total time at the server, queue time and the compute
 * split, rows it carried and rows in the batch it ran in. */
void metrics_record_success(struct metrics_model *m, uint64_t request_ns, uint64_t queue_ns, uint64_t input_ns,
                            uint64_t infer_ns, uint64_t output_ns, int64_t rows, int batch_size);
/* A request the result cache answered: it counts as a success (and its
 * rows as inferences) but not in the queue, compute or batch series, which
 * describe executions, as in Triton's statistics. */
void metrics_record_cached(struct metrics_model *m, uint64_t request_ns, int64_t rows);
/* A request that failed with status, counted under its reason label
 * (status_reason, common/status.h). */
void metrics_record_failure(struct metrics_model *m, int status, uint64_t request_ns);
void metrics_record_cache(struct metrics_model *m, int hit, uint64_t ns);
void metrics_record_load(struct metrics_model *m, uint64_t load_ns);

/* Renders every series as Prometheus text. extra (may be NULL) appends more
 * text (batcher gauges, GPU metrics) to the malloc'd buffer it is given and
 * returns it (possibly reallocated). Caller frees the result. */
char *metrics_render(char *(*extra)(void *arg, char *buf, size_t *len, size_t *cap), void *arg);

/* printf into a growable malloc'd buffer: used by render and its extras. */
char *metrics_appendf(char *buf, size_t *len, size_t *cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Iterates every record (for the statistics endpoint); stop when fn returns non-zero. */
void metrics_foreach(int (*fn)(void *arg, struct metrics_model *m), void *arg);

/* Histogram bucket bounds in seconds. */
extern const double metrics_bucket_bounds_s[METRICS_NBUCKETS];

#endif
