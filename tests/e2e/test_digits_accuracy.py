"""The example digits model, run by `kiln run` on the held-out split that
tools/train_digits.py saved: accuracy is computed from kiln's own outputs."""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
KILN = Path(os.environ.get("KILN_BIN", ROOT / "build" / "kiln"))
MODEL = ROOT / "model_repository" / "digits"
TEST_X = ROOT / "tests" / "data" / "digits_test_x.npy"
TEST_Y = ROOT / "tests" / "data" / "digits_test_y.npy"


@pytest.fixture(scope="module")
def kiln_outputs(tmp_path_factory):
    assert KILN.exists(), f"{KILN} is missing: run make first"
    out = tmp_path_factory.mktemp("digits_out")
    proc = subprocess.run(
        [str(KILN), "run", str(MODEL), "--input", f"input={TEST_X}", "--output-dir", str(out),
         "--threads", "1"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kiln run failed:\n{proc.stdout}\n{proc.stderr}"
    # Both outputs are reported with their shapes.
    assert "label" in proc.stdout and "probabilities" in proc.stdout, proc.stdout
    return np.load(out / "label.npy"), np.load(out / "probabilities.npy")


def test_accuracy_at_least_95_percent(kiln_outputs):
    label, _ = kiln_outputs
    y = np.load(TEST_Y)
    assert label.dtype == np.int64
    assert label.shape == y.shape
    accuracy = float((label == y).mean())
    print(f"kiln held-out accuracy: {accuracy:.4f} on {len(y)} samples")
    assert accuracy >= 0.95


def test_probabilities_are_consistent(kiln_outputs):
    label, prob = kiln_outputs
    assert prob.dtype == np.float32
    assert prob.shape == (len(label), 10)
    np.testing.assert_allclose(prob.sum(axis=1), 1.0, atol=1e-4)
    assert (prob >= 0).all()
    np.testing.assert_array_equal(prob.argmax(axis=1), label)


def test_matches_onnxruntime(kiln_outputs):
    ort = pytest.importorskip("onnxruntime")
    _, prob = kiln_outputs
    sess = ort.InferenceSession(str(MODEL / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    _, want = sess.run(None, {"input": np.load(TEST_X)})
    np.testing.assert_allclose(prob, want, rtol=1e-4, atol=1e-5)


def test_random_input_follows_batch():
    """Without --input, kiln run feeds seeded random data; the batch dim follows --batch."""
    proc = subprocess.run([str(KILN), "run", str(MODEL), "--batch", "3", "--iterations", "5"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "[3,64]" in proc.stdout and "[3,10]" in proc.stdout, proc.stdout
    assert "p50" in proc.stdout and "p99" in proc.stdout
