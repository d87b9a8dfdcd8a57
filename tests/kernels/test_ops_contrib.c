/* test_ops_contrib.c - onnxruntime's contrib operators (com.microsoft)
 * against loops written here: SkipLayerNormalization with a skip that
 * repeats over the batch and its statistics outputs, MatMulNBits' packed
 * 4-bit weights with packed zero points and a partial last block, QGemm
 * with transposed A; and their refusals. onnxruntime itself is the
 * reference of tests/e2e/test_contrib_ops.py. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/ops.h"
#include "tests/kernels/harness.h"

static void expect_near(float got, float want, const char *what, int i) {
    if (!(fabsf(got - want) <= 1e-4f + 1e-4f * fabsf(want)))
        fail_msg("%s: element %d is %.7g, expected %.7g", what, i, got, want);
}

/* input [2, 3, 8] + skip [3, 8] (+ bias), normalized per row of 8. */
static void test_skip_layer_norm_broadcast_skip(void **st) {
    (void)st;
    enum { B = 2, S = 3, H = 8 };
    struct tensor x = tn_rand_f32(3, (int64_t[]){B, S, H}), skip = tn_rand_f32(2, (int64_t[]){S, H});
    struct tensor gamma = tn_rand_f32(1, (int64_t[]){H}), beta = tn_rand_f32(1, (int64_t[]){H});
    struct tensor bias = tn_rand_f32(1, (int64_t[]){H});
    struct tensor y = {0}, mean = {0}, inv = {0}, sum = {0};
    struct tnode tn;
    tn_init_domain(&tn, "com.microsoft", "SkipLayerNormalization", 1);
    tn_float(&tn, "epsilon", 1e-5f);
    const struct tensor *in[5] = {&x, &skip, &gamma, &beta, &bias};
    struct tensor *out[4] = {&y, &mean, &inv, &sum};
    assert_int_equal(tn_call(&tn.n, in, 5, out, 4, 2), 0);
    assert_int_equal(mean.ndim, 3);
    assert_int_equal(mean.dims[2], 1);
    const float *xp = x.data, *sp = skip.data, *g = gamma.data, *be = beta.data, *bi = bias.data;
    for (int r = 0; r < B * S; r++) {
        double v[H], mu = 0, var = 0;
        for (int j = 0; j < H; j++) {
            v[j] = (double)xp[r * H + j] + sp[(r % S) * H + j] + bi[j];
            mu += v[j] / H;
        }
        for (int j = 0; j < H; j++) var += (v[j] - mu) * (v[j] - mu) / H;
        double is = 1 / sqrt(var + 1e-5);
        expect_near(((float *)mean.data)[r], (float)mu, "mean", r);
        expect_near(((float *)inv.data)[r], (float)is, "inv_std_var", r);
        for (int j = 0; j < H; j++) {
            expect_near(((float *)sum.data)[r * H + j], (float)v[j], "sum", r * H + j);
            expect_near(((float *)y.data)[r * H + j], (float)((v[j] - mu) * is * g[j] + be[j]), "y", r * H + j);
        }
    }
    free(x.data), free(skip.data), free(gamma.data), free(beta.data), free(bias.data);
    free(y.data), free(mean.data), free(inv.data), free(sum.data);
}

/* K = 24 in blocks of 16 (the second one half full), N = 3, 4 bits. */
static void test_matmul_nbits_4bit(void **st) {
    (void)st;
    enum { M = 2, K = 24, N = 3, BLK = 16, BLOCKS = 2 };
    struct tensor a = tn_rand_f32(2, (int64_t[]){M, K}), y = {0};
    uint8_t q[N][BLOCKS][BLK], packed[N * BLOCKS * BLK / 2], zps[N] = {0};
    float scales[N * BLOCKS];
    int zp[N][BLOCKS];
    for (int n = 0; n < N; n++)
        for (int b = 0; b < BLOCKS; b++) {
            scales[n * BLOCKS + b] = 0.01f * (float)(1 + n + 3 * b);
            zp[n][b] = (n * 5 + b * 3 + 1) % 16;
            zps[n] |= (uint8_t)(zp[n][b] << (4 * b));
            for (int j = 0; j < BLK; j++) q[n][b][j] = (uint8_t)((n * 7 + b * 11 + j * 3) % 16);
        }
    for (int i = 0; i < N * BLOCKS * BLK / 2; i++) {
        const uint8_t *f = &q[0][0][0];
        packed[i] = (uint8_t)(f[2 * i] | f[2 * i + 1] << 4);
    }
    struct tensor tb = {DT_UINT8, 3, {N, BLOCKS, BLK / 2}, packed}, ts = {DT_FP32, 1, {N * BLOCKS}, scales};
    struct tensor tz = {DT_UINT8, 1, {N}, zps};
    struct tnode tn;
    tn_init_domain(&tn, "com.microsoft", "MatMulNBits", 1);
    tn_int(&tn, "K", K), tn_int(&tn, "N", N), tn_int(&tn, "bits", 4), tn_int(&tn, "block_size", BLK);
    const struct tensor *in[4] = {&a, &tb, &ts, &tz};
    struct tensor *out[1] = {&y};
    assert_int_equal(tn_call(&tn.n, in, 4, out, 1, 1), 0);
    assert_int_equal(y.ndim, 2);
    assert_int_equal(y.dims[1], N);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double want = 0;
            for (int k = 0; k < K; k++)
                want += ((float *)a.data)[m * K + k] * ((double)q[n][k / BLK][k % BLK] - zp[n][k / BLK]) *
                        scales[n * BLOCKS + k / BLK];
            expect_near(((float *)y.data)[m * N + n], (float)want, "MatMulNBits", m * N + n);
        }
    free(a.data), free(y.data);
}

/* QGemm, A stored transposed, per-column B scales, int32 C, float output. */
static void test_qgemm_trans_a(void **st) {
    (void)st;
    enum { M = 3, K = 5, N = 4 };
    uint8_t at[K * M];
    int8_t b[K * N];
    int32_t cb[N];
    float bs[N];
    for (int i = 0; i < K * M; i++) at[i] = (uint8_t)(i * 37 % 256);
    for (int i = 0; i < K * N; i++) b[i] = (int8_t)(i * 29 % 255 - 127);
    for (int j = 0; j < N; j++) cb[j] = 100 * j - 150, bs[j] = 0.01f * (float)(j + 1);
    float as = 0.02f;
    uint8_t az = 120;
    int8_t bz = 0;
    struct tensor ta = {DT_UINT8, 2, {K, M}, at}, tas = {DT_FP32, 0, {0}, &as}, taz = {DT_UINT8, 0, {0}, &az};
    struct tensor tb = {DT_INT8, 2, {K, N}, b}, tbs = {DT_FP32, 1, {N}, bs}, tbz = {DT_INT8, 0, {0}, &bz};
    struct tensor tc = {DT_INT32, 1, {N}, cb}, y = {0};
    struct tnode tn;
    tn_init_domain(&tn, "com.microsoft", "QGemm", 1);
    tn_int(&tn, "transA", 1);
    tn_float(&tn, "alpha", 0.5f);
    const struct tensor *in[7] = {&ta, &tas, &taz, &tb, &tbs, &tbz, &tc};
    struct tensor *out[1] = {&y};
    assert_int_equal(tn_call(&tn.n, in, 7, out, 1, 1), 0);
    assert_int_equal(y.dtype, DT_FP32);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            int32_t acc = cb[n];
            for (int k = 0; k < K; k++) acc += ((int32_t)at[k * M + m] - az) * (int32_t)b[k * N + n];
            expect_near(((float *)y.data)[m * N + n], (float)acc * 0.5f * as * bs[n], "QGemm", m * N + n);
        }
    free(y.data);
}

static void expect_refusal(const char *op, int (*setup)(struct tnode *), const struct tensor *const *in, int nin,
                           const char *words) {
    struct tnode tn;
    tn_init_domain(&tn, "com.microsoft", op, 1);
    if (setup) setup(&tn);
    struct tensor y = {0};
    struct tensor *out[1] = {&y};
    assert_int_not_equal(tn_call(&tn.n, in, nin, out, 1, 1), 0);
    if (!strstr(g_err, words)) fail_msg("%s: '%s' does not say '%s'", op, g_err, words);
    free(y.data);
}

static int three_bits(struct tnode *t) {
    tn_int(t, "K", 16), tn_int(t, "N", 2), tn_int(t, "bits", 3), tn_int(t, "block_size", 16);
    return 0;
}

static void test_refusals(void **st) {
    (void)st;
    struct tensor x = tn_rand_f32(2, (int64_t[]){2, 16}), g7 = tn_rand_f32(1, (int64_t[]){7});
    struct tensor b = {DT_UINT8, 3, {2, 1, 8}, calloc(1, 16)}, s = tn_rand_f32(1, (int64_t[]){2});
    const struct tensor *nb[3] = {&x, &b, &s};
    expect_refusal("MatMulNBits", three_bits, nb, 3, "bits=3 is not supported");
    const struct tensor *ln[3] = {&x, &x, &g7};
    expect_refusal("SkipLayerNormalization", NULL, ln, 3, "gamma has 7 values; it must have 16");
    struct tensor ids = {DT_INT32, 2, {2, 16}, calloc(32, 4)};
    const struct tensor *emb[4] = {&ids, NULL, &x, &g7};
    expect_refusal("EmbedLayerNormalization", NULL, emb, 4, "position_embedding must be a 2-D table of rows of 16");
    const struct tensor *qc[4] = {&s, &s, &b, &s};
    expect_refusal("QLinearConcat", NULL, qc, 4, "needs Y_scale, Y_zero_point and triples");
    free(x.data), free(g7.data), free(b.data), free(s.data), free(ids.data);
}

int main(void) {
    g_run_without_attrs = 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_skip_layer_norm_broadcast_skip),
        cmocka_unit_test(test_matmul_nbits_4bit),
        cmocka_unit_test(test_qgemm_trans_a),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
