"""Every endpoint of the KServe v2 protocol through the official tritonclient.http,
plus the raw shapes the client does not check (status codes, content types)."""
import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import DIGITS, raw_request


def test_health(client):
    assert client.is_server_live()
    assert client.is_server_ready()


def test_server_metadata(client):
    md = client.get_server_metadata()
    assert md["name"] == "kiln"
    assert md["version"]
    for ext in ("binary_tensor_data", "classification", "model_repository", "model_configuration", "statistics"):
        assert ext in md["extensions"]


def test_model_metadata_batching(client):
    md = client.get_model_metadata("tiny")
    assert md["name"] == "tiny"
    assert md["versions"] == ["1"]
    assert md["platform"] == "onnxruntime_onnx"
    assert md["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert md["outputs"] == [{"name": "probs", "datatype": "FP32", "shape": [-1, 3]},
                             {"name": "logits", "datatype": "FP32", "shape": [-1, 3]}]


def test_model_metadata_fixed_shape(client):
    md = client.get_model_metadata("typed")
    assert md["inputs"] == [{"name": "i", "datatype": "INT64", "shape": [2, 3]},
                            {"name": "flag", "datatype": "BOOL", "shape": [2, 3]}]


def test_model_metadata_versions(client):
    md = client.get_model_metadata("multi")
    assert md["versions"] == ["1", "2"]
    assert client.get_model_metadata("multi", "1")["name"] == "multi"


def test_model_ready(client):
    assert client.is_model_ready("tiny")
    assert client.is_model_ready("multi", "1")
    assert client.is_model_ready("multi", "2")
    assert not client.is_model_ready("multi", "3")
    assert not client.is_model_ready("no_such_model")


def test_model_config_triton_fields(client):
    cfg = client.get_model_config("tiny")
    assert cfg["name"] == "tiny"
    assert cfg["platform"] == "onnxruntime_onnx"
    assert cfg["max_batch_size"] > 0  # auto-completed: the first dims are symbolic
    assert cfg["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]
    assert [o["name"] for o in cfg["output"]] == ["probs", "logits"]
    assert cfg["output"][0]["dims"] == [3]
    assert "dynamic_batching" in cfg
    assert cfg["instance_group"][0]["count"] >= 1
    assert cfg["response_cache"]["enable"] is False
    fixed = client.get_model_config("typed")
    assert fixed["max_batch_size"] == 0
    assert fixed["input"][1] == {"name": "flag", "data_type": "TYPE_BOOL", "dims": [2, 3]}


@pytest.mark.skipif(not DIGITS.exists(), reason="model_repository/digits is not in the tree")
def test_digits_config_from_file(client):
    cfg = client.get_model_config("digits")
    file_cfg = json.loads((DIGITS / "config.json").read_text())
    assert cfg["max_batch_size"] == file_cfg["max_batch_size"]
    assert cfg["input"][0]["name"] == file_cfg["input"][0]["name"]
    assert cfg["input"][0]["dims"] == file_cfg["input"][0]["dims"]


def test_statistics(client):
    x = np.ones((2, 4), np.float32)
    inp = httpclient.InferInput("x", x.shape, "FP32")
    inp.set_data_from_numpy(x)
    before = client.get_inference_statistics("tiny")["model_stats"][0]
    client.infer("tiny", [inp])
    st = client.get_inference_statistics("tiny")
    assert len(st["model_stats"]) == 1
    s = st["model_stats"][0]
    assert s["name"] == "tiny" and s["version"] == "1"
    assert s["inference_count"] == before["inference_count"] + 2
    assert s["execution_count"] >= before["execution_count"] + 1
    assert s["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    for k in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
              "cache_miss"):
        assert set(s["inference_stats"][k]) == {"count", "ns"}
    assert s["inference_stats"]["compute_infer"]["ns"] > 0
    assert s["last_inference"] > 0
    assert any(b["batch_size"] >= 1 for b in s["batch_stats"])
    every = client.get_inference_statistics()
    names = {m["name"] for m in every["model_stats"]}
    assert {"tiny", "typed", "multi"} <= names
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_inference_statistics("no_such_model")


def test_repository_index(client):
    index = client.get_model_repository_index()
    by_name = {(m["name"], m.get("version")): m for m in index}
    assert by_name[("tiny", "1")]["state"] == "READY"
    assert by_name[("multi", "1")]["state"] == "READY" and by_name[("multi", "2")]["state"] == "READY"


def test_metrics(server, client):
    x = np.ones((1, 4), np.float32)
    inp = httpclient.InferInput("x", x.shape, "FP32")
    inp.set_data_from_numpy(x)
    client.infer("tiny", [inp])
    status, headers, body = raw_request(server.url, "GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    text = body.decode()
    for name in ("kiln_inference_request_success", "kiln_inference_request_failure", "kiln_inference_count",
                 "kiln_inference_exec_count", "kiln_request_duration_seconds_bucket",
                 "kiln_queue_duration_seconds_bucket", "kiln_compute_duration_seconds_bucket",
                 "kiln_inference_pending_request_count", "kiln_model_load_duration_seconds"):
        assert name in text, name
    line = next(l for l in text.splitlines() if l.startswith('kiln_inference_request_success{model="tiny",version="1"}'))
    assert float(line.split()[-1]) >= 1
    assert 'reason="invalid"' in text


def test_unknown_path_is_404(server):
    status, _, body = raw_request(server.url, "GET", "/v2/nothing/here")
    assert status == 404
    assert "error" in json.loads(body)


def test_wrong_method_is_405(server):
    for method, path in (("GET", "/v2/models/tiny/infer"), ("POST", "/v2/health/live"),
                         ("DELETE", "/v2/models/tiny"), ("GET", "/v2/repository/index")):
        status, headers, body = raw_request(server.url, method, path)
        assert status == 405, (method, path)
        assert "method" in json.loads(body)["error"]
        assert "Allow" in headers


def test_health_ready_content(server):
    status, _, body = raw_request(server.url, "GET", "/v2/health/ready")
    assert status == 200 and body == b""
    status, _, body = raw_request(server.url, "GET", "/v2/models/no_such_model/ready")
    assert status == 400 and "no_such_model" in json.loads(body)["error"]


def test_replies_carry_a_current_date(server):
    """kiln writes the Date header itself (formatted once a second): every
    reply has one, in RFC 9110's IMF-fixdate form, and current."""
    import email.utils
    import time
    for method, path, body in (("GET", "/v2/health/ready", None), ("GET", "/v2/models/tiny", None),
                               ("GET", "/v2/nothing/here", None), ("POST", "/v2/models/tiny/infer", "{")):
        status, headers, _ = raw_request(server.url, method, path, body)
        date = headers.get("Date")
        assert date and date.endswith(" GMT"), (path, headers)
        when = email.utils.parsedate_to_datetime(date).timestamp()
        assert abs(when - time.time()) < 120, (path, date)


def test_percent_encoded_path_segments_are_decoded(server):
    """Only segments holding '%' are decoded; '+' stays '+' in a path."""
    status, _, body = raw_request(server.url, "GET", "/v2/models/%74iny")
    assert status == 200 and json.loads(body)["name"] == "tiny"
    status, _, body = raw_request(server.url, "GET", "/v2/models/ti+ny")
    assert status == 404 and "ti+ny" in json.loads(body)["error"]
