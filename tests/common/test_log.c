/* test_log.c - log lines: text a client chose (a model name from a URL) can
 * never start a line of its own or carry a terminal escape, in text or JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/log.h"

/* Runs one log_error with stderr sent to a file; returns what was written. */
static char *capture(int json, const char *name) {
    char path[] = "/tmp/kiln_test_log_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    int saved = dup(2);
    dup2(fd, 2);
    log_set_json(json);
    log_error("'%s' is not a valid model name", name);
    dup2(saved, 2);
    close(saved);
    static char buf[8192];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    assert_true(n > 0);
    buf[n] = 0;
    close(fd);
    unlink(path);
    log_set_json(0);
    return buf;
}

static const char *forging = "x\n2030-01-01T00:00:00.000Z error FORGED\x1b[31m\r\x7f";

static void test_text_escapes_control_characters(void **state) {
    const char *out = capture(0, forging);
    assert_int_equal(strchr(out, '\n') - out, (long)strlen(out) - 1); /* one line */
    assert_null(strchr(out, '\x1b'));
    assert_null(strchr(out, '\r'));
    assert_null(strchr(out, '\x7f'));
    assert_non_null(strstr(out, "'x\\n2030-01-01T00:00:00.000Z error FORGED\\x1b[31m\\r\\x7f'"));
}

static void test_json_escapes_control_characters(void **state) {
    const char *out = capture(1, forging);
    assert_int_equal(strchr(out, '\n') - out, (long)strlen(out) - 1);
    assert_null(strchr(out, '\x1b'));
    assert_null(strchr(out, '\x7f'));
    assert_non_null(strstr(out, "x\\n2030-01-01T00:00:00.000Z error FORGED\\u001b[31m\\u000d\\u007f"));
}

/* The first event makes a line; the ones within the interval are counted
 * into the next line, which the first event after it makes (here an
 * interval of 0 stands for "the interval passed": no clock in the test). */
static void test_every_counts_between_lines(void **state) {
    static struct log_every every;
    unsigned n = 0;
    const unsigned long long hour = 3600ull * 1000000000ull;
    assert_true(log_every_due(&every, hour, &n));
    assert_int_equal(n, 1);
    for (int i = 0; i < 5; i++) assert_false(log_every_due(&every, hour, &n));
    assert_true(log_every_due(&every, 0, &n));
    assert_int_equal(n, 6);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_text_escapes_control_characters),
                                       cmocka_unit_test(test_json_escapes_control_characters),
                                       cmocka_unit_test(test_every_counts_between_lines)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
