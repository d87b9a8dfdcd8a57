"""config.json fields with the meanings Triton's onnxruntime backend gives
them: max_batch_size absent or 0 beside listed inputs and outputs (no
batching), the configuration read back with get_model_config(as_json=True)
and loaded again, reshape, optional inputs, version_policy, label_filename,
platform/backend, instance_group count and dynamic_batching's queue delay.
Models are made here with onnx.helper; the real binary serves them and the
real tritonclient (HTTP and gRPC) asks."""
import json
import shutil
import threading

import numpy as np
import onnx.helper as oh
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto as TP
from tritonclient.utils import InferenceServerException

from conftest import DIGITS, save_model, tiny_graph


def fp32(name, x, mod=httpclient):
    i = mod.InferInput(name, list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


def io(name, dims, extra=None):
    return {"name": name, "data_type": "TYPE_FP32", "dims": dims, **(extra or {})}


TINY_IO = {"input": [io("x", [-1, 4])], "output": [io("probs", [-1, 3]), io("logits", [-1, 3])]}


def unary_graph(op, in_shape, out_shape, name="x"):
    return oh.make_graph([oh.make_node(op, [name], ["y"])], op.lower(),
                         [oh.make_tensor_value_info(name, TP.FLOAT, in_shape)],
                         [oh.make_tensor_value_info("y", TP.FLOAT, out_shape)])


def load_error(c, name, config=None):
    with pytest.raises(InferenceServerException) as e:
        c.load_model(name, config=config)
    return str(e.value)


# ---- max_batch_size absent or 0 ----------------------------------------

@pytest.mark.parametrize("mbs", [None, 0])
def test_listed_io_without_max_batch_size_does_not_batch(make_server, tmp_path, mbs):
    """Symbolic first dims, inputs and outputs listed with them: the model
    takes whole tensors of any length (Triton: max_batch_size 0), no batch
    dim is split off and no batching is done."""
    cfg = dict(TINY_IO)
    if mbs is not None:
        cfg["max_batch_size"] = mbs
    save_model(tmp_path / "repo", "nb", tiny_graph(), config=json.dumps(cfg))
    s = make_server(tmp_path / "repo", "--model-control-mode", "explicit", "--load-model", "nb")
    c = httpclient.InferenceServerClient(s.url)
    got = c.get_model_config("nb")
    assert got["max_batch_size"] == 0
    assert "dynamic_batching" not in got
    assert [i["dims"] for i in got["input"]] == [[-1, 4]]
    md = c.get_model_metadata("nb")
    assert md["inputs"][0]["shape"] == [-1, 4]
    for n in (1, 5, 40):  # 40: past the 32 kiln gives a model it batches
        x = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
        assert c.infer("nb", [fp32("x", x)]).as_numpy("probs").shape == (n, 3)
    # Without a listed input and output the ONNX graph fills the configuration in, batching.
    save_model(tmp_path / "repo", "auto", tiny_graph(), config='{"max_batch_size": 0}')
    c.load_model("auto")
    assert c.get_model_config("auto")["max_batch_size"] == 32


def test_listed_dims_say_whether_the_batch_dim_is_left_out(make_server, tmp_path):
    """max_batch_size absent, a model that may batch: dims one shorter than
    the model's rank leave the batch dim out, so the model batches (Triton's
    onnxruntime backend reads the same hint); tensors that disagree are
    refused, naming one."""
    save_model(tmp_path / "repo", "tiny", tiny_graph())
    s = make_server(tmp_path / "repo", "--model-control-mode", "explicit")
    c = httpclient.InferenceServerClient(s.url)
    c.load_model("tiny", config=json.dumps({"input": [io("x", [4])], "output": [io("probs", [3])]}))
    assert c.get_model_config("tiny")["max_batch_size"] == 32
    msg = load_error(c, "tiny", json.dumps({"input": [io("x", [4])], "output": [io("probs", [-1, 3])]}))
    assert "config field 'output' of 'probs'" in msg and "give max_batch_size" in msg, msg


def _reshape_repo(root):
    # y = 2x on [N, 2, 3]; the scalar model v -> v + 1 on [N].
    save_model(root, "rs", oh.make_graph(
        [oh.make_node("Add", ["x", "x"], ["y"])], "rs",
        [oh.make_tensor_value_info("x", TP.FLOAT, ["N", 2, 3])],
        [oh.make_tensor_value_info("y", TP.FLOAT, ["N", 2, 3])]),
        config=json.dumps({"max_batch_size": 8, "input": [io("x", [6], {"reshape": {"shape": [2, 3]}})],
                           "output": [io("y", [3, 2], {"reshape": {"shape": [2, 3]}})],
                           # Warm-up samples have the clients' shape too.
                           "model_warmup": [{"name": "w", "batch_size": 2, "inputs": {
                               "x": {"data_type": "TYPE_FP32", "dims": [6], "zero_data": True}}}]}))
    one = oh.make_tensor("one", TP.FLOAT, [], [1.0])
    save_model(root, "scalar", oh.make_graph(
        [oh.make_node("Add", ["v", "one"], ["w"])], "scalar",
        [oh.make_tensor_value_info("v", TP.FLOAT, ["N"])], [oh.make_tensor_value_info("w", TP.FLOAT, ["N"])], [one]),
        config=json.dumps({"max_batch_size": 4, "input": [io("v", [1], {"reshape": {"shape": []}})],
                           "output": [io("w", [1], {"reshape": {}})]}))
    # Not batching: the client's [6] is the model's [2, 3].
    save_model(root, "rs_nb", oh.make_graph(
        [oh.make_node("Neg", ["x"], ["y"])], "rs_nb",
        [oh.make_tensor_value_info("x", TP.FLOAT, [2, 3])], [oh.make_tensor_value_info("y", TP.FLOAT, [2, 3])]),
        config=json.dumps({"input": [io("x", [6], {"reshape": {"shape": [2, 3]}})],
                           "output": [io("y", [6], {"reshape": {"shape": [2, 3]}})]}))


def test_config_round_trip_through_get_model_config(make_server, tmp_path):
    """kiln's own configuration, as tritonclient reads it (gRPC's JSON drops
    every default: max_batch_size 0, empty shapes, false booleans; int64 dims
    come as strings), loads again to the same configuration."""
    root = tmp_path / "repo"
    save_model(root, "nb", tiny_graph(), config=json.dumps(TINY_IO))
    save_model(root, "auto", tiny_graph())
    save_model(root, "multi", tiny_graph(0), version=1, config='{"version_policy": {"specific": {"versions": [1]}}}')
    save_model(root, "multi", tiny_graph(1), version=2)
    save_model(root, "tuned", tiny_graph(), config=json.dumps({
        "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
        "dynamic_batching": {"max_queue_delay_microseconds": 100, "preferred_batch_size": [4]},
        "output": [{"name": "probs", "label_filename": "labels.txt"}]}))
    (root / "tuned" / "labels.txt").write_text("a\nb\nc\n")
    _reshape_repo(root)
    _optional_repo(root)
    save_model(root, "groups", tiny_graph(), config=json.dumps({"instance_group": [{"count": 2}, {}]}))
    names = ["nb", "auto", "multi", "tuned", "rs", "scalar", "rs_nb", "opt", "groups"]
    if DIGITS.exists():  # the example model as shipped
        shutil.copytree(DIGITS, root / "digits")
        names.append("digits")
    s = make_server(root, "--model-control-mode", "explicit", *sum((["--load-model", n] for n in names), []))
    h = httpclient.InferenceServerClient(s.url)
    g = grpcclient.InferenceServerClient(s.grpc_url())
    for name in names:
        before = h.get_model_config(name)
        for text in (json.dumps(g.get_model_config(name, as_json=True)["config"]),
                     json.dumps(h.get_model_config(name))):
            h.load_model(name, config=text)
            assert h.get_model_config(name) == before, (name, text)
        assert h.is_model_ready(name)


# ---- reshape -----------------------------------------------------------

def test_reshape_inputs_and_outputs(make_server, tmp_path):
    root = tmp_path / "repo"
    _reshape_repo(root)
    s = make_server(root)
    h = httpclient.InferenceServerClient(s.url)
    g = grpcclient.InferenceServerClient(s.grpc_url())
    md = h.get_model_metadata("rs")
    assert md["inputs"][0]["shape"] == [-1, 6] and md["outputs"][0]["shape"] == [-1, 3, 2]
    assert h.get_model_config("rs")["input"][0]["reshape"] == {"shape": [2, 3]}
    x = np.arange(18, dtype=np.float32).reshape(3, 6)
    for mod, c in ((httpclient, h), (grpcclient, g)):
        y = c.infer("rs", [fp32("x", x, mod)]).as_numpy("y")
        assert y.shape == (3, 3, 2)
        np.testing.assert_array_equal(y.reshape(3, 6), 2 * x)
        v = np.array([[1.5], [2.5]], np.float32)
        w = c.infer("scalar", [fp32("v", v, mod)]).as_numpy("w")
        np.testing.assert_array_equal(w, v + 1)
        n = np.arange(6, dtype=np.float32)
        np.testing.assert_array_equal(c.infer("rs_nb", [fp32("x", n, mod)]).as_numpy("y"), -n)
    # Shapes are checked against dims, the clients' shape.
    with pytest.raises(InferenceServerException, match=r"shape \[1,2,3\] does not match"):
        h.infer("rs", [fp32("x", np.zeros((1, 2, 3), np.float32))])


def test_reshape_that_disagrees_is_refused_naming_it(make_server, tmp_path):
    root = tmp_path / "repo"
    _reshape_repo(root)
    s = make_server(root, "--model-control-mode", "explicit")
    c = httpclient.InferenceServerClient(s.url)
    bad = {"max_batch_size": 8, "input": [io("x", [6], {"reshape": {"shape": [3, 3]}})],
           "output": [io("y", [6], {"reshape": {"shape": [2, 3]}})]}
    msg = load_error(c, "rs", json.dumps(bad))
    assert "input[0].reshape" in msg and "9 elements but dims 6" in msg, msg
    bad["input"][0]["reshape"]["shape"] = [6]
    msg = load_error(c, "rs", json.dumps(bad))
    assert "reshape.shape has 1 entries but the model's input has rank 3" in msg, msg


# ---- platform and backend ----------------------------------------------

@pytest.mark.parametrize("field,value,ok", [
    ("platform", "onnxruntime_onnx", True), ("backend", "onnxruntime", True),
    ("platform", "tensorrt_plan", False), ("backend", "python", False), ("backend", "kiln", False)])
def test_platform_and_backend(make_server, tmp_path, field, value, ok):
    save_model(tmp_path / "repo", "tiny", tiny_graph())
    s = make_server(tmp_path / "repo", "--model-control-mode", "explicit")
    c = httpclient.InferenceServerClient(s.url)
    cfg = json.dumps({field: value})
    if ok:
        c.load_model("tiny", config=cfg)
        assert c.is_model_ready("tiny")
    else:
        msg = load_error(c, "tiny", cfg)
        assert f"config field '{field}' is '{value}'" in msg, msg
        assert not c.is_model_ready("tiny")


# ---- version_policy ----------------------------------------------------

@pytest.mark.parametrize("policy,served", [
    ({"latest": {"num_versions": 2}}, [2, 3]), ({"latest": {}}, [3]), (None, [3]),
    ({"all": {}}, [1, 2, 3]), ({"specific": {"versions": [1, 3]}}, [1, 3])])
def test_version_policy(make_server, tmp_path, policy, served):
    root = tmp_path / "repo"
    for v in (1, 2, 3):
        save_model(root, "m", tiny_graph(v), version=v,
                   config=json.dumps({"version_policy": policy}) if policy else None)
    s = make_server(root)
    h = httpclient.InferenceServerClient(s.url)
    g = grpcclient.InferenceServerClient(s.grpc_url())
    x = np.ones((1, 4), np.float32)
    answers = {}
    for v in (1, 2, 3):
        assert h.is_model_ready("m", str(v)) == (v in served)
        assert g.is_model_ready("m", str(v)) == (v in served)
        if v in served:
            answers[v] = h.infer("m", [fp32("x", x)], model_version=str(v)).as_numpy("logits")
        else:
            with pytest.raises(InferenceServerException, match="is not found"):
                h.infer("m", [fp32("x", x)], model_version=str(v))
    assert len({a.tobytes() for a in answers.values()}) == len(served)  # each version its own weights
    index = h.get_model_repository_index()
    assert sorted(int(e["version"]) for e in index if e["name"] == "m" and e["state"] == "READY") == served
    # No version: the highest served.
    np.testing.assert_array_equal(h.infer("m", [fp32("x", x)]).as_numpy("logits"), answers[max(served)])


def test_version_policy_selecting_nothing_is_refused(make_server, tmp_path):
    root = tmp_path / "repo"
    save_model(root, "m", tiny_graph(), version=1, config='{"version_policy": {"specific": {"versions": [4]}}}')
    s = make_server(root, "--model-control-mode", "explicit")
    c = httpclient.InferenceServerClient(s.url)
    msg = load_error(c, "m")
    assert "version_policy selects none of the versions present (1)" in msg, msg


# ---- label_filename ----------------------------------------------------

def test_labels_answer_classification(make_server, tmp_path):
    root = tmp_path / "repo"
    save_model(root, "lab", tiny_graph(), config=json.dumps(
        {"max_batch_size": 4, "input": [io("x", [4])],
         "output": [io("probs", [3], {"label_filename": "labels.txt"}), io("logits", [3])]}))
    (root / "lab" / "labels.txt").write_text("cat\ndog\nbird\n")
    s = make_server(root)
    h = httpclient.InferenceServerClient(s.url)
    g = grpcclient.InferenceServerClient(s.grpc_url())
    x = np.array([[1, -2, 3, 0.5]], np.float32)
    probs = h.infer("lab", [fp32("x", x)]).as_numpy("probs")[0]
    order = np.argsort(-probs)[:2]
    want = [f"{probs[i]:f}:{i}:{['cat', 'dog', 'bird'][i]}" for i in order]
    for mod, c in ((httpclient, h), (grpcclient, g)):
        r = c.infer("lab", [fp32("x", x, mod)], outputs=[mod.InferRequestedOutput("probs", class_count=2)])
        got = [v.decode() for v in r.as_numpy("probs").reshape(-1)]
        assert [e.split(":")[1:] for e in got] == [w.split(":")[1:] for w in want]
        assert [float(e.split(":")[0]) for e in got] == pytest.approx([probs[i] for i in order], rel=1e-5)
    # An output without labels answers score:index.
    r = h.infer("lab", [fp32("x", x)], outputs=[httpclient.InferRequestedOutput("logits", class_count=1)])
    assert len(r.as_numpy("logits").reshape(-1)[0].decode().split(":")) == 2


def test_missing_label_file_fails_the_load_naming_it(make_server, tmp_path):
    root = tmp_path / "repo"
    save_model(root, "lab", tiny_graph(), config='{"output": [{"name": "probs", "label_filename": "nope.txt"}]}')
    s = make_server(root, "--model-control-mode", "explicit")
    c = httpclient.InferenceServerClient(s.url)
    msg = load_error(c, "lab")
    assert "label_filename" in msg and "nope.txt" in msg, msg


# ---- instance_group and dynamic_batching --------------------------------

def test_instance_count_and_queue_delay(make_server, tmp_path):
    """instance_group [{count: 2}] runs two instances; a long
    max_queue_delay_microseconds holds the first request until the second
    joins it, so both run as one batch (one execution, two inferences)."""
    root = tmp_path / "repo"
    save_model(root, "tuned", tiny_graph(), config=json.dumps({
        "max_batch_size": 8, "instance_group": [{"count": 2}],
        "dynamic_batching": {"max_queue_delay_microseconds": 2000000}}))
    # Two groups: Triton runs each group's instances (count 1 by default).
    save_model(root, "groups", tiny_graph(), config=json.dumps({"instance_group": [{"count": 2}, {}]}))
    s = make_server(root)
    c = httpclient.InferenceServerClient(s.url)
    assert c.get_model_config("groups")["instance_group"][0]["count"] == 3
    assert "model 'groups' version 1" in s.text() and "3 instances on cpu" in s.text()
    cfg = c.get_model_config("tuned")
    assert cfg["instance_group"][0]["count"] == 2
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 2000000
    assert "2 instances on cpu" in s.text()
    x = np.ones((1, 4), np.float32)
    results = []
    barrier = threading.Barrier(2)

    def one():
        cl = httpclient.InferenceServerClient(s.url, network_timeout=60)
        barrier.wait()
        results.append(cl.infer("tuned", [fp32("x", x)]).as_numpy("probs"))
        cl.close()

    ts = [threading.Thread(target=one) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(results) == 2
    st = c.get_inference_statistics("tuned")["model_stats"][0]
    assert st["inference_count"] == 2 and st["execution_count"] == 1, st


# ---- optional inputs ---------------------------------------------------

def _optional_repo(root):
    # y = x * scale + bias; scale is an initializer the graph also lists as
    # an input (a default a caller may override), bias a plain input.
    scale = oh.make_tensor("scale", TP.FLOAT, [3], [2.0, 3.0, 4.0])
    g = oh.make_graph(
        [oh.make_node("Mul", ["x", "scale"], ["m"]), oh.make_node("Add", ["m", "bias"], ["y"])], "opt",
        [oh.make_tensor_value_info("x", TP.FLOAT, [3]), oh.make_tensor_value_info("scale", TP.FLOAT, [3]),
         oh.make_tensor_value_info("bias", TP.FLOAT, [3])],
        [oh.make_tensor_value_info("y", TP.FLOAT, [3])], [scale])
    save_model(root, "opt", g, config=json.dumps({
        "input": [io("x", [3]), io("scale", [3], {"optional": True}), io("bias", [3], {"optional": True})],
        "output": [io("y", [3])]}))
    return g


def test_optional_input_with_an_initializer_default(make_server, tmp_path):
    """An optional input the request leaves out runs with the graph's
    initializer for it; one it gives overrides it; an optional input the
    graph needs and has no default for is an error naming it."""
    root = tmp_path / "repo"
    _optional_repo(root)
    s = make_server(root)
    h = httpclient.InferenceServerClient(s.url)
    g = grpcclient.InferenceServerClient(s.grpc_url())
    x, b = np.array([1, 2, 3], np.float32), np.array([10, 20, 30], np.float32)
    md = h.get_model_metadata("opt")
    assert [i["name"] for i in md["inputs"]] == ["x", "bias", "scale"]
    assert [i.get("optional", False) for i in h.get_model_config("opt")["input"]] == [False, True, True]
    for mod, c in ((httpclient, h), (grpcclient, g)):
        y = c.infer("opt", [fp32("x", x, mod), fp32("bias", b, mod)]).as_numpy("y")
        np.testing.assert_array_equal(y, x * [2, 3, 4] + b)
        y = c.infer("opt", [fp32("x", x, mod), fp32("bias", b, mod), fp32("scale", np.ones(3, np.float32), mod)])
        np.testing.assert_array_equal(y.as_numpy("y"), x + b)
        with pytest.raises(InferenceServerException, match="optional input 'bias' of model 'opt' is missing"):
            c.infer("opt", [fp32("x", x, mod)])
        with pytest.raises(InferenceServerException, match="missing required input\\(s\\) \\['x'\\]"):
            c.infer("opt", [fp32("bias", b, mod)])


def test_optional_input_the_graph_does_not_read(make_server, tmp_path):
    """An optional input no node reads may be left out: the graph runs
    without it (on zeros of its shape, which nothing looks at)."""
    g = oh.make_graph([oh.make_node("Neg", ["x"], ["y"])], "unread",
                      [oh.make_tensor_value_info("x", TP.FLOAT, [3]), oh.make_tensor_value_info("extra", TP.FLOAT, ["K"])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, [3])])
    save_model(tmp_path / "repo", "unread", g, config=json.dumps({
        "input": [io("x", [3]), io("extra", [-1], {"optional": True})], "output": [io("y", [3])]}))
    s = make_server(tmp_path / "repo")
    c = httpclient.InferenceServerClient(s.url)
    x = np.array([1, -2, 3], np.float32)
    np.testing.assert_array_equal(c.infer("unread", [fp32("x", x)]).as_numpy("y"), -x)
    y = c.infer("unread", [fp32("x", x), fp32("extra", np.ones(5, np.float32))]).as_numpy("y")
    np.testing.assert_array_equal(y, -x)


def test_optional_input_the_model_lacks_fails_the_load(make_server, tmp_path):
    root = tmp_path / "repo"
    _optional_repo(root)
    s = make_server(root, "--model-control-mode", "explicit")
    c = httpclient.InferenceServerClient(s.url)
    cfg = {"input": [io("x", [3]), io("nope", [3], {"optional": True})], "output": [io("y", [3])]}
    msg = load_error(c, "opt", json.dumps(cfg))
    assert "'nope' is not a graph input" in msg, msg
    # A batching model: a default has no rows of its own.
    g = oh.make_graph([oh.make_node("Neg", ["x"], ["y"])], "unread",
                      [oh.make_tensor_value_info("x", TP.FLOAT, ["N", 3]),
                       oh.make_tensor_value_info("extra", TP.FLOAT, ["N", 2])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, ["N", 3])])
    save_model(root, "unread", g)
    cfg = {"max_batch_size": 4, "input": [io("x", [3]), io("extra", [2], {"optional": True})], "output": [io("y", [3])]}
    msg = load_error(c, "unread", json.dumps(cfg))
    assert "config field 'input' of 'extra'" in msg and "max_batch_size 4" in msg, msg
