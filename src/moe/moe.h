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
    K3_ROUTE_NOAUX_TC = 0,    /* sigmoid + correction bias for selection (DeepSeek-V3 / K3) */
    K3_ROUTE_SOFTMAX_TOPK,    /* softmax -> top-k ("Default") */
    K3_ROUTE_RENORMALIZE,     /* top-k of logits -> softmax over the k */
    K3_ROUTE_SIGMOID,         /* sigmoid -> top-k, optional renormalize */
    K3_ROUTE_COUNT
} k3_route_fn;

typedef struct k3_router {
    k3_route_fn fn;
    int n_experts;               /* global E */
    int top_k;
    int n_group, topk_group;     /* group-limited top-k when n_group > 1 */
    bool renormalize;
    float routed_scaling_factor;
    k3_qmat gate;                /* [E, model width], BF16/F32 in checkpoints; fp32 GEMM */
    const float *correction_bias;/* [E] (noaux_tc), or NULL */
} k3_router;

typedef struct k3_expert {
    k3_qmat w1; /* gate [I, H] */
    k3_qmat w3; /* up   [I, H] */
    k3_qmat w2; /* down [H, I] */
} k3_expert;

/* The routed experts of one layer, as one expert-parallel rank holds them. */
typedef struct k3_experts {
    int n_experts;      /* global E */
    int first_local;    /* first global expert id owned here */
    int n_local;
    int hidden;         /* H: the width experts read and write */
    int inter;          /* I */
    k3_expert *e;       /* [n_local] */
    k3_act_params act;
} k3_experts;

/* A whole MoE block (k3-architecture.md §5.4). Kimi K3: latent = true (down-projection to
 * H = L, experts, fp32 weighted sum, RMSNorm, up-projection) plus a shared SiTU MLP on the
 * full-width input. Kimi-Linear: latent = false (experts at full width), SiLU. */
typedef struct k3_moe_block {
    int model_width;     /* full width the block reads and writes */
    k3_router router;
    k3_experts experts;
    bool latent;
    k3_qmat latent_down; /* [L, model_width] */
    const void *latent_norm;   /* [L] weight, BF16 or F32 as latent_norm_fmt says */
    k3_wfmt latent_norm_fmt;
    k3_qmat latent_up;   /* [model_width, L] */
    float norm_eps;
    int n_shared;        /* 0 = no shared experts */
    k3_qmat shared_gate, shared_up, shared_down; /* [S, W], [S, W], [W, S] */
    k3_act_params shared_act; /* scalars: arrays of length 1 */
} k3_moe_block;

/* How activations enter the expert GEMMs (issue 4):
 *  W4A16: activations stay float (bf16/fp32); exact against the reference on the same
 *         dequantized weights.
 *  W4A4:  NVFP4 experts, activations quantized to NVFP4 per 16 at run time, the way
 *         TensorRT-LLM runs them on Blackwell: FC1 input with g1 = 1/max over local experts
 *         of w1.input_scale, FC2 input with g2 = 1/max of w2.input_scale (moe.md §2.2).
 *  W4A8:  MXFP4 experts, activations quantized to MXFP8 per 32 (W4A8_MXFP4_MXFP8). */
typedef enum k3_act_mode { K3_MODE_W4A16 = 0, K3_MODE_W4A4, K3_MODE_W4A8, K3_MODE_COUNT } k3_act_mode;

/* The routed-expert operator every backend implements:
 *   y[t, :] = sum over k of w[t, k] * expert_{ids[t, k]}(x[t, :])
 * x: float [T, H]; ids: int32 [T, k] global expert ids; w: float [T, k]; y: [T, H],
 * fully overwritten. Slots whose expert is not local to `ex` contribute nothing (so the sum
 * over expert-parallel ranks is the whole result). An id outside [0, n_experts) is an error.
 * expert(x) = w2 . act(w1 . x, w3 . x) for gated activations, w2 . act(w1 . x) otherwise. */
int k3_moe_experts_ref(const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                       const int32_t *ids, const float *w, int k, double *y, k3_error *err);

#endif
