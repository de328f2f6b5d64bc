/* Activations: closed forms, float vs double, the gated table, parameter validation. */
/* cmocka needs these first, in this order */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe/activation.h"

static k3_act_params P(k3_act a, const float *al, const float *be, const float *li) {
    return (k3_act_params){.act = a, .alpha = al, .beta = be, .limit = li};
}

/* Written out independently of activation.c (different formula where one exists). */
static double sig(double x) {
    return 0.5 * (1.0 + tanh(0.5 * x));
}
static double situ_closed(double g, double u, double bg, double bl) {
    /* beta*tanh(x/beta) = 2*beta*sigma(2x/beta) - beta */
    return (2 * bg * sig(2 * g / bg) - bg) * sig(g) * (2 * bl * sig(2 * u / bl) - bl);
}

static void test_closed_forms(void **state) {
    (void)state;
    const float a4[1] = {4.0f}, b25[1] = {25.0f};
    k3_act_params p;
    /* Known values: gelu(1) = 0.5*(1+erf(1/sqrt2)), silu(1) = 1/(1+e^-1). */
    p = P(K3_ACT_GELU, NULL, NULL, NULL);
    assert_true(fabs(k3_act_f64(&p, 0, 1.0, 0) - 0.8413447460685429) < 1e-15);
    assert_true(fabs(k3_act_f64(&p, 0, -2.0, 0) - (-0.04550026389635842)) < 1e-15);
    p = P(K3_ACT_SILU, NULL, NULL, NULL);
    assert_true(fabs(k3_act_f64(&p, 0, 1.0, 0) - 0.7310585786300049) < 1e-15);
    p = P(K3_ACT_RELU, NULL, NULL, NULL);
    assert_true(k3_act_f64(&p, 0, -3.0, 0) == 0.0 && k3_act_f64(&p, 0, 2.5, 0) == 2.5);
    p = P(K3_ACT_RELU2, NULL, NULL, NULL);
    assert_true(k3_act_f64(&p, 0, -3.0, 0) == 0.0 && k3_act_f64(&p, 0, 3.0, 0) == 9.0);
    p = P(K3_ACT_IDENTITY, NULL, NULL, NULL);
    assert_true(k3_act_f64(&p, 0, -3.25, 7.0) == -3.25);
    srand(7);
    for (int i = 0; i < 2000; i++) {
        double g = ((double)rand() / RAND_MAX - 0.5) * 80,
               u = ((double)rand() / RAND_MAX - 0.5) * 200;
        p = P(K3_ACT_SWIGLU, NULL, NULL, NULL);
        assert_true(fabs(k3_act_f64(&p, 0, g, u) - g * sig(g) * u) <= 1e-12 * (1 + fabs(g * u)));
        p = P(K3_ACT_GEGLU, NULL, NULL, NULL);
        double ge = 0.5 * g * (1.0 + erf(g / sqrt(2.0)));
        assert_true(fabs(k3_act_f64(&p, 0, g, u) - ge * u) <= 1e-12 * (1 + fabs(g * u)));
        p = P(K3_ACT_SITU, a4, b25, NULL);
        double want = situ_closed(g, u, 4, 25);
        assert_true(fabs(k3_act_f64(&p, 0, g, u) - want) <= 1e-12 * (1 + fabs(want)));
    }
    /* SiTU saturates: |out| < beta_g * beta_l. */
    p = P(K3_ACT_SITU, a4, b25, NULL);
    assert_true(fabs(k3_act_f64(&p, 0, 1e4, 1e4) - 100.0) < 1e-9);
    assert_true(fabs(k3_act_f64(&p, 0, -1e4, 1e4)) < 1e-9);
}

static void test_swiglu_bias_clamp(void **state) {
    (void)state;
    const float al[2] = {1.702f, 1.0f}, be[2] = {1.0f, 0.5f}, li[2] = {7.0f, 2.0f};
    k3_act_params p = P(K3_ACT_SWIGLU_BIAS, al, be, li);
    /* expert 1: alpha 1, beta 0.5, limit 2. g above the limit is clamped, g below is not. */
    double g = 5, u = -9;
    double want = 2.0 * sig(2.0) * (-2.0 + 0.5);
    assert_true(fabs(k3_act_f64(&p, 1, g, u) - want) < 1e-14);
    want = -5.0 * sig(-5.0) * (2.0 + 0.5);
    assert_true(fabs(k3_act_f64(&p, 1, -5, 9) - want) < 1e-14);
    /* expert 0 uses its own alpha: g*sigma(1.702 g)*(u+1). */
    want = 1.5 * sig((double)1.702f * 1.5) * (0.25 + 1.0);
    assert_true(fabs(k3_act_f64(&p, 0, 1.5, 0.25) - want) < 1e-14);
    /* No limit array: +inf, nothing clamped. */
    p = P(K3_ACT_SWIGLU_BIAS, al, be, NULL);
    want = 50.0 * sig(50.0) * (-90.0 + 0.5);
    assert_true(fabs(k3_act_f64(&p, 1, 50, -90) - want) < 1e-12);
    /* No alpha / beta arrays: the kernel defaults alpha 1, beta 0 (moe.md §1.2), in both
     * precisions and accepted by validation. */
    p = P(K3_ACT_SWIGLU_BIAS, NULL, NULL, li);
    assert_int_equal(k3_act_params_validate(&p, 2, NULL), K3_OK);
    want = 1.5 * sig(1.5) * 0.25;
    assert_true(fabs(k3_act_f64(&p, 0, 1.5, 0.25) - want) < 1e-14);
    assert_true(fabs(k3_act_f32(&p, 0, 1.5f, 0.25f) - want) < 1e-6);
    p = P(K3_ACT_SWIGLU_BIAS, NULL, be, NULL);
    want = 1.5 * sig(1.5) * (0.25 + 0.5);
    assert_true(fabs(k3_act_f64(&p, 1, 1.5, 0.25) - want) < 1e-14);
}

static void test_f32_matches_f64(void **state) {
    (void)state;
    const float al[1] = {2.5f}, be[1] = {7.0f}, li[1] = {6.0f};
    srand(11);
    for (int a = 1; a < K3_ACT_COUNT; a++) {
        k3_act_params p = P((k3_act)a, al, be, a == K3_ACT_SWIGLU_BIAS ? li : NULL);
        double worst = 0;
        for (int i = 0; i < 4000; i++) {
            float g = ((float)rand() / (float)RAND_MAX - 0.5f) * 30;
            float u = ((float)rand() / (float)RAND_MAX - 0.5f) * 30;
            double d = k3_act_f64(&p, 0, g, u);
            double f = k3_act_f32(&p, 0, g, u);
            double e = fabs(f - d) / (fabs(d) + 1e-3);
            if (!(e <= worst))
                worst = e;
        }
        /* bound: a few float ulps of the largest term */
        if (!(worst <= 2e-6))
            fail_msg("%s: float vs double rel err %g > 2e-6", k3_act_name((k3_act)a), worst);
    }
    float g[5] = {-2, -1, 0, 1, 2}, u[5] = {3, 2, 1, 0, -1}, o[5];
    k3_act_params p = P(K3_ACT_SITU, al, be, NULL);
    k3_act_row_f32(&p, 0, g, u, o, 5);
    for (int i = 0; i < 5; i++)
        assert_true(o[i] == k3_act_f32(&p, 0, g[i], u[i]));
}

static void test_gated_table(void **state) {
    (void)state;
    /* The set moe.md §1.3 names, written here independently of activation.c. */
    for (int a = -1; a <= K3_ACT_COUNT; a++) {
        bool want =
            a == K3_ACT_SWIGLU || a == K3_ACT_GEGLU || a == K3_ACT_SWIGLU_BIAS || a == K3_ACT_SITU;
        assert_int_equal(k3_act_is_gated((k3_act)a), want);
        if (a > 0 && a < K3_ACT_COUNT)
            assert_int_equal(k3_act_fc1_rows((k3_act)a, 3072), want ? 6144 : 3072);
    }
    for (int a = 1; a < K3_ACT_COUNT; a++) {
        k3_act back;
        assert_int_equal(k3_act_from_name(k3_act_name((k3_act)a), &back, NULL), K3_OK);
        assert_int_equal(back, a);
    }
    k3_error e = {0};
    k3_act back;
    assert_int_equal(k3_act_from_name("swish", &back, &e), K3_ERR_ARG);
    assert_non_null(strstr(e.msg, "swish"));
}

static void expect_fail(const k3_act_params *p, int n, int status, const char *a, const char *b) {
    k3_error e = {0};
    int rc = k3_act_params_validate(p, n, &e);
    if (rc != status)
        fail_msg("expected status %d, got %d (%s)", status, rc, e.msg);
    if (a && !strstr(e.msg, a))
        fail_msg("message '%s' does not name '%s'", e.msg, a);
    if (b && !strstr(e.msg, b))
        fail_msg("message '%s' does not name '%s'", e.msg, b);
}

static void test_validation(void **state) {
    (void)state;
    float al[3] = {4, 4, 4}, be[3] = {25, 25, 25}, li[3] = {7, 7, 7};
    k3_act_params p = P(K3_ACT_SITU, al, be, NULL);
    assert_int_equal(k3_act_params_validate(&p, 3, NULL), K3_OK);
    expect_fail(&(k3_act_params){K3_ACT_SITU, NULL, be, NULL}, 3, K3_ERR_MISSING, "alpha", NULL);
    expect_fail(&(k3_act_params){K3_ACT_SITU, al, NULL, NULL}, 3, K3_ERR_MISSING, "beta", NULL);
    expect_fail(&(k3_act_params){K3_ACT_SITU, al, be, li}, 3, K3_ERR_UNSUPPORTED, "limit", NULL);
    be[2] = 0;
    expect_fail(&p, 3, K3_ERR_NUMERIC, "beta", "expert 2");
    be[2] = -1;
    expect_fail(&p, 3, K3_ERR_NUMERIC, "beta", "expert 2");
    be[2] = INFINITY;
    expect_fail(&p, 3, K3_ERR_NUMERIC, "beta", "expert 2");
    be[2] = 25;
    al[1] = NAN;
    expect_fail(&p, 3, K3_ERR_NUMERIC, "alpha", "expert 1");
    al[1] = 4;
    /* SwigluBias: arrays optional (defaults 1 / 0) but finite where given; limit optional, NaN
     * rejected, +inf accepted. */
    p = P(K3_ACT_SWIGLU_BIAS, al, be, NULL);
    assert_int_equal(k3_act_params_validate(&p, 3, NULL), K3_OK);
    assert_int_equal(k3_act_params_validate(&(k3_act_params){K3_ACT_SWIGLU_BIAS, NULL, be, NULL}, 3, NULL),
                     K3_OK);
    assert_int_equal(k3_act_params_validate(&(k3_act_params){K3_ACT_SWIGLU_BIAS, al, NULL, li}, 3, NULL),
                     K3_OK);
    {
        float bad[3] = {0, INFINITY, 0};
        expect_fail(&(k3_act_params){K3_ACT_SWIGLU_BIAS, NULL, bad, NULL}, 3, K3_ERR_NUMERIC, "beta",
                    "expert 1");
    }
    li[0] = INFINITY;
    p.limit = li;
    assert_int_equal(k3_act_params_validate(&p, 3, NULL), K3_OK);
    li[2] = NAN;
    expect_fail(&p, 3, K3_ERR_NUMERIC, "limit", "expert 2");
    /* Non-gated and plain gated activations need nothing; invalid values are rejected. */
    assert_int_equal(k3_act_params_validate(&(k3_act_params){K3_ACT_SILU, 0, 0, 0}, 3, NULL),
                     K3_OK);
    assert_int_equal(k3_act_params_validate(&(k3_act_params){K3_ACT_SWIGLU, 0, 0, 0}, 3, NULL),
                     K3_OK);
    expect_fail(&(k3_act_params){K3_ACT_INVALID, 0, 0, 0}, 3, K3_ERR_ARG, "activation", NULL);
    expect_fail(&(k3_act_params){K3_ACT_COUNT, 0, 0, 0}, 3, K3_ERR_ARG, "activation", NULL);
    expect_fail(&(k3_act_params){K3_ACT_SILU, 0, 0, 0}, 0, K3_ERR_ARG, "n_local", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_closed_forms),    cmocka_unit_test(test_swiglu_bias_clamp),
        cmocka_unit_test(test_f32_matches_f64), cmocka_unit_test(test_gated_table),
        cmocka_unit_test(test_validation),
    };
    return cmocka_run_group_tests_name("activation", tests, NULL, NULL);
}
