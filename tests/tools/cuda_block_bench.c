/* GPU MoE block timing for tools/gpu-check: a block of Kimi K3's dimensions (width 7168,
 * latent 3584, expert intermediate 3072, top-16, shared SiTU MLP 6144, router of 896 rows),
 * random but valid weights (BF16 or FP8-block dense projections, NVFP4 experts), timed by
 * k3_cuda_block_time (device-resident tokens, back-to-back launches). One TSV line per
 * (backend, T) on stdout.
 * Left out: all 896 experts resident. The host-side re-layout of the expert upload makes a
 * full bank slow to build, so --experts (default 32) experts are resident and the router is
 * cut to that many rows; at T = 1 the block touches 16 experts either way, at larger T it
 * touches fewer distinct experts than the real layer (the routed part alone at full size is
 * cuda_moe_bench's job).
 * Usage: cuda_block_bench [--experts 32] [--T 1,8] [--reps 20] [--dense bf16|fp8] */
#include "cuda/k3_cuda.h"
#include "formats/fp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { W = 7168, L = 3584, I = 3072, K = 16, S = 6144 };

static uint64_t g_s = 0x1234567;
static uint64_t rnd(void) {
    uint64_t z = (g_s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void *xalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "cuda_block_bench: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* BF16 values of magnitude 2^-9 .. 2^-6, random sign and mantissa. */
static void fill_bf16(uint16_t *d, size_t n) {
    for (size_t i = 0; i < n; i += 4) {
        uint64_t r = rnd();
        for (size_t j = 0; j < 4 && i + j < n; j++, r >>= 16)
            d[i + j] = (uint16_t)(((r & 0x8000) | ((118 + ((r >> 7) & 3)) << 7) | (r & 0x7F)));
    }
}

static void dense(k3_qmat *q, int rows, int cols, int fp8) {
    size_t n = (size_t)rows * cols;
    *q = (k3_qmat){.fmt = fp8 ? K3_WFMT_FP8_BLOCK : K3_WFMT_BF16, .rows = rows, .cols = cols, .global_scale = 1};
    if (!fp8) {
        uint16_t *d = xalloc(n * 2);
        fill_bf16(d, n);
        q->data = d;
        return;
    }
    uint8_t *d = xalloc(n);
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)rnd();
        d[i] = (b & 0x7F) == 0x7F ? 0 : b; /* no NaN codes */
    }
    size_t ns = (size_t)((rows + 127) / 128) * ((cols + 127) / 128);
    float *s = xalloc(ns * 4);
    for (size_t i = 0; i < ns; i++) s[i] = 1e-4f;
    q->data = d, q->scale = s;
}

static void nvfp4(k3_qmat *q, int rows, int cols) {
    size_t n = (size_t)rows * cols;
    uint8_t *d = xalloc(n / 2), *s = xalloc(n / 16);
    for (size_t i = 0; i < n / 2; i += 8) {
        uint64_t r = rnd();
        memcpy(d + i, &r, 8);
    }
    for (size_t i = 0; i < n / 16; i++) s[i] = (uint8_t)(0x28 + rnd() % 0x20);
    *q = (k3_qmat){.fmt = K3_WFMT_NVFP4, .rows = rows, .cols = cols, .data = d, .scale = s,
                   .global_scale = 0.005f, .input_scale = 4.0f / (6 * 448)};
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > 1 << 16) return -1;
        out[n++] = (int)v;
        if (*end && *end != ',') return -1;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

int main(int argc, char **argv) {
    int E = 32, Ts[16] = {1, 8}, nT = 2, reps = 20, fp8 = 0;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return fprintf(stderr, "cuda_block_bench: %s needs a value\n", a), 2;
        if (!strcmp(a, "--experts")) E = atoi(v);
        else if (!strcmp(a, "--T")) nT = parse_list(v, Ts, 16);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--dense")) fp8 = !strcmp(v, "fp8");
        else return fprintf(stderr, "cuda_block_bench: unknown option %s\n", a), 2;
    }
    if (E < K || E > 896 || nT <= 0 || reps < 1) return fprintf(stderr, "cuda_block_bench: bad options\n"), 2;
    k3_moe_block b = {0};
    b.model_width = W;
    uint16_t *gate = xalloc((size_t)E * W * 2);
    fill_bf16(gate, (size_t)E * W);
    float *bias = xalloc((size_t)E * 4), *alpha = xalloc((size_t)E * 4), *beta = xalloc((size_t)E * 4);
    for (int e = 0; e < E; e++) bias[e] = 0.01f * (float)(e % 7), alpha[e] = 4.0f, beta[e] = 25.0f;
    b.router = (k3_router){.fn = K3_ROUTE_NOAUX_TC, .n_experts = E, .top_k = K, .n_group = 1, .topk_group = 1,
                           .renormalize = true, .routed_scaling_factor = 1.0f, .correction_bias = bias,
                           .gate = {.fmt = K3_WFMT_BF16, .rows = E, .cols = W, .data = gate, .global_scale = 1}};
    k3_expert *ex = xalloc((size_t)E * sizeof *ex);
    for (int e = 0; e < E; e++) nvfp4(&ex[e].w1, I, L), nvfp4(&ex[e].w3, I, L), nvfp4(&ex[e].w2, L, I);
    b.experts = (k3_experts){.n_experts = E, .n_local = E, .hidden = L, .inter = I, .e = ex,
                             .act = {.act = K3_ACT_SITU, .alpha = alpha, .beta = beta}};
    b.latent = true;
    dense(&b.latent_down, L, W, fp8);
    dense(&b.latent_up, W, L, fp8);
    uint16_t *norm = xalloc(L * 2);
    for (int i = 0; i < L; i++) norm[i] = k3_f32_to_bf16(1.0f);
    b.latent_norm = norm, b.latent_norm_fmt = K3_WFMT_BF16, b.norm_eps = 1e-5f;
    b.n_shared = 2;
    dense(&b.shared_gate, S, W, fp8);
    dense(&b.shared_up, S, W, fp8);
    dense(&b.shared_down, W, S, fp8);
    float one_a = 4.0f, one_b = 25.0f;
    b.shared_act = (k3_act_params){.act = K3_ACT_SITU, .alpha = &one_a, .beta = &one_b};

    k3_error err = {0};
    k3_cuda_block *cb = NULL;
    if (k3_cuda_block_create(&b, &cb, &err)) return fprintf(stderr, "cuda_block_bench: %s\n", err.msg), 1;
    double dense_mb = ((double)E * W * 2 + (double)(2 * L + 3 * S) * W * (fp8 ? 1 : 2)) / 1e6;
    printf("#block\tbackend\tdense\tT\tus\tdense_MB\texperts_resident\n");
    int rc = 0;
    for (int bk = 0; bk < K3_CUDA_BACKEND_COUNT; bk++)
        for (int t = 0; t < nT; t++) {
            double us = 0;
            if (k3_cuda_block_time(cb, (k3_cuda_backend)bk, K3_MODE_W4A16, W, Ts[t], reps, 7, &us, &err)) {
                fprintf(stderr, "cuda_block_bench: %s T=%d: %s\n", k3_cuda_backend_name((k3_cuda_backend)bk), Ts[t], err.msg);
                rc = 1;
                continue;
            }
            printf("block\t%s\t%s\t%d\t%.1f\t%.1f\t%d\n", k3_cuda_backend_name((k3_cuda_backend)bk), fp8 ? "fp8" : "bf16", Ts[t], us,
                   dense_mb, E);
            fflush(stdout);
        }
    k3_cuda_block_free(cb);
    return rc;
}
