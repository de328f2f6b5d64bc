/* Parsing and validating quantization declarations: ModelOpt hf_quant_config.json (nested,
 * authoritative), its flat inline copy, and compressed-tensors. The alias rule and the
 * TensorRT-LLM QuantAlgo table live here. Resolution per module is in
 * quant_config_resolve.c, building and writing in quant_config_write.c. */
#include "io/quant_config.h"

#include "io/json.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* A per-expert quantized_layers of K3 (92 layers x 896 experts x 3 projections, in several
 * prefix spellings) would run to tens of MB; the cap leaves room for that. */
#define QUANT_JSON_MAX_BYTES (128u << 20)

/* TensorRT-LLM QuantAlgo names (checkpoint-formats.md §2.5). The last three are listed by
 * newer mode.py revisions and third-party engines; accepted so such a file is not refused
 * over a name k3 would only resolve as "other" anyway. */
static const char *const quant_algos[] = {
    "W8A16",
    "W4A16",
    "W4A16_AWQ",
    "W4A8_AWQ",
    "W8A16_GPTQ",
    "W4A16_GPTQ",
    "W8A8_SQ_PER_CHANNEL",
    "W8A8_SQ_PER_TENSOR_PLUGIN",
    "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
    "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN",
    "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN",
    "W4A8_QSERVE_PER_GROUP",
    "W4A8_QSERVE_PER_CHANNEL",
    "FP8",
    "FP8_PER_CHANNEL_PER_TOKEN",
    "FP8_BLOCK_SCALES",
    "INT8",
    "MIXED_PRECISION",
    "NVFP4",
    "W4A8_NVFP4_FP8",
    "W4A8_MXFP4_FP8",
    "W4A8_MXFP4_MXFP8",
    "W4A16_MXFP4",
    "NO_QUANT",
    "MXFP8",
    "NVFP4_AWQ",
    "W4A16_NVFP4",
};
static const char *const kv_algos[] = {"FP8", "INT8", "NVFP4"};

const char *k3_quant_algo_canonical(const char *name) {
    if (!name)
        return NULL;
    /* The Kimi K3 alias (TRT-MC, later revision): the lowercased value is looked up, so
     * every letter case of fp8_pb_wo is FP8_BLOCK_SCALES. Same bytes on disk as DeepSeek's
     * block recipe: E4M3 weights, one F32 scale per 128x128 block. */
    if (!strcasecmp(name, "fp8_pb_wo"))
        return "FP8_BLOCK_SCALES";
    for (size_t i = 0; i < sizeof quant_algos / sizeof quant_algos[0]; i++)
        if (!strcasecmp(name, quant_algos[i]))
            return quant_algos[i];
    return NULL;
}

static const char *kv_algo_canonical(const char *name) {
    for (size_t i = 0; i < sizeof kv_algos / sizeof kv_algos[0]; i++)
        if (name && !strcasecmp(name, kv_algos[i]))
            return kv_algos[i];
    return NULL;
}

k3_qscheme k3_qscheme_of_algo(const char *algo) {
    const char *c = k3_quant_algo_canonical(algo);
    if (!algo || (c && !strcmp(c, "NO_QUANT")))
        return K3_QS_NONE;
    if (!c)
        return K3_QS_OTHER;
    if (!strcmp(c, "NVFP4"))
        return K3_QS_NVFP4;
    if (!strcmp(c, "FP8_BLOCK_SCALES"))
        return K3_QS_FP8_BLOCK;
    if (!strcmp(c, "W4A8_MXFP4_MXFP8") || !strcmp(c, "W4A8_MXFP4_FP8") || !strcmp(c, "W4A16_MXFP4"))
        return K3_QS_MXFP4;
    return K3_QS_OTHER;
}

const char *k3_qscheme_name(k3_qscheme s) {
    static const char *const names[K3_QS_COUNT] = {[K3_QS_NONE] = "none",
                                                   [K3_QS_NVFP4] = "NVFP4",
                                                   [K3_QS_NVFP4_CT] = "NVFP4 (compressed-tensors)",
                                                   [K3_QS_MXFP4] = "MXFP4",
                                                   [K3_QS_FP8_BLOCK] = "FP8_BLOCK_SCALES",
                                                   [K3_QS_OTHER] = "other"};
    return (s >= 0 && s < K3_QS_COUNT) ? names[s] : "?";
}

/* ---- patterns ------------------------------------------------------------------- */

int k3_qpattern_compile(k3_qpattern *p, const char *text, const char *what, k3_error *err) {
    p->re = NULL;
    p->text = strdup(text);
    if (!p->text)
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", what);
    /* a prefix glob without "experts." that matches an expert matches its layer's `experts`
     * too, which the per-layer lookup already saw */
    const char *star = strchr(text, '*');
    p->expert_level = !strncmp(text, "re:", 3) || strstr(text, "experts.") ||
                      (star && star[strspn(star, "*")] != '\0');
    if (strncmp(text, "re:", 3))
        return K3_OK;
    int code;
    PCRE2_SIZE off;
    /* anchored at compile time, not match time: JIT code does not take match-time
     * PCRE2_ANCHORED (the interpreter would run instead, ~10x slower over 500k names) */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(text + 3), PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED,
                                   &code, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        free(p->text);
        p->text = NULL;
        return k3_fail(err, K3_ERR_FORMAT, "%s: bad regular expression \"%s\": %s at offset %zu",
                       what, text, (const char *)msg, (size_t)off);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT the interpreter runs */
    p->re = re;
    return K3_OK;
}

/* `*` matches any run; iterative with one backtrack point (no exponential cases). */
static bool glob_match(const char *pat, const char *s) {
    const char *star = NULL, *resume = NULL;
    while (*s) {
        if (*pat == '*') {
            star = pat++;
            resume = s;
        } else if (*pat == *s) {
            pat++, s++;
        } else if (star) {
            pat = star + 1;
            s = ++resume;
        } else {
            return false;
        }
    }
    while (*pat == '*')
        pat++;
    return *pat == '\0';
}

/* 1 on a match, 0 on none, else PCRE2's (negative) error code. */
static int match_rc(const k3_qpattern *p, const char *name) {
    if (!p->text)
        return 0;
    if (!p->re)
        return glob_match(p->text, name);
    /* match data per call: the loader resolves from several threads */
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md)
        return PCRE2_ERROR_NOMEMORY;
    int rc = pcre2_match((const pcre2_code *)p->re, (PCRE2_SPTR)name, PCRE2_ZERO_TERMINATED, 0, 0,
                         md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0 ? 1 : rc == PCRE2_ERROR_NOMATCH ? 0 : rc;
}

int k3_qpattern_match_checked(const k3_qpattern *p, const char *name, bool *hit, k3_error *err) {
    int rc = match_rc(p, name);
    *hit = rc > 0;
    if (rc >= 0)
        return K3_OK;
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return k3_fail(err, rc == PCRE2_ERROR_NOMEMORY ? K3_ERR_NOMEM : K3_ERR_LIMIT,
                   "quantization pattern \"%s\" on \"%s\": the regular expression gives no answer "
                   "(%s)",
                   p->text, name, (const char *)msg);
}

bool k3_qpattern_match(const k3_qpattern *p, const char *name) {
    return match_rc(p, name) > 0;
}

void k3_qpattern_free(k3_qpattern *p) {
    if (!p)
        return;
    free(p->text);
    pcre2_code_free((pcre2_code *)p->re);
    p->text = NULL;
    p->re = NULL;
}

/* ---- lifetime ------------------------------------------------------------------- */

void k3_quant_config_init(k3_quant_config *qc) {
    memset(qc, 0, sizeof *qc);
    qc->group_size = -1;
}

void k3_quant_config_free(k3_quant_config *qc) {
    if (!qc)
        return;
    free(qc->origin);
    free(qc->quant_algo);
    free(qc->kv_cache_quant_algo);
    free(qc->ct_format);
    free(qc->producer_version);
    for (size_t i = 0; i < qc->n_layers; i++) {
        free(qc->layers[i].name);
        free(qc->layers[i].algo);
        free(qc->layers[i].as_written);
    }
    free(qc->layers);
    for (size_t i = 0; i < qc->n_exclude; i++)
        k3_qpattern_free(&qc->exclude[i]);
    free(qc->exclude);
    for (size_t i = 0; i < qc->n_groups; i++) {
        k3_ct_group *g = &qc->groups[i];
        free(g->name);
        free(g->format);
        free(g->type);
        for (size_t t = 0; t < g->n_targets; t++)
            k3_qpattern_free(&g->targets[t]);
        free(g->targets);
    }
    free(qc->groups);
    k3_quant_config_init(qc);
}

/* ---- parse helpers -------------------------------------------------------------- */

static int oom(k3_error *err, const char *what) {
    return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", what);
}

static int dup_str(char **dst, const char *s, const char *what, k3_error *err) {
    *dst = NULL;
    if (!s)
        return K3_OK;
    *dst = strdup(s);
    return *dst ? K3_OK : oom(err, what);
}

/* The canonical name when known, else the text as written (validate rejects it by name). */
static int dup_algo(char **dst, const char *s, const char *what, k3_error *err) {
    const char *c = k3_quant_algo_canonical(s);
    return dup_str(dst, c ? c : s, what, err);
}

/* A string-or-null field: *out NULL when absent or null. */
static int opt_string(const cJSON *obj, const char *key, const char **out, const char *what,
                      k3_error *err) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = NULL;
    if (!it || cJSON_IsNull(it))
        return K3_OK;
    if (!cJSON_IsString(it))
        return k3_fail(err, K3_ERR_FORMAT, "%s: %s: expected a string or null", what, key);
    *out = it->valuestring;
    return K3_OK;
}

static int opt_group(const cJSON *obj, const char *key, int64_t *out, const char *what,
                     k3_error *err) {
    bool found = false;
    int64_t v = -1;
    int rc = k3_json_get_int(obj, key, 0, 1 << 20, &v, &found, what, err);
    *out = found ? v : -1;
    return rc;
}

static int layer_cmp(const void *a, const void *b) {
    return strcmp(((const k3_qlayer *)a)->name, ((const k3_qlayer *)b)->name);
}

static int parse_layers(k3_quant_config *qc, const cJSON *ql, const char *what, k3_error *err) {
    if (!ql || cJSON_IsNull(ql))
        return K3_OK;
    if (!cJSON_IsObject(ql))
        return k3_fail(err, K3_ERR_FORMAT, "%s: quantized_layers: expected an object", what);
    size_t n = 0;
    for (const cJSON *e = ql->child; e; e = e->next)
        n++;
    qc->layers = calloc(n ? n : 1, sizeof *qc->layers);
    if (!qc->layers)
        return oom(err, what);
    for (const cJSON *e = ql->child; e; e = e->next) {
        char ewhat[512];
        snprintf(ewhat, sizeof ewhat, "%s: quantized_layers.%s", what, e->string);
        if (!cJSON_IsObject(e))
            return k3_fail(err, K3_ERR_FORMAT, "%s: expected an object", ewhat);
        k3_qlayer *l = &qc->layers[qc->n_layers++];
        const char *algo = NULL;
        int rc;
        if ((rc = dup_str(&l->name, e->string, what, err)) ||
            (rc = opt_string(e, "quant_algo", &algo, ewhat, err)) ||
            (rc = dup_algo(&l->algo, algo, what, err)) ||
            (rc = dup_str(&l->as_written, algo, what, err)) ||
            (rc = opt_group(e, "group_size", &l->group_size, ewhat, err)))
            return rc;
    }
    qsort(qc->layers, qc->n_layers, sizeof *qc->layers, layer_cmp);
    return K3_OK;
}

static int parse_patterns(k3_quant_config *qc, const cJSON *arr, const char *key, const char *what,
                          k3_error *err) {
    if (!arr || cJSON_IsNull(arr))
        return K3_OK;
    if (!cJSON_IsArray(arr))
        return k3_fail(err, K3_ERR_FORMAT, "%s: %s: expected an array of strings", what, key);
    size_t n = (size_t)cJSON_GetArraySize(arr);
    qc->exclude = calloc(n ? n : 1, sizeof *qc->exclude);
    if (!qc->exclude)
        return oom(err, what);
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        char ewhat[256];
        snprintf(ewhat, sizeof ewhat, "%s: %s[%d]", what, key, i);
        if (!cJSON_IsString(e))
            return k3_fail(err, K3_ERR_FORMAT, "%s: expected a string", ewhat);
        int rc = k3_qpattern_compile(&qc->exclude[qc->n_exclude], e->valuestring, ewhat, err);
        if (rc)
            return rc;
        qc->n_exclude++;
    }
    return K3_OK;
}

static int parse_producer(k3_quant_config *qc, const cJSON *root, const char *what, k3_error *err) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "producer");
    if (!cJSON_IsObject(p))
        return K3_OK;
    const char *v = NULL;
    int rc = opt_string(p, "version", &v, what, err);
    return rc ? rc : dup_str(&qc->producer_version, v, what, err);
}

static bool is_modelopt(const cJSON *root) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "quant_method");
    if (cJSON_IsString(m) && !strncasecmp(m->valuestring, "modelopt", 8))
        return true;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "producer");
    const cJSON *n = cJSON_IsObject(p) ? cJSON_GetObjectItemCaseSensitive(p, "name") : NULL;
    return cJSON_IsString(n) && !strcmp(n->valuestring, "modelopt");
}

/* Nested hf_quant_config.json: {"producer": ..., "quantization": {...}}. */
static int parse_modelopt_nested(k3_quant_config *qc, const cJSON *root, const char *what,
                                 k3_error *err) {
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization");
    if (!q)
        return k3_fail(err, K3_ERR_MISSING, "%s: quantization: missing", what);
    if (!cJSON_IsObject(q))
        return k3_fail(err, K3_ERR_FORMAT, "%s: quantization: expected an object", what);
    char qwhat[300];
    snprintf(qwhat, sizeof qwhat, "%s: quantization", what);
    qc->source = K3_QSRC_MODELOPT;
    const char *algo = NULL, *kv = NULL;
    int rc;
    if ((rc = dup_str(&qc->origin, what, what, err)) ||
        (rc = parse_producer(qc, root, what, err)) ||
        (rc = opt_string(q, "quant_algo", &algo, qwhat, err)) ||
        (rc = dup_algo(&qc->quant_algo, algo, what, err)) ||
        (rc = opt_string(q, "kv_cache_quant_algo", &kv, qwhat, err)) ||
        (rc = dup_str(&qc->kv_cache_quant_algo, kv_algo_canonical(kv) ? kv_algo_canonical(kv) : kv,
                      what, err)) ||
        (rc = opt_group(q, "group_size", &qc->group_size, qwhat, err)) ||
        (rc =
             parse_layers(qc, cJSON_GetObjectItemCaseSensitive(q, "quantized_layers"), qwhat, err)))
        return rc;
    return parse_patterns(qc, cJSON_GetObjectItemCaseSensitive(q, "exclude_modules"),
                          "exclude_modules", qwhat, err);
}

/* kv_cache_scheme of the flat shape (TRT-MC conversion rules); CT uses the same dict. */
static int parse_kv_scheme(k3_quant_config *qc, const cJSON *kv, const char *what, k3_error *err) {
    if (!kv || cJSON_IsNull(kv))
        return K3_OK;
    if (cJSON_IsString(kv)) {
        const char *c = kv_algo_canonical(kv->valuestring);
        return dup_str(&qc->kv_cache_quant_algo, c ? c : kv->valuestring, what, err);
    }
    if (!cJSON_IsObject(kv))
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: kv_cache_scheme: expected an object, string or null", what);
    const char *type = NULL;
    int64_t bits = -1;
    bool found = false;
    int rc;
    if ((rc = opt_string(kv, "type", &type, what, err)) ||
        (rc = k3_json_get_int(kv, "num_bits", 1, 64, &bits, &found, what, err)))
        return rc;
    char name[64];
    if (type && !strcmp(type, "float") && bits == 8)
        snprintf(name, sizeof name, "FP8");
    else if (type && !strcmp(type, "float") && bits == 4)
        snprintf(name, sizeof name, "NVFP4");
    else if (type && !strcmp(type, "int") && bits == 8)
        snprintf(name, sizeof name, "INT8");
    else /* kept by description; validate rejects it by that name */
        snprintf(name, sizeof name, "kv_cache_scheme(%s, %lld bits)", type ? type : "?",
                 (long long)bits);
    return dup_str(&qc->kv_cache_quant_algo, name, what, err);
}

/* Flat ModelOpt (inline in config.json): ignore -> exclude, kv_cache_scheme -> kv algo;
 * config_groups is a derived summary and is not read (TRT-LLM drops it too). */
static int parse_modelopt_flat(k3_quant_config *qc, const cJSON *root, const char *what,
                               k3_error *err) {
    qc->source = K3_QSRC_MODELOPT;
    const char *algo = NULL;
    int rc;
    if ((rc = dup_str(&qc->origin, what, what, err)) ||
        (rc = parse_producer(qc, root, what, err)) ||
        (rc = opt_string(root, "quant_algo", &algo, what, err)) ||
        (rc = dup_algo(&qc->quant_algo, algo, what, err)) ||
        (rc = parse_kv_scheme(qc, cJSON_GetObjectItemCaseSensitive(root, "kv_cache_scheme"), what,
                              err)) ||
        (rc = opt_group(root, "group_size", &qc->group_size, what, err)) ||
        (rc = parse_layers(qc, cJSON_GetObjectItemCaseSensitive(root, "quantized_layers"), what,
                           err)))
        return rc;
    return parse_patterns(qc, cJSON_GetObjectItemCaseSensitive(root, "ignore"), "ignore", what,
                          err);
}

/* (format, type, bits, group) -> scheme. A 4-bit packed format name whose parameters do not
 * fit it is an inconsistent file, refused here rather than decoded by the name. */
static int ct_dispatch(k3_ct_group *g, const char *gwhat, k3_error *err) {
    bool fp4 = g->type && !strcmp(g->type, "float") && g->num_bits == 4;
    bool nv = fp4 && g->group_size == 16, mx = fp4 && g->group_size == 32;
    const char *f = g->format;
    if (f && !strcmp(f, "nvfp4-pack-quantized")) {
        if (!nv)
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: format nvfp4-pack-quantized needs float 4-bit weights in groups "
                           "of 16, found %s %lld-bit group %lld",
                           gwhat, g->type ? g->type : "?", (long long)g->num_bits,
                           (long long)g->group_size);
        g->scheme = K3_QS_NVFP4_CT;
    } else if (f && !strcmp(f, "mxfp4-pack-quantized")) {
        if (!mx)
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: format mxfp4-pack-quantized needs float 4-bit weights in groups "
                           "of 32, found %s %lld-bit group %lld",
                           gwhat, g->type ? g->type : "?", (long long)g->num_bits,
                           (long long)g->group_size);
        g->scheme = K3_QS_MXFP4;
    } else if (!f) {
        /* no format: the compressor that claims these parameters (CT can_compress) */
        g->scheme = nv ? K3_QS_NVFP4_CT : mx ? K3_QS_MXFP4 : K3_QS_OTHER;
    } else {
        g->scheme = K3_QS_OTHER;
    }
    return K3_OK;
}

static int parse_ct_group(k3_ct_group *g, const cJSON *e, const char *top_format, const char *what,
                          k3_error *err) {
    char gwhat[300];
    snprintf(gwhat, sizeof gwhat, "%s: config_groups.%s", what, e->string);
    if (!cJSON_IsObject(e))
        return k3_fail(err, K3_ERR_FORMAT, "%s: expected an object", gwhat);
    int rc;
    if ((rc = dup_str(&g->name, e->string, what, err)))
        return rc;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "targets");
    if (!cJSON_IsArray(t) || cJSON_GetArraySize(t) == 0)
        return k3_fail(err, t ? K3_ERR_FORMAT : K3_ERR_MISSING,
                       "%s.targets: expected a non-empty array of strings", gwhat);
    g->targets = calloc((size_t)cJSON_GetArraySize(t), sizeof *g->targets);
    if (!g->targets)
        return oom(err, what);
    int i = 0;
    for (const cJSON *x = t->child; x; x = x->next, i++) {
        char twhat[360];
        snprintf(twhat, sizeof twhat, "%s.targets[%d]", gwhat, i);
        if (!cJSON_IsString(x))
            return k3_fail(err, K3_ERR_FORMAT, "%s: expected a string", twhat);
        if ((rc = k3_qpattern_compile(&g->targets[g->n_targets], x->valuestring, twhat, err)))
            return rc;
        g->n_targets++;
    }
    const char *fmt = NULL, *type = NULL;
    if ((rc = opt_string(e, "format", &fmt, gwhat, err)) ||
        (rc = dup_str(&g->format, fmt ? fmt : top_format, what, err)))
        return rc;
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(e, "weights");
    if (!cJSON_IsObject(w))
        return k3_fail(err, w && !cJSON_IsNull(w) ? K3_ERR_FORMAT : K3_ERR_MISSING,
                       "%s.weights: expected an object", gwhat);
    char wwhat[320];
    snprintf(wwhat, sizeof wwhat, "%s.weights", gwhat);
    bool found = false;
    if ((rc = opt_string(w, "type", &type, wwhat, err)) ||
        (rc = dup_str(&g->type, type, what, err)) ||
        (rc = k3_json_get_int(w, "num_bits", 1, 64, &g->num_bits, &found, wwhat, err)))
        return rc;
    if (!found)
        return k3_fail(err, K3_ERR_MISSING, "%s.num_bits: missing", wwhat);
    if ((rc = opt_group(w, "group_size", &g->group_size, wwhat, err)))
        return rc;
    const cJSON *ia = cJSON_GetObjectItemCaseSensitive(e, "input_activations");
    g->input_activations = ia && !cJSON_IsNull(ia);
    return ct_dispatch(g, gwhat, err);
}

static int parse_ct(k3_quant_config *qc, const cJSON *root, const char *what, k3_error *err) {
    qc->source = K3_QSRC_COMPRESSED_TENSORS;
    const char *fmt = NULL;
    int rc;
    if ((rc = dup_str(&qc->origin, what, what, err)) ||
        (rc = opt_string(root, "format", &fmt, what, err)) ||
        (rc = dup_str(&qc->ct_format, fmt, what, err)))
        return rc;
    const cJSON *cg = cJSON_GetObjectItemCaseSensitive(root, "config_groups");
    if (!cJSON_IsObject(cg))
        return k3_fail(err, cg ? K3_ERR_FORMAT : K3_ERR_MISSING,
                       "%s: config_groups: expected an object", what);
    size_t n = 0;
    for (const cJSON *e = cg->child; e; e = e->next)
        n++;
    qc->groups = calloc(n ? n : 1, sizeof *qc->groups);
    if (!qc->groups)
        return oom(err, what);
    for (const cJSON *e = cg->child; e; e = e->next) {
        k3_ct_group *g = &qc->groups[qc->n_groups++];
        g->group_size = -1;
        if ((rc = parse_ct_group(g, e, fmt, what, err)))
            return rc;
    }
    if ((rc = parse_kv_scheme(qc, cJSON_GetObjectItemCaseSensitive(root, "kv_cache_scheme"), what,
                              err)))
        return rc;
    return parse_patterns(qc, cJSON_GetObjectItemCaseSensitive(root, "ignore"), "ignore", what,
                          err);
}

static int parse_inline(k3_quant_config *qc, const cJSON *inl, const char *what, k3_error *err) {
    if (!cJSON_IsObject(inl))
        return k3_fail(err, K3_ERR_FORMAT, "%s: expected an object", what);
    if (cJSON_GetObjectItemCaseSensitive(inl, "quantization")) {
        /* the nested shape also appears inline in some exports; TRT-LLM uses it as-is */
        if (is_modelopt(inl))
            return parse_modelopt_nested(qc, inl, what, err);
    }
    if (is_modelopt(inl))
        return parse_modelopt_flat(qc, inl, what, err);
    const char *m = NULL;
    int rc = opt_string(inl, "quant_method", &m, what, err);
    if (rc)
        return rc;
    if (!m)
        return k3_fail(err, K3_ERR_MISSING, "%s: quant_method: missing", what);
    if (!strcmp(m, "compressed-tensors"))
        return parse_ct(qc, inl, what, err);
    /* config_groups is compressed-tensors' own schema: such an object naming another method
     * contradicts itself (malformed), where a real GPTQ/AWQ/... config is only one k3 does not
     * run */
    if (cJSON_GetObjectItemCaseSensitive(inl, "config_groups"))
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: quant_method: \"%s\", but the object has compressed-tensors' "
                       "config_groups (expected \"compressed-tensors\")",
                       what, m);
    return k3_fail(err, K3_ERR_UNSUPPORTED,
                   "%s: quant_method: \"%s\" is not supported (expected modelopt or "
                   "compressed-tensors)",
                   what, m);
}

/* ---- divergence ----------------------------------------------------------------- */

static bool str_eq(const char *a, const char *b) {
    return (!a && !b) || (a && b && !strcmp(a, b));
}
#define S(x) ((x) ? (x) : "null")

/* The first difference between the authoritative config a and the inline copy b, or false. */
static bool first_difference(const k3_quant_config *a, const k3_quant_config *b, char *msg,
                             size_t cap) {
    if (a->source != b->source) {
        snprintf(msg, cap, "quant_method differs (%s vs %s)",
                 a->source == K3_QSRC_MODELOPT ? "modelopt" : "compressed-tensors",
                 b->source == K3_QSRC_MODELOPT ? "modelopt" : "compressed-tensors");
        return true;
    }
    if (!str_eq(a->quant_algo, b->quant_algo)) {
        snprintf(msg, cap, "quant_algo %s vs %s", S(a->quant_algo), S(b->quant_algo));
        return true;
    }
    if (!str_eq(a->kv_cache_quant_algo, b->kv_cache_quant_algo)) {
        snprintf(msg, cap, "kv_cache_quant_algo %s vs %s", S(a->kv_cache_quant_algo),
                 S(b->kv_cache_quant_algo));
        return true;
    }
    size_t i = 0, j = 0;
    while (i < a->n_layers || j < b->n_layers) {
        int c = i == a->n_layers   ? 1
                : j == b->n_layers ? -1
                                   : strcmp(a->layers[i].name, b->layers[j].name);
        if (c) {
            snprintf(msg, cap, "quantized_layers entry \"%s\" only in %s",
                     c < 0 ? a->layers[i].name : b->layers[j].name,
                     c < 0 ? "hf_quant_config.json" : "the inline copy");
            return true;
        }
        const k3_qlayer *x = &a->layers[i++], *y = &b->layers[j++];
        if (!str_eq(x->algo, y->algo) || x->group_size != y->group_size) {
            snprintf(msg, cap, "quantized_layers entry \"%s\": %s/%lld vs %s/%lld", x->name,
                     S(x->algo), (long long)x->group_size, S(y->algo), (long long)y->group_size);
            return true;
        }
    }
    /* exclude lists compared as sets of strings */
    for (int pass = 0; pass < 2; pass++) {
        const k3_quant_config *p = pass ? b : a, *q = pass ? a : b;
        for (i = 0; i < p->n_exclude; i++) {
            bool found = false;
            for (j = 0; j < q->n_exclude && !found; j++)
                found = !strcmp(p->exclude[i].text, q->exclude[j].text);
            if (!found) {
                snprintf(msg, cap, "exclude/ignore pattern \"%s\" only in %s", p->exclude[i].text,
                         pass ? "the inline copy" : "hf_quant_config.json");
                return true;
            }
        }
    }
    return false;
}

/* TRT-MC: a KV-cache algorithm it does not run (NVFP4_AFFINE, an int4 scheme, ...) warns and
 * disables KV-cache quantization; it does not make the checkpoint unreadable. */
static void drop_unknown_kv(k3_quant_config *qc, bool warn) {
    if (!qc->kv_cache_quant_algo || kv_algo_canonical(qc->kv_cache_quant_algo))
        return;
    if (warn)
        k3_warn("%s: kv_cache_quant_algo \"%s\" is not one TensorRT-LLM runs (FP8, INT8, NVFP4): "
                "KV-cache quantization disabled",
                qc->origin ? qc->origin : "quantization config", qc->kv_cache_quant_algo);
    free(qc->kv_cache_quant_algo);
    qc->kv_cache_quant_algo = NULL;
}

int k3_quant_config_parse(k3_quant_config *qc, const cJSON *hf_quant, const char *hf_what,
                          const cJSON *inline_qc, const char *inline_what, k3_error *err) {
    k3_quant_config_init(qc);
    int rc = K3_OK;
    if (hf_quant) {
        if (!cJSON_IsObject(hf_quant))
            rc = k3_fail(err, K3_ERR_FORMAT, "%s: expected a JSON object", hf_what);
        else
            rc = parse_modelopt_nested(qc, hf_quant, hf_what, err);
        if (!rc && inline_qc) {
            k3_quant_config other;
            k3_quant_config_init(&other);
            k3_error e2 = {0};
            int rc2 = parse_inline(&other, inline_qc, inline_what, &e2);
            drop_unknown_kv(&other, false);
            drop_unknown_kv(qc, true); /* before the comparison: the copies may spell it apart */
            char d[400];
            bool diff = rc2 ? (snprintf(d, sizeof d, "it does not parse (%.300s)", e2.msg), true)
                            : first_difference(qc, &other, d, sizeof d);
            if (diff) {
                qc->inline_diverges = true;
                snprintf(qc->divergence, sizeof qc->divergence,
                         "%.200s differs from %.200s, which wins: %.500s", inline_what, hf_what, d);
                k3_warn("%s", qc->divergence);
            }
            k3_quant_config_free(&other);
        }
    } else if (inline_qc) {
        rc = parse_inline(qc, inline_qc, inline_what, err);
    }
    if (!rc)
        drop_unknown_kv(qc, true);
    if (rc)
        k3_quant_config_free(qc);
    return rc;
}

int k3_quant_config_load(k3_quant_config *qc, const char *dir, k3_error *err) {
    k3_quant_config_init(qc);
    char hf_path[4096], cfg_path[4096], inl_what[4200];
    snprintf(hf_path, sizeof hf_path, "%s/hf_quant_config.json", dir);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    snprintf(inl_what, sizeof inl_what, "%s: quantization_config", cfg_path);
    cJSON *hf = NULL, *cfg = NULL;
    int rc = K3_OK;
    if (access(hf_path, F_OK) == 0)
        rc = k3_json_parse_file(&hf, hf_path, QUANT_JSON_MAX_BYTES, err);
    else if (errno != ENOENT)
        rc = k3_fail(err, K3_ERR_IO, "%s: %s", hf_path, strerror(errno));
    if (!rc)
        rc = k3_json_parse_file(&cfg, cfg_path, QUANT_JSON_MAX_BYTES, err);
    if (!rc) {
        const cJSON *inl = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
        if (!inl) {
            const cJSON *tc = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
            inl = cJSON_IsObject(tc) ? cJSON_GetObjectItemCaseSensitive(tc, "quantization_config")
                                     : NULL;
        }
        if (cJSON_IsNull(inl))
            inl = NULL;
        rc = k3_quant_config_parse(qc, hf, hf_path, inl, inl_what, err);
    }
    cJSON_Delete(hf);
    cJSON_Delete(cfg);
    return rc;
}

/* ---- validation ----------------------------------------------------------------- */

/* A known name, and for NVFP4 the only group size the format has (a file declaring NVFP4 in
 * groups of 32 is inconsistent; decoding it either way would be a guess). */
static int check_algo(const char *algo, int64_t group, const char *what, const char *field,
                      k3_error *err) {
    if (!algo)
        return K3_OK;
    /* not a QuantAlgo name: a malformed declaration, not a model k3 merely does not run
     * (TensorRT-LLM's enum refuses it too, §2.4) */
    if (!k3_quant_algo_canonical(algo))
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: %s: unknown quantization algorithm \"%s\" (not a TensorRT-LLM "
                       "QuantAlgo name)",
                       what, field, algo);
    if (!strcmp(algo, "NVFP4") && group >= 0 && group != 16)
        return k3_fail(err, K3_ERR_FORMAT, "%s: %s: NVFP4 with group_size %lld (NVFP4 is group 16)",
                       what, field, (long long)group);
    /* 0 is ModelOpt's "no block size"; the blocks are 128x128 */
    if (!strcmp(k3_quant_algo_canonical(algo), "FP8_BLOCK_SCALES") && group > 0 && group != 128)
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: %s: %s with group_size %lld (FP8 block scales are 128x128)", what, field,
                       algo, (long long)group);
    return K3_OK;
}

int k3_quant_config_validate(const k3_quant_config *qc, k3_error *err) {
    const char *what = qc->origin ? qc->origin : "quantization config";
    int rc;
    if (qc->source == K3_QSRC_MODELOPT) {
        if ((rc = check_algo(qc->quant_algo, qc->group_size, what, "quant_algo", err)))
            return rc;
        bool mixed = qc->quant_algo && !strcmp(qc->quant_algo, "MIXED_PRECISION");
        if (mixed && qc->n_layers == 0)
            return k3_fail(err, K3_ERR_MISSING,
                           "%s: quantized_layers: missing (quant_algo is MIXED_PRECISION)", what);
        for (size_t i = 0; i < qc->n_layers; i++) {
            char field[600];
            snprintf(field, sizeof field, "quantized_layers.%s.quant_algo", qc->layers[i].name);
            if (!qc->layers[i].algo)
                return k3_fail(err, K3_ERR_MISSING, "%s: %s: missing", what, field);
            if ((rc = check_algo(qc->layers[i].algo, qc->layers[i].group_size, what, field, err)))
                return rc;
            if (!strcmp(qc->layers[i].algo, "MIXED_PRECISION"))
                return k3_fail(err, K3_ERR_FORMAT, "%s: %s: MIXED_PRECISION is not a layer format",
                               what, field);
        }
    }
    for (size_t i = 0; i < qc->n_groups; i++)
        for (size_t t = 0; t < qc->groups[i].n_targets; t++) {
            const char *x = qc->groups[i].targets[t].text;
            /* a class name (no dot, capitalized) other than Linear: k3 cannot tell module
             * classes from names, so it refuses rather than guess */
            if (strncmp(x, "re:", 3) && !strchr(x, '.') && x[0] >= 'A' && x[0] <= 'Z' &&
                strcmp(x, "Linear"))
                return k3_fail(err, K3_ERR_UNSUPPORTED,
                               "%s: config_groups.%s.targets: class target \"%s\" is not "
                               "supported (only Linear)",
                               what, qc->groups[i].name, x);
        }
    return K3_OK;
}
