/* libFuzzer target: the safetensors header validator (k3_st_parse, the in-memory entry) and
 * everything a caller may do with a file it accepted (views, range reads, metadata).
 *
 * Each input is tried twice: as a whole file (8-byte length, header, data), and as
 * "header text NUL data" with the length prefix filled in, so that mutations reach the JSON
 * schema checks without having to keep the length field consistent. */
#include "io/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void exercise(const uint8_t *bytes, size_t len) {
    k3_st_file *f;
    k3_error e;
    if (k3_st_parse(&f, bytes, len, "fuzz", &e) != K3_OK) {
        if (e.msg[0] == '\0')
            abort(); /* every failure must say what is wrong */
        return;
    }
    for (size_t i = 0; i < k3_st_count(f); i++) {
        const k3_st_tensor *t = k3_st_at(f, i);
        if (k3_st_find(f, t->name) != t)
            abort();
        k3_st_view v;
        if (k3_st_view_get(f, t, 0, &v, &e) != K3_OK)
            abort();
        uint8_t sum = 0;
        for (uint64_t k = 0; k < v.nbytes; k++)
            sum ^= ((const uint8_t *)v.data)[k];
        k3_st_view_release(&v);
        uint8_t tail[4];
        uint64_t nb = k3_st_nbytes(t);
        if (nb >= 4 && k3_st_read_range(f, t, nb - 4, tail, 4, 0, &e) != K3_OK)
            abort();
        if (nb >= 4 && (tail[0] ^ tail[1] ^ tail[2] ^ tail[3] ^ sum) == 0x100)
            abort(); /* keeps sum live */
    }
    for (size_t i = 0; i < k3_st_metadata_count(f); i++) {
        const char *k, *v;
        if (!k3_st_metadata_at(f, i, &k, &v) || k3_st_metadata_get(f, k) != v)
            abort();
    }
    k3_st_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    exercise(data, size);
    if (size == 0)
        return 0; /* memchr on a NULL data pointer is undefined */
    const uint8_t *nul = memchr(data, 0, size);
    size_t hlen = nul ? (size_t)(nul - data) : size;
    size_t dlen = nul ? size - hlen - 1 : 0;
    uint8_t *buf = malloc(8 + hlen + dlen + 1);
    if (!buf)
        return 0;
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(buf + 8, data, hlen);
    if (dlen)
        memcpy(buf + 8 + hlen, nul + 1, dlen);
    exercise(buf, 8 + hlen + dlen);
    free(buf);
    return 0;
}
