/* padding.h - padded batching: the model's sequence_padding (config/
 * model_config.h) resolved to input and output indices, the length buckets,
 * and the copies that pad a batch's inputs and cut its outputs back.
 *
 * Requests share a batch when their inputs agree but along the padded axes,
 * where each padded input's length falls in the same bucket (the batcher's
 * rule, pad_compatible). The batch is run at the bucket's length: each
 * request's rows are copied in with the pad value after them
 * (pad_gather), and every output axis that follows a padded input axis is
 * cut back to the request's own length (pad_cut). A request longer than
 * every bucket runs at its own length, with requests of that same length.
 *
 * Threads: a pad_spec is read-only once made. */
#ifndef KILN_PADDING_H
#define KILN_PADDING_H

#include <stddef.h>
#include <stdint.h>

#include "common/tensor.h"
#include "config/model_config.h"

struct pad_spec {
    int nin;
    struct {
        int input;                  /* model input index */
        int axis;                   /* counting the batch dim */
        double value;
    } in[MODEL_PAD_MAX];
    int nout;
    struct {
        int output;                 /* model output index */
        int axis;
        int slot;                   /* in[] entry whose length this axis has */
    } out[MODEL_PAD_MAX];
    int64_t buckets[MODEL_PAD_MAX_BUCKETS];
    int nbuckets;
};

/* Makes *spec from c's sequence_padding when it is enabled: 1 (made), 0 (not
 * enabled), or a negative status with err set (a name the configuration
 * check should have refused). */
int pad_spec_make(struct pad_spec *spec, const struct model_config *c, char *err, size_t err_len);

/* The smallest bucket that holds len, or len itself past the last bucket. */
int64_t pad_bucket(const struct pad_spec *s, int64_t len);
/* Its index: 0..nbuckets-1, or nbuckets past the last bucket. */
int pad_bucket_index(const struct pad_spec *s, int64_t len);

/* 1 if requests with inputs a and b (ninputs each) may share a padded batch:
 * same dtypes and ranks, the same dims but along padded axes, where each
 * padded input's lengths are in one bucket (equal past the last bucket). */
int pad_compatible(const struct pad_spec *s, const struct tensor *a, const struct tensor *b, int ninputs);

/* The length slot k of the spec pads to, for a batch whose first request's
 * inputs are in. */
int64_t pad_length(const struct pad_spec *s, const struct tensor *in, int k);

/* Writes n requests' rows of padded input slot k into dst (buf, cap bytes
 * at least pad_gather_size), padded to len along the slot's axis. srcs[i]
 * is request i's tensor for that input. */
size_t pad_gather_size(const struct tensor *const *srcs, int n, int axis, int64_t len);
int pad_gather(struct tensor *dst, void *buf, size_t cap, const struct tensor *const *srcs, int n, int axis,
               int64_t len, double value);

/* Copies rows [first, first + rows) of the batch output t into dst as a new
 * owned block, axis cut back to len (len <= t->dims[axis]). */
int pad_cut(struct tensor *dst, const struct tensor *t, int64_t first, int64_t rows, int axis, int64_t len);

#endif
