/* backend.cpp - libkiln_cuda.so's entry points (kernels/plugin.h) and the
 * CUDA backend's vtable: memory, asynchronous copies through pinned staging,
 * node dispatch (custom kernels in dispatch.cpp, cuBLASLt/cuDNN in blas.cpp),
 * CUDA graph capture and replay.
 *
 * kiln never links CUDA; this object does, and resolves kiln's helpers
 * (op_error, node_attr_*, log_write...) from the kiln binary at dlopen time. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/dispatch.h"


/* ---- checked calls ------------------------------------------------------------ */

static __thread char g_err[512];

const char *kc_last_error(void) { return g_err; }

static const char *base_name(const char *f) {
    const char *s = strrchr(f, '/');
    return s ? s + 1 : f;
}

int kc_cuda_ok(cudaError_t e, const char *call, const char *file, int line) {
    if (e == cudaSuccess) return 1;
    snprintf(g_err, sizeof g_err, "%s at %s:%d: %s (%s)", call, base_name(file), line, cudaGetErrorString(e),
             cudaGetErrorName(e));
    return 0;
}

int kc_cublas_ok(cublasStatus_t e, const char *call, const char *file, int line) {
    if (e == CUBLAS_STATUS_SUCCESS) return 1;
    snprintf(g_err, sizeof g_err, "%s at %s:%d: cuBLAS status %d", call, base_name(file), line, (int)e);
    return 0;
}

int kc_cudnn_ok(cudnnStatus_t e, const char *call, const char *file, int line) {
    if (e == CUDNN_STATUS_SUCCESS) return 1;
    snprintf(g_err, sizeof g_err, "%s at %s:%d: %s", call, base_name(file), line, cudnnGetErrorString(e));
    return 0;
}

int kc_build_runs_on(int major, int minor, char *how, size_t how_len) {
    int cc = major * 10 + minor, best = -1;
    const char *p = KILN_CUDA_ARCHS;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10);
        if (end == p) break;
        /* SASS runs on the same major at an equal or higher minor. */
        if (a / 10 == major && a <= cc && a > best) best = (int)a;
        p = end;
    }
    if (best >= 0) {
        snprintf(how, how_len, "SASS sm_%d", best);
        return 1;
    }
    if (KILN_CUDA_PTX <= cc) {
        snprintf(how, how_len, "PTX compute_%d (JIT-compiled by the driver at first load)", KILN_CUDA_PTX);
        return 1;
    }
    snprintf(how, how_len, "none (this build has SASS for sm_%s and PTX for compute_%d)", KILN_CUDA_ARCHS, KILN_CUDA_PTX);
    return 0;
}

/* ---- probe -------------------------------------------------------------------- */

static void version_str(int v, char *buf, size_t n) { snprintf(buf, n, "%d.%d", v / 1000, (v % 1000) / 10); }

/* The driver branch CUDA 13.0 needs (NVIDIA's compatibility table). */
static const char *driver_for_runtime(int rt) {
    if (rt >= 13000) return "580";
    if (rt >= 12000) return "525";
    return "450";
}

extern "C" int kiln_cuda_probe(char *why, size_t why_len) {
    char tmp[512];
    if (!why) {
        why = tmp;
        why_len = sizeof tmp;
    }
    why[0] = 0;
    /* Look for the driver first: cudart's own message for its absence
     * ("insufficient driver") misleads when there is no driver at all. */
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!drv) {
        snprintf(why, why_len,
                 "no NVIDIA driver: libcuda.so.1 was not found (install the NVIDIA driver; in a container, start it "
                 "with --gpus all and the NVIDIA Container Toolkit)");
        return 0;
    }
    dlclose(drv);
    int dv = 0, rv = 0;
    cudaDriverGetVersion(&dv);
    cudaRuntimeGetVersion(&rv);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        char dvs[16], rvs[16];
        version_str(dv, dvs, sizeof dvs);
        version_str(rv, rvs, sizeof rvs);
        if (e == cudaErrorNoDevice)
            snprintf(why, why_len,
                     "the NVIDIA driver (CUDA %s) sees no GPU (in a container: start it with --gpus all; check "
                     "nvidia-smi and CUDA_VISIBLE_DEVICES)", dvs);
        else if (e == cudaErrorInsufficientDriver || (dv && dv < rv))
            snprintf(why, why_len,
                     "the NVIDIA driver is too old: it supports CUDA %s, kiln's CUDA plugin needs CUDA %s; upgrade "
                     "the driver to the %s branch or newer", dvs, rvs, driver_for_runtime(rv));
        else
            snprintf(why, why_len, "CUDA cannot start: %s (%s); driver CUDA %s, runtime %s", cudaGetErrorString(e),
                     cudaGetErrorName(e), dvs, rvs);
        return 0;
    }
    int usable = 0;
    char last[160] = "";
    for (int i = 0; i < n; i++) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
        char how[160];
        if (kc_build_runs_on(prop.major, prop.minor, how, sizeof how)) usable++;
        else snprintf(last, sizeof last, "%s (compute capability %d.%d): %s", prop.name, prop.major, prop.minor, how);
    }
    if (!usable)
        snprintf(why, why_len, "no GPU this build can run on: %s", last[0] ? last : "device properties unreadable");
    return usable;
}

/* ---- the backend ----------------------------------------------------------------- */

struct kc_node_state {
    int lib; /* 1: blas.cpp state, 0: dispatch.cpp state */
    void *inner;
};

static struct kc_instance *inst(struct backend *be) { return (struct kc_instance *)be->context; }

static int fail_status(const char *what) {
    log_error("CUDA %s: %s", what, kc_last_error());
    return STATUS_INTERNAL;
}

static void cuda_free(struct backend *be) {
    if (!be) return;
    struct kc_instance *in = inst(be);
    if (in) {
        cudaSetDevice(in->device);
        if (in->stream) cudaStreamSynchronize(in->stream);
        if (in->dnn) cudnnDestroy(in->dnn);
        if (in->lt) cublasLtDestroy(in->lt);
        if (in->stream) cudaStreamDestroy(in->stream);
        if (in->stage) cudaFreeHost(in->stage);
        free(in->pend);
        free(in);
    }
    free(be);
}

static void *cuda_buffer_alloc(struct backend *be, size_t size) {
    void *p = NULL;
    cudaSetDevice(inst(be)->device);
    if (!KC_CUDA_OK(cudaMalloc(&p, size ? size : 256))) {
        log_error("CUDA device memory: %s (asked for %zu bytes)", kc_last_error(), size);
        return NULL;
    }
    return p;
}

static void cuda_buffer_free(struct backend *be, void *ptr) {
    if (!ptr) return;
    struct kc_instance *in = inst(be);
    cudaStreamSynchronize(in->stream); /* queued work may still use it */
    cudaFree(ptr);
}

/* Makes room for n bytes of staging; waits for queued copies when it must
 * reuse or grow the buffer. */
static int stage_reserve(struct kc_instance *in, size_t n) {
    size_t need = (in->stage_off + n + 255) & ~(size_t)255;
    if (need <= in->stage_cap) return 0;
    if (in->capturing) return -1; /* cannot wait inside a capture */
    if (!KC_CUDA_OK(cudaStreamSynchronize(in->stream))) return -1;
    for (int i = 0; i < in->npend; i++) memcpy(in->pend[i].dst, in->stage + in->pend[i].off, in->pend[i].n);
    in->npend = 0;
    in->stage_off = 0;
    if (n <= in->stage_cap) return 0;
    size_t cap = in->stage_cap ? in->stage_cap : (1u << 20);
    while (cap < n) cap *= 2;
    if (in->stage) cudaFreeHost(in->stage);
    in->stage = NULL;
    in->stage_cap = 0;
    if (!KC_CUDA_OK(cudaHostAlloc((void **)&in->stage, cap, cudaHostAllocDefault))) return -1;
    in->stage_cap = cap;
    return 0;
}

/* Copies above this go directly (weights at plan time): staging exists to
 * overlap per-batch copies, and would otherwise pin the model's size. */
#define KC_STAGE_MAX ((size_t)64 << 20)

static int cuda_copy_to_device(struct backend *be, void *dst, const void *src, size_t size) {
    struct kc_instance *in = inst(be);
    if (!size) return 0;
    cudaSetDevice(in->device); /* the current device is per thread; instances run on their own threads */
    if (size > KC_STAGE_MAX || stage_reserve(in, size)) {
        /* Staging unavailable (capture, or pinned memory refused): a plain
         * synchronous copy is still correct. */
        if (in->capturing || !KC_CUDA_OK(cudaMemcpy(dst, src, size, cudaMemcpyHostToDevice))) return fail_status("copy to device");
        return 0;
    }
    unsigned char *st = in->stage + in->stage_off;
    memcpy(st, src, size);
    in->stage_off = (in->stage_off + size + 255) & ~(size_t)255;
    if (!KC_CUDA_OK(cudaMemcpyAsync(dst, st, size, cudaMemcpyHostToDevice, in->stream))) return fail_status("copy to device");
    return 0;
}

static int cuda_copy_to_host(struct backend *be, void *dst, const void *src, size_t size) {
    struct kc_instance *in = inst(be);
    if (!size) return 0;
    cudaSetDevice(in->device);
    if (size > KC_STAGE_MAX || stage_reserve(in, size)) {
        if (in->capturing || !KC_CUDA_OK(cudaStreamSynchronize(in->stream)) ||
            !KC_CUDA_OK(cudaMemcpy(dst, src, size, cudaMemcpyDeviceToHost)))
            return fail_status("copy to host");
        return 0;
    }
    if (in->npend == in->pend_cap) {
        int cap = in->pend_cap ? in->pend_cap * 2 : 16;
        void *p = realloc(in->pend, (size_t)cap * sizeof *in->pend);
        if (!p) return STATUS_NOMEM;
        in->pend = (struct kc_instance::pending_out *)p;
        in->pend_cap = cap;
    }
    if (!KC_CUDA_OK(cudaMemcpyAsync(in->stage + in->stage_off, src, size, cudaMemcpyDeviceToHost, in->stream)))
        return fail_status("copy to host");
    in->pend[in->npend].dst = dst;
    in->pend[in->npend].off = in->stage_off;
    in->pend[in->npend].n = size;
    in->npend++;
    in->stage_off = (in->stage_off + size + 255) & ~(size_t)255;
    return 0;
}

static int cuda_synchronize(struct backend *be) {
    struct kc_instance *in = inst(be);
    if (!KC_CUDA_OK(cudaStreamSynchronize(in->stream))) return fail_status("stream");
    for (int i = 0; i < in->npend; i++) memcpy(in->pend[i].dst, in->stage + in->pend[i].off, in->pend[i].n);
    in->npend = 0;
    in->stage_off = 0;
    return 0;
}

/* Library (cuBLASLt/cuDNN) when it takes the node, else the custom kernels
 * (pooling shapes cuDNN refuses: ceil_mode, asymmetric pads, dilations, 3-D). */
static int use_lib(struct kc_instance *in, const struct op_call *c, char *why, size_t why_len) {
    return kc_lib_handles(c->node->op_type) && kc_lib_supports(in, c, why, why_len);
}

static int cuda_supports_op(struct backend *be, const struct op_call *c) {
    char why[256] = "", why2[256] = "";
    int ok = use_lib(inst(be), c, why, sizeof why) || kd_supports(c, why2, sizeof why2);
    if (why2[0]) snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s", why[0] ? "; " : "", why2);
    if (!ok) log_debug("node '%s' (%s) stays on the CPU: %s", c->node->name, c->node->op_type, why);
    return ok;
}

static int cuda_prepare_node(struct backend *be, struct op_call *c, void **state, size_t *workspace) {
    struct kc_instance *in = inst(be);
    *state = NULL;
    *workspace = 0;
    struct kc_node_state *ns = (struct kc_node_state *)calloc(1, sizeof *ns);
    if (!ns) return op_error(c, "out of memory");
    cudaSetDevice(in->device);
    int rc;
    if (use_lib(in, c, NULL, 0)) {
        ns->lib = 1;
        rc = kc_lib_prepare(in, c, &ns->inner, workspace);
    } else {
        rc = kd_prepare(c, &ns->inner);
    }
    if (rc) {
        free(ns);
        return rc;
    }
    *state = ns;
    return 0;
}

static int cuda_run_node(struct backend *be, struct op_call *c) {
    struct kc_instance *in = inst(be);
    struct kc_node_state *ns = (struct kc_node_state *)c->state;
    if (!in->capturing) cudaSetDevice(in->device); /* per thread; not a call to make inside a capture */
    /* Not prepared: refused, as building here would decode the node's
     * attributes on every run. */
    if (!ns) return op_error(c, "the CUDA backend runs this op only once prepared");
    return ns->lib ? kc_lib_run(in, c, ns->inner) : kd_run(c, ns->inner, in->stream);
}

static void cuda_release_node(struct backend *be, const struct graph_node *node, void *state) {
    (void)be;
    (void)node;
    struct kc_node_state *ns = (struct kc_node_state *)state;
    if (!ns) return;
    if (ns->lib) kc_lib_release(ns->inner);
    else kd_release(ns->inner);
    free(ns);
}

/* CUDA graphs: the kernels queued between begin and end are captured once
 * and replayed with the same buffers; copies through staging are not part
 * of a capture (the plan uploads inputs before replaying). */
static int cuda_graph_begin(struct backend *be) {
    struct kc_instance *in = inst(be);
    if (!KC_CUDA_OK(cudaStreamBeginCapture(in->stream, cudaStreamCaptureModeThreadLocal))) return fail_status("graph capture");
    in->capturing = 1;
    return 0;
}

static int cuda_graph_end(struct backend *be, void **graph) {
    struct kc_instance *in = inst(be);
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    in->capturing = 0;
    *graph = NULL;
    if (!KC_CUDA_OK(cudaStreamEndCapture(in->stream, &g))) return fail_status("graph capture");
    int ok = KC_CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
    cudaGraphDestroy(g);
    if (!ok) return fail_status("graph instantiate");
    *graph = exec;
    return 0;
}

static int cuda_graph_replay(struct backend *be, void *graph) {
    if (!KC_CUDA_OK(cudaGraphLaunch((cudaGraphExec_t)graph, inst(be)->stream))) return fail_status("graph launch");
    return 0;
}

static void cuda_graph_free(struct backend *be, void *graph) {
    (void)be;
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

static const struct backend_i g_cuda_iface = {
    "cuda",
    cuda_free,
    cuda_buffer_alloc,
    cuda_buffer_free,
    cuda_copy_to_device,
    cuda_copy_to_host,
    cuda_supports_op,
    cuda_prepare_node,
    cuda_run_node,
    cuda_release_node,
    cuda_synchronize,
    cuda_graph_begin,
    cuda_graph_end,
    cuda_graph_replay,
    cuda_graph_free,
};

extern "C" struct backend *kiln_cuda_backend_create(const struct backend_params *p, char *why, size_t why_len) {
    char tmp[512];
    if (!why) {
        why = tmp;
        why_len = sizeof tmp;
    }
    int ndev = kiln_cuda_probe(why, why_len);
    if (ndev <= 0) return NULL;
    int dev = p ? p->device : 0, count = 0;
    cudaGetDeviceCount(&count);
    if (dev < 0 || dev >= count) {
        snprintf(why, why_len, "CUDA device %d does not exist (this machine has %d)", dev, count);
        return NULL;
    }
    struct backend *be = (struct backend *)calloc(1, sizeof *be);
    struct kc_instance *in = (struct kc_instance *)calloc(1, sizeof *in);
    if (!be || !in) {
        free(be);
        free(in);
        snprintf(why, why_len, "out of memory");
        return NULL;
    }
    be->iface = &g_cuda_iface;
    be->context = in;
    be->device = dev;
    be->host_memory = 0;
    in->device = dev;
    const char *ws = getenv("KILN_CUDA_WORKSPACE_MB");
    in->workspace_limit = (size_t)(ws && atoi(ws) > 0 ? atoi(ws) : 256) << 20;
    if (!KC_CUDA_OK(cudaSetDevice(dev)) || !KC_CUDA_OK(cudaStreamCreateWithFlags(&in->stream, cudaStreamNonBlocking)) ||
        !KC_CUBLAS_OK(cublasLtCreate(&in->lt)) || !KC_CUDNN_OK(cudnnCreate(&in->dnn)) ||
        !KC_CUDNN_OK(cudnnSetStream(in->dnn, in->stream)) || stage_reserve(in, 4u << 20)) {
        snprintf(why, why_len, "CUDA backend on device %d: %s", dev, kc_last_error());
        cuda_free(be);
        return NULL;
    }
    return be;
}
