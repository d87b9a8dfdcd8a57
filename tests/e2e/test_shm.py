"""Triton's system shared-memory extension end to end, with the official
tritonclient.http and tritonclient.grpc and tritonclient.utils.shared_memory
unchanged: register, status and unregister; inference with inputs and
outputs in shared memory, alone and mixed with tensors in the message;
strings; the result cache; hostile requests (unknown regions, ranges outside
a region, sizes that do not match); unregistering while requests use a
region; and 1000 register/unregister cycles without a descriptor or a
mapping left behind."""
import os
import threading
import uuid

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from conftest import build_repository, raw_request, save_model, serving, shm_clients, tiny_graph

CACHED = '{"max_batch_size": 8, "dynamic_batching": {}, "response_cache": {"enable": true}}'


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    repo = build_repository(tmp_path_factory.mktemp("shmrepo"))
    save_model(repo, "cached", tiny_graph(), config=CACHED)
    yield from serving(repo, "--cache-size", "1M", "--allow-client-shm")


@pytest.fixture(params=["http", "grpc"])
def proto(request, srv):
    """(module, client) for each protocol; every region is unregistered after the test."""
    yield from shm_clients(request.param, srv)


def key_of(h):
    return h._shm_key


def name_of(h):
    return h._triton_shm_name


def ort_run(repo, name, feeds):
    sess = ort.InferenceSession(str(repo / name / "1" / "model.onnx"))
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def err_of(fn, *a, **kw):
    with pytest.raises(InferenceServerException) as e:
        fn(*a, **kw)
    return e.value.message()


def status_list(mod, c, name=""):
    """The status as a list of (name, key, offset, byte_size), for either client."""
    st = c.get_system_shared_memory_status(name)
    if mod is httpclient:
        return sorted((r["name"], r["key"], int(r["offset"]), int(r["byte_size"])) for r in st)
    return sorted((r.name, r.key, r.offset, r.byte_size) for r in st.regions.values())


def requested(mod, name, h=None, size=0, offset=0):
    o = mod.InferRequestedOutput(name)
    if h is not None:
        o.set_shared_memory(name_of(h), size, offset)
    return o


def x_input(mod, x, h=None, offset=0):
    i = mod.InferInput("x", list(x.shape), "FP32")
    if h is None:
        i.set_data_from_numpy(x)
    else:
        i.set_shared_memory(name_of(h), x.nbytes, offset)
    return i


# ---- register, status, unregister -----------------------------------------

def test_register_status_unregister(proto, regions):
    mod, c = proto
    a, b = regions(64), regions(4096)
    assert status_list(mod, c) == []
    c.register_system_shared_memory(name_of(a), key_of(a), 64)
    c.register_system_shared_memory(name_of(b), key_of(b), 1000, offset=96)
    assert status_list(mod, c) == sorted([(name_of(a), key_of(a), 0, 64), (name_of(b), key_of(b), 96, 1000)])
    assert status_list(mod, c, name_of(b)) == [(name_of(b), key_of(b), 96, 1000)]
    c.unregister_system_shared_memory(name_of(a))
    assert status_list(mod, c) == [(name_of(b), key_of(b), 96, 1000)]
    assert "Unable to find system shared memory region" in err_of(c.get_system_shared_memory_status, name_of(a))
    c.unregister_system_shared_memory(name_of(a))  # not registered: not an error, as Triton
    c.unregister_system_shared_memory()
    assert status_list(mod, c) == []


def test_register_refusals(proto, regions):
    mod, c = proto
    a = regions(64)
    c.register_system_shared_memory(name_of(a), key_of(a), 64)
    assert "already in manager" in err_of(c.register_system_shared_memory, name_of(a), key_of(a), 64)
    missing = "/kiln_test_missing_" + uuid.uuid4().hex[:8]
    msg = err_of(c.register_system_shared_memory, "nokey", missing, 64)
    assert "cannot open shared memory object" in msg and missing in msg
    msg = err_of(c.register_system_shared_memory, "past", key_of(a), 8, offset=60)
    assert "outside shared memory object" in msg and "60" in msg and "64 bytes" in msg
    assert "outside" in err_of(c.register_system_shared_memory, "big", key_of(a), 65)
    assert "invalid args: byte_size must be more than 0" in err_of(c.register_system_shared_memory, "zero", key_of(a), 0)
    assert status_list(mod, c) == [(name_of(a), key_of(a), 0, 64)]


def test_register_body_errors(srv):
    for body, want in [(b"", "must be a JSON object"), (b"[1]", "must be a JSON object"),
                       (b'{"byte_size": 4}', "no string 'key'"), (b'{"key": "/x"}', "no integer 'byte_size'"),
                       (b'{"key": "/x", "byte_size": 4, "offset": -1}', "'offset' must be an integer")]:
        code, _, out = raw_request(srv.url, "POST", "/v2/systemsharedmemory/region/r/register", body)
        assert code == 400 and want in out.decode(), (body, code, out)
    code, _, _ = raw_request(srv.url, "GET", "/v2/systemsharedmemory/region/r/register")
    assert code == 405


def test_extension_listed_and_cuda_regions_apart(proto):
    mod, c = proto
    md = c.get_server_metadata()
    exts = md["extensions"] if mod is httpclient else list(md.extensions)
    assert "system_shared_memory" in exts
    st = c.get_cuda_shared_memory_status()
    assert (st == []) if mod is httpclient else (len(st.regions) == 0)
    msg = err_of(c.register_cuda_shared_memory, "gpu0", b"\0" * 64, 0, 1024)
    assert "cuda shared memory region 'gpu0'" in msg  # tests/e2e/test_cuda_shm.py: the rest
    c.unregister_cuda_shared_memory()


# ---- inference ------------------------------------------------------------

def test_infer_inputs_and_outputs_in_shm(proto, regions, srv):
    mod, c = proto
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    hin, hout = regions(x.nbytes), regions(2 * 2 * 3 * 4)
    shm.set_shared_memory_region(hin, [x])
    c.register_system_shared_memory(name_of(hin), key_of(hin), x.nbytes)
    c.register_system_shared_memory(name_of(hout), key_of(hout), 48)
    res = c.infer("tiny", [x_input(mod, x, hin)],
                  outputs=[requested(mod, "probs", hout, 24), requested(mod, "logits", hout, 24, 24)])
    want = ort_run(srv.repo_path, "tiny", {"x": x})
    np.testing.assert_allclose(shm.get_contents_as_numpy(hout, np.float32, [2, 3]), want["probs"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(shm.get_contents_as_numpy(hout, np.float32, [2, 3], offset=24), want["logits"],
                               rtol=1e-5, atol=1e-6)
    out = res.get_output("logits")
    if mod is httpclient:
        assert "data" not in out and "data" not in res.get_output("probs")
        assert out["parameters"] == {"shared_memory_region": name_of(hout), "shared_memory_byte_size": 24,
                                     "shared_memory_offset": 24}
        assert out["shape"] == [2, 3] and out["datatype"] == "FP32"
    else:
        assert list(out.shape) == [2, 3] and out.datatype == "FP32"
        assert out.parameters["shared_memory_region"].string_param == name_of(hout)
        assert out.parameters["shared_memory_offset"].int64_param == 24
        assert all(len(r) == 0 for r in res.get_response().raw_output_contents)


def test_mixed_shm_and_message(proto, regions, srv):
    mod, c = proto
    i = np.arange(6, dtype=np.int64).reshape(2, 3) * 7
    flag = np.array([[True, False, True], [False, False, True]])
    hin, hout = regions(64), regions(48)
    shm.set_shared_memory_region(hin, [i], offset=16)
    c.register_system_shared_memory(name_of(hin), key_of(hin), 64)
    c.register_system_shared_memory(name_of(hout), key_of(hout), 48)
    ii = mod.InferInput("i", [2, 3], "INT64")
    ii.set_shared_memory(name_of(hin), i.nbytes, offset=16)
    fi = mod.InferInput("flag", [2, 3], "BOOL")
    fi.set_data_from_numpy(flag)
    res = c.infer("typed", [ii, fi], outputs=[requested(mod, "a", hout, 48), requested(mod, "b")])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(hout, np.int64, [2, 3]), i + 1)
    np.testing.assert_array_equal(res.as_numpy("b"), ~flag)
    # The body input first, then the one in shared memory (gRPC's raw contents skip it).
    res = c.infer("typed", [fi, ii], outputs=[requested(mod, "b"), requested(mod, "a")])
    np.testing.assert_array_equal(res.as_numpy("a"), i + 1)
    np.testing.assert_array_equal(res.as_numpy("b"), ~flag)


def test_strings_in_shm(proto, regions):
    mod, c = proto
    s = np.array([[b"alpha", b""], [b"\xffbytes", b"z" * 300]], dtype=np.object_)
    ser = serialize_byte_tensor(s).item()
    hin, hout = regions(len(ser)), regions(1024)
    shm.set_shared_memory_region(hin, [serialize_byte_tensor(s)])
    c.register_system_shared_memory(name_of(hin), key_of(hin), len(ser))
    c.register_system_shared_memory(name_of(hout), key_of(hout), 1024)
    si = mod.InferInput("s", [2, 2], "BYTES")
    si.set_shared_memory(name_of(hin), len(ser))
    res = c.infer("strings", [si], outputs=[requested(mod, "out", hout, 1024)])
    got = shm.get_contents_as_numpy(hout, np.object_, [2, 2])
    assert got.tolist() == s.tolist()
    size = (res.get_output("out")["parameters"]["shared_memory_byte_size"] if mod is httpclient
            else res.get_output("out").parameters["shared_memory_byte_size"].int64_param)
    assert size == len(ser)
    # A length prefix running past the region is refused, naming the input.
    shm.set_shared_memory_region(hin, [np.array([0xFFFF], dtype=np.uint32)])
    msg = err_of(c.infer, "strings", [si])
    assert "input 's'" in msg


def test_unaligned_offset_is_copied(proto, regions, srv):
    mod, c = proto
    x = np.random.default_rng(5).standard_normal((1, 4)).astype(np.float32)
    h = regions(64)
    shm.set_shared_memory_region(h, [x], offset=3)
    c.register_system_shared_memory(name_of(h), key_of(h), 40, offset=1)
    res = c.infer("tiny", [x_input(mod, x, h, offset=2)])
    np.testing.assert_allclose(res.as_numpy("probs"), ort_run(srv.repo_path, "tiny", {"x": x})["probs"], rtol=1e-5)


def test_cache_keys_on_region_bytes(proto, regions, srv):
    """The result cache keys a request in shared memory by the bytes there:
    new bytes compute anew, the same bytes hit, and a hit still writes the
    outputs into the region."""
    mod, c = proto
    hin, hout = regions(16), regions(12)
    c.register_system_shared_memory(name_of(hin), key_of(hin), 16)
    c.register_system_shared_memory(name_of(hout), key_of(hout), 12)
    def hits():
        st = c.get_inference_statistics("cached")
        if mod is httpclient:
            return st["model_stats"][0]["inference_stats"]["cache_hit"]["count"]
        return st.model_stats[0].inference_stats.cache_hit.count

    hits0 = hits()
    rng = np.random.default_rng(11 if mod is httpclient else 12)
    for _ in range(2):
        x = rng.standard_normal((1, 4)).astype(np.float32)
        shm.set_shared_memory_region(hin, [x])
        want = ort_run(srv.repo_path, "cached", {"x": x})["probs"]
        for _ in range(2):
            shm.set_shared_memory_region(hout, [np.zeros(3, np.float32)])
            c.infer("cached", [x_input(mod, x, hin)], outputs=[requested(mod, "probs", hout, 12)])
            np.testing.assert_allclose(shm.get_contents_as_numpy(hout, np.float32, [1, 3]), want, rtol=1e-5)
    assert hits() - hits0 == 2


# ---- hostile requests -----------------------------------------------------

def test_hostile_requests(proto, regions, srv):
    mod, c = proto
    x = np.ones((2, 4), np.float32)
    h, small = regions(64), regions(16)
    shm.set_shared_memory_region(h, [x])
    c.register_system_shared_memory(name_of(h), key_of(h), 64)
    c.register_system_shared_memory(name_of(small), key_of(small), 16)

    def bad_input(region, size, offset=0, shape=(2, 4)):
        i = mod.InferInput("x", list(shape), "FP32")
        i.set_shared_memory(region, size, offset)
        return err_of(c.infer, "tiny", [i])

    msg = bad_input("nosuchregion", 32)
    assert "input 'x'" in msg and "'nosuchregion' is not registered" in msg
    msg = bad_input(name_of(h), 32, offset=48)
    assert "input 'x'" in msg and "Invalid offset + byte size for shared memory region" in msg and "64 bytes" in msg
    msg = bad_input(name_of(h), 32, offset=1 << 40)
    assert "Invalid offset for shared memory region" in msg
    if mod is httpclient:
        # JSON carries any uint64 (gRPC's int64 fields stop at 2^63 - 1).
        msg = bad_input(name_of(h), 32, offset=2**64 - 32)
        assert "Invalid offset for shared memory region" in msg, msg
        o = httpclient.InferRequestedOutput("probs")
        o.set_shared_memory(name_of(h), 2**64 - 32, 32)
        msg = err_of(c.infer, "tiny", [x_input(mod, x)], outputs=[o])
        assert "Integer overflow detected: byte_size " in msg, msg
    msg = bad_input(name_of(h), 16)
    assert "input byte size mismatch for input 'x' for model 'tiny'. Expected 32, got 16" in msg
    # A region of another tensor's size: 16 bytes named for a 32-byte input.
    msg = bad_input(name_of(small), 32)
    assert "Invalid offset + byte size for shared memory region '%s'" % name_of(small) in msg and "its 16 bytes" in msg
    # An output region too small for the output.
    msg = err_of(c.infer, "tiny", [x_input(mod, x)], outputs=[requested(mod, "probs", small, 16)])
    assert "output 'probs'" in msg and "needs 24 bytes" in msg
    msg = err_of(c.infer, "tiny", [x_input(mod, x)], outputs=[requested(mod, "probs", small, 24)])
    assert "output 'probs'" in msg and "Invalid offset + byte size for shared memory region" in msg
    if mod is httpclient:
        o = httpclient.InferRequestedOutput("probs", class_count=2)
        o._parameters.update(shared_memory_region=name_of(small), shared_memory_byte_size=16)
        assert "cannot both be set" in err_of(c.infer, "tiny", [x_input(mod, x)], outputs=[o])
    # The server still answers.
    res = c.infer("tiny", [x_input(mod, x, h)])
    assert res.as_numpy("probs").shape == (2, 3)


def test_http_input_with_data_and_region(srv):
    body = (b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4], '
            b'"parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}}]}')
    code, _, out = raw_request(srv.url, "POST", "/v2/models/tiny/infer", body)
    assert code == 400 and b"has both 'data' and parameters.shared_memory_region" in out
    body = b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"shared_memory_region": "r"}}]}'
    code, _, out = raw_request(srv.url, "POST", "/v2/models/tiny/infer", body)
    assert code == 400 and b"shared_memory_byte_size is missing" in out


def test_unregister_during_traffic(proto, regions, srv, make_server):
    """Requests keep their region mapped while they use it: unregistering and
    registering again under load answers every request with the right result
    or with a clear error, and the server keeps serving. The clients share
    the region through the control token (a region registered without it is
    its connection's alone)."""
    mod = proto[0]
    tok = make_server(srv.repo_path, "--allow-client-shm", "--control-token", "tok")
    auth = {"authorization": "Bearer tok"}  # gRPC metadata keys are lower case
    url = tok.url if mod is httpclient else tok.grpc_url()
    c = mod.InferenceServerClient(url)
    x = np.random.default_rng(9).standard_normal((8, 4)).astype(np.float32)
    want = ort_run(srv.repo_path, "tiny", {"x": x})["probs"]
    h = regions(x.nbytes)
    shm.set_shared_memory_region(h, [x])
    c.register_system_shared_memory(name_of(h), key_of(h), x.nbytes, headers=auth)
    stop, errors, oks, bad = threading.Event(), [], [0], []

    def worker():
        wc = mod.InferenceServerClient(url)
        while not stop.is_set():
            try:
                r = wc.infer("tiny", [x_input(mod, x, h)], headers=auth)
                if not np.allclose(r.as_numpy("probs"), want, rtol=1e-5, atol=1e-6):
                    bad.append(r.as_numpy("probs"))
                oks[0] += 1
            except InferenceServerException as e:
                errors.append(e.message())
        wc.close()

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(150):
        c.unregister_system_shared_memory(name_of(h), headers=auth)
        c.register_system_shared_memory(name_of(h), key_of(h), x.nbytes, headers=auth)
        if i == 100:  # let the workers through at least once before the end
            while oks[0] == 0 and all(t.is_alive() for t in threads):
                threading.Event().wait(0.01)
    stop.set()
    for t in threads:
        t.join()
    assert not bad
    assert oks[0] > 0
    assert all("is not registered" in e for e in errors), errors[:3]
    assert c.is_server_live()
    c.unregister_system_shared_memory(headers=auth)
    c.close()


def _fds_and_maps(pid, key):
    fds = os.listdir(f"/proc/{pid}/fd")
    links = []
    for f in fds:
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{f}"))
        except OSError:
            pass
    maps = open(f"/proc/{pid}/maps").read().splitlines()
    name = key.lstrip("/")
    return len(fds), len(maps), sum(name in l for l in links), sum(name in l for l in maps)


def test_register_cycles_leak_nothing(proto, regions, srv):
    mod, c = proto
    x = np.ones((1, 4), np.float32)
    h = regions(4096)
    shm.set_shared_memory_region(h, [x])
    pid = srv.proc.pid
    c.register_system_shared_memory(name_of(h), key_of(h), 16)
    c.infer("tiny", [x_input(mod, x, h)])
    c.unregister_system_shared_memory(name_of(h))
    fds0, maps0, _, _ = _fds_and_maps(pid, key_of(h))
    for i in range(1000):
        c.register_system_shared_memory(name_of(h), key_of(h), 16, offset=(i % 8) * 512)
        if i % 100 == 0:
            assert _fds_and_maps(pid, key_of(h))[2:] == (1, 1)
            c.infer("tiny", [x_input(mod, x, h)])
        c.unregister_system_shared_memory(name_of(h))
    fds1, maps1, fdk, mapk = _fds_and_maps(pid, key_of(h))
    assert (fdk, mapk) == (0, 0)
    assert fds1 <= fds0 + 2 and maps1 <= maps0 + 2, (fds0, fds1, maps0, maps1)
