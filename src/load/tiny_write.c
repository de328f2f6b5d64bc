/* make-tiny's weight generator; see tiny.h. Each plan entry's float values come from
 * (seed, name) alone, so any thread count writes the same bytes; the emitter (emit.h)
 * quantizes them into the declared scheme and streams the shards. Peak memory is one entry
 * per thread (the largest K3 entry is a 12288x7168 attention projection, 352 MB as floats). */
#include "load/tiny.h"

#include "load/emit.h"
#include "moe/activation.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- seeded values ------------------------------------------------------------------ */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t name_seed(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return h;
}
/* uniform in [-1, 1) with 24 random bits */
static float unif(uint64_t *s) { return (float)((int64_t)(splitmix(s) >> 40) - (1 << 23)) / (float)(1 << 23); }

float k3_tiny_input_scale(uint64_t seed, const char *module) {
    /* the expert's name without ".wN", so w1 and w3 agree; activations of amax 2..10 */
    char base[512];
    snprintf(base, sizeof base, "%s", module);
    char *dot = strrchr(base, '.');
    if (dot && dot[1] == 'w' && dot[2] >= '1' && dot[2] <= '3' && !dot[3]) {
        if (dot[2] == '3') dot[2] = '1';
    }
    uint64_t s = name_seed(seed, base);
    return (6.0f + 4.0f * unif(&s)) / (6.0f * 448.0f);
}

void k3_tiny_values(uint64_t seed, const k3_pentry *e, float *out, int64_t n) {
    uint64_t s = name_seed(seed, e->name);
    int64_t cols = e->linear ? e->shape[1] : 1;
    float a = e->linear ? sqrtf(3.0f / (float)cols) : 1.0f;
    switch (e->role) {
    case K3_R_EMBED: a = 1.0f; break;
    case K3_R_IN_NORM: case K3_R_POST_NORM: case K3_R_ATTN_RES_NORM: case K3_R_MLP_RES_NORM:
    case K3_R_FINAL_NORM: case K3_R_OUT_RES_NORM: case K3_R_ATTN_NORM: case K3_R_LATENT_NORM:
        for (int64_t i = 0; i < n; i++) out[i] = 1.0f + 0.1f * unif(&s);
        return;
    case K3_R_KDA_A_LOG: /* log(1..16) for real heads; the padding tail stays exactly 0 */
        for (int64_t i = 0; i < n; i++) out[i] = 0.0f;
        return;
    case K3_R_ATTN_RES_PROJ: case K3_R_MLP_RES_PROJ: case K3_R_OUT_RES_PROJ: a = 0.1f; break;
    case K3_R_KDA_DT_BIAS: case K3_R_ROUTER_BIAS: a = 0.05f; break;
    case K3_R_KDA_CONV: a = 0.5f; break;
    default: break;
    }
    /* two 24-bit uniforms per 64-bit draw: generation keeps pace with the quantizers */
    const float k = a / (float)(1 << 23);
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint64_t z = splitmix(&s);
        out[i] = k * (float)((int64_t)(z >> 40) - (1 << 23));
        out[i + 1] = k * (float)((int64_t)((z >> 16) & 0xFFFFFF) - (1 << 23));
    }
    if (i < n) out[i] = a * unif(&s);
}

/* n: the padded length (K3's [128]) or the heads themselves (Kimi-Linear's [1,1,H,1]). */
static void a_log_values(uint64_t seed, const k3_pentry *e, int64_t heads, float *out, int64_t n) {
    uint64_t s = name_seed(seed, e->name);
    for (int64_t i = 0; i < n; i++)
        out[i] = i < heads ? logf(8.5f + 7.5f * unif(&s)) : 0.0f;
}

/* ---- emitter callbacks ------------------------------------------------------------ */

typedef struct gen { uint64_t seed; int64_t kda_heads; } gen;

static int gen_values(void *ctx, const k3_emit_item *it, float *out, int64_t n, k3_error *err) {
    (void)err;
    const gen *g = ctx;
    if (it->e->role == K3_R_KDA_A_LOG) a_log_values(g->seed, it->e, g->kda_heads, out, n);
    else k3_tiny_values(g->seed, it->e, out, n);
    return K3_OK;
}

static float gen_input_scale(void *ctx, const k3_emit_item *it) {
    return k3_tiny_input_scale(((const gen *)ctx)->seed, it->e->name);
}

/* A deep copy (the layer plan is owned). */
static int k3_model_config_copy(k3_model_config *dst, const k3_model_config *src, k3_error *err) {
    *dst = *src;
    dst->layers = malloc((size_t)src->num_hidden_layers * sizeof *dst->layers);
    if (!dst->layers) return k3_fail(err, K3_ERR_NOMEM, "make-tiny: out of memory");
    memcpy(dst->layers, src->layers, (size_t)src->num_hidden_layers * sizeof *dst->layers);
    int rc = k3_model_config_validate(dst, "make-tiny custom config", err);
    if (rc) free(dst->layers), dst->layers = NULL;
    return rc;
}

/* k3-architecture.md §3.1, §8.2. K3_R_ATTN_NORM also names MLA's q_a/kv_a_layernorm
 * (BF16); on a KDA layer it is o_norm, which is F32. */
static k3_dtype plain_dtype_of(const k3_pentry *e, const k3_model_config *mc) {
    switch (e->role) {
    case K3_R_KDA_A_LOG: case K3_R_KDA_DT_BIAS: case K3_R_KDA_CONV: case K3_R_ROUTER_BIAS:
        return K3_DTYPE_F32;
    case K3_R_ATTN_NORM:
        return mc->layers[e->layer].attn == K3_ATTN_KDA ? K3_DTYPE_F32 : K3_DTYPE_BF16;
    default:
        return K3_DTYPE_BF16;
    }
}

static int k3_tiny_run(const k3_tiny_opts *o, uint64_t *bytes, k3_error *err);

int k3_make_tiny(const k3_tiny_opts *o, k3_error *err) { return k3_tiny_run(o, NULL, err); }

int k3_tiny_bytes(const k3_tiny_opts *o, uint64_t *bytes, k3_error *err) {
    return k3_tiny_run(o, bytes, err);
}

/* bytes non-NULL: a dry run that only sizes the tensors. */
static int k3_tiny_run(const k3_tiny_opts *o, uint64_t *bytes, k3_error *err) {
    if (!o || (!o->dir && !bytes)) return k3_fail(err, K3_ERR_ARG, "make-tiny: dir: missing");
    if (!bytes && mkdir(o->dir, 0755) && errno != EEXIST)
        return k3_fail(err, K3_ERR_IO, "%s: %s", o->dir, strerror(errno));
    k3_model_config mc;
    k3_quant_config qc;
    k3_plan plan = {0};
    k3_emit_item *items = NULL;
    cJSON *inl = NULL, *hf = NULL;
    int rc = o->custom ? k3_model_config_copy(&mc, o->custom, err) : k3_tiny_config(o->preset, &mc, err);
    if (rc) return rc;
    k3_quant_config_init(&qc);
    if ((rc = k3_tiny_quant(o->format, &mc, &qc, err))) goto done;
    /* K3 (the VL wrapper) prefixes text tensors with language_model.; a bare Kimi-Linear
     * config names them plainly */
    if ((rc = k3_plan_build(&plan, &mc, mc.wrapped ? "language_model." : "", err))) goto done;
    if (!(items = calloc(plan.n, sizeof *items))) {
        rc = k3_fail(err, K3_ERR_NOMEM, "make-tiny: out of memory");
        goto done;
    }
    for (size_t i = 0; i < plan.n && !rc; i++) {
        k3_emit_item *it = &items[i];
        it->e = &plan.e[i];
        it->plain_dtype = plain_dtype_of(it->e, &mc);
        if (!it->e->linear) continue;
        k3_qdecl d;
        rc = it->e->role == K3_R_EXPERT ? k3_quant_resolve_experts(&qc, it->e->layer, &d, err)
                                        : k3_quant_resolve(&qc, it->e->name, &d, err);
        it->scheme = d.scheme;
        /* the router and embeddings stay as they are, whatever a class target says (the
         * router is no nn.Linear in the reference model, checkpoint-formats.md §4.2) */
        if (it->e->role == K3_R_ROUTER || it->e->role == K3_R_EMBED || it->e->role == K3_R_LM_HEAD)
            it->scheme = K3_QS_NONE;
        /* moonshotai/Kimi-K3 packs only the routed experts although its `Linear` target also
         * covers the router-adjacent latent projections (k3-architecture.md §1.2, §8) */
        if (d.by_class && d.scheme == K3_QS_MXFP4 && it->e->role != K3_R_EXPERT)
            it->scheme = K3_QS_NONE;
    }
    if (!rc) {
        k3_emit_item **by_plan = malloc(plan.n * sizeof *by_plan);
        if (!by_plan) rc = k3_fail(err, K3_ERR_NOMEM, "make-tiny: out of memory");
        for (size_t i = 0; by_plan && i < plan.n; i++) by_plan[i] = &items[i];
        if (by_plan) k3_emit_pair_gate_up(by_plan, &plan, k3_act_is_gated(k3_plan_expert_act(&mc)));
        free(by_plan);
    }
    uint64_t total = 0;
    if (!rc) rc = k3_emit_prepare(items, plan.n, &total, err);
    if (rc) goto done;
    if (bytes) {
        *bytes = total;
        goto done;
    }
    int n_shards = o->n_shards > 0 ? o->n_shards
                   : o->preset == K3_TINY_TINY ? 3 : o->preset == K3_TINY_SMALL ? 4 : 8;
    k3_emit_split(items, plan.n, n_shards, total);
    gen g = {o->seed, mc.kda_num_heads};
    k3_emit_src src = {&g, gen_values, gen_input_scale};
    k3_emit_opts eo = {.n_threads = o->n_threads, .progress = o->progress, .what = "make-tiny"};
    if ((rc = k3_emit(o->dir, items, plan.n, n_shards, total, &src, &eo, err))) goto done;
    /* config.json (with the inline quantization_config), hf_quant_config.json, tokenizer */
    if (qc.source != K3_QSRC_NONE && (rc = k3_quant_config_to_inline_json(&qc, &inl, err))) goto done;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", o->dir);
    if ((rc = k3_model_config_write(&mc, inl, path, err))) goto done;
    if (qc.source == K3_QSRC_MODELOPT) {
        if ((rc = k3_quant_config_to_hf_json(&qc, &hf, err))) goto done;
        if ((rc = k3_emit_json(o->dir, "hf_quant_config.json", hf, err))) goto done;
    }
    rc = k3_tiny_write_tokenizer(o->dir, mc.vocab_size, err);
done:
    cJSON_Delete(inl);
    cJSON_Delete(hf);
    free(items);
    k3_plan_free(&plan);
    k3_quant_config_free(&qc);
    k3_model_config_free(&mc);
    return rc;
}
