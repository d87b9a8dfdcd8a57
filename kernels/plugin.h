/* plugin.h - loading optional backends from shared objects at run time.
 *
 * build/libkiln_cuda.so exports (extern "C"):
 *   int kiln_cuda_probe(char *why, size_t why_len);
 *       number of usable devices (0 with why set when none)
 *   struct backend *kiln_cuda_backend_create(const struct backend_params *p,
 *                                            char *why, size_t why_len);
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

#endif
