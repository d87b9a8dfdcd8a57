"""gRPC connections under the same rules as HTTP's, against the real kiln:
one --max-connections for both front ends (a gRPC connection past it gets
GOAWAY and is closed), the header, body and idle deadlines, and the caps on
request bytes held by calls whose messages never finish, per connection and
for the server, with the memory given back when such calls are cut."""
import socket
import struct
import subprocess
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import h2frames
from conftest import KILN, raw_request

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"
MiB = 1 << 20


def parse_frames(buf):
    out = []
    while len(buf) >= 9:
        n = int.from_bytes(buf[:3], "big")
        if len(buf) < 9 + n:
            break
        out.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + n]))
        buf = buf[9 + n:]
    return out


def read_until_closed(sock, timeout=15):
    """The frames the server sends until it closes the connection (None: still open at timeout)."""
    sock.settimeout(0.5)
    buf, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            b = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            b = b""
        if not b:
            return parse_frames(buf)
        buf += b
    return None


def goaway_of(frames):
    """(error code, debug text) of the GOAWAY in frames, or None."""
    g = next((f for f in frames if f[0] == h2frames.GOAWAY), None)
    return (int.from_bytes(g[3][4:8], "big"), g[3][8:].decode()) if g else None


def read_frame(sock, timeout=15):
    """One whole frame (type, flags, stream, payload), or None at the close."""
    sock.settimeout(timeout)
    buf = b""
    while len(buf) < 9 or len(buf) < 9 + int.from_bytes(buf[:3], "big"):
        try:
            b = sock.recv(9 + int.from_bytes(buf[:3], "big") - len(buf) if len(buf) >= 9 else 9 - len(buf))
        except ConnectionResetError:
            b = b""
        if not b:
            return None
        buf += b
    return parse_frames(buf)[0]


def got_settings(sock, timeout=15):
    """Whether the server's SETTINGS arrived (what every accepted connection gets first)."""
    f = read_frame(sock, timeout)
    return f is not None and f[0] == h2frames.SETTINGS


def admitted(sock):
    """After its SETTINGS, whether the connection was kept: one refused gets
    its GOAWAY at once, then the close; one kept hears nothing more than a
    WINDOW_UPDATE before 0.5 s of silence."""
    while True:
        try:
            f = read_frame(sock, timeout=0.5)
        except socket.timeout:
            return True
        if f is None or f[0] == h2frames.GOAWAY:
            return False


def grpc_port(s):
    host, port = s.grpc_url().split(":")
    return host, int(port)


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def sanitized():
    """A sanitizer build: its allocator keeps freed memory in quarantine, so RSS says nothing of kiln's."""
    libs = subprocess.run(["ldd", str(KILN)], capture_output=True, text=True).stdout
    return "libasan" in libs or "libtsan" in libs


def health(s):
    return raw_request(s.url, "GET", "/v2/health/live")[0]


def wait_for(pred, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_max_connections_counts_grpc_too(make_server, repo):
    """Idle gRPC sockets take from the same --max-connections as HTTP: past it
    a gRPC connection's call is answered UNAVAILABLE naming the limit (not a
    bare GOAWAY, which clients retry on a new connection at once), one that
    sends nothing gets GOAWAY (ENHANCE_YOUR_CALM, saying why) and is closed,
    HTTP is answered 503 rather than left waiting, and both serve again once
    connections close."""
    s = make_server(repo, "--max-connections", "24", "--http-timeout-secs", "300",
                    "--http-header-timeout-secs", "300")
    addr = grpc_port(s)
    assert health(s) == 200
    # Until 24 are held (a connection of the health check may still hold a
    # slot for a moment): each gets SETTINGS, then never sends a byte.
    held = []
    while len(held) < 24:
        c = socket.create_connection(addr, timeout=10)
        assert got_settings(c)
        if admitted(c):
            held.append(c)
        else:
            c.close()
    assert health(s) == 503  # every connection is taken, by gRPC ones
    extra = [socket.create_connection(addr, timeout=10) for _ in range(20)]
    for c in extra:
        frames = read_until_closed(c)
        c.close()
        assert frames is not None, "a connection past --max-connections was left open"
        code, why = goaway_of(frames)
        assert code == h2frames.ENHANCE_YOUR_CALM and "--max-connections (24)" in why
    client = grpcclient.InferenceServerClient(s.grpc_url())
    with pytest.raises(InferenceServerException) as e:
        client.is_server_live()
    assert e.value.status() == "StatusCode.UNAVAILABLE" and "--max-connections (24)" in e.value.message()
    client.close()
    for c in held[:12]:
        c.close()
    assert wait_for(lambda: health(s) == 200)
    client = grpcclient.InferenceServerClient(s.grpc_url())
    assert client.is_server_live()
    client.close()
    for c in held[12:]:
        c.close()
    assert "shed" in s.text()  # logged (one line per 10 s)


def test_preface_and_header_deadline(make_server, repo):
    """A connection must send its preface and a call's headers within
    --http-header-timeout-secs; silent ones, or ones that stop after the
    preface, get GOAWAY and are closed, and kiln serves on."""
    s = make_server(repo, "--http-header-timeout-secs", "2", "--http-timeout-secs", "120")
    addr = grpc_port(s)
    silent = socket.create_connection(addr, timeout=10)
    preface_only = socket.create_connection(addr, timeout=10)
    preface_only.sendall(h2frames.PREFACE + h2frames.frame(h2frames.SETTINGS, 0, 0))
    half_header = h2frames.Conn(s.grpc_url())  # HEADERS without END_HEADERS: the block never ends
    half_header.send(h2frames.frame(h2frames.HEADERS, 0, 1, h2frames.header_block(h2frames.grpc_headers(LIVE))))
    for c in (silent, preface_only):
        frames = read_until_closed(c, timeout=30)
        assert frames is not None, "kiln kept a connection that sent no request"
        code, why = goaway_of(frames)
        assert code == h2frames.ENHANCE_YOUR_CALM and "--http-header-timeout-secs (2 s)" in why
        c.close()
    assert half_header.goaway(timeout=30) == h2frames.ENHANCE_YOUR_CALM
    half_header.close()
    client = grpcclient.InferenceServerClient(s.grpc_url())
    assert client.is_server_live()
    client.close()


def test_idle_deadline_spares_open_calls(make_server, repo):
    """A connection with no call open is closed after --http-timeout-secs
    without a byte (GOAWAY NO_ERROR); one with a streaming call open is not
    idle; a real client's channel reconnects after the idle close."""
    s = make_server(repo, "--http-timeout-secs", "2")
    idle = h2frames.Conn(s.grpc_url())
    idle.call(1, LIVE, b"")
    assert idle.wait(lambda fr: idle.ended(1))
    busy = h2frames.Conn(s.grpc_url())  # a ModelStreamInfer call open, no message in progress
    busy.send(h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, 1,
                             h2frames.header_block(h2frames.grpc_headers(STREAM))))
    client = grpcclient.InferenceServerClient(s.grpc_url())
    assert client.is_server_live()
    assert idle.goaway(timeout=30) == 0  # NO_ERROR: a graceful close
    assert idle.wait(lambda fr: False, timeout=10) is False and idle.closed
    idle.close()
    # The busy connection outlived the idle deadline: it still answers, its stream still open.
    busy.call(3, LIVE, b"")
    assert busy.wait(lambda fr: busy.ended(3))
    assert not busy.ended(1) and not any(f[0] == h2frames.GOAWAY for f in busy.frames)
    busy.close()
    assert client.is_server_live()  # the channel's connection was closed as idle: it reconnects
    x = np.ones((1, 4), np.float32)
    i = grpcclient.InferInput("x", [1, 4], "FP32")
    i.set_data_from_numpy(x)
    assert client.infer("tiny", [i]).as_numpy("probs").shape == (1, 3)
    client.close()


def send_partial(conn, sid, method, total, send):
    """Opens a call on sid whose message announces total bytes and sends the first send of them (no END_STREAM)."""
    conn.send(h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, sid,
                             h2frames.header_block(h2frames.grpc_headers(method))))
    data = b"\x00" + struct.pack(">I", total) + b"\x0a" * (send - 5)
    for at in range(0, len(data), 16384):
        conn.send(h2frames.frame(h2frames.DATA, 0, sid, data[at:at + 16384]))


def answered_in_order(conn, sid):
    """A ServerLive call on sid, answered: the server handled everything sent before it."""
    conn.call(sid, LIVE, b"")
    assert conn.wait(lambda fr: conn.ended(sid))


def test_server_wide_buffer_cap(make_server, repo):
    """Unfinished messages of all connections together hold at most
    --grpc-max-buffered-total: the call past it gets RESOURCE_EXHAUSTED and a
    RST_STREAM, and the bytes a cut call held count no more."""
    s = make_server(repo, "--grpc-max-message-size", "1M", "--grpc-max-buffered-total", "2600K")
    a, b, c = (h2frames.Conn(s.grpc_url()) for _ in range(3))
    send_partial(a, 1, INFER, 1000000, 900000)
    answered_in_order(a, 3)
    send_partial(b, 1, INFER, 1000000, 900000)
    answered_in_order(b, 3)
    send_partial(c, 1, INFER, 1000000, 900000)  # its first bytes pass the total
    assert c.wait(lambda fr: c.ended(1))
    block = [f for f in c.frames if f[2] == 1 and f[0] == h2frames.HEADERS][-1][3]
    assert b"\x018" in block  # RESOURCE_EXHAUSTED
    assert not a.ended(1) and not b.ended(1)
    a.send(h2frames.frame(h2frames.RST_STREAM, 0, 1, b"\x00\x00\x00\x08"))  # a gives up its call
    answered_in_order(a, 5)
    send_partial(c, 5, INFER, 1000000, 900000)  # fits again
    answered_in_order(c, 7)
    assert not c.ended(5)
    for x in (a, b, c):
        x.close()


def test_unfinished_streams_cut_at_body_deadline_and_memory_returned(make_server, repo):
    """Calls that never finish their message hold at most the per-connection
    cap, are cut with DEADLINE_EXCEEDED at --http-body-timeout-secs, and the
    memory they held goes back to the system (RSS), with the connections
    still open."""
    s = make_server(repo, "--http-body-timeout-secs", "3", "--http-timeout-secs", "300",
                    "--grpc-max-message-size", "64M")
    pid = s.proc.pid
    probe = h2frames.Conn(s.grpc_url())
    answered_in_order(probe, 1)
    before = rss_bytes(pid)
    conns = [h2frames.Conn(s.grpc_url(), timeout=30) for _ in range(3)]
    for c in conns:
        for sid in (1, 3, 5):  # 3 x 40 MiB of 60 MiB messages: the third passes the 2 x 64 MiB cap
            send_partial(c, sid, INFER, 60 * MiB, 40 * MiB)
        answered_in_order(c, 7)
    during = rss_bytes(pid)
    measure = not sanitized()
    # Each connection holds at most --grpc-max-buffered-bytes (2 x 64 MiB): 2 calls of 60 MiB blocks.
    if measure:
        assert during - before < 3 * 2 * 64 * MiB + 64 * MiB, (before, during)
        assert during - before > 3 * 60 * MiB, (before, during)  # the calls did hold their bytes
    for c in conns:
        assert c.wait(lambda fr: c.ended(1) and c.ended(3) and c.ended(5), timeout=60)
        assert not c.closed
        status_of = lambda sid: [f for f in c.frames if f[2] == sid and f[0] == h2frames.HEADERS][-1][3]
        assert b"\x018" in status_of(5)  # RESOURCE_EXHAUSTED: past the connection's cap
        assert b"\x014" in status_of(1)  # DEADLINE_EXCEEDED: cut at the body deadline
    after = rss_bytes(pid)
    if measure:
        assert after - before < 48 * MiB, (before, during, after)
    for c in conns:
        answered_in_order(c, 9)  # the connections serve on
        c.close()
    probe.close()


def test_slow_streaming_call_outlives_the_deadlines(make_server, repo):
    """A streaming call that sends a message now and then, with pauses longer
    than the idle and body deadlines, is served to its end: an open call is not
    idle, and the body deadline runs only while a message is arriving."""
    import queue
    s = make_server(repo, "--http-timeout-secs", "1", "--http-body-timeout-secs", "1")
    client = grpcclient.InferenceServerClient(s.grpc_url())
    got = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    for k in range(3):
        x = np.full((1, 4), k, np.float32)
        i = grpcclient.InferInput("x", [1, 4], "FP32")
        i.set_data_from_numpy(x)
        client.async_stream_infer("tiny", [i], request_id=str(k))
        result, error = got.get(timeout=30)
        assert error is None, error
        assert result.get_response().id == str(k)
        time.sleep(2.5)  # past both deadlines, with the call open
    client.stop_stream()
    client.close()


def test_unary_call_refuses_a_second_message_as_it_arrives(make_server, repo):
    """A unary call's message is checked when its 5-byte prefix arrives
    (flag and declared length), and bytes past that one message end the call
    with INVALID_ARGUMENT at once, not when the client half-closes: the
    server holds at most the one message it announced."""
    s = make_server(repo, "--grpc-max-message-size", "1M")
    c = h2frames.Conn(s.grpc_url())
    c.call(1, INFER, b"\x0a\x04tiny", end=False)  # a whole message, no END_STREAM
    answered_in_order(c, 3)
    assert not c.ended(1)  # one message: the call waits for the half-close
    c.send(h2frames.frame(h2frames.DATA, 0, 1, h2frames.grpc_message(b"\x0a\x04tiny")))
    assert c.wait(lambda fr: c.ended(1))
    trailers = h2frames.stream_headers(c, 1)[-1]
    assert trailers["grpc-status"] == "3", trailers  # INVALID_ARGUMENT
    assert "ModelInfer takes exactly one request message" in trailers["grpc-message"]
    send_partial(c, 5, INFER, 2 * MiB, 100)  # the prefix alone passes the limit
    assert c.wait(lambda fr: c.ended(5))
    trailers = h2frames.stream_headers(c, 5)[-1]
    assert trailers["grpc-status"] == "8", trailers  # RESOURCE_EXHAUSTED
    assert "--grpc-max-message-size (1048576 bytes)" in trailers["grpc-message"]
    answered_in_order(c, 7)
    c.close()
