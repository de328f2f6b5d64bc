/* The GPU boundary: the only header through which host code reaches CUDA. Entry points are
 * extern "C", take explicit streams where they launch work, and report failures through
 * k3_error with file:line, the failing statement and the device. The rest of k3 does not
 * know CUDA exists; in a build without nvcc, cuda_absent.c answers every call with
 * K3_ERR_DEVICE and a message saying the binary was built without CUDA. */
#ifndef K3_CUDA_H
#define K3_CUDA_H

#include "k3.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices (0 when the driver or device is absent: not an error).
 * Fills name (if non-NULL) with a description of device 0. */
int k3_cuda_device_count(int *count, char *name, size_t name_len, k3_error *err);

#ifdef __cplusplus
}
#endif
#endif
