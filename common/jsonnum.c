#include "common/jsonnum.h"

#include <float.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The fast paths below rely on each double operation rounding once, to
 * nearest: true for SSE2 arithmetic, not for x87's extended precision. */
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
#define JSONNUM_FAST 1
#else
#define JSONNUM_FAST 0
#endif

/* Every power of ten up to 1e22 is exactly a double (5^22 < 2^53). */
static const double p10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

#define TWO53 9007199254740992ULL

/* x87's 64-bit significand holds any 19-digit mantissa and 10^0..10^27
 * exactly (5^27 < 2^64); see parse_extended. */
#if JSONNUM_FAST && (defined(__x86_64__) || defined(__i386__)) && LDBL_MANT_DIG == 64
#define JSONNUM_X87 1
static const long double p10l[28] = {1e0L,  1e1L,  1e2L,  1e3L,  1e4L,  1e5L,  1e6L,  1e7L,  1e8L,  1e9L,
                                     1e10L, 1e11L, 1e12L, 1e13L, 1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L,
                                     1e20L, 1e21L, 1e22L, 1e23L, 1e24L, 1e25L, 1e26L, 1e27L};

/* w * 10^e10 (w < 2^64, |e10| <= 27) correctly rounded to double, for the
 * 17-digit mantissas clients write (repr of a double) that Clinger's path
 * cannot take. w and 10^|e10| are exact long doubles, so the long double
 * result r is the exact value rounded once to 64 bits; rounding r again to
 * 53 bits gives the same double as rounding the exact value, unless r sits
 * exactly halfway between two doubles (its 11 extra bits are 10000000000):
 * any such midpoint is itself a 64-bit value, so the exact value cannot lie
 * across one from r. That one case goes to strtod. */
static int parse_extended(uint64_t w, int e10, double *out) {
    long double r = e10 >= 0 ? (long double)w * p10l[e10] : (long double)w / p10l[-e10];
    uint64_t m;
    memcpy(&m, &r, sizeof m); /* x87 layout: the 64-bit significand first */
    if ((m & 0x7ff) == 0x400) return -1;
    *out = (double)r;
    return 0;
}
#else
#define JSONNUM_X87 0
#endif

/* ---- parsing ------------------------------------------------------------ */

/* The run of digits that starts at p, up to eight of them, read at once
 * (one little-endian load of the 8 bytes at p, which must be readable):
 * returns its length and stores its value in *v (the length 0 stores
 * nothing). The lowest byte that is not a digit ends the run: a digit
 * neither carries nor borrows into the bytes above it, so the bytes below
 * that one are tested exactly. A run shorter than eight is shifted to the
 * top of the word under '0's, which add nothing to its value. */
static inline __attribute__((always_inline)) int digit_run(const char *p, uint32_t *v) {
    uint64_t x;
    memcpy(&x, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t t = ((x + 0x4646464646464646ULL) | (x - 0x3030303030303030ULL)) & 0x8080808080808080ULL;
    int n = t ? __builtin_ctzll(t) >> 3 : 8;
    if (n == 0) return 0;
    if (n < 8) x = (x << (8 * (8 - n))) | (0x3030303030303030ULL >> (8 * n));
    x -= 0x3030303030303030ULL;
    x = x * 10 + (x >> 8); /* pairs */
    x = ((x & 0x000000ff000000ffULL) * (100 + (1000000ULL << 32)) +
         ((x >> 16) & 0x000000ff000000ffULL) * (1 + (10000ULL << 32))) >> 32;
    *v = (uint32_t)x;
    return n;
#else
    (void)x;
    (void)v;
    return 0;
#endif
}

/* Eight ASCII digits at once: whether the 8 bytes at p are all digits, and
 * their value. */
static int eight_digits(const char *p, uint32_t *v) { return digit_run(p, v) == 8; }

/* The C library's answer for [p, end): the text copied with '.' as the
 * locale's decimal point, as cJSON itself hands numbers to strtod. */
static int parse_slow(const char *p, const char *end, double *out) {
    size_t n = (size_t)(end - p);
    char small[128];
    char *s = n < sizeof small ? small : malloc(n + 1);
    if (!s) return -1;
    char dp = localeconv()->decimal_point[0];
    for (size_t i = 0; i < n; i++) s[i] = p[i] == '.' ? dp : p[i];
    s[n] = 0;
    char *stop = NULL;
    double v = strtod(s, &stop);
    int ok = stop == s + n;
    if (s != small) free(s);
    if (!ok) return -1;
    *out = v;
    return 0;
}

int jsonnum_parse_int(const char *p, const char *end, int *neg, uint64_t *mag, const char **next) {
    const char *s = p;
    *neg = s < end && *s == '-';
    s += *neg;
    if (s >= end || *s < '0' || *s > '9') return -1;
    uint64_t m = 0;
    int big = 0;
    if (*s == '0') s++;
    else
        for (; s < end && *s >= '0' && *s <= '9'; s++) {
            unsigned d = (unsigned)(*s - '0');
            if (m > (UINT64_MAX - d) / 10) big = 1;
            else m = m * 10 + d;
        }
    if (s < end && (*s == '.' || *s == 'e' || *s == 'E')) return JSONNUM_NOT_INT;
    *mag = m;
    *next = s;
    return big ? JSONNUM_INT_BIG : JSONNUM_INT;
}

/* What JSON clients write for most numbers in (-1, 1): "0.", up to four
 * zeros and up to 17 more digits, no exponent (a float as printf's %.17g
 * or a shortest repr writes it, or cJSON's %1.15g), read a run of up to
 * eight digits at a time; the result is the general path's (the same w
 * and exponent, at most 21, the same conversions). 0, or -1 for any other
 * text, or one that ends within 22 bytes of end (not all runs could be
 * loaded), left to the general path. */
static inline __attribute__((always_inline)) int parse_frac(const char *p, const char *end, double *out,
                                                          const char **next) {
#if JSONNUM_FAST
    static const uint32_t p10u[9] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};
    const char *q = p + (p < end && *p == '-');
    uint32_t a8, b8;
    int n, z = 0;
    if (end - q < 22 || q[0] != '0' || q[1] != '.') return -1;
    /* Up to four leading zeros of the fraction, which hold no digit of w. */
    while (z < 4 && q[2 + z] == '0') z++;
    if (!(n = digit_run(q + 2 + z, &a8))) return -1;
    const char *s = q + 2 + z + n;
    uint64_t w = a8;
    int e = z + n;
    if (n == 8 && (n = digit_run(s, &b8)) > 0) {
        w = w * p10u[n] + b8;
        s += n;
        e += n;
        if (n == 8 && s < end && *s >= '0' && *s <= '9') {
            w = w * 10 + (uint64_t)(*s++ - '0');
            e++;
        }
    }
    if (s < end && ((*s >= '0' && *s <= '9') || *s == 'e' || *s == 'E')) return -1;
    double v;
    if (w <= TWO53) v = (double)w / p10[e];
#if JSONNUM_X87
    else if (parse_extended(w, -e, &v)) return -1;
#else
    else return -1;
#endif
    *out = q != p ? -v : v;
    *next = s;
    return 0;
#else
    (void)p, (void)end, (void)out, (void)next;
    return -1;
#endif
}

/* Any JSON number: the first 19 significant digits and the exponent read
 * one by one, then Clinger's path, the x87 one or strtod. Kept out of line
 * so that parse_frac's callers do not pay for its registers. */
__attribute__((noinline)) static int parse_general(const char *p, const char *end, double *out, const char **next) {
    const char *s = p;
    int neg = 0;
    if (s < end && *s == '-') {
        neg = 1;
        s++;
    }
    if (s >= end || *s < '0' || *s > '9') return -1;
    /* w holds the first 19 significant digits; e10 the power of ten that
     * scales it to the value. Digits past 19 only drop zeros exactly. */
    uint64_t w = 0;
    int nd = 0, inexact = 0;
    int64_t e10 = 0; /* grows by one per digit past 19: as long as the text, which may be long */
    if (*s == '0') s++;
    else
        for (; s < end && *s >= '0' && *s <= '9'; s++) {
            if (nd < 19) {
                w = w * 10 + (uint64_t)(*s - '0');
                nd++;
            } else {
                e10++;
                inexact |= *s != '0';
            }
        }
    if (s < end && *s == '.') {
        s++;
        if (s >= end || *s < '0' || *s > '9') return -1;
        int try8 = 1;
        for (; s < end && *s >= '0' && *s <= '9'; s++) {
            uint32_t v8;
            /* Eight at a time once the digits are significant: after the
             * fraction's leading zeros, from its first other digit on. A
             * run that fails holds the number's end: none is tried after. */
            if (try8 && nd <= 11 && (nd > 0 || *s != '0') && end - s >= 8) {
                if (eight_digits(s, &v8)) {
                    w = w * 100000000 + v8;
                    nd += 8;
                    e10 -= 8;
                    s += 7;
                    continue;
                }
                try8 = 0;
            }
            if (nd == 0 && *s == '0') e10--; /* a leading zero of the fraction */
            else if (nd < 19) {
                w = w * 10 + (uint64_t)(*s - '0');
                nd++;
                e10--;
            } else inexact |= *s != '0';
        }
    }
    if (s < end && (*s == 'e' || *s == 'E')) {
        s++;
        int eneg = 0;
        if (s < end && (*s == '+' || *s == '-')) eneg = *s++ == '-';
        if (s >= end || *s < '0' || *s > '9') return -1;
        /* The exponent is kept exactly up to 10^9; a longer one goes to
         * strtod as a whole. A capped exponent must not meet the mantissa's
         * scale: "0.<10^5 zeros>1e1000000" is 1e900000 (infinity), not 1. */
        int64_t x = 0;
        int xbig = 0;
        for (; s < end && *s >= '0' && *s <= '9'; s++) {
            if (x < 100000000) x = x * 10 + (*s - '0');
            else xbig = 1;
        }
        if (xbig) {
            if (parse_slow(p, s, out)) return -1;
            *next = s;
            return 0;
        }
        e10 += eneg ? -x : x;
    }
    if (JSONNUM_FAST && !inexact && w <= TWO53) {
        /* Clinger's fast path: w and 10^|e10| are exact doubles, so one
         * correctly rounded multiply or divide gives the correctly rounded
         * value, which is what strtod returns. */
        double v;
        int ok = 1;
        if (w == 0) v = 0;
        else if (e10 >= 0 && e10 <= 22) v = (double)w * p10[e10];
        else if (e10 < 0 && e10 >= -22) v = (double)w / p10[-e10];
        else if (e10 > 22 && e10 <= 22 + 15 && w * (uint64_t)p10[e10 - 22] / (uint64_t)p10[e10 - 22] == w &&
                 w * (uint64_t)p10[e10 - 22] <= TWO53)
            v = (double)(w * (uint64_t)p10[e10 - 22]) * 1e22; /* the extra zeros still fit in 53 bits */
        else ok = 0;
        if (ok) {
            *out = neg ? -v : v;
            *next = s;
            return 0;
        }
    }
#if JSONNUM_X87
    double v;
    if (!inexact && e10 >= -27 && e10 <= 27 && parse_extended(w, (int)e10, &v) == 0) {
        *out = neg ? -v : v;
        *next = s;
        return 0;
    }
#endif
    if (parse_slow(p, s, out)) return -1;
    *next = s;
    return 0;
}

int jsonnum_parse(const char *p, const char *end, double *out, const char **next) {
    if (!parse_frac(p, end, out, next)) return 0;
    return parse_general(p, end, out, next);
}

/* JSON's whitespace between the elements of an array. */
static inline const char *skip_ws(const char *q, const char *end) {
    while (q < end && (*q == ' ' || *q == '\n' || *q == '\r' || *q == '\t')) q++;
    return q;
}

size_t jsonnum_parse_f32_run(const char *p, const char *end, float *out, size_t max, const char **next) {
    const char *q = p;
    size_t c = 0;
    double v;
    *next = p;
    while (c < max) {
        const char *after;
        if ((parse_frac(q, end, &v, &after) && parse_general(q, end, &v, &after)) || fabs(v) > FLT_MAX) break;
        out[c++] = (float)v;
        *next = after;
        q = skip_ws(after, end);
        if (q >= end || *q != ',') break;
        q = skip_ws(q + 1, end);
    }
    return c;
}

/* ---- formatting --------------------------------------------------------- */

size_t jsonnum_format_u64(uint64_t v, char *buf) {
    /* Two digits a step, written from the end of a local buffer. */
    static const char pairs[] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                "8081828384858687888990919293949596979899";
    /* Written backwards from t + 24 (20 digits at most), then copied as
     * a fixed 20 bytes (the callers' buffers hold JSONNUM_BUF): no
     * variable-length memcpy call. */
    char t[44], *e = t + 24, *q = e;
    while (v >= 100) {
        q -= 2;
        memcpy(q, pairs + 2 * (v % 100), 2);
        v /= 100;
    }
    if (v >= 10) {
        q -= 2;
        memcpy(q, pairs + 2 * v, 2);
    } else *--q = (char)('0' + v);
    size_t n = (size_t)(e - q);
    memcpy(buf, q, 20);
    buf[n] = 0;
    return n;
}
size_t jsonnum_format_i64(int64_t v, char *buf) {
    if (v >= 0) return jsonnum_format_u64((uint64_t)v, buf);
    buf[0] = '-';
    return 1 + jsonnum_format_u64((uint64_t)0 - (uint64_t)v, buf + 1);
}

/* Writes n * 10^e (n > 0) as printf's %.9g would lay out those digits:
 * plain notation for decimal exponents -4..8, else d.ddde+XX. */
static size_t emit(char *o, uint64_t n, int e) {
    while (n % 10 == 0) {
        n /= 10;
        e++;
    }
    char dg[24];
    size_t nd = jsonnum_format_u64(n, dg);
    int x = e + (int)nd - 1; /* the exponent of the leading digit */
    char *s = o;
    if (x >= -4 && x < 9) {
        if (x < 0) {
            *s++ = '0';
            *s++ = '.';
            for (int i = -1; i > x; i--) *s++ = '0';
            memcpy(s, dg, nd);
            s += nd;
        } else if ((int)nd <= x + 1) {
            memcpy(s, dg, nd);
            s += nd;
            for (int i = (int)nd; i <= x; i++) *s++ = '0';
        } else {
            memcpy(s, dg, (size_t)x + 1);
            s += x + 1;
            *s++ = '.';
            memcpy(s, dg + x + 1, nd - (size_t)x - 1);
            s += nd - (size_t)x - 1;
        }
    } else {
        *s++ = dg[0];
        if (nd > 1) {
            *s++ = '.';
            memcpy(s, dg + 1, nd - 1);
            s += nd - 1;
        }
        *s++ = 'e';
        *s++ = x < 0 ? '-' : '+';
        int ax = x < 0 ? -x : x;
        if (ax >= 100) *s++ = (char)('0' + ax / 100);
        *s++ = (char)('0' + ax / 10 % 10);
        *s++ = (char)('0' + ax % 10);
    }
    *s = 0;
    return (size_t)(s - o);
}

/* Whether the nearest decimal to d with scale 10^s (|s| <= 22) reads back
 * as the float whose neighbours' midpoints are lo and hi; its digits go to
 * *r when it does. */
static int candidate(double d, int s, double lo, double hi, uint32_t bits, double *r) {
    double t = s >= 0 ? d * p10[s] : d / p10[-s];
    double n = nearbyint(t);
    if (n < 1) return 0;
    double v = s >= 0 ? n / p10[s] : n * p10[-s]; /* Clinger: exact inputs, one rounding */
    int inside = v > lo && v < hi;
    /* On a midpoint itself both readers round to even: f wins when its last
     * bit is 0 and the decimal is exactly that midpoint. */
    if (!inside && (v == lo || v == hi) && !(bits & 1))
        inside = (s >= 0 ? fma(v, p10[s], -n) : fma(n, p10[-s], -v)) == 0;
    if (inside) *r = n;
    return inside;
}

#ifdef __SIZEOF_INT128__
/* printf's "%.9g" digits of a tiny float f (0 < f < 1e-14, at least 1e-36):
 * *digits * 10^*e10, the value rounded to nine significant digits, in exact
 * integer arithmetic. f is m * 2^q; f * 10^s = m * 5^s / 2^r with r = -(s +
 * q) > 0, and m * 5^s < 2^127 for s <= 44. s is 8 less the exponent of f's
 * leading decimal digit, found by trying the estimate and its neighbours
 * (the truncated quotient must have nine digits); then the quotient rounds
 * half to even, as printf does (a tie cannot occur here: m * 5^s would need
 * 2^(r-1) as a factor, r >= 26, m < 2^24). A rounding up to 10^9 is what
 * printf writes too (1.00000000e+X). 0, or -1 (the caller asks snprintf). */
static int nine_digits(float f, uint64_t *digits, int *e10) {
    static const uint64_t p5[28] = {1ULL, 5ULL, 25ULL, 125ULL, 625ULL, 3125ULL, 15625ULL, 78125ULL, 390625ULL,
                                    1953125ULL, 9765625ULL, 48828125ULL, 244140625ULL, 1220703125ULL,
                                    6103515625ULL, 30517578125ULL, 152587890625ULL, 762939453125ULL,
                                    3814697265625ULL, 19073486328125ULL, 95367431640625ULL, 476837158203125ULL,
                                    2384185791015625ULL, 11920928955078125ULL, 59604644775390625ULL,
                                    298023223876953125ULL, 1490116119384765625ULL, 7450580596923828125ULL};
    uint32_t bits;
    memcpy(&bits, &f, 4);
    uint32_t be = (bits >> 23) & 0xff, m = bits & 0x7fffff;
    int q = be ? (int)be - 150 : -149;
    if (be) m |= 0x800000;
    if (!m) return -1;
    int lead = q + 31 - __builtin_clz(m); /* the exponent of f's leading bit */
    int k = (int)floor(lead * 0.30102999566398120);
    for (int tries = 0; tries < 3; tries++) {
        int s = 8 - k, r = -(s + q);
        if (s < 0 || s > 44 || r < 1 || r > 127) return -1;
        unsigned __int128 p = s <= 27 ? p5[s] : (unsigned __int128)p5[27] * p5[s - 27];
        unsigned __int128 n = (unsigned __int128)m * p, qt = n >> r, rem = n - (qt << r);
        if (qt >= 1000000000) {
            k++;
            continue;
        }
        if (qt < 100000000) {
            k--;
            continue;
        }
        unsigned __int128 half = (unsigned __int128)1 << (r - 1);
        if (rem > half || (rem == half && (qt & 1))) qt++;
        *digits = (uint64_t)qt;
        *e10 = -s;
        return 0;
    }
    return -1;
}
#else
static int nine_digits(float f, uint64_t *digits, int *e10) {
    (void)f, (void)digits, (void)e10;
    return -1;
}
#endif

size_t jsonnum_format_float(float f, char *buf) {
    if (f == 0) {
        size_t n = signbit(f) ? 2 : 1;
        memcpy(buf, "-0", 3);
        if (n == 1) memcpy(buf, "0", 2);
        return n;
    }
    char *o = buf;
    if (f < 0) {
        *o++ = '-';
        f = -f;
    }
    double d = f;
    if (JSONNUM_FAST && d >= 1e-14 && d < 1e22) {
        /* Every real strictly between the midpoints to f's neighbours rounds
         * to f. The midpoints are exact doubles (a float has 24 bits), and a
         * candidate whose correctly rounded double lies strictly between them
         * is itself strictly between them: it reads back as f both through
         * strtof and through strtod followed by a cast to float. */
        uint32_t bits;
        memcpy(&bits, &f, 4);
        uint32_t bb = bits - 1, ba = bits + 1;
        float below, above;
        memcpy(&below, &bb, 4);
        memcpy(&above, &ba, 4);
        double lo = ((double)below + d) * 0.5, hi = ((double)above + d) * 0.5;
        /* k: the decimal exponent of d's leading digit. */
        int k = (int)floor(((int)((bits >> 23) & 0xff) - 127) * 0.30102999566398120);
        while (k < 21 && (k >= 0 ? d >= p10[k + 1] : d * p10[-k - 1] >= 1)) k++;
        while (k > -14 && (k >= 0 ? d < p10[k] : d * p10[-k] < 1)) k--;
        /* The shortest p whose nearest p-digit decimal lies inside, found
         * by bisection over 1..9: a p that works almost always means every
         * longer one does too (where it does not, a valid longer text comes
         * out). Scaling by an exact power of ten rounds once, so a candidate
         * may be off by one unit in its last digit near a tie; the check
         * catches it. */
        double best_r = 0;
        int best_s = 0, a = 1, b = 9;
        while (a <= b) {
            int p = (a + b) / 2;
            if (candidate(d, p - 1 - k, lo, hi, bits, &best_r)) {
                best_s = p - 1 - k;
                b = p - 1;
            } else a = p + 1;
        }
        if (best_r >= 1) return (size_t)(o - buf) + emit(o, (uint64_t)best_r, -best_s);
    }
    /* Tiny or huge values: nine significant digits always identify a float. */
    uint64_t dg9;
    int e9;
    if (d < 1e-14 && !nine_digits(f, &dg9, &e9)) return (size_t)(o - buf) + emit(o, dg9, e9);
    int n = snprintf(o, JSONNUM_BUF - (size_t)(o - buf), "%.9g", d);
    return (size_t)(o - buf) + (size_t)(n > 0 ? n : 0);
}
