/* doctor.c - `kiln doctor`: what a cloud GPU user needs to know before
 * serving: is there a driver, a GPU, the right libraries, and does the GPU
 * compute correctly and fast? And if not, why, and what runs instead.
 *
 * The GPU half lives in the CUDA plugin (kiln_cuda_doctor in
 * kernels/cuda/doctor_gpu.cpp) because kiln itself never links CUDA; this
 * file looks at the driver on its own (dlopen of libcuda.so.1) so that it
 * can explain a missing or broken plugin too, and reports the CPU backend. */
#include <dlfcn.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <oneapi/dnnl/dnnl.h>

#include "kernels/backend.h"
#include "kernels/plugin.h"
#include "commands/commands.h"

enum { DOCTOR_GPU_OK = 0, DOCTOR_GPU_BROKEN = 1, DOCTOR_NO_GPU = 2 };

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln doctor [--no-self-test]\n"
            "\n"
            "Checks the GPU environment and says what kiln will run on:\n"
            "  NVIDIA driver version vs the CUDA runtime kiln's plugin was built with,\n"
            "  each GPU (name, memory, compute capability, whether this build has code for it),\n"
            "  cuDNN and cuBLAS versions vs those kiln was built against,\n"
            "  a GEMM (cuBLASLt) and a convolution (cuDNN) self-test checked against the CPU,\n"
            "  with the TFLOP/s achieved; then the CPU backend (threads, oneDNN version).\n"
            "\n"
            "options:\n"
            "  --no-self-test   skip the GPU self-tests (faster; versions and devices only)\n"
            "\n"
            "exit codes:\n"
            "  0  a GPU is usable: `kiln serve --backend auto` runs on it\n"
            "  1  a GPU is present but broken (driver too old, self-test wrong, library mismatch)\n"
            "  2  no usable GPU: kiln serves on the CPU (the reason is printed)\n");
}

/* ---- driver, without the plugin ---------------------------------------------- */

struct driver_facts {
    int loaded;      /* libcuda.so.1 found */
    int version;     /* cuDriverGetVersion, e.g. 13000; 0 unknown */
    int init_rc;     /* cuInit's CUresult; -1 not called */
    int devices;     /* cuDeviceGetCount, -1 unknown */
    char err[256];
};

static void driver_probe(struct driver_facts *d) {
    memset(d, 0, sizeof *d);
    d->init_rc = -1;
    d->devices = -1;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(d->err, sizeof d->err, "%s", dlerror());
        return;
    }
    d->loaded = 1;
    int (*get_version)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    if (get_version) get_version(&d->version);
    if (init) d->init_rc = init(0);
    if (d->init_rc == 0 && count && count(&d->devices) != 0) d->devices = -1;
    /* Kept loaded: unloading a driver after cuInit is not supported. */
}

static int any_nvidia_device_node(void) {
    return access("/dev/nvidiactl", F_OK) == 0 || access("/dev/nvidia0", F_OK) == 0;
}

static void explain_no_gpu(FILE *f, const struct driver_facts *d, const char *why) {
    fprintf(f, "GPU: none usable -- %s\n", why[0] ? why : "no CUDA device");
    fprintf(f, "  Usual causes, most likely first:\n");
    if (!d->loaded) {
        fprintf(f, "  - no NVIDIA driver on this machine (libcuda.so.1 not found: %s)\n", d->err);
        if (any_nvidia_device_node())
            fprintf(f, "    /dev/nvidia* exists, so a GPU is passed in but its user-space driver is not mounted:\n"
                       "    the NVIDIA Container Toolkit is missing or not configured (nvidia-ctk runtime configure)\n");
        else
            fprintf(f, "  - in a container: it was started without `--gpus all` (docker) or without a GPU\n"
                       "    resource request (Kubernetes: nvidia.com/gpu), so no /dev/nvidia* device is visible\n"
                       "  - the NVIDIA Container Toolkit is not installed on the host, so --gpus cannot work\n");
    } else if (d->init_rc == 100 /* CUDA_ERROR_NO_DEVICE */ || d->devices == 0) {
        fprintf(f, "  - the driver is there but sees no GPU: in a container, start it with `--gpus all`;\n"
                   "    check `nvidia-smi` and that CUDA_VISIBLE_DEVICES is not empty or -1\n");
    } else if (d->init_rc == 35 /* CUDA_ERROR_INSUFFICIENT_DRIVER */ || d->init_rc == 803 /* SYSTEM_DRIVER_MISMATCH */) {
        fprintf(f, "  - the kernel module and the user-space driver do not match (reboot after a driver\n"
                   "    upgrade, or mount the host's libcuda into the container via the Container Toolkit)\n");
    } else if (d->init_rc > 0) {
        fprintf(f, "  - the driver failed to initialize (cuInit error %d): see `nvidia-smi` and dmesg\n", d->init_rc);
    }
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (cvd && (!*cvd || strcmp(cvd, "-1") == 0 || strcmp(cvd, "none") == 0))
        fprintf(f, "  - CUDA_VISIBLE_DEVICES='%s' hides every GPU\n", cvd);
}

/* ---- CPU ------------------------------------------------------------------------ */

static void cpu_model(char *buf, size_t n) {
    snprintf(buf, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(buf, n, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

static void report_cpu(FILE *f) {
    struct backend_params p = {-1, 0};
    char why[256] = "";
    struct backend *be = backend_create("cpu", &p, why, sizeof why);
    const dnnl_version_t *v = dnnl_version();
    char model[256];
    cpu_model(model, sizeof model);
    fprintf(f, "CPU backend: %s, %d threads (%d cores online), %s\n", be ? be->iface->name : "unavailable",
            omp_get_max_threads(), (int)sysconf(_SC_NPROCESSORS_ONLN), model);
    fprintf(f, "  oneDNN %d.%d.%d (%s runtime)%s%s\n", v->major, v->minor, v->patch,
            v->cpu_runtime == DNNL_RUNTIME_OMP   ? "OpenMP"
            : v->cpu_runtime == DNNL_RUNTIME_TBB ? "TBB"
            : v->cpu_runtime == DNNL_RUNTIME_SEQ ? "sequential"
                                                 : "other",
            be ? "" : " -- ", be ? "" : why);
    backend_free(be);
}

/* ---- the command ------------------------------------------------------------------ */

int cmd_doctor(int argc, char **argv) {
    int self_tests = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--no-self-test")) self_tests = 0;
        else {
            fprintf(stderr, "kiln doctor: unknown option '%s'\n\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    FILE *f = stdout;
    printf("kiln %s doctor\n", KILN_VERSION);
    struct driver_facts d;
    driver_probe(&d);
    if (d.loaded)
        printf("NVIDIA driver: libcuda.so.1 loaded, supports CUDA %d.%d, %d device(s)%s\n", d.version / 1000,
               (d.version % 1000) / 10, d.devices < 0 ? 0 : d.devices,
               d.init_rc > 0 ? " (cuInit failed)" : "");
    else
        printf("NVIDIA driver: not found\n");

    int rc = DOCTOR_NO_GPU;
    char why[512] = "";
    void *h = plugin_cuda_handle(why, sizeof why);
    if (!h) {
        printf("CUDA plugin: not loaded -- %s\n", why);
        if (d.loaded && d.devices > 0) {
            /* A GPU is there; only kiln's plugin is missing or cannot load. */
            printf("GPU: %d device(s) present, but kiln cannot use them without its CUDA plugin\n"
                   "  (build it with `make` where nvcc exists, or put libkiln_cuda.so beside the kiln binary;\n"
                   "  a load error naming libcudnn or libcublasLt means cuDNN 9 / cuBLAS 13 are not installed)\n",
                   d.devices);
            rc = DOCTOR_GPU_BROKEN;
        } else {
            explain_no_gpu(f, &d, d.loaded ? "the driver sees no device" : "no NVIDIA driver");
        }
    } else {
        printf("CUDA plugin: %s\n", plugin_cuda_path());
        int (*doctor)(FILE *, int) = (int (*)(FILE *, int))dlsym(h, "kiln_cuda_doctor");
        if (!doctor) {
            printf("CUDA plugin: does not export kiln_cuda_doctor (an older build?)\n");
            rc = DOCTOR_GPU_BROKEN;
        } else {
            fflush(stdout);
            rc = doctor(f, self_tests);
            if (rc == DOCTOR_NO_GPU) {
                char pwhy[512] = "";
                plugin_cuda_probe(pwhy, sizeof pwhy);
                explain_no_gpu(f, &d, pwhy);
            }
        }
    }
    report_cpu(f);
    switch (rc) {
    case DOCTOR_GPU_OK: printf("verdict: GPU usable (exit 0)\n"); break;
    case DOCTOR_GPU_BROKEN: printf("verdict: a GPU is present but not usable; serving would fall back to the CPU (exit 1)\n"); break;
    default: printf("verdict: no GPU; kiln serves on the CPU backend (exit 2)\n"); break;
    }
    return rc;
}
