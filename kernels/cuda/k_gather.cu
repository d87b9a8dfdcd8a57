/* k_gather.cu - Gather along one axis with int32 or int64 indices. */
#include "kernels/cuda/kcommon.cuh"

template <class T, class I>
__global__ void k_gather(const T *x, const I *idx, T *y, int64_t outer, int64_t axis_dim, int64_t inner, int64_t nidx) {
    KC_GRID_STRIDE(t, outer * nidx * inner) {
        int64_t i = t % inner, rest = t / inner;
        int64_t j = rest % nidx, o = rest / nidx;
        int64_t k = (int64_t)idx[j];
        if (k < 0) k += axis_dim;
        if (k < 0 || k >= axis_dim) {
            memset(&y[t], 0, sizeof(T));
            continue;
        }
        y[t] = x[(o * axis_dim + k) * inner + i];
    }
}

template <class T>
static cudaError_t launch_gather(const void *x, const void *idx, enum dtype idt, void *y, int64_t outer, int64_t axis_dim,
                                 int64_t inner, int64_t nidx, cudaStream_t s) {
    unsigned g = kc_blocks(outer * nidx * inner, KC_THREADS);
    if (idt == DT_INT64) {
        auto k = k_gather<T, int64_t>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (const T *)x, (const int64_t *)idx, (T *)y, outer, axis_dim, inner, nidx);
    } else if (idt == DT_INT32) {
        auto k = k_gather<T, int32_t>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (const T *)x, (const int32_t *)idx, (T *)y, outer, axis_dim, inner, nidx);
    } else {
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t kc_gather(size_t elem, const void *x, const void *idx, enum dtype idx_dt, void *y, int64_t outer,
                      int64_t axis_dim, int64_t inner, int64_t nidx, cudaStream_t s) {
    if (outer * nidx * inner <= 0) return cudaSuccess;
    switch (elem) {
    case 1: return launch_gather<uint8_t>(x, idx, idx_dt, y, outer, axis_dim, inner, nidx, s);
    case 2: return launch_gather<uint16_t>(x, idx, idx_dt, y, outer, axis_dim, inner, nidx, s);
    case 4: return launch_gather<uint32_t>(x, idx, idx_dt, y, outer, axis_dim, inner, nidx, s);
    case 8: return launch_gather<uint64_t>(x, idx, idx_dt, y, outer, axis_dim, inner, nidx, s);
    }
    return cudaErrorInvalidValue;
}
