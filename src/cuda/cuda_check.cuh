/* CUDA error reporting for the .cu files: every runtime call goes through K3_CUDA_TRY, which
 * writes file:line, the statement, the error string and the device into a k3_error and
 * returns K3_ERR_DEVICE from the enclosing function. */
#ifndef K3_CUDA_CHECK_CUH
#define K3_CUDA_CHECK_CUH

#include "k3.h"
#include <cuda_runtime.h>
#include <stdio.h>

static inline int k3_cuda_fail(k3_error *err, cudaError_t e, const char *stmt, const char *file,
                               int line) {
    if (err) {
        int dev = -1;
        cudaGetDevice(&dev);
        snprintf(err->msg, sizeof err->msg, "%s:%d: %s: %s (device %d)", file, line, stmt,
                 cudaGetErrorString(e), dev);
        err->status = K3_ERR_DEVICE;
    }
    return K3_ERR_DEVICE;
}

#define K3_CUDA_TRY(err, stmt)                                                                \
    do {                                                                                      \
        cudaError_t k3_e_ = (stmt);                                                           \
        if (k3_e_ != cudaSuccess) return k3_cuda_fail((err), k3_e_, #stmt, __FILE__, __LINE__); \
    } while (0)

#endif
