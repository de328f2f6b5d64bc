/* Device discovery for the GPU boundary. A missing driver or device is a count of zero,
 * not an error, so CPU-only machines (CI) run the same binary and GPU tests skip. */
#include "cuda/k3_cuda.h"
#include "cuda/cuda_check.cuh"

#include <cuda_runtime.h>
#include <stdio.h>

extern "C" int k3_cuda_device_count(int *count, char *name, size_t name_len, k3_error *err) {
    (void)err;
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        if (name && name_len) snprintf(name, name_len, "none (%s)", cudaGetErrorString(e));
        return K3_OK;
    }
    *count = n;
    if (name && name_len) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
            snprintf(name, name_len, "%s (sm_%d%d, %d SMs, %.1f GiB)", p.name, p.major, p.minor,
                     p.multiProcessorCount, (double)p.totalGlobalMem / (1u << 30));
    }
    return K3_OK;
}
