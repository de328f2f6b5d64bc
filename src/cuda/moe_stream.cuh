/* The decode-size GEMM engine of both GPU backends: one CTA per SM, 16 consumer warps and one
 * producer warp. A unit of work is (work item = one expert's <= TN tokens, 16 consecutive
 * 16-row weight tiles, one of ks K ranges); CTAs take units round-robin. The producer streams
 * each 128-k chunk of the unit's 16 weight units, their scales and the tokens' activation rows
 * into a ring of S_STAGES shared-memory stages with bulk copies (cp.async.bulk, completing on a
 * "full" mbarrier) and refills a stage once its 16 consumers have arrived on its "empty"
 * mbarrier. Consumer warp w decodes weight tile w from shared memory (decode_step) and runs
 * mma.sync m16n8k16 against the activation rows all 16 warps share.
 *
 * Why this shape: the decode is issue-bound (ncu, the earlier per-warp kernel at T = 8: 74% of
 * issue slots busy at 70% of DRAM bandwidth, 216 instructions per 1152-byte chunk), so the
 * loads must cost no instructions in the consumers (one bulk copy per 1 KB, issued by one
 * lane), the activations must be read from L2 once per CTA instead of once per warp (T = 256:
 * L2 at 87% of its throughput), and whole-K tiles over a 1.3-wave grid must give way to equal
 * units over a persistent grid (T = 1). Results go to fp32 partial buffers (one per K range),
 * summed in a fixed order by the next stage: deterministic for any schedule.
 *
 * Shared-memory bank use: each token row of a stage is padded by 16 bytes, so the 32 lanes of
 * one 16-byte activation load touch each bank group 4 times (the minimum for 512 bytes). */
#ifndef K3_MOE_STREAM_CUH
#define K3_MOE_STREAM_CUH

#include "cuda/moe_dev.cuh"
#include "cuda/moe_wgmma.cuh"

#define SW 16                    /* consumer warps per CTA = 16-row tiles per unit */
#define S_THREADS (32 * (SW + 1)) /* + the producer warp */
#define S_STAGES 8
#define S_KS_MAX 4               /* K ranges per unit at most */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define K3_BULK 1
#else
#define K3_BULK 0
#endif

/* Stage layout: SW weight units (1 KB), SW scale slots (128 B; MXFP4 uses 64), then TN token
 * rows of one chunk (256 B per fp16 term) each padded by 16 B. */
__host__ __device__ constexpr int st_brow(int np) { return 256 * np + 16; }
__host__ __device__ constexpr int st_boff() { return SW * (UNIT_W + UNIT_S_NV); }
__host__ __device__ constexpr int st_bytes(int tn, int np) { return (st_boff() + tn * st_brow(np) + 127) & ~127; }
__host__ __device__ constexpr int st_smem(int tn, int np) { return S_STAGES * st_bytes(tn, np) + 2 * S_STAGES * 8; }

/* ---- mbarriers and bulk copies (sm_90; other targets trap, the host never launches there) ---- */

__device__ __forceinline__ void mb_init(uint32_t a, int count) {
#if K3_BULK
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
#else
    (void)a, (void)count;
    __trap();
#endif
}
__device__ __forceinline__ void mb_init_fence() {
#if K3_BULK
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void mb_arrive(uint32_t a) {
#if K3_BULK
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
#else
    (void)a;
#endif
}
__device__ __forceinline__ void mb_arrive_tx(uint32_t a, uint32_t bytes) {
#if K3_BULK
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
#else
    (void)a, (void)bytes;
#endif
}
/* Waits for the phase of the given parity to complete; a wait that outlives any legitimate one
 * traps, so a pipeline bug is a launch error and never a hung process. */
__device__ __forceinline__ void mb_wait(uint32_t a, uint32_t parity) {
#if K3_BULK
    for (uint32_t spin = 0;; spin++) {
        uint32_t ok;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(a), "r"(parity)
                     : "memory");
        if (ok) return;
        if (spin > (1u << 22)) __trap();
    }
#else
    (void)a, (void)parity;
    __trap();
#endif
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
#if K3_BULK
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)bar;
#endif
}
/* Orders this thread's ordinary memory accesses before later async-proxy ones (bulk copies):
 * writers of data a bulk copy reads, and a CTA reusing stage memory it wrote normally. */
__device__ __forceinline__ void fence_proxy_async() {
#if K3_BULK
    asm volatile("fence.proxy.async;" ::: "memory");
#endif
}

__device__ __forceinline__ void ring_init(uint32_t bars) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < S_STAGES; s++) {
            mb_init(bars + 8 * s, 1);                   /* full: the producer's arrive + bytes */
            mb_init(bars + 8 * (S_STAGES + s), SW);     /* empty: one arrive per consumer warp */
        }
        mb_init_fence();
    }
    __syncthreads();
}

/* ---- units -------------------------------------------------------------------------------- */

struct SUnit {
    int e, p0, n;  /* expert, first sorted position, tokens */
    int t0, nt;    /* first 16-row tile, tiles (<= SW) */
    int c0, c1, kp; /* 128-k chunks [c0, c1): K range kp of ks */
};

__device__ __forceinline__ SUnit unit_of(const MoeRun &r, int u, int ng, int mtiles, int nk, int ks) {
    SUnit x;
    x.kp = u % ks;
    const int rest = u / ks, grp = rest % ng;
    const int4 wk = r.work[rest / ng];
    x.e = wk.x;
    x.p0 = wk.y;
    x.n = wk.z;
    x.t0 = grp * SW;
    x.nt = min(SW, mtiles - x.t0);
    x.c0 = x.kp * nk / ks;
    x.c1 = (x.kp + 1) * nk / ks;
    return x;
}

/* The producer warp's share of one unit: per chunk, wait until the stage is free, announce its
 * bytes, then one bulk copy per weight unit, scale unit and token row (spread over the lanes). */
template <int FMT, int TN, int NP, int FC2>
__device__ __forceinline__ void produce(const MoeDev &m, const MoeRun &r, uint32_t sbase, uint32_t bars, uint32_t &it,
                                        const SUnit &x, int lane) {
    constexpr int SB = FMT == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
    const int mtiles = FC2 ? m.m2 : m.m1, nk = FC2 ? m.nk2 : m.nk1;
    const size_t tile0 = (size_t)x.e * mtiles + x.t0;
    const uint8_t *wb = (const uint8_t *)(FC2 ? m.w2 : m.w1) + tile0 * nk * UNIT_W;
    const uint8_t *sb = (FC2 ? m.s2 : m.s1) + tile0 * nk * SB;
    const int items = 2 * x.nt + x.n;
    /* this lane's items i = lane and lane + 32 (TN <= 32 tokens + 2 x 16 tiles <= 64) */
    const uint8_t *src[2];
    uint32_t doff[2], len[2];
    size_t cstride[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int i = lane + 32 * h;
        src[h] = NULL;
        doff[h] = 0, len[h] = 0, cstride[h] = 0;
        if (i < x.nt) {
            src[h] = wb + (size_t)i * nk * UNIT_W, doff[h] = i * UNIT_W, len[h] = UNIT_W, cstride[h] = UNIT_W;
        } else if (i < 2 * x.nt) {
            const int t = i - x.nt;
            src[h] = sb + (size_t)t * nk * SB, doff[h] = SW * UNIT_W + t * UNIT_S_NV, len[h] = SB, cstride[h] = SB;
        } else if (i < items) {
            const int j = i - 2 * x.nt;
            const int row = FC2 ? x.p0 + j : r.sorted_tok[x.p0 + j];
            src[h] = (const uint8_t *)((FC2 ? r.hq : r.xq) + (size_t)row * nk * 32);
            doff[h] = st_boff() + j * st_brow(NP), len[h] = 256 * NP, cstride[h] = 512;
        }
    }
    const uint32_t tx = (uint32_t)(x.nt * (UNIT_W + SB) + x.n * 256 * NP);
    for (int c = x.c0; c < x.c1; c++, it++) {
        const int slot = it % S_STAGES;
        const uint32_t use = it / S_STAGES, full = bars + 8 * slot, empty = bars + 8 * (S_STAGES + slot);
        mb_wait(empty, (use & 1) ^ 1);
        if (lane == 0) mb_arrive_tx(full, tx);
        __syncwarp();
        const uint32_t st = sbase + slot * st_bytes(TN, NP);
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (src[h]) bulk_g2s(st + doff[h], src[h] + (size_t)c * cstride[h], len[h], full);
    }
}

/* A consumer warp's share of one unit: acc over the unit's chunks for tile t0 + warp (when the
 * unit has that many tiles; every warp releases every stage either way). Accumulator layout as
 * gemm_tile: NP = 2 fragments are 4 tokens x (hi, lo), NP = 1 fragments 8 tokens. */
template <int FMT, int NT, int NP>
__device__ __forceinline__ void consume(uint32_t sbase, uint32_t bars, uint32_t &it, const SUnit &x, int warp, int lane,
                                        float acc[NT][4]) {
    constexpr int TN = 4 * NT * (3 - NP);
#pragma unroll
    for (int f = 0; f < NT; f++) acc[f][0] = acc[f][1] = acc[f][2] = acc[f][3] = 0.f;
    const bool mine = warp < x.nt;
    const int q = lane & 3;
    uint32_t boff[NT];
#pragma unroll
    for (int f = 0; f < NT; f++) {
        const int j = NP == 2 ? 4 * f + (lane >> 3) : 8 * f + (lane >> 2), part = NP == 2 ? (lane >> 2) & 1 : 0;
        boff[f] = st_boff() + j * st_brow(NP) + part * 256 + q * 64;
    }
    const uint32_t woff = warp * UNIT_W + lane * 16;
    const uint32_t soff = SW * UNIT_W + warp * UNIT_S_NV + (lane >> 2) * (FMT == FMT_NV ? 16 : 8);
    for (int c = x.c0; c < x.c1; c++, it++) {
        const int slot = it % S_STAGES;
        const uint32_t use = it / S_STAGES;
        mb_wait(bars + 8 * slot, use & 1);
        if (mine) {
            const uint32_t st = sbase + slot * st_bytes(TN, NP);
            const uint4 w0 = lds128(st + woff), w1 = lds128(st + woff + 512);
            uint4 sc;
            if (FMT == FMT_NV) sc = lds128(st + soff);
            else {
                const uint2 t = lds64(st + soff);
                sc = make_uint4(t.x, t.y, 0, 0);
            }
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                uint4 b[NT];
#pragma unroll
                for (int f = 0; f < NT; f++) b[f] = lds128(st + boff[f] + jj * 16);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint32_t a0, a1, a2, a3;
                    decode_step<FMT>(w0, w1, sc, 2 * jj + h, a0, a1, a2, a3);
#pragma unroll
                    for (int f = 0; f < NT; f++)
                        mma16816(acc[f], a0, a1, a2, a3, h ? b[f].z : b[f].x, h ? b[f].w : b[f].y);
                }
            }
        }
        __syncwarp();
        if (lane == 0) mb_arrive(bars + 8 * (S_STAGES + slot));
    }
}

/* FC1: raw accumulators of tile rows (up rows 0..7 and gate rows 8..15 of each tile when
 * gated) into gpart[kp][position][row]; the activation is applied once the K ranges are
 * summed (sconv_row). FC2: the expert's unweighted output rows into part[kp][slot][H]. */
template <int NT, int NP, int FC2>
__device__ __forceinline__ void stream_epilogue(const MoeDev &m, const MoeRun &r, const SUnit &x, int warp, int lane,
                                                const float acc[NT][4]) {
    const int g = lane >> 2, q = lane & 3, row = (x.t0 + warp) * 16 + g;
    const int R = FC2 ? m.H : m.m1 * 16;
    float *base = (FC2 ? r.part : r.gpart) + (size_t)x.kp * r.T * r.k * R;
    const float fw = FC2 ? m.f2[x.e] : 1.f;
#pragma unroll
    for (int f = 0; f < NT; f++)
#pragma unroll
        for (int c = 0; c < 3 - NP; c++) {
            const int j = NP == 2 ? 4 * f + q : 8 * f + 2 * q + c;
            if (j < x.n) {
                const float r0 = NP == 2 ? acc[f][0] + acc[f][1] : acc[f][c];
                const float r8 = NP == 2 ? acc[f][2] + acc[f][3] : acc[f][2 + c];
                const int p = x.p0 + j;
                const float s = FC2 ? fw * r.hs[p] : 1.f;
                float *o = base + (size_t)(FC2 ? r.sorted_slot[p] : p) * R + row;
                o[0] = r0 * s;
                o[8] = r8 * s;
            }
        }
}

/* One GEMM phase (FC1 or FC2) over the W work items, for this CTA's units. it: the ring's use
 * counter, identical in the producer and every consumer, carried across phases. */
template <int FMT, int NT, int NP, int FC2>
__device__ __forceinline__ void stream_phase(const MoeDev &m, const MoeRun &r, uint32_t sbase, uint32_t bars,
                                             uint32_t &it, int W) {
    constexpr int TN = 4 * NT * (3 - NP);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int mtiles = FC2 ? m.m2 : m.m1, nk = FC2 ? m.nk2 : m.nk1, ks = FC2 ? r.ks2 : r.ks1;
    const int ng = (mtiles + SW - 1) / SW, U = W * ng * ks;
    fence_proxy_async();
    for (int u = blockIdx.x; u < U; u += gridDim.x) {
        const SUnit x = unit_of(r, u, ng, mtiles, nk, ks);
        if (warp == SW) {
            produce<FMT, TN, NP, FC2>(m, r, sbase, bars, it, x, lane);
        } else {
            float acc[NT][4];
            consume<FMT, NT, NP>(sbase, bars, it, x, warp, lane, acc);
            if (warp < x.nt) stream_epilogue<NT, NP, FC2>(m, r, x, warp, lane, acc);
        }
    }
}

/* h of sorted position p from the FC1 partials: sum the K ranges in order, the factors, the
 * activation, then the row's |h| max and its conversion into the FC2 B layout. hrow: I floats
 * and red: 32 floats of shared memory; every thread of the CTA calls it. */
template <int ACT>
__device__ __forceinline__ void sconv_row(const MoeDev &m, const MoeRun &r, int p, float *hrow, float *red) {
    const int s = r.sorted_slot[p], e = r.ids[s] - m.first_local;
    const float xs = r.xs[s / r.k], fa = m.f1[2 * e], fb = m.f1[2 * e + 1];
    const float al = m.alpha ? m.alpha[e] : 1.f, be = m.beta ? m.beta[e] : 0.f;
    const float li = m.limit ? m.limit[e] : INFINITY;
    const int R = m.m1 * 16;
    const size_t ps = (size_t)r.T * r.k * R;
    const float *G = r.gpart + (size_t)p * R;
    float am = 0.f;
    for (int i = threadIdx.x; i < m.I; i += blockDim.x) {
        float v;
        if (m.gated) { /* set at upload from k3_act_is_gated */
            const int o = (i >> 3) * 16 + (i & 7);
            float up = G[o], gate = G[o + 8];
            for (int kp = 1; kp < r.ks1; kp++) up += G[kp * ps + o], gate += G[kp * ps + o + 8];
            v = act_gated<ACT>(gate * fb * xs, up * fa * xs, al, be, li);
        } else {
            float a = G[i];
            for (int kp = 1; kp < r.ks1; kp++) a += G[kp * ps + i];
            v = act_plain<ACT>(a * fa * xs);
        }
        hrow[i] = v;
        am = nanmax(am, fabsf(v));
    }
    am = block_amax(am, red); /* its barriers also publish hrow */
    quant_row(hrow, m.I, am, r.mode, m.g2, (uint32_t *)(r.hq + (size_t)p * m.nk2 * 32), r.hs + p, threadIdx.x,
              blockDim.x, false, r.np == 2);
    __syncthreads();
}

#endif
