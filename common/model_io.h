/* model_io.h - what a model says about one of its inputs or outputs.
 *
 * A plain value shared by the engine (models/model.h fills it from the ONNX
 * file) and the model configuration (config/model_config.h checks and
 * completes a config.json against it), so neither has to know the other. */
#ifndef KILN_MODEL_IO_H
#define KILN_MODEL_IO_H

#include <stdint.h>

#include "common/tensor.h"

struct model_io {
    const char *name;
    enum dtype dtype;
    int ndim;                         /* -1 if the rank is unknown */
    int64_t dims[TENSOR_MAX_DIMS];    /* -1 for a symbolic or unknown dim */
    const char *dim_param[TENSOR_MAX_DIMS]; /* a symbolic dim's name in the file, or NULL (borrowed) */
};

#endif
