"""The sequence batcher (sequence_batching): correlation IDs over HTTP and
gRPC (streaming too), control inputs, implicit state, the direct and oldest
strategies, idle release and the refusals of bad sequence requests.

The model is an accumulator built here: its running sum is implicit state
(ACC_IN fed with the sequence's last ACC_OUT), reset by START; it also
echoes END and CORRID, so every control input's value is checked in the
answers. A sequence's answers must equal the running sums of its inputs
whatever else runs beside it."""
import json
import queue
import threading
import time
from functools import partial

import numpy as np
import onnx.helper as oh
import pytest
from onnx import TensorProto as TP

from conftest import save_model, serving, raw_request

CTRL = [
    {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "fp32_false_true": [0, 1]}]},
    {"name": "END", "control": [{"kind": "CONTROL_SEQUENCE_END", "int32_false_true": [0, 7]}]},
    {"name": "READY", "control": [{"kind": "CONTROL_SEQUENCE_READY", "bool_false_true": [False, True]}]},
]
CORRID = {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_INT64"}]}
STATE = [{"input_name": "ACC_IN", "output_name": "ACC_OUT", "data_type": "TYPE_FP32", "dims": [1]}]


def acc_graph(batch, corrid=True):
    """acc = ACC_IN * (1 - START) + INPUT, OUTPUT = acc (gated by READY),
    END_OUT = END, CORRID_OUT = CORRID."""
    b = ["N"] if batch else []
    ins = [oh.make_tensor_value_info("INPUT", TP.FLOAT, b + [1]),
           oh.make_tensor_value_info("START", TP.FLOAT, b + [1]),
           oh.make_tensor_value_info("END", TP.INT32, b + [1]),
           oh.make_tensor_value_info("READY", TP.BOOL, b + [1]),
           oh.make_tensor_value_info("ACC_IN", TP.FLOAT, b + [1])]
    outs = [oh.make_tensor_value_info("OUTPUT", TP.FLOAT, b + [1]),
            oh.make_tensor_value_info("ACC_OUT", TP.FLOAT, b + [1]),
            oh.make_tensor_value_info("END_OUT", TP.INT32, b + [1])]
    nodes = [oh.make_node("Sub", ["one", "START"], ["keep"]),
             oh.make_node("Mul", ["ACC_IN", "keep"], ["kept"]),
             oh.make_node("Add", ["kept", "INPUT"], ["ACC_OUT"]),
             oh.make_node("Cast", ["READY"], ["readyf"], to=TP.FLOAT),
             oh.make_node("Mul", ["ACC_OUT", "readyf"], ["OUTPUT"]),
             oh.make_node("Identity", ["END"], ["END_OUT"])]
    if corrid:
        ins.append(oh.make_tensor_value_info("CORRID", TP.INT64, b + [1]))
        outs.append(oh.make_tensor_value_info("CORRID_OUT", TP.INT64, b + [1]))
        nodes.append(oh.make_node("Identity", ["CORRID"], ["CORRID_OUT"]))
    return oh.make_graph(nodes, "acc", ins, outs, [oh.make_tensor("one", TP.FLOAT, [], [1.0])])


def acc_config(strategy, batch=8, idle_us=None, corrid=True, extra=None):
    sb = {"control_input": CTRL + ([CORRID] if corrid else []), "state": STATE, strategy: {}}
    if strategy == "oldest":
        sb["oldest"] = {"max_candidate_sequences": 64, "max_queue_delay_microseconds": 500,
                        "preferred_batch_size": [4, 8]}
    else:
        sb["direct"] = {"max_queue_delay_microseconds": 500}
    # A long idle time unless the test is about it: a loaded machine may
    # leave seconds between two requests of a sequence.
    sb["max_sequence_idle_microseconds"] = idle_us or 60000000
    cfg = {"max_batch_size": batch, "sequence_batching": sb,
           "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    cfg.update(extra or {})
    return json.dumps(cfg)


@pytest.fixture(scope="module")
def seq_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("seqrepo")
    save_model(root, "acc_direct", acc_graph(True), config=acc_config("direct"))
    save_model(root, "acc_oldest", acc_graph(True), config=acc_config("oldest"))
    save_model(root, "acc_idle", acc_graph(True), config=acc_config("direct", idle_us=1500000))
    save_model(root, "acc_str", acc_graph(True, corrid=False), config=acc_config("direct", corrid=False))
    # The state output listed under 'output': kept and also sent (Triton's way to debug state).
    save_model(root, "acc_listed", acc_graph(True), config=acc_config(
        "direct", extra={"output": [{"name": "ACC_OUT", "data_type": "TYPE_FP32", "dims": [1]}]}))
    # Without batching, and with 2 slots only: the third sequence waits for one.
    save_model(root, "acc_nobatch", acc_graph(False),
               config=json.dumps({"sequence_batching": {"control_input": CTRL + [CORRID], "state": STATE,
                                                        "max_sequence_idle_microseconds": 60000000},
                                  "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [1]}],
                                  "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [1]},
                                             {"name": "END_OUT", "data_type": "TYPE_INT32", "dims": [1]},
                                             {"name": "CORRID_OUT", "data_type": "TYPE_INT64", "dims": [1]}],
                                  "instance_group": [{"count": 2}]}))
    return root


@pytest.fixture(scope="module")
def srv(seq_repo):
    yield from serving(seq_repo)


def http_client(srv):
    import tritonclient.http as httpclient
    return httpclient, httpclient.InferenceServerClient(srv.url, concurrency=4)


def grpc_client(srv):
    import tritonclient.grpc as grpcclient
    return grpcclient, grpcclient.InferenceServerClient(srv.grpc_url())


def step(mod, c, model, seq_id, value, start=False, end=False, batch=True):
    shape = [1, 1] if batch else [1]
    x = mod.InferInput("INPUT", shape, "FP32")
    x.set_data_from_numpy(np.full(shape, value, np.float32))
    return c.infer(model, [x], sequence_id=seq_id, sequence_start=start, sequence_end=end)


def run_sequence(mod, c, model, seq_id, values, batch=True):
    """Sends values as one sequence; returns [(OUTPUT, END_OUT, CORRID_OUT or None)]."""
    got = []
    for i, v in enumerate(values):
        r = step(mod, c, model, seq_id, v, start=i == 0, end=i == len(values) - 1, batch=batch)
        cid = r.as_numpy("CORRID_OUT")
        got.append((float(r.as_numpy("OUTPUT").ravel()[0]), int(r.as_numpy("END_OUT").ravel()[0]),
                    None if cid is None else int(cid.ravel()[0])))
    return got


def expected(seq_id, values):
    acc = np.cumsum(np.asarray(values, np.float32), dtype=np.float32)
    return [(float(a), 7 if i == len(values) - 1 else 0, seq_id if isinstance(seq_id, int) else None)
            for i, a in enumerate(acc)]


@pytest.mark.parametrize("kind", ["http", "grpc"])
@pytest.mark.parametrize("model", ["acc_direct", "acc_oldest", "acc_nobatch"])
def test_one_sequence(srv, kind, model):
    mod, c = (http_client if kind == "http" else grpc_client)(srv)
    vals = [1.5, 2.0, -0.5, 4.0, 3.25]
    got = run_sequence(mod, c, model, 1000 + len(kind), vals, batch=model != "acc_nobatch")
    assert got == expected(1000 + len(kind), vals)
    # The state is the sequence's: a new START begins again from zeros.
    got = run_sequence(mod, c, model, 1000 + len(kind), [10.0, 1.0], batch=model != "acc_nobatch")
    assert got == expected(1000 + len(kind), [10.0, 1.0])
    c.close()


@pytest.mark.parametrize("kind", ["http", "grpc"])
@pytest.mark.parametrize("model", ["acc_direct", "acc_oldest"])
def test_32_interleaved_sequences_equal_running_alone(srv, kind, model):
    """32 sequences at once, each from its own thread, interleaved at the
    server and batched together: each one's answers are its own running
    sums, as when it runs alone."""
    rng = np.random.default_rng(7)
    seqs = {5000 + i: [float(v) for v in rng.integers(-20, 20, size=12)] for i in range(32)}
    alone_mod, alone_c = (http_client if kind == "http" else grpc_client)(srv)
    alone = {sid: run_sequence(alone_mod, alone_c, model, sid, vals) for sid, vals in list(seqs.items())[:4]}
    alone_c.close()
    results, errors = {}, []

    def worker(sid, vals):
        try:
            mod, c = (http_client if kind == "http" else grpc_client)(srv)
            results[sid] = run_sequence(mod, c, model, sid, vals)
            c.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"{sid}: {e}")

    threads = [threading.Thread(target=worker, args=(sid, vals)) for sid, vals in seqs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for sid, vals in seqs.items():
        assert results[sid] == expected(sid, vals), sid
    for sid, got in alone.items():
        assert results[sid] == got
    # They shared executions: fewer batches than requests.
    m = raw_request(srv.url, "GET", "/metrics")[2].decode()
    execs = [ln for ln in m.splitlines() if ln.startswith(f'kiln_inference_exec_count{{model="{model}"')]
    reqs = [ln for ln in m.splitlines() if ln.startswith(f'kiln_inference_request_success{{model="{model}"')]
    assert execs and reqs
    assert float(execs[0].split()[-1]) < float(reqs[0].split()[-1])


def test_grpc_stream_interleaved(srv):
    """tritonclient.grpc's start_stream: 8 sequences' requests interleaved
    on one stream, each answered with its own running sums."""
    import tritonclient.grpc as grpcclient
    c = grpcclient.InferenceServerClient(srv.grpc_url())
    answers = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    rng = np.random.default_rng(3)
    seqs = {700 + i: [float(v) for v in rng.integers(0, 9, size=6)] for i in range(8)}
    n = 0
    for k in range(6):
        for sid, vals in seqs.items():
            x = grpcclient.InferInput("INPUT", [1, 1], "FP32")
            x.set_data_from_numpy(np.full([1, 1], vals[k], np.float32))
            c.async_stream_infer("acc_direct", [x], request_id=f"{sid}:{k}", sequence_id=sid,
                                 sequence_start=k == 0, sequence_end=k == 5)
            n += 1
    got = {sid: [None] * 6 for sid in seqs}
    for _ in range(n):
        result, error = answers.get(timeout=60)
        assert error is None, error
        sid, k = map(int, result.get_response().id.split(":"))
        got[sid][k] = float(result.as_numpy("OUTPUT").ravel()[0])
    # A bad request is an error message on the stream, which goes on.
    x = grpcclient.InferInput("INPUT", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones([1, 1], np.float32))
    c.async_stream_infer("acc_direct", [x], request_id="late", sequence_id=700)
    result, error = answers.get(timeout=60)
    assert error is not None and "must specify the START flag" in str(error), error
    c.async_stream_infer("acc_direct", [x], request_id="again", sequence_id=700, sequence_start=True,
                         sequence_end=True)
    result, error = answers.get(timeout=60)
    assert error is None and float(result.as_numpy("OUTPUT").ravel()[0]) == 1.0
    c.stop_stream()
    c.close()
    for sid, vals in seqs.items():
        assert got[sid] == [e[0] for e in expected(sid, vals)]


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_string_correlation_ids(srv, kind):
    mod, c = (http_client if kind == "http" else grpc_client)(srv)
    a = run_sequence(mod, c, "acc_str", "session-a", [1.0, 2.0, 3.0])
    b = run_sequence(mod, c, "acc_str", "session-b", [5.0, 5.0])
    assert [x[0] for x in a] == [1.0, 3.0, 6.0]
    assert [x[0] for x in b] == [5.0, 10.0]
    c.close()


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_bad_sequence_requests(srv, kind):
    from tritonclient.utils import InferenceServerException
    mod, c = (http_client if kind == "http" else grpc_client)(srv)

    def refused(fn, *words):
        with pytest.raises(InferenceServerException) as e:
            fn()
        msg = str(e.value)
        for w in words:
            assert w in msg, msg
        if kind == "http":
            assert e.value.status() == "400", e.value.status()
        else:
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT", e.value.status()

    refused(lambda: step(mod, c, "acc_direct", 0, 1.0), "correlation ID")
    refused(lambda: step(mod, c, "acc_direct", 424242, 1.0), "START flag", "424242")
    step(mod, c, "acc_direct", 31, 1.0, start=True)
    refused(lambda: step(mod, c, "acc_direct", 31, 1.0, start=True), "sequence_start", "has not ended")
    step(mod, c, "acc_direct", 31, 1.0, end=True)
    refused(lambda: step(mod, c, "acc_direct", 31, 1.0), "must specify the START flag", "has ended")
    # A string ID where the model's CORRID is an integer.
    refused(lambda: step(mod, c, "acc_direct", "abc", 1.0, start=True), "CORRID", "TYPE_INT64")
    # Two rows in one request of a sequence.
    x = mod.InferInput("INPUT", [2, 1], "FP32")
    x.set_data_from_numpy(np.ones([2, 1], np.float32))
    refused(lambda: c.infer("acc_direct", [x], sequence_id=77, sequence_start=True), "batch-size 1", "2 rows")
    # A control or state input sent by the client.
    x = mod.InferInput("INPUT", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones([1, 1], np.float32))
    s = mod.InferInput("ACC_IN", [1, 1], "FP32")
    s.set_data_from_numpy(np.ones([1, 1], np.float32))
    refused(lambda: c.infer("acc_direct", [x, s], sequence_id=78, sequence_start=True), "ACC_IN",
            "filled by the sequence batcher")
    # The server still serves.
    assert run_sequence(mod, c, "acc_direct", 79, [2.0, 2.0]) == expected(79, [2.0, 2.0])
    c.close()


def test_idle_sequence_released(srv):
    """acc_idle releases a sequence after 1.5 s without a request: its next
    request is refused saying so, and a new START works."""
    from tritonclient.utils import InferenceServerException
    mod, c = http_client(srv)
    step(mod, c, "acc_idle", 9, 1.0, start=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = raw_request(srv.url, "GET", "/metrics")[2].decode()
        line = [ln for ln in m.splitlines() if ln.startswith('kiln_sequence_idle_released{model="acc_idle"')]
        if line and float(line[0].split()[-1]) >= 1:
            break
        time.sleep(0.1)
    with pytest.raises(InferenceServerException) as e:
        step(mod, c, "acc_idle", 9, 1.0)
    assert "max_sequence_idle_microseconds" in str(e.value) and e.value.status() == "400"
    assert run_sequence(mod, c, "acc_idle", 9, [4.0]) == expected(9, [4.0])
    c.close()


def test_sequences_wait_for_a_slot(srv):
    """acc_nobatch has 2 slots (2 instances, no batching): a third sequence
    started meanwhile waits, its requests kept, and runs once a slot frees."""
    mod, c = http_client(srv)
    step(mod, c, "acc_nobatch", 1, 1.0, start=True, batch=False)
    step(mod, c, "acc_nobatch", 2, 2.0, start=True, batch=False)
    done = {}

    def third():
        mod3, c3 = http_client(srv)
        done["r"] = run_sequence(mod3, c3, "acc_nobatch", 3, [3.0, 3.0], batch=False)
        c3.close()

    t = threading.Thread(target=third)
    t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = raw_request(srv.url, "GET", "/metrics")[2].decode()
        if 'kiln_sequence_waiting{model="acc_nobatch",version="1"} 1' in m:
            break
        time.sleep(0.05)
    assert 'kiln_sequence_waiting{model="acc_nobatch",version="1"} 1' in m
    assert "r" not in done  # no slot yet
    assert 'kiln_sequence_slot_occupied{model="acc_nobatch",version="1",slot="1"} 1' in m
    step(mod, c, "acc_nobatch", 1, 1.0, end=True, batch=False)
    t.join(30)
    assert done["r"] == expected(3, [3.0, 3.0])
    step(mod, c, "acc_nobatch", 2, 1.0, end=True, batch=False)
    c.close()


def test_metadata_and_config_hide_server_filled_tensors(srv):
    st, _, body = raw_request(srv.url, "GET", "/v2/models/acc_direct")
    meta = json.loads(body)
    assert [i["name"] for i in meta["inputs"]] == ["INPUT"]
    assert sorted(o["name"] for o in meta["outputs"]) == ["CORRID_OUT", "END_OUT", "OUTPUT"]
    st, _, body = raw_request(srv.url, "GET", "/v2/models/acc_oldest/config")
    cfg = json.loads(body)
    sb = cfg["sequence_batching"]
    assert sb["oldest"]["max_candidate_sequences"] == 64
    assert [c["name"] for c in sb["control_input"]] == ["START", "END", "READY", "CORRID"]
    assert sb["state"][0]["input_name"] == "ACC_IN"
    assert [i["name"] for i in cfg["input"]] == ["INPUT"]


def test_config_errors(tmp_path, make_server):
    """A sequence_batching that does not fit the model is refused at load, naming what is wrong."""
    root = tmp_path / "bad"
    bad = json.loads(acc_config("direct"))
    bad["sequence_batching"]["control_input"][0]["control"][0]["int32_false_true"] = [0, 1]
    save_model(root, "two_lists", acc_graph(True), config=json.dumps(bad))
    bad = json.loads(acc_config("direct"))
    bad["sequence_batching"]["state"][0]["output_name"] = "NOPE"
    save_model(root, "no_output", acc_graph(True), config=json.dumps(bad))
    bad = json.loads(acc_config("direct"))
    bad["sequence_batching"]["control_input"][0]["control"][0] = {"kind": "CONTROL_SEQUENCE_START",
                                                                  "int32_false_true": [0, 1]}
    save_model(root, "wrong_type", acc_graph(True), config=json.dumps(bad))
    s = make_server(root)
    text = s.text()
    assert "must have one of fp32_false_true, int32_false_true, bool_false_true" in text
    assert "output_name 'NOPE' is not an output of the model" in text
    assert "gives TYPE_INT32 values but the model's input is TYPE_FP32" in text


def test_listed_state_output_is_sent_too(srv):
    mod, c = http_client(srv)
    sums = []
    for i, v in enumerate([2.0, 3.0, 4.0]):
        r = step(mod, c, "acc_listed", 55, v, start=i == 0, end=i == 2)
        assert float(r.as_numpy("ACC_OUT").ravel()[0]) == float(r.as_numpy("OUTPUT").ravel()[0])
        sums.append(float(r.as_numpy("OUTPUT").ravel()[0]))
    assert sums == [2.0, 5.0, 9.0]
    # Elsewhere it is not a model output clients may ask for.
    from tritonclient.utils import InferenceServerException
    x = mod.InferInput("INPUT", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones([1, 1], np.float32))
    with pytest.raises(InferenceServerException) as e:
        c.infer("acc_direct", [x], sequence_id=56, sequence_start=True, outputs=[mod.InferRequestedOutput("ACC_OUT")])
    assert "unexpected inference output 'ACC_OUT'" in str(e.value) and "implicit state" in str(e.value)
    c.close()


def test_state_does_not_survive_an_unload(tmp_path, make_server):
    """A reload starts every sequence afresh: a running sequence's next
    request is refused (its START is needed again), and a new START begins
    from the initial state."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException
    root = tmp_path / "repo"
    save_model(root, "acc", acc_graph(True), config=acc_config("direct"))
    s = make_server(root, "--model-control-mode", "explicit", "--load-model", "acc")
    c = httpclient.InferenceServerClient(s.url)
    step(httpclient, c, "acc", 5, 3.0, start=True)
    c.unload_model("acc")
    c.load_model("acc")
    with pytest.raises(InferenceServerException) as e:
        step(httpclient, c, "acc", 5, 1.0)
    assert "must specify the START flag" in str(e.value) and e.value.status() == "400"
    assert run_sequence(httpclient, c, "acc", 5, [1.0, 1.0]) == expected(5, [1.0, 1.0])
    c.close()


# ---- hostile correlation IDs and flags ---------------------------------------------

def raw_step(srv, model, params, value=1.0):
    body = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [value]}],
            "parameters": params}
    st, _, out = raw_request(srv.url, "POST", f"/v2/models/{model}/infer", json.dumps(body))
    return st, json.loads(out)


@pytest.mark.parametrize("params,needle", [
    ({"sequence_id": -1, "sequence_start": True}, "parameters.sequence_id must be an integer >= 0 or a string"),
    ({"sequence_id": 1.5, "sequence_start": True}, "parameters.sequence_id must be an integer >= 0 or a string"),
    ({"sequence_id": 2 ** 64, "sequence_start": True}, "parameters.sequence_id must be an integer >= 0"),
    ({"sequence_id": float(2 ** 64), "sequence_start": True}, "parameters.sequence_id must be an integer >= 0"),
    ({"sequence_id": 1e300, "sequence_start": True}, "parameters.sequence_id must be an integer >= 0"),
    ({"sequence_id": True, "sequence_start": True}, "parameters.sequence_id must be an integer >= 0"),
    ({"sequence_id": [5], "sequence_start": True}, "parameters.sequence_id must be an integer >= 0"),
    ({"sequence_id": "", "sequence_start": True}, "non-empty string"),
    ({"sequence_id": 0, "sequence_start": True}, "non-zero or non-empty correlation ID"),
    ({"sequence_start": True}, "non-zero or non-empty correlation ID"),
    ({"sequence_id": 9, "sequence_start": 1}, "parameters.sequence_start must be true or false"),
    ({"sequence_id": 9, "sequence_end": "yes"}, "parameters.sequence_end must be true or false"),
    ({"sequence_id": "x" * 100000, "sequence_start": True}, "CORRID"),
    ({"sequence_id": 987654321, "sequence_end": True}, "must specify the START flag"),
])
def test_hostile_sequence_parameters(srv, params, needle):
    """Each a 400 naming what was wrong: IDs of the wrong type, negative,
    past uint64, zero, huge strings; flags that are not booleans; END on an
    ID that never started."""
    st, out = raw_step(srv, "acc_direct", params)
    assert st == 400 and needle in out["error"], (st, out)
    assert len(out["error"]) < 2000  # a huge ID is not echoed whole
    mod, c = http_client(srv)
    assert run_sequence(mod, c, "acc_direct", 4711, [1.0]) == expected(4711, [1.0])
    c.close()


def test_concurrent_requests_of_one_sequence(srv):
    """16 threads sending steps of one sequence at once: every step runs
    once, in some order, on the sequence's state (the answers are the
    running sums 1..16, each once), then END releases it."""
    assert raw_step(srv, "acc_direct", {"sequence_id": 5150, "sequence_start": True}, 0.0)[0] == 200
    got, lock = [], threading.Lock()

    def one():
        st, out = raw_step(srv, "acc_direct", {"sequence_id": 5150}, 1.0)
        with lock:
            got.append((st, out))

    ts = [threading.Thread(target=one) for _ in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(st == 200 for st, _ in got), got
    sums = sorted(o["data"][0] for _, out in got for o in out["outputs"] if o["name"] == "OUTPUT")
    assert sums == [float(i) for i in range(1, 17)], sums
    st, out = raw_step(srv, "acc_direct", {"sequence_id": 5150, "sequence_end": True}, 1.0)
    assert st == 200 and [o["data"][0] for o in out["outputs"] if o["name"] == "OUTPUT"] == [17.0]
