/* The GPU boundary in a build without nvcc: every entry point says why it cannot run.
 * Compiled only when the Makefile finds no nvcc (and into the fuzz targets). */
#include "base/base.h"
#include "cuda/k3_cuda.h"

#include <stdio.h>

int k3_cuda_device_count(int *count, char *name, size_t name_len, k3_error *err) {
    (void)err;
    *count = 0;
    if (name && name_len) snprintf(name, name_len, "none (k3 was built without CUDA)");
    return K3_OK;
}
