"""A raw HTTP/2 connection for the gRPC tests that a real client cannot
make: frames written by hand (floods, malformed frames, too many streams, a
grpc-timeout the client does not enforce itself). Headers are sent as HPACK
literals without indexing or Huffman coding (RFC 7541 6.2.2), which every
decoder accepts; answers are read as frames, their header blocks left
encoded."""
import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
REFUSED_STREAM, ENHANCE_YOUR_CALM = 0x7, 0xB


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


def _int(n, prefix_bits, first=0):
    limit = (1 << prefix_bits) - 1
    if n < limit:
        return bytes([first | n])
    out = bytearray([first | limit])
    n -= limit
    while n >= 128:
        out.append(n % 128 + 128)
        n //= 128
    out.append(n)
    return bytes(out)


def header_block(headers):
    out = bytearray()
    for name, value in headers:
        name, value = name.encode(), value.encode() if isinstance(value, str) else value
        out += b"\x00" + _int(len(name), 7) + name + _int(len(value), 7) + value
    return bytes(out)


def grpc_headers(method, extra=()):
    return [(":method", "POST"), (":scheme", "http"), (":path", method), (":authority", "kiln"),
            ("content-type", "application/grpc"), ("te", "trailers"), *extra]


def grpc_message(payload):
    return b"\x00" + struct.pack(">I", len(payload)) + payload


class Conn:
    def __init__(self, url, timeout=10):
        host, port = url.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.buf = b""
        self.frames = []
        self.closed = False
        # Windows wide enough that the server never waits for a WINDOW_UPDATE
        # (this client sends none).
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 30)) +
                          frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 30)))

    def send(self, data):
        self.sock.sendall(data)

    def call(self, sid, method, body, extra=(), end=True):
        """One unary call on stream sid: HEADERS, then the message in DATA."""
        self.send(frame(HEADERS, END_HEADERS, sid, header_block(grpc_headers(method, extra))) +
                  frame(DATA, END_STREAM if end else 0, sid, grpc_message(body)))

    def _read(self, deadline):
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed = True
            return
        self.buf += data
        while len(self.buf) >= 9:
            n = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + n:
                break
            ftype, flags = self.buf[3], self.buf[4]
            sid = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            self.frames.append((ftype, flags, sid, self.buf[9:9 + n]))
            self.buf = self.buf[9 + n:]

    def wait(self, pred, timeout=15):
        """Reads until pred(frames) holds or the connection closes: pred's value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = pred(self.frames)
            if got or self.closed:
                return got
            self._read(deadline)
        return pred(self.frames)

    def goaway(self, timeout=15):
        """The GOAWAY's error code, or None; waits for it or the close."""
        def find(frames):
            return next((int.from_bytes(f[3][4:8], "big") for f in frames if f[0] == GOAWAY), None)
        got = self.wait(lambda fr: find(fr) is not None, timeout)
        return find(self.frames) if got else None

    def ended(self, sid):
        """1 once stream sid ended (END_STREAM from the server or a RST_STREAM)."""
        return any(f[2] == sid and (f[0] == RST_STREAM or (f[0] in (HEADERS, DATA) and f[1] & END_STREAM))
                   for f in self.frames)

    def close(self):
        self.sock.close()


class HeaderDecoder:
    """HPACK decoding of a connection's answers through the system's
    libnghttp2 (the library kiln itself links), for the tests that read
    header values: feed it every header block of one connection in order
    (the dynamic table spans them)."""

    class _NV(__import__("ctypes").Structure):
        import ctypes as _c
        _fields_ = [("name", _c.POINTER(_c.c_uint8)), ("value", _c.POINTER(_c.c_uint8)),
                    ("namelen", _c.c_size_t), ("valuelen", _c.c_size_t), ("flags", _c.c_uint8)]

    def __init__(self):
        import ctypes
        import ctypes.util
        self.c = ctypes
        self.lib = ctypes.CDLL(ctypes.util.find_library("nghttp2"))
        self.lib.nghttp2_hd_inflate_hd2.restype = ctypes.c_ssize_t
        self.lib.nghttp2_hd_inflate_hd2.argtypes = [ctypes.c_void_p, ctypes.POINTER(self._NV),
                                                    ctypes.POINTER(ctypes.c_int), ctypes.c_char_p,
                                                    ctypes.c_size_t, ctypes.c_int]
        self.lib.nghttp2_hd_inflate_end_headers.argtypes = [ctypes.c_void_p]
        self.lib.nghttp2_hd_inflate_del.argtypes = [ctypes.c_void_p]
        self.inflater = ctypes.c_void_p()
        assert self.lib.nghttp2_hd_inflate_new(ctypes.byref(self.inflater)) == 0

    def decode(self, block):
        """The (name, value) pairs of one whole header block, as str."""
        c, out, off = self.c, [], 0
        while True:
            nv, flags = self._NV(), c.c_int(0)
            n = self.lib.nghttp2_hd_inflate_hd2(self.inflater, c.byref(nv), c.byref(flags), block[off:],
                                                len(block) - off, 1)
            assert n >= 0, f"HPACK error {n}"
            off += n
            if flags.value & 0x02:  # NGHTTP2_HD_INFLATE_EMIT
                out.append((c.string_at(nv.name, nv.namelen).decode(), c.string_at(nv.value, nv.valuelen).decode()))
            if flags.value & 0x01:  # NGHTTP2_HD_INFLATE_FINAL
                self.lib.nghttp2_hd_inflate_end_headers(self.inflater)
                return out
            if n == 0 and not flags.value & 0x02:
                return out

    def close(self):
        self.lib.nghttp2_hd_inflate_del(self.inflater)


def stream_headers(conn, sid):
    """Every header block the server sent on stream sid of conn (headers,
    then trailers), decoded: a list of dicts. Decodes the whole connection's
    blocks in order, as HPACK requires."""
    d, out = HeaderDecoder(), []
    for f in conn.frames:
        if f[0] == HEADERS:
            block = d.decode(f[3])
            if f[2] == sid:
                out.append(dict(block))
    d.close()
    return out
