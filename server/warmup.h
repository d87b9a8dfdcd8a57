/* warmup.h - a model's model_warmup samples (config/model_config.h), run on
 * every instance while the model loads, before it is ready: the first
 * request of a warmed shape finds its plan built.
 *
 * A sample's inputs are made in the model's input order, batch_size rows
 * of the same row: zeros, small random values (floats in [0, 1), integers
 * 0 or 1, so that an index input stays in range; short strings of digits)
 * or the bytes of a file in the model's warmup/ folder, which holds one row
 * (raw row-major values; strings as 4-byte little-endian lengths each
 * followed by its bytes). */
#ifndef KILN_WARMUP_H
#define KILN_WARMUP_H

#include <stddef.h>

#include "config/model_config.h"
#include "server/batcher.h"
#include "server/padding.h"

/* Runs every sample of c on b's instances; mdir is the model's folder.
 * 0, or a negative status with err naming the sample and what failed. */
int warmup_run(batcher_t *b, const struct model_config *c, const char *mdir, char *err, size_t err_len);

/* Padded batching: runs each length bucket at each batch size the batcher
 * forms (the preferred sizes, else the powers of two, and max_batch_size)
 * on every instance, so that every plan padded batches use is built before
 * the model is ready. Inputs of small random values; a variable dim that
 * is not padded is 1. 0, or a negative status with err set. */
int warmup_buckets(batcher_t *b, const struct model_config *c, const struct pad_spec *pad, char *err, size_t err_len);

#endif
