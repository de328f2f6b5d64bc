/* The checkpoint emitter; see emit.h. */
#include "load/emit.h"

#include "formats/block.h"
#include "formats/fp.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void ft(k3_emit_item *it, const char *suffix, k3_dtype dt, int rank, uint64_t a,
               uint64_t b, uint64_t c, uint64_t d) {
    k3_etensor *f = &it->t[it->nt++];
    snprintf(f->name, sizeof f->name, "%s%s", it->e->name, suffix);
    f->dtype = dt, f->rank = rank;
    uint64_t s[4] = {a, b, c, d};
    memset(f->shape, 0, sizeof f->shape);
    memcpy(f->shape, s, sizeof s);
    uint64_t numel;
    k3_st_tensor_bytes(dt, rank, f->shape, &numel, &f->nbytes);
    it->bytes += f->nbytes;
}

static int prepare_one(k3_emit_item *it, k3_error *err) {
    it->nt = 0, it->bytes = 0;
    if (!it->e) {
        k3_etensor *f = &it->t[it->nt++];
        snprintf(f->name, sizeof f->name, "%s", it->copy->name);
        f->dtype = it->copy->dtype, f->rank = it->copy->rank;
        memcpy(f->shape, it->copy->shape, sizeof f->shape);
        f->nbytes = k3_st_nbytes(it->copy);
        it->bytes = f->nbytes;
        return K3_OK;
    }
    const k3_pentry *e = it->e;
    if (!e->linear) {
        ft(it, "", it->plain_dtype, e->rank, (uint64_t)e->shape[0], (uint64_t)e->shape[1],
           (uint64_t)e->shape[2], (uint64_t)e->shape[3]);
        return K3_OK;
    }
    uint64_t r = (uint64_t)e->shape[0], c = (uint64_t)e->shape[1];
    bool in = !it->no_input_scale;
    if ((it->scheme == K3_QS_NVFP4 || it->scheme == K3_QS_NVFP4_CT) && c % 16)
        return k3_fail(err, K3_ERR_SHAPE, "%s: NVFP4 needs in_features %% 16 == 0, found %llu",
                       e->name, (unsigned long long)c);
    if (it->scheme == K3_QS_MXFP4 && c % 32)
        return k3_fail(err, K3_ERR_SHAPE, "%s: MXFP4 needs in_features %% 32 == 0, found %llu",
                       e->name, (unsigned long long)c);
    switch (it->scheme) {
    case K3_QS_FP8_BLOCK:
        ft(it, ".weight", K3_DTYPE_F8_E4M3, 2, r, c, 0, 0);
        ft(it, ".weight_scale", K3_DTYPE_F32, 4, (r + 127) / 128, 1, (c + 127) / 128, 1);
        break;
    case K3_QS_NVFP4:
        ft(it, ".weight", K3_DTYPE_U8, 2, r, c / 2, 0, 0);
        ft(it, ".weight_scale", K3_DTYPE_F8_E4M3, 2, r, c / 16, 0, 0);
        ft(it, ".weight_scale_2", K3_DTYPE_F32, 0, 0, 0, 0, 0);
        if (in) ft(it, ".input_scale", K3_DTYPE_F32, 0, 0, 0, 0, 0);
        break;
    case K3_QS_NVFP4_CT:
        ft(it, ".weight_packed", K3_DTYPE_U8, 2, r, c / 2, 0, 0);
        ft(it, ".weight_scale", K3_DTYPE_F8_E4M3, 2, r, c / 16, 0, 0);
        ft(it, ".weight_global_scale", K3_DTYPE_F32, 1, 1, 0, 0, 0);
        if (in) ft(it, ".input_global_scale", K3_DTYPE_F32, 1, 1, 0, 0, 0);
        break;
    case K3_QS_MXFP4:
        ft(it, ".weight_packed", K3_DTYPE_U8, 2, r, c / 2, 0, 0);
        ft(it, ".weight_scale", K3_DTYPE_U8, 2, r, c / 32, 0, 0);
        break;
    case K3_QS_NONE:
        ft(it, ".weight", it->plain_dtype, 2, r, c, 0, 0);
        break;
    default:
        return k3_fail(err, K3_ERR_UNSUPPORTED, "%s: k3 cannot write scheme %s", e->name,
                       k3_qscheme_name(it->scheme));
    }
    return K3_OK;
}

int k3_emit_prepare(k3_emit_item *items, size_t n, uint64_t *total, k3_error *err) {
    *total = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = prepare_one(&items[i], err);
        if (rc) return rc;
        *total += items[i].bytes;
    }
    return K3_OK;
}

void k3_emit_split(k3_emit_item *items, size_t n, int n_shards, uint64_t total) {
    uint64_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        int s = (int)(((unsigned __int128)acc * (unsigned)n_shards) / (total ? total : 1));
        items[i].shard = s < n_shards ? s : n_shards - 1;
        acc += items[i].bytes;
    }
}

void k3_emit_pair_gate_up(k3_emit_item *const *by_plan, const k3_plan *p, bool gated) {
    for (size_t i = 0; gated && i + 2 < p->n; i++) {
        const k3_pentry *e = &p->e[i];
        k3_emit_item *a = by_plan[i], *b = by_plan[i + 2];
        if (e->role != K3_R_EXPERT || e->proj != 1 || !a || !b || p->e[i + 2].proj != 3) continue;
        bool nv = (a->scheme == K3_QS_NVFP4 || a->scheme == K3_QS_NVFP4_CT) && b->scheme == a->scheme;
        if (nv) a->partner = b, b->partner = a;
    }
}

static float amax_of(const float *v, int64_t n) {
    float a = 0;
    for (int64_t i = 0; i < n; i++) a = fabsf(v[i]) > a ? fabsf(v[i]) : a;
    return a;
}

/* The weight_scale_2 of it and its partner together (their joint amax), read again from the
 * source so each item's bytes still depend on nothing but the items. */
static int shared_ws2(const k3_emit_item *it, const k3_emit_src *src, const float *v, int64_t n,
                      float *ws2, k3_error *err) {
    float *pv = malloc((size_t)n * sizeof *pv);
    if (!pv) return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", it->e->name);
    int rc = src->values(src->ctx, it->partner, pv, n, err);
    if (!rc) {
        float a = amax_of(v, n), b = amax_of(pv, n), amax = a > b ? a : b;
        if (!isfinite(amax)) /* the quantizer names the bad value of its own matrix */
            amax = a;
        *ws2 = k3_nvfp4_weight_scale_2(amax);
        if (!(*ws2 >= FLT_MIN))
            rc = k3_fail(err, K3_ERR_NUMERIC, "%s: amax %g is too small: weight_scale_2 would be "
                         "subnormal", it->e->name, (double)amax);
    }
    free(pv);
    return rc;
}

/* Produces one item into bufs[0..nt) (each t[i].nbytes). */
static int produce(const k3_emit_item *it, const k3_emit_src *src, void **bufs, k3_error *err) {
    if (!it->e) {
        int rc = k3_st_read(it->copy_file, it->copy, bufs[0], it->t[0].nbytes, K3_ST_READ_DONTNEED, err);
        return rc;
    }
    const k3_pentry *e = it->e;
    int64_t n = 1;
    for (int i = 0; i < e->rank; i++) n *= e->shape[i];
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", e->name);
    int rc = src->values(src->ctx, it, v, n, err);
    int64_t r = e->shape[0], c = e->linear ? e->shape[1] : 0;
    if (rc) {
        /* the callback named the tensor */
    } else if (!e->linear || it->scheme == K3_QS_NONE) {
        k3_dtype dt = it->t[0].dtype;
        for (int64_t i = 0; i < n; i++) {
            if (dt == K3_DTYPE_F32) ((float *)bufs[0])[i] = v[i];
            else if (dt == K3_DTYPE_F16) ((uint16_t *)bufs[0])[i] = k3_f32_to_f16(v[i]);
            else ((uint16_t *)bufs[0])[i] = k3_f32_to_bf16(v[i]);
        }
    } else if (it->scheme == K3_QS_FP8_BLOCK) {
        rc = k3_fp8_block_quantize(v, r, c, bufs[0], bufs[1], err);
    } else if (it->scheme == K3_QS_NVFP4 || it->scheme == K3_QS_NVFP4_CT) {
        float ws2, in = it->no_input_scale ? 0 : src->input_scale(src->ctx, it);
        if (!it->partner)
            rc = k3_nvfp4_quantize_weight(v, r, c, bufs[0], bufs[1], &ws2, err);
        else if (!(rc = shared_ws2(it, src, v, n, &ws2, err)))
            rc = k3_nvfp4_quantize_weight_gs(v, r, c, ws2, bufs[0], bufs[1], err);
        if (it->scheme == K3_QS_NVFP4_CT) ws2 = 1.0f / ws2, in = 1.0f / in;
        memcpy(bufs[2], &ws2, 4);
        if (!it->no_input_scale) memcpy(bufs[3], &in, 4);
    } else if (it->scheme == K3_QS_MXFP4) {
        rc = k3_mxfp4_quantize(v, r, c, bufs[0], bufs[1], err);
    }
    free(v);
    if (rc && err && !strstr(err->msg, e->name)) {
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err->msg);
        k3_fail(err, rc, "%s: %s", e->name, m);
    }
    return rc;
}

typedef struct run {
    k3_emit_item *items;
    size_t *order, n_order, next;
    k3_st_writer *w;
    const k3_emit_src *src;
    pthread_mutex_t mu;
    int rc;
    k3_error err;
    uint64_t done, total;
    double t0, last;
    bool progress, printed;
    const char *what;
} run;

static void progress_line(run *R, bool final) {
    double now = k3_now(), dt = now - R->t0;
    if (!R->progress || (!final && (now - R->last < 0.5 || dt < 1.0)) || (final && !R->printed))
        return;
    R->last = now, R->printed = true;
    double gbs = dt > 0 ? (double)R->done / dt / 1e9 : 0;
    double eta = gbs > 0 ? (double)(R->total - R->done) / 1e9 / gbs : 0;
    fprintf(stderr, "\rk3: %s: %.2f / %.2f GB, %.2f GB/s, ETA %.0f s   ", R->what,
            (double)R->done / 1e9, (double)R->total / 1e9, gbs, eta);
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
        const k3_emit_item *it = &R->items[R->order[k]];
        void *bufs[4] = {0};
        k3_error err = {0};
        int rc = K3_OK;
        for (int i = 0; i < it->nt && !rc; i++)
            if (!(bufs[i] = malloc(it->t[i].nbytes ? it->t[i].nbytes : 1)))
                rc = k3_fail(&err, K3_ERR_NOMEM, "%s: out of memory", it->t[i].name);
        if (!rc) rc = produce(it, R->src, bufs, &err);
        pthread_mutex_lock(&R->mu);
        for (int i = 0; i < it->nt && !rc; i++)
            rc = k3_st_writer_put(R->w, it->t[i].name, bufs[i], it->t[i].nbytes, &err);
        if (rc && R->rc == K3_OK) R->rc = rc, R->err = err;
        R->done += it->bytes;
        progress_line(R, false);
        pthread_mutex_unlock(&R->mu);
        for (int i = 0; i < it->nt; i++) free(bufs[i]);
    }
}

int k3_emit_json(const char *dir, const char *file, const cJSON *j, k3_error *err) {
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

int k3_emit(const char *dir, k3_emit_item *items, size_t n, int n_shards, uint64_t total,
            const k3_emit_src *src, const k3_emit_opts *o, k3_error *err) {
    run R = {.items = items, .src = src, .total = total, .t0 = k3_now(), .progress = o->progress,
             .what = o->what ? o->what : "write"};
    int nthr = o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nthr < 1) nthr = 1;
    if (nthr > 256) nthr = 256;
    cJSON *ix = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(ix, "metadata");
    cJSON *map = cJSON_AddObjectToObject(ix, "weight_map");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    int rc = K3_OK;
    R.order = malloc((n ? n : 1) * sizeof *R.order);
    if (!R.order || !map) rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", R.what);
    pthread_mutex_init(&R.mu, NULL);
    for (int s = 0; s < n_shards && !rc; s++) {
        char file[64], path[4096];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        R.n_order = 0;
        for (size_t i = 0; i < n; i++)
            if (items[i].shard == s) R.order[R.n_order++] = i;
        if ((rc = k3_st_writer_new(&R.w, err))) break;
        rc = k3_st_writer_metadata(R.w, "format", "pt", err);
        for (size_t k = 0; k < R.n_order && !rc; k++) {
            const k3_emit_item *it = &items[R.order[k]];
            for (int i = 0; i < it->nt && !rc; i++) {
                rc = k3_st_writer_declare(R.w, it->t[i].name, it->t[i].dtype, it->t[i].rank,
                                          it->t[i].shape, err);
                cJSON_AddStringToObject(map, it->t[i].name, file);
            }
        }
        if (!rc) rc = k3_st_writer_begin(R.w, path, err);
        if (!rc) {
            R.next = 0;
            pthread_t th[256];
            int nt = 0;
            for (; nt < nthr; nt++)
                if (pthread_create(&th[nt], NULL, worker, &R)) break;
            if (nt == 0) worker(&R);
            for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
            if (R.rc) {
                rc = R.rc;
                if (err) *err = R.err;
            }
        }
        if (!rc) rc = k3_st_writer_finish(R.w, err);
        k3_st_writer_free(R.w);
        R.w = NULL;
    }
    pthread_mutex_destroy(&R.mu);
    if (!rc) progress_line(&R, true);
    if (!rc) rc = k3_emit_json(dir, "model.safetensors.index.json", ix, err);
    cJSON_Delete(ix);
    free(R.order);
    return rc;
}
