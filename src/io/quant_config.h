/* Which quantization a checkpoint *declares* for each module, read from ModelOpt's
 * hf_quant_config.json, the inline config.json `quantization_config` (ModelOpt flat shape or
 * compressed-tensors), and written back for make-tiny / quantize.
 *
 * Rules (checkpoint-formats.md §2, §4.2, §6.2, §7.3):
 * - hf_quant_config.json (nested `quantization`) is authoritative; the inline copy is only
 *   compared, and a divergence is a k3_warn plus `inline_diverges` (TRT-LLM does the same).
 * - Algorithm names are canonicalized on parse: `fp8_pb_wo` in any letter case is
 *   FP8_BLOCK_SCALES (top level and every quantized_layers entry); other names are kept
 *   as written (known TensorRT-LLM QuantAlgo names upper-cased). Unknown names pass the
 *   parser and are rejected by name in k3_quant_config_validate.
 * - ModelOpt: a module is declared by its own quantized_layers entry or its nearest
 *   ancestor's (MIXED_PRECISION), or by the top-level algo (single format); exclude_modules
 *   (exact names or `*` wildcards, matched against the module and its ancestors) win.
 * - compressed-tensors: `ignore` (names or `re:` PCRE2 patterns, start-anchored like
 *   Python's re.match) wins; then the first config_group whose targets match (`Linear` is a
 *   class target: it matches every module, since names cannot tell a Linear apart; such a
 *   match is flagged by_class so the loader accepts a plain BF16 tensor there). The scheme
 *   is dispatched on (format, type, num_bits, group_size), never on the format name alone.
 * - Module names are compared in every prefix variant (`language_model.model.`, `model.`,
 *   none), so a checkpoint that names tensors one way and its quant config another agrees.
 * - Routed experts are resolved per layer (k3_quant_resolve_experts): declared NVFP4 ->
 *   NVFP4; a ModelOpt config that declares nothing for a layer's experts -> MXFP4 (the
 *   W4A8_MXFP4_MXFP8 default of TensorRT-LLM for the original moonshotai/Kimi-K3).
 * A parsed config is read-only during resolution: several loader threads may resolve at once.
 * What a declaration does not settle (a BF16 router under `targets: Linear`, FP8 trunk
 * tensors) the loader decides per tensor from dtype and siblings, cross-checked here. */
#ifndef K3_QUANT_CONFIG_H
#define K3_QUANT_CONFIG_H

#include "base/base.h"
#include "io/model_config.h"
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The on-disk scheme a module is declared with. */
typedef enum k3_qscheme {
    K3_QS_NONE = 0,  /* plain BF16/F16/F32 */
    K3_QS_NVFP4,     /* ModelOpt: weight U8, weight_scale E4M3 /16, weight_scale_2, input_scale */
    K3_QS_NVFP4_CT,  /* compressed-tensors nvfp4-pack-quantized: weight_packed, weight_scale,
                        weight_global_scale, input_global_scale (reciprocal globals) */
    K3_QS_MXFP4,     /* packed E2M1 (weight_packed; `weight` in ModelOpt exports) + E8M0
                        weight_scale per 32 (the weights of W4A8_MXFP4_MXFP8) */
    K3_QS_FP8_BLOCK, /* FP8_BLOCK_SCALES (= FP8_PB_WO): E4M3 weight + F32 128x128 scales */
    K3_QS_OTHER,     /* declared, but a format k3 does not decode; k3_qdecl.algo names it */
    K3_QS_COUNT
} k3_qscheme;

typedef enum k3_qsource {
    K3_QSRC_NONE = 0,          /* no quantization config: everything plain */
    K3_QSRC_MODELOPT,          /* hf_quant_config.json and/or inline quant_method modelopt */
    K3_QSRC_COMPRESSED_TENSORS /* inline quant_method compressed-tensors */
} k3_qsource;

/* One quantized_layers entry. */
typedef struct k3_qlayer {
    char *name;         /* module name as written */
    char *algo;         /* canonical (see above); NULL when the entry has none */
    char *as_written;   /* the algo string as the file spells it (the writer keeps it) */
    int64_t group_size; /* -1 when absent */
} k3_qlayer;

/* An exclude / ignore / target pattern. */
typedef struct k3_qpattern {
    char *text; /* as written, "re:" included */
    void *re;   /* pcre2_code * for "re:" patterns, compiled once; else NULL */
    bool expert_level; /* may match one routed expert's module and not its layer's `experts`
                        * (a regex, a glob with an inner `*`, or text naming "experts.") */
} k3_qpattern;

/* One compressed-tensors config_group. */
typedef struct k3_ct_group {
    char *name; /* "group_0" */
    k3_qpattern *targets;
    size_t n_targets;
    char *format;           /* the group's format, else the top-level one (may be NULL) */
    char *type;             /* weights.type: "float" / "int" */
    int64_t num_bits;       /* weights.num_bits */
    int64_t group_size;     /* weights.group_size, -1 when absent/null */
    bool input_activations; /* an input_activations descriptor is present (not null) */
    k3_qscheme scheme;      /* dispatched from (format, type, num_bits, group_size) */
} k3_ct_group;

typedef struct k3_quant_config {
    k3_qsource source;
    char *origin;              /* which file/object was authoritative, for messages */
    char *quant_algo;          /* ModelOpt top level, canonical; NULL when null */
    char *kv_cache_quant_algo; /* canonical ("FP8", "NVFP4", "INT8", ...), NULL when none */
    int64_t group_size;        /* ModelOpt single-format group_size, -1 when absent */
    k3_qlayer *layers;         /* quantized_layers, sorted by name (bsearch) */
    size_t n_layers;
    k3_qpattern *exclude; /* ModelOpt exclude_modules, or compressed-tensors ignore */
    size_t n_exclude;
    char *ct_format; /* compressed-tensors top-level format */
    k3_ct_group *groups;
    size_t n_groups;
    bool inline_diverges;   /* the inline copy disagreed with hf_quant_config.json */
    char divergence[1024];  /* the first difference, as warned */
    char *producer_version; /* ModelOpt producer.version, or NULL */
} k3_quant_config;

/* The result of resolving one module. Pointers borrow from the config. */
typedef struct k3_qdecl {
    k3_qscheme scheme;
    const char *algo;    /* canonical algo / CT format that declared it; NULL for none */
    int64_t group_size;  /* 16, 32, 128, ... or -1 when unknown */
    const char *matched; /* the entry, group or pattern that decided, for messages */
    bool by_class;       /* compressed-tensors `Linear` target: BF16 on disk is also fine */
    bool defaulted;      /* nothing declared; the routed-expert MXFP4 default applied */
} k3_qdecl;

void k3_quant_config_init(k3_quant_config *qc); /* source NONE: nothing quantized */
void k3_quant_config_free(k3_quant_config *qc); /* safe on an init'ed or freed config */

/* hf_quant (the parsed hf_quant_config.json, or NULL) and inline_qc (config.json's
 * quantization_config object, or NULL), each with a name for messages. At least one may be
 * NULL; both NULL gives source NONE. On failure qc is left freed. */
int k3_quant_config_parse(k3_quant_config *qc, const cJSON *hf_quant, const char *hf_what,
                          const cJSON *inline_qc, const char *inline_what, k3_error *err);
/* Reads DIR/hf_quant_config.json when present and the quantization_config of
 * DIR/config.json (top level, else text_config's). */
int k3_quant_config_load(k3_quant_config *qc, const char *dir, k3_error *err);

/* Rejects, by name: an algorithm that is not a TensorRT-LLM QuantAlgo name (after the alias
 * rule; K3_ERR_FORMAT, a malformed declaration), a compressed-tensors class target other than
 * Linear (K3_ERR_UNSUPPORTED: well-formed, but k3 cannot match classes), a MIXED_PRECISION
 * config without quantized_layers. */
int k3_quant_config_validate(const k3_quant_config *qc, k3_error *err);

/* The alias rule and the QuantAlgo table: returns the canonical static name for a known
 * name (any letter case; fp8_pb_wo -> "FP8_BLOCK_SCALES"), NULL for an unknown one. */
const char *k3_quant_algo_canonical(const char *name);
/* Scheme of a canonical ModelOpt algo name (NVFP4 -> K3_QS_NVFP4, FP8_BLOCK_SCALES ->
 * K3_QS_FP8_BLOCK, W4A8_MXFP4_MXFP8/W4A8_MXFP4_FP8/W4A16_MXFP4 -> K3_QS_MXFP4, NULL or
 * NO_QUANT -> K3_QS_NONE, else K3_QS_OTHER). */
k3_qscheme k3_qscheme_of_algo(const char *algo);
const char *k3_qscheme_name(k3_qscheme s);

/* The declared scheme of one module (a weight's name without `.weight`). */
int k3_quant_resolve(const k3_quant_config *qc, const char *module, k3_qdecl *out, k3_error *err);
/* One routed-expert tensor's module (".../experts.7.w1") given its layer's declaration from
 * k3_quant_resolve_experts: what singles this expert out (an exclusion or entry at its
 * `experts.N` level or below; under MIXED_PRECISION no entry covering it at all, reported as
 * scheme NONE with matched NULL), else the layer's declaration. Only expert-level patterns
 * are tried, so resolving each of K3's ~250k expert tensors stays cheap. */
int k3_quant_resolve_expert_module(const k3_quant_config *qc, const char *module,
                                   const k3_qdecl *layer, k3_qdecl *out, k3_error *err);
/* The routed-expert scheme of layer `layer` (0-indexed): looks up
 * {language_model.model.|model.|}layers.{i}.{block_sparse_moe.experts|mlp.experts} and
 * every per-expert entry below them; disagreeing declarations are an error naming both. */
int k3_quant_resolve_experts(const k3_quant_config *qc, int64_t layer, k3_qdecl *out,
                             k3_error *err);

/* Patterns: "re:..." is a PCRE2 pattern, matched anchored at the start of the name (as
 * Python's re.match); anything else matches the whole name with `*` as the only wildcard
 * (any run of characters, dots included). compile reports a bad regex by pattern. */
int k3_qpattern_compile(k3_qpattern *p, const char *text, const char *what, k3_error *err);
/* *hit tells whether p matches name. A regex PCRE2 gives up on (its match limit, reached by a
 * pathological pattern such as "re:(a|aa)+$") is K3_ERR_LIMIT naming pattern and name: the
 * resolution functions use this, so such a pattern is never read as "no match". */
int k3_qpattern_match_checked(const k3_qpattern *p, const char *name, bool *hit, k3_error *err);
/* The same, with a regex PCRE2 gives up on counted as no match (for callers without an
 * error path). */
bool k3_qpattern_match(const k3_qpattern *p, const char *name);
void k3_qpattern_free(k3_qpattern *p);

/* ---- building and writing (make-tiny, quantize) ---------------------------------- */

/* Adds a quantized_layers entry (ModelOpt; makes the config MIXED_PRECISION when the
 * source was NONE). algo is canonicalized as on parse. */
int k3_quant_config_add_layer(k3_quant_config *qc, const char *name, const char *algo,
                              int64_t group_size, k3_error *err);
/* Adds an exclude_modules (ModelOpt) / ignore (compressed-tensors) pattern; "re:"
 * patterns are compiled and a bad regex is an error naming it. */
int k3_quant_config_add_exclude(k3_quant_config *qc, const char *pattern, k3_error *err);

enum {
    K3_QPLAN_EXPERTS_NVFP4 = 1u << 0, /* routed experts NVFP4, group 16 */
    K3_QPLAN_ATTN_FP8 = 1u << 1,      /* attention projections FP8_PB_WO (128x128) */
    K3_QPLAN_ALL_PREFIXES = 1u << 2,  /* expert entries under every prefix x suffix
                                         variant, as nvidia/Kimi-K3-NVFP4 lists them */
};
/* Builds the MIXED_PRECISION declaration of nvidia/Kimi-K3-NVFP4 for model mc: per MoE
 * layer `{prefix}model.layers.i.block_sparse_moe.experts` NVFP4/16 (all variants with
 * K3_QPLAN_ALL_PREFIXES), and per layer the KDA projections q,k,v,g (or g_a,g_b),f_a,b,f_b
 * and MLA q_a (or q), kv_a_proj_with_mqa, q_b, kv_b, o, g as FP8_PB_WO, plus routers in
 * exclude_modules. prefix is "" or "language_model.". qc must be freshly init'ed. */
int k3_quant_plan_modelopt(k3_quant_config *qc, const k3_model_config *mc, const char *prefix,
                           unsigned flags, k3_error *err);
/* Builds a compressed-tensors declaration: one group, targets Linear, scheme NVFP4_CT
 * (nvfp4-pack-quantized, group 16, dynamic local activations) or MXFP4
 * (mxfp4-pack-quantized, group 32, no activations), with the given ignore patterns. */
int k3_quant_plan_ct(k3_quant_config *qc, k3_qscheme scheme, const char *const *ignore,
                     size_t n_ignore, k3_error *err);

/* hf_quant_config.json (nested shape; ModelOpt configs only). */
int k3_quant_config_to_hf_json(const k3_quant_config *qc, cJSON **out, k3_error *err);
/* The inline config.json quantization_config: ModelOpt flat shape or compressed-tensors. */
int k3_quant_config_to_inline_json(const k3_quant_config *qc, cJSON **out, k3_error *err);

#endif
