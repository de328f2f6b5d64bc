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

/* A static string; "unknown status" outside [K3_OK, K3_STATUS_COUNT). */
const char *k3_status_str(int status);

/* Caller-owned error: the callee writes the status and one line naming what is wrong.
 * Every function taking a k3_error accepts err == NULL (the status is still returned). A NULL
 * handle or required pointer is K3_ERR_ARG naming the argument; the accessors that take no
 * k3_error read a NULL handle as an empty one (0, NULL or -1). */
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

/* Every string a checkpoint accessor returns is owned by the checkpoint and valid until
 * k3_checkpoint_close. Tensors are numbered 0..count-1 in name order (strcmp), across all
 * shards. */
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

/* The format of the linear module `module` (a weight's name without ".weight" or
 * ".weight_packed"), judged from the names and dtypes of its tensors alone, as for a checkpoint
 * without quantization declarations: *format is "plain", "NVFP4", "NVFP4-CT", "MXFP4", "MXFP8"
 * or "FP8-block" (static; set on failure too). The set is then checked by the loader's dtype,
 * shape and sibling rules, without reading a byte: a scale of the wrong dtype or shape, a missing
 * or stray sibling, an F8_E4M3 weight without its scale is an error naming the tensor and what
 * was expected (checkpoint-formats.md §3-§6, §8.2 item 6). */
int k3_checkpoint_weight_format(const k3_checkpoint *ck, const char *module, const char **format,
                                k3_error *err);

/* ---- loaded models (src/load/) ---------------------------------------------------- */

/* A Kimi K3 / Kimi-Linear checkpoint loaded for one expert-parallel rank: configs parsed
 * and cross-checked against tensor shapes, every tensor decoded and validated by dtype and
 * quantization declaration (checkpoint-formats.md §8.2), the rank's routed experts read
 * shard by shard with pread (other ranks' expert bytes are never read). */
typedef struct k3_model k3_model;

typedef struct k3_model_opts {
    const char *path;      /* checkpoint directory (config.json, shards, index) */
    int ep_size;           /* expert-parallel ranks; 0 or 1: this process holds every expert */
    int ep_rank;           /* this rank, in [0, ep_size); 0 when ep_size is 0 or 1 */
    int n_threads;         /* reader threads, at most 256; 0: online CPUs */
    const int *layers;     /* decoder layers to load (0-indexed); NULL: all */
    int n_layers;          /* entries in layers (0 when layers is NULL) */
    int progress;          /* 1: a \r progress line on stderr when the load takes over 1 s */
    int headers_only;      /* 1: configs and tensor headers checked, no weight read (inspect) */
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
    const char *prefix;    /* "language_model." or ""; valid until k3_model_close */
} k3_model_info;

int k3_model_get_info(const k3_model *m, k3_model_info *out);

/* One decoder layer as the checkpoint stores it (valid after a headers_only open too). Its
 * strings are static. */
typedef struct k3_layer_info {
    const char *attn;          /* "KDA" or "MLA" */
    const char *ffn;           /* "dense" or "MoE" */
    int n_experts;             /* routed experts (0 for dense) */
    const char *expert_format; /* "NVFP4", "NVFP4-CT", "MXFP4", "FP8-block", "BF16", ...; NULL if dense */
    uint64_t bytes;            /* every tensor of the layer, scales included */
    uint64_t expert_bytes;     /* the routed experts' part of bytes */
} k3_layer_info;

int k3_model_layer_info(const k3_model *m, int layer, k3_layer_info *out, k3_error *err);

/* What expert-parallel rank `rank` of ep_size would hold (moe.md §2.6 partition): its
 * experts [first, first + count), their bytes over all layers, and its whole share
 * (every non-expert tensor plus those experts). */
typedef struct k3_rank_info {
    int first, count;
    uint64_t expert_bytes;
    uint64_t total_bytes;
} k3_rank_info;

int k3_model_rank_info(const k3_model *m, int ep_size, int rank, k3_rank_info *out, k3_error *err);

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
    int n_threads;        /* writer threads, at most 256; 0: online CPUs */
    int progress;         /* 1: \r progress line on stderr */
} k3_make_tiny_opts;

int k3_make_tiny_checkpoint(const k3_make_tiny_opts *opts, k3_error *err);

/* Converts a BF16/F16/F32 checkpoint into a published format: "nvfp4" (ModelOpt),
 * "nvfp4-ct" (compressed-tensors), "mxfp4" (compressed-tensors) or "fp8-block" (ModelOpt
 * FP8_PB_WO). Default selection: the routed experts (fp8-block: every linear layer); only /
 * exclude are regular expressions (PCRE2) searched in module names. Routers, embeddings and
 * lm_head are never quantized; every unselected tensor is copied unchanged. */
typedef struct k3_quantize_opts {
    const char *in, *out;
    const char *to;             /* required: no default format */
    const char *const *only;    /* n_only patterns; a module is selected if any matches */
    int n_only;
    const char *const *exclude; /* n_exclude patterns; a match deselects */
    int n_exclude;
    int n_threads;              /* writer threads, at most 256; 0: online CPUs */
    int progress;
} k3_quantize_opts;

int k3_quantize_checkpoint(const k3_quantize_opts *opts, k3_error *err);

/* ---- benchmarks (`k3 bench moe`) ---------------------------------------------------- */

/* One routed-expert layer timed on synthetic weights built in memory (k3's quantizer) with
 * uniform random routing, plus the machine's own ceilings measured in the same run: a
 * streaming-read bandwidth probe over a buffer much larger than the last-level cache and an
 * FMA throughput probe, both on the same threads. Zero fields take the defaults shown. */
typedef struct k3_bench_moe_opts {
    const char *backend;   /* "cpu" (default), "ref", "cuda", "cuda-fused" */
    const char *format;    /* "nvfp4" (default), "mxfp4", "bf16" */
    const char *mode;      /* "w4a16" (default), "w4a4" (nvfp4), "w4a8" (mxfp4), "w4a16-bf16" */
    const char *isa;       /* cpu backend: "auto" (default), "scalar", "avx2", "avx512" */
    int n_experts, top_k, hidden, inter; /* 0: the Kimi K3 layer 896, 16, 3584, 3072 */
    int experts_built;     /* distinct experts in memory (routing uses only these);
                              0: as many as fit in mem_budget_gib, at most n_experts */
    double mem_budget_gib; /* 0: 6; negative or NaN is an error */
    int threads;           /* 0: all online CPUs */
    int repeats, warmup;   /* 0: 5 and 1 (cuda backends: 20 and 3) */
    uint64_t seed;         /* routing and weights; 0: 1 */
    int warm;              /* 1: one routing per token count and no cache flush between
                              repeats (how micro-benchmarks such as ggml's perf mode run) */
    const char *model_dir; /* time this checkpoint's routed experts of `layer` instead of
                              synthetic ones (shape, top_k, format and activation from it;
                              format, n_experts, top_k, hidden, inter, experts_built ignored) */
    int layer;
} k3_bench_moe_opts;

typedef struct k3_bench_moe_row {
    int tokens;
    double experts_touched;   /* mean over the timed repeats (routing is redrawn each time) */
    double t_median_s, t_min_s, t_max_s;
    double weight_bytes;      /* expert weight + scale bytes the call must read (mean) */
    double flops;             /* 2 * tokens * top_k * (3 * H * I gated, 2 * H * I not) */
    double read_gbs;          /* cold runs: median of the read probes (the cache flushes) taken
                                 right before each timed call, so the fraction compares like
                                 with like on a machine whose bandwidth drifts; warm: 0 */
} k3_bench_moe_row;

typedef struct k3_bench_moe_env {
    char cpu[128];            /* model name from /proc/cpuinfo */
    char isa[16];             /* kernel that ran (cpu backend) */
    char format[16], mode[16], backend[16];
    int threads;
    int n_experts, top_k, hidden, inter;
    int experts_built;        /* routing draws from these */
    int experts_quantized;    /* of which quantized from random floats; the rest re-randomize
                                 those packed codes (same format, valid codes, fresh memory) */
    double bytes_per_expert;
    double read_gbs;          /* streaming-read probe, GB/s (1e9 bytes) */
    double probe_bytes;       /* size of its buffer */
    double llc_bytes;         /* last-level cache size the OS reports (0 if unknown) */
    double fma_gflops;        /* fp32 FMA peak probe with the kernel's vector width */
    int warm;                 /* the run was warm (see k3_bench_moe_opts.warm) */
    int from_model;           /* experts came from a checkpoint (-m), all of them built */
} k3_bench_moe_env;

/* rows[n_tokens] receives one row per entry of tokens[]. */
int k3_bench_moe(const k3_bench_moe_opts *opts, const int *tokens, int n_tokens,
                 k3_bench_moe_row *rows, k3_bench_moe_env *env, k3_error *err);

#ifdef __cplusplus
}
#endif
#endif
