/* Routing against an independent implementation (sort-based, written here), plus ties,
 * NaN logits, all-equal scores and group-limited top-k. */
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

#include "moe/routing.h"

/* ---- the independent oracle: sort (score desc, id asc) with qsort ----------------- */

static const float *g_key;
static int cmp_desc(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (g_key[i] > g_key[j])
        return -1;
    if (g_key[i] < g_key[j])
        return 1;
    return i - j;
}
static void sort_ids(const float *key, int *idx, int n) {
    for (int i = 0; i < n; i++)
        idx[i] = i;
    g_key = key;
    qsort(idx, (size_t)n, sizeof *idx, cmp_desc);
}

static void oracle(const k3_router *r, const float *l, int32_t *ids, float *w) {
    int E = r->n_experts, K = r->top_k;
    float *s = calloc((size_t)E, sizeof *s), *sel = calloc((size_t)E, sizeof *sel);
    int *idx = calloc((size_t)E, sizeof *idx);
    if (r->fn == K3_ROUTE_NOAUX_TC || r->fn == K3_ROUTE_SIGMOID) {
        for (int e = 0; e < E; e++) {
            s[e] = (float)(1.0 / (1.0 + exp(-(double)l[e])));
            sel[e] = s[e] +
                     (r->fn == K3_ROUTE_NOAUX_TC && r->correction_bias ? r->correction_bias[e] : 0);
        }
    } else if (r->fn == K3_ROUTE_SOFTMAX_TOPK) {
        double m = -INFINITY, z = 0;
        for (int e = 0; e < E; e++)
            m = l[e] > m ? l[e] : m;
        for (int e = 0; e < E; e++)
            z += exp(l[e] - m);
        for (int e = 0; e < E; e++)
            sel[e] = s[e] = (float)(exp(l[e] - m) / z);
    } else {
        for (int e = 0; e < E; e++)
            sel[e] = s[e] = l[e];
    }
    if (r->fn == K3_ROUTE_NOAUX_TC && r->n_group > 1) {
        int G = r->n_group, per = E / G;
        float *gs = calloc((size_t)G, sizeof *gs);
        int *gi = calloc((size_t)G, sizeof *gi), *in = calloc((size_t)per, sizeof *in);
        for (int g = 0; g < G; g++) {
            sort_ids(sel + g * per, in, per);
            gs[g] = sel[g * per + in[0]] + (per > 1 ? sel[g * per + in[1]] : 0);
        }
        sort_ids(gs, gi, G);
        for (int j = r->topk_group; j < G; j++)
            for (int e = 0; e < per; e++)
                sel[gi[j] * per + e] = -INFINITY;
        free(gs), free(gi), free(in);
    }
    sort_ids(sel, idx, E);
    double sum = 0;
    for (int j = 0; j < K; j++) {
        ids[j] = idx[j];
        w[j] = s[idx[j]];
        sum += w[j];
    }
    if (r->fn == K3_ROUTE_RENORMALIZE) {
        double z = 0;
        for (int j = 0; j < K; j++)
            z += exp((double)s[idx[j]] - s[idx[0]]);
        for (int j = 0; j < K; j++)
            w[j] = (float)(exp((double)s[idx[j]] - s[idx[0]]) / z);
    } else if (r->renormalize) {
        for (int j = 0; j < K; j++)
            w[j] = (float)(w[j] / (sum + (r->fn == K3_ROUTE_SOFTMAX_TOPK ? 0 : 1e-20)));
    }
    for (int j = 0; j < K; j++)
        w[j] *= r->routed_scaling_factor;
    free(s), free(sel), free(idx);
}

static float frand(void) {
    return (float)rand() / (float)RAND_MAX * 2 - 1;
}

static k3_router R(k3_route_fn fn, int E, int K, int G, int TG, bool renorm, float scale,
                   const float *bias) {
    return (k3_router){.fn = fn,
                       .n_experts = E,
                       .top_k = K,
                       .n_group = G,
                       .topk_group = TG,
                       .renormalize = renorm,
                       .routed_scaling_factor = scale,
                       .correction_bias = bias};
}

static void check_against_oracle(const k3_router *r, const float *l, int T) {
    int K = r->top_k;
    int32_t *ids = malloc((size_t)(T * K) * sizeof *ids), oid[64];
    float *w = malloc((size_t)(T * K) * sizeof *w), ow[64];
    k3_error e = {0};
    int rc = k3_route_logits(r, l, T, ids, w, &e);
    if (rc)
        fail_msg("route failed: %s", e.msg);
    for (int t = 0; t < T; t++) {
        oracle(r, l + (int64_t)t * r->n_experts, oid, ow);
        for (int j = 0; j < K; j++) {
            if (ids[t * K + j] != oid[j])
                fail_msg("fn %d token %d slot %d: id %d, oracle %d", r->fn, t, j, ids[t * K + j],
                         oid[j]);
            double err = fabs((double)w[t * K + j] - ow[j]);
            /* bound: fp32 arithmetic in both, a few ulps of the weight */
            if (!(err <= 4e-7 * fabs(ow[j]) + 1e-30))
                fail_msg("fn %d token %d slot %d: weight %.9g, oracle %.9g", r->fn, t, j,
                         (double)w[t * K + j], (double)ow[j]);
        }
    }
    free(ids), free(w);
}

static void test_random_vs_oracle(void **state) {
    (void)state;
    srand(1234);
    enum { T = 40, E = 64 };
    float l[T * E], bias[E];
    for (int i = 0; i < T * E; i++)
        l[i] = frand() * 4;
    for (int e = 0; e < E; e++)
        bias[e] = frand() * 0.1f;
    k3_router rs[] = {
        R(K3_ROUTE_NOAUX_TC, E, 8, 1, 1, true, 1.0f, bias),
        R(K3_ROUTE_NOAUX_TC, E, 6, 8, 3, true, 2.5f, bias),
        R(K3_ROUTE_NOAUX_TC, E, 4, 16, 2, false, 1.0f, NULL),
        R(K3_ROUTE_SOFTMAX_TOPK, E, 8, 1, 1, false, 1.0f, NULL),
        R(K3_ROUTE_SOFTMAX_TOPK, E, 8, 1, 1, true, 1.0f, NULL),
        R(K3_ROUTE_RENORMALIZE, E, 8, 1, 1, true, 1.0f, NULL),
        R(K3_ROUTE_SIGMOID, E, 8, 1, 1, true, 1.0f, NULL),
        R(K3_ROUTE_SIGMOID, E, 8, 1, 1, false, 2.446f, NULL),
    };
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++)
        check_against_oracle(&rs[i], l, T);
}

static void test_noaux_properties(void **state) {
    (void)state;
    /* Bias selects, weights come from the unbiased sigmoid: expert 3 has the lowest logit but a
     * bias that lifts it to the top. */
    float l[4] = {1.0f, 0.5f, 0.0f, -1.0f}, bias[4] = {0, 0, 0, 5.0f};
    k3_router r = R(K3_ROUTE_NOAUX_TC, 4, 2, 1, 1, true, 1.0f, bias);
    int32_t ids[2];
    float w[2];
    assert_int_equal(k3_route_logits(&r, l, 1, ids, w, NULL), K3_OK);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 0);
    double s3 = 1 / (1 + exp(1.0)), s0 = 1 / (1 + exp(-1.0));
    assert_true(fabs(w[0] - s3 / (s3 + s0)) < 1e-6 && fabs(w[1] - s0 / (s3 + s0)) < 1e-6);
    assert_true(fabs((double)w[0] + w[1] - 1.0) < 1e-6);
    /* routed_scaling_factor multiplies after renormalization */
    r.routed_scaling_factor = 2.5f;
    assert_int_equal(k3_route_logits(&r, l, 1, ids, w, NULL), K3_OK);
    assert_true(fabs((double)w[0] + w[1] - 2.5) < 1e-5);
}

static void test_ties_and_all_equal(void **state) {
    (void)state;
    enum { E = 16 };
    float l[E];
    for (int e = 0; e < E; e++)
        l[e] = 0.25f;
    for (int fn = 0; fn < K3_ROUTE_COUNT; fn++) {
        k3_router r = R((k3_route_fn)fn, E, 5, 1, 1, true, 1.0f, NULL);
        int32_t ids[5];
        float w[5];
        assert_int_equal(k3_route_logits(&r, l, 1, ids, w, NULL), K3_OK);
        for (int j = 0; j < 5; j++) {
            assert_int_equal(ids[j], j); /* all equal: the lowest ids, in order */
            assert_true(fabs(w[j] - 0.2) < 1e-6);
        }
    }
    /* Partial ties: experts 9 and 4 tie for first, 12, 2 and 7 tie for third. */
    for (int e = 0; e < E; e++)
        l[e] = -1.0f;
    l[9] = l[4] = 3.0f;
    l[12] = l[2] = l[7] = 2.0f;
    k3_router r = R(K3_ROUTE_SIGMOID, E, 4, 1, 1, false, 1.0f, NULL);
    int32_t ids[4];
    float w[4];
    assert_int_equal(k3_route_logits(&r, l, 1, ids, w, NULL), K3_OK);
    assert_int_equal(ids[0], 4);
    assert_int_equal(ids[1], 9);
    assert_int_equal(ids[2], 2);
    assert_int_equal(ids[3], 7);
    check_against_oracle(&r, l, 1);
    /* Ties created by the correction bias (selection scores equal, raw scores differ). */
    float bias[E] = {0};
    for (int e = 0; e < E; e++)
        l[e] = 0;
    l[5] = 1.0f;
    bias[5] = -((float)(1 / (1 + exp(-1.0))) - 0.5f); /* sel[5] == sel[others] ~ 0.5 */
    r = R(K3_ROUTE_NOAUX_TC, E, 3, 1, 1, true, 1.0f, bias);
    check_against_oracle(&r, l, 1);
}

static void test_group_limited(void **state) {
    (void)state;
    /* 4 groups of 4. Group 0 holds the single best expert but a weak second; group 2 has two
     * good experts. With topk_group = 1 only group 2 survives (sum of top-2), so expert 0 is not
     * picked even though it has the highest score. */
    float l[16];
    for (int e = 0; e < 16; e++)
        l[e] = -4.0f;
    l[0] = 4.0f;
    l[8] = 2.0f, l[9] = 1.5f, l[10] = 1.0f;
    k3_router r = R(K3_ROUTE_NOAUX_TC, 16, 2, 4, 1, true, 1.0f, NULL);
    int32_t ids[2];
    float w[2];
    assert_int_equal(k3_route_logits(&r, l, 1, ids, w, NULL), K3_OK);
    assert_int_equal(ids[0], 8);
    assert_int_equal(ids[1], 9);
    r.topk_group = 2; /* groups 2 and 0 kept: expert 0 wins */
    assert_int_equal(k3_route_logits(&r, l, 1, ids, w, NULL), K3_OK);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 8);
    r.n_group = 1, r.topk_group = 1;
    assert_int_equal(k3_route_logits(&r, l, 1, ids, w, NULL), K3_OK);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 8);
}

static void test_nan_logits(void **state) {
    (void)state;
    enum { T = 3, E = 8 };
    float l[T * E];
    for (int i = 0; i < T * E; i++)
        l[i] = (float)i * 0.1f;
    int32_t ids[T * 2];
    float w[T * 2];
    for (int i = 0; i < T * 2; i++)
        ids[i] = -7, w[i] = -7;
    l[1 * E + 5] = NAN;
    for (int fn = 0; fn < K3_ROUTE_COUNT; fn++) {
        k3_router r = R((k3_route_fn)fn, E, 2, 1, 1, true, 1.0f, NULL);
        k3_error e = {0};
        assert_int_equal(k3_route_logits(&r, l, T, ids, w, &e), K3_ERR_NUMERIC);
        assert_non_null(strstr(e.msg, "token 1"));
        assert_non_null(strstr(e.msg, "expert 5"));
    }
    l[1 * E + 5] = 0;
    l[2 * E + 0] = -INFINITY;
    k3_router r = R(K3_ROUTE_SOFTMAX_TOPK, E, 2, 1, 1, true, 1.0f, NULL);
    k3_error e = {0};
    assert_int_equal(k3_route_logits(&r, l, T, ids, w, &e), K3_ERR_NUMERIC);
    assert_non_null(strstr(e.msg, "token 2"));
}

static void test_validate(void **state) {
    (void)state;
    float bias[8] = {0};
    struct {
        k3_router r;
        const char *word;
    } bad[] = {
        {R(K3_ROUTE_NOAUX_TC, 8, 0, 1, 1, true, 1, NULL), "top_k"},
        {R(K3_ROUTE_NOAUX_TC, 8, 9, 1, 1, true, 1, NULL), "top_k"},
        {R(K3_ROUTE_NOAUX_TC, 8, 2, 3, 1, true, 1, NULL), "n_group"},
        {R(K3_ROUTE_NOAUX_TC, 8, 2, 4, 5, true, 1, NULL), "topk_group"},
        {R(K3_ROUTE_NOAUX_TC, 8, 5, 4, 2, true, 1, NULL), "kept groups"},
        {R(K3_ROUTE_NOAUX_TC, 8, 2, 1, 1, true, 0, NULL), "routed_scaling_factor"},
        {R(K3_ROUTE_NOAUX_TC, 8, 2, 1, 1, true, NAN, NULL), "routed_scaling_factor"},
        {R(K3_ROUTE_COUNT, 8, 2, 1, 1, true, 1, NULL), "fn"},
        {R(K3_ROUTE_NOAUX_TC, 8, 2, 1, 1, true, 1, bias), "bias[3]"},
    };
    bias[3] = NAN;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        k3_error e = {0};
        assert_int_not_equal(k3_router_validate(&bad[i].r, &e), K3_OK);
        if (!strstr(e.msg, bad[i].word))
            fail_msg("case %zu: '%s' lacks '%s'", i, e.msg, bad[i].word);
    }
}

static void test_router_gemm(void **state) {
    (void)state;
    enum { T = 5, E = 12, W = 40 };
    float x[T * W], g[E * W], l[T * E];
    uint16_t gb[E * W];
    srand(99);
    for (int i = 0; i < T * W; i++)
        x[i] = frand();
    for (int i = 0; i < E * W; i++) {
        g[i] = frand() * 0.3f;
        uint32_t b;
        memcpy(&b, &g[i], 4);
        gb[i] = (uint16_t)(b >> 16); /* truncation is fine: the test decodes the same bits */
    }
    k3_router r = R(K3_ROUTE_NOAUX_TC, E, 3, 1, 1, true, 1.0f, NULL);
    for (int f = 0; f < 2; f++) {
        r.gate = (k3_qmat){.fmt = f ? K3_WFMT_BF16 : K3_WFMT_F32,
                           .rows = E,
                           .cols = W,
                           .data = f ? (const void *)gb : (const void *)g,
                           .global_scale = 1};
        for (int i = 0; i < T * E; i++)
            l[i] = NAN; /* poison */
        assert_int_equal(k3_router_logits(&r, x, T, l, NULL), K3_OK);
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e++) {
                double acc = 0;
                for (int c = 0; c < W; c++) {
                    float wv = g[e * W + c];
                    if (f) {
                        uint32_t b = (uint32_t)gb[e * W + c] << 16;
                        memcpy(&wv, &b, 4);
                    }
                    acc += (double)x[t * W + c] * wv;
                }
                /* bound: the fp32 rounding of the double sum */
                if (!(fabs(l[t * E + e] - acc) <= 6e-8 * fabs(acc) + 1e-12))
                    fail_msg("logit [%d,%d] %g vs %g", t, e, (double)l[t * E + e], acc);
            }
        int32_t ids[T * 3];
        float w[T * 3];
        assert_int_equal(k3_route(&r, x, T, ids, w, NULL), K3_OK);
        check_against_oracle(&r, l, T);
    }
    r.gate.fmt = K3_WFMT_NVFP4;
    k3_error e = {0};
    assert_int_equal(k3_router_logits(&r, x, T, l, &e), K3_ERR_DTYPE);
    assert_non_null(strstr(e.msg, "gate"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_vs_oracle),   cmocka_unit_test(test_noaux_properties),
        cmocka_unit_test(test_ties_and_all_equal), cmocka_unit_test(test_group_limited),
        cmocka_unit_test(test_nan_logits),         cmocka_unit_test(test_validate),
        cmocka_unit_test(test_router_gemm),
    };
    return cmocka_run_group_tests_name("routing", tests, NULL, NULL);
}
