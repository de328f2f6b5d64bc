/* AVX-512 (F/BW/VL) row kernels. Compiled with function-level target attributes (the
 * Makefile has no -march) and only called after __builtin_cpu_supports says yes.
 *
 * 4-bit rows, one 32-element chunk = 16 bytes per step: vpmovzxbd widens the bytes to 16
 * dword lanes; vpermps with the 16-entry E2M1 table turns the low nibbles into the even
 * elements and, after a 4-bit shift, the high nibbles into the odd ones. The block scales
 * come from a 256-entry float table (exact for every E4M3/E8M0 code, NaN included) as one
 * vector: NVFP4 [s0 x8 | s1 x8] since lanes 0-7 belong to the chunk's first 16 elements,
 * MXFP4 one broadcast. Per token: p = wa*xa + wb*xb (unscaled), acc += p*s.
 * At T = 1 this is a stream of 16-byte loads with ~8 vector ops per 32 weights, so two
 * independent accumulators keep the FMA latency chain off the critical path. */
#include "moe/cpu_kern.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

/* Software prefetch distance in packed bytes: a single core's hardware prefetchers alone
 * do not keep enough misses in flight to stream at DRAM speed. */
#define PF_BYTES 2048

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

T512 static inline __m512 scale_nv(const uint8_t *sc) {
    __m512 s = _mm512_set1_ps(k3_cpu_e4m3[sc[0]]);
    return _mm512_mask_broadcastss_ps(s, 0xFF00, _mm_load_ss(&k3_cpu_e4m3[sc[1]]));
}

T512 static inline void decode32(const uint8_t *q, __m512 tbl, __m512 *wa, __m512 *wb) {
    __m512i dw = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    *wa = _mm512_permutexvar_ps(dw, tbl);
    *wb = _mm512_permutexvar_ps(_mm512_srli_epi32(dw, 4), tbl);
}

/* The elements after the last whole chunk (natural order; NVFP4 rows with K % 32 == 16). */
static void fp4_tail(const uint8_t *q, const uint8_t *sc, const float *stab, int block,
                     int64_t k0, int64_t K, const float *const *xs, int nt, float *acc) {
    for (int64_t b0 = k0; b0 < K; b0 += block) {
        float s = stab[sc[b0 / block]];
        for (int j = 0; j < nt; j++) {
            float p = 0.0f;
            for (int i = 0; i < block; i += 2) {
                uint8_t byte = q[(b0 + i) / 2];
                p += k3_cpu_e2m1[byte & 15] * xs[j][b0 + i];
                p += k3_cpu_e2m1[byte >> 4] * xs[j][b0 + i + 1];
            }
            acc[j] += p * s;
        }
    }
}

T512 static void fp4_dot(const uint8_t *q, const uint8_t *sc, int nvfp4, int64_t K,
                         const float *const *xs, int nt, float *out) {
    const __m512 tbl = _mm512_loadu_ps(k3_cpu_e2m1);
    const int64_t K32 = K & ~(int64_t)31;
    float accs[K3_CPU_NT];
    if (nt == 1) {
        const float *x = xs[0];
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        int64_t c = 0;
        for (; c + 64 <= K32; c += 64) {
            __m512 wa0, wb0, wa1, wb1;
            _mm_prefetch((const char *)(q + c / 2 + PF_BYTES), _MM_HINT_T0);
            decode32(q + c / 2, tbl, &wa0, &wb0);
            decode32(q + c / 2 + 16, tbl, &wa1, &wb1);
            __m512 s0 = nvfp4 ? scale_nv(sc + c / 16) : _mm512_set1_ps(k3_cpu_e8m0[sc[c / 32]]);
            __m512 s1 = nvfp4 ? scale_nv(sc + c / 16 + 2)
                              : _mm512_set1_ps(k3_cpu_e8m0[sc[c / 32 + 1]]);
            __m512 p0 = _mm512_mul_ps(wa0, _mm512_loadu_ps(x + c));
            __m512 p1 = _mm512_mul_ps(wa1, _mm512_loadu_ps(x + c + 32));
            p0 = _mm512_fmadd_ps(wb0, _mm512_loadu_ps(x + c + 16), p0);
            p1 = _mm512_fmadd_ps(wb1, _mm512_loadu_ps(x + c + 48), p1);
            a0 = _mm512_fmadd_ps(p0, s0, a0);
            a1 = _mm512_fmadd_ps(p1, s1, a1);
        }
        for (; c < K32; c += 32) {
            __m512 wa, wb;
            decode32(q + c / 2, tbl, &wa, &wb);
            __m512 s = nvfp4 ? scale_nv(sc + c / 16) : _mm512_set1_ps(k3_cpu_e8m0[sc[c / 32]]);
            __m512 p = _mm512_mul_ps(wa, _mm512_loadu_ps(x + c));
            p = _mm512_fmadd_ps(wb, _mm512_loadu_ps(x + c + 16), p);
            a0 = _mm512_fmadd_ps(p, s, a0);
        }
        accs[0] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    } else {
        __m512 acc[K3_CPU_NT];
        for (int j = 0; j < K3_CPU_NT; j++) acc[j] = _mm512_setzero_ps();
        for (int64_t c = 0; c < K32; c += 32) {
            __m512 wa, wb;
            _mm_prefetch((const char *)(q + c / 2 + PF_BYTES), _MM_HINT_T0);
            decode32(q + c / 2, tbl, &wa, &wb);
            __m512 s = nvfp4 ? scale_nv(sc + c / 16) : _mm512_set1_ps(k3_cpu_e8m0[sc[c / 32]]);
#pragma GCC unroll 4
            for (int j = 0; j < K3_CPU_NT; j++) {
                if (j >= nt) break;
                __m512 p = _mm512_mul_ps(wa, _mm512_loadu_ps(xs[j] + c));
                p = _mm512_fmadd_ps(wb, _mm512_loadu_ps(xs[j] + c + 16), p);
                acc[j] = _mm512_fmadd_ps(p, s, acc[j]);
            }
        }
        for (int j = 0; j < nt; j++) accs[j] = _mm512_reduce_add_ps(acc[j]);
    }
    fp4_tail(q, sc, nvfp4 ? k3_cpu_e4m3 : k3_cpu_e8m0, nvfp4 ? 16 : 32, K32, K, xs, nt, accs);
    for (int j = 0; j < nt; j++) out[j] = accs[j];
}

T512 static void fp4_dot64(const uint8_t *q, const uint8_t *sc, int nvfp4, int64_t K,
                           const float *const *xs, int nt, double *out) {
    const __m512 tbl = _mm512_loadu_ps(k3_cpu_e2m1);
    const int64_t K32 = K & ~(int64_t)31;
    const float *stab = nvfp4 ? k3_cpu_e4m3 : k3_cpu_e8m0;
    __m512d lo[K3_CPU_NT], hi[K3_CPU_NT];
    for (int j = 0; j < K3_CPU_NT; j++) lo[j] = hi[j] = _mm512_setzero_pd();
    for (int64_t c = 0; c < K32; c += 32) {
        __m512 wa, wb;
        decode32(q + c / 2, tbl, &wa, &wb);
        __m512d s0 = _mm512_set1_pd(stab[nvfp4 ? sc[c / 16] : sc[c / 32]]);
        __m512d s1 = _mm512_set1_pd(stab[nvfp4 ? sc[c / 16 + 1] : sc[c / 32]]);
#pragma GCC unroll 4
        for (int j = 0; j < K3_CPU_NT; j++) {
            if (j >= nt) break;
            __m512 p = _mm512_mul_ps(wa, _mm512_loadu_ps(xs[j] + c));
            p = _mm512_fmadd_ps(wb, _mm512_loadu_ps(xs[j] + c + 16), p);
            __m256 plo = _mm512_castps512_ps256(p);
            __m256 phi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1));
            lo[j] = _mm512_fmadd_pd(_mm512_cvtps_pd(plo), s0, lo[j]);
            hi[j] = _mm512_fmadd_pd(_mm512_cvtps_pd(phi), s1, hi[j]);
        }
    }
    for (int j = 0; j < nt; j++) {
        double a = _mm512_reduce_add_pd(_mm512_add_pd(lo[j], hi[j]));
        int block = nvfp4 ? 16 : 32;
        for (int64_t b0 = K32; b0 < K; b0 += block) {
            float p = 0.0f;
            for (int i = 0; i < block; i += 2) {
                uint8_t byte = q[(b0 + i) / 2];
                p += k3_cpu_e2m1[byte & 15] * xs[j][b0 + i];
                p += k3_cpu_e2m1[byte >> 4] * xs[j][b0 + i + 1];
            }
            a += (double)p * stab[sc[b0 / block]];
        }
        out[j] = a;
    }
}

T512 static void nvfp4_dot64(const uint8_t *q, const uint8_t *sc, int64_t K,
                             const float *const *xs, int nt, double *out) {
    fp4_dot64(q, sc, 1, K, xs, nt, out);
}

T512 static void mxfp4_dot64(const uint8_t *q, const uint8_t *sc, int64_t K,
                             const float *const *xs, int nt, double *out) {
    fp4_dot64(q, sc, 0, K, xs, nt, out);
}

/* T = 1 over nr rows: per chunk the activation pair is loaded once and each row adds its
 * mul + 2 FMA; all nr rows stream concurrently (nr * 2 prefetch streams). */
T512 static void fp4_rows(const uint8_t *const *qs, const uint8_t *const *scs, int nr, int nvfp4,
                          int64_t K, const float *x, float *out) {
    const __m512 tbl = _mm512_loadu_ps(k3_cpu_e2m1);
    const int64_t K32 = K & ~(int64_t)31;
    __m512 acc[K3_CPU_NR];
#pragma GCC unroll 4
    for (int r = 0; r < K3_CPU_NR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < K32; c += 32) {
        __m512 xa = _mm512_loadu_ps(x + c), xb = _mm512_loadu_ps(x + c + 16);
#pragma GCC unroll 4
        for (int r = 0; r < K3_CPU_NR; r++) {
            if (r >= nr) break;
            __m512 wa, wb;
            _mm_prefetch((const char *)(qs[r] + c / 2 + PF_BYTES), _MM_HINT_T0);
            decode32(qs[r] + c / 2, tbl, &wa, &wb);
            __m512 s = nvfp4 ? scale_nv(scs[r] + c / 16) : _mm512_set1_ps(k3_cpu_e8m0[scs[r][c / 32]]);
            __m512 p = _mm512_mul_ps(wa, xa);
            p = _mm512_fmadd_ps(wb, xb, p);
            acc[r] = _mm512_fmadd_ps(p, s, acc[r]);
        }
    }
    const float *xs[1] = {x};
    for (int r = 0; r < nr; r++) {
        float a = _mm512_reduce_add_ps(acc[r]);
        fp4_tail(qs[r], scs[r], nvfp4 ? k3_cpu_e4m3 : k3_cpu_e8m0, nvfp4 ? 16 : 32, K32, K, xs, 1, &a);
        out[r] = a;
    }
}

T512 static void nvfp4_rows(const uint8_t *const *qs, const uint8_t *const *scs, int nr,
                            int64_t K, const float *x, float *out) {
    fp4_rows(qs, scs, nr, 1, K, x, out);
}

T512 static void mxfp4_rows(const uint8_t *const *qs, const uint8_t *const *scs, int nr,
                            int64_t K, const float *x, float *out) {
    fp4_rows(qs, scs, nr, 0, K, x, out);
}

T512 static void nvfp4_dot(const uint8_t *q, const uint8_t *sc, int64_t K,
                           const float *const *xs, int nt, float *out) {
    fp4_dot(q, sc, 1, K, xs, nt, out);
}

T512 static void mxfp4_dot(const uint8_t *q, const uint8_t *sc, int64_t K,
                           const float *const *xs, int nt, float *out) {
    fp4_dot(q, sc, 0, K, xs, nt, out);
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
            uint32_t u = (uint32_t)b << 16;
            float wf;
            memcpy(&wf, &u, 4);
            a += wf * xs[j][t];
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
    .name = "avx512", .fp4_chunk = 32, .nvfp4 = nvfp4_dot, .mxfp4 = mxfp4_dot,
    .bf16 = bf16_dot, .f32 = f32_dot, .nvfp4_64 = nvfp4_dot64, .mxfp4_64 = mxfp4_dot64,
    .nvfp4_rows = nvfp4_rows, .mxfp4_rows = mxfp4_rows,
};
#else
const k3_cpu_kern k3_cpu_kern_avx512 = {.name = "avx512"};
#endif
