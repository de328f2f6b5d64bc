/* The loaded model (the k3_model of include/k3.h), for code inside k3: the validated model
 * and quantization configs, the tensor plan, every loaded tensor as a view or a decoded
 * k3_qmat, and per MoE layer a filled k3_moe_block holding the experts this expert-parallel
 * rank owns. The forward pass, the MoE backends and inspect read it; nothing here is
 * mutable after open.
 *
 * Memory: every kept tensor has its own 64-byte-aligned buffer filled by pread straight from
 * its shard, so resident memory is the kept weights plus small bookkeeping; the bytes of
 * experts another rank owns are never read. */
#ifndef K3_LOAD_MODEL_H
#define K3_LOAD_MODEL_H

#include "io/checkpoint.h"
#include "io/name_table.h"
#include "io/model_config.h"
#include "io/quant_config.h"
#include "load/decode.h"
#include "load/plan.h"
#include "moe/ep.h"
#include "moe/moe.h"

/* One plan entry as loaded. */
typedef struct k3_lentry {
    bool selected;        /* in the layer subset and (experts) owned by this rank */
    k3_qscheme scheme;    /* declared scheme (linear entries) */
    bool plain_ok;        /* declaration by class: plain weights accepted too */
    bool defaulted;       /* routed experts nothing declares: read as the original's MXFP4 */
    bool inferred;        /* no quantization config at all: scheme is what the tensors show */
    k3_qmat q;            /* linear entries, once decoded */
    const k3_tview *v;    /* plain entries, once loaded */
    uint64_t bytes;       /* bytes of all its checkpoint tensors (scales included) */
    k3_dtype wdtype;      /* linear: dtype of .weight / .weight_packed */
} k3_lentry;

typedef struct k3_mlayer {
    bool loaded;
    bool has_moe;
    k3_moe_block moe;     /* valid when loaded && has_moe */
    k3_expert *experts;   /* [n_local], owned */
    float *alpha, *beta;  /* [n_local] SiTU params (NULL for SwiGLU), owned */
    float shared_alpha, shared_beta;
    float *bias_f32;      /* correction bias converted to F32 when stored otherwise */
} k3_mlayer;

struct k3_model {
    char *path;
    k3_checkpoint *ck;
    k3_model_config mc;
    k3_quant_config qc;
    k3_plan plan;
    k3_lentry *le;        /* [plan.n] */
    k3_ep_part ep;
    k3_tview *views;      /* loaded file tensors */
    size_t n_views;
    k3_name_table vt;     /* name -> views index */
    k3_name_table pt;     /* plan entry name without the prefix -> plan index */
    void **bufs;          /* [n_views] owned, aligned */
    k3_mlayer *layers;    /* [num_hidden_layers] */
    uint64_t bytes_read, bytes_kept;
    double load_seconds;
};

/* Finds a loaded plan entry by name without the prefix ("model.layers.3.self_attn.o_proj"). */
const k3_lentry *k3_model_entry(const k3_model *m, const char *name);
/* The MoE block of layer l; NULL when l is dense or was not loaded. */
const k3_moe_block *k3_model_moe(const k3_model *m, int layer);
const k3_model_config *k3_model_mc(const k3_model *m);

#endif
