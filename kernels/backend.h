/* backend.h - the backend interface: one static const table of function
 * pointers per backend, wrapped with its context (ggml's backend_i).
 *
 * The CPU backend is always registered and is the reference. Other backends
 * (CUDA, in build/libkiln_cuda.so) are found by backend_registry_init() at
 * start; a missing plugin, driver or device is a log line, not an error.
 *
 * Memory: buffer_alloc returns memory the backend's kernels can read and write
 * (device memory for CUDA). copy_* are asynchronous on the backend's stream;
 * synchronize waits for everything queued. A backend instance is used by one
 * thread at a time (one per model instance). */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include <stddef.h>

#include "kernels/ops.h"

struct backend;

struct backend_i {
    const char *name; /* "cpu", "cuda" */
    void (*free)(struct backend *be);
    void *(*buffer_alloc)(struct backend *be, size_t size);
    void (*buffer_free)(struct backend *be, void *ptr);
    int (*copy_to_device)(struct backend *be, void *dst, const void *src, size_t size);
    int (*copy_to_host)(struct backend *be, void *dst, const void *src, size_t size);
    /* 1 if this backend can run this node with these (concrete) shapes. */
    int (*supports_op)(struct backend *be, const struct op_call *c);
    /* Chooses an algorithm, sizes a workspace; state is freed by release_node. */
    int (*prepare_node)(struct backend *be, struct op_call *c, void **state, size_t *workspace);
    int (*run_node)(struct backend *be, struct op_call *c);
    void (*release_node)(struct backend *be, const struct graph_node *node, void *state);
    int (*synchronize)(struct backend *be);
    /* Optional (NULL): capture the node sequence run between begin and end
     * into *graph, and replay it later with the same buffers. */
    int (*graph_begin)(struct backend *be);
    int (*graph_end)(struct backend *be, void **graph);
    int (*graph_replay)(struct backend *be, void *graph);
    void (*graph_free)(struct backend *be, void *graph);
};

struct backend {
    const struct backend_i *iface;
    void *context;
    int device;       /* device ordinal, -1 for the CPU */
    int host_memory;  /* 1 if buffers are plain host memory (CPU) */
};

struct backend_params {
    int device;    /* ordinal for device backends */
    int nthreads;  /* CPU threads this instance may use; 0 = all cores */
};

/* The CPU backend; never NULL unless out of memory. */
struct backend *backend_cpu_create(const struct backend_params *p);
/* Frees any backend; NULL is a no-op. */
void backend_free(struct backend *be);

/* Probes optional backends once (dlopen of libkiln_cuda.so beside the binary
 * or on the library path). why receives one plain sentence when a backend is
 * not usable ("no CUDA driver: libcuda.so.1 not found ..."). Returns the
 * number of usable devices for name ("cuda"), 0 when none. */
int backend_available(const char *name, char *why, size_t why_len);
/* Creates a backend by name ("cpu", "cuda"); NULL with why set if not available. */
struct backend *backend_create(const char *name, const struct backend_params *p, char *why, size_t why_len);

#endif
