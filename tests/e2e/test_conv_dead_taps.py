"""Convolutions whose kernel taps read only padding (dilation reaching past
the map, DeepLabV3's ASPP): kiln cuts the window to the taps that read the
input. The answers must be onnxruntime's, on every ISA oneDNN picks code
for, with strides, asymmetric pads, groups and taps cut on one axis only."""
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, numpy_helper

from conftest import kiln_run

CASES = {
    # name: (input NCHW, W shape, attributes)
    "aspp_d24": ((1, 32, 16, 16), (24, 32, 3, 3), dict(dilations=[24, 24], pads=[24, 24, 24, 24])),
    "aspp_d36": ((2, 16, 16, 16), (16, 16, 3, 3), dict(dilations=[36, 36], pads=[36, 36, 36, 36])),
    "aspp_d12": ((1, 16, 16, 16), (16, 16, 3, 3), dict(dilations=[12, 12], pads=[12, 12, 12, 12])),
    "one_axis": ((1, 8, 5, 20), (8, 8, 3, 3), dict(dilations=[6, 2], pads=[6, 2, 6, 2])),
    "strided_asym": ((1, 8, 9, 9), (12, 8, 3, 5), dict(dilations=[10, 1], pads=[10, 2, 11, 2], strides=[2, 2])),
    "grouped": ((1, 16, 8, 8), (16, 4, 3, 3), dict(dilations=[9, 9], pads=[9, 9, 9, 9], group=4)),
    "one_d": ((1, 8, 12), (8, 8, 5), dict(dilations=[7], pads=[14, 14])),
}


def conv_model(xshape, wshape, attrs, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(wshape).astype(np.float32)
    b = rng.standard_normal(wshape[0]).astype(np.float32)
    node = oh.make_node("Conv", ["x", "W", "B"], ["y"], kernel_shape=list(wshape[2:]), **attrs)
    g = oh.make_graph([node], "c", [oh.make_tensor_value_info("x", TP.FLOAT, list(xshape))],
                      [oh.make_tensor_value_info("y", TP.FLOAT, None)],
                      [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("isa", ["native", "AVX2"])
@pytest.mark.parametrize("name", list(CASES))
def test_dead_taps_cut_exactly(tmp_path, monkeypatch, name, isa):
    if isa != "native":
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    xshape, wshape, attrs = CASES[name]
    m = conv_model(xshape, wshape, attrs, seed=len(name))
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    x = np.random.default_rng(7).standard_normal(xshape).astype(np.float32)
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    (got,) = kiln_run(path, {"x": x}, ["y"], tmp_path)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# Taps live over part of the map (the window reaches past it at most output
# positions): without AVX-512, each live tap runs as a product over the
# rectangle it reads. Plain activations alone, and inside a channels-last
# run of convolutions (the 1x1 convolutions around it), with a fused
# activation, a batch of two, a 5x5 window and asymmetric pads.
PARTIAL = {
    # name: (input NCHW, W shape, attributes, taps that run, share of the window's work)
    "aspp_d12": ((1, 24, 16, 16), (16, 24, 3, 3), dict(dilations=[12, 12], pads=[12, 12, 12, 12]), 9, 25),
    "aspp_d6_batch": ((2, 16, 12, 12), (8, 16, 3, 3), dict(dilations=[6, 6], pads=[6, 6, 6, 6]), 9, 44),
    "five_asym": ((1, 8, 10, 14), (12, 8, 5, 5), dict(dilations=[4, 5], pads=[8, 9, 7, 10]), 25, 29),
    "one_axis": ((1, 8, 9, 30), (8, 8, 3, 3), dict(dilations=[8, 1], pads=[8, 1, 8, 1]), 9, 40),
    "mostly_live": ((1, 8, 16, 16), (8, 8, 3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2]), None, 84),  # oneDNN
}


def partial_model(xshape, wshape, attrs, context, seed):
    """The dilated Conv (bias, Relu), alone or between two 1x1 Convs."""
    rng = np.random.default_rng(seed)
    c = xshape[1]
    inits = [numpy_helper.from_array(rng.standard_normal(wshape).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(wshape[0]).astype(np.float32), "B")]
    src, nodes = "x", []
    if context:
        inits += [numpy_helper.from_array(rng.standard_normal((c, c, 1, 1)).astype(np.float32) * 0.3, "W0"),
                  numpy_helper.from_array(rng.standard_normal((wshape[0], wshape[0], 1, 1)).astype(np.float32) * 0.3,
                                          "W2")]
        nodes.append(oh.make_node("Conv", ["x", "W0"], ["x0"], kernel_shape=[1, 1]))
        src = "x0"
    nodes += [oh.make_node("Conv", [src, "W", "B"], ["c"], kernel_shape=list(wshape[2:]), **attrs),
              oh.make_node("Relu", ["c"], ["r"])]
    out = "r"
    if context:
        nodes.append(oh.make_node("Conv", ["r", "W2"], ["y"], kernel_shape=[1, 1]))
        out = "y"
    g = oh.make_graph(nodes, "c", [oh.make_tensor_value_info("x", TP.FLOAT, list(xshape))],
                      [oh.make_tensor_value_info(out, TP.FLOAT, None)], inits)
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    return m, out


@pytest.mark.parametrize("isa", ["native", "AVX2", "SSE41"])
@pytest.mark.parametrize("context", [False, True])
@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("name", list(PARTIAL))
def test_partly_live_taps_as_products(tmp_path, name, context, threads, isa):
    """onnxruntime's answer; below AVX-512 the log names the tap products
    (their count and share of the window's work) where half the work or
    less is live, and oneDNN keeps the rest (AVX-512 skips the padding
    itself)."""
    import os
    xshape, wshape, attrs, ntaps, share = PARTIAL[name]
    m, out = partial_model(xshape, wshape, attrs, context, seed=len(name))
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    x = np.random.default_rng(7).standard_normal(xshape).astype(np.float32)
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    env = {**os.environ, "KILN_STEP_THREADS": "0"}
    if isa != "native":
        env["ONEDNN_MAX_CPU_ISA"] = isa
    log = []
    (got,) = kiln_run(path, {"x": x}, [out], tmp_path, ["--threads", threads, "--log-level", "debug"], env, log)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    import re
    said = re.search(r"(\d+) live taps as products \((\d+)% of the window's work\)", log[0])
    if isa == "native" or ntaps is None:
        assert not said, log[0]
    else:
        assert said and (int(said.group(1)), int(said.group(2))) == (ntaps, share), log[0]
