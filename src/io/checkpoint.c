/* k3_checkpoint: a .safetensors file or a directory of shards, validated as one unit
 * (checkpoint-formats.md §1.5, §8.2 item 5).
 *
 * With model.safetensors.index.json the index is authoritative: only the shards it names are
 * opened, a tensor found in two shards is a duplicate, a tensor found in a shard but not in
 * the weight_map (or in another shard than the one mapped) is an error, and a mapped tensor
 * that no shard holds is missing. Without an index every *.safetensors in the directory is a
 * shard. Tensors are numbered in name order across shards, and one hash table serves lookups,
 * so 500,000 tensors in 96 shards cost one sort and O(1) per lookup. Left out: following a
 * weight_map into subdirectories (refused), and the TRT-LLM "consolidated*" convention. */
#include "io/checkpoint.h"
#include "io/name_table.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct ck_entry {
    uint32_t shard;
    uint32_t idx; /* within the shard */
} ck_entry;

struct k3_checkpoint {
    char *dir;
    bool has_index;
    size_t n_shards;
    k3_st_file **shards;
    char **shard_names;
    size_t n;
    ck_entry *ent;         /* [n], name order */
    k3_name_table by_name; /* name -> position in ent */
};

void k3_checkpoint_close(k3_checkpoint *ck) {
    if (!ck)
        return;
    for (size_t i = 0; i < ck->n_shards; i++) {
        k3_st_close(ck->shards[i]);
        free(ck->shard_names[i]);
    }
    free(ck->shards);
    free(ck->shard_names);
    free(ck->ent);
    k3_name_table_free(&ck->by_name);
    free(ck->dir);
    free(ck);
}

static const k3_st_tensor *ent_tensor(const k3_checkpoint *ck, const ck_entry *e) {
    return k3_st_at(ck->shards[e->shard], e->idx);
}

static int str_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int ent_cmp(const void *a, const void *b, void *ctx) {
    const k3_checkpoint *ck = ctx;
    return strcmp(ent_tensor(ck, a)->name, ent_tensor(ck, b)->name);
}

/* Opens ck->shard_names[*] (already sorted) from ck->dir. */
static int open_shards(k3_checkpoint *ck, k3_error *err) {
    ck->shards = calloc(ck->n_shards, sizeof *ck->shards);
    if (!ck->shards)
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", ck->dir);
    size_t total = 0;
    for (size_t i = 0; i < ck->n_shards; i++) {
        size_t len = strlen(ck->dir) + strlen(ck->shard_names[i]) + 2;
        char *p = malloc(len);
        if (!p)
            return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", ck->dir);
        snprintf(p, len, "%s/%s", ck->dir, ck->shard_names[i]);
        int rc = k3_st_open(&ck->shards[i], p, err);
        free(p);
        if (rc)
            return rc;
        total += k3_st_count(ck->shards[i]);
        if (k3_st_count(ck->shards[i]) > UINT32_MAX || ck->n_shards > UINT32_MAX)
            return k3_fail(err, K3_ERR_LIMIT, "%s: too many tensors", ck->dir);
    }
    /* every tensor of every shard, duplicates across shards rejected by name */
    ck->ent = malloc((total ? total : 1) * sizeof *ck->ent);
    if (!ck->ent)
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory for %zu tensors", ck->dir, total);
    for (size_t s = 0; s < ck->n_shards; s++)
        for (size_t i = 0; i < k3_st_count(ck->shards[s]); i++) {
            const char *name = k3_st_at(ck->shards[s], i)->name;
            size_t prev;
            int rc = k3_name_table_put(&ck->by_name, name, ck->n, &prev);
            if (rc == K3_ERR_DUPLICATE)
                return k3_fail(err, K3_ERR_DUPLICATE,
                               "%s: tensor \"%s\" is in two shards, %s and %s", ck->dir, name,
                               ck->shard_names[ck->ent[prev].shard], ck->shard_names[s]);
            if (rc)
                return k3_fail(err, rc, "%s: out of memory for the name table", ck->dir);
            ck->ent[ck->n++] = (ck_entry){(uint32_t)s, (uint32_t)i};
        }
    return K3_OK;
}

/* The index against the shards: same set of names, each in the shard it names. */
static int check_index(k3_checkpoint *ck, const k3_st_index *ix, const char *ipath, k3_error *err) {
    k3_name_table map = {0};
    int rc = K3_OK;
    for (size_t i = 0; i < ix->n_entries && !rc; i++)
        if (k3_name_table_put(&map, ix->names[i], i, NULL))
            rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", ipath);
    uint64_t bytes = 0;
    for (size_t k = 0; k < ck->n && !rc; k++) {
        const k3_st_tensor *t = ent_tensor(ck, &ck->ent[k]);
        const char *shard = ck->shard_names[ck->ent[k].shard];
        size_t i;
        bytes += k3_st_nbytes(t);
        if (!k3_name_table_get(&map, t->name, &i))
            rc = k3_fail(err, K3_ERR_FORMAT,
                         "%s: tensor \"%s\" of shard %s is not in the weight_map", ipath, t->name,
                         shard);
        else if (strcmp(ix->shards[ix->shard_of[i]], shard))
            rc = k3_fail(err, K3_ERR_FORMAT,
                         "%s: tensor \"%s\" is mapped to shard %s but found in shard %s", ipath,
                         t->name, ix->shards[ix->shard_of[i]], shard);
    }
    for (size_t i = 0; i < ix->n_entries && !rc; i++)
        if (!k3_name_table_get(&ck->by_name, ix->names[i], NULL))
            rc = k3_fail(err, K3_ERR_MISSING,
                         "%s: tensor \"%s\" is mapped to shard %s, which does not hold it", ipath,
                         ix->names[i], ix->shards[ix->shard_of[i]]);
    if (!rc && ix->has_total_size && ix->total_size != bytes)
        k3_warn("%s: metadata.total_size is %" PRIu64 " but the tensors hold %" PRIu64 " bytes",
                ipath, ix->total_size, bytes);
    k3_name_table_free(&map);
    return rc;
}

static int list_dir(k3_checkpoint *ck, k3_error *err) {
    DIR *d = opendir(ck->dir);
    if (!d)
        return k3_fail(err, K3_ERR_IO, "%s: %s", ck->dir, strerror(errno));
    size_t cap = 0;
    int rc = K3_OK;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l <= 12 || strcmp(e->d_name + l - 12, ".safetensors") || e->d_name[0] == '.')
            continue;
        if (ck->n_shards == cap) {
            cap = cap ? 2 * cap : 16;
            char **p = realloc(ck->shard_names, cap * sizeof *p);
            if (!p) {
                rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", ck->dir);
                break;
            }
            ck->shard_names = p;
        }
        if (!(ck->shard_names[ck->n_shards] = strdup(e->d_name)))
            rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", ck->dir);
        else
            ck->n_shards++;
    }
    closedir(d);
    if (!rc && ck->n_shards == 0)
        rc = k3_fail(err, K3_ERR_MISSING, "%s: no *.safetensors file and no %s", ck->dir,
                     K3_INDEX_NAME);
    if (!rc)
        qsort(ck->shard_names, ck->n_shards, sizeof *ck->shard_names, str_cmp);
    return rc;
}

static int open_dir(k3_checkpoint *ck, k3_error *err) {
    size_t len = strlen(ck->dir) + sizeof "/" K3_INDEX_NAME;
    char *ipath = malloc(len);
    if (!ipath)
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", ck->dir);
    snprintf(ipath, len, "%s/%s", ck->dir, K3_INDEX_NAME);
    struct stat st;
    int rc = K3_OK;
    if (stat(ipath, &st) == 0) {
        k3_st_index *ix = NULL;
        ck->has_index = true;
        rc = k3_st_index_load(&ix, ipath, err);
        if (!rc) {
            ck->shard_names = calloc(ix->n_shards ? ix->n_shards : 1, sizeof *ck->shard_names);
            if (!ck->shard_names)
                rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", ipath);
            for (size_t i = 0; !rc && i < ix->n_shards; i++, ck->n_shards++)
                if (!(ck->shard_names[i] = strdup(ix->shards[i])))
                    rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", ipath);
            if (!rc)
                qsort(ck->shard_names, ck->n_shards, sizeof *ck->shard_names, str_cmp);
            if (!rc)
                rc = open_shards(ck, err);
            if (!rc)
                rc = check_index(ck, ix, ipath, err);
        }
        k3_st_index_free(ix);
    } else if (errno != ENOENT) {
        rc = k3_fail(err, K3_ERR_IO, "%s: %s", ipath, strerror(errno));
    } else {
        rc = list_dir(ck, err);
        if (!rc)
            rc = open_shards(ck, err);
    }
    free(ipath);
    return rc;
}

int k3_checkpoint_open(k3_checkpoint **out, const char *path, k3_error *err) {
    if (!out || !path)
        return k3_fail(err, K3_ERR_ARG, "k3_checkpoint_open: %s: NULL", !out ? "out" : "path");
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return k3_fail(err, K3_ERR_IO, "%s: %s", path, strerror(errno));
    k3_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck)
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", path);
    int rc;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (S_ISDIR(st.st_mode) || !strcmp(base, K3_INDEX_NAME)) {
        /* a directory, or its index file named directly */
        ck->dir = S_ISDIR(st.st_mode) ? strdup(path)
                  : slash             ? strndup(path, (size_t)(slash - path) + (slash == path))
                                      : strdup(".");
        rc = ck->dir ? open_dir(ck, err) : k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", path);
    } else {
        ck->dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
        ck->shard_names = calloc(1, sizeof *ck->shard_names);
        if (!ck->dir || !ck->shard_names || !(ck->shard_names[0] = strdup(base))) {
            rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", path);
        } else {
            ck->n_shards = 1;
            rc = open_shards(ck, err);
        }
    }
    if (!rc) {
        qsort_r(ck->ent, ck->n, sizeof *ck->ent, ent_cmp, ck);
        k3_name_table_free(&ck->by_name);
        for (size_t i = 0; i < ck->n && !rc; i++)
            if (k3_name_table_put(&ck->by_name, ent_tensor(ck, &ck->ent[i])->name, i, NULL))
                rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", path);
    }
    if (rc)
        k3_checkpoint_close(ck);
    else
        *out = ck;
    return rc;
}

/* A NULL handle reads as an empty checkpoint: the accessors without an error struct have no
 * other way to say "bad argument", and a crash would be the caller's only diagnostic. */
size_t k3_checkpoint_tensor_count(const k3_checkpoint *ck) {
    return ck ? ck->n : 0;
}
size_t k3_checkpoint_shard_count(const k3_checkpoint *ck) {
    return ck ? ck->n_shards : 0;
}
const char *k3_checkpoint_path(const k3_checkpoint *ck) {
    return ck ? ck->dir : NULL;
}
int k3_checkpoint_has_index(const k3_checkpoint *ck) {
    return ck ? ck->has_index : 0;
}

const char *k3_checkpoint_shard_name(const k3_checkpoint *ck, size_t shard) {
    return ck && shard < ck->n_shards ? ck->shard_names[shard] : NULL;
}

int k3_checkpoint_tensor_info(const k3_checkpoint *ck, size_t i, k3_tensor_info *out,
                              k3_error *err) {
    if (!ck || !out)
        return k3_fail(err, K3_ERR_ARG, "k3_checkpoint_tensor_info: %s: NULL", ck ? "out" : "ck");
    if (i >= ck->n)
        return k3_fail(err, K3_ERR_ARG, "%s: tensor index %zu out of range (%zu tensors)", ck->dir,
                       i, ck->n);
    const k3_st_tensor *t = ent_tensor(ck, &ck->ent[i]);
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->dtype;
    out->rank = t->rank;
    memcpy(out->shape, t->shape, sizeof out->shape);
    out->numel = t->numel;
    out->nbytes = k3_st_nbytes(t);
    out->shard = ck->ent[i].shard;
    out->shard_name = ck->shard_names[out->shard];
    return K3_OK;
}

int64_t k3_checkpoint_find(const k3_checkpoint *ck, const char *name) {
    size_t i;
    return ck && name && k3_name_table_get(&ck->by_name, name, &i) ? (int64_t)i : -1;
}

int k3_checkpoint_tensor_raw(const k3_checkpoint *ck, size_t i, k3_st_file **file,
                             const k3_st_tensor **t, k3_error *err) {
    if (i >= ck->n)
        return k3_fail(err, K3_ERR_ARG, "%s: tensor index %zu out of range (%zu tensors)", ck->dir,
                       i, ck->n);
    *file = ck->shards[ck->ent[i].shard];
    *t = ent_tensor(ck, &ck->ent[i]);
    return K3_OK;
}

int k3_checkpoint_lookup(const k3_checkpoint *ck, const char *name, k3_st_file **file,
                         const k3_st_tensor **t, k3_error *err) {
    int64_t i = k3_checkpoint_find(ck, name);
    if (i < 0)
        return k3_fail(err, K3_ERR_MISSING, "%s: no tensor \"%s\"", ck->dir, name);
    return k3_checkpoint_tensor_raw(ck, (size_t)i, file, t, err);
}

size_t k3_checkpoint_metadata_count(const k3_checkpoint *ck, size_t shard) {
    return ck && shard < ck->n_shards ? k3_st_metadata_count(ck->shards[shard]) : 0;
}

int k3_checkpoint_metadata_at(const k3_checkpoint *ck, size_t shard, size_t i, const char **key,
                              const char **value, k3_error *err) {
    if (!ck || !key || !value)
        return k3_fail(err, K3_ERR_ARG, "k3_checkpoint_metadata_at: %s: NULL",
                       !ck ? "ck" : !key ? "key" : "value");
    if (shard >= ck->n_shards || !k3_st_metadata_at(ck->shards[shard], i, key, value))
        return k3_fail(err, K3_ERR_ARG, "%s: metadata entry %zu of shard %zu out of range", ck->dir,
                       i, shard);
    return K3_OK;
}

const char *k3_checkpoint_metadata_get(const k3_checkpoint *ck, size_t shard, const char *key) {
    return ck && key && shard < ck->n_shards ? k3_st_metadata_get(ck->shards[shard], key) : NULL;
}
