/* The float64 reference of the routed experts, the block and in-process expert parallelism.
 *
 * Oracles: fx_master_ref (moe_fixture.h), a direct double loop over the float masters, for
 * F32 banks (where the stored weights ARE the masters) to ~1e-13, and as the unquantized
 * golden for the NVFP4/MXFP4 end-to-end cosines; tests/py/test_moe_ref_oracle.py checks the
 * same against numpy. Mode W4A16_BF16: a hand-computed bank whose every value is exact (ties
 * included), and a direct double loop with its own bf16 roundings. */
/* cmocka needs these first, in this order */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "moe/routing.h"
#include "moe_fixture.h"

#include <stdio.h>

enum { T = 8, K = 2 };

static double *run_ref(const k3_experts *ex, k3_act_mode mode, const float *x, int t,
                       const int32_t *ids, const float *w, int k) {
    double *y = malloc((size_t)t * (size_t)ex->hidden * sizeof *y);
    for (int i = 0; i < t * ex->hidden; i++)
        y[i] = NAN; /* poison */
    k3_error e = {0};
    if (k3_moe_experts_ref(ex, mode, x, t, ids, w, k, y, &e))
        fail_msg("reference: %s", e.msg);
    for (int i = 0; i < t * ex->hidden; i++)
        if (!isfinite(y[i]))
            fail_msg("y[%d] not overwritten / not finite", i);
    return y;
}

/* Every activation on an F32 bank against the direct loop over the masters. */
static void test_f32_bank_vs_masters(void **state) {
    (void)state;
    for (int a = 1; a < K3_ACT_COUNT; a++) {
        moe_fixture f;
        assert_int_equal(fx_build(&f, 6, 64, 48, K3_WFMT_F32, (k3_act)a, 2.5f, 7.0f, 10 + a), 0);
        if (a == K3_ACT_SWIGLU_BIAS)
            f.ex.act.limit = NULL;
        fx_rng r = {77};
        float x[T * 64], w[T * K];
        int32_t ids[T * K];
        fx_fill_normal(&r, x, T * 64, 0.5);
        fx_route(&r, T, 6, K, ids, w);
        double *y = run_ref(&f.ex, K3_MODE_W4A16, x, T, ids, w, K);
        double *g = malloc(T * 64 * sizeof *g);
        fx_master_ref(&f, (k3_act)a, 2.5f, 7.0f, 0, x, T, ids, w, K, g);
        double err = fx_rel_l2(y, g, T * 64);
        /* bound: double rounding of sums of ~100 terms */
        if (!(err <= 1e-13))
            fail_msg("%s: rel L2 %g > 1e-13", k3_act_name((k3_act)a), err);
        if (k3_act_is_gated((k3_act)a)) { /* mutations: each fails this test's bound */
            fx_master_ref(&f, (k3_act)a, 2.5f, 7.0f, 1, x, T, ids, w, K, g);
            double swapped = fx_rel_l2(y, g, T * 64);
            if (!(swapped > 1e-6))
                fail_msg("%s: w1/w3 swap undetected (%g)", k3_act_name((k3_act)a), swapped);
        }
        if (a == K3_ACT_SITU) {
            fx_master_ref(&f, (k3_act)a, 7.0f, 2.5f, 0, x, T, ids, w, K, g);
            double swapped = fx_rel_l2(y, g, T * 64);
            if (!(swapped > 1e-6))
                fail_msg("situ: beta swap undetected (%g)", swapped);
        }
        free(y), free(g);
        fx_free(&f);
    }
}

/* Routing corner cases: an expert nobody picks, every token on one expert, non-local slots. */
static void test_routing_corners(void **state) {
    (void)state;
    moe_fixture f;
    assert_int_equal(fx_build(&f, 5, 32, 32, K3_WFMT_F32, K3_ACT_SITU, 4.0f, 25.0f, 3), 0);
    fx_rng r = {5};
    float x[T * 32], w[T * K];
    int32_t ids[T * K];
    fx_fill_normal(&r, x, T * 32, 0.5);
    for (int t = 0; t < T; t++)
        ids[t * K] = 2, ids[t * K + 1] = t % 2 ? 4 : 0, w[t * K] = 0.7f, w[t * K + 1] = 0.3f;
    double *y = run_ref(&f.ex, K3_MODE_W4A16, x, T, ids, w, K); /* experts 1, 3: zero tokens */
    double *g = malloc(T * 32 * sizeof *g);
    fx_master_ref(&f, K3_ACT_SITU, 4.0f, 25.0f, 0, x, T, ids, w, K, g);
    assert_true(fx_rel_l2(y, g, T * 32) <= 1e-13);
    free(y);
    /* All tokens, both slots, on expert 4 (K=2 with a repeated id is legal for the operator). */
    for (int i = 0; i < T * K; i++)
        ids[i] = 4;
    y = run_ref(&f.ex, K3_MODE_W4A16, x, T, ids, w, K);
    fx_master_ref(&f, K3_ACT_SITU, 4.0f, 25.0f, 0, x, T, ids, w, K, g);
    assert_true(fx_rel_l2(y, g, T * 32) <= 1e-13);
    free(y);
    /* A view holding only experts [1, 3): token slots on 0 and 4 contribute exactly nothing. */
    k3_experts v;
    assert_int_equal(k3_experts_view(&f.ex, 1, 2, &v, NULL), K3_OK);
    for (int t = 0; t < T; t++)
        ids[t * K] = 0, ids[t * K + 1] = 4;
    y = run_ref(&v, K3_MODE_W4A16, x, T, ids, w, K);
    for (int i = 0; i < T * 32; i++)
        assert_true(y[i] == 0.0);
    free(y), free(g);
    fx_free(&f);
}

static void test_errors(void **state) {
    (void)state;
    moe_fixture f;
    assert_int_equal(fx_build(&f, 4, 32, 32, K3_WFMT_NVFP4, K3_ACT_SITU, 4.0f, 25.0f, 4), 0);
    float x[32 * 2] = {0}, w[2] = {1, 1};
    int32_t ids[2] = {0, 4};
    double y[64];
    k3_error e = {0};
    assert_int_equal(k3_moe_experts_ref(&f.ex, K3_MODE_W4A16, x, 1, ids, w, 2, y, &e), K3_ERR_ARG);
    assert_non_null(strstr(e.msg, "topk_ids[0][1]"));
    ids[1] = 1;
    x[5] = NAN;
    assert_int_equal(k3_moe_experts_ref(&f.ex, K3_MODE_W4A16, x, 1, ids, w, 2, y, &e),
                     K3_ERR_NUMERIC);
    assert_non_null(strstr(e.msg, "x[0][5]"));
    x[5] = 0;
    w[1] = INFINITY;
    assert_int_equal(k3_moe_experts_ref(&f.ex, K3_MODE_W4A16, x, 1, ids, w, 2, y, &e),
                     K3_ERR_NUMERIC);
    w[1] = 1;
    f.e[2].w2.input_scale = 0;
    assert_int_equal(k3_moe_experts_ref(&f.ex, K3_MODE_W4A4, x, 1, ids, w, 2, y, &e),
                     K3_ERR_MISSING);
    assert_non_null(strstr(e.msg, "input_scale"));
    assert_non_null(strstr(e.msg, "expert 2"));
    /* W4A16_BF16 rounds to bf16, which needs no static scale */
    assert_int_equal(k3_moe_experts_ref(&f.ex, K3_MODE_W4A16_BF16, x, 1, ids, w, 2, y, &e), K3_OK);
    assert_int_equal(k3_moe_experts_ref(&f.ex, K3_MODE_W4A8, x, 1, ids, w, 2, y, &e), K3_ERR_DTYPE);
    assert_non_null(strstr(e.msg, "MXFP4"));
    f.e[2].w2.input_scale = 1;
    f.e[1].w3.rows = 31;
    assert_int_equal(k3_moe_experts_ref(&f.ex, K3_MODE_W4A16, x, 1, ids, w, 2, y, &e),
                     K3_ERR_SHAPE);
    assert_non_null(strstr(e.msg, "w3"));
    /* Non-gated activations never read w3: the same bad w3 is fine for SiLU. */
    f.ex.act = (k3_act_params){.act = K3_ACT_SILU};
    assert_int_equal(k3_moe_experts_ref(&f.ex, K3_MODE_W4A16, x, 1, ids, w, 2, y, &e), K3_OK);
    f.ex.act = (k3_act_params){.act = K3_ACT_SITU, .alpha = f.alpha, .beta = NULL};
    assert_int_equal(k3_moe_experts_ref(&f.ex, K3_MODE_W4A16, x, 1, ids, w, 2, y, &e),
                     K3_ERR_MISSING);
    assert_non_null(strstr(e.msg, "beta"));
    fx_free(&f);
    assert_int_equal(fx_build(&f, 4, 32, 32, K3_WFMT_MXFP4, K3_ACT_SITU, 4.0f, 25.0f, 4), 0);
    assert_int_equal(k3_moe_experts_ref(&f.ex, K3_MODE_W4A4, x, 1, ids, w, 2, y, &e), K3_ERR_DTYPE);
    assert_non_null(strstr(e.msg, "NVFP4"));
    assert_int_equal(k3_moe_experts_ref(&f.ex, K3_MODE_W4A8, x, 1, ids, w, 2, y, &e), K3_OK);
    assert_int_equal(k3_moe_experts_ref(&f.ex, K3_MODE_W4A16_BF16, x, 1, ids, w, 2, y, &e), K3_OK);
    assert_int_equal(k3_moe_experts_ref(&f.ex, K3_MODE_W4A16, x, 0, ids, w, 2, y, &e), K3_OK);
    fx_free(&f);
}

static void test_mode_names(void **state) {
    (void)state;
    for (int m = 0; m < K3_MODE_COUNT; m++) {
        k3_act_mode back = K3_MODE_COUNT;
        assert_int_equal(k3_act_mode_from_name(k3_act_mode_name((k3_act_mode)m), &back, NULL),
                         K3_OK);
        assert_int_equal(back, m);
    }
    assert_string_equal(k3_act_mode_name(K3_MODE_W4A16_BF16), "w4a16-bf16");
    assert_string_equal(k3_act_mode_name(K3_MODE_COUNT), "invalid");
    k3_act_mode out = K3_MODE_W4A4;
    k3_error e = {0};
    assert_int_equal(k3_act_mode_from_name("w4a16_bf16", &out, &e), K3_ERR_ARG);
    assert_int_equal(out, K3_MODE_W4A4); /* untouched on failure */
    assert_non_null(strstr(e.msg, "'w4a16_bf16'"));
    for (int m = 0; m < K3_MODE_COUNT; m++) /* the message offers every name */
        assert_non_null(strstr(e.msg, k3_act_mode_name((k3_act_mode)m)));
    assert_int_equal(k3_act_mode_from_name(NULL, &out, &e), K3_ERR_ARG);
    assert_int_equal(k3_act_mode_from_name("invalid", &out, &e), K3_ERR_ARG);
}

/* bf16 rounding (round to nearest even) of x and of the hidden, on values where it matters,
 * all exact: F32 weights that are small sums of powers of two, the identity activation,
 * one token, one slot of weight 1. bf16 keeps 8 significant bits: its ulp is 2^-7 on [1, 2)
 * and 2^-6 on [2, 4).
 *   x          = 1 + 2^-9 (1/4 ulp: down), 1 + 3*2^-9 (3/4 ulp: up),
 *                1 + 2^-8 (tie: to even 1), 1 + 3*2^-8 (tie: to even 1 + 2^-6)
 *   bf16(x)    = 1, 1 + 2^-7, 1, 1 + 2^-6
 * Expert 0, w1 rows [1 1 0 0], [0 1 0 1], [2 + 2^-7, 0, 2^-30, 0]:
 *   h          = 2 + 2^-7 (tie: to even 2), 2 + 3*2^-7 (tie: to even 2 + 2^-5),
 *                2 + 2^-7 + 2^-30 (float first: 2 + 2^-7, a tie, so 2; rounded straight from
 *                double it would be 2 + 2^-6)
 *   w2 rows [1 0 0], [0 1 0], [0 0 1], [1 1 1]  ->  y = 2, 2 + 2^-5, 2, 6 + 2^-5.
 * Expert 1, w1 rows [1 0 1 0], [0 1 0 0], [0 0 0 1]: h on bf16(x) = 2, 1 + 2^-7, 1 + 2^-6 is
 * bf16 already, so W4A16_BF16 on x equals plain W4A16 on bf16(x) exactly, and plain W4A16 on
 * x differs. No shape quantum: H = 4, I = 3. */
static void test_w4a16_bf16_hand(void **state) {
    (void)state;
    enum { HH = 4, II = 3 };
    const float x[HH] = {1 + 0x1p-9f, 1 + 0x3p-9f, 1 + 0x1p-8f, 1 + 0x3p-8f};
    const float xb[HH] = {1, 1 + 0x1p-7f, 1, 1 + 0x1p-6f};
    static const float w1[2][II * HH] = {{1, 1, 0, 0, 0, 1, 0, 1, 2 + 0x1p-7f, 0, 0x1p-30f, 0},
                                         {1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1}};
    static const float w2[HH * II] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1};
    k3_expert ev[2];
    for (int i = 0; i < 2; i++)
        ev[i] = (k3_expert){
            .w1 = {.fmt = K3_WFMT_F32, .rows = II, .cols = HH, .data = w1[i], .global_scale = 1},
            .w2 = {.fmt = K3_WFMT_F32, .rows = HH, .cols = II, .data = w2, .global_scale = 1}};
    k3_experts ex = {.n_experts = 2,
                     .n_local = 2,
                     .hidden = HH,
                     .inter = II,
                     .e = ev,
                     .act = {.act = K3_ACT_IDENTITY}};
    const float w[1] = {1};
    int32_t id[1] = {0};
    double *y = run_ref(&ex, K3_MODE_W4A16_BF16, x, 1, id, w, 1);
    const double want[HH] = {2, 2 + 0x1p-5, 2, 6 + 0x1p-5};
    for (int c = 0; c < HH; c++)
        if (y[c] != want[c])
            fail_msg("expert 0: y[%d] = %.17g, expected %.17g", c, y[c], want[c]);
    double *plain = run_ref(&ex, K3_MODE_W4A16, x, 1, id, w, 1);
    assert_true(plain[0] == 2 + 0x1p-7); /* no rounding anywhere: x0 + x1 */
    free(y), free(plain);

    id[0] = 1;
    y = run_ref(&ex, K3_MODE_W4A16_BF16, x, 1, id, w, 1);
    plain = run_ref(&ex, K3_MODE_W4A16, xb, 1, id, w, 1);
    assert_memory_equal(y, plain, HH * sizeof *y);
    assert_true(y[3] == 4 + 0x3p-7); /* 2 + 1 + 2^-7 + 1 + 2^-6 */
    free(plain);
    plain = run_ref(&ex, K3_MODE_W4A16, x, 1, id, w, 1);
    assert_false(plain[0] == y[0]);
    free(y), free(plain);
}

static double bf16_round(double v) {
    return k3_bf16_to_f32(k3_f32_to_bf16((float)v));
}

/* W4A16_BF16 written out for an F32 bank (stored weights = masters): x rounded to bf16, FC1 in
 * double, the activation in double, the hidden rounded to float and then to bf16, FC2 in
 * double. round_h = 0 leaves the hidden unrounded (a mutation the bound must catch). */
static void bf16_loop(const moe_fixture *f, int round_h, const float *x, int t_n,
                      const int32_t *ids, const float *w, int k, double *y) {
    int H = f->H, I = f->I;
    size_t n = (size_t)H * (size_t)I;
    double *xb = malloc((size_t)H * sizeof *xb), *h = malloc((size_t)I * sizeof *h);
    for (int t = 0; t < t_n; t++) {
        for (int c = 0; c < H; c++)
            xb[c] = bf16_round(x[t * H + c]);
        double *yt = y + (size_t)t * (size_t)H;
        for (int c = 0; c < H; c++)
            yt[c] = 0;
        for (int j = 0; j < k; j++) {
            int e = ids[t * k + j];
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0;
                for (int c = 0; c < H; c++) {
                    g += (double)f->w1m[n * (size_t)e + (size_t)i * H + c] * xb[c];
                    u += (double)f->w3m[n * (size_t)e + (size_t)i * H + c] * xb[c];
                }
                h[i] = k3_act_f64(&f->ex.act, e, g, u);
                if (round_h)
                    h[i] = bf16_round(h[i]);
            }
            for (int c = 0; c < H; c++) {
                double o = 0;
                for (int i = 0; i < I; i++)
                    o += (double)f->w2m[n * (size_t)e + (size_t)c * I + i] * h[i];
                yt[c] += (double)w[t * k + j] * o;
            }
        }
    }
    free(xb), free(h);
}

/* The reference in W4A16_BF16 against bf16_loop on random F32 banks, gated and not. */
static void test_w4a16_bf16_vs_loop(void **state) {
    (void)state;
    const k3_act acts[] = {K3_ACT_SITU, K3_ACT_RELU2, K3_ACT_SWIGLU};
    for (size_t a = 0; a < sizeof acts / sizeof *acts; a++) {
        moe_fixture f;
        assert_int_equal(fx_build(&f, 6, 64, 48, K3_WFMT_F32, acts[a], 4.0f, 25.0f, 50 + a), 0);
        fx_rng r = {91 + a};
        float x[T * 64], w[T * K];
        int32_t ids[T * K];
        fx_fill_normal(&r, x, T * 64, 0.5);
        fx_route(&r, T, 6, K, ids, w);
        double *y = run_ref(&f.ex, K3_MODE_W4A16_BF16, x, T, ids, w, K);
        double *g = malloc(T * 64 * sizeof *g);
        bf16_loop(&f, 1, x, T, ids, w, K, g);
        double err = fx_rel_l2(y, g, T * 64);
        /* bound: double rounding of sums of ~100 terms; both sum in the same order, so the
         * hidden values round to the same bf16 (a differing one would cost ~1e-3) */
        if (!(err <= 1e-13))
            fail_msg("%s: rel L2 %g > 1e-13", k3_act_name(acts[a]), err);
        bf16_loop(&f, 0, x, T, ids, w, K, g);
        double unrounded = fx_rel_l2(y, g, T * 64);
        if (!(unrounded > 1e-4))
            fail_msg("%s: hidden left unrounded undetected (%g)", k3_act_name(acts[a]), unrounded);
        double *plain = run_ref(&f.ex, K3_MODE_W4A16, x, T, ids, w, K);
        double none = fx_rel_l2(plain, g, T * 64);
        if (!(none > 1e-4))
            fail_msg("%s: plain W4A16 too close to W4A16_BF16 (%g)", k3_act_name(acts[a]), none);
        free(y), free(g), free(plain);
        fx_free(&f);
    }
}

/* End to end against the unquantized masters (TensorRT-LLM's K3 test, smaller shapes), with
 * the negative controls of moe.md §4: SwigluBias(4, 25) is measurably farther; swapping w1/w3
 * or the two betas (2.5 / 7.0) fails the bound. */
static void check_e2e(k3_wfmt fmt, k3_act_mode mode, float bg, float bl, double xscale) {
    enum { E = 8, H = 512, I = 256, TT = 8 };
    moe_fixture f;
    assert_int_equal(fx_build(&f, E, H, I, fmt, K3_ACT_SITU, bg, bl, 42), 0);
    fx_rng r = {2026};
    float *x = malloc(TT * H * sizeof *x), w[TT * K];
    int32_t ids[TT * K];
    fx_fill_normal(&r, x, TT * H, xscale);
    fx_route(&r, TT, E, K, ids, w);
    double *y = run_ref(&f.ex, mode, x, TT, ids, w, K);
    double *g = malloc(TT * H * sizeof *g);
    fx_master_ref(&f, K3_ACT_SITU, bg, bl, 0, x, TT, ids, w, K, g);
    double cos_ok = fx_cosine(y, g, TT * H), rel_ok = fx_rel_l2(y, g, TT * H);
    fprintf(stderr, "  %s %s betas %g/%g x*%g: cosine %.4f relL2 %.4f", k3_wfmt_name(fmt),
            k3_act_mode_name(mode), (double)bg, (double)bl, xscale, cos_ok, rel_ok);
    if (!(cos_ok >= 0.95))
        fail_msg("cosine %g < 0.95 against the masters", cos_ok);
    fx_master_ref(&f, K3_ACT_SWIGLU_BIAS, bg, bl, 0, x, TT, ids, w, K, g);
    double rel_swb = fx_rel_l2(y, g, TT * H);
    fprintf(stderr, "; vs SwigluBias relL2 %.3f", rel_swb);
    /* "measurably closer": at least twice as far from the SwigluBias control */
    if (!(rel_swb >= 2 * rel_ok))
        fail_msg("SwigluBias control not separated: %g vs %g", rel_swb, rel_ok);
    fx_master_ref(&f, K3_ACT_SITU, bg, bl, 1, x, TT, ids, w, K, g);
    double cos_swap = fx_cosine(y, g, TT * H);
    fx_master_ref(&f, K3_ACT_SITU, bl, bg, 0, x, TT, ids, w, K, g);
    double cos_beta = fx_cosine(y, g, TT * H);
    fprintf(stderr, "; w1/w3 swapped cosine %.3f; betas swapped cosine %.3f\n", cos_swap, cos_beta);
    if (!(cos_swap < 0.95))
        fail_msg("w1/w3 swap passes the bound: cosine %g", cos_swap);
    /* Only where the pre-activations reach tanh's knee (|g| ~ beta) does a beta swap show; with
     * x*0.5 at this width |g| ~ 0.6 and beta*tanh(g/beta) ~ g for either beta. */
    if (xscale >= 2 && !(cos_beta < 0.95))
        fail_msg("beta swap passes the bound: cosine %g", cos_beta);
    free(x), free(y), free(g);
    fx_free(&f);
}

static void test_e2e_nvfp4(void **state) {
    (void)state;
    check_e2e(K3_WFMT_NVFP4, K3_MODE_W4A16, 4.0f, 25.0f, 0.5);
    check_e2e(K3_WFMT_NVFP4, K3_MODE_W4A4, 4.0f, 25.0f, 0.5);
    check_e2e(K3_WFMT_NVFP4, K3_MODE_W4A4, 2.5f, 7.0f, 4.0);
    check_e2e(K3_WFMT_NVFP4, K3_MODE_W4A16_BF16, 4.0f, 25.0f, 0.5);
}

static void test_e2e_mxfp4(void **state) {
    (void)state;
    check_e2e(K3_WFMT_MXFP4, K3_MODE_W4A16, 4.0f, 25.0f, 0.5);
    check_e2e(K3_WFMT_MXFP4, K3_MODE_W4A8, 4.0f, 25.0f, 0.5);
    check_e2e(K3_WFMT_MXFP4, K3_MODE_W4A8, 2.5f, 7.0f, 4.0);
    check_e2e(K3_WFMT_MXFP4, K3_MODE_W4A16_BF16, 2.5f, 7.0f, 4.0);
}

/* Expert parallelism: per-slot outputs summed over ranks equal the single-rank ones bit for
 * bit (so the finalized y does too), for even and uneven partitions and every mode. The
 * y-space sum of ranks (k3_moe_experts_ep_sum) matches to float rounding. */
static void check_ep(k3_wfmt fmt, k3_act_mode mode, int E, int R) {
    enum { H = 64, I = 64 };
    moe_fixture f;
    assert_int_equal(fx_build(&f, E, H, I, fmt, K3_ACT_SITU, 4.0f, 25.0f, 9), 0);
    fx_rng r = {31};
    float x[T * H], w[T * 4];
    int32_t ids[T * 4];
    fx_fill_normal(&r, x, T * H, 0.5);
    fx_route(&r, T, E, 4, ids, w);
    size_t n = (size_t)T * 4 * H;
    double *one = malloc(n * sizeof *one), *sum = calloc(n, sizeof *sum),
           *part = malloc(n * sizeof *part);
    k3_error e = {0};
    if (k3_moe_experts_ref_slots(&f.ex, mode, x, T, ids, 4, one, &e))
        fail_msg("%s", e.msg);
    int covered = 0;
    for (int rk = 0; rk < R; rk++) {
        int first, count;
        k3_experts v;
        assert_int_equal(k3_moe_ep_range(E, R, rk, &first, &count, NULL), K3_OK);
        assert_int_equal(first, covered);
        covered += count;
        assert_int_equal(k3_experts_view(&f.ex, first, count, &v, NULL), K3_OK);
        for (size_t i = 0; i < n; i++)
            part[i] = NAN;
        if (k3_moe_experts_ref_slots(&v, mode, x, T, ids, 4, part, &e))
            fail_msg("%s", e.msg);
        for (size_t i = 0; i < n; i++)
            sum[i] += part[i];
    }
    assert_int_equal(covered, E);
    assert_memory_equal(sum, one, n * sizeof *sum);
    float *ys = malloc((size_t)T * H * sizeof *ys), *y1 = malloc((size_t)T * H * sizeof *y1);
    assert_int_equal(k3_moe_experts_ref_f32(NULL, &f.ex, mode, x, T, ids, w, 4, y1, NULL), K3_OK);
    assert_int_equal(k3_moe_experts_ep_sum(k3_moe_experts_ref_f32, NULL, &f.ex, R, mode, x, T, ids,
                                           w, 4, ys, &e),
                     K3_OK);
    double d = 0, s = 0;
    for (int i = 0; i < T * H; i++)
        d += (double)(ys[i] - y1[i]) * (ys[i] - y1[i]), s += (double)y1[i] * y1[i];
    /* bound: float rounding of the R partial sums */
    if (!(sqrt(d / s) <= 1e-6))
        fail_msg("ep_sum rel L2 %g > 1e-6", sqrt(d / s));
    free(one), free(sum), free(part), free(ys), free(y1);
    fx_free(&f);
}

static void test_ep(void **state) {
    (void)state;
    check_ep(K3_WFMT_BF16, K3_MODE_W4A16, 8, 4);  /* even */
    check_ep(K3_WFMT_BF16, K3_MODE_W4A16, 7, 3);  /* uneven: 3, 2, 2 */
    check_ep(K3_WFMT_NVFP4, K3_MODE_W4A4, 7, 3);  /* same input_scale everywhere: same codes */
    check_ep(K3_WFMT_MXFP4, K3_MODE_W4A8, 10, 4); /* uneven: 3, 3, 2, 2 */
    check_ep(K3_WFMT_NVFP4, K3_MODE_W4A16_BF16, 7, 3);
    k3_error e = {0};
    int first, count;
    assert_int_equal(k3_moe_ep_range(3, 4, 0, &first, &count, &e), K3_ERR_ARG);
    assert_int_equal(k3_moe_ep_range(8, 4, 4, &first, &count, &e), K3_ERR_ARG);
    assert_int_equal(k3_moe_ep_range(896, 16, 15, &first, &count, NULL), K3_OK);
    assert_int_equal(first, 840);
    assert_int_equal(count, 56);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_bank_vs_masters),
        cmocka_unit_test(test_routing_corners),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_mode_names),
        cmocka_unit_test(test_w4a16_bf16_hand),
        cmocka_unit_test(test_w4a16_bf16_vs_loop),
        cmocka_unit_test(test_e2e_nvfp4),
        cmocka_unit_test(test_e2e_mxfp4),
        cmocka_unit_test(test_ep),
    };
    return cmocka_run_group_tests_name("moe_ref", tests, NULL, NULL);
}
