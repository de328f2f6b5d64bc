/* libFuzzer target: the config parsers, config.json (k3_model_config_parse) and the
 * quantization declarations (k3_quant_config_parse), fed through the strict JSON layer
 * (k3_json_parse) as the loader feeds them.
 *
 * Each input is one JSON text, tried as config.json, as hf_quant_config.json, as an inline
 * quantization_config, and as both at once (the divergence check). Beyond "no crash, no
 * leak, every failure says why", an accepted input must round-trip: the writer's tree
 * parses back to an equal model config, and an accepted quantization config resolves every
 * module it names, and a set of K3 module names, to the same declaration after writing and
 * re-reading. Left out: the file readers (k3_*_load), which add only the path handling. */
#include "io/json.h"
#include "io/model_config.h"
#include "io/quant_config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A failure must say what is wrong. */
static void need_msg(const k3_error *e) {
    if (e->msg[0] == '\0')
        abort();
}

static void model_config(const cJSON *root) {
    k3_model_config mc;
    k3_error e = {0};
    if (k3_model_config_parse(&mc, root, "fuzz config.json", &e) != K3_OK) {
        need_msg(&e);
        if (mc.layers) /* a failed parse leaves nothing to free */
            abort();
        return;
    }
    if (k3_model_config_validate(&mc, "fuzz", &e) != K3_OK)
        abort();
    if (mc.n_kda + mc.n_mla != mc.num_hidden_layers || mc.n_moe > mc.num_hidden_layers)
        abort();
    cJSON *out = NULL;
    if (k3_model_config_to_json(&mc, &out, &e) != K3_OK)
        abort();
    k3_model_config back;
    if (k3_model_config_parse(&back, out, "fuzz round trip", &e) != K3_OK)
        abort();
    cJSON_Delete(out);
    /* equal field for field: both were memset before parsing, so padding compares too */
    k3_model_config a;
    memcpy(&a, &mc, sizeof a);
    a.layers = back.layers;
    if (memcmp(&a, &back, sizeof a) ||
        memcmp(mc.layers, back.layers, (size_t)mc.num_hidden_layers * sizeof *mc.layers))
        abort();
    k3_model_config_free(&back);
    k3_model_config_free(&mc);
}

static const char *const k3_modules[] = {
    "language_model.model.layers.0.self_attn.q_proj",
    "language_model.model.layers.1.block_sparse_moe.experts.7.w1",
    "model.layers.1.block_sparse_moe.experts.0.w2",
    "layers.2.mlp.experts.3.w3",
    "language_model.model.layers.1.block_sparse_moe.gate",
    "language_model.model.layers.3.self_attn.kv_b_proj",
    "language_model.lm_head",
    "lm_head",
    "vision_tower.encoder.blocks.0.mlp.fc0",
    "",
    ".",
};
#define N_MODULES (sizeof k3_modules / sizeof k3_modules[0])

static void resolve_all(const k3_quant_config *qc, k3_qdecl *d, int *rc, size_t cap) {
    size_t k = 0;
    k3_error e = {0};
    for (size_t i = 0; i < N_MODULES && k < cap; i++, k++)
        rc[k] = k3_quant_resolve(qc, k3_modules[i], &d[k], &e);
    for (int64_t l = 0; l < 4 && k < cap; l++, k++)
        rc[k] = k3_quant_resolve_experts(qc, l, &d[k], &e);
    for (; k < cap; k++)
        rc[k] = -1;
}

/* Declarations the writer must preserve: which scheme, which group size, defaulted. */
static bool same(const k3_qdecl *a, const k3_qdecl *b) {
    return a->scheme == b->scheme && a->group_size == b->group_size && a->by_class == b->by_class &&
           a->defaulted == b->defaulted;
}

#define N_CHECK (N_MODULES + 4)

static void round_trip(const k3_quant_config *qc, bool hf) {
    k3_error e = {0};
    cJSON *out = NULL;
    int rc = hf ? k3_quant_config_to_hf_json(qc, &out, &e)
                : k3_quant_config_to_inline_json(qc, &out, &e);
    if (rc != K3_OK) {
        need_msg(&e);
        /* hf_quant_config.json is ModelOpt-only; compressed-tensors groups k3 does not
         * decode are not written; nothing else may fail */
        if (!(hf && qc->source != K3_QSRC_MODELOPT) && rc != K3_ERR_UNSUPPORTED)
            abort();
        return;
    }
    k3_quant_config back;
    rc = hf ? k3_quant_config_parse(&back, out, "rt hf", NULL, NULL, &e)
            : k3_quant_config_parse(&back, NULL, NULL, out, "rt inline", &e);
    cJSON_Delete(out);
    if (rc != K3_OK || k3_quant_config_validate(&back, &e) != K3_OK)
        abort();
    k3_qdecl d1[N_CHECK], d2[N_CHECK];
    int r1[N_CHECK], r2[N_CHECK];
    resolve_all(qc, d1, r1, N_CHECK);
    resolve_all(&back, d2, r2, N_CHECK);
    for (size_t i = 0; i < N_CHECK; i++)
        if (r1[i] != r2[i] || (r1[i] == K3_OK && !same(&d1[i], &d2[i])))
            abort();
    /* every module the config names resolves alike */
    for (size_t i = 0; i < qc->n_layers; i++) {
        k3_qdecl x, y;
        int a = k3_quant_resolve(qc, qc->layers[i].name, &x, &e);
        int b = k3_quant_resolve(&back, qc->layers[i].name, &y, &e);
        if (a != b || (a == K3_OK && !same(&x, &y)))
            abort();
    }
    k3_quant_config_free(&back);
}

static void quant_config(const cJSON *hf, const cJSON *inl) {
    k3_quant_config qc;
    k3_error e = {0};
    if (k3_quant_config_parse(&qc, hf, "fuzz hf_quant_config.json", inl, "fuzz quantization_config",
                              &e) != K3_OK) {
        need_msg(&e);
        k3_quant_config_free(&qc); /* must be harmless after a failed parse */
        return;
    }
    if (k3_quant_config_validate(&qc, &e) != K3_OK) {
        need_msg(&e);
        k3_quant_config_free(&qc);
        return;
    }
    k3_qdecl d[N_CHECK];
    int r[N_CHECK];
    resolve_all(&qc, d, r, N_CHECK);
    for (size_t i = 0; i < qc.n_layers; i++) {
        k3_qdecl x;
        if (k3_quant_resolve(&qc, qc.layers[i].name, &x, &e) != K3_OK)
            need_msg(&e);
    }
    if (qc.source != K3_QSRC_NONE) {
        round_trip(&qc, true);
        round_trip(&qc, false);
    }
    k3_quant_config_free(&qc);
    k3_quant_config_free(&qc); /* documented safe twice */
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    k3_log_set_level(K3_LOG_ERROR); /* the divergence warning would flood the run */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cJSON *root = NULL;
    k3_error e = {0};
    if (k3_json_parse(&root, (const char *)data, size, "fuzz", &e) != K3_OK) {
        need_msg(&e);
        return 0;
    }
    model_config(root);
    const cJSON *inl = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    quant_config(root, NULL);
    quant_config(NULL, root);
    if (inl) {
        quant_config(NULL, inl);
        quant_config(root, inl);
    }
    cJSON_Delete(root);
    return 0;
}
