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

/* Element e holds exactly the n bytes at want. */
static void assert_str(struct tensor_str e, const char *want, size_t n) {
    assert_int_equal(e.len, n);
    if (n) assert_memory_equal(e.p, want, n);
}
#define assert_lit(e, lit) assert_str((e), (lit), sizeof(lit) - 1)

/* C strings as elements (NULL as ""). */
static struct tensor_str *cstrs(const char *const *s, int n) {
    struct tensor_str *e = calloc((size_t)n + 1, sizeof *e);
    for (int i = 0; i < n; i++) e[i] = tensor_str_of(s[i]);
    return e;
}

/* An owned block holds its strings: they must all lie inside
 * [data, data + tensor_data_size) after the elements, in element order,
 * each followed by a NUL that is not part of it. */
static void assert_packed(const struct tensor *t) {
    int64_t n = tensor_numel(t);
    const struct tensor_str *s = tensor_strs(t);
    const char *lo = (const char *)(s + n), *hi = (const char *)t->data + tensor_data_size(t);
    const char *prev = lo;
    for (int64_t i = 0; i < n; i++) {
        assert_true(s[i].p >= lo && s[i].p < hi);
        assert_ptr_equal(s[i].p, prev);
        assert_int_equal(s[i].p[s[i].len], 0);
        prev = s[i].p + s[i].len + 1;
    }
    assert_ptr_equal(prev, hi);
}

static void test_pack_and_free(void **state) {
    (void)state;
    const char *src[] = {"alpha", "", NULL, "delta with spaces", "e", "f"};
    struct tensor t = strings_2d(3, 2);
    struct tensor_str *el = cstrs(src, 6);
    assert_int_equal(tensor_strings_pack(&t, el), 0);
    free(el);
    const struct tensor_str *s = tensor_strs(&t);
    assert_lit(s[0], "alpha");
    assert_lit(s[1], "");
    assert_lit(s[2], ""); /* NULL packs as "" */
    assert_lit(s[3], "delta with spaces");
    assert_packed(&t);
    assert_int_equal(tensor_data_size(&t), 6 * sizeof(struct tensor_str) + 6 + 1 + 1 + 18 + 2 + 2);
    assert_int_equal(dtype_size(DT_STRING), sizeof(struct tensor_str));
    tensor_free_data(&t);
    assert_null(t.data);
    tensor_free_data(&t); /* NULL data is a no-op */

    /* Counted bytes (as ONNX's string_data and BYTES): every byte is kept,
     * a NUL too; an element with no bytes may have p NULL. */
    const char raw[] = {'x', 'y', 'z', 'w'};
    struct tensor_str cs[] = {{raw, 3}, {NULL, 0}, {"a\0b", 3}, {"\0", 1}};
    struct tensor c = {.dtype = DT_STRING, .ndim = 1, .dims = {4}};
    assert_int_equal(tensor_strings_pack(&c, cs), 0);
    assert_lit(tensor_strs(&c)[0], "xyz");
    assert_lit(tensor_strs(&c)[1], "");
    assert_lit(tensor_strs(&c)[2], "a\0b");
    assert_lit(tensor_strs(&c)[3], "\0");
    assert_packed(&c);
    tensor_free_data(&c);

    /* Empty: a block all the same, freed the same way. */
    struct tensor e = {.dtype = DT_STRING, .ndim = 1, .dims = {0}};
    assert_int_equal(tensor_strings_pack(&e, NULL), 0);
    assert_non_null(e.data);
    tensor_free_data(&e);
}

static void test_str_compare_and_hash(void **state) {
    (void)state;
    struct tensor_str admin = tensor_str_of("admin"), trick = {"admin\0; drop", 12}, empty = {NULL, 0};
    assert_false(tensor_str_eq(admin, trick));
    assert_true(tensor_str_eq(admin, (struct tensor_str){"admin\0", 5}));
    assert_true(tensor_str_eq(empty, tensor_str_of("")));
    assert_true(tensor_str_cmp(admin, trick) < 0); /* a prefix sorts first */
    assert_true(tensor_str_cmp(trick, admin) > 0);
    assert_int_equal(tensor_str_cmp(empty, (struct tensor_str){"", 0}), 0);
    assert_true(tensor_str_cmp((struct tensor_str){"\x80", 1}, (struct tensor_str){"\x7f", 1}) > 0); /* unsigned bytes */
    assert_true(tensor_str_hash(admin) != tensor_str_hash(trick));
    assert_true(tensor_str_hash((struct tensor_str){"a\0", 2}) != tensor_str_hash((struct tensor_str){"a", 1}));
    assert_int_equal(tensor_str_hash(empty), tensor_str_hash(tensor_str_of("")));
}

static void test_copy_rows_strings(void **state) {
    (void)state;
    /* Two requests' inputs, as a batch gathers them, then split back. */
    struct tensor_str a_src[] = {{"a0", 2}, {"a\0" "1", 3}, {"", 0}, {"a3", 2}};
    struct tensor_str b_src[] = {{"\0b0", 3}, {"b1", 2}};
    struct tensor a = strings_2d(2, 2), b = strings_2d(1, 2);
    assert_int_equal(tensor_strings_pack(&a, a_src), 0);
    assert_int_equal(tensor_strings_pack(&b, b_src), 0);
    struct tensor_rows both[] = {{&a, 0, 2}, {&b, 0, 1}};
    struct tensor batch;
    assert_int_equal(tensor_copy_rows(&batch, both, 2), 0);
    assert_int_equal(batch.dtype, DT_STRING);
    assert_int_equal(batch.ndim, 2);
    assert_int_equal(batch.dims[0], 3);
    assert_int_equal(batch.dims[1], 2);
    for (int i = 0; i < 4; i++) assert_str(tensor_strs(&batch)[i], a_src[i].p, a_src[i].len);
    for (int i = 0; i < 2; i++) assert_str(tensor_strs(&batch)[4 + i], b_src[i].p, b_src[i].len);
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
    assert_lit(tensor_strs(&r0)[1], "a\0" "1");
    assert_lit(tensor_strs(&r0)[3], "a3");
    assert_lit(tensor_strs(&r1)[0], "\0b0");
    assert_lit(tensor_strs(&r1)[1], "b1");
    assert_packed(&r0);
    assert_packed(&r1);
    tensor_free_data(&r0);
    tensor_free_data(&r1);
}

static void test_rows_write_into_buffer(void **state) {
    (void)state;
    /* A view (elements pointing at strings owned elsewhere, as a kernel
     * writes) is read the same way and copied into the caller's buffer. */
    char s0[] = "left", s1[] = "right";
    struct tensor_str view[] = {{s0, 4}, {s1, 5}, {s1, 5}};
    struct tensor v = {.dtype = DT_STRING, .ndim = 1, .dims = {3}, .data = view};
    struct tensor_rows r = {&v, 1, 2};
    size_t need = tensor_rows_size(&r, 1);
    assert_int_equal(need, 2 * sizeof(struct tensor_str) + 6 + 6);
    void *buf = malloc(need);
    struct tensor d;
    assert_int_equal(tensor_rows_write(&d, buf, need - 1, &r, 1), STATUS_INVALID); /* short */
    assert_int_equal(tensor_rows_write(&d, buf, need, &r, 1), 0);
    assert_ptr_equal(d.data, buf);
    assert_int_equal(d.dims[0], 2);
    assert_lit(tensor_strs(&d)[0], "right");
    assert_lit(tensor_strs(&d)[1], "right");
    assert_ptr_not_equal(tensor_strs(&d)[0].p, s1);
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
    for (int i = 0; i < 3; i++) assert_str(tensor_strs(&t)[i], src[i], lens[i]);
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
    /* Counted whole: 3; the 0xff bytes after them are a malformed fourth. */
    assert_int_equal(tensor_strings_count(buf, len), 3);
    assert_int_equal(tensor_strings_count(buf, len - 1), -1);
    assert_int_equal(tensor_strings_count(more, len + 5), -1);
    assert_int_equal(tensor_strings_count("", 0), 0);
    free(more);
    free(buf);

    /* Zero elements: an empty buffer. */
    assert_int_equal(tensor_strings_check("", 0, 0, NULL, NULL, 0), 0);
    struct tensor e = {.dtype = DT_STRING, .ndim = 1, .dims = {0}};
    assert_int_equal(tensor_strings_from_prefixed(&e, "", 0, NULL, 0), 0);
    tensor_free_data(&e);
}

/* Every byte value, NUL first, and empty strings survive the wire form
 * both ways, exactly. */
static void test_prefixed_all_bytes(void **state) {
    (void)state;
    char all[256];
    for (int i = 0; i < 256; i++) all[i] = (char)i;
    const char *src[] = {all, "", "ab\0cd", "\0secret", all + 1, ""};
    uint32_t lens[] = {256, 0, 5, 7, 1, 0};
    size_t len;
    uint8_t *buf = prefixed(src, lens, 6, &len);
    struct tensor t = {.dtype = DT_STRING, .ndim = 2, .dims = {2, 3}};
    assert_int_equal(tensor_strings_from_prefixed(&t, buf, len, NULL, 0), 0);
    for (int i = 0; i < 6; i++) assert_str(tensor_strs(&t)[i], src[i], lens[i]);
    assert_packed(&t);
    assert_int_equal(tensor_strings_prefixed_size(&t), len);
    uint8_t *out = malloc(len);
    tensor_strings_prefixed_write(&t, out);
    assert_memory_equal(out, buf, len);
    /* Through rows (the batcher's gather) and a pack, still every byte. */
    struct tensor rows, packed = t;
    assert_int_equal(tensor_copy_rows(&rows, &(struct tensor_rows){&t, 1, 1}, 1), 0);
    assert_str(tensor_strs(&rows)[0], src[3], lens[3]);
    assert_int_equal(tensor_strings_pack(&packed, tensor_strs(&t)), 0);
    for (int i = 0; i < 6; i++) assert_str(tensor_strs(&packed)[i], src[i], lens[i]);
    tensor_free_data(&packed);
    tensor_free_data(&rows);
    tensor_free_data(&t);
    free(out);
    free(buf);
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
        cmocka_unit_test(test_str_compare_and_hash),
        cmocka_unit_test(test_copy_rows_strings),
        cmocka_unit_test(test_rows_write_into_buffer),
        cmocka_unit_test(test_copy_rows_fixed),
        cmocka_unit_test(test_prefixed_round_trip),
        cmocka_unit_test(test_prefixed_all_bytes),
        cmocka_unit_test(test_prefixed_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
