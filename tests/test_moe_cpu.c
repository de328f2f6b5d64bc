/* The fast CPU routed-expert path against a float64 reference, on fresh random inputs.
 *
 * Every kernel the CPU has (scalar, AVX2, AVX-512) x every activation (SiTU with per-expert
 * asymmetric betas) x {NVFP4, MXFP4, BF16} x mode x T in {1, 3, 16, 255}:
 *  - W4A16: relative L2 <= 1e-5 against float64 on the same dequantized weights;
 *  - W4A4 (NVFP4) / W4A8 (MXFP4): relative L2 <= 1e-5 against a float64 emulation of the
 *    same activation quantization (the hidden rounded to float32 before it is quantized);
 *  - W4A16_BF16: relative L2 <= 1e-3 per run and RMS over a format's runs <= 2e-4 against
 *    float64 with x and the hidden rounded to bf16 (BF16_RUN_BOUND says why these are looser),
 *    with fast paths that skip a rounding as negative controls.
 * Outputs are poisoned with NaN first; a NaN left behind fails the bound (!(err <= bound)).
 * Also: every row kernel on row lengths with and without a tail after its wide steps, scale
 * codes off the AVX-512 table-free path (negative, zero, subnormal), all tokens
 * to one expert, experts with no tokens, uneven expert-parallel ranks
 * summing to the full result, bitwise-identical results for 1, 2 and 3 threads, errors by
 * name, and mutations (w1/w3 swapped, SiTU betas swapped) that must fail the bound.
 * Shapes are small (H = 256, I = 192, E = 20, k = 4) to keep the suite fast. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/block.h"
#include "formats/fp.h"
#include "moe/activation.h"
#include "moe/cpu_kern.h"
#include "moe/moe_cpu.h"

#define H 256
#define I 192
#define E 20
#define K 4
#define TMAX 255
#define BOUND 1e-5
/* W4A16_BF16. The fast path rounds its fp32 act(h) to bf16, the reference its double act(h)
 * (through float): where the two straddle a bf16 rounding boundary, one hidden value differs by
 * one bf16 ulp (2^-8 .. 2^-7 relative). With fp32 FC1 errors of ~1e-7 relative that happens to
 * about one hidden value in 10^4. A run without a flip is at fp32 level (~1e-7); one flip costs
 * about 2^-8 * (|h_i| / rms h) / sqrt(T*k*I * mean w^2) relative L2, so it shows most in small
 * runs (up to ~4e-4 at T = 16 for a large |h_i|) and averages out in large ones (~3e-5 at
 * T = 255). Hence two bounds:
 *  - every run: relative L2 <= 1e-3 (a few flips; catches gross errors). Measured: worst
 *    3.9e-4 in 3132 runs (12 input seeds x the 261 runs of the three formats);
 *  - each format's runs together: RMS of the runs' relative L2 <= 2e-4. Measured: worst 4.3e-5
 *    over those 36 sets. A fast path that leaves out either rounding is at >= 1.4e-3 in every
 *    run (test_bf16_controls), so its RMS is too, or ~8e-4 if only the one-token path (the
 *    T = 1 runs, 27 of 87) leaves it out. */
#define BF16_RUN_BOUND 1e-3
#define BF16_RMS_BOUND 2e-4

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* xorshift64*, uniform in [0, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
static float nrand(void) { /* sum of uniforms: roughly normal, variance 1 */
    double s = 0;
    for (int i = 0; i < 12; i++) s += urand();
    return (float)(s - 6.0);
}

/* One layer's experts in one format, owning its memory. */
typedef struct bank {
    k3_wfmt fmt;
    k3_expert ex[E];
    void *mem[E][3];
    void *sc[E][3];
    float alpha[E], beta[E], limit[E];
} bank;

static void make_mat(bank *b, int e, int which, int64_t rows, int64_t cols, const float *wf) {
    k3_qmat *m = which == 0 ? &b->ex[e].w1 : which == 1 ? &b->ex[e].w3 : &b->ex[e].w2;
    k3_error err = {0};
    memset(m, 0, sizeof *m);
    m->fmt = b->fmt;
    m->rows = rows;
    m->cols = cols;
    m->global_scale = 1.0f;
    if (b->fmt == K3_WFMT_NVFP4) {
        uint8_t *q = malloc((size_t)(rows * cols / 2)), *s = malloc((size_t)(rows * cols / 16));
        assert_int_equal(k3_nvfp4_quantize_weight(wf, rows, cols, q, s, &m->global_scale, &err), 0);
        b->mem[e][which] = q;
        b->sc[e][which] = s;
        m->data = q;
        m->scale = s;
        /* input_scale = amax/(6*448): per expert different so "max over local experts" matters */
        m->input_scale = (which == 2 ? 3.0f : 4.5f) * (1.0f + 0.03f * (float)e) / 2688.0f;
    } else if (b->fmt == K3_WFMT_MXFP4) {
        uint8_t *q = malloc((size_t)(rows * cols / 2)), *s = malloc((size_t)(rows * cols / 32));
        assert_int_equal(k3_mxfp4_quantize(wf, rows, cols, q, s, &err), 0);
        b->mem[e][which] = q;
        b->sc[e][which] = s;
        m->data = q;
        m->scale = s;
    } else {
        uint16_t *q = malloc((size_t)(rows * cols) * 2);
        for (int64_t i = 0; i < rows * cols; i++) q[i] = k3_f32_to_bf16(wf[i]);
        b->mem[e][which] = q;
        m->data = q;
    }
}

static bank *make_bank(k3_wfmt fmt) {
    bank *b = calloc(1, sizeof *b);
    b->fmt = fmt;
    float *wf = malloc(sizeof(float) * I * H);
    for (int e = 0; e < E; e++) {
        for (int which = 0; which < 3; which++) {
            int64_t rows = which == 2 ? H : I, cols = which == 2 ? I : H;
            float sd = 1.0f / sqrtf((float)cols);
            for (int64_t i = 0; i < rows * cols; i++) wf[i] = nrand() * sd;
            make_mat(b, e, which, rows, cols, wf);
        }
        b->alpha[e] = 2.5f + 0.1f * (float)e; /* SiTU gate-side beta / SwigluBias alpha */
        b->beta[e] = 7.0f + 0.25f * (float)e; /* SiTU linear beta / SwigluBias beta */
        b->limit[e] = 3.0f + 0.1f * (float)e;
    }
    free(wf);
    return b;
}

static void free_bank(bank *b) {
    for (int e = 0; e < E; e++)
        for (int w = 0; w < 3; w++) {
            free(b->mem[e][w]);
            free(b->sc[e][w]);
        }
    free(b);
}

static k3_experts experts_of(bank *b, k3_act act, int first, int n) {
    k3_experts ex = {.n_experts = E, .first_local = first, .n_local = n, .hidden = H, .inter = I,
                     .e = b->ex + first};
    ex.act.act = act;
    if (act == K3_ACT_SITU || act == K3_ACT_SWIGLU_BIAS) {
        ex.act.alpha = b->alpha + first;
        ex.act.beta = b->beta + first;
    }
    if (act == K3_ACT_SWIGLU_BIAS) ex.act.limit = b->limit + first;
    return ex;
}

/* The float64 reference (moe.h): per token, per selected local expert, on the same
 * dequantized weights, with the mode's activation quantization emulated. */
static void reference(bank *b, const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                      const int32_t *ids, const float *w, double *y) {
    (void)b;
    k3_error err = {0};
    int rc = k3_moe_experts_ref(ex, mode, x, T, ids, w, K, y, &err);
    if (rc) fprintf(stderr, "k3_moe_experts_ref: %s\n", err.msg);
    assert_int_equal(rc, K3_OK);
}

static double rel_l2(const float *y, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)y[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}

static float X[TMAX * H], W[TMAX * K], Y[TMAX * H], Y2[TMAX * H];
static int32_t IDS[TMAX * K];
static double REF[TMAX * H];

static void random_inputs(int T) {
    for (int i = 0; i < T * H; i++) X[i] = nrand();
    for (int t = 0; t < T; t++) {
        for (int s = 0; s < K; s++) {
            int id, dup;
            do { /* distinct experts per token, as top-k gives */
                id = (int)(urand() * E);
                dup = 0;
                for (int j = 0; j < s; j++) dup |= IDS[t * K + j] == id;
            } while (dup);
            IDS[t * K + s] = id;
            W[t * K + s] = (float)(0.1 + urand());
        }
    }
}

static void poison(float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = NAN;
}

static k3_threadpool *POOL;

static double run_cpu(const k3_experts *ex, k3_act_mode mode, int T, k3_cpu_isa isa, float *y) {
    k3_error err = {0};
    poison(y, (int64_t)T * H);
    int rc = k3_moe_experts_cpu_isa(ex, mode, X, T, IDS, W, K, y, POOL, isa, &err);
    if (rc) fprintf(stderr, "k3_moe_experts_cpu: %s\n", err.msg);
    assert_int_equal(rc, K3_OK);
    return rel_l2(y, REF, (int64_t)T * H);
}

static const k3_act ACTS[] = {K3_ACT_IDENTITY, K3_ACT_GELU,        K3_ACT_RELU,
                              K3_ACT_SILU,     K3_ACT_SWIGLU,      K3_ACT_GEGLU,
                              K3_ACT_RELU2,    K3_ACT_SWIGLU_BIAS, K3_ACT_SITU};
static const k3_cpu_isa ISAS[] = {K3_ISA_SCALAR, K3_ISA_AVX2, K3_ISA_AVX512};

static void variants(k3_wfmt fmt, k3_act_mode mode) {
    static const int Ts[] = {1, 3, 16, 255};
    bool bf16 = mode == K3_MODE_W4A16_BF16;
    double bound = bf16 ? BF16_RUN_BOUND : BOUND, sumsq = 0;
    bank *b = make_bank(fmt);
    int runs = 0;
    double worst = 0;
    for (size_t a = 0; a < sizeof ACTS / sizeof *ACTS; a++) {
        k3_experts ex = experts_of(b, ACTS[a], 0, E);
        for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
            int T = Ts[ti];
            if (T == 255 && ACTS[a] != K3_ACT_SITU && ACTS[a] != K3_ACT_SWIGLU) continue;
            random_inputs(T);
            reference(b, &ex, mode, X, T, IDS, W, REF);
            for (size_t k = 0; k < sizeof ISAS / sizeof *ISAS; k++) {
                if (!k3_cpu_isa_available(ISAS[k])) continue;
                double r = run_cpu(&ex, mode, T, ISAS[k], Y);
                if (!(r <= bound))
                    fail_msg("%s %s %s mode %s T=%d: rel L2 %.3g > %g", k3_cpu_isa_name(ISAS[k]),
                             k3_wfmt_name(fmt), k3_act_name(ACTS[a]), k3_act_mode_name(mode), T, r,
                             bound);
                runs++;
                sumsq += r * r;
                if (r > worst) worst = r;
            }
        }
    }
    assert_true(runs > 0);
    double rms = sqrt(sumsq / runs);
    fprintf(stderr, "moe_cpu: %s %s: %d runs, worst rel L2 %.3g (bound %g)", k3_wfmt_name(fmt),
            k3_act_mode_name(mode), runs, worst, bound);
    if (bf16) fprintf(stderr, ", RMS %.3g (bound %g)", rms, BF16_RMS_BOUND);
    fprintf(stderr, "\n");
    if (bf16 && !(rms <= BF16_RMS_BOUND))
        fail_msg("%s %s: RMS of rel L2 over %d runs %.3g > %g", k3_wfmt_name(fmt),
                 k3_act_mode_name(mode), runs, rms, BF16_RMS_BOUND);
    free_bank(b);
}

static void test_nvfp4_w4a16(void **s) { (void)s; variants(K3_WFMT_NVFP4, K3_MODE_W4A16); }
static void test_mxfp4_w4a16(void **s) { (void)s; variants(K3_WFMT_MXFP4, K3_MODE_W4A16); }
static void test_bf16_w4a16(void **s) { (void)s; variants(K3_WFMT_BF16, K3_MODE_W4A16); }
static void test_nvfp4_w4a4(void **s) { (void)s; variants(K3_WFMT_NVFP4, K3_MODE_W4A4); }
static void test_mxfp4_w4a8(void **s) { (void)s; variants(K3_WFMT_MXFP4, K3_MODE_W4A8); }
static void test_nvfp4_w4a16_bf16(void **s) { (void)s; variants(K3_WFMT_NVFP4, K3_MODE_W4A16_BF16); }
static void test_mxfp4_w4a16_bf16(void **s) { (void)s; variants(K3_WFMT_MXFP4, K3_MODE_W4A16_BF16); }
static void test_bf16_w4a16_bf16(void **s) { (void)s; variants(K3_WFMT_BF16, K3_MODE_W4A16_BF16); }

/* The bounds must catch a fast path that skips a rounding: plain W4A16 on x (neither input
 * rounded) and W4A16 on x already rounded to bf16 (the hidden left in fp32) each fail even
 * the per-run bound (so also the RMS one, 5x lower), on the one-token passes (T = 1) and the
 * blocked path (T = 16); the mode itself on the same inputs passes. */
static void test_bf16_controls(void **s) {
    (void)s;
    bank *b = make_bank(K3_WFMT_NVFP4);
    static const int Ts[] = {1, 16};
    for (size_t ti = 0; ti < 2; ti++) {
        int T = Ts[ti];
        k3_experts ex = experts_of(b, K3_ACT_SITU, 0, E);
        random_inputs(T);
        reference(b, &ex, K3_MODE_W4A16_BF16, X, T, IDS, W, REF);
        double none = run_cpu(&ex, K3_MODE_W4A16, T, K3_ISA_AUTO, Y);
        for (int i = 0; i < T * H; i++) X[i] = k3_bf16_to_f32(k3_f32_to_bf16(X[i]));
        double x_only = run_cpu(&ex, K3_MODE_W4A16, T, K3_ISA_AUTO, Y);
        double both = run_cpu(&ex, K3_MODE_W4A16_BF16, T, K3_ISA_AUTO, Y);
        fprintf(stderr, "moe_cpu: w4a16-bf16 T=%d: rel L2 %.3g; controls: no rounding %.3g, "
                "x only %.3g (must exceed %g)\n", T, both, none, x_only, BF16_RUN_BOUND);
        assert_true(both <= BF16_RUN_BOUND);
        assert_false(none <= BF16_RUN_BOUND);
        assert_false(x_only <= BF16_RUN_BOUND);
    }
    free_bank(b);
}

/* All tokens to one expert (slot 0 of every token) and, in a second case, every slot of
 * every token to only two experts (the other 18 get no tokens). */
static void test_skewed_routing(void **s) {
    (void)s;
    bank *b = make_bank(K3_WFMT_NVFP4);
    k3_experts ex = experts_of(b, K3_ACT_SITU, 0, E);
    int T = 37;
    random_inputs(T);
    for (int t = 0; t < T; t++) IDS[t * K] = 7;
    for (int t = 0; t < T; t++) /* keep slots distinct from 7 */
        for (int j = 1; j < K; j++)
            if (IDS[t * K + j] == 7) IDS[t * K + j] = (7 + j) % E;
    reference(b, &ex, K3_MODE_W4A16, X, T, IDS, W, REF);
    for (size_t k = 0; k < sizeof ISAS / sizeof *ISAS; k++)
        if (k3_cpu_isa_available(ISAS[k])) assert_true(run_cpu(&ex, K3_MODE_W4A16, T, ISAS[k], Y) <= BOUND);
    for (int i = 0; i < T * K; i++) IDS[i] = i % 2 ? 0 : E - 1;
    reference(b, &ex, K3_MODE_W4A16, X, T, IDS, W, REF);
    for (size_t k = 0; k < sizeof ISAS / sizeof *ISAS; k++)
        if (k3_cpu_isa_available(ISAS[k])) assert_true(run_cpu(&ex, K3_MODE_W4A16, T, ISAS[k], Y) <= BOUND);
    /* expert 7 shared by all 5 tokens, 15 others with one token each: the pass sequence
     * alternates the multi-token dot path and the one-token rows path (and its SiTU runs) */
    T = 5;
    random_inputs(T);
    for (int t = 0; t < T; t++) {
        IDS[t * K] = 7;
        for (int j = 1; j < K; j++) IDS[t * K + j] = (8 + 3 * t + j - 1) % E;
    }
    static const k3_act_mode modes[] = {K3_MODE_W4A16, K3_MODE_W4A4};
    for (int mi = 0; mi < 2; mi++) {
        reference(b, &ex, modes[mi], X, T, IDS, W, REF);
        for (size_t k = 0; k < sizeof ISAS / sizeof *ISAS; k++) {
            if (!k3_cpu_isa_available(ISAS[k])) continue;
            double r = run_cpu(&ex, modes[mi], T, ISAS[k], Y);
            if (!(r <= BOUND))
                fail_msg("%s mixed one/five-token experts, mode %s: rel L2 %.3g > %g",
                         k3_cpu_isa_name(ISAS[k]), k3_act_mode_name(modes[mi]), r, BOUND);
        }
    }
    free_bank(b);
}

/* Scale codes off the AVX-512 kernel's table-free path (cpu_kern_avx512.c): every 5th
 * row of every matrix gets its blocks negated (E4M3 sign bit) and, in some blocks, zero
 * and subnormal E4M3 codes or a zero E8M0 code (2^-127). Those rows must take the exact
 * table path; a wrong decode of the negated blocks is far outside the bound. */
static void special_scales(k3_wfmt fmt) {
    bank *b = make_bank(fmt);
    int nv = fmt == K3_WFMT_NVFP4, blk = nv ? 16 : 32;
    for (int e = 0; e < E; e++)
        for (int which = 0; which < 3; which++) {
            k3_qmat *m = which == 0 ? &b->ex[e].w1 : which == 1 ? &b->ex[e].w3 : &b->ex[e].w2;
            uint8_t *sc = (uint8_t *)m->scale;
            int64_t per_row = m->cols / blk;
            for (int64_t r = e % 5; r < m->rows; r += 5)
                for (int64_t c = 0; c < per_row; c++) {
                    uint8_t *v = &sc[r * per_row + c];
                    if (nv) *v = c % 7 == 3 ? (uint8_t)(c % 8) : (uint8_t)(*v | 0x80);
                    else if (c % 7 == 3) *v = 0;
                }
        }
    k3_experts ex = experts_of(b, K3_ACT_SITU, 0, E);
    static const int Ts[] = {1, 3, 16};
    for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
        random_inputs(Ts[ti]);
        reference(b, &ex, K3_MODE_W4A16, X, Ts[ti], IDS, W, REF);
        for (size_t k = 0; k < sizeof ISAS / sizeof *ISAS; k++) {
            if (!k3_cpu_isa_available(ISAS[k])) continue;
            double r = run_cpu(&ex, K3_MODE_W4A16, Ts[ti], ISAS[k], Y);
            if (!(r <= BOUND))
                fail_msg("%s %s special scales T=%d: rel L2 %.3g > %g", k3_cpu_isa_name(ISAS[k]),
                         k3_wfmt_name(fmt), Ts[ti], r, BOUND);
        }
    }
    free_bank(b);
}
static void test_special_scales(void **s) {
    (void)s;
    special_scales(K3_WFMT_NVFP4);
    special_scales(K3_WFMT_MXFP4);
}

/* The AVX-512 vector SiTU (cpu_kern.h) against float64 on a sweep of g, u over +-200 with
 * many small values, at K3's betas (4, 25) and asymmetric ones: relative error <= 2e-6 of
 * max(|ref|, 1e-30) (a few float ulps; float64 of the same formula is the reference);
 * NaN in either input gives NaN. */
static void test_situ_vector(void **s) {
    (void)s;
    if (!k3_cpu_isa_available(K3_ISA_AVX512) || !k3_cpu_kern_avx512.situ) skip();
    static const float betas[][2] = {{4.0f, 25.0f}, {2.5f, 7.0f}};
    double worst = 0;
    for (int bi = 0; bi < 2; bi++) {
        float bg = betas[bi][0], bl = betas[bi][1];
        for (int it = 0; it < 4000; it++) {
            float g[16], u[16], out[16];
            for (int j = 0; j < 16; j++) {
                double mag = pow(10.0, -6.0 + 8.3 * urand()); /* 1e-6 .. 2e2 */
                g[j] = (float)(urand() < 0.5 ? -mag : mag);
                mag = pow(10.0, -6.0 + 8.3 * urand());
                u[j] = (float)(urand() < 0.5 ? -mag : mag);
            }
            int n = 1 + it % 16;
            for (int j = 0; j < 16; j++) out[j] = NAN;
            k3_cpu_kern_avx512.situ(g, u, n, bg, bl, out);
            for (int j = 0; j < n; j++) {
                double gd = g[j], ud = u[j];
                double ref = bg * tanh(gd / bg) / (1.0 + exp(-gd)) * (bl * tanh(ud / bl));
                double err = fabs((double)out[j] - ref) / fmax(fabs(ref), 1e-30);
                if (!(err <= 2e-6))
                    fail_msg("situ g=%g u=%g betas %g/%g: %.9g vs %.9g (rel %.3g)", gd, ud, bg, bl,
                             (double)out[j], ref, err);
                if (err > worst) worst = err;
            }
        }
    }
    float g[3] = {NAN, 1.0f, 3.0f}, u[3] = {1.0f, NAN, -INFINITY}, out[3];
    k3_cpu_kern_avx512.situ(g, u, 3, 4.0f, 25.0f, out);
    assert_true(isnan(out[0]) && isnan(out[1]));
    double ref = 4.0 * tanh(3.0 / 4.0) / (1.0 + exp(-3.0)) * -25.0;
    assert_true(fabs(out[2] - ref) <= 2e-6 * fabs(ref));
    fprintf(stderr, "moe_cpu: vector SiTU worst relative error %.3g (bound 2e-6)\n", worst);
}

/* Expert-parallel ranks, uneven splits: the sum over ranks equals the single-rank result
 * within fp32 rounding (relative L2 <= 1e-6), and each rank matches its own reference. */
static void test_ep_ranks_sum(void **s) {
    (void)s;
    static const int splits[][4] = {{7, 7, 6, 0}, {3, 11, 6, 0}, {1, 18, 1, 0}};
    k3_act_mode modes[] = {K3_MODE_W4A16, K3_MODE_W4A4, K3_MODE_W4A16_BF16};
    bank *b = make_bank(K3_WFMT_NVFP4);
    int T = 16;
    random_inputs(T);
    for (size_t m = 0; m < 3; m++) {
        bool bf16 = modes[m] == K3_MODE_W4A16_BF16;
        k3_experts full = experts_of(b, K3_ACT_SITU, 0, E);
        k3_error err = {0};
        poison(Y, T * H);
        assert_int_equal(k3_moe_experts_cpu(&full, modes[m], X, T, IDS, W, K, Y, POOL, &err), 0);
        for (size_t sp = 0; sp < sizeof splits / sizeof *splits; sp++) {
            static float sum[TMAX * H];
            memset(sum, 0, sizeof sum);
            for (int r = 0, first = 0; splits[sp][r]; first += splits[sp][r], r++) {
                k3_experts rank = experts_of(b, K3_ACT_SITU, first, splits[sp][r]);
                poison(Y2, T * H);
                assert_int_equal(k3_moe_experts_cpu(&rank, modes[m], X, T, IDS, W, K, Y2, POOL, &err), 0);
                if (modes[m] != K3_MODE_W4A4) { /* W4A4's g depends on the rank's experts */
                    reference(b, &rank, modes[m], X, T, IDS, W, REF);
                    assert_true(rel_l2(Y2, REF, T * H) <= (bf16 ? BF16_RUN_BOUND : BOUND));
                }
                for (int i = 0; i < T * H; i++) sum[i] += Y2[i];
            }
            double num = 0, den = 0; /* the sum against the one-rank run */
            for (int i = 0; i < T * H; i++) {
                double d = (double)sum[i] - Y[i];
                num += d * d;
                den += (double)Y[i] * Y[i];
            }
            double r = sqrt(num / den);
            if (modes[m] == K3_MODE_W4A16 && !(r <= 1e-6))
                fail_msg("EP split %zu: sum of ranks differs from one rank: rel L2 %.3g", sp, r);
            /* W4A4: each rank takes g over its own experts (moe.md §2.2), so the sum is only
             * close; the bound is the activation quantization's, not fp32's. */
            if (modes[m] == K3_MODE_W4A4 && !(r <= 0.2))
                fail_msg("EP split %zu W4A4: rel L2 %.3g", sp, r);
            /* W4A16_BF16: a rank whose experts have one token each takes the one-token
             * kernels, whose fp32 rounding of h can flip a bf16 rounding the full run makes
             * the other way (BF16_RUN_BOUND) */
            if (bf16 && !(r <= BF16_RUN_BOUND))
                fail_msg("EP split %zu w4a16-bf16: rel L2 %.3g", sp, r);
        }
    }
    free_bank(b);
}

/* The same call on 1, 2 and 3 threads gives bit-identical outputs, for every kernel. */
static void test_threads_identical(void **s) {
    (void)s;
    bank *b = make_bank(K3_WFMT_NVFP4);
    k3_experts ex = experts_of(b, K3_ACT_SITU, 0, E);
    int T = 19;
    random_inputs(T);
    for (size_t k = 0; k < sizeof ISAS / sizeof *ISAS; k++) {
        if (!k3_cpu_isa_available(ISAS[k])) continue;
        k3_error err = {0};
        poison(Y, T * H);
        assert_int_equal(k3_moe_experts_cpu_isa(&ex, K3_MODE_W4A16, X, T, IDS, W, K, Y, NULL, ISAS[k], &err), 0);
        for (int n = 2; n <= 3; n++) {
            k3_threadpool *p = NULL;
            assert_int_equal(k3_threadpool_create(n, &p, &err), 0);
            poison(Y2, T * H);
            assert_int_equal(k3_moe_experts_cpu_isa(&ex, K3_MODE_W4A16, X, T, IDS, W, K, Y2, p, ISAS[k], &err), 0);
            assert_memory_equal(Y, Y2, sizeof(float) * T * H);
            k3_threadpool_free(p);
        }
    }
    free_bank(b);
}

/* Mutations the bound must catch: FC1's w1 and w3 swapped, SiTU's two betas swapped. */
static void test_mutations_fail(void **s) {
    (void)s;
    bank *b = make_bank(K3_WFMT_NVFP4);
    k3_experts ex = experts_of(b, K3_ACT_SITU, 0, E);
    int T = 8;
    random_inputs(T);
    reference(b, &ex, K3_MODE_W4A16, X, T, IDS, W, REF);
    k3_expert swapped[E];
    for (int e = 0; e < E; e++) {
        swapped[e] = b->ex[e];
        swapped[e].w1 = b->ex[e].w3;
        swapped[e].w3 = b->ex[e].w1;
    }
    k3_experts m1 = ex;
    m1.e = swapped;
    assert_false(run_cpu(&m1, K3_MODE_W4A16, T, K3_ISA_AUTO, Y) <= 1e-2);
    k3_experts m2 = ex;
    m2.act.alpha = b->beta;
    m2.act.beta = b->alpha;
    assert_false(run_cpu(&m2, K3_MODE_W4A16, T, K3_ISA_AUTO, Y) <= 1e-2);
    assert_true(run_cpu(&ex, K3_MODE_W4A16, T, K3_ISA_AUTO, Y) <= BOUND);
    free_bank(b);
}

static void test_errors(void **s) {
    (void)s;
    bank *b = make_bank(K3_WFMT_MXFP4);
    k3_experts ex = experts_of(b, K3_ACT_SITU, 0, E);
    k3_error err = {0};
    int T = 2;
    random_inputs(T);
    IDS[3] = E;
    assert_int_equal(k3_moe_experts_cpu(&ex, K3_MODE_W4A16, X, T, IDS, W, K, Y, POOL, &err), K3_ERR_ARG);
    assert_non_null(strstr(err.msg, "ids[0][3]"));
    IDS[3] = -1;
    assert_int_equal(k3_moe_experts_cpu(&ex, K3_MODE_W4A16, X, T, IDS, W, K, Y, POOL, &err), K3_ERR_ARG);
    IDS[3] = 1;
    assert_int_not_equal(k3_moe_experts_cpu(&ex, K3_MODE_W4A4, X, T, IDS, W, K, Y, POOL, &err), K3_OK);
    ex.act.beta = NULL; /* SiTU without its linear beta */
    assert_int_not_equal(k3_moe_experts_cpu(&ex, K3_MODE_W4A16, X, T, IDS, W, K, Y, POOL, &err), K3_OK);
    ex = experts_of(b, K3_ACT_SITU, 0, E);
    k3_expert saved = b->ex[3];
    b->ex[3].w2.cols = I - 32;
    assert_int_equal(k3_moe_experts_cpu(&ex, K3_MODE_W4A16, X, T, IDS, W, K, Y, POOL, &err), K3_ERR_SHAPE);
    assert_non_null(strstr(err.msg, "w2"));
    b->ex[3] = saved;
    assert_int_equal(k3_moe_experts_cpu_isa(&ex, K3_MODE_W4A16, X, T, IDS, W, K, Y, POOL, K3_ISA_COUNT, &err), K3_ERR_ARG);
    free_bank(b);

    bank *nv = make_bank(K3_WFMT_NVFP4);
    ex = experts_of(nv, K3_ACT_SWIGLU, 0, E);
    nv->ex[5].w2.input_scale = 0;
    assert_int_not_equal(k3_moe_experts_cpu(&ex, K3_MODE_W4A4, X, T, IDS, W, K, Y, POOL, &err), K3_OK);
    assert_non_null(strstr(err.msg, "input_scale"));
    assert_int_not_equal(k3_moe_experts_cpu(&ex, K3_MODE_W4A8, X, T, IDS, W, K, Y, POOL, &err), K3_OK);
    free_bank(nv);
}

/* ref[a][b] = row a . natural input b in float64, mag[a][b] = sum of |terms| (L elements). */
static void ref_dots(const uint8_t *const *qs, const uint8_t *const *ss, int nv, int64_t L,
                     const float *xn, double ref[4][4], double mag[4][4]) {
    const int blk = nv ? 16 : 32;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            ref[a][b] = mag[a][b] = 0;
            for (int64_t i = 0; i < L; i++) {
                double w = (double)k3_e2m1_lut[(qs[a][i / 2] >> (4 * (i & 1))) & 15] *
                           (nv ? k3_e4m3_lut : k3_e8m0_lut)[ss[a][i / blk]];
                ref[a][b] += w * xn[b * L + i];
                mag[a][b] += fabs(w * xn[b * L + i]);
            }
        }
}

/* Every row kernel the CPU has (dot for 1..4 tokens, rows for 1..4 rows) against float64 on
 * row lengths with and without a tail after the kernels' wide steps (64 elements for AVX2, 128
 * for AVX-512; the operator tests above only use 192 and 256): random bytes (every code,
 * -0 included), scales across two decades, inputs in the kernel's layout (k3_cpu_pos). Bound:
 * |out - ref| <= 1e-6 x sum |terms| (float accumulation of at most 3584 terms). */
static void test_kernel_row_lengths(void **s) {
    (void)s;
    static const int64_t lens[] = {16, 32, 48, 64, 80, 96, 208, 224, 240, 3584};
    static const k3_cpu_isa isas[] = {K3_ISA_SCALAR, K3_ISA_AVX2, K3_ISA_AVX512};
    static const k3_cpu_kern *kerns[] = {&k3_cpu_kern_scalar, &k3_cpu_kern_avx2,
                                         &k3_cpu_kern_avx512};
    const int64_t KM = 3584;
    uint8_t *q = malloc(4 * KM / 2), *sc = malloc(4 * KM / 16);
    float *xn = malloc(sizeof(float) * 4 * KM), *xk = malloc(sizeof(float) * 4 * KM);
    int checked = 0;
    for (int ki = 0; ki < 3; ki++) {
        if (!k3_cpu_isa_available(isas[ki])) continue;
        const k3_cpu_kern *kn = kerns[ki];
        for (int nv = 0; nv < 2; nv++) {
            const int blk = nv ? 16 : 32;
            k3_dot_fn dot = nv ? kn->nvfp4 : kn->mxfp4;
            k3_rows_fn rows = nv ? kn->nvfp4_rows : kn->mxfp4_rows;
            for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
                const int64_t L = lens[li];
                if (L % blk) continue;
                for (int64_t i = 0; i < 4 * L / 2; i++) q[i] = (uint8_t)(urand() * 256);
                for (int64_t i = 0; i < 4 * L / blk; i++) /* E4M3 0x28..0x47 / E8M0 121..130 */
                    sc[i] = (uint8_t)(nv ? 0x28 + (int)(urand() * 32) : 121 + (int)(urand() * 10));
                for (int64_t i = 0; i < 4 * L; i++) xn[i] = nrand();
                for (int r = 0; r < 4; r++)
                    for (int64_t i = 0; i < L; i++)
                        xk[r * L + k3_cpu_pos(i, L, kn->fp4_layout)] = xn[r * L + i];
                const uint8_t *qs[4], *ss[4];
                const float *xs[4];
                for (int r = 0; r < 4; r++) {
                    qs[r] = q + r * L / 2;
                    ss[r] = sc + r * L / blk;
                    xs[r] = xk + r * L;
                }
                double ref[4][4], mag[4][4];
                ref_dots(qs, ss, nv, L, xn, ref, mag);
                float out[4];
                for (int nt = 1; nt <= 4; nt++) { /* row 0 against inputs 0 .. nt-1 */
                    for (int b = 0; b < 4; b++) out[b] = NAN;
                    dot(qs[0], ss[0], L, xs, nt, out);
                    for (int b = 0; b < nt; b++)
                        if (!(fabs(out[b] - ref[0][b]) <= 1e-6 * mag[0][b] + 1e-30))
                            fail_msg("%s %s dot K=%lld nt=%d token %d: %.9g vs %.9g", kn->name,
                                     nv ? "nvfp4" : "mxfp4", (long long)L, nt, b, (double)out[b],
                                     ref[0][b]);
                    checked++;
                }
                /* float64 sums (W4A4 NVFP4, W4A8 MXFP4) on quantized activations: NVFP4
                 * values (E2M1 x one E4M3 scale per 16) or MXFP8 values (E4M3 x one E8M0 scale
                 * per 32). The products are exact in float, so only the double sums may round:
                 * bound 1e-13 x sum |terms| (a float-rounded partial sum would miss it by 1e6). */
                k3_dot64_fn dot64 = nv ? kn->nvfp4_64 : kn->mxfp4_64;
                k3_rows64_fn rows64 = nv ? kn->nvfp4_rows64 : NULL;
                for (int b = 0; b < 4; b++)
                    for (int64_t i0 = 0; i0 < L; i0 += blk) {
                        float xsc = nv ? k3_e4m3_lut[0x28 + (int)(urand() * 32)]
                                       : k3_e8m0_lut[118 + (int)(urand() * 12)];
                        for (int64_t i = i0; i < i0 + blk; i++) {
                            int code = (int)(urand() * 256);
                            float v = nv ? k3_e2m1_lut[code & 15] : k3_e4m3_lut[code & 0x7F] *
                                                                         (code & 0x80 ? -1.0f : 1.0f);
                            if (!nv && (code & 0x7F) == 0x7F) v = 0; /* E4M3 NaN code */
                            xn[b * L + i] = v * xsc;
                            xk[b * L + k3_cpu_pos(i, L, kn->fp4_layout)] = xn[b * L + i];
                        }
                    }
                ref_dots(qs, ss, nv, L, xn, ref, mag);
                double out64[4];
                for (int nt = 1; dot64 && nt <= 4; nt++) {
                    for (int b = 0; b < 4; b++) out64[b] = NAN;
                    dot64(qs[0], ss[0], L, xs, nt, out64);
                    for (int b = 0; b < nt; b++)
                        if (!(fabs(out64[b] - ref[0][b]) <= 1e-13 * mag[0][b] + 1e-300))
                            fail_msg("%s %s dot64 K=%lld nt=%d token %d: %.17g vs %.17g", kn->name,
                                     nv ? "nvfp4" : "mxfp4", (long long)L, nt, b, out64[b], ref[0][b]);
                    checked++;
                }
                for (int nr = 1; rows64 && nr <= 4; nr++) {
                    for (int a = 0; a < 4; a++) out64[a] = NAN;
                    rows64(qs, ss, nr, L, xs[0], out64, NULL, NULL);
                    for (int a = 0; a < nr; a++)
                        if (!(fabs(out64[a] - ref[a][0]) <= 1e-13 * mag[a][0] + 1e-300))
                            fail_msg("%s nvfp4 rows64 K=%lld nr=%d row %d: %.17g vs %.17g", kn->name,
                                     (long long)L, nr, a, out64[a], ref[a][0]);
                    checked++;
                }
                for (int nr = 1; rows && nr <= 4; nr++) { /* rows 0 .. nr-1 against input 0 */
                    for (int a = 0; a < 4; a++) out[a] = NAN;
                    rows(qs, ss, nr, L, xs[0], out, NULL, NULL);
                    for (int a = 0; a < nr; a++)
                        if (!(fabs(out[a] - ref[a][0]) <= 1e-6 * mag[a][0] + 1e-30))
                            fail_msg("%s %s rows K=%lld nr=%d row %d: %.9g vs %.9g", kn->name,
                                     nv ? "nvfp4" : "mxfp4", (long long)L, nr, a, (double)out[a],
                                     ref[a][0]);
                    checked++;
                }
            }
        }
    }
    assert_true(checked > 0);
    free(q);
    free(sc);
    free(xn);
    free(xk);
}

/* The float64 kernels on the one MXFP8 lane whose float sum of 8 would round: 7 products of
 * 6 x 448 and one of 0.5 x 2^-9 (E4M3's smallest) in elements 0..7 of a 128-element row (one
 * lane of the AVX-512 step, one pair of AVX2's, one block), scales 1: the sum, 18816 + 2^-10,
 * needs 25 bits. Every kernel must return it exactly. */
static void test_kernel_float64_extreme_lane(void **s) {
    (void)s;
    static const k3_cpu_isa isas[] = {K3_ISA_SCALAR, K3_ISA_AVX2, K3_ISA_AVX512};
    static const k3_cpu_kern *kerns[] = {&k3_cpu_kern_scalar, &k3_cpu_kern_avx2,
                                         &k3_cpu_kern_avx512};
    enum { L = 128 };
    uint8_t q[L / 2] = {0}, sc[L / 16];
    float xn[L] = {0}, xk[L];
    for (int i = 0; i < 7; i++) {
        q[i / 2] |= (uint8_t)(7 << (4 * (i & 1))); /* E2M1 6.0 */
        xn[i] = 448.0f;
    }
    q[3] |= 1 << 4; /* element 7: E2M1 0.5 */
    xn[7] = 0x1p-9f;
    const double want = 7.0 * 6.0 * 448.0 + 0x1p-10;
    int checked = 0;
    for (int ki = 0; ki < 3; ki++) {
        if (!k3_cpu_isa_available(isas[ki])) continue;
        const k3_cpu_kern *kn = kerns[ki];
        for (int i = 0; i < L; i++) xk[k3_cpu_pos(i, L, kn->fp4_layout)] = xn[i];
        const uint8_t *qs[1] = {q}, *ss[1] = {sc};
        const float *xs[1] = {xk};
        double out = NAN;
        memset(sc, 127, sizeof sc); /* E8M0 2^0 */
        kn->mxfp4_64(q, sc, L, xs, 1, &out);
        if (out != want) fail_msg("%s mxfp4_dot64: %.17g, want %.17g", kn->name, out, want);
        if (kn->mxfp4_rows64) {
            out = NAN;
            kn->mxfp4_rows64(qs, ss, 1, L, xk, &out, NULL, NULL);
            if (out != want) fail_msg("%s mxfp4_rows64: %.17g, want %.17g", kn->name, out, want);
        }
        checked++;
    }
    assert_true(checked > 0);
}

static int setup(void **s) {
    (void)s;
    k3_error err = {0};
    return k3_threadpool_create(2, &POOL, &err);
}
static int teardown(void **s) {
    (void)s;
    k3_threadpool_free(POOL);
    return 0;
}

int main(void) {
    fprintf(stderr, "moe_cpu: kernels on this CPU: scalar%s%s\n",
            k3_cpu_isa_available(K3_ISA_AVX2) ? ", avx2" : "",
            k3_cpu_isa_available(K3_ISA_AVX512) ? ", avx512" : "");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nvfp4_w4a16),  cmocka_unit_test(test_mxfp4_w4a16),
        cmocka_unit_test(test_bf16_w4a16),   cmocka_unit_test(test_nvfp4_w4a4),
        cmocka_unit_test(test_mxfp4_w4a8),   cmocka_unit_test(test_nvfp4_w4a16_bf16),
        cmocka_unit_test(test_mxfp4_w4a16_bf16), cmocka_unit_test(test_bf16_w4a16_bf16),
        cmocka_unit_test(test_bf16_controls), cmocka_unit_test(test_skewed_routing),
        cmocka_unit_test(test_ep_ranks_sum), cmocka_unit_test(test_threads_identical),
        cmocka_unit_test(test_mutations_fail), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_special_scales), cmocka_unit_test(test_situ_vector),
        cmocka_unit_test(test_kernel_row_lengths),
        cmocka_unit_test(test_kernel_float64_extreme_lane),
    };
    return cmocka_run_group_tests_name("moe_cpu", tests, setup, teardown);
}
