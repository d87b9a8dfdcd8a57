/* plugin.h - loading optional backends from shared objects at run time.
 *
 * build/libkiln_cuda.so exports (extern "C"):
 *   int kiln_cuda_probe(char *why, size_t why_len);
 *       number of usable devices (0 with why set when none)
 *   struct backend *kiln_cuda_backend_create(const struct backend_params *p,
 *                                            char *why, size_t why_len);
 *   int kiln_cuda_ipc_open(int device, const void *handle, size_t handle_len,
 *                          void **dev_ptr, char *why, size_t why_len);
 *   int kiln_cuda_ipc_close(int device, void *dev_ptr, char *why, size_t why_len);
 *   int kiln_cuda_copy_to_host(int device, void *dst, const void *src, size_t n,
 *                              char *why, size_t why_len);
 *   int kiln_cuda_copy_to_device(int device, void *dst, const void *src, size_t n,
 *                                char *why, size_t why_len);
 *       CUDA shared memory (server/shm.h): a client's cudaIpcMemHandle_t
 *       opened and closed on a device, synchronous copies between host memory
 *       and device memory; 0, or -1 with why set
 * It is looked up beside the kiln binary first (/proc/self/exe's folder),
 * then through the dynamic loader's path (LD_LIBRARY_PATH, ldconfig),
 * or at $KILN_CUDA_PLUGIN when set. */
#ifndef KILN_PLUGIN_H
#define KILN_PLUGIN_H

#include <stddef.h>

struct backend;
struct backend_params;

/* Loads the plugin once (thread-safe); returns its handle or NULL with why set. */
void *plugin_cuda_handle(char *why, size_t why_len);
/* Path the plugin was loaded from, or NULL. */
const char *plugin_cuda_path(void);
int plugin_cuda_probe(char *why, size_t why_len);
struct backend *plugin_cuda_create(const struct backend_params *p, char *why, size_t why_len);
/* The plugin's CUDA shared-memory calls (above); -1 with why set also when
 * the plugin is absent or does not export them. Any thread. */
int plugin_cuda_ipc_open(int device, const void *handle, size_t handle_len, void **dev_ptr, char *why,
                         size_t why_len);
int plugin_cuda_ipc_close(int device, void *dev_ptr, char *why, size_t why_len);
int plugin_cuda_copy_to_host(int device, void *dst, const void *src, size_t n, char *why, size_t why_len);
int plugin_cuda_copy_to_device(int device, void *dst, const void *src, size_t n, char *why, size_t why_len);

#endif
