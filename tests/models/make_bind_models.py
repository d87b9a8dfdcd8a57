#!/usr/bin/env python3
"""Makes a model whose plan needs one small input's value and not another's
(onnx.helper, no weights):

  control_if_rate.onnx   x FLOAT [1, 8] and rate INT64 [] (a scalar); an If on
                         rate == 16000 gives x * 2 of shape [1, 8], else x + 1
                         flattened to [8]: the output's shape follows rate's
                         value, never x's, as silero-vad's If on its sample rate

models/model.c binds into its plans the values of the small inputs that
decide a shape: rate alone here, so new values of x reuse the plan
(tests/models/test_model.c). The file is kept in tests/data/control/.

Usage: make_bind_models.py [--out tests/data/control]
"""
import argparse
import os

import onnx
import onnx.helper as oh
from onnx import TensorProto as TP


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/control")
    a = ap.parse_args()
    two = oh.make_tensor("two", TP.FLOAT, [], [2.0])
    one = oh.make_tensor("one", TP.FLOAT, [], [1.0])
    then_g = oh.make_graph([oh.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                           [oh.make_tensor_value_info("t", TP.FLOAT, [1, 8])], [two])
    flat = oh.make_tensor("flat", TP.INT64, [1], [8])
    else_g = oh.make_graph([oh.make_node("Add", ["x", "one"], ["s"]), oh.make_node("Reshape", ["s", "flat"], ["e"])],
                           "else", [], [oh.make_tensor_value_info("e", TP.FLOAT, [8])], [one, flat])
    rate16k = oh.make_tensor("rate16k", TP.INT64, [], [16000])
    g = oh.make_graph(
        [oh.make_node("Equal", ["rate", "rate16k"], ["is16k"]),
         oh.make_node("If", ["is16k"], ["y"], then_branch=then_g, else_branch=else_g)],
        "if_rate",
        [oh.make_tensor_value_info("x", TP.FLOAT, [1, 8]), oh.make_tensor_value_info("rate", TP.INT64, [])],
        [oh.make_value_info("y", oh.make_tensor_type_proto(TP.FLOAT, None))], [rate16k])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    os.makedirs(a.out, exist_ok=True)
    onnx.save(m, os.path.join(a.out, "control_if_rate.onnx"))


if __name__ == "__main__":
    main()
