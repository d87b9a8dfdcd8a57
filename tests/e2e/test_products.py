"""Products with constant weights (MatMul, Gemm, their fused bias and
activation) at the CPU ISAs oneDNN picks different kernels for.

Without AVX-512, oneDNN 2.x runs matmul on its sgemm, which packs the
weights again on every call; kiln runs those products as a 1x1
convolution over channels-last rows with the weights packed once
(kernels/cpu/ops_nn.c, mm_conv1x1_pd). Capped at AVX2 the convolution
must be what runs (ONEDNN_VERBOSE names it), and at every ISA the answers
must equal numpy's float64 products within float32 rounding: plain,
transposed weights, bias, fused activations, Gemm's alpha, beta and C,
rows folded from [batch, sequence, features]."""
import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto as TP
from onnx import numpy_helper

KILN = Path(os.environ.get("KILN_BIN", Path(__file__).resolve().parents[2] / "build" / "kiln"))


def gelu(x):
    from math import erf
    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


def case(name, rng):
    """(nodes, initializers, x shape, numpy reference of x)."""
    k, n = 96, 160
    w = rng.standard_normal((k, n)).astype(np.float32) / np.sqrt(k)
    b = rng.standard_normal(n).astype(np.float32)
    if name == "matmul":
        return [oh.make_node("MatMul", ["x", "w"], ["y"])], {"w": w}, (3, 37, k), lambda x: x @ w
    if name == "matmul_bias_relu":
        nodes = [oh.make_node("MatMul", ["x", "w"], ["m"]), oh.make_node("Add", ["m", "b"], ["a"]),
                 oh.make_node("Relu", ["a"], ["y"])]
        return nodes, {"w": w, "b": b}, (2, 50, k), lambda x: np.maximum(x @ w + b, 0)
    if name == "matmul_bias_gelu":
        nodes = [oh.make_node("MatMul", ["x", "w"], ["m"]), oh.make_node("Add", ["m", "b"], ["a"]),
                 oh.make_node("Div", ["a", "sqrt2"], ["d"]), oh.make_node("Erf", ["d"], ["e"]),
                 oh.make_node("Add", ["e", "one"], ["e1"]), oh.make_node("Mul", ["a", "e1"], ["h"]),
                 oh.make_node("Mul", ["h", "half"], ["y"])]
        consts = {"w": w, "b": b, "sqrt2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)}
        return nodes, consts, (4, 21, k), lambda x: gelu(x @ w + b)
    if name == "gemm_trans_b_alpha_beta_c":
        c = rng.standard_normal((1, n)).astype(np.float32)
        node = oh.make_node("Gemm", ["x", "wt", "c"], ["y"], transB=1, alpha=0.5, beta=2.0)
        return [node], {"wt": np.ascontiguousarray(w.T), "c": c}, (70, k), lambda x: 0.5 * (x @ w) + 2.0 * c
    if name == "gemm_bias":
        node = oh.make_node("Gemm", ["x", "w", "b"], ["y"])
        return [node], {"w": w, "b": b}, (128, k), lambda x: x @ w + b
    raise KeyError(name)


CASES = ["matmul", "matmul_bias_relu", "matmul_bias_gelu", "gemm_trans_b_alpha_beta_c", "gemm_bias"]


@pytest.mark.parametrize("isa", ["default", "AVX2"])
@pytest.mark.parametrize("name", CASES)
def test_constant_weight_products(tmp_path, name, isa):
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    nodes, consts, shape, ref = case(name, rng)
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts.items()]
    g = oh.make_graph(nodes, name, [oh.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                      [oh.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    x = rng.standard_normal(shape).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    if isa != "default":
        env["ONEDNN_MAX_CPU_ISA"] = isa
    r = subprocess.run([str(KILN), "run", str(tmp_path / "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}",
                        "--output-dir", str(tmp_path / "out"), "--threads", "2", "--quiet"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "out" / "y.npy")
    want = ref(x.astype(np.float64))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    ran = [ln.split(",")[3:5] for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("onednn_verbose,exec")]
    if isa == "AVX2" and not name.startswith("gemm_trans_b_alpha"):
        # Gemm's alpha is an output scale, which oneDNN's float convolution
        # does not take: that one stays a matmul.
        assert ["convolution", "jit_1x1:avx2"] in ran, ran
        assert not any(k == "matmul" for k, _ in ran), ran
