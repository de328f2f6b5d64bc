/* The model configuration of a Kimi K3 or Kimi-Linear checkpoint, read from config.json.
 *
 * Two shapes are accepted (k3-architecture.md §1.1-§1.3): the Kimi K3 VL wrapper
 * (`model_type` "kimi_k3", text model under `text_config`, whose model_type is
 * "kimi_linear"; tensor names then usually carry `language_model.`) and a bare
 * "kimi_linear" config (Kimi-Linear-48B-A3B). Every field the forward pass depends on is
 * read, bounded and cross-checked; the result also carries a per-layer plan (attention kind,
 * FFN kind, AttnRes block starts) so the loader and `inspect` never re-derive it.
 *
 * Defaults: only where the reference config class (KimiLinearConfig, as mirrored in
 * TensorRT-LLM and vLLM) has one, and only for behaviour switches, never for sizes. The
 * class also has placeholder sizes (hidden 4096, 32 layers, ...); taking those silently
 * would build a model of the wrong shape, so every size is required here.
 *
 *   field                         default        note
 *   num_key_value_heads           num_attention_heads
 *   head_dim                      hidden/heads   unused by the forward pass (NoPE MLA)
 *   hidden_act                    "silu"
 *   rms_norm_eps                  1e-6
 *   max_position_embeddings       4096           else model_max_length when present
 *   mla_use_nope                  false          false is then rejected (no RoPE MLA in k3)
 *   mla_use_output_gate           false
 *   q_lora_rank                   null           null -> plain q_proj (Kimi-Linear)
 *   moe_renormalize               true           false is rejected (moe.md §6)
 *   moe_router_activation_func    "sigmoid"
 *   topk_method                   "noaux_tc"
 *   num_shared_experts            0
 *   routed_scaling_factor         1.0
 *   first_k_dense_replace         0
 *   moe_layer_freq                1
 *   use_grouped_topk              true
 *   num_expert_group / topk_group 1 / 1
 *   num_nextn_predict_layers      0              other values are rejected (no MTP in K3)
 *   attn_res_block_size           null           null -> plain pre-norm residual
 *   latent_moe_use_norm           false
 *   routed_expert_hidden_size     null           null -> experts at hidden_size
 *   linear_attn_config.use_full_rank_gate  false -> low-rank g_a_proj/g_b_proj
 *   linear_attn_config.gate_lower_bound    null  -> softplus decay (Kimi-Linear)
 *   tie_word_embeddings           false
 *   bos / eos_token_id            1 / 2
 *   pad_token_id                  -1 (none)      when null or absent everywhere; not the
 *                                                class's 0, a real token id k3 would then
 *                                                pad with unasked
 *   initializer_range, use_cache  0.02, true     carried for the writer only
 * Required (error `config.json: text_config.FIELD: missing`): vocab_size, hidden_size,
 * intermediate_size, num_hidden_layers, num_attention_heads, kv_lora_rank,
 * qk_nope_head_dim, qk_rope_head_dim, v_head_dim, num_experts, num_experts_per_token,
 * moe_intermediate_size, linear_attn_config and its num_heads, head_dim,
 * short_conv_kernel_size, kda_layers, full_attn_layers; activation_situ_beta and
 * activation_situ_linear_beta when hidden_act is "situ".
 *
 * Left out: the vision config (k3 is text-only), RoPE parameters (K3 and Kimi-Linear are
 * NoPE; rope_theta/rope_scaling are ignored, a non-null rope_scaling with a warning), the
 * tokenizer, and the quantization_config (src/io/quant_config.h reads it). Cross-checks
 * against tensor shapes are the loader's. */
#ifndef K3_MODEL_CONFIG_H
#define K3_MODEL_CONFIG_H

#include "base/base.h"
#include "moe/moe.h"
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

/* Upper bounds on everything that sizes an array (a hostile config.json must not make the
 * loader allocate terabytes). K3 sits well inside each. */
#define K3_MAX_LAYERS      512
#define K3_MAX_VOCAB       (1 << 22)
#define K3_MAX_HIDDEN      65536
#define K3_MAX_INTER       (1 << 18)
#define K3_MAX_HEADS       1024
#define K3_MAX_HEAD_DIM    1024
#define K3_MAX_LORA_RANK   16384
#define K3_MAX_EXPERTS     4096
#define K3_MAX_TOPK        64
#define K3_MAX_SHARED      64
#define K3_MAX_CONV_KERNEL 64
#define K3_MAX_POSITIONS   (1 << 26)
#define K3_MAX_MTP_LAYERS  16

typedef enum k3_attn_kind { K3_ATTN_KDA = 0, K3_ATTN_MLA = 1 } k3_attn_kind;
typedef enum k3_ffn_kind { K3_FFN_DENSE = 0, K3_FFN_MOE = 1 } k3_ffn_kind;

/* One decoder layer, 0-indexed. */
typedef struct k3_layer_plan {
    k3_attn_kind attn;
    k3_ffn_kind ffn;
    bool res_block_start; /* AttnRes: a new block starts here (l % attn_res_block_size == 0);
                             always false with plain residuals */
} k3_layer_plan;

typedef struct k3_model_config {
    bool wrapped; /* top-level model_type "kimi_k3" with text_config */
    int64_t vocab_size;
    int64_t hidden_size; /* d */
    int64_t num_hidden_layers;
    int64_t num_attention_heads; /* MLA query heads */
    int64_t num_key_value_heads;
    int64_t head_dim;          /* unused by the forward pass; kept for the writer */
    int64_t intermediate_size; /* dense FFN width */
    k3_act hidden_act;         /* K3_ACT_SITU or K3_ACT_SILU (gated: act(gate) * up) */
    double situ_beta;          /* activation_situ_beta (SiTU only; 0 otherwise) */
    double situ_linear_beta;   /* activation_situ_linear_beta (SiTU only; 0 otherwise) */
    double rms_norm_eps;
    int64_t max_position_embeddings;

    /* MLA */
    int64_t q_lora_rank; /* 0: no query down-projection, plain q_proj */
    int64_t kv_lora_rank;
    int64_t qk_nope_head_dim;
    int64_t qk_rope_head_dim;
    int64_t v_head_dim;
    bool mla_use_nope;        /* always true once parsed (false is rejected) */
    bool mla_use_output_gate; /* sigmoid g_proj gate before o_proj */

    /* KDA (linear_attn_config) */
    int64_t kda_num_heads;
    int64_t kda_head_dim;
    int64_t kda_conv_kernel;  /* short_conv_kernel_size */
    bool kda_full_rank_gate;  /* g_proj, else g_a_proj/g_b_proj */
    bool kda_has_lower_bound; /* decay = lb*sigmoid(exp(A_log)*(f+dt_bias)); else softplus form */
    double kda_gate_lower_bound; /* < 0 when present; 0 when absent */

    /* MoE */
    int64_t first_k_dense_replace;
    int64_t moe_layer_freq; /* layer l >= first_k_dense_replace is MoE iff l % freq == 0 */
    int64_t num_experts;
    int64_t num_experts_per_token;
    int64_t num_shared_experts;
    int64_t moe_intermediate_size;
    int64_t routed_expert_hidden_size; /* 0: experts at hidden_size (no latent MoE) */
    bool latent_moe_use_norm;
    k3_route_fn route_fn; /* K3_ROUTE_NOAUX_TC: sigmoid + noaux_tc is all k3 accepts */
    bool moe_renormalize;
    double routed_scaling_factor; /* finite, > 0 */
    bool use_grouped_topk;
    int64_t num_expert_group; /* n_group: divides num_experts */
    int64_t topk_group;       /* 1..num_expert_group */

    int64_t attn_res_block_size; /* 0: plain pre-norm residuals */
    int64_t num_nextn_predict_layers;
    bool tie_word_embeddings;
    int64_t bos_token_id, eos_token_id, pad_token_id; /* in [0, vocab); pad -1: none */
    double initializer_range;
    bool use_cache;

    k3_layer_plan *layers;       /* [num_hidden_layers], owned */
    int64_t n_kda, n_mla, n_moe; /* layer counts by kind */
} k3_model_config;

/* Parses a config.json already read as JSON (root: the whole file). what names the source
 * in messages, e.g. "DIR/config.json". On failure *mc is left freed (safe to free again). */
int k3_model_config_parse(k3_model_config *mc, const cJSON *root, const char *what, k3_error *err);
/* Reads and parses a config.json file (capped at a few MiB). */
int k3_model_config_load(k3_model_config *mc, const char *path, k3_error *err);
void k3_model_config_free(k3_model_config *mc);

/* Re-checks an in-memory config (bounds, layer plan consistency). make-tiny fills the
 * struct by hand and calls this before writing; parse calls it too. Rebuilds nothing:
 * mc->layers must already be consistent with the fields. */
int k3_model_config_validate(const k3_model_config *mc, const char *what, k3_error *err);
/* Fills mc->layers (allocating it) from the fields and the two 1-indexed layer lists;
 * for callers building a config by hand: kda_1idx/mla_1idx as config.json writes them. */
int k3_model_config_set_layers(k3_model_config *mc, const int64_t *kda_1idx, int64_t n_kda,
                               const int64_t *mla_1idx, int64_t n_mla, const char *what,
                               k3_error *err);

/* Serializes to a config.json tree (wrapped: the kimi_k3 wrapper with text_config, as the
 * published K3; else a bare kimi_linear config). Parsing the result gives an equal struct.
 * quantization_config is not written here (the caller adds the quant_config writer's). */
int k3_model_config_to_json(const k3_model_config *mc, cJSON **out, k3_error *err);
int k3_model_config_write(const k3_model_config *mc, const cJSON *quantization_config,
                          const char *path, k3_error *err);

/* Names for messages and inspect. */
const char *k3_attn_kind_name(k3_attn_kind k);
const char *k3_ffn_kind_name(k3_ffn_kind k);

#endif
