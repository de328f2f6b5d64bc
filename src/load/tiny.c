/* make-tiny presets and their declarations; see tiny.h. The K3 values come from
 * k3-architecture.md §1.2; the small presets keep K3's structure (layer 0 dense, MLA at every
 * fourth layer and at the last, SiTU, latent MoE with a norm, shared experts, noaux_tc
 * routing) at widths that satisfy the format constraints (in % 32 for MXFP4 everywhere). */
#include "load/tiny.h"
#include "base/threadpool.h"

#include <stdlib.h>
#include <string.h>

static const char *const fmt_names[K3_TINY_FORMAT_COUNT] = {"nvfp4", "nvfp4-ct", "mxfp4", "bf16"};
static const char *const preset_names[K3_TINY_PRESET_COUNT] = {"tiny", "small", "k3-layer"};

int k3_tiny_format_parse(const char *s, k3_tiny_format *out) {
    for (int i = 0; i < K3_TINY_FORMAT_COUNT; i++)
        if (s && !strcmp(s, fmt_names[i])) return *out = (k3_tiny_format)i, K3_OK;
    return K3_ERR_ARG;
}
int k3_tiny_preset_parse(const char *s, k3_tiny_preset *out) {
    for (int i = 0; i < K3_TINY_PRESET_COUNT; i++)
        if (s && !strcmp(s, preset_names[i])) return *out = (k3_tiny_preset)i, K3_OK;
    return K3_ERR_ARG;
}
const char *k3_tiny_format_name(k3_tiny_format f) {
    return f >= 0 && f < K3_TINY_FORMAT_COUNT ? fmt_names[f] : "invalid";
}
const char *k3_tiny_preset_name(k3_tiny_preset p) {
    return p >= 0 && p < K3_TINY_PRESET_COUNT ? preset_names[p] : "invalid";
}

typedef struct dims {
    int64_t vocab, hidden, layers, inter, heads, q_lora, kv_lora, nope, rope, v;
    int64_t kda_heads, kda_dim, experts, topk, shared, moe_inter, latent, res_block, first_dense;
} dims;

static const dims preset_dims[K3_TINY_PRESET_COUNT] = {
    /* tiny: 4 layers (KDA 1-3, MLA 4, 1-indexed), 16 experts top-4 */
    {1024, 256, 4, 512, 4, 64, 32, 32, 16, 32, 4, 32, 16, 4, 1, 64, 128, 2, 1},
    /* small: 6 layers (MLA 4 and 6), 32 experts top-4 */
    {1024, 1024, 6, 2048, 8, 256, 128, 64, 32, 64, 8, 64, 32, 4, 2, 192, 512, 4, 1},
    /* k3-layer: one K3 MoE layer (KDA attention) at full width; a small vocabulary keeps the
     * embedding out of the way of the expert bytes it exists to benchmark */
    {1024, 7168, 1, 33792, 96, 1536, 512, 128, 64, 128, 96, 128, 896, 16, 2, 3072, 3584, 1, 0},
};

int k3_tiny_config(k3_tiny_preset preset, k3_model_config *mc, k3_error *err) {
    if (preset < 0 || preset >= K3_TINY_PRESET_COUNT)
        return k3_fail(err, K3_ERR_ARG, "make-tiny: preset: unknown preset %d", (int)preset);
    const dims *d = &preset_dims[preset];
    memset(mc, 0, sizeof *mc);
    mc->wrapped = true;
    mc->vocab_size = d->vocab;
    mc->hidden_size = d->hidden;
    mc->num_hidden_layers = d->layers;
    mc->num_attention_heads = d->heads;
    mc->num_key_value_heads = d->heads;
    mc->head_dim = d->hidden / d->heads;
    mc->intermediate_size = d->inter;
    mc->hidden_act = K3_ACT_SITU;
    mc->situ_beta = 4.0;
    mc->situ_linear_beta = 25.0;
    mc->rms_norm_eps = 1e-5;
    mc->max_position_embeddings = 1048576;
    mc->q_lora_rank = d->q_lora;
    mc->kv_lora_rank = d->kv_lora;
    mc->qk_nope_head_dim = d->nope;
    mc->qk_rope_head_dim = d->rope;
    mc->v_head_dim = d->v;
    mc->mla_use_nope = true;
    mc->mla_use_output_gate = true;
    mc->kda_num_heads = d->kda_heads;
    mc->kda_head_dim = d->kda_dim;
    mc->kda_conv_kernel = 4;
    mc->kda_full_rank_gate = true;
    mc->kda_has_lower_bound = true;
    mc->kda_gate_lower_bound = -5.0;
    mc->first_k_dense_replace = d->first_dense;
    mc->moe_layer_freq = 1;
    mc->num_experts = d->experts;
    mc->num_experts_per_token = d->topk;
    mc->num_shared_experts = d->shared;
    mc->moe_intermediate_size = d->moe_inter;
    mc->routed_expert_hidden_size = d->latent;
    mc->latent_moe_use_norm = true;
    mc->route_fn = K3_ROUTE_NOAUX_TC;
    mc->moe_renormalize = true;
    mc->routed_scaling_factor = 1.0;
    mc->use_grouped_topk = true;
    mc->num_expert_group = 1;
    mc->topk_group = 1;
    mc->attn_res_block_size = d->res_block;
    mc->num_nextn_predict_layers = 0;
    mc->tie_word_embeddings = false;
    /* specials sit at the end of the vocabulary as in K3 (base + 0, + 2, + 255) */
    mc->bos_token_id = d->vocab - 256;
    mc->eos_token_id = d->vocab - 254;
    mc->pad_token_id = d->vocab - 1;
    mc->initializer_range = 0.02;
    mc->use_cache = true;
    /* K3's rule: MLA at 1-indexed layers divisible by 4, and at the last layer. */
    int64_t kda[K3_MAX_LAYERS], mla[K3_MAX_LAYERS], nk = 0, nm = 0;
    for (int64_t l = 1; l <= d->layers; l++) {
        if (l % 4 == 0 || (l == d->layers && d->layers > 1)) mla[nm++] = l;
        else kda[nk++] = l;
    }
    int rc = k3_model_config_set_layers(mc, kda, nk, mla, nm, "make-tiny config", err);
    if (rc) return rc;
    rc = k3_model_config_validate(mc, "make-tiny config", err);
    if (rc) k3_model_config_free(mc);
    return rc;
}

int k3_tiny_quant(k3_tiny_format fmt, const k3_model_config *mc, k3_quant_config *qc,
                  k3_error *err) {
    k3_quant_config_init(qc);
    /* The ignore list of the original moonshotai/Kimi-K3 exactly (k3-architecture.md §1.2,
     * quantization row). It does not list the router, the latent projections or the
     * embedding, which the checkpoint still stores BF16: only the routed experts are packed,
     * and the writer (k3_tiny_run, tiny_write.c) keeps the rest plain, as the loader must
     * cope with. */
    static const char *const k3_mx_ignore[] = {
        "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
        "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"};
    /* A community compressed-tensors NVFP4 export (checkpoint-formats.md §4.2, as
     * Firworks/Kimi-Linear-48B-A3B-Instruct-nvfp4): targets Linear, ignore lm_head only, so
     * every projection (attention included) is NVFP4; the router is not an nn.Linear. */
    static const char *const ct_nv_ignore[] = {"lm_head"};
    switch (fmt) {
    case K3_TINY_NVFP4:
        return k3_quant_plan_modelopt(qc, mc, mc->wrapped ? "language_model." : "",
                                      K3_QPLAN_EXPERTS_NVFP4 | K3_QPLAN_ATTN_FP8 |
                                          K3_QPLAN_ALL_PREFIXES,
                                      err);
    case K3_TINY_NVFP4_CT:
        return k3_quant_plan_ct(qc, K3_QS_NVFP4_CT, ct_nv_ignore, 1, err);
    case K3_TINY_MXFP4:
        return k3_quant_plan_ct(qc, K3_QS_MXFP4, k3_mx_ignore,
                                sizeof k3_mx_ignore / sizeof *k3_mx_ignore, err);
    case K3_TINY_BF16:
        return K3_OK;
    default:
        return k3_fail(err, K3_ERR_ARG, "make-tiny: format: unknown format %d", (int)fmt);
    }
}

int k3_make_tiny_checkpoint(const k3_make_tiny_opts *o, k3_error *err) {
    if (!o) return k3_fail(err, K3_ERR_ARG, "make-tiny: options: missing");
    int trc = k3_threads_check("make-tiny", o->n_threads, err);
    if (trc) return trc;
    k3_tiny_opts t = {.dir = o->dir, .seed = o->seed, .n_threads = o->n_threads,
                      .progress = o->progress != 0};
    if (k3_tiny_format_parse(o->format ? o->format : "nvfp4", &t.format))
        return k3_fail(err, K3_ERR_ARG, "make-tiny: --format: expected nvfp4|nvfp4-ct|mxfp4|bf16, "
                       "found '%s'", o->format);
    if (k3_tiny_preset_parse(o->preset ? o->preset : "tiny", &t.preset))
        return k3_fail(err, K3_ERR_ARG, "make-tiny: --preset: expected tiny|small|k3-layer, found "
                       "'%s'", o->preset);
    return k3_make_tiny(&t, err);
}
