/* Scalar format conversions. Decoding is a table load; the tables are spelled as their
 * defining formulas (constant expressions, so the tables are const data with no start-up
 * code and no pow/exp). Encoding works on the float's bits: the normal range rounds with
 * integer arithmetic, the target's subnormal range rounds by one float addition that lets
 * the FPU's round-to-nearest-even do the work. Nothing here allocates, fails or prints. */
#include "formats/fp.h"

#include <math.h>

/* Four-fold expansion of a per-code formula F(c) over 256 codes. */
#define R4(F, c)  F(c), F((c) + 1), F((c) + 2), F((c) + 3)
#define R16(F, c) R4(F, c), R4(F, (c) + 4), R4(F, (c) + 8), R4(F, (c) + 12)
#define R64(F, c) R16(F, c), R16(F, (c) + 16), R16(F, (c) + 32), R16(F, (c) + 48)
#define R256(F)   R64(F, 0), R64(F, 64), R64(F, 128), R64(F, 192)

#define SGN8(c) (((c)&0x80) ? -1.0f : 1.0f)

const float k3_e2m1_lut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* E4M3: e = bits 6..3 (bias 7), m = bits 2..0. e == 0: m * 2^-9; else (8+m) * 2^(e-10). */
#define E4M3_EXP(c) (((c) >> 3) & 15)
#define E4M3(c)                                                                                    \
    (((c)&0x7F) == 0x7F                                                                            \
         ? NAN                                                                                     \
         : SGN8(c) * (E4M3_EXP(c) == 0 ? (float)((c)&7) * 0x1p-9f                                  \
                                       : (float)((8ull + ((c)&7)) << E4M3_EXP(c)) * 0x1p-10f))
const float k3_e4m3_lut[256] = {R256(E4M3)};

/* E5M2: e = bits 6..2 (bias 15), m = bits 1..0. e == 0: m * 2^-16; e == 31: Inf/NaN;
 * else (4+m) * 2^(e-17). */
#define E5M2_EXP(c) (((c) >> 2) & 31)
#define E5M2(c)                                                                                    \
    (E5M2_EXP(c) == 31                                                                             \
         ? (((c)&3) ? NAN : SGN8(c) * INFINITY)                                                    \
         : SGN8(c) * (E5M2_EXP(c) == 0 ? (float)((c)&3) * 0x1p-16f                                 \
                                       : (float)((4ull + ((c)&3)) << E5M2_EXP(c)) * 0x1p-17f))
const float k3_e5m2_lut[256] = {R256(E5M2)};

/* E8M0: 2^(c-127), computed in double as 2^(c mod 64) * 2^(64 * (c / 64)) * 2^-127. */
#define P64(k)  ((k) == 0 ? 1.0 : (k) == 1 ? 0x1p64 : (k) == 2 ? 0x1p128 : 0x1p192)
#define E8M0(c) ((c) == 255 ? NAN : (float)(0x1p-127 * (double)(1ull << ((c)&63)) * P64((c) >> 6)))
const float k3_e8m0_lut[256] = {R256(E8M0)};

/* Rounds a finite non-negative float (bits a) to a format with `mbits` mantissa bits and
 * exponent bias `bias`; returns the unsigned magnitude code, which may exceed the format's
 * largest finite code (callers saturate or map to Inf). */
static inline uint32_t round_mag(uint32_t a, int mbits, int bias) {
    const uint32_t min_normal = (uint32_t)(128 - bias) << 23; /* 2^(1-bias) */
    if (a < min_normal) {
        /* Subnormal target: in [F, 2F) with F = 2^(24-bias-mbits) a float's spacing equals
         * the target's subnormal spacing, so F + |x| rounds (RNE) exactly as the target does;
         * the code is then the distance in bits. A carry to min-normal comes out right. */
        const uint32_t fbits = (uint32_t)(151 - bias - mbits) << 23;
        float sum = k3_f32_from_bits(a) + k3_f32_from_bits(fbits);
        return k3_f32_bits(sum) - fbits;
    }
    const int s = 23 - mbits;
    uint32_t r = (a + (1u << (s - 1)) - 1u + ((a >> s) & 1u)) >> s;
    return r - ((uint32_t)(127 - bias) << mbits);
}

uint8_t k3_f32_to_e2m1(float x) {
    uint32_t u = k3_f32_bits(x);
    float f = k3_f32_from_bits(u & 0x7FFFFFFFu);
    /* Bounds are the midpoints 0.25 0.75 1.25 1.75 2.5 3.5 5; at a midpoint the even code
     * wins, hence '>' below a midpoint whose lower neighbour is even and '>=' otherwise. */
    unsigned code = (unsigned)(f > 0.25f) + (unsigned)(f >= 0.75f) + (unsigned)(f > 1.25f) +
                    (unsigned)(f >= 1.75f) + (unsigned)(f > 2.5f) + (unsigned)(f >= 3.5f) +
                    (unsigned)(f > 5.0f);
    return (uint8_t)(((u >> 28) & 8u) | code);
}

/* Both FP8 encoders: NaN is 0x7F, and a magnitude past max_code becomes max_code. */
static inline uint8_t f32_to_fp8(float x, int mbits, int bias, uint32_t max_code) {
    uint32_t u = k3_f32_bits(x);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u)
        return 0x7F;
    uint32_t r = round_mag(a, mbits, bias);
    if (r > max_code)
        r = max_code;
    return (uint8_t)(((u >> 24) & 0x80u) | r);
}

uint8_t k3_f32_to_e4m3(float x) {
    return f32_to_fp8(x, 3, 7, 0x7Eu); /* saturate to 448 (Inf included) */
}

uint8_t k3_f32_to_e5m2(float x) {
    return f32_to_fp8(x, 2, 15, 0x7Cu); /* overflow is Inf */
}

uint8_t k3_e8m0_from_exp(int e) {
    if (e < -127)
        e = -127;
    if (e > 127)
        e = 127;
    return (uint8_t)(e + 127);
}

float k3_bf16_to_f32(uint16_t bits) {
    return k3_f32_from_bits((uint32_t)bits << 16);
}

uint16_t k3_f32_to_bf16(float x) {
    uint32_t u = k3_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float k3_f16_to_f32(uint16_t bits) {
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t e = (bits >> 10) & 31u, m = bits & 0x3FFu;
    if (e == 0)
        return k3_f32_from_bits(sign | k3_f32_bits((float)m * 0x1p-24f));
    if (e == 31)
        return k3_f32_from_bits(sign | 0x7F800000u | (m << 13));
    return k3_f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t k3_f32_to_f16(float x) {
    uint32_t u = k3_f32_bits(x);
    uint32_t a = u & 0x7FFFFFFFu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7F800000u)
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    uint32_t r = round_mag(a, 10, 15);
    if (r > 0x7C00u)
        r = 0x7C00u; /* overflow is Inf */
    return (uint16_t)(sign | r);
}
