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
