#include "config/server_config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <strings.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cjson/cJSON.h>

#include "common/file.h"
#include "common/status.h"

/* ---- the option table --------------------------------------------------- */

/* OPT_BOOL may be given bare (--flag means true) or with a value: 1/0, true/false, yes/no. */
enum opt_kind { OPT_STR, OPT_INT, OPT_SIZE, OPT_LIST, OPT_FLAGONLY, OPT_BOOL };

struct opt {
    const char *name;     /* flag name without "--" */
    enum opt_kind kind;
    const char *arg;      /* placeholder in --help */
    const char *def;      /* default as shown in --help */
    const char *help;
};

static const struct opt g_opts[] = {
    {"model-repository", OPT_STR, "PATH", "model_repository", "folder of models in Triton's layout: <model>/<version>/model.onnx, optional <model>/config.json"},
    {"http-address", OPT_STR, "ADDR", "0.0.0.0", "address to listen on"},
    {"http-port", OPT_INT, "PORT", "8000", "HTTP port (0 = any free port, printed at start)"},
    {"allow-grpc", OPT_BOOL, "", "true", "serve the KServe v2 gRPC protocol (Triton's inference.GRPCInferenceService) too"},
    {"grpc-address", OPT_STR, "ADDR", "--http-address", "address the gRPC front end listens on"},
    {"grpc-port", OPT_INT, "PORT", "8001", "gRPC port (0 = any free port, printed at start)"},
    {"grpc-max-message-size", OPT_SIZE, "BYTES", "--max-request-size", "largest gRPC request message (suffixes K, M, G); larger gets RESOURCE_EXHAUSTED"},
    {"grpc-max-buffered-bytes", OPT_SIZE, "BYTES", "2 x --grpc-max-message-size", "unfinished request bytes one gRPC connection may hold across its calls; the call that passes it gets RESOURCE_EXHAUSTED"},
    {"grpc-max-buffered-total", OPT_SIZE, "BYTES", "8 x --grpc-max-message-size", "unfinished request bytes all gRPC connections together may hold; the call that passes it gets RESOURCE_EXHAUSTED"},
    {"http-threads", OPT_INT, "N", "cores", "I/O threads, each with its own event loop"},
    {"text-threads", OPT_INT, "N", "2", "threads that tokenize long /v1/embeddings texts, so that the I/O threads never wait on them (0 = every text on its I/O thread); a request that finds their queue full gets 503"},
    {"http-timeout-secs", OPT_INT, "S", "60", "idle timeout of an HTTP or gRPC connection (no byte read or written; a gRPC connection with a call open is not idle)"},
    {"http-header-timeout-secs", OPT_INT, "S", "10", "total time a request's header may take to arrive (408); for gRPC, the connection preface and first call's headers (GOAWAY)"},
    {"http-body-timeout-secs", OPT_INT, "S", "60", "total time a request's body may take to arrive (408); for gRPC, each request message once begun (DEADLINE_EXCEEDED)"},
    {"max-connections", OPT_INT, "N", "fd limit less 1/8 (32-4096)", "open HTTP and gRPC connections together; one beyond them gets 503 (gRPC: UNAVAILABLE, then GOAWAY) and is closed"},
    {"backend", OPT_STR, "auto|cpu|cuda", "auto", "where models run; auto uses CUDA when a GPU is usable, else the CPU"},
    {"log-level", OPT_STR, "LEVEL", "info", "error, warn, info or debug"},
    {"log-format", OPT_STR, "text|json", "text", "log line format"},
    {"max-request-size", OPT_SIZE, "BYTES", "64M", "largest request body (suffixes K, M, G); larger gets 413"},
    {"max-model-upload-size", OPT_SIZE, "BYTES", "64M", "model files one load request may carry (Triton's parameters \"file:<version>/<name>\", decoded), written into the model's folder; more gets 413 / RESOURCE_EXHAUSTED (0 = uploads refused; suffixes K, M, G)"},
    {"max-request-memory", OPT_SIZE, "BYTES", "RAM / 4, at most 4G", "most memory one request may make kiln allocate: its JSON parse, input copies, the tensors a model sizes from the request (shapes and values), the answer's encoding; over it a 400 naming the tensor or node, before the allocation (suffixes K, M, G; at least 1M)"},
    {"exit-timeout-secs", OPT_INT, "S", "30", "on SIGTERM/SIGINT, longest wait for in-flight requests before a forced exit (counted from the drain's start, after --shutdown-delay-secs)"},
    {"shutdown-delay-secs", OPT_INT, "S", "5", "on SIGTERM, readiness turns false at once but requests are still served this long, so that load balancers' health checks take the server out before it refuses work; then the drain (0 = drain at once; SIGINT always drains at once)"},
    {"model-control-mode", OPT_STR, "none|explicit|poll", "none", "none: load all at start; explicit: load/unload through the API; poll: reload on change"},
    {"repository-poll-secs", OPT_INT, "S", "15", "rescan interval with --model-control-mode poll"},
    {"load-model", OPT_LIST, "NAME", "", "model to load at start with explicit control (repeatable; '*' = all)"},
    {"control-token", OPT_STR, "TOKEN", "", "require 'Authorization: Bearer TOKEN' for repository load/unload (an empty token is an error)"},
    {"openai-api-keys", OPT_STR, "KEY[,KEY...]", "", "require 'Authorization: Bearer KEY' on /v1/ (OpenAI's API) with any of these keys (several, so that a key can be rotated; pass them through KILN_OPENAI_API_KEYS or the config file rather than the command line)"},
    {"allow-unauthenticated-control", OPT_BOOL, "", "false", "allow explicit/poll control without --control-token on a non-loopback address (logs a warning)"},
    {"max-model-instances", OPT_INT, "N", "4 x cores", "bound on a model's instances (its instance_group counts, summed); a load asking more gets 400"},
    {"max-intra-op-threads", OPT_INT, "N", "cores", "bound on a model's parameters.intra_op_thread_count; a load asking more gets 400"},
    {"inline-max-us", OPT_INT, "US", "100", "a request to an idle CPU model that runs in at most this long on one thread runs on its I/O thread, without the hand-off to the instance's thread and back (0 = never)"},
    {"cache-size", OPT_SIZE, "BYTES", "256M", "in-process result cache size for models with response_cache.enable (0 = off; suffixes K, M, G)"},
    {"redis-url", OPT_STR, "URL", "", "redis://[user:password@]host:port[/db] for the shared result cache tier"},
    {"cache-ttl-secs", OPT_INT, "S", "300", "lifetime of a cached result"},
    {"redis-timeout-ms", OPT_INT, "MS", "50", "longest wait for Redis's answer to a lookup before computing the result (a miss); five missed in a row stop lookups for a second. Stores never wait"},
    {"cache-secret", OPT_STR, "SECRET", "random", "key of the cache's keyed hash and of its Redis values' MAC (set it to share Redis entries between servers)"},
    {"allow-client-shm", OPT_BOOL, "", "false", "let clients register system and CUDA shared-memory regions (Triton's shared memory extensions); off, registering is refused"},
    {"shm-key-prefix", OPT_STR, "PREFIX", "", "only shared-memory objects whose names start with PREFIX may be registered (empty = any of the server user's objects)"},
    {"shm-max-regions", OPT_INT, "N", "1024", "shared-memory regions registered in the server at once"},
    {"shm-max-regions-per-client", OPT_INT, "N", "64", "shared-memory regions one connection (or the control token's holders) may register"},
    {"shm-max-bytes", OPT_SIZE, "BYTES", "RAM / 2", "bytes of system shared-memory regions registered at once (suffixes K, M, G)"},
    {"config", OPT_FLAGONLY, "FILE", "", "JSON file with any of these settings (keys like \"http_port\")"},
};
#define NOPTS (int)(sizeof g_opts / sizeof g_opts[0])

enum source_rank { SRC_FILE = 1, SRC_ENV = 2, SRC_FLAG = 3 };
static int g_load_rank; /* which source last set load-model; reset per load */

void server_config_init(struct server_config *c) {
    memset(c, 0, sizeof *c);
    c->model_repository = strdup("model_repository");
    c->http_address = strdup("0.0.0.0");
    c->http_port = 8000;
    c->allow_grpc = 1;
    c->grpc_port = 8001;
    c->http_threads = 0;
    c->text_threads = 2;
    c->backend = strdup("auto");
    c->log_level = strdup("info");
    c->log_format = strdup("text");
    c->max_request_size = 64LL << 20;
    c->max_model_upload_size = 64LL << 20;
    c->exit_timeout_secs = 30;
    c->shutdown_delay_secs = 5;
    c->inline_max_us = 100;
    c->http_timeout_secs = 60;
    c->http_header_timeout_secs = 10;
    c->http_body_timeout_secs = 60;
    c->model_control_mode = SERVER_CONTROL_NONE;
    c->repository_poll_secs = 15;
    c->cache_size = 256ll << 20;
    c->cache_ttl_secs = 300;
    c->redis_timeout_ms = 50;
}

void server_config_clear(struct server_config *c) {
    free(c->model_repository);
    free(c->http_address);
    free(c->grpc_address);
    free(c->backend);
    free(c->log_level);
    free(c->log_format);
    for (int i = 0; i < c->nload_model; i++) free(c->load_model[i]);
    free(c->control_token);
    free(c->openai_api_keys);
    free(c->redis_url);
    free(c->cache_secret);
    free(c->config_file);
    free(c->shm_key_prefix);
    memset(c, 0, sizeof *c);
}

const char *server_control_mode_name(enum server_control_mode m) {
    switch (m) {
    case SERVER_CONTROL_EXPLICIT: return "explicit";
    case SERVER_CONTROL_POLL: return "poll";
    default: return "none";
    }
}

/* "http_port" and "http-port" name the same option. */
static const struct opt *opt_find(const char *name) {
    char norm[64];
    size_t n = strlen(name);
    if (n >= sizeof norm) return NULL;
    for (size_t i = 0; i <= n; i++) norm[i] = name[i] == '_' ? '-' : (char)tolower((unsigned char)name[i]);
    for (int i = 0; i < NOPTS; i++)
        if (strcmp(g_opts[i].name, norm) == 0) return &g_opts[i];
    return NULL;
}

static int parse_int(const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) return -1;
    *out = x;
    return 0;
}

static int parse_size(const char *v, int64_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || x < 0) return -1;
    int64_t mul = 1;
    if (*end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': mul = 1LL << 10; break;
        case 'M': mul = 1LL << 20; break;
        case 'G': mul = 1LL << 30; break;
        default: return -1;
        }
        end++;
        if (toupper((unsigned char)*end) == 'B' || toupper((unsigned char)*end) == 'I') end++;
        if (toupper((unsigned char)*end) == 'B') end++;
        if (*end) return -1;
    }
    if (x > INT64_MAX / mul) return -1;
    *out = x * mul;
    return 0;
}

static void set_str(char **dst, const char *v) {
    free(*dst);
    *dst = v && *v ? strdup(v) : NULL;
}

static int set_opt(struct server_config *c, const struct opt *o, const char *v, int rank,
                   const char *source, char *err, size_t err_len) {
    const char *n = o->name;
    long x;
    int64_t sz;
#define BAD(what) status_set(err, err_len, STATUS_INVALID, "%s: %s '%s' for %s: %s", source, "invalid value", v, n, what)
    if (o->kind == OPT_INT) {
        int port = strcmp(n, "http-port") == 0 || strcmp(n, "grpc-port") == 0;
        if (parse_int(v, 0, port ? 65535 : INT_MAX, &x))
            return BAD(port ? "expected a port number 0-65535" : "expected a non-negative integer");
        if (strcmp(n, "http-port") == 0) c->http_port = (int)x;
        else if (strcmp(n, "grpc-port") == 0) c->grpc_port = (int)x;
        else if (strcmp(n, "http-threads") == 0) {
            if (x > 1024) return BAD("at most 1024 threads");
            c->http_threads = (int)x;
        } else if (strcmp(n, "text-threads") == 0) {
            if (x > 256) return BAD("at most 256 threads");
            c->text_threads = (int)x;
        } else if (strcmp(n, "http-timeout-secs") == 0) c->http_timeout_secs = (int)x;
        else if (strcmp(n, "http-header-timeout-secs") == 0) {
            if (x < 1) return BAD("expected at least 1");
            c->http_header_timeout_secs = (int)x;
        } else if (strcmp(n, "http-body-timeout-secs") == 0) {
            if (x < 1) return BAD("expected at least 1");
            c->http_body_timeout_secs = (int)x;
        } else if (strcmp(n, "max-connections") == 0) c->max_connections = (int)x;
        else if (strcmp(n, "exit-timeout-secs") == 0) c->exit_timeout_secs = (int)x;
        else if (strcmp(n, "shutdown-delay-secs") == 0) {
            if (x > 3600) return BAD("expected 0-3600");
            c->shutdown_delay_secs = (int)x;
        } else if (strcmp(n, "redis-timeout-ms") == 0) {
            if (x < 1 || x > 60000) return BAD("expected 1-60000");
            c->redis_timeout_ms = (int)x;
        }
        else if (strcmp(n, "inline-max-us") == 0) {
            if (x < 0 || x > 1000000) return BAD("expected 0-1000000");
            c->inline_max_us = (int)x;
        }
        else if (strcmp(n, "repository-poll-secs") == 0) {
            if (x < 1) return BAD("expected at least 1");
            c->repository_poll_secs = (int)x;
        } else if (strcmp(n, "cache-ttl-secs") == 0) c->cache_ttl_secs = (int)x;
        else if (strcmp(n, "shm-max-regions") == 0 || strcmp(n, "shm-max-regions-per-client") == 0) {
            if (x < 1 || x > 1000000) return BAD("expected 1-1000000");
            if (strcmp(n, "shm-max-regions") == 0) c->shm_max_regions = (int)x;
            else c->shm_max_regions_per_client = (int)x;
        } else if (strcmp(n, "max-model-instances") == 0 || strcmp(n, "max-intra-op-threads") == 0) {
            if (x < 1 || x > 1024) return BAD("expected 1-1024");
            if (strcmp(n, "max-model-instances") == 0) c->max_model_instances = (int)x;
            else c->max_intra_op_threads = (int)x;
        }
        return 0;
    }
    if (o->kind == OPT_BOOL) {
        int b;
        if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes")) b = 1;
        else if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no")) b = 0;
        else return BAD("expected true or false");
        if (strcmp(n, "allow-unauthenticated-control") == 0) c->allow_unauthenticated_control = b;
        else if (strcmp(n, "allow-grpc") == 0) c->allow_grpc = b;
        else if (strcmp(n, "allow-client-shm") == 0) c->allow_client_shm = b;
        return 0;
    }
    if (o->kind == OPT_SIZE) {
        if (parse_size(v, &sz)) return BAD("expected a byte count such as 1048576 or 64M");
        if (strcmp(n, "max-request-size") == 0) {
            if (sz < 1024) return BAD("expected at least 1024 bytes");
            c->max_request_size = sz;
        } else if (strcmp(n, "grpc-max-message-size") == 0) {
            if (sz < 1024) return BAD("expected at least 1024 bytes");
            c->grpc_max_message_size = sz;
        } else if (strcmp(n, "max-model-upload-size") == 0) {
            c->max_model_upload_size = sz;
        } else if (strcmp(n, "shm-max-bytes") == 0) {
            if (sz < 1) return BAD("expected at least 1 byte");
            c->shm_max_bytes = sz;
        } else if (strcmp(n, "max-request-memory") == 0) {
            if (sz < (1 << 20)) return BAD("expected at least 1M");
            c->max_request_memory = sz;
        } else if (strcmp(n, "grpc-max-buffered-bytes") == 0 || strcmp(n, "grpc-max-buffered-total") == 0) {
            if (sz < 1024) return BAD("expected at least 1024 bytes");
            if (strcmp(n, "grpc-max-buffered-bytes") == 0) c->grpc_max_buffered_bytes = sz;
            else c->grpc_max_buffered_total = sz;
        } else c->cache_size = sz;
        return 0;
    }
    if (o->kind == OPT_LIST) { /* load-model: a higher source replaces a lower one's list */
        if (rank != g_load_rank) {
            for (int i = 0; i < c->nload_model; i++) free(c->load_model[i]);
            c->nload_model = 0;
            g_load_rank = rank;
        }
        /* Environment and file values may list several names: "a,b". */
        const char *p = v;
        while (*p) {
            const char *e = strchr(p, ',');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            if (len) {
                if (c->nload_model == SERVER_CONFIG_MAX_LOAD) return BAD("too many models");
                c->load_model[c->nload_model++] = strndup(p, len);
            }
            p += len + (e ? 1 : 0);
        }
        return 0;
    }
    if (strcmp(n, "model-repository") == 0) {
        if (!*v) return BAD("expected a folder");
        set_str(&c->model_repository, v);
    } else if (strcmp(n, "http-address") == 0) {
        if (!*v) return BAD("expected an address");
        set_str(&c->http_address, v);
    } else if (strcmp(n, "grpc-address") == 0) {
        if (!*v) return BAD("expected an address");
        set_str(&c->grpc_address, v);
    } else if (strcmp(n, "backend") == 0) {
        if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda")) return BAD("expected auto, cpu or cuda");
        set_str(&c->backend, v);
    } else if (strcmp(n, "log-level") == 0) {
        if (strcmp(v, "error") && strcmp(v, "warn") && strcmp(v, "warning") && strcmp(v, "info") &&
            strcmp(v, "debug"))
            return BAD("expected error, warn, info or debug");
        set_str(&c->log_level, v);
    } else if (strcmp(n, "log-format") == 0) {
        if (strcmp(v, "text") && strcmp(v, "json")) return BAD("expected text or json");
        set_str(&c->log_format, v);
    } else if (strcmp(n, "model-control-mode") == 0) {
        if (strcmp(v, "none") == 0) c->model_control_mode = SERVER_CONTROL_NONE;
        else if (strcmp(v, "explicit") == 0) c->model_control_mode = SERVER_CONTROL_EXPLICIT;
        else if (strcmp(v, "poll") == 0) c->model_control_mode = SERVER_CONTROL_POLL;
        else return BAD("expected none, explicit or poll");
    } else if (strcmp(n, "control-token") == 0) {
        /* Empty once meant "no authentication": it must not turn it off by accident. */
        if (!*v) return BAD("an empty token would leave load and unload open: give a token, or leave it unset");
        set_str(&c->control_token, v);
    } else if (strcmp(n, "openai-api-keys") == 0) {
        /* Every key non-empty: ",k" or "k," would read as an empty key. */
        if (!*v || strstr(v, ",,") || *v == ',' || v[strlen(v) - 1] == ',')
            return BAD("expected one or more non-empty keys, separated by commas");
        set_str(&c->openai_api_keys, v);
    }
    else if (strcmp(n, "redis-url") == 0) {
        if (*v && strncmp(v, "redis://", 8) && strncmp(v, "unix://", 7))
            return BAD("expected redis://host:port[/db] or unix:///path");
        set_str(&c->redis_url, v);
    } else if (strcmp(n, "cache-secret") == 0) set_str(&c->cache_secret, v);
    else if (strcmp(n, "config") == 0) set_str(&c->config_file, v);
    else if (strcmp(n, "shm-key-prefix") == 0) {
        if (strchr(v + (v[0] == '/'), '/'))
            return BAD("a prefix of shared memory object names cannot hold '/' after the first byte");
        set_str(&c->shm_key_prefix, v);
    }
    return 0;
#undef BAD
}

int server_config_set(struct server_config *c, const char *name, const char *value,
                      const char *source, char *err, size_t err_len) {
    const struct opt *o = opt_find(name);
    if (!o) return status_set(err, err_len, STATUS_INVALID, "%s: unknown setting '%s' (see kiln serve --help)", source, name);
    return set_opt(c, o, value, SRC_FLAG, source, err, err_len);
}

/* ---- sources ------------------------------------------------------------ */

static int load_file(struct server_config *c, const char *path, char *err, size_t err_len) {
    char *buf, e2[512];
    size_t n;
    if (file_read_regular(path, 1 << 20, &buf, &n, e2, sizeof e2))
        return status_set(err, err_len, STATUS_INVALID, "--config: %s", e2);
    long len = (long)n;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, (size_t)len, &end, 0);
    if (!root) {
        size_t at = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : 0;
        free(buf);
        return status_set(err, err_len, STATUS_INVALID, "--config %s: not valid JSON (error at byte %zu)", path, at);
    }
    free(buf);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return status_set(err, err_len, STATUS_INVALID, "--config %s: not a JSON object", path);
    }
    int rc = 0;
    char src[512], val[64];
    cJSON *it;
    cJSON_ArrayForEach(it, root) {
        snprintf(src, sizeof src, "%s: key \"%s\"", path, it->string);
        const struct opt *o = opt_find(it->string);
        if (!o || o->kind == OPT_FLAGONLY) {
            rc = status_set(err, err_len, STATUS_INVALID, "%s is not a setting (see kiln serve --help)", src);
            break;
        }
        if (cJSON_IsString(it)) rc = set_opt(c, o, it->valuestring, SRC_FILE, src, err, err_len);
        else if (cJSON_IsNumber(it)) {
            /* %.17g keeps 1.5 as 1.5, so an integer setting refuses it instead of rounding. */
            snprintf(val, sizeof val, "%.17g", it->valuedouble);
            rc = set_opt(c, o, val, SRC_FILE, src, err, err_len);
        } else if (cJSON_IsBool(it)) rc = set_opt(c, o, cJSON_IsTrue(it) ? "1" : "0", SRC_FILE, src, err, err_len);
        else if (cJSON_IsArray(it) && o->kind == OPT_LIST) {
            cJSON *e;
            cJSON_ArrayForEach(e, it) {
                if (!cJSON_IsString(e)) {
                    rc = status_set(err, err_len, STATUS_INVALID, "%s: expected an array of strings", src);
                    break;
                }
                if ((rc = set_opt(c, o, e->valuestring, SRC_FILE, src, err, err_len))) break;
            }
        } else rc = status_set(err, err_len, STATUS_INVALID, "%s: expected a string or a number", src);
        if (rc) break;
    }
    cJSON_Delete(root);
    return rc;
}

static int load_env(struct server_config *c, char *err, size_t err_len) {
    for (int i = 0; i < NOPTS; i++) {
        if (g_opts[i].kind == OPT_FLAGONLY) continue;
        char env[64];
        size_t n = 0;
        n += (size_t)snprintf(env, sizeof env, "KILN_");
        for (const char *p = g_opts[i].name; *p && n + 1 < sizeof env; p++)
            env[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
        env[n] = 0;
        const char *v = getenv(env);
        if (!v) continue;
        int rc = set_opt(c, &g_opts[i], v, SRC_ENV, env, err, err_len);
        if (rc) return rc;
    }
    return 0;
}

int server_config_is_loopback(const char *addr) {
    struct in_addr a4;
    struct in6_addr a6;
    if (!addr) return 0;
    if (strcasecmp(addr, "localhost") == 0) return 1;
    if (inet_pton(AF_INET, addr, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, addr, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return 0; /* a host name: it may resolve to anything */
}

int server_config_control_unprotected(const struct server_config *c) {
    return c->model_control_mode != SERVER_CONTROL_NONE && !c->control_token &&
           !server_config_is_loopback(c->http_address);
}

/* Load and unload change what the server runs and spend its threads and
 * memory: reachable by anyone, they need a token, or the operator's word. */
static int check_control_auth(const struct server_config *c, char *err, size_t err_len) {
    if (!server_config_control_unprotected(c) || c->allow_unauthenticated_control) return 0;
    return status_set(err, err_len, STATUS_INVALID,
                      "--model-control-mode %s on --http-address %s (not a loopback address) without --control-token "
                      "would let anyone who reaches the port load and unload models: set --control-token, or "
                      "--allow-unauthenticated-control to accept that",
                      server_control_mode_name(c->model_control_mode), c->http_address);
}

int server_config_load(struct server_config *c, int argc, char **argv, char *err, size_t err_len) {
    g_load_rank = 0;
    /* First pass: --help and --config, and that every flag exists and has a value. */
    const char *file = getenv("KILN_CONFIG");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            server_config_usage(stdout);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0)
            return status_set(err, err_len, STATUS_INVALID, "unexpected argument '%s' (see kiln serve --help)", a);
        const char *eq = strchr(a, '=');
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(eq ? eq - a - 2 : (long)strlen(a) - 2), a + 2);
        const struct opt *o = opt_find(name);
        if (!o) return status_set(err, err_len, STATUS_INVALID, "unknown flag '--%s' (see kiln serve --help)", name);
        if (o->kind == OPT_BOOL) continue; /* bare, or --flag=value */
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL);
        if (!v) return status_set(err, err_len, STATUS_INVALID, "flag --%s needs a value (%s)", name, o->arg);
        if (!eq) i++;
        if (o->kind == OPT_FLAGONLY) file = v;
    }
    if (file && *file) {
        set_str(&c->config_file, file);
        int rc = load_file(c, file, err, err_len);
        if (rc) return rc;
    }
    int rc = load_env(c, err, err_len);
    if (rc) return rc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        char name[64], src[80];
        snprintf(name, sizeof name, "%.*s", (int)(eq ? eq - a - 2 : (long)strlen(a) - 2), a + 2);
        const struct opt *o = opt_find(name);
        const char *v = eq ? eq + 1 : o->kind == OPT_BOOL ? "1" : argv[++i];
        if (o->kind == OPT_FLAGONLY) continue;
        snprintf(src, sizeof src, "flag --%s", o->name);
        if ((rc = set_opt(c, o, v, SRC_FLAG, src, err, err_len))) return rc;
    }
    if (c->model_control_mode != SERVER_CONTROL_EXPLICIT && c->nload_model > 0)
        return status_set(err, err_len, STATUS_INVALID,
                          "--load-model needs --model-control-mode explicit (mode is %s: every model is loaded)",
                          server_control_mode_name(c->model_control_mode));
    return check_control_auth(c, err, err_len);
}

void server_config_usage(FILE *f) {
    fprintf(f,
            "usage: kiln serve [options]\n"
            "\n"
            "Serves the ONNX models of a model repository with the KServe v2 / Open\n"
            "Inference Protocol over HTTP and gRPC (compatible with tritonclient.http\n"
            "and tritonclient.grpc).\n"
            "\n"
            "Every option is also read from the environment (KILN_HTTP_PORT=8000) and\n"
            "from a JSON file given with --config or KILN_CONFIG ({\"http_port\": 8000}).\n"
            "Precedence: flag > environment > file > default.\n"
            "\n"
            "options:\n");
    for (int i = 0; i < NOPTS; i++) {
        char left[64];
        snprintf(left, sizeof left, "--%s %s", g_opts[i].name, g_opts[i].arg);
        fprintf(f, "  %-38s %s", left, g_opts[i].help);
        if (g_opts[i].def[0]) fprintf(f, " [%s]", g_opts[i].def);
        fprintf(f, "\n");
    }
    fprintf(f,
            "  %-38s %s\n"
            "\n"
            "Signals: SIGTERM turns readiness false and keeps serving for\n"
            "--shutdown-delay-secs (load balancers see the server leave before it\n"
            "refuses anything), then stops admitting work (new requests get 503),\n"
            "lets accepted requests finish and exits 0. SIGINT skips the delay. A\n"
            "second signal, or --exit-timeout-secs, forces the exit.\n",
            "-h, --help", "this text");
}

int64_t server_config_max_request_memory(const struct server_config *c) {
    if (c->max_request_memory > 0) return c->max_request_memory;
    /* A quarter of the machine leaves room for the models and for other
     * requests; past a few GiB one request is an attack, not a workload. */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    int64_t ram = pages > 0 && page > 0 ? (int64_t)pages * page : 4LL << 30;
    int64_t m = ram / 4;
    if (m > (4LL << 30)) m = 4LL << 30;
    if (m < (64LL << 20)) m = 64LL << 20;
    return m;
}
