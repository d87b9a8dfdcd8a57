"""Inference through tritonclient.http (binary and JSON, both directions),
checked against onnxruntime on the same ONNX files."""
import gzip
import json
import zlib

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from conftest import raw_request


def ort_run(repo, name, feeds, version=1):
    sess = ort.InferenceSession(str(repo / name / str(version) / "model.onnx"))
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def fp32_input(name, x, binary=True):
    i = httpclient.InferInput(name, list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=binary)
    return i


@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False])
def test_tiny_matches_onnxruntime(client, repo, binary_in, binary_out):
    x = np.random.default_rng(7).standard_normal((5, 4)).astype(np.float32)
    outs = [httpclient.InferRequestedOutput("probs", binary_data=binary_out),
            httpclient.InferRequestedOutput("logits", binary_data=binary_out)]
    r = client.infer("tiny", [fp32_input("x", x, binary_in)], outputs=outs)
    ref = ort_run(repo, "tiny", {"x": x})
    np.testing.assert_allclose(r.as_numpy("probs"), ref["probs"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r.as_numpy("logits"), ref["logits"], rtol=1e-5, atol=1e-5)
    resp = r.get_response()
    assert resp["model_name"] == "tiny" and resp["model_version"] == "1"
    for o in resp["outputs"]:
        assert ("parameters" in o) == binary_out
        assert ("data" in o) == (not binary_out)


def test_default_outputs_are_all_binary(client, repo):
    x = np.ones((1, 4), np.float32)
    r = client.infer("tiny", [fp32_input("x", x)])
    names = [o["name"] for o in r.get_response()["outputs"]]
    assert names == ["probs", "logits"]
    assert all(o["parameters"]["binary_data_size"] == 12 for o in r.get_response()["outputs"])


def test_output_selection(client):
    x = np.ones((2, 4), np.float32)
    r = client.infer("tiny", [fp32_input("x", x)], outputs=[httpclient.InferRequestedOutput("logits")])
    assert [o["name"] for o in r.get_response()["outputs"]] == ["logits"]
    assert r.as_numpy("probs") is None


def test_request_id_echo(client):
    x = np.ones((1, 4), np.float32)
    r = client.infer("tiny", [fp32_input("x", x)], request_id="req-42")
    assert r.get_response()["id"] == "req-42"
    r = client.infer("tiny", [fp32_input("x", x)])
    assert "id" not in r.get_response()


def test_json_nested_and_flat_data(server, repo):
    x = [[0.5, -1.0, 2.0, 3.5], [1.0, 1.0, 1.0, 1.0]]
    ref = ort_run(repo, "tiny", {"x": np.array(x, np.float32)})
    for data in (x, [v for row in x for v in row]):
        body = json.dumps({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": data}],
                           "outputs": [{"name": "logits"}]})
        status, headers, raw = raw_request(server.url, "POST", "/v2/models/tiny/infer", body,
                                           {"Content-Type": "application/json"})
        assert status == 200, raw
        assert headers["Content-Type"] == "application/json"
        out = json.loads(raw)["outputs"][0]
        assert out["shape"] == [2, 3] and out["datatype"] == "FP32"
        np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(2, 3), ref["logits"], rtol=1e-5)


def test_binary_data_output_parameter(server):
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
                       "parameters": {"binary_data_output": True}}).encode()
    status, headers, raw = raw_request(server.url, "POST", "/v2/models/tiny/infer", body)
    assert status == 200
    assert headers["Content-Type"] == "application/octet-stream"
    hl = int(headers["Inference-Header-Content-Length"])
    header = json.loads(raw[:hl])
    sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"]]
    assert sizes == [12, 12] and len(raw) == hl + 24
    probs = np.frombuffer(raw[hl:hl + 12], np.float32)
    assert abs(probs.sum() - 1) < 1e-5


def test_typed_int64_and_bool(client, repo):
    i = np.arange(6, dtype=np.int64).reshape(2, 3) * 1000000007
    f = np.array([[True, False, True], [False, False, True]])
    ref = ort_run(repo, "typed", {"i": i, "flag": f})
    for binary in (True, False):
        ii = httpclient.InferInput("i", [2, 3], "INT64")
        ii.set_data_from_numpy(i, binary_data=binary)
        ff = httpclient.InferInput("flag", [2, 3], "BOOL")
        ff.set_data_from_numpy(f, binary_data=binary)
        outs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("a", "b")]
        r = client.infer("typed", [ii, ff], outputs=outs)
        np.testing.assert_array_equal(r.as_numpy("a"), ref["a"])
        np.testing.assert_array_equal(r.as_numpy("b"), ref["b"])


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_roundtrip(client, binary):
    s = np.array([[b"hello", b""], [b"quote\"and\\slash", "üñí".encode()]], dtype=np.object_)
    inp = httpclient.InferInput("s", [2, 2], "BYTES")
    inp.set_data_from_numpy(s, binary_data=binary)
    r = client.infer("strings", [inp], outputs=[httpclient.InferRequestedOutput("out", binary_data=binary)])
    out = r.as_numpy("out")
    assert out.shape == (2, 2)
    got = [v if isinstance(v, bytes) else str(v).encode() for v in out.flatten()]
    assert got == list(s.flatten())


def test_classification_top_k(client, repo):
    x = np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32)
    r = client.infer("tiny", [fp32_input("x", x)],
                     outputs=[httpclient.InferRequestedOutput("probs", class_count=2)])
    out = r.as_numpy("probs")
    assert out.shape == (4, 2)
    ref = ort_run(repo, "tiny", {"x": x})["probs"]
    for row in range(4):
        order = np.argsort(-ref[row])[:2]
        for k in range(2):
            value, index = out[row, k].decode().split(":")[:2]
            assert int(index) == order[k]
            assert abs(float(value) - ref[row, order[k]]) < 1e-5


def test_classification_labels(client):
    x = np.zeros((1, 4), np.float32)
    r = client.infer("labeled", [fp32_input("x", x)],
                     outputs=[httpclient.InferRequestedOutput("probs", class_count=3)])
    labels = [v.decode().split(":")[2] for v in r.as_numpy("probs")[0]]
    assert sorted(labels) == ["bird", "cat", "dog"]


def test_versions_are_distinct_models(client, repo):
    x = np.ones((1, 4), np.float32)
    r1 = client.infer("multi", [fp32_input("x", x)], model_version="1")
    r2 = client.infer("multi", [fp32_input("x", x)], model_version="2")
    latest = client.infer("multi", [fp32_input("x", x)])
    assert r1.get_response()["model_version"] == "1"
    assert latest.get_response()["model_version"] == "2"
    np.testing.assert_allclose(r1.as_numpy("logits"), ort_run(repo, "multi", {"x": x}, 1)["logits"], rtol=1e-5)
    np.testing.assert_allclose(r2.as_numpy("logits"), ort_run(repo, "multi", {"x": x}, 2)["logits"], rtol=1e-5)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request(client, repo, algorithm):
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    r = client.infer("tiny", [fp32_input("x", x)], request_compression_algorithm=algorithm)
    np.testing.assert_allclose(r.as_numpy("logits"), ort_run(repo, "tiny", {"x": x})["logits"], rtol=1e-5)


def test_raw_gzip_body(server):
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    for enc, data in (("gzip", gzip.compress(body.encode())), ("deflate", zlib.compress(body.encode()))):
        status, _, raw = raw_request(server.url, "POST", "/v2/models/tiny/infer", data, {"Content-Encoding": enc})
        assert status == 200, raw


def test_concurrent_requests_batch(server, repo):
    """Many clients at once: every answer is right (scatter of a dynamic batch)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(seed):
        c = httpclient.InferenceServerClient(server.url)
        x = np.random.default_rng(seed).standard_normal((1 + seed % 3, 4)).astype(np.float32)
        r = c.infer("tiny", [fp32_input("x", x)])
        c.close()
        return x, r.as_numpy("logits")

    with ThreadPoolExecutor(16) as ex:
        results = list(ex.map(one, range(64)))
    for x, logits in results:
        np.testing.assert_allclose(logits, ort_run(repo, "tiny", {"x": x})["logits"], rtol=1e-5, atol=1e-5)


def test_digits_json_and_binary(client, repo):
    if not (repo / "digits").exists():
        pytest.skip("model_repository/digits is not in the tree")
    md = client.get_model_metadata("digits")
    inp_name = md["inputs"][0]["name"]
    x = np.random.default_rng(11).uniform(0, 16, (8, 64)).astype(np.float32)
    ref = ort_run(repo, "digits", {inp_name: x})
    for binary in (True, False):
        outs = [httpclient.InferRequestedOutput(o["name"], binary_data=binary) for o in md["outputs"]]
        r = client.infer("digits", [fp32_input(inp_name, x, binary)], outputs=outs)
        for o in md["outputs"]:
            got = r.as_numpy(o["name"])
            if got.dtype.kind == "f":
                np.testing.assert_allclose(got, ref[o["name"]], rtol=1e-4, atol=1e-5)
            else:
                np.testing.assert_array_equal(got, ref[o["name"]])


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_response(client, repo, algorithm):
    x = np.random.default_rng(9).standard_normal((6, 4)).astype(np.float32)
    for binary in (True, False):
        outs = [httpclient.InferRequestedOutput("logits", binary_data=binary)]
        r = client.infer("tiny", [fp32_input("x", x)], outputs=outs, request_compression_algorithm=algorithm,
                         response_compression_algorithm=algorithm)
        np.testing.assert_allclose(r.as_numpy("logits"), ort_run(repo, "tiny", {"x": x})["logits"], rtol=1e-5)


def test_raw_gzip_response_header(server):
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    status, headers, raw = raw_request(server.url, "POST", "/v2/models/tiny/infer", body, {"Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("Content-Encoding") == "gzip"
    assert json.loads(gzip.decompress(raw))["model_name"] == "tiny"


def test_pipelined_requests_answered_in_order(server):
    """Three requests written at once on one keep-alive connection."""
    import socket
    host, port = server.url.split(":")
    reqs = b""
    for i in range(3):
        body = json.dumps({"id": f"p{i}", "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                                     "data": [i, 2, 3, 4]}]}).encode()
        reqs += b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(reqs)
        data = b""
        while data.count(b'"model_name"') < 3:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    text = data.decode()
    assert text.count("HTTP/1.1 200 OK") == 3
    assert text.index('"id":"p0"') < text.index('"id":"p1"') < text.index('"id":"p2"')
