/* Dense projections of the MoE block on the GPU (router gate, latent down/up, shared MLP):
 * a weight matrix uploaded in its file layout and one simple GEMM y[t, o] = sum_c x[t, c] *
 * W[o, c] for small T. Internal to src/cuda (block.cu is its only user).
 *
 * The kernel is one warp per output row and 8 tokens per warp: each lane streams 16-byte
 * chunks of the row, decodes them in registers (F32, BF16, F16, FP8-block E4M3 with its F32
 * 128x128 scale, NVFP4 E2M1 x E4M3 per 16 with the tensor scale applied once at the end,
 * MXFP4 E2M1 x E8M0 per 32) and accumulates in fp32, or in fp64 for the router (so its
 * logits are the correctly rounded dot products the CPU router computes, and a near tie in
 * the top-k does not flip on summation order). What it leaves out: tensor cores and any
 * reuse of a weight row across more than 8 tokens (T > 8 re-reads the row once per 8 tokens,
 * from L2 when it fits), so prefill-sized T is correct but far from the GEMM floor. */
#ifndef K3_DENSE_CUH
#define K3_DENSE_CUH

#include "k3.h"
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "formats/qmat.h"
}

typedef struct DenseMat {
    int fmt;            /* k3_wfmt */
    int O, C;           /* rows (outputs), cols (inputs) */
    const uint8_t *w;   /* device: data in file layout */
    const void *s;      /* device: block scales (FP8_BLOCK float, NVFP4 E4M3, MXFP4 E8M0) */
    int s_cols;         /* scale columns: ceil(C/128) FP8_BLOCK, C/16 NVFP4, C/32 MXFP4 */
    float gs;           /* NVFP4 weight_scale_2; 1 otherwise */
    void *mem;          /* the allocation holding w and s */
} DenseMat;

/* Checks q (format, shape rows x cols, 16-byte rows) and uploads it to the current device.
 * name is used in errors (e.g. "latent down-projection"). */
int k3_dense_upload(const k3_qmat *q, const char *name, int64_t rows, int64_t cols, DenseMat *out,
                    k3_error *err);
void k3_dense_free(DenseMat *m);

/* y[t, o] (+)= sum_c x[t, c] * W[o, c] on device arrays x [T, C] (16-byte aligned), y [T, O].
 * accumulate: y = y + float(dot) (the CPU block's "y += shared" rounding); f64: sum in
 * double and round once. Asynchronous on st. */
int k3_dense_gemm(const DenseMat *m, const float *x, int T, float *y, int accumulate, int f64,
                  cudaStream_t st, k3_error *err);

#endif
