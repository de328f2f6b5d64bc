/* Expert-parallel partition: which routed experts an expert-parallel rank owns.
 *
 * The rule is TensorRT-LLM's `_compute_ep_partition` (moe.md §2.6), so a k3 rank and a
 * TensorRT-LLM rank of the same (E, ep, r) hold the same experts: contiguous slots, the first
 * E % ep ranks own one expert more, and E < ep is rejected (no rank may own zero experts).
 * Load balancing (EPLB, redundant slots) is deliberately left out: the partition is static. */
#ifndef K3_EP_H
#define K3_EP_H

#include "base/base.h"

typedef struct k3_ep_part {
    int n_experts; /* E, global */
    int ep_size;   /* ranks */
    int rank;      /* this rank */
    int first;     /* first global expert id owned: r*base + min(r, rem) */
    int count;     /* experts owned: base + (r < rem) */
} k3_ep_part;

/* Fills *out for rank `rank` of `ep_size`. Errors (K3_ERR_ARG) name the bad parameter:
 * n_experts < 1, ep_size < 1, rank outside [0, ep_size), n_experts < ep_size. */
int k3_ep_partition(int n_experts, int ep_size, int rank, k3_ep_part *out, k3_error *err);

/* The inverse map: the rank owning expert id (split = rem*(base+1); below it id/(base+1),
 * else rem + (id-split)/base). Same argument checks, plus id in [0, n_experts). */
int k3_ep_owner(int n_experts, int ep_size, int id, int *rank, k3_error *err);

/* True when global expert id belongs to the part. */
static inline bool k3_ep_owns(const k3_ep_part *p, int id) {
    return id >= p->first && id < p->first + p->count;
}

#endif
