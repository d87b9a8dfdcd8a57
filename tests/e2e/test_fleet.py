"""kiln as a fleet: three replicas of the real binary on loopback, one Redis
with a password, HAProxy in front (health checks on /v2/health/ready, its
default retry policy: refused connections only, the last retry on another
server), and `kiln bench` driving load through it while a fault happens.

Every check counts (requests failed, hits), never speed: the machines that
run this share two cores. What each fault cost (requests sent, failed, p99)
and the cross-replica hit rates go into a report, printed and written to
build/fleet-report.md (KILN_FLEET_REPORT names another file); the numbers
quoted in docs/deployment.md come from it.

The faults, in order, each under its own bench run at concurrency 16:
  none             the baseline
  SIGKILL          one replica killed: only its in-flight requests fail, and
                   HAProxy marks it down within its checks (inter 500 ms, fall 2)
  rolling restart  each replica in turn: SIGTERM (not ready, still serving for
                   --shutdown-delay-secs, then the drain), a new one on its port
  model update     version 2 written into the repository; poll mode loads it
  Redis restart    Redis killed and started again: nothing fails, and results
                   are shared again within 2 s
and then, under CPU load, the share of 200 answers computed on one replica
that the two others find in Redis (>= 95%)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import onnx.helper as oh
import pytest
from onnx import TensorProto as TP

from conftest import KILN, ROOT, KilnServer, raw_request, save_model
from test_cache import Redis, free_port

PASSWORD = "fleet-password-0123"
SECRET = "fleet-secret"
CONCURRENCY = 16
DELAY_SECS = int(os.environ.get("KILN_FLEET_DELAY", 3))         # --shutdown-delay-secs: above HAProxy's 2 x 500 ms to mark a server down
CHECK = "inter 500ms fall 2 rise 2"
REPLICAS = 3
ROWS = 200              # the request set of the cross-replica hit rate

CONFIG = {"max_batch_size": 8, "dynamic_batching": {}, "response_cache": {"enable": True}}


def fleet_graph(scale):
    """x[N,4] -> y = x W (W scaled per version, so a version shows in its answers)."""
    w = (np.arange(12, dtype=np.float32).reshape(4, 3) / 10) * scale
    return oh.make_graph([oh.make_node("MatMul", ["x", "W"], ["y"])], "fleet",
                         [oh.make_tensor_value_info("x", TP.FLOAT, ["N", 4])],
                         [oh.make_tensor_value_info("y", TP.FLOAT, ["N", 3])],
                         [oh.make_tensor("W", TP.FLOAT, w.shape, w.flatten())])


# ---- the fleet -----------------------------------------------------------------


class HAProxy:
    """haproxy -db on a config made here; its admin socket answers `show stat`."""

    def __init__(self, workdir, ports):
        exe = shutil.which("haproxy")
        assert exe, "haproxy is missing: tools/bootstrap.sh installs it (apt-get install -y haproxy)"
        self.port = free_port()
        self.sock = str(workdir / "haproxy.sock")
        servers = "\n".join(f"    server r{i} 127.0.0.1:{p}" for i, p in enumerate(ports))
        cfg = workdir / "haproxy.cfg"
        cfg.write_text(f"""global
    stats socket {self.sock} mode 600 level admin
    maxconn 4096
defaults
    mode http
    timeout connect 1s
    timeout client 60s
    timeout server 60s
    retries 3
    option redispatch
frontend fleet
    bind 127.0.0.1:{self.port}
    default_backend kiln
backend kiln
    balance roundrobin
    option httpchk GET /v2/health/ready
    default-server check {CHECK}
{servers}
""")
        subprocess.run([exe, "-c", "-f", str(cfg)], check=True, capture_output=True)
        self.log = open(workdir / "haproxy.log", "w")
        self.proc = subprocess.Popen([exe, "-db", "-f", str(cfg)], stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"127.0.0.1:{self.port}"

    def states(self):
        """{server name: status} from the admin socket ("UP", "DOWN", "UP 1/2", ...)."""
        assert self.proc.poll() is None, f"haproxy exited: {Path(self.log.name).read_text()}"
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(self.sock)
        except (FileNotFoundError, ConnectionRefusedError):  # still starting
            s.close()
            return {}
        s.sendall(b"show stat\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        s.close()
        lines = out.decode().splitlines()
        head = lines[0].lstrip("# ").split(",")
        res = {}
        for line in lines[1:]:
            f = dict(zip(head, line.split(",")))
            if f.get("pxname") == "kiln" and f.get("svname", "").startswith("r"):
                res[f["svname"]] = f["status"]
        return res

    def wait(self, name, status, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.states().get(name) == status:
                return
            time.sleep(0.05)
        raise AssertionError(f"haproxy: {name} not {status}: {self.states()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()


class Fleet:
    def __init__(self, workdir, repo):
        self.workdir, self.repo = workdir, repo
        self.redis = Redis(password=PASSWORD)
        self.ports = [free_port() for _ in range(REPLICAS)]
        self.replicas, self.old, self.lb = [], [], None
        try:
            for i in range(REPLICAS):
                self.replicas.append(self.start(i))
            self.lb = HAProxy(workdir, self.ports)
            for i in range(REPLICAS):
                self.lb.wait(f"r{i}", "UP")
        except BaseException:
            self.stop()  # nothing it started outlives a failed start
            raise

    def start(self, i):
        s = KilnServer(self.repo, "--http-port", str(self.ports[i]), "--model-control-mode", "poll",
                       "--repository-poll-secs", "1", "--redis-url",
                       f"redis://:{PASSWORD}@127.0.0.1:{self.redis.port}/0", "--cache-secret", SECRET,
                       "--shutdown-delay-secs", str(DELAY_SECS),
                       log_path=self.workdir / f"r{i}-{time.monotonic_ns()}.log")
        wait_redis(s)
        return s

    def stop(self):
        if self.lb:
            self.lb.stop()
        for s in self.replicas + self.old:
            s.stop()
        self.redis.stop()


def metric(url, name):
    _, _, body = raw_request(url, "GET", "/metrics")
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", body.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def redis_hits(s):
    return metric(s.url, 'kiln_cache_hits_total{tier="redis"}')


def wait_redis(s, timeout=30):
    """Until every I/O thread of s is connected to Redis (AUTH accepted)."""
    deadline = time.monotonic() + timeout
    while metric(s.url, "kiln_cache_redis_connected") < 2:
        assert time.monotonic() < deadline, f"not connected to Redis:\n{s.text()}"
        time.sleep(0.05)


class Bench:
    """`kiln bench` through the balancer for `secs`, in the background."""

    def __init__(self, url, out, secs):
        self.out = out
        self.proc = subprocess.Popen(
            [str(KILN), "bench", "-u", url, "-m", "fleet", "-c", str(CONCURRENCY), "-d", str(secs), "--warmup", "0",
             "--unique", "64", "--timeout-ms", "30000", "--no-progress", "--json", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.t0 = time.monotonic()

    def result(self):
        text = self.proc.communicate(timeout=300)[0].decode()
        assert self.out.exists(), text
        lv = json.loads(self.out.read_text())["levels"][0]
        return {"sent": int(lv["requests"] + lv["errors"]), "failed": int(lv["errors"]),
                "p99_ms": lv["p99_us"] / 1000, "by_status": lv.get("errors_by_status", {}), "text": text}


def post(conn, x):
    body = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.flatten().tolist()}]})
    conn.request("POST", "/v2/models/fleet/infer", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    assert r.status == 200, data
    return np.array(json.loads(data)["outputs"][0]["data"], np.float32)


def send_all(s, rows):
    import http.client
    host, port = s.url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        return [post(conn, x) for x in rows]
    finally:
        conn.close()


def cross_replica_hits(fleet, seed):
    """ROWS distinct requests computed on replica 0, then asked of 1 and 2:
    (hits on 1, hits on 2) counted by their Redis hit counters."""
    r0, others = fleet.replicas[0], fleet.replicas[1:]
    rows = [np.random.default_rng(seed + i).standard_normal((1, 4)).astype(np.float32) for i in range(ROWS)]
    stored0 = metric(r0.url, "kiln_cache_redis_stores_total")
    want = send_all(r0, rows)
    deadline = time.monotonic() + 30
    while metric(r0.url, "kiln_cache_redis_stores_total") - stored0 < ROWS:
        assert time.monotonic() < deadline, "replica 0 did not store its answers"
        time.sleep(0.05)
    hits = []
    for s in others:
        h0 = redis_hits(s)
        got = send_all(s, rows)
        for a, b in zip(want, got):
            np.testing.assert_array_equal(a, b)
        hits.append(int(redis_hits(s) - h0))
    return hits


class CpuLoad:
    """One busy process per core for the length of a with-block."""

    def __enter__(self):
        n = os.cpu_count() or 2
        self.procs = [subprocess.Popen(["python3", "-c", "while True: pass"]) for _ in range(n)]
        return self

    def __exit__(self, *a):
        for p in self.procs:
            p.kill()
            p.wait()


# ---- the run ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("fleet")
    repo = work / "repo"
    save_model(repo, "fleet", fleet_graph(1.0), config=json.dumps(CONFIG))
    f = Fleet(work, repo)
    yield f
    f.stop()
    for s in f.replicas + f.old:
        assert s.sanitizer_report() is None, s.sanitizer_report()


REPORT = {}


def record(name, res, **extra):
    REPORT[name] = {**{k: res[k] for k in ("sent", "failed", "p99_ms")}, **extra}


def test_cross_replica_hits(fleet):
    h1, h2 = cross_replica_hits(fleet, seed=1000)
    REPORT["hits"] = {"rows": ROWS, "replica 1": h1, "replica 2": h2}
    assert h1 == ROWS and h2 == ROWS, (h1, h2)


def test_baseline(fleet, tmp_path):
    res = Bench(fleet.lb.url, tmp_path / "b.json", 5).result()
    record("none", res)
    assert res["failed"] == 0, res["text"]


def test_sigkill_costs_only_in_flight(fleet, tmp_path):
    b = Bench(fleet.lb.url, tmp_path / "b.json", 8)
    time.sleep(2)
    victim = fleet.replicas[1]
    victim.proc.kill()
    t = time.monotonic()
    fleet.lb.wait("r1", "DOWN", timeout=30)
    down_s = time.monotonic() - t
    res = b.result()
    victim.stop()
    fleet.old.append(victim)
    fleet.replicas[1] = fleet.start(1)
    fleet.lb.wait("r1", "UP")
    record("SIGKILL of a replica", res, down_after_s=round(down_s, 2), failed_by_status=res["by_status"])
    # What the replica had in flight (at most one per client connection),
    # and, HAProxy keeping connections to its servers alive, one request on
    # each connection it held idle to it (its next request there fails): at
    # most twice the bench's 16 (4 to 17 seen; 3 with option
    # http-server-close). What reached it after the kill was refused and
    # retried on another replica.
    assert res["failed"] <= 2 * CONCURRENCY, res["text"]
    # Marked down after two failed checks 500 ms apart; the bound leaves room
    # for a loaded machine.
    assert down_s < 10, down_s


def test_rolling_restart_loses_nothing(fleet, tmp_path):
    b = Bench(fleet.lb.url, tmp_path / "b.json", 20)
    time.sleep(1)
    for i in range(REPLICAS):
        old = fleet.replicas[i]
        old.signal(signal.SIGTERM)
        assert old.proc.wait(timeout=60) == 0, old.text()
        fleet.old.append(old)
        fleet.replicas[i] = fleet.start(i)
        fleet.lb.wait(f"r{i}", "UP")
    done_s = time.monotonic() - b.t0
    res = b.result()
    record("rolling restart (SIGTERM, one at a time)", res, restarts=REPLICAS, finished_at_s=round(done_s, 1))
    assert res["failed"] == 0, res["text"]
    for old in fleet.old[-REPLICAS:]:
        assert "not ready; serving for" in old.text()


def test_rolling_model_update_loses_nothing(fleet, tmp_path):
    b = Bench(fleet.lb.url, tmp_path / "b.json", 8)
    time.sleep(2)
    # Written beside the model, then renamed: a poll never sees half a version.
    staging = fleet.repo / "fleet" / ".v2"
    staging.mkdir()
    tmp = fleet.workdir / "v2"
    save_model(tmp, "fleet", fleet_graph(3.0), config=json.dumps(CONFIG))
    shutil.copy(tmp / "fleet" / "1" / "model.onnx", staging / "model.onnx")
    staging.rename(fleet.repo / "fleet" / "2")
    t = time.monotonic()
    deadline = t + 30
    for s in fleet.replicas:
        while raw_request(s.url, "GET", "/v2/models/fleet/versions/2/ready")[0] != 200:
            assert time.monotonic() < deadline, s.text()
            time.sleep(0.05)
    everywhere_s = time.monotonic() - t
    res = b.result()
    record("rolling model update (poll)", res, version2_everywhere_after_s=round(everywhere_s, 2))
    assert res["failed"] == 0, res["text"]
    x = np.ones((1, 4), np.float32)
    for s in fleet.replicas:
        np.testing.assert_allclose(send_all(s, [x])[0], (x @ (np.arange(12).reshape(4, 3) / 10 * 3)).flatten(),
                                   rtol=1e-5)


def test_redis_restart_loses_nothing(fleet, tmp_path):
    b = Bench(fleet.lb.url, tmp_path / "b.json", 8)
    time.sleep(2)
    fleet.redis.kill()
    time.sleep(1)
    fleet.redis.start()
    back = time.monotonic()
    # Caching is back when an answer computed on one replica is a Redis hit
    # on another: a fresh request each try, so no LRU holds it.
    import http.client
    k = 0
    while True:
        k += 1
        x = np.full((1, 4), 1e6 + k, np.float32)
        send_all(fleet.replicas[0], [x])
        time.sleep(0.02)
        h0 = redis_hits(fleet.replicas[2])
        send_all(fleet.replicas[2], [x])
        if redis_hits(fleet.replicas[2]) > h0:
            break
        assert time.monotonic() - back < 30, "caching did not resume"
    resumed_s = time.monotonic() - back
    res = b.result()
    record("Redis restart", res, caching_resumed_after_s=round(resumed_s, 2))
    assert res["failed"] == 0, res["text"]
    # Within 2 s on an idle machine; the bound here leaves room for a loaded one.
    assert resumed_s < 10, resumed_s


def test_cross_replica_hits_under_cpu_load(fleet):
    with CpuLoad():
        h1, h2 = cross_replica_hits(fleet, seed=5000)
    REPORT["hits under CPU load"] = {"rows": ROWS, "replica 1": h1, "replica 2": h2}
    timeouts = sum(metric(s.url, "kiln_cache_redis_timeouts_total") for s in fleet.replicas)
    REPORT["hits under CPU load"]["redis timeouts (fleet)"] = int(timeouts)
    assert min(h1, h2) >= 0.95 * ROWS, (h1, h2)


def test_report():
    """Prints the report and writes it (last in this file)."""
    lines = ["# kiln fleet report", "",
             f"{REPLICAS} replicas, HAProxy (check {CHECK}, retries 3, redispatch), one Redis with a password, "
             f"`kiln bench -c {CONCURRENCY}`; --shutdown-delay-secs {DELAY_SECS}.", "",
             "| fault | sent | failed | p99 ms | other |", "|---|---|---|---|---|"]
    for name, r in REPORT.items():
        if "sent" in r:
            other = ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("sent", "failed", "p99_ms"))
            lines.append(f"| {name} | {r['sent']} | {r['failed']} | {r['p99_ms']:.1f} | {other} |")
    lines.append("")
    for name, r in REPORT.items():
        if "rows" in r:
            extra = "".join(f", {k} {v}" for k, v in r.items() if k not in ("rows", "replica 1", "replica 2"))
            lines.append(f"- cross-replica hits{name[4:]}: {r['replica 1']}/{r['rows']} on replica 1, "
                         f"{r['replica 2']}/{r['rows']} on replica 2{extra}")
    text = "\n".join(lines) + "\n"
    out = Path(os.environ.get("KILN_FLEET_REPORT", ROOT / "build" / "fleet-report.md"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print("\n" + text)
