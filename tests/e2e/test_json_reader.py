"""The JSON request reader end to end: INT64 and UINT64 data exact over
their whole range through tritonclient (JSON both ways), values past either
end refused naming the input and the element, malformed bodies told with
the byte where they go wrong, keys in any order, and Triton's raw binary
request (Inference-Header-Content-Length: 0)."""
import json

import numpy as np
import onnx.helper as oh
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto as TP
from tritonclient.utils import InferenceServerException

from conftest import raw_request, save_model, serving, tiny_graph


def _identity(name, elem):
    return oh.make_graph([oh.make_node("Identity", ["x"], ["y"])], name,
                         [oh.make_tensor_value_info("x", elem, ["N", 3])],
                         [oh.make_tensor_value_info("y", elem, ["N", 3])])


@pytest.fixture(scope="module")
def reader_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("json_reader")
    save_model(root, "id64", _identity("id64", TP.INT64))
    save_model(root, "idu64", _identity("idu64", TP.UINT64))
    save_model(root, "tiny", tiny_graph())
    return root


@pytest.fixture(scope="module")
def srv(reader_repo):
    yield from serving(reader_repo)


def _json_round_trip(url, model, dtype, data):
    c = httpclient.InferenceServerClient(url)
    try:
        x = httpclient.InferInput("x", list(data.shape), dtype)
        x.set_data_from_numpy(data, binary_data=False)
        r = c.infer(model, [x], outputs=[httpclient.InferRequestedOutput("y", binary_data=False)])
        return r.as_numpy("y"), r.get_response()
    finally:
        c.close()


def test_int64_extremes_round_trip_exactly(srv):
    i64 = np.iinfo(np.int64)
    data = np.array([[i64.max, i64.min, 2 ** 53 + 1], [-(2 ** 53) - 1, 0, -1]], np.int64)
    got, resp = _json_round_trip(srv.url, "id64", "INT64", data)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, data)
    assert resp["outputs"][0]["data"] == data.flatten().tolist()  # the JSON answer's numbers, exactly


def test_uint64_extremes_round_trip_exactly(srv):
    data = np.array([[np.iinfo(np.uint64).max, 2 ** 63, 2 ** 64 - 2]], np.uint64)
    got, resp = _json_round_trip(srv.url, "idu64", "UINT64", data)
    np.testing.assert_array_equal(got, data)
    assert resp["outputs"][0]["data"] == [2 ** 64 - 1, 2 ** 63, 2 ** 64 - 2]


@pytest.mark.parametrize("model,dtype,values,bad,index", [
    ("id64", "INT64", [1, 2, 2 ** 63], "9223372036854775808", 2),
    ("id64", "INT64", [-(2 ** 63) - 1, 2, 3], "-9223372036854775809", 0),
    ("idu64", "UINT64", [1, 2 ** 64, 3], "18446744073709551616", 1),
    ("idu64", "UINT64", [1, 2, -1], "-1", 2),
])
def test_values_past_the_range_are_refused(srv, model, dtype, values, bad, index):
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 3], "datatype": dtype, "data": values}]})
    st, _, b = raw_request(srv.url, "POST", f"/v2/models/{model}/infer", body)
    assert st == 400, b
    assert json.loads(b)["error"] == f"input 'x': data[{index}] = {bad} is out of range for {dtype}"
    # The server goes on serving.
    got, _ = _json_round_trip(srv.url, model, dtype, np.array([[1, 2, 3]], np.int64 if dtype == "INT64" else np.uint64))
    assert got.tolist() == [[1, 2, 3]]


def test_malformed_json_names_the_byte(srv):
    body = b'{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "INT64", "data": [1, 2 3]}]}'
    st, _, b = raw_request(srv.url, "POST", "/v2/models/id64/infer", body)
    assert st == 400, b
    at = body.index(b"2 3]") + 2
    assert json.loads(b)["error"].startswith(f"malformed JSON in the request body at byte {at}"), b


def test_keys_in_any_order_and_escaped(srv):
    # 'data' before the shape that sizes it, an escaped key, an unknown key skipped.
    body = ('{"inputs": [{"data": [[7, 8, 9]], "extra": {"deep": [[1], {"a": null}]}, "\\u006eame": "x", '
            '"datatype": "INT64", "shape": [1, 3]}], "outputs": [{"name": "y"}]}')
    st, _, b = raw_request(srv.url, "POST", "/v2/models/id64/infer", body)
    assert st == 200, b
    assert json.loads(b)["outputs"][0]["data"] == [7, 8, 9]


def _split_binary(headers, body):
    """The JSON header and the binary outputs of an answer, by name."""
    hl = int({k.lower(): v for k, v in headers.items()}["inference-header-content-length"])
    head = json.loads(body[:hl])
    out, at = {}, hl
    for o in head["outputs"]:
        n = o["parameters"]["binary_data_size"]
        out[o["name"]] = (o, body[at:at + n])
        at += n
    assert at == len(body)
    return head, out


def test_raw_binary_request(srv):
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 7
    # Batch 1: the body is one row of x's bytes, and every output comes back binary.
    st, h, body = raw_request(srv.url, "POST", "/v2/models/tiny/infer", x[:1].tobytes(),
                              {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"})
    assert st == 200, body
    _, out = _split_binary(h, body)
    assert set(out) == {"probs", "logits"}
    meta, raw = out["probs"]
    assert meta["datatype"] == "FP32" and meta["shape"] == [1, 3]
    c = httpclient.InferenceServerClient(srv.url)
    try:
        i = httpclient.InferInput("x", [1, 4], "FP32")
        i.set_data_from_numpy(x[:1], binary_data=False)
        want = c.infer("tiny", [i]).as_numpy("probs")
    finally:
        c.close()
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(1, 3), want)
    # The open dim of id64 ([N, 3] with N the batch, so here [1, 3]) takes 24 bytes exactly.
    v = np.array([np.iinfo(np.int64).min, 5, np.iinfo(np.int64).max], np.int64)
    st, h, body = raw_request(srv.url, "POST", "/v2/models/id64/infer", v.tobytes(),
                              {"Inference-Header-Content-Length": "0"})
    assert st == 200, body
    meta, raw = _split_binary(h, body)[1]["y"]
    assert meta["shape"] == [1, 3]
    np.testing.assert_array_equal(np.frombuffer(raw, np.int64), v)
    # Bytes the input cannot hold are refused, naming it.
    st, _, b = raw_request(srv.url, "POST", "/v2/models/tiny/infer", b"\0" * 12, {"Inference-Header-Content-Length": "0"})
    assert st == 400 and "the raw binary request has 12 bytes" in json.loads(b)["error"], b
