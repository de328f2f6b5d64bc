/* Expert activations (moe.md §1): the elementwise functions, the one table that says which
 * activations are gated, and the validation of their per-expert parameters.
 *
 * Gatedness decides the FC1 geometry (2I rows for gated, I otherwise) and whether w3 is read
 * at all. A mismatch between two places that decide it makes a loader pad or truncate
 * silently (moe.md §1.3), so every place asks k3_act_is_gated / k3_act_fc1_rows here; a test
 * (tests/py/test_gated_parity.py) fails if a source file keeps its own list.
 *
 * Left out: SwigluBias's clampAfterSilu variant (no checkpoint k3 reads uses it), biases on
 * FC1 (no K3/Kimi-Linear expert has one), HF's "linear_beta = None" form of SiTU (no fused
 * kernel can represent it; validation rejects a missing beta instead). */
#ifndef K3_ACTIVATION_H
#define K3_ACTIVATION_H

#include "base/base.h"
#include "moe/moe.h"

#include <stdbool.h>
#include <stdint.h>

/* The gated set {Swiglu, Geglu, SwigluBias, SiTU}; false for INVALID and out-of-range. */
bool k3_act_is_gated(k3_act act);

/* Rows of the FC1 output per expert: 2*inter for gated activations ([w3|w1] or w1+w3),
 * inter otherwise. The one sizing rule for FC1 buffers and packed FC1 weights. */
int64_t k3_act_fc1_rows(k3_act act, int64_t inter);

/* "situ", "swiglu", ... (lower case, as config.json spells hidden_act); "invalid" otherwise. */
const char *k3_act_name(k3_act act);
/* The inverse of k3_act_name; also accepts "silu" for the non-gated SiLU. K3_ERR_ARG with the
 * name when unknown. */
int k3_act_from_name(const char *name, k3_act *out, k3_error *err);

/* Checks that p can run on n_local experts:
 *  - act is a real activation;
 *  - SiTU: alpha (gate-side beta) and beta (linear beta) present, each finite and > 0 for
 *    every local expert; limit must be NULL (SiTU has no clamp);
 *  - SwigluBias: alpha and beta finite where given (NULL: the kernel defaults 1 and 0);
 *    limit optional (NULL = +inf), each entry > 0 (may be +inf), never NaN;
 *  - every other activation ignores the arrays and needs none.
 * Errors name the parameter and the local expert index. */
int k3_act_params_validate(const k3_act_params *p, int n_local, k3_error *err);

/* One output element for local expert e: act(g) for non-gated activations (u ignored),
 * act(g, u) for gated ones, g being the gate (w1) value and u the up (w3) value. The params
 * must have passed k3_act_params_validate. Evaluated entirely in the argument's precision. */
double k3_act_f64(const k3_act_params *p, int e, double g, double u);
float k3_act_f32(const k3_act_params *p, int e, float g, float u);

/* A row of n: out[i] = act(g[i], u[i]); u may be NULL for non-gated activations. */
void k3_act_row_f32(const k3_act_params *p, int e, const float *g, const float *u, float *out,
                    int64_t n);

#endif
