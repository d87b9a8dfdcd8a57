/* kcommon.cuh - device helpers shared by the k_*.cu kernel families: float
 * loads and stores of FP32/FP16 storage, fused activations, block reductions
 * and launch sizing. */
#ifndef KILN_CUDA_KCOMMON_CUH
#define KILN_CUDA_KCOMMON_CUH

#include <math.h>

#include "kernels/cuda/kernels.h"

#define KC_THREADS 256
/* Grid-stride loops: enough blocks to fill a large GPU, never more than
 * needed; row kernels loop over rows past the grid. The emulator runs every
 * thread as a fiber, so there the grids are small and the loops do the rest
 * (which also exercises them). */
#ifdef KILN_CUDA_EMU
#define KC_MAX_BLOCKS 48
#define KC_MAX_ROW_BLOCKS 48
#else
#define KC_MAX_BLOCKS 4096
#define KC_MAX_ROW_BLOCKS 65535
#endif

static inline unsigned kc_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > KC_MAX_BLOCKS) b = KC_MAX_BLOCKS;
    return (unsigned)b;
}

#define KC_GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)blockDim.x * gridDim.x)

__device__ __forceinline__ float kc_ld(const float *p) { return *p; }
__device__ __forceinline__ float kc_ld(const kc_half *p) { return kc_h2f(p->bits); }
__device__ __forceinline__ void kc_st(float *p, float v) { *p = v; }
__device__ __forceinline__ void kc_st(kc_half *p, float v) { p->bits = kc_f2h(v); }

/* Same formulas as act_apply() in kernels/ops.h (the CPU reference). */
__device__ __forceinline__ float kc_act_apply(int kind, float x, float a, float b) {
    switch (kind) {
    case 0: return x;
    case 1: return x > 0.0f ? x : 0.0f;
    case 2: return x >= 0.0f ? x : a * x;
    case 3: return x < a ? a : (x > b ? b : x);
    case 4: return 1.0f / (1.0f + expf(-x));
    case 5: return tanhf(x);
    case 6: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case 7: { float y = a * x + b; return y < 0.0f ? 0.0f : (y > 1.0f ? 1.0f : y); }
    case 8: { float y = x / 6.0f + 0.5f; return x * (y < 0.0f ? 0.0f : (y > 1.0f ? 1.0f : y)); }
    case 9: return x / (1.0f + expf(-x));
    }
    return x;
}

/* Sum / max over a block (blockDim.x a multiple of 32, at most 1024): warp
 * shuffles, then one value per warp through shared memory. Every thread of
 * the block must call it; every thread gets the result. */
__device__ __forceinline__ float kc_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float kc_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float kc_warp_min(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float kc_warp_prod(float v) {
    for (int o = 16; o > 0; o >>= 1) v *= __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* op: 0 sum, 1 max, 2 min, 3 product. */
__device__ __forceinline__ float kc_warp_reduce(float v, int op) {
    switch (op) {
    case 1: return kc_warp_max(v);
    case 2: return kc_warp_min(v);
    case 3: return kc_warp_prod(v);
    }
    return kc_warp_sum(v);
}

__device__ __forceinline__ float kc_block_reduce(float v, int op, float *smem32) {
    int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
    int nwarps = (int)((blockDim.x + 31) >> 5);
    v = kc_warp_reduce(v, op);
    __syncthreads(); /* smem32 may still be read by a previous call */
    if (lane == 0) smem32[warp] = v;
    __syncthreads();
    float ident = op == 1 ? -INFINITY : (op == 2 ? INFINITY : (op == 3 ? 1.0f : 0.0f));
    v = lane < nwarps ? smem32[lane] : ident;
    return kc_warp_reduce(v, op);
}

#endif
