/* The tensor cores' bf16 rate as this device delivers it, for the FLOP floors of the
 * benchmarks: every SM runs two warpgroups issuing wgmma m64n128k16 (bf16 in, fp32 accumulate)
 * back to back from shared memory, with no global traffic. An upper bound on what any bf16
 * GEMM reaches (the PyTorch matmul figure of tools/gpu-check sits below it). sm_90a only. */
#include "cuda/cuda_check.cuh"
#include "cuda/k3_cuda.h"
#include "cuda/moe_state.cuh"
#include "cuda/moe_wgmma.cuh"

extern "C" {
#include "base/base.h"
}

#define PEAK_BATCH 16 /* wgmma per commit group */

__device__ __forceinline__ void wgmma_bf16_n128(float *d, uint64_t da, uint64_t db) {
#if K3_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(1));
#else
    (void)d, (void)da, (void)db;
    __trap();
#endif
}

__global__ void __launch_bounds__(256, 1) k_peak(int batches, float *sink) {
    __shared__ __align__(1024) uint16_t sa[64 * 16], sb[128 * 16];
    for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) sa[i] = (uint16_t)(0x3F80 + (i & 7)); /* ~1.0 */
    for (int i = threadIdx.x; i < 128 * 16; i += blockDim.x) sb[i] = (uint16_t)(0x3C00 + (i & 15));
    fence_async_smem();
    __syncthreads();
    /* K-major, unswizzled: 8-row core matrices of 128 B, K-adjacent at 128 B, M/N-adjacent at 256 B */
    const uint64_t da = wg_desc(smem_u32(sa), 128, 256), db = wg_desc(smem_u32(sb), 128, 256);
    float d[64];
    for (int i = 0; i < 64; i++) d[i] = 0.f;
    wg_fence();
    for (int b = 0; b < batches; b++) {
#pragma unroll
        for (int i = 0; i < PEAK_BATCH; i++) wgmma_bf16_n128(d, da, db);
        wg_commit();
        wg_wait<1>();
    }
    wg_wait<0>();
    float s = 0.f;
    for (int i = 0; i < 64; i++) s += d[i];
    if (s == 12345.f) *sink = s; /* keeps the work observable; never true for these inputs */
}

extern "C" int k3_cuda_bf16_peak(double *flops_per_s, k3_error *err) {
    *flops_per_s = 0;
    int probe = 0, nsm = 0, dev = 0, ndev = 0;
    char name[256];
    if (k3_cuda_device_count(&ndev, name, sizeof name, err)) return err->status;
    if (ndev == 0) return k3_fail(err, K3_ERR_DEVICE, "bf16 peak: no CUDA device (%s)", name);
    K3_CUDA_TRY(err, cudaGetDevice(&dev));
    K3_CUDA_TRY(err, cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    if (moe_wg_probe(&probe, err)) return err->status;
    if (!probe) return k3_fail(err, K3_ERR_UNSUPPORTED, "bf16 peak: this binary or device has no sm_90a kernels");
    float *sink = NULL;
    K3_CUDA_TRY(err, cudaMalloc(&sink, sizeof(float)));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const int batches = 2000;
    double best = 0;
    cudaError_t ce = cudaSuccess;
    for (int rep = 0; rep < 4 && ce == cudaSuccess; rep++) { /* first run warms clocks up */
        cudaEventRecord(e0);
        k_peak<<<nsm, 256>>>(batches, sink);
        cudaEventRecord(e1);
        ce = cudaEventSynchronize(e1);
        if (ce == cudaSuccess) ce = cudaGetLastError();
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        double fl = 2.0 * 64 * 128 * 16 * PEAK_BATCH * (double)batches * 2 /* warpgroups */ * nsm;
        if (ms > 0 && fl / (ms * 1e-3) > best) best = fl / (ms * 1e-3);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(sink);
    if (ce != cudaSuccess) return k3_cuda_fail(err, ce, "k_peak", __FILE__, __LINE__);
    *flops_per_s = best;
    return K3_OK;
}
