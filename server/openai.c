/* openai.c - OpenAI's embeddings API over the inference core (openai.h).
 *
 * A call's life: the body is read (cJSON: the request is small next to its
 * texts' compute, and token-id lists are plain integers), the model
 * acquired, every text tokenized, then each begun as its own core request
 * (input_ids, attention_mask, token_type_ids as the model has them, shape
 * [1, tokens]) and all started together so that they reach the batcher in
 * one go. Each answer is pooled into the text's vector in encode; the last
 * text to end writes the response (or the first failure) and calls done.
 *
 * Tokenizing is the one step that grows with the request: about 135 ns a
 * byte (a 10 MB text takes 1.35 s, cut to max_length only at the end). A
 * request with OPENAI_INLINE_TEXT_BYTES or more of text is tokenized on the
 * runtime's text threads (runtime_work_queue) so that its I/O thread serves
 * the others meanwhile; the call then holds the parsed request until the
 * work's done, back on the I/O thread, begins its texts. */
#include "server/openai.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "common/buf.h"
#include "common/jsonnum.h"
#include "common/log.h"
#include "common/status.h"
#include "kernels/text/tokenizer.h"
#include "server/kserve.h"

/* The request's "input": n items, each a text or a token-id list. */
struct input_items {
    const cJSON *list;  /* an array of items, or NULL: item is the one */
    const cJSON *one;
    int n;
    int tokens;         /* token-id lists, not texts */
};

struct openai_text {
    struct openai_call *call;
    struct infer_request *r;   /* NULL once it ended */
    int index;
    int64_t ntokens;
    struct tokenizer_encoding tk; /* its tokens, from tokenizing until its request begins */
    float *vec;                /* the pooled, normalised embedding: call->dim values */
};

struct openai_call {
    struct openai_env env;
    openai_done_fn done;
    void *ctx;
    struct repo_version *v;    /* held for the tokenizer and the configuration */
    char *model;
    int base64;
    int64_t dims;              /* the request's dimensions; 0 = the model's */
    int dim;                   /* the vectors' length, once the first text is pooled */
    int n, pending;
    int64_t prompt_tokens;
    int status;                /* the first failure */
    char err[512];
    /* While the texts are tokenized on a text thread: the request they are
     * in, the outcome (written there, read in tokenized), and whether the
     * client left (set here, read there to stop early). */
    cJSON *root;
    struct input_items items;  /* in root */
    struct runtime_work work;
    int tok_status;
    char tok_err[512];
    atomic_int gone;
    struct openai_text texts[];
};

/* ---- errors --------------------------------------------------------------- */

static const char *error_type(int http_code) {
    switch (http_code) {
    case 400: case 401: case 404: case 409: case 413: case 415: case 422: return "invalid_request_error";
    case 429: return "rate_limit_error";
    default: return http_code >= 500 ? "server_error" : "invalid_request_error";
    }
}

static void json_str_or_null(struct buf *b, const char *s) {
    if (s) kserve_buf_json_string(b, s, strlen(s));
    else buf_str(b, "null");
}

char *openai_error_body(int http_code, const char *msg, const char *param, const char *code, size_t *len) {
    struct buf b = {0};
    buf_str(&b, "{\"error\":{\"message\":");
    kserve_buf_json_string(&b, msg, strlen(msg));
    buf_str(&b, ",\"type\":");
    json_str_or_null(&b, error_type(http_code));
    buf_str(&b, ",\"param\":");
    json_str_or_null(&b, param);
    buf_str(&b, ",\"code\":");
    json_str_or_null(&b, code);
    buf_str(&b, "}}");
    if (!b.data) {
        *len = 0;
        return NULL;
    }
    *len = b.len;
    return b.data;
}

static void answer_error(openai_done_fn done, void *ctx, int http_code, const char *msg, const char *param,
                         const char *code) {
    size_t len;
    char *body = openai_error_body(http_code, msg, param, code, &len);
    done(ctx, http_code, body, len);
}

/* ---- the response ----------------------------------------------------------- */

static void put_vector(struct buf *b, const float *v, int n, int base64) {
    if (base64) {
        /* OpenAI's base64: the float32 values' little-endian bytes (x86 and
         * ARM64 are little-endian; a big-endian host would need a swap). */
        size_t need = sodium_base64_ENCODED_LEN((size_t)n * 4, sodium_base64_VARIANT_ORIGINAL);
        if (buf_reserve(b, need + 2)) return;
        b->data[b->len++] = '"';
        sodium_bin2base64(b->data + b->len, need, (const unsigned char *)v, (size_t)n * 4,
                          sodium_base64_VARIANT_ORIGINAL);
        b->len += need - 1;
        b->data[b->len++] = '"';
        return;
    }
    buf_add(b, "[", 1);
    for (int i = 0; i < n; i++) {
        if (i) buf_add(b, ",", 1);
        if (buf_reserve(b, JSONNUM_BUF)) return;
        b->len += jsonnum_format_float(v[i], b->data + b->len);
    }
    buf_add(b, "]", 1);
}

static char *response_body(const struct openai_call *c, size_t *len) {
    struct buf b = {0};
    buf_str(&b, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < c->n; i++) {
        char head[64];
        snprintf(head, sizeof head, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
        buf_str(&b, head);
        put_vector(&b, c->texts[i].vec, c->dim, c->base64);
        buf_add(&b, "}", 1);
    }
    buf_str(&b, "],\"model\":");
    kserve_buf_json_string(&b, c->model, strlen(c->model));
    char usage[96];
    snprintf(usage, sizeof usage, ",\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}",
             (long long)c->prompt_tokens, (long long)c->prompt_tokens);
    buf_str(&b, usage);
    if (!b.data) {
        *len = 0;
        return NULL;
    }
    *len = b.len;
    return b.data;
}

static void call_free(struct openai_call *c) {
    for (int i = 0; i < c->n; i++) {
        free(c->texts[i].vec);
        tokenizer_encoding_free(&c->texts[i].tk);
    }
    cJSON_Delete(c->root);
    repository_release(c->v);
    free(c->model);
    free(c);
}

/* The last text ended: the answer. */
static void call_finish(struct openai_call *c) {
    if (c->status) {
        int code = status_http(c->status);
        answer_error(c->done, c->ctx, code, c->err, NULL, NULL);
    } else {
        size_t len;
        char *body = response_body(c, &len);
        if (body) c->done(c->ctx, 200, body, len);
        else answer_error(c->done, c->ctx, 500, "out of memory writing the embeddings", NULL, NULL);
    }
    call_free(c);
}

static void call_fail(struct openai_call *c, int status, const char *msg) {
    if (c->status) return;
    c->status = status;
    snprintf(c->err, sizeof c->err, "%s", msg);
}

/* ---- pooling ---------------------------------------------------------------- */

/* The text's vector from the model's output o: [1, H] (or [H]) as it is, or
 * [1, T, H] pooled over the text's T tokens. Then cut to dims and
 * normalised, as the configuration says. */
static int pool(struct openai_call *c, struct openai_text *t, const struct model_embedding *e,
                const struct tensor *o, char *err, size_t err_len) {
    int64_t numel = tensor_numel(o);
    int64_t h = o->ndim > 0 ? o->dims[o->ndim - 1] : 0;
    int64_t tokens = e->pooling == MODEL_POOL_NONE ? 1 : (h > 0 ? numel / h : 0);
    if (h <= 0 || tokens <= 0 || (e->pooling != MODEL_POOL_NONE && o->ndim < 2) || h > (1 << 20))
        return status_set(err, err_len, STATUS_INTERNAL, "output '%s' has no embedding in it (%lld values)", e->output,
                          (long long)numel);
    if (e->pooling == MODEL_POOL_NONE && numel != h)
        return status_set(err, err_len, STATUS_INTERNAL, "output '%s' holds %lld values for one text, not one "
                          "vector of %lld", e->output, (long long)numel, (long long)h);
    int64_t want = c->dims ? c->dims : h;
    if (want > h)
        return status_set(err, err_len, STATUS_INVALID, "'dimensions' is %lld but model '%s' gives %lld",
                          (long long)c->dims, c->model, (long long)h);
    float *v = calloc((size_t)h, sizeof *v);
    if (!v) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    /* Double accumulation: a mean over hundreds of tokens loses nothing. */
    double *acc = calloc((size_t)h, sizeof *acc);
    if (!acc) {
        free(v);
        return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    }
    int64_t from = 0, to = tokens; /* the token rows pooled */
    if (e->pooling == MODEL_POOL_CLS) to = 1;
    else if (e->pooling == MODEL_POOL_LAST) from = tokens - 1;
    for (int64_t r = from; r < to; r++)
        for (int64_t j = 0; j < h; j++) acc[j] += tensor_elem_f64(o, r * h + j);
    for (int64_t j = 0; j < h; j++) v[j] = (float)(acc[j] / (double)(to - from));
    free(acc);
    if (e->normalize) {
        double ss = 0;
        for (int64_t j = 0; j < want; j++) ss += (double)v[j] * v[j];
        /* sentence-transformers' Normalize: x / max(||x||, 1e-12). */
        double norm = sqrt(ss);
        if (norm < 1e-12) norm = 1e-12;
        for (int64_t j = 0; j < want; j++) v[j] = (float)(v[j] / norm);
    }
    if (c->dim && c->dim != want) {
        free(v);
        return status_set(err, err_len, STATUS_INTERNAL, "output '%s' gave vectors of different lengths", e->output);
    }
    c->dim = (int)want;
    t->vec = v;
    return 0;
}

/* ---- the core's reply interface, per text ----------------------------------- */

static int text_encode(void *ctx, const struct infer_result *res, char *err, size_t err_len) {
    struct openai_text *t = ctx;
    const struct model_embedding *e = &res->config->embedding;
    if (!e->enabled || e->output_index < 0 || e->output_index >= res->config->noutputs)
        return status_set(err, err_len, STATUS_UNAVAILABLE, "model '%s' no longer serves embeddings",
                          res->model_name);
    return pool(t->call, t, e, &res->outputs[e->output_index], err, err_len);
}

static void text_send(void *ctx, int status, const char *msg) {
    struct openai_text *t = ctx;
    struct openai_call *c = t->call;
    t->r = NULL;
    if (status) {
        char m[600];
        if (c->n > 1) snprintf(m, sizeof m, "input[%d]: %s", t->index, msg ? msg : "failed");
        else snprintf(m, sizeof m, "%s", msg ? msg : "failed");
        call_fail(c, status, m);
        /* One failure ends the call: the other texts need not run. */
        for (int i = 0; i < c->n; i++)
            if (c->texts[i].r) infer_request_cancel(c->texts[i].r);
    }
    if (--c->pending == 0) call_finish(c);
}

static const struct infer_reply_i text_reply = {runtime_post_any, text_encode, text_send};

/* ---- the request ------------------------------------------------------------ */

/* Fills input k of q as an INT64/INT32 [1, n] tensor named name from vals
 * (NULL: every value fill). */
static int put_tokens(struct kserve_input *in, const char *name, enum dtype dt, const int64_t *vals, int64_t fill,
                      int64_t n) {
    in->name = strdup(name);
    in->t = (struct tensor){.dtype = dt, .ndim = 2, .dims = {1, n}};
    if (!in->name || tensor_alloc_data(&in->t)) return STATUS_NOMEM;
    for (int64_t i = 0; i < n; i++) {
        int64_t x = vals ? vals[i] : fill;
        if (dt == DT_INT32) ((int32_t *)in->t.data)[i] = (int32_t)x;
        else ((int64_t *)in->t.data)[i] = x;
    }
    return 0;
}

/* Begins text i's core request with its tokens (types NULL: zeros). */
static int text_begin(struct openai_call *c, int i, char *err, size_t err_len) {
    struct openai_text *t = &c->texts[i];
    const struct tokenizer_encoding *tk = &t->tk;
    const struct model_config *mc = &c->v->config;
    const struct model_embedding *e = &mc->embedding;
    int status = 0;
    t->call = c;
    t->index = i;
    t->ntokens = (int64_t)tk->n;
    t->r = infer_request_begin(c->env.core, c->v->name, c->v->version, &text_reply, t, c->env.thread, c->env.redis,
                               &status, err, err_len);
    if (!t->r) return status ? status : STATUS_UNAVAILABLE;
    struct kserve_request *q = infer_request_decoded(t->r);
    int k = (e->ids >= 0) + (e->mask >= 0) + (e->types >= 0);
    q->inputs = calloc((size_t)k, sizeof *q->inputs);
    q->outputs = calloc(1, sizeof *q->outputs);
    int rc = q->inputs && q->outputs ? 0 : STATUS_NOMEM;
    int m = 0;
    if (!rc) {
        q->ninputs = k;
        rc = put_tokens(&q->inputs[m++], mc->inputs[e->ids].name, mc->inputs[e->ids].dtype, tk->ids, 0,
                       (int64_t)tk->n);
    }
    if (!rc && e->mask >= 0)
        rc = put_tokens(&q->inputs[m++], mc->inputs[e->mask].name, mc->inputs[e->mask].dtype, NULL, 1,
                       (int64_t)tk->n);
    if (!rc && e->types >= 0)
        rc = put_tokens(&q->inputs[m++], mc->inputs[e->types].name, mc->inputs[e->types].dtype, tk->type_ids, 0,
                       (int64_t)tk->n);
    if (!rc) {
        q->noutputs = 1;
        q->outputs[0] = (struct kserve_output){.name = strdup(e->output), .binary = -1};
        if (!q->outputs[0].name) rc = STATUS_NOMEM;
    }
    if (rc) {
        infer_request_drop(t->r);
        t->r = NULL;
        return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    }
    return 0;
}

static int read_input(const cJSON *in, struct input_items *it, char *err, size_t err_len) {
    memset(it, 0, sizeof *it);
    if (cJSON_IsString(in)) {
        it->one = in;
        it->n = 1;
        return 0;
    }
    if (!cJSON_IsArray(in))
        return status_set(err, err_len, STATUS_INVALID, "'input' must be a string, a list of strings, a list of token "
                          "ids or a list of such lists");
    int n = cJSON_GetArraySize(in);
    if (n == 0) return status_set(err, err_len, STATUS_INVALID, "'input' must not be empty");
    const cJSON *first = in->child;
    if (!cJSON_IsNumber(first) && !cJSON_IsString(first) && !cJSON_IsArray(first))
        return status_set(err, err_len, STATUS_INVALID, "input[0] must be a string, a token id or a list of token "
                          "ids");
    if (cJSON_IsNumber(first)) { /* one list of token ids */
        it->one = in;
        it->n = 1;
        it->tokens = 1;
        return 0;
    }
    if (n > OPENAI_MAX_INPUTS)
        return status_set(err, err_len, STATUS_INVALID, "'input' has %d items; at most %d in one request", n,
                          OPENAI_MAX_INPUTS);
    it->list = in;
    it->n = n;
    it->tokens = cJSON_IsArray(first);
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, in) {
        if (it->tokens ? !cJSON_IsArray(x) : !cJSON_IsString(x))
            return status_set(err, err_len, STATUS_INVALID, "input[%d] is not a %s like input[0]: every item must be "
                              "of one kind", i, it->tokens ? "list of token ids" : "string");
        i++;
    }
    return 0;
}

/* Item i's tokens into tk: the tokenizer's, or the ids the request gave
 * (type_ids NULL). Any thread: it reads only the request and the model. */
static int item_tokens(const struct openai_call *c, const struct input_items *it, int i,
                       struct tokenizer_encoding *tk, char *err, size_t err_len) {
    const cJSON *x = it->list ? cJSON_GetArrayItem(it->list, i) : it->one;
    char where[32];
    if (it->list) snprintf(where, sizeof where, "input[%d]", i);
    else snprintf(where, sizeof where, "input");
    const struct model_embedding *e = &c->v->config.embedding;
    if (!it->tokens) {
        size_t len = strlen(x->valuestring);
        if (len == 0) return status_set(err, err_len, STATUS_INVALID, "%s is an empty string", where);
        char e2[300];
        int rc = tokenizer_encode(c->v->tokenizer, x->valuestring, len, NULL, 0, tk, e2, sizeof e2);
        if (rc) return status_set(err, err_len, rc, "%s: %s", where, e2);
        return 0;
    }
    int n = cJSON_GetArraySize(x);
    if (n == 0) return status_set(err, err_len, STATUS_INVALID, "%s is an empty list of token ids", where);
    int64_t max = e->max_tokens ? e->max_tokens : tokenizer_max_length(c->v->tokenizer);
    if (max > 0 && n > max)
        return status_set(err, err_len, STATUS_INVALID, "%s has %d tokens; model '%s' takes at most %lld", where, n,
                          c->model, (long long)max);
    tk->ids = malloc((size_t)n * sizeof *tk->ids);
    if (!tk->ids) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    /* An id past the vocabulary is refused here, by the request that sent
     * it: in the model (a Gather out of range) it would fail every request
     * batched with it. */
    int64_t vocab = tokenizer_vocab_size(c->v->tokenizer);
    int j = 0, rc = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, x) {
        double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
        if (!cJSON_IsNumber(v) || d != floor(d) || d < 0 || d > 2147483647.0)
            rc = status_set(err, err_len, STATUS_INVALID, "%s[%d] is not a token id (an integer 0 to 2^31-1)", where,
                            j);
        else if ((int64_t)d >= vocab)
            rc = status_set(err, err_len, STATUS_INVALID, "%s[%d] is %lld, not a token id of model '%s' (its "
                            "vocabulary has %lld)", where, j, (long long)d, c->model, (long long)vocab);
        if (rc) {
            free(tk->ids);
            tk->ids = NULL;
            return rc;
        }
        tk->ids[j++] = (int64_t)d;
    }
    tk->n = (size_t)n;
    return 0;
}

/* Every item's tokens into its text, in order; the first failure stops it.
 * Any thread (a text thread for long texts): it stops early too when the
 * client left. */
static int tokenize_all(struct openai_call *c, const struct input_items *it, char *err, size_t err_len) {
    for (int i = 0; i < it->n; i++) {
        if (atomic_load_explicit(&c->gone, memory_order_relaxed))
            return status_set(err, err_len, STATUS_CANCELLED, "the client went away");
        int rc = item_tokens(c, it, i, &c->texts[i].tk, err, err_len);
        if (rc) return rc;
    }
    return 0;
}

/* The texts are tokenized (status 0) or failed with status and err: begins
 * and starts them, or answers the failure. Returns the call while its texts
 * run, NULL once answered (the call is freed then). */
static openai_call_t *call_begin(struct openai_call *c, int status, const char *err) {
    char e2[512];
    int begun = 0;
    for (int i = 0; i < c->n && !status; i++) {
        c->prompt_tokens += (int64_t)c->texts[i].tk.n;
        status = text_begin(c, i, e2, sizeof e2);
        if (status) err = e2;
        else begun++;
        tokenizer_encoding_free(&c->texts[i].tk);
    }
    if (status) {
        for (int i = 0; i < begun; i++) infer_request_drop(c->texts[i].r);
        int code = status_http(status);
        answer_error(c->done, c->ctx, code, err, code == 400 ? "input" : NULL, NULL);
        call_free(c);
        return NULL;
    }
    /* pending counts the texts not ended; one more holds the call while they
     * start, since a text answered from the cache ends inside start. */
    c->pending = c->n + 1;
    for (int i = 0; i < c->n; i++) infer_request_start(c->texts[i].r);
    if (--c->pending == 0) {
        call_finish(c);
        return NULL;
    }
    return c;
}

/* ---- long texts, on the runtime's text threads ------------------------------ */

/* Below this many bytes of text a request is tokenized on its I/O thread.
 * Measured (all-MiniLM-L6-v2's tokenizer.json, -O2, a shared 2-core host):
 * tokenizing costs 75-140 ns a byte (1 KB 0.1 ms, 16 KB 1.2 ms, 64 KB 5 ms,
 * 10 MB 1.46 s); a round trip through a text thread and back to the loop
 * 6-35 us. At 16 KB an I/O thread is held about as long as a small text's
 * own model run, and below it the texts stay where the I/O threads (one a
 * core) tokenize them in parallel, not behind the few text threads and the
 * long texts queued there. */
#define OPENAI_INLINE_TEXT_BYTES (16 * 1024)

static size_t text_bytes(const struct input_items *it) {
    if (it->tokens) return 0;
    if (!it->list) return strlen(it->one->valuestring);
    size_t n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, it->list) n += strlen(x->valuestring);
    return n;
}

/* On a text thread. */
static void tokenize_work(struct runtime_work *w) {
    struct openai_call *c = w->arg;
    c->tok_status = tokenize_all(c, &c->items, c->tok_err, sizeof c->tok_err);
}

/* Back on the call's I/O thread. */
static void tokenized(void *arg) {
    struct openai_call *c = arg;
    cJSON_Delete(c->root);
    c->root = NULL;
    /* A drain waits for this call (runtime_work_pending) and then for its
     * texts: accepted before the drain, it is answered. */
    if (c->work.status)
        call_begin(c, STATUS_UNAVAILABLE, "the server is shutting down: the request's texts were not tokenized");
    else if (c->status) /* the client went away */
        call_begin(c, c->status, c->err);
    else call_begin(c, c->tok_status, c->tok_err);
}

/* The runtime went before tokenized ran: nothing is answered any more. */
static void tokenized_drop(void *arg) { call_free(arg); }

/* Whether a JSON string of body holds the escape \u0000: cJSON's strings
 * end at a NUL, so such a text would be cut there without a word. A
 * backslash in valid JSON only ever starts an escape, so the escapes are
 * read in turn from the start. */
static int has_nul_escape(const char *body, size_t len) {
    for (const char *p = body, *end = body + len; (p = memchr(p, '\\', (size_t)(end - p))); p += 2) {
        if (end - p < 6) return 0;
        if (p[1] == 'u' && memcmp(p + 2, "0000", 4) == 0) return 1;
    }
    return 0;
}

openai_call_t *openai_embeddings(const struct openai_env *env, const char *body, size_t len, openai_done_fn done,
                                 void *ctx) {
    char err[512];
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        answer_error(done, ctx, 400, root ? "the request body is not a JSON object"
                                          : "the request body does not parse as JSON (or nests deeper than "
                                            "cJSON's 1000 levels)", NULL, NULL);
        return NULL;
    }
    if (has_nul_escape(body, len)) {
        cJSON_Delete(root);
        answer_error(done, ctx, 400, "the request holds a NUL character (\\u0000) in a string: a text cannot "
                     "hold one", "input", NULL);
        return NULL;
    }
    const cJSON *model = NULL, *input = NULL, *fmt = NULL, *dims = NULL, *x;
    cJSON_ArrayForEach(x, root) {
        const char *k = x->string;
        if (strcmp(k, "model") == 0) model = x;
        else if (strcmp(k, "input") == 0) input = x;
        else if (strcmp(k, "encoding_format") == 0) fmt = x;
        else if (strcmp(k, "dimensions") == 0) dims = x;
        else if (strcmp(k, "user") == 0) {
            if (!cJSON_IsString(x)) {
                answer_error(done, ctx, 400, "'user' must be a string", "user", NULL);
                goto fail_root;
            }
        } else {
            snprintf(err, sizeof err, "Unrecognized request argument supplied: %.200s", k);
            answer_error(done, ctx, 400, err, k, NULL);
            goto fail_root;
        }
    }
    if (!cJSON_IsString(model) || !*model->valuestring) {
        answer_error(done, ctx, 400, model ? "'model' must be a model's name" : "'model' is required", "model", NULL);
        goto fail_root;
    }
    if (!input) {
        answer_error(done, ctx, 400, "'input' is required", "input", NULL);
        goto fail_root;
    }
    int base64 = 0;
    if (fmt && !cJSON_IsNull(fmt)) {
        if (cJSON_IsString(fmt) && strcmp(fmt->valuestring, "base64") == 0) base64 = 1;
        else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "float") != 0) {
            answer_error(done, ctx, 400, "'encoding_format' must be float or base64", "encoding_format", NULL);
            goto fail_root;
        }
    }
    int64_t ndims = 0;
    if (dims && !cJSON_IsNull(dims)) {
        if (!cJSON_IsNumber(dims) || dims->valuedouble != floor(dims->valuedouble) || dims->valuedouble < 1 ||
            dims->valuedouble > 2147483647.0) {
            answer_error(done, ctx, 400, "'dimensions' must be a positive integer", "dimensions", NULL);
            goto fail_root;
        }
        ndims = (int64_t)dims->valuedouble;
    }
    struct input_items it;
    if (read_input(input, &it, err, sizeof err)) {
        answer_error(done, ctx, 400, err, "input", NULL);
        goto fail_root;
    }
    int status = 0;
    struct repo_version *v = repository_acquire(env->repo, model->valuestring, 0, &status, err, sizeof err);
    if (!v || !v->config.embedding.enabled || !v->tokenizer) {
        snprintf(err, sizeof err, "The model '%.200s' does not exist or does not serve embeddings",
                 model->valuestring);
        repository_release(v);
        answer_error(done, ctx, 404, err, "model", "model_not_found");
        goto fail_root;
    }
    const struct model_embedding *e = &v->config.embedding;
    const struct model_config_io *out = &v->config.outputs[e->output_index];
    int64_t h = out->ndim > 0 ? out->dims[out->ndim - 1] : -1;
    if (ndims && (!e->truncate_dims || (h > 0 && ndims > h))) {
        if (!e->truncate_dims)
            snprintf(err, sizeof err, "model '%.200s' does not support 'dimensions' (its configuration's "
                     "parameters.embedding_dimensions is fixed)", model->valuestring);
        else snprintf(err, sizeof err, "'dimensions' is %lld but model '%.200s' gives %lld", (long long)ndims,
                      model->valuestring, (long long)h);
        repository_release(v);
        answer_error(done, ctx, 400, err, "dimensions", NULL);
        goto fail_root;
    }
    struct openai_call *c = calloc(1, sizeof *c + (size_t)it.n * sizeof c->texts[0]);
    if (!c || !(c->model = strdup(model->valuestring))) {
        free(c);
        repository_release(v);
        answer_error(done, ctx, 500, "out of memory", NULL, NULL);
        goto fail_root;
    }
    c->env = *env;
    c->done = done;
    c->ctx = ctx;
    c->v = v;
    c->base64 = base64;
    c->dims = ndims;
    c->n = it.n;
    struct runtime_loop *l = env->thread;
    if (text_bytes(&it) >= OPENAI_INLINE_TEXT_BYTES && runtime_text_threads(runtime_loop_runtime(l)) > 0) {
        c->root = root;
        c->items = it;
        runtime_work_init(&c->work, tokenize_work, tokenized, tokenized_drop, c);
        if ((status = runtime_work_queue(l, &c->work, err, sizeof err))) {
            answer_error(done, ctx, status_http(status), err, NULL, NULL);
            call_free(c);
            return NULL;
        }
        return c;
    }
    /* Every text tokenized before any begins: a failure to tokenize one
     * answers the call with nothing computed, and the batcher sees them
     * together. */
    int rc = tokenize_all(c, &it, err, sizeof err);
    cJSON_Delete(root);
    return call_begin(c, rc, err);
fail_root:
    cJSON_Delete(root);
    return NULL;
}

void openai_cancel(openai_call_t *c) {
    if (!c) return;
    call_fail(c, STATUS_CANCELLED, "the client went away");
    atomic_store_explicit(&c->gone, 1, memory_order_relaxed);
    for (int i = 0; i < c->n; i++)
        if (c->texts[i].r) infer_request_cancel(c->texts[i].r);
}

/* ---- /v1/models ---------------------------------------------------------------- */

static void put_model(struct buf *b, const struct repo_version *v) {
    char tail[96];
    buf_str(b, "{\"id\":");
    kserve_buf_json_string(b, v->name, strlen(v->name));
    /* created: when this version was loaded (OpenAI's is the model's creation). */
    snprintf(tail, sizeof tail, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"kiln\"}",
             (long long)v->loaded_at);
    buf_str(b, tail);
}

char *openai_models(repository_t *repo, const char *model, int *http_code, size_t *len) {
    struct repo_version **all;
    int n = repository_list(repo, &all);
    struct buf b = {0};
    int found = 0;
    if (!model) buf_str(&b, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < n; i++) {
        const struct repo_version *v = all[i];
        int newest = 1; /* one entry per model: its newest version */
        for (int j = 0; j < n; j++)
            if (j != i && strcmp(all[j]->name, v->name) == 0 && all[j]->version > v->version) newest = 0;
        if (!newest || !v->config.embedding.enabled || !v->tokenizer) continue;
        if (model && strcmp(model, v->name)) continue;
        if (found++ && !model) buf_add(&b, ",", 1);
        put_model(&b, v);
    }
    if (!model) buf_str(&b, "]}");
    for (int i = 0; i < n; i++) repository_release(all[i]);
    free(all);
    if (model && !found) {
        buf_free(&b);
        char msg[300];
        snprintf(msg, sizeof msg, "The model '%.200s' does not exist or does not serve embeddings", model);
        *http_code = 404;
        return openai_error_body(404, msg, "model", "model_not_found", len);
    }
    *http_code = b.data ? 200 : 500;
    if (!b.data) return openai_error_body(500, "out of memory", NULL, NULL, len);
    *len = b.len;
    return b.data;
}
