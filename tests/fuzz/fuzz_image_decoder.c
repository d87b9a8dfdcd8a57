/* fuzz_image_decoder.c - libFuzzer target for ImageDecoder's wrapper
 * (kernels/cpu/ops_image.c) over libjpeg-turbo, libpng, libwebp and its own
 * BMP reader, its two calls as the engine makes them outside a plan: infer()
 * (the shape, from the header alone), the bound on the output checked, then
 * run() into an output of that shape. The kernel's file is included (and
 * op_error given here) so that the target needs no other kernel.
 *
 * Input layout: one byte choosing the pixel format (RGB, BGR, Grayscale),
 * then the encoded image. Whatever the bytes, the node either fails with a
 * message naming it or gives UINT8 [H, W, 3 or 1] with H and W positive;
 * the output's bound is 64 MiB, as a server's request bound would be.
 * Built by tools/fuzz.sh:
 */
// fuzz-sources: common/*.c graph/graph.c
// fuzz-corpus: tests/fuzz/corpus/image_decoder/*
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops_image.c"

int op_error(struct op_call *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->err_len, fmt, ap);
    va_end(ap);
    return STATUS_INVALID;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const char *const formats[] = {"RGB", "BGR", "Grayscale"};
    const char *fmt = formats[data[0] % 3];
    struct graph_attr attr = {.name = "pixel_format", .type = ATTR_STRING, .s = (char *)fmt, .s_len = strlen(fmt)};
    int in = 0, out = 1;
    struct graph_node n = {.name = "decode", .op_type = "ImageDecoder", .domain = "", .opset = 20, .in = &in,
                           .nin = 1, .out = &out, .nout = 1, .attrs = &attr, .nattr = 1};
    uint8_t *bytes = malloc(size > 1 ? size - 1 : 1);
    if (!bytes) return 0;
    memcpy(bytes, data + 1, size - 1);
    struct tensor x = {.dtype = DT_UINT8, .ndim = 1, .dims = {(int64_t)size - 1}, .data = bytes};
    struct tensor y = {0};
    char err[512] = "";
    struct op_call c;
    op_call_init(&c, &n, 1, err, sizeof err);
    c.in[0] = &x;
    c.out[0] = &y;
    int rc = image_infer(&c);
    int64_t ch = data[0] % 3 == 2 ? 1 : 3;
    if (rc && !err[0]) abort();
    if (!rc && (y.dtype != DT_UINT8 || y.ndim != 3 || y.dims[0] < 1 || y.dims[1] < 1 || y.dims[2] != ch)) abort();
    if (!rc && tensor_nbytes(&y) <= ((size_t)64 << 20)) { /* the bound a server's request would have */
        if (tensor_alloc_data(&y)) abort();
        err[0] = 0;
        rc = image_run(&c);
        if (rc && !err[0]) abort();
        tensor_free_data(&y);
    }
    free(bytes);
    return 0;
}
