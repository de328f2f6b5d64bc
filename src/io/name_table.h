/* A string -> index hash table for tensor names: open addressing with linear probing,
 * FNV-1a, grown at 50% load, so it scales to K3's ~500,000 tensors with no fixed capacity.
 * Keys are borrowed (the owner keeps the strings alive). No deletion: tables are built once
 * per file or checkpoint and then only read. */
#ifndef K3_NAME_TABLE_H
#define K3_NAME_TABLE_H

#include "base/base.h"
#include <stdbool.h>
#include <stddef.h>

typedef struct k3_name_table {
    size_t cap; /* power of two, or 0 */
    size_t count;
    const char **keys; /* borrowed */
    size_t *vals;
} k3_name_table;

/* Inserts key -> val. Returns K3_OK, K3_ERR_DUPLICATE (and *prev = existing value, if prev
 * is non-NULL) when the key is present, or K3_ERR_NOMEM. */
int k3_name_table_put(k3_name_table *t, const char *key, size_t val, size_t *prev);
bool k3_name_table_get(const k3_name_table *t, const char *key, size_t *val);
void k3_name_table_free(k3_name_table *t); /* NULL-safe; leaves an empty table */

#endif
