/* k_layernorm.cu - LayerNormalization over the trailing cols of [rows, cols]:
 * one block per row, mean and variance by block reductions (two passes, so
 * large offsets do not cancel). */
#include "kernels/cuda/kcommon.cuh"

template <class T>
__global__ void k_layernorm(const T *x, const T *scale, const T *bias, T *y, float *mean_out, float *inv_out,
                            int64_t rows, int64_t cols, float eps) {
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
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
            float v = (kc_ld(xr + j) - mean) * inv;
            if (scale) v *= kc_ld(scale + j);
            if (bias) v += kc_ld(bias + j);
            kc_st(yr + j, v);
        }
        if (threadIdx.x == 0) {
            if (mean_out) mean_out[r] = mean;
            if (inv_out) inv_out[r] = inv;
        }
    }
}

cudaError_t kc_layernorm(enum dtype dt, const void *x, const void *scale, const void *bias, void *y, float *mean,
                         float *inv_std, int64_t rows, int64_t cols, float eps, cudaStream_t s) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    int threads = cols <= 32 ? 32 : (cols <= 256 ? 128 : 256);
    unsigned g = (unsigned)(rows < KC_MAX_ROW_BLOCKS ? rows : KC_MAX_ROW_BLOCKS);
    if (dt == DT_FP32) {
        auto k = k_layernorm<float>;
        KC_LAUNCH(k, g, threads, 0, s, (const float *)x, (const float *)scale, (const float *)bias, (float *)y, mean,
                  inv_std, rows, cols, eps);
    } else if (dt == DT_FP16) {
        auto k = k_layernorm<kc_half>;
        KC_LAUNCH(k, g, threads, 0, s, (const kc_half *)x, (const kc_half *)scale, (const kc_half *)bias, (kc_half *)y,
                  mean, inv_std, rows, cols, eps);
    } else {
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
