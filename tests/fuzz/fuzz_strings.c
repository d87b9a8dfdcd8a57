/* fuzz_strings.c - libFuzzer target for the BYTES layout (common/tensor.h):
 * the one check of a length-prefixed buffer (tensor_strings_check), the
 * decode into an owned block (tensor_strings_from_prefixed) and every way a
 * block is copied (tensor_copy_rows, tensor_strings_pack) and written back
 * (tensor_strings_prefixed_write).
 *
 * Input layout: one byte (bits 0-3: the element count; bits 4-5: how many
 * rows the elements make, 1 to 4, when they divide them), then the buffer.
 * A buffer the check accepts must decode, survive each copy byte for byte
 * (NULs and all), and write back to exactly the bytes it came from; one it
 * refuses must not decode. Built by tools/fuzz.sh:
 */
// fuzz-sources: common/*.c
// fuzz-corpus: tests/fuzz/corpus/strings/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/tensor.h"

/* a and b hold the same elements, every byte of each. */
static void same_strings(const struct tensor *a, const struct tensor *b) {
    int64_t n = tensor_numel(a);
    if (n != tensor_numel(b)) abort();
    for (int64_t i = 0; i < n; i++)
        if (!tensor_str_eq(tensor_strs(a)[i], tensor_strs(b)[i])) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int64_t count = data[0] & 15, rows = 1 + (data[0] >> 4 & 3);
    const uint8_t *buf = data + 1;
    size_t len = size - 1;
    /* An exact-size copy, so that a read past the end shows under ASan. */
    uint8_t *exact = malloc(len ? len : 1);
    if (len) memcpy(exact, buf, len);
    struct tensor t = {.dtype = DT_STRING, .ndim = 2, .dims = {rows, count / rows}};
    if (count % rows) t = (struct tensor){.dtype = DT_STRING, .ndim = 1, .dims = {count}};
    char err[160];
    size_t used = 0;
    int ok = tensor_strings_check(exact, len, count, NULL, err, sizeof err) == 0;
    int prefix_ok = tensor_strings_check(exact, len, count, &used, NULL, 0) == 0;
    if (ok && (!prefix_ok || used != len)) abort();
    /* The count of whole elements is the one count the whole buffer checks
     * against; -1 only for a buffer no count fits. */
    int64_t whole = tensor_strings_count(exact, len);
    if (whole >= 0 ? tensor_strings_check(exact, len, whole, NULL, NULL, 0) != 0 || (ok && whole != count)
                   : ok)
        abort();
    int rc = tensor_strings_from_prefixed(&t, exact, len, err, sizeof err);
    if (!ok) {
        if (rc != STATUS_INVALID || t.data) abort();
        free(exact);
        return 0;
    }
    if (rc) abort();
    if (tensor_strings_prefixed_size(&t) != len) abort();
    uint8_t *back = malloc(len ? len : 1);
    tensor_strings_prefixed_write(&t, back);
    if (len && memcmp(back, exact, len)) abort();
    /* Each element ends with a NUL that is not part of it. */
    for (int64_t i = 0; i < count; i++)
        if (tensor_strs(&t)[i].p[tensor_strs(&t)[i].len] != 0) abort();
    struct tensor packed = t, rowsc;
    if (tensor_strings_pack(&packed, tensor_strs(&t)) == 0) {
        same_strings(&t, &packed);
        tensor_free_data(&packed);
    }
    if (t.ndim == 2 && tensor_copy_rows(&rowsc, &(struct tensor_rows){&t, 0, rows}, 1) == 0) {
        same_strings(&t, &rowsc);
        if (tensor_data_size(&rowsc) != tensor_data_size(&t)) abort();
        tensor_free_data(&rowsc);
    }
    tensor_free_data(&t);
    free(back);
    free(exact);
    return 0;
}
