/* k3 moe: runs one MoE layer of a checkpoint on tokens read from a safetensors file and
 * writes the result, so any backend can be checked against the float64 reference (or
 * against another engine) from the shell.
 *
 *   in:  x [T, width] BF16 or F32; with --experts-only also topk_ids I32 [T, k] (k distinct
 *        experts per token, k not above the expert count) and topk_weights F32 [T, k]
 *   out: y [T, width] F32, topk_ids I32 [T, k], topk_weights F32 [T, k]
 *
 * The whole block (router, latent projections and norm, shared expert) runs by default;
 * --experts-only runs the routed experts alone on a latent x with the given routing and
 * writes their weighted sum before the latent norm. --ep-size R without --ep-rank runs all R
 * expert-parallel ranks in this process and sums them; with --ep-rank r only rank r's
 * experts are loaded and run, which is a summand only for --experts-only (the latent
 * RMSNorm after the sum is not linear).
 *
 * This is a checking tool over internal operators, so unlike the user-facing commands it
 * includes internal headers (the loaded model's MoE block and the safetensors reader and
 * writer) besides k3.h. A backend that is not built or not available is an error that says
 * why; nothing falls back to another backend. --backend cuda|cuda-fused runs the whole block
 * on device 0 (k3_cuda_block_*: router, latent projections and norm, experts, shared MLP) or,
 * with --experts-only, the routed experts alone (k3_cuda_moe_*); without a GPU, beyond the
 * fused backend's limits or with in-process expert parallelism (--ep-size without --ep-rank)
 * it says why and exits 1. */
#include "cli/cli.h"

#include "base/rng.h"
#include "base/threadpool.h"
#include "cuda/k3_cuda.h"
#include "io/safetensors.h"
#include "load/model.h"
#include "moe/moe.h"
#include "moe/moe_cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CMD "moe"

static void usage(FILE *f) {
    fprintf(f,
            "usage: k3 moe -m DIR --layer L --in X.safetensors --out Y.safetensors [options]\n"
            "  -m, --model DIR      checkpoint directory                        (required)\n"
            "      --layer L        decoder layer (0-indexed, an MoE layer)         (required)\n"
            "      --in FILE        input: x [T, width] BF16/F32 (+ topk_ids, topk_weights)\n"
            "      --random T       instead of --in: T tokens x ~ 0.5*N(0,1), seeded by --seed\n"
            "      --seed S         seed for --random                              (default 0)\n"
            "      --out FILE       output: y F32, topk_ids I32, topk_weights F32\n"
            "      --backend B      ref | cpu | cuda | cuda-fused                (default ref)\n"
            "      --act M          w4a16 | w4a4 | w4a8 | w4a16-bf16           (default w4a16)\n"
            "      --ep-size R      expert-parallel ranks                          (default 1)\n"
            "      --ep-rank r      run only rank r (needs --experts-only)  (default: all ranks)\n"
            "      --experts-only   x is the latent; routing comes from the input file\n"
            "                       (k distinct experts per token; k may differ from the layer's)\n"
            "  -t, --threads N      CPU threads, 0 = all CPUs                      (default 0)\n");
}

typedef struct moe_args {
    const char *model, *in, *out, *backend, *act;
    long layer, ep_size, ep_rank, threads, random_T, seed;
    int experts_only;
} moe_args;

static int parse(int argc, char **argv, moe_args *a, int *help) {
    *a = (moe_args){.backend = "ref", .act = "w4a16", .layer = -1, .ep_size = 1, .ep_rank = -1};
    unsigned seen = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_opt(s, "-h", "--help")) {
            *help = 1;
            return 0;
        } else if (cli_is_opt(s, NULL, "--experts-only")) {
            a->experts_only = 1;
            continue;
        }
        /* the options that take a value, a short and a long spelling per row */
        static const char *const with_value[][2] = {
            {"-m", "--model"}, {NULL, "--in"},   {NULL, "--out"},     {NULL, "--backend"},
            {NULL, "--act"},   {NULL, "--random"}, {NULL, "--seed"},  {NULL, "--layer"},
            {NULL, "--ep-size"}, {NULL, "--ep-rank"}, {"-t", "--threads"}};
        int known = -1;
        for (int j = 0; j < (int)(sizeof with_value / sizeof *with_value); j++)
            if (cli_is_opt(s, with_value[j][0], with_value[j][1])) known = j;
        if (known < 0)
            return cli_fail_unknown(CMD, s);
        if (seen & (1u << known))
            return cli_fail(CMD, "%s: given twice", s);
        seen |= 1u << known;
        if (!v)
            return cli_fail(CMD, "%s: missing value", s);
        i++;
        if (cli_is_opt(s, "-m", "--model"))
            a->model = v;
        else if (cli_is_opt(s, NULL, "--in"))
            a->in = v;
        else if (cli_is_opt(s, NULL, "--out"))
            a->out = v;
        else if (cli_is_opt(s, NULL, "--backend"))
            a->backend = v;
        else if (cli_is_opt(s, NULL, "--act"))
            a->act = v;
        else if (cli_is_opt(s, NULL, "--random")) {
            if (cli_parse_int(CMD, s, v, 1, 1 << 20, &a->random_T))
                return 1;
        } else if (cli_is_opt(s, NULL, "--seed")) {
            if (cli_parse_int(CMD, s, v, 0, 2147483647L, &a->seed))
                return 1;
        } else if (cli_is_opt(s, NULL, "--layer")) {
            if (cli_parse_int(CMD, s, v, 0, 1 << 20, &a->layer))
                return 1;
        } else if (cli_is_opt(s, NULL, "--ep-size")) {
            if (cli_parse_int(CMD, s, v, 1, 1 << 16, &a->ep_size))
                return 1;
        } else if (cli_is_opt(s, NULL, "--ep-rank")) {
            if (cli_parse_int(CMD, s, v, 0, (1 << 16) - 1, &a->ep_rank))
                return 1;
        } else if (cli_is_opt(s, "-t", "--threads")) {
            if (cli_parse_int(CMD, s, v, 0, 1024, &a->threads))
                return 1;
        } else {
            return cli_fail_unknown(CMD, s);
        }
    }
    if (!a->model)
        return cli_fail(CMD, "-m/--model: missing");
    if (a->layer < 0)
        return cli_fail(CMD, "--layer: missing");
    if (!a->in == !a->random_T)
        return cli_fail(CMD, "give exactly one of --in FILE and --random T");
    if (a->random_T && a->experts_only)
        return cli_fail(CMD, "--random: --experts-only reads its routing from --in");
    if (!a->out)
        return cli_fail(CMD, "--out: missing");
    if (a->ep_rank >= a->ep_size)
        return cli_fail(CMD, "--ep-rank %ld: expected 0..%ld for --ep-size %ld", a->ep_rank,
                        a->ep_size - 1, a->ep_size);
    if (a->ep_rank >= 0 && !a->experts_only)
        return cli_fail(CMD, "--ep-rank needs --experts-only: one rank's block output is not a "
                             "summand of the whole (the latent RMSNorm follows the expert sum); "
                             "leave --ep-rank out to run every rank in this process");
    return 0;
}

/* ---- backends ----------------------------------------------------------------------- */

static int cpu_experts(void *ctx, const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                       const int32_t *ids, const float *w, int k, float *y, k3_error *err) {
    return k3_moe_experts_cpu(ex, mode, x, T, ids, w, k, y, (k3_threadpool *)ctx, err);
}

/* Fills be for the named backend; *pool receives what must be freed. For the GPU backends be
 * stays empty and *gpu receives the k3_cuda_backend (else -1): they run through k3_cuda_*. */
static int pick_backend(const moe_args *a, k3_moe_backend *be, k3_threadpool **pool, int *gpu) {
    *pool = NULL;
    *gpu = -1;
    if (!strcmp(a->backend, "ref")) {
        be->experts = k3_moe_experts_ref_f32;
        return 0;
    }
    if (!strcmp(a->backend, "cpu")) {
        k3_error err = {0};
        long n = a->threads ? a->threads : sysconf(_SC_NPROCESSORS_ONLN);
        if (k3_threadpool_create(n > 0 ? (int)n : 1, pool, &err))
            return cli_fail_err(CMD, &err);
        be->experts = cpu_experts;
        be->ctx = *pool;
        return 0;
    }
    if (!strcmp(a->backend, "cuda") || !strcmp(a->backend, "cuda-fused")) {
        if (!k3_have_cuda())
            return cli_fail(CMD,
                            "--backend %s: this k3 was built without CUDA (no nvcc at build "
                            "time)",
                            a->backend);
        if (a->ep_size > 1 && a->ep_rank < 0)
            return cli_fail(CMD,
                            "--backend %s: --ep-size %ld without --ep-rank runs every expert-"
                            "parallel rank in this process, which the cuda backends do not do "
                            "(one device holds the whole bank: leave --ep-size out, or give "
                            "--ep-rank with --experts-only)",
                            a->backend, a->ep_size);
        /* before the (long) model load: no device is the common reason it cannot run */
        int ndev = 0;
        char dev[160];
        k3_error err = {0};
        if (k3_cuda_device_count(&ndev, dev, sizeof dev, &err))
            return cli_fail_err(CMD, &err);
        if (ndev == 0)
            return cli_fail(CMD, "--backend %s: no GPU: no usable CUDA device (%s)", a->backend,
                            dev);
        *gpu = !strcmp(a->backend, "cuda") ? K3_CUDA_GROUPED : K3_CUDA_FUSED;
        return 0;
    }
    return cli_fail(CMD, "--backend '%s': expected ref, cpu, cuda or cuda-fused", a->backend);
}

/* ---- input and output --------------------------------------------------------------- */

/* Reads tensor `name` of the given rank-2 shape (cols checked when > 0) as float or int32. */
static int read_tensor(k3_st_file *f, const char *path, const char *name, k3_dtype want,
                       int64_t rows, int64_t cols, void **out, int64_t *rows_out,
                       int64_t *cols_out) {
    const k3_st_tensor *t = k3_st_find(f, name);
    if (!t)
        return cli_fail(CMD, "%s: tensor '%s' is missing", path, name);
    bool ok_dtype = t->dtype == want ||
                    (want == K3_DTYPE_F32 && t->dtype == K3_DTYPE_BF16 && !strcmp(name, "x"));
    if (!ok_dtype)
        return cli_fail(CMD, "%s: %s: expected %s%s, found %s", path, name, k3_dtype_name(want),
                        !strcmp(name, "x") ? " or BF16" : "", k3_dtype_name(t->dtype));
    if (t->rank != 2 || (rows >= 0 && (int64_t)t->shape[0] != rows) ||
        (cols > 0 && (int64_t)t->shape[1] != cols) || t->shape[0] > (1u << 30) ||
        t->shape[1] > (1u << 30)) {
        char shape[64];
        if (cols > 0)
            snprintf(shape, sizeof shape, "[%s, %lld]", rows >= 0 ? "T of x" : "T",
                     (long long)cols);
        else
            snprintf(shape, sizeof shape, "[%s, k]", rows >= 0 ? "T of x" : "T");
        return cli_fail(CMD, "%s: %s: expected shape %s, found rank %d [%llu, %llu]", path, name,
                        shape, t->rank, (unsigned long long)(t->rank > 0 ? t->shape[0] : 0),
                        (unsigned long long)(t->rank > 1 ? t->shape[1] : 0));
    }
    size_t n = (size_t)t->numel, nb = (size_t)k3_st_nbytes(t);
    void *raw = malloc(nb + 1), *dst = malloc(n * 4 + 1);
    k3_error err = {0};
    if (!raw || !dst) {
        free(raw), free(dst);
        return cli_fail(CMD, "%s: %s: out of memory", path, name);
    }
    if (k3_st_read(f, t, raw, nb, 0, &err)) {
        free(raw), free(dst);
        return cli_fail_err(CMD, &err);
    }
    if (t->dtype == K3_DTYPE_BF16) {
        const uint16_t *b = raw;
        float *d = dst;
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)b[i] << 16;
            memcpy(&d[i], &u, 4);
        }
    } else {
        memcpy(dst, raw, nb);
    }
    free(raw);
    *out = dst;
    *rows_out = (int64_t)t->shape[0];
    *cols_out = (int64_t)t->shape[1];
    return 0;
}

static int write_out(const char *path, const float *y, int T, int width, const int32_t *ids,
                     const float *w, int k) {
    k3_st_wtensor t[3] = {
        {.name = "y",
         .dtype = K3_DTYPE_F32,
         .rank = 2,
         .shape = {(uint64_t)T, (uint64_t)width},
         .data = y},
        {.name = "topk_ids",
         .dtype = K3_DTYPE_I32,
         .rank = 2,
         .shape = {(uint64_t)T, (uint64_t)k},
         .data = ids},
        {.name = "topk_weights",
         .dtype = K3_DTYPE_F32,
         .rank = 2,
         .shape = {(uint64_t)T, (uint64_t)k},
         .data = w},
    };
    static const char *const meta[1][2] = {{"producer", "k3 moe"}};
    k3_error err = {0};
    if (k3_st_write_file(path, t, 3, meta, 1, &err))
        return cli_fail_err(CMD, &err);
    return 0;
}

/* --experts-only routing must be one a router can make: k distinct experts per token.
 * k itself may differ from the layer's top-k: the routed-expert operator is a weighted sum
 * over whichever experts a token names, every backend takes k as a call parameter (moe.md
 * §3.1: top-k is only a sizing parameter of the MoE kernels; §4.3 compares them at k = 1, 2
 * and 16), and k = 1 with weight 1 isolates one expert for checking against another engine. An
 * expert named twice in one token is not such a routing (it would be summed twice), nor is
 * a k above the expert count, which forces a repeat. Out-of-range ids are left to the
 * operator's input check, which names them. */
static int check_routing(const char *path, const int32_t *ids, int64_t T, int k, int n_experts) {
    if (k > n_experts)
        return cli_fail(CMD, "%s: topk_ids: %d ids per token, more than the layer's %d experts "
                        "(a token names each expert at most once)", path, k, n_experts);
    int64_t *token = malloc((size_t)n_experts * sizeof *token); /* last token naming expert e */
    int *slot = malloc((size_t)n_experts * sizeof *slot);       /* and in which slot */
    if (!token || !slot) {
        free(token), free(slot);
        return cli_fail(CMD, "out of memory checking the routing of %d experts", n_experts);
    }
    for (int e = 0; e < n_experts; e++)
        token[e] = -1;
    int rc = 0;
    for (int64_t t = 0; t < T && !rc; t++)
        for (int j = 0; j < k && !rc; j++) {
            int32_t e = ids[t * k + j];
            if (e < 0 || e >= n_experts)
                continue;
            if (token[e] == t)
                rc = cli_fail(CMD, "%s: topk_ids[%lld]: expert %d is named twice (slots %d and "
                              "%d); a token's k experts must be distinct", path, (long long)t, e,
                              slot[e], j);
            token[e] = t;
            slot[e] = j;
        }
    free(token), free(slot);
    return rc;
}

/* ---- the command -------------------------------------------------------------------- */

typedef struct moe_run {
    k3_model *m;
    k3_cuda_block *cblock;
    k3_cuda_moe *cmoe;
    k3_st_file *in;
    k3_threadpool *pool;
    float *x, *y, *w;
    int32_t *ids;
} moe_run;

static int run(const moe_args *a, moe_run *r) {
    k3_error err = {0};
    k3_moe_backend be = {0};
    if (k3_act_mode_from_name(a->act, &be.mode, &err))
        return cli_fail_err(CMD, &err);
    int gpu;
    if (pick_backend(a, &be, &r->pool, &gpu))
        return 1;
    bool one_rank = a->ep_rank >= 0;
    be.ep_size = one_rank ? 1 : (int)a->ep_size;

    if (a->in && k3_st_open(&r->in, a->in, &err))
        return cli_fail_err(CMD, &err);
    int layer = (int)a->layer;
    k3_model_opts mo = {.path = a->model,
                        .ep_size = one_rank ? (int)a->ep_size : 1,
                        .ep_rank = one_rank ? (int)a->ep_rank : 0,
                        .n_threads = (int)a->threads,
                        .layers = &layer,
                        .n_layers = 1,
                        .progress = 1};
    if (k3_model_open(&r->m, &mo, &err))
        return cli_fail_err(CMD, &err);
    const k3_moe_block *b = k3_model_moe(r->m, layer);
    if (!b)
        return cli_fail(CMD, "--layer %d: not an MoE layer of %s", layer, a->model);

    int width = a->experts_only ? b->experts.hidden : b->model_width, K = b->router.top_k;
    int64_t T, cols, kr, kc;
    if (a->random_T) {
        T = a->random_T;
        r->x = malloc((size_t)T * (size_t)width * sizeof *r->x);
        if (!r->x)
            return cli_fail(CMD, "out of memory for %lld tokens", (long long)T);
        k3_rng rng = {(uint64_t)a->seed};
        for (int64_t i = 0; i < T * width; i++)
            r->x[i] = (float)(0.5 * k3_rng_normal(&rng));
    } else if (read_tensor(r->in, a->in, "x", K3_DTYPE_F32, -1, width, (void **)&r->x, &T, &cols))
        return 1;
    if (a->experts_only) {
        if (read_tensor(r->in, a->in, "topk_ids", K3_DTYPE_I32, T, 0, (void **)&r->ids, &kr, &kc) ||
            read_tensor(r->in, a->in, "topk_weights", K3_DTYPE_F32, T, kc, (void **)&r->w, &kr,
                        &kc))
            return 1;
        K = (int)kc;
        if (check_routing(a->in, r->ids, T, K, b->experts.n_experts))
            return 1;
    } else {
        r->ids = malloc(((size_t)T * (size_t)K + 1) * sizeof *r->ids);
        r->w = malloc(((size_t)T * (size_t)K + 1) * sizeof *r->w);
    }
    r->y = malloc(((size_t)T * (size_t)width + 1) * sizeof *r->y);
    if (!r->ids || !r->w || !r->y)
        return cli_fail(CMD, "out of memory for %lld tokens", (long long)T);

    double t0 = k3_now();
    int rc;
    if (gpu >= 0) {
        /* upload once, then run; the time printed below is the run alone */
        if (a->experts_only)
            rc = k3_cuda_moe_create(&b->experts, &r->cmoe, &err);
        else
            rc = k3_cuda_block_create(b, &r->cblock, &err);
        if (rc)
            return cli_fail_err(CMD, &err);
        t0 = k3_now();
        if (a->experts_only)
            rc = k3_cuda_moe_run_host(r->cmoe, (k3_cuda_backend)gpu, be.mode, r->x, (int)T, r->ids,
                                      r->w, K, r->y, &err);
        else
            rc = k3_cuda_block_run_host(r->cblock, (k3_cuda_backend)gpu, be.mode, r->x, (int)T,
                                        r->y, r->ids, r->w, &err);
    } else if (!a->experts_only)
        rc = k3_moe_block_forward(b, &be, r->x, (int)T, r->y, r->ids, r->w, &err);
    else if (be.ep_size > 1)
        rc = k3_moe_experts_ep_sum(be.experts, be.ctx, &b->experts, be.ep_size, be.mode, r->x,
                                   (int)T, r->ids, r->w, K, r->y, &err);
    else
        rc = be.experts(be.ctx, &b->experts, be.mode, r->x, (int)T, r->ids, r->w, K, r->y, &err);
    if (rc)
        return cli_fail_err(CMD, &err);
    double dt = k3_now() - t0;
    /* every input was checked finite, so a non-finite output is fp32 range exceeded (huge x
     * or weights): an error, never a file of inf */
    for (int64_t i = 0; i < T * width; i++)
        if (!isfinite(r->y[i]))
            return cli_fail(CMD, "y[%lld][%lld] is %g: the result exceeds the float32 range (inputs "
                            "finite but too large)", (long long)(i / width), (long long)(i % width),
                            (double)r->y[i]);
    if (write_out(a->out, r->y, (int)T, width, r->ids, r->w, K))
        return 1;
    char what[64] = "whole block";
    if (a->experts_only && K == b->router.top_k)
        snprintf(what, sizeof what, "experts only, k %d", K);
    else if (a->experts_only) /* legitimate (check_routing), but not what the model runs */
        snprintf(what, sizeof what, "experts only, k %d (the layer's router picks %d)", K,
                 b->router.top_k);
    fprintf(
        stderr,
        "k3 moe: layer %d, %lld tokens, %s, backend %s, %s, experts [%d, %d) of %d: %.3f s -> %s\n",
        layer, (long long)T, what, a->backend, k3_act_mode_name(be.mode), b->experts.first_local,
        b->experts.first_local + b->experts.n_local, b->experts.n_experts, dt, a->out);
    return 0;
}

int cli_moe(int argc, char **argv) {
    moe_args a;
    int help = 0;
    if (parse(argc, argv, &a, &help)) return 1; /* the error names the option and points at -h */
    if (help) {
        usage(stdout);
        return 0;
    }
    moe_run r = {0};
    int rc = run(&a, &r);
    k3_model_close(r.m);
    k3_st_close(r.in);
    k3_threadpool_free(r.pool);
    k3_cuda_block_free(r.cblock);
    k3_cuda_moe_free(r.cmoe);
    free(r.x), free(r.y), free(r.w), free(r.ids);
    return rc;
}
