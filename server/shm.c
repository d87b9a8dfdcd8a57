/* shm.c - the registry of system shared-memory regions. See shm.h.
 *
 * A region keeps its object's descriptor open while it is mapped: each
 * shm_acquire checks with fstat that the object still covers the region, so
 * a client that shrank its object (ftruncate) after registering gets an
 * error rather than the server a SIGBUS on the next read. A shrink between
 * that check and the end of the request is not caught; like Triton, the
 * server trusts a client not to truncate an object while a request of its
 * own uses it. */
#include "server/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/log.h"
#include "common/status.h"
#include "kernels/plugin.h"

struct shm_region {
    atomic_int refs;             /* the registry's one while registered, plus one per request */
    int cuda;                    /* 1: device memory opened from a CUDA IPC handle (key NULL, fd -1) */
    int device;                  /* cuda: the device it lives on */
    void *dev;                   /* cuda: the opened handle's pointer (the region's first byte) */
    char *name, *key;
    uint64_t offset, byte_size;  /* as registered: the region within the object */
    int fd;
    void *map;                   /* the mapping, from offset rounded down to a page */
    size_t map_len;
    unsigned char *base;         /* the region's first byte in it */
    struct shm_region *next;
};

struct shm_registry {
    pthread_mutex_t lock;
    struct shm_region *head;     /* registered regions, newest first */
    int count;
};

static void region_free(struct shm_region *r) {
    char why[512];
    if (r->dev && plugin_cuda_ipc_close(r->device, r->dev, why, sizeof why))
        log_warn("cuda shared memory region '%s': closing its IPC handle failed: %s", r->name, why);
    if (r->map) munmap(r->map, r->map_len);
    if (r->fd >= 0) close(r->fd);
    free(r->name);
    free(r->key);
    free(r);
}

void shm_region_release(struct shm_region *r) {
    if (r && atomic_fetch_sub(&r->refs, 1) == 1) region_free(r);
}

shm_registry_t *shm_registry_create(void) {
    shm_registry_t *reg = calloc(1, sizeof *reg);
    if (!reg) return NULL;
    pthread_mutex_init(&reg->lock, NULL);
    return reg;
}

void shm_registry_free(shm_registry_t *reg) {
    if (!reg) return;
    shm_unregister_all(reg);
    shm_cuda_unregister_all(reg);
    pthread_mutex_destroy(&reg->lock);
    free(reg);
}

/* The registered region called name; the lock is held. */
static struct shm_region **find(shm_registry_t *reg, const char *name) {
    struct shm_region **p = &reg->head;
    while (*p && strcmp((*p)->name, name) != 0) p = &(*p)->next;
    return p;
}

/* A region of either kind (name, sizes and the registry's reference set):
 * NULL when out of memory. */
static struct shm_region *region_new(const char *name, const char *key, uint64_t offset, uint64_t byte_size) {
    struct shm_region *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->fd = -1;
    r->name = strdup(name);
    r->key = key ? strdup(key) : NULL;
    r->offset = offset;
    r->byte_size = byte_size;
    atomic_init(&r->refs, 1);
    if (!r->name || (key && !r->key)) {
        region_free(r);
        return NULL;
    }
    return r;
}

static int already_registered(const char *name, char *err, size_t err_len) {
    return status_set(err, err_len, STATUS_INVALID,
                      "shared memory region '%s' is already registered: unregister it first", name);
}

/* Puts r (opened, not yet shared) into the registry unless its name is
 * taken by a region of either kind (as Triton, names are unique across
 * system and CUDA shared memory). */
static int region_insert(shm_registry_t *reg, struct shm_region *r, char *err, size_t err_len) {
    int rc = 0;
    pthread_mutex_lock(&reg->lock);
    if (*find(reg, r->name))
        rc = already_registered(r->name, err, err_len);
    else {
        r->next = reg->head;
        reg->head = r;
        reg->count++;
    }
    pthread_mutex_unlock(&reg->lock);
    return rc;
}

/* Opens and maps the region (nothing shared yet): 0 or a status with err set. */
static int region_map(struct shm_region *r, char *err, size_t err_len) {
    r->fd = shm_open(r->key, O_RDWR, 0);
    if (r->fd < 0)
        return status_set(err, err_len, STATUS_INVALID,
                          "shared memory region '%s': cannot open shared memory object '%s': %s", r->name, r->key,
                          strerror(errno));
    struct stat st;
    if (fstat(r->fd, &st) != 0)
        return status_set(err, err_len, STATUS_INTERNAL, "shared memory region '%s': fstat of '%s' failed: %s",
                          r->name, r->key, strerror(errno));
    uint64_t size = st.st_size > 0 ? (uint64_t)st.st_size : 0;
    if (r->offset > size || r->byte_size > size - r->offset)
        return status_set(err, err_len, STATUS_INVALID,
                          "shared memory region '%s': offset %llu + byte_size %llu is outside shared memory object "
                          "'%s' of %llu bytes", r->name, (unsigned long long)r->offset,
                          (unsigned long long)r->byte_size, r->key, (unsigned long long)size);
    /* mmap takes page-aligned offsets only; a region may start anywhere. */
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t start = r->offset - r->offset % page;
    r->map_len = (size_t)(r->byte_size + (r->offset - start));
    void *m = mmap(NULL, r->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, (off_t)start);
    if (m == MAP_FAILED)
        return status_set(err, err_len, STATUS_INTERNAL, "shared memory region '%s': mmap of '%s' failed: %s", r->name,
                          r->key, strerror(errno));
    r->map = m;
    r->base = (unsigned char *)m + (r->offset - start);
    return 0;
}

int shm_register(shm_registry_t *reg, const char *name, const char *key, uint64_t offset, uint64_t byte_size,
                 char *err, size_t err_len) {
    if (!name || !*name)
        return status_set(err, err_len, STATUS_INVALID, "a shared memory region needs a name to be registered");
    if (!key || !*key)
        return status_set(err, err_len, STATUS_INVALID, "shared memory region '%s': 'key' must name a shared memory object",
                          name);
    if (byte_size == 0)
        return status_set(err, err_len, STATUS_INVALID, "shared memory region '%s': byte_size must be more than 0", name);
    if (byte_size > SIZE_MAX / 2 || offset > UINT64_MAX - byte_size)
        return status_set(err, err_len, STATUS_INVALID, "shared memory region '%s': offset %llu + byte_size %llu is too large",
                          name, (unsigned long long)offset, (unsigned long long)byte_size);
    struct shm_region *r = region_new(name, key, offset, byte_size);
    if (!r) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    /* Mapped before the lock: a slow open never holds up other threads. A
     * second register of the name loses below and unmaps again. */
    int rc = region_map(r, err, err_len);
    if (!rc) rc = region_insert(reg, r, err, err_len);
    if (rc) region_free(r);
    return rc;
}

/* Takes name out of the registry when it is a region of that kind. */
static void unregister_kind(shm_registry_t *reg, const char *name, int cuda) {
    pthread_mutex_lock(&reg->lock);
    struct shm_region **p = find(reg, name ? name : ""), *r = *p;
    if (r && r->cuda == cuda) {
        *p = r->next;
        reg->count--;
    } else
        r = NULL;
    pthread_mutex_unlock(&reg->lock);
    shm_region_release(r);
}

/* Takes every region of that kind out of the registry. */
static void unregister_all_kind(shm_registry_t *reg, int cuda) {
    struct shm_region *out = NULL;
    pthread_mutex_lock(&reg->lock);
    for (struct shm_region **p = &reg->head; *p;) {
        struct shm_region *r = *p;
        if (r->cuda != cuda) {
            p = &r->next;
            continue;
        }
        *p = r->next;
        r->next = out;
        out = r;
        reg->count--;
    }
    pthread_mutex_unlock(&reg->lock);
    while (out) {
        struct shm_region *next = out->next;
        shm_region_release(out);
        out = next;
    }
}

void shm_unregister(shm_registry_t *reg, const char *name) { unregister_kind(reg, name, 0); }

void shm_unregister_all(shm_registry_t *reg) { unregister_all_kind(reg, 0); }

void shm_cuda_unregister(shm_registry_t *reg, const char *name) { unregister_kind(reg, name, 1); }

void shm_cuda_unregister_all(shm_registry_t *reg) { unregister_all_kind(reg, 1); }

int shm_count(shm_registry_t *reg) {
    pthread_mutex_lock(&reg->lock);
    int n = reg->count;
    pthread_mutex_unlock(&reg->lock);
    return n;
}

/* Triton's status array of the regions of one kind, all or the one named. */
static cJSON *status_kind(shm_registry_t *reg, int cuda, const char *name, int *status, char *err, size_t err_len) {
    cJSON *arr = cJSON_CreateArray();
    if (!arr) {
        *status = status_set(err, err_len, STATUS_NOMEM, "out of memory");
        return NULL;
    }
    int found = 0;
    pthread_mutex_lock(&reg->lock);
    for (struct shm_region *r = reg->head; r; r = r->next) {
        if (r->cuda != cuda || (name && *name && strcmp(r->name, name) != 0)) continue;
        found = 1;
        cJSON *o = cJSON_CreateObject();
        if (!o) break;
        cJSON_AddItemToArray(arr, o);
        cJSON_AddStringToObject(o, "name", r->name);
        if (cuda) cJSON_AddNumberToObject(o, "device_id", r->device);
        else {
            cJSON_AddStringToObject(o, "key", r->key);
            cJSON_AddNumberToObject(o, "offset", (double)r->offset);
        }
        cJSON_AddNumberToObject(o, "byte_size", (double)r->byte_size);
    }
    pthread_mutex_unlock(&reg->lock);
    if (name && *name && !found) {
        cJSON_Delete(arr);
        *status = status_set(err, err_len, STATUS_NOT_FOUND, "Unable to find %s shared memory region: '%.200s'",
                             cuda ? "cuda" : "system", name);
        return NULL;
    }
    return arr;
}

cJSON *shm_status_json(shm_registry_t *reg, const char *name, int *status, char *err, size_t err_len) {
    return status_kind(reg, 0, name, status, err, err_len);
}

cJSON *shm_cuda_status_json(shm_registry_t *reg, const char *name, int *status, char *err, size_t err_len) {
    return status_kind(reg, 1, name, status, err, err_len);
}

struct shm_region *shm_acquire(shm_registry_t *reg, const char *name, uint64_t offset, uint64_t byte_size,
                               const char *what, void **addr, char *err, size_t err_len) {
    pthread_mutex_lock(&reg->lock);
    struct shm_region *r = *find(reg, name);
    if (r) atomic_fetch_add(&r->refs, 1);
    pthread_mutex_unlock(&reg->lock);
    if (!r) {
        status_set(err, err_len, STATUS_INVALID, "%s: shared memory region '%s' is not registered", what, name);
        return NULL;
    }
    if (offset > r->byte_size || byte_size > r->byte_size - offset) {
        status_set(err, err_len, STATUS_INVALID,
                   "%s: shared_memory_offset %llu + shared_memory_byte_size %llu is outside shared memory region '%s' "
                   "of %llu bytes", what, (unsigned long long)offset, (unsigned long long)byte_size, name,
                   (unsigned long long)r->byte_size);
        shm_region_release(r);
        return NULL;
    }
    struct stat st;
    if (!r->cuda && (fstat(r->fd, &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size < r->offset + r->byte_size)) {
        status_set(err, err_len, STATUS_INVALID,
                   "%s: shared memory object '%s' of region '%s' is smaller than when it was registered", what, r->key,
                   name);
        shm_region_release(r);
        return NULL;
    }
    *addr = (r->cuda ? (unsigned char *)r->dev : r->base) + offset;
    return r;
}

/* ==== CUDA shared memory ================================================== */

int shm_region_on_host(const struct shm_region *r) { return !r->cuda; }

/* n bytes from src to dst, one of them inside r (to_region says which): a
 * memcpy for a system region, a device copy for a CUDA one. */
static int region_copy(const struct shm_region *r, void *dst, const void *src, size_t n, int to_region, char *err,
                       size_t err_len) {
    if (!n) return 0;
    if (!r->cuda) {
        memcpy(dst, src, n);
        return 0;
    }
    char why[512];
    int rc = to_region ? plugin_cuda_copy_to_device(r->device, dst, src, n, why, sizeof why)
                       : plugin_cuda_copy_to_host(r->device, dst, src, n, why, sizeof why);
    if (rc)
        return status_set(err, err_len, STATUS_INTERNAL, "cuda shared memory region '%s': copy %s device %d failed: %s",
                          r->name, to_region ? "to" : "from", r->device, why);
    return 0;
}

int shm_region_read(const struct shm_region *r, const void *addr, void *dst, size_t n, char *err, size_t err_len) {
    return region_copy(r, dst, addr, n, 0, err, err_len);
}

int shm_region_write(const struct shm_region *r, void *addr, const void *src, size_t n, char *err, size_t err_len) {
    return region_copy(r, addr, src, n, 1, err, err_len);
}

/* The plugin's probe, once per process: the number of usable devices, or 0
 * with why set. Once, because a probe without a driver searches the
 * library path and the answer does not change while the server runs. */
static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;
static int g_ndev;
static char g_probe_why[512];

static void probe_once(void) { g_ndev = plugin_cuda_probe(g_probe_why, sizeof g_probe_why); }

static int cuda_devices(char *why, size_t why_len) {
    pthread_once(&g_probe_once, probe_once);
    if (g_ndev <= 0) snprintf(why, why_len, "%s", g_probe_why);
    return g_ndev;
}

int shm_cuda_usable(void) {
    char why[512];
    return cuda_devices(why, sizeof why) > 0;
}

/* RFC 4648 base64 (padding optional) into out[out_cap]: the decoded length,
 * or -1 when text is not base64 or decodes to more than out_cap bytes. */
static long base64_decode(const char *text, unsigned char *out, size_t out_cap) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = strlen(text), n = 0;
    while (len && text[len - 1] == '=') len--;
    if (strlen(text) - len > 2 || len % 4 == 1) return -1;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        const char *c = text[i] ? strchr(alphabet, text[i]) : NULL;
        if (!c) return -1;
        acc = (acc << 6) | (uint32_t)(c - alphabet);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n == out_cap) return -1;
            out[n++] = (unsigned char)(acc >> bits);
        }
    }
    return (long)n;
}

int shm_cuda_register_b64(shm_registry_t *reg, const char *name, const char *handle_b64, int64_t device_id,
                          uint64_t byte_size, char *err, size_t err_len) {
    unsigned char handle[SHM_CUDA_HANDLE_SIZE + 1];
    long n = handle_b64 ? base64_decode(handle_b64, handle, sizeof handle) : -1;
    if (n < 0)
        return status_set(err, err_len, STATUS_INVALID,
                          "cuda shared memory region '%.200s': raw_handle.b64 is not the base64 of a %d-byte CUDA IPC "
                          "handle (cudaIpcMemHandle_t)", name ? name : "", SHM_CUDA_HANDLE_SIZE);
    return shm_cuda_register(reg, name, handle, (size_t)n, device_id, byte_size, err, err_len);
}

int shm_cuda_register(shm_registry_t *reg, const char *name, const void *handle, size_t handle_len,
                      int64_t device_id, uint64_t byte_size, char *err, size_t err_len) {
    if (!name || !*name)
        return status_set(err, err_len, STATUS_INVALID, "a cuda shared memory region needs a name to be registered");
    if (handle_len != SHM_CUDA_HANDLE_SIZE)
        return status_set(err, err_len, STATUS_INVALID,
                          "cuda shared memory region '%.200s': raw_handle is %zu bytes, but a CUDA IPC handle "
                          "(cudaIpcMemHandle_t) is %d", name, handle_len, SHM_CUDA_HANDLE_SIZE);
    if (byte_size == 0)
        return status_set(err, err_len, STATUS_INVALID, "cuda shared memory region '%.200s': byte_size must be more than 0",
                          name);
    if (byte_size > SIZE_MAX / 2)
        return status_set(err, err_len, STATUS_INVALID, "cuda shared memory region '%.200s': byte_size %llu is too large",
                          name, (unsigned long long)byte_size);
    if (device_id < 0 || device_id > INT32_MAX)
        return status_set(err, err_len, STATUS_INVALID, "cuda shared memory region '%.200s': device_id %lld is not a "
                          "device number", name, (long long)device_id);
    /* A name in use is refused before any device is touched; the insert
     * below checks again under the lock. */
    pthread_mutex_lock(&reg->lock);
    int taken = *find(reg, name) != NULL;
    pthread_mutex_unlock(&reg->lock);
    if (taken) return already_registered(name, err, err_len);
    char why[512];
    int ndev = cuda_devices(why, sizeof why);
    if (ndev <= 0)
        return status_set(err, err_len, STATUS_UNSUPPORTED,
                          "cuda shared memory region '%.200s' cannot be registered: this server has no usable GPU "
                          "(%s); register the tensors' memory as system shared memory instead", name, why);
    if (device_id >= ndev)
        return status_set(err, err_len, STATUS_INVALID,
                          "cuda shared memory region '%.200s': device_id %lld does not exist (this server sees %d "
                          "GPU%s)", name, (long long)device_id, ndev, ndev == 1 ? "" : "s");
    struct shm_region *r = region_new(name, NULL, 0, byte_size);
    if (!r) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    r->cuda = 1;
    r->device = (int)device_id;
    int rc = 0;
    if (plugin_cuda_ipc_open(r->device, handle, handle_len, &r->dev, why, sizeof why)) {
        r->dev = NULL;
        rc = status_set(err, err_len, STATUS_INVALID,
                        "cuda shared memory region '%.200s': cannot open its CUDA IPC handle on device %d: %s", name,
                        r->device, why);
    }
    if (!rc) rc = region_insert(reg, r, err, err_len);
    if (rc) region_free(r);
    return rc;
}
