#!/usr/bin/env bash
# The recipe of docker/Dockerfile.cpu, as a script so that CI runs the very
# same steps on its machine (no Docker engine there):
#   tools/image_cpu.sh build PREFIX     build stage: packages, make, install
#   tools/image_cpu.sh runtime-deps     runtime stage: the shared libraries kiln loads
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME_DEBS="libevent-2.1-7 libevent-pthreads-2.1-7 libcjson1 libhiredis0.14 libdnnl2 \
libprotobuf-c1 libnghttp2-14 libsodium23 libssl3 zlib1g libpcre2-8-0 libutf8proc2 libjpeg62-turbo libpng16-16 \
libwebp7 libgomp1 curl ca-certificates"

case "${1:-}" in
build)
    prefix=${2:?usage: image_cpu.sh build PREFIX}
    KILN_BUILD_ONLY=1 tools/bootstrap.sh
    make -j"$(nproc)" CUDA=0 build/kiln
    make install CUDA=0 PREFIX="$prefix"
    ;;
runtime-deps)
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $RUNTIME_DEBS >/dev/null
    rm -rf /var/lib/apt/lists/*
    ;;
*)
    echo "usage: $0 build PREFIX | runtime-deps" >&2
    exit 2
    ;;
esac
