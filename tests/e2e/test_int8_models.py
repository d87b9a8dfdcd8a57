"""INT8 CNNs as onnxruntime.quantization's quantize_static writes them in
QDQ format (a seeded calibration set), served by the real binary and
compared with ONNX's reference evaluator: a small ResNet (BasicBlocks,
residual Adds, MaxPool) and a small MobileNetV2 (depthwise convolutions,
inverted residuals), with uint8 and int8 activations, per-channel and
per-tensor weights. kiln rewrites DequantizeLinear -> Conv -> QuantizeLinear
into integer convolutions (oneDNN's int8 primitives), which round once where
the float graph rounds a float result: every output stays within one step of
its quantization of the reference. Run at oneDNN's widest ISA and capped at
AVX2 (its int8 code differs per ISA)."""
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from conftest import onnx_reference
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[2]
QUANT = ROOT / "tests" / "data" / "quant"  # tests/models/make_int8_cnn_models.py

CASES = [("resnet_tiny", "u8", True), ("resnet_tiny", "s8", True), ("mobilenet_tiny", "u8", False)]


def quantize(src, dst, act, per_channel, fmt="QDQ", ops=None):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.it = iter([{"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=getattr(QuantFormat, fmt), per_channel=per_channel,
                    activation_type=QuantType.QUInt8 if act == "u8" else QuantType.QInt8,
                    weight_type=QuantType.QInt8, op_types_to_quantize=ops)
    return onnx.load(str(dst))


def reference(model, x):
    return onnx_reference(model, {"input": x})[0]


@pytest.mark.parametrize("isa", ["default", "AVX2"])
@pytest.mark.parametrize("name,act,per_channel", CASES, ids=[f"{n}-{a}-{'pc' if p else 'pt'}" for n, a, p in CASES])
def test_qdq_cnn_matches_reference(make_server, tmp_path, name, act, per_channel, isa):
    model = quantize(QUANT / f"{name}.onnx", tmp_path / "q.onnx", act, per_channel)
    d = tmp_path / "repo" / name / "1"
    d.mkdir(parents=True)
    onnx.save(model, str(d / "model.onnx"))
    env = {} if isa == "default" else {"ONEDNN_MAX_CPU_ISA": isa}
    s = make_server(tmp_path / "repo", "--log-level", "debug", env=env)
    # The QDQ pass ran (Convs become integer convolutions where oneDNN's
    # int8 kernels have VNNI; Adds and pools everywhere).
    m = re.search(r"(\d+) quantized operators", s.text())
    assert m and int(m.group(1)) > 0, s.text()[-3000:]
    if isa == "AVX2":
        # Without VNNI the Convs stay float, and each one's
        # QuantizeLinear -> DequantizeLinear becomes its activation.
        m = re.search(r"(\d+) quantization round trips in float convolutions", s.text())
        assert m and int(m.group(1)) > 0, s.text()[-3000:]
    m = re.search(r"(\d+) on NHWC", s.text())
    if m and int(m.group(1)) > 0:
        # Integer convolutions on NHWC: the pools between and after them
        # read those bytes as they are (no reorder to NCHW).
        ops = set(re.findall(r"QDQ: (\w+) '[^']*' reads NHWC bytes", s.text()))
        assert "QLinearGlobalAveragePool" in ops, s.text()[-3000:]
        if name == "resnet_tiny":
            assert "MaxPool" in ops, s.text()[-3000:]
    client = httpclient.InferenceServerClient(s.url)
    # The logits are dequantized from the last QuantizeLinear: its scale is
    # one step.
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    last = next(n for n in model.graph.node if n.output[0] == "logits")
    step = float(inits[last.input[1]])
    rng = np.random.default_rng(7)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer(name, [inp]).as_numpy("logits")
        want = reference(model, x)
        assert got.shape == want.shape
        err = np.abs(got - want).max()
        assert err <= step * 1.0001, (batch, err / step)


@pytest.mark.parametrize("isa", ["default", "AVX2", "SSE41"])
@pytest.mark.parametrize("name,act,per_channel", CASES, ids=[f"{n}-{a}-{'pc' if p else 'pt'}" for n, a, p in CASES])
def test_qoperator_cnn_matches_reference(make_server, tmp_path, name, act, per_channel, isa):
    """The same CNNs with their Convs in QOperator format (QLinearConv, as
    the ONNX model zoo's INT8 models have them; the rest stays float, as
    onnx's evaluator has none of com.microsoft's QLinear ops). Without VNNI
    oneDNN's int8 convolution would saturate on full-range weights, so
    QLinearConv sums exactly there: the 8-bit GEMM of ConvInteger for group
    1, the exact loop for the depthwise ones. Within one step of the
    reference, as above."""
    model = quantize(QUANT / f"{name}.onnx", tmp_path / "q.onnx", act, per_channel, "QOperator", ["Conv"])
    assert any(n.op_type == "QLinearConv" for n in model.graph.node)
    d = tmp_path / "repo" / name / "1"
    d.mkdir(parents=True)
    onnx.save(model, str(d / "model.onnx"))
    env = {} if isa == "default" else {"ONEDNN_MAX_CPU_ISA": isa}
    s = make_server(tmp_path / "repo", env=env)
    client = httpclient.InferenceServerClient(s.url)
    out = model.graph.output[0].name
    last = next(n for n in model.graph.node if n.output[0] == out)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    step = float(inits[last.input[1]]) if last.op_type == "DequantizeLinear" else 0.0
    rng = np.random.default_rng(11)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer(name, [inp]).as_numpy(out)
        want = reference(model, x)
        assert got.shape == want.shape
        err = np.abs(got.astype(np.float64) - want).max()
        assert err <= step * 1.0001 + 1e-6, (batch, err, step)
    client.close()
