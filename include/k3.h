/* k3 — the public API of the Kimi K3 inference engine.
 *
 * One narrow header: opaque handles, options structs filled with designated initializers,
 * int status codes (K3_OK == 0) with k3_status_str, and a caller-owned k3_error that receives
 * a message naming the file, tensor and field at fault. Every close/free accepts NULL.
 * The CLI and any front-end include only this header. */
#ifndef K3_H
#define K3_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status and errors ------------------------------------------------------------ */

enum {
    K3_OK = 0,
    K3_ERR_ARG,         /* a bad argument or option from the caller */
    K3_ERR_IO,          /* open/read/write/mmap failed (message carries strerror) */
    K3_ERR_FORMAT,      /* a malformed file: header, JSON, offsets, shapes */
    K3_ERR_DTYPE,       /* a tensor of the wrong dtype */
    K3_ERR_SHAPE,       /* a tensor of the wrong shape */
    K3_ERR_MISSING,     /* a required tensor, field or scale is absent */
    K3_ERR_DUPLICATE,   /* a name present twice */
    K3_ERR_NUMERIC,     /* NaN, Inf, zero or negative where a finite positive value is needed */
    K3_ERR_UNSUPPORTED, /* well-formed, but k3 does not implement it */
    K3_ERR_LIMIT,       /* beyond a stated limit (size cap, top-k, tokens per launch) */
    K3_ERR_NOMEM,
    K3_ERR_DEVICE,      /* no GPU, or a CUDA/NCCL failure */
    K3_ERR_INTERNAL,
    K3_STATUS_COUNT
};

const char *k3_status_str(int status);

/* Caller-owned error: the callee writes the status and one line naming what is wrong. */
typedef struct k3_error {
    int status;
    char msg[1024];
} k3_error;

/* The build: version string, commit and which backends were compiled in. */
const char *k3_version(void);
const char *k3_build_commit(void);
int k3_have_cuda(void); /* 1 when built with CUDA (a device may still be absent) */

/* ---- benchmarks (`k3 bench moe`) ---------------------------------------------------- */

/* One routed-expert layer timed on synthetic weights built in memory (k3's quantizer) with
 * uniform random routing, plus the machine's own ceilings measured in the same run: a
 * streaming-read bandwidth probe over a buffer much larger than the last-level cache and an
 * FMA throughput probe, both on the same threads. Zero fields take the defaults shown. */
typedef struct k3_bench_moe_opts {
    const char *backend;   /* "cpu" (default), "ref", "cuda", "cuda-fused" */
    const char *format;    /* "nvfp4" (default), "mxfp4", "bf16" */
    const char *mode;      /* "w4a16" (default), "w4a4" (nvfp4), "w4a8" (mxfp4) */
    const char *isa;       /* cpu backend: "auto" (default), "scalar", "avx2", "avx512" */
    int n_experts, top_k, hidden, inter; /* 0: the Kimi K3 layer 896, 16, 3584, 3072 */
    int experts_built;     /* distinct experts in memory (routing uses only these);
                              0: as many as fit in mem_budget_gib, at most n_experts */
    double mem_budget_gib; /* 0: 6 */
    int threads;           /* 0: all online CPUs */
    int repeats, warmup;   /* 0: 5 and 1 */
    uint64_t seed;         /* routing and weights; 0: 1 */
    int warm;              /* 1: one routing per token count and no cache flush between
                              repeats (how micro-benchmarks such as ggml's perf mode run) */
} k3_bench_moe_opts;

typedef struct k3_bench_moe_row {
    int tokens;
    double experts_touched;   /* mean over the timed repeats (routing is redrawn each time) */
    double t_median_s, t_min_s, t_max_s;
    double weight_bytes;      /* expert weight + scale bytes the call must read (mean) */
    double flops;             /* 2 * tokens * top_k * (3 * H * I gated, 2 * H * I not) */
    double read_gbs;          /* cold runs: median of the read probes (the cache flushes) taken
                                 right before each timed call, so the fraction compares like
                                 with like on a machine whose bandwidth drifts; warm: 0 */
} k3_bench_moe_row;

typedef struct k3_bench_moe_env {
    char cpu[128];            /* model name from /proc/cpuinfo */
    char isa[16];             /* kernel that ran (cpu backend) */
    char format[16], mode[16], backend[16];
    int threads;
    int n_experts, top_k, hidden, inter;
    int experts_built;        /* routing draws from these */
    int experts_quantized;    /* of which quantized from random floats; the rest re-randomize
                                 those packed codes (same format, valid codes, fresh memory) */
    double bytes_per_expert;
    double read_gbs;          /* streaming-read probe, GB/s (1e9 bytes) */
    double probe_bytes;       /* size of its buffer */
    double llc_bytes;         /* last-level cache size the OS reports (0 if unknown) */
    double fma_gflops;        /* fp32 FMA peak probe with the kernel's vector width */
    int warm;                 /* the run was warm (see k3_bench_moe_opts.warm) */
} k3_bench_moe_env;

/* rows[n_tokens] receives one row per entry of tokens[]. */
int k3_bench_moe(const k3_bench_moe_opts *opts, const int *tokens, int n_tokens,
                 k3_bench_moe_row *rows, k3_bench_moe_env *env, k3_error *err);

#ifdef __cplusplus
}
#endif
#endif
