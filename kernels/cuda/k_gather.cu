/* k_gather.cu - Gather along one axis, and GatherElements, with int32 or
 * int64 indices (negative ones count from the end; out of range gives 0). */
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

/* GatherElements: out[c] = x[c with c[axis] replaced by idx[c]]. */
template <class T, class I>
__global__ void k_gather_elements(const T *x, const I *idx, T *y, kc_gather_el_desc d) {
    KC_GRID_STRIDE(t, d.n) {
        int64_t rest = t, off = 0;
        int bad = 0;
        for (int k = d.ndim - 1; k >= 0; k--) {
            int64_t c = rest % d.dims[k];
            rest /= d.dims[k];
            if (k == d.axis) {
                c = (int64_t)idx[t];
                if (c < 0) c += d.axis_dim;
                if (c < 0 || c >= d.axis_dim) bad = 1;
            }
            off += c * d.xstride[k];
        }
        if (bad) memset(&y[t], 0, sizeof(T));
        else y[t] = x[off];
    }
}

template <class T>
static cudaError_t launch_gather_el(const void *x, const void *idx, enum dtype idt, void *y, const kc_gather_el_desc *d,
                                    cudaStream_t s) {
    unsigned g = kc_blocks(d->n, KC_THREADS);
    if (idt == DT_INT64) {
        auto k = k_gather_elements<T, int64_t>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (const T *)x, (const int64_t *)idx, (T *)y, *d);
    } else if (idt == DT_INT32) {
        auto k = k_gather_elements<T, int32_t>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (const T *)x, (const int32_t *)idx, (T *)y, *d);
    } else {
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t kc_gather_elements(size_t elem, const void *x, const void *idx, enum dtype idx_dt, void *y,
                               const struct kc_gather_el_desc *d, cudaStream_t s) {
    if (d->n <= 0) return cudaSuccess;
    switch (elem) {
    case 1: return launch_gather_el<uint8_t>(x, idx, idx_dt, y, d, s);
    case 2: return launch_gather_el<uint16_t>(x, idx, idx_dt, y, d, s);
    case 4: return launch_gather_el<uint32_t>(x, idx, idx_dt, y, d, s);
    case 8: return launch_gather_el<uint64_t>(x, idx, idx_dt, y, d, s);
    }
    return cudaErrorInvalidValue;
}
