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

#include "common/status.h"

struct shm_region {
    atomic_int refs;             /* the registry's one while registered, plus one per request */
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
    pthread_mutex_destroy(&reg->lock);
    free(reg);
}

/* The registered region called name; the lock is held. */
static struct shm_region **find(shm_registry_t *reg, const char *name) {
    struct shm_region **p = &reg->head;
    while (*p && strcmp((*p)->name, name) != 0) p = &(*p)->next;
    return p;
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
    struct shm_region *r = calloc(1, sizeof *r);
    if (!r) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    r->fd = -1;
    r->name = strdup(name);
    r->key = strdup(key);
    r->offset = offset;
    r->byte_size = byte_size;
    atomic_init(&r->refs, 1);
    int rc = r->name && r->key ? 0 : status_set(err, err_len, STATUS_NOMEM, "out of memory");
    /* Mapped before the lock: a slow open never holds up other threads. A
     * second register of the name loses below and unmaps again. */
    if (!rc) rc = region_map(r, err, err_len);
    if (!rc) {
        pthread_mutex_lock(&reg->lock);
        if (*find(reg, name))
            rc = status_set(err, err_len, STATUS_INVALID,
                            "shared memory region '%s' is already registered: unregister it first", name);
        else {
            r->next = reg->head;
            reg->head = r;
            reg->count++;
        }
        pthread_mutex_unlock(&reg->lock);
    }
    if (rc) region_free(r);
    return rc;
}

void shm_unregister(shm_registry_t *reg, const char *name) {
    pthread_mutex_lock(&reg->lock);
    struct shm_region **p = find(reg, name ? name : ""), *r = *p;
    if (r) {
        *p = r->next;
        reg->count--;
    }
    pthread_mutex_unlock(&reg->lock);
    shm_region_release(r);
}

void shm_unregister_all(shm_registry_t *reg) {
    pthread_mutex_lock(&reg->lock);
    struct shm_region *r = reg->head;
    reg->head = NULL;
    reg->count = 0;
    pthread_mutex_unlock(&reg->lock);
    while (r) {
        struct shm_region *next = r->next;
        shm_region_release(r);
        r = next;
    }
}

int shm_count(shm_registry_t *reg) {
    pthread_mutex_lock(&reg->lock);
    int n = reg->count;
    pthread_mutex_unlock(&reg->lock);
    return n;
}

cJSON *shm_status_json(shm_registry_t *reg, const char *name, int *status, char *err, size_t err_len) {
    cJSON *arr = cJSON_CreateArray();
    if (!arr) {
        *status = status_set(err, err_len, STATUS_NOMEM, "out of memory");
        return NULL;
    }
    int found = 0;
    pthread_mutex_lock(&reg->lock);
    for (struct shm_region *r = reg->head; r; r = r->next) {
        if (name && *name && strcmp(r->name, name) != 0) continue;
        found = 1;
        cJSON *o = cJSON_CreateObject();
        if (!o) break;
        cJSON_AddItemToArray(arr, o);
        cJSON_AddStringToObject(o, "name", r->name);
        cJSON_AddStringToObject(o, "key", r->key);
        cJSON_AddNumberToObject(o, "offset", (double)r->offset);
        cJSON_AddNumberToObject(o, "byte_size", (double)r->byte_size);
    }
    pthread_mutex_unlock(&reg->lock);
    if (name && *name && !found) {
        cJSON_Delete(arr);
        *status = status_set(err, err_len, STATUS_NOT_FOUND, "Unable to find system shared memory region: '%s'", name);
        return NULL;
    }
    return arr;
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
    if (fstat(r->fd, &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size < r->offset + r->byte_size) {
        status_set(err, err_len, STATUS_INVALID,
                   "%s: shared memory object '%s' of region '%s' is smaller than when it was registered", what, r->key,
                   name);
        shm_region_release(r);
        return NULL;
    }
    *addr = r->base + offset;
    return r;
}

int shm_cuda_register(const char *name, char *err, size_t err_len) {
    return status_set(err, err_len, STATUS_UNSUPPORTED,
                      "CUDA shared memory is not supported by this server (region '%.200s'): register the tensors' "
                      "memory as system shared memory instead", name ? name : "");
}

cJSON *shm_cuda_status_json(const char *name, int *status, char *err, size_t err_len) {
    if (!name || !*name) {
        cJSON *arr = cJSON_CreateArray();
        if (!arr) *status = status_set(err, err_len, STATUS_NOMEM, "out of memory");
        return arr;
    }
    *status = status_set(err, err_len, STATUS_NOT_FOUND,
                         "Unable to find cuda shared memory region: '%.200s' (CUDA shared memory is not supported by "
                         "this server)", name);
    return NULL;
}
