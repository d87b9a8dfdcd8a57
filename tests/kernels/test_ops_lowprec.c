/* test_ops_lowprec.c - float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ), float4e2m1
 * and the 4- and 2-bit integers (and float8e8m0 by its rounding modes): the
 * conversions bit for bit against a
 * brute-force reference written here from the formats' definitions (every
 * float16 value and a million random floats, so every tie, subnormal and
 * overflow boundary is crossed), ONNX's packing, and Cast, QuantizeLinear
 * and DequantizeLinear through their op table entries at the edges: NaN,
 * inf, saturate on and off, wrap-around, zero points, blocks. */
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

/* ---- the reference: each format from its definition ------------------- */

struct fmt {
    enum dtype dt;
    int ebits, mbits, bias;
    int maxcode;     /* code of the largest finite value */
    int fnuz, ieee;  /* NaN is 0x80 (no -0) / exponent all ones is inf or NaN */
};

static const struct fmt g_fmts[] = {
    {DT_FP8E4M3FN, 4, 3, 7, 0x7E, 0, 0},   {DT_FP8E4M3FNUZ, 4, 3, 8, 0x7F, 1, 0},
    {DT_FP8E5M2, 5, 2, 15, 0x7B, 0, 1},    {DT_FP8E5M2FNUZ, 5, 2, 16, 0x7F, 1, 0},
    {DT_FP4E2M1, 2, 1, 1, 0x7, 0, 0},
};
#define NFMTS ((int)(sizeof g_fmts / sizeof g_fmts[0]))

/* Value of a non-negative finite code: (2^M + m) * 2^(e - bias - M), or
 * m * 2^(1 - bias - M) for e = 0. */
static double ref_value(const struct fmt *f, int code) {
    int e = code >> f->mbits, m = code & ((1 << f->mbits) - 1);
    return e ? (double)((1 << f->mbits) + m) * pow(2.0, e - f->bias - f->mbits)
             : (double)m * pow(2.0, 1 - f->bias - f->mbits);
}

static int ref_is_nan(const struct fmt *f, int code) {
    int sbit = 1 << (f->ebits + f->mbits);
    if (f->dt == DT_FP4E2M1) return 0;
    if (f->fnuz) return code == 0x80;
    if (f->ieee) return (code & (sbit - 1)) > (((1 << f->ebits) - 1) << f->mbits);
    return (code & (sbit - 1)) == sbit - 1;
}

/* The code nearest to x (ties to the even code); one past the largest
 * finite code stands for "overflow" with the value the next binade step
 * would give, so that a tie at the top rounds as the format's bits would. */
static int ref_encode(const struct fmt *f, double x, int saturate) {
    const int sbit = 1 << (f->ebits + f->mbits);
    const int sign = signbit(x) ? sbit : 0;
    if (isnan(x)) return -1; /* checked apart */
    double a = fabs(x), best = INFINITY;
    const double top = ref_value(f, f->maxcode) + (ref_value(f, f->maxcode) - ref_value(f, f->maxcode - 1));
    int bc = f->maxcode + 1; /* beyond top (inf included): overflow */
    for (int c = 0; c <= f->maxcode + 1 && a <= top; c++) {
        double v = c <= f->maxcode ? ref_value(f, c) : top, d = fabs(a - v);
        if (d < best || (d == best && !(c & 1))) {
            best = d;
            bc = c;
        }
    }
    if (bc > f->maxcode) {
        if (saturate || f->dt == DT_FP4E2M1) return sign | f->maxcode;
        if (f->ieee) return sign | (((1 << f->ebits) - 1) << f->mbits);
        return f->fnuz ? 0x80 : sign | (sbit - 1);
    }
    if (f->fnuz && bc == 0) return 0;
    return sign | bc;
}

static void check_one(const struct fmt *f, double x) {
    for (int sat = 0; sat <= 1; sat++) {
        int got = fp8_from_double(x, f->dt, sat);
        if (isnan(x)) {
            if (f->dt == DT_FP4E2M1) {
                if ((got & 7) != 0) fail_msg("%s: NaN gave 0x%x, not a zero", dtype_name(f->dt), got);
            } else if (!ref_is_nan(f, got)) {
                fail_msg("%s: NaN gave 0x%x", dtype_name(f->dt), got);
            }
            continue;
        }
        int want = ref_encode(f, x, sat);
        if (got != want)
            fail_msg("%s saturate=%d: %.17g gave 0x%02x, expected 0x%02x", dtype_name(f->dt), sat, x, got, want);
    }
}

/* ---- conversions -------------------------------------------------------- */

static void test_decode_every_code(void **state) {
    (void)state;
    for (int k = 0; k < NFMTS; k++) {
        const struct fmt *f = &g_fmts[k];
        const int sbit = 1 << (f->ebits + f->mbits);
        for (int c = 0; c < 2 * sbit; c++) {
            float v = fp8_to_fp32((uint8_t)c, f->dt);
            if (ref_is_nan(f, c)) {
                assert_true(isnan(v));
                continue;
            }
            int mag = c & (sbit - 1);
            if (f->ieee && mag == ((1 << f->ebits) - 1) << f->mbits) {
                assert_true(isinf(v) && (v < 0) == ((c & sbit) != 0));
                continue;
            }
            double want = ref_value(f, mag) * ((c & sbit) ? -1 : 1);
            if ((double)v != want || !!signbit(v) != ((c & sbit) != 0))
                fail_msg("%s: code 0x%02x gave %.9g, expected %.9g", dtype_name(f->dt), c, v, want);
            /* every finite code comes back from its own value, both ways */
            if (!(f->fnuz && c == sbit)) {
                assert_int_equal(fp8_from_double(v, f->dt, 1), c);
                assert_int_equal(fp8_from_double(v, f->dt, 0), c);
            }
        }
    }
}

/* Every float16 value: all ties, subnormals and boundaries of every format. */
static void test_encode_every_half(void **state) {
    (void)state;
    for (int k = 0; k < NFMTS; k++)
        for (uint32_t h = 0; h < 0x10000; h++) check_one(&g_fmts[k], fp16_to_fp32((uint16_t)h));
}

/* Random floats across the whole exponent range: one rounding from float32
 * (no detour through a narrower type). */
static void test_encode_random_floats(void **state) {
    (void)state;
    uint64_t r = 0x243f6a8885a308d3ull;
    for (int i = 0; i < 1000000; i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        uint32_t bits = (uint32_t)r;
        /* half of them near the formats' range (exponent -20..20) */
        if (i & 1) bits = (bits & 0x807FFFFFu) | ((uint32_t)(107 + (r >> 40) % 41) << 23);
        float x;
        memcpy(&x, &bits, sizeof x);
        check_one(&g_fmts[i % NFMTS], x);
    }
}

/* The edges by name, as ONNX's Cast table states them. */
static void test_encode_edges(void **state) {
    (void)state;
    /* E4M3FN: 464 is the tie between 448 (even) and the NaN code; 465 overflows */
    assert_int_equal(fp8_from_double(464, DT_FP8E4M3FN, 0), 0x7E);
    assert_int_equal(fp8_from_double(465, DT_FP8E4M3FN, 0), 0x7F);
    assert_int_equal(fp8_from_double(465, DT_FP8E4M3FN, 1), 0x7E);
    assert_int_equal(fp8_from_double(-INFINITY, DT_FP8E4M3FN, 1), 0xFE);
    assert_int_equal(fp8_from_double(-INFINITY, DT_FP8E4M3FN, 0), 0xFF); /* -NaN */
    assert_int_equal(fp8_from_double(-0.0, DT_FP8E4M3FN, 1), 0x80);
    /* smallest subnormal 2^-9; half of it ties to 0, one and a half to 2^-8 */
    assert_int_equal(fp8_from_double(ldexp(1, -9), DT_FP8E4M3FN, 1), 0x01);
    assert_int_equal(fp8_from_double(ldexp(1, -10), DT_FP8E4M3FN, 1), 0x00);
    assert_int_equal(fp8_from_double(ldexp(3, -10), DT_FP8E4M3FN, 1), 0x02);
    /* E4M3FNUZ: no -0, one NaN, 248 overflows */
    assert_int_equal(fp8_from_double(-0.0, DT_FP8E4M3FNUZ, 1), 0x00);
    assert_int_equal(fp8_from_double(-1e-30, DT_FP8E4M3FNUZ, 0), 0x00);
    assert_int_equal(fp8_from_double(NAN, DT_FP8E4M3FNUZ, 1), 0x80);
    assert_int_equal(fp8_from_double(248, DT_FP8E4M3FNUZ, 0), 0x80);
    assert_int_equal(fp8_from_double(248, DT_FP8E4M3FNUZ, 1), 0x7F);
    /* E5M2 has inf: saturate clamps it, no saturate keeps it */
    assert_int_equal(fp8_from_double(INFINITY, DT_FP8E5M2, 1), 0x7B);
    assert_int_equal(fp8_from_double(INFINITY, DT_FP8E5M2, 0), 0x7C);
    assert_int_equal(fp8_from_double(61440, DT_FP8E5M2, 0), 0x7C); /* the tie above 57344 goes up */
    assert_int_equal(fp8_from_double(61439, DT_FP8E5M2, 0), 0x7B);
    assert_true(isinf(fp8_to_fp32(0xFC, DT_FP8E5M2)) && fp8_to_fp32(0xFC, DT_FP8E5M2) < 0);
    /* E5M2FNUZ */
    assert_int_equal(fp8_from_double(-INFINITY, DT_FP8E5M2FNUZ, 0), 0x80);
    assert_int_equal(fp8_from_double(-INFINITY, DT_FP8E5M2FNUZ, 1), 0xFF);
    /* float4e2m1 always saturates; 5 ties to 4, 0.25 to 0 */
    assert_int_equal(fp8_from_double(1e6, DT_FP4E2M1, 0), 0x7);
    assert_int_equal(fp8_from_double(-INFINITY, DT_FP4E2M1, 0), 0xF);
    assert_int_equal(fp8_from_double(5, DT_FP4E2M1, 1), 0x6);
    assert_int_equal(fp8_from_double(0.25, DT_FP4E2M1, 1), 0x0);
    assert_int_equal(fp8_from_double(0.75, DT_FP4E2M1, 1), 0x2); /* 0.75 ties between 0.5 and 1: 1 (even) */
    assert_float_equal(fp8_to_fp32(0x1, DT_FP4E2M1), 0.5, 0);
}

/* float8e8m0: a power of two from float32's exponent, rounded by round_mode. */
static void test_e8m0(void **state) {
    (void)state;
    assert_int_equal(fp8e8m0_from_float(1.0f, 1, E8M0_ROUND_UP), 127);
    assert_int_equal(fp8e8m0_from_float(1.1f, 1, E8M0_ROUND_UP), 128);
    assert_int_equal(fp8e8m0_from_float(1.9f, 1, E8M0_ROUND_DOWN), 127);
    assert_int_equal(fp8e8m0_from_float(1.5f, 1, E8M0_ROUND_NEAREST), 128);  /* a tie goes up */
    assert_int_equal(fp8e8m0_from_float(1.49f, 1, E8M0_ROUND_NEAREST), 127);
    assert_int_equal(fp8e8m0_from_float(0.0f, 1, E8M0_ROUND_UP), 0);         /* 2^-127, the smallest */
    assert_int_equal(fp8e8m0_from_float(NAN, 1, E8M0_ROUND_UP), 0xFF);
    assert_int_equal(fp8e8m0_from_float(INFINITY, 1, E8M0_ROUND_UP), 0xFF);
    assert_int_equal(fp8e8m0_from_float(3e38f, 1, E8M0_ROUND_UP), 0xFE);     /* saturate stops below NaN */
    assert_int_equal(fp8e8m0_from_float(3e38f, 0, E8M0_ROUND_UP), 0xFF);
    assert_true(fp8_to_fp32(127, DT_FP8E8M0) == 1.0f);
    assert_true(fp8_to_fp32(0, DT_FP8E8M0) == ldexpf(1.0f, -127));
    assert_true(isnan(fp8_to_fp32(0xFF, DT_FP8E8M0)));
    /* through Cast, with round_mode decoded at prepare; a bad mode is named */
    struct tensor x = {DT_FP32, 1, {3}, NULL}, o = {0};
    float xv[] = {0.3f, 6.0f, 1e-3f};
    x.data = xv;
    struct tnode tn;
    tn_init(&tn, "Cast", 25);
    tn_int(&tn, "to", DT_FP8E8M0);
    tn_str(&tn, "round_mode", "down");
    const struct tensor *in[1] = {&x};
    struct tensor *out[1] = {&o};
    assert_int_equal(tn_call(&tn.n, in, 1, out, 1, 1), 0);
    for (int i = 0; i < 3; i++) {
        int k;
        frexpf(xv[i], &k);
        assert_true(fp8_to_fp32(((uint8_t *)o.data)[i], DT_FP8E8M0) == ldexpf(1.0f, k - 1));
    }
    free(o.data);
    tn_init(&tn, "Cast", 25);
    tn_int(&tn, "to", DT_FP8E8M0);
    tn_str(&tn, "round_mode", "sideways");
    assert_int_not_equal(tn_call(&tn.n, in, 1, out, 1, 1), 0);
    assert_non_null(strstr(g_err, "sideways"));
    free(o.data);
}

static void test_lowbit_ints_and_packing(void **state) {
    (void)state;
    /* Cast to a 4- or 2-bit integer keeps the low bits of the integer part */
    assert_int_equal((int8_t)lowbit_from_double(-9, DT_INT4), 7);
    assert_int_equal((int8_t)lowbit_from_double(8, DT_INT4), -8);
    assert_int_equal((int8_t)lowbit_from_double(-8.9, DT_INT4), -8);
    assert_int_equal(lowbit_from_double(NAN, DT_INT4), 0);
    assert_int_equal(lowbit_from_double(INFINITY, DT_UINT4), 0);
    assert_int_equal(lowbit_from_double(1e30, DT_UINT4), 0);
    assert_int_equal(lowbit_from_int(-1, DT_UINT2), 3);
    assert_int_equal((int8_t)lowbit_from_int(2, DT_INT2), -2);
    assert_int_equal(lowbit_from_int(17, DT_UINT4), 1);
    assert_int_equal(lowbit_value(0xFE, DT_INT2), -2);
    assert_int_equal(lowbit_value(0x0F, DT_UINT4), 15);
    /* ONNX's packing: element 0 in the low bits; 0x87 is int4 {7, -8} */
    uint8_t packed[] = {0x87, 0xA9, 0x0B}, un[5];
    tensor_unpack_bits(packed, un, 5, DT_INT4);
    int8_t want4[] = {7, -8, -7, -6, -5};
    for (int i = 0; i < 5; i++) assert_int_equal((int8_t)un[i], want4[i]);
    uint8_t back[3] = {0xFF, 0xFF, 0xFF};
    tensor_pack_bits(un, back, 5, DT_INT4);
    assert_memory_equal(back, packed, 3); /* the unused high nibble is 0 */
    uint8_t p2[] = {0xE4, 0x01}, u2[5]; /* uint2 {0, 1, 2, 3, 1} */
    tensor_unpack_bits(p2, u2, 5, DT_UINT2);
    for (int i = 0; i < 5; i++) assert_int_equal(u2[i], i < 4 ? i : 1);
    tensor_unpack_bits(p2, u2, 5, DT_INT2);
    int8_t want2[] = {0, 1, -2, -1, 1};
    for (int i = 0; i < 5; i++) assert_int_equal((int8_t)u2[i], want2[i]);
    assert_int_equal(dtype_packed_size(DT_INT4, 5), 3);
    assert_int_equal(dtype_packed_size(DT_UINT2, 5), 2);
    assert_int_equal(dtype_packed_size(DT_FP8E5M2, 5), 5);
    assert_int_equal(dtype_size(DT_INT4), 1);
    assert_null(dtype_kserve_name(DT_FP8E4M3FN));
    assert_string_equal(dtype_name(DT_UINT2), "uint2");
}

/* ---- through the op table ------------------------------------------------- */

static struct tensor mk1(enum dtype dt, int64_t n) {
    struct tensor t = {dt, 1, {n}, NULL};
    t.data = calloc((size_t)n, dtype_size(dt));
    return t;
}

static int run_cast(const struct tensor *x, enum dtype to, int saturate, struct tensor *o) {
    struct tnode tn;
    tn_init(&tn, "Cast", 21);
    tn_int(&tn, "to", to);
    if (saturate >= 0) tn_int(&tn, "saturate", saturate);
    const struct tensor *in[1] = {x};
    struct tensor *out[1] = {o};
    return tn_call(&tn.n, in, 1, out, 1, 1);
}

static void test_cast_op(void **state) {
    (void)state;
    struct tensor x = mk1(DT_FP32, 6), o = {0};
    float xv[] = {1e6f, -INFINITY, 464.0f, 465.0f, NAN, -0.0f};
    memcpy(x.data, xv, sizeof xv);
    assert_int_equal(run_cast(&x, DT_FP8E4M3FN, 0, &o), 0);
    assert_int_equal(o.dtype, DT_FP8E4M3FN);
    uint8_t nosat[] = {0x7F, 0xFF, 0x7E, 0x7F, 0x7F, 0x80};
    assert_memory_equal(o.data, nosat, 6);
    free(o.data);
    assert_int_equal(run_cast(&x, DT_FP8E4M3FN, -1, &o), 0); /* saturate defaults to 1 */
    uint8_t sat[] = {0x7E, 0xFE, 0x7E, 0x7E, 0x7F, 0x80};
    assert_memory_equal(o.data, sat, 6);
    /* float8 to float8: E4M3FN 448 fits E5M2 exactly; back again */
    struct tensor e5 = {0}, e4 = {0};
    assert_int_equal(run_cast(&o, DT_FP8E5M2, 1, &e5), 0);
    assert_float_equal(fp8_to_fp32(((uint8_t *)e5.data)[0], DT_FP8E5M2), 448, 0);
    ((uint8_t *)e5.data)[1] = 0x7B; /* 57344 does not fit E4M3FN */
    assert_int_equal(run_cast(&e5, DT_FP8E4M3FN, 0, &e4), 0);
    assert_int_equal(((uint8_t *)e4.data)[1], 0x7F);
    free(e4.data);
    assert_int_equal(run_cast(&e5, DT_FP8E4M3FN, 1, &e4), 0);
    assert_int_equal(((uint8_t *)e4.data)[1], 0x7E);
    free(e4.data);
    free(e5.data);
    free(o.data);
    /* float to int4 wraps; int4 to float and to int8 are exact */
    float iv[] = {-9.0f, 8.0f, 7.9f, -8.5f, NAN, 3.0f};
    memcpy(x.data, iv, sizeof iv);
    assert_int_equal(run_cast(&x, DT_INT4, -1, &o), 0);
    int8_t w4[] = {7, -8, 7, -8, 0, 3};
    for (int i = 0; i < 6; i++) assert_int_equal(((int8_t *)o.data)[i], w4[i]);
    struct tensor f = {0}, i8 = {0};
    assert_int_equal(run_cast(&o, DT_FP32, -1, &f), 0);
    for (int i = 0; i < 6; i++) assert_float_equal(((float *)f.data)[i], w4[i], 0);
    assert_int_equal(run_cast(&o, DT_INT8, -1, &i8), 0);
    for (int i = 0; i < 6; i++) assert_int_equal(((int8_t *)i8.data)[i], w4[i]);
    /* int8 to uint2 keeps the low two bits */
    struct tensor u2 = {0};
    assert_int_equal(run_cast(&i8, DT_UINT2, -1, &u2), 0);
    for (int i = 0; i < 6; i++) assert_int_equal(((uint8_t *)u2.data)[i], (uint8_t)w4[i] & 3);
    free(u2.data);
    free(f.data);
    free(i8.data);
    free(o.data);
    /* float16 to float4 */
    struct tensor h = mk1(DT_FP16, 3);
    uint16_t hv[] = {fp32_to_fp16(2.5f), fp32_to_fp16(-100.0f), fp32_to_fp16(0.3f)};
    memcpy(h.data, hv, sizeof hv);
    assert_int_equal(run_cast(&h, DT_FP4E2M1, -1, &o), 0);
    uint8_t w2[] = {0x4, 0xF, 0x1}; /* 2.5 ties to 2, -100 saturates to -6, 0.3 to 0.5 */
    assert_memory_equal(o.data, w2, 3);
    free(o.data);
    free(h.data);
    free(x.data);
}

static void test_quantize_lowprec(void **state) {
    (void)state;
    /* int4 blocked along axis 1 (block 2) with zero points: ties to even, saturation */
    struct tensor x = {DT_FP32, 2, {2, 4}, NULL}, sc = {DT_FP32, 2, {2, 2}, NULL}, zp = {DT_INT4, 2, {2, 2}, NULL};
    float xv[] = {2.5f, 3.5f, -100.0f, 100.0f, 1.0f, -1.0f, 0.5f, 1.5f};
    float sv[] = {1.0f, 2.0f, 0.5f, 1.0f};
    int8_t zv[] = {0, 1, -2, 0};
    x.data = xv;
    sc.data = sv;
    zp.data = zv;
    struct tensor q = {0}, back = {0};
    struct tnode tn;
    tn_init(&tn, "QuantizeLinear", 21);
    tn_int(&tn, "axis", 1);
    tn_int(&tn, "block_size", 2);
    const struct tensor *in[3] = {&x, &sc, &zp};
    struct tensor *out[1] = {&q};
    assert_int_equal(tn_call(&tn.n, in, 3, out, 1, 1), 0);
    assert_int_equal(q.dtype, DT_INT4);
    int8_t wq[] = {2, 4, -8, 7, 0, -4, 0, 2};
    for (int i = 0; i < 8; i++) assert_int_equal(((int8_t *)q.data)[i], wq[i]);
    tn_init(&tn, "DequantizeLinear", 21);
    tn_int(&tn, "axis", 1);
    tn_int(&tn, "block_size", 2);
    const struct tensor *din[3] = {&q, &sc, &zp};
    struct tensor *dout[1] = {&back};
    assert_int_equal(tn_call(&tn.n, din, 3, dout, 1, 1), 0);
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 4; j++) {
            int s = r * 2 + j / 2;
            assert_float_equal(((float *)back.data)[r * 4 + j], (wq[r * 4 + j] - zv[s]) * sv[s], 0);
        }
    free(q.data);
    free(back.data);
    /* uint2 per tensor via output_dtype */
    struct tensor one = {DT_FP32, 0, {0}, NULL};
    float s1 = 0.5f;
    one.data = &s1;
    tn_init(&tn, "QuantizeLinear", 21);
    tn_int(&tn, "output_dtype", DT_UINT2);
    const struct tensor *in2[2] = {&x, &one};
    assert_int_equal(tn_call(&tn.n, in2, 2, out, 1, 1), 0);
    assert_int_equal(q.dtype, DT_UINT2);
    uint8_t wu[] = {3, 3, 0, 3, 2, 0, 1, 3};
    assert_memory_equal(q.data, wu, 8);
    free(q.data);
    /* float8 E4M3FN: saturate off turns 100/0.1 = 1000 into NaN, on into 448 */
    float s01 = 0.1f;
    one.data = &s01;
    for (int sat = 0; sat <= 1; sat++) {
        tn_init(&tn, "QuantizeLinear", 21);
        tn_int(&tn, "output_dtype", DT_FP8E4M3FN);
        tn_int(&tn, "saturate", sat);
        assert_int_equal(tn_call(&tn.n, in2, 2, out, 1, 1), 0);
        assert_int_equal(((uint8_t *)q.data)[3], sat ? 0x7E : 0x7F);
        assert_int_equal(((uint8_t *)q.data)[2], sat ? 0xFE : 0xFF);
        assert_int_equal(((uint8_t *)q.data)[0], fp8_from_double((float)(2.5f / 0.1f), DT_FP8E4M3FN, 1));
        free(q.data);
    }
    /* DequantizeLinear from float4e2m1 per axis; its zero point is ignored */
    struct tensor x4 = {DT_FP4E2M1, 2, {2, 2}, NULL}, s4 = {DT_FP32, 1, {2}, NULL}, z4 = {DT_FP4E2M1, 1, {2}, NULL};
    uint8_t x4v[] = {0x1, 0xF, 0x7, 0x3};
    float s4v[] = {2.0f, 4.0f};
    uint8_t z4v[] = {0x2, 0x2};
    x4.data = x4v;
    s4.data = s4v;
    z4.data = z4v;
    tn_init(&tn, "DequantizeLinear", 21);
    tn_int(&tn, "axis", 0);
    const struct tensor *in4[3] = {&x4, &s4, &z4};
    assert_int_equal(tn_call(&tn.n, in4, 3, dout, 1, 1), 0);
    float w4[] = {1.0f, -12.0f, 24.0f, 6.0f};
    for (int i = 0; i < 4; i++) assert_float_equal(((float *)back.data)[i], w4[i], 0);
    free(back.data);
    /* a dtype with no quantization is refused by name */
    tn_init(&tn, "QuantizeLinear", 21);
    tn_int(&tn, "output_dtype", DT_INT32);
    assert_int_equal(tn_call(&tn.n, in2, 2, out, 1, 1), STATUS_UNSUPPORTED);
    assert_non_null(strstr(g_err, "int32"));
}

int main(void) {
    g_run_without_attrs = 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_every_code),  cmocka_unit_test(test_encode_every_half),
        cmocka_unit_test(test_encode_random_floats), cmocka_unit_test(test_encode_edges),
        cmocka_unit_test(test_lowbit_ints_and_packing), cmocka_unit_test(test_cast_op),
        cmocka_unit_test(test_quantize_lowprec),   cmocka_unit_test(test_e8m0),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
