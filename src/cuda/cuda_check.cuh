/* CUDA error reporting for the .cu files: every runtime call goes through K3_CUDA_TRY, which
 * writes file:line, the statement, the error string and the device into a k3_error and
 * returns K3_ERR_DEVICE from the enclosing function; and the device-pointer rule the entry
 * points share (k3_cuda_rows_aligned). */
#ifndef K3_CUDA_CHECK_CUH
#define K3_CUDA_CHECK_CUH

#include "k3.h"
#include <cuda_runtime.h>
#include <stdint.h>
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

/* The device rows x and y (who's arguments d_x, d_y) must start 16-byte aligned: the MoE reads
 * and writes them 16 bytes at a time, and a misaligned row faults the whole context. K3_OK, or
 * K3_ERR_ARG naming who and both pointers. */
static inline int k3_cuda_rows_aligned(k3_error *err, const char *who, const void *x, const void *y) {
    if (!(((uintptr_t)x | (uintptr_t)y) & 15)) return K3_OK;
    if (err) {
        snprintf(err->msg, sizeof err->msg, "%s: d_x (%p) and d_y (%p) must be 16-byte aligned", who, x, y);
        err->status = K3_ERR_ARG;
    }
    return K3_ERR_ARG;
}

#define K3_CUDA_TRY(err, stmt)                                                                \
    do {                                                                                      \
        cudaError_t k3_e_ = (stmt);                                                           \
        if (k3_e_ != cudaSuccess) return k3_cuda_fail((err), k3_e_, #stmt, __FILE__, __LINE__); \
    } while (0)

#endif
