/* fake_nvml.c - a stand-in for libnvidia-ml.so.1 with two GPUs and fixed
 * readings, so tests/server/test_gpu_metrics can check the /metrics text
 * without a GPU (loaded through $KILN_NVML_LIBRARY). GPU 1 reports no
 * energy counter and no temperature, as some boards do. */
#include <stdio.h>
#include <string.h>

struct nvml_utilization {
    unsigned int gpu, memory;
};
struct nvml_memory {
    unsigned long long total, free, used;
};
typedef struct nvml_device *nvml_device_t;

static int g_inited;

int nvmlInit_v2(void) { g_inited = 1; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return g_inited ? 0 : 1; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvml_device_t *d) {
    if (i > 1) return 2;
    *d = (nvml_device_t)(unsigned long)(i + 1);
    return 0;
}
static unsigned idx(nvml_device_t d) { return (unsigned)(unsigned long)d - 1; }
int nvmlDeviceGetUUID(nvml_device_t d, char *buf, unsigned int len) {
    snprintf(buf, len, "GPU-0000000%u-aaaa-bbbb-cccc-dddddddddddd", idx(d));
    return 0;
}
int nvmlDeviceGetUtilizationRates(nvml_device_t d, struct nvml_utilization *u) {
    u->gpu = idx(d) ? 100 : 42;
    u->memory = 7;
    return 0;
}
int nvmlDeviceGetMemoryInfo(nvml_device_t d, struct nvml_memory *m) {
    m->total = 150754820096ull;
    m->used = idx(d) ? 0 : 1073741824ull;
    m->free = m->total - m->used;
    return 0;
}
int nvmlDeviceGetTemperature(nvml_device_t d, int sensor, unsigned int *t) {
    if (idx(d) || sensor != 0) return 3; /* NVML_ERROR_NOT_SUPPORTED */
    *t = 41;
    return 0;
}
int nvmlDeviceGetPowerUsage(nvml_device_t d, unsigned int *mw) { *mw = idx(d) ? 700000 : 123456; return 0; }
int nvmlDeviceGetEnforcedPowerLimit(nvml_device_t d, unsigned int *mw) { (void)d; *mw = 700000; return 0; }
int nvmlDeviceGetTotalEnergyConsumption(nvml_device_t d, unsigned long long *mj) {
    if (idx(d)) return 3;
    *mj = 987654321ull;
    return 0;
}
