/* Module name -> declared scheme, and the per-layer routed-expert rule (TRT-K3
 * `_resolve_routed_quant_config`). Names are tried in each prefix variant, because a
 * checkpoint's tensor names and its quant config need not spell the wrapper prefix alike
 * (nvidia/Kimi-K3-NVFP4 lists every variant). Lookups are bsearch over the sorted
 * quantized_layers, so resolving each of K3's ~500k tensors stays cheap. */
#include "io/quant_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define NAME_MAX_LEN 1024
#define N_VARIANTS   4

/* The spellings of one module: as given, without `language_model.`, with it, and (under
 * `model.`) without `model.` too. Duplicates are dropped. Returns the count. */
static int variants(const char *module, char out[N_VARIANTS][NAME_MAX_LEN]) {
    const char *s1 = module;
    if (!strncmp(s1, "language_model.", 15))
        s1 += 15;
    const char *cand[N_VARIANTS] = {module, s1, NULL, NULL};
    char with_lm[NAME_MAX_LEN];
    snprintf(with_lm, sizeof with_lm, "language_model.%s", s1);
    cand[2] = with_lm;
    cand[3] = !strncmp(s1, "model.", 6) ? s1 + 6 : NULL;
    int n = 0;
    for (int i = 0; i < N_VARIANTS; i++) {
        if (!cand[i])
            continue;
        bool dup = false;
        for (int j = 0; j < n && !dup; j++)
            dup = !strcmp(out[j], cand[i]);
        if (!dup)
            snprintf(out[n++], NAME_MAX_LEN, "%s", cand[i]);
    }
    return n;
}

static int natural_group(k3_qscheme s) {
    switch (s) {
    case K3_QS_NVFP4:
    case K3_QS_NVFP4_CT:
        return 16;
    case K3_QS_MXFP4:
        return 32;
    case K3_QS_FP8_BLOCK:
        return 128;
    default:
        return -1;
    }
}

static const k3_qlayer *find_layer(const k3_quant_config *qc, const char *name) {
    size_t lo = 0, hi = qc->n_layers;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(qc->layers[mid].name, name);
        if (!c)
            return &qc->layers[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* First index whose name is >= key. */
static size_t lower_bound(const k3_quant_config *qc, const char *key) {
    size_t lo = 0, hi = qc->n_layers;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(qc->layers[mid].name, key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The entry of name or of its nearest ancestor (dot-separated). */
static const k3_qlayer *find_self_or_ancestor(const k3_quant_config *qc, const char *name) {
    char buf[NAME_MAX_LEN];
    snprintf(buf, sizeof buf, "%s", name);
    for (;;) {
        const k3_qlayer *l = find_layer(qc, buf);
        if (l)
            return l;
        char *dot = strrchr(buf, '.');
        if (!dot)
            return NULL;
        *dot = '\0';
    }
}

/* An exclude pattern matching name or one of its ancestors (*out NULL when none).
 * expert_only: only the expert-level patterns, on a routed expert's module and its
 * `experts.N` parent; the levels above are its layer's, which the per-layer lookup matched
 * with every pattern. */
static int excluded(const k3_quant_config *qc, const char *name, bool expert_only,
                    const k3_qpattern **out, k3_error *err) {
    *out = NULL;
    if (!qc->n_exclude)
        return K3_OK;
    char buf[NAME_MAX_LEN];
    snprintf(buf, sizeof buf, "%s", name);
    for (int level = 0; !expert_only || level < 2; level++) {
        for (size_t i = 0; i < qc->n_exclude; i++) {
            bool hit;
            if (expert_only && !qc->exclude[i].expert_level)
                continue;
            int rc = k3_qpattern_match_checked(&qc->exclude[i], buf, &hit, err);
            if (rc)
                return rc;
            if (hit) {
                *out = &qc->exclude[i];
                return K3_OK;
            }
        }
        char *dot = strrchr(buf, '.');
        if (!dot)
            return K3_OK;
        *dot = '\0';
    }
    return K3_OK;
}

static void decl_of_layer(const k3_qlayer *l, k3_qdecl *out) {
    out->scheme = k3_qscheme_of_algo(l->algo);
    out->algo = l->algo;
    out->group_size = l->group_size >= 0 ? l->group_size : natural_group(out->scheme);
    out->matched = l->name;
}

static bool is_single_format(const k3_quant_config *qc) {
    return qc->quant_algo && strcmp(qc->quant_algo, "MIXED_PRECISION");
}

static void decl_single(const k3_quant_config *qc, k3_qdecl *out) {
    out->scheme = k3_qscheme_of_algo(qc->quant_algo);
    out->algo = qc->quant_algo;
    out->group_size = qc->group_size >= 0 ? qc->group_size : natural_group(out->scheme);
    out->matched = "quant_algo";
}

static int check_name(const char *module, k3_error *err) {
    if (!module || strlen(module) >= NAME_MAX_LEN - 32)
        return k3_fail(err, K3_ERR_ARG, "quantization lookup: module name %s",
                       module ? "too long" : "missing");
    return K3_OK;
}

static int resolve_modelopt(const k3_quant_config *qc, char v[][NAME_MAX_LEN], int nv,
                            bool expert_only, k3_qdecl *out, k3_error *err) {
    for (int i = 0; i < nv; i++) {
        const k3_qpattern *p;
        int rc = excluded(qc, v[i], expert_only, &p, err);
        if (rc)
            return rc;
        if (p) {
            out->matched = p->text;
            return K3_OK;
        }
    }
    for (int i = 0; i < nv; i++) {
        const k3_qlayer *l = find_self_or_ancestor(qc, v[i]);
        if (l) {
            decl_of_layer(l, out);
            return K3_OK;
        }
    }
    if (is_single_format(qc))
        decl_single(qc, out);
    return K3_OK;
}

/* expert_only: the ignore patterns that cannot single out a routed expert are skipped (the
 * caller resolved the expert's layer with all of them) */
static int resolve_ct(const k3_quant_config *qc, char v[][NAME_MAX_LEN], int nv, bool expert_only,
                      k3_qdecl *out, k3_error *err) {
    int rc;
    bool hit;
    for (int i = 0; i < nv; i++)
        for (size_t k = 0; k < qc->n_exclude; k++) {
            if (expert_only && !qc->exclude[k].expert_level)
                continue;
            if ((rc = k3_qpattern_match_checked(&qc->exclude[k], v[i], &hit, err)))
                return rc;
            if (hit) {
                out->matched = qc->exclude[k].text;
                return K3_OK;
            }
        }
    /* name and regex targets first, class targets after (compressed-tensors' priority) */
    for (int by_class = 0; by_class < 2; by_class++)
        for (size_t g = 0; g < qc->n_groups; g++) {
            const k3_ct_group *grp = &qc->groups[g];
            for (size_t t = 0; t < grp->n_targets; t++) {
                const k3_qpattern *p = &grp->targets[t];
                bool cls = !strcmp(p->text, "Linear");
                if (cls != (bool)by_class)
                    continue;
                hit = cls;
                for (int i = 0; i < nv && !hit; i++)
                    if ((rc = k3_qpattern_match_checked(p, v[i], &hit, err)))
                        return rc;
                if (!hit)
                    continue;
                out->scheme = grp->scheme;
                out->algo = grp->format ? grp->format : "compressed-tensors";
                out->group_size = grp->group_size;
                out->matched = grp->name;
                out->by_class = cls;
                return K3_OK;
            }
        }
    return K3_OK;
}

int k3_quant_resolve(const k3_quant_config *qc, const char *module, k3_qdecl *out, k3_error *err) {
    *out = (k3_qdecl){.scheme = K3_QS_NONE, .group_size = -1};
    int rc = check_name(module, err);
    if (rc)
        return rc;
    char v[N_VARIANTS][NAME_MAX_LEN];
    int nv = variants(module, v);
    if (qc->source == K3_QSRC_MODELOPT)
        rc = resolve_modelopt(qc, v, nv, false, out, err);
    else if (qc->source == K3_QSRC_COMPRESSED_TENSORS)
        rc = resolve_ct(qc, v, nv, false, out, err);
    if (rc)
        *out = (k3_qdecl){.scheme = K3_QS_NONE, .group_size = -1};
    return rc;
}

/* The spellings of an expert module under both MoE suffixes (TRT-K3 looks the layer up under
 * `block_sparse_moe.experts` and `mlp.experts`). Returns the count. */
static int expert_variants(const char *module, char out[2 * N_VARIANTS][NAME_MAX_LEN]) {
    int n = variants(module, out);
    const char *a = ".block_sparse_moe.experts.", *b = ".mlp.experts.";
    const char *hit = strstr(module, a);
    if (hit) {
        char alt[NAME_MAX_LEN];
        snprintf(alt, sizeof alt, "%.*s%s%s", (int)(hit - module), module, b, hit + strlen(a));
        n += variants(alt, out + n);
    }
    return n;
}

int k3_quant_resolve_expert_module(const k3_quant_config *qc, const char *module,
                                   const k3_qdecl *layer, k3_qdecl *out, k3_error *err) {
    *out = *layer;
    int rc = check_name(module, err);
    if (rc || layer->defaulted)
        return rc;
    bool ct = qc->source == K3_QSRC_COMPRESSED_TENSORS;
    /* a plain checkpoint, or an excluded ModelOpt layer: its experts inherit the layer's */
    if (!ct && (qc->source != K3_QSRC_MODELOPT || (layer->scheme == K3_QS_NONE && layer->matched)))
        return K3_OK;
    char v[2 * N_VARIANTS][NAME_MAX_LEN];
    int nv = expert_variants(module, v);
    k3_qdecl d = {.scheme = K3_QS_NONE, .group_size = -1};
    rc = ct ? resolve_ct(qc, v, nv, true, &d, err) : resolve_modelopt(qc, v, nv, true, &d, err);
    if (!rc)
        *out = d;
    return rc;
}

/* Two declarations of one layer's experts agree when scheme and algo agree. */
static bool same_decl(const k3_qdecl *a, const k3_qdecl *b) {
    return a->scheme == b->scheme && a->group_size == b->group_size &&
           ((!a->algo && !b->algo) || (a->algo && b->algo && !strcasecmp(a->algo, b->algo)));
}

static int merge(k3_qdecl *acc, bool *have, const k3_qdecl *d, int64_t layer, k3_error *err) {
    if (!*have) {
        *acc = *d;
        *have = true;
        return K3_OK;
    }
    if (same_decl(acc, d))
        return K3_OK;
    return k3_fail(err, K3_ERR_FORMAT,
                   "layer %lld routed experts: declared %s (group %lld) by \"%s\" but %s (group "
                   "%lld) by \"%s\"",
                   (long long)layer, acc->algo ? acc->algo : k3_qscheme_name(acc->scheme),
                   (long long)acc->group_size, acc->matched,
                   d->algo ? d->algo : k3_qscheme_name(d->scheme), (long long)d->group_size,
                   d->matched);
}

static int experts_modelopt(const k3_quant_config *qc, int64_t layer, k3_qdecl *out,
                            k3_error *err) {
    static const char *const prefixes[] = {"language_model.model.", "model.", ""};
    static const char *const suffixes[] = {"block_sparse_moe.experts", "mlp.experts"};
    bool have = false;
    const k3_qpattern *any_ex = NULL;
    int rc;
    for (int p = 0; p < 3; p++)
        for (int s = 0; s < 2; s++) {
            char name[NAME_MAX_LEN];
            snprintf(name, sizeof name, "%slayers.%lld.%s", prefixes[p], (long long)layer,
                     suffixes[s]);
            const k3_qpattern *ex;
            if ((rc = excluded(qc, name, false, &ex, err)))
                return rc;
            bool declared = false;
            const k3_qlayer *l = find_self_or_ancestor(qc, name);
            /* per-expert entries below: ...experts.7.w1 */
            char key[NAME_MAX_LEN + 2];
            snprintf(key, sizeof key, "%s.", name);
            size_t klen = strlen(key), i = lower_bound(qc, key);
            for (; l || (i < qc->n_layers && !strncmp(qc->layers[i].name, key, klen)); l = NULL) {
                const k3_qlayer *e = l ? l : &qc->layers[i++];
                /* an exclusion of a declared name wins, as in k3_quant_resolve */
                const k3_qpattern *x = ex;
                if (!l && (rc = excluded(qc, e->name, false, &x, err)))
                    return rc;
                k3_qdecl d = {.scheme = K3_QS_NONE, .group_size = -1};
                if (x)
                    d.matched = x->text;
                else
                    decl_of_layer(e, &d);
                if ((rc = merge(out, &have, &d, layer, err)))
                    return rc;
                declared = true;
            }
            /* an exclusion of a spelling nothing declares counts only if nothing else does */
            if (!declared && ex && !any_ex)
                any_ex = ex;
        }
    if (!have && any_ex) {
        *out = (k3_qdecl){.scheme = K3_QS_NONE, .group_size = -1, .matched = any_ex->text};
        return K3_OK;
    }
    if (have)
        return K3_OK;
    if (is_single_format(qc)) {
        decl_single(qc, out);
        return K3_OK;
    }
    /* Nothing declared: TensorRT-LLM's default for K3 routed experts, the W4A8_MXFP4_MXFP8
     * weights of the original moonshotai/Kimi-K3. */
    *out = (k3_qdecl){.scheme = K3_QS_MXFP4,
                      .algo = "W4A8_MXFP4_MXFP8",
                      .group_size = 32,
                      .matched = "default (no declaration for this layer's experts)",
                      .defaulted = true};
    return K3_OK;
}

int k3_quant_resolve_experts(const k3_quant_config *qc, int64_t layer, k3_qdecl *out,
                             k3_error *err) {
    *out = (k3_qdecl){.scheme = K3_QS_NONE, .group_size = -1};
    if (layer < 0 || layer >= K3_MAX_LAYERS)
        return k3_fail(err, K3_ERR_ARG, "expert quantization lookup: layer %lld out of range",
                       (long long)layer);
    if (qc->source == K3_QSRC_MODELOPT)
        return experts_modelopt(qc, layer, out, err);
    if (qc->source != K3_QSRC_COMPRESSED_TENSORS)
        return K3_OK; /* plain checkpoint */
    /* compressed-tensors: the three projections of one expert must agree; every other
     * expert tensor is resolved again by the loader with k3_quant_resolve */
    static const char *const w[] = {"w1", "w2", "w3"};
    bool have = false;
    for (int i = 0; i < 3; i++) {
        char name[NAME_MAX_LEN];
        snprintf(name, sizeof name, "model.layers.%lld.block_sparse_moe.experts.0.%s",
                 (long long)layer, w[i]);
        k3_qdecl d;
        int rc = k3_quant_resolve(qc, name, &d, err);
        if (!rc)
            rc = merge(out, &have, &d, layer, err);
        if (rc)
            return rc;
    }
    return K3_OK;
}
