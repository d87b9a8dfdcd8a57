"""Patterns exporters write that kiln fuses: exact GELU, x * 0.5 * (1 + erf(x
/ sqrt(2))) in its two product orders (and Mul by 1/sqrt(2)), GPT-2's and
jax2tf's tanh GELU, and hard-swish as Paddle2ONNX and older torch exports
write it, after a MatMul with bias; a scale and shift after a Conv's
activation (PaddleOCR's learnable affine blocks); T5's and Llama's RMSNorm written out.
The answer equals onnxruntime's and no
Erf (or Pow) runs (KILN_PROFILE lists the op types that ran); a near-miss
constant is left as it is."""
import os
import re
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


def run_debug(tmp_path, x, isa):
    """kiln run on tmp_path/m.onnx with x, its debug log and KILN_PROFILE's
    lines on stderr, oneDNN capped at isa ("" for none)."""
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "KILN_PROFILE": "1"}
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    return subprocess.run([str(KILN), "run", str(tmp_path / "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}",
                           "--output-dir", str(tmp_path / "out"), "--quiet", "--log-level", "debug"],
                          capture_output=True, text=True, env=env, timeout=60)


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


def conv_affine_model(path, act, tail, scale_shape=(1,), seed=5):
    """PaddleOCR's learnable affine block after an activated Conv:
    x [1, 8, 13, 11] -> Conv 3x3 (bias, pads 1) -> act -> tail -> Conv 3x3
    (pads 1) -> y. tail: "mul_add" (Mul by a scalar, then Add of one, as
    Paddle2ONNX writes it), "mul", "add", "add_mul" (only the Add fuses:
    the Mul after it is not the pattern), "mul_also_out" (the Mul's input is
    a graph output too: nothing fuses)."""
    rng = np.random.default_rng(seed)
    w1 = nh.from_array((0.3 * rng.standard_normal((8, 8, 3, 3))).astype(np.float32), "W1")
    b1 = nh.from_array(rng.standard_normal(8).astype(np.float32), "B1")
    w2 = nh.from_array((0.3 * rng.standard_normal((4, 8, 3, 3))).astype(np.float32), "W2")
    nodes = [oh.make_node("Conv", ["x", "W1", "B1"], ["c"], pads=[1, 1, 1, 1])]
    consts = [w1, b1, w2, nh.from_array(np.full(scale_shape, 0.75, np.float32), "s"),
              nh.from_array(np.array([-0.4], np.float32), "t")]
    if act == "HardSwish":
        nodes.append(oh.make_node("HardSwish", ["c"], ["h"]))
    elif act == "Clip":
        consts += [nh.from_array(np.array(0, np.float32), "lo"), nh.from_array(np.array(6, np.float32), "hi")]
        nodes.append(oh.make_node("Clip", ["c", "lo", "hi"], ["h"]))
    else:
        nodes.append(oh.make_node(act, ["c"], ["h"]))
    outs = [oh.make_tensor_value_info("y", TP.FLOAT, None)]
    if tail in ("mul_add", "mul_also_out"):
        nodes += [oh.make_node("Mul", ["s", "h"], ["m"]), oh.make_node("Add", ["m", "t"], ["a"])]
        if tail == "mul_also_out":
            outs.append(oh.make_tensor_value_info("h", TP.FLOAT, None))
    elif tail == "mul":
        nodes.append(oh.make_node("Mul", ["h", "s"], ["a"]))
    elif tail == "add":
        nodes.append(oh.make_node("Add", ["t", "h"], ["a"]))
    else:  # add_mul
        nodes += [oh.make_node("Add", ["h", "t"], ["m"]), oh.make_node("Mul", ["m", "s"], ["a"])]
    nodes.append(oh.make_node("Conv", ["a", "W2"], ["y"], pads=[1, 1, 1, 1]))
    g = oh.make_graph(nodes, "conv_affine", [oh.make_tensor_value_info("x", TP.FLOAT, [1, 8, 13, 11])], outs, consts)
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


@pytest.mark.parametrize("isa", ["", "AVX2", "SSE41"])
@pytest.mark.parametrize("act,tail,scale_shape,fused", [
    ("HardSwish", "mul_add", (1,), "Mul and Add"), ("Relu", "mul_add", (), "Mul and Add"),
    ("Clip", "mul", (1,), "Mul"), ("Sigmoid", "add", (1,), "Add"), ("HardSwish", "add_mul", (1,), "Add"),
    ("HardSwish", "mul_also_out", (1,), None), ("HardSwish", "mul_add", (1, 8, 1, 1), None),
    ("HardSigmoid", "mul_add", (1,), None)])
def test_scale_and_shift_after_conv_activation(tmp_path, isa, act, tail, scale_shape, fused):
    """The Mul by a scalar and the Add of one after a Conv's activation run as
    the Conv's last post-op (no Mul or Add runs on its own), at oneDNN's
    widest ISA and capped at AVX2 and SSE4.1, and the answer is onnxruntime's
    within float32 rounding. Left as they are: a per-channel factor (another
    pass folds those where exact), a value something else reads, and an
    activation whose oneDNN form is a linear post-op already (HardSigmoid)."""
    conv_affine_model(tmp_path / "m.onnx", act, tail, scale_shape)
    x = (2 * np.random.default_rng(6).standard_normal((1, 8, 13, 11))).astype(np.float32)
    r = run_debug(tmp_path, x, isa)
    assert r.returncode == 0, r.stderr
    got = re.search(r"fused ([A-Za-z ]+) after the activation into Conv", r.stderr)
    assert (got.group(1) if got else None) == fused, r.stderr
    ran = set(re.findall(r"info\s+(\w+)\s+[0-9.]+ ms/run", r.stderr))  # KILN_PROFILE's op types
    assert "Conv" in ran, r.stderr
    if fused == "Mul and Add":
        assert not ran & {"Mul", "Add"}, ran
    names = [o.name for o in onnx.load(str(tmp_path / "m.onnx")).graph.output]
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})
    for name, w in zip(names, want):
        np.testing.assert_allclose(np.load(tmp_path / "out" / f"{name}.npy"), w, rtol=1e-5, atol=1e-5)


def rmsnorm_model(path, form, C=48, eps=1e-6, seed=7):
    """y = RMSNorm(x) as T5 and Llama export it (x [2, 5, C], w [C]), in the
    written-out form the case names, saved at path; a second output where a
    case gives an intermediate another reader."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 1.5, C if form != "w_2d" else (1, C)).astype(np.float32)
    if form == "w_other_len":
        w = w[: C // 2]
    consts = {"two": np.array(2.0, np.float32), "eps": np.array(eps, np.float32), "one": np.array(1.0, np.float32),
              "w": w}
    nodes = [oh.make_node("Mul", ["x", "x"], ["sq"]) if form == "mul_square" else
             oh.make_node("Pow", ["x", "two"], ["sq"])]
    if form == "axes_input":  # opset 18: axes as an input
        consts["axes"] = np.array([-1], np.int64)
        nodes.append(oh.make_node("ReduceMean", ["sq", "axes"], ["v"], keepdims=1))
    else:
        axes = {"axis_0": [0], "axis_pos": [2]}.get(form, [-1])
        nodes.append(oh.make_node("ReduceMean", ["sq"], ["v"], axes=axes, keepdims=1))
    nodes += [oh.make_node("Add", ["v", "eps"], ["ve"]), oh.make_node("Sqrt", ["ve"], ["s"])]
    if form == "div_x":  # x / sqrt(...)
        nodes.append(oh.make_node("Div", ["x", "s"], ["n"]))
    else:
        nodes.append(oh.make_node("Reciprocal", ["s"], ["r"]) if form == "reciprocal" else
                     oh.make_node("Div", ["one", "s"], ["r"]))
        nodes.append(oh.make_node("Mul", ["r", "x"] if form == "r_first" else ["x", "r"], ["n"]))
    last = "n"
    if form == "cast":
        nodes.append(oh.make_node("Cast", ["n"], ["nc"], to=TP.FLOAT))
        last = "nc"
    nodes.append(oh.make_node("Mul", ["w", last] if form != "x_first" else [last, "w"], ["y"]))
    outs = [oh.make_tensor_value_info("y", TP.FLOAT, None)]
    if form == "s_also_out":
        outs.append(oh.make_tensor_value_info("s", TP.FLOAT, None))
    ins = [oh.make_tensor_value_info("x", TP.FLOAT, [2, 5, C] if form != "unknown_shape" else None)]
    opset = 18 if form == "axes_input" else 17
    g = oh.make_graph(nodes, "rmsnorm", ins, outs, [nh.from_array(v, k) for k, v in consts.items()])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, str(path))


@pytest.mark.parametrize("isa", ["", "AVX2", "SSE41"])
@pytest.mark.parametrize("form,fused", [
    ("pow", True), ("mul_square", True), ("reciprocal", True), ("div_x", True), ("r_first", True),
    ("x_first", True), ("cast", True), ("axes_input", True), ("axis_pos", True), ("unknown_shape", True),
    ("axis_0", False), ("s_also_out", False), ("w_2d", False), ("w_other_len", False)])
def test_rmsnorm_fused(tmp_path, isa, form, fused):
    """T5's and Llama's RMSNorm, written out, runs as one RMSNormalization
    (no ReduceMean, Sqrt or Pow runs) with onnxruntime's answer within
    float32 rounding at oneDNN's widest ISA and capped at AVX2 and SSE4.1.
    Left as it is: a mean over another axis, an intermediate something else
    reads, and a scale that is not one value a channel (w [1, C]; w of half
    the channels, which the graph itself refuses)."""
    rmsnorm_model(tmp_path / "m.onnx", form)
    x = (3 * np.random.default_rng(8).standard_normal((2, 5, 48))).astype(np.float32)
    r = run_debug(tmp_path, x, isa)
    if form == "w_other_len":  # [.., 48] * [24] does not broadcast: both refuse it
        assert r.returncode != 0 and "broadcast" in r.stderr, r.stderr
        with pytest.raises(Exception):
            ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})
        return
    assert r.returncode == 0, r.stderr
    assert ("one RMSNormalization node" in r.stderr) == fused, r.stderr
    ran = set(re.findall(r"info\s+(\w+)\s+[0-9.]+ ms/run", r.stderr))
    assert ("RMSNormalization" in ran and not ran & {"ReduceMean", "Sqrt", "Pow"}) == fused, ran
    names = [o.name for o in onnx.load(str(tmp_path / "m.onnx")).graph.output]
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})
    for name, w in zip(names, want):
        np.testing.assert_allclose(np.load(tmp_path / "out" / f"{name}.npy"), w, rtol=1e-5, atol=1e-5)
