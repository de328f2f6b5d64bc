/* The dense-projection GEMM of the GPU MoE block (see dense.cuh for what it is and leaves
 * out): upload of a k3_qmat in file layout, the warp-per-row kernel with in-register decode,
 * and its launch. */
#include "cuda/cuda_check.cuh"
#include "cuda/dense.cuh"

extern "C" {
#include "base/base.h"
}

#include <cuda_fp16.h>
#include <math.h>

#define DENSE_TB 8    /* tokens per warp */
#define DENSE_WARPS 8 /* rows per CTA */

/* ---- exact decodes ----------------------------------------------------------------------- */

__device__ __forceinline__ float e4m3_f(uint32_t b) {
    uint32_t e = (b >> 3) & 15, m = b & 7;
    float v = e == 15 && m == 7 ? __int_as_float(0x7fc00000)
              : e == 0          ? (float)m * 0.001953125f /* m * 2^-9 */
                                : __int_as_float((int)(((e + 120) << 23) | (m << 20)));
    return (b & 0x80) ? -v : v;
}

__device__ __forceinline__ float e2m1_f(uint32_t c) {
    uint32_t e = (c >> 1) & 3, m = c & 1;
    float v = e == 0 ? (float)m * 0.5f : __int_as_float((int)(((e + 126) << 23) | (m << 22)));
    return (c & 8) ? -v : v;
}

__device__ __forceinline__ float e8m0_f(uint32_t b) {
    return b == 255 ? __int_as_float(0x7fc00000) : b == 0 ? __int_as_float(0x00400000) : __int_as_float((int)(b << 23));
}

__device__ __forceinline__ uint4 ldg_nc16(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* Elements per 16-byte chunk. */
template <int FMT> struct Epc {
    static constexpr int v = FMT == K3_WFMT_F32 ? 4 : (FMT == K3_WFMT_BF16 || FMT == K3_WFMT_F16) ? 8
                             : FMT == K3_WFMT_FP8_BLOCK                                           ? 16
                                                                                                  : 32;
};

/* Decodes the chunk q holding columns [c0, c0 + EPC) of row o into wv (block scales applied;
 * the NVFP4 tensor scale is applied to the sum). Every value is exact in fp32 except the
 * FP8-block product E4M3 x F32 scale, rounded once as k3_qmat_row_f32 does. */
template <int FMT>
__device__ __forceinline__ void decode(uint4 q, const DenseMat &m, int o, int c0, float *wv) {
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
    if (FMT == K3_WFMT_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) wv[i] = __uint_as_float(u[i]);
    } else if (FMT == K3_WFMT_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) wv[2 * i] = __uint_as_float(u[i] << 16), wv[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    } else if (FMT == K3_WFMT_F16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 h = *(const __half2 *)&u[i];
            float2 f = __half22float2(h);
            wv[2 * i] = f.x, wv[2 * i + 1] = f.y;
        }
    } else if (FMT == K3_WFMT_FP8_BLOCK) {
        const float s = ((const float *)m.s)[(size_t)(o >> 7) * m.s_cols + (c0 >> 7)];
#pragma unroll
        for (int i = 0; i < 16; i++) wv[i] = e4m3_f((u[i >> 2] >> (8 * (i & 3))) & 255) * s;
    } else {
        const uint8_t *sc = (const uint8_t *)m.s + (size_t)o * m.s_cols;
        float s0, s1;
        if (FMT == K3_WFMT_NVFP4) s0 = e4m3_f(sc[c0 >> 4]), s1 = e4m3_f(sc[(c0 >> 4) + 1]);
        else s0 = s1 = e8m0_f(sc[c0 >> 5]);
#pragma unroll
        for (int i = 0; i < 32; i++) wv[i] = e2m1_f((u[i >> 3] >> (4 * (i & 7))) & 15) * (i < 16 ? s0 : s1);
    }
}

template <int FMT, typename ACC>
__global__ void __launch_bounds__(32 * DENSE_WARPS)
    k_dense(DenseMat m, const float *__restrict__ x, int T, float *__restrict__ y, int accumulate) {
    constexpr int EPC = Epc<FMT>::v;
    const int lane = threadIdx.x & 31, o = blockIdx.x * DENSE_WARPS + (threadIdx.x >> 5);
    if (o >= m.O) return;
    const int t0 = blockIdx.y * DENSE_TB, nt = min(DENSE_TB, T - t0), nch = m.C / EPC;
    const uint4 *wr = (const uint4 *)m.w + (size_t)o * nch;
    ACC acc[DENSE_TB];
#pragma unroll
    for (int i = 0; i < DENSE_TB; i++) acc[i] = 0;
    for (int ch = lane; ch < nch; ch += 32) {
        float wv[EPC];
        decode<FMT>(ldg_nc16(wr + ch), m, o, ch * EPC, wv);
#pragma unroll
        for (int tt = 0; tt < DENSE_TB; tt++) {
            if (tt >= nt) break;
            const float4 *xr = (const float4 *)(x + (size_t)(t0 + tt) * m.C + (size_t)ch * EPC);
#pragma unroll
            for (int j = 0; j < EPC / 4; j++) {
                float4 v = __ldg(xr + j);
                acc[tt] = fma((ACC)v.x, (ACC)wv[4 * j], acc[tt]);
                acc[tt] = fma((ACC)v.y, (ACC)wv[4 * j + 1], acc[tt]);
                acc[tt] = fma((ACC)v.z, (ACC)wv[4 * j + 2], acc[tt]);
                acc[tt] = fma((ACC)v.w, (ACC)wv[4 * j + 3], acc[tt]);
            }
        }
    }
#pragma unroll
    for (int tt = 0; tt < DENSE_TB; tt++) {
        if (tt >= nt) break;
        ACC v = acc[tt];
        for (int s = 16; s; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
        if (lane == 0) {
            float r = (float)(v * (ACC)m.gs);
            float *dst = y + (size_t)(t0 + tt) * m.O + o;
            *dst = accumulate ? *dst + r : r;
        }
    }
}

/* ---- host ----------------------------------------------------------------------------------- */

static int elem_bits(int fmt) {
    switch (fmt) {
    case K3_WFMT_F32: return 32;
    case K3_WFMT_BF16:
    case K3_WFMT_F16: return 16;
    case K3_WFMT_FP8_BLOCK: return 8;
    case K3_WFMT_NVFP4:
    case K3_WFMT_MXFP4: return 4;
    default: return 0;
    }
}

int k3_dense_upload(const k3_qmat *q, const char *name, int64_t rows, int64_t cols, DenseMat *out,
                    k3_error *err) {
    *out = DenseMat{};
    int bits = elem_bits(q->fmt);
    if (!bits) return k3_fail(err, K3_ERR_UNSUPPORTED, "%s: the cuda block reads F32, BF16, F16, FP8_BLOCK, NVFP4 or MXFP4, found %s", name, k3_wfmt_name(q->fmt));
    if (q->rows != rows || q->cols != cols)
        return k3_fail(err, K3_ERR_SHAPE, "%s: expected [%lld, %lld], found [%lld, %lld]", name, (long long)rows,
                       (long long)cols, (long long)q->rows, (long long)q->cols);
    if (rows < 1 || cols < 1 || rows > (1 << 30) || cols > (1 << 30))
        return k3_fail(err, K3_ERR_SHAPE, "%s: [%lld, %lld] outside 1..2^30", name, (long long)rows, (long long)cols);
    if ((cols * bits) % 128)
        return k3_fail(err, K3_ERR_SHAPE, "%s: the cuda block streams 16-byte chunks of a row: %s cols must be a multiple of %d, found %lld",
                       name, k3_wfmt_name(q->fmt), 128 / bits, (long long)cols);
    bool scaled = q->fmt == K3_WFMT_FP8_BLOCK || q->fmt == K3_WFMT_NVFP4 || q->fmt == K3_WFMT_MXFP4;
    if (!q->data || (scaled && !q->scale)) return k3_fail(err, K3_ERR_MISSING, "%s: %s missing", name, q->data ? "scale" : "data");
    float gs = q->fmt == K3_WFMT_NVFP4 ? q->global_scale : 1.f;
    if (!(isfinite(gs) && gs > 0)) return k3_fail(err, K3_ERR_NUMERIC, "%s: weight_scale_2 %g (expected finite > 0)", name, (double)gs);
    size_t db = k3_qmat_data_bytes(q), sb = scaled ? k3_qmat_scale_bytes(q) : 0, doff = (db + 255) & ~(size_t)255;
    if (db != (size_t)rows * (size_t)cols * bits / 8) return k3_fail(err, K3_ERR_SHAPE, "%s: %zu data bytes for [%lld, %lld] %s", name, db, (long long)rows, (long long)cols, k3_wfmt_name(q->fmt));
    char *mem = NULL;
    K3_CUDA_TRY(err, cudaMalloc(&mem, doff + sb + 16));
    cudaError_t ce = cudaMemcpy(mem, q->data, db, cudaMemcpyHostToDevice);
    if (ce == cudaSuccess && sb) ce = cudaMemcpy(mem + doff, q->scale, sb, cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) {
        cudaFree(mem);
        return k3_cuda_fail(err, ce, "cudaMemcpy(dense weight)", __FILE__, __LINE__);
    }
    out->fmt = q->fmt, out->O = (int)rows, out->C = (int)cols, out->gs = gs, out->mem = mem;
    out->w = (const uint8_t *)mem;
    out->s = scaled ? mem + doff : NULL;
    out->s_cols = q->fmt == K3_WFMT_FP8_BLOCK ? (int)((cols + 127) / 128) : q->fmt == K3_WFMT_NVFP4 ? (int)(cols / 16) : (int)(cols / 32);
    return K3_OK;
}

void k3_dense_free(DenseMat *m) {
    if (m->mem) cudaFree(m->mem);
    *m = DenseMat{};
}

template <typename ACC>
static void launch(const DenseMat *m, dim3 g, const float *x, int T, float *y, int acc, cudaStream_t st) {
    const int th = 32 * DENSE_WARPS;
    switch (m->fmt) {
    case K3_WFMT_F32: k_dense<K3_WFMT_F32, ACC><<<g, th, 0, st>>>(*m, x, T, y, acc); break;
    case K3_WFMT_BF16: k_dense<K3_WFMT_BF16, ACC><<<g, th, 0, st>>>(*m, x, T, y, acc); break;
    case K3_WFMT_F16: k_dense<K3_WFMT_F16, ACC><<<g, th, 0, st>>>(*m, x, T, y, acc); break;
    case K3_WFMT_FP8_BLOCK: k_dense<K3_WFMT_FP8_BLOCK, ACC><<<g, th, 0, st>>>(*m, x, T, y, acc); break;
    case K3_WFMT_NVFP4: k_dense<K3_WFMT_NVFP4, ACC><<<g, th, 0, st>>>(*m, x, T, y, acc); break;
    default: k_dense<K3_WFMT_MXFP4, ACC><<<g, th, 0, st>>>(*m, x, T, y, acc); break;
    }
}

int k3_dense_gemm(const DenseMat *m, const float *x, int T, float *y, int accumulate, int f64, cudaStream_t st,
                  k3_error *err) {
    if (T <= 0) return K3_OK;
    if ((uintptr_t)x % 16) return k3_fail(err, K3_ERR_ARG, "dense gemm: x must be 16-byte aligned");
    int gy = (T + DENSE_TB - 1) / DENSE_TB;
    if (gy > 65535) return k3_fail(err, K3_ERR_LIMIT, "dense gemm: %d tokens, at most %d", T, 65535 * DENSE_TB);
    dim3 g((unsigned)((m->O + DENSE_WARPS - 1) / DENSE_WARPS), (unsigned)gy);
    if (f64) launch<double>(m, g, x, T, y, accumulate, st);
    else launch<float>(m, g, x, T, y, accumulate, st);
    K3_CUDA_TRY(err, cudaGetLastError());
    return K3_OK;
}
