/* tensor.h - datatypes and the plain tensor descriptor shared by every module.
 *
 * dtype values are ONNX's TensorProto.DataType numbers so that loading needs
 * no table. A tensor is a plain struct: it does not own its data unless the
 * code that made it says so. Dims are int64; -1 means "not known yet"
 * (symbolic or dynamic) and is only legal in metadata, never in a tensor
 * that carries data.
 *
 * The data layout, one for every dtype, strings included:
 *
 *   An owned tensor's data is ONE malloc'd block, freed by tensor_free_data
 *   (a plain free()) whatever the dtype. Nothing else is owned with it.
 *
 *   Fixed-size dtypes: numel elements, row-major (dims[0] outermost).
 *
 *   The low-precision dtypes of quantized models take one byte per element
 *   in memory: float8 as its bit pattern; int4/int2 as an int8 (-8..7,
 *   -2..1); uint4/uint2 as a uint8 (0..15, 0..3); float4e2m1 as its four bits
 *   in the low nibble. ONNX files pack the 4-bit types two to a byte and the
 *   2-bit types four to a byte (element 0 in the low bits); the loader unpacks
 *   them (tensor_unpack_bits), so every kernel that moves elements (Reshape,
 *   Transpose, Gather, batching rows...) addresses whole bytes. The KServe
 *   protocol has no datatype for any of them: they live inside a graph only.
 *
 *   DT_STRING: numel struct tensor_str {p, len} elements, then the
 *   strings' bytes in element order, each followed by a NUL; element i's p
 *   points into the same block at string i. A BYTES element is len bytes of
 *   any value, NUL included: the length is the truth and the NUL after it
 *   only spares a consumer that wants a C string a copy (it never ends a
 *   string early). tensor_data_size() gives the block's size.
 *
 * Every reader of a string tensor sees a struct tensor_str[numel]
 * (tensor_strs) and compares, hashes and copies len bytes; nothing calls
 * strlen on tensor data. A string tensor in a plan's arena (a kernel's
 * output) is that element array alone, pointing at strings owned by
 * constants, attributes or inputs that outlive it, or made by the kernel in
 * its executor's string pool (kernels/ops.h), which lives until the outputs
 * are copied out: such a view is never freed and leaves the plan only as a
 * copy made by tensor_strings_pack. Copying the struct copies a borrowed
 * view; tensor_copy_rows and tensor_strings_pack make owned copies. In a
 * view a string need not be followed by a NUL (StringSplit's pieces point
 * into their input's bytes), and an element's p may be NULL when its len is
 * 0: only an owned block promises the NUL.
 *
 * On the wire (KServe's binary tensor extension) and in cache values, strings
 * are length-prefixed: per element a 4-byte little-endian length and that
 * many bytes. tensor_strings_check is the one check of such a buffer and
 * runs before any of it is read. */
#ifndef KILN_TENSOR_H
#define KILN_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define TENSOR_MAX_DIMS 8

enum dtype {
    DT_UNDEFINED = 0,
    DT_FP32 = 1,
    DT_UINT8 = 2,
    DT_INT8 = 3,
    DT_UINT16 = 4,
    DT_INT16 = 5,
    DT_INT32 = 6,
    DT_INT64 = 7,
    DT_STRING = 8, /* struct tensor_str[numel] then the strings, in one block: see "data layout" above */
    DT_BOOL = 9,   /* one byte, 0 or 1 */
    DT_FP16 = 10,
    DT_FP64 = 11,
    DT_UINT32 = 12,
    DT_UINT64 = 13,
    DT_BF16 = 16,
    DT_FP8E4M3FN = 17,   /* float8 bits: no inf, NaN S.1111.111, max 448 */
    DT_FP8E4M3FNUZ = 18, /* float8 bits: no inf, no -0, NaN 0x80, max 240 */
    DT_FP8E5M2 = 19,     /* float8 bits: IEEE-like, inf and NaN, max 57344 */
    DT_FP8E5M2FNUZ = 20, /* float8 bits: no inf, no -0, NaN 0x80, max 57344 */
    DT_UINT4 = 21,       /* one byte per element in memory, 0..15 */
    DT_INT4 = 22,        /* one byte per element in memory, -8..7 */
    DT_FP4E2M1 = 23,     /* one byte per element in memory, the 4 bits low; no inf, no NaN, max 6 */
    DT_FP8E8M0 = 24,     /* a power of two 2^(bits - 127), NaN 0xFF: the scales of MX formats */
    DT_UINT2 = 25,       /* one byte per element in memory, 0..3 */
    DT_INT2 = 26,        /* one byte per element in memory, -2..1 */
    DT_MAX_ = 27,
};

struct tensor {
    enum dtype dtype;
    int ndim;
    int64_t dims[TENSOR_MAX_DIMS];
    void *data;
};

/* One DT_STRING element: len bytes at p, any byte values. */
struct tensor_str {
    const char *p;
    size_t len;
};

/* The elements of a DT_STRING tensor. */
static inline const struct tensor_str *tensor_strs(const struct tensor *t) {
    return (const struct tensor_str *)t->data;
}
static inline struct tensor_str *tensor_strs_mut(struct tensor *t) { return (struct tensor_str *)t->data; }
/* A C string (a literal, an attribute, a name) as an element. */
static inline struct tensor_str tensor_str_of(const char *s) {
    struct tensor_str r = {s ? s : "", s ? strlen(s) : 0};
    return r;
}
/* 1 if a and b hold the same bytes. */
static inline int tensor_str_eq(struct tensor_str a, struct tensor_str b) {
    return a.len == b.len && (a.len == 0 || memcmp(a.p, b.p, a.len) == 0);
}
/* Byte-wise order (as unsigned bytes), a shorter prefix first: <0, 0, >0. */
int tensor_str_cmp(struct tensor_str a, struct tensor_str b);
/* FNV-1a over the bytes: equal strings hash equal, NULs included. */
uint64_t tensor_str_hash(struct tensor_str s);

/* Size of one element in bytes; 0 for DT_UNDEFINED, sizeof(struct tensor_str) for DT_STRING. */
size_t dtype_size(enum dtype dt);
/* Bits per element in ONNX's serialized form: 4 for int4, uint4 and
 * float4e2m1, 2 for int2 and uint2, 8 * dtype_size otherwise (0 if unknown). */
int dtype_packed_bits(enum dtype dt);
/* 1 for the float8 and float4 dtypes, which kiln decodes with fp8_to_fp32. */
int dtype_is_minifloat(enum dtype dt);
/* KServe names: "FP32", "INT64", "BYTES" (for DT_STRING), "BOOL"...; NULL if none. */
const char *dtype_kserve_name(enum dtype dt);
/* Parses a KServe name; DT_UNDEFINED if unknown. */
enum dtype dtype_from_kserve(const char *name);
/* Triton config names: "TYPE_FP32", "TYPE_STRING"...; NULL if none. */
const char *dtype_config_name(enum dtype dt);
enum dtype dtype_from_config(const char *name);
/* ONNX-style lower-case name for messages: "float", "int64"... */
const char *dtype_name(enum dtype dt);

/* Product of dims (1 for a scalar); -1 if any dim is negative; INT64_MAX on overflow. */
int64_t tensor_numel(const struct tensor *t);
size_t tensor_nbytes(const struct tensor *t);
/* Formats "[1,3,224,224]" into buf; returns buf. */
char *tensor_shape_str(const struct tensor *t, char *buf, size_t cap);
/* 1 if dtypes, ndims and dims are equal. */
int tensor_same_shape(const struct tensor *a, const struct tensor *b);

/* ---- data -------------------------------------------------------------------
 * All functions here are thread-safe (they touch only their arguments). */

/* Bytes of t's data block in the layout above: tensor_nbytes() for
 * fixed-size dtypes; for DT_STRING (t->data must be set) the elements plus
 * every string with its NUL. SIZE_MAX on overflow. */
size_t tensor_data_size(const struct tensor *t);

/* Makes t->data a new owned, uninitialized block of tensor_nbytes(t) bytes,
 * 64-byte aligned, for a fixed-size dtype (a string tensor's block is made
 * with its strings: tensor_strings_pack, tensor_strings_from_prefixed,
 * tensor_copy_rows). 0, or STATUS_NOMEM with t->data NULL. */
int tensor_alloc_data(struct tensor *t);

/* Frees t's owned data block and sets t->data to NULL; NULL data is a no-op. */
void tensor_free_data(struct tensor *t);

/* Makes t->data a new owned block of strings s[0..numel) (numel from t's
 * dims; t->dtype must be DT_STRING): each element's len bytes are copied,
 * NULs included. The previous t->data is not freed (it may be the borrowed
 * element array being packed). 0, or STATUS_NOMEM with t->data unchanged. */
int tensor_strings_pack(struct tensor *t, const struct tensor_str *s);

/* Rows [first, first + count) of t along dims[0]. */
struct tensor_rows {
    const struct tensor *t;
    int64_t first, count;
};

/* Bytes of the block tensor_rows_write makes of the n ranges; the ranges'
 * tensors share dtype and dims after the first (not checked here). */
size_t tensor_rows_size(const struct tensor_rows *src, int n);

/* Writes the n ranges one after the other into buf (cap bytes, at least
 * tensor_rows_size; suitably aligned for pointers and size_t) as one block in the
 * layout above, and describes it in dst: dtype and dims of src[0].t with
 * dims[0] the total count, data = buf. dst does not own buf unless buf came
 * from malloc and the caller says so. STATUS_INVALID if cap is short or a
 * range is outside its tensor or a tensor has no dims. */
int tensor_rows_write(struct tensor *dst, void *buf, size_t cap, const struct tensor_rows *src, int n);

/* The same into a new owned block (dst->data, freed by tensor_free_data).
 * 0, STATUS_INVALID as above, or STATUS_NOMEM; on error dst->data is NULL. */
int tensor_copy_rows(struct tensor *dst, const struct tensor_rows *src, int n);

/* Checks that buf[0..len) holds count length-prefixed strings: no length
 * prefix cut short, no length running past the buffer, count elements. With
 * used NULL, bytes left over after them are an error too; otherwise they are
 * allowed and *used gets the bytes the count elements take. 0, or
 * STATUS_INVALID with err saying which element is wrong (err may be NULL).
 * Reads nothing outside buf. */
int tensor_strings_check(const void *buf, size_t len, int64_t count, size_t *used, char *err, size_t err_len);

/* The length-prefixed strings buf[0..len) holds whole (bytes after the
 * last whole one must be a malformed element), or -1 when one is malformed. */
int64_t tensor_strings_count(const void *buf, size_t len);

/* Checks buf (tensor_strings_check, count = numel of t's dims) and makes
 * t->data a new owned block of its strings (t->dtype must be DT_STRING).
 * 0, STATUS_INVALID (err set), or STATUS_NOMEM; t->data is NULL on error. */
int tensor_strings_from_prefixed(struct tensor *t, const void *buf, size_t len, char *err, size_t err_len);

/* Bytes of t's strings length-prefixed (SIZE_MAX on overflow), and writing
 * them to out, which has that many bytes. A string longer than 4 GiB - 1 is
 * not representable: tensor_strings_prefixed_size returns SIZE_MAX for it. */
size_t tensor_strings_prefixed_size(const struct tensor *t);
void tensor_strings_prefixed_write(const struct tensor *t, void *out);

/* Element i of a numeric t (every fixed-size dtype but the sub-byte and
 * float8 ones, which give 0) as a double: exact but for 64-bit integers
 * past 2^53. */
double tensor_elem_f64(const struct tensor *t, int64_t i);

/* IEEE half and bfloat16 conversions. */
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

/* float8 (the four DT_FP8* dtypes) and float4e2m1, bit patterns in a byte.
 * fp8_to_fp32 is exact. fp8_from_double rounds v once, to nearest with ties
 * to even, as ONNX's Cast specifies; with saturate, inf and values beyond
 * the largest finite value become that value (signed), NaN stays NaN;
 * without it they become inf (float8e5m2) or NaN (the others). -0 becomes 0
 * in the FNUZ dtypes, which have no -0. float4e2m1 always saturates and,
 * having no NaN, gives NaN as a zero whose sign bit is NaN's inverted (what
 * ONNX's reference implementation gives). dt outside these: 0 / NaN. */
float fp8_to_fp32(uint8_t bits, enum dtype dt);
uint8_t fp8_from_double(double v, enum dtype dt, int saturate);

/* float8e8m0 (decoded by fp8_to_fp32): v's float32 exponent field, rounded
 * as Cast's round_mode says from the mantissa below it: "up", any fraction
 * adds one; "down", none does; "nearest", the top mantissa bit decides and a
 * tie goes up (but not for a float32 subnormal), as ONNX's reference
 * computes it. NaN and inf give NaN (0xFF); with saturate a rounding never
 * reaches 0xFF. The sign is ignored (ONNX leaves negative values
 * unspecified). */
enum e8m0_round { E8M0_ROUND_UP, E8M0_ROUND_DOWN, E8M0_ROUND_NEAREST };
uint8_t fp8e8m0_from_float(float v, int saturate, enum e8m0_round mode);

/* int4/uint4/int2/uint2: v's integer part wrapped into the dtype's bits
 * (ONNX's Cast: an out-of-range integer keeps its low bits); NaN, inf and
 * |v| >= 2^63 give 0. The result is the in-memory byte (sign-extended for
 * the signed dtypes). */
uint8_t lowbit_from_double(double v, enum dtype dt);
uint8_t lowbit_from_int(int64_t v, enum dtype dt);
/* The value of an in-memory int4/uint4/int2/uint2 byte. */
static inline int64_t lowbit_value(uint8_t b, enum dtype dt) {
    return dt == DT_INT4 || dt == DT_INT2 ? (int64_t)(int8_t)b : (int64_t)b;
}

/* ONNX's packed form of n elements of a 4- or 2-bit dtype (dtype_packed_bits
 * < 8) to kiln's one byte per element, and back. unpack reads
 * ceil(n * bits / 8) bytes of src and sign-extends the signed dtypes; pack
 * writes that many bytes (the unused high bits of the last byte 0). */
void tensor_unpack_bits(const uint8_t *src, uint8_t *dst, int64_t n, enum dtype dt);
void tensor_pack_bits(const uint8_t *src, uint8_t *dst, int64_t n, enum dtype dt);
/* Bytes of n elements of dt in ONNX's serialized form; SIZE_MAX on overflow. */
size_t dtype_packed_size(enum dtype dt, int64_t n);

#endif
