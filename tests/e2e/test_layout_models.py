"""Channels-last activations between convolutions (models/passes_layout.c)
on tests/data/layout/cnn_mix.onnx (tests/models/make_layout_models.py): a
CNN mixing Conv, depthwise Conv, a squeeze-excite Mul, SiLU, a residual Add,
MaxPool, a channel Concat, a bilinear Resize, AveragePool and plain-layout
consumers (Flatten + Gemm, and a feature map that is a graph output). kiln's
outputs equal onnxruntime's at batch 1 and 3, on the CPU's own ISA and on
oneDNN's AVX2 code (ONEDNN_MAX_CPU_ISA), and equal kiln's own with the
planner turned off (KILN_LAYOUT=plain). KILN_PROFILE's list of the ops that
ran shows none was folded away. tests/models/test_plan.c checks which values
the planner keeps channels-last on the same model."""
import os
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from conftest import KILN

MODEL = Path(__file__).resolve().parents[1] / "data" / "layout" / "cnn_mix.onnx"


def kiln_run(tmp_path, x, env, threads=None):
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    r = subprocess.run([str(KILN), "run", str(MODEL), "--backend", "cpu", "--input", f"x={tmp_path / 'x.npy'}",
                        "--output-dir", str(out), "--quiet", *(["--threads", str(threads)] if threads else [])],
                       capture_output=True, text=True,
                       env={**os.environ, "KILN_PROFILE": "1", **env}, timeout=120)
    assert r.returncode == 0, r.stderr
    return {k: np.load(out / f"{k}.npy") for k in ("logits", "features")}, r.stderr


@pytest.mark.parametrize("isa", ["", "AVX2"])
@pytest.mark.parametrize("batch", [1, 3])
def test_layout_matches_onnxruntime(tmp_path, isa, batch):
    x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)
    env = {"ONEDNN_MAX_CPU_ISA": isa} if isa else {}
    got, log = kiln_run(tmp_path, x, env)
    for op in ("Concat", "Resize", "MaxPool", "GlobalAveragePool"):
        assert f" {op} " in log, log
    want = dict(zip(("logits", "features"), ort.InferenceSession(str(MODEL)).run(None, {"x": x})))
    for k, w in want.items():
        assert got[k].shape == w.shape
        np.testing.assert_allclose(got[k], w, rtol=1e-4, atol=2e-5 * max(1.0, float(np.abs(w).max())))
    plain, _ = kiln_run(tmp_path, x, {**env, "KILN_LAYOUT": "plain"})
    for k in want:
        np.testing.assert_allclose(got[k], plain[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("isa", ["", "AVX2"])
@pytest.mark.parametrize("threads", [1, 2])
def test_silu_after_conv_by_threads(tmp_path, isa, threads):
    """SiLU after a Conv runs on kiln's loop after the primitive where the
    step has one thread (with AVX-512), as oneDNN's post-op where it has two
    (kernels/cpu/ops_nn.c, act_attr): both equal onnxruntime."""
    x = np.random.default_rng(7).standard_normal((2, 3, 32, 32)).astype(np.float32)
    got, _ = kiln_run(tmp_path, x, {"ONEDNN_MAX_CPU_ISA": isa} if isa else {}, threads)
    want = dict(zip(("logits", "features"), ort.InferenceSession(str(MODEL)).run(None, {"x": x})))
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w, rtol=1e-4, atol=2e-5 * max(1.0, float(np.abs(w).max())))


def residual_sum_model(path, ch):
    """A ResNet block as older exports write it (ONNX's light ResNet-50):
    1x1 Conv -> Relu -> 3x3 stride-1 Conv (oneDNN's Winograd kernels on
    AVX-512, on their blocked layout between channels-last ends) -> Relu ->
    1x1 Conv, joined to the block's input by Sum, which carries
    channels-last values; ch channels, 24 not a multiple of the blocks."""
    import onnx
    import onnx.helper as oh
    from onnx import TensorProto as TP
    rng = np.random.default_rng(ch)

    def w(name, o, i, k):
        return onnx.numpy_helper.from_array((rng.standard_normal((o, i, k, k)) * 0.2).astype(np.float32), name)

    nodes = [oh.make_node("Conv", ["x", "w0"], ["a"]), oh.make_node("Relu", ["a"], ["ar"]),
             oh.make_node("Conv", ["ar", "w1"], ["b"], pads=[1, 1, 1, 1]), oh.make_node("Relu", ["b"], ["br"]),
             oh.make_node("Conv", ["br", "w2"], ["c"]), oh.make_node("Sum", ["c", "ar"], ["s"]),
             oh.make_node("Relu", ["s"], ["sr"]), oh.make_node("Conv", ["sr", "w3"], ["y"])]
    graph = oh.make_graph(nodes, "block", [oh.make_tensor_value_info("x", TP.FLOAT, ["N", 3, 20, 20])],
                          [oh.make_tensor_value_info("y", TP.FLOAT, None)],
                          [w("w0", ch, 3, 1), w("w1", ch, ch, 3), w("w2", ch, ch, 1), w("w3", 5, ch, 1)])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.mark.parametrize("ch", [24, 32])
@pytest.mark.parametrize("batch", [1, 3])
def test_residual_sum_and_winograd_blocks(tmp_path, ch, batch):
    path = tmp_path / "block.onnx"
    residual_sum_model(path, ch)
    x = np.random.default_rng(batch).standard_normal((batch, 3, 20, 20)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    outs = {}
    for mode in ("", "plain"):
        out = tmp_path / f"out{mode}"
        r = subprocess.run([str(KILN), "run", str(path), "--backend", "cpu", "--input", f"x={tmp_path / 'x.npy'}",
                            "--output-dir", str(out), "--quiet"], capture_output=True, text=True,
                           env={**os.environ, "KILN_LAYOUT": mode, "KILN_LOG_LEVEL": "debug"}, timeout=120)
        assert r.returncode == 0, r.stderr
        outs[mode] = np.load(out / "y.npy")
        np.testing.assert_allclose(outs[mode], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(outs[""], outs["plain"], rtol=1e-5, atol=1e-5)


POOLS = {
    "max3s2": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2])),
    "max3s2_pad_ceil": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1)),
    "max2s1": ("MaxPool", dict(kernel_shape=[2, 2], strides=[1, 1])),
    "avg3s2_pad": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    "avg3s2_pad_incl_ceil": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0],
                                                 count_include_pad=1, ceil_mode=1)),
    "avg2x3": ("AveragePool", dict(kernel_shape=[2, 3], strides=[2, 1])),
}


@pytest.mark.parametrize("isa", ["", "AVX2"])
@pytest.mark.parametrize("name", list(POOLS))
def test_channels_last_pools(tmp_path, name, isa):
    """A float pool between convolutions runs on their channels-last memory
    (oneDNN's JIT, or kiln's channel-vector loop where oneDNN runs AVX2
    code): equal to onnxruntime's, with padding, ceil mode and
    count_include_pad, 20 channels (not a multiple of a vector)."""
    import onnx
    import onnx.helper as oh
    from onnx import TensorProto as TP
    op, attrs = POOLS[name]
    rng = np.random.default_rng(len(name))
    w0 = onnx.numpy_helper.from_array((rng.standard_normal((20, 3, 3, 3)) * 0.3).astype(np.float32), "w0")
    w1 = onnx.numpy_helper.from_array((rng.standard_normal((6, 20, 1, 1)) * 0.3).astype(np.float32), "w1")
    nodes = [oh.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]), oh.make_node(op, ["a"], ["p"], **attrs),
             oh.make_node("Conv", ["p", "w1"], ["y"])]
    graph = oh.make_graph(nodes, "pool", [oh.make_tensor_value_info("x", TP.FLOAT, [2, 3, 17, 15])],
                          [oh.make_tensor_value_info("y", TP.FLOAT, None)], [w0, w1])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal((2, 3, 17, 15)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "KILN_PROFILE": "1", **({"ONEDNN_MAX_CPU_ISA": isa} if isa else {})}
    r = subprocess.run([str(KILN), "run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir",
                        str(tmp_path / "out"), "--quiet"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f" {op} " in r.stderr, r.stderr
    got = np.load(tmp_path / "out" / "y.npy")
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
