/* Whole-file helpers on top of the streaming writer: one file from tensors in memory, and a
 * sharded checkpoint in the Hugging Face layout (model-0000i-of-0000N.safetensors plus
 * model.safetensors.index.json with metadata.total_size and a name-sorted weight_map). Used by
 * tests and by tools that build small checkpoints; large conversions stream through the
 * k3_st_writer API directly. */
#include "io/checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int k3_st_write_file(const char *path, const k3_st_wtensor *t, size_t n,
                     const char *const (*meta)[2], size_t n_meta, k3_error *err) {
    k3_st_writer *w;
    int rc = k3_st_writer_new(&w, err);
    if (rc)
        return rc;
    for (size_t i = 0; !rc && i < n_meta; i++)
        rc = k3_st_writer_metadata(w, meta[i][0], meta[i][1], err);
    for (size_t i = 0; !rc && i < n; i++)
        rc = k3_st_writer_declare(w, t[i].name, t[i].dtype, t[i].rank, t[i].shape, err);
    if (!rc)
        rc = k3_st_writer_begin(w, path, err);
    for (size_t i = 0; !rc && i < n; i++) {
        uint64_t nb = 0;
        k3_st_tensor_bytes(t[i].dtype, t[i].rank, t[i].shape, NULL, &nb); /* checked by declare */
        rc = k3_st_writer_put(w, t[i].name, t[i].data, (size_t)nb, err);
    }
    if (!rc)
        rc = k3_st_writer_finish(w, err);
    k3_st_writer_free(w);
    return rc;
}

static void json_escape(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

typedef struct wm_entry {
    const char *name;
    size_t shard;
} wm_entry;

static int wm_cmp(const void *a, const void *b) {
    return strcmp(((const wm_entry *)a)->name, ((const wm_entry *)b)->name);
}

static int write_index(const char *dir, size_t n_shards, const k3_st_wtensor *t, size_t n,
                       const size_t *shard, uint64_t total, k3_error *err) {
    size_t plen = strlen(dir) + sizeof "/" K3_INDEX_NAME ".tmp";
    char *path = malloc(plen), *tmp = malloc(plen);
    wm_entry *wm = malloc((n ? n : 1) * sizeof *wm);
    int rc = K3_OK;
    if (!path || !tmp || !wm) {
        rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory for the index", dir);
        goto done;
    }
    snprintf(path, plen, "%s/%s", dir, K3_INDEX_NAME);
    snprintf(tmp, plen, "%s/%s.tmp", dir, K3_INDEX_NAME);
    for (size_t i = 0; i < n; i++)
        wm[i] = (wm_entry){t[i].name, shard[i]};
    qsort(wm, n, sizeof *wm, wm_cmp);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        rc = k3_fail(err, K3_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto done;
    }
    fprintf(f, "{\n  \"metadata\": {\n    \"total_size\": %" PRIu64 "\n  },\n  \"weight_map\": {",
            total);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%s\n    ", i ? "," : "");
        json_escape(f, wm[i].name);
        fprintf(f, ": \"model-%05zu-of-%05zu.safetensors\"", wm[i].shard + 1, n_shards);
    }
    fprintf(f, "\n  }\n}\n");
    if (ferror(f) | fclose(f))
        rc = k3_fail(err, K3_ERR_IO, "%s: write failed", tmp);
    else if (rename(tmp, path) != 0)
        rc = k3_fail(err, K3_ERR_IO, "%s: rename: %s", tmp, strerror(errno));
    if (rc)
        unlink(tmp);
done:
    free(path);
    free(tmp);
    free(wm);
    return rc;
}

int k3_st_write_sharded(const char *dir, size_t n_shards, const k3_st_wtensor *t, size_t n,
                        const size_t *shard_of, const char *const (*meta)[2], size_t n_meta,
                        k3_error *err) {
    if (n_shards == 0 || n_shards > 99999)
        return k3_fail(err, K3_ERR_ARG, "%s: shard count %zu outside [1, 99999]", dir, n_shards);
    size_t *shard = malloc((n ? n : 1) * sizeof *shard);
    k3_st_wtensor *sel = malloc((n ? n : 1) * sizeof *sel);
    char *path = malloc(strlen(dir) + 64);
    int rc = K3_OK;
    if (!shard || !sel || !path) {
        rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t nb;
        if (!k3_st_tensor_bytes(t[i].dtype, t[i].rank, t[i].shape, NULL, &nb) ||
            !k3_add_u64(total, nb, &total)) {
            rc = k3_fail(err, K3_ERR_SHAPE, "%s: tensor \"%s\": invalid dtype or shape", dir,
                         t[i].name);
            goto done;
        }
    }
    /* Without a placement: consecutive runs of about total/n_shards bytes, every shard
     * non-empty while tensors remain for it. */
    double acc = 0;
    size_t s = 0, in_s = 0;
    for (size_t i = 0; i < n; i++) {
        if (shard_of) {
            if (shard_of[i] >= n_shards) {
                rc = k3_fail(err, K3_ERR_ARG, "%s: tensor \"%s\": shard %zu outside [0, %zu)", dir,
                             t[i].name, shard_of[i], n_shards);
                goto done;
            }
            shard[i] = shard_of[i];
            continue;
        }
        bool full = acc >= (double)total * (double)(s + 1) / (double)n_shards;
        bool must = n - i <= n_shards - 1 - s; /* the remaining tensors are needed one per shard */
        if (s + 1 < n_shards && in_s > 0 && (full || must))
            s++, in_s = 0;
        uint64_t nb = 0;
        k3_st_tensor_bytes(t[i].dtype, t[i].rank, t[i].shape, NULL, &nb);
        acc += (double)nb;
        shard[i] = s;
        in_s++;
    }
    for (size_t k = 0; !rc && k < n_shards; k++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (shard[i] == k)
                sel[m++] = t[i];
        sprintf(path, "%s/model-%05zu-of-%05zu.safetensors", dir, k + 1, n_shards);
        rc = k3_st_write_file(path, sel, m, meta, n_meta, err);
    }
    if (!rc)
        rc = write_index(dir, n_shards, t, n, shard, total, err);
done:
    free(shard);
    free(sel);
    free(path);
    return rc;
}
