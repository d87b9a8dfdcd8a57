"""Dynamically quantized models as onnxruntime.quantization's
quantize_dynamic writes them (tests/models/make_dynq_models.py: a 2-layer
BERT with int8 weights per tensor, an MLP with uint8 weights per output
channel), served by the real binary, called with tritonclient and compared
with ONNX's reference evaluator.

kiln turns each DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul
[-> Add] into one MatMulIntegerToFloat or DynamicQuantizeMatMul, whose int32
sums come from oneDNN's int8 matmul with the zero points taken out
algebraically, and whose float epilogue does the graph's float operations.

Tolerances:
- the int32 sums (every MatMulInteger's output made a graph output, which
  keeps it unfused, with its quantized A): exact, MatMulInteger's
  definition on the A kiln quantized; that A within one step of the
  reference's (a float input a rounding away from a tie);
- float outputs: |kiln - ref| <= 1e-4 * max(1, max |ref|) + 1e-4 * |ref|,
  float32 rounding of other summation orders (LayerNormalization, Softmax,
  the float MatMuls of attention); a wrong integer sum would be off by a
  whole step of x_scale * w_scale times the output's size.
Run at oneDNN's widest ISA and capped at AVX2 (no VNNI: A runs as two
4-bit halves there) and SSE4.1."""
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from onnx import numpy_helper
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from conftest import onnx_reference

ROOT = Path(__file__).resolve().parents[2]
DYNQ = ROOT / "tests" / "data" / "dynq"  # tests/models/make_dynq_models.py


def bert_feeds(rng, batch, seq):
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq // 2:] = 0  # a padded row
    return {"input_ids": rng.integers(0, 500, (batch, seq)).astype(np.int64), "attention_mask": mask,
            "token_type_ids": (rng.random((batch, seq)) < 0.3).astype(np.int64)}


FEEDS = {
    "bert_dyn": lambda rng: [bert_feeds(rng, 1, 9), bert_feeds(rng, 3, 20)],
    "mlp_dyn_u8": lambda rng: [{"x": rng.standard_normal((b, t, 64)).astype(np.float32)} for b, t in [(1, 1), (2, 13)]],
    "cnn_dyn": lambda rng: [{"x": rng.standard_normal(s).astype(np.float32)} for s in [(1, 3, 16, 16), (2, 3, 13, 21)]],
}


def with_int_outputs(model):
    """model with every MatMulInteger's int32 sums and its quantized A and
    zero point (DynamicQuantizeLinear's outputs) as graph outputs too; and
    the products as (sums, A, a_zero_point, B, b_zero_point) names."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    shown, products = set(), []
    for n in m.graph.node:
        if n.op_type in ("MatMulInteger", "ConvInteger"):
            products.append(tuple(n.output[:1]) + tuple(n.input[:4]) + ((n,) if n.op_type == "ConvInteger" else ()))
            for v in (n.output[0], n.input[0], n.input[2]):
                if v not in shown:
                    shown.add(v)
                    t = onnx.TensorProto.INT32 if v == n.output[0] else onnx.TensorProto.UINT8
                    m.graph.output.append(onnx.helper.make_tensor_value_info(v, t, None))
    return m, products


def int_sums(a, za, b, zb):
    """MatMulInteger's definition in int64, wrapped to int32."""
    return ((a.astype(np.int64) - za.astype(np.int64)) @ (b.astype(np.int64) - zb.astype(np.int64))).astype(np.int32)


def conv_sums(node, a, za, b, zb):
    """ConvInteger's definition (onnx's evaluator) on kiln's own quantized A."""
    n = onnx.helper.make_node("ConvInteger", ["a", "b", "za", "zb"], ["y"])
    n.attribute.extend(node.attribute)
    feeds = {"a": a, "b": b, "za": za, "zb": zb}
    g = onnx.helper.make_graph([n], "c", [onnx.helper.make_tensor_value_info(k, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                                          for k, v in feeds.items()],
                               [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.INT32, None)])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)])
    return onnx_reference(m, feeds, ["y"])[0]


def reference(model, feeds):
    names = [o.name for o in model.graph.output]
    return dict(zip(names, onnx_reference(model, feeds, names)))


def infer(client, name, feeds, outputs):
    inputs = []
    for k, a in feeds.items():
        i = httpclient.InferInput(k, list(a.shape), np_to_triton_dtype(a.dtype))
        i.set_data_from_numpy(a, binary_data=True)
        inputs.append(i)
    r = client.infer(name, inputs, outputs=[httpclient.InferRequestedOutput(o, binary_data=True) for o in outputs])
    return {o: r.as_numpy(o) for o in outputs}


@pytest.mark.parametrize("isa", ["default", "AVX2", "SSE41"])
def test_dynamic_quantized_models_match_reference(make_server, tmp_path, isa):
    models, products, inits = {}, {}, {}
    for name in FEEDS:
        base = onnx.load(str(DYNQ / f"{name}.onnx"))
        models[name] = base
        models[name + "_int"], products[name + "_int"] = with_int_outputs(base)
        inits[name + "_int"] = {t.name: numpy_helper.to_array(t) for t in base.graph.initializer}
    for name, m in models.items():
        d = tmp_path / "repo" / name / "1"
        d.mkdir(parents=True)
        onnx.save(m, str(d / "model.onnx"))
    env = {} if isa == "default" else {"ONEDNN_MAX_CPU_ISA": isa}
    s = make_server(tmp_path / "repo", "--log-level", "debug", "--cache-size", "0", env=env)
    client = httpclient.InferenceServerClient(s.url, network_timeout=120)
    rng = np.random.default_rng(3)
    for name, m in models.items():
        base = name.removesuffix("_int")
        outs = [o.name for o in m.graph.output]
        for feeds in FEEDS[base](rng):
            got = infer(client, name, feeds, outs)
            want = reference(m, feeds)
            for k in outs:
                g, w = got[k], want[k]
                assert g.shape == w.shape, (name, k, g.shape, w.shape)
                if w.dtype == np.uint8:  # a quantized A: one step where float rounding decided a tie
                    assert np.abs(g.astype(np.int32) - w).max() <= 1, f"{name}/{k}"
                elif w.dtype != np.int32:
                    scale = max(1.0, float(np.abs(w).max()))
                    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * scale, err_msg=f"{name}/{k}")
            # The int32 sums are exact for the A that kiln quantized.
            for y, a, b, za, zb, *conv in products.get(name, []):
                b_, zb_ = inits[name][b], inits[name][zb] if zb else np.zeros((), np.uint8)
                want_sums = conv_sums(conv[0], got[a], got[za], b_, zb_) if conv else int_sums(got[a], got[za], b_, zb_)
                np.testing.assert_array_equal(got[y], want_sums, err_msg=f"{name}/{y}")
    client.close()
    # The fusion ran: the float models' products became single nodes (13 in
    # the BERT, 3 in the MLP, the CNN's 3 ConvIntegers with their Cast, Mul,
    # bias Add, then its Clip and Relu); the models that show the int32 sums
    # keep their MatMulIntegers and ConvIntegers.
    text = s.text()
    counts = sorted(int(c) for c in re.findall(r"(\d+) dynamically quantized products", text))
    assert 13 in counts and counts.count(3) >= 2, counts
    assert len(re.findall(r"runs as ConvIntegerToFloat with its bias", text)) >= 2
    assert re.search(r"fused Clip '[^']*' into ConvIntegerToFloat", text), "ReLU6 not fused"
    assert 0 in counts, counts


def test_wrong_inner_dim_is_refused_and_serving_goes_on(make_server, tmp_path):
    """An activation whose last dim does not meet the quantized weights is a
    400 that says so; the next, correct request is answered."""
    d = tmp_path / "repo" / "mlp" / "1"
    d.mkdir(parents=True)
    (d / "model.onnx").write_bytes((DYNQ / "mlp_dyn_u8.onnx").read_bytes())
    s = make_server(tmp_path / "repo", "--cache-size", "0")
    client = httpclient.InferenceServerClient(s.url)
    with pytest.raises(InferenceServerException) as e:
        infer(client, "mlp", {"x": np.ones((1, 3, 63), np.float32)}, ["y"])
    assert e.value.status() == "400", e.value
    assert "input 'x'" in str(e.value) and "[1,3,63]" in str(e.value), e.value
    x = np.random.default_rng(1).standard_normal((1, 3, 64)).astype(np.float32)
    got = infer(client, "mlp", {"x": x}, ["y"])["y"]
    want = onnx_reference(onnx.load(str(DYNQ / "mlp_dyn_u8.onnx")), {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    client.close()
