/* Validation of a safetensors header (checkpoint-formats.md §1.4 and §8.2 items 2-4).
 *
 * Three passes over the header text. (1) The strict JSON layer: UTF-8, no NUL, bounded depth,
 * duplicate keys rejected, raw control bytes, \u0000 and stray bytes rejected, only JSON
 * whitespace after the value. (2) A scan of the numbers: cJSON reads them as doubles, so "3.0",
 * "1e2" and "01" would pass as integers (the scan rejects them), and integers above 2^53 would
 * be rounded (the scan keeps their exact value from the text). (3) The
 * schema: each entry is {"dtype", "shape", "data_offsets"} (unknown fields rejected), sizes
 * computed with checked arithmetic and compared to the offsets, then the offsets sorted and
 * walked to prove the data buffer is covered exactly. Messages name the file, the tensor and
 * the field. */
#include "io/json.h"
#include "io/st_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TWO_POW_53 9007199254740992ull

/* The plain integers above 2^53, by their ordinal among the header's numbers in document
 * order: cJSON holds every number as a double, which rounds these, and a shape entry may be any
 * uint64 (an empty tensor can carry one, §1.4). Real headers have none, so the table is
 * normally empty; ordinals are increasing, so lookups are a binary search. */
typedef struct bignums {
    struct bignum {
        size_t ord;
        uint64_t val;
    } *v;
    size_t n, cap;
} bignums;

static bool big_put(bignums *b, size_t ord, uint64_t v) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 16;
        struct bignum *x = realloc(b->v, cap * sizeof *x);
        if (!x)
            return false;
        b->v = x;
        b->cap = cap;
    }
    b->v[b->n++] = (struct bignum){ord, v};
    return true;
}

static bool big_get(const bignums *b, size_t ord, uint64_t *v) {
    size_t lo = 0, hi = b->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (b->v[mid].ord == ord) {
            *v = b->v[mid].val;
            return true;
        }
        if (b->v[mid].ord < ord)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

/* Pass 2. k3_json_parse already rejected the grammar cJSON is lenient about (control bytes,
 * \u0000, stray bytes); what remains is that cJSON reads every number as a double. Numbers
 * that are not plain integers below 2^64 are only recorded (at *bad_num): the schema pass
 * reports negative, fractional and huge values with the tensor and field named, and this record
 * catches the spellings that survive it ("3.0", "1e2", "01"). Plain integers above 2^53 go to
 * big. False when out of memory. */
static bool lex_numbers(const char *h, size_t n, bignums *big, size_t *bad_num, size_t *bad_len) {
    *bad_num = SIZE_MAX;
    size_t i = 0, ord = 0;
    while (i < n) {
        char c = h[i];
        if (c == '"') {
            for (i++; i < n && h[i] != '"'; i++)
                if (h[i] == '\\')
                    i++; /* an escaped quote does not end the string */
            i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t s = i;
            while (i < n && h[i] && strchr("+-.eE0123456789", h[i]))
                i++;
            bool plain = h[s] != '0' || i - s == 1;
            uint64_t v = 0;
            for (size_t k = s; plain && k < i; k++)
                plain = h[k] >= '0' && h[k] <= '9' && k3_mul_u64(v, 10, &v) &&
                        k3_add_u64(v, (uint64_t)(h[k] - '0'), &v);
            if (!plain && *bad_num == SIZE_MAX) {
                *bad_num = s;
                *bad_len = i - s;
            }
            if (plain && v > TWO_POW_53 && !big_put(big, ord, v))
                return false;
            ord++;
        } else {
            i++;
        }
    }
    return true;
}

/* The numbers inside v (v included), which is how far v moves the document-order ordinal. */
static size_t count_numbers(const cJSON *v) {
    size_t n = cJSON_IsNumber(v);
    for (const cJSON *c = v->child; c; c = c->next)
        n += count_numbers(c);
    return n;
}

static void fmt_shape(char *buf, size_t cap, int rank, const uint64_t *shape) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < rank && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%" PRIu64, i ? ", " : "", shape[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

static void describe(const cJSON *v, char *buf, size_t cap) {
    if (cJSON_IsNumber(v))
        snprintf(buf, cap, "%.17g", v->valuedouble);
    else if (cJSON_IsString(v))
        snprintf(buf, cap, "a string");
    else if (cJSON_IsBool(v))
        snprintf(buf, cap, "a boolean");
    else if (cJSON_IsNull(v))
        snprintf(buf, cap, "null");
    else if (cJSON_IsArray(v))
        snprintf(buf, cap, "an array");
    else
        snprintf(buf, cap, "an object");
}

/* A JSON array of at most max non-negative integers below 2^64 (field = "shape" or
 * "data_offsets"); ord: the document-order ordinal of the array's first number. */
static int u64_array(const char *path, const char *name, const char *field, const cJSON *a, int max,
                     const bignums *big, size_t ord, uint64_t *out, int *count, k3_error *err) {
    if (!cJSON_IsArray(a))
        return k3_fail(err, K3_ERR_FORMAT, "%s: tensor \"%s\": %s must be an array", path, name,
                       field);
    int k = 0;
    for (const cJSON *v = a->child; v; v = v->next, k++) {
        if (k == max)
            return k3_fail(err, max == K3_MAX_RANK ? K3_ERR_LIMIT : K3_ERR_FORMAT,
                           "%s: tensor \"%s\": %s has %d or more entries, at most %d allowed", path,
                           name, field, max + 1, max);
        /* earlier elements were numbers (else this returned), so this one is ord + k */
        bool big_one = cJSON_IsNumber(v) && big_get(big, ord + (size_t)k, &out[k]);
        if (!big_one && !k3_json_u64(v, &out[k])) {
            char d[64];
            describe(v, d, sizeof d);
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: tensor \"%s\": %s[%d] must be a non-negative integer below 2^64, "
                           "found %s",
                           path, name, field, k, d);
        }
    }
    *count = k;
    return K3_OK;
}

/* ord: the document-order ordinal of the entry's first number; advanced past the entry. */
static int parse_entry(const k3_st_file *f, const cJSON *e, const bignums *big, size_t *ord,
                       k3_st_tensor *t, k3_error *err) {
    const char *P = f->path, *name = e->string;
    size_t len = strlen(name);
    if (len == 0)
        return k3_fail(err, K3_ERR_FORMAT, "%s: a tensor has an empty name", P);
    if (len > K3_ST_MAX_NAME)
        return k3_fail(err, K3_ERR_LIMIT, "%s: tensor \"%.60s...\": name of %zu bytes exceeds %d",
                       P, name, len, K3_ST_MAX_NAME);
    if (!k3_utf8_valid(name, len))
        return k3_fail(err, K3_ERR_FORMAT, "%s: a tensor name is not valid UTF-8", P);
    if (!cJSON_IsObject(e))
        return k3_fail(err, K3_ERR_FORMAT, "%s: tensor \"%s\": entry must be a JSON object", P,
                       name);
    const cJSON *dt = NULL, *sh = NULL, *off = NULL;
    size_t sh_ord = 0, off_ord = 0;
    for (const cJSON *c = e->child; c; c = c->next) {
        if (!strcmp(c->string, "dtype"))
            dt = c;
        else if (!strcmp(c->string, "shape"))
            sh = c, sh_ord = *ord;
        else if (!strcmp(c->string, "data_offsets"))
            off = c, off_ord = *ord;
        else
            return k3_fail(err, K3_ERR_FORMAT, "%s: tensor \"%s\": unknown field \"%s\"", P, name,
                           c->string);
        *ord += count_numbers(c);
    }
    const char *miss = !dt ? "dtype" : !sh ? "shape" : !off ? "data_offsets" : NULL;
    if (miss)
        return k3_fail(err, K3_ERR_FORMAT, "%s: tensor \"%s\": missing field \"%s\"", P, name,
                       miss);
    if (!cJSON_IsString(dt))
        return k3_fail(err, K3_ERR_FORMAT, "%s: tensor \"%s\": dtype must be a string", P, name);
    t->dtype = k3_dtype_parse(dt->valuestring);
    if (t->dtype == K3_DTYPE_INVALID)
        return k3_fail(err, K3_ERR_DTYPE, "%s: tensor \"%s\": unknown dtype \"%.40s\"", P, name,
                       dt->valuestring);
    int rc = u64_array(P, name, "shape", sh, K3_MAX_RANK, big, sh_ord, t->shape, &t->rank, err);
    if (rc)
        return rc;
    uint64_t o[2];
    int no = 0;
    rc = u64_array(P, name, "data_offsets", off, 2, big, off_ord, o, &no, err);
    if (rc)
        return rc;
    if (no != 2)
        return k3_fail(err, K3_ERR_FORMAT, "%s: tensor \"%s\": data_offsets has %d entries, not 2",
                       P, name, no);
    t->begin = o[0];
    t->end = o[1];
    if (t->end < t->begin)
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                       "]: END before BEGIN",
                       P, name, t->begin, t->end);
    char shp[K3_MAX_RANK * 22 + 4];
    fmt_shape(shp, sizeof shp, t->rank, t->shape);
    /* multiplied in order with overflow checks, as the reference does: [2^63, 0] is an empty
     * tensor, [2^32, 2^32, 0] overflows before its zero (§1.4 item 6) */
    uint64_t numel = 1, bits;
    for (int i = 0; i < t->rank; i++)
        if (!k3_mul_u64(numel, t->shape[i], &numel))
            return k3_fail(err, K3_ERR_LIMIT,
                           "%s: tensor \"%s\": shape %s: element count overflows 64 bits", P, name,
                           shp);
    if (!k3_mul_u64(numel, k3_dtype_bits(t->dtype), &bits))
        return k3_fail(err, K3_ERR_LIMIT, "%s: tensor \"%s\": %s %s: bit count overflows 64 bits",
                       P, name, k3_dtype_name(t->dtype), shp);
    if (bits % 8)
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: tensor \"%s\": shape %s of %s is %" PRIu64
                       " bits, not a whole number of bytes",
                       P, name, shp, k3_dtype_name(t->dtype), bits);
    t->numel = numel;
    if (bits / 8 != t->end - t->begin)
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                       "] but %s %s needs %" PRIu64 " bytes",
                       P, name, t->begin, t->end, k3_dtype_name(t->dtype), shp, bits / 8);
    uint64_t data_len = f->size - f->data_start;
    if (t->end > data_len)
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                       "] run past the data "
                       "buffer of %" PRIu64 " bytes (file truncated?)",
                       P, name, t->begin, t->end, data_len);
    return K3_OK;
}

static int by_offset(const void *pa, const void *pb) {
    const k3_st_tensor *a = pa, *b = pb;
    if (a->begin != b->begin)
        return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end)
        return a->end < b->end ? -1 : 1;
    return strcmp(a->name, b->name);
}

static int by_key(const void *pa, const void *pb) {
    return strcmp(*(char *const *)pa, *(char *const *)pb);
}

static int parse_metadata(k3_st_file *f, const cJSON *m, k3_error *err) {
    if (!cJSON_IsObject(m))
        return k3_fail(err, K3_ERR_FORMAT, "%s: __metadata__ must be an object of strings",
                       f->path);
    size_t n = 0;
    for (const cJSON *c = m->child; c; c = c->next) {
        if (!cJSON_IsString(c))
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: __metadata__ \"%.200s\": value must be a string", f->path,
                           c->string);
        if (!k3_utf8_valid(c->string, strlen(c->string)) ||
            !k3_utf8_valid(c->valuestring, strlen(c->valuestring)))
            return k3_fail(err, K3_ERR_FORMAT, "%s: __metadata__: an entry is not valid UTF-8",
                           f->path);
        n++;
    }
    f->meta = calloc(2 * n + 1, sizeof *f->meta);
    if (!f->meta)
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory for __metadata__", f->path);
    for (const cJSON *c = m->child; c; c = c->next) {
        /* key and value in one allocation so the pair sorts as a unit */
        size_t kl = strlen(c->string), vl = strlen(c->valuestring);
        char *kv = malloc(kl + vl + 2);
        if (!kv)
            return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory for __metadata__", f->path);
        memcpy(kv, c->string, kl + 1);
        memcpy(kv + kl + 1, c->valuestring, vl + 1);
        f->meta[f->n_meta++] = kv;
    }
    qsort(f->meta, f->n_meta, sizeof *f->meta, by_key);
    for (size_t i = f->n_meta; i-- > 0;) { /* spread to [key, value] pairs, from the back */
        char *kv = f->meta[i];
        f->meta[2 * i] = kv;
        f->meta[2 * i + 1] = kv + strlen(kv) + 1;
    }
    return K3_OK;
}

static int parse_tree(k3_st_file *f, const cJSON *root, const bignums *big, k3_error *err) {
    if (!cJSON_IsObject(root))
        return k3_fail(err, K3_ERR_FORMAT, "%s: header is not a JSON object", f->path);
    size_t n = 0, name_bytes = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            int rc = parse_metadata(f, e, err);
            if (rc)
                return rc;
            continue;
        }
        n++;
        name_bytes += strlen(e->string) + 1;
    }
    f->t = calloc(n ? n : 1, sizeof *f->t);
    f->names = malloc(name_bytes ? name_bytes : 1);
    if (!f->t || !f->names)
        return k3_fail(err, K3_ERR_NOMEM, "%s: out of memory for %zu tensors", f->path, n);
    char *np = f->names;
    size_t ord = 0; /* __metadata__ holds strings only (checked above): no numbers to count */
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__"))
            continue;
        k3_st_tensor *t = &f->t[f->n];
        int rc = parse_entry(f, e, big, &ord, t, err);
        if (rc)
            return rc;
        size_t l = strlen(e->string) + 1;
        memcpy(np, e->string, l);
        t->name = np;
        np += l;
        f->n++;
    }
    qsort(f->t, f->n, sizeof *f->t, by_offset);
    uint64_t start = 0;
    const char *prev = NULL;
    for (size_t i = 0; i < f->n; i++) {
        const k3_st_tensor *t = &f->t[i];
        if (t->begin > start)
            return k3_fail(
                err, K3_ERR_FORMAT,
                "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] leave a gap: "
                "bytes [%" PRIu64 ", %" PRIu64 ") of the data buffer belong to no tensor",
                f->path, t->name, t->begin, t->end, start, t->begin);
        if (t->begin < start)
            return k3_fail(err, K3_ERR_FORMAT,
                           "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                           "] overlap tensor "
                           "\"%s\", which ends at %" PRIu64,
                           f->path, t->name, t->begin, t->end, prev, start);
        start = t->end;
        prev = t->name;
    }
    uint64_t data_len = f->size - f->data_start;
    if (start != data_len)
        return k3_fail(err, K3_ERR_FORMAT,
                       "%s: %" PRIu64 " trailing bytes: the data buffer is %" PRIu64 " bytes but "
                       "the tensors cover %" PRIu64,
                       f->path, data_len - start, data_len, start);
    for (size_t i = 0; i < f->n; i++) {
        size_t prev_i;
        int rc = k3_name_table_put(&f->by_name, f->t[i].name, i, &prev_i);
        if (rc == K3_ERR_DUPLICATE)
            return k3_fail(err, K3_ERR_DUPLICATE, "%s: tensor \"%s\" appears twice", f->path,
                           f->t[i].name);
        if (rc)
            return k3_fail(err, rc, "%s: out of memory for the name table", f->path);
    }
    return K3_OK;
}

int k3_st_parse_header(k3_st_file *f, const char *hdr, size_t len, k3_error *err) {
    char what[512];
    snprintf(what, sizeof what, "%s: header", f->path);
    /* leading JSON whitespace is allowed (the reference accepts it since PR #686); other bytes
     * <= 0x20, which cJSON would skip, are rejected by k3_json_parse */
    cJSON *root = NULL;
    int rc = k3_json_parse(&root, hdr, len, what, err);
    if (rc)
        return rc;
    size_t bad = SIZE_MAX, bad_len = 0;
    bignums big = {0};
    if (!lex_numbers(hdr, len, &big, &bad, &bad_len))
        rc = k3_fail(err, K3_ERR_NOMEM, "%s: out of memory for the header's numbers", f->path);
    else
        rc = parse_tree(f, root, &big, err);
    free(big.v);
    cJSON_Delete(root);
    if (!rc && bad != SIZE_MAX)
        rc = k3_fail(err, K3_ERR_FORMAT,
                     "%s: header byte %zu: number \"%.*s\" is not a plain non-negative integer "
                     "(no sign, fraction, exponent or leading zero; below 2^64)",
                     f->path, bad, (int)(bad_len > 40 ? 40 : bad_len), hdr + bad);
    return rc;
}
