#include "server/padding.h"

#include <stdlib.h>
#include <string.h>

#include "common/status.h"

int pad_spec_make(struct pad_spec *s, const struct model_config *c, char *err, size_t err_len) {
    memset(s, 0, sizeof *s);
    const struct model_padding *p = &c->padding;
    if (!p->enable) return 0;
    for (int k = 0; k < p->ninputs; k++) {
        int i = model_config_find_input(c, p->inputs[k].name);
        if (i < 0 || i >= 64)
            return status_set(err, err_len, STATUS_INVALID, "sequence_padding: input '%s' %s", p->inputs[k].name,
                              i < 0 ? "does not exist" : "is past the model's 64th input");
        s->in[s->nin].input = i;
        s->in[s->nin].axis = p->inputs[k].axis;
        s->in[s->nin].value = p->inputs[k].value;
        s->nin++;
    }
    for (int k = 0; k < p->noutputs; k++) {
        int o = model_config_find_output(c, p->outputs[k].name), slot = -1;
        for (int j = 0; j < p->ninputs; j++)
            if (strcmp(p->inputs[j].name, p->outputs[k].input) == 0 && p->inputs[j].axis == p->outputs[k].input_axis)
                slot = j;
        if (o < 0 || slot < 0)
            return status_set(err, err_len, STATUS_INVALID, "sequence_padding: output '%s' follows no padded axis",
                              p->outputs[k].name);
        s->out[s->nout].output = o;
        s->out[s->nout].axis = p->outputs[k].axis;
        s->out[s->nout].slot = slot;
        s->nout++;
    }
    memcpy(s->buckets, p->buckets, sizeof s->buckets);
    s->nbuckets = p->nbuckets;
    return 1;
}

int pad_bucket_index(const struct pad_spec *s, int64_t len) {
    int i = 0;
    while (i < s->nbuckets && s->buckets[i] < len) i++;
    return i;
}

int64_t pad_bucket(const struct pad_spec *s, int64_t len) {
    int i = pad_bucket_index(s, len);
    return i < s->nbuckets ? s->buckets[i] : len;
}

/* The padded axis of input i, or -1. */
static int padded_axis(const struct pad_spec *s, int i) {
    for (int k = 0; k < s->nin; k++)
        if (s->in[k].input == i) return s->in[k].axis;
    return -1;
}

int pad_compatible(const struct pad_spec *s, const struct tensor *a, const struct tensor *b, int ninputs) {
    for (int i = 0; i < ninputs; i++) {
        const struct tensor *x = &a[i], *y = &b[i];
        if (x->dtype != y->dtype || x->ndim != y->ndim) return 0;
        int pa = padded_axis(s, i);
        for (int d = 1; d < x->ndim; d++) {
            if (x->dims[d] == y->dims[d]) continue;
            if (d != pa || pad_bucket(s, x->dims[d]) != pad_bucket(s, y->dims[d])) return 0;
        }
    }
    return 1;
}

int64_t pad_length(const struct pad_spec *s, const struct tensor *in, int k) {
    const struct tensor *t = &in[s->in[k].input];
    return s->in[k].axis < t->ndim ? pad_bucket(s, t->dims[s->in[k].axis]) : 0;
}

/* Elements before the axis (rows included) and from it on, per unit of the axis. */
static void split_dims(const struct tensor *t, int axis, int64_t *outer, int64_t *inner) {
    *outer = 1;
    *inner = 1;
    for (int d = 0; d < axis; d++) *outer *= t->dims[d];
    for (int d = axis + 1; d < t->ndim; d++) *inner *= t->dims[d];
}

size_t pad_gather_size(const struct tensor *const *srcs, int n, int axis, int64_t len) {
    struct tensor t = *srcs[0];
    t.dims[0] = 0;
    for (int i = 0; i < n; i++) t.dims[0] += srcs[i]->dims[0];
    t.dims[axis] = len;
    return tensor_nbytes(&t);
}

/* Writes count copies of value, as dtype dt, at p. */
static void fill_value(void *p, enum dtype dt, double value, int64_t count) {
    size_t es = dtype_size(dt);
    unsigned char one[8] = {0};
    switch (dt) {
    case DT_FP32: { float f = (float)value; memcpy(one, &f, 4); break; }
    case DT_FP64: memcpy(one, &value, 8); break;
    case DT_FP16: { uint16_t h = fp32_to_fp16((float)value); memcpy(one, &h, 2); break; }
    case DT_BF16: { uint16_t h = fp32_to_bf16((float)value); memcpy(one, &h, 2); break; }
    case DT_INT8: case DT_UINT8: case DT_BOOL: one[0] = (unsigned char)(int64_t)value; break;
    case DT_INT16: case DT_UINT16: { int16_t v = (int16_t)(int64_t)value; memcpy(one, &v, 2); break; }
    case DT_INT32: case DT_UINT32: { int32_t v = (int32_t)(int64_t)value; memcpy(one, &v, 4); break; }
    default: { int64_t v = (int64_t)value; memcpy(one, &v, 8); break; }
    }
    int zero = 1;
    for (size_t b = 0; b < es; b++) zero &= one[b] == 0;
    if (zero) {
        memset(p, 0, (size_t)count * es);
        return;
    }
    for (int64_t i = 0; i < count; i++) memcpy((char *)p + (size_t)i * es, one, es);
}

int pad_gather(struct tensor *dst, void *buf, size_t cap, const struct tensor *const *srcs, int n, int axis,
               int64_t len, double value) {
    size_t need = pad_gather_size(srcs, n, axis, len);
    if (need == SIZE_MAX || cap < need) return STATUS_INVALID;
    *dst = *srcs[0];
    dst->dims[0] = 0;
    dst->dims[axis] = len;
    dst->data = buf;
    size_t es = dtype_size(dst->dtype);
    char *w = buf;
    for (int i = 0; i < n; i++) {
        const struct tensor *t = srcs[i];
        int64_t outer, inner;
        split_dims(t, axis, &outer, &inner);
        int64_t have = t->dims[axis] * inner, want = len * inner;
        if (have > want) return STATUS_INVALID;
        const char *r = t->data;
        for (int64_t o = 0; o < outer; o++) {
            memcpy(w, r + (size_t)(o * have) * es, (size_t)have * es);
            fill_value(w + (size_t)have * es, dst->dtype, value, want - have);
            w += (size_t)want * es;
        }
        dst->dims[0] += t->dims[0];
    }
    return 0;
}

int pad_cut(struct tensor *dst, const struct tensor *t, int64_t first, int64_t rows, int axis, int64_t len) {
    if (t->dtype == DT_STRING || axis >= t->ndim || len > t->dims[axis] || first + rows > t->dims[0])
        return STATUS_INVALID;
    *dst = *t;
    dst->dims[0] = rows;
    dst->dims[axis] = len;
    dst->data = NULL;
    int rc = tensor_alloc_data(dst);
    if (rc) return rc;
    struct tensor one = *t;
    one.dims[0] = 1;
    int64_t outer, inner;
    split_dims(&one, axis, &outer, &inner); /* per row */
    size_t es = dtype_size(t->dtype);
    int64_t have = t->dims[axis] * inner, want = len * inner;
    const char *r = (const char *)t->data + (size_t)(first * outer * have) * es;
    char *w = dst->data;
    for (int64_t o = 0; o < rows * outer; o++) memcpy(w + (size_t)(o * want) * es, r + (size_t)(o * have) * es,
                                                       (size_t)want * es);
    return 0;
}
