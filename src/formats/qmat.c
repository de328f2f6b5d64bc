/* k3_qmat rows as numbers: exact float64 dequantization (the reference's input) and the
 * float32 version (the float64 value rounded once), the plain product built on them, plus
 * byte counts. The loader validates
 * shapes and scales; this file only refuses to read out of bounds: a NULL matrix, a bad
 * format, a row outside [0, rows) or a cols the format cannot hold fills out with NaN, so a
 * caller's mistake shows up in the first comparison instead of as garbage. */
#include "formats/qmat.h"

#include "formats/block.h"
#include "formats/fp.h"

#include <math.h>

const char *k3_wfmt_name(k3_wfmt fmt) {
    switch (fmt) {
    case K3_WFMT_F32:
        return "f32";
    case K3_WFMT_BF16:
        return "bf16";
    case K3_WFMT_F16:
        return "f16";
    case K3_WFMT_NVFP4:
        return "nvfp4";
    case K3_WFMT_MXFP4:
        return "mxfp4";
    case K3_WFMT_FP8_BLOCK:
        return "fp8-block";
    case K3_WFMT_COUNT:
        break;
    }
    return "unknown";
}

static int64_t block_of(k3_wfmt fmt) {
    return fmt == K3_WFMT_NVFP4 ? K3_NVFP4_BLOCK : fmt == K3_WFMT_MXFP4 ? K3_MXFP4_BLOCK : 1;
}

/* Whether row r of m can be read at all. */
static int row_ok(const k3_qmat *m, int64_t r) {
    if (!m || (unsigned)m->fmt >= K3_WFMT_COUNT || !m->data || m->rows <= 0 || m->cols <= 0)
        return 0;
    if (r < 0 || r >= m->rows || m->cols % block_of(m->fmt) != 0)
        return 0;
    if (m->fmt >= K3_WFMT_NVFP4 && !m->scale)
        return 0;
    return 1;
}

static int64_t cols_of(const k3_qmat *m) {
    return m && m->cols > 0 ? m->cols : 0;
}

/* The one walk over a row for both precisions: each element's exact float64 value goes to
 * o64 when it is non-NULL, else to o32 rounded once (the float32 contract in qmat.h). */
#define PUT(c, v)                                                                                  \
    do {                                                                                           \
        double v_ = (v);                                                                           \
        if (o64)                                                                                   \
            o64[c] = v_;                                                                           \
        else                                                                                       \
            o32[c] = (float)v_;                                                                    \
    } while (0)

static void row_walk(const k3_qmat *m, int64_t r, double *o64, float *o32) {
    if (!row_ok(m, r)) {
        for (int64_t c = 0; c < cols_of(m); c++)
            PUT(c, NAN);
        return;
    }
    const int64_t K = m->cols;
    switch (m->fmt) {
    case K3_WFMT_F32: {
        const float *d = (const float *)m->data + r * K;
        for (int64_t c = 0; c < K; c++)
            PUT(c, d[c]);
        break;
    }
    case K3_WFMT_BF16: {
        const uint16_t *d = (const uint16_t *)m->data + r * K;
        for (int64_t c = 0; c < K; c++)
            PUT(c, k3_bf16_to_f32(d[c]));
        break;
    }
    case K3_WFMT_F16: {
        const uint16_t *d = (const uint16_t *)m->data + r * K;
        for (int64_t c = 0; c < K; c++)
            PUT(c, k3_f16_to_f32(d[c]));
        break;
    }
    case K3_WFMT_NVFP4:
    case K3_WFMT_MXFP4: {
        /* value * scale * global: at most 2 + 4 + 24 significant bits, exact in double. */
        const int64_t B = block_of(m->fmt);
        const uint8_t *p = (const uint8_t *)m->data + r * (K / 2);
        const uint8_t *s = (const uint8_t *)m->scale + r * (K / B);
        const double g = m->fmt == K3_WFMT_NVFP4 ? (double)m->global_scale : 1.0;
        for (int64_t c = 0; c < K; c++) {
            uint8_t code = (c & 1) ? (uint8_t)(p[c / 2] >> 4) : (uint8_t)(p[c / 2] & 15);
            double sv = m->fmt == K3_WFMT_NVFP4 ? k3_e4m3_lut[s[c / B]] : k3_e8m0_lut[s[c / B]];
            PUT(c, (double)k3_e2m1_lut[code] * sv * g);
        }
        break;
    }
    case K3_WFMT_FP8_BLOCK: {
        const int64_t nbc = (K + K3_FP8_BLOCK - 1) / K3_FP8_BLOCK;
        const float *s = (const float *)m->scale + (r / K3_FP8_BLOCK) * nbc;
        const uint8_t *d = (const uint8_t *)m->data + r * K;
        for (int64_t c = 0; c < K; c++)
            PUT(c, (double)k3_e4m3_lut[d[c]] * s[c / K3_FP8_BLOCK]);
        break;
    }
    case K3_WFMT_COUNT:
        break;
    }
}

#undef PUT

void k3_qmat_row_f64(const k3_qmat *m, int64_t r, double *out) {
    row_walk(m, r, out, NULL);
}

void k3_qmat_row_f32(const k3_qmat *m, int64_t r, float *out) {
    row_walk(m, r, NULL, out);
}

void k3_qmat_matmul(const k3_qmat *m, const float *x, int T, float *y, double *row) {
    const int64_t O = m->rows, C = m->cols;
    for (int64_t o = 0; o < O; o++) {
        k3_qmat_row_f64(m, o, row);
        for (int t = 0; t < T; t++) {
            const float *xt = x + (int64_t)t * C;
            double acc = 0;
            for (int64_t c = 0; c < C; c++)
                acc += (double)xt[c] * row[c];
            y[(int64_t)t * O + o] = (float)acc;
        }
    }
}

size_t k3_qmat_data_bytes(const k3_qmat *m) {
    if (!m || m->rows < 0 || m->cols < 0)
        return 0;
    size_t n = (size_t)m->rows * (size_t)m->cols;
    switch (m->fmt) {
    case K3_WFMT_F32:
        return n * 4;
    case K3_WFMT_BF16:
    case K3_WFMT_F16:
        return n * 2;
    case K3_WFMT_NVFP4:
    case K3_WFMT_MXFP4:
        return (size_t)m->rows * (size_t)(m->cols / 2);
    case K3_WFMT_FP8_BLOCK:
        return n;
    case K3_WFMT_COUNT:
        break;
    }
    return 0;
}

size_t k3_qmat_scale_bytes(const k3_qmat *m) {
    if (!m || m->rows < 0 || m->cols < 0)
        return 0;
    switch (m->fmt) {
    case K3_WFMT_NVFP4:
        return (size_t)m->rows * (size_t)(m->cols / K3_NVFP4_BLOCK);
    case K3_WFMT_MXFP4:
        return (size_t)m->rows * (size_t)(m->cols / K3_MXFP4_BLOCK);
    case K3_WFMT_FP8_BLOCK:
        return (size_t)((m->rows + K3_FP8_BLOCK - 1) / K3_FP8_BLOCK) *
               (size_t)((m->cols + K3_FP8_BLOCK - 1) / K3_FP8_BLOCK) * sizeof(float);
    default:
        return 0;
    }
}
