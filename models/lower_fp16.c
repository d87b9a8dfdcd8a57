/* lower_fp16.c - FP16 and BF16 models on kiln's FP32 engine.
 *
 * GPU models ship as FP16 files (onnxconverter_common's float16, or
 * keep_io_types with Casts inside). The CPU kernels compute in FP32, so such a
 * graph is lowered once at load: FP16/BF16 constants become FP32, Casts and
 * dtype attributes that name FP16/BF16 name FP32, and the graph's own FP16
 * inputs and outputs keep their type through one Cast at each: clients send
 * and receive FP16 as the file says. The arithmetic is FP32 (FP16 storage,
 * FP32 math), at least as accurate as the file's FP16. The CUDA backend's
 * "precision": "fp16" runs such a model in FP16 again. */
#include "models/lower_fp16.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/ops.h"

/* ONNX TensorProto data types. */
enum { ONNX_FLOAT = 1, ONNX_FLOAT16 = 10, ONNX_BFLOAT16 = 16 };

static int half(enum dtype dt) { return dt == DT_FP16 || dt == DT_BF16; }

/* A constant FP16/BF16 tensor to FP32, in place (new data). */
static int widen_tensor(struct tensor *t) {
    if (!half(t->dtype)) return 0;
    int64_t n = tensor_numel(t);
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof *f);
    if (!f) return STATUS_NOMEM;
    const uint16_t *h = t->data;
    for (int64_t i = 0; h && i < n; i++) f[i] = t->dtype == DT_FP16 ? fp16_to_fp32(h[i]) : bf16_to_fp32(h[i]);
    tensor_free_data(t);
    t->dtype = DT_FP32;
    t->data = f;
    return 0;
}

/* Attributes that name a data type or hold a tensor. */
static int lower_attrs(struct graph_node *n) {
    for (int a = 0; a < n->nattr; a++) {
        struct graph_attr *at = &n->attrs[a];
        if (at->type == ATTR_INT && (at->i == ONNX_FLOAT16 || at->i == ONNX_BFLOAT16) &&
            (strcmp(at->name, "to") == 0 || strcmp(at->name, "dtype") == 0 || strcmp(at->name, "output_dtype") == 0))
            at->i = ONNX_FLOAT;
        if (at->type == ATTR_TENSOR && at->t && half(at->t->dtype)) {
            int rc = widen_tensor(at->t);
            if (rc) return rc;
        }
    }
    return 0;
}

/* Adds Cast(v -> to) into a new value named after v; returns its index. */
static int add_cast(struct graph *g, int from, int to_value, int onnx_to, const char *name) {
    int idx = graph_add_node(g, name, "Cast", "", &from, 1, &to_value, 1);
    if (idx < 0) return -1;
    struct graph_node *n = &g->nodes[idx];
    n->opset = (int)g->opset_default;
    n->attrs = calloc(1, sizeof *n->attrs);
    if (!n->attrs) return -1;
    n->attrs[0].name = strdup("to");
    n->attrs[0].type = ATTR_INT;
    n->attrs[0].i = onnx_to;
    n->nattr = 1;
    n->op = op_find("", "Cast");
    return n->attrs[0].name && n->op ? idx : -1;
}

/* A fresh value name from base and a suffix. */
static int new_value(struct graph *g, const char *base, const char *suffix) {
    char name[512];
    snprintf(name, sizeof name, "%s%s", base, suffix);
    return graph_new_value(g, name);
}

/* A graph input of FP16/BF16: its readers read an FP32 copy. */
static int lower_input(struct graph *g, int v) {
    int nn = g->nnodes;
    int w = new_value(g, g->values[v].name, "/fp32");
    if (w < 0) return STATUS_NOMEM;
    for (int i = 0; i < nn; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (g->nodes[i].in[k] == v) g->nodes[i].in[k] = w;
    for (int o = 0; o < g->noutputs; o++)
        if (g->outputs[o] == v) return 0; /* an input that is also an output stays as it is */
    char name[512];
    snprintf(name, sizeof name, "%s/to_fp32", g->values[v].name);
    return add_cast(g, v, w, ONNX_FLOAT, name) < 0 ? STATUS_NOMEM : 0;
}

/* A graph output of FP16/BF16: computed in FP32, cast back at the end. */
static int lower_output(struct graph *g, int v, int onnx_type) {
    if (g->values[v].flags & VALUE_INPUT || g->values[v].t.data) return 0;
    int w = new_value(g, g->values[v].name, "/fp32");
    if (w < 0) return STATUS_NOMEM;
    for (int i = 0; i < g->nnodes; i++) {
        for (int k = 0; k < g->nodes[i].nout; k++)
            if (g->nodes[i].out[k] == v) g->nodes[i].out[k] = w;
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (g->nodes[i].in[k] == v) g->nodes[i].in[k] = w;
    }
    char name[512];
    snprintf(name, sizeof name, "%s/to_half", g->values[v].name);
    return add_cast(g, w, v, onnx_type, name) < 0 ? STATUS_NOMEM : 0;
}

int lower_fp16(struct graph *g, char *err, size_t err_len) {
    int any = 0, rc = 0;
    for (int v = 0; v < g->nvalues; v++) any |= half(g->values[v].t.dtype);
    for (int i = 0; i < g->nnodes && !any; i++)
        for (int a = 0; a < g->nodes[i].nattr; a++) {
            const struct graph_attr *at = &g->nodes[i].attrs[a];
            any |= (at->type == ATTR_INT && strcmp(at->name, "to") == 0 &&
                    (at->i == ONNX_FLOAT16 || at->i == ONNX_BFLOAT16)) ||
                   (at->type == ATTR_TENSOR && at->t && half(at->t->dtype));
        }
    if (!any) return 0;
    int nodes = g->nnodes; /* the file's: the Casts added below keep their targets */
    /* Outputs first (their Casts read the FP32 values), then inputs. */
    for (int o = 0; o < g->noutputs && !rc; o++) {
        struct graph_value *val = &g->values[g->outputs[o]];
        if (half(val->t.dtype)) rc = lower_output(g, g->outputs[o], val->t.dtype == DT_FP16 ? ONNX_FLOAT16 : ONNX_BFLOAT16);
    }
    for (int i = 0; i < g->ninputs && !rc; i++)
        if (half(g->values[g->inputs[i]].t.dtype)) rc = lower_input(g, g->inputs[i]);
    for (int v = 0; v < g->nvalues && !rc; v++) {
        struct graph_value *val = &g->values[v];
        if (val->t.data) rc = widen_tensor(&val->t);
        else if (half(val->t.dtype) && !(val->flags & (VALUE_INPUT | VALUE_OUTPUT))) val->t.dtype = DT_FP32;
    }
    for (int i = 0; i < nodes && !rc; i++) rc = lower_attrs(&g->nodes[i]);
    if (!rc) rc = graph_toposort(g, err, err_len);
    else status_set(err, err_len, rc, "out of memory lowering the FP16 model to FP32");
    return rc;
}
