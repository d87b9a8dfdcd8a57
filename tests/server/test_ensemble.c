/* test_ensemble.c - the shape rule of a tensor handed between a model that
 * batches and one that does not (ensemble_fit_batch): a batch of 1 added
 * or dropped, dims only; anything else left as it is for the step's bind
 * to judge. The steps' runs are tested end to end (tests/e2e/test_ensemble.py). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "server/ensemble.h"

static struct model_config_io io_of(int ndim, int64_t d0, int64_t d1) {
    struct model_config_io io;
    memset(&io, 0, sizeof io);
    io.ndim = ndim;
    io.dims[0] = d0;
    io.dims[1] = d1;
    return io;
}

static struct tensor tensor_of(int ndim, const int64_t *dims) {
    struct tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = DT_FP32;
    t.ndim = ndim;
    memcpy(t.dims, dims, (size_t)ndim * sizeof dims[0]);
    return t;
}

static void test_batch_of_one_added_for_a_batching_model(void **state) {
    struct model_config mc = {.max_batch_size = 8};
    struct model_config_io io = io_of(1, -1, 0);
    struct tensor t = tensor_of(1, (int64_t[]){16});
    ensemble_fit_batch(&mc, &io, &t);
    assert_int_equal(t.ndim, 2);
    assert_int_equal(t.dims[0], 1);
    assert_int_equal(t.dims[1], 16);
    /* Already batched: left alone. */
    struct tensor u = tensor_of(2, (int64_t[]){3, 16});
    ensemble_fit_batch(&mc, &io, &u);
    assert_int_equal(u.ndim, 2);
    assert_int_equal(u.dims[0], 3);
}

static void test_batch_of_one_dropped_for_a_non_batching_model(void **state) {
    struct model_config mc = {.max_batch_size = 0};
    struct model_config_io io = io_of(1, 16, 0);
    struct tensor t = tensor_of(2, (int64_t[]){1, 16});
    ensemble_fit_batch(&mc, &io, &t);
    assert_int_equal(t.ndim, 1);
    assert_int_equal(t.dims[0], 16);
    /* A batch of 3 cannot lose its dim: the bind refuses it, naming it. */
    struct tensor u = tensor_of(2, (int64_t[]){3, 16});
    ensemble_fit_batch(&mc, &io, &u);
    assert_int_equal(u.ndim, 2);
    /* A rank the configuration leaves open: nothing to fit. */
    struct model_config_io any = io_of(-1, 0, 0);
    struct tensor v = tensor_of(2, (int64_t[]){1, 16});
    ensemble_fit_batch(&mc, &any, &v);
    assert_int_equal(v.ndim, 2);
}

static void test_no_steps_without_an_ensemble(void **state) { assert_int_equal(ensemble_nsteps(NULL), 0); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_of_one_added_for_a_batching_model),
        cmocka_unit_test(test_batch_of_one_dropped_for_a_non_batching_model),
        cmocka_unit_test(test_no_steps_without_an_ensemble),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
