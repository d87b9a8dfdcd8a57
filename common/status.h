/* status.h - the one status enum of kiln, and its one table.
 *
 * Every function that can fail returns 0 (STATUS_OK) or a negative status.
 * Messages travel separately, in a caller-provided buffer (char *err,
 * size_t err_len); nothing reads a message to learn what kind of failure
 * it was: a caller that must tell two cases apart gets two statuses.
 *
 * STATUS_MAP is the only place a status is given its meaning at the edges
 * (as libuv's UV_ERRNO_MAP): the HTTP code and reason phrase, the gRPC
 * code, and the reason label of kiln_inference_request_failure. Triton's
 * mapping: 400 invalid, 404 unknown model, 503 not ready / queue full /
 * timed out, 500 internal, 501 not implemented. The HTTP-only rows (405 to
 * 505) are the statuses of the HTTP front end's own checks; the gRPC codes
 * on them are what the gRPC front end answers for the same kind of case. */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

#include <stddef.h>

/* gRPC's canonical codes (google.rpc.Code) that kiln answers. */
enum grpc_code {
    GRPC_OK = 0,
    GRPC_CANCELLED = 1,
    GRPC_INVALID_ARGUMENT = 3,
    GRPC_DEADLINE_EXCEEDED = 4,
    GRPC_NOT_FOUND = 5,
    GRPC_RESOURCE_EXHAUSTED = 8,
    GRPC_UNIMPLEMENTED = 12,
    GRPC_INTERNAL = 13,
    GRPC_UNAVAILABLE = 14,
    GRPC_UNAUTHENTICATED = 16,
};

/* The reason labels of a failed inference in the metrics, in the order
 * /metrics prints them. NONE is success's. */
#define STATUS_REASON_MAP(X)                                                                                           \
    X(NONE, "")                                                                                                        \
    X(INVALID, "invalid")                                                                                              \
    X(UNAVAILABLE, "unavailable")                                                                                      \
    X(TIMEOUT, "timeout")                                                                                              \
    X(CANCELLED, "cancelled")                                                                                          \
    X(INTERNAL, "internal")

enum status_reason {
#define STATUS_REASON_ENUM_(name, label) STATUS_REASON_##name,
    STATUS_REASON_MAP(STATUS_REASON_ENUM_)
#undef STATUS_REASON_ENUM_
    STATUS_REASON_N_
};

/* X(name, value, HTTP code, HTTP reason phrase, gRPC code, metrics reason,
 * description). Values run 0, -1, -2, ... without a gap; rows that share
 * an HTTP code share its phrase. */
#define STATUS_MAP(X)                                                                                                  \
    X(OK, 0, 200, "OK", GRPC_OK, NONE, "success")                                                                      \
    X(INVALID, -1, 400, "Bad Request", GRPC_INVALID_ARGUMENT, INVALID, "bad input from the user")                      \
    X(NOT_FOUND, -2, 404, "Not Found", GRPC_NOT_FOUND, INVALID, "unknown model, version, tensor or region")            \
    X(UNAVAILABLE, -3, 503, "Service Unavailable", GRPC_UNAVAILABLE, UNAVAILABLE,                                      \
      "not ready, unloading or shutting down")                                                                         \
    X(UNSUPPORTED, -4, 501, "Not Implemented", GRPC_UNIMPLEMENTED, INTERNAL, "valid but not implemented")              \
    X(INTERNAL, -5, 500, "Internal Server Error", GRPC_INTERNAL, INTERNAL, "a bug or a vendor failure")                \
    X(NOMEM, -6, 500, "Internal Server Error", GRPC_INTERNAL, INTERNAL, "allocation failed")                           \
    /* The answer goes nowhere (the client left); 400 for the log. */                                                  \
    X(CANCELLED, -7, 400, "Bad Request", GRPC_CANCELLED, CANCELLED, "the client went away")                            \
    /* A node's output shape depends on values computed at run time (NonZero,                                          \
     * NonMaxSuppression, TopK of a computed K): no plan per input shape can                                           \
     * hold it; the model runs such requests node by node (models/valrun.h). */                                        \
    X(DATA_DEPENDENT, -8, 501, "Not Implemented", GRPC_UNIMPLEMENTED, INTERNAL,                                        \
      "an output shape depends on values computed at run time")                                                        \
    X(TIMEOUT, -9, 503, "Service Unavailable", GRPC_UNAVAILABLE, TIMEOUT,                                              \
      "the queue policy's timeout passed while the request was queued")                                                \
    /* Triton's answer to a call dropped at its grpc-timeout. */                                                       \
    X(DEADLINE, -10, 503, "Service Unavailable", GRPC_DEADLINE_EXCEEDED, TIMEOUT,                                      \
      "the client's deadline passed while the request was queued")                                                     \
    X(QUEUE_FULL, -11, 503, "Service Unavailable", GRPC_UNAVAILABLE, UNAVAILABLE, "the model's queue is full")         \
    X(UNAUTHENTICATED, -12, 401, "Unauthorized", GRPC_UNAUTHENTICATED, INVALID,                                        \
      "the control token is missing or wrong")                                                                         \
    /* Triton answers an RPC its restricted-protocol settings refuse UNAVAILABLE. */                                   \
    X(DISABLED, -13, 400, "Bad Request", GRPC_UNAVAILABLE, INVALID, "this server was started without the feature")     \
    X(TOO_LARGE, -14, 413, "Payload Too Large", GRPC_RESOURCE_EXHAUSTED, INVALID, "the request is over a size limit")  \
    X(EXHAUSTED, -15, 503, "Service Unavailable", GRPC_RESOURCE_EXHAUSTED, UNAVAILABLE,                                \
      "a limit on what the server holds at once is reached")                                                           \
    X(METHOD, -16, 405, "Method Not Allowed", GRPC_UNIMPLEMENTED, INVALID, "the route does not take this method")      \
    X(MEDIA_TYPE, -17, 415, "Unsupported Media Type", GRPC_UNIMPLEMENTED, INVALID,                                     \
      "an encoding or content type kiln does not read")                                                                \
    X(IO_TIMEOUT, -18, 408, "Request Timeout", GRPC_DEADLINE_EXCEEDED, INVALID,                                        \
      "the request did not arrive in time")                                                                            \
    X(EXPECTATION, -19, 417, "Expectation Failed", GRPC_INVALID_ARGUMENT, INVALID, "an Expect kiln does not meet")     \
    X(HEADERS_TOO_LARGE, -20, 431, "Request Header Fields Too Large", GRPC_RESOURCE_EXHAUSTED, INVALID,                \
      "the request's headers are over their limit")                                                                    \
    X(HTTP_VERSION, -21, 505, "HTTP Version Not Supported", GRPC_UNIMPLEMENTED, INVALID,                               \
      "a protocol version kiln does not speak")

enum status {
#define STATUS_ENUM_(name, value, http, phrase, grpc, reason, desc) STATUS_##name = value,
    STATUS_MAP(STATUS_ENUM_)
#undef STATUS_ENUM_
};

/* The number of statuses: they run from 0 down to -(STATUS_N_ - 1). */
#define STATUS_N_ 22

/* A constant name such as "INVALID"; "UNKNOWN" for a value not in the table. */
const char *status_str(int status);
/* A constant description of the kind of failure, such as "the model's queue is full". */
const char *status_desc(int status);
/* The HTTP status code; 500 for a value not in the table. */
int status_http(int status);
/* The reason phrase of an HTTP code (from the first row with that code);
 * "Error" for a code no row has. */
const char *status_http_phrase(int http_code);
/* The gRPC code; INTERNAL for a value not in the table. */
enum grpc_code status_grpc(int status);
/* The reason label of a failed request in the metrics; INTERNAL's for a
 * value not in the table. */
enum status_reason status_reason(int status);
/* The label of a reason, such as "timeout". */
const char *status_reason_str(enum status_reason reason);

/* Formats into err (if non-NULL) and returns status; for one-line error returns:
 *   return status_set(err, err_len, STATUS_INVALID, "input '%s': ...", name); */
int status_set(char *err, size_t err_len, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
