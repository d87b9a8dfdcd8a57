/* The tensor data layout: owned string blocks (pack, copy rows, free), rows
 * of fixed-size tensors, and the length-prefixed string check and decode on
 * well-formed and malformed buffers. Buffers under test are exact-size
 * copies, so a read past their end shows under ASan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/tensor.h"

static struct tensor strings_2d(int64_t rows, int64_t cols) {
    struct tensor t = {.dtype = DT_STRING, .ndim = 2, .dims = {rows, cols}};
    return t;
}

/* An owned block holds its strings: they must all lie inside
 * [data, data + tensor_data_size) after the pointers, in element order. */
static void assert_packed(const struct tensor *t) {
    int64_t n = tensor_numel(t);
    char *const *s = t->data;
    const char *lo = (const char *)(s + n), *hi = (const char *)t->data + tensor_data_size(t);
    const char *prev = lo;
    for (int64_t i = 0; i < n; i++) {
        assert_true(s[i] >= lo && s[i] < hi);
        assert_ptr_equal(s[i], prev);
        prev = s[i] + strlen(s[i]) + 1;
    }
    assert_ptr_equal(prev, hi);
}

static void test_pack_and_free(void **state) {
    (void)state;
    const char *src[] = {"alpha", "", NULL, "delta with spaces", "e", "f"};
    struct tensor t = strings_2d(3, 2);
    assert_int_equal(tensor_strings_pack(&t, src, NULL), 0);
    char *const *s = t.data;
    assert_string_equal(s[0], "alpha");
    assert_string_equal(s[1], "");
    assert_string_equal(s[2], ""); /* NULL packs as "" */
    assert_string_equal(s[3], "delta with spaces");
    assert_packed(&t);
    assert_int_equal(tensor_data_size(&t), 6 * sizeof(char *) + 6 + 1 + 1 + 18 + 2 + 2);
    tensor_free_data(&t);
    assert_null(t.data);
    tensor_free_data(&t); /* NULL data is a no-op */

    /* Counted bytes (as ONNX's string_data): copied up to len or the first NUL. */
    const char raw[] = {'x', 'y', 'z', 'w'};
    const char *cs[] = {raw, raw + 1, "a\0b"};
    size_t lens[] = {3, 0, 3};
    struct tensor c = {.dtype = DT_STRING, .ndim = 1, .dims = {3}};
    assert_int_equal(tensor_strings_pack(&c, cs, lens), 0);
    assert_string_equal(((char **)c.data)[0], "xyz");
    assert_string_equal(((char **)c.data)[1], "");
    assert_string_equal(((char **)c.data)[2], "a");
    assert_packed(&c);
    tensor_free_data(&c);

    /* Empty: a block all the same, freed the same way. */
    struct tensor e = {.dtype = DT_STRING, .ndim = 1, .dims = {0}};
    assert_int_equal(tensor_strings_pack(&e, NULL, NULL), 0);
    assert_non_null(e.data);
    tensor_free_data(&e);
}

static void test_copy_rows_strings(void **state) {
    (void)state;
    /* Two requests' inputs, as a batch gathers them, then split back. */
    const char *a_src[] = {"a0", "a1", "a2", "a3"};
    const char *b_src[] = {"b0", "b1"};
    struct tensor a = strings_2d(2, 2), b = strings_2d(1, 2);
    assert_int_equal(tensor_strings_pack(&a, a_src, NULL), 0);
    assert_int_equal(tensor_strings_pack(&b, b_src, NULL), 0);
    struct tensor_rows both[] = {{&a, 0, 2}, {&b, 0, 1}};
    struct tensor batch;
    assert_int_equal(tensor_copy_rows(&batch, both, 2), 0);
    assert_int_equal(batch.dtype, DT_STRING);
    assert_int_equal(batch.ndim, 2);
    assert_int_equal(batch.dims[0], 3);
    assert_int_equal(batch.dims[1], 2);
    const char *want[] = {"a0", "a1", "a2", "a3", "b0", "b1"};
    for (int i = 0; i < 6; i++) assert_string_equal(((char **)batch.data)[i], want[i]);
    assert_packed(&batch);
    /* The sources can go: the batch owns its strings. */
    tensor_free_data(&a);
    tensor_free_data(&b);

    /* Scatter: each request's rows into its own block, freed alone. */
    struct tensor r0, r1;
    assert_int_equal(tensor_copy_rows(&r0, &(struct tensor_rows){&batch, 0, 2}, 1), 0);
    assert_int_equal(tensor_copy_rows(&r1, &(struct tensor_rows){&batch, 2, 1}, 1), 0);
    tensor_free_data(&batch);
    assert_int_equal(r0.dims[0], 2);
    assert_int_equal(r1.dims[0], 1);
    assert_string_equal(((char **)r0.data)[3], "a3");
    assert_string_equal(((char **)r1.data)[0], "b0");
    assert_string_equal(((char **)r1.data)[1], "b1");
    assert_packed(&r0);
    assert_packed(&r1);
    tensor_free_data(&r0);
    tensor_free_data(&r1);
}

static void test_rows_write_into_buffer(void **state) {
    (void)state;
    /* A view (pointers to strings owned elsewhere, as a kernel writes) is
     * read the same way and copied into the caller's buffer. */
    char s0[] = "left", s1[] = "right";
    char *view[] = {s0, s1, s1};
    struct tensor v = {.dtype = DT_STRING, .ndim = 1, .dims = {3}, .data = view};
    struct tensor_rows r = {&v, 1, 2};
    size_t need = tensor_rows_size(&r, 1);
    assert_int_equal(need, 2 * sizeof(char *) + 6 + 6);
    void *buf = malloc(need);
    struct tensor d;
    assert_int_equal(tensor_rows_write(&d, buf, need - 1, &r, 1), STATUS_INVALID); /* short */
    assert_int_equal(tensor_rows_write(&d, buf, need, &r, 1), 0);
    assert_ptr_equal(d.data, buf);
    assert_int_equal(d.dims[0], 2);
    assert_string_equal(((char **)d.data)[0], "right");
    assert_string_equal(((char **)d.data)[1], "right");
    assert_ptr_not_equal(((char **)d.data)[0], s1);
    free(buf);

    /* Out of range rows are refused, not read. */
    struct tensor bad;
    assert_int_equal(tensor_copy_rows(&bad, &(struct tensor_rows){&v, 2, 2}, 1), STATUS_INVALID);
    assert_null(bad.data);
    assert_int_equal(tensor_copy_rows(&bad, &(struct tensor_rows){&v, -1, 1}, 1), STATUS_INVALID);
    struct tensor scalar = {.dtype = DT_FP32, .ndim = 0, .data = (float[]){1}};
    assert_int_equal(tensor_copy_rows(&bad, &(struct tensor_rows){&scalar, 0, 1}, 1), STATUS_INVALID);
}

static void test_copy_rows_fixed(void **state) {
    (void)state;
    int64_t x[] = {1, 2, 3, 4, 5, 6}, y[] = {7, 8};
    struct tensor a = {.dtype = DT_INT64, .ndim = 2, .dims = {3, 2}, .data = x};
    struct tensor b = {.dtype = DT_INT64, .ndim = 2, .dims = {1, 2}, .data = y};
    struct tensor_rows rows[] = {{&a, 1, 2}, {&b, 0, 1}};
    assert_int_equal(tensor_rows_size(rows, 2), 6 * sizeof(int64_t));
    struct tensor d;
    assert_int_equal(tensor_copy_rows(&d, rows, 2), 0);
    assert_int_equal(d.dims[0], 3);
    const int64_t want[] = {3, 4, 5, 6, 7, 8};
    assert_memory_equal(d.data, want, sizeof want);
    assert_int_equal((uintptr_t)d.data % 64, 0);
    tensor_free_data(&d);

    struct tensor f = {.dtype = DT_FP32, .ndim = 2, .dims = {2, 3}};
    assert_int_equal(tensor_alloc_data(&f), 0);
    assert_int_equal((uintptr_t)f.data % 64, 0);
    tensor_free_data(&f);
    struct tensor s = {.dtype = DT_STRING, .ndim = 1, .dims = {2}};
    assert_int_equal(tensor_alloc_data(&s), STATUS_NOMEM); /* strings are made with their bytes */
    assert_null(s.data);
}

/* Length-prefixed encoding of n strings, in an exact-size buffer. */
static uint8_t *prefixed(const char *const *s, const uint32_t *lens, int n, size_t *len) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += 4 + lens[i];
    uint8_t *b = malloc(total ? total : 1), *w = b;
    for (int i = 0; i < n; i++) {
        uint32_t l = lens[i];
        w[0] = (uint8_t)l, w[1] = (uint8_t)(l >> 8), w[2] = (uint8_t)(l >> 16), w[3] = (uint8_t)(l >> 24);
        memcpy(w + 4, s[i], l);
        w += 4 + l;
    }
    *len = total;
    return b;
}

static void test_prefixed_round_trip(void **state) {
    (void)state;
    const char *src[] = {"cat", "", "a longer string"};
    uint32_t lens[] = {3, 0, 15};
    size_t len;
    uint8_t *buf = prefixed(src, lens, 3, &len);
    char err[128];
    assert_int_equal(tensor_strings_check(buf, len, 3, NULL, err, sizeof err), 0);
    struct tensor t = {.dtype = DT_STRING, .ndim = 2, .dims = {3, 1}};
    assert_int_equal(tensor_strings_from_prefixed(&t, buf, len, err, sizeof err), 0);
    for (int i = 0; i < 3; i++) assert_string_equal(((char **)t.data)[i], src[i]);
    assert_packed(&t);
    assert_int_equal(tensor_strings_prefixed_size(&t), len);
    uint8_t *out = malloc(len);
    tensor_strings_prefixed_write(&t, out);
    assert_memory_equal(out, buf, len);
    free(out);
    tensor_free_data(&t);

    /* used: trailing bytes are allowed and measured. */
    uint8_t *more = malloc(len + 5);
    memcpy(more, buf, len);
    memset(more + len, 0xff, 5);
    size_t used = 0;
    assert_int_equal(tensor_strings_check(more, len + 5, 3, &used, NULL, 0), 0);
    assert_int_equal(used, len);
    assert_int_equal(tensor_strings_check(more, len + 5, 3, NULL, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "follow the last"));
    free(more);
    free(buf);

    /* Zero elements: an empty buffer. */
    assert_int_equal(tensor_strings_check("", 0, 0, NULL, NULL, 0), 0);
    struct tensor e = {.dtype = DT_STRING, .ndim = 1, .dims = {0}};
    assert_int_equal(tensor_strings_from_prefixed(&e, "", 0, NULL, 0), 0);
    tensor_free_data(&e);
}

static void test_prefixed_malformed(void **state) {
    (void)state;
    char err[128];
    const char *src[] = {"abc", "de"};
    uint32_t lens[] = {3, 2};
    size_t len;
    uint8_t *buf = prefixed(src, lens, 2, &len);

    /* A length prefix that runs past the buffer (the crafted Redis value). */
    uint8_t *big = malloc(len);
    memcpy(big, buf, len);
    big[7 + 1] = 0xff; /* element 1's length: 2 -> 0x00ff02 */
    assert_int_equal(tensor_strings_check(big, len, 2, NULL, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "BYTES element 1 says"));
    assert_int_equal(tensor_strings_check(big, len, 2, &(size_t){0}, NULL, 0), STATUS_INVALID);
    struct tensor t = {.dtype = DT_STRING, .ndim = 1, .dims = {2}};
    assert_int_equal(tensor_strings_from_prefixed(&t, big, len, err, sizeof err), STATUS_INVALID);
    assert_null(t.data);
    big[7 + 1] = 0;
    big[0] = 0xff, big[1] = big[2] = big[3] = 0xff; /* 4 GiB - 1 in element 0 */
    assert_int_equal(tensor_strings_check(big, len, 2, NULL, NULL, 0), STATUS_INVALID);
    free(big);

    /* A prefix cut short. */
    assert_int_equal(tensor_strings_check(buf, len - 2 - 2, 2, NULL, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "truncated 4-byte length"));
    /* Bytes cut short. */
    assert_int_equal(tensor_strings_check(buf, len - 1, 2, NULL, err, sizeof err), STATUS_INVALID);
    /* Counts that do not match the shape, both ways. */
    assert_int_equal(tensor_strings_check(buf, len, 3, NULL, err, sizeof err), STATUS_INVALID);
    assert_non_null(strstr(err, "holds 2 BYTES elements but 3"));
    assert_int_equal(tensor_strings_check(buf, len, 1, NULL, err, sizeof err), STATUS_INVALID);
    assert_int_equal(tensor_strings_check(buf, len, 1, &(size_t){0}, NULL, 0), 0); /* one, then more bytes */
    struct tensor wrong = {.dtype = DT_STRING, .ndim = 2, .dims = {2, 2}};
    assert_int_equal(tensor_strings_from_prefixed(&wrong, buf, len, NULL, 0), STATUS_INVALID);
    assert_null(wrong.data);
    /* A huge shape over a small buffer is refused before any allocation. */
    struct tensor huge = {.dtype = DT_STRING, .ndim = 2, .dims = {INT32_MAX, INT32_MAX}};
    assert_int_equal(tensor_strings_from_prefixed(&huge, buf, len, NULL, 0), STATUS_INVALID);
    free(buf);

    /* Every truncation of a valid buffer is refused without reading past it. */
    const char *many[] = {"one", "two", "", "three"};
    uint32_t ml[] = {3, 3, 0, 5};
    buf = prefixed(many, ml, 4, &len);
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *c = malloc(cut ? cut : 1);
        memcpy(c, buf, cut);
        assert_int_equal(tensor_strings_check(c, cut, 4, NULL, NULL, 0), STATUS_INVALID);
        free(c);
    }
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_and_free),
        cmocka_unit_test(test_copy_rows_strings),
        cmocka_unit_test(test_rows_write_into_buffer),
        cmocka_unit_test(test_copy_rows_fixed),
        cmocka_unit_test(test_prefixed_round_trip),
        cmocka_unit_test(test_prefixed_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
