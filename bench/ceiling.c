/* ceiling.c - the minimal libevent HTTP server, the reference for kiln's
 * front end: N threads, each its own event_base and libevent's evhttp on
 * one listening socket, reading the body and answering a fixed KServe-style
 * JSON response, doing no parsing and no inference. kiln's front end was
 * evhttp too; it now runs its own HTTP/1.1 (server/http_conn.c), which does
 * less per request than evhttp, so kiln can pass this "ceiling" while it
 * also parses and runs the model (docs/benchmarks.md, section 2d). GETs (what `kiln bench` reads before
 * it starts: model metadata and config) get the digits model's, so both load
 * generators can drive it.
 *   build/ceiling PORT [THREADS] */
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char BODY[] =
    "{\"model_name\":\"digits\",\"model_version\":\"1\",\"outputs\":[{\"name\":\"label\",\"datatype\":\"INT64\","
    "\"shape\":[1],\"data\":[8]},{\"name\":\"probabilities\",\"datatype\":\"FP32\",\"shape\":[1,10],\"data\":[0.0,"
    "0.0,0.0,0.0,0.0,0.0,0.0,0.0,1.0,0.0]}]}";

static const char METADATA[] =
    "{\"name\":\"digits\",\"versions\":[\"1\"],\"platform\":\"onnxruntime_onnx\",\"inputs\":[{\"name\":\"input\","
    "\"datatype\":\"FP32\",\"shape\":[-1,64]}],\"outputs\":[{\"name\":\"label\",\"datatype\":\"INT64\",\"shape\":[-1]},"
    "{\"name\":\"probabilities\",\"datatype\":\"FP32\",\"shape\":[-1,10]}]}";
static const char CONFIG[] = "{\"name\":\"digits\",\"max_batch_size\":64}";

static void on_request(struct evhttp_request *req, void *arg) {
    (void)arg;
    if (evhttp_request_get_command(req) == EVHTTP_REQ_GET) {
        const char *uri = evhttp_request_get_uri(req);
        size_t n = strlen(uri);
        int config = n >= 7 && strcmp(uri + n - 7, "/config") == 0;
        struct evbuffer *out = evbuffer_new();
        evbuffer_add(out, config ? CONFIG : METADATA, config ? sizeof CONFIG - 1 : sizeof METADATA - 1);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
        evhttp_send_reply(req, 200, "OK", out);
        evbuffer_free(out);
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    evbuffer_drain(in, evbuffer_get_length(in));
    struct evbuffer *out = evbuffer_new();
    evbuffer_add_reference(out, BODY, sizeof BODY - 1, NULL, NULL);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, 200, "OK", out);
    evbuffer_free(out);
}

static void *serve(void *arg) {
    evutil_socket_t fd = (evutil_socket_t)(intptr_t)arg;
    struct event_base *base = event_base_new();
    struct evhttp *http = evhttp_new(base);
    evhttp_set_gencb(http, on_request, NULL);
    evhttp_accept_socket(http, fd);
    event_base_dispatch(base);
    return NULL;
}

/* One listening socket per thread on the same port (SO_REUSEPORT: the kernel
 * spreads connections over the threads) with TCP_NODELAY, as kiln's front end
 * does: a ceiling built any weaker would flatter kiln. A single socket shared
 * by every thread's evhttp loses throughput at high concurrency (every loop
 * wakes for each connection and the first to accept keeps it). */
static int listen_on(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (fd < 0) return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 1024) < 0) {
        close(fd);
        return -1;
    }
    evutil_make_socket_nonblocking(fd);
    return fd;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ceiling PORT [THREADS]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int port = atoi(argv[1]), threads = argc > 2 ? atoi(argv[2]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (port <= 0 || port > 65535) {
        fprintf(stderr, "ceiling: port '%s' is not in 1..65535\n", argv[1]);
        return 2;
    }
    pthread_t t[64];
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    for (int i = 0; i < threads; i++) {
        int fd = listen_on(port);
        if (fd < 0) {
            perror("ceiling: bind/listen");
            return 1;
        }
        pthread_create(&t[i], NULL, serve, (void *)(intptr_t)fd);
    }
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    return 0;
}
