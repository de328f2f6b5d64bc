/* GPU MoE benchmark driver for tools/gpu-check (until `k3 bench moe --backend cuda` calls
 * k3_cuda_bench_* itself): one resident K3 layer per format, uniform random routing, and a
 * TSV line per (backend, format, T) on stdout with the time, the touched-expert bytes, the
 * memory floor from the copy bandwidth measured in the same process, and the fraction.
 * Usage: cuda_moe_bench [--fmt nvfp4|mxfp4|both] [--backend cuda|cuda-fused|both]
 *                       [--T 1,8,64,256] [--reps 20] [--experts 896 --hidden 3584 --inter 3072 --topk 16]
 *                       [--mode w4a16|w4a16-bf16|w4a4]
 *                       [--tokens-per-tile 0|4|8|16 (w4a16) or 0|8|16|32] [--k-splits 0|1|2] [--wgmma -1|0|32] [--wgp 0|48|80|128|160]
 *                       [--cta-warps 0|1|2|4|8]
 * Every row adds the stage breakdown (prep, fc1, hconv, fc2, finalize) of one extra run
 * (grouped: events between the launches; fused: the kernel's own phase stamps); the last
 * column is the mode. */
#include "cuda/k3_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > 1 << 20) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *fmts = "both", *backends = "both";
    int Ts[32] = {1, 8, 64, 256, 2048}, nT = 5, reps = 20, E = 896, H = 3584, I = 3072, k = 16, tpt = 0, ks = 0, wgm = 0, wgp = 0, cw = 0;
    k3_act_mode mode = K3_MODE_W4A16;
    k3_error err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "cuda_moe_bench: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--fmt")) fmts = v;
        else if (!strcmp(a, "--backend")) backends = v;
        else if (!strcmp(a, "--T")) { if ((nT = parse_list(v, Ts, 32)) <= 0) { fprintf(stderr, "cuda_moe_bench: --T %s\n", v); return 2; } }
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--experts")) E = atoi(v);
        else if (!strcmp(a, "--hidden")) H = atoi(v);
        else if (!strcmp(a, "--inter")) I = atoi(v);
        else if (!strcmp(a, "--topk")) k = atoi(v);
        else if (!strcmp(a, "--tokens-per-tile")) tpt = atoi(v);
        else if (!strcmp(a, "--k-splits")) ks = atoi(v);
        else if (!strcmp(a, "--wgmma")) wgm = atoi(v);
        else if (!strcmp(a, "--wgp")) wgp = atoi(v);
        else if (!strcmp(a, "--cta-warps")) cw = atoi(v);
        else if (!strcmp(a, "--mode")) { if (k3_act_mode_from_name(v, &mode, &err)) { fprintf(stderr, "cuda_moe_bench: %s\n", err.msg); return 2; } }
        else { fprintf(stderr, "cuda_moe_bench: unknown option %s\n", a); return 2; }
        i++;
    }
    if (strcmp(fmts, "both") && strcmp(fmts, "nvfp4") && strcmp(fmts, "mxfp4")) {
        fprintf(stderr, "cuda_moe_bench: --fmt %s (expected nvfp4, mxfp4 or both)\n", fmts);
        return 2;
    }
    if (strcmp(backends, "both") && strcmp(backends, "cuda") && strcmp(backends, "cuda-fused")) {
        fprintf(stderr, "cuda_moe_bench: --backend %s (expected cuda, cuda-fused or both)\n", backends);
        return 2;
    }
    double bw = 0;
    if (k3_cuda_copy_bandwidth((size_t)1 << 30, 10, &bw, &err)) { fprintf(stderr, "cuda_moe_bench: %s\n", err.msg); return 1; }
    char dev[256];
    int nd = 0;
    k3_cuda_device_count(&nd, dev, sizeof dev, &err);
    double peak = 0;
    k3_error perr = {0};
    if (k3_cuda_bf16_peak(&peak, &perr)) fprintf(stderr, "cuda_moe_bench: bf16 peak: %s\n", perr.msg);
    printf("#device\t%s\n#copy_bw_GBs\t%.1f\n#bf16_peak_TFLOPs\t%.1f\n", dev, bw / 1e9, peak / 1e12);
    printf("#k3\tbackend\tfmt\tT\tus_median\tus_min\ttouched\texpert_MB\tfloor_us\tfrac_of_floor\tTFLOPs\t"
           "stages_us(prep,fc1,hconv,fc2,finalize)\tmode\n");
    fflush(stdout);
    for (int f = 0; f < 2; f++) {
        if (strcmp(fmts, "both") && strcmp(fmts, f ? "mxfp4" : "nvfp4")) continue;
        k3_cuda_bench_opts o = {.n_experts = E, .hidden = H, .inter = I, .top_k = k,
                                .fmt = f ? K3_WFMT_MXFP4 : K3_WFMT_NVFP4, .act = K3_ACT_SITU,
                                .mode = mode, .warmup = 3, .reps = reps, .seed = 0,
                                .tokens_per_tile = tpt, .k_splits = ks, .wgmma = wgm, .wgp = wgp, .cta_warps = cw};
        k3_cuda_bench *b = NULL;
        if (k3_cuda_bench_open(&o, &b, &err)) { fprintf(stderr, "cuda_moe_bench: %s\n", err.msg); return 1; }
        /* T outermost, both backends at each T: after the 2048- and 8192-token runs the H100 ran
         * the decode sizes 10-15% slower for tens of milliseconds (power cap; fused T = 1 129 ->
         * 149 us in the same process, lab/NOTES.md v23), which the fused rows, run after all the
         * grouped ones, used to take alone. */
        for (int i = 0; i < nT; i++) {
            for (int be = 0; be < 2; be++) {
                if (strcmp(backends, "both") && strcmp(backends, be ? "cuda-fused" : "cuda")) continue;
                k3_cuda_bench_result r;
                if (k3_cuda_bench_run(b, (k3_cuda_backend)be, Ts[i], &r, &err)) {
                    printf("#skip\t%s\t%s\tT=%d\t%s\n", be ? "cuda-fused" : "cuda", f ? "mxfp4" : "nvfp4", Ts[i], err.msg);
                    continue;
                }
                double floor_us = r.expert_bytes / bw * 1e6;
                printf("k3\t%s\t%s\t%d\t%.1f\t%.1f\t%d\t%.1f\t%.1f\t%.3f\t%.1f\t%.1f,%.1f,%.1f,%.1f,%.1f\t%s\n",
                       be ? "cuda-fused" : "cuda", f ? "mxfp4" : "nvfp4", Ts[i], r.us_median, r.us_min, r.touched,
                       r.expert_bytes / 1e6, floor_us, floor_us / r.us_median, r.flops / (r.us_median * 1e-6) / 1e12,
                       r.stage_us[0], r.stage_us[1], r.stage_us[2], r.stage_us[3], r.stage_us[4],
                       k3_act_mode_name(mode));
                fflush(stdout);
            }
        }
        k3_cuda_bench_close(b);
    }
    return 0;
}
