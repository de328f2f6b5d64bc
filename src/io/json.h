/* JSON through Debian's cJSON, made strict for files k3 does not trust: the text must be
 * valid UTF-8, nesting and size are bounded, and duplicate keys in any object are rejected
 * (cJSON itself keeps both; a last-key-wins reader would disagree with a first-key-wins one,
 * the parser differential of checkpoint-formats.md §1.4). Helpers below read typed fields
 * and fail with a message naming the file and the field. */
#ifndef K3_JSON_H
#define K3_JSON_H

#include "base/base.h"
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define K3_JSON_MAX_DEPTH 64

/* Parses exactly len bytes (trailing JSON whitespace allowed, anything else rejected).
 * what names the source in messages (a path, or "safetensors header of PATH"). */
int k3_json_parse(cJSON **out, const char *text, size_t len, const char *what, k3_error *err);
/* Reads and parses a whole file (capped at max_bytes). */
int k3_json_parse_file(cJSON **out, const char *path, size_t max_bytes, k3_error *err);

bool k3_utf8_valid(const char *s, size_t len);

/* Exact non-negative integer of a JSON number (no fraction, <= 2^53): false otherwise. */
bool k3_json_u64(const cJSON *item, uint64_t *out);

/* Typed lookups: a missing key is `found == false` (not an error); a present key of the wrong
 * type is an error naming what.key. */
int k3_json_get_string(const cJSON *obj, const char *key, const char **out, bool *found,
                       const char *what, k3_error *err);
int k3_json_get_number(const cJSON *obj, const char *key, double *out, bool *found,
                       const char *what, k3_error *err);
int k3_json_get_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    bool *found, const char *what, k3_error *err);
int k3_json_get_bool(const cJSON *obj, const char *key, bool *out, bool *found, const char *what,
                     k3_error *err);

#endif
