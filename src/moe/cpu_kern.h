/* Private to the CPU MoE path: the row dot-product kernels and the input layout each wants.
 *
 * A kernel computes out[j] = sum_c W[row, c] * xs[j][c] for up to K3_CPU_NT token rows at
 * once, decoding the packed weight row once and reusing it for every token. It applies the
 * block scales but not the matrix's global scale (the caller folds that in). The 4-bit
 * kernels want their inputs de-interleaved per chunk of `chunk` floats (k3_cpu_pos): after
 * widening a chunk's bytes to 32-bit lanes, lane j holds elements 2j (low nibble) and 2j+1
 * (high nibble), so the even elements come from one table permute and the odd ones from a
 * shift and a second permute, and matching activations sit in two plain vector loads.
 * Elements past the last whole chunk keep their natural order. */
#ifndef K3_CPU_KERN_H
#define K3_CPU_KERN_H

#include <stdint.h>

#define K3_CPU_NT 4 /* token rows per dot call */

typedef void (*k3_dot_fn)(const uint8_t *row, const uint8_t *scale_row, int64_t K,
                          const float *const *xs, int nt, float *out);

/* The same for 4-bit rows with float64 accumulation across blocks (W4A4/W4A8 FC1): with
 * quantized activations each block's partial sum is exact in float, so the row sum is
 * within double rounding of the float64 emulation, and the hidden value rounds to the
 * same float before it is quantized again (a 1-ulp difference could flip an E2M1 code). */
typedef void (*k3_dot64_fn)(const uint8_t *row, const uint8_t *scale_row, int64_t K,
                            const float *const *xs, int nt, double *out);

/* One token against up to K3_CPU_NR rows at once (the T = 1 case): several independent
 * weight streams in flight and the activation loaded once for all of them. Optional. */
#define K3_CPU_NR 4
typedef void (*k3_rows_fn)(const uint8_t *const *rows, const uint8_t *const *scale_rows, int nr,
                           int64_t K, const float *x, float *out);

typedef struct k3_cpu_kern {
    const char *name;
    int fp4_chunk; /* layout of inputs to NVFP4/MXFP4 rows; 1 = natural */
    k3_dot_fn nvfp4, mxfp4, bf16, f32;
    k3_dot64_fn nvfp4_64, mxfp4_64;
    k3_rows_fn nvfp4_rows, mxfp4_rows; /* NULL: the caller loops over rows */
} k3_cpu_kern;

extern const k3_cpu_kern k3_cpu_kern_scalar, k3_cpu_kern_avx2, k3_cpu_kern_avx512;

/* Decode tables, filled once from formats/fp.h by k3_cpu_tables_init (thread safe). */
extern const float k3_cpu_e2m1[16];
extern float k3_cpu_e4m3[256];
extern float k3_cpu_e8m0[256];
void k3_cpu_tables_init(void);

/* Where natural element i of a K-long input lives in a kernel's layout. */
static inline int64_t k3_cpu_pos(int64_t i, int64_t K, int chunk) {
    if (chunk <= 1 || i >= K - K % chunk) return i;
    int64_t in = i & (chunk - 1);
    return (i - in) + ((in & 1) ? chunk / 2 : 0) + (in >> 1);
}

#endif
