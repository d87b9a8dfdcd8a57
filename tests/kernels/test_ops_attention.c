/* test_ops_attention.c - the attention family against a plain-C loop of
 * softmax(Q K^T * scale + mask) V written here: ONNX Attention with
 * grouped heads, a past cache, a causal limit, a bool mask shorter than
 * the keys and softcap, in 4-D and 3-D layouts, on 1 and 4 threads;
 * MultiHeadAttention's packed QKV and packed KV against its unpacked
 * form; RotaryEmbedding against the rotation by hand; clear refusals. */
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

static float *F(const struct tensor *t) { return t->data; }

static void expect_close(const float *got, const float *want, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= 1e-5f + 1e-4f * fabsf(want[i])))
            fail_msg("%s: element %lld is %.7g, expected %.7g", what, (long long)i, got[i], want[i]);
}

/* Attention over [B, N, S, D] Q and [B, Nkv, T, D] K, V; keys past
 * mask_len or with mask 0 (when mask is given, [S, mask_len]) are out;
 * causal lets query s see keys up to P + s. */
static void ref_attention(int B, int N, int Nkv, int S, int T, int D, int P, const float *q, const float *k,
                          const float *v, const uint8_t *mask, int mask_len, int causal, float scale, float softcap,
                          float *y) {
    float sc[64];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < N; h++) {
            int kh = h / (N / Nkv);
            for (int s = 0; s < S; s++) {
                const float *qr = q + ((b * N + h) * S + s) * D;
                float mx = -INFINITY, sum = 0;
                for (int t = 0; t < T; t++) {
                    const float *kr = k + ((b * Nkv + kh) * T + t) * D;
                    float d = 0;
                    for (int j = 0; j < D; j++) d += qr[j] * kr[j];
                    d *= scale;
                    if (softcap > 0) d = softcap * tanhf(d / softcap);
                    if (mask && (t >= mask_len || !mask[s * mask_len + t])) d = -INFINITY;
                    if (causal && t > P + s) d = -INFINITY;
                    sc[t] = d;
                    mx = d > mx ? d : mx;
                }
                for (int t = 0; t < T; t++) sum += (sc[t] = expf(sc[t] - mx));
                float *yr = y + ((b * N + h) * S + s) * D;
                for (int j = 0; j < D; j++) {
                    float a = 0;
                    for (int t = 0; t < T; t++) a += sc[t] / sum * v[((b * Nkv + kh) * T + t) * D + j];
                    yr[j] = a;
                }
            }
        }
}

/* [B, N, S, D] -> [B, S, N*D] */
static void to_bsd(const float *x, int B, int N, int S, int D, float *out) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < N; h++)
            for (int s = 0; s < S; s++)
                memcpy(out + ((b * S + s) * N + h) * D, x + ((b * N + h) * S + s) * D, sizeof(float) * (size_t)D);
}

static void test_onnx_attention_gqa_past_causal_mask(void **st) {
    (void)st;
    enum { B = 2, N = 4, NKV = 2, S = 3, L = 3, P = 4, T = P + L, D = 8, ML = 6 };
    struct tensor q = tn_rand_f32(4, (int64_t[]){B, N, S, D}), k = tn_rand_f32(4, (int64_t[]){B, NKV, L, D}),
                  v = tn_rand_f32(4, (int64_t[]){B, NKV, L, D}), pk = tn_rand_f32(4, (int64_t[]){B, NKV, P, D}),
                  pv = tn_rand_f32(4, (int64_t[]){B, NKV, P, D});
    uint8_t m[S * ML];
    for (int i = 0; i < S * ML; i++) m[i] = (i % 5) != 3;
    struct tensor mask = {DT_BOOL, 2, {S, ML}, m};
    for (int threads = 1; threads <= 4; threads += 3)
        for (int causal = 0; causal <= 1; causal++) {
            struct tnode t;
            tn_init(&t, "Attention", 23);
            tn_int(&t, "is_causal", causal);
            tn_float(&t, "softcap", 3.0f);
            tn_float(&t, "scale", 0.4f);
            struct tensor y = {0}, ok = {0}, ov = {0};
            const struct tensor *in[] = {&q, &k, &v, &mask, &pk, &pv};
            struct tensor *out[] = {&y, &ok, &ov};
            assert_int_equal(tn_call(&t.n, in, 6, out, 3, threads), 0);
            assert_int_equal(ok.dims[2], T);
            /* present = past then new, per (batch, head) */
            float kall[B * NKV * T * D], vall[B * NKV * T * D], want[B * N * S * D];
            for (int bh = 0; bh < B * NKV; bh++) {
                memcpy(kall + bh * T * D, F(&pk) + bh * P * D, sizeof(float) * P * D);
                memcpy(kall + bh * T * D + P * D, F(&k) + bh * L * D, sizeof(float) * L * D);
                memcpy(vall + bh * T * D, F(&pv) + bh * P * D, sizeof(float) * P * D);
                memcpy(vall + bh * T * D + P * D, F(&v) + bh * L * D, sizeof(float) * L * D);
            }
            expect_close(F(&ok), kall, B * NKV * T * D, "present_key");
            expect_close(F(&ov), vall, B * NKV * T * D, "present_value");
            ref_attention(B, N, NKV, S, T, D, P, F(&q), kall, vall, m, ML, causal, 0.4f, 3.0f, want);
            expect_close(F(&y), want, B * N * S * D, causal ? "Y causal" : "Y");
            free(y.data), free(ok.data), free(ov.data);
        }
    free(q.data), free(k.data), free(v.data), free(pk.data), free(pv.data);
}

/* 3-D inputs are the 4-D ones with heads folded into the last dim. */
static void test_onnx_attention_3d(void **st) {
    (void)st;
    enum { B = 2, N = 2, S = 5, D = 4 };
    struct tensor q = tn_rand_f32(4, (int64_t[]){B, N, S, D}), k = tn_rand_f32(4, (int64_t[]){B, N, S, D}),
                  v = tn_rand_f32(4, (int64_t[]){B, N, S, D});
    float q3[B * S * N * D], k3[B * S * N * D], v3[B * S * N * D], want[B * N * S * D], want3[B * S * N * D];
    to_bsd(F(&q), B, N, S, D, q3), to_bsd(F(&k), B, N, S, D, k3), to_bsd(F(&v), B, N, S, D, v3);
    struct tensor tq = {DT_FP32, 3, {B, S, N * D}, q3}, tk = {DT_FP32, 3, {B, S, N * D}, k3},
                  tv = {DT_FP32, 3, {B, S, N * D}, v3};
    struct tnode t;
    tn_init(&t, "Attention", 23);
    tn_int(&t, "q_num_heads", N);
    tn_int(&t, "kv_num_heads", N);
    struct tensor y = {0};
    const struct tensor *in[] = {&tq, &tk, &tv};
    struct tensor *out[] = {&y};
    assert_int_equal(tn_call(&t.n, in, 3, out, 1, 2), 0);
    assert_int_equal(y.ndim, 3);
    ref_attention(B, N, N, S, S, D, 0, F(&q), F(&k), F(&v), NULL, 0, 0, 0.5f, 0, want);
    to_bsd(want, B, N, S, D, want3);
    expect_close(F(&y), want3, B * S * N * D, "Y 3-D");
    free(y.data), free(q.data), free(k.data), free(v.data);
}

/* MultiHeadAttention: packed QKV (B, S, N, 3, H) and packed KV (B, L, N,
 * 2, H) give what separate query, key and value give. */
static void test_mha_packed_forms(void **st) {
    (void)st;
    enum { B = 2, S = 4, N = 2, H = 4 };
    struct tensor qkv = tn_rand_f32(5, (int64_t[]){B, S, N, 3, H});
    float q[B * S * N * H], k[B * S * N * H], v[B * S * N * H], kv[B * S * N * 2 * H];
    for (int r = 0; r < B * S * N; r++) {
        memcpy(q + r * H, F(&qkv) + r * 3 * H, sizeof(float) * H);
        memcpy(k + r * H, F(&qkv) + r * 3 * H + H, sizeof(float) * H);
        memcpy(v + r * H, F(&qkv) + r * 3 * H + 2 * H, sizeof(float) * H);
        memcpy(kv + r * 2 * H, k + r * H, sizeof(float) * H);
        memcpy(kv + r * 2 * H + H, v + r * H, sizeof(float) * H);
    }
    struct tensor tq = {DT_FP32, 3, {B, S, N * H}, q}, tk = {DT_FP32, 3, {B, S, N * H}, k},
                  tv = {DT_FP32, 3, {B, S, N * H}, v}, tkv = {DT_FP32, 5, {B, S, N, 2, H}, kv};
    struct tnode t;
    tn_init_domain(&t, "com.microsoft", "MultiHeadAttention", 1);
    tn_int(&t, "num_heads", N);
    tn_int(&t, "unidirectional", 1);
    struct tensor y0 = {0}, y1 = {0}, y2 = {0};
    struct tensor *o0[] = {&y0}, *o1[] = {&y1}, *o2[] = {&y2};
    assert_int_equal(tn_call(&t.n, (const struct tensor *[]){&tq, &tk, &tv}, 3, o0, 1, 2), 0);
    assert_int_equal(tn_call(&t.n, (const struct tensor *[]){&qkv}, 1, o1, 1, 2), 0);
    assert_int_equal(tn_call(&t.n, (const struct tensor *[]){&tq, &tkv}, 2, o2, 1, 2), 0);
    expect_close(F(&y1), F(&y0), B * S * N * H, "packed QKV");
    expect_close(F(&y2), F(&y0), B * S * N * H, "packed KV");
    free(y0.data), free(y1.data), free(y2.data), free(qkv.data);
}

/* ONNX RotaryEmbedding, 4-D, position_ids, half rotation by hand. */
static void test_rotary_embedding(void **st) {
    (void)st;
    enum { B = 1, N = 2, S = 3, D = 6, R = 4, MAXP = 8 };
    struct tensor x = tn_rand_f32(4, (int64_t[]){B, N, S, D}), cs = tn_rand_f32(2, (int64_t[]){MAXP, R / 2}),
                  sn = tn_rand_f32(2, (int64_t[]){MAXP, R / 2});
    int64_t pos[S] = {5, 0, 7};
    struct tensor tp = {DT_INT64, 2, {B, S}, pos};
    for (int inter = 0; inter <= 1; inter++) {
        struct tnode t;
        tn_init(&t, "RotaryEmbedding", 23);
        tn_int(&t, "rotary_embedding_dim", R);
        tn_int(&t, "interleaved", inter);
        struct tensor y = {0};
        struct tensor *out[] = {&y};
        assert_int_equal(tn_call(&t.n, (const struct tensor *[]){&x, &cs, &sn, &tp}, 4, out, 1, 1), 0);
        float want[B * N * S * D];
        for (int h = 0; h < N; h++)
            for (int s = 0; s < S; s++) {
                const float *xr = F(&x) + (h * S + s) * D;
                float *w = want + (h * S + s) * D;
                memcpy(w, xr, sizeof(float) * D);
                for (int i = 0; i < R / 2; i++) {
                    int a = inter ? 2 * i : i, b = inter ? 2 * i + 1 : i + R / 2;
                    float c = F(&cs)[pos[s] * (R / 2) + i], si = F(&sn)[pos[s] * (R / 2) + i];
                    w[a] = xr[a] * c - xr[b] * si;
                    w[b] = xr[a] * si + xr[b] * c;
                }
            }
        expect_close(F(&y), want, B * N * S * D, inter ? "interleaved" : "halves");
        free(y.data);
    }
    free(x.data), free(cs.data), free(sn.data);
}

static void test_refusals(void **st) {
    (void)st;
    struct tensor q = tn_rand_f32(4, (int64_t[]){1, 3, 2, 4}), k = tn_rand_f32(4, (int64_t[]){1, 2, 2, 4});
    struct tensor y = {0};
    struct tensor *out[] = {&y};
    struct tnode t;
    tn_init(&t, "Attention", 23);
    assert_int_not_equal(tn_call(&t.n, (const struct tensor *[]){&q, &k, &k}, 3, out, 1, 1), 0);
    assert_non_null(strstr(g_err, "multiple of kv heads"));
    tn_init(&t, "Attention", 23);
    assert_int_not_equal(tn_call(&t.n, (const struct tensor *[]){&q, &q, &q, NULL, &k}, 5, out, 1, 1), 0);
    assert_non_null(strstr(g_err, "past_key and past_value go together"));
    struct tensor x3 = tn_rand_f32(3, (int64_t[]){1, 2, 6});
    tn_init(&t, "Attention", 23);
    assert_int_not_equal(tn_call(&t.n, (const struct tensor *[]){&x3, &x3, &x3}, 3, out, 1, 1), 0);
    assert_non_null(strstr(g_err, "q_num_heads"));
    tn_init_domain(&t, "com.microsoft", "GroupQueryAttention", 1);
    tn_int(&t, "num_heads", 3);
    tn_int(&t, "kv_num_heads", 2);
    assert_int_not_equal(tn_call(&t.n, (const struct tensor *[]){&x3}, 1, out, 1, 1), 0);
    assert_non_null(strstr(g_err, "multiple of kv_num_heads"));
    free(q.data), free(k.data), free(x3.data);
}

/* kiln.MaskedSoftmax's rows (the exponentials on sigmoid_vec.c's loops with
 * AVX-512 and AVX2): every length from 1 to 40 and a long one, with masked
 * (-inf) keys, scores far apart (e^-200 is 0 in float), a row masked
 * whole and a row holding NaN; against double. */
static void test_masked_softmax_rows(void **st) {
    (void)st;
    int64_t lens[41];
    for (int i = 0; i < 40; i++) lens[i] = i + 1;
    lens[40] = 1500;
    for (int li = 0; li < 41; li++) {
        const int64_t n = lens[li], rows = 4;
        int64_t dims[2] = {rows, n};
        struct tensor x = {DT_FP32, 2, {rows, n}, calloc((size_t)(rows * n), sizeof(float))}, y = {0};
        (void)dims;
        float *xv = F(&x);
        for (int64_t i = 0; i < rows * n; i++) xv[i] = 6.0f * tn_frand();
        for (int64_t j = 0; j < n; j += 3) xv[j] = -INFINITY;           /* row 0: every third key masked */
        if (n > 1) xv[n + n / 2] = 200.0f;                             /* row 1: one score far above */
        for (int64_t j = 0; j < n; j++) xv[2 * n + j] = -INFINITY;     /* row 2: all masked */
        xv[3 * n + n / 3] = NAN;                                       /* row 3: NaN */
        struct tnode tn;
        tn_init_domain(&tn, "kiln", "MaskedSoftmax", 1);
        tn_float(&tn, "scale", 0.5f);
        const struct tensor *in[1] = {&x};
        struct tensor *out[1] = {&y};
        assert_int_equal(tn_call(&tn.n, in, 1, out, 1, 1), 0);
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = xv + r * n, *yr = F(&y) + r * n;
            double mx = -INFINITY, sum = 0;
            int nan = 0;
            for (int64_t j = 0; j < n; j++) mx = fmax(mx, 0.5 * xr[j]), nan |= isnan(xr[j]);
            for (int64_t j = 0; j < n; j++) sum += exp(0.5 * xr[j] - mx);
            for (int64_t j = 0; j < n; j++) {
                if (nan || mx == -INFINITY) { /* all masked or NaN: NaN as the unfused ops give */
                    if (!isnan(yr[j])) fail_msg("length %lld row %lld: %g, want NaN", (long long)n, (long long)r, yr[j]);
                    continue;
                }
                double want = exp(0.5 * xr[j] - mx) / sum;
                if (!(fabs(yr[j] - want) <= 1e-6 * want + 1e-37))
                    fail_msg("length %lld row %lld key %lld: %.9g, want %.9g", (long long)n, (long long)r,
                             (long long)j, yr[j], want);
            }
        }
        free(x.data);
        free(y.data);
    }
}

int main(void) {
    g_run_without_attrs = 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_onnx_attention_gqa_past_causal_mask),
        cmocka_unit_test(test_onnx_attention_3d),
        cmocka_unit_test(test_mha_packed_forms),
        cmocka_unit_test(test_rotary_embedding),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_masked_softmax_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
