/* The thread pool: every item runs exactly once for both schedules and many shapes, the
 * static schedule gives chunk c to thread c % n, the pool is reused across many calls, and
 * bad thread counts are rejected by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/threadpool.h"

typedef struct count_ctx {
    atomic_int *hits;
    int64_t chunk;
    int n_threads;
    atomic_int bad_owner;
    atomic_int bad_thread;
} count_ctx;

static void count_fn(void *vctx, int64_t b, int64_t e, int thread) {
    count_ctx *c = vctx;
    if (thread < 0 || thread >= c->n_threads) atomic_fetch_add(&c->bad_thread, 1);
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void static_owner_fn(void *vctx, int64_t b, int64_t e, int thread) {
    count_ctx *c = vctx;
    count_fn(vctx, b, e, thread);
    if (c->n_threads > 1 && (b / c->chunk) % c->n_threads != thread)
        atomic_fetch_add(&c->bad_owner, 1);
}

static void run_case(k3_threadpool *pool, int64_t n, int64_t chunk, k3_sched sched) {
    atomic_int *hits = calloc((size_t)(n > 0 ? n : 1), sizeof *hits);
    assert_non_null(hits);
    count_ctx c = {.hits = hits, .chunk = chunk, .n_threads = k3_threadpool_size(pool)};
    atomic_init(&c.bad_owner, 0);
    atomic_init(&c.bad_thread, 0);
    k3_parallel_for(pool, n, chunk, sched, sched == K3_SCHED_STATIC ? static_owner_fn : count_fn,
                    &c);
    for (int64_t i = 0; i < n; i++) assert_int_equal(atomic_load(&hits[i]), 1);
    assert_int_equal(atomic_load(&c.bad_owner), 0);
    assert_int_equal(atomic_load(&c.bad_thread), 0);
    free(hits);
}

static void test_every_item_once(void **state) {
    (void)state;
    const int threads[] = {1, 2, 3, 5};
    const int64_t ns[] = {0, 1, 2, 7, 64, 1000, 4099};
    const int64_t chunks[] = {1, 3, 16, 5000};
    for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
        k3_threadpool *pool = NULL;
        k3_error err = {0};
        assert_int_equal(k3_threadpool_create(threads[ti], &pool, &err), K3_OK);
        assert_int_equal(k3_threadpool_size(pool), threads[ti]);
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (size_t ci = 0; ci < sizeof chunks / sizeof *chunks; ci++) {
                run_case(pool, ns[ni], chunks[ci], K3_SCHED_STATIC);
                run_case(pool, ns[ni], chunks[ci], K3_SCHED_DYNAMIC);
            }
        k3_threadpool_free(pool);
    }
    run_case(NULL, 100, 7, K3_SCHED_DYNAMIC); /* NULL pool runs on the caller */
}

typedef struct sum_ctx {
    atomic_llong sum;
} sum_ctx;

static void sum_fn(void *vctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    sum_ctx *c = vctx;
    long long s = 0;
    for (int64_t i = b; i < e; i++) s += i;
    atomic_fetch_add(&c->sum, s);
}

/* Thousands of back-to-back jobs on one pool: catches lost wake-ups and a job slot reused
 * while a worker still reads it (the test would hang or miscount). */
static void test_reuse_many_calls(void **state) {
    (void)state;
    k3_threadpool *pool = NULL;
    k3_error err = {0};
    assert_int_equal(k3_threadpool_create(2, &pool, &err), K3_OK);
    for (int it = 0; it < 20000; it++) {
        sum_ctx c;
        atomic_init(&c.sum, 0);
        int64_t n = 1 + it % 97;
        k3_parallel_for(pool, n, 1 + it % 5, it & 1 ? K3_SCHED_DYNAMIC : K3_SCHED_STATIC, sum_fn,
                        &c);
        assert_int_equal(atomic_load(&c.sum), n * (n - 1) / 2);
    }
    k3_threadpool_free(pool);
    k3_threadpool_free(NULL);
}

static void test_bad_thread_counts(void **state) {
    (void)state;
    k3_threadpool *pool = (k3_threadpool *)1;
    k3_error err = {0};
    assert_int_equal(k3_threadpool_create(0, &pool, &err), K3_ERR_ARG);
    assert_null(pool);
    assert_non_null(strstr(err.msg, "threads"));
    assert_int_equal(k3_threadpool_create(K3_THREADS_MAX + 1, &pool, &err), K3_ERR_ARG);
    assert_null(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_item_once),
        cmocka_unit_test(test_reuse_many_calls),
        cmocka_unit_test(test_bad_thread_counts),
    };
    return cmocka_run_group_tests_name("threadpool", tests, NULL, NULL);
}
