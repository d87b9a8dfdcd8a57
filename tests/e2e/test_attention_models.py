"""Attention ops against onnxruntime: the com.microsoft contrib ops
(Attention, MultiHeadAttention, GroupQueryAttention, RotaryEmbedding) as
single nodes made here with onnx.helper and run through `kiln run`, and a
BERT model whose attention onnxruntime's BERT optimizer fused into
Attention nodes (tests/models/make_attention_models.py) served over HTTP.
ONNX's own Attention and RotaryEmbedding are covered by the conformance
suite's node tests."""
import os
import subprocess
import zlib
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto as TP

from conftest import KILN, kiln_run

ROOT = Path(__file__).resolve().parents[2]
BERT_FUSED = ROOT / "tests" / "data" / "sequence" / "bert_attention.onnx"
MS = "com.microsoft"
ELEM = {np.dtype(np.float32): TP.FLOAT, np.dtype(np.int32): TP.INT32, np.dtype(np.int64): TP.INT64}


def node_model(op, inputs, outputs, feeds, consts=None, **attrs):
    """One com.microsoft node; inputs lists names ('' for absent), feeds the
    graph inputs, consts the initializers."""
    consts = consts or {}
    node = oh.make_node(op, inputs, outputs, domain=MS, **attrs)
    ins = [oh.make_tensor_value_info(n, ELEM[a.dtype], a.shape) for n, a in feeds.items()]
    inits = [onnx.numpy_helper.from_array(a, n) for n, a in consts.items()]
    outs = [oh.make_tensor_value_info(n, TP.FLOAT, None) for n in outputs if n]
    graph = oh.make_graph([node], op.lower(), ins, outs, initializer=inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def check(model, feeds, tmp_path, atol=2e-5):
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    names = [o.name for o in model.graph.output]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = kiln_run(path, feeds, names, tmp_path)
    for n, g, w in zip(names, got, want):
        assert g.shape == w.shape, (n, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=atol, err_msg=n)


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def f32(rng, *shape):
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


# ---- MultiHeadAttention -------------------------------------------------------
# onnxruntime's CPU kernels refuse packed QKV and packed KV, so those forms
# are tested in tests/kernels/test_ops_attention.c only.

MHA_CASES = [
    # name, B, S, L, N, H, Hv, options
    ("plain", 2, 5, 5, 2, 8, 8, {}),
    ("cross_bias_vhead", 2, 3, 7, 2, 8, 4, {"bias": True}),
    ("key_lengths", 3, 4, 6, 2, 4, 4, {"mask": "lengths"}),
    ("key_mask_2d", 2, 4, 6, 4, 4, 4, {"mask": "2d", "bias": True}),
    ("attention_bias", 2, 4, 4, 2, 8, 8, {"attention_bias": True, "unidirectional": 1}),
    ("past_present", 2, 1, 1, 2, 8, 8, {"past": 5, "bias": True}),
    ("past_causal", 1, 3, 3, 2, 4, 4, {"past": 4, "unidirectional": 1, "scale": 0.3}),
    ("bnsh_kv", 2, 3, 5, 2, 8, 8, {"bnsh": True}),
]


@pytest.mark.parametrize("case", MHA_CASES, ids=[c[0] for c in MHA_CASES])
def test_multi_head_attention(case, tmp_path):
    name, B, S, L, N, H, Hv, o = case
    rng = rng_for("mha", name)
    feeds, inputs = {}, []
    P = o.get("past", 0)
    if o.get("packed") == "qkv":
        feeds["query"] = f32(rng, B, S, N, 3, H)
        inputs = ["query", "", ""]
    elif o.get("packed") == "kv":
        feeds["query"], feeds["key"] = f32(rng, B, S, N * H), f32(rng, B, L, N, 2, H)
        inputs = ["query", "key", ""]
    elif o.get("bnsh"):
        feeds["query"], feeds["key"], feeds["value"] = f32(rng, B, S, N * H), f32(rng, B, N, L, H), f32(rng, B, N, L, Hv)
        inputs = ["query", "key", "value"]
    else:
        feeds["query"], feeds["key"], feeds["value"] = f32(rng, B, S, N * H), f32(rng, B, L, N * H), f32(rng, B, L, N * Hv)
        inputs = ["query", "key", "value"]
    consts = {}
    inputs.append("bias" if o.get("bias") else "")
    if o.get("bias"):
        consts["bias"] = f32(rng, N * (2 * H + Hv))
    T = P + L
    mask = o.get("mask")
    if mask == "lengths":
        feeds["key_padding_mask"] = np.array([T, 2, T - 1][:B], dtype=np.int32)
    elif mask == "2d":
        m = np.ones((B, T), dtype=np.int32)
        m[0, -2:] = 0
        m[1, 0] = 0
        feeds["key_padding_mask"] = m
    inputs.append("key_padding_mask" if mask else "")
    if o.get("attention_bias"):
        feeds["attention_bias"] = f32(rng, 1, N, S, T)
    inputs.append("attention_bias" if o.get("attention_bias") else "")
    outputs = ["output"]
    if P:
        feeds["past_key"], feeds["past_value"] = f32(rng, B, N, P, H), f32(rng, B, N, P, Hv)
        inputs += ["past_key", "past_value"]
        outputs += ["present_key", "present_value"]
    while inputs[-1] == "":
        inputs.pop()
    attrs = {"num_heads": N}
    if "unidirectional" in o:
        attrs["unidirectional"] = o["unidirectional"]
    if "scale" in o:
        attrs["scale"] = o["scale"]
    check(node_model("MultiHeadAttention", inputs, outputs, feeds, consts, **attrs), feeds, tmp_path)


# ---- Attention (fused QKV) ------------------------------------------------

ATTN_CASES = [
    # name, B, S, Din, N, H, options
    ("plain", 2, 6, 16, 2, 8, {}),
    ("mask_lengths", 3, 5, 16, 2, 8, {"mask": "lengths"}),
    ("mask_start_end", 2, 5, 16, 2, 8, {"mask": "start_end"}),
    ("mask_2d", 2, 6, 12, 3, 4, {"mask": "2d"}),
    ("mask_3d", 2, 4, 16, 2, 8, {"mask": "3d"}),
    ("unidirectional", 2, 5, 16, 4, 4, {"unidirectional": 1}),
    ("past_present", 2, 1, 16, 2, 8, {"past": 4, "unidirectional": 1}),
    ("qkv_hidden_sizes", 2, 4, 16, 2, 8, {"sizes": [16, 16, 8]}),
    ("attention_bias", 2, 4, 16, 2, 8, {"attention_bias": True, "mask": "lengths"}),
]


@pytest.mark.parametrize("case", ATTN_CASES, ids=[c[0] for c in ATTN_CASES])
def test_attention_fused_qkv(case, tmp_path):
    name, B, S, Din, N, H, o = case
    rng = rng_for("attn", name)
    sizes = o.get("sizes", [N * H] * 3)
    P = o.get("past", 0)
    T = P + S
    feeds = {"input": f32(rng, B, S, Din)}
    consts = {"weights": f32(rng, Din, sum(sizes)), "bias": f32(rng, sum(sizes))}
    inputs = ["input", "weights", "bias"]
    mask = o.get("mask")
    if mask == "lengths":
        feeds["mask_index"] = np.array([T, 2, T - 1][:B], dtype=np.int32)
    elif mask == "start_end":
        feeds["mask_index"] = np.array([T, T - 1, 0, 2], dtype=np.int32)
    elif mask == "2d":
        m = np.ones((B, T), dtype=np.int32)
        m[0, -3:] = 0
        feeds["mask_index"] = m
    elif mask == "3d":
        m = (rng.uniform(size=(B, S, T)) > 0.3).astype(np.int32)
        m[..., 0] = 1
        feeds["mask_index"] = m
    inputs.append("mask_index" if mask else "")
    outputs = ["output"]
    if P:
        feeds["past"] = f32(rng, 2, B, N, P, H)
        outputs.append("present")
    inputs.append("past" if P else "")
    if o.get("attention_bias"):
        feeds["attention_bias"] = f32(rng, B, 1, S, T)
    inputs.append("attention_bias" if o.get("attention_bias") else "")
    while inputs[-1] == "":
        inputs.pop()
    attrs = {"num_heads": N}
    if "unidirectional" in o:
        attrs["unidirectional"] = o["unidirectional"]
    if "sizes" in o:
        attrs["qkv_hidden_sizes"] = sizes
    check(node_model("Attention", inputs, outputs, feeds, consts, **attrs), feeds, tmp_path)


# ---- GroupQueryAttention ------------------------------------------------------

GQA_CASES = [
    # name, B, S, P, N, Nkv, H, options
    ("prompt", 2, 6, 0, 4, 2, 8, {}),
    ("prompt_mqa", 1, 5, 0, 4, 1, 8, {}),
    ("decode", 2, 1, 5, 4, 2, 8, {}),
    ("packed_decode", 2, 1, 3, 6, 2, 8, {"packed": True}),
    ("rotary_prompt", 2, 4, 0, 4, 2, 16, {"rotary": True}),
    ("rotary_decode_interleaved", 2, 1, 4, 4, 2, 16, {"rotary": True, "interleaved": 1}),
    ("local_window", 1, 7, 0, 2, 2, 8, {"window": 3}),
    ("softcap", 1, 5, 0, 4, 2, 8, {"softcap": 2.0, "scale": 0.5}),
]


@pytest.mark.parametrize("case", GQA_CASES, ids=[c[0] for c in GQA_CASES])
def test_group_query_attention(case, tmp_path):
    name, B, S, P, N, Nkv, H, o = case
    rng = rng_for("gqa", name)
    feeds = {}
    if o.get("packed"):
        feeds["query"] = f32(rng, B, S, (N + 2 * Nkv) * H)
        inputs = ["query", "", ""]
    else:
        feeds["query"], feeds["key"], feeds["value"] = f32(rng, B, S, N * H), f32(rng, B, S, Nkv * H), f32(rng, B, S, Nkv * H)
        inputs = ["query", "key", "value"]
    if P:
        feeds["past_key"], feeds["past_value"] = f32(rng, B, Nkv, P, H), f32(rng, B, Nkv, P, H)
        inputs += ["past_key", "past_value"]
    else:
        inputs += ["", ""]
    feeds["seqlens_k"] = np.full((B,), P + S - 1, dtype=np.int32)
    feeds["total_sequence_length"] = np.array(P + S, dtype=np.int32)
    inputs += ["seqlens_k", "total_sequence_length"]
    attrs = {"num_heads": N, "kv_num_heads": Nkv}
    if o.get("rotary"):
        inv = 1.0 / (10000 ** (np.arange(0, H, 2) / H))
        ang = np.arange(32)[:, None] * inv[None, :]
        consts = {"cos_cache": np.cos(ang).astype(np.float32), "sin_cache": np.sin(ang).astype(np.float32)}
        inputs += ["cos_cache", "sin_cache"]
        attrs["do_rotary"] = 1
        attrs["rotary_interleaved"] = o.get("interleaved", 0)
    else:
        consts = {}
    if "window" in o:
        attrs["local_window_size"] = o["window"]
    if "softcap" in o:
        attrs["softcap"] = o["softcap"]
    if "scale" in o:
        attrs["scale"] = o["scale"]
    check(node_model("GroupQueryAttention", inputs, ["output", "present_key", "present_value"], feeds, consts, **attrs),
          feeds, tmp_path)


# ---- RotaryEmbedding (com.microsoft) ----------------------------------------

ROPE_CASES = [
    # name, input shape, heads, rotary dim, interleaved, position ids
    ("bsd", (2, 5, 32), 4, 0, 0, "ids"),
    ("bsd_interleaved", (2, 5, 32), 4, 0, 1, "ids"),
    ("offset", (2, 3, 16), 2, 0, 0, "offset"),
    ("bnsh", (2, 2, 4, 8), 0, 0, 0, "ids"),
    ("partial", (1, 4, 32), 2, 8, 0, "ids"),
]


@pytest.mark.parametrize("case", ROPE_CASES, ids=[c[0] for c in ROPE_CASES])
def test_rotary_embedding_ms(case, tmp_path):
    name, shape, heads, rot, inter, pos = case
    rng = rng_for("rope", name)
    B, S = shape[0], shape[-2] if len(shape) == 4 else shape[1]
    D = shape[-1] if len(shape) == 4 else shape[2] // heads
    half = (rot or D) // 2
    feeds = {"input": f32(rng, *shape)}
    feeds["position_ids"] = (rng.integers(0, 20, size=(B, S)).astype(np.int64) if pos == "ids"
                             else np.array([7], dtype=np.int64))
    consts = {"cos_cache": f32(rng, 32, half), "sin_cache": f32(rng, 32, half)}
    attrs = {"interleaved": inter}
    if heads:
        attrs["num_heads"] = heads
    if rot:
        attrs["rotary_embedding_dim"] = rot
    check(node_model("RotaryEmbedding", ["input", "position_ids", "cos_cache", "sin_cache"], ["output"], feeds, consts,
                     **attrs), feeds, tmp_path)


def test_gqa_refuses_bad_seqlens(tmp_path):
    rng = rng_for("gqa-bad")
    feeds = {"query": f32(rng, 1, 1, 16), "key": f32(rng, 1, 1, 8), "value": f32(rng, 1, 1, 8),
             "past_key": f32(rng, 1, 1, 2, 8), "past_value": f32(rng, 1, 1, 2, 8),
             "seqlens_k": np.array([9], dtype=np.int32), "total_sequence_length": np.array(3, dtype=np.int32)}
    m = node_model("GroupQueryAttention", list(feeds), ["output"], feeds, num_heads=2, kv_num_heads=1)
    onnx.save(m, tmp_path / "m.onnx")
    args = [str(KILN), "run", str(tmp_path / "m.onnx"), "--output-dir", str(tmp_path), "--quiet"]
    for n, a in feeds.items():
        np.save(tmp_path / f"{n}.npy", a)
        args += ["--input", f"{n}={tmp_path / f'{n}.npy'}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "seqlens_k[0] = 9" in r.stderr, r.stderr


# ---- a fused BERT over HTTP -------------------------------------------------


def bert_feeds(rng, B, S, lengths):
    ids = rng.integers(1, 1000, size=(B, S)).astype(np.int64)
    mask = np.zeros((B, S), dtype=np.int64)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": (rng.uniform(size=(B, S)) > 0.5).astype(np.int64)}


def test_bert_fused_attention_served(make_server, tmp_path):
    model = onnx.load(BERT_FUSED)
    assert any(n.op_type == "Attention" and n.domain == MS for n in model.graph.node)
    repo = tmp_path / "repo"
    (repo / "bert_attn" / "1").mkdir(parents=True)
    onnx.save(model, repo / "bert_attn" / "1" / "model.onnx")
    s = make_server(repo)
    c = httpclient.InferenceServerClient(s.url)
    sess = ort.InferenceSession(str(BERT_FUSED), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for B, S, lengths in [(1, 8, [8]), (3, 16, [16, 9, 3]), (2, 33, [33, 20])]:
        feeds = bert_feeds(rng, B, S, lengths)
        inputs = []
        for n, a in feeds.items():
            i = httpclient.InferInput(n, list(a.shape), "INT64")
            i.set_data_from_numpy(a, binary_data=True)
            inputs.append(i)
        r = c.infer("bert_attn", inputs)
        want = sess.run(None, feeds)
        for o, w in zip(sess.get_outputs(), want):
            got = r.as_numpy(o.name)
            assert got.shape == w.shape
            # padded positions are compared too: both mask the same keys
            np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-4, err_msg=f"{o.name} B={B} S={S}")
    # a bad request gets a clear error and the server keeps serving
    bad = httpclient.InferInput("input_ids", [1, 4], "INT64")
    bad.set_data_from_numpy(np.ones((1, 4), dtype=np.int64))
    with pytest.raises(httpclient.InferenceServerException):
        c.infer("bert_attn", [bad])
    assert c.is_model_ready("bert_attn")


# ---- unmasked attention as exporters write it ------------------------------

def profiled_ops(tmp_path, feeds):
    """What `kiln run` of tmp_path/m.onnx printed with KILN_PROFILE: the
    operators that ran, one line each."""
    args = [str(KILN), "run", str(tmp_path / "m.onnx"), "--iterations", "1", "--backend", "cpu"]
    for name, arr in feeds.items():
        np.save(tmp_path / f"{name}.npy", arr)
        args += ["--input", f"{name}={tmp_path / (name + '.npy')}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, env={**os.environ, "KILN_PROFILE": "1"})
    assert r.returncode == 0, r.stderr
    return r.stderr + r.stdout


def exported_attention(q_shape, k_shape, v_shape, scale_on):
    """MatMul(Q, K^T) -> Mul or Div by a scalar (on the scores or on Q) ->
    Softmax -> MatMul(., V), as torch exports audio and vision encoders'
    attention: kiln fuses it into one SoftmaxAttention node."""
    nodes = [oh.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    inits = [onnx.numpy_helper.from_array(np.array(0.125, np.float32), "c")]
    if scale_on == "q":
        nodes += [oh.make_node("Mul", ["q", "c"], ["qs"]), oh.make_node("MatMul", ["qs", "kt"], ["s"])]
        scores = "s"
    else:
        nodes += [oh.make_node("MatMul", ["q", "kt"], ["s0"]), oh.make_node("Div", ["s0", "c"], ["s"])]
        scores = "s"
    nodes += [oh.make_node("Softmax", [scores], ["p"], axis=-1), oh.make_node("MatMul", ["p", "v"], ["y"])]
    ins = [oh.make_tensor_value_info(n, TP.FLOAT, s) for n, s in (("q", q_shape), ("k", k_shape), ("v", v_shape))]
    graph = oh.make_graph(nodes, "attn", ins, [oh.make_tensor_value_info("y", TP.FLOAT, None)], initializer=inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("case", [
    # (Q, K, V shapes, where the scale is): long keys run in blocks of
    # query rows, short ones as two oneDNN products around a softmax.
    ((1, 2, 700, 16), (1, 2, 600, 16), (1, 2, 600, 24), "scores"),
    ((2, 3, 37, 8), (2, 3, 45, 8), (2, 3, 45, 8), "q"),
    ((1, 2, 530, 8), (1, 1, 530, 8), (1, 1, 530, 8), "scores"),  # keys and values shared by the heads
    ((1, 1, 5, 4), (1, 1, 1, 4), (1, 1, 1, 4), "q"),
])
def test_unmasked_attention_fused(case, tmp_path):
    qs, ks, vs, scale_on = case
    rng = rng_for("sa", case)
    feeds = {"q": f32(rng, *qs) * 3, "k": f32(rng, *ks) * 3, "v": f32(rng, *vs)}
    model = exported_attention(qs, ks, vs, scale_on)
    check(model, feeds, tmp_path)
    # The scores never became a tensor of the plan: one fused node ran.
    out = profiled_ops(tmp_path, feeds)
    assert "SoftmaxAttention" in out and " Softmax " not in out, out


# ---- masked attention in the heads' layout, as BERT exports it -------------

def exported_masked_attention(B, S, T, H, D, Dv, mask_shape, kstyle, guard, heads_kv=None, sdpa=None):
    """Q [B, S, H, D], K and V [B, T, Hkv, .] -> the heads' Transposes ->
    MatMul -> Mul by a scalar -> Add(mask) -> Softmax -> [Where(IsNaN)] ->
    MatMul(., V) -> Transpose back: kiln fuses it into one HeadAttention.
    sdpa: as torch exports scaled_dot_product_attention, the scale's square
    root on Q and K, and the output reshaped to its own shape: from its own
    Shape with 0 for the heads ("own"), from its, Q's and V's Shapes and -1
    ("torch"); or to another shape of as many elements ("other": two axes
    swapped, "wide": [B, 1, -1, Dv]), which must stay unfused.
    mask_shape may widen the scores (a batch or head axis of 1 in Q, K, V)."""
    hk = heads_kv or H
    nodes = [oh.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3])]
    if kstyle == "one":
        nodes.append(oh.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]))
    else:
        nodes += [oh.make_node("Transpose", ["k"], ["kh"], perm=[0, 2, 1, 3]),
                  oh.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2])]
    nodes.append(oh.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3]))
    if sdpa:
        nodes += [oh.make_node("Mul", ["qt", "rc"], ["qs"]), oh.make_node("Mul", ["kt", "rc"], ["ks"]),
                  oh.make_node("MatMul", ["qs", "ks"], ["ss"])]
    else:
        nodes += [oh.make_node("MatMul", ["qt", "kt"], ["s"]), oh.make_node("Mul", ["s", "c"], ["ss"])]
    nodes += [oh.make_node("Add", ["ss", "mask"], ["sm"]), oh.make_node("Softmax", ["sm"], ["p0"], axis=-1)]
    if guard:
        nodes += [oh.make_node("IsNaN", ["p0"], ["nan"]), oh.make_node("Where", ["nan", "zero", "p0"], ["p"])]
    nodes.append(oh.make_node("MatMul", ["p" if guard else "p0", "vt"], ["ctx"]))
    inits = [onnx.numpy_helper.from_array(np.array(1 / np.sqrt(D), np.float32), "c"),
             onnx.numpy_helper.from_array(np.array(D ** -0.25, np.float32), "rc"),
             onnx.numpy_helper.from_array(np.array(0, np.float32), "zero")]
    if sdpa:
        # "torch": as torch writes it, [B from the output, -1, S from Q, Dv from V].
        src = {0: "ctx", 2: "qt", 3: "vt"} if sdpa == "torch" else {0: "ctx", 2: "ctx", 3: "ctx"}
        for x in dict.fromkeys(src.values()):
            nodes.append(oh.make_node("Shape", [x], [f"{x}_shape"]))
        # Constants: axis 1 copied (0) or inferred (-1); "wide" makes it
        # [B, 1, -1, Dv], as many elements and not the output's shape.
        consts = {"own": {1: 0}, "torch": {1: -1}, "other": {1: 0}, "wide": {1: 1, 2: -1}}[sdpa]
        parts = []
        for k in range(4):
            if k in consts:
                parts.append(f"c{k}_{sdpa}")
                inits.append(onnx.numpy_helper.from_array(np.array([consts[k]], np.int64), parts[-1]))
                continue
            inits.append(onnx.numpy_helper.from_array(np.array(k, np.int64), f"i{k}"))
            nodes += [oh.make_node("Gather", [f"{src[k]}_shape", f"i{k}"], [f"g{k}"], axis=0),
                      oh.make_node("Unsqueeze", [f"g{k}", "axes0"], [f"u{k}"])]
            parts.append(f"u{k}")
        inits.append(onnx.numpy_helper.from_array(np.array([0], np.int64), "axes0"))
        if sdpa == "other":  # [B, H, S, Dv] -> [B, H, Dv, S]: as many elements, not its own shape
            parts = [parts[0], parts[1], parts[3], parts[2]]
        nodes += [oh.make_node("Concat", parts, ["shape"], axis=0), oh.make_node("Reshape", ["ctx", "shape"], ["ctxr"])]
    nodes.append(oh.make_node("Transpose", ["ctxr" if sdpa else "ctx"], ["y"], perm=[0, 2, 1, 3]))
    ins = [oh.make_tensor_value_info(n, TP.FLOAT, s)
           for n, s in (("q", (B, S, H, D)), ("k", (B, T, hk, D)), ("v", (B, T, hk, Dv)), ("mask", mask_shape))]
    graph = oh.make_graph(nodes, "attn", ins, [oh.make_tensor_value_info("y", TP.FLOAT, None)], initializer=inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("case", [
    # (B, S, T, H, D, Dv, mask shape, K's transposes, NaN guard, K and V heads)
    (2, 7, 7, 3, 32, 32, "padding", "one", False, None),
    (3, 48, 48, 12, 32, 32, "padding", "two", False, None),
    (3, 5, 9, 2, 24, 20, "rows", "one", True, None),    # widths off the vectors; a row of keys all masked
    (1, 70, 70, 2, 64, 64, "causal", "two", False, None),  # query rows past one work item
    (2, 1, 1, 4, 8, 8, "keys", "one", False, None),
    (2, 6, 11, 4, 16, 16, "padding", "one", True, 1),   # keys and values shared by the heads
    (2, 9, 9, 3, 32, 32, "padding", "one", True, None, "own"),  # reshaped to its own shape
    (2, 9, 13, 3, 32, 24, "padding", "one", True, None, "torch"),  # torch's scaled_dot_product_attention
    (2, 9, 9, 3, 32, 24, "padding", "one", True, None, "other"),  # reshaped to another shape: left alone
    (2, 5, 7, 3, 16, 16, "padding", "one", True, None, "wide"),  # a 1 beside a -1: left alone
    (1, 5, 7, 3, 16, 16, "batch", "one", False, None),  # Q, K, V of one row; the mask's two widen the scores
])
@pytest.mark.parametrize("isa", [None, "AVX2", "SSE41"])
def test_masked_attention_heads_layout(case, isa, tmp_path, monkeypatch):
    """HeadAttention against onnxruntime, at oneDNN's widest ISA and capped
    (kiln's own loops are built per ISA and follow ONEDNN_MAX_CPU_ISA)."""
    if isa:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    B, S, T, H, D, Dv, mkind, kstyle, guard, hkv = case[:10]
    sdpa = case[10] if len(case) > 10 else None
    rng = rng_for("ha", case)
    low = np.finfo(np.float32).min
    if mkind == "padding":  # [B, 1, 1, T], transformers' extended mask
        mask = np.zeros((B, 1, 1, T), np.float32)
        for b in range(B):
            mask[b, ..., max(1, T - 3 * b):] = low
    elif mkind == "rows":  # [B, 1, S, T]; with the guard a row of -inf gives zeros
        mask = np.where(rng.random((B, 1, S, T)) < 0.3, -np.inf, 0).astype(np.float32)
        mask[0, 0, 1, :] = -np.inf
    elif mkind == "causal":  # [1, 1, S, T]
        mask = np.triu(np.full((S, T), low, np.float32), 1)[None, None]
    elif mkind == "batch":  # [2, 1, 1, T] over Q, K and V of one batch row
        mask = np.zeros((2, 1, 1, T), np.float32)
        mask[1, ..., T // 2:] = low
    else:  # [T]
        mask = rng.uniform(-2, 0, T).astype(np.float32)
    feeds = {"q": f32(rng, B, S, H, D) * 3, "k": f32(rng, B, T, hkv or H, D) * 3, "v": f32(rng, B, T, hkv or H, Dv),
             "mask": mask}
    model = exported_masked_attention(B, S, T, H, D, Dv, mask.shape, kstyle, guard, hkv, sdpa)
    check(model, feeds, tmp_path)
    out = profiled_ops(tmp_path, feeds)
    if sdpa in ("other", "wide"):
        assert "HeadAttention" not in out and "MaskedSoftmax" in out, out
    else:
        assert "HeadAttention" in out and "Transpose" not in out and "MaskedSoftmax" not in out, out
