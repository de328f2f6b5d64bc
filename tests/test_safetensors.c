/* safetensors reader, writer and checkpoint: a malformed-file corpus generated here (one case
 * per rule of checkpoint-formats.md §1.4 / §8.2, each expecting its own status and a message
 * naming the file, the tensor and the field), writer -> reader round trips over every dtype,
 * the zero-copy and copy view paths, streaming reads, sharded checkpoints with every index
 * rule, and a 100,000-tensor scaling case. Every case is checked through k3_st_parse (memory)
 * and, for header cases, through k3_st_open on a real file as well. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the four headers above first */
#include <cmocka.h>

#include "io/checkpoint.h"
#include "rm_tree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static int setup(void **state) {
    (void)state;
    strcpy(tmpdir, "/tmp/k3_st_test_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return rm_tree(tmpdir);
}

static char *tpath(const char *name) {
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static void put_le64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

/* 8-byte length n, then hlen header bytes, then dlen bytes of data (0, 1, 2, ...). */
static uint8_t *build(uint64_t n, const char *hdr, size_t hlen, size_t dlen, size_t *len) {
    *len = 8 + hlen + dlen;
    uint8_t *b = malloc(*len + 1);
    assert_non_null(b);
    put_le64(b, n);
    memcpy(b + 8, hdr, hlen);
    for (size_t i = 0; i < dlen; i++)
        b[8 + hlen + i] = (uint8_t)i;
    return b;
}

static void write_bytes(const char *path, const void *b, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static const char *cur_case = ""; /* names the table case in failure messages */

static void expect_msg(const k3_error *e, const char *m1, const char *m2) {
    if (m1 && !strstr(e->msg, m1))
        fail_msg("%s: message \"%s\" lacks \"%s\"", cur_case, e->msg, m1);
    if (m2 && !strstr(e->msg, m2))
        fail_msg("%s: message \"%s\" lacks \"%s\"", cur_case, e->msg, m2);
}

/* The same bytes through memory and through a file: same status, named messages. */
static void expect_bytes(const uint8_t *b, size_t len, int status, const char *m1, const char *m2) {
    k3_error e = {0};
    k3_st_file *f = (k3_st_file *)1;
    int rc = k3_st_parse(&f, b, len, "x.safetensors", &e);
    if (rc != status)
        fail_msg("%s: status %d (%s), expected %d; message: %s", cur_case, rc, k3_status_str(rc),
                 status, e.msg);
    if (status == K3_OK) {
        k3_st_close(f);
    } else {
        assert_null(f);
        assert_int_equal(e.status, status);
        expect_msg(&e, "x.safetensors: ", m1);
        expect_msg(&e, m2, NULL);
    }
    const char *p = tpath("case.safetensors");
    write_bytes(p, b, len);
    k3_error e2 = {0};
    rc = k3_st_open(&f, p, &e2);
    if (rc != status)
        fail_msg("%s: open: status %d, expected %d; message: %s", cur_case, rc, status, e2.msg);
    if (status == K3_OK)
        k3_st_close(f);
    else
        expect_msg(&e2, p, m1), expect_msg(&e2, m2, NULL);
}

static void expect_header(const char *hdr, size_t dlen, int status, const char *m1,
                          const char *m2) {
    size_t len;
    uint8_t *b = build(strlen(hdr), hdr, strlen(hdr), dlen, &len);
    expect_bytes(b, len, status, m1, m2);
    free(b);
}

/* ---- the length prefix (§1.4 steps 1-3) ----------------------------------------------- */

static void test_prefix_rules(void **state) {
    (void)state;
    uint8_t small[5] = {1, 0, 0, 0, 0};
    expect_bytes(small, sizeof small, K3_ERR_FORMAT, "shorter than the 8-byte", NULL);
    expect_bytes(small, 0, K3_ERR_FORMAT, "0 bytes", NULL);
    size_t len;
    uint8_t *b = build(100000001ull, "{}", 2, 0, &len);
    expect_bytes(b, len, K3_ERR_LIMIT, "header length 100000001 exceeds", NULL);
    free(b);
    b = build(UINT64_MAX, "{}", 2, 0, &len); /* 8 + N would overflow: the cap catches it first */
    expect_bytes(b, len, K3_ERR_LIMIT, "18446744073709551615", NULL);
    free(b);
    b = build(100, "{}", 2, 10, &len);
    expect_bytes(b, len, K3_ERR_FORMAT, "header length 100 runs past the end of the 20-byte file",
                 NULL);
    free(b);
    b = build(2, "{}", 2, 0, &len); /* the smallest valid file */
    expect_bytes(b, len, K3_OK, NULL, NULL);
    free(b);
}

/* ---- header cases: one per rule ------------------------------------------------------- */

typedef struct hcase {
    const char *header;
    size_t data_len;
    int status;
    const char *m1, *m2; /* substrings the message must hold (tensor and field) */
} hcase;

#define T(name, body) "\"" name "\":{" body "}"
static const hcase header_cases[] = {
    {"{\"a\xff\":{}}", 0, K3_ERR_FORMAT, "not valid UTF-8", NULL},
    {"{\"a\xc0\xaf\":{}}", 0, K3_ERR_FORMAT, "not valid UTF-8", NULL}, /* overlong '/' */
    {"{\"a\":", 0, K3_ERR_FORMAT, "invalid JSON", NULL},
    {"{} x", 0, K3_ERR_FORMAT, "trailing bytes after the JSON", NULL},
    {"{}\x01", 0, K3_ERR_FORMAT, "trailing bytes after the JSON", NULL},
    {"{\"a\":\x01{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, K3_ERR_FORMAT,
     "byte 0x01", NULL},
    {"\x0b{}", 0, K3_ERR_FORMAT, "byte 0x0b", NULL},
    {"{\"a\tb\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, K3_ERR_FORMAT,
     "control byte 0x09", NULL},
    {"{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, K3_ERR_FORMAT,
     "\\u0000", NULL},
    {"[]", 0, K3_ERR_FORMAT, "not a JSON object", NULL},
    /* a lone UTF-16 surrogate escape: cJSON refuses it, or the name fails the UTF-8 check */
    {"{\"a\\ud800\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, K3_ERR_FORMAT,
     NULL, NULL},
    {"{\"a\":{\"dtype\":\"U8\",\"shape\":[true],\"data_offsets\":[0,1]}}", 1, K3_ERR_FORMAT,
     "tensor \"a\"", "shape[0] must be a non-negative integer below 2^64, found a boolean"},
    {"{\"__metadata__\":{\"k\":1}}", 0, K3_ERR_FORMAT, "__metadata__ \"k\"", "must be a string"},
    {"{\"__metadata__\":{\"k\":null}}", 0, K3_ERR_FORMAT, "__metadata__ \"k\"", "must be a string"},
    {"{\"__metadata__\":[\"k\"]}", 0, K3_ERR_FORMAT, "__metadata__ must be an object", NULL},
    {"{" T("a.weight", "\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,4]") "}", 4,
     K3_ERR_DTYPE, "tensor \"a.weight\"", "unknown dtype \"F17\""},
    {"{" T("a.weight", "\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]") "}", 4,
     K3_ERR_DTYPE, "tensor \"a.weight\"", "unknown dtype \"f32\""},
    {"{" T("a.weight", "\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]") "}", 4, K3_ERR_FORMAT,
     "tensor \"a.weight\"", "dtype must be a string"},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]") "}", 4,
     K3_ERR_FORMAT, "tensor \"a.weight\"", "shape[0] must be a non-negative integer"},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":[1,2.5],\"data_offsets\":[0,4]") "}", 4,
     K3_ERR_FORMAT, "tensor \"a.weight\"",
     "shape[1] must be a non-negative integer below 2^64, found 2.5"},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]") "}", 4,
     K3_ERR_FORMAT, "tensor \"a.weight\"", "shape[0]"},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]") "}", 4,
     K3_ERR_FORMAT, "tensor \"a.weight\"",
     "shape[0] must be a non-negative integer below 2^64, found a string"},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]") "}", 4,
     K3_ERR_FORMAT, "number \"1.0\"", "not a plain non-negative integer"},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4e0]") "}", 4,
     K3_ERR_FORMAT, "number \"4e0\"", NULL},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]") "}", 4,
     K3_ERR_FORMAT, "number \"01\"", NULL},
    {"{" T("a.weight",
           "\"dtype\":\"U8\",\"shape\":[18446744073709551616,0],\"data_offsets\":[0,0]") "}",
     0, K3_ERR_FORMAT, "tensor \"a.weight\"", "shape[0] must be a non-negative integer below 2^64"},
    {"{" T("a.weight",
           "\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]") "}",
     0, K3_ERR_LIMIT, "tensor \"a.weight\"", "element count overflows"},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,4]") "}", 4,
     K3_ERR_FORMAT, "tensor \"a.weight\"", "shape must be an array"},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]") "}", 4,
     K3_ERR_FORMAT, "tensor \"a.weight\"", "data_offsets[0]"},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]") "}", 4,
     K3_ERR_FORMAT, "tensor \"a.weight\"", "data_offsets[1]"},
    {"{" T("a.weight",
           "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551616]") "}",
     4, K3_ERR_FORMAT, "tensor \"a.weight\"", "data_offsets[1]"},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]") "}", 4,
     K3_ERR_FORMAT, "tensor \"a.weight\"", "data_offsets has 3 or more entries"},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]") "}", 4,
     K3_ERR_FORMAT, "tensor \"a.weight\"", "data_offsets has 1 entries, not 2"},
    {"{" T("a.weight",
           "\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]") "}",
     4, K3_ERR_LIMIT, "tensor \"a.weight\"", "shape has 9 or more entries, at most 8"},
    {"{" T("a.weight",
           "\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,2],\"data_offsets\":[0,4]") "}",
     4, K3_ERR_LIMIT, "tensor \"a.weight\"", "element count overflows"},
    {"{" T("a.weight",
           "\"dtype\":\"F64\",\"shape\":[1125899906842624,1024],\"data_offsets\":[0,4]") "}",
     4, K3_ERR_LIMIT, "tensor \"a.weight\"", "bit count overflows"},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]") "}", 8,
     K3_ERR_FORMAT, "tensor \"a.weight\"", "data_offsets [8, 4]: END before BEGIN"},
    {"{" T("a.weight", "\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,10]") "}", 10,
     K3_ERR_FORMAT, "tensor \"a.weight\": data_offsets [0, 10] but F32 [3] needs 12 bytes", NULL},
    {"{" T("a.weight", "\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]") "}", 1,
     K3_ERR_FORMAT, "tensor \"a.weight\"", "F4 is 12 bits, not a whole number of bytes"},
    {"{" T("a.weight", "\"dtype\":\"F6_E2M3\",\"shape\":[2,3],\"data_offsets\":[0,4]") "}", 4,
     K3_ERR_FORMAT, "tensor \"a.weight\"", "36 bits"},
    {"{" T("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]") "," T(
         "b", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]") "}",
     12, K3_ERR_FORMAT, "tensor \"b\"", "gap: bytes [4, 8)"},
    {"{" T("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]") "," T(
         "b", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]") "}",
     12, K3_ERR_FORMAT, "tensor \"b\"", "overlap tensor \"a\", which ends at 8"},
    {"{" T("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]") "," T(
         "b", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]") "}",
     4, K3_ERR_FORMAT, "tensor \"b\"", "overlap tensor \"a\""},
    {"{" T("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]") "}", 8, K3_ERR_FORMAT,
     "4 trailing bytes", NULL},
    {"{" T("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]") "}", 8, K3_ERR_FORMAT,
     "tensor \"a\"", "gap: bytes [0, 4)"},
    {"{" T("a", "\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]") "}", 8, K3_ERR_FORMAT,
     "tensor \"a\"", "run past the data buffer of 8 bytes"},
    {"{" T("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]") "," T(
         "a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]") "}",
     8, K3_ERR_DUPLICATE, "duplicate JSON key \"a\"", NULL},
    {"{" T("a", "\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]") "}", 4,
     K3_ERR_DUPLICATE, "\"dtype\"", NULL},
    {"{" T("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"foo\":1") "}", 4,
     K3_ERR_FORMAT, "tensor \"a\"", "unknown field \"foo\""},
    {"{" T("a", "\"dtype\":\"F32\",\"shape\":[1]") "}", 4, K3_ERR_FORMAT, "tensor \"a\"",
     "missing field \"data_offsets\""},
    {"{\"a\":[1]}", 0, K3_ERR_FORMAT, "tensor \"a\"", "must be a JSON object"},
    {"{" T("", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]") "}", 1, K3_ERR_FORMAT,
     "empty name", NULL},
};
#undef T

static void test_header_rules(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof header_cases / sizeof header_cases[0]; i++) {
        const hcase *c = &header_cases[i];
        cur_case = c->header;
        expect_header(c->header, c->data_len, c->status, c->m1, c->m2);
    }
}

static void test_name_too_long(void **state) {
    (void)state;
    char *h = malloc(K3_ST_MAX_NAME + 200);
    int k = sprintf(h, "{\"");
    memset(h + k, 'n', K3_ST_MAX_NAME + 1);
    sprintf(h + k + K3_ST_MAX_NAME + 1,
            "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}");
    expect_header(h, 1, K3_ERR_LIMIT, "name of 1025 bytes exceeds 1024", "nnnn");
    free(h);
}

static void test_valid_headers(void **state) {
    (void)state;
    /* JSON whitespace on both sides (reference PR #686), scalars, empty tensors, sub-byte dtypes */
    expect_header(" \n\t\r{\"__metadata__\":{\"format\":\"pt\",\"k\":\"\xc3\xa9\"},"
                  "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                  "\"e\":{\"dtype\":\"BF16\",\"shape\":[0,7],\"data_offsets\":[4,4]},"
                  "\"f4\":{\"dtype\":\"F4\",\"shape\":[2,3],\"data_offsets\":[4,7]},"
                  "\"f6\":{\"dtype\":\"F6_E3M2\",\"shape\":[4],\"data_offsets\":[7,10]}}   \n",
                  10, K3_OK, NULL, NULL);
    const char *h = "{\"b\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[4,8]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"__metadata__\":{\"z\":\"1\",\"format\":\"pt\"}}";
    size_t len;
    uint8_t *b = build(strlen(h), h, strlen(h), 8, &len);
    k3_st_file *f;
    k3_error e = {0};
    assert_int_equal(k3_st_parse(&f, b, len, "m", &e), K3_OK);
    assert_int_equal(k3_st_count(f), 2);
    assert_string_equal(k3_st_at(f, 0)->name, "a"); /* data-offset order */
    assert_string_equal(k3_st_find(f, "b")->name, "b");
    assert_null(k3_st_find(f, "c"));
    assert_null(k3_st_at(f, 2));
    assert_int_equal(k3_st_find(f, "b")->numel, 2);
    assert_int_equal(k3_st_data_start(f), 8 + strlen(h));
    assert_int_equal(k3_st_metadata_count(f), 2);
    const char *key, *val;
    assert_true(k3_st_metadata_at(f, 0, &key, &val));
    assert_string_equal(key, "format"); /* sorted */
    assert_string_equal(val, "pt");
    assert_string_equal(k3_st_metadata_get(f, "z"), "1");
    assert_null(k3_st_metadata_get(f, "y"));
    assert_false(k3_st_metadata_at(f, 2, &key, &val));
    k3_st_close(f);
    k3_st_close(NULL);
    free(b);
}

/* §1.4 allows any uint64 shape entry; only an empty tensor can carry one above 2^53, and cJSON
 * would round it (2^53 + 1 reads as 2^53). The exact values survive, wherever in the header
 * they stand (data_offsets before shape, a later tensor), and offsets above 2^53 are reported
 * with their exact value too. */
static void test_huge_empty_shape(void **state) {
    (void)state;
    const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                    "\"b\":{\"data_offsets\":[2,2],\"dtype\":\"F32\","
                    "\"shape\":[9007199254740993,0,18446744073709551615]},"
                    "\"c\":{\"dtype\":\"BF16\",\"shape\":[0,9007199254740995],\"data_offsets\":[2,2]}}";
    size_t len;
    uint8_t *b = build(strlen(h), h, strlen(h), 2, &len);
    k3_st_file *f;
    k3_error e = {0};
    cur_case = h;
    assert_int_equal(k3_st_parse(&f, b, len, "m", &e), K3_OK);
    const k3_st_tensor *t = k3_st_find(f, "b");
    assert_int_equal(t->rank, 3);
    assert_true(t->shape[0] == 9007199254740993ull && t->shape[1] == 0 &&
                t->shape[2] == UINT64_MAX && t->numel == 0);
    t = k3_st_find(f, "c");
    assert_true(t->shape[0] == 0 && t->shape[1] == 9007199254740995ull && t->numel == 0);
    assert_true(k3_st_find(f, "a")->shape[0] == 2);
    k3_st_close(f);
    free(b);
    expect_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[9007199254740993,"
                  "9007199254740993]}}",
                  0, K3_ERR_FORMAT, "tensor \"a\"", "[9007199254740993, 9007199254740993]");
}

static void test_dtype_table(void **state) {
    (void)state;
    static const char *names[] = {
        "BOOL",    "F4",          "F6_E2M3",     "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3",
        "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",     "U16", "F16", "BF16",    "I32",
        "U32",     "F32",         "C64",         "F64",     "I64", "U64"};
    static const unsigned bits[] = {8,  4,  6,  6,  8,  8,  8,  8,  8,  8,  8,
                                    16, 16, 16, 16, 32, 32, 32, 64, 64, 64, 64};
    assert_int_equal(sizeof names / sizeof names[0], K3_DTYPE_COUNT - 1);
    for (int d = 1; d < K3_DTYPE_COUNT; d++) {
        assert_string_equal(k3_dtype_name((k3_dtype)d), names[d - 1]);
        assert_int_equal(k3_dtype_parse(names[d - 1]), d);
        assert_int_equal(k3_dtype_bits((k3_dtype)d), bits[d - 1]);
    }
    assert_int_equal(k3_dtype_parse("bf16"), K3_DTYPE_INVALID);
    assert_int_equal(k3_dtype_parse(NULL), K3_DTYPE_INVALID);
    assert_int_equal(k3_dtype_bits(K3_DTYPE_COUNT), 0);
    assert_string_equal(k3_dtype_name((k3_dtype)-1), "INVALID");
}

/* ---- writer -> reader ------------------------------------------------------------------ */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint8_t rnd8(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint8_t)(rng >> 24);
}

typedef struct wcase {
    k3_st_wtensor t[K3_DTYPE_COUNT + 2];
    size_t n;
} wcase;

/* One tensor of every dtype, random shapes (sub-byte dtypes with whole-byte totals),
 * one empty tensor and one scalar, random bytes. */
static void make_tensors(wcase *c) {
    memset(c, 0, sizeof *c);
    for (int d = 1; d < K3_DTYPE_COUNT; d++) {
        k3_st_wtensor *t = &c->t[c->n];
        char *name = malloc(32);
        snprintf(name, 32, "t%02d.%s", (int)(rnd8() % 90), k3_dtype_name((k3_dtype)d));
        t->name = name;
        t->dtype = (k3_dtype)d;
        t->rank = 2;
        t->shape[0] = 1 + rnd8() % 5;
        t->shape[1] = 4 * (1 + rnd8() % 3); /* a multiple of 4 keeps F4/F6 whole bytes */
        c->n++;
    }
    c->t[c->n++] = (k3_st_wtensor){
        .name = strdup("empty"), .dtype = K3_DTYPE_BF16, .rank = 2, .shape = {3, 0}};
    c->t[c->n++] = (k3_st_wtensor){.name = strdup("scalar"), .dtype = K3_DTYPE_F32, .rank = 0};
    for (size_t i = 0; i < c->n; i++) {
        uint64_t nb;
        assert_true(k3_st_tensor_bytes(c->t[i].dtype, c->t[i].rank, c->t[i].shape, NULL, &nb));
        uint8_t *p = malloc(nb + 1);
        for (uint64_t k = 0; k < nb; k++)
            p[k] = rnd8();
        c->t[i].data = p;
    }
}

static void free_tensors(wcase *c) {
    for (size_t i = 0; i < c->n; i++) {
        free((void *)c->t[i].name);
        free((void *)c->t[i].data);
    }
}

static void check_tensor_bytes(k3_st_file *f, const k3_st_wtensor *w) {
    k3_error e = {0};
    const k3_st_tensor *t = k3_st_find(f, w->name);
    assert_non_null(t);
    assert_int_equal(t->dtype, w->dtype);
    assert_int_equal(t->rank, w->rank);
    for (int d = 0; d < w->rank; d++)
        assert_int_equal(t->shape[d], w->shape[d]);
    size_t nb = (size_t)k3_st_nbytes(t);
    uint8_t *buf = malloc(nb + 1);
    assert_int_equal(k3_st_read(f, t, buf, nb, K3_ST_READ_DONTNEED, &e), K3_OK);
    assert_memory_equal(buf, w->data, nb);
    k3_st_view v;
    assert_int_equal(k3_st_view_get(f, t, 0, &v, &e), K3_OK);
    assert_int_equal(v.nbytes, nb);
    if (nb) {
        assert_memory_equal(v.data, w->data, nb);
        assert_null(v.owned); /* the reference layout aligns every tensor to its element size */
    }
    k3_st_view_release(&v);
    free(buf);
}

static void test_round_trip(void **state) {
    (void)state;
    wcase c;
    make_tensors(&c);
    const char *meta[][2] = {{"format", "pt"},
                             {"note", "quote \" backslash \\ tab \t nl \n \x01 \xc3\xa9"}};
    const char *p = tpath("rt.safetensors");
    k3_error e = {0};
    assert_int_equal(k3_st_write_file(p, c.t, c.n, meta, 2, &e), K3_OK);
    k3_st_file *f;
    assert_int_equal(k3_st_open(&f, p, &e), K3_OK);
    assert_int_equal(k3_st_count(f), c.n);
    assert_int_equal(k3_st_data_start(f) % 8, 0); /* header padded to a multiple of 8 */
    assert_string_equal(k3_st_metadata_get(f, "note"), meta[1][1]);
    for (size_t i = 0; i < c.n; i++)
        check_tensor_bytes(f, &c.t[i]);
    /* layout: dtype order descending, then name */
    for (size_t i = 1; i < k3_st_count(f); i++) {
        const k3_st_tensor *a = k3_st_at(f, i - 1), *b = k3_st_at(f, i);
        if (a->end == a->begin || b->end == b->begin)
            continue; /* empties tie on offsets */
        assert_true(a->dtype > b->dtype || (a->dtype == b->dtype && strcmp(a->name, b->name) < 0));
    }
    k3_st_close(f);
    free_tensors(&c);
}

static void test_writer_errors(void **state) {
    (void)state;
    k3_error e = {0};
    k3_st_writer *w;
    uint64_t shape[2] = {2, 2};
    uint8_t data[16] = {0};
    const char *p = tpath("w.safetensors");
    assert_int_equal(k3_st_writer_new(&w, &e), K3_OK);
    assert_int_equal(k3_st_writer_declare(w, "a", K3_DTYPE_F32, 2, shape, &e), K3_OK);
    assert_int_equal(k3_st_writer_declare(w, "a", K3_DTYPE_F32, 2, shape, &e), K3_ERR_DUPLICATE);
    assert_int_equal(k3_st_writer_declare(w, "", K3_DTYPE_F32, 2, shape, &e), K3_ERR_ARG);
    assert_int_equal(k3_st_writer_declare(w, "__metadata__", K3_DTYPE_F32, 2, shape, &e),
                     K3_ERR_ARG);
    assert_int_equal(k3_st_writer_declare(w, "x", K3_DTYPE_INVALID, 2, shape, &e), K3_ERR_DTYPE);
    assert_int_equal(k3_st_writer_declare(w, "x", K3_DTYPE_F32, 9, shape, &e), K3_ERR_LIMIT);
    uint64_t odd[1] = {3};
    assert_int_equal(k3_st_writer_declare(w, "x", K3_DTYPE_F4, 1, odd, &e), K3_ERR_SHAPE);
    assert_int_equal(k3_st_writer_metadata(w, "k", "v", &e), K3_OK);
    assert_int_equal(k3_st_writer_metadata(w, "k", "v", &e), K3_ERR_DUPLICATE);
    assert_int_equal(k3_st_writer_declare(w, "b", K3_DTYPE_U8, 1, shape, &e), K3_OK);
    assert_int_equal(k3_st_writer_put(w, "a", data, 16, &e), K3_ERR_ARG); /* before begin */
    assert_int_equal(k3_st_writer_begin(w, p, &e), K3_OK);
    assert_int_equal(k3_st_writer_declare(w, "c", K3_DTYPE_U8, 1, shape, &e), K3_ERR_ARG);
    assert_int_equal(k3_st_writer_put(w, "zz", data, 16, &e), K3_ERR_MISSING);
    assert_int_equal(k3_st_writer_put(w, "a", data, 15, &e), K3_ERR_ARG);
    assert_int_equal(k3_st_writer_put_chunk(w, "a", data, 10, &e), K3_OK);
    assert_int_equal(k3_st_writer_put_chunk(w, "a", data, 7, &e), K3_ERR_ARG);
    expect_msg(&e, "tensor \"a\"", "overruns");
    assert_int_equal(k3_st_writer_finish(w, &e), K3_ERR_MISSING); /* b never written */
    expect_msg(&e, "tensor \"a\"", "10 of 16 bytes");
    k3_st_writer_free(w); /* removes the temporary file; nothing at p */
    assert_int_not_equal(access(p, F_OK), 0);
    assert_int_not_equal(access(tpath("w.safetensors.tmp"), F_OK), 0);
    k3_st_writer_free(NULL);
}

/* ---- views and reads ------------------------------------------------------------------- */

static void test_views_and_reads(void **state) {
    (void)state;
    /* a header of 8m+5 bytes puts the data at an absolute offset of 8m+13: the F32 at +4 is
     * misaligned, the U8 at +0 is fine for its 1-byte elements */
    char h[160];
    int k = snprintf(h, sizeof h,
                     "{\"u\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                     "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}");
    while (k % 8 != 5)
        h[k++] = ' ';
    h[k] = '\0';
    size_t len, ds = 8 + (size_t)k;
    uint8_t *b = build((uint64_t)k, h, (size_t)k, 12, &len);
    const char *p = tpath("v.safetensors");
    write_bytes(p, b, len);
    k3_error e = {0};
    for (int mem = 0; mem < 2; mem++) {
        k3_st_file *f;
        /* in memory, the buffer base is malloc-aligned (>= 16), so alignment follows the offset */
        assert_int_equal(mem ? k3_st_parse(&f, b, len, "v", &e) : k3_st_open(&f, p, &e), K3_OK);
        const k3_st_tensor *u = k3_st_find(f, "u"), *fl = k3_st_find(f, "f");
        k3_st_view v;
        assert_int_equal(k3_st_view_get(f, u, 0, &v, &e), K3_OK);
        assert_null(v.owned);
        assert_int_equal(((const uint8_t *)v.data)[3], 3);
        k3_st_view_release(&v);
        assert_int_equal(k3_st_view_get(f, fl, 0, &v, &e), K3_OK);
        assert_non_null(v.owned); /* copy path */
        assert_int_equal((uintptr_t)v.data % 4, 0);
        assert_memory_equal(v.data, b + ds + 4, 8);
        k3_st_view_release(&v);
        assert_int_equal(k3_st_view_get(f, u, 64, &v, &e), K3_OK); /* a kernel's alignment */
        assert_int_equal((uintptr_t)v.data % 64, 0);
        assert_memory_equal(v.data, b + ds, 4);
        k3_st_view_release(&v);
        assert_int_equal(k3_st_view_get(f, u, 3, &v, &e), K3_ERR_ARG);
        uint8_t dst[8];
        assert_int_equal(k3_st_read(f, fl, dst, 7, 0, &e), K3_ERR_ARG);
        expect_msg(&e, "tensor \"f\"", "destination holds 7 bytes");
        assert_int_equal(k3_st_read_range(f, fl, 2, dst, 4, K3_ST_READ_DONTNEED, &e), K3_OK);
        assert_memory_equal(dst, b + ds + 6, 4);
        assert_int_equal(k3_st_read_range(f, fl, 5, dst, 4, 0, &e), K3_ERR_ARG);
        expect_msg(&e, "tensor \"f\"", "outside its 8 bytes");
        assert_int_equal(k3_st_read_range(f, fl, UINT64_MAX, dst, 2, 0, &e), K3_ERR_ARG);
        k3_st_close(f);
    }
    free(b);
}

/* ---- checkpoints and the index --------------------------------------------------------- */

static void mkdir_clean(const char *d) {
    rm_tree(d);
    assert_int_equal(mkdir(d, 0755), 0);
}

static void put_file(const char *dir, const char *name, const char *text) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    write_bytes(p, text, strlen(text));
}

/* A shard holding F32 scalars of the given names. */
static void put_shard(const char *dir, const char *name, const char *const *tensors, size_t n) {
    k3_st_wtensor t[8];
    float one = 1.0f;
    for (size_t i = 0; i < n; i++)
        t[i] = (k3_st_wtensor){.name = tensors[i], .dtype = K3_DTYPE_F32, .data = &one};
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    k3_error e = {0};
    assert_int_equal(k3_st_write_file(p, t, n, NULL, 0, &e), K3_OK);
}

static void expect_ck(const char *path, int status, const char *m1, const char *m2) {
    k3_checkpoint *ck = (k3_checkpoint *)1;
    k3_error e = {0};
    int rc = k3_checkpoint_open(&ck, path, &e);
    if (rc != status)
        fail_msg("%s: status %d, expected %d; message: %s", cur_case, rc, status, e.msg);
    if (rc) {
        assert_null(ck);
        expect_msg(&e, m1, m2);
    } else {
        k3_checkpoint_close(ck);
    }
}

#define IDX(map) "{\"metadata\":{\"total_size\":12,\"x\":[1]},\"weight_map\":{" map "}}"

static void test_index_rules(void **state) {
    (void)state;
    const char *d = tpath("ck");
    static const char *const ab[] = {"a", "b"}, *const c1[] = {"c"}, *const a1[] = {"a"};
    struct {
        const char *index;
        int status;
        const char *m1, *m2;
    } cases[] = {
        {IDX("\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\""), K3_OK,
         NULL, NULL},
        {IDX("\"a\":\"s1.safetensors\",\"b\":\"sub/s1.safetensors\",\"c\":\"s2.safetensors\""),
         K3_ERR_FORMAT, "weight_map[\"b\"]", "contains a path separator"},
        {IDX("\"a\":\"s1.safetensors\",\"b\":\"..\",\"c\":\"s2.safetensors\""), K3_ERR_FORMAT,
         "weight_map[\"b\"]", "is not a file name"},
        {IDX("\"a\":\"/etc/passwd\",\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\""),
         K3_ERR_FORMAT, "weight_map[\"a\"]", "absolute path"},
        {IDX("\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s3.safetensors\""),
         K3_ERR_IO, "s3.safetensors", "No such file"},
        {IDX("\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\",\"c\":\"s2.safetensors\""),
         K3_ERR_FORMAT, "tensor \"b\"",
         "mapped to shard s2.safetensors but found in shard s1.safetensors"},
        {IDX("\"a\":\"s1.safetensors\",\"c\":\"s2.safetensors\""), K3_ERR_FORMAT, "tensor \"b\"",
         "not in the weight_map"},
        {IDX("\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\",\"d\":"
             "\"s2.safetensors\""),
         K3_ERR_MISSING, "tensor \"d\"", "does not hold it"},
        {IDX("\"a\":\"s1.safetensors\",\"a\":\"s1.safetensors\""), K3_ERR_DUPLICATE, "\"a\"", NULL},
        {IDX("\"a\":1"), K3_ERR_FORMAT, "weight_map[\"a\"] must be a string", NULL},
        {"{\"metadata\":{}}", K3_ERR_MISSING, "no \"weight_map\"", NULL},
        {"{\"metadata\":{\"total_size\":-1},\"weight_map\":{}}", K3_ERR_FORMAT,
         "metadata.total_size", NULL},
        {"{\"weight_map\":[]}", K3_ERR_FORMAT, "weight_map must be an object", NULL},
        {"{\"weight_map\":{}", K3_ERR_FORMAT, "invalid JSON", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cur_case = cases[i].index;
        mkdir_clean(d);
        put_shard(d, "s1.safetensors", ab, 2);
        put_shard(d, "s2.safetensors", c1, 1);
        put_file(d, K3_INDEX_NAME, cases[i].index);
        expect_ck(d, cases[i].status, cases[i].m1, cases[i].m2);
        /* the same text through the in-memory parser: its own rules give the same verdicts */
        k3_st_index *ix;
        k3_error e = {0};
        int rc = k3_st_index_parse(&ix, cases[i].index, strlen(cases[i].index), "idx", &e);
        if (rc == K3_OK)
            k3_st_index_free(ix);
        else
            assert_int_equal(rc, cases[i].status);
    }
    /* a tensor in two shards, both listed */
    mkdir_clean(d);
    put_shard(d, "s1.safetensors", ab, 2);
    put_shard(d, "s2.safetensors", a1, 1);
    put_file(d, K3_INDEX_NAME, IDX("\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\""));
    expect_ck(d, K3_ERR_DUPLICATE, "tensor \"a\" is in two shards",
              "s1.safetensors and s2.safetensors");
    /* a malformed shard fails the checkpoint, naming the shard */
    put_file(d, "s2.safetensors", "junk");
    put_file(d, K3_INDEX_NAME, IDX("\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\""));
    expect_ck(d, K3_ERR_FORMAT, "s2.safetensors", "shorter than the 8-byte");
    /* no index: every shard, duplicates across shards rejected; an empty directory */
    mkdir_clean(d);
    expect_ck(d, K3_ERR_MISSING, "no *.safetensors", NULL);
    put_shard(d, "s1.safetensors", ab, 2);
    put_shard(d, "s2.safetensors", c1, 1);
    put_file(d, "README.md", "not a shard");
    k3_checkpoint *ck;
    k3_error e = {0};
    assert_int_equal(k3_checkpoint_open(&ck, d, &e), K3_OK);
    assert_int_equal(k3_checkpoint_tensor_count(ck), 3);
    assert_int_equal(k3_checkpoint_has_index(ck), 0);
    k3_tensor_info info;
    assert_int_equal(k3_checkpoint_tensor_info(ck, 2, &info, &e), K3_OK);
    assert_string_equal(info.name, "c");
    assert_string_equal(info.shard_name, "s2.safetensors");
    assert_int_equal(k3_checkpoint_tensor_info(ck, 3, &info, &e), K3_ERR_ARG);
    assert_int_equal(k3_checkpoint_find(ck, "b"), 1);
    assert_int_equal(k3_checkpoint_find(ck, "z"), -1);
    k3_st_file *sf;
    const k3_st_tensor *st;
    assert_int_equal(k3_checkpoint_lookup(ck, "z", &sf, &st, &e), K3_ERR_MISSING);
    expect_msg(&e, "no tensor \"z\"", NULL);
    k3_checkpoint_close(ck);
    k3_checkpoint_close(NULL);
    put_shard(d, "s3.safetensors", a1, 1);
    expect_ck(d, K3_ERR_DUPLICATE, "tensor \"a\" is in two shards", NULL);
    expect_ck(tpath("does-not-exist"), K3_ERR_IO, "does-not-exist", NULL);
}

static void test_sharded_writer(void **state) {
    (void)state;
    wcase c;
    make_tensors(&c);
    const char *d = tpath("sharded");
    mkdir_clean(d);
    const char *meta[][2] = {{"format", "pt"}};
    k3_error e = {0};
    assert_int_equal(k3_st_write_sharded(d, 4, c.t, c.n, NULL, meta, 1, &e), K3_OK);
    k3_checkpoint *ck;
    assert_int_equal(k3_checkpoint_open(&ck, d, &e), K3_OK);
    assert_int_equal(k3_checkpoint_has_index(ck), 1);
    assert_int_equal(k3_checkpoint_shard_count(ck), 4);
    assert_string_equal(k3_checkpoint_shard_name(ck, 0), "model-00001-of-00004.safetensors");
    assert_string_equal(k3_checkpoint_metadata_get(ck, 3, "format"), "pt");
    assert_int_equal(k3_checkpoint_tensor_count(ck), c.n);
    for (size_t i = 0; i < c.n; i++) {
        k3_st_file *f;
        const k3_st_tensor *t;
        assert_int_equal(k3_checkpoint_lookup(ck, c.t[i].name, &f, &t, &e), K3_OK);
        check_tensor_bytes(f, &c.t[i]);
    }
    /* the index file opened directly means its directory */
    k3_checkpoint_close(ck);
    expect_ck(tpath("sharded/" K3_INDEX_NAME), K3_OK, NULL, NULL);
    size_t bad[K3_DTYPE_COUNT + 2] = {0};
    bad[1] = 9;
    assert_int_equal(k3_st_write_sharded(d, 4, c.t, c.n, bad, NULL, 0, &e), K3_ERR_ARG);
    free_tensors(&c);
}

/* 100,000 tensors in one file and in 8 shards with an index: open, look every one up. */
static void test_scaling(void **state) {
    (void)state;
    enum { N = 100000 };
    k3_st_wtensor *t = calloc(N, sizeof *t);
    char *names = malloc((size_t)N * 48);
    uint16_t v = 0x3f80;
    for (size_t i = 0; i < N; i++) {
        char *nm = names + 48 * i;
        snprintf(nm, 48, "model.layers.%zu.experts.%zu.w1.weight", i / 1000, i % 1000);
        t[i] = (k3_st_wtensor){
            .name = nm, .dtype = K3_DTYPE_BF16, .rank = 1, .shape = {1}, .data = &v};
    }
    k3_error e = {0};
    double t0 = k3_now();
    assert_int_equal(k3_st_write_file(tpath("big.safetensors"), t, N, NULL, 0, &e), K3_OK);
    const char *d = tpath("bigck");
    mkdir_clean(d);
    assert_int_equal(k3_st_write_sharded(d, 8, t, N, NULL, NULL, 0, &e), K3_OK);
    double t1 = k3_now();
    const char *paths[2] = {tpath("big.safetensors"), d};
    for (int p = 0; p < 2; p++) {
        k3_checkpoint *ck;
        assert_int_equal(k3_checkpoint_open(&ck, paths[p], &e), K3_OK);
        assert_int_equal(k3_checkpoint_tensor_count(ck), N);
        for (size_t i = 0; i < N; i++) {
            int64_t j = k3_checkpoint_find(ck, t[i].name);
            assert_true(j >= 0);
        }
        k3_checkpoint_close(ck);
    }
    print_message("scaling: wrote 2 x %d tensors in %.2f s, opened + %d lookups x 2 in %.2f s\n", N,
                  t1 - t0, N, k3_now() - t1);
    free(names);
    free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_rules),  cmocka_unit_test(test_header_rules),
        cmocka_unit_test(test_name_too_long), cmocka_unit_test(test_valid_headers),
        cmocka_unit_test(test_huge_empty_shape),
        cmocka_unit_test(test_dtype_table),   cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_writer_errors), cmocka_unit_test(test_views_and_reads),
        cmocka_unit_test(test_index_rules),   cmocka_unit_test(test_sharded_writer),
        cmocka_unit_test(test_scaling),
    };
    return cmocka_run_group_tests_name("safetensors", tests, setup, teardown);
}
