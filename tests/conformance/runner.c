/* runner.c - ONNX conformance: runs onnx's backend node tests and the nine
 * "light" model tests through kiln's public engine API (model_load,
 * model_run) and compares every output with per-dtype tolerances.
 *
 *   build/conformance [--data DIR] [--skip FILE] [--filter GLOB] [--timeout S]
 *                     [--threads N] [--no-light] [--no-node] [--write-skipped FILE] [-v]
 *
 * A node test runs when every op of its model resolves (op_find) and its
 * inputs/outputs are tensors of dtypes kiln has; otherwise it is skipped with
 * the reason. tests/conformance/skip.txt lists tests skipped on purpose
 * although their ops resolve (name or glob, then the reason). Each test runs
 * in a forked child with a timeout and a memory limit, so a crash or a hang
 * in one kernel is one failure, not the end of the run. --write-skipped
 * records every skip and its reason (tests/conformance/skipped.txt is that
 * list, committed). The last line is
 *   conformance: N passed, M failed, K skipped
 * and the exit code is 1 when anything failed. */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <protobuf-c/protobuf-c.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "models/control.h"
#include "models/model.h"
#include "models/onnx_load.h"
#include "onnx/onnx.pb-c.h"

#define MSG_MAX 1024

struct options {
    const char *data_dir;
    const char *skip_file;
    const char *filter;
    int timeout_s;
    int light_timeout_s;
    int threads;
    int run_light, run_node;
    int verbose;
};

struct skip_entry {
    char *pattern;
    char *reason;
};

struct counts {
    int passed, failed, skipped;
};

/* Ops that made node tests skip, to tell the op authors what matters most. */
struct wanted {
    char *op;
    int tests;
};
static struct wanted *g_wanted;
static int g_nwanted;

static void want_op(const char *op) {
    for (int i = 0; i < g_nwanted; i++)
        if (strcmp(g_wanted[i].op, op) == 0) {
            g_wanted[i].tests++;
            return;
        }
    struct wanted *w = realloc(g_wanted, (size_t)(g_nwanted + 1) * sizeof *w);
    if (!w) return;
    g_wanted = w;
    g_wanted[g_nwanted].op = strdup(op);
    g_wanted[g_nwanted].tests = 1;
    g_nwanted++;
}

static double now_ms(void) { return (double)clock_now_ns() / 1e6; }

/* ---- skip list ---------------------------------------------------------- */

static struct skip_entry *load_skips(const char *path, int *n) {
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    struct skip_entry *v = NULL;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '#' || *p == '\n' || !*p) continue;
        p[strcspn(p, "\r\n")] = 0;
        char *sp = p + strcspn(p, " \t");
        char *reason = sp;
        if (*sp) {
            *sp = 0;
            reason = sp + 1;
            while (*reason == ' ' || *reason == '\t') reason++;
        }
        struct skip_entry *nv = realloc(v, (size_t)(*n + 1) * sizeof *nv);
        if (!nv) break;
        v = nv;
        v[*n].pattern = strdup(p);
        v[*n].reason = strdup(*reason ? reason : "(no reason given)");
        (*n)++;
    }
    fclose(f);
    return v;
}

static const char *skip_reason(const struct skip_entry *s, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (fnmatch(s[i].pattern, name, 0) == 0) return s[i].reason;
    return NULL;
}

/* ---- static check of a model: can kiln run it at all? ------------------- */

static int dtype_known(int64_t dt) {
    return dt > 0 && dt < DT_MAX_ && dt != 14 && dt != 15 && dtype_size((enum dtype)dt) > 0;
}

static int io_reason(const Onnx__ValueInfoProto *vi, char *why, size_t cap) {
    const Onnx__TypeProto *tp = vi->type;
    if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type) {
        snprintf(why, cap, "'%s' is not a tensor (sequence/map/optional types are not supported)",
                 vi->name ? vi->name : "?");
        return 1;
    }
    int64_t dt = tp->tensor_type->has_elem_type ? tp->tensor_type->elem_type : 0;
    if (!dtype_known(dt)) {
        static const char *const names[] = {
            [14] = "complex64",  [15] = "complex128",     [17] = "float8e4m3fn", [18] = "float8e4m3fnuz",
            [19] = "float8e5m2", [20] = "float8e5m2fnuz", [21] = "uint4",        [22] = "int4",
            [23] = "float4e2m1", [24] = "float8e8m0",     [25] = "uint2",        [26] = "int2",
        };
        const char *dn = dt >= 0 && dt < (int64_t)(sizeof names / sizeof names[0]) && names[dt] ? names[dt] : "unknown";
        snprintf(why, cap, "'%s' has element type %s (%lld), which kiln does not support", vi->name ? vi->name : "?",
                 dn, (long long)dt);
        return 1;
    }
    return 0;
}

/* Lists the ops of gp and of its subgraphs (If, Loop, Scan bodies) that
 * kiln does not have into why. */
static void graph_ops_reason(const Onnx__GraphProto *gp, char *why, size_t cap, size_t *used, int *r, int count_ops,
                             int depth) {
    if (depth > 16) return;
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        const char *dom = np->domain ? np->domain : "";
        for (size_t a = 0; a < np->n_attribute; a++) {
            const Onnx__AttributeProto *ap = np->attribute[a];
            if (ap->g) graph_ops_reason(ap->g, why, cap, used, r, count_ops, depth + 1);
            for (size_t k = 0; k < ap->n_graphs; k++) graph_ops_reason(ap->graphs[k], why, cap, used, r, count_ops, depth + 1);
        }
        if (!np->op_type || control_op_find(dom, np->op_type) || op_find(dom, np->op_type)) continue;
        char tag[160];
        snprintf(tag, sizeof tag, "%s%s%s", *dom ? dom : "", *dom ? "." : "", np->op_type);
        if (strstr(why, tag)) continue; /* list each op once */
        if (!*r) *used = (size_t)snprintf(why, cap, "unsupported op %s", tag);
        else if (*used < cap) *used += (size_t)snprintf(why + *used, cap - *used, ", %s", tag);
        if (count_ops) want_op(tag);
        *r = 1;
    }
}

/* Returns 1 and a reason when the model uses something kiln does not have:
 * an unknown op (in the graph or its subgraphs), a non-tensor or exotic-dtype input/output. */
static int unsupported_reason(const char *model_path, char *why, size_t cap, int count_ops) {
    FILE *f = fopen(model_path, "rb");
    if (!f) {
        snprintf(why, cap, "cannot open %s", model_path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
    if (!buf || (len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len)) {
        fclose(f);
        free(buf);
        snprintf(why, cap, "cannot read %s", model_path);
        return 1;
    }
    fclose(f);
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, (size_t)len, buf);
    free(buf);
    if (!mp || !mp->graph) {
        if (mp) onnx__model_proto__free_unpacked(mp, NULL);
        return 0; /* let the loader report it: a failure, not a skip */
    }
    const Onnx__GraphProto *gp = mp->graph;
    int r = 0;
    size_t used = 0;
    why[0] = 0;
    graph_ops_reason(gp, why, cap, &used, &r, count_ops, 0);
    for (size_t i = 0; !r && i < gp->n_input; i++) r = io_reason(gp->input[i], why, cap);
    for (size_t i = 0; !r && i < gp->n_output; i++) r = io_reason(gp->output[i], why, cap);
    onnx__model_proto__free_unpacked(mp, NULL);
    return r;
}

/* ---- comparison --------------------------------------------------------- */

static double elem_as_double(const struct tensor *t, int64_t i) {
    switch (t->dtype) {
    case DT_FP32: return ((const float *)t->data)[i];
    case DT_FP64: return ((const double *)t->data)[i];
    case DT_FP16: return fp16_to_fp32(((const uint16_t *)t->data)[i]);
    case DT_BF16: return bf16_to_fp32(((const uint16_t *)t->data)[i]);
    case DT_FP8E4M3FN: case DT_FP8E4M3FNUZ: case DT_FP8E5M2: case DT_FP8E5M2FNUZ: case DT_FP4E2M1: case DT_FP8E8M0:
        return fp8_to_fp32(((const uint8_t *)t->data)[i], t->dtype);
    default: return 0;
    }
}

static int64_t elem_as_i64(const struct tensor *t, int64_t i, uint64_t *u) {
    *u = 0;
    switch (t->dtype) {
    case DT_UINT8: case DT_BOOL: return ((const uint8_t *)t->data)[i];
    case DT_INT8: case DT_INT4: case DT_INT2: return ((const int8_t *)t->data)[i];
    case DT_UINT4: case DT_UINT2: return ((const uint8_t *)t->data)[i];
    case DT_UINT16: return ((const uint16_t *)t->data)[i];
    case DT_INT16: return ((const int16_t *)t->data)[i];
    case DT_INT32: return ((const int32_t *)t->data)[i];
    case DT_UINT32: return ((const uint32_t *)t->data)[i];
    case DT_INT64: return ((const int64_t *)t->data)[i];
    case DT_UINT64: *u = ((const uint64_t *)t->data)[i]; return 0;
    default: return 0;
    }
}

static void tolerances(enum dtype dt, double *rtol, double *atol) {
    switch (dt) {
    case DT_FP16: *rtol = 1e-2; *atol = 1e-3; break;
    case DT_BF16: *rtol = 2e-2; *atol = 1e-2; break;
    /* float8 and float4 results are one rounding of the exact value: bit-exact (NaN matches NaN) */
    case DT_FP8E4M3FN: case DT_FP8E4M3FNUZ: case DT_FP8E5M2: case DT_FP8E5M2FNUZ: case DT_FP4E2M1: case DT_FP8E8M0:
        *rtol = 0; *atol = 0; break;
    default: *rtol = 1e-3; *atol = 1e-5; break;
    }
}

/* Formats an element index as coordinates: "[0,3,1]". */
static void coords(const struct tensor *t, int64_t i, char *buf, size_t cap) {
    int64_t c[TENSOR_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        c[d] = t->dims[d] ? i % t->dims[d] : 0;
        i = t->dims[d] ? i / t->dims[d] : 0;
    }
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && n < cap; d++) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? "," : "", (long long)c[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Returns 0 when got matches want; else writes the first mismatch. */
static int compare(const char *name, const struct tensor *got, const struct tensor *want, double rtol_scale,
                   char *msg, size_t cap) {
    char sg[128], sw[128];
    if (got->dtype != want->dtype) {
        snprintf(msg, cap, "output '%s': dtype %s, expected %s", name, dtype_name(got->dtype),
                 dtype_name(want->dtype));
        return 1;
    }
    if (!tensor_same_shape(got, want)) {
        snprintf(msg, cap, "output '%s': shape %s, expected %s", name, tensor_shape_str(got, sg, sizeof sg),
                 tensor_shape_str(want, sw, sizeof sw));
        return 1;
    }
    int64_t n = tensor_numel(want);
    if (n > 0 && !got->data) {
        snprintf(msg, cap, "output '%s': no data", name);
        return 1;
    }
    int64_t bad = 0, first = -1;
    char detail[256] = "";
    enum dtype dt = want->dtype;
    if (dt == DT_FP32 || dt == DT_FP64 || dt == DT_FP16 || dt == DT_BF16 || dtype_is_minifloat(dt) || dt == DT_FP8E8M0) {
        double rtol, atol, worst = 0;
        tolerances(dt, &rtol, &atol);
        rtol *= rtol_scale;
        for (int64_t i = 0; i < n; i++) {
            double a = elem_as_double(got, i), b = elem_as_double(want, i);
            int ok;
            if (isnan(b)) ok = isnan(a);
            else if (isinf(b)) ok = a == b;
            else ok = fabs(a - b) <= atol + rtol * fabs(b);
            if (!ok) {
                double d = fabs(a - b);
                if (first < 0 || d > worst) worst = d;
                if (first < 0) {
                    first = i;
                    snprintf(detail, sizeof detail, "got %.9g, expected %.9g (atol %g, rtol %g)", a, b, atol, rtol);
                }
                bad++;
            }
        }
        if (bad) {
            size_t l = strlen(detail);
            snprintf(detail + l, sizeof detail - l, "; largest |diff| %.3g", worst);
        }
    } else if (dt == DT_STRING) {
        const struct tensor_str *a = tensor_strs(got), *b = tensor_strs(want);
        for (int64_t i = 0; i < n; i++)
            if (!tensor_str_eq(a[i], b[i])) {
                if (first < 0) {
                    first = i;
                    snprintf(detail, sizeof detail, "got \"%.*s\" (%zu bytes), expected \"%.*s\" (%zu bytes)",
                             (int)(a[i].len < 60 ? a[i].len : 60), a[i].p ? a[i].p : "", a[i].len,
                             (int)(b[i].len < 60 ? b[i].len : 60), b[i].p ? b[i].p : "", b[i].len);
                }
                bad++;
            }
    } else {
        for (int64_t i = 0; i < n; i++) {
            uint64_t ua, ub;
            int64_t a = elem_as_i64(got, i, &ua), b = elem_as_i64(want, i, &ub);
            if (a != b || ua != ub) {
                if (first < 0) {
                    first = i;
                    if (dt == DT_UINT64)
                        snprintf(detail, sizeof detail, "got %llu, expected %llu", (unsigned long long)ua,
                                 (unsigned long long)ub);
                    else
                        snprintf(detail, sizeof detail, "got %lld, expected %lld", (long long)a, (long long)b);
                }
                bad++;
            }
        }
    }
    if (!bad) return 0;
    char at[160];
    coords(want, first, at, sizeof at);
    snprintf(msg, cap, "output '%s' %s: %lld of %lld elements differ; first at %s: %s", name,
             tensor_shape_str(want, sw, sizeof sw), (long long)bad, (long long)n, at, detail);
    return 1;
}

/* ---- one test, in a child ------------------------------------------------ */

static int cmp_pb_index(const void *a, const void *b) {
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    const char *ux = strrchr(x, '_'), *uy = strrchr(y, '_');
    long ix = ux ? strtol(ux + 1, NULL, 10) : 0, iy = uy ? strtol(uy + 1, NULL, 10) : 0;
    return ix < iy ? -1 : ix > iy;
}

/* Lists "<prefix>_<i>.pb" files of a folder sorted by i. */
static int list_pbs(const char *dir, const char *prefix, char ***out) {
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    size_t pl = strlen(prefix);
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, prefix, pl) != 0 || e->d_name[pl] != '_' || l < 3 || strcmp(e->d_name + l - 3, ".pb"))
            continue;
        char **nv = realloc(*out, (size_t)(n + 1) * sizeof *nv);
        if (!nv) break;
        *out = nv;
        if (asprintf(&(*out)[n], "%s/%s", dir, e->d_name) < 0) break;
        n++;
    }
    closedir(d);
    if (n) qsort(*out, (size_t)n, sizeof **out, cmp_pb_index);
    return n;
}

/* Loads the model, feeds the inputs, compares the outputs. Runs in the child;
 * everything it allocates dies with it. */
/* --backend: "cpu" (the reference) or "cuda" (each test, in its own child,
 * makes its own device context). */
static const char *g_backend = "cpu";

static int run_model_test(const char *model_path, struct tensor *in, char **in_names, int nin, struct tensor *want,
                          int nwant, int threads, double rtol_scale, char *msg, size_t cap) {
    char err[MSG_MAX];
    struct model_params p = {.path = model_path, .cpu_only = 1};
    struct model *m = model_load(&p, err, sizeof err);
    if (!m) {
        snprintf(msg, cap, "load: %s", err);
        return 1;
    }
    int mi = model_ninputs(m), mo = model_noutputs(m);
    if (mi != nin) {
        snprintf(msg, cap, "model has %d inputs, test data has %d", mi, nin);
        return 1;
    }
    struct tensor *ordered = calloc((size_t)(mi ? mi : 1), sizeof *ordered);
    for (int i = 0; i < mi; i++) {
        const struct model_io *io = model_input(m, i);
        int pick = i;
        for (int k = 0; k < nin; k++)
            if (in_names && in_names[k] && io->name && strcmp(in_names[k], io->name) == 0) pick = k;
        ordered[i] = in[pick];
    }
    if (mo < nwant) {
        snprintf(msg, cap, "model has %d outputs, test data expects %d", mo, nwant);
        return 1;
    }
    struct backend *be = NULL;
    if (strcmp(g_backend, "cpu") != 0) {
        char why[512] = "";
        struct backend_params bp = {.device = 0, .nthreads = threads};
        be = backend_create(g_backend, &bp, why, sizeof why);
        if (!be) {
            snprintf(msg, cap, "backend %s: %s", g_backend, why);
            return 1;
        }
    }
    /* The child exits after one test: the backend lives as long as it does. */
    struct model_exec *x = model_exec_create(m, be, threads);
    if (!x) {
        snprintf(msg, cap, "model_exec_create failed");
        return 1;
    }
    struct tensor *out = calloc((size_t)(mo ? mo : 1), sizeof *out);
    int rc = model_run(x, ordered, mi, out, mo, err, sizeof err);
    if (rc) {
        snprintf(msg, cap, "run: %s (%s)", err, status_str(rc));
        return 1;
    }
    for (int i = 0; i < nwant; i++) {
        const struct model_io *io = model_output(m, i);
        if (compare(io->name ? io->name : "?", &out[i], &want[i], rtol_scale, msg, cap)) return 1;
    }
    return 0;
}

static int node_test_child(const char *dir, int threads, char *msg, size_t cap) {
    char model[4096], set[4096], err[MSG_MAX];
    snprintf(model, sizeof model, "%s/model.onnx", dir);
    snprintf(set, sizeof set, "%s/test_data_set_0", dir);
    char **ins, **outs;
    int nin = list_pbs(set, "input", &ins), nout = list_pbs(set, "output", &outs);
    struct tensor *in = calloc((size_t)nin + 1, sizeof *in), *want = calloc((size_t)nout + 1, sizeof *want);
    char **names = calloc((size_t)nin + 1, sizeof *names);
    for (int i = 0; i < nin; i++)
        if (onnx_load_tensor_file(ins[i], &in[i], &names[i], err, sizeof err)) {
            snprintf(msg, cap, "test input: %s", err);
            return 1;
        }
    for (int i = 0; i < nout; i++)
        if (onnx_load_tensor_file(outs[i], &want[i], NULL, err, sizeof err)) {
            snprintf(msg, cap, "test output: %s", err);
            return 1;
        }
    return run_model_test(model, in, names, nin, want, nout, threads, 1.0, msg, cap);
}

static int light_test_child(const char *model_path, const char *out_pb, int threads, char *msg, size_t cap) {
    char err[MSG_MAX];
    struct tensor want;
    if (onnx_load_tensor_file(out_pb, &want, NULL, err, sizeof err)) {
        snprintf(msg, cap, "expected output: %s", err);
        return 1;
    }
    /* The input's shape comes from the graph (unknown dims = 1), its data is
     * arange(n)/n: the convention of onnx's light model tests. */
    char lerr[MSG_MAX];
    struct graph *g = onnx_load_file(model_path, lerr, sizeof lerr);
    if (!g) {
        snprintf(msg, cap, "load: %s", lerr);
        return 1;
    }
    if (g->ninputs != 1) {
        snprintf(msg, cap, "expected one input, model has %d", g->ninputs);
        return 1;
    }
    struct tensor in = g->values[g->inputs[0]].t;
    for (int d = 0; d < in.ndim; d++)
        if (in.dims[d] < 0) in.dims[d] = 1;
    int64_t n = tensor_numel(&in);
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)((double)i / (double)n);
    in.data = x;
    graph_free(g);
    return run_model_test(model_path, &in, NULL, 1, &want, 1, threads, 1.0, msg, cap);
}

enum outcome { OUT_PASS, OUT_FAIL, OUT_SKIP };

struct job {
    int light;
    const char *dir;      /* node test folder */
    const char *model;    /* light model */
    const char *out_pb;   /* light expected output */
};

/* Forks, runs the job in the child under a timeout, and reports. */
static enum outcome run_forked(const struct job *j, const struct options *o, char *msg, size_t cap, double *ms) {
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(msg, cap, "pipe: %s", strerror(errno));
        return OUT_FAIL;
    }
    double t0 = now_ms();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        snprintf(msg, cap, "fork: %s", strerror(errno));
        return OUT_FAIL;
    }
    if (pid == 0) {
        close(fds[0]);
        alarm((unsigned)(j->light ? o->light_timeout_s : o->timeout_s));
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
        /* A kernel that allocates without bound must not take the machine down. */
        struct rlimit rl = {.rlim_cur = (rlim_t)16 << 30, .rlim_max = (rlim_t)16 << 30};
        setrlimit(RLIMIT_AS, &rl);
#endif
        char cmsg[MSG_MAX] = "";
        int rc = j->light ? light_test_child(j->model, j->out_pb, o->threads, cmsg, sizeof cmsg)
                          : node_test_child(j->dir, o->threads, cmsg, sizeof cmsg);
        ssize_t wr = write(fds[1], cmsg, strnlen(cmsg, sizeof cmsg - 1));
        (void)wr;
        close(fds[1]);
        _exit(rc ? 1 : 0);
    }
    close(fds[1]);
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fds[0], msg + got, cap - 1 - got);
        if (r > 0 && got + (size_t)r < cap - 1) {
            got += (size_t)r;
            continue;
        }
        if (r > 0) got += (size_t)r;
        if (r < 0 && errno == EINTR) continue;
        break;
    }
    msg[got] = 0;
    close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    *ms = now_ms() - t0;
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        if (sig == SIGALRM)
            snprintf(msg, cap, "timed out after %d s", j->light ? o->light_timeout_s : o->timeout_s);
        else
            snprintf(msg, cap, "crashed with signal %d (%s)", sig, strsignal(sig));
        return OUT_FAIL;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return OUT_PASS;
    if (!got) snprintf(msg, cap, "exited with status %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return OUT_FAIL;
}

static FILE *g_skipped_out; /* --write-skipped: every skip with its reason */

static void report(struct counts *c, enum outcome r, const char *name, const char *msg, double ms, int verbose) {
    if (r == OUT_SKIP && g_skipped_out) fprintf(g_skipped_out, "%s\t%s\n", name, msg);
    switch (r) {
    case OUT_PASS:
        c->passed++;
        if (verbose) printf("PASS %s (%.0f ms)\n", name, ms);
        break;
    case OUT_FAIL:
        c->failed++;
        printf("FAIL %s: %s\n", name, msg);
        break;
    case OUT_SKIP:
        c->skipped++;
        printf("SKIP %s: %s\n", name, msg);
        break;
    }
    fflush(stdout);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_wanted(const void *a, const void *b) {
    const struct wanted *x = a, *y = b;
    return y->tests - x->tests;
}

static void usage(void) {
    fprintf(stderr, "usage: conformance [--data DIR] [--skip FILE] [--filter GLOB] [--timeout S] "
                    "[--light-timeout S] [--threads N] [--backend cpu|cuda] [--no-light] [--no-node] [--write-skipped FILE] [-v]\n");
}

int main(int argc, char **argv) {
    struct options o = {
        .data_dir = ".venv/lib/python3.11/site-packages/onnx/backend/test/data",
        .skip_file = "tests/conformance/skip.txt",
        .timeout_s = 60,
        .light_timeout_s = 300,
        .threads = 1,
        .run_light = 1,
        .run_node = 1,
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--data") && v) o.data_dir = argv[++i];
        else if (!strcmp(a, "--skip") && v) o.skip_file = argv[++i];
        else if (!strcmp(a, "--filter") && v) o.filter = argv[++i];
        else if (!strcmp(a, "--timeout") && v) o.timeout_s = atoi(argv[++i]);
        else if (!strcmp(a, "--light-timeout") && v) o.light_timeout_s = atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && v) o.threads = atoi(argv[++i]);
        else if (!strcmp(a, "--backend") && v) g_backend = argv[++i];
        else if (!strcmp(a, "--no-light")) o.run_light = 0;
        else if (!strcmp(a, "--no-node")) o.run_node = 0;
        else if (!strcmp(a, "-v")) o.verbose = 1;
        else if (!strcmp(a, "--write-skipped") && v) {
            if (!(g_skipped_out = fopen(argv[++i], "w"))) {
                fprintf(stderr, "conformance: cannot write %s: %s\n", argv[i], strerror(errno));
                return 2;
            }
            fprintf(g_skipped_out, "# Generated by tools/conformance.sh --write-skipped: every conformance test\n"
                                   "# skipped at the last update, with the reason (name, tab, reason).\n");
        }
        else {
            usage();
            return 2;
        }
    }
    if (o.timeout_s <= 0 || o.light_timeout_s <= 0 || o.threads <= 0) {
        usage();
        return 2;
    }
    /* Engine info lines would drown the report; -v keeps them. */
    if (!o.verbose) log_set_level(LOG_WARN);
    int nskip;
    struct skip_entry *skips = load_skips(o.skip_file, &nskip);
    struct counts c = {0, 0, 0};
    char dir[4096], msg[MSG_MAX], why[MSG_MAX];
    double ms = 0;

    if (o.run_node) {
        snprintf(dir, sizeof dir, "%s/node", o.data_dir);
        DIR *d = opendir(dir);
        if (!d) {
            fprintf(stderr, "conformance: cannot open %s: %s (run tools/bootstrap.sh)\n", dir, strerror(errno));
            return 2;
        }
        char **names = NULL;
        int n = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strncmp(e->d_name, "test_", 5) != 0) continue;
            char **nv = realloc(names, (size_t)(n + 1) * sizeof *nv);
            if (!nv) break;
            names = nv;
            names[n++] = strdup(e->d_name);
        }
        closedir(d);
        qsort(names, (size_t)n, sizeof *names, cmp_str);
        for (int i = 0; i < n; i++) {
            const char *name = names[i];
            if (o.filter && fnmatch(o.filter, name, 0) != 0) continue;
            char tdir[4096], model[4200];
            snprintf(tdir, sizeof tdir, "%s/%s", dir, name);
            snprintf(model, sizeof model, "%s/model.onnx", tdir);
            const char *r = skip_reason(skips, nskip, name);
            if (r) {
                report(&c, OUT_SKIP, name, r, 0, o.verbose);
                continue;
            }
            if (unsupported_reason(model, why, sizeof why, 1)) {
                report(&c, OUT_SKIP, name, why, 0, o.verbose);
                continue;
            }
            struct job j = {.light = 0, .dir = tdir};
            enum outcome res = run_forked(&j, &o, msg, sizeof msg, &ms);
            report(&c, res, name, msg, ms, o.verbose);
        }
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
    }

    if (o.run_light) {
        static const char *const light[] = {"bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                                            "shufflenet",   "squeezenet",  "vgg19",        "zfnet512"};
        for (size_t i = 0; i < sizeof light / sizeof light[0]; i++) {
            char name[128], model[4200], out[4200];
            snprintf(name, sizeof name, "light_%s", light[i]);
            if (o.filter && fnmatch(o.filter, name, 0) != 0) continue;
            snprintf(model, sizeof model, "%s/light/%s.onnx", o.data_dir, name);
            snprintf(out, sizeof out, "%s/light/%s_output_0.pb", o.data_dir, name);
            const char *r = skip_reason(skips, nskip, name);
            if (r) {
                report(&c, OUT_SKIP, name, r, 0, o.verbose);
                continue;
            }
            /* Light models are never skipped for missing ops: they must pass. */
            if (unsupported_reason(model, why, sizeof why, 0)) {
                report(&c, OUT_FAIL, name, why, 0, o.verbose);
                continue;
            }
            struct job j = {.light = 1, .model = model, .out_pb = out};
            enum outcome res = run_forked(&j, &o, msg, sizeof msg, &ms);
            report(&c, res, name, msg, ms, o.verbose);
            if (res == OUT_PASS && !o.verbose) printf("PASS %s (%.0f ms)\n", name, ms);
        }
    }

    if (g_nwanted) {
        qsort(g_wanted, (size_t)g_nwanted, sizeof *g_wanted, cmp_wanted);
        printf("ops missing, by node tests they block:");
        for (int i = 0; i < g_nwanted && i < 40; i++) printf(" %s(%d)", g_wanted[i].op, g_wanted[i].tests);
        printf("\n");
    }
    printf("conformance: %d passed, %d failed, %d skipped\n", c.passed, c.failed, c.skipped);
    if (g_skipped_out) fclose(g_skipped_out);
    for (int i = 0; i < nskip; i++) {
        free(skips[i].pattern);
        free(skips[i].reason);
    }
    free(skips);
    return c.failed ? 1 : 0;
}
