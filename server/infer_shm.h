/* infer_shm.h - a request's tensors in shared memory: the inference core's
 * half of Triton's system shared-memory extension (the registry is
 * server/shm.h, the parameters are read by the codecs into struct
 * kserve_shm).
 *
 * infer_shm_resolve runs before kserve_request_bind: each input that names a
 * region gets its data from there, each output that names one is checked to
 * point inside a registered region, and the request holds a reference to
 * every region it uses until it is cleared (kserve_request_clear), so an
 * unregister in the meantime never unmaps what it reads or writes.
 * infer_shm_write_outputs runs once the outputs are known (computed or from
 * the result cache) and copies each into its region.
 *
 * Errors are the request's (STATUS_INVALID) and name the tensor: client
 * shared memory off (--allow-client-shm), a region that the caller did not
 * register, a range outside it, an object truncated during the copy, a byte size that does not
 * match the input's shape and data type, an output larger than its range.
 *
 * Threads: on the request's thread, like the rest of its life. */
#ifndef KILN_INFER_SHM_H
#define KILN_INFER_SHM_H

#include <stddef.h>

#include "common/tensor.h"
#include "config/model_config.h"
#include "server/kserve.h"
#include "server/shm.h"

/* Regions are looked up among owner's (the caller's: server/shm.h). An
 * input's bytes are copied out of its region into a block the request owns
 * (never used in place), under the region's SIGBUS guard. */
int infer_shm_resolve(struct kserve_request *r, const char *model, shm_registry_t *reg, shm_owner_t owner, char *err,
                      size_t err_len);
/* outputs[mc->noutputs], in the model's order. */
int infer_shm_write_outputs(const struct kserve_request *r, const struct model_config *mc,
                            const struct tensor *outputs, char *err, size_t err_len);

#endif
