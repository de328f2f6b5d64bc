/* Block-scaled quantizers and dequantizers (NVFP4, MXFP4, MXFP8, FP8 128x128 blocks).
 * The float32 operation order of each rule is documented in block.h and followed literally
 * here: bit-exactness with ModelOpt depends on it. These are scalar loops meant to be the
 * readable reference and the CPU fallback; they use the decode tables of fp.h and no libm.
 * Not here: swizzled scale layouts and kernel-private orders (§3.7), which are kernel work. */
#include "formats/block.h"

#include "formats/fp.h"

#include <float.h>
#include <math.h>

/* float(1/c) as PyTorch on CUDA forms it for `tensor / c` (block.h explains why). */
#define RCP_6    ((float)(1.0 / 6.0))
#define RCP_448  ((float)(1.0 / 448.0))
#define RCP_2688 ((float)(1.0 / 2688.0))

static int check_finite(const float *row, int64_t n, int64_t r, int64_t c0, const char *what,
                        k3_error *err) {
    for (int64_t c = 0; c < n; c++)
        if (!isfinite(row[c]))
            return k3_fail(err, K3_ERR_NUMERIC,
                           "%s [%lld, %lld]: expected a finite value, found %s", what, (long long)r,
                           (long long)(c0 + c), isnan(row[c]) ? "NaN" : "Inf");
    return K3_OK;
}

static int check_shape(int64_t rows, int64_t cols, int64_t block, const char *what, const void *a,
                       const void *b, const void *c, k3_error *err) {
    if (!a || !b || !c)
        return k3_fail(err, K3_ERR_ARG, "%s: NULL buffer", what);
    if (rows < 0 || cols <= 0 || cols % block != 0)
        return k3_fail(err, K3_ERR_SHAPE,
                       "%s: expected cols a positive multiple of %lld, found [%lld, %lld]", what,
                       (long long)block, (long long)rows, (long long)cols);
    return K3_OK;
}

/* |x| max, NaN-free input assumed (callers check or handle non-finite separately). */
static float block_amax(const float *x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m)
            m = a;
    }
    return m;
}

/* NaN-propagating: returns NaN if any element is NaN or Inf (activation paths). */
static float block_amax_nf(const float *x, int64_t n) {
    float m = 0.0f;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        bad |= !(a <= FLT_MAX);
        if (a > m)
            m = a;
    }
    return bad ? NAN : m;
}

/* Exact ceil(log2(d)) for finite d > 0, from the bits. */
static int ceil_log2(float d) {
    uint32_t u = k3_f32_bits(d);
    if (u >= 0x00800000u) {
        int k = (int)(u >> 23) - 127;
        return (u & 0x7FFFFFu) ? k + 1 : k;
    }
    int fl = 31 - __builtin_clz(u); /* subnormal: d = u * 2^-149 */
    return ((u & (u - 1)) ? fl + 1 : fl) - 149;
}

/* 2^e for e in [-127, 127] (2^-127 is a float subnormal). */
static float pow2f(int e) {
    return e >= -126 ? k3_f32_from_bits((uint32_t)(e + 127) << 23) : 0x1p-127f;
}

/* ---- NVFP4 ------------------------------------------------------------------------- */

float k3_nvfp4_weight_scale_2(float amax) {
    return amax == 0.0f ? 1.0f : amax * RCP_2688;
}

int k3_nvfp4_quantize_weight(const float *w, int64_t rows, int64_t cols, uint8_t *packed,
                             uint8_t *scales, float *weight_scale_2, k3_error *err) {
    int rc = check_shape(rows, cols, K3_NVFP4_BLOCK, "nvfp4 weight", w, packed, scales, err);
    if (rc)
        return rc;
    if (!weight_scale_2)
        return k3_fail(err, K3_ERR_ARG, "nvfp4 weight: NULL weight_scale_2");
    float amax = 0.0f;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = w + r * cols;
        if ((rc = check_finite(row, cols, r, 0, "nvfp4 weight", err)))
            return rc;
        float a = block_amax(row, cols);
        if (a > amax)
            amax = a;
    }
    float ws2 = k3_nvfp4_weight_scale_2(amax);
    if (!(ws2 >= FLT_MIN))
        return k3_fail(err, K3_ERR_NUMERIC,
                       "nvfp4 weight: amax %g is too small: weight_scale_2 would be subnormal",
                       (double)amax);
    rc = k3_nvfp4_quantize_weight_gs(w, rows, cols, ws2, packed, scales, err);
    if (rc == K3_OK)
        *weight_scale_2 = ws2;
    return rc;
}

int k3_nvfp4_quantize_weight_gs(const float *w, int64_t rows, int64_t cols, float weight_scale_2,
                                uint8_t *packed, uint8_t *scales, k3_error *err) {
    int rc = check_shape(rows, cols, K3_NVFP4_BLOCK, "nvfp4 weight", w, packed, scales, err);
    if (rc)
        return rc;
    const float ws2 = weight_scale_2;
    if (!(ws2 >= FLT_MIN && ws2 <= FLT_MAX))
        return k3_fail(err, K3_ERR_NUMERIC,
                       "nvfp4 weight: expected weight_scale_2 a positive normal float, found %g",
                       (double)ws2);
    const float six_ws2 = 6.0f * ws2;
    const int64_t nb = cols / K3_NVFP4_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *x = w + r * cols + b * K3_NVFP4_BLOCK;
            if ((rc = check_finite(x, K3_NVFP4_BLOCK, r, b * K3_NVFP4_BLOCK, "nvfp4 weight", err)))
                return rc;
            float sf = block_amax(x, K3_NVFP4_BLOCK) / six_ws2;
            if (sf == 0.0f)
                sf = 1.0f;
            if (sf < 0x1p-9f)
                sf = 0x1p-9f;
            if (!(sf < 464.0f))
                return k3_fail(err, K3_ERR_NUMERIC,
                               "nvfp4 weight [%lld, %lld..%lld]: block amax %g exceeds "
                               "6*448*weight_scale_2 (weight_scale_2 %g)",
                               (long long)r, (long long)(b * K3_NVFP4_BLOCK),
                               (long long)(b * K3_NVFP4_BLOCK + 15),
                               (double)block_amax(x, K3_NVFP4_BLOCK), (double)ws2);
            uint8_t s = k3_f32_to_e4m3(sf);
            scales[r * nb + b] = s;
            const float denom = k3_e4m3_lut[s] * ws2;
            uint8_t *p = packed + r * (cols / 2) + b * (K3_NVFP4_BLOCK / 2);
            for (int i = 0; i < K3_NVFP4_BLOCK; i += 2) {
                float q0 = x[i] / denom, q1 = x[i + 1] / denom;
                uint8_t c0 = q0 == 0.0f ? 0 : k3_f32_to_e2m1(q0);
                uint8_t c1 = q1 == 0.0f ? 0 : k3_f32_to_e2m1(q1);
                p[i / 2] = (uint8_t)(c0 | (c1 << 4));
            }
        }
    }
    return K3_OK;
}

void k3_nvfp4_quantize_act_row(const float *x, int64_t cols, float g, uint8_t *packed,
                               uint8_t *scales) {
    for (int64_t b = 0; b < cols / K3_NVFP4_BLOCK; b++) {
        const float *xb = x + b * K3_NVFP4_BLOCK;
        uint8_t *p = packed + b * (K3_NVFP4_BLOCK / 2);
        float amax = block_amax_nf(xb, K3_NVFP4_BLOCK);
        if (isnan(amax)) {
            scales[b] = 0x7F;
            for (int i = 0; i < K3_NVFP4_BLOCK / 2; i++)
                p[i] = 0;
            continue;
        }
        float sf = g * (amax * RCP_6);
        if (sf > 448.0f)
            sf = 448.0f;
        uint8_t s = k3_f32_to_e4m3(sf);
        scales[b] = s;
        float sv = k3_e4m3_lut[s];
        float o = sv == 0.0f ? 0.0f : g * (1.0f / sv);
        for (int i = 0; i < K3_NVFP4_BLOCK; i += 2) {
            float q0 = fminf(fmaxf(xb[i] * o, -6.0f), 6.0f);
            float q1 = fminf(fmaxf(xb[i + 1] * o, -6.0f), 6.0f);
            p[i / 2] = (uint8_t)(k3_f32_to_e2m1(q0) | (k3_f32_to_e2m1(q1) << 4));
        }
    }
}

void k3_nvfp4_dequantize_row(const uint8_t *packed, const uint8_t *scales, int64_t cols,
                             float weight_scale_2, float *out) {
    for (int64_t b = 0; b < cols / K3_NVFP4_BLOCK; b++) {
        /* E2M1 * scale is exact in float (at most 6 significant bits), so one rounding. */
        float lut[16];
        float sv = k3_e4m3_lut[scales[b]];
        for (int c = 0; c < 16; c++)
            lut[c] = (k3_e2m1_lut[c] * sv) * weight_scale_2;
        const uint8_t *p = packed + b * (K3_NVFP4_BLOCK / 2);
        float *o = out + b * K3_NVFP4_BLOCK;
        for (int i = 0; i < K3_NVFP4_BLOCK / 2; i++) {
            o[2 * i] = lut[p[i] & 15];
            o[2 * i + 1] = lut[p[i] >> 4];
        }
    }
}

/* ---- MXFP4 / MXFP8 ------------------------------------------------------------------ */

static int mx_exponent(float amax, float rcp) {
    float d = amax * rcp;
    return d > 0.0f ? ceil_log2(d) : -127;
}

int k3_mxfp4_quantize(const float *w, int64_t rows, int64_t cols, uint8_t *packed, uint8_t *scales,
                      k3_error *err) {
    int rc = check_shape(rows, cols, K3_MXFP4_BLOCK, "mxfp4 weight", w, packed, scales, err);
    if (rc)
        return rc;
    const int64_t nb = cols / K3_MXFP4_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *x = w + r * cols + b * K3_MXFP4_BLOCK;
            if ((rc = check_finite(x, K3_MXFP4_BLOCK, r, b * K3_MXFP4_BLOCK, "mxfp4 weight", err)))
                return rc;
            int e = mx_exponent(block_amax(x, K3_MXFP4_BLOCK), RCP_6);
            if (e < -127)
                e = -127;
            scales[r * nb + b] = k3_e8m0_from_exp(e);
            const float inv = pow2f(-e); /* x * 2^-e equals x / 2^e: same real, one rounding */
            uint8_t *p = packed + r * (cols / 2) + b * (K3_MXFP4_BLOCK / 2);
            for (int i = 0; i < K3_MXFP4_BLOCK; i += 2)
                p[i / 2] =
                    (uint8_t)(k3_f32_to_e2m1(x[i] * inv) | (k3_f32_to_e2m1(x[i + 1] * inv) << 4));
        }
    }
    return K3_OK;
}

void k3_mxfp4_dequantize_row(const uint8_t *packed, const uint8_t *scales, int64_t cols,
                             float *out) {
    for (int64_t b = 0; b < cols / K3_MXFP4_BLOCK; b++) {
        float sv = k3_e8m0_lut[scales[b]];
        const uint8_t *p = packed + b * (K3_MXFP4_BLOCK / 2);
        float *o = out + b * K3_MXFP4_BLOCK;
        for (int i = 0; i < K3_MXFP4_BLOCK / 2; i++) {
            o[2 * i] = k3_e2m1_lut[p[i] & 15] * sv;
            o[2 * i + 1] = k3_e2m1_lut[p[i] >> 4] * sv;
        }
    }
}

void k3_mxfp8_quantize_row(const float *x, int64_t cols, uint8_t *e4m3, uint8_t *scales) {
    for (int64_t b = 0; b < cols / K3_MXFP4_BLOCK; b++) {
        const float *xb = x + b * K3_MXFP4_BLOCK;
        uint8_t *q = e4m3 + b * K3_MXFP4_BLOCK;
        float amax = block_amax_nf(xb, K3_MXFP4_BLOCK);
        if (isnan(amax)) {
            scales[b] = 0xFF;
            for (int i = 0; i < K3_MXFP4_BLOCK; i++)
                q[i] = 0x7F;
            continue;
        }
        int e = mx_exponent(amax, RCP_448);
        if (e < -127)
            e = -127;
        if (e > 127)
            e = 127;
        scales[b] = k3_e8m0_from_exp(e);
        const float inv = pow2f(-e);
        for (int i = 0; i < K3_MXFP4_BLOCK; i++)
            q[i] = k3_f32_to_e4m3(fminf(fmaxf(xb[i] * inv, -448.0f), 448.0f));
    }
}

void k3_mxfp8_dequantize_row(const uint8_t *e4m3, const uint8_t *scales, int64_t cols, float *out) {
    for (int64_t b = 0; b < cols / K3_MXFP4_BLOCK; b++) {
        float sv = k3_e8m0_lut[scales[b]];
        for (int i = 0; i < K3_MXFP4_BLOCK; i++)
            out[b * K3_MXFP4_BLOCK + i] = k3_e4m3_lut[e4m3[b * K3_MXFP4_BLOCK + i]] * sv;
    }
}

/* ---- FP8 128x128 blocks ------------------------------------------------------------- */

int k3_fp8_block_quantize(const float *w, int64_t rows, int64_t cols, uint8_t *data, float *scales,
                          k3_error *err) {
    int rc = check_shape(rows, cols, 1, "fp8 block weight", w, data, scales, err);
    if (rc)
        return rc;
    const int64_t B = K3_FP8_BLOCK;
    const int64_t nbr = (rows + B - 1) / B, nbc = (cols + B - 1) / B;
    for (int64_t i = 0; i < nbr; i++) {
        const int64_t r0 = i * B, r1 = r0 + B < rows ? r0 + B : rows;
        for (int64_t j = 0; j < nbc; j++) {
            const int64_t c0 = j * B, c1 = c0 + B < cols ? c0 + B : cols;
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; r++) {
                if ((rc = check_finite(w + r * cols + c0, c1 - c0, r, c0, "fp8 block weight", err)))
                    return rc;
                float a = block_amax(w + r * cols + c0, c1 - c0);
                if (a > amax)
                    amax = a;
            }
            float s = amax * RCP_448;
            if (amax == 0.0f)
                s = 1.0f;
            if (s == 0.0f)
                return k3_fail(err, K3_ERR_NUMERIC,
                               "fp8 block weight [%lld.., %lld..]: block amax %g is too small: "
                               "its scale underflows to 0",
                               (long long)r0, (long long)c0, (double)amax);
            scales[i * nbc + j] = s;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++)
                    data[r * cols + c] = k3_f32_to_e4m3(w[r * cols + c] / s);
        }
    }
    return K3_OK;
}

void k3_fp8_block_dequantize_row(const uint8_t *data, const float *scales, int64_t rows,
                                 int64_t cols, int64_t r, float *out) {
    (void)rows;
    const int64_t nbc = (cols + K3_FP8_BLOCK - 1) / K3_FP8_BLOCK;
    const float *srow = scales + (r / K3_FP8_BLOCK) * nbc;
    const uint8_t *d = data + r * cols;
    for (int64_t c = 0; c < cols; c++)
        out[c] = k3_e4m3_lut[d[c]] * srow[c / K3_FP8_BLOCK];
}
