/* Timing of the GPU MoE block for tools/gpu-check: the block on device-resident random
 * tokens, launched back to back after a warm-up, CUDA events around the batch. It times
 * exactly k3_cuda_block_run (no host copies, no allocation: the workspace is grown by the
 * warm-up). What it leaves out: a per-stage breakdown (the experts' own benchmark,
 * k3_cuda_bench_run, has one for the routed part). */
#include "cuda/cuda_check.cuh"
#include "cuda/k3_cuda.h"

extern "C" {
#include "base/base.h"
}

#include <stdlib.h>

extern "C" int k3_cuda_block_time(k3_cuda_block *cb, k3_cuda_backend b, k3_act_mode mode, int width, int T,
                                  int reps, uint64_t seed, double *us, k3_error *err) {
    *us = 0;
    if (T < 1 || reps < 1 || width < 1) return k3_fail(err, K3_ERR_ARG, "cuda block time: T %d, reps %d, width %d", T, reps, width);
    int rc = k3_cuda_block_check(cb, b, mode, T, err);
    if (rc) return rc;
    const int K = k3_cuda_block_top_k(cb);
    const size_t nx = (size_t)T * width, nk = (size_t)T * K;
    float *hx = (float *)malloc(nx * sizeof *hx);
    if (!hx) return k3_fail(err, K3_ERR_NOMEM, "cuda block time: x [%d, %d]", T, width);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < nx; i++) { /* uniform in [-1, 1): finite, K3-like magnitude */
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        hx[i] = (float)((double)((s * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-52 - 1.0);
    }
    char *buf = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaError_t ce = cudaMalloc(&buf, 2 * nx * 4 + 2 * nk * 4 + 1024);
    if (ce == cudaSuccess) ce = cudaMemcpy(buf, hx, nx * 4, cudaMemcpyHostToDevice);
    if (ce == cudaSuccess) ce = cudaEventCreate(&e0);
    if (ce == cudaSuccess) ce = cudaEventCreate(&e1);
    free(hx);
    if (ce != cudaSuccess) rc = k3_cuda_fail(err, ce, "cuda block time: setup", __FILE__, __LINE__);
    float *dx = (float *)buf, *dy = (float *)(buf + ((nx * 4 + 255) & ~(size_t)255));
    int32_t *di = (int32_t *)((char *)dy + ((nx * 4 + 255) & ~(size_t)255));
    float *dw = (float *)((char *)di + ((nk * 4 + 255) & ~(size_t)255));
    for (int i = 0; i < 3 && rc == K3_OK; i++) rc = k3_cuda_block_run(cb, b, mode, dx, T, dy, di, dw, NULL, err);
    if (rc == K3_OK && (ce = cudaDeviceSynchronize()) != cudaSuccess) rc = k3_cuda_fail(err, ce, "warm-up", __FILE__, __LINE__);
    if (rc == K3_OK) cudaEventRecord(e0, NULL);
    for (int i = 0; i < reps && rc == K3_OK; i++) rc = k3_cuda_block_run(cb, b, mode, dx, T, dy, di, dw, NULL, err);
    if (rc == K3_OK) {
        cudaEventRecord(e1, NULL);
        float ms = 0;
        ce = cudaEventSynchronize(e1);
        if (ce == cudaSuccess) ce = cudaEventElapsedTime(&ms, e0, e1);
        if (ce != cudaSuccess) rc = k3_cuda_fail(err, ce, "cuda block time: events", __FILE__, __LINE__);
        else *us = 1e3 * ms / reps;
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(buf);
    return rc;
}
