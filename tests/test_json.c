/* The strict JSON layer: what cJSON alone would accept and k3 must not. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "io/json.h"

static int parse(const char *text, k3_error *e) {
    cJSON *root = NULL;
    int rc = k3_json_parse(&root, text, strlen(text), "t.json", e);
    cJSON_Delete(root);
    return rc;
}

static void expect(const char *text, int status, const char *needle) {
    k3_error e = {0};
    int rc = parse(text, &e);
    if (rc != status || (needle && !strstr(e.msg, needle)))
        fail_msg("%s: got %d \"%s\", wanted %d containing \"%s\"", text, rc, e.msg, status,
                 needle ? needle : "");
}

static void test_accepts_plain_json(void **state) {
    (void)state;
    expect(" {\"a\": [1, 2.5, -3e2, true, false, null, \"x\\u00e9\\n\"]}\r\n\t", K3_OK, NULL);
}

static void test_rejects(void **state) {
    (void)state;
    expect("{\"a\": 1, \"a\": 2}", K3_ERR_DUPLICATE, "\"a\"");
    expect("{\"o\": {\"k\": 1, \"k\": 1}}", K3_ERR_DUPLICATE, "\"k\"");
    expect("{\"a\": 1} x", K3_ERR_FORMAT, "trailing");
    expect("{\"a\": \"x\x01y\"}", K3_ERR_FORMAT, "control byte");
    expect("{\"a\":\x01 1}", K3_ERR_FORMAT, "not allowed outside");
    expect("{\"a\": \"x\\u0000y\"}", K3_ERR_FORMAT, "NUL");
    expect("{\"a\": \"\xc3\x28\"}", K3_ERR_FORMAT, "UTF-8");
    expect("{\"a\": \"\xed\xa0\x80\"}", K3_ERR_FORMAT, "UTF-8"); /* a surrogate */
    expect("{\"a\": \"\xc0\xaf\"}", K3_ERR_FORMAT, "UTF-8");     /* overlong */
    expect("{\"a\": ", K3_ERR_FORMAT, "invalid JSON");
    char deep[400] = {0};
    for (int i = 0; i < 100; i++)
        deep[i] = '[';
    for (int i = 0; i < 100; i++)
        deep[100 + i] = ']';
    expect(deep, K3_ERR_FORMAT, "deeper");
}

static void test_typed_getters(void **state) {
    (void)state;
    cJSON *root = NULL;
    const char *t = "{\"n\": 3, \"f\": 2.5, \"s\": \"x\", \"b\": true, \"z\": null}";
    assert_int_equal(k3_json_parse(&root, t, strlen(t), "t", NULL), K3_OK);
    k3_error e = {0};
    int64_t i = 0;
    bool found = true;
    assert_int_equal(k3_json_get_int(root, "n", 0, 10, &i, &found, "t", &e), K3_OK);
    assert_true(found);
    assert_int_equal(i, 3);
    assert_int_equal(k3_json_get_int(root, "n", 4, 10, &i, &found, "t", &e), K3_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "\"n\""));
    assert_int_equal(k3_json_get_int(root, "f", 0, 10, &i, &found, "t", &e), K3_ERR_FORMAT);
    assert_int_equal(k3_json_get_int(root, "z", 0, 10, &i, &found, "t", &e), K3_OK);
    assert_false(found); /* null reads as absent */
    const char *s = NULL;
    assert_int_equal(k3_json_get_string(root, "n", &s, &found, "t", &e), K3_ERR_FORMAT);
    bool b = false;
    assert_int_equal(k3_json_get_bool(root, "b", &b, &found, "t", &e), K3_OK);
    assert_true(b);
    uint64_t u = 0;
    assert_false(k3_json_u64(cJSON_GetObjectItem(root, "f"), &u));
    assert_true(k3_json_u64(cJSON_GetObjectItem(root, "n"), &u));
    assert_int_equal(u, 3);
    cJSON_Delete(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepts_plain_json),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_typed_getters),
    };
    return cmocka_run_group_tests_name("json", tests, NULL, NULL);
}
