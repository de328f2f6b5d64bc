/* k3_fmt: runs one of k3's block quantizers on a raw little-endian float32 matrix so the
 * Python oracle (tests/py/test_formats_oracle.py) can compare the bytes with its own
 * implementation. Test helper only.
 *
 *   k3_fmt MODE IN ROWS COLS OUT [PARAM]
 *   MODE: nvfp4-w | nvfp4-w-gs (PARAM = weight_scale_2) | nvfp4-act (PARAM = g)
 *         | mxfp4 | mxfp8 | fp8-block
 * Writes OUT.data (codes/packed), OUT.scales (E4M3/E8M0 bytes or float32), OUT.global
 * (float32 weight_scale_2, nvfp4-w* only) and OUT.deq (float32 dequantized matrix).
 * Exit status 0 on success; 1 with k3's error message on stderr otherwise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/block.h"
#include "formats/fp.h"

static int write_file(const char *prefix, const char *ext, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%s", prefix, ext);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "k3_fmt: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: k3_fmt MODE IN ROWS COLS OUT [PARAM]\n");
        return 2;
    }
    const char *mode = argv[1];
    long long rows = atoll(argv[3]), cols = atoll(argv[4]);
    const char *out = argv[5];
    float param = argc > 6 ? strtof(argv[6], NULL) : 0.0f;
    if (rows <= 0 || cols <= 0 || rows > (1 << 20) || cols > (1 << 20)) {
        fprintf(stderr, "k3_fmt: bad shape\n");
        return 2;
    }
    size_t n = (size_t)rows * (size_t)cols;
    float *w = malloc(n * sizeof *w), *deq = malloc(n * sizeof *deq);
    uint8_t *data = malloc(n), *scales = malloc(n * 4 + 64);
    FILE *f = fopen(argv[2], "rb");
    if (!w || !deq || !data || !scales || !f || fread(w, sizeof *w, n, f) != n) {
        fprintf(stderr, "k3_fmt: cannot read %s\n", argv[2]);
        return 2;
    }
    fclose(f);
    for (size_t i = 0; i < n; i++)
        deq[i] = NAN; /* poison */
    k3_error err = {0};
    int rc = 0;
    size_t data_n = n, scale_n = 0;
    float ws2 = 0.0f;
    if (!strcmp(mode, "nvfp4-w") || !strcmp(mode, "nvfp4-w-gs")) {
        if (!strcmp(mode, "nvfp4-w"))
            rc = k3_nvfp4_quantize_weight(w, rows, cols, data, scales, &ws2, &err);
        else
            rc = k3_nvfp4_quantize_weight_gs(w, rows, cols, ws2 = param, data, scales, &err);
        data_n = n / 2, scale_n = n / 16;
        for (long long r = 0; rc == 0 && r < rows; r++)
            k3_nvfp4_dequantize_row(data + r * cols / 2, scales + r * cols / 16, cols, ws2,
                                    deq + r * cols);
    } else if (!strcmp(mode, "nvfp4-act")) {
        data_n = n / 2, scale_n = n / 16;
        for (long long r = 0; r < rows; r++) {
            k3_nvfp4_quantize_act_row(w + r * cols, cols, param, data + r * cols / 2,
                                      scales + r * cols / 16);
            /* dequant x ~ code * s / g: dequantize with weight_scale_2 = 1/g */
            k3_nvfp4_dequantize_row(data + r * cols / 2, scales + r * cols / 16, cols, 1.0f / param,
                                    deq + r * cols);
        }
    } else if (!strcmp(mode, "mxfp4")) {
        rc = k3_mxfp4_quantize(w, rows, cols, data, scales, &err);
        data_n = n / 2, scale_n = n / 32;
        for (long long r = 0; rc == 0 && r < rows; r++)
            k3_mxfp4_dequantize_row(data + r * cols / 2, scales + r * cols / 32, cols,
                                    deq + r * cols);
    } else if (!strcmp(mode, "mxfp8")) {
        scale_n = n / 32;
        for (long long r = 0; r < rows; r++) {
            k3_mxfp8_quantize_row(w + r * cols, cols, data + r * cols, scales + r * cols / 32);
            k3_mxfp8_dequantize_row(data + r * cols, scales + r * cols / 32, cols, deq + r * cols);
        }
    } else if (!strcmp(mode, "fp8-block")) {
        rc = k3_fp8_block_quantize(w, rows, cols, data, (float *)scales, &err);
        scale_n = (size_t)((rows + 127) / 128) * (size_t)((cols + 127) / 128) * 4;
        for (long long r = 0; rc == 0 && r < rows; r++)
            k3_fp8_block_dequantize_row(data, (const float *)scales, rows, cols, r, deq + r * cols);
    } else {
        fprintf(stderr, "k3_fmt: unknown mode %s\n", mode);
        return 2;
    }
    if (rc) {
        fprintf(stderr, "k3_fmt: %s: %s\n", k3_status_str(rc), err.msg);
        return 1;
    }
    int bad = write_file(out, "data", data, data_n) | write_file(out, "scales", scales, scale_n) |
              write_file(out, "deq", deq, n * sizeof *deq);
    if (!strncmp(mode, "nvfp4-w", 7))
        bad |= write_file(out, "global", &ws2, sizeof ws2);
    free(w), free(deq), free(data), free(scales);
    return bad;
}
