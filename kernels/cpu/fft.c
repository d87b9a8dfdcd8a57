/* fft.c - mixed-radix FFT with a Bluestein fallback (see fft.h). */
#include "kernels/cpu/fft.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct fft_plan {
    int64_t n;
    int nfac;
    int fac[64];          /* radices, product n; empty when Bluestein is used */
    double complex *tw;   /* e^(-2 pi i k/n), k < n */
    /* Bluestein: a length-m power-of-two plan, the chirp e^(-pi i k^2/n)
     * and the transform of its conjugate wrapped around m. */
    int64_t m;
    struct fft_plan *sub;
    double complex *chirp;
    double complex *bfft;
};

static const double two_pi = 6.283185307179586476925286766559;

/* A complex product without C's infinity/NaN recovery (which makes every
 * '*' of two double complex a library call); the values here are finite. */
static inline double complex cmul(double complex a, double complex b) {
    double ar = creal(a), ai = cimag(a), br = creal(b), bi = cimag(b);
    return CMPLX(ar * br - ai * bi, ar * bi + ai * br);
}

/* Splits n into radices 4, 2, 3, 5, 7...; 0, or -1 when a prime factor is
 * larger than FFT_MAX_RADIX. */
static int factorize(struct fft_plan *p) {
    int64_t n = p->n;
    p->nfac = 0;
    while (n % 4 == 0) p->fac[p->nfac++] = 4, n /= 4;
    while (n % 2 == 0) p->fac[p->nfac++] = 2, n /= 2;
    for (int r = 3; n > 1 && r <= FFT_MAX_RADIX; r += 2)
        while (n % r == 0) p->fac[p->nfac++] = r, n /= r;
    return n == 1 ? 0 : -1;
}

struct fft_plan *fft_plan_create(int64_t n) {
    if (n < 1 || n > ((int64_t)1 << 30)) return NULL;
    struct fft_plan *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n;
    p->tw = malloc((size_t)n * sizeof *p->tw);
    if (!p->tw) goto fail;
    for (int64_t k = 0; k < n; k++) {
        double a = -two_pi * (double)k / (double)n;
        p->tw[k] = cos(a) + I * sin(a);
    }
    if (factorize(p) == 0) return p;
    p->nfac = 0;
    int64_t m = 1;
    while (m < 2 * n - 1) m <<= 1;
    p->m = m;
    p->sub = fft_plan_create(m);
    p->chirp = malloc((size_t)n * sizeof *p->chirp);
    p->bfft = calloc((size_t)m, sizeof *p->bfft);
    double complex *work = malloc(fft_work_size(p));
    if (!p->sub || !p->chirp || !p->bfft || !work) {
        free(work);
        goto fail;
    }
    for (int64_t k = 0; k < n; k++) {
        /* k^2 mod 2n keeps the angle small, and so exact, for long signals. */
        int64_t k2 = (int64_t)(((unsigned __int128)k * (unsigned __int128)k) % (unsigned __int128)(2 * n));
        double a = -two_pi / 2 * (double)k2 / (double)n;
        p->chirp[k] = cos(a) + I * sin(a);
    }
    p->bfft[0] = conj(p->chirp[0]);
    for (int64_t k = 1; k < n; k++) p->bfft[k] = p->bfft[m - k] = conj(p->chirp[k]);
    fft_run(p->sub, p->bfft, 0, work);
    free(work);
    return p;
fail:
    fft_plan_free(p);
    return NULL;
}

void fft_plan_free(struct fft_plan *p) {
    if (!p) return;
    fft_plan_free(p->sub);
    free(p->tw);
    free(p->chirp);
    free(p->bfft);
    free(p);
}

size_t fft_work_size(const struct fft_plan *p) {
    return (size_t)(p->m ? 2 * p->m : p->n) * sizeof(double complex);
}

/* Decimation in time: out[0..nl) gets the transform of the nl values at
 * in[0], in[stride], ...; nl = n / twstride, the radices left are fac[]. */
static void fft_rec(const struct fft_plan *p, double complex *out, const double complex *in, int64_t stride,
                    const int *fac, int64_t twstride) {
    int r = fac[0];
    int64_t nl = p->n / twstride, m = nl / r;
    if (m == 1) {
        for (int q = 0; q < r; q++) out[q] = in[q * stride];
    } else {
        for (int q = 0; q < r; q++) fft_rec(p, out + q * m, in + q * stride, stride * r, fac + 1, twstride * r);
    }
    const double complex *tw = p->tw;
    if (r == 2) {
        for (int64_t k = 0; k < m; k++) {
            double complex a = out[k], b = cmul(out[m + k], tw[k * twstride]);
            out[k] = a + b;
            out[m + k] = a - b;
        }
        return;
    }
    if (r == 4) {
        for (int64_t k = 0; k < m; k++) {
            double complex a = out[k], b = cmul(out[m + k], tw[k * twstride]),
                           c = cmul(out[2 * m + k], tw[2 * k * twstride]), d = cmul(out[3 * m + k], tw[3 * k * twstride]);
            double complex s0 = a + c, s1 = a - c, s2 = b + d, s3 = CMPLX(cimag(b - d), -creal(b - d)); /* (b - d) * -i */
            out[k] = s0 + s2;
            out[m + k] = s1 + s3;
            out[2 * m + k] = s0 - s2;
            out[3 * m + k] = s1 - s3;
        }
        return;
    }
    double complex t[FFT_MAX_RADIX], wr[FFT_MAX_RADIX];
    for (int j = 0; j < r; j++) wr[j] = tw[j * m * twstride]; /* e^(-2 pi i j/r) */
    for (int64_t k = 0; k < m; k++) {
        for (int q = 0; q < r; q++) t[q] = cmul(out[q * m + k], tw[q * k * twstride]);
        for (int q2 = 0; q2 < r; q2++) {
            double complex s = t[0];
            for (int q = 1, j = q2; q < r; q++, j = j + q2 >= r ? j + q2 - r : j + q2) s += cmul(t[q], wr[j]);
            out[q2 * m + k] = s;
        }
    }
}

static void fft_forward(const struct fft_plan *p, double complex *x, double complex *work) {
    int64_t n = p->n;
    if (n == 1) return;
    if (!p->m) {
        memcpy(work, x, (size_t)n * sizeof *x);
        fft_rec(p, x, work, 1, p->fac, 1);
        return;
    }
    int64_t m = p->m;
    double complex *a = work;
    for (int64_t k = 0; k < n; k++) a[k] = cmul(x[k], p->chirp[k]);
    memset(a + n, 0, (size_t)(m - n) * sizeof *a);
    fft_run(p->sub, a, 0, work + m);
    for (int64_t k = 0; k < m; k++) a[k] = cmul(a[k], p->bfft[k]);
    fft_run(p->sub, a, 1, work + m);
    double scale = 1.0 / (double)m;
    for (int64_t k = 0; k < n; k++) x[k] = cmul(a[k], p->chirp[k]) * scale;
}

void fft_run(const struct fft_plan *p, double complex *x, int inverse, double complex *work) {
    /* The inverse transform is the forward one of the conjugate, conjugated. */
    if (inverse)
        for (int64_t k = 0; k < p->n; k++) x[k] = conj(x[k]);
    fft_forward(p, x, work);
    if (inverse)
        for (int64_t k = 0; k < p->n; k++) x[k] = conj(x[k]);
}
