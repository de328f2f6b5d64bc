/* Expert activations in float64 (the reference) and float32 (fast paths that want the same
 * formulas), the gated table and parameter validation. The formulas are moe.md §1.2
 * verbatim; tanh is computed with tanh() itself, not the 2*sigma(2x) - 1 identity, because
 * this file is what the fast paths are measured against. */
#include "moe/activation.h"

#include <math.h>
#include <string.h>

/* THE gated table. Nothing else in src/ may list gated activations (see the header). */
static const bool act_gated[K3_ACT_COUNT] = {
    [K3_ACT_SWIGLU] = true,
    [K3_ACT_GEGLU] = true,
    [K3_ACT_SWIGLU_BIAS] = true,
    [K3_ACT_SITU] = true,
};

static const char *const act_names[K3_ACT_COUNT] = {
    [K3_ACT_INVALID] = "invalid", [K3_ACT_IDENTITY] = "identity",
    [K3_ACT_GELU] = "gelu",       [K3_ACT_RELU] = "relu",
    [K3_ACT_SILU] = "silu",       [K3_ACT_SWIGLU] = "swiglu",
    [K3_ACT_GEGLU] = "geglu",     [K3_ACT_SWIGLU_BIAS] = "swiglu_bias",
    [K3_ACT_RELU2] = "relu2",     [K3_ACT_SITU] = "situ",
};

bool k3_act_is_gated(k3_act act) {
    return (int)act > 0 && (int)act < K3_ACT_COUNT && act_gated[act];
}

int64_t k3_act_fc1_rows(k3_act act, int64_t inter) {
    return k3_act_is_gated(act) ? 2 * inter : inter;
}

const char *k3_act_name(k3_act act) {
    if ((int)act <= 0 || (int)act >= K3_ACT_COUNT)
        return "invalid";
    return act_names[act];
}

int k3_act_from_name(const char *name, k3_act *out, k3_error *err) {
    for (int a = 1; a < K3_ACT_COUNT; a++)
        if (name && !strcmp(name, act_names[a])) {
            *out = (k3_act)a;
            return K3_OK;
        }
    return k3_fail(err, K3_ERR_ARG,
                   "activation '%s': expected one of identity, gelu, relu, silu, swiglu, geglu, "
                   "swiglu_bias, relu2, situ",
                   name ? name : "(null)");
}

/* Checks one per-expert array: present, and each entry accepted by `ok`. */
static int check_array(const float *a, int n, const char *act, const char *param, bool (*ok)(float),
                       const char *want, k3_error *err) {
    if (!a)
        return k3_fail(err, K3_ERR_MISSING, "%s: parameter %s is missing (NULL)", act, param);
    for (int e = 0; e < n; e++)
        if (!ok(a[e]))
            return k3_fail(err, K3_ERR_NUMERIC,
                           "%s: %s[%d] (local expert %d): expected %s, found %g", act, param, e, e,
                           want, (double)a[e]);
    return K3_OK;
}

static bool finite_pos(float v) {
    return isfinite(v) && v > 0;
}
static bool finite_any(float v) {
    return isfinite(v);
}
static bool limit_ok(float v) {
    return !isnan(v) && v > 0;
}

int k3_act_params_validate(const k3_act_params *p, int n_local, k3_error *err) {
    if (!p)
        return k3_fail(err, K3_ERR_ARG, "activation params: NULL");
    if ((int)p->act <= 0 || (int)p->act >= K3_ACT_COUNT)
        return k3_fail(err, K3_ERR_ARG, "activation: invalid value %d", (int)p->act);
    if (n_local <= 0)
        return k3_fail(err, K3_ERR_ARG, "activation params: n_local must be > 0, found %d",
                       n_local);
    int rc;
    if (p->act == K3_ACT_SITU) {
        /* alpha carries the gate-side beta (4.0 for K3), beta the linear beta (25.0). A zero
         * or missing beta would compute tanh(u/0)*0 = NaN in a kernel (moe.md §1.3). */
        if ((rc = check_array(p->alpha, n_local, "situ", "alpha (gate-side beta)", finite_pos,
                              "a finite value > 0", err)))
            return rc;
        if ((rc = check_array(p->beta, n_local, "situ", "beta (linear beta)", finite_pos,
                              "a finite value > 0", err)))
            return rc;
        if (p->limit)
            return k3_fail(err, K3_ERR_UNSUPPORTED,
                           "situ: parameter limit must be NULL (SiTU has no clamp limit)");
    } else if (p->act == K3_ACT_SWIGLU_BIAS) {
        /* absent arrays are the kernel defaults, alpha 1 and beta 0 (moe.md §1.2, §1.3) */
        if (p->alpha && (rc = check_array(p->alpha, n_local, "swiglu_bias", "alpha", finite_any,
                                          "a finite value", err)))
            return rc;
        if (p->beta && (rc = check_array(p->beta, n_local, "swiglu_bias", "beta", finite_any,
                                         "a finite value", err)))
            return rc;
        if (p->limit && (rc = check_array(p->limit, n_local, "swiglu_bias", "limit", limit_ok,
                                          "a value > 0 (or +inf)", err)))
            return rc;
    }
    return K3_OK;
}

/* ---- float64 ------------------------------------------------------------------------ */

static double sigmoid_d(double x) {
    return 1.0 / (1.0 + exp(-x));
}
/* GELU, erf form, written with erfc: 0.5*x*(1 + erf(x/sqrt2)) = 0.5*x*erfc(-x/sqrt2), which
 * avoids the cancellation of 1 + erf for negative x (the float version loses all digits
 * below x ~ -4 otherwise). */
static double gelu_d(double x) {
    return 0.5 * x * erfc(-x / sqrt(2.0));
}

double k3_act_f64(const k3_act_params *p, int e, double g, double u) {
    switch (p->act) {
    case K3_ACT_IDENTITY:
        return g;
    case K3_ACT_GELU:
        return gelu_d(g);
    case K3_ACT_RELU:
        return g > 0 ? g : 0.0;
    case K3_ACT_SILU:
        return g * sigmoid_d(g);
    case K3_ACT_RELU2:
        return g > 0 ? g * g : 0.0;
    case K3_ACT_SWIGLU:
        return g * sigmoid_d(g) * u;
    case K3_ACT_GEGLU:
        return gelu_d(g) * u;
    case K3_ACT_SWIGLU_BIAS: {
        double a = p->alpha ? p->alpha[e] : 1.0, b = p->beta ? p->beta[e] : 0.0;
        double lim = p->limit ? (double)p->limit[e] : INFINITY;
        double gc = g < lim ? g : lim;
        double uc = u < -lim ? -lim : (u > lim ? lim : u);
        return gc * sigmoid_d(a * gc) * (uc + b);
    }
    case K3_ACT_SITU: {
        double bg = p->alpha[e], bl = p->beta[e];
        return bg * tanh(g / bg) * sigmoid_d(g) * (bl * tanh(u / bl));
    }
    default:
        return NAN; /* unreachable after validation */
    }
}

/* ---- float32 ------------------------------------------------------------------------ */

static float sigmoid_f(float x) {
    return 1.0f / (1.0f + expf(-x));
}
static float gelu_f(float x) {
    return 0.5f * x * erfcf(-x * 0.70710678118654752f);
}

float k3_act_f32(const k3_act_params *p, int e, float g, float u) {
    switch (p->act) {
    case K3_ACT_IDENTITY:
        return g;
    case K3_ACT_GELU:
        return gelu_f(g);
    case K3_ACT_RELU:
        return g > 0 ? g : 0.0f;
    case K3_ACT_SILU:
        return g * sigmoid_f(g);
    case K3_ACT_RELU2:
        return g > 0 ? g * g : 0.0f;
    case K3_ACT_SWIGLU:
        return g * sigmoid_f(g) * u;
    case K3_ACT_GEGLU:
        return gelu_f(g) * u;
    case K3_ACT_SWIGLU_BIAS: {
        float a = p->alpha ? p->alpha[e] : 1.0f, b = p->beta ? p->beta[e] : 0.0f;
        float lim = p->limit ? p->limit[e] : INFINITY;
        float gc = g < lim ? g : lim;
        float uc = u < -lim ? -lim : (u > lim ? lim : u);
        return gc * sigmoid_f(a * gc) * (uc + b);
    }
    case K3_ACT_SITU: {
        float bg = p->alpha[e], bl = p->beta[e];
        return bg * tanhf(g / bg) * sigmoid_f(g) * (bl * tanhf(u / bl));
    }
    default:
        return NAN;
    }
}

void k3_act_row_f32(const k3_act_params *p, int e, const float *g, const float *u, float *out,
                    int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = k3_act_f32(p, e, g[i], u ? u[i] : 0.0f);
}
