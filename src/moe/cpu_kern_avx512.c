/* AVX-512 (F/BW/VL) row kernels. Compiled with function-level target attributes (the
 * Makefile has no -march) and only called after __builtin_cpu_supports says yes.
 *
 * 4-bit rows, one 16-element block = 8 bytes per step (layout K3_FP4_NIB16, cpu_kern.h):
 * the 8 bytes are broadcast to every qword straight from memory (a load, no shuffle),
 * vpsrlvd moves nibble j>>1 of dword j&1 to the bottom of lane j, and vpermps, which reads
 * only the low 4 bits of each index, looks the 16 lanes up in the E2M1 table. So a block
 * costs one shift (port 0) and one permute (port 5) before the arithmetic, and its 16
 * lanes share one block scale, which is an embedded broadcast from the 256-entry E4M3/E8M0
 * table (exact for every code, NaN included). Per token and NVFP4 block: p = w*x,
 * acc += p*s; an MXFP4 block is two vectors, p = w0*x0 + w1*x1, acc += p*s.
 * At T = 1 (fp4_rows) several rows share each activation vector, one accumulator per row
 * keeps the FMA latency chains independent, and each row stream is prefetched once per
 * 64-byte line. */
#include "moe/cpu_kern.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

/* Software prefetch distance in packed bytes where no next call is known: a single core's
 * hardware prefetchers alone do not keep enough misses in flight to stream at DRAM speed;
 * measured on a Sapphire Rapids VM, 1-2 KB reached 6-7.5 GB/s, 6-8 KB 10.5 GB/s. */
#define PF_BYTES 6144

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define INLINE static inline __attribute__((always_inline))

T512 INLINE __m512i nib_shifts(void) {
    return _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0);
}

/* The 16 weights of the 8 bytes at q, in K3_FP4_NIB16 lane order, unscaled. */
T512 INLINE __m512 dec16(const uint8_t *q, __m512i sh, __m512 tbl) {
    int64_t v;
    memcpy(&v, q, 8);
    return _mm512_permutexvar_ps(_mm512_srlv_epi32(_mm512_set1_epi64(v), sh), tbl);
}

T512 INLINE __m512 bscale(const float *stab, const uint8_t *sc, int64_t b) {
    return _mm512_set1_ps(stab[sc[b]]);
}

/* Up to K3_CPU_NT tokens against one row; nvfp4 is a compile-time constant in each
 * wrapper. Rows of both formats are whole blocks (validated by the caller). */
T512 INLINE void fp4_dot_impl(const uint8_t *q, const uint8_t *sc, const int nvfp4, int64_t K,
                              const float *const *xs, int nt, float *out) {
    const __m512 tbl = _mm512_loadu_ps(k3_cpu_e2m1);
    const __m512i sh = nib_shifts();
    const float *stab = nvfp4 ? k3_cpu_e4m3 : k3_cpu_e8m0;
    const int blk = nvfp4 ? 16 : 32;
    __m512 acc[K3_CPU_NT];
    for (int j = 0; j < K3_CPU_NT; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t c = 0; c + blk <= K; c += blk) {
        _mm_prefetch((const char *)(q + c / 2 + PF_BYTES), _MM_HINT_T0);
        __m512 s = bscale(stab, sc, c / blk);
        __m512 w0 = dec16(q + c / 2, sh, tbl);
        __m512 w1 = nvfp4 ? w0 : dec16(q + c / 2 + 8, sh, tbl);
#pragma GCC unroll 4
        for (int j = 0; j < K3_CPU_NT; j++) {
            if (j >= nt) break;
            __m512 p = _mm512_mul_ps(w0, _mm512_loadu_ps(xs[j] + c));
            if (!nvfp4) p = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xs[j] + c + 16), p);
            acc[j] = _mm512_fmadd_ps(p, s, acc[j]);
        }
    }
    for (int j = 0; j < nt; j++) out[j] = _mm512_reduce_add_ps(acc[j]);
}

T512 static void nvfp4_dot(const uint8_t *q, const uint8_t *sc, int64_t K,
                           const float *const *xs, int nt, float *out) {
    fp4_dot_impl(q, sc, 1, K, xs, nt, out);
}

T512 static void mxfp4_dot(const uint8_t *q, const uint8_t *sc, int64_t K,
                           const float *const *xs, int nt, float *out) {
    fp4_dot_impl(q, sc, 0, K, xs, nt, out);
}

/* The same with float64 across blocks (W4A4/W4A8): each lane's product of an E2M1 weight
 * and a quantized activation is exact in float, so only the double sums round. */
T512 INLINE void fp4_dot64_impl(const uint8_t *q, const uint8_t *sc, const int nvfp4, int64_t K,
                                const float *const *xs, int nt, double *out) {
    const __m512 tbl = _mm512_loadu_ps(k3_cpu_e2m1);
    const __m512i sh = nib_shifts();
    const float *stab = nvfp4 ? k3_cpu_e4m3 : k3_cpu_e8m0;
    const int blk = nvfp4 ? 16 : 32;
    __m512d lo[K3_CPU_NT], hi[K3_CPU_NT];
    for (int j = 0; j < K3_CPU_NT; j++) lo[j] = hi[j] = _mm512_setzero_pd();
    for (int64_t c = 0; c + blk <= K; c += blk) {
        __m512d s = _mm512_set1_pd(stab[sc[c / blk]]);
        for (int h = 0; h < blk; h += 16) {
            __m512 w = dec16(q + (c + h) / 2, sh, tbl);
#pragma GCC unroll 4
            for (int j = 0; j < K3_CPU_NT; j++) {
                if (j >= nt) break;
                __m512 p = _mm512_mul_ps(w, _mm512_loadu_ps(xs[j] + c + h));
                __m256 plo = _mm512_castps512_ps256(p);
                __m256 phi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1));
                lo[j] = _mm512_fmadd_pd(_mm512_cvtps_pd(plo), s, lo[j]);
                hi[j] = _mm512_fmadd_pd(_mm512_cvtps_pd(phi), s, hi[j]);
            }
        }
    }
    for (int j = 0; j < nt; j++) out[j] = _mm512_reduce_add_pd(_mm512_add_pd(lo[j], hi[j]));
}

T512 static void nvfp4_dot64(const uint8_t *q, const uint8_t *sc, int64_t K,
                             const float *const *xs, int nt, double *out) {
    fp4_dot64_impl(q, sc, 1, K, xs, nt, out);
}

T512 static void mxfp4_dot64(const uint8_t *q, const uint8_t *sc, int64_t K,
                             const float *const *xs, int nt, double *out) {
    fp4_dot64_impl(q, sc, 0, K, xs, nt, out);
}

/* T = 1 over nr rows (a compile-time constant in each instance): 128 elements per step,
 * the 8 activation vectors loaded once for all rows, one 64-byte line per row, two
 * accumulators per row (even and odd blocks) so no row waits on its own FMA latency. */
T512 INLINE void fp4_rows_impl(const uint8_t *const *qs, const uint8_t *const *scs, const int nr,
                               const int nvfp4, int64_t K, const float *x, float *out,
                               const uint8_t *const *nq, const uint8_t *const *ns) {
    const __m512 tbl = _mm512_loadu_ps(k3_cpu_e2m1);
    const __m512i sh = nib_shifts();
    const float *stab = nvfp4 ? k3_cpu_e4m3 : k3_cpu_e8m0;
    const uint8_t *q[K3_CPU_NR], *s[K3_CPU_NR], *pq[K3_CPU_NR], *ps[K3_CPU_NR];
    __m512 acc[K3_CPU_NR][2];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        q[r] = qs[r];
        s[r] = scs[r];
        /* without a next call: a fixed distance ahead in the current row's matrix */
        pq[r] = nq && nq[r] ? nq[r] : qs[r] + PF_BYTES;
        ps[r] = ns && ns[r] ? ns[r] : scs[r] + PF_BYTES / 8;
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    }
    int64_t c = 0;
    for (; c + 128 <= K; c += 128) {
        __m512 xv[8];
#pragma GCC unroll 8
        for (int b = 0; b < 8; b++) xv[b] = _mm512_loadu_ps(x + c + 16 * b);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const uint8_t *qr = q[r] + c / 2;
            _mm_prefetch((const char *)(pq[r] + c / 2), _MM_HINT_T0);
            if ((c & 511) == 0) _mm_prefetch((const char *)(ps[r] + c / (nvfp4 ? 16 : 32)), _MM_HINT_T0);
            if (nvfp4) {
#pragma GCC unroll 8
                for (int b = 0; b < 8; b++)
                    acc[r][b & 1] = _mm512_fmadd_ps(_mm512_mul_ps(dec16(qr + 8 * b, sh, tbl), xv[b]),
                                                    bscale(stab, s[r], c / 16 + b), acc[r][b & 1]);
            } else {
#pragma GCC unroll 4
                for (int b = 0; b < 8; b += 2) {
                    __m512 p = _mm512_mul_ps(dec16(qr + 8 * b, sh, tbl), xv[b]);
                    p = _mm512_fmadd_ps(dec16(qr + 8 * b + 8, sh, tbl), xv[b + 1], p);
                    acc[r][(b >> 1) & 1] = _mm512_fmadd_ps(p, bscale(stab, s[r], c / 32 + b / 2),
                                                           acc[r][(b >> 1) & 1]);
                }
            }
        }
    }
    const int blk = nvfp4 ? 16 : 32;
    for (; c + blk <= K; c += blk) {
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m512 p = _mm512_mul_ps(dec16(q[r] + c / 2, sh, tbl), _mm512_loadu_ps(x + c));
            if (!nvfp4)
                p = _mm512_fmadd_ps(dec16(q[r] + c / 2 + 8, sh, tbl), _mm512_loadu_ps(x + c + 16), p);
            acc[r][0] = _mm512_fmadd_ps(p, bscale(stab, s[r], c / blk), acc[r][0]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

#define ROWS_FN(name, nv)                                                                    \
    T512 static void name(const uint8_t *const *qs, const uint8_t *const *scs, int nr,       \
                          int64_t K, const float *x, float *out, const uint8_t *const *nq,   \
                          const uint8_t *const *ns) {                                        \
        switch (nr) {                                                                        \
        case 4: fp4_rows_impl(qs, scs, 4, nv, K, x, out, nq, ns); break;                     \
        case 3: fp4_rows_impl(qs, scs, 3, nv, K, x, out, nq, ns); break;                     \
        case 2: fp4_rows_impl(qs, scs, 2, nv, K, x, out, nq, ns); break;                     \
        default: fp4_rows_impl(qs, scs, 1, nv, K, x, out, nq, ns); break;                    \
        }                                                                                    \
    }
ROWS_FN(nvfp4_rows, 1)
ROWS_FN(mxfp4_rows, 0)

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
    .name = "avx512", .fp4_layout = K3_FP4_NIB16, .nvfp4 = nvfp4_dot, .mxfp4 = mxfp4_dot,
    .bf16 = bf16_dot, .f32 = f32_dot, .nvfp4_64 = nvfp4_dot64, .mxfp4_64 = mxfp4_dot64,
    .nvfp4_rows = nvfp4_rows, .mxfp4_rows = mxfp4_rows,
};
#else
const k3_cpu_kern k3_cpu_kern_avx512 = {.name = "avx512"};
#endif
