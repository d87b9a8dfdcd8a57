"""The bad-request catalogue: each malformed request gets the right status and
an {"error": ...} body whose message names what was wrong. Sent raw, since
the client library would refuse to build most of them."""
import json
import struct

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import raw_request


def infer_raw(server, body, headers=None, model="tiny", version=None):
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    status, hdrs, raw = raw_request(server.url, "POST", path, body, headers)
    return status, json.loads(raw) if raw else {}


def x_input(**over):
    d = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
    d.update(over)
    return d


CATALOGUE = [
    # (what, body, expected status, words the message must contain)
    ("malformed JSON", '{"inputs": [', 400, ["malformed JSON"]),
    ("not an object", "[1, 2]", 400, ["JSON object"]),
    ("missing inputs", {"outputs": []}, 400, ["'inputs'"]),
    ("inputs not an array", {"inputs": {}}, 400, ["'inputs'"]),
    ("missing input name", {"inputs": [{"shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}, 400,
     ["inputs[0].name"]),
    ("unknown datatype", {"inputs": [x_input(datatype="FLOAT")]}, 400, ["'x'", "datatype"]),
    ("wrong datatype", {"inputs": [x_input(datatype="INT32")]}, 400, ["'x'", "INT32", "FP32"]),
    ("shape not an array", {"inputs": [x_input(shape="1,4")]}, 400, ["'x'", "shape"]),
    ("negative dim", {"inputs": [x_input(shape=[1, -4])]}, 400, ["'x'", "shape[1]"]),
    ("count mismatch", {"inputs": [x_input(data=[1, 2, 3])]}, 400, ["'x'", "3 elements", "[1,4]"]),
    ("shape mismatch", {"inputs": [x_input(shape=[1, 5], data=[1, 2, 3, 4, 5])]}, 400, ["'x'", "[1,5]", "[-1,4]"]),
    ("batch too large", {"inputs": [x_input(shape=[1000, 4], data=[0] * 4000)]}, 400, ["'x'", "max_batch_size"]),
    ("string in FP32 data", {"inputs": [x_input(data=[1, "a", 3, 4])]}, 400, ["'x'", "data[1]"]),
    ("missing input", {"inputs": [x_input(name="y")]}, 400, ["'y'"]),
    ("unknown output", {"inputs": [x_input()], "outputs": [{"name": "nope"}]}, 400, ["'nope'", "output"]),
    ("both data and binary", {"inputs": [x_input(parameters={"binary_data_size": 16})]}, 400, ["'x'", "both"]),
    ("neither data nor binary", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32"}]}, 400,
     ["'x'", "neither"]),
    ("duplicate input", {"inputs": [x_input(), x_input()]}, 400, ["'x'", "twice"]),
    ("bad id type", {"id": 7, "inputs": [x_input()]}, 400, ["'id'"]),
    ("bad binary_data_output", {"inputs": [x_input()], "parameters": {"binary_data_output": "yes"}}, 400,
     ["binary_data_output"]),
    ("bad classification", {"inputs": [x_input()], "outputs": [{"name": "probs", "parameters": {"classification": -1}}]},
     400, ["'probs'", "classification"]),
]


@pytest.mark.parametrize("what,body,code,words", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_bad_request(server, what, body, code, words):
    status, doc = infer_raw(server, body)
    assert status == code, doc
    for w in words:
        assert w in doc["error"], (w, doc["error"])


def binary_body(header, payload):
    h = json.dumps(header).encode()
    return h + payload, {"Inference-Header-Content-Length": str(len(h)), "Content-Type": "application/octet-stream"}


def test_binary_size_not_matching_shape(server):
    body, hdrs = binary_body({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                          "parameters": {"binary_data_size": 12}}]}, b"\0" * 12)
    status, doc = infer_raw(server, body, hdrs)
    assert status == 400 and "'x'" in doc["error"] and "binary_data_size" in doc["error"]


def test_binary_sizes_not_adding_up(server):
    body, hdrs = binary_body({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                          "parameters": {"binary_data_size": 16}}]}, b"\0" * 20)
    status, doc = infer_raw(server, body, hdrs)
    assert status == 400 and "add up" in doc["error"]
    body, hdrs = binary_body({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                          "parameters": {"binary_data_size": 16}}]}, b"\0" * 8)
    status, doc = infer_raw(server, body, hdrs)
    assert status == 400 and "'x'" in doc["error"] and "binary_data_size" in doc["error"]


@pytest.mark.parametrize("value", ["100000", "-1", "abc"])
def test_header_length_out_of_range(server, value):
    body = json.dumps({"inputs": [x_input()]}).encode()
    status, doc = infer_raw(server, body, {"Inference-Header-Content-Length": value})
    assert status == 400 and "Inference-Header-Content-Length" in doc["error"]


def test_binary_without_header_length(server):
    body, _ = binary_body({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 16}}]}, b"\0" * 16)
    status, doc = infer_raw(server, body)
    assert status == 400 and "Inference-Header-Content-Length" in doc["error"]


def test_bytes_truncated_element(server):
    payload = struct.pack("<I", 10) + b"abc"
    body, hdrs = binary_body({"inputs": [{"name": "s", "shape": [1, 1], "datatype": "BYTES",
                                          "parameters": {"binary_data_size": len(payload)}}]}, payload)
    status, doc = infer_raw(server, body, hdrs, model="strings")
    assert status == 400 and "'s'" in doc["error"] and "BYTES" in doc["error"]


def test_bf16_in_json_refused(server):
    status, doc = infer_raw(server, {"inputs": [{"name": "x", "shape": [1], "datatype": "BF16", "data": [1]}]})
    assert status == 400 and "BF16" in doc["error"] and "binary" in doc["error"]


def test_int_out_of_range(server):
    body = {"inputs": [{"name": "i", "shape": [2, 3], "datatype": "INT64", "data": [1, 2, 3, 4, 5, 6.5]},
                       {"name": "flag", "shape": [2, 3], "datatype": "BOOL", "data": [True] * 6}]}
    status, doc = infer_raw(server, body, model="typed")
    assert status == 400 and "'i'" in doc["error"] and "data[5]" in doc["error"]
    body["inputs"][0]["data"] = [1] * 6
    body["inputs"][1]["data"] = [1] * 6
    status, doc = infer_raw(server, body, model="typed")
    assert status == 400 and "'flag'" in doc["error"] and "true or false" in doc["error"]


def test_unknown_model_and_version(server):
    status, doc = infer_raw(server, {"inputs": [x_input()]}, model="no_such_model")
    assert status == 404 and "no_such_model" in doc["error"]
    status, doc = infer_raw(server, {"inputs": [x_input()]}, model="tiny", version="9")
    assert status == 404 and "version 9" in doc["error"]
    status, doc = infer_raw(server, {"inputs": [x_input()]}, model="tiny", version="abc")
    assert status == 400 and "version 'abc'" in doc["error"]


def test_client_sees_error_message(client):
    x = np.ones((1, 5), np.float32)
    inp = httpclient.InferInput("x", [1, 5], "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match="shape") as e:
        client.infer("tiny", [inp])
    assert "'x'" in str(e.value)
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_metadata("no_such_model")


def test_body_too_large_is_413(make_server, repo):
    s = make_server(repo, "--max-request-size", "4096")
    body = json.dumps({"inputs": [x_input(shape=[1000, 4], data=[0.0] * 4000)]})
    status, _, _ = raw_request(s.url, "POST", "/v2/models/tiny/infer", body)
    assert status == 413
    # A small gzip body that inflates past the limit is refused too.
    import gzip
    bomb = gzip.compress(b" " * 200000 + body.encode())
    assert len(bomb) < 4096
    status, _, raw = raw_request(s.url, "POST", "/v2/models/tiny/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and b"max-request-size" in raw
    status, _, raw = raw_request(s.url, "POST", "/v2/models/tiny/infer", b"\x1f\x8bgarbage", {"Content-Encoding": "gzip"})
    assert status == 400 and b"gzip" in raw
    status, _, raw = raw_request(s.url, "POST", "/v2/models/tiny/infer", json.dumps({"inputs": [x_input()]}),
                                 {"Content-Encoding": "br"})
    assert status == 415 and b"br" in raw
    # The server is fine afterwards.
    status, _, _ = raw_request(s.url, "GET", "/v2/health/live")
    assert status == 200


def test_errors_counted_in_metrics(server):
    infer_raw(server, '{"inputs": [')
    _, _, body = raw_request(server.url, "GET", "/metrics")
    line = next(l for l in body.decode().splitlines()
                if l.startswith('kiln_inference_request_failure{model="tiny",version="1",reason="invalid"}'))
    assert float(line.split()[-1]) >= 1


def status_line(server, request):
    """The first line of the answer to one raw request (sent whole, Connection: close)."""
    import socket
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request)
        out = b""
        while b"\r\n" not in out:
            b = s.recv(4096)
            if not b:
                break
            out += b
    return out.split(b"\r\n", 1)[0].decode()


# One per status kind, from the route layer (http.c) and the connection's own
# guard (http_conn.c): code and reason phrase both come from the status table.
STATUS_LINES = [
    ("unknown path", b"GET /v2/nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "404 Not Found"),
    ("method", b"DELETE /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "405 Method Not Allowed"),
    ("bad JSON", b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\n{",
     "400 Bad Request"),
    ("encoding", b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: br\r\nContent-Length: 2\r\n"
     b"Connection: close\r\n\r\n{}", "415 Unsupported Media Type"),
    ("load not enabled", b"POST /v2/repository/models/tiny/load HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
     b"Connection: close\r\n\r\n", "400 Bad Request"),
    ("HTTP version", b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", "505 HTTP Version Not Supported"),
    ("Expect", b"GET / HTTP/1.1\r\nHost: x\r\nExpect: tea\r\n\r\n", "417 Expectation Failed"),
    ("method not known", b"BREW / HTTP/1.1\r\nHost: x\r\n\r\n", "501 Not Implemented"),
    ("header too large", b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n",
     "431 Request Header Fields Too Large"),
]


@pytest.mark.parametrize("what,request_bytes,line", STATUS_LINES, ids=[c[0] for c in STATUS_LINES])
def test_status_line_from_table(server, what, request_bytes, line):
    assert status_line(server, request_bytes) == "HTTP/1.1 " + line
