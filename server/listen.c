/* listen.c - listening sockets for the front ends: see listen.h. */
#include "server/listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/status.h"

int listen_socket(const char *flag, const char *addr, int port, int probe, int *bound_port, char *err,
                  size_t err_len) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(addr, ps, &hints, &res);
    if (rc) {
        status_set(err, err_len, STATUS_INVALID, "--%s-address %s: %s", flag, addr, gai_strerror(rc));
        return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (!probe) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
        /* Accepted sockets inherit it on Linux: no Nagle delay on the last segment of a reply. */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) || (!probe && listen(fd, 1024))) {
        int e = errno;
        status_set(err, err_len, STATUS_UNAVAILABLE, "cannot listen on %s port %d: %s%s%s%s", addr, port, strerror(e),
                   e == EADDRINUSE ? " (another server uses it: pick another --" : "", e == EADDRINUSE ? flag : "",
                   e == EADDRINUSE ? "-port)" : "");
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}
