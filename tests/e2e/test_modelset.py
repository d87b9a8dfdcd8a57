"""The real-model set's test subset (tests/data/modelset/, made by
bench/models/make_set.py --test-data: torchvision, transformers and
onnxruntime.quantization exports with seeded weights and inputs; recurrent
models and an SVC written with onnx.helper and skl2onnx) served by the
real binary over HTTP and called with tritonclient; each output is compared
with the one stored beside the model.

Tolerances:
- float models against onnxruntime's outputs: |kiln - ort| <= 1e-4 * |ort| +
  2e-5 * max(1, max |ort|), i.e. float32 rounding of a different summation
  order scaled to the output's range, nowhere near a wrong result (a wrong
  kernel is off by the output's own size).
- INT8 (QDQ) models against onnx's ReferenceEvaluator, which computes the
  operators' definitions exactly: within one quantization step of the output
  (the scale of the DequantizeLinear producing it), since one rounding tie
  decided differently moves a quantized value by one step.
- dynamically quantized INT8 models (quantize_dynamic: DynamicQuantizeLinear,
  ConvInteger, MatMulInteger, com.microsoft DynamicQuantizeLSTM, which onnx's
  evaluator lacks) against onnxruntime's outputs, with the float tolerance:
  every product is integer arithmetic that both compute exactly, and each
  quantization uses the same rule on the same floats, so they differ by
  float32 rounding unless a value sits on a rounding tie (none does for the
  stored input: 1.4e-6 apart).
"""
import json
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper as nh
import pytest

from conftest import KilnServer

DATA = Path(__file__).resolve().parents[1] / "data" / "modelset"
MODELS = sorted(p.parent.name for p in DATA.glob("*/meta.json"))


def meta(name):
    return json.loads((DATA / name / "meta.json").read_text())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("modelset")
    for n in MODELS:
        (repo / n / "1").mkdir(parents=True)
        (repo / n / "1" / "model.onnx").symlink_to(DATA / n / "model.onnx")
    s = KilnServer(repo, "--cache-size", "0")
    yield s
    rc = s.stop()
    assert s.sanitizer_report() is None, s.sanitizer_report()
    assert rc == 0, f"kiln exited with {rc}:\n{s.text()}"


def saved_inputs(name, m):
    return {k: np.load(DATA / name / "inputs" / f"{k}.npy") for k in m["inputs"]}


def triton_inputs(feeds):
    """tritonclient inputs (binary payloads) for a dict of arrays."""
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype
    inputs = []
    for k, a in feeds.items():
        i = httpclient.InferInput(k, list(a.shape), np_to_triton_dtype(a.dtype))
        i.set_data_from_numpy(a, binary_data=True)
        inputs.append(i)
    return inputs


def infer(client, name, m, feeds):
    import tritonclient.http as httpclient
    outs = [httpclient.InferRequestedOutput(k, binary_data=True) for k in m["outputs"]]
    r = client.infer(name, triton_inputs(feeds), outputs=outs)
    return {k: r.as_numpy(k) for k in m["outputs"]}


@pytest.fixture()
def client(served):
    import tritonclient.http as httpclient
    c = httpclient.InferenceServerClient(served.url, network_timeout=120)
    yield c
    c.close()


def assert_close_float(got, want, what):
    """The float tolerance stated at the top of this file."""
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * scale, err_msg=what)


def output_step(name, out):
    """The quantization step of output OUT: its DequantizeLinear's scale."""
    g = onnx.load(str(DATA / name / "model.onnx")).graph
    node = next(n for n in g.node if out in n.output)
    assert node.op_type == "DequantizeLinear", f"{name}: {out} comes from {node.op_type}, not DequantizeLinear"
    scale = next(i for i in g.initializer if i.name == node.input[1])
    return float(np.max(nh.to_array(scale)))


def test_subset_is_complete():
    """The families the subset stands for are all there (a lost file is a failure, not a skip)."""
    kinds = {(meta(n)["kind"], meta(n)["family"]) for n in MODELS}
    for want in (("float", "cnn"), ("float", "segmentation"), ("float", "text-encoder"), ("float", "decoder"),
                 ("int8", "cnn"), ("float", "recurrent"), ("float", "classical-ml")):
        assert want in kinds, f"tests/data/modelset has no {want[0]} {want[1]} model"
    assert "gpt2_s_past" in MODELS and "llama_s" in MODELS
    # LSTM and GRU taggers, a bidirectional-LSTM CRNN (and its dynamic INT8
    # quantization), a streaming step with its state as inputs and outputs,
    # scikit-learn's SVC.
    # A YOLOv8-style detector (SiLU, C2f's Split and Concat, SPPF, the DFL
    # head's Softmax over a middle axis).
    # A depthwise CNN dynamically quantized (grouped ConvInteger).
    for name in ("lstm_tagger", "gru_tagger", "crnn_bilstm", "vad_stream", "svc", "crnn_bilstm_dynamic", "yolov8_s",
                 "mobilenet_v2_s_dynamic"):
        assert name in MODELS, f"tests/data/modelset has no {name}"


@pytest.mark.parametrize("name", MODELS)
def test_model(client, name):
    m = meta(name)
    got = infer(client, name, m, saved_inputs(name, m))
    for k in m["outputs"]:
        want = np.load(DATA / name / "outputs" / f"{k}.npy")
        assert got[k].shape == want.shape, (k, got[k].shape, want.shape)
        assert np.all(np.isfinite(got[k])), k
        if m["kind"] == "int8" and m.get("quantization") == "dynamic":
            assert_close_float(got[k], want, f"{name}/{k}")
        elif m["kind"] == "int8":
            ref = np.load(DATA / name / "reference" / f"{k}.npy")
            step = output_step(name, k)
            err = np.abs(got[k].astype(np.float64) - ref).max()
            assert err <= step * 1.001, f"{name}/{k}: {err} off the reference, one step is {step}"
        else:
            assert_close_float(got[k], want, f"{name}/{k}")


def test_bad_past_is_refused_and_serving_goes_on(client):
    """A GPT-2 step whose past keys have the wrong head size is a 400 naming
    the input; the next, correct request is answered."""
    from tritonclient.utils import InferenceServerException
    name = "gpt2_s_past"
    m = meta(name)
    feeds = saved_inputs(name, m)
    k = feeds["past_key_0"]
    feeds["past_key_0"] = np.zeros(k.shape[:-1] + (k.shape[-1] + 1,), k.dtype)
    with pytest.raises(InferenceServerException) as e:
        client.infer(name, triton_inputs(feeds))
    assert e.value.status() == "400", e.value
    assert "past_key_0" in str(e.value), e.value
    test_model(client, name)


def test_gpt2_decode_loop(client):
    """Four decoding steps of GPT-2 with past, each step's present keys and
    values fed back as the next step's past (lengths 32, 33, 34, 35: one
    model serves every step), each checked against onnxruntime on the same
    inputs."""
    import onnxruntime as ort
    name = "gpt2_s_past"
    m = meta(name)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(DATA / name / "model.onnx"), so, providers=["CPUExecutionProvider"])
    feeds = saved_inputs(name, m)
    for step in range(4):
        got = infer(client, name, m, feeds)
        want = dict(zip(m["outputs"], sess.run(m["outputs"], feeds)))
        for k in m["outputs"]:
            assert_close_float(got[k], want[k], f"step {step}: {k}")
        # The next step: the most likely token, the presents as the past.
        nxt = int(want["logits"][0, -1].argmax())
        past = {k.replace("present_", "past_"): want[k] for k in m["outputs"] if k.startswith("present_")}
        feeds = {"input_ids": np.array([[nxt]], np.int64),
                 "attention_mask": np.ones((1, feeds["attention_mask"].shape[1] + 1), np.int64), **past}
