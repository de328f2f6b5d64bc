/* k3 quantize: a BF16 (or F16/F32) Kimi K3 / Kimi-Linear checkpoint into a published
 * format, with k3's quantizers (ModelOpt's rules bit for bit, src/formats/block.h).
 *
 * What is quantized: by default the routed experts (--to nvfp4, nvfp4-ct, mxfp4) or every
 * linear layer (--to fp8-block); --only REGEX (repeatable) selects linear modules whose name
 * contains a match instead, --exclude REGEX removes them. Routers, embeddings and lm_head are
 * never quantized, and norms and other vectors are not linear layers: they and every
 * unselected tensor are copied byte for byte, shard for shard. The choice is written into
 * the quantization config: ModelOpt MIXED_PRECISION quantized_layers (hf_quant_config.json
 * and the inline copy) or a compressed-tensors group whose ignore list names every linear
 * module left unquantized.
 *
 * Left out: activation calibration. A BF16 checkpoint carries no activation statistics, so
 * NVFP4 modules get no input_scale / input_global_scale (the loader reads that as "none";
 * a W4A4 run must then compute its activation scale at run time). */
#include "load/emit.h"
#include "load/model.h"
#include "base/threadpool.h"

#include "formats/fp.h"
#include "moe/activation.h"
#include "io/json.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Reads the source tensor of it (BF16/F16/F32) as floats. */
static int read_values(void *ctx, const k3_emit_item *it, float *out, int64_t n, k3_error *err) {
    (void)ctx;
    const k3_st_tensor *t = it->copy;
    if ((int64_t)t->numel != n)
        return k3_fail(err, K3_ERR_SHAPE, "%s: %llu elements, expected %lld", t->name,
                       (unsigned long long)t->numel, (long long)n);
    size_t es = t->dtype == K3_DTYPE_F32 ? 4 : 2;
    void *buf = malloc((size_t)n * es);
    if (!buf) return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", t->name);
    int rc = k3_st_read(it->copy_file, t, buf, (size_t)n * es, K3_ST_READ_DONTNEED, err);
    for (int64_t i = 0; !rc && i < n; i++) {
        if (t->dtype == K3_DTYPE_F32) out[i] = ((const float *)buf)[i];
        else if (t->dtype == K3_DTYPE_BF16) out[i] = k3_bf16_to_f32(((const uint16_t *)buf)[i]);
        else out[i] = k3_f16_to_f32(((const uint16_t *)buf)[i]);
    }
    free(buf);
    return rc;
}

static float no_input_scale(void *ctx, const k3_emit_item *it) {
    (void)ctx, (void)it;
    return 0;
}

static int parse_to(const char *to, k3_qscheme *s, k3_error *err) {
    if (to && !strcmp(to, "nvfp4")) *s = K3_QS_NVFP4;
    else if (to && !strcmp(to, "nvfp4-ct")) *s = K3_QS_NVFP4_CT;
    else if (to && !strcmp(to, "mxfp4")) *s = K3_QS_MXFP4;
    else if (to && !strcmp(to, "fp8-block")) *s = K3_QS_FP8_BLOCK;
    else
        return k3_fail(err, K3_ERR_ARG, "quantize: --to: expected nvfp4|nvfp4-ct|mxfp4|fp8-block, "
                       "found '%s'", to ? to : "(nothing)");
    return K3_OK;
}

static int compile_all(k3_qpattern **out, const char *const *re, int n, const char *flag,
                       k3_error *err) {
    /* flag is the CLI spelling ("--only"); the struct fields are only / n_only */
    if (n < 0) return k3_fail(err, K3_ERR_ARG, "quantize: n_%s: expected >= 0, found %d", flag + 2, n);
    for (int i = 0; i < n; i++)
        if (!re || !re[i]) return k3_fail(err, K3_ERR_ARG, "quantize: %s[%d]: NULL", flag + 2, i);
    *out = calloc((size_t)(n > 0 ? n : 1), sizeof **out);
    if (!*out) return k3_fail(err, K3_ERR_NOMEM, "quantize: out of memory");
    for (int i = 0; i < n; i++) {
        /* a search, not an anchored match: the name contains a match */
        size_t len = strlen(re[i]) + 16;
        char *t = malloc(len);
        if (!t) return k3_fail(err, K3_ERR_NOMEM, "quantize: out of memory");
        snprintf(t, len, "re:.*(?:%s)", re[i]);
        int rc = k3_qpattern_compile(&(*out)[i], t, flag, err);
        free(t);
        if (rc) return rc;
    }
    return K3_OK;
}

static bool any_match(const k3_qpattern *p, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (k3_qpattern_match(&p[i], name)) return true;
    return false;
}

static int copy_file(const char *from, const char *to, k3_error *err) {
    FILE *a = fopen(from, "rb");
    if (!a) return k3_fail(err, K3_ERR_IO, "%s: %s", from, strerror(errno));
    FILE *b = fopen(to, "wb");
    if (!b) {
        fclose(a);
        return k3_fail(err, K3_ERR_IO, "%s: %s", to, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    int rc = K3_OK;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        if (fwrite(buf, 1, n, b) != n) rc = k3_fail(err, K3_ERR_IO, "%s: %s", to, strerror(errno));
    if (ferror(a)) rc = k3_fail(err, K3_ERR_IO, "%s: %s", from, strerror(errno));
    fclose(a);
    if (fclose(b) && !rc) rc = k3_fail(err, K3_ERR_IO, "%s: %s", to, strerror(errno));
    return rc;
}

/* Every regular file of IN that is not a shard, the index or a config k3 rewrites. */
static int copy_side_files(const char *in, const char *out, k3_error *err) {
    DIR *d = opendir(in);
    if (!d) return k3_fail(err, K3_ERR_IO, "%s: %s", in, strerror(errno));
    int rc = K3_OK;
    for (struct dirent *de; !rc && (de = readdir(d));) {
        const char *n = de->d_name;
        size_t len = strlen(n);
        if (n[0] == '.' || !strcmp(n, "config.json") || !strcmp(n, "hf_quant_config.json") ||
            !strcmp(n, "model.safetensors.index.json") ||
            (len > 12 && !strcmp(n + len - 12, ".safetensors")))
            continue;
        char a[4096], b[4096];
        snprintf(a, sizeof a, "%s/%s", in, n);
        snprintf(b, sizeof b, "%s/%s", out, n);
        struct stat st;
        if (stat(a, &st) || !S_ISREG(st.st_mode)) continue;
        rc = copy_file(a, b, err);
    }
    closedir(d);
    return rc;
}

/* Refuses an OUT that would overwrite the input: the writers truncate in place, while the
 * input's shards are still being read and its side files copied. The input directory
 * however spelled (trailing slashes, symlinks, bind mounts: same device and inode), or an
 * existing OUT holding the input's files under links. OUT nested in IN, or IN in OUT, only
 * adds files beside or above the input's and is allowed. */
static int check_out(const char *in, const char *out, k3_error *err) {
    struct stat so, si;
    if (stat(out, &so)) {
        if (errno == ENOENT) return K3_OK;
        return k3_fail(err, K3_ERR_IO, "%s: %s", out, strerror(errno));
    }
    if (!S_ISDIR(so.st_mode))
        return k3_fail(err, K3_ERR_ARG, "quantize: OUT %s exists and is not a directory", out);
    if (stat(in, &si)) return k3_fail(err, K3_ERR_IO, "%s: %s", in, strerror(errno));
    if (so.st_dev == si.st_dev && so.st_ino == si.st_ino)
        return k3_fail(err, K3_ERR_ARG, "quantize: OUT %s is the input directory %s; writing there "
                       "would destroy the input, choose another OUT", out, in);
    /* the input's regular files, read once: (device, inode) and name */
    struct infile {
        dev_t dev;
        ino_t ino;
        char name[4096];
    } *files = NULL;
    size_t nf = 0;
    DIR *di = opendir(in);
    if (!di) return k3_fail(err, K3_ERR_IO, "%s: %s", in, strerror(errno));
    int rc = K3_OK;
    for (struct dirent *ie; !rc && (ie = readdir(di));) {
        char b[4096];
        struct stat sb;
        snprintf(b, sizeof b, "%s/%s", in, ie->d_name);
        if (stat(b, &sb) || !S_ISREG(sb.st_mode)) continue;
        struct infile *x = realloc(files, (nf + 1) * sizeof *files);
        if (!x) {
            rc = k3_fail(err, K3_ERR_NOMEM, "quantize: out of memory");
            break;
        }
        files = x;
        files[nf].dev = sb.st_dev, files[nf].ino = sb.st_ino;
        snprintf(files[nf++].name, sizeof files->name, "%s", b);
    }
    closedir(di);
    DIR *d = rc ? NULL : opendir(out);
    if (!rc && !d) rc = k3_fail(err, K3_ERR_IO, "%s: %s", out, strerror(errno));
    for (struct dirent *de; !rc && (de = readdir(d));) {
        char a[4096];
        struct stat sa;
        snprintf(a, sizeof a, "%s/%s", out, de->d_name);
        if (stat(a, &sa) || !S_ISREG(sa.st_mode)) continue;
        for (size_t k = 0; k < nf && !rc; k++)
            if (files[k].dev == sa.st_dev && files[k].ino == sa.st_ino)
                rc = k3_fail(err, K3_ERR_ARG, "quantize: %s is the input file %s (a link); "
                             "writing OUT would destroy the input, choose another OUT", a,
                             files[k].name);
    }
    if (d) closedir(d);
    free(files);
    return rc;
}

/* config.json of IN with quantization_config replaced (top level; any text_config copy is
 * removed so the two cannot disagree). */
static int write_config(const char *in, const char *out, const k3_quant_config *qc, k3_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", in);
    cJSON *j, *inl = NULL;
    int rc = k3_json_parse_file(&j, path, 16u << 20, err);
    if (rc) return rc;
    cJSON_DeleteItemFromObjectCaseSensitive(j, "quantization_config");
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(j, "text_config");
    if (cJSON_IsObject(tc)) cJSON_DeleteItemFromObjectCaseSensitive(tc, "quantization_config");
    if (!(rc = k3_quant_config_to_inline_json(qc, &inl, err))) {
        cJSON_AddItemToObject(j, "quantization_config", inl);
        rc = k3_emit_json(out, "config.json", j, err);
    }
    cJSON_Delete(j);
    return rc;
}

int k3_quantize_checkpoint(const k3_quantize_opts *o, k3_error *err) {
    if (!o || !o->in || !o->out)
        return k3_fail(err, K3_ERR_ARG, "quantize: %s: NULL (IN and OUT are required)", !o ? "opts" : !o->in ? "in" : "out");
    int trc = k3_threads_check("quantize", o->n_threads, err);
    if (trc) return trc;
    k3_qscheme scheme = K3_QS_NONE;
    int rc = parse_to(o->to, &scheme, err);
    if (rc) return rc;
    k3_model *m = calloc(1, sizeof *m); /* reuses the loader's config + plan fields */
    if (!m) return k3_fail(err, K3_ERR_NOMEM, "quantize: out of memory");
    k3_qpattern *only = NULL, *excl = NULL;
    k3_emit_item *items = NULL, **by_plan = NULL;
    k3_quant_config qc;
    k3_quant_config_init(&qc);
    k3_quant_config_init(&m->qc);
    char **ignore = NULL;
    size_t n_ignore = 0;
    int64_t *experts_sel = NULL;
    if ((rc = compile_all(&only, o->only, o->n_only, "--only", err))) goto done;
    if ((rc = compile_all(&excl, o->exclude, o->n_exclude, "--exclude", err))) goto done;
    if ((rc = k3_checkpoint_open(&m->ck, o->in, err))) goto done;
    if ((rc = check_out(k3_checkpoint_path(m->ck), o->out, err))) goto done;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", k3_checkpoint_path(m->ck));
    if ((rc = k3_model_config_load(&m->mc, path, err))) goto done;
    if ((rc = k3_quant_config_load(&m->qc, k3_checkpoint_path(m->ck), err))) goto done;
    if (m->qc.source != K3_QSRC_NONE) {
        rc = k3_fail(err, K3_ERR_UNSUPPORTED, "quantize: %s is already quantized (%s); k3 quantize "
                     "reads BF16/F16/F32 checkpoints", o->in, m->qc.origin ? m->qc.origin : "quantization_config");
        goto done;
    }
    const char *prefix = k3_checkpoint_find(m->ck, "language_model.model.embed_tokens.weight") >= 0
                             ? "language_model." : "";
    if ((rc = k3_plan_build(&m->plan, &m->mc, prefix, err))) goto done;
    size_t nt = k3_checkpoint_tensor_count(m->ck);
    if (!(items = calloc(nt ? nt : 1, sizeof *items))) {
        rc = k3_fail(err, K3_ERR_NOMEM, "quantize: out of memory");
        goto done;
    }
    for (size_t k = 0; k < nt && !rc; k++) {
        k3_st_file *f;
        const k3_st_tensor *t;
        k3_tensor_info ti;
        if ((rc = k3_checkpoint_tensor_raw(m->ck, k, &f, &t, err)) ||
            (rc = k3_checkpoint_tensor_info(m->ck, k, &ti, err)))
            break;
        items[k] = (k3_emit_item){.copy_file = f, .copy = t, .shard = (int)ti.shard};
    }
    /* select linear modules; everything else stays a copy */
    size_t n_sel = 0;
    if (!(experts_sel = calloc((size_t)m->mc.num_hidden_layers, sizeof *experts_sel)) ||
        !(by_plan = calloc(m->plan.n ? m->plan.n : 1, sizeof *by_plan))) {
        rc = k3_fail(err, K3_ERR_NOMEM, "quantize: out of memory");
        goto done;
    }
    for (size_t i = 0; i < m->plan.n && !rc; i++) {
        const k3_pentry *e = &m->plan.e[i];
        if (!e->linear) continue;
        bool never = e->role == K3_R_ROUTER || e->role == K3_R_EMBED || e->role == K3_R_LM_HEAD;
        bool sel = o->n_only > 0 ? any_match(only, o->n_only, e->name)
                                 : scheme == K3_QS_FP8_BLOCK || e->role == K3_R_EXPERT;
        sel = sel && !never && !any_match(excl, o->n_exclude, e->name);
        char wname[600];
        snprintf(wname, sizeof wname, "%s.weight", e->name);
        int64_t k = k3_checkpoint_find(m->ck, wname);
        if (k < 0) {
            rc = k3_fail(err, K3_ERR_MISSING, "%s: missing from %s", wname, o->in);
            break;
        }
        if (!sel) {
            char **ni = realloc(ignore, (n_ignore + 1) * sizeof *ignore);
            if (!ni || !(ni[n_ignore] = strdup(e->name))) {
                if (ni) ignore = ni;
                rc = k3_fail(err, K3_ERR_NOMEM, "quantize: out of memory");
                break;
            }
            ignore = ni, n_ignore++;
            continue;
        }
        k3_emit_item *it = &items[k];
        k3_dtype dt = it->copy->dtype;
        if (dt != K3_DTYPE_BF16 && dt != K3_DTYPE_F16 && dt != K3_DTYPE_F32) {
            rc = k3_fail(err, K3_ERR_DTYPE, "%s: expected BF16|F16|F32 to quantize, found %s", wname,
                         k3_dtype_name(dt));
            break;
        }
        /* compared unsigned: an empty tensor's entry may exceed INT64_MAX */
        if (it->copy->rank != 2 || it->copy->shape[0] != (uint64_t)e->shape[0] ||
            it->copy->shape[1] != (uint64_t)e->shape[1]) {
            rc = k3_fail(err, K3_ERR_SHAPE, "%s: expected [%lld,%lld] from config.json", wname,
                         (long long)e->shape[0], (long long)e->shape[1]);
            break;
        }
        it->e = e, it->scheme = scheme, it->no_input_scale = true;
        by_plan[i] = it;
        n_sel++;
        if (e->role == K3_R_EXPERT) {
            experts_sel[e->layer]++;
            continue; /* declared per layer below */
        }
        if (scheme == K3_QS_NVFP4 || scheme == K3_QS_FP8_BLOCK)
            rc = k3_quant_config_add_layer(&qc, e->name, scheme == K3_QS_NVFP4 ? "NVFP4" : "FP8_PB_WO",
                                           scheme == K3_QS_NVFP4 ? 16 : 128, err);
    }
    /* Routed experts are resolved per layer (one format for all experts of a layer), so a
     * layer's experts are quantized all or none, and declared by one entry per layer. */
    for (int64_t l = 0; l < m->mc.num_hidden_layers && !rc; l++) {
        int64_t all = 3 * m->mc.num_experts;
        if (m->mc.layers[l].ffn != K3_FFN_MOE || experts_sel[l] == 0) continue;
        if (experts_sel[l] != all) {
            rc = k3_fail(err, K3_ERR_ARG, "quantize: layer %lld: %lld of %lld routed-expert modules "
                         "selected; a layer's experts share one format (select all or none)",
                         (long long)l, (long long)experts_sel[l], (long long)all);
            break;
        }
        char name[300];
        snprintf(name, sizeof name, "%smodel.layers.%lld.block_sparse_moe.experts", prefix, (long long)l);
        if (scheme == K3_QS_NVFP4 || scheme == K3_QS_FP8_BLOCK)
            rc = k3_quant_config_add_layer(&qc, name, scheme == K3_QS_NVFP4 ? "NVFP4" : "FP8_PB_WO",
                                           scheme == K3_QS_NVFP4 ? 16 : 128, err);
    }
    if (rc) goto done;
    if (n_sel == 0) {
        rc = k3_fail(err, K3_ERR_ARG, "quantize: no linear module selected (check --only/--exclude)");
        goto done;
    }
    if (scheme == K3_QS_NVFP4_CT || scheme == K3_QS_MXFP4)
        rc = k3_quant_plan_ct(&qc, scheme, (const char *const *)ignore, n_ignore, err);
    for (size_t i = 0; i < m->plan.n && !rc && (scheme == K3_QS_NVFP4 || scheme == K3_QS_FP8_BLOCK); i++)
        if (m->plan.e[i].role == K3_R_ROUTER) rc = k3_quant_config_add_exclude(&qc, m->plan.e[i].name, err);
    if (!rc) k3_emit_pair_gate_up(by_plan, &m->plan, k3_act_is_gated(k3_plan_expert_act(&m->mc)));
    uint64_t total;
    if (!rc) rc = k3_emit_prepare(items, nt, &total, err);
    if (rc) goto done;
    if (mkdir(o->out, 0755) && errno != EEXIST) {
        rc = k3_fail(err, K3_ERR_IO, "%s: %s", o->out, strerror(errno));
        goto done;
    }
    k3_emit_src src = {NULL, read_values, no_input_scale};
    k3_emit_opts eo = {.n_threads = o->n_threads, .progress = o->progress != 0, .what = "quantize"};
    int n_shards = (int)k3_checkpoint_shard_count(m->ck);
    if ((rc = k3_emit(o->out, items, nt, n_shards, total, &src, &eo, err))) goto done;
    if ((rc = write_config(k3_checkpoint_path(m->ck), o->out, &qc, err))) goto done;
    if (qc.source == K3_QSRC_MODELOPT) {
        cJSON *hf = NULL;
        if (!(rc = k3_quant_config_to_hf_json(&qc, &hf, err)))
            rc = k3_emit_json(o->out, "hf_quant_config.json", hf, err);
        cJSON_Delete(hf);
        if (rc) goto done;
    }
    rc = copy_side_files(k3_checkpoint_path(m->ck), o->out, err);
done:
    for (size_t i = 0; i < n_ignore; i++) free(ignore[i]);
    free(ignore);
    for (int i = 0; only && i < o->n_only; i++) k3_qpattern_free(&only[i]);
    for (int i = 0; excl && i < o->n_exclude; i++) k3_qpattern_free(&excl[i]);
    free(only), free(excl);
    free(items);
    free(by_plan);
    free(experts_sel);
    k3_quant_config_free(&qc);
    k3_model_close(m);
    return rc;
}
