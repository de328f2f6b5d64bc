/* Expert-parallel partition: TensorRT-LLM's rule on the K3 sizes, exhaustive coverage and
 * inverse-map agreement on small sizes, and every rejected argument. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "moe/ep.h"

static void test_k3_sizes(void **state) {
    (void)state;
    k3_ep_part p;
    assert_int_equal(k3_ep_partition(896, 8, 3, &p, NULL), K3_OK);
    assert_int_equal(p.first, 336);
    assert_int_equal(p.count, 112);
    assert_int_equal(k3_ep_partition(896, 16, 15, &p, NULL), K3_OK);
    assert_int_equal(p.first, 840);
    assert_int_equal(p.count, 56);
    /* 10 experts over 4 ranks: 3,3,2,2 starting at 0,3,6,8 */
    const int first[4] = {0, 3, 6, 8}, count[4] = {3, 3, 2, 2};
    for (int r = 0; r < 4; r++) {
        assert_int_equal(k3_ep_partition(10, 4, r, &p, NULL), K3_OK);
        assert_int_equal(p.first, first[r]);
        assert_int_equal(p.count, count[r]);
    }
}

/* Every (E, ep) up to 64: the parts tile [0, E) in order, sizes differ by at most one with
 * the larger ones first, and the inverse map names the owner of every id. */
static void test_exhaustive(void **state) {
    (void)state;
    for (int E = 1; E <= 64; E++)
        for (int ep = 1; ep <= E; ep++) {
            int next = 0;
            for (int r = 0; r < ep; r++) {
                k3_ep_part p;
                assert_int_equal(k3_ep_partition(E, ep, r, &p, NULL), K3_OK);
                assert_int_equal(p.first, next);
                assert_true(p.count == E / ep + (r < E % ep));
                assert_true(p.count >= 1);
                for (int id = p.first; id < p.first + p.count; id++) {
                    int owner = -1;
                    assert_int_equal(k3_ep_owner(E, ep, id, &owner, NULL), K3_OK);
                    assert_int_equal(owner, r);
                    assert_true(k3_ep_owns(&p, id));
                }
                assert_false(k3_ep_owns(&p, p.first - 1));
                assert_false(k3_ep_owns(&p, p.first + p.count));
                next += p.count;
            }
            assert_int_equal(next, E);
        }
}

static void test_rejects(void **state) {
    (void)state;
    k3_ep_part p;
    k3_error e = {0};
    int owner;
    assert_int_equal(k3_ep_partition(4, 8, 0, &p, &e), K3_ERR_ARG);
    assert_non_null(strstr(e.msg, "ep_size 8 exceeds n_experts 4"));
    assert_int_equal(k3_ep_partition(0, 1, 0, &p, &e), K3_ERR_ARG);
    assert_non_null(strstr(e.msg, "n_experts"));
    assert_int_equal(k3_ep_partition(8, 0, 0, &p, &e), K3_ERR_ARG);
    assert_non_null(strstr(e.msg, "ep_size"));
    assert_int_equal(k3_ep_partition(8, 2, 2, &p, &e), K3_ERR_ARG);
    assert_non_null(strstr(e.msg, "rank"));
    assert_int_equal(k3_ep_partition(8, 2, -1, &p, &e), K3_ERR_ARG);
    assert_int_equal(k3_ep_owner(8, 2, 8, &owner, &e), K3_ERR_ARG);
    assert_non_null(strstr(e.msg, "expert id"));
    assert_int_equal(k3_ep_owner(8, 2, -1, &owner, &e), K3_ERR_ARG);
    assert_int_equal(k3_ep_owner(3, 4, 0, &owner, &e), K3_ERR_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_k3_sizes),
        cmocka_unit_test(test_exhaustive),
        cmocka_unit_test(test_rejects),
    };
    return cmocka_run_group_tests_name("ep", tests, NULL, NULL);
}
