/* libFuzzer target: the model.safetensors.index.json parser (k3_st_index_parse). An accepted
 * index must satisfy the invariants the checkpoint loader relies on: every shard name is a
 * plain file name and every entry points at a listed shard. */
#include "io/checkpoint.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    k3_st_index *ix;
    k3_error e;
    if (k3_st_index_parse(&ix, (const char *)data, size, "fuzz-index", &e) != K3_OK) {
        if (e.msg[0] == '\0')
            abort();
        return 0;
    }
    for (size_t i = 0; i < ix->n_shards; i++) {
        const char *s = ix->shards[i];
        if (!*s || strchr(s, '/') || !strcmp(s, "..") || !strcmp(s, "."))
            abort();
    }
    for (size_t i = 0; i < ix->n_entries; i++)
        if (ix->shard_of[i] >= ix->n_shards || !ix->names[i][0])
            abort();
    k3_st_index_free(ix);
    return 0;
}
