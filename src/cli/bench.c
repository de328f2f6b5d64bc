/* k3 bench <what>: llama-bench-style tables that put every time next to its floor.
 *
 * `k3 bench moe` times one routed-expert layer (k3_bench_moe in k3.h) for several token
 * counts and prints, per row: tokens, distinct experts touched, median time and the spread
 * (min..max) over repeats after warm-up, GB/s of expert weights read and its fraction of the
 * streaming-read bandwidth measured in the same run, GFLOP/s and its fraction of the FMA
 * peak measured in the same run, and the two floors those fractions stand for
 * (performance.md §1: touched experts' bytes over the bandwidth, FLOPs over the peak). A footer names the build commit, the CPU, both probes and
 * how many experts were really built (or, with -m, which checkpoint layer was timed). */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS 32

static void usage(FILE *f) {
    fprintf(f,
            "usage: k3 bench moe [options]\n"
            "  -m, --model DIR        time this checkpoint's routed experts as stored (instead of\n"
            "                         the synthetic layer of --preset, --format, --experts, --mem-gib)\n"
            "      --layer L          the MoE layer of -m (default 1)\n"
            "      --preset NAME      k3-layer: 896 experts, top-16, H=3584, I=3072 (default)\n"
            "      --tokens LIST      token counts (default 1,8,64,256,2048)\n"
            "      --backend NAME     cpu | ref | cuda | cuda-fused (default cpu)\n"
            "      --format NAME      nvfp4 | mxfp4 | bf16 (default nvfp4)\n"
            "      --act MODE         w4a16 | w4a4 | w4a8 | w4a16-bf16 (default w4a16)\n"
            "      --isa NAME         auto | scalar | avx2 | avx512 (default auto)\n"
            "      --experts N        experts built in memory, from the layer's top-k (16) to its 896\n"
            "                         (default: as many as fit --mem-gib)\n"
            "      --mem-gib G        memory for expert weights; given with --experts, a cap that\n"
            "                         they must fit (default 6)\n"
            "  -t, --threads N        threads (default: all online CPUs)\n"
            "  -r, --repeats N        timed repeats after warm-up (default 5; on a GPU 20)\n"
            "      --warmup N         untimed runs first (default 1; on a GPU 3, continued until\n"
            "                         they span 50 ms)\n"
            "      --warm             same routing every repeat, no cache flush (micro-benchmark\n"
            "                         conditions; default: cold weights, routing redrawn)\n"
            "  -s, --seed N           weights and routing seed (default 1)\n"
            "  -o, --output FMT       md | csv | json (default md)\n");
}

static int parse_tokens(const char *s, int *out, int *n) {
    char buf[512];
    if (!s || !*s || strlen(s) >= sizeof buf) return cli_fail("bench moe", "--tokens: expected a list like 1,8,64");
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    /* every comma separates two entries: "1,,8" or a trailing comma is an error, not a shorter list */
    for (char *tok = buf, *comma;; tok = comma + 1) {
        long v;
        if ((comma = strchr(tok, ','))) *comma = '\0';
        if (*n == MAX_TOKENS) return cli_fail("bench moe", "--tokens: at most %d entries", MAX_TOKENS);
        if (!*tok) return cli_fail("bench moe", "--tokens: empty entry in '%s'", s);
        if (cli_parse_int("bench moe", "--tokens", tok, 1, 65536, &v)) return 1;
        out[(*n)++] = (int)v;
        if (!comma) break;
    }
    return 0;
}

static void print_table(const char *fmt, const k3_bench_moe_env *env, const k3_bench_moe_row *rows,
                        int n) {
    /* JSON is read by programs that recompute ratios from it: significant digits, not fixed
     * decimals, or a slow row rounds to a different rate. */
    if (!strcmp(fmt, "json")) {
        printf("{\"bench\": \"moe\", \"commit\": \"%s\", \"cpu\": \"%s\", \"backend\": \"%s\", "
               "\"format\": \"%s\", \"act\": \"%s\", \"isa\": \"%s\", \"threads\": %d, "
               "\"experts\": %d, \"top_k\": %d, \"hidden\": %d, \"inter\": %d, "
               "\"experts_built\": %d, \"experts_quantized\": %d, \"bytes_per_expert\": %.0f, "
               "\"read_gbs\": %.9g, \"probe_bytes\": %.0f, \"llc_bytes\": %.0f, "
               "\"fma_gflops\": %.9g, \"warm\": %s, \"rows\": [",
               k3_build_commit(), env->cpu, env->backend, env->format, env->mode, env->isa,
               env->threads, env->n_experts, env->top_k, env->hidden, env->inter,
               env->experts_built, env->experts_quantized, env->bytes_per_expert, env->read_gbs,
               env->probe_bytes, env->llc_bytes, env->fma_gflops, env->warm ? "true" : "false");
        for (int i = 0; i < n; i++) {
            const k3_bench_moe_row *r = &rows[i];
            double bw = r->read_gbs > 0 ? r->read_gbs : env->read_gbs;
            printf("%s{\"tokens\": %d, \"experts_touched\": %.9g, \"median_s\": %.9g, "
                   "\"min_s\": %.9g, \"max_s\": %.9g, \"weight_bytes\": %.0f, \"flops\": %.0f, "
                   "\"gbs\": %.9g, \"read_gbs\": %.9g, \"mem_floor_s\": %.9g, "
                   "\"bw_fraction\": %.9g, \"gflops\": %.9g, ",
                   i ? ", " : "", r->tokens, r->experts_touched, r->t_median_s, r->t_min_s,
                   r->t_max_s, r->weight_bytes, r->flops, r->weight_bytes / r->t_median_s / 1e9,
                   bw, r->weight_bytes / (bw * 1e9), r->weight_bytes / r->t_median_s / 1e9 / bw,
                   r->flops / r->t_median_s / 1e9);
            /* no peak probe (a GPU build without sm_90a kernels): null, as JSON has no inf */
            if (env->fma_gflops > 0)
                printf("\"flop_floor_s\": %.9g, \"flop_fraction\": %.9g}",
                       r->flops / (env->fma_gflops * 1e9),
                       r->flops / r->t_median_s / 1e9 / env->fma_gflops);
            else
                printf("\"flop_floor_s\": null, \"flop_fraction\": null}");
        }
        printf("]}\n");
        return;
    }
    int csv = !strcmp(fmt, "csv");
    if (csv)
        printf("backend,format,act,isa,threads,tokens,experts_touched,median_ms,min_ms,max_ms,gbs,"
               "read_gbs,mem_floor_ms,bw_pct,gflops,flop_floor_ms,flop_pct\n");
    else
        printf("| backend | format | act | isa | threads | tokens | experts | time ms (median) | "
               "spread ms (min..max) | GB/s | read BW GB/s | memory floor ms | %% of read BW | "
               "GFLOP/s | FLOP floor ms | %% of peak |\n"
               "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const k3_bench_moe_row *r = &rows[i];
        double gbs = r->weight_bytes / r->t_median_s / 1e9, gfl = r->flops / r->t_median_s / 1e9;
        double bw = r->read_gbs > 0 ? r->read_gbs : env->read_gbs;
        /* 0: no peak probe (a GPU build without sm_90a kernels) */
        double fpct = env->fma_gflops > 0 ? 100 * gfl / env->fma_gflops : 0;
        double mem_floor_ms = r->weight_bytes / (bw * 1e9) * 1e3;
        double flop_floor_ms = env->fma_gflops > 0 ? r->flops / (env->fma_gflops * 1e9) * 1e3 : 0;
        if (csv) /* for machines: six significant digits, so the columns agree with each other at any size */
            printf("%s,%s,%s,%s,%d,%d,%.1f,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g\n",
                   env->backend, env->format, env->mode, env->isa, env->threads, r->tokens,
                   r->experts_touched, r->t_median_s * 1e3, r->t_min_s * 1e3, r->t_max_s * 1e3,
                   gbs, bw, mem_floor_ms, 100 * gbs / bw, gfl, flop_floor_ms, fpct);
        else
            printf("| %s | %s | %s | %s | %d | %d | %.1f | %.3f | %.3f..%.3f | %.2f | %.2f | %.4f | "
                   "%.1f%% | %.2f | %.4f | %.1f%% |\n",
                   env->backend, env->format, env->mode, env->isa, env->threads, r->tokens,
                   r->experts_touched, r->t_median_s * 1e3, r->t_min_s * 1e3, r->t_max_s * 1e3,
                   gbs, bw, mem_floor_ms, 100 * gbs / bw, gfl, flop_floor_ms, fpct);
    }
    if (csv) return;
    /* weights per expert from the FLOP count, which already knows whether FC1 is gated */
    double weights = rows[0].flops / (2.0 * rows[0].tokens * env->top_k);
    printf("\nbuild %s; %s; %d threads. Layer: %d experts, top-%d, H=%d, I=%d, %s; "
           "%.0f weights and %.2f MB of weights+scales per expert.\n",
           k3_build_commit(), env->cpu, env->threads, env->n_experts, env->top_k, env->hidden,
           env->inter, env->from_model ? "the checkpoint's activation" : "SiTU (4, 25)", weights,
           env->bytes_per_expert / 1e6);
    printf("Floors (performance.md §1): memory floor = experts touched x bytes per expert / the "
           "bandwidth column; FLOP floor = 2 x tokens x top-k x weights per expert / the peak; "
           "%% of read BW = memory floor / median time, %% of peak = FLOP floor / median time.\n");
    if (!strncmp(env->backend, "cuda", 4)) {
        printf("GPU: all %d experts resident on device 0 (random valid bytes in kernel layout); "
               "bandwidth column = device copy bandwidth measured in this run (%% of it = memory floor / time); "
               "peak = bf16 tensor-core rate measured in this run, %.1f TFLOP/s (%% of it = FLOP floor / time, "
               "FLOPs counted once although w4a16 issues an hi and a lo product; 0 without sm_90a kernels).\n",
               env->n_experts, env->fma_gflops / 1e3);
        return;
    }
    if (env->from_model)
        printf("Experts: the checkpoint's %d routed experts of the layer, as stored (%s); routing "
               "uniform over them.\n", env->experts_built, env->format);
    else
        printf("Experts built in memory: %d of %d (routing is uniform over those %d; %d quantized "
               "from random floats by k3's quantizer, the rest re-randomized copies of their codes).\n",
               env->experts_built, env->n_experts, env->experts_built, env->experts_quantized);
    printf("Read bandwidth: %.2f GB/s at start (streaming read of %.2f GB, LLC %.0f MB, same "
           "threads, weights and probe on 2 MiB THP when available; cold rows use the median of the reads just before each timed call); "
           "FMA peak: %.1f GFLOP/s (fp32, %s width). %s\n",
           env->read_gbs, env->probe_bytes / 1e9, env->llc_bytes / 1e6, env->fma_gflops,
           env->isa,
           env->warm ? "WARM: one routing per row, caches not flushed (weights may sit in the LLC)."
                     : "Cold: caches flushed before every timed call; routing redrawn per repeat.");
}

static int bench_moe(int argc, char **argv) {
    const char *cmd = "bench moe", *out = "md";
    int tokens[MAX_TOKENS] = {1, 8, 64, 256, 2048}, n_tokens = 5;
    k3_bench_moe_opts o = {0};
    /* the options that take a value; those that only shape the synthetic layer are marked, as
     * -m replaces that layer with the checkpoint's */
    static const struct {
        const char *s, *l;
        int synthetic;
    } with_value[] = {{"-m", "--model", 0},   {NULL, "--layer", 0},   {NULL, "--preset", 1},
                      {NULL, "--tokens", 0},  {NULL, "--backend", 0}, {NULL, "--format", 1},
                      {NULL, "--act", 0},     {NULL, "--isa", 0},     {NULL, "--experts", 1},
                      {NULL, "--mem-gib", 1}, {"-t", "--threads", 0}, {"-r", "--repeats", 0},
                      {NULL, "--warmup", 0},  {"-s", "--seed", 0},    {"-o", "--output", 0}};
    const char *synthetic = NULL; /* the first such option given */
    int layer_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long n;
        double g;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--warm")) {
            o.warm = 1;
            continue;
        }
        int known = -1;
        for (int j = 0; j < (int)(sizeof with_value / sizeof *with_value); j++)
            if (cli_is_opt(a, with_value[j].s, with_value[j].l)) known = j;
        if (known < 0) return cli_fail_unknown(cmd, a);
        if (!(v = cli_value(cmd, argc, argv, &i))) return 1;
        if (with_value[known].synthetic && !synthetic) synthetic = a;
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            o.model_dir = v;
        else if (!strcmp(a, "--layer")) {
            if (cli_parse_int(cmd, a, v, 0, 100000, &n)) return 1;
            o.layer = (int)n;
            layer_set = 1;
        } else if (!strcmp(a, "--preset")) {
            if (strcmp(v, "k3-layer")) return cli_fail(cmd, "--preset: expected k3-layer, got '%s'", v);
        } else if (!strcmp(a, "--tokens")) {
            if (parse_tokens(v, tokens, &n_tokens)) return 1;
        } else if (!strcmp(a, "--backend")) o.backend = v;
        else if (!strcmp(a, "--format")) o.format = v;
        else if (!strcmp(a, "--act")) o.mode = v;
        else if (!strcmp(a, "--isa")) o.isa = v;
        else if (!strcmp(a, "--experts")) {
            if (cli_parse_int(cmd, a, v, 1, 1 << 20, &n)) return 1;
            o.experts_built = (int)n;
        } else if (!strcmp(a, "--mem-gib")) {
            if (cli_parse_double(cmd, a, v, &g)) return 1;
            if (!(g > 0)) return cli_fail(cmd, "--mem-gib: expected > 0, got %s", v);
            o.mem_budget_gib = g;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (cli_parse_int(cmd, a, v, 1, 256, &n)) return 1;
            o.threads = (int)n;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--repeats")) {
            if (cli_parse_int(cmd, a, v, 1, 1000, &n)) return 1;
            o.repeats = (int)n;
        } else if (!strcmp(a, "--warmup")) {
            if (cli_parse_int(cmd, a, v, 1, 100, &n)) return 1;
            o.warmup = (int)n;
        } else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) {
            if (cli_parse_int(cmd, a, v, 1, 0x7fffffffL, &n)) return 1;
            o.seed = (uint64_t)n;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (strcmp(v, "md") && strcmp(v, "csv") && strcmp(v, "json"))
                return cli_fail(cmd, "-o: expected md, csv or json, got '%s'", v);
            out = v;
        }
    }
    if (o.model_dir && synthetic)
        return cli_fail(cmd, "%s: describes the synthetic K3 layer, which -m %s replaces with the "
                             "checkpoint's experts as stored (give one or the other)",
                        synthetic, o.model_dir);
    if (o.model_dir && !layer_set) o.layer = 1; /* Kimi K3 and Kimi-Linear: layer 0 is dense */
    if (layer_set && !o.model_dir) return cli_fail(cmd, "--layer needs -m DIR");
    k3_bench_moe_row rows[MAX_TOKENS];
    k3_bench_moe_env env;
    k3_error err = {0};
    if (k3_bench_moe(&o, tokens, n_tokens, rows, &env, &err)) return cli_fail_err(cmd, &err);
    print_table(out, &env, rows, n_tokens);
    return 0;
}

int cli_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: k3 bench <what> [options]\n  moe    one routed-expert layer (k3 bench moe -h)\n");
        return argc < 2;
    }
    if (!strcmp(argv[1], "moe")) return bench_moe(argc - 1, argv + 1);
    return cli_fail("bench", "unknown benchmark '%s' (expected: moe)", argv[1]);
}
