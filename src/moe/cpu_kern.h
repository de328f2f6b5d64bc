/* Private to the CPU MoE path: the row dot-product kernels and the input layout each wants.
 *
 * A kernel computes out[j] = sum_c W[row, c] * xs[j][c] for up to K3_CPU_NT token rows at
 * once, decoding the packed weight row once and reusing it for every token. It applies the
 * block scales but not the matrix's global scale (the caller folds that in). The 4-bit
 * kernels want their inputs permuted within each 16-element block (k3_cpu_pos) so that
 * the activation matching each decoded weight lane sits in a plain vector load:
 *  - K3_FP4_PAIRS16 (AVX2): bytes widened to 8 dword lanes, lane j holds elements 2j (low
 *    nibble) and 2j+1 (high nibble): the 8 even elements, then the 8 odd ones;
 *  - K3_FP4_NIB16: the block's 8 bytes broadcast to every qword and shifted by a per-lane
 *    count, lane j holds nibble j>>1 of dword j&1, i.e. element 8*(j&1) + (j>>1);
 *  - K3_FP4_T128 (AVX-512): per 128 elements (64 bytes, one vector load), lane j of the
 *    vector shifted by 4k holds nibble k of dword j, element 8j + k: position 16k + j.
 *    One load, 7 shifts and 8 permutes per 128 weights, and the 8 products of a lane all
 *    belong to one block, so they are summed before the lane's block scale is applied
 *    once. Blocks after the last whole 128 use K3_FP4_NIB16.
 * Elements past the last whole block keep their natural order. */
#ifndef K3_CPU_KERN_H
#define K3_CPU_KERN_H

#include <stdint.h>

#define K3_CPU_NT 4 /* token rows per dot call */

typedef void (*k3_dot_fn)(const uint8_t *row, const uint8_t *scale_row, int64_t K,
                          const float *const *xs, int nt, float *out);

/* The same for 4-bit rows with float64 accumulation (W4A4/W4A8 FC1): with quantized
 * activations every product is exact in float (and, for NVFP4 x NVFP4, every sum within a
 * 16-block too), so the row sum is within double rounding of the float64 emulation, and the
 * hidden value rounds to the same float before it is quantized again (a 1-ulp difference
 * could flip an E2M1 code). What may be summed in float before the float64 sums is each
 * kernel's argument (cpu_kern_avx512.c); test_kernel_row_lengths holds them to 1e-13. */
typedef void (*k3_dot64_fn)(const uint8_t *row, const uint8_t *scale_row, int64_t K,
                            const float *const *xs, int nt, double *out);

/* The four 4-bit dot entry points of an ISA file (nvfp4_dot, mxfp4_dot: k3_dot_fn; nvfp4_dot64,
 * mxfp4_dot64: k3_dot64_fn) over its one implementation
 * impl(q, sc, nvfp4, f64, K, xs, nt, float *out, double *out64), with nvfp4 and f64
 * compile-time constants in each; attr is the file's target attribute. */
#define K3_FP4_DOT_FN(attr, impl, name, nv, f64, otype)                                        \
    attr static void name(const uint8_t *q, const uint8_t *sc, int64_t K,                     \
                          const float *const *xs, int nt, otype *out) {                        \
        impl(q, sc, nv, f64, K, xs, nt, f64 ? NULL : (float *)(void *)out,                     \
             f64 ? (double *)(void *)out : NULL);                                              \
    }
#define K3_FP4_DOT_FNS(attr, impl)                                                             \
    K3_FP4_DOT_FN(attr, impl, nvfp4_dot, 1, 0, float)                                          \
    K3_FP4_DOT_FN(attr, impl, mxfp4_dot, 0, 0, float)                                          \
    K3_FP4_DOT_FN(attr, impl, nvfp4_dot64, 1, 1, double)                                       \
    K3_FP4_DOT_FN(attr, impl, mxfp4_dot64, 0, 1, double)

/* One token against up to K3_CPU_NR rows at once (the T = 1 case): several independent
 * weight streams in flight and the activation loaded once for all of them. Optional.
 * next[0..nr) / next_scale[0..nr) are the rows the caller will pass next (NULL arrays:
 * none known): the kernel prefetches them at the pace it consumes the current rows, so
 * the misses of the following call are in flight a whole call ahead, across row, item and
 * expert boundaries, which a fixed distance inside the current row cannot do. */
#define K3_CPU_NR 4
typedef void (*k3_rows_fn)(const uint8_t *const *rows, const uint8_t *const *scale_rows, int nr,
                           int64_t K, const float *x, float *out, const uint8_t *const *next,
                           const uint8_t *const *next_scale);

/* k3_rows_fn with float64 sums (W4A4 / W4A8 FC1 at one token per expert; see k3_dot64_fn). */
typedef void (*k3_rows64_fn)(const uint8_t *const *rows, const uint8_t *const *scale_rows, int nr,
                             int64_t K, const float *x, double *out, const uint8_t *const *next,
                             const uint8_t *const *next_scale);

/* SiTU over n <= 16 outputs of one expert: out = bg*tanh(g/bg)*sigmoid(g) * bl*tanh(u/bl)
 * (moe.md §1), vectorized: exp by range reduction and a polynomial, tanh(z) =
 * (1 - e^-2|z|)/(1 + e^-2|z|) or its Taylor series for |z| < 1/8; a few float ulps from
 * float64 (test_situ_vector), NaN propagated.
 * Optional: the caller falls back to k3_act_f32. */
typedef void (*k3_situ_fn)(const float *g, const float *u, int n, float bg, float bl, float *out);

typedef struct k3_cpu_kern {
    const char *name;
    int fp4_layout; /* k3_fp4_layout of inputs to NVFP4/MXFP4 rows */
    k3_dot_fn nvfp4, mxfp4, bf16, f32;
    k3_dot64_fn nvfp4_64, mxfp4_64;
    k3_rows_fn nvfp4_rows, mxfp4_rows; /* NULL: the caller loops over rows */
    k3_rows64_fn nvfp4_rows64, mxfp4_rows64; /* NULL: the caller takes items of dot64 */
    k3_situ_fn situ;                   /* NULL: k3_act_f32 per output */
} k3_cpu_kern;

extern const k3_cpu_kern k3_cpu_kern_scalar, k3_cpu_kern_avx2, k3_cpu_kern_avx512;


typedef enum k3_fp4_layout {
    K3_FP4_NATURAL = 0,
    K3_FP4_PAIRS16,
    K3_FP4_NIB16,
    K3_FP4_T128
} k3_fp4_layout;

/* Where natural element i of a K-long input lives in a kernel's layout. */
static inline int64_t k3_cpu_pos(int64_t i, int64_t K, int layout) {
    if (layout == K3_FP4_NATURAL || i >= K - K % 16) return i;
    if (layout == K3_FP4_T128 && i < K - K % 128) {
        int64_t e = i & 127;
        return (i - e) + 16 * (e & 7) + (e >> 3);
    }
    int64_t in = i & 15;
    if (layout == K3_FP4_PAIRS16) return (i - in) + ((in & 1) ? 8 : 0) + (in >> 1);
    return (i - in) + 2 * (in & 7) + (in >> 3);
}

#endif
