/* grpc.h - kiln's gRPC front end: the KServe v2 gRPC protocol as Triton
 * speaks it (service inference.GRPCInferenceService), so tritonclient.grpc
 * works unchanged.
 *
 * It runs on the HTTP front end's I/O threads: each loop gets its own
 * SO_REUSEPORT listener on the gRPC port, its connections (HTTP/2 through
 * nghttp2 over a bufferevent) stay on that loop, and inference goes through
 * the same inference core (server/infer.h) as HTTP: the same validation,
 * result cache, batcher and statistics; completions come back through the
 * same queues. Messages are protobuf-c code generated at build time from
 * the descriptors in the pinned tritonclient package (tools/grpc_descriptors.py).
 *
 * Threads: create and free from the thread that made the HTTP server (main),
 * after http_server_create and before http_server_free. */
#ifndef KILN_GRPC_H
#define KILN_GRPC_H

#include <stddef.h>
#include <stdint.h>

#include "config/server_config.h"
#include "server/http.h"
#include "server/repository.h"

typedef struct grpc_server grpc_server_t;

struct grpc_server_params {
    const struct server_config *config; /* borrowed: grpc_address, grpc_port, max_request_size */
    repository_t *repo;                 /* borrowed */
    http_server_t *http;                /* borrowed: its I/O threads, core and drain state */
};

/* One gRPC message on the wire: a protobuf-c message packed after its
 * 5-byte prefix (uncompressed flag, big-endian length). malloc'd; NULL when
 * out of memory. For the server's answers and kiln bench's requests. */
struct ProtobufCMessage;
uint8_t *grpc_frame(const struct ProtobufCMessage *m, size_t *len);

/* Binds --grpc-address:--grpc-port and starts listening on every I/O
 * thread. NULL with err set on failure. */
grpc_server_t *grpc_server_create(const struct grpc_server_params *p, char *err, size_t err_len);
/* The port actually bound (useful with --grpc-port 0). */
int grpc_server_port(const grpc_server_t *s);
/* After http_server_begin_drain: health Watch calls are told NOT_SERVING
 * (on their loops, in the background). NULL is a no-op. */
void grpc_server_begin_drain(grpc_server_t *s);
/* Closes the listeners and every connection (from their own threads, and
 * waits for them). Requests still in the core answer nobody. NULL is a no-op. */
void grpc_server_free(grpc_server_t *s);

#endif
