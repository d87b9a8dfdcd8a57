/* ops_image.c - ImageDecoder (ONNX opset 20): an encoded image's bytes
 * (UINT8 [n]) to pixels (UINT8 [H, W, 3] RGB or BGR, [H, W, 1] Grayscale).
 *
 * JPEG through libjpeg-turbo, PNG through libpng, WebP through libwebp, BMP
 * (uncompressed 24- and 32-bit, 8-bit with a palette) read here. infer()
 * reads only the header: the output's shape follows the bytes, so a model
 * with the decoder runs node by node (models/valrun.h), and the engine
 * checks that shape against the request's memory bound before it allocates
 * the output and run() decodes. Pixels are what Pillow gives, as ONNX's
 * reference implementation decodes with it: alpha dropped (not composited),
 * 16-bit samples to their high byte, Grayscale from colour as Pillow's
 * convert("L") (ITU-R 601-2 luma, (19595 R + 38470 G + 7471 B + 2^15) >> 16),
 * a grayscale JPEG's own luma as it is. CMYK JPEGs, other BMP encodings and
 * animated WebPs are refused by name; broken or truncated data is an error
 * naming the node's input (the request's input when it is the graph's),
 * never a partial image. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

#include "kernels/cpu/shape_util.h"
#include "kernels/ops.h"

enum img_format { IMG_UNKNOWN, IMG_JPEG, IMG_PNG, IMG_WEBP, IMG_BMP };
enum img_pixels { PIX_RGB, PIX_BGR, PIX_GRAY };

/* The largest side accepted from a header (Pillow's own decompression-bomb
 * guard is on the pixel count; the request bound then applies to H*W*C). */
#define IMG_MAX_SIDE 65535

/* An error about the image's bytes (fmt goes on after the name: ": ..."
 * or " is ..."), naming its input: the request's input
 * when the node reads a graph input (models/model.c records its name as
 * kiln_input_name), else the operator's own name for it. */
__attribute__((format(printf, 2, 3))) static int img_error(struct op_call *c, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return op_error(c, "input '%s'%s", node_attr_str(c->node, "kiln_input_name", "encoded_stream"), msg);
}

static enum img_format sniff(const uint8_t *p, size_t n) {
    if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return IMG_JPEG;
    if (n >= 8 && memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) return IMG_PNG;
    if (n >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0) return IMG_WEBP;
    if (n >= 2 && p[0] == 'B' && p[1] == 'M') return IMG_BMP;
    return IMG_UNKNOWN;
}

static enum img_pixels pixels_of(const struct op_call *c) {
    const char *f = node_attr_str(c->node, "pixel_format", "RGB");
    return strcmp(f, "BGR") == 0 ? PIX_BGR : strcmp(f, "Grayscale") == 0 ? PIX_GRAY : PIX_RGB;
}

static uint8_t luma(const uint8_t *rgb) {
    return (uint8_t)((rgb[0] * 19595u + rgb[1] * 38470u + rgb[2] * 7471u + 0x8000u) >> 16);
}

/* One RGB row (w pixels) into the output's row, as pix asks. */
static void put_row(uint8_t *dst, const uint8_t *rgb, int64_t w, enum img_pixels pix) {
    for (int64_t x = 0; x < w; x++, rgb += 3) {
        if (pix == PIX_GRAY) *dst++ = luma(rgb);
        else if (pix == PIX_BGR) *dst++ = rgb[2], *dst++ = rgb[1], *dst++ = rgb[0];
        else *dst++ = rgb[0], *dst++ = rgb[1], *dst++ = rgb[2];
    }
}

/* ---- JPEG ------------------------------------------------------------------ */

struct jerr {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
};

static void jpeg_fail(j_common_ptr j) {
    struct jerr *e = (struct jerr *)j->err;
    e->mgr.format_message(j, e->msg);
    longjmp(e->jump, 1);
}

/* A warning (libjpeg's name for corrupt data it can skip over, a premature
 * end among them) is an error here: no partial image is answered. */
static void jpeg_warn(j_common_ptr j, int level) {
    if (level < 0) jpeg_fail(j);
}

/* Reads the header (out == NULL) or decodes into out [h, w, ch]. */
static int jpeg_do(struct op_call *c, const uint8_t *p, size_t n, enum img_pixels pix, int64_t *h, int64_t *w,
                   uint8_t *out) {
    struct jpeg_decompress_struct j;
    struct jerr e;
    uint8_t *volatile row = NULL;
    j.err = jpeg_std_error(&e.mgr);
    e.mgr.error_exit = jpeg_fail;
    e.mgr.emit_message = jpeg_warn;
    if (setjmp(e.jump)) {
        jpeg_destroy_decompress(&j);
        free(row);
        return img_error(c, ": broken JPEG: %s", e.msg);
    }
    jpeg_create_decompress(&j);
    jpeg_mem_src(&j, p, (unsigned long)n);
    jpeg_read_header(&j, TRUE);
    if (j.jpeg_color_space == JCS_CMYK || j.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&j);
        return img_error(c, ": a CMYK JPEG is not supported (convert it to RGB)");
    }
    *h = j.image_height;
    *w = j.image_width;
    if (!out) {
        jpeg_destroy_decompress(&j);
        return 0;
    }
    int gray = j.jpeg_color_space == JCS_GRAYSCALE;
    j.out_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&j);
    int64_t ch = pix == PIX_GRAY ? 1 : 3;
    if (!(row = malloc((size_t)j.output_width * (size_t)j.output_components))) {
        jpeg_destroy_decompress(&j);
        return op_error(c, "out of memory decoding a JPEG");
    }
    while (j.output_scanline < j.output_height) {
        JSAMPROW r = (JSAMPROW)row;
        uint8_t *dst = out + (int64_t)j.output_scanline * *w * ch;
        jpeg_read_scanlines(&j, &r, 1);
        if (!gray) put_row(dst, row, *w, pix);
        else
            for (int64_t x = 0; x < *w; x++)
                for (int64_t k = 0; k < ch; k++) *dst++ = row[x];
    }
    jpeg_finish_decompress(&j);
    jpeg_destroy_decompress(&j);
    free(row);
    return 0;
}

/* ---- PNG ------------------------------------------------------------------- */

struct png_src {
    const uint8_t *p;
    size_t n, at;
    char msg[200];
};

static void png_read_mem(png_structp png, png_bytep dst, png_size_t len) {
    struct png_src *s = png_get_io_ptr(png);
    if (len > s->n - s->at) png_error(png, "the data ends before the image does");
    memcpy(dst, s->p + s->at, len);
    s->at += len;
}

static void png_fail(png_structp png, png_const_charp msg) {
    struct png_src *s = png_get_error_ptr(png);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void png_warn_quiet(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }

static int png_do(struct op_call *c, const uint8_t *p, size_t n, enum img_pixels pix, int64_t *h, int64_t *w,
                  uint8_t *out) {
    /* The shape from IHDR alone, the first chunk: an image too large for
     * the request is refused before anything else of it is read. */
    if (n < 33 || memcmp(p + 12, "IHDR", 4) != 0)
        return img_error(c, ": broken PNG: no IHDR chunk first");
    if (!out) {
        *w = be32(p + 16);
        *h = be32(p + 20);
        return 0;
    }
    struct png_src s = {p, n, 0, ""};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, png_fail, png_warn_quiet);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    uint8_t *volatile row = NULL;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return op_error(c, "out of memory decoding a PNG");
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        free(row);
        return img_error(c, ": broken PNG: %s", s.msg);
    }
    png_set_read_fn(png, &s, png_read_mem);
    png_read_info(png, info);
    *w = png_get_image_width(png, info);
    *h = png_get_image_height(png, info);
    if (!out) {
        png_destroy_read_struct(&png, &info, NULL);
        return 0;
    }
    /* To 8-bit RGB: palette expanded, high bytes of 16-bit samples, alpha
     * and transparency dropped, gray replicated (then luma again for Grayscale:
     * a gray pixel's luma is itself). */
    int ct = png_get_color_type(png, info);
    png_set_strip_16(png);
    png_set_packing(png);
    if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ct == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (ct & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
    if (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)*w * 3) png_error(png, "unexpected row layout");
    int64_t ch = pix == PIX_GRAY ? 1 : 3;
    /* Interlaced images need the whole image between passes: decode into
     * RGB rows, then convert. */
    if (!(row = malloc((size_t)*w * 3 * (size_t)(passes > 1 ? *h : 1)))) png_error(png, "out of memory");
    for (int pass = 0; pass < passes; pass++)
        for (int64_t y = 0; y < *h; y++) {
            uint8_t *r = passes > 1 ? row + y * *w * 3 : row;
            png_read_row(png, r, NULL);
            if (passes == 1 || pass == passes - 1) put_row(out + y * *w * ch, r, *w, pix);
        }
    png_destroy_read_struct(&png, &info, NULL);
    free(row);
    return 0;
}

/* ---- WebP ------------------------------------------------------------------ */

static int webp_do(struct op_call *c, const uint8_t *p, size_t n, enum img_pixels pix, int64_t *h, int64_t *w,
                   uint8_t *out) {
    WebPBitstreamFeatures f;
    if (WebPGetFeatures(p, n, &f) != VP8_STATUS_OK)
        return img_error(c, ": broken WebP (its header does not read)");
    if (f.has_animation) return img_error(c, ": an animated WebP is not supported");
    *w = f.width;
    *h = f.height;
    if (!out) return 0;
    int64_t ch = pix == PIX_GRAY ? 1 : 3;
    uint8_t *rgb = pix == PIX_GRAY ? malloc((size_t)(*w * *h * 3)) : out;
    if (!rgb) return op_error(c, "out of memory decoding a WebP");
    uint8_t *ok = pix == PIX_BGR ? WebPDecodeBGRInto(p, n, rgb, (size_t)(*w * *h * 3), (int)(*w * 3))
                                 : WebPDecodeRGBInto(p, n, rgb, (size_t)(*w * *h * 3), (int)(*w * 3));
    if (ok && pix == PIX_GRAY)
        for (int64_t y = 0; y < *h; y++) put_row(out + y * *w * ch, rgb + y * *w * 3, *w, pix);
    if (rgb != out) free(rgb);
    return ok ? 0 : img_error(c, ": broken or truncated WebP");
}

/* ---- BMP ------------------------------------------------------------------- */

static uint32_t le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static int bmp_do(struct op_call *c, const uint8_t *p, size_t n, enum img_pixels pix, int64_t *h, int64_t *w,
                  uint8_t *out) {
    if (n < 54) return img_error(c, ": truncated BMP (%zu bytes, no full header)", n);
    uint32_t off = le32(p + 10), hs = le32(p + 14);
    if (hs < 40 || 14 + (size_t)hs > n) return img_error(c, ": BMP header of %u bytes is not supported", hs);
    int32_t bw = (int32_t)le32(p + 18), bh = (int32_t)le32(p + 22);
    unsigned bpp = le16(p + 28), comp = le32(p + 30), ncolors = le32(p + 46);
    if (comp != 0)
        return img_error(c, ": BMP compression %u is not supported (uncompressed only)", comp);
    if (bpp != 24 && bpp != 32 && bpp != 8)
        return img_error(c, ": a %u-bit BMP is not supported (8, 24 or 32)", bpp);
    if (bw <= 0 || bh == 0 || bh == INT32_MIN) return img_error(c, ": BMP of %d x %d pixels", bw, bh);
    int top_down = bh < 0;
    *w = bw;
    *h = top_down ? -(int64_t)bh : bh;
    if (!out) return 0;
    size_t stride = ((size_t)*w * bpp / 8 + 3) & ~(size_t)3;
    if (off > n || (size_t)*h * stride > n - off)
        return img_error(c, ": truncated BMP (%zu bytes of pixels for %lld rows of %zu)",
                         (size_t)(n - (off < n ? off : n)), (long long)*h, stride);
    const uint8_t *pal = p + 14 + hs;
    if (bpp == 8 && ncolors == 0) ncolors = 256;
    if (bpp == 8 && (ncolors > 256 || 14 + (size_t)hs + 4 * (size_t)ncolors > off))
        return img_error(c, ": BMP palette of %u colours does not fit", ncolors);
    int64_t ch = pix == PIX_GRAY ? 1 : 3;
    uint8_t *rgb = malloc((size_t)*w * 3);
    if (!rgb) return op_error(c, "out of memory decoding a BMP");
    for (int64_t y = 0; y < *h; y++) {
        const uint8_t *src = p + off + (size_t)(top_down ? y : *h - 1 - y) * stride;
        for (int64_t x = 0; x < *w; x++) {
            const uint8_t *px = bpp == 8 ? (src[x] < ncolors ? pal + 4 * src[x] : (const uint8_t *)"\0\0\0")
                                         : src + x * (bpp / 8);
            rgb[3 * x] = px[2], rgb[3 * x + 1] = px[1], rgb[3 * x + 2] = px[0];
        }
        put_row(out + y * *w * ch, rgb, *w, pix);
    }
    free(rgb);
    return 0;
}

/* ---- the op ---------------------------------------------------------------- */

static int image_do(struct op_call *c, int64_t *h, int64_t *w, uint8_t *out) {
    const struct tensor *x = c->in[0];
    if (x->dtype != DT_UINT8 || x->ndim != 1) return img_error(c, " must be UINT8 [n]");
    const uint8_t *p = x->data;
    size_t n = (size_t)x->dims[0];
    enum img_pixels pix = pixels_of(c);
    switch (sniff(p, n)) {
    case IMG_JPEG: return jpeg_do(c, p, n, pix, h, w, out);
    case IMG_PNG: return png_do(c, p, n, pix, h, w, out);
    case IMG_WEBP: return webp_do(c, p, n, pix, h, w, out);
    case IMG_BMP: return bmp_do(c, p, n, pix, h, w, out);
    default: break;
    }
    char head[16] = "";
    for (size_t i = 0, at = 0; i < n && i < 4; i++, at = strlen(head))
        snprintf(head + at, sizeof head - at, "%s%02x", i ? " " : "", p[i]);
    return img_error(c, " is not a JPEG, PNG, WebP or BMP image (%zu bytes%s%s)", n, n ? ", starting " : "", head);
}

static int image_infer(struct op_call *c) {
    const struct tensor *x = c->in[0];
    const char *f = node_attr_str(c->node, "pixel_format", "RGB");
    if (strcmp(f, "RGB") && strcmp(f, "BGR") && strcmp(f, "Grayscale"))
        return op_error(c, "pixel_format '%s' is not RGB, BGR or Grayscale", f);
    /* No bytes at all have no data pointer either: refused as they are. */
    if (!x->data && !(x->ndim == 1 && x->dims[0] == 0)) {
        op_error(c, "ImageDecoder's output shape is the image's, read from its bytes at run time");
        return STATUS_DATA_DEPENDENT;
    }
    int64_t h = 0, w = 0;
    int rc = image_do(c, &h, &w, NULL);
    if (rc) return rc;
    if (h <= 0 || w <= 0 || h > IMG_MAX_SIDE || w > IMG_MAX_SIDE)
        return img_error(c, ": an image of %lld x %lld pixels (each side 1 to %d)", (long long)w,
                         (long long)h, IMG_MAX_SIDE);
    struct tensor *o = c->out[0];
    o->dtype = DT_UINT8;
    o->ndim = 3;
    o->dims[0] = h;
    o->dims[1] = w;
    o->dims[2] = pixels_of(c) == PIX_GRAY ? 1 : 3;
    return 0;
}

static int image_run(struct op_call *c) {
    int64_t h = c->out[0]->dims[0], w = c->out[0]->dims[1], h2 = 0, w2 = 0;
    int rc = image_do(c, &h2, &w2, c->out[0]->data);
    if (!rc && (h2 != h || w2 != w)) return op_error(c, "the image changed since its shape was read");
    return rc;
}

const struct op_def op_defs_image[] = {
    {"ImageDecoder", "", image_infer, NULL, image_run, NULL, 0},
    {NULL, NULL, NULL, NULL, NULL, NULL, 0},
};
