/* emu_compare.cpp - a model's FP32 and FP16 plans on the emulated CUDA
 * backend against the CPU: the real dispatcher and custom kernels (k_*.cu
 * under the CUDA-on-CPU harness); MatMul/Gemm/Conv, which need cuBLASLt and
 * cuDNN, run on the CPU in FP32 between conversions. Prints, per output,
 * the largest difference (FP32) or how many elements agree (INT64).
 *
 * Build (after `make`, which builds the emulated kernel objects):
 *   g++ -I. -Ibuild/gen -D_GNU_SOURCE -std=c++17 -O2 -DKILN_CUDA_EMU -o build/fp16_emu_compare \
 *     tools/fp16_accuracy/emu_compare.cpp build/obj/emu/k_*.o build/obj/emu/dispatch.o build/obj/emu/emu.o \
 *     build/libkiln.a -fopenmp -pthread -rdynamic -levent -levent_pthreads -lcjson -lhiredis -ldnnl \
 *     -lprotobuf-c -lsodium -lz -ldl -lm
 * Run: build/fp16_emu_compare MODEL.onnx [INPUT.npy]  (float32 [N, C]; without
 * it a [1,3,224,224] image in [-1, 1], the same one tests/models/test_fp16.c uses). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cuda/dispatch.h"
extern "C" {
#include "kernels/backend.h"
#include "models/model.h"
}
static int g_dev, g_cpu;
static void emu_free(struct backend *be) { free(be); }
static void *emu_alloc(struct backend *be, size_t n) { (void)be; void *p = NULL; cudaMalloc(&p, n ? n : 1); return p; }
static void emu_buf_free(struct backend *be, void *p) { (void)be; cudaFree(p); }
static int emu_copy(struct backend *be, void *d, const void *s, size_t n) { (void)be; if (n) memcpy(d, s, n); return 0; }
static int emu_supports(struct backend *be, const struct op_call *c) {
    (void)be;
    char why[256] = "";
    int ok = kd_supports(c, why, sizeof why);
    (ok ? g_dev : g_cpu)++;
    if (!ok) fprintf(stderr, "  CPU: %s (%s): %s\n", c->node->name, c->node->op_type, why);
    return ok;
}
static int emu_prepare(struct backend *be, struct op_call *c, void **state, size_t *ws) { (void)be; *ws = 0; return kd_prepare(c, state); }
static int emu_run(struct backend *be, struct op_call *c) { (void)be; return kd_run(c, c->state, 0); }
static void emu_release(struct backend *be, const struct graph_node *n, void *state) { (void)be; (void)n; kd_release(state); }
static int emu_sync(struct backend *be) { (void)be; return 0; }
static const struct backend_i g_emu_iface = {
    "cuda-emulated", emu_free, emu_alloc, emu_buf_free, emu_copy, emu_copy, emu_supports, emu_prepare,
    emu_run, emu_release, emu_sync, NULL, NULL, NULL, NULL,
};
static float *read_npy(const char *path, long long *r, long long *c) {
    FILE *f = fopen(path, "rb"); unsigned char pre[10]; char hdr[512] = "";
    if (!f || fread(pre, 1, 10, f) != 10) return NULL;
    size_t hl = pre[8] | pre[9] << 8;
    if (fread(hdr, 1, hl, f) != hl) return NULL;
    sscanf(strstr(hdr, "'shape': ("), "'shape': (%lld, %lld)", r, c);
    float *d = (float *)malloc(*r * *c * 4);
    if (fread(d, 4, *r * *c, f) != (size_t)(*r * *c)) return NULL;
    fclose(f);
    return d;
}
int main(int argc, char **argv) {
    const char *path = argv[1];
    struct tensor in;
    memset(&in, 0, sizeof in);
    in.dtype = DT_FP32;
    long long r = 0, c = 0;
    if (argc > 2) {
        float *x = read_npy(argv[2], &r, &c);
        in.ndim = 2; in.dims[0] = r; in.dims[1] = c; in.data = x;
    } else {
        float *x = (float *)malloc(3 * 224 * 224 * 4);
        unsigned s = 17;
        for (int i = 0; i < 3 * 224 * 224; i++) { s = s * 1664525u + 1013904223u; x[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f; }
        in.ndim = 4; in.dims[0] = 1; in.dims[1] = 3; in.dims[2] = 224; in.dims[3] = 224; in.data = x;
    }
    for (int fp16 = 0; fp16 <= 1; fp16++) {
        char err[512] = "";
        struct model_params mp; memset(&mp, 0, sizeof mp); mp.path = path; mp.fp16 = fp16;
        struct model *m = model_load(&mp, err, sizeof err);
        if (!m) { fprintf(stderr, "%s\n", err); return 1; }
        int no = model_noutputs(m);
        struct backend *be = (struct backend *)calloc(1, sizeof *be);
        be->iface = &g_emu_iface; be->host_memory = 0;
        struct model_exec *cpu = model_exec_create(m, NULL, 2), *dev = model_exec_create(m, be, 1);
        struct tensor a[4], b[4];
        g_dev = g_cpu = 0;
        if (model_run(cpu, &in, 1, a, no, err, sizeof err)) { fprintf(stderr, "cpu %s\n", err); return 1; }
        if (model_run(dev, &in, 1, b, no, err, sizeof err)) { fprintf(stderr, "dev %s\n", err); return 1; }
        printf("%s: %d nodes on the emulated device, %d on the CPU\n", fp16 ? "FP16" : "FP32", g_dev, g_cpu);
        for (int o = 0; o < no; o++) {
            long long n = tensor_numel(&a[o]), same = 0; double md = 0, mr = 0;
            for (long long i = 0; i < n; i++) {
                if (a[o].dtype == DT_FP32) { double d = fabs(((float *)a[o].data)[i] - ((float *)b[o].data)[i]); if (d > md) md = d; if (fabs(((float *)a[o].data)[i]) > mr) mr = fabs(((float *)a[o].data)[i]); }
                else if (a[o].dtype == DT_INT64) same += ((long long *)a[o].data)[i] == ((long long *)b[o].data)[i];
            }
            if (a[o].dtype == DT_FP32) printf("  output %d (%s): max |diff| %.3e, largest |ref| %.3e\n", o, dtype_name(b[o].dtype), md, mr);
            else printf("  output %d (%s): %lld/%lld equal\n", o, dtype_name(b[o].dtype), same, n);
            free(a[o].data); free(b[o].data);
        }
        model_exec_free(dev); model_exec_free(cpu); backend_free(be); model_free(m);
    }
    return 0;
}
