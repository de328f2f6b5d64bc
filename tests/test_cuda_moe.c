/* The GPU MoE backends (cuda grouped, cuda-fused) and the routing kernel against float64
 * references, on fresh random experts through the real upload path.
 *
 * Oracle: k3_moe_experts_ref (src/moe/reference.c, float64 over exactly dequantized weights,
 * the W4A4 activation quantization emulated as TensorRT-LLM runs it). Metric: relative L2
 * over the whole output, ||y - ref|| / ||ref||, NaN fails. Bounds: w4a16 1e-5 (the CPU
 * bound; the GPU adds only fp32 accumulation in another order, split-K partial sums, and the
 * ~2^-22 two-term fp16 split of activations); w4a4 1e-3 (activation codes are bit-identical
 * except where fp32 accumulation order moves an h value across an E2M1 rounding boundary,
 * which flips one code); w4a16-bf16 1e-3, the CPU fast path's per-run bound (x is rounded to
 * bf16 identically on both sides, but act(h) is computed in fp32 on the GPU and in float64 by
 * the reference before its bf16 rounding, so a rare h value lands one bf16 ulp (2^-8 relative)
 * away; at small T one such flip alone costs up to ~4e-4, test_moe_cpu.c. Not rounding h at all
 * gives ~1.6e-3, not rounding anything ~2.7e-3: the bound tells those apart). Outputs are
 * poisoned with NaN before every run. Expert bytes are
 * random codes with random scales (NVFP4 including E4M3 subnormal and large scales; MXFP4
 * with an all-zero block of exponent 2^-127). On a machine without a GPU every test skips
 * with a line saying so. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/k3_cuda.h"
#include "cuda_skip.h"
#include "formats/fp.h"
#include "moe/moe.h"

/* ---- environment --------------------------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double urand(void) { return (double)(rnd() >> 11) * 0x1.0p-53; }

/* ---- random experts ---------------------------------------------------------------------- */

typedef struct {
    k3_experts ex;
    k3_expert *e;
    uint8_t **bufs;
    int nbufs;
    float *alpha, *beta, *limit;
} model;

static void *mbuf(model *m, size_t n) {
    m->bufs = realloc(m->bufs, (m->nbufs + 1) * sizeof *m->bufs);
    return m->bufs[m->nbufs++] = calloc(n, 1);
}

static void rand_mat(model *m, k3_qmat *q, int rows, int cols, k3_wfmt fmt) {
    q->fmt = fmt;
    q->rows = rows;
    q->cols = cols;
    uint8_t *d = mbuf(m, (size_t)rows * cols / 2);
    for (size_t i = 0; i < (size_t)rows * cols / 2; i++) d[i] = (uint8_t)rnd();
    int bs = fmt == K3_WFMT_NVFP4 ? 16 : 32, nb = cols / bs;
    uint8_t *s = mbuf(m, (size_t)rows * nb);
    for (int i = 0; i < rows * nb; i++) {
        if (fmt == K3_WFMT_NVFP4) {
            /* mostly normal scales around 1, some E4M3 subnormals (2^-9..) and large ones */
            uint64_t r = rnd() % 100;
            s[i] = r < 5 ? (uint8_t)(1 + rnd() % 7) : r < 10 ? (uint8_t)(0x60 + rnd() % 0x1E) : (uint8_t)(0x28 + rnd() % 0x20);
        } else {
            s[i] = (uint8_t)(127 - 9 + rnd() % 14); /* 2^-9 .. 2^4 */
        }
    }
    if (fmt == K3_WFMT_MXFP4 && rows > 2) {
        /* an all-zero block with an extreme exponent: its scale must not matter */
        int r = (int)(rnd() % rows), b = (int)(rnd() % nb);
        memset(d + (size_t)r * cols / 2 + b * 16, 0, 16);
        s[r * nb + b] = 0;
    }
    q->data = d;
    q->scale = s;
    q->global_scale = fmt == K3_WFMT_NVFP4 ? (float)(0.002 + 0.01 * urand()) : 1.f;
    q->input_scale = fmt == K3_WFMT_NVFP4 ? (float)(0.5 + urand()) / (6 * 448) * 4 : 0.f;
}

static void model_make(model *m, int E, int first, int nl, int H, int I, k3_wfmt fmt, k3_act act) {
    memset(m, 0, sizeof *m);
    m->e = calloc(nl, sizeof *m->e);
    for (int e = 0; e < nl; e++) {
        rand_mat(m, &m->e[e].w1, I, H, fmt);
        rand_mat(m, &m->e[e].w3, I, H, fmt);
        m->e[e].w3.input_scale = m->e[e].w1.input_scale; /* one FC1 activation scale */
        rand_mat(m, &m->e[e].w2, H, I, fmt);
    }
    m->alpha = malloc(sizeof(float) * nl);
    m->beta = malloc(sizeof(float) * nl);
    m->limit = malloc(sizeof(float) * nl);
    for (int e = 0; e < nl; e++) {
        /* asymmetric per-expert pairs so a swapped alpha/beta shows */
        m->alpha[e] = act == K3_ACT_SITU ? 2.5f + 0.5f * (float)(e % 3) : 1.0f + 0.1f * (float)(e % 4);
        m->beta[e] = act == K3_ACT_SITU ? 7.0f + (float)(e % 5) : 0.5f;
        m->limit[e] = 3.0f + (float)(e % 2);
    }
    m->ex = (k3_experts){.n_experts = E, .first_local = first, .n_local = nl, .hidden = H, .inter = I, .e = m->e};
    m->ex.act.act = act;
    if (act == K3_ACT_SITU) {
        m->ex.act.alpha = m->alpha;
        m->ex.act.beta = m->beta;
    } else if (act == K3_ACT_SWIGLU_BIAS) {
        m->ex.act.alpha = m->alpha;
        m->ex.act.beta = m->beta;
        m->ex.act.limit = m->limit;
    }
}

static void model_free(model *m) {
    for (int i = 0; i < m->nbufs; i++) free(m->bufs[i]);
    free(m->bufs);
    free(m->e);
    free(m->alpha), free(m->beta), free(m->limit);
}

/* ---- float64 reference ---------------------------------------------------------------------- */

/* The reference over a slice of the tokens: each token's output depends on its own row alone, so
 * slices run on threads give the same bits as one call (the GPU machine's cores cut the tests'
 * time, most of which is this reference). */
typedef struct {
    const model *m;
    k3_act_mode mode;
    const float *x, *w;
    const int32_t *ids;
    int t0, t1, k, rc;
    double *y;
    k3_error err;
} ref_slice;

static void *ref_slice_run(void *arg) {
    ref_slice *s = arg;
    const size_t H = (size_t)s->m->ex.hidden, k = (size_t)s->k, t0 = (size_t)s->t0;
    s->rc = k3_moe_experts_ref(&s->m->ex, s->mode, s->x + t0 * H, s->t1 - s->t0, s->ids + t0 * k, s->w + t0 * k,
                               s->k, s->y + t0 * H, &s->err);
    return NULL;
}

static void ref_run(const model *m, k3_act_mode mode, const float *x, int T, const int32_t *ids, const float *w,
                    int k, double *y) {
    enum { MAX_THREADS = 32 };
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = nc < 1 ? 1 : nc > MAX_THREADS ? MAX_THREADS : (int)nc;
    if (nt > T) nt = T > 0 ? T : 1;
    ref_slice sl[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    for (int i = 0; i < nt; i++) {
        sl[i] = (ref_slice){.m = m, .mode = mode, .x = x, .w = w, .ids = ids, .k = k, .y = y,
                            .t0 = (int)((int64_t)T * i / nt), .t1 = (int)((int64_t)T * (i + 1) / nt)};
        if (i > 0) assert_int_equal(pthread_create(&th[i], NULL, ref_slice_run, &sl[i]), 0);
    }
    ref_slice_run(&sl[0]);
    for (int i = 1; i < nt; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < nt; i++) {
        if (sl[i].rc) fprintf(stderr, "reference: %s\n", sl[i].err.msg);
        assert_int_equal(sl[i].rc, K3_OK);
    }
}

static double rel_l2(const float *y, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)y[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- one case ------------------------------------------------------------------------------ */

enum { ROUTE_RANDOM, ROUTE_ONE_EXPERT, ROUTE_TWO_EXPERTS };

static void make_routing(int T, int k, int E, int how, int32_t *ids, float *w) {
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int e;
            int dup;
            do {
                e = how == ROUTE_ONE_EXPERT ? (j == 0 ? 5 % E : (int)(rnd() % E))
                    : how == ROUTE_TWO_EXPERTS ? (int)(3 + 7 * j) % E : (int)(rnd() % E);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[t * k + i] == e;
            } while (dup && how != ROUTE_TWO_EXPERTS);
            ids[t * k + j] = e;
            w[t * k + j] = (float)(0.1 + urand());
        }
}

/* Inputs: fp32 (every element has a non-zero lo term) or bf16-valued (lo terms zero: the
 * activation rows as a bf16 model feeds them). */
static double mode_bound(k3_act_mode mode) {
    return mode == K3_MODE_W4A4 || mode == K3_MODE_W4A16_BF16 ? 1e-3 : 1e-5;
}

static int bf16_inputs;

/* One case's inputs and float64 reference, so that several GEMM paths can run the same case. */
typedef struct {
    int T, k;
    float *x, *w;
    int32_t *ids;
    double *ref;
} kase;

static void case_make(model *m, k3_act_mode mode, int T, int k, int how, kase *c) {
    const int H = m->ex.hidden;
    c->T = T, c->k = k;
    c->x = malloc(sizeof(float) * T * H), c->w = malloc(sizeof(float) * T * k);
    c->ids = malloc(sizeof(int32_t) * T * k);
    c->ref = malloc(sizeof(double) * T * H);
    for (int i = 0; i < T * H; i++) {
        c->x[i] = (float)((urand() * 2 - 1) * (0.5 + 2 * urand()));
        if (bf16_inputs) c->x[i] = k3_bf16_to_f32(k3_f32_to_bf16(c->x[i]));
    }
    make_routing(T, k, m->ex.n_experts, how, c->ids, c->w);
    ref_run(m, mode, c->x, T, c->ids, c->w, k, c->ref);
}

static void case_free(kase *c) { free(c->x), free(c->w), free(c->ids), free(c->ref); }

/* relL2 of one run against the case's reference (NaN where any output is not finite); the
 * output is poisoned before the run. */
static double case_run(model *m, k3_cuda_moe *cm, k3_cuda_backend b, k3_act_mode mode, const kase *c) {
    const size_t n = (size_t)c->T * m->ex.hidden;
    float *y = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) y[i] = NAN;
    k3_error err = {0};
    int rc = k3_cuda_moe_run_host(cm, b, mode, c->x, c->T, c->ids, c->w, c->k, y, &err);
    if (rc) fprintf(stderr, "run: %s\n", err.msg);
    assert_int_equal(rc, K3_OK);
    double r = rel_l2(y, c->ref, n);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(y[i])) r = NAN;
    free(y);
    return r;
}

static double run_case(model *m, k3_cuda_moe *cm, k3_cuda_backend b, k3_act_mode mode, int T, int k, int how) {
    kase c;
    case_make(m, mode, T, k, how, &c);
    double r = case_run(m, cm, b, mode, &c);
    case_free(&c);
    return r;
}

static const char *act_names[] = {"invalid", "identity", "gelu", "relu", "silu", "swiglu", "geglu", "swiglu_bias", "relu2", "situ"};

/* 32 experts of hidden H and inter I, each T of Ts through the grouped (and, with fused_too,
 * the fused) backend against the reference at the mode's bound. */
static void check_shape(int H, int I, k3_wfmt fmt, k3_act act, k3_act_mode mode, const int *Ts, int nT, int fused_too) {
    model m;
    rng_state = 1000 + fmt * 100 + act * 10 + mode + (H - 384); /* the original shape keeps its seeds */
    model_make(&m, 32, 0, 32, H, I, fmt, act);
    k3_cuda_moe *cm = NULL;
    k3_error err = {0};
    int rc = k3_cuda_moe_create(&m.ex, &cm, &err);
    if (rc) fprintf(stderr, "create: %s\n", err.msg);
    assert_int_equal(rc, K3_OK);
    const double bound = mode_bound(mode);
    for (int b = 0; b < (fused_too ? 2 : 1); b++)
        for (int i = 0; i < nT; i++) {
            int T = Ts[i], k = T >= 4096 ? 2 : 4;
            if (b == K3_CUDA_FUSED && T > K3_CUDA_FUSED_MAX_TOKENS) {
                k3_error e2 = {0};
                float dummy = 0;
                int32_t id = 0;
                assert_int_equal(k3_cuda_moe_check(cm, K3_CUDA_FUSED, mode, T, k, &e2), K3_ERR_LIMIT);
                (void)dummy, (void)id;
                continue;
            }
            double r = run_case(&m, cm, (k3_cuda_backend)b, mode, T, k, ROUTE_RANDOM);
            printf("  %-10s %-5s %-11s %-10s T=%-5d relL2 %.3g (bound %g) H=%d I=%d\n", b ? "cuda-fused" : "cuda",
                   fmt == K3_WFMT_NVFP4 ? "nvfp4" : "mxfp4", act_names[act], k3_act_mode_name(mode), T, r, bound, H, I);
            assert_true(r <= bound);
        }
    k3_cuda_moe_free(cm);
    model_free(&m);
}

static void check_combo(k3_wfmt fmt, k3_act act, k3_act_mode mode, const int *Ts, int nT, int fused_too) {
    check_shape(384, 256, fmt, act, mode, Ts, nT, fused_too);
}

/* ---- tests --------------------------------------------------------------------------------- */

static const int T_small[] = {1, 3, 16};
static const int T_all[] = {1, 3, 16, 255, 4096};

static void test_nvfp4_situ_all_T(void **s) {
    (void)s;
    NEED_GPU();
    check_combo(K3_WFMT_NVFP4, K3_ACT_SITU, K3_MODE_W4A16, T_all, 5, 1);
}
static void test_mxfp4_situ_all_T(void **s) {
    (void)s;
    NEED_GPU();
    check_combo(K3_WFMT_MXFP4, K3_ACT_SITU, K3_MODE_W4A16, T_all, 5, 1);
}
static void test_activations_both_formats(void **s) {
    (void)s;
    NEED_GPU();
    static const k3_act acts[] = {K3_ACT_SWIGLU, K3_ACT_GEGLU, K3_ACT_SWIGLU_BIAS, K3_ACT_SILU, K3_ACT_RELU2,
                                  K3_ACT_GELU, K3_ACT_RELU, K3_ACT_IDENTITY};
    static const int Ts[] = {1, 3, 16, 255};
    for (int f = 0; f < 2; f++)
        for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++)
            check_combo(f ? K3_WFMT_MXFP4 : K3_WFMT_NVFP4, acts[a], K3_MODE_W4A16, Ts, 4, 1);
}
static void test_w4a4_nvfp4(void **s) {
    (void)s;
    NEED_GPU();
    static const k3_act acts[] = {K3_ACT_SITU, K3_ACT_SWIGLU, K3_ACT_GEGLU, K3_ACT_SWIGLU_BIAS};
    for (size_t a = 0; a < 4; a++) check_combo(K3_WFMT_NVFP4, acts[a], K3_MODE_W4A4, T_small, 3, 1);
    static const int Tb[] = {255};
    check_combo(K3_WFMT_NVFP4, K3_ACT_SITU, K3_MODE_W4A4, Tb, 1, 0);
}

/* w4a16-bf16 (one fp16 term per activation in the grouped kernels, two in the fused one):
 * every T through the automatic path choice, both formats, gated and plain activations; then
 * the decode-size (mma.sync) path pinned so that every tile width runs: 8, 16, 32 tokens with
 * one term (w4a16-bf16, w4a4), 4, 8, 16 with two (w4a16). */
static void test_w4a16_bf16(void **s) {
    (void)s;
    NEED_GPU();
    for (int f = 0; f < 2; f++) {
        k3_wfmt fmt = f ? K3_WFMT_MXFP4 : K3_WFMT_NVFP4;
        check_combo(fmt, K3_ACT_SITU, K3_MODE_W4A16_BF16, T_all, 5, 1);
        check_combo(fmt, K3_ACT_RELU2, K3_MODE_W4A16_BF16, T_small, 3, 1);
        model m;
        rng_state = 7000 + f;
        model_make(&m, 32, 0, 32, 384, 256, fmt, K3_ACT_SWIGLU);
        k3_cuda_moe *cm = NULL;
        k3_error err = {0};
        assert_int_equal(k3_cuda_moe_create(&m.ex, &cm, &err), K3_OK);
        assert_int_equal(k3_cuda_moe_set_gemm_path(cm, -1, &err), K3_OK);
        static const int Ts[] = {16, 77, 255}; /* ~2, ~10, ~32 tokens per expert at top-4 */
        static const k3_act_mode modes[] = {K3_MODE_W4A16_BF16, K3_MODE_W4A16, K3_MODE_W4A4};
        for (int bands = -1; bands <= 1; bands += 2) { /* FC2's grid in bands of items, and not */
            assert_int_equal(k3_cuda_moe_set_fc2_bands(cm, bands, &err), K3_OK);
            for (int modei = 0; modei < (f ? 2 : 3); modei++)
                for (int i = 0; i < 3; i++) {
                    k3_act_mode mode = modes[modei];
                    double r = run_case(&m, cm, K3_CUDA_GROUPED, mode, Ts[i], 4, ROUTE_RANDOM);
                    printf("  mma.sync %s swiglu %-10s T=%-4d fc2 bands %2d relL2 %.3g (bound %g)\n", f ? "mxfp4" : "nvfp4",
                           k3_act_mode_name(mode), Ts[i], bands, r, mode_bound(mode));
                    assert_true(r <= mode_bound(mode));
                }
        }
        assert_int_equal(k3_cuda_moe_set_fc2_bands(cm, 2, &err), K3_ERR_ARG);
        assert_int_equal(k3_cuda_moe_set_fc2_bands(cm, 0, &err), K3_OK);
        for (int modei = 0; modei < 2; modei++) {
            double r = run_case(&m, cm, K3_CUDA_GROUPED, modes[modei], 300, 1, ROUTE_ONE_EXPERT);
            printf("  mma.sync %s swiglu %s all tokens on one expert T=300 k=1 relL2 %.3g\n", f ? "mxfp4" : "nvfp4",
                   k3_act_mode_name(modes[modei]), r);
            assert_true(r <= mode_bound(modes[modei]));
        }
        k3_cuda_moe_free(cm);
        model_free(&m);
    }
}

/* One case (inputs and reference made once) through every pinned sm_90a GEMM width: the k_wg
 * tiles of 32 tokens and the warp-specialized k_wgp ones of 48, 80, 128 and 160. Returns the runs
 * made. */
static int check_widths(model *m, k3_cuda_moe *cm, const char *what, k3_act_mode mode, int T, int k, int how) {
    static const int widths[] = {32, 48, 80, 128, 160};
    const int n = (int)(sizeof widths / sizeof widths[0]);
    k3_error err = {0};
    kase c;
    case_make(m, mode, T, k, how, &c);
    for (int wi = 0; wi < n; wi++) {
        assert_int_equal(k3_cuda_moe_set_gemm_path(cm, widths[wi], &err), K3_OK);
        double r = case_run(m, cm, K3_CUDA_GROUPED, mode, &c);
        printf("  wgmma %3d %s %-10s T=%-4d k=%d relL2 %.3g (bound %g)\n", widths[wi], what, k3_act_mode_name(mode), T,
               k, r, mode_bound(mode));
        assert_true(r <= mode_bound(mode));
    }
    case_free(&c);
    return n;
}

/* The sm_90a wgmma GEMM paths pinned (k_wg: 32 tokens per tile; the warp-specialized k_wgp: 48,
 * 80, 128 and 160, items split evenly), against the reference:
 * both formats, gated and plain activations, w4a16 with fp32 and bf16-valued inputs, w4a4 and
 * w4a16-bf16 (one term);
 * T from one token to several tiles per expert, enough jobs for several per persistent CTA, all
 * tokens on one expert (items split at the tile width) and empty experts. Bounds as above: the
 * path changes only accumulation order. */
static void test_wgmma_path(void **s) {
    (void)s;
    NEED_GPU();
    static const k3_act acts[] = {K3_ACT_SITU, K3_ACT_SWIGLU_BIAS, K3_ACT_RELU2};
    static const int Ts[] = {1, 3, 77, 300};
    /* K3_CUDA_TEST_QUICK (the compute-sanitizer run of tools/gpu-check): NVFP4 SiTU only */
    const int quick = getenv("K3_CUDA_TEST_QUICK") != NULL;
    int ran = 0;
    for (int f = 0; f < (quick ? 1 : 2); f++)
        for (size_t a = 0; a < (quick ? 1u : 3u); a++) {
            k3_wfmt fmt = f ? K3_WFMT_MXFP4 : K3_WFMT_NVFP4;
            model m;
            rng_state = 5000 + f * 10 + a;
            model_make(&m, 32, 0, 32, 384, 256, fmt, acts[a]);
            k3_cuda_moe *cm = NULL;
            k3_error err = {0};
            assert_int_equal(k3_cuda_moe_create(&m.ex, &cm, &err), K3_OK);
            int rc = k3_cuda_moe_set_gemm_path(cm, 32, &err);
            if (rc == K3_ERR_UNSUPPORTED) {
                printf("SKIP: wgmma path: %s\n", err.msg);
                k3_cuda_moe_free(cm);
                model_free(&m);
                return;
            }
            assert_int_equal(rc, K3_OK);
            /* modes: w4a16 (fp32 and bf16-valued x), w4a16-bf16, w4a4 (NVFP4 only) */
            static const k3_act_mode modes[] = {K3_MODE_W4A16, K3_MODE_W4A16, K3_MODE_W4A16_BF16, K3_MODE_W4A4};
            char what[64];
            for (int mi = 0; mi < (f ? 3 : 4); mi++)
                for (int i = 0; i < 4; i++) {
                    bf16_inputs = mi == 1;
                    snprintf(what, sizeof what, "%s %-11s %s", f ? "mxfp4" : "nvfp4", act_names[acts[a]],
                             mi == 1 ? "bf16-x" : "f32-x ");
                    ran += check_widths(&m, cm, what, modes[mi], Ts[i], 4, ROUTE_RANDOM);
                    bf16_inputs = 0;
                }
            snprintf(what, sizeof what, "%s %-11s one expert", f ? "mxfp4" : "nvfp4", act_names[acts[a]]);
            for (int mi = 0; mi < 3; mi += 2) ran += check_widths(&m, cm, what, modes[mi], 300, 1, ROUTE_ONE_EXPERT);
            /* Several jobs per persistent CTA (k_wgp: ~5-10 at 48 tokens, ~3-5 at 160), so that the
             * per-job shared-memory tables and the stage ring are reused across jobs; the cases
             * above give each CTA at most two. */
            if (a == 0) {
                snprintf(what, sizeof what, "%s %-11s many jobs", f ? "mxfp4" : "nvfp4", act_names[acts[a]]);
                for (int mi = 0; mi < (quick ? 1 : 3); mi += 2)
                    ran += check_widths(&m, cm, what, modes[mi], quick ? 2048 : 4096, 8, ROUTE_RANDOM);
            }
            assert_int_equal(k3_cuda_moe_set_gemm_path(cm, 3, &err), K3_ERR_ARG);
            assert_int_equal(k3_cuda_moe_set_gemm_path(cm, 8, &err), K3_ERR_ARG);
            assert_int_equal(k3_cuda_moe_set_gemm_path(cm, 64, &err), K3_ERR_ARG); /* k_wg 64 retired */
            assert_int_equal(k3_cuda_moe_set_gemm_path(cm, 256, &err), K3_ERR_ARG);
            k3_cuda_moe_free(cm);
            model_free(&m);
        }
    assert_true(ran > 0);
}

static void test_all_tokens_one_expert_and_empty_experts(void **s) {
    (void)s;
    NEED_GPU();
    for (int f = 0; f < 2; f++) {
        model m;
        rng_state = 77 + f;
        model_make(&m, 32, 0, 32, 256, 128, f ? K3_WFMT_MXFP4 : K3_WFMT_NVFP4, K3_ACT_SITU);
        k3_cuda_moe *cm = NULL;
        k3_error err = {0};
        assert_int_equal(k3_cuda_moe_create(&m.ex, &cm, &err), K3_OK);
        static const int how[] = {ROUTE_ONE_EXPERT, ROUTE_TWO_EXPERTS};
        for (int h = 0; h < 2; h++) {
            /* k = 1 and every token on one expert: one expert with 300 tokens, 31 empty */
            int k = how[h] == ROUTE_ONE_EXPERT ? 1 : 2;
            double r = run_case(&m, cm, K3_CUDA_GROUPED, K3_MODE_W4A16, 300, k, how[h]);
            printf("  cuda       %s route %d T=300 k=%d relL2 %.3g\n", f ? "mxfp4" : "nvfp4", h, k, r);
            assert_true(r <= 1e-5);
            r = run_case(&m, cm, K3_CUDA_FUSED, K3_MODE_W4A16, 64, k, how[h]);
            printf("  cuda-fused %s route %d T=64 k=%d relL2 %.3g\n", f ? "mxfp4" : "nvfp4", h, k, r);
            assert_true(r <= 1e-5);
        }
        /* three dispatch blocks' worth of slots (4096 each at most) whose ranges all land on one
         * expert, so the per-block bases must follow each other; w4a16-bf16 too (h in bf16) */
        for (int mi = 0; mi < 2; mi++) {
            const k3_act_mode mode = mi ? K3_MODE_W4A16_BF16 : K3_MODE_W4A16;
            double r = run_case(&m, cm, K3_CUDA_GROUPED, mode, 9000, 1, ROUTE_ONE_EXPERT);
            printf("  cuda       %s one expert T=9000 k=1 %s relL2 %.3g\n", f ? "mxfp4" : "nvfp4",
                   k3_act_mode_name(mode), r);
            assert_true(r <= mode_bound(mode));
        }
        k3_cuda_moe_free(cm);
        model_free(&m);
    }
}

/* A wider shape than the other cases (64 FC1 and 128 FC2 tiles per expert, 16 and 8 k-chunks):
 * T = 1 takes the in-CTA K split (T*k <= 64) on both halves of every tile, T = 16 whole-K
 * tiles; both backends. */
static void test_larger_shape(void **s) {
    (void)s;
    NEED_GPU();
    static const int Ts[] = {1, 16};
    check_shape(2048, 1024, K3_WFMT_NVFP4, K3_ACT_SITU, K3_MODE_W4A16, Ts, 2, 1);
}

/* Uneven expert-parallel split of 32 experts as [0, 11) and [11, 32): each rank matches the
 * reference over its own experts, and the two partial outputs sum to the full result. T = 16
 * on both backends, T = 2500 (10000 slots: three dispatch blocks, each seeing slots of the other
 * rank) on the grouped one. */
static void ep_split(int T, int backends) {
    const int E = 32, H = 256, I = 128, k = 4;
    model full;
    rng_state = 4242;
    model_make(&full, E, 0, E, H, I, K3_WFMT_NVFP4, K3_ACT_SITU);
    float *x = malloc(sizeof(float) * T * H), *w = malloc(sizeof(float) * T * k);
    float *y0 = malloc(sizeof(float) * T * H), *y1 = malloc(sizeof(float) * T * H), *ys = malloc(sizeof(float) * T * H);
    int32_t *ids = malloc(sizeof(int32_t) * T * k);
    double *ref = malloc(sizeof(double) * T * H);
    for (int i = 0; i < T * H; i++) x[i] = (float)(urand() * 2 - 1);
    make_routing(T, k, E, ROUTE_RANDOM, ids, w);
    ref_run(&full, K3_MODE_W4A16, x, T, ids, w, k, ref);
    static const int first[2] = {0, 11}, nloc[2] = {11, 21};
    for (int b = 0; b < backends; b++) {
        for (int r = 0; r < 2; r++) {
            model part = full;
            k3_error err = {0};
            assert_int_equal(k3_experts_view(&full.ex, first[r], nloc[r], &part.ex, &err), K3_OK);
            k3_cuda_moe *cm = NULL;
            assert_int_equal(k3_cuda_moe_create(&part.ex, &cm, &err), K3_OK);
            float *y = r ? y1 : y0;
            for (int i = 0; i < T * H; i++) y[i] = NAN;
            assert_int_equal(k3_cuda_moe_run_host(cm, (k3_cuda_backend)b, K3_MODE_W4A16, x, T, ids, w, k, y, &err), K3_OK);
            double *rr = malloc(sizeof(double) * T * H);
            ref_run(&part, K3_MODE_W4A16, x, T, ids, w, k, rr);
            double e = rel_l2(y, rr, (size_t)T * H);
            printf("  %s T=%d rank %d (experts [%d, %d)) relL2 %.3g\n", b ? "cuda-fused" : "cuda", T, r, first[r],
                   first[r] + nloc[r], e);
            assert_true(e <= 1e-5);
            free(rr);
            k3_cuda_moe_free(cm);
        }
        for (int i = 0; i < T * H; i++) ys[i] = y0[i] + y1[i];
        double e = rel_l2(ys, ref, (size_t)T * H);
        printf("  %s T=%d rank sum relL2 %.3g\n", b ? "cuda-fused" : "cuda", T, e);
        assert_true(e <= 1e-5);
    }
    free(x), free(w), free(y0), free(y1), free(ys), free(ids), free(ref);
    model_free(&full);
}

static void test_ep_rank_subsets(void **s) {
    (void)s;
    NEED_GPU();
    ep_split(16, 2);
    ep_split(2500, 1);
}

static void test_explicit_errors(void **s) {
    (void)s;
    NEED_GPU();
    model m;
    rng_state = 9;
    model_make(&m, 16, 0, 16, 256, 128, K3_WFMT_MXFP4, K3_ACT_SWIGLU);
    k3_cuda_moe *cm = NULL;
    k3_error err = {0};
    assert_int_equal(k3_cuda_moe_create(&m.ex, &cm, &err), K3_OK);
    assert_int_equal(k3_cuda_moe_check(cm, K3_CUDA_FUSED, K3_MODE_W4A16, 65, 4, &err), K3_ERR_LIMIT);
    printf("  %s\n", err.msg);
    assert_int_equal(k3_cuda_moe_check(cm, K3_CUDA_GROUPED, K3_MODE_W4A4, 1, 4, &err), K3_ERR_UNSUPPORTED);
    printf("  %s\n", err.msg);
    assert_int_equal(k3_cuda_moe_check(cm, K3_CUDA_GROUPED, K3_MODE_W4A8, 1, 4, &err), K3_ERR_UNSUPPORTED);
    assert_int_equal(k3_cuda_moe_check(cm, K3_CUDA_GROUPED, K3_MODE_W4A16, 1, K3_CUDA_MAX_TOPK + 1, &err), K3_ERR_LIMIT);
    float x[256] = {0}, y[256], w[2] = {1, 1};
    int32_t ids[2] = {3, 16};
    assert_int_equal(k3_cuda_moe_run_host(cm, K3_CUDA_GROUPED, K3_MODE_W4A16, x, 1, ids, w, 2, y, &err), K3_ERR_ARG);
    printf("  %s\n", err.msg);
    /* missing arrays, and rows not 16-byte aligned: refused before anything is read (the pointers
     * are never touched) */
    assert_int_equal(k3_cuda_moe_run(cm, K3_CUDA_GROUPED, K3_MODE_W4A16, NULL, 1, NULL, NULL, 2, NULL, NULL, &err),
                     K3_ERR_ARG);
    printf("  %s\n", err.msg);
    for (int b = 0; b < 2; b++) {
        const float *dx = (const float *)(uintptr_t)(b ? 0x10000 : 0x10004);
        float *dy = (float *)(uintptr_t)(b ? 0x20008 : 0x20000);
        assert_int_equal(k3_cuda_moe_run(cm, K3_CUDA_GROUPED, K3_MODE_W4A16, dx, 1, (const int32_t *)(uintptr_t)0x30000,
                                         (const float *)(uintptr_t)0x40000, 2, dy, NULL, &err),
                         K3_ERR_ARG);
        printf("  %s\n", err.msg);
    }
    k3_cuda_moe_free(cm);
    /* a width the kernels cannot tile */
    m.ex.hidden = 200;
    assert_int_equal(k3_cuda_moe_create(&m.ex, &cm, &err), K3_ERR_SHAPE);
    printf("  %s\n", err.msg);
    m.ex.hidden = 256;
    /* SiTU without its betas */
    m.ex.act.act = K3_ACT_SITU;
    m.ex.act.alpha = m.ex.act.beta = NULL;
    assert_int_equal(k3_cuda_moe_create(&m.ex, &cm, &err), K3_ERR_MISSING);
    printf("  %s\n", err.msg);
    model_free(&m);
}

/* Where no device is usable (this CI machine, a build without nvcc), every entry point of
 * the boundary answers with an error that says so: no crash, no silent CPU fallback. */
static void test_without_gpu_errors(void **s) {
    (void)s;
    if (have_gpu()) {
        printf("SKIP: a CUDA device is present (%s); this test covers machines without one\n", gpu_name);
        skip();
    }
    model m;
    rng_state = 11;
    model_make(&m, 8, 0, 8, 128, 128, K3_WFMT_NVFP4, K3_ACT_SITU);
    k3_cuda_moe *cm = (k3_cuda_moe *)&m; /* must be overwritten with NULL */
    k3_error err = {0};
    int rc = k3_cuda_moe_create(&m.ex, &cm, &err);
    printf("  create: %s\n", err.msg);
    assert_int_not_equal(rc, K3_OK);
    assert_null(cm);
    assert_non_null(strstr(err.msg, "cuda"));
    err = (k3_error){0};
    assert_int_not_equal(k3_cuda_moe_set_gemm_path(NULL, 0, &err), K3_OK);
    assert_int_not_equal(k3_cuda_moe_set_fc2_bands(NULL, 0, &err), K3_OK);
    assert_true(err.msg[0] != 0);
    double v = -1;
    err = (k3_error){0};
    assert_int_not_equal(k3_cuda_bf16_peak(&v, &err), K3_OK);
    assert_true(v == 0 && err.msg[0] != 0);
    printf("  bf16 peak: %s\n", err.msg);
    err = (k3_error){0};
    assert_int_not_equal(k3_cuda_copy_bandwidth(1 << 20, 1, &v, &err), K3_OK);
    assert_true(v == 0 && err.msg[0] != 0);
    printf("  copy bandwidth: %s\n", err.msg);
    k3_cuda_bench_opts o = {.n_experts = 8, .hidden = 128, .inter = 128, .top_k = 2, .fmt = K3_WFMT_NVFP4,
                            .act = K3_ACT_SITU, .mode = K3_MODE_W4A16};
    k3_cuda_bench *b = NULL;
    err = (k3_error){0};
    assert_int_not_equal(k3_cuda_bench_open(&o, &b, &err), K3_OK);
    assert_null(b);
    printf("  bench: %s\n", err.msg);
    model_free(&m);
}

/* noaux_tc: sigmoid, top-k of s + bias, weights from s renormalized and scaled. */
static void test_route_noaux_tc(void **s) {
    (void)s;
    NEED_GPU();
    const int T = 37, E = 896, k = 16;
    float *lg = malloc(sizeof(float) * T * E), *bias = malloc(sizeof(float) * E), *w = malloc(sizeof(float) * T * k);
    int32_t *ids = malloc(sizeof(int32_t) * T * k);
    rng_state = 5;
    for (int i = 0; i < T * E; i++) lg[i] = (float)(urand() * 8 - 4);
    for (int e = 0; e < E; e++) bias[e] = (float)(urand() * 0.2 - 0.1);
    k3_error err = {0};
    assert_int_equal(k3_cuda_route_noaux_tc_host(lg, T, E, bias, k, 1, 2.5f, ids, w, &err), K3_OK);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        double sc[896], b[896];
        int taken[896] = {0};
        for (int e = 0; e < E; e++) sc[e] = 1 / (1 + exp(-(double)lg[t * E + e])), b[e] = sc[e] + bias[e];
        double sum = 0;
        int sel[16];
        for (int j = 0; j < k; j++) {
            int bi = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (bi < 0 || b[e] > b[bi])) bi = e;
            taken[bi] = 1;
            sel[j] = bi;
            sum += sc[bi];
        }
        for (int j = 0; j < k; j++) {
            assert_int_equal(ids[t * k + j], sel[j]);
            double ref = sc[sel[j]] / (sum + 1e-20) * 2.5;
            double d = fabs(w[t * k + j] - ref) / ref;
            if (!(d <= worst)) worst = d;
        }
    }
    printf("  route noaux_tc T=%d E=%d k=%d: ids exact, weights max rel err %.3g (bound 1e-6)\n", T, E, k, worst);
    assert_true(worst <= 1e-6);
    /* a missing array is refused, not faulted on (the bias may be NULL) */
    assert_int_equal(k3_cuda_route_noaux_tc(NULL, T, E, NULL, k, 1, 2.5f, NULL, NULL, NULL, &err), K3_ERR_ARG);
    printf("  %s\n", err.msg);
    free(lg), free(bias), free(w), free(ids);
}

static void test_reports_device(void **s) {
    (void)s;
    if (!have_gpu()) {
        printf("SKIP: no CUDA device (%s)\n", gpu_name);
        /* without a device every entry point must refuse with K3_ERR_DEVICE, never crash */
        model m;
        rng_state = 1;
        model_make(&m, 4, 0, 4, 128, 128, K3_WFMT_NVFP4, K3_ACT_SWIGLU);
        k3_cuda_moe *cm = (k3_cuda_moe *)&m;
        k3_error err = {0};
        assert_int_equal(k3_cuda_moe_create(&m.ex, &cm, &err), K3_ERR_DEVICE);
        assert_null(cm);
        printf("  %s\n", err.msg);
        model_free(&m);
        return;
    }
    printf("  device: %s\n", gpu_name);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reports_device),
        cmocka_unit_test(test_route_noaux_tc),
        cmocka_unit_test(test_explicit_errors),
        cmocka_unit_test(test_without_gpu_errors),
        cmocka_unit_test(test_nvfp4_situ_all_T),
        cmocka_unit_test(test_mxfp4_situ_all_T),
        cmocka_unit_test(test_activations_both_formats),
        cmocka_unit_test(test_w4a4_nvfp4),
        cmocka_unit_test(test_w4a16_bf16),
        cmocka_unit_test(test_all_tokens_one_expert_and_empty_experts),
        cmocka_unit_test(test_ep_rank_subsets),
        cmocka_unit_test(test_larger_shape),
        cmocka_unit_test(test_wgmma_path),
    };
    /* tools/gpu-check runs one small case under compute-sanitizer with this filter */
    const char *f = getenv("K3_CUDA_TEST_FILTER");
    if (f && *f) cmocka_set_test_filter(f);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
