/* grpc.h - kiln's gRPC front end: the KServe v2 gRPC protocol as Triton
 * speaks it (service inference.GRPCInferenceService), so tritonclient.grpc
 * works unchanged.
 *
 * It attaches to the runtime (server/runtime.h) as HTTP does, a peer: each
 * of the runtime's loops gets its own SO_REUSEPORT listener on the gRPC
 * port, its connections (HTTP/2 through nghttp2 over a bufferevent) stay on
 * that loop, and inference goes through the same inference core
 * (server/infer.h) as HTTP: the same validation, result cache, batcher and
 * statistics; completions come back through the loops' job queues. Model
 * load and unload run on the runtime's control thread. Messages are protobuf-c code generated at build time from
 * the descriptors in the pinned tritonclient package (tools/grpc_descriptors.py).
 *
 * Threads: create before runtime_start and free after runtime_stop, from
 * the thread that owns the runtime (main); begin_drain from that thread
 * while the loops run. */
#ifndef KILN_GRPC_H
#define KILN_GRPC_H

#include <stddef.h>
#include <stdint.h>

#include "config/server_config.h"
#include "server/repository.h"
#include "server/runtime.h"

typedef struct grpc_server grpc_server_t;

struct grpc_server_params {
    const struct server_config *config; /* borrowed: grpc_address, grpc_port, max_request_size */
    repository_t *repo;                 /* borrowed */
    runtime_t *runtime;                 /* borrowed: the loops, the core, the drain state */
};

/* One gRPC message on the wire: a protobuf-c message packed after its
 * 5-byte prefix (uncompressed flag, big-endian length). malloc'd; NULL when
 * out of memory. For the server's answers and kiln bench's requests. */
struct ProtobufCMessage;
uint8_t *grpc_frame(const struct ProtobufCMessage *m, size_t *len);

/* Binds --grpc-address:--grpc-port and listens on every loop. NULL with
 * err set on failure. Nothing is answered before runtime_start, which
 * commands/serve.c logs as "listening on grpc://...". */
grpc_server_t *grpc_server_create(const struct grpc_server_params *p, char *err, size_t err_len);
/* The port actually bound (useful with --grpc-port 0). */
int grpc_server_port(const grpc_server_t *s);
/* After runtime_leave or runtime_begin_drain: health Watch calls are told
 * NOT_SERVING (on their loops, in the background). Once; NULL is a no-op. */
void grpc_server_begin_drain(grpc_server_t *s);
/* Closes the listeners and every connection: a GOAWAY after the answers
 * the connections still hold. Requests still in the core answer nobody.
 * NULL is a no-op. */
void grpc_server_free(grpc_server_t *s);

#endif
