"""Model files in a load request (Triton's model repository extension:
parameters "file:<version>/<name>" beside "config"), through tritonclient's
load_model(config=..., files=...) over HTTP and gRPC: the files land in the
model's folder of the repository and the load sees only the versions they
name; paths that would leave the folder (.., absolute, hidden names,
symbolic links) are refused naming the rule; --max-model-upload-size caps
them; and without the control permission nothing is written."""
import json
import os

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import save_model, tiny_graph

CONFIG = json.dumps({"max_batch_size": 8, "version_policy": {"all": {}}})


def model_bytes(seed):
    m = oh.make_model(tiny_graph(seed), opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def logits(seed, x):
    g = tiny_graph(seed)
    w = np.array(onnx.numpy_helper.to_array(g.initializer[0]))
    b = np.array(onnx.numpy_helper.to_array(g.initializer[1]))
    return x @ w + b


def infer(c, mod, model, version=""):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    i = mod.InferInput("x", [2, 4], "FP32")
    i.set_data_from_numpy(x)
    return x, c.infer(model, [i], model_version=version).as_numpy("logits")


@pytest.fixture()
def root(tmp_path):
    r = tmp_path / "repo"
    save_model(r, "tiny", tiny_graph(0), version=1)
    save_model(r, "tiny", tiny_graph(1), version=2)
    return r


def clients(s, kind):
    if kind == "http":
        return httpclient, httpclient.InferenceServerClient(s.url)
    return grpcclient, grpcclient.InferenceServerClient(s.grpc_url())


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_upload_new_model_and_override(make_server, root, kind):
    s = make_server(root, "--model-control-mode", "explicit", "--load-model", "tiny")
    mod, c = clients(s, kind)
    # A model the repository lacks: its folder is made.
    c.load_model("fresh", config=CONFIG, files={"file:1/model.onnx": model_bytes(5)})
    assert c.is_model_ready("fresh")
    x, got = infer(c, mod, "fresh")
    np.testing.assert_allclose(got, logits(5, x), rtol=1e-5, atol=1e-5)
    assert (root / "fresh" / "1" / "model.onnx").read_bytes() == model_bytes(5)
    # An existing model: the upload replaces version 2's file, and the
    # load sees only the uploaded versions (Triton's override folder),
    # whatever the version policy says.
    assert c.is_model_ready("tiny", "2") and not c.is_model_ready("tiny", "1")
    c.load_model("tiny", config=CONFIG, files={"file:2/model.onnx": model_bytes(7),
                                               "file:3/model.onnx": model_bytes(8)})
    assert not c.is_model_ready("tiny", "1")
    x, got = infer(c, mod, "tiny", "2")
    np.testing.assert_allclose(got, logits(7, x), rtol=1e-5, atol=1e-5)
    x, got = infer(c, mod, "tiny", "3")
    np.testing.assert_allclose(got, logits(8, x), rtol=1e-5, atol=1e-5)
    # A plain load afterwards reads the folder again: all three versions.
    c.load_model("tiny", config=CONFIG)
    assert all(c.is_model_ready("tiny", v) for v in ("1", "2", "3"))
    # Files need a config, as Triton's do.
    with pytest.raises(InferenceServerException, match="needs parameters.config"):
        c.load_model("tiny", files={"file:4/model.onnx": model_bytes(9)})
    assert not (root / "tiny" / "4").exists()
    c.close()
    assert not [p for p in root.rglob(".upload*")]


BAD_PATHS = [
    ("file:../escape/1/model.onnx", "may not start with '.'"),
    ("file:1/../../escape.onnx", "may not start with '.'"),
    ("file:/tmp/escape.onnx", "not absolute"),
    ("file:1/.hidden", "may not start with '.'"),
    ("file:1//model.onnx", "empty component"),
    ("file:model.onnx", "version folder"),
    ("file:0/model.onnx", "version folder"),
    ("file:1", "inside a version folder"),
    ("file:1/a\\b", "backslashes"),
]


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_paths_outside_refused(make_server, root, tmp_path, kind):
    s = make_server(root, "--model-control-mode", "explicit", "--load-model", "tiny")
    mod, c = clients(s, kind)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    for path, why in BAD_PATHS:
        with pytest.raises(InferenceServerException) as e:
            c.load_model("tiny", config=CONFIG, files={path: model_bytes(3)})
        assert why in e.value.message(), (path, e.value.message())
        assert path[5:60] in e.value.message() or path == "file:1/a\\b"
        assert "400" in str(e.value.status()) or "INVALID_ARGUMENT" in str(e.value.status())
    # Symbolic links in the repository are not followed: a version folder
    # or a model folder that is one is refused, and the target is untouched.
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "tiny" / "5")
    os.symlink(outside, root / "linked")
    for model, path in (("tiny", "file:5/model.onnx"), ("linked", "file:1/model.onnx")):
        with pytest.raises(InferenceServerException, match="symbolic link"):
            c.load_model(model, config=CONFIG, files={path: model_bytes(3)})
    assert list(outside.iterdir()) == []
    os.unlink(root / "tiny" / "5")
    os.unlink(root / "linked")
    assert sorted(str(p) for p in tmp_path.rglob("*")) == sorted(before + [str(outside)])
    assert not os.path.exists("/tmp/escape.onnx")
    # The model still serves its old versions, and the server goes on.
    assert c.is_model_ready("tiny", "2")
    c.close()


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_upload_cap(make_server, root, kind):
    s = make_server(root, "--model-control-mode", "explicit", "--max-model-upload-size", "1K")
    mod, c = clients(s, kind)
    big = model_bytes(3) + b"\0" * 1024
    with pytest.raises(InferenceServerException) as e:
        c.load_model("tiny", config=CONFIG, files={"file:1/model.onnx": big})
    assert "--max-model-upload-size (1024 bytes)" in e.value.message()
    assert "413" in str(e.value.status()) or "RESOURCE_EXHAUSTED" in str(e.value.status())
    # Two files under the cap each, over it together.
    half = b"\0" * 600
    with pytest.raises(InferenceServerException, match="max-model-upload-size"):
        c.load_model("tiny", config=CONFIG, files={"file:1/a.bin": half, "file:1/b.bin": half})
    assert not (root / "tiny" / "1" / "a.bin").exists()
    c.close()
    off = make_server(root, "--model-control-mode", "explicit", "--max-model-upload-size", "0")
    mod, c = clients(off, kind)
    with pytest.raises(InferenceServerException, match="uploads are off|are off on this server"):
        c.load_model("tiny", config=CONFIG, files={"file:1/model.onnx": model_bytes(3)})
    c.close()


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_upload_needs_control_permission(make_server, root, kind):
    none = make_server(root)
    mod, c = clients(none, kind)
    with pytest.raises(InferenceServerException, match="--model-control-mode explicit"):
        c.load_model("fresh", config=CONFIG, files={"file:1/model.onnx": model_bytes(3)})
    c.close()
    tok = make_server(root, "--model-control-mode", "explicit", env={"KILN_CONTROL_TOKEN": "s3cret"})
    mod, c = clients(tok, kind)
    with pytest.raises(InferenceServerException, match="[Aa]uthorization"):
        c.load_model("fresh", config=CONFIG, files={"file:1/model.onnx": model_bytes(3)})
    # Not even a bad path is looked at before the permission.
    with pytest.raises(InferenceServerException, match="[Aa]uthorization"):
        c.load_model("fresh", config=CONFIG, files={"file:../x": model_bytes(3)})
    assert not (root / "fresh").exists()
    c.load_model("fresh", config=CONFIG, files={"file:1/model.onnx": model_bytes(3)},
                 headers={"authorization": "Bearer s3cret"})
    assert c.is_model_ready("fresh")
    c.close()
