#!/usr/bin/env python3
"""Exports the float CNNs whose INT8 forms (onnxruntime.quantization's
quantize_static, QDQ format) tests/e2e/test_int8_models.py serves, from
PyTorch with seeded random weights, with torch.onnx:

  resnet_tiny     a ResNet of torchvision's BasicBlocks, narrow (16-64
                  channels), [N, 3, 32, 32] -> [N, 10]: Conv+BN(+Relu),
                  MaxPool, residual Add + Relu, strided downsampling,
                  GlobalAveragePool, Flatten, Gemm
  mobilenet_tiny  torchvision's mobilenet_v2 at width 0.25, [N, 3, 32, 32]
                  -> [N, 10]: depthwise and pointwise Conv, Clip (ReLU6),
                  inverted residual Adds, GlobalAveragePool, Gemm

With --full, torchvision's resnet18 and mobilenet_v2 at 224x224 (1000
classes) instead, for docs/benchmarks-int8.md (not kept in the tree).

The small files are kept in tests/data/quant/ so that the tests need no
torch; run this again (pip install torch torchvision) to remake them.

Usage: make_int8_cnn_models.py [--out tests/data/quant] [--full]
"""
import argparse
import os

import torch
from torch import nn
from torchvision.models import mobilenet_v2, resnet18
from torchvision.models.resnet import BasicBlock, ResNet


def resnet_tiny():
    m = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10, width_per_group=64)
    # Narrow every stage: rebuild the stages at 16/32/48/64 channels.
    m.inplanes = 16
    m.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
    m.bn1 = nn.BatchNorm2d(16)
    m.layer1 = m._make_layer(BasicBlock, 16, 1)
    m.layer2 = m._make_layer(BasicBlock, 32, 1, stride=2)
    m.layer3 = m._make_layer(BasicBlock, 48, 1, stride=2)
    m.layer4 = m._make_layer(BasicBlock, 64, 1, stride=2)
    m.fc = nn.Linear(64, 10)
    return m


def randomize_bn(m):
    # Trained-looking batch statistics, so the folded weights vary.
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            n = mod.num_features
            mod.running_mean.uniform_(-0.2, 0.2)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.2, 0.2)
    return m


def export(model, path, size):
    model.eval()
    x = torch.randn(1, 3, size, size)
    torch.onnx.export(model, x, path, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}}, opset_version=17, dynamo=False)
    print(path, os.path.getsize(path), "bytes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/quant")
    ap.add_argument("--full", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    with torch.no_grad():
        if a.full:
            export(randomize_bn(resnet18(num_classes=1000)), os.path.join(a.out, "resnet18.onnx"), 224)
            export(randomize_bn(mobilenet_v2(num_classes=1000)), os.path.join(a.out, "mobilenet_v2.onnx"), 224)
        else:
            export(randomize_bn(resnet_tiny()), os.path.join(a.out, "resnet_tiny.onnx"), 32)
            export(randomize_bn(mobilenet_v2(num_classes=10, width_mult=0.25)),
                   os.path.join(a.out, "mobilenet_tiny.onnx"), 32)


if __name__ == "__main__":
    main()
