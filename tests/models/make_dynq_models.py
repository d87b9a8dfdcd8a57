#!/usr/bin/env python3
"""Exports the dynamically quantized models that kiln's MatMulInteger path
is tested on end to end (tests/e2e/test_dynamic_quant.py): float models from
PyTorch with seeded random weights, exported with torch.onnx, then
quantized by onnxruntime.quantization.quantize_dynamic (no calibration):

  bert_dyn     BertModel (2 layers, hidden 64, GELU, vocabulary 500):
               input_ids, attention_mask, token_type_ids ->
               last_hidden_state, pooler_output; int8 weights per tensor,
               the embeddings' Gathers quantized too. One
               DynamicQuantizeLinear feeds attention's Q, K and V products,
               the others feed one product each.
  mlp_dyn_u8   make_quant_models.py's token MLP [N, T, 64] -> [N, T, 32]
               (Linear, GELU, residual Add, LayerNorm, Linear) with other
               seeded weights; uint8 weights per output channel:
               per-column zero points and scales.
  cnn_dyn      a small depthwise CNN [N, 3, H, W] -> [N, 16, H/2, W/2]:
               a 3x3 Conv with bias and ReLU6, a 3x3 depthwise Conv of
               stride 2 with bias and ReLU, a 1x1 Conv without bias;
               int8 weights per tensor: each Conv a ConvInteger between
               DynamicQuantizeLinear and Cast, Mul (and Add of the bias).

The files are small (tens of KB) and kept in tests/data/dynq/ so that the
tests need neither torch nor the quantizer. The export needs torch and
transformers; the quantization runs under --ort-python (a Python with
onnx and onnxruntime, default the project's .venv), so one call remakes
both:  /path/to/torch/python tests/models/make_dynq_models.py

Usage: make_dynq_models.py [--out tests/data/dynq] [--ort-python PY]
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def export_float(tmp):
    import torch
    from torch import nn
    from transformers import BertConfig, BertModel

    sys.path.insert(0, HERE)
    from make_quant_models import Mlp, export  # the MLP of tests/data/quant/mlp.onnx

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = BertModel(BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=128, max_position_embeddings=64))

        def forward(self, input_ids, attention_mask, token_type_ids):
            o = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return o.last_hidden_state, o.pooler_output

    seq = {0: "batch", 1: "sequence"}
    torch.manual_seed(0)
    names = ("input_ids", "attention_mask", "token_type_ids")
    torch.onnx.export(Bert().eval(), tuple(torch.ones(2, 16, dtype=torch.int64) for _ in names),
                      os.path.join(tmp, "bert_dyn.onnx"), input_names=list(names),
                      output_names=["last_hidden_state", "pooler_output"],
                      dynamic_axes={**{n: seq for n in names}, "last_hidden_state": seq, "pooler_output": {0: "batch"}},
                      opset_version=17, dynamo=False)
    torch.manual_seed(1)
    export(Mlp(), (1, 5, 64), os.path.join(tmp, "mlp_dyn_u8.onnx"), True)

    class Cnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 8, 3, padding=1)
            self.dw = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
            self.pw = nn.Conv2d(8, 16, 1, bias=False)

        def forward(self, x):
            return self.pw(torch.relu(self.dw(torch.clamp(self.c1(x), 0, 6))))

    torch.manual_seed(2)
    hw = {0: "batch", 2: "height", 3: "width"}
    torch.onnx.export(Cnn().eval(), (torch.randn(1, 3, 16, 16),), os.path.join(tmp, "cnn_dyn.onnx"),
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": hw, "y": hw},
                      opset_version=17, dynamo=False)


def quantize(src, out):
    from onnxruntime.quantization import QuantType, quantize_dynamic
    os.makedirs(out, exist_ok=True)
    quantize_dynamic(os.path.join(src, "bert_dyn.onnx"), os.path.join(out, "bert_dyn.onnx"),
                     weight_type=QuantType.QInt8)
    quantize_dynamic(os.path.join(src, "mlp_dyn_u8.onnx"), os.path.join(out, "mlp_dyn_u8.onnx"),
                     weight_type=QuantType.QUInt8, per_channel=True)
    quantize_dynamic(os.path.join(src, "cnn_dyn.onnx"), os.path.join(out, "cnn_dyn.onnx"),
                     weight_type=QuantType.QInt8)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "dynq"))
    ap.add_argument("--ort-python", default=os.path.join(ROOT, ".venv", "bin", "python"))
    ap.add_argument("--quantize-from", help=argparse.SUPPRESS)  # the second phase, under --ort-python
    a = ap.parse_args()
    if a.quantize_from:
        quantize(a.quantize_from, a.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        export_float(tmp)
        subprocess.run([a.ort_python, os.path.abspath(__file__), "--out", a.out, "--quantize-from", tmp], check=True)
    for f in sorted(os.listdir(a.out)):
        print(f"{f}: {os.path.getsize(os.path.join(a.out, f))} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
