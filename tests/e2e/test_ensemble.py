"""Ensembles (platform "ensemble", ensemble_scheduling): steps of small ONNX
models built here, run in process through each step model's batcher, over
tritonclient.http and tritonclient.grpc.

Step models (FP32, x[N,4] -> [N,4], dynamic batching):
  pre   y = 2x + 1
  neg   a = -y
  sq    b = y * y               (with labels; response_cache where a test asks)
  add   z = a + b               (two inputs)
  look  table[int(y)]           (fails for an index out of range: the failing step)
  nbneg -x without batching     (whole tensors, dims [-1, 4])
  slow  a chain of MatMuls      (requests queue behind it)
Ensembles:
  ens2              pre -> sq                (two steps)
  ens3              pre -> {neg, sq}         (three steps; pre fans out to two independent steps)
  diamond           pre -> {neg, sq} -> add  (four steps, config.pbtxt; intermediate tensors read twice)
  failing           pre -> look -> neg       (the middle step fails for large inputs)
  nobatch_ens       pre, from an ensemble that does not batch
  batch_to_nobatch  pre -> nbneg
"""
import json
import threading
import time

import numpy as np
import onnx.helper as oh
import pytest
from onnx import TensorProto as TP

from conftest import KilnServer, save_model, slow_graph

BATCHED = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 2000}}


def unary(name, nodes, inits=(), out="y"):
    return oh.make_graph(nodes, name, [oh.make_tensor_value_info("x", TP.FLOAT, ["N", 4])],
                         [oh.make_tensor_value_info(out, TP.FLOAT, ["N", 4])], list(inits))


def pre_graph():
    return unary("pre", [oh.make_node("Mul", ["x", "two"], ["t"]), oh.make_node("Add", ["t", "one"], ["y"])],
                 [oh.make_tensor("two", TP.FLOAT, [], [2.0]), oh.make_tensor("one", TP.FLOAT, [], [1.0])])


def neg_graph():
    return unary("neg", [oh.make_node("Neg", ["x"], ["y"])])


def sq_graph():
    return unary("sq", [oh.make_node("Mul", ["x", "x"], ["y"])])


def add_graph():
    return oh.make_graph([oh.make_node("Add", ["a", "b"], ["z"])], "add",
                         [oh.make_tensor_value_info("a", TP.FLOAT, ["N", 4]),
                          oh.make_tensor_value_info("b", TP.FLOAT, ["N", 4])],
                         [oh.make_tensor_value_info("z", TP.FLOAT, ["N", 4])])


def look_graph():
    table = np.arange(8, dtype=np.float32) * 10
    return unary("look", [oh.make_node("Cast", ["x"], ["i"], to=TP.INT64),
                          oh.make_node("Gather", ["table", "i"], ["y"], axis=0)],
                 [oh.make_tensor("table", TP.FLOAT, [8], table)])


def io(name, dtype="TYPE_FP32", dims=(4,)):
    return {"name": name, "data_type": dtype, "dims": list(dims)}


def step(model, inputs, outputs, version=-1):
    return {"model_name": model, "model_version": version, "input_map": inputs, "output_map": outputs}


def ensemble_config(name, steps, inputs, outputs, **extra):
    c = {"name": name, "platform": "ensemble", "max_batch_size": 8, "input": inputs, "output": outputs,
         "ensemble_scheduling": {"step": steps}}
    c.update(extra)
    return json.dumps(c)


def pre_sq(name, **extra):
    """The two-step ensemble: pre then sq, IN -> OUT = (2 IN + 1)^2."""
    return ensemble_config(name, [step("pre", {"x": "IN"}, {"y": "mid"}), step("sq", {"x": "mid"}, {"y": "OUT"})],
                           [io("IN")], [io("OUT")], **extra)


def pre_fanout(name, **extra):
    """The three-step ensemble: pre, then neg and sq on its output at once."""
    return ensemble_config(name, [step("pre", {"x": "IN"}, {"y": "mid"}), step("neg", {"x": "mid"}, {"y": "NEG"}),
                                  step("sq", {"x": "mid"}, {"y": "SQ"})], [io("IN")], [io("NEG"), io("SQ")], **extra)


def write_ensemble(root, name, config, pbtxt=None):
    d = root / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    if pbtxt is not None:
        (d / "config.pbtxt").write_text(pbtxt)
    else:
        (d / "config.json").write_text(config)


def step_models(root, sq_cache=False):
    for name, g in (("pre", pre_graph()), ("neg", neg_graph()), ("add", add_graph()), ("look", look_graph())):
        save_model(root, name, g, config=json.dumps(BATCHED))
    # Labels for classification, which ensembles of sq take from it.
    sq = dict(BATCHED, output=[{"name": "y", "label_filename": "l.txt"}], response_cache={"enable": sq_cache})
    save_model(root, "sq", sq_graph(), config=json.dumps(sq))
    (root / "sq" / "l.txt").write_text("a\nb\nc\nd\n")
    # A model that does not batch: whole tensors of any rows.
    cfg = {"input": [io("x", dims=(-1, 4))], "output": [io("y", dims=(-1, 4))]}
    save_model(root, "nbneg", neg_graph(), config=json.dumps(cfg))


def build(root):
    step_models(root)
    write_ensemble(root, "ens2", pre_sq("ens2"))
    write_ensemble(root, "ens3", pre_fanout("ens3"))
    # The same data flow as config.pbtxt, steps listed out of order.
    write_ensemble(root, "diamond", None, pbtxt="""
name: "diamond"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "MID" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "add" model_version: -1 input_map { key: "a" value: "n" } input_map { key: "b" value: "s" }
      output_map { key: "z" value: "SUM" } },
    { model_name: "neg" model_version: -1 input_map { key: "x" value: "MID" } output_map { key: "y" value: "n" } },
    { model_name: "sq" model_version: -1 input_map { key: "x" value: "MID" } output_map { key: "y" value: "s" } },
    { model_name: "pre" model_version: 1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "MID" } }
  ]
}
""")
    # A non-batching ensemble over a batching step, and the other way.
    write_ensemble(root, "nobatch_ens", ensemble_config(
        "nobatch_ens", [step("pre", {"x": "IN"}, {"y": "OUT"})], [io("IN")], [io("OUT")], max_batch_size=0))
    write_ensemble(root, "batch_to_nobatch", ensemble_config(
        "batch_to_nobatch", [step("pre", {"x": "IN"}, {"y": "mid"}), step("nbneg", {"x": "mid"}, {"y": "OUT"})],
        [io("IN")], [io("OUT")]))
    write_ensemble(root, "failing", ensemble_config(
        "failing", [step("pre", {"x": "IN"}, {"y": "mid"}), step("look", {"x": "mid"}, {"y": "looked"}),
                    step("neg", {"x": "looked"}, {"y": "OUT"})],
        [io("IN")], [io("OUT")]))
    return root


@pytest.fixture(scope="module")
def ens_server(tmp_path_factory):
    root = build(tmp_path_factory.mktemp("ens"))
    s = KilnServer(root, "--model-control-mode", "explicit", "--load-model", "*", "--allow-client-shm")
    s.root = root
    yield s
    rc = s.stop()
    assert s.sanitizer_report() is None, s.sanitizer_report()
    assert rc == 0, s.text()


def clients(srv):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    return [(httpclient, httpclient.InferenceServerClient(srv.url)),
            (grpcclient, grpcclient.InferenceServerClient(srv.grpc_url()))]


def infer(mod, c, model, x, outputs=None, **kw):
    inp = mod.InferInput("IN", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    outs = [mod.InferRequestedOutput(o) for o in outputs] if outputs else None
    return c.infer(model, [inp], outputs=outs, **kw)


def by_hand(mod, c, model, **inputs):
    ins = []
    for name, x in inputs.items():
        i = mod.InferInput(name, list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        ins.append(i)
    return c.infer(model, ins)


def test_answers_equal_steps_run_by_hand(ens_server):
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for mod, c in clients(ens_server):
        try:
            mid = by_hand(mod, c, "pre", x=x).as_numpy("y")
            n = by_hand(mod, c, "neg", x=mid).as_numpy("y")
            s = by_hand(mod, c, "sq", x=mid).as_numpy("y")
            z = by_hand(mod, c, "add", a=n, b=s).as_numpy("z")
            np.testing.assert_allclose(mid, 2 * x + 1, rtol=1e-6)
            r = infer(mod, c, "ens2", x)
            np.testing.assert_array_equal(r.as_numpy("OUT"), s)
            r = infer(mod, c, "ens3", x)
            np.testing.assert_array_equal(r.as_numpy("NEG"), n)
            np.testing.assert_array_equal(r.as_numpy("SQ"), s)
            r = infer(mod, c, "diamond", x)
            np.testing.assert_array_equal(r.as_numpy("SUM"), z)
            np.testing.assert_array_equal(r.as_numpy("MID"), mid)
            # Requested outputs: any one of the ensemble's; the step that
            # leads only to the others (neg) does not run.
            neg_before = int(stats(c, "neg")["inference_count"])
            r = infer(mod, c, "ens3", x, outputs=["SQ"])
            assert r.as_numpy("NEG") is None
            np.testing.assert_array_equal(r.as_numpy("SQ"), s)
            assert int(stats(c, "neg")["inference_count"]) == neg_before
        finally:
            c.close()


def test_batching_and_non_batching_steps(ens_server):
    """A tensor between a model that batches and one that does not: a batch
    of 1 added or dropped, as Triton compares shapes with or without it."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for mod, c in clients(ens_server):
        try:
            r = infer(mod, c, "nobatch_ens", x[0])
            np.testing.assert_array_equal(r.as_numpy("OUT"), 2 * x[0] + 1)
            r = infer(mod, c, "batch_to_nobatch", x)
            np.testing.assert_array_equal(r.as_numpy("OUT"), -(2 * x + 1))
        finally:
            c.close()


def test_metadata_and_config(ens_server):
    import tritonclient.http as httpclient
    c = httpclient.InferenceServerClient(ens_server.url)
    md = c.get_model_metadata("diamond")
    assert [i["name"] for i in md["inputs"]] == ["IN"]
    assert sorted(o["name"] for o in md["outputs"]) == ["MID", "SUM"]
    cfg = c.get_model_config("diamond")
    assert cfg["platform"] == "ensemble"
    assert [s["model_name"] for s in cfg["ensemble_scheduling"]["step"]] == ["add", "neg", "sq", "pre"]
    assert "backend" not in cfg
    c.close()
    # The same over gRPC, as Triton's ModelConfig message.
    import tritonclient.grpc as grpcclient
    g = grpcclient.InferenceServerClient(ens_server.grpc_url())
    gcfg = g.get_model_config("diamond", as_json=True)["config"]
    assert gcfg["platform"] == "ensemble"
    assert gcfg["ensemble_scheduling"]["step"][0]["input_map"] == {"a": "n", "b": "s"}
    assert g.get_model_metadata("diamond", as_json=True)["platform"] == "ensemble"
    g.close()


def test_classification_and_binary_outputs(ens_server):
    import tritonclient.http as httpclient
    c = httpclient.InferenceServerClient(ens_server.url)
    x = np.array([[0.0, 1.0, -3.0, 0.5]], dtype=np.float32)
    inp = httpclient.InferInput("IN", [1, 4], "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    r = c.infer("ens2", [inp], outputs=[httpclient.InferRequestedOutput("OUT", binary_data=False, class_count=2)])
    top = [v.decode() if isinstance(v, bytes) else v for v in r.as_numpy("OUT").reshape(-1)]
    # (2x+1)^2 = [1, 9, 25, 4]: the largest at index 2, then 1; the labels are sq's.
    assert top[0].startswith("25") and top[0].endswith(":2:c"), top
    assert top[1].startswith("9") and top[1].endswith(":1:b"), top
    r = c.infer("ens2", [inp], outputs=[httpclient.InferRequestedOutput("OUT", binary_data=True)])
    np.testing.assert_array_equal(r.as_numpy("OUT"), (2 * x + 1) ** 2)
    c.close()


def test_shared_memory_outputs(ens_server, regions):
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm
    c = httpclient.InferenceServerClient(ens_server.url)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    hin, hout = regions(x.nbytes), regions(x.nbytes)
    shm.set_shared_memory_region(hin, [x])
    c.register_system_shared_memory("ens_in", _key(hin), x.nbytes)
    c.register_system_shared_memory("ens_out", _key(hout), x.nbytes)
    try:
        inp = httpclient.InferInput("IN", [2, 4], "FP32")
        inp.set_shared_memory("ens_in", x.nbytes)
        out = httpclient.InferRequestedOutput("OUT")
        out.set_shared_memory("ens_out", x.nbytes)
        c.infer("ens2", [inp], outputs=[out])
        got = shm.get_contents_as_numpy(hout, np.float32, [2, 4])
        np.testing.assert_array_equal(got, (2 * x + 1) ** 2)
    finally:
        c.unregister_system_shared_memory()
        c.close()


def _key(handle):
    # tritonclient's handle keeps the key it was created with.
    return handle._shm_key


def test_failing_middle_step_names_its_model(ens_server):
    for mod, c in clients(ens_server):
        try:
            bad = np.full((1, 4), 10.0, dtype=np.float32)  # 2*10+1 = 21: out of the table's 8
            with pytest.raises(Exception) as e:
                infer(mod, c, "failing", bad)
            msg = str(e.value)
            assert "look" in msg and "failing" in msg, msg
            # The others are left alone.
            ok = np.array([[0.0, 1.0, 2.0, 3.0]], dtype=np.float32) / 2  # indices 1, 2, 3, 4
            r = infer(mod, c, "failing", ok)
            np.testing.assert_array_equal(r.as_numpy("OUT"), -np.array([[10, 20, 30, 40]], dtype=np.float32))
        finally:
            c.close()


def stats(c, model):
    import tritonclient.grpc as grpcclient
    kw = {"as_json": True} if isinstance(c, grpcclient.InferenceServerClient) else {}
    s = c.get_inference_statistics(model, **kw)["model_stats"]
    return s[0] if s else {}


def test_concurrent_clients_batch_at_each_step(ens_server):
    import tritonclient.http as httpclient
    before = {}
    c0 = httpclient.InferenceServerClient(ens_server.url)
    for m in ("pre", "neg", "sq", "ens3"):
        before[m] = stats(c0, m)
    nclients, per = 64, 8
    errors = []
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(nclients)]

    def run(i):
        c = httpclient.InferenceServerClient(ens_server.url)
        try:
            for _ in range(per):
                r = infer(httpclient, c, "ens3", xs[i])
                mid = 2 * xs[i] + 1
                np.testing.assert_allclose(r.as_numpy("NEG"), -mid, rtol=1e-6)
                np.testing.assert_allclose(r.as_numpy("SQ"), mid * mid, rtol=1e-5)
        except Exception as e:  # noqa: BLE001 - the test's failure
            errors.append(repr(e))
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(nclients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    total = nclients * per
    for m in ("pre", "neg", "sq"):
        s = stats(c0, m)
        inferences = int(s["inference_count"]) - int(before[m].get("inference_count", 0))
        executions = int(s["execution_count"]) - int(before[m].get("execution_count", 0))
        assert inferences == total, (m, inferences)
        assert executions < inferences, (m, executions, inferences)
    s = stats(c0, "ens3")
    assert int(s["inference_count"]) - int(before["ens3"].get("inference_count", 0)) == total
    # Per step, in the ensemble's own statistics and metrics.
    steps = {st["model_name"]: st for st in s["ensemble_steps"]}
    assert sorted(steps) == ["neg", "pre", "sq"]
    assert all(int(st["success_count"]) >= total and int(st["ns"]) > 0 for st in steps.values()), steps
    from conftest import raw_request
    _, _, text = raw_request(ens_server.url, "GET", "/metrics")
    assert 'kiln_ensemble_step_success_total{model="ens3",version="1",step="1",step_model="neg"}' in text.decode()
    # gRPC's statistics of an ensemble (its extension's fields only).
    import tritonclient.grpc as grpcclient
    g = grpcclient.InferenceServerClient(ens_server.grpc_url())
    gs = g.get_inference_statistics("ens3", as_json=True)["model_stats"][0]
    assert int(gs["inference_count"]) == int(s["inference_count"])
    g.close()
    c0.close()


def test_repository_index_lists_ensembles(ens_server):
    import tritonclient.http as httpclient
    c = httpclient.InferenceServerClient(ens_server.url)
    idx = {m["name"]: m for m in c.get_model_repository_index()}
    for m in ("ens2", "ens3", "diamond", "failing", "nobatch_ens", "batch_to_nobatch"):
        assert idx[m]["state"] == "READY", idx[m]
    c.close()


# ---- load refusals -------------------------------------------------------

REFUSALS = {
    "cycle": (ensemble_config("cycle", [step("neg", {"x": "b"}, {"y": "a"}), step("sq", {"x": "a"}, {"y": "b"}),
                                        step("pre", {"x": "IN"}, {"y": "OUT"})], [io("IN")], [io("OUT")]),
              ["cycle", "step 0", "neg"]),
    "missing_tensor": (ensemble_config("missing_tensor", [step("pre", {"x": "IN"}, {"y": "mid"}),
                                                          step("sq", {"x": "nowhere"}, {"y": "OUT"})],
                                       [io("IN")], [io("OUT")]),
                       ["step 1", "sq", "'nowhere'"]),
    "dtype_mismatch": (ensemble_config("dtype_mismatch", [step("pre", {"x": "IN"}, {"y": "OUT"})],
                                       [io("IN", "TYPE_INT32")], [io("OUT")]),
                       ["step 0", "pre", "'IN'", "INT32", "FP32"]),
    "missing_model": (ensemble_config("missing_model", [step("pre", {"x": "IN"}, {"y": "mid"}),
                                                        step("absent", {"x": "mid"}, {"y": "OUT"})],
                                      [io("IN")], [io("OUT")]),
                      ["step 1", "'absent'", "not loaded"]),
    "missing_version": (ensemble_config("missing_version", [step("pre", {"x": "IN"}, {"y": "OUT"}, version=5)],
                                        [io("IN")], [io("OUT")]),
                        ["step 0", "'pre' version 5", "not loaded"]),
    "shape_mismatch": (ensemble_config("shape_mismatch", [step("pre", {"x": "IN"}, {"y": "OUT"})],
                                       [io("IN", dims=(5,))], [io("OUT")]),
                       ["step 0", "'IN'", "shape"]),
    "produced_twice": (ensemble_config("produced_twice", [step("pre", {"x": "IN"}, {"y": "OUT"}),
                                                          step("neg", {"x": "IN"}, {"y": "OUT"})],
                                       [io("IN")], [io("OUT")]),
                       ["'OUT'", "step 0", "step 1"]),
}


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_load_refusals_name_step_and_tensor(tmp_path, kind, make_server):
    root = tmp_path / "repo"
    step_models(root)
    for name, (cfg, _) in REFUSALS.items():
        write_ensemble(root, name, cfg)
    s = make_server(root, "--model-control-mode", "explicit", "--load-model", "pre", "--load-model", "neg",
                    "--load-model", "sq")
    both = clients(s)
    mod, c = both[0 if kind == "http" else 1]
    both[1 if kind == "http" else 0][1].close()
    for name, (_, words) in REFUSALS.items():
        with pytest.raises(Exception) as e:
            c.load_model(name)
        msg = str(e.value)
        for w in words:
            assert w in msg, (name, w, msg)
        assert not c.is_model_ready(name)
    idx = {m["name"]: m for m in (c.get_model_repository_index() if kind == "http"
                                   else json.loads(_grpc_index_json(c)))}
    assert "absent" in idx["missing_model"]["reason"], idx["missing_model"]
    # Still serving.
    assert c.is_model_ready("pre")
    c.close()


def _grpc_index_json(c):
    from google.protobuf.json_format import MessageToJson
    r = c.get_model_repository_index()
    return json.dumps(json.loads(MessageToJson(r, preserving_proto_field_name=True)).get("models", []))


def test_missing_step_model_loads_with_it(tmp_path, make_server):
    """Refused while a step's model is missing, loaded once it is; unloaded
    with it."""
    import tritonclient.http as httpclient
    root = tmp_path / "repo"
    save_model(root, "pre", pre_graph(), config=json.dumps(BATCHED))
    write_ensemble(root, "later", pre_sq("later"))
    s = make_server(root, "--model-control-mode", "explicit", "--load-model", "*")
    c = httpclient.InferenceServerClient(s.url)
    idx = {m["name"]: m for m in c.get_model_repository_index()}
    assert idx["later"]["state"] == "UNAVAILABLE" and "'sq'" in idx["later"]["reason"], idx["later"]
    save_model(root, "sq", sq_graph(), config=json.dumps(BATCHED))
    c.load_model("sq")
    assert c.is_model_ready("later")
    x = np.ones((2, 4), dtype=np.float32)
    np.testing.assert_array_equal(infer(httpclient, c, "later", x).as_numpy("OUT"), np.full((2, 4), 9.0))
    # Unloading the step's model unloads the ensemble, saying why; loading it back loads both.
    c.unload_model("sq")
    assert not c.is_model_ready("later")
    idx = {m["name"]: m for m in c.get_model_repository_index()}
    assert "'sq'" in idx["later"]["reason"] and "unloaded" in idx["later"]["reason"], idx["later"]
    c.load_model("sq")
    np.testing.assert_array_equal(infer(httpclient, c, "later", x).as_numpy("OUT"), np.full((2, 4), 9.0))
    # An ensemble unloaded on request stays unloaded when its step's model loads again.
    c.unload_model("later")
    c.load_model("sq")
    assert not c.is_model_ready("later")
    c.close()


def test_reload_composing_model_under_traffic(ens_server):
    import tritonclient.grpc as grpcclient
    stop = threading.Event()
    res = {"ok": 0, "fail": []}
    lock = threading.Lock()
    x = np.ones((1, 4), dtype=np.float32)

    def traffic():
        c = grpcclient.InferenceServerClient(ens_server.grpc_url())
        while not stop.is_set():
            try:
                r = infer(grpcclient, c, "ens3", x)
                assert r.as_numpy("SQ")[0, 0] == 9.0
                with lock:
                    res["ok"] += 1
            except Exception as e:  # noqa: BLE001
                with lock:
                    res["fail"].append(repr(e))
        c.close()

    threads = [threading.Thread(target=traffic) for _ in range(6)]
    for t in threads:
        t.start()
    c = grpcclient.InferenceServerClient(ens_server.grpc_url())
    try:
        time.sleep(0.3)
        for m in ("sq", "pre", "sq", "neg", "pre"):
            c.load_model(m)
            time.sleep(0.1)
        before = res["ok"]
        time.sleep(0.3)
        assert res["ok"] > before
        assert c.is_model_ready("ens3")
    finally:
        stop.set()
        for t in threads:
            t.join()
        c.close()
    assert not res["fail"], res["fail"][:3]
    assert res["ok"] > 0


def http_disconnect(url, model, x, after):
    """Sends an inference request over a raw connection, then closes it
    `after` seconds later, before the answer."""
    import socket
    body = json.dumps({"inputs": [{"name": "IN", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.flatten().tolist()}]}).encode()
    host, port = url.split(":")
    sk = socket.create_connection((host, int(port)))
    sk.sendall(f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {url}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    time.sleep(after)
    sk.close()


@pytest.mark.parametrize("how", ["grpc_deadline", "http_disconnect"])
def test_cancel_while_queued(tmp_path, make_server, how):
    """A gRPC deadline that passes, or an HTTP client that goes away, while
    the ensemble's step waits behind a busy instance: the step is dropped
    before it runs; the server serves on."""
    import tritonclient.grpc as grpcclient
    root = tmp_path / "repo"
    save_model(root, "slow", slow_graph(depth=100, width=1024))
    ident = oh.make_graph([oh.make_node("Identity", ["x"], ["y"])], "ident",
                          [oh.make_tensor_value_info("x", TP.FLOAT, [1, 1024])],
                          [oh.make_tensor_value_info("y", TP.FLOAT, [1, 1024])])
    save_model(root, "ident", ident)
    cfg = {"name": "slowens", "platform": "ensemble", "input": [io("IN", dims=(1, 1024))],
           "output": [io("OUT", dims=(1, 1024))],
           "ensemble_scheduling": {"step": [step("ident", {"x": "IN"}, {"y": "mid"}),
                                            step("slow", {"x": "mid"}, {"y": "OUT"})]}}
    write_ensemble(root, "slowens", json.dumps(cfg))
    s = make_server(root)
    url = s.grpc_url()
    x = np.ones((1, 1024), dtype=np.float32)
    # Direct requests fill the slow model's queue with 4 s of work or more,
    # however fast this machine runs one (timed first), all sent at once
    # (asynchronously) before the ensemble's request: its step waits behind
    # them long after its deadline passes or its client leaves. The deadline
    # and the disconnect come a second or more after the request is sent:
    # on a loaded machine the request must reach the server first (a
    # deadline that passes in the client before then leaves nothing to
    # cancel; the test checks the request's first step ran).
    c0 = grpcclient.InferenceServerClient(url)
    i0 = grpcclient.InferInput("x", [1, 1024], "FP32")
    i0.set_data_from_numpy(x)
    c0.infer("slow", [i0])
    t0 = time.monotonic()
    c0.infer("slow", [i0])
    one = max(time.monotonic() - t0, 1e-3)
    backlog = max(8, int(4.0 / one) + 1)
    done = threading.Semaphore(0)
    errors = []

    def answered(result, error):
        if error is not None:
            errors.append(error)
        done.release()

    # Each client on its own HTTP/2 connection (gRPC otherwise shares one
    # between clients of an address), at most 100 calls on each: the
    # server takes 128 concurrent streams on a connection, and calls past
    # that wait in the client, not in the server's queue. The ensemble's
    # request too: behind the backlog in the client, it would never reach
    # the server before its deadline.
    def own_client():
        return grpcclient.InferenceServerClient(url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
    feeders = [own_client() for _ in range((backlog + 99) // 100)]
    for k in range(backlog):
        feeders[k % len(feeders)].async_infer("slow", [i0], answered)
    time.sleep(0.3)  # every one of them is in the server's queue
    c = own_client()
    if how == "grpc_deadline":
        with pytest.raises(Exception) as e:
            infer(grpcclient, c, "slowens", x, client_timeout=1.5)
        assert "Deadline" in str(e.value) or "timeout" in str(e.value).lower(), str(e.value)
    else:
        http_disconnect(s.url, "slowens", x, 1.5)
    for _ in range(backlog):
        assert done.acquire(timeout=120)
    assert not errors, errors
    c0.close()
    for f in feeders:
        f.close()
    # Only the direct requests ran at the slow step: the ensemble's was dropped in its queue.
    time.sleep(0.2)
    st = stats(c, "slow")
    assert int(st.get("inference_count", 0)) == backlog + 2, st
    # The ensemble's request reached the server (its first step ran) and
    # failed there, once its dropped step was finished by the slow model's
    # batcher (polled: that comes on the batcher's timer thread).
    assert int(stats(c, "ident").get("inference_count", 0)) == 1, stats(c, "ident")
    fails = 0
    for _ in range(50):
        fails = int(stats(c, "slowens")["inference_stats"]["fail"].get("count", 0))
        if fails:
            break
        time.sleep(0.1)
    assert fails == 1, stats(c, "slowens")
    r = infer(grpcclient, c, "slowens", x)
    assert r.as_numpy("OUT").shape == (1, 1024)
    c.close()


def steps_repo(tmp_path, sq_cache=False, **ensembles):
    """A repository of the step models and the ensembles given (name=config)."""
    root = tmp_path / "repo"
    step_models(root, sq_cache)
    for name, cfg in ensembles.items():
        write_ensemble(root, name, cfg)
    return root


def test_response_cache_caches_the_whole_answer(tmp_path, make_server):
    import tritonclient.http as httpclient
    s = make_server(steps_repo(tmp_path, cached=pre_sq("cached", response_cache={"enable": True})), "--cache-size", "16M")
    c = httpclient.InferenceServerClient(s.url)
    x = np.full((1, 4), 2.0, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(infer(httpclient, c, "cached", x).as_numpy("OUT"), np.full((1, 4), 25.0))
    st = stats(c, "cached")
    assert int(st["inference_stats"]["cache_hit"]["count"]) == 2, st
    # The steps ran once.
    assert int(stats(c, "sq")["inference_count"]) == 1
    c.close()


def test_step_caches_as_its_model_is_configured(tmp_path, make_server):
    """A step whose model has response_cache is answered from the cache (its
    in-process tier)."""
    import tritonclient.http as httpclient
    s = make_server(steps_repo(tmp_path, sq_cache=True, plain=pre_sq("plain")), "--cache-size", "16M")
    c = httpclient.InferenceServerClient(s.url)
    x = np.full((1, 4), 1.0, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(infer(httpclient, c, "plain", x).as_numpy("OUT"), np.full((1, 4), 9.0))
    sq = stats(c, "sq")
    assert int(sq["execution_count"]) == 1, sq
    assert int(sq["inference_stats"]["cache_hit"]["count"]) == 2, sq
    assert int(stats(c, "pre")["execution_count"]) == 3  # pre caches nothing
    # parameters.cache = false reaches the steps.
    infer(httpclient, c, "plain", x, parameters={"cache": False})
    assert int(stats(c, "sq")["execution_count"]) == 2
    c.close()


def test_max_inflight_requests(tmp_path, make_server):
    import tritonclient.http as httpclient
    bounded = pre_fanout("bounded").replace('"step":', '"max_inflight_requests": 2, "step":')
    s = make_server(steps_repo(tmp_path, bounded=bounded))
    errors = []

    def run(i):
        c = httpclient.InferenceServerClient(s.url)
        x = np.full((1, 4), float(i), dtype=np.float32)
        try:
            for _ in range(10):
                r = infer(httpclient, c, "bounded", x)
                np.testing.assert_array_equal(r.as_numpy("SQ"), (2 * x + 1) ** 2)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    c = httpclient.InferenceServerClient(s.url)
    assert c.get_model_config("bounded")["ensemble_scheduling"]["max_inflight_requests"] == 2
    c.close()


def test_internal_tensors_are_not_outputs(ens_server):
    """An ensemble's internal tensor (a step's output that feeds the next
    step) or a step model's own output name requested as an output: a 400
    naming it and listing the ensemble's outputs, over HTTP and gRPC; the
    ensemble answers the next request."""
    from tritonclient.utils import InferenceServerException
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for mod, c in clients(ens_server):
        real = {"ens2": "OUT", "ens3": "SQ", "diamond": "SUM"}
        for model, name in (("ens2", "mid"), ("ens2", "y"), ("ens2", "x"), ("diamond", "n"), ("diamond", "s"),
                            ("ens3", "mid")):
            with pytest.raises(InferenceServerException) as e:
                infer(mod, c, model, x, outputs=[real[model], name])
            msg = str(e.value)
            assert f"unexpected inference output '{name}' for model '{model}'" in msg, msg
            assert "400" in str(e.value.status()) or "INVALID_ARGUMENT" in str(e.value.status()), e.value.status()
        got = infer(mod, c, "ens2", x, outputs=["OUT"]).as_numpy("OUT")
        assert np.allclose(got, (2 * x + 1) ** 2)
        c.close()
