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
  keeps it unfused): exact;
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
from tritonclient.utils import np_to_triton_dtype

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
}


def with_int_outputs(model):
    """model with every MatMulInteger's int32 sums as graph outputs too."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for n in m.graph.node:
        if n.op_type == "MatMulInteger":
            m.graph.output.append(onnx.helper.make_tensor_value_info(n.output[0], onnx.TensorProto.INT32, None))
    return m


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
    models = {}
    for name in FEEDS:
        base = onnx.load(str(DYNQ / f"{name}.onnx"))
        models[name] = base
        models[name + "_int"] = with_int_outputs(base)
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
                if w.dtype == np.int32:
                    np.testing.assert_array_equal(g, w, err_msg=f"{name}/{k}")
                else:
                    scale = max(1.0, float(np.abs(w).max()))
                    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * scale, err_msg=f"{name}/{k}")
    client.close()
    # The fusion ran: the float models' products became single nodes (13 in
    # the BERT, 3 in the MLP); the models that show the int32 sums keep
    # their MatMulIntegers.
    counts = sorted(int(c) for c in re.findall(r"(\d+) dynamically quantized products", s.text()))
    assert 13 in counts and 3 in counts, counts
    assert 0 in counts, counts
