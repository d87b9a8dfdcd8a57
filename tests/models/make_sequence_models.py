#!/usr/bin/env python3
"""Exports the sequence models that padded batching is tested and measured on,
from transformers with seeded random weights (no download), with torch.onnx:

  bert         BertModel (2 layers, hidden 128): last_hidden_state, pooler_output
  distilbert   DistilBertModel (2 layers, hidden 128): last_hidden_state
  sentence     a sentence embedder: BertModel and masked mean pooling over the
               tokens (sentence_embedding [N, 128]), as sentence-transformers
               models compute it

Each takes input_ids, attention_mask (and token_type_ids for BERT) with the
dims named batch and sequence, as exports for serving name them. The files
are small (about 2 MB each) and kept in tests/data/sequence/ so that the tests
need no torch; run this again (pip install torch transformers) to remake them.

Usage: make_sequence_models.py [--out tests/data/sequence]
"""
import argparse
import os

import torch
from transformers import BertConfig, BertModel, DistilBertConfig, DistilBertModel

SMALL = dict(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=256, max_position_embeddings=512)


class Bert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.m = BertModel(BertConfig(**SMALL))

    def forward(self, input_ids, attention_mask, token_type_ids):
        o = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return o.last_hidden_state, o.pooler_output


class DistilBert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = DistilBertConfig(vocab_size=1000, dim=128, n_layers=2, n_heads=2, hidden_dim=256,
                               max_position_embeddings=512)
        self.m = DistilBertModel(cfg)

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class Sentence(torch.nn.Module):
    """Masked mean pooling: padding tokens count for nothing."""

    def __init__(self):
        super().__init__()
        self.m = BertModel(BertConfig(**SMALL))

    def forward(self, input_ids, attention_mask):
        h = self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        w = attention_mask.unsqueeze(-1).to(h.dtype)
        return (h * w).sum(1) / w.sum(1).clamp(min=1e-9)


def export(model, names, outputs, path):
    seq = {0: "batch", 1: "sequence"}
    args = tuple(torch.ones(2, 16, dtype=torch.int64) for _ in names)
    axes = {n: seq for n in names}
    for o in outputs:
        axes[o] = seq if o != "pooler_output" and o != "sentence_embedding" else {0: "batch"}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.onnx.export(model.eval(), args, path, input_names=list(names), output_names=list(outputs),
                      dynamic_axes=axes, opset_version=17, dynamo=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "sequence"))
    a = ap.parse_args()
    torch.manual_seed(0)
    export(Bert(), ("input_ids", "attention_mask", "token_type_ids"), ("last_hidden_state", "pooler_output"),
           os.path.join(a.out, "bert.onnx"))
    torch.manual_seed(1)
    export(DistilBert(), ("input_ids", "attention_mask"), ("last_hidden_state",), os.path.join(a.out, "distilbert.onnx"))
    torch.manual_seed(2)
    export(Sentence(), ("input_ids", "attention_mask"), ("sentence_embedding",), os.path.join(a.out, "sentence.onnx"))


if __name__ == "__main__":
    main()
