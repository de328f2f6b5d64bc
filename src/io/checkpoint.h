/* Checkpoint internals for the loader: the shards as k3_st_file handles, and the
 * model.safetensors.index.json parser (checkpoint-formats.md §1.5, §8.2 item 5).
 *
 * The public side (include/k3.h) gives names, dtypes and shapes. The loader also needs the
 * bytes: it resolves a name to (shard, k3_st_tensor) here and then uses the safetensors
 * view or streaming-read API of src/io/safetensors.h on that shard. Shards are opened and
 * validated at checkpoint open; their file descriptors stay open, nothing is mapped until a
 * view is requested, so a rank loader can stream its experts shard by shard with pread +
 * K3_ST_READ_DONTNEED.
 *
 * With an index, *.safetensors files in the directory that the index does not name (for
 * example a "consolidated.safetensors") are not opened: the index is authoritative.
 * Left out: remote paths, weight maps that point into subdirectories (refused). */
#ifndef K3_CHECKPOINT_INTERNAL_H
#define K3_CHECKPOINT_INTERNAL_H

#include "io/safetensors.h"

#define K3_INDEX_NAME      "model.safetensors.index.json"
#define K3_INDEX_MAX_BYTES (256u << 20) /* an index of 500k names is ~50 MB */

/* Resolves tensor i (public numbering) to its shard handle and entry. */
int k3_checkpoint_tensor_raw(const k3_checkpoint *ck, size_t i, k3_st_file **file,
                             const k3_st_tensor **t, k3_error *err);
/* By name: K3_ERR_MISSING (message names the tensor and the checkpoint) when absent. */
int k3_checkpoint_lookup(const k3_checkpoint *ck, const char *name, k3_st_file **file,
                         const k3_st_tensor **t, k3_error *err);

/* ---- model.safetensors.index.json (st_index.c) -------------------------------------- */

/* A parsed index: shard names (unique, in first-seen order) and the weight map. Shard names
 * are already checked to be plain file names (no '/', no '\\', not "." or "..", not empty,
 * valid UTF-8). metadata.total_size is optional; other metadata keys of any type are
 * ignored. */
typedef struct k3_st_index {
    size_t n_shards;
    char **shards;
    size_t n_entries;
    char **names;       /* tensor names, weight_map order */
    uint32_t *shard_of; /* index into shards, per entry */
    bool has_total_size;
    uint64_t total_size;
} k3_st_index;

/* Parses index JSON from memory; what names it in messages (normally its path). */
int k3_st_index_parse(k3_st_index **out, const char *text, size_t len, const char *what,
                      k3_error *err);
int k3_st_index_load(k3_st_index **out, const char *path, k3_error *err);
void k3_st_index_free(k3_st_index *ix); /* NULL-safe */

#endif
