/* kserve_encode.c - the KServe v2 answer: the JSON header and binary
 * outputs (spliced or copied), the classification extension's top k, and
 * the JSON string and error bodies the transports share. The contract is
 * server/kserve.h. */
#include "server/kserve.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/jsonnum.h"
#include "common/status.h"
#include "config/model_config.h"
#include "server/kserve_impl.h"

/* ---- buffers ------------------------------------------------------------ */

/* The UTF-8 sequence at s (avail > 0 bytes left): its length when valid
 * (no overlong forms, no surrogates, nothing past U+10FFFF), else minus
 * the bytes of its longest valid start (at least 1), which become one
 * U+FFFD, as Unicode's "maximal subpart" practice and Python's decoder do. */
static int utf8_seq(const unsigned char *s, size_t avail) {
    unsigned c = s[0];
    int n = c >= 0xc2 && c < 0xe0 ? 2 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xf0 && c < 0xf5 ? 4 : 0;
    if (!n) return -1;
    for (int k = 1; k < n; k++) {
        if ((size_t)k >= avail) return -k;
        unsigned lo = 0x80, hi = 0xbf;
        if (k == 1 && c == 0xe0) lo = 0xa0;
        if (k == 1 && c == 0xed) hi = 0x9f;
        if (k == 1 && c == 0xf0) lo = 0x90;
        if (k == 1 && c == 0xf4) hi = 0x8f;
        if (s[k] < lo || s[k] > hi) return -k;
    }
    return n;
}

/* Names, ids and messages come from clients, and any byte may be in them.
 * Every byte of s goes out: control bytes (NUL included) as escapes, and a
 * byte that is not part of valid UTF-8 as U+FFFD, so that the answer stays
 * valid JSON (JSON carries text; the binary tensor extension carries any
 * bytes exactly, and a BYTES output that is not UTF-8 is refused in JSON:
 * kserve_response_encode). */
void kserve_buf_json_string(struct buf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    if (buf_reserve(b, n * 6 + 3)) return;
    char *o = b->data + b->len;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') { /* the common byte first: one test */
            *o++ = (char)c;
            continue;
        }
        if (c == '"' || c == '\\') { *o++ = '\\'; *o++ = (char)c; }
        else if (c == '\n') { *o++ = '\\'; *o++ = 'n'; }
        else if (c == '\r') { *o++ = '\\'; *o++ = 'r'; }
        else if (c == '\t') { *o++ = '\\'; *o++ = 't'; }
        else if (c < 0x20) { memcpy(o, "\\u00", 4); o += 4; *o++ = hex[c >> 4]; *o++ = hex[c & 15]; }
        else if (c < 0x80) *o++ = (char)c;
        else {
            int k = utf8_seq((const unsigned char *)s + i, n - i);
            if (k > 0) memcpy(o, s + i, (size_t)k);
            else memcpy(o, "\xef\xbf\xbd", 3);
            o += k > 0 ? k : 3;
            i += (size_t)(k > 0 ? k : -k) - 1;
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->data);
}

/* The first element of BYTES tensor t that is not valid UTF-8, or -1. */
static int64_t first_not_utf8(const struct tensor *t) {
    const struct tensor_str *e = tensor_strs(t);
    for (int64_t i = 0, n = tensor_numel(t); i < n; i++)
        for (size_t k = 0; k < e[i].len;) {
            const unsigned char *c = (const unsigned char *)e[i].p + k;
            int m = *c < 0x80 ? 1 : utf8_seq(c, e[i].len - k);
            if (m < 0) return i;
            k += (size_t)m;
        }
    return -1;
}

void kserve_error_body(struct buf *b, const char *msg) {
    buf_str(b, "{\"error\":");
    kserve_buf_json_string(b, msg, strlen(msg));
    buf_str(b, "}");
}

/* ---- response encoding -------------------------------------------------- */

/* Non-finite values as tritonclient writes them (python-rapidjson reads them
 * back); float-sized values as the shortest text that reads back as the same
 * float (jsonnum), doubles with all 17 digits. */
static void put_double(struct buf *b, double v, int fp32) {
    if (isnan(v)) buf_str(b, "NaN");
    else if (isinf(v)) buf_str(b, v > 0 ? "Infinity" : "-Infinity");
    else if (!fp32) buf_printf(b, "%.17g", v);
    else if (!buf_reserve(b, JSONNUM_BUF)) b->len += jsonnum_format_float((float)v, b->data + b->len);
}

static void put_i64(struct buf *b, int64_t v) {
    if (!buf_reserve(b, JSONNUM_BUF)) b->len += jsonnum_format_i64(v, b->data + b->len);
}

static void put_u64(struct buf *b, uint64_t v) {
    if (!buf_reserve(b, JSONNUM_BUF)) b->len += jsonnum_format_u64(v, b->data + b->len);
}

static void put_data_json(struct buf *b, const struct tensor *t) {
    int64_t n = tensor_numel(t);
    buf_str(b, "[");
    for (int64_t i = 0; i < n; i++) {
        if (i) buf_add(b, ",", 1);
        switch (t->dtype) {
        case DT_FP32: put_double(b, ((const float *)t->data)[i], 1); break;
        case DT_FP64: put_double(b, ((const double *)t->data)[i], 0); break;
        case DT_FP16: case DT_BF16: put_double(b, tensor_elem_f64(t, i), 1); break;
        case DT_BOOL: buf_str(b, ((const uint8_t *)t->data)[i] ? "true" : "false"); break;
        case DT_INT64: put_i64(b, ((const int64_t *)t->data)[i]); break;
        case DT_UINT64: put_u64(b, ((const uint64_t *)t->data)[i]); break;
        case DT_STRING: kserve_buf_json_string(b, tensor_strs(t)[i].p, tensor_strs(t)[i].len); break;
        default: put_i64(b, (int64_t)tensor_elem_f64(t, i)); break; /* 8- to 32-bit integers: exact */
        }
    }
    buf_str(b, "]");
}

static size_t binary_size(const struct tensor *t) {
    return t->dtype == DT_STRING ? tensor_strings_prefixed_size(t) : tensor_nbytes(t);
}

static void put_data_binary(struct buf *b, const struct tensor *t) {
    size_t n = binary_size(t);
    if (buf_reserve(b, n + 1)) return; /* the caller checks b->data after encoding */
    if (t->dtype == DT_STRING) tensor_strings_prefixed_write(t, b->data + b->len);
    else if (n) memcpy(b->data + b->len, t->data, n);
    b->len += n;
}

/* ---- classification ------------------------------------------------------
 *
 * Triton's classification extension: each row's top k as BYTES
 * "value:index[:label]", highest value first. It runs on the I/O thread, so
 * it must stay linear in the output: a min-heap of the k best so far (its
 * root the worst of them) takes each element in O(log k), then the k are
 * sorted. Equal values keep the lower index first (NaN ranks below every
 * number), so the order is the same whatever the selection's path. */

struct top {
    double v;
    int64_t i;
};

/* a ranks before b. */
static int top_before(const struct top *a, const struct top *b) {
    if (isnan(a->v) || isnan(b->v)) {
        if (isnan(a->v) != isnan(b->v)) return !isnan(a->v);
    } else if (a->v != b->v) return a->v > b->v;
    return a->i < b->i;
}

/* Restores the heap (the root ranks last) below slot at. */
static void top_sift(struct top *h, int64_t n, int64_t at) {
    for (;;) {
        int64_t c = 2 * at + 1;
        if (c >= n) return;
        if (c + 1 < n && top_before(&h[c], &h[c + 1])) c++;
        if (!top_before(&h[at], &h[c])) return;
        struct top t = h[at];
        h[at] = h[c];
        h[c] = t;
        at = c;
    }
}

/* The k best of row[0, per) into h, best first. */
static void top_k(const struct tensor *in, int64_t base, int64_t per, int64_t k, struct top *h) {
    if (k <= 0) return;
    for (int64_t i = 0; i < k; i++) h[i] = (struct top){tensor_elem_f64(in, base + i), i};
    for (int64_t i = k / 2; i-- > 0;) top_sift(h, k, i);
    for (int64_t i = k; i < per; i++) {
        struct top e = {tensor_elem_f64(in, base + i), i};
        if (top_before(&e, &h[0])) {
            h[0] = e;
            top_sift(h, k, 0);
        }
    }
    /* Heap sort: the worst goes last, then the next worst... */
    for (int64_t n = k; n > 1; n--) {
        struct top t = h[0];
        h[0] = h[n - 1];
        h[n - 1] = t;
        top_sift(h, n - 1, 0);
    }
}

static int classify(const struct tensor *in, int k, int batched, const struct model_config_io *io, struct tensor *out) {
    int64_t n = tensor_numel(in);
    int64_t nrows = batched && in->ndim > 0 ? in->dims[0] : 1;
    int64_t per = nrows > 0 ? n / nrows : 0;
    if (k > per) k = (int)per;
    memset(out, 0, sizeof *out);
    out->dtype = DT_STRING;
    out->ndim = 0;
    if (batched) out->dims[out->ndim++] = nrows;
    out->dims[out->ndim++] = k;
    /* The strings one after another in one buffer (at[i] is where string i
     * starts, at[n] the end); then packed into the tensor's one block. */
    struct buf text = {0};
    size_t *at = malloc(sizeof *at * (size_t)(nrows * k + 1));
    struct tensor_str *s = malloc(sizeof *s * (size_t)(nrows * k + 1));
    struct top *h = malloc(sizeof *h * (size_t)(k + 1));
    int rc = at && s && h ? 0 : STATUS_NOMEM;
    int fp = in->dtype == DT_FP32 || in->dtype == DT_FP64 || in->dtype == DT_FP16 || in->dtype == DT_BF16;
    for (int64_t r = 0; r < nrows && !rc; r++) {
        top_k(in, r * per, per, k, h);
        for (int j = 0; j < k; j++) {
            at[r * k + j] = text.len;
            if (fp) buf_printf(&text, "%f:%lld", h[j].v, (long long)h[j].i);
            else buf_printf(&text, "%lld:%lld", (long long)h[j].v, (long long)h[j].i);
            if (io && h[j].i < io->nlabels) buf_printf(&text, ":%s", io->labels[h[j].i]);
        }
        if (text.failed) rc = STATUS_NOMEM;
    }
    if (!rc) at[nrows * k] = text.len;
    for (int64_t i = 0; !rc && i < nrows * k; i++) {
        s[i].p = text.data ? text.data + at[i] : "";
        s[i].len = at[i + 1] - at[i];
    }
    if (!rc) rc = tensor_strings_pack(out, s);
    buf_free(&text);
    free(at);
    free(s);
    free(h);
    return rc;
}

/* The JSON text of an output's data takes at least two bytes an element (a
 * digit and a comma): an answer whose outputs cannot fit in the request's
 * memory budget that way is refused before any of it is written, naming the
 * largest output. The buffer's limit bounds the rest. */
static int check_answer_size(const struct kserve_request *r, const char *const *names, const struct tensor *send,
                             const int *bin, int nsel, char *err, size_t err_len) {
    if (!kserve_max_request_memory) return 0;
    uint64_t total = 0, big = 0;
    int bi = 0;
    for (int i = 0; i < nsel; i++) {
        if (r->noutputs && r->outputs[i].shm.region) continue;
        uint64_t n = bin[i] ? binary_size(&send[i]) : 2 * (uint64_t)tensor_numel(&send[i]);
        total += n;
        if (n > big) {
            big = n;
            bi = i;
        }
    }
    if (total <= kserve_max_request_memory) return 0;
    return status_set(err, err_len, STATUS_INVALID,
                      "the answer needs more than %llu bytes (output '%s' alone %llu%s), over the server's "
                      "--max-request-memory of %zu bytes", (unsigned long long)total, names[bi],
                      (unsigned long long)big, bin[bi] ? "" : " as JSON text: ask for binary_data",
                      kserve_max_request_memory);
}

/* The outputs stay alive while their answer is written: the answer's text
 * gets the bound less their bytes, and at least half of it. */
static size_t answer_limit(const struct kserve_request *r, const struct tensor *send, int nsel) {
    size_t held = 0, max = kserve_max_request_memory;
    for (int i = 0; i < nsel; i++)
        if (!(r->noutputs && r->outputs[i].shm.region)) held += binary_size(&send[i]);
    return held < max / 2 ? max - held : max / 2;
}

/* The model's index of the i-th output the response carries: every name
 * the request asked for is one of mc's (kserve_request_bind checked it). */
static int output_index(const struct kserve_request *r, const struct model_config *mc, int i) {
    return r->noutputs ? model_config_find_output(mc, r->outputs[i].name) : i;
}

/* The binary outputs after the JSON header, in its order: a block whose
 * bytes are the wire's (not BYTES, not a classification) is listed in sp
 * while there is room, the rest copied into body. */
static void put_binary_parts(const struct kserve_request *r, const struct model_config *mc, const struct tensor *send,
                             const int *bin, const uint8_t *owned, int nsel, struct buf *body,
                             struct kserve_splice *sp, int max, int *nsp) {
    for (int i = 0; i < nsel; i++) {
        if (!bin[i]) continue;
        size_t n = tensor_nbytes(&send[i]);
        if (!owned[i] && send[i].dtype != DT_STRING && n > 0 && *nsp < max)
            sp[(*nsp)++] = (struct kserve_splice){.output = output_index(r, mc, i), .at = body->len, .len = n};
        else put_data_binary(body, &send[i]);
    }
}

int kserve_classify(const struct tensor *in, int k, const struct model_config *mc, int index, struct tensor *out) {
    return classify(in, k, mc->max_batch_size > 0, &mc->outputs[index], out);
}

int kserve_response_encode(const struct kserve_request *r, const struct model_config *mc,
                           const char *model_name, const char *model_version,
                           const struct tensor *outputs, struct buf *body, size_t *json_len,
                           char *err, size_t err_len) {
    int n = 0;
    return kserve_response_encode_spliced(r, mc, model_name, model_version, outputs, body, json_len, NULL, 0, &n,
                                          err, err_len);
}

int kserve_response_encode_spliced(const struct kserve_request *r, const struct model_config *mc,
                                   const char *model_name, const char *model_version,
                                   const struct tensor *outputs, struct buf *body, size_t *json_len,
                                   struct kserve_splice *splices, int max_splices, int *nsplices,
                                   char *err, size_t err_len) {
    *nsplices = 0;
    int nsel = r->noutputs ? r->noutputs : mc->noutputs;
    /* A few outputs (the usual case) need no allocation. */
    struct tensor send_l[8];
    int bin_l[8];
    uint8_t owned_l[8];
    const char *names_l[8];
    int heap = nsel > 8;
    struct tensor *send = heap ? calloc((size_t)nsel + 1, sizeof *send) : memset(send_l, 0, sizeof send_l);
    int *bin = heap ? calloc((size_t)nsel + 1, sizeof *bin) : memset(bin_l, 0, sizeof bin_l);
    uint8_t *owned = heap ? calloc((size_t)nsel + 1, 1) : memset(owned_l, 0, sizeof owned_l);
    const char **names = heap ? calloc((size_t)nsel + 1, sizeof *names) : memset(names_l, 0, sizeof names_l);
    int rc = 0, any_bin = 0, failed_at = -1;
    if (!send || !bin || !owned || !names) {
        rc = STATUS_NOMEM;
        goto out;
    }
    for (int i = 0; i < nsel; i++) {
        int k = output_index(r, mc, i);
        names[i] = mc->outputs[k].name;
        bin[i] = r->noutputs && r->outputs[i].binary >= 0 ? r->outputs[i].binary : r->binary_data_output;
        if (r->noutputs && r->outputs[i].shm.region) bin[i] = 0; /* in its region already */
        int cls = r->noutputs ? r->outputs[i].classification : 0;
        if (cls > 0 && r->outputs[i].classified.data) send[i] = r->outputs[i].classified;
        else if (cls > 0) {
            if ((rc = classify(&outputs[k], cls, mc->max_batch_size > 0, &mc->outputs[k], &send[i]))) goto out;
            owned[i] = 1;
        } else send[i] = outputs[k];
        any_bin |= bin[i];
        /* JSON carries text: a BYTES element that is not UTF-8 would come
         * back changed (U+FFFD), so it is refused instead, as Triton does. */
        int64_t bad = send[i].dtype == DT_STRING && !bin[i] && !(r->noutputs && r->outputs[i].shm.region)
                          ? first_not_utf8(&send[i]) : -1;
        if (bad >= 0) {
            rc = status_set(err, err_len, STATUS_INVALID,
                            "output '%s': BYTES element %lld is not valid UTF-8, which a JSON answer cannot carry "
                            "unchanged: ask for it as binary data (parameters.binary_data: true)", names[i],
                            (long long)bad);
            goto out;
        }
    }
    if ((rc = check_answer_size(r, names, send, bin, nsel, err, err_len))) goto out;
    if (kserve_max_request_memory && !body->limit) body->limit = answer_limit(r, send, nsel);
    buf_str(body, "{\"model_name\":");
    kserve_buf_json_string(body, model_name, strlen(model_name));
    buf_str(body, ",\"model_version\":");
    kserve_buf_json_string(body, model_version, strlen(model_version));
    if (r->id) {
        buf_str(body, ",\"id\":");
        kserve_buf_json_string(body, r->id, strlen(r->id));
    }
    buf_str(body, ",\"outputs\":[");
    for (int i = 0; i < nsel; i++) {
        const struct tensor *t = &send[i];
        buf_str(body, i ? ",{\"name\":" : "{\"name\":");
        kserve_buf_json_string(body, names[i], strlen(names[i]));
        buf_str(body, ",\"datatype\":\"");
        buf_str(body, dtype_kserve_name(t->dtype));
        buf_str(body, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) buf_add(body, ",", 1);
            put_i64(body, t->dims[d]);
        }
        buf_str(body, "]");
        const struct kserve_shm *sm = r->noutputs ? &r->outputs[i].shm : NULL;
        if (sm && sm->region) {
            buf_str(body, ",\"parameters\":{\"shared_memory_region\":");
            kserve_buf_json_string(body, sm->region, strlen(sm->region));
            buf_str(body, ",\"shared_memory_byte_size\":");
            put_u64(body, binary_size(t));
            if (sm->offset) {
                buf_str(body, ",\"shared_memory_offset\":");
                put_u64(body, sm->offset);
            }
            buf_str(body, "}}");
        } else if (bin[i]) {
            buf_str(body, ",\"parameters\":{\"binary_data_size\":");
            put_u64(body, binary_size(t));
            buf_str(body, "}}");
        } else {
            buf_str(body, ",\"data\":");
            put_data_json(body, t);
            buf_str(body, "}");
        }
        if (body->failed && failed_at < 0) failed_at = i;
    }
    buf_str(body, "]}");
    *json_len = body->len;
    if (any_bin) put_binary_parts(r, mc, send, bin, owned, nsel, body, splices, max_splices, nsplices);
    if (body->failed == BUF_OVER_LIMIT)
        rc = status_set(err, err_len, STATUS_INVALID,
                        "output '%s': the answer passes %zu bytes, the most one request may use "
                        "(--max-request-memory): ask for binary_data outputs, fewer outputs or a smaller batch",
                        names[failed_at >= 0 ? failed_at : nsel - 1], body->limit);
    else if (body->failed)
        rc = status_set(err, err_len, STATUS_NOMEM, "out of memory encoding the answer (%zu bytes so far)", body->len);
out:
    for (int i = 0; send && i < nsel; i++)
        if (owned && owned[i]) tensor_free_data(&send[i]);
    if (heap) {
        free(send);
        free(bin);
        free(owned);
        free(names);
    }
    return rc;
}
