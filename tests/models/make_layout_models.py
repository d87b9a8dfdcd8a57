#!/usr/bin/env python3
"""Exports the small CNN the channels-last layout planner is tested on
(models/passes_layout.c), from torch with seeded random weights:

  cnn_mix   [N,3,32,32] -> stem Conv+ReLU, depthwise Conv, a squeeze-excite
            block (GlobalAveragePool, two 1x1 Convs, HardSigmoid, Mul), SiLU
            (x * Sigmoid(x)), a residual Add, MaxPool, two branches joined by
            a channel Concat, a bilinear Resize (x2), AveragePool, then two
            outputs: logits (Flatten + Gemm, a plain-layout consumer) and the
            feature map itself ("features", a graph output read plain).

The batch dim is named N. The file is small (about 130 KB) and kept in
tests/data/layout/ so that the tests need no torch; run this again (pip
install torch) to remake it.

Usage: make_layout_models.py [--out tests/data/layout]
"""
import argparse
import os

import torch
from torch import nn


class SE(nn.Module):
    def __init__(self, c, r):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)

    def forward(self, x):
        s = torch.nn.functional.adaptive_avg_pool2d(x, 1)
        return x * torch.nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))


class CnnMix(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.se = SE(16, 8)
        self.pw = nn.Conv2d(16, 16, 1)
        self.a = nn.Conv2d(16, 24, 1)
        self.b = nn.Conv2d(16, 8, 3, padding=1)
        self.head = nn.Conv2d(32, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        x = torch.relu(self.stem(x))              # 16 x 16 x 16
        y = self.se(self.dw(x))
        y = self.pw(y)
        y = y * torch.sigmoid(y)                  # SiLU
        x = torch.nn.functional.max_pool2d(x + y, 2)  # residual, 8 x 8
        x = torch.cat([self.a(x), self.b(x)], 1)  # 32 channels
        x = torch.nn.functional.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
        x = torch.nn.functional.avg_pool2d(self.head(x), 2)  # 8 x 8
        return self.fc(torch.flatten(x, 1)), x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "data", "layout"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    m = CnnMix().eval()
    path = os.path.join(a.out, "cnn_mix.onnx")
    torch.onnx.export(m, (torch.randn(1, 3, 32, 32),), path, input_names=["x"], output_names=["logits", "features"],
                      dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}, "features": {0: "N"}}, opset_version=17,
                      dynamo=False)
    print(path, os.path.getsize(path))


if __name__ == "__main__":
    main()
