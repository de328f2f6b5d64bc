/* The checkpoint emitter shared by make-tiny and quantize: given a list of items (a plan
 * entry to quantize into a declared scheme, or a tensor to copy through byte for byte), it
 * lays out the shards with the streaming safetensors writer, fills them with a pool of
 * threads (values from a caller callback, quantized by k3's quantizers of
 * src/formats/block.h), and writes model.safetensors.index.json. Files larger than memory
 * are fine: each thread holds one item at a time. Every item's bytes depend only on the
 * item, so the output is identical for any thread count.
 *
 * File tensors per scheme (checkpoint-formats.md §3-§6): NVFP4 weight/weight_scale/
 * weight_scale_2[]/input_scale[]; NVFP4_CT weight_packed/weight_scale/weight_global_scale[1]/
 * input_global_scale[1] (reciprocals); MXFP4 weight_packed/weight_scale U8; FP8_BLOCK
 * weight E4M3 + weight_scale F32 [ceil(N/128),1,ceil(K/128),1] (ModelOpt's 4-D form). */
#ifndef K3_LOAD_EMIT_H
#define K3_LOAD_EMIT_H

#include "io/quant_config.h"
#include "io/safetensors.h"
#include "load/plan.h"

typedef struct k3_etensor {
    char name[520];
    k3_dtype dtype;
    int rank;
    uint64_t shape[K3_MAX_RANK];
    uint64_t nbytes;
} k3_etensor;

typedef struct k3_emit_item {
    /* A plan entry to produce (values from the callback), or NULL for a copy. */
    const k3_pentry *e;
    k3_qscheme scheme;      /* linear entries: the scheme to write (NONE: plain) */
    k3_dtype plain_dtype;   /* plain output dtype (BF16 or F32) */
    bool no_input_scale;    /* NVFP4: write no activation scale (no calibration data) */
    /* NVFP4: the item sharing this one's weight_scale_2 (a routed expert's w3 for its w1 and
     * back: the fused gate/up GEMM has one global scale, moe.md §2.2 and §4.2), or NULL */
    const struct k3_emit_item *partner;
    /* copy: this tensor's bytes, unchanged */
    k3_st_file *copy_file;
    const k3_st_tensor *copy;
    /* filled by k3_emit_prepare */
    k3_etensor t[4];
    int nt;
    uint64_t bytes;
    int shard;              /* set by the caller or by k3_emit_prepare's byte split */
} k3_emit_item;

typedef struct k3_emit_src {
    void *ctx;
    /* The float values [rows*cols] (linear) or [numel] (plain) of item it. */
    int (*values)(void *ctx, const k3_emit_item *it, float *out, int64_t n, k3_error *err);
    /* NVFP4 input_scale of a module (> 0), or any value when it->no_input_scale. */
    float (*input_scale)(void *ctx, const k3_emit_item *it);
} k3_emit_src;

/* Pairs each gated routed expert's w1 and w3 items (by_plan[i]: the item of plan entry i, or
 * NULL) when both are NVFP4, so they share one weight_scale_2. */
void k3_emit_pair_gate_up(k3_emit_item *const *by_plan, const k3_plan *p, bool gated);

/* Names, dtypes, shapes and byte counts of each item's file tensors; total in *total. */
int k3_emit_prepare(k3_emit_item *items, size_t n, uint64_t *total, k3_error *err);
/* Assigns shards by splitting the items, in order, into n_shards runs of equal bytes. */
void k3_emit_split(k3_emit_item *items, size_t n, int n_shards, uint64_t total);

typedef struct k3_emit_opts {
    int n_threads;     /* 0: online CPUs */
    bool progress;     /* \r line on stderr after one second */
    const char *what;  /* command name for the progress line */
} k3_emit_opts;

/* Writes the shards model-0000s-of-0000N.safetensors and the index into dir. */
int k3_emit(const char *dir, k3_emit_item *items, size_t n, int n_shards, uint64_t total,
            const k3_emit_src *src, const k3_emit_opts *o, k3_error *err);

/* Writes a cJSON tree as DIR/FILE (pretty-printed, newline-terminated). */
int k3_emit_json(const char *dir, const char *file, const cJSON *j, k3_error *err);

#endif
