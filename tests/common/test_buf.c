/* The growable buffer: appends, printf, the sticky failure, the limit and
 * the KILN_FAULT_ALLOC_ENCODE hook (set before main by this test's own
 * constructor, as the server reads it at start). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"

/* Runs before buf.c's reader (constructors of the test's own object run
 * first at a higher priority): the 3rd growth in this process fails. */
__attribute__((constructor(101))) static void set_fault(void) { setenv("KILN_FAULT_ALLOC_ENCODE", "3", 1); }

static void test_appends_and_printf(void **state) {
    (void)state;
    struct buf b = {0};
    buf_str(&b, "ab");
    buf_add(&b, "cd", 2);
    buf_printf(&b, "%d-%s", 42, "x");
    assert_int_equal(b.failed, BUF_OK);
    assert_int_equal(b.len, 8);
    assert_memory_equal(b.data, "abcd42-x", 8);
    /* A printf longer than the first reservation grows and writes it whole. */
    char big[3000];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = 0;
    buf_printf(&b, "%s!", big);
    assert_int_equal(b.len, 8 + 3000);
    assert_int_equal(b.data[b.len - 1], '!');
    buf_free(&b);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    buf_free(NULL);
}

static void test_limit_is_sticky(void **state) {
    (void)state;
    struct buf b = {.limit = 100};
    buf_add(&b, "0123456789", 10);
    assert_int_equal(b.failed, BUF_OK);
    assert_true(b.cap <= 100);
    char big[200] = {0};
    buf_add(&b, big, sizeof big);
    assert_int_equal(b.failed, BUF_OVER_LIMIT);
    assert_int_equal(b.len, 10);
    /* Once failed, even a small append that would fit does nothing. */
    buf_str(&b, "x");
    buf_printf(&b, "%d", 1);
    assert_int_equal(b.len, 10);
    assert_int_equal(buf_reserve(&b, 1), -1);
    buf_free(&b);
}

static void test_fault_hook_fails_the_third_growth(void **state) {
    (void)state;
    /* Growths 1 and 2 succeed, the third fails; later buffers are fine. */
    struct buf a = {0}, b = {0}, c = {0}, d = {0};
    buf_str(&a, "first");
    buf_str(&b, "second");
    assert_int_equal(a.failed, BUF_OK);
    assert_int_equal(b.failed, BUF_OK);
    for (int i = 0; i < 1000; i++) buf_printf(&c, "%d,", i); /* one failure, not one per element */
    assert_int_equal(c.failed, BUF_NOMEM);
    assert_int_equal(c.len, 0);
    assert_null(c.data);
    for (int i = 0; i < 1000; i++) buf_printf(&d, "%d,", i);
    assert_int_equal(d.failed, BUF_OK);
    assert_true(d.len > 3000);
    buf_free(&a);
    buf_free(&b);
    buf_free(&c);
    buf_free(&d);
}

static void test_huge_reserve_fails_cleanly(void **state) {
    (void)state;
    struct buf b = {0};
    buf_str(&b, "x");
    assert_int_equal(buf_reserve(&b, SIZE_MAX - 4), -1);
    assert_int_equal(b.failed, BUF_NOMEM);
    assert_int_equal(b.len, 1);
    buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_hook_fails_the_third_growth),
        cmocka_unit_test(test_appends_and_printf),
        cmocka_unit_test(test_limit_is_sticky),
        cmocka_unit_test(test_huge_reserve_fails_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
