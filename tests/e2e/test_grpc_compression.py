"""gRPC message compression (grpc-encoding gzip and deflate, the
compressed flag of each message) against the real kiln: tritonclient.grpc's
compression_algorithm both ways, compressed answers read off raw HTTP/2
frames, an unknown grpc-encoding (UNIMPLEMENTED), a message that inflates
past --grpc-max-message-size (RESOURCE_EXHAUSTED, the server's memory
untouched) and a flag set without a coding."""
import struct
import zlib

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import h2frames
from conftest import save_model, serving, tiny_graph

INFER = "/inference.GRPCInferenceService/ModelInfer"
MiB = 1 << 20


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("zrepo")
    save_model(root, "tiny", tiny_graph())
    yield from serving(root, "--grpc-max-message-size", "1M")


def expected(x):
    g = tiny_graph()
    w = np.frombuffer(g.initializer[0].raw_data, np.float32).reshape(4, 3) if g.initializer[0].raw_data else \
        np.array(g.initializer[0].float_data, np.float32).reshape(4, 3)
    b = np.frombuffer(g.initializer[1].raw_data, np.float32) if g.initializer[1].raw_data else \
        np.array(g.initializer[1].float_data, np.float32)
    return x @ w + b


def infer_request(x):
    req = service_pb2.ModelInferRequest(model_name="tiny")
    req.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    req.outputs.add(name="logits")
    req.raw_input_contents.append(x.tobytes())
    return req


def compress(coding, data):
    if coding == "gzip":
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        return z.compress(data) + z.flush()
    return zlib.compress(data, 9)  # grpc's deflate is the zlib format


def inflate(coding, data):
    return zlib.decompress(data, 31 if coding == "gzip" else 15)


def zmessage(payload, flag=1):
    return bytes([flag]) + struct.pack(">I", len(payload)) + payload


def data_of(c, sid):
    return b"".join(f[3] for f in c.frames if f[2] == sid and f[0] == h2frames.DATA)


def trailers_of(c, sid):
    return [f[3] for f in c.frames if f[2] == sid and f[0] == h2frames.HEADERS][-1]


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_tritonclient_compression(srv, coding):
    """tritonclient.grpc's compression_algorithm: the request goes out
    compressed, and the answer (compressed back, see the raw test) reads
    right."""
    c = grpcclient.InferenceServerClient(srv.grpc_url())
    x = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    i = grpcclient.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    r = c.infer("tiny", [i], outputs=[grpcclient.InferRequestedOutput("logits")], compression_algorithm=coding)
    np.testing.assert_allclose(r.as_numpy("logits"), expected(x), rtol=1e-5, atol=1e-5)
    # Streaming too: each message of the stream is compressed.
    import queue
    got = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)), compression_algorithm=coding)
    for _ in range(3):
        c.async_stream_infer("tiny", [i])
    for _ in range(3):
        result, error = got.get(timeout=30)
        assert error is None
        np.testing.assert_allclose(result.as_numpy("logits"), expected(x), rtol=1e-5, atol=1e-5)
    c.stop_stream()
    c.close()


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compressed_answer_on_the_wire(srv, coding):
    """A compressed request from a client that accepts the coding gets its
    answer compressed the same way (flag 1, the coding's bytes); one whose
    grpc-accept-encoding leaves the coding out gets it plain."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    body = infer_request(x).SerializeToString()
    for sid, accept in ((1, f"identity,{coding}"), (3, "identity")):
        # A connection each: the second answer's headers would be indexed in HPACK's table.
        c = h2frames.Conn(srv.grpc_url())
        c.send(h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, sid, h2frames.header_block(
            h2frames.grpc_headers(INFER, [("grpc-encoding", coding), ("grpc-accept-encoding", accept)]))) +
            h2frames.frame(h2frames.DATA, h2frames.END_STREAM, sid, zmessage(compress(coding, body))))
        assert c.wait(lambda fr: c.ended(sid))
        assert b"\x010" in trailers_of(c, sid)  # grpc-status 0
        data = data_of(c, sid)
        n = int.from_bytes(data[1:5], "big")
        assert len(data) == n + 5
        if sid == 1:
            assert data[0] == 1
            payload = inflate(coding, data[5:])
        else:
            assert data[0] == 0
            payload = data[5:]
        hdrs = h2frames.stream_headers(c, sid)
        assert hdrs[0]["grpc-accept-encoding"] == "identity,deflate,gzip"
        assert hdrs[0].get("grpc-encoding") == (coding if sid == 1 else None)
        assert hdrs[-1]["grpc-status"] == "0"
        resp = service_pb2.ModelInferResponse.FromString(payload)
        out = np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(2, 3)
        np.testing.assert_allclose(out, expected(x), rtol=1e-5, atol=1e-5)
        c.close()


def test_unknown_encoding(srv):
    """grpc-encoding kiln lacks: UNIMPLEMENTED (12), as the gRPC spec asks,
    and the connection goes on serving."""
    c = h2frames.Conn(srv.grpc_url())
    body = infer_request(np.zeros((1, 4), np.float32)).SerializeToString()
    c.send(h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, 1, h2frames.header_block(
        h2frames.grpc_headers(INFER, [("grpc-encoding", "snappy")]))) +
        h2frames.frame(h2frames.DATA, h2frames.END_STREAM, 1, zmessage(b"whatever")))
    assert c.wait(lambda fr: c.ended(1))
    assert b"\x0212" in trailers_of(c, 1)
    assert not data_of(c, 1)
    # Trailers-Only: the status, the codings kiln reads, and a message naming them.
    (only,) = h2frames.stream_headers(c, 1)
    assert only["grpc-status"] == "12" and only["grpc-accept-encoding"] == "identity,deflate,gzip"
    assert only["grpc-message"] == "grpc-encoding 'snappy' is not supported (supported: identity,deflate,gzip)"
    c.call(3, INFER, body)
    assert c.wait(lambda fr: c.ended(3))
    assert data_of(c, 3)[0] == 0 and b"\x010" in trailers_of(c, 3)
    c.close()
    # The compressed flag without a grpc-encoding is the client's error
    # (INVALID_ARGUMENT, 3; the second such status is indexed in HPACK's table).
    c = h2frames.Conn(srv.grpc_url())
    c.send(h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, 5, h2frames.header_block(
        h2frames.grpc_headers(INFER))) +
        h2frames.frame(h2frames.DATA, h2frames.END_STREAM, 5, zmessage(compress("gzip", body))))
    assert c.wait(lambda fr: c.ended(5))
    assert b"\x013" in trailers_of(c, 5)
    assert "compressed flag is 1 but the call has no grpc-encoding" in h2frames.stream_headers(c, 5)[-1]["grpc-message"]
    c.close()
    # Data that is not gzip: INVALID_ARGUMENT too.
    c = h2frames.Conn(srv.grpc_url())
    c.send(h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, 7, h2frames.header_block(
        h2frames.grpc_headers(INFER, [("grpc-encoding", "gzip")]))) +
        h2frames.frame(h2frames.DATA, h2frames.END_STREAM, 7, zmessage(b"not gzip at all")))
    assert c.wait(lambda fr: c.ended(7))
    assert b"\x013" in trailers_of(c, 7)
    assert "not valid gzip data (grpc-encoding)" in h2frames.stream_headers(c, 7)[-1]["grpc-message"]
    c.close()


def peak_rss(srv):
    for line in open(f"/proc/{srv.proc.pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def test_zip_bomb(srv):
    """A message that inflates past --grpc-max-message-size (1 MiB here)
    is RESOURCE_EXHAUSTED with the limit named; a 1 GiB bomb (1 MiB on the
    wire) leaves the server's peak memory where it was."""
    channel = grpc.insecure_channel(srv.grpc_url(), options=[("grpc.max_send_message_length", -1)])
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    req = infer_request(np.zeros((1, 4), np.float32))
    req.raw_input_contents[0] = bytes(8 * MiB)  # 8 KiB gzip'd: under the limit on the wire
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req, compression=grpc.Compression.Gzip, timeout=60)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "exceeds --grpc-max-message-size (1048576 bytes)" in e.value.details()
    assert "decompressed (grpc-encoding gzip)" in e.value.details()
    channel.close()

    before = peak_rss(srv)
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk, bomb = bytes(MiB), []
    for _ in range(1024):
        bomb.append(z.compress(chunk))
    bomb = b"".join(bomb) + z.flush()
    assert len(bomb) < MiB
    c = h2frames.Conn(srv.grpc_url())
    c.send(h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, 1, h2frames.header_block(
        h2frames.grpc_headers(INFER, [("grpc-encoding", "gzip")]))))
    msg = zmessage(bomb)
    for off in range(0, len(msg), 16384):
        part = msg[off:off + 16384]
        c.send(h2frames.frame(h2frames.DATA, h2frames.END_STREAM if off + 16384 >= len(msg) else 0, 1, part))
    assert c.wait(lambda fr: c.ended(1), timeout=60)
    assert b"\x018" in trailers_of(c, 1)  # RESOURCE_EXHAUSTED
    (only,) = h2frames.stream_headers(c, 1)
    assert "exceeds --grpc-max-message-size (1048576 bytes)" in only["grpc-message"]
    c.close()
    assert peak_rss(srv) - before < 64 * MiB
    gc = grpcclient.InferenceServerClient(srv.grpc_url())
    assert gc.is_server_live()
    gc.close()


def test_compressed_errors_read_by_tritonclient(srv):
    """An error answer to a compressed call is an ordinary status."""
    c = grpcclient.InferenceServerClient(srv.grpc_url())
    i = grpcclient.InferInput("x", [1, 5], "FP32")
    i.set_data_from_numpy(np.zeros((1, 5), np.float32))
    with pytest.raises(InferenceServerException) as e:
        c.infer("tiny", [i], compression_algorithm="gzip")
    assert "StatusCode.INVALID_ARGUMENT" in e.value.status()
    c.close()
