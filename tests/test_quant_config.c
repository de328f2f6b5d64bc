/* Quantization declarations: ModelOpt MIXED_PRECISION with the fp8_pb_wo alias, exclude
 * wildcards, unknown names rejected at validation, inline divergence, per-layer routed
 * expert resolution (NVFP4 under each prefix variant, MXFP4 default), compressed-tensors
 * dispatch and `re:` ignore, bad regexes, and writer -> parser round trips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/json.h"
#include "io/quant_config.h"

static cJSON *js(const char *text) {
    cJSON *j = NULL;
    k3_error e = {0};
    if (k3_json_parse(&j, text, strlen(text), "fixture", &e))
        fail_msg("fixture: %s", e.msg);
    return j;
}

/* nvidia/Kimi-K3-NVFP4 in miniature: experts of layer 1 under every prefix x suffix, of
 * layer 2 only as model.layers.2.mlp.experts, of layer 3 only per expert; layer 4 none. */
static const char *const NVFP4_HF =
    "{\"producer\": {\"name\": \"modelopt\", \"version\": \"0.45.0\"},"
    " \"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"kv_cache_quant_algo\": null,"
    "  \"quantized_layers\": {"
    "   \"language_model.model.layers.1.block_sparse_moe.experts\": {\"quant_algo\": \"NVFP4\", "
    "\"group_size\": 16},"
    "   \"model.layers.1.block_sparse_moe.experts\": {\"quant_algo\": \"NVFP4\", \"group_size\": "
    "16},"
    "   \"layers.1.block_sparse_moe.experts\": {\"quant_algo\": \"NVFP4\", \"group_size\": 16},"
    "   \"language_model.model.layers.1.mlp.experts\": {\"quant_algo\": \"NVFP4\", \"group_size\": "
    "16},"
    "   \"model.layers.1.mlp.experts\": {\"quant_algo\": \"NVFP4\", \"group_size\": 16},"
    "   \"layers.1.mlp.experts\": {\"quant_algo\": \"NVFP4\", \"group_size\": 16},"
    "   \"model.layers.2.mlp.experts\": {\"quant_algo\": \"NVFP4\", \"group_size\": 16},"
    "   \"language_model.model.layers.3.block_sparse_moe.experts.7.w1\": {\"quant_algo\": "
    "\"NVFP4\", \"group_size\": 16},"
    "   \"language_model.model.layers.3.block_sparse_moe.experts.7.w3\": {\"quant_algo\": "
    "\"NVFP4\", \"group_size\": 16},"
    "   \"language_model.model.layers.0.self_attn.q_proj\": {\"quant_algo\": \"fp8_pb_wo\"},"
    "   \"model.layers.3.self_attn.kv_b_proj\": {\"quant_algo\": \"FP8_PB_WO\"},"
    "   \"layers.7.self_attn.o_proj\": {\"quant_algo\": \"Fp8_Pb_Wo\"}},"
    "  \"exclude_modules\": [\"*block_sparse_moe.gate\", \"language_model.lm_head\","
    "                        \"model.layers.0.mlp*\"]}}";

static k3_quant_config parse_ok(const char *hf, const char *inl) {
    cJSON *h = hf ? js(hf) : NULL, *i = inl ? js(inl) : NULL;
    k3_quant_config qc;
    k3_error e = {0};
    if (k3_quant_config_parse(&qc, h, "hf_quant_config.json", i, "config.json: quantization_config",
                              &e))
        fail_msg("parse: %s", e.msg);
    cJSON_Delete(h);
    cJSON_Delete(i);
    return qc;
}

static k3_qdecl resolve(const k3_quant_config *qc, const char *module) {
    k3_qdecl d;
    k3_error e = {0};
    if (k3_quant_resolve(qc, module, &d, &e))
        fail_msg("resolve %s: %s", module, e.msg);
    return d;
}

static void test_alias_per_layer(void **state) {
    (void)state;
    k3_quant_config qc = parse_ok(NVFP4_HF, NULL);
    k3_error e = {0};
    assert_int_equal(qc.source, K3_QSRC_MODELOPT);
    assert_string_equal(qc.quant_algo, "MIXED_PRECISION");
    assert_null(qc.kv_cache_quant_algo);
    assert_int_equal(k3_quant_config_validate(&qc, &e), K3_OK);
    /* each letter case of the alias, in per-layer entries */
    static const char *const attn[] = {"language_model.model.layers.0.self_attn.q_proj",
                                       "model.layers.3.self_attn.kv_b_proj",
                                       "layers.7.self_attn.o_proj"};
    for (int i = 0; i < 3; i++) {
        k3_qdecl d = resolve(&qc, attn[i]);
        assert_int_equal(d.scheme, K3_QS_FP8_BLOCK);
        assert_string_equal(d.algo, "FP8_BLOCK_SCALES");
        assert_int_equal(d.group_size, 128);
    }
    /* the same module under another prefix spelling resolves alike */
    assert_int_equal(resolve(&qc, "model.layers.0.self_attn.q_proj").scheme, K3_QS_FP8_BLOCK);
    assert_int_equal(resolve(&qc, "language_model.model.layers.7.self_attn.o_proj").scheme,
                     K3_QS_FP8_BLOCK);
    /* a descendant of a declared module inherits it */
    assert_int_equal(resolve(&qc, "model.layers.1.block_sparse_moe.experts.5.w2").scheme,
                     K3_QS_NVFP4);
    /* undeclared in MIXED_PRECISION: plain */
    assert_int_equal(resolve(&qc, "model.layers.0.self_attn.k_proj").scheme, K3_QS_NONE);
    k3_quant_config_free(&qc);
    k3_quant_config_free(&qc);
}

static void test_alias_top_level(void **state) {
    (void)state;
    static const char *const spellings[] = {"fp8_pb_wo", "FP8_PB_WO", "Fp8_Pb_Wo"};
    for (int i = 0; i < 3; i++) {
        char buf[512];
        snprintf(
            buf, sizeof buf,
            "{\"producer\": {\"name\": \"modelopt\"}, \"quantization\": {\"quant_algo\": \"%s\","
            " \"kv_cache_quant_algo\": \"fp8\", \"exclude_modules\": [\"lm_head\"]}}",
            spellings[i]);
        k3_quant_config qc = parse_ok(buf, NULL);
        k3_error e = {0};
        assert_string_equal(qc.quant_algo, "FP8_BLOCK_SCALES");
        assert_string_equal(qc.kv_cache_quant_algo, "FP8");
        assert_int_equal(k3_quant_config_validate(&qc, &e), K3_OK);
        assert_int_equal(resolve(&qc, "model.layers.4.self_attn.q_proj").scheme, K3_QS_FP8_BLOCK);
        assert_int_equal(resolve(&qc, "lm_head").scheme, K3_QS_NONE);
        k3_qdecl d;
        assert_int_equal(k3_quant_resolve_experts(&qc, 4, &d, &e), K3_OK);
        assert_int_equal(d.scheme, K3_QS_FP8_BLOCK); /* single format covers experts too */
        assert_false(d.defaulted);
        k3_quant_config_free(&qc);
    }
    assert_string_equal(k3_quant_algo_canonical("nvfp4"), "NVFP4");
    assert_null(k3_quant_algo_canonical("FP8_PB")); /* only fp8_pb_wo is an alias */
    assert_int_equal(k3_qscheme_of_algo("W4A8_MXFP4_MXFP8"), K3_QS_MXFP4);
    assert_int_equal(k3_qscheme_of_algo("W8A16"), K3_QS_OTHER);
    assert_int_equal(k3_qscheme_of_algo(NULL), K3_QS_NONE);
}

static void expect_invalid(const char *hf, const char *needle) {
    k3_quant_config qc = parse_ok(hf, NULL); /* the parser lets it pass */
    k3_error e = {0};
    int rc = k3_quant_config_validate(&qc, &e);
    if (rc == K3_OK || !strstr(e.msg, needle))
        fail_msg("expected a validation error with \"%s\", got %d \"%s\"", needle, rc, e.msg);
    k3_quant_config_free(&qc);
}

/* TRT-MC: an unknown KV-cache algorithm (ModelOpt also writes NVFP4_AFFINE) warns and disables
 * KV quantization instead of failing the load */
static void test_unknown_kv_disabled(void **state) {
    (void)state;
    static const char *const cfgs[] = {
        "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"kv_cache_quant_algo\": \"NVFP4_AFFINE\"}}",
        "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"kv_cache_quant_algo\": \"FP16\"}}"};
    for (int i = 0; i < 2; i++) {
        k3_quant_config qc = parse_ok(cfgs[i], NULL);
        k3_error e = {0};
        assert_null(qc.kv_cache_quant_algo);
        assert_int_equal(k3_quant_config_validate(&qc, &e), K3_OK);
        k3_quant_config_free(&qc);
    }
    k3_quant_config qc = parse_ok(NULL, "{\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\","
                                        " \"kv_cache_scheme\": {\"type\": \"int\", \"num_bits\": 4}}");
    assert_null(qc.kv_cache_quant_algo);
    k3_quant_config_free(&qc);
}

static void test_unknown_rejected_at_validation(void **state) {
    (void)state;
    expect_invalid("{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"quantized_layers\":"
                   " {\"model.layers.1.self_attn.q_proj\": {\"quant_algo\": \"FP4_MAGIC\"}}}}",
                   "quantized_layers.model.layers.1.self_attn.q_proj.quant_algo: unknown "
                   "quantization algorithm \"FP4_MAGIC\"");
    expect_invalid("{\"quantization\": {\"quant_algo\": \"fp8_pb\"}}",
                   "quant_algo: unknown quantization algorithm \"fp8_pb\"");
    expect_invalid("{\"quantization\": {\"quant_algo\": \"FP8_PB_WO\", \"group_size\": 64}}",
                   "quant_algo: FP8_BLOCK_SCALES with group_size 64");
    expect_invalid("{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\"}}",
                   "quantized_layers: missing");
    expect_invalid("{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"quantized_layers\":"
                   " {\"a.b\": {\"group_size\": 16}}}}",
                   "quantized_layers.a.b.quant_algo: missing");
    expect_invalid("{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"quantized_layers\":"
                   " {\"a.experts\": {\"quant_algo\": \"nvfp4\", \"group_size\": 32}}}}",
                   "quantized_layers.a.experts.quant_algo: NVFP4 with group_size 32");
    expect_invalid("{\"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": 8}}",
                   "quant_algo: NVFP4 with group_size 8");
    /* an unknown name in use resolves as "other", by name */
    k3_quant_config qc = parse_ok("{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\","
                                  " \"quantized_layers\": {\"model.layers.1.x\": {\"quant_algo\":"
                                  " \"FP4_MAGIC\"}}}}",
                                  NULL);
    k3_qdecl d = resolve(&qc, "model.layers.1.x");
    assert_int_equal(d.scheme, K3_QS_OTHER);
    assert_string_equal(d.algo, "FP4_MAGIC");
    k3_quant_config_free(&qc);
}

static void test_exclude_wildcards(void **state) {
    (void)state;
    k3_quant_config qc = parse_ok(NVFP4_HF, NULL);
    k3_qdecl d = resolve(&qc, "language_model.model.layers.5.block_sparse_moe.gate");
    assert_int_equal(d.scheme, K3_QS_NONE);
    assert_string_equal(d.matched, "*block_sparse_moe.gate");
    assert_int_equal(resolve(&qc, "lm_head").scheme, K3_QS_NONE); /* via language_model. variant */
    assert_int_equal(resolve(&qc, "model.layers.0.mlp.gate_proj").scheme, K3_QS_NONE);
    k3_quant_config_free(&qc);
    /* exclusion wins over a single-format algo, and matches ancestors */
    qc = parse_ok("{\"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": 16,"
                  " \"exclude_modules\": [\"model.layers.*.self_attn\", \"*shared_experts*\"]}}",
                  NULL);
    assert_int_equal(resolve(&qc, "model.layers.9.self_attn.q_proj").scheme, K3_QS_NONE);
    assert_int_equal(resolve(&qc, "model.layers.9.block_sparse_moe.shared_experts.up_proj").scheme,
                     K3_QS_NONE);
    d = resolve(&qc, "model.layers.9.block_sparse_moe.experts.3.w1");
    assert_int_equal(d.scheme, K3_QS_NVFP4);
    assert_int_equal(d.group_size, 16);
    k3_quant_config_free(&qc);
    /* the matcher itself: `*` spans dots; everything else is literal */
    k3_qpattern p;
    k3_error e = {0};
    assert_int_equal(k3_qpattern_compile(&p, "model.layers.*.mlp*", "t", &e), K3_OK);
    assert_true(k3_qpattern_match(&p, "model.layers.12.mlp.down_proj"));
    assert_true(k3_qpattern_match(&p, "model.layers.12.mlp"));
    assert_false(k3_qpattern_match(&p, "model.layers.12.self_attn"));
    assert_false(k3_qpattern_match(&p, "xmodel.layers.1.mlp"));
    k3_qpattern_free(&p);
    assert_int_equal(k3_qpattern_compile(&p, "a[1].b?", "t", &e), K3_OK);
    assert_true(k3_qpattern_match(&p, "a[1].b?"));
    assert_false(k3_qpattern_match(&p, "a1.bc"));
    k3_qpattern_free(&p);
}

static void test_experts_per_layer(void **state) {
    (void)state;
    k3_quant_config qc = parse_ok(NVFP4_HF, NULL);
    k3_error e = {0};
    k3_qdecl d;
    for (int l = 1; l <= 3; l++) { /* all variants, one mlp.experts spelling, per expert */
        assert_int_equal(k3_quant_resolve_experts(&qc, l, &d, &e), K3_OK);
        assert_int_equal(d.scheme, K3_QS_NVFP4);
        assert_int_equal(d.group_size, 16);
        assert_false(d.defaulted);
    }
    assert_int_equal(k3_quant_resolve_experts(&qc, 4, &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_MXFP4); /* nothing declared: W4A8_MXFP4_MXFP8 default */
    assert_true(d.defaulted);
    assert_string_equal(d.algo, "W4A8_MXFP4_MXFP8");
    assert_int_equal(d.group_size, 32);
    assert_int_equal(k3_quant_resolve_experts(&qc, -1, &d, &e), K3_ERR_ARG);
    k3_quant_config_free(&qc);
    /* experts excluded and declared nowhere: plain, not the MXFP4 default */
    qc = parse_ok("{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"quantized_layers\": {"
                  " \"model.layers.1.block_sparse_moe.experts\": {\"quant_algo\": \"NVFP4\"}},"
                  " \"exclude_modules\": [\"model.layers.6.block_sparse_moe.experts\"]}}",
                  NULL);
    assert_int_equal(k3_quant_resolve_experts(&qc, 6, &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_NONE);
    assert_false(d.defaulted);
    assert_string_equal(d.matched, "model.layers.6.block_sparse_moe.experts");
    assert_int_equal(k3_quant_resolve_experts(&qc, 1, &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_NVFP4);
    assert_int_equal(d.group_size, 16); /* absent group_size: the format's own */
    k3_quant_config_free(&qc);
    /* disagreeing declarations of one layer's experts are an error naming both */
    qc = parse_ok("{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"quantized_layers\": {"
                  " \"model.layers.5.block_sparse_moe.experts\": {\"quant_algo\": \"NVFP4\", "
                  "\"group_size\": 16},"
                  " \"language_model.model.layers.5.block_sparse_moe.experts.2.w2\": "
                  "{\"quant_algo\": \"fp8_pb_wo\"}}}}",
                  NULL);
    assert_int_equal(k3_quant_resolve_experts(&qc, 5, &d, &e), K3_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "layer 5 routed experts"));
    assert_non_null(strstr(e.msg, "model.layers.5.block_sparse_moe.experts"));
    assert_non_null(strstr(e.msg, "experts.2.w2"));
    k3_quant_config_free(&qc);
    /* no quantization config at all: plain experts, no MXFP4 default */
    k3_quant_config none;
    k3_quant_config_init(&none);
    assert_int_equal(k3_quant_resolve_experts(&none, 1, &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_NONE);
    k3_quant_config_free(&none);
}

/* The original moonshotai/Kimi-K3 quantization_config (fixture). */
static cJSON *k3_original_qc(cJSON **root) {
    k3_error e = {0};
    if (k3_json_parse_file(root, "tests/data/configs/kimi_k3.json", 1 << 20, &e))
        fail_msg("%s", e.msg);
    return cJSON_GetObjectItemCaseSensitive(*root, "quantization_config");
}

static void test_ct_mxfp4_original(void **state) {
    (void)state;
    cJSON *root = NULL, *inl = k3_original_qc(&root);
    k3_quant_config qc;
    k3_error e = {0};
    assert_int_equal(
        k3_quant_config_parse(&qc, NULL, NULL, inl, "config.json: quantization_config", &e), K3_OK);
    cJSON_Delete(root);
    assert_int_equal(qc.source, K3_QSRC_COMPRESSED_TENSORS);
    assert_int_equal(k3_quant_config_validate(&qc, &e), K3_OK);
    assert_int_equal(qc.n_groups, 1);
    assert_int_equal(qc.groups[0].scheme, K3_QS_MXFP4);
    /* re: ignore patterns */
    static const char *const ignored[] = {
        "language_model.model.layers.3.self_attn.kv_b_proj",
        "language_model.model.layers.1.block_sparse_moe.shared_experts.down_proj",
        "language_model.model.layers.0.mlp.gate_proj",
        "language_model.lm_head",
        "vision_tower.encoder.blocks.0.mlp.fc0",
        "mm_projector.proj.0"};
    for (int i = 0; i < 6; i++) {
        k3_qdecl d = resolve(&qc, ignored[i]);
        if (d.scheme != K3_QS_NONE)
            fail_msg("%s should be ignored", ignored[i]);
        assert_true(strncmp(d.matched, "re:", 3) == 0);
    }
    k3_qdecl d = resolve(&qc, "language_model.model.layers.1.block_sparse_moe.experts.5.w1");
    assert_int_equal(d.scheme, K3_QS_MXFP4);
    assert_true(d.by_class); /* targets Linear */
    /* re: is anchored at the start of the name (Python re.match), not a search */
    k3_qpattern p;
    assert_int_equal(k3_qpattern_compile(&p, "re:lm_head", "t", &e), K3_OK);
    assert_true(k3_qpattern_match(&p, "lm_head"));
    assert_false(k3_qpattern_match(&p, "language_model.lm_head"));
    k3_qpattern_free(&p);
    assert_int_equal(d.group_size, 32);
    assert_int_equal(k3_quant_resolve_experts(&qc, 7, &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_MXFP4);
    assert_false(d.defaulted);
    k3_quant_config_free(&qc);
}

static void test_ct_dispatch(void **state) {
    (void)state;
    static const struct {
        const char *format; /* NULL: none written */
        const char *type;
        int bits, group;
        int status;
        k3_qscheme scheme;
    } cases[] = {
        {"nvfp4-pack-quantized", "float", 4, 16, K3_OK, K3_QS_NVFP4_CT},
        {"nvfp4-pack-quantized", "float", 4, 32, K3_ERR_FORMAT, 0},
        {"nvfp4-pack-quantized", "int", 4, 16, K3_ERR_FORMAT, 0},
        {"mxfp4-pack-quantized", "float", 4, 32, K3_OK, K3_QS_MXFP4},
        {"mxfp4-pack-quantized", "float", 4, 16, K3_ERR_FORMAT, 0},
        {"mxfp4-pack-quantized", "float", 8, 32, K3_ERR_FORMAT, 0},
        {NULL, "float", 4, 16, K3_OK, K3_QS_NVFP4_CT},
        {NULL, "float", 4, 32, K3_OK, K3_QS_MXFP4},
        {"float-quantized", "float", 8, 128, K3_OK, K3_QS_OTHER},
        {"pack-quantized", "int", 4, 128, K3_OK, K3_QS_OTHER},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char fmt[96] = "";
        if (cases[i].format)
            snprintf(fmt, sizeof fmt, "\"format\": \"%s\",", cases[i].format);
        char buf[1024];
        snprintf(buf, sizeof buf,
                 "{\"quant_method\": \"compressed-tensors\", %s \"config_groups\": {\"group_0\":"
                 " {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": %d, \"type\": \"%s\","
                 " \"group_size\": %d}}}, \"ignore\": [\"lm_head\"]}",
                 fmt, cases[i].bits, cases[i].type, cases[i].group);
        cJSON *j = js(buf);
        k3_quant_config qc;
        k3_error e = {0};
        int rc = k3_quant_config_parse(&qc, NULL, NULL, j, "qc", &e);
        cJSON_Delete(j);
        if (rc != cases[i].status)
            fail_msg("case %zu: status %d, expected %d (%s)", i, rc, cases[i].status, e.msg);
        if (rc == K3_OK) {
            assert_int_equal(qc.groups[0].scheme, cases[i].scheme);
            assert_int_equal(resolve(&qc, "model.layers.2.self_attn.q_proj").scheme,
                             cases[i].scheme);
            assert_int_equal(resolve(&qc, "lm_head").scheme, K3_QS_NONE);
        } else {
            assert_non_null(strstr(e.msg, "qc: config_groups.group_0: format"));
        }
        k3_quant_config_free(&qc);
    }
    /* name and regex targets win over the Linear class target */
    k3_quant_config qc = parse_ok(
        NULL, "{\"quant_method\": \"compressed-tensors\", \"config_groups\": {"
              " \"group_0\": {\"targets\": [\"Linear\"], \"format\": \"mxfp4-pack-quantized\","
              "   \"weights\": {\"num_bits\": 4, \"type\": \"float\", \"group_size\": 32}},"
              " \"group_1\": {\"targets\": [\"re:.*experts\\\\.[0-9]+\\\\.w[13]$\"], \"format\": "
              "\"nvfp4-pack-quantized\","
              "   \"weights\": {\"num_bits\": 4, \"type\": \"float\", \"group_size\": 16}}}}");
    k3_qdecl d = resolve(&qc, "model.layers.1.block_sparse_moe.experts.3.w1");
    assert_int_equal(d.scheme, K3_QS_NVFP4_CT);
    assert_false(d.by_class);
    assert_int_equal(resolve(&qc, "model.layers.1.block_sparse_moe.experts.3.w2").scheme,
                     K3_QS_MXFP4);
    k3_error e = {0};
    assert_int_equal(k3_quant_resolve_experts(&qc, 1, &d, &e), K3_ERR_FORMAT); /* w1 vs w2 */
    k3_quant_config_free(&qc);
    qc = parse_ok(
        NULL, "{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"g\":"
              " {\"targets\": [\"Embedding\"], \"weights\": {\"num_bits\": 4, \"type\": \"float\","
              " \"group_size\": 16}}}}");
    assert_int_equal(k3_quant_config_validate(&qc, &e), K3_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "class target \"Embedding\""));
    k3_quant_config_free(&qc);
}

/* A malformed declaration (a name no QuantAlgo has, a compressed-tensors object naming another
 * quant_method) is K3_ERR_FORMAT, so `k3 inspect` fails on it; a real config of a method k3
 * does not run stays K3_ERR_UNSUPPORTED (inspect only skips its per-layer summary). */
static void test_malformed_is_not_unsupported(void **state) {
    (void)state;
    k3_quant_config qc = parse_ok("{\"quantization\": {\"quant_algo\": \"FOO\"}}", NULL);
    k3_error e = {0};
    assert_int_equal(k3_quant_config_validate(&qc, &e), K3_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "quant_algo: unknown quantization algorithm \"FOO\""));
    k3_quant_config_free(&qc);
    cJSON *j = js("{\"quant_method\": \"gptq\", \"format\": \"nvfp4-pack-quantized\", "
                  "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"]}}}");
    assert_int_equal(k3_quant_config_parse(&qc, NULL, NULL, j, "qc", &e), K3_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "qc: quant_method: \"gptq\", but the object has "
                                  "compressed-tensors' config_groups"));
    cJSON_Delete(j);
    j = js("{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128}");
    assert_int_equal(k3_quant_config_parse(&qc, NULL, NULL, j, "qc", &e), K3_ERR_UNSUPPORTED);
    cJSON_Delete(j);
}

static void test_bad_regex(void **state) {
    (void)state;
    cJSON *j = js("{\"quant_method\": \"compressed-tensors\", \"format\": \"mxfp4-pack-quantized\","
                  " \"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\":"
                  " {\"num_bits\": 4, \"type\": \"float\", \"group_size\": 32}}},"
                  " \"ignore\": [\"lm_head\", \"re:.*layers\\\\.(1|2.*\"]}");
    k3_quant_config qc;
    k3_error e = {0};
    assert_int_equal(
        k3_quant_config_parse(&qc, NULL, NULL, j, "config.json: quantization_config", &e),
        K3_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "config.json: quantization_config: ignore[1]: bad regular "
                                  "expression \"re:.*layers\\.(1|2.*\""));
    cJSON_Delete(j);
    k3_quant_config_free(&qc); /* parse left it freed; freeing again is safe */
    j = js(
        "{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"group_0\": {\"targets\":"
        " [\"re:[z-a]\"], \"weights\": {\"num_bits\": 4, \"type\": \"float\", \"group_size\": "
        "32}}}}");
    assert_int_equal(k3_quant_config_parse(&qc, NULL, NULL, j, "qc", &e), K3_ERR_FORMAT);
    assert_non_null(
        strstr(e.msg, "config_groups.group_0.targets[0]: bad regular expression \"re:[z-a]\""));
    cJSON_Delete(j);
}

/* A regex PCRE2 gives up on (its match limit, on a catastrophically backtracking pattern) is
 * an error naming the pattern and the module, in every resolution path; it used to read as
 * "no match", so an ignored module came out quantized. A name it can decide still resolves. */
static void test_regex_match_limit(void **state) {
    (void)state;
    char name[1024];
    memset(name, 'a', 900);
    strcpy(name + 900, "b");
    k3_quant_config qc;
    k3_qdecl d;
    k3_error e = {0};
    cJSON *j = js("{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"group_0\":"
                  " {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"float\","
                  " \"group_size\": 32}}}, \"ignore\": [\"re:(a|aa)+$\"]}");
    assert_int_equal(k3_quant_config_parse(&qc, NULL, NULL, j, "qc", &e), K3_OK);
    cJSON_Delete(j);
    assert_int_equal(k3_quant_resolve(&qc, "aaaa", &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_NONE); /* ignored */
    assert_int_equal(k3_quant_resolve(&qc, "layers.0.w1", &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_MXFP4);
    assert_int_equal(k3_quant_resolve(&qc, name, &d, &e), K3_ERR_LIMIT);
    assert_non_null(strstr(e.msg, "quantization pattern \"re:(a|aa)+$\" on \"aaaa"));
    assert_int_equal(d.scheme, K3_QS_NONE);
    k3_quant_config_free(&qc);

    /* a compressed-tensors target, and a ModelOpt exclude through the expert resolver */
    j = js("{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"group_0\":"
           " {\"targets\": [\"re:(a|aa)+$\"], \"weights\": {\"num_bits\": 4, \"type\": \"float\","
           " \"group_size\": 16}}}}");
    assert_int_equal(k3_quant_config_parse(&qc, NULL, NULL, j, "qc", &e), K3_OK);
    cJSON_Delete(j);
    assert_int_equal(k3_quant_resolve(&qc, name, &d, &e), K3_ERR_LIMIT);
    k3_quant_config_free(&qc);
    j = js("{\"quantization\": {\"quant_algo\": \"NVFP4\", \"exclude_modules\":"
           " [\"re:(.|..)+(x|y)$\"]}}");
    assert_int_equal(k3_quant_config_parse(&qc, j, "hf", NULL, NULL, &e), K3_OK);
    cJSON_Delete(j);
    /* (.|..)+ has Fibonacci(len) ways to split a name: even the expert module gives up */
    assert_int_equal(k3_quant_resolve_experts(&qc, 3, &d, &e), K3_ERR_LIMIT);
    assert_non_null(strstr(e.msg, "on \"language_model.model.layers.3.block_sparse_moe.experts\""));
    assert_int_equal(k3_quant_resolve(&qc, name, &d, &e), K3_ERR_LIMIT);
    assert_false(k3_qpattern_match(&qc.exclude[0], name)); /* the unchecked form: no match */
    k3_quant_config_free(&qc);
}

static void test_other_errors(void **state) {
    (void)state;
    k3_quant_config qc;
    k3_error e = {0};
    cJSON *j = js("{\"producer\": {\"name\": \"modelopt\"}}");
    assert_int_equal(k3_quant_config_parse(&qc, j, "hf_quant_config.json", NULL, NULL, &e),
                     K3_ERR_MISSING);
    assert_string_equal(e.msg, "hf_quant_config.json: quantization: missing");
    cJSON_Delete(j);
    j = js("{\"quant_method\": \"awq\", \"bits\": 4}");
    assert_int_equal(k3_quant_config_parse(&qc, NULL, NULL, j, "qc", &e), K3_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "qc: quant_method: \"awq\" is not supported"));
    cJSON_Delete(j);
    j = js("{\"quantization\": {\"quant_algo\": 4}}");
    assert_int_equal(k3_quant_config_parse(&qc, j, "h", NULL, NULL, &e), K3_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "quant_algo: expected a string or null"));
    cJSON_Delete(j);
    j = js("{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"group_0\": "
           "{\"targets\": []}}}");
    assert_int_equal(k3_quant_config_parse(&qc, NULL, NULL, j, "qc", &e), K3_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "config_groups.group_0.targets: expected a non-empty array"));
    cJSON_Delete(j);
}

static void test_divergence(void **state) {
    (void)state;
    const char *same = "{\"quant_method\": \"modelopt\", \"quant_algo\": \"MIXED_PRECISION\","
                       " \"ignore\": [\"*block_sparse_moe.gate\", \"language_model.lm_head\", "
                       "\"model.layers.0.mlp*\"],"
                       " \"kv_cache_scheme\": null, \"quantized_layers\": %s}";
    /* the inline copy: the same layers, read from the authoritative file's JSON */
    cJSON *hf = js(NVFP4_HF);
    char *layers = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(hf, "quantization"), "quantized_layers"));
    size_t cap = strlen(layers) + strlen(same) + 64;
    char *buf = malloc(cap);
    snprintf(buf, cap, same, layers);
    k3_quant_config qc = parse_ok(NVFP4_HF, buf);
    assert_false(qc.inline_diverges);
    k3_quant_config_free(&qc);
    /* one entry differs: hf wins, a warning is recorded naming the entry */
    char *p = strstr(buf, "\"FP8_PB_WO\"");
    assert_non_null(p);
    memcpy(p, "\"NVFP4\"    ", 11);
    qc = parse_ok(NVFP4_HF, buf);
    assert_true(qc.inline_diverges);
    assert_non_null(strstr(qc.divergence, "model.layers.3.self_attn.kv_b_proj"));
    assert_int_equal(resolve(&qc, "model.layers.3.self_attn.kv_b_proj").scheme, K3_QS_FP8_BLOCK);
    k3_quant_config_free(&qc);
    /* a different algorithm family inline */
    qc = parse_ok(NVFP4_HF,
                  "{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"g\":"
                  " {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"float\","
                  " \"group_size\": 16}}}}");
    assert_true(qc.inline_diverges);
    assert_non_null(strstr(qc.divergence, "quant_method differs"));
    k3_quant_config_free(&qc);
    free(buf);
    free(layers);
    cJSON_Delete(hf);
}

static void roundtrip_modelopt(const k3_model_config *mc, const char *prefix, unsigned flags) {
    k3_quant_config qc;
    k3_quant_config_init(&qc);
    k3_error e = {0};
    assert_int_equal(k3_quant_plan_modelopt(&qc, mc, prefix, flags, &e), K3_OK);
    cJSON *hf = NULL, *inl = NULL;
    assert_int_equal(k3_quant_config_to_hf_json(&qc, &hf, &e), K3_OK);
    assert_int_equal(k3_quant_config_to_inline_json(&qc, &inl, &e), K3_OK);
    /* the alias is written as nvidia/Kimi-K3-NVFP4 spells it */
    char *text = cJSON_PrintUnformatted(hf);
    assert_non_null(strstr(text, "\"FP8_PB_WO\""));
    free(text);
    k3_quant_config back;
    assert_int_equal(k3_quant_config_parse(&back, hf, "hf", inl, "inline", &e), K3_OK);
    assert_false(back.inline_diverges);
    assert_int_equal(k3_quant_config_validate(&back, &e), K3_OK);
    assert_int_equal(back.n_layers, qc.n_layers);
    for (size_t i = 0; i < qc.n_layers; i++) {
        assert_string_equal(back.layers[i].name, qc.layers[i].name);
        assert_string_equal(back.layers[i].algo, qc.layers[i].algo);
        assert_int_equal(back.layers[i].group_size, qc.layers[i].group_size);
    }
    for (int64_t l = 0; l < mc->num_hidden_layers; l++) {
        k3_qdecl d;
        char name[128];
        if (mc->layers[l].ffn == K3_FFN_MOE) {
            assert_int_equal(k3_quant_resolve_experts(&back, l, &d, &e), K3_OK);
            assert_int_equal(d.scheme, K3_QS_NVFP4);
            assert_int_equal(d.group_size, 16);
            snprintf(name, sizeof name, "%smodel.layers.%lld.block_sparse_moe.gate", prefix,
                     (long long)l);
            assert_int_equal(resolve(&back, name).scheme, K3_QS_NONE);
        }
        snprintf(name, sizeof name, "%smodel.layers.%lld.self_attn.%s", prefix, (long long)l,
                 mc->layers[l].attn == K3_ATTN_KDA ? "k_proj" : "kv_b_proj");
        assert_int_equal(resolve(&back, name).scheme, K3_QS_FP8_BLOCK);
    }
    k3_quant_config_free(&back);
    k3_quant_config_free(&qc);
    cJSON_Delete(hf);
    cJSON_Delete(inl);
}

static void test_roundtrip_modelopt(void **state) {
    (void)state;
    k3_model_config mc;
    k3_error e = {0};
    assert_int_equal(k3_model_config_load(&mc, "tests/data/configs/kimi_k3.json", &e), K3_OK);
    roundtrip_modelopt(&mc, "language_model.",
                       K3_QPLAN_EXPERTS_NVFP4 | K3_QPLAN_ATTN_FP8 | K3_QPLAN_ALL_PREFIXES);
    roundtrip_modelopt(&mc, "", K3_QPLAN_EXPERTS_NVFP4 | K3_QPLAN_ATTN_FP8);
    k3_model_config_free(&mc);
    assert_int_equal(k3_model_config_load(&mc, "tests/data/configs/kimi_linear_48b.json", &e),
                     K3_OK);
    roundtrip_modelopt(&mc, "", K3_QPLAN_EXPERTS_NVFP4 | K3_QPLAN_ATTN_FP8);
    k3_model_config_free(&mc);
}

static void test_roundtrip_ct(void **state) {
    (void)state;
    static const char *const ignore[] = {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"};
    for (int s = 0; s < 2; s++) {
        k3_qscheme scheme = s ? K3_QS_MXFP4 : K3_QS_NVFP4_CT;
        k3_quant_config qc;
        k3_quant_config_init(&qc);
        k3_error e = {0};
        assert_int_equal(k3_quant_plan_ct(&qc, scheme, ignore, 3, &e), K3_OK);
        cJSON *inl = NULL, *hf = NULL;
        assert_int_equal(k3_quant_config_to_inline_json(&qc, &inl, &e), K3_OK);
        assert_int_equal(k3_quant_config_to_hf_json(&qc, &hf, &e), K3_ERR_ARG);
        k3_quant_config back;
        assert_int_equal(k3_quant_config_parse(&back, NULL, NULL, inl, "inline", &e), K3_OK);
        assert_int_equal(k3_quant_config_validate(&back, &e), K3_OK);
        assert_string_equal(back.ct_format, s ? "mxfp4-pack-quantized" : "nvfp4-pack-quantized");
        assert_int_equal(back.groups[0].scheme, scheme);
        assert_int_equal(back.groups[0].group_size, s ? 32 : 16);
        assert_int_equal(back.groups[0].input_activations, !s);
        assert_int_equal(back.n_exclude, 3);
        k3_qdecl d;
        assert_int_equal(k3_quant_resolve_experts(&back, 3, &d, &e), K3_OK);
        assert_int_equal(d.scheme, scheme);
        assert_int_equal(resolve(&back, "language_model.model.layers.3.self_attn.q_proj").scheme,
                         K3_QS_NONE);
        assert_int_equal(resolve(&back, "language_model.lm_head").scheme, K3_QS_NONE);
        k3_quant_config_free(&back);
        k3_quant_config_free(&qc);
        cJSON_Delete(inl);
    }
    k3_quant_config qc;
    k3_quant_config_init(&qc);
    k3_error e = {0};
    assert_int_equal(k3_quant_plan_ct(&qc, K3_QS_FP8_BLOCK, NULL, 0, &e), K3_ERR_ARG);
    k3_quant_config_free(&qc);
    static const char *const bad[] = {"re:(("};
    assert_int_equal(k3_quant_plan_ct(&qc, K3_QS_MXFP4, bad, 1, &e), K3_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "\"re:((\""));
    k3_quant_config_free(&qc);
}

/* The on-disk path: DIR/hf_quant_config.json plus DIR/config.json's inline copy. */
static void test_load_dir(void **state) {
    (void)state;
    char dir[] = "/tmp/k3_qc_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char p1[64], p2[64];
    snprintf(p1, sizeof p1, "%s/hf_quant_config.json", dir);
    snprintf(p2, sizeof p2, "%s/config.json", dir);
    FILE *f = fopen(p1, "w");
    fputs(NVFP4_HF, f);
    fclose(f);
    f = fopen(p2, "w");
    fputs("{\"model_type\": \"kimi_k3\", \"quantization_config\": {\"quant_method\": \"modelopt\","
          " \"quant_algo\": \"NVFP4\"}}",
          f);
    fclose(f);
    k3_quant_config qc;
    k3_error e = {0};
    assert_int_equal(k3_quant_config_load(&qc, dir, &e), K3_OK);
    assert_string_equal(qc.quant_algo, "MIXED_PRECISION"); /* the hf file wins */
    assert_true(qc.inline_diverges);
    assert_non_null(strstr(qc.divergence, "quant_algo MIXED_PRECISION vs NVFP4"));
    k3_quant_config_free(&qc);
    unlink(p1);
    assert_int_equal(k3_quant_config_load(&qc, dir, &e), K3_OK); /* inline only */
    assert_string_equal(qc.quant_algo, "NVFP4");
    k3_quant_config_free(&qc);
    unlink(p2);
    assert_int_equal(k3_quant_config_load(&qc, dir, &e), K3_ERR_IO);
    assert_non_null(strstr(e.msg, "config.json"));
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alias_per_layer),
        cmocka_unit_test(test_alias_top_level),
        cmocka_unit_test(test_unknown_rejected_at_validation),
        cmocka_unit_test(test_unknown_kv_disabled),
        cmocka_unit_test(test_exclude_wildcards),
        cmocka_unit_test(test_experts_per_layer),
        cmocka_unit_test(test_ct_mxfp4_original),
        cmocka_unit_test(test_ct_dispatch),
        cmocka_unit_test(test_bad_regex), cmocka_unit_test(test_malformed_is_not_unsupported),
        cmocka_unit_test(test_regex_match_limit),
        cmocka_unit_test(test_other_errors),
        cmocka_unit_test(test_divergence),
        cmocka_unit_test(test_roundtrip_modelopt),
        cmocka_unit_test(test_roundtrip_ct),
        cmocka_unit_test(test_load_dir),
    };
    return cmocka_run_group_tests_name("quant_config", tests, NULL, NULL);
}
