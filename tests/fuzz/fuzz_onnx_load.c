/* fuzz_onnx_load.c - libFuzzer target for the ONNX loader.
 *
 * Each input is parsed twice: as a ModelProto through onnx_load_buffer (the
 * whole path: wire scan, protobuf-c, tensors, attributes, op lookup,
 * toposort) and as a bare TensorProto through onnx_tensor_from_proto (the
 * typed-field and raw-data checks that test data and `kiln run` inputs use).
 * External data is refused (no base folder), so no file is ever opened.
 * tools/fuzz.sh reads the build and seed lines below. */
// fuzz-sources: common/*.c graph/graph.c models/onnx_load.c kernels/ops.c kernels/cpu/*.c
// fuzz-corpus: .venv/lib/python3.11/site-packages/onnx/backend/test/data/node/*/model.onnx
// fuzz-corpus: .venv/lib/python3.11/site-packages/onnx/backend/test/data/node/test_[a-c]*/test_data_set_0/input_0.pb
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>

#include "graph/graph.h"
#include "models/onnx_load.h"
#include "onnx/onnx.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    struct graph *g = onnx_load_buffer(data, size, NULL, err, sizeof err);
    if (!g && !err[0]) __builtin_trap(); /* every failure must say why */
    graph_free(g);

    Onnx__TensorProto *tp = onnx__tensor_proto__unpack(NULL, size, data);
    if (tp) {
        struct tensor t;
        if (onnx_tensor_from_proto(tp, NULL, &t, err, sizeof err) == 0) onnx_tensor_clear(&t);
        onnx__tensor_proto__free_unpacked(tp, NULL);
    }
    return 0;
}
