/* harness.h - the kernel tests' kit: a node built in place with its
 * attributes, and one call that runs an operator the way a plan does.
 *
 * Included by tests/kernels/test_ops_*.c after <cmocka.h>; everything here is
 * static (functions inline, so a test need not use them all), one copy per
 * test program. */
#ifndef KILN_TEST_HARNESS_H
#define KILN_TEST_HARNESS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"

#define TN_MAX_ATTRS 24
#define TN_MAX_VALUES 32 /* elements of one ints/floats attribute */

/* A node with room for its attributes; ints and floats are copied in, so
 * the arrays given to tn_ints/tn_floats may go out of scope. */
struct tnode {
    struct graph_node n;
    struct graph_attr a[TN_MAX_ATTRS];
    int64_t ints[TN_MAX_ATTRS][TN_MAX_VALUES];
    float floats[TN_MAX_ATTRS][TN_MAX_VALUES];
};

/* Message of the last failing call (op_error's text). */
static char g_err[512];

/* Inputs whose bit is set here reach infer() and prepare() without data, as
 * values computed at run time do; run() sees them. */
static unsigned g_runtime_inputs;

/* Set by a test program whose ops decode their attributes at prepare
 * (kernels/ops.h): run() then gets the node without its attributes, so a
 * lookup by name left in a run path reads the default and fails the test. */
static int g_run_without_attrs;

/* Uniform floats in [-1, 1] from a fixed xorshift seed: a test sees the
 * same inputs on every run. */
static uint64_t g_tn_rng = 0x9e3779b97f4a7c15ull;
static inline float tn_frand(void) {
    g_tn_rng ^= g_tn_rng << 13;
    g_tn_rng ^= g_tn_rng >> 7;
    g_tn_rng ^= g_tn_rng << 17;
    return (float)((g_tn_rng >> 11) % 2000001) / 1000000.0f - 1.0f;
}

/* A float32 tensor of the given shape filled by tn_frand; the caller
 * frees its data. */
static inline struct tensor tn_rand_f32(int ndim, const int64_t *dims) {
    struct tensor t = {DT_FP32, ndim, {0}, NULL};
    for (int i = 0; i < ndim; i++) t.dims[i] = dims[i];
    int64_t n = tensor_numel(&t);
    t.data = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) ((float *)t.data)[i] = tn_frand();
    return t;
}

static inline void tn_init_domain(struct tnode *t, const char *domain, const char *op, int opset) {
    memset(t, 0, sizeof *t);
    t->n.name = "n0";
    t->n.op_type = (char *)op;
    t->n.domain = (char *)domain;
    t->n.opset = opset;
    t->n.attrs = t->a;
}
static inline void tn_init(struct tnode *t, const char *op, int opset) { tn_init_domain(t, "", op, opset); }

static inline struct graph_attr *tn_add(struct tnode *t, const char *name, enum attr_type ty) {
    if (t->n.nattr >= TN_MAX_ATTRS) fail_msg("node %s: more than %d attributes", t->n.op_type, TN_MAX_ATTRS);
    struct graph_attr *a = &t->a[t->n.nattr++];
    a->name = (char *)name;
    a->type = ty;
    return a;
}
static inline void tn_int(struct tnode *t, const char *name, int64_t v) { tn_add(t, name, ATTR_INT)->i = v; }
static inline void tn_float(struct tnode *t, const char *name, float v) { tn_add(t, name, ATTR_FLOAT)->f = v; }
static inline void tn_str(struct tnode *t, const char *name, const char *v) {
    struct graph_attr *a = tn_add(t, name, ATTR_STRING);
    a->s = (char *)v;
    a->s_len = strlen(v);
}
static inline void tn_ints(struct tnode *t, const char *name, int n, const int64_t *v) {
    if (n > TN_MAX_VALUES) fail_msg("attribute %s: %d values, room for %d", name, n, TN_MAX_VALUES);
    int k = t->n.nattr;
    struct graph_attr *a = tn_add(t, name, ATTR_INTS);
    memcpy(t->ints[k], v, sizeof(int64_t) * (size_t)n);
    a->ints = t->ints[k];
    a->n = n;
}
static inline void tn_floats(struct tnode *t, const char *name, int n, const float *v) {
    if (n > TN_MAX_VALUES) fail_msg("attribute %s: %d values, room for %d", name, n, TN_MAX_VALUES);
    int k = t->n.nattr;
    struct graph_attr *a = tn_add(t, name, ATTR_FLOATS);
    memcpy(t->floats[k], v, sizeof(float) * (size_t)n);
    a->floats = t->floats[k];
    a->n = n;
}
/* A string literal as a DT_STRING element (an initializer), every byte of
 * it: TN_STR("a\0b") is three bytes. */
#define TN_STR(lit) {(lit), sizeof(lit) - 1}
/* Element e holds exactly the bytes of the C string want (cmocka's assert). */
static inline int tn_str_is(struct tensor_str e, const char *want) { return tensor_str_eq(e, tensor_str_of(want)); }
#define assert_tstr(e, want) assert_true(tn_str_is((e), (want)))

/* The strings are referenced, not copied: v must outlive the node. */
static inline void tn_strs(struct tnode *t, const char *name, int n, char **v) {
    struct graph_attr *a = tn_add(t, name, ATTR_STRINGS);
    a->strings = v;
    a->n = n;
}
/* The same with each string's length (ONNX's attribute strings are
 * counted bytes: a NUL may be one of them); lens must outlive the node. */
static inline void tn_strs_len(struct tnode *t, const char *name, int n, char **v, size_t *lens) {
    tn_strs(t, name, n, v);
    t->n.attrs[t->n.nattr - 1].lens = lens;
}

/* The string pool of tn_call (kernels/ops.h): the strings a kernel made
 * stay readable until the next tn_call. */
static struct op_strpool *g_tn_strings;

/* Runs node n as a plan does: infer, allocate the outputs (zeroed; NULL
 * entries are absent optional outputs), prepare with 64-byte aligned
 * scratch, run, release. Returns the first failing status with g_err set;
 * the outputs stay allocated (the caller frees their data). */
static inline int tn_call(const struct graph_node *n, const struct tensor *const *in, int nin, struct tensor *const *out,
                   int nout, int nthreads) {
    const struct op_def *d = op_find(n->domain, n->op_type);
    assert_non_null(d);
    struct op_call c;
    op_call_init(&c, n, nthreads, g_err, sizeof g_err);
    c.nin = nin;
    c.nout = nout;
    g_err[0] = 0;
    if (!g_tn_strings) g_tn_strings = op_strpool_create();
    op_strpool_reset(g_tn_strings);
    c.strings = g_tn_strings;
    struct tensor hidden[OP_MAX_IO];
    for (int i = 0; i < nin; i++) {
        c.in[i] = in[i];
        if (in[i] && (g_runtime_inputs >> i & 1)) {
            hidden[i] = *in[i];
            hidden[i].data = NULL;
            c.in[i] = &hidden[i];
        }
    }
    for (int i = 0; i < nout; i++) c.out[i] = out[i];
    int rc = d->infer(&c);
    if (rc) return rc;
    for (int i = 0; i < nout; i++)
        if (out[i]) out[i]->data = calloc(1, tensor_nbytes(out[i]) + 1);
    void *state = NULL;
    size_t scratch = 0;
    if (d->prepare && (rc = d->prepare(&c, &state, &scratch))) return rc;
    for (int i = 0; i < nin; i++) c.in[i] = in[i];
    struct graph_node bare = *n;
    bare.nattr = 0;
    if (g_run_without_attrs) c.node = &bare;
    c.state = state;
    c.scratch = scratch ? aligned_alloc(64, (scratch + 63) & ~(size_t)63) : NULL;
    c.scratch_size = scratch;
    rc = d->run(&c);
    free(c.scratch);
    if (d->release) d->release(state);
    return rc;
}

/* Runs n as tn_call does and expects a failure whose message contains
 * want; frees whatever outputs the call allocated. */
static inline void tn_expect_error(const struct graph_node *n, const struct tensor *const *in, int nin,
                                   struct tensor *const *out, int nout, const char *want) {
    for (int i = 0; i < nout; i++)
        if (out[i]) out[i]->data = NULL;
    if (tn_call(n, in, nin, out, nout, 1) == 0) fail_msg("%s: succeeded, expected an error with \"%s\"", n->op_type, want);
    if (!strstr(g_err, want)) fail_msg("%s: error \"%s\" does not say \"%s\"", n->op_type, g_err, want);
    for (int i = 0; i < nout; i++)
        if (out[i]) {
            free(out[i]->data);
            out[i]->data = NULL;
        }
}

#endif
