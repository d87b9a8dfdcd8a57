/* test_upload.c - model files from a load request (server/upload.c): the
 * path rules with the message each refusal gives, base64 decoding, the
 * size cap counted over the whole set, and writing under a real folder:
 * files replaced in place through a rename, folders made, a symbolic link
 * on the way refused with nothing written where it points. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/status.h"
#include "server/upload.h"

static void test_paths(void **state) {
    (void)state;
    char err[512];
    int64_t v = 0;
    assert_int_equal(upload_path_check("3/model.onnx", &v, err, sizeof err), 0);
    assert_int_equal(v, 3);
    assert_int_equal(upload_path_check("12/sub/weights.bin", &v, err, sizeof err), 0);
    assert_int_equal(v, 12);
    static const struct {
        const char *path, *why;
    } bad[] = {{"", "1 to"},
               {"/etc/passwd", "not absolute"},
               {"../x/1/model.onnx", "may not start with '.'"},
               {"1/../../x", "may not start with '.'"},
               {"1/./model.onnx", "may not start with '.'"},
               {"1/.model.onnx", "may not start with '.'"},
               {"1//model.onnx", "empty component"},
               {"1/model.onnx/", "empty component"},
               {"1/a\\..\\b", "backslashes"},
               {"1/a\nb", "control characters"},
               {"model.onnx", "version folder"},
               {"0/model.onnx", "version folder"},
               {"-1/model.onnx", "version folder"},
               {"1234567890123456789/model.onnx", "version folder"},
               {"7", "inside a version folder"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        assert_int_equal(upload_path_check(bad[i].path, &v, err, sizeof err), STATUS_INVALID);
        if (!strstr(err, bad[i].why)) fail_msg("'%s': %s", bad[i].path, err);
    }
}

static void test_set(void **state) {
    (void)state;
    char err[512];
    struct upload_set s = {0};
    assert_int_equal(upload_set_add_base64(&s, "1/a", "aGVsbG8=", 10, err, sizeof err), 0);
    assert_int_equal(s.files[0].len, 5);
    assert_memory_equal(s.files[0].data, "hello", 5);
    assert_int_equal(upload_set_add_base64(&s, "1/b", "aGk", 10, err, sizeof err), 0); /* no padding */
    assert_int_equal(s.bytes, 7);
    /* 7 + 5 passes 10: the set's total counts. */
    assert_int_equal(upload_set_add(&s, "1/c", (const unsigned char *)"12345", 5, 10, err, sizeof err),
                     STATUS_TOO_LARGE);
    assert_non_null(strstr(err, "--max-model-upload-size (10 bytes)"));
    assert_int_equal(upload_set_add_base64(&s, "1/d", "not base64!", 100, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "base64"));
    assert_int_equal(upload_set_add(&s, "../x", (const unsigned char *)"x", 1, 100, err, sizeof err), STATUS_INVALID);
    assert_int_equal(upload_set_add(&s, "1/e", (const unsigned char *)"x", 1, 0, err, sizeof err), STATUS_TOO_LARGE);
    assert_non_null(strstr(err, "off"));
    assert_int_equal(s.n, 2);
    upload_set_clear(&s);
    assert_int_equal(s.n, 0);
    assert_null(s.files);
}

static void slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}

static void test_write(void **state) {
    (void)state;
    char root[] = "/tmp/kiln_upload_XXXXXX", p[512], q[512], buf[64], err[512];
    assert_non_null(mkdtemp(root));
    struct upload_set s = {0};
    assert_int_equal(upload_set_add(&s, "1/model.onnx", (const unsigned char *)"one", 3, 100, err, sizeof err), 0);
    assert_int_equal(upload_set_add(&s, "2/sub/w.bin", (const unsigned char *)"two", 3, 100, err, sizeof err), 0);
    assert_int_equal(upload_write(root, "m", &s, err, sizeof err), 0);
    snprintf(p, sizeof p, "%s/m/1/model.onnx", root);
    slurp(p, buf, sizeof buf);
    assert_string_equal(buf, "one");
    snprintf(p, sizeof p, "%s/m/2/sub/w.bin", root);
    slurp(p, buf, sizeof buf);
    assert_string_equal(buf, "two");
    upload_set_clear(&s);
    /* Replaced in place. */
    assert_int_equal(upload_set_add(&s, "1/model.onnx", (const unsigned char *)"uno", 3, 100, err, sizeof err), 0);
    assert_int_equal(upload_write(root, "m", &s, err, sizeof err), 0);
    snprintf(p, sizeof p, "%s/m/1/model.onnx", root);
    slurp(p, buf, sizeof buf);
    assert_string_equal(buf, "uno");
    upload_set_clear(&s);
    /* A link on the way (a version folder, the model's folder) is refused;
     * where it points stays empty. */
    snprintf(q, sizeof q, "%s/elsewhere", root);
    assert_int_equal(mkdir(q, 0755), 0);
    snprintf(p, sizeof p, "%s/m/3", root);
    assert_int_equal(symlink(q, p), 0);
    snprintf(p, sizeof p, "%s/linked", root);
    assert_int_equal(symlink(q, p), 0);
    assert_int_equal(upload_set_add(&s, "3/model.onnx", (const unsigned char *)"x", 1, 100, err, sizeof err), 0);
    assert_int_equal(upload_write(root, "m", &s, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "'3' is a symbolic link"));
    upload_set_clear(&s);
    assert_int_equal(upload_set_add(&s, "1/model.onnx", (const unsigned char *)"x", 1, 100, err, sizeof err), 0);
    assert_int_equal(upload_write(root, "linked", &s, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "symbolic link"));
    upload_set_clear(&s);
    snprintf(p, sizeof p, "%s/model.onnx", q);
    assert_int_not_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/1", q);
    assert_int_not_equal(access(p, F_OK), 0);
    /* A file where a folder must go. */
    assert_int_equal(upload_set_add(&s, "1/model.onnx/x", (const unsigned char *)"x", 1, 100, err, sizeof err), 0);
    assert_int_equal(upload_write(root, "m", &s, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "not a folder"));
    upload_set_clear(&s);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_set),
        cmocka_unit_test(test_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
