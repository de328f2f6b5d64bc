/* Tensor decoding: from checkpoint tensors (name, dtype, shape, bytes) to a validated
 * k3_qmat, chosen by the tensor's dtype and the quantization declaration together
 * (checkpoint-formats.md §3-§6 and §8.2 item 6). Nothing reaches a kernel that has not
 * passed here: shapes, scale dtypes, NaN block scales and non-finite global scales are
 * rejected with the tensor's name.
 *
 * The decoder never copies weight bytes: the qmat points into the views' data, which the
 * caller keeps alive. Scalar global scales are converted into the qmat's floats. Left out:
 * NVFP4_AWQ pre_quant_scale, gpt-oss stacked MXFP4, F4 dtype (no published K3 checkpoint
 * uses them); FP8 block scales stored as BF16 (rejected by name, not converted). */
#ifndef K3_LOAD_DECODE_H
#define K3_LOAD_DECODE_H

#include "base/base.h"
#include "formats/qmat.h"
#include "io/quant_config.h"

/* A tensor as the decoder sees it; data holds nbytes bytes in file layout. */
typedef struct k3_tview {
    const char *name;
    k3_dtype dtype;
    int rank;
    int64_t shape[K3_MAX_RANK];
    const void *data;
    uint64_t nbytes;
} k3_tview;

/* Checkpoint tensor ti as a view over data (NULL: headers only). A shape entry above
 * INT64_MAX, which only an empty tensor can have (checkpoint-formats.md §1.4), is refused by
 * name: views hold int64 shapes. */
int k3_tview_init(k3_tview *out, const k3_tensor_info *ti, const void *data, k3_error *err);

/* The tensor suffixes a linear module may have on disk (module + "." + suffix), in the order of
 * enum k3_qsuffix. Each format owns a subset; any other present one is an error. */
enum k3_qsuffix {
    K3_SFX_WEIGHT, K3_SFX_WEIGHT_PACKED, K3_SFX_WEIGHT_SCALE, K3_SFX_WEIGHT_SCALE_INV,
    K3_SFX_WEIGHT_SCALE_2, K3_SFX_INPUT_SCALE, K3_SFX_WEIGHT_GLOBAL_SCALE,
    K3_SFX_INPUT_GLOBAL_SCALE, K3_N_QSUFFIX
};
extern const char *const k3_qsuffix[K3_N_QSUFFIX];

/* Looks a tensor up by full name; NULL when absent. */
typedef const k3_tview *(*k3_tview_find_fn)(void *ctx, const char *name);

/* Decodes the linear module `module` (e.g. "...experts.7.w1"; its tensors are module +
 * ".weight" etc.) of logical shape [rows, cols] under the declared scheme. plain_ok: a plain
 * BF16/F16/F32 weight is also accepted under a 4-bit declaration (a compressed-tensors
 * `Linear` class target, which cannot tell modules apart). Plain weights are always accepted
 * under FP8_BLOCK (TensorRT-LLM keeps e.g. b_proj BF16). A sibling the decoded format does
 * not have (a weight_global_scale beside a ModelOpt weight_scale_2, any scale beside a plain
 * weight) is an error: it would be claimed and silently dropped. Views with data NULL (a
 * headers-only open) get every dtype and shape check but no value check. The tensors it
 * consumed are reported through mark (may be NULL) so the caller can find orphans. */
int k3_decode_linear(const char *module, k3_qscheme scheme, bool plain_ok, int64_t rows, int64_t cols,
                     k3_tview_find_fn find, void *ctx, void (*mark)(void *ctx, const char *name),
                     k3_qmat *out, k3_error *err);

/* The scheme a module's tensors carry, judged from their names and dtypes alone, where nothing
 * declares one (checkpoint-formats.md §3-§6, k3-architecture.md §1.2): weight_packed with
 * global scales or an E4M3 block scale -> NVFP4_CT, without -> MXFP4; a U8 weight with
 * weight_scale_2 (or another NVFP4 sign) -> NVFP4, with an E8M0 weight_scale -> MXFP4 (ModelOpt's
 * W4A8_MXFP4_FP8 name); an F8_E4M3 weight -> FP8_BLOCK; anything else -> NONE. A set that is
 * incomplete or wrong still gets the scheme it points to, so the decoder names what is wrong
 * with it. */
k3_qscheme k3_decode_infer(const char *module, k3_tview_find_fn find, void *ctx);

/* k3_decode_linear under the scheme k3_decode_infer finds (messages say the tensors chose it,
 * not a declaration). A non-plain weight no scheme claims (a U8 or I8 weight without scales) is
 * an error. */
int k3_decode_linear_undeclared(const char *module, int64_t rows, int64_t cols,
                                k3_tview_find_fn find, void *ctx,
                                void (*mark)(void *ctx, const char *name), k3_qmat *out,
                                k3_error *err);

/* What inspect reports for the module of a weight, with no declaration and no plan: *fmt is
 * "plain", "NVFP4", "NVFP4-CT", "MXFP4", "MXFP8" or "FP8-block" (set on failure too). The
 * logical shape comes from the weight itself, and the set is checked by the same rules as
 * k3_decode_linear_undeclared (MXFP8, which k3 does not decode, by its own dtype and shape
 * rule). A weight with no sibling is plain whatever its dtype, except F8_E4M3 (§8.2 item 6: never
 * plain; its missing scale is the error). */
int k3_decode_classify(const char *module, k3_tview_find_fn find, void *ctx, const char **fmt,
                       k3_error *err);

/* A plain (unquantized) tensor of exactly the given shape and one of the allowed dtypes
 * (bitmask of 1u << k3_dtype). */
int k3_decode_plain(const k3_tview *t, unsigned allowed_dtypes, int rank, const int64_t *shape,
                    k3_error *err);

/* Reads a scalar global scale ([] or [1], F32/BF16/F16) and checks it is finite and > 0
 * (with data NULL, only dtype and shape; *out = 0). */
int k3_decode_scalar(const k3_tview *t, float *out, k3_error *err);

/* Formats "[a,b,c]" into buf (for messages). */
const char *k3_shape_str(int rank, const int64_t *shape, char *buf, size_t size);

#endif
