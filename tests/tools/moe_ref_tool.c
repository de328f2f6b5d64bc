/* Drives the float64 MoE reference for tests/py/test_moe_ref_oracle.py.
 *
 * usage: moe_ref_tool DIR
 * DIR/meta.txt: "E H I T K act fmt mode" (act = k3_act value, fmt = k3_wfmt value, mode =
 * k3_act_mode value). Raw little-endian arrays beside it: x.f32 [T,H], ids.i32 [T,K],
 * w.f32 [T,K], alpha.f32 [E], beta.f32 [E]; per matrix m in {w1, w3, w2}: m.data (E copies in
 * file layout), m.scale (E copies of block scales, NVFP4/MXFP4), m.gs.f32 [E] global_scale,
 * m.is.f32 [E] input_scale. Writes DIR/y.f64 [T,H]. Exit 0 on success, 2 on a library error
 * (message on stderr), 1 on bad files. */
#include "moe/moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *slurp(const char *dir, const char *name, size_t want) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "moe_ref_tool: cannot open %s\n", path);
        return NULL;
    }
    void *p = malloc(want ? want : 1);
    size_t got = p ? fread(p, 1, want, f) : 0;
    int extra = fgetc(f);
    fclose(f);
    if (!p || got != want || extra != EOF) {
        fprintf(stderr, "moe_ref_tool: %s: expected %zu bytes\n", path, want);
        free(p);
        return NULL;
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: moe_ref_tool DIR\n");
        return 1;
    }
    const char *dir = argv[1];
    char path[4096];
    snprintf(path, sizeof path, "%s/meta.txt", dir);
    FILE *mf = fopen(path, "r");
    int E, H, I, T, K, act, fmt, mode;
    if (!mf || fscanf(mf, "%d %d %d %d %d %d %d %d", &E, &H, &I, &T, &K, &act, &fmt, &mode) != 8) {
        fprintf(stderr, "moe_ref_tool: bad %s\n", path);
        return 1;
    }
    fclose(mf);
    size_t el = fmt == K3_WFMT_F32 ? 4 : fmt == K3_WFMT_BF16 ? 2 : 0;
    size_t mat = (size_t)H * (size_t)I, blk = fmt == K3_WFMT_NVFP4 ? 16 : 32;
    float *x = slurp(dir, "x.f32", (size_t)T * H * 4), *w = slurp(dir, "w.f32", (size_t)T * K * 4);
    int32_t *ids = slurp(dir, "ids.i32", (size_t)T * K * 4);
    float *alpha = slurp(dir, "alpha.f32", (size_t)E * 4),
          *beta = slurp(dir, "beta.f32", (size_t)E * 4);
    const char *names[3] = {"w1", "w3", "w2"};
    uint8_t *data[3], *scale[3] = {0};
    float *gs[3], *is[3];
    for (int m = 0; m < 3; m++) {
        char n[64];
        snprintf(n, sizeof n, "%s.data", names[m]);
        data[m] = slurp(dir, n, el ? mat * E * el : mat * E / 2);
        if (!el) {
            snprintf(n, sizeof n, "%s.scale", names[m]);
            scale[m] = slurp(dir, n, mat * E / blk);
            if (!scale[m])
                return 1;
        }
        snprintf(n, sizeof n, "%s.gs.f32", names[m]);
        gs[m] = slurp(dir, n, (size_t)E * 4);
        snprintf(n, sizeof n, "%s.is.f32", names[m]);
        is[m] = slurp(dir, n, (size_t)E * 4);
        if (!data[m] || !gs[m] || !is[m])
            return 1;
    }
    if (!x || !w || !ids || !alpha || !beta)
        return 1;
    k3_expert *ex = calloc((size_t)E, sizeof *ex);
    for (int e = 0; e < E; e++) {
        k3_qmat *q[3] = {&ex[e].w1, &ex[e].w3, &ex[e].w2};
        for (int m = 0; m < 3; m++) {
            size_t db = el ? mat * el : mat / 2;
            *q[m] = (k3_qmat){.fmt = (k3_wfmt)fmt,
                              .rows = m == 2 ? H : I,
                              .cols = m == 2 ? I : H,
                              .data = data[m] + db * e,
                              .scale = scale[m] ? scale[m] + mat / blk * e : NULL,
                              .global_scale = gs[m][e],
                              .input_scale = is[m][e]};
        }
    }
    k3_experts bank = {.n_experts = E,
                       .first_local = 0,
                       .n_local = E,
                       .hidden = H,
                       .inter = I,
                       .e = ex,
                       .act = {.act = (k3_act)act, .alpha = alpha, .beta = beta}};
    if (act != K3_ACT_SITU && act != K3_ACT_SWIGLU_BIAS)
        bank.act.alpha = bank.act.beta = NULL;
    double *y = malloc((size_t)T * H * sizeof *y + 1);
    k3_error err = {0};
    if (k3_moe_experts_ref(&bank, (k3_act_mode)mode, x, T, ids, w, K, y, &err)) {
        fprintf(stderr, "moe_ref_tool: %s: %s\n", k3_status_str(err.status), err.msg);
        return 2;
    }
    snprintf(path, sizeof path, "%s/y.f64", dir);
    FILE *o = fopen(path, "wb");
    if (!o || fwrite(y, sizeof *y, (size_t)T * H, o) != (size_t)T * H || fclose(o)) {
        fprintf(stderr, "moe_ref_tool: cannot write %s\n", path);
        return 1;
    }
    return 0;
}
