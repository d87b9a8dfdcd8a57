#include "kernels/plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void *g_handle;
static char g_why[512];
static char g_path[PATH_MAX];

static void load_once(void) {
    const char *env = getenv("KILN_CUDA_PLUGIN");
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char tried[PATH_MAX + 64] = "";
    if (env && *env) {
        snprintf(g_path, sizeof g_path, "%s", env);
        g_handle = dlopen(g_path, RTLD_NOW | RTLD_LOCAL);
        if (!g_handle) snprintf(g_why, sizeof g_why, "cannot load %s: %s", g_path, dlerror());
        return;
    }
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(g_path, sizeof g_path, "%s/libkiln_cuda.so", exe);
            if (access(g_path, F_OK) == 0) {
                g_handle = dlopen(g_path, RTLD_NOW | RTLD_LOCAL);
                if (g_handle) return;
                snprintf(g_why, sizeof g_why, "cannot load %s: %s", g_path, dlerror());
                return;
            }
            snprintf(tried, sizeof tried, "%s", g_path);
        }
    }
    snprintf(g_path, sizeof g_path, "libkiln_cuda.so");
    g_handle = dlopen(g_path, RTLD_NOW | RTLD_LOCAL);
    if (!g_handle)
        snprintf(g_why, sizeof g_why, "the CUDA plugin libkiln_cuda.so is not installed (not at %s nor on the library path)",
                 tried[0] ? tried : "the binary's folder");
}

void *plugin_cuda_handle(char *why, size_t why_len) {
    pthread_once(&g_once, load_once);
    if (!g_handle && why && why_len) snprintf(why, why_len, "%s", g_why);
    return g_handle;
}

const char *plugin_cuda_path(void) {
    pthread_once(&g_once, load_once);
    return g_handle ? g_path : NULL;
}

/* The plugin's exported symbol name, or NULL with why set. */
static void *plugin_sym(const char *name, char *why, size_t why_len) {
    void *h = plugin_cuda_handle(why, why_len);
    if (!h) return NULL;
    void *f = dlsym(h, name);
    if (!f && why && why_len) snprintf(why, why_len, "%s does not export %s", g_path, name);
    return f;
}

int plugin_cuda_probe(char *why, size_t why_len) {
    int (*probe)(char *, size_t) = (int (*)(char *, size_t))plugin_sym("kiln_cuda_probe", why, why_len);
    return probe ? probe(why, why_len) : 0;
}

struct backend *plugin_cuda_create(const struct backend_params *p, char *why, size_t why_len) {
    struct backend *(*create)(const struct backend_params *, char *, size_t) =
        (struct backend * (*)(const struct backend_params *, char *, size_t))
            plugin_sym("kiln_cuda_backend_create", why, why_len);
    return create ? create(p, why, why_len) : NULL;
}

int plugin_cuda_ipc_open(int device, const void *handle, size_t handle_len, void **dev_ptr, char *why,
                         size_t why_len) {
    int (*fn)(int, const void *, size_t, void **, char *, size_t) =
        (int (*)(int, const void *, size_t, void **, char *, size_t))plugin_sym("kiln_cuda_ipc_open", why, why_len);
    return fn ? fn(device, handle, handle_len, dev_ptr, why, why_len) : -1;
}

int plugin_cuda_ipc_close(int device, void *dev_ptr, char *why, size_t why_len) {
    int (*fn)(int, void *, char *, size_t) =
        (int (*)(int, void *, char *, size_t))plugin_sym("kiln_cuda_ipc_close", why, why_len);
    return fn ? fn(device, dev_ptr, why, why_len) : -1;
}

/* Both directions of kiln_cuda_copy_to_*: the same signature. */
static int plugin_copy(const char *name, int device, void *dst, const void *src, size_t n, char *why,
                       size_t why_len) {
    int (*fn)(int, void *, const void *, size_t, char *, size_t) =
        (int (*)(int, void *, const void *, size_t, char *, size_t))plugin_sym(name, why, why_len);
    return fn ? fn(device, dst, src, n, why, why_len) : -1;
}

int plugin_cuda_copy_to_host(int device, void *dst, const void *src, size_t n, char *why, size_t why_len) {
    return plugin_copy("kiln_cuda_copy_to_host", device, dst, src, n, why, why_len);
}

int plugin_cuda_copy_to_device(int device, void *dst, const void *src, size_t n, char *why, size_t why_len) {
    return plugin_copy("kiln_cuda_copy_to_device", device, dst, src, n, why, why_len);
}
