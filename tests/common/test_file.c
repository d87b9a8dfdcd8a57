/* test_file.c - files from a repository: regular files only, without
 * blocking on a FIFO, under a size cap, with messages naming the path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/file.h"
#include "common/status.h"

static char g_dir[] = "/tmp/kiln_test_file_XXXXXX";

static int setup(void **state) { return mkdtemp(g_dir) ? 0 : -1; }

static int teardown(void **state) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd);
}

static void test_reads_a_regular_file(void **state) {
    char path[256], err[512], *buf;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    FILE *f = fopen(path, "w");
    fputs("{\"a\": 1}", f);
    fclose(f);
    assert_int_equal(file_read_regular(path, 1024, &buf, &len, err, sizeof err), 0);
    assert_int_equal(len, 8);
    assert_string_equal(buf, "{\"a\": 1}");
    free(buf);
    assert_int_equal(file_read_regular(path, 7, &buf, &len, err, sizeof err), STATUS_INVALID);
    assert_null(buf);
    assert_non_null(strstr(err, "over the limit of 7"));
}

/* A FIFO without a writer would block open(2) forever without O_NONBLOCK. */
static void test_refuses_a_fifo_without_blocking(void **state) {
    char path[256], err[512], *buf;
    size_t len;
    snprintf(path, sizeof path, "%s/fifo.json", g_dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(10);
    assert_int_equal(file_read_regular(path, 1024, &buf, &len, err, sizeof err), STATUS_INVALID);
    alarm(0);
    assert_non_null(strstr(err, "not a regular file"));
    assert_non_null(strstr(err, path));
}

static void test_refuses_a_folder_and_says_missing(void **state) {
    char path[256], err[512], *buf;
    size_t len;
    assert_int_equal(file_read_regular(g_dir, 1024, &buf, &len, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "not a regular file"));
    snprintf(path, sizeof path, "%s/absent", g_dir);
    assert_int_equal(file_read_regular(path, 1024, &buf, &len, err, sizeof err), STATUS_NOT_FOUND);
    int64_t size;
    int st;
    assert_null(file_open_regular(path, 1024, &size, &st, err, sizeof err));
    assert_int_equal(st, STATUS_NOT_FOUND);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_reads_a_regular_file),
                                       cmocka_unit_test(test_refuses_a_fifo_without_blocking),
                                       cmocka_unit_test(test_refuses_a_folder_and_says_missing)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
