"""Graceful shutdown: SIGTERM with requests queued and running; every
accepted request is answered, new work gets 503, the process exits 0. A
second signal forces the exit."""
import re
import signal
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import raw_request, save_model, slow_graph, tiny_graph

# The "slow" chain of matrix products is this wide so that each request takes
# milliseconds on any machine: 24 requests must still be queued when a test
# signals the server or hangs up (512 wide, fast kernels finish them first).
WIDTH = 1536


@pytest.fixture()
def slow_repo(tmp_path):
    root = tmp_path / "repo"
    save_model(root, "slow", slow_graph(depth=80, width=WIDTH))
    save_model(root, "tiny", tiny_graph())
    return root


def slow_infer(url, results, i):
    c = httpclient.InferenceServerClient(url, connection_timeout=60, network_timeout=60)
    x = np.full((1, WIDTH), 0.01 * i, np.float32)
    inp = httpclient.InferInput("x", [1, WIDTH], "FP32")
    inp.set_data_from_numpy(x)
    try:
        r = c.infer("slow", [inp])
        results[i] = ("ok", r.as_numpy("y").shape)
    except InferenceServerException as e:
        results[i] = ("error", f"{e.status()} {e.message()}")
    except Exception as e:
        results[i] = ("error", repr(e))
    c.close()


def test_sigterm_drains_accepted_requests(make_server, slow_repo):
    s = make_server(slow_repo)
    n = 24
    results = [None] * n
    threads = [threading.Thread(target=slow_infer, args=(s.url, results, i)) for i in range(n)]
    for t in threads:
        t.start()
    # Wait until the server holds queued work, then ask it to stop.
    deadline = time.monotonic() + 10
    accepted = 0
    while time.monotonic() < deadline:
        _, _, body = raw_request(s.url, "GET", "/metrics")
        m = re.search(r'kiln_inference_pending_request_count\{model="slow",version="1"\} (\d+)', body.decode())
        accepted = int(m.group(1)) if m else 0
        if accepted >= 8:
            break
        time.sleep(0.01)
    s.signal(signal.SIGTERM)
    time.sleep(0.05)
    # Draining: not ready, new inference refused with 503 (if it is still up).
    try:
        status, headers, body = raw_request(s.url, "GET", "/v2/health/ready")
        assert status == 400
        status, headers, body = raw_request(
            s.url, "POST", "/v2/models/tiny/infer",
            '{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}')
        assert status == 503 and b"shutting down" in body
        assert headers.get("Connection") == "close"
    except (ConnectionError, OSError):
        pass  # it already finished draining and exited
    for t in threads:
        t.join(60)
    assert s.proc.wait(60) == 0, s.text()
    # Requests the server had accepted all complete; any that arrived after
    # the signal were refused cleanly with 503, never dropped.
    ok = [r for r in results if r and r[0] == "ok"]
    bad = [r for r in results if not r or (r[0] != "ok" and not r[1].startswith("503 the server is shutting down"))]
    assert bad == [], bad
    assert len(ok) >= accepted >= 8
    m = re.search(r"draining \((\d+) requests? in flight\)", s.text())
    assert m and int(m.group(1)) > 0, s.text()
    assert "drained" in s.text()


def test_second_signal_forces_exit(make_server, slow_repo):
    s = make_server(slow_repo)
    results = [None] * 16
    threads = [threading.Thread(target=slow_infer, args=(s.url, results, i)) for i in range(16)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    s.signal(signal.SIGTERM)
    time.sleep(0.02)
    s.signal(signal.SIGINT)
    rc = s.proc.wait(30)
    for t in threads:
        t.join(60)
    if "drained" not in s.text():  # the queue may have emptied between the two signals
        assert rc == 1
        assert "forcing the exit" in s.text()


def test_exit_timeout_forces_exit(make_server, tmp_path):
    root = tmp_path / "repo"
    save_model(root, "slow", slow_graph(depth=400, width=WIDTH))
    s = make_server(root, "--exit-timeout-secs", "0")
    results = [None] * 8
    threads = [threading.Thread(target=slow_infer, args=(s.url, results, i)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    s.signal(signal.SIGTERM)
    rc = s.proc.wait(30)
    for t in threads:
        t.join(60)
    if "drained" not in s.text():
        assert rc == 1 and "exit timeout" in s.text()


def test_idle_sigint_exits_zero(make_server, slow_repo):
    s = make_server(slow_repo)
    c = httpclient.InferenceServerClient(s.url)
    assert c.is_server_ready()
    c.close()
    s.signal(signal.SIGINT)
    assert s.proc.wait(30) == 0


def test_client_gone_cancels_queued_request(make_server, slow_repo):
    """Clients that hang up while queued: their requests are dropped before
    running (counted as cancelled); the others are answered."""
    import json as _json
    import socket
    s = make_server(slow_repo)
    body = _json.dumps({"inputs": [{"name": "x", "shape": [1, WIDTH], "datatype": "FP32", "data": [1.0] * WIDTH}]}).encode()
    req = b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: k\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    host, port = s.url.split(":")
    socks = [socket.create_connection((host, int(port))) for _ in range(24)]
    for sk in socks:
        sk.sendall(req)
    time.sleep(0.05)
    for sk in socks[4:]:
        sk.close()
    for sk in socks[:4]:
        sk.settimeout(30)
        assert sk.recv(15) == b"HTTP/1.1 200 OK"
        sk.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        _, _, m = raw_request(s.url, "GET", "/metrics")
        text = m.decode()
        pending = int(re.search(r'pending_request_count\{model="slow",version="1"\} (\d+)', text).group(1))
        if pending == 0:
            break
        time.sleep(0.1)
    cancelled = int(re.search(r'failure\{model="slow",version="1",reason="cancelled"\} (\d+)', text).group(1))
    success = int(re.search(r'request_success\{model="slow",version="1"\} (\d+)', text).group(1))
    assert pending == 0
    assert cancelled > 0 and success + cancelled == 24


def tiny_infer(url):
    """One request to tiny over a fresh connection: its HTTP status."""
    import json
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    status, _, _ = raw_request(url, "POST", "/v2/models/tiny/infer", body.encode(),
                               {"Content-Type": "application/json"})
    return status


def test_shutdown_delay_unready_but_serving(make_server, slow_repo):
    """SIGTERM with --shutdown-delay-secs: readiness (HTTP, gRPC, the model's)
    turns false at once, while inference is still answered 200 for the delay;
    then the drain, and exit 0."""
    import tritonclient.grpc as grpcclient
    s = make_server(slow_repo, "--shutdown-delay-secs", "3")
    g = grpcclient.InferenceServerClient(s.grpc_url())
    assert tiny_infer(s.url) == 200
    assert raw_request(s.url, "GET", "/v2/health/ready")[0] == 200
    s.signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while raw_request(s.url, "GET", "/v2/health/ready")[0] == 200:
        assert time.monotonic() < deadline, "readiness stayed true after SIGTERM"
        time.sleep(0.02)
    assert raw_request(s.url, "GET", "/v2/health/ready")[0] == 400
    assert raw_request(s.url, "GET", "/v2/models/tiny/ready")[0] == 400
    assert g.is_server_ready() is False
    assert g.is_server_live() is True
    # Served during the delay, over HTTP and gRPC; each HTTP answer closes
    # its connection so that keep-alive clients move to another replica.
    statuses = [tiny_infer(s.url) for _ in range(5)]
    assert statuses == [200] * 5, statuses
    i = grpcclient.InferInput("x", [1, 4], "FP32")
    i.set_data_from_numpy(np.ones((1, 4), np.float32))
    assert g.infer("tiny", [i]).as_numpy("probs").shape == (1, 3)
    status, headers, _ = raw_request(s.url, "POST", "/v2/models/tiny/infer",
                                     b'{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}')
    assert status == 200 and {k.lower(): v for k, v in headers.items()}.get("connection") == "close"
    g.close()
    assert "--shutdown-delay-secs" in s.text()
    assert s.proc.wait(timeout=30) == 0
    log = s.text()
    assert log.index("not ready; serving for 3 s") < log.index("draining")


def test_shutdown_delay_skipped_by_sigint(make_server, slow_repo):
    s = make_server(slow_repo, "--shutdown-delay-secs", "600")
    s.signal(signal.SIGINT)
    assert s.proc.wait(timeout=30) == 0
    assert "not ready; serving" not in s.text()


def test_second_signal_during_delay_forces_exit(make_server, slow_repo):
    s = make_server(slow_repo, "--shutdown-delay-secs", "600")
    s.signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while "not ready; serving" not in s.text():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    s.signal(signal.SIGTERM)
    assert s.proc.wait(timeout=30) == 1
    assert "second signal during --shutdown-delay-secs" in s.text()
