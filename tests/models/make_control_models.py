#!/usr/bin/env python3
"""Exports models with data-dependent control flow from PyTorch (TorchScript,
torch.onnx), with seeded random weights:

  control_loop_if.onnx   a scripted recurrence over the rows of x (a Loop whose
                         trip count is x's first dim, its body reading the
                         Linear's weights from the outer graph) and a scripted
                         branch on the sign of the sum (an If chosen at run time)
  control_while.onnx     a scripted while loop: halves h until its norm is
                         below a bound the caller sends, at most 20 times (a Loop
                         with a trip count and a condition computed in the body)

The files are a few KB and kept in tests/data/control/ so that the tests need
no torch; run this again (pip install torch onnx) to remake them.

Usage: make_control_models.py [--out tests/data/control]
"""
import argparse
import os

import torch


class LoopIf(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.zeros(1, 8)
        for i in range(x.size(0)):
            h = torch.tanh(self.cell(h) + x[i])
        if bool(x.sum() > 0):
            y = torch.relu(self.head(h))
        else:
            y = self.head(h) * 2.0 - 1.0
        return h, y


class While(torch.nn.Module):
    def forward(self, h, bound):
        i = 0
        while bool(torch.linalg.vector_norm(h) > bound) and i < 20:
            h = h * 0.5
            i += 1
        return h


def export(m, args, names, outs, axes, path):
    m.eval()
    s = torch.jit.script(m)
    torch.onnx.export(s, args, path, input_names=names, output_names=outs, dynamic_axes=axes,
                      opset_version=17, dynamo=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "data", "control"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    export(LoopIf(), (torch.randn(5, 8),), ["x"], ["h", "y"], {"x": {0: "steps"}},
           os.path.join(a.out, "control_loop_if.onnx"))
    export(While(), (torch.randn(2, 3) * 10, torch.tensor(1.0)), ["h", "bound"], ["out"],
           {"h": {0: "rows"}, "out": {0: "rows"}}, os.path.join(a.out, "control_while.onnx"))


if __name__ == "__main__":
    main()
