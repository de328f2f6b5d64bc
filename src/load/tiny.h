/* make-tiny: writes a complete Kimi-K3-architecture checkpoint with seeded random weights,
 * quantized by k3's own quantizers into a real published format (checkpoint-formats.md):
 * config.json (kimi_k3 wrapper + text_config), hf_quant_config.json for ModelOpt, sharded
 * safetensors with model.safetensors.index.json, and tokenizer files (tiktoken.model +
 * tokenizer_config.json, a tiny BPE vocabulary).
 *
 * Presets: `tiny` (a few MB: dense layer 0, KDA and MLA layers, 16 experts top-4, AttnRes
 * block 2, SiTU, latent MoE) is the built-in test model; `small` (tens of MB) is for CPU
 * benchmarks; `k3-layer` is one full-size K3 MoE layer (896 experts, latent 3584, I 3072,
 * top-16; ~16.6 GB NVFP4) for kernel benchmarks: it is streamed to disk expert by expert
 * with a thread pool, never held in memory. Every tensor's values depend only on the seed
 * and its name, so the output is byte-identical for any thread count. */
#ifndef K3_LOAD_TINY_H
#define K3_LOAD_TINY_H

#include "io/model_config.h"
#include "io/quant_config.h"

typedef enum k3_tiny_format {
    K3_TINY_NVFP4 = 0, /* ModelOpt MIXED_PRECISION: NVFP4 experts + FP8_PB_WO attention */
    K3_TINY_NVFP4_CT,  /* compressed-tensors nvfp4-pack-quantized experts */
    K3_TINY_MXFP4,     /* compressed-tensors mxfp4-pack-quantized experts (moonshotai/Kimi-K3) */
    K3_TINY_BF16,      /* no quantization */
    K3_TINY_FORMAT_COUNT
} k3_tiny_format;

typedef enum k3_tiny_preset { K3_TINY_TINY = 0, K3_TINY_SMALL, K3_TINY_K3_LAYER, K3_TINY_PRESET_COUNT } k3_tiny_preset;

int k3_tiny_format_parse(const char *s, k3_tiny_format *out);
int k3_tiny_preset_parse(const char *s, k3_tiny_preset *out);
const char *k3_tiny_format_name(k3_tiny_format f);
const char *k3_tiny_preset_name(k3_tiny_preset p);

/* The model config of a preset (mc is filled and owns its layer plan). */
int k3_tiny_config(k3_tiny_preset preset, k3_model_config *mc, k3_error *err);
/* The quantization declaration of a format for model mc (tensor prefix language_model. for
 * the kimi_k3 wrapper, none for a bare kimi_linear config). */
int k3_tiny_quant(k3_tiny_format fmt, const k3_model_config *mc, k3_quant_config *qc,
                  k3_error *err);

/* Writes the tokenizer files (tiktoken.model, tokenizer_config.json) for a vocabulary of
 * vocab_size ids: 256 byte tokens, BPE merges, and 256 specials at the end. */
int k3_tiny_write_tokenizer(const char *dir, int64_t vocab_size, k3_error *err);

typedef struct k3_tiny_opts {
    const char *dir;       /* created if absent; existing checkpoint files are replaced */
    k3_tiny_format format;
    k3_tiny_preset preset;
    uint64_t seed;
    int n_threads;         /* 0: all online CPUs */
    int n_shards;          /* 0: the preset's default */
    bool progress;         /* a \r progress line on stderr */
    const k3_model_config *custom; /* non-NULL: this model instead of the preset (tests) */
} k3_tiny_opts;

int k3_make_tiny(const k3_tiny_opts *o, k3_error *err);
/* The tensor bytes make-tiny would write for o (nothing is written; o->dir may be NULL). */
int k3_tiny_bytes(const k3_tiny_opts *o, uint64_t *bytes, k3_error *err);

/* The generator's values, exposed so tests can re-derive what make-tiny quantized: the
 * float matrix of tensor `name` ([rows, cols], role decides the distribution). */
#include "load/plan.h"
void k3_tiny_values(uint64_t seed, const k3_pentry *e, float *out, int64_t n);
/* The static activation scale make-tiny stores for an NVFP4 module (w1 and w3 of one
 * expert share it: it is derived from the expert's name without the projection). */
float k3_tiny_input_scale(uint64_t seed, const char *module);

#endif
