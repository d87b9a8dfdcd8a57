/* emu.h - a CUDA-on-CPU shim so that kiln's custom kernels compile and run as
 * host C++ in tests, on machines with no GPU.
 *
 * Included by kernels/cuda/kcuda.h when KILN_CUDA_EMU is defined (never by
 * nvcc). What it emulates, and how:
 *  - a launch (KC_LAUNCH) runs the grid's blocks one after another;
 *  - the threads of a block are fibers (ucontext), scheduled round-robin, so
 *    __syncthreads() is a real barrier: a fiber that reaches it yields until
 *    every live thread of its block has reached it;
 *  - __shared__ variables are function statics: one copy, shared by all the
 *    fibers of the block that is running (blocks never run at the same time);
 *    dynamic shared memory (KC_DYN_SHARED) is a per-launch buffer;
 *  - __shfl_*_sync exchange values through per-thread slots between two warp
 *    barriers over the 32 fibers of a warp, with CUDA's width semantics;
 *  - threadIdx/blockIdx/blockDim/gridDim are per fiber / per block;
 *  - the runtime calls kernels and tests use (cudaMalloc, cudaMemcpy*, ...)
 *    work on host memory; "device" pointers are host pointers.
 * Mistakes that are undefined on a GPU are reported and abort: a launch
 * configuration a GPU refuses, part of a warp shuffling while another part
 * waits at __syncthreads, a barrier some threads never reach.
 *
 * Single-threaded: one launch runs at a time in the process. */
#ifndef KILN_CUDA_EMU_H
#define KILN_CUDA_EMU_H

#ifndef __cplusplus
#error "emu.h is C++"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>

/* ---- types and qualifiers --------------------------------------------- */

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
/* Function statics are shared by every fiber of the running block. */
#define __shared__ static

/* ---- per-fiber and per-block state ------------------------------------- */

namespace emu {

struct block_state {
    dim3 grid;
    dim3 block;
    uint3 bidx;
};

extern block_state g_block;
extern uint3 *g_tid;      /* the running fiber's threadIdx */
extern int g_linear_tid;  /* the running fiber's linear index in its block */
extern uint64_t *g_slots; /* one exchange slot per thread of the block */
extern void *g_dyn_shared;

void launch(dim3 grid, dim3 block, size_t dyn_shared, const std::function<void()> &body);
void syncthreads();
void warp_sync();
/* Number of launches and fibers run so far (tests report them). */
uint64_t launch_count();
uint64_t fiber_count();

template <class T>
T shfl(T v, int src_lane, int width, int mode) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a value wider than 8 bytes");
    int me = g_linear_tid;
    int lane = me & 31;
    int base = me - lane;
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    g_slots[me] = bits;
    warp_sync();
    int seg = (lane / width) * width;
    int src = lane; /* own value when the source is outside the segment */
    switch (mode) {
    case 0: src = seg + (src_lane % width); break;                       /* __shfl_sync */
    case 1: if (lane - seg + src_lane < width) src = lane + src_lane; break; /* down */
    case 2: if (lane - seg >= src_lane) src = lane - src_lane; break;        /* up */
    case 3: { int s = lane ^ src_lane; if (s >= seg && s < seg + width) src = s; } break; /* xor */
    }
    int nthreads = (int)(g_block.block.x * g_block.block.y * g_block.block.z);
    T r = v;
    if (base + src < nthreads) memcpy(&r, &g_slots[base + src], sizeof(T));
    warp_sync();
    return r;
}

} // namespace emu

#define threadIdx (*emu::g_tid)
#define blockIdx (emu::g_block.bidx)
#define blockDim (emu::g_block.block)
#define gridDim (emu::g_block.grid)
#define warpSize 32

inline void __syncthreads() { emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)mask; emu::warp_sync(); }

template <class T> T __shfl_sync(unsigned mask, T v, int src, int width = 32) { (void)mask; return emu::shfl(v, src, width, 0); }
template <class T> T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) { (void)mask; return emu::shfl(v, (int)d, width, 1); }
template <class T> T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) { (void)mask; return emu::shfl(v, (int)d, width, 2); }
template <class T> T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) { (void)mask; return emu::shfl(v, m, width, 3); }

/* Atomics are plain read-modify-writes: only one fiber runs at a time. */
template <class T> T atomicAdd(T *p, T v) { T old = *p; *p = old + v; return old; }
template <class T> T atomicMax(T *p, T v) { T old = *p; if (v > old) *p = v; return old; }
template <class T> T atomicMin(T *p, T v) { T old = *p; if (v < old) *p = v; return old; }

template <class T> inline T __ldg(const T *p) { return *p; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }

/* ---- the runtime API subset -------------------------------------------- */

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
};
typedef struct emu_stream *cudaStream_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

namespace emu {
extern cudaError_t g_last_error;
}

inline cudaError_t cudaGetLastError(void) { cudaError_t e = emu::g_last_error; emu::g_last_error = cudaSuccess; return e; }
inline cudaError_t cudaPeekAtLastError(void) { return emu::g_last_error; }
inline const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    }
    return "unknown error";
}
inline cudaError_t cudaMalloc(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <class T> inline cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
inline cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) { if (n) memmove(d, s, n); return cudaSuccess; }
inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t = nullptr) { return cudaMemcpy(d, s, n, k); }
inline cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t = nullptr) { memset(d, v, n); return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

/* ---- launch ------------------------------------------------------------- */

#define KC_LAUNCH(kernel, grid, block, shmem, stream, ...) \
    ((void)(stream), emu::launch((grid), (block), (shmem), [&]() { kernel(__VA_ARGS__); }))
#define KC_DYN_SHARED(type, name) type *name = (type *)emu::g_dyn_shared

#endif
