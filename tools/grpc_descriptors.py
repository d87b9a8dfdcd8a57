#!/usr/bin/env python3
"""Writes the FileDescriptorSet of Triton's gRPC service (grpc_service.proto
and model_config.proto) from the descriptors the tritonclient wheel carries,
for protoc-c --descriptor_set_in. kiln keeps no copy of the schema: the
pinned tritonclient (requirements-dev.txt) is its one source.

    tools/grpc_descriptors.py SITE_PACKAGES_OR_PACKAGE_DIR OUT.pb

Only the standard library: the generated *_pb2.py modules hold each file's
serialized FileDescriptorProto as a bytes literal, read here with ast
(importing them would need protobuf and grpcio of matching versions, which
a build-only container does not have).
"""
import ast
import sys
from pathlib import Path

FILES = ("model_config_pb2.py", "service_pb2.py")  # dependencies first


def find_package(where):
    p = Path(where)
    for cand in (p, p / "tritonclient" / "grpc"):
        if all((cand / f).is_file() for f in FILES):
            return cand
    hits = sorted(p.glob("lib/python3*/site-packages/tritonclient/grpc"))
    if hits:
        return hits[0]
    sys.exit(f"grpc_descriptors: no tritonclient/grpc/{FILES[1]} under {where} (install tritonclient[grpc])")


def serialized(path):
    """The bytes given to AddSerializedFile(...) or serialized_pb=... in a _pb2 module."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        args = list(node.args) if fn == "AddSerializedFile" else [k.value for k in node.keywords
                                                                  if k.arg == "serialized_pb"]
        for a in args:
            if isinstance(a, ast.Constant) and isinstance(a.value, bytes):
                return a.value
    sys.exit(f"grpc_descriptors: no serialized descriptor in {path}")


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    pkg = find_package(sys.argv[1])
    out = bytearray()
    for f in FILES:  # FileDescriptorSet: repeated FileDescriptorProto file = 1
        blob = serialized(pkg / f)
        out += b"\x0a" + varint(len(blob)) + blob
    Path(sys.argv[2]).write_bytes(bytes(out))


if __name__ == "__main__":
    main()
