"""config.pbtxt, Triton's protobuf text model configuration: served with the
values it gives over HTTP and gRPC, the same as the equivalent config.json,
refused when a folder holds both or a field kiln cannot honour, warned about
once for a field that cannot change results, and round trips: what GET
.../config returns saved as config.json, and the gRPC ModelConfig printed as
text format saved as config.pbtxt, load back to the same configuration."""
import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format, text_format

from conftest import raw_request, save_model, serving, tiny_graph

TEXTUAL = """# A Triton model configuration, in protobuf text format.
name: "textual"
platform: "onnxruntime_onnx"
max_batch_size: 8   # rows per batch
input [
  {
    name: "x"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output { name: "probs" data_type: TYPE_FP32 dims: 3 }
output: { name: 'logits', data_type: TYPE_FP32, dims: [3] }
dynamic_batching {
  preferred_batch_size: [ 2, 4 ]
  max_queue_delay_microseconds: 700
  default_queue_policy { max_queue_size: 64 }
}
instance_group [ { count: 2, kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
response_cache { enable: false }
"""

JSONIC = {
    "name": "jsonic", "platform": "onnxruntime_onnx", "max_batch_size": 8,
    "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "probs", "data_type": "TYPE_FP32", "dims": [3]},
               {"name": "logits", "data_type": "TYPE_FP32", "dims": [3]}],
    "dynamic_batching": {"preferred_batch_size": [2, 4], "max_queue_delay_microseconds": 700,
                         "default_queue_policy": {"max_queue_size": 64}},
    "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
    "parameters": {"intra_op_thread_count": {"string_value": "1"}},
    "response_cache": {"enable": False},
}


def put_pbtxt(root, name, text):
    save_model(root, name, tiny_graph())
    (root / name / "config.pbtxt").write_text(text)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("pbtxt") / "repo"
    put_pbtxt(root, "textual", TEXTUAL)
    save_model(root, "jsonic", tiny_graph(), config=json.dumps(JSONIC))
    save_model(root, "both", tiny_graph(), config='{"max_batch_size": 4}')
    (root / "both" / "config.pbtxt").write_text("max_batch_size: 4\n")
    put_pbtxt(root, "stateful", "max_batch_size: 4\nsequence_batching {\n  iterative_sequence: true\n}\n")
    put_pbtxt(root, "typo", "max_batch_size: 4\ninstance_group [\n  { count: two }\n]\n")
    put_pbtxt(root, "unknown", "max_batch_size: 4\nmax_queue_delay: 5\n")
    put_pbtxt(root, "warned", "max_batch_size: 4\n"
              "optimization { execution_accelerators { cpu_execution_accelerator : [ { name : \"openvino\" } ] } }\n"
              "model_operations { op_library_filename: \"libcustom.so\" }\n")
    yield from serving(root)


def unnamed(cfg):
    """A configuration without its names (the model's and the instance group's)."""
    cfg = json.loads(json.dumps(cfg))
    cfg.pop("name")
    for gr in cfg["instance_group"]:
        gr.pop("name")
    return cfg


def index(s):
    st, _, body = raw_request(s.url, "POST", "/v2/repository/index", "{}")
    assert st == 200
    return {e["name"]: e for e in json.loads(body)}


def test_pbtxt_values_are_served_over_http_and_grpc(srv):
    h = httpclient.InferenceServerClient(srv.url)
    g = grpcclient.InferenceServerClient(srv.grpc_url())
    try:
        for cfg in (h.get_model_config("textual"), g.get_model_config("textual", as_json=True)["config"]):
            assert int(cfg["max_batch_size"]) == 8
            assert int(cfg["instance_group"][0]["count"]) == 2
            assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
            db = cfg["dynamic_batching"]
            assert int(db["max_queue_delay_microseconds"]) == 700
            assert [int(x) for x in db["preferred_batch_size"]] == [2, 4]
            assert int(db["default_queue_policy"]["max_queue_size"]) == 64
            assert [(i["name"], i["data_type"], [int(d) for d in i["dims"]]) for i in cfg["input"]] == \
                [("x", "TYPE_FP32", [4])]
            assert {o["name"] for o in cfg["output"]} == {"probs", "logits"}
            assert cfg["parameters"]["intra_op_thread_count"]["string_value"] == "1"
        # And the model answers, batched under the configured bound.
        x = httpclient.InferInput("x", [3, 4], "FP32")
        x.set_data_from_numpy(np.ones((3, 4), np.float32))
        probs = h.infer("textual", [x]).as_numpy("probs")
        assert probs.shape == (3, 3) and np.allclose(probs.sum(axis=1), 1, atol=1e-5)
    finally:
        h.close()
        g.close()


def test_pbtxt_and_json_give_the_same_configuration(srv):
    h = httpclient.InferenceServerClient(srv.url)
    try:
        a, b = h.get_model_config("textual"), h.get_model_config("jsonic")
    finally:
        h.close()
    assert unnamed(a) == unnamed(b)


def test_a_folder_with_both_files_fails_naming_both(srv):
    r = index(srv)["both"]
    assert r["state"] == "UNAVAILABLE"
    assert "config.json" in r["reason"] and "config.pbtxt" in r["reason"]
    assert "model 'both'" in srv.text() and "both config.json and config.pbtxt" in srv.text()


def test_a_refused_field_is_named(srv):
    r = index(srv)["stateful"]
    assert r["state"] == "UNAVAILABLE"
    assert "config.pbtxt: config field 'sequence_batching.iterative_sequence' is not supported" in r["reason"]


def test_syntax_errors_name_line_column_and_field(srv):
    ix = index(srv)
    assert ix["typo"]["state"] == "UNAVAILABLE"
    assert "config.pbtxt:3:12: field 'instance_group.count': expected a 32-bit integer, got 'two'" in ix["typo"]["reason"]
    assert "config.pbtxt:2:1: unknown field 'max_queue_delay'" in ix["unknown"]["reason"]
    # The others are served all the same.
    assert ix["textual"]["state"] == "READY" and ix["jsonic"]["state"] == "READY"


def test_a_warned_field_is_logged_once_and_the_model_served(srv):
    assert index(srv)["warned"]["state"] == "READY"
    lines = [ln for ln in srv.text().splitlines() if " warn " in ln and "model 'warned'" in ln]
    acc = [ln for ln in lines if "'optimization.execution_accelerators' is accepted but ignored" in ln]
    ops = [ln for ln in lines if "'model_operations' is accepted but ignored" in ln]
    assert len(acc) == 1 and len(ops) == 1, lines
    assert "config.pbtxt" in acc[0]
    # Models without such fields warn about none.
    assert not [ln for ln in srv.text().splitlines() if " warn " in ln and "model 'textual'" in ln]


def test_served_configurations_load_back_the_same(srv, tmp_path, make_server):
    """HTTP's JSON saved as config.json, gRPC's message printed as text format
    saved as config.pbtxt, and as protobuf's JSON (camelCase names, 64-bit
    integers as strings) saved as config.json, each load back to what was
    served."""
    h = httpclient.InferenceServerClient(srv.url)
    g = grpcclient.InferenceServerClient(srv.grpc_url())
    try:
        served = {m: h.get_model_config(m) for m in ("textual", "jsonic")}
        as_text = text_format.MessageToString(g.get_model_config("jsonic").config)
        msg = g.get_model_config("textual").config
        msg.name = "camel"
        as_proto_json = json_format.MessageToJson(msg)
    finally:
        h.close()
        g.close()
    assert "max_batch_size: 8" in as_text
    assert '"maxBatchSize": 8' in as_proto_json and '"maxQueueDelayMicroseconds": "700"' in as_proto_json
    root = tmp_path / "again"
    save_model(root, "textual", tiny_graph(), config=json.dumps(served["textual"]))
    put_pbtxt(root, "jsonic", as_text)
    save_model(root, "camel", tiny_graph(), config=as_proto_json)
    s = make_server(root)
    assert not [ln for ln in s.text().splitlines() if " warn " in ln and "model '" in ln], s.text()
    h = httpclient.InferenceServerClient(s.url)
    try:
        for m in ("textual", "jsonic"):
            assert h.get_model_config(m) == served[m], m
        assert unnamed(h.get_model_config("camel")) == unnamed(served["textual"])
    finally:
        h.close()
