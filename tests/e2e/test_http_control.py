"""Model control: explicit load/unload through tritonclient, the control
token, version policies, poll mode, and reloads under concurrent traffic with
zero failed requests."""
import shutil
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import raw_request, reload_under_traffic, save_model, tiny_graph


def infer_tiny(c, model="tiny", version=""):
    x = np.ones((1, 4), np.float32)
    i = httpclient.InferInput("x", [1, 4], "FP32")
    i.set_data_from_numpy(x)
    return c.infer(model, [i], model_version=version)


def test_explicit_load_unload(make_server, small_repo):
    s = make_server(small_repo, "--model-control-mode", "explicit", "--load-model", "tiny")
    c = httpclient.InferenceServerClient(s.url)
    assert c.is_model_ready("tiny")
    assert not c.is_model_ready("typed")
    index = {m["name"]: m for m in c.get_model_repository_index()}
    assert index["tiny"]["state"] == "READY"
    assert index["typed"]["state"] == "UNAVAILABLE"
    with pytest.raises(InferenceServerException, match="'typed'"):
        c.get_model_metadata("typed")
    c.load_model("typed")
    assert c.is_model_ready("typed")
    c.unload_model("tiny")
    assert not c.is_model_ready("tiny")
    with pytest.raises(InferenceServerException, match="not ready"):
        infer_tiny(c)
    c.load_model("tiny")
    assert infer_tiny(c).as_numpy("probs").shape == (1, 3)
    with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
        c.load_model("no_such_model")
    c.close()
    # One log line per load with its time.
    assert "loaded model 'typed' version 1 in" in s.text()


def test_failed_load_reports_reason(make_server, small_repo):
    bad = small_repo / "broken" / "1"
    bad.mkdir(parents=True)
    (bad / "model.onnx").write_bytes(b"this is not protobuf")
    s = make_server(small_repo, "--model-control-mode", "explicit")
    c = httpclient.InferenceServerClient(s.url)
    with pytest.raises(InferenceServerException, match="broken"):
        c.load_model("broken")
    index = {m["name"]: m for m in c.get_model_repository_index()}
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert index["broken"]["reason"]
    c.close()


def test_control_refused_in_none_mode(server):
    status, _, body = raw_request(server.url, "POST", "/v2/repository/models/tiny/unload")
    assert status == 400 and b"explicit" in body


def test_control_token(make_server, small_repo):
    s = make_server(small_repo, "--model-control-mode", "explicit", env={"KILN_CONTROL_TOKEN": "s3cret"})
    c = httpclient.InferenceServerClient(s.url)
    with pytest.raises(InferenceServerException, match="Authorization"):
        c.load_model("tiny")
    with pytest.raises(InferenceServerException, match="Authorization"):
        c.load_model("tiny", headers={"Authorization": "Bearer wrong"})
    c.load_model("tiny", headers={"Authorization": "Bearer s3cret"})
    assert c.is_model_ready("tiny")
    status, _, _ = raw_request(s.url, "POST", "/v2/repository/models/tiny/unload")
    assert status == 401
    c.close()


def test_version_policies(make_server, tmp_path):
    root = tmp_path / "repo"
    for v in (1, 2, 3):
        save_model(root, "latest", tiny_graph(v), version=v)
        save_model(root, "two", tiny_graph(v), version=v)
        save_model(root, "pick", tiny_graph(v), version=v)
    (root / "two" / "config.json").write_text('{"version_policy": {"latest": {"num_versions": 2}}}')
    (root / "pick" / "config.json").write_text('{"version_policy": {"specific": {"versions": [1, 3]}}}')
    s = make_server(root)
    c = httpclient.InferenceServerClient(s.url)
    assert c.get_model_metadata("latest")["versions"] == ["3"]
    assert c.get_model_metadata("two")["versions"] == ["2", "3"]
    assert c.get_model_metadata("pick")["versions"] == ["1", "3"]
    assert not c.is_model_ready("pick", "2")
    c.close()


def test_reload_under_traffic_no_failures(make_server, tmp_path):
    root = tmp_path / "repo"
    save_model(root, "hot", tiny_graph(0), version=1)
    s = make_server(root, "--model-control-mode", "explicit", "--load-model", "hot")
    ctl = httpclient.InferenceServerClient(s.url)
    ok, fail, versions = reload_under_traffic(
        root, "hot", lambda: ctl.load_model("hot"), lambda i: httpclient.InferenceServerClient(s.url),
        lambda c: infer_tiny(c, "hot").get_response()["model_version"], lambda c: c.close())
    assert fail == []
    assert ok > 50
    assert versions == {"1", "2"}
    assert ctl.get_model_metadata("hot")["versions"] == ["2"]


def test_unload_other_model_under_traffic(make_server, small_repo):
    """Unloading and loading one model never disturbs traffic on another."""
    s = make_server(small_repo, "--model-control-mode", "explicit", "--load-model", "tiny", "--load-model", "typed")
    stop = threading.Event()
    fails, oks = [], [0]

    def traffic():
        c = httpclient.InferenceServerClient(s.url)
        while not stop.is_set():
            try:
                infer_tiny(c)
                oks[0] += 1
            except Exception as e:
                fails.append(repr(e))
        c.close()

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for t in threads:
        t.start()
    ctl = httpclient.InferenceServerClient(s.url)
    try:
        for _ in range(5):
            ctl.unload_model("typed")
            ctl.load_model("typed")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert fails == [] and oks[0] > 0
    ctl.close()


def test_poll_mode(make_server, tmp_path):
    root = tmp_path / "repo"
    save_model(root, "tiny", tiny_graph())
    s = make_server(root, "--model-control-mode", "poll", "--repository-poll-secs", "1")
    c = httpclient.InferenceServerClient(s.url)
    assert c.is_model_ready("tiny")
    save_model(root, "later", tiny_graph(2))
    deadline = time.monotonic() + 10
    while not c.is_model_ready("later") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert c.is_model_ready("later")
    shutil.rmtree(root / "later")
    deadline = time.monotonic() + 10
    while c.is_model_ready("later") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not c.is_model_ready("later")
    assert c.is_model_ready("tiny")
    c.close()


def test_load_with_config_override(make_server, small_repo):
    """tritonclient's load_model(config=...) replaces config.json for that load."""
    s = make_server(small_repo, "--model-control-mode", "explicit")
    c = httpclient.InferenceServerClient(s.url)
    c.load_model("tiny", config='{"max_batch_size": 4, "instance_group": [{"count": 2}]}')
    cfg = c.get_model_config("tiny")
    assert cfg["max_batch_size"] == 4 and cfg["instance_group"][0]["count"] == 2
    with pytest.raises(InferenceServerException, match="max_batch_size"):
        c.load_model("tiny", config='{"max_batch_size": -3}')
    assert c.get_model_config("tiny")["max_batch_size"] == 4  # a failed reload keeps the old version
    c.load_model("tiny")
    assert c.get_model_config("tiny")["max_batch_size"] == 32
    status, _, body = raw_request(s.url, "POST", "/v2/repository/models/tiny/load",
                                  '{"parameters": {"file:1/model.onnx": "AAAA"}}')
    assert status == 400 and b"file:" in body
    c.close()
