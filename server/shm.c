/* shm.c - the registry of system shared-memory regions. See shm.h.
 *
 * A region keeps its object's descriptor open while it is mapped: each
 * shm_acquire checks with fstat that the object still covers the region, so
 * a client that shrank its object (ftruncate) after registering gets an
 * error at once. A shrink between that check and the end of the request
 * makes the next access to the mapping fault with SIGBUS: the copies in and
 * out of a region (shm_region_read/write) run under a guard that turns that
 * fault into the request's error (the guard section below), and nothing
 * else touches a region's bytes. */
#include "server/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "common/log.h"
#include "common/status.h"
#include "kernels/plugin.h"

struct shm_region {
    atomic_int refs;             /* the registry's one while registered, plus one per request */
    int cuda;                    /* 1: device memory opened from a CUDA IPC handle (key NULL, fd -1) */
    int device;                  /* cuda: the device it lives on */
    void *dev;                   /* cuda: the opened handle's pointer (the region's first byte) */
    shm_owner_t owner;
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
    uint64_t bytes;              /* system regions' byte_size, summed */
    int allow;
    char *key_prefix;            /* NULL = any key */
    int max_regions, max_per_owner;
    uint64_t max_bytes;
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

/* Half the physical memory: mapping a client's object costs the server
 * nothing until it is touched, but every byte of it is the machine's
 * memory (tmpfs), and a request copies its inputs out. */
static uint64_t default_max_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : 4ull << 30;
}

static void guard_install(void);

shm_registry_t *shm_registry_create(const struct shm_params *p) {
    shm_registry_t *reg = calloc(1, sizeof *reg);
    if (!reg) return NULL;
    if (p && p->key_prefix && *p->key_prefix && !(reg->key_prefix = strdup(p->key_prefix))) {
        free(reg);
        return NULL;
    }
    reg->allow = p && p->allow;
    reg->max_regions = p && p->max_regions > 0 ? p->max_regions : SHM_DEFAULT_MAX_REGIONS;
    reg->max_per_owner = p && p->max_regions_per_owner > 0 ? p->max_regions_per_owner
                                                           : SHM_DEFAULT_MAX_REGIONS_PER_OWNER;
    reg->max_bytes = p && p->max_bytes > 0 ? p->max_bytes : default_max_bytes();
    /* Once, at start: no region is mapped before the guard is in place. */
    if (reg->allow) {
        guard_install();
        log_info("client shared memory on: keys %s%s%s, at most %d regions (%d per client) and %llu bytes",
                 reg->key_prefix ? "starting with '" : "of any name", reg->key_prefix ? reg->key_prefix : "",
                 reg->key_prefix ? "'" : "", reg->max_regions, reg->max_per_owner,
                 (unsigned long long)reg->max_bytes);
    }
    pthread_mutex_init(&reg->lock, NULL);
    return reg;
}

/* Which regions an unregister takes: owner's (or every owner's), of one
 * kind (cuda 0 or 1) or both (-1), the one called name or (name NULL) all. */
struct region_sel {
    shm_owner_t owner;
    int any_owner;
    int cuda;
    const char *name;
};

static int selected(const struct shm_region *r, const struct region_sel *s) {
    return (s->any_owner || r->owner == s->owner) && (s->cuda < 0 || r->cuda == s->cuda) &&
           (!s->name || strcmp(r->name, s->name) == 0);
}

/* Takes the selected regions out of the registry and drops the registry's
 * references, outside the lock (an unmap, a CUDA close). */
static void unregister_where(shm_registry_t *reg, const struct region_sel *sel) {
    struct shm_region *out = NULL;
    pthread_mutex_lock(&reg->lock);
    for (struct shm_region **p = &reg->head; *p;) {
        struct shm_region *r = *p;
        if (!selected(r, sel)) {
            p = &r->next;
            continue;
        }
        *p = r->next;
        r->next = out;
        out = r;
        reg->count--;
        if (!r->cuda) reg->bytes -= r->byte_size;
    }
    pthread_mutex_unlock(&reg->lock);
    while (out) {
        struct shm_region *next = out->next;
        shm_region_release(out);
        out = next;
    }
}

void shm_registry_free(shm_registry_t *reg) {
    if (!reg) return;
    unregister_where(reg, &(struct region_sel){.any_owner = 1, .cuda = -1});
    pthread_mutex_destroy(&reg->lock);
    free(reg->key_prefix);
    free(reg);
}

int shm_allowed(const shm_registry_t *reg) { return reg->allow; }

uint64_t shm_max_bytes(const shm_registry_t *reg) { return reg->max_bytes; }

static int not_allowed(char *err, size_t err_len) {
    return status_set(err, err_len, STATUS_INVALID, "%s", SHM_DISABLED_MSG);
}

/* owner's region called name, of either kind; the lock is held. */
static struct shm_region **find(shm_registry_t *reg, shm_owner_t owner, const char *name) {
    struct shm_region **p = &reg->head;
    while (*p && ((*p)->owner != owner || strcmp((*p)->name, name) != 0)) p = &(*p)->next;
    return p;
}

/* A region of either kind (name, sizes and the registry's reference set):
 * NULL when out of memory. */
static struct shm_region *region_new(shm_owner_t owner, const char *name, const char *key, uint64_t offset,
                                     uint64_t byte_size) {
    struct shm_region *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->fd = -1;
    r->owner = owner;
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
                      "shared memory region '%.200s' already in manager: unregister it first", name);
}

/* Why r cannot join the registry now (a name taken, a bound reached), as
 * a status with err set; 0 when it can. The lock is held. */
static int insert_refused(shm_registry_t *reg, const struct shm_region *r, char *err, size_t err_len) {
    if (*find(reg, r->owner, r->name)) return already_registered(r->name, err, err_len);
    if (reg->count >= reg->max_regions)
        return status_set(err, err_len, STATUS_INVALID,
                          "shared memory region '%.200s' cannot be registered: the server holds %d regions, its limit "
                          "(--shm-max-regions): unregister some first", r->name, reg->count);
    int mine = 0;
    for (const struct shm_region *x = reg->head; x; x = x->next) mine += x->owner == r->owner;
    if (mine >= reg->max_per_owner)
        return status_set(err, err_len, STATUS_INVALID,
                          "shared memory region '%.200s' cannot be registered: this client holds %d regions, its limit "
                          "(--shm-max-regions-per-client): unregister some first", r->name, mine);
    if (!r->cuda && r->byte_size > reg->max_bytes - reg->bytes)
        return status_set(err, err_len, STATUS_INVALID,
                          "shared memory region '%.200s' cannot be registered: its %llu bytes with the %llu registered "
                          "would pass the server's limit of %llu (--shm-max-bytes)", r->name,
                          (unsigned long long)r->byte_size, (unsigned long long)reg->bytes,
                          (unsigned long long)reg->max_bytes);
    return 0;
}

/* Puts r (opened, not yet shared) into the registry unless its owner has
 * that name already (as Triton, names are unique across system and CUDA
 * shared memory) or a bound is reached. */
static int region_insert(shm_registry_t *reg, struct shm_region *r, char *err, size_t err_len) {
    pthread_mutex_lock(&reg->lock);
    int rc = insert_refused(reg, r, err, err_len);
    if (!rc) {
        r->next = reg->head;
        reg->head = r;
        reg->count++;
        if (!r->cuda) reg->bytes += r->byte_size;
    }
    pthread_mutex_unlock(&reg->lock);
    return rc;
}

/* A region's name: not empty, at most SHM_NAME_MAX bytes (it is kept, and
 * echoed by status). 0 or STATUS_INVALID. */
static int name_check(const char *name, int cuda, char *err, size_t err_len) {
    if (!name || !*name)
        return status_set(err, err_len, STATUS_INVALID, "a %sshared memory region needs a name to be registered",
                          cuda ? "cuda " : "");
    if (strnlen(name, SHM_NAME_MAX + 1) > SHM_NAME_MAX)
        return status_set(err, err_len, STATUS_INVALID, "%sshared memory region '%.100s...': the name is longer than "
                          "%d bytes", cuda ? "cuda " : "", name, SHM_NAME_MAX);
    return 0;
}

/* Triton keeps shared memory objects whose names start with this for its
 * Python backend; a server in its place refuses them as it does, so that
 * a repository moved between the two cannot reach the other's objects. */
#define SHM_RESERVED_PREFIX "triton_python_backend_shm_region_"

/* A key is one shm_open name: "/name" or "name", no other '/', not "." or
 * "..", at most SHM_KEY_MAX bytes, not under SHM_RESERVED_PREFIX. 0 or
 * STATUS_INVALID (Triton's words first: clients match on them). */
static int key_check(const char *region, const char *key, char *err, size_t err_len) {
    const char *name = key[0] == '/' ? key + 1 : key, *bare = key;
    while (*bare == '/') bare++;
    size_t len = strnlen(key, SHM_KEY_MAX + 1);
    if (len > SHM_KEY_MAX)
        return status_set(err, err_len, STATUS_INVALID, "shared memory region '%.200s': 'key' is longer than %d bytes",
                          region, SHM_KEY_MAX);
    if (strncmp(bare, SHM_RESERVED_PREFIX, sizeof SHM_RESERVED_PREFIX - 1) == 0)
        return status_set(err, err_len, STATUS_INVALID,
                          "cannot register shared memory region '%.200s' with key '%.200s' as the key contains the "
                          "reserved prefix '" SHM_RESERVED_PREFIX "'", region, key);
    if (!*name || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return status_set(err, err_len, STATUS_INVALID,
                          "cannot register shared memory region '%.200s' - invalid shm key '%.200s': not one shared "
                          "memory object name (\"/name\", no other '/')", region, key);
    return 0;
}

/* The one message for every object the server will not open, whatever the
 * reason: no such object, someone else's, not a regular file, outside the
 * key prefix. A client learns nothing of names that are not its own. */
static int cannot_open(const struct shm_region *r, char *err, size_t err_len) {
    return status_set(err, err_len, STATUS_INVALID,
                      "shared memory region '%.200s': cannot open shared memory object '%.200s': it does not exist or "
                      "is not the server's to open", r->name, r->key);
}

/* Opens and maps the region (nothing shared yet): 0 or a status with err
 * set. O_NOFOLLOW: a link in /dev/shm is not followed to a file elsewhere;
 * O_NONBLOCK: a FIFO or device put there is not waited on (it is refused
 * right after, not being a regular file). */
static int region_map(shm_registry_t *reg, struct shm_region *r, char *err, size_t err_len) {
    const char *name = r->key[0] == '/' ? r->key + 1 : r->key;
    if (reg->key_prefix && strncmp(name, reg->key_prefix + (reg->key_prefix[0] == '/'),
                                   strlen(reg->key_prefix + (reg->key_prefix[0] == '/'))) != 0)
        return cannot_open(r, err, err_len);
    r->fd = shm_open(r->key, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0);
    if (r->fd < 0) {
        if (errno == ENOENT || errno == EACCES || errno == ELOOP || errno == EPERM || errno == ENXIO ||
            errno == EISDIR || errno == EINVAL || errno == ENAMETOOLONG)
            return cannot_open(r, err, err_len);
        return status_set(err, err_len, STATUS_INTERNAL,
                          "shared memory region '%.200s': cannot open shared memory object '%.200s': %s", r->name,
                          r->key, strerror(errno));
    }
    struct stat st;
    if (fstat(r->fd, &st) != 0)
        return status_set(err, err_len, STATUS_INTERNAL, "shared memory region '%.200s': fstat of '%.200s' failed: %s",
                          r->name, r->key, strerror(errno));
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) return cannot_open(r, err, err_len);
    uint64_t size = st.st_size > 0 ? (uint64_t)st.st_size : 0;
    if (r->offset > size || r->byte_size > size - r->offset)
        return status_set(err, err_len, STATUS_INVALID,
                          "failed to register shared memory region '%.200s': invalid args: offset %llu + byte_size %llu "
                          "is outside shared memory object '%.200s' of %llu bytes", r->name, (unsigned long long)r->offset,
                          (unsigned long long)r->byte_size, r->key, (unsigned long long)size);
    /* mmap takes page-aligned offsets only; a region may start anywhere. */
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t start = r->offset - r->offset % page;
    r->map_len = (size_t)(r->byte_size + (r->offset - start));
    void *m = mmap(NULL, r->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, (off_t)start);
    if (m == MAP_FAILED)
        return status_set(err, err_len, STATUS_INTERNAL, "shared memory region '%.200s': mmap of '%.200s' failed: %s",
                          r->name, r->key, strerror(errno));
    r->map = m;
    r->base = (unsigned char *)m + (r->offset - start);
    return 0;
}

int shm_register(shm_registry_t *reg, shm_owner_t owner, const char *name, const char *key, uint64_t offset,
                 uint64_t byte_size, char *err, size_t err_len) {
    if (!reg->allow) return not_allowed(err, err_len);
    int rc = name_check(name, 0, err, err_len);
    if (rc) return rc;
    if (!key || !*key)
        return status_set(err, err_len, STATUS_INVALID,
                          "shared memory region '%.200s': 'key' must name a shared memory object", name);
    if ((rc = key_check(name, key, err, err_len))) return rc;
    if (byte_size == 0)
        return status_set(err, err_len, STATUS_INVALID,
                          "failed to register shared memory region '%.200s': invalid args: byte_size must be more than 0",
                          name);
    if (byte_size > SIZE_MAX / 2 || offset > UINT64_MAX - byte_size)
        return status_set(err, err_len, STATUS_INVALID,
                          "failed to register shared memory region '%.200s': invalid args: offset %llu + byte_size %llu "
                          "is too large", name, (unsigned long long)offset, (unsigned long long)byte_size);
    struct shm_region *r = region_new(owner, name, key, offset, byte_size);
    if (!r) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    /* Checked before the open too, so that a client at a bound does not
     * open objects for nothing; the insert checks again under the lock. */
    pthread_mutex_lock(&reg->lock);
    rc = insert_refused(reg, r, err, err_len);
    pthread_mutex_unlock(&reg->lock);
    /* Mapped outside the lock: a slow open never holds up other threads. A
     * second register of the name loses below and unmaps again. */
    if (!rc) rc = region_map(reg, r, err, err_len);
    if (!rc) rc = region_insert(reg, r, err, err_len);
    if (rc) region_free(r);
    return rc;
}

void shm_unregister(shm_registry_t *reg, shm_owner_t owner, const char *name) {
    unregister_where(reg, &(struct region_sel){.owner = owner, .cuda = 0, .name = name ? name : ""});
}

void shm_unregister_all(shm_registry_t *reg, shm_owner_t owner) {
    unregister_where(reg, &(struct region_sel){.owner = owner, .cuda = 0});
}

void shm_cuda_unregister(shm_registry_t *reg, shm_owner_t owner, const char *name) {
    unregister_where(reg, &(struct region_sel){.owner = owner, .cuda = 1, .name = name ? name : ""});
}

void shm_cuda_unregister_all(shm_registry_t *reg, shm_owner_t owner) {
    unregister_where(reg, &(struct region_sel){.owner = owner, .cuda = 1});
}

void shm_drop_owner(shm_registry_t *reg, shm_owner_t owner) {
    /* Every connection's close comes here: most never registered anything. */
    if (!reg || !reg->allow) return;
    unregister_where(reg, &(struct region_sel){.owner = owner, .cuda = -1});
}

int shm_count(shm_registry_t *reg) {
    pthread_mutex_lock(&reg->lock);
    int n = reg->count;
    pthread_mutex_unlock(&reg->lock);
    return n;
}

/* Triton's status array of owner's regions of one kind, all or the one named. */
static cJSON *status_kind(shm_registry_t *reg, shm_owner_t owner, int cuda, const char *name, int *status, char *err,
                          size_t err_len) {
    cJSON *arr = cJSON_CreateArray();
    if (!arr) {
        *status = status_set(err, err_len, STATUS_NOMEM, "out of memory");
        return NULL;
    }
    int found = 0;
    pthread_mutex_lock(&reg->lock);
    for (struct shm_region *r = reg->head; r; r = r->next) {
        if (r->owner != owner || r->cuda != cuda || (name && *name && strcmp(r->name, name) != 0)) continue;
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

cJSON *shm_status_json(shm_registry_t *reg, shm_owner_t owner, const char *name, int *status, char *err,
                       size_t err_len) {
    return status_kind(reg, owner, 0, name, status, err, err_len);
}

cJSON *shm_cuda_status_json(shm_registry_t *reg, shm_owner_t owner, const char *name, int *status, char *err,
                            size_t err_len) {
    return status_kind(reg, owner, 1, name, status, err, err_len);
}

struct shm_region *shm_acquire(shm_registry_t *reg, shm_owner_t owner, const char *name, uint64_t offset,
                               uint64_t byte_size, const char *what, void **addr, char *err, size_t err_len) {
    if (!reg->allow) {
        status_set(err, err_len, STATUS_INVALID, "%s names shared memory region '%.200s', but %s", what, name,
                   SHM_DISABLED_MSG);
        return NULL;
    }
    pthread_mutex_lock(&reg->lock);
    struct shm_region *r = *find(reg, owner, name);
    if (r) atomic_fetch_add(&r->refs, 1);
    pthread_mutex_unlock(&reg->lock);
    if (!r) {
        status_set(err, err_len, STATUS_INVALID, "%s: shared memory region '%.200s' is not registered", what, name);
        return NULL;
    }
    /* Three cases with Triton's words (clients match on them), then the numbers. */
    if (offset > r->byte_size || byte_size > r->byte_size - offset) {
        if (offset > r->byte_size || (offset == r->byte_size && byte_size))
            status_set(err, err_len, STATUS_INVALID,
                       "%s: Invalid offset for shared memory region '%.200s': shared_memory_offset %llu is at or past its "
                       "%llu bytes", what, name, (unsigned long long)offset, (unsigned long long)r->byte_size);
        else if (byte_size > UINT64_MAX - offset)
            status_set(err, err_len, STATUS_INVALID,
                       "%s: Integer overflow detected: byte_size %llu + offset %llu for shared memory region "
                       "'%.200s' passes 2^64", what, (unsigned long long)byte_size, (unsigned long long)offset, name);
        else
            status_set(err, err_len, STATUS_INVALID,
                       "%s: Invalid offset + byte size for shared memory region '%.200s': shared_memory_offset %llu + "
                       "shared_memory_byte_size %llu is outside its %llu bytes", what, name,
                       (unsigned long long)offset, (unsigned long long)byte_size, (unsigned long long)r->byte_size);
        shm_region_release(r);
        return NULL;
    }
    struct stat st;
    if (!r->cuda && (fstat(r->fd, &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size < r->offset + r->byte_size)) {
        status_set(err, err_len, STATUS_INVALID,
                   "%s: shared memory object '%.200s' of region '%.200s' is smaller than when it was registered", what,
                   r->key, name);
        shm_region_release(r);
        return NULL;
    }
    *addr = (r->cuda ? (unsigned char *)r->dev : r->base) + offset;
    return r;
}

/* ==== the SIGBUS guard ====================================================
 *
 * A client may truncate its object at any time; a copy from or to a page
 * of the mapping that is no longer backed then gets SIGBUS. One process-wide
 * handler, installed once: on a thread inside a guarded copy it jumps back
 * to the copy's start, which reports the fault; anywhere else the fault is
 * a real one and gets what it would have had without the guard (the handler
 * that was installed before, or the default action: the faulting access
 * runs again and the process dies of it). SA_NODEFER leaves SIGBUS
 * unblocked after the jump, so sigsetjmp need not save the signal mask (no
 * system call per copy). */
static __thread sigjmp_buf *volatile g_guard;
static struct sigaction g_prev_bus;
static pthread_mutex_t g_guard_lock = PTHREAD_MUTEX_INITIALIZER;

static void bus_handler(int sig, siginfo_t *si, void *uc) {
    sigjmp_buf *env = g_guard;
    if (env) {
        g_guard = NULL;
        siglongjmp(*env, 1);
    }
    if (g_prev_bus.sa_flags & SA_SIGINFO) {
        if (g_prev_bus.sa_sigaction) {
            g_prev_bus.sa_sigaction(sig, si, uc);
            return;
        }
    } else if (g_prev_bus.sa_handler != SIG_DFL && g_prev_bus.sa_handler != SIG_IGN) {
        g_prev_bus.sa_handler(sig);
        return;
    }
    signal(SIGBUS, SIG_DFL); /* the access faults again, and that one is fatal */
}

/* Installs the handler unless it is in place already; the one before it is
 * kept for the faults that are not a guarded copy's. */
static void guard_install(void) {
    struct sigaction cur, sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = bus_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    pthread_mutex_lock(&g_guard_lock);
    if (sigaction(SIGBUS, NULL, &cur) == 0 && !((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == bus_handler)) {
        g_prev_bus = cur;
        if (sigaction(SIGBUS, &sa, NULL) != 0) log_warn("installing the SIGBUS guard of shared memory failed");
    }
    pthread_mutex_unlock(&g_guard_lock);
}

/* memcpy(dst, src, n) that returns -1 instead of dying when one side is a
 * page of a shared mapping whose object no longer covers it. */
static int guarded_memcpy(void *dst, const void *src, size_t n) {
    sigjmp_buf env;
    if (sigsetjmp(env, 0)) return -1; /* g_guard was cleared by the handler */
    g_guard = &env;
    atomic_signal_fence(memory_order_seq_cst); /* the copy stays between the two stores */
    memcpy(dst, src, n);
    atomic_signal_fence(memory_order_seq_cst);
    g_guard = NULL;
    return 0;
}

/* ==== CUDA shared memory ================================================== */

/* n bytes from src to dst, one of them inside r (to_region says which): a
 * memcpy for a system region, a device copy for a CUDA one. */
static int region_copy(const struct shm_region *r, void *dst, const void *src, size_t n, int to_region, char *err,
                       size_t err_len) {
    if (!n) return 0;
    if (!r->cuda) {
        if (guarded_memcpy(dst, src, n) == 0) return 0;
        return status_set(err, err_len, STATUS_INVALID,
                          "shared memory region '%.200s': shared memory object '%.200s' was truncated while the "
                          "request %s it: keep the object's size while a request uses it", r->name, r->key,
                          to_region ? "wrote into" : "read from");
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
 * or -1 when text is not base64 or decodes to more than out_cap bytes.
 * libsodium's decoder takes no padding in this variant, so up to two '='
 * are cut first; it also refuses a last character whose unused bits are
 * not zero (a non-canonical encoding, which no client writes). */
static long base64_decode(const char *text, unsigned char *out, size_t out_cap) {
    size_t all = strlen(text), len = all, n = 0;
    while (len && text[len - 1] == '=') len--;
    if (all - len > 2 ||
        sodium_base642bin(out, out_cap, text, len, NULL, &n, NULL, sodium_base64_VARIANT_ORIGINAL_NO_PADDING))
        return -1;
    return (long)n;
}

int shm_cuda_register_b64(shm_registry_t *reg, shm_owner_t owner, const char *name, const char *handle_b64,
                          int64_t device_id, uint64_t byte_size, char *err, size_t err_len) {
    if (!reg->allow) return not_allowed(err, err_len);
    unsigned char handle[SHM_CUDA_HANDLE_SIZE + 1];
    long n = handle_b64 ? base64_decode(handle_b64, handle, sizeof handle) : -1;
    if (n < 0)
        return status_set(err, err_len, STATUS_INVALID,
                          "cuda shared memory region '%.200s': raw_handle.b64 is not the base64 of a %d-byte CUDA IPC "
                          "handle (cudaIpcMemHandle_t)", name ? name : "", SHM_CUDA_HANDLE_SIZE);
    return shm_cuda_register(reg, owner, name, handle, (size_t)n, device_id, byte_size, err, err_len);
}

int shm_cuda_register(shm_registry_t *reg, shm_owner_t owner, const char *name, const void *handle,
                      size_t handle_len, int64_t device_id, uint64_t byte_size, char *err, size_t err_len) {
    if (!reg->allow) return not_allowed(err, err_len);
    int rc = name_check(name, 1, err, err_len);
    if (rc) return rc;
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
    struct shm_region *r = region_new(owner, name, NULL, 0, byte_size);
    if (!r) return status_set(err, err_len, STATUS_NOMEM, "out of memory");
    r->cuda = 1;
    /* A name in use or a bound reached is refused before any device is
     * touched; the insert below checks again under the lock. */
    pthread_mutex_lock(&reg->lock);
    rc = insert_refused(reg, r, err, err_len);
    pthread_mutex_unlock(&reg->lock);
    if (rc) {
        region_free(r);
        return rc;
    }
    char why[512];
    int ndev = cuda_devices(why, sizeof why);
    if (ndev <= 0)
        rc = status_set(err, err_len, STATUS_UNSUPPORTED,
                        "cuda shared memory region '%.200s' cannot be registered: this server has no usable GPU "
                        "(%s); register the tensors' memory as system shared memory instead", name, why);
    else if (device_id >= ndev)
        rc = status_set(err, err_len, STATUS_INVALID,
                        "cuda shared memory region '%.200s': device_id %lld does not exist (this server sees %d "
                        "GPU%s)", name, (long long)device_id, ndev, ndev == 1 ? "" : "s");
    r->device = (int)device_id;
    if (!rc && plugin_cuda_ipc_open(r->device, handle, handle_len, &r->dev, why, sizeof why)) {
        r->dev = NULL;
        rc = status_set(err, err_len, STATUS_INVALID,
                        "cuda shared memory region '%.200s': cannot open its CUDA IPC handle on device %d: %s", name,
                        r->device, why);
    }
    if (!rc) rc = region_insert(reg, r, err, err_len);
    if (rc) region_free(r);
    return rc;
}
