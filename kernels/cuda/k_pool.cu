/* k_pool.cu - MaxPool and AveragePool over 1 to 3 spatial dims with any
 * strides, dilations, asymmetric pads and ceil_mode (the output shape is
 * given): the cases cuDNN's pooling does not take, and every case under the
 * emulator. One thread per output element. */
#include "kernels/cuda/kcommon.cuh"

template <class T>
__global__ void k_pool(const T *x, T *y, kc_pool_desc p) {
    KC_GRID_STRIDE(i, p.n) {
        int64_t rest = i, o[3] = {0, 0, 0};
        for (int d = p.nsp - 1; d >= 0; d--) {
            o[d] = rest % p.out[d];
            rest /= p.out[d];
        }
        const T *xb = x + rest * p.in[0] * p.in[1] * p.in[2];
        /* Window bounds per dim; for count_include_pad the window is cut
         * at the padded edge, not at the input's. */
        int64_t lo[3] = {0, 0, 0}, cnt[3] = {1, 1, 1}, padded = 1;
        for (int d = 0; d < 3; d++) {
            if (d >= p.nsp) continue;
            lo[d] = o[d] * p.s[d] - p.pb[d];
            int64_t hi = lo[d] + (int64_t)(p.k[d] - 1) * p.dil[d] + 1, lim = p.in[d] + p.pe[d];
            if (hi > lim) hi = lim;
            padded *= (hi - lo[d] + p.dil[d] - 1) / p.dil[d];
            cnt[d] = p.k[d];
        }
        float acc = p.is_max ? -INFINITY : 0.0f;
        int64_t valid = 0;
        for (int64_t a = 0; a < cnt[0]; a++) {
            int64_t i0 = lo[0] + a * p.dil[0];
            if (i0 < 0 || i0 >= p.in[0]) continue;
            for (int64_t b = 0; b < cnt[1]; b++) {
                int64_t i1 = lo[1] + b * p.dil[1];
                if (i1 < 0 || i1 >= p.in[1]) continue;
                for (int64_t c = 0; c < cnt[2]; c++) {
                    int64_t i2 = lo[2] + c * p.dil[2];
                    if (i2 < 0 || i2 >= p.in[2]) continue;
                    float v = kc_ld(xb + (i0 * p.in[1] + i1) * p.in[2] + i2);
                    acc = p.is_max ? fmaxf(acc, v) : acc + v;
                    valid++;
                }
            }
        }
        if (!p.is_max) acc = valid ? acc / (float)(p.include_pad ? padded : valid) : 0.0f;
        kc_st(y + i, acc);
    }
}

cudaError_t kc_pool(enum dtype dt, const void *x, void *y, const struct kc_pool_desc *p, cudaStream_t s) {
    if (p->n <= 0) return cudaSuccess;
    unsigned g = kc_blocks(p->n, KC_THREADS);
    if (dt == DT_FP32) {
        auto k = k_pool<float>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (const float *)x, (float *)y, *p);
    } else if (dt == DT_FP16) {
        auto k = k_pool<kc_half>;
        KC_LAUNCH(k, g, KC_THREADS, 0, s, (const kc_half *)x, (kc_half *)y, *p);
    } else {
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
