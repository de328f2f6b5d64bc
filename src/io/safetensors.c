/* The safetensors reader of safetensors.h: open (pread of the length and header, then
 * st_header.c validates), accessors, zero-copy views and streaming reads.
 *
 * Nothing is mapped at open: a checkpoint of 96 shards and 1.5 TB is opened by reading
 * ~100 MB of headers. The first view maps the whole file read-only (address space is cheap;
 * pages come in on touch); streaming reads never map. */
#include "io/st_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

bool k3_st_tensor_bytes(k3_dtype dtype, int rank, const uint64_t *shape, uint64_t *numel,
                        uint64_t *nbytes) {
    if (k3_dtype_bits(dtype) == 0 || rank < 0 || rank > K3_MAX_RANK)
        return false;
    uint64_t n = 1, bits;
    for (int i = 0; i < rank; i++)
        if (!k3_mul_u64(n, shape[i], &n))
            return false;
    if (!k3_mul_u64(n, k3_dtype_bits(dtype), &bits) || bits % 8)
        return false;
    if (numel)
        *numel = n;
    if (nbytes)
        *nbytes = bits / 8;
    return true;
}

static k3_st_file *file_new(const char *path) {
    k3_st_file *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) {
        free(f);
        return NULL;
    }
    pthread_mutex_init(&f->map_lock, NULL);
    return f;
}

void k3_st_close(k3_st_file *f) {
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->size);
    if (f->fd >= 0)
        close(f->fd);
    for (size_t i = 0; i < f->n_meta; i++)
        free(f->meta[2 * i]); /* key and value share it */
    free(f->meta);
    k3_name_table_free(&f->by_name);
    free(f->t);
    free(f->names);
    pthread_mutex_destroy(&f->map_lock);
    free(f->path);
    free(f);
}

/* Reads exactly n bytes at off; a short file is an error, not a partial read. */
static int pread_full(int fd, void *dst, size_t n, uint64_t off, const char *path, k3_error *err) {
    uint8_t *p = dst;
    while (n) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return k3_fail(err, K3_ERR_IO, "%s: read of %zu bytes at offset %" PRIu64 ": %s", path,
                           chunk, off, strerror(errno));
        }
        if (r == 0)
            return k3_fail(err, K3_ERR_IO,
                           "%s: unexpected end of file at offset %" PRIu64
                           " (did the file shrink?)",
                           path, off);
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return K3_OK;
}

/* §1.4 steps 1-3: the length prefix against the file size. */
static int check_prefix(const k3_st_file *f, uint64_t n, k3_error *err) {
    if (n > K3_ST_MAX_HEADER)
        return k3_fail(err, K3_ERR_LIMIT,
                       "%s: header length %" PRIu64 " exceeds the limit of %llu bytes", f->path, n,
                       K3_ST_MAX_HEADER);
    if (8 + n > f->size) /* no overflow: n <= 1e8 */
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: header length %" PRIu64 " runs past the end of the %" PRIu64
                       "-byte file",
                       f->path, n, f->size);
    return K3_OK;
}

static uint64_t le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | b[i];
    return v;
}

int k3_st_open(k3_st_file **out, const char *path, k3_error *err) {
    *out = NULL;
    k3_st_file *f = file_new(path);
    if (!f)
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", path);
    int rc = K3_OK;
    char *hdr = NULL;
    struct stat st;
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        rc = k3_fail(err, K3_ERR_IO, "%s: %s", path, strerror(errno));
        goto done;
    }
    if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = k3_fail(err, K3_ERR_IO, "%s: not a regular file", path);
        goto done;
    }
    f->size = (uint64_t)st.st_size;
    if (f->size < 8) {
        rc = k3_fail(err, K3_ERR_FORMAT,
                     "%s: file is %" PRIu64 " bytes, shorter than the 8-byte header length", path,
                     f->size);
        goto done;
    }
    uint8_t b[8];
    if ((rc = pread_full(f->fd, b, 8, 0, path, err)))
        goto done;
    uint64_t n = le64(b);
    if ((rc = check_prefix(f, n, err)))
        goto done;
    f->data_start = 8 + n;
    hdr = malloc(n ? n : 1);
    if (!hdr) {
        rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory for a %" PRIu64 "-byte header", path, n);
        goto done;
    }
    if ((rc = pread_full(f->fd, hdr, n, 8, path, err)))
        goto done;
    rc = k3_st_parse_header(f, hdr, n, err);
done:
    free(hdr);
    if (rc)
        k3_st_close(f);
    else
        *out = f;
    return rc;
}

int k3_st_parse(k3_st_file **out, const void *bytes, size_t len, const char *name, k3_error *err) {
    *out = NULL;
    k3_st_file *f = file_new(name ? name : "(memory)");
    if (!f)
        return k3_fail(err, K3_ERR_NOMEM, "out of memory");
    int rc;
    f->mem = bytes;
    f->size = len;
    if (len < 8) {
        rc = k3_fail(err, K3_ERR_FORMAT,
                     "%s: file is %zu bytes, shorter than the 8-byte header length", f->path, len);
    } else {
        uint64_t n = le64(f->mem);
        rc = check_prefix(f, n, err);
        if (!rc) {
            f->data_start = 8 + n;
            rc = k3_st_parse_header(f, (const char *)f->mem + 8, (size_t)n, err);
        }
    }
    if (rc)
        k3_st_close(f);
    else
        *out = f;
    return rc;
}

const char *k3_st_path(const k3_st_file *f) {
    return f->path;
}
uint64_t k3_st_file_size(const k3_st_file *f) {
    return f->size;
}
uint64_t k3_st_data_start(const k3_st_file *f) {
    return f->data_start;
}
size_t k3_st_count(const k3_st_file *f) {
    return f->n;
}

const k3_st_tensor *k3_st_at(const k3_st_file *f, size_t i) {
    return i < f->n ? &f->t[i] : NULL;
}

const k3_st_tensor *k3_st_find(const k3_st_file *f, const char *name) {
    size_t i;
    return k3_name_table_get(&f->by_name, name, &i) ? &f->t[i] : NULL;
}

size_t k3_st_metadata_count(const k3_st_file *f) {
    return f->n_meta;
}

bool k3_st_metadata_at(const k3_st_file *f, size_t i, const char **key, const char **value) {
    if (i >= f->n_meta)
        return false;
    if (key)
        *key = f->meta[2 * i];
    if (value)
        *value = f->meta[2 * i + 1];
    return true;
}

const char *k3_st_metadata_get(const k3_st_file *f, const char *key) {
    size_t lo = 0, hi = f->n_meta; /* sorted by key */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->meta[2 * mid], key);
        if (!c)
            return f->meta[2 * mid + 1];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int check_tensor(const k3_st_file *f, const k3_st_tensor *t, k3_error *err) {
    if (!t || t < f->t || t >= f->t + f->n)
        return k3_fail(err, K3_ERR_ARG, "%s: tensor handle does not belong to this file", f->path);
    return K3_OK;
}

/* Base address of the whole file: the borrowed buffer, or the lazy mapping. */
static int file_base(k3_st_file *f, const uint8_t **base, k3_error *err) {
    if (f->mem) {
        *base = f->mem;
        return K3_OK;
    }
    int rc = K3_OK;
    pthread_mutex_lock(&f->map_lock);
    if (!f->map) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_SHARED, f->fd, 0);
        if (m == MAP_FAILED)
            rc = k3_fail(err, K3_ERR_IO, "%s: mmap: %s", f->path, strerror(errno));
        else
            f->map = m;
    }
    *base = f->map;
    pthread_mutex_unlock(&f->map_lock);
    return rc;
}

int k3_st_view_get(k3_st_file *f, const k3_st_tensor *t, size_t align, k3_st_view *out,
                   k3_error *err) {
    memset(out, 0, sizeof *out);
    int rc = check_tensor(f, t, err);
    if (rc)
        return rc;
    if (align == 0)
        align = k3_dtype_bits(t->dtype) >= 8 ? k3_dtype_bits(t->dtype) / 8 : 1;
    if (align & (align - 1) || align > (1u << 20))
        return k3_fail(err, K3_ERR_ARG,
                       "%s: tensor \"%s\": view alignment %zu is not a power of two <= 1 MiB",
                       f->path, t->name, align);
    uint64_t nbytes = k3_st_nbytes(t);
    out->nbytes = nbytes;
    if (nbytes == 0)
        return K3_OK;
    if (nbytes > SIZE_MAX - align)
        return k3_fail(err, K3_ERR_LIMIT, "%s: tensor \"%s\": too large for this address space",
                       f->path, t->name);
    const uint8_t *base;
    rc = file_base(f, &base, err);
    if (rc)
        return rc;
    const uint8_t *p = base + f->data_start + t->begin;
    if ((uintptr_t)p % align == 0) {
        out->data = p;
        return K3_OK;
    }
    /* unaligned: a private aligned copy (aligned_alloc wants a multiple of align) */
    size_t cap = (size_t)((nbytes + align - 1) / align * align);
    void *copy = aligned_alloc(align < sizeof(void *) ? sizeof(void *) : align,
                               cap < sizeof(void *) ? sizeof(void *) : cap);
    if (!copy)
        return k3_fail(err, K3_ERR_NOMEM,
                       "%s: tensor \"%s\": out of memory for a %" PRIu64 "-byte copy", f->path,
                       t->name, nbytes);
    memcpy(copy, p, (size_t)nbytes);
    out->data = copy;
    out->owned = copy;
    return K3_OK;
}

void k3_st_view_release(k3_st_view *v) {
    if (!v)
        return;
    free(v->owned);
    memset(v, 0, sizeof *v);
}

int k3_st_read_range(k3_st_file *f, const k3_st_tensor *t, uint64_t off, void *dst, size_t dst_size,
                     unsigned flags, k3_error *err) {
    int rc = check_tensor(f, t, err);
    if (rc)
        return rc;
    uint64_t nbytes = k3_st_nbytes(t), end;
    if (!k3_add_u64(off, dst_size, &end) || end > nbytes)
        return k3_fail(err, K3_ERR_ARG,
                       "%s: tensor \"%s\": byte range [%" PRIu64 ", +%zu) lies outside its %" PRIu64
                       " bytes",
                       f->path, t->name, off, dst_size, nbytes);
    if (dst_size == 0)
        return K3_OK;
    uint64_t abs = f->data_start + t->begin + off;
    if (f->mem) {
        memcpy(dst, f->mem + abs, dst_size);
        return K3_OK;
    }
    rc = pread_full(f->fd, dst, dst_size, abs, f->path, err);
    if (!rc && (flags & K3_ST_READ_DONTNEED))
        (void)posix_fadvise(f->fd, (off_t)abs, (off_t)dst_size,
                            POSIX_FADV_DONTNEED); /* advice only */
    return rc;
}

int k3_st_read(k3_st_file *f, const k3_st_tensor *t, void *dst, size_t dst_size, unsigned flags,
               k3_error *err) {
    int rc = check_tensor(f, t, err);
    if (rc)
        return rc;
    if (dst_size != k3_st_nbytes(t))
        return k3_fail(err, K3_ERR_ARG,
                       "%s: tensor \"%s\": destination holds %zu bytes, the tensor %" PRIu64,
                       f->path, t->name, dst_size, k3_st_nbytes(t));
    return k3_st_read_range(f, t, 0, dst, dst_size, flags, err);
}
