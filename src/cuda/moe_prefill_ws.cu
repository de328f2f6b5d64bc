/* The grouped backend's warp-specialized wgmma kernel for prefill batches (128 tokens per
 * tile): the same contract, stage layout, decode and epilogues as moe_prefill.cu, with the
 * roles split so that no CTA-wide barrier sits in the main loop.
 *
 * 384 threads: warpgroup 0 produces (each of its 128 threads owns one token row of the tile
 * and a share of the 8 weight tiles; cp.async into a ring of WS_STAGES stages), warpgroups 1
 * and 2 consume (each warp decodes its 16 weight rows from the stage and issues the wgmma
 * m64n128k16 pair hi + lo per 16-k step). Hand-off through mbarriers: full[slot] completes when
 * all 128 producer threads have seen their copies land (cp.async.wait_group, then the
 * generic-to-async proxy fence, then arrive: the writers fence their own writes); empty[slot]
 * completes when the 8 consumer warps have retired the wgmma that read it (wait_group 1 after
 * the next stage's issue). The producer keeps WS_LAG stages of copies in flight before it
 * signals the oldest. A wait that never completes traps (mbar_wait) instead of hanging.
 *
 * Status: compiled and resource-checked for sm_90a, NOT yet run on a GPU (the session that
 * wrote it had no device time left): selectable only explicitly (k3_cuda_moe_set_gemm_path
 * 128), never by the automatic choice. tests/test_cuda_moe.c pins it like the other tiles. */
#include "cuda/cuda_check.cuh"
#include "cuda/moe_prefill.cuh"
#include "cuda/moe_state.cuh"
#include "cuda/moe_wgmma.cuh"

extern "C" {
#include "base/base.h"
#include "moe/activation.h"
}

#define WS_THREADS 384
#define WS_TN 128
#define WS_STAGES 5
#define WS_LAG 2

__host__ __device__ constexpr int ws_smem_bytes() { return WS_STAGES * wg_stage_bytes(WS_TN) + 2 * WS_STAGES * 8; }

/* The producer's copies of stage s (k0 = 64 s; src already advanced to it) into slot: its
 * token row (hi and lo parts, 8 k-groups of 16 bytes each) and its npc weight pieces (code
 * pieces of half unit s & 1, or scale pieces of unit s >> 1, as scale_mask says). */
template <int FMT>
__device__ __forceinline__ void ws_fill(uint32_t slot, int s, const __half *src, int K, bool have_row, int nf,
                                        const uint8_t *const wpc[3], int npc, const int dst_off[3], int scale_mask) {
    constexpr int PART = wg_part_bytes(WS_TN), SBY = FMT == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
    const uint32_t b = slot + (nf >> 3) * 1024 + (nf & 7) * 16;
#pragma unroll
    for (int p = 0; p < 2; p++)
#pragma unroll
        for (int g = 0; g < 8; g++)
            cp_async16(b + p * PART + g * 128, have_row ? (const void *)(src + p * K + g * 8) : (const void *)src,
                       have_row ? 16 : 0);
    const int c = s >> 1, h = s & 1;
#pragma unroll
    for (int i = 0; i < 3; i++)
        if (i < npc) {
            const uint8_t *sp = (scale_mask >> i) & 1 ? wpc[i] + (size_t)c * SBY : wpc[i] + (size_t)c * UNIT_W + h * 512;
            cp_async16(slot + 2 * PART + dst_off[i], sp, 16);
        }
}

/* One consumer stage (global stage number gs, half h of its unit): wait for the slot, decode,
 * issue the 8 products, retire the previous stage and hand its slot back. */
template <int FMT, int TN>
__device__ __forceinline__ void ws_cstage(uint32_t gs, int h, bool first, uint32_t sbase, uint32_t full,
                                          uint32_t empty, int cw, int lane, float acc[TN / 2], uint32_t a[4][4]) {
    const uint32_t b = gs % WS_STAGES;
    mbar_wait(full + 8 * b, (gs / WS_STAGES) & 1);
    wg_decode<FMT, TN>(sbase, b, h, cw, lane, a); /* a was read by stage gs - 2: retired */
    const uint64_t d0 = wg_desc(sbase + b * wg_stage_bytes(TN), 128, 1024);
    wg_fence();
    wg_mma_stage<TN>(acc, a, d0);
    wg_commit();
    wg_wait1(); /* stage gs - 1 retired: its slot goes back to the producer */
    if (!first && lane == 0) mbar_arrive(empty + 8 * ((gs - 1) % WS_STAGES));
}

template <int FMT, int ACT, int FC2>
__global__ void __launch_bounds__(WS_THREADS, 1) k_ws(MoeDev m, MoeRun r) {
    extern __shared__ __align__(1024) uint8_t wsm[];
    constexpr int TN = WS_TN, ST = WS_STAGES, SBY = FMT == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
    constexpr int PPW = 32 + SBY / 16; /* copy pieces per warp tile and stage */
    const int tid = threadIdx.x, role = tid >> 7, lane = tid & 31;
    const uint32_t sbase = smem_u32(wsm), full = sbase + ST * wg_stage_bytes(TN), empty = full + ST * 8;
    if (tid == 0) {
        for (int b = 0; b < ST; b++) {
            mbar_init(full + 8 * b, 128);
            mbar_init(empty + 8 * b, 8);
        }
        mbar_init_fence();
    }
    __syncthreads();
    const int W = r.ctl[1];
    const int mtiles = FC2 ? m.m2 : m.m1, nk = FC2 ? m.nk2 : m.nk1, K = FC2 ? m.I : m.H, nst = 2 * nk;
    uint32_t sg = 0; /* stages begun so far in this CTA: the same sequence in every role */
    if (role == 0) {
        const int nf = tid; /* this thread's token row of the tile */
        const __half *plain = (const __half *)(FC2 ? r.hq : r.xq);
        for (int wi = blockIdx.y; wi < W; wi += gridDim.y) {
            const int4 wk = r.work[wi];
            const int e = wk.x, p0 = wk.y, n = wk.z;
            const bool have_row = nf < n;
            const int row = have_row ? (FC2 ? p0 + nf : r.sorted_tok[p0 + nf]) : 0;
            const __half *src = plain + (size_t)row * 2 * K;
            const uint8_t *wpc[3];
            int dst_off[3], npc = 0, scale_mask = 0;
            for (int i = 0; i < 3; i++) {
                const int j = tid + 128 * i;
                if (j >= 8 * PPW) break;
                const int w = j / PPW, idx = j % PPW, mt = blockIdx.x * 8 + w;
                const size_t tile = (size_t)e * mtiles + (mt < mtiles ? mt : mtiles - 1);
                if (idx < 32) {
                    wpc[i] = (const uint8_t *)((FC2 ? m.w2 : m.w1) + tile * nk * 64) + idx * 16;
                    dst_off[i] = w * WG_WBYTES + idx * 16;
                } else {
                    wpc[i] = (FC2 ? m.s2 : m.s1) + tile * nk * SBY + (idx - 32) * 16;
                    dst_off[i] = w * WG_WBYTES + 512 + (idx - 32) * 16;
                    scale_mask |= 1 << i;
                }
                npc = i + 1;
            }
            for (int s = 0; s < nst; s++) {
                const uint32_t g = sg + s, b = g % ST;
                if (g >= ST) mbar_wait(empty + 8 * b, ((g / ST) - 1) & 1);
                ws_fill<FMT>(sbase + b * wg_stage_bytes(TN), s, src + s * WG_KS, K, have_row, nf, wpc, npc, dst_off,
                             scale_mask);
                cp_async_commit();
                if (s >= WS_LAG) {
                    cp_async_wait<WS_LAG>();
                    fence_async_smem();
                    mbar_arrive(full + 8 * ((g - WS_LAG) % ST));
                }
            }
            cp_async_wait<0>();
            fence_async_smem();
            for (int s = nst > WS_LAG ? nst - WS_LAG : 0; s < nst; s++) mbar_arrive(full + 8 * ((sg + s) % ST));
            sg += nst;
        }
        return;
    }
    const int cw = (tid >> 5) - 4, g = lane >> 2, q = lane & 3; /* consumer warp 0..7 = tile */
    const int mt = blockIdx.x * 8 + cw;
    const bool rows_ok = mt < mtiles;
    for (int wi = blockIdx.y; wi < W; wi += gridDim.y) {
        const int4 wk = r.work[wi];
        const int e = wk.x, p0 = wk.y, n = wk.z;
        float acc[TN / 2];
#pragma unroll
        for (int i = 0; i < TN / 2; i++) acc[i] = 0.f;
        uint32_t a0[4][4], a1[4][4];
#pragma unroll 1
        for (int s = 0; s < nst; s += 2) { /* nst is even: the two A buffers alternate */
            ws_cstage<FMT, TN>(sg + s, 0, s == 0, sbase, full, empty, cw, lane, acc, a0);
            ws_cstage<FMT, TN>(sg + s + 1, 1, false, sbase, full, empty, cw, lane, acc, a1);
        }
        wg_wait0();
        if (lane == 0) mbar_arrive(empty + 8 * ((sg + nst - 1) % ST));
        sg += nst;
        if (rows_ok) wg_epilogue<FMT, ACT, TN, FC2>(m, r, e, p0, n, mt, g, q, acc);
    }
}

typedef void (*kern_t)(MoeDev, MoeRun);
#define WACTS(X, F)                                                                                  \
    X(F, K3_ACT_IDENTITY), X(F, K3_ACT_GELU), X(F, K3_ACT_RELU), X(F, K3_ACT_SILU), X(F, K3_ACT_SWIGLU), \
        X(F, K3_ACT_GEGLU), X(F, K3_ACT_SWIGLU_BIAS), X(F, K3_ACT_RELU2), X(F, K3_ACT_SITU)
#define WS1K(F, A) (kern_t)k_ws<F, A, 0>

static const kern_t ws_fc1_table[2][9] = {{WACTS(WS1K, FMT_NV)}, {WACTS(WS1K, FMT_MX)}};
static const kern_t ws_fc2_table[2] = {k_ws<FMT_NV, K3_ACT_IDENTITY, 1>, k_ws<FMT_MX, K3_ACT_IDENTITY, 1>};

int moe_ws_launch(const k3_cuda_moe *m, const MoeDev &d, const MoeRun &r, int fc2, int wmax, cudaStream_t st,
                  k3_error *err) {
    /* FC1 rows from the one gated table (moe/activation.h), as the upload sized them */
    const int tiles = fc2 ? d.m2 : (int)(k3_act_fc1_rows(m->act, d.I) / 16);
    kern_t k = fc2 ? ws_fc2_table[m->fmt] : ws_fc1_table[m->fmt][(int)m->act - 1];
    return wg_launch(k, tiles, wmax, WS_THREADS, ws_smem_bytes(), st, d, r, fc2 ? "k_ws<fc2><<<>>>" : "k_ws<fc1><<<>>>", err);
}
