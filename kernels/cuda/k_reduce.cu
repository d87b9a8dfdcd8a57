/* k_reduce.cu - ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp
 * over any set of axes (and GlobalAverage/MaxPool as reductions over H, W).
 * Small reductions use one thread per output; large ones one block per
 * output with warp-shuffle reductions. */
#include "kernels/cuda/kcommon.cuh"

__device__ __forceinline__ int64_t kc_kept_off(const kc_reduce_desc &d, int64_t o) {
    int64_t off = 0;
    for (int k = d.nk - 1; k >= 0; k--) {
        off += (o % d.kdims[k]) * d.kstride[k];
        o /= d.kdims[k];
    }
    return off;
}

__device__ __forceinline__ int64_t kc_red_off(const kc_reduce_desc &d, int64_t r) {
    int64_t off = 0;
    for (int k = d.nr - 1; k >= 0; k--) {
        off += (r % d.rdims[k]) * d.rstride[k];
        r /= d.rdims[k];
    }
    return off;
}

/* How partial results combine: 0 sum, 1 max, 2 min, 3 product. */
__device__ __forceinline__ int kc_combine_of(int op) {
    switch (op) {
    case KR_MAX: return 1;
    case KR_MIN: return 2;
    case KR_PROD: return 3;
    }
    return 0;
}

__device__ __forceinline__ float kc_red_identity(int comb) {
    return comb == 1 ? -INFINITY : (comb == 2 ? INFINITY : (comb == 3 ? 1.0f : 0.0f));
}

/* The value folded in for one element (after LogSumExp's max shift). */
__device__ __forceinline__ float kc_red_map(int op, float v, float shift) {
    switch (op) {
    case KR_L1: return fabsf(v);
    case KR_L2:
    case KR_SUM_SQUARE: return v * v;
    case KR_LOG_SUM_EXP: return expf(v - shift);
    }
    return v;
}

__device__ __forceinline__ float kc_red_combine(int comb, float a, float b) {
    switch (comb) {
    case 1: return fmaxf(a, b);
    case 2: return fminf(a, b);
    case 3: return a * b;
    }
    return a + b;
}

__device__ __forceinline__ float kc_red_final(int op, float acc, float shift, int64_t n) {
    switch (op) {
    case KR_MEAN: return acc / (float)n;
    case KR_L2: return sqrtf(acc);
    case KR_LOG_SUM: return logf(acc);
    case KR_LOG_SUM_EXP: return shift + logf(acc);
    }
    return acc;
}

template <class T>
__global__ void k_reduce_thread(int op, const T *x, T *y, kc_reduce_desc d) {
    int comb = kc_combine_of(op);
    KC_GRID_STRIDE(o, d.out_n) {
        const T *base = x + kc_kept_off(d, o);
        float shift = 0.0f;
        if (op == KR_LOG_SUM_EXP) {
            shift = -INFINITY;
            for (int64_t r = 0; r < d.r_n; r++) shift = fmaxf(shift, kc_ld(base + kc_red_off(d, r)));
            if (isinf(shift)) shift = 0.0f;
        }
        float acc = kc_red_identity(comb);
        for (int64_t r = 0; r < d.r_n; r++) acc = kc_red_combine(comb, acc, kc_red_map(op, kc_ld(base + kc_red_off(d, r)), shift));
        kc_st(y + o, kc_red_final(op, acc, shift, d.r_n));
    }
}

template <class T>
__global__ void k_reduce_block(int op, const T *x, T *y, kc_reduce_desc d) {
    __shared__ float smem[32];
    int comb = kc_combine_of(op);
    for (int64_t o = blockIdx.x; o < d.out_n; o += gridDim.x) {
        const T *base = x + kc_kept_off(d, o);
        float shift = 0.0f;
        if (op == KR_LOG_SUM_EXP) {
            float m = -INFINITY;
            for (int64_t r = threadIdx.x; r < d.r_n; r += blockDim.x) m = fmaxf(m, kc_ld(base + kc_red_off(d, r)));
            shift = kc_block_reduce(m, 1, smem);
            if (isinf(shift)) shift = 0.0f;
        }
        float acc = kc_red_identity(comb);
        for (int64_t r = threadIdx.x; r < d.r_n; r += blockDim.x)
            acc = kc_red_combine(comb, acc, kc_red_map(op, kc_ld(base + kc_red_off(d, r)), shift));
        acc = kc_block_reduce(acc, comb, smem);
        if (threadIdx.x == 0) kc_st(y + o, kc_red_final(op, acc, shift, d.r_n));
    }
}

template <class T>
static cudaError_t launch_reduce(int op, const void *x, void *y, const kc_reduce_desc *d, cudaStream_t s) {
    if (d->r_n < 64 || d->out_n >= 65536) {
        auto k = k_reduce_thread<T>;
        KC_LAUNCH(k, kc_blocks(d->out_n, KC_THREADS), KC_THREADS, 0, s, op, (const T *)x, (T *)y, *d);
    } else {
        int threads = d->r_n <= 1024 ? 128 : 256;
        unsigned g = (unsigned)(d->out_n < KC_MAX_ROW_BLOCKS ? d->out_n : KC_MAX_ROW_BLOCKS);
        auto k = k_reduce_block<T>;
        KC_LAUNCH(k, g, threads, 0, s, op, (const T *)x, (T *)y, *d);
    }
    return cudaGetLastError();
}

cudaError_t kc_reduce(int op, enum dtype dt, const void *x, void *y, const struct kc_reduce_desc *d, cudaStream_t s) {
    if (d->out_n <= 0) return cudaSuccess;
    if (dt == DT_FP32) return launch_reduce<float>(op, x, y, d, s);
    if (dt == DT_FP16) return launch_reduce<kc_half>(op, x, y, d, s);
    return cudaErrorInvalidValue;
}
