#!/usr/bin/env python3
"""Makes the BERT model whose attention onnxruntime's BERT optimizer fuses
into com.microsoft Attention nodes, for tests/e2e/test_attention_models.py.

Two steps, in two environments:

  export   BertModel (2 layers, hidden 128, 2 heads, seeded random weights,
           no download) with eager attention, exported by torch.onnx at
           opset 17 (pip install torch transformers). The SDPA export of
           tests/data/sequence/bert.onnx masks with IsNaN/Where, a pattern
           the optimizer's attention fusion does not match.
  fuse     onnxruntime.transformers.optimizer.optimize_model(model_type=
           'bert') with attention fused and SkipLayerNormalization,
           EmbedLayerNormalization, BiasGelu and Gelu left unfused
           (pip install onnxruntime sympy).

The fused file is small (about 2 MB) and kept in tests/data/sequence/ so
that the tests need neither torch nor sympy.

Usage: make_attention_models.py export OUT.onnx
       make_attention_models.py fuse IN.onnx [OUT.onnx]
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "data", "sequence", "bert_attention.onnx")


def export(path):
    import torch
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=256, max_position_embeddings=512, attn_implementation="eager")

    class Bert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = BertModel(cfg)

        def forward(self, input_ids, attention_mask, token_type_ids):
            o = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return o.last_hidden_state, o.pooler_output

    torch.manual_seed(3)
    names = ("input_ids", "attention_mask", "token_type_ids")
    seq = {0: "batch", 1: "sequence"}
    args = tuple(torch.ones(2, 16, dtype=torch.int64) for _ in names)
    torch.onnx.export(Bert().eval(), args, path, input_names=list(names),
                      output_names=["last_hidden_state", "pooler_output"],
                      dynamic_axes={**{n: seq for n in names}, "last_hidden_state": seq, "pooler_output": {0: "batch"}},
                      opset_version=17, dynamo=False)


def fuse(src, dst):
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    o = FusionOptions("bert")
    o.enable_attention = True
    o.enable_skip_layer_norm = False
    o.enable_bias_skip_layer_norm = False
    o.enable_embed_layer_norm = False
    o.enable_bias_gelu = False
    o.enable_gelu = False
    o.enable_gelu_approximation = False
    m = optimize_model(src, model_type="bert", num_heads=2, hidden_size=128, optimization_options=o, opt_level=0)
    ops = sorted({(n.domain, n.op_type) for n in m.model.graph.node if n.domain})
    if ("com.microsoft", "Attention") not in ops:
        sys.exit(f"no Attention was fused (contrib ops: {ops})")
    m.save_model_to_file(dst)
    print(dst, ops)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "export":
        export(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "fuse":
        fuse(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else DEFAULT_OUT)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
