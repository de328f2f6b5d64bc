/* make-tiny: option parsing, the files it writes (configs that parse back to the preset,
 * the quantization declaration per format, a well-formed tiktoken BPE file with the K3
 * specials), the size of each preset (k3-layer sized by a dry run: ~16.6 GB of NVFP4
 * experts, never written here), and byte-identical output for the same seed. Round-trips
 * of the weights are in test_load.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json.h"
#include "load/tiny.h"
#include "rm_tree.h"

static char root[256];

static int setup(void **state) {
    (void)state;
    snprintf(root, sizeof root, "/tmp/k3-test-tiny-XXXXXX");
    return mkdtemp(root) ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    rm_tree(root);
    return 0;
}

static void test_options(void **s) {
    (void)s;
    k3_error e = {0};
    char dir[300];
    snprintf(dir, sizeof dir, "%s/x", root);
    k3_make_tiny_opts o = {.dir = dir, .format = "fp4"};
    assert_int_equal(k3_make_tiny_checkpoint(&o, &e), K3_ERR_ARG);
    assert_non_null(strstr(e.msg, "--format"));
    assert_non_null(strstr(e.msg, "'fp4'"));
    o.format = "bf16", o.preset = "huge";
    assert_int_equal(k3_make_tiny_checkpoint(&o, &e), K3_ERR_ARG);
    assert_non_null(strstr(e.msg, "--preset"));
    o.preset = NULL, o.dir = NULL;
    assert_int_equal(k3_make_tiny_checkpoint(&o, &e), K3_ERR_ARG);
    assert_non_null(strstr(e.msg, "dir"));
}

static void test_sizes(void **s) {
    (void)s;
    k3_error e = {0};
    uint64_t b;
    k3_tiny_opts o = {.format = K3_TINY_NVFP4, .preset = K3_TINY_TINY};
    assert_int_equal(k3_tiny_bytes(&o, &b, &e), K3_OK);
    assert_true(b > 1000000 && b < 8000000); /* "a few MB" */
    o.preset = K3_TINY_SMALL;
    assert_int_equal(k3_tiny_bytes(&o, &b, &e), K3_OK);
    assert_true(b > 10000000 && b < 100000000); /* tens of MB */
    /* k3-layer: 896 experts x 3 x 3072 x 3584 at 0.5625 bytes = 16.65 GB, plus the one
     * layer's attention, shared experts and latent projections */
    o.preset = K3_TINY_K3_LAYER;
    assert_int_equal(k3_tiny_bytes(&o, &b, &e), K3_OK);
    uint64_t experts = 896ull * 3 * 3072 * 3584 * 9 / 16;
    assert_true(b > experts && b < experts + 1500000000ull);
    k3_model_config mc;
    assert_int_equal(k3_tiny_config(K3_TINY_K3_LAYER, &mc, &e), K3_OK);
    assert_int_equal(mc.num_experts, 896);
    assert_int_equal(mc.num_experts_per_token, 16);
    assert_int_equal(mc.routed_expert_hidden_size, 3584);
    assert_int_equal(mc.moe_intermediate_size, 3072);
    assert_int_equal(mc.layers[0].ffn, K3_FFN_MOE);
    k3_model_config_free(&mc);
}

static void read_file(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc(*len + 1);
    assert_int_equal(fread(*out, 1, *len, f), *len);
    (*out)[*len] = 0;
    fclose(f);
}

static int b64val(char c) {
    const char *t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *p = strchr(t, c);
    return c && p ? (int)(p - t) : -1;
}
static int unb64(const char *s, size_t n, unsigned char *out) {
    int o = 0;
    for (size_t i = 0; i + 3 < n + 1 && i < n; i += 4) {
        int a = b64val(s[i]), b = b64val(s[i + 1]), c = s[i + 2] == '=' ? 0 : b64val(s[i + 2]),
            d = s[i + 3] == '=' ? 0 : b64val(s[i + 3]);
        assert_true(a >= 0 && b >= 0 && c >= 0 && d >= 0);
        unsigned v = (unsigned)(a << 18 | b << 12 | c << 6 | d);
        out[o++] = (unsigned char)(v >> 16);
        if (s[i + 2] != '=') out[o++] = (unsigned char)(v >> 8);
        if (s[i + 3] != '=') out[o++] = (unsigned char)v;
    }
    return o;
}

static void test_files(void **s) {
    (void)s;
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/tiny-mxfp4", root);
    k3_tiny_opts o = {.dir = dir, .format = K3_TINY_MXFP4, .preset = K3_TINY_TINY, .seed = 3};
    k3_error e = {0};
    assert_int_equal(k3_make_tiny(&o, &e), K3_OK);
    /* config.json parses back to the preset */
    k3_model_config a, b;
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(k3_model_config_load(&a, path, &e), K3_OK);
    assert_int_equal(k3_tiny_config(K3_TINY_TINY, &b, &e), K3_OK);
    assert_true(a.wrapped);
    assert_int_equal(a.num_experts, b.num_experts);
    assert_true(a.num_experts >= 16 && a.num_experts_per_token == 4);
    assert_int_equal(a.attn_res_block_size, 2);
    assert_int_equal(a.hidden_act, K3_ACT_SITU);
    assert_int_equal(a.layers[0].ffn, K3_FFN_DENSE);
    assert_true(a.n_kda > 0 && a.n_mla > 0);
    assert_true(a.routed_expert_hidden_size > 0 && a.latent_moe_use_norm);
    k3_model_config_free(&a), k3_model_config_free(&b);
    /* mxfp4: compressed-tensors, experts MXFP4, no hf_quant_config.json */
    k3_quant_config qc;
    assert_int_equal(k3_quant_config_load(&qc, dir, &e), K3_OK);
    assert_int_equal(qc.source, K3_QSRC_COMPRESSED_TENSORS);
    k3_qdecl d;
    assert_int_equal(k3_quant_resolve_experts(&qc, 1, &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_MXFP4);
    k3_quant_config_free(&qc);
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    FILE *f = fopen(path, "r");
    assert_null(f);
    /* tiktoken.model: ranks in order; every merged token splits into two earlier tokens */
    char *txt;
    size_t len;
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    read_file(path, &txt, &len);
    static unsigned char tok[1024][64];
    static int tl[1024];
    int n = 0;
    for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n"), n++) {
        char *sp = strchr(line, ' ');
        assert_non_null(sp);
        assert_int_equal(atoi(sp + 1), n);
        assert_true(n < 1024);
        tl[n] = unb64(line, (size_t)(sp - line), tok[n]);
        if (n < 256) {
            assert_int_equal(tl[n], 1);
            assert_int_equal(tok[n][0], n);
            continue;
        }
        bool split = false;
        for (int cut = 1; cut < tl[n] && !split; cut++) {
            bool l = false, r = false;
            for (int k = 0; k < n; k++) {
                l |= tl[k] == cut && !memcmp(tok[k], tok[n], (size_t)cut);
                r |= tl[k] == tl[n] - cut && !memcmp(tok[k], tok[n] + cut, (size_t)(tl[n] - cut));
            }
            split = l && r;
        }
        if (!split) fail_msg("token %d is not a merge of earlier tokens", n);
        for (int k = 0; k < n; k++)
            if (tl[k] == tl[n] && !memcmp(tok[k], tok[n], (size_t)tl[n])) fail_msg("token %d repeats %d", n, k);
    }
    assert_int_equal(n, 1024 - 256);
    free(txt);
    /* specials: [BOS] at base, <|end_of_msg|> (eos_token_id) at base + 2, [PAD] last */
    cJSON *j;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    assert_int_equal(k3_json_parse_file(&j, path, 1 << 20, &e), K3_OK);
    cJSON *dec = cJSON_GetObjectItem(j, "added_tokens_decoder");
    assert_int_equal(cJSON_GetArraySize(dec), 256);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(dec, "768"), "content")->valuestring, "[BOS]");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(dec, "770"), "content")->valuestring, "<|end_of_msg|>");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(dec, "1023"), "content")->valuestring, "[PAD]");
    cJSON_Delete(j);
}

static void test_modelopt_declaration(void **s) {
    (void)s;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/tiny-nvfp4", root);
    k3_tiny_opts o = {.dir = dir, .format = K3_TINY_NVFP4, .preset = K3_TINY_TINY, .seed = 1};
    k3_error e = {0};
    assert_int_equal(k3_make_tiny(&o, &e), K3_OK);
    k3_quant_config qc;
    assert_int_equal(k3_quant_config_load(&qc, dir, &e), K3_OK);
    assert_int_equal(qc.source, K3_QSRC_MODELOPT);
    assert_false(qc.inline_diverges);
    k3_qdecl d;
    for (int l = 1; l < 4; l++) {
        assert_int_equal(k3_quant_resolve_experts(&qc, l, &d, &e), K3_OK);
        assert_int_equal(d.scheme, K3_QS_NVFP4);
    }
    assert_int_equal(k3_quant_resolve(&qc, "language_model.model.layers.3.self_attn.kv_b_proj", &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_FP8_BLOCK);
    assert_int_equal(k3_quant_resolve(&qc, "language_model.model.layers.1.block_sparse_moe.gate", &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_NONE);
    k3_quant_config_free(&qc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options), cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_files), cmocka_unit_test(test_modelopt_declaration),
    };
    return cmocka_run_group_tests_name("make_tiny", tests, setup, teardown);
}
