/* The fast CPU routed-expert operator (moe_cpu.h): validation, the counting sort of
 * (token, slot) pairs by expert, the four parallel phases and the weighted finalize.
 *
 * Phases, each one parallel-for over independent outputs (so no result depends on the
 * thread count or the schedule):
 *  1. inputs: every token row converted once into the kernel's input layout (and, in
 *     W4A4/W4A8, quantized and dequantized exactly as the emulated hardware would; in
 *     W4A16_BF16, rounded to bf16);
 *  2. FC1: passes (active expert, 2 gate/up row pairs or 4 rows) over all experts in order,
 *     each for all of the expert's tokens and each prefetching the next pass's rows; each row
 *     of w1 (and w3 when gated) is decoded once per K3_CPU_NT tokens and the activation is
 *     applied at once (without a rows kernel or with float64 sums: items of FC1_ROWS rows);
 *  3. the hidden rows converted like the inputs (quantized with g2 in W4A4/W4A8, rounded to
 *     bf16 from their fp32 values in W4A16_BF16);
 *  4. FC2: passes of K3_CPU_NR output rows the same way (items of FC2_ROWS rows without a
 *     rows kernel);
 *  5. finalize: y[t] = sum of w[t, slot] * row(t, slot) over the local slots, in slot order.
 * Scratch (a few hundred kilobytes at T = 1) comes from the pool's workspace, so repeated
 * calls do not fault in fresh pages; it is sized for R = T*k rows up front. */
#include "moe/moe_cpu.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "formats/block.h"
#include "moe/activation.h"
#include "moe/cpu_kern.h"
#include "formats/fp.h"

#define FC1_ROWS 8  /* FC1 rows per work item (x2 matrices when gated) */
#define FC2_ROWS 16 /* FC2 rows per work item */

static const char *const isa_names[K3_ISA_COUNT] = {"auto", "scalar", "avx2", "avx512"};

const char *k3_cpu_isa_name(k3_cpu_isa isa) {
    return (unsigned)isa < K3_ISA_COUNT ? isa_names[isa] : "invalid";
}

int k3_cpu_isa_available(k3_cpu_isa isa) {
    switch (isa) {
    case K3_ISA_AUTO:
    case K3_ISA_SCALAR: return 1;
#if defined(__x86_64__)
    case K3_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case K3_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
#endif
    default: return 0;
    }
}

k3_cpu_isa k3_cpu_isa_best(void) {
    if (k3_cpu_isa_available(K3_ISA_AVX512)) return K3_ISA_AVX512;
    if (k3_cpu_isa_available(K3_ISA_AVX2)) return K3_ISA_AVX2;
    return K3_ISA_SCALAR;
}

typedef struct plan {
    const k3_experts *ex;
    k3_act_mode mode;
    k3_dot_fn dot;
    k3_dot64_fn dot64; /* FC1 in W4A4/W4A8 */
    k3_rows64_fn rows64; /* FC1 in W4A4/W4A8, experts with one token, or NULL */
    k3_rows_fn rows;   /* experts with one token: several rows per pass, or NULL */
    k3_situ_fn situ;   /* vector SiTU for the one-token path, or NULL */
    int layout; /* k3_fp4_layout of the kernel's inputs for this format */
    bool gated;
    int64_t H, I;
    int T, k;
    const float *x, *w;
    float *y;
    int n_act;          /* experts with at least one row */
    int *act_e;         /* [n_act] local expert index */
    int64_t *off;       /* [n_act + 1] first sorted row of each active expert */
    int32_t *row_tok;   /* [R] token of each sorted row */
    int64_t *slot_row;  /* [T*k] sorted row of each (token, slot), -1 when not local */
    float *xin;         /* [T, H] inputs in kernel layout */
    float *h;           /* [R, I] hidden rows */
    float *y2;          /* [R, H] FC2 rows */
    float g1, g2;       /* W4A4: activation global scales (1/max input_scale) */
    float in1, in2;     /* factor restoring the activations' scale: 1/g in W4A4, else 1 */
    double in1d;        /* 1/g1 in float64 (the emulation divides by g1 in float64) */
    int64_t fc1_blocks, fc2_blocks; /* per expert */
    int64_t fc1_passes, fc2_passes; /* one-token path: passes over all active experts */
    float *scratch;     /* per thread: 2 * max(H, I) floats */
    int64_t scratch_stride;
} plan;

static int64_t row_bytes(const k3_qmat *m) {
    switch (m->fmt) {
    case K3_WFMT_NVFP4:
    case K3_WFMT_MXFP4: return m->cols / 2;
    case K3_WFMT_BF16: return m->cols * 2;
    default: return m->cols * 4;
    }
}

static int64_t scale_cols(const k3_qmat *m) {
    return m->fmt == K3_WFMT_NVFP4 ? m->cols / 16 : m->fmt == K3_WFMT_MXFP4 ? m->cols / 32 : 0;
}

static inline const uint8_t *row_data(const k3_qmat *m, int64_t r) {
    return (const uint8_t *)m->data + r * row_bytes(m);
}

static inline const uint8_t *row_scale(const k3_qmat *m, int64_t r) {
    return m->scale ? (const uint8_t *)m->scale + r * scale_cols(m) : NULL;
}

/* The FC1 rows of outputs i..i+m-1 of expert E in the order the rows kernel takes them (w1 and,
 * when gated, w3 of each output in turn); returns how many rows. */
static int fc1_rows(const k3_expert *E, bool gated, int64_t i, int m, const uint8_t **qs, const uint8_t **ss) {
    int n = 0;
    for (int j = 0; j < m; j++) {
        qs[n] = row_data(&E->w1, i + j);
        ss[n++] = row_scale(&E->w1, i + j);
        if (gated) {
            qs[n] = row_data(&E->w3, i + j);
            ss[n++] = row_scale(&E->w3, i + j);
        }
    }
    return n;
}

static float out_scale(const k3_qmat *m) { return m->fmt == K3_WFMT_NVFP4 ? m->global_scale : 1.0f; }

/* One activation row (natural order, n long) into the kernel layout, through the
 * mode's quantizer: W4A4 keeps code * block scale (exact; 1/g is applied after the dot),
 * W4A8 keeps the exact MXFP8 value, W4A16_BF16 the bf16 value. tmp holds 2n floats. */
static void convert_row(const plan *p, const float *in, int64_t n, float g, float *out,
                        float *tmp) {
    const float *src = in;
    if (p->mode == K3_MODE_W4A4) {
        uint8_t *q = (uint8_t *)tmp, *s = q + n / 2;
        k3_nvfp4_quantize_act_row(in, n, g, q, s);
        float *d = tmp + n;
        for (int64_t i = 0; i < n; i++)
            d[i] = k3_e2m1_lut[(q[i / 2] >> (4 * (i & 1))) & 15] * k3_e4m3_lut[s[i / 16]];
        src = d;
    } else if (p->mode == K3_MODE_W4A8) {
        uint8_t *q = (uint8_t *)tmp, *s = q + n;
        float *d = tmp + n;
        k3_mxfp8_quantize_row(in, n, q, s);
        k3_mxfp8_dequantize_row(q, s, n, d);
        src = d;
    } else if (p->mode == K3_MODE_W4A16_BF16) {
        float *d = tmp + n;
        for (int64_t i = 0; i < n; i++) d[i] = k3_bf16_to_f32(k3_f32_to_bf16(in[i]));
        src = d;
    }
    if (src == out && p->layout == K3_FP4_NATURAL) return;
    if (src == out) { /* permute in place through tmp */
        memcpy(tmp, src, (size_t)n * sizeof *tmp);
        src = tmp;
    }
    for (int64_t i = 0; i < n; i++) out[k3_cpu_pos(i, n, p->layout)] = src[i];
}

static float *thread_tmp(const plan *p, int thread) {
    return p->scratch + (int64_t)thread * p->scratch_stride;
}

static void phase_inputs(void *ctx, int64_t b, int64_t e, int thread) {
    const plan *p = ctx;
    for (int64_t t = b; t < e; t++)
        convert_row(p, p->x + t * p->H, p->H, p->g1, p->xin + t * p->H, thread_tmp(p, thread));
}

static void phase_hidden(void *ctx, int64_t b, int64_t e, int thread) {
    const plan *p = ctx;
    for (int64_t r = b; r < e; r++) {
        float *row = p->h + r * p->I;
        convert_row(p, row, p->I, p->g2, row, thread_tmp(p, thread));
    }
}

/* An expert's FC1 outputs i .. i + m - 1 for its n tokens (sorted rows r0 ..): each row of w1
 * (and w3) decoded once per K3_CPU_NT tokens by the dot kernel, the activation applied as the
 * values come; in W4A4 / W4A8 with float64 sums and activation (dot64, see cpu_kern.h). */
static void fc1_dot(const plan *p, int le, int64_t r0, int64_t n, int64_t i, int m) {
    const k3_expert *E = &p->ex->e[le];
    const bool f64 = p->dot64 != NULL;
    const float s1 = out_scale(&E->w1) * p->in1, s3 = p->gated ? out_scale(&E->w3) * p->in1 : 0;
    const double d1 = (double)out_scale(&E->w1) * p->in1d;
    const double d3 = p->gated ? (double)out_scale(&E->w3) * p->in1d : 0;
    for (int j = 0; j < m; j++)
        for (int64_t t0 = r0; t0 < r0 + n; t0 += K3_CPU_NT) {
            int nt = (int)(r0 + n - t0 < K3_CPU_NT ? r0 + n - t0 : K3_CPU_NT);
            const float *xs[K3_CPU_NT];
            const uint8_t *q1 = row_data(&E->w1, i + j), *c1 = row_scale(&E->w1, i + j);
            const uint8_t *q3 = p->gated ? row_data(&E->w3, i + j) : NULL;
            const uint8_t *c3 = p->gated ? row_scale(&E->w3, i + j) : NULL;
            float *h = p->h + t0 * p->I + i + j;
            for (int t = 0; t < nt; t++) xs[t] = p->xin + (int64_t)p->row_tok[t0 + t] * p->H;
            if (f64) {
                double g[K3_CPU_NT], u[K3_CPU_NT] = {0};
                p->dot64(q1, c1, p->H, xs, nt, g);
                if (p->gated) p->dot64(q3, c3, p->H, xs, nt, u);
                for (int t = 0; t < nt; t++)
                    h[t * p->I] = (float)k3_act_f64(&p->ex->act, le, g[t] * d1, u[t] * d3);
            } else {
                float g[K3_CPU_NT], u[K3_CPU_NT] = {0};
                p->dot(q1, c1, p->H, xs, nt, g);
                if (p->gated) p->dot(q3, c3, p->H, xs, nt, u);
                for (int t = 0; t < nt; t++)
                    h[t * p->I] = k3_act_f32(&p->ex->act, le, g[t] * s1, u[t] * s3);
            }
        }
}

/* An expert's FC2 outputs n0 .. n0 + m - 1 for its tokens, dot kernel. */
static void fc2_dot(const plan *p, int a, int64_t n0, int m) {
    const k3_qmat *w2 = &p->ex->e[p->act_e[a]].w2;
    float s2 = out_scale(w2) * p->in2;
    int64_t r0 = p->off[a], r1 = p->off[a + 1];
    for (int j = 0; j < m; j++)
        for (int64_t t0 = r0; t0 < r1; t0 += K3_CPU_NT) {
            int nt = (int)(r1 - t0 < K3_CPU_NT ? r1 - t0 : K3_CPU_NT);
            const float *xs[K3_CPU_NT];
            float v[K3_CPU_NT];
            for (int t = 0; t < nt; t++) xs[t] = p->h + (t0 + t) * p->I;
            p->dot(row_data(w2, n0 + j), row_scale(w2, n0 + j), p->I, xs, nt, v);
            for (int t = 0; t < nt; t++) p->y2[(t0 + t) * p->H + n0 + j] = v[t] * s2;
        }
}

/* Without a rows kernel (scalar, BF16 and F32 banks; FC1 also without a float64 one): items =
 * (active expert, block of rows), all of the expert's tokens per decoded row. */
static void phase_fc1(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const plan *p = ctx;
    for (int64_t item = b; item < e; item++) {
        int a = (int)(item / p->fc1_blocks);
        int64_t i0 = (item % p->fc1_blocks) * FC1_ROWS, i1 = i0 + FC1_ROWS;
        if (i1 > p->I) i1 = p->I;
        int64_t r0 = p->off[a], n = p->off[a + 1] - r0;
        fc1_dot(p, p->act_e[a], r0, n, i0, (int)(i1 - i0));
    }
}

static void phase_fc2(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const plan *p = ctx;
    for (int64_t item = b; item < e; item++) {
        int a = (int)(item / p->fc2_blocks);
        int64_t n0 = (item % p->fc2_blocks) * FC2_ROWS, n1 = n0 + FC2_ROWS;
        if (n1 > p->H) n1 = p->H;
        fc2_dot(p, a, n0, (int)(n1 - n0));
    }
}

/* With a rows kernel (AVX2, AVX-512 on 4-bit banks) the work is a flat sequence of passes,
 * pass = (active expert, group of rows) for all of the expert's tokens, walked in order so
 * each pass can prefetch the rows of the pass after it, across expert boundaries too. An
 * expert with one token goes through the rows kernel, which paces those prefetches over its
 * own stream; one with several through the dot kernel, K3_CPU_NT tokens per decoded row,
 * after prefetching the next pass's rows at once (it spends several FMAs per weight byte, so
 * the burst has time to land). Before, only a call whose every expert had one token took
 * passes: T = 8 under uniform routing almost always has a shared expert and ran the item
 * path at 45% of the read bandwidth (72-73% now, docs/BENCHMARKS.md). */
#define PASS_CHUNK 256 /* passes per dynamic grab: a thread's stream jumps (and its next-pass
                        * prefetch misses) once per grab; 16 cost ~25% at T = 1 on 2 threads */

static void prefetch_rows(const uint8_t *const *q, const uint8_t *const *s, int n, int64_t qbytes,
                          int64_t sbytes) {
    for (int r = 0; r < n; r++) {
        for (int64_t o = 0; o < qbytes; o += 64) __builtin_prefetch(q[r] + o);
        for (int64_t o = 0; s[r] && o < sbytes; o += 64) __builtin_prefetch(s[r] + o);
    }
}

/* FC1 pass: gate and up rows of 2 outputs (gated) or 4 outputs; returns the outputs. */
static int fc1_pass_rows(const plan *p, int64_t pass, const uint8_t **qs, const uint8_t **ss,
                         int *a_out, int64_t *i_out) {
    int per = p->gated ? 2 : 4;
    int64_t ppe = (p->I + per - 1) / per;
    int a = (int)(pass / ppe);
    int64_t i = (pass % ppe) * per;
    const k3_expert *E = &p->ex->e[p->act_e[a]];
    int m = (int)(p->I - i < per ? p->I - i : per);
    fc1_rows(E, p->gated, i, m, qs, ss);
    *a_out = a;
    *i_out = i;
    return m;
}

/* The hidden values of a run of consecutive outputs of one expert, activated together
 * (the vector SiTU wants 16 at a time; the rows kernel yields 2 or 4 per pass). */
typedef struct act_run {
    float g[16], u[16];
    int n, le;
    float *dst; /* h of the run's first output */
} act_run;

static void act_flush(const plan *p, act_run *b) {
    const k3_act_params *ap = &p->ex->act;
    if (b->n && p->situ && ap->act == K3_ACT_SITU)
        p->situ(b->g, b->u, b->n, ap->alpha[b->le], ap->beta[b->le], b->dst);
    else
        for (int j = 0; j < b->n; j++) b->dst[j] = k3_act_f32(ap, b->le, b->g[j], b->u[j]);
    b->n = 0;
}

static void phase_fc1_pass(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const plan *p = ctx;
    const k3_experts *ex = p->ex;
    int64_t n_pass = p->fc1_passes;
    act_run run = {.n = 0};
    for (int64_t pass = b; pass < e; pass++) {
        const uint8_t *qs[K3_CPU_NR], *ss[K3_CPU_NR], *nq[K3_CPU_NR] = {0}, *ns[K3_CPU_NR] = {0};
        int a, an, mn = 0;
        int64_t i, in;
        int m = fc1_pass_rows(p, pass, qs, ss, &a, &i);
        if (pass + 1 < n_pass) mn = fc1_pass_rows(p, pass + 1, nq, ns, &an, &in);
        int le = p->act_e[a];
        const k3_expert *E = &ex->e[le];
        int64_t r0 = p->off[a], n = p->off[a + 1] - r0;
        const float *xr = p->xin + (int64_t)p->row_tok[r0] * p->H;
        if (n > 1) {
            prefetch_rows(nq, ns, p->gated ? 2 * mn : mn, row_bytes(&E->w1), scale_cols(&E->w1));
            fc1_dot(p, le, r0, n, i, m);
            continue;
        }
        if (p->dot64) { /* W4A4 / W4A8: float64 sums and activation, as fc1_dot */
            double d1 = (double)out_scale(&E->w1) * p->in1d, vd[K3_CPU_NR];
            double d3 = p->gated ? (double)out_scale(&E->w3) * p->in1d : 0;
            p->rows64(qs, ss, p->gated ? 2 * m : m, p->H, xr, vd, pass + 1 < n_pass ? nq : NULL,
                      pass + 1 < n_pass ? ns : NULL);
            for (int j = 0; j < m; j++) {
                double g = vd[p->gated ? 2 * j : j] * d1, u = p->gated ? vd[2 * j + 1] * d3 : 0;
                p->h[r0 * p->I + i + j] = (float)k3_act_f64(&ex->act, le, g, u);
            }
            continue;
        }
        float s1 = out_scale(&E->w1) * p->in1, s3 = p->gated ? out_scale(&E->w3) * p->in1 : 0;
        float v[K3_CPU_NR];
        p->rows(qs, ss, p->gated ? 2 * m : m, p->H, xr, v, pass + 1 < n_pass ? nq : NULL,
                pass + 1 < n_pass ? ns : NULL);
        float *dst = p->h + r0 * p->I + i;
        if (run.n && (run.le != le || run.dst + run.n != dst || run.n + m > 16)) act_flush(p, &run);
        if (!run.n) {
            run.le = le;
            run.dst = dst;
        }
        for (int j = 0; j < m; j++, run.n++) {
            run.g[run.n] = v[p->gated ? 2 * j : j] * s1;
            run.u[run.n] = p->gated ? v[2 * j + 1] * s3 : 0;
        }
    }
    act_flush(p, &run);
}

/* FC2 pass: K3_CPU_NR consecutive output rows of one expert. */
static int fc2_pass_rows(const plan *p, int64_t pass, const uint8_t **qs, const uint8_t **ss,
                         int *a_out, int64_t *n_out) {
    int64_t ppe = (p->H + K3_CPU_NR - 1) / K3_CPU_NR;
    int a = (int)(pass / ppe);
    int64_t n = (pass % ppe) * K3_CPU_NR;
    const k3_qmat *w2 = &p->ex->e[p->act_e[a]].w2;
    int m = (int)(p->H - n < K3_CPU_NR ? p->H - n : K3_CPU_NR);
    for (int j = 0; j < m; j++) {
        qs[j] = row_data(w2, n + j);
        ss[j] = row_scale(w2, n + j);
    }
    *a_out = a;
    *n_out = n;
    return m;
}

static void phase_fc2_pass(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const plan *p = ctx;
    int64_t n_pass = p->fc2_passes;
    for (int64_t pass = b; pass < e; pass++) {
        const uint8_t *qs[K3_CPU_NR], *ss[K3_CPU_NR], *nq[K3_CPU_NR] = {0}, *ns[K3_CPU_NR] = {0};
        int a, an, mn = 0;
        int64_t n, nn;
        int m = fc2_pass_rows(p, pass, qs, ss, &a, &n);
        if (pass + 1 < n_pass) mn = fc2_pass_rows(p, pass + 1, nq, ns, &an, &nn);
        const k3_qmat *w2 = &p->ex->e[p->act_e[a]].w2;
        float s2 = out_scale(w2) * p->in2, v[K3_CPU_NR]; /* 1/g2 in W4A4 (FC2 sums in float) */
        int64_t r0 = p->off[a], nr = p->off[a + 1] - r0;
        if (nr > 1) {
            prefetch_rows(nq, ns, mn, row_bytes(w2), scale_cols(w2));
            fc2_dot(p, a, n, m);
            continue;
        }
        p->rows(qs, ss, m, p->I, p->h + r0 * p->I, v, pass + 1 < n_pass ? nq : NULL,
                pass + 1 < n_pass ? ns : NULL);
        for (int j = 0; j < m; j++) p->y2[r0 * p->H + n + j] = v[j] * s2;
    }
}

static void phase_finalize(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const plan *p = ctx;
    for (int64_t t = b; t < e; t++) {
        float *yt = p->y + t * p->H;
        memset(yt, 0, (size_t)p->H * sizeof *yt);
        for (int s = 0; s < p->k; s++) {
            int64_t r = p->slot_row[t * p->k + s];
            if (r < 0) continue;
            float wt = p->w[t * p->k + s];
            const float *src = p->y2 + r * p->H;
            for (int64_t c = 0; c < p->H; c++) yt[c] += wt * src[c];
        }
    }
}

static const k3_cpu_kern *kern_for(k3_cpu_isa isa) {
    switch (isa) {
    case K3_ISA_AVX2: return &k3_cpu_kern_avx2;
    case K3_ISA_AVX512: return &k3_cpu_kern_avx512;
    default: return &k3_cpu_kern_scalar;
    }
}

static int check_mat(const k3_qmat *m, const char *name, int e_global, k3_wfmt fmt,
                     int64_t rows, int64_t cols, k3_error *err) {
    if (m->fmt != fmt)
        return k3_fail(err, K3_ERR_UNSUPPORTED,
                       "experts.%d.%s: expected %s like expert 0's w1 (one format per call), "
                       "found %s", e_global, name, k3_wfmt_name(fmt), k3_wfmt_name(m->fmt));
    if (m->rows != rows || m->cols != cols)
        return k3_fail(err, K3_ERR_SHAPE, "experts.%d.%s: expected [%lld, %lld], found [%lld, %lld]",
                       e_global, name, (long long)rows, (long long)cols, (long long)m->rows,
                       (long long)m->cols);
    if (!m->data || ((fmt == K3_WFMT_NVFP4 || fmt == K3_WFMT_MXFP4) && !m->scale))
        return k3_fail(err, K3_ERR_MISSING, "experts.%d.%s: %s is NULL", e_global, name,
                       m->data ? "scale" : "data");
    int blk = fmt == K3_WFMT_NVFP4 ? 16 : fmt == K3_WFMT_MXFP4 ? 32 : 1;
    if (cols % blk)
        return k3_fail(err, K3_ERR_SHAPE, "experts.%d.%s: %s needs columns %% %d == 0, found %lld",
                       e_global, name, k3_wfmt_name(fmt), blk, (long long)cols);
    if (fmt == K3_WFMT_NVFP4 && !(isfinite(m->global_scale) && m->global_scale > 0))
        return k3_fail(err, K3_ERR_NUMERIC,
                       "experts.%d.%s.weight_scale_2: expected finite > 0, found %g", e_global,
                       name, (double)m->global_scale);
    return K3_OK;
}

/* Max of a projection's input_scale over the local experts (W4A4's 1/g). */
static int max_input_scale(const k3_experts *ex, int which, float *out, k3_error *err) {
    float m = 0;
    for (int le = 0; le < ex->n_local; le++) {
        const k3_qmat *q = which == 1 ? &ex->e[le].w1 : &ex->e[le].w2;
        float s = q->input_scale;
        if (!(isfinite(s) && s > 0))
            return k3_fail(err, K3_ERR_MISSING,
                           "experts.%d.w%d.input_scale: W4A4 needs a finite value > 0, found %g",
                           ex->first_local + le, which, (double)s);
        if (s > m) m = s;
    }
    *out = m;
    return K3_OK;
}

static int validate(const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                    const int32_t *ids, const float *w, int k, const float *y, k3_error *err) {
    if (!ex) return k3_fail(err, K3_ERR_ARG, "experts: NULL");
    if ((unsigned)mode >= K3_MODE_COUNT)
        return k3_fail(err, K3_ERR_ARG, "mode: expected w4a16, w4a4, w4a8 or w4a16-bf16, found %d",
                       (int)mode);
    if (T < 0) return k3_fail(err, K3_ERR_ARG, "T: expected >= 0, found %d", T);
    if (k < 1) return k3_fail(err, K3_ERR_ARG, "k: expected >= 1, found %d", k);
    if (T > 0 && (!x || !ids || !w || !y))
        return k3_fail(err, K3_ERR_ARG, "%s: NULL with T = %d", !x ? "x" : !ids ? "ids" : !w ? "w" : "y", T);
    int rc = k3_experts_validate(ex, mode, err); /* geometry, activation params, mode rules */
    if (rc) return rc;
    if ((rc = k3_experts_validate_inputs(ex->n_experts, ex->hidden, x, T, ids, w, k, err))) return rc;
    k3_wfmt fmt = ex->e[0].w1.fmt;
    if (fmt != K3_WFMT_NVFP4 && fmt != K3_WFMT_MXFP4 && fmt != K3_WFMT_BF16 && fmt != K3_WFMT_F32)
        return k3_fail(err, K3_ERR_UNSUPPORTED,
                       "experts.%d.w1: the CPU path reads NVFP4, MXFP4, BF16 or F32, found %s",
                       ex->first_local, k3_wfmt_name(fmt));
    if (mode == K3_MODE_W4A4 && fmt != K3_WFMT_NVFP4)
        return k3_fail(err, K3_ERR_UNSUPPORTED, "mode w4a4: needs NVFP4 experts, found %s",
                       k3_wfmt_name(fmt));
    if (mode == K3_MODE_W4A8 && fmt != K3_WFMT_MXFP4)
        return k3_fail(err, K3_ERR_UNSUPPORTED, "mode w4a8: needs MXFP4 experts, found %s",
                       k3_wfmt_name(fmt));
    bool gated = k3_act_is_gated(ex->act.act);
    for (int le = 0; le < ex->n_local; le++) {
        const k3_expert *E = &ex->e[le];
        int g = ex->first_local + le;
        if ((rc = check_mat(&E->w1, "w1", g, fmt, ex->inter, ex->hidden, err)) ||
            (gated && (rc = check_mat(&E->w3, "w3", g, fmt, ex->inter, ex->hidden, err))) ||
            (rc = check_mat(&E->w2, "w2", g, fmt, ex->hidden, ex->inter, err)))
            return rc;
    }
    return K3_OK;
}

int k3_moe_experts_cpu_isa(const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                           const int32_t *ids, const float *w, int k, float *y,
                           k3_threadpool *pool, k3_cpu_isa isa, k3_error *err) {
    if ((unsigned)isa >= K3_ISA_COUNT)
        return k3_fail(err, K3_ERR_ARG, "isa: expected auto, scalar, avx2 or avx512, found %d", (int)isa);
    if (!k3_cpu_isa_available(isa))
        return k3_fail(err, K3_ERR_UNSUPPORTED, "isa %s: not supported by this CPU", k3_cpu_isa_name(isa));
    if (isa == K3_ISA_AUTO) isa = k3_cpu_isa_best();
    int rc = validate(ex, mode, x, T, ids, w, k, y, err);
    if (rc || T == 0) return rc;

    plan p = {.ex = ex, .mode = mode, .H = ex->hidden, .I = ex->inter, .T = T, .k = k,
              .x = x, .w = w, .y = y, .in1 = 1.0f, .in2 = 1.0f, .in1d = 1.0, .g1 = 1.0f,
              .g2 = 1.0f};
    const k3_cpu_kern *kern = kern_for(isa);
    k3_wfmt fmt = ex->n_local ? ex->e[0].w1.fmt : K3_WFMT_F32;
    p.dot = fmt == K3_WFMT_NVFP4 ? kern->nvfp4 : fmt == K3_WFMT_MXFP4 ? kern->mxfp4
          : fmt == K3_WFMT_BF16 ? kern->bf16 : kern->f32;
    p.layout = (fmt == K3_WFMT_NVFP4 || fmt == K3_WFMT_MXFP4) ? kern->fp4_layout : K3_FP4_NATURAL;
    p.rows = fmt == K3_WFMT_NVFP4 ? kern->nvfp4_rows : fmt == K3_WFMT_MXFP4 ? kern->mxfp4_rows : NULL;
    p.situ = kern->situ;
    p.gated = k3_act_is_gated(ex->act.act);
    if (mode == K3_MODE_W4A4) {
        float m1, m2;
        if ((rc = max_input_scale(ex, 1, &m1, err)) || (rc = max_input_scale(ex, 2, &m2, err)))
            return rc;
        p.g1 = 1.0f / m1;
        p.g2 = 1.0f / m2;
        p.in1 = (float)(1.0 / (double)p.g1);
        p.in2 = (float)(1.0 / (double)p.g2);
        p.in1d = 1.0 / (double)p.g1;
    }
    /* float64 accumulation only where the inputs are FP4/FP8 codes; W4A16_BF16 sums like
     * W4A16 (and its BF16/F32 banks have no 64-bit kernel) */
    if (mode == K3_MODE_W4A4 || mode == K3_MODE_W4A8)
        p.dot64 = fmt == K3_WFMT_NVFP4 ? kern->nvfp4_64 : kern->mxfp4_64;
    if (p.dot64) p.rows64 = fmt == K3_WFMT_NVFP4 ? kern->nvfp4_rows64 : kern->mxfp4_rows64;

    /* Counting sort of the (token, slot) pairs by local expert. */
    int64_t TK = (int64_t)T * k;
    int nl = ex->n_local, nth = k3_threadpool_size(pool);
    int64_t mx = p.H > p.I ? p.H : p.I;
    p.scratch_stride = 2 * mx + 16;
    /* One block for everything (R <= T*k rows): from the pool's workspace, so a steady
     * stream of calls touches the same pages; malloc only without a pool. */
    size_t sz[9] = {((size_t)nl + 1) * sizeof(int64_t), (size_t)TK * sizeof(int64_t),
                    (size_t)(TK ? TK : 1) * sizeof(int32_t), ((size_t)nl + 1) * sizeof(int),
                    ((size_t)nl + 2) * sizeof(int64_t),
                    (size_t)(nth * p.scratch_stride) * sizeof(float),
                    (size_t)(T * p.H) * sizeof(float), (size_t)(TK * p.I) * sizeof(float),
                    (size_t)(TK * p.H) * sizeof(float)};
    size_t total = 0;
    for (int j = 0; j < 9; j++) total += (sz[j] + 63) / 64 * 64;
    void *owned = NULL;
    uint8_t *ws = k3_threadpool_workspace(pool, total);
    if (!ws) ws = owned = aligned_alloc(64, total);
    if (!ws) {
        rc = k3_fail(err, K3_ERR_NOMEM, "moe cpu: out of memory for %d tokens (%zu bytes)", T, total);
        goto done;
    }
    void *part[9];
    size_t o = 0;
    for (int j = 0; j < 9; j++) {
        part[j] = ws + o;
        o += (sz[j] + 63) / 64 * 64;
    }
    int64_t *count = part[0];
    memset(count, 0, sz[0]);
    p.slot_row = part[1];
    p.row_tok = part[2];
    p.act_e = part[3];
    p.off = part[4];
    p.scratch = part[5];
    p.xin = part[6];
    p.h = part[7];
    p.y2 = part[8];
    for (int64_t i = 0; i < TK; i++) {
        int le = ids[i] - ex->first_local;
        if (le >= 0 && le < nl) count[le]++;
    }
    int64_t R = 0;
    p.n_act = 0;
    for (int le = 0; le < nl; le++) {
        if (!count[le]) continue;
        p.act_e[p.n_act] = le;
        p.off[p.n_act++] = R;
        int64_t c = count[le];
        count[le] = R; /* becomes the fill cursor */
        R += c;
    }
    p.off[p.n_act] = R;
    for (int64_t i = 0; i < TK; i++) { /* stable: tokens stay in order within an expert */
        int le = ids[i] - ex->first_local;
        if (le >= 0 && le < nl) {
            int64_t r = count[le]++;
            p.slot_row[i] = r;
            p.row_tok[r] = (int32_t)(i / k);
        } else {
            p.slot_row[i] = -1;
        }
    }
    p.fc1_blocks = (p.I + FC1_ROWS - 1) / FC1_ROWS;
    p.fc2_blocks = (p.H + FC2_ROWS - 1) / FC2_ROWS;
    if (R > 0) {
        k3_parallel_for(pool, T, 1, K3_SCHED_STATIC, phase_inputs, &p);
        int per = p.gated ? 2 : 4;
        p.fc1_passes = p.n_act * ((p.I + per - 1) / per);
        p.fc2_passes = p.n_act * ((p.H + K3_CPU_NR - 1) / K3_CPU_NR);
        if (p.rows && (!p.dot64 || p.rows64))
            k3_parallel_for(pool, p.fc1_passes, PASS_CHUNK, K3_SCHED_DYNAMIC, phase_fc1_pass, &p);
        else
            k3_parallel_for(pool, p.n_act * p.fc1_blocks, 1, K3_SCHED_DYNAMIC, phase_fc1, &p);
        if (p.layout != K3_FP4_NATURAL || mode != K3_MODE_W4A16) /* W4A16_BF16 rounds here */
            k3_parallel_for(pool, R, 1, K3_SCHED_DYNAMIC, phase_hidden, &p);
        if (p.rows)
            k3_parallel_for(pool, p.fc2_passes, PASS_CHUNK, K3_SCHED_DYNAMIC, phase_fc2_pass, &p);
        else
            k3_parallel_for(pool, p.n_act * p.fc2_blocks, 1, K3_SCHED_DYNAMIC, phase_fc2, &p);
    }
    k3_parallel_for(pool, T, 1, K3_SCHED_STATIC, phase_finalize, &p);
    rc = K3_OK;
done:
    free(owned);
    return rc;
}

int k3_moe_experts_cpu(const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                       const int32_t *ids, const float *w, int k, float *y,
                       k3_threadpool *pool, k3_error *err) {
    return k3_moe_experts_cpu_isa(ex, mode, x, T, ids, w, k, y, pool, K3_ISA_AUTO, err);
}
