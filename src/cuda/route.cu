/* noaux_tc routing on the GPU (moe.md §2.1, DeepSeek-V3 / Kimi K3 with n_group == 1): one
 * CTA per token in one launch. Scores and biased scores sit in shared memory; the top-k is
 * k rounds of a block arg-max (ties to the lower expert id), which for k = 16 of E = 896 is
 * a few microseconds and needs no sort. What it leaves out: group-limited top-k
 * (n_group > 1), which K3 does not use, and the router GEMM (the logits are an input). */
#include "cuda/cuda_check.cuh"
#include "cuda/k3_cuda.h"

extern "C" {
#include "base/base.h"
}

#include <math.h>

#define ROUTE_THREADS 256

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(ROUTE_THREADS)
    k_route(const float *logits, int E, const float *bias, int k, int renorm, float scaling, int32_t *ids, float *w) {
    extern __shared__ float sh[];
    float *s = sh, *b = sh + E;
    unsigned char *taken = (unsigned char *)(sh + 2 * E);
    __shared__ float rv[ROUTE_THREADS / 32];
    __shared__ int ri[ROUTE_THREADS / 32];
    __shared__ float picked[K3_CUDA_MAX_TOPK];
    const int t = blockIdx.x, tid = threadIdx.x;
    const float *lg = logits + (size_t)t * E;
    for (int e = tid; e < E; e += blockDim.x) {
        float v = 1.f / (1.f + expf(-lg[e]));
        s[e] = v;
        float bb = v + (bias ? bias[e] : 0.f);
        b[e] = isnan(bb) ? -INFINITY : bb;
        taken[e] = 0;
    }
    __syncthreads();
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = E; /* sentinel: any untaken expert beats it */
        for (int e = tid; e < E; e += blockDim.x)
            if (!taken[e] && better(b[e], e, bv, bi)) { bv = b[e]; bi = e; }
        for (int o = 16; o; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        if ((tid & 31) == 0) { rv[tid >> 5] = bv; ri[tid >> 5] = bi; }
        __syncthreads();
        if (tid == 0) {
            for (int i = 1; i < (int)(blockDim.x >> 5); i++)
                if (better(rv[i], ri[i], bv, bi)) { bv = rv[i]; bi = ri[i]; }
            ids[(size_t)t * k + j] = bi;
            picked[j] = s[bi];
            taken[bi] = 1;
        }
        __syncthreads();
    }
    if (tid == 0) {
        float sum = 0.f;
        for (int j = 0; j < k; j++) sum += picked[j];
        for (int j = 0; j < k; j++) {
            float v = renorm ? picked[j] / (sum + 1e-20f) : picked[j];
            w[(size_t)t * k + j] = v * scaling;
        }
    }
}

extern "C" int k3_cuda_route_noaux_tc(const float *d_logits, int T, int E, const float *d_bias, int k,
                                      int renormalize, float scaling, int32_t *d_ids, float *d_w, void *stream,
                                      k3_error *err) {
    if (T < 0) return k3_fail(err, K3_ERR_ARG, "route: T = %d tokens", T);
    if (E < 1 || E > 4096) return k3_fail(err, K3_ERR_LIMIT, "route: %d experts, the routing kernel takes 1..4096", E);
    if (k < 1 || k > K3_CUDA_MAX_TOPK || k > E)
        return k3_fail(err, K3_ERR_LIMIT, "route: top-k %d, the routing kernel takes 1..min(%d, E = %d)", k,
                       K3_CUDA_MAX_TOPK, E);
    if (!isfinite(scaling)) return k3_fail(err, K3_ERR_NUMERIC, "route: routed_scaling_factor %g", (double)scaling);
    if (T == 0) return K3_OK;
    if (!d_logits || !d_ids || !d_w)
        return k3_fail(err, K3_ERR_ARG, "route: logits, ids and w are required (bias may be NULL)");
    size_t sm = (size_t)2 * E * sizeof(float) + E;
    K3_CUDA_TRY(err, cudaFuncSetAttribute(k_route, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    k_route<<<T, ROUTE_THREADS, sm, (cudaStream_t)stream>>>(d_logits, E, d_bias, k, renormalize, scaling, d_ids, d_w);
    K3_CUDA_TRY(err, cudaGetLastError());
    return K3_OK;
}

extern "C" int k3_cuda_route_noaux_tc_host(const float *logits, int T, int E, const float *bias, int k,
                                           int renormalize, float scaling, int32_t *ids, float *w, k3_error *err) {
    int n = 0;
    char name[128];
    if (k3_cuda_device_count(&n, name, sizeof name, err)) return err->status;
    if (n == 0) return k3_fail(err, K3_ERR_DEVICE, "route: no CUDA device (%s)", name);
    if (T <= 0 || E <= 0) return k3_cuda_route_noaux_tc(NULL, T, E, NULL, k, renormalize, scaling, NULL, NULL, NULL, err);
    size_t nl = (size_t)T * E * 4, no = (size_t)T * k * 4;
    char *buf = NULL;
    K3_CUDA_TRY(err, cudaMalloc(&buf, nl + E * 4 + 2 * no + 1024));
    float *dl = (float *)buf, *db = (float *)(buf + ((nl + 255) & ~(size_t)255));
    int32_t *di = (int32_t *)((char *)db + ((E * 4 + 255) & ~255));
    float *dw = (float *)((char *)di + ((no + 255) & ~(size_t)255));
    int rc = K3_OK;
    cudaError_t ce = cudaMemcpy(dl, logits, nl, cudaMemcpyHostToDevice);
    if (ce == cudaSuccess && bias) ce = cudaMemcpy(db, bias, E * 4, cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) rc = k3_cuda_fail(err, ce, "cudaMemcpy(route inputs)", __FILE__, __LINE__);
    if (rc == K3_OK) rc = k3_cuda_route_noaux_tc(dl, T, E, bias ? db : NULL, k, renormalize, scaling, di, dw, NULL, err);
    if (rc == K3_OK) {
        ce = cudaMemcpy(ids, di, no, cudaMemcpyDeviceToHost);
        if (ce == cudaSuccess) ce = cudaMemcpy(w, dw, no, cudaMemcpyDeviceToHost);
        if (ce != cudaSuccess) rc = k3_cuda_fail(err, ce, "cudaMemcpy(route outputs)", __FILE__, __LINE__);
    }
    cudaFree(buf);
    return rc;
}
