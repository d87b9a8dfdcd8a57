#!/usr/bin/env python3
"""kiln CPU vs onnxruntime CPU: median latency per model and batch size.

Runs each (model, batch) in alternating rounds -- kiln (`kiln run --iterations`)
then onnxruntime in this process, with the same intra-op thread count -- and
reports the median over rounds of each side's p50, and the ratio kiln/ORT
(the target is <= 1.25). On a shared machine wall time follows
the neighbours' load, so --cpu-time adds each side's CPU seconds per
inference (kiln: the difference between runs of N and 2N iterations, which
cancels loading and planning; onnxruntime: process CPU time around N calls),
a figure that contention barely moves when both run one thread.

    .venv/bin/python bench/engine_vs_ort.py [--kiln build/kiln] [--threads 1]
        [--iterations 30] [--rounds 3] [--batches 1,8] [--models resnet50,mlp]

Models: a path to an .onnx file runs that file (the INT8 models of
docs/benchmarks-int8.md); `resnet50` is ONNX's light ResNet-50 with its batch dim made symbolic
(the work is the same as the fixed-batch file); `mlp` is the digits MLP in
model_repository/. Timing covers one inference call: kiln's own p50 from
`kiln run`, and onnxruntime's InferenceSession.run() from Python, whose call
overhead (a few microseconds) matters only for the MLP.
"""
import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def symbolic_batch_resnet(dst):
    """light_resnet50 with input/output batch 'N' and its Reshape made batch-free."""
    m = onnx.load(os.path.join(LIGHT, "light_resnet50.onnx"))
    for vi in list(m.graph.input[:1]) + list(m.graph.output):
        vi.type.tensor_type.shape.dim[0].ClearField("dim_value")
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    reshape_shapes = {n.input[1] for n in m.graph.node if n.op_type == "Reshape"}
    for init in m.graph.initializer:
        if init.name in reshape_shapes:
            v = onnx.numpy_helper.to_array(init).copy()
            v[0] = -1
            init.CopyFrom(onnx.numpy_helper.from_array(v.astype(np.int64), init.name))
    # The file also lists initializers as graph inputs; keep them consistent.
    path = os.path.join(dst, "resnet50_symbolic.onnx")
    onnx.save(m, path)
    return path


def kiln_p50(kiln, model, batch, threads, iterations, inputs=()):
    args = [kiln, "run", model, "--batch", str(batch), "--iterations", str(iterations), "--threads", str(threads),
            "--backend", "cpu", "--quiet"]
    for name, path in inputs:
        args += ["--input", f"{name}={path}"]
    out = subprocess.run(args, capture_output=True, text=True)
    text = out.stdout + out.stderr
    m = re.search(r"p50\s+([0-9.]+)\s*ms", text)
    if out.returncode != 0 or not m:
        sys.exit(f"kiln run failed ({out.returncode}):\n{text}")
    return float(m.group(1))


def kiln_cpu_ms(kiln, model, batch, threads, iterations):
    """CPU milliseconds per inference: runs of N and 2N iterations, differenced."""
    cost = []
    for n in (iterations, 2 * iterations):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([kiln, "run", model, "--batch", str(batch), "--iterations", str(n),
                        "--threads", str(threads), "--quiet"], capture_output=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cost.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return (cost[1] - cost[0]) / iterations * 1e3


def ort_cpu_ms(sess, feeds, iterations):
    sess.run(None, feeds)
    a = time.process_time()
    for _ in range(iterations):
        sess.run(None, feeds)
    return (time.process_time() - a) / iterations * 1e3


def ort_p50(sess, feeds, iterations):
    for _ in range(3):
        sess.run(None, feeds)
    t = []
    for _ in range(iterations):
        a = time.perf_counter()
        sess.run(None, feeds)
        t.append(time.perf_counter() - a)
    return statistics.median(t) * 1e3


def ort_session(model, batch, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    rng = np.random.RandomState(0)
    feeds = {}
    inits = {t.name for t in onnx.load(model, load_external_data=False).graph.initializer}
    for i in sess.get_inputs():
        if i.name in inits:
            continue
        shape = [batch if k == 0 and not isinstance(d, int) else (d if isinstance(d, int) else 1)
                 for k, d in enumerate(i.shape)]
        feeds[i.name] = rng.rand(*shape).astype(np.float32)
    return sess, feeds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--models", default="resnet50,mlp")
    ap.add_argument("--cpu-time", action="store_true", help="also report CPU ms per inference")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        models = {}
        for name in a.models.split(","):
            if name == "resnet50":
                models[name] = symbolic_batch_resnet(tmp)
            elif name.endswith(".onnx"):
                models[os.path.basename(name)[:-5]] = os.path.abspath(name)
            elif name == "mlp":
                models[name] = os.path.join(ROOT, "model_repository", "digits", "1", "model.onnx")
            else:
                sys.exit(f"unknown model {name!r} (resnet50, mlp)")
        print(f"threads={a.threads} iterations={a.iterations} rounds={a.rounds} cpu_count={os.cpu_count()}")
        cols = "| model | batch | kiln p50 (ms) | onnxruntime p50 (ms) | kiln / ORT |"
        if a.cpu_time:
            cols += " kiln CPU ms/inf | ORT CPU ms/inf | CPU kiln / ORT |"
        print(cols)
        print("|---" * (cols.count("|") - 1) + "|")
        worst = 0.0
        for name, path in models.items():
            for b in batches:
                iters = a.iterations * 100 if name == "mlp" else a.iterations
                sess, feeds = ort_session(path, b, a.threads)
                inputs = []  # the same inputs on both sides
                for i, (k, v) in enumerate(feeds.items()):  # input names may hold '/': files by index
                    inputs.append((k, os.path.join(tmp, f"input{i}.npy")))
                    np.save(inputs[-1][1], v)
                ks, os_ = [], []
                for _ in range(a.rounds):
                    ks.append(kiln_p50(a.kiln, path, b, a.threads, iters, inputs))
                    os_.append(ort_p50(sess, feeds, iters))
                k, o = statistics.median(ks), statistics.median(os_)
                worst = max(worst, k / o)
                line = f"| {name} | {b} | {k:.3f} | {o:.3f} | {k / o:.2f} |"
                if a.cpu_time:
                    kc = statistics.median(kiln_cpu_ms(a.kiln, path, b, a.threads, iters) for _ in range(a.rounds))
                    oc = statistics.median(ort_cpu_ms(sess, feeds, iters) for _ in range(a.rounds))
                    line += f" {kc:.3f} | {oc:.3f} | {kc / oc:.2f} |"
                print(line, flush=True)
        print(f"worst ratio {worst:.2f} (target <= 1.25)")


if __name__ == "__main__":
    main()
