/* The whole MoE block on the GPU (k3-architecture.md §5.4; the device twin of
 * k3_moe_block_forward in src/moe/block.c): router GEMM, noaux_tc routing, latent
 * down-projection, routed experts (the grouped or fused backend of moe_run.cu), latent
 * RMSNorm, up-projection and the shared-expert MLP on the full-width input, all on one stream.
 *
 * Numerics follow the CPU block step by step so the two agree to fp32 rounding: the router
 * GEMM sums in double and rounds once (as k3_router_logits), so both sides route the same
 * tokens to the same experts; the other projections accumulate in fp32 (dense.cu); the
 * RMSNorm sums squares in double and rounds (v * inv) to float before the weight, as
 * block.c does; the shared output is added to the up-projection's float result.
 * What it leaves out: routers other than noaux_tc without group limits (K3 and DeepSeek-V3
 * with one group; anything else is K3_ERR_UNSUPPORTED at create), expert parallelism across
 * devices, and tensor-core GEMMs for the dense projections (see dense.cuh). */
#include "cuda/cuda_check.cuh"
#include "cuda/dense.cuh"
#include "cuda/k3_cuda.h"

extern "C" {
#include "base/base.h"
#include "formats/fp.h"
#include "moe/activation.h"
}

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct k3_cuda_block {
    int W, H, E, K, S, latent, gated;
    k3_act sact;
    float sa, sb, sl; /* shared activation parameters (limit +inf when absent) */
    float eps, scaling;
    int renorm;
    DenseMat gate, down, up, sg, su, sd;
    float *norm_w, *bias; /* device [H], [E] (bias NULL when the router has none) */
    k3_cuda_moe *moe;
    void *ws;
    size_t ws_bytes;
    float *logits, *z, *r, *g, *u;
};

/* ---- kernels -------------------------------------------------------------------------------- */

/* r = float(r * inv) * weight per token, inv = 1 / sqrt(mean(r^2) + eps) in double. */
__global__ void __launch_bounds__(256) k_rmsnorm(float *r, int L, const float *wgt, float eps) {
    __shared__ double red[8];
    float *v = r + (size_t)blockIdx.x * L;
    double ss = 0;
    for (int i = threadIdx.x; i < L; i += blockDim.x) ss += (double)v[i] * v[i];
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    double tot = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) tot += red[i];
    const double inv = 1.0 / sqrt(tot / L + (double)eps);
    for (int i = threadIdx.x; i < L; i += blockDim.x) v[i] = (float)(v[i] * inv) * wgt[i];
}

__device__ __forceinline__ float sig_(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float gelu_(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }

/* g = act(g, u) elementwise, the formulas of k3_act_f32 (moe/activation.c) in fp32. */
__global__ void k_shared_act(float *g, const float *u, size_t n, int act, float a, float b, float lim) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = g[i], y = u ? u[i] : 0.f, v;
        switch (act) {
        case K3_ACT_IDENTITY: v = x; break;
        case K3_ACT_GELU: v = gelu_(x); break;
        case K3_ACT_RELU: v = x > 0 ? x : 0.f; break;
        case K3_ACT_SILU: v = x * sig_(x); break;
        case K3_ACT_RELU2: v = x > 0 ? x * x : 0.f; break;
        case K3_ACT_SWIGLU: v = x * sig_(x) * y; break;
        case K3_ACT_GEGLU: v = gelu_(x) * y; break;
        case K3_ACT_SWIGLU_BIAS: {
            float gc = x < lim ? x : lim, uc = y < -lim ? -lim : (y > lim ? lim : y);
            v = gc * sig_(a * gc) * (uc + b);
            break;
        }
        case K3_ACT_SITU: v = a * tanhf(x / a) * sig_(x) * (b * tanhf(y / b)); break;
        default: v = __int_as_float(0x7fc00000);
        }
        g[i] = v;
    }
}

/* ---- create / free -------------------------------------------------------------------------- */

extern "C" void k3_cuda_block_free(k3_cuda_block *cb) {
    if (!cb) return;
    k3_dense_free(&cb->gate), k3_dense_free(&cb->down), k3_dense_free(&cb->up);
    k3_dense_free(&cb->sg), k3_dense_free(&cb->su), k3_dense_free(&cb->sd);
    if (cb->norm_w) cudaFree(cb->norm_w);
    if (cb->bias) cudaFree(cb->bias);
    if (cb->ws) cudaFree(cb->ws);
    k3_cuda_moe_free(cb->moe);
    free(cb);
}

static int upload_f32(const float *h, size_t n, float **d, k3_error *err) {
    K3_CUDA_TRY(err, cudaMalloc(d, n * sizeof(float)));
    K3_CUDA_TRY(err, cudaMemcpy(*d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return K3_OK;
}

static int check_router(const k3_router *r, k3_error *err) {
    if (r->fn != K3_ROUTE_NOAUX_TC)
        return k3_fail(err, K3_ERR_UNSUPPORTED, "router: the cuda block routes noaux_tc only (router fn %d)", (int)r->fn);
    if (r->n_group > 1 && r->topk_group < r->n_group)
        return k3_fail(err, K3_ERR_UNSUPPORTED,
                       "router: group-limited top-k (n_group %d, topk_group %d) is not implemented in the cuda block",
                       r->n_group, r->topk_group);
    if (r->n_experts > 4096 || r->top_k > K3_CUDA_MAX_TOPK)
        return k3_fail(err, K3_ERR_LIMIT, "router: %d experts, top-k %d: the routing kernel takes E <= 4096, k <= %d",
                       r->n_experts, r->top_k, K3_CUDA_MAX_TOPK);
    return K3_OK;
}

static int build(const k3_moe_block *b, k3_cuda_block *cb, k3_error *err) {
    int rc;
    const int W = b->model_width, H = b->experts.hidden, E = b->router.n_experts;
    cb->W = W, cb->H = H, cb->E = E, cb->K = b->router.top_k, cb->latent = b->latent;
    cb->renorm = b->router.renormalize, cb->scaling = b->router.routed_scaling_factor, cb->eps = b->norm_eps;
    if ((rc = k3_cuda_moe_create(&b->experts, &cb->moe, err))) return rc;
    if ((rc = k3_dense_upload(&b->router.gate, "router gate", E, W, &cb->gate, err))) return rc;
    if (b->router.correction_bias && (rc = upload_f32(b->router.correction_bias, (size_t)E, &cb->bias, err))) return rc;
    if (b->latent) {
        if ((rc = k3_dense_upload(&b->latent_down, "latent down-projection", H, W, &cb->down, err))) return rc;
        if ((rc = k3_dense_upload(&b->latent_up, "latent up-projection", W, H, &cb->up, err))) return rc;
    }
    if (b->latent && b->latent_norm) { /* none: latent_moe_use_norm false, r goes straight to up */
        float *nw = (float *)malloc((size_t)H * sizeof *nw);
        if (!nw) return k3_fail(err, K3_ERR_NOMEM, "latent norm weight [%d]", H);
        for (int i = 0; i < H; i++)
            nw[i] = b->latent_norm_fmt == K3_WFMT_BF16  ? k3_bf16_to_f32(((const uint16_t *)b->latent_norm)[i])
                    : b->latent_norm_fmt == K3_WFMT_F16 ? k3_f16_to_f32(((const uint16_t *)b->latent_norm)[i])
                                                        : ((const float *)b->latent_norm)[i];
        rc = upload_f32(nw, (size_t)H, &cb->norm_w, err);
        free(nw);
        if (rc) return rc;
    }
    if (b->n_shared > 0) {
        const int S = (int)b->shared_gate.rows;
        cb->S = S, cb->sact = b->shared_act.act, cb->gated = k3_act_is_gated(b->shared_act.act);
        cb->sa = b->shared_act.alpha ? b->shared_act.alpha[0] : 0.f;
        cb->sb = b->shared_act.beta ? b->shared_act.beta[0] : 0.f;
        cb->sl = b->shared_act.limit ? b->shared_act.limit[0] : INFINITY;
        if ((rc = k3_dense_upload(&b->shared_gate, "shared gate_proj", S, W, &cb->sg, err))) return rc;
        if (cb->gated && (rc = k3_dense_upload(&b->shared_up, "shared up_proj", S, W, &cb->su, err))) return rc;
        if ((rc = k3_dense_upload(&b->shared_down, "shared down_proj", W, S, &cb->sd, err))) return rc;
    }
    return K3_OK;
}

extern "C" int k3_cuda_block_create(const k3_moe_block *b, k3_cuda_block **out, k3_error *err) {
    *out = NULL;
    if (!b) return k3_fail(err, K3_ERR_ARG, "cuda block: NULL block");
    int rc = k3_moe_block_validate(b, K3_MODE_W4A16, err);
    if (rc) return rc;
    if ((rc = check_router(&b->router, err))) return rc;
    int n = 0;
    char name[160];
    if ((rc = k3_cuda_device_count(&n, name, sizeof name, err))) return rc;
    if (n == 0) return k3_fail(err, K3_ERR_DEVICE, "cuda block: no CUDA device (%s)", name);
    k3_cuda_block *cb = (k3_cuda_block *)calloc(1, sizeof *cb);
    if (!cb) return k3_fail(err, K3_ERR_NOMEM, "cuda block: handle");
    if ((rc = build(b, cb, err))) {
        k3_cuda_block_free(cb);
        return rc;
    }
    *out = cb;
    return K3_OK;
}

/* ---- run ------------------------------------------------------------------------------------ */

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

static int ensure_ws(k3_cuda_block *cb, int T, k3_error *err) {
    const size_t t = (size_t)T;
    size_t o_l = 0, o_z = o_l + al256(t * cb->E * 4), o_r = o_z + al256(t * cb->H * 4), o_g = o_r + al256(t * cb->H * 4),
           o_u = o_g + al256(t * cb->S * 4), need = o_u + al256(t * cb->S * 4);
    if (need > cb->ws_bytes) {
        if (cb->ws) cudaFree(cb->ws);
        cb->ws = NULL, cb->ws_bytes = 0;
        K3_CUDA_TRY(err, cudaMalloc(&cb->ws, need));
        cb->ws_bytes = need;
    }
    char *p = (char *)cb->ws;
    cb->logits = (float *)(p + o_l), cb->z = (float *)(p + o_z), cb->r = (float *)(p + o_r);
    cb->g = (float *)(p + o_g), cb->u = (float *)(p + o_u);
    return K3_OK;
}

extern "C" int k3_cuda_block_check(const k3_cuda_block *cb, k3_cuda_backend b, k3_act_mode mode, int T, k3_error *err) {
    if (!cb) return k3_fail(err, K3_ERR_ARG, "cuda block: no block");
    return k3_cuda_moe_check(cb->moe, b, mode, T, cb->K, err);
}

extern "C" int k3_cuda_block_top_k(const k3_cuda_block *cb) { return cb ? cb->K : 0; }

extern "C" int k3_cuda_block_run(k3_cuda_block *cb, k3_cuda_backend b, k3_act_mode mode, const float *d_x, int T,
                                 float *d_y, int32_t *d_ids, float *d_w, void *stream, k3_error *err) {
    int rc = k3_cuda_block_check(cb, b, mode, T, err);
    if (rc) return rc;
    if (T == 0) return K3_OK;
    if (!d_x || !d_y || !d_ids || !d_w) return k3_fail(err, K3_ERR_ARG, "cuda block: x, y, ids and w are required");
    if ((rc = k3_cuda_rows_aligned(err, "cuda block", d_x, d_y))) return rc;
    cudaStream_t st = (cudaStream_t)stream;
    if ((rc = ensure_ws(cb, T, err))) return rc;
    if ((rc = k3_dense_gemm(&cb->gate, d_x, T, cb->logits, 0, 1, st, err))) return rc;
    if ((rc = k3_cuda_route_noaux_tc(cb->logits, T, cb->E, cb->bias, cb->K, cb->renorm, cb->scaling, d_ids, d_w, st, err)))
        return rc;
    if (cb->latent) {
        if ((rc = k3_dense_gemm(&cb->down, d_x, T, cb->z, 0, 0, st, err))) return rc;
        if ((rc = k3_cuda_moe_run(cb->moe, b, mode, cb->z, T, d_ids, d_w, cb->K, cb->r, stream, err))) return rc;
        if (cb->norm_w) {
            k_rmsnorm<<<T, 256, 0, st>>>(cb->r, cb->H, cb->norm_w, cb->eps);
            K3_CUDA_TRY(err, cudaGetLastError());
        }
        if ((rc = k3_dense_gemm(&cb->up, cb->r, T, d_y, 0, 0, st, err))) return rc;
    } else if ((rc = k3_cuda_moe_run(cb->moe, b, mode, d_x, T, d_ids, d_w, cb->K, d_y, stream, err))) {
        return rc;
    }
    if (cb->S > 0) {
        if ((rc = k3_dense_gemm(&cb->sg, d_x, T, cb->g, 0, 0, st, err))) return rc;
        if (cb->gated && (rc = k3_dense_gemm(&cb->su, d_x, T, cb->u, 0, 0, st, err))) return rc;
        size_t n = (size_t)T * cb->S;
        int grid = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
        k_shared_act<<<grid, 256, 0, st>>>(cb->g, cb->gated ? cb->u : NULL, n, (int)cb->sact, cb->sa, cb->sb, cb->sl);
        K3_CUDA_TRY(err, cudaGetLastError());
        if ((rc = k3_dense_gemm(&cb->sd, cb->g, T, d_y, 1, 0, st, err))) return rc;
    }
    return K3_OK;
}

extern "C" int k3_cuda_block_run_host(k3_cuda_block *cb, k3_cuda_backend b, k3_act_mode mode, const float *x, int T,
                                      float *y, int32_t *ids, float *w, k3_error *err) {
    int rc = k3_cuda_block_check(cb, b, mode, T, err);
    if (rc) return rc;
    if (T == 0) return K3_OK;
    const int W = cb->W, K = cb->K;
    for (int64_t i = 0; i < (int64_t)T * W; i++)
        if (!isfinite(x[i]))
            return k3_fail(err, K3_ERR_NUMERIC, "cuda block: x[%lld][%lld] is %g", (long long)(i / W), (long long)(i % W),
                           (double)x[i]);
    const size_t nx = (size_t)T * W * 4, nk = (size_t)T * K * 4;
    char *buf = NULL;
    K3_CUDA_TRY(err, cudaMalloc(&buf, 2 * al256(nx) + 2 * al256(nk)));
    float *dx = (float *)buf, *dy = (float *)(buf + al256(nx));
    int32_t *di = (int32_t *)(buf + 2 * al256(nx));
    float *dw = (float *)(buf + 2 * al256(nx) + al256(nk));
    cudaError_t ce = cudaMemcpy(dx, x, nx, cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) rc = k3_cuda_fail(err, ce, "cudaMemcpy(x)", __FILE__, __LINE__);
    if (rc == K3_OK) rc = k3_cuda_block_run(cb, b, mode, dx, T, dy, di, dw, NULL, err);
    if (rc == K3_OK) {
        ce = cudaDeviceSynchronize();
        if (ce == cudaSuccess) ce = cudaMemcpy(y, dy, nx, cudaMemcpyDeviceToHost);
        if (ce == cudaSuccess && ids) ce = cudaMemcpy(ids, di, nk, cudaMemcpyDeviceToHost);
        if (ce == cudaSuccess && w) ce = cudaMemcpy(w, dw, nk, cudaMemcpyDeviceToHost);
        if (ce != cudaSuccess) rc = k3_cuda_fail(err, ce, "cuda block run / cudaMemcpy(y, ids, w)", __FILE__, __LINE__);
    }
    cudaFree(buf);
    return rc;
}
