/* sigmoid_vec.h - the activations built on the logistic function, over
 * rows of floats with AVX-512 or AVX2: Sigmoid, SiLU and Swish (x times
 * sigmoid(a x), also onnxruntime's QuickGelu), GELU in its tanh form (x
 * times sigmoid(2u)) and in its erf form; and a softmax row's exponentials
 * (the attention kernels). Private to kernels/cpu/.
 *
 * Why not the plain C loops of ops_elementwise.c: their division
 * (1 / (1 + e^-x), erf's p / q) and the exponential's overflow handling
 * left them bound on the divider, which the wide vectors share: SiLU took
 * 0.58 ns a value with AVX-512 on an AMD EPYC (Zen 4), a quarter of
 * EfficientNet-B0's time. Here the quotient is the CPU's reciprocal
 * estimate and one Newton step, the exponential only ever sees -|x| (no
 * overflow: sigmoid(x) is 1 / (1 + e^-|x|) for x >= 0 and e^-|x| times
 * that below), and results below the normal floats (e^-|x| under 1.2e-38)
 * are 0. Within 2 ulp of the exact functions above that (the erf form: of
 * the rational approximation's 5e-7); NaN propagates. The tail of a row runs through
 * the same vector code (masked, or through a padded copy), so a value's
 * result does not depend on where it stands in the row.
 *
 * No state; any thread. */
#ifndef KILN_CPU_SIGMOID_VEC_H
#define KILN_CPU_SIGMOID_VEC_H

#include <stdint.h>

enum sigmoid_vec_kind {
    SIGV_SIGMOID,   /* sigmoid(a v) */
    SIGV_SWISH,     /* v sigmoid(a v): SiLU with a = 1, QuickGelu */
    SIGV_GELU_TANH, /* v sigmoid(1.5957691 (v + 0.044715 v^3)), GELU's tanh form */
    SIGV_GELU_ERF,  /* 0.5 v (1 + erf(v / sqrt(2))) */
};

/* y[i] = f(v) with v = x[i] + (bias ? bias[i] : 0), for i in [0, n); y
 * may be x. Returns 0 when this CPU's ISA (dnnl_util_isa_level, so
 * ONEDNN_MAX_CPU_ISA caps it) has no vector form here and nothing was
 * written: the caller then runs its plain loop. */
int sigmoid_vec(enum sigmoid_vec_kind k, float a, const float *x, const float *bias, float *y, int64_t n);

/* A softmax's exponentials on the same loops: row[i] = e^(row[i] - shift)
 * for i in [0, n), shift at least the row's largest value (every argument
 * <= 0; 0 below the normal floats; NaN stays); returns their sum. Where
 * sigmoid_vec has no vector form, elementwise_util.h's ew_exp_neg_f in a
 * plain loop. */
float exp_shift_sum(float *row, int64_t n, float shift);

#endif
