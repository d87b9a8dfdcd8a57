"""Cast and CastLike between STRING and every numeric dtype, both ways, in
the real kiln through tritonclient (HTTP and gRPC), side by side with
onnxruntime running the same model bytes on the same inputs.

Models, one per dtype and direction, each a node named "cast":
  to_<t>      x <t> [-1] -> Cast(to=STRING) -> y STRING
  from_<t>    s STRING [-1] -> Cast(to=<t>) -> y <t>
  like_to_<t>, like_from_<t>  the same through CastLike and a constant target
The dtypes that KServe has no datatype for (the float8s, int4, uint4) travel
as FP32 around them: x FP32 -> Cast(<t>) -> Cast(STRING), and s -> Cast(<t>)
-> Cast(FLOAT); the float8s with saturate 1 and 0. bfloat16 travels as BF16
(ml_dtypes arrays): kiln computes a graph's inner FP16/BF16 values in FP32
(models/lower_fp16.c), so only a graph input or output keeps bfloat16's
rounding. onnxruntime's Python binding takes no bfloat16 array, so its copy
of a bfloat16 model reads FLOAT and casts it (exactly) to bfloat16, and
casts a bfloat16 output (exactly) to FLOAT.

The numbers are the extremes (NaN of both signs, the infinities, -0, the
smallest subnormal, each integer dtype's min and max, 1e20 into a half); the
strings are every form strtod and strtoll read (white space, signs, hex,
"12abc", "NaN", "-INFINITY", out-of-range integers that wrap). A string that
onnxruntime refuses (no number, beyond int64/uint64/double) is sent alone to
kiln, which must answer 400 naming the node and the element, and keep serving.

simple_string is Triton's example model rebuilt with onnx.helper (two BYTES
inputs of decimal strings, Cast to INT32, Add and Sub, Cast back), served
with its config.pbtxt and driven as simple_http_string_infer_client.py does.
"""
import json

import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto as TP
from tritonclient.utils import InferenceServerException

from conftest import no_batch_config, serving

OPSET = 21
ort.set_default_logger_severity(4)  # the refusals below are expected, not worth a log line each
# dtype -> (numpy dtype on the wire, the values sent)
FLOATS = [0.1, 1e-7, 1e20, -0.0, 0.0, float("nan"), float("-nan"), float("inf"), float("-inf"), 1.0, 1.5, -2.25,
          1 / 3, 100.0, 1e8, 12345678.0, 123456789.0, 3.4e38, 1e-45, 65504.0, 1e-40, 448.0, 1000.0, -3.0, 7.0]


def _ints(dt):
    i = np.iinfo(dt)
    return np.array([i.min, i.max, 0, 1, 42, i.max // 3, i.min // 7], dt)


np.seterr(over="ignore")  # float16's inf from 1e20 is meant
NUMERIC = {
    "float": (TP.FLOAT, np.array(FLOATS, np.float32)),
    "double": (TP.DOUBLE, np.array(FLOATS + [1e300, 5e-324, 0.1 + 0.2, -1.7976931348623157e308], np.float64)),
    "float16": (TP.FLOAT16, np.array(FLOATS, np.float64).astype(np.float16)),  # 1e20, 3.4e38 become inf
    "int8": (TP.INT8, _ints(np.int8)), "uint8": (TP.UINT8, _ints(np.uint8)),
    "int16": (TP.INT16, _ints(np.int16)), "uint16": (TP.UINT16, _ints(np.uint16)),
    "int32": (TP.INT32, _ints(np.int32)), "uint32": (TP.UINT32, _ints(np.uint32)),
    "int64": (TP.INT64, _ints(np.int64)), "uint64": (TP.UINT64, _ints(np.uint64)),
    "bool": (TP.BOOL, np.array([True, False, True])),
    "bfloat16": (TP.BFLOAT16, np.array(FLOATS, np.float32).astype(ml_dtypes.bfloat16)),
}
# Dtypes that travel as FP32 around the cast: name -> (dtype, saturate or None)
VIA_FLOAT = {"int4": (TP.INT4, None), "uint4": (TP.UINT4, None)}
for _n, _t in [("e4m3fn", TP.FLOAT8E4M3FN), ("e4m3fnuz", TP.FLOAT8E4M3FNUZ), ("e5m2", TP.FLOAT8E5M2),
               ("e5m2fnuz", TP.FLOAT8E5M2FNUZ)]:
    VIA_FLOAT[f"float8{_n}_sat"] = (_t, 1)
    VIA_FLOAT[f"float8{_n}_nosat"] = (_t, 0)

LOWBIT_INTS = [0, 1, -1, 7, -8, 8, 15, 16, 1000, -3, 100, -100, 1e20, float("nan")]
LOWBIT_STRINGS = [" 12", "+7", "-7", "0x10", "0x1p3", "1e3", "12abc", "nan", "-inf", "1e20", "1000", "-3", "7",
                  "16777217", "-8", "15", "16", "-0", "abc", "", "1e309"]
INT_STRINGS = [" 12", "12 ", "+7", "-7", "0x10", "1e3", "12abc", "1.9", "-1.9", " \t\n5", "\t5\n", "007", "1_0",
               "3000000000", "-1", "0", "127", "128", "-129", "65535", "65536", "2147483648", "-2147483649",
               "4294967296", "9223372036854775807", "-9223372036854775808", "9223372036854775808",
               "18446744073709551615", "18446744073709551616", "-18446744073709551615", "99999999999999999999",
               "abc", "", " ", "-", "+", "nan", "inf", "true", "5\x006", "\x005"]
FLOAT_STRINGS = [" 1.5", "1.5 ", "+7", "-7", "0x10", "0x1p-3", "1e3", "12abc", "nan", "NaN", "-nan", "NAN(123)",
                 "inf", "INF", "-inf", "Infinity", "-INFINITY", "1e39", "1e-39", "1e-50", "-1e-50", "1e309",
                 "-1e309", "1e-320", "1e-310", "0.1", "3.4028235e38", "3.4028236e38", ".5", "5.", "1,5", "\t2\n",
                 "1e", "-0", "65504", "65520", "1e20", "500", "20", "16777217", "abc", "", ".", "e5", "x1"]


def _cast(src, dst, name="cast", **attrs):
    return oh.make_node("Cast", [src], [dst], name=name, to=attrs.pop("to"), **attrs)


def _model(nodes, inputs, outputs, inits=()):
    g = oh.make_graph(nodes, "cast", inputs, outputs, list(inits))
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", OPSET)])
    m.ir_version = 10
    return m


def _vi(name, t):
    return oh.make_tensor_value_info(name, t, [-1])


def _like_const(name, t):
    if t == TP.STRING:
        return oh.make_tensor(name, TP.STRING, [1], [b"0"])
    return oh.make_tensor(name, t, [1], [0])


def build_models():
    """name -> (ModelProto, input dtype on the wire, output dtype on the wire)."""
    ms = {}
    for n, (t, _) in NUMERIC.items():
        ms[f"to_{n}"] = (_model([_cast("x", "y", to=TP.STRING)], [_vi("x", t)], [_vi("y", TP.STRING)]), t, TP.STRING)
        ms[f"from_{n}"] = (_model([_cast("s", "y", to=t)], [_vi("s", TP.STRING)], [_vi("y", t)]), TP.STRING, t)
        ms[f"like_to_{n}"] = (_model([oh.make_node("CastLike", ["x", "like"], ["y"], name="cast")], [_vi("x", t)],
                                     [_vi("y", TP.STRING)], [_like_const("like", TP.STRING)]), t, TP.STRING)
        ms[f"like_from_{n}"] = (_model([oh.make_node("CastLike", ["s", "like"], ["y"], name="cast")],
                                       [_vi("s", TP.STRING)], [_vi("y", t)], [_like_const("like", t)]), TP.STRING, t)
    for n, (t, sat) in VIA_FLOAT.items():
        kw = {} if sat is None else {"saturate": sat}
        ms[f"to_{n}"] = (_model([_cast("x", "m", name="narrow", to=t, **kw), _cast("m", "y", to=TP.STRING)],
                                [_vi("x", TP.FLOAT)], [_vi("y", TP.STRING)]), TP.FLOAT, TP.STRING)
        ms[f"from_{n}"] = (_model([_cast("s", "m", to=t, **kw), _cast("m", "y", name="widen", to=TP.FLOAT)],
                                  [_vi("s", TP.STRING)], [_vi("y", TP.FLOAT)]), TP.STRING, TP.FLOAT)
    return ms


def simple_string_model():
    nodes = [oh.make_node("Cast", ["INPUT0"], ["_INPUT0"], to=TP.INT32),
             oh.make_node("Cast", ["INPUT1"], ["_INPUT1"], to=TP.INT32),
             oh.make_node("Add", ["_INPUT0", "_INPUT1"], ["CAST0"]),
             oh.make_node("Sub", ["_INPUT0", "_INPUT1"], ["CAST1"]),
             oh.make_node("Cast", ["CAST0"], ["OUTPUT0"], to=TP.STRING),
             oh.make_node("Cast", ["CAST1"], ["OUTPUT1"], to=TP.STRING)]
    vi = lambda n: oh.make_tensor_value_info(n, TP.STRING, [None, 16])  # noqa: E731
    return _model(nodes, [vi("INPUT0"), vi("INPUT1")], [vi("OUTPUT0"), vi("OUTPUT1")])


SIMPLE_STRING_CONFIG = """name: "simple_string"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_STRING dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_STRING dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 16 ] }
]
"""

MODELS = build_models()


@pytest.fixture(scope="module")
def cast_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("cast_repo")
    for name, (m, _, _) in MODELS.items():
        d = root / name / "1"
        d.mkdir(parents=True)
        onnx.save(m, str(d / "model.onnx"))
        # [-1] is any length, not a batch: the config lists the whole shapes.
        (root / name / "config.json").write_text(json.dumps(no_batch_config(m)))
    d = root / "simple_string" / "1"
    d.mkdir(parents=True)
    onnx.save(simple_string_model(), str(d / "model.onnx"))
    (root / "simple_string" / "config.pbtxt").write_text(SIMPLE_STRING_CONFIG)
    yield from serving(root)


@pytest.fixture(scope="module")
def clients(cast_server):
    h = httpclient.InferenceServerClient(cast_server.url)
    g = grpcclient.InferenceServerClient(cast_server.grpc_url())
    yield {"http": (httpclient, h), "grpc": (grpcclient, g)}
    h.close()
    g.close()


def _session(m):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


def _ort_copy(m):
    """m with a bfloat16 input read as FLOAT and a bfloat16 output given as FLOAT."""
    r = onnx.ModelProto()
    r.CopyFrom(m)
    g = r.graph
    i, o = g.input[0], g.output[0]
    nodes = [onnx.NodeProto().__class__.FromString(n.SerializeToString()) for n in g.node]
    if i.type.tensor_type.elem_type == TP.BFLOAT16:
        nodes.insert(0, oh.make_node("Cast", [i.name + "_f"], [i.name], to=TP.BFLOAT16))
        i.name += "_f"
        i.type.tensor_type.elem_type = TP.FLOAT
    if o.type.tensor_type.elem_type == TP.BFLOAT16:
        for n in nodes:
            n.output[:] = [v + "_bf" if v == o.name else v for v in n.output]
        nodes.append(oh.make_node("Cast", [o.name + "_bf"], [o.name], to=TP.FLOAT))
        o.type.tensor_type.elem_type = TP.FLOAT
    del g.node[:]
    g.node.extend(nodes)
    return r


def _ort(name, x):
    m = _ort_copy(MODELS[name][0])
    if x.dtype == ml_dtypes.bfloat16:
        x = x.astype(np.float32)
    return _session(m).run(None, {m.graph.input[0].name: x})[0]


def _wire(t):
    return {TP.STRING: "BYTES", TP.FLOAT: "FP32", TP.DOUBLE: "FP64", TP.FLOAT16: "FP16", TP.BOOL: "BOOL",
            TP.INT8: "INT8", TP.UINT8: "UINT8", TP.INT16: "INT16", TP.UINT16: "UINT16", TP.INT32: "INT32",
            TP.UINT32: "UINT32", TP.INT64: "INT64", TP.UINT64: "UINT64", TP.BFLOAT16: "BF16"}[t]


def _kiln(clients, kind, name, x):
    mod, c = clients[kind]
    m, tin, _ = MODELS[name]
    inp = mod.InferInput(m.graph.input[0].name, list(x.shape), _wire(tin))
    if kind == "http":
        inp.set_data_from_numpy(x, binary_data=True)
        r = c.infer(name, [inp], outputs=[mod.InferRequestedOutput("y", binary_data=True)])
    else:
        inp.set_data_from_numpy(x)
        r = c.infer(name, [inp], outputs=[mod.InferRequestedOutput("y")])
    return r.as_numpy("y")


def _bits(a):
    """The array's bytes as unsigned integers: NaN payloads and -0 compare exactly."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _to_string_cases():
    for n, (_, vals) in NUMERIC.items():
        yield f"to_{n}", vals
        yield f"like_to_{n}", vals
    for n in VIA_FLOAT:
        # Two float -> narrow differences that are not the string cast's are
        # left out: a float with a fraction goes to int4 rounded by
        # onnxruntime, truncated by kiln and ONNX's reference (1.5 -> 1); and
        # 65504 goes to float8e5m2 without saturation as NaN in onnxruntime,
        # inf in kiln and ONNX's reference.
        lowbit = n in ("int4", "uint4")
        yield f"to_{n}", np.array(LOWBIT_INTS if lowbit else [v for v in FLOATS if v != 65504.0], np.float32)


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_numbers_to_strings_match_onnxruntime(clients, kind):
    checked = 0
    for name, vals in _to_string_cases():
        want = [s.encode() if isinstance(s, str) else s for s in _ort(name, vals).tolist()]
        got = _kiln(clients, kind, name, vals).tolist()
        assert got == want, f"{name}: kiln {got} != onnxruntime {want}"
        checked += len(want)
    assert checked > 400
    # The forms, spelled out once (onnxruntime's, which the loop above matched).
    got = _kiln(clients, kind, "to_float", np.array([0.1, 1e20, -0.0, np.nan, -np.inf, 1 / 3], np.float32))
    assert got.tolist() == [b"0.1", b"1e+20", b"-0", b"NaN", b"-INF", b"0.33333334"]
    got = _kiln(clients, kind, "to_uint64", np.array([np.iinfo(np.uint64).max], np.uint64))
    assert got.tolist() == [b"18446744073709551615"]
    assert _kiln(clients, kind, "to_bool", np.array([True, False])).tolist() == [b"1", b"0"]


def _ort_accepts(name, s):
    try:
        _ort(name, np.array([s], dtype=object))
        return True
    except Exception:  # onnxruntime throws (stoll, stod) on what it cannot read
        return False


def _from_string_cases():
    for n, (t, _) in NUMERIC.items():
        strs = FLOAT_STRINGS if t in (TP.FLOAT, TP.DOUBLE, TP.FLOAT16, TP.BFLOAT16) else INT_STRINGS
        yield f"from_{n}", strs
        yield f"like_from_{n}", strs
    for n in VIA_FLOAT:
        # Whole numbers only into int4 and uint4 (see _to_string_cases), and
        # 65504 and 65520 left out of the float8s as 65504 is from floats.
        yield f"from_{n}", LOWBIT_STRINGS if n in ("int4", "uint4") else [
            v for v in FLOAT_STRINGS + ["1000", "-3", "7"] if v not in ("65504", "65520")]


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_strings_to_numbers_match_onnxruntime(clients, kind):
    refused = 0
    for name, strs in _from_string_cases():
        ok = [s for s in strs if _ort_accepts(name, s)]
        bad = [s for s in strs if s not in ok]
        x = np.array([s.encode() for s in ok], dtype=object)
        want = _ort(name, np.array(ok, dtype=object))
        got = _kiln(clients, kind, name, x)
        if got.dtype == ml_dtypes.bfloat16:
            got = got.astype(np.float32)
        if name.endswith("bfloat16") or name[5:] in VIA_FLOAT:
            # onnxruntime makes every bfloat16 NaN 0x7fc1 and a float8 NaN a
            # float's positive quiet NaN; kiln keeps a float NaN's top half
            # (sign included) and reads the FNUZ NaN as a negative one. A NaN
            # of a narrow dtype is compared as a NaN.
            nan = np.isnan(want)
            assert (np.isnan(got) == nan).all(), name
            got, want = got[~nan], want[~nan]
        assert got.dtype == want.dtype, name
        assert _bits(got).tolist() == _bits(want).tolist(), f"{name} on {ok}: kiln {got} != onnxruntime {want}"
        if kind == "grpc":
            continue
        # What onnxruntime refuses, kiln refuses too, naming the node and the element.
        for s in bad:
            x = np.array([b"1", s.encode()], dtype=object)
            with pytest.raises(InferenceServerException) as e:
                _kiln(clients, kind, name, x)
            msg = str(e.value)
            assert "'cast'" in msg and "string element 1" in msg, msg
            assert "not a number" in msg or "out of the range" in msg, msg
            assert e.value.status() == "400", (name, s, e.value.status(), msg)
            refused += 1
    if kind == "http":
        assert refused > 100


def test_bad_string_error_and_server_keeps_serving(clients):
    for kind in ("http", "grpc"):
        mod, c = clients[kind]
        with pytest.raises(InferenceServerException) as e:
            _kiln(clients, kind, "from_int32", np.array([b"4", b"5", b"seven"], dtype=object))
        msg = str(e.value)
        assert "node 'cast' (Cast)" in msg and 'string element 2 "seven" is not a number' in msg, msg
        with pytest.raises(InferenceServerException) as e:
            _kiln(clients, kind, "from_uint8", np.array([b"1", b"99999999999999999999"], dtype=object))
        assert 'string element 1 "99999999999999999999" is out of the range of uint64' in str(e.value)
        # Bytes that are not text are shown escaped, a long string cut short.
        with pytest.raises(InferenceServerException) as e:
            _kiln(clients, kind, "from_double", np.array([b"\x01\xff\"x" + b"y" * 100], dtype=object))
        assert 'string element 0 "\\x01\\xff\\"x' in str(e.value) and 'yyy..."' in str(e.value), str(e.value)
        got = _kiln(clients, kind, "from_int32", np.array([b"4", b" -5", b"6abc"], dtype=object))
        assert got.tolist() == [4, -5, 6]
        assert c.is_server_live()


def test_saturate_still_governs_float8(clients):
    """The float8 targets keep saturate's meaning whatever the source: 1e20
    as a float or as a string is the largest finite value with saturate 1,
    inf or NaN with 0."""
    for n, big in [("e4m3fn", 448.0), ("e5m2", 57344.0)]:
        sat = _kiln(clients, "http", f"from_float8{n}_sat", np.array([b"1e20", b"-1e20"], dtype=object))
        assert sat.tolist() == [big, -big]
        nosat = _kiln(clients, "http", f"from_float8{n}_nosat", np.array([b"1e20"], dtype=object))
        assert np.isinf(nosat[0]) if n == "e5m2" else np.isnan(nosat[0])
        s = _kiln(clients, "http", f"to_float8{n}_sat", np.array([1e20], np.float32))
        assert s.tolist() == [f"{big:g}".encode()]


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_simple_string_example(clients, kind):
    """Triton's simple_string example: INPUT0 the strings of 0..15, INPUT1
    sixteen "1"s; OUTPUT0 their sums, OUTPUT1 their differences, as strings.
    INPUT0 goes binary and INPUT1 as JSON, as the example sends them."""
    mod, c = clients[kind]
    in0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    in1 = np.ones((1, 16), dtype=np.int32)
    enc = lambda a: np.array([str(v).encode() for v in a.flatten()], dtype=object).reshape(a.shape)  # noqa: E731
    inputs = [mod.InferInput("INPUT0", [1, 16], "BYTES"), mod.InferInput("INPUT1", [1, 16], "BYTES")]
    if kind == "http":
        inputs[0].set_data_from_numpy(enc(in0), binary_data=True)
        inputs[1].set_data_from_numpy(enc(in1), binary_data=False)
        outputs = [mod.InferRequestedOutput("OUTPUT0", binary_data=True),
                   mod.InferRequestedOutput("OUTPUT1", binary_data=False)]
    else:
        inputs[0].set_data_from_numpy(enc(in0))
        inputs[1].set_data_from_numpy(enc(in1))
        outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    r = c.infer("simple_string", inputs, outputs=outputs)
    out0, out1 = r.as_numpy("OUTPUT0"), r.as_numpy("OUTPUT1")
    assert [int(v) for v in out0.flatten()] == (in0 + in1).flatten().tolist()
    assert [int(v) for v in out1.flatten()] == (in0 - in1).flatten().tolist()
    assert out1[0][0] in (b"-1", "-1")
    # The same model in onnxruntime gives the same strings.
    text = lambda a: np.array([str(v) for v in a.flatten()], dtype=object).reshape(a.shape)  # noqa: E731
    want = _session(simple_string_model()).run(None, {"INPUT0": text(in0), "INPUT1": text(in1)})
    got = [[v.decode() if isinstance(v, bytes) else v for v in o.flatten()] for o in (out0, out1)]
    assert got == [w.flatten().tolist() for w in want]
    # A batch of two requests' worth in one, within max_batch_size 8.
    big = np.concatenate([in0, in0 * 1000 - 7])
    inputs = [mod.InferInput("INPUT0", [2, 16], "BYTES"), mod.InferInput("INPUT1", [2, 16], "BYTES")]
    inputs[0].set_data_from_numpy(enc(big))
    inputs[1].set_data_from_numpy(enc(np.ones((2, 16), np.int32) * -3))
    r = c.infer("simple_string", inputs)
    assert [int(v) for v in r.as_numpy("OUTPUT0").flatten()] == (big - 3).flatten().tolist()


def test_model_metadata_types(clients):
    _, c = clients["http"]
    md = c.get_model_metadata("simple_string")
    assert [i["datatype"] for i in md["inputs"]] == ["BYTES", "BYTES"]
    assert json.dumps(md["outputs"]).count("BYTES") == 2
