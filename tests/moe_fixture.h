/* Test fixture shared by the MoE tests (reference, CPU and GPU backends): a bank of E random
 * experts with float32 masters (x ~ N(0,1)*0.5-style data, weights ~ N(0,1)*0.05, as
 * TensorRT-LLM's K3 test), stored in one weight format through the real quantizers, plus a
 * float64 computation straight from the masters (the "unquantized golden" of moe.md §4.1).
 *
 * Header-only (static functions) so each test binary includes it without a Makefile rule.
 * NVFP4 banks get input_scale = 1.0 (what nvidia/Kimi-K3-NVFP4 ships). */
#ifndef K3_TEST_MOE_FIXTURE_H
#define K3_TEST_MOE_FIXTURE_H

#include "formats/block.h"
#include "formats/fp.h"
#include "moe/activation.h"
#include "moe/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- deterministic random numbers (xorshift64*, Box-Muller) ------------------------- */

typedef struct fx_rng {
    uint64_t s;
} fx_rng;

static inline double fx_uniform(fx_rng *r) {
    r->s ^= r->s >> 12, r->s ^= r->s << 25, r->s ^= r->s >> 27;
    return (double)((r->s * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}
static inline double fx_normal(fx_rng *r) {
    double u = fx_uniform(r), v = fx_uniform(r);
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}
static inline void fx_fill_normal(fx_rng *r, float *x, size_t n, double sd) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(fx_normal(r) * sd);
}

/* ---- the bank ----------------------------------------------------------------------- */

typedef struct moe_fixture {
    int E, H, I;
    k3_wfmt fmt;
    float *w1m, *w3m, *w2m; /* masters: [E][I*H], [E][I*H], [E][H*I] */
    void *store[3];         /* per matrix kind: E contiguous copies in fmt */
    uint8_t *scl[3];        /* block scales (NVFP4/MXFP4) */
    float *alpha, *beta;    /* [E] activation params */
    k3_expert *e;
    k3_experts ex; /* all E experts local */
} moe_fixture;

static inline void fx_free(moe_fixture *f) {
    free(f->w1m), free(f->w3m), free(f->w2m), free(f->alpha), free(f->beta), free(f->e);
    for (int i = 0; i < 3; i++)
        free(f->store[i]), free(f->scl[i]);
    memset(f, 0, sizeof *f);
}

/* Stores master m [rows, cols] in f->fmt into slot q of kind `kind`; fills *out. */
static inline int fx_store(moe_fixture *f, int kind, int idx, const float *m, int64_t rows,
                           int64_t cols, k3_qmat *out) {
    size_t n = (size_t)(rows * cols);
    *out = (k3_qmat){.fmt = f->fmt, .rows = rows, .cols = cols, .global_scale = 1.0f};
    k3_error err = {0};
    switch (f->fmt) {
    case K3_WFMT_F32: {
        float *d = (float *)f->store[kind] + n * (size_t)idx;
        memcpy(d, m, n * sizeof *d);
        out->data = d;
        return 0;
    }
    case K3_WFMT_BF16: {
        uint16_t *d = (uint16_t *)f->store[kind] + n * (size_t)idx;
        for (size_t i = 0; i < n; i++)
            d[i] = k3_f32_to_bf16(m[i]);
        out->data = d;
        return 0;
    }
    case K3_WFMT_NVFP4: {
        uint8_t *d = (uint8_t *)f->store[kind] + n / 2 * (size_t)idx;
        uint8_t *s = f->scl[kind] + n / 16 * (size_t)idx;
        float ws2;
        if (k3_nvfp4_quantize_weight(m, rows, cols, d, s, &ws2, &err))
            return -1;
        out->data = d, out->scale = s, out->global_scale = ws2, out->input_scale = 1.0f;
        return 0;
    }
    case K3_WFMT_MXFP4: {
        uint8_t *d = (uint8_t *)f->store[kind] + n / 2 * (size_t)idx;
        uint8_t *s = f->scl[kind] + n / 32 * (size_t)idx;
        if (k3_mxfp4_quantize(m, rows, cols, d, s, &err))
            return -1;
        out->data = d, out->scale = s;
        return 0;
    }
    default:
        return -1;
    }
}

/* A bank of E experts [H -> I -> H] with activation `act` (arrays alpha = bg, beta = bl for
 * every expert when act needs them). Returns 0 or -1. */
static inline int fx_build(moe_fixture *f, int E, int H, int I, k3_wfmt fmt, k3_act act, float bg,
                           float bl, uint64_t seed) {
    memset(f, 0, sizeof *f);
    f->E = E, f->H = H, f->I = I, f->fmt = fmt;
    size_t n = (size_t)H * (size_t)I, tot = n * (size_t)E;
    fx_rng r = {seed * 0x9E3779B97F4A7C15ull + 1};
    f->w1m = malloc(tot * sizeof(float)), f->w3m = malloc(tot * sizeof(float));
    f->w2m = malloc(tot * sizeof(float));
    size_t esz = fmt == K3_WFMT_F32 ? 4 : fmt == K3_WFMT_BF16 ? 2 : 1;
    for (int k = 0; k < 3; k++) {
        f->store[k] = malloc(tot * esz);
        f->scl[k] = malloc(tot / 16 + 1);
    }
    f->alpha = malloc((size_t)E * sizeof(float)), f->beta = malloc((size_t)E * sizeof(float));
    f->e = calloc((size_t)E, sizeof *f->e);
    if (!f->w1m || !f->w3m || !f->w2m || !f->alpha || !f->beta || !f->e)
        return -1;
    fx_fill_normal(&r, f->w1m, tot, 0.05);
    fx_fill_normal(&r, f->w3m, tot, 0.05);
    fx_fill_normal(&r, f->w2m, tot, 0.05);
    for (int e = 0; e < E; e++) {
        f->alpha[e] = bg, f->beta[e] = bl;
        if (fx_store(f, 0, e, f->w1m + n * (size_t)e, I, H, &f->e[e].w1) ||
            fx_store(f, 1, e, f->w3m + n * (size_t)e, I, H, &f->e[e].w3) ||
            fx_store(f, 2, e, f->w2m + n * (size_t)e, H, I, &f->e[e].w2))
            return -1;
    }
    bool params = act == K3_ACT_SITU || act == K3_ACT_SWIGLU_BIAS;
    f->ex = (k3_experts){
        .n_experts = E,
        .first_local = 0,
        .n_local = E,
        .hidden = H,
        .inter = I,
        .e = f->e,
        .act = {.act = act, .alpha = params ? f->alpha : NULL, .beta = params ? f->beta : NULL}};
    return 0;
}

/* y [T, H] (double) straight from the float masters: sum_k w * w2 . act(w1 . x, w3 . x), with
 * activation params (act, bg, bl) given here (so a test can ask for the SwigluBias control or
 * a swapped pair). swap13 exchanges the roles of w1 and w3. */
static inline void fx_master_ref(const moe_fixture *f, k3_act act, float bg, float bl, int swap13,
                                 const float *x, int T, const int32_t *ids, const float *w, int k,
                                 double *y) {
    int H = f->H, I = f->I;
    size_t n = (size_t)H * (size_t)I;
    float al[1] = {bg}, be[1] = {bl};
    k3_act_params p = {.act = act, .alpha = al, .beta = be};
    double *h = malloc((size_t)I * sizeof *h);
    for (int t = 0; t < T; t++) {
        double *yt = y + (size_t)t * (size_t)H;
        for (int c = 0; c < H; c++)
            yt[c] = 0;
        for (int j = 0; j < k; j++) {
            int e = ids[t * k + j];
            const float *a = (swap13 ? f->w3m : f->w1m) + n * (size_t)e;
            const float *b = (swap13 ? f->w1m : f->w3m) + n * (size_t)e;
            const float *d = f->w2m + n * (size_t)e;
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0;
                for (int c = 0; c < H; c++) {
                    g += (double)a[(size_t)i * H + c] * x[t * H + c];
                    u += (double)b[(size_t)i * H + c] * x[t * H + c];
                }
                h[i] = k3_act_f64(&p, 0, g, u);
            }
            for (int c = 0; c < H; c++) {
                double o = 0;
                for (int i = 0; i < I; i++)
                    o += (double)d[(size_t)c * I + i] * h[i];
                yt[c] += (double)w[t * k + j] * o;
            }
        }
    }
    free(h);
}

static inline double fx_cosine(const double *a, const double *b, size_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++)
        ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
    return ab / sqrt(aa * bb);
}
/* ||a - b|| / ||b|| */
static inline double fx_rel_l2(const double *a, const double *b, size_t n) {
    double d = 0, bb = 0;
    for (size_t i = 0; i < n; i++)
        d += (a[i] - b[i]) * (a[i] - b[i]), bb += b[i] * b[i];
    return sqrt(d / bb);
}

/* Random routing: k distinct ids per token in [0, E), weights summing to 1. */
static inline void fx_route(fx_rng *r, int T, int E, int k, int32_t *ids, float *w) {
    for (int t = 0; t < T; t++) {
        double s = 0;
        for (int j = 0; j < k; j++) {
            int id, dup;
            do {
                id = (int)(fx_uniform(r) * E);
                dup = 0;
                for (int q = 0; q < j; q++)
                    dup |= ids[t * k + q] == id;
            } while (dup);
            ids[t * k + j] = id;
            w[t * k + j] = (float)(0.1 + fx_uniform(r));
            s += w[t * k + j];
        }
        for (int j = 0; j < k; j++)
            w[t * k + j] = (float)(w[t * k + j] / s);
    }
}

#endif
