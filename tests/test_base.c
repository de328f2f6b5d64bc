/* Status strings, error formatting and checked arithmetic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "base/base.h"

static void test_status_strings(void **state) {
    (void)state;
    for (int s = 0; s < K3_STATUS_COUNT; s++) {
        assert_non_null(k3_status_str(s));
        assert_true(strlen(k3_status_str(s)) > 0);
    }
    assert_string_equal(k3_status_str(-1), "unknown status");
    assert_string_equal(k3_status_str(K3_STATUS_COUNT), "unknown status");
}

static void test_fail_formats(void **state) {
    (void)state;
    k3_error e = {0};
    assert_int_equal(k3_fail(&e, K3_ERR_DTYPE, "%s: expected %s", "w1.weight", "U8"), K3_ERR_DTYPE);
    assert_int_equal(e.status, K3_ERR_DTYPE);
    assert_string_equal(e.msg, "w1.weight: expected U8");
    assert_int_equal(k3_fail(NULL, K3_ERR_IO, "x"), K3_ERR_IO); /* NULL error is allowed */
}

static void test_checked_math(void **state) {
    (void)state;
    uint64_t r = 7;
    assert_false(k3_mul_u64(UINT64_MAX / 2 + 1, 2, &r));
    assert_int_equal(r, 7);
    assert_true(k3_mul_u64(1u << 20, 1u << 20, &r));
    assert_int_equal(r, 1ull << 40);
    assert_false(k3_add_u64(UINT64_MAX, 1, &r));
    assert_true(k3_add_u64(3, 4, &r));
    assert_int_equal(r, 7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_fail_formats),
        cmocka_unit_test(test_checked_math),
    };
    return cmocka_run_group_tests_name("base", tests, NULL, NULL);
}
