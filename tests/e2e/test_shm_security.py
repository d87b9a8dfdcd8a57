"""Client shared memory's confinement end to end, with the real kiln and the
official tritonclient.http and tritonclient.grpc: off unless the server was
started with --allow-client-shm; objects the server may not open (another
user's, a symbolic link, a directory, outside --shm-key-prefix) refused with
the message a missing one gets; the control token's rule for register, status
and unregister; one client can neither see, drop nor use another's regions;
a connection's regions go when it closes; the bounds on regions and bytes;
and objects truncated and grown again while requests read from and write
into them, 50 times each, with the server answering throughout and after."""
import json
import os
import threading
import uuid

import numpy as np
import onnx.helper as oh
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto as TP
from tritonclient.utils import InferenceServerException

from conftest import build_repository, no_batch_config, raw_request, save_model

BIG = 1 << 20  # FP32 elements of the identity model's tensors: 4 MiB, so a copy takes a while
NOT_OPENABLE = "it does not exist or is not the server's to open"


@pytest.fixture(scope="module")
def shm_repo(tmp_path_factory):
    root = build_repository(tmp_path_factory.mktemp("shmsecrepo"))
    g = oh.make_graph([oh.make_node("Identity", ["x"], ["y"])], "ident",
                      [oh.make_tensor_value_info("x", TP.FLOAT, ["N"])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, ["N"])])
    save_model(root, "ident", g, config=json.dumps(no_batch_config(g)))
    return root


@pytest.fixture()
def objects(regions):
    """Shared-memory objects under the prefix the tests below set."""
    return lambda size: regions(size, prefix="/kiln_sec_")


def key_of(h):
    return h._shm_key


def err_of(fn, *a, **kw):
    with pytest.raises(InferenceServerException) as e:
        fn(*a, **kw)
    return e.value


# grpcio shares one TCP connection between the channels of a process that
# name the same target, unless each has its own subchannel pool: two such
# clients would be one connection, and so one owner, to the server.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", -1),
                  ("grpc.max_receive_message_length", -1)]


def client(mod, srv):
    """A client on a connection of its own (tritonclient.http: one keep-alive connection per client)."""
    if mod is httpclient:
        return httpclient.InferenceServerClient(srv.url)
    return grpcclient.InferenceServerClient(srv.grpc_url(), channel_args=OWN_CONNECTION)


def names(mod, c, **kw):
    st = c.get_system_shared_memory_status(**kw)
    return sorted(r["name"] for r in st) if mod is httpclient else sorted(st.regions)


def tiny_input(mod, region, x):
    i = mod.InferInput("x", list(x.shape), "FP32")
    i.set_shared_memory(region, x.nbytes)
    return i


PROTOS = pytest.mark.parametrize("mod", [httpclient, grpcclient], ids=["http", "grpc"])


# ---- off by default ---------------------------------------------------------

def test_off_by_default(server, objects):
    """Without --allow-client-shm nothing can be registered or named, on
    either protocol and for either kind, and the answer says why."""
    h = objects(64)
    body = ('{"key": "%s", "byte_size": 64}' % key_of(h)).encode()
    code, _, out = raw_request(server.url, "POST", "/v2/systemsharedmemory/region/r/register", body)
    assert code == 400 and b"started without --allow-client-shm" in out, (code, out)
    # Status is answered, empty (as Triton's: a client may ask first).
    for path in ("/v2/systemsharedmemory/status", "/v2/cudasharedmemory/status"):
        code, _, out = raw_request(server.url, "GET", path)
        assert code == 200 and json.loads(out) == [], (code, out)
    code, _, out = raw_request(server.url, "POST", "/v2/cudasharedmemory/region/g/register",
                               b'{"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 4}')
    assert code == 400 and b"--allow-client-shm" in out
    g = grpcclient.InferenceServerClient(server.grpc_url())
    e = err_of(g.register_system_shared_memory, "r", key_of(h), 64)
    assert e.status() == "StatusCode.UNAVAILABLE" and "--allow-client-shm" in e.message()
    assert len(g.get_cuda_shared_memory_status().regions) == 0
    assert len(g.get_system_shared_memory_status().regions) == 0
    # An inference request naming a region is refused too, naming the input.
    x = np.ones((1, 4), np.float32)
    for c in (httpclient.InferenceServerClient(server.url), g):
        mod = httpclient if c is not g else grpcclient
        msg = err_of(c.infer, "tiny", [tiny_input(mod, "r", x)]).message()
        assert "input 'x' names shared memory region 'r'" in msg and "--allow-client-shm" in msg
        c.close()


# ---- what may be opened -----------------------------------------------------

def _same_refusal(c, name, key, want):
    msg = err_of(c.register_system_shared_memory, name, key, 16).message()
    assert msg.replace(key, "K") == want, msg


@PROTOS
def test_objects_the_server_may_not_open(mod, shm_repo, make_server, objects):
    """Another user's object, a link, a directory and a key outside the
    prefix get exactly the message of an object that does not exist."""
    srv = make_server(shm_repo, "--allow-client-shm", "--shm-key-prefix", "kiln_sec_")
    c = client(mod, srv)
    missing = "/kiln_sec_missing_" + uuid.uuid4().hex[:8]
    want = err_of(c.register_system_shared_memory, "r", missing, 16).message().replace(missing, "K")
    assert want == f"shared memory region 'r': cannot open shared memory object 'K': {NOT_OPENABLE}"
    # Outside the prefix: an object of the server's user that exists.
    other = shm.create_shared_memory_region("o", "/kiln_other_" + uuid.uuid4().hex[:8], 64)
    try:
        _same_refusal(c, "r", key_of(other), want)
    finally:
        shm.destroy_shared_memory_region(other)
    h = objects(64)
    path = "/dev/shm/" + key_of(h).lstrip("/")
    # A link to an object the server could open, and a directory.
    link = "/kiln_sec_link_" + uuid.uuid4().hex[:8]
    os.symlink(path, "/dev/shm" + link)
    try:
        _same_refusal(c, "r", link, want)
    finally:
        os.unlink("/dev/shm" + link)
    os.mkdir("/dev/shm" + link)
    try:
        _same_refusal(c, "r", link, want)
    finally:
        os.rmdir("/dev/shm" + link)
    # Another user's object (kiln runs as the same user as the tests).
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
        _same_refusal(c, "r", key_of(h), want)
        os.chown(path, 0, 0)
    # Keys that are not one name are refused for what they are.
    for bad in ("/kiln_sec_a/b", "/", "/" + "k" * 300):
        msg = err_of(c.register_system_shared_memory, "r", bad, 16).message()
        assert "invalid shm key" in msg or "longer than 255 bytes" in msg, msg
    # The server's own object inside the prefix registers.
    c.register_system_shared_memory("r", key_of(h), 64)
    assert names(mod, c) == ["r"]
    c.close()


# ---- the control token ------------------------------------------------------

@PROTOS
def test_token_rules(mod, shm_repo, make_server, objects):
    srv = make_server(shm_repo, "--allow-client-shm", "--control-token", "s3cret")
    auth = {"authorization": "Bearer s3cret"}
    h = objects(64)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    shm.set_shared_memory_region(h, [x])
    c = client(mod, srv)
    for call, args in ((c.register_system_shared_memory, ("r", key_of(h), 64)),
                       (c.get_system_shared_memory_status, ()), (c.unregister_system_shared_memory, ()),
                       (c.get_cuda_shared_memory_status, ()), (c.unregister_cuda_shared_memory, ())):
        e = err_of(call, *args)
        assert "need the control token" in e.message()
        assert e.status() == ("401" if mod is httpclient else "StatusCode.UNAUTHENTICATED"), e.status()
        e = err_of(call, *args, headers={"authorization": "Bearer wrong"})
        assert "need the control token" in e.message()
    if mod is httpclient:
        code, hdrs, _ = raw_request(srv.url, "GET", "/v2/systemsharedmemory/status")
        assert code == 401 and hdrs.get("WWW-Authenticate") == "Bearer"
    c.register_system_shared_memory("r", key_of(h), 64, headers=auth)
    # The token's regions are shared by every connection that carries it...
    other = client(mod, srv)
    assert names(mod, other, headers=auth) == ["r"]
    res = other.infer("tiny", [tiny_input(mod, "r", x)], headers=auth)
    assert res.as_numpy("probs").shape == (1, 3)
    # ...and only with it: without the token, a request looks on its own connection.
    assert "'r' is not registered" in err_of(other.infer, "tiny", [tiny_input(mod, "r", x)]).message()
    other.unregister_system_shared_memory("r", headers=auth)
    assert names(mod, c, headers=auth) == []
    c.close()
    other.close()


# ---- one client's regions are its own ----------------------------------------

@PROTOS
def test_clients_are_isolated(mod, shm_repo, make_server, objects):
    srv = make_server(shm_repo, "--allow-client-shm")
    ha, hb = objects(16), objects(16)
    xa = np.array([[1, 2, 3, 4]], np.float32)
    xb = np.array([[-4, 0, 9, 1]], np.float32)
    shm.set_shared_memory_region(ha, [xa])
    shm.set_shared_memory_region(hb, [xb])
    a, b = client(mod, srv), client(mod, srv)
    a.register_system_shared_memory("input0", key_of(ha), 16)
    a.register_system_shared_memory("only_a", key_of(ha), 16)
    # B sees none of A's regions, cannot drop them and cannot use them.
    assert names(mod, b) == []
    assert "Unable to find system shared memory region: 'only_a'" in err_of(
        b.get_system_shared_memory_status, region_name="only_a").message()
    b.unregister_system_shared_memory("only_a")
    b.unregister_system_shared_memory()
    assert names(mod, a) == ["input0", "only_a"]
    msg = err_of(b.infer, "tiny", [tiny_input(mod, "only_a", xb)]).message()
    assert "input 'x': shared memory region 'only_a' is not registered" in msg
    # The same name for both: each request reads its own client's region.
    b.register_system_shared_memory("input0", key_of(hb), 16)
    ref = httpclient.InferInput("x", [1, 4], "FP32")
    plain = client(httpclient, srv)
    for c, x in ((a, xa), (b, xb), (a, xa)):
        ref.set_data_from_numpy(x)
        want = plain.infer("tiny", [ref]).as_numpy("probs")
        np.testing.assert_allclose(c.infer("tiny", [tiny_input(mod, "input0", x)]).as_numpy("probs"), want,
                                   rtol=1e-6)
    a.unregister_system_shared_memory()
    assert names(mod, b) == ["input0"]
    for c in (a, b, plain):
        c.close()


def _maps_of(pid, key):
    return sum(key.lstrip("/") in line for line in open(f"/proc/{pid}/maps"))


@PROTOS
def test_regions_go_with_their_connection(mod, shm_repo, make_server, objects):
    """Closing the connection unregisters its regions: their mappings go,
    and the room they held (--shm-max-regions 2) is free again."""
    srv = make_server(shm_repo, "--allow-client-shm", "--shm-max-regions", "2")
    h = objects(64)
    a = client(mod, srv)
    a.register_system_shared_memory("one", key_of(h), 64)
    a.register_system_shared_memory("two", key_of(h), 32)
    assert _maps_of(srv.proc.pid, key_of(h)) == 2
    b = client(mod, srv)
    assert "its limit (--shm-max-regions)" in err_of(b.register_system_shared_memory, "x", key_of(h), 8).message()
    a.close()
    # The close reaches the server a moment after close() returns.
    for _ in range(200):
        if _maps_of(srv.proc.pid, key_of(h)) == 0:
            break
        threading.Event().wait(0.025)
    assert _maps_of(srv.proc.pid, key_of(h)) == 0
    b.register_system_shared_memory("x", key_of(h), 8)
    b.register_system_shared_memory("y", key_of(h), 8)
    b.close()


# ---- bounds -----------------------------------------------------------------

@PROTOS
def test_bounds(mod, shm_repo, make_server, objects):
    srv = make_server(shm_repo, "--allow-client-shm", "--shm-max-regions", "5", "--shm-max-regions-per-client", "2",
                      "--shm-max-bytes", "8K")
    h = objects(8192)
    a, b, c = client(mod, srv), client(mod, srv), client(mod, srv)
    a.register_system_shared_memory("r1", key_of(h), 4096)
    a.register_system_shared_memory("r2", key_of(h), 16)
    e = err_of(a.register_system_shared_memory, "r3", key_of(h), 16)
    assert "this client holds 2 regions, its limit (--shm-max-regions-per-client)" in e.message()
    assert e.status() == ("400" if mod is httpclient else "StatusCode.INVALID_ARGUMENT"), e.status()
    e = err_of(b.register_system_shared_memory, "r1", key_of(h), 8192)
    assert "would pass the server's limit of 8192 (--shm-max-bytes)" in e.message()
    b.register_system_shared_memory("r1", key_of(h), 4000)
    b.register_system_shared_memory("r2", key_of(h), 16)
    c.register_system_shared_memory("r1", key_of(h), 16)
    assert "the server holds 5 regions, its limit (--shm-max-regions)" in err_of(
        c.register_system_shared_memory, "r2", key_of(h), 16).message()
    a.unregister_system_shared_memory("r1")
    c.register_system_shared_memory("r2", key_of(h), 4096)
    for x in (a, b, c):
        x.close()


# ---- truncated during requests -------------------------------------------------

def _truncating(path, size, payload, cycles, done):
    """Shrinks the object at path to nothing and grows it back (its bytes
    rewritten), cycles times, then sets done."""
    fd = os.open(path, os.O_RDWR)
    try:
        for _ in range(cycles):
            os.ftruncate(fd, 0)
            threading.Event().wait(0.002)
            os.ftruncate(fd, size)
            if payload is not None:
                os.pwrite(fd, payload, 0)
            threading.Event().wait(0.004)
    finally:
        os.close(fd)
        done.set()


EXPECTED = ("was truncated while the request", "is smaller than when it was registered")


@PROTOS
@pytest.mark.parametrize("side", ["input", "output"])
def test_truncated_during_requests(mod, side, shm_repo, make_server, objects):
    """A thread shrinks and regrows the input (or output) object 50 times
    while requests read from (write into) it: each request succeeds or gets
    a 400-class error naming the truncation; the server never dies and
    answers correctly afterwards."""
    srv = make_server(shm_repo, "--allow-client-shm")
    x = np.random.default_rng(1).standard_normal(BIG).astype(np.float32)
    hin, hout = objects(x.nbytes), objects(x.nbytes)
    shm.set_shared_memory_region(hin, [x])
    c = client(mod, srv)
    c.register_system_shared_memory("in", key_of(hin), x.nbytes)
    c.register_system_shared_memory("out", key_of(hout), x.nbytes)

    def request():
        i = mod.InferInput("x", [BIG], "FP32")
        i.set_shared_memory("in", x.nbytes)
        o = mod.InferRequestedOutput("y")
        o.set_shared_memory("out", x.nbytes)
        return c.infer("ident", [i], outputs=[o])

    victim = hin if side == "input" else hout
    done = threading.Event()
    t = threading.Thread(target=_truncating, args=("/dev/shm/" + key_of(victim).lstrip("/"), x.nbytes,
                                                   x.tobytes() if side == "input" else None, 50, done))
    oks, errors = 0, []
    t.start()
    while not done.is_set():
        try:
            request()
            oks += 1
        except InferenceServerException as e:
            errors.append(e.message())
    t.join()
    unexpected = [m for m in errors if not any(s in m for s in EXPECTED)]
    assert not unexpected, unexpected[:3]
    assert all(("'in'" if side == "input" else "'out'") in m or "output 'y'" in m or "input 'x'" in m
               for m in errors), errors[:3]
    print(f"{side}: {oks} answered, {len(errors)} refused "
          f"({sum('was truncated' in m for m in errors)} caught by the SIGBUS guard)")
    # Alive, and right once the object stays put.
    assert srv.proc.poll() is None
    shm.set_shared_memory_region(hin, [x])
    request()
    np.testing.assert_array_equal(shm.get_contents_as_numpy(hout, np.float32, [BIG]), x)
    assert c.is_server_live()
    c.close()
