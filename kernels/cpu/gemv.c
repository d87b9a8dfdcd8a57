/* gemv.c - one row by a packed small matrix (gemv.h): AVX-512, AVX2 and
 * the baseline. The vector versions hold a panel's outputs in registers
 * across all of k: eight accumulators, enough independent FMAs to cover
 * their latency. */
/* The same code generation as where these loops began (ops_rnn.c). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno")
#endif

#include "kernels/cpu/gemv.h"

#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GEMV_X86 1
#endif

#include "kernels/cpu/dnnl_util.h"

void cpu_gemv_pack(const float *src, int64_t k, int64_t n, int64_t sk, int64_t sn, float *dst) {
    for (int64_t q = 0; q < n; q += CPU_GEMV_PANEL) {
        int64_t w = n - q < CPU_GEMV_PANEL ? n - q : CPU_GEMV_PANEL;
        float *panel = dst + q * k;
        for (int64_t c = 0; c < w; c++)
            for (int64_t j = 0; j < k; j++) panel[j * w + c] = src[j * sk + (q + c) * sn];
    }
}

static void gemv_c(const float *x, int64_t k, const float *pk, int64_t n, float *out) {
    for (int64_t q = 0; q < n; q += CPU_GEMV_PANEL) {
        int64_t w = n - q < CPU_GEMV_PANEL ? n - q : CPU_GEMV_PANEL;
        const float *panel = pk + q * k;
        float *o = out + q;
        memset(o, 0, sizeof(float) * (size_t)w);
        for (int64_t j = 0; j < k; j++) {
            const float xj = x[j], *r = panel + j * w;
#pragma omp simd
            for (int64_t c = 0; c < w; c++) o[c] += xj * r[c];
        }
    }
}

#ifdef GEMV_X86
__attribute__((target("arch=x86-64-v4"))) static void gemv_v4(const float *x, int64_t k, const float *pk, int64_t n,
                                                               float *out) {
    for (int64_t q = 0; q < n; q += CPU_GEMV_PANEL) {
        int64_t w = n - q < CPU_GEMV_PANEL ? n - q : CPU_GEMV_PANEL;
        const float *panel = pk + q * k;
        if (w == CPU_GEMV_PANEL) {
            /* Eight named accumulators: GCC keeps an array of them in memory. */
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (int64_t j = 0; j < k; j++) {
                const __m512 xj = _mm512_set1_ps(x[j]);
                const float *r = panel + j * CPU_GEMV_PANEL;
                a0 = _mm512_fmadd_ps(xj, _mm512_loadu_ps(r), a0);
                a1 = _mm512_fmadd_ps(xj, _mm512_loadu_ps(r + 16), a1);
                a2 = _mm512_fmadd_ps(xj, _mm512_loadu_ps(r + 32), a2);
                a3 = _mm512_fmadd_ps(xj, _mm512_loadu_ps(r + 48), a3);
                a4 = _mm512_fmadd_ps(xj, _mm512_loadu_ps(r + 64), a4);
                a5 = _mm512_fmadd_ps(xj, _mm512_loadu_ps(r + 80), a5);
                a6 = _mm512_fmadd_ps(xj, _mm512_loadu_ps(r + 96), a6);
                a7 = _mm512_fmadd_ps(xj, _mm512_loadu_ps(r + 112), a7);
            }
            float *o = out + q;
            _mm512_storeu_ps(o, a0), _mm512_storeu_ps(o + 16, a1), _mm512_storeu_ps(o + 32, a2);
            _mm512_storeu_ps(o + 48, a3), _mm512_storeu_ps(o + 64, a4), _mm512_storeu_ps(o + 80, a5);
            _mm512_storeu_ps(o + 96, a6), _mm512_storeu_ps(o + 112, a7);
            continue;
        }
        for (int64_t c = 0; c < w; c += 16) {
            __mmask16 m = w - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (w - c)) - 1);
            __m512 a = _mm512_setzero_ps();
            for (int64_t j = 0; j < k; j++)
                a = _mm512_fmadd_ps(_mm512_set1_ps(x[j]), _mm512_maskz_loadu_ps(m, panel + j * w + c), a);
            _mm512_mask_storeu_ps(out + q + c, m, a);
        }
    }
}

__attribute__((target("arch=x86-64-v3"))) static void gemv_v3(const float *x, int64_t k, const float *pk, int64_t n,
                                                               float *out) {
    for (int64_t q = 0; q < n; q += CPU_GEMV_PANEL) {
        int64_t w = n - q < CPU_GEMV_PANEL ? n - q : CPU_GEMV_PANEL, c = 0;
        const float *panel = pk + q * k;
        for (; c + 64 <= w; c += 64) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (int64_t j = 0; j < k; j++) {
                const __m256 xj = _mm256_set1_ps(x[j]);
                const float *r = panel + j * w + c;
                a0 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(r), a0);
                a1 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(r + 8), a1);
                a2 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(r + 16), a2);
                a3 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(r + 24), a3);
                a4 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(r + 32), a4);
                a5 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(r + 40), a5);
                a6 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(r + 48), a6);
                a7 = _mm256_fmadd_ps(xj, _mm256_loadu_ps(r + 56), a7);
            }
            float *o = out + q + c;
            _mm256_storeu_ps(o, a0), _mm256_storeu_ps(o + 8, a1), _mm256_storeu_ps(o + 16, a2);
            _mm256_storeu_ps(o + 24, a3), _mm256_storeu_ps(o + 32, a4), _mm256_storeu_ps(o + 40, a5);
            _mm256_storeu_ps(o + 48, a6), _mm256_storeu_ps(o + 56, a7);
        }
        for (; c + 8 <= w; c += 8) {
            __m256 a = _mm256_setzero_ps();
            for (int64_t j = 0; j < k; j++)
                a = _mm256_fmadd_ps(_mm256_set1_ps(x[j]), _mm256_loadu_ps(panel + j * w + c), a);
            _mm256_storeu_ps(out + q + c, a);
        }
        if (c < w) {
            /* The last 1 to 7 columns through masked loads: per column the
             * same chain of FMAs from 0 as a scalar fmaf loop, a vector of
             * them at once. */
            const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(w - c)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            __m256 a = _mm256_setzero_ps();
            for (int64_t j = 0; j < k; j++)
                a = _mm256_fmadd_ps(_mm256_set1_ps(x[j]), _mm256_maskload_ps(panel + j * w + c, m), a);
            _mm256_maskstore_ps(out + q + c, m, a);
        }
    }
}
#endif

void cpu_gemv(const float *x, int64_t k, const float *pk, int64_t n, float *out) {
#ifdef GEMV_X86
    int l = dnnl_util_isa_level();
    if (l >= 4) return gemv_v4(x, k, pk, n, out);
    if (l == 3) return gemv_v3(x, k, pk, n, out);
#endif
    gemv_c(x, k, pk, n, out);
}
