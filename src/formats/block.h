/* Block-scaled formats: quantize and dequantize whole rows.
 *
 * NVFP4 (ModelOpt, checkpoint-formats.md §3.4-§3.6): 16 elements per block, E4M3 block
 * scale, FP32 tensor scale. Weights follow the export rules bit for bit; activations follow
 * the run-time rule TensorRT-LLM and vLLM apply. MXFP4 (§6.1): 32 elements per block, E8M0
 * scale chosen as ModelOpt does (ceil(log2(amax/6))). MXFP8 activations: 32 per block, E8M0
 * = ceil(log2(amax/448)) clamped, E4M3 elements. FP8 block weights (§5): 128x128 blocks,
 * FP32 scale = amax/448. Packed 4-bit data: element 2i in the low nibble of byte i.
 *
 * Float32 operation order (it decides the last bit). ModelOpt exports run on the GPU, where
 * PyTorch computes `tensor / python_float` as `tensor * float(1/python_float)`; k3 does the
 * same, so weight_scale_2 = amax * float(1/2688) and the FP8 block scale = amax *
 * float(1/448). (ModelOpt on a CPU divides instead; the two differ by one ulp for about a
 * fifth resp. half of all amax values. For the MX exponents both give the same result.)
 * Tensor-by-tensor operations are IEEE float32 divisions and products, in ModelOpt's order,
 * spelled out at each function. Exponents ceil(log2(.)) are computed exactly from the bits
 * (torch's float log2 can round 2^k(1+2^-23) down to k for |k| >= 4; k3 does not).
 *
 * Weight quantizers reject NaN/Inf elements (K3_ERR_NUMERIC naming row and column); on any
 * failure their outputs may be partly written and must be discarded.
 * Activation quantizers run per token and cannot fail: a block holding NaN or Inf gets a
 * NaN scale code (E4M3 0x7F, E8M0 0xFF), so its dequantized values are NaN, never finite. */
#ifndef K3_BLOCK_H
#define K3_BLOCK_H

#include "base/base.h"
#include <stdint.h>

#define K3_NVFP4_BLOCK 16
#define K3_MXFP4_BLOCK 32
#define K3_FP8_BLOCK   128

/* NVFP4 weight quantization of a whole [rows, cols] float matrix (cols % 16 == 0):
 *   weight_scale_2 = amax(|W|) * float(1/2688); an all-zero matrix gets 1.0 (ModelOpt would
 *                    write 0, which every loader rejects; any positive value reproduces the
 *                    zeros exactly, and 1.0 is the neutral multiplier). A nonzero amax whose
 *                    weight_scale_2 would be subnormal (amax < ~3e-35) is K3_ERR_NUMERIC.
 * then as k3_nvfp4_quantize_weight_gs. packed: [rows, cols/2], scales: [rows, cols/16].
 * Fails (K3_ERR_NUMERIC) on NaN/Inf input, (K3_ERR_SHAPE) on cols % 16 != 0. */
int k3_nvfp4_quantize_weight(const float *w, int64_t rows, int64_t cols, uint8_t *packed,
                             uint8_t *scales, float *weight_scale_2, k3_error *err);
/* That weight_scale_2 for a (finite) matrix amax: amax * float(1/2688), 1.0 for 0. */
float k3_nvfp4_weight_scale_2(float amax);

/* The same with a caller-chosen weight_scale_2 (for fused gate/up sharing one scale), which
 * must be a normal positive float. Per 16-block b of row r, in float32:
 *   sf    = amax_b / (6 * weight_scale_2)      (6*ws2 rounded first, as ModelOpt does)
 *   sf    = sf == 0 ? 1 : max(sf, 2^-9)         scale[r, b] = E4M3(sf)
 *   code  = E2M1(W / (float(scale) * ws2))     the product rounded first; RNE with the
 *           §3.2 bounds; sign bit set iff the quotient is < 0 (so -0.0 gives code 0, as
 *           ModelOpt's `x < 0` sign does; tiny negatives give 8).
 * sf >= 464 (ModelOpt's cast would give NaN: a block amax beyond ~6*448*ws2) is
 * K3_ERR_NUMERIC; 448 < sf < 464 rounds to 448 as torch does. */
int k3_nvfp4_quantize_weight_gs(const float *w, int64_t rows, int64_t cols, float weight_scale_2,
                                uint8_t *packed, uint8_t *scales, k3_error *err);

/* NVFP4 run-time activation quantization of one row x[cols] (cols % 16 == 0) with global
 * scale g = 1/input_scale (finite, positive; the loader checks). Per block, in float32 in
 * vLLM's reference order: sf = g * (amax_block * float(1/6)); s = E4M3(min(sf, 448));
 * o = s == 0 ? 0 : g * (1 / float(s)); code = E2M1(clamp(x * o, -6, 6)).
 * A block whose scale encodes to 0 therefore gets codes 0. Dequant: x ~ code * float(s) / g.
 * Non-finite blocks: scale 0x7F (NaN), codes 0. */
void k3_nvfp4_quantize_act_row(const float *x, int64_t cols, float g, uint8_t *packed,
                               uint8_t *scales);

/* NVFP4 rows back to float: out[c] = E2M1 * float(scale) * weight_scale_2, rounded once
 * (E2M1 * scale is exact in float; the product with weight_scale_2 rounds). */
void k3_nvfp4_dequantize_row(const uint8_t *packed, const uint8_t *scales, int64_t cols,
                             float weight_scale_2, float *out);

/* MXFP4 weight quantization (cols % 32 == 0): e = max(ceil(log2(amax * float(1/6))), -127)
 * per 32 (amax 0 -> -127), scale byte e+127, code = E2M1(W * 2^-e) (exact scaling, RNE).
 * Deliberate difference from ModelOpt's MXFP4 cast: ModelOpt breaks E2M1 ties toward the
 * smaller magnitude (0.75 -> 0.5, 1.75 -> 1.5, 3.5 -> 3) and writes exact zeros as code 8;
 * k3 rounds ties to even (§3.2) and keeps the sign of zero. Scales are identical. */
int k3_mxfp4_quantize(const float *w, int64_t rows, int64_t cols, uint8_t *packed, uint8_t *scales,
                      k3_error *err);
/* out = E2M1 * 2^(e-127): exact in float except 6 * 2^127 (Inf) and NaN for 0xFF. */
void k3_mxfp4_dequantize_row(const uint8_t *packed, const uint8_t *scales, int64_t cols,
                             float *out);

/* MXFP8 activation quantization of one row (cols % 32 == 0): e = ceil(log2(amax *
 * float(1/448))) clamped to [-127, 127] (amax 0 -> -127), elements E4M3(clamp(x * 2^-e,
 * ±448)). Non-finite blocks: scale 0xFF (NaN), elements 0x7F. */
void k3_mxfp8_quantize_row(const float *x, int64_t cols, uint8_t *e4m3, uint8_t *scales);
void k3_mxfp8_dequantize_row(const uint8_t *e4m3, const uint8_t *scales, int64_t cols, float *out);

/* FP8 block weights: scale[i, j] = amax(block) * float(1/448), data = E4M3(W / scale)
 * (IEEE division, saturating at 448). A zero block gets scale 1.0 (ModelOpt stores 0 and
 * divides by 1; a positive scale keeps loaders that reject zero scales happy, and the data
 * is 0 either way). A nonzero amax whose scale underflows to 0 is K3_ERR_NUMERIC.
 * scales: [ceil(rows/128), ceil(cols/128)]; ragged edges are partial blocks. */
int k3_fp8_block_quantize(const float *w, int64_t rows, int64_t cols, uint8_t *data, float *scales,
                          k3_error *err);
/* Row r of the [rows, cols] matrix: out = float(E4M3) * scale, rounded once. */
void k3_fp8_block_dequantize_row(const uint8_t *data, const float *scales, int64_t rows,
                                 int64_t cols, int64_t r, float *out);

#endif
