"""Residual sums in the convolution before them (models/passes_layout.c's
passes_fuse_residual, the sum post-op in kernels/cpu/ops_nn.c, and
models/plan_build.c's sum_in_place, where the Conv writes over Z's bytes).

One model holds every case the fusion and the planner tell apart: a block
whose Add reads the block's input last (summed in place), a downsampling
block whose shortcut Conv comes after the main branch's last Conv in node
order and whose Add names the shortcut first, a sum whose Z is a graph
output and one whose Z is read again later (both copied, not
overwritten), y = conv(u) + u (Z is X: never in place), a dilated
convolution on a small map (kiln's tap products below AVX-512, from
B + Z), a Sum of two as older exports write it,
a Z that broadcasts ([N, C, 1, 1], and a [1, C, H, W] one that
matches Y at batch 1 only: not fused) and an Add over a Conv whose
activation comes first (Conv -> Relu -> Add: not fused). kiln equals
onnxruntime natively and on oneDNN's AVX2 code, at one and two threads,
channels-last and plain (KILN_LAYOUT=plain: the blocked destination that
Z is reordered into), at batch 1 and 2 (the batch is symbolic), and
equal to the same model with the fusion off (KILN_RESIDUAL=0) within
float rounding."""
import os
import re
import subprocess

import numpy as np
import onnxruntime as ort
import pytest

from conftest import KILN

C = 16


def build_model(path):
    import onnx
    import onnx.helper as oh
    from onnx import TensorProto as TP
    rng = np.random.default_rng(5)
    inits = []

    def w(name, o, i, k):
        inits.append(onnx.numpy_helper.from_array((rng.standard_normal((o, i, k, k)) * (0.6 / (i * k)) ** 0.5)
                                                  .astype(np.float32), name))
        return name

    def b(name, o):
        inits.append(onnx.numpy_helper.from_array((rng.standard_normal(o) * 0.1).astype(np.float32), name))
        return name

    conv = lambda i, wt, o, **kw: oh.make_node("Conv", i if isinstance(i, list) else [i, wt], [o], **kw)
    p1 = dict(pads=[1, 1, 1, 1])
    nodes = [
        # a basic block: its Add reads r0 last (in place)
        conv(["x", w("w0", C, 3, 3), b("b0", C)], None, "c0", **p1), oh.make_node("Relu", ["c0"], ["r0"]),
        conv(["r0", w("w1", C, C, 3), b("b1", C)], None, "c1", **p1), oh.make_node("Relu", ["c1"], ["r1"]),
        conv(["r1", w("w2", C, C, 3), b("b2", C)], None, "c2", **p1), oh.make_node("Add", ["c2", "r0"], ["s1"]),
        oh.make_node("Relu", ["s1"], ["o1"]),
        # downsampling: the shortcut Conv after the branch's last one, the Add naming it first
        conv(["o1", w("w3", 2 * C, C, 3), b("b3", 2 * C)], None, "c3", strides=[2, 2], **p1),
        oh.make_node("Relu", ["c3"], ["r3"]),
        conv(["r3", w("w4", 2 * C, 2 * C, 3)], None, "c4", **p1),
        conv(["o1", w("wd", 2 * C, C, 1), b("bd", 2 * C)], None, "d", strides=[2, 2]),
        oh.make_node("Add", ["d", "c4"], ["s2"]), oh.make_node("Relu", ["s2"], ["o2"]),
        # Z a graph output (o2), read by nothing after the sum: copied
        conv(["o2", w("w5a", 2 * C, 2 * C, 1)], None, "c5a"), oh.make_node("Relu", ["c5a"], ["r5"]),
        conv(["r5", w("w5", 2 * C, 2 * C, 3), b("b5", 2 * C)], None, "c5", **p1),
        oh.make_node("Add", ["c5", "o2"], ["s3"]),
        # Z (s3) read again after the sum, no graph output: copied
        conv(["s3", w("w5b", 2 * C, 2 * C, 1)], None, "c5b"), oh.make_node("Add", ["c5b", "s3"], ["s3b"]),
        oh.make_node("Mul", ["s3", "half"], ["t"]), oh.make_node("Add", ["s3b", "t"], ["u"]),
        # y = conv(u) + u: Z is X (summed, never in place)
        conv(["u", w("w6", 2 * C, 2 * C, 3)], None, "c6", **p1), oh.make_node("Add", ["u", "c6"], ["s4"]),
        oh.make_node("Relu", ["s4"], ["o4"]),
        # dilation past most of the map (taps below AVX-512), summed in place, LeakyRelu after
        conv(["o4", w("w7a", 2 * C, 2 * C, 1)], None, "c7a"), oh.make_node("Relu", ["c7a"], ["r7"]),
        conv(["r7", w("w7", 2 * C, 2 * C, 3), b("b7", 2 * C)], None, "c7", pads=[4, 4, 4, 4], dilations=[4, 4]),
        oh.make_node("Add", ["c7", "o4"], ["s5"]), oh.make_node("LeakyRelu", ["s5"], ["o5"], alpha=0.1),
        # a Sum of two, Z its X
        conv(["o5", w("w8", 2 * C, 2 * C, 1)], None, "c8"), oh.make_node("Sum", ["c8", "o5"], ["o6"]),
        # a broadcast Z (a squeeze-excitation's [N, C, 1, 1]): not fused
        oh.make_node("GlobalAveragePool", ["o6"], ["g"]),
        conv(["o6", w("w9", 2 * C, 2 * C, 1), b("b9", 2 * C)], None, "c9"), oh.make_node("Add", ["c9", "g"], ["o7"]),
        # a Z of Y's shape at batch 1 only ([1, C, H, W]; the batch is symbolic): not fused
        conv(["o7", w("w11", 2 * C, 2 * C, 1)], None, "c11"), oh.make_node("Add", ["c11", "zb"], ["o8"]),
        # the activation before the Add: not fused
        conv(["o8", w("w10", 2 * C, 2 * C, 3)], None, "c10", **p1), oh.make_node("Relu", ["c10"], ["r10"]),
        oh.make_node("Add", ["r10", "o8"], ["y"]),
    ]
    inits.append(onnx.numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    inits.append(onnx.numpy_helper.from_array(rng.standard_normal((1, 2 * C, 6, 6)).astype(np.float32), "zb"))
    graph = oh.make_graph(nodes, "residual", [oh.make_tensor_value_info("x", TP.FLOAT, ["N", 3, 12, 12])],
                          [oh.make_tensor_value_info("y", TP.FLOAT, None),
                           oh.make_tensor_value_info("o2", TP.FLOAT, None)], inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("residual") / "residual.onnx"
    build_model(path)
    return path


def kiln_run(tmp_path, model, x, env, threads):
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    r = subprocess.run([str(KILN), "run", str(model), "--backend", "cpu", "--input", f"x={tmp_path / 'x.npy'}",
                        "--output-dir", str(out), "--quiet", "--threads", str(threads), "--log-level", "debug"],
                       capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    assert r.returncode == 0, r.stderr
    return {k: np.load(out / f"{k}.npy") for k in ("y", "o2")}, r.stderr


@pytest.mark.parametrize("layout", ["", "plain"])
@pytest.mark.parametrize("isa", ["", "AVX2"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 2])
def test_residual_sums_match_onnxruntime(tmp_path, model, layout, isa, threads, batch):
    x = np.random.default_rng(batch).standard_normal((batch, 3, 12, 12)).astype(np.float32)
    env = {"KILN_LAYOUT": layout}
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    got, log = kiln_run(tmp_path, model, x, env, threads)
    fused = re.search(r"(\d+) residual sums in convolutions", log)
    in_place = re.search(r"(\d+) residual sums in place", log)
    # c2, c4, c5, c5b, c6, c7 and c8; c9's and c11's Z broadcast (c11's at batch 2) and c10 has its Relu first
    assert fused and int(fused.group(1)) == 7, log
    # c2 over r0, c4 over d, c7 over o4; c5's Z is a graph output, c5b's read later, c6's and c8's their X
    assert in_place and int(in_place.group(1)) == 3, log
    if isa == "AVX2":
        assert "live taps as products" in log, log
    want = dict(zip(("y", "o2"), ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
                    .run(None, {"x": x})))
    for k, v in want.items():
        assert got[k].shape == v.shape
        np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=2e-5 * max(1.0, float(np.abs(v).max())))
    # the same plan with the Adds apart (KILN_RESIDUAL=0): equal within float rounding of the sums' order
    apart, log0 = kiln_run(tmp_path, model, x, {**env, "KILN_RESIDUAL": "0"}, threads)
    assert "0 residual sums in convolutions" in log0, log0
    for k in want:
        np.testing.assert_allclose(got[k], apart[k], rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(apart[k]).max())))


def test_conv_refuses_a_fourth_input_from_a_file(tmp_path):
    """ONNX's Conv has three inputs: a file's fourth is refused by name, not
    taken as a residual (kiln_residual is the pass's mark)."""
    import onnx
    import onnx.helper as oh
    from onnx import TensorProto as TP
    wt = onnx.numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    graph = oh.make_graph([oh.make_node("Conv", ["x", "w", "", "z"], ["y"])], "g",
                          [oh.make_tensor_value_info("x", TP.FLOAT, [1, 2, 3, 3]),
                           oh.make_tensor_value_info("z", TP.FLOAT, [1, 2, 3, 3])],
                          [oh.make_tensor_value_info("y", TP.FLOAT, None)], [wt])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "conv4.onnx"
    onnx.save(model, path)
    r = subprocess.run([str(KILN), "run", str(path), "--backend", "cpu", "--quiet"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert "Conv takes 2 or 3 inputs, not 4" in r.stderr, r.stderr
