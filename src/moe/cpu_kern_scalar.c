/* The portable row kernels: plain C, natural input order. The reference for what the SIMD
 * kernels compute (same per-block grouping: unscaled partial sum of a block, then times the
 * block scale), and the path on CPUs without AVX2. */
#include "moe/cpu_kern.h"

#include <string.h>

#include "formats/fp.h"


static void fp4_dot(const uint8_t *q, const uint8_t *sc, const float *stab, int block,
                    int64_t K, const float *const *xs, int nt, float *out) {
    float acc[K3_CPU_NT] = {0};
    for (int64_t b0 = 0; b0 < K; b0 += block) {
        float s = stab[sc[b0 / block]];
        for (int j = 0; j < nt; j++) {
            const float *x = xs[j] + b0;
            float p = 0.0f;
            for (int i = 0; i < block; i += 2) {
                uint8_t byte = q[(b0 + i) / 2];
                p += k3_e2m1_lut[byte & 15] * x[i];
                p += k3_e2m1_lut[byte >> 4] * x[i + 1];
            }
            acc[j] += p * s;
        }
    }
    for (int j = 0; j < nt; j++) out[j] = acc[j];
}

/* Every product (exact in float: E2M1 x a quantized activation) goes into the float64 sum on
 * its own: a float sum over a 32-element MXFP8 block could round (cpu_kern_avx512.c). */
static void fp4_dot64(const uint8_t *q, const uint8_t *sc, const float *stab, int block,
                      int64_t K, const float *const *xs, int nt, double *out) {
    double acc[K3_CPU_NT] = {0};
    for (int64_t b0 = 0; b0 < K; b0 += block) {
        double s = stab[sc[b0 / block]];
        for (int j = 0; j < nt; j++) {
            const float *x = xs[j] + b0;
            double p = 0.0;
            for (int i = 0; i < block; i += 2) {
                uint8_t byte = q[(b0 + i) / 2];
                p += (double)(k3_e2m1_lut[byte & 15] * x[i]);
                p += (double)(k3_e2m1_lut[byte >> 4] * x[i + 1]);
            }
            acc[j] += p * s;
        }
    }
    for (int j = 0; j < nt; j++) out[j] = acc[j];
}

static void nvfp4_dot64(const uint8_t *q, const uint8_t *sc, int64_t K, const float *const *xs,
                        int nt, double *out) {
    fp4_dot64(q, sc, k3_e4m3_lut, 16, K, xs, nt, out);
}

static void mxfp4_dot64(const uint8_t *q, const uint8_t *sc, int64_t K, const float *const *xs,
                        int nt, double *out) {
    fp4_dot64(q, sc, k3_e8m0_lut, 32, K, xs, nt, out);
}

static void nvfp4_dot(const uint8_t *q, const uint8_t *sc, int64_t K, const float *const *xs,
                      int nt, float *out) {
    fp4_dot(q, sc, k3_e4m3_lut, 16, K, xs, nt, out);
}

static void mxfp4_dot(const uint8_t *q, const uint8_t *sc, int64_t K, const float *const *xs,
                      int nt, float *out) {
    fp4_dot(q, sc, k3_e8m0_lut, 32, K, xs, nt, out);
}

static void bf16_dot(const uint8_t *row, const uint8_t *sc, int64_t K, const float *const *xs,
                     int nt, float *out) {
    (void)sc;
    for (int j = 0; j < nt; j++) {
        float acc = 0.0f;
        for (int64_t c = 0; c < K; c++) {
            uint16_t b;
            memcpy(&b, row + 2 * c, 2);
            acc += k3_bf16_to_f32(b) * xs[j][c];
        }
        out[j] = acc;
    }
}

static void f32_dot(const uint8_t *row, const uint8_t *sc, int64_t K, const float *const *xs,
                    int nt, float *out) {
    (void)sc;
    for (int j = 0; j < nt; j++) {
        float acc = 0.0f;
        for (int64_t c = 0; c < K; c++) {
            float w;
            memcpy(&w, row + 4 * c, 4);
            acc += w * xs[j][c];
        }
        out[j] = acc;
    }
}

const k3_cpu_kern k3_cpu_kern_scalar = {
    .name = "scalar", .fp4_layout = K3_FP4_NATURAL, .nvfp4 = nvfp4_dot, .mxfp4 = mxfp4_dot,
    .bf16 = bf16_dot, .f32 = f32_dot, .nvfp4_64 = nvfp4_dot64, .mxfp4_64 = mxfp4_dot64,
};
