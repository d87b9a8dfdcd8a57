"""FP16 models as GPU models ship: onnxconverter_common's float16 conversion
of real models (ONNX's light ResNet-50 and SqueezeNet, the transformers BERT of
tests/data/sequence), with FP16 inputs and outputs or keep_io_types. kiln
lowers them to FP32 arithmetic on the CPU; answers are compared with
onnxruntime on the FP32 original (the FP16 weights' rounding bounds the
difference), and an FP16 model is served over HTTP with FP16 tensors."""
import os
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from conftest import KILN, ROOT

float16 = pytest.importorskip("onnxconverter_common.float16")
LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
BERT = ROOT / "tests" / "data" / "sequence" / "bert.onnx"


def convert(src, dst, keep_io_types):
    m = float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=keep_io_types)
    onnx.save(m, str(dst))
    return m


def feeds_for(model, rng):
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        shape = [d.dim_value or 2 for d in i.type.tensor_type.shape.dim]
        et = i.type.tensor_type.elem_type
        if et == onnx.TensorProto.INT64:
            out[i.name] = rng.integers(0, 2, shape).astype(np.int64)
        else:
            out[i.name] = rng.random(shape).astype(np.float16 if et == onnx.TensorProto.FLOAT16 else np.float32)
    return out


def kiln_run(path, feeds, tmp_path):
    args = [str(KILN), "run", str(path), "--output-dir", str(tmp_path / "out"), "--quiet"]
    for k, v in feeds.items():
        f = tmp_path / (k.replace("/", "_") + ".npy")
        np.save(f, v)
        args += ["--input", f"{k}={f}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return lambda name: np.load(tmp_path / "out" / (name.replace("/", "_") + ".npy"))


CASES = [("light_resnet50.onnx", False), ("light_squeezenet.onnx", True), ("bert", False), ("bert", True)]


@pytest.mark.parametrize("src,keep_io", CASES, ids=[f"{s.split('.')[0]}-{'keepio' if k else 'fp16io'}" for s, k in CASES])
def test_fp16_model_matches_fp32(tmp_path, src, keep_io):
    src = BERT if src == "bert" else os.path.join(LIGHT, src)
    if not os.path.exists(src):
        pytest.skip(f"{src} is missing")
    m16 = convert(src, tmp_path / "m16.onnx", keep_io)
    feeds = feeds_for(m16, np.random.default_rng(0))
    out = kiln_run(tmp_path / "m16.onnx", feeds, tmp_path)
    want = ort.InferenceSession(str(src)).run(None, {k: v.astype(np.float32) if v.dtype == np.float16 else v
                                                     for k, v in feeds.items()})
    for o, w in zip(m16.graph.output, want):
        got = out(o.name)
        # The file's output type: FP16 unless keep_io_types kept FP32.
        assert got.dtype == (np.float32 if keep_io else np.float16), (o.name, got.dtype)
        assert got.shape == w.shape
        scale = max(1.0, float(np.abs(w).max()))
        assert float(np.abs(got.astype(np.float32) - w).max()) <= 2e-3 * scale, o.name


def test_fp16_served_over_http(make_server, tmp_path):
    src = os.path.join(LIGHT, "light_squeezenet.onnx")
    if not os.path.exists(src):
        pytest.skip("light_squeezenet is missing")
    repo = tmp_path / "repo"
    (repo / "sq16" / "1").mkdir(parents=True)
    m16 = convert(src, repo / "sq16" / "1" / "model.onnx", keep_io_types=False)
    s = make_server(repo)
    c = httpclient.InferenceServerClient(s.url)
    meta = c.get_model_metadata("sq16")
    assert meta["inputs"][0]["datatype"] == "FP16" and meta["outputs"][0]["datatype"] == "FP16"
    name, out_name = meta["inputs"][0]["name"], meta["outputs"][0]["name"]
    x = np.random.default_rng(1).random([1, 3, 224, 224]).astype(np.float16)
    inp = httpclient.InferInput(name, list(x.shape), "FP16")
    inp.set_data_from_numpy(x, binary_data=True)
    r = c.infer("sq16", [inp], outputs=[httpclient.InferRequestedOutput(out_name, binary_data=True)])
    got = r.as_numpy(out_name)
    assert got.dtype == np.float16
    want = ort.InferenceSession(src).run(None, {name: x.astype(np.float32)})[0]
    assert np.abs(got.astype(np.float32) - want).max() < 2e-3
    # FP16 as JSON both ways, as tritonclient sends and reads it.
    inp.set_data_from_numpy(x, binary_data=False)
    r = c.infer("sq16", [inp], outputs=[httpclient.InferRequestedOutput(out_name, binary_data=False)])
    assert r.get_response()["outputs"][0]["datatype"] == "FP16"
    assert np.abs(r.as_numpy(out_name).astype(np.float32) - want).max() < 2e-3
    # An FP32 tensor where the model takes FP16 is refused in words.
    bad = httpclient.InferInput(name, list(x.shape), "FP32")
    bad.set_data_from_numpy(x.astype(np.float32), binary_data=True)
    with pytest.raises(httpclient.InferenceServerException, match="FP16"):
        c.infer("sq16", [bad])
    c.close()
