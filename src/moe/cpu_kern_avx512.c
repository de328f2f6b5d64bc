/* AVX-512 (F/BW/VL) row kernels. Compiled with function-level target attributes (the
 * Makefile has no -march) and only called after __builtin_cpu_supports says yes.
 *
 * 4-bit rows, 128 elements = 64 bytes per step (layout K3_FP4_T128, cpu_kern.h): one
 * vector load, then for k = 0..7 a shift by 4k and vpermps (which reads only the low 4
 * bits of each index) against the 16-entry E2M1 table give w_k, lane j = element 8j + k.
 * All 8 elements of lane j are in one block (16 elements = 2 lanes for NVFP4, 4 lanes for
 * MXFP4), so per token t = sum_k w_k * x_k, then acc += t * s with s the vector of the
 * lanes' block scales: 7 shifts, 8 permutes, 9 FMA-class ops and 3 for the scales per 128
 * weights, against 32 for one 16-weight block at a time.
 * The scale vector is built without a table when every scale of the row is a positive
 * normal (E4M3 codes 0x08..0x7E, E8M0 1..254: what real checkpoints hold): vpshufb puts
 * each lane's scale byte in its dword and a shift (and for E4M3 an add to the exponent)
 * makes the exact float. Rows with any other code (zero, subnormal, negative, NaN) take
 * the same loop with the vector read from the 256-entry tables, so every code stays exact.
 * Blocks after the last whole 128 (K3_FP4_NIB16): the block's 8 bytes broadcast to every
 * qword, vpsrlvd, vpermps; one block per vector, its scale an embedded broadcast.
 * At T = 1 (fp4_rows) several rows share each activation vector, one accumulator per row,
 * and each row stream is prefetched once per 64-byte line, a whole call ahead (next). */
#include "moe/cpu_kern.h"
#include "formats/fp.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

/* Software prefetch distance in packed bytes where no next call is known: a single core's
 * hardware prefetchers alone do not keep enough misses in flight to stream at DRAM speed;
 * measured on a Sapphire Rapids VM, 1-2 KB reached 6-7.5 GB/s, 6-8 KB 10.5 GB/s. */
#define PF_BYTES 6144

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define INLINE static inline __attribute__((always_inline))

/* ---- K3_FP4_NIB16: one block per vector (the tail after the last whole 128) --------- */

T512 INLINE __m512i nib_shifts(void) {
    return _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0);
}

/* The 16 weights of the 8 bytes at q, in K3_FP4_NIB16 lane order, unscaled. */
T512 INLINE __m512 dec16(const uint8_t *q, __m512 tbl) {
    int64_t v;
    memcpy(&v, q, 8);
    return _mm512_permutexvar_ps(_mm512_srlv_epi32(_mm512_set1_epi64(v), nib_shifts()), tbl);
}

T512 INLINE __m512 bscale(const float *stab, const uint8_t *sc, int64_t b) {
    return _mm512_set1_ps(stab[sc[b]]);
}

/* ---- K3_FP4_T128: 128 elements per step ---------------------------------------------- */

/* w[k] lane j = element 8j + k of the 128 at q, unscaled. */
T512 INLINE void dec128(const uint8_t *q, __m512 tbl, __m512 *w) {
    __m512i v = _mm512_loadu_si512((const void *)q);
    w[0] = _mm512_permutexvar_ps(v, tbl);
#pragma GCC unroll 8
    for (int k = 1; k < 8; k++) w[k] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4 * k), tbl);
}

/* sum_k w[k] * x[k]: the unscaled partial sums of the lanes. */
T512 INLINE __m512 dot128(const __m512 *w, const __m512 *x) {
    __m512 t = _mm512_mul_ps(w[0], x[0]);
#pragma GCC unroll 8
    for (int k = 1; k < 8; k++) t = _mm512_fmadd_ps(w[k], x[k], t);
    return t;
}

/* Whether every scale of a row is a positive normal (see the file comment). */
T512 static int scales_plain(const uint8_t *sc, int64_t n, int nvfp4) {
    const __m512i lo = _mm512_set1_epi8(nvfp4 ? 0x08 : 0x01);
    const __m512i hi = _mm512_set1_epi8(nvfp4 ? 0x7E : (char)0xFE);
    __mmask64 bad = 0;
    for (int64_t i = 0; i < n; i += 64) {
        __mmask64 m = n - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (n - i)) - 1);
        __m512i v = _mm512_maskz_loadu_epi8(m, sc + i);
        bad |= m & (_mm512_cmplt_epu8_mask(v, lo) | _mm512_cmpgt_epu8_mask(v, hi));
    }
    return bad == 0;
}

/* The lanes' block scales for the 128 elements starting at block index b0 (lane j is in
 * block b0 + j/2 for NVFP4, b0 + j/4 for MXFP4). */
T512 INLINE __m512 scale128(const uint8_t *sc, int64_t b0, const int nvfp4, const int plain) {
    if (plain) {
        __m512i v;
        if (nvfp4) {
            int64_t b8;
            memcpy(&b8, sc + b0, 8);
            /* dword p of 128-bit lane L takes byte 2L + p/2 (the 8 bytes sit in every lane) */
            const __m512i ctl = _mm512_set_epi32(
                (int)0x80808007, (int)0x80808007, (int)0x80808006, (int)0x80808006,
                (int)0x80808005, (int)0x80808005, (int)0x80808004, (int)0x80808004,
                (int)0x80808003, (int)0x80808003, (int)0x80808002, (int)0x80808002,
                (int)0x80808001, (int)0x80808001, (int)0x80808000, (int)0x80808000);
            v = _mm512_shuffle_epi8(_mm512_set1_epi64(b8), ctl);
            /* E4M3 0eeeemmm, e >= 1: the float with exponent e + 120, mantissa mmm */
            v = _mm512_add_epi32(_mm512_slli_epi32(v, 20), _mm512_set1_epi32(120 << 23));
        } else {
            int32_t b4;
            memcpy(&b4, sc + b0, 4);
            const __m512i ctl = _mm512_set_epi32(
                (int)0x80808003, (int)0x80808003, (int)0x80808003, (int)0x80808003,
                (int)0x80808002, (int)0x80808002, (int)0x80808002, (int)0x80808002,
                (int)0x80808001, (int)0x80808001, (int)0x80808001, (int)0x80808001,
                (int)0x80808000, (int)0x80808000, (int)0x80808000, (int)0x80808000);
            v = _mm512_shuffle_epi8(_mm512_set1_epi32(b4), ctl);
            v = _mm512_slli_epi32(v, 23); /* E8M0 e in 1..254: the float 2^(e-127) */
        }
        return _mm512_castsi512_ps(v);
    }
    float f[16];
    for (int j = 0; j < 16; j++)
        f[j] = nvfp4 ? k3_e4m3_lut[sc[b0 + j / 2]] : k3_e8m0_lut[sc[b0 + j / 4]];
    return _mm512_loadu_ps(f);
}

/* ---- float64 sums (k3_dot64_fn, k3_rows64_fn): W4A4 and W4A8 FC1 ------------------------ */

/* With quantized activations a lane's partial sums are exact in float, so only the float64
 * sums across lanes and steps round (cpu_kern.h says why that matters):
 *  - W4A4 (NVFP4 x NVFP4): every product in a lane of a 128-element step is s_x c_w c_x with
 *    E2M1 codes c and the lane's one activation block scale s_x (its 8 elements lie in one
 *    16-block), so the lane's sum of 8 is s_x times a multiple of 1/4 below 288 (11 bits), s_x
 *    has <= 4 significant bits: exact, and so is its product with the weight block scale;
 *  - W4A8 (MXFP4 x MXFP8): a product is 2^e 2^-10 times an integer below 6 x 448 x 2^10 <
 *    2^21.4 (E2M1 x E4M3 with one E8M0 scale per 32 on each side), so sums of 4 stay below
 *    2^24 and are exact, sums of 8 could round: the lane is summed in two halves.
 * Either way 4 to 8 times fewer float64 operations than adding every product on its own. */
T512 INLINE void acc64(__m512 ts, __m512d *lo, __m512d *hi) {
    *lo = _mm512_add_pd(*lo, _mm512_cvtps_pd(_mm512_castps512_ps256(ts)));
    __m256 up = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(ts), 1));
    *hi = _mm512_add_pd(*hi, _mm512_cvtps_pd(up));
}

/* One 128-element step of one row against one token's 8 activation vectors into float64 sums:
 * the lane sums (whole for NVFP4, two halves for MXFP4) times the lanes' block scales s. */
T512 INLINE void step64(const __m512 *w, const __m512 *x, __m512 s, const int nvfp4, __m512d *lo,
                        __m512d *hi) {
    if (nvfp4) {
        acc64(_mm512_mul_ps(dot128(w, x), s), lo, hi);
        return;
    }
    __m512 t0 = _mm512_mul_ps(w[0], x[0]), t1 = _mm512_mul_ps(w[4], x[4]);
#pragma GCC unroll 3
    for (int k = 1; k < 4; k++) {
        t0 = _mm512_fmadd_ps(w[k], x[k], t0);
        t1 = _mm512_fmadd_ps(w[k + 4], x[k + 4], t1);
    }
    acc64(_mm512_mul_ps(t0, s), lo, hi);
    acc64(_mm512_mul_ps(t1, s), lo, hi);
}

/* Up to K3_CPU_NT tokens against one row; nvfp4 and f64 are compile-time constants in each
 * wrapper: float sums (k3_dot_fn) or float64 sums of exact lane sums (k3_dot64_fn, step64).
 * Rows of both formats are whole blocks (validated by the caller). */
T512 INLINE void fp4_dot_impl(const uint8_t *q, const uint8_t *sc, const int nvfp4, const int f64,
                              int64_t K, const float *const *xs, int nt, float *out,
                              double *out64) {
    const __m512 tbl = _mm512_loadu_ps(k3_e2m1_lut);
    const float *stab = nvfp4 ? k3_e4m3_lut : k3_e8m0_lut;
    const int blk = nvfp4 ? 16 : 32;
    const int plain = scales_plain(sc, K / blk, nvfp4);
    const int64_t K128 = K & ~(int64_t)127;
    __m512 acc[K3_CPU_NT];
    __m512d lo[K3_CPU_NT], hi[K3_CPU_NT];
    for (int j = 0; j < K3_CPU_NT; j++) {
        acc[j] = _mm512_setzero_ps();
        lo[j] = hi[j] = _mm512_setzero_pd();
    }
    int64_t c = 0;
    for (; c < K128; c += 128) {
        _mm_prefetch((const char *)(q + c / 2 + PF_BYTES), _MM_HINT_T0);
        __m512 w[8];
        dec128(q + c / 2, tbl, w);
        __m512 s = plain ? scale128(sc, c / blk, nvfp4, 1) : scale128(sc, c / blk, nvfp4, 0);
#pragma GCC unroll 4
        for (int j = 0; j < K3_CPU_NT; j++) {
            if (j >= nt) break;
            __m512 x[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) x[k] = _mm512_loadu_ps(xs[j] + c + 16 * k);
            if (f64)
                step64(w, x, s, nvfp4, &lo[j], &hi[j]);
            else
                acc[j] = _mm512_fmadd_ps(dot128(w, x), s, acc[j]);
        }
    }
    for (; c + blk <= K; c += blk) {
        __m512 s = bscale(stab, sc, c / blk);
        __m512 w0 = dec16(q + c / 2, tbl);
        __m512 w1 = nvfp4 ? w0 : dec16(q + c / 2 + 8, tbl);
#pragma GCC unroll 4
        for (int j = 0; j < K3_CPU_NT; j++) {
            if (j >= nt) break;
            if (f64) { /* single products, exact */
                __m512 x0 = _mm512_loadu_ps(xs[j] + c);
                acc64(_mm512_mul_ps(_mm512_mul_ps(w0, s), x0), &lo[j], &hi[j]);
                if (!nvfp4) {
                    __m512 x1 = _mm512_loadu_ps(xs[j] + c + 16);
                    acc64(_mm512_mul_ps(_mm512_mul_ps(w1, s), x1), &lo[j], &hi[j]);
                }
                continue;
            }
            __m512 p = _mm512_mul_ps(w0, _mm512_loadu_ps(xs[j] + c));
            if (!nvfp4) p = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xs[j] + c + 16), p);
            acc[j] = _mm512_fmadd_ps(p, s, acc[j]);
        }
    }
    for (int j = 0; j < nt; j++) {
        if (f64)
            out64[j] = _mm512_reduce_add_pd(_mm512_add_pd(lo[j], hi[j]));
        else
            out[j] = _mm512_reduce_add_ps(acc[j]);
    }
}

K3_FP4_DOT_FNS(T512, fp4_dot_impl)

/* T = 1 over nr rows (nr, nvfp4, plain and f64 are compile-time constants in each instance):
 * the 8 activation vectors of a step loaded once for all rows, one 64-byte line per row,
 * one accumulator per row (a row's 8 FMAs per step chain, the rows interleave). f64 (W4A4 /
 * W4A8): the lane sums go into float64 sums instead (step64). */
T512 INLINE void fp4_rows_impl(const uint8_t *const *qs, const uint8_t *const *scs, const int nr,
                               const int nvfp4, const int plain, const int f64, int64_t K,
                               const float *x, float *out, double *out64,
                               const uint8_t *const *nq, const uint8_t *const *ns) {
    const __m512 tbl = _mm512_loadu_ps(k3_e2m1_lut);
    const float *stab = nvfp4 ? k3_e4m3_lut : k3_e8m0_lut;
    const int blk = nvfp4 ? 16 : 32;
    const uint8_t *q[K3_CPU_NR], *s[K3_CPU_NR], *pq[K3_CPU_NR], *ps[K3_CPU_NR];
    __m512 acc[K3_CPU_NR];
    __m512d lo[K3_CPU_NR], hi[K3_CPU_NR];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        q[r] = qs[r];
        s[r] = scs[r];
        /* without a next call: a fixed distance ahead in the current row's matrix */
        pq[r] = nq && nq[r] ? nq[r] : qs[r] + PF_BYTES;
        ps[r] = ns && ns[r] ? ns[r] : scs[r] + PF_BYTES / 8;
        acc[r] = _mm512_setzero_ps();
        lo[r] = hi[r] = _mm512_setzero_pd();
    }
    const int64_t K128 = K & ~(int64_t)127;
    int64_t c = 0;
    for (; c < K128; c += 128) {
        __m512 xv[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) xv[k] = _mm512_loadu_ps(x + c + 16 * k);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            _mm_prefetch((const char *)(pq[r] + c / 2), _MM_HINT_T0);
            if ((c & 511) == 0) _mm_prefetch((const char *)(ps[r] + c / blk), _MM_HINT_T0);
            __m512 w[8];
            dec128(q[r] + c / 2, tbl, w);
            __m512 sv = scale128(s[r], c / blk, nvfp4, plain);
            if (f64)
                step64(w, xv, sv, nvfp4, &lo[r], &hi[r]);
            else
                acc[r] = _mm512_fmadd_ps(dot128(w, xv), sv, acc[r]);
        }
    }
    for (; c + blk <= K; c += blk) {
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m512 sv = bscale(stab, s[r], c / blk);
            if (f64) { /* single products, exact */
                for (int h = 0; h < blk; h += 16) {
                    __m512 ws = _mm512_mul_ps(dec16(q[r] + (c + h) / 2, tbl), sv);
                    acc64(_mm512_mul_ps(ws, _mm512_loadu_ps(x + c + h)), &lo[r], &hi[r]);
                }
                continue;
            }
            __m512 p = _mm512_mul_ps(dec16(q[r] + c / 2, tbl), _mm512_loadu_ps(x + c));
            if (!nvfp4) p = _mm512_fmadd_ps(dec16(q[r] + c / 2 + 8, tbl), _mm512_loadu_ps(x + c + 16), p);
            acc[r] = _mm512_fmadd_ps(p, sv, acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        if (f64)
            out64[r] = _mm512_reduce_add_pd(_mm512_add_pd(lo[r], hi[r]));
        else
            out[r] = _mm512_reduce_add_ps(acc[r]);
    }
}

#define ROWS_CASES(nv, pl, f64, o, o64)                                                      \
    switch (nr) {                                                                            \
    case 4: fp4_rows_impl(qs, scs, 4, nv, pl, f64, K, x, o, o64, nq, ns); break;             \
    case 3: fp4_rows_impl(qs, scs, 3, nv, pl, f64, K, x, o, o64, nq, ns); break;             \
    case 2: fp4_rows_impl(qs, scs, 2, nv, pl, f64, K, x, o, o64, nq, ns); break;             \
    default: fp4_rows_impl(qs, scs, 1, nv, pl, f64, K, x, o, o64, nq, ns); break;            \
    }

/* k3_rows_fn (f64 = 0, float out) or k3_rows64_fn (f64 = 1, double out). */
#define ROWS_FN(name, nv, f64, otype)                                                        \
    T512 static void name(const uint8_t *const *qs, const uint8_t *const *scs, int nr,       \
                          int64_t K, const float *x, otype *out, const uint8_t *const *nq,   \
                          const uint8_t *const *ns) {                                        \
        float *of = f64 ? NULL : (float *)(void *)out;                                       \
        double *od = f64 ? (double *)(void *)out : NULL;                                     \
        int plain = 1;                                                                       \
        for (int r = 0; r < nr; r++) plain &= scales_plain(scs[r], K / (nv ? 16 : 32), nv);  \
        if (plain) {                                                                         \
            ROWS_CASES(nv, 1, f64, of, od)                                                   \
        } else {                                                                             \
            ROWS_CASES(nv, 0, f64, of, od)                                                   \
        }                                                                                    \
    }
ROWS_FN(nvfp4_rows, 1, 0, float)
ROWS_FN(mxfp4_rows, 0, 0, float)
ROWS_FN(nvfp4_rows64, 1, 1, double)
ROWS_FN(mxfp4_rows64, 0, 1, double)

/* ---- SiTU (cpu_kern.h, k3_situ_fn) ---------------------------------------------------- */

/* e^x: x = n ln2 + r, |r| <= ln2/2, a degree-7 Taylor polynomial of e^r (truncation
 * < 1e-8 relative), then vscalefps by 2^n. The clamp keeps n finite; NaN passes through (min/max
 * return their second operand when it is NaN). */
T512 INLINE __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.0f), _mm512_min_ps(_mm512_set1_ps(88.0f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

T512 INLINE __m512 tanh16(__m512 z) {
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512i zi = _mm512_castps_si512(z);
    __m512 az = _mm512_castsi512_ps(_mm512_andnot_si512(sign, zi));
    __m512 t = exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), az));
    __m512 a = _mm512_div_ps(_mm512_sub_ps(one, t), _mm512_add_ps(one, t));
    /* |z| < 1/8: 1 - t would cancel, so the odd Taylor series to z^7 (next term < 2e-9
     * relative) */
    __m512 z2 = _mm512_mul_ps(az, az);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(-17.0f / 315), z2, _mm512_set1_ps(2.0f / 15));
    p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(-1.0f / 3));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, z2), az, az);
    a = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(az, _mm512_set1_ps(0.125f), _CMP_LT_OQ), a, p);
    /* tanh is odd: the sign of z on |tanh| */
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), _mm512_and_si512(sign, zi)));
}

T512 static void situ16(const float *g, const float *u, int n, float bg, float bl, float *out) {
    __mmask16 m = (__mmask16)((1u << n) - 1);
    __m512 gv = _mm512_maskz_loadu_ps(m, g), uv = _mm512_maskz_loadu_ps(m, u);
    __m512 vbg = _mm512_set1_ps(bg), vbl = _mm512_set1_ps(bl), one = _mm512_set1_ps(1.0f);
    __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
    __m512 a = _mm512_mul_ps(_mm512_mul_ps(vbg, tanh16(_mm512_div_ps(gv, vbg))), sig);
    __m512 b = _mm512_mul_ps(vbl, tanh16(_mm512_div_ps(uv, vbl)));
    _mm512_mask_storeu_ps(out, m, _mm512_mul_ps(a, b));
}

/* BF16 weights: widen to 32 bits and shift into the float's high half (exact). */
T512 static void bf16_dot(const uint8_t *row, const uint8_t *sc, int64_t K,
                          const float *const *xs, int nt, float *out) {
    (void)sc;
    __m512 acc[K3_CPU_NT];
    for (int j = 0; j < K3_CPU_NT; j++) acc[j] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= K; c += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * c));
        __m512 wv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#pragma GCC unroll 4
        for (int j = 0; j < K3_CPU_NT; j++)
            if (j < nt) acc[j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xs[j] + c), acc[j]);
    }
    for (int j = 0; j < nt; j++) {
        float a = _mm512_reduce_add_ps(acc[j]);
        for (int64_t t = c; t < K; t++) {
            uint16_t b;
            memcpy(&b, row + 2 * t, 2);
            a += k3_bf16_to_f32(b) * xs[j][t];
        }
        out[j] = a;
    }
}

T512 static void f32_dot(const uint8_t *row, const uint8_t *sc, int64_t K,
                         const float *const *xs, int nt, float *out) {
    (void)sc;
    const float *wr = (const float *)(const void *)row;
    __m512 acc[K3_CPU_NT];
    for (int j = 0; j < K3_CPU_NT; j++) acc[j] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= K; c += 16) {
        __m512 wv = _mm512_loadu_ps(wr + c);
#pragma GCC unroll 4
        for (int j = 0; j < K3_CPU_NT; j++)
            if (j < nt) acc[j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xs[j] + c), acc[j]);
    }
    for (int j = 0; j < nt; j++) {
        float a = _mm512_reduce_add_ps(acc[j]);
        for (int64_t t = c; t < K; t++) a += wr[t] * xs[j][t];
        out[j] = a;
    }
}

const k3_cpu_kern k3_cpu_kern_avx512 = {
    .name = "avx512", .fp4_layout = K3_FP4_T128, .nvfp4 = nvfp4_dot, .mxfp4 = mxfp4_dot,
    .bf16 = bf16_dot, .f32 = f32_dot, .nvfp4_64 = nvfp4_dot64, .mxfp4_64 = mxfp4_dot64,
    .nvfp4_rows = nvfp4_rows, .mxfp4_rows = mxfp4_rows, .nvfp4_rows64 = nvfp4_rows64,
    .mxfp4_rows64 = mxfp4_rows64,
    .situ = situ16,
};
#else
const k3_cpu_kern k3_cpu_kern_avx512 = {.name = "avx512"};
#endif
