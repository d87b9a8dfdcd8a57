/* k_argmax.cu - ArgMax / ArgMin over the middle dim of [outer, axis_len,
 * inner], int64 indices, first or last index on ties (select_last_index). */
#include "kernels/cuda/kcommon.cuh"

template <class T>
__global__ void k_argmax(const T *x, int64_t *y, int64_t outer, int64_t len, int64_t inner, int is_min, int last) {
    KC_GRID_STRIDE(t, outer * inner) {
        int64_t o = t / inner, i = t % inner;
        const T *xc = x + o * len * inner + i;
        int64_t best = 0;
        float bv = kc_ld(xc);
        for (int64_t j = 1; j < len; j++) {
            float v = kc_ld(xc + j * inner);
            int better = is_min ? (last ? v <= bv : v < bv) : (last ? v >= bv : v > bv);
            if (better) {
                bv = v;
                best = j;
            }
        }
        y[t] = best;
    }
}

/* Integer inputs compare exactly, not through float. */
template <class T>
__global__ void k_argmax_int(const T *x, int64_t *y, int64_t outer, int64_t len, int64_t inner, int is_min, int last) {
    KC_GRID_STRIDE(t, outer * inner) {
        int64_t o = t / inner, i = t % inner;
        const T *xc = x + o * len * inner + i;
        int64_t best = 0;
        T bv = xc[0];
        for (int64_t j = 1; j < len; j++) {
            T v = xc[j * inner];
            int better = is_min ? (last ? v <= bv : v < bv) : (last ? v >= bv : v > bv);
            if (better) {
                bv = v;
                best = j;
            }
        }
        y[t] = best;
    }
}

cudaError_t kc_argmax(enum dtype dt, const void *x, int64_t *y, int64_t outer, int64_t axis_len, int64_t inner,
                      int is_min, int select_last, cudaStream_t s) {
    int64_t n = outer * inner;
    if (n <= 0 || axis_len <= 0) return cudaSuccess;
    unsigned g = kc_blocks(n, KC_THREADS);
    switch (dt) {
    case DT_FP32: {
        auto k = k_argmax<float>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (const float *)x, y, outer, axis_len, inner, is_min, select_last);
        break;
    }
    case DT_FP16: {
        auto k = k_argmax<kc_half>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (const kc_half *)x, y, outer, axis_len, inner, is_min, select_last);
        break;
    }
    case DT_INT64: {
        auto k = k_argmax_int<int64_t>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (const int64_t *)x, y, outer, axis_len, inner, is_min, select_last);
        break;
    }
    case DT_INT32: {
        auto k = k_argmax_int<int32_t>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (const int32_t *)x, y, outer, axis_len, inner, is_min, select_last);
        break;
    }
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
