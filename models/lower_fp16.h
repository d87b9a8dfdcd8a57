/* lower_fp16.h - an FP16/BF16 graph made FP32 inside, its FP16 inputs and
 * outputs kept (models/lower_fp16.c). */
#ifndef KILN_LOWER_FP16_H
#define KILN_LOWER_FP16_H

#include <stddef.h>

#include "graph/graph.h"

/* Lowers g in place (nothing to do for an FP32 graph). 0, or a negative
 * status with err set. */
int lower_fp16(struct graph *g, char *err, size_t err_len);

#endif
