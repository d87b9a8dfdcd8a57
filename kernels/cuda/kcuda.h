/* kcuda.h - what every kiln CUDA source includes first: the real CUDA
 * runtime under nvcc (or a host compiler linking cudart), the emulation shim
 * of emu/emu.h when KILN_CUDA_EMU is defined (tests on machines with no GPU).
 *
 * Kernels are written once against this header:
 *   KC_LAUNCH(kernel, grid, block, shared_bytes, stream, args...)
 *       kernel<<<grid, block, shared_bytes, stream>>>(args...) under nvcc,
 *       an emulated launch otherwise;
 *   KC_DYN_SHARED(type, name) declares the dynamic shared memory array;
 *   kc_h2f / kc_f2h convert IEEE half bits (uint16_t) to and from float. */
#ifndef KILN_KCUDA_H
#define KILN_KCUDA_H

#ifdef KILN_CUDA_EMU
#include "kernels/cuda/emu/emu.h"
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define KC_LAUNCH(kernel, grid, block, shmem, stream, ...) kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#define KC_DYN_SHARED(type, name) extern __shared__ type name[]
#endif

#include <stdint.h>
#include <string.h>

#if defined(KILN_CUDA_EMU) || !defined(__CUDACC__)
/* Host (and emulated device) half conversions, round to nearest even. */
static inline float kc_h2f(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) {
        if (m == 0) bits = s;
        else { /* subnormal: normalize */
            int sh = 0;
            while (!(m & 0x400)) { m <<= 1; sh++; }
            m &= 0x3ff;
            bits = s | ((uint32_t)(127 - 15 + 1 - sh) << 23) | (m << 13);
        }
    } else if (e == 31) bits = s | 0x7f800000u | (m << 13);
    else bits = s | ((e + 127 - 15) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static inline uint16_t kc_f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t s = (x >> 16) & 0x8000, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(s | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0));
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00); /* rounds to infinity */
    if (a < 0x38800000u) { /* subnormal half or zero */
        if (a < 0x33000000u) return (uint16_t)s;
        uint32_t m = (a & 0x7fffff) | 0x800000;
        int sh = 126 - (int)(a >> 23) + 14 - 1; /* 14..24 */
        uint32_t r = m >> (sh + 1), rem = m & ((1u << (sh + 1)) - 1), half = 1u << sh;
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(s | r);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent */
    uint32_t h = r >> 13, rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(s | h);
}
#else
static __device__ __forceinline__ float kc_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ uint16_t kc_f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
#endif

static inline __host__ __device__ float kc_bf2f(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static inline __host__ __device__ uint16_t kc_f2bf(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

#endif
