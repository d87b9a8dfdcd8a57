/* fft.h - complex discrete Fourier transforms of any length, in double
 * precision, for the signal operators (DFT, STFT).
 *
 * A plan is made once per length (in an op's prepare) and is read-only
 * afterwards, so several threads may run one plan at once, each with its
 * own work buffer. Lengths whose prime factors are all small run as a
 * mixed-radix Cooley-Tukey transform (radix 4, 2, 3, 5 and any prime up to
 * FFT_MAX_RADIX); a length with a larger prime factor runs through
 * Bluestein's algorithm on a power-of-two transform, so every length costs
 * O(n log n).
 *
 * Written here rather than taken from FFTW (Debian's libfftw3), measured on
 * one core of an x86-64 machine, double precision, one transform at a time:
 *
 *     n       256   400 (Whisper)  401 (prime)   512   1024   4096
 *     kiln    1.3   4.6 us         15 us         3.9   6.5    31 us
 *     FFTW    0.34  0.58 us        6.2 us        0.73  1.7    8.8 us
 *
 * FFTW is 4 to 8 times faster on the transform itself, but in a log-mel
 * front end the transform is a small part of the work (30 s of Whisper
 * audio is 3000 frames of 400 points: about 14 ms here, spread over the
 * op's threads, against the mel projection and the model behind it), so
 * the dependency does not pay yet. */
#ifndef KILN_CPU_FFT_H
#define KILN_CPU_FFT_H

#include <complex.h>
#include <stddef.h>
#include <stdint.h>

#define FFT_MAX_RADIX 61 /* larger prime factors go through Bluestein */

struct fft_plan;

/* A plan for transforms of length n (n >= 1); NULL when out of memory or n
 * is out of range. */
struct fft_plan *fft_plan_create(int64_t n);
/* NULL is a no-op. */
void fft_plan_free(struct fft_plan *p);
/* Bytes of work buffer one fft_run needs (aligned for double complex). */
size_t fft_work_size(const struct fft_plan *p);
/* Transforms the n values at x in place: X[k] = sum_j x[j] e^(-2 pi i jk/n),
 * or with inverse set e^(+2 pi i jk/n), unscaled either way. */
void fft_run(const struct fft_plan *p, double complex *x, int inverse, double complex *work);

#endif
