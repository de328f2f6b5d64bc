/* The engine behind `k3 bench moe` (k3.h, k3_bench_moe): synthetic expert weights, uniform
 * random routing, timing, and the two ceilings of the machine measured in the same run.
 *
 * Honest numbers need cold weights: at T = 1 a K3 layer reads 16 experts (~300 MB), which
 * can fit in a large last-level cache, while a real model streams 93 layers' worth. So the
 * routing is redrawn for every repeat and the cache is flushed (a full read of the probe
 * buffer, >= 4x the LLC) before each timed call. The machine has far less memory than 896
 * K3 experts need (16.6 GB NVFP4, 59 GB BF16), so only `experts_built` experts exist and the
 * routing draws from them; env reports the count. Building quantizes a few experts from
 * random floats with k3's quantizer and fills the rest by re-randomizing those packed codes
 * (any 4-bit code is valid; scales are copied), which keeps setup to seconds.
 * Left out: loading a checkpoint (-m; the CLI says so), the GPU backends. */
#include "k3.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"
#include "base/threadpool.h"
#include "cuda/k3_cuda.h"
#include "formats/block.h"
#include "formats/fp.h"
#include "load/model.h"
#include "moe/activation.h"
#include "moe/moe_cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define N_QUANTIZED 2 /* experts quantized from floats; the rest re-randomize their codes */
#define BENCH_ACT K3_ACT_SITU /* Kimi K3's activation (betas 4.0 / 25.0) */

/* Weights and the probe buffer both ask for 2 MiB transparent huge pages, so the kernel and
 * the probe stream under the same TLB and page-boundary conditions (a loader that copies
 * experts into anonymous memory can do the same). Where THP is off this is a no-op. */
#define HUGE_ALIGN ((size_t)2 << 20)
static void *alloc_huge(size_t bytes) {
    size_t n = (bytes + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN;
    void *p = aligned_alloc(HUGE_ALIGN, n);
#ifdef MADV_HUGEPAGE
    if (p) (void)madvise(p, n, MADV_HUGEPAGE);
#endif
    return p;
}

static uint64_t mix64(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double urand(uint64_t *s) { return (double)(mix64(s) >> 11) / 9007199254740992.0; }

/* ---- the machine's ceilings --------------------------------------------------------- */

typedef struct probe {
    const uint8_t *buf;
    int64_t bytes;
    int isa; /* k3_cpu_isa */
    uint64_t sink[K3_THREADS_MAX];
    int64_t fma_iters;
    double fma_flops[K3_THREADS_MAX];
} probe;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t read512(const uint8_t *p, int64_t n) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (int64_t i = 0; i + 256 <= n; i += 256) {
        a = _mm512_xor_si512(a, _mm512_load_si512((const void *)(p + i)));
        b = _mm512_xor_si512(b, _mm512_load_si512((const void *)(p + i + 64)));
        c = _mm512_xor_si512(c, _mm512_load_si512((const void *)(p + i + 128)));
        d = _mm512_xor_si512(d, _mm512_load_si512((const void *)(p + i + 192)));
    }
    a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    /* xor, not add: the sink only keeps the loads alive, and a signed add can overflow */
    uint64_t lanes[8];
    _mm512_storeu_si512((void *)lanes, a);
    return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3] ^ lanes[4] ^ lanes[5] ^ lanes[6] ^ lanes[7];
}
__attribute__((target("avx2"))) static uint64_t read256(const uint8_t *p, int64_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (int64_t i = 0; i + 128 <= n; i += 128) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}
/* 12 independent FMA chains in named registers (an array would live in memory at -O2):
 * enough to cover a 4-cycle latency on two FMA ports. */
#define FMA12(fma, A)                                                                          \
    A(0) A(1) A(2) A(3) A(4) A(5) A(6) A(7) A(8) A(9) A(10) A(11)
__attribute__((target("avx512f"))) static double fma512(int64_t iters) {
    __m512 m = _mm512_set1_ps(0.999999f), ad = _mm512_set1_ps(1e-7f);
#define D512(j) __m512 a##j = _mm512_set1_ps((float)j);
#define S512(j) a##j = _mm512_fmadd_ps(a##j, m, ad);
#define R512(j) s += _mm512_reduce_add_ps(a##j);
    FMA12(, D512)
    for (int64_t i = 0; i < iters; i++) {
        FMA12(, S512)
    }
    float s = 0;
    FMA12(, R512)
    return s;
}
__attribute__((target("avx2,fma"))) static double fma256(int64_t iters) {
    __m256 m = _mm256_set1_ps(0.999999f), ad = _mm256_set1_ps(1e-7f);
#define D256(j) __m256 a##j = _mm256_set1_ps((float)j);
#define S256(j) a##j = _mm256_fmadd_ps(a##j, m, ad);
#define R256(j) _mm256_storeu_ps(out, a##j); for (int l = 0; l < 8; l++) s += out[l];
    FMA12(, D256)
    for (int64_t i = 0; i < iters; i++) {
        FMA12(, S256)
    }
    float out[8], s = 0;
    FMA12(, R256)
    return s;
}
#endif

/* The scalar kernel (cpu_kern_scalar.c) is plain C built with this file's flags, so its
 * multiply-add is a multiply and an add (-std=c11 turns FP contraction off, and the x86-64
 * baseline has no FMA); the probe does the same in plain C -- fmaf would be a libm call,
 * measured at a fifth of what the kernel reaches. One chain step costs both latencies (6-8
 * cycles) with two multiplies and two adds issued per cycle, so covering it takes 12-16
 * chains: 14 is what fits the 16 xmm registers beside the two constants (16 spill, 40%
 * slower on Zen 4). Named variables, not an array, for the reason given at FMA12. */
#define SCALAR_CHAINS 14
#define CHAINS14(A) A(0) A(1) A(2) A(3) A(4) A(5) A(6) A(7) A(8) A(9) A(10) A(11) A(12) A(13)
static double fma_scalar(int64_t iters) {
    float m = 0.999999f, ad = 1e-7f;
#define DS(j) float a##j = (float)j;
#define SS(j) a##j = a##j * m + ad;
#define RS(j) s += a##j;
    CHAINS14(DS)
    for (int64_t i = 0; i < iters; i++) {
        CHAINS14(SS)
    }
    float s = 0;
    CHAINS14(RS)
    return s;
}

static uint64_t read_scalar(const uint8_t *p, int64_t n) {
    uint64_t a = 0, b = 0;
    for (int64_t i = 0; i + 16 <= n; i += 16) {
        uint64_t x, y;
        memcpy(&x, p + i, 8);
        memcpy(&y, p + i + 8, 8);
        a ^= x;
        b ^= y;
    }
    return a ^ b;
}

static void probe_read(void *ctx, int64_t b, int64_t e, int thread) {
    probe *p = ctx;
    for (int64_t c = b; c < e; c++) { /* chunk c = 1/64 of the buffer, contiguous */
        const uint8_t *s = p->buf + c * (p->bytes / 64);
        int64_t n = p->bytes / 64;
        uint64_t v;
#if defined(__x86_64__)
        if (p->isa == K3_ISA_AVX512) v = read512(s, n);
        else if (p->isa == K3_ISA_AVX2) v = read256(s, n);
        else v = read_scalar(s, n);
#else
        v = read_scalar(s, n);
#endif
        p->sink[thread] ^= v;
    }
}

static void probe_fma(void *ctx, int64_t b, int64_t e, int thread) {
    probe *p = ctx;
    for (int64_t c = b; c < e; c++) {
        double lanes = 1, chains = 12, s;
#if defined(__x86_64__)
        if (p->isa == K3_ISA_AVX512) {
            s = fma512(p->fma_iters);
            lanes = 16;
        } else if (p->isa == K3_ISA_AVX2) {
            s = fma256(p->fma_iters);
            lanes = 8;
        } else
#endif
        {
            s = fma_scalar(p->fma_iters);
            chains = SCALAR_CHAINS;
        }
        p->sink[thread] += (uint64_t)(s != s);
        p->fma_flops[thread] += 2.0 * chains * lanes * (double)p->fma_iters;
    }
}

static void flush_and_probe(k3_threadpool *pool, probe *p, double *gbs) {
    double t0 = k3_now();
    k3_parallel_for(pool, 64, 1, K3_SCHED_STATIC, probe_read, p);
    double dt = k3_now() - t0;
    if (gbs) *gbs = (double)p->bytes / dt / 1e9;
}

/* ---- synthetic experts -------------------------------------------------------------- */

typedef struct bank {
    k3_wfmt fmt;
    int n, H, I;
    k3_expert *e;
    uint8_t **mem; /* one block per expert: w1, w3, w2 data then their scales */
    size_t mat_data[3], mat_scale[3], bytes;
    uint64_t seed;
    int quantized;
    k3_error qerr;
    int qrc;
} bank;

static void mat_sizes(k3_wfmt fmt, int64_t rows, int64_t cols, size_t *data, size_t *scale) {
    switch (fmt) {
    case K3_WFMT_NVFP4: *data = (size_t)(rows * cols / 2); *scale = (size_t)(rows * cols / 16); break;
    case K3_WFMT_MXFP4: *data = (size_t)(rows * cols / 2); *scale = (size_t)(rows * cols / 32); break;
    default: *data = (size_t)(rows * cols * 2); *scale = 0; break;
    }
}

static void point_expert(bank *b, int e) {
    uint8_t *m = b->mem[e];
    k3_qmat *q[3] = {&b->e[e].w1, &b->e[e].w3, &b->e[e].w2};
    size_t off = 0;
    for (int j = 0; j < 3; j++) {
        q[j]->fmt = b->fmt;
        q[j]->rows = j == 2 ? b->H : j == 1 && !b->mat_data[1] ? 0 : b->I;
        q[j]->cols = j == 2 ? b->I : b->H;
        q[j]->data = m + off;
        off += b->mat_data[j];
        if (q[j]->global_scale == 0) q[j]->global_scale = 1.0f;
        q[j]->input_scale = 6.0f / 2688.0f; /* |x| up to ~6 for unit-normal activations */
    }
    for (int j = 0; j < 3; j++) {
        q[j]->scale = b->mat_scale[j] ? m + off : NULL;
        off += b->mat_scale[j];
    }
}

/* Expert e < N_QUANTIZED: random normal floats (scale 1/sqrt(cols)) through k3's quantizer. */
static int quantize_expert(bank *b, int e, k3_error *err) {
    uint64_t s = b->seed * 7919 + (uint64_t)e;
    for (int j = 0; j < 3; j++) {
        k3_qmat *q = j == 0 ? &b->e[e].w1 : j == 1 ? &b->e[e].w3 : &b->e[e].w2;
        if (j == 1 && !k3_act_is_gated(BENCH_ACT)) continue; /* no up projection */
        int64_t n = q->rows * q->cols;
        float *wf = malloc((size_t)n * sizeof *wf);
        if (!wf) return k3_fail(err, K3_ERR_NOMEM, "bench: out of memory quantizing expert %d", e);
        float sd = 1.0f / sqrtf((float)q->cols);
        for (int64_t i = 0; i < n; i += 2) { /* Box-Muller */
            double u1 = urand(&s) + 1e-300, u2 = urand(&s);
            double r = sqrt(-2 * log(u1));
            wf[i] = (float)(r * cos(6.283185307179586 * u2)) * sd;
            if (i + 1 < n) wf[i + 1] = (float)(r * sin(6.283185307179586 * u2)) * sd;
        }
        int rc = K3_OK;
        uint8_t *data = (uint8_t *)q->data, *scale = (uint8_t *)q->scale;
        if (b->fmt == K3_WFMT_NVFP4)
            rc = k3_nvfp4_quantize_weight(wf, q->rows, q->cols, data, scale, &q->global_scale, err);
        else if (b->fmt == K3_WFMT_MXFP4)
            rc = k3_mxfp4_quantize(wf, q->rows, q->cols, data, scale, err);
        else
            for (int64_t i = 0; i < n; i++) ((uint16_t *)(void *)data)[i] = k3_f32_to_bf16(wf[i]);
        free(wf);
        if (rc) return rc;
    }
    return K3_OK;
}

static void build_range(void *ctx, int64_t b0, int64_t e0, int thread) {
    (void)thread;
    bank *b = ctx;
    for (int64_t e = b0 + b->quantized; e < e0 + b->quantized; e++) {
        int src = (int)(e % b->quantized);
        memcpy(b->mem[e], b->mem[src], b->bytes);
        for (int j = 0; j < 3; j++) {
            const k3_qmat *from = j == 0 ? &b->e[src].w1 : j == 1 ? &b->e[src].w3 : &b->e[src].w2;
            k3_qmat *to = j == 0 ? &b->e[e].w1 : j == 1 ? &b->e[e].w3 : &b->e[e].w2;
            to->global_scale = from->global_scale;
        }
        point_expert(b, (int)e);
        /* fresh codes: XOR the packed data with random bits (BF16: sign and low mantissa
         * bits only, so every value stays finite) */
        uint64_t s = b->seed * 104729 + (uint64_t)e;
        uint64_t mask = b->fmt == K3_WFMT_BF16 ? 0x8003800380038003ull : ~0ull;
        size_t data = b->mat_data[0] + b->mat_data[1] + b->mat_data[2];
        for (size_t i = 0; i + 8 <= data; i += 8) {
            uint64_t v;
            memcpy(&v, b->mem[e] + i, 8);
            v ^= mix64(&s) & mask;
            memcpy(b->mem[e] + i, &v, 8);
        }
    }
}

static void free_bank(bank *b) {
    if (b->mem)
        for (int e = 0; e < b->n; e++) free(b->mem[e]);
    free(b->mem);
    free(b->e);
}

static int make_bank(bank *b, k3_threadpool *pool, k3_error *err) {
    /* FC1 reads w1 and, for gated activations only, w3: k3_act_fc1_rows decides */
    int64_t fc1 = k3_act_fc1_rows(BENCH_ACT, b->I);
    mat_sizes(b->fmt, b->I, b->H, &b->mat_data[0], &b->mat_scale[0]);
    mat_sizes(b->fmt, fc1 - b->I, b->H, &b->mat_data[1], &b->mat_scale[1]);
    mat_sizes(b->fmt, b->H, b->I, &b->mat_data[2], &b->mat_scale[2]);
    b->bytes = 0;
    for (int j = 0; j < 3; j++) b->bytes += b->mat_data[j] + b->mat_scale[j];
    b->e = calloc((size_t)b->n, sizeof *b->e);
    b->mem = calloc((size_t)b->n, sizeof *b->mem);
    if (!b->e || !b->mem) return k3_fail(err, K3_ERR_NOMEM, "bench: out of memory for %d experts", b->n);
    for (int e = 0; e < b->n; e++)
        if (!(b->mem[e] = alloc_huge(b->bytes)))
            return k3_fail(err, K3_ERR_NOMEM, "bench: out of memory at expert %d of %d (%.1f MB each)",
                           e, b->n, (double)b->bytes / 1e6);
    b->quantized = b->n < N_QUANTIZED ? b->n : N_QUANTIZED;
    for (int e = 0; e < b->quantized; e++) {
        point_expert(b, e);
        int rc = quantize_expert(b, e, err);
        if (rc) return rc;
    }
    k3_parallel_for(pool, b->n - b->quantized, 1, K3_SCHED_DYNAMIC, build_range, b);
    return K3_OK;
}

/* ---- routing, timing ---------------------------------------------------------------- */

/* Uniform top-k without repeats from n experts per token; weights uniform, normalized. */
static int route(int T, int k, int n, uint64_t *s, int32_t *ids, float *w) {
    int touched = 0;
    uint8_t *seen = calloc((size_t)n, 1);
    for (int t = 0; t < T; t++) {
        float sum = 0;
        for (int j = 0; j < k; j++) {
            int id, dup;
            do {
                id = (int)(urand(s) * n);
                dup = 0;
                for (int q = 0; q < j; q++) dup |= ids[t * k + q] == id;
            } while (dup);
            ids[t * k + j] = id;
            w[t * k + j] = (float)(0.05 + urand(s));
            sum += w[t * k + j];
            if (seen && !seen[id]) {
                seen[id] = 1;
                touched++;
            }
        }
        for (int j = 0; j < k; j++) w[t * k + j] /= sum;
    }
    free(seen);
    return touched;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void cpu_model(char *out, size_t n) {
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c += 1 + (c[1] == ' ');
                c[strcspn(c, "\n")] = 0;
                snprintf(out, n, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

static int parse_opts(const k3_bench_moe_opts *o, k3_wfmt *fmt, k3_act_mode *mode,
                      k3_cpu_isa *isa, k3_error *err) {
    const char *f = o->format ? o->format : "nvfp4", *m = o->mode ? o->mode : "w4a16";
    const char *i = o->isa ? o->isa : "auto", *be = o->backend ? o->backend : "cpu";
    if (!strcmp(f, "nvfp4")) *fmt = K3_WFMT_NVFP4;
    else if (!strcmp(f, "mxfp4")) *fmt = K3_WFMT_MXFP4;
    else if (!strcmp(f, "bf16")) *fmt = K3_WFMT_BF16;
    else return k3_fail(err, K3_ERR_ARG, "format: expected nvfp4, mxfp4 or bf16, found '%s'", f);
    int rc = k3_act_mode_from_name(m, mode, err);
    if (rc) return rc;
    /* said before minutes of weight building, not after (a checkpoint's format is checked
     * when its experts are validated) */
    if (!o->model_dir && ((*mode == K3_MODE_W4A4 && *fmt != K3_WFMT_NVFP4) ||
                          (*mode == K3_MODE_W4A8 && *fmt != K3_WFMT_MXFP4)))
        return k3_fail(err, K3_ERR_ARG, "mode %s needs format %s, found '%s'", m,
                       *mode == K3_MODE_W4A4 ? "nvfp4" : "mxfp4", f);
    *isa = K3_ISA_COUNT;
    for (int j = 0; j < K3_ISA_COUNT; j++)
        if (!strcmp(i, k3_cpu_isa_name((k3_cpu_isa)j))) *isa = (k3_cpu_isa)j;
    if (*isa == K3_ISA_COUNT)
        return k3_fail(err, K3_ERR_ARG, "isa: expected auto, scalar, avx2 or avx512, found '%s'", i);
    if (!k3_cpu_isa_available(*isa))
        return k3_fail(err, K3_ERR_UNSUPPORTED, "isa %s: not supported by this CPU", i);
    if (*isa == K3_ISA_AUTO) *isa = k3_cpu_isa_best();
    int gpu = !strcmp(be, "cuda") || !strcmp(be, "cuda-fused");
    /* bench_cuda times its own device-resident bank of every expert: a checkpoint or a
     * host bank size given with it would go unused */
    if (gpu && o->model_dir)
        return k3_fail(err, K3_ERR_UNSUPPORTED,
                       "backend %s: times synthetic device-resident experts, not a checkpoint's "
                       "(model_dir %s)", be, o->model_dir);
    if (gpu && (o->experts_built || o->mem_budget_gib > 0))
        return k3_fail(err, K3_ERR_ARG,
                       "backend %s: every expert is resident on the device; a count of experts "
                       "to build or a memory budget sizes only the CPU backends' bank", be);
    if (gpu)
        return k3_have_cuda() ? K3_OK
                              : k3_fail(err, K3_ERR_UNSUPPORTED,
                                        "backend %s: not built/available (this k3 was built "
                                        "without CUDA)", be);
    if (strcmp(be, "cpu") && strcmp(be, "ref"))
        return k3_fail(err, K3_ERR_ARG, "backend: expected cpu, ref, cuda or cuda-fused, found '%s'", be);
    return K3_OK;
}

/* The GPU backends through the GPU boundary's own benchmark (all experts resident on
 * device 0, random valid bytes in kernel layout); the bandwidth column is the device's
 * copy bandwidth measured in the same run and the peak column its bf16 tensor-core rate
 * (k3_cuda_bf16_peak; 0 where the build has no sm_90a kernels). */
static int bench_cuda(const k3_bench_moe_opts *o, k3_wfmt fmt, k3_act_mode mode,
                      const int *tokens, int n_tokens, k3_bench_moe_row *rows,
                      k3_bench_moe_env *env, k3_error *err) {
    k3_cuda_backend cb = !strcmp(o->backend, "cuda") ? K3_CUDA_GROUPED : K3_CUDA_FUSED;
    k3_cuda_bench_opts co = {.n_experts = o->n_experts ? o->n_experts : 896,
                             .hidden = o->hidden ? o->hidden : 3584,
                             .inter = o->inter ? o->inter : 3072,
                             .top_k = o->top_k ? o->top_k : 16, .fmt = fmt, .act = BENCH_ACT,
                             .mode = mode, .backend = cb, .warmup = o->warmup ? o->warmup : 3,
                             .reps = o->repeats ? o->repeats : 20, .seed = o->seed ? o->seed : 1};
    memset(env, 0, sizeof *env);
    double bw = 0;
    int ndev = 0;
    char dname[256];
    int rc = k3_cuda_device_count(&ndev, dname, sizeof dname, err);
    if (rc) return rc;
    if (ndev == 0) return k3_fail(err, K3_ERR_DEVICE, "%s: no CUDA device (%s)", o->backend, dname);
    if ((rc = k3_cuda_copy_bandwidth((size_t)2 << 30, 5, &bw, err))) return rc;
    double peak = 0;
    k3_error perr = {0};
    if (k3_cuda_bf16_peak(&peak, &perr) && perr.status != K3_ERR_UNSUPPORTED) return k3_fail(err, perr.status, "%s", perr.msg);
    k3_cuda_bench *b = NULL;
    if ((rc = k3_cuda_bench_open(&co, &b, err))) return rc;
    for (int i = 0; i < n_tokens && !rc; i++) {
        k3_cuda_bench_result r;
        if ((rc = k3_cuda_bench_run(b, cb, tokens[i], &r, err))) break;
        rows[i] = (k3_bench_moe_row){.tokens = tokens[i], .experts_touched = r.touched,
                                     .t_median_s = r.us_median * 1e-6, .t_min_s = r.us_min * 1e-6,
                                     .t_max_s = r.us_max * 1e-6, .weight_bytes = r.expert_bytes,
                                     .flops = r.flops};
    }
    k3_cuda_bench_close(b);
    if (rc) return rc;
    snprintf(env->cpu, sizeof env->cpu, "GPU device 0");
    snprintf(env->isa, sizeof env->isa, "cuda");
    snprintf(env->format, sizeof env->format, "%s", o->format ? o->format : "nvfp4");
    snprintf(env->mode, sizeof env->mode, "%s", o->mode ? o->mode : "w4a16");
    snprintf(env->backend, sizeof env->backend, "%s", o->backend);
    env->threads = 0;
    env->n_experts = co.n_experts;
    env->top_k = co.top_k;
    env->hidden = co.hidden;
    env->inter = co.inter;
    env->experts_built = co.n_experts;
    env->bytes_per_expert = rows[0].experts_touched > 0 ? rows[0].weight_bytes / rows[0].experts_touched : 0;
    env->read_gbs = bw / 1e9;
    env->fma_gflops = peak / 1e9;
    env->warm = 1;
    return K3_OK;
}

int k3_bench_moe(const k3_bench_moe_opts *o, const int *tokens, int n_tokens,
                 k3_bench_moe_row *rows, k3_bench_moe_env *env, k3_error *err) {
    k3_wfmt fmt = K3_WFMT_NVFP4;
    k3_act_mode mode = K3_MODE_W4A16;
    k3_cpu_isa isa = K3_ISA_AUTO;
    if (!o) return k3_fail(err, K3_ERR_ARG, "k3_bench_moe: opts: NULL");
    /* checked before the backend is chosen: the GPU path writes rows and env too */
    if (!tokens || !rows || !env)
        return k3_fail(err, K3_ERR_ARG, "k3_bench_moe: %s: NULL", !tokens ? "tokens" : !rows ? "rows" : "env");
    if (n_tokens < 1) return k3_fail(err, K3_ERR_ARG, "tokens: expected at least one token count");
    /* a negative or NaN budget would read as "0: the default", a silent replacement */
    if (!(o->mem_budget_gib >= 0))
        return k3_fail(err, K3_ERR_ARG, "mem_budget_gib: expected >= 0, found %g", o->mem_budget_gib);
    if (o->experts_built < 0)
        return k3_fail(err, K3_ERR_ARG, "experts_built: expected >= 0, found %d", o->experts_built);
    if (o->repeats < 0) return k3_fail(err, K3_ERR_ARG, "repeats: expected >= 0, found %d", o->repeats);
    if (o->warmup < 0) return k3_fail(err, K3_ERR_ARG, "warmup: expected >= 0, found %d", o->warmup);
    int rc = parse_opts(o, &fmt, &mode, &isa, err);
    if (rc) return rc;
    const char *be = o->backend ? o->backend : "cpu";
    if (!strcmp(be, "cuda") || !strcmp(be, "cuda-fused"))
        return bench_cuda(o, fmt, mode, tokens, n_tokens, rows, env, err);
    int use_ref = !strcmp(be, "ref");
    memset(env, 0, sizeof *env);
    int E = o->n_experts ? o->n_experts : 896, k = o->top_k ? o->top_k : 16;
    int H = o->hidden ? o->hidden : 3584, I = o->inter ? o->inter : 3072;
    int threads = o->threads ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    k3_model *model = NULL;
    const k3_experts *mex = NULL; /* the checkpoint's experts (-m) */
    if (o->model_dir) {
        /* the checkpoint's layer replaces the synthetic one: its options would be ignored */
        const char *syn = o->n_experts ? "n_experts" : o->top_k ? "top_k" : o->hidden ? "hidden"
                          : o->inter ? "inter" : o->format ? "format" : o->experts_built ? "experts_built"
                          : o->mem_budget_gib > 0 ? "mem_budget_gib" : NULL;
        if (syn)
            return k3_fail(err, K3_ERR_ARG, "%s: describes the synthetic layer, which model_dir %s replaces",
                           syn, o->model_dir);
        int layer = o->layer;
        k3_model_opts mo = {.path = o->model_dir, .n_threads = threads, .layers = &layer,
                            .n_layers = 1, .progress = 1};
        if ((rc = k3_model_open(&model, &mo, err))) return rc;
        const k3_moe_block *blk = k3_model_moe(model, layer);
        if (!blk) {
            k3_model_close(model);
            return k3_fail(err, K3_ERR_ARG, "layer %d: not an MoE layer of %s", layer,
                           o->model_dir);
        }
        mex = &blk->experts;
        E = mex->n_experts;
        k = blk->router.top_k;
        H = mex->hidden;
        I = mex->inter;
        fmt = mex->e[0].w1.fmt;
    }
    int repeats = o->repeats ? o->repeats : 5, warmup = o->warmup ? o->warmup : 1;
    double budget = (o->mem_budget_gib > 0 ? o->mem_budget_gib : 6.0) * 1073741824.0;
    if (!mex && (E < 1 || k < 1 || k > E || H < 32 || I < 32 || H % 32 || I % 32))
        return k3_fail(err, K3_ERR_ARG,
                       "shape: need 1 <= top_k <= experts and hidden, inter multiples of 32, found "
                       "E=%d k=%d H=%d I=%d", E, k, H, I);
    for (int i = 0; i < n_tokens && !rc; i++)
        if (tokens[i] < 1 || tokens[i] > 65536)
            rc = k3_fail(err, K3_ERR_ARG, "tokens: expected 1..65536, found %d", tokens[i]);
    k3_threadpool *pool = NULL;
    if (rc || (rc = k3_threadpool_create(threads, &pool, err))) {
        k3_model_close(model);
        return rc;
    }
    bank b = {.fmt = fmt, .H = H, .I = I, .seed = o->seed ? o->seed : 1};
    size_t d, sc, per = 0;
    int64_t fc1_rows = k3_act_fc1_rows(BENCH_ACT, I);
    mat_sizes(fmt, fc1_rows, H, &d, &sc);
    per += d + sc;
    mat_sizes(fmt, H, I, &d, &sc);
    per += d + sc;
    double fit = floor(budget / (double)per); /* double: a huge budget overflows an int */
    b.n = mex ? mex->n_local : o->experts_built ? o->experts_built : fit < E ? (int)fit : E;
    /* an explicit count is what the caller asked for: one the layer cannot hold or the budget
     * the caller also gave cannot fit is an error, never a quietly different bank */
    if (!mex && b.n > E)
        rc = k3_fail(err, K3_ERR_ARG, "experts: %d to build, but the layer has only %d", b.n, E);
    else if (!mex && o->experts_built && o->mem_budget_gib > 0 && b.n > fit)
        rc = k3_fail(err, K3_ERR_LIMIT,
                     "experts: %d need %.2f GiB (%.1f MB each), more than the memory budget of "
                     "%.2f GiB", b.n, (double)b.n * (double)per / 1073741824.0, (double)per / 1e6,
                     o->mem_budget_gib);
    else if (!mex && o->experts_built && b.n < k)
        rc = k3_fail(err, K3_ERR_ARG, "experts: %d built is fewer than top_k %d", b.n, k);
    else if (b.n < k)
        rc = k3_fail(err, K3_ERR_LIMIT,
                     "experts: %d built (%.2f GiB budget, %.1f MB each) is fewer than top_k %d",
                     b.n, budget / 1073741824.0, (double)per / 1e6, k);
    if (rc) {
        k3_threadpool_free(pool);
        k3_model_close(model);
        return rc;
    }

    probe pr = {.isa = isa};
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    int64_t pbytes = (int64_t)1 << 30;
    if (llc > 0 && 4 * (int64_t)llc > pbytes) pbytes = 4 * (int64_t)llc;
    pbytes = (pbytes + (64 << 20) - 1) / (64 << 20) * (64 << 20);
    uint8_t *pbuf = alloc_huge((size_t)pbytes);
    int Tmax = 0;
    for (int i = 0; i < n_tokens; i++) Tmax = tokens[i] > Tmax ? tokens[i] : Tmax;
    float *x = malloc((size_t)Tmax * H * sizeof *x), *y = malloc((size_t)Tmax * H * sizeof *y);
    float *w = malloc((size_t)Tmax * k * sizeof *w);
    int32_t *ids = malloc((size_t)Tmax * k * sizeof *ids);
    double *times = malloc((size_t)repeats * sizeof *times);
    double *bws = malloc((size_t)repeats * sizeof *bws);
    if (!pbuf || !x || !y || !w || !ids || !times || !bws) {
        rc = k3_fail(err, K3_ERR_NOMEM, "bench: out of memory (probe %.1f GB, %d tokens)",
                     (double)pbytes / 1e9, Tmax);
        goto done;
    }
    for (int64_t i = 0; i < pbytes; i += 8) { /* touch every page, non-constant data */
        uint64_t v = (uint64_t)i * 0x9E3779B97F4A7C15ull;
        memcpy(pbuf + i, &v, 8);
    }
    pr.buf = pbuf;
    pr.bytes = pbytes;
    if (!mex && (rc = make_bank(&b, pool, err))) goto done;

    /* Ceilings: best of 3 full reads; FMA peak over ~0.2 s. */
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double g;
        flush_and_probe(pool, &pr, &g);
        if (g > best) best = g;
    }
    env->read_gbs = best;
    pr.fma_iters = 1 << 22;
    double t0 = k3_now();
    k3_parallel_for(pool, threads, 1, K3_SCHED_STATIC, probe_fma, &pr);
    double dt = k3_now() - t0, fl = 0;
    for (int t = 0; t < threads; t++) fl += pr.fma_flops[t];
    env->fma_gflops = fl / dt / 1e9;

    k3_experts ex = {.n_experts = b.n, .first_local = 0, .n_local = b.n, .hidden = H, .inter = I,
                     .e = b.e};
    if (mex) { /* bytes a call reads per touched expert: its matrices as stored */
        ex = *mex;
        const k3_expert *e0 = &mex->e[0];
        b.bytes = k3_qmat_data_bytes(&e0->w1) + k3_qmat_scale_bytes(&e0->w1) +
                  k3_qmat_data_bytes(&e0->w2) + k3_qmat_scale_bytes(&e0->w2);
        if (k3_act_is_gated(mex->act.act))
            b.bytes += k3_qmat_data_bytes(&e0->w3) + k3_qmat_scale_bytes(&e0->w3);
        fc1_rows = k3_act_fc1_rows(mex->act.act, I);
    }
    float *alpha = malloc((size_t)b.n * sizeof *alpha), *beta = malloc((size_t)b.n * sizeof *beta);
    if (!alpha || !beta) {
        free(alpha);
        free(beta);
        rc = k3_fail(err, K3_ERR_NOMEM, "bench: out of memory");
        goto done;
    }
    for (int e = 0; e < b.n; e++) {
        alpha[e] = 4.0f; /* Kimi K3's SiTU betas */
        beta[e] = 25.0f;
    }
    if (!mex) ex.act = (k3_act_params){.act = BENCH_ACT, .alpha = alpha, .beta = beta};
    uint64_t rs = b.seed * 31337;
    for (int64_t i = 0; i < (int64_t)Tmax * H; i++) {
        double u1 = urand(&rs) + 1e-300, u2 = urand(&rs);
        x[i] = (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
    }
    for (int ti = 0; ti < n_tokens && !rc; ti++) {
        int T = tokens[ti];
        double touched = 0;
        int tc = 0;
        for (int r = 0; r < warmup + repeats && !rc; r++) {
            if (!o->warm || r == 0) {
                /* a stream of its own per (seed, T, repeat): a row's routing must not depend
                 * on which other token counts were asked for, or in what order */
                uint64_t route_s = b.seed * 0xD1B54A32D192ED03ull ^ ((uint64_t)T << 20 | (uint64_t)r);
                route_s = mix64(&route_s);
                tc = route(T, k, b.n, &route_s, ids, w);
                for (int64_t i = 0; i < (int64_t)T * k; i++) ids[i] += ex.first_local;
            }
            double g = 0;
            if (!o->warm) flush_and_probe(pool, &pr, &g);
            double s0 = k3_now();
            rc = use_ref ? k3_moe_experts_ref_f32(NULL, &ex, mode, x, T, ids, w, k, y, err)
                         : k3_moe_experts_cpu_isa(&ex, mode, x, T, ids, w, k, y, pool, isa, err);
            double el = k3_now() - s0;
            if (r >= warmup) {
                times[r - warmup] = el;
                bws[r - warmup] = g;
                touched += tc;
            }
        }
        if (rc) break;
        qsort(times, (size_t)repeats, sizeof *times, cmp_double);
        qsort(bws, (size_t)repeats, sizeof *bws, cmp_double);
        k3_bench_moe_row *row = &rows[ti];
        row->tokens = T;
        row->experts_touched = touched / repeats;
        row->t_median_s = repeats % 2 ? times[repeats / 2]
                                      : 0.5 * (times[repeats / 2 - 1] + times[repeats / 2]);
        row->t_min_s = times[0];
        row->t_max_s = times[repeats - 1];
        row->weight_bytes = row->experts_touched * (double)b.bytes;
        row->flops = 2.0 * T * k * (double)(fc1_rows + I) * H;
        row->read_gbs = repeats % 2 ? bws[repeats / 2] : 0.5 * (bws[repeats / 2 - 1] + bws[repeats / 2]);
    }
    free(alpha);
    free(beta);
    cpu_model(env->cpu, sizeof env->cpu);
    snprintf(env->isa, sizeof env->isa, "%s", use_ref ? "float64" : k3_cpu_isa_name(isa));
    if (mex)
        snprintf(env->format, sizeof env->format, "%s", k3_wfmt_name(fmt));
    else
        snprintf(env->format, sizeof env->format, "%s", o->format ? o->format : "nvfp4");
    snprintf(env->mode, sizeof env->mode, "%s", o->mode ? o->mode : "w4a16");
    snprintf(env->backend, sizeof env->backend, "%s", o->backend ? o->backend : "cpu");
    env->threads = threads;
    env->from_model = mex != NULL;
    env->warm = o->warm != 0;
    env->n_experts = E;
    env->top_k = k;
    env->hidden = H;
    env->inter = I;
    env->experts_built = b.n;
    env->experts_quantized = mex ? 0 : b.quantized;
    env->bytes_per_expert = (double)b.bytes;
    env->probe_bytes = (double)pbytes;
    env->llc_bytes = llc > 0 ? (double)llc : 0;
done:
    free_bank(&b);
    free(pbuf);
    free(x);
    free(y);
    free(w);
    free(ids);
    free(times);
    free(bws);
    k3_threadpool_free(pool);
    k3_model_close(model);
    return rc;
}
