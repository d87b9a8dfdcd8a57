/* gpu_metrics.c - NVML through dlopen; see gpu_metrics.h. */
#include "server/gpu_metrics.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* The few NVML declarations used, from nvml.h's stable ABI. */
typedef struct nvml_device *nvml_device_t;
struct nvml_utilization {
    unsigned int gpu, memory;
};
struct nvml_memory {
    unsigned long long total, free, used;
};
#define NVML_SUCCESS 0
#define NVML_TEMPERATURE_GPU 0

static struct {
    int ok;
    int (*init)(void);
    int (*count)(unsigned int *);
    int (*handle)(unsigned int, nvml_device_t *);
    int (*uuid)(nvml_device_t, char *, unsigned int);
    int (*util)(nvml_device_t, struct nvml_utilization *);
    int (*mem)(nvml_device_t, struct nvml_memory *);
    int (*temp)(nvml_device_t, int, unsigned int *);
    int (*power)(nvml_device_t, unsigned int *);
    int (*limit)(nvml_device_t, unsigned int *);
    int (*energy)(nvml_device_t, unsigned long long *);
} g_nvml;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void nvml_load(void) {
    const char *path = getenv("KILN_NVML_LIBRARY");
    void *h = dlopen(path && *path ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        log_debug("no GPU metrics: %s", dlerror());
        return;
    }
#define SYM(field, name) *(void **)&g_nvml.field = dlsym(h, name)
    SYM(init, "nvmlInit_v2");
    SYM(count, "nvmlDeviceGetCount_v2");
    SYM(handle, "nvmlDeviceGetHandleByIndex_v2");
    SYM(uuid, "nvmlDeviceGetUUID");
    SYM(util, "nvmlDeviceGetUtilizationRates");
    SYM(mem, "nvmlDeviceGetMemoryInfo");
    SYM(temp, "nvmlDeviceGetTemperature");
    SYM(power, "nvmlDeviceGetPowerUsage");
    SYM(limit, "nvmlDeviceGetEnforcedPowerLimit");
    SYM(energy, "nvmlDeviceGetTotalEnergyConsumption");
#undef SYM
    if (!g_nvml.init || !g_nvml.count || !g_nvml.handle) {
        log_warn("no GPU metrics: %s lacks nvmlInit_v2/nvmlDeviceGetCount_v2", path && *path ? path : "libnvidia-ml.so.1");
        return;
    }
    int rc = g_nvml.init();
    if (rc != NVML_SUCCESS) {
        log_info("no GPU metrics: nvmlInit failed (NVML error %d)", rc);
        return;
    }
    g_nvml.ok = 1; /* kept loaded and initialized for the process's life */
}

struct buf {
    char *p;
    size_t len, cap;
    int oom;
};

static void bprintf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(struct buf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

#define NMETRICS 7
static const struct {
    const char *name, *type, *help;
} g_defs[NMETRICS] = {
    {"kiln_gpu_utilization", "gauge", "Fraction of the last sample period during which a kernel ran on the GPU (0..1)."},
    {"kiln_gpu_memory_used_bytes", "gauge", "GPU memory in use, bytes."},
    {"kiln_gpu_memory_total_bytes", "gauge", "GPU memory in total, bytes."},
    {"kiln_gpu_temperature_celsius", "gauge", "GPU core temperature, degrees Celsius."},
    {"kiln_gpu_power_usage_watts", "gauge", "GPU power draw, watts."},
    {"kiln_gpu_power_limit_watts", "gauge", "GPU enforced power limit, watts."},
    {"kiln_gpu_energy_consumption_joules", "counter", "GPU energy consumed since the driver was loaded, joules."},
};

char *gpu_metrics_text(void) {
    pthread_once(&g_once, nvml_load);
    struct buf b = {malloc(4096), 0, 4096, 0};
    if (!b.p) return NULL;
    b.p[0] = 0;
    unsigned int n = 0;
    if (!g_nvml.ok || g_nvml.count(&n) != NVML_SUCCESS || n == 0) return b.p;
    if (n > 64) n = 64;
    struct {
        int have[NMETRICS];
        double v[NMETRICS];
        char uuid[96];
    } dev[64];
    memset(dev, 0, sizeof dev);
    for (unsigned int i = 0; i < n; i++) {
        nvml_device_t d;
        if (g_nvml.handle(i, &d) != NVML_SUCCESS) continue;
        if (!g_nvml.uuid || g_nvml.uuid(d, dev[i].uuid, sizeof dev[i].uuid) != NVML_SUCCESS)
            snprintf(dev[i].uuid, sizeof dev[i].uuid, "unknown");
        /* The UUID goes into a label: keep it to characters that need no escaping. */
        for (char *c = dev[i].uuid; *c; c++)
            if (*c == '"' || *c == '\\' || *c == '\n') *c = '_';
        struct nvml_utilization u;
        struct nvml_memory m;
        unsigned int t, mw;
        unsigned long long mj;
        if (g_nvml.util && g_nvml.util(d, &u) == NVML_SUCCESS) dev[i].have[0] = 1, dev[i].v[0] = u.gpu / 100.0;
        if (g_nvml.mem && g_nvml.mem(d, &m) == NVML_SUCCESS) {
            dev[i].have[1] = dev[i].have[2] = 1;
            dev[i].v[1] = (double)m.used;
            dev[i].v[2] = (double)m.total;
        }
        if (g_nvml.temp && g_nvml.temp(d, NVML_TEMPERATURE_GPU, &t) == NVML_SUCCESS) dev[i].have[3] = 1, dev[i].v[3] = t;
        if (g_nvml.power && g_nvml.power(d, &mw) == NVML_SUCCESS) dev[i].have[4] = 1, dev[i].v[4] = mw / 1000.0;
        if (g_nvml.limit && g_nvml.limit(d, &mw) == NVML_SUCCESS) dev[i].have[5] = 1, dev[i].v[5] = mw / 1000.0;
        if (g_nvml.energy && g_nvml.energy(d, &mj) == NVML_SUCCESS) dev[i].have[6] = 1, dev[i].v[6] = mj / 1000.0;
    }
    for (int k = 0; k < NMETRICS; k++) {
        int any = 0;
        for (unsigned int i = 0; i < n; i++) any |= dev[i].have[k];
        if (!any) continue;
        bprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", g_defs[k].name, g_defs[k].help, g_defs[k].name, g_defs[k].type);
        for (unsigned int i = 0; i < n; i++)
            if (dev[i].have[k]) bprintf(&b, "%s{gpu=\"%u\",gpu_uuid=\"%s\"} %.15g\n", g_defs[k].name, i, dev[i].uuid, dev[i].v[k]);
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
