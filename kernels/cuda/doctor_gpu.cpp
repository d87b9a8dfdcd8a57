/* doctor_gpu.cpp - the GPU half of `kiln doctor`, exported by the plugin as
 *   int kiln_cuda_doctor(FILE *out, int self_tests);
 * It prints driver vs runtime versions, each device (name, memory, compute
 * capability, whether this build has code for it), cuDNN and cuBLAS versions
 * against those kiln was built with, and runs a GEMM (cuBLASLt) and a
 * convolution (cuDNN) self-test through the backend's own node path,
 * checked against a CPU reference on sampled outputs, with TFLOP/s.
 * Returns 0 when a GPU is usable, 1 when one is present but broken, 2 when
 * there is none. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/cuda_util.h"

extern "C" int kiln_cuda_probe(char *why, size_t why_len);
extern "C" struct backend *kiln_cuda_backend_create(const struct backend_params *p, char *why, size_t why_len);

static void ver(int v, char *b, size_t n) { snprintf(b, n, "%d.%d", v / 1000, (v % 1000) / 10); }

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void fill(float *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = (float)((double)lcg(&seed) / 2147483648.0 - 0.5);
}

/* A node with int-list attributes, enough for the self-tests. */
struct test_node {
    struct graph_node n;
    struct graph_attr attrs[4];
    int64_t vals[4][4];
};

static void add_ints(struct test_node *t, const char *name, const int64_t *v, int nv) {
    struct graph_attr *a = &t->attrs[t->n.nattr];
    memcpy(t->vals[t->n.nattr], v, (size_t)nv * sizeof *v);
    a->name = (char *)name;
    a->type = ATTR_INTS;
    a->n = nv;
    a->ints = t->vals[t->n.nattr];
    t->n.nattr++;
}

static void node_init(struct test_node *t, const char *op) {
    memset(t, 0, sizeof *t);
    t->n.name = (char *)"self_test";
    t->n.op_type = (char *)op;
    t->n.domain = (char *)"";
    t->n.opset = 17;
    t->n.attrs = t->attrs;
}

/* Runs one prepared node `iters` times; returns seconds per run or -1. */
static double time_node(struct backend *be, struct op_call *c, int iters, char *msg, size_t msg_len) {
    struct kc_instance *in = (struct kc_instance *)be->context;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    int rc = be->iface->run_node(be, c); /* warm-up */
    cudaEventRecord(e0, in->stream);
    for (int i = 0; i < iters && !rc; i++) rc = be->iface->run_node(be, c);
    cudaEventRecord(e1, in->stream);
    cudaError_t e = cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (rc) return -1;
    if (e != cudaSuccess) {
        snprintf(msg, msg_len, "%s", cudaGetErrorString(e));
        return -1;
    }
    return ms / 1000.0 / iters;
}

/* GEMM self-test: [m,k] x [k,n] FP32, and the same in FP16 for tensor-core speed. */
static int gemm_test(FILE *out, struct backend *be, enum dtype dt) {
    const int64_t m = 4096, n = 4096, k = 4096;
    size_t es = dt == DT_FP16 ? 2 : 4;
    float *ha = (float *)malloc((size_t)(m * k) * 4), *hb = (float *)malloc((size_t)(k * n) * 4);
    float *hy = (float *)malloc((size_t)(m * n) * 4);
    void *hbuf = malloc((size_t)(m * k > k * n ? m * k : k * n) * es);
    void *da = NULL, *db = NULL, *dy = NULL, *ws = NULL;
    int ok = 0;
    char msg[256] = "";
    struct test_node tn;
    struct op_call c;
    void *state = NULL;
    size_t wsz = 0;
    struct tensor ta, tb, ty;
    double sec = -1;
    int64_t bad = 0;
    double maxerr = 0;
    if (!ha || !hb || !hy || !hbuf) {
        snprintf(msg, sizeof msg, "out of host memory");
        goto done;
    }
    fill(ha, (size_t)(m * k), 1);
    fill(hb, (size_t)(k * n), 2);
    if (!KC_CUDA_OK(cudaMalloc(&da, (size_t)(m * k) * es)) || !KC_CUDA_OK(cudaMalloc(&db, (size_t)(k * n) * es)) ||
        !KC_CUDA_OK(cudaMalloc(&dy, (size_t)(m * n) * es))) {
        snprintf(msg, sizeof msg, "%s", kc_last_error());
        goto done;
    }
    for (int which = 0; which < 2; which++) {
        const float *src = which ? hb : ha;
        size_t cnt = (size_t)(which ? k * n : m * k);
        if (dt == DT_FP16) {
            for (size_t i = 0; i < cnt; i++) ((uint16_t *)hbuf)[i] = fp32_to_fp16(src[i]);
            cudaMemcpy(which ? db : da, hbuf, cnt * 2, cudaMemcpyHostToDevice);
        } else {
            cudaMemcpy(which ? db : da, src, cnt * 4, cudaMemcpyHostToDevice);
        }
    }
    ta = {dt, 2, {m, k}, da};
    tb = {dt, 2, {k, n}, db};
    ty = {dt, 2, {m, n}, dy};
    node_init(&tn, "MatMul");
    op_call_init(&c, &tn.n, 1, msg, sizeof msg);
    c.in[0] = &ta;
    c.in[1] = &tb;
    c.nin = 2;
    c.out[0] = &ty;
    c.nout = 1;
    if (!be->iface->supports_op(be, &c) || be->iface->prepare_node(be, &c, &state, &wsz)) {
        if (!msg[0]) snprintf(msg, sizeof msg, "the backend refused the GEMM");
        goto done;
    }
    if (wsz && !KC_CUDA_OK(cudaMalloc(&ws, wsz))) {
        snprintf(msg, sizeof msg, "%s", kc_last_error());
        goto done;
    }
    c.state = state;
    c.scratch = ws;
    c.scratch_size = wsz;
    sec = time_node(be, &c, 10, msg, sizeof msg);
    if (sec < 0) goto done;
    /* Check 256 sampled outputs against a double-precision CPU dot product. */
    if (dt == DT_FP32) cudaMemcpy(hy, dy, (size_t)(m * n) * 4, cudaMemcpyDeviceToHost);
    {
        uint64_t seed = 7;
        for (int s = 0; s < 256; s++) {
            int64_t i = (int64_t)(lcg(&seed) % (uint64_t)m), j = (int64_t)(lcg(&seed) % (uint64_t)n);
            double ref = 0;
            for (int64_t t = 0; t < k; t++) {
                double av = ha[i * k + t], bv = hb[t * n + j];
                if (dt == DT_FP16) {
                    av = fp16_to_fp32(fp32_to_fp16((float)av));
                    bv = fp16_to_fp32(fp32_to_fp16((float)bv));
                }
                ref += av * bv;
            }
            double got;
            if (dt == DT_FP16) {
                uint16_t h = 0;
                cudaMemcpy(&h, (uint16_t *)dy + i * n + j, 2, cudaMemcpyDeviceToHost);
                got = fp16_to_fp32(h);
            } else {
                got = hy[i * n + j];
            }
            double err = fabs(got - ref), tol = dt == DT_FP16 ? 2e-2 + 2e-3 * fabs(ref) : 1e-3 + 1e-4 * fabs(ref);
            if (err > maxerr) maxerr = err;
            if (err > tol) bad++;
        }
    }
    ok = bad == 0;
    fprintf(out, "  GEMM %s %lldx%lldx%lld (cuBLASLt): %s, max |error| %.2g over 256 sampled outputs, %.1f TFLOP/s\n",
            dt == DT_FP16 ? "FP16" : "FP32", (long long)m, (long long)n, (long long)k, ok ? "correct" : "WRONG", maxerr,
            2.0 * m * n * k / sec / 1e12);
done:
    if (!ok && sec < 0) fprintf(out, "  GEMM %s self-test FAILED: %s\n", dt == DT_FP16 ? "FP16" : "FP32", msg);
    if (state) be->iface->release_node(be, &tn.n, state);
    cudaFree(ws);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dy);
    free(ha);
    free(hb);
    free(hy);
    free(hbuf);
    return ok;
}

/* Conv self-test: ResNet-like 3x3, 64 -> 64 channels, 56x56, batch 32, FP32 with bias + ReLU. */
static int conv_test(FILE *out, struct backend *be) {
    const int64_t N = 32, C = 64, H = 56, W = 56, K = 64, R = 3;
    size_t nx = (size_t)(N * C * H * W), nw = (size_t)(K * C * R * R), ny = (size_t)(N * K * H * W);
    float *hx = (float *)malloc(nx * 4), *hw = (float *)malloc(nw * 4), *hb = (float *)malloc((size_t)K * 4);
    float *hy = (float *)malloc(ny * 4);
    void *dx = NULL, *dw = NULL, *db = NULL, *dy = NULL, *ws = NULL, *state = NULL;
    size_t wsz = 0;
    char msg[256] = "";
    int ok = 0;
    double sec = -1, maxerr = 0;
    int64_t bad = 0;
    struct test_node tn;
    struct op_call c;
    struct tensor tx, tw, tb, ty;
    const int64_t pads[4] = {1, 1, 1, 1}, ks[2] = {R, R};
    if (!hx || !hw || !hb || !hy) {
        snprintf(msg, sizeof msg, "out of host memory");
        goto done;
    }
    fill(hx, nx, 3);
    fill(hw, nw, 4);
    fill(hb, (size_t)K, 5);
    if (!KC_CUDA_OK(cudaMalloc(&dx, nx * 4)) || !KC_CUDA_OK(cudaMalloc(&dw, nw * 4)) ||
        !KC_CUDA_OK(cudaMalloc(&db, (size_t)K * 4)) || !KC_CUDA_OK(cudaMalloc(&dy, ny * 4))) {
        snprintf(msg, sizeof msg, "%s", kc_last_error());
        goto done;
    }
    cudaMemcpy(dx, hx, nx * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, hw, nw * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb, (size_t)K * 4, cudaMemcpyHostToDevice);
    tx = {DT_FP32, 4, {N, C, H, W}, dx};
    tw = {DT_FP32, 4, {K, C, R, R}, dw};
    tb = {DT_FP32, 1, {K}, db};
    ty = {DT_FP32, 4, {N, K, H, W}, dy};
    node_init(&tn, "Conv");
    add_ints(&tn, "pads", pads, 4);
    add_ints(&tn, "kernel_shape", ks, 2);
    tn.n.act = ACT_RELU;
    op_call_init(&c, &tn.n, 1, msg, sizeof msg);
    c.in[0] = &tx;
    c.in[1] = &tw;
    c.in[2] = &tb;
    c.nin = 3;
    c.out[0] = &ty;
    c.nout = 1;
    if (!be->iface->supports_op(be, &c) || be->iface->prepare_node(be, &c, &state, &wsz)) {
        if (!msg[0]) snprintf(msg, sizeof msg, "the backend refused the convolution");
        goto done;
    }
    if (wsz && !KC_CUDA_OK(cudaMalloc(&ws, wsz))) {
        snprintf(msg, sizeof msg, "%s", kc_last_error());
        goto done;
    }
    c.state = state;
    c.scratch = ws;
    c.scratch_size = wsz;
    sec = time_node(be, &c, 10, msg, sizeof msg);
    if (sec < 0) goto done;
    cudaMemcpy(hy, dy, ny * 4, cudaMemcpyDeviceToHost);
    {
        uint64_t seed = 11;
        for (int s = 0; s < 256; s++) {
            int64_t n = (int64_t)(lcg(&seed) % N), k = (int64_t)(lcg(&seed) % K);
            int64_t y = (int64_t)(lcg(&seed) % H), x = (int64_t)(lcg(&seed) % W);
            double ref = hb[k];
            for (int64_t ci = 0; ci < C; ci++)
                for (int64_t r = 0; r < R; r++)
                    for (int64_t q = 0; q < R; q++) {
                        int64_t iy = y + r - 1, ix = x + q - 1;
                        if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                        ref += (double)hx[((n * C + ci) * H + iy) * W + ix] * hw[((k * C + ci) * R + r) * R + q];
                    }
            if (ref < 0) ref = 0;
            double err = fabs(hy[((n * K + k) * H + y) * W + x] - ref);
            if (err > maxerr) maxerr = err;
            if (err > 1e-3 + 1e-4 * fabs(ref)) bad++;
        }
    }
    ok = bad == 0;
    fprintf(out, "  Conv FP32 3x3 64->64 56x56 batch 32 + bias + ReLU (cuDNN): %s, max |error| %.2g, %.1f TFLOP/s\n",
            ok ? "correct" : "WRONG", maxerr, 2.0 * N * K * C * R * R * H * W / sec / 1e12);
done:
    if (!ok && sec < 0) fprintf(out, "  Conv self-test FAILED: %s\n", msg);
    if (state) be->iface->release_node(be, &tn.n, state);
    cudaFree(ws);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(db);
    cudaFree(dy);
    free(hx);
    free(hw);
    free(hb);
    free(hy);
    return ok;
}

extern "C" int kiln_cuda_doctor(FILE *out, int self_tests) {
    char why[512] = "", a[16], b[16];
    int dv = 0, rv = 0;
    cudaDriverGetVersion(&dv);
    cudaRuntimeGetVersion(&rv);
    ver(rv, a, sizeof a);
    fprintf(out, "CUDA plugin: built with CUDA %d.%d (runtime %s), cuDNN %d.%d.%d, cuBLAS %d.%d.%d; SASS for compute capabilities %s, PTX for %d\n",
            CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10, a, CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL,
            CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_PATCH, KILN_CUDA_ARCHS, KILN_CUDA_PTX);
    int n = kiln_cuda_probe(why, sizeof why);
    if (dv) {
        ver(dv, b, sizeof b);
        fprintf(out, "NVIDIA driver: supports CUDA %s%s\n", b,
                dv < rv ? " -- older than the runtime: upgrade the driver" : "");
    }
    if (n <= 0) {
        int count = 0;
        cudaError_t e = cudaGetDeviceCount(&count);
        (void)cudaGetLastError();
        /* A GPU is there but cannot be used: a driver (dv != 0; without one
         * cudart also says "insufficient driver") older than the
         * runtime, or devices this build has no code for. */
        if ((dv && (e == cudaErrorInsufficientDriver || dv < rv)) || (e == cudaSuccess && count > 0)) {
            fprintf(out, "GPU: present but not usable: %s\n", why);
            return 1;
        }
        return 2; /* the caller explains why, with the usual causes */
    }
    /* Libraries actually loaded vs built against. */
    size_t dnn = cudnnGetVersion();
    int lt_major = 0, lt_minor = 0, lt_patch = 0;
    size_t ltv = cublasLtGetVersion();
    lt_major = (int)(ltv / 10000);
    lt_minor = (int)(ltv / 100 % 100);
    lt_patch = (int)(ltv % 100);
    fprintf(out, "cuDNN loaded: %zu.%zu.%zu%s\n", dnn / 10000, dnn / 100 % 100, dnn % 100,
            (int)(dnn / 10000) != CUDNN_MAJOR ? " -- a different major version than kiln was built with: install cuDNN 9" : "");
    fprintf(out, "cuBLASLt loaded: %d.%d.%d%s\n", lt_major, lt_minor, lt_patch,
            lt_major != CUBLAS_VER_MAJOR ? " -- a different major version than kiln was built with" : "");
    int count = 0;
    cudaGetDeviceCount(&count);
    int broken = 0;
    for (int i = 0; i < count; i++) {
        cudaDeviceProp p;
        if (!KC_CUDA_OK(cudaGetDeviceProperties(&p, i))) {
            fprintf(out, "device %d: cannot read properties: %s\n", i, kc_last_error());
            broken = 1;
            continue;
        }
        char how[200];
        int runs = kc_build_runs_on(p.major, p.minor, how, sizeof how);
        fprintf(out, "device %d: %s, %.1f GiB, compute capability %d.%d, %d SMs; kiln code: %s\n", i, p.name,
                (double)p.totalGlobalMem / (1 << 30), p.major, p.minor, p.multiProcessorCount, how);
        if (!runs || !self_tests) continue;
        struct backend_params bp = {i, 0};
        char err[512] = "";
        struct backend *be = kiln_cuda_backend_create(&bp, err, sizeof err);
        if (!be) {
            fprintf(out, "  cannot create the CUDA backend: %s\n", err);
            broken = 1;
            continue;
        }
        if (!gemm_test(out, be, DT_FP32)) broken = 1;
        if (!gemm_test(out, be, DT_FP16)) broken = 1;
        if (!conv_test(out, be)) broken = 1;
        be->iface->free(be);
    }
    return broken ? 1 : 0;
}
