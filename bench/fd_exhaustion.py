#!/usr/bin/env python3
"""kiln at its open file limit: twice the limit of connections held open.

Starts kiln with `ulimit -n LIMIT` (soft = hard, so kiln cannot raise it),
opens 2 x LIMIT connections and holds every one that stays open, then
measures over --seconds: kiln's CPU (user + system, from /proc) and how fast
its log grows. Then, ROUNDS times, it closes one admitted connection and
times a normal request (GET /v2/health/ready on a new connection, and an
inference on digits) from the close to the answer.

Two modes: the default --max-connections (derived from the limit, so extra
connections are shed with a 503) and --max-connections above the limit (so
accept() itself runs out of descriptors: the spare-descriptor 503 and the
accept pause). Prints a markdown table; exits non-zero if kiln died.
"""
import argparse
import json
import os
import resource
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


DIGIT = [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0, 0, 8, 8, 0,
         0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0, 0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0]


def request(port, method, path, body=b"", timeout=5.0):
    """One request on a new connection; returns the status (or None on a refused/reset connection)."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except OSError:
        return None
    try:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                  f"Connection: close\r\n\r\n".encode() + body)
        data = b""
        while b"\r\n" not in data:
            b = s.recv(4096)
            if not b:
                break
            data += b
        return int(data.split(b" ")[1]) if data.startswith(b"HTTP/1.1 ") else None
    except OSError:
        return None
    finally:
        s.close()


def served_after_close(port, admitted, body):
    """Closes one admitted connection, then retries a request until it is answered 200: seconds taken."""
    c = admitted.pop()
    t0 = time.monotonic()
    c.close()
    while time.monotonic() - t0 < 10:
        path, data = ("/v2/models/digits/infer", body) if body else ("/v2/health/ready", b"")
        if request(port, "POST" if body else "GET", path, data) == 200:
            return time.monotonic() - t0
        time.sleep(0.002)
    return float("inf")


def run(kiln, repo, limit, max_conns, seconds, rounds):
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="kiln-fds-", suffix=".log", delete=False)
    args = [kiln, "serve", "--model-repository", repo, "--http-address", "127.0.0.1", "--http-port", str(port),
            "--http-threads", "2"]
    if max_conns:
        args += ["--max-connections", str(max_conns)]

    def lower():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=lower)
    try:
        deadline = time.monotonic() + 60
        while request(port, "GET", "/v2/health/ready") != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("kiln did not become ready: " + open(log.name).read()[-2000:])
            time.sleep(0.1)
        # Our own descriptors must not be the limit.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * limit + 256)), hard))
        held = []
        for _ in range(2 * limit):
            try:
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                held.append(s)
            except OSError:
                break
        time.sleep(2)
        # Connections kiln shed (a 503 and a close) are readable; admitted idle ones are not.
        admitted = []
        for s in held:
            pl = select.poll()
            pl.register(s, select.POLLIN | select.POLLHUP | select.POLLERR)
            if pl.poll(0):
                s.close()
            else:
                admitted.append(s)
        cpu0, log0, t0 = cpu_seconds(proc.pid), os.path.getsize(log.name), time.monotonic()
        time.sleep(seconds)
        cpu1, log1, t1 = cpu_seconds(proc.pid), os.path.getsize(log.name), time.monotonic()
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGIT}]}).encode()
        lat = [served_after_close(port, admitted, body if i % 2 else b"") for i in range(rounds) if admitted]
        alive = proc.poll() is None
        for s in admitted:
            s.close()
        return {
            "attempts": len(held), "open": len(admitted) + len(lat),
            "cpu": (cpu1 - cpu0) / (t1 - t0), "log": (log1 - log0) / (t1 - t0),
            "p50": statistics.median(lat) if lat else float("nan"), "max": max(lat) if lat else float("nan"),
            "alive": alive,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.unlink(log.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--repo", default="model_repository")
    ap.add_argument("--limit", type=int, default=1024, help="open file limit kiln runs under (default 1024)")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    modes = [("default --max-connections", None), (f"--max-connections {4 * a.limit} (above the limit, held below it)", 4 * a.limit)]
    print(f"Open file limit {a.limit}, {2 * a.limit} connections held open; CPU and log growth over {a.seconds:g} s; "
          f"{a.rounds} times: one admitted connection closed, then a new request (health and digits inference "
          f"alternating) timed from the close to its 200.\n")
    print("| mode | connections kept open by kiln | kiln CPU (% of a core) | log growth (bytes/s) | "
          "close to 200, median (ms) | worst (ms) |")
    print("|---|---|---|---|---|---|")
    ok = True
    for name, mc in modes:
        r = run(a.kiln, a.repo, a.limit, mc, a.seconds, a.rounds)
        ok &= r["alive"]
        print(f"| {name} | {r['open']} of {r['attempts']} | {100 * r['cpu']:.1f} | {r['log']:.0f} | "
              f"{1000 * r['p50']:.1f} | {1000 * r['max']:.1f} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
