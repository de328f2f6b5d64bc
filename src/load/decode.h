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

/* What the quantization config declares for one linear module. */
typedef enum k3_decl {
    K3_DECL_NONE = 0,   /* not quantized: BF16/F16/F32 only */
    K3_DECL_NVFP4,      /* ModelOpt NVFP4: weight, weight_scale, weight_scale_2, input_scale */
    K3_DECL_NVFP4_CT,   /* compressed-tensors nvfp4-pack-quantized: weight_packed, weight_scale,
                           weight_global_scale, input_global_scale (reciprocals) */
    K3_DECL_MXFP4,      /* weight_packed + weight_scale E8M0 (U8 or F8_E8M0) */
    K3_DECL_FP8_BLOCK,  /* weight F8_E4M3 + weight_scale / weight_scale_inv F32 128x128 */
    K3_DECL_COUNT
} k3_decl;

const char *k3_decl_name(k3_decl d);

/* The safetensors dtypes the decoder distinguishes, by their header strings (§1.3). The
 * reader's own enum maps onto these through the string, so the decoder does not depend on
 * how the reader numbers them. */
typedef enum k3_ldt {
    K3_LDT_OTHER = 0, /* any dtype no K3 tensor uses (BOOL, I*, U16+, F64, C64, F4, F6...) */
    K3_LDT_U8,
    K3_LDT_F8_E4M3,
    K3_LDT_F8_E5M2,
    K3_LDT_F8_E8M0,
    K3_LDT_BF16,
    K3_LDT_F16,
    K3_LDT_F32,
    K3_LDT_COUNT
} k3_ldt;

k3_ldt k3_ldt_from_name(const char *safetensors_dtype);
const char *k3_ldt_name(k3_ldt t);
#define K3_LOAD_MAX_RANK 8

/* A tensor as the decoder sees it; data holds nbytes bytes in file layout. */
typedef struct k3_tview {
    const char *name;
    k3_ldt dtype;
    const char *dtype_name; /* the header string, for messages */
    int rank;
    int64_t shape[K3_LOAD_MAX_RANK];
    const void *data;
    uint64_t nbytes;
} k3_tview;

/* Looks a tensor up by full name; NULL when absent. */
typedef const k3_tview *(*k3_tview_find_fn)(void *ctx, const char *name);

/* Decodes the linear module `module` (e.g. "...experts.7.w1"; its tensors are module +
 * ".weight" etc.) of logical shape [rows, cols] under declaration decl. The tensors it
 * consumed are reported through mark (may be NULL) so the caller can find orphans. */
int k3_decode_linear(const char *module, k3_decl decl, int64_t rows, int64_t cols,
                     k3_tview_find_fn find, void *ctx, void (*mark)(void *ctx, const char *name),
                     k3_qmat *out, k3_error *err);

/* A plain (unquantized) tensor of exactly the given shape and one of the allowed dtypes
 * (bitmask of 1u << k3_ldt). */
int k3_decode_plain(const k3_tview *t, unsigned allowed_dtypes, int rank, const int64_t *shape,
                    k3_error *err);

/* Reads a scalar global scale ([] or [1], F32/BF16/F16) and checks it is finite and > 0. */
int k3_decode_scalar(const k3_tview *t, float *out, k3_error *err);

/* Formats "[a,b,c]" into buf (for messages). */
const char *k3_shape_str(int rank, const int64_t *shape, char *buf, size_t size);

#endif
