"""model_warmup: samples run on every instance while a model loads, before
it is ready. A model whose warmup is wrong does not load and says why; the
server and its other models go on."""
import json
import struct

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import raw_request, save_model, strings_graph, tiny_graph, typed_graph


def warm(name, inputs, batch_size=None, count=None):
    s = {"name": name, "inputs": inputs}
    if batch_size is not None:
        s["batch_size"] = batch_size
    if count is not None:
        s["count"] = count
    return s


def x_input(**src):
    return {"x": {"data_type": "TYPE_FP32", "dims": [4], **src}}


@pytest.fixture()
def warm_repo(tmp_path):
    root = tmp_path / "repo"
    save_model(root, "tiny", tiny_graph(), config=json.dumps({
        "max_batch_size": 8, "dynamic_batching": {}, "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
        "model_warmup": [warm("zeros", x_input(zero_data=True), batch_size=8),
                         warm("random", x_input(random_data=True), batch_size=3, count=2),
                         warm("file", x_input(input_data_file="row.bin"))]}))
    (root / "tiny" / "warmup").mkdir()
    (root / "tiny" / "warmup" / "row.bin").write_bytes(struct.pack("4f", 1, 2, 3, 4))
    save_model(root, "typed", typed_graph(), config=json.dumps({"model_warmup": [warm("r", {
        "i": {"data_type": "TYPE_INT64", "dims": [2, 3], "random_data": True},
        "flag": {"data_type": "TYPE_BOOL", "dims": [2, 3], "zero_data": True}})]}))
    save_model(root, "strings", strings_graph(), config=json.dumps({"model_warmup": [
        warm("empty", {"s": {"data_type": "TYPE_STRING", "dims": [2], "zero_data": True}}),
        warm("digits", {"s": {"data_type": "TYPE_STRING", "dims": [2], "random_data": True}}),
        warm("file", {"s": {"data_type": "TYPE_STRING", "dims": [2], "input_data_file": "s.bin"}},
             batch_size=2)]}))
    (root / "strings" / "warmup").mkdir()
    (root / "strings" / "warmup" / "s.bin").write_bytes(
        b"".join(struct.pack("<I", len(v)) + v for v in (b"a", b"xyz")))
    return root


def test_warmup_runs_before_ready(make_server, warm_repo):
    s = make_server(warm_repo)
    log = s.text()
    # Each sample on each instance, logged before the model's load line.
    for sample in ("zeros", "random", "file"):
        assert f"model 'tiny': warmup sample '{sample}'" in log
    assert log.index("model 'tiny': warmup sample 'file'") < log.index("loaded model 'tiny'")
    assert "model 'typed': warmup sample 'r'" in log
    assert "model 'strings': warmup sample 'file'" in log
    c = httpclient.InferenceServerClient(s.url)
    assert c.is_model_ready("tiny") and c.is_model_ready("typed") and c.is_model_ready("strings")
    # Counted nowhere: the statistics start at zero.
    st = c.get_inference_statistics("tiny")["model_stats"][0]
    assert int(st["inference_count"]) == 0 and int(st["execution_count"]) == 0
    # GET .../config shows the samples as the model has them.
    cfg = c.get_model_config("tiny")
    assert [w["name"] for w in cfg["model_warmup"]] == ["zeros", "random", "file"]
    assert cfg["model_warmup"][1]["count"] == 2 and cfg["model_warmup"][2]["batch_size"] == 1
    assert cfg["model_warmup"][2]["inputs"]["x"]["input_data_file"] == "row.bin"
    # And the model answers as before.
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inp = httpclient.InferInput("x", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    r = c.infer("tiny", [inp])
    assert r.as_numpy("probs").shape == (2, 3)
    c.close()


BAD = [
    ("missing input", {"model_warmup": [warm("w", {})]}, "inputs must be an object"),
    ("unknown input", {"model_warmup": [warm("w", {**x_input(zero_data=True),
                                                   "y": {"data_type": "TYPE_FP32", "dims": [4], "zero_data": True}})]},
     "no input 'y'"),
    ("wrong type", {"model_warmup": [warm("w", {"x": {"data_type": "TYPE_INT32", "dims": [4], "zero_data": True}})]},
     "TYPE_INT32 but the model's is TYPE_FP32"),
    ("wrong dims", {"model_warmup": [warm("w", {"x": {"data_type": "TYPE_FP32", "dims": [5], "zero_data": True}})]},
     "dim 0 is 5 but the model's is 4"),
    ("two sources", {"model_warmup": [warm("w", x_input(zero_data=True, random_data=True))]},
     "exactly one of zero_data"),
    ("no source", {"model_warmup": [warm("w", x_input())]}, "exactly one of zero_data"),
    ("batch too big", {"max_batch_size": 4, "model_warmup": [warm("w", x_input(zero_data=True), batch_size=5)]},
     "batch_size 5 is over max_batch_size (4)"),
    ("path in file", {"model_warmup": [warm("w", x_input(input_data_file="../x.bin"))]},
     "file name in the model's warmup folder"),
    ("absent file", {"model_warmup": [warm("w", x_input(input_data_file="none.bin"))]}, "none.bin"),
    ("short file", {"model_warmup": [warm("w", x_input(input_data_file="short.bin"))]},
     "'short.bin' has 8 bytes; one row of the input is 16"),
    ("not an array", {"model_warmup": {"name": "w"}}, "must be an array"),
    ("bad count", {"model_warmup": [warm("w", x_input(zero_data=True), count=-1)]}, "count must be an integer"),
    # 70 samples of 2^20 rows of 16 bytes: over the 1 GiB all samples may take, refused before any is built.
    ("too large", {"max_batch_size": 1 << 20, "model_warmup": [warm("w", x_input(zero_data=True), batch_size=1 << 20)] * 70},
     "over 1073741824 bytes, the most a warm-up may build"),
]


@pytest.mark.parametrize("case,config,words", BAD, ids=[b[0] for b in BAD])
def test_bad_warmup_fails_the_load(make_server, tmp_path, case, config, words):
    root = tmp_path / "repo"
    save_model(root, "bad", tiny_graph(), config=json.dumps(config))
    (root / "bad" / "warmup").mkdir()
    (root / "bad" / "warmup" / "short.bin").write_bytes(b"\0" * 8)
    save_model(root, "good", tiny_graph())
    s = make_server(root)
    status, _, body = raw_request(s.url, "POST", "/v2/repository/index")
    reasons = {m["name"]: m for m in json.loads(body)}
    assert reasons["bad"]["state"] == "UNAVAILABLE"
    assert words in reasons["bad"]["reason"], reasons["bad"]["reason"]
    assert "'w'" in reasons["bad"]["reason"] or case == "not an array"
    # The rest of the server is untouched.
    assert reasons["good"]["state"] == "READY"
    c = httpclient.InferenceServerClient(s.url)
    inp = httpclient.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(np.ones((1, 4), np.float32))
    assert c.infer("good", [inp]).as_numpy("probs").shape == (1, 3)
    c.close()


def test_no_batching_model_takes_batch_size_one(make_server, tmp_path):
    root = tmp_path / "repo"
    save_model(root, "typed", typed_graph(), config=json.dumps({"model_warmup": [warm("w", {
        "i": {"data_type": "TYPE_INT64", "dims": [2, 3], "zero_data": True},
        "flag": {"data_type": "TYPE_BOOL", "dims": [2, 3], "zero_data": True}}, batch_size=2)]}))
    s = make_server(root)
    _, _, body = raw_request(s.url, "POST", "/v2/repository/index")
    reason = {m["name"]: m for m in json.loads(body)}["typed"]["reason"]
    assert "batch_size must be 1: the model does not batch" in reason
