/* jsonnum: the number reader against strtod (bit for bit) and the float
 * writer against strtof/strtod round trips and a brute-force shortest
 * printf("%.*g"), on edge values and many random ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonnum.h"

static uint64_t g_rs = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void) {
    g_rs ^= g_rs << 13;
    g_rs ^= g_rs >> 7;
    g_rs ^= g_rs << 17;
    return g_rs;
}

/* jsonnum_parse must read all of s and give strtod's bits. */
static void check_parse(const char *s) {
    double want = strtod(s, NULL), got = -12345;
    const char *next = NULL;
    size_t n = strlen(s);
    /* A copy without a terminator, so a read past the end shows under ASan. */
    char *c = malloc(n);
    memcpy(c, s, n);
    int rc = jsonnum_parse(c, c + n, &got, &next);
    if (rc != 0 || next != c + n || memcmp(&got, &want, sizeof got) != 0)
        fail_msg("'%s': rc %d, read %td of %zu bytes, got %a, strtod %a", s, rc, next ? next - c : -1, n, got, want);
    /* Inside a longer text, as in a request's array, where the fast paths
     * load eight bytes at a time. */
    static const char tail[] = ", 0.5, 1e3, 12345678]";
    c = realloc(c, n + sizeof tail);
    memcpy(c + n, tail, sizeof tail);
    got = -12345, next = NULL;
    rc = jsonnum_parse(c, c + n + sizeof tail, &got, &next);
    if (rc != 0 || next != c + n || memcmp(&got, &want, sizeof got) != 0)
        fail_msg("'%s' before more text: rc %d, read %td of %zu bytes, got %a, strtod %a", s, rc, next ? next - c : -1,
                 n, got, want);
    free(c);
}

static void test_parse_edges(void **state) {
    (void)state;
    static const char *cases[] = {
        "0", "-0", "0.0", "-0.0", "0e999", "-0e-999", "1", "-1", "0.1", "0.5", "1.5", "3.14159",
        "1e22", "1e23", "9e22", "1e-22", "1e-23", "123456789e22", "4.5e15", "4503599627370497e7",
        "9007199254740992", "9007199254740993", "9007199254740993.0", "18446744073709551615",
        "18446744073709551616", "12345678901234567890123", "1234567890123456789", "0.1234567890123456789",
        "12345678901234567890e-20", "10000000000000000000000000000000e-10", "1000000000000000000000000",
        "2.2250738585072014e-308", "2.2250738585072011e-308", "4.9406564584124654e-324", "5e-324",
        "2e-324", "1e-400", "-1e-400", "1.7976931348623157e308", "1.7976931348623158e308", "1e309",
        "-1e400", "1e100000000", "2.225073858507201136057409796709131975934819546351645648e-308",
        "0.30000000000000004", "0.29999999999999998", "1E5", "1e+5", "1E-5", "100e-2", "0.000001",
        "123.456e-7", "0.0000000000000000000000000000000000001",
        "7.0385307e-26", "6.1", "3.4028235e38", "1.17549435e-38", "1.4e-45", "16777217",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_parse(cases[i]);
    /* 17+ digit mantissas around Clinger's limit: every digit count, both signs. */
    char b[64];
    for (int d = 1; d <= 25; d++)
        for (int e = -30; e <= 30; e += 3) {
            char m[32];
            for (int j = 0; j < d; j++) m[j] = (char)('1' + (j * 7 + d) % 9);
            m[d] = 0;
            snprintf(b, sizeof b, "%se%d", m, e);
            check_parse(b);
            snprintf(b, sizeof b, "-%.1s.%se%d", m, m + 1, e);
            if (d > 1) check_parse(b);
        }
}

static void test_parse_random(void **state) {
    (void)state;
    char b[128];
    for (int it = 0; it < 300000; it++) {
        uint64_t r = rnd();
        double x;
        switch (it % 6) {
        case 0: /* any double, as printf writes it */
            memcpy(&x, &r, sizeof x);
            if (!isfinite(x)) continue;
            snprintf(b, sizeof b, "%.*g", (int)(rnd() % 18) + 1, x);
            break;
        case 1: /* floats as %.9g, the way responses and clients write them */
            x = (double)((float)(r % 2000001) / 1e6f - 1.0f);
            snprintf(b, sizeof b, "%.9g", x);
            break;
        case 4: { /* 19 digits on or next to the midpoint between two doubles: double rounding's trap */
            memcpy(&x, &r, sizeof x);
            x = fabs(x);
            if (!isfinite(x) || x < 1e-20 || x > 1e25) x = (double)(r % 1000000007) / 1e7;
            long double mid = ((long double)x + (long double)nextafter(x, INFINITY)) / 2;
            int len = snprintf(b, sizeof b, "%.18Le", mid);
            int ep = (int)(strchr(b, 'e') - b);
            if (rnd() & 1) b[ep - 1] = (char)(b[ep - 1] == '9' ? '8' : b[ep - 1] + 1);
            (void)len;
            break;
        }
        case 2: /* decimal fractions in [0, 1), 1 to 20 digits (leading zeros too) */
            snprintf(b, sizeof b, "0.%0*llu", (int)(rnd() % 20) + 1, (unsigned long long)(r % 100000000000000000ULL));
            break;
        case 3:
        case 5: { /* random digit strings, fraction and exponent */
            size_t k = 0;
            if (r & 1) b[k++] = '-';
            int nd = (int)(rnd() % 24) + 1;
            b[k++] = (char)('1' + rnd() % 9);
            for (int j = 1; j < nd; j++) b[k++] = (char)('0' + rnd() % 10);
            if (r & 2) {
                b[k++] = '.';
                int nf = (int)(rnd() % 20) + 1;
                for (int j = 0; j < nf; j++) b[k++] = (char)('0' + rnd() % 10);
            }
            b[k] = 0;
            if (r & 4) snprintf(b + k, sizeof b - k, "%c%d", (r & 8) ? 'e' : 'E', (int)(rnd() % 700) - 350);
            break;
        }
        }
        check_parse(b);
    }
}

/* Long mantissas whose scale cancels a long exponent: the exponent must be
 * read in full, not capped ("0.<10^5 zeros>1e1000000" is 1e900000, which
 * overflows to infinity; capping the exponent at 10^5 read it as 1). */
static void test_parse_long_mantissa_long_exponent(void **state) {
    (void)state;
    static const struct { const char *lead; int zeros; const char *tail; } cases[] = {
        {"0.", 99999, "1e1000000"},     /* inf */
        {"-0.", 99999, "1e1000000"},    /* -inf */
        {"0.", 99999, "1e100000"},      /* 1 */
        {"0.", 99999, "15e100001"},     /* 15 */
        {"0.", 99999, "1e100308"},      /* 1e308 */
        {"0.", 99999, "1e100309"},      /* inf */
        {"1", 100000, "e-1000000"},     /* 0 */
        {"1", 100000, "e-100000"},      /* 1 */
        {"1", 100000, "e-100324"},      /* 1e-324: 0 */
        {"0.", 99999, "1e99999999999"}, /* inf */
        {"0.", 99999, "1e-99999999999"},
        {"1", 100000, "e-99999999999"},
        {"1", 200, "e-000000000000000000000000000000000000200"}, /* 1 */
        {"0.", 5, "1e000000000000000000000000000000000000006"},  /* 10 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t a = strlen(cases[i].lead), z = (size_t)cases[i].zeros, c = strlen(cases[i].tail);
        char *s = malloc(a + z + c + 1);
        memcpy(s, cases[i].lead, a);
        memset(s + a, '0', z);
        memcpy(s + a + z, cases[i].tail, c + 1);
        check_parse(s);
        free(s);
    }
}

static void test_parse_refuses_non_json(void **state) {
    (void)state;
    static const char *bad[] = {"", "-", "+1", ".5", "-.5", "1.", "1.e5", "1e", "1e+", "1E-", "x", "-x",
                                "NaN", "Infinity", "-Infinity", "inf", "\"1\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        double v = 7;
        const char *next = NULL, *s = bad[i];
        assert_int_equal(jsonnum_parse(s, s + strlen(s), &v, &next), -1);
        assert_true(v == 7);
    }
    /* A number ends where JSON's grammar ends it; the caller checks what follows. */
    static const struct { const char *s; size_t len; double v; } stop[] = {
        {"01", 1, 0}, {"0x10", 1, 0}, {"1,2", 1, 1}, {"-2]", 2, -2}, {"1.5.5", 3, 1.5}, {"3e2e1", 3, 300},
        {"12 ", 2, 12}};
    for (size_t i = 0; i < sizeof stop / sizeof stop[0]; i++) {
        double v = 0;
        const char *next = NULL, *s = stop[i].s;
        assert_int_equal(jsonnum_parse(s, s + strlen(s), &v, &next), 0);
        assert_int_equal(next - s, stop[i].len);
        assert_true(v == stop[i].v);
    }
    /* The end bound is respected: "12" of "123" when only two bytes are given. */
    double v = 0;
    const char *next = NULL, *s = "123";
    assert_int_equal(jsonnum_parse(s, s + 2, &v, &next), 0);
    assert_true(v == 12 && next == s + 2);
}

/* The fewest %.*g digits that read back as f through both strtof and strtod. */
static int shortest_ref(float f) {
    char b[64];
    for (int p = 1; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, (double)f);
        float a = strtof(b, NULL), c = (float)strtod(b, NULL);
        if (!memcmp(&a, &f, 4) && !memcmp(&c, &f, 4)) return p;
    }
    return 9;
}

/* Significant digits of a %g-style number, trailing zeros not counted. */
static int sig_digits(const char *s) {
    int n = 0, z = 0, lead = 1;
    for (; *s && *s != 'e'; s++) {
        if (*s < '0' || *s > '9' || (lead && *s == '0')) continue;
        lead = 0;
        n++;
        z = *s == '0' ? z + 1 : 0;
    }
    return n - z;
}

static void check_format(float f) {
    if (!isfinite(f)) return; /* the caller writes NaN and infinities itself */
    char b[JSONNUM_BUF];
    memset(b, 'x', sizeof b);
    size_t n = jsonnum_format_float(f, b);
    if (n != strlen(b)) fail_msg("%a: length %zu but wrote '%s'", f, n, b);
    float a = strtof(b, NULL), c = (float)strtod(b, NULL);
    if (memcmp(&a, &f, 4) || memcmp(&c, &f, 4)) fail_msg("%a wrote '%s', which reads back as %a / %a", f, b, a, c);
    /* Valid JSON: the whole text is one number in JSON's grammar. */
    double v;
    const char *next = NULL;
    if (jsonnum_parse(b, b + n, &v, &next) || next != b + n) fail_msg("%a wrote '%s', not a JSON number", f, b);
    /* Never longer than %.9g, and shortest where the fast path applies. */
    char p9[64];
    snprintf(p9, sizeof p9, "%.9g", (double)f);
    if (sig_digits(b) > sig_digits(p9)) fail_msg("%a wrote '%s', longer than '%s'", f, b, p9);
    float m = fabsf(f);
    if (f != 0 && (double)m >= 1e-14 && (double)m < 1e22 && sig_digits(b) != shortest_ref(f))
        fail_msg("%a wrote '%s' but %d digits suffice", f, b, shortest_ref(f));
}

static void test_format_edges(void **state) {
    (void)state;
    char b[JSONNUM_BUF];
    assert_int_equal(jsonnum_format_float(0.0f, b), 1);
    assert_string_equal(b, "0");
    assert_int_equal(jsonnum_format_float(-0.0f, b), 2);
    assert_string_equal(b, "-0");
    static const struct { float f; const char *s; } exact[] = {
        {0.25f, "0.25"}, {-3, "-3"}, {0.1f, "0.1"}, {1e-5f, "1e-05"}, {1.5e-7f, "1.5e-07"}, {123456789.0f, "123456790"},
        {1e9f, "1e+09"}, {0.0001f, "0.0001"}, {16777216.0f, "16777216"}, {3.4028235e38f, "3.40282347e+38"},
        {1e22f, "1e+22"}, {3e22f, "2.99999993e+22"}, {1.4e-45f, "1.40129846e-45"}, {100, "100"}, {0.3f, "0.3"}, {2.5f, "2.5"},
        {1e21f, "1e+21"}, {1e-13f, "1e-13"}};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
        jsonnum_format_float(exact[i].f, b);
        assert_string_equal(b, exact[i].s);
        check_format(exact[i].f);
    }
    const float edges[] = {FLT_MIN, -FLT_MIN, FLT_MAX, -FLT_MAX, FLT_TRUE_MIN, -FLT_TRUE_MIN, FLT_EPSILON,
                           1e-13f, 1e-14f, 9.9999e-15f, 1e22f, 9.99e21f, 1.0f, -1.0f, 0.5f, 8388608.0f, 8388607.5f,
                           16777215.0f, 33554432.0f, 7.0385307e-26f, 1e38f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        check_format(edges[i]);
        check_format(nextafterf(edges[i], INFINITY));
        check_format(nextafterf(edges[i], -INFINITY));
    }
    /* Every power of two and of ten in float range, and their neighbours. */
    for (int e = -149; e <= 127; e++) check_format(ldexpf(1.0f, e));
    for (int e = -45; e <= 38; e++) {
        float f = strtof((snprintf(b, sizeof b, "1e%d", e), b), NULL);
        check_format(f);
        check_format(nextafterf(f, 0));
        check_format(nextafterf(f, INFINITY));
    }
}

static void test_format_random(void **state) {
    (void)state;
    for (int it = 0; it < 200000; it++) {
        uint32_t bits = (uint32_t)rnd();
        float f;
        if (it % 2) f = (float)(rnd() % 1000001) / 1e6f; /* probabilities */
        else memcpy(&f, &bits, 4);
        if (isfinite(f)) check_format(f);
    }
}

static void test_format_integers(void **state) {
    (void)state;
    char b[JSONNUM_BUF], want[64];
    const int64_t v[] = {0, 1, -1, 9, 10, -10, 123456789, INT64_MAX, INT64_MIN, INT64_MIN + 1};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        snprintf(want, sizeof want, "%lld", (long long)v[i]);
        assert_int_equal(jsonnum_format_i64(v[i], b), strlen(want));
        assert_string_equal(b, want);
    }
    for (int it = 0; it < 100000; it++) {
        uint64_t u = rnd() >> (rnd() % 64);
        snprintf(want, sizeof want, "%llu", (unsigned long long)u);
        assert_int_equal(jsonnum_format_u64(u, b), strlen(want));
        assert_string_equal(b, want);
        snprintf(want, sizeof want, "%lld", (long long)(int64_t)u);
        jsonnum_format_i64((int64_t)u, b);
        assert_string_equal(b, want);
    }
}

/* jsonnum_parse_int: 64-bit integers exactly, at both ends of both types;
 * past UINT64_MAX said so; a fraction or an exponent left to jsonnum_parse;
 * what is not a number refused. */
static void test_parse_int(void **state) {
    static const struct { const char *s; int rc, neg; uint64_t mag; size_t len; } cases[] = {
        {"0", JSONNUM_INT, 0, 0, 1},
        {"-0", JSONNUM_INT, 1, 0, 2},
        {"9223372036854775807", JSONNUM_INT, 0, 9223372036854775807ULL, 19},
        {"-9223372036854775808", JSONNUM_INT, 1, 9223372036854775808ULL, 20},
        {"18446744073709551615]", JSONNUM_INT, 0, 18446744073709551615ULL, 20},
        {"9007199254740993,", JSONNUM_INT, 0, 9007199254740993ULL, 16},
        {"18446744073709551616", JSONNUM_INT_BIG, 0, 0, 20},
        {"-99999999999999999999999", JSONNUM_INT_BIG, 1, 0, 24},
        {"01", JSONNUM_INT, 0, 0, 1}, /* the caller finds the 1 where a separator should be */
        {"1.5", JSONNUM_NOT_INT, 0, 0, 0},
        {"1e3", JSONNUM_NOT_INT, 0, 0, 0},
        {"-", -1, 0, 0, 0},
        {"+1", -1, 0, 0, 0},
        {"-Infinity", -1, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *s = cases[i].s, *next = NULL;
        int neg = -1;
        uint64_t mag = 12345;
        int rc = jsonnum_parse_int(s, s + strlen(s), &neg, &mag, &next);
        if (rc != cases[i].rc) fail_msg("'%s': rc %d, expected %d", s, rc, cases[i].rc);
        if (rc == JSONNUM_INT && (neg != cases[i].neg || mag != cases[i].mag || (size_t)(next - s) != cases[i].len))
            fail_msg("'%s': %d %llu %td", s, neg, (unsigned long long)mag, next - s);
        if (rc == JSONNUM_INT_BIG && (neg != cases[i].neg || (size_t)(next - s) != cases[i].len))
            fail_msg("'%s': big, %d %td", s, neg, next - s);
    }
}

/* Below 1e-14 the text is printf's %.9g (nine significant digits), made
 * in integer arithmetic down to 1e-36 and by snprintf below: the same
 * bytes as snprintf, subnormals and decimal boundaries included. */
static void test_format_tiny_as_printf(void **state) {
    (void)state;
    char a[JSONNUM_BUF], b[64];
    for (int it = 0; it < 400000; it++) {
        uint64_t r = rnd();
        uint32_t bits = ((uint32_t)(r % 81) << 23) | ((uint32_t)(r >> 20) & 0x7fffff) | (r & (1ULL << 40) ? 0x80000000u : 0);
        if (it % 50 == 0) bits = (uint32_t)(r >> 20) % 0x800000; /* subnormal */
        if (it % 3 == 0) { /* next to a power of ten */
            snprintf(b, sizeof b, "1e%d", -14 - (int)(r % 32));
            float p = strtof(b, NULL);
            memcpy(&bits, &p, 4);
            bits += (uint32_t)(r >> 50) % 9 - 4;
        }
        float f;
        memcpy(&f, &bits, 4);
        if (f == 0 || fabsf(f) >= 1e-14f) continue;
        jsonnum_format_float(f, a);
        snprintf(b, sizeof b, "%.9g", (double)f);
        if (strcmp(a, b) != 0) fail_msg("%a: wrote '%s', printf's %%.9g '%s'", f, a, b);
    }
}

/* A run of numbers as floats: each (float) of strtod's value; the run
 * stops before a non-number, before a value beyond float's range and at
 * max, with next after the last number read. */
static void test_parse_f32_run(void **state) {
    (void)state;
    static const char text[] = "0.5, 0.0123456789012345678 ,\n\t-0.25,1e3,0.1234567890123456,3.4e39, 7]";
    const char *end = text + sizeof text - 1, *next = NULL;
    float out[8];
    size_t n = jsonnum_parse_f32_run(text, end, out, 8, &next);
    assert_int_equal(n, 5);
    assert_true(out[0] == 0.5f && out[1] == (float)strtod("0.0123456789012345678", NULL) && out[2] == -0.25f &&
                out[3] == 1000.0f && out[4] == (float)strtod("0.1234567890123456", NULL));
    assert_ptr_equal(next, strstr(text, ",3.4e39"));
    n = jsonnum_parse_f32_run(text, end, out, 2, &next);
    assert_int_equal(n, 2);
    assert_ptr_equal(next, strstr(text, " ,\n"));
    static const char bad[] = "\"x\", 1]";
    n = jsonnum_parse_f32_run(bad, bad + sizeof bad - 1, out, 8, &next);
    assert_int_equal(n, 0);
    assert_ptr_equal(next, bad);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_int),
        cmocka_unit_test(test_parse_edges),          cmocka_unit_test(test_parse_random),
        cmocka_unit_test(test_parse_refuses_non_json), cmocka_unit_test(test_format_edges),
        cmocka_unit_test(test_parse_long_mantissa_long_exponent),
        cmocka_unit_test(test_format_random),        cmocka_unit_test(test_format_integers),
        cmocka_unit_test(test_parse_f32_run),         cmocka_unit_test(test_format_tiny_as_printf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
