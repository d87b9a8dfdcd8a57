/* bench_grpc.h - `kiln bench`'s gRPC client: unary calls over one HTTP/2
 * connection (nghttp2's client session on a libevent bufferevent), and the
 * ModelInferRequest a KServe v2 / Triton gRPC server takes, with its
 * tensors in raw_input_contents (what tritonclient.grpc sends).
 *
 * Threads: one event loop; every function on its thread. */
#ifndef KILN_BENCH_GRPC_H
#define KILN_BENCH_GRPC_H

#include <stddef.h>
#include <stdint.h>

#include "common/tensor.h"

struct event_base;
typedef struct bench_grpc_conn bench_grpc_conn_t;

/* A call's end: status is its grpc-status (0 = OK), or -1 when the
 * connection failed first; msg its grpc-message ("" when none), borrowed
 * for the call. Runs on the loop, never inside bench_grpc_call. */
typedef void (*bench_grpc_done_fn)(void *arg, int status, const char *msg);

/* Connects to host:port (the connection opens in the background; calls
 * made before it is up wait for it). A call with no answer after
 * timeout_ms fails the connection. NULL with a message on stderr when the
 * address does not resolve. */
bench_grpc_conn_t *bench_grpc_connect(struct event_base *base, const char *host, int port, int timeout_ms);
/* Starts a call of method path ("/package.Service/Method") with msg, a
 * framed message (5-byte prefix), borrowed until done runs. 0, or -1 when
 * the connection is gone (done is not called). */
int bench_grpc_call(bench_grpc_conn_t *c, const char *path, const uint8_t *msg, size_t len, bench_grpc_done_fn done,
                    void *arg);
/* Closes the connection; calls still open end with status -1 first. NULL is a no-op. */
void bench_grpc_free(bench_grpc_conn_t *c);

/* A framed ModelInferRequest for model (version: NULL = the server's
 * choice) with n inputs, input i named names[i] with tensor t[i]'s type,
 * shape and bytes. malloc'd; NULL when out of memory. */
uint8_t *bench_grpc_infer_request(const char *model, const char *version, const char *const *names,
                                  const struct tensor *t, int n, size_t *len);

#endif
