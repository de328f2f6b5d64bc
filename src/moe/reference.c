/* The float64 reference of the routed experts: the oracle every backend is tested against.
 *
 * A per-token loop over the selected experts on weights dequantized row by row with
 * k3_qmat_row_f64; every dot product is a plain double sum in index order. Nothing is cached,
 * sorted or fused: readability over speed (a K3 token costs about a second).
 *
 * Activation quantization (modes W4A4 / W4A8) is emulated exactly as the run-time rule does
 * it, then dequantized into double:
 *  - FC1 input: the token's float row, quantized once per token (W4A4: NVFP4 per 16 with
 *    g1 = 1/max over local experts of w1.input_scale; W4A8: MXFP8 per 32).
 *  - FC2 input: the activation output is rounded to float32 first, then quantized (W4A4: with
 *    g2 = 1/max over local experts of w2.input_scale). The float32 rounding is part of the
 *    definition: a fast path that computes the activation in float reaches the same float
 *    (up to its own rounding) and so the same NVFP4/MXFP8 codes, except for values within one
 *    float ulp of a code boundary.
 * g1 and g2 are computed in float, as the runtime stores them (fc31_input_scale).
 * Mode W4A16_BF16 is the same two steps with bf16 (round to nearest even) as the "quantizer":
 * x rounded to bf16 once per token, and the hidden rounded double -> float -> bf16 (twice, not
 * straight from double: the fast paths hold act(h) in fp32 and round that to bf16, and a
 * direct rounding differs from theirs where the double lies within half a float ulp of a bf16
 * tie). Leaving out: per-expert activation scales and the dynamic FC2 scale of moe.md §2.4. */
#include "formats/block.h"
#include "formats/fp.h"
#include "moe/activation.h"
#include "moe/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *k3_act_mode_name(k3_act_mode mode) {
    switch (mode) {
    case K3_MODE_W4A16:
        return "w4a16";
    case K3_MODE_W4A4:
        return "w4a4";
    case K3_MODE_W4A8:
        return "w4a8";
    case K3_MODE_W4A16_BF16:
        return "w4a16-bf16";
    default:
        return "invalid";
    }
}

int k3_act_mode_from_name(const char *name, k3_act_mode *out, k3_error *err) {
    for (int m = 0; m < K3_MODE_COUNT; m++)
        if (name && !strcmp(name, k3_act_mode_name((k3_act_mode)m))) {
            *out = (k3_act_mode)m;
            return K3_OK;
        }
    return k3_fail(err, K3_ERR_ARG,
                   "activation mode '%s': expected w4a16, w4a4, w4a8 or w4a16-bf16",
                   name ? name : "(null)");
}

static int check_mat(const k3_qmat *m, int e, const char *name, int64_t rows, int64_t cols,
                     k3_act_mode mode, k3_error *err) {
    if (!m->data)
        return k3_fail(err, K3_ERR_MISSING, "expert %d: %s: no data", e, name);
    if (m->rows != rows || m->cols != cols)
        return k3_fail(err, K3_ERR_SHAPE,
                       "expert %d: %s: expected [%lld, %lld], found [%lld, %lld]", e, name,
                       (long long)rows, (long long)cols, (long long)m->rows, (long long)m->cols);
    if ((int)m->fmt < 0 || m->fmt >= K3_WFMT_COUNT)
        return k3_fail(err, K3_ERR_DTYPE, "expert %d: %s: invalid format %d", e, name, (int)m->fmt);
    if (m->fmt != K3_WFMT_F32 && m->fmt != K3_WFMT_BF16 && m->fmt != K3_WFMT_F16 && !m->scale)
        return k3_fail(err, K3_ERR_MISSING, "expert %d: %s: %s weight without scales", e, name,
                       k3_wfmt_name(m->fmt));
    if (mode == K3_MODE_W4A4) {
        if (m->fmt != K3_WFMT_NVFP4)
            return k3_fail(err, K3_ERR_DTYPE, "expert %d: %s: mode w4a4 needs NVFP4, found %s", e,
                           name, k3_wfmt_name(m->fmt));
        if (!(isfinite(m->input_scale) && m->input_scale > 0))
            return k3_fail(err, K3_ERR_MISSING,
                           "expert %d: %s: mode w4a4 needs input_scale (finite, > 0), found %g", e,
                           name, (double)m->input_scale);
    }
    if (mode == K3_MODE_W4A8 && m->fmt != K3_WFMT_MXFP4)
        return k3_fail(err, K3_ERR_DTYPE, "expert %d: %s: mode w4a8 needs MXFP4, found %s", e, name,
                       k3_wfmt_name(m->fmt));
    return K3_OK;
}

int k3_experts_validate(const k3_experts *ex, k3_act_mode mode, k3_error *err) {
    if (!ex)
        return k3_fail(err, K3_ERR_ARG, "experts: NULL");
    if ((int)mode < 0 || mode >= K3_MODE_COUNT)
        return k3_fail(err, K3_ERR_ARG, "experts: invalid activation mode %d", (int)mode);
    if (ex->n_experts <= 0 || ex->n_local <= 0 || ex->first_local < 0 ||
        ex->n_local > ex->n_experts - ex->first_local)
        return k3_fail(err, K3_ERR_ARG,
                       "experts: local range [%d, %d+%d) must lie inside [0, %d) and be non-empty",
                       ex->first_local, ex->first_local, ex->n_local, ex->n_experts);
    if (ex->hidden <= 0 || ex->inter <= 0)
        return k3_fail(err, K3_ERR_SHAPE, "experts: hidden %d and inter %d must be > 0", ex->hidden,
                       ex->inter);
    if (!ex->e)
        return k3_fail(err, K3_ERR_MISSING, "experts: no expert array");
    int quantum = mode == K3_MODE_W4A4 ? K3_NVFP4_BLOCK : mode == K3_MODE_W4A8 ? K3_MXFP4_BLOCK : 1;
    if (ex->hidden % quantum || ex->inter % quantum)
        return k3_fail(err, K3_ERR_SHAPE,
                       "experts: mode %s needs hidden %d and inter %d to be "
                       "multiples of %d",
                       k3_act_mode_name(mode), ex->hidden, ex->inter, quantum);
    int rc = k3_act_params_validate(&ex->act, ex->n_local, err);
    if (rc)
        return rc;
    bool gated = k3_act_is_gated(ex->act.act);
    for (int i = 0; i < ex->n_local; i++) {
        const k3_expert *e = &ex->e[i];
        int id = ex->first_local + i;
        if ((rc = check_mat(&e->w1, id, "w1 (gate)", ex->inter, ex->hidden, mode, err)))
            return rc;
        if (gated && (rc = check_mat(&e->w3, id, "w3 (up)", ex->inter, ex->hidden, mode, err)))
            return rc;
        if ((rc = check_mat(&e->w2, id, "w2 (down)", ex->hidden, ex->inter, mode, err)))
            return rc;
        if (gated && mode == K3_MODE_W4A4 && e->w3.input_scale != e->w1.input_scale)
            return k3_fail(err, K3_ERR_FORMAT,
                           "expert %d: w3.input_scale %g differs from w1.input_scale %g (one FC1 "
                           "input is quantized once for both)",
                           id, (double)e->w3.input_scale, (double)e->w1.input_scale);
    }
    return K3_OK;
}

/* Run-time activation quantization of one float row, dequantized exactly into double. */
typedef struct act_quant {
    k3_act_mode mode;
    float g;         /* W4A4 global scale */
    uint8_t *codes;  /* [n] (packed halves for NVFP4) */
    uint8_t *scales; /* [n / 16] */
    float *deq;      /* [n] */
} act_quant;

static void quantize_row(act_quant *q, const float *in, int64_t n, double *out) {
    if (q->mode == K3_MODE_W4A16) {
        for (int64_t i = 0; i < n; i++)
            out[i] = in[i];
        return;
    }
    if (q->mode == K3_MODE_W4A4) {
        k3_nvfp4_quantize_act_row(in, n, q->g, q->codes, q->scales);
        for (int64_t i = 0; i < n; i++) {
            uint8_t c = (uint8_t)(q->codes[i / 2] >> (4 * (i % 2)));
            /* x = code * scale / g: the dequantization the kernels apply through alpha. */
            out[i] = (double)k3_e2m1_to_f32(c) * (double)k3_e4m3_to_f32(q->scales[i / 16]) /
                     (double)q->g;
        }
        return;
    }
    if (q->mode == K3_MODE_W4A16_BF16) {
        for (int64_t i = 0; i < n; i++)
            out[i] = k3_bf16_to_f32(k3_f32_to_bf16(in[i]));
        return;
    }
    k3_mxfp8_quantize_row(in, n, q->codes, q->scales);
    k3_mxfp8_dequantize_row(q->codes, q->scales, n, q->deq);
    for (int64_t i = 0; i < n; i++)
        out[i] = q->deq[i];
}

static double dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Scratch for one token; everything sized by max(H, I). */
typedef struct ref_work {
    double *xin, *row, *g, *u, *h, *hin;
    float *hf;
    act_quant q1, q2;
} ref_work;

static void work_free(ref_work *w) {
    free(w->xin), free(w->row), free(w->g), free(w->u), free(w->h), free(w->hin), free(w->hf);
    free(w->q1.codes), free(w->q1.scales), free(w->q1.deq);
    free(w->q2.codes), free(w->q2.scales), free(w->q2.deq);
}

static int work_alloc(ref_work *w, const k3_experts *ex, k3_act_mode mode, k3_error *err) {
    memset(w, 0, sizeof *w);
    size_t n = (size_t)(ex->hidden > ex->inter ? ex->hidden : ex->inter);
    w->xin = malloc(n * sizeof(double)), w->row = malloc(n * sizeof(double));
    w->g = malloc(n * sizeof(double)), w->u = malloc(n * sizeof(double));
    w->h = malloc(n * sizeof(double)), w->hin = malloc(n * sizeof(double));
    w->hf = malloc(n * sizeof(float));
    act_quant *qs[2] = {&w->q1, &w->q2};
    bool ok = w->xin && w->row && w->g && w->u && w->h && w->hin && w->hf;
    for (int i = 0; i < 2; i++) {
        qs[i]->mode = mode;
        qs[i]->codes = malloc(n), qs[i]->scales = malloc(n / 16 + 1);
        qs[i]->deq = malloc(n * sizeof(float));
        ok = ok && qs[i]->codes && qs[i]->scales && qs[i]->deq;
    }
    if (!ok) {
        work_free(w);
        return k3_fail(err, K3_ERR_NOMEM, "moe reference: scratch of width %zu", n);
    }
    if (mode == K3_MODE_W4A4) {
        float m1 = 0, m2 = 0;
        for (int i = 0; i < ex->n_local; i++) {
            m1 = fmaxf(m1, ex->e[i].w1.input_scale);
            m2 = fmaxf(m2, ex->e[i].w2.input_scale);
        }
        w->q1.g = 1.0f / m1;
        w->q2.g = 1.0f / m2;
    }
    return K3_OK;
}

/* out[H] = expert(xin) for local expert i: w2 . act(w1 . xin, w3 . xin). */
static void run_expert(const k3_experts *ex, int i, ref_work *w, double *out) {
    const k3_expert *e = &ex->e[i];
    int64_t H = ex->hidden, I = ex->inter;
    bool gated = k3_act_is_gated(ex->act.act);
    for (int64_t r = 0; r < I; r++) {
        k3_qmat_row_f64(&e->w1, r, w->row);
        w->g[r] = dot(w->row, w->xin, H);
        if (gated) {
            k3_qmat_row_f64(&e->w3, r, w->row);
            w->u[r] = dot(w->row, w->xin, H);
        }
    }
    for (int64_t r = 0; r < I; r++)
        w->h[r] = k3_act_f64(&ex->act, i, w->g[r], gated ? w->u[r] : 0);
    if (w->q2.mode == K3_MODE_W4A16) {
        memcpy(w->hin, w->h, (size_t)I * sizeof(double));
    } else { /* through float first in every other mode, bf16 included (see the top) */
        for (int64_t r = 0; r < I; r++)
            w->hf[r] = (float)w->h[r];
        quantize_row(&w->q2, w->hf, I, w->hin);
    }
    for (int64_t r = 0; r < H; r++) {
        k3_qmat_row_f64(&e->w2, r, w->row);
        out[r] = dot(w->row, w->hin, I);
    }
}

static int check_call(const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                      const int32_t *ids, const float *w, int k, k3_error *err) {
    int rc = k3_experts_validate(ex, mode, err);
    if (rc)
        return rc;
    if (T < 0 || k < 1)
        return k3_fail(err, K3_ERR_ARG, "moe experts: T must be >= 0 and k >= 1, found %d, %d", T,
                       k);
    return k3_experts_validate_inputs(ex->n_experts, ex->hidden, x, T, ids, w, k, err);
}

int k3_experts_validate_inputs(int n_experts, int hidden, const float *x, int T,
                               const int32_t *ids, const float *w, int k, k3_error *err) {
    for (int64_t i = 0; i < (int64_t)T * k; i++) {
        if (ids[i] < 0 || ids[i] >= n_experts)
            return k3_fail(err, K3_ERR_ARG,
                           "moe experts: topk_ids[%lld][%lld] = %d: expected 0..%d",
                           (long long)(i / k), (long long)(i % k), ids[i], n_experts - 1);
        if (w && !isfinite(w[i]))
            return k3_fail(err, K3_ERR_NUMERIC, "moe experts: topk_weights[%lld][%lld] is %g",
                           (long long)(i / k), (long long)(i % k), (double)w[i]);
    }
    for (int64_t i = 0; i < (int64_t)T * hidden; i++)
        if (!isfinite(x[i]))
            return k3_fail(err, K3_ERR_NUMERIC, "moe experts: x[%lld][%lld] is %g",
                           (long long)(i / hidden), (long long)(i % hidden), (double)x[i]);
    return K3_OK;
}

/* ys[k, H] for token t: the unweighted expert outputs of its local slots, 0 elsewhere. */
static void token_slots(const k3_experts *ex, const float *xt, const int32_t *idt, int k,
                        ref_work *w, double *ys) {
    int64_t H = ex->hidden;
    quantize_row(&w->q1, xt, H, w->xin);
    for (int j = 0; j < k; j++) {
        int i = idt[j] - ex->first_local;
        double *out = ys + (int64_t)j * H;
        if (i < 0 || i >= ex->n_local) {
            for (int64_t c = 0; c < H; c++)
                out[c] = 0;
            continue;
        }
        run_expert(ex, i, w, out);
    }
}

int k3_moe_experts_ref_slots(const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                             const int32_t *ids, int k, double *ys, k3_error *err) {
    int rc = check_call(ex, mode, x, T, ids, NULL, k, err);
    if (rc)
        return rc;
    ref_work w;
    if ((rc = work_alloc(&w, ex, mode, err)))
        return rc;
    int64_t H = ex->hidden;
    for (int t = 0; t < T; t++)
        token_slots(ex, x + (int64_t)t * H, ids + (int64_t)t * k, k, &w, ys + (int64_t)t * k * H);
    work_free(&w);
    return K3_OK;
}

int k3_moe_experts_ref(const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                       const int32_t *ids, const float *w, int k, double *y, k3_error *err) {
    int rc = check_call(ex, mode, x, T, ids, w, k, err);
    if (rc)
        return rc;
    ref_work wk;
    if ((rc = work_alloc(&wk, ex, mode, err)))
        return rc;
    int64_t H = ex->hidden;
    double *ys = malloc((size_t)k * (size_t)H * sizeof *ys);
    if (!ys) {
        work_free(&wk);
        return k3_fail(err, K3_ERR_NOMEM, "moe reference: slots [%d, %lld]", k, (long long)H);
    }
    for (int t = 0; t < T; t++) {
        const int32_t *idt = ids + (int64_t)t * k;
        token_slots(ex, x + (int64_t)t * H, idt, k, &wk, ys);
        double *yt = y + (int64_t)t * H;
        for (int64_t c = 0; c < H; c++)
            yt[c] = 0;
        for (int j = 0; j < k; j++) {
            int i = idt[j] - ex->first_local;
            if (i < 0 || i >= ex->n_local)
                continue;
            for (int64_t c = 0; c < H; c++)
                yt[c] += (double)w[(int64_t)t * k + j] * ys[(int64_t)j * H + c];
        }
    }
    free(ys);
    work_free(&wk);
    return K3_OK;
}

int k3_moe_experts_ref_f32(void *ctx, const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                           const int32_t *ids, const float *w, int k, float *y, k3_error *err) {
    (void)ctx; /* the reference has no state and runs on one thread by design */
    int rc = check_call(ex, mode, x, T, ids, w, k, err);
    if (rc)
        return rc;
    size_t n = (size_t)T * (size_t)ex->hidden;
    double *yd = malloc((n ? n : 1) * sizeof *yd);
    if (!yd)
        return k3_fail(err, K3_ERR_NOMEM, "moe reference: output [%d, %d]", T, ex->hidden);
    rc = k3_moe_experts_ref(ex, mode, x, T, ids, w, k, yd, err);
    if (!rc)
        for (size_t i = 0; i < n; i++)
            y[i] = (float)yd[i];
    free(yd);
    return rc;
}
