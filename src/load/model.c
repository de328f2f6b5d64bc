/* k3_model_open: configs, tensor plan, validation, streaming read, decode, MoE assembly.
 * See model.h for the memory rules and include/k3.h for the public side.
 *
 * Order of work: (1) configs and checkpoint headers; (2) match every checkpoint tensor to a
 * plan entry, in both directions, before reading a byte (a missing expert or an orphan
 * quantized tensor fails fast, whichever rank owns it); (3) read the selected tensors,
 * sorted by (shard, offset), with a pool of pread threads; (4) decode and validate; (5) fill
 * the MoE blocks. Left out: device upload and kernel-specific re-layouts (the backends make
 * those from the k3_qmat file layout). */
#include "load/model.h"
#include "base/threadpool.h"

#include "formats/fp.h"
#include "moe/activation.h"
#include "load/ckviews.h"
#include "load/read.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void k3_model_close(k3_model *m) {
    if (!m) return;
    if (m->layers)
        for (int64_t l = 0; l < m->mc.num_hidden_layers; l++) {
            free(m->layers[l].experts);
            free(m->layers[l].alpha);
            free(m->layers[l].beta);
            free(m->layers[l].bias_f32);
        }
    free(m->layers);
    for (size_t i = 0; i < m->n_views; i++) free(m->bufs ? m->bufs[i] : NULL);
    free(m->bufs);
    free(m->views);
    k3_name_table_free(&m->vt);
    k3_name_table_free(&m->pt);
    free(m->le);
    k3_plan_free(&m->plan);
    k3_quant_config_free(&m->qc);
    k3_model_config_free(&m->mc);
    k3_checkpoint_close(m->ck);
    free(m->path);
    free(m);
}

static const k3_tview *find_view(void *ctx, const char *name) {
    const k3_model *m = ctx;
    size_t i;
    return k3_name_table_get(&m->vt, name, &i) ? &m->views[i] : NULL;
}

const k3_lentry *k3_model_entry(const k3_model *m, const char *name) {
    size_t i;
    if (!m || !k3_name_table_get(&m->pt, name, &i)) return NULL;
    return m->le[i].selected ? &m->le[i] : NULL;
}

const k3_moe_block *k3_model_moe(const k3_model *m, int l) {
    if (!m || l < 0 || l >= m->mc.num_hidden_layers) return NULL;
    const k3_mlayer *ml = &m->layers[l];
    return ml->loaded && ml->has_moe ? &ml->moe : NULL;
}

const k3_model_config *k3_model_mc(const k3_model *m) { return &m->mc; }

int k3_model_get_info(const k3_model *m, k3_model_info *o) {
    if (!m || !o) return K3_ERR_ARG;
    *o = (k3_model_info){.n_layers = (int)m->mc.num_hidden_layers,
                         .n_experts = (int)m->mc.num_experts, .ep_first = m->ep.first,
                         .ep_count = m->ep.count, .top_k = (int)m->mc.num_experts_per_token,
                         .hidden = m->mc.hidden_size, .vocab = m->mc.vocab_size,
                         .bytes_read = m->bytes_read, .bytes_kept = m->bytes_kept,
                         .load_seconds = m->load_seconds, .prefix = m->plan.prefix};
    return K3_OK;
}

static bool is_vision(const char *name) {
    return !strncmp(name, "vision_tower.", 13) || !strncmp(name, "mm_projector.", 13);
}

static uint64_t tensor_bytes(const k3_model *m, int64_t k) {
    k3_tensor_info ti;
    return k3_checkpoint_tensor_info(m->ck, (size_t)k, &ti, NULL) ? 0 : ti.nbytes;
}
static k3_dtype tensor_dtype(const k3_model *m, int64_t k) {
    k3_tensor_info ti;
    return k3_checkpoint_tensor_info(m->ck, (size_t)k, &ti, NULL) ? K3_DTYPE_INVALID : ti.dtype;
}

/* One expert's own declaration against its layer's (d): k3 runs a layer's experts in one
 * format, so an expert that an exclusion or a missing per-expert entry leaves in another
 * format is an error, not a tensor decoded under its neighbours' declaration. */
static int expert_agrees(const k3_model *m, const k3_pentry *e, const k3_qdecl *d, k3_error *err) {
    k3_qdecl own;
    int rc = k3_quant_resolve_expert_module(&m->qc, e->name, d, &own, err);
    if (rc) return rc;
    if (m->qc.source == K3_QSRC_MODELOPT && own.scheme == K3_QS_NONE && !own.matched &&
        d->scheme != K3_QS_NONE) {
        /* MIXED_PRECISION: nothing names this module or an ancestor, the layer's entry names
         * its siblings */
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: no quantized_layers entry covers it, but its layer's routed experts "
                       "are declared %s by \"%s\" (k3 runs a layer's experts in one format)",
                       e->name, d->algo ? d->algo : k3_qscheme_name(d->scheme), d->matched);
    }
    if (own.scheme != d->scheme)
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: declared %s by \"%s\", but its layer's routed experts are %s by \"%s\" (k3 "
                       "runs a layer's experts in one format)",
                       e->name, own.scheme == K3_QS_NONE ? "unquantized" : k3_qscheme_name(own.scheme),
                       own.matched ? own.matched : "default",
                       d->scheme == K3_QS_NONE ? "unquantized" : k3_qscheme_name(d->scheme),
                       d->matched ? d->matched : "default");
    return K3_OK;
}

/* The format of one layer's routed experts where no quantization config exists: the first
 * expert's, which every other must share. */
typedef struct layer_fmt {
    int layer;
    k3_qscheme scheme;
    const char *first; /* plan entry name */
} layer_fmt;

static const char *scheme_word(k3_qscheme s) { return s == K3_QS_NONE ? "plain" : k3_qscheme_name(s); }

/* No quantization config at all: an expert's format is decided per tensor from names and dtypes
 * (k3-architecture.md §1.2), as the original moonshotai/Kimi-K3 needs without its config. With
 * any declaration the expert is checked against it instead. */
static int infer_expert(const k3_model *m, const k3_pentry *e, layer_fmt *lf, k3_lentry *le,
                        k3_error *err) {
    k3_ck_views cv = {.ck = m->ck};
    k3_qscheme sc = k3_decode_infer(e->name, k3_ck_views_find, &cv);
    if (cv.rc) {
        if (err) *err = cv.err;
        return cv.rc;
    }
    if (lf->layer != e->layer) {
        *lf = (layer_fmt){.layer = e->layer, .scheme = sc, .first = e->name};
    } else if (sc != lf->scheme) {
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: stored as %s, but %s as %s (no quantization config declares the "
                       "experts, so each is read by its tensors; k3 runs a layer's experts in one "
                       "format)",
                       e->name, scheme_word(sc), lf->first, scheme_word(lf->scheme));
    }
    le->scheme = sc;
    le->inferred = true;
    return K3_OK;
}

/* (2): every plan entry's tensors, and every checkpoint tensor's owner. */
static int match(k3_model *m, const bool *layer_sel, bool **wanted_out, k3_error *err) {
    size_t nt = k3_checkpoint_tensor_count(m->ck);
    uint8_t *claimed = calloc(nt ? nt : 1, 1);
    bool *wanted = calloc(nt ? nt : 1, sizeof *wanted);
    if (!claimed || !wanted) {
        free(claimed), free(wanted);
        return k3_fail(err, K3_ERR_NOMEM, "load: out of memory");
    }
    int rc = K3_OK;
    layer_fmt lf = {.layer = -1};
    for (size_t i = 0; i < m->plan.n && !rc; i++) {
        const k3_pentry *e = &m->plan.e[i];
        k3_lentry *le = &m->le[i];
        le->selected = (e->layer < 0 || layer_sel[e->layer]) &&
                       (e->expert < 0 || k3_ep_owns(&m->ep, e->expert));
        if (!e->linear) {
            int64_t k = k3_checkpoint_find(m->ck, e->name);
            if (k < 0) {
                rc = k3_fail(err, K3_ERR_MISSING, "%s: missing from %s", e->name, m->path);
                break;
            }
            claimed[k] = 1;
            wanted[k] |= le->selected;
            le->bytes = tensor_bytes(m, k);
            continue;
        }
        k3_qdecl d;
        rc = e->role == K3_R_EXPERT ? k3_quant_resolve_experts(&m->qc, e->layer, &d, err)
                                    : k3_quant_resolve(&m->qc, e->name, &d, err);
        if (!rc && e->role == K3_R_EXPERT) rc = expert_agrees(m, e, &d, err);
        if (rc) break;
        le->scheme = d.scheme;
        /* plain weights are unambiguous where the declaration is only a class target or a
         * default (nothing declared for a layer's experts means MXFP4 for the original K3
         * checkpoint, but a BF16 `.weight` there is still just BF16). The embedding is no
         * Linear module: no exporter quantizes it or lists it among the exclusions, so a
         * single-format quant_algo does not reach it. */
        le->plain_ok = d.by_class || d.defaulted || e->role == K3_R_EMBED;
        le->defaulted = d.defaulted;
        if (e->role == K3_R_EXPERT && m->qc.source == K3_QSRC_NONE &&
            (rc = infer_expert(m, e, &lf, le, err)))
            break;
        int found = 0;
        int64_t kw = -1, kp = -1;
        char name[600];
        for (int s = 0; s < K3_N_QSUFFIX; s++) {
            snprintf(name, sizeof name, "%s.%s", e->name, k3_qsuffix[s]);
            int64_t k = k3_checkpoint_find(m->ck, name);
            if (k < 0) continue;
            found++;
            claimed[k] = 1;
            wanted[k] |= le->selected;
            le->bytes += tensor_bytes(m, k);
            if (s == K3_SFX_WEIGHT || s == K3_SFX_WEIGHT_PACKED) le->wdtype = tensor_dtype(m, k);
            if (s == K3_SFX_WEIGHT) kw = k;
            if (s == K3_SFX_WEIGHT_PACKED) kp = k;
        }
        if (kw >= 0 && kp >= 0)
            rc = k3_fail(err, K3_ERR_DUPLICATE, "%s: present twice, as .weight and .weight_packed",
                         e->name);
        else if (kw < 0 && kp < 0)
            rc = k3_fail(err, K3_ERR_MISSING, "%s.%s: missing from %s", e->name,
                         le->scheme == K3_QS_MXFP4 || le->scheme == K3_QS_NVFP4_CT ? "weight_packed"
                                                                                   : "weight",
                         m->path);
        (void)found;
    }
    /* orphans: a quantized tensor nobody owns is an error; a plain one a warning, as
     * TensorRT-LLM's key validation does */
    for (size_t k = 0; k < nt && !rc; k++) {
        if (claimed[k]) continue;
        k3_tensor_info ti;
        if ((rc = k3_checkpoint_tensor_info(m->ck, k, &ti, err))) break;
        if (is_vision(ti.name)) continue;
        const char *dot = strrchr(ti.name, '.');
        bool scale_name = dot && strstr(dot, "scale");
        bool qdtype = ti.dtype == K3_DTYPE_U8 || ti.dtype == K3_DTYPE_F8_E4M3 ||
                      ti.dtype == K3_DTYPE_F8_E5M2 || ti.dtype == K3_DTYPE_F8_E8M0 ||
                      ti.dtype == K3_DTYPE_F4;
        if (qdtype || scale_name)
            rc = k3_fail(err, K3_ERR_FORMAT,
                         "%s: quantized tensor (%s) that no declaration or model tensor owns",
                         ti.name, k3_dtype_name(ti.dtype));
        else
            k3_warn("%s: unexpected tensor (not part of the model config), ignored", ti.name);
    }
    free(claimed);
    if (rc) free(wanted);
    else *wanted_out = wanted;
    return rc;
}

/* A_log: [pad >= heads] with an exactly-zero tail (K3) or [1,1,H,1] (Kimi-Linear). */
static int check_a_log(const k3_tview *t, int64_t heads, int64_t pad, k3_error *err) {
    int64_t s1[1] = {pad}, s4[4] = {1, 1, heads, 1};
    unsigned dts = (1u << K3_DTYPE_F32) | (1u << K3_DTYPE_BF16) | (1u << K3_DTYPE_F16);
    bool r4 = t->rank == 4;
    int rc = k3_decode_plain(t, dts, r4 ? 4 : 1, r4 ? s4 : s1, err);
    if (rc || r4 || !t->data) return rc;
    size_t es = t->dtype == K3_DTYPE_F32 ? 4 : 2;
    for (int64_t i = heads; i < pad; i++) {
        float v;
        if (es == 4) memcpy(&v, (const char *)t->data + i * 4, 4);
        else {
            uint16_t h;
            memcpy(&h, (const char *)t->data + i * 2, 2);
            v = t->dtype == K3_DTYPE_BF16 ? k3_bf16_to_f32(h) : k3_f16_to_f32(h);
        }
        if (v != 0.0f)
            return k3_fail(err, K3_ERR_NUMERIC,
                           "%s: padding entry %lld (beyond %lld heads) must be 0, found %g", t->name,
                           (long long)i, (long long)heads, (double)v);
    }
    return K3_OK;
}

/* (4): decode every selected entry; w1/w3 input_scale agreement per expert. */
/* w1's and w3's tensors with suffix sfx (expert plan entries i and i + 2), named in n1 / n3. */
static void w13_views(k3_model *m, size_t i, const char *sfx, char n1[600], char n3[600],
                      const k3_tview **t1, const k3_tview **t3) {
    snprintf(n1, 600, "%s.%s", m->plan.e[i].name, sfx);
    snprintf(n3, 600, "%s.%s", m->plan.e[i + 2].name, sfx);
    *t1 = find_view(m, n1), *t3 = find_view(m, n3);
}

static int decode_all(k3_model *m, k3_error *err) {
    for (size_t i = 0; i < m->plan.n; i++) {
        const k3_pentry *e = &m->plan.e[i];
        k3_lentry *le = &m->le[i];
        if (!le->selected) continue;
        int rc;
        if (e->linear) {
            rc = le->inferred ? k3_decode_linear_undeclared(e->name, e->shape[0], e->shape[1],
                                                            find_view, m, NULL, &le->q, err)
                              : k3_decode_linear(e->name, le->scheme, le->plain_ok, e->shape[0],
                                                 e->shape[1], find_view, m, NULL, &le->q, err);
            if (rc && le->defaulted && err) {
                size_t n = strlen(err->msg);
                snprintf(err->msg + n, sizeof err->msg - n,
                         " (no quantization entry declares layer %d's routed experts, so they are "
                         "read as the original Kimi K3's MXFP4, TensorRT-LLM's default)", e->layer);
            }
        } else {
            le->v = find_view(m, e->name);
            if (!le->v) return k3_fail(err, K3_ERR_INTERNAL, "%s: not loaded", e->name);
            rc = e->role == K3_R_KDA_A_LOG
                     ? check_a_log(le->v, m->mc.kda_num_heads, m->plan.a_log_len, err)
                     : k3_decode_plain(le->v, e->dtypes, e->rank, e->shape, err);
        }
        if (rc) return rc;
    }
    /* One activation scale feeds w1 and w3 (the FC1 input), so TensorRT-LLM asserts
     * w1.input_scale == w3.input_scale per expert: a mismatch is a malformed checkpoint. Their
     * weight_scale_2 should be shared too (moe.md §2.2); where they differ TensorRT-LLM takes
     * the max without rescaling the block scales, k3 decodes each exactly, and says so once. */
    bool gated = k3_act_is_gated(k3_plan_expert_act(&m->mc));
    size_t ws2_differ = 0;
    char g1[600] = "", g3[600] = "";
    float g1v = 0, g3v = 0;
    for (size_t i = 0; gated && i + 2 < m->plan.n; i++) {
        const k3_pentry *e = &m->plan.e[i];
        if (e->role != K3_R_EXPERT || e->proj != 1 || !m->le[i].selected) continue;
        if (m->le[i].q.fmt != K3_WFMT_NVFP4) continue;
        /* the values as stored, not the qmat's: compressed-tensors stores reciprocals, and a
         * message quotes the file */
        bool ct = m->le[i].scheme == K3_QS_NVFP4_CT;
        char n1[600], n3[600];
        float v1 = 0, v3 = 0;
        const k3_tview *t1, *t3;
        w13_views(m, i, ct ? "input_global_scale" : "input_scale", n1, n3, &t1, &t3);
        if (!t1 != !t3)
            return k3_fail(err, K3_ERR_MISSING, "%s: missing, but %s is present (one activation "
                           "scale feeds both, TensorRT-LLM asserts they are equal)",
                           t1 ? n3 : n1, t1 ? n1 : n3);
        int rc = t1 ? k3_decode_scalar(t1, &v1, err) : K3_OK;
        if (!rc && t3) rc = k3_decode_scalar(t3, &v3, err);
        if (rc) return rc;
        if (v1 != v3)
            return k3_fail(err, K3_ERR_FORMAT, "%s: %.9g, but %s: %.9g (one activation scale feeds "
                           "both; TensorRT-LLM asserts they are equal)", n1, (double)v1, n3,
                           (double)v3);
        w13_views(m, i, ct ? "weight_global_scale" : "weight_scale_2", n1, n3, &t1, &t3);
        if (!t1 || !t3) return k3_fail(err, K3_ERR_INTERNAL, "%s: decoded without it", t1 ? n3 : n1);
        if ((rc = k3_decode_scalar(t1, &v1, err)) || (rc = k3_decode_scalar(t3, &v3, err))) return rc;
        if (v1 != v3 && !ws2_differ++) {
            snprintf(g1, sizeof g1, "%s", n1), snprintf(g3, sizeof g3, "%s", n3);
            g1v = v1, g3v = v3;
        }
    }
    if (ws2_differ)
        k3_warn("%s: %.9g, but %s: %.9g, and w1 and w3 global scales differ in %zu expert(s) in "
                "all: k3 decodes each exactly; TensorRT-LLM would take the max for both without "
                "rescaling the block scales", g1, (double)g1v, g3, (double)g3v, ws2_differ);
    return K3_OK;
}

/* (5) */
static int assemble(k3_model *m, const bool *layer_sel, k3_error *err) {
    const k3_model_config *mc = &m->mc;
    const int64_t H = mc->hidden_size;
    for (size_t i = 0; i < m->plan.n; i++) {
        const k3_pentry *e = &m->plan.e[i];
        if (e->layer < 0 || !layer_sel[e->layer]) continue;
        k3_mlayer *ml = &m->layers[e->layer];
        ml->loaded = true;
        if (mc->layers[e->layer].ffn != K3_FFN_MOE) continue;
        k3_moe_block *b = &ml->moe;
        const k3_lentry *le = &m->le[i];
        if (!ml->has_moe) {
            ml->has_moe = true;
            int n = m->ep.count;
            ml->experts = calloc((size_t)n, sizeof *ml->experts);
            k3_act act = k3_plan_expert_act(mc);
            bool situ = act == K3_ACT_SITU;
            if (situ) {
                ml->alpha = malloc((size_t)n * sizeof(float));
                ml->beta = malloc((size_t)n * sizeof(float));
            }
            if (!ml->experts || (situ && (!ml->alpha || !ml->beta)))
                return k3_fail(err, K3_ERR_NOMEM, "load: out of memory");
            for (int k = 0; situ && k < n; k++)
                ml->alpha[k] = (float)mc->situ_beta, ml->beta[k] = (float)mc->situ_linear_beta;
            ml->shared_alpha = (float)mc->situ_beta, ml->shared_beta = (float)mc->situ_linear_beta;
            k3_act_params ap = {.act = act};
            b->model_width = (int)H;
            b->router = (k3_router){.fn = mc->route_fn, .n_experts = (int)mc->num_experts,
                                    .top_k = (int)mc->num_experts_per_token,
                                    /* use_grouped_topk false: plain top-k, whatever
                                     * the group fields say */
                                    .n_group = mc->use_grouped_topk ? (int)mc->num_expert_group : 1,
                                    .topk_group = mc->use_grouped_topk ? (int)mc->topk_group : 1,
                                    .renormalize = mc->moe_renormalize,
                                    .routed_scaling_factor = (float)mc->routed_scaling_factor};
            b->experts = (k3_experts){
                .n_experts = (int)mc->num_experts, .first_local = m->ep.first, .n_local = n,
                .hidden = (int)(mc->routed_expert_hidden_size > 0 ? mc->routed_expert_hidden_size : H),
                .inter = (int)mc->moe_intermediate_size, .e = ml->experts, .act = ap};
            b->experts.act.alpha = ml->alpha;
            b->experts.act.beta = ml->beta;
            b->latent = mc->routed_expert_hidden_size > 0;
            b->norm_eps = (float)mc->rms_norm_eps;
            b->n_shared = (int)mc->num_shared_experts;
            b->shared_act = ap;
            if (situ) b->shared_act.alpha = &ml->shared_alpha, b->shared_act.beta = &ml->shared_beta;
        }
        switch (e->role) {
        case K3_R_ROUTER: b->router.gate = le->q; break;
        case K3_R_ROUTER_BIAS:
            if (le->v->dtype == K3_DTYPE_F32) {
                b->router.correction_bias = le->v->data;
            } else {
                int64_t n = e->shape[0];
                if (!(ml->bias_f32 = malloc((size_t)n * sizeof(float))))
                    return k3_fail(err, K3_ERR_NOMEM, "load: out of memory");
                const uint16_t *h = le->v->data;
                for (int64_t k = 0; k < n; k++)
                    ml->bias_f32[k] = le->v->dtype == K3_DTYPE_BF16 ? k3_bf16_to_f32(h[k]) : k3_f16_to_f32(h[k]);
                b->router.correction_bias = ml->bias_f32;
            }
            break;
        case K3_R_LATENT_DOWN: b->latent_down = le->q; break;
        case K3_R_LATENT_UP: b->latent_up = le->q; break;
        case K3_R_LATENT_NORM:
            b->latent_norm = le->v->data;
            b->latent_norm_fmt = le->v->dtype == K3_DTYPE_F32 ? K3_WFMT_F32
                                 : le->v->dtype == K3_DTYPE_F16 ? K3_WFMT_F16 : K3_WFMT_BF16;
            break;
        case K3_R_SHARED_GATE: b->shared_gate = le->q; break;
        case K3_R_SHARED_UP: b->shared_up = le->q; break;
        case K3_R_SHARED_DOWN: b->shared_down = le->q; break;
        case K3_R_EXPERT:
            if (le->selected) {
                k3_expert *x = &ml->experts[e->expert - m->ep.first];
                if (e->proj == 1) x->w1 = le->q;
                else if (e->proj == 2) x->w2 = le->q;
                else if (k3_act_is_gated(b->experts.act.act)) x->w3 = le->q;
            }
            break;
        default: break;
        }
    }
    return K3_OK;
}

static int detect_prefix(k3_model *m, const char **prefix, k3_error *err) {
    if (k3_checkpoint_find(m->ck, "language_model.model.embed_tokens.weight") >= 0) *prefix = "language_model.";
    else if (k3_checkpoint_find(m->ck, "model.embed_tokens.weight") >= 0) *prefix = "";
    else
        return k3_fail(err, K3_ERR_MISSING, "%s: no model.embed_tokens.weight (with or without the "
                       "language_model. prefix): not a Kimi text checkpoint", m->path);
    return K3_OK;
}

int k3_model_open(k3_model **out, const k3_model_opts *o, k3_error *err) {
    if (!out) return k3_fail(err, K3_ERR_ARG, "k3_model_open: out: NULL");
    *out = NULL;
    if (!o || !o->path) return k3_fail(err, K3_ERR_ARG, "k3_model_open: %s: NULL", !o ? "opts" : "path");
    int ep_size = o->ep_size > 1 ? o->ep_size : 1, ep_rank = o->ep_size > 1 ? o->ep_rank : 0;
    if (o->ep_size < 0) return k3_fail(err, K3_ERR_ARG, "k3_model_open: ep_size: expected >= 0, found %d", o->ep_size);
    /* a rank given without ep_size would otherwise load every expert, as rank 0 of 1 */
    if (o->ep_size <= 1 && o->ep_rank != 0)
        return k3_fail(err, K3_ERR_ARG, "k3_model_open: ep_rank: expected 0 when ep_size is %d, found %d",
                       o->ep_size, o->ep_rank);
    if (o->n_layers < 0 || (!o->layers && o->n_layers > 0))
        return k3_fail(err, K3_ERR_ARG, "k3_model_open: n_layers: %d %s", o->n_layers,
                       o->n_layers < 0 ? "is negative" : "entries, but layers is NULL");
    int trc = k3_threads_check("k3_model_open", o->n_threads, err);
    if (trc) return trc;
    double t0 = k3_now();
    k3_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(o->path))) {
        free(m);
        return k3_fail(err, K3_ERR_NOMEM, "load: out of memory");
    }
    k3_quant_config_init(&m->qc);
    bool *layer_sel = NULL, *wanted = NULL;
    char cfg[4096];
    const char *prefix = "";
    int rc = k3_checkpoint_open(&m->ck, o->path, err);
    if (rc) goto fail;
    snprintf(cfg, sizeof cfg, "%s/config.json", k3_checkpoint_path(m->ck));
    if ((rc = k3_model_config_load(&m->mc, cfg, err))) goto fail;
    if ((rc = k3_quant_config_load(&m->qc, k3_checkpoint_path(m->ck), err))) goto fail;
    if ((rc = k3_quant_config_validate(&m->qc, err))) goto fail;
    if ((rc = detect_prefix(m, &prefix, err))) goto fail;
    if ((rc = k3_plan_build(&m->plan, &m->mc, prefix, err))) goto fail;
    for (size_t i = 0, pl = strlen(prefix); i < m->plan.n && !rc; i++)
        if (k3_name_table_put(&m->pt, m->plan.e[i].name + pl, i, NULL))
            rc = k3_fail(err, K3_ERR_INTERNAL, "%s: twice in the tensor plan", m->plan.e[i].name);
    if (rc) goto fail;
    if (m->mc.n_moe > 0) {
        if ((rc = k3_ep_partition((int)m->mc.num_experts, ep_size, ep_rank, &m->ep, err))) goto fail;
    } else if (ep_size > 1) {
        rc = k3_fail(err, K3_ERR_ARG, "k3_model_open: ep_size %d for a model without MoE layers", ep_size);
        goto fail;
    }
    const int64_t NL = m->mc.num_hidden_layers;
    layer_sel = calloc((size_t)NL, sizeof *layer_sel);
    m->le = calloc(m->plan.n ? m->plan.n : 1, sizeof *m->le);
    m->layers = calloc((size_t)NL, sizeof *m->layers);
    if (!layer_sel || !m->le || !m->layers) {
        rc = k3_fail(err, K3_ERR_NOMEM, "load: out of memory");
        goto fail;
    }
    for (int64_t l = 0; l < NL; l++) layer_sel[l] = o->layers == NULL;
    for (int i = 0; o->layers && i < o->n_layers; i++) {
        if (o->layers[i] < 0 || o->layers[i] >= NL) {
            rc = k3_fail(err, K3_ERR_ARG, "layer %d: %s has %lld decoder layers (0..%lld)",
                         o->layers[i], o->path, (long long)NL, (long long)NL - 1);
            goto fail;
        }
        layer_sel[o->layers[i]] = true;
    }
    if ((rc = match(m, layer_sel, &wanted, err))) goto fail;
    if (o->headers_only) {
        if ((rc = k3_read_headers(m, wanted, err)) || (rc = decode_all(m, err))) goto fail;
        for (size_t i = 0; i < m->plan.n; i++) m->le[i].selected = false;
        goto done;
    }
    k3_read_opts ro = {.n_threads = o->n_threads, .progress = o->progress != 0};
    if ((rc = k3_read_tensors(m, wanted, &ro, err))) goto fail;
    if ((rc = decode_all(m, err))) goto fail;
    if ((rc = assemble(m, layer_sel, err))) goto fail;
done:
    m->load_seconds = k3_now() - t0;
    free(layer_sel);
    free(wanted);
    *out = m;
    return K3_OK;
fail:
    free(layer_sel);
    free(wanted);
    k3_model_close(m);
    return rc;
}

/* ---- summaries without weights (inspect) ------------------------------------------ */

static const char *expert_format(const k3_lentry *le) {
    if (le->wdtype == K3_DTYPE_U8) {
        switch (le->scheme) {
        case K3_QS_NVFP4: return "NVFP4";
        case K3_QS_NVFP4_CT: return "NVFP4-CT";
        case K3_QS_MXFP4: return "MXFP4";
        default: break;
        }
    }
    if (le->wdtype == K3_DTYPE_F8_E4M3 && le->scheme == K3_QS_FP8_BLOCK) return "FP8-block";
    return k3_dtype_name(le->wdtype);
}

int k3_model_layer_info(const k3_model *m, int l, k3_layer_info *o, k3_error *err) {
    if (!m || !o) return k3_fail(err, K3_ERR_ARG, "k3_model_layer_info: %s: NULL", m ? "out" : "m");
    if (l < 0 || l >= m->mc.num_hidden_layers)
        return k3_fail(err, K3_ERR_ARG, "k3_model_layer_info: layer: expected in [0, %lld), found %d",
                       (long long)m->mc.num_hidden_layers, l);
    const k3_layer_plan *lp = &m->mc.layers[l];
    *o = (k3_layer_info){.attn = k3_attn_kind_name(lp->attn), .ffn = k3_ffn_kind_name(lp->ffn)};
    for (size_t i = 0; i < m->plan.n; i++) {
        const k3_pentry *e = &m->plan.e[i];
        if (e->layer != l) continue;
        o->bytes += m->le[i].bytes;
        if (e->role != K3_R_EXPERT) continue;
        o->expert_bytes += m->le[i].bytes;
        if (e->expert == 0 && e->proj == 1) o->expert_format = expert_format(&m->le[i]);
    }
    if (lp->ffn == K3_FFN_MOE) o->n_experts = (int)m->mc.num_experts;
    return K3_OK;
}

int k3_model_rank_info(const k3_model *m, int ep_size, int rank, k3_rank_info *o, k3_error *err) {
    k3_ep_part p;
    if (!m || !o) return k3_fail(err, K3_ERR_ARG, "k3_model_rank_info: %s: NULL", m ? "out" : "m");
    if (m->mc.n_moe == 0) return k3_fail(err, K3_ERR_ARG, "ep_size: the model has no MoE layers");
    int rc = k3_ep_partition((int)m->mc.num_experts, ep_size, rank, &p, err);
    if (rc) return rc;
    *o = (k3_rank_info){.first = p.first, .count = p.count};
    for (size_t i = 0; i < m->plan.n; i++) {
        const k3_pentry *e = &m->plan.e[i];
        if (e->role != K3_R_EXPERT) o->total_bytes += m->le[i].bytes;
        else if (k3_ep_owns(&p, e->expert)) o->expert_bytes += m->le[i].bytes;
    }
    o->total_bytes += o->expert_bytes;
    return K3_OK;
}
