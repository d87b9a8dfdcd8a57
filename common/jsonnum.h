/* jsonnum.h - JSON numbers without the C library's general-purpose paths.
 *
 * The KServe JSON codec reads and writes many small numbers per request;
 * strtod (with the locale lookup around it) and printf("%.9g") were the
 * largest parts of its CPU time. These functions cover the common cases
 * with plain arithmetic and fall back to the C library for the rest, so
 * their results never differ from it:
 *
 * - jsonnum_parse reads one number in strict JSON syntax and returns the
 *   double strtod would return for the same text, bit for bit.
 * - jsonnum_format_float writes a float as the shortest (or nearly shortest)
 *   decimal that reads back as the same float, whether the reader rounds the
 *   text straight to float (strtof) or to double first ((float)strtod).
 *
 * Both use the "C" locale's syntax ('.' as the decimal point). No state;
 * any thread. */
#ifndef KILN_JSONNUM_H
#define KILN_JSONNUM_H

#include <stddef.h>
#include <stdint.h>

/* Room for any output of the formatters below, NUL included. */
#define JSONNUM_BUF 32

/* Reads the JSON number (RFC 8259 grammar: -?int frac? exp?) starting at p,
 * which must lie before end. On success stores its value in *out, the first
 * byte after it in *next and returns 0. Returns -1 when the text at p is not
 * such a number (nothing stored); the bytes after the number are not checked.
 * Values beyond the double range read as +-HUGE_VAL, as with strtod. */
int jsonnum_parse(const char *p, const char *end, double *out, const char **next);

/* Reads the run of JSON numbers separated by commas (JSON whitespace
 * around them) that starts at p, into out as floats ((float) of what
 * jsonnum_parse reads): at most max, stopping before an element that is
 * not a number or is beyond float's range. Returns how many were read;
 * *next is the byte after the last of them (p when none). A request's
 * float data is such a run: the loop here keeps the common numbers' reader
 * inline. */
size_t jsonnum_parse_f32_run(const char *p, const char *end, float *out, size_t max, const char **next);

/* What jsonnum_parse_int found at p. */
enum jsonnum_int {
    JSONNUM_INT = 0,        /* a plain integer (-?digits): *neg and *mag hold it exactly */
    JSONNUM_INT_BIG = 1,    /* a plain integer whose magnitude passes UINT64_MAX */
    JSONNUM_NOT_INT = 2,    /* a number with a fraction or an exponent: read it with jsonnum_parse */
};

/* Reads the JSON integer starting at p (before end) exactly: its sign in
 * *neg, its magnitude in *mag and the first byte after it in *next, and
 * returns enum jsonnum_int; -1 when the text at p is not a JSON number
 * (as far as its integer part shows). 64-bit values need this: a double
 * holds integers exactly only up to 2^53. */
int jsonnum_parse_int(const char *p, const char *end, int *neg, uint64_t *mag, const char **next);

/* Writes finite f to buf (JSONNUM_BUF bytes), NUL-terminated, in printf's %g
 * style ("0.25", "-3", "1.5e-07", "-0"), and returns its length. The text is
 * a valid JSON number that reads back as exactly f. f must be finite. */
size_t jsonnum_format_float(float f, char *buf);

/* Decimal integers into buf (JSONNUM_BUF bytes), NUL-terminated; return
 * the length. */
size_t jsonnum_format_i64(int64_t v, char *buf);
size_t jsonnum_format_u64(uint64_t v, char *buf);

#endif
