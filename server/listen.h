/* listen.h - the listening sockets of kiln's front ends (HTTP, gRPC).
 *
 * Each I/O thread has its own socket on the port, with SO_REUSEPORT (the
 * kernel spreads connections over them). SO_REUSEPORT would also let a
 * second kiln share the port silently, so a front end first binds a probe
 * without it, which fails when anything already listens there.
 *
 * Threads: no shared state. */
#ifndef KILN_LISTEN_H
#define KILN_LISTEN_H

#include <stddef.h>

/* Binds addr:port (port 0 = any free one) and listens unless probe; sets
 * *bound_port to the port bound. Returns the non-blocking socket, or -1
 * with err set; messages name --<flag>-address and --<flag>-port. */
int listen_socket(const char *flag, const char *addr, int port, int probe, int *bound_port, char *err,
                  size_t err_len);

#endif
