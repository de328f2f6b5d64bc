/* Router GEMM and top-k selection. Selection is a plain repeated arg-max over at most E
 * scores with an explicit tie rule (lower id wins): O(k*E) per token, which for K3
 * (k = 16, E = 896) is a few microseconds and keeps the order of the k slots defined. */
#include "moe/routing.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int k3_router_validate(const k3_router *r, k3_error *err) {
    if (!r)
        return k3_fail(err, K3_ERR_ARG, "router: NULL");
    if ((int)r->fn < 0 || r->fn >= K3_ROUTE_COUNT)
        return k3_fail(err, K3_ERR_ARG, "router: fn: invalid value %d", (int)r->fn);
    int E = r->n_experts;
    if (E <= 0)
        return k3_fail(err, K3_ERR_ARG, "router: n_experts must be > 0, found %d", E);
    if (r->top_k < 1 || r->top_k > E)
        return k3_fail(err, K3_ERR_ARG, "router: top_k: expected 1..%d, found %d", E, r->top_k);
    if (r->n_group < 1 || E % r->n_group)
        return k3_fail(err, K3_ERR_ARG, "router: n_group: expected a divisor of %d, found %d", E,
                       r->n_group);
    if (r->topk_group < 1 || r->topk_group > r->n_group)
        return k3_fail(err, K3_ERR_ARG, "router: topk_group: expected 1..%d, found %d", r->n_group,
                       r->topk_group);
    if (r->top_k > r->topk_group * (E / r->n_group))
        return k3_fail(err, K3_ERR_ARG,
                       "router: top_k %d exceeds the %d experts of the %d kept groups", r->top_k,
                       r->topk_group * (E / r->n_group), r->topk_group);
    if (!(isfinite(r->routed_scaling_factor) && r->routed_scaling_factor > 0))
        return k3_fail(err, K3_ERR_NUMERIC,
                       "router: routed_scaling_factor: expected a finite value > 0, found %g",
                       (double)r->routed_scaling_factor);
    if (r->correction_bias)
        for (int e = 0; e < E; e++)
            if (!isfinite(r->correction_bias[e]))
                return k3_fail(err, K3_ERR_NUMERIC,
                               "router: e_score_correction_bias[%d] is %g (non-finite)", e,
                               (double)r->correction_bias[e]);
    if (r->gate.data) {
        if (r->gate.fmt != K3_WFMT_F32 && r->gate.fmt != K3_WFMT_BF16)
            return k3_fail(err, K3_ERR_DTYPE, "router: gate: expected F32 or BF16, found %s",
                           k3_wfmt_name(r->gate.fmt));
        if (r->gate.rows != E || r->gate.cols <= 0)
            return k3_fail(err, K3_ERR_SHAPE, "router: gate: expected [%d, >0], found [%lld, %lld]",
                           E, (long long)r->gate.rows, (long long)r->gate.cols);
    }
    return K3_OK;
}

int k3_router_logits(const k3_router *r, const float *x, int T, float *logits, k3_error *err) {
    int rc = k3_router_validate(r, err);
    if (rc)
        return rc;
    if (!r->gate.data)
        return k3_fail(err, K3_ERR_MISSING, "router: gate weight is missing");
    if (T < 0)
        return k3_fail(err, K3_ERR_ARG, "router: T must be >= 0, found %d", T);
    int64_t W = r->gate.cols;
    double *row = malloc((size_t)W * sizeof *row);
    if (!row)
        return k3_fail(err, K3_ERR_NOMEM, "router: gate row of %lld", (long long)W);
    /* gate rows (gate.rows == n_experts, validated) against every token: read once per call */
    k3_qmat_matmul(&r->gate, x, T, logits, row);
    free(row);
    return K3_OK;
}

static float sigmoid_f(float x) {
    return 1.0f / (1.0f + expf(-x));
}

/* Index of the best score among experts not yet taken and not excluded; -1 when none. */
static int argmax(const float *score, const unsigned char *skip, int n) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (skip[i])
            continue;
        if (best < 0 || score[i] > score[best])
            best = i; /* equal: keep the lower id */
    }
    return best;
}

/* Picks k ids by descending score into ids[]; `skip` marks excluded experts and is updated. */
static void topk(const float *score, unsigned char *skip, int n, int k, int32_t *ids) {
    for (int j = 0; j < k; j++) {
        int b = argmax(score, skip, n);
        ids[j] = b;
        skip[b] = 1;
    }
}

/* Group-limited selection (DeepSeek-V3): excludes every expert outside the best topk_group
 * groups, a group scoring the sum of its top-2 selection scores. */
static void limit_groups(const k3_router *r, const float *sel, unsigned char *skip, float *gscore,
                         unsigned char *gskip) {
    int G = r->n_group, per = r->n_experts / G;
    for (int g = 0; g < G; g++) {
        const float *s = sel + (int64_t)g * per;
        int a = 0;
        for (int i = 1; i < per; i++)
            if (s[i] > s[a])
                a = i;
        float sum = s[a];
        if (per > 1) {
            int b = a == 0 ? 1 : 0;
            for (int i = 0; i < per; i++)
                if (i != a && s[i] > s[b])
                    b = i;
            sum += s[b];
        }
        gscore[g] = sum;
        gskip[g] = 0;
    }
    /* gskip doubles as the "kept" mask: topk marks each chosen group in it. */
    int32_t keep[1];
    for (int j = 0; j < r->topk_group; j++)
        topk(gscore, gskip, G, 1, keep);
    for (int g = 0; g < G; g++)
        if (!gskip[g])
            memset(skip + (int64_t)g * per, 1, (size_t)per);
}

int k3_route_logits(const k3_router *r, const float *logits, int T, int32_t *ids, float *weights,
                    k3_error *err) {
    int rc = k3_router_validate(r, err);
    if (rc)
        return rc;
    if (T < 0)
        return k3_fail(err, K3_ERR_ARG, "router: T must be >= 0, found %d", T);
    int E = r->n_experts, K = r->top_k, G = r->n_group;
    for (int64_t i = 0; i < (int64_t)T * E; i++)
        if (!isfinite(logits[i]))
            return k3_fail(err, K3_ERR_NUMERIC, "router logits: token %lld, expert %lld is %g",
                           (long long)(i / E), (long long)(i % E), (double)logits[i]);
    float *score = malloc((size_t)E * sizeof *score); /* the value w is gathered from */
    float *sel = malloc((size_t)E * sizeof *sel);     /* the value experts are chosen by */
    unsigned char *skip = malloc((size_t)E);
    float *gscore = malloc((size_t)G * sizeof *gscore);
    unsigned char *gskip = malloc((size_t)G);
    if (!score || !sel || !skip || !gscore || !gskip) {
        free(score), free(sel), free(skip), free(gscore), free(gskip);
        return k3_fail(err, K3_ERR_NOMEM, "router: scratch for %d experts", E);
    }
    for (int t = 0; t < T; t++) {
        const float *l = logits + (int64_t)t * E;
        int32_t *id = ids + (int64_t)t * K;
        float *w = weights + (int64_t)t * K;
        memset(skip, 0, (size_t)E);
        float denom_eps = 1e-20f;
        switch (r->fn) {
        case K3_ROUTE_NOAUX_TC:
            for (int e = 0; e < E; e++) {
                score[e] = sigmoid_f(l[e]);
                sel[e] = score[e] + (r->correction_bias ? r->correction_bias[e] : 0.0f);
            }
            if (G > 1)
                limit_groups(r, sel, skip, gscore, gskip);
            break;
        case K3_ROUTE_SOFTMAX_TOPK: {
            float m = l[0];
            for (int e = 1; e < E; e++)
                m = l[e] > m ? l[e] : m;
            float sum = 0;
            for (int e = 0; e < E; e++)
                sum += score[e] = expf(l[e] - m);
            for (int e = 0; e < E; e++)
                sel[e] = score[e] = score[e] / sum;
            denom_eps = 0;
            break;
        }
        case K3_ROUTE_RENORMALIZE:
            for (int e = 0; e < E; e++)
                sel[e] = score[e] = l[e];
            break;
        case K3_ROUTE_SIGMOID:
            for (int e = 0; e < E; e++)
                sel[e] = score[e] = sigmoid_f(l[e]);
            break;
        default:
            break;
        }
        topk(sel, skip, E, K, id);
        for (int j = 0; j < K; j++)
            w[j] = score[id[j]];
        if (r->fn == K3_ROUTE_RENORMALIZE) {
            /* ids are in descending logit order, so w[0] is the max. */
            float sum = 0;
            for (int j = 0; j < K; j++)
                sum += w[j] = expf(w[j] - score[id[0]]);
            for (int j = 0; j < K; j++)
                w[j] /= sum;
        } else if (r->renormalize) {
            float sum = 0;
            for (int j = 0; j < K; j++)
                sum += w[j];
            for (int j = 0; j < K; j++)
                w[j] /= (sum + denom_eps);
        }
        for (int j = 0; j < K; j++)
            w[j] *= r->routed_scaling_factor;
    }
    free(score), free(sel), free(skip), free(gscore), free(gskip);
    return K3_OK;
}

int k3_route(const k3_router *r, const float *x, int T, int32_t *ids, float *weights,
             k3_error *err) {
    int rc = k3_router_validate(r, err);
    if (rc)
        return rc;
    float *logits = malloc(((size_t)T * (size_t)r->n_experts + 1) * sizeof *logits);
    if (!logits)
        return k3_fail(err, K3_ERR_NOMEM, "router: logits [%d, %d]", T, r->n_experts);
    rc = k3_router_logits(r, x, T, logits, err);
    if (!rc)
        rc = k3_route_logits(r, logits, T, ids, weights, err);
    free(logits);
    return rc;
}
