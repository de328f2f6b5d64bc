/* Tensor decoding and validation; see decode.h. Every check names the tensor and says what
 * was expected and what was found, in the style of STYLE.md. */
#include "load/decode.h"

#include "formats/fp.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const char *k3_shape_str(int rank, const int64_t *shape, char *buf, size_t size) {
    size_t n = 0;
    n += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

int k3_tview_init(k3_tview *out, const k3_tensor_info *ti, const void *data, k3_error *err) {
    *out = (k3_tview){.name = ti->name, .dtype = ti->dtype, .rank = ti->rank, .data = data,
                      .nbytes = ti->nbytes};
    for (int i = 0; i < ti->rank; i++) {
        if (ti->shape[i] > INT64_MAX)
            return k3_fail(err, K3_ERR_SHAPE, "%s: shape[%d] = %llu, above the %lld a view holds",
                           ti->name, i, (unsigned long long)ti->shape[i], (long long)INT64_MAX);
        out->shape[i] = (int64_t)ti->shape[i];
    }
    return K3_OK;
}

const char *const k3_qsuffix[K3_N_QSUFFIX] = {
    "weight", "weight_packed", "weight_scale", "weight_scale_inv", "weight_scale_2",
    "input_scale", "weight_global_scale", "input_global_scale"};

static const char *tdt(const k3_tview *t) { return k3_dtype_name(t->dtype); }

static bool shape_is(const k3_tview *t, int rank, const int64_t *shape) {
    if (t->rank != rank) return false;
    for (int i = 0; i < rank; i++)
        if (t->shape[i] != shape[i]) return false;
    return true;
}

/* "name: expected DT [shape], found DT [shape]" with the status the mismatch deserves. */
static int mismatch(const k3_tview *t, bool dtype_ok, const char *want_dt, int rank,
                    const int64_t *shape, k3_error *err) {
    char a[96], b[96];
    k3_shape_str(rank, shape, a, sizeof a);
    k3_shape_str(t->rank, t->shape, b, sizeof b);
    return k3_fail(err, dtype_ok ? K3_ERR_SHAPE : K3_ERR_DTYPE, "%s: expected %s %s, found %s %s", t->name, want_dt, a, tdt(t), b);
}

int k3_decode_plain(const k3_tview *t, unsigned allowed, int rank, const int64_t *shape,
                    k3_error *err) {
    if (!(allowed & (1u << t->dtype)) || !shape_is(t, rank, shape)) {
        char want[64] = "";
        for (int d = 1; d < K3_DTYPE_COUNT && d < 32; d++)
            if (allowed & (1u << d)) {
                if (want[0]) strncat(want, "|", sizeof want - strlen(want) - 1);
                strncat(want, k3_dtype_name((k3_dtype)d), sizeof want - strlen(want) - 1);
            }
        return mismatch(t, (allowed & (1u << t->dtype)) != 0, want, rank, shape, err);
    }
    return K3_OK;
}

int k3_decode_scalar(const k3_tview *t, float *out, k3_error *err) {
    bool one = t->rank == 0 || (t->rank == 1 && t->shape[0] == 1);
    float v = 0;
    if (t->dtype == K3_DTYPE_F32 && one && t->nbytes == 4) {
        if (t->data) memcpy(&v, t->data, 4);
    } else if ((t->dtype == K3_DTYPE_BF16 || t->dtype == K3_DTYPE_F16) && one && t->nbytes == 2) {
        uint16_t h = 0;
        if (t->data) memcpy(&h, t->data, 2);
        v = t->dtype == K3_DTYPE_BF16 ? k3_bf16_to_f32(h) : k3_f16_to_f32(h);
    } else {
        char b[96];
        return k3_fail(err, one ? K3_ERR_DTYPE : K3_ERR_SHAPE,
                       "%s: expected a scalar F32|BF16|F16 of shape [] or [1], found %s %s",
                       t->name, tdt(t), k3_shape_str(t->rank, t->shape, b, sizeof b));
    }
    if (!t->data) {
        *out = 0;
        return K3_OK;
    }
    if (!(isfinite(v) && v > 0))
        return k3_fail(err, K3_ERR_NUMERIC, "%s: expected a finite global scale > 0, found %g",
                       t->name, (double)v);
    *out = v;
    return K3_OK;
}

typedef struct ctx_t {
    const char *module;
    k3_tview_find_fn find;
    void *ctx;
    void (*mark)(void *ctx, const char *name);
    bool inferred; /* the scheme came from the tensors, not a declaration (messages say so) */
} dctx;

/* The module's tensor with this suffix, or NULL. */
static const k3_tview *look(const dctx *c, const char *suffix) {
    char name[512];
    if (snprintf(name, sizeof name, "%s.%s", c->module, suffix) >= (int)sizeof name) return NULL;
    return c->find(c->ctx, name);
}

/* look, marking what is found as consumed (the decoder's strays check relies on it). */
static const k3_tview *get(const dctx *c, const char *suffix) {
    const k3_tview *t = look(c, suffix);
    if (t && c->mark) c->mark(c->ctx, t->name);
    return t;
}

static const k3_tview *need(const dctx *c, const char *suffix, k3_qscheme decl, k3_error *err) {
    const k3_tview *t = get(c, suffix);
    if (!t && c->inferred)
        k3_fail(err, K3_ERR_MISSING,
                "%s.%s: missing (the other tensors of %s make it %s, which has one)", c->module,
                suffix, c->module, k3_qscheme_name(decl));
    else if (!t)
        k3_fail(err, K3_ERR_MISSING, "%s.%s: missing (required by the %s declaration)", c->module,
                suffix, k3_qscheme_name(decl));
    return t;
}

/* Block scales encoded in one byte: E4M3 0x7F/0xFF and E8M0 0xFF are NaN. An E4M3 block
 * scale is amax / 6 / global: a negative one (sign bit with a nonzero magnitude) is no
 * producer's output and would flip the block's signs. */
static int check_byte_scales(const k3_tview *t, bool e8m0, k3_error *err) {
    const uint8_t *s = t->data;
    for (uint64_t i = 0; s && i < t->nbytes; i++) {
        bool nan = e8m0 ? s[i] == 0xFF : (s[i] & 0x7F) == 0x7F;
        if (nan)
            return k3_fail(err, K3_ERR_NUMERIC, "%s: NaN block scale 0x%02X at element %llu",
                           t->name, s[i], (unsigned long long)i);
        if (!e8m0 && (s[i] & 0x80) && (s[i] & 0x7F))
            return k3_fail(err, K3_ERR_NUMERIC, "%s: negative block scale 0x%02X at element %llu",
                           t->name, s[i], (unsigned long long)i);
    }
    return K3_OK;
}

/* Fails on a present sibling of module outside the format's set `own` (bits of k3_qsuffix). */
static int strays(const dctx *c, unsigned own, const char *what, k3_error *err) {
    for (int s = 0; s < K3_N_QSUFFIX; s++) {
        if (own & (1u << s)) continue;
        char name[512];
        snprintf(name, sizeof name, "%s.%s", c->module, k3_qsuffix[s]);
        const k3_tview *t = c->find(c->ctx, name);
        if (!t) continue;
        char list[160] = "";
        for (int o = 0; o < K3_N_QSUFFIX; o++)
            if (own & (1u << o)) {
                if (list[0]) strncat(list, ", ", sizeof list - strlen(list) - 1);
                strncat(list, k3_qsuffix[o], sizeof list - strlen(list) - 1);
            }
        return k3_fail(err, K3_ERR_FORMAT, "%s: unexpected beside a %s weight (which has %s only)",
                       t->name, what, list);
    }
    return K3_OK;
}

#define SFX(x) (1u << K3_SFX_##x)

static int decode_nvfp4(const dctx *c, k3_qscheme decl, const k3_tview *w, int64_t rows,
                        int64_t cols, k3_qmat *out, k3_error *err) {
    if (cols % 16)
        return k3_fail(err, K3_ERR_SHAPE, "%s: NVFP4 needs in_features %% 16 == 0, found %lld",
                       w->name, (long long)cols);
    int64_t ws[2] = {rows, cols / 2}, ss[2] = {rows, cols / 16};
    int rc = k3_decode_plain(w, 1u << K3_DTYPE_U8, 2, ws, err);
    if (rc) return rc;
    const k3_tview *s = need(c, "weight_scale", decl, err);
    if (!s) return err ? err->status : K3_ERR_MISSING;
    if ((rc = k3_decode_plain(s, 1u << K3_DTYPE_F8_E4M3, 2, ss, err))) return rc;
    if ((rc = check_byte_scales(s, false, err))) return rc;
    bool ct = decl == K3_QS_NVFP4_CT;
    const k3_tview *g = need(c, ct ? "weight_global_scale" : "weight_scale_2", decl, err);
    if (!g) return err ? err->status : K3_ERR_MISSING;
    float gv, iv = 0;
    if ((rc = k3_decode_scalar(g, &gv, err))) return rc;
    const k3_tview *in = get(c, ct ? "input_global_scale" : "input_scale");
    if (in && (rc = k3_decode_scalar(in, &iv, err))) return rc;
    if (ct && g->data) {
        gv = 1.0f / gv;
        if (in) iv = 1.0f / iv;
        if (!(isfinite(gv) && gv > 0) || !(isfinite(iv) && iv >= 0))
            return k3_fail(err, K3_ERR_NUMERIC, "%s: global scale reciprocal is not finite",
                           !(isfinite(gv) && gv > 0) ? g->name : in->name);
    }
    *out = (k3_qmat){.fmt = K3_WFMT_NVFP4, .rows = rows, .cols = cols, .data = w->data,
                     .scale = s->data, .global_scale = gv, .input_scale = iv};
    return ct ? strays(c, SFX(WEIGHT_PACKED) | SFX(WEIGHT_SCALE) | SFX(WEIGHT_GLOBAL_SCALE) |
                              SFX(INPUT_GLOBAL_SCALE), "compressed-tensors NVFP4", err)
              : strays(c, SFX(WEIGHT) | SFX(WEIGHT_SCALE) | SFX(WEIGHT_SCALE_2) | SFX(INPUT_SCALE),
                       "ModelOpt NVFP4", err);
}

static int decode_mxfp4(const dctx *c, const k3_tview *w, int64_t rows, int64_t cols,
                        k3_qmat *out, k3_error *err) {
    if (cols % 32)
        return k3_fail(err, K3_ERR_SHAPE, "%s: MXFP4 needs in_features %% 32 == 0, found %lld",
                       w->name, (long long)cols);
    int64_t ws[2] = {rows, cols / 2}, ss[2] = {rows, cols / 32};
    int rc = k3_decode_plain(w, 1u << K3_DTYPE_U8, 2, ws, err);
    if (rc) return rc;
    const k3_tview *s = need(c, "weight_scale", K3_QS_MXFP4, err);
    if (!s) return err ? err->status : K3_ERR_MISSING;
    if ((rc = k3_decode_plain(s, (1u << K3_DTYPE_U8) | (1u << K3_DTYPE_F8_E8M0), 2, ss, err)))
        return rc;
    if ((rc = check_byte_scales(s, true, err))) return rc;
    /* ModelOpt's W4A8_MXFP4_FP8 adds the static FP8 activation scale */
    float iv = 0;
    const k3_tview *in = get(c, "input_scale");
    if (in && (rc = k3_decode_scalar(in, &iv, err))) return rc;
    *out = (k3_qmat){.fmt = K3_WFMT_MXFP4, .rows = rows, .cols = cols, .data = w->data,
                     .scale = s->data, .global_scale = 1.0f, .input_scale = iv};
    return strays(c, SFX(WEIGHT) | SFX(WEIGHT_PACKED) | SFX(WEIGHT_SCALE) | SFX(INPUT_SCALE), "MXFP4",
                  err);
}

/* §8.2 item 6: an E4M3 weight is never plain, so one without a scale is an error. */
static int fp8_no_scale(const dctx *c, const k3_tview *w, k3_error *err) {
    return k3_fail(err, K3_ERR_MISSING,
                   "%s: F8_E4M3 weight without its scale (%s.weight_scale or .weight_scale_inv)",
                   w->name, c->module);
}

static int decode_fp8(const dctx *c, const k3_tview *w, int64_t rows, int64_t cols,
                      k3_qmat *out, k3_error *err) {
    int64_t ws[2] = {rows, cols};
    int rc = k3_decode_plain(w, 1u << K3_DTYPE_F8_E4M3, 2, ws, err);
    if (rc) return rc;
    const k3_tview *s1 = get(c, "weight_scale"), *s2 = get(c, "weight_scale_inv");
    if (s1 && s2)
        return k3_fail(err, K3_ERR_DUPLICATE,
                       "%s: both weight_scale and weight_scale_inv present; expected one", w->name);
    const k3_tview *s = s1 ? s1 : s2;
    if (!s) return fp8_no_scale(c, w, err);
    int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
    int64_t s2d[2] = {br, bc}, s4d[4] = {br, 1, bc, 1};
    if (s->dtype != K3_DTYPE_F32 || !(shape_is(s, 2, s2d) || shape_is(s, 4, s4d)))
        return mismatch(s, s->dtype == K3_DTYPE_F32, "F32", s->rank == 4 ? 4 : 2, s->rank == 4 ? s4d : s2d, err);
    const float *sv = s->data;
    for (int64_t i = 0; sv && i < br * bc; i++) {
        float v;
        memcpy(&v, sv + i, 4);
        /* amax / 448: zero for an all-zero block, never negative */
        if (!isfinite(v) || v < 0)
            return k3_fail(err, K3_ERR_NUMERIC, "%s: %s block scale %g at block (%lld,%lld)",
                           s->name, v < 0 ? "negative" : "non-finite", (double)v,
                           (long long)(i / bc), (long long)(i % bc));
    }
    *out = (k3_qmat){.fmt = K3_WFMT_FP8_BLOCK, .rows = rows, .cols = cols, .data = w->data,
                     .scale = s->data, .global_scale = 1.0f};
    return strays(c, SFX(WEIGHT) | SFX(WEIGHT_SCALE) | SFX(WEIGHT_SCALE_INV), "FP8 block", err);
}

static int decode(const dctx *cp, k3_qscheme decl, bool plain_ok, int64_t rows, int64_t cols,
                  k3_qmat *out, k3_error *err) {
    const dctx c = *cp;
    const char *module = c.module;
    if (decl == K3_QS_OTHER || decl < 0 || decl >= K3_QS_COUNT)
        return k3_fail(err, K3_ERR_UNSUPPORTED, "%s: declared with a quantization k3 does not "
                       "decode", module);
    if (rows < 1 || cols < 1)
        return k3_fail(err, K3_ERR_SHAPE, "%s: expected a positive shape, found [%lld,%lld]",
                       module, (long long)rows, (long long)cols);
    bool packed_name = decl == K3_QS_NVFP4_CT || decl == K3_QS_MXFP4;
    const k3_tview *w = get(&c, packed_name ? "weight_packed" : "weight");
    if (!w) {
        const k3_tview *other = get(&c, packed_name ? "weight" : "weight_packed");
        bool plain = other && (other->dtype == K3_DTYPE_BF16 || other->dtype == K3_DTYPE_F16 ||
                               other->dtype == K3_DTYPE_F32);
        /* compressed-tensors keeps the plain name for a module its class target leaves
         * unquantized */
        if (packed_name && plain && plain_ok) w = other;
        /* ModelOpt names an MXFP4 weight `weight` (W4A8_MXFP4_FP8); the dtype says which */
        else if (decl == K3_QS_MXFP4 && other && other->dtype == K3_DTYPE_U8) w = other;
        else if (other)
            return k3_fail(err, K3_ERR_FORMAT, "%s: found, but the %s declaration stores %s.%s",
                           other->name, k3_qscheme_name(decl), module,
                           packed_name ? "weight_packed" : "weight");
        else
            return k3_fail(err, K3_ERR_MISSING, "%s.%s: missing", module,
                           packed_name ? "weight_packed" : "weight");
    }
    int64_t shape[2] = {rows, cols};
    switch (w->dtype) {
    case K3_DTYPE_BF16:
    case K3_DTYPE_F16:
    case K3_DTYPE_F32:
        /* A plain weight decodes unambiguously; it is accepted where nothing or FP8 blocks are
         * declared (TensorRT-LLM keeps e.g. b_proj BF16 under an FP8 declaration). A 4-bit
         * declaration with a plain weight is an inconsistent checkpoint. */
        if (decl != K3_QS_NONE && decl != K3_QS_FP8_BLOCK && !plain_ok)
            return k3_fail(err, K3_ERR_DTYPE, "%s: expected U8 (declared %s), found %s", w->name,
                           k3_qscheme_name(decl), tdt(w));
        if (get(&c, "weight_scale") || get(&c, "weight_scale_inv"))
            return k3_fail(err, K3_ERR_FORMAT, "%s: a %s weight with a block-scale sibling",
                           w->name, tdt(w));
        {
            int rc = k3_decode_plain(w, 1u << w->dtype, 2, shape, err);
            if (!rc) rc = strays(&c, SFX(WEIGHT) | SFX(WEIGHT_PACKED), tdt(w), err);
            if (rc) return rc;
        }
        *out = (k3_qmat){.fmt = w->dtype == K3_DTYPE_BF16  ? K3_WFMT_BF16
                                : w->dtype == K3_DTYPE_F16 ? K3_WFMT_F16
                                                         : K3_WFMT_F32,
                         .rows = rows, .cols = cols, .data = w->data, .global_scale = 1.0f};
        return K3_OK;
    case K3_DTYPE_F8_E4M3:
        if (decl == K3_QS_FP8_BLOCK) return decode_fp8(&c, w, rows, cols, out, err);
        if (decl == K3_QS_NONE) {
            if (!get(&c, "weight_scale") && !get(&c, "weight_scale_inv"))
                return fp8_no_scale(&c, w, err);
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: quantized tensor (F8_E4M3 + block scale) that no quantization "
                           "declaration owns", w->name);
        }
        return k3_fail(err, K3_ERR_DTYPE, "%s: expected U8 (declared %s), found F8_E4M3", w->name,
                       k3_qscheme_name(decl));
    case K3_DTYPE_U8:
        if (decl == K3_QS_NVFP4 || decl == K3_QS_NVFP4_CT)
            return decode_nvfp4(&c, decl, w, rows, cols, out, err);
        if (decl == K3_QS_MXFP4) return decode_mxfp4(&c, w, rows, cols, out, err);
        if (decl == K3_QS_NONE)
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: quantized tensor (U8 packed) that no quantization declaration owns",
                           w->name);
        return k3_fail(err, K3_ERR_DTYPE, "%s: expected F8_E4M3 (declared %s), found U8", w->name,
                       k3_qscheme_name(decl));
    default:
        break;
    }
    return k3_fail(err, K3_ERR_DTYPE, "%s: dtype %s is not a weight format k3 reads", w->name,
                   tdt(w));
}

int k3_decode_linear(const char *module, k3_qscheme decl, bool plain_ok, int64_t rows, int64_t cols,
                     k3_tview_find_fn find, void *ctx, void (*mark)(void *, const char *),
                     k3_qmat *out, k3_error *err) {
    dctx c = {module, find, ctx, mark, false};
    return decode(&c, decl, plain_ok, rows, cols, out, err);
}

static bool is_plain(k3_dtype d) {
    return d == K3_DTYPE_BF16 || d == K3_DTYPE_F16 || d == K3_DTYPE_F32;
}

static bool is_e8m0(k3_dtype d) { return d == K3_DTYPE_U8 || d == K3_DTYPE_F8_E8M0; }

/* Looked up without marking: inference only looks, the decoder marks what it consumes. */
static const k3_tview *peek(const dctx *c, int sfx) { return look(c, k3_qsuffix[sfx]); }

static k3_qscheme infer(const dctx *c) {
    const k3_tview *w = peek(c, K3_SFX_WEIGHT), *p = peek(c, K3_SFX_WEIGHT_PACKED);
    const k3_tview *s = peek(c, K3_SFX_WEIGHT_SCALE);
    bool globals = peek(c, K3_SFX_WEIGHT_GLOBAL_SCALE) || peek(c, K3_SFX_INPUT_GLOBAL_SCALE);
    /* a block scale that is not an E8M0 byte can only be NVFP4's (E4M3); a wrong dtype there is
     * then reported against NVFP4's rule */
    bool nv_scale = s && !is_e8m0(s->dtype);
    if (p) /* compressed-tensors' name: its NVFP4 has global scales, its MXFP4 none */
        return globals || nv_scale ? K3_QS_NVFP4_CT : K3_QS_MXFP4;
    if (!w) return K3_QS_NONE;
    if (w->dtype == K3_DTYPE_F8_E4M3) return K3_QS_FP8_BLOCK;
    if (w->dtype != K3_DTYPE_U8) return K3_QS_NONE;
    /* ModelOpt's names: NVFP4 has weight_scale_2, its W4A8_MXFP4_FP8 an E8M0 weight_scale */
    if (peek(c, K3_SFX_WEIGHT_SCALE_2) || globals || nv_scale) return K3_QS_NVFP4;
    if (s) return K3_QS_MXFP4;
    return peek(c, K3_SFX_INPUT_SCALE) ? K3_QS_NVFP4 : K3_QS_NONE;
}

k3_qscheme k3_decode_infer(const char *module, k3_tview_find_fn find, void *ctx) {
    dctx c = {module, find, ctx, NULL, true};
    return infer(&c);
}

/* The first present sibling of c's weight (any suffix but weight / weight_packed), or NULL. */
static const k3_tview *any_scale(const dctx *c) {
    for (int s = K3_SFX_WEIGHT_SCALE; s < K3_N_QSUFFIX; s++) {
        const k3_tview *t = peek(c, s);
        if (t) return t;
    }
    return NULL;
}

static int undeclared(const dctx *c, int64_t rows, int64_t cols, k3_qmat *out, k3_error *err) {
    k3_qscheme sc = infer(c);
    const k3_tview *w = peek(c, K3_SFX_WEIGHT);
    if (sc == K3_QS_NONE && w && !is_plain(w->dtype)) {
        const k3_tview *x = any_scale(c);
        if (x)
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: %s weight beside %s: no format k3 reads stores %s weights",
                           w->name, tdt(w), x->name, tdt(w));
        bool u8 = w->dtype == K3_DTYPE_U8;
        return k3_fail(err, u8 ? K3_ERR_MISSING : K3_ERR_DTYPE, "%s: %s weight without scales (%s)",
                       w->name, tdt(w),
                       u8 ? "a packed 4-bit weight has a .weight_scale beside it"
                          : "not a weight format k3 reads");
    }
    return decode(c, sc, false, rows, cols, out, err);
}

int k3_decode_linear_undeclared(const char *module, int64_t rows, int64_t cols,
                                k3_tview_find_fn find, void *ctx,
                                void (*mark)(void *ctx, const char *name), k3_qmat *out,
                                k3_error *err) {
    dctx c = {module, find, ctx, mark, true};
    return undeclared(&c, rows, cols, out, err);
}

/* MXFP8 (E4M3 elements, E8M0 scale per 32; ModelOpt's export, §6.1): k3 does not decode it,
 * inspect still checks its set. */
static int check_mxfp8(const dctx *c, const k3_tview *w, const k3_tview *s, k3_error *err) {
    int64_t rows = w->shape[0], cols = w->shape[1];
    if (cols % 32)
        return k3_fail(err, K3_ERR_SHAPE, "%s: MXFP8 needs in_features %% 32 == 0, found %lld",
                       w->name, (long long)cols);
    int64_t ss[2] = {rows, cols / 32};
    int rc = k3_decode_plain(s, (1u << K3_DTYPE_U8) | (1u << K3_DTYPE_F8_E8M0), 2, ss, err);
    return rc ? rc : strays(c, SFX(WEIGHT) | SFX(WEIGHT_SCALE), "MXFP8", err);
}

int k3_decode_classify(const char *module, k3_tview_find_fn find, void *ctx, const char **fmt,
                       k3_error *err) {
    static const char *const names[K3_QS_COUNT] = {
        [K3_QS_NONE] = "plain", [K3_QS_NVFP4] = "NVFP4", [K3_QS_NVFP4_CT] = "NVFP4-CT",
        [K3_QS_MXFP4] = "MXFP4", [K3_QS_FP8_BLOCK] = "FP8-block", [K3_QS_OTHER] = "plain"};
    dctx c = {module, find, ctx, NULL, true};
    const k3_tview *w = peek(&c, K3_SFX_WEIGHT), *p = peek(&c, K3_SFX_WEIGHT_PACKED);
    const k3_tview *s = peek(&c, K3_SFX_WEIGHT_SCALE), *wt = p ? p : w;
    k3_qscheme sc = infer(&c);
    *fmt = names[sc];
    if (!wt) return k3_fail(err, K3_ERR_MISSING, "%s.weight: missing", module);
    if (w && p)
        return k3_fail(err, K3_ERR_DUPLICATE, "%s: present twice, as .weight and .weight_packed",
                       module);
    /* a weight alone is what its dtype says (only a set of tensors claims a format), except
     * E4M3, which is never plain, whatever its shape */
    if (!any_scale(&c)) {
        if (wt->dtype == K3_DTYPE_F8_E4M3) return fp8_no_scale(&c, wt, err);
        *fmt = names[K3_QS_NONE];
        return K3_OK;
    }
    bool mx8 = wt->dtype == K3_DTYPE_F8_E4M3 && s && is_e8m0(s->dtype);
    if (mx8) *fmt = "MXFP8";
    char b[96];
    if (wt->rank != 2)
        return k3_fail(err, K3_ERR_SHAPE, "%s: expected a rank-2 [out, in] weight, found %s %s",
                       wt->name, tdt(wt), k3_shape_str(wt->rank, wt->shape, b, sizeof b));
    if (mx8) return check_mxfp8(&c, wt, s, err);
    /* packed: two E2M1 codes a byte along in */
    bool packed = wt->dtype == K3_DTYPE_U8 && sc != K3_QS_NONE;
    if (packed && wt->shape[1] > INT64_MAX / 2)
        return k3_fail(err, K3_ERR_SHAPE, "%s: %s: in_features overflow", wt->name,
                       k3_shape_str(wt->rank, wt->shape, b, sizeof b));
    k3_qmat q;
    return undeclared(&c, wt->shape[0], packed ? 2 * wt->shape[1] : wt->shape[1], &q, err);
}
