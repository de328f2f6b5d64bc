/* k3_qmat: one weight matrix as the checkpoint stores it, in any format k3 reads.
 *
 * This is the contract between the loader (which fills it, validated, from safetensors
 * bytes or from k3's own quantizer) and every consumer (the float64 reference, the CPU
 * kernels, the GPU upload). The bytes are in *file layout*: row-major [rows, cols] logical
 * weights, PyTorch [out, in] order; packed 4-bit formats hold element 2i in the low nibble.
 * Kernels that want another layout re-order a copy at load time; this struct never changes.
 * The struct does not own its pointers; whoever filled it keeps the memory alive. */
#ifndef K3_QMAT_H
#define K3_QMAT_H

#include <stddef.h>
#include <stdint.h>

typedef enum k3_wfmt {
    K3_WFMT_F32 = 0,   /* data: float [rows, cols] */
    K3_WFMT_BF16,      /* data: uint16 bf16 bits [rows, cols] */
    K3_WFMT_F16,       /* data: uint16 fp16 bits [rows, cols] */
    K3_WFMT_NVFP4,     /* data: uint8 [rows, cols/2] E2M1 pairs; scale: E4M3 [rows, cols/16] */
    K3_WFMT_MXFP4,     /* data: uint8 [rows, cols/2] E2M1 pairs; scale: E8M0 [rows, cols/32] */
    K3_WFMT_FP8_BLOCK, /* data: E4M3 [rows, cols]; scale: float [ceil(rows/128), ceil(cols/128)] */
    K3_WFMT_COUNT
} k3_wfmt;

typedef struct k3_qmat {
    k3_wfmt fmt;
    int64_t rows, cols; /* logical shape [out, in] */
    const void *data;   /* see k3_wfmt */
    const void *scale;  /* block scales (NULL for F32/BF16/F16) */
    /* NVFP4 only: weight_scale_2, the per-tensor dequantization multiplier (ModelOpt
     * convention; a compressed-tensors weight_global_scale is stored here as 1/global).
     * 1.0 for every other format. */
    float global_scale;
    /* NVFP4 only: the checkpoint's static activation scale input_scale = amax/(6*448)
     * (compressed-tensors: 1/input_global_scale); 0 when the checkpoint has none. */
    float input_scale;
} k3_qmat;

const char *k3_wfmt_name(k3_wfmt fmt);

/* Dequantizes row r of m into out[cols]. float64: exact (every format's value, scales
 * included, has at most 30 significant bits). float32: that value rounded once (NVFP4 and
 * FP8-block products need the rounding; MXFP4 6*2^127 becomes Inf). A row that cannot be
 * read (NULL m/data/scale, bad fmt, r outside [0, rows), cols not a multiple of the block)
 * fills out[0..cols) with NaN (nothing when cols <= 0); the loader validates before this. */
void k3_qmat_row_f64(const k3_qmat *m, int64_t r, double *out);
void k3_qmat_row_f32(const k3_qmat *m, int64_t r, float *out);

/* y[t, o] = sum_c x[t, c] * m[o, c] for x [T, cols] and y [T, rows]: each row of m read once
 * as exact float64 (into the caller's row[cols]), products summed in double in index order,
 * rounded once to float. The plain product of the fp32 parts around the experts (router
 * gate, MoE block projections), not a fast GEMM. */
void k3_qmat_matmul(const k3_qmat *m, const float *x, int T, float *y, double *row);

/* Bytes of data and scale that m occupies (what a kernel must stream to read it). */
size_t k3_qmat_data_bytes(const k3_qmat *m);
size_t k3_qmat_scale_bytes(const k3_qmat *m);

#endif
