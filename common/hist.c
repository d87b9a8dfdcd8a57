#include "common/hist.h"

#include <string.h>

void hist_reset(struct hist *h) {
    memset(h, 0, sizeof *h);
    h->min = UINT64_MAX;
}

unsigned hist_bucket(uint64_t v) {
    if (v < HIST_SUB) return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);            /* >= HIST_SUB_BITS */
    unsigned shift = msb - HIST_SUB_BITS;                           /* bits below the sub-bucket */
    unsigned sub = (unsigned)(v >> shift) & (HIST_SUB - 1);         /* drop the leading 1 */
    return (shift + 1) * HIST_SUB + sub;
}

uint64_t hist_bucket_lo(unsigned b) {
    if (b < HIST_SUB) return b;
    unsigned shift = b / HIST_SUB - 1, sub = b % HIST_SUB;
    return ((uint64_t)(HIST_SUB + sub)) << shift;
}

uint64_t hist_bucket_hi(unsigned b) {
    if (b < HIST_SUB) return b;
    unsigned shift = b / HIST_SUB - 1;
    return hist_bucket_lo(b) + ((uint64_t)1 << shift) - 1;
}

void hist_record_n(struct hist *h, uint64_t v, uint64_t n) {
    if (!n) return;
    h->buckets[hist_bucket(v)] += n;
    h->count += n;
    h->sum += v * n;
    if (v < h->min) h->min = v;
    if (v > h->max) h->max = v;
}

void hist_record(struct hist *h, uint64_t v) { hist_record_n(h, v, 1); }

void hist_merge(struct hist *dst, const struct hist *src) {
    for (unsigned i = 0; i < HIST_BUCKETS; i++) dst->buckets[i] += src->buckets[i];
    dst->count += src->count;
    dst->sum += src->sum;
    if (src->count) {
        if (src->min < dst->min) dst->min = src->min;
        if (src->max > dst->max) dst->max = src->max;
    }
}

uint64_t hist_quantile(const struct hist *h, double q) {
    if (!h->count) return 0;
    if (q <= 0) return h->min;
    if (q >= 1) return h->max;
    /* Rank of the sample at quantile q, 1-based, rounded up. */
    uint64_t rank = (uint64_t)(q * (double)h->count);
    if ((double)rank < q * (double)h->count) rank++;
    if (rank == 0) rank = 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= rank) {
            uint64_t hi = hist_bucket_hi(i);
            return hi > h->max ? h->max : hi;
        }
    }
    return h->max;
}

double hist_mean(const struct hist *h) { return h->count ? (double)h->sum / (double)h->count : 0.0; }
