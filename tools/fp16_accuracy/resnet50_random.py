#!/usr/bin/env python3
"""ResNet-50 with realistic activations for FP16 error measurements, made
without a download: ONNX's light ResNet-50 (the architecture, weights built
by ConstantOfShape) gets random He-initialised weights, and its BatchNorm
statistics are calibrated on one random image until every layer's input is
normalised, as in a trained network. Outputs: the logits (added) and the
softmax probabilities. Deterministic (fixed seeds).

usage: .venv/bin/python tools/fp16_accuracy/resnet50_random.py \
         .venv/lib/python3.11/site-packages/onnx/backend/test/data/light/light_resnet50.onnx OUT.onnx
"""
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper
import onnxruntime as ort

src, dst = sys.argv[1], sys.argv[2]
m = onnx.load(src)
g = m.graph
np.seterr(all="ignore")  # the first calibration passes see unnormalised, overflowing activations
rng = np.random.default_rng(7)
consumers = {}
for n in g.node:
    for k, i in enumerate(n.input): consumers.setdefault(i, []).append((n, k))
keep, inits = [], []
for n in g.node:
    if n.op_type != "ConstantOfShape":
        keep.append(n); continue
    # shape comes from an initializer or Constant
    shp = None
    for t in g.initializer:
        if t.name == n.input[0]: shp = numpy_helper.to_array(t)
    if shp is None:
        for c in g.node:
            if c.op_type == "Constant" and c.output[0] == n.input[0]:
                shp = numpy_helper.to_array(c.attribute[0].t)
    shp = tuple(int(s) for s in shp)
    use, k = consumers[n.output[0]][0]
    if use.op_type == "BatchNormalization":
        v = [None, lambda: rng.uniform(0.5, 1.5, shp), lambda: rng.normal(0, 0.1, shp),
             lambda: rng.normal(0, 0.5, shp), lambda: rng.uniform(0.5, 2.0, shp)][k]()
    elif len(shp) >= 2:
        fan = int(np.prod(shp[1:])) if len(shp) == 4 else shp[0]
        v = rng.normal(0, np.sqrt(2.0 / fan), shp)
    else:
        v = rng.normal(0, 0.05, shp)
    inits.append(numpy_helper.from_array(v.astype(np.float32), n.output[0]))
sm = [n for n in keep if n.op_type == "Softmax"][0]
g.output.insert(0, helper.make_tensor_value_info(sm.input[0], onnx.TensorProto.FLOAT, [1, 1000]))
del g.node[:]
g.node.extend(keep)
g.initializer.extend(inits)
onnx.save(m, dst)
so = ort.SessionOptions(); so.log_severity_level = 3
s = ort.InferenceSession(dst, so)
x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)
y, p = s.run(None, {s.get_inputs()[0].name: x})
print("ok", y.shape, "logits", float(y.min()), float(y.max()), "top prob", float(p.max()), int(p.argmax()))
# Calibrate BatchNorm statistics so activations stay normalised (as in a
# trained network): measure each BN input on random images, set mean/var,
# repeat so deeper layers see calibrated inputs.
m = onnx.load(dst)
g = m.graph
bns = [n for n in g.node if n.op_type == "BatchNormalization"]
for bn in bns:
    g.output.append(helper.make_tensor_value_info(bn.input[0], onnx.TensorProto.FLOAT, None))
init = {t.name: i for i, t in enumerate(g.initializer)}
xs = np.random.default_rng(3).uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)
for it in range(60):
    s = ort.InferenceSession(m.SerializeToString(), so)
    outs = s.run(None, {s.get_inputs()[0].name: xs})[2:]
    worst = 0.0
    for bn, a in zip(bns, outs):
        mu, var = a.mean(axis=(0, 2, 3)), a.var(axis=(0, 2, 3)) + 1e-3
        old = numpy_helper.to_array(g.initializer[init[bn.input[4]]])
        worst = max(worst, float(np.max(np.abs(np.log(var / old)))))
        g.initializer[init[bn.input[3]]].CopyFrom(numpy_helper.from_array(mu.astype(np.float32), bn.input[3]))
        g.initializer[init[bn.input[4]]].CopyFrom(numpy_helper.from_array(var.astype(np.float32), bn.input[4]))
    if worst < 1e-3: break
del g.output[2:]
onnx.save(m, dst)
s = ort.InferenceSession(dst, so)
y, p = s.run(None, {s.get_inputs()[0].name: x})
print("calibrated after", it + 1, "passes: logits", float(y.min()), float(y.max()), "top prob", float(p.max()))
