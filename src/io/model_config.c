/* config.json -> k3_model_config, and back (make-tiny). One table of scalar fields drives
 * the parser, the validator and the writer, so a field cannot be read one way and written
 * another; the few fields with structure (layer lists, activation, router, nullable
 * sentinels) are handled beside the table. */
#include "io/model_config.h"

#include "io/json.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_MAX_BYTES (8u << 20)

enum { F_REQ = 1, F_NULLABLE = 2, F_LINEAR = 4, F_TOKEN = 8 };

/* Integer fields. F_NULLABLE: null/absent stores `def` (a sentinel outside [lo, hi]) and the
 * writer emits null. F_LINEAR: inside linear_attn_config. F_TOKEN: may fall back to the
 * wrapper's top level. */
typedef struct int_field {
    const char *key;
    size_t off;
    int64_t lo, hi, def;
    unsigned flags;
} int_field;

#define OFF(f) offsetof(k3_model_config, f)
static const int_field int_fields[] = {
    {"vocab_size", OFF(vocab_size), 1, K3_MAX_VOCAB, 0, F_REQ},
    {"hidden_size", OFF(hidden_size), 1, K3_MAX_HIDDEN, 0, F_REQ},
    {"intermediate_size", OFF(intermediate_size), 1, K3_MAX_INTER, 0, F_REQ},
    {"num_hidden_layers", OFF(num_hidden_layers), 1, K3_MAX_LAYERS, 0, F_REQ},
    {"num_attention_heads", OFF(num_attention_heads), 1, K3_MAX_HEADS, 0, F_REQ},
    {"num_key_value_heads", OFF(num_key_value_heads), 1, K3_MAX_HEADS, -1, 0},
    {"head_dim", OFF(head_dim), 1, K3_MAX_HIDDEN, -1, 0},
    {"max_position_embeddings", OFF(max_position_embeddings), 1, K3_MAX_POSITIONS, 4096, 0},
    {"q_lora_rank", OFF(q_lora_rank), 1, K3_MAX_LORA_RANK, 0, F_NULLABLE},
    {"kv_lora_rank", OFF(kv_lora_rank), 1, K3_MAX_LORA_RANK, 0, F_REQ},
    {"qk_nope_head_dim", OFF(qk_nope_head_dim), 1, K3_MAX_HEAD_DIM, 0, F_REQ},
    {"qk_rope_head_dim", OFF(qk_rope_head_dim), 0, K3_MAX_HEAD_DIM, 0, F_REQ},
    {"v_head_dim", OFF(v_head_dim), 1, K3_MAX_HEAD_DIM, 0, F_REQ},
    {"first_k_dense_replace", OFF(first_k_dense_replace), 0, K3_MAX_LAYERS, 0, 0},
    {"moe_layer_freq", OFF(moe_layer_freq), 1, K3_MAX_LAYERS, 1, 0},
    {"num_experts", OFF(num_experts), 1, K3_MAX_EXPERTS, 0, F_REQ},
    {"num_experts_per_token", OFF(num_experts_per_token), 1, K3_MAX_TOPK, 0, F_REQ},
    {"num_shared_experts", OFF(num_shared_experts), 0, K3_MAX_SHARED, 0, 0},
    {"moe_intermediate_size", OFF(moe_intermediate_size), 1, K3_MAX_INTER, 0, F_REQ},
    {"routed_expert_hidden_size", OFF(routed_expert_hidden_size), 1, K3_MAX_HIDDEN, 0, F_NULLABLE},
    {"num_expert_group", OFF(num_expert_group), 1, K3_MAX_EXPERTS, 1, 0},
    {"topk_group", OFF(topk_group), 1, K3_MAX_EXPERTS, 1, 0},
    {"attn_res_block_size", OFF(attn_res_block_size), 1, K3_MAX_LAYERS, 0, F_NULLABLE},
    {"num_nextn_predict_layers", OFF(num_nextn_predict_layers), 0, K3_MAX_MTP_LAYERS, 0, 0},
    {"bos_token_id", OFF(bos_token_id), 0, K3_MAX_VOCAB - 1, 1, F_TOKEN},
    {"eos_token_id", OFF(eos_token_id), 0, K3_MAX_VOCAB - 1, 2, F_TOKEN},
    {"pad_token_id", OFF(pad_token_id), 0, K3_MAX_VOCAB - 1, -1, F_TOKEN | F_NULLABLE},
    {"num_heads", OFF(kda_num_heads), 1, K3_MAX_HEADS, 0, F_REQ | F_LINEAR},
    {"head_dim", OFF(kda_head_dim), 1, K3_MAX_HEAD_DIM, 0, F_REQ | F_LINEAR},
    {"short_conv_kernel_size", OFF(kda_conv_kernel), 1, K3_MAX_CONV_KERNEL, 0, F_REQ | F_LINEAR},
};

typedef struct bool_field {
    const char *key;
    size_t off;
    bool def;
    unsigned flags;
} bool_field;

static const bool_field bool_fields[] = {
    {"mla_use_nope", OFF(mla_use_nope), false, 0},
    {"mla_use_output_gate", OFF(mla_use_output_gate), false, 0},
    {"moe_renormalize", OFF(moe_renormalize), true, 0},
    {"use_grouped_topk", OFF(use_grouped_topk), true, 0},
    {"latent_moe_use_norm", OFF(latent_moe_use_norm), false, 0},
    {"tie_word_embeddings", OFF(tie_word_embeddings), false, F_TOKEN},
    {"use_cache", OFF(use_cache), true, 0},
    {"use_full_rank_gate", OFF(kda_full_rank_gate), false, F_LINEAR},
};

/* Doubles: finite, in (lo, hi] when lo_open, else [lo, hi]. */
typedef struct dbl_field {
    const char *key;
    size_t off;
    double lo, hi, def;
    bool lo_open;
} dbl_field;

static const dbl_field dbl_fields[] = {
    {"rms_norm_eps", OFF(rms_norm_eps), 0.0, 1.0, 1e-6, true},
    {"routed_scaling_factor", OFF(routed_scaling_factor), 0.0, 1e6, 1.0, true},
    {"initializer_range", OFF(initializer_range), 0.0, 1e6, 0.02, false},
};
#undef OFF

#define N_OF(a)            (sizeof(a) / sizeof((a)[0]))
#define FIELD(mc, T, off)  (*(T *)((char *)(mc) + (off)))
#define CFIELD(mc, T, off) (*(const T *)((const char *)(mc) + (off)))

/* Where a field lives, for messages: "FILE: text_config.linear_attn_config.KEY". */
typedef struct src {
    const char *file;
    const char *pfx;  /* "text_config." or "" */
    const cJSON *obj; /* the text config object */
    const cJSON *top; /* the wrapper's top level, or NULL */
    const cJSON *lin; /* linear_attn_config */
} src;

static const char *json_kind(const cJSON *it) {
    if (cJSON_IsString(it))
        return "a string";
    if (cJSON_IsBool(it))
        return "a boolean";
    if (cJSON_IsArray(it))
        return "an array";
    if (cJSON_IsObject(it))
        return "an object";
    if (cJSON_IsNull(it))
        return "null";
    return "a number";
}

static const cJSON *item(const cJSON *obj, const char *key) {
    return cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
}

static const char *lin_pfx(unsigned flags) {
    return (flags & F_LINEAR) ? "linear_attn_config." : "";
}

static int read_int(const src *s, const int_field *f, int64_t *out, k3_error *err) {
    const cJSON *obj = (f->flags & F_LINEAR) ? s->lin : s->obj;
    const cJSON *it = item(obj, f->key);
    if ((!it || cJSON_IsNull(it)) && (f->flags & F_TOKEN) && s->top)
        it = item(s->top, f->key);
    if (!it || cJSON_IsNull(it)) {
        if (f->flags & F_REQ)
            return k3_fail(err, K3_ERR_MISSING, "%s: %s%s%s: missing", s->file, s->pfx,
                           lin_pfx(f->flags), f->key);
        *out = f->def;
        return K3_OK;
    }
    double v = cJSON_IsNumber(it) ? it->valuedouble : NAN;
    if (!isfinite(v) || v != floor(v) || v < (double)f->lo || v > (double)f->hi) {
        if (cJSON_IsNumber(it))
            return k3_fail(
                err, K3_ERR_FORMAT, "%s: %s%s%s: expected an integer in [%lld, %lld], found %.17g",
                s->file, s->pfx, lin_pfx(f->flags), f->key, (long long)f->lo, (long long)f->hi, v);
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: %s%s%s: expected an integer in [%lld, %lld], found %s", s->file, s->pfx,
                       lin_pfx(f->flags), f->key, (long long)f->lo, (long long)f->hi,
                       json_kind(it));
    }
    *out = (int64_t)v;
    return K3_OK;
}

static int read_bool(const src *s, const char *key, unsigned flags, bool def, bool *out,
                     k3_error *err) {
    const cJSON *it = item((flags & F_LINEAR) ? s->lin : s->obj, key);
    if ((!it || cJSON_IsNull(it)) && (flags & F_TOKEN) && s->top)
        it = item(s->top, key);
    if (!it || cJSON_IsNull(it)) {
        *out = def;
        return K3_OK;
    }
    if (!cJSON_IsBool(it))
        return k3_fail(err, K3_ERR_FORMAT, "%s: %s%s%s: expected true or false, found %s", s->file,
                       s->pfx, lin_pfx(flags), key, json_kind(it));
    *out = cJSON_IsTrue(it);
    return K3_OK;
}

/* A number that must be present (required) or may default; NaN can reach here only from a
 * hand-built struct (JSON has no NaN), but the validator shares the check. */
static int read_dbl(const src *s, const char *key, unsigned flags, bool required, double def,
                    bool *present, double *out, k3_error *err) {
    const cJSON *it = item((flags & F_LINEAR) ? s->lin : s->obj, key);
    if (present)
        *present = it && !cJSON_IsNull(it);
    if (!it || cJSON_IsNull(it)) {
        if (required)
            return k3_fail(err, K3_ERR_MISSING, "%s: %s%s%s: missing", s->file, s->pfx,
                           lin_pfx(flags), key);
        *out = def;
        return K3_OK;
    }
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return k3_fail(err, K3_ERR_FORMAT, "%s: %s%s%s: expected a finite number, found %s",
                       s->file, s->pfx, lin_pfx(flags), key, json_kind(it));
    *out = it->valuedouble;
    return K3_OK;
}

static int read_str(const src *s, const char *key, const char *def, const char **out,
                    k3_error *err) {
    const cJSON *it = item(s->obj, key);
    if (!it || cJSON_IsNull(it)) {
        if (!def)
            return k3_fail(err, K3_ERR_MISSING, "%s: %s%s: missing", s->file, s->pfx, key);
        *out = def;
        return K3_OK;
    }
    if (!cJSON_IsString(it))
        return k3_fail(err, K3_ERR_FORMAT, "%s: %s%s: expected a string, found %s", s->file, s->pfx,
                       key, json_kind(it));
    *out = it->valuestring;
    return K3_OK;
}

/* A 1-indexed layer list; values are range-checked later against num_hidden_layers. */
static int read_layer_list(const src *s, const char *key, int64_t **out, int64_t *n,
                           k3_error *err) {
    const cJSON *it = item(s->lin, key);
    *out = NULL;
    *n = 0;
    if (!it || cJSON_IsNull(it))
        return k3_fail(err, K3_ERR_MISSING, "%s: %slinear_attn_config.%s: missing", s->file, s->pfx,
                       key);
    if (!cJSON_IsArray(it))
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: %slinear_attn_config.%s: expected an array, found %s", s->file, s->pfx,
                       key, json_kind(it));
    int len = cJSON_GetArraySize(it);
    if (len > K3_MAX_LAYERS)
        return k3_fail(err, K3_ERR_LIMIT, "%s: %slinear_attn_config.%s: %d entries, more than %d",
                       s->file, s->pfx, key, len, K3_MAX_LAYERS);
    int64_t *v = malloc((size_t)(len ? len : 1) * sizeof *v);
    if (!v)
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", s->file);
    int i = 0;
    for (const cJSON *e = it->child; e; e = e->next, i++) {
        double d = cJSON_IsNumber(e) ? e->valuedouble : NAN;
        if (!isfinite(d) || d != floor(d) || d < 1 || d > K3_MAX_LAYERS) {
            free(v);
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: %slinear_attn_config.%s[%d]: expected a 1-indexed layer number",
                           s->file, s->pfx, key, i);
        }
        v[i] = (int64_t)d;
    }
    *out = v;
    *n = len;
    return K3_OK;
}

const char *k3_attn_kind_name(k3_attn_kind k) {
    return k == K3_ATTN_KDA ? "KDA" : k == K3_ATTN_MLA ? "MLA" : "?";
}
const char *k3_ffn_kind_name(k3_ffn_kind k) {
    return k == K3_FFN_DENSE ? "dense" : k == K3_FFN_MOE ? "MoE" : "?";
}

void k3_model_config_free(k3_model_config *mc) {
    if (!mc)
        return;
    free(mc->layers);
    mc->layers = NULL;
}

int k3_model_config_set_layers(k3_model_config *mc, const int64_t *kda_1idx, int64_t n_kda,
                               const int64_t *mla_1idx, int64_t n_mla, const char *what,
                               k3_error *err) {
    int64_t L = mc->num_hidden_layers;
    if (L < 1 || L > K3_MAX_LAYERS)
        return k3_fail(err, K3_ERR_FORMAT, "%s: num_hidden_layers: expected [1, %d], found %lld",
                       what, K3_MAX_LAYERS, (long long)L);
    /* seen[l]: 1 = KDA, 2 = MLA */
    unsigned char *seen = calloc((size_t)L, 1);
    k3_layer_plan *lp = calloc((size_t)L, sizeof *lp);
    if (!seen || !lp) {
        free(seen), free(lp);
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", what);
    }
    int rc = K3_OK;
    for (int pass = 0; pass < 2 && !rc; pass++) {
        const int64_t *v = pass ? mla_1idx : kda_1idx;
        int64_t n = pass ? n_mla : n_kda;
        const char *name = pass ? "full_attn_layers" : "kda_layers";
        for (int64_t i = 0; i < n && !rc; i++) {
            if (v[i] < 1 || v[i] > L)
                rc = k3_fail(err, K3_ERR_FORMAT,
                             "%s: linear_attn_config.%s[%lld]: layer %lld outside 1..%lld "
                             "(1-indexed)",
                             what, name, (long long)i, (long long)v[i], (long long)L);
            else if (seen[v[i] - 1] == pass + 1)
                rc = k3_fail(err, K3_ERR_DUPLICATE,
                             "%s: linear_attn_config.%s: layer %lld listed twice", what, name,
                             (long long)v[i]);
            else if (seen[v[i] - 1])
                rc = k3_fail(err, K3_ERR_FORMAT,
                             "%s: linear_attn_config: layer %lld (1-indexed) is in both kda_layers "
                             "and full_attn_layers",
                             what, (long long)v[i]);
            else
                seen[v[i] - 1] = (unsigned char)(pass + 1);
        }
    }
    for (int64_t l = 0; l < L && !rc; l++)
        if (!seen[l])
            rc = k3_fail(err, K3_ERR_MISSING,
                         "%s: linear_attn_config: layer %lld (1-indexed) is in neither kda_layers "
                         "nor full_attn_layers",
                         what, (long long)(l + 1));
    if (rc) {
        free(seen), free(lp);
        return rc;
    }
    mc->n_kda = mc->n_mla = mc->n_moe = 0;
    for (int64_t l = 0; l < L; l++) {
        lp[l].attn = seen[l] == 2 ? K3_ATTN_MLA : K3_ATTN_KDA;
        /* the reference decoder layer: MoE iff past the dense prefix and on the frequency */
        lp[l].ffn = (l >= mc->first_k_dense_replace && mc->moe_layer_freq > 0 &&
                     l % mc->moe_layer_freq == 0)
                        ? K3_FFN_MOE
                        : K3_FFN_DENSE;
        lp[l].res_block_start = mc->attn_res_block_size > 0 && l % mc->attn_res_block_size == 0;
        mc->n_kda += lp[l].attn == K3_ATTN_KDA;
        mc->n_mla += lp[l].attn == K3_ATTN_MLA;
        mc->n_moe += lp[l].ffn == K3_FFN_MOE;
    }
    free(seen);
    free(mc->layers);
    mc->layers = lp;
    return K3_OK;
}

static int bad_range(k3_error *err, const char *what, const char *pfx, const char *sub,
                     const char *key, const char *expect, double found) {
    return k3_fail(err, K3_ERR_FORMAT, "%s: %s%s%s: expected %s, found %.17g", what, pfx, sub, key,
                   expect, found);
}

static int validate(const k3_model_config *mc, const char *what, const char *pfx, k3_error *err) {
    for (size_t i = 0; i < N_OF(int_fields); i++) {
        const int_field *f = &int_fields[i];
        int64_t v = CFIELD(mc, int64_t, f->off);
        if ((f->flags & F_NULLABLE) && v == f->def)
            continue;
        if (v < f->lo || v > f->hi)
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: %s%s%s: expected an integer in [%lld, %lld], found %lld", what, pfx,
                           lin_pfx(f->flags), f->key, (long long)f->lo, (long long)f->hi,
                           (long long)v);
    }
    for (size_t i = 0; i < N_OF(dbl_fields); i++) {
        const dbl_field *f = &dbl_fields[i];
        double v = CFIELD(mc, double, f->off);
        if (!(isfinite(v) && (f->lo_open ? v > f->lo : v >= f->lo) && v <= f->hi)) {
            char expect[96];
            snprintf(expect, sizeof expect, "a finite number in %s%g, %g]", f->lo_open ? "(" : "[",
                     f->lo, f->hi);
            return bad_range(err, what, pfx, "", f->key, expect, v);
        }
    }
    if (mc->hidden_act == K3_ACT_SITU) {
        if (!(isfinite(mc->situ_beta) && mc->situ_beta > 0))
            return bad_range(err, what, pfx, "", "activation_situ_beta", "a finite number > 0",
                             mc->situ_beta);
        if (!(isfinite(mc->situ_linear_beta) && mc->situ_linear_beta > 0))
            return bad_range(err, what, pfx, "", "activation_situ_linear_beta",
                             "a finite number > 0", mc->situ_linear_beta);
    } else if (mc->hidden_act != K3_ACT_SILU) {
        return k3_fail(err, K3_ERR_UNSUPPORTED, "%s: %shidden_act: expected \"situ\" or \"silu\"",
                       what, pfx);
    }
    if (mc->kda_has_lower_bound &&
        !(isfinite(mc->kda_gate_lower_bound) && mc->kda_gate_lower_bound < 0))
        return bad_range(err, what, pfx, "linear_attn_config.", "gate_lower_bound",
                         "a finite number < 0", mc->kda_gate_lower_bound);
    if (!mc->mla_use_nope)
        return k3_fail(
            err, K3_ERR_UNSUPPORTED,
            "%s: %smla_use_nope: false (rotary MLA) is not implemented; k3 runs NoPE MLA", what,
            pfx);
    if (mc->route_fn != K3_ROUTE_NOAUX_TC)
        return k3_fail(err, K3_ERR_UNSUPPORTED,
                       "%s: %stopk_method: only sigmoid + noaux_tc routing is supported", what,
                       pfx);
    /* moe.md §6: the K3 gate raises on anything but sigmoid scoring with renormalized top-k
     * weights; k3 follows it rather than run a routing no released checkpoint uses */
    if (!mc->moe_renormalize)
        return k3_fail(err, K3_ERR_UNSUPPORTED,
                       "%s: %smoe_renormalize: false is not supported; the Kimi K3 gate requires "
                       "sigmoid scoring with renormalized top-k weights (true)",
                       what, pfx);
    if (mc->num_nextn_predict_layers != 0)
        return k3_fail(err, K3_ERR_UNSUPPORTED,
                       "%s: %snum_nextn_predict_layers: %lld is not supported; Kimi K3 has no MTP "
                       "layers (0) and k3 loads no draft-head tensors",
                       what, pfx, (long long)mc->num_nextn_predict_layers);
    if (mc->num_experts_per_token > mc->num_experts)
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: %snum_experts_per_token: %lld is more than num_experts %lld", what, pfx,
                       (long long)mc->num_experts_per_token, (long long)mc->num_experts);
    if (mc->use_grouped_topk) {
        int64_t g = mc->num_expert_group;
        if (mc->num_experts % g)
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: %snum_expert_group: %lld does not divide num_experts %lld", what,
                           pfx, (long long)g, (long long)mc->num_experts);
        if (mc->topk_group > g)
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: %stopk_group: %lld is more than num_expert_group %lld", what, pfx,
                           (long long)mc->topk_group, (long long)g);
        if (mc->num_experts_per_token > mc->topk_group * (mc->num_experts / g))
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: %snum_experts_per_token: %lld is more than the %lld experts of "
                           "topk_group %lld groups",
                           what, pfx, (long long)mc->num_experts_per_token,
                           (long long)(mc->topk_group * (mc->num_experts / g)),
                           (long long)mc->topk_group);
    }
    if (mc->latent_moe_use_norm && mc->routed_expert_hidden_size == 0)
        return k3_fail(
            err, K3_ERR_FORMAT,
            "%s: %slatent_moe_use_norm: true needs routed_expert_hidden_size (latent MoE)", what,
            pfx);
    if (mc->first_k_dense_replace > mc->num_hidden_layers)
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: %sfirst_k_dense_replace: %lld is more than num_hidden_layers %lld",
                       what, pfx, (long long)mc->first_k_dense_replace,
                       (long long)mc->num_hidden_layers);
    if (mc->attn_res_block_size > mc->num_hidden_layers)
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: %sattn_res_block_size: %lld is more than num_hidden_layers %lld", what,
                       pfx, (long long)mc->attn_res_block_size, (long long)mc->num_hidden_layers);
    const char *tok[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    int64_t tv[3] = {mc->bos_token_id, mc->eos_token_id, mc->pad_token_id};
    for (int i = 0; i < 3; i++)
        if (tv[i] >= mc->vocab_size)
            return k3_fail(err, K3_ERR_FORMAT, "%s: %s%s: %lld is outside the vocabulary (%lld)",
                           what, pfx, tok[i], (long long)tv[i], (long long)mc->vocab_size);
    if (!mc->layers)
        return k3_fail(err, K3_ERR_MISSING, "%s: the per-layer plan is missing", what);
    int64_t nk = 0, nm = 0, ne = 0;
    for (int64_t l = 0; l < mc->num_hidden_layers; l++) {
        const k3_layer_plan *p = &mc->layers[l];
        bool moe = l >= mc->first_k_dense_replace && l % mc->moe_layer_freq == 0;
        bool start = mc->attn_res_block_size > 0 && l % mc->attn_res_block_size == 0;
        if ((p->attn != K3_ATTN_KDA && p->attn != K3_ATTN_MLA) ||
            p->ffn != (moe ? K3_FFN_MOE : K3_FFN_DENSE) || p->res_block_start != start)
            return k3_fail(err, K3_ERR_INTERNAL, "%s: layer %lld: plan disagrees with the fields",
                           what, (long long)l);
        nk += p->attn == K3_ATTN_KDA, nm += p->attn == K3_ATTN_MLA, ne += moe;
    }
    if (nk != mc->n_kda || nm != mc->n_mla || ne != mc->n_moe)
        return k3_fail(err, K3_ERR_INTERNAL, "%s: layer counts disagree with the plan", what);
    return K3_OK;
}

int k3_model_config_validate(const k3_model_config *mc, const char *what, k3_error *err) {
    return validate(mc, what, "", err);
}

/* Reads every field of the text config s->obj into mc (layers not yet set). */
static int parse_text(k3_model_config *mc, const src *s0, int64_t **kda, int64_t *nk, int64_t **mla,
                      int64_t *nm, k3_error *err) {
    src s = *s0;
    const cJSON *lin = item(s.obj, "linear_attn_config");
    if (!lin || cJSON_IsNull(lin))
        return k3_fail(err, K3_ERR_MISSING, "%s: %slinear_attn_config: missing", s.file, s.pfx);
    if (!cJSON_IsObject(lin))
        return k3_fail(err, K3_ERR_FORMAT, "%s: %slinear_attn_config: expected an object, found %s",
                       s.file, s.pfx, json_kind(lin));
    s.lin = lin;
    int rc;
    for (size_t i = 0; i < N_OF(int_fields); i++)
        if ((rc = read_int(&s, &int_fields[i], &FIELD(mc, int64_t, int_fields[i].off), err)))
            return rc;
    if (mc->num_key_value_heads < 0)
        mc->num_key_value_heads = mc->num_attention_heads;
    /* Kimi-Linear's file states its context as model_max_length only; the class default
     * (4096) would cap a 1M-context model without saying so */
    const cJSON *mml = item(s.obj, "model_max_length");
    if (!item(s.obj, "max_position_embeddings") && mml && !cJSON_IsNull(mml)) {
        int_field f = {"model_max_length",
                       offsetof(k3_model_config, max_position_embeddings),
                       1,
                       K3_MAX_POSITIONS,
                       0,
                       F_REQ};
        if ((rc = read_int(&s, &f, &mc->max_position_embeddings, err)))
            return rc;
    }
    if (mc->head_dim < 0)
        mc->head_dim = mc->hidden_size / mc->num_attention_heads;
    for (size_t i = 0; i < N_OF(bool_fields); i++)
        if ((rc = read_bool(&s, bool_fields[i].key, bool_fields[i].flags, bool_fields[i].def,
                            &FIELD(mc, bool, bool_fields[i].off), err)))
            return rc;
    for (size_t i = 0; i < N_OF(dbl_fields); i++)
        if ((rc = read_dbl(&s, dbl_fields[i].key, 0, false, dbl_fields[i].def, NULL,
                           &FIELD(mc, double, dbl_fields[i].off), err)))
            return rc;
    if ((rc = read_dbl(&s, "gate_lower_bound", F_LINEAR, false, 0.0, &mc->kda_has_lower_bound,
                       &mc->kda_gate_lower_bound, err)))
        return rc;

    const char *act = NULL, *router = NULL, *topk = NULL;
    if ((rc = read_str(&s, "hidden_act", "silu", &act, err)))
        return rc;
    if (!strcmp(act, "situ")) {
        mc->hidden_act = K3_ACT_SITU;
        if ((rc = read_dbl(&s, "activation_situ_beta", 0, true, 0, NULL, &mc->situ_beta, err)) ||
            (rc = read_dbl(&s, "activation_situ_linear_beta", 0, true, 0, NULL,
                           &mc->situ_linear_beta, err)))
            return rc;
    } else if (!strcmp(act, "silu")) {
        mc->hidden_act = K3_ACT_SILU; /* betas, if any, belong to no activation here */
    } else {
        return k3_fail(err, K3_ERR_UNSUPPORTED,
                       "%s: %shidden_act: \"%s\" is not supported (expected \"situ\" or \"silu\")",
                       s.file, s.pfx, act);
    }
    if ((rc = read_str(&s, "moe_router_activation_func", "sigmoid", &router, err)))
        return rc;
    if (strcmp(router, "sigmoid"))
        return k3_fail(err, K3_ERR_UNSUPPORTED,
                       "%s: %smoe_router_activation_func: \"%s\" is not supported (expected "
                       "\"sigmoid\")",
                       s.file, s.pfx, router);
    if ((rc = read_str(&s, "topk_method", "noaux_tc", &topk, err)))
        return rc;
    if (strcmp(topk, "noaux_tc"))
        return k3_fail(err, K3_ERR_UNSUPPORTED,
                       "%s: %stopk_method: \"%s\" is not supported (expected \"noaux_tc\")", s.file,
                       s.pfx, topk);
    mc->route_fn = K3_ROUTE_NOAUX_TC;
    /* K3 and Kimi-Linear are NoPE, so RoPE scaling (a YaRN context extension, say) has nothing
     * to act on; the user asked for it, so say it is dropped. A bare rope_theta is the config
     * class's default, carried by Kimi-Linear's own file, and passes without a word. */
    const cJSON *rs = item(s.obj, "rope_scaling");
    if (rs && !cJSON_IsNull(rs)) {
        const cJSON *ty = item(rs, "type");
        if (!cJSON_IsString(ty))
            ty = item(rs, "rope_type");
        bool theta = item(s.obj, "rope_theta") && !cJSON_IsNull(item(s.obj, "rope_theta"));
        k3_warn("%s: %s%srope_scaling%s%s%s %s ignored: the model has no rotary positions (NoPE)",
                s.file, s.pfx, theta ? "rope_theta and " : "", cJSON_IsString(ty) ? " (\"" : "",
                cJSON_IsString(ty) ? ty->valuestring : "", cJSON_IsString(ty) ? "\")" : "",
                theta ? "are" : "is");
    }
    if ((rc = read_layer_list(&s, "kda_layers", kda, nk, err)))
        return rc;
    return read_layer_list(&s, "full_attn_layers", mla, nm, err);
}

static int check_arch(const cJSON *obj, const char *file, const char *pfx, const char *expect,
                      k3_error *err) {
    const cJSON *a = item(obj, "architectures");
    if (!a || cJSON_IsNull(a))
        return K3_OK;
    if (!cJSON_IsArray(a))
        return k3_fail(err, K3_ERR_FORMAT, "%s: %sarchitectures: expected an array, found %s", file,
                       pfx, json_kind(a));
    for (const cJSON *e = a->child; e; e = e->next)
        if (!cJSON_IsString(e) || strcmp(e->valuestring, expect))
            return k3_fail(err, K3_ERR_UNSUPPORTED,
                           "%s: %sarchitectures: \"%s\" is not supported (expected \"%s\")", file,
                           pfx, cJSON_IsString(e) ? e->valuestring : json_kind(e), expect);
    return K3_OK;
}

int k3_model_config_parse(k3_model_config *mc, const cJSON *root, const char *what, k3_error *err) {
    memset(mc, 0, sizeof *mc);
    if (!cJSON_IsObject(root))
        return k3_fail(err, K3_ERR_FORMAT, "%s: expected a JSON object", what);
    src s = {.file = what, .pfx = "", .obj = root};
    const char *mt = NULL;
    int rc = read_str(&s, "model_type", NULL, &mt, err);
    if (rc)
        return rc;
    if (!strcmp(mt, "kimi_k3")) {
        if ((rc = check_arch(root, what, "", "KimiK3ForConditionalGeneration", err)))
            return rc;
        const cJSON *tc = item(root, "text_config");
        if (!tc || cJSON_IsNull(tc))
            return k3_fail(err, K3_ERR_MISSING, "%s: text_config: missing", what);
        if (!cJSON_IsObject(tc))
            return k3_fail(err, K3_ERR_FORMAT, "%s: text_config: expected an object, found %s",
                           what, json_kind(tc));
        s = (src){.file = what, .pfx = "text_config.", .obj = tc, .top = root};
        if ((rc = read_str(&s, "model_type", NULL, &mt, err)))
            return rc;
        if (strcmp(mt, "kimi_linear"))
            return k3_fail(err, K3_ERR_UNSUPPORTED,
                           "%s: text_config.model_type: \"%s\" is not supported (expected "
                           "\"kimi_linear\")",
                           what, mt);
        mc->wrapped = true;
    } else if (strcmp(mt, "kimi_linear")) {
        return k3_fail(err, K3_ERR_UNSUPPORTED,
                       "%s: model_type: \"%s\" is not supported (k3 reads \"kimi_k3\" and "
                       "\"kimi_linear\")",
                       what, mt);
    }
    if ((rc = check_arch(s.obj, what, s.pfx, "KimiLinearForCausalLM", err)))
        return rc;
    int64_t *kda = NULL, *mla = NULL, nk = 0, nm = 0;
    rc = parse_text(mc, &s, &kda, &nk, &mla, &nm, err);
    if (!rc)
        rc = k3_model_config_set_layers(mc, kda, nk, mla, nm, what, err);
    free(kda);
    free(mla);
    if (!rc) {
        rc = validate(mc, what, s.pfx, err);
    }
    if (rc)
        k3_model_config_free(mc);
    return rc;
}

int k3_model_config_load(k3_model_config *mc, const char *path, k3_error *err) {
    memset(mc, 0, sizeof *mc);
    cJSON *root = NULL;
    int rc = k3_json_parse_file(&root, path, CONFIG_MAX_BYTES, err);
    if (rc)
        return rc;
    rc = k3_model_config_parse(mc, root, path, err);
    cJSON_Delete(root);
    return rc;
}

/* ---- writer --------------------------------------------------------------------- */

static bool add_int(cJSON *o, const char *key, int64_t v) {
    return cJSON_AddNumberToObject(o, key, (double)v) != NULL;
}

static bool add_layer_lists(const k3_model_config *mc, cJSON *lin) {
    cJSON *kda = cJSON_AddArrayToObject(lin, "kda_layers");
    cJSON *mla = cJSON_AddArrayToObject(lin, "full_attn_layers");
    if (!kda || !mla)
        return false;
    for (int64_t l = 0; l < mc->num_hidden_layers; l++) {
        cJSON *n = cJSON_CreateNumber((double)(l + 1)); /* the file is 1-indexed */
        if (!n || !cJSON_AddItemToArray(mc->layers[l].attn == K3_ATTN_MLA ? mla : kda, n)) {
            cJSON_Delete(n);
            return false;
        }
    }
    return true;
}

static cJSON *text_json(const k3_model_config *mc) {
    cJSON *o = cJSON_CreateObject(), *lin = cJSON_CreateObject();
    bool ok = o && lin && cJSON_AddItemToObject(o, "linear_attn_config", lin);
    if (!ok)
        cJSON_Delete(lin);
    cJSON *arch = ok ? cJSON_AddArrayToObject(o, "architectures") : NULL;
    ok = ok && arch && cJSON_AddItemToArray(arch, cJSON_CreateString("KimiLinearForCausalLM")) &&
         cJSON_AddStringToObject(o, "model_type", "kimi_linear");
    for (size_t i = 0; ok && i < N_OF(int_fields); i++) {
        const int_field *f = &int_fields[i];
        int64_t v = CFIELD(mc, int64_t, f->off);
        cJSON *dst = (f->flags & F_LINEAR) ? lin : o;
        if ((f->flags & F_NULLABLE) && v == f->def)
            ok = cJSON_AddNullToObject(dst, f->key) != NULL;
        else
            ok = add_int(dst, f->key, v);
    }
    for (size_t i = 0; ok && i < N_OF(bool_fields); i++)
        ok = cJSON_AddBoolToObject((bool_fields[i].flags & F_LINEAR) ? lin : o, bool_fields[i].key,
                                   CFIELD(mc, bool, bool_fields[i].off)) != NULL;
    for (size_t i = 0; ok && i < N_OF(dbl_fields); i++)
        ok = cJSON_AddNumberToObject(o, dbl_fields[i].key, CFIELD(mc, double, dbl_fields[i].off)) !=
             NULL;
    ok = ok &&
         cJSON_AddStringToObject(o, "hidden_act", mc->hidden_act == K3_ACT_SITU ? "situ" : "silu");
    if (ok && mc->hidden_act == K3_ACT_SITU)
        ok = cJSON_AddNumberToObject(o, "activation_situ_beta", mc->situ_beta) &&
             cJSON_AddNumberToObject(o, "activation_situ_linear_beta", mc->situ_linear_beta);
    ok = ok && cJSON_AddStringToObject(o, "moe_router_activation_func", "sigmoid") &&
         cJSON_AddStringToObject(o, "topk_method", "noaux_tc") &&
         cJSON_AddStringToObject(o, "dtype", "bfloat16");
    if (ok && mc->kda_has_lower_bound)
        ok = cJSON_AddNumberToObject(lin, "gate_lower_bound", mc->kda_gate_lower_bound) != NULL;
    ok = ok && add_layer_lists(mc, lin);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int k3_model_config_to_json(const k3_model_config *mc, cJSON **out, k3_error *err) {
    *out = NULL;
    int rc = k3_model_config_validate(mc, "model config", err);
    if (rc)
        return rc;
    cJSON *text = text_json(mc);
    if (!text)
        return k3_fail(err, K3_ERR_NOMEM, "model config: out of memory writing JSON");
    if (!mc->wrapped) {
        *out = text;
        return K3_OK;
    }
    /* The VL wrapper of the published K3: token ids and tying are repeated at the top. */
    cJSON *top = cJSON_CreateObject();
    cJSON *arch = top ? cJSON_AddArrayToObject(top, "architectures") : NULL;
    bool ok = arch &&
              cJSON_AddItemToArray(arch, cJSON_CreateString("KimiK3ForConditionalGeneration")) &&
              cJSON_AddStringToObject(top, "model_type", "kimi_k3") &&
              add_int(top, "bos_token_id", mc->bos_token_id) &&
              add_int(top, "eos_token_id", mc->eos_token_id) &&
              (mc->pad_token_id < 0 ? cJSON_AddNullToObject(top, "pad_token_id") != NULL
                                    : add_int(top, "pad_token_id", mc->pad_token_id)) &&
              cJSON_AddBoolToObject(top, "tie_word_embeddings", mc->tie_word_embeddings) &&
              cJSON_AddStringToObject(top, "dtype", "bfloat16") &&
              cJSON_AddItemToObject(top, "text_config", text);
    if (!ok) {
        if (!top || !cJSON_GetObjectItemCaseSensitive(top, "text_config"))
            cJSON_Delete(text);
        cJSON_Delete(top);
        return k3_fail(err, K3_ERR_NOMEM, "model config: out of memory writing JSON");
    }
    *out = top;
    return K3_OK;
}

int k3_model_config_write(const k3_model_config *mc, const cJSON *quantization_config,
                          const char *path, k3_error *err) {
    cJSON *root = NULL;
    int rc = k3_model_config_to_json(mc, &root, err);
    if (rc)
        return rc;
    if (quantization_config) {
        cJSON *q = cJSON_Duplicate(quantization_config, true);
        if (!q || !cJSON_AddItemToObject(root, "quantization_config", q)) {
            cJSON_Delete(q);
            cJSON_Delete(root);
            return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", path);
        }
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text)
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", path);
    FILE *f = fopen(path, "wb");
    if (!f) {
        rc = k3_fail(err, K3_ERR_IO, "%s: %s", path, strerror(errno));
        free(text);
        return rc;
    }
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    free(text);
    if (!ok)
        return k3_fail(err, K3_ERR_IO, "%s: write failed", path);
    return K3_OK;
}
