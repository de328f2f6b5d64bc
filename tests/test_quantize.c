/* k3 quantize on a BF16 make-tiny checkpoint: the output of every --to loads through the
 * validating loader, every quantized module holds exactly what k3's quantizer makes of the
 * BF16 values, every other tensor is byte-identical to the input, the selection (--only,
 * --exclude) is what the quantization config declares, bad requests fail by name, and an OUT
 * that is the input (however spelled, or through links) is refused before anything is
 * written. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/block.h"
#include "formats/fp.h"
#include "load/model.h"
#include "load/tiny.h"
#include "rm_tree.h"

static char root[256], bf16[300];
static k3_model *src;

static int setup(void **state) {
    (void)state;
    snprintf(root, sizeof root, "/tmp/k3-test-quantize-XXXXXX");
    if (!mkdtemp(root)) return -1;
    snprintf(bf16, sizeof bf16, "%s/bf16", root);
    k3_tiny_opts o = {.dir = bf16, .format = K3_TINY_BF16, .seed = 11, .n_threads = 2};
    k3_error e = {0};
    if (k3_make_tiny(&o, &e)) return fprintf(stderr, "%s\n", e.msg), -1;
    k3_model_opts mo = {.path = bf16};
    return k3_model_open(&src, &mo, &e) ? -1 : 0;
}
static int teardown(void **state) {
    (void)state;
    k3_model_close(src);
    rm_tree(root);
    return 0;
}

static const char *quantize(const char *tag, const char *to, const char *const *only, int n_only,
                            const char *const *excl, int n_excl, int want, const char *msg) {
    static char out[400];
    snprintf(out, sizeof out, "%s/%s", root, tag);
    k3_quantize_opts o = {.in = bf16, .out = out, .to = to, .only = only, .n_only = n_only,
                          .exclude = excl, .n_exclude = n_excl, .n_threads = 2};
    k3_error e = {0};
    int rc = k3_quantize_checkpoint(&o, &e);
    if (rc != want || (msg && !strstr(e.msg, msg)))
        fail_msg("quantize %s: expected %d '%s', got %d: %s", tag, want, msg ? msg : "", rc, e.msg);
    return out;
}

/* Checks out against src: quantized modules re-derived, everything else identical. Returns
 * the number of modules in each format. */
static void check(const char *out, k3_wfmt want_q, int *n_quant, int *n_plain) {
    k3_model *m = NULL;
    k3_error e = {0};
    k3_model_opts mo = {.path = out, .n_threads = 2};
    if (k3_model_open(&m, &mo, &e)) fail_msg("load %s: %s", out, e.msg);
    assert_int_equal(m->plan.n, src->plan.n);
    *n_quant = *n_plain = 0;
    for (size_t i = 0; i < m->plan.n; i++) {
        const k3_pentry *pe = &m->plan.e[i];
        if (!pe->linear) {
            assert_memory_equal(m->le[i].v->data, src->le[i].v->data, m->le[i].v->nbytes);
            continue;
        }
        const k3_qmat *q = &m->le[i].q, *s = &src->le[i].q;
        if (q->fmt == K3_WFMT_BF16) {
            (*n_plain)++;
            assert_memory_equal(q->data, s->data, k3_qmat_data_bytes(q));
            continue;
        }
        assert_int_equal(q->fmt, want_q);
        (*n_quant)++;
        int64_t r = q->rows, c = q->cols;
        float *v = malloc((size_t)(r * c) * sizeof *v);
        for (int64_t k = 0; k < r * c; k++) v[k] = k3_bf16_to_f32(((const uint16_t *)s->data)[k]);
        size_t db = k3_qmat_data_bytes(q), sb = k3_qmat_scale_bytes(q);
        uint8_t *d = malloc(db), *sc = malloc(sb);
        float ws2 = 1.0f;
        if (want_q == K3_WFMT_NVFP4) assert_int_equal(k3_nvfp4_quantize_weight(v, r, c, d, sc, &ws2, &e), K3_OK);
        if (want_q == K3_WFMT_MXFP4) assert_int_equal(k3_mxfp4_quantize(v, r, c, d, sc, &e), K3_OK);
        if (want_q == K3_WFMT_FP8_BLOCK) assert_int_equal(k3_fp8_block_quantize(v, r, c, d, (float *)sc, &e), K3_OK);
        if (memcmp(d, q->data, db) || memcmp(sc, q->scale, sb)) fail_msg("%s: bytes differ", pe->name);
        if (want_q == K3_WFMT_NVFP4) {
            assert_true(q->input_scale == 0.0f); /* no calibration data: none written */
            float g = q->global_scale;
            /* ModelOpt stores ws2; compressed-tensors its reciprocal, decoded back */
            assert_true(g == ws2 || g == 1.0f / (1.0f / ws2));
        }
        free(v), free(d), free(sc);
    }
    k3_model_close(m);
}

static void test_formats(void **s) {
    (void)s;
    int q, p;
    check(quantize("nvfp4", "nvfp4", NULL, 0, NULL, 0, K3_OK, NULL), K3_WFMT_NVFP4, &q, &p);
    assert_int_equal(q, 3 * 16 * 3); /* 3 MoE layers x 16 experts x w1/w2/w3 */
    check(quantize("nvfp4-ct", "nvfp4-ct", NULL, 0, NULL, 0, K3_OK, NULL), K3_WFMT_NVFP4, &q, &p);
    assert_int_equal(q, 144);
    check(quantize("mxfp4", "mxfp4", NULL, 0, NULL, 0, K3_OK, NULL), K3_WFMT_MXFP4, &q, &p);
    assert_int_equal(q, 144);
    /* fp8-block: every linear except routers, embeddings and lm_head */
    check(quantize("fp8", "fp8-block", NULL, 0, NULL, 0, K3_OK, NULL), K3_WFMT_FP8_BLOCK, &q, &p);
    assert_int_equal(p, 3 + 2); /* 3 routers, embed_tokens, lm_head */
}

static void test_selection(void **s) {
    (void)s;
    int q, p;
    const char *only[] = {"self_attn\\.(q|k)_proj$"};
    const char *out = quantize("only", "fp8-block", only, 1, NULL, 0, K3_OK, NULL);
    check(out, K3_WFMT_FP8_BLOCK, &q, &p);
    assert_int_equal(q, 3 * 2); /* the three KDA layers; the MLA layer has q_a/q_b */
    k3_quant_config qc;
    k3_error e = {0};
    assert_int_equal(k3_quant_config_load(&qc, out, &e), K3_OK);
    k3_qdecl d;
    assert_int_equal(k3_quant_resolve(&qc, "language_model.model.layers.2.self_attn.k_proj", &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_FP8_BLOCK);
    assert_int_equal(k3_quant_resolve(&qc, "language_model.model.layers.2.self_attn.v_proj", &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_NONE);
    k3_quant_config_free(&qc);
    /* exclude one MoE layer's experts: still all-or-none per layer */
    const char *ex[] = {"layers\\.2\\.block_sparse_moe"};
    out = quantize("exclude", "mxfp4", NULL, 0, ex, 1, K3_OK, NULL);
    check(out, K3_WFMT_MXFP4, &q, &p);
    assert_int_equal(q, 2 * 16 * 3);
    assert_int_equal(k3_quant_config_load(&qc, out, &e), K3_OK);
    assert_int_equal(k3_quant_resolve(&qc, "language_model.model.layers.2.block_sparse_moe.experts.3.w2", &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_NONE);
    assert_int_equal(k3_quant_resolve(&qc, "language_model.model.layers.3.block_sparse_moe.experts.3.w2", &d, &e), K3_OK);
    assert_int_equal(d.scheme, K3_QS_MXFP4);
    k3_quant_config_free(&qc);
}

static void test_rejects(void **s) {
    (void)s;
    quantize("bad-to", "int4", NULL, 0, NULL, 0, K3_ERR_ARG, "--to");
    const char *bad[] = {"experts\\.("};
    quantize("bad-re", "nvfp4", bad, 1, NULL, 0, K3_ERR_FORMAT, "--only");
    const char *none[] = {"no_such_module"};
    quantize("none", "nvfp4", none, 1, NULL, 0, K3_ERR_ARG, "no linear module selected");
    const char *part[] = {"experts\\.1[0-5]\\."};
    quantize("partial", "nvfp4", NULL, 0, part, 1, K3_ERR_ARG, "select all or none");
    /* an input that is already quantized */
    char in[300], out[300];
    snprintf(in, sizeof in, "%s/nv", root);
    snprintf(out, sizeof out, "%s/nv-out", root);
    k3_tiny_opts o = {.dir = in, .format = K3_TINY_NVFP4, .n_threads = 2};
    k3_error e = {0};
    assert_int_equal(k3_make_tiny(&o, &e), K3_OK);
    k3_quantize_opts qo = {.in = in, .out = out, .to = "nvfp4"};
    assert_int_equal(k3_quantize_checkpoint(&qo, &e), K3_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "already quantized"));
}

/* FNV-1a over the names and bytes of the regular files directly in dir (sorted, so readdir
 * order does not matter). */
static uint64_t dir_hash(const char *dir) {
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, alphasort);
    assert_true(n > 0);
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) {
        char p[600];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, ents[i]->d_name);
        if (!lstat(p, &st) && S_ISREG(st.st_mode)) {
            for (const char *c = ents[i]->d_name; *c; c++)
                h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
            FILE *f = fopen(p, "rb");
            assert_non_null(f);
            for (int c; (c = fgetc(f)) != EOF;) h = (h ^ (unsigned)c) * 0x100000001b3ull;
            fclose(f);
        }
        free(ents[i]);
    }
    free(ents);
    return h;
}

static void quantize_into(const char *in, const char *out, int want, const char *msg) {
    k3_quantize_opts o = {.in = in, .out = out, .to = "nvfp4", .n_threads = 2};
    k3_error e = {0};
    int rc = k3_quantize_checkpoint(&o, &e);
    if (rc != want || (msg && !strstr(e.msg, msg)))
        fail_msg("quantize %s -> %s: expected %d '%s', got %d: %s", in, out, want, msg ? msg : "",
                 rc, e.msg);
}

static void test_out_is_input(void **s) {
    (void)s;
    uint64_t h0 = dir_hash(bf16);
    char out[400], link[400];
    const char *same[] = {"%s", "%s/", "%s//.", "%s/../bf16"};
    for (int i = 0; i < 4; i++) {
        snprintf(out, sizeof out, same[i], bf16);
        quantize_into(bf16, out, K3_ERR_ARG, "is the input directory");
    }
    snprintf(link, sizeof link, "%s/bf16-link", root);
    assert_int_equal(symlink(bf16, link), 0);
    quantize_into(bf16, link, K3_ERR_ARG, "is the input directory");
    quantize_into(link, bf16, K3_ERR_ARG, "is the input directory");
    /* a different OUT whose files are links to the input's */
    snprintf(out, sizeof out, "%s/aliased", root);
    assert_int_equal(mkdir(out, 0755), 0);
    char from[600], to[600];
    snprintf(from, sizeof from, "%s/tiktoken.model", bf16);
    snprintf(to, sizeof to, "%s/tiktoken.model", out);
    assert_int_equal(symlink(from, to), 0);
    quantize_into(bf16, out, K3_ERR_ARG, "is the input file");
    assert_true(dir_hash(bf16) == h0);
    /* OUT inside IN, and IN inside OUT: the input's files are left as they were */
    int q, p;
    snprintf(out, sizeof out, "%s/nested", bf16);
    quantize_into(bf16, out, K3_OK, NULL);
    assert_true(dir_hash(bf16) == h0);
    check(out, K3_WFMT_NVFP4, &q, &p);
    char outer[400], inner[450];
    snprintf(outer, sizeof outer, "%s/outer", root);
    snprintf(inner, sizeof inner, "%s/in", outer);
    assert_int_equal(mkdir(outer, 0755), 0);
    k3_tiny_opts o = {.dir = inner, .format = K3_TINY_BF16, .seed = 11, .n_threads = 2};
    k3_error e = {0};
    assert_int_equal(k3_make_tiny(&o, &e), K3_OK);
    uint64_t hi = dir_hash(inner);
    quantize_into(inner, outer, K3_OK, NULL);
    assert_true(dir_hash(inner) == hi);
    check(outer, K3_WFMT_NVFP4, &q, &p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats), cmocka_unit_test(test_selection), cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_out_is_input),
    };
    return cmocka_run_group_tests_name("quantize", tests, setup, teardown);
}
