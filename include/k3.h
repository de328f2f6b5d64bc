/* k3 — the public API of the Kimi K3 inference engine.
 *
 * One narrow header: opaque handles, options structs filled with designated initializers,
 * int status codes (K3_OK == 0) with k3_status_str, and a caller-owned k3_error that receives
 * a message naming the file, tensor and field at fault. Every close/free accepts NULL.
 * The CLI and any front-end include only this header. */
#ifndef K3_H
#define K3_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status and errors ------------------------------------------------------------ */

enum {
    K3_OK = 0,
    K3_ERR_ARG,         /* a bad argument or option from the caller */
    K3_ERR_IO,          /* open/read/write/mmap failed (message carries strerror) */
    K3_ERR_FORMAT,      /* a malformed file: header, JSON, offsets, shapes */
    K3_ERR_DTYPE,       /* a tensor of the wrong dtype */
    K3_ERR_SHAPE,       /* a tensor of the wrong shape */
    K3_ERR_MISSING,     /* a required tensor, field or scale is absent */
    K3_ERR_DUPLICATE,   /* a name present twice */
    K3_ERR_NUMERIC,     /* NaN, Inf, zero or negative where a finite positive value is needed */
    K3_ERR_UNSUPPORTED, /* well-formed, but k3 does not implement it */
    K3_ERR_LIMIT,       /* beyond a stated limit (size cap, top-k, tokens per launch) */
    K3_ERR_NOMEM,
    K3_ERR_DEVICE,      /* no GPU, or a CUDA/NCCL failure */
    K3_ERR_INTERNAL,
    K3_STATUS_COUNT
};

const char *k3_status_str(int status);

/* Caller-owned error: the callee writes the status and one line naming what is wrong. */
typedef struct k3_error {
    int status;
    char msg[1024];
} k3_error;

/* The build: version string, commit and which backends were compiled in. */
const char *k3_version(void);
const char *k3_build_commit(void);
int k3_have_cuda(void); /* 1 when built with CUDA (a device may still be absent) */

/* ---- dtypes (checkpoint-formats.md §1.3) ------------------------------------------ */

/* Every safetensors dtype, in the reference's declaration order (which is also its
 * alignment order: the reference writer sorts tensors by this order descending, then by
 * name, and k3's writer does the same so its files match the reference byte for byte). */
typedef enum k3_dtype {
    K3_DTYPE_INVALID = 0,
    K3_DTYPE_BOOL,
    K3_DTYPE_F4,      /* FP4 E2M1, two per byte; shape counts elements */
    K3_DTYPE_F6_E2M3, /* 6-bit MX element types; shape counts elements */
    K3_DTYPE_F6_E3M2,
    K3_DTYPE_U8,
    K3_DTYPE_I8,
    K3_DTYPE_F8_E5M2,
    K3_DTYPE_F8_E4M3, /* "e4m3fn": no inf, 0x7F/0xFF NaN */
    K3_DTYPE_F8_E8M0, /* MX scale, 2^(e-127), 0xFF NaN */
    K3_DTYPE_F8_E4M3FNUZ,
    K3_DTYPE_F8_E5M2FNUZ,
    K3_DTYPE_I16,
    K3_DTYPE_U16,
    K3_DTYPE_F16,
    K3_DTYPE_BF16,
    K3_DTYPE_I32,
    K3_DTYPE_U32,
    K3_DTYPE_F32,
    K3_DTYPE_C64,
    K3_DTYPE_F64,
    K3_DTYPE_I64,
    K3_DTYPE_U64,
    K3_DTYPE_COUNT
} k3_dtype;

/* The safetensors string ("F8_E4M3"); "INVALID" for anything out of range. */
const char *k3_dtype_name(k3_dtype dtype);
/* Exact, case-sensitive match of a safetensors string; K3_DTYPE_INVALID when unknown. */
k3_dtype k3_dtype_parse(const char *name);
/* Bits per element (4, 6, 8, 16, 32, 64); 0 for an invalid dtype. */
unsigned k3_dtype_bits(k3_dtype dtype);

/* ---- checkpoints (checkpoint-formats.md §1, §8.2) --------------------------------- */

#define K3_MAX_RANK 8 /* tensors of higher rank are rejected */

/* A checkpoint: one .safetensors file, or a directory of shards. With a
 * model.safetensors.index.json the index is authoritative: shard names must be plain file
 * names inside the directory, every mapped tensor must live in exactly the shard the index
 * names, and tensors absent from the map are an error. Without an index, every *.safetensors
 * in the directory is a shard and a name in two shards is an error. Every shard is fully
 * validated at open (header, dtypes, shapes, exact coverage of the data buffer); tensor
 * bytes are not read. */
typedef struct k3_checkpoint k3_checkpoint;

int k3_checkpoint_open(k3_checkpoint **out, const char *path, k3_error *err);
void k3_checkpoint_close(k3_checkpoint *ck); /* NULL-safe */

/* Tensors are numbered 0..count-1 in name order (strcmp), across all shards. */
size_t k3_checkpoint_tensor_count(const k3_checkpoint *ck);

typedef struct k3_tensor_info {
    const char *name; /* owned by the checkpoint */
    k3_dtype dtype;
    int rank; /* 0..K3_MAX_RANK; 0 is a scalar holding one element */
    uint64_t shape[K3_MAX_RANK];
    uint64_t numel;         /* product of shape (1 for a scalar) */
    uint64_t nbytes;        /* bytes on disk: numel * bits / 8 */
    size_t shard;           /* index into the shard list */
    const char *shard_name; /* the shard's file name, without directory */
} k3_tensor_info;

/* K3_ERR_ARG when i >= count. */
int k3_checkpoint_tensor_info(const k3_checkpoint *ck, size_t i, k3_tensor_info *out,
                              k3_error *err);
/* Index of the tensor called name, or -1 when absent. O(1) (hash table). */
int64_t k3_checkpoint_find(const k3_checkpoint *ck, const char *name);

/* Shards in file-name order. A single-file checkpoint has one shard. */
size_t k3_checkpoint_shard_count(const k3_checkpoint *ck);
/* NULL if out of range */
const char *k3_checkpoint_shard_name(const k3_checkpoint *ck, size_t shard);
/* The directory (or, for a single file, the file's directory) the shards live in. */
const char *k3_checkpoint_path(const k3_checkpoint *ck);
/* 1 when the checkpoint came with model.safetensors.index.json, else 0. */
int k3_checkpoint_has_index(const k3_checkpoint *ck);

/* A shard's __metadata__ (string -> string), in key order. _get returns NULL when the
 * key is absent. _at returns K3_ERR_ARG when out of range. */
size_t k3_checkpoint_metadata_count(const k3_checkpoint *ck, size_t shard);
int k3_checkpoint_metadata_at(const k3_checkpoint *ck, size_t shard, size_t i, const char **key,
                              const char **value, k3_error *err);
const char *k3_checkpoint_metadata_get(const k3_checkpoint *ck, size_t shard, const char *key);

/* ---- loaded models (src/load/) ---------------------------------------------------- */

/* A Kimi K3 / Kimi-Linear checkpoint loaded for one expert-parallel rank: configs parsed
 * and cross-checked against tensor shapes, every tensor decoded and validated by dtype and
 * quantization declaration (checkpoint-formats.md §8.2), the rank's routed experts read
 * shard by shard with pread (other ranks' expert bytes are never read). */
typedef struct k3_model k3_model;

typedef struct k3_model_opts {
    const char *path;      /* checkpoint directory (config.json, shards, index) */
    int ep_size;           /* expert-parallel ranks; 0 or 1: this process holds every expert */
    int ep_rank;           /* this rank, in [0, ep_size) */
    int n_threads;         /* reader threads; 0: online CPUs */
    const int *layers;     /* decoder layers to load (0-indexed); NULL: all */
    int n_layers;          /* entries in layers */
    int progress;          /* 1: a \r progress line on stderr when the load takes over 1 s */
} k3_model_opts;

int k3_model_open(k3_model **out, const k3_model_opts *opts, k3_error *err);
void k3_model_close(k3_model *m); /* NULL-safe */

typedef struct k3_model_info {
    int n_layers;          /* decoder layers in the config */
    int n_experts;         /* routed experts per MoE layer (global) */
    int ep_first, ep_count;/* the routed experts this rank holds */
    int top_k;
    int64_t hidden, vocab;
    uint64_t bytes_read;   /* tensor bytes read from disk */
    uint64_t bytes_kept;   /* tensor bytes held in memory */
    double load_seconds;
    const char *prefix;    /* "language_model." or "" */
} k3_model_info;

int k3_model_get_info(const k3_model *m, k3_model_info *out);

/* ---- checkpoint writers (make-tiny, quantize) -------------------------------------- */

/* Writes a complete Kimi-K3-architecture checkpoint with seeded random weights into dir:
 * format "nvfp4" (ModelOpt MIXED_PRECISION, NVFP4 experts + FP8 block attention),
 * "nvfp4-ct" (compressed-tensors NVFP4), "mxfp4" (compressed-tensors MXFP4, as
 * moonshotai/Kimi-K3) or "bf16"; preset "tiny", "small" or "k3-layer". */
typedef struct k3_make_tiny_opts {
    const char *dir;
    const char *format;   /* NULL: "nvfp4" */
    const char *preset;   /* NULL: "tiny" */
    uint64_t seed;
    int n_threads;        /* 0: online CPUs */
    int progress;         /* 1: \r progress line on stderr */
} k3_make_tiny_opts;

int k3_make_tiny_checkpoint(const k3_make_tiny_opts *opts, k3_error *err);

#ifdef __cplusplus
}
#endif
#endif
