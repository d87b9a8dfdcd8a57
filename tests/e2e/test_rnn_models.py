"""LSTM, GRU and RNN through `kiln run`, against onnxruntime.

Two kinds of model:
- single nodes made here with onnx.helper, one per combination of the
  attributes that change the arithmetic (direction, sequence_lens, initial
  states, peepholes, clip, input_forget, linear_before_reset, layout,
  activations with their alphas and betas, which outputs are asked for);
- PyTorch's nn.LSTM, nn.GRU and nn.RNN as torch.onnx.export writes them,
  made by tests/models/make_rnn_models.py and kept in tests/data/rnn/
  (small; torch is not a test dependency, so the files are in the tree)."""
import zlib
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP

from conftest import kiln_run

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "tests" / "data" / "rnn"
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def ort_run(model_path, feeds):
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def rnn_model(op, T, B, I, H, attrs, optional, outputs, opset):
    """One recurrent node; optional names the optional inputs to feed. Returns
    the model and its feeds (random, seeded by the attributes)."""
    rng = np.random.default_rng(zlib.crc32(repr((op, T, B, I, H, sorted(attrs.items()), optional)).encode()))
    G, D = GATES[op], 2 if attrs.get("direction") == "bidirectional" else 1
    layout = attrs.get("layout", 0)
    x_shape = [B, T, I] if layout else [T, B, I]
    h_shape = [B, D, H] if layout else [D, B, H]
    f32 = lambda *s: rng.uniform(-1, 1, size=s).astype(np.float32)
    feeds = {"X": f32(*x_shape), "W": f32(D, G * H, I), "R": f32(D, G * H, H)}
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    extra = {"B": lambda: f32(D, 2 * G * H), "sequence_lens": lambda: rng.integers(0, T + 1, size=B).astype(np.int32),
             "initial_h": lambda: f32(*h_shape), "initial_c": lambda: f32(*h_shape), "P": lambda: f32(D, 3 * H)}
    for n in optional:
        feeds[n] = extra[n]()
    if "sequence_lens" in feeds:
        feeds["sequence_lens"][:2] = [T, 0]  # a full row (Y keeps its length) and an empty one
    last = max(names.index(n) for n in feeds)
    node_in = [n if n in feeds else "" for n in names[: last + 1]]
    all_out = ["Y", "Y_h", "Y_c"][: 3 if op == "LSTM" else 2]
    node_out = [n if n in outputs else "" for n in all_out]
    while node_out[-1] == "":
        node_out.pop()
    node = oh.make_node(op, node_in, node_out, hidden_size=H, **attrs)
    elem = {np.dtype(np.float32): TP.FLOAT, np.dtype(np.int32): TP.INT32}
    ins = [oh.make_tensor_value_info(n, elem[a.dtype], a.shape) for n, a in feeds.items()]
    outs = [oh.make_tensor_value_info(n, TP.FLOAT, None) for n in node_out if n]
    model = oh.make_model(oh.make_graph([node], "rnn", ins, outs), opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 8
    return model, feeds, [n for n in node_out if n]


ALL_IN = ("B", "sequence_lens", "initial_h")
CASES = [
    # op, attrs, optional inputs, outputs, opset
    ("RNN", {}, (), ("Y", "Y_h"), 7),
    ("RNN", {"direction": "reverse"}, ALL_IN, ("Y", "Y_h"), 14),
    ("RNN", {"direction": "bidirectional", "layout": 1}, ALL_IN, ("Y", "Y_h"), 14),
    ("RNN", {"direction": "bidirectional", "activations": ["Relu", "Affine"], "activation_alpha": [0.5],
             "activation_beta": [0.25], "clip": 0.8}, ALL_IN, ("Y_h",), 14),
    ("GRU", {}, (), ("Y", "Y_h"), 7),
    ("GRU", {"linear_before_reset": 1}, ALL_IN, ("Y", "Y_h"), 14),
    ("GRU", {"direction": "reverse", "linear_before_reset": 0}, ALL_IN, ("Y",), 14),
    ("GRU", {"direction": "bidirectional", "layout": 1, "linear_before_reset": 1}, ALL_IN, ("Y", "Y_h"), 14),
    ("GRU", {"direction": "bidirectional", "activations": ["HardSigmoid", "Softsign", "Sigmoid", "LeakyRelu"],
             "activation_alpha": [0.3, 0.1], "activation_beta": [0.6], "clip": 1.5}, ALL_IN, ("Y", "Y_h"), 14),
    ("LSTM", {}, (), ("Y", "Y_h", "Y_c"), 7),
    ("LSTM", {"direction": "reverse"}, ALL_IN + ("initial_c", "P"), ("Y", "Y_h", "Y_c"), 14),
    ("LSTM", {"direction": "bidirectional"}, ALL_IN + ("initial_c", "P"), ("Y", "Y_h", "Y_c"), 14),
    ("LSTM", {"direction": "bidirectional", "layout": 1}, ALL_IN + ("initial_c",), ("Y", "Y_h", "Y_c"), 14),
    ("LSTM", {"input_forget": 1, "clip": 0.5}, ALL_IN + ("initial_c", "P"), ("Y", "Y_c"), 14),
    ("LSTM", {"direction": "bidirectional", "activations": ["HardSigmoid", "ScaledTanh", "Elu"] * 2,
              "activation_alpha": [0.2, 0.9, 1.1, 0.3, 0.8, 0.7], "activation_beta": [0.5, 1.2, 0.4, 1.1]},
     ALL_IN + ("initial_c", "P"), ("Y", "Y_h", "Y_c"), 14),
]


def ort_batch_major(model, feeds, tmp_path):
    """onnxruntime refuses layout=1: the layout-0 twin of the node, with the
    inputs and outputs transposed around it."""
    node = model.graph.node[0]
    for a in node.attribute:
        if a.name == "layout":
            a.i = 0
    time_major = {k: (v.transpose(1, 0, 2) if k in ("X", "initial_h", "initial_c") else v) for k, v in feeds.items()}
    for vi in model.graph.input:
        shape = time_major[vi.name].shape
        for k, d in enumerate(vi.type.tensor_type.shape.dim):
            d.dim_value = shape[k]
    path = tmp_path / "time_major.onnx"
    onnx.save(model, str(path))
    outs = ort_run(path, time_major)
    return [o.transpose(2, 0, 1, 3) if o.ndim == 4 else o.transpose(1, 0, 2) for o in outs]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_node(case, tmp_path):
    op, attrs, optional, outputs, opset = case
    model, feeds, out_names = rnn_model(op, 5, 3, 4, 6, attrs, optional, outputs, opset)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    got = kiln_run(path, feeds, out_names, tmp_path)
    want = ort_run(path, feeds) if not attrs.get("layout") else ort_batch_major(model, feeds, tmp_path)
    for n, g, w in zip(out_names, got, want):
        assert g.shape == w.shape, (n, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=n)


MODELS = sorted(GENERATED.glob("*.onnx")) if GENERATED.exists() else []


@pytest.mark.skipif(not MODELS, reason=f"no exported models in {GENERATED}: run tests/models/make_rnn_models.py "
                                       "with a Python that has torch")
@pytest.mark.parametrize("model_path", MODELS, ids=[m.stem for m in MODELS])
def test_exported(model_path, tmp_path):
    data = np.load(model_path.with_suffix(".npz"))
    feeds = {k[3:]: data[k] for k in data.files if k.startswith("in_")}
    model = onnx.load(str(model_path))
    out_names = [o.name for o in model.graph.output]
    got = kiln_run(model_path, feeds, out_names, tmp_path)
    want = ort_run(model_path, feeds)
    for n, g, w in zip(out_names, got, want):
        assert g.shape == w.shape, (n, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{n} against onnxruntime")
        t = data[f"out_{n}"]
        np.testing.assert_allclose(g, t, rtol=1e-3, atol=1e-4, err_msg=f"{n} against torch")


def as_initializers(model, feeds, names=("W", "R", "B")):
    """W, R and B made initializers, as exporters write them: kiln then
    packs R^T once at plan time instead of at every run."""
    g = model.graph
    for n in names:
        if n in feeds:
            g.initializer.append(onnx.numpy_helper.from_array(feeds.pop(n), n))
    keep = [vi for vi in g.input if vi.name not in names]
    del g.input[:]
    g.input.extend(keep)
    return model, feeds


# Sizes that reach each form of the per-step product: hidden sizes whose
# gate columns fill whole 128-column panels (32: LSTM's 4 x 32), leave a
# part panel (GRU's 3 x 40 = 120, LSTM's 4 x 33 = 132), batches of one to
# four rows (kiln's own product) and of six (sgemm); the default
# activations (the fused cell) and others; constant and fed weights.
FAST = [
    # op, T, B, H, attrs, optional inputs, constant weights
    ("LSTM", 9, 1, 32, {}, (), True),
    ("LSTM", 9, 1, 33, {"direction": "bidirectional"}, ("B", "initial_h", "initial_c"), True),
    ("LSTM", 7, 3, 33, {"direction": "reverse"}, ("B", "sequence_lens", "initial_h", "initial_c"), True),
    ("LSTM", 7, 6, 20, {"direction": "bidirectional"}, ("B", "sequence_lens", "initial_h"), True),
    ("LSTM", 6, 2, 33, {}, ("B", "initial_h", "initial_c"), False),
    ("LSTM", 6, 1, 33, {"clip": 0.7}, ("B", "initial_c", "P"), True),
    ("GRU", 9, 1, 40, {"linear_before_reset": 1}, ("B", "initial_h"), True),
    ("GRU", 9, 2, 40, {"linear_before_reset": 1, "direction": "bidirectional"}, ("B", "sequence_lens"), True),
    ("GRU", 9, 1, 40, {}, ("B", "initial_h"), True),
    ("GRU", 7, 6, 21, {"linear_before_reset": 1}, ("B", "initial_h"), True),
    ("GRU", 7, 3, 21, {"direction": "bidirectional"}, ("B", "initial_h"), False),
    ("RNN", 3, 1, 130, {}, ("B", "initial_h"), True),
    ("RNN", 8, 5, 17, {"direction": "bidirectional"}, ("B",), True),
]


@pytest.mark.parametrize("isa", ["native", "AVX2", "SSE41"])
@pytest.mark.parametrize("case", FAST, ids=[f"{c[0]}-{i}" for i, c in enumerate(FAST)])
def test_step_product_forms(case, isa, tmp_path, monkeypatch):
    """The recurrences against onnxruntime on each form of the per-step
    product and of the gate arithmetic, on each vector width kiln builds
    them for (ONEDNN_MAX_CPU_ISA caps kiln's own loops too)."""
    op, T, B, H, attrs, optional, const = case
    if isa != "native":
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    model, feeds, out_names = rnn_model(op, T, B, 11, H, attrs, optional, ("Y", "Y_h", "Y_c"), 14)
    if const:
        model, feeds = as_initializers(model, feeds)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    got = kiln_run(path, feeds, out_names, tmp_path)
    want = ort_run(path, feeds)
    for n, g, w in zip(out_names, got, want):
        assert g.shape == w.shape, (n, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5, err_msg=n)


# Steps shared by two threads (hidden units split near the middle, from 128
# units): LSTM and GRU with linear_before_reset, the fused cell, one to four
# rows, rows that end early, both initial states, reverse; 150 units split
# off the vector width (80 + 70). Bidirectional nodes run a direction a
# thread instead, and 127 units stay on one thread.
SHARED = [
    # op, T, B, H, attrs, optional inputs, split
    ("LSTM", 12, 1, 128, {}, (), True),
    ("LSTM", 12, 3, 150, {"direction": "reverse"}, ("B", "sequence_lens", "initial_h", "initial_c"), True),
    ("LSTM", 9, 4, 128, {"layout": 1}, ("B", "sequence_lens", "initial_h"), True),
    ("GRU", 12, 1, 150, {"linear_before_reset": 1}, ("B", "initial_h"), True),
    ("GRU", 10, 4, 128, {"linear_before_reset": 1}, ("B", "sequence_lens"), True),
    ("GRU", 8, 2, 128, {}, ("B", "initial_h"), False),  # r * h before h's product: not shared
    ("LSTM", 8, 1, 128, {"direction": "bidirectional"}, ("B",), False),
    ("LSTM", 8, 1, 127, {}, ("B",), False),
    ("LSTM", 8, 6, 128, {}, ("B",), False),  # six rows: one sgemm a step
]


@pytest.mark.parametrize("isa", ["native", "AVX2", "SSE41"])
@pytest.mark.parametrize("case", SHARED, ids=[f"{c[0]}-{i}" for i, c in enumerate(SHARED)])
def test_steps_shared_by_two_threads(case, isa, tmp_path):
    """Two threads, every step on both (KILN_STEP_THREADS=0): the node says
    when its steps are shared, its outputs are one thread's bit for bit
    (each unit's product sums over the state in order either way), and
    onnxruntime's within float rounding (larger here than in the small
    cases above: 128 to 150 terms a product, over up to 12 steps)."""
    import os
    op, T, B, H, attrs, optional, split = case
    env = {**os.environ, "KILN_STEP_THREADS": "0"}
    if isa != "native":
        env["ONEDNN_MAX_CPU_ISA"] = isa
    model, feeds, out_names = rnn_model(op, T, B, 11, H, attrs, optional, ("Y", "Y_h", "Y_c"), 14)
    model, feeds = as_initializers(model, feeds)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    log = []
    (tmp_path / "one").mkdir()
    one = kiln_run(path, feeds, out_names, tmp_path / "one", ["--threads", "1"], env)
    got = kiln_run(path, feeds, out_names, tmp_path, ["--threads", "2", "--log-level", "debug"], env, log)
    assert ("each step shared by two threads" in log[0]) == split, log[0]
    want = ort_run(path, feeds) if not attrs.get("layout") else ort_batch_major(model, feeds, tmp_path)
    for n, g, o, w in zip(out_names, got, one, want):
        assert g.shape == w.shape, (n, g.shape, w.shape)
        np.testing.assert_array_equal(g, o, err_msg=n)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=n)
