/* config.json parsing: the released Kimi K3 (wrapper) and Kimi-Linear-48B values parse to
 * the right struct and plan; every missing, out-of-range or inconsistent field is an error
 * naming it; the writer round-trips. Fixtures: tests/data/configs (run from the repo root). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/json.h"
#include "io/model_config.h"

#define DATA "tests/data/configs/"

static cJSON *load(const char *name) {
    cJSON *root = NULL;
    k3_error e = {0};
    char path[256];
    snprintf(path, sizeof path, DATA "%s", name);
    int rc = k3_json_parse_file(&root, path, 1 << 20, &e);
    if (rc)
        fail_msg("%s", e.msg);
    return root;
}

/* The text config object inside a fixture (the wrapper's text_config, or the root). */
static cJSON *text(cJSON *root) {
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    return tc ? tc : root;
}

static void expect_error(cJSON *root, int status, const char *needle) {
    k3_model_config mc;
    k3_error e = {0};
    int rc = k3_model_config_parse(&mc, root, "config.json", &e);
    if (rc != status || !strstr(e.msg, needle))
        fail_msg("expected status %d with \"%s\", got %d \"%s\"", status, needle, rc, e.msg);
    k3_model_config_free(&mc);
}

static void set_num(cJSON *obj, const char *key, double v) {
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    assert_non_null(cJSON_AddNumberToObject(obj, key, v));
}

static void test_k3_values(void **state) {
    (void)state;
    cJSON *root = load("kimi_k3.json");
    k3_model_config mc;
    k3_error e = {0};
    assert_int_equal(k3_model_config_parse(&mc, root, "config.json", &e), K3_OK);
    assert_true(mc.wrapped);
    assert_int_equal(mc.vocab_size, 163840);
    assert_int_equal(mc.hidden_size, 7168);
    assert_int_equal(mc.num_hidden_layers, 93);
    assert_int_equal(mc.num_attention_heads, 96);
    assert_int_equal(mc.num_key_value_heads, 96);
    assert_int_equal(mc.head_dim, 7168 / 96); /* absent: class default hidden/heads */
    assert_int_equal(mc.intermediate_size, 33792);
    assert_int_equal(mc.hidden_act, K3_ACT_SITU);
    assert_true(mc.situ_beta == 4.0 && mc.situ_linear_beta == 25.0);
    assert_true(mc.rms_norm_eps == 1e-5);
    assert_int_equal(mc.max_position_embeddings, 1048576);
    assert_int_equal(mc.q_lora_rank, 1536);
    assert_int_equal(mc.kv_lora_rank, 512);
    assert_int_equal(mc.qk_nope_head_dim, 128);
    assert_int_equal(mc.qk_rope_head_dim, 64);
    assert_int_equal(mc.v_head_dim, 128);
    assert_true(mc.mla_use_nope && mc.mla_use_output_gate);
    assert_int_equal(mc.kda_num_heads, 96);
    assert_int_equal(mc.kda_head_dim, 128);
    assert_int_equal(mc.kda_conv_kernel, 4);
    assert_true(mc.kda_full_rank_gate);
    assert_true(mc.kda_has_lower_bound && mc.kda_gate_lower_bound == -5.0);
    assert_int_equal(mc.first_k_dense_replace, 1);
    assert_int_equal(mc.moe_layer_freq, 1);
    assert_int_equal(mc.num_experts, 896);
    assert_int_equal(mc.num_experts_per_token, 16);
    assert_int_equal(mc.num_shared_experts, 2);
    assert_int_equal(mc.moe_intermediate_size, 3072);
    assert_int_equal(mc.routed_expert_hidden_size, 3584);
    assert_true(mc.latent_moe_use_norm && mc.moe_renormalize && mc.use_grouped_topk);
    assert_int_equal(mc.route_fn, K3_ROUTE_NOAUX_TC);
    assert_true(mc.routed_scaling_factor == 1.0);
    assert_int_equal(mc.num_expert_group, 1);
    assert_int_equal(mc.topk_group, 1);
    assert_int_equal(mc.attn_res_block_size, 12);
    assert_int_equal(mc.num_nextn_predict_layers, 0);
    assert_false(mc.tie_word_embeddings);
    assert_int_equal(mc.bos_token_id, 163584);
    assert_int_equal(mc.eos_token_id, 163586);
    assert_int_equal(mc.pad_token_id, 163839);
    /* plan: 69 KDA + 24 MLA, MLA at 0-indexed 3,7,...,91 and 92; layer 0 dense */
    assert_int_equal(mc.n_kda, 69);
    assert_int_equal(mc.n_mla, 24);
    assert_int_equal(mc.n_moe, 92);
    for (int l = 0; l < 93; l++) {
        bool mla = ((l + 1) % 4 == 0 && l <= 91) || l == 92;
        assert_int_equal(mc.layers[l].attn, mla ? K3_ATTN_MLA : K3_ATTN_KDA);
        assert_int_equal(mc.layers[l].ffn, l == 0 ? K3_FFN_DENSE : K3_FFN_MOE);
        assert_int_equal(mc.layers[l].res_block_start, l % 12 == 0);
    }
    k3_model_config_free(&mc);
    k3_model_config_free(&mc); /* safe twice */
    cJSON_Delete(root);
}

static void test_kimi_linear_values(void **state) {
    (void)state;
    cJSON *root = load("kimi_linear_48b.json");
    k3_model_config mc;
    k3_error e = {0};
    assert_int_equal(k3_model_config_parse(&mc, root, "config.json", &e), K3_OK);
    assert_false(mc.wrapped);
    assert_int_equal(mc.hidden_size, 2304);
    assert_int_equal(mc.num_hidden_layers, 27);
    assert_int_equal(mc.head_dim, 72);
    assert_int_equal(mc.hidden_act, K3_ACT_SILU);
    assert_int_equal(mc.q_lora_rank, 0); /* null: plain q_proj */
    assert_false(mc.mla_use_output_gate);
    assert_false(mc.kda_full_rank_gate);               /* low-rank g_a/g_b */
    assert_false(mc.kda_has_lower_bound);              /* softplus decay */
    assert_int_equal(mc.attn_res_block_size, 0);       /* plain residuals */
    assert_int_equal(mc.routed_expert_hidden_size, 0); /* experts at full width */
    assert_false(mc.latent_moe_use_norm);
    assert_int_equal(mc.num_experts, 256);
    assert_int_equal(mc.num_experts_per_token, 8);
    assert_int_equal(mc.num_shared_experts, 1);
    assert_int_equal(mc.intermediate_size, 9216);
    assert_int_equal(mc.moe_intermediate_size, 1024);
    assert_true(mc.routed_scaling_factor == 2.446);
    assert_int_equal(mc.max_position_embeddings, 1048576); /* from model_max_length */
    assert_int_equal(mc.n_kda, 20);
    assert_int_equal(mc.n_mla, 7);
    assert_int_equal(mc.layers[26].attn, K3_ATTN_MLA);
    assert_int_equal(mc.layers[25].attn, K3_ATTN_KDA);
    assert_int_equal(mc.layers[3].attn, K3_ATTN_MLA);
    for (int l = 0; l < 27; l++)
        assert_false(mc.layers[l].res_block_start);
    k3_model_config_free(&mc);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "model_max_length");
    assert_int_equal(k3_model_config_parse(&mc, root, "config.json", &e), K3_OK);
    assert_int_equal(mc.max_position_embeddings, 4096); /* absent: the class default */
    k3_model_config_free(&mc);
    cJSON_Delete(root);
}

/* Every required field, removed one at a time, gives `FIELD: missing` with its path. */
static void test_missing_fields(void **state) {
    (void)state;
    static const char *const req[] = {
        "vocab_size",         "hidden_size",           "intermediate_size",
        "num_hidden_layers",  "num_attention_heads",   "kv_lora_rank",
        "qk_nope_head_dim",   "qk_rope_head_dim",      "v_head_dim",
        "num_experts",        "num_experts_per_token", "moe_intermediate_size",
        "linear_attn_config", "activation_situ_beta",  "activation_situ_linear_beta",
        "model_type"};
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        cJSON *root = load("kimi_k3.json");
        cJSON_DeleteItemFromObjectCaseSensitive(text(root), req[i]);
        char needle[128];
        snprintf(needle, sizeof needle, "config.json: text_config.%s: missing", req[i]);
        expect_error(root, K3_ERR_MISSING, needle);
        cJSON_Delete(root);
    }
    static const char *const lin_req[] = {"num_heads", "head_dim", "short_conv_kernel_size",
                                          "kda_layers", "full_attn_layers"};
    for (size_t i = 0; i < sizeof lin_req / sizeof lin_req[0]; i++) {
        cJSON *root = load("kimi_k3.json");
        cJSON_DeleteItemFromObjectCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(text(root), "linear_attn_config"), lin_req[i]);
        char needle[128];
        snprintf(needle, sizeof needle, "config.json: text_config.linear_attn_config.%s: missing",
                 lin_req[i]);
        expect_error(root, K3_ERR_MISSING, needle);
        cJSON_Delete(root);
    }
    /* bare kimi_linear: no text_config. prefix */
    cJSON *root = load("kimi_linear_48b.json");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "num_experts");
    expect_error(root, K3_ERR_MISSING, "config.json: num_experts: missing");
    cJSON_Delete(root);
    /* null counts as missing for a required field */
    root = load("kimi_k3.json");
    cJSON_DeleteItemFromObjectCaseSensitive(text(root), "num_experts");
    cJSON_AddNullToObject(text(root), "num_experts");
    expect_error(root, K3_ERR_MISSING, "config.json: text_config.num_experts: missing");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "text_config");
    expect_error(root, K3_ERR_MISSING, "config.json: text_config: missing");
    cJSON_Delete(root);
}

/* Out-of-bounds values: above each cap, zero, negative, fractional, wrong type. */
static void test_bounds(void **state) {
    (void)state;
    static const struct {
        const char *key;
        double v;
    } bad[] = {
        {"num_hidden_layers", K3_MAX_LAYERS + 1},
        {"num_hidden_layers", 0},
        {"num_experts", K3_MAX_EXPERTS + 1},
        {"num_experts", -1},
        {"num_attention_heads", K3_MAX_HEADS + 1},
        {"hidden_size", K3_MAX_HIDDEN + 1},
        {"vocab_size", K3_MAX_VOCAB + 1},
        {"v_head_dim", K3_MAX_HEAD_DIM + 1},
        {"num_experts_per_token", K3_MAX_TOPK + 1},
        {"moe_intermediate_size", 0.5},
        {"kv_lora_rank", K3_MAX_LORA_RANK + 1},
        {"q_lora_rank", 0},
        {"max_position_embeddings", K3_MAX_POSITIONS + 1},
        {"routed_scaling_factor", 0},
        {"rms_norm_eps", -1e-5},
        {"attn_res_block_size", 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *root = load("kimi_k3.json");
        set_num(text(root), bad[i].key, bad[i].v);
        char needle[128];
        snprintf(needle, sizeof needle, "config.json: text_config.%s: expected", bad[i].key);
        expect_error(root, K3_ERR_FORMAT, needle);
        cJSON_Delete(root);
    }
    cJSON *root = load("kimi_k3.json");
    cJSON *lin = cJSON_GetObjectItemCaseSensitive(text(root), "linear_attn_config");
    set_num(lin, "num_heads", K3_MAX_HEADS + 1);
    expect_error(root, K3_ERR_FORMAT, "text_config.linear_attn_config.num_heads: expected");
    set_num(lin, "num_heads", 96);
    set_num(lin, "gate_lower_bound", 0.5);
    expect_error(root, K3_ERR_FORMAT, "text_config.linear_attn_config.gate_lower_bound: expected");
    cJSON_Delete(root);
    root = load("kimi_k3.json");
    cJSON_DeleteItemFromObjectCaseSensitive(text(root), "num_experts");
    cJSON_AddStringToObject(text(root), "num_experts", "896");
    expect_error(root, K3_ERR_FORMAT, "text_config.num_experts: expected an integer");
    cJSON_Delete(root);
    root = load("kimi_k3.json");
    set_num(text(root), "eos_token_id", 163840); /* == vocab_size */
    expect_error(root, K3_ERR_FORMAT, "text_config.eos_token_id: 163840 is outside the vocabulary");
    cJSON_Delete(root);
}

static void test_router_consistency(void **state) {
    (void)state;
    cJSON *root = load("kimi_k3.json");
    cJSON *tc = text(root);
    set_num(tc, "num_experts", 12);
    expect_error(root, K3_ERR_FORMAT, "num_experts_per_token: 16 is more than num_experts 12");
    set_num(tc, "num_experts", 896);
    set_num(tc, "num_expert_group", 3);
    expect_error(root, K3_ERR_FORMAT, "num_expert_group: 3 does not divide num_experts 896");
    set_num(tc, "num_expert_group", 8);
    set_num(tc, "topk_group", 9);
    expect_error(root, K3_ERR_FORMAT, "topk_group: 9 is more than num_expert_group 8");
    set_num(tc, "num_expert_group", 128); /* 7 experts per group */
    set_num(tc, "topk_group", 2);
    expect_error(root, K3_ERR_FORMAT, "num_experts_per_token: 16 is more than the 14 experts");
    set_num(tc, "num_expert_group", 1);
    set_num(tc, "topk_group", 1);
    cJSON_DeleteItemFromObjectCaseSensitive(tc, "moe_router_activation_func");
    cJSON_AddStringToObject(tc, "moe_router_activation_func", "softmax");
    expect_error(root, K3_ERR_UNSUPPORTED, "text_config.moe_router_activation_func: \"softmax\"");
    cJSON_DeleteItemFromObjectCaseSensitive(tc, "moe_router_activation_func");
    cJSON_DeleteItemFromObjectCaseSensitive(tc, "topk_method");
    cJSON_AddStringToObject(tc, "topk_method", "greedy");
    expect_error(root, K3_ERR_UNSUPPORTED, "text_config.topk_method: \"greedy\"");
    cJSON_DeleteItemFromObjectCaseSensitive(tc, "topk_method");
    cJSON_DeleteItemFromObjectCaseSensitive(tc, "moe_renormalize");
    cJSON_AddFalseToObject(tc, "moe_renormalize"); /* moe.md §6: the K3 gate raises */
    expect_error(root, K3_ERR_UNSUPPORTED, "text_config.moe_renormalize: false is not supported");
    cJSON_DeleteItemFromObjectCaseSensitive(tc, "moe_renormalize");
    set_num(tc, "num_nextn_predict_layers", 1); /* K3 has no MTP layers, no draft-head tensors */
    expect_error(root, K3_ERR_UNSUPPORTED,
                 "text_config.num_nextn_predict_layers: 1 is not supported");
    set_num(tc, "num_nextn_predict_layers", 0);
    set_num(tc, "first_k_dense_replace", 94);
    expect_error(root, K3_ERR_FORMAT,
                 "first_k_dense_replace: 94 is more than num_hidden_layers 93");
    set_num(tc, "first_k_dense_replace", 1);
    cJSON_DeleteItemFromObjectCaseSensitive(tc, "routed_expert_hidden_size");
    expect_error(root, K3_ERR_FORMAT, "latent_moe_use_norm: true needs routed_expert_hidden_size");
    cJSON_Delete(root);
}

static void test_model_type_and_arch(void **state) {
    (void)state;
    cJSON *root = load("kimi_k3.json");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "model_type");
    cJSON_AddStringToObject(root, "model_type", "deepseek_v3");
    expect_error(root, K3_ERR_UNSUPPORTED,
                 "config.json: model_type: \"deepseek_v3\" is not supported");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "model_type");
    expect_error(root, K3_ERR_MISSING, "config.json: model_type: missing");
    cJSON_AddStringToObject(root, "model_type", "kimi_k3");
    cJSON_DeleteItemFromObjectCaseSensitive(text(root), "model_type");
    cJSON_AddStringToObject(text(root), "model_type", "llama");
    expect_error(root, K3_ERR_UNSUPPORTED, "config.json: text_config.model_type: \"llama\"");
    cJSON_Delete(root);
    root = load("kimi_linear_48b.json");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "architectures");
    cJSON *a = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString("LlamaForCausalLM"));
    expect_error(root, K3_ERR_UNSUPPORTED, "config.json: architectures: \"LlamaForCausalLM\"");
    cJSON_Delete(root);
    k3_model_config mc;
    k3_error e = {0};
    cJSON *arr = cJSON_CreateArray();
    assert_int_equal(k3_model_config_parse(&mc, arr, "config.json", &e), K3_ERR_FORMAT);
    cJSON_Delete(arr);
}

static void test_flags_and_fallbacks(void **state) {
    (void)state;
    cJSON *root = load("kimi_k3.json");
    cJSON *tc = text(root);
    cJSON_DeleteItemFromObjectCaseSensitive(tc, "mla_use_nope");
    cJSON_AddStringToObject(tc, "mla_use_nope", "yes");
    expect_error(root, K3_ERR_FORMAT,
                 "text_config.mla_use_nope: expected true or false, found a string");
    cJSON_DeleteItemFromObjectCaseSensitive(tc, "mla_use_nope");
    expect_error(root, K3_ERR_UNSUPPORTED, "text_config.mla_use_nope: false (rotary MLA)");
    cJSON_AddTrueToObject(tc, "mla_use_nope");
    /* token ids missing from text_config come from the wrapper's top level */
    cJSON_DeleteItemFromObjectCaseSensitive(tc, "bos_token_id");
    cJSON_DeleteItemFromObjectCaseSensitive(tc, "pad_token_id");
    k3_model_config mc;
    k3_error e = {0};
    assert_int_equal(k3_model_config_parse(&mc, root, "config.json", &e), K3_OK);
    assert_int_equal(mc.bos_token_id, 163584);
    assert_int_equal(mc.pad_token_id, 163839);
    k3_model_config_free(&mc);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "pad_token_id");
    assert_int_equal(k3_model_config_parse(&mc, root, "config.json", &e), K3_OK);
    assert_int_equal(mc.pad_token_id, -1); /* null/absent pad */
    k3_model_config_free(&mc);
    /* no token ids anywhere: the header's table, bos 1, eos 2, no pad */
    const char *ids[] = {"bos_token_id", "eos_token_id"};
    for (int i = 0; i < 2; i++) {
        cJSON_DeleteItemFromObjectCaseSensitive(root, ids[i]);
        cJSON_DeleteItemFromObjectCaseSensitive(tc, ids[i]);
    }
    assert_int_equal(k3_model_config_parse(&mc, root, "config.json", &e), K3_OK);
    assert_true(mc.bos_token_id == 1 && mc.eos_token_id == 2 && mc.pad_token_id == -1);
    k3_model_config_free(&mc);
    cJSON *lin = cJSON_GetObjectItemCaseSensitive(tc, "linear_attn_config");
    cJSON_DeleteItemFromObjectCaseSensitive(lin, "kda_layers");
    cJSON_AddStringToObject(lin, "kda_layers", "1-91");
    expect_error(root, K3_ERR_FORMAT,
                 "text_config.linear_attn_config.kda_layers: expected an array, found a string");
    cJSON_DeleteItemFromObjectCaseSensitive(tc, "linear_attn_config");
    cJSON_AddNumberToObject(tc, "linear_attn_config", 1);
    expect_error(root, K3_ERR_FORMAT,
                 "text_config.linear_attn_config: expected an object, found a number");
    cJSON_Delete(root);
}

static void replace_list(cJSON *root, const char *key, const int *v, int n) {
    cJSON *lin = cJSON_GetObjectItemCaseSensitive(text(root), "linear_attn_config");
    cJSON_DeleteItemFromObjectCaseSensitive(lin, key);
    cJSON_AddItemToObject(lin, key, cJSON_CreateIntArray(v, n));
}

/* Parses root with stderr captured; returns what was logged (caller frees). */
static char *parse_logging(cJSON *root) {
    FILE *cap = tmpfile();
    assert_non_null(cap);
    fflush(stderr);
    int saved = dup(fileno(stderr));
    assert_true(saved >= 0 && dup2(fileno(cap), fileno(stderr)) >= 0);
    k3_model_config mc;
    k3_error e = {0};
    int rc = k3_model_config_parse(&mc, root, "config.json", &e);
    fflush(stderr);
    dup2(saved, fileno(stderr));
    close(saved);
    if (rc)
        fail_msg("%s", e.msg);
    k3_model_config_free(&mc);
    long n = ftell(cap);
    char *log = calloc((size_t)n + 1, 1);
    rewind(cap);
    assert_int_equal(fread(log, 1, (size_t)n, cap), (size_t)n);
    fclose(cap);
    return log;
}

/* NoPE: a RoPE scaling request is dropped with one warning; Kimi-Linear's own rope_theta
 * (the class default) with a null rope_scaling passes silently. */
static void test_rope_ignored(void **state) {
    (void)state;
    cJSON *root = load("kimi_k3.json");
    cJSON *tc = text(root);
    set_num(tc, "rope_theta", 50000);
    cJSON *rs = cJSON_AddObjectToObject(tc, "rope_scaling");
    cJSON_AddStringToObject(rs, "type", "yarn");
    cJSON_AddNumberToObject(rs, "factor", 4);
    char *log = parse_logging(root);
    if (!strstr(log, "warning: config.json: text_config.rope_theta and rope_scaling (\"yarn\") "
                     "are ignored: the model has no rotary positions (NoPE)\n"))
        fail_msg("log: %s", log);
    assert_true(strchr(log, '\n') == log + strlen(log) - 1); /* one line */
    free(log);
    cJSON_Delete(root);
    root = load("kimi_linear_48b.json");
    log = parse_logging(root);
    assert_string_equal(log, "");
    free(log);
    cJSON_Delete(root);
}

static void test_layer_lists(void **state) {
    (void)state;
    /* Kimi-Linear: 27 layers, MLA at 4,8,...,24,27 (1-indexed) */
    const int full_ok[] = {4, 8, 12, 16, 20, 24, 27};
    int kda[20], n = 0;
    for (int l = 1; l <= 27; l++)
        if (l % 4 && l != 27)
            kda[n++] = l;
    assert_int_equal(n, 20);
    cJSON *root = load("kimi_linear_48b.json");
    const int overlap[] = {4, 8, 12, 16, 20, 24, 27, 5};
    replace_list(root, "full_attn_layers", overlap, 8);
    expect_error(root, K3_ERR_FORMAT,
                 "layer 5 (1-indexed) is in both kda_layers and full_attn_layers");
    replace_list(root, "full_attn_layers", full_ok, 6); /* 27 dropped */
    expect_error(root, K3_ERR_MISSING, "layer 27 (1-indexed) is in neither");
    const int twice[] = {4, 8, 12, 16, 20, 24, 27, 8};
    replace_list(root, "full_attn_layers", twice, 8);
    expect_error(root, K3_ERR_DUPLICATE,
                 "linear_attn_config.full_attn_layers: layer 8 listed twice");
    const int out_of_range[] = {4, 8, 12, 16, 20, 24, 27, 28};
    replace_list(root, "full_attn_layers", out_of_range, 8);
    expect_error(root, K3_ERR_FORMAT, "full_attn_layers[7]: layer 28 outside 1..27");
    const int zero[] = {0, 4, 8, 12, 16, 20, 24, 27};
    replace_list(root, "full_attn_layers", zero, 8);
    expect_error(root, K3_ERR_FORMAT, "full_attn_layers[0]: expected a 1-indexed layer number");
    replace_list(root, "full_attn_layers", full_ok, 7);
    replace_list(root, "kda_layers", kda, n);
    k3_model_config mc;
    k3_error e = {0};
    assert_int_equal(k3_model_config_parse(&mc, root, "config.json", &e), K3_OK);
    k3_model_config_free(&mc);
    cJSON_Delete(root);
}

static void test_situ_betas(void **state) {
    (void)state;
    static const char *const keys[] = {"activation_situ_beta", "activation_situ_linear_beta"};
    for (int k = 0; k < 2; k++) {
        cJSON *root = load("kimi_k3.json");
        char needle[128];
        snprintf(needle, sizeof needle, "text_config.%s: expected a finite number > 0", keys[k]);
        set_num(text(root), keys[k], 0.0);
        expect_error(root, K3_ERR_FORMAT, needle);
        set_num(text(root), keys[k], -4.0);
        expect_error(root, K3_ERR_FORMAT, needle);
        cJSON_DeleteItemFromObjectCaseSensitive(text(root), keys[k]);
        cJSON_AddStringToObject(text(root), keys[k], "4.0");
        snprintf(needle, sizeof needle, "text_config.%s: expected a finite number", keys[k]);
        expect_error(root, K3_ERR_FORMAT, needle);
        cJSON_Delete(root);
    }
    /* JSON has no NaN literal; a hand-built struct can carry one and validate rejects it */
    cJSON *root = load("kimi_k3.json");
    k3_model_config mc;
    k3_error e = {0};
    assert_int_equal(k3_model_config_parse(&mc, root, "config.json", &e), K3_OK);
    mc.situ_beta = NAN;
    assert_int_equal(k3_model_config_validate(&mc, "tiny", &e), K3_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "tiny: activation_situ_beta: expected a finite number > 0"));
    mc.situ_beta = 4.0;
    mc.situ_linear_beta = INFINITY;
    assert_int_equal(k3_model_config_validate(&mc, "tiny", &e), K3_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "activation_situ_linear_beta"));
    mc.situ_linear_beta = 25.0;
    mc.rms_norm_eps = NAN;
    assert_int_equal(k3_model_config_validate(&mc, "tiny", &e), K3_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "rms_norm_eps"));
    k3_model_config_free(&mc);
    cJSON_DeleteItemFromObjectCaseSensitive(text(root), "hidden_act");
    cJSON_AddStringToObject(text(root), "hidden_act", "gelu");
    expect_error(root, K3_ERR_UNSUPPORTED, "text_config.hidden_act: \"gelu\" is not supported");
    cJSON_Delete(root);
}

static void assert_same(const k3_model_config *a, const k3_model_config *b) {
    /* every scalar, then the plan */
    assert_int_equal(a->wrapped, b->wrapped);
#define EQ(f) assert_true(a->f == b->f)
    EQ(vocab_size), EQ(hidden_size), EQ(num_hidden_layers), EQ(num_attention_heads);
    EQ(num_key_value_heads), EQ(head_dim), EQ(intermediate_size), EQ(hidden_act);
    EQ(situ_beta), EQ(situ_linear_beta), EQ(rms_norm_eps), EQ(max_position_embeddings);
    EQ(q_lora_rank), EQ(kv_lora_rank), EQ(qk_nope_head_dim), EQ(qk_rope_head_dim);
    EQ(v_head_dim), EQ(mla_use_nope), EQ(mla_use_output_gate), EQ(kda_num_heads);
    EQ(kda_head_dim), EQ(kda_conv_kernel), EQ(kda_full_rank_gate), EQ(kda_has_lower_bound);
    EQ(kda_gate_lower_bound), EQ(first_k_dense_replace), EQ(moe_layer_freq), EQ(num_experts);
    EQ(num_experts_per_token), EQ(num_shared_experts), EQ(moe_intermediate_size);
    EQ(routed_expert_hidden_size), EQ(latent_moe_use_norm), EQ(route_fn), EQ(moe_renormalize);
    EQ(routed_scaling_factor), EQ(use_grouped_topk), EQ(num_expert_group), EQ(topk_group);
    EQ(attn_res_block_size), EQ(num_nextn_predict_layers), EQ(tie_word_embeddings);
    EQ(bos_token_id), EQ(eos_token_id), EQ(pad_token_id), EQ(initializer_range), EQ(use_cache);
    EQ(n_kda), EQ(n_mla), EQ(n_moe);
#undef EQ
    assert_memory_equal(a->layers, b->layers, (size_t)a->num_hidden_layers * sizeof *a->layers);
}

static void roundtrip(const char *fixture) {
    cJSON *root = load(fixture);
    k3_model_config a, b;
    k3_error e = {0};
    assert_int_equal(k3_model_config_parse(&a, root, "config.json", &e), K3_OK);
    char path[] = "/tmp/k3_test_config_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    cJSON *qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    assert_int_equal(k3_model_config_write(&a, qc, path, &e), K3_OK);
    assert_int_equal(k3_model_config_load(&b, path, &e), K3_OK);
    assert_same(&a, &b);
    if (qc) { /* the quantization_config travels verbatim */
        cJSON *back = NULL;
        assert_int_equal(k3_json_parse_file(&back, path, 1 << 20, &e), K3_OK);
        assert_true(
            cJSON_Compare(qc, cJSON_GetObjectItemCaseSensitive(back, "quantization_config"), true));
        cJSON_Delete(back);
    }
    unlink(path);
    k3_model_config_free(&a);
    k3_model_config_free(&b);
    cJSON_Delete(root);
}

static void test_roundtrip(void **state) {
    (void)state;
    roundtrip("kimi_k3.json");
    roundtrip("kimi_linear_48b.json");
}

/* make-tiny's path: a hand-built struct, plan from layer lists, written and re-read. */
static void test_build_by_hand(void **state) {
    (void)state;
    k3_model_config mc = {.wrapped = true,
                          .vocab_size = 512,
                          .hidden_size = 64,
                          .num_hidden_layers = 4,
                          .num_attention_heads = 4,
                          .num_key_value_heads = 4,
                          .head_dim = 16,
                          .intermediate_size = 128,
                          .hidden_act = K3_ACT_SITU,
                          .situ_beta = 4.0,
                          .situ_linear_beta = 25.0,
                          .rms_norm_eps = 1e-5,
                          .max_position_embeddings = 4096,
                          .q_lora_rank = 32,
                          .kv_lora_rank = 16,
                          .qk_nope_head_dim = 16,
                          .qk_rope_head_dim = 8,
                          .v_head_dim = 16,
                          .mla_use_nope = true,
                          .mla_use_output_gate = true,
                          .kda_num_heads = 4,
                          .kda_head_dim = 16,
                          .kda_conv_kernel = 4,
                          .kda_full_rank_gate = true,
                          .kda_has_lower_bound = true,
                          .kda_gate_lower_bound = -5.0,
                          .first_k_dense_replace = 1,
                          .moe_layer_freq = 1,
                          .num_experts = 16,
                          .num_experts_per_token = 4,
                          .num_shared_experts = 1,
                          .moe_intermediate_size = 32,
                          .routed_expert_hidden_size = 32,
                          .latent_moe_use_norm = true,
                          .route_fn = K3_ROUTE_NOAUX_TC,
                          .moe_renormalize = true,
                          .routed_scaling_factor = 1.0,
                          .use_grouped_topk = true,
                          .num_expert_group = 1,
                          .topk_group = 1,
                          .attn_res_block_size = 2,
                          .bos_token_id = 1,
                          .eos_token_id = 2,
                          .pad_token_id = -1,
                          .initializer_range = 0.02,
                          .use_cache = true};
    k3_error e = {0};
    assert_int_equal(k3_model_config_validate(&mc, "tiny", &e), K3_ERR_MISSING); /* no plan */
    const int64_t kda[] = {1, 2, 3}, mla[] = {4};
    assert_int_equal(k3_model_config_set_layers(&mc, kda, 3, mla, 1, "tiny", &e), K3_OK);
    assert_int_equal(k3_model_config_validate(&mc, "tiny", &e), K3_OK);
    assert_int_equal(mc.layers[2].attn, K3_ATTN_KDA);
    assert_int_equal(mc.layers[3].attn, K3_ATTN_MLA);
    assert_true(mc.layers[2].res_block_start && !mc.layers[1].res_block_start);
    cJSON *j = NULL;
    assert_int_equal(k3_model_config_to_json(&mc, &j, &e), K3_OK);
    k3_model_config back;
    assert_int_equal(k3_model_config_parse(&back, j, "tiny", &e), K3_OK);
    assert_same(&mc, &back);
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(j, "text_config"), "pad_token_id")));
    cJSON_Delete(j);
    k3_model_config_free(&back);
    mc.moe_renormalize = false; /* by hand as from the file */
    assert_int_equal(k3_model_config_validate(&mc, "tiny", &e), K3_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "moe_renormalize"));
    mc.moe_renormalize = true;
    mc.num_experts_per_token = 17; /* the writer validates too */
    assert_int_equal(k3_model_config_to_json(&mc, &j, &e), K3_ERR_FORMAT);
    assert_null(j);
    k3_model_config_free(&mc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_k3_values),           cmocka_unit_test(test_kimi_linear_values),
        cmocka_unit_test(test_missing_fields),      cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_router_consistency),  cmocka_unit_test(test_model_type_and_arch),
        cmocka_unit_test(test_flags_and_fallbacks), cmocka_unit_test(test_layer_lists),
        cmocka_unit_test(test_situ_betas),          cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_build_by_hand),       cmocka_unit_test(test_rope_ignored),
    };
    return cmocka_run_group_tests_name("model_config", tests, NULL, NULL);
}
