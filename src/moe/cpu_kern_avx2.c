/* AVX2 + FMA row kernels (Haswell/Zen and later), compiled with function-level target
 * attributes and chosen at run time.
 *
 * 4-bit rows, 64 elements = 32 bytes per step (decode64): the low and the high nibbles of the
 * 32 bytes (even and odd elements) each go through one vpshufb against a 16-entry table of
 * 2 x E2M1 as signed bytes (the sign bit is part of the index, so no separate sign work), then
 * vpmovsxbd + vcvtdq2ps turn each 8 of them into floats: 8 vectors of 8 weights in the
 * K3_FP4_PAIRS16 order (per 16-element block the even elements, then the odd ones) for ~27
 * vector uops, where the 16-at-a-time decode below (vpermps on the 3 magnitude bits, sign
 * moved to bit 31 and XORed in) spends ~40. The doubled values are exact small integers; each
 * sum is halved once at the end (exact). Elements after the last whole 64 take decode16.
 * One NVFP4 block is one 16-element group, so its scale is a broadcast; MXFP4 blocks span two.
 * Per token: p = wa*xa + wb*xb, acc += p*s. */
#include "moe/cpu_kern.h"
#include "formats/fp.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define TAVX2 __attribute__((target("avx2,fma")))

TAVX2 static inline void decode16(const uint8_t *q, __m256 mag, __m256i sign, __m256 *wa,
                                  __m256 *wb) {
    __m256i dw = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
    __m256i sa = _mm256_and_si256(_mm256_slli_epi32(dw, 28), sign);
    __m256i sb = _mm256_and_si256(_mm256_slli_epi32(dw, 24), sign);
    __m256 ma = _mm256_permutevar8x32_ps(mag, dw);
    __m256 mb = _mm256_permutevar8x32_ps(mag, _mm256_srli_epi32(dw, 4));
    *wa = _mm256_xor_ps(ma, _mm256_castsi256_ps(sa));
    *wb = _mm256_xor_ps(mb, _mm256_castsi256_ps(sb));
}

/* 2 x E2M1 of nibble code c (sign in bit 3) as a signed byte, twice (one per 128-bit lane). */
TAVX2 static inline __m256i e2m1x2_table(void) {
    return _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                            0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

/* The 64 weights of the 32 bytes at q, doubled: w[2g] = the even elements of 16-block g,
 * w[2g + 1] its odd ones. Each vpmovsxbd needs its 8 bytes at the bottom of a register: one
 * extract and one unpack per 16 bytes bring them there. (Storing the two tables' outputs and
 * reading the 8-byte groups back was 10-20% slower: the narrow loads from a wide store stall
 * on store forwarding.) */
TAVX2 static inline void decode64(const uint8_t *q, __m256i tab, __m256 w[8]) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    __m256i v = _mm256_loadu_si256((const __m256i *)q);
    __m256i ev = _mm256_shuffle_epi8(tab, _mm256_and_si256(v, lo4));
    __m256i od = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4));
    __m128i e[4], o[4];
    e[0] = _mm256_castsi256_si128(ev);
    e[2] = _mm256_extracti128_si256(ev, 1);
    e[1] = _mm_unpackhi_epi64(e[0], e[0]);
    e[3] = _mm_unpackhi_epi64(e[2], e[2]);
    o[0] = _mm256_castsi256_si128(od);
    o[2] = _mm256_extracti128_si256(od, 1);
    o[1] = _mm_unpackhi_epi64(o[0], o[0]);
    o[3] = _mm_unpackhi_epi64(o[2], o[2]);
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        w[2 * g] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e[g]));
        w[2 * g + 1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(o[g]));
    }
}

TAVX2 static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

TAVX2 static inline void acc64(__m256 p, __m256d *lo, __m256d *hi) {
    *lo = _mm256_add_pd(*lo, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
    *hi = _mm256_add_pd(*hi, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
}

TAVX2 static inline double hsum64(__m256d lo, __m256d hi) {
    __m256d v = _mm256_add_pd(lo, hi);
    __m128d h2 = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h2, _mm_unpackhi_pd(h2, h2)));
}

/* One sum of pair sums p times the block scale s: float (acc) or, with f64, float64 (lo, hi)
 * of the exact float product. */
TAVX2 static inline __attribute__((always_inline)) void
acc_step(const int f64, __m256 p, __m256 s, __m256 *acc, __m256d *lo, __m256d *hi) {
    if (f64)
        acc64(_mm256_mul_ps(p, s), lo, hi);
    else
        *acc = _mm256_fmadd_ps(p, s, *acc);
}

/* A result from the sums of decode64's doubled weights (acc2, lo2, hi2; halved, exact) and of
 * decode16's (acc, lo, hi). */
TAVX2 static inline __attribute__((always_inline)) void
acc_out(const int f64, __m256 acc2, __m256d lo2, __m256d hi2, __m256 acc, __m256d lo, __m256d hi,
        float *out, double *out64) {
    if (f64)
        *out64 = 0.5 * hsum64(lo2, hi2) + hsum64(lo, hi);
    else
        *out = 0.5f * hsum(acc2) + hsum(acc);
}

/* Up to K3_CPU_NT tokens against one row; nvfp4 and f64 are compile-time constants in each
 * wrapper: float sums (k3_dot_fn) or float64 sums of the exact pair sums (k3_dot64_fn, as
 * fp4_rows_impl's f64). */
TAVX2 static inline __attribute__((always_inline)) void
fp4_dot(const uint8_t *q, const uint8_t *sc, const int nvfp4, const int f64, int64_t K,
        const float *const *xs, int nt, float *out, double *out64) {
    const __m256 mag = _mm256_loadu_ps(k3_e2m1_lut);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u), tab = e2m1x2_table();
    const float *stab = nvfp4 ? k3_e4m3_lut : k3_e8m0_lut;
    const int shift = nvfp4 ? 4 : 5; /* element index -> block index */
    const int64_t K64 = K & ~(int64_t)63;
    __m256 acc[K3_CPU_NT], acc2[K3_CPU_NT]; /* acc2, lo2, hi2: doubled weights (decode64) */
    __m256d lo[K3_CPU_NT], hi[K3_CPU_NT], lo2[K3_CPU_NT], hi2[K3_CPU_NT];
    for (int j = 0; j < K3_CPU_NT; j++) {
        acc[j] = acc2[j] = _mm256_setzero_ps();
        lo[j] = hi[j] = lo2[j] = hi2[j] = _mm256_setzero_pd();
    }
    int64_t c = 0;
    for (; c < K64; c += 64) {
        __m256 w[8];
        decode64(q + c / 2, tab, w);
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m256 s = _mm256_broadcast_ss(&stab[sc[(c + 16 * g) >> shift]]);
#pragma GCC unroll 4
            for (int j = 0; j < K3_CPU_NT; j++) {
                if (j >= nt) break;
                __m256 p = _mm256_mul_ps(w[2 * g], _mm256_loadu_ps(xs[j] + c + 16 * g));
                p = _mm256_fmadd_ps(w[2 * g + 1], _mm256_loadu_ps(xs[j] + c + 16 * g + 8), p);
                acc_step(f64, p, s, &acc2[j], &lo2[j], &hi2[j]);
            }
        }
    }
    for (; c < K; c += 16) {
        __m256 wa, wb;
        decode16(q + c / 2, mag, sign, &wa, &wb);
        __m256 s = _mm256_broadcast_ss(&stab[sc[c >> shift]]);
#pragma GCC unroll 4
        for (int j = 0; j < K3_CPU_NT; j++) {
            if (j >= nt) break;
            __m256 p = _mm256_mul_ps(wa, _mm256_loadu_ps(xs[j] + c));
            p = _mm256_fmadd_ps(wb, _mm256_loadu_ps(xs[j] + c + 8), p);
            acc_step(f64, p, s, &acc[j], &lo[j], &hi[j]);
        }
    }
    for (int j = 0; j < nt; j++)
        acc_out(f64, acc2[j], lo2[j], hi2[j], acc[j], lo[j], hi[j], f64 ? NULL : &out[j], f64 ? &out64[j] : NULL);
}

K3_FP4_DOT_FNS(TAVX2, fp4_dot)

/* T = 1 over nr rows (nr, nvfp4 and f64 compile-time in each instance): each 64-element step
 * decodes a row with decode64 and reads the activations from L1 for every row; every row
 * stream is prefetched once per 64-byte line, a whole call ahead (next), as in the AVX-512
 * kernel. f64 (W4A4 / W4A8, k3_rows64_fn): each lane's pair sum, exact in float with quantized
 * activations (two products), times the block scale (exact) goes into float64
 * sums; decode64's doubled pairs into their own sums, halved at the end. */
#define PF_BYTES 6144
TAVX2 static inline __attribute__((always_inline)) void
fp4_rows_impl(const uint8_t *const *qs, const uint8_t *const *scs, const int nr, const int nvfp4,
              const int f64, int64_t K, const float *x, float *out, double *out64,
              const uint8_t *const *nq, const uint8_t *const *ns) {
    const __m256 mag = _mm256_loadu_ps(k3_e2m1_lut);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u), tab = e2m1x2_table();
    const float *stab = nvfp4 ? k3_e4m3_lut : k3_e8m0_lut;
    const int shift = nvfp4 ? 4 : 5;
    const uint8_t *q[K3_CPU_NR], *s[K3_CPU_NR], *pq[K3_CPU_NR], *ps[K3_CPU_NR];
    __m256 acc[K3_CPU_NR], acc2[K3_CPU_NR];
    __m256d lo[K3_CPU_NR], hi[K3_CPU_NR], lo2[K3_CPU_NR], hi2[K3_CPU_NR];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        q[r] = qs[r];
        s[r] = scs[r];
        pq[r] = nq && nq[r] ? nq[r] : qs[r] + PF_BYTES;
        ps[r] = ns && ns[r] ? ns[r] : scs[r] + PF_BYTES / 8;
        acc[r] = acc2[r] = _mm256_setzero_ps();
        lo[r] = hi[r] = lo2[r] = hi2[r] = _mm256_setzero_pd();
    }
    const int64_t K64 = K & ~(int64_t)63;
    int64_t c = 0;
    for (; c < K64; c += 64) {
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            _mm_prefetch((const char *)(pq[r] + c / 2), _MM_HINT_T0);
            if ((c & 511) == 0) _mm_prefetch((const char *)(ps[r] + (c >> shift)), _MM_HINT_T0);
            __m256 w[8];
            decode64(q[r] + c / 2, tab, w);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m256 p = _mm256_mul_ps(w[2 * g], _mm256_loadu_ps(x + c + 16 * g));
                p = _mm256_fmadd_ps(w[2 * g + 1], _mm256_loadu_ps(x + c + 16 * g + 8), p);
                __m256 sg = _mm256_broadcast_ss(&stab[s[r][(c + 16 * g) >> shift]]);
                acc_step(f64, p, sg, &acc2[r], &lo2[r], &hi2[r]);
            }
        }
    }
    for (; c < K; c += 16) {
        __m256 xa = _mm256_loadu_ps(x + c), xb = _mm256_loadu_ps(x + c + 8);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m256 wa, wb;
            decode16(q[r] + c / 2, mag, sign, &wa, &wb);
            __m256 p = _mm256_mul_ps(wa, xa);
            p = _mm256_fmadd_ps(wb, xb, p);
            __m256 sg = _mm256_broadcast_ss(&stab[s[r][c >> shift]]);
            acc_step(f64, p, sg, &acc[r], &lo[r], &hi[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
        acc_out(f64, acc2[r], lo2[r], hi2[r], acc[r], lo[r], hi[r], f64 ? NULL : &out[r], f64 ? &out64[r] : NULL);
}

/* k3_rows_fn (f64 = 0, float out) or k3_rows64_fn (f64 = 1, double out). */
#define ROWS_FN(name, nv, f64, otype)                                                        \
    TAVX2 static void name(const uint8_t *const *qs, const uint8_t *const *scs, int nr,      \
                           int64_t K, const float *x, otype *out, const uint8_t *const *nq,  \
                           const uint8_t *const *ns) {                                       \
        float *of = f64 ? NULL : (float *)(void *)out;                                       \
        double *od = f64 ? (double *)(void *)out : NULL;                                     \
        switch (nr) {                                                                        \
        case 4: fp4_rows_impl(qs, scs, 4, nv, f64, K, x, of, od, nq, ns); break;             \
        case 3: fp4_rows_impl(qs, scs, 3, nv, f64, K, x, of, od, nq, ns); break;             \
        case 2: fp4_rows_impl(qs, scs, 2, nv, f64, K, x, of, od, nq, ns); break;             \
        default: fp4_rows_impl(qs, scs, 1, nv, f64, K, x, of, od, nq, ns); break;            \
        }                                                                                    \
    }
ROWS_FN(nvfp4_rows, 1, 0, float)
ROWS_FN(mxfp4_rows, 0, 0, float)
ROWS_FN(nvfp4_rows64, 1, 1, double)
ROWS_FN(mxfp4_rows64, 0, 1, double)

TAVX2 static void bf16_dot(const uint8_t *row, const uint8_t *sc, int64_t K,
                           const float *const *xs, int nt, float *out) {
    (void)sc;
    __m256 acc[K3_CPU_NT];
    for (int j = 0; j < K3_CPU_NT; j++) acc[j] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= K; c += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * c));
        __m256 wv = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#pragma GCC unroll 4
        for (int j = 0; j < K3_CPU_NT; j++)
            if (j < nt) acc[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xs[j] + c), acc[j]);
    }
    for (int j = 0; j < nt; j++) {
        float a = hsum(acc[j]);
        for (int64_t t = c; t < K; t++) {
            uint16_t b;
            memcpy(&b, row + 2 * t, 2);
            a += k3_bf16_to_f32(b) * xs[j][t];
        }
        out[j] = a;
    }
}

TAVX2 static void f32_dot(const uint8_t *row, const uint8_t *sc, int64_t K,
                          const float *const *xs, int nt, float *out) {
    (void)sc;
    const float *wr = (const float *)(const void *)row;
    __m256 acc[K3_CPU_NT];
    for (int j = 0; j < K3_CPU_NT; j++) acc[j] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= K; c += 8) {
        __m256 wv = _mm256_loadu_ps(wr + c);
#pragma GCC unroll 4
        for (int j = 0; j < K3_CPU_NT; j++)
            if (j < nt) acc[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xs[j] + c), acc[j]);
    }
    for (int j = 0; j < nt; j++) {
        float a = hsum(acc[j]);
        for (int64_t t = c; t < K; t++) a += wr[t] * xs[j][t];
        out[j] = a;
    }
}

const k3_cpu_kern k3_cpu_kern_avx2 = {
    .name = "avx2", .fp4_layout = K3_FP4_PAIRS16, .nvfp4 = nvfp4_dot, .mxfp4 = mxfp4_dot,
    .bf16 = bf16_dot, .f32 = f32_dot, .nvfp4_64 = nvfp4_dot64, .mxfp4_64 = mxfp4_dot64,
    .nvfp4_rows = nvfp4_rows, .mxfp4_rows = mxfp4_rows, .nvfp4_rows64 = nvfp4_rows64,
    .mxfp4_rows64 = mxfp4_rows64,
};
#else
const k3_cpu_kern k3_cpu_kern_avx2 = {.name = "avx2"};
#endif
