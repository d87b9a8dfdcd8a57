"""BYTES are bytes: every byte of a BYTES element, NUL included, through
every path a string takes in the real kiln, against answers worked out here.

A BYTES element is counted bytes, not a C string: "ab\\0cd" is five bytes,
"admin\\0; drop" is not "admin", an element of all 256 byte values comes
back as sent. One model serves it all, with dynamic batching:

  nul   s STRING [N,2] -> echo    STRING [N,2]  (Identity)
                          admin   BOOL   [N,2]  (Equal to the constant "admin")
                          adnul   BOOL   [N,2]  (Equal to the constant "ad\\0min")
                          id      INT64  [N,2]  (LabelEncoder on keys_strings)

Paths: HTTP JSON (NUL as \\u0000), the HTTP binary tensor extension, gRPC
raw_input_contents and bytes_contents, system shared memory, the dynamic
batcher under concurrent requests, the in-process cache and Redis. The
string operators (Equal, LabelEncoder, StringNormalizer, RegexFullMatch)
are checked on a second model against Python's own answers. Names with a
NUL (input, output, model, parameter keys) are refused with 400 /
INVALID_ARGUMENT naming the problem.
"""
import json
import re
import subprocess
import threading
import uuid

import grpc
import numpy as np
import onnx.helper as oh
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto as TP
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from conftest import KILN, no_batch_config, raw_request
from test_cache import Redis
from test_strings import _concurrently, _save

ALL = bytes(range(256))
# Every code point 0..255 as UTF-8: what JSON can carry (it carries text).
ALL_TEXT = "".join(chr(i) for i in range(256)).encode()
KEYS = [b"admin", b"ab", b"", b"\x00", b"ad\x00min"]
# Words with NULs where a C string would end, empty strings, and the words
# a C string reading would confuse with a key.
WORDS = [b"admin", b"admin\x00; drop", b"ab\x00cd", b"\x00secret", b"", b"\x00", b"ad\x00min", b"ab", b"ad",
         b"\x00\x00", b"tail\x00"]
BATCHED = {"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_microseconds": 20000}}
CACHED = {"max_batch_size": 16, "response_cache": {"enable": True}}


def _nul_graph():
    return oh.make_graph(
        [oh.make_node("Identity", ["s"], ["echo"]),
         oh.make_node("Equal", ["s", "c_admin"], ["admin"]),
         oh.make_node("Equal", ["s", "c_adnul"], ["adnul"]),
         oh.make_node("LabelEncoder", ["s"], ["id"], domain="ai.onnx.ml", keys_strings=KEYS,
                      values_int64s=list(range(len(KEYS))), default_int64=-1)],
        "nul", [oh.make_tensor_value_info("s", TP.STRING, ["N", 2])],
        [oh.make_tensor_value_info("echo", TP.STRING, ["N", 2]), oh.make_tensor_value_info("admin", TP.BOOL, ["N", 2]),
         oh.make_tensor_value_info("adnul", TP.BOOL, ["N", 2]), oh.make_tensor_value_info("id", TP.INT64, ["N", 2])],
        [oh.make_tensor("c_admin", TP.STRING, [], [b"admin"]), oh.make_tensor("c_adnul", TP.STRING, [], [b"ad\x00min"])])


def _text_graph():
    return oh.make_graph(
        [oh.make_node("StringNormalizer", ["s"], ["lower"], case_change_action="LOWER"),
         oh.make_node("RegexFullMatch", ["s"], ["word"], pattern="[a-zA-Z]+"),
         oh.make_node("RegexFullMatch", ["s"], ["dotted"], pattern="a.b"),
         oh.make_node("Equal", ["s", "c_admin"], ["admin"])],
        "text", [oh.make_tensor_value_info("s", TP.STRING, ["C"])],
        [oh.make_tensor_value_info("lower", TP.STRING, ["C"]), oh.make_tensor_value_info("word", TP.BOOL, ["C"]),
         oh.make_tensor_value_info("dotted", TP.BOOL, ["C"]), oh.make_tensor_value_info("admin", TP.BOOL, ["C"])],
        [oh.make_tensor("c_admin", TP.STRING, [], [b"admin"])])


def _split_graph():
    return oh.make_graph(
        [oh.make_node("StringSplit", ["s"], ["pieces", "count"], delimiter=",")],
        "split", [oh.make_tensor_value_info("s", TP.STRING, ["C"])],
        [oh.make_tensor_value_info("pieces", TP.STRING, ["C", "P"]), oh.make_tensor_value_info("count", TP.INT64, ["C"])])


@pytest.fixture(scope="module")
def nul_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("nul_repo")
    _save(root, "nul", _nul_graph(), BATCHED, opset=20)
    _save(root, "nul_cached", _nul_graph(), CACHED, opset=20)
    _save(root, "text", _text_graph(), no_batch_config(_text_graph()), opset=20)
    _save(root, "split", _split_graph(), no_batch_config(_split_graph()), opset=20)
    return root


def _serve_flags():
    """--allow-client-shm where this kiln has it (shared memory is refused without it)."""
    out = subprocess.run([str(KILN), "serve", "--help"], capture_output=True, text=True, timeout=30)
    return ["--allow-client-shm"] if "--allow-client-shm" in out.stdout + out.stderr else []


@pytest.fixture(scope="module")
def nul_server(nul_repo):
    from conftest import KilnServer
    s = KilnServer(nul_repo, "--grpc-port", "0", *_serve_flags())
    yield s
    s.stop()
    assert s.sanitizer_report() is None, s.sanitizer_report()


# ---- expected answers ---------------------------------------------------------------

def _want(words):
    flat = list(np.asarray(words, dtype=object).flatten())
    return {"echo": flat, "admin": [w == b"admin" for w in flat], "adnul": [w == b"ad\x00min" for w in flat],
            "id": [KEYS.index(w) if w in KEYS else -1 for w in flat]}


def _as_bytes(a):
    return [x if isinstance(x, bytes) else x.encode() for x in np.asarray(a, dtype=object).flatten()]


def _got(res):
    return {"echo": _as_bytes(res.as_numpy("echo")), "admin": res.as_numpy("admin").flatten().tolist(),
            "adnul": res.as_numpy("adnul").flatten().tolist(), "id": res.as_numpy("id").flatten().tolist()}


def _batch(words):
    w = list(words)
    if len(w) % 2:
        w.append(b"")
    return np.array(w, dtype=np.object_).reshape(-1, 2)


def _infer(mod, c, model, s, binary=True):
    i = mod.InferInput("s", list(s.shape), "BYTES")
    if mod is httpclient:
        i.set_data_from_numpy(s, binary_data=binary)
        outs = [mod.InferRequestedOutput(n, binary_data=binary) for n in ("echo", "admin", "adnul", "id")]
    else:
        i.set_data_from_numpy(s)
        outs = [mod.InferRequestedOutput(n) for n in ("echo", "admin", "adnul", "id")]
    return _got(c.infer(model, [i], outputs=outs))


# ---- every transport -------------------------------------------------------------------

def test_http_binary_round_trips_every_byte(nul_server):
    c = httpclient.InferenceServerClient(nul_server.url)
    try:
        s = _batch(WORDS + [ALL, ALL[::-1], b"\xff\xfe\x00"])
        assert _infer(httpclient, c, "nul", s) == _want(s)
    finally:
        c.close()


def test_http_json_carries_nul_as_u0000(nul_server):
    c = httpclient.InferenceServerClient(nul_server.url)
    try:
        s = _batch(WORDS + [ALL_TEXT])
        assert _infer(httpclient, c, "nul", s, binary=False) == _want(s)
    finally:
        c.close()
    # The raw answer: NUL goes out as \u0000, the rest of the element after it.
    body = json.dumps({"inputs": [{"name": "s", "shape": [1, 2], "datatype": "BYTES",
                                   "data": ["ab\u0000cd", "\u0000secret"]}],
                       "outputs": [{"name": "echo"}, {"name": "admin"}]}).encode()
    st, _, b = raw_request(nul_server.url, "POST", "/v2/models/nul/infer", body)
    assert st == 200, b
    assert b'"ab\\u0000cd"' in b and b'"\\u0000secret"' in b
    outs = {o["name"]: o["data"] for o in json.loads(b)["outputs"]}
    assert outs == {"echo": ["ab\u0000cd", "\u0000secret"], "admin": [False, False]}


def test_json_answer_of_invalid_utf8_is_refused(nul_server):
    """Bytes that are not UTF-8 asked for as JSON: JSON carries text, so the
    answer would have to change them; it is a 400 naming the output and the
    element instead (as Triton's), and the binary form is exact."""
    c = httpclient.InferenceServerClient(nul_server.url)
    try:
        s = _batch([b"ok\x00\xc3\xa9", ALL])
        i = httpclient.InferInput("s", list(s.shape), "BYTES")
        i.set_data_from_numpy(s, binary_data=True)
        with pytest.raises(InferenceServerException) as e:
            c.infer("nul", [i], outputs=[httpclient.InferRequestedOutput("echo", binary_data=False)])
        assert "output 'echo': BYTES element 1 is not valid UTF-8" in e.value.message(), e.value.message()
        assert "binary_data" in e.value.message()
        res = c.infer("nul", [i], outputs=[httpclient.InferRequestedOutput("echo", binary_data=True)])
        assert list(res.as_numpy("echo").flatten()) == [b"ok\x00\xc3\xa9", ALL]
        # Valid UTF-8 (NUL included) still comes back as JSON text.
        ok = _batch([b"ok\x00\xc3\xa9"])
        i = httpclient.InferInput("s", list(ok.shape), "BYTES")
        i.set_data_from_numpy(ok, binary_data=True)
        res = c.infer("nul", [i], outputs=[httpclient.InferRequestedOutput("echo", binary_data=False)])
        got = [x if isinstance(x, str) else x.decode() for x in res.as_numpy("echo").flatten()]
        assert got == ["ok\u0000\u00e9", ""]
    finally:
        c.close()
    st, _, b = raw_request(nul_server.url, "POST", "/v2/models/nul/infer", json.dumps(
        {"inputs": [{"name": "s", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}]}).encode())
    assert st == 200
    json.loads(b.decode("utf-8"))  # strict: raises on invalid UTF-8 or JSON


def test_grpc_raw_contents_round_trip_every_byte(nul_server):
    c = grpcclient.InferenceServerClient(nul_server.grpc_url())
    try:
        s = _batch(WORDS + [ALL, b"\x00" * 300])
        assert _infer(grpcclient, c, "nul", s) == _want(s)
    finally:
        c.close()


def test_grpc_bytes_contents_round_trip_every_byte(nul_server):
    channel = grpc.insecure_channel(nul_server.grpc_url())
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        s = _batch(WORDS + [ALL])
        req = service_pb2.ModelInferRequest(model_name="nul")
        t = req.inputs.add(name="s", datatype="BYTES", shape=list(s.shape))
        t.contents.bytes_contents.extend(list(s.flatten()))
        req.outputs.add(name="echo")
        req.outputs.add(name="admin")
        resp = stub.ModelInfer(req, timeout=30)
        raw = resp.raw_output_contents
        assert raw[0] == serialize_byte_tensor(s).item()
        assert np.frombuffer(raw[1], np.bool_).tolist() == _want(s)["admin"]
    finally:
        channel.close()


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_system_shared_memory_round_trips_every_byte(nul_server, proto):
    mod = httpclient if proto == "http" else grpcclient
    c = httpclient.InferenceServerClient(nul_server.url) if proto == "http" else \
        grpcclient.InferenceServerClient(nul_server.grpc_url())
    tag = uuid.uuid4().hex[:12]
    s = _batch(WORDS + [ALL])
    ser = serialize_byte_tensor(s).item()
    hin = shm.create_shared_memory_region(f"in{tag}", f"/kiln_nul_in_{tag}", len(ser))
    hout = shm.create_shared_memory_region(f"out{tag}", f"/kiln_nul_out_{tag}", 4096)
    try:
        shm.set_shared_memory_region(hin, [serialize_byte_tensor(s)])
        c.register_system_shared_memory(f"in{tag}", f"/kiln_nul_in_{tag}", len(ser))
        c.register_system_shared_memory(f"out{tag}", f"/kiln_nul_out_{tag}", 4096)
        i = mod.InferInput("s", list(s.shape), "BYTES")
        i.set_shared_memory(f"in{tag}", len(ser))
        o = mod.InferRequestedOutput("echo")
        o.set_shared_memory(f"out{tag}", 4096)
        c.infer("nul", [i], outputs=[o, mod.InferRequestedOutput("admin")])
        got = shm.get_contents_as_numpy(hout, np.object_, list(s.shape))
        assert got.flatten().tolist() == list(s.flatten())
    finally:
        c.unregister_system_shared_memory()
        c.close()
        shm.destroy_shared_memory_region(hin)
        shm.destroy_shared_memory_region(hout)


# ---- the dynamic batcher --------------------------------------------------------------------

def _stats(url, model):
    st, _, b = raw_request(url, "GET", f"/v2/models/{model}/stats")
    return json.loads(b)["model_stats"][0]


def test_batcher_keeps_every_byte_of_each_request(nul_server):
    """Concurrent requests, each with its own NUL-laden words, batched
    together: every request gets back exactly its own bytes."""
    n = 24
    rng = np.random.default_rng(3)
    pool = WORDS + [ALL, ALL[7:], b"\x00" * 17]
    data = [_batch([pool[rng.integers(len(pool))] + bytes([i]) * int(rng.integers(0, 3))
                    for _ in range(2 * int(rng.integers(1, 4)))]) for i in range(n)]
    before = _stats(nul_server.url, "nul")
    def one(i):
        # Each thread its own client (tritonclient.http's belongs to its thread's event hub).
        mod = grpcclient if i % 2 else httpclient
        c = mod.InferenceServerClient(nul_server.grpc_url() if i % 2 else nul_server.url)
        try:
            return _infer(mod, c, "nul", data[i])
        finally:
            c.close()

    results = _concurrently(n, one)
    for i in range(n):
        assert results[i] == _want(data[i]), f"request {i}"
    after = _stats(nul_server.url, "nul")
    sizes = [b["batch_size"] for b in after.get("batch_stats", [])]
    assert after["execution_count"] - before["execution_count"] < n, "no batching"
    assert any(b > 1 for b in sizes), sizes


# ---- both cache tiers --------------------------------------------------------------------------

def _cache_counts(url, model):
    st = _stats(url, model)["inference_stats"]
    return int(st["cache_hit"]["count"]), int(st["cache_miss"]["count"])


def _cached_round(url, s, other):
    """s twice (a miss, then a hit with the same bytes), then other, which
    differs from s only after a NUL: a miss of its own, never s's answer."""
    c = httpclient.InferenceServerClient(url)
    try:
        for words in (s, s, other):
            assert _infer(httpclient, c, "nul_cached", words) == _want(words)
    finally:
        c.close()


def test_in_process_cache_keys_every_byte(nul_server):
    h0, m0 = _cache_counts(nul_server.url, "nul_cached")
    _cached_round(nul_server.url, _batch([b"admin", b"ab\x00cd", ALL, b""]),
                  _batch([b"admin", b"ab\x00ce", ALL, b""]))
    h1, m1 = _cache_counts(nul_server.url, "nul_cached")
    assert (h1 - h0, m1 - m0) == (1, 2)


def test_redis_cache_keeps_every_byte(make_server, nul_repo):
    r = Redis()
    try:
        s = make_server(nul_repo, "--cache-size", "0", "--redis-url", r.url)
        for _ in range(200):
            st, _, b = raw_request(s.url, "GET", "/metrics")
            if re.search(rb"^kiln_cache_redis_connected 2", b, re.M):
                break
        words, other = _batch([b"\x00secret", ALL, b"x\x00"]), _batch([b"\x00secreu", ALL, b"x\x00"])
        c = httpclient.InferenceServerClient(s.url)
        try:
            assert _infer(httpclient, c, "nul_cached", words) == _want(words)
            for _ in range(100):  # the SET is asynchronous
                if r.cli("keys", "kiln:*").split():
                    break
                threading.Event().wait(0.02)
            assert _infer(httpclient, c, "nul_cached", words) == _want(words)  # a Redis hit
            assert _infer(httpclient, c, "nul_cached", other) == _want(other)
        finally:
            c.close()
        hits, misses = _cache_counts(s.url, "nul_cached")
        assert (hits, misses) == (1, 2)
    finally:
        r.stop()


# ---- string operators ------------------------------------------------------------------------------

def test_string_ops_compare_every_byte(nul_server):
    words = ["admin", "admin\x00; drop", "ADMIN\x00x", "Ab\x00C", "ab", "a\x00b", "a\nb", "", "\x00", "ÀÉ\x00Î"]
    c = httpclient.InferenceServerClient(nul_server.url)
    try:
        s = np.array([w.encode() for w in words], dtype=np.object_)
        i = httpclient.InferInput("s", [len(words)], "BYTES")
        i.set_data_from_numpy(s, binary_data=True)
        res = c.infer("text", [i])
        assert _as_bytes(res.as_numpy("lower")) == [w.lower().encode() for w in words]
        assert res.as_numpy("word").tolist() == [re.fullmatch("[a-zA-Z]+", w) is not None for w in words]
        assert res.as_numpy("dotted").tolist() == [re.fullmatch("a.b", w) is not None for w in words]
        assert res.as_numpy("admin").tolist() == [w == "admin" for w in words]
    finally:
        c.close()


def test_split_plans_are_per_value_every_byte(nul_server):
    """StringSplit's output shape depends on the input's values, so kiln
    builds a plan per value: values that differ only after a NUL get plans
    of their own, and each answer is Python's split of the bytes sent."""
    c = httpclient.InferenceServerClient(nul_server.url)
    try:
        for words in ([b"a,b\x00,c", b"x"], [b"a,b", b"x"], [b"a,b\x00", b"x"], [b"a,b\x00,c", b"x"], [b"\x00,", b""]):
            i = httpclient.InferInput("s", [len(words)], "BYTES")
            i.set_data_from_numpy(np.array(words, dtype=np.object_), binary_data=True)
            res = c.infer("split", [i])
            parts = [w.split(b",") if w else [b""] for w in words]
            width = max(len(p) for p in parts)
            assert res.as_numpy("count").tolist() == [len(p) for p in parts]
            assert [_as_bytes(r) for r in res.as_numpy("pieces")] == [p + [b""] * (width - len(p)) for p in parts]
    finally:
        c.close()


def test_label_encoder_and_equal_match_onnx_reference(nul_repo, nul_server):
    from onnx.reference import ReferenceEvaluator
    s = _batch(WORDS)
    ref = ReferenceEvaluator(str(nul_repo / "nul" / "1" / "model.onnx"))
    # The reference evaluator holds string constants as Python str: feed it str.
    text = np.array([w.decode() for w in s.flatten()], dtype=object).reshape(s.shape)
    echo, admin, adnul, ids = ref.run(None, {"s": text})
    assert [w.encode() for w in echo.flatten()] == list(s.flatten())
    c = httpclient.InferenceServerClient(nul_server.url)
    try:
        got = _infer(httpclient, c, "nul", s)
    finally:
        c.close()
    assert got["admin"] == admin.flatten().tolist()
    assert got["adnul"] == adnul.flatten().tolist()
    assert got["id"] == ids.flatten().tolist()
    assert got["admin"][WORDS.index(b"admin\x00; drop")] is False


# ---- names with a NUL are refused ------------------------------------------------------------------------

@pytest.mark.parametrize("doc,what", [
    ({"inputs": [{"name": "s\u0000junk", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}]}, "name"),
    ({"inputs": [{"name": "s", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}],
      "outputs": [{"name": "echo\u0000"}]}, "name"),
    ({"inputs": [{"name": "s", "shape": [1, 2], "datatype": "BYTES\u0000", "data": ["a", "b"]}]}, "datatype"),
    ({"id": "x\u0000y", "inputs": [{"name": "s", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}]}, "id"),
    ({"parameters": {"cache\u0000x": True},
      "inputs": [{"name": "s", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}]}, "key"),
])
def test_json_names_with_nul_are_refused(nul_server, doc, what):
    st, _, b = raw_request(nul_server.url, "POST", "/v2/models/nul/infer", json.dumps(doc).encode())
    assert st == 400, b
    msg = json.loads(b)["error"]
    assert "NUL" in msg and what in msg, msg
    # The server goes on serving.
    ok = json.dumps({"inputs": [{"name": "s", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}]})
    assert raw_request(nul_server.url, "POST", "/v2/models/nul/infer", ok.encode())[0] == 200


@pytest.mark.parametrize("case", ["input", "output", "model", "parameter"])
def test_grpc_names_with_nul_are_refused(nul_server, case):
    channel = grpc.insecure_channel(nul_server.grpc_url())
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        req = service_pb2.ModelInferRequest(model_name="nul\x00x" if case == "model" else "nul")
        t = req.inputs.add(name="s\x00junk" if case == "input" else "s", datatype="BYTES", shape=[1, 2])
        t.contents.bytes_contents.extend([b"a", b"b"])
        req.outputs.add(name="echo\x00" if case == "output" else "echo")
        if case == "parameter":
            req.parameters["cache\x00x"].bool_param = True
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(req, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "NUL" in e.value.details(), e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelReady(service_pb2.ModelReadyRequest(name="nul\x00x"), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "NUL" in e.value.details()
        assert stub.ModelReady(service_pb2.ModelReadyRequest(name="nul"), timeout=30).ready
    finally:
        channel.close()
