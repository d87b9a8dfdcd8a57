"""QuantizeLinear -> DequantizeLinear after a float convolution, as QDQ
models run where oneDNN's integer convolutions would not pay (no VNNI:
capped at AVX2 here). kiln applies the pair as the Conv's activation
(scale * clip(round(x / scale), ...)); the Conv's own Relu or Clip goes
with it only where the quantization clips at least as tightly. The answer
stays within one quantization step of ONNX's reference evaluator (kiln
multiplies by 1 / scale where QuantizeLinear divides, and sums in another
order) and QuantizeLinear no longer runs where the pair fused."""
import os
import re
import subprocess

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto as TP, numpy_helper as nh

from conftest import KILN, onnx_reference


def qdq_conv_model(path, act, qtype, scale, zero):
    """x -> Q/DQ (the input's own quantization) -> Conv (int8 weights
    dequantized per channel, float bias) -> act -> Q(scale, zero) -> DQ -> y."""
    rng = np.random.default_rng(3)
    wq = rng.integers(-127, 128, (16, 8, 3, 3)).astype(np.int8)
    ws = (rng.uniform(0.5, 1.5, 16) * 0.004).astype(np.float32)
    zt = np.uint8 if qtype == "u8" else np.int8
    inits = [nh.from_array(wq, "Wq"), nh.from_array(ws, "Ws"), nh.from_array(np.zeros(16, np.int8), "Wz"),
             nh.from_array(rng.standard_normal(16).astype(np.float32) * 0.1, "B"),
             nh.from_array(np.array(0.02, np.float32), "xs"), nh.from_array(np.array(128, np.uint8), "xz"),
             nh.from_array(np.array(scale, np.float32), "ys"), nh.from_array(np.array(zero, zt), "yz")]
    nodes = [oh.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             oh.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             oh.make_node("DequantizeLinear", ["Wq", "Ws", "Wz"], ["W"], axis=0),
             oh.make_node("Conv", ["xd", "W", "B"], ["c"], pads=[1, 1, 1, 1])]
    h = "c"
    if act == "relu":
        nodes.append(oh.make_node("Relu", ["c"], ["a"]))
        h = "a"
    elif act.startswith("clip"):
        lo, hi = {"clip06": (0.0, 6.0), "clip01": (0.0, 1.0)}[act]
        inits += [nh.from_array(np.array(lo, np.float32), "lo"), nh.from_array(np.array(hi, np.float32), "hi")]
        nodes.append(oh.make_node("Clip", ["c", "lo", "hi"], ["a"]))
        h = "a"
    nodes += [oh.make_node("QuantizeLinear", [h, "ys", "yz"], ["yq"]),
              oh.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    g = oh.make_graph(nodes, "qdq_conv", [oh.make_tensor_value_info("x", TP.FLOAT, [1, 8, 12, 12])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, [1, 16, 12, 12])], inits)
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return m


# (activation, output type, scale, zero point, fused)
CASES = [("clip06", "u8", 6 / 255, 0, True),     # the MobileNet pattern: the Clip is the quantization's own range
         ("clip01", "u8", 0.01, 0, False),       # a Clip inside the range: kept, and the pair with it
         ("relu", "u8", 0.01, 0, True),          # Relu below a uint8 zero point of 0 changes nothing
         ("relu", "s8", 0.01, 0, False),         # int8 keeps negatives: the Relu matters
         ("none", "s8", 0.015, 3, True),
         ("none", "u8", 0.012, 131, True)]


@pytest.mark.parametrize("act,qtype,scale,zero,fused", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_quantization_round_trip_in_conv(tmp_path, act, qtype, scale, zero, fused):
    model = qdq_conv_model(tmp_path / "m.onnx", act, qtype, scale, zero)
    x = (np.random.default_rng(5).standard_normal((1, 8, 12, 12)) * 1.5).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([str(KILN), "run", str(tmp_path / "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}",
                        "--output-dir", str(tmp_path / "out"), "--log-level", "debug"], capture_output=True,
                       text=True, env={**os.environ, "KILN_PROFILE": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"}, timeout=60)
    assert r.returncode == 0, r.stderr
    m = re.search(r"(\d+) quantization round trips in float convolutions", r.stderr)
    assert m, r.stderr[-3000:]
    assert int(m.group(1)) == (1 if fused else 0), r.stderr[-3000:]
    # The input's own QuantizeLinear still runs; the output's goes where it fused.
    calls = re.search(r"QuantizeLinear +[\d.]+ ms/run +[\d.]+% +(\d+) calls", r.stderr)
    assert calls and int(calls.group(1)) == (1 if fused else 2), r.stderr[-3000:]
    got = np.load(tmp_path / "out" / "y.npy")
    want = onnx_reference(model, {"x": x})[0]
    assert got.shape == want.shape
    steps = np.abs(got - want) / scale
    assert steps.max() <= 1.0001, steps.max()
    # Off by a step only where a value lies within rounding of a half.
    assert np.mean(steps > 0.5) < 0.01, np.mean(steps > 0.5)
    # Every value is on the quantization grid, within its range.
    q = got / scale + zero
    assert np.abs(q - np.round(q)).max() < 1e-3
    lo, hi = (0, 255) if qtype == "u8" else (-128, 127)
    assert np.round(q).min() >= lo and np.round(q).max() <= hi
