/* ipc.cpp - libkiln_cuda.so's entry points for CUDA shared memory (Triton's
 * cuda_shared_memory extension, server/shm.h): open and close a client's
 * cudaIpcMemHandle_t on a device, and copy a range between host memory and
 * an opened region. Each returns 0 or -1 with why set (the failing call, where
 * and CUDA's message); each selects the device first, because the calling
 * thread (an I/O or instance thread of kiln) may never have used it. */
#include <string.h>

#include "kernels/cuda/cuda_util.h"

/* The failing call's message into why (CUDA's sticky error cleared): -1. */
static int failed(char *why, size_t why_len) {
    (void)cudaGetLastError();
    snprintf(why, why_len, "%s", kc_last_error());
    return -1;
}

static int set_device(int device, char *why, size_t why_len) {
    return KC_CUDA_OK(cudaSetDevice(device)) ? 0 : failed(why, why_len);
}

extern "C" int kiln_cuda_ipc_open(int device, const void *handle, size_t handle_len, void **dev_ptr, char *why,
                                  size_t why_len) {
    cudaIpcMemHandle_t h;
    if (handle_len != sizeof h) {
        snprintf(why, why_len, "a CUDA IPC handle is %zu bytes, not %zu", sizeof h, handle_len);
        return -1;
    }
    memcpy(&h, handle, sizeof h);
    if (set_device(device, why, why_len)) return -1;
    void *p = NULL;
    if (!KC_CUDA_OK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess))) return failed(why, why_len);
    *dev_ptr = p;
    return 0;
}

extern "C" int kiln_cuda_ipc_close(int device, void *dev_ptr, char *why, size_t why_len) {
    if (set_device(device, why, why_len)) return -1;
    if (!KC_CUDA_OK(cudaIpcCloseMemHandle(dev_ptr))) return failed(why, why_len);
    return 0;
}

extern "C" int kiln_cuda_copy_to_host(int device, void *dst, const void *src, size_t n, char *why, size_t why_len) {
    if (set_device(device, why, why_len)) return -1;
    if (!KC_CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost))) return failed(why, why_len);
    return 0;
}

extern "C" int kiln_cuda_copy_to_device(int device, void *dst, const void *src, size_t n, char *why,
                                        size_t why_len) {
    if (set_device(device, why, why_len)) return -1;
    if (!KC_CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice))) return failed(why, why_len);
    return 0;
}
