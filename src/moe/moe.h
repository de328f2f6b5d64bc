/* The MoE operator's data contract, shared by the loader (which fills it), the float64
 * reference, the CPU kernels and the GPU backends (which consume it).
 *
 * Shapes follow moe.md and k3-architecture.md §5: routed experts see width H (the latent
 * width L = routed_expert_hidden_size for Kimi K3, the model width for Kimi-Linear), have
 * intermediate I, and are stored per expert in file layout (k3_qmat): w1 = gate [I, H],
 * w3 = up [I, H], w2 = down [H, I]. Kernels that want [w3|w1] or another layout build it
 * from these at load time. Only the n_local experts [first_local, first_local + n_local)
 * of an expert-parallel rank are present. */
#ifndef K3_MOE_H
#define K3_MOE_H

#include "base/base.h"
#include "formats/qmat.h"
#include <stdbool.h>
#include <stdint.h>

/* Activations, numbered as TensorRT-LLM's CUTLASS enum (moe.md §1.1), SiTU appended. */
typedef enum k3_act {
    K3_ACT_INVALID = 0,
    K3_ACT_IDENTITY = 1,
    K3_ACT_GELU = 2,
    K3_ACT_RELU = 3,
    K3_ACT_SILU = 4,
    K3_ACT_SWIGLU = 5,
    K3_ACT_GEGLU = 6,
    K3_ACT_SWIGLU_BIAS = 7,
    K3_ACT_RELU2 = 8,
    K3_ACT_SITU = 9,
    K3_ACT_COUNT
} k3_act;

/* Per-expert activation parameters. For SiTU: alpha = gate-side beta (4.0 for K3),
 * beta = linear beta (25.0); limit must be NULL. For SwigluBias: alpha, beta, limit as in
 * moe.md §1.2. Arrays have n_local entries (one per local expert). */
typedef struct k3_act_params {
    k3_act act;
    const float *alpha; /* [n_local] or NULL */
    const float *beta;  /* [n_local] or NULL */
    const float *limit; /* [n_local] or NULL */
} k3_act_params;

typedef enum k3_route_fn {
    K3_ROUTE_NOAUX_TC = 0, /* sigmoid + correction bias for selection (DeepSeek-V3 / K3) */
    K3_ROUTE_SOFTMAX_TOPK, /* softmax -> top-k ("Default") */
    K3_ROUTE_RENORMALIZE,  /* top-k of logits -> softmax over the k */
    K3_ROUTE_SIGMOID,      /* sigmoid -> top-k, optional renormalize */
    K3_ROUTE_COUNT
} k3_route_fn;

typedef struct k3_router {
    k3_route_fn fn;
    int n_experts; /* global E */
    int top_k;
    int n_group, topk_group; /* group-limited top-k when n_group > 1 */
    bool renormalize;
    float routed_scaling_factor;
    k3_qmat gate;                 /* [E, model width], BF16/F32 in checkpoints; fp32 GEMM */
    const float *correction_bias; /* [E] (noaux_tc), or NULL */
} k3_router;

typedef struct k3_expert {
    k3_qmat w1; /* gate [I, H] */
    k3_qmat w3; /* up   [I, H] */
    k3_qmat w2; /* down [H, I] */
} k3_expert;

/* The routed experts of one layer, as one expert-parallel rank holds them. */
typedef struct k3_experts {
    int n_experts;   /* global E */
    int first_local; /* first global expert id owned here */
    int n_local;
    int hidden;   /* H: the width experts read and write */
    int inter;    /* I */
    k3_expert *e; /* [n_local] */
    k3_act_params act;
} k3_experts;

/* A whole MoE block (k3-architecture.md §5.4). Kimi K3: latent = true (down-projection to
 * H = L, experts, fp32 weighted sum, RMSNorm, up-projection) plus a shared SiTU MLP on the
 * full-width input. Kimi-Linear: latent = false (experts at full width), SiLU. */
typedef struct k3_moe_block {
    int model_width; /* full width the block reads and writes */
    k3_router router;
    k3_experts experts;
    bool latent;
    k3_qmat latent_down;     /* [L, model_width] */
    const void *latent_norm; /* [L] weight, F32, BF16 or F16 as latent_norm_fmt says; NULL:
                                no norm (latent_moe_use_norm false), see the forward */
    k3_wfmt latent_norm_fmt;
    k3_qmat latent_up; /* [model_width, L] */
    float norm_eps;
    int n_shared;                                /* 0 = no shared experts */
    k3_qmat shared_gate, shared_up, shared_down; /* [S, W], [S, W], [W, S] */
    k3_act_params shared_act;                    /* scalars: arrays of length 1 */
} k3_moe_block;

/* How activations enter the expert GEMMs (issue 4):
 *  W4A16: activations stay float (bf16/fp32); exact against the reference on the same
 *         dequantized weights.
 *  W4A4:  NVFP4 experts, activations quantized to NVFP4 per 16 at run time, the way
 *         TensorRT-LLM runs them on Blackwell: FC1 input with g1 = 1/max over local experts
 *         of w1.input_scale, FC2 input with g2 = 1/max of w2.input_scale (moe.md §2.2).
 *  W4A8:  MXFP4 experts, activations quantized to MXFP8 per 32 (W4A8_MXFP4_MXFP8).
 *  W4A16_BF16 ("w4a16-bf16"): W4A16 with bf16 activations, the way TensorRT-LLM's BF16 MoE
 *         and bf16 servers run it (performance.md's baselines): the FC1 input x and the FC2
 *         input act(h) are rounded to bf16 (round to nearest even) before the GEMMs; products
 *         and sums stay exact/float64 in the reference. Any weight format. On the GPU one
 *         tensor-core product per weight instead of W4A16's two (hi + lo fp16 terms). */
typedef enum k3_act_mode {
    K3_MODE_W4A16 = 0,
    K3_MODE_W4A4,
    K3_MODE_W4A8,
    K3_MODE_W4A16_BF16,
    K3_MODE_COUNT
} k3_act_mode;

/* The routed-expert operator every backend implements:
 *   y[t, :] = sum over k of w[t, k] * expert_{ids[t, k]}(x[t, :])
 * x: float [T, H]; ids: int32 [T, k] global expert ids; w: float [T, k]; y: [T, H],
 * fully overwritten. Slots whose expert is not local to `ex` contribute nothing (so the sum
 * over expert-parallel ranks is the whole result). An id outside [0, n_experts) is an error.
 * expert(x) = w2 . act(w1 . x, w3 . x) for gated activations, w2 . act(w1 . x) otherwise. */
int k3_moe_experts_ref(const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                       const int32_t *ids, const float *w, int k, double *y, k3_error *err);

/* The same before the weighted sum: ys[t, j, :] = expert_{ids[t, j]}(x[t, :]) (unweighted)
 * for local slots and exactly 0 for the others; ys is [T, k, H]. k3_moe_experts_ref is
 * ys followed by y[t] = sum over j in slot order of w[t, j] * ys[t, j] (the sum skips the
 * non-local slots), so summing ys over expert-parallel ranks (each slot is nonzero on one rank
 * only) and then finalizing gives the single-rank y bit for bit. */
int k3_moe_experts_ref_slots(const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                             const int32_t *ids, int k, double *ys, k3_error *err);

/* The routed-expert operator in the float form every backend is driven through, with the
 * semantics of k3_moe_experts_ref: y float [T, H] fully overwritten. ctx is the backend's
 * own state (the CPU path's k3_threadpool, a GPU backend's device copies; NULL for the
 * reference). The CPU fast path k3_moe_experts_cpu(..., k3_threadpool *pool, err) fits it
 * through a one-line adapter that passes ctx as the pool. */
typedef int (*k3_moe_experts_fn)(void *ctx, const k3_experts *ex, k3_act_mode mode, const float *x,
                                 int T, const int32_t *ids, const float *w, int k, float *y,
                                 k3_error *err);

/* The reference in that form (ctx ignored): k3_moe_experts_ref, then y rounded to float. */
int k3_moe_experts_ref_f32(void *ctx, const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                           const int32_t *ids, const float *w, int k, float *y, k3_error *err);

/* Checks an expert bank for `mode`: geometry (n_local >= 1 inside [0, n_experts); w1, w2 and,
 * for gated activations only, w3 of shapes [I, H], [H, I], [I, H]), activation parameters,
 * and the mode's formats: W4A4 needs NVFP4 w1/w3/w2 with finite input_scale > 0 (w3's equal
 * to w1's) and H, I multiples of 16; W4A8 needs MXFP4 and multiples of 32. */
int k3_experts_validate(const k3_experts *ex, k3_act_mode mode, k3_error *err);

/* The call's inputs, the same for every backend: topk_ids in [0, n_experts), topk_weights
 * and x[T, hidden] finite (a NaN would otherwise flow into every output it touches). */
int k3_experts_validate_inputs(int n_experts, int hidden, const float *x, int T,
                               const int32_t *ids, const float *w, int k, k3_error *err);

/* "w4a16", "w4a4", "w4a8", "w4a16-bf16"; and back (K3_ERR_ARG naming the string). */
const char *k3_act_mode_name(k3_act_mode mode);
int k3_act_mode_from_name(const char *name, k3_act_mode *out, k3_error *err);

/* ---- expert parallelism in one process (moe.md §2.6) -------------------------------- */

/* A view of experts [first, first + count) (global ids) of `full`: shares full's weights and
 * offsets its per-expert activation arrays. The range must lie inside full's local range. */
int k3_experts_view(const k3_experts *full, int first, int count, k3_experts *view, k3_error *err);

/* The contiguous partition of E experts over R ranks that TensorRT-LLM's
 * _compute_ep_partition makes (k3_ep_partition, moe/ep.h): base = E / R, rem = E % R; rank
 * r < rem owns base + 1 experts starting at r*base + min(r, rem). E < R is an error. */
int k3_moe_ep_range(int n_experts, int ep_size, int ep_rank, int *first, int *count, k3_error *err);

/* Runs `fn` once per rank of an ep_size partition of `full`'s experts (full must hold all E)
 * and sums the ranks' y in rank order into y [T, H] (fully overwritten). */
int k3_moe_experts_ep_sum(k3_moe_experts_fn fn, void *ctx, const k3_experts *full, int ep_size,
                          k3_act_mode mode, const float *x, int T, const int32_t *ids,
                          const float *w, int k, float *y, k3_error *err);

/* ---- the whole block -------------------------------------------------------------- */

/* How the block runs its routed experts: the operator and its ctx, the activation mode, and
 * ep_size > 1 to run them as ep_size expert-parallel ranks in this process and sum
 * (k3_moe_experts_ep_sum); 0 or 1 = no expert parallelism. */
typedef struct k3_moe_backend {
    k3_moe_experts_fn experts;
    void *ctx;
    k3_act_mode mode;
    int ep_size;
} k3_moe_backend;

/* One MoE block on T tokens of x [T, model_width] (float): routing on the full-width x, then
 * (latent) z = latent_down x; r = experts(z); r = RMSNorm(r) * latent_norm (skipped when
 * latent_norm is NULL); y = latent_up r, or (not latent) y = experts(x); plus, when
 * n_shared > 0, shared_down(act(shared_gate x, shared_up x)). Every GEMM outside the experts
 * is fp32 (products summed in double, rounded once); the weighted expert sum is fp32 as the
 * backend returns it. y [T, model_width] is fully overwritten; ids [T, top_k] and w [T, top_k]
 * receive the routing (NULL: not wanted). */
int k3_moe_block_forward(const k3_moe_block *b, const k3_moe_backend *be, const float *x, int T,
                         float *y, int32_t *ids, float *w, k3_error *err);

/* Checks a block: router, experts (for be->mode), latent and shared shapes and formats. */
int k3_moe_block_validate(const k3_moe_block *b, k3_act_mode mode, k3_error *err);

#endif
