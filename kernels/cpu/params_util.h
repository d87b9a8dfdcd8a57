/* params_util.h - the last step of an op's prepare that decodes its
 * parameters (kernels/ops.h, op_params_alloc): the decoding fills a struct
 * on prepare's stack, where a refusal leaves nothing to free, and
 * params_keep copies it into the op's state, which op_params_free
 * releases. */
#ifndef KILN_CPU_PARAMS_UTIL_H
#define KILN_CPU_PARAMS_UTIL_H

#include <string.h>

#include "kernels/ops.h"

/* Stores a copy of the size bytes at decoded as *state; 0, or
 * STATUS_NOMEM after op_error. */
static inline int params_keep(struct op_call *c, const void *decoded, size_t size, void **state) {
    void *p = op_params_alloc(c, size);
    if (!p) return STATUS_NOMEM;
    memcpy(p, decoded, size);
    *state = p;
    return 0;
}

#endif
