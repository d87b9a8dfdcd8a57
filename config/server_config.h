/* server_config.h - the configuration of `kiln serve`.
 *
 * Every setting has one name used three ways: a flag (--http-port 8000), an
 * environment variable (KILN_HTTP_PORT=8000) and a key of the JSON file given
 * with --config (either "http_port" or "http-port"). Precedence: flag >
 * environment > file > default. server_config_usage() prints the table that
 * `kiln serve --help` shows, generated from the same option list so the help
 * cannot drift from the parser. */
#ifndef KILN_SERVER_CONFIG_H
#define KILN_SERVER_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SERVER_CONFIG_MAX_LOAD 64

enum server_control_mode {
    SERVER_CONTROL_NONE = 0,     /* load everything at start; load/unload API refused */
    SERVER_CONTROL_EXPLICIT = 1, /* load only --load-model at start; API loads/unloads */
    SERVER_CONTROL_POLL = 2,     /* load everything, rescan every --repository-poll-secs */
};

struct server_config {
    char *model_repository;
    char *http_address;          /* "127.0.0.1", "0.0.0.0" */
    int http_port;
    int allow_grpc;              /* 1 = serve gRPC too (default) */
    char *grpc_address;          /* NULL = http_address */
    int grpc_port;               /* 0 = any free port */
    int64_t grpc_max_message_size; /* bytes of one gRPC request message; 0 = max_request_size */
    int64_t grpc_max_buffered_bytes; /* unfinished request bytes of one gRPC connection; 0 = 2 x the message size */
    int64_t grpc_max_buffered_total; /* unfinished request bytes of all gRPC connections; 0 = 8 x the message size */
    int http_threads;            /* 0 = number of cores */
    int text_threads;            /* threads that tokenize long texts off the I/O threads; 0 = none */
    char *backend;               /* "auto", "cpu", "cuda" */
    char *log_level;             /* "error", "warn", "info", "debug" */
    char *log_format;            /* "text", "json" */
    int64_t max_request_size;    /* bytes; larger bodies get 413 */
    int64_t max_model_upload_size; /* bytes of model files one load request may carry; 0 = uploads refused */
    int64_t max_request_memory;  /* bytes one request may make kiln allocate; 0 = from the machine */
    int exit_timeout_secs;       /* drain limit on SIGTERM */
    int shutdown_delay_secs;     /* on SIGTERM: not ready, still serving, this long before the drain */
    int inline_max_us;           /* batcher_params.inline_max_ns, in us; 0 = off */
    int http_timeout_secs;       /* idle read/write timeout of a connection */
    int http_header_timeout_secs; /* total time a request's header may take to arrive */
    int http_body_timeout_secs;  /* total time a request's body may take to arrive */
    int max_connections;         /* open HTTP and gRPC connections; more are shed; 0 = from the fd limit */
    enum server_control_mode model_control_mode;
    int repository_poll_secs;
    char *load_model[SERVER_CONFIG_MAX_LOAD]; /* names; "*" = all */
    int nload_model;
    char *openai_api_keys;       /* comma-separated; NULL = /v1/ open */
    char *control_token;         /* NULL = load/unload open (allowed on loopback, or with the flag below) */
    int allow_unauthenticated_control; /* 1 = explicit/poll control without a token on any address */
    int max_model_instances;     /* bound on a model's instances (groups summed); 0 = 4 x cores */
    int max_intra_op_threads;    /* bound on parameters.intra_op_thread_count; 0 = cores */
    /* Result cache settings, read by cache/. */
    int64_t cache_size;          /* bytes of the in-process cache; 0 = off */
    char *redis_url;             /* NULL = no Redis tier */
    int cache_ttl_secs;
    char *cache_secret;          /* key for the keyed hash; NULL = random per start */
    int redis_timeout_ms;        /* a Redis lookup's wait for its reply; 0 = cache/'s default */
    char *config_file;           /* the --config path, if any */
    /* Client shared memory (server/shm.h). */
    int allow_client_shm;        /* 1 = clients may register shared-memory regions; off by default */
    char *shm_key_prefix;        /* NULL = any key; else keys must start with it */
    int shm_max_regions;         /* regions in the server; 0 = 1024 */
    int shm_max_regions_per_client; /* regions of one connection (or of the control token); 0 = 64 */
    int64_t shm_max_bytes;       /* bytes of system regions registered in all; 0 = half the physical memory */
};

/* Fills the defaults. */
void server_config_init(struct server_config *c);
/* Frees owned strings; the struct can be reused after server_config_init. */
void server_config_clear(struct server_config *c);

/* Builds the configuration from argv (argv[0] = "serve"), the environment and
 * the --config file. Returns 0, 1 when --help was asked (usage printed to
 * stdout), or a negative status with err naming the flag, variable or key.
 * Explicit or poll model control on an address that is not loopback needs
 * --control-token or --allow-unauthenticated-control; an empty token is an
 * error. */
int server_config_load(struct server_config *c, int argc, char **argv,
                       char *err, size_t err_len);

/* Applies one setting by its flag name without dashes ("http-port" or
 * "http_port"); source names the origin for messages ("flag", "KILN_HTTP_PORT",
 * "kiln.json"). Exposed for tests. */
int server_config_set(struct server_config *c, const char *name, const char *value,
                      const char *source, char *err, size_t err_len);

void server_config_usage(FILE *f);

/* --max-request-memory, or its default from the machine: a quarter of the
 * physical memory, at most 4 GiB and at least 64 MiB. */
int64_t server_config_max_request_memory(const struct server_config *c);

/* 1 when addr is a loopback address (127.0.0.0/8, ::1, localhost). */
int server_config_is_loopback(const char *addr);
/* 1 when load/unload (explicit or poll mode) need no token on an address
 * that is not loopback: allowed only with allow_unauthenticated_control. */
int server_config_control_unprotected(const struct server_config *c);

const char *server_control_mode_name(enum server_control_mode m);

#endif
