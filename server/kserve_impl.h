/* kserve_impl.h - what the KServe codec's files share (kserve_read.c,
 * kserve_bind.c, kserve_encode.c); no other module includes it. The public
 * contract is server/kserve.h. */
#ifndef KILN_KSERVE_IMPL_H
#define KILN_KSERVE_IMPL_H

#include <stddef.h>

#include "common/status.h"

#define INVALID(...) status_set(err, err_len, STATUS_INVALID, __VA_ARGS__)

/* kserve_set_max_request_memory's bound; 0 = none. The reader charges a
 * parse against it, the encoder an answer. */
extern size_t kserve_max_request_memory;

#endif
