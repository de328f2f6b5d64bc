/* The model.safetensors.index.json parser (checkpoint-formats.md §1.5; ST-IDX).
 *
 * Shape: {"metadata": {"total_size": <int>, ...}, "weight_map": {"<tensor>": "<shard>", ...}}.
 * weight_map is required; metadata is optional and, apart from total_size (a non-negative
 * integer when present), its keys may hold any JSON value (newer writers add non-strings),
 * so they are ignored. Other top-level keys are ignored too. A shard name must be a plain
 * file name: the index must not reach outside its directory. Duplicate tensor names are
 * rejected by the strict JSON layer. */
#include "io/checkpoint.h"
#include "io/json.h"
#include "io/name_table.h"

#include <stdlib.h>
#include <string.h>

void k3_st_index_free(k3_st_index *ix) {
    if (!ix)
        return;
    for (size_t i = 0; i < ix->n_shards; i++)
        free(ix->shards[i]);
    free(ix->shards);
    free(ix->names ? ix->names[0] : NULL); /* one arena holds every tensor name */
    free(ix->names);
    free(ix->shard_of);
    free(ix);
}

static int check_shard_name(const char *what, const char *tensor, const char *s, k3_error *err) {
    const char *why = NULL;
    if (!*s)
        why = "is empty";
    else if (s[0] == '/')
        why = "is an absolute path";
    else if (strchr(s, '/') || strchr(s, '\\'))
        why = "contains a path separator";
    else if (!strcmp(s, ".") || !strcmp(s, ".."))
        why = "is not a file name";
    else if (strlen(s) > 255)
        why = "is longer than 255 bytes";
    if (why)
        return k3_fail(
            err, K3_ERR_FORMAT,
            "%s: weight_map[\"%s\"]: shard name \"%.300s\" %s (must be a plain file name in "
            "the checkpoint directory)",
            what, tensor, s, why);
    return K3_OK;
}

static int parse_root(k3_st_index *ix, const cJSON *root, const char *what, k3_error *err) {
    if (!cJSON_IsObject(root))
        return k3_fail(err, K3_ERR_FORMAT, "%s: not a JSON object", what);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    if (meta && !cJSON_IsNull(meta)) {
        if (!cJSON_IsObject(meta))
            return k3_fail(err, K3_ERR_FORMAT, "%s: metadata must be an object", what);
        const cJSON *ts = cJSON_GetObjectItemCaseSensitive(meta, "total_size");
        if (ts && !cJSON_IsNull(ts)) {
            if (!k3_json_u64(ts, &ix->total_size))
                return k3_fail(err, K3_ERR_FORMAT,
                               "%s: metadata.total_size must be a non-negative integer <= 2^53",
                               what);
            ix->has_total_size = true;
        }
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!wm)
        return k3_fail(err, K3_ERR_MISSING, "%s: no \"weight_map\"", what);
    if (!cJSON_IsObject(wm))
        return k3_fail(err, K3_ERR_FORMAT, "%s: weight_map must be an object", what);
    size_t n = 0, bytes = 0;
    for (const cJSON *e = wm->child; e; e = e->next) {
        size_t l = strlen(e->string);
        if (l == 0)
            return k3_fail(err, K3_ERR_FORMAT, "%s: weight_map has an empty tensor name", what);
        if (l > K3_ST_MAX_NAME)
            return k3_fail(err, K3_ERR_LIMIT,
                           "%s: weight_map: tensor name \"%.60s...\" of %zu bytes exceeds %d", what,
                           e->string, l, K3_ST_MAX_NAME);
        if (!k3_utf8_valid(e->string, l))
            return k3_fail(err, K3_ERR_FORMAT, "%s: weight_map: a tensor name is not valid UTF-8",
                           what);
        if (!cJSON_IsString(e))
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: weight_map[\"%s\"] must be a string (a shard file name)", what,
                           e->string);
        int rc = check_shard_name(what, e->string, e->valuestring, err);
        if (rc)
            return rc;
        n++;
        bytes += l + 1;
    }
    ix->names = calloc(n ? n : 1, sizeof *ix->names);
    ix->shard_of = malloc((n ? n : 1) * sizeof *ix->shard_of);
    char *arena = malloc(bytes ? bytes : 1);
    if (!ix->names || !ix->shard_of || !arena) {
        free(arena);
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory for %zu index entries", what, n);
    }
    ix->names[0] = arena; /* so that free finds the arena even when n == 0 */
    k3_name_table shards = {0};
    size_t cap = 0;
    int rc = K3_OK;
    for (const cJSON *e = wm->child; e && !rc; e = e->next) {
        size_t l = strlen(e->string) + 1, s;
        memcpy(arena, e->string, l);
        ix->names[ix->n_entries] = arena;
        arena += l;
        if (!k3_name_table_get(&shards, e->valuestring, &s)) {
            if (ix->n_shards == cap) {
                cap = cap ? 2 * cap : 16;
                char **p = realloc(ix->shards, cap * sizeof *p);
                if (!p) {
                    rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", what);
                    break;
                }
                ix->shards = p;
            }
            s = ix->n_shards;
            ix->shards[s] = strdup(e->valuestring);
            if (!ix->shards[s] || k3_name_table_put(&shards, ix->shards[s], s, NULL)) {
                free(ix->shards[s]);
                rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", what);
                break;
            }
            ix->n_shards++;
        }
        ix->shard_of[ix->n_entries++] = (uint32_t)s;
    }
    k3_name_table_free(&shards);
    return rc;
}

/* The index in root (which this consumes); what names the source in messages. */
static int index_from_json(k3_st_index **out, cJSON *root, const char *what, k3_error *err) {
    int rc;
    k3_st_index *ix = calloc(1, sizeof *ix);
    if (!ix)
        rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", what);
    else
        rc = parse_root(ix, root, what, err);
    cJSON_Delete(root);
    if (rc)
        k3_st_index_free(ix);
    else
        *out = ix;
    return rc;
}

int k3_st_index_parse(k3_st_index **out, const char *text, size_t len, const char *what,
                      k3_error *err) {
    *out = NULL;
    cJSON *root;
    int rc = k3_json_parse(&root, text, len, what, err);
    return rc ? rc : index_from_json(out, root, what, err);
}

int k3_st_index_load(k3_st_index **out, const char *path, k3_error *err) {
    *out = NULL;
    cJSON *root;
    int rc = k3_json_parse_file(&root, path, K3_INDEX_MAX_BYTES, err);
    return rc ? rc : index_from_json(out, root, path, err);
}
