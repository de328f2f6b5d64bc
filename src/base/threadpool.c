/* The persistent pool: one job slot, a generation counter that workers watch, and a
 * count of workers still busy. See threadpool.h for the contract. */
#include "base/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Spin iterations before a worker parks on the condition variable: a few tens of
 * microseconds, long enough to cover the gap between the phases of one MoE call. */
#define SPIN_ITERS 20000

typedef struct job {
    k3_range_fn fn;
    void *ctx;
    int64_t n, chunk, n_chunks;
    k3_sched sched;
    atomic_int_fast64_t next; /* dynamic: next chunk to hand out */
} job;

struct k3_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_uint gen;     /* bumped for every job; workers run when it changes */
    atomic_int busy;     /* workers that have not finished the current job */
    atomic_bool quit;
    job job;
    void *ws; /* k3_threadpool_workspace */
    size_t ws_bytes;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_chunk(job *j, int64_t c, int thread) {
    int64_t b = c * j->chunk, e = b + j->chunk;
    if (e > j->n) e = j->n;
    j->fn(j->ctx, b, e, thread);
}

static void run_share(k3_threadpool *p, int thread) {
    job *j = &p->job;
    if (j->sched == K3_SCHED_STATIC) {
        for (int64_t c = thread; c < j->n_chunks; c += p->n_threads) run_chunk(j, c, thread);
    } else {
        for (;;) {
            int64_t c = atomic_fetch_add(&j->next, 1);
            if (c >= j->n_chunks) break;
            run_chunk(j, c, thread);
        }
    }
}

typedef struct worker_arg {
    k3_threadpool *pool;
    int thread;
} worker_arg;

static void *worker_main(void *argp) {
    worker_arg a = *(worker_arg *)argp;
    free(argp);
    k3_threadpool *p = a.pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load(&p->gen);
        for (int i = 0; g == seen && i < SPIN_ITERS && !atomic_load(&p->quit); i++) {
            cpu_relax();
            g = atomic_load(&p->gen);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) return NULL;
        seen = g;
        run_share(p, a.thread);
        if (atomic_fetch_sub(&p->busy, 1) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

int k3_threads_check(const char *who, int n_threads, k3_error *err) {
    if (n_threads < 0 || n_threads > K3_THREADS_MAX)
        return k3_fail(err, K3_ERR_ARG, "%s: n_threads: expected 0..%d, found %d", who, K3_THREADS_MAX, n_threads);
    return K3_OK;
}

int k3_threadpool_create(int n_threads, k3_threadpool **out, k3_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > K3_THREADS_MAX)
        return k3_fail(err, K3_ERR_ARG, "threads: expected 1..%d, found %d", K3_THREADS_MAX,
                       n_threads);
    k3_threadpool *p = calloc(1, sizeof *p);
    if (!p) return k3_fail(err, K3_ERR_NOMEM, "threadpool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->busy, 0);
    atomic_init(&p->quit, false);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads, sizeof *p->threads);
        if (!p->threads) {
            k3_threadpool_free(p);
            return k3_fail(err, K3_ERR_NOMEM, "threadpool: out of memory");
        }
    }
    for (int t = 1; t < n_threads; t++) {
        worker_arg *a = malloc(sizeof *a);
        int rc = a ? 0 : ENOMEM;
        if (a) {
            a->pool = p;
            a->thread = t;
            rc = pthread_create(&p->threads[t], NULL, worker_main, a);
            if (rc) free(a);
        }
        if (rc) {
            p->n_threads = t; /* join only the ones that started */
            k3_threadpool_free(p);
            return k3_fail(err, K3_ERR_INTERNAL, "threadpool: starting thread %d of %d: %s", t,
                           n_threads, strerror(rc));
        }
    }
    *out = p;
    return K3_OK;
}

void k3_threadpool_free(k3_threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->n_threads; t++) pthread_join(p->threads[t], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p->ws);
    free(p);
}

void *k3_threadpool_workspace(k3_threadpool *p, size_t bytes) {
    if (!p) return NULL;
    if (bytes <= p->ws_bytes) return p->ws;
    size_t n = (bytes + 63) / 64 * 64;
    void *w = aligned_alloc(64, n);
    if (!w) return NULL;
    free(p->ws);
    p->ws = w;
    p->ws_bytes = n;
    return w;
}

int k3_threadpool_size(const k3_threadpool *p) { return p ? p->n_threads : 1; }

void k3_parallel_for(k3_threadpool *p, int64_t n, int64_t chunk, k3_sched sched,
                     k3_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (chunk < 1) chunk = 1;
    int64_t n_chunks = (n + chunk - 1) / chunk;
    if (!p || p->n_threads == 1 || n_chunks == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    job *j = &p->job;
    j->fn = fn;
    j->ctx = ctx;
    j->n = n;
    j->chunk = chunk;
    j->n_chunks = n_chunks;
    j->sched = sched;
    atomic_store(&j->next, 0);
    atomic_store(&p->busy, p->n_threads - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->gen, 1); /* publishes the job (seq_cst) */
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    run_share(p, 0);
    for (int i = 0; atomic_load(&p->busy) > 0 && i < SPIN_ITERS; i++) cpu_relax();
    if (atomic_load(&p->busy) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->busy) > 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
