/* http_coding.h - HTTP content codings (gzip, deflate): the request body's
 * Content-Encoding inflated under a size limit, the answer compressed as
 * Accept-Encoding asks (RFC 9110 12.5.3, q-values included). Plain
 * functions over memory: no connection, no allocation kept. */
#ifndef KILN_HTTP_CODING_H
#define KILN_HTTP_CODING_H

#include <stddef.h>

enum http_coding { HTTP_CODING_IDENTITY, HTTP_CODING_GZIP, HTTP_CODING_DEFLATE };

/* The coding an answer goes out in for this Accept-Encoding value (NULL:
 * none sent): the acceptable one (q > 0) of gzip and deflate with the
 * highest q, gzip on a tie; identity when neither is acceptable, even when
 * identity itself is refused ("identity;q=0", "*;q=0"), as a server may
 * ignore the header rather than answer 406. Codings not named take the q
 * of "*", or are not acceptable without one. */
enum http_coding http_coding_accepted(const char *accept_encoding);

/* The Content-Encoding value of a coding ("gzip", "deflate"; NULL for identity). */
const char *http_coding_name(enum http_coding c);

/* Inflates in[0..n) of the given Content-Encoding value into *out (malloc'd,
 * one spare byte for a terminator, *out_len bytes), at most limit bytes.
 * deflate is the zlib format (RFC 9110), or raw deflate as some clients
 * send it. 0, or a status (common/status.h) with err set: MEDIA_TYPE (415)
 * for a coding other than gzip, x-gzip or deflate, TOO_LARGE (413) past
 * limit, INVALID (400) for data that is not that coding or has bytes after
 * its end, NOMEM. */
int http_coding_inflate(const char *encoding, const unsigned char *in, size_t n, size_t limit, unsigned char **out,
                        size_t *out_len, char *err, size_t err_len);

/* The same for any caller (gRPC's messages too): in[0..n) coded with c
 * (gzip; deflate as the zlib format, or raw) inflated into *out (malloc'd,
 * one spare byte, *out_len bytes), never more than limit + 1 bytes held.
 * 0, or a status: TOO_LARGE past limit, INVALID for data that is not c
 * (*extra > 0: that many bytes after its end) or for identity, NOMEM. */
int http_coding_unpack(enum http_coding c, const unsigned char *in, size_t n, size_t limit, unsigned char **out,
                       size_t *out_len, size_t *extra);

/* Compresses in[0..n) with c (not identity) into *out (malloc'd, *out_len
 * bytes); sizes past 4 GiB are fed to zlib in pieces. -1 when out of
 * memory or zlib fails. */
int http_coding_deflate(enum http_coding c, const unsigned char *in, size_t n, unsigned char **out, size_t *out_len);

#endif
