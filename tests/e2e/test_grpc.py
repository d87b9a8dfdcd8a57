"""The gRPC front end through the real tritonclient.grpc (and its generated
stub for what the client cannot send: typed contents, malformed messages;
and raw HTTP/2 frames for hostile clients): health, metadata, configuration,
statistics, the repository index, load and unload, inference with raw and
typed contents, streaming, errors with HTTP's messages, deadlines,
cancellation, limits and floods, many requests at once, and HTTP still
answering beside it."""
import json
import queue
import signal
import subprocess
import threading
import time

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import h2frames
from conftest import KILN, no_batch_config, raw_request, reload_under_traffic, save_model, slow_graph, tiny_graph


@pytest.fixture(scope="module")
def gclient(server):
    c = grpcclient.InferenceServerClient(server.grpc_url())
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.grpc_url())
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def ort_run(repo, name, feeds):
    sess = ort.InferenceSession(str(repo / name / "1" / "model.onnx"))
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def fp32_input(name, x):
    i = grpcclient.InferInput(name, list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


def grpc_error(fn, *args, **kw):
    with pytest.raises(InferenceServerException) as e:
        fn(*args, **kw)
    return e.value


def http_error(fn, *args, **kw):
    with pytest.raises(InferenceServerException) as e:
        fn(*args, **kw)
    return e.value.message()


# ---- health, metadata, configuration -------------------------------------

def test_health(gclient):
    assert gclient.is_server_live() and gclient.is_server_ready()
    assert gclient.is_model_ready("tiny")
    assert gclient.is_model_ready("multi", "1") and gclient.is_model_ready("multi", "2")
    assert not gclient.is_model_ready("no_such_model")
    assert not gclient.is_model_ready("tiny", "7")


def test_server_metadata(gclient, client):
    md = gclient.get_server_metadata(as_json=True)
    assert md["name"] == "kiln"
    assert md["version"] == client.get_server_metadata()["version"]
    assert "statistics" in md["extensions"] and "model_repository" in md["extensions"]


def test_model_metadata_matches_http(gclient, client):
    g = gclient.get_model_metadata("tiny", as_json=True)
    h = client.get_model_metadata("tiny")
    assert g["name"] == "tiny" and g["versions"] == h["versions"] and g["platform"] == h["platform"]
    for kind in ("inputs", "outputs"):
        # protobuf's JSON writes int64 as strings
        got = [{"name": t["name"], "datatype": t["datatype"], "shape": [int(d) for d in t["shape"]]} for t in g[kind]]
        assert got == h[kind]


def test_model_config_matches_http(gclient, client):
    g = gclient.get_model_config("tiny", as_json=True)["config"]
    h = client.get_model_config("tiny")
    assert g["name"] == "tiny" and g["max_batch_size"] == h["max_batch_size"] == 32
    assert [(i["name"], i["data_type"], [int(d) for d in i["dims"]]) for i in g["input"]] == \
           [(i["name"], i["data_type"], i["dims"]) for i in h["input"]]
    assert [o["name"] for o in g["output"]] == ["probs", "logits"]
    assert g["instance_group"][0]["count"] == 1
    labeled = gclient.get_model_config("labeled", as_json=True)["config"]
    assert labeled["output"][0]["label_filename"] == "labels.txt"


def test_unknown_model_errors_match_http(gclient, client):
    e = grpc_error(gclient.get_model_metadata, "no_such_model")
    assert e.status() == "StatusCode.NOT_FOUND"
    assert e.message() == http_error(client.get_model_metadata, "no_such_model")
    e = grpc_error(gclient.get_model_config, "tiny", "x")
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "positive integer" in e.message()


def test_repository_index(gclient, client):
    g = gclient.get_model_repository_index(as_json=True)["models"]
    h = client.get_model_repository_index()
    assert sorted((m["name"], m.get("version"), m.get("state")) for m in g) == \
           sorted((m["name"], m.get("version"), m.get("state")) for m in h)


# ---- inference -----------------------------------------------------------

def test_infer_matches_onnxruntime(gclient, repo):
    x = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    r = gclient.infer("tiny", [fp32_input("x", x)], request_id="g-1")
    ref = ort_run(repo, "tiny", {"x": x})
    np.testing.assert_allclose(r.as_numpy("probs"), ref["probs"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r.as_numpy("logits"), ref["logits"], rtol=1e-5, atol=1e-5)
    resp = r.get_response()
    assert resp.model_name == "tiny" and resp.model_version == "1" and resp.id == "g-1"
    assert [o.name for o in resp.outputs] == ["probs", "logits"]


def test_infer_output_selection_and_version(gclient):
    x = np.ones((2, 4), np.float32)
    r = gclient.infer("tiny", [fp32_input("x", x)], outputs=[grpcclient.InferRequestedOutput("logits")])
    assert [o.name for o in r.get_response().outputs] == ["logits"] and r.as_numpy("probs") is None
    a = gclient.infer("multi", [fp32_input("x", x)], model_version="1")
    b = gclient.infer("multi", [fp32_input("x", x)], model_version="2")
    assert a.get_response().model_version == "1" and b.get_response().model_version == "2"
    assert not np.allclose(a.as_numpy("logits"), b.as_numpy("logits"))


def test_infer_typed_int64_bool_raw(gclient):
    i = np.arange(6, dtype=np.int64).reshape(2, 3)
    f = np.array([[True, False, True], [False, False, True]])
    ii = grpcclient.InferInput("i", [2, 3], "INT64")
    ii.set_data_from_numpy(i)
    fi = grpcclient.InferInput("flag", [2, 3], "BOOL")
    fi.set_data_from_numpy(f)
    r = gclient.infer("typed", [ii, fi])
    np.testing.assert_array_equal(r.as_numpy("a"), i + 1)
    np.testing.assert_array_equal(r.as_numpy("b"), ~f)


def test_infer_strings_raw(gclient):
    s = np.array([[b"hello", b""], [b"w\xc3\xb6rld", b"x" * 1000]], dtype=np.object_)
    si = grpcclient.InferInput("s", [2, 2], "BYTES")
    si.set_data_from_numpy(s)
    r = gclient.infer("strings", [si])
    assert r.as_numpy("out").tolist() == s.tolist()


def test_classification(gclient, client):
    x = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
    g = gclient.infer("labeled", [fp32_input("x", x)], outputs=[grpcclient.InferRequestedOutput("probs", class_count=2)])
    hi = httpclient.InferInput("x", [2, 4], "FP32")
    hi.set_data_from_numpy(x)
    h = client.infer("labeled", [hi], outputs=[httpclient.InferRequestedOutput("probs", class_count=2)])
    assert g.as_numpy("probs").tolist() == h.as_numpy("probs").tolist()
    assert g.as_numpy("probs").shape == (2, 2)


def typed_request(model, inputs, outputs=()):
    """A ModelInferRequest with typed contents: inputs are (name, datatype, shape, field, values)."""
    req = service_pb2.ModelInferRequest(model_name=model)
    for name, dt, shape, field, values in inputs:
        t = req.inputs.add(name=name, datatype=dt, shape=shape)
        getattr(t.contents, field).extend(values)
    for name in outputs:
        req.outputs.add(name=name)
    return req


def raw_output(resp, name, dtype):
    k = [o.name for o in resp.outputs].index(name)
    return np.frombuffer(resp.raw_output_contents[k], dtype=dtype).reshape(list(resp.outputs[k].shape))


def test_typed_contents(stub, repo):
    x = np.random.default_rng(9).standard_normal((3, 4)).astype(np.float32)
    resp = stub.ModelInfer(typed_request("tiny", [("x", "FP32", [3, 4], "fp32_contents", x.flatten())]))
    np.testing.assert_allclose(raw_output(resp, "probs", np.float32), ort_run(repo, "tiny", {"x": x})["probs"],
                               rtol=1e-5, atol=1e-6)
    resp = stub.ModelInfer(typed_request("typed", [("i", "INT64", [2, 3], "int64_contents", range(6)),
                                                   ("flag", "BOOL", [2, 3], "bool_contents", [True, False] * 3)]))
    np.testing.assert_array_equal(raw_output(resp, "a", np.int64), np.arange(1, 7).reshape(2, 3))
    np.testing.assert_array_equal(raw_output(resp, "b", np.bool_), [[False, True, False], [True, False, True]])
    resp = stub.ModelInfer(typed_request("strings", [("s", "BYTES", [1, 2], "bytes_contents", [b"ab", b"cd"])]))
    raw = resp.raw_output_contents[0]
    assert raw == b"\x02\x00\x00\x00ab\x02\x00\x00\x00cd"


# ---- errors --------------------------------------------------------------

def stub_error(call, req):
    with pytest.raises(grpc.RpcError) as e:
        call(req)
    return e.value.code(), e.value.details()


@pytest.mark.parametrize("case", ["dtype", "shape", "input_name", "output_name"])
def test_bad_inputs_match_http(gclient, client, case):
    x = np.ones((2, 4), np.float32)
    name, dt, data, outs = "x", "FP32", x, None
    if case == "dtype":
        dt, data = "INT64", x.astype(np.int64)
    elif case == "shape":
        data = np.ones((2, 5), np.float32)
    elif case == "input_name":
        name = "nope"
    else:
        outs = ["nope"]
    gi = grpcclient.InferInput(name, list(data.shape), dt)
    gi.set_data_from_numpy(data)
    hi = httpclient.InferInput(name, list(data.shape), dt)
    hi.set_data_from_numpy(data)
    e = grpc_error(gclient.infer, "tiny", [gi], outputs=[grpcclient.InferRequestedOutput(n) for n in outs or []] or None)
    hmsg = http_error(client.infer, "tiny", [hi], outputs=[httpclient.InferRequestedOutput(n) for n in outs or []] or None)
    assert e.message() == hmsg
    assert e.status() in ("StatusCode.INVALID_ARGUMENT", "StatusCode.NOT_FOUND")
    if case != "output_name":
        assert e.status() == "StatusCode.INVALID_ARGUMENT"


def test_unknown_model_infer(gclient):
    e = grpc_error(gclient.infer, "no_such_model", [fp32_input("x", np.ones((1, 4), np.float32))])
    assert e.status() == "StatusCode.NOT_FOUND" and "no_such_model" in e.message()


def test_bad_messages(stub):
    code, msg = stub_error(stub.ModelInfer, typed_request("tiny", [("x", "FP32", [2, 4], "fp32_contents", [1.0] * 7)]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "7 elements" in msg and "[2,4]" in msg
    code, msg = stub_error(stub.ModelInfer, typed_request("tiny", [("x", "FP32", [1, 4], "int64_contents", [1] * 4)]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "fp32_contents" in msg
    req = service_pb2.ModelInferRequest(model_name="tiny")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(b"\0" * 15)
    code, msg = stub_error(stub.ModelInfer, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert msg.startswith("input byte size mismatch for input 'x' for model 'tiny'. Expected 16, got 15")
    req = service_pb2.ModelInferRequest(model_name="tiny")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    code, msg = stub_error(stub.ModelInfer, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "neither" in msg
    code, msg = stub_error(stub.ModelInfer, service_pb2.ModelInferRequest(model_name="tiny", model_version="v1"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "positive integer" in msg


def test_malformed_protobuf(server):
    channel = grpc.insecure_channel(server.grpc_url())
    for method in ("ModelInfer", "ModelMetadata", "ServerLive"):
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
        with pytest.raises(grpc.RpcError) as e:
            call(b"\x0a\xff\xff\xff\x0f garbage")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
    call = channel.unary_unary("/inference.GRPCInferenceService/TraceSetting")
    with pytest.raises(grpc.RpcError) as e:
        call(b"")
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert channel.unary_unary("/inference.GRPCInferenceService/ServerLive")(b"") == b"\x08\x01"
    channel.close()


def test_message_limit(make_server, repo):
    big = np.ones((5000, 4), np.float32)  # 80 000 bytes of tensor
    # --grpc-max-message-size, or else --max-request-size, bounds a message.
    for args in (("--max-request-size", "64K"), ("--grpc-max-message-size", "64K")):
        s = make_server(repo, *args)
        c = grpcclient.InferenceServerClient(s.grpc_url())
        e = grpc_error(c.infer, "tiny", [fp32_input("x", big)])
        assert e.status() == "StatusCode.RESOURCE_EXHAUSTED", args
        assert "--grpc-max-message-size (65536 bytes)" in e.message()
        r = c.infer("tiny", [fp32_input("x", np.ones((2, 4), np.float32))])
        assert r.as_numpy("probs").shape == (2, 3)
        c.close()
    # HTTP keeps its own limit (64M): the body is read, and only the batch size is wrong.
    h = httpclient.InferenceServerClient(s.url)
    hi = httpclient.InferInput("x", list(big.shape), "FP32")
    hi.set_data_from_numpy(big)
    assert "max_batch_size 32" in http_error(h.infer, "tiny", [hi])
    h.close()


def test_large_answers_concurrently(make_server, tmp_path):
    # Answers of 12 MB, far over what the server queues for a connection
    # at once (1 MiB): sending resumes as the socket drains, for each of
    # several calls in flight on one channel, and every byte arrives.
    from onnx import TensorProto as TP, helper as oh
    g = oh.make_graph([oh.make_node("Mul", ["x", "two"], ["y"])], "double",
                      [oh.make_tensor_value_info("x", TP.FLOAT, ["N"])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, ["N"])],
                      [oh.make_tensor("two", TP.FLOAT, [], [2.0])])
    save_model(tmp_path / "repo", "double", g, config=json.dumps(no_batch_config(g)))
    s = make_server(tmp_path / "repo", "--grpc-max-message-size", "64M")
    c = grpcclient.InferenceServerClient(s.grpc_url())
    xs = [np.random.default_rng(k).standard_normal(3 << 20).astype(np.float32) for k in range(4)]
    got = queue.Queue()
    for k, x in enumerate(xs):
        c.async_infer("double", [fp32_input("x", x)], callback=lambda result, error, k=k: got.put((k, result, error)))
    for _ in xs:
        k, r, e = got.get(timeout=120)
        assert e is None, e
        np.testing.assert_array_equal(r.as_numpy("y"), xs[k] * 2)
    c.close()


# ---- streaming -----------------------------------------------------------

def test_stream_many_in_flight(server, repo):
    c = grpcclient.InferenceServerClient(server.grpc_url())
    got = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    xs = {str(k): np.random.default_rng(k).standard_normal((1, 4)).astype(np.float32) for k in range(40)}
    for k, x in xs.items():
        c.async_stream_infer("tiny", [fp32_input("x", x)], request_id=k)
    c.async_stream_infer("no_such_model", [fp32_input("x", xs["0"])], request_id="bad")
    answers = [got.get(timeout=30) for _ in range(len(xs) + 1)]
    c.stop_stream()
    c.close()
    errors = [e for r, e in answers if e is not None]
    assert len(errors) == 1 and "no_such_model" in errors[0].message()
    ok = {r.get_response().id: r for r, e in answers if e is None}
    assert sorted(ok) == sorted(xs)
    for k, r in ok.items():
        np.testing.assert_allclose(r.as_numpy("probs"), ort_run(repo, "tiny", {"x": xs[k]})["probs"],
                                   rtol=1e-5, atol=1e-6)


# ---- concurrency, HTTP beside, statistics --------------------------------

def test_concurrent_requests_and_http_beside(server, client, repo):
    url = server.grpc_url()
    errors = []

    def grpc_worker(seed):
        c = grpcclient.InferenceServerClient(url)
        try:
            for k in range(10):
                x = np.random.default_rng(seed * 100 + k).standard_normal((1 + k % 3, 4)).astype(np.float32)
                r = c.infer("tiny", [fp32_input("x", x)])
                np.testing.assert_allclose(r.as_numpy("probs"), ort_run(repo, "tiny", {"x": x})["probs"],
                                           rtol=1e-5, atol=1e-6)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            c.close()

    def http_worker():
        h = httpclient.InferenceServerClient(server.url)  # one per thread: it is not thread-safe
        try:
            for _ in range(10):
                hi = httpclient.InferInput("x", [1, 4], "FP32")
                hi.set_data_from_numpy(np.ones((1, 4), np.float32))
                assert h.infer("tiny", [hi]).as_numpy("probs").shape == (1, 3)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
        finally:
            h.close()

    before = client.get_inference_statistics("tiny")["model_stats"][0]["inference_stats"]["success"]["count"]
    threads = [threading.Thread(target=grpc_worker, args=(i,)) for i in range(16)]
    threads.append(threading.Thread(target=http_worker))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    g = grpcclient.InferenceServerClient(url)
    stats = g.get_inference_statistics("tiny", as_json=True)["model_stats"][0]
    g.close()
    # Both transports count in the same statistics.
    assert int(stats["inference_stats"]["success"]["count"]) >= before + 16 * 10 + 10
    assert client.is_server_ready()


def test_statistics(gclient, client):
    gclient.infer("tiny", [fp32_input("x", np.ones((1, 4), np.float32))])
    g = gclient.get_inference_statistics("tiny", as_json=True)["model_stats"]
    assert [m["name"] for m in g] == ["tiny"]
    assert int(g[0]["inference_count"]) >= 1 and int(g[0]["execution_count"]) >= 1
    assert "batch_stats" in g[0]
    every = gclient.get_inference_statistics(as_json=True)["model_stats"]
    assert {"tiny", "typed", "strings"} <= {m["name"] for m in every}
    e = grpc_error(gclient.get_inference_statistics, "no_such_model")
    assert e.message() == http_error(client.get_inference_statistics, "no_such_model")


# ---- configuration and shutdown ------------------------------------------

def test_disabled_and_port_taken(make_server, tmp_path, server):
    root = tmp_path / "repo"
    save_model(root, "tiny", tiny_graph())
    s = make_server(root, "--allow-grpc=false")
    assert "grpc://" not in s.text()
    host, port = server.grpc_url().split(":")
    p = subprocess.run([str(KILN), "serve", "--model-repository", str(root), "--http-address", "127.0.0.1",
                        "--http-port", "0", "--grpc-port", port], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "cannot listen on 127.0.0.1 port" in p.stdout + p.stderr and "--grpc-port" in p.stdout + p.stderr


def test_drain_with_grpc_traffic(make_server, repo):
    """SIGTERM under gRPC load: accepted requests are answered, later ones get
    UNAVAILABLE, and kiln exits 0."""
    s = make_server(repo)
    url = s.grpc_url()
    answered, errors, stop = [], [], threading.Event()

    def go():
        c = grpcclient.InferenceServerClient(url)
        while not stop.is_set():
            try:
                answered.append(c.infer("slow", [fp32_input("x", np.ones((1, 512), np.float32))], client_timeout=30))
            except InferenceServerException as e:
                errors.append(e)
                break
        c.close()

    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    s.signal(signal.SIGTERM)
    assert s.proc.wait(timeout=60) == 0
    stop.set()
    for t in threads:
        t.join()
    assert answered
    assert all(e.status() == "StatusCode.UNAVAILABLE" for e in errors), [(e.status(), e.message()) for e in errors]


# ---- hostile clients, cancellation, the asyncio client -------------------

def test_not_http2_and_truncated(server, gclient):
    import socket
    host, port = server.grpc_url().split(":")
    for payload in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04"):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            while s.recv(4096):  # the server answers (a GOAWAY) and closes
                pass
    assert gclient.is_server_live()
    x = np.ones((1, 4), np.float32)
    assert gclient.infer("tiny", [fp32_input("x", x)]).as_numpy("probs").shape == (1, 3)


def test_client_cancels(server, stub):
    """Calls the client cancels (RST_STREAM) while they queue or run: the
    server drops or finishes them and keeps answering."""
    x = np.ones((1, 512), np.float32)
    req = service_pb2.ModelInferRequest(model_name="slow")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 512])
    req.raw_input_contents.append(x.tobytes())
    futures = [stub.ModelInfer.future(req) for _ in range(30)]
    for f in futures[::2]:
        f.cancel()
    for f in futures[1::2]:
        assert len(f.result(timeout=60).raw_output_contents[0]) == 512 * 4
    assert len(stub.ModelInfer(req).raw_output_contents[0]) == 512 * 4


def test_asyncio_client(server, repo):
    import asyncio
    import tritonclient.grpc.aio as aioclient

    async def go():
        c = aioclient.InferenceServerClient(server.grpc_url())
        assert await c.is_server_ready()
        xs = [np.random.default_rng(k).standard_normal((2, 4)).astype(np.float32) for k in range(20)]
        results = await asyncio.gather(*[c.infer("tiny", [fp32_input("x", x)]) for x in xs])
        await c.close()
        return xs, results

    xs, results = asyncio.run(go())
    for x, r in zip(xs, results):
        np.testing.assert_allclose(r.as_numpy("probs"), ort_run(repo, "tiny", {"x": x})["probs"], rtol=1e-5, atol=1e-6)


def test_settings_from_file_and_environment(make_server, tmp_path):
    root = tmp_path / "repo"
    save_model(root, "tiny", tiny_graph())
    cfg = tmp_path / "kiln.json"
    cfg.write_text('{"allow_grpc": false}')
    assert "grpc://" not in make_server(root, "--config", str(cfg)).text()
    cfg.write_text('{"grpc_port": 0, "grpc_address": "127.0.0.1"}')
    s = make_server(root, "--config", str(cfg), env={"KILN_GRPC_PORT": "0"})
    assert s.grpc_url().startswith("127.0.0.1:")
    p = subprocess.run([str(KILN), "serve", "--grpc-port", "70000"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "grpc-port" in p.stderr and "0-65535" in p.stderr
    help_text = subprocess.run([str(KILN), "serve", "--help"], capture_output=True, text=True, timeout=30).stdout
    assert "--grpc-port" in help_text and "--grpc-address" in help_text and "--allow-grpc" in help_text
    assert "--grpc-max-message-size" in help_text


# ---- grpc.health.v1.Health -----------------------------------------------

def test_health_service(server):
    channel = grpc.insecure_channel(server.grpc_url())
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    serving = b"\x08\x01"  # HealthCheckResponse{status: SERVING}
    assert check(b"") == serving
    name = b"inference.GRPCInferenceService"
    assert check(b"\x0a" + bytes([len(name)]) + name) == serving
    with pytest.raises(grpc.RpcError) as e:
        check(b"\x0a\x05other")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "other" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        check(b"\x0a\x7f")  # a string longer than the message
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        channel.unary_unary("/grpc.health.v1.Health/Nope")(b"")
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    channel.close()


def test_health_watch_sees_the_drain(make_server, tmp_path):
    """Watch: SERVING at once, NOT_SERVING when the drain begins (requests are
    still running then), and the stream ends when the server exits."""
    root = tmp_path / "repo"
    save_model(root, "slower", slow_graph(depth=300, width=512))
    s = make_server(root)
    url = s.grpc_url()
    channel = grpc.insecure_channel(url)
    watch = channel.unary_stream("/grpc.health.v1.Health/Watch")(b"")
    assert next(watch) == b"\x08\x01"
    other = channel.unary_stream("/grpc.health.v1.Health/Watch")(b"\x0a\x05other")
    with pytest.raises(grpc.RpcError) as e:
        next(other)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    req = service_pb2.ModelInferRequest(model_name="slower")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 512])
    req.raw_input_contents.append(np.ones((1, 512), np.float32).tobytes())
    busy = [stub.ModelInfer.future(req) for _ in range(20)]  # the drain waits for them
    deadline = time.monotonic() + 10
    while pending(s, "slower") < 10 and time.monotonic() < deadline:
        time.sleep(0.001)
    s.signal(signal.SIGTERM)
    assert next(watch) == b"\x08\x02"  # NOT_SERVING
    with pytest.raises((StopIteration, grpc.RpcError)):
        next(watch)
    assert s.proc.wait(timeout=60) == 0
    # Calls accepted before the drain are answered; later ones are refused.
    done = 0
    for f in busy:
        try:
            done += len(f.result(timeout=60).raw_output_contents) == 1
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in e.details()
    assert done >= 10
    channel.close()


# ---- load and unload -----------------------------------------------------

def test_load_unload(make_server, small_repo):
    s = make_server(small_repo, "--model-control-mode", "explicit", "--load-model", "tiny")
    c = grpcclient.InferenceServerClient(s.grpc_url())
    h = httpclient.InferenceServerClient(s.url)
    assert c.is_model_ready("tiny") and not c.is_model_ready("typed")
    c.load_model("typed")
    assert c.is_model_ready("typed") and h.is_model_ready("typed")
    index = {m["name"]: m for m in c.get_model_repository_index(as_json=True)["models"]}
    assert index["typed"]["state"] == "READY"
    c.unload_model("tiny")
    assert not c.is_model_ready("tiny")
    e = grpc_error(c.infer, "tiny", [fp32_input("x", np.ones((1, 4), np.float32))])
    assert e.status() == "StatusCode.UNAVAILABLE" and "not ready" in e.message()
    # A configuration in the request replaces config.json, as over HTTP.
    c.load_model("tiny", config='{"max_batch_size": 4}')
    assert c.get_model_config("tiny", as_json=True)["config"]["max_batch_size"] == 4
    assert c.infer("tiny", [fp32_input("x", np.ones((2, 4), np.float32))]).as_numpy("probs").shape == (2, 3)
    # Errors carry HTTP's messages.
    e = grpc_error(c.load_model, "no_such_model")
    assert e.status() == "StatusCode.NOT_FOUND" or e.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.message() == http_error(h.load_model, "no_such_model")
    e = grpc_error(c.load_model, "tiny", config="{not json")
    assert e.message() == http_error(h.load_model, "tiny", config="{not json")
    e = grpc_error(c.load_model, "tiny", files={"file:1/model.onnx": b"x"})
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "file:" in e.message()
    e = grpc_error(c.unload_model, "")
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and "Model name cannot be empty" in e.message()
    assert c.is_model_ready("tiny")
    c.close()
    h.close()
    assert "unload of model 'tiny' requested" in s.text()


def test_load_refused(make_server, small_repo, server):
    c = grpcclient.InferenceServerClient(server.grpc_url())
    e = grpc_error(c.load_model, "tiny")
    assert e.status() == "StatusCode.UNAVAILABLE" and "--model-control-mode explicit" in e.message()
    e = grpc_error(c.unload_model, "tiny")
    assert e.status() == "StatusCode.UNAVAILABLE"
    c.close()
    s = make_server(small_repo, "--model-control-mode", "explicit", env={"KILN_CONTROL_TOKEN": "s3cret"})
    c = grpcclient.InferenceServerClient(s.grpc_url())
    e = grpc_error(c.load_model, "tiny")
    assert e.status() == "StatusCode.UNAUTHENTICATED" and "authorization" in e.message()
    e = grpc_error(c.load_model, "tiny", headers={"authorization": "Bearer wrong"})
    assert e.status() == "StatusCode.UNAUTHENTICATED"
    assert not c.is_model_ready("tiny")
    c.load_model("tiny", headers={"authorization": "Bearer s3cret"})
    assert c.is_model_ready("tiny")
    c.unload_model("tiny", headers={"authorization": "Bearer s3cret"})
    assert not c.is_model_ready("tiny")
    c.close()


class StreamClient:
    """A tritonclient.grpc client whose calls go over ModelStreamInfer."""

    def __init__(self, url):
        self.c = grpcclient.InferenceServerClient(url)
        self.got = queue.Queue()
        self.c.start_stream(callback=lambda result, error: self.got.put((result, error)))

    def infer(self, model, inputs):
        self.c.async_stream_infer(model, inputs)
        r, e = self.got.get(timeout=30)
        if e is not None:
            raise e
        return r

    def close(self):
        self.c.stop_stream()
        self.c.close()


def test_reload_under_grpc_traffic_no_failures(make_server, tmp_path):
    """Reloads while unary and streaming calls go on: not one fails."""
    root = tmp_path / "repo"
    save_model(root, "hot", tiny_graph(0), version=1)
    s = make_server(root, "--model-control-mode", "explicit", "--load-model", "hot")
    url = s.grpc_url()
    ctl = grpcclient.InferenceServerClient(url)
    x = np.ones((1, 4), np.float32)
    ok, fail, versions = reload_under_traffic(
        root, "hot", lambda: ctl.load_model("hot"),
        lambda i: StreamClient(url) if i % 2 else grpcclient.InferenceServerClient(url),
        lambda c: c.infer("hot", [fp32_input("x", x)]).get_response().model_version, lambda c: c.close())
    assert fail == [], "\n".join(fail)
    assert ok > 50
    assert versions == {"1", "2"}
    assert ctl.get_model_metadata("hot", as_json=True)["versions"] == ["2"]
    ctl.close()


# ---- deadlines and cancellation of queued work ---------------------------

def metric(server, key):
    status, _, body = raw_request(server.url, "GET", "/metrics")
    assert status == 200
    line = next((l for l in body.decode().splitlines() if l.startswith(key + " ")), None)
    return int(float(line.split()[-1])) if line else 0


def failures(server, model, reason):
    return metric(server, f'kiln_inference_request_failure{{model="{model}",version="1",reason="{reason}"}}')


def pending(server, model):
    return metric(server, f'kiln_inference_pending_request_count{{model="{model}",version="1"}}')


def slow_request():
    req = service_pb2.ModelInferRequest(model_name="slow")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 512])
    req.raw_input_contents.append(np.ones((1, 512), np.float32).tobytes())
    return req.SerializeToString()


INFER = "/inference.GRPCInferenceService/ModelInfer"


def test_deadline_while_queued(server):
    """A call whose grpc-timeout passes while it waits in the queue is
    dropped before it runs and answered DEADLINE_EXCEEDED by the server
    (a raw client: it does not cancel at its deadline itself)."""
    before = failures(server, "slow", "timeout")
    c = h2frames.Conn(server.grpc_url())
    body = slow_request()
    for sid in range(1, 121, 2):  # 60 calls ahead of it, without deadlines
        c.call(sid, INFER, body)
    c.call(121, INFER, body, extra=[("grpc-timeout", "2m")])
    assert c.wait(lambda fr: c.ended(121), timeout=60)
    trailers = [f for f in c.frames if f[2] == 121 and f[0] == h2frames.HEADERS]
    # grpc-status 4 (DEADLINE_EXCEEDED): a one-byte literal, never Huffman-coded.
    assert b"\x014" in trailers[-1][3]
    # gRPC's words first, which Triton's clients match.
    assert h2frames.stream_headers(c, 121)[-1]["grpc-message"].startswith("Deadline Exceeded")
    assert not any(f[2] == 121 and f[0] == h2frames.DATA and f[3] for f in c.frames)
    assert c.wait(lambda fr: all(c.ended(sid) for sid in range(1, 121, 2)), timeout=60)
    c.close()
    assert failures(server, "slow", "timeout") == before + 1
    # A malformed grpc-timeout is the client's error.
    c = h2frames.Conn(server.grpc_url())
    c.call(1, INFER, body, extra=[("grpc-timeout", "soon")])
    assert c.wait(lambda fr: c.ended(1))
    c.close()


def test_deadline_with_tritonclient(make_server, tmp_path):
    """tritonclient's client_timeout: DEADLINE_EXCEEDED for a call stuck in
    the queue, and the server drops it (cancelled or timed out, whichever
    side saw the deadline first) instead of running it."""
    root = tmp_path / "repo"
    save_model(root, "slower", slow_graph(depth=300, width=512))
    server = make_server(root)
    channel = grpc.insecure_channel(server.grpc_url())
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    req = service_pb2.ModelInferRequest(model_name="slower")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 512])
    req.raw_input_contents.append(np.ones((1, 512), np.float32).tobytes())
    ahead = [stub.ModelInfer.future(req) for _ in range(100)]
    deadline = time.monotonic() + 10
    while pending(server, "slower") < 50 and time.monotonic() < deadline:  # a queue ahead of the call
        time.sleep(0.001)
    c = grpcclient.InferenceServerClient(server.grpc_url())
    e = grpc_error(c.infer, "slower", [fp32_input("x", np.ones((1, 512), np.float32))], client_timeout=0.02)
    assert e.status() == "StatusCode.DEADLINE_EXCEEDED"
    for f in ahead:
        f.result(timeout=60)
    assert c.infer("slower", [fp32_input("x", np.ones((1, 512), np.float32))], client_timeout=60)
    # It never ran: the server ran the 100 ahead and the last one, and
    # counted the dropped call (unless the client's reset came before the
    # server had read the call at all).
    stats = c.get_inference_statistics("slower", as_json=True)["model_stats"][0]["inference_stats"]
    assert int(stats["success"]["count"]) == 101
    assert failures(server, "slower", "timeout") + failures(server, "slower", "cancelled") <= 1
    c.close()
    channel.close()


def test_cancelled_and_closed_drop_queued_work(server, gclient):
    """RST_STREAM from the client, or its connection closing, drops the
    calls still queued: counted as cancelled, never run."""
    body = slow_request()
    before = failures(server, "slow", "cancelled")
    c = h2frames.Conn(server.grpc_url())
    sids = list(range(1, 81, 2))
    for sid in sids:
        c.call(sid, INFER, body)
    c.send(b"".join(h2frames.frame(h2frames.RST_STREAM, 0, sid, b"\x00\x00\x00\x08") for sid in sids[10:]))
    assert c.wait(lambda fr: all(c.ended(sid) for sid in sids[:10]), timeout=60)
    c.close()
    time.sleep(0.5)
    reset = failures(server, "slow", "cancelled") - before
    assert 0 < reset <= 30
    c = h2frames.Conn(server.grpc_url())
    for sid in range(1, 241, 2):
        c.call(sid, INFER, body)
    time.sleep(0.02)
    c.close()  # the connection goes with most of its 120 calls queued
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and failures(server, "slow", "cancelled") - before - reset == 0:
        time.sleep(0.1)
    assert failures(server, "slow", "cancelled") - before - reset > 0
    assert gclient.infer("slow", [fp32_input("x", np.ones((1, 512), np.float32))]).as_numpy("y").shape == (1, 512)


# ---- hostile clients: streams, floods, malformed frames ------------------

def still_serving(gclient):
    assert gclient.is_server_live()
    assert gclient.infer("tiny", [fp32_input("x", np.ones((1, 4), np.float32))]).as_numpy("probs").shape == (1, 3)


def test_max_concurrent_streams(server, gclient):
    c = h2frames.Conn(server.grpc_url())
    block = h2frames.header_block(h2frames.grpc_headers("/inference.GRPCInferenceService/ServerLive"))
    # 200 calls open at once (no END_STREAM): past SETTINGS_MAX_CONCURRENT_STREAMS (128) they are refused.
    c.send(b"".join(h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, sid, block) for sid in range(1, 401, 2)))
    refused = lambda fr: [f for f in fr if f[0] == h2frames.RST_STREAM and
                          int.from_bytes(f[3], "big") == h2frames.REFUSED_STREAM]
    assert c.wait(lambda fr: len(refused(fr)) >= 72)
    assert len(refused(c.frames)) == 72 and min(f[2] for f in refused(c.frames)) == 257
    # The open ones still answer when their message comes.
    c.send(h2frames.frame(h2frames.DATA, h2frames.END_STREAM, 1, h2frames.grpc_message(b"")))
    assert c.wait(lambda fr: any(f[2] == 1 and f[0] == h2frames.DATA and f[3] for f in fr))
    c.close()
    still_serving(gclient)


@pytest.mark.parametrize("flood", ["settings", "ping", "continuation", "reset"])
def test_floods_get_goaway(server, gclient, flood):
    c = h2frames.Conn(server.grpc_url())
    if flood == "settings":
        c.send(h2frames.frame(h2frames.SETTINGS, 0, 0) * 20000)
    elif flood == "ping":
        # PINGs whose ACKs the client never reads: once the socket is full,
        # the ACKs wait in the server, and past a bound the connection goes.
        def pings():
            try:
                for _ in range(40):
                    c.send(h2frames.frame(h2frames.PING, 0, 0, b"12345678") * 10000)
            except OSError:
                pass  # the server stopped reading: it gave up on this client
        sender = threading.Thread(target=pings)
        sender.start()
        sender.join(timeout=3)
    elif flood == "continuation":
        c.send(h2frames.frame(h2frames.HEADERS, 0, 1, h2frames.header_block([(":method", "POST")])))
        c.send(b"".join(h2frames.frame(h2frames.CONTINUATION, 0, 1, h2frames.header_block([("x", "y")]))
                        for _ in range(100)))
    else:  # rapid reset: open a stream and cancel it, over and over
        block = h2frames.header_block(h2frames.grpc_headers(INFER))
        c.send(b"".join(h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, sid, block) +
                        h2frames.frame(h2frames.RST_STREAM, 0, sid, b"\x00\x00\x00\x08")
                        for sid in range(1, 6001, 2)))
    code = c.goaway(timeout=30)
    assert code is not None and code != 0, (flood, code)
    assert c.wait(lambda fr: False, timeout=5) is False and c.closed
    c.close()
    still_serving(gclient)


def test_header_list_too_large(server, gclient):
    c = h2frames.Conn(server.grpc_url())
    # 80 KiB of headers, over SETTINGS_MAX_HEADER_LIST_SIZE (64 KiB), in HEADERS + CONTINUATIONs.
    block = h2frames.header_block(h2frames.grpc_headers("/inference.GRPCInferenceService/ServerLive",
                                                        [(f"x-pad-{i}", "v" * 1000) for i in range(80)]))
    parts = [block[i:i + 16000] for i in range(0, len(block), 16000)]
    c.send(h2frames.frame(h2frames.HEADERS, 0, 1, parts[0]) +
           b"".join(h2frames.frame(h2frames.CONTINUATION, h2frames.END_HEADERS if i == len(parts) - 1 else 0, 1, p)
                    for i, p in enumerate(parts[1:], 1)))
    assert c.wait(lambda fr: any(f[0] == h2frames.RST_STREAM and f[2] == 1 for f in fr))
    # The connection itself goes on.
    c.call(3, "/inference.GRPCInferenceService/ServerLive", b"")
    assert c.wait(lambda fr: any(f[2] == 3 and f[0] == h2frames.DATA and f[3] for f in fr))
    c.close()
    still_serving(gclient)


def test_connection_buffer_bound(make_server, repo):
    """Calls whose messages never finish hold at most --grpc-max-buffered-bytes
    (by default 2 messages' worth) on one connection: the call past it gets
    RESOURCE_EXHAUSTED and a RST_STREAM, the others and the connection go on."""
    s = make_server(repo, "--grpc-max-message-size", "64K")
    c = h2frames.Conn(s.grpc_url())
    block = h2frames.header_block(h2frames.grpc_headers(INFER))
    part = b"\x00" + (60000).to_bytes(4, "big") + b"\x0a" * 14995  # the start of a 60000-byte message
    for sid in range(1, 11, 2):
        c.send(h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, sid, block))
        for k in range(4):  # 60 000 bytes in 15 000-byte DATA frames, no END_STREAM
            c.send(h2frames.frame(h2frames.DATA, 0, sid, part if k == 0 else b"\x0a" * 15000))
    assert c.wait(lambda fr: all(c.ended(sid) for sid in (5, 7, 9)))
    block5 = [f for f in c.frames if f[2] == 5 and f[0] == h2frames.HEADERS][-1][3]
    assert b"\x018" in block5  # grpc-status 8, RESOURCE_EXHAUSTED (7 and 9 repeat it from the HPACK table)
    for sid in (5, 7, 9):
        assert any(f[2] == sid and f[0] == h2frames.RST_STREAM and f[3] == b"\x00\x00\x00\x00" for f in c.frames)
    assert not any(c.ended(sid) for sid in (1, 3))
    c.send(b"".join(h2frames.frame(h2frames.RST_STREAM, 0, sid, b"\x00\x00\x00\x08") for sid in (1, 3)))
    c.call(11, "/inference.GRPCInferenceService/ServerLive", b"")
    assert c.wait(lambda fr: any(f[2] == 11 and f[0] == h2frames.DATA and f[3] for f in fr))
    c.close()


@pytest.mark.parametrize("bad", ["settings_length", "data_on_stream_0", "window_zero", "garbage", "even_stream"])
def test_malformed_frames_get_goaway(server, gclient, bad):
    c = h2frames.Conn(server.grpc_url())
    c.send({"settings_length": h2frames.frame(h2frames.SETTINGS, 0, 0, b"\x00" * 5),
            "data_on_stream_0": h2frames.frame(h2frames.DATA, 0, 0, b"xx"),
            "window_zero": h2frames.frame(h2frames.WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x00"),
            "garbage": b"\xff" * 64,
            "even_stream": h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, 2,
                                          h2frames.header_block(h2frames.grpc_headers(INFER)))}[bad])
    code = c.goaway()
    assert code is not None and code != 0, (bad, code)
    c.close()
    still_serving(gclient)
