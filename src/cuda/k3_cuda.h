/* The GPU boundary: the only header through which host code reaches CUDA. Entry points are
 * extern "C", take explicit streams where they launch work, and report failures through
 * k3_error with file:line, the failing statement and the device. The rest of k3 does not
 * know CUDA exists; in a build without nvcc, cuda_absent.c answers every call with
 * K3_ERR_DEVICE and a message saying the binary was built without CUDA.
 *
 * Routed experts on the GPU (issue 5): k3_cuda_moe_create uploads a k3_experts once,
 * re-ordering weights and scales into the kernels' fragment layout (the file layout in the
 * k3_qmat stays untouched); k3_cuda_moe_run computes the routed-expert operator of moe.h
 * with one of two backends:
 *   K3_CUDA_GROUPED  routing plumbing, grouped FC1 (+ fused activation), grouped FC2 and a
 *                    weighted finalize, five launches, any T;
 *   K3_CUDA_FUSED    the same stages in one persistent cooperative kernel, for decode-sized
 *                    batches only (limits below, enforced with K3_ERR_LIMIT, never a fallback).
 * Both accept NVFP4 and MXFP4 experts with H % 128 == 0 and I % 128 == 0. */
#ifndef K3_CUDA_H
#define K3_CUDA_H

#include "k3.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "moe/moe.h"

/* Number of usable CUDA devices (0 when the driver or device is absent: not an error).
 * Fills name (if non-NULL) with a description of device 0. */
int k3_cuda_device_count(int *count, char *name, size_t name_len, k3_error *err);

typedef enum k3_cuda_backend { K3_CUDA_GROUPED = 0, K3_CUDA_FUSED, K3_CUDA_BACKEND_COUNT } k3_cuda_backend;
const char *k3_cuda_backend_name(k3_cuda_backend b);

/* Limits of the fused backend: tokens per launch and T * top_k (the dispatch happens in one
 * CTA and every (expert, 4-token tile) is one work item of the persistent grid). */
#define K3_CUDA_FUSED_MAX_TOKENS 64
#define K3_CUDA_FUSED_MAX_SLOTS 2048
/* Limits of both backends: top-k per token and local experts (the dispatch histogram lives
 * in shared memory). */
#define K3_CUDA_MAX_TOPK 64
#define K3_CUDA_MAX_LOCAL_EXPERTS 4096

/* Routed experts resident on device 0: weights in kernel layout, per-expert epilogue factors
 * and activation parameters, and a workspace that grows with the largest T seen. Not thread
 * safe: one stream at a time per handle. */
typedef struct k3_cuda_moe k3_cuda_moe;

/* Validates and uploads ex. Errors: K3_ERR_DEVICE (no GPU / CUDA failure), K3_ERR_SHAPE
 * (H or I not multiples of 128, matrices of the wrong shape), K3_ERR_UNSUPPORTED (formats
 * other than NVFP4 or MXFP4, mixed formats, an MXFP4 matrix whose non-zero blocks span
 * more than 18 binades, which the exact fp16 decode cannot hold), K3_ERR_NUMERIC (NaN
 * scales, non-positive tensor scales), K3_ERR_ARG (activation parameters missing). */
int k3_cuda_moe_create(const k3_experts *ex, k3_cuda_moe **out, k3_error *err);
void k3_cuda_moe_free(k3_cuda_moe *m);

/* Whether backend b can run T tokens with top-k k on m; K3_OK or K3_ERR_LIMIT/ARG with the
 * reason in err. k3_cuda_moe_run calls it first. */
int k3_cuda_moe_check(const k3_cuda_moe *m, k3_cuda_backend b, k3_act_mode mode, int T, int k,
                      k3_error *err);

/* The routed-expert operator of moe.h (y[t] = sum_k w[t,k] expert_ids[t,k](x[t]); non-local
 * ids contribute nothing) on device pointers: d_x float [T, H] and d_y float [T, H], both
 * 16-byte aligned (else K3_ERR_ARG), d_ids int32 [T, k] (global ids, assumed valid: the
 * routing kernel produces them; out-of-range ids are treated as non-local, never read out of
 * bounds), d_w float [T, k]; d_y is fully overwritten. Asynchronous on stream (a
 * cudaStream_t, NULL = default stream).
 * Modes: K3_MODE_W4A16 (fp32 activations carried as two fp16 terms: exact to ~2^-22 per
 * element), K3_MODE_W4A16_BF16 (x and act(h) rounded to bf16, one fp16 term: half the
 * tensor-core work and activation traffic of w4a16 in the grouped backend) and K3_MODE_W4A4
 * (NVFP4 experts only; activations quantized to NVFP4 per 16 with g1 = 1/max w1.input_scale
 * and g2 = 1/max w2.input_scale, TensorRT-LLM's rule; one term as well). */
int k3_cuda_moe_run(k3_cuda_moe *m, k3_cuda_backend b, k3_act_mode mode, const float *d_x, int T,
                    const int32_t *d_ids, const float *d_w, int k, float *d_y, void *stream,
                    k3_error *err);

/* The grouped backend's GEMM path: -1 always mma.sync tiles, 0 automatic, 32 always the sm_90a
 * wgmma tiles of 32 tokens, 48 / 80 / 128 / 160 always the warp-specialized sm_90a wgmma tiles of
 * that width (an expert's tokens split evenly into items of at most that many)
 * (K3_ERR_UNSUPPORTED where the binary or the device has no sm_90a kernels; K3_ERR_ARG for other
 * values). All paths compute the same contract; tests and benchmarks pin one. */
int k3_cuda_moe_set_gemm_path(k3_cuda_moe *m, int path, k3_error *err);

/* The grouped mma.sync FC2 grid's order: -1 work items fast over the whole grid, 0 automatic
 * (bands of work items where FC2's token rows exceed a third of the L2 cache), 1 always bands
 * (K3_ERR_ARG for other values). Both orders compute the same result; tests pin each. */
int k3_cuda_moe_set_fc2_bands(k3_cuda_moe *m, int bands, k3_error *err);

/* The same on host arrays (copies in, runs, copies out, synchronizes). Validates every id
 * against [0, n_experts) first (K3_ERR_ARG). */
int k3_cuda_moe_run_host(k3_cuda_moe *m, k3_cuda_backend b, k3_act_mode mode, const float *x,
                         int T, const int32_t *ids, const float *w, int k, float *y,
                         k3_error *err);

/* noaux_tc routing (DeepSeek-V3 / Kimi K3, n_group == 1) in one launch, one CTA per token:
 * s = sigmoid(logits), top-k of s + bias (ties to the lower expert id), w = s[sel] /
 * (sum + 1e-20) if renormalize, times scaling. Device pointers: d_logits float [T, E],
 * d_bias float [E] or NULL, d_ids int32 [T, k], d_w float [T, k]. E <= 4096, k <= 64. */
int k3_cuda_route_noaux_tc(const float *d_logits, int T, int E, const float *d_bias, int k,
                           int renormalize, float scaling, int32_t *d_ids, float *d_w,
                           void *stream, k3_error *err);
/* The same on host arrays. */
int k3_cuda_route_noaux_tc_host(const float *logits, int T, int E, const float *bias, int k,
                                int renormalize, float scaling, int32_t *ids, float *w,
                                k3_error *err);

/* Benchmark of one layer with all experts resident on device 0 (what `k3 bench moe
 * --backend cuda|cuda-fused` calls). Expert bytes are random but valid (finite scales),
 * generated on the device in kernel layout; routing is uniform random top-k (splitmix64,
 * seed, the same draw as tools/torch_grouped_mm_peer.py). Times: `reps` launches after
 * `warmup` (continued until they span 50 ms when warmup > 0), issued back to back in 5
 * batches (host enqueue overlapped, as in a model's stream), CUDA events around each batch;
 * the median of the 5 per-launch means. */
typedef struct k3_cuda_bench_opts {
    int n_experts, hidden, inter, top_k;
    k3_wfmt fmt;      /* NVFP4 or MXFP4 */
    k3_act act;
    k3_act_mode mode;
    k3_cuda_backend backend;
    int warmup, reps;
    uint64_t seed;
    int tokens_per_tile; /* lab sweeps: 4, 8 or 16 forces the grouped tile width; 0 = automatic */
    int k_splits;        /* lab sweeps: 1 or 2 K halves per tile in the mma.sync kernels (grouped and
                            fused); 0 = automatic */
    int wgmma;           /* lab sweeps: -1 never, 0 automatic, 32 forces the sm_90a wgmma path of
                            32-token tiles (an error where it cannot run) */
    int wgp;             /* lab sweeps: 48, 80, 128 or 160 forces the warp-specialized sm_90a wgmma path
                            with that tile width (an error where it cannot run); 0 = automatic */
    int cta_warps;       /* lab sweeps: 1, 2, 4 or 8 warps per K part in the grouped mma.sync CTAs (8
                            only with one K part: an error at T*k <= 64 unless k_splits = 1); 0 = automatic */
} k3_cuda_bench_opts;

typedef struct k3_cuda_bench_result {
    double us_median, us_min, us_max;
    int touched;             /* distinct experts the routing selected */
    double expert_bytes;     /* bytes of the touched experts (weights + scales) */
    double flops;            /* 2 * T * k * (3 * H * I) for gated activations */
    /* from one extra run: prep (dispatch + x), fc1, hconv, fc2, finalize, in microseconds;
     * grouped: events between the launches; fused: block 0's %globaltimer after each grid
     * barrier (a stage includes the barrier that ends it, finalize is block 0's share) */
    double stage_us[5];
} k3_cuda_bench_result;

/* Prepares the resident layer once (reuse across calls with the same shape/format/act). */
typedef struct k3_cuda_bench k3_cuda_bench;
int k3_cuda_bench_open(const k3_cuda_bench_opts *o, k3_cuda_bench **out, k3_error *err);
int k3_cuda_bench_run(k3_cuda_bench *b, k3_cuda_backend backend, int T, k3_cuda_bench_result *r,
                      k3_error *err);
void k3_cuda_bench_close(k3_cuda_bench *b);
/* Device-to-device copy bandwidth over `bytes` (counting read + write), median of reps. */
int k3_cuda_copy_bandwidth(size_t bytes, int reps, double *bytes_per_s, k3_error *err);
/* The device's bf16 tensor-core rate (FLOP/s) from back-to-back wgmma with no memory
 * traffic, best of a few runs: the denominator of FLOP floors. sm_90a builds and devices only
 * (K3_ERR_UNSUPPORTED elsewhere). */
int k3_cuda_bf16_peak(double *flops_per_s, k3_error *err);

/* ---- the whole MoE block on the GPU (block.cu) ------------------------------------------- */

/* A k3_moe_block resident on device 0: router gate (F32/BF16), correction bias, latent
 * down/up projections and norm weight, shared MLP (dense weights F32, BF16, F16, FP8_BLOCK,
 * NVFP4 or MXFP4, kept in file layout) and the routed experts (k3_cuda_moe_create). The
 * forward is k3_moe_block_forward's on the device: router GEMM (fp32 inputs, double sums
 * rounded once), noaux_tc routing, latent down-projection, routed experts with the chosen
 * backend, latent RMSNorm, up-projection, plus the shared MLP on the full-width x. Not
 * thread safe: one stream at a time per handle. */
typedef struct k3_cuda_block k3_cuda_block;

/* Validates (k3_moe_block_validate) and uploads b. Errors: those of k3_cuda_moe_create;
 * K3_ERR_UNSUPPORTED for a router other than noaux_tc without group limits, or a dense
 * format outside the list above; K3_ERR_SHAPE for a dense matrix whose rows are not whole
 * 16-byte chunks (cols a multiple of 4 F32, 8 BF16/F16, 16 FP8, 32 NVFP4/MXFP4). */
int k3_cuda_block_create(const k3_moe_block *b, k3_cuda_block **out, k3_error *err);
void k3_cuda_block_free(k3_cuda_block *cb);
/* Router top-k of the uploaded block (0 for NULL). */
int k3_cuda_block_top_k(const k3_cuda_block *cb);

/* Whether backend b can run the block's experts on T tokens (k3_cuda_moe_check with the
 * router's top-k): K3_OK or the reason (K3_ERR_LIMIT beyond the fused limits). */
int k3_cuda_block_check(const k3_cuda_block *cb, k3_cuda_backend b, k3_act_mode mode, int T,
                        k3_error *err);

/* The block on device arrays: d_x float [T, model_width] (16-byte aligned), d_y float
 * [T, model_width] fully overwritten, d_ids int32 [T, top_k] and d_w float [T, top_k]
 * receive the routing. Asynchronous on stream (NULL = default stream). */
int k3_cuda_block_run(k3_cuda_block *cb, k3_cuda_backend b, k3_act_mode mode, const float *d_x,
                      int T, float *d_y, int32_t *d_ids, float *d_w, void *stream, k3_error *err);

/* The same on host arrays (copies in, runs, synchronizes, copies out); ids and w may be NULL
 * (not wanted). A non-finite x is K3_ERR_NUMERIC naming the element, as on the CPU. */
int k3_cuda_block_run_host(k3_cuda_block *cb, k3_cuda_backend b, k3_act_mode mode, const float *x,
                           int T, float *y, int32_t *ids, float *w, k3_error *err);

/* Mean microseconds of one k3_cuda_block_run on T random device-resident tokens of the
 * given model width, over reps launches back to back after 3 warm-up runs (block_bench.cu). */
int k3_cuda_block_time(k3_cuda_block *cb, k3_cuda_backend b, k3_act_mode mode, int width, int T,
                       int reps, uint64_t seed, double *us, k3_error *err);

#ifdef __cplusplus
}
#endif
#endif
