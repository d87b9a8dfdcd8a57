/* model_tokenizer.c - a tokenizer as a model: one node from TEXT (and
 * TEXT_PAIR) to input_ids, attention_mask and token_type_ids.
 *
 * The graph is made here rather than read from an ONNX file: its inputs are
 * strings (one text per row), its outputs INT64 [rows, longest], padded
 * with the tokenizer.json's pad id (type id, side) and a 0 mask. A batch of
 * requests is one run, so its rows are padded to the batch's longest text
 * (what a model behind it, taking the outputs as they are, then runs on). */
#include "models/model_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/file.h"
#include "common/status.h"
#include "graph/graph.h"

static const char *const out_names[MODEL_TOKENIZER_NOUT] = {"input_ids", "attention_mask", "token_type_ids"};

static int add_value(struct graph *g, const char *name, enum dtype dt, int ndim, unsigned flags) {
    int v = graph_intern_value(g, name);
    if (v < 0) return -1;
    struct graph_value *gv = &g->values[v];
    gv->t.dtype = dt;
    gv->t.ndim = ndim;
    for (int d = 0; d < ndim; d++) gv->t.dims[d] = d == 1 && dt == DT_STRING ? 1 : -1;
    gv->flags |= flags;
    return v;
}

struct graph *model_tokenizer_graph(int pair, int batched) {
    struct graph *g = graph_create();
    if (!g) return NULL;
    int in[2], out[MODEL_TOKENIZER_NOUT], nin = pair ? 2 : 1;
    g->inputs = calloc(2, sizeof *g->inputs);
    g->outputs = calloc(MODEL_TOKENIZER_NOUT, sizeof *g->outputs);
    if (!g->inputs || !g->outputs) goto fail;
    for (int i = 0; i < nin; i++) {
        if ((in[i] = add_value(g, i ? "TEXT_PAIR" : "TEXT", DT_STRING, batched ? 2 : 1, VALUE_INPUT)) < 0) goto fail;
        g->inputs[g->ninputs++] = in[i];
    }
    for (int o = 0; o < MODEL_TOKENIZER_NOUT; o++) {
        if ((out[o] = add_value(g, out_names[o], DT_INT64, 2, VALUE_OUTPUT)) < 0) goto fail;
        g->outputs[g->noutputs++] = out[o];
    }
    if (graph_add_node(g, "tokenizer", "Tokenizer", "kiln", in, nin, out, MODEL_TOKENIZER_NOUT) < 0) goto fail;
    g->opset_default = 20;
    return g;
fail:
    graph_free(g);
    return NULL;
}

struct tokenizer *model_tokenizer_load(const char *path, int64_t max_length, char *err, size_t err_len) {
    char *json = NULL;
    size_t len = 0;
    if (file_read_regular(path, (int64_t)1 << 30, &json, &len, err, err_len)) return NULL;
    /* Messages name the file, not the server's path to it. */
    const char *base = strrchr(path, '/');
    struct tokenizer_params tp = {.json = json, .len = len, .name = base ? base + 1 : path, .max_length = max_length};
    struct tokenizer *t = tokenizer_load(&tp, err, err_len);
    free(json);
    return t;
}

int model_tokenizer_check(const struct tensor *t, const char *name, char *err, size_t err_len) {
    if (t->dtype != DT_STRING || !t->data) return 0;
    const struct tensor_str *s = tensor_strs(t);
    for (int64_t r = 0, n = tensor_numel(t); r < n; r++)
        if (!tokenizer_utf8_valid(s[r].p, s[r].len))
            return status_set(err, err_len, STATUS_INVALID, "input '%s' row %lld: the text is not valid UTF-8", name,
                              (long long)r);
    return 0;
}

/* Row r's text of input t. */
static struct tensor_str text_of(const struct tensor *t, int64_t r) { return tensor_strs(t)[r]; }

int model_tokenizer_run(const struct tokenizer *tok, const struct tensor *inputs, int ninputs, struct tensor *outputs,
                        size_t max_bytes, char *err, size_t err_len) {
    const struct tensor *a = &inputs[0], *b = ninputs > 1 ? &inputs[1] : NULL;
    int64_t rows = tensor_numel(a);
    if (b && tensor_numel(b) != rows)
        return status_set(err, err_len, STATUS_INVALID, "input 'TEXT_PAIR' has %lld texts, 'TEXT' %lld: a pair "
                          "needs one of each", (long long)tensor_numel(b), (long long)rows);
    struct tokenizer_encoding *enc = calloc((size_t)(rows ? rows : 1), sizeof *enc);
    if (!enc) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    int64_t longest = 0;
    int rc = 0;
    for (int64_t r = 0; r < rows && !rc; r++) {
        struct tensor_str s = text_of(a, r), p = b ? text_of(b, r) : (struct tensor_str){0};
        char e2[400];
        rc = tokenizer_encode(tok, s.p, s.len, b ? p.p : NULL, p.len, &enc[r], e2, sizeof e2);
        if (rc) status_set(err, err_len, rc, "input 'TEXT'%s row %lld: %s", b ? " with 'TEXT_PAIR'" : "", (long long)r, e2);
        else if ((int64_t)enc[r].n > longest) longest = (int64_t)enc[r].n;
    }
    /* Three [rows, longest] INT64 outputs: within the request's budget. */
    size_t need = (size_t)rows * (size_t)longest * sizeof(int64_t) * MODEL_TOKENIZER_NOUT;
    if (!rc && max_bytes && need > max_bytes)
        rc = status_set(err, err_len, STATUS_INVALID, "the tokenizer's outputs for %lld texts of up to %lld tokens "
                        "need %zu bytes, over the request memory bound of %zu bytes", (long long)rows,
                        (long long)longest, need, max_bytes);
    for (int o = 0; o < MODEL_TOKENIZER_NOUT && !rc; o++) {
        outputs[o] = (struct tensor){.dtype = DT_INT64, .ndim = 2, .dims = {rows, longest}};
        if (tensor_alloc_data(&outputs[o])) rc = status_set(err, err_len, STATUS_NOMEM, "out of memory");
    }
    if (!rc) {
        int64_t pad_id, pad_type;
        int left;
        tokenizer_pad(tok, &pad_id, &pad_type, &left);
        int64_t *ids = outputs[0].data, *mask = outputs[1].data, *types = outputs[2].data;
        for (int64_t r = 0; r < rows; r++) {
            int64_t n = (int64_t)enc[r].n, at = left ? longest - n : 0;
            int64_t *ri = ids + r * longest, *rm = mask + r * longest, *rt = types + r * longest;
            for (int64_t j = 0; j < longest; j++) {
                int in = j >= at && j < at + n;
                ri[j] = in ? enc[r].ids[j - at] : pad_id;
                rm[j] = in;
                rt[j] = in ? enc[r].type_ids[j - at] : pad_type;
            }
        }
    } else
        for (int o = 0; o < MODEL_TOKENIZER_NOUT; o++) tensor_free_data(&outputs[o]);
    for (int64_t r = 0; r < rows; r++) tokenizer_encoding_free(&enc[r]);
    free(enc);
    return rc;
}
