/* hist.h - a log-linear latency histogram (HDR-style).
 *
 * Values are unsigned integers (kiln records microseconds or nanoseconds).
 * Buckets: values below 2^HIST_SUB_BITS are exact; above, each power of two
 * is split into 2^HIST_SUB_BITS linear sub-buckets, so any recorded value is
 * reported within a relative error of 2^-HIST_SUB_BITS (< 0.8% with 7 bits).
 * Fixed size, no allocation after hist_create; merging is addition.
 * Not thread-safe: one writer, or merge per-thread copies. */
#ifndef KILN_HIST_H
#define KILN_HIST_H

#include <stdint.h>

#define HIST_SUB_BITS 7
#define HIST_SUB (1u << HIST_SUB_BITS)
#define HIST_BUCKETS ((64 - HIST_SUB_BITS + 1) * HIST_SUB)

struct hist {
    uint64_t count;
    uint64_t sum;
    uint64_t min, max;
    uint64_t buckets[HIST_BUCKETS];
};

void hist_reset(struct hist *h);
void hist_record(struct hist *h, uint64_t v);
void hist_record_n(struct hist *h, uint64_t v, uint64_t n);
void hist_merge(struct hist *dst, const struct hist *src);
/* The value at quantile q in [0, 1] (the highest value equivalent to the
 * bucket holding it, so never under-reported); 0 when empty. */
uint64_t hist_quantile(const struct hist *h, double q);
double hist_mean(const struct hist *h);
/* Bucket index of v and the bucket's [lo, hi] range (tests). */
unsigned hist_bucket(uint64_t v);
uint64_t hist_bucket_lo(unsigned b);
uint64_t hist_bucket_hi(unsigned b);

#endif
