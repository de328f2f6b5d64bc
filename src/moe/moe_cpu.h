/* The fast CPU path of the routed-expert operator (issue 4 item 4).
 *
 * Same contract as k3_moe_experts_ref (moe.h): y[T, H] = sum over the k slots of
 * w[t, slot] * expert_{ids[t, slot]}(x[t]), local experts only, y fully overwritten, in
 * float32. How it gets there:
 *  - tokens are sorted by expert with a counting sort; experts without tokens are skipped;
 *  - expert weights stay packed in file layout (NVFP4, MXFP4; BF16 and F32 as baselines)
 *    and are decoded in registers inside the dot products;
 *  - FC1 computes the gate and up rows together and applies the activation in the same
 *    pass; FC2 follows; the finalize sums the k slots of each token in slot order, in
 *    fp32, so results are identical for any thread count;
 *  - work is split over output rows of each expert (so T = 1 uses every thread): the rows
 *    of all active experts form one sequence of passes, each prefetching the next (an
 *    expert with one token through the multi-row kernel, with SiTU applied 16 outputs at a
 *    time; one with several through the multi-token dot kernel).
 * Kernels: a portable scalar one, AVX2+FMA+F16C and AVX-512 (F/BW/VL), compiled with
 * function-level target attributes and chosen at run time; `isa` forces one (tests run
 * every kernel the machine has).
 * Modes (moe.h): W4A16 for any supported format; W4A4 for NVFP4 (activations quantized
 * per 16 with g1 = 1/max w1.input_scale, g2 = 1/max w2.input_scale over local experts);
 * W4A8 for MXFP4 (MXFP8 activations per 32); W4A16_BF16 for any supported format (both GEMM
 * inputs rounded to bf16, sums as in W4A16). All matrices of one call share one format.
 * Left out: other weight formats (FP8 block, F16) -> K3_ERR_UNSUPPORTED; bias terms. */
#ifndef K3_MOE_CPU_H
#define K3_MOE_CPU_H

#include "base/threadpool.h"
#include "moe/moe.h"

typedef enum k3_cpu_isa {
    K3_ISA_AUTO = 0, /* the best the CPU supports */
    K3_ISA_SCALAR,
    K3_ISA_AVX2,   /* AVX2 + FMA + F16C */
    K3_ISA_AVX512, /* AVX-512 F/BW/VL */
    K3_ISA_COUNT
} k3_cpu_isa;

const char *k3_cpu_isa_name(k3_cpu_isa isa);
/* Whether this CPU (and this build) can run the kernel; AUTO and SCALAR always can. */
int k3_cpu_isa_available(k3_cpu_isa isa);
/* What AUTO resolves to on this machine. */
k3_cpu_isa k3_cpu_isa_best(void);

/* pool may be NULL (single thread). Errors: bad arguments, ids outside [0, n_experts),
 * unsupported formats or modes, a missing input_scale in W4A4, an unavailable isa. */
int k3_moe_experts_cpu(const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                       const int32_t *ids, const float *w, int k, float *y,
                       k3_threadpool *pool, k3_error *err);
int k3_moe_experts_cpu_isa(const k3_experts *ex, k3_act_mode mode, const float *x, int T,
                           const int32_t *ids, const float *w, int k, float *y,
                           k3_threadpool *pool, k3_cpu_isa isa, k3_error *err);

#endif
