/* The safetensors writer of safetensors.h: declare, lay out, stream the bytes, finish.
 *
 * The layout and the header text follow the reference writer (ST-RS `prepare`): tensors
 * sorted by dtype (the k3_dtype order, which is the reference's) descending, then by name
 * bytewise; the header is compact JSON with "__metadata__" first and each entry's fields in
 * the order dtype, shape, data_offsets, strings escaped as serde_json does, padded with spaces
 * to a multiple of 8. So a file written here from the same tensors and at most one metadata
 * entry is byte-identical to the Python package's (with several metadata entries the reference
 * order is a hash map's; k3 sorts them by key). Bytes go straight to the file with pwrite at
 * their final offsets, so memory use does not depend on the file size. Left out: in-place
 * update of an existing file. */
#include "io/json.h"
#include "io/name_table.h"
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct wtensor {
    char *name;
    k3_dtype dtype;
    int rank;
    uint64_t shape[K3_MAX_RANK];
    uint64_t nbytes, begin, written;
} wtensor;

enum { W_DECLARE = 0, W_WRITING, W_DONE, W_FAILED };

struct k3_st_writer {
    wtensor *t;
    size_t n, cap;
    k3_name_table by_name;
    char **meta; /* [2 * n_meta] key, value */
    size_t n_meta, cap_meta;
    int state;
    int fd;
    char *path, *tmp;
    uint64_t data_start, data_size;
};

/* A growable string for header text. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}
static void sb_str(sbuf *b, const char *s) {
    sb_put(b, s, strlen(s));
}

/* A JSON string literal, escaped exactly as serde_json escapes. */
static void sb_json_str(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char e[8];
        switch (*p) {
        case '"':
            sb_put(b, "\\\"", 2);
            break;
        case '\\':
            sb_put(b, "\\\\", 2);
            break;
        case '\b':
            sb_put(b, "\\b", 2);
            break;
        case '\f':
            sb_put(b, "\\f", 2);
            break;
        case '\n':
            sb_put(b, "\\n", 2);
            break;
        case '\r':
            sb_put(b, "\\r", 2);
            break;
        case '\t':
            sb_put(b, "\\t", 2);
            break;
        default:
            if (*p < 0x20) {
                snprintf(e, sizeof e, "\\u%04x", *p);
                sb_str(b, e);
            } else {
                sb_put(b, (const char *)p, 1);
            }
        }
    }
    sb_put(b, "\"", 1);
}

static void sb_u64(sbuf *b, uint64_t v) {
    char d[24];
    snprintf(d, sizeof d, "%" PRIu64, v);
    sb_str(b, d);
}

int k3_st_writer_new(k3_st_writer **out, k3_error *err) {
    *out = calloc(1, sizeof **out);
    if (!*out)
        return k3_fail(err, K3_ERR_NOMEM, "safetensors writer: out of memory");
    (*out)->fd = -1;
    return K3_OK;
}

void k3_st_writer_free(k3_st_writer *w) {
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    if (w->tmp && w->state != W_DONE)
        unlink(w->tmp);
    for (size_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    free(w->t);
    for (size_t i = 0; i < 2 * w->n_meta; i++)
        free(w->meta[i]);
    free(w->meta);
    k3_name_table_free(&w->by_name);
    free(w->path);
    free(w->tmp);
    free(w);
}

int k3_st_writer_metadata(k3_st_writer *w, const char *key, const char *value, k3_error *err) {
    if (w->state != W_DECLARE)
        return k3_fail(err, K3_ERR_ARG, "safetensors writer: metadata \"%s\" added after begin",
                       key);
    if (!k3_utf8_valid(key, strlen(key)) || !k3_utf8_valid(value, strlen(value)))
        return k3_fail(err, K3_ERR_ARG, "safetensors writer: metadata \"%s\" is not valid UTF-8",
                       key);
    for (size_t i = 0; i < w->n_meta; i++)
        if (!strcmp(w->meta[2 * i], key))
            return k3_fail(err, K3_ERR_DUPLICATE,
                           "safetensors writer: metadata key \"%s\" given twice", key);
    if (w->n_meta == w->cap_meta) {
        size_t cap = w->cap_meta ? 2 * w->cap_meta : 8;
        char **m = realloc(w->meta, 2 * cap * sizeof *m);
        if (!m)
            return k3_fail(err, K3_ERR_NOMEM, "safetensors writer: out of memory");
        w->meta = m;
        w->cap_meta = cap;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return k3_fail(err, K3_ERR_NOMEM, "safetensors writer: out of memory");
    }
    w->meta[2 * w->n_meta] = k;
    w->meta[2 * w->n_meta + 1] = v;
    w->n_meta++;
    return K3_OK;
}

int k3_st_writer_declare(k3_st_writer *w, const char *name, k3_dtype dtype, int rank,
                         const uint64_t *shape, k3_error *err) {
    size_t len = strlen(name);
    if (w->state != W_DECLARE)
        return k3_fail(err, K3_ERR_ARG, "safetensors writer: tensor \"%s\" declared after begin",
                       name);
    if (len == 0 || len > K3_ST_MAX_NAME || !k3_utf8_valid(name, len) ||
        !strcmp(name, "__metadata__"))
        return k3_fail(err, K3_ERR_ARG,
                       "safetensors writer: tensor name \"%.60s\" must be 1..%d bytes of UTF-8, "
                       "not __metadata__",
                       name, K3_ST_MAX_NAME);
    if (k3_dtype_bits(dtype) == 0)
        return k3_fail(err, K3_ERR_DTYPE, "safetensors writer: tensor \"%s\": invalid dtype %d",
                       name, (int)dtype);
    if (rank < 0 || rank > K3_MAX_RANK)
        return k3_fail(err, K3_ERR_LIMIT,
                       "safetensors writer: tensor \"%s\": rank %d outside [0, %d]", name, rank,
                       K3_MAX_RANK);
    uint64_t nbytes;
    if (!k3_st_tensor_bytes(dtype, rank, shape, NULL, &nbytes))
        return k3_fail(
            err, K3_ERR_SHAPE,
            "safetensors writer: tensor \"%s\": %s shape overflows or is not whole bytes", name,
            k3_dtype_name(dtype));
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t)
            return k3_fail(err, K3_ERR_NOMEM, "safetensors writer: out of memory");
        w->t = t;
        w->cap = cap;
    }
    wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name)
        return k3_fail(err, K3_ERR_NOMEM, "safetensors writer: out of memory");
    int rc = k3_name_table_put(&w->by_name, t->name, w->n, NULL);
    if (rc) {
        free(t->name);
        return k3_fail(err, rc,
                       rc == K3_ERR_DUPLICATE ? "safetensors writer: tensor \"%s\" declared twice"
                                              : "safetensors writer: out of memory at \"%s\"",
                       name);
    }
    t->dtype = dtype;
    t->rank = rank;
    if (rank)
        memcpy(t->shape, shape, (size_t)rank * sizeof *shape);
    t->nbytes = nbytes;
    w->n++;
    return K3_OK;
}

static int layout_cmp(const void *pa, const void *pb, void *ctx) {
    const wtensor *base = ctx;
    const wtensor *a = &base[*(const size_t *)pa], *b = &base[*(const size_t *)pb];
    if (a->dtype != b->dtype)
        return a->dtype > b->dtype ? -1 : 1;
    return strcmp(a->name, b->name);
}
static int meta_cmp(const void *pa, const void *pb) {
    return strcmp(((char *const *)pa)[0], ((char *const *)pb)[0]);
}

/* Builds the padded header text; fills begin of every tensor and data_size. */
static int build_header(k3_st_writer *w, sbuf *h, k3_error *err) {
    size_t *order = malloc((w->n ? w->n : 1) * sizeof *order);
    if (!order)
        return k3_fail(err, K3_ERR_NOMEM, "safetensors writer: out of memory");
    for (size_t i = 0; i < w->n; i++)
        order[i] = i;
    qsort_r(order, w->n, sizeof *order, layout_cmp, w->t); /* glibc: qsort with a context */
    if (w->n_meta)
        qsort(w->meta, w->n_meta, 2 * sizeof *w->meta, meta_cmp);
    sb_str(h, "{");
    if (w->n_meta) {
        sb_str(h, "\"__metadata__\":{");
        for (size_t i = 0; i < w->n_meta; i++) {
            if (i)
                sb_str(h, ",");
            sb_json_str(h, w->meta[2 * i]);
            sb_str(h, ":");
            sb_json_str(h, w->meta[2 * i + 1]);
        }
        sb_str(h, "}");
    }
    uint64_t off = 0;
    for (size_t k = 0; k < w->n; k++) {
        wtensor *t = &w->t[order[k]];
        t->begin = off;
        off += t->nbytes;
        if (k || w->n_meta)
            sb_str(h, ",");
        sb_json_str(h, t->name);
        sb_str(h, ":{\"dtype\":\"");
        sb_str(h, k3_dtype_name(t->dtype));
        sb_str(h, "\",\"shape\":[");
        for (int d = 0; d < t->rank; d++) {
            if (d)
                sb_str(h, ",");
            sb_u64(h, t->shape[d]);
        }
        sb_str(h, "],\"data_offsets\":[");
        sb_u64(h, t->begin);
        sb_str(h, ",");
        sb_u64(h, off);
        sb_str(h, "]}");
    }
    sb_str(h, "}");
    while (h->len % 8)
        sb_str(h, " ");
    free(order);
    w->data_size = off;
    if (h->oom)
        return k3_fail(err, K3_ERR_NOMEM, "safetensors writer: out of memory for the header");
    if (h->len > K3_ST_MAX_HEADER)
        return k3_fail(err, K3_ERR_LIMIT, "safetensors writer: header of %zu bytes exceeds %llu",
                       h->len, K3_ST_MAX_HEADER);
    return K3_OK;
}

static int pwrite_full(int fd, const void *src, size_t n, uint64_t off, const char *path,
                       k3_error *err) {
    const uint8_t *p = src;
    while (n) {
        ssize_t r = pwrite(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return k3_fail(err, K3_ERR_IO, "%s: write at offset %" PRIu64 ": %s", path, off,
                           r < 0 ? strerror(errno) : "no progress");
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return K3_OK;
}

int k3_st_writer_begin(k3_st_writer *w, const char *path, k3_error *err) {
    if (w->state != W_DECLARE)
        return k3_fail(err, K3_ERR_ARG, "%s: safetensors writer already begun", path);
    w->path = strdup(path);
    w->tmp = malloc(strlen(path) + 5);
    if (!w->path || !w->tmp)
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", path);
    sprintf(w->tmp, "%s.tmp", path);
    sbuf h = {0};
    int rc = build_header(w, &h, err);
    if (rc) {
        free(h.p);
        return rc;
    }
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        free(h.p);
        return k3_fail(err, K3_ERR_IO, "%s: %s", w->tmp, strerror(errno));
    }
    w->state = W_WRITING; /* from here on, free removes the temporary file */
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    w->data_start = 8 + h.len;
    rc = pwrite_full(w->fd, len, 8, 0, w->tmp, err);
    if (!rc)
        rc = pwrite_full(w->fd, h.p, h.len, 8, w->tmp, err);
    free(h.p);
    if (!rc && ftruncate(w->fd, (off_t)(w->data_start + w->data_size)) != 0)
        rc = k3_fail(err, K3_ERR_IO, "%s: ftruncate: %s", w->tmp, strerror(errno));
    if (rc)
        w->state = W_FAILED;
    return rc;
}

static int put(k3_st_writer *w, const char *name, const void *data, size_t nbytes, bool whole,
               k3_error *err) {
    if (w->state != W_WRITING)
        return k3_fail(err, K3_ERR_ARG,
                       "safetensors writer: tensor \"%s\" written outside begin..finish", name);
    size_t i;
    if (!k3_name_table_get(&w->by_name, name, &i))
        return k3_fail(err, K3_ERR_MISSING, "%s: tensor \"%s\" was not declared", w->path, name);
    wtensor *t = &w->t[i];
    if (whole && (t->written || nbytes != t->nbytes))
        return k3_fail(err, K3_ERR_ARG,
                       "%s: tensor \"%s\": put of %zu bytes, expected %" PRIu64 " once", w->path,
                       name, nbytes, t->nbytes);
    if (nbytes > t->nbytes - t->written)
        return k3_fail(err, K3_ERR_ARG,
                       "%s: tensor \"%s\": chunk of %zu bytes overruns (%" PRIu64 " of %" PRIu64
                       " written)",
                       w->path, name, nbytes, t->written, t->nbytes);
    int rc = pwrite_full(w->fd, data, nbytes, w->data_start + t->begin + t->written, w->tmp, err);
    if (rc) {
        w->state = W_FAILED;
        return rc;
    }
    t->written += nbytes;
    return K3_OK;
}

int k3_st_writer_put(k3_st_writer *w, const char *name, const void *data, size_t nbytes,
                     k3_error *err) {
    return put(w, name, data, nbytes, true, err);
}

int k3_st_writer_put_chunk(k3_st_writer *w, const char *name, const void *data, size_t nbytes,
                           k3_error *err) {
    return put(w, name, data, nbytes, false, err);
}

int k3_st_writer_finish(k3_st_writer *w, k3_error *err) {
    if (w->state != W_WRITING)
        return k3_fail(err, K3_ERR_ARG, "safetensors writer: finish without a successful begin");
    for (size_t i = 0; i < w->n; i++)
        if (w->t[i].written != w->t[i].nbytes)
            return k3_fail(err, K3_ERR_MISSING,
                           "%s: tensor \"%s\": %" PRIu64 " of %" PRIu64 " bytes written", w->path,
                           w->t[i].name, w->t[i].written, w->t[i].nbytes);
    int rc = K3_OK;
    if (fsync(w->fd) != 0)
        rc = k3_fail(err, K3_ERR_IO, "%s: fsync: %s", w->tmp, strerror(errno));
    if (close(w->fd) != 0 && !rc)
        rc = k3_fail(err, K3_ERR_IO, "%s: close: %s", w->tmp, strerror(errno));
    w->fd = -1;
    if (!rc && rename(w->tmp, w->path) != 0)
        rc = k3_fail(err, K3_ERR_IO, "%s: rename to %s: %s", w->tmp, w->path, strerror(errno));
    w->state = rc ? W_FAILED : W_DONE;
    return rc;
}
