/* onnx_load.c - ONNX ModelProto / TensorProto to kiln's graph IR.
 *
 * protobuf-c does the parsing; before it runs, a schema-aware scan of the
 * wire format bounds nesting depth (protobuf-c recurses once per nested
 * message, so a deep file could overflow the stack) and the number of
 * messages (each costs a few hundred bytes of structs however small it is on
 * the wire). After parsing, every tensor's declared size is checked against
 * the bytes it really holds before anything is allocated for it. */
#include "models/onnx_load.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>

#include "common/file.h"
#include "common/status.h"
#include "kernels/ops.h"
#include "models/control.h"
#include "onnx/onnx.pb-c.h"

#define MAX_FILE_BYTES ((int64_t)INT32_MAX) /* protobuf's own 2 GiB limit */

/* ---- wire pre-scan ------------------------------------------------------ */

struct wire_scan {
    size_t messages;
    int too_deep;
};

static int wire_varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*pos >= len) return -1;
        uint8_t b = p[(*pos)++];
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return 0;
        }
    }
    return -1;
}

/* Walks one message's fields, recursing into message-typed fields. Malformed
 * wire data just stops the walk: protobuf-c reports it properly. */
static void wire_scan_message(const uint8_t *p, size_t len, const ProtobufCMessageDescriptor *d, int depth,
                              struct wire_scan *s) {
    if (s->too_deep || s->messages > ONNX_MAX_MESSAGES) return;
    if (depth > ONNX_MAX_DEPTH) {
        s->too_deep = 1;
        return;
    }
    s->messages++;
    size_t pos = 0;
    while (pos < len) {
        uint64_t key, n;
        if (wire_varint(p, len, &pos, &key) != 0) return;
        switch (key & 7) {
        case 0:
            if (wire_varint(p, len, &pos, &n) != 0) return;
            break;
        case 1:
            if (len - pos < 8) return;
            pos += 8;
            break;
        case 5:
            if (len - pos < 4) return;
            pos += 4;
            break;
        case 2: {
            if (wire_varint(p, len, &pos, &n) != 0 || n > len - pos) return;
            uint64_t num = key >> 3;
            const ProtobufCFieldDescriptor *f =
                num <= UINT_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)num) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE)
                wire_scan_message(p + pos, (size_t)n, f->descriptor, depth + 1, s);
            if (s->too_deep || s->messages > ONNX_MAX_MESSAGES) return;
            pos += (size_t)n;
            break;
        }
        default:
            return; /* groups are not part of onnx.proto */
        }
    }
}

static int wire_check(const void *buf, size_t len, const ProtobufCMessageDescriptor *d, const char *what,
                      char *err, size_t err_len) {
    struct wire_scan s = {0, 0};
    wire_scan_message(buf, len, d, 0, &s);
    if (s.too_deep)
        return status_set(err, err_len, STATUS_INVALID, "%s nests messages more than %d levels deep", what,
                          ONNX_MAX_DEPTH);
    if (s.messages > ONNX_MAX_MESSAGES)
        return status_set(err, err_len, STATUS_INVALID, "%s holds more than %d protobuf messages", what,
                          ONNX_MAX_MESSAGES);
    return 0;
}

/* ---- files -------------------------------------------------------------- */

/* Model and tensor files come from a repository someone else writes: a
 * regular file under protobuf's limit, opened without blocking on a FIFO. */
static int read_file(const char *path, void **out, size_t *out_len, char *err, size_t err_len) {
    char *buf;
    int rc = file_read_regular(path, MAX_FILE_BYTES, &buf, out_len, err, err_len);
    *out = buf;
    return rc;
}

/* Returns a malloc'd copy of path's folder ("." when it has none). */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

/* ---- dtypes and dims ---------------------------------------------------- */

static int dtype_ok(int64_t dt) {
    switch (dt) {
    case DT_FP32: case DT_UINT8: case DT_INT8: case DT_UINT16: case DT_INT16: case DT_INT32:
    case DT_INT64: case DT_STRING: case DT_BOOL: case DT_FP16: case DT_FP64: case DT_UINT32:
    case DT_UINT64: case DT_BF16: case DT_FP8E4M3FN: case DT_FP8E4M3FNUZ: case DT_FP8E5M2: case DT_FP8E5M2FNUZ:
    case DT_UINT4: case DT_INT4: case DT_FP4E2M1: case DT_UINT2: case DT_INT2: case DT_FP8E8M0:
        return 1;
    default:
        return 0;
    }
}

static const char *onnx_dtype_label(int64_t dt) {
    static const char *const extra[] = {
        [14] = "complex64",      [15] = "complex128", [17] = "float8e4m3fn", [18] = "float8e4m3fnuz",
        [19] = "float8e5m2",     [20] = "float8e5m2fnuz", [21] = "uint4",    [22] = "int4",
        [23] = "float4e2m1",     [24] = "float8e8m0",  [25] = "uint2",       [26] = "int2",
    };
    if (dt > 0 && dt < DT_MAX_ && dtype_ok(dt)) return dtype_name((enum dtype)dt);
    if (dt >= 0 && dt < (int64_t)(sizeof extra / sizeof extra[0]) && extra[dt]) return extra[dt];
    return "unknown";
}

/* Checks a data-carrying shape; sets *numel. */
static int check_dims(const char *name, const int64_t *dims, size_t ndims, int64_t *numel, char *err,
                      size_t err_len) {
    if (ndims > TENSOR_MAX_DIMS)
        return status_set(err, err_len, STATUS_INVALID, "tensor '%s' has rank %zu; kiln supports at most %d",
                          name, ndims, TENSOR_MAX_DIMS);
    int64_t n = 1;
    for (size_t i = 0; i < ndims; i++) {
        if (dims[i] < 0)
            return status_set(err, err_len, STATUS_INVALID, "tensor '%s' has a negative dim (%lld at axis %zu)",
                              name, (long long)dims[i], i);
        if (dims[i] > ONNX_MAX_ELEMENTS || (dims[i] && n > ONNX_MAX_ELEMENTS / dims[i]))
            return status_set(err, err_len, STATUS_INVALID, "tensor '%s' has more than 2^31 elements", name);
        n *= dims[i];
    }
    if (n > ONNX_MAX_ELEMENTS)
        return status_set(err, err_len, STATUS_INVALID, "tensor '%s' has more than 2^31 elements", name);
    *numel = n;
    return 0;
}

void onnx_tensor_clear(struct tensor *t) {
    if (t) tensor_free_data(t);
}

/* ---- TensorProto -------------------------------------------------------- */

static int parse_i64(const char *s, int64_t *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < 0) return -1;
    *out = v;
    return 0;
}

/* Reads external data for a tensor. The file must resolve inside base_dir
 * (symlinks included), and its range must hold exactly the tensor's bytes. */
static int load_external(const Onnx__TensorProto *tp, const char *name, const char *base_dir, size_t nbytes,
                         void **data, char *err, size_t err_len) {
    const char *location = NULL;
    int64_t offset = 0, length = -1;
    for (size_t i = 0; i < tp->n_external_data; i++) {
        const Onnx__StringStringEntryProto *e = tp->external_data[i];
        if (!e->key) continue;
        if (strcmp(e->key, "location") == 0) location = e->value;
        else if (strcmp(e->key, "offset") == 0) {
            if (parse_i64(e->value, &offset) != 0)
                return status_set(err, err_len, STATUS_INVALID, "tensor '%s': bad external data offset '%s'",
                                  name, e->value ? e->value : "");
        } else if (strcmp(e->key, "length") == 0) {
            if (parse_i64(e->value, &length) != 0)
                return status_set(err, err_len, STATUS_INVALID, "tensor '%s': bad external data length '%s'",
                                  name, e->value ? e->value : "");
        }
    }
    if (!base_dir)
        return status_set(err, err_len, STATUS_INVALID,
                          "tensor '%s' keeps its data in an external file, which needs the model's path", name);
    if (!location || !*location)
        return status_set(err, err_len, STATUS_INVALID, "tensor '%s': external data without a location", name);
    if (location[0] == '/')
        return status_set(err, err_len, STATUS_INVALID,
                          "tensor '%s': external data location '%s' is absolute; it must lie beside the model",
                          name, location);
    char *joined = NULL, *real = NULL, *real_base = NULL;
    FILE *f = NULL;
    int rc;
    if (asprintf(&joined, "%s/%s", base_dir, location) < 0) {
        joined = NULL;
        rc = status_set(err, err_len, STATUS_NOMEM, "out of memory");
        goto out;
    }
    real = realpath(joined, NULL);
    real_base = realpath(base_dir, NULL);
    if (!real || !real_base) {
        rc = status_set(err, err_len, STATUS_NOT_FOUND, "tensor '%s': cannot open external data file '%s': %s",
                        name, location, strerror(errno));
        goto out;
    }
    size_t bl = strlen(real_base);
    if (strncmp(real, real_base, bl) != 0 || (real[bl] != '/' && !(bl == 1 && real_base[0] == '/'))) {
        rc = status_set(err, err_len, STATUS_INVALID,
                        "tensor '%s': external data location '%s' escapes the model's folder", name, location);
        goto out;
    }
    int64_t fsize;
    char e2[64];
    f = file_open_regular(real, INT64_MAX, &fsize, &rc, e2, sizeof e2);
    if (!f) {
        rc = status_set(err, err_len, rc, "tensor '%s': cannot read external data file '%s' (not a regular file, or "
                        "missing)", name, location);
        goto out;
    }
    if (length >= 0 && (uint64_t)length != nbytes) {
        rc = status_set(err, err_len, STATUS_INVALID,
                        "tensor '%s': external data length %lld does not match its shape (%zu bytes)", name,
                        (long long)length, nbytes);
        goto out;
    }
    if (offset > fsize || (int64_t)nbytes > fsize - offset) {
        rc = status_set(err, err_len, STATUS_INVALID,
                        "tensor '%s': needs %zu bytes at offset %lld of '%s', which has only %lld", name, nbytes,
                        (long long)offset, location, (long long)fsize);
        goto out;
    }
    *data = malloc(nbytes ? nbytes : 1);
    if (!*data) {
        rc = status_set(err, err_len, STATUS_NOMEM, "tensor '%s': out of memory for %zu bytes", name, nbytes);
        goto out;
    }
    if (fseeko(f, (off_t)offset, SEEK_SET) != 0 || (nbytes && fread(*data, 1, nbytes, f) != nbytes)) {
        free(*data);
        *data = NULL;
        rc = status_set(err, err_len, STATUS_INVALID, "tensor '%s': short read from '%s'", name, location);
        goto out;
    }
    rc = 0;
out:
    if (f) fclose(f);
    free(joined);
    free(real);
    free(real_base);
    return rc;
}

static int count_mismatch(const char *name, int64_t numel, enum dtype dt, size_t have, const char *field,
                          char *err, size_t err_len) {
    return status_set(err, err_len, STATUS_INVALID, "tensor '%s' declares %lld %s elements but %s holds %zu", name,
                      (long long)numel, dtype_name(dt), field, have);
}

/* Replaces t's packed data (as read from the file) with one byte per element. */
static int unpack_owned(struct tensor *t, const char *name, char *err, size_t err_len) {
    int64_t n = tensor_numel(t);
    uint8_t *u = malloc(n > 0 ? (size_t)n : 1);
    if (!u) {
        tensor_free_data(t);
        return status_set(err, err_len, STATUS_NOMEM, "tensor '%s': out of memory", name);
    }
    tensor_unpack_bits(t->data, u, n, t->dtype);
    free(t->data);
    t->data = u;
    return 0;
}

int onnx_tensor_from_proto(const Onnx__TensorProto *tp, const char *base_dir, struct tensor *out, char *err,
                           size_t err_len) {
    memset(out, 0, sizeof *out);
    const char *name = tp->name && *tp->name ? tp->name : "(unnamed)";
    int64_t dt = tp->has_data_type ? tp->data_type : 0;
    if (dt == 0) return status_set(err, err_len, STATUS_INVALID, "tensor '%s' has no data type", name);
    if (!dtype_ok(dt))
        return status_set(err, err_len, STATUS_UNSUPPORTED, "tensor '%s' has data type %s (%lld), which kiln does "
                          "not support", name, onnx_dtype_label(dt), (long long)dt);
    if (tp->segment)
        return status_set(err, err_len, STATUS_UNSUPPORTED, "tensor '%s' is segmented, which kiln does not support",
                          name);
    int64_t numel = 0;
    int rc = check_dims(name, tp->dims, tp->n_dims, &numel, err, err_len);
    if (rc) return rc;
    enum dtype d = (enum dtype)dt;
    struct tensor t = {.dtype = d, .ndim = (int)tp->n_dims};
    for (size_t i = 0; i < tp->n_dims; i++) t.dims[i] = tp->dims[i];
    size_t n = (size_t)numel, es = dtype_size(d);
    size_t nbytes = n * es;
    /* The 4- and 2-bit dtypes are packed in the file, one byte each in memory. */
    const int packed = d != DT_STRING && dtype_packed_bits(d) < 8;
    const size_t file_bytes = packed ? dtype_packed_size(d, numel) : nbytes;

    if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        if (d == DT_STRING)
            return status_set(err, err_len, STATUS_UNSUPPORTED, "tensor '%s': external string data is not supported",
                              name);
        rc = load_external(tp, name, base_dir, file_bytes, &t.data, err, err_len);
        if (rc) return rc;
        if (packed && (rc = unpack_owned(&t, name, err, err_len))) return rc;
        *out = t;
        return 0;
    }

    if (d == DT_STRING) {
        if (tp->n_string_data != n) return count_mismatch(name, numel, d, tp->n_string_data, "string_data", err, err_len);
        /* ONNX strings are counted bytes (NULs included): gathered as
         * elements, then packed into the tensor's one block. */
        struct tensor_str *s = calloc(n ? n : 1, sizeof *s);
        if (s)
            for (size_t i = 0; i < n; i++) s[i] = (struct tensor_str){(const char *)tp->string_data[i].data, tp->string_data[i].len};
        rc = s ? tensor_strings_pack(&t, s) : STATUS_NOMEM;
        free(s);
        if (rc) return status_set(err, err_len, STATUS_NOMEM, "tensor '%s': out of memory", name);
        *out = t;
        return 0;
    }

    int use_raw = tp->has_raw_data && (tp->raw_data.len > 0 || (tp->n_float_data == 0 && tp->n_int32_data == 0 &&
                                                                 tp->n_int64_data == 0 && tp->n_double_data == 0 &&
                                                                 tp->n_uint64_data == 0));
    if (use_raw) {
        if (tp->raw_data.len != file_bytes)
            return status_set(err, err_len, STATUS_INVALID,
                              "tensor '%s' declares %lld %s elements (%zu bytes) but raw_data holds %zu bytes", name,
                              (long long)numel, dtype_name(d), file_bytes, tp->raw_data.len);
        t.data = malloc(nbytes ? nbytes : 1);
        if (!t.data) return status_set(err, err_len, STATUS_NOMEM, "tensor '%s': out of memory", name);
        if (packed) tensor_unpack_bits(tp->raw_data.data, t.data, numel, d);
        else if (nbytes) memcpy(t.data, tp->raw_data.data, nbytes);
        *out = t;
        return 0;
    }

    /* Typed fields: check the count before allocating anything. */
    size_t have;
    const char *field;
    switch (d) {
    case DT_FP32: have = tp->n_float_data; field = "float_data"; break;
    case DT_INT32: case DT_INT16: case DT_INT8: case DT_UINT8: case DT_UINT16: case DT_BOOL: case DT_FP16:
    case DT_BF16: case DT_FP8E4M3FN: case DT_FP8E4M3FNUZ: case DT_FP8E5M2: case DT_FP8E5M2FNUZ: case DT_FP8E8M0:
        have = tp->n_int32_data; field = "int32_data"; break;
    case DT_UINT4: case DT_INT4: case DT_FP4E2M1: case DT_UINT2: case DT_INT2:
        /* one packed byte per int32 */
        if (tp->n_int32_data != file_bytes)
            return status_set(err, err_len, STATUS_INVALID,
                              "tensor '%s' declares %lld %s elements (%zu packed bytes) but int32_data holds %zu", name,
                              (long long)numel, dtype_name(d), file_bytes, tp->n_int32_data);
        have = n; field = "int32_data"; break;
    case DT_INT64: have = tp->n_int64_data; field = "int64_data"; break;
    case DT_FP64: have = tp->n_double_data; field = "double_data"; break;
    case DT_UINT32: case DT_UINT64: have = tp->n_uint64_data; field = "uint64_data"; break;
    default: return status_set(err, err_len, STATUS_UNSUPPORTED, "tensor '%s': data type %s", name, dtype_name(d));
    }
    if (have != n) return count_mismatch(name, numel, d, have, field, err, err_len);
    t.data = malloc(nbytes ? nbytes : 1);
    if (!t.data) return status_set(err, err_len, STATUS_NOMEM, "tensor '%s': out of memory", name);
    switch (d) {
    case DT_FP32: if (n) memcpy(t.data, tp->float_data, nbytes); break;
    case DT_INT32: if (n) memcpy(t.data, tp->int32_data, nbytes); break;
    case DT_INT16: for (size_t i = 0; i < n; i++) ((int16_t *)t.data)[i] = (int16_t)tp->int32_data[i]; break;
    case DT_INT8: for (size_t i = 0; i < n; i++) ((int8_t *)t.data)[i] = (int8_t)tp->int32_data[i]; break;
    case DT_UINT8: case DT_FP8E4M3FN: case DT_FP8E4M3FNUZ: case DT_FP8E5M2: case DT_FP8E5M2FNUZ: case DT_FP8E8M0:
        for (size_t i = 0; i < n; i++) ((uint8_t *)t.data)[i] = (uint8_t)tp->int32_data[i];
        break;
    case DT_UINT4: case DT_INT4: case DT_FP4E2M1: case DT_UINT2: case DT_INT2: {
        uint8_t *bytes = malloc(file_bytes ? file_bytes : 1);
        if (!bytes) {
            free(t.data);
            return status_set(err, err_len, STATUS_NOMEM, "tensor '%s': out of memory", name);
        }
        for (size_t i = 0; i < file_bytes; i++) bytes[i] = (uint8_t)tp->int32_data[i];
        tensor_unpack_bits(bytes, t.data, numel, d);
        free(bytes);
        break;
    }
    case DT_BOOL: for (size_t i = 0; i < n; i++) ((uint8_t *)t.data)[i] = tp->int32_data[i] != 0; break;
    case DT_UINT16: case DT_FP16: case DT_BF16: /* the 16 bits sit in the low half of each int32 */
        for (size_t i = 0; i < n; i++) ((uint16_t *)t.data)[i] = (uint16_t)tp->int32_data[i];
        break;
    case DT_INT64: if (n) memcpy(t.data, tp->int64_data, nbytes); break;
    case DT_FP64: if (n) memcpy(t.data, tp->double_data, nbytes); break;
    case DT_UINT64: if (n) memcpy(t.data, tp->uint64_data, nbytes); break;
    case DT_UINT32: for (size_t i = 0; i < n; i++) ((uint32_t *)t.data)[i] = (uint32_t)tp->uint64_data[i]; break;
    default: break;
    }
    *out = t;
    return 0;
}

/* ---- attributes --------------------------------------------------------- */

static int attr_infer_type(const Onnx__AttributeProto *ap) {
    if (ap->has_type && ap->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__UNDEFINED) return ap->type;
    /* IR version 1 files carry no type: infer it from the field that is set. */
    if (ap->n_floats) return ATTR_FLOATS;
    if (ap->n_ints) return ATTR_INTS;
    if (ap->n_strings) return ATTR_STRINGS;
    if (ap->t) return ATTR_TENSOR;
    if (ap->g) return ATTR_GRAPH;
    if (ap->n_graphs) return ATTR_GRAPHS;
    if (ap->has_f) return ATTR_FLOAT;
    if (ap->has_i) return ATTR_INT;
    if (ap->has_s) return ATTR_STRING;
    return ATTR_UNDEFINED;
}

static int load_subgraph(struct graph *parent, int pidx, const Onnx__ModelProto *mp, const Onnx__GraphProto *gp,
                         const char *base_dir, struct graph **out, char *err, size_t err_len);

/* Converts attribute ap of node idx of g. A subgraph is loaded with g as its
 * enclosing graph: the names it reads from outside become inputs of node idx. */
static int convert_attr(const Onnx__AttributeProto *ap, struct graph_attr *a, struct graph *g, int idx,
                        const Onnx__ModelProto *mp, const char *base_dir, char *err, size_t err_len) {
    const struct graph_node *node = &g->nodes[idx];
    const char *an = ap->name ? ap->name : "";
    a->name = strdup(an);
    if (!a->name) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    int type = attr_infer_type(ap);
    switch (type) {
    case ATTR_FLOAT: a->f = ap->f; break;
    case ATTR_INT: a->i = ap->i; break;
    case ATTR_STRING:
        a->s = malloc(ap->s.len + 1);
        if (!a->s) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
        if (ap->s.len) memcpy(a->s, ap->s.data, ap->s.len);
        a->s[ap->s.len] = 0;
        a->s_len = ap->s.len;
        break;
    case ATTR_TENSOR: {
        if (!ap->t)
            return status_set(err, err_len, STATUS_INVALID, "node '%s' (%s): attribute '%s' has no tensor",
                              node->name, node->op_type, an);
        a->t = calloc(1, sizeof *a->t);
        if (!a->t) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
        char sub[384];
        int rc = onnx_tensor_from_proto(ap->t, base_dir, a->t, sub, sizeof sub);
        if (rc) {
            free(a->t);
            a->t = NULL;
            return status_set(err, err_len, rc, "node '%s' (%s), attribute '%s': %s", node->name, node->op_type,
                              an, sub);
        }
        break;
    }
    case ATTR_FLOATS:
        if (ap->n_floats > INT_MAX) return status_set(err, err_len, STATUS_INVALID, "attribute '%s' too long", an);
        a->floats = malloc((ap->n_floats ? ap->n_floats : 1) * sizeof(float));
        if (!a->floats) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
        if (ap->n_floats) memcpy(a->floats, ap->floats, ap->n_floats * sizeof(float));
        a->n = (int)ap->n_floats;
        break;
    case ATTR_INTS:
        if (ap->n_ints > INT_MAX) return status_set(err, err_len, STATUS_INVALID, "attribute '%s' too long", an);
        a->ints = malloc((ap->n_ints ? ap->n_ints : 1) * sizeof(int64_t));
        if (!a->ints) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
        if (ap->n_ints) memcpy(a->ints, ap->ints, ap->n_ints * sizeof(int64_t));
        a->n = (int)ap->n_ints;
        break;
    case ATTR_STRINGS:
        if (ap->n_strings > INT_MAX) return status_set(err, err_len, STATUS_INVALID, "attribute '%s' too long", an);
        a->strings = calloc(ap->n_strings ? ap->n_strings : 1, sizeof(char *));
        a->lens = calloc(ap->n_strings ? ap->n_strings : 1, sizeof(size_t));
        if (!a->strings || !a->lens) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
        for (size_t i = 0; i < ap->n_strings; i++) {
            a->strings[i] = malloc(ap->strings[i].len + 1);
            if (!a->strings[i]) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
            a->n = (int)i + 1; /* so that graph_free sees every string made so far */
            if (ap->strings[i].len) memcpy(a->strings[i], ap->strings[i].data, ap->strings[i].len);
            a->strings[i][ap->strings[i].len] = 0;
            a->lens[i] = ap->strings[i].len;
        }
        a->n = (int)ap->n_strings;
        break;
    case ATTR_GRAPH:
    case ATTR_GRAPHS: {
        size_t ng = type == ATTR_GRAPH ? 1 : ap->n_graphs;
        if (type == ATTR_GRAPH && !ap->g)
            return status_set(err, err_len, STATUS_INVALID, "node '%s' (%s): attribute '%s' has no graph",
                              node->name, node->op_type, an);
        if (ng > INT_MAX) return status_set(err, err_len, STATUS_INVALID, "attribute '%s' too long", an);
        a->graphs = calloc(ng ? ng : 1, sizeof *a->graphs);
        if (!a->graphs) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
        a->type = (enum attr_type)type; /* so that graph_attr_clear frees what was loaded */
        for (size_t i = 0; i < ng; i++) {
            a->n = (int)i + 1;
            char sub[512];
            int rc = load_subgraph(g, idx, mp, type == ATTR_GRAPH ? ap->g : ap->graphs[i], base_dir, &a->graphs[i],
                                   sub, sizeof sub);
            if (rc) {
                node = &g->nodes[idx];
                return status_set(err, err_len, rc, "node '%s' (%s), subgraph '%s': %s", node->name, node->op_type,
                                  an, sub);
            }
        }
        a->n = (int)ng;
        break;
    }
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSORS:
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSOR:
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSORS:
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTO:
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTOS:
        return status_set(err, err_len, STATUS_UNSUPPORTED,
                          "node '%s' (%s): attribute '%s' has type %d (tensor lists, sparse tensors and type "
                          "protos are not supported)", node->name, node->op_type, an, type);
    default:
        return status_set(err, err_len, STATUS_INVALID, "node '%s' (%s): attribute '%s' has no valid type (%d)",
                          node->name, node->op_type, an, type);
    }
    a->type = (enum attr_type)type;
    return 0;
}

/* ---- value types -------------------------------------------------------- */

static const char *type_case_name(Onnx__TypeProto__ValueCase c) {
    switch (c) {
    case ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE: return "a sequence";
    case ONNX__TYPE_PROTO__VALUE_MAP_TYPE: return "a map";
    case ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE: return "an optional";
    case ONNX__TYPE_PROTO__VALUE_SPARSE_TENSOR_TYPE: return "a sparse tensor";
    default: return "of no known type";
    }
}

/* Copies a ValueInfoProto's tensor type into a value: dtype, rank, dims
 * (-1 plus dim_param for symbolic or unknown dims). */
static int set_value_type(struct graph_value *v, const Onnx__ValueInfoProto *vi, const char *what, char *err,
                          size_t err_len) {
    const Onnx__TypeProto *tp = vi->type;
    if (!tp) return status_set(err, err_len, STATUS_INVALID, "%s '%s' has no type", what, v->name);
    /* A sequence of maps is what scikit-learn classifiers export by default
     * (ZipMap): say how to export a tensor instead. */
    if (tp->value_case == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE && tp->sequence_type &&
        tp->sequence_type->elem_type && tp->sequence_type->elem_type->value_case == ONNX__TYPE_PROTO__VALUE_MAP_TYPE)
        return status_set(err, err_len, STATUS_UNSUPPORTED,
                          "%s '%s' is a sequence of maps (the output of ZipMap); kiln supports only tensors: export "
                          "scikit-learn classifiers with skl2onnx's options={id(model): {'zipmap': False}}",
                          what, v->name);
    if (tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
        return status_set(err, err_len, STATUS_UNSUPPORTED, "%s '%s' is %s; kiln supports only tensors", what,
                          v->name, type_case_name(tp->value_case));
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    int64_t dt = tt->has_elem_type ? tt->elem_type : 0;
    if (!dtype_ok(dt))
        return status_set(err, err_len, dt ? STATUS_UNSUPPORTED : STATUS_INVALID,
                          "%s '%s' has element type %s (%lld), which kiln does not support", what, v->name,
                          onnx_dtype_label(dt), (long long)dt);
    v->t.dtype = (enum dtype)dt;
    if (!tt->shape) {
        v->t.ndim = -1;
        return 0;
    }
    if (tt->shape->n_dim > TENSOR_MAX_DIMS)
        return status_set(err, err_len, STATUS_INVALID, "%s '%s' has rank %zu; kiln supports at most %d", what,
                          v->name, tt->shape->n_dim, TENSOR_MAX_DIMS);
    v->t.ndim = (int)tt->shape->n_dim;
    for (size_t i = 0; i < tt->shape->n_dim; i++) {
        const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[i];
        v->t.dims[i] = -1;
        if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
            /* Some exporters write -1 for "unknown"; anything below that is garbage. */
            if (d->dim_value < -1 || d->dim_value > INT32_MAX)
                return status_set(err, err_len, STATUS_INVALID, "%s '%s' has an invalid dim %lld at axis %zu",
                                  what, v->name, (long long)d->dim_value, i);
            v->t.dims[i] = d->dim_value;
        } else if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM && d->dim_param &&
                   *d->dim_param) {
            free(v->dim_param[i]);
            v->dim_param[i] = strdup(d->dim_param);
            if (!v->dim_param[i]) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
        }
    }
    return 0;
}

/* ---- model -------------------------------------------------------------- */

static int opset_for(const Onnx__ModelProto *mp, const struct graph *g, const char *domain) {
    int is_default = !*domain || strcmp(domain, "ai.onnx") == 0;
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const char *d = mp->opset_import[i]->domain ? mp->opset_import[i]->domain : "";
        int d_default = !*d || strcmp(d, "ai.onnx") == 0;
        if ((is_default && d_default) || (!is_default && strcmp(d, domain) == 0)) {
            int64_t v = mp->opset_import[i]->version;
            return v < 0 ? 0 : (v > INT_MAX ? INT_MAX : (int)v);
        }
    }
    if (is_default) return (int)g->opset_default;
    return 1;
}

/* The node's opset, attributes and kernel, once it is in the graph. */
static int finish_node(struct graph *g, const Onnx__ModelProto *mp, const Onnx__NodeProto *np, int idx,
                       const char *base_dir, char *err, size_t err_len) {
    struct graph_node *node = &g->nodes[idx];
    const char *domain = node->domain;
    node->opset = opset_for(mp, g, domain);
    if (np->n_attribute) {
        if (np->n_attribute > INT_MAX)
            return status_set(err, err_len, STATUS_INVALID, "node '%s': too many attributes", node->name);
        node->attrs = calloc(np->n_attribute, sizeof *node->attrs);
        if (!node->attrs) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
        for (size_t a = 0; a < np->n_attribute; a++) {
            node->nattr = (int)a + 1; /* graph_free releases whatever was converted */
            int rc = convert_attr(np->attribute[a], &node->attrs[a], g, idx, mp, base_dir, err, err_len);
            node = &g->nodes[idx];
            if (rc) return rc;
        }
    }
    node->op = control_op_find(domain, node->op_type);
    if (!node->op) node->op = op_find(domain, node->op_type);
    if (!node->op)
        return status_set(err, err_len, STATUS_UNSUPPORTED,
                          "node '%s' : operator '%s' (domain '%s', opset %d) is not supported", node->name,
                          node->op_type, *domain ? domain : "ai.onnx", node->opset);
    return 0;
}

/* Concat, Sum, Max and Min are associative: such a node with more inputs
 * than a kernel call takes (OP_MAX_IO; detection exports concatenate
 * a hundred anchors) is loaded as a tree of nodes of at most OP_MAX_IO
 * inputs each, with the node's attributes. */
static int splits_wide(const Onnx__NodeProto *np) {
    static const char *const ops[] = {"Concat", "Sum", "Max", "Min"};
    const char *d = np->domain ? np->domain : "";
    if ((*d && strcmp(d, "ai.onnx") != 0) || np->n_output != 1) return 0;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(np->op_type, ops[i]) == 0) return 1;
    return 0;
}

/* Adds the inner levels of the tree for the first *nin values of ins and
 * leaves the top level's inputs there (*nin <= OP_MAX_IO). */
static int add_wide_parts(struct graph *g, const Onnx__ModelProto *mp, const Onnx__NodeProto *np, int *ins, int *nin,
                          int out, const char *base_dir, char *err, size_t err_len) {
    const char *domain = np->domain ? np->domain : "";
    const char *oname = g->values[out].name;
    for (int level = 0; *nin > OP_MAX_IO; level++) {
        int parts = 0;
        for (int first = 0; first < *nin; first += OP_MAX_IO, parts++) {
            int cnt = *nin - first < OP_MAX_IO ? *nin - first : OP_MAX_IO;
            char name[512];
            snprintf(name, sizeof name, "%s/part%d.%d", oname, level, parts);
            int v = graph_new_value(g, name);
            int idx = v < 0 ? -1 : graph_add_node(g, name, np->op_type, domain, ins + first, cnt, &v, 1);
            if (idx < 0) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
            int rc = finish_node(g, mp, np, idx, base_dir, err, err_len);
            if (rc) return rc;
            ins[parts] = v; /* parts <= first: those inputs were read */
        }
        *nin = parts;
    }
    return 0;
}

static int load_nodes(struct graph *g, const Onnx__ModelProto *mp, const Onnx__GraphProto *gp, const char *base_dir,
                      char *err, size_t err_len) {
    int *ins = NULL, *outs = NULL;
    size_t cap = 0;
    int rc = 0;
    for (size_t k = 0; k < gp->n_node; k++) {
        const Onnx__NodeProto *np = gp->node[k];
        const char *nname = np->name && *np->name ? np->name : NULL;
        if (!np->op_type || !*np->op_type) {
            rc = status_set(err, err_len, STATUS_INVALID, "node %zu%s%s%s has no op_type", k, nname ? " '" : "",
                            nname ? nname : "", nname ? "'" : "");
            goto out;
        }
        if ((np->n_input > OP_MAX_IO && !splits_wide(np)) || np->n_output > OP_MAX_IO) {
            rc = status_set(err, err_len, STATUS_UNSUPPORTED,
                            "node '%s' (%s) has %zu inputs and %zu outputs; kiln supports at most %d of each",
                            nname ? nname : "?", np->op_type, np->n_input, np->n_output, OP_MAX_IO);
            goto out;
        }
        if (np->n_input > INT_MAX / 2) {
            rc = status_set(err, err_len, STATUS_INVALID, "node '%s': too many inputs", nname ? nname : "?");
            goto out;
        }
        size_t need = np->n_input > np->n_output ? np->n_input : np->n_output;
        if (need > cap) {
            cap = need > OP_MAX_IO ? need : OP_MAX_IO;
            free(ins);
            free(outs);
            ins = malloc(cap * sizeof *ins);
            outs = malloc(cap * sizeof *outs);
            if (!ins || !outs) {
                rc = status_set(err, err_len, STATUS_NOMEM, "out of memory");
                goto out;
            }
        }
        for (size_t i = 0; i < np->n_input; i++) {
            const char *s = np->input[i];
            ins[i] = s && *s ? graph_intern_value(g, s) : -1;
            if (s && *s && ins[i] < 0) {
                rc = status_set(err, err_len, STATUS_NOMEM, "out of memory");
                goto out;
            }
        }
        for (size_t i = 0; i < np->n_output; i++) {
            const char *s = np->output[i];
            outs[i] = s && *s ? graph_intern_value(g, s) : -1;
            if (s && *s && outs[i] < 0) {
                rc = status_set(err, err_len, STATUS_NOMEM, "out of memory");
                goto out;
            }
            /* ONNX graphs are single-assignment: a node may not overwrite a constant. */
            if (outs[i] >= 0 && g->values[outs[i]].t.data) {
                rc = status_set(err, err_len, STATUS_INVALID, "node '%s' (%s) writes '%s', which is an initializer",
                                nname ? nname : "?", np->op_type, s);
                goto out;
            }
        }
        const char *domain = np->domain ? np->domain : "";
        int nin = (int)np->n_input;
        if (nin > OP_MAX_IO && (rc = add_wide_parts(g, mp, np, ins, &nin, outs[0], base_dir, err, err_len)))
            goto out;
        int idx = graph_add_node(g, nname, np->op_type, domain, ins, nin, outs, (int)np->n_output);
        if (idx < 0) {
            rc = status_set(err, err_len, STATUS_NOMEM, "out of memory");
            goto out;
        }
        if ((rc = finish_node(g, mp, np, idx, base_dir, err, err_len))) goto out;
    }
out:
    free(ins);
    free(outs);
    return rc;
}
/* A subgraph's names that nothing in it defines (no initializer, input or
 * node output) are values of an enclosing graph: each becomes an input of
 * the subgraph (captured) and an input of node pidx of the parent, so that
 * the parent orders, keeps alive and plans the value like any other input
 * of that node. A name the parent does not define either is interned there
 * and captured in turn when the parent, itself a subgraph, finishes; at the
 * top level it is an undefined input, which the sort reports. */
static int capture_outer(struct graph *sub, struct graph *parent, int pidx, char *err, size_t err_len) {
    unsigned char *made = calloc((size_t)(sub->nvalues > 0 ? sub->nvalues : 1), 1);
    if (!made) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    for (int i = 0; i < sub->nnodes; i++)
        for (int k = 0; k < sub->nodes[i].nout; k++)
            if (sub->nodes[i].out[k] >= 0) made[sub->nodes[i].out[k]] = 1;
    int rc = 0;
    for (int v = 0; v < sub->nvalues && !rc; v++) {
        struct graph_value *val = &sub->values[v];
        if (made[v] || val->t.data || (val->flags & VALUE_INPUT)) continue;
        int ov = graph_intern_value(parent, val->name);
        int *ins = realloc(sub->inputs, (size_t)(sub->ninputs + 1) * sizeof *ins);
        if (ins) sub->inputs = ins;
        int *cap = realloc(sub->capture_in, (size_t)(sub->ncaptured + 1) * sizeof *cap);
        if (cap) sub->capture_in = cap;
        if (ov < 0 || !ins || !cap) {
            rc = status_set(err, err_len, STATUS_NOMEM, "out of memory");
            break;
        }
        struct graph_node *pn = &parent->nodes[pidx];
        int k = 0;
        while (k < pn->nin && pn->in[k] != ov) k++;
        if (k == pn->nin) {
            if (pn->nin >= OP_MAX_IO) {
                rc = status_set(err, err_len, STATUS_UNSUPPORTED,
                                "it reads more than %d values from the enclosing graph and inputs of the node",
                                OP_MAX_IO);
                break;
            }
            int *pin = realloc(pn->in, (size_t)(pn->nin + 1) * sizeof *pin);
            if (!pin) {
                rc = status_set(err, err_len, STATUS_NOMEM, "out of memory");
                break;
            }
            pn->in = pin;
            pn->in[pn->nin++] = ov;
        }
        sub->inputs[sub->ninputs++] = v;
        sub->capture_in[sub->ncaptured++] = k;
        val->flags |= VALUE_INPUT;
    }
    free(made);
    return rc;
}

/* Initializers, inputs, nodes and outputs of gp into g, then the topological
 * sort. parent is NULL for the model's graph; for a subgraph it is the
 * enclosing graph and pidx the node that holds it: a subgraph's inputs and
 * outputs may come without a type (the op defines them), and its outputs
 * may name outer values. */
static int load_graph_body(struct graph *g, struct graph *parent, int pidx, const Onnx__ModelProto *mp,
                           const Onnx__GraphProto *gp, const char *base_dir, char *err, size_t err_len) {
    int rc = 0;
    if (gp->n_sparse_initializer)
        return status_set(err, err_len, STATUS_UNSUPPORTED, "sparse initializer '%s' is not supported",
                          gp->sparse_initializer[0]->values && gp->sparse_initializer[0]->values->name
                              ? gp->sparse_initializer[0]->values->name
                              : "?");

    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *tp = gp->initializer[i];
        if (!tp->name || !*tp->name) return status_set(err, err_len, STATUS_INVALID, "initializer %zu has no name", i);
        int v = graph_intern_value(g, tp->name);
        if (v < 0) goto nomem;
        if (g->values[v].t.data)
            return status_set(err, err_len, STATUS_INVALID, "initializer '%s' is defined twice", tp->name);
        rc = onnx_tensor_from_proto(tp, base_dir, &g->values[v].t, err, err_len);
        if (rc) return rc;
    }

    g->inputs = malloc((gp->n_input ? gp->n_input : 1) * sizeof(int));
    g->outputs = malloc((gp->n_output ? gp->n_output : 1) * sizeof(int));
    if (!g->inputs || !g->outputs) goto nomem;
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        if (!vi->name || !*vi->name) return status_set(err, err_len, STATUS_INVALID, "graph input %zu has no name", i);
        int v = graph_intern_value(g, vi->name);
        if (v < 0) goto nomem;
        struct graph_value *val = &g->values[v];
        if (val->t.data && !parent) { /* an initializer listed as an input: a constant (model_params.defaults) */
            val->flags |= VALUE_LISTED_INPUT;
            continue;
        }
        if (val->flags & VALUE_INPUT)
            return status_set(err, err_len, STATUS_INVALID, "graph input '%s' is listed twice", vi->name);
        if ((vi->type || !parent) && (rc = set_value_type(val, vi, "graph input", err, err_len))) return rc;
        val->flags |= VALUE_INPUT;
        g->inputs[g->ninputs++] = v;
    }

    if ((rc = load_nodes(g, mp, gp, base_dir, err, err_len))) return rc;

    for (size_t i = 0; i < gp->n_output; i++) {
        const Onnx__ValueInfoProto *vi = gp->output[i];
        if (!vi->name || !*vi->name) return status_set(err, err_len, STATUS_INVALID, "graph output %zu has no name", i);
        int v = parent ? graph_intern_value(g, vi->name) : graph_find_value(g, vi->name);
        if (v < 0 && parent) goto nomem;
        if (v < 0)
            return status_set(err, err_len, STATUS_INVALID, "graph output '%s' is not produced by any node", vi->name);
        struct graph_value *val = &g->values[v];
        if ((val->flags & VALUE_OUTPUT) && !parent)
            return status_set(err, err_len, STATUS_INVALID, "graph output '%s' is listed twice", vi->name);
        /* The declared type of a computed output is a hint for metadata; the
         * engine's shape inference has the last word. Inputs and constants
         * keep what they have. A subgraph's outputs are typed by its op. */
        if (!parent && !val->t.data && !(val->flags & VALUE_INPUT) && vi->type &&
            (rc = set_value_type(val, vi, "graph output", err, err_len)))
            return rc;
        val->flags |= VALUE_OUTPUT;
        g->outputs[g->noutputs++] = v;
    }
    if (g->noutputs == 0) return status_set(err, err_len, STATUS_INVALID, "model declares no graph outputs");
    if (parent && (rc = capture_outer(g, parent, pidx, err, err_len))) return rc;
    return graph_toposort(g, err, err_len);
nomem:
    return status_set(err, err_len, STATUS_NOMEM, "out of memory loading the model");
}

static int load_subgraph(struct graph *parent, int pidx, const Onnx__ModelProto *mp, const Onnx__GraphProto *gp,
                         const char *base_dir, struct graph **out, char *err, size_t err_len) {
    struct graph *g = graph_create();
    *out = g;
    if (!g || !(g->name = strdup(gp->name ? gp->name : "")))
        return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    g->ir_version = parent->ir_version;
    g->opset_default = parent->opset_default;
    g->opset_ml = parent->opset_ml;
    return load_graph_body(g, parent, pidx, mp, gp, base_dir, err, err_len);
}

static struct graph *load_model(const Onnx__ModelProto *mp, const char *base_dir, char *err, size_t err_len) {
    const Onnx__GraphProto *gp = mp->graph;
    if (!gp) {
        status_set(err, err_len, STATUS_INVALID, "model has no graph (empty or not an ONNX model file?)");
        return NULL;
    }
    struct graph *g = graph_create();
    if (!g) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory");
        return NULL;
    }
    g->ir_version = mp->has_ir_version ? mp->ir_version : 0;
    g->name = strdup(gp->name ? gp->name : "");
    g->producer_name = strdup(mp->producer_name ? mp->producer_name : "");
    if (!g->name || !g->producer_name) {
        status_set(err, err_len, STATUS_NOMEM, "out of memory loading the model");
        goto fail;
    }
    /* Files that import no default opset predate opsets: version 1 rules. */
    g->opset_default = 1;
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const char *d = mp->opset_import[i]->domain ? mp->opset_import[i]->domain : "";
        if (!*d || strcmp(d, "ai.onnx") == 0) g->opset_default = mp->opset_import[i]->version;
        else if (strcmp(d, "ai.onnx.ml") == 0) g->opset_ml = mp->opset_import[i]->version;
    }
    if (load_graph_body(g, NULL, -1, mp, gp, base_dir, err, err_len) == 0) return g;
fail:
    graph_free(g);
    return NULL;
}

static Onnx__ModelProto *parse_model(const void *buf, size_t len, char *err, size_t err_len) {
    if (wire_check(buf, len, &onnx__model_proto__descriptor, "model file", err, err_len) != 0) return NULL;
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, len, buf);
    if (!mp)
        status_set(err, err_len, STATUS_INVALID,
                   "not a valid ONNX model: the protobuf does not parse (truncated or not an ONNX file)");
    return mp;
}

struct graph *onnx_load_buffer(const void *buf, size_t len, const char *base_dir, char *err, size_t err_len) {
    Onnx__ModelProto *mp = parse_model(buf, len, err, err_len);
    if (!mp) return NULL;
    struct graph *g = load_model(mp, base_dir, err, err_len);
    onnx__model_proto__free_unpacked(mp, NULL);
    return g;
}

struct graph *onnx_load_file(const char *path, char *err, size_t err_len) {
    void *buf;
    size_t len;
    if (read_file(path, &buf, &len, err, err_len) != 0) return NULL;
    char sub[512];
    Onnx__ModelProto *mp = parse_model(buf, len, sub, sizeof sub);
    free(buf); /* protobuf-c copied what it needs */
    if (!mp) {
        status_set(err, err_len, STATUS_INVALID, "%s: %s", path, sub);
        return NULL;
    }
    char *dir = dir_of(path);
    struct graph *g = dir ? load_model(mp, dir, err, err_len) : NULL;
    if (!dir) status_set(err, err_len, STATUS_NOMEM, "out of memory");
    free(dir);
    onnx__model_proto__free_unpacked(mp, NULL);
    return g;
}

int onnx_load_tensor_file(const char *pb_path, struct tensor *out, char **name, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    if (name) *name = NULL;
    void *buf;
    size_t len;
    int rc = read_file(pb_path, &buf, &len, err, err_len);
    if (rc) return rc;
    rc = wire_check(buf, len, &onnx__tensor_proto__descriptor, pb_path, err, err_len);
    Onnx__TensorProto *tp = rc ? NULL : onnx__tensor_proto__unpack(NULL, len, buf);
    free(buf);
    if (rc) return rc;
    if (!tp)
        return status_set(err, err_len, STATUS_INVALID, "%s: not a valid TensorProto (truncated or another format)",
                          pb_path);
    char *dir = dir_of(pb_path);
    if (!dir) {
        onnx__tensor_proto__free_unpacked(tp, NULL);
        return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    }
    char sub[512];
    rc = onnx_tensor_from_proto(tp, dir, out, sub, sizeof sub);
    free(dir);
    if (rc) status_set(err, err_len, rc, "%s: %s", pb_path, sub);
    if (!rc && name) {
        *name = strdup(tp->name ? tp->name : "");
        if (!*name) {
            onnx_tensor_clear(out);
            rc = status_set(err, err_len, STATUS_NOMEM, "out of memory");
        }
    }
    onnx__tensor_proto__free_unpacked(tp, NULL);
    return rc;
}
