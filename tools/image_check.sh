#!/usr/bin/env bash
# make image-check: builds docker/Dockerfile.cpu and tries the image as a
# user would: its own entrypoint, as its non-root user, on a read-only root
# file system, answering tritonclient over HTTP and gRPC, /metrics, and the
# result cache with a Redis that asks for a password. Prints the image's size
# and how long each step took. Then lints docker/Dockerfile (CUDA), and
# builds it only where its CUDA base image can be pulled.
#
# The builder: Docker when an engine answers, else buildah (Debian's; vfs
# storage, chroot isolation: no daemon, no privileges beyond root). buildah's
# base image, debian:12, is made once with debootstrap and kept, with
# buildah's storage, under KILN_IMAGE_CACHE (default /var/cache/kiln-image):
# later runs build from it without debootstrap.
#
# pip inside the build may go through a TLS-intercepting proxy (these
# machines, corporate networks): the CA bundle to trust is a build secret,
# KILN_EXTRA_CA (default: the host's bundle), mounted for the one RUN that
# needs it and never written to a layer; this script checks the final image
# for it.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${KILN_IMAGE_CACHE:-/var/cache/kiln-image}
TAG=localhost/kiln:cpu-check
HOST_CA=/etc/ssl/certs/ca-certificates.crt
WORK=$(mktemp -d /tmp/kiln-image-check.XXXXXX)
T0=$(date +%s)
say() { echo "image-check [$(($(date +%s) - T0)) s]: $*"; }
REDIS_PID=""
UNSHARE_PID=""
cleanup() {
    # unshare ignores SIGTERM, and setpriv's change of user clears the
    # parent-death signal: kill kiln itself, PID 1 of its namespace.
    if [ -n "$UNSHARE_PID" ]; then
        pkill -KILL -P "$UNSHARE_PID" 2>/dev/null || true
        wait "$UNSHARE_PID" 2>/dev/null || true
    fi
    if [ -n "$REDIS_PID" ]; then kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; fi
    [ -n "${CTR:-}" ] && "${BUILDAH[@]}" rm "$CTR" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# ---- lint: both Dockerfiles --------------------------------------------------
# No hadolint in Debian: the structure that matters here, checked by hand.
lint() {
    local src=$1 err=0 f
    # Continuation lines joined: one instruction a line.
    f=$WORK/$(basename "$src").joined
    sed -e ':a' -e '/\\$/{N;s/\\\n//;ba}' "$src" >"$f"
    grep -q '^FROM ' "$f" || { echo "$f: no FROM" >&2; err=1; }
    grep -q '^USER [0-9]' "$f" || { echo "$f: runs as root (no numeric USER)" >&2; err=1; }
    grep -q '^ENTRYPOINT \["' "$f" || { echo "$f: ENTRYPOINT is not in exec form" >&2; err=1; }
    grep -q '^HEALTHCHECK .*/v2/health/ready' "$f" || { echo "$f: no HEALTHCHECK on /v2/health/ready" >&2; err=1; }
    grep -q '^STOPSIGNAL SIGTERM' "$f" || { echo "$f: no STOPSIGNAL SIGTERM" >&2; err=1; }
    if grep -nE '^(ADD|RUN .*(curl|wget) .*\| *(ba)?sh)' "$f" >&2; then echo "$f: ADD or piping a download to a shell" >&2; err=1; fi
    if grep -nE 'apt-get install' "$f" | grep -v -- '--no-install-recommends' >&2; then
        echo "$f: apt-get install without --no-install-recommends" >&2; err=1
    fi
    if grep -nE '^(ENV|ARG) .*(PASSWORD|TOKEN|SECRET)=' "$f" >&2; then echo "$f: a secret in ENV/ARG" >&2; err=1; fi
    # Every stage named in COPY --from exists.
    local s
    for s in $(sed -n 's/^COPY --from=\([A-Za-z0-9_-]*\).*/\1/p' "$f"); do
        grep -qiE "^FROM .* AS $s\$" "$f" || { echo "$f: COPY --from=$s names no stage" >&2; err=1; }
    done
    return $err
}
lint docker/Dockerfile.cpu 2>&1 | sed "s|$WORK/||"
lint docker/Dockerfile 2>&1 | sed "s|$WORK/||"
say "lint: docker/Dockerfile.cpu and docker/Dockerfile (CUDA) pass"

# ---- build ---------------------------------------------------------------------
SECRET=$WORK/extra_ca.pem
MARK="kiln-image-check-secret-$RANDOM$RANDOM"
{ cat "${KILN_EXTRA_CA:-$HOST_CA}"; echo "# $MARK"; } >"$SECRET"

if docker info >/dev/null 2>&1; then
    BUILDER=docker
    say "building with Docker"
    DOCKER_BUILDKIT=1 docker build -f docker/Dockerfile.cpu --secret "id=extra_ca,src=$SECRET" -t "$TAG" .
    SIZE=$(docker image inspect -f '{{.Size}}' "$TAG")
else
    BUILDER=buildah
    command -v buildah >/dev/null || { echo "image-check: no Docker engine and no buildah: run tools/bootstrap.sh" >&2; exit 2; }
    mkdir -p "$CACHE"
    # One check at a time per cache: two would debootstrap into one folder.
    exec 9>"$CACHE/lock"
    flock 9
    BUILDAH=(buildah --storage-driver vfs --root "$CACHE/storage" --runroot "$CACHE/run")
    export BUILDAH_ISOLATION=chroot
    if ! "${BUILDAH[@]}" inspect --type image docker.io/library/debian:12 >/dev/null 2>&1; then
        command -v debootstrap >/dev/null || { echo "image-check: debootstrap is missing: run tools/bootstrap.sh" >&2; exit 2; }
        if [ ! -x "$CACHE/rootfs/bin/bash" ]; then
            say "debootstrap: Debian 12 (bookworm, minbase) into $CACHE/rootfs"
            rm -rf "$CACHE/rootfs.tmp"
            debootstrap --variant=minbase bookworm "$CACHE/rootfs.tmp" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
                >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log" >&2; exit 1; }
            mv "$CACHE/rootfs.tmp" "$CACHE/rootfs"
        fi
        say "importing $CACHE/rootfs as debian:12"
        c=$("${BUILDAH[@]}" from scratch)
        m=$("${BUILDAH[@]}" mount "$c")
        tar -C "$CACHE/rootfs" --exclude=./proc/* --exclude=./sys/* --exclude=./dev/* -cf - . | tar -C "$m" -xf -
        # What Docker Hub's debian:12 has and debootstrap leaves out: the
        # security and updates suites, and no cache of package lists.
        printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
            >"$m/etc/apt/sources.list.d/debian.sources"
        : >"$m/etc/apt/sources.list"
        rm -rf "$m"/var/lib/apt/lists/* "$m"/var/cache/apt/*.bin
        "${BUILDAH[@]}" umount "$c" >/dev/null
        "${BUILDAH[@]}" config --cmd bash "$c"
        "${BUILDAH[@]}" commit -q "$c" docker.io/library/debian:12 >/dev/null
        "${BUILDAH[@]}" rm "$c" >/dev/null
    fi
    say "building with buildah (vfs, chroot isolation)"
    "${BUILDAH[@]}" bud -q --format docker --pull=false --layers -f docker/Dockerfile.cpu --secret "id=extra_ca,src=$SECRET" -t "$TAG" . \
        >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log" >&2; exit 1; }
    # Its size: the runtime stage's root file system, uncompressed.
    CTR=$("${BUILDAH[@]}" from --pull=false "$TAG")
    ROOTFS=$("${BUILDAH[@]}" mount "$CTR")
    SIZE=$(du -sb "$ROOTFS" | cut -f1)
fi
BUILT=$(($(date +%s) - T0))
say "built $TAG with $BUILDER; image size $((SIZE / 1024 / 1024)) MiB (uncompressed)"

# ---- run the image's entrypoint ----------------------------------------------
# The image's own Entrypoint, Cmd, Env and User; a free port each for HTTP
# and gRPC (the machine is shared), appended to the Cmd.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HTTP=$(free_port); GRPC=$(free_port); RPORT=$(free_port)
RPASS="image-check-$RANDOM$RANDOM"
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --requirepass "$RPASS" >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
ARGS=(--http-port "$HTTP" --grpc-port "$GRPC" --redis-url "redis://:$RPASS@127.0.0.1:$RPORT/0" --cache-secret image-check)

if [ "$BUILDER" = docker ]; then
    docker run -d --rm --name kiln-image-check --read-only --tmpfs /tmp --network host "$TAG" serve "${ARGS[@]}" \
        >"$WORK/cid"
    trap 'docker rm -f kiln-image-check >/dev/null 2>&1 || true; cleanup' EXIT
    ( docker logs -f kiln-image-check >"$WORK/kiln.log" 2>&1 & )
    USER_SEEN=$(docker exec kiln-image-check id -u 2>/dev/null || echo '?')
else
    CONFIG=$("${BUILDAH[@]}" inspect --type image "$TAG")
    # The secret must not be anywhere in the image.
    if grep -rlsF "$MARK" "$ROOTFS" 2>/dev/null | head -1 | grep -q .; then
        echo "image-check: the build secret is in the image" >&2; exit 1
    fi
    say "the build secret is in no layer of the image"
    python3 - "$CONFIG" "$WORK/run" "${ARGS[@]}" <<'EOF'
import json, shlex, sys
cfg = json.loads(sys.argv[1])["OCIv1"]["config"]
user = cfg.get("User") or "0"
uid, _, gid = user.partition(":")
argv = (cfg.get("Entrypoint") or []) + (cfg.get("Cmd") or []) + sys.argv[3:]
with open(sys.argv[2], "w") as f:
    f.write(f"UID_IMG={shlex.quote(uid)}\nGID_IMG={shlex.quote(gid or uid)}\n")
    f.write("ENV_IMG=(" + " ".join(shlex.quote(e) for e in cfg.get("Env") or []) + ")\n")
    f.write("ARGV_IMG=(" + " ".join(shlex.quote(a) for a in argv) + ")\n")
EOF
    # shellcheck disable=SC1091
    . "$WORK/run"
    [ "$UID_IMG" != 0 ] || { echo "image-check: the image runs as root" >&2; exit 1; }
    # A container of our own: private mount and PID namespaces, the image's
    # root bound read-only, /proc, /dev and a /tmp tmpfs, the host's
    # network, then the entrypoint as the image's user (setpriv drops every
    # capability and supplementary group).
    unshare --mount --pid --fork --kill-child bash -c '
        set -e
        root=$1; shift
        mount --make-rprivate /
        mount --bind "$root" "$root"
        mount -o remount,bind,ro "$root"
        mount -t proc proc "$root/proc"
        mount --rbind /dev "$root/dev"
        mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
        exec chroot "$root" "$@"
    ' _ "$ROOTFS" /usr/bin/env -i "${ENV_IMG[@]}" setpriv --reuid="$UID_IMG" --regid="$GID_IMG" --clear-groups \
        --inh-caps=-all --bounding-set=-all "${ARGV_IMG[@]}" >"$WORK/kiln.log" 2>&1 &
    UNSHARE_PID=$!
    USER_SEEN=$UID_IMG
fi

for _ in $(seq 600); do
    grep -q "listening on grpc://" "$WORK/kiln.log" 2>/dev/null && break
    sleep 0.1
done
grep -q "listening on grpc://" "$WORK/kiln.log" || { cat "$WORK/kiln.log" >&2; echo "image-check: kiln did not start" >&2; exit 1; }
if [ "$BUILDER" = buildah ]; then
    # What the kernel says of the process: its user, and its root mounted read-only.
    KPID=""
    for p in $(pgrep -f -- "--cache-secret image-check"); do
        case "$(readlink "/proc/$p/exe" 2>/dev/null)" in */opt/kiln/bin/kiln) KPID=$p ;; esac
    done
    [ -n "$KPID" ] || { echo "image-check: no kiln process found" >&2; exit 1; }
    USER_SEEN=$(awk '/^Uid:/ {print $2}' "/proc/$KPID/status")
    [ "$USER_SEEN" = "$UID_IMG" ] || { echo "image-check: kiln runs as uid $USER_SEEN, not $UID_IMG" >&2; exit 1; }
    awk '$5 == "/" {print $6}' "/proc/$KPID/mountinfo" | grep -qw ro || {
        echo "image-check: kiln's root file system is writable" >&2; exit 1; }
fi
say "the image's entrypoint serves on :$HTTP (HTTP) and :$GRPC (gRPC), user $USER_SEEN, read-only root"

# ---- smoke tests -----------------------------------------------------------------
KILN_IMAGE_HTTP=127.0.0.1:$HTTP KILN_IMAGE_GRPC=127.0.0.1:$GRPC KILN_IMAGE_LOG=$WORK/kiln.log \
    .venv/bin/python -m pytest -q -p no:cacheprovider tests/image
say "smoke tests pass"

# The image's STOPSIGNAL: SIGTERM, then (after --shutdown-delay-secs) the drain
# and exit 0.
if [ "$BUILDER" = buildah ]; then
    kill -TERM "$KPID"
    rc=0
    for _ in $(seq 600); do kill -0 "$UNSHARE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$UNSHARE_PID" 2>/dev/null && { echo "image-check: kiln still runs 60 s after SIGTERM" >&2; exit 1; }
    wait "$UNSHARE_PID" || rc=$?
    UNSHARE_PID=""
    [ "$rc" = 0 ] || { tail -20 "$WORK/kiln.log" >&2; echo "image-check: kiln exited $rc on SIGTERM" >&2; exit 1; }
    say "SIGTERM: not ready, served for --shutdown-delay-secs, drained, exited 0"
else
    docker stop -t 40 kiln-image-check >/dev/null
fi

# ---- the CUDA image ----------------------------------------------------------------
# docker/Dockerfile is Debian 12 plus NVIDIA's CUDA repository for Debian 12:
# built only where that repository answers.
NV=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/
if curl -fsS -m 10 -o /dev/null "$NV" 2>/dev/null; then
    say "building docker/Dockerfile (CUDA)"
    if [ "$BUILDER" = docker ]; then
        DOCKER_BUILDKIT=1 docker build -f docker/Dockerfile --secret "id=extra_ca,src=$SECRET" -t localhost/kiln:cuda-check .
    else
        "${BUILDAH[@]}" bud -q --format docker --pull=false --layers -f docker/Dockerfile --secret "id=extra_ca,src=$SECRET" \
            -t localhost/kiln:cuda-check . >"$WORK/build-cuda.log" 2>&1 || { tail -40 "$WORK/build-cuda.log" >&2; exit 1; }
    fi
    say "built docker/Dockerfile (CUDA)"
else
    say "docker/Dockerfile (CUDA) linted, not built: NVIDIA's CUDA repository ($NV) is not reachable from here"
fi
echo "image-check: ok: builder $BUILDER, image $((SIZE / 1024 / 1024)) MiB, built in ${BUILT} s, all in $(($(date +%s) - T0)) s"
