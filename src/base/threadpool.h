/* A small persistent thread pool for the CPU kernels (`-t N`).
 *
 * The pool is created once and reused: a parallel-for wakes the parked workers, the
 * calling thread takes part as thread 0, and the call returns when every chunk is done.
 * No thread is created per call, because a T = 1 MoE step lasts only milliseconds and runs
 * a few parallel-fors. Workers spin briefly before sleeping on a condition variable so
 * back-to-back phases do not pay a futex wake each.
 *
 * Two schedules: static (chunk c always runs on thread c % n, so a thread's work is a
 * pure function of the thread count) and dynamic (an atomic counter hands out chunks; for
 * uneven work such as experts with different token counts). Neither decides numerics:
 * callers make each output element the product of exactly one chunk, so results do not
 * depend on the schedule. Left out: nesting (a task must not call back into its own pool),
 * work stealing, thread pinning. */
#ifndef K3_THREADPOOL_H
#define K3_THREADPOOL_H

#include "base/base.h"
#include <stddef.h>
#include <stdint.h>

#define K3_THREADS_MAX 256

typedef struct k3_threadpool k3_threadpool;

typedef enum k3_sched { K3_SCHED_STATIC = 0, K3_SCHED_DYNAMIC } k3_sched;

/* fn runs items [begin, end) of the range on thread `thread` (0 = the caller). */
typedef void (*k3_range_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* An API's thread-count option: 0 (the online CPUs) .. K3_THREADS_MAX, else K3_ERR_ARG naming
 * "who: n_threads". */
int k3_threads_check(const char *who, int n_threads, k3_error *err);

/* n_threads in [1, K3_THREADS_MAX]; 1 makes a pool without workers. */
int k3_threadpool_create(int n_threads, k3_threadpool **out, k3_error *err);
void k3_threadpool_free(k3_threadpool *pool); /* NULL is fine */
int k3_threadpool_size(const k3_threadpool *pool); /* 1 for NULL */

/* A grow-only scratch buffer owned by the pool (64-byte aligned, contents undefined),
 * valid until the next call or k3_threadpool_free: callers that run every step (a T = 1
 * MoE call) reuse the same pages instead of faulting fresh ones in from malloc/mmap each
 * time. NULL for a NULL pool or when out of memory. Not reentrant, like k3_parallel_for. */
void *k3_threadpool_workspace(k3_threadpool *pool, size_t bytes);

/* Runs fn over [0, n) cut into chunks of `chunk` items (chunk >= 1; the last may be short).
 * pool == NULL runs everything on the caller. Not reentrant for one pool. */
void k3_parallel_for(k3_threadpool *pool, int64_t n, int64_t chunk, k3_sched sched,
                     k3_range_fn fn, void *ctx);

#endif
