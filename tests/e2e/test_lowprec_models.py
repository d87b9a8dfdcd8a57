"""Quantized models as onnxruntime.quantization writes them: a small
convolutional network quantized with quantize_static in QDQ format, its
weights in int4 or uint4 (per tensor and per channel) or float8e4m3fn, its
activations in uint8, int16 or float8e4m3fn. kiln serves each over HTTP
(FP32 in and out; the low-precision tensors live inside the graph) and its
answers are compared with onnx's reference evaluator on the same file. A
model whose output is int4 has no KServe datatype: it is refused at load
with a message naming the tensor, and the server keeps serving the others."""
import numpy as np
import onnx
import onnx.helper as oh
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto as TP
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

quantization = pytest.importorskip("onnxruntime.quantization")
QuantType, QuantFormat = quantization.QuantType, quantization.QuantFormat

# name: (weight_type, activation_type, per_channel, low-precision dtype expected inside)
CASES = {
    "w_int4": (QuantType.QInt4, QuantType.QUInt8, False, TP.INT4),
    "w_uint4_per_channel": (QuantType.QUInt4, QuantType.QUInt8, True, TP.UINT4),
    "w_int4_a_int16": (QuantType.QInt4, QuantType.QInt16, True, TP.INT4),
    "float8": (QuantType.QFLOAT8E4M3FN, QuantType.QFLOAT8E4M3FN, False, TP.FLOAT8E4M3FN),
}


def float_model(rng):
    """x[N,1,8,8] -> Conv(4, 3x3) -> Relu -> flatten -> MatMul(144 x 10) + B -> y[N,10]."""
    wc = (rng.standard_normal((4, 1, 3, 3)) * 0.5).astype(np.float32)
    bc = (rng.standard_normal(4) * 0.1).astype(np.float32)
    wf = (rng.standard_normal((144, 10)) * 0.2).astype(np.float32)
    bf = (rng.standard_normal(10) * 0.1).astype(np.float32)
    g = oh.make_graph(
        [oh.make_node("Conv", ["x", "WC", "BC"], ["c"]), oh.make_node("Relu", ["c"], ["r"]),
         oh.make_node("Reshape", ["r", "shape"], ["f"]), oh.make_node("MatMul", ["f", "WF"], ["m"]),
         oh.make_node("Add", ["m", "BF"], ["y"])],
        "cnn", [oh.make_tensor_value_info("x", TP.FLOAT, ["N", 1, 8, 8])],
        [oh.make_tensor_value_info("y", TP.FLOAT, ["N", 10])],
        [numpy_helper.from_array(wc, "WC"), numpy_helper.from_array(bc, "BC"), numpy_helper.from_array(wf, "WF"),
         numpy_helper.from_array(bf, "BF"), numpy_helper.from_array(np.array([-1, 144], np.int64), "shape")])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 21)])
    m.ir_version = 10
    return m


class Calibration(quantization.CalibrationDataReader):
    def __init__(self, rng):
        self.batches = iter([{"x": rng.standard_normal((4, 1, 8, 8)).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self.batches, None)


def quantize(src, dst, case):
    wt, at, per_channel, _ = CASES[case]
    extra = {}
    if at == QuantType.QFLOAT8E4M3FN:
        extra["calibrate_method"] = quantization.CalibrationMethod.Distribution
    quantization.quantize_static(str(src), str(dst), Calibration(np.random.default_rng(1)),
                                 quant_format=QuantFormat.QDQ, weight_type=wt, activation_type=at,
                                 per_channel=per_channel, **extra)
    return onnx.load(str(dst))


@pytest.fixture(scope="module")
def qrepo(tmp_path_factory):
    root = tmp_path_factory.mktemp("lowprec")
    src = root / "float.onnx"
    onnx.save(float_model(np.random.default_rng(0)), str(src))
    models = {}
    for case in CASES:
        d = root / "repo" / case / "1"
        d.mkdir(parents=True)
        models[case] = quantize(src, d / "model.onnx", case)
    # y_q: the last quantized activation as an int4 output, which no KServe datatype carries
    bad = onnx.load(str(src))
    bad.graph.node.append(oh.make_node("QuantizeLinear", ["y", "ys"], ["y_q"], output_dtype=TP.INT4))
    bad.graph.initializer.append(numpy_helper.from_array(np.array(0.1, np.float32), "ys"))
    bad.graph.output.append(oh.make_tensor_value_info("y_q", TP.INT4, ["N", 10]))
    (root / "repo" / "int4_out" / "1").mkdir(parents=True)
    onnx.save(bad, str(root / "repo" / "int4_out" / "1" / "model.onnx"))
    return root / "repo", models


@pytest.mark.parametrize("case", list(CASES))
def test_quantized_model_matches_reference(make_server, qrepo, case):
    repo, models = qrepo
    model = models[case]
    want_dt = CASES[case][3]
    inits = {t.name: t for t in model.graph.initializer}
    assert any(t.data_type == want_dt for t in inits.values()), f"{case}: no {TP.DataType.Name(want_dt)} initializer"
    s = make_server(repo)
    c = httpclient.InferenceServerClient(s.url)
    assert c.is_model_ready(case), s.text()
    ref = ReferenceEvaluator(model)
    # The output is DequantizeLinear's: multiples of its scale. An activation
    # a rounding tie away from the reference's moves it by one step at most.
    last = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "y"][0]
    step = float(np.max(numpy_helper.to_array(inits[last.input[1]]).astype(np.float32)))
    rng = np.random.default_rng(7)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 1, 8, 8)).astype(np.float32)
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        got = c.infer(case, [inp]).as_numpy("y")
        want = ref.run(None, {"x": x})[0]
        assert got.shape == want.shape and got.dtype == np.float32
        diff = np.abs(got - want)
        assert float(diff.max()) <= step * 1.001 + 1e-6, (case, float(diff.max()), step)
        exact = np.mean(diff <= 1e-5 + 1e-6 * np.abs(want))
        assert exact >= 0.9, (case, exact)
    c.close()


def test_lowprec_io_refused_at_load(make_server, qrepo):
    repo, _ = qrepo
    s = make_server(repo)
    c = httpclient.InferenceServerClient(s.url)
    assert not c.is_model_ready("int4_out")
    index = {m["name"]: m for m in c.get_model_repository_index()}
    reason = index["int4_out"]["reason"]
    assert "'y_q'" in reason and "int4" in reason and "KServe" in reason, reason
    with pytest.raises(httpclient.InferenceServerException):
        c.load_model("int4_out")
    # the server goes on serving the models it could load
    x = np.zeros((1, 1, 8, 8), np.float32)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    assert c.infer("w_int4", [inp]).as_numpy("y").shape == (1, 10)
    c.close()
