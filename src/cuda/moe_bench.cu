/* Benchmark entry of the GPU MoE backends (`k3 bench moe --backend cuda|cuda-fused` and
 * tests/tools/cuda_moe_bench): a whole layer resident on the device with random but valid
 * expert bytes written straight into kernel layout (16.6 GB for K3 never crosses PCIe),
 * uniform random routing drawn with splitmix64 exactly as tools/torch_grouped_mm_peer.py
 * draws it, and medians of CUDA-event times. Timing only: correctness lives in
 * tests/test_cuda_moe.c, which goes through the real upload path. */
#include "cuda/cuda_check.cuh"
#include "cuda/k3_cuda.h"
#include "cuda/moe_state.cuh"

extern "C" {
#include "base/base.h"
}

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct k3_cuda_bench {
    k3_cuda_bench_opts o;
    k3_cuda_moe m;
    float *dx, *dw, *dy;
    int32_t *di;
    int cap_T;
};

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}

__global__ void k_fill_bytes(uint32_t *p, size_t n_words, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_words; i += (size_t)gridDim.x * blockDim.x)
        p[i] = hash32(i, seed);
}

/* Scale bytes: E4M3 values 2^-3..2^3 (NVFP4) or the re-based powers of two (MXFP4). */
__global__ void k_fill_scales(uint8_t *p, size_t n, uint32_t seed, int mx) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = hash32(i, seed);
        p[i] = mx ? (uint8_t)((4 + (h % 7)) << 3) : (uint8_t)(0x20 + (h % 0x30));
    }
}

__global__ void k_fill_f32(float *p, size_t n, float v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

extern "C" int k3_cuda_bench_open(const k3_cuda_bench_opts *o, k3_cuda_bench **out, k3_error *err) {
    *out = NULL;
    int n = 0;
    char name[256];
    if (k3_cuda_device_count(&n, name, sizeof name, err)) return err->status;
    if (n == 0) return k3_fail(err, K3_ERR_DEVICE, "cuda bench: no CUDA device (%s)", name);
    if (o->fmt != K3_WFMT_NVFP4 && o->fmt != K3_WFMT_MXFP4)
        return k3_fail(err, K3_ERR_UNSUPPORTED, "cuda bench: format must be NVFP4 or MXFP4");
    if (o->hidden % 128 || o->inter % 128 || o->hidden <= 0 || o->inter <= 0)
        return k3_fail(err, K3_ERR_SHAPE, "cuda bench: hidden %d and inter %d must be multiples of 128", o->hidden, o->inter);
    if (o->n_experts <= 0 || o->n_experts > K3_CUDA_MAX_LOCAL_EXPERTS || o->top_k < 1 || o->top_k > o->n_experts)
        return k3_fail(err, K3_ERR_ARG, "cuda bench: %d experts, top-k %d", o->n_experts, o->top_k);
    if (o->act <= K3_ACT_INVALID || o->act >= K3_ACT_COUNT) return k3_fail(err, K3_ERR_ARG, "cuda bench: activation %d", (int)o->act);
    k3_cuda_bench *b = (k3_cuda_bench *)calloc(1, sizeof *b);
    if (!b) return k3_fail(err, K3_ERR_NOMEM, "cuda bench");
    b->o = *o;
    /* an mma.sync fragment holds 4 tokens with two fp16 terms (w4a16), 8 with one */
    const int per_frag = o->mode == K3_MODE_W4A16 ? 4 : 8, nt = o->tokens_per_tile / per_frag;
    if (o->tokens_per_tile != 0 && (o->tokens_per_tile % per_frag || (nt != 1 && nt != 2 && nt != 4))) {
        free(b);
        return k3_fail(err, K3_ERR_ARG, "cuda bench: tokens_per_tile %d (expected 0 or %d, %d, %d in mode %s)",
                       o->tokens_per_tile, per_frag, 2 * per_frag, 4 * per_frag, k3_act_mode_name(o->mode));
    }
    b->m.force_nt = nt;
    if (o->k_splits < 0 || o->k_splits > 2) {
        free(b);
        return k3_fail(err, K3_ERR_ARG, "cuda bench: k_splits %d (expected 0, 1 or 2)", o->k_splits);
    }
    b->m.force_ks = o->k_splits;
    if (o->wgmma < -1 || (o->wgmma > 0 && o->wgmma != 32)) {
        free(b);
        return k3_fail(err, K3_ERR_ARG, "cuda bench: wgmma %d (expected -1, 0 or 32)", o->wgmma);
    }
    b->m.force_wg = o->wgmma;
    if (o->wgp != 0 && !moe_wp_width_ok(o->wgp)) {
        free(b);
        return k3_fail(err, K3_ERR_ARG, "cuda bench: wgp %d (expected 0, %s)", o->wgp, moe_wp_widths_text);
    }
    b->m.force_wp = o->wgp;
    if (o->cta_warps != 0 && o->cta_warps != 1 && o->cta_warps != 2 && o->cta_warps != 4 && o->cta_warps != 8) {
        free(b);
        return k3_fail(err, K3_ERR_ARG, "cuda bench: cta_warps %d (expected 0, 1, 2, 4 or 8)", o->cta_warps);
    }
    b->m.force_wpc = o->cta_warps;
    const int mx = o->fmt == K3_WFMT_MXFP4;
    if (k3_cuda_moe_alloc(&b->m, o->n_experts, 0, o->n_experts, o->hidden, o->inter, mx ? FMT_MX : FMT_NV, o->act, true,
                          err)) {
        k3_cuda_bench_close(b);
        return err->status;
    }
    if ((o->wgmma > 0 || o->wgp > 0) && !b->m.wg_ok) {
        k3_cuda_bench_close(b);
        return k3_fail(err, K3_ERR_UNSUPPORTED, "cuda bench: wgmma %d / wgp %d asked, but this binary or device has no sm_90a kernels",
                       o->wgmma, o->wgp);
    }
    MoeDev *d = &b->m.d;
    const int SB = mx ? UNIT_S_MX : UNIT_S_NV;
    size_t u1 = (size_t)o->n_experts * d->m1 * d->nk1, u2 = (size_t)o->n_experts * d->m2 * d->nk2;
    k_fill_bytes<<<1024, 256>>>((uint32_t *)d->w1, u1 * UNIT_W / 4, 1);
    k_fill_bytes<<<1024, 256>>>((uint32_t *)d->w2, u2 * UNIT_W / 4, 2);
    k_fill_scales<<<1024, 256>>>((uint8_t *)d->s1, u1 * SB, 3, mx);
    k_fill_scales<<<1024, 256>>>((uint8_t *)d->s2, u2 * SB, 4, mx);
    k_fill_f32<<<64, 256>>>((float *)d->f1, (size_t)o->n_experts * 3, 1.0f / 64);
    k_fill_f32<<<64, 256>>>((float *)d->alpha, (size_t)o->n_experts, 4.0f);
    k_fill_f32<<<64, 256>>>((float *)d->beta, (size_t)o->n_experts, 25.0f);
    k_fill_f32<<<64, 256>>>((float *)d->limit, (size_t)o->n_experts, INFINITY);
    d->g1 = d->g2 = 1.0f;
    cudaError_t ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess) {
        k3_cuda_bench_close(b);
        return k3_cuda_fail(err, ce, "cuda bench: filling the resident layer", __FILE__, __LINE__);
    }
    *out = b;
    return K3_OK;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

extern "C" int k3_cuda_bench_run(k3_cuda_bench *b, k3_cuda_backend backend, int T, k3_cuda_bench_result *res,
                                 k3_error *err) {
    memset(res, 0, sizeof *res);
    const k3_cuda_bench_opts *o = &b->o;
    const int k = o->top_k, E = o->n_experts, H = o->hidden;
    if (k3_cuda_moe_check(&b->m, backend, o->mode, T, k, err)) return err->status;
    if (T <= 0) return k3_fail(err, K3_ERR_ARG, "cuda bench: T = %d", T);
    /* routing: per token k distinct experts, splitmix64 from the seed (the peer's draw) */
    int32_t *ids = (int32_t *)malloc((size_t)T * k * 4);
    float *w = (float *)malloc((size_t)T * k * 4), *x = (float *)malloc((size_t)T * H * 4);
    unsigned char *seen = (unsigned char *)calloc(E, 1);
    if (!ids || !w || !x || !seen) {
        free(ids), free(w), free(x), free(seen);
        return k3_fail(err, K3_ERR_NOMEM, "cuda bench: routing for T = %d", T);
    }
    uint64_t st = o->seed;
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < k; j++) {
            int e;
            bool dup;
            do {
                e = (int)(splitmix64(&st) % (uint64_t)E);
                dup = false;
                for (int i = 0; i < j; i++) dup |= ids[(size_t)t * k + i] == e;
            } while (dup);
            ids[(size_t)t * k + j] = e;
            w[(size_t)t * k + j] = (float)((splitmix64(&st) >> 11) * 0x1.0p-53);
            seen[e] = 1;
        }
    }
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = (float)((splitmix64(&st) >> 11) * 0x1.0p-53 * 2 - 1);
    int touched = 0;
    for (int e = 0; e < E; e++) touched += seen[e];
    res->touched = touched;
    res->expert_bytes = (double)touched * (double)k3_cuda_moe_expert_bytes(&b->m);
    res->flops = 2.0 * T * k * ((double)b->m.d.m1 * 16 * H + (double)H * o->inter);
    int rc = K3_OK;
    cudaError_t ce = cudaSuccess;
    if (T > b->cap_T) {
        cudaFree(b->dx);
        b->dx = NULL;
        b->cap_T = 0;
        size_t nx = ((size_t)T * H * 4 + 255) & ~(size_t)255, ni = ((size_t)T * k * 4 + 255) & ~(size_t)255;
        ce = cudaMalloc(&b->dx, 2 * nx + 2 * ni);
        if (ce == cudaSuccess) {
            b->dy = (float *)((char *)b->dx + nx);
            b->di = (int32_t *)((char *)b->dx + 2 * nx);
            b->dw = (float *)((char *)b->dx + 2 * nx + ni);
            b->cap_T = T;
        }
    }
    if (ce == cudaSuccess) ce = cudaMemcpy(b->dx, x, (size_t)T * H * 4, cudaMemcpyHostToDevice);
    if (ce == cudaSuccess) ce = cudaMemcpy(b->di, ids, (size_t)T * k * 4, cudaMemcpyHostToDevice);
    if (ce == cudaSuccess) ce = cudaMemcpy(b->dw, w, (size_t)T * k * 4, cudaMemcpyHostToDevice);
    free(ids), free(w), free(x), free(seen);
    if (ce != cudaSuccess) return k3_cuda_fail(err, ce, "cuda bench: inputs", __FILE__, __LINE__);
    /* Batches of back-to-back launches, as a model's stream issues them (the host enqueue of
     * the next run overlaps the current one); per-run mean of each batch, median of 5. */
    const int reps = o->reps > 0 ? o->reps : 20, warm = o->warmup >= 0 ? o->warmup : 3;
    const int nb = 5, per = reps / nb > 0 ? reps / nb : 1;
    double *ts = (double *)calloc(nb, sizeof(double));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    /* Warm-up: `warm` runs, continued until they span 50 ms. After a tensor-heavy run (the bf16
     * peak probe, a prefill size) the GPU sits under its power cap for tens of ms. That once
     * made a first timed T = 1 row 25% slow (docs/BENCHMARKS.md, eighteenth session). */
    cudaEventRecord(e0, 0);
    float warm_ms = 0.f;
    for (int i = 0; rc == K3_OK && (i < warm || (warm > 0 && warm_ms < 50.f)); i++) {
        rc = k3_cuda_moe_run(&b->m, backend, o->mode, b->dx, T, b->di, b->dw, k, b->dy, NULL, err);
        if (rc == K3_OK && warm > 0 && i + 1 >= warm &&
            (cudaEventRecord(e1, 0) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
             cudaEventElapsedTime(&warm_ms, e0, e1) != cudaSuccess))
            break; /* the synchronize below reports the error */
    }
    if (rc == K3_OK && (ce = cudaDeviceSynchronize()) != cudaSuccess)
        rc = k3_cuda_fail(err, ce, "cuda bench: warm-up", __FILE__, __LINE__);
    for (int i = 0; i < nb && rc == K3_OK; i++) {
        cudaEventRecord(e0, 0);
        for (int j = 0; j < per && rc == K3_OK; j++)
            rc = k3_cuda_moe_run(&b->m, backend, o->mode, b->dx, T, b->di, b->dw, k, b->dy, NULL, err);
        cudaEventRecord(e1, 0);
        ce = cudaEventSynchronize(e1);
        if (rc == K3_OK && ce != cudaSuccess) rc = k3_cuda_fail(err, ce, "cuda bench: run", __FILE__, __LINE__);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        ts[i] = ms * 1e3 / per;
    }
    if (rc == K3_OK && backend == K3_CUDA_GROUPED) {
        cudaEvent_t ev[6];
        for (int i = 0; i < 6; i++) cudaEventCreate(&ev[i]);
        b->m.stage_ev = ev;
        rc = k3_cuda_moe_run(&b->m, backend, o->mode, b->dx, T, b->di, b->dw, k, b->dy, NULL, err);
        b->m.stage_ev = NULL;
        ce = cudaEventSynchronize(ev[5]);
        if (rc == K3_OK && ce != cudaSuccess) rc = k3_cuda_fail(err, ce, "cuda bench: breakdown", __FILE__, __LINE__);
        for (int i = 0; i < 5 && rc == K3_OK; i++) {
            float ms = 0;
            cudaEventElapsedTime(&ms, ev[i], ev[i + 1]);
            res->stage_us[i] = ms * 1e3;
        }
        for (int i = 0; i < 6; i++) cudaEventDestroy(ev[i]);
    }
    if (rc == K3_OK && backend == K3_CUDA_FUSED) {
        unsigned long long st[6] = {0};
        b->m.fused_stamps = 1;
        rc = k3_cuda_moe_run(&b->m, backend, o->mode, b->dx, T, b->di, b->dw, k, b->dy, NULL, err);
        b->m.fused_stamps = 0;
        if (rc == K3_OK && (ce = cudaMemcpy(st, fused_stamps_at(b->m.r), sizeof st, cudaMemcpyDeviceToHost)) != cudaSuccess)
            rc = k3_cuda_fail(err, ce, "cuda bench: fused stamps", __FILE__, __LINE__);
        for (int i = 0; i < 5 && rc == K3_OK; i++) res->stage_us[i] = (double)(st[i + 1] - st[i]) * 1e-3;
    }
    if (rc == K3_OK) {
        qsort(ts, nb, sizeof(double), cmp_d);
        res->us_median = ts[nb / 2];
        res->us_min = ts[0];
        res->us_max = ts[nb - 1];
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    free(ts);
    return rc;
}

extern "C" void k3_cuda_bench_close(k3_cuda_bench *b) {
    if (!b) return;
    cudaFree(b->m.mem);
    cudaFree(b->m.ws);
    cudaFree(b->dx);
    free(b);
}

extern "C" int k3_cuda_copy_bandwidth(size_t bytes, int reps, double *bytes_per_s, k3_error *err) {
    *bytes_per_s = 0;
    int ndev = 0;
    char name[256];
    if (k3_cuda_device_count(&ndev, name, sizeof name, err)) return err->status;
    if (ndev == 0) return k3_fail(err, K3_ERR_DEVICE, "copy bandwidth: no CUDA device (%s)", name);
    void *a = NULL, *c = NULL;
    K3_CUDA_TRY(err, cudaMalloc(&a, bytes));
    cudaError_t ce = cudaMalloc(&c, bytes);
    if (ce != cudaSuccess) {
        cudaFree(a);
        return k3_cuda_fail(err, ce, "cudaMalloc(copy bandwidth)", __FILE__, __LINE__);
    }
    cudaMemset(a, 1, bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    double *ts = (double *)calloc(reps + 2, sizeof(double));
    for (int i = 0; i < reps + 2; i++) {
        cudaEventRecord(e0, 0);
        cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice, 0);
        cudaEventRecord(e1, 0);
        ce = cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        ts[i] = ms;
    }
    qsort(ts + 2, reps, sizeof(double), cmp_d);
    double med = ts[2 + reps / 2];
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(c);
    free(ts);
    if (ce != cudaSuccess) return k3_cuda_fail(err, ce, "copy bandwidth", __FILE__, __LINE__);
    *bytes_per_s = 2.0 * (double)bytes / (med * 1e-3);
    return K3_OK;
}
