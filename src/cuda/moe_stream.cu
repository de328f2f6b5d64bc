/* The kernels over the streaming engine (moe_stream.cuh) and their launches.
 *
 * Grouped backend, decode sizes (below the wgmma switch): k_prep (moe_run.cu) -> k_sfc FC1 ->
 * k_sconv (K ranges summed, activation, FC2 B layout) -> k_sfc FC2 -> k_finalize.
 * Fused backend: k_sfused, one cooperative persistent kernel doing the same five stages with
 * four grid barriers over one CTA per SM; T <= K3_CUDA_FUSED_MAX_TOKENS and T*k <=
 * K3_CUDA_FUSED_MAX_SLOTS (moe_run.cu checks, K3_ERR_LIMIT beyond).
 * Specializations: k_sfc by format x tokens per work item x fp16 terms x FC1/FC2 (it does no
 * activation); k_sconv by activation; k_sfused by format x activation. */
#include "cuda/cuda_check.cuh"
#include "cuda/k3_cuda.h"
#include "cuda/moe_state.cuh"
#include "cuda/moe_stream.cuh"

extern "C" {
#include "base/base.h"
}

template <int FMT, int NT, int NP, int FC2>
__global__ void __launch_bounds__(S_THREADS, 1) k_sfc(MoeDev m, MoeRun r) {
    extern __shared__ __align__(128) unsigned char sm[];
    const uint32_t sbase = smem_u32(sm), bars = sbase + S_STAGES * st_bytes(4 * NT * (3 - NP), NP);
    ring_init(bars);
    uint32_t it = 0;
    stream_phase<FMT, NT, NP, FC2>(m, r, sbase, bars, it, r.ctl[1]);
}

template <int ACT>
__global__ void __launch_bounds__(256) k_sconv(MoeDev m, MoeRun r) {
    extern __shared__ float hrow[]; /* I + 32 floats */
    for (int p = blockIdx.x; p < r.ctl[0]; p += gridDim.x) sconv_row<ACT>(m, r, p, hrow, hrow + m.I);
}

/* Phase 0 (dispatch by CTA 0, x rows by the others) uses the ring's memory as scratch, and so
 * does the h phase; the fences order those ordinary accesses before the next bulk copies. */
template <int FMT, int ACT>
__global__ void __launch_bounds__(S_THREADS, 1) k_sfused(MoeDev m, MoeRun r) {
    extern __shared__ __align__(128) unsigned char sm[];
    const uint32_t sbase = smem_u32(sm), bars = sbase + S_STAGES * st_bytes(4, 2);
    const int nb = gridDim.x;
    const unsigned long long base = r.bar_base;
    ring_init(bars);
    if (blockIdx.x == 0) moe_dispatch(m, r, (int *)sm);
    else
        for (int t = blockIdx.x - 1; t < r.T; t += nb - 1) prep_x_row(m, r, t, (float *)sm);
    fence_proxy_async();
    grid_sync(r.bar, base + (unsigned long long)nb);
    const int W = *(volatile int *)(r.ctl + 1), P = *(volatile int *)r.ctl;
    uint32_t it = 0;
    stream_phase<FMT, 1, 2, 0>(m, r, sbase, bars, it, W);
    grid_sync(r.bar, base + 2ull * nb);
    for (int p = blockIdx.x; p < P; p += nb) sconv_row<ACT>(m, r, p, (float *)sm, (float *)sm + m.I);
    fence_proxy_async();
    grid_sync(r.bar, base + 3ull * nb);
    stream_phase<FMT, 1, 2, 1>(m, r, sbase, bars, it, W);
    grid_sync(r.bar, base + 4ull * nb);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < r.T * m.H; i += nb * blockDim.x)
        finalize_elem(m, r, i / m.H, i % m.H);
}

typedef void (*kern_t)(MoeDev, MoeRun);

#define SFC(F, N, P, C) (kern_t)k_sfc<F, N, P, C>
#define SFC_NT(F, P, C) {SFC(F, 1, P, C), SFC(F, 2, P, C), SFC(F, 4, P, C)}
/* [fc2][terms - 1][fmt][nt index] */
static const kern_t sfc_table[2][2][2][3] = {
    {{SFC_NT(FMT_NV, 1, 0), SFC_NT(FMT_MX, 1, 0)}, {SFC_NT(FMT_NV, 2, 0), SFC_NT(FMT_MX, 2, 0)}},
    {{SFC_NT(FMT_NV, 1, 1), SFC_NT(FMT_MX, 1, 1)}, {SFC_NT(FMT_NV, 2, 1), SFC_NT(FMT_MX, 2, 1)}},
};
#define SACTS(X, F)                                                                                           \
    X(F, K3_ACT_IDENTITY), X(F, K3_ACT_GELU), X(F, K3_ACT_RELU), X(F, K3_ACT_SILU), X(F, K3_ACT_SWIGLU),      \
        X(F, K3_ACT_GEGLU), X(F, K3_ACT_SWIGLU_BIAS), X(F, K3_ACT_RELU2), X(F, K3_ACT_SITU)
#define SCONV(F, A) (kern_t)k_sconv<A>
#define SFUSED(F, A) (kern_t)k_sfused<F, A>
static const kern_t sconv_table[9] = {SACTS(SCONV, 0)};
static const kern_t sfused_table[2][9] = {{SACTS(SFUSED, FMT_NV)}, {SACTS(SFUSED, FMT_MX)}};

static int nsm_of(k3_cuda_moe *m, k3_error *err) {
    if (!m->nsm) K3_CUDA_TRY(err, cudaDeviceGetAttribute(&m->nsm, cudaDevAttrMultiProcessorCount, m->device));
    return K3_OK;
}

int moe_stream_fc(k3_cuda_moe *m, const MoeDev &d, const MoeRun &r, int fc2, int nt, cudaStream_t st, k3_error *err) {
    const int nti = nt == 1 ? 0 : nt == 2 ? 1 : 2, tn = 4 * nt * (3 - r.np);
    const int bit = ((fc2 * 2 + r.np - 1) * 2 + m->fmt) * 3 + nti;
    const kern_t k = sfc_table[fc2][r.np - 1][m->fmt][nti];
    const int smem = st_smem(tn, r.np);
    if (nsm_of(m, err)) return err->status;
    if (!(m->sfc_attr & (1u << bit))) {
        K3_CUDA_TRY(err, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        m->sfc_attr |= 1u << bit;
    }
    k<<<m->nsm, S_THREADS, smem, st>>>(d, r);
    return K3_OK;
}

int moe_stream_conv(k3_cuda_moe *m, const MoeDev &d, const MoeRun &r, cudaStream_t st, k3_error *err) {
    const kern_t k = sconv_table[(int)m->act - 1];
    const int smem = (d.I + 32) * 4, S = r.T * r.k;
    if (nsm_of(m, err)) return err->status;
    if (smem > 48 * 1024 && !m->sconv_attr) {
        K3_CUDA_TRY(err, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        m->sconv_attr = 1;
    }
    k<<<S < 8 * m->nsm ? S : 8 * m->nsm, 256, smem, st>>>(d, r);
    return K3_OK;
}

int moe_stream_fused(k3_cuda_moe *m, const MoeDev &d, const MoeRun &r, cudaStream_t st, k3_error *err) {
    const kern_t k = sfused_table[m->fmt][(int)m->act - 1];
    const int smem = st_smem(4, 2);
    if (!m->sfused_grid) { /* every block must be co-resident: the grid barrier waits for all */
        int per_sm = 0;
        if (nsm_of(m, err)) return err->status;
        K3_CUDA_TRY(err, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        K3_CUDA_TRY(err, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, S_THREADS, smem));
        m->sfused_grid = per_sm * m->nsm;
    }
    const int grid = m->sfused_grid;
    if (grid < 2)
        return k3_fail(err, K3_ERR_LIMIT, "cuda-fused: only %d co-resident blocks fit on the device, the fused kernel needs 2",
                       grid);
    void *args[2] = {(void *)&d, (void *)&r};
    cudaError_t ce = cudaLaunchCooperativeKernel((const void *)k, dim3(grid), dim3(S_THREADS), args, (size_t)smem, st);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        return k3_cuda_fail(err, ce, "cudaLaunchCooperativeKernel(k_sfused)", __FILE__, __LINE__);
    }
    return K3_OK;
}

/* Whether a shape fits the fused kernel's shared memory: the h row and the dispatch counters
 * live in the ring's memory between the GEMM phases. */
int moe_stream_fused_fits(const MoeDev &d, int *need, int *have) {
    const int a = (d.I + 32) * 4, b = (3 * (d.n_local + 1) + 33) * 4;
    *need = a > b ? a : b;
    *have = S_STAGES * st_bytes(4, 2);
    return *need <= *have;
}

/* K ranges per unit: the fewest that bring the busiest CTA within 3% of the average, from the
 * expected units (uniform routing); more ranges cost partial-sum traffic, never correctness. */
int moe_stream_ks(int units, int nsm, int nk, size_t bytes_per_range, size_t cap) {
    int best = 1;
    double bc = ceil((double)units / nsm);
    for (int ks = 2; ks <= S_KS_MAX && ks <= nk && bytes_per_range * ks <= cap; ks++) {
        const double c = ceil((double)units * ks / nsm) / ks;
        if (c < bc * 0.97) best = ks, bc = c;
    }
    return best;
}
