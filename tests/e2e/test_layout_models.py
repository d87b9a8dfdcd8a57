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


def kiln_run(tmp_path, x, env):
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    r = subprocess.run([str(KILN), "run", str(MODEL), "--backend", "cpu", "--input", f"x={tmp_path / 'x.npy'}",
                        "--output-dir", str(out), "--quiet"], capture_output=True, text=True,
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
