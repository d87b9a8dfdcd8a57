#!/usr/bin/env python3
"""What a node costs beyond its kernel: kiln's executor against onnxruntime's
on graphs whose kernels do almost nothing, one thread each.

A chain of N Adds of two [1, 64] inputs (each Add reads the previous sum and
a graph input, so no pass can fold the chain away) at N = 1 and N = 51: the
difference over the 50 extra nodes is the cost of one node, its dispatch
and tensor bookkeeping included, and the fixed costs of a call (kiln's
input binding and output copies; onnxruntime's, and Python's call) cancel.
The same with a chain of Gathers (each reverses the [1, 64] sum along its
last axis: a node that moves bytes, as Transpose, Concat, Slice and Pad do,
through the kernels' split of their loops over threads). Then a streaming
voice-activity step (bench/models/onnx_built.py's
vad_step: three Conv1d, an LSTM over the frame's few columns, a Linear; 14
nodes, tens of microseconds) whole, as a model whose kernels are small.

Both sides in CPU time per inference, which a shared machine's other load
moves little at one thread: kiln's from `kiln run` at N and 2N iterations
differenced (loading and planning cancel), onnxruntime's as process CPU
time around N calls. Medians over --rounds alternating rounds.

    .venv/bin/python bench/engine_overhead.py [--kiln build/kiln] [--rounds 5]
        [--iterations 20000]

Prints markdown: the table and the per-node line.
"""
import argparse
import os
import statistics
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "models"))
from engine_vs_ort import kiln_cpu_ms, ort_cpu_ms, ort_session  # noqa: E402
import onnx_built  # noqa: E402

ROOT = os.path.dirname(HERE)


def add_chain(path, n):
    nodes, v = [], "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"v{i}"
        nodes.append(helper.make_node("Add", [v, "x" if i % 2 == 0 else "z"], [out], name=f"add{i}"))
        v = out
    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 64])  # noqa: E731
    g = helper.make_graph(nodes, f"add_chain_{n}", [vi("x"), vi("z")], [vi("y")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def gather_chain(path, n):
    idx = helper.make_tensor("idx", TensorProto.INT64, [64], list(range(63, -1, -1)))
    nodes, v = [], "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"v{i}"
        nodes.append(helper.make_node("Gather", [v, "idx"], [out], axis=1, name=f"gather{i}"))
        v = out
    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 64])  # noqa: E731
    g = helper.make_graph(nodes, f"gather_chain_{n}", [vi("x")], [vi("y")], initializer=[idx])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def measure(kiln, path, iterations, rounds):
    """Median CPU ms per inference of kiln and onnxruntime, alternating."""
    sess, feeds = ort_session(path, 1, 1)
    ks, os_ = [], []
    for _ in range(rounds):
        ks.append(kiln_cpu_ms(kiln, path, 1, 1, iterations))
        os_.append(ort_cpu_ms(sess, feeds, iterations))
    return statistics.median(ks), statistics.median(os_)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = {}
        for chain, make in (("add", add_chain), ("gather", gather_chain)):
            for n in (1, 51):
                rows[f"{chain}_chain_{n}"] = measure(a.kiln, make(os.path.join(tmp, f"{chain}{n}.onnx"), n),
                                                     a.iterations, a.rounds)
        vad = os.path.join(tmp, "vad.onnx")
        onnx.save(onnx_built.vad_step()("vad_stream"), vad)
        rows["vad_stream"] = measure(a.kiln, vad, a.iterations, a.rounds)
    print(f"threads=1 rounds={a.rounds} iterations={a.iterations} cpu_count={os.cpu_count()}")
    print("| graph | nodes | kiln CPU us/inf | ORT CPU us/inf | kiln / ORT |")
    print("|---|---:|---:|---:|---:|")
    nodes = {"add_chain_1": 1, "add_chain_51": 51, "gather_chain_1": 1, "gather_chain_51": 51, "vad_stream": 14}
    for name, (k, o) in rows.items():
        print(f"| {name} | {nodes[name]} | {k * 1e3:.1f} | {o * 1e3:.1f} | {k / o:.2f} |")
    print()
    for chain, what in (("add", "per_node"), ("gather", "per_gather_node")):
        (k1, o1), (k51, o51) = rows[f"{chain}_chain_1"], rows[f"{chain}_chain_51"]
        kn, on = (k51 - k1) / 50 * 1e3, (o51 - o1) / 50 * 1e3
        print(f"{what} kiln {kn:.3f} us, onnxruntime {on:.3f} us, ratio {kn / on:.2f}")


if __name__ == "__main__":
    main()
