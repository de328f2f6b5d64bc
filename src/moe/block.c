/* The whole MoE block (k3-architecture.md §5.4) around a pluggable routed-expert operator,
 * and expert parallelism inside one process (moe.md §2.6).
 *
 * The block is backend-neutral: routing, the latent projections, the RMSNorm and the shared
 * expert run here in fp32 (products summed in double, rounded once to float), and only the
 * routed experts go through k3_moe_backend.experts (the reference, the CPU fast path or a GPU
 * backend). So two backends differ in the block only by their expert operator.
 *
 * Left out: HF's bf16 rounding between the steps (k3 keeps activations fp32 between ops),
 * the GEMM speed of the non-expert parts (this path is for checking and small batches; the
 * model forward has its own GEMMs), and cross-process EP (one process runs every rank). */
#include "formats/fp.h"
#include "moe/activation.h"
#include "moe/ep.h"
#include "moe/moe.h"
#include "moe/routing.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- expert parallelism ------------------------------------------------------------ */

int k3_moe_ep_range(int n_experts, int ep_size, int ep_rank, int *first, int *count,
                    k3_error *err) {
    k3_ep_part p;
    int rc = k3_ep_partition(n_experts, ep_size, ep_rank, &p, err);
    if (rc)
        return rc;
    *first = p.first;
    *count = p.count;
    return K3_OK;
}

int k3_experts_view(const k3_experts *full, int first, int count, k3_experts *view, k3_error *err) {
    if (count < 1 || first < full->first_local || first - full->first_local > full->n_local - count)
        return k3_fail(err, K3_ERR_ARG,
                       "experts view: [%d, %d+%d) is not inside the local range [%d, %d+%d)", first,
                       first, count, full->first_local, full->first_local, full->n_local);
    int off = first - full->first_local;
    *view = *full;
    view->first_local = first;
    view->n_local = count;
    view->e = full->e + off;
    view->act.alpha = full->act.alpha ? full->act.alpha + off : NULL;
    view->act.beta = full->act.beta ? full->act.beta + off : NULL;
    view->act.limit = full->act.limit ? full->act.limit + off : NULL;
    return K3_OK;
}

int k3_moe_experts_ep_sum(k3_moe_experts_fn fn, void *ctx, const k3_experts *full, int ep_size,
                          k3_act_mode mode, const float *x, int T, const int32_t *ids,
                          const float *w, int k, float *y, k3_error *err) {
    if (full->first_local != 0 || full->n_local != full->n_experts)
        return k3_fail(
            err, K3_ERR_ARG,
            "expert parallelism: the bank must hold all %d experts, it holds [%d, %d+%d)",
            full->n_experts, full->first_local, full->first_local, full->n_local);
    size_t n = (size_t)T * (size_t)full->hidden;
    float *part = malloc((n ? n : 1) * sizeof *part);
    if (!part)
        return k3_fail(err, K3_ERR_NOMEM, "expert parallelism: partial output [%d, %d]", T,
                       full->hidden);
    int rc = K3_OK;
    for (size_t i = 0; i < n; i++)
        y[i] = 0;
    for (int r = 0; r < ep_size && !rc; r++) {
        int first, count;
        k3_experts view;
        if ((rc = k3_moe_ep_range(full->n_experts, ep_size, r, &first, &count, err)))
            break;
        if ((rc = k3_experts_view(full, first, count, &view, err)))
            break;
        if ((rc = fn(ctx, &view, mode, x, T, ids, w, k, part, err)))
            break;
        for (size_t i = 0; i < n; i++)
            y[i] += part[i];
    }
    free(part);
    return rc;
}

/* ---- fp32 building blocks ---------------------------------------------------------- */

/* y[t, o] = sum_c x[t, c] * m[o, c] (x [T, m.cols], y [T, m.rows]): k3_qmat_matmul with its
 * row buffer. */
static int gemm(const k3_qmat *m, const float *x, int T, float *y, k3_error *err) {
    int64_t C = m->cols;
    double *row = malloc((size_t)C * sizeof *row);
    if (!row)
        return k3_fail(err, K3_ERR_NOMEM, "moe block: row of %lld", (long long)C);
    k3_qmat_matmul(m, x, T, y, row);
    free(row);
    return K3_OK;
}

/* In place: r = float(r / sqrt(mean(r^2) + eps)) * weight, per token of width L. */
static void rmsnorm(float *r, int T, int L, const void *weight, k3_wfmt fmt, float eps) {
    for (int t = 0; t < T; t++) {
        float *v = r + (int64_t)t * L;
        double ss = 0;
        for (int i = 0; i < L; i++)
            ss += (double)v[i] * v[i];
        double inv = 1.0 / sqrt(ss / L + eps);
        for (int i = 0; i < L; i++) {
            float wi = fmt == K3_WFMT_BF16  ? k3_bf16_to_f32(((const uint16_t *)weight)[i])
                       : fmt == K3_WFMT_F16 ? k3_f16_to_f32(((const uint16_t *)weight)[i])
                                            : ((const float *)weight)[i];
            v[i] = (float)(v[i] * inv) * wi;
        }
    }
}

static int check_qmat(const k3_qmat *m, const char *name, int64_t rows, int64_t cols,
                      k3_error *err) {
    if (!m->data)
        return k3_fail(err, K3_ERR_MISSING, "moe block: %s: no data", name);
    if (m->rows != rows || m->cols != cols)
        return k3_fail(err, K3_ERR_SHAPE,
                       "moe block: %s: expected [%lld, %lld], found [%lld, %lld]", name,
                       (long long)rows, (long long)cols, (long long)m->rows, (long long)m->cols);
    if ((int)m->fmt < 0 || m->fmt >= K3_WFMT_COUNT)
        return k3_fail(err, K3_ERR_DTYPE, "moe block: %s: invalid format %d", name, (int)m->fmt);
    return K3_OK;
}

int k3_moe_block_validate(const k3_moe_block *b, k3_act_mode mode, k3_error *err) {
    int rc, W = b->model_width, H = b->experts.hidden;
    if (W <= 0)
        return k3_fail(err, K3_ERR_SHAPE, "moe block: model_width must be > 0, found %d", W);
    if ((rc = k3_router_validate(&b->router, err)))
        return rc;
    if ((rc = check_qmat(&b->router.gate, "router gate", b->router.n_experts, W, err)))
        return rc;
    if ((rc = k3_experts_validate(&b->experts, mode, err)))
        return rc;
    if (b->experts.n_experts != b->router.n_experts)
        return k3_fail(err, K3_ERR_SHAPE, "moe block: experts bank has %d experts, router %d",
                       b->experts.n_experts, b->router.n_experts);
    if (b->latent) {
        if ((rc = check_qmat(&b->latent_down, "latent down-projection", H, W, err)))
            return rc;
        if ((rc = check_qmat(&b->latent_up, "latent up-projection", W, H, err)))
            return rc;
        if (b->latent_norm && b->latent_norm_fmt != K3_WFMT_F32 &&
            b->latent_norm_fmt != K3_WFMT_BF16 && b->latent_norm_fmt != K3_WFMT_F16)
            return k3_fail(err, K3_ERR_DTYPE,
                           "moe block: latent norm: expected F32, BF16 or F16, found %s",
                           k3_wfmt_name(b->latent_norm_fmt));
        if (b->latent_norm && !(isfinite(b->norm_eps) && b->norm_eps > 0))
            return k3_fail(err, K3_ERR_NUMERIC, "moe block: norm eps: expected > 0, found %g",
                           (double)b->norm_eps);
    } else if (H != W) {
        return k3_fail(err, K3_ERR_SHAPE,
                       "moe block: without a latent the experts must be model-width %d, found %d",
                       W, H);
    }
    if (b->n_shared < 0)
        return k3_fail(err, K3_ERR_ARG, "moe block: n_shared must be >= 0, found %d", b->n_shared);
    if (b->n_shared > 0) {
        int64_t S = b->shared_gate.rows;
        if (S <= 0)
            return k3_fail(err, K3_ERR_MISSING, "moe block: shared expert gate_proj");
        if ((rc = check_qmat(&b->shared_gate, "shared gate_proj", S, W, err)))
            return rc;
        if (k3_act_is_gated(b->shared_act.act) &&
            (rc = check_qmat(&b->shared_up, "shared up_proj", S, W, err)))
            return rc;
        if ((rc = check_qmat(&b->shared_down, "shared down_proj", W, S, err)))
            return rc;
        if ((rc = k3_act_params_validate(&b->shared_act, 1, err)))
            return rc;
    }
    return K3_OK;
}

/* ---- the block --------------------------------------------------------------------- */

static int shared_mlp(const k3_moe_block *b, const float *x, int T, float *y, k3_error *err) {
    int64_t S = b->shared_gate.rows, W = b->model_width;
    bool gated = k3_act_is_gated(b->shared_act.act);
    float *g = malloc((size_t)T * (size_t)S * sizeof *g);
    float *u = gated ? malloc((size_t)T * (size_t)S * sizeof *u) : NULL;
    float *o = malloc((size_t)T * (size_t)W * sizeof *o);
    int rc = K3_OK;
    if (!g || !o || (gated && !u)) {
        rc = k3_fail(err, K3_ERR_NOMEM, "moe block: shared expert scratch [%d, %lld]", T,
                     (long long)S);
        goto out;
    }
    if ((rc = gemm(&b->shared_gate, x, T, g, err)))
        goto out;
    if (gated && (rc = gemm(&b->shared_up, x, T, u, err)))
        goto out;
    k3_act_row_f32(&b->shared_act, 0, g, u, g, (int64_t)T * S);
    if ((rc = gemm(&b->shared_down, g, T, o, err)))
        goto out;
    for (int64_t i = 0; i < (int64_t)T * W; i++)
        y[i] += o[i];
out:
    free(g), free(u), free(o);
    return rc;
}

int k3_moe_block_forward(const k3_moe_block *b, const k3_moe_backend *be, const float *x, int T,
                         float *y, int32_t *ids_out, float *w_out, k3_error *err) {
    if (!b || !be || !be->experts)
        return k3_fail(err, K3_ERR_ARG, "moe block: block and backend operator are required");
    int rc = k3_moe_block_validate(b, be->mode, err);
    if (rc)
        return rc;
    if (T < 0)
        return k3_fail(err, K3_ERR_ARG, "moe block: T must be >= 0, found %d", T);
    if (be->ep_size > 1 &&
        (b->experts.first_local != 0 || b->experts.n_local != b->experts.n_experts))
        return k3_fail(err, K3_ERR_ARG, "moe block: ep_size %d needs the whole expert bank",
                       be->ep_size);
    int K = b->router.top_k, W = b->model_width, H = b->experts.hidden;
    for (int64_t i = 0; i < (int64_t)T * W; i++)
        if (!isfinite(x[i]))
            return k3_fail(err, K3_ERR_NUMERIC, "moe block: x[%lld][%lld] is %g",
                           (long long)(i / W), (long long)(i % W), (double)x[i]);
    size_t TK = (size_t)T * (size_t)K + 1, TH = (size_t)T * (size_t)H + 1;
    int32_t *ids = malloc(TK * sizeof *ids);
    float *w = malloc(TK * sizeof *w);
    float *z = b->latent ? malloc(TH * sizeof *z) : NULL;
    float *r = malloc(TH * sizeof *r);
    if (!ids || !w || !r || (b->latent && !z)) {
        rc = k3_fail(err, K3_ERR_NOMEM, "moe block: scratch for %d tokens", T);
        goto out;
    }
    if ((rc = k3_route(&b->router, x, T, ids, w, err)))
        goto out;
    const float *xe = x;
    if (b->latent) {
        if ((rc = gemm(&b->latent_down, x, T, z, err)))
            goto out;
        xe = z;
    }
    if (be->ep_size > 1)
        rc = k3_moe_experts_ep_sum(be->experts, be->ctx, &b->experts, be->ep_size, be->mode, xe, T,
                                   ids, w, K, r, err);
    else
        rc = be->experts(be->ctx, &b->experts, be->mode, xe, T, ids, w, K, r, err);
    if (rc)
        goto out;
    if (b->latent) {
        if (b->latent_norm)
            rmsnorm(r, T, H, b->latent_norm, b->latent_norm_fmt, b->norm_eps);
        if ((rc = gemm(&b->latent_up, r, T, y, err)))
            goto out;
    } else {
        memcpy(y, r, (size_t)T * (size_t)W * sizeof *y);
    }
    if (b->n_shared > 0 && (rc = shared_mlp(b, x, T, y, err)))
        goto out;
    if (ids_out)
        memcpy(ids_out, ids, (size_t)T * (size_t)K * sizeof *ids);
    if (w_out)
        memcpy(w_out, w, (size_t)T * (size_t)K * sizeof *w);
out:
    free(ids), free(w), free(z), free(r);
    return rc;
}
