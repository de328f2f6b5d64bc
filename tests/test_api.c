/* The public API as a user of the library sees it: this file includes k3.h and nothing from
 * src/, so it also proves the header is enough. It holds the header's general promises
 * (err may be NULL, a NULL handle or required pointer is K3_ERR_ARG naming the argument,
 * accessors read a NULL handle as empty, out-of-range options are errors naming the field,
 * never silently replaced by a default). What each function computes is tested beside its
 * module. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "k3.h"
#include "rm_tree.h"

static char root[256], nvfp4[300], bf16[300];

static int setup(void **state) {
    (void)state;
    snprintf(root, sizeof root, "/tmp/k3-test-api-XXXXXX");
    if (!mkdtemp(root)) return -1;
    snprintf(nvfp4, sizeof nvfp4, "%s/nvfp4", root);
    snprintf(bf16, sizeof bf16, "%s/bf16", root);
    k3_error e = {0};
    k3_make_tiny_opts o = {.dir = nvfp4, .n_threads = 2};
    if (k3_make_tiny_checkpoint(&o, &e)) return fprintf(stderr, "%s\n", e.msg), -1;
    o = (k3_make_tiny_opts){.dir = bf16, .format = "bf16", .n_threads = 2};
    if (k3_make_tiny_checkpoint(&o, &e)) return fprintf(stderr, "%s\n", e.msg), -1;
    return 0;
}
static int teardown(void **state) {
    (void)state;
    rm_tree(root);
    return 0;
}

#define expect_arg(call, e, what)                                                                  \
    do {                                                                                           \
        (e).msg[0] = 0;                                                                            \
        assert_int_equal((call), K3_ERR_ARG);                                                      \
        if (!strstr((e).msg, (what))) fail_msg("%s: message '%s' does not name %s", #call,        \
                                               (e).msg, (what));                                   \
    } while (0)

static void test_null_checkpoint(void **s) {
    (void)s;
    k3_error e = {0};
    k3_tensor_info ti;
    const char *key, *value, *fmt = NULL;
    k3_checkpoint_close(NULL);
    assert_int_equal(k3_checkpoint_tensor_count(NULL), 0);
    assert_int_equal(k3_checkpoint_shard_count(NULL), 0);
    assert_null(k3_checkpoint_shard_name(NULL, 0));
    assert_null(k3_checkpoint_path(NULL));
    assert_int_equal(k3_checkpoint_has_index(NULL), 0);
    assert_int_equal(k3_checkpoint_find(NULL, "x"), -1);
    assert_int_equal(k3_checkpoint_metadata_count(NULL, 0), 0);
    assert_null(k3_checkpoint_metadata_get(NULL, 0, "format"));
    expect_arg(k3_checkpoint_tensor_info(NULL, 0, &ti, &e), e, "ck");
    expect_arg(k3_checkpoint_metadata_at(NULL, 0, 0, &key, &value, &e), e, "ck");
    expect_arg(k3_checkpoint_weight_format(NULL, "m", &fmt, &e), e, "ck");
    assert_string_equal(fmt, "plain"); /* "set on failure too" */
    assert_int_equal(k3_checkpoint_tensor_info(NULL, 0, &ti, NULL), K3_ERR_ARG);
    assert_int_equal(k3_checkpoint_open(NULL, nvfp4, NULL), K3_ERR_ARG);
    k3_checkpoint *ck = NULL;
    expect_arg(k3_checkpoint_open(NULL, nvfp4, &e), e, "out");
    expect_arg(k3_checkpoint_open(&ck, NULL, &e), e, "path");
}

static void test_null_pointers_on_checkpoint(void **s) {
    (void)s;
    k3_error e = {0};
    k3_checkpoint *ck = NULL;
    assert_int_equal(k3_checkpoint_open(&ck, nvfp4, &e), K3_OK);
    const char *key, *value, *fmt = NULL;
    expect_arg(k3_checkpoint_tensor_info(ck, 0, NULL, &e), e, "out");
    assert_int_equal(k3_checkpoint_find(ck, NULL), -1);
    assert_null(k3_checkpoint_metadata_get(ck, 0, NULL));
    expect_arg(k3_checkpoint_metadata_at(ck, 0, 0, NULL, &value, &e), e, "key");
    expect_arg(k3_checkpoint_metadata_at(ck, 0, 0, &key, NULL, &e), e, "value");
    expect_arg(k3_checkpoint_weight_format(ck, NULL, &fmt, &e), e, "module");
    assert_string_equal(fmt, "plain");
    expect_arg(k3_checkpoint_weight_format(ck, "model.embed_tokens", NULL, &e), e, "format");
    k3_checkpoint_close(ck);
}

static void test_model_open_options(void **s) {
    (void)s;
    k3_error e = {0};
    k3_model *m = NULL;
    k3_model_opts o = {.path = nvfp4, .headers_only = 1};
    k3_model_close(NULL);
    expect_arg(k3_model_open(NULL, &o, &e), e, "out");
    assert_int_equal(k3_model_open(NULL, &o, NULL), K3_ERR_ARG);
    expect_arg(k3_model_open(&m, NULL, &e), e, "opts");
    k3_model_opts nopath = {0};
    expect_arg(k3_model_open(&m, &nopath, &e), e, "path");
    /* a rank without ep_size used to load every expert as rank 0 of 1 */
    o.ep_rank = 3;
    expect_arg(k3_model_open(&m, &o, &e), e, "ep_rank");
    assert_null(m);
    o.ep_rank = 0, o.n_layers = -1;
    expect_arg(k3_model_open(&m, &o, &e), e, "n_layers");
    o.n_layers = 2; /* entries promised, none given: used to load every layer */
    expect_arg(k3_model_open(&m, &o, &e), e, "n_layers");
    o.n_layers = 0;
    assert_int_equal(k3_model_open(&m, &o, &e), K3_OK);
    k3_layer_info li;
    k3_rank_info ri;
    expect_arg(k3_model_layer_info(m, 0, NULL, &e), e, "out");
    expect_arg(k3_model_layer_info(NULL, 0, &li, &e), e, "m");
    expect_arg(k3_model_layer_info(m, -1, &li, &e), e, "layer");
    expect_arg(k3_model_rank_info(m, 1, 0, NULL, &e), e, "out");
    expect_arg(k3_model_rank_info(NULL, 1, 0, &ri, &e), e, "m");
    assert_int_equal(k3_model_get_info(NULL, NULL), K3_ERR_ARG);
    k3_model_close(m);
}

static void test_writer_options(void **s) {
    (void)s;
    k3_error e = {0};
    char out[400];
    snprintf(out, sizeof out, "%s/out", root);
    /* out-of-range thread counts used to be replaced by the CPU count or 256 */
    k3_make_tiny_opts t = {.dir = out, .n_threads = -1};
    expect_arg(k3_make_tiny_checkpoint(&t, &e), e, "n_threads");
    t.n_threads = 1000;
    expect_arg(k3_make_tiny_checkpoint(&t, &e), e, "n_threads");
    k3_quantize_opts q = {.in = bf16, .out = out, .to = "nvfp4", .n_threads = -1};
    expect_arg(k3_quantize_checkpoint(&q, &e), e, "n_threads");
    q.n_threads = 2, q.n_only = 2; /* no array */
    expect_arg(k3_quantize_checkpoint(&q, &e), e, "only");
    const char *const one_null[] = {"experts", NULL};
    q.only = one_null;
    expect_arg(k3_quantize_checkpoint(&q, &e), e, "only[1]");
    q.only = NULL, q.n_only = 0, q.n_exclude = -1;
    expect_arg(k3_quantize_checkpoint(&q, &e), e, "n_exclude");
    expect_arg(k3_quantize_checkpoint(NULL, &e), e, "opts");
    k3_quantize_opts noin = {.out = out, .to = "nvfp4"};
    expect_arg(k3_quantize_checkpoint(&noin, &e), e, "in");
}

/* Overwrites the data section of every shard with 0xFF bytes (NaN in BF16 and F32), leaving
 * the headers valid: the failure then happens in a writer thread, past every argument check. */
static void poison(const char *dir) {
    k3_checkpoint *ck = NULL;
    k3_error e = {0};
    assert_int_equal(k3_checkpoint_open(&ck, dir, &e), K3_OK);
    for (size_t i = 0; i < k3_checkpoint_shard_count(ck); i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, k3_checkpoint_shard_name(ck, i));
        FILE *f = fopen(path, "r+b");
        assert_non_null(f);
        uint8_t n8[8];
        assert_int_equal(fread(n8, 1, 8, f), 8);
        uint64_t n = 0;
        for (int b = 7; b >= 0; b--) n = n << 8 | n8[b];
        assert_int_equal(fseek(f, 0, SEEK_END), 0);
        long end = ftell(f);
        assert_int_equal(fseek(f, (long)(8 + n), SEEK_SET), 0);
        for (long p = (long)(8 + n); p < end; p++) fputc(0xFF, f);
        assert_int_equal(fclose(f), 0);
    }
    k3_checkpoint_close(ck);
}

static void test_null_err_in_worker_failure(void **s) {
    (void)s;
    char in[400], out[400];
    snprintf(in, sizeof in, "%s/nan", root);
    snprintf(out, sizeof out, "%s/nan-out", root);
    k3_error e = {0};
    k3_make_tiny_opts t = {.dir = in, .format = "bf16", .n_threads = 2};
    assert_int_equal(k3_make_tiny_checkpoint(&t, &e), K3_OK);
    poison(in);
    k3_quantize_opts q = {.in = in, .out = out, .to = "nvfp4", .n_threads = 2};
    assert_int_equal(k3_quantize_checkpoint(&q, &e), K3_ERR_NUMERIC);
    /* in a child: the bug this guards against was a write through err == NULL */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* cmocka's handler would run the remaining tests here */
        _exit(k3_quantize_checkpoint(&q, NULL) == K3_ERR_NUMERIC ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st)) fail_msg("k3_quantize_checkpoint(err = NULL) died of signal %d", WTERMSIG(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_bench_options(void **s) {
    (void)s;
    k3_error e = {0};
    int tokens[1] = {1};
    k3_bench_moe_row row;
    k3_bench_moe_env env;
    expect_arg(k3_bench_moe(NULL, tokens, 1, &row, &env, &e), e, "opts");
    k3_bench_moe_opts o = {0};
    expect_arg(k3_bench_moe(&o, tokens, 1, NULL, &env, &e), e, "rows");
    expect_arg(k3_bench_moe(&o, tokens, 1, &row, NULL, &e), e, "env");
    expect_arg(k3_bench_moe(&o, NULL, 1, &row, &env, &e), e, "tokens");
    /* each used to become the default, or to be reported under another field's name */
    o.warmup = -1;
    expect_arg(k3_bench_moe(&o, tokens, 1, &row, &env, &e), e, "warmup");
    o.warmup = 0, o.repeats = -2;
    expect_arg(k3_bench_moe(&o, tokens, 1, &row, &env, &e), e, "repeats");
    o.repeats = 0, o.mem_budget_gib = -1;
    expect_arg(k3_bench_moe(&o, tokens, 1, &row, &env, &e), e, "mem_budget_gib");
    o.mem_budget_gib = NAN;
    expect_arg(k3_bench_moe(&o, tokens, 1, &row, &env, &e), e, "mem_budget_gib");
    o.mem_budget_gib = 0, o.experts_built = -3;
    expect_arg(k3_bench_moe(&o, tokens, 1, &row, &env, &e), e, "experts_built");
    /* a checkpoint's layer replaces the synthetic one, whose options would be ignored */
    o.experts_built = 0, o.model_dir = "unused", o.n_experts = 8;
    expect_arg(k3_bench_moe(&o, tokens, 1, &row, &env, &e), e, "n_experts");
    o.n_experts = 0, o.mem_budget_gib = 2;
    expect_arg(k3_bench_moe(&o, tokens, 1, &row, &env, &e), e, "mem_budget_gib");
}

static void test_status_and_dtype_strings(void **s) {
    (void)s;
    for (int st = K3_OK; st < K3_STATUS_COUNT; st++)
        for (int o = K3_OK; o < st; o++)
            if (!strcmp(k3_status_str(st), k3_status_str(o)))
                fail_msg("statuses %d and %d read the same: %s", o, st, k3_status_str(st));
    assert_string_equal(k3_status_str(K3_STATUS_COUNT), "unknown status");
    assert_string_equal(k3_dtype_name((k3_dtype)-1), "INVALID");
    assert_int_equal(k3_dtype_parse(NULL), K3_DTYPE_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_checkpoint),
        cmocka_unit_test(test_null_pointers_on_checkpoint),
        cmocka_unit_test(test_model_open_options),
        cmocka_unit_test(test_writer_options),
        cmocka_unit_test(test_null_err_in_worker_failure),
        cmocka_unit_test(test_bench_options),
        cmocka_unit_test(test_status_and_dtype_strings),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
