/* The whole MoE block (k3-architecture.md §5.4) with the reference operator, against a
 * direct float64 computation written here from the float masters: the K3 latent form
 * (router -> down-projection -> SiTU experts -> weighted sum -> RMSNorm -> up-projection,
 * plus the shared SiTU MLP on the full-width input), the same without the latent RMSNorm
 * (latent_moe_use_norm false) on the reference and CPU operators, and the Kimi-Linear form. */
/* cmocka needs these first, in this order */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "moe/moe_cpu.h"
#include "moe_fixture.h"

enum { TT = 6, W = 96, L = 64, I = 32, E = 6, K = 2, S = 48 };

typedef struct blockfx {
    moe_fixture f;
    float gate[E * W], bias[E], down[L * W], up[W * L], norm[L];
    uint16_t norm_bf16[L];
    float sg[S * W], su[S * W], sd[W * S];
    float one_a[1], one_b[1];
    k3_moe_block b;
} blockfx;

static bool g_norm_f16; /* store the latent norm weight as F16 instead of BF16 */
static bool g_no_norm;  /* latent block without routed_expert_norm */

static void build(blockfx *bf, bool latent, k3_act act) {
    int H = latent ? L : W;
    assert_int_equal(fx_build(&bf->f, E, H, I, K3_WFMT_F32, act, 4.0f, 25.0f, 17), 0);
    fx_rng r = {123};
    fx_fill_normal(&r, bf->gate, E * W, 0.1);
    fx_fill_normal(&r, bf->bias, E, 0.1);
    fx_fill_normal(&r, bf->down, L * W, 0.1);
    fx_fill_normal(&r, bf->up, W * L, 0.1);
    fx_fill_normal(&r, bf->sg, S * W, 0.1);
    fx_fill_normal(&r, bf->su, S * W, 0.1);
    fx_fill_normal(&r, bf->sd, W * S, 0.1);
    for (int i = 0; i < L; i++) {
        float v = (float)(1 + 0.2 * fx_normal(&r));
        bf->norm_bf16[i] = g_norm_f16 ? k3_f32_to_f16(v) : k3_f32_to_bf16(v);
        bf->norm[i] =
            g_norm_f16 ? k3_f16_to_f32(bf->norm_bf16[i]) : k3_bf16_to_f32(bf->norm_bf16[i]);
    }
    bf->one_a[0] = 4.0f, bf->one_b[0] = 25.0f;
    k3_qmat F = {.fmt = K3_WFMT_F32, .global_scale = 1};
    k3_moe_block *b = &bf->b;
    memset(b, 0, sizeof *b);
    b->model_width = W;
    b->router = (k3_router){.fn = K3_ROUTE_NOAUX_TC,
                            .n_experts = E,
                            .top_k = K,
                            .n_group = 1,
                            .topk_group = 1,
                            .renormalize = true,
                            .routed_scaling_factor = 1.0f,
                            .correction_bias = bf->bias};
    b->router.gate = F, b->router.gate.rows = E, b->router.gate.cols = W,
    b->router.gate.data = bf->gate;
    b->experts = bf->f.ex;
    b->latent = latent;
    if (latent) {
        b->latent_down = F, b->latent_down.rows = L, b->latent_down.cols = W,
        b->latent_down.data = bf->down;
        b->latent_up = F, b->latent_up.rows = W, b->latent_up.cols = L, b->latent_up.data = bf->up;
        b->latent_norm = g_no_norm ? NULL : bf->norm_bf16,
        b->latent_norm_fmt = g_norm_f16 ? K3_WFMT_F16 : K3_WFMT_BF16, b->norm_eps = 1e-5f;
    }
    b->n_shared = 2;
    b->shared_gate = F, b->shared_gate.rows = S, b->shared_gate.cols = W,
    b->shared_gate.data = bf->sg;
    b->shared_up = F, b->shared_up.rows = S, b->shared_up.cols = W, b->shared_up.data = bf->su;
    b->shared_down = F, b->shared_down.rows = W, b->shared_down.cols = S,
    b->shared_down.data = bf->sd;
    bool p = act == K3_ACT_SITU;
    b->shared_act =
        (k3_act_params){.act = act, .alpha = p ? bf->one_a : NULL, .beta = p ? bf->one_b : NULL};
}

static void matvec(const float *m, int rows, int cols, const double *x, double *y) {
    for (int o = 0; o < rows; o++) {
        double s = 0;
        for (int c = 0; c < cols; c++)
            s += (double)m[o * cols + c] * x[c];
        y[o] = s;
    }
}

/* The block, token by token, in double; routing by sigmoid + bias, top-k, renormalize. */
static void oracle(const blockfx *bf, const float *x, double *y, int32_t *ids, float *wts) {
    const k3_moe_block *b = &bf->b;
    int H = b->latent ? L : W;
    k3_act act = b->experts.act.act;
    k3_act_params p = {.act = act, .alpha = bf->one_a, .beta = bf->one_b};
    double xd[W], logit[E], z[W], r[W], g[S], u[S], h[S], o[W];
    for (int t = 0; t < TT; t++) {
        for (int c = 0; c < W; c++)
            xd[c] = x[t * W + c];
        matvec(bf->gate, E, W, xd, logit);
        double s[E], sel[E];
        int used[E] = {0};
        for (int e = 0; e < E; e++)
            s[e] = 1 / (1 + exp(-logit[e])), sel[e] = s[e] + bf->bias[e];
        double sum = 0;
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!used[e] && (best < 0 || sel[e] > sel[best]))
                    best = e;
            used[best] = 1, ids[t * K + j] = best, sum += s[best];
        }
        for (int j = 0; j < K; j++)
            wts[t * K + j] = (float)(s[ids[t * K + j]] / sum);
        if (b->latent)
            matvec(bf->down, L, W, xd, z);
        else
            memcpy(z, xd, sizeof xd);
        float zf[W];
        for (int c = 0; c < H; c++)
            zf[c] = (float)z[c];
        double *re = malloc((size_t)H * sizeof *re);
        fx_master_ref(&bf->f, act, 4.0f, 25.0f, 0, zf, 1, ids + t * K, wts + t * K, K, re);
        for (int c = 0; c < H; c++)
            r[c] = re[c];
        free(re);
        if (b->latent) {
            double ss = 0;
            for (int c = 0; c < L; c++)
                ss += r[c] * r[c];
            double inv = 1 / sqrt(ss / L + 1e-5);
            for (int c = 0; c < L && b->latent_norm; c++)
                r[c] = r[c] * inv * bf->norm[c];
            matvec(bf->up, W, L, r, o);
        } else {
            memcpy(o, r, sizeof o);
        }
        matvec(bf->sg, S, W, xd, g);
        matvec(bf->su, S, W, xd, u);
        for (int i = 0; i < S; i++)
            h[i] = k3_act_f64(&p, 0, g[i], u[i]);
        double sh[W];
        matvec(bf->sd, W, S, h, sh);
        for (int c = 0; c < W; c++)
            y[t * W + c] = o[c] + sh[c];
    }
}

static int cpu_experts(void *ctx, const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                       const int32_t *ids, const float *w, int k, float *y, k3_error *err) {
    (void)ctx;
    return k3_moe_experts_cpu(ex, mode, x, T, ids, w, k, y, NULL, err);
}

static void check_block_op(bool latent, k3_act act, int ep_size, k3_moe_experts_fn op) {
    blockfx *bf = calloc(1, sizeof *bf);
    build(bf, latent, act);
    fx_rng r = {555};
    float x[TT * W], y[TT * W], w[TT * K], ow[TT * K];
    int32_t ids[TT * K], oid[TT * K];
    fx_fill_normal(&r, x, TT * W, 1.0);
    for (int i = 0; i < TT * W; i++)
        y[i] = NAN; /* poison */
    k3_moe_backend be = {.experts = op, .mode = K3_MODE_W4A16, .ep_size = ep_size};
    k3_error e = {0};
    if (k3_moe_block_forward(&bf->b, &be, x, TT, y, ids, w, &e))
        fail_msg("block: %s", e.msg);
    double want[TT * W], got[TT * W];
    oracle(bf, x, want, oid, ow);
    for (int i = 0; i < TT * K; i++) {
        assert_int_equal(ids[i], oid[i]);
        assert_true(fabs(w[i] - ow[i]) <= 1e-6);
    }
    for (int i = 0; i < TT * W; i++)
        got[i] = y[i];
    double rel = fx_rel_l2(got, want, TT * W);
    /* bound: float rounding of each stage's output (5 stages, ~6e-8 each, amplified by the norm) */
    if (!(rel <= 1e-5))
        fail_msg("latent %d act %s ep %d: rel L2 %g > 1e-5", latent, k3_act_name(act), ep_size,
                 rel);
    fx_free(&bf->f);
    free(bf);
}

static void check_block(bool latent, k3_act act, int ep_size) {
    check_block_op(latent, act, ep_size, k3_moe_experts_ref_f32);
}

static void test_k3_latent_block(void **state) {
    (void)state;
    check_block(true, K3_ACT_SITU, 1);
    check_block(true, K3_ACT_SITU, 4); /* uneven: 2, 2, 1, 1 */
    g_norm_f16 = true;
    check_block(true, K3_ACT_SITU, 1);
    g_norm_f16 = false;
}

/* latent_moe_use_norm false: the weighted expert sum goes straight to the up-projection. */
static void test_latent_block_without_norm(void **state) {
    (void)state;
    g_no_norm = true;
    check_block_op(true, K3_ACT_SITU, 1, k3_moe_experts_ref_f32);
    check_block_op(true, K3_ACT_SITU, 3, k3_moe_experts_ref_f32);
    check_block_op(true, K3_ACT_SITU, 1, cpu_experts);
    g_no_norm = false;
}

static void test_kimi_linear_block(void **state) {
    (void)state;
    check_block(false, K3_ACT_SWIGLU, 1);
    check_block(false, K3_ACT_SWIGLU, 3);
}

static void test_block_errors(void **state) {
    (void)state;
    blockfx *bf = calloc(1, sizeof *bf);
    build(bf, true, K3_ACT_SITU);
    float x[TT * W] = {0}, y[TT * W];
    k3_moe_backend be = {.experts = k3_moe_experts_ref_f32, .mode = K3_MODE_W4A16};
    k3_error e = {0};
    /* no latent norm (latent_moe_use_norm false) is a valid block for every runner */
    bf->b.latent_norm = NULL;
    assert_int_equal(k3_moe_block_validate(&bf->b, K3_MODE_W4A16, &e), K3_OK);
    bf->b.latent_norm = bf->norm_bf16;
    bf->b.latent_up.cols = L + 1;
    assert_int_equal(k3_moe_block_forward(&bf->b, &be, x, TT, y, NULL, NULL, &e), K3_ERR_SHAPE);
    assert_non_null(strstr(e.msg, "up-projection"));
    bf->b.latent_up.cols = L;
    bf->b.shared_act.beta = NULL;
    assert_int_equal(k3_moe_block_forward(&bf->b, &be, x, TT, y, NULL, NULL, &e), K3_ERR_MISSING);
    assert_non_null(strstr(e.msg, "beta"));
    bf->b.shared_act.beta = bf->one_b;
    be.mode = K3_MODE_W4A4; /* F32 experts cannot run w4a4 */
    assert_int_equal(k3_moe_block_forward(&bf->b, &be, x, TT, y, NULL, NULL, &e), K3_ERR_DTYPE);
    be.mode = K3_MODE_W4A16;
    x[7] = NAN;
    assert_int_equal(k3_moe_block_forward(&bf->b, &be, x, TT, y, NULL, NULL, &e), K3_ERR_NUMERIC);
    x[7] = 0;
    bf->b.experts.n_local = E - 1;
    be.ep_size = 2;
    assert_int_equal(k3_moe_block_forward(&bf->b, &be, x, TT, y, NULL, NULL, &e), K3_ERR_ARG);
    fx_free(&bf->f);
    free(bf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_k3_latent_block),
        cmocka_unit_test(test_latent_block_without_norm),
        cmocka_unit_test(test_kimi_linear_block),
        cmocka_unit_test(test_block_errors),
    };
    return cmocka_run_group_tests_name("moe_block", tests, NULL, NULL);
}
