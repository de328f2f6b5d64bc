/* The loader on real checkpoints written by make-tiny (and broken copies of them written
 * with the safetensors writer): every format round-trips to exactly the bytes k3's quantizer
 * produces; expert-parallel ranks hold exactly their experts; loads are bit-identical across
 * repeats and thread counts; and every bad case of issue 3 item 3 fails with its status and
 * the tensor's name. The memory bound is measured in test_load_rss.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sys/stat.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>

#include "formats/block.h"
#include "formats/fp.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "load/model.h"
#include "load/read.h"
#include "load/tiny.h"
#include "rm_tree.h"

static char root[256];
static char ckpt[K3_TINY_FORMAT_COUNT][300];
static const uint64_t SEED = 7;

static int setup(void **state) {
    (void)state;
    snprintf(root, sizeof root, "/tmp/k3-test-load-XXXXXX");
    if (!mkdtemp(root)) return -1;
    for (int f = 0; f < K3_TINY_FORMAT_COUNT; f++) {
        snprintf(ckpt[f], sizeof ckpt[f], "%s/%s", root, k3_tiny_format_name((k3_tiny_format)f));
        k3_tiny_opts o = {.dir = ckpt[f], .format = (k3_tiny_format)f, .preset = K3_TINY_TINY,
                          .seed = SEED, .n_threads = 2};
        k3_error e = {0};
        if (k3_make_tiny(&o, &e)) {
            fprintf(stderr, "make-tiny %s: %s\n", ckpt[f], e.msg);
            return -1;
        }
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rm_tree(root);
    return 0;
}

static k3_model *open_ok(const char *path, int ep_size, int ep_rank, int threads) {
    k3_model *m = NULL;
    k3_error e = {0};
    k3_model_opts o = {.path = path, .ep_size = ep_size, .ep_rank = ep_rank, .n_threads = threads};
    int rc = k3_model_open(&m, &o, &e);
    if (rc) fail_msg("open %s: %s", path, e.msg);
    return m;
}

/* What make-tiny's quantizer produces for entry e, re-derived independently of the file. */
static void expect_entry(const k3_model *m, size_t i, k3_tiny_format fmt) {
    const k3_pentry *e = &m->plan.e[i];
    const k3_lentry *le = &m->le[i];
    int64_t n = 1;
    for (int d = 0; d < e->rank; d++) n *= e->shape[d];
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    k3_tiny_values(SEED, e, v, n);
    if (!e->linear) {
        if (e->role == K3_R_KDA_A_LOG) { /* real heads: finite, tail: checked zero by the loader */
            free(v);
            return;
        }
        for (int64_t k = 0; k < n; k++) {
            float got = le->v->dtype == K3_DTYPE_F32 ? ((const float *)le->v->data)[k]
                                                      : k3_bf16_to_f32(((const uint16_t *)le->v->data)[k]);
            float want = le->v->dtype == K3_DTYPE_F32 ? v[k] : k3_bf16_to_f32(k3_f32_to_bf16(v[k]));
            if (memcmp(&got, &want, 4)) fail_msg("%s[%lld]: %g != %g", e->name, (long long)k, got, want);
        }
        free(v);
        return;
    }
    const k3_qmat *q = &le->q;
    int64_t r = e->shape[0], c = e->shape[1];
    size_t db = k3_qmat_data_bytes(q), sb = k3_qmat_scale_bytes(q);
    uint8_t *d = malloc(db ? db : 1), *s = malloc(sb ? sb : 1);
    k3_error err = {0};
    switch (q->fmt) {
    case K3_WFMT_BF16:
        for (int64_t k = 0; k < n; k++) ((uint16_t *)d)[k] = k3_f32_to_bf16(v[k]);
        break;
    case K3_WFMT_FP8_BLOCK:
        assert_int_equal(fmt, K3_TINY_NVFP4);
        assert_int_equal(k3_fp8_block_quantize(v, r, c, d, (float *)s, &err), K3_OK);
        break;
    case K3_WFMT_NVFP4: {
        float ws2;
        if (e->role == K3_R_EXPERT && e->proj != 2) {
            /* w1 and w3 share one weight_scale_2, from their joint amax (moe.md §4.2) */
            const k3_pentry *o = &m->plan.e[e->proj == 1 ? i + 2 : i - 2];
            float *ov = malloc((size_t)n * sizeof *ov), amax = 0;
            k3_tiny_values(SEED, o, ov, n);
            for (int64_t k = 0; k < n; k++) amax = fmaxf(amax, fmaxf(fabsf(v[k]), fabsf(ov[k])));
            free(ov);
            ws2 = k3_nvfp4_weight_scale_2(amax);
            assert_int_equal(k3_nvfp4_quantize_weight_gs(v, r, c, ws2, d, s, &err), K3_OK);
        } else {
            assert_int_equal(k3_nvfp4_quantize_weight(v, r, c, d, s, &ws2, &err), K3_OK);
        }
        float in = k3_tiny_input_scale(SEED, e->name);
        if (fmt == K3_TINY_NVFP4_CT) ws2 = 1.0f / (1.0f / ws2), in = 1.0f / (1.0f / in);
        if (memcmp(&ws2, &q->global_scale, 4) || memcmp(&in, &q->input_scale, 4))
            fail_msg("%s: global/input %g/%g != %g/%g", e->name, q->global_scale, q->input_scale, ws2, in);
        break;
    }
    case K3_WFMT_MXFP4:
        assert_int_equal(fmt, K3_TINY_MXFP4);
        assert_int_equal(k3_mxfp4_quantize(v, r, c, d, s, &err), K3_OK);
        break;
    default:
        fail_msg("%s: unexpected format %s", e->name, k3_wfmt_name(q->fmt));
    }
    if (memcmp(d, q->data, db)) fail_msg("%s: data bytes differ from the quantizer's", e->name);
    if (sb && memcmp(s, q->scale, sb)) fail_msg("%s: scale bytes differ from the quantizer's", e->name);
    free(d), free(s), free(v);
}

static void roundtrip(k3_tiny_format fmt) {
    k3_model *m = open_ok(ckpt[fmt], 0, 0, 2);
    int counts[K3_WFMT_COUNT] = {0};
    for (size_t i = 0; i < m->plan.n; i++) {
        assert_true(m->le[i].selected);
        expect_entry(m, i, fmt);
        if (m->plan.e[i].linear) counts[m->le[i].q.fmt]++;
    }
    /* the formats each checkpoint must contain */
    switch (fmt) {
    case K3_TINY_NVFP4: assert_true(counts[K3_WFMT_NVFP4] > 0 && counts[K3_WFMT_FP8_BLOCK] > 0); break;
    case K3_TINY_NVFP4_CT: assert_true(counts[K3_WFMT_NVFP4] > 0 && counts[K3_WFMT_FP8_BLOCK] == 0); break;
    case K3_TINY_MXFP4: assert_true(counts[K3_WFMT_MXFP4] > 0); break;
    default: assert_int_equal(counts[K3_WFMT_BF16], (int)(counts[K3_WFMT_BF16] + 0)); break;
    }
    /* the MoE blocks: every MoE layer filled, SiTU params per local expert */
    const k3_model_config *mc = k3_model_mc(m);
    int n_moe = 0;
    for (int l = 0; l < mc->num_hidden_layers; l++) {
        const k3_moe_block *b = k3_model_moe(m, l);
        if (mc->layers[l].ffn != K3_FFN_MOE) {
            assert_null(b);
            continue;
        }
        n_moe++;
        assert_non_null(b);
        assert_int_equal(b->experts.n_local, mc->num_experts);
        assert_int_equal(b->experts.act.act, K3_ACT_SITU);
        assert_true(b->experts.act.alpha[3] == 4.0f && b->experts.act.beta[3] == 25.0f);
        assert_true(b->latent && b->latent_norm && b->router.correction_bias);
        assert_int_equal(b->experts.hidden, mc->routed_expert_hidden_size);
        assert_int_equal(b->experts.e[5].w2.rows, mc->routed_expert_hidden_size);
        assert_int_equal(b->router.gate.fmt, K3_WFMT_BF16);
    }
    assert_int_equal(n_moe, 3);
    k3_model_info info;
    assert_int_equal(k3_model_get_info(m, &info), K3_OK);
    assert_string_equal(info.prefix, "language_model.");
    assert_true(info.bytes_read == info.bytes_kept && info.bytes_read > 0);
    k3_model_close(m);
}

static void test_roundtrip_nvfp4(void **s) { (void)s; roundtrip(K3_TINY_NVFP4); }
static void test_roundtrip_nvfp4_ct(void **s) { (void)s; roundtrip(K3_TINY_NVFP4_CT); }
static void test_roundtrip_mxfp4(void **s) { (void)s; roundtrip(K3_TINY_MXFP4); }
static void test_roundtrip_bf16(void **s) { (void)s; roundtrip(K3_TINY_BF16); }

/* Every loaded byte of a and b equal (same view set). */
static void same_buffers(const k3_model *a, const k3_model *b) {
    assert_int_equal(a->n_views, b->n_views);
    for (size_t i = 0; i < a->n_views; i++) {
        assert_string_equal(a->views[i].name, b->views[i].name);
        assert_int_equal(a->views[i].nbytes, b->views[i].nbytes);
        if (memcmp(a->views[i].data, b->views[i].data, a->views[i].nbytes))
            fail_msg("%s differs", a->views[i].name);
    }
}

static void test_determinism(void **s) {
    (void)s;
    k3_model *a = open_ok(ckpt[K3_TINY_NVFP4], 0, 0, 1), *b = open_ok(ckpt[K3_TINY_NVFP4], 0, 0, 1);
    k3_model *c = open_ok(ckpt[K3_TINY_NVFP4], 0, 0, 4);
    same_buffers(a, b);
    same_buffers(a, c);
    k3_model_close(a), k3_model_close(b), k3_model_close(c);
    /* make-tiny itself: another thread count writes the same bytes */
    char dir[300];
    snprintf(dir, sizeof dir, "%s/nvfp4-t1", root);
    k3_tiny_opts o = {.dir = dir, .format = K3_TINY_NVFP4, .seed = SEED, .n_threads = 1};
    k3_error e = {0};
    assert_int_equal(k3_make_tiny(&o, &e), K3_OK);
    a = open_ok(dir, 0, 0, 3), b = open_ok(ckpt[K3_TINY_NVFP4], 0, 0, 2);
    same_buffers(a, b);
    k3_model_close(a), k3_model_close(b);
}

static void test_expert_parallel(void **s) {
    (void)s;
    k3_model *full = open_ok(ckpt[K3_TINY_NVFP4], 0, 0, 2);
    const int R = 3; /* 16 experts: 6, 5, 5 */
    uint64_t expert_bytes_sum = 0;
    for (int r = 0; r < R; r++) {
        k3_model *m = open_ok(ckpt[K3_TINY_NVFP4], R, r, 2);
        k3_model_info fi, mi;
        k3_model_get_info(full, &fi), k3_model_get_info(m, &mi);
        assert_int_equal(mi.ep_first, r == 0 ? 0 : r == 1 ? 6 : 11);
        assert_int_equal(mi.ep_count, r == 0 ? 6 : 5);
        assert_true(mi.bytes_read < fi.bytes_read);
        expert_bytes_sum += fi.bytes_read - mi.bytes_read;
        for (int l = 1; l < 4; l++) {
            const k3_moe_block *b = k3_model_moe(m, l), *fb = k3_model_moe(full, l);
            assert_int_equal(b->experts.first_local, mi.ep_first);
            assert_int_equal(b->experts.n_local, mi.ep_count);
            for (int k = 0; k < mi.ep_count; k++) {
                const k3_qmat *x = &b->experts.e[k].w3, *y = &fb->experts.e[mi.ep_first + k].w3;
                assert_memory_equal(x->data, y->data, k3_qmat_data_bytes(x));
                assert_memory_equal(x->scale, y->scale, k3_qmat_scale_bytes(x));
            }
        }
        /* a skipped expert is not in memory at all */
        char name[200];
        snprintf(name, sizeof name, "language_model.model.layers.1.block_sparse_moe.experts.%d.w1.weight",
                 r == 0 ? 15 : 0);
        size_t idx;
        assert_false(k3_name_table_get(&m->vt, name, &idx));
        k3_model_close(m);
    }
    /* the skipped bytes over all ranks: every expert skipped by exactly R-1 ranks */
    k3_model_close(full);
    (void)expert_bytes_sum;
    k3_model *m = NULL;
    k3_error e = {0};
    k3_model_opts o = {.path = ckpt[K3_TINY_NVFP4], .ep_size = 17, .ep_rank = 0};
    assert_int_equal(k3_model_open(&m, &o, &e), K3_ERR_ARG);
    assert_non_null(strstr(e.msg, "exceeds n_experts 16"));
    o.ep_size = 2, o.ep_rank = 2;
    assert_int_equal(k3_model_open(&m, &o, &e), K3_ERR_ARG);
    assert_null(m);
}

/* headers_only: nothing read; the rank preview equals what a real rank load reads */
static void test_headers_only(void **s) {
    (void)s;
    k3_model *h = NULL;
    k3_error e = {0};
    k3_model_opts o = {.path = ckpt[K3_TINY_NVFP4_CT], .headers_only = 1};
    assert_int_equal(k3_model_open(&h, &o, &e), K3_OK);
    k3_model_info hi;
    k3_model_get_info(h, &hi);
    assert_int_equal(hi.bytes_read, 0);
    assert_null(k3_model_moe(h, 1));
    k3_layer_info li;
    assert_int_equal(k3_model_layer_info(h, 0, &li, &e), K3_OK);
    assert_string_equal(li.ffn, "dense");
    assert_null(li.expert_format);
    assert_int_equal(k3_model_layer_info(h, 3, &li, &e), K3_OK);
    assert_string_equal(li.attn, "MLA");
    assert_string_equal(li.expert_format, "NVFP4-CT");
    assert_int_equal(li.n_experts, 16);
    assert_true(li.expert_bytes > 0 && li.expert_bytes < li.bytes);
    assert_int_equal(k3_model_layer_info(h, 4, &li, &e), K3_ERR_ARG);
    for (int r = 0; r < 5; r++) {
        k3_rank_info ri;
        assert_int_equal(k3_model_rank_info(h, 5, r, &ri, &e), K3_OK);
        k3_model *m = open_ok(ckpt[K3_TINY_NVFP4_CT], 5, r, 2);
        k3_model_info mi;
        k3_model_get_info(m, &mi);
        assert_int_equal(ri.first, mi.ep_first);
        assert_int_equal(ri.count, mi.ep_count);
        assert_int_equal(ri.total_bytes, mi.bytes_read);
        k3_model_close(m);
    }
    k3_rank_info ri;
    assert_int_equal(k3_model_rank_info(h, 32, 0, &ri, &e), K3_ERR_ARG);
    k3_model_close(h);
}

static void test_layer_subset(void **s) {
    (void)s;
    int layers[1] = {2};
    k3_model *m = NULL;
    k3_error e = {0};
    k3_model_opts o = {.path = ckpt[K3_TINY_MXFP4], .layers = layers, .n_layers = 1};
    assert_int_equal(k3_model_open(&m, &o, &e), K3_OK);
    assert_null(k3_model_moe(m, 1));
    assert_non_null(k3_model_moe(m, 2));
    assert_null(k3_model_entry(m, "model.layers.0.mlp.gate_proj"));
    assert_non_null(k3_model_entry(m, "model.embed_tokens"));
    k3_model_close(m);
    layers[0] = 4;
    assert_int_equal(k3_model_open(&m, &o, &e), K3_ERR_ARG);
    assert_non_null(strstr(e.msg, "layer 4: "));
    assert_non_null(strstr(e.msg, "has 4 decoder layers (0..3)"));
}

/* ---- broken checkpoints ------------------------------------------------------------ */

typedef struct tlist {
    k3_st_wtensor t[4096];
    void *own[4096];
    char *names[4096];
    size_t n;
} tlist;

static void tl_load(tlist *L, const char *dir) {
    k3_checkpoint *ck;
    k3_error e = {0};
    if (k3_checkpoint_open(&ck, dir, &e)) fail_msg("%s", e.msg);
    L->n = 0;
    for (size_t i = 0; i < k3_checkpoint_tensor_count(ck); i++) {
        k3_tensor_info ti;
        k3_st_file *f;
        const k3_st_tensor *t;
        k3_checkpoint_tensor_info(ck, i, &ti, &e);
        k3_checkpoint_tensor_raw(ck, i, &f, &t, &e);
        void *buf = malloc(ti.nbytes ? ti.nbytes : 1);
        assert_int_equal(k3_st_read(f, t, buf, ti.nbytes, 0, &e), K3_OK);
        k3_st_wtensor *w = &L->t[L->n];
        L->names[L->n] = strdup(ti.name);
        *w = (k3_st_wtensor){.name = L->names[L->n], .dtype = ti.dtype, .rank = ti.rank, .data = buf};
        memcpy(w->shape, ti.shape, sizeof ti.shape);
        L->own[L->n++] = buf;
    }
    k3_checkpoint_close(ck);
}

static void tl_free(tlist *L) {
    for (size_t i = 0; i < L->n; i++) free(L->own[i]), free(L->names[i]);
    L->n = 0;
}

static k3_st_wtensor *tl_find(tlist *L, const char *name) {
    for (size_t i = 0; i < L->n; i++)
        if (!strcmp(L->t[i].name, name)) return &L->t[i];
    fail_msg("no tensor %s", name);
    return NULL;
}

static void tl_drop(tlist *L, const char *name) {
    k3_st_wtensor *w = tl_find(L, name);
    size_t i = (size_t)(w - L->t);
    free(L->own[i]), free(L->names[i]);
    memmove(&L->t[i], &L->t[i + 1], (L->n - i - 1) * sizeof *L->t);
    memmove(&L->own[i], &L->own[i + 1], (L->n - i - 1) * sizeof *L->own);
    memmove(&L->names[i], &L->names[i + 1], (L->n - i - 1) * sizeof *L->names);
    L->n--;
}

static k3_st_wtensor *tl_add(tlist *L, const char *name, k3_dtype dt, int rank, uint64_t a,
                             uint64_t b, size_t nbytes) {
    void *buf = calloc(1, nbytes ? nbytes : 1);
    L->names[L->n] = strdup(name);
    L->own[L->n] = buf;
    k3_st_wtensor *w = &L->t[L->n++];
    *w = (k3_st_wtensor){.name = L->names[L->n - 1], .dtype = dt, .rank = rank, .data = buf};
    w->shape[0] = a, w->shape[1] = b;
    return w;
}

static void *wdata(k3_st_wtensor *w) { return (void *)w->data; }

static void copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    if (!a) { /* optional files */
        if (b) fclose(b), remove(to);
        return;
    }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, n, b);
    fclose(a), fclose(b);
}

/* Writes L as a 2-shard checkpoint (with index) plus src's configs into a fresh dir. */
static const char *tl_write(tlist *L, const char *src, const char *tag) {
    static char dir[400];
    snprintf(dir, sizeof dir, "%s/bad-%s", root, tag);
    mkdir(dir, 0755);
    const char *files[] = {"config.json", "hf_quant_config.json"};
    for (int i = 0; i < 2; i++) {
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        copy_file(a, b);
    }
    k3_error e = {0};
    static const char *const meta[1][2] = {{"format", "pt"}};
    if (k3_st_write_sharded(dir, 2, L->t, L->n, NULL, meta, 1, &e)) fail_msg("write: %s", e.msg);
    return dir;
}

static void expect_open(const char *dir, int status, const char *a, const char *b) {
    k3_model *m = NULL;
    k3_error e = {0};
    k3_model_opts o = {.path = dir, .n_threads = 2};
    int rc = k3_model_open(&m, &o, &e);
    if (rc != status || !strstr(e.msg, a) || (b && !strstr(e.msg, b)))
        fail_msg("%s: expected status %d with '%s' '%s', got %d: %s", dir, status, a, b ? b : "", rc, e.msg);
    assert_null(m);
}

#define P "language_model.model.layers."

static void test_bad_missing_expert(void **s) {
    (void)s;
    tlist *L = calloc(1, sizeof *L);
    tl_load(L, ckpt[K3_TINY_NVFP4]);
    tl_drop(L, P "2.block_sparse_moe.experts.9.w2.weight");
    /* missing whichever rank owns it */
    const char *d = tl_write(L, ckpt[K3_TINY_NVFP4], "missing-expert");
    expect_open(d, K3_ERR_MISSING, P "2.block_sparse_moe.experts.9.w2.weight", "missing");
    k3_model *m = NULL;
    k3_error e = {0};
    k3_model_opts o = {.path = d, .ep_size = 4, .ep_rank = 0};
    assert_int_equal(k3_model_open(&m, &o, &e), K3_ERR_MISSING);
    tl_free(L);
    tl_load(L, ckpt[K3_TINY_NVFP4]);
    tl_drop(L, P "3.block_sparse_moe.experts.0.w1.weight_scale");
    expect_open(tl_write(L, ckpt[K3_TINY_NVFP4], "missing-scale"), K3_ERR_MISSING,
                P "3.block_sparse_moe.experts.0.w1.weight_scale", "missing");
    tl_free(L);
    free(L);
}

static void test_bad_expert_twice(void **s) {
    (void)s;
    tlist *L = calloc(1, sizeof *L);
    tl_load(L, ckpt[K3_TINY_MXFP4]);
    /* the same expert weight under both names */
    k3_st_wtensor *w = tl_find(L, P "1.block_sparse_moe.experts.4.w3.weight_packed");
    k3_st_wtensor *dup = tl_add(L, P "1.block_sparse_moe.experts.4.w3.weight", K3_DTYPE_U8, 2,
                                w->shape[0], w->shape[1], (size_t)(w->shape[0] * w->shape[1]));
    (void)dup;
    expect_open(tl_write(L, ckpt[K3_TINY_MXFP4], "twice"), K3_ERR_DUPLICATE,
                P "1.block_sparse_moe.experts.4.w3", "present twice");
    tl_free(L);
    /* the same name in two shards (no index): the checkpoint reader refuses it by name */
    tl_load(L, ckpt[K3_TINY_MXFP4]);
    char dir[400], path[600];
    snprintf(dir, sizeof dir, "%s/bad-two-shards", root);
    mkdir(dir, 0755);
    k3_error e = {0};
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    static const char *const meta[1][2] = {{"format", "pt"}};
    assert_int_equal(k3_st_write_file(path, L->t, L->n, meta, 1, &e), K3_OK);
    k3_st_wtensor *one = tl_find(L, P "1.block_sparse_moe.experts.4.w3.weight_packed");
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    assert_int_equal(k3_st_write_file(path, one, 1, meta, 1, &e), K3_OK);
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/config.json", ckpt[K3_TINY_MXFP4]);
    snprintf(b, sizeof b, "%s/config.json", dir);
    copy_file(a, b);
    expect_open(dir, K3_ERR_DUPLICATE, P "1.block_sparse_moe.experts.4.w3.weight_packed", NULL);
    tl_free(L);
    free(L);
}

static void test_bad_scales(void **s) {
    (void)s;
    tlist *L = calloc(1, sizeof *L);
    /* NaN block scale in an expert (E4M3 0x7F) */
    tl_load(L, ckpt[K3_TINY_NVFP4]);
    ((uint8_t *)wdata(tl_find(L, P "2.block_sparse_moe.experts.3.w2.weight_scale")))[5] = 0x7F;
    expect_open(tl_write(L, ckpt[K3_TINY_NVFP4], "nan-scale"), K3_ERR_NUMERIC,
                P "2.block_sparse_moe.experts.3.w2.weight_scale", "NaN");
    tl_free(L);
    /* E8M0 0xFF */
    tl_load(L, ckpt[K3_TINY_MXFP4]);
    ((uint8_t *)wdata(tl_find(L, P "1.block_sparse_moe.experts.0.w1.weight_scale")))[0] = 0xFF;
    expect_open(tl_write(L, ckpt[K3_TINY_MXFP4], "nan-e8m0"), K3_ERR_NUMERIC,
                P "1.block_sparse_moe.experts.0.w1.weight_scale", "NaN");
    tl_free(L);
    /* global scale zero / negative / NaN / Inf */
    const float bad[4] = {0.0f, -0.5f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        tl_load(L, ckpt[K3_TINY_NVFP4]);
        memcpy(wdata(tl_find(L, P "3.block_sparse_moe.experts.7.w1.weight_scale_2")), &bad[i], 4);
        expect_open(tl_write(L, ckpt[K3_TINY_NVFP4], "global"), K3_ERR_NUMERIC,
                    P "3.block_sparse_moe.experts.7.w1.weight_scale_2", "finite");
        tl_free(L);
    }
    /* a scale of the wrong shape: FP8 attention scale as [1,1] */
    tl_load(L, ckpt[K3_TINY_NVFP4]);
    k3_st_wtensor *sc = tl_find(L, P "0.self_attn.q_proj.weight_scale");
    sc->rank = 2, sc->shape[0] = 1, sc->shape[1] = 1;
    expect_open(tl_write(L, ckpt[K3_TINY_NVFP4], "scale-shape"), K3_ERR_SHAPE,
                P "0.self_attn.q_proj.weight_scale", "[1,2]");
    tl_free(L);
    /* a scale of the wrong dtype: E4M3 block scales stored as U8 */
    tl_load(L, ckpt[K3_TINY_NVFP4]);
    tl_find(L, P "1.block_sparse_moe.experts.1.w1.weight_scale")->dtype = K3_DTYPE_U8;
    expect_open(tl_write(L, ckpt[K3_TINY_NVFP4], "scale-dtype"), K3_ERR_DTYPE,
                P "1.block_sparse_moe.experts.1.w1.weight_scale", "F8_E4M3");
    tl_free(L);
    free(L);
}

static void test_bad_fp8_and_orphans(void **s) {
    (void)s;
    tlist *L = calloc(1, sizeof *L);
    /* bf16 checkpoint: q_proj's bytes relabelled F8_E4M3 (same shape: the silent
     * reinterpretation TRT-LLM once did), no scale */
    tl_load(L, ckpt[K3_TINY_BF16]);
    k3_st_wtensor *w = tl_find(L, P "1.self_attn.k_proj.weight");
    tl_drop(L, P "1.self_attn.k_proj.weight");
    w = tl_add(L, P "1.self_attn.k_proj.weight", K3_DTYPE_F8_E4M3, 2, 128, 256, 128 * 256);
    (void)w;
    expect_open(tl_write(L, ckpt[K3_TINY_BF16], "fp8-noscale"), K3_ERR_MISSING,
                P "1.self_attn.k_proj.weight", "without its scale");
    /* ... and with a scale, but nothing declares FP8 there */
    tl_add(L, P "1.self_attn.k_proj.weight_scale", K3_DTYPE_F32, 2, 1, 2, 8);
    expect_open(tl_write(L, ckpt[K3_TINY_BF16], "fp8-undeclared"), K3_ERR_FORMAT,
                P "1.self_attn.k_proj.weight", "no quantization declaration owns");
    tl_free(L);
    /* a quantized tensor no plan entry owns */
    tl_load(L, ckpt[K3_TINY_NVFP4]);
    tl_add(L, P "2.block_sparse_moe.experts.16.w1.weight", K3_DTYPE_U8, 2, 64, 64, 64 * 64);
    expect_open(tl_write(L, ckpt[K3_TINY_NVFP4], "orphan"), K3_ERR_FORMAT,
                P "2.block_sparse_moe.experts.16.w1.weight", "no declaration");
    tl_free(L);
    /* vision tensors and an unexpected BF16 tensor are skipped (the latter with a warning) */
    tl_load(L, ckpt[K3_TINY_NVFP4]);
    tl_add(L, "vision_tower.blocks.0.weight", K3_DTYPE_U8, 2, 4, 4, 16);
    tl_add(L, "mm_projector.proj.weight", K3_DTYPE_BF16, 2, 4, 4, 32);
    tl_add(L, P "0.extra_norm.weight", K3_DTYPE_BF16, 1, 4, 0, 8);
    const char *d = tl_write(L, ckpt[K3_TINY_NVFP4], "vision");
    k3_model *m = open_ok(d, 0, 0, 2);
    k3_model_close(m);
    tl_free(L);
    free(L);
}

static void test_bad_a_log_and_config(void **s) {
    (void)s;
    tlist *L = calloc(1, sizeof *L);
    tl_load(L, ckpt[K3_TINY_NVFP4]);
    float *a = wdata(tl_find(L, P "1.self_attn.A_log"));
    a[4] = 0.0f; /* head 4 is padding in the tiny model (4 heads): still zero, fine */
    a[100] = 1e-3f;
    expect_open(tl_write(L, ckpt[K3_TINY_NVFP4], "alog"), K3_ERR_NUMERIC, P "1.self_attn.A_log",
                "padding entry 100");
    tl_free(L);
    /* config and tensors disagree: moe_intermediate_size 64 -> 96 */
    tl_load(L, ckpt[K3_TINY_NVFP4]);
    const char *d = tl_write(L, ckpt[K3_TINY_NVFP4], "cfg");
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", d);
    cJSON *j;
    k3_error e = {0};
    assert_int_equal(k3_json_parse_file(&j, path, 1 << 20, &e), K3_OK);
    cJSON *tc = cJSON_GetObjectItem(j, "text_config");
    cJSON_ReplaceItemInObject(tc, "moe_intermediate_size", cJSON_CreateNumber(96));
    char *txt = cJSON_Print(j);
    FILE *f = fopen(path, "w");
    fputs(txt, f);
    fclose(f);
    free(txt);
    cJSON_Delete(j);
    expect_open(d, K3_ERR_SHAPE, P "1.block_sparse_moe.shared_experts.gate_proj.weight", "[96,256]");
    tl_free(L);
    /* no language_model. prefix: detected */
    tl_load(L, ckpt[K3_TINY_BF16]);
    for (size_t i = 0; i < L->n; i++) {
        char *n = L->names[i];
        memmove(n, n + 15, strlen(n + 15) + 1);
    }
    k3_model *m = open_ok(tl_write(L, ckpt[K3_TINY_BF16], "noprefix"), 0, 0, 1);
    k3_model_info info;
    k3_model_get_info(m, &info);
    assert_string_equal(info.prefix, "");
    k3_model_close(m);
    tl_free(L);
    free(L);
}

/* One activation scale feeds w1 and w3, so TensorRT-LLM asserts w1.input_scale ==
 * w3.input_scale (moe.md §2.2): a mismatch is an error naming both. */
static void test_input_scale_rule(void **s) {
    (void)s;
    tlist *L = calloc(1, sizeof *L);
    tl_load(L, ckpt[K3_TINY_NVFP4]);
    float *w1 = wdata(tl_find(L, P "1.block_sparse_moe.experts.2.w1.input_scale"));
    float *w3 = wdata(tl_find(L, P "1.block_sparse_moe.experts.2.w3.input_scale"));
    assert_true(*w1 == *w3); /* make-tiny writes them equal */
    *w3 = *w1 * 1.5f;
    expect_open(tl_write(L, ckpt[K3_TINY_NVFP4], "inscale"), K3_ERR_FORMAT,
                P "1.block_sparse_moe.experts.2.w1.input_scale",
                P "1.block_sparse_moe.experts.2.w3.input_scale");
    tl_free(L);
    free(L);
}

/* Replaces every tensor of L whose name contains key by M's tensors of that kind. */
static void tl_take(tlist *L, tlist *M, const char *key) {
    for (size_t i = 0; i < L->n;)
        if (strstr(L->t[i].name, key)) tl_drop(L, L->t[i].name);
        else i++;
    for (size_t i = 0; i < M->n; i++) {
        const k3_st_wtensor *t = &M->t[i];
        if (!strstr(t->name, key)) continue;
        uint64_t nb;
        assert_true(k3_st_tensor_bytes(t->dtype, t->rank, t->shape, NULL, &nb));
        k3_st_wtensor *w = tl_add(L, t->name, t->dtype, t->rank, t->shape[0], t->shape[1], nb);
        memcpy(wdata(w), t->data, nb);
    }
}

/* Removes quantization_config from dir's config.json and deletes hf_quant_config.json. */
static void drop_quant_config(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *j;
    k3_error e = {0};
    assert_int_equal(k3_json_parse_file(&j, path, 1 << 22, &e), K3_OK);
    cJSON_DeleteItemFromObject(j, "quantization_config");
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(j, "text_config"), "quantization_config");
    char *txt = cJSON_Print(j);
    FILE *f = fopen(path, "w");
    fputs(txt, f);
    fclose(f);
    free(txt);
    cJSON_Delete(j);
}

static void expect_same_expert(const k3_model *a, const k3_model *b, int layer, int expert) {
    const k3_qmat *x = &k3_model_moe(a, layer)->experts.e[expert].w2;
    const k3_qmat *y = &k3_model_moe(b, layer)->experts.e[expert].w2;
    assert_int_equal(x->fmt, y->fmt);
    assert_memory_equal(x->data, y->data, k3_qmat_data_bytes(y));
    assert_memory_equal(x->scale, y->scale, k3_qmat_scale_bytes(y));
    assert_true(x->global_scale == y->global_scale && x->input_scale == y->input_scale);
}

/* With no quantization config at all, a layer's routed-expert format is read from its tensors
 * (k3-architecture.md §1.2): the original K3 without its config loads as MXFP4, ModelOpt NVFP4
 * experts as NVFP4, per layer; experts of one layer in two formats are refused by name. */
static void test_undeclared_experts_inferred(void **s) {
    (void)s;
    tlist *L = calloc(1, sizeof *L), *M = calloc(1, sizeof *M);
    tl_load(L, ckpt[K3_TINY_MXFP4]);
    const char *d = tl_write(L, ckpt[K3_TINY_MXFP4], "mx-no-qc");
    drop_quant_config(d);
    k3_model *m = open_ok(d, 0, 0, 2), *ref = open_ok(ckpt[K3_TINY_MXFP4], 0, 0, 2);
    for (int l = 1; l < 4; l++) expect_same_expert(m, ref, l, 9);
    assert_int_equal(k3_model_moe(m, 1)->experts.e[9].w2.fmt, K3_WFMT_MXFP4);
    k3_model_close(m), k3_model_close(ref);
    tl_free(L);

    /* plain trunk, NVFP4 experts in layers 1-2 and MXFP4 in layer 3 */
    tl_load(L, ckpt[K3_TINY_BF16]);
    tl_load(M, ckpt[K3_TINY_NVFP4]);
    tl_take(L, M, ".block_sparse_moe.experts.");
    tl_free(M);
    tl_load(M, ckpt[K3_TINY_MXFP4]);
    tl_take(L, M, P "3.block_sparse_moe.experts.");
    d = tl_write(L, ckpt[K3_TINY_BF16], "nv-mx-no-qc");
    m = open_ok(d, 0, 0, 2);
    k3_model *nv = open_ok(ckpt[K3_TINY_NVFP4], 0, 0, 2), *mx = open_ok(ckpt[K3_TINY_MXFP4], 0, 0, 2);
    expect_same_expert(m, nv, 1, 9), expect_same_expert(m, nv, 2, 9);
    expect_same_expert(m, mx, 3, 9);
    assert_int_equal(k3_model_moe(m, 2)->experts.e[9].w2.fmt, K3_WFMT_NVFP4);
    assert_int_equal(k3_model_moe(m, 1)->latent_down.fmt, K3_WFMT_BF16);
    k3_layer_info li;
    k3_error e = {0};
    assert_int_equal(k3_model_layer_info(m, 3, &li, &e), K3_OK);
    assert_string_equal(li.expert_format, "MXFP4");
    k3_model_close(m), k3_model_close(nv), k3_model_close(mx);

    /* one expert of layer 2 in MXFP4 beside NVFP4 neighbours */
    tl_take(L, M, P "2.block_sparse_moe.experts.5.");
    expect_open(tl_write(L, ckpt[K3_TINY_BF16], "mixed-no-qc"), K3_ERR_FORMAT,
                P "2.block_sparse_moe.experts.5.w1: stored as MXFP4, but "
                  P "2.block_sparse_moe.experts.0.w1 as NVFP4", NULL);
    tl_free(L), tl_free(M);
    free(L), free(M);
}

/* Opens dir (which must load) with stderr captured into buf. */
static void open_capturing_stderr(const char *dir, char *buf, size_t size) {
    char path[400];
    snprintf(path, sizeof path, "%s/stderr.txt", root);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    k3_model *m = NULL;
    k3_error e = {0};
    k3_model_opts o = {.path = dir, .n_threads = 2};
    int rc = k3_model_open(&m, &o, &e);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    if (rc) fail_msg("open %s: %s", dir, e.msg);
    k3_model_close(m);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = 0;
    fclose(f);
}

/* compressed-tensors stores reciprocal globals (checkpoint-formats.md §4.1): messages about
 * them quote the values in the file under the file's names, not the decoded reciprocals. */
static void test_ct_scale_messages(void **s) {
    (void)s;
    tlist *L = calloc(1, sizeof *L);
    tl_load(L, ckpt[K3_TINY_NVFP4_CT]);
    const char *x = P "1.block_sparse_moe.experts.2.";
    char n1[200], n3[200];
    snprintf(n1, sizeof n1, "%sw1.input_global_scale", x);
    snprintf(n3, sizeof n3, "%sw3.input_global_scale", x);
    *(float *)wdata(tl_find(L, n1)) = 1024.0f;
    *(float *)wdata(tl_find(L, n3)) = 4.0f;
    char a[500], b[300];
    snprintf(a, sizeof a, "%s: 1024, but ", n1);
    snprintf(b, sizeof b, "%s: 4 (", n3);
    expect_open(tl_write(L, ckpt[K3_TINY_NVFP4_CT], "ct-igs"), K3_ERR_FORMAT, a, b);
    tl_free(L);
    tl_load(L, ckpt[K3_TINY_NVFP4_CT]);
    snprintf(n1, sizeof n1, "%sw1.weight_global_scale", x);
    snprintf(n3, sizeof n3, "%sw3.weight_global_scale", x);
    *(float *)wdata(tl_find(L, n1)) = 1024.0f;
    *(float *)wdata(tl_find(L, n3)) = 4.0f;
    char out[4096];
    open_capturing_stderr(tl_write(L, ckpt[K3_TINY_NVFP4_CT], "ct-wgs"), out, sizeof out);
    snprintf(a, sizeof a, "%s: 1024, but %s: 4, ", n1, n3);
    if (!strstr(out, a)) fail_msg("stderr lacks \"%s\": %s", a, out);
    tl_free(L);
    free(L);
}

/* An empty tensor may carry any uint64 shape entry (checkpoint-formats.md §1.4); one above
 * INT64_MAX does not fit a view's int64 shape and is refused by name, not wrapped negative. */
static void test_view_of_huge_empty(void **s) {
    (void)s;
    k3_tensor_info ti = {.name = "x.weight", .dtype = K3_DTYPE_U8, .rank = 2,
                         .shape = {UINT64_MAX, 0}};
    k3_tview v;
    k3_error e = {0};
    assert_int_equal(k3_tview_init(&v, &ti, NULL, &e), K3_ERR_SHAPE);
    assert_non_null(strstr(e.msg, "x.weight: shape[0] = 18446744073709551615"));
    ti.shape[0] = (uint64_t)INT64_MAX;
    assert_int_equal(k3_tview_init(&v, &ti, NULL, &e), K3_OK);
    assert_true(v.shape[0] == INT64_MAX && v.shape[1] == 0 && v.rank == 2);
}

/* The progress line of loads over a second: silent before, bytes/GB/s/ETA after, rate
 * limited, and closed with a newline only when one was shown. */
static void test_progress_line(void **s) {
    (void)s;
    char b[160] = "";
    assert_false(k3_read_progress_line(b, sizeof b, 5e8, 2e9, 0.99, 0.99, false, false));
    assert_false(k3_read_progress_line(b, sizeof b, 2e9, 2e9, 0.5, 0.5, true, false));
    assert_true(k3_read_progress_line(b, sizeof b, 5e8, 2e9, 1.0, 1.0, false, false));
    assert_string_equal(b, "\rk3: loading 0.50 / 2.00 GB, 0.50 GB/s, ETA 3 s   ");
    assert_false(k3_read_progress_line(b, sizeof b, 6e8, 2e9, 1.1, 0.1, false, true));
    assert_true(k3_read_progress_line(b, sizeof b, 2e9, 2e9, 2.5, 0.1, true, true));
    assert_string_equal(b, "\rk3: loading 2.00 / 2.00 GB, 0.80 GB/s, ETA 0 s   \n");
}

/* Replaces every occurrence of a in file path by the next of the given spellings, in turn. */
static void rewrite_cycle(const char *path, const char *a, const char *const *to, int n_to) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *txt = calloc(1, (size_t)n + 1);
    assert_int_equal(fread(txt, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    f = fopen(path, "wb");
    size_t la = strlen(a);
    int k = 0;
    for (char *p = txt, *q; *p; p = q + la) {
        if (!(q = strstr(p, a))) {
            fputs(p, f);
            break;
        }
        fwrite(p, 1, (size_t)(q - p), f);
        fputs(to[k++ % n_to], f);
    }
    fclose(f);
    free(txt);
}

/* nvidia/Kimi-K3-NVFP4 as published (checkpoint-formats.md §2.2, §3.1, §7.3): the FP8_PB_WO
 * alias in lower, upper and mixed case across quantized_layers, weight_scale_2/input_scale
 * scalars of shape [] and [1], a BF16 weight_scale_2 (TRT-LIN notes ModelOpt writes some),
 * and vision tensors beside the text model. */
static void test_published_modelopt(void **s) {
    (void)s;
    tlist *L = calloc(1, sizeof *L);
    tl_load(L, ckpt[K3_TINY_NVFP4]);
    const char *x5 = P "1.block_sparse_moe.experts.5.w1.", *x6 = P "2.block_sparse_moe.experts.6.w2.";
    char n[300];
    snprintf(n, sizeof n, "%sweight_scale_2", x5);
    k3_st_wtensor *w = tl_find(L, n);
    float ws2_5, ws2_6;
    memcpy(&ws2_5, w->data, 4);
    w->rank = 1, w->shape[0] = 1;
    snprintf(n, sizeof n, "%sinput_scale", x5);
    w = tl_find(L, n);
    w->rank = 1, w->shape[0] = 1;
    snprintf(n, sizeof n, "%sweight_scale_2", x6);
    memcpy(&ws2_6, tl_find(L, n)->data, 4);
    tl_drop(L, n);
    uint16_t h = k3_f32_to_bf16(ws2_6);
    memcpy(wdata(tl_add(L, n, K3_DTYPE_BF16, 0, 0, 0, 2)), &h, 2);
    tl_add(L, "vision_tower.encoder.blocks.0.attn.qkv.weight", K3_DTYPE_BF16, 2, 8, 8, 128);
    tl_add(L, "mm_projector.proj.0.weight", K3_DTYPE_BF16, 2, 8, 8, 128);
    const char *d = tl_write(L, ckpt[K3_TINY_NVFP4], "published-modelopt");
    char path[600];
    snprintf(path, sizeof path, "%s/hf_quant_config.json", d);
    static const char *const cases[3] = {"fp8_pb_wo", "FP8_PB_WO", "Fp8_Pb_Wo"};
    rewrite_cycle(path, "FP8_PB_WO", cases, 3);
    static const char *const lower[1] = {"fp8_pb_wo"};
    snprintf(path, sizeof path, "%s/config.json", d);
    rewrite_cycle(path, "FP8_PB_WO", lower, 1);
    /* entries under checkpoint alias names no module consumes (TS lists fused_qkvg_proj and
     * in_proj_qkvgfab in the K3 export): harmless, they declare nothing that exists */
    static const char *const alias[1] = {
        "\"quantized_layers\":\t{\n\t\t\t\"language_model.model.layers.0.self_attn.fused_qkvg_proj\": "
        "{\"quant_algo\": \"FP8_PB_WO\"}, \"language_model.model.layers.1.self_attn.in_proj_qkvgfab\": "
        "{\"quant_algo\": \"FP8_PB_WO\"},"};
    snprintf(path, sizeof path, "%s/hf_quant_config.json", d);
    rewrite_cycle(path, "\"quantized_layers\":\t{", alias, 1);
    k3_model *m = open_ok(d, 0, 0, 2);
    const k3_expert *e5 = &k3_model_moe(m, 1)->experts.e[5], *e6 = &k3_model_moe(m, 2)->experts.e[6];
    assert_true(e5->w1.fmt == K3_WFMT_NVFP4 && e5->w1.global_scale == ws2_5 && e5->w1.input_scale > 0);
    assert_true(e6->w2.global_scale == k3_bf16_to_f32(h));
    int fp8 = 0;
    for (size_t i = 0; i < m->plan.n; i++)
        if (m->plan.e[i].role == K3_R_ATTN_PROJ && m->le[i].q.fmt == K3_WFMT_FP8_BLOCK) fp8++;
    assert_true(fp8 >= 20); /* every declared projection, whatever the alias's case */
    assert_int_equal(k3_model_entry(m, "model.layers.0.self_attn.q_proj")->q.fmt, K3_WFMT_FP8_BLOCK);
    assert_int_equal(k3_model_entry(m, "model.layers.3.self_attn.kv_b_proj")->q.fmt, K3_WFMT_FP8_BLOCK);
    k3_model_close(m);
    tl_free(L);
    free(L);
}

/* moonshotai/Kimi-K3 as published (k3-architecture.md §1.2, §8): compressed-tensors
 * mxfp4-pack-quantized with its ignore list, no hf_quant_config.json, experts weight_packed +
 * U8 weight_scale, every other tensor BF16 (router and latent projections included although
 * `targets: Linear` covers them), language_model. prefix, vision tensors present and skipped. */
static void test_published_original(void **s) {
    (void)s;
    tlist *L = calloc(1, sizeof *L);
    tl_load(L, ckpt[K3_TINY_MXFP4]);
    tl_add(L, "vision_tower.encoder.blocks.0.attn.qkv.weight", K3_DTYPE_BF16, 2, 8, 8, 128);
    tl_add(L, "vision_tower.patch_embed.proj.weight_packed", K3_DTYPE_U8, 2, 8, 4, 32);
    tl_add(L, "mm_projector.proj.0.weight", K3_DTYPE_BF16, 2, 8, 8, 128);
    const char *d = tl_write(L, ckpt[K3_TINY_MXFP4], "published-original");
    char path[600];
    snprintf(path, sizeof path, "%s/hf_quant_config.json", d);
    assert_int_not_equal(access(path, F_OK), 0);
    k3_model *m = open_ok(d, 0, 0, 2);
    k3_model_info info;
    k3_model_get_info(m, &info);
    assert_string_equal(info.prefix, "language_model.");
    for (size_t i = 0; i < m->plan.n; i++) {
        const k3_pentry *e = &m->plan.e[i];
        if (!e->linear) continue;
        int want = e->role == K3_R_EXPERT ? K3_WFMT_MXFP4 : K3_WFMT_BF16;
        if ((int)m->le[i].q.fmt != want)
            fail_msg("%s: %s, expected %s", e->name, k3_wfmt_name(m->le[i].q.fmt),
                     k3_wfmt_name((k3_wfmt)want));
    }
    for (size_t i = 0; i < m->n_views; i++) assert_null(strstr(m->views[i].name, "vision_tower"));
    k3_model_close(m);
    tl_free(L);
    free(L);
}

/* Deletes every quantized_layers entry whose name contains key, in obj (recursively). */
static void drop_qlayers(cJSON *obj, const char *key) {
    for (cJSON *c = obj ? obj->child : NULL, *next; c; c = next) {
        next = c->next;
        if (c->string && strstr(c->string, key) && cJSON_IsObject(c) &&
            cJSON_GetObjectItem(c, "quant_algo"))
            cJSON_DeleteItemFromObject(obj, c->string);
        else if (cJSON_IsObject(c))
            drop_qlayers(c, key);
    }
}

static void edit_json(const char *dir, const char *file, const char *key) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    cJSON *j;
    k3_error e = {0};
    assert_int_equal(k3_json_parse_file(&j, path, 1 << 22, &e), K3_OK);
    drop_qlayers(j, key);
    char *txt = cJSON_Print(j);
    FILE *f = fopen(path, "w");
    fputs(txt, f);
    fclose(f);
    free(txt);
    cJSON_Delete(j);
}

/* The routed-expert format is resolved per layer (issue 3 item 2, TRT-K3
 * `_resolve_routed_quant_config`): a ModelOpt checkpoint that declares NVFP4 for layers 1-2
 * and nothing for layer 3 holds MXFP4 experts there (W4A8_MXFP4_MXFP8, the default). */
static void test_expert_format_per_layer(void **s) {
    (void)s;
    tlist *L = calloc(1, sizeof *L), *M = calloc(1, sizeof *M);
    tl_load(L, ckpt[K3_TINY_NVFP4]);
    tl_load(M, ckpt[K3_TINY_MXFP4]);
    tl_take(L, M, P "3.block_sparse_moe.experts.");
    const char *d = tl_write(L, ckpt[K3_TINY_NVFP4], "per-layer");
    edit_json(d, "hf_quant_config.json", "layers.3.block_sparse_moe.experts");
    edit_json(d, "hf_quant_config.json", "layers.3.mlp.experts");
    edit_json(d, "config.json", "layers.3.block_sparse_moe.experts");
    edit_json(d, "config.json", "layers.3.mlp.experts");
    k3_model *m = open_ok(d, 0, 0, 2), *mx = open_ok(ckpt[K3_TINY_MXFP4], 0, 0, 2);
    k3_error e = {0};
    k3_layer_info li;
    for (int l = 1; l < 4; l++) {
        assert_int_equal(k3_model_layer_info(m, l, &li, &e), K3_OK);
        assert_string_equal(li.expert_format, l < 3 ? "NVFP4" : "MXFP4");
    }
    const k3_qmat *a = &k3_model_moe(m, 3)->experts.e[9].w2, *b = &k3_model_moe(mx, 3)->experts.e[9].w2;
    assert_int_equal(a->fmt, K3_WFMT_MXFP4);
    assert_memory_equal(a->data, b->data, k3_qmat_data_bytes(b));
    assert_memory_equal(a->scale, b->scale, k3_qmat_scale_bytes(b));
    assert_int_equal(k3_model_moe(m, 2)->experts.e[9].w2.fmt, K3_WFMT_NVFP4);
    k3_model_close(m), k3_model_close(mx);
    tl_free(L), tl_free(M);
    free(L), free(M);
}

/* A compressed-tensors NVFP4 Kimi-Linear checkpoint as Firworks publishes one
 * (checkpoint-formats.md §4, k3-architecture.md §1.3): bare kimi_linear config, no tensor
 * prefix, SiLU experts at full width (no latent MoE), low-rank g_a/g_b KDA gate, softplus
 * decay, plain residuals, q_proj without q_lora, A_log [1,1,H,1], and `targets: Linear`
 * with ignore [lm_head], so the attention projections are NVFP4 with reciprocal globals. */
static void test_kimi_linear_ct(void **s) {
    (void)s;
    k3_model_config mc;
    k3_error e = {0};
    assert_int_equal(k3_tiny_config(K3_TINY_TINY, &mc, &e), K3_OK);
    free(mc.layers);
    mc.layers = NULL;
    mc.wrapped = false;
    mc.hidden_act = K3_ACT_SILU, mc.situ_beta = 0, mc.situ_linear_beta = 0;
    mc.kda_full_rank_gate = false;
    mc.kda_has_lower_bound = false, mc.kda_gate_lower_bound = 0;
    mc.routed_expert_hidden_size = 0, mc.latent_moe_use_norm = false;
    mc.attn_res_block_size = 0;
    mc.mla_use_output_gate = false;
    mc.q_lora_rank = 0;
    mc.routed_scaling_factor = 2.446;
    mc.num_shared_experts = 1;
    const int64_t kda[3] = {1, 2, 3}, mla[1] = {4};
    assert_int_equal(k3_model_config_set_layers(&mc, kda, 3, mla, 1, "kimi-linear", &e), K3_OK);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/kimi-linear-ct", root);
    k3_tiny_opts o = {.dir = dir, .format = K3_TINY_NVFP4_CT, .seed = SEED, .n_threads = 2,
                      .custom = &mc};
    if (k3_make_tiny(&o, &e)) fail_msg("make-tiny kimi-linear: %s", e.msg);
    k3_model_config_free(&mc);

    /* the files look like the published ones */
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *j;
    assert_int_equal(k3_json_parse_file(&j, path, 1 << 20, &e), K3_OK);
    assert_string_equal(cJSON_GetObjectItem(j, "model_type")->valuestring, "kimi_linear");
    assert_null(cJSON_GetObjectItem(j, "text_config"));
    const cJSON *q = cJSON_GetObjectItem(j, "quantization_config");
    assert_string_equal(cJSON_GetObjectItem(q, "format")->valuestring, "nvfp4-pack-quantized");
    cJSON_Delete(j);

    k3_model *m = open_ok(dir, 0, 0, 2);
    k3_model_info info;
    k3_model_get_info(m, &info);
    assert_string_equal(info.prefix, "");
    for (size_t i = 0; i < m->plan.n; i++) expect_entry(m, i, K3_TINY_NVFP4_CT);
    const k3_lentry *x = k3_model_entry(m, "model.layers.0.self_attn.g_a_proj");
    assert_non_null(x);
    assert_int_equal(x->q.fmt, K3_WFMT_NVFP4); /* attention under targets: Linear */
    assert_non_null(k3_model_entry(m, "model.layers.0.self_attn.g_b_proj"));
    assert_null(k3_model_entry(m, "model.layers.0.self_attn.g_proj"));
    assert_int_equal(k3_model_entry(m, "model.layers.3.self_attn.q_proj")->q.fmt, K3_WFMT_NVFP4);
    assert_int_equal(k3_model_entry(m, "lm_head")->q.fmt, K3_WFMT_BF16); /* ignored */
    const k3_lentry *al = k3_model_entry(m, "model.layers.1.self_attn.A_log");
    assert_int_equal(al->v->rank, 4);
    assert_int_equal(al->v->shape[2], 4);
    for (int l = 1; l < 4; l++) {
        const k3_moe_block *b = k3_model_moe(m, l);
        assert_non_null(b);
        assert_int_equal(b->experts.act.act, K3_ACT_SWIGLU);
        assert_null(b->experts.act.alpha);
        assert_false(b->latent);
        assert_int_equal(b->experts.hidden, 256);
        assert_int_equal(b->experts.e[7].w3.fmt, K3_WFMT_NVFP4);
        assert_int_equal(b->experts.e[7].w1.cols, 256);
        assert_int_equal(b->router.gate.fmt, K3_WFMT_BF16); /* no nn.Linear: stays BF16 */
        assert_true(b->router.routed_scaling_factor == 2.446f);
        assert_int_equal(b->n_shared, 1);
        assert_int_equal(b->shared_gate.fmt, K3_WFMT_NVFP4);
    }
    k3_model_close(m);

    /* the same files with K3's padded A_log [128] and a non-zero tail: rejected by name */
    tlist *L = calloc(1, sizeof *L);
    tl_load(L, dir);
    k3_st_wtensor *a = tl_find(L, "model.layers.2.self_attn.A_log");
    float *pad = calloc(128, sizeof *pad);
    memcpy(pad, a->data, 4 * sizeof(float));
    pad[77] = 0.5f;
    free(L->own[a - L->t]);
    L->own[a - L->t] = pad;
    a->data = pad, a->rank = 1, a->shape[0] = 128, a->shape[1] = a->shape[2] = a->shape[3] = 0;
    expect_open(tl_write(L, dir, "kl-alog"), K3_ERR_NUMERIC, "model.layers.2.self_attn.A_log",
                "padding entry 77");
    tl_free(L);
    free(L);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_nvfp4),   cmocka_unit_test(test_roundtrip_nvfp4_ct),
        cmocka_unit_test(test_roundtrip_mxfp4),   cmocka_unit_test(test_roundtrip_bf16),
        cmocka_unit_test(test_determinism),       cmocka_unit_test(test_expert_parallel),
        cmocka_unit_test(test_layer_subset),      cmocka_unit_test(test_headers_only),      cmocka_unit_test(test_bad_missing_expert),
        cmocka_unit_test(test_bad_expert_twice),  cmocka_unit_test(test_bad_scales),
        cmocka_unit_test(test_bad_fp8_and_orphans), cmocka_unit_test(test_bad_a_log_and_config),
        cmocka_unit_test(test_input_scale_rule),  cmocka_unit_test(test_kimi_linear_ct),
        cmocka_unit_test(test_progress_line),     cmocka_unit_test(test_expert_format_per_layer),
        cmocka_unit_test(test_view_of_huge_empty), cmocka_unit_test(test_ct_scale_messages),
        cmocka_unit_test(test_undeclared_experts_inferred),
        cmocka_unit_test(test_published_modelopt), cmocka_unit_test(test_published_original),
    };
    return cmocka_run_group_tests_name("load", tests, setup, teardown);
}
