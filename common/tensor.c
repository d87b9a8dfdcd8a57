#include "common/tensor.h"

#include <stdio.h>
#include <string.h>

static const struct {
    size_t size;
    const char *kserve, *config, *name;
} g_dt[DT_MAX_] = {
    [DT_FP32] = {4, "FP32", "TYPE_FP32", "float"},
    [DT_UINT8] = {1, "UINT8", "TYPE_UINT8", "uint8"},
    [DT_INT8] = {1, "INT8", "TYPE_INT8", "int8"},
    [DT_UINT16] = {2, "UINT16", "TYPE_UINT16", "uint16"},
    [DT_INT16] = {2, "INT16", "TYPE_INT16", "int16"},
    [DT_INT32] = {4, "INT32", "TYPE_INT32", "int32"},
    [DT_INT64] = {8, "INT64", "TYPE_INT64", "int64"},
    [DT_STRING] = {sizeof(char *), "BYTES", "TYPE_STRING", "string"},
    [DT_BOOL] = {1, "BOOL", "TYPE_BOOL", "bool"},
    [DT_FP16] = {2, "FP16", "TYPE_FP16", "float16"},
    [DT_FP64] = {8, "FP64", "TYPE_FP64", "double"},
    [DT_UINT32] = {4, "UINT32", "TYPE_UINT32", "uint32"},
    [DT_UINT64] = {8, "UINT64", "TYPE_UINT64", "uint64"},
    [DT_BF16] = {2, "BF16", "TYPE_BF16", "bfloat16"},
};

size_t dtype_size(enum dtype dt) { return (unsigned)dt < DT_MAX_ ? g_dt[dt].size : 0; }
const char *dtype_kserve_name(enum dtype dt) { return (unsigned)dt < DT_MAX_ ? g_dt[dt].kserve : NULL; }
const char *dtype_config_name(enum dtype dt) { return (unsigned)dt < DT_MAX_ ? g_dt[dt].config : NULL; }
const char *dtype_name(enum dtype dt) {
    return (unsigned)dt < DT_MAX_ && g_dt[dt].name ? g_dt[dt].name : "undefined";
}

enum dtype dtype_from_kserve(const char *name) {
    for (int i = 1; i < DT_MAX_; i++)
        if (g_dt[i].kserve && strcmp(g_dt[i].kserve, name) == 0) return (enum dtype)i;
    return DT_UNDEFINED;
}

enum dtype dtype_from_config(const char *name) {
    for (int i = 1; i < DT_MAX_; i++)
        if (g_dt[i].config && strcmp(g_dt[i].config, name) == 0) return (enum dtype)i;
    return DT_UNDEFINED;
}

int64_t tensor_numel(const struct tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->dims[i] < 0) return -1;
        if (t->dims[i] != 0 && n > INT64_MAX / t->dims[i]) return INT64_MAX;
        n *= t->dims[i];
    }
    return n;
}

size_t tensor_nbytes(const struct tensor *t) {
    int64_t n = tensor_numel(t);
    if (n < 0) return 0;
    size_t es = dtype_size(t->dtype);
    if (es && (uint64_t)n > SIZE_MAX / es) return SIZE_MAX;
    return (size_t)n * es;
}

char *tensor_shape_str(const struct tensor *t, char *buf, size_t cap) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap > n ? cap - n : 0, "[");
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ",%lld" : "%lld", (long long)t->dims[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

int tensor_same_shape(const struct tensor *a, const struct tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

float fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            man &= 0x3ff;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
    else bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t man = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}

float bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t fp32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
