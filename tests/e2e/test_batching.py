"""Dynamic batching through the real server and the official client.

One kiln server serves a repository made for these tests:
  digits_batch  the digits model with dynamic batching (2 ms delay, 2 instances)
  digits_solo   the same file without dynamic batching: the single-request reference
  digits_hold   dynamic batching with a long delay and a queue of 4: queue-full
  digits_tmo    a long delay and a 100 ms default queue timeout: timeouts
  slow          ResNet-50 (light_resnet50 with a symbolic batch dim), one
                instance, max_batch_size 8, two priority levels, a queue of 8
                a level: a busy instance to queue behind, for priorities,
                per-request timeouts and cancellation. Requests that keep it
                busy are sent at the highest priority, so that the requests
                under test queue behind them whatever the machine's speed.
"""
import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

tritonclient_http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KILN = Path(os.environ.get("KILN_BIN", ROOT / "build" / "kiln"))
DIGITS = ROOT / "model_repository" / "digits" / "1" / "model.onnx"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model(repo, name, onnx_path, config):
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.onnx").write_bytes(Path(onnx_path).read_bytes())
    (d / "config.json").write_text(json.dumps(dict(config, name=name)))


def _batchable_resnet(dst):
    import onnx
    from onnx import numpy_helper

    src = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"
    m = onnx.load(str(src))
    for v in list(m.graph.input[:1]) + list(m.graph.output):
        v.type.tensor_type.shape.dim[0].ClearField("dim_value")
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype == np.int64 and a.shape == (2,) and a[0] == 1 and a[1] == 2048:
            t.CopyFrom(numpy_helper.from_array(np.array([-1, 2048], dtype=np.int64), t.name))
    del m.graph.value_info[:]
    onnx.save(m, str(dst))
    return m.graph.input[0].name, m.graph.output[0].name


@pytest.fixture(scope="module")
def bserver(tmp_path_factory):
    assert KILN.exists(), f"{KILN} is missing: run make first"
    assert DIGITS.exists(), f"{DIGITS} is missing: run tools/train_digits.py"
    tmp = tmp_path_factory.mktemp("batching")
    repo = tmp / "repo"
    cpu1 = [{"count": 1, "kind": "KIND_CPU"}]
    _model(repo, "digits_batch", DIGITS, {
        "max_batch_size": 64, "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
        "dynamic_batching": {"max_queue_delay_microseconds": 2000}})
    _model(repo, "digits_solo", DIGITS, {"max_batch_size": 64, "instance_group": cpu1})
    _model(repo, "digits_hold", DIGITS, {
        "max_batch_size": 64, "instance_group": cpu1,
        "dynamic_batching": {"max_queue_delay_microseconds": 3000000,
                             "default_queue_policy": {"max_queue_size": 4}}})
    _model(repo, "digits_tmo", DIGITS, {
        "max_batch_size": 64, "instance_group": cpu1,
        "dynamic_batching": {"max_queue_delay_microseconds": 3000000,
                             "default_queue_policy": {"timeout_action": "REJECT",
                                                      "default_timeout_microseconds": 100000}},
        "parameters": {"intra_op_thread_count": {"string_value": "1"}}})
    rn = tmp / "resnet50.onnx"
    rn_in, rn_out = _batchable_resnet(rn)
    _model(repo, "slow", rn, {
        "max_batch_size": 8, "instance_group": cpu1,
        "dynamic_batching": {"priority_levels": 2, "default_priority_level": 2,
                             "default_queue_policy": {"max_queue_size": 8, "allow_timeout_override": True}}})

    port = _free_port()
    log = open(tmp / "server.log", "w+")
    proc = subprocess.Popen([str(KILN), "serve", "--model-repository", str(repo), "--http-address", "127.0.0.1",
                             "--http-port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.1)
    else:
        proc.kill()
    if proc.poll() is not None:
        log.seek(0)
        pytest.fail(f"kiln serve exited ({proc.returncode}):\n{log.read()}")
    yield {"url": url, "rn_in": rn_in, "rn_out": rn_out, "log": tmp / "server.log"}
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def _stats(url, model):
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=10) as r:
        return json.load(r)["model_stats"][0]


def _queue_size(url, model):
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=10) as r:
        for ln in r.read().decode().splitlines():
            if ln.startswith("kiln_queue_size{") and f'model="{model}"' in ln:
                return float(ln.split()[-1])
    raise AssertionError("kiln_queue_size missing from /metrics")


def _digits_input(x):
    inp = tritonclient_http.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    return [inp]


def _resnet_input(bserver, rows, value=0.0):
    x = np.full((rows, 3, 224, 224), value, dtype=np.float32)
    inp = tritonclient_http.InferInput(bserver["rn_in"], list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    return [inp]


class Timed:
    """Runs fn in a thread; records its result or error and when it ended."""

    def __init__(self, fn):
        self.result = self.error = self.end = None
        self.thread = threading.Thread(target=self._run, args=(fn,))
        self.thread.start()

    def _run(self, fn):
        try:
            self.result = fn()
        except Exception as e:  # noqa: BLE001 - kept for the assertion
            self.error = e
        self.end = time.monotonic()

    def join(self, timeout=300):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "request did not finish"
        return self


def test_512_concurrent_requests_get_their_own_answers(bserver):
    url = bserver["url"]
    rng = np.random.default_rng(20240607)
    xs = rng.random((512, 64), dtype=np.float32)

    solo = tritonclient_http.InferenceServerClient(url)
    want_label, want_prob = [], []
    for i in range(512):
        r = solo.infer("digits_solo", _digits_input(xs[i:i + 1]))
        want_label.append(r.as_numpy("label")[0])
        want_prob.append(r.as_numpy("probabilities")[0])
    solo.close()
    before = _stats(url, "digits_batch")

    # 512 threads, each with its own connection, released together.
    clients = [tritonclient_http.InferenceServerClient(url) for _ in range(512)]
    results = [None] * 512
    go = threading.Barrier(512)

    def one(i):
        inputs = _digits_input(xs[i:i + 1])
        go.wait()
        results[i] = clients[i].infer("digits_batch", inputs, request_id=str(i))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(512)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for c in clients:
        c.close()
    for i, r in enumerate(results):
        assert r is not None, f"request {i} got no answer"
        assert r.get_response()["id"] == str(i)
        label, prob = r.as_numpy("label"), r.as_numpy("probabilities")
        assert label.shape == (1,) and prob.shape == (1, 10)
        assert label[0] == want_label[i], f"request {i}: label {label[0]} batched vs {want_label[i]} alone"
        np.testing.assert_allclose(prob[0], want_prob[i], rtol=1e-5, atol=1e-6, err_msg=f"request {i}")

    after = _stats(url, "digits_batch")
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 512
    assert executions < 512, f"{executions} executions for 512 concurrent requests: no batching"
    sizes = [b["batch_size"] for b in after.get("batch_stats", [])]
    assert any(s > 1 for s in sizes), f"batch sizes seen: {sizes}"
    print(f"512 requests ran in {executions} batches; batch sizes seen: {sorted(sizes)}")


def test_rows_of_a_multi_row_request_count(bserver):
    url = bserver["url"]
    x = np.random.default_rng(3).random((5, 64), dtype=np.float32)
    solo = tritonclient_http.InferenceServerClient(url)
    want = solo.infer("digits_solo", _digits_input(x)).as_numpy("probabilities")
    before = _stats(url, "digits_batch")
    got = solo.infer("digits_batch", _digits_input(x)).as_numpy("probabilities")
    after = _stats(url, "digits_batch")
    solo.close()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert after["inference_count"] - before["inference_count"] == 5


def test_queue_full_is_503_at_admission(bserver):
    url = bserver["url"]
    x = np.zeros((1, 64), dtype=np.float32)
    # A 3 s delay holds up to 4 requests in the queue; the 5th is refused at once.
    client = tritonclient_http.InferenceServerClient(url, concurrency=8)
    held = [client.async_infer("digits_hold", _digits_input(x)) for _ in range(4)]
    time.sleep(0.5)
    t0 = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        tritonclient_http.InferenceServerClient(url).infer("digits_hold", _digits_input(x))
    assert time.monotonic() - t0 < 1.0
    assert "Exceeds maximum queue size" in str(e.value)
    assert e.value.status() in ("503", 503, "StatusCode.UNAVAILABLE") or "503" in str(e.value.status())
    # The held requests still complete once the delay is over.
    for h in held:
        assert h.get_result().as_numpy("label").shape == (1,)
    client.close()


def test_queue_timeout_fails_at_the_deadline(bserver):
    url = bserver["url"]
    x = np.zeros((1, 64), dtype=np.float32)
    # Held by a 3 s delay, the request's 100 ms queue timeout fires first.
    t0 = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        tritonclient_http.InferenceServerClient(url).infer("digits_tmo", _digits_input(x))
    elapsed = time.monotonic() - t0
    assert "Request timeout expired" in str(e.value)
    assert "503" in str(e.value.status())
    assert 0.09 <= elapsed < 1.5, f"timed out after {elapsed:.3f} s, want about 0.1 s"


def _metric(url, name, model):
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=10) as r:
        for ln in r.read().decode().splitlines():
            if ln.startswith(name + "{") and f'model="{model}"' in ln:
                return float(ln.split()[-1])
    raise AssertionError(f"{name} missing from /metrics")


def _accepted(url, model):
    """Requests the model has taken in: pending + answered (success or failure)."""
    n = 0.0
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=10) as r:
        for ln in r.read().decode().splitlines():
            name = ln.split("{", 1)[0]
            if name in ("kiln_inference_pending_request_count", "kiln_inference_request_success",
                        "kiln_inference_request_failure") and f'model="{model}"' in ln:
                n += float(ln.split()[-1])
    return n


def _infer_slow(bserver, rows, priority=0, timeout=None):
    url = bserver["url"]
    return lambda: tritonclient_http.InferenceServerClient(url, network_timeout=600).infer(
        "slow", _resnet_input(bserver, rows), priority=priority, timeout=timeout)


def _wait(cond, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def _busy_queued(url, busy):
    """How many of the busy requests are still queued, when one of them runs."""
    ended = sum(b.end is not None for b in busy)
    return len(busy) - ended - 1


def test_request_timeout_while_instance_busy(bserver):
    url = bserver["url"]
    n0 = _accepted(url, "slow")
    busy = [Timed(_infer_slow(bserver, 8, priority=1)) for _ in range(2)]
    _wait(lambda: _accepted(url, "slow") >= n0 + 2, "both busy accepted")
    # Queued behind the busy instance with a 50 ms timeout (the request's own,
    # allowed by allow_timeout_override): it fails at its deadline, before the
    # running batches end.
    late = Timed(_infer_slow(bserver, 1, timeout=50000)).join()
    for b in busy:
        b.join()
        assert b.error is None, b.error
    assert isinstance(late.error, InferenceServerException), late.result
    assert "Request timeout expired" in str(late.error)
    assert late.end < max(b.end for b in busy), "the timeout waited for the instance to free up"


def test_priorities_highest_first(bserver):
    url = bserver["url"]
    assert _queue_size(url, "slow") == 0
    n0 = _accepted(url, "slow")
    busy = [Timed(_infer_slow(bserver, 8, priority=1))]
    _wait(lambda: _accepted(url, "slow") >= n0 + 1, "the first busy request is in")
    busy += [Timed(_infer_slow(bserver, 8, priority=1)) for _ in range(3)]
    _wait(lambda: _accepted(url, "slow") >= n0 + 4, "busy requests accepted")
    low1 = Timed(_infer_slow(bserver, 4, priority=2))
    _wait(lambda: _queue_size(url, "slow") >= _busy_queued(url, busy) + 1, "low1 queued")
    low2 = Timed(_infer_slow(bserver, 4, priority=2))
    _wait(lambda: _queue_size(url, "slow") >= _busy_queued(url, busy) + 2, "low2 queued")
    high = Timed(_infer_slow(bserver, 4, priority=1))
    # low1, low2 and high all wait together behind a busy request.
    _wait(lambda: _queue_size(url, "slow") == _busy_queued(url, busy) + 3 or busy[-1].end is not None,
          "all three queued")
    assert busy[-1].end is None, "the instance caught up: the machine is too fast for this test"
    for t in busy + [low1, low2, high]:
        t.join()
        assert t.error is None, t.error
    # After the busy ones, a batch of 8 rows: the high-priority request and
    # the oldest low one together; the other low one runs after them.
    assert high.end < low2.end
    assert abs(high.end - low1.end) < abs(low2.end - high.end)


def test_cancelled_request_is_not_run(bserver):
    url = bserver["url"]
    before = _stats(url, "slow")
    n0 = _accepted(url, "slow")
    busy = [Timed(_infer_slow(bserver, 8, priority=1)) for _ in range(3)]
    _wait(lambda: _accepted(url, "slow") >= n0 + 3, "busy requests accepted")
    # A 3-row request sent on a raw connection that closes while it is queued.
    x = np.zeros((3, 3, 224, 224), dtype=np.float32).tobytes()
    header = json.dumps({"inputs": [{"name": bserver["rn_in"], "shape": [3, 3, 224, 224], "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(x)}}]}).encode()
    body = header + x
    host, port = url.split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: " + url.encode() +
              b"\r\nContent-Type: application/octet-stream\r\nInference-Header-Content-Length: " +
              str(len(header)).encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    _wait(lambda: _queue_size(url, "slow") == _busy_queued(url, busy) + 1 or busy[-1].end is not None,
          "the request is queued")
    assert busy[-1].end is None, "the instance caught up: the machine is too fast for this test"
    s.close()
    # Dropped when its client went away, while the busy requests still run.
    _wait(lambda: _queue_size(url, "slow") == _busy_queued(url, busy) or busy[-1].end is not None,
          "the request is dropped", 10)
    assert busy[-1].end is None, "dropped only when the queue moved on"
    for b in busy:
        b.join()
        assert b.error is None, b.error
    after = _stats(url, "slow")
    rows = after["inference_count"] - before["inference_count"]
    assert rows == 24, f"{rows} rows ran: the cancelled request's 3 rows should not have"
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    cancelled = [ln for ln in metrics.splitlines()
                 if ln.startswith("kiln_inference_request_failure{") and 'model="slow"' in ln and "cancel" in ln]
    assert cancelled and float(cancelled[0].split()[-1]) >= 1, cancelled


def test_heavy_model_moves_to_all_cores(bserver):
    """ResNet-50 computes for tens of ms a request, so the I/O threads need
    little CPU: its instance, whose thread count kiln chose (the cores less
    one), moves to all the cores after a couple of runs, and its answers
    stay the same. A model whose config fixes the count keeps it."""
    cores = os.cpu_count() or 1
    if cores < 2:
        pytest.skip("one core: nothing to move to")
    c = tritonclient_http.InferenceServerClient(bserver["url"])
    try:
        outs = [c.infer("slow", _resnet_input(bserver, 1, 0.25)).as_numpy(bserver["rn_out"]) for _ in range(4)]
        with urllib.request.urlopen(f"http://{bserver['url']}/v2/models/digits_tmo/config", timeout=10) as r:
            cfg = json.load(r)
    finally:
        c.close()
    log = Path(bserver["log"]).read_text()
    m = re.search(r"model 'slow' instance 0: a batch took [0-9.]+ ms per request.*: (\d+) thread\(s\) instead of (\d+)",
                  log)
    assert m, log[-3000:]
    assert (int(m.group(1)), int(m.group(2))) == (cores, cores - 1)
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-4, atol=1e-5)
    assert "model 'digits_tmo' instance" not in log
    assert cfg["parameters"] == {"intra_op_thread_count": {"string_value": "1"}}


def _inline_count(url, model):
    text = urllib.request.urlopen(f"http://{url}/metrics", timeout=10).read().decode()
    line = next(l for l in text.splitlines() if l.startswith(f'kiln_inline_exec_count{{model="{model}",version="1"}}'))
    return int(float(line.split()[-1]))


def test_small_model_runs_inline_at_concurrency_one(tmp_path, make_server):
    """One client at a time on a small CPU model: after the first runs the
    I/O thread runs the model itself (kiln_inline_exec_count counts them);
    with --inline-max-us 0 it never does. The answers are the same."""
    from conftest import save_model, tiny_graph
    root = tmp_path / "repo"
    save_model(root, "tiny", tiny_graph())
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 7
    answers = []
    for flags, expect_inline in (((), True), (("--inline-max-us", "0"), False)):
        srv = make_server(root, *flags)
        c = tritonclient_http.InferenceServerClient(srv.url)
        got = []
        for _ in range(30):
            inp = tritonclient_http.InferInput("x", x.shape, "FP32")
            inp.set_data_from_numpy(x)
            got.append(c.infer("tiny", [inp]).as_numpy("probs"))
        c.close()
        n = _inline_count(srv.url, "tiny")
        if expect_inline:
            assert n >= 20, n
        else:
            assert n == 0, n
        assert all(np.array_equal(g, got[0]) for g in got)
        answers.append(got[0])
    np.testing.assert_array_equal(answers[0], answers[1])
