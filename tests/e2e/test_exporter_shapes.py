"""Shapes real exporters write that once took kiln's slow paths, each
against onnxruntime: tf2onnx's Conv1D as a 2-D convolution over
[N, C, H, 1] with a [k, 1] kernel (run with its positions along W), and
Slices and Transposes of tensors with axes of one element (one memcpy, not
a row per element), channels-last and plain, with pads, strides, dilation,
groups and a bias."""
import os
import subprocess

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, numpy_helper as nh

from conftest import KILN


def run_both(tmp_path, model, feeds, env=None):
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    args = [str(KILN), "run", str(path), "--backend", "cpu", "--output-dir", str(tmp_path / "out"), "--quiet"]
    for k, v in feeds.items():
        np.save(tmp_path / f"{k}.npy", v)
        args += ["--input", f"{k}={tmp_path / (k + '.npy')}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    outs = [o.name for o in model.graph.output]
    return [np.load(tmp_path / "out" / f"{k}.npy") for k in outs], want


@pytest.mark.parametrize("c,m,h,k,stride,dil,pads,group,bias", [
    (256, 512, 64, 5, 1, 1, (0, 0), 1, False),   # magika's layer, shorter
    (16, 24, 50, 3, 2, 1, (1, 2), 1, True),
    (12, 12, 33, 5, 1, 2, (4, 4), 12, True),     # depthwise, dilated
    (8, 16, 7, 1, 1, 1, (0, 0), 2, False),       # 1x1, grouped
])
@pytest.mark.parametrize("layout", ["auto", "plain", "blocked"])
def test_conv_one_column(tmp_path, c, m, h, k, stride, dil, pads, group, bias, layout):
    rng = np.random.default_rng(c + m + h)
    w = nh.from_array((rng.standard_normal((m, c // group, k, 1)) / np.sqrt(c * k / group)).astype(np.float32), "W")
    inits = [w] + ([nh.from_array(rng.standard_normal(m).astype(np.float32), "B")] if bias else [])
    node = oh.make_node("Conv", ["x", "W"] + (["B"] if bias else []), ["y"], kernel_shape=[k, 1], strides=[stride, 1],
                        dilations=[dil, 1], pads=[pads[0], 0, pads[1], 0], group=group)
    g = oh.make_graph([node], "conv1col", [oh.make_tensor_value_info("x", TP.FLOAT, [2, c, h, 1])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.standard_normal((2, c, h, 1)).astype(np.float32)
    env = {} if layout == "auto" else {"KILN_CONV_LAYOUT": layout}
    (got,), (want,) = run_both(tmp_path, model, {"x": x}, env)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("shape,starts,ends,axes,steps", [
    ([1, 64, 37, 1], [0, 0, 0, 0], [1, 64, 37, 1], [0, 1, 2, 3], [1, 1, 1, 1]),      # all of it (tf2onnx)
    ([1, 64, 37, 1], [0, 3, 2, 0], [1, 60, 30, 1], [0, 1, 2, 3], [1, 2, 3, 1]),      # strided, inner axis of one
    ([3, 1, 20, 1, 5], [1, 0, 4, 0, 1], [3, 1, 18, 1, 5], [0, 1, 2, 3, 4], [1, 1, 1, 1, 1]),
    ([2, 1, 9, 1], [1, 0, 8, 0], [-3, 1, 0, 1], [0, 1, 2, 3], [1, 1, -2, 1]),        # reversed
    ([1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 2, 3], [1, 1, 1, 1]),          # one element
])
def test_slice_with_unit_axes(tmp_path, shape, starts, ends, axes, steps):
    consts = [nh.from_array(np.array(v, np.int64), n) for n, v in
              (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))]
    nodes = [oh.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["s"]),
             oh.make_node("Transpose", ["s"], ["y"], perm=list(range(len(shape)))[::-1])]
    g = oh.make_graph(nodes, "slice1", [oh.make_tensor_value_info("x", TP.FLOAT, shape)],
                      [oh.make_tensor_value_info("s", TP.FLOAT, None), oh.make_tensor_value_info("y", TP.FLOAT, None)],
                      consts)
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    got, want = run_both(tmp_path, model, {"x": x})
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape,perm", [
    ([1024, 2, 16, 2], [0, 2, 1, 3]),       # MobileViT's patch unfolding: rows of two values
    ([1, 64, 256, 4], [0, 3, 2, 1]),        # its fold: every row gathered
    ([4, 256, 3, 4, 16], [2, 0, 3, 1, 4]),  # its heads split
    ([3, 5, 7, 11, 13], [4, 2, 0, 3, 1]),   # nothing merges: odd sizes on every axis
    ([2, 3, 1, 5], [3, 2, 1, 0]),           # an axis of one, fewer rows than threads
])
@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "float16"])
@pytest.mark.parametrize("threads", ["1", "2"])
def test_transpose_strided_rows(tmp_path, shape, perm, dtype, threads):
    """Permutations that are neither a copy of rows nor a batched 2-D
    transpose take the strided copy: rows in chunks on the threads (above
    32768 values), each chunk's rows walked without a division per axis.
    numpy's transpose, element for element, at one and two
    threads and for 1-, 2-, 4- and 8-byte elements."""
    elem = {"float32": TP.FLOAT, "int64": TP.INT64, "uint8": TP.UINT8, "float16": TP.FLOAT16}[dtype]
    g = oh.make_graph([oh.make_node("Transpose", ["x"], ["y"], perm=perm)], "t",
                      [oh.make_tensor_value_info("x", elem, shape)], [oh.make_tensor_value_info("y", elem, None)])
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    x = (np.arange(np.prod(shape)) % 251).astype(dtype).reshape(shape)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([str(KILN), "run", str(path), "--backend", "cpu", "--threads", threads, "--output-dir",
                        str(tmp_path / "out"), "--quiet", "--input", f"x={tmp_path / 'x.npy'}"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "KILN_STEP_THREADS": "0"})
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), np.transpose(x, perm))
