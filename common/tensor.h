/* tensor.h - datatypes and the plain tensor descriptor shared by every module.
 *
 * dtype values are ONNX's TensorProto.DataType numbers so that loading needs
 * no table. A tensor is a plain struct: it does not own its data unless the
 * code that made it says so. Dims are int64; -1 means "not known yet"
 * (symbolic or dynamic) and is only legal in metadata, never in a tensor
 * that carries data. */
#ifndef KILN_TENSOR_H
#define KILN_TENSOR_H

#include <stddef.h>
#include <stdint.h>

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
    DT_STRING = 8, /* data is an array of char * (NUL-terminated, owned with the tensor) */
    DT_BOOL = 9,   /* one byte, 0 or 1 */
    DT_FP16 = 10,
    DT_FP64 = 11,
    DT_UINT32 = 12,
    DT_UINT64 = 13,
    DT_BF16 = 16,
    DT_MAX_ = 17,
};

struct tensor {
    enum dtype dtype;
    int ndim;
    int64_t dims[TENSOR_MAX_DIMS];
    void *data;
};

/* Size of one element in bytes; 0 for DT_UNDEFINED, sizeof(char *) for DT_STRING. */
size_t dtype_size(enum dtype dt);
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

/* IEEE half and bfloat16 conversions. */
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

#endif
