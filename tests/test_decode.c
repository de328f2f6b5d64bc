/* Tensor decoding (src/load/decode.h) on in-memory tensors: every format's accepted forms
 * and every rejection of checkpoint-formats.md §8.2 item 6, each checked for its status and
 * for the tensor name in the message. Loader-level cases (orphans, duplicates, A_log,
 * missing experts) are in test_load.c on real checkpoints. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "load/decode.h"

#define MAXV 8
typedef struct set {
    k3_tview v[MAXV];
    char names[MAXV][128];
    int n;
} set;

static const k3_tview *find(void *ctx, const char *name) {
    set *s = ctx;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i].name, name)) return &s->v[i];
    return NULL;
}

static k3_tview *add(set *s, const char *name, k3_dtype dt, int rank, int64_t a, int64_t b,
                     const void *data, uint64_t nbytes) {
    k3_tview *v = &s->v[s->n];
    snprintf(s->names[s->n], sizeof s->names[0], "%s", name);
    *v = (k3_tview){.name = s->names[s->n], .dtype = dt, .rank = rank, .data = data, .nbytes = nbytes};
    v->shape[0] = a, v->shape[1] = b;
    s->n++;
    return v;
}

/* an NVFP4 module of [rows=4, cols=32] */
static uint8_t w4[4 * 16], s4[4 * 2];
static float ws2 = 0.25f, ins = 0.01f;

static void nvfp4_set(set *s, const char *m, bool ct) {
    char n[128];
    memset(s4, 0x38, sizeof s4); /* E4M3 1.0 */
    for (int i = 0; i < (int)sizeof w4; i++) w4[i] = (uint8_t)(i * 37);
    snprintf(n, sizeof n, "%s.%s", m, ct ? "weight_packed" : "weight");
    add(s, n, K3_DTYPE_U8, 2, 4, 16, w4, sizeof w4);
    snprintf(n, sizeof n, "%s.weight_scale", m);
    add(s, n, K3_DTYPE_F8_E4M3, 2, 4, 2, s4, sizeof s4);
    snprintf(n, sizeof n, "%s.%s", m, ct ? "weight_global_scale" : "weight_scale_2");
    add(s, n, K3_DTYPE_F32, 0, 0, 0, &ws2, 4);
    snprintf(n, sizeof n, "%s.%s", m, ct ? "input_global_scale" : "input_scale");
    add(s, n, K3_DTYPE_F32, 1, 1, 0, &ins, 4);
}

static void test_nvfp4(void **state) {
    (void)state;
    set s = {0};
    nvfp4_set(&s, "m", false);
    k3_qmat q;
    assert_int_equal(k3_decode_linear("m", K3_QS_NVFP4, false, 4, 32, find, &s, NULL, &q, NULL), K3_OK);
    assert_int_equal(q.fmt, K3_WFMT_NVFP4);
    assert_ptr_equal(q.data, w4);
    assert_ptr_equal(q.scale, s4);
    assert_true(q.global_scale == 0.25f && q.input_scale == 0.01f);
    set c = {0};
    nvfp4_set(&c, "m", true);
    assert_int_equal(k3_decode_linear("m", K3_QS_NVFP4_CT, false, 4, 32, find, &c, NULL, &q, NULL), K3_OK);
    assert_true(q.global_scale == 4.0f && q.input_scale == 1.0f / 0.01f);
    /* BF16 scalar global scale is accepted */
    uint16_t bf = 0x3E80; /* 0.25 */
    s.v[2].dtype = K3_DTYPE_BF16, s.v[2].data = &bf, s.v[2].nbytes = 2;
    assert_int_equal(k3_decode_linear("m", K3_QS_NVFP4, false, 4, 32, find, &s, NULL, &q, NULL), K3_OK);
    assert_true(q.global_scale == 0.25f);
}

static void expect(int rc, int status, const k3_error *e, const char *a, const char *b) {
    assert_int_equal(rc, status);
    if (!strstr(e->msg, a) || (b && !strstr(e->msg, b))) fail_msg("message '%s' lacks '%s' / '%s'", e->msg, a, b ? b : "");
}

static void test_nvfp4_rejects(void **state) {
    (void)state;
    k3_qmat q;
    k3_error e = {0};
    set s = {0};
    nvfp4_set(&s, "x.w1", false);
    /* NaN block scales: E4M3 0x7F and 0xFF */
    s4[3] = 0x7F;
    expect(k3_decode_linear("x.w1", K3_QS_NVFP4, false, 4, 32, find, &s, NULL, &q, &e), K3_ERR_NUMERIC, &e, "x.w1.weight_scale", "NaN");
    s4[3] = 0xFF;
    expect(k3_decode_linear("x.w1", K3_QS_NVFP4, false, 4, 32, find, &s, NULL, &q, &e), K3_ERR_NUMERIC, &e, "x.w1.weight_scale", "NaN");
    s4[3] = 0x38;
    /* global scales: zero, negative, NaN, Inf */
    const float bad[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        float g = bad[i];
        s.v[2].data = &g;
        expect(k3_decode_linear("x.w1", K3_QS_NVFP4, false, 4, 32, find, &s, NULL, &q, &e), K3_ERR_NUMERIC, &e, "x.w1.weight_scale_2", "finite");
        s.v[2].data = &ws2;
        s.v[3].data = &g;
        expect(k3_decode_linear("x.w1", K3_QS_NVFP4, false, 4, 32, find, &s, NULL, &q, &e), K3_ERR_NUMERIC, &e, "x.w1.input_scale", NULL);
        s.v[3].data = &ins;
    }
    /* scale of the wrong shape, then of the wrong dtype */
    s.v[1].shape[1] = 3;
    expect(k3_decode_linear("x.w1", K3_QS_NVFP4, false, 4, 32, find, &s, NULL, &q, &e), K3_ERR_SHAPE, &e, "x.w1.weight_scale", "[4,2]");
    s.v[1].shape[1] = 2;
    s.v[1].dtype = K3_DTYPE_U8;
    expect(k3_decode_linear("x.w1", K3_QS_NVFP4, false, 4, 32, find, &s, NULL, &q, &e), K3_ERR_DTYPE, &e, "x.w1.weight_scale", "F8_E4M3");
    s.v[1].dtype = K3_DTYPE_F8_E4M3;
    /* scalar of shape [2] */
    s.v[2].rank = 1, s.v[2].shape[0] = 2;
    expect(k3_decode_linear("x.w1", K3_QS_NVFP4, false, 4, 32, find, &s, NULL, &q, &e), K3_ERR_SHAPE, &e, "x.w1.weight_scale_2", NULL);
    s.v[2].rank = 0;
    /* weight shape disagrees with the config */
    expect(k3_decode_linear("x.w1", K3_QS_NVFP4, false, 8, 32, find, &s, NULL, &q, &e), K3_ERR_SHAPE, &e, "x.w1.weight", "[8,16]");
    /* missing scale, missing global scale */
    s.v[1].name = "x.w1.other";
    expect(k3_decode_linear("x.w1", K3_QS_NVFP4, false, 4, 32, find, &s, NULL, &q, &e), K3_ERR_MISSING, &e, "x.w1.weight_scale", "missing");
    s.v[1].name = s.names[1];
    s.v[2].name = "x.w1.other";
    expect(k3_decode_linear("x.w1", K3_QS_NVFP4, false, 4, 32, find, &s, NULL, &q, &e), K3_ERR_MISSING, &e, "x.w1.weight_scale_2", "missing");
    s.v[2].name = s.names[2];
    /* packed bytes where nothing is declared */
    expect(k3_decode_linear("x.w1", K3_QS_NONE, false, 4, 32, find, &s, NULL, &q, &e), K3_ERR_FORMAT, &e, "x.w1.weight", "no quantization declaration owns");
    /* compressed-tensors names under a ModelOpt declaration */
    set c = {0};
    nvfp4_set(&c, "y", true);
    expect(k3_decode_linear("y", K3_QS_NVFP4, false, 4, 32, find, &c, NULL, &q, &e), K3_ERR_FORMAT, &e, "y.weight_packed", "y.weight");
    /* CT reciprocal of a global scale: zero is rejected before inversion */
    float z = 0.0f;
    c.v[2].data = &z;
    expect(k3_decode_linear("y", K3_QS_NVFP4_CT, false, 4, 32, find, &c, NULL, &q, &e), K3_ERR_NUMERIC, &e, "y.weight_global_scale", NULL);
}

static void test_mxfp4(void **state) {
    (void)state;
    static uint8_t w[2 * 32], sc[2 * 2];
    set s = {0};
    add(&s, "e.w2.weight_packed", K3_DTYPE_U8, 2, 2, 32, w, sizeof w);
    k3_tview *sv = add(&s, "e.w2.weight_scale", K3_DTYPE_U8, 2, 2, 2, sc, sizeof sc);
    memset(sc, 127, sizeof sc);
    k3_qmat q;
    k3_error e = {0};
    assert_int_equal(k3_decode_linear("e.w2", K3_QS_MXFP4, false, 2, 64, find, &s, NULL, &q, &e), K3_OK);
    assert_int_equal(q.fmt, K3_WFMT_MXFP4);
    sv->dtype = K3_DTYPE_F8_E8M0;
    assert_int_equal(k3_decode_linear("e.w2", K3_QS_MXFP4, false, 2, 64, find, &s, NULL, &q, &e), K3_OK);
    sc[1] = 0xFF;
    expect(k3_decode_linear("e.w2", K3_QS_MXFP4, false, 2, 64, find, &s, NULL, &q, &e), K3_ERR_NUMERIC, &e, "e.w2.weight_scale", "NaN");
    sc[1] = 127;
    sv->dtype = K3_DTYPE_F8_E4M3;
    expect(k3_decode_linear("e.w2", K3_QS_MXFP4, false, 2, 64, find, &s, NULL, &q, &e), K3_ERR_DTYPE, &e, "e.w2.weight_scale", "U8|F8_E8M0");
    sv->dtype = K3_DTYPE_U8;
    /* in_features not a multiple of 32 */
    expect(k3_decode_linear("e.w2", K3_QS_MXFP4, false, 2, 48, find, &s, NULL, &q, &e), K3_ERR_SHAPE, &e, "e.w2.weight_packed", "% 32");
}

static void test_fp8_block(void **state) {
    (void)state;
    /* ragged: [200, 130] -> scale [2, 2]; 4-D ModelOpt form, then 2-D weight_scale_inv */
    static uint8_t w[200 * 130];
    static float sc[4] = {0.5f, 1.0f, 2.0f, 4.0f};
    set s = {0};
    add(&s, "a.q_proj.weight", K3_DTYPE_F8_E4M3, 2, 200, 130, w, sizeof w);
    k3_tview *sv = add(&s, "a.q_proj.weight_scale", K3_DTYPE_F32, 4, 2, 1, sc, sizeof sc);
    sv->shape[2] = 2, sv->shape[3] = 1;
    k3_qmat q;
    k3_error e = {0};
    assert_int_equal(k3_decode_linear("a.q_proj", K3_QS_FP8_BLOCK, false, 200, 130, find, &s, NULL, &q, &e), K3_OK);
    assert_int_equal(q.fmt, K3_WFMT_FP8_BLOCK);
    assert_ptr_equal(q.scale, sc);
    sv->rank = 2, sv->shape[1] = 2;
    assert_int_equal(k3_decode_linear("a.q_proj", K3_QS_FP8_BLOCK, false, 200, 130, find, &s, NULL, &q, &e), K3_OK);
    /* the DeepSeek name */
    snprintf(s.names[1], sizeof s.names[1], "a.q_proj.weight_scale_inv");
    assert_int_equal(k3_decode_linear("a.q_proj", K3_QS_FP8_BLOCK, false, 200, 130, find, &s, NULL, &q, &e), K3_OK);
    /* both names at once */
    k3_tview *dup = add(&s, "a.q_proj.weight_scale", K3_DTYPE_F32, 2, 2, 2, sc, sizeof sc);
    expect(k3_decode_linear("a.q_proj", K3_QS_FP8_BLOCK, false, 200, 130, find, &s, NULL, &q, &e), K3_ERR_DUPLICATE, &e, "a.q_proj.weight", "weight_scale_inv");
    dup->name = "unrelated";
    /* wrong scale grid (as if blocks did not cover the ragged edge) and wrong dtype */
    sv->shape[1] = 1;
    expect(k3_decode_linear("a.q_proj", K3_QS_FP8_BLOCK, false, 200, 130, find, &s, NULL, &q, &e), K3_ERR_SHAPE, &e, "a.q_proj.weight_scale_inv", "[2,2]");
    sv->shape[1] = 2;
    sv->dtype = K3_DTYPE_BF16;
    expect(k3_decode_linear("a.q_proj", K3_QS_FP8_BLOCK, false, 200, 130, find, &s, NULL, &q, &e), K3_ERR_DTYPE, &e, "a.q_proj.weight_scale_inv", "F32");
    sv->dtype = K3_DTYPE_F32;
    sc[3] = NAN;
    expect(k3_decode_linear("a.q_proj", K3_QS_FP8_BLOCK, false, 200, 130, find, &s, NULL, &q, &e), K3_ERR_NUMERIC, &e, "a.q_proj.weight_scale_inv", "block (1,1)");
    sc[3] = 4.0f;
    /* an F8_E4M3 weight with a scale but no declaration */
    expect(k3_decode_linear("a.q_proj", K3_QS_NONE, false, 200, 130, find, &s, NULL, &q, &e), K3_ERR_FORMAT, &e, "a.q_proj.weight", "no quantization declaration owns");
    /* an F8_E4M3 weight without its scale, declared or not */
    sv->name = "unrelated2";
    expect(k3_decode_linear("a.q_proj", K3_QS_NONE, false, 200, 130, find, &s, NULL, &q, &e), K3_ERR_MISSING, &e, "a.q_proj.weight", "without its scale");
    expect(k3_decode_linear("a.q_proj", K3_QS_FP8_BLOCK, false, 200, 130, find, &s, NULL, &q, &e), K3_ERR_MISSING, &e, "a.q_proj.weight", "without its scale");
}

static void test_plain(void **state) {
    (void)state;
    static uint16_t w[6 * 8];
    set s = {0};
    add(&s, "b.weight", K3_DTYPE_BF16, 2, 6, 8, w, sizeof w);
    k3_qmat q;
    k3_error e = {0};
    assert_int_equal(k3_decode_linear("b", K3_QS_NONE, false, 6, 8, find, &s, NULL, &q, &e), K3_OK);
    assert_int_equal(q.fmt, K3_WFMT_BF16);
    /* plain under FP8 (TensorRT-LLM keeps b_proj BF16) and under a class target */
    assert_int_equal(k3_decode_linear("b", K3_QS_FP8_BLOCK, false, 6, 8, find, &s, NULL, &q, &e), K3_OK);
    assert_int_equal(k3_decode_linear("b", K3_QS_NVFP4_CT, true, 6, 8, find, &s, NULL, &q, &e), K3_OK);
    expect(k3_decode_linear("b", K3_QS_NVFP4_CT, false, 6, 8, find, &s, NULL, &q, &e), K3_ERR_FORMAT, &e, "b.weight", "b.weight_packed");
    expect(k3_decode_linear("b", K3_QS_NVFP4, false, 6, 8, find, &s, NULL, &q, &e), K3_ERR_DTYPE, &e, "b.weight", "declared NVFP4");
    assert_int_equal(k3_decode_linear("b", K3_QS_NVFP4, true, 6, 8, find, &s, NULL, &q, &e), K3_OK);
    s.v[0].dtype = K3_DTYPE_I32;
    expect(k3_decode_linear("b", K3_QS_NONE, false, 6, 8, find, &s, NULL, &q, &e), K3_ERR_DTYPE, &e, "b.weight", "I32");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nvfp4), cmocka_unit_test(test_nvfp4_rejects),
        cmocka_unit_test(test_mxfp4), cmocka_unit_test(test_fp8_block),
        cmocka_unit_test(test_plain),
    };
    return cmocka_run_group_tests_name("decode", tests, NULL, NULL);
}
