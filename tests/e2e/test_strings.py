"""BYTES tensors end to end: the real kiln, real models with string outputs
and string inputs, the official tritonclient, a real redis-server.

Two models, each served with dynamic batching:
  encode     x INT64 [N,3] -> label STRING [N,3]  (ai.onnx.ml LabelEncoder)
  roundtrip  s STRING [N,2] -> id INT64, name STRING, echo STRING [N,2]
             (string -> int64 -> string LabelEncoders, and an Identity)

Every path a string takes is covered and every answer checked exactly:
many concurrent requests batched together (the batch stats must show
batches of more than one request), JSON and the binary tensor extension,
an in-process cache hit, a Redis hit, and a crafted Redis value whose
string lengths run past its bytes (refused as a miss, not read).
"""
import json
import re
import socket
import struct
import threading
import time
import urllib.request
import zlib

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto as TP

from conftest import raw_request
from test_cache import Redis

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "naïve", ""]
DEFAULT = "none"
BATCHED = {"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_microseconds": 50000}}
CACHED = {"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_microseconds": 1000},
          "response_cache": {"enable": True}}


def _save(root, name, graph, config, opset=17):
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset), oh.make_opsetid("ai.onnx.ml", 2)])
    model.ir_version = 8 if opset < 19 else 9
    d = root / name / "1"
    d.mkdir(parents=True)
    onnx.save(model, str(d / "model.onnx"))
    (root / name / "config.json").write_text(json.dumps(config))


def _encode_graph():
    return oh.make_graph(
        [oh.make_node("LabelEncoder", ["x"], ["label"], domain="ai.onnx.ml", keys_int64s=list(range(len(NAMES))),
                      values_strings=NAMES, default_string=DEFAULT)],
        "encode", [oh.make_tensor_value_info("x", TP.INT64, ["N", 3])],
        [oh.make_tensor_value_info("label", TP.STRING, ["N", 3])])


def _roundtrip_graph():
    return oh.make_graph(
        [oh.make_node("LabelEncoder", ["s"], ["id"], domain="ai.onnx.ml", keys_strings=NAMES,
                      values_int64s=list(range(len(NAMES))), default_int64=-1),
         oh.make_node("LabelEncoder", ["id"], ["name"], domain="ai.onnx.ml", keys_int64s=list(range(len(NAMES))),
                      values_strings=NAMES, default_string=DEFAULT),
         oh.make_node("Identity", ["s"], ["echo"])],
        "roundtrip", [oh.make_tensor_value_info("s", TP.STRING, ["N", 2])],
        [oh.make_tensor_value_info("id", TP.INT64, ["N", 2]), oh.make_tensor_value_info("name", TP.STRING, ["N", 2]),
         oh.make_tensor_value_info("echo", TP.STRING, ["N", 2])])


@pytest.fixture(scope="module")
def strings_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("strings_repo")
    _save(root, "encode", _encode_graph(), BATCHED)
    _save(root, "roundtrip", _roundtrip_graph(), BATCHED)
    _save(root, "encode_cached", _encode_graph(), CACHED)
    _save(root, "roundtrip_cached", _roundtrip_graph(), CACHED)
    return root


# ---- requests and expected answers ----------------------------------------------

def _text(a):
    return [x.decode() if isinstance(x, bytes) else x for x in np.asarray(a, dtype=object).flatten()]


def _want_label(x):
    return [NAMES[int(v)] if 0 <= v < len(NAMES) else DEFAULT for v in x.flatten()]


def _encode(client, model, x, binary):
    i = httpclient.InferInput("x", list(x.shape), "INT64")
    i.set_data_from_numpy(x, binary_data=binary)
    r = client.infer(model, [i], outputs=[httpclient.InferRequestedOutput("label", binary_data=binary)])
    out = r.as_numpy("label")
    assert out.shape == x.shape
    return _text(out)


def _roundtrip(client, model, s, binary):
    i = httpclient.InferInput("s", list(s.shape), "BYTES")
    i.set_data_from_numpy(s, binary_data=binary)
    outs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("id", "name", "echo")]
    r = client.infer(model, [i], outputs=outs)
    for n in ("id", "name", "echo"):
        assert r.as_numpy(n).shape == s.shape, n
    return r.as_numpy("id").flatten().tolist(), _text(r.as_numpy("name")), _text(r.as_numpy("echo"))


def _check_roundtrip(got, s):
    ids, names, echo = got
    words = _text(s)
    want_ids = [NAMES.index(w) if w in NAMES else -1 for w in words]
    assert ids == want_ids
    assert names == [w if w in NAMES else DEFAULT for w in words]
    assert echo == words


def _words(rng, rows):
    pool = NAMES + ["unknown", "a much longer string that is no label at all " * 3, "tab\there", "quote\"q"]
    return np.array([[pool[rng.integers(len(pool))].encode() for _ in range(2)] for _ in range(rows)], dtype=object)


def _stats(url, model):
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=10) as r:
        return json.load(r)["model_stats"][0]


# ---- batches ------------------------------------------------------------------------

def _concurrently(n, fn):
    """Runs fn(i) on n threads released together; returns the results in order."""
    results, errors = [None] * n, []
    go = threading.Barrier(n)

    def one(i):
        try:
            go.wait()
            results[i] = fn(i)
        except Exception as e:  # reported after the join, with the request's index
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:5]
    return results


@pytest.mark.parametrize("model", ["encode", "roundtrip"])
def test_string_outputs_batched_under_concurrent_load(make_server, strings_repo, model):
    s = make_server(strings_repo)
    n = 48
    rng = np.random.default_rng(19)
    rows = [int(rng.integers(1, 4)) for _ in range(n)]
    if model == "encode":
        data = [rng.integers(-2, len(NAMES) + 2, size=(r, 3)).astype(np.int64) for r in rows]
    else:
        data = [_words(rng, r) for r in rows]
    before = _stats(s.url, model)
    for rnd in range(3):
        # Half the requests as JSON, half binary, mixed in each batch. Each
        # thread has its own client (the client is not shared across threads).
        def one(i):
            binary = (i + rnd) % 2 == 1
            c = httpclient.InferenceServerClient(s.url)
            try:
                if model == "encode":
                    return _encode(c, model, data[i], binary)
                return _roundtrip(c, model, data[i], binary)
            finally:
                c.close()

        got = _concurrently(n, one)
        for i in range(n):
            if model == "encode":
                assert got[i] == _want_label(data[i]), f"round {rnd}, request {i}"
            else:
                _check_roundtrip(got[i], data[i])
    after = _stats(s.url, model)
    assert after["inference_count"] - before["inference_count"] == 3 * sum(rows)
    executions = after["execution_count"] - before["execution_count"]
    sizes = [b["batch_size"] for b in after.get("batch_stats", [])]
    assert executions < 3 * n, f"{executions} executions for {3 * n} requests: no batching"
    assert any(b > 1 for b in sizes), f"batch sizes seen: {sizes}"
    assert s.proc.poll() is None, s.text()
    print(f"{model}: {3 * n} requests ran in {executions} batches; batch sizes seen: {sorted(sizes)}")


# ---- the in-process cache ---------------------------------------------------------------

def test_string_outputs_from_the_in_process_cache(make_server, strings_repo):
    s = make_server(strings_repo)
    c = httpclient.InferenceServerClient(s.url)
    rng = np.random.default_rng(7)
    try:
        x = rng.integers(-1, len(NAMES) + 1, size=(4, 3)).astype(np.int64)
        w = _words(rng, 3)
        for binary in (False, True):
            for _ in range(3):  # a miss, then hits
                assert _encode(c, "encode_cached", x, binary) == _want_label(x)
                _check_roundtrip(_roundtrip(c, "roundtrip_cached", w, binary), w)
        # A raw JSON hit is byte-identical to the miss that filled it.
        body = json.dumps({"inputs": [{"name": "s", "shape": [1, 2], "datatype": "BYTES",
                                       "data": ["five", "naïve"]}]}).encode()
        st1, _, b1 = raw_request(s.url, "POST", "/v2/models/roundtrip_cached/infer", body)
        st2, _, b2 = raw_request(s.url, "POST", "/v2/models/roundtrip_cached/infer", body)
        assert st1 == st2 == 200 and b1 == b2
        outs = {o["name"]: o["data"] for o in json.loads(b2)["outputs"]}
        assert outs == {"id": [5, 10], "name": ["five", "naïve"], "echo": ["five", "naïve"]}
    finally:
        c.close()
    for m, misses in (("encode_cached", 2), ("roundtrip_cached", 3)):
        st = _stats(s.url, m)["inference_stats"]
        assert int(st["cache_miss"]["count"]) == misses, m
        assert int(st["cache_hit"]["count"]) >= 4, m


# ---- Redis ---------------------------------------------------------------------------------

@pytest.fixture()
def redis():
    r = Redis()
    yield r
    r.stop()


def _metric(url, name):
    _, _, body = raw_request(url, "GET", "/metrics")
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", body.decode(), re.M)
    return float(m.group(1)) if m else None


def _wait_connected(url):
    for _ in range(200):
        if _metric(url, "kiln_cache_redis_connected") == 2:
            return
        time.sleep(0.05)
    raise AssertionError("kiln did not connect to redis")


def _resp(port, *args):
    """One Redis command over RESP, binary-safe: a bulk string reply as bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        cmd = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
        sock.sendall(cmd)
        f = sock.makefile("rb")
        head = f.readline()
        if head.startswith(b"$"):
            n = int(head[1:])
            return None if n < 0 else f.read(n + 2)[:-2]
        return head.strip()


def _keys(redis):
    for _ in range(200):
        keys = redis.cli("keys", "kiln:*").split()
        if keys:
            return keys
        time.sleep(0.02)
    return []


def test_string_outputs_from_redis(make_server, strings_repo, redis):
    # No in-process tier: the second request of each kind is a Redis hit.
    s = make_server(strings_repo, "--cache-size", "0", "--redis-url", redis.url)
    _wait_connected(s.url)
    c = httpclient.InferenceServerClient(s.url)
    rng = np.random.default_rng(11)
    w = _words(rng, 4)
    try:
        for binary in (False, True):
            _check_roundtrip(_roundtrip(c, "roundtrip_cached", w, binary), w)
            for _ in range(50):  # the SET is asynchronous
                if len(_keys(redis)) == (2 if binary else 1):
                    break
                time.sleep(0.02)
            _check_roundtrip(_roundtrip(c, "roundtrip_cached", w, binary), w)
    finally:
        c.close()
    st = _stats(s.url, "roundtrip_cached")["inference_stats"]
    assert int(st["cache_hit"]["count"]) == 2 and int(st["cache_miss"]["count"]) == 2
    assert _metric(s.url, 'kiln_cache_hits_total{tier="redis"}') == 2


def _string_prefixes(value):
    """Offsets of each string length prefix in a cache value (see cache.h's
    encoding: magic, version, count, per tensor name, dtype, shape, bytes)."""
    p, offs = 12, []
    (n,) = struct.unpack_from("<I", value, 8)
    for _ in range(n):
        (nl,) = struct.unpack_from("<I", value, p)
        p += 4 + nl
        dt, nd = struct.unpack_from("<II", value, p)
        p += 8 + 8 * nd
        (nb,) = struct.unpack_from("<Q", value, p)
        p += 8
        if dt == TP.STRING:
            q = p
            while q < p + nb:
                offs.append(q)
                q += 4 + struct.unpack_from("<I", value, q)[0]
        p += nb
    return offs


def test_redis_value_with_overlong_string_lengths_is_a_miss(make_server, strings_repo, redis):
    s = make_server(strings_repo, "--cache-size", "0", "--redis-url", redis.url)
    _wait_connected(s.url)
    c = httpclient.InferenceServerClient(s.url)
    x = np.array([[1, 2, 3], [4, 5, 99]], dtype=np.int64)
    try:
        assert _encode(c, "encode_cached", x, True) == _want_label(x)
        keys = _keys(redis)
        assert len(keys) == 1
        key = keys[0].encode()
        good = _resp(redis.port, b"GET", key)
        offs = _string_prefixes(good)
        assert len(offs) == 6
        # Each crafted value keeps a valid checksum: only the lengths lie.
        for off, length in ((offs[0], 0x7FFFFFF0), (offs[3], 1000), (offs[5], 0xFFFFFFFF)):
            bad = bytearray(good[:-4])
            struct.pack_into("<I", bad, off, length)
            bad += struct.pack("<I", zlib.crc32(bytes(bad)))
            assert _resp(redis.port, b"SET", key, bytes(bad)) == b"+OK"
            assert _encode(c, "encode_cached", x, True) == _want_label(x)
            assert s.proc.poll() is None, s.text()
            for _ in range(100):  # the miss's answer overwrites the value
                if _resp(redis.port, b"GET", key) == good:
                    break
                time.sleep(0.02)
    finally:
        c.close()
    st = _stats(s.url, "encode_cached")["inference_stats"]
    assert int(st["cache_hit"]["count"]) == 0 and int(st["cache_miss"]["count"]) == 4
    refused = [_metric(s.url, m) for m in ("kiln_cache_redis_corrupt_total", "kiln_cache_redis_rejected_total")]
    assert sum(v or 0 for v in refused) >= 3, refused
