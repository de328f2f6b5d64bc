/* make-tiny's weight generator and shard writer; see tiny.h.
 *
 * Work is one plan entry at a time (a linear module or a plain tensor): its float values are
 * generated from (seed, name), quantized in the declared scheme and handed to the streaming
 * safetensors writer of the shard it belongs to. Worker threads take entries in plan order;
 * the file layout is fixed before any byte is written, so the order in which workers finish
 * changes nothing on disk. Peak memory is a few entries per thread (the largest K3 entry is
 * a 12288x7168 attention projection, 352 MB as floats). */
#include "load/tiny.h"

#include "formats/block.h"
#include "formats/fp.h"
#include "io/json.h"
#include "io/safetensors.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    for (int64_t i = 0; i < n; i++) out[i] = a * unif(&s);
}

static void a_log_values(uint64_t seed, const k3_pentry *e, int64_t heads, float *out) {
    uint64_t s = name_seed(seed, e->name);
    for (int64_t i = 0; i < e->shape[0]; i++)
        out[i] = i < heads ? logf(8.5f + 7.5f * unif(&s)) : 0.0f;
}

/* ---- file tensors of one plan entry ----------------------------------------------- */

typedef struct ftensor {
    char name[512];
    k3_dtype dtype;
    int rank;
    uint64_t shape[4];
    uint64_t nbytes;
} ftensor;

typedef struct item {
    const k3_pentry *e;
    k3_qscheme scheme;
    k3_dtype plain_dtype;
    ftensor t[4];
    int nt;
    uint64_t bytes;
    int shard;
} item;

static void ft(item *it, const char *suffix, k3_dtype dt, int rank, uint64_t a, uint64_t b,
               uint64_t c, uint64_t d) {
    ftensor *f = &it->t[it->nt++];
    snprintf(f->name, sizeof f->name, "%s%s", it->e->name, suffix);
    f->dtype = dt, f->rank = rank;
    uint64_t s[4] = {a, b, c, d};
    memcpy(f->shape, s, sizeof s);
    uint64_t numel;
    k3_st_tensor_bytes(dt, rank, f->shape, &numel, &f->nbytes);
    it->bytes += f->nbytes;
}

static void plan_item(item *it) {
    const k3_pentry *e = it->e;
    it->nt = 0, it->bytes = 0;
    if (!e->linear) {
        ft(it, "", it->plain_dtype, e->rank, (uint64_t)e->shape[0], (uint64_t)e->shape[1],
           (uint64_t)e->shape[2], (uint64_t)e->shape[3]);
        return;
    }
    uint64_t r = (uint64_t)e->shape[0], c = (uint64_t)e->shape[1];
    switch (it->scheme) {
    case K3_QS_FP8_BLOCK:
        ft(it, ".weight", K3_DTYPE_F8_E4M3, 2, r, c, 0, 0);
        ft(it, ".weight_scale", K3_DTYPE_F32, 4, (r + 127) / 128, 1, (c + 127) / 128, 1);
        break;
    case K3_QS_NVFP4:
        ft(it, ".weight", K3_DTYPE_U8, 2, r, c / 2, 0, 0);
        ft(it, ".weight_scale", K3_DTYPE_F8_E4M3, 2, r, c / 16, 0, 0);
        ft(it, ".weight_scale_2", K3_DTYPE_F32, 0, 0, 0, 0, 0);
        ft(it, ".input_scale", K3_DTYPE_F32, 0, 0, 0, 0, 0);
        break;
    case K3_QS_NVFP4_CT:
        ft(it, ".weight_packed", K3_DTYPE_U8, 2, r, c / 2, 0, 0);
        ft(it, ".weight_scale", K3_DTYPE_F8_E4M3, 2, r, c / 16, 0, 0);
        ft(it, ".weight_global_scale", K3_DTYPE_F32, 1, 1, 0, 0, 0);
        ft(it, ".input_global_scale", K3_DTYPE_F32, 1, 1, 0, 0, 0);
        break;
    case K3_QS_MXFP4:
        ft(it, ".weight_packed", K3_DTYPE_U8, 2, r, c / 2, 0, 0);
        ft(it, ".weight_scale", K3_DTYPE_U8, 2, r, c / 32, 0, 0);
        break;
    default:
        ft(it, ".weight", K3_DTYPE_BF16, 2, r, c, 0, 0);
        break;
    }
}

/* Generates and quantizes one item into bufs[0..nt) (each t[i].nbytes). */
static int produce(const item *it, uint64_t seed, int64_t kda_heads, void **bufs, k3_error *err) {
    const k3_pentry *e = it->e;
    int64_t n = 1;
    for (int i = 0; i < e->rank; i++) n *= e->shape[i];
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", e->name);
    if (e->role == K3_R_KDA_A_LOG) a_log_values(seed, e, kda_heads, v);
    else k3_tiny_values(seed, e, v, n);
    int rc = K3_OK;
    int64_t r = e->shape[0], c = e->linear ? e->shape[1] : 0;
    if (!e->linear || it->scheme == K3_QS_NONE) {
        k3_dtype dt = it->t[0].dtype;
        for (int64_t i = 0; i < n; i++) {
            if (dt == K3_DTYPE_F32) ((float *)bufs[0])[i] = v[i];
            else ((uint16_t *)bufs[0])[i] = k3_f32_to_bf16(v[i]);
        }
    } else if (it->scheme == K3_QS_FP8_BLOCK) {
        rc = k3_fp8_block_quantize(v, r, c, bufs[0], bufs[1], err);
    } else if (it->scheme == K3_QS_NVFP4 || it->scheme == K3_QS_NVFP4_CT) {
        float ws2, in = k3_tiny_input_scale(seed, e->name);
        rc = k3_nvfp4_quantize_weight(v, r, c, bufs[0], bufs[1], &ws2, err);
        if (it->scheme == K3_QS_NVFP4_CT) ws2 = 1.0f / ws2, in = 1.0f / in;
        memcpy(bufs[2], &ws2, 4);
        memcpy(bufs[3], &in, 4);
    } else if (it->scheme == K3_QS_MXFP4) {
        rc = k3_mxfp4_quantize(v, r, c, bufs[0], bufs[1], err);
    } else {
        rc = k3_fail(err, K3_ERR_UNSUPPORTED, "%s: make-tiny cannot write scheme %s", e->name,
                     k3_qscheme_name(it->scheme));
    }
    free(v);
    if (rc && err && !strstr(err->msg, e->name)) {
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err->msg);
        k3_fail(err, rc, "%s: %s", e->name, m);
    }
    return rc;
}

static int k3_tiny_run(const k3_tiny_opts *o, uint64_t *bytes, k3_error *err);

/* ---- the run ----------------------------------------------------------------------- */

typedef struct run {
    item *items;
    size_t n_items;
    size_t next;          /* next item to produce (under mu) */
    size_t *order;        /* items of the current shard */
    size_t n_order;
    k3_st_writer *w;
    uint64_t seed;
    int64_t kda_heads;
    pthread_mutex_t mu;
    int rc;
    k3_error err;
    uint64_t done_bytes, total_bytes;
    double t0, last;
    bool progress, printed;
} run;

static void progress_line(run *R, bool final) {
    double now = k3_now(), dt = now - R->t0;
    if (!R->progress || (!final && (now - R->last < 0.5 || dt < 1.0)) || (final && !R->printed))
        return;
    R->last = now, R->printed = true;
    double gbs = dt > 0 ? (double)R->done_bytes / dt / 1e9 : 0;
    double eta = gbs > 0 ? (double)(R->total_bytes - R->done_bytes) / 1e9 / gbs : 0;
    fprintf(stderr, "\rk3: make-tiny: %.2f / %.2f GB, %.2f GB/s, ETA %.0f s   ",
            (double)R->done_bytes / 1e9, (double)R->total_bytes / 1e9, gbs, eta);
    if (final) fputc('\n', stderr);
}

static void *worker(void *arg) {
    run *R = arg;
    for (;;) {
        pthread_mutex_lock(&R->mu);
        size_t k = R->next++;
        bool stop = R->rc != K3_OK || k >= R->n_order;
        pthread_mutex_unlock(&R->mu);
        if (stop) return NULL;
        const item *it = &R->items[R->order[k]];
        void *bufs[4] = {0};
        k3_error err = {0};
        int rc = K3_OK;
        for (int i = 0; i < it->nt && !rc; i++)
            if (!(bufs[i] = malloc(it->t[i].nbytes ? it->t[i].nbytes : 1)))
                rc = k3_fail(&err, K3_ERR_NOMEM, "%s: out of memory", it->t[i].name);
        if (!rc) rc = produce(it, R->seed, R->kda_heads, bufs, &err);
        pthread_mutex_lock(&R->mu);
        for (int i = 0; i < it->nt && !rc; i++)
            rc = k3_st_writer_put(R->w, it->t[i].name, bufs[i], it->t[i].nbytes, &err);
        if (rc && R->rc == K3_OK) R->rc = rc, R->err = err;
        R->done_bytes += it->bytes;
        progress_line(R, false);
        pthread_mutex_unlock(&R->mu);
        for (int i = 0; i < it->nt; i++) free(bufs[i]);
    }
}

static int write_json(const char *dir, const char *file, cJSON *j, k3_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *s = cJSON_Print(j);
    if (!s) return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", path);
    FILE *f = fopen(path, "w");
    int rc = K3_OK;
    if (!f || fputs(s, f) < 0 || fputc('\n', f) < 0)
        rc = k3_fail(err, K3_ERR_IO, "%s: %s", path, strerror(errno));
    if (f && fclose(f) && !rc) rc = k3_fail(err, K3_ERR_IO, "%s: %s", path, strerror(errno));
    free(s);
    return rc;
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

static k3_dtype plain_dtype_of(k3_role r) {
    switch (r) {
    case K3_R_KDA_A_LOG: case K3_R_KDA_DT_BIAS: case K3_R_KDA_CONV: case K3_R_ROUTER_BIAS:
        return K3_DTYPE_F32; /* k3-architecture.md §8.2 */
    default:
        return K3_DTYPE_BF16;
    }
}

static int write_shards(run *R, const char *dir, int n_shards, int n_threads, k3_error *err) {
    cJSON *ix = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(ix, "metadata");
    cJSON *map = cJSON_AddObjectToObject(ix, "weight_map");
    cJSON_AddNumberToObject(meta, "total_size", (double)R->total_bytes);
    int rc = K3_OK;
    R->order = malloc(R->n_items * sizeof *R->order);
    if (!R->order) rc = k3_fail(err, K3_ERR_NOMEM, "make-tiny: out of memory");
    for (int s = 0; s < n_shards && !rc; s++) {
        char file[64], path[4096];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        R->n_order = 0;
        for (size_t i = 0; i < R->n_items; i++)
            if (R->items[i].shard == s) R->order[R->n_order++] = i;
        if ((rc = k3_st_writer_new(&R->w, err))) break;
        rc = k3_st_writer_metadata(R->w, "format", "pt", err);
        for (size_t k = 0; k < R->n_order && !rc; k++) {
            const item *it = &R->items[R->order[k]];
            for (int i = 0; i < it->nt && !rc; i++) {
                rc = k3_st_writer_declare(R->w, it->t[i].name, it->t[i].dtype, it->t[i].rank,
                                          it->t[i].shape, err);
                cJSON_AddStringToObject(map, it->t[i].name, file);
            }
        }
        if (!rc) rc = k3_st_writer_begin(R->w, path, err);
        if (!rc) {
            R->next = 0;
            pthread_t th[256];
            int nt = 0;
            for (; nt < n_threads && nt < 256; nt++)
                if (pthread_create(&th[nt], NULL, worker, R)) break;
            if (nt == 0) worker(R);
            for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
            if (R->rc) rc = R->rc, *err = R->err;
        }
        if (!rc) rc = k3_st_writer_finish(R->w, err);
        k3_st_writer_free(R->w);
        R->w = NULL;
    }
    if (!rc) rc = write_json(dir, "model.safetensors.index.json", ix, err);
    cJSON_Delete(ix);
    free(R->order);
    R->order = NULL;
    return rc;
}

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
    item *items = NULL;
    cJSON *inl = NULL, *hf = NULL;
    int rc = o->custom ? k3_model_config_copy(&mc, o->custom, err) : k3_tiny_config(o->preset, &mc, err);
    if (rc) return rc;
    k3_quant_config_init(&qc);
    if ((rc = k3_tiny_quant(o->format, &mc, &qc, err))) goto done;
    if ((rc = k3_plan_build(&plan, &mc, "language_model.", err))) goto done;
    if (!(items = calloc(plan.n, sizeof *items))) {
        rc = k3_fail(err, K3_ERR_NOMEM, "make-tiny: out of memory");
        goto done;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < plan.n && !rc; i++) {
        item *it = &items[i];
        it->e = &plan.e[i];
        it->plain_dtype = plain_dtype_of(it->e->role);
        if (it->e->linear) {
            k3_qdecl d;
            if (it->e->role == K3_R_EXPERT) {
                rc = k3_quant_resolve_experts(&qc, it->e->layer, &d, err);
            } else {
                char mod[512];
                /* declarations are matched without the wrapper prefix variants mattering */
                snprintf(mod, sizeof mod, "%s", it->e->name);
                rc = k3_quant_resolve(&qc, mod, &d, err);
            }
            if (rc) break;
            it->scheme = d.scheme;
            /* the router and embeddings stay as they are, whatever a class target says */
            if (it->e->role == K3_R_ROUTER || it->e->role == K3_R_EMBED ||
                it->e->role == K3_R_LM_HEAD)
                it->scheme = K3_QS_NONE;
        }
        plan_item(it);
        total += it->bytes;
    }
    if (rc) goto done;
    if (bytes) {
        *bytes = total;
        goto done;
    }
    int n_shards = o->n_shards > 0 ? o->n_shards : o->preset == K3_TINY_TINY ? 3 : o->preset == K3_TINY_SMALL ? 4 : 8;
    uint64_t acc = 0;
    for (size_t i = 0; i < plan.n; i++) {
        int s = (int)((acc * (uint64_t)n_shards) / (total ? total : 1));
        items[i].shard = s < n_shards ? s : n_shards - 1;
        acc += items[i].bytes;
    }
    int nthr = o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nthr < 1) nthr = 1;
    run R = {.items = items, .n_items = plan.n, .seed = o->seed, .kda_heads = mc.kda_num_heads,
             .total_bytes = total, .t0 = k3_now(), .progress = o->progress};
    pthread_mutex_init(&R.mu, NULL);
    rc = write_shards(&R, o->dir, n_shards, nthr, err);
    pthread_mutex_destroy(&R.mu);
    if (!rc) progress_line(&R, true);
    if (rc) goto done;
    /* config.json (with the inline quantization_config), hf_quant_config.json, tokenizer */
    if (qc.source != K3_QSRC_NONE && (rc = k3_quant_config_to_inline_json(&qc, &inl, err))) goto done;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", o->dir);
    if ((rc = k3_model_config_write(&mc, inl, path, err))) goto done;
    if (qc.source == K3_QSRC_MODELOPT) {
        if ((rc = k3_quant_config_to_hf_json(&qc, &hf, err))) goto done;
        if ((rc = write_json(o->dir, "hf_quant_config.json", hf, err))) goto done;
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
