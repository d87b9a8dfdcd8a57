"""Concat, Sum, Max and Min with more inputs than one kernel call takes (a
detection export concatenates ~100 anchor tensors): loaded as a tree of
nodes, the answer equals onnxruntime's; another op with that many inputs is
refused in words."""
import subprocess

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP

from conftest import KILN


def run_kiln(model_path, feeds, tmp_path):
    args = [str(KILN), "run", str(model_path), "--output-dir", str(tmp_path), "--quiet"]
    for name, arr in feeds.items():
        np.save(tmp_path / f"{name}.npy", arr)
        args += ["--input", f"{name}={tmp_path / (name + '.npy')}"]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("op,n", [("Concat", 150), ("Concat", 4100), ("Sum", 100), ("Max", 65), ("Min", 130)])
def test_wide_node_equals_onnxruntime(tmp_path, op, n):
    rng = np.random.default_rng(n)
    ins = [f"x{i}" for i in range(n)]
    attrs = {"axis": 1} if op == "Concat" else {}
    # Inputs of 1, 2 or 3 columns for Concat (as anchors per level differ); broadcasting rows for the others.
    shapes = [[2, 1 + i % 3] if op == "Concat" else ([2, 3] if i % 2 else [1, 3]) for i in range(n)]
    out_shape = [2, sum(s[1] for s in shapes)] if op == "Concat" else [2, 3]
    g = oh.make_graph([oh.make_node(op, ins, ["y"], **attrs)], "wide",
                      [oh.make_tensor_value_info(x, TP.FLOAT, s) for x, s in zip(ins, shapes)],
                      [oh.make_tensor_value_info("y", TP.FLOAT, out_shape)])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    feeds = {x: rng.standard_normal(s).astype(np.float32) for x, s in zip(ins, shapes)}
    r = run_kiln(path, feeds, tmp_path)
    assert r.returncode == 0, r.stderr
    want = ort.InferenceSession(str(path)).run(None, feeds)[0]
    got = np.load(tmp_path / "y.npy")
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_other_wide_node_refused(tmp_path):
    ins = [f"x{i}" for i in range(70)]
    g = oh.make_graph([oh.make_node("Mean", ins, ["y"])], "wide",
                      [oh.make_tensor_value_info(x, TP.FLOAT, [2]) for x in ins],
                      [oh.make_tensor_value_info("y", TP.FLOAT, [2])])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    r = run_kiln(tmp_path / "m.onnx", {}, tmp_path)
    assert r.returncode != 0
    assert "has 70 inputs" in r.stderr and "at most 64" in r.stderr, r.stderr
