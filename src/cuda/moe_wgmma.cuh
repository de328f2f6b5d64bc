/* sm_90a building blocks of the prefill path (moe_prefill.cu): warpgroup MMA with the weight
 * fragment in registers and the activations in shared memory, shared-memory descriptors, and
 * cp.async gathers. Compiled to real instructions only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL);
 * other targets get a trap, and the host never selects the path there (moe_prefill_ok). */
#ifndef K3_MOE_WGMMA_CUH
#define K3_MOE_WGMMA_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define K3_WGMMA 1
#else
#define K3_WGMMA 0
#endif

/* Descriptor of a K-major, unswizzled operand (the peak probe, peak.cu): core matrices of 8 rows
 * x 16 bytes stored as 128 contiguous bytes; lbo = bytes between core matrices adjacent in K,
 * sbo = adjacent in N; swizzle mode 0. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

/* Descriptor of a K-major operand in the 128-byte swizzle layout (PTX "matrix descriptor":
 * address >> 4 in bits 0-13, lbo >> 4 in 16-29, sbo >> 4 in 32-45, swizzle mode in 62-63, 1 =
 * 128 B). Rows of 64 fp16 (128 B), 8 rows to a 1024-byte atom, atoms sbo = 1024 apart; lbo is
 * not used when the instruction's K (32 B) lies inside one row. The atom must be 1024-byte
 * aligned (the XOR reads address bits 7-9 as the row); a 16-k step inside it advances the start
 * address by 32 B and the hardware applies the XOR to every address it forms. The upper word
 * (sbo, swizzle mode) is the same for every such operand: only the lower word is computed. */
__device__ __forceinline__ uint32_t wg_desc_sw128_lo(uint32_t smem_addr) {
    return ((smem_addr & 0x3FFFF) >> 4) | (1u << 16);
}
#define WG_DESC_SW128_HI ((1024u >> 4) | (1u << 30))

/* The first 1024-byte boundary at or after a shared-memory address (the swizzled B atoms need
 * it; kernels ask for WG_ALIGN_SLACK more dynamic shared memory than their stages take). */
#define WG_ALIGN_SLACK 1024
__device__ __forceinline__ uint32_t wg_align1024(uint32_t a) { return (a + 1023u) & ~1023u; }

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void wg_fence() {
#if K3_WGMMA
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if K3_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
/* Waits until at most N of this warpgroup's committed wgmma groups are still running. */
template <int N>
__device__ __forceinline__ void wg_wait() {
#if K3_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}

/* The tensor cores read shared memory through the async proxy: ordinary writes (cp.async
 * included) must be fenced into it before the barrier that precedes the wgmma. */
__device__ __forceinline__ void fence_async_smem() {
#if K3_WGMMA
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* d[64 x N] += A[64 x 16] (registers, this warp's 16 rows) * B[16 x N] (the 128-byte swizzle
 * descriptor whose lower word is dlo, plus OFF bytes, added inside the asm so that the compiler
 * keeps one base live rather than one per instruction; a 32-bit add, as the address field cannot
 * carry: shared memory is < 256 KB. The 64-bit form cost 25 more instructions per two stages of
 * k_wgp's consumer loop, sixteenth session).
 * d: N / 2 floats per thread. One wrapper per tile width the kernels use (the operand lists
 * differ in length, so each is spelled out). */
template <int OFF>
__device__ __forceinline__ void wgmma_n32(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t dlo) {
#if K3_WGMMA
    asm volatile("{\n.reg .pred p;\n.reg .b64 dd;\nsetp.ne.b32 p, %21, 0;\n.reg .b32 lo, hi;\nadd.u32 lo, %20, %22;\nmov.b32 hi, %23;\nmov.b64 dd, {lo, hi};\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
                 "{%16,%17,%18,%19}, dd, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(dlo), "r"(1), "n"(OFF >> 4), "n"(WG_DESC_SW128_HI));
#else
    (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)dlo;
    __trap();
#endif
}

template <int OFF>
__device__ __forceinline__ void wgmma_n48(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t dlo) {
#if K3_WGMMA
    asm volatile("{\n.reg .pred p;\n.reg .b64 dd;\nsetp.ne.b32 p, %29, 0;\n.reg .b32 lo, hi;\nadd.u32 lo, %28, %30;\nmov.b32 hi, %31;\nmov.b64 dd, {lo, hi};\n"
                 "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, "
                 "{%24,%25,%26,%27}, dd, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(dlo), "r"(1), "n"(OFF >> 4), "n"(WG_DESC_SW128_HI));
#else
    (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)dlo;
    __trap();
#endif
}

template <int OFF>
__device__ __forceinline__ void wgmma_n64(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t dlo) {
#if K3_WGMMA
    asm volatile("{\n.reg .pred p;\n.reg .b64 dd;\nsetp.ne.b32 p, %37, 0;\n.reg .b32 lo, hi;\nadd.u32 lo, %36, %38;\nmov.b32 hi, %39;\nmov.b64 dd, {lo, hi};\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%32,%33,%34,%35}, dd, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(dlo), "r"(1), "n"(OFF >> 4), "n"(WG_DESC_SW128_HI));
#else
    (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)dlo;
    __trap();
#endif
}

template <int OFF>
__device__ __forceinline__ void wgmma_n80(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t dlo) {
#if K3_WGMMA
    asm volatile("{\n.reg .pred p;\n.reg .b64 dd;\nsetp.ne.b32 p, %45, 0;\n.reg .b32 lo, hi;\nadd.u32 lo, %44, %46;\nmov.b32 hi, %47;\nmov.b64 dd, {lo, hi};\n"
                 "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39}, "
                 "{%40,%41,%42,%43}, dd, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(dlo), "r"(1), "n"(OFF >> 4), "n"(WG_DESC_SW128_HI));
#else
    (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)dlo;
    __trap();
#endif
}

template <int OFF>
__device__ __forceinline__ void wgmma_n128(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t dlo) {
#if K3_WGMMA
    asm volatile("{\n.reg .pred p;\n.reg .b64 dd;\nsetp.ne.b32 p, %69, 0;\n.reg .b32 lo, hi;\nadd.u32 lo, %68, %70;\nmov.b32 hi, %71;\nmov.b64 dd, {lo, hi};\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "{%64,%65,%66,%67}, dd, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(dlo), "r"(1), "n"(OFF >> 4), "n"(WG_DESC_SW128_HI));
#else
    (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)dlo;
    __trap();
#endif
}

template <int OFF>
__device__ __forceinline__ void wgmma_n160(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t dlo) {
#if K3_WGMMA
    asm volatile("{\n.reg .pred p;\n.reg .b64 dd;\nsetp.ne.b32 p, %85, 0;\n.reg .b32 lo, hi;\nadd.u32 lo, %84, %86;\nmov.b32 hi, %87;\nmov.b64 dd, {lo, hi};\n"
                 "wgmma.mma_async.sync.aligned.m64n160k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79}, "
                 "{%80,%81,%82,%83}, dd, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(dlo), "r"(1), "n"(OFF >> 4), "n"(WG_DESC_SW128_HI));
#else
    (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)dlo;
    __trap();
#endif
}

template <int N, int OFF>
__device__ __forceinline__ void wgmma_tn(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t dlo) {
    static_assert(N == 32 || N == 48 || N == 64 || N == 80 || N == 128 || N == 160, "tile widths 32, 48, 64, 80, 128, 160");
    if constexpr (N == 32) wgmma_n32<OFF>(d, a0, a1, a2, a3, dlo);
    else if constexpr (N == 48) wgmma_n48<OFF>(d, a0, a1, a2, a3, dlo);
    else if constexpr (N == 64) wgmma_n64<OFF>(d, a0, a1, a2, a3, dlo);
    else if constexpr (N == 80) wgmma_n80<OFF>(d, a0, a1, a2, a3, dlo);
    else if constexpr (N == 128) wgmma_n128<OFF>(d, a0, a1, a2, a3, dlo);
    else if constexpr (N == 160) wgmma_n160<OFF>(d, a0, a1, a2, a3, dlo);
}

__device__ __forceinline__ uint4 lds128(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t a) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
    return v;
}

/* 16 bytes global -> shared, bypassing L1; src_bytes = 0 fills zeros (rows past the tile). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
/* 4 bytes global -> shared (through L1: the only form of this size). */
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* mbarriers (shared::cta, 32-bit shared addresses). mbar_wait spins on the phase of the given
 * parity; a wait that outlives any legitimate one traps, so a pipeline bug is a launch error
 * rather than a hung process. */
__device__ __forceinline__ void mbar_init(uint32_t a, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint32_t a) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
}
/* One arrival on a once this thread's earlier cp.async copies have landed (the barrier's count
 * includes it: noinc). */
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t a) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity) {
    for (uint32_t spin = 0;; spin++) {
        uint32_t ok;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(a), "r"(parity)
                     : "memory");
        if (ok) return;
        if (spin > (1u << 24)) __trap();
    }
}

/* A tensor-map copy (TMA): box (c0, c1) of the map into shared memory at dst, its bytes counted
 * on mbar's transaction count. The map is a kernel parameter (__grid_constant__) passed by
 * address. */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void *map, int c0, int c1, uint32_t mbar) {
#if K3_WGMMA
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(mbar)
                 : "memory");
#endif
}
/* The barrier's current phase also waits for `bytes` more transaction bytes. */
__device__ __forceinline__ void mbar_expect_tx(uint32_t a, uint32_t bytes) {
#if K3_WGMMA
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
#endif
}

/* Per-warpgroup register budget changes (the producer gives registers to the consumers). */
template <int R>
__device__ __forceinline__ void regs_dec() {
#if K3_WGMMA
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void regs_inc() {
#if K3_WGMMA
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
#endif
}

#endif
