/* k3_stdump: the bridge between k3's safetensors code and the Python interop test
 * (tests/py/test_st_interop.py), which uses the Python `safetensors` package as the oracle.
 *
 *   k3_stdump dump PATH              every tensor of a file or checkpoint as JSON on stdout:
 *                                    name, dtype, shape, shard, bytes in hex, and whether the
 *                                    view was zero-copy. Bytes are read twice (pread and view)
 *                                    and must agree (exit 2 otherwise).
 *   k3_stdump write OUT < SPEC       writes OUT with k3's streaming writer from a JSON spec
 *                                    {"metadata": {k: v}, "tensors": [{name, dtype, shape, hex}]},
 *                                    supplying tensors in reverse order and in two chunks each.
 *   k3_stdump write-sharded DIR N < SPEC   the same as a sharded checkpoint of N shards.
 * Errors go to stderr with exit status 1. */
#include "io/checkpoint.h"
#include "io/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *msg, const k3_error *e) {
    fprintf(stderr, "k3_stdump: %s%s%s\n", msg, e ? ": " : "", e ? e->msg : "");
    return 1;
}

static int dump(const char *path) {
    k3_error e = {0};
    k3_checkpoint *ck;
    if (k3_checkpoint_open(&ck, path, &e))
        return fail("open", &e);
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "tensors");
    int rc = 0;
    for (size_t i = 0; i < k3_checkpoint_tensor_count(ck) && !rc; i++) {
        k3_st_file *f;
        const k3_st_tensor *t;
        k3_tensor_info info;
        if (k3_checkpoint_tensor_raw(ck, i, &f, &t, &e) ||
            k3_checkpoint_tensor_info(ck, i, &info, &e)) {
            rc = fail("tensor", &e);
            break;
        }
        size_t nb = (size_t)k3_st_nbytes(t);
        unsigned char *buf = malloc(nb ? nb : 1);
        char *hex = malloc(2 * nb + 1);
        k3_st_view v;
        if (!buf || !hex)
            rc = fail("out of memory", NULL);
        else if (k3_st_read(f, t, buf, nb, K3_ST_READ_DONTNEED, &e))
            rc = fail("read", &e);
        else if (k3_st_view_get(f, t, 0, &v, &e))
            rc = fail("view", &e);
        else {
            if (nb && memcmp(v.data, buf, nb))
                rc = 2, fprintf(stderr, "k3_stdump: %s: view != pread\n", t->name);
            cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray();
            cJSON_AddStringToObject(o, "name", info.name);
            cJSON_AddStringToObject(o, "dtype", k3_dtype_name(info.dtype));
            for (int d = 0; d < info.rank; d++)
                cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)info.shape[d]));
            cJSON_AddItemToObject(o, "shape", sh);
            cJSON_AddStringToObject(o, "shard", info.shard_name);
            for (size_t k = 0; k < nb; k++)
                sprintf(hex + 2 * k, "%02x", buf[k]);
            hex[2 * nb] = '\0';
            cJSON_AddStringToObject(o, "hex", hex);
            cJSON_AddBoolToObject(o, "zero_copy", nb && !v.owned);
            cJSON_AddItemToArray(arr, o);
            k3_st_view_release(&v);
        }
        free(buf);
        free(hex);
    }
    if (!rc) {
        char *s = cJSON_PrintUnformatted(root);
        puts(s);
        cJSON_free(s);
    }
    cJSON_Delete(root);
    k3_checkpoint_close(ck);
    return rc;
}

static unsigned char *unhex(const char *h, size_t *n) {
    size_t l = strlen(h);
    unsigned char *b = malloc(l / 2 + 1);
    if (!b || l % 2) {
        free(b);
        return NULL;
    }
    for (size_t i = 0; i < l / 2; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1) {
            free(b);
            return NULL;
        }
        b[i] = (unsigned char)v;
    }
    *n = l / 2;
    return b;
}

/* Reads the spec into parallel arrays of tensors (data decoded) and metadata pairs. */
static int read_spec(cJSON **root, k3_st_wtensor **t, size_t *n, const char *(**meta)[2],
                     size_t *n_meta) {
    k3_error e = {0};
    static char text[64 << 20];
    size_t len = fread(text, 1, sizeof text, stdin);
    if (k3_json_parse(root, text, len, "spec", &e))
        return fail("spec", &e);
    const cJSON *ts = cJSON_GetObjectItem(*root, "tensors"),
                *md = cJSON_GetObjectItem(*root, "metadata");
    *n = (size_t)cJSON_GetArraySize(ts);
    *n_meta = md ? (size_t)cJSON_GetArraySize(md) : 0;
    *t = calloc(*n + 1, sizeof **t);
    *meta = calloc(*n_meta + 1, sizeof **meta);
    size_t i = 0;
    for (const cJSON *m = md ? md->child : NULL; m; m = m->next, i++) {
        (*meta)[i][0] = m->string;
        (*meta)[i][1] = m->valuestring;
    }
    i = 0;
    for (const cJSON *x = ts ? ts->child : NULL; x; x = x->next, i++) {
        k3_st_wtensor *w = &(*t)[i];
        w->name = cJSON_GetObjectItem(x, "name")->valuestring;
        w->dtype = k3_dtype_parse(cJSON_GetObjectItem(x, "dtype")->valuestring);
        const cJSON *sh = cJSON_GetObjectItem(x, "shape");
        for (const cJSON *d = sh->child; d; d = d->next)
            w->shape[w->rank++] = (uint64_t)d->valuedouble;
        size_t nb;
        w->data = unhex(cJSON_GetObjectItem(x, "hex")->valuestring, &nb);
        if (!w->data)
            return fail("bad hex", NULL);
    }
    return 0;
}

static int write_one(const char *out, k3_st_wtensor *t, size_t n, const char *(*meta)[2],
                     size_t n_meta) {
    k3_error e = {0};
    k3_st_writer *w;
    int rc = k3_st_writer_new(&w, &e);
    for (size_t i = 0; !rc && i < n_meta; i++)
        rc = k3_st_writer_metadata(w, meta[i][0], meta[i][1], &e);
    for (size_t i = 0; !rc && i < n; i++)
        rc = k3_st_writer_declare(w, t[i].name, t[i].dtype, t[i].rank, t[i].shape, &e);
    if (!rc)
        rc = k3_st_writer_begin(w, out, &e);
    for (size_t i = n; !rc && i-- > 0;) { /* reverse order, two chunks: the streaming path */
        uint64_t nb = 0;
        k3_st_tensor_bytes(t[i].dtype, t[i].rank, t[i].shape, NULL, &nb);
        size_t half = (size_t)nb / 2;
        rc = k3_st_writer_put_chunk(w, t[i].name, t[i].data, half, &e);
        if (!rc)
            rc = k3_st_writer_put_chunk(w, t[i].name, (const char *)t[i].data + half,
                                        (size_t)nb - half, &e);
    }
    if (!rc)
        rc = k3_st_writer_finish(w, &e);
    k3_st_writer_free(w);
    return rc ? fail("write", &e) : 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "dump"))
        return dump(argv[2]);
    bool one = argc == 3 && !strcmp(argv[1], "write");
    bool sharded = argc == 4 && !strcmp(argv[1], "write-sharded");
    if (!one && !sharded) {
        fprintf(stderr,
                "usage: k3_stdump dump PATH | write OUT < SPEC | write-sharded DIR N < SPEC\n");
        return 1;
    }
    cJSON *root = NULL;
    k3_st_wtensor *t = NULL;
    const char *(*meta)[2] = NULL;
    size_t n = 0, n_meta = 0;
    int rc = read_spec(&root, &t, &n, &meta, &n_meta);
    if (!rc && one)
        rc = write_one(argv[2], t, n, meta, n_meta);
    if (!rc && sharded) {
        k3_error e = {0};
        if (k3_st_write_sharded(argv[2], (size_t)atoi(argv[3]), t, n, NULL,
                                (const char *const(*)[2])meta, n_meta, &e))
            rc = fail("write-sharded", &e);
    }
    for (size_t i = 0; t && i < n; i++)
        free((void *)t[i].data);
    free(t);
    free(meta);
    cJSON_Delete(root);
    return rc;
}
