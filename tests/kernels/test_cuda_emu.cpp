/* test_cuda_emu.cpp - op consistency of the CUDA backend against the CPU
 * backend (kiln's reference), one table of cases over every custom kernel.
 *
 * Built twice from this one source:
 *  - build/tests/kernels/test_cuda_emu: kernels and dispatcher compiled as
 *    host C++ under the emulation harness (kernels/cuda/emu), runs anywhere,
 *    part of `make unit`;
 *  - build/tests/kernels/test_cuda_gpu (CUDA=1): the real kernels through the
 *    real backend (libkiln_cuda's vtable: cuBLASLt and cuDNN ops included),
 *    run by tools/gpu_check.sh on a machine with a GPU.
 * Each case builds a node, random inputs (odd sizes, broadcasting, large and
 * tiny), runs the CPU op (op_find(...)->infer/prepare/run) and the CUDA path
 * on the same inputs, and compares with the case's tolerance. Parameter
 * inputs (Slice starts, Pad pads, axes...) are host memory at prepare time
 * and device memory at run time, as in a plan. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

extern "C" {
#include <cmocka.h>
}

#include "kernels/cuda/dispatch.h"

#include <dirent.h>
#include <sys/stat.h>

extern "C" {
#include "kernels/backend.h"
#include "models/model.h"
#include "models/onnx_load.h"
}

#ifndef KILN_CUDA_EMU
extern "C" struct backend *kiln_cuda_backend_create(const struct backend_params *p, char *why, size_t why_len);
extern "C" int kiln_cuda_probe(char *why, size_t why_len);
static struct backend *g_be;
#endif

/* ---- case description ------------------------------------------------------ */

enum gen { G_UNIFORM, G_POS, G_NONZERO, G_INT, G_BOOL, G_VALUES, G_SMALLINT, G_ABSENT };

struct tin {
    enum dtype dt;
    std::vector<int64_t> shape;
    enum gen g;
    std::vector<double> vals; /* G_VALUES; G_INT: {lo, hi} */
    bool param;               /* constant at plan time */
};

struct tattr {
    std::string name;
    int type; /* ATTR_INT, ATTR_FLOAT, ATTR_STRING, ATTR_INTS */
    int64_t i;
    float f;
    std::string s;
    std::vector<int64_t> ints;
};

static tattr ai(const char *n, int64_t v) { return tattr{n, ATTR_INT, v, 0, "", {}}; }
static tattr af(const char *n, float v) { return tattr{n, ATTR_FLOAT, 0, v, "", {}}; }
static tattr as(const char *n, const char *v) { return tattr{n, ATTR_STRING, 0, 0, v, {}}; }
static tattr ais(const char *n, std::vector<int64_t> v) { return tattr{n, ATTR_INTS, 0, 0, "", v}; }

struct tcase {
    const char *op;
    std::vector<tin> in;
    std::vector<tattr> attrs;
    int nout;
    int opset;
    double atol, rtol;
    int act;      /* fused activation (only for ops that declare OP_FUSE_ACT on the CPU) */
    bool fp16;    /* run the CUDA side in FP16 (float inputs converted), CPU in FP32 */
};

static tin F(std::vector<int64_t> s, enum gen g = G_UNIFORM) { return tin{DT_FP32, s, g, {}, false}; }
static tin T(enum dtype dt, std::vector<int64_t> s, enum gen g = G_UNIFORM, std::vector<double> v = {}) {
    return tin{dt, s, g, v, false};
}
static tin P(enum dtype dt, std::vector<double> v) { /* a 1-D constant parameter */
    return tin{dt, {(int64_t)v.size()}, G_VALUES, v, true};
}
static tin PS(enum dtype dt, double v) { return tin{dt, {}, G_VALUES, {v}, true}; } /* scalar parameter */
static tin ABSENT() { return tin{DT_UNDEFINED, {}, G_ABSENT, {}, false}; }

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t g_seed = 12345;
static double rnd(void) {
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_seed >> 11) / 9007199254740992.0;
}

static void set_elem(struct tensor *t, int64_t i, double v) {
    switch (t->dtype) {
    case DT_FP32: ((float *)t->data)[i] = (float)v; break;
    case DT_FP64: ((double *)t->data)[i] = v; break;
    case DT_FP16: ((uint16_t *)t->data)[i] = fp32_to_fp16((float)v); break;
    case DT_INT64: ((int64_t *)t->data)[i] = (int64_t)v; break;
    case DT_INT32: ((int32_t *)t->data)[i] = (int32_t)v; break;
    case DT_INT8: ((int8_t *)t->data)[i] = (int8_t)v; break;
    case DT_UINT8:
    case DT_BOOL: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
    default: break;
    }
}

static struct tensor make(const tin &d) {
    struct tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = d.dt;
    t.ndim = (int)d.shape.size();
    for (int i = 0; i < t.ndim; i++) t.dims[i] = d.shape[(size_t)i];
    int64_t n = tensor_numel(&t);
    t.data = calloc((size_t)(n ? n : 1), dtype_size(d.dt) ? dtype_size(d.dt) : 1);
    for (int64_t i = 0; i < n; i++) {
        double v = 0;
        switch (d.g) {
        case G_UNIFORM: v = rnd() * 4 - 2; break;
        case G_POS: v = 0.1 + rnd() * 3; break;
        case G_NONZERO: v = (rnd() < 0.5 ? -1 : 1) * (0.5 + rnd() * 2); break;
        case G_INT: v = floor(d.vals[0] + rnd() * (d.vals[1] - d.vals[0] + 1)); break;
        case G_SMALLINT: v = floor(rnd() * 5) - 2; break;
        case G_BOOL: v = rnd() < 0.5; break;
        case G_VALUES: v = d.vals[(size_t)i % d.vals.size()]; break;
        case G_ABSENT: break;
        }
        set_elem(&t, i, v);
    }
    return t;
}

/* A node owning its attributes. */
struct tnode {
    struct graph_node n;
    std::vector<struct graph_attr> attrs;
    std::vector<std::vector<int64_t>> ints;
    std::vector<std::string> strs;
};

static void build_node(tnode *tn, const tcase &tc) {
    memset(&tn->n, 0, sizeof tn->n);
    tn->ints.reserve(tc.attrs.size());
    tn->strs.reserve(tc.attrs.size());
    for (const tattr &a : tc.attrs) {
        struct graph_attr g;
        memset(&g, 0, sizeof g);
        g.name = (char *)a.name.c_str();
        g.type = (enum attr_type)a.type;
        g.i = a.i;
        g.f = a.f;
        if (a.type == ATTR_STRING) {
            tn->strs.push_back(a.s);
            g.s = (char *)tn->strs.back().c_str();
            g.s_len = a.s.size();
        }
        if (a.type == ATTR_INTS) {
            tn->ints.push_back(a.ints);
            g.n = (int)a.ints.size();
            g.ints = tn->ints.back().data();
        }
        tn->attrs.push_back(g);
    }
    tn->n.name = (char *)"test_node";
    tn->n.op_type = (char *)tc.op;
    tn->n.domain = (char *)"";
    tn->n.opset = tc.opset ? tc.opset : 17;
    tn->n.attrs = tn->attrs.data();
    tn->n.nattr = (int)tn->attrs.size();
    tn->n.op = op_find("", tc.op);
    tn->n.act = (enum act_kind)tc.act;
}

static void free_tensors(std::vector<struct tensor> &v) {
    for (auto &t : v) free(t.data);
}

static double elem(const struct tensor *t, int64_t i) { return op_double_at(t, i); }

/* ---- the device side ---------------------------------------------------------- */

static void *dev_upload(const struct tensor *t) {
    size_t nb = tensor_nbytes(t);
    void *d = NULL;
    if (cudaMalloc(&d, nb ? nb : 16) != cudaSuccess) return NULL;
    if (nb) cudaMemcpy(d, t->data, nb, cudaMemcpyHostToDevice);
    return d;
}

/* Runs the node on the CUDA side; out[] have shapes (host buffers receive
 * the results). Returns 0, or -1 with msg set (unsupported: 1). */
static int run_cuda(const tcase &tc, const struct graph_node *node, std::vector<struct tensor> &in,
                    std::vector<bool> &absent, std::vector<struct tensor> &out, char *msg, size_t msg_len) {
    struct op_call c;
    op_call_init(&c, node, 1, msg, msg_len);
    c.nin = (int)in.size();
    c.nout = (int)out.size();
    /* Plan time: parameters on the host, other inputs without data. */
    std::vector<struct tensor> pin(in.size()), dout(out.size());
    for (size_t k = 0; k < in.size(); k++) {
        pin[k] = in[k];
        if (!tc.in[k].param) pin[k].data = NULL;
        c.in[k] = absent[k] ? NULL : &pin[k];
    }
    for (size_t k = 0; k < out.size(); k++) {
        dout[k] = out[k];
        dout[k].data = NULL;
        c.out[k] = &dout[k];
    }
    void *state = NULL;
    size_t ws = 0;
#ifdef KILN_CUDA_EMU
    if (!kd_supports(&c, msg, msg_len)) return 1;
    if (kd_prepare(&c, &state)) return -1;
#else
    if (!g_be->iface->supports_op(g_be, &c)) {
        snprintf(msg, msg_len, "supports_op said no");
        return 1;
    }
    if (g_be->iface->prepare_node(g_be, &c, &state, &ws)) return -1;
#endif
    std::vector<void *> dptr;
    for (size_t k = 0; k < in.size(); k++) {
        if (absent[k]) continue;
        void *d = dev_upload(&in[k]);
        dptr.push_back(d);
        pin[k].data = d;
    }
    for (size_t k = 0; k < out.size(); k++) {
        void *d = NULL;
        cudaMalloc(&d, tensor_nbytes(&out[k]) ? tensor_nbytes(&out[k]) : 16);
        cudaMemsetAsync(d, 0xCD, tensor_nbytes(&out[k])); /* garbage where nothing is written */
        dptr.push_back(d);
        dout[k].data = d;
    }
    void *scratch = NULL;
    if (ws) cudaMalloc(&scratch, ws);
    c.state = state;
    c.scratch = scratch;
    c.scratch_size = ws;
    int rc;
#ifdef KILN_CUDA_EMU
    rc = kd_run(&c, state, 0);
    kd_release(state);
#else
    rc = g_be->iface->run_node(g_be, &c);
    if (!rc) rc = g_be->iface->synchronize(g_be);
    g_be->iface->release_node(g_be, node, state);
#endif
    cudaError_t e = cudaDeviceSynchronize();
    if (!rc && e != cudaSuccess) {
        snprintf(msg, msg_len, "CUDA error: %s", cudaGetErrorString(e));
        rc = -1;
    }
    for (size_t k = 0; k < out.size() && !rc; k++)
        cudaMemcpy(out[k].data, dout[k].data, tensor_nbytes(&out[k]), cudaMemcpyDeviceToHost);
    for (void *d : dptr) cudaFree(d);
    cudaFree(scratch);
    (void)tc;
    return rc ? -1 : 0;
}

/* ---- one case ------------------------------------------------------------------ */

static int g_skipped;

/* Returns 1 if the case passed. */
static int run_case(const tcase &tc, int index) {
    char msg[512] = "";
    tnode tn;
    build_node(&tn, tc);
    const struct op_def *cpu = op_find("", tc.op);
    if (!cpu || !cpu->run || !cpu->infer) {
        print_message("  skip %s: no CPU op to compare with\n", tc.op);
        g_skipped++;
        return 1;
    }
    std::vector<struct tensor> in, out((size_t)tc.nout);
    std::vector<bool> absent;
    for (const tin &d : tc.in) {
        in.push_back(make(d));
        absent.push_back(d.g == G_ABSENT);
    }
    /* CPU reference (FP32 even for FP16 cases, on the FP16-rounded values). */
    if (tc.fp16)
        for (auto &t : in)
            if (t.dtype == DT_FP32)
                for (int64_t i = 0; i < tensor_numel(&t); i++)
                    ((float *)t.data)[i] = fp16_to_fp32(fp32_to_fp16(((float *)t.data)[i]));
    struct op_call c;
    op_call_init(&c, &tn.n, 1, msg, sizeof msg);
    c.nin = (int)in.size();
    c.nout = tc.nout;
    for (size_t k = 0; k < in.size(); k++) c.in[k] = absent[k] ? NULL : &in[k];
    for (size_t k = 0; k < out.size(); k++) {
        memset(&out[k], 0, sizeof out[k]);
        c.out[k] = &out[k];
    }
    /* infer may need param values: give it every input's data, like folding. */
    int ok = 0;
    void *st = NULL;
    size_t scratch = 0;
    std::vector<struct tensor> got;
    if (cpu->infer(&c)) {
        print_error("case %d %s: CPU infer failed: %s\n", index, tc.op, msg);
        goto done;
    }
    for (auto &t : out) t.data = calloc((size_t)(tensor_nbytes(&t) ? tensor_nbytes(&t) : 1), 1);
    if (cpu->prepare && cpu->prepare(&c, &st, &scratch)) {
        print_error("case %d %s: CPU prepare failed: %s\n", index, tc.op, msg);
        goto done;
    }
    c.state = st;
    c.scratch = scratch ? aligned_alloc(64, (scratch + 63) / 64 * 64) : NULL;
    c.scratch_size = scratch;
    if (cpu->run(&c)) {
        print_error("case %d %s: CPU run failed: %s\n", index, tc.op, msg);
        free(c.scratch);
        if (cpu->release) cpu->release(st);
        goto done;
    }
    free(c.scratch);
    if (cpu->release) cpu->release(st);
    {
        /* The CUDA side, possibly in FP16. */
        std::vector<struct tensor> din = in;
        std::vector<void *> owned;
        for (size_t k = 0; k < din.size(); k++) {
            if (!tc.fp16 || din[k].dtype != DT_FP32 || absent[k]) continue;
            int64_t n = tensor_numel(&din[k]);
            uint16_t *h = (uint16_t *)malloc((size_t)(n ? n : 1) * 2);
            for (int64_t i = 0; i < n; i++) h[i] = fp32_to_fp16(((float *)in[k].data)[i]);
            din[k].dtype = DT_FP16;
            din[k].data = h;
            owned.push_back(h);
        }
        for (auto &t : out) {
            struct tensor g = t;
            if (tc.fp16 && g.dtype == DT_FP32) g.dtype = DT_FP16;
            g.data = calloc((size_t)(tensor_nbytes(&g) ? tensor_nbytes(&g) : 1), 1);
            got.push_back(g);
        }
        char cmsg[512] = "";
        int rc = run_cuda(tc, &tn.n, din, absent, got, cmsg, sizeof cmsg);
        for (void *p : owned) free(p);
        if (rc) {
            print_error("case %d %s: CUDA side %s: %s\n", index, tc.op, rc > 0 ? "unsupported" : "failed", cmsg);
            goto done;
        }
    }
    ok = 1;
    for (size_t k = 0; k < out.size() && ok; k++) {
        int64_t n = tensor_numel(&out[k]);
        double worst = 0;
        int64_t wi = -1;
        for (int64_t i = 0; i < n; i++) {
            double e = elem(&out[k], i), g = elem(&got[k], i);
            if (isnan(e) && isnan(g)) continue;
            if (isinf(e) && e == g) continue;
            double err = fabs(e - g), lim = tc.atol + tc.rtol * fabs(e);
            if (!(err <= lim) && (wi < 0 || err - lim > worst)) {
                worst = err - lim;
                wi = i;
            }
        }
        if (wi >= 0) {
            char sh[128];
            print_error("case %d %s output %zu %s: element %lld is %.9g, CPU says %.9g (atol %g rtol %g)\n", index,
                        tc.op, k, tensor_shape_str(&out[k], sh, sizeof sh), (long long)wi, elem(&got[k], wi),
                        elem(&out[k], wi), tc.atol, tc.rtol);
            ok = 0;
        }
    }
done:
    free_tensors(in);
    free_tensors(out);
    free_tensors(got);
    return ok;
}

static void run_cases(const std::vector<tcase> &cases, const char *family) {
    int failed = 0;
    for (size_t i = 0; i < cases.size(); i++)
        if (!run_case(cases[i], (int)i)) failed++;
    print_message("%s: %zu cases, %d failed\n", family, cases.size(), failed);
    assert_int_equal(failed, 0);
}

/* Tolerances. */
#define EXACT 0, 0
#define TIGHT 1e-6, 1e-6
#define MATH 1e-5, 1e-5
#define SUMS 1e-4, 1e-4
#define HALF 2e-2, 1e-2

static tcase C(const char *op, std::vector<tin> in, std::vector<tattr> attrs = {}, double atol = 1e-6,
               double rtol = 1e-6, int nout = 1, int opset = 0, int act = 0, bool fp16 = false) {
    return tcase{op, in, attrs, nout, opset, atol, rtol, act, fp16};
}

/* ---- families -------------------------------------------------------------------- */

static void test_unary(void **state) {
    (void)state;
    std::vector<int64_t> s = {3, 5, 7}, big = {1, 100003}, tiny = {1};
    std::vector<tcase> v = {
        C("Relu", {F(s)}), C("Relu", {F(big)}), C("Relu", {F(tiny)}), C("Relu", {F({0, 3})}),
        C("LeakyRelu", {F(s)}, {af("alpha", 0.1f)}), C("Sigmoid", {F(s)}, {}, MATH), C("Tanh", {F(big)}, {}, MATH),
        C("Gelu", {F(s)}, {}, MATH), C("HardSigmoid", {F(s)}, {af("alpha", 0.3f), af("beta", 0.4f)}),
        C("HardSwish", {F(s)}, {}, MATH), C("Clip", {F(s), PS(DT_FP32, -0.5), PS(DT_FP32, 0.7)}),
        C("Clip", {F(s), ABSENT(), PS(DT_FP32, 0.25)}), C("Clip", {F(s)}, {af("min", -1), af("max", 1)}, TIGHT, 1, 6),
        C("Neg", {F(s)}), C("Abs", {F(s)}), C("Exp", {F(s)}, {}, MATH), C("Log", {F(s, G_POS)}, {}, MATH),
        C("Sqrt", {F(s, G_POS)}, {}, MATH), C("Reciprocal", {F(s, G_NONZERO)}, {}, MATH), C("Floor", {F(s)}),
        C("Ceil", {F(s)}), C("Round", {T(DT_FP32, {8}, G_VALUES, {0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6, 0})}),
        C("Erf", {F(s)}, {}, MATH), C("Sin", {F(s)}, {}, MATH), C("Cos", {F(s)}, {}, MATH),
        C("Tan", {F(s)}, {}, 1e-4, 1e-4), C("Atan", {F(s)}, {}, MATH), C("Sinh", {F(s)}, {}, MATH),
        C("Sign", {F(s, G_SMALLINT)}), C("Softplus", {F(s)}, {}, MATH), C("Softsign", {F(s)}, {}, MATH),
        C("Elu", {F(s)}, {af("alpha", 0.7f)}, MATH), C("Selu", {F(s)}, {}, MATH), C("Celu", {F(s)}, {af("alpha", 1.3f)}, MATH),
        C("Mish", {F(s)}, {}, MATH), C("ThresholdedRelu", {F(s)}, {af("alpha", 0.4f)}),
        C("Not", {T(DT_BOOL, s, G_BOOL)}), C("IsNaN", {T(DT_FP32, {4}, G_VALUES, {1.0, NAN, -INFINITY, 0})}),
        C("IsInf", {T(DT_FP32, {4}, G_VALUES, {1.0, NAN, -INFINITY, INFINITY})}),
        C("Neg", {T(DT_INT64, s, G_INT, {-100, 100})}, {}, EXACT), C("Abs", {T(DT_INT32, s, G_INT, {-100, 100})}, {}, EXACT),
        C("Relu", {F(s)}, {}, HALF, 1, 0, 0, true), C("Sigmoid", {F(big)}, {}, HALF, 1, 0, 0, true),
    };
    run_cases(v, "unary");
}

static void test_binary(void **state) {
    (void)state;
    std::vector<tcase> v = {
        C("Add", {F({3, 1, 7}), F({5, 1})}), C("Add", {F({65537}), F({65537})}), C("Add", {F({2, 3}), F({})}),
        C("Add", {F({1}), F({1})}), C("Sub", {F({4, 1, 3, 1}), F({5, 1, 6})}), C("Mul", {F({2, 3, 4, 5}), F({3, 1, 1})}),
        C("Div", {F({3, 7}), F({7}, G_NONZERO)}, {}, MATH), C("Pow", {F({3, 7}, G_POS), F({3, 7})}, {}, 1e-5, 1e-5),
        C("Max", {F({3, 1}), F({1, 4}), F({4})}), C("Min", {F({2, 5}), F({5})}), C("Sum", {F({3, 4}), F({4}), F({3, 1})}, {}, MATH),
        C("Mean", {F({3, 4}), F({4}), F({3, 1})}, {}, MATH), C("Sum", {F({5, 3})}),
        C("Mod", {T(DT_INT64, {4, 6}, G_INT, {-50, 50}), T(DT_INT64, {6}, G_VALUES, {3, -3, 7, -7, 5, 2})}, {}, EXACT),
        C("Mod", {F({4, 6}), F({6}, G_NONZERO)}, {ai("fmod", 1)}, MATH),
        C("PRelu", {F({2, 3, 4, 5}), F({3, 1, 1})}),
        C("Equal", {T(DT_INT64, {3, 4}, G_INT, {0, 3}), T(DT_INT64, {4}, G_INT, {0, 3})}, {}, EXACT),
        C("Less", {F({3, 4}), F({3, 1})}, {}, EXACT), C("Greater", {F({2, 3, 4}), F({})}, {}, EXACT),
        C("LessOrEqual", {T(DT_INT32, {7}, G_INT, {0, 3}), T(DT_INT32, {7}, G_INT, {0, 3})}, {}, EXACT),
        C("GreaterOrEqual", {F({5, 1}), F({1, 5})}, {}, EXACT),
        C("And", {T(DT_BOOL, {3, 5}, G_BOOL), T(DT_BOOL, {5}, G_BOOL)}, {}, EXACT),
        C("Or", {T(DT_BOOL, {3, 5}, G_BOOL), T(DT_BOOL, {3, 1}, G_BOOL)}, {}, EXACT),
        C("Xor", {T(DT_BOOL, {17}, G_BOOL), T(DT_BOOL, {17}, G_BOOL)}, {}, EXACT),
        C("Add", {T(DT_INT64, {3, 4}, G_INT, {-1000, 1000}), T(DT_INT64, {4}, G_INT, {-1000, 1000})}, {}, EXACT),
        C("Mul", {T(DT_INT32, {3, 4}, G_INT, {-100, 100}), T(DT_INT32, {1}, G_INT, {-100, 100})}, {}, EXACT),
        C("Div", {T(DT_INT64, {9}, G_INT, {-100, 100}), T(DT_INT64, {9}, G_VALUES, {3, -3, 7, 1, -1, 2, 5, 9, -4})}, {}, EXACT),
        C("Add", {F({4, 6}), F({6})}, {}, TIGHT, 1, 0, ACT_RELU), C("Mul", {F({4, 6}), F({4, 1})}, {}, MATH, 1, 0, ACT_SIGMOID),
        C("Add", {F({3, 1, 7}), F({5, 1})}, {}, HALF, 1, 0, 0, true), C("Mul", {F({1000}), F({1})}, {}, HALF, 1, 0, 0, true),
        C("Where", {T(DT_BOOL, {2, 1, 5}, G_BOOL), F({3, 5}), F({1})}),
        C("Where", {T(DT_BOOL, {4}, G_BOOL), T(DT_INT64, {3, 4}, G_INT, {0, 9}), T(DT_INT64, {3, 1}, G_INT, {0, 9})}, {}, EXACT),
    };
    run_cases(v, "binary");
}

static void test_movement(void **state) {
    (void)state;
    std::vector<tcase> v = {
        C("Expand", {F({3, 1}), P(DT_INT64, {2, 3, 4})}, {}, EXACT),
        C("Expand", {T(DT_INT64, {1, 5}, G_INT, {0, 99}), P(DT_INT64, {3, 1})}, {}, EXACT),
        C("Tile", {F({2, 3}), P(DT_INT64, {2, 3})}, {}, EXACT),
        C("Transpose", {F({2, 3, 4, 5})}, {ais("perm", {0, 2, 3, 1})}, EXACT),
        C("Transpose", {F({7, 9, 11})}, {}, EXACT), C("Transpose", {T(DT_FP16, {33, 65}, G_UNIFORM)}, {ais("perm", {1, 0})}, EXACT),
        C("Slice", {F({6, 7, 8}), P(DT_INT64, {1, -1}), P(DT_INT64, {5, -8}), P(DT_INT64, {0, 2}), P(DT_INT64, {2, -2})}, {}, EXACT),
        C("Slice", {F({10, 5}), P(DT_INT64, {-3}), P(DT_INT64, {1000}), P(DT_INT64, {0})}, {}, EXACT),
        C("Slice", {F({4, 9}), P(DT_INT32, {0, 8}), P(DT_INT32, {4, -100}), P(DT_INT32, {0, 1}), P(DT_INT32, {1, -3})}, {}, EXACT),
        C("Pad", {F({3, 4}), P(DT_INT64, {1, 2, 0, 3}), PS(DT_FP32, 1.5)}, {}, EXACT),
        C("Pad", {F({3, 5}), P(DT_INT64, {2, 3, 2, 4})}, {as("mode", "reflect")}, EXACT),
        C("Pad", {F({3, 5}), P(DT_INT64, {2, 1, 1, 2})}, {as("mode", "edge")}, EXACT),
        C("Pad", {F({3, 5}), P(DT_INT64, {4, 6, 3, 7})}, {as("mode", "wrap")}, EXACT, 1, 19),
        C("Pad", {F({2, 3, 6}), P(DT_INT64, {0, 0, -2, 0, 1, 1})}, {}, EXACT),
        C("Concat", {F({2, 3, 4}), F({2, 1, 4}), F({2, 5, 4})}, {ai("axis", 1)}, EXACT),
        C("Concat", {T(DT_INT64, {3}, G_INT, {0, 9}), T(DT_INT64, {1}, G_INT, {0, 9})}, {ai("axis", 0)}, EXACT),
        C("Concat", {T(DT_UINT8, {2, 3}, G_INT, {0, 255}), T(DT_UINT8, {2, 5}, G_INT, {0, 255})}, {ai("axis", -1)}, EXACT),
        C("Split", {F({2, 9, 3}), P(DT_INT64, {2, 3, 4})}, {ai("axis", 1)}, EXACT, 3, 13),
        C("Split", {F({10, 3})}, {ai("axis", 0), ai("num_outputs", 3)}, EXACT, 3, 18),
        C("Gather", {F({5, 4, 3}), T(DT_INT64, {2, 3}, G_INT, {-4, 3})}, {ai("axis", 1)}, EXACT),
        C("Gather", {F({7, 3}), T(DT_INT32, {5}, G_INT, {-7, 6})}, {}, EXACT),
        C("Gather", {T(DT_INT64, {6}, G_INT, {0, 99}), T(DT_INT64, {}, G_VALUES, {-2})}, {}, EXACT),
        C("GatherElements", {F({4, 5}), T(DT_INT64, {4, 3}, G_INT, {-5, 4})}, {ai("axis", 1)}, EXACT),
        C("GatherElements", {T(DT_INT32, {3, 4, 2}, G_INT, {0, 99}), T(DT_INT32, {2, 4, 2}, G_INT, {-3, 2})}, {ai("axis", 0)}, EXACT),
        C("Identity", {F({3, 3})}, {}, EXACT), C("Reshape", {F({3, 4}), P(DT_INT64, {4, 3})}, {}, EXACT),
    };
    run_cases(v, "movement");
}

static void test_cast(void **state) {
    (void)state;
    std::vector<tcase> v = {
        C("Cast", {F({5, 7})}, {ai("to", DT_INT64)}, EXACT), C("Cast", {T(DT_INT64, {9}, G_INT, {-9, 9})}, {ai("to", DT_FP32)}, EXACT),
        C("Cast", {F({257})}, {ai("to", DT_FP16)}, EXACT), C("Cast", {T(DT_FP16, {31})}, {ai("to", DT_FP32)}, EXACT),
        C("Cast", {T(DT_BOOL, {6}, G_BOOL)}, {ai("to", DT_FP32)}, EXACT),
        C("Cast", {T(DT_FP32, {5}, G_VALUES, {0, 0.5, -1, 0, 3})}, {ai("to", DT_BOOL)}, EXACT),
        C("Cast", {T(DT_INT32, {8}, G_INT, {-1000, 1000})}, {ai("to", DT_INT64)}, EXACT),
        C("Cast", {T(DT_INT64, {4}, G_VALUES, {1e12, -5, 7, 123456789012.0})}, {ai("to", DT_INT32)}, EXACT),
        C("Cast", {T(DT_FP64, {6})}, {ai("to", DT_FP32)}, EXACT),
        C("Cast", {T(DT_UINT8, {10}, G_INT, {0, 255})}, {ai("to", DT_FP32)}, EXACT),
        C("CastLike", {F({7}), T(DT_INT64, {1}, G_INT, {0, 1})}, {}, EXACT),
        C("CastLike", {T(DT_INT32, {6}, G_INT, {-50, 50}), F({1})}, {}, EXACT),
    };
    run_cases(v, "cast");
}

static void test_softmax(void **state) {
    (void)state;
    std::vector<tcase> v = {
        C("Softmax", {F({4, 1000})}, {}, MATH), C("Softmax", {F({3, 5, 7})}, {ai("axis", 1)}, MATH),
        C("Softmax", {F({2, 3, 4})}, {ai("axis", 1)}, MATH, 1, 11), C("Softmax", {F({2, 30001})}, {}, MATH),
        C("Softmax", {F({5, 1})}, {}, MATH), C("Softmax", {F({1, 33})}, {}, MATH),
        C("LogSoftmax", {F({6, 129})}, {}, MATH), C("LogSoftmax", {F({3, 4, 5})}, {ai("axis", 0)}, MATH),
        C("Softmax", {F({8, 77})}, {}, HALF, 1, 0, 0, true),
        C("LayerNormalization", {F({4, 7, 33}), F({33}), F({33})}, {}, SUMS),
        C("LayerNormalization", {F({3, 4, 5}), F({4, 5}), F({4, 5})}, {ai("axis", 1)}, SUMS),
        C("LayerNormalization", {F({2, 5000}), F({5000}), ABSENT()}, {af("epsilon", 1e-3f)}, SUMS),
        C("LayerNormalization", {F({6, 31}), F({31}), F({31})}, {}, SUMS, 3),
        C("LayerNormalization", {F({4, 64}), F({64}), F({64})}, {}, HALF, 1, 0, 0, true),
        C("InstanceNormalization", {F({2, 3, 5, 7}), F({3}), F({3})}, {}, SUMS),
        C("InstanceNormalization", {F({1, 4, 1000}), F({4}), F({4})}, {af("epsilon", 1e-3f)}, SUMS),
        C("LRN", {F({2, 7, 5, 5})}, {ai("size", 3)}, MATH),
        C("LRN", {F({1, 16, 9})}, {ai("size", 4), af("alpha", 2e-3f), af("beta", 0.5f), af("bias", 2.0f)}, MATH),
    };
    run_cases(v, "softmax/normalizations");
}

static void test_pool(void **state) {
    (void)state;
    std::vector<tcase> v = {
        C("MaxPool", {F({2, 3, 9, 9})}, {ais("kernel_shape", {3, 3}), ais("strides", {2, 2})}, EXACT),
        C("MaxPool", {F({1, 2, 8, 7})}, {ais("kernel_shape", {3, 2}), ais("pads", {1, 0, 2, 1}), ai("ceil_mode", 1),
                                          ais("strides", {2, 2})}, EXACT),
        C("MaxPool", {F({1, 2, 10, 10})}, {ais("kernel_shape", {2, 2}), ais("dilations", {2, 2})}, EXACT, 1, 12),
        C("MaxPool", {F({2, 3, 17})}, {ais("kernel_shape", {4}), as("auto_pad", "SAME_UPPER")}, EXACT),
        C("MaxPool", {F({1, 2, 5, 6, 7})}, {ais("kernel_shape", {2, 3, 2})}, EXACT),
        C("AveragePool", {F({2, 3, 8, 8})}, {ais("kernel_shape", {2, 2}), ais("strides", {2, 2})}, MATH),
        C("AveragePool", {F({1, 2, 7, 7})}, {ais("kernel_shape", {3, 3}), ais("pads", {1, 1, 1, 1})}, MATH),
        C("AveragePool", {F({1, 2, 7, 7})}, {ais("kernel_shape", {3, 3}), ais("pads", {1, 1, 1, 1}),
                                             ai("count_include_pad", 1)}, MATH),
        C("AveragePool", {F({1, 1, 6, 6})}, {ais("kernel_shape", {3, 3}), ais("pads", {0, 0, 2, 2}),
                                             ais("strides", {2, 2}), ai("count_include_pad", 1)}, MATH),
        C("AveragePool", {F({1, 1, 7, 7})}, {ais("kernel_shape", {2, 2}), ais("strides", {2, 2}), ai("ceil_mode", 1)}, MATH),
        C("AveragePool", {F({2, 3, 8, 8})}, {ais("kernel_shape", {2, 2}), ais("strides", {2, 2})}, HALF, 1, 0, 0, true),
    };
    run_cases(v, "pooling");
}

static void test_reduce(void **state) {
    (void)state;
    std::vector<tcase> v = {
        C("ReduceSum", {F({3, 5, 7}), P(DT_INT64, {0, 2})}, {}, SUMS, 1, 13),
        C("ReduceSum", {F({3, 5, 7}), P(DT_INT64, {-1})}, {ai("keepdims", 0)}, SUMS, 1, 13),
        C("ReduceMean", {F({4, 4096})}, {ais("axes", {1})}, SUMS, 1, 13),
        C("ReduceMean", {F({2, 3, 4})}, {}, SUMS, 1, 13),
        C("ReduceMax", {F({6, 300, 5}), P(DT_INT64, {1})}, {ai("keepdims", 0)}, EXACT, 1, 18),
        C("ReduceMin", {F({7, 9}), P(DT_INT64, {0})}, {}, EXACT, 1, 18),
        C("ReduceProd", {F({4, 6}, G_POS), P(DT_INT64, {1})}, {}, SUMS, 1, 18),
        C("ReduceL1", {F({5, 200}), P(DT_INT64, {1})}, {}, SUMS, 1, 18),
        C("ReduceL2", {F({5, 6, 7}), P(DT_INT64, {0, 2})}, {}, SUMS, 1, 18),
        C("ReduceSumSquare", {F({3, 4}), P(DT_INT64, {1})}, {}, SUMS, 1, 18),
        C("ReduceLogSum", {F({3, 4}, G_POS), P(DT_INT64, {1})}, {}, SUMS, 1, 18),
        C("ReduceLogSumExp", {F({3, 1000}), P(DT_INT64, {1})}, {}, SUMS, 1, 18),
        C("ReduceSum", {F({3, 4})}, {ai("noop_with_empty_axes", 1)}, EXACT, 1, 13),
        C("ReduceSum", {F({100003})}, {}, 1e-3, 1e-4, 1, 13),
        C("ReduceMean", {F({4, 4096})}, {ais("axes", {1})}, HALF, 1, 13, 0, true),
        C("GlobalAveragePool", {F({2, 3, 5, 7})}, {}, SUMS), C("GlobalMaxPool", {F({2, 3, 9, 9})}, {}, EXACT),
        C("GlobalAveragePool", {F({1, 8, 64, 64})}, {}, SUMS),
        C("ArgMax", {F({3, 5, 7})}, {ai("axis", 1)}, EXACT), C("ArgMax", {F({4, 100})}, {ai("axis", -1), ai("keepdims", 0)}, EXACT),
        C("ArgMin", {F({6, 5}, G_SMALLINT)}, {ai("axis", 1), ai("select_last_index", 1)}, EXACT),
        C("ArgMax", {F({6, 5}, G_SMALLINT)}, {ai("axis", 0)}, EXACT),
        C("ArgMax", {T(DT_INT64, {4, 5}, G_INT, {0, 3})}, {ai("axis", 1)}, EXACT),
        C("BatchNormalization", {F({2, 3, 4, 5}), F({3}), F({3}), F({3}), F({3}, G_POS)}, {}, MATH),
        C("BatchNormalization", {F({3, 2}), F({2}), F({2}), F({2}), F({2}, G_POS)}, {af("epsilon", 1e-3f)}, MATH),
        C("BatchNormalization", {F({2, 3, 4, 5}), F({3}), F({3}), F({3}), F({3}, G_POS)}, {}, HALF, 1, 0, 0, true),
    };
    run_cases(v, "reduce/argmax/batchnorm");
}

#ifndef KILN_CUDA_EMU
/* Library ops: only on a real GPU (cuBLASLt, cuDNN). */
static void test_library(void **state) {
    (void)state;
    std::vector<tcase> v = {
        C("MatMul", {F({33, 65}), F({65, 17})}, {}, 1e-4, 1e-4), C("MatMul", {F({2, 3, 7, 9}), F({9, 5})}, {}, 1e-4, 1e-4),
        C("MatMul", {F({4, 7, 9}), F({4, 9, 5})}, {}, 1e-4, 1e-4), C("MatMul", {F({7, 9}), F({3, 9, 5})}, {}, 1e-4, 1e-4),
        C("MatMul", {F({9}), F({9, 5})}, {}, 1e-4, 1e-4),
        C("Gemm", {F({8, 16}), F({32, 16}), F({32})}, {ai("transB", 1)}, 1e-4, 1e-4),
        C("Gemm", {F({16, 8}), F({16, 32}), F({8, 32})}, {ai("transA", 1), af("alpha", 0.5f), af("beta", 2.0f)}, 1e-4, 1e-4),
        C("Gemm", {F({8, 16}), F({16, 32}), F({32})}, {}, 1e-4, 1e-4, 1, 0, ACT_RELU),
        C("MatMul", {F({64, 128}), F({128, 64})}, {}, HALF, 1, 0, 0, true),
        C("Conv", {F({2, 3, 9, 11}), F({4, 3, 3, 3}), F({4})}, {ais("pads", {1, 1, 1, 1})}, 1e-4, 1e-4),
        C("Conv", {F({1, 4, 8, 8}), F({4, 2, 3, 3})}, {ai("group", 2), ais("strides", {2, 2})}, 1e-4, 1e-4),
        C("Conv", {F({1, 8, 7, 7}), F({8, 1, 3, 3}), F({8})}, {ai("group", 8), as("auto_pad", "SAME_UPPER")}, 1e-4, 1e-4, 1, 0, ACT_RELU),
        C("Conv", {F({2, 3, 17}), F({5, 3, 4})}, {ais("dilations", {2})}, 1e-4, 1e-4),
        C("MaxPool", {F({2, 3, 9, 9})}, {ais("kernel_shape", {3, 3}), ais("strides", {2, 2})}, EXACT),
        C("AveragePool", {F({2, 3, 8, 8})}, {ais("kernel_shape", {2, 2}), ais("strides", {2, 2})}, MATH),
        C("AveragePool", {F({1, 2, 7, 7})}, {ais("kernel_shape", {3, 3}), ais("pads", {1, 1, 1, 1})}, MATH),
    };
    run_cases(v, "cuBLASLt/cuDNN");
}

/* Staged copies, CUDA graph capture and replay through the vtable: a
 * captured Softmax(Add(x, y)) replayed on new contents of the same buffers
 * must match the CPU each time. */
static void test_graphs_and_copies(void **state) {
    (void)state;
    const struct backend_i *bi = g_be->iface;
    const int64_t rows = 37, cols = 129, n = rows * cols;
    size_t nb = (size_t)n * 4;
    float *dx = (float *)bi->buffer_alloc(g_be, nb), *dy = (float *)bi->buffer_alloc(g_be, nb);
    float *ds = (float *)bi->buffer_alloc(g_be, nb), *dz = (float *)bi->buffer_alloc(g_be, nb);
    assert_non_null(dx);
    assert_non_null(dz);
    tcase add = C("Add", {F({rows, cols}), F({rows, cols})}), sm = C("Softmax", {F({rows, cols})});
    tnode na, ns;
    build_node(&na, add);
    build_node(&ns, sm);
    struct tensor tx = {DT_FP32, 2, {rows, cols}, dx}, ty = tx, ts = tx, tz = tx;
    ty.data = dy;
    ts.data = ds;
    tz.data = dz;
    struct op_call ca, cs;
    char msg[256] = "";
    memset(&ca, 0, sizeof ca);
    memset(&cs, 0, sizeof cs);
    ca.node = &na.n; ca.nin = 2; ca.in[0] = &tx; ca.in[1] = &ty; ca.nout = 1; ca.out[0] = &ts;
    cs.node = &ns.n; cs.nin = 1; cs.in[0] = &ts; cs.nout = 1; cs.out[0] = &tz;
    ca.err = cs.err = msg;
    ca.err_len = cs.err_len = sizeof msg;
    void *sta = NULL, *sts = NULL;
    size_t ws = 0;
    assert_int_equal(bi->prepare_node(g_be, &ca, &sta, &ws), 0);
    assert_int_equal(bi->prepare_node(g_be, &cs, &sts, &ws), 0);
    ca.state = sta;
    cs.state = sts;
    assert_non_null(bi->graph_begin);
    assert_int_equal(bi->graph_begin(g_be), 0);
    assert_int_equal(bi->run_node(g_be, &ca), 0);
    assert_int_equal(bi->run_node(g_be, &cs), 0);
    void *graph = NULL;
    assert_int_equal(bi->graph_end(g_be, &graph), 0);
    assert_non_null(graph);
    std::vector<float> hx((size_t)n), hy((size_t)n), hz((size_t)n);
    for (int round = 0; round < 3; round++) {
        for (int64_t i = 0; i < n; i++) {
            hx[(size_t)i] = (float)(rnd() * 8 - 4);
            hy[(size_t)i] = (float)(rnd() * 2 - 1);
        }
        assert_int_equal(bi->copy_to_device(g_be, dx, hx.data(), nb), 0);
        assert_int_equal(bi->copy_to_device(g_be, dy, hy.data(), nb), 0);
        assert_int_equal(bi->graph_replay(g_be, graph), 0);
        assert_int_equal(bi->copy_to_host(g_be, hz.data(), dz, nb), 0);
        assert_int_equal(bi->synchronize(g_be), 0);
        for (int64_t r = 0; r < rows; r++) {
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j < cols; j++) m = fmax(m, (double)hx[(size_t)(r * cols + j)] + hy[(size_t)(r * cols + j)]);
            for (int64_t j = 0; j < cols; j++) sum += exp((double)hx[(size_t)(r * cols + j)] + hy[(size_t)(r * cols + j)] - m);
            for (int64_t j = 0; j < cols; j++) {
                double want = exp((double)hx[(size_t)(r * cols + j)] + hy[(size_t)(r * cols + j)] - m) / sum;
                assert_true(fabs(hz[(size_t)(r * cols + j)] - want) <= 1e-6 + 1e-5 * want);
            }
        }
    }
    bi->graph_free(g_be, graph);
    bi->release_node(g_be, &na.n, sta);
    bi->release_node(g_be, &ns.n, sts);
    bi->buffer_free(g_be, dx);
    bi->buffer_free(g_be, dy);
    bi->buffer_free(g_be, ds);
    bi->buffer_free(g_be, dz);
    print_message("CUDA graph: captured Add+Softmax replayed 3 times with staged copies: correct\n");
}
#endif


/* ---- ONNX node tests through the CUDA path ----------------------------------------- */

/* The backend the node tests run on: under emulation a "device" backend
 * whose memory is host memory but which the engine treats as a device
 * (host_memory 0: copies, plan-time constants, CPU fallback with explicit
 * copies for nodes the custom kernels refuse, e.g. MatMul and Conv); on a
 * GPU the real CUDA backend. */
static int g_nodes_cuda, g_nodes_cpu;
static std::map<std::string, int> g_fallback_ops; /* op type -> nodes left to the CPU */

#ifdef KILN_CUDA_EMU
static void emu_free(struct backend *be) { free(be); }
static void *emu_alloc(struct backend *be, size_t n) { (void)be; void *p = NULL; cudaMalloc(&p, n ? n : 1); return p; }
static void emu_buf_free(struct backend *be, void *p) { (void)be; cudaFree(p); }
static int emu_copy(struct backend *be, void *d, const void *s, size_t n) { (void)be; if (n) memcpy(d, s, n); return 0; }
static int emu_supports(struct backend *be, const struct op_call *c) {
    (void)be;
    int ok = kd_supports(c, NULL, 0);
    (ok ? g_nodes_cuda : g_nodes_cpu)++;
    if (!ok) g_fallback_ops[c->node->op_type]++;
    return ok;
}
static int emu_prepare(struct backend *be, struct op_call *c, void **state, size_t *ws) {
    (void)be;
    *ws = 0;
    return kd_prepare(c, state);
}
static int emu_run(struct backend *be, struct op_call *c) { (void)be; return kd_run(c, c->state, 0); }
static void emu_release(struct backend *be, const struct graph_node *n, void *state) { (void)be; (void)n; kd_release(state); }
static int emu_sync(struct backend *be) { (void)be; return 0; }
static const struct backend_i g_emu_iface = {
    "cuda-emulated", emu_free, emu_alloc, emu_buf_free, emu_copy, emu_copy, emu_supports, emu_prepare,
    emu_run, emu_release, emu_sync, NULL, NULL, NULL, NULL,
};
static struct backend *node_test_backend(void) {
    struct backend *be = (struct backend *)calloc(1, sizeof *be);
    be->iface = &g_emu_iface;
    be->device = 0;
    be->host_memory = 0;
    return be;
}
#else
static struct backend *node_test_backend(void) { return g_be; }
#endif

static bool uses_custom_kernel(const char *model_path) {
    char err[256];
    struct graph *g = onnx_load_file(model_path, err, sizeof err);
    if (!g) return false;
    bool any = false;
    for (int i = 0; i < g->nnodes && !any; i++) any = kc_op_known(g->nodes[i].op_type) != 0;
    graph_free(g);
    return any;
}

static bool close_enough(const struct tensor *want, const struct tensor *got, char *msg, size_t len) {
    if (!tensor_same_shape(want, got)) {
        char a[128], b[128];
        snprintf(msg, len, "shape %s, expected %s", tensor_shape_str(got, b, sizeof b), tensor_shape_str(want, a, sizeof a));
        return false;
    }
    if (want->dtype == DT_STRING) return true;
    int64_t n = tensor_numel(want);
    for (int64_t i = 0; i < n; i++) {
        double w = op_double_at(want, i), g = op_double_at(got, i);
        if ((isnan(w) && isnan(g)) || w == g) continue;
        if (!(fabs(w - g) <= 1e-5 + 1e-3 * fabs(w))) {
            snprintf(msg, len, "element %lld is %.9g, expected %.9g", (long long)i, g, w);
            return false;
        }
    }
    return true;
}

/* 0 skipped (no data, or the CPU itself does not pass it), 1 passed, -1 failed. */
static int node_test(const char *dir, struct backend *be, char *msg, size_t len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    struct model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.path = path;
    char err[512] = "";
    struct model *m = model_load(&mp, err, sizeof err);
    if (!m) return 0;
    int nin = model_ninputs(m), nout = model_noutputs(m), rc = 0;
    std::vector<struct tensor> in((size_t)nin), want((size_t)nout), cpu((size_t)nout), dev((size_t)nout);
    bool ok = true;
    for (int i = 0; i < nin && ok; i++) {
        snprintf(path, sizeof path, "%s/test_data_set_0/input_%d.pb", dir, i);
        ok = onnx_load_tensor_file(path, &in[(size_t)i], NULL, err, sizeof err) == 0;
    }
    for (int i = 0; i < nout && ok; i++) {
        snprintf(path, sizeof path, "%s/test_data_set_0/output_%d.pb", dir, i);
        ok = onnx_load_tensor_file(path, &want[(size_t)i], NULL, err, sizeof err) == 0;
    }
    struct model_exec *xc = ok ? model_exec_create(m, NULL, 1) : NULL;
    if (ok && xc && model_run(xc, in.data(), nin, cpu.data(), nout, err, sizeof err) == 0) {
        bool cpu_ok = true;
        for (int i = 0; i < nout && cpu_ok; i++) cpu_ok = close_enough(&want[(size_t)i], &cpu[(size_t)i], msg, len);
        if (cpu_ok) { /* the CPU passes: the CUDA path must too */
            struct model_exec *xd = model_exec_create(m, be, 1);
            if (!xd) {
                snprintf(msg, len, "cannot create an executor on the CUDA backend");
                rc = -1;
            } else if (model_run(xd, in.data(), nin, dev.data(), nout, err, sizeof err)) {
                snprintf(msg, len, "run failed: %s", err);
                rc = -1;
            } else {
                rc = 1;
                for (int i = 0; i < nout && rc == 1; i++)
                    if (!close_enough(&want[(size_t)i], &dev[(size_t)i], msg, len)) rc = -1;
            }
            model_exec_free(xd);
        }
    }
    model_exec_free(xc);
    for (auto &t : in) onnx_tensor_clear(&t);
    for (auto &t : want) onnx_tensor_clear(&t);
    for (auto &t : cpu) free(t.data);
    for (auto &t : dev) free(t.data);
    model_free(m);
    return rc;
}

static void test_onnx_node_tests(void **state) {
    (void)state;
    if (getenv("KILN_CUDA_TEST_QUICK")) { /* e.g. under compute-sanitizer */
        print_message("KILN_CUDA_TEST_QUICK: ONNX node tests skipped\n");
        skip();
    }
    const char *data = getenv("KILN_ONNX_NODE_TESTS");
    std::string dir = data ? data : ".venv/lib/python3.11/site-packages/onnx/backend/test/data/node";
    DIR *d = opendir(dir.c_str());
    if (!d) {
        print_message("ONNX node tests not found at %s (set KILN_ONNX_NODE_TESTS): skipped\n", dir.c_str());
        skip();
    }
    std::vector<std::string> names;
    while (struct dirent *e = readdir(d))
        if (!strncmp(e->d_name, "test_", 5)) names.push_back(e->d_name);
    closedir(d);
    std::sort(names.begin(), names.end());
    struct backend *be = node_test_backend();
    int passed = 0, failed = 0, skipped = 0;
    for (const std::string &n : names) {
        std::string t = dir + "/" + n;
        if (!uses_custom_kernel((t + "/model.onnx").c_str())) continue;
        char msg[512] = "";
        int rc = node_test(t.c_str(), be, msg, sizeof msg);
        if (rc > 0) passed++;
        else if (rc == 0) skipped++;
        else {
            failed++;
            print_error("%s on the CUDA path: %s\n", n.c_str(), msg);
        }
    }
    print_message("ONNX node tests through the CUDA path: %d passed, %d failed, %d not passed by the CPU either "
                  "(%d nodes ran on CUDA kernels, %d fell back to the CPU)\n",
                  passed, failed, skipped, g_nodes_cuda, g_nodes_cpu);
    if (!g_fallback_ops.empty()) {
        std::vector<std::pair<int, std::string>> v;
        for (auto &kv : g_fallback_ops) v.push_back({-kv.second, kv.first});
        std::sort(v.begin(), v.end());
        std::string line;
        for (size_t i = 0; i < v.size() && i < 25; i++) line += " " + v[i].second + "(" + std::to_string(-v[i].first) + ")";
        print_message("left to the CPU, by op:%s\n", line.c_str());
    }
#ifdef KILN_CUDA_EMU
    be->iface->free(be);
#endif
    assert_int_equal(failed, 0);
    assert_true(passed > 100);
}

/* ONNX's light models (nine real architectures) through the CUDA path:
 * input arange(n)/n, expected output from the .pb beside each model; the
 * convolutions and matrix products run on the CPU under emulation, on
 * cuDNN and cuBLASLt on a GPU. */
/* The worst |device - expected| / max |expected| of the last light_test. */
static double g_light_err;

static double rel_err(const struct tensor *want, const struct tensor *got) {
    double mx = 0, worst = 0;
    int64_t n = tensor_numel(want);
    if (!tensor_same_shape(want, got)) return INFINITY;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(op_double_at(want, i)));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(op_double_at(want, i) - op_double_at(got, i)));
    return mx > 0 ? worst / mx : worst;
}

/* fp16: the device plan stores weights and activations in FP16; the output
 * must then be within fp16_tol of the largest expected magnitude. */
static int light_test(const char *model_path, const char *out_pb, struct backend *be, int fp16, double fp16_tol,
                      char *msg, size_t len) {
    char err[512] = "";
    struct model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.path = model_path;
    mp.fp16 = fp16;
    struct model *m = model_load(&mp, err, sizeof err);
    if (!m) return 0;
    int rc = 0;
    struct tensor want, in, cpu, dev;
    memset(&want, 0, sizeof want);
    memset(&cpu, 0, sizeof cpu);
    memset(&dev, 0, sizeof dev);
    const struct model_io *io = model_ninputs(m) == 1 ? model_input(m, 0) : NULL;
    if (io && model_noutputs(m) == 1 && onnx_load_tensor_file(out_pb, &want, NULL, err, sizeof err) == 0) {
        memset(&in, 0, sizeof in);
        in.dtype = io->dtype;
        in.ndim = io->ndim;
        for (int d = 0; d < in.ndim; d++) in.dims[d] = io->dims[d] < 0 ? 1 : io->dims[d];
        int64_t n = tensor_numel(&in);
        float *x = (float *)malloc((size_t)n * sizeof *x);
        for (int64_t i = 0; i < n; i++) x[i] = (float)((double)i / (double)n);
        in.data = x;
        struct model_exec *xc = model_exec_create(m, NULL, 1); /* one thread: no OpenMP under ThreadSanitizer */
        if (xc && model_run(xc, &in, 1, &cpu, 1, err, sizeof err) == 0 && close_enough(&want, &cpu, msg, len)) {
            struct model_exec *xd = model_exec_create(m, be, 1);
            if (!xd || model_run(xd, &in, 1, &dev, 1, err, sizeof err)) {
                snprintf(msg, len, "run failed: %s", err);
                rc = -1;
            } else if (fp16) {
                g_light_err = rel_err(&want, &dev);
                rc = g_light_err <= fp16_tol ? 1 : -1;
                if (rc < 0) snprintf(msg, len, "FP16 error %.3g of the output's range, above %.3g", g_light_err, fp16_tol);
            } else {
                g_light_err = rel_err(&want, &dev);
                rc = close_enough(&want, &dev, msg, len) ? 1 : -1;
            }
            model_exec_free(xd);
        }
        model_exec_free(xc);
        free(x);
    }
    onnx_tensor_clear(&want);
    free(cpu.data);
    free(dev.data);
    model_free(m);
    return rc;
}

static void test_onnx_light_models(void **state) {
    (void)state;
    if (getenv("KILN_CUDA_TEST_QUICK")) skip();
    const char *data = getenv("KILN_ONNX_NODE_TESTS");
    std::string dir = data ? std::string(data) + "/../light" : ".venv/lib/python3.11/site-packages/onnx/backend/test/data/light";
    DIR *d = opendir(dir.c_str());
    if (!d) {
        print_message("ONNX light models not found at %s: skipped\n", dir.c_str());
        skip();
    }
    std::vector<std::string> names;
    while (struct dirent *e = readdir(d)) {
        std::string f = e->d_name;
        if (f.size() > 5 && f.compare(f.size() - 5, 5, ".onnx") == 0) names.push_back(f.substr(0, f.size() - 5));
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    struct backend *be = node_test_backend();
    int passed = 0, failed = 0, skipped = 0;
    for (int fp16 = 0; fp16 <= 1; fp16++)
        for (const std::string &n : names) {
            char msg[512] = "";
            g_light_err = 0;
            /* FP16 (10-bit mantissa) through tens of layers: 1% of the output's range. */
            int rc = light_test((dir + "/" + n + ".onnx").c_str(), (dir + "/" + n + "_output_0.pb").c_str(), be, fp16,
                                1e-2, msg, sizeof msg);
            if (rc > 0) passed++;
            else if (rc == 0) skipped++;
            else {
                failed++;
                print_error("%s (%s) on the CUDA path: %s\n", n.c_str(), fp16 ? "FP16" : "FP32", msg);
            }
            print_message("  %s %s: %s (max error %.2g of the output's range)\n", n.c_str(), fp16 ? "FP16" : "FP32",
                          rc > 0 ? "pass" : rc == 0 ? "not passed by the CPU either" : "FAIL", g_light_err);
        }
    print_message("ONNX light models through the CUDA path: %d passed, %d failed, %d not passed by the CPU either\n",
                  passed, failed, skipped);
#ifdef KILN_CUDA_EMU
    be->iface->free(be);
#endif
    assert_int_equal(failed, 0);
}

static void test_harness(void **state) {
    (void)state;
#ifdef KILN_CUDA_EMU
    /* The harness itself: a block-wide reduction that needs barriers and warp
     * shuffles must give the exact sum of small integers. */
    struct tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = DT_FP32;
    t.ndim = 2;
    t.dims[0] = 3;
    t.dims[1] = 1000;
    float *x = (float *)malloc(3000 * 4), y[3];
    for (int i = 0; i < 3000; i++) x[i] = (float)(i % 7);
    struct kc_reduce_desc d;
    memset(&d, 0, sizeof d);
    d.nk = 1;
    d.kdims[0] = 3;
    d.kstride[0] = 1000;
    d.nr = 1;
    d.rdims[0] = 1000;
    d.rstride[0] = 1;
    d.out_n = 3;
    d.r_n = 1000;
    assert_int_equal(kc_reduce(KR_SUM, DT_FP32, x, y, &d, 0), cudaSuccess);
    for (int r = 0; r < 3; r++) {
        double s = 0;
        for (int i = 0; i < 1000; i++) s += x[r * 1000 + i];
        assert_true(fabs(y[r] - s) < 1e-3);
    }
    /* A configuration a GPU refuses is refused here too. */
    struct kc_remap_desc m;
    memset(&m, 0, sizeof m);
    assert_int_equal(kc_softmax(DT_FP32, x, x, 0, 5, 1, 0, 0), cudaSuccess); /* empty: nothing launched */
    (void)m;
    free(x);
    print_message("emulation: %llu launches, %llu threads run as fibers\n", (unsigned long long)emu::launch_count(),
                  (unsigned long long)emu::fiber_count());
#endif
}

static void test_supports_truthfully(void **state) {
    (void)state;
    /* Nodes outside the kernels' reach are refused at supports time, not at run. */
    tcase bad[] = {
        C("Gelu", {F({3})}, {as("approximate", "tanh")}),
        C("Softmax", {T(DT_INT64, {3}, G_INT, {0, 1})}),
        C("Slice", {F({4}), F({1}), F({1})}), /* starts not constant */
        C("Pad", {F({3}), P(DT_INT64, {1, 1})}, {as("mode", "mirror")}),
    };
    for (const tcase &tc : bad) {
        tnode tn;
        build_node(&tn, tc);
        std::vector<struct tensor> in;
        std::vector<void *> owned;
        for (const tin &d : tc.in) {
            in.push_back(make(d));
            owned.push_back(in.back().data);
        }
        struct tensor out;
        memset(&out, 0, sizeof out);
        out = in[0];
        out.data = NULL;
        struct op_call c;
        op_call_init(&c, &tn.n, 1, NULL, 0);
        c.nin = (int)in.size();
        c.nout = 1;
        for (size_t k = 0; k < in.size(); k++) {
            c.in[k] = &in[k];
            if (!tc.in[k].param) in[k].data = NULL;
        }
        c.out[0] = &out;
        char why[200] = "";
        assert_int_equal(kd_supports(&c, why, sizeof why), 0);
        assert_true(why[0] != 0);
        for (void *p : owned) free(p);
    }
    /* And a node runs only from its prepared state: kd_run never builds one,
     * which would decode the attributes on every run. */
    tcase relu = C("Relu", {F({3})});
    tnode tn;
    build_node(&tn, relu);
    struct tensor t = make(relu.in[0]);
    struct op_call c;
    char err[200] = "";
    op_call_init(&c, &tn.n, 1, err, sizeof err);
    c.nin = c.nout = 1;
    c.in[0] = &t;
    c.out[0] = &t;
    assert_int_not_equal(kd_run(&c, NULL, 0), 0);
    assert_non_null(strstr(err, "only once prepared"));
    free(t.data);
}

int main(void) {
#ifndef KILN_CUDA_EMU
    char why[512] = "";
    if (kiln_cuda_probe(why, sizeof why) <= 0) {
        fprintf(stderr, "test_cuda_gpu: no usable GPU: %s\n", why);
        return 77;
    }
    struct backend_params bp = {0, 1};
    g_be = kiln_cuda_backend_create(&bp, why, sizeof why);
    if (!g_be) {
        fprintf(stderr, "test_cuda_gpu: %s\n", why);
        return 1;
    }
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_harness),
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_binary),
        cmocka_unit_test(test_movement),
        cmocka_unit_test(test_cast),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_reduce),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_supports_truthfully),
        cmocka_unit_test(test_onnx_node_tests),
        cmocka_unit_test(test_onnx_light_models),
#ifndef KILN_CUDA_EMU
        cmocka_unit_test(test_library),
        cmocka_unit_test(test_graphs_and_copies),
#endif
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (g_skipped) fprintf(stderr, "%d cases skipped (no CPU op)\n", g_skipped);
#ifdef KILN_CUDA_EMU
    fprintf(stderr, "cuda emulation: %llu kernel launches, %llu GPU threads run as fibers\n",
            (unsigned long long)emu::launch_count(), (unsigned long long)emu::fiber_count());
#endif
#ifndef KILN_CUDA_EMU
    g_be->iface->free(g_be);
#endif
    return rc;
}
