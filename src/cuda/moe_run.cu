/* The two GPU MoE backends over an uploaded k3_cuda_moe.
 *
 * Grouped (any T), six launches on one stream (fc1 / fc2 are the wgmma kernels of
 * moe_prefill.cu instead once experts average >= 12 tokens, pick_wg, 32-token tiles, and the
 * warp-specialized ones of moe_prefill_ws.cu from 32, pick_wp, 48, 80, 128 or 160):
 *   prep      the first nd blocks count the slots per expert over ranges of them, the last to
 *             finish makes the offsets and work items of <= tn tokens per expert (dsp_count);
 *             the other blocks turn x rows into the fp16 B layout;
 *   scatter   the sorted positions, each block its range's (dsp_scatter);
 *   fc1       grid (work items x 16-row tiles / 8: 4 warps of two tiles each): swap-AB mma.sync,
 *             the weight rows in the MMA M slot, tokens in N; activation in the epilogue,
 *             h = [P, I] fp32 (bf16 in w4a16-bf16 on k_wgp);
 *   hconv     h rows into the B layout (the row scale needs the whole row's |h| max);
 *   fc2       the same tile loop over w2, unweighted rows per (token, slot);
 *   finalize  y[t] = sum over local slots in slot order of w * row: deterministic.
 * The launches after prep are programmatic dependent launches (launch_chain; not the
 * warp-specialized kernels): each may start while its predecessor drains and waits (pdl_wait)
 * before reading what it wrote.
 * Fused (decode): the same stages in one cooperative persistent kernel; T*k <= 64 streams them
 * through per-item and per-token counters and flags after one grid barrier, larger batches take four;
 * T <= K3_CUDA_FUSED_MAX_TOKENS, T*k <= K3_CUDA_FUSED_MAX_SLOTS, else K3_ERR_LIMIT.
 * Kernel specializations: format x activation x tokens-per-tile x fp16 terms per activation
 * (grouped: two in w4a16, one in w4a16-bf16 and w4a4) and format x activation x K split (fused,
 * two terms); per-expert activation parameters are runtime values. Split-K is not
 * used across CTAs; for T*k <= 64 the two K halves of a tile run in one CTA (ksplit_reduce,
 * in k_fc and fused_halves), and the mma.sync tiles issue only the 8-column fragments an
 * item's tokens fill (tile_mma_fit). */
#include "cuda/cuda_check.cuh"
#include "cuda/k3_cuda.h"
#include "cuda/moe_state.cuh"

extern "C" {
#include "base/base.h"
#include "moe/activation.h"
}

#include <stdlib.h>
#include <string.h>

/* ---- kernels -------------------------------------------------------------------------------- */

/* Block-wide max with NaN propagation; red: 32 floats of shared memory. */
__device__ float block_amax(float v, float *red) {
    for (int o = 16; o; o >>= 1) v = nanmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[w] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < nw; i++) r = nanmax(r, red[i]);
    __syncthreads();
    return r;
}

__device__ void prep_x_row(const MoeDev &m, const MoeRun &r, int t, float *red) {
    const float *x = r.x + (size_t)t * m.H;
    const float am = block_amax(row_amax(x, m.H, threadIdx.x, blockDim.x), red);
    quant_row(x, m.H, am, r.mode, m.g1, (uint32_t *)(r.xq + (size_t)t * m.nk1 * 32), r.xs + t, threadIdx.x,
              blockDim.x, r.plain, r.np == 2);
}

/* Blocks [0, r.nd) count the slots (dsp_count; the last of them scans), the others turn x rows
 * into the B layout. */
__global__ void __launch_bounds__(256) k_prep(MoeDev m, MoeRun r) {
    extern __shared__ int smem[];
    pdl_launch(); /* k_scatter's few blocks may take their slots early; they wait for this grid */
    if ((int)blockIdx.x < r.nd) {
        dsp_count(m, r, blockIdx.x, smem);
        return;
    }
    for (int t = blockIdx.x - r.nd; t < r.T; t += gridDim.x - r.nd) prep_x_row(m, r, t, (float *)smem);
}

__global__ void __launch_bounds__(256) k_scatter(MoeDev m, MoeRun r) {
    extern __shared__ int smem[];
    pdl_wait();
    dsp_scatter(m, r, blockIdx.x, smem);
}

/* In-CTA split-K for small T: with r.ks = 2 the warps w and w + wpc (wpc = warps per K half)
 * take the two halves of K of the same tile; the upper half's accumulators go through shared
 * memory and are added in a fixed order (lower + upper), so the result does not depend on
 * timing. At T = 1 this turns 1.3 waves of whole-K tiles into ~3 waves of half-K tiles. */
/* Warps per K part of this CTA (a power of two); shifts and masks only, and derived from the
 * special registers wherever needed rather than held through the tile loop (a division there
 * cost up to 18 registers). */
__device__ __forceinline__ int kpart_warps(int ks) { return (int)(blockDim.x >> 5) >> (ks - 1); }

template <int NT>
__device__ __forceinline__ bool ksplit_reduce(float acc[NT][4], bool active, float (*red)[NT * 4][32], int ks) {
    const int lane = threadIdx.x & 31, wpc = kpart_warps(ks), wl = (threadIdx.x >> 5) & (wpc - 1),
              upper = (threadIdx.x >> 5) >= wpc;
    if (ks == 2) {
        if (upper && active)
#pragma unroll
            for (int f = 0; f < NT; f++)
#pragma unroll
                for (int i = 0; i < 4; i++) red[wl][f * 4 + i][lane] = acc[f][i];
        __syncthreads();
        if (upper) return false;
        if (active)
#pragma unroll
            for (int f = 0; f < NT; f++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[f][i] += red[wl][f * 4 + i][lane];
    }
    return active;
}

/* M tiles per warp of the grouped mma.sync kernels (gemm_tile's MT): two, sharing the B
 * fragments. H200, NVFP4 w4a16, same call, one tile -> two: T = 8 617 -> 568 us, 64 3306 ->
 * 2951, 256 6753 -> 5712; w4a16-bf16 T = 256 5245 -> 4438 (lab/NOTES.md v14). */
#define FC_MT 2

/* tile_mma with as few 8-column fragments as this work item's tokens need (NT is sized for the
 * average expert: under uniform routing at T = 256 about half the items have <= 4 tokens and
 * would otherwise issue a second fragment of zero columns). Unused fragments are zeroed; the
 * epilogues skip their columns (j >= n). */
template <int FMT, int NT, int FC2, int NP, int MT, int RP = 0>
__device__ __forceinline__ void tile_mma_fit(const MoeDev &m, const MoeRun &r, int4 wk, int mt, int c0, int c1,
                                             int lane, float acc[MT * NT][4]) {
    if constexpr (NT >= 2) {
        if (wk.z <= 4 * (3 - NP) * (NT / 2)) { /* the tokens fit half the fragments */
            float half[MT * (NT / 2)][4];
            tile_mma_fit<FMT, NT / 2, FC2, NP, MT, RP>(m, r, wk, mt, c0, c1, lane, half);
#pragma unroll
            for (int t = 0; t < MT; t++)
#pragma unroll
                for (int f = 0; f < NT; f++)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[t * NT + f][i] = f < NT / 2 ? half[t * (NT / 2) + f][i] : 0.f;
            return;
        }
    }
    tile_mma<FMT, NT, FC2, NP, MT, RP>(m, r, wk, mt, c0, c1, lane, acc, FC2 == 1);
}

/* The epilogue of one tile: FC1 applies the activation, FC2 writes unweighted rows. */
template <int FMT, int ACT, int NT, int FC2, int NP>
__device__ __forceinline__ void tile_epi(const MoeDev &m, const MoeRun &r, int4 wk, int mt, int lane,
                                         float acc[NT][4]) {
    if (FC2) fc2_epi<NT, NP>(m, r, wk, mt, lane, acc);
    else fc1_epi<FMT, ACT, NT, NP>(m, r, wk, mt, lane, acc);
}

/* FC2's work items in bands of FC_BAND, the items fast within a band and the bands slow (a 1-D
 * grid, fc_grid), where its token rows outgrow L2: every 16-row tile group reads all of hq
 * (S x I fp16 terms), and with the items fast over the whole grid one group's pass over them
 * evicts hq from L2 before the next group reads it again, so each of the 28 groups of the K3
 * FC2 re-reads it from HBM (T = 256: hq 50 MB with two terms, 25 with one; 50 MB of L2 on the
 * H100). H100, one call, two rounds, automatic path, NVFP4 / MXFP4, us: w4a16 T = 256
 * 6636-6665 / 6348-6354 -> 6214-6229 / 5891-5909, T = 512 8722-8773 / 7989-8089 -> 7786-7979 /
 * 7344-7410; w4a16-bf16 T = 256 6012-6014 / 5784-5786 -> 5927-5928 / 5674-5677, T = 512 6840-6845
 * / 6491-6495 -> 6418-6419 / 6034; bands of 32 and 192 within 0.5% of 96. Always banded, T = 8 / 64
 * (hq 1.5 / 12.6 MB) lost NVFP4 1.2% / 0.6%: used where hq exceeds a third of L2. FC1's token
 * rows (xq, T x H) stay small: bands level there (lab/NOTES.md v24). */
#define FC_BAND 96

/* The block's work item and tile group in the banded 1-D grid. */
__device__ __forceinline__ void fc_banded(int band, int groups, int &wi, int &gy) {
    const int items = gridDim.x / groups, per = band * groups, q = blockIdx.x / per, rem = blockIdx.x - q * per;
    const int nb = min(band, items - q * band);
    gy = rem / nb;
    wi = q * band + rem - gy * nb;
}

/* FC1 (activation epilogue) or FC2 (unweighted rows) over grid (work items x groups of wpc * MT
 * 16-row tiles; wpc = warps per K part, fc_wpc). Work items are the fast grid dimension, so the
 * CTAs in flight read many experts at once: with the tile groups fast instead (a few experts at a time) the H200
 * measured T = 1 / 8 / 64 14%, 9% and 4% slower and w4a16-bf16 T = 256 17% slower (lab/NOTES.md
 * v13). BANDS: the 1-D banded grid of fc_grid (FC2 where hq outgrows L2). */
template <int FMT, int ACT, int NT, int FC2, int NP, int BANDS = 0>
__global__ void __launch_bounds__(2 * 32 * WARPS) k_fc(MoeDev m, MoeRun r) {
    constexpr int MT = FC_MT;
    __shared__ float red[WARPS][MT * NT * 4][32];
    if (!FC2) pdl_wait(); /* FC2 waits after its first weight loads (gemm_tile): prep is done */
    const int mtiles = FC2 ? m.m2 : m.m1, lane = threadIdx.x & 31, nk = FC2 ? m.nk2 : m.nk1;
    const int wpc = kpart_warps(r.ks), upper = (threadIdx.x >> 5) >= wpc;
    /* the banded order is its own instantiation: computed in every kernel, its two registers
     * cost the NVFP4 NT = 1 kernels a CTA per SM (72 -> 74 registers; T = 1 131 -> 139 us) */
    int wi = blockIdx.x, gy = blockIdx.y;
    if constexpr (BANDS) fc_banded(FC_BAND, (mtiles + wpc * MT - 1) / (wpc * MT), wi, gy);
    const int mt = (gy * wpc + ((threadIdx.x >> 5) & (wpc - 1))) * MT;
    const bool active = wi < r.ctl[1] && mt < mtiles;
    const int c0 = upper ? nk / 2 : 0, c1 = r.ks == 1 || upper ? nk : nk / 2;
    float acc[MT * NT][4];
    int4 wk = active ? r.work[wi] : make_int4(0, 0, 0, 0);
    if (active) tile_mma_fit<FMT, NT, FC2, NP, MT>(m, r, wk, mt, c0, c1, lane, acc);
    pdl_launch();
    if (ksplit_reduce<MT * NT>(acc, active, red, r.ks))
#pragma unroll
        for (int t = 0; t < MT; t++)
            if (mt + t < mtiles) tile_epi<FMT, ACT, NT, FC2, NP>(m, r, wk, mt + t, lane, acc + t * NT);
}

/* 16 CTAs per SM (32 registers): the old one-pair loop's occupancy; hconv is bandwidth-bound at prefill sizes. */
__global__ void __launch_bounds__(128, 16) k_hconv(MoeDev m, MoeRun r) {
    pdl_wait();
    pdl_launch();
    if ((int)blockIdx.x >= r.ctl[0]) return;
    if (r.hb16) hconv_row_b16(m, r, blockIdx.x, threadIdx.x, blockDim.x);
    else hconv_row(m, r, blockIdx.x, threadIdx.x, blockDim.x);
}

#define FIN_THREADS 128

/* finalize_elem over columns c .. c + 3 (H is a multiple of 128, moe_layout): the same sums in
 * the same order, one 16-byte load per slot instead of four 4-byte ones (H100 finalize stage
 * T = 2048 194-203 -> 167-169 us, T = 8192 771-789 -> 654-656). */
__global__ void __launch_bounds__(FIN_THREADS) k_finalize(MoeDev m, MoeRun r) {
    pdl_wait();
    const int c = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= m.H) return;
    for (int t = blockIdx.y; t < r.T; t += gridDim.y) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int j = 0; j < r.k; j++) {
            const int s = t * r.k + j;
            if ((unsigned)(r.ids[s] - m.first_local) < (unsigned)m.n_local) {
                const float w = r.rw[s];
                const float4 v = *(const float4 *)(r.part + (size_t)s * m.H + c);
                acc.x += w * v.x;
                acc.y += w * v.y;
                acc.z += w * v.z;
                acc.w += w * v.w;
            }
        }
        *(float4 *)(r.y + (size_t)t * m.H + c) = acc;
    }
}

__device__ __forceinline__ void grid_sync(unsigned long long *ctr, unsigned long long target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(ctr, 1ULL);
        unsigned long long v;
        for (;;) {
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(ctr) : "memory");
            if (v >= target) break;
            __nanosleep(32);
        }
        __threadfence();
    }
    __syncthreads();
}

__device__ __forceinline__ void fused_stamp(const MoeRun &r, int i) {
    if (r.stamps && blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        r.stamps[i] = t;
    }
}

/* ---- the fused kernel ------------------------------------------------------------------------ */

/* M tiles per warp of the fused whole-K units. H200, same call, one -> two: NVFP4 T = 64 3627 ->
 * 3340 us, MXFP4 3455 -> 3139, T = 8 level (lab/NOTES.md v14). */
#define FUSED_MT 2

/* One whole-K GEMM phase (T*k > 64) over the units (work item, FUSED_MT 16-row tiles), work
 * items the fast index, one warp per unit from a queue (one atomicAdd per warp), so a warp that
 * finishes early takes the next unit as the grouped grids' CTAs are scheduled: H200, same call,
 * NVFP4 T = 8 / 64: 833 -> 699, 4056 -> 3729 us against static assignment (v14). */
template <int FMT, int ACT, int FC2>
__device__ __forceinline__ void fused_whole(const MoeDev &m, const MoeRun &r, int W) {
    constexpr int MT = FUSED_MT;
    const int lane = threadIdx.x & 31, mtiles = FC2 ? m.m2 : m.m1, nk = FC2 ? m.nk2 : m.nk1;
    int *queue = r.ctl + 2 + FC2; /* units handed out in order, zeroed by the dispatch */
    const int U = W * ((mtiles + MT - 1) / MT);
    for (;;) {
        int it = lane == 0 ? atomicAdd(queue, 1) : 0;
        it = __shfl_sync(0xffffffffu, it, 0);
        if (it >= U) break;
        const int4 wk = r.work[it % W];
        const int mt = it / W * MT;
        float acc[MT][4];
        tile_mma<FMT, 1, FC2, 2, MT>(m, r, wk, mt, 0, nk, lane, acc);
#pragma unroll
        for (int t = 0; t < MT; t++)
            if (mt + t < mtiles) tile_epi<FMT, ACT, 1, FC2, 2>(m, r, wk, mt + t, lane, acc + t);
    }
}

/* Decode sizes (T*k <= S = FUSED_HALVES_SLOTS, so at most S tokens and S work items). Counters
 * of the stream hand-offs, after the stamps in the ctl block (ensure_ws), zeroed by the
 * dispatch: local slots per token [S], finished FC1 units per work item [S], finished FC2 units
 * per (token, tile group) [S x groups], h ready per work item [S]. */
#define FUSED_TILES 4 /* 16-row tiles per unit: 2 warps per K half x FC_MT */
#define FUSED_HALVES_SLOTS 64 /* T*k of the halves path: the counters are sized for it */
__device__ __forceinline__ int *fused_cnt(const MoeRun &r) { return r.ctl + 16; }
static __host__ __device__ __forceinline__ int fused_groups(int mtiles) {
    return (mtiles + FUSED_TILES - 1) / FUSED_TILES;
}
static __host__ __device__ __forceinline__ int fused_cnt_ints(int m2) {
    return FUSED_HALVES_SLOTS * (3 + fused_groups(m2));
}
__device__ __forceinline__ int *fused_ready(const MoeRun &r, int m2) {
    return fused_cnt(r) + FUSED_HALVES_SLOTS * (2 + fused_groups(m2));
}

/* An integer the compiler cannot see through: values derived from it are computed where they are
 * used instead of being hoisted out of a loop and held in registers across it. */
__device__ __forceinline__ int opaque_zero() {
    int z;
    asm volatile("mov.u32 %0, 0;" : "=r"(z));
    return z;
}

/* One halves GEMM phase: the grouped k_fc CTA body (warps 0-1 the lower K half, 2-3 the upper,
 * FC_MT tiles per warp sharing the B fragments, the halves added lower + upper through shared
 * memory) over units (work item v / G, group v % G of FUSED_TILES tiles: the items the slow
 * index). A CTA's first unit is its index, a queue hands out the rest. No hconv or finalize phase
 * follows and no grid barrier separates FC1 from FC2: the last unit of a work item to finish FC1
 * (counter per item) converts that item's h rows, whose |h| max is then complete, and raises the
 * item's ready flag, which its FC2 units wait for; the last unit of a (token, tile group) to
 * finish FC2 sums that token's 64 output columns over its local slots in slot order
 * (deterministic; tokens with no local slot are zeroed by k_fused). Each hand-off: the CTA's
 * stores, a fence, the counter or flag; the reading CTA fences (acquires) before reading.
 * Why the items are the slow index: they then finish FC1 one after another, so the CTAs that run
 * out of FC1 units stream the FC2 weights of finished items while the last FC1 units run, instead
 * of idling at a grid barrier (with the items the fast index every item finished at the end of
 * FC1, and the same flags without the barrier were 11 us slower at T = 1, v19). No wait can
 * deadlock: a CTA enters FC2 only when every FC1 unit has been handed out to a running CTA. */
__device__ __forceinline__ int halves_mt(int v, int G) { return (v % G * 2 + ((threadIdx.x >> 5) & 1)) * FC_MT; }

template <int FMT, int ACT, int FC2>
__device__ __forceinline__ void fused_halves(const MoeDev &m, const MoeRun &r, int W, float (*red)[FC_MT * 4][32]) {
    constexpr int MT = FC_MT, S = FUSED_HALVES_SLOTS;
    __shared__ int next, lastbits, wsh;
    if (threadIdx.x == 0) wsh = W, next = -1;
    __syncthreads(); /* every thread reads wsh from the first iteration on */
    /* Only `next` and `wsh` (shared memory) carry the unit loop: everything else is derived again
     * from the kernel parameters in each iteration, before and after the chunk loop, so that the
     * chunk loop has the registers of the grouped k_fc. Held across it at 80 registers, the unit
     * state spilled into the chunk loop (3 LDL per chunk, 396 instructions against k_fc's 343). */
    for (;;) {
        {
            const int z = opaque_zero(), mtiles = (FC2 ? m.m2 : m.m1) + z, Wv = *(volatile int *)&wsh;
            if (threadIdx.x == 0) next = next < 0 ? blockIdx.x : (int)gridDim.x + atomicAdd(r.ctl + 2 + FC2 + z, 1);
            if (FC2 && threadIdx.x == 0 && next < Wv * fused_groups(mtiles)) { /* wait for the item's h */
                const int *rdy = fused_ready(r, m.m2) + z + next / fused_groups(mtiles);
                for (;;) {
                    int v;
                    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(rdy) : "memory");
                    if (v) break;
                    __nanosleep(64);
                }
            }
            __syncthreads();
            if (next >= Wv * fused_groups(mtiles)) break; /* next is rewritten only after ksplit_reduce */
        }
        float acc[MT][4];
        {
            const int z = opaque_zero(), mtiles = (FC2 ? m.m2 : m.m1) + z, nk = (FC2 ? m.nk2 : m.nk1) + z;
            const int v = next, lane = threadIdx.x & 31, upper = (threadIdx.x >> 5) >= 2;
            const int G = fused_groups(mtiles), mt = halves_mt(v, G);
            if (mt < mtiles)
                tile_mma_fit<FMT, 1, FC2, 2, MT, 1>(m, r, r.work[v / G], mt, upper ? nk / 2 : 0, upper ? nk : nk / 2, lane,
                                                 acc);
        }
        const int z = opaque_zero(), mtiles = (FC2 ? m.m2 : m.m1) + z, G = fused_groups(mtiles);
        const int v = *(volatile int *)&next, lane = threadIdx.x & 31;
        const int wi = v / G, grp = v % G, mt = halves_mt(v, G);
        const bool active = mt < mtiles;
        const int4 wk = ld_v4i(r.work + wi);
        if (ksplit_reduce<MT>(acc, active, red, 2))
#pragma unroll
            for (int t = 0; t < MT; t++)
                if (mt + t < mtiles) tile_epi<FMT, ACT, 1, FC2, 2>(m, r, wk, mt + t, lane, acc + t);
        __syncthreads();
        if (threadIdx.x == 0) {
            int *tneed = fused_cnt(r) + z, *icnt = tneed + S, *tcnt = icnt + S;
            __threadfence();
            int bits = 0;
            if (!FC2) {
                bits = atomicAdd(icnt + wi, 1) == G - 1;
            } else {
                for (int j = 0; j < wk.z; j++) {
                    const int t = r.sorted_tok[wk.y + j];
                    if (atomicAdd(tcnt + t * G + grp, 1) == tneed[t] - 1) bits |= 1 << j;
                }
            }
            if (bits) __threadfence();
            lastbits = bits;
        }
        __syncthreads();
        const int bits = lastbits;
        if (bits && !FC2) {
            for (int j = 0; j < wk.z; j++) hconv_row(m, r, wk.y + j, threadIdx.x, blockDim.x);
            __syncthreads(); /* bits is the same in every thread */
            if (threadIdx.x == 0) {
                __threadfence();
                asm volatile("st.release.gpu.global.s32 [%0], 1;" ::"l"(fused_ready(r, m.m2) + z + wi) : "memory");
            }
        } else if (bits) {
            const int c = grp * FUSED_TILES * 16 + threadIdx.x;
            for (int j = 0; j < wk.z; j++)
                if ((bits >> j & 1) && threadIdx.x < FUSED_TILES * 16 && c < m.H)
                    finalize_elem(m, r, r.sorted_tok[wk.y + j], c);
        }
    }
}

/* One persistent kernel: dispatch + x prep, FC1, FC2 and the weighted sum. It reads both fp16
 * terms in every mode (NP = 2: in w4a4 / w4a16-bf16 the lo terms are zero or tiny) so that its
 * instantiations stay format x activation x K split.
 * KS = 2 (T*k <= 64): one grid barrier (after the dispatch); the units stream into each other
 * through the counters and flags of fused_halves. H100, one call, NVFP4 T = 1 / 2 / 4, with a
 * barrier after FC1 and the items the fast index: 135-137 / 244-247 / 419-421 us; the items the
 * slow index with ready flags instead of that barrier: 136-137 / 225 / 395; that and each CTA's
 * first unit its index (no queue atomic ahead of the first weight load): 124-125 / 223-224 / 394
 * (lab/NOTES.md v23). FUSED_MINB = 7 CTAs of 4 warps per SM: 72 registers (ptxas, nvcc 13.0:
 * no local memory in the NVFP4 chunk loops; the MXFP4 FC2 loop reloads one spilled value per
 * chunk). H100, one call, T = 1: 124.5 us against 127 at 6 CTAs per SM and 137 at 8 (v23).
 * Measured and not kept: an L2 prefetch of each CTA's first FC1 / FC2 unit across the two waits
 * (H200, v19), +3 us; fetching the next unit from the queue while the current one reduces (H100,
 * v22), level; an L2 bulk prefetch 3 or 6 chunks ahead in the chunk loop (H100, v23), +60%.
 * KS = 1: four grid barriers with an hconv and a finalize phase between the GEMM phases. */
#ifndef FUSED_MINB /* lab builds may set it (lab/variant.sh -DFUSED_MINB=N) */
#define FUSED_MINB 7
#endif
/* KS = 1 (T*k > 64): 4 CTAs per SM cap the whole-K units at 128 registers (158 at 1; ptxas,
 * nvcc 13.0). H100, one call, NVFP4 T = 8 / 16 / 64: 792 / 1432 / 3918 -> 773 / 1391 / 3795 us,
 * T <= 4 (KS = 2) unchanged (lab/NOTES.md v24). */
#ifndef FUSED_MINB1 /* lab builds may set it */
#define FUSED_MINB1 4
#endif
#define FUSED_BARRIERS(ks) ((ks) == 2 ? 1 : 4)
template <int FMT, int ACT, int KS>
__global__ void __launch_bounds__(128, KS == 2 ? FUSED_MINB : FUSED_MINB1) k_fused(MoeDev m, MoeRun r) {
    extern __shared__ int smem[];
    const int nb = gridDim.x;
    const unsigned long long base = r.bar_base;
    fused_stamp(r, 0);
    if (blockIdx.x == 0) moe_dispatch(m, r, smem, KS == 2 ? fused_cnt(r) : nullptr, KS == 2 ? fused_cnt_ints(m.m2) : 0);
    else
        for (int t = blockIdx.x - 1; t < r.T; t += nb - 1) prep_x_row(m, r, t, (float *)smem);
    grid_sync(r.bar, base + (unsigned long long)nb);
    fused_stamp(r, 1);
    const int W = *(volatile int *)(r.ctl + 1), P = *(volatile int *)r.ctl;
    if (KS == 2) {
        __shared__ float red[WARPS][FC_MT * 4][32];
        for (int t = blockIdx.x; t < r.T; t += nb) /* no local slot: no unit sums this token */
            if (fused_cnt(r)[t] == 0)
                for (int c = threadIdx.x; c < m.H; c += blockDim.x) r.y[(size_t)t * m.H + c] = 0.f;
        fused_halves<FMT, ACT, 0>(m, r, W, red);
        fused_stamp(r, 2);
        fused_stamp(r, 3);
        fused_halves<FMT, ACT, 1>(m, r, W, red);
        fused_stamp(r, 4);
        fused_stamp(r, 5);
        return;
    }
    fused_whole<FMT, ACT, 0>(m, r, W);
    grid_sync(r.bar, base + 2ull * nb);
    fused_stamp(r, 2);
    for (int p = blockIdx.x; p < P; p += nb) hconv_row(m, r, p, threadIdx.x, blockDim.x);
    grid_sync(r.bar, base + 3ull * nb);
    fused_stamp(r, 3);
    fused_whole<FMT, ACT, 1>(m, r, W);
    grid_sync(r.bar, base + 4ull * nb);
    fused_stamp(r, 4);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < r.T * m.H; i += nb * blockDim.x)
        finalize_elem(m, r, i / m.H, i % m.H);
    fused_stamp(r, 5);
}

/* ---- specialization tables -------------------------------------------------------------------- */

typedef void (*kern_t)(MoeDev, MoeRun);

#define ACTS(X, F, N)                                                                                \
    X(F, K3_ACT_IDENTITY, N), X(F, K3_ACT_GELU, N), X(F, K3_ACT_RELU, N), X(F, K3_ACT_SILU, N),      \
        X(F, K3_ACT_SWIGLU, N), X(F, K3_ACT_GEGLU, N), X(F, K3_ACT_SWIGLU_BIAS, N),                  \
        X(F, K3_ACT_RELU2, N), X(F, K3_ACT_SITU, N)
#define FC1K2(F, A, N) (kern_t)k_fc<F, A, N, 0, 2>
#define FC1K1(F, A, N) (kern_t)k_fc<F, A, N, 0, 1>
#define FUSK(F, A, N) (kern_t)k_fused<F, A, N>

/* [terms - 1][fmt][nt index][act - 1] */
static const kern_t fc1_table[2][2][3][9] = {
    {{{ACTS(FC1K1, FMT_NV, 1)}, {ACTS(FC1K1, FMT_NV, 2)}, {ACTS(FC1K1, FMT_NV, 4)}},
     {{ACTS(FC1K1, FMT_MX, 1)}, {ACTS(FC1K1, FMT_MX, 2)}, {ACTS(FC1K1, FMT_MX, 4)}}},
    {{{ACTS(FC1K2, FMT_NV, 1)}, {ACTS(FC1K2, FMT_NV, 2)}, {ACTS(FC1K2, FMT_NV, 4)}},
     {{ACTS(FC1K2, FMT_MX, 1)}, {ACTS(FC1K2, FMT_MX, 2)}, {ACTS(FC1K2, FMT_MX, 4)}}},
};
#define FC2K(F, N, P, B) (kern_t)k_fc<F, K3_ACT_IDENTITY, N, 1, P, B>
#define FC2NT(F, P, B) {FC2K(F, 1, P, B), FC2K(F, 2, P, B), FC2K(F, 4, P, B)}
/* [bands][terms - 1][fmt][nt index] */
static const kern_t fc2_table[2][2][2][3] = {
    {{FC2NT(FMT_NV, 1, 0), FC2NT(FMT_MX, 1, 0)}, {FC2NT(FMT_NV, 2, 0), FC2NT(FMT_MX, 2, 0)}},
    {{FC2NT(FMT_NV, 1, 1), FC2NT(FMT_MX, 1, 1)}, {FC2NT(FMT_NV, 2, 1), FC2NT(FMT_MX, 2, 1)}},
};
/* [K split - 1][fmt][act - 1] */
static const kern_t fused_table[2][2][9] = {{{ACTS(FUSK, FMT_NV, 1)}, {ACTS(FUSK, FMT_MX, 1)}},
                                           {{ACTS(FUSK, FMT_NV, 2)}, {ACTS(FUSK, FMT_MX, 2)}}};

/* ---- host side ------------------------------------------------------------------------------- */

extern "C" const char *k3_cuda_backend_name(k3_cuda_backend b) {
    return b == K3_CUDA_GROUPED ? "cuda" : b == K3_CUDA_FUSED ? "cuda-fused" : "unknown";
}

extern "C" int k3_cuda_moe_check(const k3_cuda_moe *m, k3_cuda_backend b, k3_act_mode mode, int T, int k,
                                 k3_error *err) {
    const char *bn = k3_cuda_backend_name(b);
    if (!m) return k3_fail(err, K3_ERR_ARG, "%s: no uploaded experts", bn);
    if (b != K3_CUDA_GROUPED && b != K3_CUDA_FUSED) return k3_fail(err, K3_ERR_ARG, "backend %d: unknown", (int)b);
    if (T < 0) return k3_fail(err, K3_ERR_ARG, "%s: T = %d tokens", bn, T);
    if (k < 1 || k > K3_CUDA_MAX_TOPK)
        return k3_fail(err, K3_ERR_LIMIT, "%s: top-k %d, the cuda backends take 1..%d", bn, k, K3_CUDA_MAX_TOPK);
    if ((long long)T * k > 0x7fffffffLL / 4) return k3_fail(err, K3_ERR_LIMIT, "%s: T*k = %lld too large", bn, (long long)T * k);
    if (mode == K3_MODE_W4A8)
        return k3_fail(err, K3_ERR_UNSUPPORTED, "%s: mode w4a8 (MXFP8 activations) is not implemented on the GPU", bn);
    if (mode == K3_MODE_W4A4 && m->fmt != FMT_NV)
        return k3_fail(err, K3_ERR_UNSUPPORTED, "%s: mode w4a4 needs NVFP4 experts, these are MXFP4", bn);
    if (mode == K3_MODE_W4A4 && !(m->d.g1 > 0.f && m->d.g2 > 0.f))
        return k3_fail(err, K3_ERR_MISSING, "%s: mode w4a4 needs input_scale > 0 on every local expert's w1 and w2", bn);
    if (mode != K3_MODE_W4A16 && mode != K3_MODE_W4A4 && mode != K3_MODE_W4A16_BF16)
        return k3_fail(err, K3_ERR_ARG, "%s: mode %d unknown", bn, (int)mode);
    if (b == K3_CUDA_FUSED) {
        if (T > K3_CUDA_FUSED_MAX_TOKENS)
            return k3_fail(err, K3_ERR_LIMIT, "cuda-fused: T = %d tokens, the fused kernel takes at most %d per launch", T,
                           K3_CUDA_FUSED_MAX_TOKENS);
        if (T * k > K3_CUDA_FUSED_MAX_SLOTS)
            return k3_fail(err, K3_ERR_LIMIT, "cuda-fused: T*k = %d routed slots, the fused kernel takes at most %d", T * k,
                           K3_CUDA_FUSED_MAX_SLOTS);
    }
    return K3_OK;
}

extern "C" int k3_cuda_moe_set_gemm_path(k3_cuda_moe *m, int path, k3_error *err) {
    if (!m) return k3_fail(err, K3_ERR_ARG, "gemm path: no uploaded experts");
    const int wp = path > 0 && moe_wp_width_ok(path);
    if (path < -1 || (path > 0 && path != 32 && !wp))
        return k3_fail(err, K3_ERR_ARG, "gemm path %d: expected -1, 0, 32 or %s", path, moe_wp_widths_text);
    if (path > 0 && !m->wg_ok)
        return k3_fail(err, K3_ERR_UNSUPPORTED, "gemm path %d (wgmma): this binary or device has no sm_90a kernels", path);
    m->force_wg = wp ? 0 : path;
    m->force_wp = wp ? path : 0;
    return K3_OK;
}

extern "C" int k3_cuda_moe_set_fc2_bands(k3_cuda_moe *m, int bands, k3_error *err) {
    if (!m) return k3_fail(err, K3_ERR_ARG, "fc2 bands: no uploaded experts");
    if (bands < -1 || bands > 1) return k3_fail(err, K3_ERR_ARG, "fc2 bands %d: expected -1, 0 or 1", bands);
    m->force_bands = bands;
    return K3_OK;
}

/* Upper bound on the work items (expert, <= tn tokens) the dispatch makes from S slots: one
 * partial item per touched expert plus the full ones. */
static int work_items_max(int S, int n_local, int tn) { return (S < n_local ? S : n_local) + S / tn + 1; }

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

/* Carves the workspace for T tokens and top-k k, growing the allocation when needed. */
static int ensure_ws(k3_cuda_moe *m, int T, int k, int tn, cudaStream_t st, k3_error *err) {
    const MoeDev *d = &m->d;
    const size_t S = (size_t)T * k, H = d->H, I = d->I;
    const size_t wmax = (size_t)work_items_max(T * k, d->n_local, tn);
    /* the dispatch scratch first: its ticket stays where it is whatever T (zeroed once, here) */
    const size_t dsp_ints = dsp_hist_at(*d) + (size_t)DSP_BLOCKS_MAX * d->n_local;
    size_t sz[12] = {dsp_ints * 4, T * H * 4, (size_t)T * 4, S * I * 4, S * 4, S * I * 4, S * 4, S * H * 4, S * 4,
                     S * 4, wmax * 16, 64 + (size_t)fused_cnt_ints(d->m2) * 4};
    size_t tot = 0, off[12];
    for (int i = 0; i < 12; i++) {
        off[i] = tot;
        tot += al256(sz[i] ? sz[i] : 1);
    }
    if (tot > m->ws_bytes) {
        cudaFree(m->ws);
        m->ws = NULL;
        m->ws_bytes = 0;
        K3_CUDA_TRY(err, cudaMalloc(&m->ws, tot));
        m->ws_bytes = tot;
        K3_CUDA_TRY(err, cudaMemsetAsync(m->ws, 0, 4, st)); /* the dispatch ticket, in stream order */
    }
    char *b = (char *)m->ws;
    MoeRun *r = &m->r;
    r->dsp = (int *)(b + off[0]);
    r->xq = (uint4 *)(b + off[1]);
    r->xs = (float *)(b + off[2]);
    r->h = (float *)(b + off[3]);
    r->hamax = (unsigned *)(b + off[4]);
    r->hq = (uint4 *)(b + off[5]);
    r->hs = (float *)(b + off[6]);
    r->part = (float *)(b + off[7]);
    r->sorted_tok = (int *)(b + off[8]);
    r->sorted_slot = (int *)(b + off[9]);
    r->work = (int4 *)(b + off[10]);
    r->ctl = (int *)(b + off[11]);
    r->bar = m->bar;
    return K3_OK;
}

/* Tokens per touched local expert under uniform routing: what the tile choices key on. */
static double tokens_per_expert(const k3_cuda_moe *m, int T, int k) {
    double E = m->d.n_experts, S = (double)T * k;
    double touched = m->d.n_local * (1.0 - pow(1.0 - (double)k / E, T));
    return touched > 0 ? S * m->d.n_local / E / touched : 1;
}

/* Fragments of 8 columns per tile: 4 tokens each with two terms, 8 with one. */
static int pick_nt(const k3_cuda_moe *m, int T, int k, int np) {
    double per = tokens_per_expert(m, T, k) / (3 - np);
    return per <= 4 ? 1 : per <= 8 ? 2 : 4;
}

/* Tokens per touched expert (uniform routing) from which the wgmma tiles (moe_prefill.cu) take
 * over from mma.sync. Measured on the H200 (NVFP4, K3 layer), w4a16 / w4a16-bf16, ms for
 * mma.sync, wgmma-32: T = 256 (~4.6 per expert) 6.7, 11.3 / 5.0, 8.8; T = 512 (~9.1) 11.4,
 * 11.6 / 7.0, 9.0; T = 1024 (~18) 21.3, 12.8 / 11.6, 9.5. The crossover between 9 and 18 is not
 * measured. */
#define WG_MIN_TOKENS_PER_EXPERT 12

/* Above it (and below pick_wp's 32 tokens per expert) the 32-token tiles: they run two 16-row M
 * tiles per warp (moe_prefill.cu), which makes their items the cheapest per token. The 64- and
 * 128-token k_wg tiles cost 1.93 / 2.7 (w4a16-bf16) and 2.1 / 3.1 (w4a16) 32-token items (H200,
 * NVFP4, K3 layer, T = 1024 .. 8192), so below 32 tokens per expert they never won, and above it
 * k_wgp beat them; they were retired in the twenty-sixth session. */
static int pick_wg(const k3_cuda_moe *m, int T, int k) {
    if (!m->wg_ok || m->force_wg < 0) return 0;
    if (m->force_wg > 0) return m->force_wg;
    return tokens_per_expert(m, T, k) < WG_MIN_TOKENS_PER_EXPERT ? 0 : 32;
}

/* The warp-specialized wgmma tiles (moe_prefill_ws.cu) from 32 tokens per touched expert, in
 * every mode and format. Since their producer copies a tile's pieces without per-piece index
 * arithmetic (sixteenth session), they beat k_wg in one-term modes too. H100, NVFP4 K3 layer,
 * one device call, ms for k_wg (automatic) / k_wgp 48 / k_wgp 80: w4a16-bf16 T = 1024 (~18
 * tokens per expert) 7.07 / 9.64 / 12.43; 2048 (~37) 12.01 / 10.59 / 12.99; 4096 (~73) 18.18 /
 * 20.01 / 15.81; 8192 (~146) 36.14 / 36.01 / 28.51; w4a16 1024 9.95 (k_wg) / 12.98 / 17.54,
 * 2048 13.77 / 18.38 (k_wg 16.7 before the change), 4096 28.31 / 23.21, 8192 49.93 / 41.41
 * (lab/NOTES.md v22). After the 48-token tiles took a third consumer warpgroup (10-13% faster),
 * the crossover with k_wg 32 measured between 27 and 32 tokens per expert (T = 1536 level, 1792
 * k_wgp 13% faster; docs/BENCHMARKS.md).
 * Width: the least expected work, items per expert (wp_items: the binomial spread of an
 * expert's tokens, not their mean: at ~146 per expert 12% of experts need a second 160-wide
 * item) times an item's cost, which the H100 runs of the nineteenth session (NVFP4 K3 layer,
 * T = 2048 .. 12288, each width pinned) put near-constant per width: FC1 + FC2 per item 9.1-9.6 /
 * 12.5-13.2 / 20.0-22.2 us (w4a16-bf16) and 12.9-13.2 / 18.7-19.5 / 31.6-35.1 us (w4a16) at 48 /
 * 80 / 160 tokens. The rule picks the measured best width at every T of those runs. The 128-token
 * item costs 1.9x (w4a16-bf16) / 2.1x (w4a16) a 48-token one (H100, nineteenth session's
 * width probe): it wins near 110 and 220 tokens per expert (T = 6144, 12288). With the four
 * widths the automatic choice ran within run-to-run noise (<= 3%) of the best pinned width at
 * T = 4096, 6144, 8192 and 12288 in both modes (H100, v32).
 * Pinned k_wg tiles or mma.sync (force_wg) exclude this path. */
#define WP_MIN_TOKENS_PER_EXPERT 32

/* Expected work items per expert of each width w of moe_wp_widths, E[ceil(n / w)] for
 * n ~ Binomial(T, k / E) tokens on one expert under uniform routing. */
static void wp_items(const k3_cuda_moe *m, int T, int k, double out[MOE_WP_NW]) {
    const int *w = moe_wp_widths;
    const double p = (double)k / m->d.n_experts, mu = T * p, sd = sqrt(mu * (1 - p));
    if (p >= 1) { /* k = E: every expert gets all T tokens (the pmf below would be 0 * log 0) */
        for (int i = 0; i < MOE_WP_NW; i++) out[i] = (T + w[i] - 1) / w[i];
        return;
    }
    const int lo = mu - 12 * sd > 1 ? (int)(mu - 12 * sd) : 1, hi = mu + 12 * sd + 16 < T ? (int)(mu + 12 * sd + 16) : T;
    const double lt = lgamma(T + 1.0), lp = log(p), lq = log1p(-p);
    for (int i = 0; i < MOE_WP_NW; i++) out[i] = 0;
    for (int n = lo; n <= hi; n++) {
        const double pmf = exp(lt - lgamma(n + 1.0) - lgamma(T - n + 1.0) + n * lp + (T - n) * lq);
        for (int i = 0; i < MOE_WP_NW; i++) out[i] += pmf * ((n + w[i] - 1) / w[i]);
    }
}

static int pick_wp(const k3_cuda_moe *m, int T, int k, int np) {
    if (!m->wg_ok) return 0;
    if (m->force_wp) return m->force_wp;
    if (m->force_wg) return 0;
    if (tokens_per_expert(m, T, k) < WP_MIN_TOKENS_PER_EXPERT) return 0;
    /* [terms - 1][width of moe_wp_widths]; a width without a measured cost would cost 0 */
    static_assert(MOE_WP_NW == 4, "pick_wp: one measured item cost per k_wgp width");
    static const double item_cost[2][MOE_WP_NW] = {{1.0, 1.36, 1.9, 2.28}, {1.0, 1.46, 2.1, 2.6}};
    double items[MOE_WP_NW];
    wp_items(m, T, k, items);
    int best = 0;
    for (int i = 1; i < MOE_WP_NW; i++)
        if (items[i] * item_cost[np - 1][i] < items[best] * item_cost[np - 1][best]) best = i;
    return moe_wp_widths[best];
}

/* A grouped-chain launch; with pdl the kernel may start before its predecessor ends (it calls
 * pdl_wait before reading what the predecessor writes). */
static int launch_smem(kern_t k, dim3 grid, int threads, int smem, cudaStream_t st, int pdl, const MoeDev &d,
                       const MoeRun &r, const char *what, k3_error *err) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = st;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &at;
    cfg.numAttrs = pdl ? 1 : 0;
    void *args[2] = {(void *)&d, (void *)&r};
    cudaError_t e = cudaLaunchKernelExC(&cfg, (const void *)k, args);
    return e == cudaSuccess ? K3_OK : k3_cuda_fail(err, e, what, __FILE__, __LINE__);
}

static int launch_chain(kern_t k, dim3 grid, int threads, cudaStream_t st, int pdl, const MoeDev &d, const MoeRun &r,
                        const char *what, k3_error *err) {
    return launch_smem(k, grid, threads, 0, st, pdl, d, r, what, err);
}

/* Warps per K part of a grouped mma.sync CTA: 4 with whole K (8 tiles share the B rows through
 * L1), 2 with K halves (T*k <= 64: more, smaller CTAs fill the last wave; at T = 1 the FC2 grid
 * of 4-warp CTAs is 448 CTAs over 396 slots). H200, NVFP4 w4a16, same call, 4 -> 2 warps:
 * T = 1 108.4 -> 101.9 us (FC2 40.0 -> 30.1), T = 2 182.4 -> 174.0, T = 4 317.0 -> 306.2; with
 * whole K (T >= 8) 2 and 8 were slower than 4 for NVFP4 (T = 8 569 / 578 / 591, T = 64 2794 /
 * 2857 / 2867, 4 / 2 / 8 warps). */
static int fc_wpc(const k3_cuda_moe *m, int ks, int *wpc, k3_error *err) {
    *wpc = m->force_wpc ? m->force_wpc : ks == 2 ? 2 : 4;
    if (*wpc * ks > 2 * WARPS)
        return k3_fail(err, K3_ERR_ARG, "cuda: %d warps per K part with %d K parts exceed the %d-thread CTA", *wpc, ks,
                       64 * WARPS);
    return K3_OK;
}

/* K halves per mma.sync tile (grouped k_fc and fused): two when the tiles alone would not fill
 * the device (decode, T*k <= 64), else whole K; the benchmark's k_splits overrides. */
static int k_halves(const k3_cuda_moe *m, int S) { return m->force_ks ? m->force_ks : S <= 64 ? 2 : 1; }

/* The grid of a grouped mma.sync FC kernel: work items x tile groups, or 1-D in bands (FC_BAND). */
static dim3 fc_grid(int items, int groups, bool banded) { return banded ? dim3(items * groups) : dim3(items, groups); }

static int dispatch_smem(const k3_cuda_moe *m) { return (3 * (m->d.n_local + 1) + 33) * 4; }

/* Blocks of the grouped dispatch (dsp_count) for S slots. */
static int dsp_blocks(int S) {
    const int n = (S + DSP_SLOTS_MIN - 1) / DSP_SLOTS_MIN;
    return n < DSP_BLOCKS_MAX ? n : DSP_BLOCKS_MAX;
}

static int launch_check(k3_error *err, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return k3_cuda_fail(err, e, what, __FILE__, __LINE__);
    return K3_OK;
}

extern "C" int k3_cuda_moe_run(k3_cuda_moe *m, k3_cuda_backend b, k3_act_mode mode, const float *d_x, int T,
                               const int32_t *d_ids, const float *d_w, int k, float *d_y, void *stream,
                               k3_error *err) {
    if (k3_cuda_moe_check(m, b, mode, T, k, err)) return err->status;
    int rc = k3_cuda_rows_aligned(err, "cuda moe", d_x, d_y);
    if (rc) return rc;
    if (T == 0) return K3_OK;
    if (!d_x || !d_ids || !d_w || !d_y) return k3_fail(err, K3_ERR_ARG, "cuda moe: x, ids, w and y are required");
    cudaStream_t st = (cudaStream_t)stream;
    /* one fp16 term per activation where the mode's values fit in one (the fused kernel reads two) */
    const int np = b == K3_CUDA_GROUPED && mode != K3_MODE_W4A16 ? 1 : 2;
    const int wp = b == K3_CUDA_GROUPED ? pick_wp(m, T, k, np) : 0;
    const int wg = b == K3_CUDA_GROUPED && !wp ? pick_wg(m, T, k) : 0;
    const int nt = b == K3_CUDA_FUSED ? 1 : m->force_nt ? m->force_nt : pick_nt(m, T, k, np);
    const int nti = nt == 1 ? 0 : nt == 2 ? 1 : 2;
    const int tn = wp ? wp : wg ? wg : 4 * nt * (3 - np);
    if (ensure_ws(m, T, k, tn, st, err)) return err->status;
    MoeRun r = m->r;
    r.T = T;
    r.k = k;
    r.mode = mode;
    r.tn = tn;
    r.x = d_x;
    r.ids = d_ids;
    r.rw = d_w;
    r.y = d_y;
    r.plain = wg != 0 || wp != 0;
    r.split = wp != 0;
    r.np = np;
    r.hb16 = wp && mode == K3_MODE_W4A16_BF16;
    const MoeDev d = m->d;
    const int ai = (int)m->act - 1;
    if (b == K3_CUDA_GROUPED) {
        const int S = T * k, wmax = work_items_max(S, d.n_local, tn);
        int sm = dispatch_smem(m);
        if (!m->prep_attr_set) {
            K3_CUDA_TRY(err, cudaFuncSetAttribute(k_prep, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
            K3_CUDA_TRY(err, cudaFuncSetAttribute(k_scatter, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
            m->prep_attr_set = 1;
        }
        const int nd = dsp_blocks(S), nblk = nd + (T < 1024 ? T : 1024);
        r.nd = nd;
        cudaEvent_t *ev = m->stage_ev;
        /* fc1, hconv, fc2 and finalize start while their predecessor drains (pdl_wait before
         * its outputs are read; fc2 first issues its first weight loads): T = 1 112.7 -> 109.1 us,
         * T = 8 / 64 1-2% on the H200; the stage breakdown's events serialize them anyway */
        const int pdl = !ev;
        const int ks = k_halves(m, S);
        int wpc = 4;
        if (fc_wpc(m, ks, &wpc, err)) return err->status;
        const int rows = wpc * FC_MT; /* tiles per CTA */
        const double hq_bytes = (double)S * d.I * 2 * np; /* FC2's token rows: np fp16 terms each */
        const bool bands = m->force_bands ? m->force_bands > 0 : hq_bytes > m->l2_bytes / 3.0;
        r.ks = ks;
        if (ev) cudaEventRecord(ev[0], st);
        k_prep<<<nblk, 256, sm, st>>>(d, r);
        if (launch_check(err, "k_prep<<<>>>")) return err->status;
        if (launch_smem(k_scatter, dim3(nd), 256, sm, st, pdl, d, r, "k_scatter", err)) return err->status;
        if (ev) cudaEventRecord(ev[1], st);
        const int fc1_tiles = (int)(k3_act_fc1_rows(m->act, d.I) / 16); /* == d.m1 */
        const kern_t kf1 = fc1_table[np - 1][m->fmt][nti][ai], kf2 = fc2_table[bands][np - 1][m->fmt][nti];
        if (wp) {
            if (moe_wp_launch(m, d, r, 0, wp, st, err)) return err->status;
        } else if (wg) {
            if (moe_wg_launch(m, d, r, 0, wg, wmax, st, err)) return err->status;
        } else if (launch_chain(kf1, fc_grid(wmax, (fc1_tiles + rows - 1) / rows, false), 32 * wpc * ks, st, pdl, d, r,
                                "k_fc<fc1>", err)) {
            return err->status;
        }
        if (ev) cudaEventRecord(ev[2], st);
        if (launch_chain(k_hconv, dim3(S), 128, st, pdl, d, r, "k_hconv", err)) return err->status;
        if (ev) cudaEventRecord(ev[3], st);
        if (wp) {
            if (moe_wp_launch(m, d, r, 1, wp, st, err)) return err->status;
        } else if (wg) {
            if (moe_wg_launch(m, d, r, 1, wg, wmax, st, err)) return err->status;
        } else if (launch_chain(kf2, fc_grid(wmax, (d.m2 + rows - 1) / rows, bands), 32 * wpc * ks, st, pdl, d, r,
                                "k_fc<fc2>", err)) {
            return err->status;
        }
        if (ev) cudaEventRecord(ev[4], st);
        if (launch_chain(k_finalize, dim3((d.H / 4 + FIN_THREADS - 1) / FIN_THREADS, T < 65535 ? T : 65535), FIN_THREADS,
                         st, pdl, d, r, "k_finalize", err))
            return err->status;
        if (ev) cudaEventRecord(ev[5], st);
        return K3_OK;
    }
    const int ks = k_halves(m, T * k);
    if (ks == 2 && T * k > FUSED_HALVES_SLOTS)
        return k3_fail(err, K3_ERR_LIMIT, "cuda-fused: K halves take T*k <= %d routed slots, not %d", FUSED_HALVES_SLOTS,
                       T * k);
    kern_t kf = fused_table[ks - 1][m->fmt][ai];
    int sm = dispatch_smem(m);
    if (!m->fused_grid[ks - 1]) { /* every block must be co-resident: the grid barrier waits for all */
        int per_sm = 0, nsm = 0;
        K3_CUDA_TRY(err, cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
        K3_CUDA_TRY(err, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kf, 128, sm));
        K3_CUDA_TRY(err, cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, m->device));
        m->fused_grid[ks - 1] = per_sm * nsm;
    }
    int grid = m->fused_grid[ks - 1];
    if (grid < 2)
        return k3_fail(err, K3_ERR_LIMIT, "cuda-fused: only %d co-resident blocks fit on the device, the fused kernel needs 2",
                       grid);
    r.bar_base = m->bar_epoch;
    r.stamps = m->fused_stamps ? fused_stamps_at(r) : NULL;
    void *args[2] = {(void *)&d, (void *)&r};
    cudaError_t ce = cudaLaunchCooperativeKernel((const void *)kf, dim3(grid), dim3(128), args, (size_t)sm, st);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        return k3_cuda_fail(err, ce, "cudaLaunchCooperativeKernel(k_fused)", __FILE__, __LINE__);
    }
    m->bar_epoch += (unsigned long long)FUSED_BARRIERS(ks) * grid;
    return K3_OK;
}

extern "C" int k3_cuda_moe_run_host(k3_cuda_moe *m, k3_cuda_backend b, k3_act_mode mode, const float *x, int T,
                                    const int32_t *ids, const float *w, int k, float *y, k3_error *err) {
    if (k3_cuda_moe_check(m, b, mode, T, k, err)) return err->status;
    int rc = k3_experts_validate_inputs(m->d.n_experts, m->d.H, x, T, ids, w, k, err);
    if (rc) return rc;
    if (T == 0) return K3_OK;
    const size_t H = m->d.H, nx = (size_t)T * H * 4, ni = (size_t)T * k * 4;
    char *buf = NULL;
    K3_CUDA_TRY(err, cudaMalloc(&buf, 2 * nx + 2 * ni + 1024));
    float *dx = (float *)buf, *dy = (float *)(buf + al256(nx));
    int32_t *di = (int32_t *)(buf + 2 * al256(nx));
    float *dw = (float *)(buf + 2 * al256(nx) + al256(ni));
    cudaError_t ce = cudaMemcpy(dx, x, nx, cudaMemcpyHostToDevice);
    if (ce == cudaSuccess) ce = cudaMemcpy(di, ids, ni, cudaMemcpyHostToDevice);
    if (ce == cudaSuccess) ce = cudaMemcpy(dw, w, ni, cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) rc = k3_cuda_fail(err, ce, "cudaMemcpy(moe inputs)", __FILE__, __LINE__);
    if (rc == K3_OK) rc = k3_cuda_moe_run(m, b, mode, dx, T, di, dw, k, dy, NULL, err);
    if (rc == K3_OK) {
        ce = cudaDeviceSynchronize();
        if (ce == cudaSuccess) ce = cudaMemcpy(y, dy, nx, cudaMemcpyDeviceToHost);
        if (ce != cudaSuccess) rc = k3_cuda_fail(err, ce, "moe run / cudaMemcpy(y)", __FILE__, __LINE__);
    }
    cudaFree(buf);
    return rc;
}
