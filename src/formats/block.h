/* Block-scaled formats: quantize and dequantize whole rows.
 *
 * NVFP4 (ModelOpt, checkpoint-formats.md §3.4-§3.6): 16 elements per block, E4M3 block
 * scale, FP32 tensor scale. Weights follow the export rules bit for bit; activations follow
 * the run-time rule TensorRT-LLM and vLLM apply. MXFP4 (§6.1): 32 elements per block, E8M0
 * scale chosen as ModelOpt does (ceil(log2(amax/6))). MXFP8 activations: 32 per block, E8M0
 * = ceil(log2(amax/448)) clamped, E4M3 elements. FP8 block weights (§5): 128x128 blocks,
 * FP32 scale = amax/448. Packed 4-bit data: element 2i in the low nibble of byte i. */
#ifndef K3_BLOCK_H
#define K3_BLOCK_H

#include "base/base.h"
#include <stdint.h>

#define K3_NVFP4_BLOCK 16
#define K3_MXFP4_BLOCK 32
#define K3_FP8_BLOCK 128

/* NVFP4 weight quantization of a whole [rows, cols] float matrix (cols % 16 == 0):
 *   weight_scale_2 = amax(|W|) / (6*448)  (amax == 0 -> 1.0 / (6*448)? see the .c comment)
 *   scale[r, b]    = E4M3(amax_block / (6 * weight_scale_2)), zero -> 1.0, clamp [2^-9, 448]
 *   code           = E2M1(W / (float(scale) * weight_scale_2))
 * packed: [rows, cols/2], scales: [rows, cols/16]. Fails (K3_ERR_NUMERIC) on NaN/Inf input
 * and (K3_ERR_SHAPE) on cols % 16 != 0. */
int k3_nvfp4_quantize_weight(const float *w, int64_t rows, int64_t cols, uint8_t *packed,
                             uint8_t *scales, float *weight_scale_2, k3_error *err);

/* The same with a caller-chosen weight_scale_2 (for fused gate/up sharing one scale). */
int k3_nvfp4_quantize_weight_gs(const float *w, int64_t rows, int64_t cols, float weight_scale_2,
                                uint8_t *packed, uint8_t *scales, k3_error *err);

/* NVFP4 run-time activation quantization of one row x[cols] (cols % 16 == 0) with global
 * scale g = 1/input_scale: s = E4M3(g*amax_block/6), code = E2M1(clamp(x*g/float(s), -6, 6)).
 * A block whose scale encodes to 0 gets codes 0. Dequant: x ~ code * float(s) / g. */
void k3_nvfp4_quantize_act_row(const float *x, int64_t cols, float g, uint8_t *packed,
                               uint8_t *scales);

/* Exact dequantization of NVFP4 rows: out[c] = E2M1 * float(scale) * weight_scale_2. */
void k3_nvfp4_dequantize_row(const uint8_t *packed, const uint8_t *scales, int64_t cols,
                             float weight_scale_2, float *out);

/* MXFP4 weight quantization (cols % 32 == 0): scale = ceil(log2(amax/6)) per 32 (amax 0 ->
 * exponent -127), code = E2M1(W / 2^scale). */
int k3_mxfp4_quantize(const float *w, int64_t rows, int64_t cols, uint8_t *packed,
                      uint8_t *scales, k3_error *err);
void k3_mxfp4_dequantize_row(const uint8_t *packed, const uint8_t *scales, int64_t cols,
                             float *out);

/* MXFP8 activation quantization of one row (cols % 32 == 0): E8M0 = ceil(log2(amax/448))
 * clamped to [-127, 127], elements E4M3(x / 2^e). */
void k3_mxfp8_quantize_row(const float *x, int64_t cols, uint8_t *e4m3, uint8_t *scales);
void k3_mxfp8_dequantize_row(const uint8_t *e4m3, const uint8_t *scales, int64_t cols,
                             float *out);

/* FP8 block weights: scale[i, j] = amax(block)/448 (zero block -> 1.0), data = E4M3(W/scale).
 * scales: [ceil(rows/128), ceil(cols/128)]; ragged edges are partial blocks. */
int k3_fp8_block_quantize(const float *w, int64_t rows, int64_t cols, uint8_t *data,
                          float *scales, k3_error *err);
void k3_fp8_block_dequantize_row(const uint8_t *data, const float *scales, int64_t rows,
                                 int64_t cols, int64_t r, float *out);

#endif
