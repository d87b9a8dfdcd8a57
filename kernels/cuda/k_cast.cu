/* k_cast.cu - Cast between the numeric dtypes kiln handles on the GPU.
 * Integers convert through int64 and floats through double, so int64 values
 * beyond 2^24 survive an int64 -> int32 or int64 -> int64 cast exactly. */
#include "kernels/cuda/kcommon.cuh"

__device__ __forceinline__ int kc_is_float(int dt) { return dt == DT_FP32 || dt == DT_FP16 || dt == DT_FP64 || dt == DT_BF16; }

__device__ __forceinline__ double kc_load_d(const void *p, int dt, int64_t i) {
    switch (dt) {
    case DT_FP32: return ((const float *)p)[i];
    case DT_FP16: return kc_h2f(((const uint16_t *)p)[i]);
    case DT_BF16: return kc_bf2f(((const uint16_t *)p)[i]);
    case DT_FP64: return ((const double *)p)[i];
    }
    return 0.0;
}

__device__ __forceinline__ int64_t kc_load_i(const void *p, int dt, int64_t i) {
    switch (dt) {
    case DT_INT8: return ((const int8_t *)p)[i];
    case DT_UINT8:
    case DT_BOOL: return ((const uint8_t *)p)[i];
    case DT_INT16: return ((const int16_t *)p)[i];
    case DT_UINT16: return ((const uint16_t *)p)[i];
    case DT_INT32: return ((const int32_t *)p)[i];
    case DT_UINT32: return ((const uint32_t *)p)[i];
    case DT_INT64: return ((const int64_t *)p)[i];
    case DT_UINT64: return (int64_t)((const uint64_t *)p)[i];
    }
    return 0;
}

__device__ __forceinline__ void kc_store_d(void *p, int dt, int64_t i, double v) {
    switch (dt) {
    case DT_FP32: ((float *)p)[i] = (float)v; return;
    case DT_FP16: ((uint16_t *)p)[i] = kc_f2h((float)v); return;
    case DT_BF16: ((uint16_t *)p)[i] = kc_f2bf((float)v); return;
    case DT_FP64: ((double *)p)[i] = v; return;
    case DT_BOOL: ((uint8_t *)p)[i] = v != 0.0; return;
    }
    /* float -> integer: truncation toward zero; NaN becomes 0. */
    int64_t w = v != v ? 0 : (int64_t)v;
    switch (dt) {
    case DT_INT8: ((int8_t *)p)[i] = (int8_t)w; return;
    case DT_UINT8: ((uint8_t *)p)[i] = (uint8_t)w; return;
    case DT_INT16: ((int16_t *)p)[i] = (int16_t)w; return;
    case DT_UINT16: ((uint16_t *)p)[i] = (uint16_t)w; return;
    case DT_INT32: ((int32_t *)p)[i] = (int32_t)w; return;
    case DT_UINT32: ((uint32_t *)p)[i] = (uint32_t)w; return;
    case DT_INT64: ((int64_t *)p)[i] = w; return;
    case DT_UINT64: ((uint64_t *)p)[i] = (uint64_t)w; return;
    }
}

__device__ __forceinline__ void kc_store_i(void *p, int dt, int64_t i, int64_t v) {
    switch (dt) {
    case DT_INT8: ((int8_t *)p)[i] = (int8_t)v; return;
    case DT_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; return;
    case DT_BOOL: ((uint8_t *)p)[i] = v != 0; return;
    case DT_INT16: ((int16_t *)p)[i] = (int16_t)v; return;
    case DT_UINT16: ((uint16_t *)p)[i] = (uint16_t)v; return;
    case DT_INT32: ((int32_t *)p)[i] = (int32_t)v; return;
    case DT_UINT32: ((uint32_t *)p)[i] = (uint32_t)v; return;
    case DT_INT64: ((int64_t *)p)[i] = v; return;
    case DT_UINT64: ((uint64_t *)p)[i] = (uint64_t)v; return;
    }
    kc_store_d(p, dt, i, (double)v);
}

__global__ void k_cast(int from, int to, const void *x, void *y, int64_t n) {
    int ff = kc_is_float(from);
    KC_GRID_STRIDE(i, n) {
        if (ff) kc_store_d(y, to, i, kc_load_d(x, from, i));
        else kc_store_i(y, to, i, kc_load_i(x, from, i));
    }
}

static int kc_cast_dtype_ok(enum dtype t) {
    switch (t) {
    case DT_FP32: case DT_FP16: case DT_BF16: case DT_FP64: case DT_INT8: case DT_UINT8: case DT_BOOL:
    case DT_INT16: case DT_UINT16: case DT_INT32: case DT_UINT32: case DT_INT64: case DT_UINT64: return 1;
    default: return 0;
    }
}

int kc_cast_supported(enum dtype from, enum dtype to) { return kc_cast_dtype_ok(from) && kc_cast_dtype_ok(to); }

cudaError_t kc_cast(enum dtype from, enum dtype to, const void *x, void *y, int64_t n, cudaStream_t s) {
    if (!kc_cast_supported(from, to)) return cudaErrorInvalidValue;
    if (n <= 0) return cudaSuccess;
    KC_LAUNCH(k_cast, kc_blocks(n, KC_THREADS), KC_THREADS, 0, s, (int)from, (int)to, x, y, n);
    return cudaGetLastError();
}
