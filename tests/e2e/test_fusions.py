"""Patterns exporters write that kiln fuses: exact GELU, x * 0.5 * (1 + erf(x
/ sqrt(2))) in its two product orders (and Mul by 1/sqrt(2)), GPT-2's and
jax2tf's tanh GELU, and hard-swish as Paddle2ONNX and older torch exports
write it, after a MatMul with bias. The answer equals onnxruntime's and no
Erf (or Pow) runs (KILN_PROFILE lists the op types that ran); a near-miss
constant is left as it is."""
import os
import subprocess

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, numpy_helper as nh

from conftest import KILN


def save_after_linear(path, name, nodes, consts, seed):
    """A model y = nodes(h) with h = x @ W + B (x [4, 16], y [4, 32]) and
    float scalar constants consts, saved at path."""
    rng = np.random.default_rng(seed)
    w = nh.from_array(rng.standard_normal((16, 32)).astype(np.float32), "W")
    b = nh.from_array(rng.standard_normal(32).astype(np.float32), "B")
    head = [oh.make_node("MatMul", ["x", "W"], ["mm"]), oh.make_node("Add", ["mm", "B"], ["h"])]
    g = oh.make_graph(head + nodes, name, [oh.make_tensor_value_info("x", TP.FLOAT, [4, 16])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, [4, 32])],
                      [w, b] + [nh.from_array(np.array(v, np.float32), k) for k, v in consts.items()])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


def run_profiled(tmp_path, x):
    """kiln's y for x on tmp_path/m.onnx with the op types that ran (KILN_PROFILE's
    lines on stderr), and onnxruntime's."""
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([str(KILN), "run", str(tmp_path / "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}",
                        "--output-dir", str(tmp_path / "out"), "--quiet"], capture_output=True, text=True,
                       env={**os.environ, "KILN_PROFILE": "1"}, timeout=60)
    assert r.returncode == 0, r.stderr
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})[0]
    return r.stderr, np.load(tmp_path / "out" / "y.npy"), want


def gelu_model(path, order, div=True, sqrt2=1.4142135623730951):
    nodes = [oh.make_node("Div" if div else "Mul", ["h", "s"], ["d"]), oh.make_node("Erf", ["d"], ["e"]),
             oh.make_node("Add", ["one", "e"], ["a"])]
    if order == "x_a_half":
        nodes += [oh.make_node("Mul", ["h", "a"], ["m"]), oh.make_node("Mul", ["m", "half"], ["y"])]
    else:
        nodes += [oh.make_node("Mul", ["h", "half"], ["m"]), oh.make_node("Mul", ["a", "m"], ["y"])]
    save_after_linear(path, "gelu", nodes, {"s": sqrt2 if div else 1 / sqrt2, "one": 1.0, "half": 0.5}, 0)


@pytest.mark.parametrize("order,div,sqrt2,fused", [("x_a_half", True, 1.4142135623730951, True),
                                                   ("half_first", True, 1.4142135623730951, True),
                                                   ("x_a_half", False, 1.4142135623730951, True),
                                                   ("x_a_half", True, 1.5, False)])
def test_gelu_fused(tmp_path, order, div, sqrt2, fused):
    gelu_model(tmp_path / "m.onnx", order, div, sqrt2)
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    err, got, want = run_profiled(tmp_path, x)
    assert (" Erf " not in err) == fused, err
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def gelu_tanh_model(path, order, cube_coef=0.044715):
    """GPT-2's NewGELU after a MatMul with bias, as torch.onnx writes it:
    0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))); order "jax" as
    jax2tf writes it (magika): the cube as x * (x * (x * 0.044715)), the end
    as x * (0.5 * a)."""
    if order == "jax":
        cube = [oh.make_node("Mul", ["coef", "h"], ["r"]), oh.make_node("Mul", ["h", "r"], ["r2"]),
                oh.make_node("Mul", ["h", "r2"], ["q"])]
    else:
        cube = [oh.make_node("Pow", ["h", "three"], ["p"]), oh.make_node("Mul", ["coef", "p"], ["q"])]
    nodes = cube + [oh.make_node("Add", ["h", "q"], ["s"]), oh.make_node("Mul", ["k", "s"], ["u"]),
                    oh.make_node("Tanh", ["u"], ["t"]), oh.make_node("Add", ["one", "t"], ["a"])]
    if order == "jax":
        nodes += [oh.make_node("Mul", ["half", "a"], ["m"]), oh.make_node("Mul", ["h", "m"], ["y"])]
    elif order == "x_a_half":
        nodes += [oh.make_node("Mul", ["h", "a"], ["m"]), oh.make_node("Mul", ["m", "half"], ["y"])]
    else:
        nodes += [oh.make_node("Mul", ["half", "h"], ["m"]), oh.make_node("Mul", ["m", "a"], ["y"])]
    save_after_linear(path, "gelu_tanh", nodes, {"three": 3.0, "coef": cube_coef, "k": 0.7978845608028654,
                                                 "one": 1.0, "half": 0.5}, 2)


@pytest.mark.parametrize("order,coef,fused", [("x_a_half", 0.044715, True), ("half_first", 0.044715, True),
                                              ("jax", 0.044715, True), ("half_first", 0.05, False),
                                              ("jax", 0.05, False)])
def test_gelu_tanh_fused(tmp_path, order, coef, fused):
    """The tanh form becomes one Gelu(approximate="tanh"): no Tanh or Pow
    runs, the answer is onnxruntime's within float32 rounding (x * x * x for
    the cube); a near-miss constant is left as it is."""
    gelu_tanh_model(tmp_path / "m.onnx", order, coef)
    x = (3 * np.random.default_rng(1).standard_normal((4, 16))).astype(np.float32)
    err, got, want = run_profiled(tmp_path, x)
    assert (" Pow " not in err and " Tanh " not in err and " Gelu " in err) == fused, err
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def hardswish_model(path, form, six=6.0):
    """Hard-swish after a MatMul with bias: "clip_div" as Paddle2ONNX writes
    it, x * Clip(x + 3, 0, 6) / 6; "clip_mul" with Mul by 1/6 instead;
    "hardsigmoid" as torch wrote it before opset 14, x * HardSigmoid(x)."""
    if form == "hardsigmoid":
        nodes = [oh.make_node("HardSigmoid", ["h"], ["s"], alpha=1 / six, beta=0.5),
                 oh.make_node("Mul", ["h", "s"], ["y"])]
    else:
        nodes = [oh.make_node("Add", ["h", "three"], ["a"]), oh.make_node("Clip", ["a", "zero", "six"], ["c"]),
                 oh.make_node("Mul", ["h", "c"], ["m"])]
        nodes += [oh.make_node("Div", ["m", "six"], ["y"])] if form == "clip_div" else \
                 [oh.make_node("Mul", ["sixth", "m"], ["y"])]
    save_after_linear(path, "hardswish", nodes, {"three": 3.0, "zero": 0.0, "six": six, "sixth": 1 / six}, 3)


@pytest.mark.parametrize("form,six,fused", [("clip_div", 6.0, True), ("clip_mul", 6.0, True),
                                            ("hardsigmoid", 6.0, True), ("clip_div", 5.0, False),
                                            ("hardsigmoid", 5.0, False)])
def test_hardswish_fused(tmp_path, form, six, fused):
    """Each form becomes one HardSwish, which then runs as the MatMul's
    post-op: no Clip, Div or HardSigmoid runs, and the answer is
    onnxruntime's within float32 rounding; another bound is left as it is."""
    hardswish_model(tmp_path / "m.onnx", form, six)
    x = (3 * np.random.default_rng(4).standard_normal((4, 16))).astype(np.float32)
    err, got, want = run_profiled(tmp_path, x)
    ran = {w for w in ("Clip", "Div", "HardSigmoid", "Add") if f" {w} " in err}
    assert (not ran) == fused, err
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
