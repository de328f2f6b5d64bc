/* Pieces of the sm_90a GEMM kernels of the grouped backend (moe_prefill.cu): the
 * shared-memory stage layout, the decode of a warp's weights from a stage, the MMA issue of a
 * stage and the launch. Their epilogue (wg_epilogue) sits with the mma.sync ones in
 * moe_dev.cuh. */
#ifndef K3_MOE_PREFILL_CUH
#define K3_MOE_PREFILL_CUH

#include "cuda/cuda_check.cuh"
#include "cuda/moe_dev.cuh"
#include "cuda/moe_wgmma.cuh"

extern "C" {
#include "base/base.h"
}

#define WG_KS 64      /* k per shared-memory stage: half a weight unit */
#define WG_WBYTES 640 /* per warp and stage: 512 B of codes (half a unit) + the unit's scales (<= 128 B) */

/* Shared-memory layout of one stage: the activations, part (hi, lo; hi only when np = 1) x
 * [TN / 8 atoms of 1024 B] x [8 rows of 128 B] in wgmma's 128-byte swizzle (wg_desc_sw128):
 * row r's 16-byte piece kg (k 8 kg .. 8 kg + 7 of the stage) sits at piece kg ^ (r & 7) of the
 * row; then the weights of the CTA's tiles (k_wg: 8 x MT, warp w holding tiles w * MT ..
 * w * MT + MT - 1; k_wgp: 16). Every part and stage starts on a 1024-byte boundary (TN is a
 * multiple of 8, the weight block a multiple of 1024 B). The unswizzled layout this replaced
 * (core matrices of 8 rows x 16 B) made ncu count 51% excess shared-memory wavefronts in k_wgp,
 * where the tensor cores' B reads alone take half the SM's shared-memory bandwidth at peak
 * (m64nNk16 reads 32 N bytes per 2048 N flops). */
__host__ __device__ constexpr int wg_part_bytes(int tn) { return tn * WG_KS * 2; }
__host__ __device__ constexpr int wg_stage_bytes(int tn, int np, int mt) { return np * wg_part_bytes(tn) + 8 * mt * WG_WBYTES; }
__host__ __device__ constexpr uint32_t wg_bpiece(int row, int kg) {
    return (uint32_t)((row >> 3) * 1024 + (row & 7) * 128 + ((kg ^ (row & 7)) << 4));
}

/* This lane's code word of the four 16-k steps of half h of tile t's unit, and the scales
 * (32-bit shared addresses keep the hot loop's registers down: at 128 per thread, two CTAs
 * fit on an SM). */
template <int FMT, int TN, int NP, int MT>
__device__ __forceinline__ void wg_words(uint32_t sbase, int buf, int warp, int lane, int t, uint4 &w, uint4 &sc) {
    const uint32_t wd = sbase + buf * wg_stage_bytes(TN, NP, MT) + NP * wg_part_bytes(TN) + (warp * MT + t) * WG_WBYTES;
    w = lds128(wd + lane * 16);
    if (FMT == FMT_NV) {
        sc = lds128(wd + 512 + (lane >> 2) * 16);
    } else {
        uint2 v = lds64(wd + 512 + (lane >> 2) * 8);
        sc = make_uint4(v.x, v.y, 0, 0);
    }
}

/* The NP products of 16-k step KS (32 B into the rows of the stage's descriptor d0) for one
 * tile: the hi part and (NP = 2) the lo part one part further, into the same accumulators. */
template <int TN, int NP, int KS>
__device__ __forceinline__ void wg_mma_step(float acc[TN / 2], const uint32_t a[4], uint32_t d0) {
    wgmma_tn<TN, KS * 32>(acc, a[0], a[1], a[2], a[3], d0);
    if (NP == 2) wgmma_tn<TN, KS * 32 + wg_part_bytes(TN)>(acc, a[0], a[1], a[2], a[3], d0);
}

/* Launches one of these GEMM kernels over (16-row tiles / tiles per CTA) x (work items, at
 * most 65535: the kernels loop over the rest) with its shared memory. */
typedef void (*wg_kern_t)(MoeDev, MoeRun);
static inline int wg_launch(wg_kern_t k, int tiles, int cta_tiles, int wmax, int threads, int smem, cudaStream_t st,
                            const MoeDev &d, const MoeRun &r, const char *what, k3_error *err) {
    K3_CUDA_TRY(err, cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    /* tile groups fast: the work items fast instead measured 3-10% slower at T = 1024 .. 8192
     * (lab/NOTES.md v13), the opposite of the mma.sync decode kernels */
    dim3 grid((tiles + cta_tiles - 1) / cta_tiles, wmax < 65535 ? wmax : 65535);
    k<<<grid, threads, smem, st>>>(d, r);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? K3_OK : k3_cuda_fail(err, e, what, __FILE__, __LINE__);
}

#endif
