"""If, Loop and Scan served by the real binary, against onnxruntime.

- PyTorch's scripted control flow as torch.onnx writes it (made by
  tests/models/make_control_models.py, kept in tests/data/control/): a Loop
  over the rows of x whose body reads the Linear's weights from the outer
  graph, an If on the sign of the sum chosen at run time, and a while loop
  with an If nested in its body;
- models made here with onnx.helper: Loop with scan outputs and a trip
  count the caller sends (plans per value), a 0-trip Loop, Scan with reversed
  directions and other axes, an If whose branches differ in shape (its
  condition fed by the caller), an If with a constant condition (inlined);
- branches and bodies that read large weights from the outer graph (an
  LSTM's W, R and B, a MatMul's matrix: bound into the subgraph's plans by
  reference, prepared once), both branches taken in turn and concurrently.
Bad requests get a 400 naming what was wrong, and the server keeps serving."""
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto as TP

from conftest import KilnServer, no_batch_config

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "control"
F = TP.FLOAT


def vi(name, dt, shape):
    return oh.make_tensor_value_info(name, dt, shape)


def model(nodes, ins, outs, inits=(), opset=17):
    m = oh.make_model(oh.make_graph(nodes, "g", ins, outs, list(inits)), opset_imports=[oh.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def loop_scan_model():
    """acc += x * w (w read from the outer graph) for M steps; each step's acc
    stacked as a scan output."""
    body = oh.make_graph(
        [oh.make_node("Mul", ["x", "w"], ["xw"]), oh.make_node("Add", ["acc_in", "xw"], ["acc_out"]),
         oh.make_node("Identity", ["cond_in"], ["cond_out"]), oh.make_node("Identity", ["acc_out"], ["step"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("acc_in", F, None)],
        [vi("cond_out", TP.BOOL, []), vi("acc_out", F, None), vi("step", F, None)])
    node = oh.make_node("Loop", ["M", "", "acc0"], ["acc", "steps"], body=body)
    w = oh.make_tensor("w", F, [3], [0.5, -1.0, 2.0])
    return model([node], [vi("M", TP.INT64, []), vi("acc0", F, [3]), vi("x", F, [3])],
                 [vi("acc", F, [3]), vi("steps", F, None)], [w])


def scan_model():
    """Running sum over axis 1 of x, read backwards; outputs stacked on axis 1, reversed."""
    body = oh.make_graph([oh.make_node("Add", ["s_in", "xs"], ["s_out"]), oh.make_node("Mul", ["s_out", "k"], ["y"])],
                         "body", [vi("s_in", F, [2]), vi("xs", F, [2])], [vi("s_out", F, [2]), vi("y", F, [2])])
    node = oh.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1, scan_input_axes=[1],
                        scan_input_directions=[1], scan_output_axes=[1], scan_output_directions=[1])
    k = oh.make_tensor("k", F, [2], [2.0, 3.0])
    return model([node], [vi("s0", F, [2]), vi("x", F, [2, 5])], [vi("s", F, [2]), vi("ys", F, [2, 5])], [k])


def if_shapes_model():
    """then: x (shape [4]); else: x[:2] (shape [2]); the caller sends the condition."""
    then_g = oh.make_graph([oh.make_node("Identity", ["x"], ["t"])], "then", [], [vi("t", F, None)])
    starts = oh.make_tensor("st", TP.INT64, [1], [0])
    ends = oh.make_tensor("en", TP.INT64, [1], [2])
    else_g = oh.make_graph([oh.make_node("Slice", ["x", "st", "en"], ["e"])], "else", [], [vi("e", F, None)],
                           [starts, ends])
    node = oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    return model([node], [vi("c", TP.BOOL, []), vi("x", F, [4])], [vi("y", F, None)])


def if_const_model():
    """A shape check as exporters write it: If(Shape(x)[0] == 3) around a Relu."""
    then_g = oh.make_graph([oh.make_node("Relu", ["x"], ["t"])], "then", [], [vi("t", F, None)])
    else_g = oh.make_graph([oh.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", F, None)])
    three = oh.make_tensor("three", TP.INT64, [1], [3])
    nodes = [oh.make_node("Shape", ["x"], ["sh"], end=1), oh.make_node("Equal", ["sh", "three"], ["eq"]),
             oh.make_node("Squeeze", ["eq"], ["c"]),
             oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    return model(nodes, [vi("x", F, [3, 4])], [vi("y", F, [3, 4])], [three])


def if_weights_model():
    """then: an LSTM (hidden 128) over x [T, 1, 64] whose W, R, B are outer
    initializers; else: Tanh(x @ V) with V [64, 128] outer too. Both give
    [T, 1, 128]."""
    rng = np.random.default_rng(11)
    w = oh.make_tensor("W", F, [1, 512, 64], (0.1 * rng.standard_normal(512 * 64)).astype(np.float32))
    r = oh.make_tensor("R", F, [1, 512, 128], (0.1 * rng.standard_normal(512 * 128)).astype(np.float32))
    b = oh.make_tensor("B", F, [1, 1024], (0.1 * rng.standard_normal(1024)).astype(np.float32))
    v = oh.make_tensor("V", F, [64, 128], (0.1 * rng.standard_normal(64 * 128)).astype(np.float32))
    then_g = oh.make_graph([oh.make_node("LSTM", ["x", "W", "R", "B"], ["ys"], hidden_size=128),
                            oh.make_node("Squeeze", ["ys", "one"], ["t"])], "then", [], [vi("t", F, None)],
                           [oh.make_tensor("one", TP.INT64, [1], [1])])
    else_g = oh.make_graph([oh.make_node("MatMul", ["x", "V"], ["m"]), oh.make_node("Tanh", ["m"], ["e"])],
                           "else", [], [vi("e", F, None)])
    node = oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    return model([node], [vi("c", TP.BOOL, []), vi("x", F, [6, 1, 64])], [vi("y", F, [6, 1, 128])], [w, r, b, v])


def loop_weights_model():
    """acc = Tanh(acc @ U) M times, U [96, 96] an outer initializer."""
    u = oh.make_tensor("U", F, [96, 96], (0.15 * np.random.default_rng(12).standard_normal(96 * 96)).astype(np.float32))
    body = oh.make_graph(
        [oh.make_node("MatMul", ["acc_in", "U"], ["m"]), oh.make_node("Tanh", ["m"], ["acc_out"]),
         oh.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("acc_in", F, None)],
        [vi("cond_out", TP.BOOL, []), vi("acc_out", F, None)])
    node = oh.make_node("Loop", ["M", "", "acc0"], ["acc"], body=body)
    return model([node], [vi("M", TP.INT64, []), vi("acc0", F, [2, 96])], [vi("acc", F, [2, 96])], [u])


MADE = {"loop_scan": loop_scan_model, "if_weights": if_weights_model, "loop_weights": loop_weights_model, "scan_rev": scan_model, "if_shapes": if_shapes_model,
        "if_const": if_const_model}
TORCH = {"control_loop_if": "control_loop_if.onnx", "control_while": "control_while.onnx"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("control")
    repo = root / "repo"
    paths = {}
    for name, make in MADE.items():
        (repo / name / "1").mkdir(parents=True)
        onnx.save(make(), str(repo / name / "1" / "model.onnx"))
        paths[name] = repo / name / "1" / "model.onnx"
    for name, f in TORCH.items():
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(DATA / f, repo / name / "1" / "model.onnx")
        paths[name] = repo / name / "1" / "model.onnx"
    for name in paths:  # no batching: a leading dim here is steps or rows, not requests
        (repo / name / "config.json").write_text(json.dumps(no_batch_config(paths[name])))
    s = KilnServer(repo)
    yield s, paths
    rc = s.stop()
    assert s.sanitizer_report() is None, s.sanitizer_report()
    assert rc == 0, s.text()


DT = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.bool_): "BOOL"}


def infer(url, name, feeds):
    c = httpclient.InferenceServerClient(url)
    try:
        ins = []
        for k, a in feeds.items():
            i = httpclient.InferInput(k, list(a.shape), DT[a.dtype])
            i.set_data_from_numpy(a)
            ins.append(i)
        r = c.infer(name, ins)
        return {o["name"]: r.as_numpy(o["name"]) for o in r.get_response()["outputs"]}
    finally:
        c.close()


def check(served, name, feeds):
    s, paths = served
    got = infer(s.url, name, feeds)
    sess = ort.InferenceSession(str(paths[name]), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    for o, w in zip(sess.get_outputs(), want):
        assert got[o.name].shape == w.shape, (name, o.name, got[o.name].shape, w.shape)
        np.testing.assert_allclose(got[o.name], w, rtol=1e-5, atol=1e-6, err_msg=f"{name}:{o.name}")
    return got


RNG = np.random.default_rng(7)


@pytest.mark.parametrize("steps", [1, 5, 12])
def test_torch_loop_and_if(served, steps):
    x = RNG.standard_normal((steps, 8)).astype(np.float32)
    check(served, "control_loop_if", {"x": x})
    check(served, "control_loop_if", {"x": -np.abs(x)})  # the other branch of the If


@pytest.mark.parametrize("scale,bound", [(10.0, 1.0), (0.01, 1.0), (1000.0, 0.0)])
def test_torch_while_with_nested_if(served, scale, bound):
    h = (RNG.standard_normal((4, 3)) * scale).astype(np.float32)
    check(served, "control_while", {"h": h, "bound": np.array(bound, np.float32)})


def test_loop_zero_trips(served):
    # onnxruntime gives a 0-trip scan output the shape {0} (it warns that it
    # does not know the body's shape); kiln plans the body and gives [0, 3].
    s, _ = served
    got = infer(s.url, "loop_scan", {"M": np.array(0, np.int64), "acc0": np.full(3, 2.0, np.float32),
                                     "x": np.ones(3, np.float32)})
    np.testing.assert_array_equal(got["acc"], np.full(3, 2.0, np.float32))
    assert got["steps"].shape == (0, 3)


@pytest.mark.parametrize("m", [1, 4, 9])
def test_loop_scan_outputs_trip_count_from_caller(served, m):
    got = check(served, "loop_scan", {"M": np.array(m, np.int64), "acc0": np.ones(3, np.float32),
                                      "x": np.array([1, 2, 3], np.float32)})
    assert got["steps"].shape == (m, 3)


def test_scan_reverse_axes(served):
    check(served, "scan_rev", {"s0": np.zeros(2, np.float32), "x": RNG.standard_normal((2, 5)).astype(np.float32)})


@pytest.mark.parametrize("c", [True, False])
def test_if_branches_of_different_shapes(served, c):
    got = check(served, "if_shapes", {"c": np.array(c), "x": np.arange(4, dtype=np.float32)})
    assert got["y"].shape == ((4,) if c else (2,))


def test_if_constant_condition(served):
    # Folded at load (the branch replaces the If; test_onnx_load checks the graph).
    got = check(served, "if_const", {"x": RNG.standard_normal((3, 4)).astype(np.float32)})
    assert (got["y"] >= 0).all()


def test_bad_input_then_serves(served):
    s, _ = served
    with pytest.raises(Exception) as e:
        infer(s.url, "loop_scan", {"M": np.array([1.0, 2.0], np.float32), "acc0": np.ones(3, np.float32),
                                   "x": np.ones(3, np.float32)})
    assert "M" in str(e.value)
    check(served, "loop_scan", {"M": np.array(2, np.int64), "acc0": np.ones(3, np.float32),
                                "x": np.ones(3, np.float32)})


def test_if_branches_read_outer_weights(served):
    """Each branch reads large outer initializers (bound by reference into
    its plans); the branches alternate, then run from eight clients at once
    (each If lane plans its own copy)."""
    from concurrent.futures import ThreadPoolExecutor
    xs = [RNG.standard_normal((6, 1, 64)).astype(np.float32) for _ in range(4)]
    for k in range(6):
        check(served, "if_weights", {"c": np.array(k % 2 == 0), "x": xs[k % 4]})
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda k: check(served, "if_weights", {"c": np.array(k % 3 != 0), "x": xs[k % 4]}), range(32)))


@pytest.mark.parametrize("m", [1, 3, 7])
def test_loop_body_reads_outer_weights(served, m):
    check(served, "loop_weights", {"M": np.array(m, np.int64),
                                   "acc0": RNG.standard_normal((2, 96)).astype(np.float32)})
