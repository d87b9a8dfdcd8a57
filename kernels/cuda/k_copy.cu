/* k_copy.cu - strided 2-D copies for Concat (each input into its column
 * range of the output) and Split (each output from its column range). */
#include "kernels/cuda/kcommon.cuh"

template <class T>
__global__ void k_copy2d(T *dst, int64_t dst_ld, const T *src, int64_t src_ld, int64_t rows, int64_t cols) {
    KC_GRID_STRIDE(i, rows * cols) {
        int64_t r = i / cols, c = i % cols;
        dst[r * dst_ld + c] = src[r * src_ld + c];
    }
}

cudaError_t kc_copy2d(size_t elem, void *dst, int64_t dst_ld, const void *src, int64_t src_ld, int64_t rows,
                      int64_t cols, cudaStream_t s) {
    int64_t n = rows * cols;
    if (n <= 0) return cudaSuccess;
    /* Widen the element when the layout allows it: fewer, larger accesses. */
    while (elem < 8 && cols % 2 == 0 && dst_ld % 2 == 0 && src_ld % 2 == 0 &&
           ((uintptr_t)dst % (elem * 2)) == 0 && ((uintptr_t)src % (elem * 2)) == 0) {
        elem *= 2;
        cols /= 2;
        dst_ld /= 2;
        src_ld /= 2;
        n /= 2;
    }
    unsigned g = kc_blocks(n, KC_THREADS);
    switch (elem) {
    case 1: { auto k = k_copy2d<uint8_t>; KC_LAUNCH(k, g, KC_THREADS, 0, s, (uint8_t *)dst, dst_ld, (const uint8_t *)src, src_ld, rows, cols); break; }
    case 2: { auto k = k_copy2d<uint16_t>; KC_LAUNCH(k, g, KC_THREADS, 0, s, (uint16_t *)dst, dst_ld, (const uint16_t *)src, src_ld, rows, cols); break; }
    case 4: { auto k = k_copy2d<uint32_t>; KC_LAUNCH(k, g, KC_THREADS, 0, s, (uint32_t *)dst, dst_ld, (const uint32_t *)src, src_ld, rows, cols); break; }
    case 8: { auto k = k_copy2d<uint64_t>; KC_LAUNCH(k, g, KC_THREADS, 0, s, (uint64_t *)dst, dst_ld, (const uint64_t *)src, src_ld, rows, cols); break; }
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
