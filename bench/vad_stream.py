"""vad_stream.py - silero-vad streamed as concurrent sequences: kiln's
sequence batcher with implicit state, against the same frames sent with
explicit state as plain requests, and against onnxruntime in a loop.

The detector is the ONNX file PyPI's silero-vad wheel ships (installed with
--no-deps: requirements-dev.txt), run as its own OnnxWrapper runs it: frames
of 512 samples at 16 kHz, each with the previous frame's last 64 samples
before it, the LSTM state fed back, `sr` a scalar input.

  implicit  model `vad`: sequence_batching keeps `state` on the server; a
            request carries the frame and `sr` (sequence_id per stream)
  explicit  model `vad_explicit`: no sequence; a request carries the frame,
            `sr` and the state, and the answer brings the new state back
  ort       onnxruntime, one session, the streams' frames in turn

kiln is driven over one gRPC stream (tritonclient.grpc start_stream) with
STREAMS sequences at once, one frame of each in flight (a stream's next frame
goes when its answer is back, as the explicit mode must), FRAMES frames per
stream. Both kiln models have one instance of one thread; onnxruntime one
thread. Rounds alternate the modes; the median round of each is reported,
with the plan builds per frame after warm-up from kiln's kiln_plan_builds.

Also the module the e2e tests share (tests/e2e/test_sequence_vad.py): the
model's path, the repository, the test audio and the frame windows.

Usage: vad_stream.py --kiln build/kiln [--streams 64] [--frames 40] [--rounds 3]
       [--csv out.csv] > section.md
"""
import argparse
import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

SR = 16000
FRAME = 512        # samples per frame at 16 kHz (silero's own step)
CONTEXT = 64       # samples of the previous frame prepended to each (silero's OnnxWrapper)


def silero_onnx():
    """The wheel's silero_vad.onnx, or None when silero-vad is not installed."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "silero_vad.onnx"


def vad_config(implicit=True, instances=2, threads=1):
    """No batch dim (silero's state has its batch axis in the middle): every
    frame runs alone, sequences in parallel on the instances."""
    cfg = {"input": [{"name": "input", "data_type": "TYPE_FP32", "dims": [1, FRAME + CONTEXT]},
                     {"name": "sr", "data_type": "TYPE_INT64", "dims": []}],
           "output": [{"name": "output", "data_type": "TYPE_FP32", "dims": [1, 1]}],
           "instance_group": [{"count": instances, "kind": "KIND_CPU"}],
           "parameters": {"intra_op_thread_count": {"string_value": str(threads)}}}
    if implicit:
        # oldest: up to 256 live sequences (direct would give each instance
        # one slot, as the model does not batch: the streams would take turns).
        cfg["sequence_batching"] = {
            "max_sequence_idle_microseconds": 60000000,
            "oldest": {"max_candidate_sequences": 256},
            "state": [{"input_name": "state", "output_name": "stateN", "data_type": "TYPE_FP32", "dims": [2, 1, 128]}]}
    else:
        cfg["input"].append({"name": "state", "data_type": "TYPE_FP32", "dims": [2, 1, 128]})
        cfg["output"].append({"name": "stateN", "data_type": "TYPE_FP32", "dims": [2, 1, 128]})
    return cfg


def make_vad_repo(root, src, instances=2):
    """vad (implicit state) and vad_explicit (state sent with each request)."""
    for name, implicit in (("vad", True), ("vad_explicit", False)):
        d = Path(root) / name / "1"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, d / "model.onnx")
        (Path(root) / name / "config.json").write_text(json.dumps(vad_config(implicit, instances)))
    return root


def audio(seed, frames):
    """Deterministic test audio that silero hears as speech in places: a
    voiced sound (harmonics of a gliding pitch shaped by three formants) in
    syllables, and pauses of faint noise."""
    rng = np.random.default_rng(seed)
    n = frames * FRAME
    t = np.arange(n) / SR
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.9 * t + seed)
    phase = 2 * np.pi * np.cumsum(f0) / SR
    x = np.zeros(n)
    for h in range(1, 30):
        fh = h * f0
        amp = (np.exp(-((fh - 700) / 300) ** 2) + 0.6 * np.exp(-((fh - 1200) / 400) ** 2)
               + 0.3 * np.exp(-((fh - 2500) / 500) ** 2))
        x += amp * np.sin(h * phase) / h ** 0.3
    syllables = (np.sin(2 * np.pi * 3.5 * t) > 0) * (np.sin(2 * np.pi * 0.4 * t + seed) > -0.2)
    return (0.2 * x * syllables + 0.003 * rng.standard_normal(n)).astype(np.float32)


def windows(x):
    """The model's inputs: each frame with the previous frame's last 64 samples before it."""
    ctx = np.zeros(CONTEXT, np.float32)
    out = []
    for k in range(len(x) // FRAME):
        f = x[k * FRAME:(k + 1) * FRAME]
        out.append(np.concatenate([ctx, f])[None, :])
        ctx = f[-CONTEXT:]
    return out


def ort_session(path, threads=1):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ort_probs(session, frames):
    """One stream through onnxruntime, the state fed back: its probabilities."""
    state = np.zeros((2, 1, 128), np.float32)
    probs = []
    for w in frames:
        out, state = session.run(None, {"input": w, "state": state, "sr": np.array(SR, np.int64)})
        probs.append(float(out.ravel()[0]))
    return probs


# ---- the benchmark ------------------------------------------------------------

def plan_builds(url, model):
    m = urllib.request.urlopen(f"http://{url}/metrics", timeout=30).read().decode()
    for ln in m.splitlines():
        if ln.startswith(f'kiln_plan_builds{{model="{model}"'):
            return int(float(ln.split()[-1]))
    raise RuntimeError(f"no kiln_plan_builds for {model}")


def stream_kiln(grpc_url, model, streams, seq_base):
    """Every stream's frames over one gRPC stream, one frame of each stream
    in flight; returns (seconds, frames)."""
    import tritonclient.grpc as grpcclient
    c = grpcclient.InferenceServerClient(grpc_url)
    answers = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    implicit = model == "vad"
    sr = grpcclient.InferInput("sr", [], "INT64")
    sr.set_data_from_numpy(np.array(SR, np.int64))
    state = {s: np.zeros((2, 1, 128), np.float32) for s in range(len(streams))}
    nframes = len(streams[0])

    def send(s, k):
        x = grpcclient.InferInput("input", [1, FRAME + CONTEXT], "FP32")
        x.set_data_from_numpy(streams[s][k])
        ins = [x, sr]
        if implicit:
            c.async_stream_infer(model, ins, request_id=f"{s}:{k}", sequence_id=seq_base + s,
                                 sequence_start=k == 0, sequence_end=k == nframes - 1)
        else:
            st = grpcclient.InferInput("state", [2, 1, 128], "FP32")
            st.set_data_from_numpy(state[s])
            c.async_stream_infer(model, ins + [st], request_id=f"{s}:{k}")

    t0 = time.perf_counter()
    for s in range(len(streams)):
        send(s, 0)
    left = len(streams) * nframes
    while left:
        result, error = answers.get(timeout=300)
        if error is not None:
            raise RuntimeError(str(error))
        left -= 1
        s, k = map(int, result.get_response().id.split(":"))
        if not implicit:
            state[s] = result.as_numpy("stateN")
        if k + 1 < nframes:
            send(s, k + 1)
    dt = time.perf_counter() - t0
    c.stop_stream()
    c.close()
    return dt, len(streams) * nframes


def _client(args):
    grpc_url, model, streams, seq_base = args
    return stream_kiln(grpc_url, model, streams, seq_base)


def stream_kiln_clients(pool, clients, grpc_url, model, streams, seq_base):
    """The streams split among `clients` processes, each with its own gRPC
    stream (one Python client tops out below what the server serves);
    returns (seconds of the slowest, frames)."""
    parts = [streams[i::clients] for i in range(clients)]
    res = pool.map(_client, [(grpc_url, model, p, seq_base + 100000 * i) for i, p in enumerate(parts) if p])
    return max(r[0] for r in res), sum(r[1] for r in res)


def server_ms_per_frame(url, model):
    """kiln's own time in the model per frame so far (compute_infer over its count), ms."""
    st = json.loads(urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=30).read())
    ci = st["model_stats"][0]["inference_stats"]["compute_infer"]
    return (ci["ns"] / ci["count"] / 1e6) if ci["count"] else 0.0


def stream_ort(session, streams):
    states = [np.zeros((2, 1, 128), np.float32) for _ in streams]
    sr = np.array(SR, np.int64)
    t0 = time.perf_counter()
    for k in range(len(streams[0])):
        for s, frames in enumerate(streams):
            _, states[s] = session.run(None, {"input": frames[k], "state": states[s], "sr": sr})
    return time.perf_counter() - t0, len(streams) * len(streams[0])


def start_kiln(kiln, repo, log):
    env = dict(os.environ, KILN_GRPC_PORT="0")
    p = subprocess.Popen([kiln, "serve", "--model-repository", str(repo), "--http-address", "127.0.0.1",
                          "--http-port", "0", "--http-threads", "1", "--cache-size", "0"],
                         stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    http = grpc = None
    while time.monotonic() < deadline and not (http and grpc):
        text = Path(log).read_text()
        m = re.search(r"listening on http://([^\s]+)", text)
        g = re.search(r"listening on grpc://([^\s]+)", text)
        http, grpc = (m.group(1) if m else None), (g.group(1) if g else None)
        if p.poll() is not None:
            raise RuntimeError(f"kiln exited:\n{text}")
        time.sleep(0.05)
    if not (http and grpc):
        p.kill()
        raise RuntimeError(f"kiln did not start:\n{Path(log).read_text()}")
    return p, http.rstrip("/"), grpc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--csv")
    a = ap.parse_args()
    src = silero_onnx()
    if src is None or not src.exists():
        sys.exit("vad_stream.py: silero-vad is not installed (tools/bootstrap.sh installs it, --no-deps)")
    streams = [windows(audio(100 + s, a.frames)) for s in range(a.streams)]
    work = Path(tempfile.mkdtemp(prefix="vad_bench_"))
    # One instance of one thread each, as onnxruntime's one thread.
    repo = make_vad_repo(work / "repo", src, instances=1)
    proc, http, grpc = start_kiln(a.kiln, repo, work / "kiln.log")
    session = ort_session(src)
    rates = {"implicit": [], "explicit": [], "ort": []}
    builds = {"implicit": [], "explicit": []}
    ms = {}
    import multiprocessing
    pool = multiprocessing.get_context("spawn").Pool(a.clients)
    try:
        # Warm-up: a few frames of a few streams through each, plans built.
        stream_kiln(grpc, "vad", [s[:3] for s in streams[:4]], 10 ** 9)
        stream_kiln(grpc, "vad_explicit", [s[:3] for s in streams[:4]], 0)
        stream_ort(session, [s[:3] for s in streams[:4]])
        order = ["implicit", "explicit", "ort"]
        for r in range(a.rounds):
            for mode in order[r % 3:] + order[:r % 3]:
                if mode == "ort":
                    dt, n = stream_ort(session, streams)
                else:
                    model = "vad" if mode == "implicit" else "vad_explicit"
                    b0 = plan_builds(http, model)
                    dt, n = stream_kiln_clients(pool, a.clients, grpc, model, streams, 1000000 * (r + 1))
                    builds[mode].append((plan_builds(http, model) - b0) / n)
                rates[mode].append(n / dt)
        for mode, model in (("implicit", "vad"), ("explicit", "vad_explicit")):
            ms[mode] = server_ms_per_frame(http, model)
        t0 = time.perf_counter()
        n = stream_ort(session, streams)[1]
        ms["ort"] = (time.perf_counter() - t0) / n * 1e3
    finally:
        pool.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    med = {m: statistics.median(v) for m, v in rates.items()}
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("mode,frames_per_s,model_ms_per_frame,plan_builds_per_frame\n")
            for m in ("implicit", "explicit", "ort"):
                f.write(f"{m},{med[m]:.1f},{ms[m]:.4f},{max(builds[m]) if m in builds else ''}\n")
    print(f"silero-vad (PyPI silero-vad 6.2.3, silero_vad.onnx), {a.streams} streams at once x {a.frames} frames "
          f"of 512 samples, one frame of each stream in flight, over gRPC streams from {a.clients} client "
          f"processes (tritonclient.grpc start_stream); kiln: one instance of one thread per model; onnxruntime: "
          f"one session, one thread, no server. Median of {a.rounds} alternating rounds. The clients share the "
          f"machine's cores with the server: frames/s through kiln is bounded by them, and the model time per "
          f"frame (kiln's compute_infer statistics; onnxruntime's loop) is the engines' own cost.")
    print()
    print("| mode | frames/s | vs onnxruntime | model time per frame (ms) | plan builds per frame after warm-up |")
    print("|---|---|---|---|---|")
    names = {"implicit": "kiln, implicit state (sequence_batching)", "explicit": "kiln, explicit state (plain requests)",
             "ort": "onnxruntime in a loop (no server)"}
    for m in ("implicit", "explicit", "ort"):
        b = f"{max(builds[m]):.3f}" if m in builds else "-"
        print(f"| {names[m]} | {med[m]:.0f} | {med[m] / med['ort']:.2f} | {ms[m]:.3f} | {b} |")
    print()
    print(f"- Implicit / explicit state: **{med['implicit'] / med['explicit']:.2f}x** the frames per second "
          f"(the state, 1 KiB each way, stays on the server).")
    worst = max(max(v) for v in builds.values())
    print(f"- Plan builds per frame after warm-up: **{worst:.3f}** (target 0: "
          f"**{'met' if worst == 0 else 'NOT met'}**).")


if __name__ == "__main__":
    main()
