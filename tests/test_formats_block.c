/* Block formats (NVFP4 weights and activations, MXFP4, MXFP8, FP8 128x128) and k3_qmat rows:
 * error bounds against float64 on fresh random inputs, re-quantization of dequantized data,
 * NaN/Inf rejection naming row and column, shape/argument errors, guard bytes after every
 * output. Bit-exactness against ModelOpt's rules is tests/py/test_formats_oracle.py.
 * Bounds: an E2M1 element with block scale S is within halfstep(|x|/S) * S of x, where the
 * half-steps of the grid 0..6 are 0.25 (|x|/S <= 2), 0.5 (<= 4), 1 (beyond, saturation
 * included); an E4M3 element is within 2^-4 relative (normal) or 2^-10 * scale (subnormal). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "formats/block.h"
#include "formats/fp.h"
#include "formats/qmat.h"

#define GUARD  64
#define POISON 0xA5

static uint64_t rng_state;

static double urand(void) { /* [0, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * 0x1p-53;
}

static double nrand(void) {
    double u = urand() + 1e-300, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* A matrix with per-16-block magnitudes spread over many binades, some zero blocks and some
 * blocks tiny enough that their NVFP4 scale clamps at 2^-9. */
static float *make_matrix(int64_t rows, int64_t cols) {
    float *w = malloc((size_t)(rows * cols) * sizeof *w);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < cols / 16; b++) {
            double mag = pow(2.0, (int)(urand() * 20) - 10);
            int kind = (int)(urand() * 10);
            for (int64_t i = 0; i < 16; i++) {
                double v = nrand() * mag;
                if (kind == 0)
                    v = 0.0;
                if (kind == 1)
                    v *= 1e-9;
                w[r * cols + b * 16 + i] = (float)v;
            }
        }
    return w;
}

/* Buffer of n bytes plus guard bytes, all poisoned. */
static uint8_t *guarded(size_t n) {
    uint8_t *p = malloc(n + GUARD);
    memset(p, POISON, n + GUARD);
    return p;
}

static void assert_guard(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < GUARD; i++)
        assert_int_equal(p[n + i], POISON);
}

static double halfstep(double q) {
    return q <= 2 ? 0.25 : q <= 4 ? 0.5 : 1.0;
}

/* Fresh inputs each run (time and a counter); the seed is printed to replay a failure. */
static void seed(void) {
    static uint64_t calls;
    rng_state = ((uint64_t)time(NULL) + (uint64_t)clock() + ++calls) * 0x9E3779B97F4A7C15ull;
    fprintf(stderr, "seed %llu\n", (unsigned long long)rng_state);
}

/* ---- NVFP4 weights ------------------------------------------------------------------- */

static void test_nvfp4_weight_bounds_and_requant(void **state) {
    (void)state;
    seed();
    const int64_t R = 13, C = 160, NB = C / 16;
    float *w = make_matrix(R, C);
    uint8_t *packed = guarded((size_t)(R * C / 2)), *scales = guarded((size_t)(R * NB));
    float ws2 = NAN;
    k3_error err = {0};
    assert_int_equal(k3_nvfp4_quantize_weight(w, R, C, packed, scales, &ws2, &err), K3_OK);
    assert_guard(packed, (size_t)(R * C / 2));
    assert_guard(scales, (size_t)(R * NB));
    assert_true(ws2 > 0 && isfinite(ws2));
    float *deq = malloc((size_t)(R * C) * sizeof *deq);
    int normal_blocks = 0;
    for (int64_t r = 0; r < R; r++) {
        k3_nvfp4_dequantize_row(packed + r * C / 2, scales + r * NB, C, ws2, deq + r * C);
        for (int64_t c = 0; c < C; c++) {
            uint8_t s = scales[r * NB + c / 16];
            assert_true(s != 0 && (s & 0x7F) != 0x7F && !(s & 0x80)); /* clamped, positive */
            double S = (double)k3_e4m3_to_f32(s) * ws2;
            double e = fabs((double)w[r * C + c] - deq[r * C + c]);
            double q = fabs(w[r * C + c]) / S;
            /* beyond 6 the element saturates; how far is set by the E4M3 rounding of the
             * block scale: 2^-4 relative for normal scales, 2^-10 absolute for subnormal */
            double bound = q <= 6 ? halfstep(q) * S * (1 + 1e-6)
                                  : fmax(6 * S * 0x1p-4, 6 * ws2 * 0x1p-10) * (1 + 1e-6);
            if (!(e <= bound))
                fail_msg("nvfp4 [%lld, %lld]: |%g - %g| > %g", (long long)r, (long long)c,
                         (double)w[r * C + c], (double)deq[r * C + c], bound);
        }
    }
    /* Re-quantizing the dequantized matrix with the same weight_scale_2 reproduces every
     * block whose scale is a normal E4M3 (>= 2^-6) or the 2^-9 clamp; subnormal scales may
     * move (their 2^-4-plus rounding can change the block's largest code). */
    uint8_t *p2 = guarded((size_t)(R * C / 2)), *s2 = guarded((size_t)(R * NB));
    float *deq2 = malloc((size_t)(R * C) * sizeof *deq2);
    assert_int_equal(k3_nvfp4_quantize_weight_gs(deq, R, C, ws2, p2, s2, &err), K3_OK);
    for (int64_t r = 0; r < R; r++) {
        k3_nvfp4_dequantize_row(p2 + r * C / 2, s2 + r * NB, C, ws2, deq2 + r * C);
        for (int64_t b = 0; b < NB; b++) {
            uint8_t s = scales[r * NB + b];
            if (s < 0x08 && s != 0x01)
                continue;
            normal_blocks++;
            if (s != 0x01)
                assert_int_equal(s2[r * NB + b], s); /* all-zero codes: 1.0 */
            for (int64_t i = 0; i < 16; i++)
                assert_true(deq2[r * C + b * 16 + i] == deq[r * C + b * 16 + i]);
        }
    }
    assert_true(normal_blocks > R * NB / 2);
    /* The full quantizer recomputes weight_scale_2 from the dequantized amax: within 2 ulp. */
    float ws2b = NAN;
    assert_int_equal(k3_nvfp4_quantize_weight(deq, R, C, p2, s2, &ws2b, &err), K3_OK);
    assert_true(fabs((double)ws2b - ws2) <= 2 * (nextafterf(ws2, INFINITY) - ws2));
    free(w), free(deq), free(deq2), free(packed), free(scales), free(p2), free(s2);
}

static void test_nvfp4_weight_zero_and_errors(void **state) {
    (void)state;
    float z[32] = {0}, ws2 = NAN;
    uint8_t p[48], s[6]; /* room for 3 rows of 32: failures leave outputs partly written */
    k3_error err = {0};
    z[5] = -0.0f;
    assert_int_equal(k3_nvfp4_quantize_weight(z, 1, 32, p, s, &ws2, &err), K3_OK);
    assert_true(ws2 == 1.0f);
    assert_int_equal(s[0], 0x38); /* zero blocks get scale 1.0 */
    for (int i = 0; i < 16; i++)
        assert_int_equal(p[i], 0); /* -0.0 -> code 0 (ModelOpt) */
    float w[3 * 32];
    for (int i = 0; i < 96; i++)
        w[i] = (float)(i % 7) - 3.0f;
    w[2 * 32 + 17] = NAN;
    assert_int_equal(k3_nvfp4_quantize_weight(w, 3, 32, p, s, &ws2, &err), K3_ERR_NUMERIC);
    assert_non_null(strstr(err.msg, "[2, 17]"));
    assert_non_null(strstr(err.msg, "NaN"));
    w[2 * 32 + 17] = -INFINITY;
    assert_int_equal(k3_nvfp4_quantize_weight_gs(w, 3, 32, 1.0f, p, s, &err), K3_ERR_NUMERIC);
    assert_non_null(strstr(err.msg, "[2, 17]"));
    assert_non_null(strstr(err.msg, "Inf"));
    assert_int_equal(k3_nvfp4_quantize_weight(w, 1, 24, p, s, &ws2, &err), K3_ERR_SHAPE);
    assert_int_equal(k3_nvfp4_quantize_weight(NULL, 1, 32, p, s, &ws2, &err), K3_ERR_ARG);
    assert_int_equal(k3_nvfp4_quantize_weight_gs(w, 1, 32, 0.0f, p, s, &err), K3_ERR_NUMERIC);
    assert_int_equal(k3_nvfp4_quantize_weight_gs(w, 1, 32, NAN, p, s, &err), K3_ERR_NUMERIC);
    assert_int_equal(k3_nvfp4_quantize_weight_gs(w, 1, 32, 1e-6f, p, s, &err), K3_ERR_NUMERIC);
    assert_non_null(strstr(err.msg, "exceeds"));
    float tiny[16] = {1e-40f};
    assert_int_equal(k3_nvfp4_quantize_weight(tiny, 1, 16, p, s, &ws2, &err), K3_ERR_NUMERIC);
}

/* ---- NVFP4 activations ------------------------------------------------------------- */

static void test_nvfp4_act_bounds(void **state) {
    (void)state;
    seed();
    const int64_t C = 256, NB = C / 16;
    float *x = make_matrix(1, C);
    float amax = 0;
    for (int64_t c = 0; c < C; c++)
        amax = fmaxf(amax, fabsf(x[c]));
    const float g = 2688.0f / amax;
    uint8_t *packed = guarded((size_t)C / 2), *scales = guarded((size_t)NB);
    float deq[256];
    k3_nvfp4_quantize_act_row(x, C, g, packed, scales);
    assert_guard(packed, (size_t)C / 2);
    assert_guard(scales, (size_t)NB);
    k3_nvfp4_dequantize_row(packed, scales, C, 1.0f / g, deq);
    for (int64_t c = 0; c < C; c++) {
        double S = (double)k3_e4m3_to_f32(scales[c / 16]) / g;
        /* saturation beyond 6 (and a block whose scale rounds to 0, whose codes are 0) is
         * bounded by the E4M3 rounding of g * amax / 6: 2^-4 relative, 2^-10 absolute. */
        double q = S > 0 ? fabs(x[c]) / S : INFINITY;
        double bound = q <= 6 ? halfstep(q) * S * (1 + 1e-6)
                              : fmax(6 * S * 0x1p-4, 6 * 0x1p-10 / g) * (1 + 1e-6);
        double e = fabs((double)x[c] - deq[c]);
        if (!(e <= bound))
            fail_msg("act [%lld]: |%g - %g| > %g", (long long)c, (double)x[c], (double)deq[c],
                     bound);
    }
    x[37] = NAN;
    x[200] = INFINITY;
    k3_nvfp4_quantize_act_row(x, C, g, packed, scales);
    k3_nvfp4_dequantize_row(packed, scales, C, 1.0f / g, deq);
    for (int64_t c = 0; c < C; c++) {
        int bad_block = c / 16 == 37 / 16 || c / 16 == 200 / 16;
        assert_int_equal(!!isnan(deq[c]), bad_block); /* NaN never becomes a finite value */
    }
    free(x), free(packed), free(scales);
}

/* ---- MXFP4 / MXFP8 -------------------------------------------------------------------- */

static void test_mxfp4_bounds_and_requant(void **state) {
    (void)state;
    seed();
    const int64_t R = 7, C = 192, NB = C / 32;
    float *w = make_matrix(R, C);
    uint8_t *packed = guarded((size_t)(R * C / 2)), *scales = guarded((size_t)(R * NB));
    float *deq = malloc((size_t)(R * C) * sizeof *deq),
          *deq2 = malloc((size_t)(R * C) * sizeof *deq);
    k3_error err = {0};
    assert_int_equal(k3_mxfp4_quantize(w, R, C, packed, scales, &err), K3_OK);
    assert_guard(packed, (size_t)(R * C / 2));
    assert_guard(scales, (size_t)(R * NB));
    for (int64_t r = 0; r < R; r++) {
        k3_mxfp4_dequantize_row(packed + r * C / 2, scales + r * NB, C, deq + r * C);
        for (int64_t c = 0; c < C; c++) {
            double S = ldexp(1.0, scales[r * NB + c / 32] - 127);
            double e = fabs((double)w[r * C + c] - deq[r * C + c]);
            /* no saturation: 2^e >= amax/6 */
            double bound = halfstep(fabs(w[r * C + c]) / S) * S;
            assert_true(fabs(w[r * C + c]) / S <= 6.0);
            if (!(e <= bound))
                fail_msg("mxfp4 [%lld, %lld]: %g > %g", (long long)r, (long long)c, e, bound);
        }
    }
    /* dequant(quant(dequant(q))) == dequant(q) for every block (codes may move between
     * (3, 2^e) and (6, 2^(e-1)), values do not). */
    assert_int_equal(k3_mxfp4_quantize(deq, R, C, packed, scales, &err), K3_OK);
    for (int64_t r = 0; r < R; r++)
        k3_mxfp4_dequantize_row(packed + r * C / 2, scales + r * NB, C, deq2 + r * C);
    for (int64_t i = 0; i < R * C; i++)
        assert_true(deq2[i] == deq[i]);
    w[3 * C + 100] = NAN;
    assert_int_equal(k3_mxfp4_quantize(w, R, C, packed, scales, &err), K3_ERR_NUMERIC);
    assert_non_null(strstr(err.msg, "[3, 100]"));
    assert_int_equal(k3_mxfp4_quantize(w, R, 48, packed, scales, &err), K3_ERR_SHAPE);
    free(w), free(deq), free(deq2), free(packed), free(scales);
}

static void test_mxfp8_bounds(void **state) {
    (void)state;
    seed();
    const int64_t C = 320, NB = C / 32;
    float *x = make_matrix(1, C), deq[320];
    uint8_t *q = guarded((size_t)C), *scales = guarded((size_t)NB);
    x[7] = 3e38f; /* exponent near the top of E8M0 */
    k3_mxfp8_quantize_row(x, C, q, scales);
    assert_guard(q, (size_t)C);
    assert_guard(scales, (size_t)NB);
    k3_mxfp8_dequantize_row(q, scales, C, deq);
    for (int64_t c = 0; c < C; c++) {
        double S = ldexp(1.0, scales[c / 32] - 127);
        double bound = fmax(0x1p-4 * fabs(x[c]), 0x1p-10 * S);
        double e = fabs((double)x[c] - deq[c]);
        if (!(e <= bound))
            fail_msg("mxfp8 [%lld]: %g > %g", (long long)c, e, bound);
    }
    x[40] = -INFINITY;
    k3_mxfp8_quantize_row(x, C, q, scales);
    k3_mxfp8_dequantize_row(q, scales, C, deq);
    assert_int_equal(scales[1], 0xFF);
    for (int64_t c = 0; c < C; c++)
        assert_int_equal(!!isnan(deq[c]), c / 32 == 1);
    free(x), free(q), free(scales);
}

/* Scales at the bottom of E8M0 and of float32: MXFP4 blocks whose amax/6 is a float32
 * subnormal (the exponent from the subnormal bits, and the clamp at 2^-127), and an FP8 block
 * whose scale would underflow to 0 (refused, not divided by). */
static void test_subnormal_scales(void **state) {
    (void)state;
    float w[96] = {0};
    w[0] = 1e-40f;       /* amax/6 ~ 2^-135.8: clamps to 2^-127, byte 0; rounds to 0 */
    w[32] = 0x1.2p-124f; /* amax/6 = 1.5 * 2^-127 (subnormal): 2^-126, byte 1 */
    w[33] = 0x1p-126f;   /* 1.0 in units of 2^-126: E2M1 code 2 */
    w[34] = -0x1p-127f;  /* -0.5: code 9 */
    w[64] = 0x1.8p-125f; /* amax/6 = 2^-127 exactly: byte 0, element 6.0 (code 7) */
    uint8_t *packed = guarded(48), *scales = guarded(3);
    k3_error err = {0};
    assert_int_equal(k3_mxfp4_quantize(w, 1, 96, packed, scales, &err), K3_OK);
    assert_guard(packed, 48);
    assert_guard(scales, 3);
    assert_int_equal(scales[0], 0);
    assert_int_equal(scales[1], 1);
    assert_int_equal(scales[2], 0);
    for (int i = 0; i < 16; i++)
        assert_int_equal(packed[i], 0);
    assert_int_equal(packed[16], 6 | 2 << 4); /* 4.5 ties to 4 (even), then 1.0 */
    assert_int_equal(packed[17] & 15, 9);
    assert_int_equal(packed[32] & 15, 7);
    float deq[96];
    k3_mxfp4_dequantize_row(packed, scales, 96, deq);
    assert_true(deq[0] == 0.0f && deq[32] == 0x1p-124f && deq[33] == 0x1p-126f &&
                deq[34] == -0x1p-127f && deq[64] == 0x1.8p-125f);

    float tiny[16] = {0}, s = -1.0f;
    uint8_t d[16];
    tiny[5] = 0x1p-149f; /* the smallest subnormal: amax/448 is 0 in float32 */
    assert_int_equal(k3_fp8_block_quantize(tiny, 1, 16, d, &s, &err), K3_ERR_NUMERIC);
    assert_non_null(strstr(err.msg, "underflows"));
    free(packed), free(scales);
}

/* ---- FP8 128x128 blocks ---------------------------------------------------------------- */

static void test_fp8_block_bounds_and_requant(void **state) {
    (void)state;
    seed();
    const int64_t R = 200, C = 272; /* ragged in both directions */
    const int64_t NS = ((R + 127) / 128) * ((C + 127) / 128);
    float *w = make_matrix(R, C);
    for (int64_t c = 0; c < C; c++)
        w[150 * C + c] *= 1e6f; /* one loud row in block row 1 */
    uint8_t *data = guarded((size_t)(R * C)), *sb = guarded((size_t)NS * 4);
    float *scales = (float *)(void *)sb;
    float *deq = malloc((size_t)(R * C) * sizeof *deq),
          *deq2 = malloc((size_t)(R * C) * sizeof *deq);
    k3_error err = {0};
    assert_int_equal(k3_fp8_block_quantize(w, R, C, data, scales, &err), K3_OK);
    assert_guard(data, (size_t)(R * C));
    assert_guard(sb, (size_t)NS * 4);
    for (int64_t r = 0; r < R; r++) {
        k3_fp8_block_dequantize_row(data, scales, R, C, r, deq + r * C);
        for (int64_t c = 0; c < C; c++) {
            double S = scales[(r / 128) * ((C + 127) / 128) + c / 128];
            double bound = fmax(0x1p-4 * fabs(w[r * C + c]), 0x1p-10 * S) * (1 + 1e-6);
            double e = fabs((double)w[r * C + c] - deq[r * C + c]);
            if (!(e <= bound))
                fail_msg("fp8 [%lld, %lld]: %g > %g", (long long)r, (long long)c, e, bound);
        }
    }
    /* Re-quantizing: the scale is recomputed from 448 * scale, so values agree to 2^-21. */
    assert_int_equal(k3_fp8_block_quantize(deq, R, C, data, scales, &err), K3_OK);
    for (int64_t r = 0; r < R; r++)
        k3_fp8_block_dequantize_row(data, scales, R, C, r, deq2 + r * C);
    for (int64_t i = 0; i < R * C; i++)
        if (!(fabs((double)deq2[i] - deq[i]) <= 0x1p-21 * fabs(deq[i])))
            fail_msg("fp8 requant [%lld]: %a vs %a", (long long)i, (double)deq2[i], (double)deq[i]);
    w[199 * C + 271] = INFINITY;
    assert_int_equal(k3_fp8_block_quantize(w, R, C, data, scales, &err), K3_ERR_NUMERIC);
    assert_non_null(strstr(err.msg, "[199, 271]"));
    float zero[4] = {0};
    assert_int_equal(k3_fp8_block_quantize(zero, 2, 2, data, scales, &err), K3_OK);
    assert_true(scales[0] == 1.0f);
    free(w), free(deq), free(deq2), free(data), free(sb);
}

/* ---- k3_qmat ------------------------------------------------------------------------ */

/* Independent decoders for the float64 check: ldexp formulas, no tables. */
static double ref_e2m1(unsigned c) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (c & 8) ? -mag[c & 7] : mag[c & 7];
}
static double ref_e4m3(unsigned c) {
    int e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return (c & 0x80) ? -v : v;
}

/* The float32 row of a block format through its own dequantizer in block.c (0 for formats
 * without one), so that dequantizer is held to the same exact oracle as k3_qmat_row_f32. */
static int block_row_f32(const k3_qmat *m, int64_t r, float *out) {
    const int64_t K = m->cols;
    switch (m->fmt) {
    case K3_WFMT_NVFP4:
        k3_nvfp4_dequantize_row((const uint8_t *)m->data + r * (K / 2),
                                (const uint8_t *)m->scale + r * (K / K3_NVFP4_BLOCK), K,
                                m->global_scale, out);
        return 1;
    case K3_WFMT_MXFP4:
        k3_mxfp4_dequantize_row((const uint8_t *)m->data + r * (K / 2),
                                (const uint8_t *)m->scale + r * (K / K3_MXFP4_BLOCK), K, out);
        return 1;
    case K3_WFMT_FP8_BLOCK:
        k3_fp8_block_dequantize_row(m->data, m->scale, m->rows, K, r, out);
        return 1;
    default:
        return 0;
    }
}

static void check_qmat(const k3_qmat *m, double (*ref)(const k3_qmat *, int64_t, int64_t)) {
    double *o64 = malloc((size_t)m->cols * sizeof *o64);
    float *o32 = malloc((size_t)m->cols * sizeof *o32);
    float *b32 = malloc((size_t)m->cols * sizeof *b32);
    for (int64_t r = 0; r < m->rows; r++) {
        k3_qmat_row_f64(m, r, o64);
        k3_qmat_row_f32(m, r, o32);
        int has_block = block_row_f32(m, r, b32);
        for (int64_t c = 0; c < m->cols; c++) {
            double want = ref(m, r, c);
            if (!(o64[c] == want))
                fail_msg("%s [%lld, %lld]: %a, want %a", k3_wfmt_name(m->fmt), (long long)r,
                         (long long)c, o64[c], want);
            float w32 = (float)want;
            assert_memory_equal(&o32[c], &w32, sizeof w32); /* f64 value rounded once */
            if (has_block)
                assert_memory_equal(&b32[c], &w32, sizeof w32);
        }
    }
    /* out-of-range rows are NaN, not a read past the end */
    k3_qmat_row_f64(m, m->rows, o64);
    k3_qmat_row_f32(m, -1, o32);
    for (int64_t c = 0; c < m->cols; c++)
        assert_true(isnan(o64[c]) && isnan(o32[c]));
    free(o64), free(o32), free(b32);
}

static double ref_nvfp4(const k3_qmat *m, int64_t r, int64_t c) {
    const uint8_t *p = m->data, *s = m->scale;
    uint8_t b = p[r * m->cols / 2 + c / 2];
    return ref_e2m1((c & 1) ? b >> 4 : b & 15) * ref_e4m3(s[r * m->cols / 16 + c / 16]) *
           (double)m->global_scale;
}
static double ref_mxfp4(const k3_qmat *m, int64_t r, int64_t c) {
    const uint8_t *p = m->data, *s = m->scale;
    uint8_t b = p[r * m->cols / 2 + c / 2];
    return ldexp(ref_e2m1((c & 1) ? b >> 4 : b & 15), s[r * m->cols / 32 + c / 32] - 127);
}
static double ref_fp8(const k3_qmat *m, int64_t r, int64_t c) {
    const uint8_t *d = m->data;
    const float *s = m->scale;
    return ref_e4m3(d[r * m->cols + c]) * (double)s[(r / 128) * ((m->cols + 127) / 128) + c / 128];
}
static double ref_bf16(const k3_qmat *m, int64_t r, int64_t c) {
    uint16_t b = ((const uint16_t *)m->data)[r * m->cols + c];
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static double ref_f16(const k3_qmat *m, int64_t r, int64_t c) {
    uint16_t h = ((const uint16_t *)m->data)[r * m->cols + c];
    int e = (h >> 10) & 31, mm = h & 0x3FF;
    double v = e == 0 ? ldexp(mm, -24) : ldexp(1024 + mm, e - 25);
    return (h & 0x8000) ? -v : v;
}
static double ref_f32(const k3_qmat *m, int64_t r, int64_t c) {
    return ((const float *)m->data)[r * m->cols + c];
}

static void test_qmat_rows(void **state) {
    (void)state;
    seed();
    const int64_t R = 130, C = 288;
    float *w = make_matrix(R, C);
    uint8_t *packed = malloc((size_t)(R * C)), *sc = malloc((size_t)(R * C));
    float *fsc = malloc(64 * sizeof *fsc), ws2;
    uint16_t *h = malloc((size_t)(R * C) * 2);
    k3_error err = {0};

    assert_int_equal(k3_nvfp4_quantize_weight(w, R, C, packed, sc, &ws2, &err), K3_OK);
    k3_qmat m = {.fmt = K3_WFMT_NVFP4,
                 .rows = R,
                 .cols = C,
                 .data = packed,
                 .scale = sc,
                 .global_scale = ws2};
    check_qmat(&m, ref_nvfp4);
    assert_int_equal(k3_qmat_data_bytes(&m), R * C / 2);
    assert_int_equal(k3_qmat_scale_bytes(&m), R * C / 16);

    assert_int_equal(k3_mxfp4_quantize(w, R, C, packed, sc, &err), K3_OK);
    m = (k3_qmat){
        .fmt = K3_WFMT_MXFP4, .rows = R, .cols = C, .data = packed, .scale = sc, .global_scale = 1};
    check_qmat(&m, ref_mxfp4);
    assert_int_equal(k3_qmat_scale_bytes(&m), R * C / 32);

    assert_int_equal(k3_fp8_block_quantize(w, R, C, packed, fsc, &err), K3_OK);
    m = (k3_qmat){.fmt = K3_WFMT_FP8_BLOCK,
                  .rows = R,
                  .cols = C,
                  .data = packed,
                  .scale = fsc,
                  .global_scale = 1};
    check_qmat(&m, ref_fp8);
    assert_int_equal(k3_qmat_data_bytes(&m), R * C);
    assert_int_equal(k3_qmat_scale_bytes(&m), 2 * 3 * 4);

    for (int64_t i = 0; i < R * C; i++)
        h[i] = k3_f32_to_bf16(w[i]);
    m = (k3_qmat){.fmt = K3_WFMT_BF16, .rows = R, .cols = C, .data = h, .global_scale = 1};
    check_qmat(&m, ref_bf16);
    assert_int_equal(k3_qmat_data_bytes(&m), R * C * 2);
    assert_int_equal(k3_qmat_scale_bytes(&m), 0);
    for (int64_t i = 0; i < R * C; i++)
        h[i] = k3_f32_to_f16(w[i]);
    m.fmt = K3_WFMT_F16;
    check_qmat(&m, ref_f16);
    m = (k3_qmat){.fmt = K3_WFMT_F32, .rows = R, .cols = C, .data = w, .global_scale = 1};
    check_qmat(&m, ref_f32);
    assert_int_equal(k3_qmat_data_bytes(&m), R * C * 4);

    /* unreadable descriptions fill NaN instead of reading out of bounds */
    double o[288];
    m = (k3_qmat){.fmt = K3_WFMT_NVFP4, .rows = R, .cols = 40, .data = packed, .scale = sc};
    k3_qmat_row_f64(&m, 0, o);
    for (int c = 0; c < 40; c++)
        assert_true(isnan(o[c]));
    m = (k3_qmat){.fmt = K3_WFMT_MXFP4, .rows = R, .cols = C, .data = packed, .scale = NULL};
    k3_qmat_row_f64(&m, 0, o);
    assert_true(isnan(o[0]) && isnan(o[C - 1]));
    m = (k3_qmat){.fmt = K3_WFMT_COUNT, .rows = R, .cols = C, .data = packed};
    k3_qmat_row_f64(&m, 0, o);
    assert_true(isnan(o[0]));
    assert_string_equal(k3_wfmt_name(K3_WFMT_FP8_BLOCK), "fp8-block");
    assert_string_equal(k3_wfmt_name(K3_WFMT_COUNT), "unknown");
    for (int f = 0; f < K3_WFMT_COUNT; f++)
        assert_string_not_equal(k3_wfmt_name((k3_wfmt)f), "unknown");
    free(w), free(packed), free(sc), free(fsc), free(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nvfp4_weight_bounds_and_requant),
        cmocka_unit_test(test_nvfp4_weight_zero_and_errors),
        cmocka_unit_test(test_nvfp4_act_bounds),
        cmocka_unit_test(test_mxfp4_bounds_and_requant),
        cmocka_unit_test(test_mxfp8_bounds),
        cmocka_unit_test(test_fp8_block_bounds_and_requant),
        cmocka_unit_test(test_subnormal_scales),
        cmocka_unit_test(test_qmat_rows),
    };
    return cmocka_run_group_tests_name("formats_block", tests, NULL, NULL);
}
