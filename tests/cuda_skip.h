/* The device check shared by the GPU tests: on a machine without a usable CUDA device,
 * NEED_GPU() skips the calling test with a line saying so, so the suite runs unchanged on
 * the CPU-only build machine.
 *
 * Header-only (static functions) like moe_fixture.h; include it after <cmocka.h>. It leaves
 * out device selection: the tests run on device 0. */
#ifndef K3_TEST_CUDA_SKIP_H
#define K3_TEST_CUDA_SKIP_H

#include "cuda/k3_cuda.h"

#include <stdio.h>

static int gpu_state = -1;
static char gpu_name[256]; /* k3_cuda_device_count's description of device 0 */

static int have_gpu(void) {
    if (gpu_state < 0) {
        int n = 0;
        k3_error e = {0};
        gpu_state = k3_cuda_device_count(&n, gpu_name, sizeof gpu_name, &e) == K3_OK && n > 0;
    }
    return gpu_state;
}

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (!have_gpu()) {                                                                         \
            printf("SKIP: no CUDA device (%s)\n", gpu_name);                                       \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

#endif
