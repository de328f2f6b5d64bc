/* The tensor plan: every tensor a Kimi K3 / Kimi-Linear checkpoint of a given model config
 * holds, with its name, logical shape, allowed dtypes and role (k3-architecture.md §8,
 * checkpoint-formats.md §7.2). The loader checks a checkpoint against it in both directions
 * (missing and unexpected tensors); make-tiny and quantize write exactly it. One list, so the
 * writer and the reader cannot drift apart.
 *
 * Linear entries name the module ("...self_attn.q_proj"); the decoder finds its tensors
 * (".weight", ".weight_scale", ...). Plain entries name the tensor itself. Left out: MTP
 * layers (K3 has none) and the vision tower (skipped by name). */
#ifndef K3_LOAD_PLAN_H
#define K3_LOAD_PLAN_H

#include "io/model_config.h"
#include <stddef.h>
#include <stdint.h>

typedef enum k3_role {
    K3_R_EMBED = 0, K3_R_LM_HEAD, K3_R_FINAL_NORM, K3_R_OUT_RES_NORM, K3_R_OUT_RES_PROJ,
    K3_R_IN_NORM, K3_R_POST_NORM, K3_R_ATTN_RES_NORM, K3_R_ATTN_RES_PROJ, K3_R_MLP_RES_NORM,
    K3_R_MLP_RES_PROJ,
    K3_R_ATTN_PROJ,  /* any attention linear (q/k/v/o/g/f_a/f_b/b, MLA q_a/q_b/kv_a/kv_b) */
    K3_R_ATTN_NORM,  /* o_norm, q_a_layernorm, kv_a_layernorm */
    K3_R_KDA_CONV,   /* [C, 1, W] F32 */
    K3_R_KDA_A_LOG,  /* [pad >= heads] F32, zero tail; or [1,1,H,1] */
    K3_R_KDA_DT_BIAS,
    K3_R_DENSE_GATE, K3_R_DENSE_UP, K3_R_DENSE_DOWN,
    K3_R_ROUTER, K3_R_ROUTER_BIAS,
    K3_R_LATENT_DOWN, K3_R_LATENT_NORM, K3_R_LATENT_UP,
    K3_R_SHARED_GATE, K3_R_SHARED_UP, K3_R_SHARED_DOWN,
    K3_R_EXPERT,     /* routed expert projection: expert, proj (1 gate, 3 up, 2 down) */
    K3_R_COUNT
} k3_role;

typedef struct k3_pentry {
    char *name;        /* module (linear) or tensor (plain) name, prefix included; owned */
    bool linear;       /* true: a weight matrix decoded through load/decode.h */
    k3_role role;
    int layer;         /* -1 for model-level tensors */
    int expert;        /* -1, or the global routed-expert id */
    int proj;          /* 1, 2, 3 for routed experts (w1 gate, w2 down, w3 up); else 0 */
    int rank;          /* linear: 2 */
    int64_t shape[4];  /* linear: [rows=out, cols=in] */
    unsigned dtypes;   /* plain: allowed dtypes, bitmask of 1u << k3_dtype */
} k3_pentry;

typedef struct k3_plan {
    k3_pentry *e;
    size_t n, cap;
    char *prefix;      /* "" or "language_model." */
    int64_t a_log_len; /* the padded A_log length this plan writes (make-tiny) */
} k3_plan;

/* Builds the plan of mc with tensor-name prefix ("" or "language_model."). Routed experts
 * appear in (layer, expert, proj) order, each right after its layer's other tensors. */
int k3_plan_build(k3_plan *p, const k3_model_config *mc, const char *prefix, k3_error *err);
void k3_plan_free(k3_plan *p); /* NULL-safe, leaves an empty plan */

/* The routed experts' activation: config.json's "silu" is the gated SwiGLU of Kimi-Linear,
 * "situ" SiTU-GLU. Whether w3 exists follows k3_act_is_gated of this (moe/activation.h). */
k3_act k3_plan_expert_act(const k3_model_config *mc);

/* The K3 convention for A_log padding: heads rounded up to a multiple of 128 ([96] -> [128]). */
int64_t k3_plan_a_log_len(int64_t heads);

#endif
