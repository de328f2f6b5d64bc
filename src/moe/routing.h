/* MoE routing (moe.md §2.1, §6; k3-architecture.md §5.3): the fp32 router GEMM and the
 * top-k selection functions that turn its logits into expert ids and weights.
 *
 * Determinism: routing runs on the host for every backend, so every backend sees the same ids
 * and weights. The GEMM sums each logit's exact fp32 products in double and rounds once, so
 * its fp32 logit is (up to rare double-rounding cases) the correctly rounded dot product,
 * whatever order another implementation sums in. Top-k breaks ties between equal selection
 * scores in favour of the LOWER expert id (for groups: the lower group id). The k output
 * slots are ordered by descending selection score, ties by ascending id.
 *
 * Left out: Llama4 and MiniMax2 routing (no checkpoint k3 reads uses them), the bf16 router
 * GEMM (TensorRT-LLM's non-ADP K3 path; its reduction order flips borderline picks, §6),
 * expert load balancing. */
#ifndef K3_ROUTING_H
#define K3_ROUTING_H

#include "base/base.h"
#include "moe/moe.h"

/* Checks the router's parameters: 1 <= top_k <= n_experts, n_group >= 1 dividing n_experts,
 * 1 <= topk_group <= n_group, top_k <= topk_group * (n_experts / n_group), a finite
 * routed_scaling_factor > 0, a finite correction bias, and (when gate.data is set) a gate of
 * shape [n_experts, *] in F32 or BF16. */
int k3_router_validate(const k3_router *r, k3_error *err);

/* logits[t, e] = sum_c x[t, c] * gate[e, c] for T tokens of width gate.cols, in fp32: the
 * products of the fp32 (or bf16-upcast) operands are summed in double and the sum is rounded
 * once to float. */
int k3_router_logits(const k3_router *r, const float *x, int T, float *logits, k3_error *err);

/* Selection on given logits [T, E] (float): writes ids [T, top_k] (global expert ids) and
 * weights [T, top_k]. Per function (all in fp32):
 *  NOAUX_TC:    s = sigmoid(l); b = s + correction_bias (NULL = 0), used only to select;
 *               n_group > 1: group score = sum of the group's top-2 b (top-1 when a group has
 *               one expert), experts outside the best topk_group groups are excluded; top-k
 *               of b; w = s[id]; renormalize: w /= (sum w + 1e-20).
 *  SOFTMAX_TOPK: p = softmax(l) over E; top-k of p; w = p[id]; renormalize: w /= sum w
 *               (TensorRT-LLM's "RenormalizeNaive"; without it, "Default").
 *  RENORMALIZE: top-k of l; w = softmax over the k selected logits (renormalize ignored).
 *  SIGMOID:     s = sigmoid(l); top-k of s; w = s[id]; renormalize: w /= (sum w + 1e-20).
 * Every function finally multiplies w by routed_scaling_factor (set it to 1 for none).
 * A non-finite logit is K3_ERR_NUMERIC naming the token and expert; nothing is chosen. */
int k3_route_logits(const k3_router *r, const float *logits, int T, int32_t *ids, float *weights,
                    k3_error *err);

/* k3_router_logits followed by k3_route_logits. */
int k3_route(const k3_router *r, const float *x, int T, int32_t *ids, float *weights,
             k3_error *err);

#endif
