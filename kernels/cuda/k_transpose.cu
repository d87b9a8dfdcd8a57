/* k_transpose.cu - index-remapping copies: Transpose, Slice, Pad (constant,
 * edge, reflect, wrap), Expand and Tile are all "output coordinate -> input
 * coordinate per dim" (struct kc_remap_desc), one kernel per element size. */
#include "kernels/cuda/kcommon.cuh"

template <class T>
__global__ void k_remap(const T *x, T *y, kc_remap_desc m) {
    T pad;
    memcpy(&pad, &m.pad_bits, sizeof(T));
    KC_GRID_STRIDE(i, m.n) {
        int64_t rest = i, off = 0;
        int outside = 0;
        for (int d = m.ndim - 1; d >= 0; d--) {
            int64_t c = rest % m.out_dims[d];
            rest /= m.out_dims[d];
            int64_t n = m.in_dims[d], ic;
            switch (m.mode[d]) {
            case KM_MOD: ic = c % n; break;
            case KM_LINEAR: ic = m.start[d] + c * m.step[d]; break;
            default:
                ic = c - m.start[d];
                if (ic < 0 || ic >= n) {
                    if (m.mode[d] == KM_PAD_CONSTANT) outside = 1;
                    else if (m.mode[d] == KM_PAD_EDGE) ic = ic < 0 ? 0 : n - 1;
                    else if (m.mode[d] == KM_PAD_WRAP) ic = ((ic % n) + n) % n;
                    else if (n == 1) ic = 0;
                    else { /* reflect without repeating the edge: period 2n - 2 */
                        int64_t p = 2 * n - 2;
                        ic = ((ic % p) + p) % p;
                        if (ic >= n) ic = p - ic;
                    }
                }
                break;
            }
            off += ic * m.in_stride[d];
        }
        y[i] = outside ? pad : x[off];
    }
}

cudaError_t kc_remap(size_t elem, const void *x, void *y, const struct kc_remap_desc *m, cudaStream_t s) {
    if (m->n <= 0) return cudaSuccess;
    unsigned g = kc_blocks(m->n, KC_THREADS);
    switch (elem) {
    case 1: { auto k = k_remap<uint8_t>; KC_LAUNCH(k, g, KC_THREADS, 0, s, (const uint8_t *)x, (uint8_t *)y, *m); break; }
    case 2: { auto k = k_remap<uint16_t>; KC_LAUNCH(k, g, KC_THREADS, 0, s, (const uint16_t *)x, (uint16_t *)y, *m); break; }
    case 4: { auto k = k_remap<uint32_t>; KC_LAUNCH(k, g, KC_THREADS, 0, s, (const uint32_t *)x, (uint32_t *)y, *m); break; }
    case 8: { auto k = k_remap<uint64_t>; KC_LAUNCH(k, g, KC_THREADS, 0, s, (const uint64_t *)x, (uint64_t *)y, *m); break; }
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
