/* Scalar number formats: FP4 E2M1, FP8 E4M3 (fn), FP8 E5M2, E8M0, BF16 and FP16, to and from
 * float32. Decoding is exact (every value of these formats is a float). Encoding rounds to
 * nearest, ties to even, with each format's saturation and NaN rules
 * (checkpoint-formats.md §3.2, §3.3, §6.1):
 *  - E2M1: no NaN/Inf codes; |x| > 6 (and ±Inf) saturates to ±6. NaN has no code: callers
 *    reject it (the encoder returns a code of magnitude 0 for it). The sign bit is the sign
 *    bit of x, so -0.0 and tiny negatives encode to 8 (-0).
 *  - E4M3 (fn): no Inf; 0x7F/0xFF are NaN; max finite 448; finite |x| beyond 448 saturates
 *    to ±448 (the cast torch/ModelOpt use after clamping); NaN -> 0x7F; ±Inf -> ±448.
 *  - E5M2: IEEE-like with Inf; NaN -> 0x7F; overflow rounds to Inf as IEEE does.
 *  - E8M0: 2^(e-127), 0xFF NaN, no zero, no sign; encoding takes an exponent (see below).
 *  - BF16/FP16: IEEE round-to-nearest-even, NaN stays NaN (quiet), overflow -> Inf.
 * Encoders assume the default floating-point environment (round to nearest).
 *
 * The lookup tables are the decoders used by kernels: a load per element, no arithmetic.
 * Each entry is written as its defining formula, and tests check every entry. */
#ifndef K3_FP_H
#define K3_FP_H

#include <stdint.h>
#include <string.h>

extern const float k3_e2m1_lut[16];  /* code (sign in bit 3) -> value; 8 is -0.0 */
extern const float k3_e4m3_lut[256]; /* 0x7F, 0xFF -> NaN */
extern const float k3_e5m2_lut[256]; /* 0x7C/0xFC -> ±Inf, 0x7D..0x7F and 0xFD..0xFF -> NaN */
extern const float k3_e8m0_lut[256]; /* 2^(e-127); 0xFF -> NaN */

static inline float k3_e2m1_to_f32(uint8_t code) {
    return k3_e2m1_lut[code & 15];
} /* low 4 bits */
uint8_t k3_f32_to_e2m1(float x); /* 4-bit code, sign in bit 3 */

static inline float k3_e4m3_to_f32(uint8_t code) {
    return k3_e4m3_lut[code];
}
uint8_t k3_f32_to_e4m3(float x);

static inline float k3_e5m2_to_f32(uint8_t code) {
    return k3_e5m2_lut[code];
}
uint8_t k3_f32_to_e5m2(float x);

/* 0xFF -> NaN; 0 -> 2^-127 (a float32 subnormal). */
static inline float k3_e8m0_to_f32(uint8_t code) {
    return k3_e8m0_lut[code];
}
/* E8M0 from an unbiased exponent: e in [-127, 127] -> code e+127; outside -> clamped. */
uint8_t k3_e8m0_from_exp(int e);

float k3_bf16_to_f32(uint16_t bits);
uint16_t k3_f32_to_bf16(float x);

float k3_f16_to_f32(uint16_t bits);
uint16_t k3_f32_to_f16(float x);

/* Bit views of a float (memcpy, so no aliasing questions; compiles to a move). */
static inline uint32_t k3_f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float k3_f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#endif
