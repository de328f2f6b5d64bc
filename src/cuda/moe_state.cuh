/* The device-resident MoE handle shared by moe_layout.cu (upload), moe_run.cu (launches)
 * and moe_bench.cu (random resident layers). Internal to src/cuda. */
#ifndef K3_MOE_STATE_CUH
#define K3_MOE_STATE_CUH

#include "cuda/moe_dev.cuh"
#include <cuda_runtime.h>

struct k3_cuda_moe {
    MoeDev d;       /* device views, by value into kernels */
    int fmt;        /* FMT_NV or FMT_MX */
    k3_act act;
    int device;
    void *mem;      /* one allocation: weights, scales, factors, activation params */
    size_t mem_bytes;
    /* workspace, grown on demand */
    void *ws;
    size_t ws_bytes;
    int ws_slots, ws_tokens; /* capacity it was carved for */
    MoeRun r;
    unsigned long long *bar; /* fused grid barrier counter (inside mem) */
    unsigned long long bar_epoch;
    /* benchmark hooks (moe_bench.cu): tokens-per-tile override (0 = the heuristic) and, when
     * non-NULL, 6 events recorded around the five grouped launches for a stage breakdown */
    int force_nt;
    int force_ks; /* 1 or 2 K halves per tile in the mma.sync FC kernels and the fused kernel; 0 = automatic */
    int force_wpc; /* grouped mma.sync warps per K part: 1, 2, 4 or 8 (8: one K part only); 0 = fc_wpc's rule */
    int force_wg; /* wgmma path: -1 never, 0 automatic, 32 = always (32-token tiles) */
    int force_wp; /* warp-specialized wgmma path (moe_prefill_ws.cu): 0 = not forced, else its tile width */
    int force_bands; /* FC2 grid order (k3_cuda_moe_set_fc2_bands): -1 never bands, 0 automatic, 1 always */
    cudaEvent_t *stage_ev;
    int fused_stamps; /* the fused kernel writes its phase stamps (MoeRun.stamps) into the workspace */
    /* launch configuration, computed on first use (the act and format of a handle are fixed) */
    int prep_attr_set;
    int fused_grid[2]; /* [K split - 1] */
    int wg_ok; /* the binary has the sm_90a wgmma kernels and the device runs them (moe_wg_probe) */
    int n_sm;  /* multiprocessors of the device: the persistent grids' size */
    int l2_bytes; /* L2 cache of the device: above a third of it FC2's grid runs in bands (moe_run.cu) */
};

/* Bytes of one expert in kernel layout (weights + scales), the bytes a kernel streams. */
size_t k3_cuda_moe_expert_bytes(const k3_cuda_moe *m);

/* Allocates the device memory of m (weights uninitialized) for the given shape; used by the
 * upload and by the benchmark's random layer. */
int k3_cuda_moe_alloc(k3_cuda_moe *m, int n_experts, int first_local, int n_local, int H, int I,
                      int fmt, k3_act act, bool with_params, k3_error *err);

/* The sm_90a prefill GEMMs (moe_prefill.cu). moe_wg_probe: whether this binary's kernels
 * carry wgmma for the current device. moe_wg_launch: FC1 (fc2 = 0, activation in the epilogue,
 * h and |h| max as the mma.sync path) or FC2 (unweighted rows per slot) over the work items,
 * tn tokens per item, xq / hq in the plain layout (MoeRun.plain). */
int moe_wg_probe(int *ok, k3_error *err);
int moe_wg_launch(const k3_cuda_moe *m, const MoeDev &d, const MoeRun &r, int fc2, int tn, int wmax,
                  cudaStream_t st, k3_error *err);

/* The warp-specialized sm_90a GEMMs (moe_prefill_ws.cu): the same FC1 / FC2 contract over work
 * items of at most tn tokens split evenly (MoeRun.split), one persistent CTA per SM.
 * moe_wp_widths: its tile widths, what the automatic choice (pick_wp, one measured cost per width)
 * picks from; moe_wp_widths_text: the same for messages; moe_wp_width_ok: whether tn is one. */
#define MOE_WP_NW 4
extern const int moe_wp_widths[MOE_WP_NW];
extern const char moe_wp_widths_text[];
int moe_wp_width_ok(int tn);
int moe_wp_launch(const k3_cuda_moe *m, const MoeDev &d, const MoeRun &r, int fc2, int tn, cudaStream_t st,
                  k3_error *err);

#endif
