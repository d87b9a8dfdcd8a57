"""Hostile HTTP clients against the real kiln: smuggling-shaped framing, parser
errors, slow headers and bodies (slowloris), more connections than kiln takes,
and the open file limit running out. Every refusal is a KServe JSON error with
the right status, and kiln keeps serving everyone else."""
import json
import os
import functools
import resource
import select
import socket
import subprocess
import time

import pytest

from conftest import KilnServer, raw_request


def connect(server, timeout=10):
    host, port = server.url.split(":")
    s = socket.create_connection((host, int(port)), timeout=timeout)
    s.settimeout(timeout)
    return s


def read_all(s):
    """Everything the server sends until it closes (a reset after the answer counts as the end)."""
    out = b""
    while True:
        try:
            b = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not b:
            break
        out += b
    return out


def responses(raw):
    """[(status, headers, body)] of the HTTP/1.1 responses in raw, in order."""
    out = []
    while raw:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        assert sep, f"truncated response: {raw!r}"
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
        n = int(headers.get("content-length", "0"))
        out.append((status, headers, rest[:n]))
        raw = rest[n:]
    return out


def exchange(server, data, shut=False):
    s = connect(server)
    try:
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        return responses(read_all(s))
    finally:
        s.close()


def assert_json_error(resp, status, *words):
    st, headers, body = resp
    assert st == status, resp
    assert headers.get("content-type") == "application/json", resp
    msg = json.loads(body)["error"]
    for w in words:
        assert w in msg, (w, msg)
    return msg


def assert_serves(server):
    status, _, _ = raw_request(server.url, "GET", "/v2/health/live")
    assert status == 200


LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: k\r\n\r\n"

FRAMING = [
    # The first Content-Length would win and "GET /v2/health/live" run as a second request.
    ("two Content-Length", b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nContent-Length: 2\r\nContent-Length: 43\r\n\r\n{}"
     + LIVE, 400, ["Content-Length"]),
    ("space before colon", b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nContent-Length : 43\r\n\r\n" + LIVE, 400,
     ["Content-Length", "colon"]),
    ("length and chunked", b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nContent-Length: 5\r\nTransfer-Encoding: chunked"
     b"\r\n\r\n0\r\n\r\n" + LIVE, 400, ["Transfer-Encoding"]),
    ("no Host", b"GET /v2/health/live HTTP/1.1\r\n\r\n", 400, ["Host"]),
    ("two Host", b"GET /v2/health/live HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, ["Host"]),
    ("bad length", b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nContent-Length: 1e3\r\n\r\n", 400, ["Content-Length"]),
    ("HEAD with a body", b"HEAD /v2/health/live HTTP/1.1\r\nHost: k\r\nContent-Length: 43\r\n\r\n" + LIVE, 400, ["HEAD"]),
    ("folded header", b"GET /v2/health/live HTTP/1.1\r\nHost: k\r\nX-A: 1\r\n folded\r\n\r\n", 400, ["folding"]),
    ("bad chunk size", b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
     ["chunk"]),
    ("chunk size short of its data", b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"1\r\n{}\r\n0\r\n\r\n", 400, ["chunk"]),
    ("chunk extension", b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\n{}\r\n",
     400, ["extension"]),
    ("unknown method", b"BREW /v2/health/live HTTP/1.1\r\nHost: k\r\n\r\n", 501, ["BREW"]),
    ("unknown coding", b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nTransfer-Encoding: gzip\r\n\r\n", 501, ["gzip"]),
    ("expectation", b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nExpect: tea\r\nContent-Length: 2\r\n\r\n{}", 417,
     ["tea"]),
    ("HTTP/2 line", b"GET /v2/health/live HTTP/2.0\r\nHost: k\r\n\r\n", 505, ["HTTP/1.1"]),
    ("garbage line", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400, ["request"]),
    ("huge header", b"GET /v2/health/live HTTP/1.1\r\nHost: k\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", 431, ["header"]),
    ("huge length", b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nContent-Length: 99999999999999\r\n\r\n", 413,
     ["max-request-size"]),
]


@pytest.mark.parametrize("what,data,status,words", FRAMING, ids=[f[0] for f in FRAMING])
def test_framing_refused_with_json(server, what, data, status, words):
    got = exchange(server, data)
    # One answer, kiln's, and the connection closed: nothing smuggled behind it ran.
    assert len(got) == 1, got
    assert_json_error(got[0], status, *words)
    assert got[0][1].get("connection") == "close"
    assert_serves(server)


def test_refusal_waits_for_the_answers_before_it(server):
    """A bad request pipelined behind a good one: the good one is answered first."""
    got = exchange(server, LIVE + b"BREW / HTTP/1.1\r\nHost: k\r\n\r\n")
    assert [g[0] for g in got] == [200, 501]
    assert_json_error(got[1], 501, "BREW")


def test_good_requests_still_pass(server):
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7]) for i in range(0, len(body), 7)) + b"0\r\n\r\n"
    got = exchange(server, b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                   + b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked
                   + b"GET /v2/health/live HTTP/1.0\r\n\r\n")
    assert [g[0] for g in got] == [200, 200, 200], got
    assert json.loads(got[0][2]) == json.loads(got[1][2])


def test_closing_replies_between_kept_alive_ones(server):
    """Requests that end their connection (Connection: close) while another connection is kept alive:
    each closing reply frees its connection from inside the write path. This crashed kiln (a freed
    filter's write timeout left in libevent's timer heap) within a few dozen rounds."""
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}).encode()
    kept = connect(server)
    try:
        for i in range(400):
            kept.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            got = b""
            while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < int(
                    responses_head(got).get("content-length", "0")):
                b = kept.recv(65536)
                assert b, f"round {i}: the kept-alive connection was closed"
                got += b
            assert got.startswith(b"HTTP/1.1 200"), (i, got[:200])
            status, _, _ = raw_request(server.url, "GET", "/v2/models/tiny/stats", headers={"Connection": "close"})
            assert status == 200, i
    finally:
        kept.close()
    assert_serves(server)


def responses_head(raw):
    head = raw.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in head)}


@pytest.mark.parametrize("where", ["start", "after a key", "between numbers", "in the binary header"])
def test_nul_in_json_refused(server, where):
    good = '{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}'
    headers = {"Content-Type": "application/json"}
    if where == "start":
        body = "\0" + good
    elif where == "after a key":
        body = good.replace('"inputs"', '"inputs"\0')
    elif where == "between numbers":
        body = good.replace("1, 2", "1,\0 2")
    else:
        h = good.replace('"name"', '"na\0me"').encode()
        body = h
        headers["Inference-Header-Content-Length"] = str(len(h))
    status, _, raw = raw_request(server.url, "POST", "/v2/models/tiny/infer", body.encode() if isinstance(body, str) else body,
                                 headers)
    assert status == 400
    assert "NUL" in json.loads(raw)["error"]
    status, _, _ = raw_request(server.url, "POST", "/v2/models/tiny/infer", good, headers={"Content-Type": "application/json"})
    assert status == 200


def test_413_reaches_a_client_that_sends_the_whole_body(make_server, repo):
    s = make_server(repo, "--max-request-size", "65536")
    body = b"[" * (4 << 20)
    for head in (b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nContent-Length: %d\r\n\r\n" % len(body),):
        c = connect(s, timeout=30)
        c.sendall(head + body)  # the whole body, as tritonclient does, before reading
        got = responses(read_all(c))
        c.close()
        assert len(got) == 1
        assert_json_error(got[0], 413, "max-request-size")
    # Chunked: the sum of the chunks passes the limit partway through.
    c = connect(s, timeout=30)
    chunk = b"[" * 16384
    c.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nTransfer-Encoding: chunked\r\n\r\n"
              + (b"4000\r\n" + chunk + b"\r\n") * 64 + b"0\r\n\r\n")
    got = responses(read_all(c))
    c.close()
    assert_json_error(got[-1], 413, "max-request-size")
    assert_serves(s)


def readable(c, timeout):
    """Whether c has something to read (or was closed) within timeout seconds;
    poll, not select, which refuses descriptors above 1023."""
    p = select.poll()
    p.register(c, select.POLLIN)
    return bool(p.poll(timeout * 1000))


def trickle(c, data, every=0.2, limit=15):
    """Sends data a byte at a time until kiln answers; returns (seconds until the answer, the answer)."""
    t0 = time.monotonic()
    for b in data:
        if readable(c, 0) or time.monotonic() - t0 > limit:
            break
        try:
            c.send(bytes([b]))
        except OSError:
            break
        time.sleep(every)
    readable(c, limit)
    elapsed = time.monotonic() - t0
    return elapsed, responses(read_all(c))


def test_slow_header_cut_at_its_deadline(make_server, repo):
    s = make_server(repo, "--http-header-timeout-secs", "2", "--http-timeout-secs", "60")
    c = connect(s, timeout=20)
    # One byte every 0.2 s: each resets the idle timeout, none the deadline.
    elapsed, got = trickle(c, b"GET /v2/health/live HTTP/1.1\r\nHost: k\r\nX-Slow: " + b"a" * 200)
    c.close()
    assert 1.5 < elapsed < 8, elapsed
    assert_json_error(got[0], 408, "--http-header-timeout-secs")
    # A connection that sends nothing is left to the idle timeout (pooled client connections do that).
    s2 = make_server(repo, "--http-header-timeout-secs", "1", "--http-timeout-secs", "3")
    c = connect(s2, timeout=20)
    t0 = time.monotonic()
    assert read_all(c) == b""
    c.close()
    assert 2 < time.monotonic() - t0 < 15
    assert_serves(s)


def test_slowloris_connections_all_cut(make_server, repo):
    s = make_server(repo, "--http-header-timeout-secs", "2")
    conns = [connect(s, timeout=20) for _ in range(100)]
    t0 = time.monotonic()
    open_ = set(range(len(conns)))
    while open_ and time.monotonic() - t0 < 15:
        for i in list(open_):
            try:
                conns[i].send(b"G")
            except OSError:
                open_.discard(i)
        time.sleep(0.5)
    for c in conns:
        c.close()
    assert not open_, f"{len(open_)} slow connections still open after 15 s"
    assert_serves(s)


def test_slow_body_cut_at_its_deadline(make_server, repo):
    s = make_server(repo, "--http-body-timeout-secs", "2", "--http-header-timeout-secs", "2")
    c = connect(s, timeout=20)
    c.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: k\r\nContent-Length: 1000\r\n\r\n")
    elapsed, got = trickle(c, b" " * 1000)
    c.close()
    assert 1.5 < elapsed < 8, elapsed
    assert_json_error(got[0], 408, "--http-body-timeout-secs")
    assert_serves(s)


def test_connections_over_the_limit_are_shed(make_server, repo):
    s = make_server(repo, "--max-connections", "8")
    idle = [connect(s) for _ in range(8)]
    time.sleep(0.3)
    # The ninth is answered at once with a JSON 503, without having sent anything.
    c = connect(s)
    got = responses(read_all(c))
    c.close()
    assert_json_error(got[0], 503, "--max-connections")
    # A slot freed is taken by the next client.
    idle.pop().close()
    deadline = time.monotonic() + 10
    while True:
        status, _, _ = raw_request(s.url, "GET", "/v2/health/live")
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status == 200
    for c in idle:
        c.close()
    assert "--max-connections 8" in s.text()


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def limit_fds(n):
    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


@pytest.mark.parametrize("max_connections", [None, "1000"], ids=["default cap", "cap above the fd limit"])
def test_fd_exhaustion_stays_bounded(tmp_path, repo, max_connections, monkeypatch):
    """Twice the open file limit of connections held open: kiln neither spins nor floods its log, and
    answers a normal request again once a connection closes."""
    limit = 128
    args = ["--max-connections", max_connections] if max_connections else []
    monkeypatch.setattr(subprocess, "Popen", functools.partial(subprocess.Popen, preexec_fn=limit_fds(limit)))
    s = KilnServer(repo, *args, log_path=tmp_path / "kiln.log")
    monkeypatch.undo()
    held = []
    try:
        assert "open file limit: 128" in s.text()
        for _ in range(2 * limit):
            try:
                held.append(connect(s, timeout=5))
            except OSError:
                break
        time.sleep(1)
        cpu0, log0, t0 = cpu_seconds(s.proc.pid), os.path.getsize(s.log_path), time.monotonic()
        time.sleep(3)
        cpu1, log1, t1 = cpu_seconds(s.proc.pid), os.path.getsize(s.log_path), time.monotonic()
        cpu = (cpu1 - cpu0) / (t1 - t0)
        log_rate = (log1 - log0) / (t1 - t0)
        assert cpu < 0.5, f"kiln used {cpu:.0%} of a core with its connections exhausted"
        assert log_rate < 5000, f"the log grew {log_rate:.0f} bytes/s"
        # Free the admitted ones (the first held); the next client is served.
        for c in held[:limit // 2]:
            c.close()
        deadline = time.monotonic() + 10
        status = None
        while time.monotonic() < deadline:
            try:
                status, _, _ = raw_request(s.url, "GET", "/v2/health/live")
            except OSError:
                status = None
            if status == 200:
                break
            time.sleep(0.05)
        assert status == 200
    finally:
        for c in held:
            c.close()
        rc = s.stop()
    assert s.sanitizer_report() is None, s.sanitizer_report()
    assert rc == 0, s.text()


GOOD_INFER = b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}'


@pytest.mark.parametrize("accept, coding", [
    ("gzip", "gzip"), ("gzip;q=0", None), ("GZIP; Q=0.000", None), ("deflate", "deflate"),
    ("gzip;q=0.1, deflate;q=0.5", "deflate"), ("deflate;q=0.5, gzip;q=0.5", "gzip"), ("*", "gzip"),
    ("gzip;q=0, *", "deflate"), ("*;q=0", None), ("identity;q=0", None), ("identity", None),
    ("br, gzip;q=0.2", "gzip"), ("gzip;q=2", None), ("gzip;q=abc, deflate", "deflate"), ("", None),
])
def test_accept_encoding_q_values(server, accept, coding):
    """Accept-Encoding is read with its q-values (RFC 9110 12.5.3): a coding
    at q=0 is refused, the highest acceptable one wins (gzip on a tie), and
    with none acceptable the answer goes out uncompressed."""
    import gzip as gz
    import zlib as zl
    status, headers, raw = raw_request(server.url, "POST", "/v2/models/tiny/infer", GOOD_INFER,
                                       {"Content-Type": "application/json", "Accept-Encoding": accept})
    assert status == 200
    assert headers.get("Content-Encoding") == coding, (accept, headers)
    body = gz.decompress(raw) if coding == "gzip" else zl.decompress(raw) if coding == "deflate" else raw
    assert json.loads(body)["outputs"][0]["name"] == "probs"


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_bytes_after_compressed_body_refused(server, coding):
    """A request body with bytes after the end of its gzip member or zlib
    stream (another member, garbage) is a 400 that says so, not a body
    read short."""
    import gzip as gz
    import zlib as zl
    pack = gz.compress if coding == "gzip" else zl.compress
    headers = {"Content-Type": "application/json", "Content-Encoding": coding}
    for tail in (b"junk", pack(b" ")):
        status, _, raw = raw_request(server.url, "POST", "/v2/models/tiny/infer", pack(GOOD_INFER) + tail, headers)
        assert status == 400, raw
        msg = json.loads(raw)["error"]
        assert f"{len(tail)} bytes after the end of its {coding} data" in msg, msg
    status, _, _ = raw_request(server.url, "POST", "/v2/models/tiny/infer", pack(GOOD_INFER), headers)
    assert status == 200


def test_header_length_past_the_body_named(server):
    """An Inference-Header-Content-Length larger than the body is reported as
    such, not as a NUL byte in the JSON."""
    body = GOOD_INFER + b"\0\0\0\0"
    for hl in (len(body) + 1, 1 << 40):
        status, _, raw = raw_request(server.url, "POST", "/v2/models/tiny/infer", body,
                                     {"Content-Type": "application/octet-stream",
                                      "Inference-Header-Content-Length": str(hl)})
        assert status == 400
        msg = json.loads(raw)["error"]
        assert f"Inference-Header-Content-Length ({hl}) exceeds the request body ({len(body)} bytes)" in msg, msg
        assert "NUL" not in msg
    assert_serves(server)


def test_413_reaches_http_client_after_the_whole_body(make_server, repo):
    """Python's http.client sends the whole body before it reads: a body far
    over --max-request-size (here 40 MiB against 64 KiB) is read and dropped
    after the 413 (up to 4 x the limit or 64 MiB), so the client reads the
    413 instead of a broken pipe."""
    s = make_server(repo, "--max-request-size", "65536")
    status, _, raw = raw_request(s.url, "POST", "/v2/models/tiny/infer", b"[" * (40 << 20),
                                 {"Content-Type": "application/json"})
    assert status == 413
    assert "max-request-size" in json.loads(raw)["error"]
    assert_serves(s)
