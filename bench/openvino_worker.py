#!/usr/bin/env python3
"""OpenVINO as a peer in the engine benchmarks: one model compiled for the
CPU, timed on request. Runs under .venv-bench's Python (requirements-bench.txt
pins openvino), apart from the project's .venv, and is driven over stdin by
bench/modelset.py so that its rounds alternate with kiln's and
onnxruntime's.

    .venv-bench/bin/python bench/openvino_worker.py MODEL THREADS INPUTS_DIR NAME,NAME...

Compiles MODEL with the FP32 precision hint (OpenVINO's default on a CPU
with BF16 support is BF16, slower and less exact there), the latency hint
and THREADS inference threads, its inputs reshaped to the saved inputs'
shapes (static shapes, as a latency deployment compiles them). Then answers
one line per command:
    time N        -> "p50 MS" over N calls after 3 warm-up calls
    outputs DIR   -> "ok": one call's outputs saved as DIR/<name>.npy and DIR/#<i>.npy
A failure answers "error: TEXT" (at start, too) and the worker goes on.
"""
import os
import statistics
import sys
import time

import numpy as np


def main():
    model, threads, inputs_dir, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
    try:
        import openvino as ov
        feeds = {n: np.load(os.path.join(inputs_dir, f"{n}.npy")) for n in names}
        core = ov.Core()
        m = core.read_model(model)
        m.reshape({i.get_any_name(): ov.PartialShape(list(feeds[i.get_any_name()].shape)) for i in m.inputs})
        cfg = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
               "INFERENCE_NUM_THREADS": threads}
        req = core.compile_model(m, "CPU", cfg).create_infer_request()
        req.infer(feeds)
        print("ready", flush=True)
    except Exception as e:  # noqa: BLE001 - reported to the driver, which marks the row
        print(f"error: {type(e).__name__}: {e}".replace("\n", " "), flush=True)
        return
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        try:
            if cmd == "time":
                for _ in range(3):
                    req.infer(feeds)
                t = []
                for _ in range(int(arg)):
                    a = time.perf_counter()
                    req.infer(feeds)
                    t.append(time.perf_counter() - a)
                print(f"p50 {statistics.median(t) * 1e3:.6f}", flush=True)
            elif cmd == "outputs":
                res = req.infer(feeds)
                # By name, and by position where OpenVINO renamed an output.
                for i, (port, value) in enumerate(res.items()):
                    np.save(os.path.join(arg, port.get_any_name().replace("/", "_") + ".npy"), np.asarray(value))
                    np.save(os.path.join(arg, f"#{i}.npy"), np.asarray(value))
                print("ok", flush=True)
            else:
                print(f"error: unknown command {cmd!r}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"error: {type(e).__name__}: {e}".replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()
