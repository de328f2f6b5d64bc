/* The tensor plan; see plan.h. Names and shapes follow k3-architecture.md §8 (K3) and the
 * Kimi-Linear layout of checkpoint-formats.md §7.2 (q_proj without q_lora, g_a/g_b gates). */
#include "load/plan.h"

#include "moe/activation.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F32 (1u << K3_DTYPE_F32)
#define BF16 (1u << K3_DTYPE_BF16)
#define F16 (1u << K3_DTYPE_F16)
#define FLOATS (F32 | BF16 | F16)

k3_act k3_plan_expert_act(const k3_model_config *mc) {
    return mc->hidden_act == K3_ACT_SILU ? K3_ACT_SWIGLU : mc->hidden_act;
}

int64_t k3_plan_a_log_len(int64_t heads) { return (heads + 127) / 128 * 128; }

void k3_plan_free(k3_plan *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n; i++) free(p->e[i].name);
    free(p->e);
    free(p->prefix);
    memset(p, 0, sizeof *p);
}

static int add(k3_plan *p, k3_error *err, bool linear, k3_role role, int layer, int expert,
               int proj, unsigned dtypes, int rank, const int64_t *shape, const char *fmt, ...)
    K3_PRINTF(11, 12);

static int add(k3_plan *p, k3_error *err, bool linear, k3_role role, int layer, int expert,
               int proj, unsigned dtypes, int rank, const int64_t *shape, const char *fmt, ...) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        k3_pentry *e = realloc(p->e, cap * sizeof *e);
        if (!e) return k3_fail(err, K3_ERR_NOMEM, "tensor plan: out of memory");
        p->e = e, p->cap = cap;
    }
    char name[512];
    int n = snprintf(name, sizeof name, "%s", p->prefix);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name + n, sizeof name - (size_t)n, fmt, ap);
    va_end(ap);
    k3_pentry *e = &p->e[p->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) return k3_fail(err, K3_ERR_NOMEM, "tensor plan: out of memory");
    e->linear = linear, e->role = role, e->layer = layer, e->expert = expert, e->proj = proj;
    e->dtypes = dtypes, e->rank = rank;
    for (int i = 0; i < rank; i++) e->shape[i] = shape[i];
    p->n++;
    return K3_OK;
}

#define LIN(role, layer, rows, cols, ...)                                                       \
    do {                                                                                       \
        int64_t s_[2] = {(rows), (cols)};                                                      \
        if ((rc = add(p, err, true, role, layer, -1, 0, 0, 2, s_, __VA_ARGS__))) goto fail;    \
    } while (0)
#define VEC(role, layer, dt, rank, shp, ...)                                                   \
    do {                                                                                       \
        if ((rc = add(p, err, false, role, layer, -1, 0, dt, rank, shp, __VA_ARGS__))) goto fail; \
    } while (0)

int k3_plan_build(k3_plan *p, const k3_model_config *mc, const char *prefix, k3_error *err) {
    memset(p, 0, sizeof *p);
    int rc = K3_OK;
    if (!(p->prefix = strdup(prefix ? prefix : "")))
        return k3_fail(err, K3_ERR_NOMEM, "tensor plan: out of memory");
    const int64_t H = mc->hidden_size, V = mc->vocab_size;
    const int64_t h1[1] = {H}, row[2] = {1, H};
    p->a_log_len = k3_plan_a_log_len(mc->kda_num_heads);

    LIN(K3_R_EMBED, -1, V, H, "model.embed_tokens");
    for (int l = 0; l < (int)mc->num_hidden_layers; l++) {
        const k3_layer_plan *lp = &mc->layers[l];
        const char *L = "model.layers";
        VEC(K3_R_IN_NORM, l, FLOATS, 1, h1, "%s.%d.input_layernorm.weight", L, l);
        VEC(K3_R_POST_NORM, l, FLOATS, 1, h1, "%s.%d.post_attention_layernorm.weight", L, l);
        if (mc->attn_res_block_size > 0) {
            VEC(K3_R_ATTN_RES_NORM, l, FLOATS, 1, h1, "%s.%d.self_attention_res_norm.weight", L, l);
            VEC(K3_R_ATTN_RES_PROJ, l, FLOATS, 2, row, "%s.%d.self_attention_res_proj.weight", L, l);
            VEC(K3_R_MLP_RES_NORM, l, FLOATS, 1, h1, "%s.%d.mlp_res_norm.weight", L, l);
            VEC(K3_R_MLP_RES_PROJ, l, FLOATS, 2, row, "%s.%d.mlp_res_proj.weight", L, l);
        }
        if (lp->attn == K3_ATTN_KDA) {
            const int64_t nh = mc->kda_num_heads, hd = mc->kda_head_dim, HD = nh * hd;
            const char *A = "self_attn";
            LIN(K3_R_ATTN_PROJ, l, HD, H, "%s.%d.%s.q_proj", L, l, A);
            LIN(K3_R_ATTN_PROJ, l, HD, H, "%s.%d.%s.k_proj", L, l, A);
            LIN(K3_R_ATTN_PROJ, l, HD, H, "%s.%d.%s.v_proj", L, l, A);
            int64_t conv[3] = {HD, 1, mc->kda_conv_kernel};
            VEC(K3_R_KDA_CONV, l, FLOATS, 3, conv, "%s.%d.%s.q_conv1d.weight", L, l, A);
            VEC(K3_R_KDA_CONV, l, FLOATS, 3, conv, "%s.%d.%s.k_conv1d.weight", L, l, A);
            VEC(K3_R_KDA_CONV, l, FLOATS, 3, conv, "%s.%d.%s.v_conv1d.weight", L, l, A);
            /* A_log: K3 (the kimi_k3 wrapper) stores [heads padded to 128] with a zero tail,
             * Kimi-Linear [1,1,H,1]; the loader accepts either form for either model. */
            int64_t al[4] = {p->a_log_len}, al4[4] = {1, 1, nh, 1};
            if (mc->wrapped) VEC(K3_R_KDA_A_LOG, l, FLOATS, 1, al, "%s.%d.%s.A_log", L, l, A);
            else VEC(K3_R_KDA_A_LOG, l, FLOATS, 4, al4, "%s.%d.%s.A_log", L, l, A);
            int64_t hd1[1] = {HD};
            VEC(K3_R_KDA_DT_BIAS, l, FLOATS, 1, hd1, "%s.%d.%s.dt_bias", L, l, A);
            LIN(K3_R_ATTN_PROJ, l, hd, H, "%s.%d.%s.f_a_proj", L, l, A);
            LIN(K3_R_ATTN_PROJ, l, HD, hd, "%s.%d.%s.f_b_proj", L, l, A);
            LIN(K3_R_ATTN_PROJ, l, nh, H, "%s.%d.%s.b_proj", L, l, A);
            int64_t on[1] = {hd};
            VEC(K3_R_ATTN_NORM, l, FLOATS, 1, on, "%s.%d.%s.o_norm.weight", L, l, A);
            if (mc->kda_full_rank_gate) {
                LIN(K3_R_ATTN_PROJ, l, HD, H, "%s.%d.%s.g_proj", L, l, A);
            } else {
                LIN(K3_R_ATTN_PROJ, l, hd, H, "%s.%d.%s.g_a_proj", L, l, A);
                LIN(K3_R_ATTN_PROJ, l, HD, hd, "%s.%d.%s.g_b_proj", L, l, A);
            }
            LIN(K3_R_ATTN_PROJ, l, H, HD, "%s.%d.%s.o_proj", L, l, A);
        } else {
            const int64_t nh = mc->num_attention_heads, qk = mc->qk_nope_head_dim + mc->qk_rope_head_dim;
            const char *A = "self_attn";
            if (mc->q_lora_rank > 0) {
                int64_t r1[1] = {mc->q_lora_rank};
                LIN(K3_R_ATTN_PROJ, l, mc->q_lora_rank, H, "%s.%d.%s.q_a_proj", L, l, A);
                VEC(K3_R_ATTN_NORM, l, FLOATS, 1, r1, "%s.%d.%s.q_a_layernorm.weight", L, l, A);
                LIN(K3_R_ATTN_PROJ, l, nh * qk, mc->q_lora_rank, "%s.%d.%s.q_b_proj", L, l, A);
            } else {
                LIN(K3_R_ATTN_PROJ, l, nh * qk, H, "%s.%d.%s.q_proj", L, l, A);
            }
            int64_t kv1[1] = {mc->kv_lora_rank};
            LIN(K3_R_ATTN_PROJ, l, mc->kv_lora_rank + mc->qk_rope_head_dim, H,
                "%s.%d.%s.kv_a_proj_with_mqa", L, l, A);
            VEC(K3_R_ATTN_NORM, l, FLOATS, 1, kv1, "%s.%d.%s.kv_a_layernorm.weight", L, l, A);
            LIN(K3_R_ATTN_PROJ, l, nh * (mc->qk_nope_head_dim + mc->v_head_dim), mc->kv_lora_rank,
                "%s.%d.%s.kv_b_proj", L, l, A);
            if (mc->mla_use_output_gate)
                LIN(K3_R_ATTN_PROJ, l, nh * mc->v_head_dim, H, "%s.%d.%s.g_proj", L, l, A);
            LIN(K3_R_ATTN_PROJ, l, H, nh * mc->v_head_dim, "%s.%d.%s.o_proj", L, l, A);
        }
        if (lp->ffn == K3_FFN_DENSE) {
            const int64_t I = mc->intermediate_size;
            LIN(K3_R_DENSE_GATE, l, I, H, "%s.%d.mlp.gate_proj", L, l);
            LIN(K3_R_DENSE_UP, l, I, H, "%s.%d.mlp.up_proj", L, l);
            LIN(K3_R_DENSE_DOWN, l, H, I, "%s.%d.mlp.down_proj", L, l);
            continue;
        }
        const int64_t E = mc->num_experts, I = mc->moe_intermediate_size;
        const int64_t Lw = mc->routed_expert_hidden_size > 0 ? mc->routed_expert_hidden_size : H;
        const char *M = "block_sparse_moe";
        LIN(K3_R_ROUTER, l, E, H, "%s.%d.%s.gate", L, l, M);
        int64_t e1[1] = {E};
        VEC(K3_R_ROUTER_BIAS, l, FLOATS, 1, e1, "%s.%d.%s.gate.e_score_correction_bias", L, l, M);
        if (mc->routed_expert_hidden_size > 0) {
            int64_t l1[1] = {Lw};
            LIN(K3_R_LATENT_DOWN, l, Lw, H, "%s.%d.%s.routed_expert_down_proj", L, l, M);
            if (mc->latent_moe_use_norm)
                VEC(K3_R_LATENT_NORM, l, FLOATS, 1, l1, "%s.%d.%s.routed_expert_norm.weight", L, l, M);
            LIN(K3_R_LATENT_UP, l, H, Lw, "%s.%d.%s.routed_expert_up_proj", L, l, M);
        }
        if (mc->num_shared_experts > 0) {
            const int64_t S = mc->num_shared_experts * I;
            LIN(K3_R_SHARED_GATE, l, S, H, "%s.%d.%s.shared_experts.gate_proj", L, l, M);
            LIN(K3_R_SHARED_UP, l, S, H, "%s.%d.%s.shared_experts.up_proj", L, l, M);
            LIN(K3_R_SHARED_DOWN, l, H, S, "%s.%d.%s.shared_experts.down_proj", L, l, M);
        }
        const int n_proj = k3_act_is_gated(k3_plan_expert_act(mc)) ? 3 : 2; /* w3: gated only */
        for (int e = 0; e < (int)E; e++)
            for (int w = 1; w <= n_proj; w++) {
                int64_t s[2] = {w == 2 ? Lw : I, w == 2 ? I : Lw};
                if ((rc = add(p, err, true, K3_R_EXPERT, l, e, w, 0, 2, s, "%s.%d.%s.experts.%d.w%d",
                              L, l, M, e, w)))
                    goto fail;
            }
    }
    VEC(K3_R_FINAL_NORM, -1, FLOATS, 1, h1, "model.norm.weight");
    if (mc->attn_res_block_size > 0) {
        VEC(K3_R_OUT_RES_NORM, -1, FLOATS, 1, h1, "model.output_attn_res_norm.weight");
        VEC(K3_R_OUT_RES_PROJ, -1, FLOATS, 2, row, "model.output_attn_res_proj.weight");
    }
    if (!mc->tie_word_embeddings) LIN(K3_R_LM_HEAD, -1, V, H, "lm_head");
    return K3_OK;
fail:
    k3_plan_free(p);
    return rc;
}
