#!/usr/bin/env python3
"""Builds the model repository and request bodies of the batching benchmark.

For each model (the digits classifier and ResNet-50) it writes one model
directory per batching mode, all sharing the same ONNX file:
  <model>_off     max_batch_size set, no dynamic_batching: one request a run
  <model>_on      dynamic_batching with no delay: batches form while the
                  instances are busy
  <model>_delay   dynamic_batching with max_queue_delay_microseconds
  <model>_budget  dynamic_batching with latency_budget_microseconds
and one binary-extension request body per model (<out>/<model>.body with its
JSON header length in <out>/<model>.hlen), the way tritonclient sends it.

ResNet-50 is ONNX's light_resnet50 test model, whose batch dim is fixed to 1:
the copy made here has a symbolic first dim on the input and the output and a
Reshape to [-1, 2048] instead of [1, 2048], so batches of any size run.

Usage: make_batching_repo.py --out DIR [--budget-digits US] [--budget-resnet US]
"""
import argparse
import json
import os
import shutil

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def light_model_path(name):
    d = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    return os.path.join(d, name)


def batchable_resnet50(src, dst):
    m = onnx.load(src)
    data = m.graph.input[0]
    data.type.tensor_type.shape.dim[0].ClearField("dim_value")
    data.type.tensor_type.shape.dim[0].dim_param = "N"
    for o in m.graph.output:
        o.type.tensor_type.shape.dim[0].ClearField("dim_value")
        o.type.tensor_type.shape.dim[0].dim_param = "N"
    # The flatten before the classifier is a Reshape to a constant [1, 2048].
    for t in m.graph.initializer:
        arr = numpy_helper.to_array(t)
        if arr.dtype == np.int64 and arr.shape == (2,) and arr[0] == 1 and arr[1] == 2048:
            t.CopyFrom(numpy_helper.from_array(np.array([-1, 2048], dtype=np.int64), t.name))
    del m.graph.value_info[:]
    onnx.checker.check_model(m)
    onnx.save(m, dst)
    return data.name, [d.dim_value for d in data.type.tensor_type.shape.dim][1:], m.graph.output[0].name


def binary_body(inputs, outputs):
    """inputs: [(name, array)], outputs: [names] -> (body bytes, header length)."""
    hdr = {"inputs": [], "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in outputs]}
    raw = b""
    for name, arr in inputs:
        b = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        hdr["inputs"].append({"name": name, "shape": list(arr.shape), "datatype": "FP32",
                              "parameters": {"binary_data_size": len(b)}})
        raw += b
    j = json.dumps(hdr, separators=(",", ":")).encode()
    return j + raw, len(j)


def write_model(repo, name, onnx_path, max_batch, mode, param, instances):
    d = os.path.join(repo, name)
    os.makedirs(os.path.join(d, "1"), exist_ok=True)
    dst = os.path.join(d, "1", "model.onnx")
    if not os.path.exists(dst):
        shutil.copyfile(onnx_path, dst)
    cfg = {"name": name, "max_batch_size": max_batch,
           "instance_group": [{"count": instances, "kind": "KIND_CPU"}]}
    if mode == "on":
        cfg["dynamic_batching"] = {}
    elif mode == "delay":
        cfg["dynamic_batching"] = {"max_queue_delay_microseconds": param}
    elif mode == "budget":
        cfg["dynamic_batching"] = {"latency_budget_microseconds": param}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--digits", default=os.path.join(ROOT, "model_repository", "digits", "1", "model.onnx"))
    ap.add_argument("--resnet", default=light_model_path("light_resnet50.onnx"))
    ap.add_argument("--budget-digits", type=int, default=2000, help="latency budget, us")
    ap.add_argument("--budget-resnet50", type=int, default=400000, help="latency budget, us")
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--no-resnet", action="store_true")
    args = ap.parse_args()

    repo = os.path.join(args.out, "repo")
    os.makedirs(repo, exist_ok=True)
    rng = np.random.default_rng(7)

    models = [("digits", args.digits, 64, args.budget_digits)]
    if not args.no_resnet:
        rn = os.path.join(args.out, "resnet50_batchable.onnx")
        in_name, in_dims, out_name = batchable_resnet50(args.resnet, rn)
        # On the CPU a ResNet-50 batch stops paying per image past about 8
        # (activations outgrow the caches): 8 is the batch limit to deploy.
        models.append(("resnet50", rn, 8, args.budget_resnet50))

    for base, path, max_batch, budget in models:
        # A fixed delay "tuned for the same budget": half of it, leaving the
        # other half for execution.
        for mode, param in (("off", 0), ("on", 0), ("delay", budget // 2), ("budget", budget)):
            write_model(repo, f"{base}_{mode}", path, max_batch, mode, param, args.instances)
        if base == "digits":
            x = np.load(os.path.join(ROOT, "tests", "data", "digits_test_x.npy"))[:1]
            body, hlen = binary_body([("input", x)], ["label", "probabilities"])
        else:
            x = rng.standard_normal((1, *in_dims)).astype(np.float32)
            body, hlen = binary_body([(in_name, x)], [out_name])
        with open(os.path.join(args.out, f"{base}.body"), "wb") as f:
            f.write(body)
        with open(os.path.join(args.out, f"{base}.hlen"), "w") as f:
            f.write(str(hlen))
        with open(os.path.join(args.out, f"{base}.budget"), "w") as f:
            f.write(str(budget))
    print(f"wrote {repo}")


if __name__ == "__main__":
    main()
