/* safetensors: a validating reader and a streaming writer (checkpoint-formats.md §1, §8.2).
 *
 * The reader trusts nothing in the file. Open reads the 8-byte length and the header with
 * pread, parses it with the strict JSON layer (UTF-8, duplicate keys, depth), then checks
 * every field: known dtype (all of §1.3), rank <= K3_MAX_RANK, non-negative integer shapes
 * and offsets (no fractions, exponents, signs, or values above 2^53), checked products,
 * whole bytes for sub-byte dtypes, END - BEGIN equal to the size the dtype and shape need,
 * and exact coverage of the data buffer (no gap, overlap or trailing byte). Every failure
 * names the file, the tensor and the field. Tensor bytes are not touched at open: they are
 * reached through a zero-copy view (mmap, mapped lazily on first use, only when the absolute
 * file offset is aligned) or through pread into a caller buffer (streaming, with optional
 * posix_fadvise(DONTNEED) so a loader can walk 1.5 TB of shards with bounded page cache).
 *
 * Left out: writing in place, editing, big-endian hosts (safetensors is little-endian and so
 * is every machine k3 targets). Status codes: K3_ERR_IO (open/read), K3_ERR_LIMIT (header
 * over 100,000,000 bytes, rank > 8, name over K3_ST_MAX_NAME, a product that overflows),
 * K3_ERR_DTYPE (unknown dtype string), K3_ERR_DUPLICATE (a name twice), K3_ERR_FORMAT
 * (everything else malformed). */
#ifndef K3_SAFETENSORS_H
#define K3_SAFETENSORS_H

#include "base/base.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define K3_ST_MAX_HEADER 100000000ull /* the reference's MAX_HEADER_SIZE */
#define K3_ST_MAX_NAME   1024         /* bytes of one tensor name (K3 names are ~90) */

/* One tensor of a validated file. Offsets are relative to the data buffer (byte 8+N). */
typedef struct k3_st_tensor {
    const char *name; /* NUL-terminated, valid UTF-8, owned by the file */
    k3_dtype dtype;
    int rank;
    uint64_t shape[K3_MAX_RANK];
    uint64_t numel;      /* product of shape; 1 for rank 0 */
    uint64_t begin, end; /* data_offsets; end - begin == numel * bits / 8 */
} k3_st_tensor;

static inline uint64_t k3_st_nbytes(const k3_st_tensor *t) {
    return t->end - t->begin;
}

typedef struct k3_st_file k3_st_file;

/* Opens and fully validates path. The file descriptor stays open for reads and views. */
int k3_st_open(k3_st_file **out, const char *path, k3_error *err);
/* Validates a whole safetensors file held in memory (8-byte length, header, data). The
 * buffer is borrowed, not copied: it must outlive the k3_st_file. name is used in messages
 * in place of a path. This is the fuzzer's entry point. */
int k3_st_parse(k3_st_file **out, const void *bytes, size_t len, const char *name, k3_error *err);
void k3_st_close(k3_st_file *f); /* NULL-safe; unmaps, closes */

const char *k3_st_path(const k3_st_file *f); /* the path or the name given to parse */
uint64_t k3_st_file_size(const k3_st_file *f);
uint64_t k3_st_data_start(const k3_st_file *f); /* 8 + N: absolute offset of the data buffer */

/* Tensors in data-offset order (ties by end, then name). */
size_t k3_st_count(const k3_st_file *f);
const k3_st_tensor *k3_st_at(const k3_st_file *f, size_t i);           /* NULL when out of range */
const k3_st_tensor *k3_st_find(const k3_st_file *f, const char *name); /* NULL when absent */

/* __metadata__, sorted by key. */
size_t k3_st_metadata_count(const k3_st_file *f);
bool k3_st_metadata_at(const k3_st_file *f, size_t i, const char **key, const char **value);
const char *k3_st_metadata_get(const k3_st_file *f, const char *key); /* NULL when absent */

/* ---- views: zero-copy when aligned, a private copy otherwise ---------------------- */

typedef struct k3_st_view {
    const void *data; /* t's bytes; NULL only for an empty tensor */
    uint64_t nbytes;
    void *owned; /* non-NULL when data is a malloc'd copy (the unaligned path) */
} k3_st_view;

/* align: required alignment of data in bytes (a power of two); 0 means the element size
 * (bits/8, at least 1). Zero-copy when (data_start + begin) % align == 0 and align <= the
 * page size; a malloc'd copy with that alignment otherwise. Thread-safe. */
int k3_st_view_get(k3_st_file *f, const k3_st_tensor *t, size_t align, k3_st_view *out,
                   k3_error *err);
void k3_st_view_release(k3_st_view *v); /* NULL-safe; frees a copy, leaves a mapping alone */

/* ---- streaming reads (pread; thread-safe) ----------------------------------------- */

enum {
    K3_ST_READ_DONTNEED = 1, /* posix_fadvise(DONTNEED) the range after reading it */
};

/* Reads all of t into dst; dst_size must equal k3_st_nbytes(t) exactly (K3_ERR_ARG). */
int k3_st_read(k3_st_file *f, const k3_st_tensor *t, void *dst, size_t dst_size, unsigned flags,
               k3_error *err);
/* Reads bytes [off, off + dst_size) of t into dst; the range must lie inside t (K3_ERR_ARG). */
int k3_st_read_range(k3_st_file *f, const k3_st_tensor *t, uint64_t off, void *dst, size_t dst_size,
                     unsigned flags, k3_error *err);

/* Checked size of a (dtype, shape): false on overflow or a sub-byte total that is not whole
 * bytes. Shared by the reader, the writer and the checkpoint loader. */
bool k3_st_tensor_bytes(k3_dtype dtype, int rank, const uint64_t *shape, uint64_t *numel,
                        uint64_t *nbytes);

/* ---- writer (st_write.c) ----------------------------------------------------------
 * Streams files larger than memory: declare every tensor (name, dtype, shape) and the
 * metadata first; k3_st_writer_begin lays the file out like the reference writer (tensors
 * sorted by dtype order descending, then name; header padded with spaces to a multiple of 8,
 * so every tensor is aligned to its element size) and writes the header to PATH.tmp. Then
 * supply each tensor's bytes in any order, whole (k3_st_writer_put) or in consecutive chunks
 * (k3_st_writer_put_chunk, each tensor's chunks in order, tensors interleaved freely).
 * k3_st_writer_finish checks every tensor was written completely, fsyncs and renames
 * PATH.tmp to PATH; free without finish removes PATH.tmp. */

typedef struct k3_st_writer k3_st_writer;

int k3_st_writer_new(k3_st_writer **out, k3_error *err);
void k3_st_writer_free(k3_st_writer *w); /* NULL-safe */
/* Adds a __metadata__ entry; keys must be unique. */
int k3_st_writer_metadata(k3_st_writer *w, const char *key, const char *value, k3_error *err);
/* Declares a tensor; names must be unique, valid UTF-8, 1..K3_ST_MAX_NAME bytes. */
int k3_st_writer_declare(k3_st_writer *w, const char *name, k3_dtype dtype, int rank,
                         const uint64_t *shape, k3_error *err);
int k3_st_writer_begin(k3_st_writer *w, const char *path, k3_error *err);
int k3_st_writer_put(k3_st_writer *w, const char *name, const void *data, size_t nbytes,
                     k3_error *err);
int k3_st_writer_put_chunk(k3_st_writer *w, const char *name, const void *data, size_t nbytes,
                           k3_error *err);
int k3_st_writer_finish(k3_st_writer *w, k3_error *err);

/* One tensor held in memory, for the whole-file helpers below. */
typedef struct k3_st_wtensor {
    const char *name;
    k3_dtype dtype;
    int rank;
    uint64_t shape[K3_MAX_RANK];
    const void *data; /* k3_st_tensor_bytes(dtype, rank, shape) bytes */
} k3_st_wtensor;

/* Writes one file from memory. meta: n_meta (key, value) pairs, may be NULL. */
int k3_st_write_file(const char *path, const k3_st_wtensor *t, size_t n,
                     const char *const (*meta)[2], size_t n_meta, k3_error *err);

/* Writes a sharded checkpoint into the existing directory dir: shards named
 * model-0000i-of-0000N.safetensors (5 digits, 1-based, the Hugging Face convention) and
 * model.safetensors.index.json with metadata.total_size (sum of tensor bytes) and the
 * weight_map. shard_of[i] in [0, n_shards) places tensor i; NULL splits the tensors, in the
 * given order, into n_shards runs of roughly equal bytes. Every shard gets meta. */
int k3_st_write_sharded(const char *dir, size_t n_shards, const k3_st_wtensor *t, size_t n,
                        const size_t *shard_of, const char *const (*meta)[2], size_t n_meta,
                        k3_error *err);

#endif
