/* The GPU boundary in a build without nvcc: every entry point says why it cannot run.
 * Compiled only when the Makefile finds no nvcc (and into the fuzz targets). Keep in sync
 * with k3_cuda.h: every function declared there has its answer here. */
#include "base/base.h"
#include "cuda/k3_cuda.h"

#include <stdio.h>

#define NO_CUDA(err, what) k3_fail((err), K3_ERR_DEVICE, "%s: k3 was built without CUDA (no nvcc at build time)", (what))

int k3_cuda_device_count(int *count, char *name, size_t name_len, k3_error *err) {
    (void)err;
    *count = 0;
    if (name && name_len) snprintf(name, name_len, "none (k3 was built without CUDA)");
    return K3_OK;
}

const char *k3_cuda_backend_name(k3_cuda_backend b) {
    return b == K3_CUDA_GROUPED ? "cuda" : b == K3_CUDA_FUSED ? "cuda-fused" : "unknown";
}

int k3_cuda_moe_create(const k3_experts *ex, k3_cuda_moe **out, k3_error *err) {
    (void)ex;
    *out = NULL;
    return NO_CUDA(err, "cuda backend");
}

void k3_cuda_moe_free(k3_cuda_moe *m) { (void)m; }

int k3_cuda_moe_check(const k3_cuda_moe *m, k3_cuda_backend b, k3_act_mode mode, int T, int k, k3_error *err) {
    (void)m, (void)mode, (void)T, (void)k;
    return NO_CUDA(err, k3_cuda_backend_name(b));
}

int k3_cuda_moe_run(k3_cuda_moe *m, k3_cuda_backend b, k3_act_mode mode, const float *d_x, int T,
                    const int32_t *d_ids, const float *d_w, int k, float *d_y, void *stream, k3_error *err) {
    (void)m, (void)mode, (void)d_x, (void)T, (void)d_ids, (void)d_w, (void)k, (void)d_y, (void)stream;
    return NO_CUDA(err, k3_cuda_backend_name(b));
}

int k3_cuda_moe_set_gemm_path(k3_cuda_moe *m, int path, k3_error *err) {
    (void)m, (void)path;
    return NO_CUDA(err, "cuda backend");
}

int k3_cuda_moe_set_fc2_bands(k3_cuda_moe *m, int bands, k3_error *err) {
    (void)m, (void)bands;
    return NO_CUDA(err, "cuda backend");
}

int k3_cuda_moe_run_host(k3_cuda_moe *m, k3_cuda_backend b, k3_act_mode mode, const float *x, int T,
                         const int32_t *ids, const float *w, int k, float *y, k3_error *err) {
    (void)m, (void)mode, (void)x, (void)T, (void)ids, (void)w, (void)k, (void)y;
    return NO_CUDA(err, k3_cuda_backend_name(b));
}

int k3_cuda_route_noaux_tc(const float *d_logits, int T, int E, const float *d_bias, int k, int renormalize,
                           float scaling, int32_t *d_ids, float *d_w, void *stream, k3_error *err) {
    (void)d_logits, (void)T, (void)E, (void)d_bias, (void)k, (void)renormalize, (void)scaling, (void)d_ids,
        (void)d_w, (void)stream;
    return NO_CUDA(err, "cuda routing");
}

int k3_cuda_route_noaux_tc_host(const float *logits, int T, int E, const float *bias, int k, int renormalize,
                                float scaling, int32_t *ids, float *w, k3_error *err) {
    (void)logits, (void)T, (void)E, (void)bias, (void)k, (void)renormalize, (void)scaling, (void)ids, (void)w;
    return NO_CUDA(err, "cuda routing");
}

int k3_cuda_bench_open(const k3_cuda_bench_opts *o, k3_cuda_bench **out, k3_error *err) {
    (void)o;
    *out = NULL;
    return NO_CUDA(err, "cuda bench");
}

int k3_cuda_bench_run(k3_cuda_bench *b, k3_cuda_backend backend, int T, k3_cuda_bench_result *r, k3_error *err) {
    (void)b, (void)T, (void)r;
    return NO_CUDA(err, k3_cuda_backend_name(backend));
}

void k3_cuda_bench_close(k3_cuda_bench *b) { (void)b; }

int k3_cuda_bf16_peak(double *flops_per_s, k3_error *err) {
    *flops_per_s = 0;
    return NO_CUDA(err, "bf16 peak");
}

int k3_cuda_copy_bandwidth(size_t bytes, int reps, double *bytes_per_s, k3_error *err) {
    (void)bytes, (void)reps;
    *bytes_per_s = 0;
    return NO_CUDA(err, "cuda copy bandwidth");
}

int k3_cuda_block_create(const k3_moe_block *b, k3_cuda_block **out, k3_error *err) {
    (void)b;
    *out = NULL;
    return NO_CUDA(err, "cuda block");
}

void k3_cuda_block_free(k3_cuda_block *cb) { (void)cb; }

int k3_cuda_block_top_k(const k3_cuda_block *cb) {
    (void)cb;
    return 0;
}

int k3_cuda_block_check(const k3_cuda_block *cb, k3_cuda_backend b, k3_act_mode mode, int T, k3_error *err) {
    (void)cb, (void)mode, (void)T;
    return NO_CUDA(err, k3_cuda_backend_name(b));
}

int k3_cuda_block_run(k3_cuda_block *cb, k3_cuda_backend b, k3_act_mode mode, const float *d_x, int T, float *d_y,
                      int32_t *d_ids, float *d_w, void *stream, k3_error *err) {
    (void)cb, (void)mode, (void)d_x, (void)T, (void)d_y, (void)d_ids, (void)d_w, (void)stream;
    return NO_CUDA(err, k3_cuda_backend_name(b));
}

int k3_cuda_block_run_host(k3_cuda_block *cb, k3_cuda_backend b, k3_act_mode mode, const float *x, int T, float *y,
                           int32_t *ids, float *w, k3_error *err) {
    (void)cb, (void)mode, (void)x, (void)T, (void)y, (void)ids, (void)w;
    return NO_CUDA(err, k3_cuda_backend_name(b));
}

int k3_cuda_block_time(k3_cuda_block *cb, k3_cuda_backend b, k3_act_mode mode, int width, int T, int reps,
                       uint64_t seed, double *us, k3_error *err) {
    (void)cb, (void)mode, (void)width, (void)T, (void)reps, (void)seed;
    *us = 0;
    return NO_CUDA(err, k3_cuda_backend_name(b));
}
