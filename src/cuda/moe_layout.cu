/* Upload of routed experts: validation and the one-time re-ordering of file-layout NVFP4 /
 * MXFP4 matrices (k3_qmat, untouched) into the kernels' fragment layout.
 *
 * Weight unit = 16 rows x 128 k = 1024 bytes. Lane l (g = l/4, q = l%4) reads bytes
 * [h*512 + 16 l, +16) for h = 0, 1: four 32-bit words, one per k-step s = 4h + j. Word j
 * holds the 8 E2M1 codes of its A fragment registers R_i (i = 0..3: rows g, g+8, g, g+8;
 * k = 16 s + 2q + 8 (i/2) + {0, 1}): magnitude and sign of the even k in the low half, of the
 * odd k in the high half, at the bit positions mag_pos(i) / sgn_pos(i) of moe_dev.cuh, so that
 * decode_reg is at most two shifts, two masks and one HMUL2. FC1 tiles (gated) are 8 up rows
 * (w3) then the 8 gate rows (w1) of the same i, so the activation sees gate and up of one i
 * in one thread. Scale unit (NVFP4): per row group
 * g, 16 bytes [s(g, b), s(g+8, b)] for the 8 16-blocks of the chunk; MXFP4: 8 bytes for the
 * 4 32-blocks, each E8M0 2^e re-based to the E4M3 byte of 2^(e - shift), shift = e_max - 8
 * over the matrix's non-zero blocks (an all-zero block's exponent never matters).
 * What it leaves out: formats other than NVFP4/MXFP4 (FP8-block and bf16 experts are the
 * shared-expert path's business). */
#include "cuda/cuda_check.cuh"
#include "cuda/k3_cuda.h"
#include "cuda/moe_state.cuh"

extern "C" {
#include "base/base.h"
#include "moe/activation.h"
}

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *fmt_name(k3_wfmt f) {
    static const char *const n[] = {"F32", "BF16", "F16", "NVFP4", "MXFP4", "FP8_BLOCK"};
    return (unsigned)f < sizeof n / sizeof n[0] ? n[f] : "unknown";
}

static const char *mat_name(int which) { return which == 1 ? "w1" : which == 3 ? "w3" : "w2"; }

static inline int nib(const k3_qmat *q, int64_t r, int64_t k) {
    const uint8_t *d = (const uint8_t *)q->data;
    return (d[r * (q->cols / 2) + k / 2] >> (4 * (k & 1))) & 15;
}

/* E4M3 byte of 2^j, j in [-9, 8]. */
static uint8_t e4m3_pow2(int j) {
    if (j >= -6) return (uint8_t)((j + 7) << 3);
    return (uint8_t)(1 << (j + 9)); /* subnormals: 2^-7 = 0x04, 2^-8 = 0x02, 2^-9 = 0x01 */
}

/* Checks one matrix and returns its epilogue factor and (MXFP4) exponent shift. */
static int check_mat(const k3_qmat *q, int e, int which, int64_t rows, int64_t cols, k3_wfmt fmt,
                     float *factor, int *shift, k3_error *err) {
    const char *nm = mat_name(which);
    if (!q->data || !q->scale)
        return k3_fail(err, K3_ERR_MISSING, "experts.%d.%s: data or scale is NULL", e, nm);
    if (q->fmt != fmt)
        return k3_fail(err, K3_ERR_UNSUPPORTED, "experts.%d.%s: expected %s like experts.0.w1, found %s", e,
                       nm, fmt == K3_WFMT_NVFP4 ? "NVFP4" : "MXFP4", fmt_name(q->fmt));
    if (q->rows != rows || q->cols != cols)
        return k3_fail(err, K3_ERR_SHAPE, "experts.%d.%s: expected [%lld, %lld], found [%lld, %lld]", e, nm,
                       (long long)rows, (long long)cols, (long long)q->rows, (long long)q->cols);
    const uint8_t *s = (const uint8_t *)q->scale;
    if (fmt == K3_WFMT_NVFP4) {
        if (!(q->global_scale > 0.f) || !isfinite(q->global_scale))
            return k3_fail(err, K3_ERR_NUMERIC, "experts.%d.%s.weight_scale_2: expected finite > 0, found %g",
                           e, nm, (double)q->global_scale);
        for (int64_t i = 0; i < rows * (cols / 16); i++)
            if ((s[i] & 0x7F) == 0x7F)
                return k3_fail(err, K3_ERR_NUMERIC, "experts.%d.%s.weight_scale[%lld, %lld]: E4M3 NaN", e, nm,
                               (long long)(i / (cols / 16)), (long long)(i % (cols / 16)));
        *factor = q->global_scale * 16384.f;
        *shift = 0;
        return K3_OK;
    }
    int emax = -1000, emin = 1000;
    const int64_t nb = cols / 32;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t u = s[r * nb + b];
            if (u == 0xFF)
                return k3_fail(err, K3_ERR_NUMERIC, "experts.%d.%s.scale[%lld, %lld]: E8M0 NaN (0xFF)", e, nm,
                               (long long)r, (long long)b);
            bool nz = false;
            for (int i = 0; i < 32 && !nz; i++) nz = (nib(q, r, b * 32 + i) & 7) != 0;
            if (!nz) continue;
            int ex = (int)u - 127;
            if (ex > emax) emax = ex;
            if (ex < emin) emin = ex;
        }
    if (emax == -1000) emax = emin = 0; /* all-zero matrix */
    if (emax - emin > 17)
        return k3_fail(err, K3_ERR_UNSUPPORTED,
                       "experts.%d.%s: MXFP4 block exponents span 2^%d..2^%d, more than the 18 binades the "
                       "exact fp16 decode holds",
                       e, nm, emin, emax);
    *shift = emax - 8;
    double f = ldexp(1.0, *shift + 14);
    if (!(f >= 1.2e-38 && f <= 3.0e38))
        return k3_fail(err, K3_ERR_UNSUPPORTED, "experts.%d.%s: MXFP4 exponent 2^%d outside fp32 epilogue range",
                       e, nm, emax);
    *factor = (float)f;
    return K3_OK;
}

/* Tile row rr (0..15) of tile t: the source matrix and its row. */
struct TileSrc {
    const k3_qmat *a, *b; /* gated FC1: a = w3 (rows 0..7), b = w1 (rows 8..15); else a only */
    int shift_a, shift_b;
    int half; /* 1: 8 + 8 rows (gated FC1), 0: 16 rows of a */
};

static void src_row(const TileSrc *ts, int t, int rr, const k3_qmat **q, int64_t *row, int *shift) {
    if (ts->half) {
        *q = rr < 8 ? ts->a : ts->b;
        *shift = rr < 8 ? ts->shift_a : ts->shift_b;
        *row = (int64_t)t * 8 + (rr & 7);
    } else {
        *q = ts->a;
        *shift = ts->shift_a;
        *row = (int64_t)t * 16 + rr;
    }
}

static uint8_t scale_byte(const k3_qmat *q, int64_t row, int64_t k, int shift, int fmt) {
    const uint8_t *s = (const uint8_t *)q->scale;
    if (fmt == FMT_NV) return s[row * (q->cols / 16) + k / 16];
    int64_t b = k / 32;
    bool nz = false;
    for (int i = 0; i < 32 && !nz; i++) nz = (nib(q, row, b * 32 + i) & 7) != 0;
    if (!nz) return 0x38; /* 1.0: the block's codes are all zero */
    return e4m3_pow2((int)s[row * (q->cols / 32) + b] - 127 - shift);
}

/* Packs tiles x chunks of one expert matrix into wdst (1024 B units) and sdst. */
static void pack(const TileSrc *ts, int tiles, int nk, int fmt, uint8_t *wdst, uint8_t *sdst) {
    const int SB = fmt == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
    for (int t = 0; t < tiles; t++)
        for (int c = 0; c < nk; c++) {
            uint8_t *wu = wdst + ((size_t)t * nk + c) * UNIT_W;
            uint8_t *su = sdst + ((size_t)t * nk + c) * SB;
            for (int lane = 0; lane < 32; lane++) {
                int g = lane >> 2, q = lane & 3;
                for (int s = 0; s < 8; s++) {
                    uint32_t w = 0;
                    for (int i = 0; i < 4; i++) {
                        int rr = g + 8 * (i & 1);
                        const k3_qmat *m;
                        int64_t row;
                        int sh;
                        src_row(ts, t, rr, &m, &row, &sh);
                        int64_t k = (int64_t)c * 128 + 16 * s + 2 * q + 8 * (i >> 1);
                        uint32_t lo = (uint32_t)nib(m, row, k), hi = (uint32_t)nib(m, row, k + 1);
                        w |= (lo & 7) << mag_pos(i) | (hi & 7) << (16 + mag_pos(i));
                        w |= (lo >> 3) << sgn_pos(i) | (hi >> 3) << (16 + sgn_pos(i));
                    }
                    memcpy(wu + (s >> 2) * 512 + lane * 16 + (s & 3) * 4, &w, 4);
                }
            }
            for (int g = 0; g < 8; g++) {
                int nb = fmt == FMT_NV ? 8 : 4, bw = fmt == FMT_NV ? 16 : 32;
                for (int b = 0; b < nb; b++)
                    for (int h = 0; h < 2; h++) {
                        const k3_qmat *m;
                        int64_t row;
                        int sh;
                        src_row(ts, t, g + 8 * h, &m, &row, &sh);
                        su[g * (2 * nb) + 2 * b + h] = scale_byte(m, row, (int64_t)c * 128 + b * bw, sh, fmt);
                    }
            }
        }
}

size_t k3_cuda_moe_expert_bytes(const k3_cuda_moe *m) {
    const int SB = m->fmt == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
    return (size_t)(m->d.m1 * m->d.nk1 + m->d.m2 * m->d.nk2) * (UNIT_W + SB);
}

int k3_cuda_moe_alloc(k3_cuda_moe *m, int n_experts, int first_local, int n_local, int H, int I, int fmt,
                      k3_act act, bool with_params, k3_error *err) {
    const bool gated = k3_act_is_gated(act);
    MoeDev *d = &m->d;
    d->n_experts = n_experts;
    d->first_local = first_local;
    d->n_local = n_local;
    d->H = H;
    d->I = I;
    d->gated = gated;
    d->m1 = moe_fc1_rows(act, I) / 16;
    d->m2 = H / 16;
    d->nk1 = H / 128;
    d->nk2 = I / 128;
    m->fmt = fmt;
    m->act = act;
    const int SB = fmt == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
    size_t w1b = (size_t)n_local * d->m1 * d->nk1 * UNIT_W, s1b = (size_t)n_local * d->m1 * d->nk1 * SB;
    size_t w2b = (size_t)n_local * d->m2 * d->nk2 * UNIT_W, s2b = (size_t)n_local * d->m2 * d->nk2 * SB;
    size_t fb = (size_t)n_local * 3 * sizeof(float), pb = with_params ? (size_t)n_local * 3 * sizeof(float) : 0;
    size_t off[8], tot = 0;
    size_t sz[7] = {w1b, s1b, w2b, s2b, fb, pb, 64};
    for (int i = 0; i < 7; i++) {
        off[i] = tot;
        tot += (sz[i] + 255) & ~(size_t)255;
    }
    K3_CUDA_TRY(err, cudaGetDevice(&m->device));
    if (moe_wg_probe(&m->wg_ok, err)) return err->status;
    K3_CUDA_TRY(err, cudaDeviceGetAttribute(&m->n_sm, cudaDevAttrMultiProcessorCount, m->device));
    K3_CUDA_TRY(err, cudaDeviceGetAttribute(&m->l2_bytes, cudaDevAttrL2CacheSize, m->device));
    K3_CUDA_TRY(err, cudaMalloc(&m->mem, tot));
    m->mem_bytes = tot;
    char *b = (char *)m->mem;
    d->w1 = (const uint4 *)(b + off[0]);
    d->s1 = (const uint8_t *)(b + off[1]);
    d->w2 = (const uint4 *)(b + off[2]);
    d->s2 = (const uint8_t *)(b + off[3]);
    d->f1 = (const float *)(b + off[4]);
    d->f2 = d->f1 + 2 * n_local;
    d->alpha = d->beta = d->limit = NULL;
    if (with_params) {
        float *p = (float *)(b + off[5]);
        d->alpha = p;
        d->beta = p + n_local;
        d->limit = p + 2 * n_local;
    }
    m->bar = (unsigned long long *)(b + off[6]);
    K3_CUDA_TRY(err, cudaMemset(m->bar, 0, 64));
    m->bar_epoch = 0;
    return K3_OK;
}

extern "C" int k3_cuda_moe_create(const k3_experts *ex, k3_cuda_moe **out, k3_error *err) {
    *out = NULL;
    int ndev = 0;
    char name[256];
    if (k3_cuda_device_count(&ndev, name, sizeof name, err)) return err->status;
    if (ndev == 0) return k3_fail(err, K3_ERR_DEVICE, "cuda backend: no CUDA device (%s)", name);
    if (!ex || !ex->e || ex->n_local <= 0) return k3_fail(err, K3_ERR_ARG, "experts: no local experts");
    if (ex->n_local > K3_CUDA_MAX_LOCAL_EXPERTS)
        return k3_fail(err, K3_ERR_LIMIT, "experts.n_local: %d, the cuda backends take at most %d", ex->n_local,
                       K3_CUDA_MAX_LOCAL_EXPERTS);
    if (ex->first_local < 0 || ex->first_local + ex->n_local > ex->n_experts)
        return k3_fail(err, K3_ERR_ARG, "experts: local range [%d, %d) outside [0, %d)", ex->first_local,
                       ex->first_local + ex->n_local, ex->n_experts);
    const int H = ex->hidden, I = ex->inter;
    if (H <= 0 || I <= 0 || H % 128 || I % 128)
        return k3_fail(err, K3_ERR_SHAPE, "experts: hidden %d and inter %d must be positive multiples of 128 for the cuda backends",
                       H, I);
    if (k3_act_params_validate(&ex->act, ex->n_local, err)) return err->status;
    const k3_wfmt wf = ex->e[0].w1.fmt;
    if (wf != K3_WFMT_NVFP4 && wf != K3_WFMT_MXFP4)
        return k3_fail(err, K3_ERR_UNSUPPORTED, "experts.0.w1: the cuda backends take NVFP4 or MXFP4 experts, found %s",
                       fmt_name(wf));
    const int fmt = wf == K3_WFMT_NVFP4 ? FMT_NV : FMT_MX;
    const bool gated = k3_act_is_gated(ex->act.act);
    const int nl = ex->n_local;
    float *fac = (float *)calloc((size_t)nl * 3, sizeof(float));
    int *shifts = (int *)calloc((size_t)nl * 3, sizeof(int));
    float in1 = 0.f, in2 = 0.f;
    bool have_in = true;
    int rc = K3_OK;
    for (int e = 0; e < nl && rc == K3_OK; e++) {
        const k3_expert *x = &ex->e[e];
        float f;
        int sh;
        if ((rc = check_mat(&x->w1, e, 1, I, H, wf, &f, &sh, err))) break;
        fac[2 * e + 1] = f;
        shifts[3 * e + 1] = sh;
        if (gated) {
            if ((rc = check_mat(&x->w3, e, 3, I, H, wf, &f, &sh, err))) break;
            fac[2 * e] = f;
            shifts[3 * e] = sh;
        } else {
            fac[2 * e] = fac[2 * e + 1];
            shifts[3 * e] = shifts[3 * e + 1];
        }
        if ((rc = check_mat(&x->w2, e, 2, H, I, wf, &f, &sh, err))) break;
        fac[2 * nl + e] = f;
        shifts[3 * e + 2] = sh;
        if (!(x->w1.input_scale > 0.f) || !(x->w2.input_scale > 0.f)) have_in = false;
        in1 = fmaxf(in1, x->w1.input_scale);
        in2 = fmaxf(in2, x->w2.input_scale);
    }
    k3_cuda_moe *m = NULL;
    uint8_t *hw = NULL, *hs = NULL;
    if (rc == K3_OK) {
        m = (k3_cuda_moe *)calloc(1, sizeof *m);
        if (!m) rc = k3_fail(err, K3_ERR_NOMEM, "cuda moe: handle");
    }
    if (rc == K3_OK) rc = k3_cuda_moe_alloc(m, ex->n_experts, ex->first_local, nl, H, I, fmt, ex->act.act, true, err);
    if (rc == K3_OK) {
        MoeDev *d = &m->d;
        d->g1 = have_in && fmt == FMT_NV ? 1.f / in1 : 0.f;
        d->g2 = have_in && fmt == FMT_NV ? 1.f / in2 : 0.f;
        const int SB = fmt == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
        size_t u1 = (size_t)d->m1 * d->nk1, u2 = (size_t)d->m2 * d->nk2, umax = u1 > u2 ? u1 : u2;
        hw = (uint8_t *)malloc(umax * UNIT_W);
        hs = (uint8_t *)malloc(umax * SB);
        if (!hw || !hs) rc = k3_fail(err, K3_ERR_NOMEM, "cuda moe: staging buffers");
        for (int e = 0; e < nl && rc == K3_OK; e++) {
            const k3_expert *x = &ex->e[e];
            TileSrc t1 = {gated ? &x->w3 : &x->w1, &x->w1, shifts[3 * e], shifts[3 * e + 1], gated ? 1 : 0};
            pack(&t1, d->m1, d->nk1, fmt, hw, hs);
            cudaError_t ce = cudaMemcpy((void *)(d->w1 + (size_t)e * u1 * 64), hw, u1 * UNIT_W, cudaMemcpyHostToDevice);
            if (ce == cudaSuccess)
                ce = cudaMemcpy((void *)(d->s1 + (size_t)e * u1 * SB), hs, u1 * SB, cudaMemcpyHostToDevice);
            TileSrc t2 = {&x->w2, NULL, shifts[3 * e + 2], 0, 0};
            pack(&t2, d->m2, d->nk2, fmt, hw, hs);
            if (ce == cudaSuccess)
                ce = cudaMemcpy((void *)(d->w2 + (size_t)e * u2 * 64), hw, u2 * UNIT_W, cudaMemcpyHostToDevice);
            if (ce == cudaSuccess)
                ce = cudaMemcpy((void *)(d->s2 + (size_t)e * u2 * SB), hs, u2 * SB, cudaMemcpyHostToDevice);
            if (ce != cudaSuccess) rc = k3_cuda_fail(err, ce, "cudaMemcpy(expert weights)", __FILE__, __LINE__);
        }
    }
    if (rc == K3_OK) {
        /* activation parameters with the functors' defaults where an array is absent */
        float *p = (float *)malloc((size_t)nl * 3 * sizeof(float));
        if (!p) rc = k3_fail(err, K3_ERR_NOMEM, "cuda moe: parameters");
        for (int e = 0; e < nl && p; e++) {
            p[e] = ex->act.alpha ? ex->act.alpha[e] : 1.f;
            p[nl + e] = ex->act.beta ? ex->act.beta[e] : 0.f;
            p[2 * nl + e] = ex->act.limit ? ex->act.limit[e] : INFINITY;
        }
        cudaError_t ce = cudaSuccess;
        if (p) ce = cudaMemcpy((void *)m->d.alpha, p, (size_t)nl * 3 * sizeof(float), cudaMemcpyHostToDevice);
        if (p && ce == cudaSuccess)
            ce = cudaMemcpy((void *)m->d.f1, fac, (size_t)nl * 3 * sizeof(float), cudaMemcpyHostToDevice);
        if (ce != cudaSuccess) rc = k3_cuda_fail(err, ce, "cudaMemcpy(expert parameters)", __FILE__, __LINE__);
        free(p);
    }
    free(hw);
    free(hs);
    free(fac);
    free(shifts);
    if (rc != K3_OK) {
        k3_cuda_moe_free(m);
        return rc;
    }
    *out = m;
    return K3_OK;
}

extern "C" void k3_cuda_moe_free(k3_cuda_moe *m) {
    if (!m) return;
    cudaFree(m->mem);
    cudaFree(m->ws);
    free(m);
}
