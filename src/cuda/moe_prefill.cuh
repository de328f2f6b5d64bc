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
 * [TN / 8 row groups of 1024 B] x [8 k-groups of 128 B] x [8 rows of 16 B] (core matrices
 * K-adjacent at 128 B = lbo, N-adjacent at 1024 B = sbo), then each warp's weights. */
__host__ __device__ constexpr int wg_part_bytes(int tn) { return tn * WG_KS * 2; }
__host__ __device__ constexpr int wg_stage_bytes(int tn, int np) { return np * wg_part_bytes(tn) + 8 * WG_WBYTES; }

/* The A fragments of the four 16-k steps of half h (a compile-time constant) of a unit from
 * this warp's weights in buffer buf (32-bit shared addresses keep the hot loop's registers
 * down: at 128 per thread, two CTAs fit on an SM). */
template <int FMT, int TN, int NP>
__device__ __forceinline__ void wg_decode(uint32_t sbase, int buf, int h, int warp, int lane, uint32_t a[4][4]) {
    const uint32_t wd = sbase + buf * wg_stage_bytes(TN, NP) + NP * wg_part_bytes(TN) + warp * WG_WBYTES;
    const uint4 w = lds128(wd + lane * 16);
    uint4 sc;
    if (FMT == FMT_NV) {
        sc = lds128(wd + 512 + (lane >> 2) * 16);
    } else {
        uint2 t = lds64(wd + 512 + (lane >> 2) * 8);
        sc = make_uint4(t.x, t.y, 0, 0);
    }
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        if (h) decode_step<FMT>(w, w, sc, 4 + ks, a[ks][0], a[ks][1], a[ks][2], a[ks][3]);
        else decode_step<FMT>(w, w, sc, ks, a[ks][0], a[ks][1], a[ks][2], a[ks][3]);
    }
}

/* The 4 NP products of one 64-k stage in slot descriptor d0: per 16-k step KS (at 2 x 128 B)
 * the hi part and (NP = 2) the lo part one part further, into the same accumulators. */
template <int TN, int NP>
__device__ __forceinline__ void wg_mma_stage(float acc[TN / 2], uint32_t a[4][4], uint64_t d0) {
#define WG_MMA(KS)                                                                                         \
    do {                                                                                                   \
        wgmma_tn<TN, KS * 256>(acc, a[KS][0], a[KS][1], a[KS][2], a[KS][3], d0);                           \
        if (NP == 2) wgmma_tn<TN, KS * 256 + wg_part_bytes(TN)>(acc, a[KS][0], a[KS][1], a[KS][2], a[KS][3], d0); \
    } while (0)
    WG_MMA(0);
    WG_MMA(1);
    WG_MMA(2);
    WG_MMA(3);
#undef WG_MMA
}

/* Launches one of these GEMM kernels over (16-row tiles / 8 row blocks) x (work items, at most
 * 65535: the kernels loop over the rest) with its shared memory. */
typedef void (*wg_kern_t)(MoeDev, MoeRun);
static inline int wg_launch(wg_kern_t k, int tiles, int wmax, int threads, int smem, cudaStream_t st, const MoeDev &d,
                            const MoeRun &r, const char *what, k3_error *err) {
    K3_CUDA_TRY(err, cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    /* tile groups fast: the work items fast instead measured 3-10% slower at T = 1024 .. 8192
     * (lab/NOTES.md v13), the opposite of the mma.sync decode kernels */
    dim3 grid((tiles + 7) / 8, wmax < 65535 ? wmax : 65535);
    k<<<grid, threads, smem, st>>>(d, r);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? K3_OK : k3_cuda_fail(err, e, what, __FILE__, __LINE__);
}

#endif
