/* bench.c - `kiln bench`: a load generator for KServe v2 servers, over HTTP
 * or gRPC, that answers "does this model meet p99 <= X ms at Y requests/s?".
 *
 * One libevent loop drives keep-alive connections (HTTP/1.1, or one HTTP/2
 * connection per client for gRPC: bench_grpc.h). Closed loop: each of C
 * connections sends its next request when the last one answers. Open loop:
 * requests are scheduled at a fixed or Poisson rate and their latency counts
 * from the scheduled time (see bench_schedule.h), so stalls reach the tail.
 * Requests are built from the server's model metadata and config. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/hist.h"
#include "common/tensor.h"
#include "commands/commands.h"
#include "commands/bench_grpc.h"
#include "commands/bench_schedule.h"
#include "commands/bench_shm.h"

#define MAX_LEVELS 64
#define MAX_INPUTS 32
#define MAX_BUDGETS 8
#define MAX_STATUS 8

/* ======================================================================
 * options
 * ====================================================================== */

struct opts {
    const char *host;
    int port;
    const char *model;
    const char *version;
    int batch;
    int levels[MAX_LEVELS];
    int nlevels;
    double rate;
    int poisson;
    double duration_s;
    long requests;
    double warmup_s;
    const char *input_data; /* random | zero | FILE | name=FILE,... */
    int json;               /* JSON data instead of binary */
    int shared_memory;      /* inputs in registered shared-memory regions */
    int unique;             /* distinct request bodies to cycle through */
    double budget_q[MAX_BUDGETS], budget_us[MAX_BUDGETS];
    int nbudgets;
    const char *csv, *json_out;
    int progress;
    int max_conns;
    int timeout_ms;
    uint64_t seed;
    char shape_override[MAX_INPUTS][128];
    int nshape_override;
    int grpc;               /* inference over gRPC (ModelInfer) */
    const char *grpc_host;
    int grpc_port;
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln bench -m MODEL [options]\n"
            "\n"
            "Load-tests a KServe v2 / Open Inference Protocol HTTP server (kiln, Triton, others)\n"
            "and checks latency budgets. Requests are built from the model's metadata and config.\n"
            "\n"
            "target:\n"
            "  -u, --url HOST:PORT          server address (default 127.0.0.1:8000); metadata, config and\n"
            "                               statistics are read there over HTTP whatever the protocol\n"
            "  -i, --protocol http|grpc     how requests go (default http); grpc: ModelInfer calls of\n"
            "                               Triton's GRPCInferenceService, tensors in raw_input_contents,\n"
            "                               one HTTP/2 connection per concurrent client\n"
            "      --grpc-url HOST:PORT     the gRPC address (default: -u's host, port 8001)\n"
            "  -m, --model NAME             model to infer (required)\n"
            "  -x, --model-version V        version (default: the server's choice)\n"
            "requests:\n"
            "  -b, --batch-size N           rows per request when the model batches (default 1)\n"
            "      --input-data D           random (default), zero, a perf_analyzer-style JSON file,\n"
            "                               a .npy or raw file (one-input models), or NAME=FILE,...\n"
            "      --shape NAME:D1,D2,...   dims for an input whose metadata has -1 (repeatable); a dim\n"
            "                               LO-HI draws a length per request body, shared by every\n"
            "                               input with the same range (e.g. a token count)\n"
            "      --unique N               distinct random request bodies to cycle (default 64;\n"
            "                               1 sends one body, e.g. to measure cache hits)\n"
            "      --json-data              send JSON tensors instead of the binary extension (HTTP)\n"
            "      --shared-memory          put the inputs in POSIX shared memory registered with the server\n"
            "                               (system shared-memory extension; the server must be local)\n"
            "load:\n"
            "  -c, --concurrency LEVELS     closed loop with N outstanding requests; a sweep as\n"
            "                               1:64:x2 (doubling), 1:64:+8, or 1,8,64 (default 1)\n"
            "  -r, --rate R                 open loop at R requests/s (latency from the scheduled\n"
            "                               send time); with --poisson, exponential gaps\n"
            "      --poisson                Poisson arrivals for --rate\n"
            "  -d, --duration S             measured seconds per level (default 10)\n"
            "  -n, --requests N             measured requests per level instead of a duration\n"
            "      --warmup S               unmeasured seconds before each level (default 1)\n"
            "      --max-connections N      open loop connection cap (default 512)\n"
            "      --timeout-ms MS          per request (default 30000)\n"
            "      --seed N                 random inputs and Poisson gaps (default 1)\n"
            "output:\n"
            "      --latency-budget LIST    e.g. p99=20ms or p50=2ms,p99.9=50ms: exit 0 when every\n"
            "                               level meets it with no failed request, 1 when not\n"
            "      --csv FILE               one row per level (appends; header when new)\n"
            "      --json FILE              all levels as JSON\n"
            "      --no-progress            no progress line on a terminal\n"
            "\n"
            "exit codes: 0 ok (budget met), 1 budget not met or a level where no request succeeded,\n"
            "2 usage or setup error\n");
}

/* ======================================================================
 * a tiny synchronous GET on the loop, for metadata and stats
 * ====================================================================== */

struct sync_get {
    int done, status;
    char *body;
};

static void on_sync_done(struct evhttp_request *req, void *arg) {
    struct sync_get *g = arg;
    g->done = 1;
    if (!req) return;
    g->status = evhttp_request_get_response_code(req);
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(b);
    g->body = malloc(n + 1);
    evbuffer_remove(b, g->body, n);
    g->body[n] = 0;
}

/* One request, waited for: the status (-1 when none came) and the answer's body. */
static int http_sync(struct event_base *base, struct evhttp_connection *conn, const char *host,
                     enum evhttp_cmd_type method, const char *path, const char *send, char **body) {
    struct sync_get g = {0};
    struct evhttp_request *req = evhttp_request_new(on_sync_done, &g);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host", host);
    if (send) evbuffer_add(evhttp_request_get_output_buffer(req), send, strlen(send));
    if (evhttp_make_request(conn, req, method, path) != 0) return -1;
    while (!g.done) event_base_loop(base, EVLOOP_ONCE);
    *body = g.body;
    return g.status ? g.status : -1;
}

static int http_get(struct event_base *base, struct evhttp_connection *conn, const char *host, const char *path,
                    char **body) {
    return http_sync(base, conn, host, EVHTTP_REQ_GET, path, NULL, body);
}

/* ======================================================================
 * request bodies
 * ====================================================================== */

struct input_desc {
    char name[128];
    enum dtype dtype;
    int ndim;
    int64_t dims[TENSOR_MAX_DIMS];
    int64_t hi[TENSOR_MAX_DIMS]; /* --shape LO-HI: dims[k] is LO, drawn per body up to hi[k]; else 0 */
    void *fixed;       /* data from a file, or NULL */
    size_t fixed_len;
};

struct body {
    char *data;
    size_t len;
    size_t header_len; /* JSON header length; 0 for pure JSON */
};

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 2685821657736338717ull;
}

static void fill_random(void *p, enum dtype dt, int64_t n, uint64_t *rng, int zero) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = zero ? 0 : rng_next(rng);
        double u = (double)(r >> 11) / 9007199254740992.0;
        switch (dt) {
        case DT_FP32: ((float *)p)[i] = (float)u; break;
        case DT_FP64: ((double *)p)[i] = u; break;
        case DT_FP16: ((uint16_t *)p)[i] = fp32_to_fp16((float)u); break;
        case DT_BF16: ((uint16_t *)p)[i] = fp32_to_bf16((float)u); break;
        case DT_INT64: ((int64_t *)p)[i] = (int64_t)(r % 100); break;
        case DT_INT32: ((int32_t *)p)[i] = (int32_t)(r % 100); break;
        case DT_INT16: ((int16_t *)p)[i] = (int16_t)(r % 100); break;
        case DT_INT8: ((int8_t *)p)[i] = (int8_t)(r % 100); break;
        case DT_UINT64: ((uint64_t *)p)[i] = r % 100; break;
        case DT_UINT32: ((uint32_t *)p)[i] = (uint32_t)(r % 100); break;
        case DT_UINT16: ((uint16_t *)p)[i] = (uint16_t)(r % 100); break;
        case DT_UINT8: ((uint8_t *)p)[i] = (uint8_t)(r % 256); break;
        case DT_BOOL: ((uint8_t *)p)[i] = (uint8_t)(r & 1); break;
        default: break;
        }
    }
}

static cJSON *json_value(const void *p, enum dtype dt, int64_t i) {
    switch (dt) {
    case DT_FP32: return cJSON_CreateNumber(((const float *)p)[i]);
    case DT_FP64: return cJSON_CreateNumber(((const double *)p)[i]);
    case DT_INT64: return cJSON_CreateNumber((double)((const int64_t *)p)[i]);
    case DT_INT32: return cJSON_CreateNumber(((const int32_t *)p)[i]);
    case DT_INT16: return cJSON_CreateNumber(((const int16_t *)p)[i]);
    case DT_INT8: return cJSON_CreateNumber(((const int8_t *)p)[i]);
    case DT_UINT64: return cJSON_CreateNumber((double)((const uint64_t *)p)[i]);
    case DT_UINT32: return cJSON_CreateNumber(((const uint32_t *)p)[i]);
    case DT_UINT16: return cJSON_CreateNumber(((const uint16_t *)p)[i]);
    case DT_UINT8: return cJSON_CreateNumber(((const uint8_t *)p)[i]);
    case DT_BOOL: return cJSON_CreateBool(((const uint8_t *)p)[i]);
    default: return cJSON_CreateNull();
    }
}

/* The body's length for every ranged dim (--shape NAME:LO-HI): one draw per
 * distinct range, shared by every input that names that range (input_ids
 * and attention_mask of one request have one length). */
static void draw_lengths(const struct input_desc *in, int nin, uint64_t *rng, int64_t dims[][TENSOR_MAX_DIMS]) {
    int64_t lo[MAX_INPUTS * TENSOR_MAX_DIMS], hi[MAX_INPUTS * TENSOR_MAX_DIMS], val[MAX_INPUTS * TENSOR_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < nin; i++) {
        memcpy(dims[i], in[i].dims, sizeof dims[i]);
        for (int k = 0; k < in[i].ndim; k++) {
            if (!in[i].hi[k]) continue;
            int j = 0;
            while (j < n && (lo[j] != in[i].dims[k] || hi[j] != in[i].hi[k])) j++;
            if (j == n) {
                lo[n] = in[i].dims[k];
                hi[n] = in[i].hi[k];
                val[n++] = lo[j] + (int64_t)(rng_next(rng) % (uint64_t)(hi[j] - lo[j] + 1));
            }
            dims[i][k] = val[j];
        }
    }
}

/* One request's tensors: shapes drawn, data from the input's file or random. */
static int make_tensors(const struct input_desc *in, int nin, int zero, uint64_t *rng, struct tensor *t) {
    int64_t dims[MAX_INPUTS][TENSOR_MAX_DIMS];
    draw_lengths(in, nin, rng, dims);
    for (int i = 0; i < nin; i++) {
        t[i] = (struct tensor){.dtype = in[i].dtype, .ndim = in[i].ndim};
        memcpy(t[i].dims, dims[i], sizeof t[i].dims);
        size_t nb = tensor_nbytes(&t[i]);
        if (in[i].fixed && in[i].fixed_len != nb) {
            fprintf(stderr, "kiln bench: input '%s' needs %zu bytes, its file has %zu\n", in[i].name, nb,
                    in[i].fixed_len);
            for (int k = 0; k < i; k++) free(t[k].data);
            return -1;
        }
        t[i].data = malloc(nb ? nb : 1);
        if (in[i].fixed) memcpy(t[i].data, in[i].fixed, nb);
        else fill_random(t[i].data, in[i].dtype, tensor_numel(&t[i]), rng, zero);
    }
    return 0;
}

/* A gRPC body: the framed ModelInferRequest. */
static int build_grpc_body(const struct opts *o, const struct input_desc *in, int nin, int zero, uint64_t *rng,
                           struct body *out) {
    struct tensor t[MAX_INPUTS];
    const char *names[MAX_INPUTS];
    if (make_tensors(in, nin, zero, rng, t) < 0) return -1;
    for (int i = 0; i < nin; i++) names[i] = in[i].name;
    out->data = (char *)bench_grpc_infer_request(o->model, o->version, names, t, nin, &out->len);
    out->header_len = 0;
    for (int i = 0; i < nin; i++) free(t[i].data);
    return out->data ? 0 : -1;
}

/* Builds one HTTP request body; random data from rng unless an input is fixed.
 * With shm, the inputs go into a new shared-memory object (shm, number
 * index) and the body is the JSON header naming it. */
static int build_body(const struct input_desc *in, int nin, int json, int zero, uint64_t *rng, struct body *out,
                      struct bench_shm *shm, int index) {
    struct tensor t[MAX_INPUTS];
    if (make_tensors(in, nin, zero, rng, t) < 0) return -1;
    cJSON *root = cJSON_CreateObject();
    cJSON *inputs = cJSON_AddArrayToObject(root, "inputs");
    void *bufs[MAX_INPUTS];
    size_t lens[MAX_INPUTS];
    for (int i = 0; i < nin; i++) {
        int64_t n = tensor_numel(&t[i]);
        size_t nb = tensor_nbytes(&t[i]);
        bufs[i] = t[i].data;
        lens[i] = nb;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", in[i].name);
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < in[i].ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].dims[d]));
        cJSON_AddStringToObject(o, "datatype", dtype_kserve_name(in[i].dtype));
        if (shm) {
            cJSON *params = cJSON_AddObjectToObject(o, "parameters");
            cJSON_AddStringToObject(params, "shared_memory_region", shm->region); /* named below */
            cJSON_AddNumberToObject(params, "shared_memory_byte_size", (double)nb);
        } else if (json) {
            cJSON *data = cJSON_AddArrayToObject(o, "data");
            for (int64_t k = 0; k < n; k++) cJSON_AddItemToArray(data, json_value(bufs[i], in[i].dtype, k));
        } else {
            cJSON *params = cJSON_AddObjectToObject(o, "parameters");
            cJSON_AddNumberToObject(params, "binary_data_size", (double)nb);
        }
        cJSON_AddItemToArray(inputs, o);
    }
    if (!json) {
        cJSON *params = cJSON_AddObjectToObject(root, "parameters");
        cJSON_AddTrueToObject(params, "binary_data_output");
    }
    if (shm) {
        size_t total = 0, off = 0;
        for (int i = 0; i < nin; i++) total += lens[i];
        int rc = bench_shm_create(shm, index, total);
        cJSON *o;
        int i = 0;
        cJSON_ArrayForEach(o, inputs) {
            cJSON *params = cJSON_GetObjectItem(o, "parameters");
            cJSON_SetValuestring(cJSON_GetObjectItem(params, "shared_memory_region"), shm->region);
            cJSON_AddNumberToObject(params, "shared_memory_offset", (double)off);
            if (!rc && lens[i]) memcpy((char *)shm->map + off, bufs[i], lens[i]);
            off += lens[i++];
        }
        if (rc) {
            cJSON_Delete(root);
            for (int k = 0; k < nin; k++) free(bufs[k]);
            return -1;
        }
        json = 1; /* the body is the header alone */
    }
    char *hdr = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    size_t hl = strlen(hdr), total = hl;
    if (!json)
        for (int i = 0; i < nin; i++) total += lens[i];
    out->data = malloc(total);
    memcpy(out->data, hdr, hl);
    size_t off = hl;
    if (!json)
        for (int i = 0; i < nin; i++) {
            memcpy(out->data + off, bufs[i], lens[i]);
            off += lens[i];
        }
    out->len = total;
    out->header_len = json ? 0 : hl;
    for (int i = 0; i < nin; i++) free(bufs[i]);
    free(hdr);
    return 0;
}

static void *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* Reads a .npy file's payload (v1/v2/v3 headers); the shape check is the
 * byte count against the request's tensor. */
static void *read_npy_or_raw(const char *path, size_t *len) {
    size_t n;
    uint8_t *p = read_file(path, &n);
    if (!p) return NULL;
    if (n >= 10 && memcmp(p, "\x93NUMPY", 6) == 0) {
        size_t hl = p[6] == 1 ? (size_t)(p[8] | (p[9] << 8)) + 10 : (size_t)(p[8] | (p[9] << 8) | (p[10] << 16) | ((size_t)p[11] << 24)) + 12;
        if (hl > n) {
            free(p);
            return NULL;
        }
        memmove(p, p + hl, n - hl);
        n -= hl;
    }
    *len = n;
    return p;
}

/* perf_analyzer's --input-data JSON: {"data": [{"NAME": [..] | {"content": [..], "shape": [..]}}]}.
 * Takes the first entry; values are converted to each input's dtype. */
/* perf_analyzer's --input-data format. As there, for a model that batches
 * "shape" leaves out the batch dim and the content is one sample, repeated
 * for each row of the batch. */
static int load_json_inputs(const char *path, struct input_desc *in, int nin, int batched, int batch) {
    size_t n;
    char *text = read_file(path, &n);
    if (!text) return -1;
    text = realloc(text, n + 1);
    text[n] = 0;
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *data = root ? cJSON_GetObjectItem(root, "data") : NULL;
    cJSON *first = cJSON_IsArray(data) ? cJSON_GetArrayItem(data, 0) : NULL;
    if (!first) {
        fprintf(stderr, "kiln bench: %s: expected {\"data\": [{\"INPUT\": [...]}]}\n", path);
        cJSON_Delete(root);
        return -1;
    }
    /* A name the model does not have is a typo: say so rather than send random data. */
    cJSON *key;
    cJSON_ArrayForEach(key, first) {
        int known = 0;
        for (int i = 0; i < nin; i++) known |= key->string && strcmp(key->string, in[i].name) == 0;
        if (!known) {
            char names[512] = "";
            for (int i = 0; i < nin; i++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s'%s'", i ? ", " : "", in[i].name);
            fprintf(stderr, "kiln bench: %s: the model has no input named '%s' (its inputs: %s)\n", path,
                    key->string ? key->string : "", names);
            cJSON_Delete(root);
            return -1;
        }
    }
    for (int i = 0; i < nin; i++) {
        cJSON *v = cJSON_GetObjectItem(first, in[i].name);
        if (!v) {
            fprintf(stderr, "kiln bench: %s: no data for input '%s' in the first entry of \"data\"\n", path, in[i].name);
            cJSON_Delete(root);
            return -1;
        }
        cJSON *content = cJSON_IsObject(v) ? cJSON_GetObjectItem(v, "content") : v;
        if (!cJSON_IsArray(content)) {
            fprintf(stderr, "kiln bench: %s: input '%s': expected an array of values (or {\"content\": [...], \"shape\": [...]})\n",
                    path, in[i].name);
            cJSON_Delete(root);
            return -1;
        }
        cJSON *shape = cJSON_IsObject(v) ? cJSON_GetObjectItem(v, "shape") : NULL;
        if (cJSON_IsArray(shape)) {
            int lead = batched ? 1 : 0, nd = cJSON_GetArraySize(shape);
            if (nd + lead > TENSOR_MAX_DIMS) nd = TENSOR_MAX_DIMS - lead;
            in[i].ndim = nd + lead;
            if (batched) in[i].dims[0] = batch;
            for (int d = 0; d < nd; d++) {
                double v = cJSON_GetArrayItem(shape, d)->valuedouble;
                if (!(v >= 0 && v < 1e9)) {
                    fprintf(stderr, "kiln bench: %s: input '%s': shape[%d] is not a dim\n", path, in[i].name, d);
                    cJSON_Delete(root);
                    return -1;
                }
                in[i].dims[d + lead] = (int64_t)v;
            }
        }
        int cnt = cJSON_GetArraySize(content);
        size_t es = dtype_size(in[i].dtype);
        struct tensor want = {.dtype = in[i].dtype, .ndim = in[i].ndim};
        memcpy(want.dims, in[i].dims, sizeof want.dims);
        /* One sample for a batch of several: repeat it. */
        int reps = batched && batch > 1 && (int64_t)cnt * batch == tensor_numel(&want) ? batch : 1;
        in[i].fixed = calloc((size_t)cnt * (size_t)reps + 1, es);
        in[i].fixed_len = (size_t)cnt * (size_t)reps * es;
        for (int k = 0; k < cnt; k++) {
            double x = cJSON_GetArrayItem(content, k)->valuedouble;
            if (cJSON_IsBool(cJSON_GetArrayItem(content, k))) x = cJSON_IsTrue(cJSON_GetArrayItem(content, k));
            uint8_t *dst = (uint8_t *)in[i].fixed + (size_t)k * es;
            switch (in[i].dtype) {
            case DT_FP32: { float f = (float)x; memcpy(dst, &f, 4); break; }
            case DT_FP64: memcpy(dst, &x, 8); break;
            case DT_INT64: { int64_t y = (int64_t)x; memcpy(dst, &y, 8); break; }
            case DT_INT32: { int32_t y = (int32_t)x; memcpy(dst, &y, 4); break; }
            case DT_UINT8: case DT_BOOL: *dst = (uint8_t)x; break;
            default: fprintf(stderr, "kiln bench: JSON input data for %s inputs is not supported\n", dtype_kserve_name(in[i].dtype)); cJSON_Delete(root); return -1;
            }
        }
        for (int r = 1; r < reps; r++)
            memcpy((uint8_t *)in[i].fixed + (size_t)r * (size_t)cnt * es, in[i].fixed, (size_t)cnt * es);
    }
    cJSON_Delete(root);
    return 0;
}

/* ======================================================================
 * the load loop
 * ====================================================================== */

struct level_result {
    int concurrency;
    double rate;
    uint64_t ok, failed, dropped;
    uint64_t status_count[MAX_STATUS];
    int status_code[MAX_STATUS];
    char status_msg[MAX_STATUS][200]; /* the first error body seen with each status */
    int nstatus;
    double seconds;
    struct hist *h; /* microseconds */
    double server_queue_us, server_compute_us;
    uint64_t server_count;
    int budget_ok;
};

struct run;

struct conn {
    struct run *run;
    struct evhttp_connection *c;
    bench_grpc_conn_t *g;      /* with --protocol grpc, instead of c */
    int busy;
    uint64_t sched_ns;
};

struct run {
    struct event_base *base;
    const struct opts *o;
    char hostport[300];
    char path[512];
    struct body *bodies;
    int nbodies;
    struct bench_shm *shms;     /* --shared-memory: the bodies' objects, else NULL */
    uint64_t next_body;
    struct conn *conns;
    int nconns;
    int phase;          /* 0 warm-up, 1 measured, 2 draining */
    uint64_t measure_start, deadline;
    long measured_sent;
    struct level_result *res;
    struct bench_schedule sched;
    struct bench_backlog backlog;
    struct event *tick;
    struct event *progress_ev;
    struct event *phase_ev;
    uint64_t inflight;
};

static void count_status(struct level_result *r, int code, const char *msg, size_t msg_len) {
    for (int i = 0; i < r->nstatus; i++)
        if (r->status_code[i] == code) {
            r->status_count[i]++;
            return;
        }
    if (r->nstatus < MAX_STATUS) {
        char *m = r->status_msg[r->nstatus];
        size_t n = msg && code ? (msg_len < sizeof r->status_msg[0] - 1 ? msg_len : sizeof r->status_msg[0] - 1) : 0;
        memcpy(m, msg ? msg : "", n);
        m[n] = 0;
        for (char *c = m; *c; c++)
            if (*c == '\n' || *c == '\r') *c = ' ';
        r->status_code[r->nstatus] = code;
        r->status_count[r->nstatus++] = 1;
    }
}

static void send_on(struct conn *c, uint64_t sched_ns);

static int wants_more(struct run *r) {
    if (r->phase == 2) return 0;
    if (r->phase == 1 && r->o->requests > 0) return r->measured_sent < r->o->requests;
    return 1;
}

/* A request's end: ok, or failed with code (an HTTP status, a gRPC status
 * + GRPC_CODE_BASE, 0 for a connection error) and the server's message. */
#define GRPC_CODE_BASE 1000

static void request_done(struct conn *c, int ok, int code, const char *msg, size_t msg_len) {
    struct run *r = c->run;
    uint64_t t = clock_now_ns();
    c->busy = 0;
    r->inflight--;
    if (r->phase >= 1 && c->sched_ns >= r->measure_start) {
        if (ok) {
            r->res->ok++;
            hist_record(r->res->h, (t - c->sched_ns) / 1000);
        } else {
            r->res->failed++;
            count_status(r->res, code, msg, msg_len);
        }
    }
    if (r->o->rate > 0) {
        uint64_t s;
        if (wants_more(r) && backlog_pop(&r->backlog, &s) == 0) send_on(c, s);
    } else if (wants_more(r)) {
        send_on(c, clock_now_ns());
    }
    if (r->phase == 1 && r->o->requests > 0 && r->measured_sent >= r->o->requests && r->inflight == 0) {
        r->res->seconds = (double)(clock_now_ns() - r->measure_start) / 1e9;
        r->phase = 2;
    }
    if (r->phase == 2 && r->inflight == 0) event_base_loopbreak(r->base);
}

static void on_response(struct evhttp_request *req, void *arg) {
    int code = req ? evhttp_request_get_response_code(req) : 0;
    struct evbuffer *b = req && code != 200 ? evhttp_request_get_input_buffer(req) : NULL;
    size_t n = b ? evbuffer_get_length(b) : 0;
    request_done(arg, code == 200, code, b ? (const char *)evbuffer_pullup(b, (ev_ssize_t)(n < 199 ? n : 199)) : NULL,
                 n < 199 ? n : 199);
}

static void on_grpc_response(void *arg, int status, const char *msg) {
    request_done(arg, status == 0, status < 0 ? 0 : GRPC_CODE_BASE + status, msg, strlen(msg));
}

/* A request that could not be sent: counted as a connection error. */
static void send_failed(struct conn *c) {
    struct run *r = c->run;
    c->busy = 0;
    r->inflight--;
    if (r->phase == 1) {
        r->res->failed++;
        count_status(r->res, 0, NULL, 0);
    }
}

static void send_on(struct conn *c, uint64_t sched_ns) {
    struct run *r = c->run;
    struct body *b = &r->bodies[r->next_body++ % (uint64_t)r->nbodies];
    if (r->o->grpc) {
        c->busy = 1;
        c->sched_ns = sched_ns;
        r->inflight++;
        if (r->phase == 1) r->measured_sent++;
        if (!c->g || bench_grpc_call(c->g, r->path, (const uint8_t *)b->data, b->len, on_grpc_response, c) != 0)
            send_failed(c);
        return;
    }
    struct evhttp_request *req = evhttp_request_new(on_response, c);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", r->hostport);
    evhttp_add_header(h, "Content-Type", b->header_len ? "application/octet-stream" : "application/json");
    if (b->header_len) {
        char hl[32];
        snprintf(hl, sizeof hl, "%zu", b->header_len);
        evhttp_add_header(h, "Inference-Header-Content-Length", hl);
    }
    evbuffer_add_reference(evhttp_request_get_output_buffer(req), b->data, b->len, NULL, NULL);
    c->busy = 1;
    c->sched_ns = sched_ns;
    r->inflight++;
    if (r->phase == 1) r->measured_sent++;
    if (evhttp_make_request(c->c, req, EVHTTP_REQ_POST, r->path) != 0) send_failed(c); /* libevent frees req */
}

static struct conn *free_conn(struct run *r) {
    for (int i = 0; i < r->nconns; i++)
        if (!r->conns[i].busy) return &r->conns[i];
    return NULL;
}

/* Open loop: every due scheduled time goes to a free connection or the backlog. */
static void on_tick(evutil_socket_t fd, short what, void *arg) {
    struct run *r = arg;
    (void)fd;
    (void)what;
    uint64_t t = clock_now_ns();
    while (wants_more(r) && schedule_peek(&r->sched) <= t) {
        uint64_t s = schedule_next(&r->sched);
        struct conn *c = r->backlog.len ? NULL : free_conn(r);
        if (c) send_on(c, s);
        else if (backlog_push(&r->backlog, s) < 0 && r->phase == 1) r->res->dropped++;
        else if (r->phase == 1) r->measured_sent++;
    }
    if (wants_more(r)) {
        uint64_t next = schedule_peek(&r->sched), now = clock_now_ns();
        uint64_t wait = next > now ? next - now : 0;
        struct timeval tv = {(time_t)(wait / 1000000000u), (suseconds_t)((wait % 1000000000u) / 1000)};
        evtimer_add(r->tick, &tv);
    }
}

static void on_progress(evutil_socket_t fd, short what, void *arg) {
    struct run *r = arg;
    (void)fd;
    (void)what;
    double el = (double)(clock_now_ns() - r->measure_start) / 1e9;
    if (r->phase == 0) {
        fprintf(stderr, "\r\033[K  warming up...");
    } else if (r->phase == 1) {
        uint64_t done = r->res->ok + r->res->failed;
        fprintf(stderr, "\r\033[K  %5.1fs  done %llu  %.0f/s  p99 %.2f ms  errors %llu  in flight %llu", el,
                (unsigned long long)done, el > 0 ? (double)done / el : 0, hist_quantile(r->res->h, 0.99) / 1000.0,
                (unsigned long long)r->res->failed, (unsigned long long)r->inflight);
    }
}

static void on_phase(evutil_socket_t fd, short what, void *arg);

static void start_phase(struct run *r, int phase, double seconds) {
    r->phase = phase;
    if (!r->phase_ev) r->phase_ev = evtimer_new(r->base, on_phase, r);
    if (phase == 1) {
        r->measure_start = clock_now_ns();
        r->measured_sent = 0;
    }
    if (phase < 2 && (phase == 0 || r->o->requests <= 0)) {
        struct timeval tv = {(time_t)seconds, (suseconds_t)((seconds - (double)(time_t)seconds) * 1e6)};
        evtimer_add(r->phase_ev, &tv);
    }
}

static void on_phase(evutil_socket_t fd, short what, void *arg) {
    struct run *r = arg;
    (void)fd;
    (void)what;
    if (r->phase == 0) {
        start_phase(r, 1, r->o->duration_s);
        return;
    }
    r->res->seconds = (double)(clock_now_ns() - r->measure_start) / 1e9;
    r->phase = 2;
    if (r->inflight == 0) event_base_loopbreak(r->base);
}

/* Reads the server's cumulative success/queue/compute totals for the model. */
static int server_stats(struct event_base *base, struct evhttp_connection *conn, const struct opts *o,
                        const char *hostport, uint64_t *count, uint64_t *queue_ns, uint64_t *compute_ns) {
    char path[512], *body = NULL;
    if (o->version) snprintf(path, sizeof path, "/v2/models/%s/versions/%s/stats", o->model, o->version);
    else snprintf(path, sizeof path, "/v2/models/%s/stats", o->model);
    int st = http_get(base, conn, hostport, path, &body);
    int rc = -1;
    if (st == 200 && body) {
        cJSON *root = cJSON_Parse(body);
        cJSON *ms = root ? cJSON_GetObjectItem(root, "model_stats") : NULL;
        *count = *queue_ns = *compute_ns = 0;
        cJSON *m;
        cJSON_ArrayForEach(m, ms) {
            cJSON *is = cJSON_GetObjectItem(m, "inference_stats");
            cJSON *s = cJSON_GetObjectItem(is, "success"), *q = cJSON_GetObjectItem(is, "queue"),
                  *ci = cJSON_GetObjectItem(is, "compute_infer");
            if (s) *count += (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(s, "count"));
            if (q) *queue_ns += (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(q, "ns"));
            if (ci) *compute_ns += (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(ci, "ns"));
            rc = 0;
        }
        cJSON_Delete(root);
    }
    free(body);
    return rc;
}

static int shm_regions(struct event_base *base, const struct opts *o, const char *hostport, struct bench_shm *shms,
                       int n, int reg, struct evhttp_connection *on);

static void run_level(struct run *r, int concurrency, struct level_result *res) {
    const struct opts *o = r->o;
    memset(res, 0, sizeof *res);
    res->h = malloc(sizeof *res->h);
    hist_reset(res->h);
    res->concurrency = concurrency;
    res->rate = o->rate;
    r->res = res;
    r->nconns = o->rate > 0 ? o->max_conns : concurrency;
    r->conns = calloc((size_t)r->nconns, sizeof *r->conns);
    for (int i = 0; i < r->nconns; i++) {
        r->conns[i].run = r;
        if (o->grpc) {
            r->conns[i].g = bench_grpc_connect(r->base, o->grpc_host, o->grpc_port, o->timeout_ms);
            continue;
        }
        r->conns[i].c = evhttp_connection_base_new(r->base, NULL, o->host, (unsigned short)o->port);
        struct timeval tv = {o->timeout_ms / 1000, (o->timeout_ms % 1000) * 1000};
        evhttp_connection_set_timeout_tv(r->conns[i].c, &tv);
        evhttp_connection_set_retries(r->conns[i].c, 0);
        if (r->shms) shm_regions(r->base, o, r->hostport, r->shms, r->nbodies, 1, r->conns[i].c);
    }
    struct evhttp_connection *ctl = evhttp_connection_base_new(r->base, NULL, o->host, (unsigned short)o->port);
    uint64_t c0 = 0, q0 = 0, k0 = 0, c1 = 0, q1 = 0, k1 = 0;
    int have_stats = server_stats(r->base, ctl, o, r->hostport, &c0, &q0, &k0) == 0;
    if (o->progress) {
        r->progress_ev = event_new(r->base, -1, EV_PERSIST, on_progress, r);
        struct timeval tv = {0, 500000};
        evtimer_add(r->progress_ev, &tv);
    }
    start_phase(r, o->warmup_s > 0 ? 0 : 1, o->warmup_s > 0 ? o->warmup_s : o->duration_s);
    if (o->rate > 0) {
        backlog_init(&r->backlog, 1u << 20);
        schedule_init(&r->sched, o->rate, o->poisson, clock_now_ns(), o->seed);
        r->tick = evtimer_new(r->base, on_tick, r);
        on_tick(-1, 0, r);
    } else {
        for (int i = 0; i < r->nconns; i++) send_on(&r->conns[i], clock_now_ns());
    }
    event_base_dispatch(r->base);
    evtimer_del(r->phase_ev);
    if (r->progress_ev) {
        event_free(r->progress_ev);
        r->progress_ev = NULL;
        fprintf(stderr, "\r\033[K");
    }
    if (r->tick) {
        event_free(r->tick);
        r->tick = NULL;
        backlog_free(&r->backlog);
    }
    if (have_stats && server_stats(r->base, ctl, o, r->hostport, &c1, &q1, &k1) == 0 && c1 > c0) {
        res->server_count = c1 - c0;
        res->server_queue_us = (double)(q1 - q0) / 1000.0 / (double)(c1 - c0);
        res->server_compute_us = (double)(k1 - k0) / 1000.0 / (double)(c1 - c0);
    }
    evhttp_connection_free(ctl);
    for (int i = 0; i < r->nconns; i++) {
        if (r->conns[i].c) evhttp_connection_free(r->conns[i].c);
        bench_grpc_free(r->conns[i].g);
    }
    free(r->conns);
    r->conns = NULL;
    res->budget_ok = res->failed == 0 && res->dropped == 0 && res->ok > 0;
    for (int i = 0; i < o->nbudgets; i++)
        if ((double)hist_quantile(res->h, o->budget_q[i]) > o->budget_us[i]) res->budget_ok = 0;
}

/* ======================================================================
 * setup and reporting
 * ====================================================================== */

static int setup_inputs(struct event_base *base, const struct opts *o, const char *hostport, struct input_desc *in,
                        int *nin) {
    struct evhttp_connection *conn = evhttp_connection_base_new(base, NULL, o->host, (unsigned short)o->port);
    char path[512], *body = NULL;
    if (o->version) snprintf(path, sizeof path, "/v2/models/%s/versions/%s", o->model, o->version);
    else snprintf(path, sizeof path, "/v2/models/%s", o->model);
    int st = http_get(base, conn, hostport, path, &body);
    if (st != 200) {
        if (st < 0) fprintf(stderr, "kiln bench: GET %s on %s failed (cannot connect)\n", path, hostport);
        else fprintf(stderr, "kiln bench: GET %s on %s failed (HTTP %d: %.300s)\n", path, hostport, st, body ? body : "");
        free(body);
        evhttp_connection_free(conn);
        return -1;
    }
    cJSON *meta = cJSON_Parse(body);
    free(body);
    /* The config tells whether the first dim is the batch dim. */
    int max_batch = -1;
    snprintf(path + strlen(path), sizeof path - strlen(path), "/config");
    if (http_get(base, conn, hostport, path, &body) == 200) {
        cJSON *cfg = cJSON_Parse(body);
        cJSON *mb = cfg ? cJSON_GetObjectItem(cfg, "max_batch_size") : NULL;
        if (cJSON_IsNumber(mb)) max_batch = (int)mb->valuedouble;
        cJSON_Delete(cfg);
    }
    free(body);
    evhttp_connection_free(conn);
    /* Every request would be refused: say so now instead of measuring errors. */
    if (max_batch > 0 && o->batch > max_batch) {
        fprintf(stderr, "kiln bench: --batch-size %d is larger than model '%s''s max_batch_size %d\n", o->batch, o->model,
                max_batch);
        cJSON_Delete(meta);
        return -1;
    }
    if (max_batch == 0 && o->batch > 1) {
        fprintf(stderr, "kiln bench: model '%s' does not batch (max_batch_size 0): --batch-size %d cannot apply\n",
                o->model, o->batch);
        cJSON_Delete(meta);
        return -1;
    }
    cJSON *inputs = meta ? cJSON_GetObjectItem(meta, "inputs") : NULL;
    if (!cJSON_IsArray(inputs)) {
        fprintf(stderr, "kiln bench: model metadata has no inputs\n");
        cJSON_Delete(meta);
        return -1;
    }
    *nin = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, inputs) {
        if (*nin == MAX_INPUTS) break;
        struct input_desc *d = &in[(*nin)++];
        memset(d, 0, sizeof *d);
        snprintf(d->name, sizeof d->name, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(it, "name")));
        d->dtype = dtype_from_kserve(cJSON_GetStringValue(cJSON_GetObjectItem(it, "datatype")) ?: "");
        if (d->dtype == DT_UNDEFINED || d->dtype == DT_STRING) {
            fprintf(stderr, "kiln bench: input '%s' has a datatype kiln bench cannot generate\n", d->name);
            cJSON_Delete(meta);
            return -1;
        }
        cJSON *shape = cJSON_GetObjectItem(it, "shape");
        d->ndim = cJSON_GetArraySize(shape);
        if (d->ndim > TENSOR_MAX_DIMS) d->ndim = TENSOR_MAX_DIMS;
        for (int k = 0; k < d->ndim; k++) {
            int64_t v = (int64_t)cJSON_GetArrayItem(shape, k)->valuedouble;
            if (v < 0) v = (k == 0 && max_batch != 0) ? o->batch : 1;
            d->dims[k] = v;
        }
        for (int s = 0; s < o->nshape_override; s++) {
            const char *colon = strchr(o->shape_override[s], ':');
            if (!colon || strncmp(o->shape_override[s], d->name, (size_t)(colon - o->shape_override[s])) != 0 ||
                d->name[colon - o->shape_override[s]])
                continue;
            d->ndim = 0;
            for (const char *p = colon + 1; *p;) {
                char *end;
                long long v = strtoll(p, &end, 10), hi = 0;
                if (end != p && *end == '-') {
                    const char *h = end + 1;
                    hi = strtoll(h, &end, 10);
                    if (end == h || hi <= v) hi = -1;
                }
                if (end == p || v < 0 || hi < 0 || (*end && *end != ',') || d->ndim == TENSOR_MAX_DIMS) {
                    fprintf(stderr, "kiln bench: --shape %s: expected NAME:D1,D2,... with dims >= 0 (a dim LO-HI "
                            "draws a length per request)\n", o->shape_override[s]);
                    cJSON_Delete(meta);
                    return -1;
                }
                d->hi[d->ndim] = hi;
                d->dims[d->ndim++] = v;
                p = *end == ',' ? end + 1 : end;
            }
        }
    }
    cJSON_Delete(meta);
    /* A --shape for an input the model does not have would be silently ignored. */
    for (int s = 0; s < o->nshape_override; s++) {
        const char *colon = strchr(o->shape_override[s], ':');
        int known = 0;
        for (int i = 0; colon && i < *nin; i++)
            known |= strncmp(o->shape_override[s], in[i].name, (size_t)(colon - o->shape_override[s])) == 0 &&
                     in[i].name[colon - o->shape_override[s]] == 0;
        if (!known) {
            fprintf(stderr, "kiln bench: --shape %s: %s\n", o->shape_override[s],
                    colon ? "the model has no input of that name" : "expected NAME:D1,D2,...");
            return -1;
        }
    }
    /* Files. */
    const char *id = o->input_data;
    if (strcmp(id, "random") != 0 && strcmp(id, "zero") != 0) {
        size_t L = strlen(id);
        if (L > 5 && strcmp(id + L - 5, ".json") == 0) {
            if (load_json_inputs(id, in, *nin, max_batch > 0, o->batch) < 0) return -1;
        } else if (strchr(id, '=')) {
            char *copy = strdup(id), *save = NULL;
            for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                char *eq = strchr(tok, '=');
                if (!eq) continue;
                *eq = 0;
                int found = 0;
                for (int i = 0; i < *nin; i++)
                    if (strcmp(in[i].name, tok) == 0) {
                        in[i].fixed = read_npy_or_raw(eq + 1, &in[i].fixed_len);
                        found = in[i].fixed != NULL;
                    }
                if (!found) {
                    fprintf(stderr, "kiln bench: --input-data %s=%s: no such input or unreadable file\n", tok, eq + 1);
                    free(copy);
                    return -1;
                }
            }
            free(copy);
        } else {
            if (*nin != 1) {
                fprintf(stderr, "kiln bench: the model has %d inputs: use NAME=FILE,... or a JSON file\n", *nin);
                return -1;
            }
            in[0].fixed = read_npy_or_raw(id, &in[0].fixed_len);
            if (!in[0].fixed) {
                fprintf(stderr, "kiln bench: cannot read %s\n", id);
                return -1;
            }
        }
    }
    return 0;
}

static void print_level(const struct level_result *r, const struct opts *o) {
    double thr = r->seconds > 0 ? (double)r->ok / r->seconds : 0;
    char load[32];
    if (o->rate > 0) snprintf(load, sizeof load, "rate %.0f", r->rate);
    else snprintf(load, sizeof load, "c=%d", r->concurrency);
    printf("%-10s %10.1f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %8llu", load, thr * o->batch,
           hist_quantile(r->h, 0.50) / 1000.0, hist_quantile(r->h, 0.90) / 1000.0, hist_quantile(r->h, 0.95) / 1000.0,
           hist_quantile(r->h, 0.99) / 1000.0, hist_quantile(r->h, 0.999) / 1000.0, r->h->max / 1000.0,
           (unsigned long long)(r->failed + r->dropped));
    if (r->server_count) printf("   %8.1f / %-8.1f", r->server_queue_us, r->server_compute_us);
    else printf("   %17s", "-");
    if (o->nbudgets) printf("  %s", r->budget_ok ? "met" : "NOT MET");
    printf("\n");
    for (int i = 0; i < r->nstatus; i++)
        if (r->status_code[i] >= GRPC_CODE_BASE)
            printf("           %llu failed with grpc-status %d%s%s\n", (unsigned long long)r->status_count[i],
                   r->status_code[i] - GRPC_CODE_BASE, r->status_msg[i][0] ? ": " : "", r->status_msg[i]);
        else if (r->status_code[i])
            printf("           %llu failed with HTTP %d%s%s\n", (unsigned long long)r->status_count[i],
                   r->status_code[i], r->status_msg[i][0] ? ": " : "", r->status_msg[i]);
        else
            printf("           %llu failed with a connection error\n", (unsigned long long)r->status_count[i]);
    if (r->dropped) printf("           %llu not sent: generator backlog full\n", (unsigned long long)r->dropped);
}

static void write_csv(const char *path, const struct level_result *res, int n, const struct opts *o) {
    int fresh = access(path, F_OK) != 0;
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "kiln bench: cannot write %s: %s\n", path, strerror(errno));
        return;
    }
    if (fresh)
        fprintf(f, "model,mode,concurrency,rate,batch,requests,errors,seconds,throughput,p50_us,p90_us,p95_us,p99_us,"
                   "p999_us,max_us,server_queue_us,server_compute_us,budget_met\n");
    for (int i = 0; i < n; i++) {
        const struct level_result *r = &res[i];
        double thr = r->seconds > 0 ? (double)r->ok / r->seconds * o->batch : 0;
        fprintf(f, "%s,%s,%d,%.1f,%d,%llu,%llu,%.3f,%.1f,%llu,%llu,%llu,%llu,%llu,%llu,%.1f,%.1f,%d\n", o->model,
                o->rate > 0 ? (o->poisson ? "poisson" : "constant") : "closed", r->concurrency, r->rate, o->batch,
                (unsigned long long)r->ok, (unsigned long long)(r->failed + r->dropped), r->seconds, thr,
                (unsigned long long)hist_quantile(r->h, 0.5), (unsigned long long)hist_quantile(r->h, 0.9),
                (unsigned long long)hist_quantile(r->h, 0.95), (unsigned long long)hist_quantile(r->h, 0.99),
                (unsigned long long)hist_quantile(r->h, 0.999), (unsigned long long)r->h->max, r->server_queue_us,
                r->server_compute_us, r->budget_ok);
    }
    fclose(f);
}

static void write_json(const char *path, const struct level_result *res, int n, const struct opts *o, int met) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", o->model);
    cJSON_AddNumberToObject(root, "batch_size", o->batch);
    cJSON_AddStringToObject(root, "protocol", o->grpc ? "grpc" : o->json ? "json" : "binary");
    cJSON_AddBoolToObject(root, "budget_met", met);
    cJSON *levels = cJSON_AddArrayToObject(root, "levels");
    for (int i = 0; i < n; i++) {
        const struct level_result *r = &res[i];
        cJSON *l = cJSON_CreateObject();
        if (o->rate > 0) cJSON_AddNumberToObject(l, "rate", r->rate);
        else cJSON_AddNumberToObject(l, "concurrency", r->concurrency);
        cJSON_AddNumberToObject(l, "requests", (double)r->ok);
        cJSON_AddNumberToObject(l, "errors", (double)(r->failed + r->dropped));
        cJSON_AddNumberToObject(l, "seconds", r->seconds);
        cJSON_AddNumberToObject(l, "throughput", r->seconds > 0 ? (double)r->ok / r->seconds * o->batch : 0);
        const double qs[] = {0.5, 0.9, 0.95, 0.99, 0.999};
        const char *qn[] = {"p50_us", "p90_us", "p95_us", "p99_us", "p999_us"};
        for (int k = 0; k < 5; k++) cJSON_AddNumberToObject(l, qn[k], (double)hist_quantile(r->h, qs[k]));
        cJSON_AddNumberToObject(l, "max_us", (double)r->h->max);
        cJSON *errs = cJSON_AddObjectToObject(l, "errors_by_status");
        for (int k = 0; k < r->nstatus; k++) {
            char code[16];
            snprintf(code, sizeof code, "%d", r->status_code[k]);
            cJSON_AddNumberToObject(errs, code, (double)r->status_count[k]);
        }
        if (r->server_count) {
            cJSON_AddNumberToObject(l, "server_requests", (double)r->server_count);
            cJSON_AddNumberToObject(l, "server_queue_us", r->server_queue_us);
            cJSON_AddNumberToObject(l, "server_compute_us", r->server_compute_us);
        }
        cJSON_AddBoolToObject(l, "budget_met", r->budget_ok);
        cJSON_AddItemToArray(levels, l);
    }
    char *text = cJSON_Print(root);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fputc('\n', f);
        fclose(f);
    } else {
        fprintf(stderr, "kiln bench: cannot write %s: %s\n", path, strerror(errno));
    }
    free(text);
    cJSON_Delete(root);
}

/* HOST:PORT (an http:// prefix and a path are ignored) into buf: *host and,
 * when given, *port. */
static void parse_url(const char *u, char *buf, size_t len, const char **host, int *port) {
    if (strncmp(u, "http://", 7) == 0) u += 7;
    snprintf(buf, len, "%s", u);
    char *slash = strchr(buf, '/');
    if (slash) *slash = 0;
    char *colon = strrchr(buf, ':');
    if (colon) {
        *colon = 0;
        *port = atoi(colon + 1);
    }
    *host = buf;
}

/* Registers (or unregisters) the n regions of --shared-memory at the server,
 * on conn (NULL: a connection of its own, closed after). A server sees a
 * region only on the connection that registered it (or with the control
 * token), so each connection of a level registers them all. */
static int shm_regions(struct event_base *base, const struct opts *o, const char *hostport, struct bench_shm *shms,
                       int n, int reg, struct evhttp_connection *on) {
    struct evhttp_connection *conn =
        on ? on : evhttp_connection_base_new(base, NULL, o->host, (unsigned short)o->port);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        char path[200], *send = reg ? bench_shm_register_body(&shms[i]) : NULL, *body = NULL;
        snprintf(path, sizeof path, "/v2/systemsharedmemory/region/%s/%s", shms[i].region, reg ? "register" : "unregister");
        int st = http_sync(base, conn, hostport, EVHTTP_REQ_POST, path, send, &body);
        if (st != 200) {
            fprintf(stderr, "kiln bench: POST %s failed (%s%d: %.300s)\n", path, st < 0 ? "cannot connect, " : "HTTP ",
                    st, body ? body : "");
            rc = -1;
        }
        free(send);
        free(body);
    }
    if (!on) evhttp_connection_free(conn);
    return rc;
}

/* Unregisters and removes the first n objects of --shared-memory; NULL shms is a no-op. */
static void shm_cleanup(struct event_base *base, const struct opts *o, const char *hostport, struct bench_shm *shms,
                        int n) {
    if (!shms) return;
    shm_regions(base, o, hostport, shms, n, 0, NULL);
    for (int i = 0; i < n; i++) bench_shm_destroy(&shms[i]);
    free(shms);
}

int cmd_bench(int argc, char **argv) {
    struct opts o = {.host = "127.0.0.1", .port = 8000, .grpc_port = 8001, .batch = 1, .duration_s = 10, .warmup_s = 1,
                     .input_data = "random", .unique = 64, .max_conns = 512, .timeout_ms = 30000, .seed = 1};
    o.levels[0] = 1;
    o.nlevels = 1;
    o.progress = isatty(2);
    enum { O_POISSON = 256, O_WARMUP, O_INPUT, O_JSONDATA, O_UNIQUE, O_BUDGET, O_CSV, O_JSON, O_NOPROG, O_MAXC, O_TMO,
           O_SEED, O_SHAPE, O_SHM, O_GRPC_URL };
    static const struct option lo[] = {
        {"url", 1, 0, 'u'}, {"model", 1, 0, 'm'}, {"model-version", 1, 0, 'x'}, {"batch-size", 1, 0, 'b'},
        {"concurrency", 1, 0, 'c'}, {"rate", 1, 0, 'r'}, {"duration", 1, 0, 'd'}, {"requests", 1, 0, 'n'},
        {"poisson", 0, 0, O_POISSON}, {"warmup", 1, 0, O_WARMUP}, {"input-data", 1, 0, O_INPUT},
        {"json-data", 0, 0, O_JSONDATA}, {"unique", 1, 0, O_UNIQUE}, {"latency-budget", 1, 0, O_BUDGET},
        {"csv", 1, 0, O_CSV}, {"json", 1, 0, O_JSON}, {"no-progress", 0, 0, O_NOPROG},
        {"max-connections", 1, 0, O_MAXC}, {"timeout-ms", 1, 0, O_TMO}, {"seed", 1, 0, O_SEED},
        {"shape", 1, 0, O_SHAPE}, {"shared-memory", 0, 0, O_SHM}, {"protocol", 1, 0, 'i'},
        {"grpc-url", 1, 0, O_GRPC_URL}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    static char hostbuf[256], grpcbuf[256];
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "u:m:x:b:c:r:d:n:i:h", lo, NULL)) != -1) {
        switch (ch) {
        case 'u': parse_url(optarg, hostbuf, sizeof hostbuf, &o.host, &o.port); break;
        case O_GRPC_URL: parse_url(optarg, grpcbuf, sizeof grpcbuf, &o.grpc_host, &o.grpc_port); break;
        case 'i':
            if (strcmp(optarg, "grpc") != 0 && strcmp(optarg, "http") != 0) {
                fprintf(stderr, "kiln bench: --protocol '%s': expected http or grpc\n", optarg);
                return 2;
            }
            o.grpc = strcmp(optarg, "grpc") == 0;
            break;
        case 'm': o.model = optarg; break;
        case 'x': o.version = optarg; break;
        case 'b': o.batch = atoi(optarg); break;
        case 'c':
            o.nlevels = parse_levels(optarg, o.levels, MAX_LEVELS);
            if (o.nlevels < 0) {
                fprintf(stderr, "kiln bench: --concurrency '%s': expected N, A:B:xF, A:B:+S or A,B,C\n", optarg);
                return 2;
            }
            break;
        case 'r': o.rate = atof(optarg); break;
        case 'd': o.duration_s = atof(optarg); break;
        case 'n': o.requests = atol(optarg); break;
        case O_POISSON: o.poisson = 1; break;
        case O_WARMUP: o.warmup_s = atof(optarg); break;
        case O_INPUT: o.input_data = optarg; break;
        case O_JSONDATA: o.json = 1; break;
        case O_SHM: o.shared_memory = 1; break;
        case O_UNIQUE: o.unique = atoi(optarg); break;
        case O_BUDGET:
            o.nbudgets = parse_budget(optarg, o.budget_q, o.budget_us, MAX_BUDGETS);
            if (o.nbudgets < 0) {
                fprintf(stderr, "kiln bench: --latency-budget '%s': expected e.g. p99=20ms or p50=2ms,p99.9=50ms\n",
                        optarg);
                return 2;
            }
            break;
        case O_CSV: o.csv = optarg; break;
        case O_JSON: o.json_out = optarg; break;
        case O_NOPROG: o.progress = 0; break;
        case O_MAXC: o.max_conns = atoi(optarg); break;
        case O_TMO: o.timeout_ms = atoi(optarg); break;
        case O_SEED: o.seed = strtoull(optarg, NULL, 10); break;
        case O_SHAPE:
            if (o.nshape_override < MAX_INPUTS)
                snprintf(o.shape_override[o.nshape_override++], sizeof o.shape_override[0], "%s", optarg);
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!o.model) {
        fprintf(stderr, "kiln bench: -m MODEL is required\n\n");
        usage(stderr);
        return 2;
    }
    if (o.shared_memory && o.json) {
        fprintf(stderr, "kiln bench: --shared-memory and --json-data exclude each other\n");
        return 2;
    }
    if (o.batch < 1 || o.duration_s <= 0 || o.unique < 1 || o.max_conns < 1 || o.timeout_ms < 1 || o.port <= 0 ||
        o.port > 65535 || o.grpc_port <= 0 || o.grpc_port > 65535 || o.rate < 0) {
        fprintf(stderr, "kiln bench: a numeric option is out of range (batch, duration, unique, rate, port)\n");
        return 2;
    }
    /* Precise timers: by default libevent reads CLOCK_MONOTONIC_COARSE,
     * which advances once per kernel tick (4 ms at HZ=250), so open-loop
     * sends fired up to a tick after their scheduled time and that lag
     * showed up in every latency measured from the schedule. */
    struct event_config *cfg = event_config_new();
    struct event_base *base = NULL;
    if (cfg) {
        event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
        base = event_base_new_with_config(cfg);
        event_config_free(cfg);
    }
    if (!base) {
        fprintf(stderr, "kiln bench: cannot create an event loop\n");
        return 2;
    }
    char hostport[300];
    snprintf(hostport, sizeof hostport, "%s:%d", o.host, o.port);
    struct input_desc in[MAX_INPUTS];
    int nin = 0;
    if (setup_inputs(base, &o, hostport, in, &nin) < 0) {
        event_base_free(base);
        return 2;
    }
    struct run r = {.base = base, .o = &o};
    snprintf(r.hostport, sizeof r.hostport, "%s", hostport);
    if (!o.grpc_host) o.grpc_host = o.host;
    if (o.grpc && (o.json || o.shared_memory)) {
        fprintf(stderr, "kiln bench: --%s is for HTTP: gRPC requests carry raw_input_contents\n",
                o.json ? "json-data" : "shared-memory");
        return 2;
    }
    if (o.grpc) snprintf(r.path, sizeof r.path, "/inference.GRPCInferenceService/ModelInfer");
    else if (o.version) snprintf(r.path, sizeof r.path, "/v2/models/%s/versions/%s/infer", o.model, o.version);
    else snprintf(r.path, sizeof r.path, "/v2/models/%s/infer", o.model);
    int fixed = 1;
    for (int i = 0; i < nin; i++) fixed &= in[i].fixed != NULL;
    r.nbodies = fixed ? 1 : o.unique;
    r.bodies = calloc((size_t)r.nbodies, sizeof *r.bodies);
    struct bench_shm *shms = o.shared_memory ? calloc((size_t)r.nbodies, sizeof *shms) : NULL;
    uint64_t rng = o.seed * 0x9e3779b97f4a7c15ull + 1;
    int built = 0;
    int zero = strcmp(o.input_data, "zero") == 0;
    for (; built < r.nbodies; built++)
        if ((o.grpc ? build_grpc_body(&o, in, nin, zero, &rng, &r.bodies[built])
                    : build_body(in, nin, o.json, zero, &rng, &r.bodies[built], shms ? &shms[built] : NULL, built)) < 0)
            break;
    /* Registered once here to report a refusal before any load; the
     * connections of each level register them again for themselves. */
    r.shms = shms;
    if (built < r.nbodies || (shms && shm_regions(base, &o, hostport, shms, r.nbodies, 1, NULL) < 0)) {
        shm_cleanup(base, &o, hostport, shms, built);
        for (int i = 0; i < built; i++) free(r.bodies[i].data);
        free(r.bodies);
        for (int i = 0; i < nin; i++) free(in[i].fixed);
        event_base_free(base);
        return 2;
    }
    int nlev = o.rate > 0 ? 1 : o.nlevels;
    struct level_result *res = calloc((size_t)nlev, sizeof *res);
    char target[300];
    if (o.grpc) snprintf(target, sizeof target, "grpc://%s:%d", o.grpc_host, o.grpc_port);
    else snprintf(target, sizeof target, "http://%s", hostport);
    printf("kiln bench: model '%s' at %s, %s requests of %zu bytes, batch %d, %s\n", o.model, target,
           o.grpc ? "gRPC (raw_input_contents)" : o.shared_memory ? "shared-memory" : o.json ? "JSON" : "binary",
           r.bodies[0].len, o.batch,
           o.rate > 0 ? (o.poisson ? "open loop (Poisson)" : "open loop (constant rate)") : "closed loop");
    printf("%-10s %10s %9s %9s %9s %9s %9s %9s %8s   %17s%s\n", "load", "infer/s", "p50 ms", "p90 ms", "p95 ms",
           "p99 ms", "p99.9 ms", "max ms", "errors", "server queue/comp", o.nbudgets ? "  budget" : "");
    int met = 1;
    for (int i = 0; i < nlev; i++) {
        run_level(&r, o.rate > 0 ? 0 : o.levels[i], &res[i]);
        print_level(&res[i], &o);
        fflush(stdout);
        met &= res[i].budget_ok;
    }
    if (o.csv) write_csv(o.csv, res, nlev, &o);
    if (o.json_out) write_json(o.json_out, res, nlev, &o, met);
    if (o.nbudgets) {
        printf("latency budget %s\n", met ? "met" : "NOT met");
    }
    int any_failed = 0;
    for (int i = 0; i < nlev; i++) any_failed |= res[i].ok == 0;
    if (r.phase_ev) event_free(r.phase_ev);
    for (int i = 0; i < nlev; i++) free(res[i].h);
    free(res);
    for (int i = 0; i < r.nbodies; i++) free(r.bodies[i].data);
    free(r.bodies);
    shm_cleanup(base, &o, hostport, shms, r.nbodies);
    for (int i = 0; i < nin; i++) free(in[i].fixed);
    event_base_free(base);
    if (o.nbudgets) return met ? 0 : 1;
    /* Without a budget, a level where no request succeeded measured nothing: fail the run. */
    return any_failed ? 1 : 0;
}
