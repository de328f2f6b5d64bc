/* The grouped backend's GEMMs on sm_90a for a few or many tokens per expert: warpgroup MMA
 * (wgmma) with the 4-bit weights decoded into the A fragment in registers, the activations of
 * TN = 32 tokens gathered by cp.async into shared memory as the B operand, for 12 to 32 tokens
 * per expert (above, the warp-specialized tiles of moe_prefill_ws.cu). (Tiles of 8 and 16 tokens
 * were built and measured: 42-50% of the copy bandwidth at T = 8..256, below the mma.sync tiles'
 * 57-82%, so the decode sizes stay on mma.sync; tiles of 64 and 128 tokens never beat 32 below
 * 32 tokens per expert nor k_wgp above, and were retired in the twenty-sixth session.)
 *
 * One CTA = two warpgroups = 8 warps = 8 x MT 16-row tiles of weight rows x TN tokens of one
 * expert's work item, over all of K in 64-k stages. Every byte
 * arrives by cp.async into a ring of shared-memory stages, so no load in flight occupies
 * registers. Per 16-k step each warp decodes its fragment once (from shared memory) into
 * that step's slot of a four-step register ring, while the three steps before it are still
 * in the tensor cores, and issues per tile one wgmma
 * m64nTNk16 on the hi terms and, in w4a16 (NP = 2), one on the lo terms into the same fp32
 * accumulators (hi + lo summed by the tensor core: the exact w4a16 contract of moe_dev.cuh);
 * w4a16-bf16 and w4a4 carry one term (NP = 1): half the MMAs and half the activation bytes
 * per stage. Numerics are those of the mma.sync path: only fp32 accumulation order differs.
 * (A warp-specialized variant - a producer warpgroup feeding two consumer warpgroups through
 * mbarriers, 128-token tiles, one CTA per SM - was built and measured slower: 76.7 vs 66.2 ms
 * at T = 8192, 30.1 vs 19.4 ms at T = 2048; lab/NOTES.md v7.)
 *
 * Grid: x = 128-row blocks (fast), y = work items, so the CTAs that share one item's
 * activation rows run together and find them in L2, while each expert's weights stream
 * from HBM once per item. The weight unit layout is the mma.sync one (moe_layout.cu). */
#include "cuda/cuda_check.cuh"
#include "cuda/moe_state.cuh"
#include "cuda/moe_prefill.cuh"
#include "cuda/moe_wgmma.cuh"

extern "C" {
#include "base/base.h"
#include "moe/activation.h"
}

#define WG_THREADS 256

/* Tokens per tile, and 16-row tiles per warp: MT = 2 decodes two tiles per stage against the same
 * activation stage (half the fills, barriers and B reads per weight row; 32 accumulators and
 * 32 A registers per thread stay under 128). */
#define WG_TN 32
#define WG_MT 2

/* Ring depth: as many stages as fit in 112 KB (two CTAs per SM with the alignment slack: 2 x
 * (112 + 1 + 1 reserved) KB = the SM's 228 KB), at most 8; stage s computes while s + 1 .. s +
 * STAGES - 2 load and s - 1 may still be in the tensor cores. (114 KB gave the same depths.) */
#define WG_SMEM_BUDGET (112 * 1024)
__host__ __device__ constexpr int wg_stages(int tn, int np, int mt) {
    return WG_SMEM_BUDGET / wg_stage_bytes(tn, np, mt) < 8 ? WG_SMEM_BUDGET / wg_stage_bytes(tn, np, mt) : 8;
}
__host__ __device__ constexpr int wg_smem_bytes(int tn, int np, int mt) {
    return wg_stages(tn, np, mt) * wg_stage_bytes(tn, np, mt);
}

/* Issues the copies of stage s (k0 = 64 s) into buffer buf: this thread's share of the B rows
 * (two threads per row take alternate 16-byte pieces: one 32-byte sector per pair) and, per
 * warp, its tiles' half units of codes and the units' scales. */
template <int FMT, int TN, int NP, int MT>
__device__ __forceinline__ void wg_fill(uint32_t sbase, int buf, int s, const __half *src, int K, int nf, int pair,
                                        int gq0, bool have_row, const uint8_t *const wunit[MT],
                                        const uint8_t *const sunit[MT], int warp, int lane) {
    constexpr int STEP = 128 / TN, SBY = FMT == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
    const uint32_t st = sbase + buf * wg_stage_bytes(TN, NP, MT);
#pragma unroll
    for (int gq = 0; gq < 4 * NP; gq += STEP) { /* q >> 2 = part: 0 hi, 1 lo */
        const int q = gq + gq0, p = q >> 2, g = 2 * (q & 3) + pair;
        const __half *sp = src + p * K + s * WG_KS + g * 8;
        cp_async16(st + p * wg_part_bytes(TN) + wg_bpiece(nf, g), have_row ? (const void *)sp : (const void *)src,
                   have_row ? 16 : 0);
    }
    const int c = s >> 1, h = s & 1;
#pragma unroll
    for (int t = 0; t < MT; t++) {
        const uint32_t wd = st + NP * wg_part_bytes(TN) + (warp * MT + t) * WG_WBYTES;
        cp_async16(wd + lane * 16, wunit[t] + (size_t)c * UNIT_W + h * 512 + lane * 16, 16);
        if (lane < SBY / 16) cp_async16(wd + 512 + lane * 16, sunit[t] + (size_t)c * SBY + lane * 16, 16);
    }
}

/* One 16-k step KS of half H: once the previous stage's step KS has left the tensor cores
 * (its group is the fourth newest), this warp's A fragments of step KS are rewritten and the
 * step's products issued as one more group; so three steps stay in flight while one decodes. */
template <int FMT, int TN, int NP, int MT, int H, int KS>
__device__ __forceinline__ void wg_step(float acc[MT][TN / 2], uint32_t a[MT][4][4], const uint4 w[MT],
                                        const uint4 sc[MT], uint32_t d0) {
    wg_wait<3>();
#pragma unroll
    for (int t = 0; t < MT; t++)
        decode_step<FMT>(w[t], w[t], sc[t], 4 * H + KS, a[t][KS][0], a[t][KS][1], a[t][KS][2], a[t][KS][3]);
    wg_fence();
#pragma unroll
    for (int t = 0; t < MT; t++) wg_mma_step<TN, NP, KS>(acc[t], a[t][KS], d0);
    wg_commit();
}

/* One 64-k stage s (half H of unit s / 2). */
template <int FMT, int TN, int NP, int MT, int H>
__device__ __forceinline__ void wg_stage(int s, int nst, uint32_t sbase, float acc[MT][TN / 2], uint32_t a[MT][4][4],
                                         const __half *src, int K, int nf, int pair, int gq0, bool have_row,
                                         const uint8_t *const wunit[MT], const uint8_t *const sunit[MT], int warp,
                                         int lane) {
    constexpr int ST = wg_stages(TN, NP, MT), AHEAD = ST - 2;
    cp_async_wait<AHEAD - 1>();
    fence_async_smem();
    __syncthreads(); /* stage s landed for all; every warp's stage s - 2 MMAs are done */
    if (s + AHEAD < nst)
        wg_fill<FMT, TN, NP, MT>(sbase, (s + AHEAD) % ST, s + AHEAD, src, K, nf, pair, gq0, have_row, wunit, sunit,
                                 warp, lane);
    cp_async_commit();
    const int buf = s % ST;
    uint4 w[MT], sc[MT];
#pragma unroll
    for (int t = 0; t < MT; t++) wg_words<FMT, TN, NP, MT>(sbase, buf, warp, lane, t, w[t], sc[t]);
    const uint32_t d0 = wg_desc_sw128_lo(sbase + buf * wg_stage_bytes(TN, NP, MT));
    wg_step<FMT, TN, NP, MT, H, 0>(acc, a, w, sc, d0);
    wg_step<FMT, TN, NP, MT, H, 1>(acc, a, w, sc, d0);
    wg_step<FMT, TN, NP, MT, H, 2>(acc, a, w, sc, d0);
    wg_step<FMT, TN, NP, MT, H, 3>(acc, a, w, sc, d0);
}

/* All of K for one work item: accumulators of this warp's MT tiles of 16 rows x TN tokens. */
template <int FMT, int TN, int NP, int MT>
__device__ __forceinline__ void wg_mainloop(float acc[MT][TN / 2], const uint8_t *const wunit[MT],
                                            const uint8_t *const sunit[MT], int nk, uint32_t sbase, const __half *src,
                                            int K, int nf, int pair, int gq0, bool have_row, int warp, int lane) {
    constexpr int AHEAD = wg_stages(TN, NP, MT) - 2;
    const int nst = 2 * nk;
#pragma unroll
    for (int s = 0; s < AHEAD; s++) {
        if (s < nst) wg_fill<FMT, TN, NP, MT>(sbase, s, s, src, K, nf, pair, gq0, have_row, wunit, sunit, warp, lane);
        cp_async_commit();
    }
#pragma unroll
    for (int t = 0; t < MT; t++)
#pragma unroll
        for (int i = 0; i < TN / 2; i++) acc[t][i] = 0.f;
    uint32_t a[MT][4][4];
#pragma unroll 1
    for (int s = 0; s < nst; s += 2) { /* nst is even: the unit's two halves */
        wg_stage<FMT, TN, NP, MT, 0>(s, nst, sbase, acc, a, src, K, nf, pair, gq0, have_row, wunit, sunit, warp, lane);
        wg_stage<FMT, TN, NP, MT, 1>(s + 1, nst, sbase, acc, a, src, K, nf, pair, gq0, have_row, wunit, sunit, warp,
                                     lane);
    }
    wg_wait<0>();
}

template <int FMT, int ACT, int FC2, int NP>
__global__ void __launch_bounds__(WG_THREADS, 2) k_wg(MoeDev m, MoeRun r) {
    constexpr int TN = WG_TN, MT = WG_MT;
    extern __shared__ __align__(1024) uint8_t wsm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int W = r.ctl[1];
    const int mtiles = FC2 ? m.m2 : m.m1, nk = FC2 ? m.nk2 : m.nk1, K = FC2 ? m.I : m.H;
    const int mt0 = (blockIdx.x * 8 + warp) * MT;
    const int SB = FMT == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
    const uint32_t sbase = wg_align1024(smem_u32(wsm));
    const int pair = tid & 1, nf = (tid >> 1) % TN, gq0 = (tid >> 1) / TN;
    const __half *plain = (const __half *)(FC2 ? r.hq : r.xq);
    for (int wi = blockIdx.y; wi < W; wi += gridDim.y) {
        const int4 wk = r.work[wi];
        const int e = wk.x, p0 = wk.y, n = wk.z;
        const uint8_t *wunit[MT], *sunit[MT];
#pragma unroll
        for (int t = 0; t < MT; t++) { /* tiles past the end load the last one and store nothing */
            const size_t tile = (size_t)e * mtiles + (mt0 + t < mtiles ? mt0 + t : mtiles - 1);
            wunit[t] = (const uint8_t *)((FC2 ? m.w2 : m.w1) + tile * nk * 64);
            sunit[t] = (FC2 ? m.s2 : m.s1) + tile * nk * SB;
        }
        const bool have_row = nf < n;
        const int row = have_row ? (FC2 ? p0 + nf : r.sorted_tok[p0 + nf]) : 0;
        const __half *src = plain + (size_t)row * 2 * K;
        float acc[MT][TN / 2];
        wg_mainloop<FMT, TN, NP, MT>(acc, wunit, sunit, nk, sbase, src, K, nf, pair, gq0, have_row, warp, lane);
        cp_async_wait<0>();
        __syncthreads(); /* the next item's prologue reuses the buffers */
#pragma unroll
        for (int t = 0; t < MT; t++)
            if (mt0 + t < mtiles) wg_epilogue<FMT, ACT, TN, FC2>(m, r, e, p0, n, mt0 + t, g, q, acc[t]);
    }
}

/* Reports whether this binary carries the sm_90a instructions (run once per handle). */
__global__ void k_wg_probe(int *out) { *out = K3_WGMMA; }

typedef void (*kern_t)(MoeDev, MoeRun);
#define WACTS(X, F)                                                                                          \
    X(F, K3_ACT_IDENTITY), X(F, K3_ACT_GELU), X(F, K3_ACT_RELU), X(F, K3_ACT_SILU), X(F, K3_ACT_SWIGLU),  \
        X(F, K3_ACT_GEGLU), X(F, K3_ACT_SWIGLU_BIAS), X(F, K3_ACT_RELU2), X(F, K3_ACT_SITU)
#define WG1K1(F, A) (kern_t)k_wg<F, A, 0, 1>
#define WG1K2(F, A) (kern_t)k_wg<F, A, 0, 2>
#define WG2K(F, P) (kern_t)k_wg<F, K3_ACT_IDENTITY, 1, P>

/* [terms - 1][fmt][act - 1] */
static const kern_t wg_fc1_table[2][2][9] = {
    {{WACTS(WG1K1, FMT_NV)}, {WACTS(WG1K1, FMT_MX)}},
    {{WACTS(WG1K2, FMT_NV)}, {WACTS(WG1K2, FMT_MX)}},
};
static const kern_t wg_fc2_table[2][2] = {
    {WG2K(FMT_NV, 1), WG2K(FMT_MX, 1)},
    {WG2K(FMT_NV, 2), WG2K(FMT_MX, 2)},
};

int moe_wg_probe(int *ok, k3_error *err) {
    int *d = NULL, h = 0;
    K3_CUDA_TRY(err, cudaMalloc(&d, sizeof(int)));
    k_wg_probe<<<1, 1>>>(d);
    cudaError_t ce = cudaGetLastError();
    if (ce == cudaSuccess) ce = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (ce != cudaSuccess) return k3_cuda_fail(err, ce, "k_wg_probe", __FILE__, __LINE__);
    *ok = h;
    return K3_OK;
}

int moe_wg_launch(const k3_cuda_moe *m, const MoeDev &d, const MoeRun &r, int fc2, int tn, int wmax, cudaStream_t st,
                  k3_error *err) {
    if (tn != WG_TN) return k3_fail(err, K3_ERR_ARG, "wgmma path: %d tokens per tile (%d)", tn, WG_TN);
    /* FC1 rows from the one gated table (moe/activation.h), as the upload sized them */
    const int tiles = fc2 ? d.m2 : (int)(k3_act_fc1_rows(m->act, d.I) / 16);
    const int pi = r.np == 2 ? 1 : 0;
    kern_t k = fc2 ? wg_fc2_table[pi][m->fmt] : wg_fc1_table[pi][m->fmt][(int)m->act - 1];
    return wg_launch(k, tiles, 8 * WG_MT, wmax, WG_THREADS, wg_smem_bytes(WG_TN, r.np, WG_MT) + WG_ALIGN_SLACK, st, d, r,
                     fc2 ? "k_wg<fc2><<<>>>" : "k_wg<fc1><<<>>>", err);
}
