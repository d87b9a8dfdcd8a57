#include "common/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

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
    [DT_STRING] = {sizeof(struct tensor_str), "BYTES", "TYPE_STRING", "string"},
    [DT_BOOL] = {1, "BOOL", "TYPE_BOOL", "bool"},
    [DT_FP16] = {2, "FP16", "TYPE_FP16", "float16"},
    [DT_FP64] = {8, "FP64", "TYPE_FP64", "double"},
    [DT_UINT32] = {4, "UINT32", "TYPE_UINT32", "uint32"},
    [DT_UINT64] = {8, "UINT64", "TYPE_UINT64", "uint64"},
    [DT_BF16] = {2, "BF16", "TYPE_BF16", "bfloat16"},
    /* No KServe or Triton config name: these never cross the protocol. */
    [DT_FP8E4M3FN] = {1, NULL, NULL, "float8e4m3fn"},
    [DT_FP8E4M3FNUZ] = {1, NULL, NULL, "float8e4m3fnuz"},
    [DT_FP8E5M2] = {1, NULL, NULL, "float8e5m2"},
    [DT_FP8E5M2FNUZ] = {1, NULL, NULL, "float8e5m2fnuz"},
    [DT_UINT4] = {1, NULL, NULL, "uint4"},
    [DT_INT4] = {1, NULL, NULL, "int4"},
    [DT_FP4E2M1] = {1, NULL, NULL, "float4e2m1"},
    [DT_FP8E8M0] = {1, NULL, NULL, "float8e8m0"},
    [DT_UINT2] = {1, NULL, NULL, "uint2"},
    [DT_INT2] = {1, NULL, NULL, "int2"},
};

int dtype_packed_bits(enum dtype dt) {
    switch (dt) {
    case DT_UINT4: case DT_INT4: case DT_FP4E2M1: return 4;
    case DT_UINT2: case DT_INT2: return 2;
    default: return (int)(8 * dtype_size(dt));
    }
}

int dtype_is_minifloat(enum dtype dt) {
    return dt == DT_FP8E4M3FN || dt == DT_FP8E4M3FNUZ || dt == DT_FP8E5M2 || dt == DT_FP8E5M2FNUZ || dt == DT_FP4E2M1;
}

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

/* ---- data ------------------------------------------------------------------- */

/* 64-byte alignment suits every kernel's vector loads; free() frees it. */
static void *alloc_block(size_t n) {
    if (n > SIZE_MAX - 63) return NULL;
    size_t sz = (n + 63) & ~(size_t)63;
    return aligned_alloc(64, sz ? sz : 64);
}

static size_t add_sat(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

/* Bytes of n elements and their strings, each with its NUL. */
static size_t strings_size(const struct tensor_str *s, int64_t n) {
    const size_t es = sizeof(struct tensor_str);
    size_t total = (uint64_t)n > SIZE_MAX / es ? SIZE_MAX : (size_t)n * es;
    for (int64_t i = 0; i < n && total != SIZE_MAX; i++) total = add_sat(total, add_sat(s[i].len, 1));
    return total;
}

size_t tensor_data_size(const struct tensor *t) {
    if (t->dtype != DT_STRING) return tensor_nbytes(t);
    int64_t n = tensor_numel(t);
    if (n < 0 || n == INT64_MAX) return SIZE_MAX;
    return strings_size(tensor_strs(t), n);
}

int tensor_alloc_data(struct tensor *t) {
    size_t nb = tensor_nbytes(t);
    t->data = t->dtype == DT_STRING || nb == SIZE_MAX ? NULL : alloc_block(nb);
    return t->data ? 0 : STATUS_NOMEM;
}

void tensor_free_data(struct tensor *t) {
    free(t->data);
    t->data = NULL;
}

int tensor_str_cmp(struct tensor_str a, struct tensor_str b) {
    size_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.p, b.p, n) : 0;
    if (c) return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

uint64_t tensor_str_hash(struct tensor_str s) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < s.len; i++) h = (h ^ (uint8_t)s.p[i]) * 1099511628211ull;
    return h;
}

/* Writes s[0..n) as elements at el, their bytes (each with a NUL) from w;
 * returns the end of the bytes written. */
static char *strings_write(struct tensor_str *el, char *w, const struct tensor_str *s, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        size_t l = s[i].len;
        if (l) memcpy(w, s[i].p, l);
        w[l] = 0;
        el[i].p = w;
        el[i].len = l;
        w += l + 1;
    }
    return w;
}

int tensor_strings_pack(struct tensor *t, const struct tensor_str *s) {
    int64_t n = tensor_numel(t);
    if (n < 0 || n == INT64_MAX) return STATUS_NOMEM;
    size_t total = strings_size(s, n);
    struct tensor_str *block = total == SIZE_MAX ? NULL : alloc_block(total);
    if (!block) return STATUS_NOMEM;
    strings_write(block, (char *)(block + n), s, n);
    t->data = block;
    return 0;
}

/* Elements per row of t (numel / dims[0]); 0 for an empty tensor. */
static int64_t row_elems(const struct tensor *t) {
    int64_t e = 1;
    for (int d = 1; d < t->ndim; d++) e *= t->dims[d];
    return e;
}

static int rows_valid(const struct tensor_rows *r) {
    return r->t->ndim >= 1 && r->first >= 0 && r->count >= 0 && r->first <= r->t->dims[0] &&
           r->count <= r->t->dims[0] - r->first;
}

size_t tensor_rows_size(const struct tensor_rows *src, int n) {
    size_t total = 0;
    for (int k = 0; k < n; k++) {
        const struct tensor_rows *r = &src[k];
        if (!rows_valid(r)) return SIZE_MAX;
        int64_t e = row_elems(r->t);
        if (r->t->dtype == DT_STRING)
            total = add_sat(total, strings_size(tensor_strs(r->t) + r->first * e, r->count * e));
        else
            total = add_sat(total, (size_t)(r->count * e) * dtype_size(r->t->dtype));
    }
    return total;
}

int tensor_rows_write(struct tensor *dst, void *buf, size_t cap, const struct tensor_rows *src, int n) {
    if (n < 1) return STATUS_INVALID;
    size_t need = tensor_rows_size(src, n);
    if (need == SIZE_MAX || need > cap) return STATUS_INVALID;
    const struct tensor *t0 = src[0].t;
    struct tensor d = *t0;
    d.dims[0] = 0;
    for (int k = 0; k < n; k++) d.dims[0] += src[k].count;
    int64_t e = row_elems(t0);
    if (t0->dtype == DT_STRING) {
        struct tensor_str *el = buf;
        /* Strings go after all the elements, so each range's are written at
         * the end of the previous range's bytes. */
        char *w = (char *)(el + d.dims[0] * e);
        for (int k = 0; k < n; k++) {
            w = strings_write(el, w, tensor_strs(src[k].t) + src[k].first * e, src[k].count * e);
            el += src[k].count * e;
        }
    } else {
        char *w = buf;
        size_t es = dtype_size(t0->dtype);
        for (int k = 0; k < n; k++) {
            size_t nb = (size_t)(src[k].count * e) * es;
            if (nb) memcpy(w, (const char *)src[k].t->data + (size_t)(src[k].first * e) * es, nb);
            w += nb;
        }
    }
    d.data = buf;
    *dst = d;
    return 0;
}

int tensor_copy_rows(struct tensor *dst, const struct tensor_rows *src, int n) {
    size_t need = n >= 1 ? tensor_rows_size(src, n) : SIZE_MAX;
    if (need == SIZE_MAX) {
        dst->data = NULL;
        return STATUS_INVALID;
    }
    void *buf = alloc_block(need);
    if (!buf) {
        dst->data = NULL;
        return STATUS_NOMEM;
    }
    int rc = tensor_rows_write(dst, buf, need, src, n);
    if (rc) {
        free(buf);
        dst->data = NULL;
    }
    return rc;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Reads buf's length-prefixed strings, at most max of them: the count read
 * whole, *off the bytes they take. *bad is 0, or 1 when the next element's
 * length is cut short, 2 when it runs past the buffer (*l its length). */
static int64_t strings_walk(const uint8_t *p, size_t len, int64_t max, size_t *off, int *bad, uint32_t *l) {
    int64_t i = 0;
    *off = 0;
    *bad = 0;
    while (*off < len && i < max) {
        if (len - *off < 4) {
            *bad = 1;
            break;
        }
        *l = le32(p + *off);
        if (*l > len - *off - 4) {
            *bad = 2;
            break;
        }
        *off += 4 + (size_t)*l;
        i++;
    }
    return i;
}

int64_t tensor_strings_count(const void *buf, size_t len) {
    size_t off;
    int bad;
    uint32_t l;
    int64_t n = strings_walk(buf, len, INT64_MAX, &off, &bad, &l);
    return bad ? -1 : n;
}

int tensor_strings_check(const void *buf, size_t len, int64_t count, size_t *used, char *err, size_t err_len) {
    size_t off;
    int bad;
    uint32_t l = 0;
    int64_t i = strings_walk(buf, len, count, &off, &bad, &l);
    if (bad == 1)
        return status_set(err, err_len, STATUS_INVALID, "BYTES element %lld has a truncated 4-byte length",
                          (long long)i);
    if (bad == 2)
        return status_set(err, err_len, STATUS_INVALID, "BYTES element %lld says %u bytes but only %zu are left",
                          (long long)i, l, len - off - 4);
    if (i == count && off < len && !used)
        return status_set(err, err_len, STATUS_INVALID, "%zu bytes follow the last of %lld BYTES elements", len - off,
                          (long long)count);
    if (i != count)
        return status_set(err, err_len, STATUS_INVALID, "the data holds %lld BYTES elements but %lld are needed",
                          (long long)i, (long long)count);
    if (used) *used = off;
    return 0;
}

int tensor_strings_from_prefixed(struct tensor *t, const void *buf, size_t len, char *err, size_t err_len) {
    t->data = NULL;
    int64_t n = tensor_numel(t);
    if (n < 0 || n == INT64_MAX || (uint64_t)n > SIZE_MAX / sizeof(struct tensor_str))
        return status_set(err, err_len, STATUS_INVALID, "a string tensor of %lld elements is too large", (long long)n);
    int rc = tensor_strings_check(buf, len, n, NULL, err, err_len);
    if (rc) return rc;
    /* Elements, then each element's bytes and a NUL: len + n bytes hold them. */
    size_t total = add_sat((size_t)n * sizeof(struct tensor_str), add_sat(len, (size_t)n));
    struct tensor_str *block = total == SIZE_MAX ? NULL : alloc_block(total);
    if (!block) return status_set(err, err_len, STATUS_NOMEM, "out of memory for %lld strings", (long long)n);
    const uint8_t *p = buf;
    char *w = (char *)(block + n);
    for (int64_t i = 0; i < n; i++) {
        uint32_t l = le32(p);
        p += 4;
        if (l) memcpy(w, p, l);
        w[l] = 0;
        block[i].p = w;
        block[i].len = l;
        p += l;
        w += l + 1;
    }
    t->data = block;
    return 0;
}

size_t tensor_strings_prefixed_size(const struct tensor *t) {
    int64_t n = tensor_numel(t);
    if (n < 0 || n == INT64_MAX) return SIZE_MAX;
    const struct tensor_str *s = tensor_strs(t);
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (s[i].len > UINT32_MAX) return SIZE_MAX;
        total = add_sat(total, 4 + s[i].len);
    }
    return total;
}

void tensor_strings_prefixed_write(const struct tensor *t, void *out) {
    int64_t n = tensor_numel(t);
    const struct tensor_str *s = tensor_strs(t);
    uint8_t *w = out;
    for (int64_t i = 0; i < n; i++) {
        uint32_t l = (uint32_t)s[i].len;
        w[0] = (uint8_t)l;
        w[1] = (uint8_t)(l >> 8);
        w[2] = (uint8_t)(l >> 16);
        w[3] = (uint8_t)(l >> 24);
        if (l) memcpy(w + 4, s[i].p, l);
        w += 4 + l;
    }
}

/* ---- half and bfloat16 ---------------------------------------------------------- */

double tensor_elem_f64(const struct tensor *t, int64_t i) {
    const void *d = t->data;
    switch (t->dtype) {
    case DT_FP32: return ((const float *)d)[i];
    case DT_FP64: return ((const double *)d)[i];
    case DT_FP16: return fp16_to_fp32(((const uint16_t *)d)[i]);
    case DT_BF16: return bf16_to_fp32(((const uint16_t *)d)[i]);
    case DT_INT8: return ((const int8_t *)d)[i];
    case DT_UINT8: return ((const uint8_t *)d)[i];
    case DT_INT16: return ((const int16_t *)d)[i];
    case DT_UINT16: return ((const uint16_t *)d)[i];
    case DT_INT32: return ((const int32_t *)d)[i];
    case DT_UINT32: return ((const uint32_t *)d)[i];
    case DT_INT64: return (double)((const int64_t *)d)[i];
    case DT_UINT64: return (double)((const uint64_t *)d)[i];
    case DT_BOOL: return ((const uint8_t *)d)[i];
    default: return 0;
    }
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

/* ---- float8, float4 and the 4- and 2-bit integers ------------------------- */

/* A minifloat: exponent and mantissa widths, bias, largest finite value, and
 * where its specials live. */
struct minifloat {
    int ebits, mbits, bias;
    double max;
    enum { MF_FN, MF_FNUZ, MF_IEEE, MF_NONE } kind; /* NaN only S.1..1.1..1 / NaN 0x80 / inf+NaN / neither */
};

static const struct minifloat *minifloat_of(enum dtype dt) {
    static const struct minifloat e4m3fn = {4, 3, 7, 448.0, MF_FN}, e4m3fnuz = {4, 3, 8, 240.0, MF_FNUZ},
                                  e5m2 = {5, 2, 15, 57344.0, MF_IEEE}, e5m2fnuz = {5, 2, 16, 57344.0, MF_FNUZ},
                                  e2m1 = {2, 1, 1, 6.0, MF_NONE};
    switch (dt) {
    case DT_FP8E4M3FN: return &e4m3fn;
    case DT_FP8E4M3FNUZ: return &e4m3fnuz;
    case DT_FP8E5M2: return &e5m2;
    case DT_FP8E5M2FNUZ: return &e5m2fnuz;
    case DT_FP4E2M1: return &e2m1;
    default: return NULL;
    }
}

float fp8_to_fp32(uint8_t bits, enum dtype dt) {
    if (dt == DT_FP8E8M0) return bits == 0xFF ? NAN : ldexpf(1.0f, (int)bits - 127);
    const struct minifloat *f = minifloat_of(dt);
    if (!f) return NAN;
    const int sbit = f->ebits + f->mbits;
    const unsigned emask = (1u << f->ebits) - 1, mmask = (1u << f->mbits) - 1;
    unsigned sign = (bits >> sbit) & 1u, e = (bits >> f->mbits) & emask, m = bits & mmask;
    if (f->kind == MF_FNUZ && sign && !e && !m) return NAN;
    if (f->kind == MF_FN && e == emask && m == mmask) return sign ? -NAN : NAN;
    if (f->kind == MF_IEEE && e == emask) return m ? (sign ? -NAN : NAN) : sign ? -INFINITY : INFINITY;
    double v = e ? ldexp(1.0 + ldexp(m, -f->mbits), (int)e - f->bias) : ldexp(m, 1 - f->bias - f->mbits);
    return (float)(sign ? -v : v);
}

/* The code of a positive finite r that is exactly representable in f. */
static unsigned minifloat_encode(const struct minifloat *f, double r) {
    if (r < ldexp(1.0, 1 - f->bias)) return (unsigned)ldexp(r, f->bias - 1 + f->mbits); /* subnormal or 0 */
    int k;
    double fr = frexp(r, &k); /* r = fr * 2^k, fr in [0.5, 1) */
    unsigned m = (unsigned)ldexp(fr * 2.0 - 1.0, f->mbits);
    return ((unsigned)(k - 1 + f->bias) << f->mbits) | m;
}

uint8_t fp8_from_double(double v, enum dtype dt, int saturate) {
    const struct minifloat *f = minifloat_of(dt);
    if (!f) return 0;
    const int sbit = f->ebits + f->mbits;
    const unsigned sign = signbit(v) ? 1u << sbit : 0, all = (1u << sbit) - 1;
    const unsigned nan = f->kind == MF_FNUZ ? 0x80u : f->kind == MF_FN ? sign | all : sign | (all - 1);
    const unsigned inf = sign | ((1u << f->ebits) - 1) << f->mbits;
    if (isnan(v)) return (uint8_t)(f->kind == MF_NONE ? (sign ^ (1u << sbit)) : nan);
    double a = fabs(v);
    if (isinf(a)) {
        if (saturate || f->kind == MF_NONE) return (uint8_t)(sign | minifloat_encode(f, f->max));
        return (uint8_t)(f->kind == MF_IEEE ? inf : nan);
    }
    /* Round once to the mantissa width at a's binade (the subnormals' quantum
     * below the smallest normal), to nearest, ties to even. */
    int k;
    frexp(a, &k);
    int q = (k - 1 < 1 - f->bias ? 1 - f->bias : k - 1) - f->mbits;
    double r = a == 0 ? 0 : ldexp(nearbyint(ldexp(a, -q)), q);
    if (r > f->max) {
        if (saturate || f->kind == MF_NONE) r = f->max;
        else return (uint8_t)(f->kind == MF_IEEE ? inf : nan);
    }
    unsigned code = minifloat_encode(f, r);
    if (f->kind == MF_FNUZ && code == 0) return 0; /* no -0 */
    return (uint8_t)(sign | code);
}

uint8_t fp8e8m0_from_float(float v, int saturate, enum e8m0_round mode) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    unsigned e = (bits >> 23) & 0xFF;
    if (e == 0xFF) return 0xFF;
    int up = 0;
    if (mode == E8M0_ROUND_UP) up = (bits & 0x7FFFFF) != 0;
    else if (mode == E8M0_ROUND_NEAREST)
        up = (bits & 0x400000) && ((bits & 0x200000) || (bits & 0x1FFFFF) || e > 0);
    if (up && saturate && e == 0xFE) up = 0;
    return (uint8_t)(e + (unsigned)up);
}

static int lowbit_width(enum dtype dt) { return dt == DT_INT4 || dt == DT_UINT4 ? 4 : 2; }

uint8_t lowbit_from_int(int64_t v, enum dtype dt) {
    const int w = lowbit_width(dt);
    unsigned b = (unsigned)((uint64_t)v & ((1u << w) - 1));
    if ((dt == DT_INT4 || dt == DT_INT2) && (b >> (w - 1))) b |= ~0u << w; /* sign-extend into the byte */
    return (uint8_t)b;
}

uint8_t lowbit_from_double(double v, enum dtype dt) {
    if (!(fabs(v) < 9223372036854775808.0)) return 0;
    return lowbit_from_int((int64_t)v, dt);
}

void tensor_unpack_bits(const uint8_t *src, uint8_t *dst, int64_t n, enum dtype dt) {
    const int w = dtype_packed_bits(dt), per = 8 / w;
    const int sext = dt == DT_INT4 || dt == DT_INT2;
    for (int64_t i = 0; i < n; i++) {
        unsigned b = (src[i / per] >> ((i % per) * w)) & ((1u << w) - 1);
        if (sext && (b >> (w - 1))) b |= ~0u << w;
        dst[i] = (uint8_t)b;
    }
}

void tensor_pack_bits(const uint8_t *src, uint8_t *dst, int64_t n, enum dtype dt) {
    const int w = dtype_packed_bits(dt), per = 8 / w;
    if (n <= 0) return;
    memset(dst, 0, (size_t)((n + per - 1) / per));
    for (int64_t i = 0; i < n; i++) dst[i / per] |= (uint8_t)((src[i] & ((1u << w) - 1)) << ((i % per) * w));
}

size_t dtype_packed_size(enum dtype dt, int64_t n) {
    int bits = dtype_packed_bits(dt);
    if (n < 0 || bits == 0) return SIZE_MAX;
    if ((uint64_t)n > SIZE_MAX / 8) return SIZE_MAX;
    return (size_t)(((uint64_t)n * (uint64_t)bits + 7) / 8);
}
