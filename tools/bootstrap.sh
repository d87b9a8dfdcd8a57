#!/usr/bin/env bash
# Installs what kiln needs to build and test, once: Debian packages (as root;
# otherwise prints the apt-get line) and .venv with pinned test tools.
set -euo pipefail
cd "$(dirname "$0")/.."

# What building kiln needs; then what its tests and benchmarks need.
# KILN_BUILD_ONLY=1 (used by the container images) installs the first list only
# and makes a .venv holding tritonclient alone: the gRPC messages are
# generated from the descriptors inside it (tools/grpc_descriptors.py).
BUILD_DEBS="build-essential pkg-config libevent-dev libcjson-dev libhiredis-dev libdnnl-dev \
libprotobuf-c-dev protobuf-c-compiler libonnx-dev libsodium-dev libssl-dev zlib1g-dev libpcre2-dev \
libnghttp2-dev libutf8proc-dev libjpeg62-turbo-dev libpng-dev libwebp-dev python3-venv"
TEST_DEBS="libcmocka-dev redis-server wrk clang libclang-rt-14-dev curl haproxy buildah debootstrap"
DEBS="$BUILD_DEBS"
[ "${KILN_BUILD_ONLY:-0}" = 1 ] || DEBS="$BUILD_DEBS $TEST_DEBS"

missing=""
for p in $DEBS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "bootstrap: installing Debian packages:$missing"
        export DEBIAN_FRONTEND=noninteractive
        # Installing redis-server (or haproxy) would start Debian's own service
        # and leave it running after the tests; the tests start their own. A
        # policy-rc.d that refuses every start (Debian's mechanism for this)
        # is in place during the install, unless the machine has one already.
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
            chmod 755 /usr/sbin/policy-rc.d
            trap 'rm -f /usr/sbin/policy-rc.d' EXIT
        fi
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends $missing >/dev/null
    else
        echo "bootstrap: missing Debian packages. Run:"
        echo "  sudo apt-get install -y$missing"
        exit 1
    fi
fi

PY=${PYTHON:-python3}
# KILN_EXTRA_CA: a CA bundle pip must trust as well as the system's (a
# TLS-intercepting proxy). The images' builds pass it as a build secret
# (/run/secrets/extra_ca): the combined bundle is written to /dev/shm (a
# tmpfs in a build step, never part of a layer) and removed when pip is done.
KILN_CA_TMP=""
if [ -s "${KILN_EXTRA_CA:-}" ]; then
    KILN_CA_TMP=$(mktemp -p /dev/shm 2>/dev/null || mktemp)
    cat /etc/ssl/certs/ca-certificates.crt "$KILN_EXTRA_CA" >"$KILN_CA_TMP" 2>/dev/null || cat "$KILN_EXTRA_CA" >"$KILN_CA_TMP"
    export PIP_CERT=$KILN_CA_TMP
fi
ca_done() { [ -z "$KILN_CA_TMP" ] || rm -f "$KILN_CA_TMP"; }
if [ "${KILN_BUILD_ONLY:-0}" = 1 ]; then
    if ! ls .venv/lib/python3*/site-packages/tritonclient/grpc/service_pb2.py >/dev/null 2>&1; then
        # The pinned version, without its extras and dependencies: only its files are read.
        tc=$(sed -n 's/^tritonclient\(\[[^]]*\]\)\{0,1\}==/tritonclient==/p' requirements-dev.txt)
        echo "bootstrap: .venv with $tc (its gRPC descriptors)"
        [ -x .venv/bin/python ] || "$PY" -m venv .venv
        .venv/bin/pip install -q --disable-pip-version-check --no-deps "$tc"
    fi
    ca_done
    exit 0
fi
if [ ! -f .venv/.stamp ] || [ requirements-dev.txt -nt .venv/.stamp ] || [ requirements-nodeps.txt -nt .venv/.stamp ]; then
    echo "bootstrap: creating .venv from requirements-dev.txt"
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
    .venv/bin/pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
    touch .venv/.stamp
fi
ca_done
