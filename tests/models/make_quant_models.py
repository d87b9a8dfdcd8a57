#!/usr/bin/env python3
"""Exports the float models that onnxruntime.quantization's tools are tested
on (tests/e2e/test_contrib_ops.py quantizes them at test time), from PyTorch
with seeded random weights, with torch.onnx:

  cnn   a small image classifier [N, 3, 16, 16] -> logits [N, 10] and their
        softmax: Conv with Relu,
        a residual Add, Mul, LeakyRelu, Sigmoid, MaxPool, AveragePool, Concat,
        GlobalAveragePool, Flatten, Linear (Gemm) and Softmax: what
        quantize_static's QOperator format turns into QLinearConv, QLinearAdd,
        QLinearMul, QLinearLeakyRelu, QLinearSigmoid, QLinearAveragePool,
        QLinearConcat, QLinearGlobalAveragePool, QGemm and QLinearSoftmax
  mlp   a token MLP [N, T, 64] -> [N, T, 32] of Linear layers on 3-D input
        (MatMul + Add), GELU and LayerNorm: what MatMulNBitsQuantizer turns
        into 4-bit MatMulNBits

The files are small (tens of KB) and kept in tests/data/quant/ so that the
tests need no torch; run this again (pip install torch) to remake them.

Usage: make_quant_models.py [--out tests/data/quant]
"""
import argparse
import os

import torch
from torch import nn


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.a = nn.Conv2d(16, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 16, 1)
        self.gate = nn.Conv2d(16, 16, 1)
        self.side = nn.Conv2d(16, 8, 3, padding=1)
        self.head = nn.Linear(24, 10)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = nn.functional.max_pool2d(x, 2)
        r = torch.relu(self.a(x))
        x = x + self.b(r)                              # Add
        x = x * torch.sigmoid(self.gate(x))            # Sigmoid, Mul
        x = nn.functional.leaky_relu(x, 0.1)
        y = nn.functional.avg_pool2d(x, 2)             # AveragePool
        z = nn.functional.avg_pool2d(torch.relu(self.side(x)), 2)
        x = torch.cat([y, z], dim=1)                   # Concat
        x = nn.functional.adaptive_avg_pool2d(x, 1)    # GlobalAveragePool
        y = self.head(torch.flatten(x, 1))             # Gemm
        return y, torch.softmax(y, dim=1)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)
        self.norm = nn.LayerNorm(64)
        self.out = nn.Linear(64, 32)

    def forward(self, x):
        x = self.norm(x + self.down(nn.functional.gelu(self.up(x))))
        return self.out(x)


def export(model, shape, path, seq_axis, outputs=("y",)):
    x = torch.randn(*shape)
    axes = {0: "batch", 1: "tokens"} if seq_axis else {0: "batch"}
    torch.onnx.export(model.eval(), (x,), path, input_names=["x"], output_names=list(outputs),
                      dynamic_axes={n: axes for n in ("x", *outputs)}, opset_version=17, dynamo=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "data", "quant"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    export(Cnn(), (1, 3, 16, 16), os.path.join(a.out, "cnn.onnx"), False, ("y", "p"))
    export(Mlp(), (1, 5, 64), os.path.join(a.out, "mlp.onnx"), True)


if __name__ == "__main__":
    main()
