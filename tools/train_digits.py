#!/usr/bin/env python3
"""Trains kiln's example model: a digits classifier on scikit-learn's bundled
8x8 digits data (no download), seeded end to end, exported to ONNX.

Writes model_repository/digits/1/model.onnx and the held-out split as
tests/data/digits_test_x.npy (float32 [N,64]) and digits_test_y.npy (int64 [N]).
Run from the repository root: .venv/bin/python tools/train_digits.py
"""
import argparse
import os

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from skl2onnx import to_onnx
from skl2onnx.common.data_types import FloatTensorType

SEED = 20240607


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="model_repository/digits/1/model.onnx")
    ap.add_argument("--data-dir", default="tests/data")
    args = ap.parse_args()

    digits = load_digits()
    # Pixel values are 0..16; scale to 0..1 inside the data, not the model,
    # so clients send what the model sees.
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=SEED, stratify=y)

    clf = MLPClassifier(hidden_layer_sizes=(64,), activation="relu", solver="adam",
                        max_iter=400, random_state=SEED)
    clf.fit(x_train, y_train)
    acc = clf.score(x_test, y_test)

    onx = to_onnx(clf, initial_types=[("input", FloatTensorType([None, 64]))],
                  options={id(clf): {"zipmap": False}}, target_opset={"": 13, "ai.onnx.ml": 1})
    # Stable output names that the server config and clients use.
    names = {o.name: n for o, n in zip(onx.graph.output, ("label", "probabilities"))}
    for node in onx.graph.node:
        node.output[:] = [names.get(o, o) for o in node.output]
    for o in onx.graph.output:
        o.name = names[o.name]
    # A named batch dim lets servers and `kiln run --batch` recognise it.
    for vi in list(onx.graph.input) + list(onx.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    onx.producer_name = "kiln tools/train_digits.py"
    onx.doc_string = ""

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    os.makedirs(args.data_dir, exist_ok=True)
    with open(args.out, "wb") as f:
        f.write(onx.SerializeToString())
    np.save(os.path.join(args.data_dir, "digits_test_x.npy"), x_test)
    np.save(os.path.join(args.data_dir, "digits_test_y.npy"), y_test)
    print(f"sklearn held-out accuracy {acc:.4f} on {len(y_test)} samples; wrote {args.out}")


if __name__ == "__main__":
    main()
