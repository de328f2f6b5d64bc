/* Building quantization declarations for make-tiny / quantize and writing them the way the
 * published checkpoints do: a ModelOpt MIXED_PRECISION hf_quant_config.json plus its flat
 * inline copy (nvidia/Kimi-K3-NVFP4), or a compressed-tensors quantization_config
 * (nvfp4-pack-quantized / mxfp4-pack-quantized). What is written parses back to the same
 * declarations (tested); values the parser ignores (config_groups of the flat ModelOpt
 * shape) are a derived summary for other readers. */
#include "io/quant_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int oom(k3_error *err) {
    return k3_fail(err, K3_ERR_NOMEM, "quant config: out of memory");
}

int k3_quant_config_add_layer(k3_quant_config *qc, const char *name, const char *algo,
                              int64_t group_size, k3_error *err) {
    if (qc->source == K3_QSRC_COMPRESSED_TENSORS)
        return k3_fail(err, K3_ERR_ARG, "quant config: quantized_layers are ModelOpt-only (\"%s\")",
                       name);
    if (!name || !*name || !algo)
        return k3_fail(err, K3_ERR_ARG, "quant config: a layer entry needs a name and an algo");
    /* sorted insert: the resolver bsearches */
    size_t lo = 0, hi = qc->n_layers;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(qc->layers[mid].name, name);
        if (!c)
            return k3_fail(err, K3_ERR_DUPLICATE, "quant config: quantized_layers.%s: added twice",
                           name);
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    k3_qlayer *nl = realloc(qc->layers, (qc->n_layers + 1) * sizeof *nl);
    if (!nl)
        return oom(err);
    qc->layers = nl;
    const char *canon = k3_quant_algo_canonical(algo);
    k3_qlayer l = {.name = strdup(name),
                   .algo = strdup(canon ? canon : algo),
                   .as_written = strdup(algo),
                   .group_size = group_size};
    if (!l.name || !l.algo || !l.as_written) {
        free(l.name), free(l.algo), free(l.as_written);
        return oom(err);
    }
    memmove(&nl[lo + 1], &nl[lo], (qc->n_layers - lo) * sizeof *nl);
    nl[lo] = l;
    qc->n_layers++;
    if (qc->source == K3_QSRC_NONE) {
        qc->source = K3_QSRC_MODELOPT;
        free(qc->quant_algo);
        if (!(qc->quant_algo = strdup("MIXED_PRECISION")))
            return oom(err);
        /* the producer is k3 (quantize), as k3_quant_plan_modelopt records for make-tiny */
        if (!qc->producer_version) {
            char ver[64];
            snprintf(ver, sizeof ver, "k3 %s", k3_version());
            if (!(qc->producer_version = strdup(ver)))
                return oom(err);
        }
    }
    return K3_OK;
}

int k3_quant_config_add_exclude(k3_quant_config *qc, const char *pattern, k3_error *err) {
    k3_qpattern *np = realloc(qc->exclude, (qc->n_exclude + 1) * sizeof *np);
    if (!np)
        return oom(err);
    qc->exclude = np;
    int rc = k3_qpattern_compile(&np[qc->n_exclude], pattern, "quant config: exclude", err);
    if (!rc)
        qc->n_exclude++;
    return rc;
}

/* One FP8_PB_WO entry per attention projection of layer l (TS's coverage list of
 * nvidia/Kimi-K3-NVFP4; KDA o_proj is not in it). */
static int plan_attention(k3_quant_config *qc, const k3_model_config *mc, const char *prefix,
                          int64_t l, k3_error *err) {
    static const char *const kda_full[] = {"q_proj",   "k_proj", "v_proj",  "g_proj",
                                           "f_a_proj", "b_proj", "f_b_proj"};
    static const char *const kda_lowrank[] = {"q_proj",   "k_proj",   "v_proj", "g_a_proj",
                                              "g_b_proj", "f_a_proj", "b_proj", "f_b_proj"};
    static const char *const mla_lora[] = {"q_a_proj",  "q_b_proj", "kv_a_proj_with_mqa",
                                           "kv_b_proj", "o_proj",   "g_proj"};
    static const char *const mla_plain[] = {"q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                                            "g_proj"};
    const char *const *names;
    size_t n;
    if (mc->layers[l].attn == K3_ATTN_KDA) {
        names = mc->kda_full_rank_gate ? kda_full : kda_lowrank;
        n = mc->kda_full_rank_gate ? 7 : 8;
    } else {
        names = mc->q_lora_rank ? mla_lora : mla_plain;
        n = (mc->q_lora_rank ? 6 : 5) - (mc->mla_use_output_gate ? 0 : 1); /* g_proj is last */
    }
    for (size_t i = 0; i < n; i++) {
        char name[256];
        snprintf(name, sizeof name, "%smodel.layers.%lld.self_attn.%s", prefix, (long long)l,
                 names[i]);
        int rc = k3_quant_config_add_layer(qc, name, "FP8_PB_WO", -1, err);
        if (rc)
            return rc;
    }
    return K3_OK;
}

int k3_quant_plan_modelopt(k3_quant_config *qc, const k3_model_config *mc, const char *prefix,
                           unsigned flags, k3_error *err) {
    if (qc->source != K3_QSRC_NONE || qc->n_layers || qc->n_exclude)
        return k3_fail(err, K3_ERR_ARG, "quant plan: the config must be freshly initialized");
    if (strcmp(prefix, "") && strcmp(prefix, "language_model."))
        return k3_fail(err, K3_ERR_ARG,
                       "quant plan: prefix \"%s\" (expected \"\" or \"language_model.\")", prefix);
    qc->source = K3_QSRC_MODELOPT;
    char ver[64];
    snprintf(ver, sizeof ver, "k3 %s", k3_version());
    if (!(qc->quant_algo = strdup("MIXED_PRECISION")) || !(qc->producer_version = strdup(ver)) ||
        !(qc->origin = strdup("k3 quant plan")))
        return oom(err);
    static const char *const prefixes[] = {"language_model.model.", "model.", ""};
    static const char *const suffixes[] = {"block_sparse_moe.experts", "mlp.experts"};
    int rc;
    for (int64_t l = 0; l < mc->num_hidden_layers; l++) {
        if ((flags & K3_QPLAN_EXPERTS_NVFP4) && mc->layers[l].ffn == K3_FFN_MOE) {
            int np = (flags & K3_QPLAN_ALL_PREFIXES) ? 3 : 1,
                ns = (flags & K3_QPLAN_ALL_PREFIXES) ? 2 : 1;
            for (int p = 0; p < np; p++)
                for (int s = 0; s < ns; s++) {
                    char name[256];
                    if (flags & K3_QPLAN_ALL_PREFIXES)
                        snprintf(name, sizeof name, "%slayers.%lld.%s", prefixes[p], (long long)l,
                                 suffixes[s]);
                    else
                        snprintf(name, sizeof name, "%smodel.layers.%lld.block_sparse_moe.experts",
                                 prefix, (long long)l);
                    if ((rc = k3_quant_config_add_layer(qc, name, "NVFP4", 16, err)))
                        return rc;
                }
        }
        if ((flags & K3_QPLAN_ATTN_FP8) && (rc = plan_attention(qc, mc, prefix, l, err)))
            return rc;
    }
    /* routers and lm_head stay BF16; ModelOpt lists routers explicitly (MO-QU) */
    char pat[128];
    snprintf(pat, sizeof pat, "%slm_head", prefix);
    if ((rc = k3_quant_config_add_exclude(qc, "*block_sparse_moe.gate", err)) ||
        (rc = k3_quant_config_add_exclude(qc, pat, err)))
        return rc;
    if (qc->n_layers == 0)
        return k3_fail(err, K3_ERR_ARG, "quant plan: nothing to quantize (flags 0x%x)", flags);
    return K3_OK;
}

int k3_quant_plan_ct(k3_quant_config *qc, k3_qscheme scheme, const char *const *ignore,
                     size_t n_ignore, k3_error *err) {
    if (qc->source != K3_QSRC_NONE || qc->n_groups || qc->n_exclude)
        return k3_fail(err, K3_ERR_ARG, "quant plan: the config must be freshly initialized");
    if (scheme != K3_QS_NVFP4_CT && scheme != K3_QS_MXFP4)
        return k3_fail(err, K3_ERR_ARG,
                       "quant plan: compressed-tensors writes NVFP4 or MXFP4, not %s",
                       k3_qscheme_name(scheme));
    bool nv = scheme == K3_QS_NVFP4_CT;
    const char *fmt = nv ? "nvfp4-pack-quantized" : "mxfp4-pack-quantized";
    qc->source = K3_QSRC_COMPRESSED_TENSORS;
    qc->groups = calloc(1, sizeof *qc->groups);
    if (!qc->groups)
        return oom(err);
    qc->n_groups = 1;
    k3_ct_group *g = &qc->groups[0];
    g->targets = calloc(1, sizeof *g->targets);
    if (!(qc->ct_format = strdup(fmt)) || !(qc->origin = strdup("k3 quant plan")) ||
        !(g->name = strdup("group_0")) || !(g->format = strdup(fmt)) ||
        !(g->type = strdup("float")) || !g->targets)
        return oom(err);
    int rc = k3_qpattern_compile(&g->targets[0], "Linear", "quant plan", err);
    if (rc)
        return rc;
    g->n_targets = 1;
    g->num_bits = 4;
    g->group_size = nv ? 16 : 32;
    g->input_activations = nv; /* NVFP4: dynamic "local" activations; MXFP4 experts: none */
    g->scheme = scheme;
    for (size_t i = 0; i < n_ignore; i++)
        if ((rc = k3_quant_config_add_exclude(qc, ignore[i], err)))
            return rc;
    return K3_OK;
}

/* ---- JSON ----------------------------------------------------------------------- */

static cJSON *layers_json(const k3_quant_config *qc) {
    cJSON *o = cJSON_CreateObject();
    for (size_t i = 0; o && i < qc->n_layers; i++) {
        const k3_qlayer *l = &qc->layers[i];
        cJSON *e = cJSON_CreateObject();
        bool ok =
            e &&
            cJSON_AddStringToObject(e, "quant_algo", l->as_written ? l->as_written : l->algo) &&
            (l->group_size < 0 || cJSON_AddNumberToObject(e, "group_size", (double)l->group_size));
        if (!ok || !cJSON_AddItemToObject(o, l->name, e)) {
            cJSON_Delete(e);
            cJSON_Delete(o);
            return NULL;
        }
    }
    return o;
}

static cJSON *patterns_json(const k3_quant_config *qc) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < qc->n_exclude; i++) {
        cJSON *s = cJSON_CreateString(qc->exclude[i].text);
        if (!s || !cJSON_AddItemToArray(a, s)) {
            cJSON_Delete(s);
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

static bool add_producer(cJSON *o, const k3_quant_config *qc) {
    cJSON *p = cJSON_AddObjectToObject(o, "producer");
    return p && cJSON_AddStringToObject(p, "name", "modelopt") &&
           cJSON_AddStringToObject(p, "version",
                                   qc->producer_version ? qc->producer_version : "unknown");
}

static bool add_str_or_null(cJSON *o, const char *key, const char *v) {
    return v ? cJSON_AddStringToObject(o, key, v) != NULL : cJSON_AddNullToObject(o, key) != NULL;
}

int k3_quant_config_to_hf_json(const k3_quant_config *qc, cJSON **out, k3_error *err) {
    *out = NULL;
    if (qc->source != K3_QSRC_MODELOPT)
        return k3_fail(err, K3_ERR_ARG, "quant config: hf_quant_config.json is ModelOpt-only");
    cJSON *root = cJSON_CreateObject();
    cJSON *q = root ? cJSON_CreateObject() : NULL;
    bool ok = q && add_producer(root, qc) && cJSON_AddItemToObject(root, "quantization", q);
    if (!ok)
        cJSON_Delete(q);
    ok = ok && add_str_or_null(q, "quant_algo", qc->quant_algo) &&
         add_str_or_null(q, "kv_cache_quant_algo", qc->kv_cache_quant_algo);
    if (ok && qc->group_size >= 0)
        ok = cJSON_AddNumberToObject(q, "group_size", (double)qc->group_size) != NULL;
    if (ok && qc->n_layers) {
        cJSON *l = layers_json(qc);
        ok = l && cJSON_AddItemToObject(q, "quantized_layers", l);
        if (!ok)
            cJSON_Delete(l);
    }
    cJSON *ex = ok ? patterns_json(qc) : NULL;
    ok = ok && ex && cJSON_AddItemToObject(q, "exclude_modules", ex);
    if (!ok) {
        cJSON_Delete(root);
        return oom(err);
    }
    *out = root;
    return K3_OK;
}

/* weights / input_activations descriptor of one format (checkpoint-formats.md §2.3, §4.2). */
static cJSON *descriptor(int bits, const char *strategy, int64_t group, const char *dynamic_str) {
    cJSON *d = cJSON_CreateObject();
    bool ok = d && cJSON_AddNumberToObject(d, "num_bits", bits) &&
              cJSON_AddStringToObject(d, "type", "float") &&
              cJSON_AddStringToObject(d, "strategy", strategy) &&
              (group < 0 || cJSON_AddNumberToObject(d, "group_size", (double)group)) &&
              cJSON_AddBoolToObject(d, "symmetric", true) &&
              (dynamic_str ? cJSON_AddStringToObject(d, "dynamic", dynamic_str) != NULL
                           : cJSON_AddBoolToObject(d, "dynamic", false) != NULL);
    if (!ok) {
        cJSON_Delete(d);
        return NULL;
    }
    return d;
}

/* config_groups of the flat ModelOpt shape: one group per distinct algorithm, targets the
 * sorted layer names that use it. */
static cJSON *modelopt_groups(const k3_quant_config *qc) {
    cJSON *groups = cJSON_CreateObject();
    const char *algos[2] = {"NVFP4", "FP8_BLOCK_SCALES"};
    int gi = 0;
    for (int a = 0; groups && a < 2; a++) {
        cJSON *targets = cJSON_CreateArray();
        for (size_t i = 0; targets && i < qc->n_layers; i++)
            if (qc->layers[i].algo && !strcmp(qc->layers[i].algo, algos[a]))
                cJSON_AddItemToArray(targets, cJSON_CreateString(qc->layers[i].name));
        if (!targets || cJSON_GetArraySize(targets) == 0) {
            cJSON_Delete(targets);
            continue;
        }
        cJSON *g = cJSON_CreateObject();
        char name[32];
        snprintf(name, sizeof name, "group_%d", gi++);
        bool nv = a == 0;
        cJSON *w = nv ? descriptor(4, "tensor_group", 16, NULL) : descriptor(8, "block", -1, NULL);
        cJSON *in = nv ? descriptor(4, "tensor_group", 16, NULL) : NULL;
        bool ok = g && w && cJSON_AddItemToObject(g, "weights", w);
        if (!ok)
            cJSON_Delete(w);
        if (ok && in)
            ok = cJSON_AddItemToObject(g, "input_activations", in);
        else
            cJSON_Delete(in);
        ok = ok && cJSON_AddItemToObject(g, "targets", targets);
        if (!ok)
            cJSON_Delete(targets);
        if (!ok || !cJSON_AddItemToObject(groups, name, g)) {
            cJSON_Delete(g);
            cJSON_Delete(groups);
            return NULL;
        }
    }
    return groups;
}

static int inline_modelopt(const k3_quant_config *qc, cJSON *o, k3_error *err) {
    bool ok = cJSON_AddStringToObject(o, "quant_method", "modelopt") &&
              add_str_or_null(o, "quant_algo", qc->quant_algo) && add_producer(o, qc);
    if (ok && qc->group_size >= 0)
        ok = cJSON_AddNumberToObject(o, "group_size", (double)qc->group_size) != NULL;
    cJSON *ig = ok ? patterns_json(qc) : NULL;
    ok = ok && ig && cJSON_AddItemToObject(o, "ignore", ig);
    if (ok) {
        if (!qc->kv_cache_quant_algo) {
            ok = cJSON_AddNullToObject(o, "kv_cache_scheme") != NULL;
        } else if (!strcmp(qc->kv_cache_quant_algo, "FP8")) {
            cJSON *kv = cJSON_AddObjectToObject(o, "kv_cache_scheme");
            ok = kv && cJSON_AddBoolToObject(kv, "dynamic", false) &&
                 cJSON_AddNumberToObject(kv, "num_bits", 8) &&
                 cJSON_AddStringToObject(kv, "type", "float");
        } else {
            ok = cJSON_AddStringToObject(o, "kv_cache_scheme", qc->kv_cache_quant_algo) != NULL;
        }
    }
    if (ok && qc->n_layers) {
        cJSON *l = layers_json(qc), *g = l ? modelopt_groups(qc) : NULL;
        ok = l && g && cJSON_AddItemToObject(o, "quantized_layers", l);
        if (!ok)
            cJSON_Delete(l);
        ok = ok && cJSON_AddItemToObject(o, "config_groups", g);
        if (!ok)
            cJSON_Delete(g);
    }
    return ok ? K3_OK : oom(err);
}

static int inline_ct(const k3_quant_config *qc, cJSON *o, k3_error *err) {
    bool ok = cJSON_AddStringToObject(o, "quant_method", "compressed-tensors") &&
              (!qc->ct_format || cJSON_AddStringToObject(o, "format", qc->ct_format)) &&
              cJSON_AddStringToObject(o, "quantization_status", "compressed");
    cJSON *groups = ok ? cJSON_AddObjectToObject(o, "config_groups") : NULL;
    ok = groups != NULL;
    for (size_t i = 0; ok && i < qc->n_groups; i++) {
        const k3_ct_group *g = &qc->groups[i];
        if (g->scheme != K3_QS_NVFP4_CT && g->scheme != K3_QS_MXFP4)
            return k3_fail(err, K3_ERR_UNSUPPORTED,
                           "quant config: config_groups.%s: k3 writes only NVFP4 and MXFP4 groups",
                           g->name);
        bool nv = g->scheme == K3_QS_NVFP4_CT;
        cJSON *jg = cJSON_AddObjectToObject(groups, g->name);
        cJSON *t = jg ? cJSON_AddArrayToObject(jg, "targets") : NULL;
        ok = t != NULL;
        for (size_t k = 0; ok && k < g->n_targets; k++)
            ok = cJSON_AddItemToArray(t, cJSON_CreateString(g->targets[k].text));
        cJSON *w = ok ? descriptor(4, nv ? "tensor_group" : "group", g->group_size, NULL) : NULL;
        ok = w && (nv || cJSON_AddStringToObject(w, "scale_dtype", "torch.uint8"));
        if (ok)
            ok = cJSON_AddItemToObject(jg, "weights", w);
        else
            cJSON_Delete(w);
        if (ok && g->input_activations) {
            cJSON *in = descriptor(4, "tensor_group", 16, "local");
            ok = in && cJSON_AddItemToObject(jg, "input_activations", in);
            if (!ok)
                cJSON_Delete(in);
        } else if (ok) {
            ok = cJSON_AddNullToObject(jg, "input_activations") != NULL;
        }
        ok = ok && cJSON_AddNullToObject(jg, "output_activations") &&
             (!g->format || cJSON_AddStringToObject(jg, "format", g->format));
    }
    cJSON *ig = ok ? patterns_json(qc) : NULL;
    ok = ok && ig && cJSON_AddItemToObject(o, "ignore", ig);
    ok = ok && (qc->kv_cache_quant_algo
                    ? cJSON_AddStringToObject(o, "kv_cache_scheme", qc->kv_cache_quant_algo) != NULL
                    : cJSON_AddNullToObject(o, "kv_cache_scheme") != NULL);
    return ok ? K3_OK : oom(err);
}

int k3_quant_config_to_inline_json(const k3_quant_config *qc, cJSON **out, k3_error *err) {
    *out = NULL;
    if (qc->source == K3_QSRC_NONE)
        return k3_fail(err, K3_ERR_ARG,
                       "quant config: nothing is quantized; write no quantization_config");
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return oom(err);
    int rc = qc->source == K3_QSRC_MODELOPT ? inline_modelopt(qc, o, err) : inline_ct(qc, o, err);
    if (rc) {
        cJSON_Delete(o);
        return rc;
    }
    *out = o;
    return K3_OK;
}
