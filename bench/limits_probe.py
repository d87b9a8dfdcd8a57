#!/usr/bin/env python3
"""What one client can make kiln hold: peak RSS under the memory probes of a
hostile client, and the latency of a second client while the worst-case
classification runs.

Each probe starts a fresh kiln (so VmHWM, the process's peak resident size,
is the probe's own), with the server's defaults unless --max-request-memory
is given, sends the probe, and reads VmHWM and VmRSS from /proc:
  grow-binary   ConstantOfShape([2^28]) answered as binary (1 GiB of FP32)
  grow-json     the same answered as JSON
  ignored-nums  60 MB of numbers under a key the reader ignores
  empty-objs    20M `{}` under an ignored key
  grpc-unfinished  6 connections x 4 calls, each announcing a 60 MiB message
                and sending it without END_STREAM (--grpc-max-message-size 64M)
  topk          classification k = n = 1e6 on one client while a second sends
                small requests to another model: the second client's p50 / p99 / max
Prints a markdown table; exits non-zero if kiln died.
"""
import argparse
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto as TP

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))
import h2frames  # noqa: E402 (raw HTTP/2 frames, shared with the gRPC tests)

MiB = 1 << 20


def save(root, name, nodes, inputs, outputs, inits=()):
    d = Path(root) / name / "1"
    d.mkdir(parents=True)
    m = oh.make_model(oh.make_graph(nodes, name, inputs, outputs, list(inits)),
                      opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(d / "model.onnx"))


def make_repo(root):
    save(root, "grow", [oh.make_node("ConstantOfShape", ["n"], ["y"], name="grow",
                                     value=oh.make_tensor("v", TP.FLOAT, [1], [1.25]))],
         [oh.make_tensor_value_info("n", TP.INT64, [1])], [oh.make_tensor_value_info("y", TP.FLOAT, ["M"])])
    for name in ("ident", "other"):
        save(root, name, [oh.make_node("Identity", ["x"], ["y"])],
             [oh.make_tensor_value_info("x", TP.FLOAT, [1, "N"])], [oh.make_tensor_value_info("y", TP.FLOAT, [1, "N"])])


class Server:
    def __init__(self, kiln, repo, args):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen([kiln, "serve", "--model-repository", str(repo), "--http-address", "127.0.0.1",
                                      "--http-port", "0", "--grpc-port", "0", "--http-threads", "2", *args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = Path(self.log.name).read_text()
            m, g = re.search(r"listening on http://[^:]+:(\d+)", text), re.search(r"listening on grpc://[^:\s]+:(\d+)", text)
            if m and g:
                self.port, self.grpc = int(m.group(1)), f"127.0.0.1:{g.group(1)}"
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("kiln did not start:\n" + Path(self.log.name).read_text())

    def mem(self):
        out = {}
        for line in open(f"/proc/{self.proc.pid}/status"):
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS"):
                out[k] = int(v.split()[0]) * 1024
        return out

    def post(self, path, body, timeout=120):
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.read()
        except OSError as e:  # a timeout counts as the probe's answer
            return 0, str(e).encode()
        finally:
            c.close()

    def stop(self):
        alive = self.proc.poll() is None
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.unlink(self.log.name)
        return alive


def grow(binary):
    def probe(s):
        body = json.dumps({"inputs": [{"name": "n", "shape": [1], "datatype": "INT64", "data": [1 << 28]}],
                           "outputs": [{"name": "y", "parameters": {"binary_data": binary}}]}).encode()
        st, data = s.post("/v2/models/grow/infer", body, timeout=60)
        return st, data
    return probe


def ident_tail():
    return b'"inputs":[{"name":"x","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}'


def ignored_numbers(s):
    return s.post("/v2/models/ident/infer", b'{"ignored":[' + b"1," * (30 * MiB - 1) + b"1]," + ident_tail())


def empty_objects(s):
    return s.post("/v2/models/ident/infer", b'{"junk":[' + b",".join([b"{}"] * 20000000) + b"]," + ident_tail())


def grpc_unfinished(s):
    method = "/inference.GRPCInferenceService/ModelInfer"
    conns = [h2frames.Conn(s.grpc, timeout=30) for _ in range(6)]
    for c in conns:
        for sid in (1, 3, 5, 7):
            c.send(h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, sid,
                                  h2frames.header_block(h2frames.grpc_headers(method))))
            data = b"\x00" + struct.pack(">I", 60 * MiB) + b"\x0a" * (60 * MiB - 5)
            try:
                for at in range(0, len(data), 16384):
                    c.send(h2frames.frame(h2frames.DATA, 0, sid, data[at:at + 16384]))
            except OSError:
                break  # kiln cut the call or the connection: what it holds is what counts
    peak = s.mem()
    for c in conns:
        c.close()
    time.sleep(3)
    return 200, json.dumps({"after_close_rss": s.mem()["VmRSS"], "during_rss": peak["VmRSS"]}).encode()


def topk(s, n=1000000):
    import tritonclient.http as httpclient
    x = np.random.default_rng(7).permutation(n).astype(np.float32).reshape(1, n)
    done = {}

    def big():
        c = httpclient.InferenceServerClient(f"127.0.0.1:{s.port}", network_timeout=300)
        i = httpclient.InferInput("x", [1, n], "FP32")
        i.set_data_from_numpy(x, binary_data=True)
        t0 = time.monotonic()
        c.infer("ident", [i], outputs=[httpclient.InferRequestedOutput("y", class_count=n)])
        done["s"] = time.monotonic() - t0
        c.close()

    t = threading.Thread(target=big)
    t.start()
    small = httpclient.InferenceServerClient(f"127.0.0.1:{s.port}")
    xi = httpclient.InferInput("x", [1, 4], "FP32")
    xi.set_data_from_numpy(np.ones((1, 4), np.float32))
    times = []
    while len(times) < 200 or t.is_alive():
        t0 = time.monotonic()
        small.infer("other", [xi])
        times.append(time.monotonic() - t0)
    t.join()
    small.close()
    times.sort()
    pick = lambda q: times[int(q * (len(times) - 1))] * 1000
    return done["s"], len(times), pick(0.5), pick(0.99), times[-1] * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=os.environ.get("KILN", "build/kiln"))
    ap.add_argument("--max-request-memory", action="append", default=[],
                    help="a bound to run the request probes under, or 'default' for the server's own (repeatable; default: default)")
    a = ap.parse_args()
    bounds = [None if b == "default" else b for b in a.max_request_memory or ["default"]]
    dead = False
    with tempfile.TemporaryDirectory() as tmp:
        make_repo(tmp)
        print("| probe | --max-request-memory | answer | RSS at start | peak RSS (VmHWM) | RSS after |")
        print("|---|---|---|---|---|---|")
        probes = [("ConstantOfShape [2^28], binary answer", grow(True)), ("ConstantOfShape [2^28], JSON answer", grow(False)),
                  ("60 MB of numbers under an ignored key", ignored_numbers), ("20M `{}` under an ignored key", empty_objects)]
        for bound in bounds:
            for name, probe in probes:
                s = Server(a.kiln, tmp, ["--max-request-memory", bound] if bound else [])
                start = s.mem()["VmRSS"]
                st, data = probe(s)
                time.sleep(1)  # the answer's blocks are freed once libevent has written them
                m = s.mem()
                dead |= not s.stop()
                print(f"| {name} | {bound or 'default'} | {st or 'no answer: ' + data.decode()[:40]} | "
                      f"{start / MiB:.0f} MiB | {m['VmHWM'] / MiB:.0f} MiB | {m['VmRSS'] / MiB:.0f} MiB |")
        s = Server(a.kiln, tmp, ["--grpc-max-message-size", "64M"])
        start = s.mem()["VmRSS"]
        _, data = grpc_unfinished(s)
        m, d = s.mem(), json.loads(data)
        dead |= not s.stop()
        print(f"| gRPC: 6 connections x 4 unfinished 60 MiB messages | default (--grpc-max-message-size 64M) | "
              f"cut | {start / MiB:.0f} MiB | {m['VmHWM'] / MiB:.0f} MiB | {d['after_close_rss'] / MiB:.0f} MiB 3 s after the clients closed |")
        s = Server(a.kiln, tmp, [])
        secs, count, p50, p99, mx = topk(s)
        dead |= not s.stop()
        print()
        print(f"Classification k = n = 1e6 on one client: answered in {secs:.2f} s. A second client meanwhile: "
              f"{count} requests, p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {mx:.1f} ms.")
    return 1 if dead else 0


if __name__ == "__main__":
    sys.exit(main())
