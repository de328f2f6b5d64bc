/* The name table of name_table.h. */
#include "io/name_table.h"

#include <stdlib.h>
#include <string.h>

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return h;
}

static int grow(k3_name_table *t) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    const char **keys = calloc(cap, sizeof *keys);
    size_t *vals = malloc(cap * sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return K3_ERR_NOMEM;
    }
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->keys[i])
            continue;
        size_t j = fnv1a(t->keys[i]) & (cap - 1);
        while (keys[j])
            j = (j + 1) & (cap - 1);
        keys[j] = t->keys[i];
        vals[j] = t->vals[i];
    }
    free(t->keys);
    free(t->vals);
    t->keys = keys;
    t->vals = vals;
    t->cap = cap;
    return K3_OK;
}

int k3_name_table_put(k3_name_table *t, const char *key, size_t val, size_t *prev) {
    if ((t->count + 1) * 2 > t->cap) {
        int rc = grow(t);
        if (rc)
            return rc;
    }
    size_t j = fnv1a(key) & (t->cap - 1);
    while (t->keys[j]) {
        if (!strcmp(t->keys[j], key)) {
            if (prev)
                *prev = t->vals[j];
            return K3_ERR_DUPLICATE;
        }
        j = (j + 1) & (t->cap - 1);
    }
    t->keys[j] = key;
    t->vals[j] = val;
    t->count++;
    return K3_OK;
}

bool k3_name_table_get(const k3_name_table *t, const char *key, size_t *val) {
    if (!t->cap)
        return false;
    size_t j = fnv1a(key) & (t->cap - 1);
    while (t->keys[j]) {
        if (!strcmp(t->keys[j], key)) {
            if (val)
                *val = t->vals[j];
            return true;
        }
        j = (j + 1) & (t->cap - 1);
    }
    return false;
}

void k3_name_table_free(k3_name_table *t) {
    if (!t)
        return;
    free(t->keys);
    free(t->vals);
    memset(t, 0, sizeof *t);
}
