"""The result cache end to end: the real kiln, a real redis-server on a free
loopback port, the official tritonclient.

Covers: miss then a byte-identical hit, shape in the key, the per-request
bypass, TTL expiry, LRU eviction at the byte limit, single-flight, Redis
killed under load (no failed request, caching resumes), Redis paused
(answers within the timeout), a corrupted Redis value (miss, overwritten),
hostile Redis values (a crafted old-style value whose strings run past its
end, values with a valid MAC but a bad length or shape, poisoned and moved
values, a 20 MiB value: each refused, counted, answered right), and Redis
down for 12 s under load (caching back within 2 s), and requests with more
than 256 inputs (all of them in the key).
"""
import concurrent.futures as cf
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import onnx.helper as oh
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto as TP

from conftest import KilnServer, no_batch_config, save_model, slow_graph, strings_graph, raw_request

CACHED = '{"max_batch_size": 0, "response_cache": {"enable": true}}'
CACHED_BATCH = '{"max_batch_size": 8, "dynamic_batching": {}, "response_cache": {"enable": true}}'
SECRET = "test-secret"  # --cache-secret where servers share Redis or a test writes values


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Redis:
    def __init__(self, password=None):
        self.port = free_port()
        self.password = password
        self.proc = None
        self.start()

    def start(self):
        auth = ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             *auth], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            if self.cli("ping") == "PONG":
                return
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def cli(self, *args):
        env = dict(os.environ, REDISCLI_AUTH=self.password) if self.password else None
        r = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, timeout=10, env=env)
        return r.stdout.decode(errors="replace").strip()

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.kill()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"


@pytest.fixture()
def redis():
    r = Redis()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def cache_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache_repo")
    # y = 2x over any 2-D shape: the same bytes can come in different shapes.
    two = oh.make_tensor("two", TP.FLOAT, [], [2.0])
    g = oh.make_graph([oh.make_node("Mul", ["x", "two"], ["y"])], "double",
                      [oh.make_tensor_value_info("x", TP.FLOAT, ["A", "B"])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, ["A", "B"])], [two])
    save_model(root, "double", g, config=json.dumps(no_batch_config(g, response_cache={"enable": True})))
    save_model(root, "slow", slow_graph(depth=120), config=CACHED)
    # A batching model for the mixed load.
    w = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    g2 = oh.make_graph([oh.make_node("MatMul", ["x", "W"], ["y"])], "lin",
                       [oh.make_tensor_value_info("x", TP.FLOAT, ["N", 4])],
                       [oh.make_tensor_value_info("y", TP.FLOAT, ["N", 3])],
                       [oh.make_tensor("W", TP.FLOAT, w.shape, w.flatten())])
    save_model(root, "lin", g2, config=CACHED_BATCH)
    save_model(root, "strings", strings_graph(), config=CACHED_BATCH)
    return root


def infer(url, model, x, name="x", params=None):
    c = httpclient.InferenceServerClient(url)
    try:
        i = httpclient.InferInput(name, list(x.shape), "FP32")
        i.set_data_from_numpy(x, binary_data=True)
        r = c.infer(model, [i], parameters=params)
        return r.as_numpy("y")
    finally:
        c.close()


def stats(url, model):
    c = httpclient.InferenceServerClient(url)
    try:
        s = c.get_inference_statistics(model)["model_stats"][0]
    finally:
        c.close()
    i = s["inference_stats"]
    return {"exec": int(s["execution_count"]), "hit": int(i["cache_hit"]["count"]),
            "miss": int(i["cache_miss"]["count"]), "success": int(i["success"]["count"]),
            "queue": int(i["queue"]["count"]), "infer": int(i["compute_infer"]["count"])}


def metric(url, name):
    _, _, body = raw_request(url, "GET", "/metrics")
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", body.decode(), re.M)
    return float(m.group(1)) if m else None


def test_miss_then_identical_hit(make_server, cache_repo):
    s = make_server(cache_repo)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    body = ('{"inputs":[{"name":"x","shape":[3,4],"datatype":"FP32","data":%s}]}' % x.flatten().tolist()).encode()
    st1, _, b1 = raw_request(s.url, "POST", "/v2/models/double/infer", body)
    st2, _, b2 = raw_request(s.url, "POST", "/v2/models/double/infer", body)
    assert st1 == st2 == 200
    assert b1 == b2  # the cached answer is byte-identical
    assert stats(s.url, "double")["exec"] == 1
    # Binary outputs are another request (the key holds the output parameters).
    np.testing.assert_array_equal(infer(s.url, "double", x), 2 * x)
    np.testing.assert_array_equal(infer(s.url, "double", x), 2 * x)
    st = stats(s.url, "double")
    assert st["exec"] == 2 and st["miss"] == 2 and st["hit"] == 2 and st["success"] == 4
    # As in Triton, hits are successes but not queued or computed requests.
    assert st["queue"] == 2 and st["infer"] == 2


def test_shape_is_part_of_the_key_and_bypass(make_server, cache_repo):
    s = make_server(cache_repo)
    x = np.arange(8, dtype=np.float32)
    a = infer(s.url, "double", x.reshape(2, 4))
    b = infer(s.url, "double", x.reshape(4, 2))
    assert a.shape == (2, 4) and b.shape == (4, 2)
    assert stats(s.url, "double")["miss"] == 2
    # "cache": false goes straight to the model, every time.
    before = stats(s.url, "double")["exec"]
    for _ in range(3):
        infer(s.url, "double", x.reshape(2, 4), params={"cache": False})
    assert stats(s.url, "double")["exec"] == before + 3


def test_ttl_expiry(make_server, cache_repo, redis):
    s = make_server(cache_repo, "--cache-size", "0", "--redis-url", redis.url, "--cache-ttl-secs", "1")
    x = np.ones((2, 2), np.float32)
    for _ in range(100):
        if metric(s.url, "kiln_cache_redis_connected") == 2:
            break
        time.sleep(0.05)
    infer(s.url, "double", x)
    for _ in range(100):
        if redis.cli("dbsize") == "1":
            break
        time.sleep(0.02)
    assert int(redis.cli("dbsize")) == 1
    infer(s.url, "double", x)
    assert stats(s.url, "double")["hit"] == 1
    time.sleep(1.5)
    assert int(redis.cli("dbsize")) == 0
    infer(s.url, "double", x)
    st = stats(s.url, "double")
    assert st["hit"] == 1 and st["exec"] == 2


def test_lru_evicts_at_the_byte_limit(make_server, cache_repo):
    s = make_server(cache_repo, "--cache-size", "64K")
    for i in range(200):
        infer(s.url, "double", np.full((16, 16), i, np.float32))
    assert metric(s.url, "kiln_cache_evictions_total") > 0
    assert metric(s.url, "kiln_cache_bytes") <= 64 * 1024
    # The most recent entry is still there; the first is gone (each of the 16
    # shards holds about three of these values and saw a dozen more after it).
    before = stats(s.url, "double")
    infer(s.url, "double", np.full((16, 16), 199, np.float32))
    infer(s.url, "double", np.full((16, 16), 0, np.float32))
    after = stats(s.url, "double")
    assert after["hit"] == before["hit"] + 1 and after["miss"] == before["miss"] + 1


def test_single_flight(make_server, cache_repo):
    s = make_server(cache_repo)
    x = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
    with cf.ThreadPoolExecutor(16) as ex:
        outs = list(ex.map(lambda _: infer(s.url, "slow", x), range(16)))
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    st = stats(s.url, "slow")
    assert st["exec"] == 1, st
    assert st["success"] == 16
    assert metric(s.url, "kiln_cache_single_flight_waits_total") + st["hit"] >= 15


def test_redis_killed_under_load_then_restarted(make_server, cache_repo, redis):
    s = make_server(cache_repo, "--cache-size", "0", "--redis-url", redis.url)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((2, 4)).astype(np.float32) for _ in range(30)]
    errors = []

    def one(k):
        try:
            x = xs[k % len(xs)]
            y = infer(s.url, "lin", x)
            assert y.shape == (2, 3)
        except Exception as e:  # noqa: BLE001 - every failure is collected
            errors.append(repr(e))

    with cf.ThreadPoolExecutor(8) as ex:
        futs = [ex.submit(one, k) for k in range(200)]
        time.sleep(0.2)
        redis.kill()
        futs += [ex.submit(one, k) for k in range(200, 400)]
        cf.wait(futs)
    assert errors == []
    # Back up: caching resumes without restarting kiln.
    redis.start()
    deadline = time.time() + 15
    stored = 0
    while time.time() < deadline and stored == 0:
        infer(s.url, "lin", rng.standard_normal((1, 4)).astype(np.float32))
        stored = int(redis.cli("dbsize") or 0)
        time.sleep(0.2)
    assert stored > 0


def test_redis_paused_answers_within_timeout(make_server, cache_repo, redis):
    s = make_server(cache_repo, "--cache-size", "0", "--redis-url", redis.url)
    infer(s.url, "double", np.ones((1, 1), np.float32))
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        for i in range(20):
            t = time.monotonic()
            y = infer(s.url, "double", np.full((2, 2), i, np.float32))
            assert y[0, 0] == 2 * i
            # a few ms of Redis timeout plus compute: far below a second
            assert time.monotonic() - t < 1.0
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)
    assert metric(s.url, "kiln_cache_redis_timeouts_total") >= 1


def test_corrupted_redis_value_is_a_miss_and_overwritten(make_server, cache_repo, redis):
    s = make_server(cache_repo, "--cache-size", "0", "--redis-url", redis.url)
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    for _ in range(100):
        if metric(s.url, "kiln_cache_redis_connected") == 2:
            break
        time.sleep(0.05)
    infer(s.url, "double", x)
    for _ in range(100):
        keys = redis.cli("keys", "kiln:*").split()
        if keys:
            break
        time.sleep(0.02)
    assert len(keys) == 1
    redis.cli("set", keys[0], "KLNC garbage that is not a value")
    np.testing.assert_array_equal(infer(s.url, "double", x), 2 * x)
    assert metric(s.url, "kiln_cache_redis_rejected_total") == 1
    for _ in range(100):
        if redis.cli("strlen", keys[0]) != str(len("KLNC garbage that is not a value")):
            break
        time.sleep(0.02)
    assert redis.cli("strlen", keys[0]) != str(len("KLNC garbage that is not a value"))
    np.testing.assert_array_equal(infer(s.url, "double", x), 2 * x)
    assert stats(s.url, "double")["hit"] >= 1


def test_redis_absent_at_start_serves(make_server, cache_repo):
    s = make_server(cache_repo, "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    x = np.ones((1, 3), np.float32)
    np.testing.assert_array_equal(infer(s.url, "double", x), 2 * x)
    assert "serving without it" in s.text()


def test_redis_with_a_password(make_server, cache_repo):
    r = Redis(password="pw-0123456789abcdef")
    try:
        assert "NOAUTH" in subprocess.run(["redis-cli", "-p", str(r.port), "dbsize"], capture_output=True).stdout.decode()
        s = make_server(cache_repo, "--cache-size", "0", "--cache-secret", SECRET,
                        "--redis-url", f"redis://:{r.password}@127.0.0.1:{r.port}/0")
        x = np.full((2, 2), 5, np.float32)
        infer(s.url, "double", x)
        for _ in range(100):
            if r.cli("dbsize") == "1":
                break
            time.sleep(0.02)
        assert r.cli("dbsize") == "1"
        np.testing.assert_array_equal(infer(s.url, "double", x), 2 * x)
        assert stats(s.url, "double")["hit"] == 1
        # The default user named explicitly (AUTH user password) works too; a
        # wrong password is a warning and misses, never a failed request.
        s2 = make_server(cache_repo, "--cache-size", "0", "--cache-secret", SECRET,
                         "--redis-url", f"redis://default:{r.password}@127.0.0.1:{r.port}/0")
        np.testing.assert_array_equal(infer(s2.url, "double", x), 2 * x)
        assert stats(s2.url, "double")["hit"] == 1
        s3 = make_server(cache_repo, "--cache-size", "0", "--cache-secret", SECRET,
                         "--redis-url", f"redis://:wrong@127.0.0.1:{r.port}/0")
        np.testing.assert_array_equal(infer(s3.url, "double", x), 2 * x)
        assert stats(s3.url, "double")["hit"] == 0
        assert "AUTH failed" in s3.text()
    finally:
        r.stop()


# ---- hostile Redis values -------------------------------------------------------

MAC_BYTES = 32


def value_mac(secret, key_hex, value):
    """kiln's MAC of a Redis value: HMAC-SHA-256 under the stretched secret
    over framed fields (8-byte little-endian length, then the bytes)."""
    k = hashlib.blake2b(secret.encode(), digest_size=32, key=b"kiln-cache-secret-v1").digest()
    frame = b"".join(struct.pack("<Q", len(f)) + f for f in (b"kiln-value-v1", bytes.fromhex(key_hex), value))
    return hmac.new(k, frame, hashlib.sha256).digest()


def parse_value(v):
    """[(name, dtype, dims, payload)] of an encoded value (without its MAC)."""
    assert v[:4] == b"KLNC"
    ver, n = struct.unpack_from("<II", v, 4)
    p, out = 12, []
    for _ in range(n):
        (nl,) = struct.unpack_from("<I", v, p)
        name = v[p + 4:p + 4 + nl - 1].decode()
        p += 4 + nl
        dt, nd = struct.unpack_from("<II", v, p)
        dims = list(struct.unpack_from("<%dQ" % nd, v, p + 8))
        p += 8 + 8 * nd
        (nb,) = struct.unpack_from("<Q", v, p)
        out.append((name, dt, dims, v[p + 8:p + 8 + nb]))
        p += 8 + nb
    return ver, out


def build_value(ver, tensors):
    b = b"KLNC" + struct.pack("<II", ver, len(tensors))
    for name, dt, dims, payload in tensors:
        nm = name.encode() + b"\0"
        b += struct.pack("<I", len(nm)) + nm + struct.pack("<II", dt, len(dims))
        b += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<Q", len(payload)) + payload
    return b


def rget(redis, key):
    """The raw bytes under key (redis-cli would mangle binary output)."""
    with socket.create_connection(("127.0.0.1", redis.port)) as c:
        c.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key.encode()))
        f = c.makefile("rb")
        head = f.readline()
        if head.startswith(b"$-1"):
            return None
        return f.read(int(head[1:]) + 2)[:-2]


def rset(redis, key, value):
    with socket.create_connection(("127.0.0.1", redis.port)) as c:
        c.sendall(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(key), key.encode(), len(value)) + value + b"\r\n")
        assert c.makefile("rb").readline() == b"+OK\r\n"


def redis_keys(redis, want):
    for _ in range(200):
        keys = []
        cursor = "0"
        while True:
            out = redis.cli("scan", cursor, "match", "kiln:*", "count", "1000").split()
            cursor, keys = out[0], keys + out[1:]
            if cursor == "0":
                break
        if len(keys) >= want:
            return keys
        time.sleep(0.02)
    raise AssertionError(f"{len(keys)} keys in Redis, expected {want}")


def wait_connected(s, n=2):
    for _ in range(200):
        if metric(s.url, "kiln_cache_redis_connected") == n:
            return
        time.sleep(0.05)
    raise AssertionError("kiln did not connect to Redis")


def infer_strings(url, rows):
    c = httpclient.InferenceServerClient(url)
    try:
        x = np.array(rows, dtype=np.object_)
        i = httpclient.InferInput("s", list(x.shape), "BYTES")
        i.set_data_from_numpy(x, binary_data=True)
        return c.infer("strings", [i]).as_numpy("out")
    finally:
        c.close()


def wait_rewritten(redis, key, bad):
    for _ in range(200):
        if rget(redis, key) != bad:
            return rget(redis, key)
        time.sleep(0.02)
    raise AssertionError("the refused value was not overwritten")


BYTES = 8  # kiln's dtype code for strings (common/tensor.h)


def test_crafted_string_values_rejected(make_server, cache_repo, redis):
    s = make_server(cache_repo, "--cache-size", "0", "--redis-url", redis.url, "--cache-secret", SECRET)
    wait_connected(s)
    rows = [[b"alpha", b"be"]]
    want = np.array(rows, dtype=np.object_)
    np.testing.assert_array_equal(infer_strings(s.url, rows), want)
    (key,) = redis_keys(redis, 1)
    # String lengths far past the tensor's bytes.
    bad_strings = struct.pack("<I", 1 << 30) + b"alpha" + struct.pack("<I", 1 << 30) + b"be"
    # What an attacker could write before: a value with a valid CRC (it
    # crashed every replica that read it).
    old = build_value(1, [("out", BYTES, [1, 2], bad_strings)])
    old += struct.pack("<I", zlib.crc32(old))
    rset(redis, key, old)
    np.testing.assert_array_equal(infer_strings(s.url, rows), want)
    assert metric(s.url, "kiln_cache_redis_rejected_total") == 1
    good = wait_rewritten(redis, key, old)
    ver, tensors = parse_value(good[:-MAC_BYTES])
    (name, dt, dims, payload), = tensors
    assert (name, dt, dims) == ("out", BYTES, [1, 2])
    # With a valid MAC (the test knows the secret), values that do not fit:
    crafted = [
        build_value(ver, [(name, dt, dims, bad_strings)]),                       # lengths past the end
        build_value(ver, [(name, dt, [1, 3], payload)]),                         # count != bytes
        build_value(ver, [(name, dt, [1, 1], payload[:9])]),                     # shape not the model's
        build_value(ver, [(name, dt, [2, 2], payload + payload)]),               # rows not the request's
        build_value(ver, [(name, 1, dims, b"\0" * 8)]),                          # FP32, not BYTES
        build_value(ver, [(name, dt, [1 << 16] * 4, payload)]),                  # 2^64 elements
    ]
    for i, v in enumerate(crafted):
        v += value_mac(SECRET, key[5:], v)
        rset(redis, key, v)
        np.testing.assert_array_equal(infer_strings(s.url, rows), want)
        assert metric(s.url, "kiln_cache_redis_rejected_total") == i + 2
        assert wait_rewritten(redis, key, v) == good
    assert s.proc.poll() is None
    # The value kiln wrote back answers from Redis again.
    np.testing.assert_array_equal(infer_strings(s.url, rows), want)
    assert metric(s.url, "kiln_cache_redis_rejected_total") == len(crafted) + 1
    assert stats(s.url, "strings")["hit"] >= 1


def test_poisoned_and_moved_values_rejected(make_server, cache_repo, redis):
    s = make_server(cache_repo, "--cache-size", "0", "--redis-url", redis.url, "--cache-secret", SECRET)
    wait_connected(s)
    xs = [np.full((1, 4), i, np.float32) for i in range(6)]
    ys = [infer(s.url, "lin", x) for x in xs]
    keys = redis_keys(redis, len(xs))
    values = {k: rget(redis, k) for k in keys}

    def all_repaired():
        for k in keys:
            for _ in range(200):
                if rget(redis, k) == values[k]:
                    break
                time.sleep(0.02)
            assert rget(redis, k) == values[k]

    # Poisoning, first with values exactly as kiln writes them: every key gets
    # another key's value (a well-formed value with other answers).
    for i, k in enumerate(keys):
        rset(redis, k, values[keys[(i + 1) % len(keys)]])
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(infer(s.url, "lin", x), y)
    assert metric(s.url, "kiln_cache_redis_rejected_total") == len(xs)
    all_repaired()
    # Then each value with one answer changed, its old MAC kept.
    for k in keys:
        ver, ((name, dt, dims, payload),) = parse_value(values[k][:-MAC_BYTES])
        y = np.frombuffer(payload, np.float32).copy()
        y[0] = 1234.0
        rset(redis, k, build_value(ver, [(name, dt, dims, y.tobytes())]) + values[k][-MAC_BYTES:])
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(infer(s.url, "lin", x), y)
    assert metric(s.url, "kiln_cache_redis_rejected_total") == 2 * len(xs)
    all_repaired()
    # A fresh replica sharing Redis and the secret reads the repaired values.
    s2 = make_server(cache_repo, "--cache-size", "0", "--redis-url", redis.url, "--cache-secret", SECRET)
    wait_connected(s2)
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(infer(s2.url, "lin", x), y)
    assert stats(s2.url, "lin")["hit"] == len(xs)


def test_oversized_value_dropped(make_server, cache_repo, redis):
    s = make_server(cache_repo, "--cache-size", "0", "--redis-url", redis.url, "--cache-secret", SECRET)
    wait_connected(s)
    x = np.full((2, 2), 3, np.float32)
    infer(s.url, "double", x)
    (key,) = redis_keys(redis, 1)
    good = rget(redis, key)

    def sent():
        m = re.search(r"total_net_output_bytes:(\d+)", redis.cli("info", "stats"))
        return int(m.group(1))

    huge = b"KLNC" + b"x" * (20 << 20)
    rset(redis, key, huge)
    before = sent()
    np.testing.assert_array_equal(infer(s.url, "double", x), 2 * x)
    # Redis sent kiln the default limit (4 MiB) and a byte, not 20 MiB.
    assert sent() - before < (4 << 20) + 4096
    for _ in range(200):  # a reply that big may come after the lookup's timeout
        if metric(s.url, "kiln_cache_redis_rejected_total") == 1:
            break
        time.sleep(0.01)
    assert metric(s.url, "kiln_cache_redis_rejected_total") == 1
    assert wait_rewritten(redis, key, huge) == good
    assert s.proc.poll() is None


def test_redis_outage_12s_under_load_resumes_within_2s(make_server, cache_repo, redis):
    s = make_server(cache_repo, "--cache-size", "0", "--redis-url", redis.url, "--http-threads", "4")
    wait_connected(s, 4)
    rng = np.random.default_rng(5)
    errors, stop = [], threading.Event()
    count = [0]

    def client():
        c = httpclient.InferenceServerClient(s.url)
        try:
            while not stop.is_set():
                x = rng.standard_normal((1, 4)).astype(np.float32)
                i = httpclient.InferInput("x", [1, 4], "FP32")
                i.set_data_from_numpy(x, binary_data=True)
                try:
                    c.infer("lin", [i])
                    count[0] += 1
                except Exception as e:  # noqa: BLE001 - every failure is collected
                    errors.append(repr(e))
        finally:
            c.close()

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(1)
        redis.kill()
        time.sleep(12)
        redis.start()  # same port; returns once Redis answers PING
        t0 = time.monotonic()
        base = metric(s.url, "kiln_cache_redis_stores_total")
        resumed = None
        while time.monotonic() - t0 < 10:
            if (metric(s.url, "kiln_cache_redis_connected") == 4
                    and metric(s.url, "kiln_cache_redis_stores_total") > base):
                resumed = time.monotonic() - t0
                break
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join()
    print(f"caching resumed {resumed} s after Redis answered; {count[0]} requests")
    assert errors == []
    assert resumed is not None and resumed <= 2.0, resumed


# ---- keys of requests with many inputs ---------------------------------------------


@pytest.fixture(scope="module")
def wide_repo(tmp_path_factory):
    """300 inputs concatenated: the 257th in name order is where keys stopped.
    (Requested outputs are hashed the same way; a value holds at most 64
    outputs, and a model with more is not cached.)"""
    root = tmp_path_factory.mktemp("wide_repo")
    names = ["i%03d" % k for k in range(300)]
    # Concat in groups of 50 (a node takes at most 64 inputs), then the groups.
    groups = [oh.make_node("Concat", names[j:j + 50], ["g%d" % j], axis=0) for j in range(0, 300, 50)]
    top = oh.make_node("Concat", ["g%d" % j for j in range(0, 300, 50)], ["y"], axis=0)
    g = oh.make_graph(groups + [top], "wide",
                      [oh.make_tensor_value_info(nm, TP.FLOAT, [1]) for nm in names],
                      [oh.make_tensor_value_info("y", TP.FLOAT, [300])])
    save_model(root, "wide", g, config=CACHED)
    return root


def test_more_than_256_inputs_all_keyed(make_server, wide_repo):
    s = make_server(wide_repo)

    def run(last):
        c = httpclient.InferenceServerClient(s.url)
        try:
            ins = []
            for k in range(300):
                i = httpclient.InferInput("i%03d" % k, [1], "FP32")
                i.set_data_from_numpy(np.array([last if k == 299 else k], np.float32), binary_data=True)
                ins.append(i)
            return c.infer("wide", ins).as_numpy("y")
        finally:
            c.close()

    assert run(1.0)[299] == 1.0
    assert run(2.0)[299] == 2.0  # differs from the first in input #300 only
    assert run(2.0)[299] == 2.0
    st = stats(s.url, "wide")
    assert st["exec"] == 2 and st["hit"] == 1


class HostileRedis:
    """A fake Redis that answers GETRANGE with a bulk reply announced as 1 GiB
    and then trickles its bytes: it records, per connection, the bytes it got
    out before kiln closed the connection (None while open)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.sent_before_close = []
        self.stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopping:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            i = len(self.sent_before_close)
            self.sent_before_close.append(None)
            threading.Thread(target=self._serve, args=(c, i), daemon=True).start()

    def _serve(self, c, i):
        import select
        got, sent = b"", 0
        c.settimeout(30)
        try:
            while b"GETRANGE" not in got:
                b = c.recv(65536)
                if not b:
                    self.sent_before_close[i] = sent
                    return
                got += b
            c.sendall(b"$1073741824\r\n")
            while not self.stopping and sent < (64 << 20):
                r, _, _ = select.select([c], [], [], 0.02)
                if r and not c.recv(65536, socket.MSG_PEEK):
                    break  # kiln closed it
                if r:
                    c.recv(65536)  # a later command (SET): never answered
                c.sendall(b"x" * 4096)
                sent += 4096
        except OSError:
            pass
        self.sent_before_close[i] = sent
        c.close()

    def close(self):
        self.stopping = True
        self.sock.close()


def test_hostile_redis_bulk_reply_is_not_buffered(make_server, cache_repo):
    """A Redis server that announces a 1 GiB bulk reply: kiln drops the
    connection at the announcement (no more than its largest value is ever
    buffered), answers the request itself (fail open) and keeps serving."""
    fake = HostileRedis()
    try:
        s = make_server(cache_repo, "--cache-size", "0", "--redis-url", f"redis://127.0.0.1:{fake.port}")
        wait_connected(s)
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(infer(s.url, "double", x), 2 * x)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(n is not None for n in fake.sent_before_close):
            time.sleep(0.05)
        closed = [n for n in fake.sent_before_close if n is not None]
        assert closed, "kiln kept reading a 1 GiB bulk reply"
        assert max(closed) < (1 << 20), closed  # dropped at the announcement, not after the bytes
        assert "sent a reply longer than any kiln asks for" in s.text()
        np.testing.assert_array_equal(infer(s.url, "double", x + 1), 2 * (x + 1))
        assert s.proc.poll() is None
    finally:
        fake.close()


def test_classification_computed_and_cached_alike(make_server, cache_repo):
    """A computed answer is classified on the instance thread that ran the
    model, a cached one by the encoder from the stored outputs: both give
    the same bytes, batched or not, over HTTP and gRPC."""
    import tritonclient.grpc as grpcclient
    s = make_server(cache_repo)
    x = np.array([[3, 1, 2, 9], [0, 5, 5, 1]], np.float32)
    for model, k in (("double", 3), ("lin", 2)):
        body = ('{"inputs":[{"name":"x","shape":[2,4],"datatype":"FP32","data":%s}],'
                               '"outputs":[{"name":"y","parameters":{"classification":%d}}]}'
                               % (x.flatten().tolist(), k)).encode()
        st1, _, computed = raw_request(s.url, "POST", f"/v2/models/{model}/infer", body)
        st2, _, cached = raw_request(s.url, "POST", f"/v2/models/{model}/infer", body)
        assert st1 == st2 == 200, computed
        assert computed == cached
        assert stats(s.url, model)["hit"] >= 1
    g = grpcclient.InferenceServerClient(s.grpc_url())
    try:
        answers = []
        for _ in range(2):
            i = grpcclient.InferInput("x", [2, 4], "FP32")
            i.set_data_from_numpy(x)
            r = g.infer("double", [i], outputs=[grpcclient.InferRequestedOutput("y", class_count=3)])
            answers.append(r.as_numpy("y").tolist())
    finally:
        g.close()
    assert answers[0] == answers[1]
    # Without batching the whole [2, 4] tensor is one row: 2x = 6 2 4 18 0 10 10 2.
    top = [v.decode().split(":") for v in np.array(answers[0]).reshape(-1)]
    assert [int(i) for _, i in top] == [3, 5, 6] and float(top[0][0]) == 18.0


# ---- the Redis tier's health, as the metrics tell it --------------------------


def wait_metric(url, name, want, timeout=15):
    """Polls /metrics until name reads want (a liveness bound, not a timing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = metric(url, name)
        if v == want:
            return v
        time.sleep(0.05)
    return metric(url, name)


def test_wrong_password_is_not_connected_and_retried(make_server, cache_repo):
    """A refused AUTH is no connection (kiln_cache_redis_connected 0), logged
    once an interval however many threads retry; once Redis takes the
    password, every thread connects without a restart."""
    r = Redis(password="right-password")
    try:
        s = make_server(cache_repo, "--cache-size", "0", "--cache-secret", SECRET, "--http-threads", "4",
                        "--redis-url", f"redis://:kiln-password@127.0.0.1:{r.port}/1")
        x = np.full((2, 2), 7, np.float32)
        np.testing.assert_array_equal(infer(s.url, "double", x), 2 * x)
        deadline = time.monotonic() + 10
        while "AUTH failed" not in s.text():
            assert time.monotonic() < deadline, s.text()
            time.sleep(0.05)
        time.sleep(3)  # threads retry about once a second meanwhile
        assert metric(s.url, "kiln_cache_redis_connected") == 0
        assert s.text().count("AUTH failed") == 1, s.text()
        assert r.cli("-n", "1", "dbsize") == "0"
        # Redis takes kiln's password now: no restart of kiln needed.
        r.cli("config", "set", "requirepass", "kiln-password")
        r.password = "kiln-password"
        assert wait_metric(s.url, "kiln_cache_redis_connected", 4) == 4
        infer(s.url, "double", x + 1)
        for _ in range(200):
            if r.cli("-n", "1", "dbsize") == "1":
                break
            time.sleep(0.02)
        assert r.cli("-n", "1", "dbsize") == "1"
    finally:
        r.stop()


def test_breaker_gauge_closes_on_time_and_stores_go_on(make_server, cache_repo, redis):
    """Lookups that time out open the breaker; while it is open lookups are
    skipped but stores are still sent, so another replica finds the result;
    the gauge falls back to 0 when the breaker closes, with no request to
    this server in between."""
    s = make_server(cache_repo, "--cache-size", "0", "--cache-secret", SECRET, "--http-threads", "1",
                    "--redis-timeout-ms", "20", "--redis-url", redis.url)
    assert wait_metric(s.url, "kiln_cache_redis_connected", 1) == 1
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        for i in range(6):
            infer(s.url, "double", np.full((1, 2), 100 + i, np.float32))
        assert metric(s.url, "kiln_cache_redis_circuit_open") == 1
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)
    # While it is open: new results still reach Redis.
    before = redis.cli("dbsize")
    for i in range(3):
        infer(s.url, "double", np.full((1, 2), 200 + i, np.float32))
    stored_while_open = metric(s.url, "kiln_cache_redis_circuit_open") == 1
    assert stored_while_open, "the breaker closed before the stores were sent; the test needs its 1 s window"
    deadline = time.monotonic() + 10
    while int(redis.cli("dbsize")) < int(before) + 3:
        assert time.monotonic() < deadline, redis.cli("dbsize")
        time.sleep(0.02)
    other = make_server(cache_repo, "--cache-size", "0", "--cache-secret", SECRET, "--redis-url", redis.url)
    wait_connected(other)
    np.testing.assert_array_equal(infer(other.url, "double", np.full((1, 2), 201, np.float32)),
                                  np.full((1, 2), 402, np.float32))
    assert stats(other.url, "double")["hit"] == 1
    # No traffic to s: its gauge still falls back once the breaker's second is over.
    assert wait_metric(s.url, "kiln_cache_redis_circuit_open", 0) == 0
