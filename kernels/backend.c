/* backend.c - the backend registry: "cpu" always, "cuda" through the plugin
 * (kernels/plugin.h) when libkiln_cuda.so, a driver and a device are there. */
#include "kernels/backend.h"

#include <stdio.h>
#include <string.h>

#include "kernels/plugin.h"

void backend_free(struct backend *be) {
    if (be && be->iface && be->iface->free) be->iface->free(be);
}

int backend_available(const char *name, char *why, size_t why_len) {
    if (why && why_len) why[0] = 0;
    if (!name) return 0;
    if (strcmp(name, "cpu") == 0) return 1;
    if (strcmp(name, "cuda") == 0) return plugin_cuda_probe(why, why_len);
    if (why && why_len) snprintf(why, why_len, "unknown backend '%s' (known: cpu, cuda)", name);
    return 0;
}

struct backend *backend_create(const char *name, const struct backend_params *p, char *why, size_t why_len) {
    if (why && why_len) why[0] = 0;
    if (name && strcmp(name, "cpu") == 0) {
        struct backend *be = backend_cpu_create(p);
        if (!be && why && why_len) snprintf(why, why_len, "out of memory creating the CPU backend");
        return be;
    }
    if (name && strcmp(name, "cuda") == 0) {
        char tmp[512] = "";
        if (plugin_cuda_probe(tmp, sizeof tmp) <= 0) {
            if (why && why_len) snprintf(why, why_len, "%s", tmp[0] ? tmp : "no usable CUDA device");
            return NULL;
        }
        return plugin_cuda_create(p, why, why_len);
    }
    if (why && why_len) snprintf(why, why_len, "unknown backend '%s' (known: cpu, cuda)", name ? name : "(null)");
    return NULL;
}
