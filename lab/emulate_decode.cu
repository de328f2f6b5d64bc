/* Lab: host emulation of the weight layout and the fragment decode, no GPU needed. Packs
 * random NVFP4 and MXFP4 matrices with the upload code (moe_layout.cu, included), decodes
 * every lane's A-fragment registers the way decode_reg does (fp16 bit placement, times the
 * E4M3 scale, sign), and checks every element against direct dequantization, exactly.
 * Build: nvcc -std=c++17 -Isrc -Iinclude -gencode=arch=compute_90a,code=sm_90a lab/emulate_decode.cu
 *        src/cuda/device.cu src/cuda/moe_prefill.cu src/base/status.c src/moe/activation.c
 *        -o build/emu && build/emu */
#include "../src/cuda/moe_layout.cu"
#include <stdio.h>

static double half_bits(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}
static double e4m3d(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1 + m / 8.0, e - 7);
    return s ? -v : v;
}
static uint64_t st = 7;
static uint64_t rnd(void) {
    uint64_t z = (st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int main(void) {
    const int R = 32, K = 256, nk = K / 128;
    int bad = 0;
    for (int fmt = 0; fmt < 2; fmt++) {
        k3_qmat q = {};
        q.fmt = fmt == FMT_NV ? K3_WFMT_NVFP4 : K3_WFMT_MXFP4;
        q.rows = R;
        q.cols = K;
        uint8_t *d = (uint8_t *)malloc(R * K / 2), *s = (uint8_t *)malloc(R * K / 16);
        for (int i = 0; i < R * K / 2; i++) d[i] = (uint8_t)rnd();
        int nb = fmt == FMT_NV ? K / 16 : K / 32;
        for (int i = 0; i < R * nb; i++) s[i] = fmt == FMT_NV ? (uint8_t)(rnd() % 0x7F) : (uint8_t)(120 + rnd() % 12);
        q.data = d;
        q.scale = s;
        q.global_scale = 0.37f;
        float f;
        int sh;
        k3_error err = {};
        if (check_mat(&q, 0, 1, R, K, q.fmt, &f, &sh, &err)) { printf("check: %s\n", err.msg); return 1; }
        TileSrc ts = {&q, NULL, sh, 0, 0};
        int tiles = R / 16, SB = fmt == FMT_NV ? UNIT_S_NV : UNIT_S_MX;
        uint8_t *w = (uint8_t *)malloc(tiles * nk * UNIT_W), *sc = (uint8_t *)malloc(tiles * nk * SB);
        pack(&ts, tiles, nk, fmt, w, sc);
        for (int t = 0; t < tiles; t++)
            for (int c = 0; c < nk; c++)
                for (int lane = 0; lane < 32; lane++)
                    for (int ss = 0; ss < 8; ss++) {
                        const uint8_t *u = w + ((size_t)t * nk + c) * UNIT_W, *su = sc + ((size_t)t * nk + c) * SB;
                        uint32_t word;
                        memcpy(&word, u + (ss >> 2) * 512 + lane * 16 + (ss & 3) * 4, 4);
                        int g = lane >> 2, qq = lane & 3;
                        uint8_t p0, p1;
                        if (fmt == FMT_NV) p0 = su[g * 16 + 2 * ss], p1 = su[g * 16 + 2 * ss + 1];
                        else p0 = su[g * 8 + 2 * (ss >> 1)], p1 = su[g * 8 + 2 * (ss >> 1) + 1];
                        for (int i = 0; i < 4; i++) {
                            /* decode_reg's own bit moves; the fp16 product in double */
                            const uint32_t mag = decode_mul(word, i), sgn = decode_or(word, i);
                            double scl = e4m3d(i & 1 ? p1 : p0);
                            for (int hh = 0; hh < 2; hh++) {
                                double v = half_bits((uint16_t)(mag >> (16 * hh))) * scl;
                                if ((sgn >> (16 * hh)) & 0x8000) v = -v;
                                int row = t * 16 + g + 8 * (i & 1);
                                int k = c * 128 + 16 * ss + 2 * qq + 8 * (i >> 1) + hh;
                                int code = (d[row * K / 2 + k / 2] >> (4 * (k & 1))) & 15;
                                static const double ev[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
                                double ref = (code & 8 ? -1 : 1) * ev[code & 7] *
                                             (fmt == FMT_NV ? e4m3d(s[row * nb + k / 16]) * 0.37f
                                                            : ldexp(1.0, s[row * nb + k / 32] - 127));
                                if (v * (double)f != ref && bad++ < 10)
                                    printf("fmt %d row %d k %d: decoded %g, expected %g\n", fmt, row, k, v * f, ref);
                            }
                        }
                    }
    }
    printf("%s: %d mismatches\n", bad ? "FAIL" : "ok", bad);
    return bad != 0;
}
