/* status.h - the one status enum of kiln.
 *
 * Every function that can fail returns 0 (STATUS_OK) or a negative status.
 * The HTTP edge maps them to Triton's codes: INVALID 400, NOT_FOUND 404,
 * UNAVAILABLE 503, UNSUPPORTED and DATA_DEPENDENT 501, everything else 500. Messages travel
 * separately, in a caller-provided buffer (char *err, size_t err_len). */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

#include <stddef.h>

enum status {
    STATUS_OK = 0,
    STATUS_INVALID = -1,     /* bad input from the user: 400 */
    STATUS_NOT_FOUND = -2,   /* unknown model, version, tensor: 404 */
    STATUS_UNAVAILABLE = -3, /* not ready, queue full, timed out: 503 */
    STATUS_UNSUPPORTED = -4, /* valid but not implemented: 501 */
    STATUS_INTERNAL = -5,    /* a bug or a vendor failure: 500 */
    STATUS_NOMEM = -6,       /* allocation failed or a limit was hit: 500 */
    STATUS_CANCELLED = -7,   /* the client went away */
    /* A node's output shape depends on values computed at run time (NonZero,
     * NonMaxSuppression, TopK of a computed K): no plan per input shape can
     * hold it; the model runs such requests node by node (models/valrun.h).
     * 501 if it ever reaches a client. */
    STATUS_DATA_DEPENDENT = -8,
};

/* Returns a constant name such as "INVALID". */
const char *status_str(int status);

/* Returns the HTTP status code for a status. */
int status_http_code(int status);

/* Formats into err (if non-NULL) and returns status; for one-line error returns:
 *   return status_set(err, err_len, STATUS_INVALID, "input '%s': ...", name); */
int status_set(char *err, size_t err_len, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
