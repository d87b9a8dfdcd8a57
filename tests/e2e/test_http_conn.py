"""kiln's own HTTP/1.1 connections (server/http_conn.c) against raw sockets:
pipelining, half-closed clients, HTTP/1.0 keep-alive, 100-continue, HEAD,
answers larger than the socket takes at once to a client that reads late,
and a request with too many header fields. Each is what any HTTP/1.1
client or proxy may do; the answers must stay whole and in order."""
import json
import socket
import threading
import time

import pytest

import numpy as np

from conftest import save_model, serving
from test_http_hostile import connect, read_all, responses

INFER = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()


def post(path, body, extra=b""):
    return (b"POST %s HTTP/1.1\r\nHost: k\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
            % (path.encode(), len(body), extra)) + body


def get(path, extra=b""):
    return b"GET %s HTTP/1.1\r\nHost: k\r\n%s\r\n" % (path.encode(), extra)


@pytest.fixture(scope="module")
def srv(repo):
    yield from serving(repo)


def test_pipelined_requests_answered_in_order(srv):
    s = connect(srv)
    s.sendall(post("/v2/models/tiny/infer", INFER) + get("/v2/models/nope") + get("/v2/health/live")
              + post("/v2/models/tiny/infer", INFER, b"Connection: close\r\n"))
    out = responses(read_all(s))
    s.close()
    assert [r[0] for r in out] == [200, 404, 200, 200]
    assert json.loads(out[0][2])["model_name"] == "tiny"
    assert "nope" in json.loads(out[1][2])["error"]
    assert out[0][2] == out[3][2]
    assert out[3][1]["connection"] == "close"


def test_half_closed_client_gets_its_answer(srv):
    s = connect(srv)
    s.sendall(post("/v2/models/tiny/infer", INFER))
    s.shutdown(socket.SHUT_WR)
    out = responses(read_all(s))
    s.close()
    assert [r[0] for r in out] == [200]
    assert json.loads(out[0][2])["outputs"]


def test_http10_closes_unless_kept_alive(srv):
    s = connect(srv)
    s.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
    out = read_all(s)  # ends: the server closes
    s.close()
    assert out.startswith(b"HTTP/1.1 200 ")
    assert b"\r\nConnection: close\r\n" in out
    s = connect(srv)
    s.sendall(b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    first = s.recv(4096)
    assert first.startswith(b"HTTP/1.1 200 ") and b"\r\nConnection: keep-alive\r\n" in first
    s.sendall(b"GET /v2/models/tiny HTTP/1.0\r\n\r\n")
    out = responses(read_all(s))
    s.close()
    assert out[0][0] == 200 and json.loads(out[0][2])["name"] == "tiny"


def test_expect_100_continue(srv):
    s = connect(srv)
    s.sendall(post("/v2/models/tiny/infer", b"", b"Expect: 100-continue\r\n").replace(
        b"Content-Length: 0", b"Content-Length: %d" % len(INFER)))
    interim = s.recv(64)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    s.sendall(INFER)
    s.shutdown(socket.SHUT_WR)
    out = responses(read_all(s))
    s.close()
    assert out[0][0] == 200 and json.loads(out[0][2])["model_name"] == "tiny"


def test_head_has_the_length_of_get(srv):
    s = connect(srv)
    s.sendall(get("/v2/models/tiny") + b"HEAD /v2/models/tiny HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n")
    raw = read_all(s)
    s.close()
    body_end = raw.index(b"\r\n\r\n") + 4
    n = int(raw[:body_end].lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    head = raw[body_end + n:]
    assert head.startswith(b"HTTP/1.1 200 ")
    assert head.endswith(b"\r\n\r\n"), "a HEAD answer has no body"
    assert b"Content-Length: %d\r\n" % n in head


def test_answers_larger_than_the_socket_takes(srv):
    """Thousands of pipelined requests whose answers the client reads only
    after a pause: the server writes what the kernel takes, waits, pauses
    reading the rest, and every answer arrives whole and in order."""
    n = 3000
    reqs = b"".join(get("/v2/models/tiny" if i % 2 else "/v2/models/tiny/versions/1") for i in range(n))
    s = connect(srv, timeout=60)
    sender = threading.Thread(target=s.sendall, args=(reqs + get("/v2/health/live", b"Connection: close\r\n"),))
    sender.start()
    time.sleep(1.0)
    out = responses(read_all(s))
    sender.join()
    s.close()
    assert len(out) == n + 1
    assert all(r[0] == 200 and json.loads(r[2])["name"] == "tiny" for r in out[:n])


def test_too_many_header_fields(srv):
    s = connect(srv)
    fields = b"".join(b"X-F%d: %d\r\n" % (i, i) for i in range(200))
    s.sendall(get("/v2/health/live", fields))
    out = responses(read_all(s))
    s.close()
    assert out[0][0] == 431
    assert "more than 128 header fields" in json.loads(out[0][2])["error"]
    # and the server still answers others
    s = connect(srv)
    s.sendall(get("/v2/health/live", b"Connection: close\r\n"))
    assert responses(read_all(s))[0][0] == 200
    s.close()


def test_slow_reader_is_not_cut_off(tmp_path, make_server):
    """--http-timeout-secs bounds a write that makes no progress, not a long
    answer read slowly: one answer of ~13 MB to a client with a small
    receive buffer reading ~2.6 MB/s, so that the server writes for longer
    than the timeout (the kernel's buffers take about 4 MB of it at once),
    arrives whole."""
    import onnx.helper as oh
    from onnx import TensorProto as TP
    n = 1_400_000
    g = oh.make_graph([oh.make_node("Identity", ["x"], ["y"])], "big",
                      [oh.make_tensor_value_info("x", TP.FLOAT, [1, n])], [oh.make_tensor_value_info("y", TP.FLOAT, [1, n])])
    save_model(tmp_path / "repo", "big", g)
    srv = make_server(tmp_path / "repo", "--http-timeout-secs", "2", "--cache-size", "0")
    x = (np.arange(n, dtype=np.float32) * np.float32(1.0001)).tobytes()  # values whose JSON is 9-10 digits
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, n],
                                   "parameters": {"binary_data_size": len(x)}}]}).encode()
    host, port = srv.url.split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 128 * 1024)  # before connecting: the window it offers
    s.settimeout(30)
    s.connect((host, int(port)))
    s.sendall(post("/v2/models/big/infer", head + x, b"Inference-Header-Content-Length: %d\r\nConnection: close\r\n"
                   % len(head)))
    chunks, t0 = [], time.monotonic()
    while True:
        time.sleep(0.05)
        b = s.recv(128 * 1024)
        if not b:
            break
        chunks.append(b)
    s.close()
    took = time.monotonic() - t0
    out = responses(b"".join(chunks))
    assert len(out) == 1 and out[0][0] == 200, out[0][:2] if out else None
    y = np.array(json.loads(out[0][2])["outputs"][0]["data"], dtype=np.float32)
    assert np.array_equal(y, np.frombuffer(x, dtype=np.float32))
    assert sum(map(len, chunks)) > 12 << 20 and took > 4, (sum(map(len, chunks)), took)
