/* Expert-parallel partition (moe.md §2.6); see ep.h. Integer arithmetic only, so every
 * rank computes the same answer with no communication. */
#include "moe/ep.h"

static int check(int n_experts, int ep_size, k3_error *err) {
    if (n_experts < 1) return k3_fail(err, K3_ERR_ARG, "ep: n_experts: expected >= 1, found %d", n_experts);
    if (ep_size < 1) return k3_fail(err, K3_ERR_ARG, "ep: ep_size: expected >= 1, found %d", ep_size);
    if (n_experts < ep_size)
        return k3_fail(err, K3_ERR_ARG,
                       "ep: ep_size %d exceeds n_experts %d (a rank would own no expert)", ep_size,
                       n_experts);
    return K3_OK;
}

int k3_ep_partition(int n_experts, int ep_size, int rank, k3_ep_part *out, k3_error *err) {
    int rc = check(n_experts, ep_size, err);
    if (rc) return rc;
    if (rank < 0 || rank >= ep_size)
        return k3_fail(err, K3_ERR_ARG, "ep: rank: expected in [0, %d), found %d", ep_size, rank);
    int base = n_experts / ep_size, rem = n_experts % ep_size;
    out->n_experts = n_experts;
    out->ep_size = ep_size;
    out->rank = rank;
    out->first = rank * base + (rank < rem ? rank : rem);
    out->count = base + (rank < rem ? 1 : 0);
    return K3_OK;
}

int k3_ep_owner(int n_experts, int ep_size, int id, int *rank, k3_error *err) {
    int rc = check(n_experts, ep_size, err);
    if (rc) return rc;
    if (id < 0 || id >= n_experts)
        return k3_fail(err, K3_ERR_ARG, "ep: expert id: expected in [0, %d), found %d", n_experts, id);
    int base = n_experts / ep_size, rem = n_experts % ep_size;
    int split = rem * (base + 1);
    *rank = id < split ? id / (base + 1) : rem + (id - split) / base;
    return K3_OK;
}
