/* The grouped backend's warp-specialized wgmma GEMMs for prefill batches (tens to hundreds of
 * tokens per expert): the contract, decode, stage layout and epilogues of moe_prefill.cu, with
 * bigger tiles and the copies moved off the math warps.
 *
 * Why: the k_wg tiles (128 or 256 weight rows x 32..128 tokens) move 0.017-0.02 bytes from L2
 * into the SM per issued tensor-core multiply-add in w4a16 (two fp16 terms per activation:
 * 4 bytes per element), so at ~30% of the tensor peak they already pull ~3 TB/s out of L2, and
 * every 64-k stage ends in a CTA barrier of all their warps. Here one CTA per SM covers 256
 * weight rows x TN tokens (0.011 bytes per multiply-add at TN = 80) and no barrier of the whole
 * CTA sits in the main loop.
 *
 * Warpgroup 0 produces (cp.async of the stage's FC1 token rows into a ring of shared-memory
 * stages, each thread's copies signalling the stage's full barrier when they land:
 * cp.async.mbarrier.arrive.noinc; the CTA's tiles' half units of codes and their scales by two
 * TMA boxes, FC2's token rows by one per term, counted on the same barrier as transaction bytes;
 * and each job's epilogue operands into a table, WpTab); the other warpgroups consume
 * (each warp decodes one 16-row tile per 64-row M tile of its warpgroup, MTW of them, into a
 * four-step register ring as in k_wg, and issues per 16-k step and M tile one wgmma m64nTNk16 per
 * fp16 term into the same fp32 accumulators). A consumer warp hands a stage back (empty barrier,
 * one arrival per consumer warp) once the wgmma that read it have retired. The producer gives up
 * registers (setmaxnreg) so the consumers hold MTW x TN / 2 accumulators plus the ring. The
 * consumers are latency-bound (ncu, v23: fixed-latency and dispatch stalls, tensor pipe ~56%,
 * issue 0.39 per scheduler), so more warps per SM pay where registers allow them:
 *  - TN = 48: three consumer warpgroups of MTW = 2 (512 threads, 384 rows per job, 128 registers,
 *    no spills for NVFP4, 8 B for MXFP4 two-term FC1): H100, same call, NVFP4 w4a16 T = 2048 /
 *    8192 14.27 / 49.05 -> 12.88 / 43.06 ms against two, w4a16-bf16 T = 2048 10.15 -> 8.97 (v22);
 *  - TN = 80 FC1: four consumer warpgroups of MTW = 1 (640 threads, 256 rows, 96 registers, no
 *    spills): H100, same call, two rounds, automatic path T = 8192 w4a16 39.55 / 39.76 -> 38.48 /
 *    38.30 ms, w4a16-bf16 27.64 / 27.38 -> 26.54 / 26.43 against two of MTW = 2 (v23);
 *  - TN = 80 FC2 keeps two of MTW = 2: with four its stage ran 5-7% slower (its epilogue is
 *    short, so the extra instructions of four warpgroups per weight byte count);
 *  - TN = 160 (over ~100 tokens per expert): three consumer warpgroups of MTW = 1 (512 threads,
 *    192 rows, 152 registers, no spills). H100, same call: an item costs 2.3x (w4a16-bf16) /
 *    2.6x (w4a16) a 48-token one against 1.36x / 1.46x for 80 tokens, so T = 6144 / 8192 run
 *    14 / 9% (bf16) and 6 / 4% (w4a16) faster than with 80. Two warpgroups of MTW = 2 (spills)
 *    ran 23-42% slower; 192 tokens (two warpgroups) lost at every T from 2048 to 12288;
 *  - TN = 128, the same three warpgroups (128 registers, no spills; 1.9x / 2.1x a 48-token
 *    item), for ~100-120 and ~200-240 tokens per expert, where 160 would pad or split badly.
 *    H100, same call, two rounds, automatic path, NVFP4 K3 layer, with it against without:
 *    T = 6144 w4a16-bf16 18.3 / 18.8 -> 17.0 / 17.1 ms, w4a16 29.1 / 30.5 -> 27.6 / 26.6;
 *    T = 12288 w4a16-bf16 36.2 / 37.0 -> 32.8 / 32.5, w4a16 level; T = 4096 / 8192 level
 *    (v32; the 64- and 128-token k_wg kernels it displaced were never chosen automatically).
 * Persistent: one CTA per SM walks the (work item, row block) jobs with the row blocks of
 * an item adjacent, so the CTAs in flight share the item's token rows in L2 and the items of one
 * expert (split evenly, MoeRun.split) read its weights while they are still in L2.
 * A wait that never completes traps (mbar_wait) instead of hanging. */
#include "cuda/cuda_check.cuh"
#include "cuda/moe_prefill.cuh"
#include "cuda/moe_state.cuh"
#include "cuda/moe_wgmma.cuh"
#include <cudaTypedefs.h>

extern "C" {
#include "base/base.h"
#include "moe/activation.h"
}

/* Consumer warpgroups per CTA (8 tiles of 16 rows each: 2 M tiles x 4 warps): 2, or WP_CW48 for
 * the 48-token tiles, whose accumulators leave room for a third (lab builds may set it). */
#ifndef WP_CW48
#define WP_CW48 3
#endif
#ifndef WP_MTW80_FC1 /* M tiles per consumer warp in the 80-token FC1 kernels (lab builds may set it) */
#define WP_MTW80_FC1 1
#endif
/* The wide tiles, 128 and 160 tokens (T >= ~6144 on the K3 layer: over ~100 tokens per expert):
 * their consumer warpgroups and M tiles per consumer warp (lab builds may set both). */
__host__ __device__ constexpr bool wp_wide(int tn) { return tn == 128 || tn == 160; }
#ifndef WP_CW_WIDE
#define WP_CW_WIDE 3
#endif
#ifndef WP_MTW_WIDE
#define WP_MTW_WIDE 1
#endif
/* 16-row tiles per job (the stage layout, the same for FC1 and FC2), M tiles per consumer warp,
 * consumer warpgroups: each warpgroup covers MTW 64-row M tiles. */
__host__ __device__ constexpr int wp_tiles(int tn) {
    return tn == 48 ? 8 * WP_CW48 : wp_wide(tn) ? 4 * WP_CW_WIDE * WP_MTW_WIDE : 16;
}
__host__ __device__ constexpr int wp_mtw(int tn, int fc2) {
    return wp_wide(tn) ? WP_MTW_WIDE : tn == 80 && !fc2 ? WP_MTW80_FC1 : 2;
}
__host__ __device__ constexpr int wp_cw(int tn, int fc2) { return wp_tiles(tn) / (4 * wp_mtw(tn, fc2)); }
__host__ __device__ constexpr int wp_threads(int tn, int fc2) { return 128 * (wp_cw(tn, fc2) + 1); }
#define WP_PRODUCERS 128 /* one warpgroup */
#define WP_SMEM_BUDGET (224 * 1024)
#define WP_REGS_PRODUCER 56
/* setmaxnreg moves registers only within what the launch allocated (the per-thread cap of
 * __launch_bounds__, 64 K / threads in multiples of 8): the consumers get that cap plus what the
 * producer gives up, 224 with two consumer warpgroups, 152 with three, 104 with four (a larger
 * value than the pool holds makes setmaxnreg.inc wait forever). */
__host__ __device__ constexpr int wp_regs_launch(int tn, int fc2) { return 65536 / wp_threads(tn, fc2) / 8 * 8; }
__host__ __device__ constexpr int wp_regs_consumer(int tn, int fc2) {
    return (wp_regs_launch(tn, fc2) + (wp_regs_launch(tn, fc2) - WP_REGS_PRODUCER) * WP_PRODUCERS / (128 * wp_cw(tn, fc2))) /
           8 * 8;
}
__host__ __device__ constexpr bool wp_pool_ok(int tn, int fc2) {
    return wp_regs_consumer(tn, fc2) * 128 * wp_cw(tn, fc2) + WP_REGS_PRODUCER * WP_PRODUCERS <=
           wp_regs_launch(tn, fc2) * wp_threads(tn, fc2);
}
static_assert(wp_pool_ok(48, 0) && wp_pool_ok(48, 1) && wp_pool_ok(80, 0) && wp_pool_ok(80, 1) && wp_pool_ok(128, 0) &&
                  wp_pool_ok(128, 1) && wp_pool_ok(160, 0) && wp_pool_ok(160, 1),
              "k_wgp: register pool");
static_assert(wp_tiles(80) % 4 == 0 && wp_tiles(80) / 4 % WP_MTW80_FC1 == 0, "k_wgp 80: M tiles per warpgroup");

/* A stage: the token parts, then the tiles' codes (512 B each) and their scales (128 or 64 B
 * each), padded to 1024 bytes, so that the next stage's swizzled parts start on an atom boundary
 * (12 tiles take 7.5 KB). */
__host__ __device__ constexpr int wp_stage_bytes(int tn, int np) {
    return np * wg_part_bytes(tn) + (wp_tiles(tn) * WG_WBYTES + 1023) / 1024 * 1024;
}
static_assert(wp_stage_bytes(48, 1) % 1024 == 0 && wp_stage_bytes(80, 1) % 1024 == 0 &&
                  wp_stage_bytes(128, 1) % 1024 == 0 && wp_stage_bytes(160, 1) % 1024 == 0,
              "k_wgp: stages on 1024-byte boundaries");
#ifndef WP_MAX_STAGES /* ring depth cap (lab builds may set it; each stage costs two mbarriers) */
#define WP_MAX_STAGES 8
#endif
__host__ __device__ constexpr int wp_stages(int tn, int np) {
    const int fit = WP_SMEM_BUDGET / wp_stage_bytes(tn, np);
    return fit < WP_MAX_STAGES ? fit : WP_MAX_STAGES;
}
__host__ __device__ constexpr int wp_smem_bytes(int tn, int np) { return wp_stages(tn, np) * wp_stage_bytes(tn, np); }

/* The producer's copies of stage s of a job. Token rows: FC1 gathers them by cp.async (two
 * threads per row, alternate 16-byte pieces: one 32-byte sector per pair; rows past the item's
 * tokens are not copied, their columns are never stored); FC2's rows of an item are contiguous
 * positions, one TMA box of TN rows x 64 k per term (the copy engine applies the 128-byte
 * swizzle from the destination address, as wg_bpiece lays it out; rows past the item's positions
 * are loaded, or zero-filled past the array, and never stored). Weights: thread 0 copies the
 * half units of the job's tiles tile0 .. tile0 + TILES - 1 with one box of the codes map and one
 * of the scales map (wp_weight_map: a tile's units are contiguous along k, so a stage is one
 * 512-byte column of TILES rows; tiles past the expert's last are loaded, or zero-filled past
 * the array, and never stored). The boxes count on the stage's full barrier as transaction bytes.
 * Measured (H100, one call, two rounds, FC2 stage ms, NVFP4): the box against cp.async rows
 * w4a16 T = 2048 3.80 / 3.83 -> 3.69 / 3.65, T = 8192 9.99 / 10.26 -> 9.43 / 9.34, w4a16-bf16
 * T = 8192 5.66 / 5.81 -> 4.93 / 4.91. FC1's gathered rows as one 128-byte box each ran 66% /
 * 86% slower than by cp.async at T = 2048 / 8192, and multicasting the rows over two-CTA
 * clusters (the other CTA on the next row block) gained nothing in FC2 and did not close FC1's
 * gap (lab/NOTES.md v26; the code is lab/pending/tma_cluster_tokens.patch). Eight threads per
 * row (whole lines per request) ran up to 20% slower, and boxes from a position-ordered copy of
 * xq left FC1 level; its epilogue, which all consumers run at once, costs it more (lab/NOTES.md
 * v33). Weights by TMA against 16-byte cp.async (960 per 48-token stage from 128 threads; H100, one call, two rounds,
 * FC2 stage ms / whole MoE ms): w4a16 T = 2048 3.61 / 3.69 -> 3.49 / 3.44, 11.6 / 11.7 ->
 * 11.1 / 11.1; T = 8192 9.43 / 9.63 -> 9.51 / 9.51, 34.2 / 33.9 -> 32.9 / 33.2; w4a16-bf16
 * T = 2048 2.69 / 2.60 -> 2.46 / 2.33; FC1 unchanged. An L2 evict-first policy on the weight
 * boxes gained nothing further (v30). 48 separate 512-byte cp.async.bulk copies per stage had
 * lost 1.3-2.5x (v28). */
__host__ __device__ constexpr int wp_rpt(int tn) { return (tn + 63) / 64; } /* token rows per producer thread pair */
template <int FMT, int TN, int NP, int FC2>
__device__ __forceinline__ void wp_fill(const MoeDev &m, const CUtensorMap *rmap, const CUtensorMap *wmap,
                                        const CUtensorMap *smap, uint32_t st, uint32_t fullb, int s, int p0,
                                        const __half *const src[wp_rpt(TN)], const int nrow, int tile0, int tid) {
    constexpr int SBY = FMT == FMT_NV ? UNIT_S_NV : UNIT_S_MX, TILES = wp_tiles(TN);
    const int K = FC2 ? m.I : m.H;
    if (tid == 0) {
        const uint32_t wb = st + NP * wg_part_bytes(TN);
        const int c = s >> 1, h = s & 1;
        mbar_expect_tx(fullb, TILES * (512 + SBY) + (FC2 ? NP * TN * WG_KS * 2 : 0));
        if (FC2) {
#pragma unroll
            for (int p = 0; p < NP; p++) tma_load_2d(st + p * wg_part_bytes(TN), rmap, p * K + s * WG_KS, p0, fullb);
        }
        tma_load_2d(wb, wmap, c * (UNIT_W / 4) + h * 128, tile0, fullb);
        tma_load_2d(wb + TILES * 512, smap, c * (SBY / 4), tile0, fullb);
    }
    if (!FC2) {
        const int pair = tid & 1;
#pragma unroll
        for (int rr = 0; rr < wp_rpt(TN); rr++) {
            const int row = (tid >> 1) + 64 * rr;
            if (row < nrow) {
#pragma unroll
                for (int p = 0; p < NP; p++)
#pragma unroll
                    for (int gi = 0; gi < 4; gi++) {
                        const int kg = 2 * gi + pair;
                        cp_async16(st + p * wg_part_bytes(TN) + wg_bpiece(row, kg), src[rr] + p * K + s * WG_KS + kg * 8,
                                   16);
                    }
            }
        }
    }
}

/* One consumer 16-k step KS of half H (as k_wg's wg_step, MTW M tiles): once this warp's
 * fourth-newest group has retired, its ring slot KS is rewritten and the step issued. After
 * the wait of step 3 the previous stage has left the tensor cores: its slot goes back. */
template <int FMT, int TN, int NP, int MTW, int H, int KS>
__device__ __forceinline__ void wp_step(float acc[MTW][TN / 2], uint32_t a[MTW][4][4], const uint4 w[MTW],
                                        const uint4 sc[MTW], uint32_t d0, uint32_t release) {
    wg_wait<3>();
    if (KS == 3 && release) mbar_arrive(release);
#pragma unroll
    for (int t = 0; t < MTW; t++)
        decode_step<FMT>(w[t], w[t], sc[t], 4 * H + KS, a[t][KS][0], a[t][KS][1], a[t][KS][2], a[t][KS][3]);
    wg_fence();
#pragma unroll
    for (int t = 0; t < MTW; t++) wg_mma_step<TN, NP, KS>(acc[t], a[t][KS], d0);
    wg_commit();
}

/* One consumer stage: global stage g (in slot g % ST), half H of unit s / 2; first: the first
 * stage of a job (no previous stage to hand back). */
template <int FMT, int TN, int NP, int MTW, int H>
__device__ __forceinline__ void wp_cstage(uint32_t g, bool first, uint32_t sbase, uint32_t full, uint32_t empty, int ti0,
                                          int lane, float acc[MTW][TN / 2], uint32_t a[MTW][4][4]) {
    constexpr int ST = wp_stages(TN, NP);
    const uint32_t b = g % ST, st = sbase + b * wp_stage_bytes(TN, NP);
    mbar_wait(full + 8 * b, (g / ST) & 1);
    fence_async_smem(); /* the producer's cp.async writes, now visible here, to the tensor cores */
    uint4 w[MTW], sc[MTW];
#pragma unroll
    for (int t = 0; t < MTW; t++) {
        constexpr int SBY = FMT == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
        const int ti = ti0 + 4 * t;
        const uint32_t wd = st + NP * wg_part_bytes(TN), sd = wd + wp_tiles(TN) * 512 + ti * SBY;
        w[t] = lds128(wd + ti * 512 + lane * 16);
        if (FMT == FMT_NV) {
            sc[t] = lds128(sd + (lane >> 2) * 16);
        } else {
            const uint2 v = lds64(sd + (lane >> 2) * 8);
            sc[t] = make_uint4(v.x, v.y, 0, 0);
        }
    }
    const uint32_t d0 = wg_desc_sw128_lo(st);
    const uint32_t release = !first && lane == 0 ? empty + 8 * ((g + ST - 1) % ST) : 0u;
    wp_step<FMT, TN, NP, MTW, H, 0>(acc, a, w, sc, d0, 0u);
    wp_step<FMT, TN, NP, MTW, H, 1>(acc, a, w, sc, d0, 0u);
    wp_step<FMT, TN, NP, MTW, H, 2>(acc, a, w, sc, d0, 0u);
    wp_step<FMT, TN, NP, MTW, H, 3>(acc, a, w, sc, d0, release);
}

/* A job's epilogue operands, copied into shared memory by the producer with the job's last
 * stage (its cp.async arrive covers them, so the consumers' wait on that stage makes them
 * visible): per token column FC1 the token's x row scale, FC2 the position's h row scale and its
 * slot; and the expert's factors (FC1: f1 pair, alpha, beta, limit; FC2: f2). One table: the
 * producer writes job j's once the consumers have handed back job j - 1's (tempty, after their
 * epilogue), which by j's last stage they have done but for the shortest K. Two tables would not
 * fit beside the 160-token one-term ring (227 KB). Why: the epilogue's loads were a chain of
 * dependent global loads (FC1: the token, then its scale, per 8 columns) behind the loaded memory
 * system; FC1's epilogue ran exposed for ~14 us per job (lab/NOTES.md v25). H100, one call, two
 * rounds, FC1 stage ms: w4a16 T = 8192 24.26 / 25.27 -> 22.84 / 23.08, w4a16-bf16 16.41 / 16.40 ->
 * 15.92 / 15.87; level at T = 2048 (v26). */
template <int TN>
struct WpTab {
    float2 col[TN];
    float cst[8];
};

/* The producer's part: row `row` of the job (token tok, position p), thread pair's first thread;
 * and the factors from threads 0..4. Absent parameter arrays (alpha, beta, limit) are not copied:
 * the consumers use their defaults. */
template <int FC2>
__device__ __forceinline__ void wp_tab_row(const MoeRun &r, uint32_t tb, int row, int tok, int p) {
    if (FC2) {
        cp_async4(tb + row * 8, r.hs + p);
        cp_async4(tb + row * 8 + 4, r.sorted_slot + p);
    } else {
        cp_async4(tb + row * 8, r.xs + tok);
    }
}
template <int TN, int FC2>
__device__ __forceinline__ void wp_tab_cst(const MoeDev &m, uint32_t tb, int e, int tid) {
    const float *c = nullptr;
    if (FC2) c = tid == 0 ? m.f2 + e : nullptr;
    else if (tid < 2) c = m.f1 + 2 * e + tid;
    else if (tid == 2 && m.alpha) c = m.alpha + e;
    else if (tid == 3 && m.beta) c = m.beta + e;
    else if (tid == 4 && m.limit) c = m.limit + e;
    if (c) cp_async4(tb + TN * 8 + tid * 4, c);
}

/* The epilogue of a warp's MTW M tiles (mt0, mt0 + 4, ...) from the job's table. FC1: per token
 * column the activation and store of every tile's rows, then one |h| max over all of them (one
 * shuffle tree and one atomic per column instead of one per tile: FC1 stage of the 48-token
 * kernels 2-10% faster, v25). FC2: the unweighted rows of the column's slot.
 * The columns go in chunks of CH per lane (4 CH tokens) without a branch inside: a column's work
 * is a chain of dependent MUFU and FMUL, and with a branch around each column (the tokens past
 * the item, tiles past the expert) the compiler could not interleave them; columns and tiles
 * past the end are computed from whatever the table and accumulators hold and never stored.
 * Chunks past the item's last token are skipped. b16: h stored as bf16 (MoeRun.hb16; uniform, so
 * nvcc compiles the epilogue once per store form and branches once). With SiTU's single quotient (situ_fast): H100,
 * one call, two rounds, whole MoE ms, w4a16-bf16 T = 8192 21.49 / 21.49 -> 21.12 / 21.15,
 * T = 12288 32.7 / 32.4 -> 31.0 / 31.3; w4a16 T = 8192 34.5 / 34.0 -> 33.3 / 33.4 (lab/NOTES.md
 * v33). */
template <int ACT, int TN, int MTW, int FC2>
__device__ __forceinline__ void wp_epilogue(const MoeDev &m, const MoeRun &r, const WpTab<TN> &tb, int p0, int n, int mt0,
                                            int mtiles, int g, int q, const float acc[MTW][TN / 2], bool b16) {
    constexpr int NC = TN / 4, CH = 4;
    static_assert(NC % CH == 0, "k_wgp epilogue: whole chunks of columns");
    const float c0 = tb.cst[0], c1 = tb.cst[1];
    const float al = !FC2 && m.alpha ? tb.cst[2] : 1.f, be = !FC2 && m.beta ? tb.cst[3] : 0.f;
    const float li = !FC2 && m.limit ? tb.cst[4] : INFINITY;
    bool tv[MTW]; /* this warp's tile t lies inside the expert */
#pragma unroll
    for (int t = 0; t < MTW; t++) tv[t] = mt0 + 4 * t < mtiles;
#pragma unroll
    for (int u0 = 0; u0 < NC; u0 += CH) {
        if (4 * u0 >= n) break; /* the chunk's first token (8 (u0 / 2)) is past the item's last */
#pragma unroll
        for (int u = u0; u < u0 + CH; u++) {
            const int j = 8 * (u >> 1) + 2 * q + (u & 1), i = 4 * (u >> 1) + (u & 1);
            const bool ok = j < n;
            const float2 cv = tb.col[j];
            if (FC2) {
                float *o = r.part + (size_t)(ok ? __float_as_int(cv.y) : 0) * m.H + g;
                const float sc = c0 * cv.x;
#pragma unroll
                for (int t = 0; t < MTW; t++) {
                    const int mt = mt0 + 4 * t;
                    if (ok && tv[t]) {
                        o[mt * 16] = acc[t][i] * sc;
                        o[mt * 16 + 8] = acc[t][i + 2] * sc;
                    }
                }
            } else {
                float *hr = r.h + (size_t)(p0 + j) * m.I;
                uint16_t *hb = (uint16_t *)r.h + (size_t)(p0 + j) * m.I; /* the row as bf16 (b16) */
                unsigned am = 0;
#pragma unroll
                for (int t = 0; t < MTW; t++) {
                    float v0, v1;
                    int i0, i1;
                    fc1_act<ACT>(m, mt0 + 4 * t, g, acc[t][i], acc[t][i + 2], c0, c1, cv.x, al, be, li, v0, v1, i0, i1);
                    const bool st = ok && tv[t];
                    if (b16) { /* one conversion for the pair; |h| max of the rounded values */
                        const uint32_t pb = bf162_bits(__floats2bfloat162_rn(v0, v1));
                        v0 = __uint_as_float(pb << 16);
                        v1 = __uint_as_float(pb & 0xFFFF0000u);
                        if (st) hb[i0] = (uint16_t)pb;
                        if (st && i1 >= 0) hb[i1] = (uint16_t)(pb >> 16);
                    } else {
                        if (st) hr[i0] = v0;
                        if (st && i1 >= 0) hr[i1] = v1;
                    }
                    am = st ? max(am, max(abs_bits(v0), abs_bits(v1))) : am;
                }
                am = warp_max8(am);
                if (ok && g == 0) hamax_fold(r.hamax + p0 + j, am);
            }
        }
    }
}

template <int FMT, int ACT, int TN, int FC2, int NP>
__global__ void __launch_bounds__(wp_threads(TN, FC2), 1) k_wgp(MoeDev m, MoeRun r, const __grid_constant__ CUtensorMap rmap,
                                                               const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap smap) {
    constexpr int ST = wp_stages(TN, NP), TILES = wp_tiles(TN), MTW = wp_mtw(TN, FC2);
    extern __shared__ __align__(1024) uint8_t wsm[];
    __shared__ __align__(8) uint64_t bars[2 * WP_MAX_STAGES + 1];
    __shared__ __align__(16) WpTab<TN> tab;
    const int tid = threadIdx.x, lane = tid & 31;
    const uint32_t sbase = wg_align1024(smem_u32(wsm)), full = smem_u32(bars), empty = full + 8 * WP_MAX_STAGES,
                   tempty = full + 16 * WP_MAX_STAGES;
    if (tid == 0) {
        for (int b = 0; b < ST; b++) {
            mbar_init(full + 8 * b, WP_PRODUCERS);
            mbar_init(empty + 8 * b, 4 * wp_cw(TN, FC2));
        }
        mbar_init(tempty, 4 * wp_cw(TN, FC2));
        mbar_init_fence();
    }
    __syncthreads();
    const int mtiles = FC2 ? m.m2 : m.m1, nst = 2 * (FC2 ? m.nk2 : m.nk1), K = FC2 ? m.I : m.H;
    uint32_t sg = 0; /* stages begun so far in this CTA: the same sequence in every role */
    /* (the job count is computed after each role's setmaxnreg: held across it, ptxas spilled it
     * in the 96-register kernels) */
    if (tid < WP_PRODUCERS) {
        regs_dec<WP_REGS_PRODUCER>();
        const int nrb = (mtiles + TILES - 1) / TILES, jobs = r.ctl[1] * nrb;
        uint32_t jl = 0; /* jobs begun so far */
        const __half *plain = (const __half *)(FC2 ? r.hq : r.xq);
        const uint32_t tb = smem_u32(&tab);
        for (int job = blockIdx.x; job < jobs; job += gridDim.x) {
            const int wi = job / nrb, rb = job - wi * nrb;
            const int4 wk = r.work[wi];
            const int nrow = wk.z < TN ? wk.z : TN;
            const __half *src[wp_rpt(TN)];
#pragma unroll
            for (int rr = 0; rr < wp_rpt(TN); rr++) {
                const int row = (tid >> 1) + 64 * rr;
                src[rr] = plain + (size_t)(!FC2 && row < nrow ? r.sorted_tok[wk.y + row] : 0) * 2 * K;
            }
#pragma unroll 1
            for (int s = 0; s < nst; s++) {
                const uint32_t g = sg + s, b = g % ST;
                if (g >= ST) mbar_wait(empty + 8 * b, ((g / ST) - 1) & 1);
                wp_fill<FMT, TN, NP, FC2>(m, &rmap, &wmap, &smap, sbase + b * wp_stage_bytes(TN, NP), full + 8 * b, s, wk.y,
                                          src, nrow, wk.x * mtiles + rb * TILES, tid);
                if (s == nst - 1) { /* the table, once job jl - 1's has been read; this stage's arrive covers it */
                    if (jl >= 1) mbar_wait(tempty, (jl - 1) & 1);
#pragma unroll
                    for (int rr = 0; rr < wp_rpt(TN); rr++) {
                        const int row = (tid >> 1) + 64 * rr;
                        if (row < nrow && !(tid & 1))
                            wp_tab_row<FC2>(r, tb, row, FC2 ? 0 : r.sorted_tok[wk.y + row], wk.y + row);
                    }
                    if (tid < 5) wp_tab_cst<TN, FC2>(m, tb, wk.x, tid);
                }
                cp_async_mbar_arrive(full + 8 * b);
            }
            sg += nst;
            jl++;
        }
        cp_async_wait<0>();
        return;
    }
    regs_inc<wp_regs_consumer(TN, FC2)>();
    const int nrb = (mtiles + TILES - 1) / TILES, jobs = r.ctl[1] * nrb;
    const int cw = (tid >> 5) - 4, wgi = cw >> 2, wq = cw & 3, g = lane >> 2, q = lane & 3;
    const int ti0 = wgi * (4 * MTW) + wq; /* this warp's tiles: ti0 + 4 t, one per M tile t of its warpgroup */
    for (int job = blockIdx.x; job < jobs; job += gridDim.x) {
        const int wi = job / nrb, rb = job - wi * nrb;
        const int4 wk = r.work[wi];
        float acc[MTW][TN / 2];
#pragma unroll
        for (int t = 0; t < MTW; t++)
#pragma unroll
            for (int i = 0; i < TN / 2; i++) acc[t][i] = 0.f;
        uint32_t a[MTW][4][4];
#pragma unroll 1
        for (int s = 0; s < nst; s += 2) { /* nst is even: the unit's two halves */
            wp_cstage<FMT, TN, NP, MTW, 0>(sg + s, s == 0, sbase, full, empty, ti0, lane, acc, a);
            wp_cstage<FMT, TN, NP, MTW, 1>(sg + s + 1, false, sbase, full, empty, ti0, lane, acc, a);
        }
        wg_wait<0>();
        if (lane == 0) mbar_arrive(empty + 8 * ((sg + nst - 1) % ST));
        sg += nst;
        /* b16: h in bf16 (MoeRun.hb16), only ever with one term: the two-term kernels keep one epilogue */
        wp_epilogue<ACT, TN, MTW, FC2>(m, r, tab, wk.y, wk.z, rb * TILES + ti0, mtiles, g, q, acc, NP == 1 && r.hb16);
        __syncwarp();
        if (lane == 0) mbar_arrive(tempty);
    }
}

typedef void (*kern_t)(MoeDev, MoeRun, CUtensorMap, CUtensorMap, CUtensorMap);
#define PACTS(X, F, N, P)                                                                             \
    X(F, K3_ACT_IDENTITY, N, P), X(F, K3_ACT_GELU, N, P), X(F, K3_ACT_RELU, N, P), X(F, K3_ACT_SILU, N, P), \
        X(F, K3_ACT_SWIGLU, N, P), X(F, K3_ACT_GEGLU, N, P), X(F, K3_ACT_SWIGLU_BIAS, N, P),              \
        X(F, K3_ACT_RELU2, N, P), X(F, K3_ACT_SITU, N, P)
#define WP1K(F, A, N, P) (kern_t)k_wgp<F, A, N, 0, P>
#define WP2K(F, N, P) (kern_t)k_wgp<F, K3_ACT_IDENTITY, N, 1, P>
#define WP_FMTS1(N, P) {{PACTS(WP1K, FMT_NV, N, P)}, {PACTS(WP1K, FMT_MX, N, P)}}
#define WP_FMTS2(N, P) {WP2K(FMT_NV, N, P), WP2K(FMT_MX, N, P)}

/* Tile widths of this path (tokens per item), in the order of the kernel tables' width index. */
const int moe_wp_widths[MOE_WP_NW] = {48, 80, 128, 160};
const char moe_wp_widths_text[] = "48, 80, 128 or 160";

/* [terms - 1][width][fmt][act - 1] */
static const kern_t wp_fc1_table[2][MOE_WP_NW][2][9] = {
    {WP_FMTS1(48, 1), WP_FMTS1(80, 1), WP_FMTS1(128, 1), WP_FMTS1(160, 1)},
    {WP_FMTS1(48, 2), WP_FMTS1(80, 2), WP_FMTS1(128, 2), WP_FMTS1(160, 2)},
};
static const kern_t wp_fc2_table[2][MOE_WP_NW][2] = {
    {WP_FMTS2(48, 1), WP_FMTS2(80, 1), WP_FMTS2(128, 1), WP_FMTS2(160, 1)},
    {WP_FMTS2(48, 2), WP_FMTS2(80, 2), WP_FMTS2(128, 2), WP_FMTS2(160, 2)},
};

/* cuTensorMapEncodeTiled from the driver through the runtime (k3 links no libcuda). */
static PFN_cuTensorMapEncodeTiled_v12000 wp_encoder(void) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return NULL;
    return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

/* A 2-D tensor map: rows of row_bytes at a stride of row_bytes, dim0 elements of the type per
 * row, boxes of box0 elements x box1 rows; what names the array in the error. */
static int wp_map_2d(CUtensorMap *map, CUtensorMapDataType type, const void *base, uint64_t dim0, uint64_t rows,
                     uint64_t row_bytes, uint32_t box0, uint32_t box1, CUtensorMapSwizzle swz, CUtensorMapL2promotion l2,
                     const char *what, k3_error *err) {
    static const PFN_cuTensorMapEncodeTiled_v12000 enc = wp_encoder();
    if (!enc) return k3_fail(err, K3_ERR_UNSUPPORTED, "k_wgp: the CUDA driver offers no cuTensorMapEncodeTiled");
    const cuuint64_t dim[2] = {dim0, rows}, stride[1] = {row_bytes};
    const cuuint32_t box[2] = {box0, box1}, es[2] = {1, 1};
    CUresult cr = enc(map, type, 2, (void *)base, dim, stride, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, swz, l2,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (cr != CUDA_SUCCESS)
        return k3_fail(err, K3_ERR_INTERNAL, "k_wgp: cuTensorMapEncodeTiled failed (%d) for %s: %llu rows of %llu B", (int)cr,
                       what, (unsigned long long)rows, (unsigned long long)row_bytes);
    return K3_OK;
}

/* The tensor map of a plain activation array (rows of [hi: K halves][lo: K halves]) for boxes of
 * 64 halves x box_rows rows in the 128-byte swizzle. */
static int wp_tensor_map(CUtensorMap *map, const void *base, int K, int rows, int box_rows, k3_error *err) {
    return wp_map_2d(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, base, (uint64_t)2 * K, rows, (uint64_t)4 * K, WG_KS, box_rows,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, "the token rows", err);
}

/* The tensor map of a weight array [tiles][nk units][ub bytes] (codes: 1 KB units; scales: 128
 * or 64 B) for boxes of bx bytes x by tiles, as 32-bit elements (a box row may hold at most 256
 * elements), unswizzled: the consumers read a tile's 512 bytes of codes as 32 lanes x 16 B. */
static int wp_weight_map(CUtensorMap *map, const void *base, int nk, int ub, int tiles, int bx, int by, const char *what,
                         k3_error *err) {
    return wp_map_2d(map, CU_TENSOR_MAP_DATA_TYPE_UINT32, base, (uint64_t)nk * ub / 4, tiles, (uint64_t)nk * ub, bx / 4, by,
                     CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, what, err);
}

/* The index of width tn in moe_wp_widths, -1 for none. */
static int wp_width_index(int tn) {
    for (int i = 0; i < MOE_WP_NW; i++)
        if (moe_wp_widths[i] == tn) return i;
    return -1;
}

int moe_wp_width_ok(int tn) { return wp_width_index(tn) >= 0; }

int moe_wp_launch(const k3_cuda_moe *m, const MoeDev &d, const MoeRun &r, int fc2, int tn, cudaStream_t st,
                  k3_error *err) {
    const int wi = wp_width_index(tn);
    if (wi < 0)
        return k3_fail(err, K3_ERR_ARG, "warp-specialized wgmma path: %d tokens per tile (%s)", tn, moe_wp_widths_text);
    /* the kernel walks d.m1 FC1 tiles: the upload sized them from the one gated table */
    if (!fc2 && (int64_t)d.m1 * 16 != k3_act_fc1_rows(m->act, d.I))
        return k3_fail(err, K3_ERR_INTERNAL, "k_wgp: %d FC1 tiles uploaded, the activation table gives %lld rows", d.m1,
                       (long long)k3_act_fc1_rows(m->act, d.I));
    const int pi = r.np == 2 ? 1 : 0;
    kern_t k = fc2 ? wp_fc2_table[pi][wi][m->fmt] : wp_fc1_table[pi][wi][m->fmt][(int)m->act - 1];
    const int smem = wp_smem_bytes(tn, r.np) + WG_ALIGN_SLACK;
    /* FC2's token rows: hq [T k][2 I], boxes of tn positions (FC1 gathers xq rows by cp.async);
     * the weights of the local experts' tiles, boxes of a half unit x the job's tiles */
    CUtensorMap rmap = {}, wmap = {}, smap = {}; /* rmap: unused by FC1 */
    if (fc2 && wp_tensor_map(&rmap, r.hq, d.I, r.T * r.k, tn, err)) return err->status;
    const int nk = fc2 ? d.nk2 : d.nk1, tiles = d.n_local * (fc2 ? d.m2 : d.m1), sb = m->fmt == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
    if (wp_weight_map(&wmap, fc2 ? (const void *)d.w2 : (const void *)d.w1, nk, UNIT_W, tiles, 512, wp_tiles(tn), "the codes",
                      err) ||
        wp_weight_map(&smap, fc2 ? d.s2 : d.s1, nk, sb, tiles, sb, wp_tiles(tn), "the block scales", err))
        return err->status;
    K3_CUDA_TRY(err, cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    k<<<m->n_sm, wp_threads(tn, fc2), smem, st>>>(d, r, rmap, wmap, smap);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? K3_OK : k3_cuda_fail(err, e, fc2 ? "k_wgp<fc2><<<>>>" : "k_wgp<fc1><<<>>>", __FILE__, __LINE__);
}
