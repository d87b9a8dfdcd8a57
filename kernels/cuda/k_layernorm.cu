/* k_layernorm.cu - the normalizations: LayerNormalization over the trailing
 * cols of [rows, cols] and InstanceNormalization (the same with one scale
 * and bias per row's channel): one block per row, mean and variance by block
 * reductions (two passes, so large offsets do not cancel); LRN across
 * channels. */
#include "kernels/cuda/kcommon.cuh"

template <class T>
__global__ void k_layernorm(const T *x, const T *scale, const T *bias, T *y, float *mean_out, float *inv_out,
                            int64_t rows, int64_t cols, float eps, int64_t row_channels) {
    __shared__ float smem[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * cols;
        T *yr = y + r * cols;
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += kc_ld(xr + j);
        float mean = kc_block_reduce(sum, 0, smem) / (float)cols;
        float sq = 0.0f;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
            float d = kc_ld(xr + j) - mean;
            sq += d * d;
        }
        float var = kc_block_reduce(sq, 0, smem) / (float)cols;
        float inv = 1.0f / sqrtf(var + eps);
        if (row_channels > 0) { /* InstanceNormalization: one scale and bias per row */
            int64_t ch = r % row_channels;
            float sc = scale ? kc_ld(scale + ch) : 1.0f, bi = bias ? kc_ld(bias + ch) : 0.0f;
            for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) kc_st(yr + j, (kc_ld(xr + j) - mean) * inv * sc + bi);
        } else {
            for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
                float v = (kc_ld(xr + j) - mean) * inv;
                if (scale) v *= kc_ld(scale + j);
                if (bias) v += kc_ld(bias + j);
                kc_st(yr + j, v);
            }
        }
        if (threadIdx.x == 0) {
            if (mean_out) mean_out[r] = mean;
            if (inv_out) inv_out[r] = inv;
        }
    }
}

cudaError_t kc_layernorm(enum dtype dt, const void *x, const void *scale, const void *bias, void *y, float *mean,
                         float *inv_std, int64_t rows, int64_t cols, float eps, int64_t row_channels, cudaStream_t s) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    int threads = cols <= 32 ? 32 : (cols <= 256 ? 128 : 256);
    unsigned g = (unsigned)(rows < KC_MAX_ROW_BLOCKS ? rows : KC_MAX_ROW_BLOCKS);
    if (dt == DT_FP32) {
        auto k = k_layernorm<float>;
        KC_LAUNCH(k, g, threads, 0, s, (const float *)x, (const float *)scale, (const float *)bias, (float *)y, mean,
                  inv_std, rows, cols, eps, row_channels);
    } else if (dt == DT_FP16) {
        auto k = k_layernorm<kc_half>;
        KC_LAUNCH(k, g, threads, 0, s, (const kc_half *)x, (const kc_half *)scale, (const kc_half *)bias, (kc_half *)y,
                  mean, inv_std, rows, cols, eps, row_channels);
    } else {
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* LRN: y = x / (bias + alpha / size * sum of x^2 over the channel window)^beta. */
template <class T>
__global__ void k_lrn(const T *x, T *y, int64_t n, int64_t c, int64_t inner, int size, float alpha, float beta,
                      float bias) {
    int lo = (size - 1) / 2, hi = size - 1 - lo; /* floor((size-1)/2) below, ceil above */
    KC_GRID_STRIDE(i, n * c * inner) {
        int64_t in = i % inner, ch = (i / inner) % c, b = i / (inner * c);
        float sq = 0.0f;
        for (int64_t k = ch - lo; k <= ch + hi; k++) {
            if (k < 0 || k >= c) continue;
            float v = kc_ld(x + (b * c + k) * inner + in);
            sq += v * v;
        }
        kc_st(y + i, kc_ld(x + i) / powf(bias + alpha / (float)size * sq, beta));
    }
}

cudaError_t kc_lrn(enum dtype dt, const void *x, void *y, int64_t n, int64_t c, int64_t inner, int size, float alpha,
                   float beta, float bias, cudaStream_t s) {
    int64_t total = n * c * inner;
    if (total <= 0) return cudaSuccess;
    unsigned g = kc_blocks(total, KC_THREADS);
    if (dt == DT_FP32) {
        auto k = k_lrn<float>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (const float *)x, (float *)y, n, c, inner, size, alpha, beta, bias);
    } else if (dt == DT_FP16) {
        auto k = k_lrn<kc_half>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (const kc_half *)x, (kc_half *)y, n, c, inner, size, alpha, beta, bias);
    } else {
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
