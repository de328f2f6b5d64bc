/* Number formats: every code of every format of 8 bits or fewer decoded and re-encoded,
 * round-to-nearest-even ties, saturation, NaN/Inf, subnormals and -0 against a brute-force
 * oracle written here (nearest representable value in double, ties to the even code), and
 * exhaustive FP16/BF16 round trips. The block formats (NVFP4, MXFP4, MXFP8, FP8 block) are
 * in test_formats_block.c; bit-exactness against ModelOpt's rules is in
 * tests/py/test_formats_oracle.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "formats/fp.h"

/* ---- independent decoders (ldexp, not tables or bit tricks) ------------------------- */

static double ref_minifloat(unsigned code, int ebits, int mbits, int bias) {
    int s = (code >> (ebits + mbits)) & 1;
    int e = (int)((code >> mbits) & ((1u << ebits) - 1));
    int m = (int)(code & ((1u << mbits) - 1));
    double v = e == 0 ? ldexp(m, 1 - bias - mbits) : ldexp((1 << mbits) + m, e - bias - mbits);
    return s ? -v : v;
}

typedef struct fmt {
    const char *name;
    int ebits, mbits, bias, ncodes;
    unsigned maxpos;   /* largest finite positive code */
    unsigned signmask; /* sign bit of a code */
    int has_inf;       /* overflow rounds to Inf (E5M2) rather than saturating */
    float (*dec)(uint8_t);
    uint8_t (*enc)(float);
} fmt;

static float dec_e2m1(uint8_t c) {
    return k3_e2m1_to_f32(c);
}
static float dec_e4m3(uint8_t c) {
    return k3_e4m3_to_f32(c);
}
static float dec_e5m2(uint8_t c) {
    return k3_e5m2_to_f32(c);
}

static const fmt FMTS[] = {
    {"e2m1", 2, 1, 1, 16, 0x7, 0x8, 0, dec_e2m1, k3_f32_to_e2m1},
    {"e4m3", 4, 3, 7, 256, 0x7E, 0x80, 0, dec_e4m3, k3_f32_to_e4m3},
    {"e5m2", 5, 2, 15, 256, 0x7B, 0x80, 1, dec_e5m2, k3_f32_to_e5m2},
};

/* Brute force: nearest finite positive code to |x| in double, ties to the even code;
 * beyond the top, saturate or (E5M2) round to Inf past the midpoint max..2^(emax+1). */
static unsigned ref_encode(const fmt *f, float x) {
    unsigned sign = signbit(x) ? f->signmask : 0;
    double a = fabs((double)x);
    double top = ref_minifloat(f->maxpos, f->ebits, f->mbits, f->bias);
    if (f->has_inf) {
        double next = ldexp(1.0, (int)((f->maxpos >> f->mbits) + 1) - f->bias); /* 2^16 */
        if (a >= (top + next) / 2)
            return sign | (f->maxpos + 1); /* Inf code */
    }
    if (a >= top)
        return sign | f->maxpos;
    unsigned best = 0;
    for (unsigned c = 1; c <= f->maxpos; c++) {
        double dc = fabs(ref_minifloat(c, f->ebits, f->mbits, f->bias) - a);
        double db = fabs(ref_minifloat(best, f->ebits, f->mbits, f->bias) - a);
        if (dc < db || (dc == db && (c & 1) == 0))
            best = c;
    }
    return sign | best;
}

static void check_encode(const fmt *f, float x, int *fails) {
    unsigned want = ref_encode(f, x), got = f->enc(x);
    if (want != got && (*fails)++ < 10)
        fprintf(stderr, "%s: encode(%a) = 0x%02x, want 0x%02x\n", f->name, x, got, want);
}

static int is_nan_code(const fmt *f, unsigned c) {
    unsigned mag = c & (f->signmask - 1);
    if (f->ncodes == 16)
        return 0;
    if (f->has_inf)
        return mag > f->maxpos + 1;
    return mag > f->maxpos;
}

/* Every code decodes to the ldexp formula and re-encodes to itself; NaN codes decode to NaN. */
static void test_minifloat_all_codes(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof FMTS / sizeof FMTS[0]; i++) {
        const fmt *f = &FMTS[i];
        int fails = 0, seen = 0;
        for (int c = 0; c < f->ncodes; c++) {
            float v = f->dec((uint8_t)c);
            unsigned mag = (unsigned)c & (f->signmask - 1);
            if (is_nan_code(f, (unsigned)c)) {
                assert_true(isnan(v));
                assert_int_equal(f->enc(v), 0x7F);
                seen++;
                continue;
            }
            if (f->has_inf && mag == f->maxpos + 1) {
                assert_true(isinf(v));
                assert_int_equal(!!signbit(v), !!(c & f->signmask));
                assert_int_equal(f->enc(v), (unsigned)c);
                seen++;
                continue;
            }
            double want = ref_minifloat((unsigned)c, f->ebits, f->mbits, f->bias);
            assert_true((double)v == want);
            assert_int_equal(!!signbit(v), !!(c & f->signmask)); /* -0 keeps its sign */
            if (f->enc(v) != (unsigned)c && fails++ < 10)
                fprintf(stderr, "%s: code 0x%02x -> %a -> 0x%02x\n", f->name, c, v, f->enc(v));
            seen++;
        }
        assert_int_equal(fails, 0);
        assert_int_equal(seen, f->ncodes); /* coverage: every code visited */
    }
}

/* Midpoints between adjacent finite codes (exact in float: at most mbits+2 significant bits),
 * their float neighbours, values just inside/outside the top, and random floats. */
static void test_minifloat_rounding(void **state) {
    (void)state;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < sizeof FMTS / sizeof FMTS[0]; i++) {
        const fmt *f = &FMTS[i];
        int fails = 0, ties = 0;
        for (unsigned c = 0; c < f->maxpos; c++) {
            float lo = f->dec((uint8_t)c), hi = f->dec((uint8_t)(c + 1));
            float mid = (float)(((double)lo + (double)hi) / 2);
            assert_true((double)mid == ((double)lo + (double)hi) / 2);
            for (int s = 0; s < 2; s++) {
                float sg = s ? -1.0f : 1.0f;
                float xs[] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), lo, hi};
                for (size_t k = 0; k < 5; k++)
                    check_encode(f, sg * xs[k], &fails);
            }
            /* The tie goes to the even code, below and above go to the neighbours. */
            unsigned even = (c & 1) ? c + 1 : c;
            if (f->enc(mid) != even && fails++ < 10)
                fprintf(stderr, "%s: tie %a -> 0x%02x want 0x%02x\n", f->name, mid, f->enc(mid),
                        even);
            if (f->enc(nextafterf(mid, 0)) != c)
                fails++;
            if (f->enc(nextafterf(mid, INFINITY)) != c + 1)
                fails++;
            ties++;
        }
        float top = f->dec((uint8_t)f->maxpos);
        float probes[] = {top,
                          nextafterf(top, INFINITY),
                          top * 1.03125f,
                          top * 1.0625f,
                          top * 1.09375f,
                          top * 1.125f,
                          top * 1.2f,
                          top * 4.0f,
                          3e38f,
                          INFINITY,
                          1e-30f,
                          1e-45f,
                          0.0f,
                          -0.0f,
                          FLT_MIN};
        for (size_t k = 0; k < sizeof probes / sizeof probes[0]; k++) {
            check_encode(f, probes[k], &fails);
            check_encode(f, -probes[k], &fails);
        }
        for (int n = 0; n < 20000; n++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t bits = (uint32_t)(rng >> 32);
            /* exponent within the format's range +- a few binades, any mantissa */
            int span = (1 << f->ebits) + f->mbits + 6;
            int e = (int)((rng >> 8) % (uint64_t)span) - f->bias - f->mbits - 3;
            float x = ldexpf(1.0f + (float)(bits & 0x7FFFFF) * 0x1p-23f, e);
            check_encode(f, (bits >> 31) ? -x : x, &fails);
        }
        assert_int_equal(fails, 0);
        assert_int_equal(ties, (int)f->maxpos);
    }
}

static void test_minifloat_specials(void **state) {
    (void)state;
    /* E2M1 saturates at 6 and has no NaN code; the sign of x is kept, -0 included. */
    assert_int_equal(k3_f32_to_e2m1(6.5f), 0x7);
    assert_int_equal(k3_f32_to_e2m1(1e30f), 0x7);
    assert_int_equal(k3_f32_to_e2m1(INFINITY), 0x7);
    assert_int_equal(k3_f32_to_e2m1(-INFINITY), 0xF);
    assert_int_equal(k3_f32_to_e2m1(-0.0f), 0x8);
    assert_int_equal(k3_f32_to_e2m1(-0.1f), 0x8);
    assert_int_equal(k3_f32_to_e2m1(NAN) & 7, 0);
    /* E4M3fn: no Inf; saturation at 448 for everything finite or infinite; NaN is 0x7F. */
    assert_int_equal(k3_f32_to_e4m3(448.0f), 0x7E);
    assert_int_equal(k3_f32_to_e4m3(463.99f), 0x7E);
    assert_int_equal(k3_f32_to_e4m3(464.0f), 0x7E);
    assert_int_equal(k3_f32_to_e4m3(1e9f), 0x7E);
    assert_int_equal(k3_f32_to_e4m3(-1e9f), 0xFE);
    assert_int_equal(k3_f32_to_e4m3(INFINITY), 0x7E);
    assert_int_equal(k3_f32_to_e4m3(-INFINITY), 0xFE);
    assert_int_equal(k3_f32_to_e4m3(NAN), 0x7F);
    assert_int_equal(k3_f32_to_e4m3(-NAN), 0x7F);
    assert_true(isnan(k3_e4m3_to_f32(0x7F)) && isnan(k3_e4m3_to_f32(0xFF)));
    assert_true(k3_e4m3_to_f32(0x01) == 0x1p-9f);      /* smallest subnormal */
    assert_true(k3_e4m3_to_f32(0x08) == 0x1p-6f);      /* smallest normal */
    assert_int_equal(k3_f32_to_e4m3(0x1p-10f), 0x00);  /* tie 0 / 2^-9 -> even 0 */
    assert_int_equal(k3_f32_to_e4m3(0x1.8p-9f), 0x02); /* tie 2^-9 / 2^-8 -> even */
    assert_int_equal(k3_f32_to_e4m3(-0.0f), 0x80);
    /* E5M2: IEEE overflow to Inf at the midpoint 61440, NaN 0x7F. */
    assert_int_equal(k3_f32_to_e5m2(57344.0f), 0x7B);
    assert_int_equal(k3_f32_to_e5m2(61439.0f), 0x7B);
    assert_int_equal(k3_f32_to_e5m2(61440.0f), 0x7C);
    assert_int_equal(k3_f32_to_e5m2(-INFINITY), 0xFC);
    assert_int_equal(k3_f32_to_e5m2(NAN), 0x7F);
    assert_true(k3_e5m2_to_f32(0x01) == 0x1p-16f);
}

static void test_e8m0(void **state) {
    (void)state;
    for (int c = 0; c < 256; c++) {
        float v = k3_e8m0_to_f32((uint8_t)c);
        if (c == 255) {
            assert_true(isnan(v));
            continue;
        }
        assert_true((double)v == ldexp(1.0, c - 127)); /* c == 0: 2^-127, a subnormal */
        assert_int_equal(k3_e8m0_from_exp(c - 127), c);
    }
    assert_int_equal(k3_e8m0_from_exp(-128), 0);
    assert_int_equal(k3_e8m0_from_exp(-100000), 0);
    assert_int_equal(k3_e8m0_from_exp(128), 254);
    assert_int_equal(k3_e8m0_from_exp(100000), 254);
}

/* All 65536 codes: decode matches the ldexp formula, re-encodes to itself (NaN stays NaN,
 * quiet); every midpoint of adjacent finite codes rounds to the even code, its neighbours
 * to the nearer code. */
static void test_f16_exhaustive(void **state) {
    (void)state;
    int fails = 0;
    for (uint32_t c = 0; c < 65536; c++) {
        float v = k3_f16_to_f32((uint16_t)c);
        unsigned e = (c >> 10) & 31;
        if (e == 31 && (c & 0x3FF)) {
            assert_true(isnan(v));
            uint16_t r = k3_f32_to_f16(v);
            assert_true((r & 0x7C00) == 0x7C00 && (r & 0x3FF) && (r & 0x200));
            assert_int_equal(r & 0x8000, c & 0x8000);
            continue;
        }
        double want = e == 31 ? INFINITY : ref_minifloat(c & 0x7FFF, 5, 10, 15);
        if (c & 0x8000)
            want = -want;
        if (!((double)v == want) || !!signbit(v) != !!(c & 0x8000))
            fails++;
        if (k3_f32_to_f16(v) != c)
            fails++;
        if ((c & 0x7FFF) < 0x7BFF) { /* midpoint to the next code up */
            float hi = k3_f16_to_f32((uint16_t)(c + 1));
            float mid = (float)(((double)v + (double)hi) / 2);
            uint16_t even = (c & 1) ? (uint16_t)(c + 1) : (uint16_t)c;
            if (k3_f32_to_f16(mid) != even)
                fails++;
            if (k3_f32_to_f16(nextafterf(mid, (c & 0x8000) ? -INFINITY : INFINITY)) != c + 1)
                fails++;
            if (k3_f32_to_f16(nextafterf(mid, 0)) != c)
                fails++;
        }
    }
    assert_int_equal(fails, 0);
    assert_int_equal(k3_f32_to_f16(65504.0f), 0x7BFF);
    assert_int_equal(k3_f32_to_f16(65519.996f), 0x7BFF);
    assert_int_equal(k3_f32_to_f16(65520.0f), 0x7C00); /* tie with 2^16 -> Inf */
    assert_int_equal(k3_f32_to_f16(-1e30f), 0xFC00);
    assert_int_equal(k3_f32_to_f16(0x1p-25f), 0x0000); /* tie 0 / min subnormal -> 0 */
    assert_int_equal(k3_f32_to_f16(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    assert_int_equal(k3_f32_to_f16(0x1.8p-24f), 0x0002);
    assert_int_equal(k3_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(k3_f32_to_f16(1e-45f), 0x0000);
}

static void test_bf16_exhaustive(void **state) {
    (void)state;
    int fails = 0;
    for (uint32_t c = 0; c < 65536; c++) {
        float v = k3_bf16_to_f32((uint16_t)c);
        unsigned e = (c >> 7) & 255;
        if (e == 255 && (c & 0x7F)) {
            assert_true(isnan(v));
            uint16_t r = k3_f32_to_bf16(v);
            assert_true((r & 0x7F80) == 0x7F80 && (r & 0x40));
            continue;
        }
        double want = e == 255 ? INFINITY : ref_minifloat(c & 0x7FFF, 8, 7, 127);
        if (c & 0x8000)
            want = -want;
        if (!((double)v == want) || !!signbit(v) != !!(c & 0x8000))
            fails++;
        if (k3_f32_to_bf16(v) != c)
            fails++;
        if ((c & 0x7FFF) < 0x7F7F) {
            float hi = k3_bf16_to_f32((uint16_t)(c + 1));
            float mid = (float)(((double)v + (double)hi) / 2);
            uint16_t even = (c & 1) ? (uint16_t)(c + 1) : (uint16_t)c;
            if (k3_f32_to_bf16(mid) != even)
                fails++;
            if (k3_f32_to_bf16(nextafterf(mid, (c & 0x8000) ? -INFINITY : INFINITY)) != c + 1)
                fails++;
            if (k3_f32_to_bf16(nextafterf(mid, 0)) != c)
                fails++;
        }
    }
    assert_int_equal(fails, 0);
    assert_int_equal(k3_f32_to_bf16(FLT_MAX), 0x7F80); /* rounds past the top: Inf */
    assert_int_equal(k3_f32_to_bf16(-INFINITY), 0xFF80);
    assert_int_equal(k3_f32_to_bf16(1e-45f), 0x0000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minifloat_all_codes), cmocka_unit_test(test_minifloat_rounding),
        cmocka_unit_test(test_minifloat_specials),  cmocka_unit_test(test_e8m0),
        cmocka_unit_test(test_f16_exhaustive),      cmocka_unit_test(test_bf16_exhaustive),
    };
    return cmocka_run_group_tests_name("formats", tests, NULL, NULL);
}
