/* dispatch.h - ONNX nodes -> kiln's custom CUDA kernels (kernels.h).
 *
 * The part of the CUDA backend that reads a node's attributes and shapes and
 * turns them into kernel launches. It is host C++ that only uses the CUDA
 * runtime subset emu/emu.h also provides, so the very same code is tested on
 * machines without a GPU (tests/kernels/test_cuda_emu) and runs in
 * libkiln_cuda.so. cuBLASLt and cuDNN ops live in backend.cpp.
 *
 * Tensors' data are device pointers. Inputs that parametrize a node (Slice
 * starts, Pad pads, Reduce axes, Clip bounds...) must be constant at plan
 * time; kd_prepare reads them once (from host or device memory) into the
 * node's state, with every descriptor the launches need, so kd_run only
 * queues kernels (and can be captured into a CUDA graph). */
#ifndef KILN_CUDA_DISPATCH_H
#define KILN_CUDA_DISPATCH_H

#include "kernels/cuda/kernels.h"

extern "C" {
#include "kernels/ops.h"
}

/* 1 if the custom kernels run this node with these shapes and dtypes; when
 * 0 and why is non-NULL, why says what is missing. */
int kd_supports(const struct op_call *c, char *why, size_t why_len);
/* Builds the node's launch state (*state, freed by kd_release). Returns 0 or
 * a negative status after op_error(). */
int kd_prepare(struct op_call *c, void **state);
/* Queues the node on stream s; state from kd_prepare (NULL: refused with
 * op_error, since the run path never decodes attributes). */
int kd_run(struct op_call *c, void *state, cudaStream_t s);
void kd_release(void *state);
/* 1 if op_type (default domain) is one the custom kernels handle at all. */
int kc_op_known(const char *op_type);
/* Calls fn for every op type the custom kernels handle (docs, tests). */
void kd_foreach_op(void (*fn)(const char *op_type, void *arg), void *arg);

#endif
