/* Device building blocks shared by the grouped and the fused MoE backends: the kernel
 * layout of weights and activations, the exact 4-bit decode, the mma.sync tile loop, the
 * activation functions and the dispatch sort. Host code never includes this file.
 *
 * Numerics (why fp16 and not bf16): an E2M1 code placed by bit shifts into an fp16 mantissa
 * is exactly code * 2^-14 (zero and the 0.5 code land on fp16 subnormals, which fp16
 * arithmetic and the tensor cores keep), and one HMUL2 by the E4M3 block scale (converted
 * exactly by cvt.f16x2.e4m3x2) gives code * scale * 2^-14 exactly: at most 6 significant
 * bits, never below 2^-24. The FP32 tensor scale and the 2^14 come back in the epilogue.
 * MXFP4 block exponents are re-based per matrix into E4M3 powers of two (2^-9..2^8) at
 * upload, so both formats share one decode. Activations are fp32 in the w4a16 contract; they
 * enter the MMA as two fp16 terms hi + lo of the row scaled by a power of two (amax in
 * [2^14, 2^15)), which carries ~22 significant bits: the w4a16 result differs from the
 * float64 reference only by fp32 accumulation. In w4a16-bf16 the rows are rounded to bf16
 * first and in w4a4 they are NVFP4 values: one fp16 term holds them (a bf16 value scaled that
 * way is exact in fp16 unless it lies below 2^-31 of the row's max, where the fp16 subnormal
 * grid rounds it: an error under 2^-39 of the max), so those modes issue one product per
 * weight instead of two (template parameter NP = terms per activation, 1 or 2). The
 * mma.sync m16n8k16 tile loop here serves
 * the decode sizes and the fused backend; moe_prefill.cu reuses the decode (decode_step) for
 * the sm_90a wgmma tiles of larger batches. */
#ifndef K3_MOE_DEV_CUH
#define K3_MOE_DEV_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "moe/activation.h"
#include "moe/moe.h"
}

enum { FMT_NV = 0, FMT_MX = 1 };
#define UNIT_W 1024 /* bytes of one 16-row x 128-k weight unit */
#define UNIT_S_NV 128
#define UNIT_S_MX 64
#define KCHUNK 128
#define WARPS 4 /* warps per CTA in the GEMM kernels */

/* The uploaded experts, by value in every kernel's arguments. */
struct MoeDev {
    int n_experts, first_local, n_local, H, I, gated;
    int m1, m2;   /* 16-row tiles of FC1 (2I gated: 8 up + 8 gate rows each; I otherwise), FC2 (H) */
    int nk1, nk2; /* 128-k chunks: H / 128, I / 128 */
    const uint4 *w1, *w2;         /* [n_local][m][nk][1024 B] */
    const uint8_t *s1, *s2;       /* [n_local][m][nk][128 or 64 B] */
    const float *f1;              /* [n_local][2]: epilogue factor of (up or w1 rows, gate rows) */
    const float *f2;              /* [n_local] */
    const float *alpha, *beta, *limit; /* [n_local] each, or NULL */
    float g1, g2;                 /* w4a4 activation global scales (0 when unavailable) */
};

/* One run's device views. Positions p index the expert-sorted local (token, slot) pairs. */
struct MoeRun {
    int T, k, mode, tn;            /* tn: tokens per work item (4 * NT * (3 - np) on mma.sync) */
    int np;                        /* fp16 terms per activation the GEMMs read: 2 (hi, lo) or 1 */
    int ks;                        /* grouped mma.sync: K halves per tile (1 or 2, one CTA) */
    int split;                     /* dispatch: an expert's tokens in ceil(n / tn) items of near-equal size
                                      (else items of tn and one remainder) */
    const float *x;                /* [T][H] */
    const int32_t *ids;            /* [T][k] */
    const float *rw;               /* [T][k] */
    float *y;                      /* [T][H] */
    uint4 *xq; float *xs;          /* [T][H*4 B] fp16 hi/lo fragment layout, row scale [T] */
    float *h; unsigned *hamax;     /* [T*k][I] FC1 output, |h| max bits per position */
    int hb16;                      /* h holds bf16 (wp_epilogue): w4a16-bf16 on k_wgp, whose mode reads
                                      nothing of h but its bf16 (half the bytes through FC1's
                                      stores and hconv's loads: H100 hconv stage T = 2048 201 ->
                                      139 us, T = 8192 800 -> 551); fp32 elsewhere, where the
                                      runtime choice cost the fused and k_wg kernels spills */
    uint4 *hq; float *hs;          /* [T*k][I*4 B], row scale [T*k] */
    int plain;                     /* xq / hq in the plain layout of the wgmma path */
    float *part;                   /* [T*k][H] unweighted FC2 output per slot */
    int *sorted_tok, *sorted_slot; /* [T*k] */
    int4 *work;                    /* [wmax] (expert, first position, tokens) */
    int *ctl;                      /* [0] = positions P, [1] = work items, [2..3] fused unit queues */
    int *dsp, nd;                  /* grouped dispatch: scratch (dsp_count) and its block count */
    unsigned long long *bar;       /* fused: grid barrier counter */
    unsigned long long bar_base;
    unsigned long long *stamps;    /* fused, benchmark only (else NULL): block 0's %globaltimer at
                                      the start, after each phase and at its end [6] (with one
                                      barrier, stamp 2 is block 0's own end of FC1) */
};

/* Where the fused kernel's 6 stamps live: bytes 16..63 of the ctl block (ensure_ws; its hand-off
 * counters follow from byte 64). */
static inline unsigned long long *fused_stamps_at(const MoeRun &r) { return (unsigned long long *)(r.ctl + 4); }

/* FC1 rows per expert (2I gated, I otherwise): the one table's rule, moe/activation.h. The
 * kernels read the result as MoeDev.gated / m1, never a private gated set. */
static inline int moe_fc1_rows(k3_act act, int inter) { return (int)k3_act_fc1_rows(act, inter); }

/* ---- small device helpers ----------------------------------------------------------- */

__device__ __forceinline__ uint4 ldg_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ldg_stream2(const uint2 *p) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

/* Programmatic dependent launch (sm_90): wait for the preceding kernel's completion and
 * memory; let the next kernel's CTAs be scheduled. Both are no-ops in a plain launch. */
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ void mma16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t h2_bits(__half2 v) { return *(uint32_t *)&v; }
__device__ __forceinline__ uint32_t bf162_bits(__nv_bfloat162 v) { return *(uint32_t *)&v; }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *(__half2 *)&u; }

/* Loads of data written earlier in the same launch (the fused kernel): L1-cached but never
 * the read-only (.nc) path, and never moved across the grid barrier. */
__device__ __forceinline__ uint4 ld_v4(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* A load nvcc cannot merge with an earlier load of the same address: the fused unit loop reads its
 * work item again after the chunk loop instead of holding it in registers across it. */
__device__ __forceinline__ int4 ld_v4i(const int4 *p) {
    int4 v;
    asm volatile("ld.global.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

/* Two E4M3 bytes (low byte -> low half) to fp16x2, exact. */
__device__ __forceinline__ __half2 e4m3x2_to_h2(uint32_t pair16) {
    __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(pair16 & 0xFFFF), __NV_E4M3);
    return *(__half2 *)&r;
}

/* Where, inside each 16-bit half of a packed word (moe_layout.cu), the 3 magnitude bits and
 * the sign of A register i sit. The decode wants the magnitude at fp16 bits 9..11 and the
 * sign at bit 15: registers 0 and 2 keep the sign 6 bits above the magnitude's low bit, so one
 * shift and one mask place both and the HMUL2 carries the sign (register 2 needs no shift at
 * all); registers 1 and 3 take the 8 bits left over and OR their sign in after the multiply.
 * 15 instructions per k-step instead of 18 with four separate signs. */
__host__ __device__ constexpr int mag_pos(int i) { return i == 0 ? 0 : i == 1 ? 3 : i == 2 ? 9 : 12; }
__host__ __device__ constexpr int sgn_pos(int i) { return i == 0 ? 6 : i == 1 ? 7 : i == 2 ? 15 : 8; }

/* The bit moves of register i, both halves at once: decode_mul is the fp16x2 word the scale
 * multiplies (magnitude, and the sign where one shift places both), decode_or the sign bits
 * or-ed in after the multiply (0 where the multiply carries them). Host code (the lab
 * emulation) calls the same two. */
__host__ __device__ constexpr bool sign_shared(int i) { return 15 - sgn_pos(i) == 9 - mag_pos(i); }
__host__ __device__ constexpr uint32_t decode_mul(uint32_t w, int i) {
    return (mag_pos(i) <= 9 ? w << (9 - mag_pos(i)) : w >> (mag_pos(i) - 9)) &
           (sign_shared(i) ? 0x8E008E00u : 0x0E000E00u);
}
__host__ __device__ constexpr uint32_t decode_or(uint32_t w, int i) {
    return sign_shared(i) ? 0u : (w << (15 - sgn_pos(i))) & 0x80008000u;
}

/* Register i of the A fragment from one packed word, times the block scale (one HMUL2: exact,
 * see the file comment). */
template <int I>
__device__ __forceinline__ uint32_t decode_reg(uint32_t w, __half2 scale) {
    return h2_bits(__hmul2(bits_h2(decode_mul(w, I)), scale)) | decode_or(w, I);
}

/* The A fragment (a0..a3, the m16n8k16 / wgmma register layout) of k-step s (0..7) of
 * one weight unit held as (w0, w1, scales); s must be a compile-time constant. */
template <int FMT>
__device__ __forceinline__ void decode_step(const uint4 &w0, const uint4 &w1, const uint4 &sc, int s,
                                            uint32_t &a0, uint32_t &a1, uint32_t &a2, uint32_t &a3) {
    const uint4 &wv = s < 4 ? w0 : w1;
    const int j = s & 3;
    uint32_t word = j == 0 ? wv.x : j == 1 ? wv.y : j == 2 ? wv.z : wv.w;
    uint32_t sp;
    if (FMT == FMT_NV) {
        const int jj = s >> 1;
        uint32_t sw = jj == 0 ? sc.x : jj == 1 ? sc.y : jj == 2 ? sc.z : sc.w;
        sp = (s & 1) ? (sw >> 16) : (sw & 0xFFFF);
    } else {
        const int b = s >> 1; /* 32-blocks: one per two k-steps */
        uint32_t sw = b < 2 ? sc.x : sc.y;
        sp = (b & 1) ? (sw >> 16) : (sw & 0xFFFF);
    }
    __half2 scl = e4m3x2_to_h2(sp);
    __half2 sr = __low2half2(scl), sr8 = __high2half2(scl);
    a0 = decode_reg<0>(word, sr);
    a1 = decode_reg<1>(word, sr8);
    a2 = decode_reg<2>(word, sr);
    a3 = decode_reg<3>(word, sr8);
}

/* Weight unit c (two 16-byte loads per lane, evict-first) and its scales (16 or 8 bytes per
 * group of 4 lanes sharing rows g and g + 8). */
template <int FMT>
__device__ __forceinline__ void load_unit(const uint4 *__restrict__ wq, const uint8_t *__restrict__ sq,
                                          int c, int lane, uint4 &w0, uint4 &w1, uint4 &s) {
    const uint4 *u = wq + (size_t)c * 64;
    w0 = ldg_stream(u + lane);
    w1 = ldg_stream(u + 32 + lane);
    if (FMT == FMT_NV) {
        s = ldg_stream((const uint4 *)(sq + (size_t)c * UNIT_S_NV + (lane >> 2) * 16));
    } else {
        const uint2 t = ldg_stream2((const uint2 *)(sq + (size_t)c * UNIT_S_MX + (lane >> 2) * 8));
        s = make_uint4(t.x, t.y, 0, 0);
    }
}

/* ---- the tile loop: one warp, MT x 16 weight rows x (NT * 4 tokens) over all of K ---------- */

/* brow[f]: B row (token or position) of this lane's column in fragment f, -1 if none.
 * Accumulators (NP = 2): acc[t * NT + f][0..1] = (hi, lo) of row g of M tile t for token 4f + q,
 * [2..3] row g + 8; the 8 columns of a fragment are 4 tokens x (hi, lo). NP = 1: a fragment is
 * 8 tokens and acc[t * NT + f][c] is token 8f + 2q + (c & 1), row g + 8 (c >> 1).
 * MT = 2: the warp takes two M tiles (tile t at wq + t wstep, sq + t sstep) and feeds both from the
 * same B fragments, halving the B loads per MMA and the instructions around them (one tile per
 * warp ran the L1 at 94% at T = 256; the grouped kernels' A/B is in lab/NOTES.md v14). */
template <int FMT, int NT, int NP, int MT = 1, int RP = 0>
__device__ __forceinline__ void gemm_tile(const uint4 *__restrict__ wq, const uint8_t *__restrict__ sq, size_t wstep,
                                          size_t sstep, int nk, int c0, int c1, const uint4 *bq, const int brow[NT],
                                          int lane, float acc[MT * NT][4], bool dep_wait = false) {
    const int q = lane & 3, part = NP == 2 ? (lane >> 2) & 1 : 0;
#pragma unroll
    for (int f = 0; f < MT * NT; f++) acc[f][0] = acc[f][1] = acc[f][2] = acc[f][3] = 0.f;
    const uint4 *bp[NT];
#pragma unroll
    for (int f = 0; f < NT; f++)
        bp[f] = brow[f] >= 0 ? bq + (size_t)brow[f] * nk * 32 + part * 16 + q * 4 : nullptr;

    /* software pipeline: chunks c + 1 .. c + D are in flight while c is decoded; with two
     * tiles one chunk ahead per tile (the same bytes in flight as two ahead for one tile, at
     * 90 registers instead of 132 for NT = 2: 5 CTAs per SM instead of 3) */
    constexpr int D = MT > 1 ? 1 : 2;
    uint4 aw0[MT], aw1[MT], as[MT], bw0[MT], bw1[MT], bs[MT];
#pragma unroll
    for (int t = 0; t < MT; t++) {
        aw0[t] = aw1[t] = as[t] = bw0[t] = bw1[t] = bs[t] = make_uint4(0, 0, 0, 0);
        if (c0 < c1) load_unit<FMT>(wq + t * wstep, sq + t * sstep, c0, lane, aw0[t], aw1[t], as[t]);
        if (D == 2 && c0 + 1 < c1) load_unit<FMT>(wq + t * wstep, sq + t * sstep, c0 + 1, lane, bw0[t], bw1[t], bs[t]);
    }
    if (dep_wait) pdl_wait();
    /* RP: the chunk addresses as running pointers. nvcc 13.0 strength-reduces the chunk index in
     * k_fc's loop by itself but, with the same code inlined in the fused kernel's unit loop,
     * re-derived every address per chunk (base pointers reloaded from the parameters, wide
     * multiplies): 371 instructions per FC1 chunk there against k_fc's 343, 362 with RP. k_fc
     * and the fused whole-K units keep RP = 0: with it, k_fc<MXFP4> dropped to 60 registers and ran
     * T = 1 5% slower, and the whole-K units ran T = 8 / 64 1% slower (H100, lab/NOTES.md v22). */
    constexpr int SB = FMT == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
    const uint4 *wn = wq + (size_t)(c0 + D) * 64;
    const uint8_t *sn = sq + (size_t)(c0 + D) * SB;
    const uint4 *bn[NT];
#pragma unroll
    for (int f = 0; f < NT; f++) bn[f] = bp[f] ? bp[f] + (size_t)c0 * 32 : bq;
#pragma unroll 1
    for (int c = c0; c < c1; c++) {
        uint4 cw0[MT], cw1[MT], cs[MT];
#pragma unroll
        for (int t = 0; t < MT; t++) {
            cw0[t] = cw1[t] = cs[t] = make_uint4(0, 0, 0, 0);
            if (c + D < c1)
                load_unit<FMT>(RP ? wn + t * wstep : wq + t * wstep, RP ? sn + t * sstep : sq + t * sstep, RP ? 0 : c + D,
                               lane, cw0[t], cw1[t], cs[t]);
        }
        wn += 64;
        sn += SB;
        uint4 bb[NT][4];
#pragma unroll
        for (int f = 0; f < NT; f++) {
#pragma unroll
            for (int j = 0; j < 4; j++)
                bb[f][j] = bp[f] ? ld_v4(RP ? bn[f] + j : bp[f] + (size_t)c * 32 + j) : make_uint4(0, 0, 0, 0);
            bn[f] += 32;
        }
#pragma unroll
        for (int s = 0; s < 8; s++) {
#pragma unroll
            for (int t = 0; t < MT; t++) {
                uint32_t a0, a1, a2, a3;
                decode_step<FMT>(aw0[t], aw1[t], as[t], s, a0, a1, a2, a3);
#pragma unroll
                for (int f = 0; f < NT; f++) {
                    const uint4 &b = bb[f][s >> 1];
                    uint32_t b0 = (s & 1) ? b.z : b.x, b1 = (s & 1) ? b.w : b.y;
                    mma16816(acc[t * NT + f], a0, a1, a2, a3, b0, b1);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < MT; t++) {
            if (D == 2) {
                aw0[t] = bw0[t]; aw1[t] = bw1[t]; as[t] = bs[t];
                bw0[t] = cw0[t]; bw1[t] = cw1[t]; bs[t] = cs[t];
            } else {
                aw0[t] = cw0[t]; aw1[t] = cw1[t]; as[t] = cs[t];
            }
        }
    }
}

/* ---- activations (fp32, the functors of moe.md §1.2) ------------------------------------ */

__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float geluf_(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }

/* 2^x and 1/x, approximate, with subnormal inputs and results flushed to zero (no range fix-up
 * instructions): only where a flushed result cannot change what follows (an exponential added to
 * 1, the reciprocal of a sum >= 1). */
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float rcp_ftz(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* tanh(y) for SiTU as a quotient num / den, den = 1 + e in [1, 2] with e = exp(-2|y|) from one
 * ex2.approx: num = sign(y) (1 - e) from |y| = 0.25 (1 - e >= 0.39: no cancellation worth
 * counting), below it the odd series to y^7 times den. NaN goes through; +-inf gives +-1. */
__device__ __forceinline__ float tanh_num(float y, float &den) {
    const float ay = fabsf(y), e = ex2_ftz(-2.8853900817779268f * ay), y2 = y * y; /* 2 log2(e) */
    den = 1.f + e;
    const float p = ay * fmaf(y2, fmaf(y2, fmaf(y2, -17.f / 315.f, 2.f / 15.f), -1.f / 3.f), 1.f) * den;
    return copysignf(ay < 0.25f ? p : 1.f - e, y);
}

/* SiTU = [a tanh(g/a) sigmoid(g)] * [b tanh(u/b)] = a n1 b n3 / (d1 d3 (1 + exp(-g))): the three
 * quotients share one rcp.approx (the denominator is in [1, 4] times 1 + exp(-g); at g < -88 it
 * is inf, or past 2^126 with a flushed reciprocal, and the result 0, as float32's
 * 1 / (1 + expf(-g)) gives there). Why: SiTU's two tanhf, expf and three IEEE divides
 * were most of FC1's epilogue, which runs exposed once per job (lab/NOTES.md v26): H100, one
 * call, two rounds, FC1 stage ms of k_wgp at T = 2048 w4a16-bf16 6.08 / 6.08 -> 5.11 / 4.88,
 * T = 8192 15.89 / 15.90 -> 13.53 / 14.19 with a quotient per tanh and one for the sigmoid; one
 * quotient in all, with the branch-free k_wgp epilogue, 1-5% on the whole MoE at T = 2048 .. 12288
 * (lab/NOTES.md v33). Float32 emulation (exp within 2 ulp) against float64
 * SiTU at (a, b) = (2.5, 7), (1, 1), (10, 10), g and u over [-30, 30], [-1, 1] and |x| in
 * [1e-8, 10]: max relative error 1.07e-6, as the three-quotient form's (1.21e-6). */
__device__ __forceinline__ float situ_fast(float g, float u, float a, float b) {
    float d1, d3;
    /* 1 / a and 1 / b are the same in every column: the compiler computes them once */
    const float n1 = tanh_num(g * __frcp_rn(a), d1), n3 = tanh_num(u * __frcp_rn(b), d3);
    return a * n1 * (b * n3) * rcp_ftz(d1 * d3 * (1.f + ex2_ftz(-1.4426950408889634f * g)));
}

template <int ACT>
__device__ __forceinline__ float act_gated(float g, float u, float a, float b, float lim) {
    if (ACT == K3_ACT_SWIGLU) return g * sigmoidf_(g) * u;
    if (ACT == K3_ACT_GEGLU) return geluf_(g) * u;
    if (ACT == K3_ACT_SWIGLU_BIAS) {
        float gg = fminf(g, lim), uu = fminf(fmaxf(u, -lim), lim);
        return gg * sigmoidf_(a * gg) * (uu + b);
    }
    if (ACT == K3_ACT_SITU) return situ_fast(g, u, a, b);
    /* A non-gated activation never gets here (m.gated is false for it), but its kernels compile
     * this branch too: NaN makes a misuse visible and keeps SiTU's arithmetic out of them. */
    return NAN;
}

template <int ACT>
__device__ __forceinline__ float act_plain(float x) {
    if (ACT == K3_ACT_SILU) return x * sigmoidf_(x);
    if (ACT == K3_ACT_GELU) return geluf_(x);
    if (ACT == K3_ACT_RELU) return fmaxf(x, 0.f);
    if (ACT == K3_ACT_RELU2) { float r = fmaxf(x, 0.f); return r * r; }
    return x; /* identity */
}

/* ---- activation rows into the B fragment layout ------------------------------------------ */

/* Half index of element k, part (0 = hi, 1 = lo) inside one row of the B layout: per 128-k
 * chunk [part][q][k-step][b0b1 | b2b3][2], so lane (q, part) reads 64 contiguous bytes. (A
 * layout with the 8 lanes of a token on 128 contiguous bytes per load, one L1 line per token
 * and instruction, was measured slower at T = 1 .. 64 and not faster at 256: lab/NOTES.md v13.) */
__device__ __forceinline__ int bq_index(int k, int part) {
    int c = k >> 7, kk = k & 127, s = kk >> 4, w = kk & 15;
    int q = (w & 7) >> 1, which = w >> 3, e = w & 1;
    return ((((c * 2 + part) * 4 + q) * 8 + s) * 2 + which) * 2 + e;
}

/* E2M1 round-to-nearest-even of a >= 0 (already clamped to 6). */
__device__ __forceinline__ float e2m1_rne(float a) {
    if (a <= 0.25f) return 0.f;
    if (a < 0.75f) return 0.5f;
    if (a <= 1.25f) return 1.f;
    if (a < 1.75f) return 1.5f;
    if (a <= 2.5f) return 2.f;
    if (a < 3.5f) return 3.f;
    if (a <= 5.f) return 4.f;
    return 6.f;
}

/* Word index of the fp16 pair (k, k + 1), part 0 = hi / 1 = lo, in one row: the mma.sync B
 * fragment layout (bq_index), or the plain layout [hi: K halves][lo: K halves] that the
 * wgmma kernels gather into shared memory. */
__device__ __forceinline__ int pair_word(int k, int part, int K, bool plain) {
    return plain ? (part * K + k) >> 1 : bq_index(k, part) >> 1;
}

__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

/* Loads a thread keeps in flight in the row passes: ROW_U float4 in row_amax, QUANT_U float2
 * (element pairs) in quant_row's conversion (its unrolled body is ~60 instructions per pair, so
 * ROW_U there would put ~1000 cold instructions in front of each conversion). Why: the plain
 * element loops compiled to one dependent load per iteration, so a K3 x row (3584 floats, 128
 * threads) took 28 L2 round trips for its max and 14 for its conversion: the fused kernel's
 * dispatch stage at T = 1 (H100, same call: 10.3 -> 5.4 us, T = 1 125 -> 120.5 us). The
 * conversion stays on pairs: float4 pairs split each warp's store sectors and took k_hconv to 64
 * registers (hconv at T = 2048 286 -> 348 us); with float2 pairs and k_hconv capped at 32
 * registers, H100, same call, two rounds, NVFP4 w4a16: hconv at T = 2048 348 / 349 -> 278 / 280
 * us, T = 8192 1399 / 1406 -> 1109 / 1110, fused T = 1 level (120.4 / 121.2 -> 121.1 / 121.3).
 * K is a multiple of 128 and rows start 16-byte aligned (moe_layout checks H and I), so a
 * float4 never straddles a row end. */
#define ROW_U 8
#define QUANT_U 4

/* The float4 / float2 at element k of a row, zeros past K. Plain loads, not ld.global.nc: the
 * fused kernel reads h rows that other CTAs wrote in the same launch. */
__device__ __forceinline__ float4 row_ld4(const float *src, int K, int k) {
    return k < K ? *(const float4 *)(src + k) : make_float4(0.f, 0.f, 0.f, 0.f);
}
__device__ __forceinline__ float2 row_ld2(const float *src, int K, int k) {
    return k < K ? *(const float2 *)(src + k) : make_float2(0.f, 0.f);
}

__device__ __forceinline__ float nanmax(float a, float b) { return (b > a || isnan(b)) ? b : a; }

/* This thread's share of max |src[k]| over a row (NaN if any element is NaN). */
__device__ __forceinline__ float row_amax(const float *src, int K, int tid, int nth) {
    float am = 0.f;
    for (int k0 = 4 * tid; k0 < K; k0 += 4 * nth * ROW_U) {
        float4 v[ROW_U];
#pragma unroll
        for (int u = 0; u < ROW_U; u++) v[u] = row_ld4(src, K, k0 + u * 4 * nth);
#pragma unroll
        for (int u = 0; u < ROW_U; u++)
            am = nanmax(nanmax(nanmax(nanmax(am, fabsf(v[u].x)), fabsf(v[u].y)), fabsf(v[u].z)), fabsf(v[u].w));
    }
    return am;
}

/* The power of two p that puts a row of max |value| amax at [2^14, 2^15) once scaled by 2^-p (0
 * for a zero or non-finite max). */
__device__ __forceinline__ int row_shift(float amax) {
    if (!(amax > 0.f && isfinite(amax))) return 0;
    int ex;
    frexpf(amax, &ex); /* amax in [2^(ex-1), 2^ex) */
    return ex - 15;
}

/* The w4a16 terms of the pair (v0, v1) at elements (k, k + 1), scaled by 2^-p. */
__device__ __forceinline__ void quant_pair(float v0, float v1, int k, int p, int K, bool b16, bool plain, bool lo,
                                           uint32_t *__restrict__ dst) {
    if (b16) v0 = bf16_round(v0), v1 = bf16_round(v1);
    const float s0 = ldexpf(v0, -p), s1 = ldexpf(v1, -p);
    const __half h0 = __float2half_rn(s0), h1 = __float2half_rn(s1);
    dst[pair_word(k, 0, K, plain)] = h2_bits(__halves2half2(h0, h1));
    if (lo) {
        const __half l0 = __float2half_rn(s0 - __half2float(h0)), l1 = __float2half_rn(s1 - __half2float(h1));
        dst[pair_word(k, 1, K, plain)] = h2_bits(__halves2half2(l0, l1));
    }
}

/* One row of K floats into hi/lo fp16 terms (w4a16; w4a16-bf16 rounds to bf16 first) with the
 * power-of-two row scale, or into NVFP4-quantized values (w4a4, global scale g, TensorRT-LLM's
 * rule s = E4M3(g amax/6), code = E2M1(x g / s)) stored as code * s * 2^-14 (exact in fp16)
 * with row scale 2^14 / g. Writes the lo terms only when lo (a kernel with NP = 2 reads them).
 * Threads tid..K step nth handle element pairs (w4a16: QUANT_U float2 loads issued before their
 * conversions) or 16-blocks (w4a4, not a decode-latency path). */
__device__ __forceinline__ void quant_row(const float *src, int K, float amax, int mode, float g,
                                         uint32_t *__restrict__ dst, float *rowscale, int tid, int nth,
                                         bool plain, bool lo) {
    if (mode != K3_MODE_W4A4) {
        const bool b16 = mode == K3_MODE_W4A16_BF16;
        if (b16) amax = bf16_round(amax); /* the max of the rounded row */
        const int p = row_shift(amax);
        if (tid == 0) *rowscale = ldexpf(1.f, p);
        for (int k0 = 2 * tid; k0 < K; k0 += 2 * nth * QUANT_U) {
            float2 v[QUANT_U];
#pragma unroll
            for (int u = 0; u < QUANT_U; u++) v[u] = row_ld2(src, K, k0 + u * 2 * nth);
#pragma unroll
            for (int u = 0; u < QUANT_U; u++) {
                const int k = k0 + u * 2 * nth;
                if (k < K) quant_pair(v[u].x, v[u].y, k, p, K, b16, plain, lo, dst);
            }
        }
    } else {
        if (tid == 0) *rowscale = 16384.f / g;
        for (int b = tid; b < K / 16; b += nth) {
            const float *x = src + b * 16;
            float am = 0.f;
            for (int i = 0; i < 16; i++) am = fmaxf(am, fabsf(x[i]));
            float sf = g * am / 6.f;
            float sd = __half2float(e4m3x2_to_h2(__nv_cvt_float_to_fp8(sf, __NV_SATFINITE, __NV_E4M3)).x);
            for (int i = 0; i < 16; i += 2) {
                float v[2];
                for (int e = 0; e < 2; e++) {
                    float c = 0.f;
                    if (sd != 0.f) {
                        float qv = x[i + e] * g / sd;
                        qv = fminf(fmaxf(qv, -6.f), 6.f);
                        c = copysignf(e2m1_rne(fabsf(qv)), qv);
                    }
                    v[e] = ldexpf(c * sd, -14);
                }
                int k = b * 16 + i;
                dst[pair_word(k, 0, K, plain)] = h2_bits(__floats2half2_rn(v[0], v[1]));
                if (lo) dst[pair_word(k, 1, K, plain)] = 0u;
            }
        }
    }
}

/* quant_row of a bf16 row (src: K / 2 bf16 pairs, FC1's h where MoeRun.hb16) with its max
 * amax: the same terms as quant_row gives the fp32 row it was rounded from. */
__device__ __forceinline__ void quant_row_b16(const uint32_t *src, int K, float amax, uint32_t *__restrict__ dst,
                                              float *rowscale, int tid, int nth, bool plain, bool lo) {
    const int p = row_shift(bf16_round(amax));
    if (tid == 0) *rowscale = ldexpf(1.f, p);
    for (int k0 = 2 * tid; k0 < K; k0 += 2 * nth * QUANT_U) {
        uint32_t v[QUANT_U];
#pragma unroll
        for (int u = 0; u < QUANT_U; u++) v[u] = k0 + u * 2 * nth < K ? src[(k0 + u * 2 * nth) >> 1] : 0u;
#pragma unroll
        for (int u = 0; u < QUANT_U; u++) {
            const int k = k0 + u * 2 * nth;
            if (k < K) quant_pair(__uint_as_float(v[u] << 16), __uint_as_float(v[u] & 0xFFFF0000u), k, p, K, false, plain, lo, dst);
        }
    }
}

/* ---- dispatch: count, offsets, work items, sorted positions (one CTA) -------------------- */

/* Exclusive scan of a[0..n) in shared memory, in place; returns the total. tsum: 33 ints.
 * Each thread sums a contiguous segment; warps scan with shuffles; one thread scans the
 * (at most 32) warp totals. */
__device__ __forceinline__ int block_scan(int *a, int n, int *tsum) {
    const int tid = threadIdx.x, nth = blockDim.x, lane = tid & 31, wp = tid >> 5;
    int per = (n + nth - 1) / nth, lo = min(n, tid * per), hi = min(n, lo + per);
    int s = 0;
    for (int i = lo; i < hi; i++) s += a[i];
    int v = s;
    for (int o = 1; o < 32; o <<= 1) {
        int t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    if (lane == 31) tsum[wp] = v;
    __syncthreads();
    if (tid == 0) {
        int run = 0;
        for (int i = 0; i < (nth >> 5); i++) { int t = tsum[i]; tsum[i] = run; run += t; }
        tsum[32] = run;
    }
    __syncthreads();
    int run = tsum[wp] + v - s;
    for (int i = lo; i < hi; i++) { int t = a[i]; a[i] = run; run += t; }
    __syncthreads();
    int total = tsum[32];
    __syncthreads();
    return total;
}

/* Calls visit(s, e) for this thread's slots s in [lo, hi) routed to a local expert e, B slots at a
 * time: their ids are all loaded before the first visit. */
template <int B, typename F>
__device__ __forceinline__ void for_local_slots(const MoeDev &m, const MoeRun &r, int lo, int hi, F visit) {
    const int nth = blockDim.x;
    for (int s0 = lo + (int)threadIdx.x; s0 < hi; s0 += B * nth) {
        unsigned e[B];
#pragma unroll
        for (int j = 0; j < B; j++) e[j] = s0 + j * nth < hi ? (unsigned)(r.ids[s0 + j * nth] - m.first_local) : ~0u;
#pragma unroll
        for (int j = 0; j < B; j++)
            if (e[j] < (unsigned)m.n_local) visit(s0 + j * nth, (int)e[j]);
    }
}

/* The work items of local expert e (c positions from off, its first item wof): ceil(c / tn) of
 * near-equal size where r.split (a wgmma tile's width is fixed per launch), else items of tn and
 * one remainder. */
__device__ __forceinline__ void write_items(const MoeRun &r, int e, int off, int c, int wof) {
    if (r.split) {
        const int parts = (c + r.tn - 1) / r.tn, base = parts ? c / parts : 0, rem = c - base * parts;
        for (int t = 0; t < parts; t++) r.work[wof + t] = make_int4(e, off + t * base + min(t, rem), base + (t < rem), 0);
    } else {
        for (int t = 0; t * r.tn < c; t++) r.work[wof + t] = make_int4(e, off + t * r.tn, min(r.tn, c - t * r.tn), 0);
    }
}

/* The fused kernel's dispatch (one CTA; S <= K3_CUDA_FUSED_MAX_SLOTS): count, offsets, work items,
 * sorted positions. smem: 3 * (n_local + 1) + 33 ints. cnt: the fused halves kernel's ncnt
 * hand-off counters (moe_run.cu fused_cnt; else NULL), zeroed, of which [0, T) count each token's
 * local slots. */
static __device__ void moe_dispatch(const MoeDev &m, const MoeRun &r, int *smem, int *cnt = nullptr, int ncnt = 0) {
    const int tid = threadIdx.x, nth = blockDim.x, nl = m.n_local, S = r.T * r.k;
    int *off = smem, *wof = smem + (nl + 1), *cur = smem + 2 * (nl + 1), *tsum = smem + 3 * (nl + 1);
    for (int e = tid; e <= nl; e += nth) off[e] = 0;
    for (int i = tid; i < ncnt; i += nth) cnt[i] = 0;
    __syncthreads();
    for_local_slots<1>(m, r, 0, S, [&](int, int e) { atomicAdd(&off[e], 1); });
    __syncthreads();
    for (int e = tid; e < nl; e += nth) wof[e] = (off[e] + r.tn - 1) / r.tn;
    __syncthreads();
    int P = block_scan(off, nl, tsum);
    int W = block_scan(wof, nl, tsum);
    for (int e = tid; e < nl; e += nth) {
        cur[e] = off[e];
        write_items(r, e, off[e], (e + 1 < nl ? off[e + 1] : P) - off[e], wof[e]);
    }
    __syncthreads();
    for_local_slots<1>(m, r, 0, S, [&](int s, int e) {
        const int p = atomicAdd(&cur[e], 1);
        r.sorted_tok[p] = s / r.k;
        r.sorted_slot[p] = s;
        if (cnt) atomicAdd(cnt + s / r.k, 1);
    });
    for (int p = tid; p < P; p += nth) r.hamax[p] = 0u;
    if (tid == 0) { r.ctl[0] = P; r.ctl[1] = W; r.ctl[2] = 0; r.ctl[3] = 0; }
}

/* The grouped path's dispatch, spread over r.nd blocks (each a contiguous range of slots) in two
 * launches: k_prep's blocks count their range per local expert in shared memory and store the
 * counts (dsp_hist); the last of them to finish (a ticket) turns each expert's counts into
 * per-block bases, scans the totals into offsets and writes the work items; k_scatter's blocks
 * then place their range's slots from their bases. No global atomics but the ticket, and no
 * ordering across blocks (within an expert the positions are in no set order either way: the
 * GEMMs' arithmetic per position does not depend on it). One CTA did all of it before at ~4 ns
 * a slot. H100, NVFP4 K3 layer, prep stage us, one CTA -> this: T = 2048 113-174 -> 44-90,
 * T = 4096 234-286 -> 70-122, T = 8192 475-526 -> 102-166 (lab/NOTES.md v38).
 * Scratch r.dsp (ints): [0] the ticket (zero between runs: set at allocation, reset by the last
 * block), [DSP_OFF + e] expert offsets, [dsp_hist_at + b * n_local + e] block b's counts, then
 * its bases (within each expert, the counts of the blocks before it). */
#define DSP_BLOCKS_MAX 32 /* the scan holds an expert's counts of every block in registers */
#define DSP_SLOTS_MIN 4096 /* slots per block at least (16 per thread): a block's fixed cost is two
                              n_local passes and, in the scan, one count per block and expert */
#define DSP_OFF 64
__host__ __device__ __forceinline__ int dsp_hist_at(const MoeDev &m) { return DSP_OFF + ((m.n_local + 1 + 63) & ~63); }

__device__ __forceinline__ void dsp_range(const MoeRun &r, int b, int &lo, int &hi) {
    const int S = r.T * r.k, per = (S + r.nd - 1) / r.nd;
    lo = min(S, b * per);
    hi = min(S, lo + per);
}

/* The scan of the last counting block. smem: 2 * (n_local + 1) + 33 ints. */
static __device__ void dsp_scan(const MoeDev &m, const MoeRun &r, int *smem) {
    const int tid = threadIdx.x, nth = blockDim.x, nl = m.n_local, nd = r.nd;
    int *off = smem, *wof = smem + (nl + 1), *tsum = smem + 2 * (nl + 1);
    int *hist = r.dsp + dsp_hist_at(m), *goff = r.dsp + DSP_OFF;
    for (int e = tid; e < nl; e += nth) {
        /* all of an expert's counts in flight at once (one after another, behind the stores, the
         * loop would wait an L2 round trip per block) */
        int v[DSP_BLOCKS_MAX];
#pragma unroll
        for (int b = 0; b < DSP_BLOCKS_MAX; b++) /* L2 reads: other blocks wrote these in this launch */
            v[b] = b < nd ? __ldcg(hist + (size_t)b * nl + e) : 0;
        int run = 0;
#pragma unroll
        for (int b = 0; b < DSP_BLOCKS_MAX; b++)
            if (b < nd) {
                __stcg(hist + (size_t)b * nl + e, run);
                run += v[b];
            }
        off[e] = run;
        wof[e] = (run + r.tn - 1) / r.tn;
    }
    __syncthreads();
    const int P = block_scan(off, nl, tsum), W = block_scan(wof, nl, tsum);
    for (int e = tid; e < nl; e += nth) {
        goff[e] = off[e];
        write_items(r, e, off[e], (e + 1 < nl ? off[e + 1] : P) - off[e], wof[e]);
    }
    if (tid == 0) { r.ctl[0] = P; r.ctl[1] = W; r.ctl[2] = 0; r.ctl[3] = 0; r.dsp[0] = 0; }
}

/* Counting block b of k_prep; smem as dsp_scan. */
static __device__ void dsp_count(const MoeDev &m, const MoeRun &r, int b, int *smem) {
    const int tid = threadIdx.x, nth = blockDim.x, nl = m.n_local;
    __shared__ int last;
    int lo, hi;
    dsp_range(r, b, lo, hi);
    for (int e = tid; e < nl; e += nth) smem[e] = 0;
    __syncthreads();
    for_local_slots<8>(m, r, lo, hi, [&](int, int e) { atomicAdd(&smem[e], 1); });
    __syncthreads();
    int *hist = r.dsp + dsp_hist_at(m) + (size_t)b * nl;
    for (int e = tid; e < nl; e += nth) hist[e] = smem[e];
    __threadfence(); /* the counts before the ticket */
    __syncthreads();
    if (tid == 0) last = atomicAdd(r.dsp, 1) == r.nd - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    dsp_scan(m, r, smem);
}

/* Scatter block b (k_scatter): its range's positions from its bases; zeroes their |h| max. smem:
 * n_local ints. */
static __device__ void dsp_scatter(const MoeDev &m, const MoeRun &r, int b, int *cur) {
    const int tid = threadIdx.x, nth = blockDim.x, nl = m.n_local;
    const int *hist = r.dsp + dsp_hist_at(m) + (size_t)b * nl, *goff = r.dsp + DSP_OFF;
    int lo, hi;
    dsp_range(r, b, lo, hi);
    for (int e = tid; e < nl; e += nth) cur[e] = goff[e] + hist[e];
    __syncthreads();
    for_local_slots<8>(m, r, lo, hi, [&](int s, int e) {
        const int p = atomicAdd(&cur[e], 1);
        r.sorted_tok[p] = s / r.k;
        r.sorted_slot[p] = s;
        r.hamax[p] = 0u;
    });
}

/* ---- the two GEMM work items and the small stages ---------------------------------------- */

/* |v| as bits: an unsigned max orders non-negative floats and ranks every NaN above +inf, so a
 * max of these propagates NaN without a test per value. */
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

/* max over the 8 lanes sharing lane & 3 (lane bits 2..4) */
__device__ __forceinline__ unsigned warp_max8(unsigned v) {
    v = max(v, __shfl_xor_sync(0xffffffffu, v, 4));
    v = max(v, __shfl_xor_sync(0xffffffffu, v, 8));
    v = max(v, __shfl_xor_sync(0xffffffffu, v, 16));
    return v;
}

/* The activation of this lane's row pair of 16-row tile mt: r0 = accumulator of row g, r8 = of
 * row g + 8 (up and gate rows when gated, two output rows otherwise). v0 / v1 go to h columns
 * i0 / i1 (i1 = -1: none). */
template <int ACT>
__device__ __forceinline__ void fc1_act(const MoeDev &m, int mt, int g, float r0, float r8, float fa, float fb, float xs,
                                        float al, float be, float li, float &v0, float &v1, int &i0, int &i1) {
    if (m.gated) { /* set at upload from k3_act_is_gated */
        v0 = act_gated<ACT>(r8 * fb * xs, r0 * fa * xs, al, be, li);
        v1 = 0.f;
        i0 = mt * 8 + g;
        i1 = -1;
    } else {
        v0 = act_plain<ACT>(r0 * fa * xs);
        v1 = act_plain<ACT>(r8 * fa * xs);
        i0 = mt * 16 + g;
        i1 = i0 + 8;
    }
}

/* Folds |h| max bits am (abs_bits) into a position's max *slot (MoeRun.hamax: atomicMax on the
 * bits orders them, NaN above all, which hconv propagates). */
__device__ __forceinline__ void hamax_fold(unsigned *slot, unsigned am) { atomicMax(slot, am); }

/* The FC1 output of one position pos (valid when ok) for this lane's row pair of tile mt
 * (fc1_act): writes h and folds |h| into the position's max (NaN if any is NaN). Every
 * lane of the warp must call it (the max is a shuffle). */
template <int ACT>
__device__ __forceinline__ void fc1_store(const MoeDev &m, const MoeRun &r, int pos, bool ok, int mt, int g, float r0,
                                          float r8, float fa, float fb, float xs, float al, float be, float li) {
    float v0, v1;
    int i0, i1;
    fc1_act<ACT>(m, mt, g, r0, r8, fa, fb, xs, al, be, li, v0, v1, i0, i1);
    const unsigned am = warp_max8(ok ? max(abs_bits(v0), abs_bits(v1)) : 0u);
    if (ok) {
        float *hr = r.h + (size_t)pos * m.I;
        hr[i0] = v0;
        if (i1 >= 0) hr[i1] = v1;
        if (g == 0) hamax_fold(r.hamax + pos, am);
    }
}

/* Accumulators of 16-row tiles mt .. mt + MT - 1 over k-chunks [c0, c1) for work item wk =
 * (expert, first position, tokens): FC1 reads the tokens' x rows, FC2 the positions' h rows.
 * MT is 1 or 2. An expert's tile count (m1, m2) is a multiple of 8 (H and I are multiples of
 * 128), so a pair never runs past it; the step guard stays because with it nvcc 13.0 compiles the
 * NT = 1 kernel to 72 registers, with a constant stride to 80 (H200: T = 8 567 vs 584 us).
 * dep_wait: a programmatic dependent launch whose B rows come from the preceding kernel
 * (pdl_wait after the first weight loads). */
template <int FMT, int NT, int FC2, int NP, int MT = 1, int RP = 0>
__device__ __forceinline__ void tile_mma(const MoeDev &m, const MoeRun &r, int4 wk, int mt, int c0, int c1, int lane,
                                         float acc[MT * NT][4], bool dep_wait = false) {
    const int e = wk.x, p0 = wk.y, n = wk.z, SB = FMT == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
    int brow[NT];
#pragma unroll
    for (int f = 0; f < NT; f++) {
        int j = NP == 2 ? 4 * f + (lane >> 3) : 8 * f + (lane >> 2);
        brow[f] = j < n ? (FC2 ? p0 + j : r.sorted_tok[p0 + j]) : -1;
    }
    const int mtiles = FC2 ? m.m2 : m.m1, nk = FC2 ? m.nk2 : m.nk1;
    const size_t tile = (size_t)e * mtiles + mt, step = MT > 1 && mt + 1 < mtiles ? 1 : 0;
    gemm_tile<FMT, NT, NP, MT, RP>((FC2 ? m.w2 : m.w1) + tile * nk * 64, (FC2 ? m.s2 : m.s1) + tile * nk * SB,
                               step * nk * 64, step * nk * SB, nk, c0, c1, FC2 ? r.hq : r.xq, brow,
                               lane, acc, dep_wait);
}

/* FC1 epilogue: the activation, h and the per-position |h| max. */
template <int FMT, int ACT, int NT, int NP>
__device__ __forceinline__ void fc1_epi(const MoeDev &m, const MoeRun &r, int4 wk, int mt, int lane,
                                        float acc[NT][4]) {
    const int e = wk.x, p0 = wk.y, n = wk.z;
    const int g = lane >> 2, q = lane & 3;
    const float fa = m.f1[2 * e], fb = m.f1[2 * e + 1];
    const float al = m.alpha ? m.alpha[e] : 1.f, be = m.beta ? m.beta[e] : 0.f;
    const float li = m.limit ? m.limit[e] : INFINITY;
#pragma unroll
    for (int f = 0; f < NT; f++)
#pragma unroll
        for (int c = 0; c < 3 - NP; c++) {
            int j = NP == 2 ? 4 * f + q : 8 * f + 2 * q + c;
            bool ok = j < n;
            int tok = ok ? r.sorted_tok[p0 + j] : 0;
            float xs = ok ? r.xs[tok] : 0.f;
            float r0 = NP == 2 ? acc[f][0] + acc[f][1] : acc[f][c], r8 = NP == 2 ? acc[f][2] + acc[f][3] : acc[f][2 + c];
            fc1_store<ACT>(m, r, p0 + j, ok, mt, g, r0, r8, fa, fb, xs, al, be, li);
        }
}

/* FC2 epilogue: part[slot][row] = unweighted expert output. */
template <int NT, int NP>
__device__ __forceinline__ void fc2_epi(const MoeDev &m, const MoeRun &r, int4 wk, int mt, int lane,
                                        float acc[NT][4]) {
    const int e = wk.x, p0 = wk.y, n = wk.z;
    const int g = lane >> 2, q = lane & 3;
    const float fw = m.f2[e];
#pragma unroll
    for (int f = 0; f < NT; f++)
#pragma unroll
        for (int c = 0; c < 3 - NP; c++) {
            int j = NP == 2 ? 4 * f + q : 8 * f + 2 * q + c;
            if (j < n) {
                float s = fw * r.hs[p0 + j];
                float *o = r.part + (size_t)r.sorted_slot[p0 + j] * m.H + mt * 16 + g;
                o[0] = (NP == 2 ? acc[f][0] + acc[f][1] : acc[f][c]) * s;
                o[8] = (NP == 2 ? acc[f][2] + acc[f][3] : acc[f][2 + c]) * s;
            }
        }
}

/* The epilogue of the wgmma tiles (moe_prefill.cu, moe_prefill_ws.cu): one 16-row tile mt
 * (this warp's) x TN tokens of work item (e, p0, n):
 * accumulator i holds row g + 8 ((i >> 1) & 1), item token 8 (i >> 2) + 2 q + (i & 1), so this
 * lane owns TN / 4 columns, u = 2 (i >> 2) + (i & 1). FC1 applies the activation and writes h
 * and the per-position |h| max; FC2 writes unweighted rows per (token, slot).
 * The columns' values (FC1: sorted_tok then the token's x row scale; FC2: the position's h row
 * scale and slot) are loaded CB columns at a time before any store: issued one column at a time
 * they waited behind the previous column's stores, which nvcc may not move them across (the
 * pointers may alias), and ncu put 32% of the 80-token FC1 kernel's stalls on those loads. */
template <int FMT, int ACT, int TN, int FC2>
__device__ __forceinline__ void wg_epilogue(const MoeDev &m, const MoeRun &r, int e, int p0, int n, int mt, int g,
                                            int q, const float acc[TN / 2]) {
    constexpr int NC = TN / 4, CB = NC < 8 ? NC : 8;
    const float fw = FC2 ? m.f2[e] : 0.f;
    const float fa = FC2 ? 0.f : m.f1[2 * e], fb = FC2 ? 0.f : m.f1[2 * e + 1];
    const float al = !FC2 && m.alpha ? m.alpha[e] : 1.f, be = !FC2 && m.beta ? m.beta[e] : 0.f;
    const float li = !FC2 && m.limit ? m.limit[e] : INFINITY;
#pragma unroll
    for (int u0 = 0; u0 < NC; u0 += CB) {
        int ix[CB]; /* FC1: token, FC2: slot; -1 past the item */
        float s[CB];
#pragma unroll
        for (int v = 0; v < CB; v++) {
            const int u = u0 + v, j = 8 * (u >> 1) + 2 * q + (u & 1);
            const bool ok = u < NC && j < n;
            ix[v] = ok ? (FC2 ? r.sorted_slot[p0 + j] : r.sorted_tok[p0 + j]) : -1;
            if (FC2) s[v] = ok ? fw * r.hs[p0 + j] : 0.f;
        }
        if (!FC2)
#pragma unroll
            for (int v = 0; v < CB; v++) s[v] = ix[v] >= 0 ? r.xs[ix[v]] : 0.f;
#pragma unroll
        for (int v = 0; v < CB; v++) {
            const int u = u0 + v, i = 4 * (u >> 1) + (u & 1);
            if (u < NC) {
                if (FC2) {
                    if (ix[v] >= 0) {
                        float *o = r.part + (size_t)ix[v] * m.H + mt * 16 + g;
                        o[0] = acc[i] * s[v];
                        o[8] = acc[i + 2] * s[v];
                    }
                } else {
                    fc1_store<ACT>(m, r, p0 + 8 * (u >> 1) + 2 * q + (u & 1), ix[v] >= 0, mt, g, acc[i], acc[i + 2], fa,
                                   fb, s[v], al, be, li);
                }
            }
        }
    }
}

/* h row of position p into the FC2 B layout. */
__device__ __forceinline__ void hconv_row(const MoeDev &m, const MoeRun &r, int p, int tid, int nth) {
    quant_row(r.h + (size_t)p * m.I, m.I, __uint_as_float(r.hamax[p]), r.mode, m.g2,
              (uint32_t *)(r.hq + (size_t)p * m.nk2 * 32), r.hs + p, tid, nth, r.plain, r.np == 2);
}

/* hconv_row of a bf16 h row (r.hb16: the grouped k_wgp path; the fused kernel keeps fp32 h and
 * calls hconv_row). */
__device__ __forceinline__ void hconv_row_b16(const MoeDev &m, const MoeRun &r, int p, int tid, int nth) {
    quant_row_b16((const uint32_t *)r.h + (size_t)p * m.I / 2, m.I, __uint_as_float(r.hamax[p]),
                  (uint32_t *)(r.hq + (size_t)p * m.nk2 * 32), r.hs + p, tid, nth, r.plain, r.np == 2);
}

/* y[t][c] = sum over local slots j (in slot order) of w[t,j] * part[t*k+j][c]. */
__device__ __forceinline__ void finalize_elem(const MoeDev &m, const MoeRun &r, int t, int c) {
    float acc = 0.f;
    for (int j = 0; j < r.k; j++) {
        int s = t * r.k + j;
        unsigned e = (unsigned)(r.ids[s] - m.first_local);
        if (e < (unsigned)m.n_local) acc += r.rw[s] * r.part[(size_t)s * m.H + c];
    }
    r.y[(size_t)t * m.H + c] = acc;
}

#endif
