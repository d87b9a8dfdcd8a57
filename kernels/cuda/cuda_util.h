/* cuda_util.h - checked vendor calls and facts about this build, shared by
 * the plugin's host sources (backend.cpp, blas.cpp, doctor_gpu.cpp). */
#ifndef KILN_CUDA_UTIL_H
#define KILN_CUDA_UTIL_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <stdio.h>

extern "C" {
#include "common/log.h"
#include "kernels/backend.h"
}

/* Set by cuda.mk from the architectures it builds for. */
#ifndef KILN_CUDA_ARCHS
#define KILN_CUDA_ARCHS "75 80 86 89 90"
#endif
#ifndef KILN_CUDA_PTX
#define KILN_CUDA_PTX 90
#endif

/* Each records the failing call and where, into a message; the caller turns
 * it into a status with op_error / status_set. */
#define KC_CUDA_OK(call) kc_cuda_ok((call), #call, __FILE__, __LINE__)
#define KC_CUBLAS_OK(call) kc_cublas_ok((call), #call, __FILE__, __LINE__)
#define KC_CUDNN_OK(call) kc_cudnn_ok((call), #call, __FILE__, __LINE__)

/* The last failure's text ("cudaMalloc(...) at backend.cpp:12: out of memory"). */
const char *kc_last_error(void);
int kc_cuda_ok(cudaError_t e, const char *call, const char *file, int line);
int kc_cublas_ok(cublasStatus_t e, const char *call, const char *file, int line);
int kc_cudnn_ok(cudnnStatus_t e, const char *call, const char *file, int line);

/* Architectures this build carries code for (from KILN_CUDA_ARCHS, e.g.
 * "75 80 86 89 90", and PTX for KILN_CUDA_PTX). 1 if a device of compute
 * capability major.minor can run this build's kernels; *how says "SASS sm_90"
 * or "PTX compute_90 (JIT)" or "none". */
int kc_build_runs_on(int major, int minor, char *how, size_t how_len);

/* Per-instance state of the CUDA backend (one thread at a time). */
struct kc_instance {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    cudnnHandle_t dnn;
    size_t workspace_limit;   /* largest scratch a node may ask for */
    /* Pinned staging: host->device copies go through it so they are
     * asynchronous; device->host copies land in it and are copied out at
     * synchronize. Grown (never per batch once warm), reset at synchronize. */
    unsigned char *stage;
    size_t stage_cap, stage_off;
    struct pending_out { void *dst; size_t off, n; } *pend;
    int npend, pend_cap;
    int capturing;
};

/* cuBLASLt MatMul/Gemm and cuDNN Conv/pooling nodes (blas.cpp). */
int kc_lib_supports(struct kc_instance *in, const struct op_call *c, char *why, size_t why_len);
int kc_lib_prepare(struct kc_instance *in, struct op_call *c, void **state, size_t *workspace);
int kc_lib_run(struct kc_instance *in, struct op_call *c, void *state);
void kc_lib_release(void *state);
/* 1 if op_type is one of the library ops (MatMul, Gemm, Conv, MaxPool...). */
int kc_lib_handles(const char *op_type);

#endif
