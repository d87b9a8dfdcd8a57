#include "server/warmup.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/file.h"
#include "common/log.h"
#include "common/clock.h"
#include "common/status.h"
#include "common/tensor.h"

/* The largest warmup file read (one row of one input). */
#define WARMUP_MAX_FILE_BYTES ((int64_t)256 << 20)

/* xorshift64*: reproducible samples, no shared state. */
static uint64_t next_random(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* Random values into a fixed-size row: floats in [0, 1), integers 0 or 1. */
static void fill_random(struct tensor *t, uint64_t *seed) {
    int64_t n = tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = next_random(seed);
        float f = (float)(r >> 40) / (float)(1 << 24);
        switch (t->dtype) {
        case DT_FP32: ((float *)t->data)[i] = f; break;
        case DT_FP64: ((double *)t->data)[i] = f; break;
        case DT_FP16: ((uint16_t *)t->data)[i] = fp32_to_fp16(f); break;
        case DT_BF16: ((uint16_t *)t->data)[i] = fp32_to_bf16(f); break;
        default: {
            /* Integers and booleans: 0 or 1 in the element's low byte
             * (x86 is little-endian; the rest of the element is zero). */
            size_t es = dtype_size(t->dtype);
            memset((char *)t->data + (size_t)i * es, 0, es);
            ((unsigned char *)t->data)[(size_t)i * es] = (unsigned char)(r >> 63);
        }
        }
    }
}

/* Empty strings (seed NULL), or random short strings of 1 to 8 digits. */
static int strings_row(struct tensor *t, uint64_t *seed) {
    int64_t n = tensor_numel(t);
    char(*buf)[9] = calloc((size_t)(n ? n : 1), sizeof *buf);
    struct tensor_str *s = calloc((size_t)(n ? n : 1), sizeof *s);
    int rc = buf && s ? 0 : STATUS_NOMEM;
    for (int64_t i = 0; !rc && seed && i < n; i++) {
        int len = 1 + (int)(next_random(seed) % 8);
        for (int k = 0; k < len; k++) buf[i][k] = (char)('0' + next_random(seed) % 10);
        s[i] = (struct tensor_str){buf[i], (size_t)len};
    }
    if (!rc) rc = tensor_strings_pack(t, s);
    free(buf);
    free(s);
    return rc;
}

/* One row of the input from <mdir>/warmup/<file>. */
static int file_row(struct tensor *t, const char *mdir, const char *file, char *err, size_t err_len) {
    char path[4096], e2[512];
    snprintf(path, sizeof path, "%s/warmup/%s", mdir, file);
    char *buf = NULL;
    size_t len = 0;
    int rc = file_read_regular(path, WARMUP_MAX_FILE_BYTES, &buf, &len, e2, sizeof e2);
    if (rc) return status_set(err, err_len, rc, "input_data_file: %s", e2);
    if (t->dtype == DT_STRING) {
        rc = tensor_strings_from_prefixed(t, buf, len, e2, sizeof e2);
        if (rc) status_set(err, err_len, rc, "input_data_file '%s': %s", file, e2);
    } else if (len != tensor_nbytes(t)) {
        rc = status_set(err, err_len, STATUS_INVALID, "input_data_file '%s' has %zu bytes; one row of the input is %zu",
                        file, len, tensor_nbytes(t));
    } else if (!(rc = tensor_alloc_data(t))) {
        memcpy(t->data, buf, len);
    }
    free(buf);
    return rc;
}

/* One row of a sample input into row (dtype and dims set, data NULL). */
static int make_row(struct tensor *row, const struct model_warmup_input *in, const char *mdir, uint64_t *seed,
                    char *err, size_t err_len) {
    if (in->source == WARMUP_FILE) return file_row(row, mdir, in->file, err, err_len);
    if (row->dtype == DT_STRING) return strings_row(row, in->source == WARMUP_RANDOM ? seed : NULL);
    int rc = tensor_alloc_data(row);
    if (rc) return rc;
    if (in->source == WARMUP_RANDOM) fill_random(row, seed);
    else memset(row->data, 0, tensor_nbytes(row));
    return 0;
}

/* Input k of the model for sample w: batch_size copies of one row. */
static int make_input(struct tensor *t, const struct model_config *c, const struct model_warmup *w,
                      const struct model_warmup_input *in, const char *mdir, uint64_t *seed, char *err,
                      size_t err_len) {
    int batch = c->max_batch_size > 0;
    struct tensor row = {.dtype = in->dtype, .ndim = in->ndim + batch};
    if (batch) row.dims[0] = 1;
    memcpy(row.dims + batch, in->dims, (size_t)in->ndim * sizeof row.dims[0]);
    int rc = make_row(&row, in, mdir, seed, err, err_len);
    if (rc || !batch || w->batch_size == 1) {
        *t = row;
        return rc;
    }
    struct tensor_rows *src = calloc((size_t)w->batch_size, sizeof *src);
    if (!src) rc = STATUS_NOMEM;
    for (int i = 0; !rc && i < w->batch_size; i++) src[i] = (struct tensor_rows){.t = &row, .first = 0, .count = 1};
    if (!rc) rc = tensor_copy_rows(t, src, w->batch_size);
    free(src);
    tensor_free_data(&row);
    return rc;
}

static int run_sample(batcher_t *b, const struct model_config *c, const struct model_warmup *w, const char *mdir,
                      char *err, size_t err_len) {
    struct tensor *in = calloc((size_t)c->ninputs + 1, sizeof *in);
    if (!in) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    char e2[512] = "";
    int rc = 0;
    for (int k = 0; k < c->ninputs && !rc; k++) {
        const struct model_warmup_input *wi = NULL;
        for (int j = 0; j < w->ninputs; j++)
            if (strcmp(w->inputs[j].name, c->inputs[k].name) == 0) wi = &w->inputs[j];
        /* model_warmup_check made sure that every input is named once. */
        rc = make_input(&in[k], c, w, wi, mdir, &seed, e2, sizeof e2);
        /* The sample has the clients' shape; the model takes its reshape. */
        if (!rc && c->inputs[k].reshape_ndim >= 0 &&
            model_config_reshape(&in[k], c->max_batch_size > 0, c->inputs[k].reshape, c->inputs[k].reshape_ndim))
            rc = status_set(e2, sizeof e2, STATUS_INVALID, "its dims do not fit the reshape");
        if (rc && !e2[0]) snprintf(e2, sizeof e2, "out of memory");
        if (rc) rc = status_set(err, err_len, rc, "input '%s': %s", wi->name, e2);
    }
    if (!rc) {
        rc = batcher_warmup(b, in, c->ninputs, c->max_batch_size > 0 ? w->batch_size : 1, w->count, e2, sizeof e2);
        if (rc) status_set(err, err_len, rc, "%s", e2);
    }
    for (int k = 0; k < c->ninputs; k++) tensor_free_data(&in[k]);
    free(in);
    return rc;
}

int warmup_run(batcher_t *b, const struct model_config *c, const char *mdir, char *err, size_t err_len) {
    for (int i = 0; i < c->nwarmup; i++) {
        const struct model_warmup *w = &c->warmup[i];
        uint64_t t0 = clock_now_ns();
        char e2[512];
        int rc = run_sample(b, c, w, mdir, e2, sizeof e2);
        if (rc) return status_set(err, err_len, rc, "warmup sample '%s': %s", w->name, e2);
        log_info("model '%s': warmup sample '%s' (batch %d, %d run%s on each instance) in %.1f ms", c->name, w->name,
                 w->batch_size, w->count, w->count == 1 ? "" : "s", (double)(clock_now_ns() - t0) / 1e6);
    }
    return 0;
}

/* The batch sizes the batcher rounds batches down to (batcher.c is_bucket). */
static int batch_sizes(const struct model_config *c, int *out, int cap) {
    int n = 0;
    if (c->npreferred > 0) {
        for (int k = 0; k < c->npreferred && n < cap - 1; k++)
            if (c->preferred_batch_size[k] < c->max_batch_size) out[n++] = c->preferred_batch_size[k];
    } else {
        for (int s = 1; s < c->max_batch_size && n < cap - 1; s *= 2) out[n++] = s;
    }
    out[n++] = c->max_batch_size;
    return n;
}

/* Input k of the model at rows rows with its padded axis at len. */
static int bucket_input(struct tensor *t, const struct model_config *c, const struct pad_spec *pad, int k,
                        int64_t rows, int64_t len, uint64_t *seed) {
    const struct model_config_io *io = &c->inputs[k];
    *t = (struct tensor){.dtype = io->dtype, .ndim = io->ndim + 1};
    t->dims[0] = rows;
    for (int d = 0; d < io->ndim; d++) t->dims[d + 1] = io->dims[d] >= 0 ? io->dims[d] : 1;
    for (int j = 0; j < pad->nin; j++)
        if (pad->in[j].input == k && pad->in[j].axis < t->ndim) t->dims[pad->in[j].axis] = len;
    if (t->dtype == DT_STRING) return strings_row(t, seed);
    int rc = tensor_alloc_data(t);
    if (!rc) fill_random(t, seed);
    return rc;
}

int warmup_buckets(batcher_t *b, const struct model_config *c, const struct pad_spec *pad, char *err, size_t err_len) {
    int sizes[40], nsizes = batch_sizes(c, sizes, 40);
    uint64_t t0 = clock_now_ns(), seed = 0x2545f4914f6cdd1dull;
    struct tensor *in = calloc((size_t)c->ninputs + 1, sizeof *in);
    if (!in) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    int rc = 0;
    char e2[512] = "";
    for (int bi = 0; bi < pad->nbuckets && !rc; bi++)
        for (int si = 0; si < nsizes && !rc; si++) {
            for (int k = 0; k < c->ninputs && !rc; k++)
                rc = bucket_input(&in[k], c, pad, k, sizes[si], pad->buckets[bi], &seed);
            if (rc) status_set(e2, sizeof e2, rc, "out of memory");
            else rc = batcher_warmup(b, in, c->ninputs, sizes[si], 1, e2, sizeof e2);
            for (int k = 0; k < c->ninputs; k++) tensor_free_data(&in[k]);
            if (rc)
                status_set(err, err_len, rc, "warmup of length bucket %lld, batch size %d: %s",
                           (long long)pad->buckets[bi], sizes[si], e2);
        }
    free(in);
    if (!rc)
        log_info("model '%s': plans for %d length buckets x %d batch sizes built and run in %.1f ms", c->name,
                 pad->nbuckets, nsizes, (double)(clock_now_ns() - t0) / 1e6);
    return rc;
}
