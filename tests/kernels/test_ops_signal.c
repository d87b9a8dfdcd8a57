/* test_ops_signal.c - the FFT against a plain O(n^2) DFT on power-of-two,
 * mixed-radix and prime (Bluestein) lengths, forward and inverse; DFT's
 * rfft -> irfft round trip and its padding; STFT against frames
 * transformed one by one; the windows' textbook values; MelWeightMatrix's
 * filters summing to a triangle; and the messages for bad arguments. */
#include <complex.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/fft.h"
#include "kernels/ops.h"
#include "tests/kernels/harness.h"

#define F(t) ((float *)(t).data)

static void naive_dft(const double complex *x, double complex *y, int64_t n, int inverse) {
    for (int64_t k = 0; k < n; k++) {
        double complex s = 0;
        for (int64_t j = 0; j < n; j++) {
            double a = (inverse ? 2 : -2) * M_PI * (double)((j * k) % n) / (double)n;
            s += x[j] * (cos(a) + I * sin(a));
        }
        y[k] = s;
    }
}

static void test_fft_lengths(void **st) {
    (void)st;
    /* 1, powers of two, radices 3/5/7, Whisper's 400 = 2^4 5^2, primes
     * above FFT_MAX_RADIX (Bluestein) and a composite with one (2 * 67). */
    const int64_t lengths[] = {1, 2, 3, 4, 5, 7, 8, 12, 30, 49, 64, 97, 128, 134, 400, 401, 512};
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        int64_t n = lengths[li];
        struct fft_plan *p = fft_plan_create(n);
        assert_non_null(p);
        double complex *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y),
                       *want = malloc((size_t)n * sizeof *want), *work = malloc(fft_work_size(p));
        for (int inverse = 0; inverse < 2; inverse++) {
            double scale = 0;
            for (int64_t k = 0; k < n; k++) {
                x[k] = tn_frand() + I * tn_frand();
                y[k] = x[k];
            }
            naive_dft(x, want, n, inverse);
            fft_run(p, y, inverse, work);
            for (int64_t k = 0; k < n; k++) scale = fmax(scale, cabs(want[k]));
            for (int64_t k = 0; k < n; k++)
                if (cabs(y[k] - want[k]) > 1e-10 * (scale + 1))
                    fail_msg("n=%lld inverse=%d bin %lld: %g%+gi, want %g%+gi", (long long)n, inverse, (long long)k,
                             creal(y[k]), cimag(y[k]), creal(want[k]), cimag(want[k]));
        }
        free(x);
        free(y);
        free(want);
        free(work);
        fft_plan_free(p);
    }
    assert_null(fft_plan_create(0));
}

/* rfft of a real [2, 10, 1] signal along axis 1, then irfft back. */
static void test_dft_rfft_irfft_round_trip(void **st) {
    (void)st;
    int64_t dims[3] = {2, 10, 1};
    struct tensor X = tn_rand_f32(3, dims), Y = {0}, Z = {0};
    struct tnode fwd, inv;
    tn_init(&fwd, "DFT", 20);
    tn_int(&fwd, "onesided", 1);
    const struct tensor *in[1] = {&X};
    struct tensor *out[1] = {&Y};
    assert_int_equal(tn_call(&fwd.n, in, 1, out, 1, 2), 0);
    assert_int_equal(Y.ndim, 3);
    assert_int_equal(Y.dims[1], 6);
    assert_int_equal(Y.dims[2], 2);
    /* Bin 0 is the sum; its imaginary part is 0. */
    for (int b = 0; b < 2; b++) {
        double sum = 0;
        for (int k = 0; k < 10; k++) sum += F(X)[b * 10 + k];
        assert_float_equal(F(Y)[b * 12], sum, 1e-5);
        assert_float_equal(F(Y)[b * 12 + 1], 0, 1e-5);
    }
    tn_init(&inv, "DFT", 20);
    tn_int(&inv, "onesided", 1);
    tn_int(&inv, "inverse", 1);
    const struct tensor *in2[1] = {&Y};
    struct tensor *out2[1] = {&Z};
    assert_int_equal(tn_call(&inv.n, in2, 1, out2, 1, 1), 0);
    assert_int_equal(Z.dims[1], 10);
    assert_int_equal(Z.dims[2], 1);
    for (int k = 0; k < 20; k++) assert_float_equal(F(Z)[k], F(X)[k], 1e-5);
    free(X.data);
    free(Y.data);
    free(Z.data);
}

/* dft_length longer than the signal pads with zeros: a 3-point signal
 * transformed at length 4 (opset 17, axis attribute). */
static void test_dft_padding_and_axis(void **st) {
    (void)st;
    float x[3] = {1, 2, 3};
    int64_t len = 4;
    struct tensor X = {DT_FP32, 3, {1, 3, 1}, x}, L = {DT_INT64, 0, {0}, &len}, Y = {0};
    struct tnode tn;
    tn_init(&tn, "DFT", 17);
    tn_int(&tn, "axis", 1);
    const struct tensor *in[2] = {&X, &L};
    struct tensor *out[1] = {&Y};
    assert_int_equal(tn_call(&tn.n, in, 2, out, 1, 1), 0);
    assert_int_equal(Y.dims[1], 4);
    /* X[k] = 1 + 2 w^k + 3 w^2k, w = -i: [6, -2-2i, 2, -2+2i] */
    const float want[8] = {6, 0, -2, -2, 2, 0, -2, 2};
    for (int k = 0; k < 8; k++) assert_float_equal(F(Y)[k], want[k], 1e-5);
    free(Y.data);
    /* The last axis holds the real and imaginary parts: it is no signal axis. */
    tn_init(&tn, "DFT", 17);
    tn_int(&tn, "axis", 2);
    tn_expect_error(&tn.n, in, 1, out, 1, "axis 2 is out of range");
}

/* STFT with a Hann window equals the DFT of each windowed frame. */
static void test_stft_matches_frames(void **st) {
    (void)st;
    enum { LEN = 40, FRAME = 16, STEP = 8 };
    int64_t dims[3] = {1, LEN, 1}, step = STEP;
    struct tensor X = tn_rand_f32(3, dims), S = {DT_INT64, 0, {0}, &step}, W = {0}, Y = {0};
    int64_t size = FRAME;
    struct tensor N = {DT_INT64, 0, {0}, &size};
    struct tnode win, stft;
    tn_init(&win, "HannWindow", 17);
    const struct tensor *win_in[1] = {&N};
    struct tensor *win_out[1] = {&W};
    assert_int_equal(tn_call(&win.n, win_in, 1, win_out, 1, 1), 0);
    tn_init(&stft, "STFT", 17);
    const struct tensor *in[3] = {&X, &S, &W};
    struct tensor *out[1] = {&Y};
    assert_int_equal(tn_call(&stft.n, in, 3, out, 1, 2), 0);
    int64_t frames = 1 + (LEN - FRAME) / STEP, bins = FRAME / 2 + 1;
    assert_int_equal(Y.dims[1], frames);
    assert_int_equal(Y.dims[2], bins);
    for (int64_t f = 0; f < frames; f++) {
        double complex fr[FRAME], want[FRAME];
        for (int k = 0; k < FRAME; k++) fr[k] = F(X)[f * STEP + k] * F(W)[k];
        naive_dft(fr, want, FRAME, 0);
        for (int64_t k = 0; k < bins; k++) {
            assert_float_equal(F(Y)[(f * bins + k) * 2], creal(want[k]), 1e-5);
            assert_float_equal(F(Y)[(f * bins + k) * 2 + 1], cimag(want[k]), 1e-5);
        }
    }
    free(X.data);
    free(W.data);
    free(Y.data);
}

static void test_windows(void **st) {
    (void)st;
    int64_t size = 4;
    struct tensor N = {DT_INT64, 0, {0}, &size}, W = {0};
    const struct tensor *in[1] = {&N};
    struct tensor *out[1] = {&W};
    struct tnode tn;
    /* Periodic Hann of 4: 0.5 - 0.5 cos(pi k / 2). */
    tn_init(&tn, "HannWindow", 17);
    assert_int_equal(tn_call(&tn.n, in, 1, out, 1, 1), 0);
    const float hann[4] = {0, 0.5f, 1, 0.5f};
    for (int k = 0; k < 4; k++) assert_float_equal(F(W)[k], hann[k], 1e-6);
    free(W.data);
    /* Symmetric Blackman of 4 as double: ends 0.42 - 0.5 + 0.08 = 0. */
    tn_init(&tn, "BlackmanWindow", 17);
    tn_int(&tn, "periodic", 0);
    tn_int(&tn, "output_datatype", DT_FP64);
    assert_int_equal(tn_call(&tn.n, in, 1, out, 1, 1), 0);
    assert_int_equal(W.dtype, DT_FP64);
    assert_float_equal(((double *)W.data)[0], 0, 1e-12);
    assert_float_equal(((double *)W.data)[1], 0.42 - 0.5 * cos(2 * M_PI / 3) + 0.08 * cos(4 * M_PI / 3), 1e-12);
    assert_float_equal(((double *)W.data)[3], 0, 1e-12);
    free(W.data);
    /* Hamming's 25/46 and 21/46 at k = 0. */
    tn_init(&tn, "HammingWindow", 17);
    assert_int_equal(tn_call(&tn.n, in, 1, out, 1, 1), 0);
    assert_float_equal(F(W)[0], 4.0 / 46.0, 1e-6);
    free(W.data);
}

static void test_mel_weight_matrix(void **st) {
    (void)st;
    int64_t bins = 8, dft = 64, rate = 16000;
    float lo = 0, hi = 8000;
    struct tensor B = {DT_INT64, 0, {0}, &bins}, D = {DT_INT64, 0, {0}, &dft}, R = {DT_INT64, 0, {0}, &rate},
                  L = {DT_FP32, 0, {0}, &lo}, H = {DT_FP32, 0, {0}, &hi}, Y = {0};
    const struct tensor *in[5] = {&B, &D, &R, &L, &H};
    struct tensor *out[1] = {&Y};
    struct tnode tn;
    tn_init(&tn, "MelWeightMatrix", 17);
    assert_int_equal(tn_call(&tn.n, in, 5, out, 1, 1), 0);
    assert_int_equal(Y.dims[0], 33);
    assert_int_equal(Y.dims[1], 8);
    /* Each filter is a triangle: it rises to a peak of 1 and falls; all
     * weights lie in [0, 1]. */
    for (int m = 0; m < 8; m++) {
        float peak = 0;
        for (int k = 0; k < 33; k++) {
            float v = F(Y)[k * 8 + m];
            assert_true(v >= 0 && v <= 1);
            peak = fmaxf(peak, v);
        }
        assert_float_equal(peak, 1, 1e-6);
    }
    free(Y.data);
    /* An upper edge beyond the sample rate falls outside the DFT's bins. */
    hi = 20000;
    tn_expect_error(&tn.n, in, 5, out, 1, "outside the 33 bins");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fft_lengths),         cmocka_unit_test(test_dft_rfft_irfft_round_trip),
        cmocka_unit_test(test_dft_padding_and_axis), cmocka_unit_test(test_stft_matches_frames),
        cmocka_unit_test(test_windows),             cmocka_unit_test(test_mel_weight_matrix),
    };
    g_run_without_attrs = 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
