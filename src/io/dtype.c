/* The safetensors dtype table of include/k3.h: names and bit sizes (checkpoint-formats.md
 * §1.3, the reference's Dtype enum and bitsize). */
#include "k3.h"

#include <string.h>

static const struct {
    const char *name;
    unsigned bits;
} dtypes[K3_DTYPE_COUNT] = {
    [K3_DTYPE_INVALID] = {"INVALID", 0},
    [K3_DTYPE_BOOL] = {"BOOL", 8},
    [K3_DTYPE_F4] = {"F4", 4},
    [K3_DTYPE_F6_E2M3] = {"F6_E2M3", 6},
    [K3_DTYPE_F6_E3M2] = {"F6_E3M2", 6},
    [K3_DTYPE_U8] = {"U8", 8},
    [K3_DTYPE_I8] = {"I8", 8},
    [K3_DTYPE_F8_E5M2] = {"F8_E5M2", 8},
    [K3_DTYPE_F8_E4M3] = {"F8_E4M3", 8},
    [K3_DTYPE_F8_E8M0] = {"F8_E8M0", 8},
    [K3_DTYPE_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [K3_DTYPE_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [K3_DTYPE_I16] = {"I16", 16},
    [K3_DTYPE_U16] = {"U16", 16},
    [K3_DTYPE_F16] = {"F16", 16},
    [K3_DTYPE_BF16] = {"BF16", 16},
    [K3_DTYPE_I32] = {"I32", 32},
    [K3_DTYPE_U32] = {"U32", 32},
    [K3_DTYPE_F32] = {"F32", 32},
    [K3_DTYPE_C64] = {"C64", 64},
    [K3_DTYPE_F64] = {"F64", 64},
    [K3_DTYPE_I64] = {"I64", 64},
    [K3_DTYPE_U64] = {"U64", 64},
};

const char *k3_dtype_name(k3_dtype dtype) {
    if ((int)dtype <= K3_DTYPE_INVALID || (int)dtype >= K3_DTYPE_COUNT)
        return "INVALID";
    return dtypes[dtype].name;
}

k3_dtype k3_dtype_parse(const char *name) {
    if (!name)
        return K3_DTYPE_INVALID;
    for (int d = K3_DTYPE_INVALID + 1; d < K3_DTYPE_COUNT; d++)
        if (!strcmp(name, dtypes[d].name))
            return (k3_dtype)d;
    return K3_DTYPE_INVALID;
}

unsigned k3_dtype_bits(k3_dtype dtype) {
    if ((int)dtype <= K3_DTYPE_INVALID || (int)dtype >= K3_DTYPE_COUNT)
        return 0;
    return dtypes[dtype].bits;
}
