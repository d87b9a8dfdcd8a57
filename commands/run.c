/* run.c - `kiln run`: runs a model offline.
 *
 *   kiln run MODEL [--input [NAME=]FILE ...] [--batch N] [--iterations N]
 *                  [--output-dir DIR] [--threads N] [--seed S] [--list-ops]
 *
 * MODEL is a model.onnx, or a folder holding one (a model repository entry:
 * its highest numbered version is used). Inputs come from .pb TensorProto or
 * .npy files; an input not given gets seeded random data whose symbolic dims
 * are --batch for the first axis and 1 elsewhere. Prints each output's name,
 * dtype, shape and checksums (sum and sum of |x|), optionally writes outputs
 * as .npy, and with --iterations prints latency percentiles. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "models/onnx_load.h"
#include "commands/commands.h"

#define NPY_MAX_HEADER 65536

/* ---- .npy --------------------------------------------------------------- */

struct npy_type {
    const char *descr;
    enum dtype dt;
};

static const struct npy_type npy_types[] = {
    {"<f4", DT_FP32},  {"<f8", DT_FP64},  {"<f2", DT_FP16},  {"<i8", DT_INT64}, {"<i4", DT_INT32},
    {"<i2", DT_INT16}, {"|i1", DT_INT8},  {"|u1", DT_UINT8}, {"<u2", DT_UINT16}, {"<u4", DT_UINT32},
    {"<u8", DT_UINT64}, {"|b1", DT_BOOL},
};

static const char *npy_descr(enum dtype dt) {
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (npy_types[i].dt == dt) return npy_types[i].descr;
    return NULL;
}

static enum dtype npy_dtype(const char *descr) {
    /* numpy writes one-byte types with '|', but '<' and '=' mean the same there. */
    char d[8];
    snprintf(d, sizeof d, "%s", descr);
    if (d[0] == '=') d[0] = '<';
    if ((d[0] == '<' || d[0] == '>') && d[2] == '1' && d[3] == 0) d[0] = '|';
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (strcmp(npy_types[i].descr, d) == 0) return npy_types[i].dt;
    return DT_UNDEFINED;
}

/* Finds 'key': in a numpy header dict and returns a pointer past the colon. */
static const char *npy_key(const char *h, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *p = strstr(h, pat);
    if (!p) return NULL;
    p += strlen(pat);
    while (*p == ' ') p++;
    if (*p != ':') return NULL;
    p++;
    while (*p == ' ') p++;
    return p;
}

/* Reads a .npy file (format 1.0/2.0/3.0, little-endian, C order). */
static int npy_read(const char *path, struct tensor *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return status_set(err, err_len, STATUS_NOT_FOUND, "cannot open '%s': %s", path, strerror(errno));
    int rc = STATUS_INVALID;
    char *hdr = NULL;
    unsigned char pre[12];
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        status_set(err, err_len, rc, "'%s' is not a .npy file", path);
        goto out;
    }
    size_t hlen, pos;
    if (pre[6] == 1) {
        if (fread(pre + 8, 1, 2, f) != 2) goto truncated;
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
        pos = 10;
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 8, 1, 4, f) != 4) goto truncated;
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
        pos = 12;
    } else {
        status_set(err, err_len, rc, "'%s': unsupported .npy version %d", path, pre[6]);
        goto out;
    }
    if (hlen > NPY_MAX_HEADER) {
        status_set(err, err_len, rc, "'%s': .npy header of %zu bytes is too large", path, hlen);
        goto out;
    }
    hdr = malloc(hlen + 1);
    if (!hdr) {
        rc = status_set(err, err_len, STATUS_NOMEM, "out of memory");
        goto out;
    }
    if (fread(hdr, 1, hlen, f) != hlen) goto truncated;
    hdr[hlen] = 0;
    pos += hlen;
    const char *p = npy_key(hdr, "descr");
    char descr[16] = "";
    if (p && (*p == '\'' || *p == '"')) {
        char q = *p++;
        size_t i = 0;
        while (*p && *p != q && i < sizeof descr - 1) descr[i++] = *p++;
        descr[i] = 0;
    }
    enum dtype dt = npy_dtype(descr);
    if (dt == DT_UNDEFINED) {
        status_set(err, err_len, rc, "'%s': .npy dtype '%s' is not supported (use little-endian f4, f8, f2, i8, i4, "
                   "i2, i1, u1, u2, u4, u8 or b1)", path, descr);
        goto out;
    }
    p = npy_key(hdr, "fortran_order");
    if (!p || strncmp(p, "False", 5) != 0) {
        status_set(err, err_len, rc, "'%s': only C-ordered .npy arrays are supported", path);
        goto out;
    }
    p = npy_key(hdr, "shape");
    if (!p || *p != '(') {
        status_set(err, err_len, rc, "'%s': .npy header has no shape", path);
        goto out;
    }
    p++;
    struct tensor t = {.dtype = dt, .ndim = 0};
    for (;;) {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ')') break;
        if (!isdigit((unsigned char)*p)) {
            status_set(err, err_len, rc, "'%s': bad .npy shape", path);
            goto out;
        }
        if (t.ndim == TENSOR_MAX_DIMS) {
            status_set(err, err_len, rc, "'%s': rank above %d", path, TENSOR_MAX_DIMS);
            goto out;
        }
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || v > INT32_MAX) {
            status_set(err, err_len, rc, "'%s': bad .npy dim", path);
            goto out;
        }
        t.dims[t.ndim++] = v;
        p = end;
    }
    int64_t n = tensor_numel(&t);
    size_t nbytes = (size_t)n * dtype_size(dt);
    if (n < 0 || n > (INT64_C(1) << 31) || (int64_t)st.st_size < (int64_t)pos ||
        (uint64_t)(st.st_size - (off_t)pos) < nbytes) {
        status_set(err, err_len, rc, "'%s': shape %s needs %zu bytes of data, the file has %lld", path,
                   tensor_shape_str(&t, (char[128]){0}, 128), nbytes, (long long)(st.st_size - (off_t)pos));
        goto out;
    }
    t.data = malloc(nbytes ? nbytes : 1);
    if (!t.data) {
        rc = status_set(err, err_len, STATUS_NOMEM, "out of memory");
        goto out;
    }
    if (nbytes && fread(t.data, 1, nbytes, f) != nbytes) {
        free(t.data);
        goto truncated;
    }
    *out = t;
    rc = 0;
    goto out;
truncated:
    status_set(err, err_len, rc, "'%s': truncated .npy file", path);
out:
    free(hdr);
    fclose(f);
    return rc;
}

static int npy_write(const char *path, const struct tensor *t, char *err, size_t err_len) {
    const char *descr = npy_descr(t->dtype);
    if (!descr)
        return status_set(err, err_len, STATUS_UNSUPPORTED, "cannot write dtype %s as .npy", dtype_name(t->dtype));
    char shape[256];
    size_t n = 0;
    n += (size_t)snprintf(shape + n, sizeof shape - n, "(");
    for (int d = 0; d < t->ndim; d++)
        n += (size_t)snprintf(shape + n, sizeof shape - n, "%lld,%s", (long long)t->dims[d],
                              d + 1 < t->ndim ? " " : "");
    if (t->ndim > 1) n--; /* numpy writes (2, 3) but (2,) */
    snprintf(shape + n, sizeof shape - n, ")");
    char hdr[512];
    int hl = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    /* Pad so that the data starts on a 64-byte boundary, as numpy does. */
    int total = 10 + hl + 1;
    int pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) return status_set(err, err_len, STATUS_INVALID, "cannot write '%s': %s", path, strerror(errno));
    unsigned hlen = (unsigned)(hl + pad + 1);
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    size_t nbytes = tensor_nbytes(t);
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, (size_t)hl, f) == (size_t)hl;
    for (int i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF && (nbytes == 0 || fwrite(t->data, 1, nbytes, f) == nbytes);
    if (fclose(f) != 0) ok = 0;
    if (!ok) return status_set(err, err_len, STATUS_INVALID, "cannot write '%s'", path);
    return 0;
}

/* ---- inputs ------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static double value_at(const struct tensor *t, int64_t i) {
    switch (t->dtype) {
    case DT_FP32: return ((const float *)t->data)[i];
    case DT_FP64: return ((const double *)t->data)[i];
    case DT_FP16: return fp16_to_fp32(((const uint16_t *)t->data)[i]);
    case DT_BF16: return bf16_to_fp32(((const uint16_t *)t->data)[i]);
    case DT_UINT8: case DT_BOOL: return ((const uint8_t *)t->data)[i];
    case DT_INT8: return ((const int8_t *)t->data)[i];
    case DT_UINT16: return ((const uint16_t *)t->data)[i];
    case DT_INT16: return ((const int16_t *)t->data)[i];
    case DT_INT32: return ((const int32_t *)t->data)[i];
    case DT_UINT32: return ((const uint32_t *)t->data)[i];
    case DT_INT64: return (double)((const int64_t *)t->data)[i];
    case DT_UINT64: return (double)((const uint64_t *)t->data)[i];
    case DT_INT4: case DT_UINT4: case DT_INT2: case DT_UINT2:
        return (double)lowbit_value(((const uint8_t *)t->data)[i], t->dtype);
    case DT_FP8E4M3FN: case DT_FP8E4M3FNUZ: case DT_FP8E5M2: case DT_FP8E5M2FNUZ: case DT_FP4E2M1: case DT_FP8E8M0:
        return fp8_to_fp32(((const uint8_t *)t->data)[i], t->dtype);
    default: return 0;
    }
}

static void value_set(struct tensor *t, int64_t i, double v) {
    switch (t->dtype) {
    case DT_FP32: ((float *)t->data)[i] = (float)v; break;
    case DT_FP64: ((double *)t->data)[i] = v; break;
    case DT_FP16: ((uint16_t *)t->data)[i] = fp32_to_fp16((float)v); break;
    case DT_BF16: ((uint16_t *)t->data)[i] = fp32_to_bf16((float)v); break;
    case DT_UINT8: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
    case DT_BOOL: ((uint8_t *)t->data)[i] = v != 0; break;
    case DT_INT8: ((int8_t *)t->data)[i] = (int8_t)v; break;
    case DT_UINT16: ((uint16_t *)t->data)[i] = (uint16_t)v; break;
    case DT_INT16: ((int16_t *)t->data)[i] = (int16_t)v; break;
    case DT_INT32: ((int32_t *)t->data)[i] = (int32_t)v; break;
    case DT_UINT32: ((uint32_t *)t->data)[i] = (uint32_t)v; break;
    case DT_INT64: ((int64_t *)t->data)[i] = (int64_t)v; break;
    case DT_UINT64: ((uint64_t *)t->data)[i] = (uint64_t)v; break;
    default: break;
    }
}

/* numpy saves float64 and int64 by default; convert between numeric dtypes
 * so that `np.save` output feeds a float32 model without ceremony. */
static int convert_to(struct tensor *t, enum dtype want, const char *name, char *err, size_t err_len) {
    if (t->dtype == want) return 0;
    if (t->dtype == DT_STRING || want == DT_STRING || dtype_size(want) == 0)
        return status_set(err, err_len, STATUS_INVALID, "input '%s': file holds %s, model wants %s", name,
                          dtype_name(t->dtype), dtype_name(want));
    struct tensor c = *t;
    c.dtype = want;
    int64_t n = tensor_numel(t);
    c.data = malloc(tensor_nbytes(&c) ? tensor_nbytes(&c) : 1);
    if (!c.data) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) value_set(&c, i, value_at(t, i));
    free(t->data);
    *t = c;
    return 0;
}

static uint64_t rng_next(uint64_t *s) {
    /* splitmix64: seeded, portable, good enough for test inputs */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int random_input(const struct model_io *io, int batch, uint64_t *seed, struct tensor *t, char *err,
                        size_t err_len) {
    memset(t, 0, sizeof *t);
    if (io->ndim < 0)
        return status_set(err, err_len, STATUS_INVALID, "input '%s' has unknown rank; give it with --input", io->name);
    if (io->dtype == DT_STRING || dtype_size(io->dtype) == 0)
        return status_set(err, err_len, STATUS_INVALID, "input '%s' is %s; give it with --input", io->name,
                          dtype_name(io->dtype));
    t->dtype = io->dtype;
    t->ndim = io->ndim;
    for (int d = 0; d < io->ndim; d++) t->dims[d] = io->dims[d] >= 0 ? io->dims[d] : (d == 0 ? batch : 1);
    int64_t n = tensor_numel(t);
    if (n < 0 || n > (INT64_C(1) << 31))
        return status_set(err, err_len, STATUS_INVALID, "input '%s' is too large for random data", io->name);
    t->data = malloc(tensor_nbytes(t) ? tensor_nbytes(t) : 1);
    if (!t->data) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    int is_float = io->dtype == DT_FP32 || io->dtype == DT_FP64 || io->dtype == DT_FP16 || io->dtype == DT_BF16;
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = rng_next(seed);
        /* floats uniform in [-1, 1); integers in [0, 4) so they stay valid indices for small axes */
        double v = is_float ? (double)(r >> 11) / 4503599627370496.0 - 1.0 : (double)(r % 4);
        if (io->dtype == DT_BOOL) v = (double)(r & 1);
        value_set(t, i, v);
    }
    return 0;
}

/* ---- model path --------------------------------------------------------- */

/* Accepts model.onnx, a folder with model.onnx, or a repository entry
 * (folder with numbered version folders): picks the highest version. */
static char *resolve_model(const char *arg) {
    struct stat st;
    if (stat(arg, &st) != 0 || !S_ISDIR(st.st_mode)) return strdup(arg);
    char *p = NULL;
    if (asprintf(&p, "%s/model.onnx", arg) < 0) return NULL;
    if (stat(p, &st) == 0) return p;
    free(p);
    p = NULL;
    DIR *d = opendir(arg);
    long best = -1;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            char *end;
            long v = strtol(e->d_name, &end, 10);
            if (*end || end == e->d_name || v < 0) continue;
            char *cand = NULL;
            if (asprintf(&cand, "%s/%ld/model.onnx", arg, v) < 0) continue;
            if (stat(cand, &st) == 0 && v > best) {
                best = v;
                free(p);
                p = cand;
            } else {
                free(cand);
            }
        }
        closedir(d);
    }
    if (!p && asprintf(&p, "%s/model.onnx", arg) < 0) return NULL;
    return p;
}

/* ---- command ------------------------------------------------------------ */

static double now_us(void) { return (double)clock_now_ns() / 1e3; }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void list_op(const struct op_def *op, void *arg) {
    (void)arg;
    printf("%s%s%s\n", op->domain && *op->domain ? op->domain : "", op->domain && *op->domain ? "." : "",
           op->op_type);
}

static void usage(FILE *f) {
    fprintf(f, "usage: kiln run MODEL [--input [NAME=]FILE.pb|FILE.npy ...] [--batch N] [--iterations N]\n"
               "                      [--output-dir DIR] [--threads N] [--seed S] [--quiet]\n"
               "                      [--backend auto|cpu|cuda] [--log-level error|warn|info|debug]\n"
               "       kiln run --list-ops\n"
               "MODEL is a .onnx file or a model repository folder (highest version).\n"
               "Inputs not given get seeded random data; symbolic dims become --batch (first axis) or 1.\n");
}

struct input_arg {
    char *name; /* NULL: positional */
    const char *file;
};

/* A flag's integer value in [lo, hi]; atoi would take "abc" as 0 and "2x" as 2. */
static int parse_count(const char *flag, const char *text, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "kiln run: %s '%s': expected an integer from %ld to %ld\n", flag, text, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cmd_run(int argc, char **argv) {
    const char *model_arg = NULL, *out_dir = NULL;
    int batch = 1, iterations = 0, threads = 0, quiet = 0;
    const char *backend_name = "auto";
    struct backend *be = NULL;
    uint64_t seed = 1;
    struct input_arg *ins = calloc((size_t)argc + 1, sizeof *ins);
    int nins = 0, rc = 1;
    if (!ins) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--input") && v) {
            i++;
            const char *eq = strchr(v, '=');
            if (eq && eq != v) {
                ins[nins].name = strndup(v, (size_t)(eq - v));
                ins[nins].file = eq + 1;
            } else {
                ins[nins].file = eq ? eq + 1 : v;
            }
            nins++;
        } else if (!strcmp(a, "--batch") && v) {
            if (parse_count(a, argv[++i], 1, 1 << 24, &batch)) { rc = 2; goto done; }
        } else if (!strcmp(a, "--iterations") && v) {
            if (parse_count(a, argv[++i], 0, INT_MAX - 1, &iterations)) { rc = 2; goto done; }
        } else if (!strcmp(a, "--threads") && v) {
            if (parse_count(a, argv[++i], 0, 4096, &threads)) { rc = 2; goto done; }
        } else if (!strcmp(a, "--seed") && v) {
            char *end;
            errno = 0;
            seed = strtoull(argv[++i], &end, 10);
            if (errno || end == argv[i] || *end || argv[i][0] == '-') {
                fprintf(stderr, "kiln run: --seed '%s': expected a non-negative integer\n", argv[i]);
                rc = 2;
                goto done;
            }
        } else if (!v && (!strcmp(a, "--input") || !strcmp(a, "--batch") || !strcmp(a, "--iterations") ||
                          !strcmp(a, "--threads") || !strcmp(a, "--seed") || !strcmp(a, "--output-dir") ||
                          !strcmp(a, "--log-level"))) {
            fprintf(stderr, "kiln run: %s needs a value\n", a);
            rc = 2;
            goto done;
        }
        else if (!strcmp(a, "--output-dir") && v) out_dir = argv[++i];
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--log-level") && v) {
            int lv = log_level_parse(argv[++i]);
            if (lv < 0) {
                fprintf(stderr, "kiln run: --log-level must be error, warn, info or debug, not '%s'\n", argv[i]);
                rc = 2;
                goto done;
            }
            log_set_level((enum log_level)lv);
        }
        else if (!strcmp(a, "--backend") && v) {
            backend_name = argv[++i];
            if (strcmp(backend_name, "auto") && strcmp(backend_name, "cpu") && strcmp(backend_name, "cuda")) {
                fprintf(stderr, "kiln run: --backend must be auto, cpu or cuda, not '%s'\n", backend_name);
                rc = 2;
                goto done;
            }
        }
        else if (!strcmp(a, "--list-ops")) {
            op_foreach(list_op, NULL);
            rc = 0;
            goto done;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto done;
        } else if (a[0] != '-' && !model_arg) model_arg = a;
        else {
            fprintf(stderr, "kiln run: unexpected argument '%s'\n", a);
            usage(stderr);
            rc = 2;
            goto done;
        }
    }
    if (!model_arg) {
        fprintf(stderr, "kiln run: no MODEL given\n");
        usage(stderr);
        rc = 2;
        goto done;
    }

    char err[1024];
    char *path = resolve_model(model_arg);
    /* On the CPU alone (asked, or auto without a usable GPU) the graph may
     * take the CPU's own fusions. */
    char why0[512] = "";
    struct model_params mp = {.path = path,
                              .cpu_only = !strcmp(backend_name, "cpu") ||
                                          (strcmp(backend_name, "cuda") && backend_available("cuda", why0, sizeof why0) <= 0)};
    struct model *m = path ? model_load(&mp, err, sizeof err) : NULL;
    if (!m) {
        fprintf(stderr, "kiln run: %s\n", path ? err : "out of memory");
        free(path);
        goto done;
    }
    int ni = model_ninputs(m), no = model_noutputs(m);
    struct tensor *in = calloc((size_t)ni + 1, sizeof *in), *out = calloc((size_t)no + 1, sizeof *out);
    struct model_exec *x = NULL;
    double *lat = NULL;
    if (!in || !out) goto fail;

    int positional = 0;
    for (int k = 0; k < nins; k++) {
        int idx = ins[k].name ? model_find_input(m, ins[k].name) : positional++;
        if (idx < 0 || idx >= ni) {
            if (ins[k].name) fprintf(stderr, "kiln run: the model has no input '%s'\n", ins[k].name);
            else fprintf(stderr, "kiln run: more --input files than the model's %d inputs\n", ni);
            goto fail;
        }
        if (in[idx].data) {
            fprintf(stderr, "kiln run: input '%s' given twice\n", model_input(m, idx)->name);
            goto fail;
        }
        int r = ends_with(ins[k].file, ".npy") ? npy_read(ins[k].file, &in[idx], err, sizeof err)
                                               : onnx_load_tensor_file(ins[k].file, &in[idx], NULL, err, sizeof err);
        if (!r) r = convert_to(&in[idx], model_input(m, idx)->dtype, model_input(m, idx)->name, err, sizeof err);
        if (r) {
            fprintf(stderr, "kiln run: %s\n", err);
            goto fail;
        }
    }
    for (int i = 0; i < ni; i++) {
        if (in[i].data) continue;
        if (random_input(model_input(m, i), batch, &seed, &in[i], err, sizeof err) != 0) {
            fprintf(stderr, "kiln run: %s\n", err);
            goto fail;
        }
    }
    if (!quiet)
        for (int i = 0; i < ni; i++) {
            char s[128];
            printf("input  %-20s %-7s %s\n", model_input(m, i)->name, dtype_name(in[i].dtype),
                   tensor_shape_str(&in[i], s, sizeof s));
        }

    if (strcmp(backend_name, "cpu") != 0) {
        /* auto: the GPU when one is usable, else the CPU (as kiln serve). */
        char why[512] = "";
        struct backend_params bp = {.device = 0, .nthreads = threads};
        if (!strcmp(backend_name, "cuda") || backend_available("cuda", why, sizeof why) > 0) {
            be = backend_create("cuda", &bp, why, sizeof why);
            if (!be) {
                fprintf(stderr, "kiln run: the CUDA backend is not usable: %s\n", why);
                goto fail;
            }
        }
    }
    if (!quiet) printf("backend %s\n", be ? be->iface->name : "cpu");
    x = model_exec_create(m, be, threads);
    if (!x) {
        fprintf(stderr, "kiln run: cannot create an execution context\n");
        goto fail;
    }
    int runs = iterations > 0 ? iterations + 1 : 1; /* the first run builds the plan: not timed */
    lat = calloc((size_t)runs, sizeof *lat);
    if (!lat) goto fail;
    for (int r = 0; r < runs; r++) {
        for (int o = 0; o < no; o++) {
            tensor_free_data(&out[o]); /* model.h: one owned block per output */
            memset(&out[o], 0, sizeof out[o]);
        }
        double t0 = now_us();
        int st = model_run(x, in, ni, out, no, err, sizeof err);
        lat[r] = now_us() - t0;
        if (st) {
            fprintf(stderr, "kiln run: %s\n", err);
            goto fail;
        }
    }
    for (int o = 0; o < no; o++) {
        const struct tensor *t = &out[o];
        const char *name = model_output(m, o)->name;
        char s[128];
        int64_t n = tensor_numel(t);
        double sum = 0, asum = 0;
        if (t->dtype != DT_STRING)
            for (int64_t i = 0; i < n; i++) {
                double v = value_at(t, i);
                sum += v;
                asum += v < 0 ? -v : v;
            }
        printf("output %-20s %-7s %-16s sum=%.6g abs_sum=%.6g\n", name, dtype_name(t->dtype),
               tensor_shape_str(t, s, sizeof s), sum, asum);
        if (out_dir) {
            mkdir(out_dir, 0777); /* exists already is fine; a real failure shows at open */
            char file[4096], safe[256];
            size_t k = 0;
            for (const char *c = name; *c && k < sizeof safe - 1; c++)
                safe[k++] = isalnum((unsigned char)*c) || *c == '_' || *c == '-' || *c == '.' ? *c : '_';
            safe[k] = 0;
            snprintf(file, sizeof file, "%s/%s.npy", out_dir, safe);
            if (npy_write(file, t, err, sizeof err) != 0) {
                fprintf(stderr, "kiln run: output '%s': %s\n", name, err);
                goto fail;
            }
        }
    }
    if (iterations > 0) {
        qsort(lat + 1, (size_t)iterations, sizeof *lat, cmp_double);
        double mean = 0;
        for (int r = 1; r < runs; r++) mean += lat[r];
        mean /= iterations;
        /* nearest-rank percentiles over the timed runs lat[1..iterations] */
        int p50 = (iterations + 1) / 2, p99 = (iterations * 99 + 99) / 100;
        printf("latency over %d runs: p50 %.3f ms  p99 %.3f ms  mean %.3f ms  (first run %.3f ms)\n", iterations,
               lat[p50] / 1e3, lat[p99] / 1e3, mean / 1e3, lat[0] / 1e3);
    }
    rc = 0;
fail:
    free(lat);
    model_exec_free(x);
    backend_free(be);
    for (int i = 0; in && i < ni; i++) onnx_tensor_clear(&in[i]);
    for (int o = 0; out && o < no; o++) tensor_free_data(&out[o]);
    free(in);
    free(out);
    model_free(m);
    free(path);
done:
    for (int k = 0; k < nins; k++) free(ins[k].name);
    free(ins);
    return rc;
}
