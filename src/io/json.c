/* Strict JSON on top of cJSON: UTF-8 check, depth bound and duplicate-key rejection. */
#include "io/json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool k3_utf8_valid(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n;
        unsigned min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 1, min = 0x80, c &= 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2, min = 0x800, c &= 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3, min = 0x10000, c &= 0x07;
        } else {
            return false;
        }
        if (len - i - 1 < n)
            return false;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
            c = (c << 6) | (s[i + k] & 0x3F);
        }
        /* overlong forms, surrogates and code points past U+10FFFF are not UTF-8 */
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
            return false;
        i += n + 1;
    }
    return true;
}

/* One walk over the tree: the depth bound, and per object a sort of its keys to find
 * duplicates in O(n log n) (a safetensors header object can hold 100k names). */
static int key_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int check_tree(const cJSON *node, int depth, const char *what, k3_error *err) {
    if (depth > K3_JSON_MAX_DEPTH)
        return k3_fail(err, K3_ERR_FORMAT, "%s: JSON nested deeper than %d levels", what,
                       K3_JSON_MAX_DEPTH);
    if (cJSON_IsObject(node)) {
        size_t n = 0;
        for (const cJSON *c = node->child; c; c = c->next)
            n++;
        if (n > 1) {
            const char **keys = malloc(n * sizeof *keys);
            if (!keys)
                return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", what);
            size_t i = 0;
            for (const cJSON *c = node->child; c; c = c->next)
                keys[i++] = c->string;
            qsort(keys, n, sizeof *keys, key_cmp);
            for (i = 1; i < n; i++)
                if (!strcmp(keys[i - 1], keys[i])) {
                    int rc = k3_fail(err, K3_ERR_DUPLICATE, "%s: duplicate JSON key \"%s\"", what,
                                     keys[i]);
                    free(keys);
                    return rc;
                }
            free(keys);
        }
    }
    if (cJSON_IsObject(node) || cJSON_IsArray(node))
        for (const cJSON *c = node->child; c; c = c->next) {
            int rc = check_tree(c, depth + 1, what, err);
            if (rc)
                return rc;
        }
    return K3_OK;
}

/* Before cJSON: an empty text, and nesting past the depth bound (cJSON stops at its own limit
 * of 1000 with a bare parse error that names no cause). Brackets inside strings do not count. */
static int shape_check(const char *h, size_t n, const char *what, k3_error *err) {
    int depth = 0;
    bool value = false, in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = h[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = false;
            continue;
        }
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') value = true;
        if (c == '"') in_str = true;
        else if ((c == '{' || c == '[') && ++depth > K3_JSON_MAX_DEPTH + 1)
            return k3_fail(err, K3_ERR_FORMAT, "%s: byte %zu: JSON nested deeper than %d levels",
                           what, i, K3_JSON_MAX_DEPTH);
        else if (c == '}' || c == ']') depth--;
    }
    if (!value) return k3_fail(err, K3_ERR_FORMAT, "%s: empty (no JSON value)", what);
    return K3_OK;
}

/* cJSON is lenient where JSON is not: it skips any byte <= 0x20 between tokens, accepts raw
 * control bytes inside strings and turns "\u0000" into a silently truncated C string. This
 * scan rejects those in the text cJSON accepted, so every k3 JSON input obeys the grammar. */
static int lex_check(const char *h, size_t n, const char *what, k3_error *err) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)h[i];
        if (c == '"') {
            for (i++; i < n && h[i] != '"'; i++) {
                unsigned char d = (unsigned char)h[i];
                if (d < 0x20)
                    return k3_fail(err, K3_ERR_FORMAT,
                                   "%s: byte %zu: raw control byte 0x%02x inside a JSON string",
                                   what, i, d);
                if (d == '\\') {
                    if (i + 5 < n && h[i + 1] == 'u' && !memcmp(h + i + 2, "0000", 4))
                        return k3_fail(err, K3_ERR_FORMAT,
                                       "%s: byte %zu: \\u0000 (NUL) inside a JSON string", what, i);
                    i++; /* an escaped quote does not end the string */
                }
            }
            i++;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || strchr("{}[]:,+-.", c) ||
                   (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == 'E') {
            i++; /* whitespace, structure, numbers and the literals true/false/null */
        } else {
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: byte %zu: byte 0x%02x is not allowed outside a JSON string", what,
                           i, c);
        }
    }
    return K3_OK;
}

int k3_json_parse(cJSON **out, const char *text, size_t len, const char *what, k3_error *err) {
    *out = NULL;
    if (!k3_utf8_valid(text, len))
        return k3_fail(err, K3_ERR_FORMAT, "%s: not valid UTF-8", what);
    if (memchr(text, '\0', len))
        return k3_fail(err, K3_ERR_FORMAT, "%s: NUL byte inside JSON text", what);
    int rc = shape_check(text, len, what, err);
    if (rc) return rc;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = (at && at >= text && at <= text + len) ? (size_t)(at - text) : 0;
        return k3_fail(err, K3_ERR_FORMAT, "%s: invalid JSON near byte %zu", what, off);
    }
    for (const char *p = end; p && p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
            cJSON_Delete(root);
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: trailing bytes after the JSON value at byte %zu", what,
                           (size_t)(p - text));
        }
    rc = lex_check(text, len, what, err);
    if (!rc)
        rc = check_tree(root, 0, what, err);
    if (rc) {
        cJSON_Delete(root);
        return rc;
    }
    *out = root;
    return K3_OK;
}

int k3_json_parse_file(cJSON **out, const char *path, size_t max_bytes, k3_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return k3_fail(err, K3_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = malloc(max_bytes + 1);
    if (!buf) {
        fclose(f);
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t n = fread(buf, 1, max_bytes + 1, f);
    int rd_err = ferror(f);
    fclose(f);
    int rc;
    if (rd_err)
        rc = k3_fail(err, K3_ERR_IO, "%s: read error", path);
    else if (n > max_bytes)
        rc = k3_fail(err, K3_ERR_LIMIT, "%s: larger than %zu bytes", path, max_bytes);
    else
        rc = k3_json_parse(out, buf, n, path, err);
    free(buf);
    return rc;
}

bool k3_json_u64(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item))
        return false;
    double v = item->valuedouble;
    if (!isfinite(v) || v < 0 || v > 9007199254740992.0 || v != floor(v))
        return false;
    *out = (uint64_t)v;
    return true;
}

static const cJSON *lookup(const cJSON *obj, const char *key, bool *found) {
    const cJSON *it = cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (found)
        *found = it != NULL && !cJSON_IsNull(it);
    return (it && !cJSON_IsNull(it)) ? it : NULL;
}

int k3_json_get_string(const cJSON *obj, const char *key, const char **out, bool *found,
                       const char *what, k3_error *err) {
    const cJSON *it = lookup(obj, key, found);
    if (!it)
        return K3_OK;
    if (!cJSON_IsString(it))
        return k3_fail(err, K3_ERR_FORMAT, "%s: \"%s\" must be a string", what, key);
    *out = it->valuestring;
    return K3_OK;
}

int k3_json_get_number(const cJSON *obj, const char *key, double *out, bool *found,
                       const char *what, k3_error *err) {
    const cJSON *it = lookup(obj, key, found);
    if (!it)
        return K3_OK;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return k3_fail(err, K3_ERR_FORMAT, "%s: \"%s\" must be a finite number", what, key);
    *out = it->valuedouble;
    return K3_OK;
}

int k3_json_get_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    bool *found, const char *what, k3_error *err) {
    const cJSON *it = lookup(obj, key, found);
    if (!it)
        return K3_OK;
    double v = cJSON_IsNumber(it) ? it->valuedouble : NAN;
    if (!isfinite(v) || v != floor(v) || v < (double)lo || v > (double)hi)
        return k3_fail(err, K3_ERR_FORMAT, "%s: \"%s\" must be an integer in [%lld, %lld]", what,
                       key, (long long)lo, (long long)hi);
    *out = (int64_t)v;
    return K3_OK;
}

int k3_json_get_bool(const cJSON *obj, const char *key, bool *out, bool *found, const char *what,
                     k3_error *err) {
    const cJSON *it = lookup(obj, key, found);
    if (!it)
        return K3_OK;
    if (!cJSON_IsBool(it))
        return k3_fail(err, K3_ERR_FORMAT, "%s: \"%s\" must be true or false", what, key);
    *out = cJSON_IsTrue(it);
    return K3_OK;
}
