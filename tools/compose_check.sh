#!/usr/bin/env bash
# Runs docker/compose.yml's kiln + Redis pair as plain processes on this
# machine (no Docker engine needed): the CPU image's recipe
# (tools/image_cpu.sh) installs kiln into a scratch prefix, then kiln gets
# exactly the environment compose.yml gives its container, with only the
# addresses mapped to loopback and a fresh Redis password in
# KILN_REDIS_PASSWORD. Checks: Redis refuses clients without the password,
# ready, inference, the result landing in Redis and coming back from it,
# metrics, gRPC on its port (grpc.health.v1 Check over HTTP/2 with curl),
# and a clean drain on SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.venv-deploy
[ -x $V/bin/python ] || tools/deploy_check.sh >/dev/null

work=$(mktemp -d)
redis_pid=""; kiln_pid=""
cleanup() {
    [ -n "$kiln_pid" ] && kill -9 "$kiln_pid" 2>/dev/null || true
    if [ -n "$redis_pid" ]; then kill -9 "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

echo "compose-check: CPU image recipe (tools/image_cpu.sh runtime-deps, build)"
tools/image_cpu.sh runtime-deps
tools/image_cpu.sh build "$work/opt/kiln" >/dev/null

redis_port=$(free_port); kiln_port=$(free_port); grpc_port=$(free_port)
# The services' settings, read from compose.yml itself.
KILN_REDIS_PASSWORD=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
export KILN_REDIS_PASSWORD
$V/bin/python - "$work" "$redis_port" "$kiln_port" "$grpc_port" "$PWD/model_repository" <<'PY'
import os, re, shlex, sys, yaml
work, redis_port, kiln_port, grpc_port, models = sys.argv[1:]


def expand(x):
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} from this environment."""
    def one(m):
        v = os.environ.get(m.group(1), "")
        if v or not m.group(2):
            return v
        if m.group(2) == ":?":
            sys.exit("compose-check: compose.yml needs %s: %s" % (m.group(1), m.group(3)))
        return m.group(3)
    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, str(x))


c = yaml.safe_load(open("docker/compose.yml"))
env = {k: expand(v) for k, v in c["services"]["kiln"]["environment"].items()}
env["KILN_MODEL_REPOSITORY"] = models
env["KILN_HTTP_ADDRESS"] = "127.0.0.1"
env["KILN_HTTP_PORT"] = kiln_port
# compose publishes the gRPC port it sets: the same one inside the container.
if env.get("KILN_GRPC_PORT") != "8001" or "8001:8001" not in c["services"]["kiln"]["ports"]:
    sys.exit("compose-check: compose.yml must set KILN_GRPC_PORT 8001 and publish 8001:8001")
env["KILN_GRPC_PORT"] = grpc_port
env["KILN_REDIS_URL"] = env["KILN_REDIS_URL"].replace("redis:6379", "127.0.0.1:" + redis_port)
with open(work + "/kiln.env", "w") as f:
    for k, v in env.items():
        f.write("export %s=%s\n" % (k, shlex.quote(str(v))))
cmd = [expand(a) for a in c["services"]["redis"]["command"]]
with open(work + "/redis.cmd", "w") as f:
    f.write(" ".join(shlex.quote(a) for a in cmd + ["--port", redis_port, "--bind", "127.0.0.1"]))
PY

# exec: $! is then redis-server itself, which cleanup kills (not a shell
# whose death would leave it running).
eval "exec $(cat "$work/redis.cmd")" >"$work/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.05; done
# Without the password Redis answers nothing but an error...
redis-cli -p "$redis_port" dbsize 2>&1 | grep -q NOAUTH || { echo "compose-check: Redis serves clients without a password"; exit 1; }
# ...so every later redis-cli here, like kiln, carries it.
export REDISCLI_AUTH=$KILN_REDIS_PASSWORD
# shellcheck disable=SC1091
(source "$work/kiln.env"; exec "$work/opt/kiln/bin/kiln" serve) >"$work/kiln.log" 2>&1 &
kiln_pid=$!
base="http://127.0.0.1:$kiln_port"
for _ in $(seq 100); do curl -fs "$base/v2/health/ready" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fs "$base/v2/health/ready" >/dev/null || { cat "$work/kiln.log"; echo "compose-check: kiln never became ready"; exit 1; }

body='{"inputs":[{"name":"input","shape":[1,64],"datatype":"FP32","data":[0,0,5,13,9,1,0,0,0,0,13,15,10,15,5,0,0,3,15,2,0,11,8,0,0,4,12,0,0,8,8,0,0,5,8,0,0,9,8,0,0,4,11,0,1,12,7,0,0,2,14,5,10,12,0,0,0,0,6,13,10,0,0,0]}]}'
first=$(curl -fsS "$base/v2/models/digits/infer" -d "$body")
echo "$first" | grep -q '"label"' || { echo "compose-check: bad answer: $first"; exit 1; }
# The answer reached the shared Redis tier...
for _ in $(seq 50); do
    n=$(redis-cli -p "$redis_port" dbsize); [ "$n" -ge 1 ] && break; sleep 0.1
done
[ "$n" -ge 1 ] || { cat "$work/kiln.log"; echo "compose-check: nothing was stored in Redis"; exit 1; }
second=$(curl -fsS "$base/v2/models/digits/infer" -d "$body")
[ "$first" = "$second" ] || { echo "compose-check: cached answer differs"; exit 1; }
metrics=$(curl -fsS "$base/metrics")
grep -q '^kiln_cache_redis_stores_total [1-9]' <<<"$metrics" || { echo "compose-check: no Redis stores in /metrics"; exit 1; }
# gRPC: a grpc.health.v1 Check (an empty request message) answers SERVING (field 1 = 1).
health=$(printf '\0\0\0\0\0' | curl -fsS --http2-prior-knowledge -H 'content-type: application/grpc' -H 'te: trailers' \
    --data-binary @- "http://127.0.0.1:$grpc_port/grpc.health.v1.Health/Check" | od -An -tx1 | tr -d ' \n')
[ "$health" = 00000000020801 ] || { cat "$work/kiln.log"; echo "compose-check: gRPC health answered '$health'"; exit 1; }
kill -TERM "$kiln_pid"
rc=0; wait "$kiln_pid" || rc=$?
kiln_pid=""
[ "$rc" = 0 ] || { cat "$work/kiln.log"; echo "compose-check: kiln exited $rc on SIGTERM"; exit 1; }
echo "compose-check: kiln + Redis from compose.yml: ready, infer, Redis tier, metrics, gRPC, drain: ok"
