/* k_softmax.cu - Softmax and LogSoftmax over the middle dim of
 * [outer, axis_len, inner] (opset >= 13 semantics; opset < 13 flattens, which
 * the dispatcher expresses as inner = 1). */
#include "kernels/cuda/kcommon.cuh"

/* inner == 1: one block per row, reductions with warp shuffles. */
template <class T>
__global__ void k_softmax_rows(const T *x, T *y, int64_t outer, int64_t len, int log) {
    __shared__ float smem[32];
    for (int64_t row = blockIdx.x; row < outer; row += gridDim.x) {
        const T *xr = x + row * len;
        T *yr = y + row * len;
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, kc_ld(xr + j));
        m = kc_block_reduce(m, 1, smem);
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x) sum += expf(kc_ld(xr + j) - m);
        sum = kc_block_reduce(sum, 0, smem);
        if (log) {
            float ls = logf(sum);
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x) kc_st(yr + j, kc_ld(xr + j) - m - ls);
        } else {
            float inv = 1.0f / sum;
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x) kc_st(yr + j, expf(kc_ld(xr + j) - m) * inv);
        }
    }
}

/* inner > 1: one thread per (outer, inner) column, strided along the axis. */
template <class T>
__global__ void k_softmax_cols(const T *x, T *y, int64_t outer, int64_t len, int64_t inner, int log) {
    KC_GRID_STRIDE(t, outer * inner) {
        int64_t o = t / inner, i = t % inner;
        const T *xc = x + o * len * inner + i;
        T *yc = y + o * len * inner + i;
        float m = -INFINITY;
        for (int64_t j = 0; j < len; j++) m = fmaxf(m, kc_ld(xc + j * inner));
        float sum = 0.0f;
        for (int64_t j = 0; j < len; j++) sum += expf(kc_ld(xc + j * inner) - m);
        float ls = logf(sum), inv = 1.0f / sum;
        for (int64_t j = 0; j < len; j++) {
            float v = kc_ld(xc + j * inner) - m;
            kc_st(yc + j * inner, log ? v - ls : expf(v) * inv);
        }
    }
}

template <class T>
static cudaError_t launch_softmax(const void *x, void *y, int64_t outer, int64_t len, int64_t inner, int log,
                                  cudaStream_t s) {
    if (inner == 1) {
        int threads = len <= 32 ? 32 : (len <= 128 ? 128 : 256);
        unsigned g = (unsigned)(outer < KC_MAX_ROW_BLOCKS ? outer : KC_MAX_ROW_BLOCKS);
        auto k = k_softmax_rows<T>;
        KC_LAUNCH(k, g, threads, 0, s, (const T *)x, (T *)y, outer, len, log);
    } else {
        auto k = k_softmax_cols<T>;
        KC_LAUNCH(k, kc_blocks(outer * inner, KC_THREADS), KC_THREADS, 0, s, (const T *)x, (T *)y, outer, len, inner, log);
    }
    return cudaGetLastError();
}

cudaError_t kc_softmax(enum dtype dt, const void *x, void *y, int64_t outer, int64_t axis_len, int64_t inner, int log,
                       cudaStream_t s) {
    if (outer <= 0 || axis_len <= 0 || inner <= 0) return cudaSuccess;
    if (dt == DT_FP32) return launch_softmax<float>(x, y, outer, axis_len, inner, log, s);
    if (dt == DT_FP16) return launch_softmax<kc_half>(x, y, outer, axis_len, inner, log, s);
    return cudaErrorInvalidValue;
}
