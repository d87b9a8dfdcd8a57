/* shm.h - registered shared-memory regions (Triton's system and CUDA shared
 * memory extensions), shared by every transport.
 *
 * A client creates a POSIX shared-memory object (shm_open), writes tensors
 * into it, and registers a region of it under a name: key (the object's
 * shm_open name), offset and byte_size within the object. Requests then name
 * the region instead of carrying the bytes (server/infer_shm.h). Registering
 * maps [offset, offset + byte_size) of the object once; each request that
 * uses a region takes a reference (shm_acquire) and drops it when it is
 * answered (shm_region_release), so unregistering while requests use the
 * region only takes it out of the registry: the mapping goes with the last
 * reference, never under a request that reads or writes it.
 *
 * Client shared memory lets a client name memory in the server's address
 * space, so it is confined:
 *   - off unless the server was started with --allow-client-shm (struct
 *     shm_params.allow): register and every request naming a region are
 *     refused, saying so;
 *   - a key is one shm_open name ("/name" or "name", no other '/', at most
 *     SHM_KEY_MAX bytes), inside --shm-key-prefix when one is set; the object
 *     is opened without following a link and must be a regular file owned by
 *     the server's effective user (root does not open other users' objects)
 *     covering the region. An object that does not exist, is someone else's,
 *     is not a regular file or is outside the prefix gets one identical
 *     message, so register cannot probe for other users' names;
 *   - every region has an owner (shm_owner_t): the connection it was
 *     registered on, or SHM_OWNER_TOKEN when the call carried the control
 *     token (shared by every connection carrying it). Names are unique per
 *     owner; status, unregister and the requests' lookups see only the
 *     caller's own regions; a connection's regions go when it closes
 *     (shm_drop_owner);
 *   - bounded: regions per server, per owner, and bytes mapped in all;
 *   - a client that truncates its object while a request reads or writes
 *     the region cannot kill the server: every copy to or from a system
 *     region runs under a SIGBUS guard (shm_region_read/write) and a fault
 *     becomes that request's error naming the region.
 *
 * Every check is against what the kernel says: register refuses an offset or
 * size outside the object's real size (fstat), a byte_size of 0 and a name
 * the owner already registered; shm_acquire refuses an [offset, offset +
 * byte_size) that is not inside the region, and an object that shrank since
 * it was registered.
 *
 * Threads: every function is thread-safe (one mutex around the table; the
 * references are atomic). I/O threads register and acquire, instance threads
 * never touch the registry. */
#ifndef KILN_SHM_H
#define KILN_SHM_H

#include <stddef.h>
#include <stdint.h>

typedef struct shm_registry shm_registry_t;
typedef struct cJSON cJSON;
struct shm_region;

/* Who a region belongs to: SHM_OWNER_TOKEN, or a connection's
 * (shm_owner_of: its address, unique among open connections; its regions
 * are dropped before it is freed, so a later connection at that address
 * starts with none). */
typedef uint64_t shm_owner_t;
#define SHM_OWNER_TOKEN ((shm_owner_t)1)
static inline shm_owner_t shm_owner_of(const void *conn) { return (shm_owner_t)(uintptr_t)conn; }

/* The longest key, its leading '/' included (NAME_MAX of /dev/shm). */
#define SHM_KEY_MAX 255
/* The longest region name. */
#define SHM_NAME_MAX 1024
#define SHM_DEFAULT_MAX_REGIONS 1024
/* What every refusal says while client shared memory is off. */
#define SHM_DISABLED_MSG "Client shared memory is disabled: the server was started without --allow-client-shm"
#define SHM_DEFAULT_MAX_REGIONS_PER_OWNER 64

struct shm_params {
    int allow;                  /* --allow-client-shm; 0: nothing can be registered or named */
    const char *key_prefix;     /* --shm-key-prefix (copied); NULL or "" = any key */
    int max_regions;            /* in the server, both kinds; 0 = SHM_DEFAULT_MAX_REGIONS */
    int max_regions_per_owner;  /* 0 = SHM_DEFAULT_MAX_REGIONS_PER_OWNER */
    uint64_t max_bytes;         /* system regions' byte_size, summed; 0 = half the physical memory */
};

/* NULL p: the defaults, client shared memory off. */
shm_registry_t *shm_registry_create(const struct shm_params *p);
/* Unregisters every region; mappings still referenced by requests go with
 * their last reference. NULL is a no-op. */
void shm_registry_free(shm_registry_t *reg);
/* 1 when the server was started with --allow-client-shm. */
int shm_allowed(const shm_registry_t *reg);
/* The bound on mapped bytes in effect (max_bytes, or the default). */
uint64_t shm_max_bytes(const shm_registry_t *reg);

/* Maps [offset, offset + byte_size) of the shared-memory object key under
 * name for owner. 0, or STATUS_INVALID (client shared memory off, a name the
 * owner already registered, an empty name or one over SHM_NAME_MAX bytes,
 * a key that is not one name, an
 * object the server may not open, a size of 0, a range outside the object,
 * a bound reached) or STATUS_INTERNAL (mmap failed), with err naming the
 * region and why. */
int shm_register(shm_registry_t *reg, shm_owner_t owner, const char *name, const char *key, uint64_t offset,
                 uint64_t byte_size, char *err, size_t err_len);
/* Takes owner's system region name out of the registry; a name that is not
 * registered is not an error (as Triton). */
void shm_unregister(shm_registry_t *reg, shm_owner_t owner, const char *name);
void shm_unregister_all(shm_registry_t *reg, shm_owner_t owner);
/* Every region of owner, of both kinds: its connection closed. */
void shm_drop_owner(shm_registry_t *reg, shm_owner_t owner);
/* Regions registered now, of both kinds and every owner. */
int shm_count(shm_registry_t *reg);

/* Triton's status body: an array of {"name", "key", "offset", "byte_size"},
 * every region of owner (name NULL or "") or the one named. NULL with
 * *status STATUS_NOT_FOUND and err set when owner has no such region, or
 * STATUS_NOMEM. */
cJSON *shm_status_json(shm_registry_t *reg, shm_owner_t owner, const char *name, int *status, char *err,
                       size_t err_len);

/* A reference to owner's region name and the address of [offset, offset +
 * byte_size) inside it (*addr), for a tensor of a request. NULL with err set
 * (the request's error: STATUS_INVALID) when client shared memory is off,
 * the name is not registered by owner, the range is not inside the region or
 * the object shrank under it. what names the tensor in the message ("input
 * 'x'"). */
struct shm_region *shm_acquire(shm_registry_t *reg, shm_owner_t owner, const char *name, uint64_t offset,
                               uint64_t byte_size, const char *what, void **addr, char *err, size_t err_len);
/* Drops a reference from shm_acquire; the last one unmaps. NULL is a no-op.
 * Any thread. */
void shm_region_release(struct shm_region *r);

/* ==== CUDA shared memory (Triton's cuda_shared_memory extension) ==========
 *
 * A client allocates device memory, exports a CUDA IPC handle of it
 * (cudaIpcGetMemHandle: SHM_CUDA_HANDLE_SIZE opaque bytes) and registers it
 * under a name with the device it lives on and its byte_size. The server
 * opens the handle through the CUDA plugin (kernels/plugin.h) and keeps the
 * region in the same registry as system regions, with the same references,
 * range checks and messages: names are unique across both kinds, and
 * shm_acquire finds either. A CUDA region's address is a device pointer:
 * read and write it only through shm_region_read / shm_region_write, which
 * copy through the plugin (synchronous cudaMemcpy, on the caller's thread:
 * the request's I/O thread). The handle is closed with the last reference.
 * --allow-client-shm, owners and the bounds on regions apply as to system
 * regions.
 *
 * Without the plugin or a usable GPU, register is STATUS_UNSUPPORTED with
 * err saying why (the plugin's probe: no driver, no GPU...), and nothing is
 * ever registered. The checks that need no GPU come first: a handle that is
 * not SHM_CUDA_HANDLE_SIZE bytes (or not base64, _b64), a byte_size of 0, a
 * negative device_id, a name already registered (STATUS_INVALID). */
#define SHM_CUDA_HANDLE_SIZE 64

int shm_cuda_register(shm_registry_t *reg, shm_owner_t owner, const char *name, const void *handle,
                      size_t handle_len, int64_t device_id, uint64_t byte_size, char *err, size_t err_len);
/* The same with the handle in base64, as the HTTP body carries it. */
int shm_cuda_register_b64(shm_registry_t *reg, shm_owner_t owner, const char *name, const char *handle_b64,
                          int64_t device_id, uint64_t byte_size, char *err, size_t err_len);
/* As shm_unregister / shm_unregister_all, for CUDA regions only (a system
 * region of that name stays). */
void shm_cuda_unregister(shm_registry_t *reg, shm_owner_t owner, const char *name);
void shm_cuda_unregister_all(shm_registry_t *reg, shm_owner_t owner);
/* Triton's status body: an array of {"name", "device_id", "byte_size"}; NULL
 * with *status STATUS_NOT_FOUND when owner has no CUDA region of that name. */
cJSON *shm_cuda_status_json(shm_registry_t *reg, shm_owner_t owner, const char *name, int *status, char *err,
                            size_t err_len);

/* 1 when CUDA regions can be registered (the plugin is loaded and sees a
 * GPU); probed once per process. */
int shm_cuda_usable(void);

/* n bytes at addr (from shm_acquire on r) into dst, and src into addr: a
 * memcpy for system regions, under the SIGBUS guard, a device copy for CUDA
 * ones. 0, STATUS_INVALID when the client's object no longer covers the
 * bytes (it was truncated: the copy faulted), or STATUS_INTERNAL with err
 * naming the region and CUDA's message. Never read or write a system
 * region's bytes other than through these. */
int shm_region_read(const struct shm_region *r, const void *addr, void *dst, size_t n, char *err, size_t err_len);
int shm_region_write(const struct shm_region *r, void *addr, const void *src, size_t n, char *err, size_t err_len);

#endif
