#include "kernels/ops.h"

const struct op_def op_defs_ml[] = {
    {0},
};
