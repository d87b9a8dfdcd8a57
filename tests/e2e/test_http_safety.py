"""Safe defaults and hygiene against hostile clients and untidy repositories:
the control API needs a token off loopback, thread and instance bounds, log
lines that a model name cannot forge, regular files only from the repository,
no absolute paths to clients, escaped Prometheus labels, and a control thread
that fails to start failing the start."""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import KILN, ROOT, KilnServer, raw_request, save_model, tiny_graph


@pytest.fixture()
def small_repo(tmp_path):
    root = tmp_path / "repo"
    save_model(root, "tiny", tiny_graph())
    return root


def run_kiln(repo, *args, env=None, timeout=30):
    """kiln serve that is expected to refuse to start: (exit code, output)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.run([str(KILN), "serve", "--model-repository", str(repo), "--http-port", "0", *args],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace")


def load(s, name, body=None, headers=None):
    status, _, data = raw_request(s.url, "POST", f"/v2/repository/models/{name}/load",
                                  body=json.dumps(body) if body is not None else None, headers=headers)
    return status, data.decode(errors="replace")


# ---- safe defaults -------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["explicit", "poll"])
def test_control_without_token_refused_off_loopback(small_repo, mode):
    rc, out = run_kiln(small_repo, "--http-address", "0.0.0.0", "--model-control-mode", mode)
    assert rc != 0, out
    assert "--control-token" in out and "--allow-unauthenticated-control" in out, out
    assert "listening on" not in out


def test_control_without_token_allowed_on_loopback(make_server, small_repo):
    s = make_server(small_repo, "--model-control-mode", "explicit")  # conftest binds 127.0.0.1
    assert load(s, "tiny")[0] == 200
    assert "--allow-unauthenticated-control" not in s.text()


def test_control_without_token_with_override_warns(make_server, small_repo):
    s = make_server(small_repo, "--http-address", "0.0.0.0", "--model-control-mode", "explicit",
                    "--allow-unauthenticated-control")
    assert load(s, "tiny")[0] == 200
    warn = [line for line in s.text().splitlines() if " warn " in line and "control-token" in line]
    assert warn and "anyone" in warn[0], s.text()


def test_control_with_token_off_loopback(make_server, small_repo):
    s = make_server(small_repo, "--http-address", "0.0.0.0", "--model-control-mode", "explicit",
                    "--control-token", "s3cret")
    assert load(s, "tiny")[0] == 401
    assert load(s, "tiny", headers={"Authorization": "Bearer s3cret"})[0] == 200


@pytest.mark.parametrize("how", ["flag", "env"])
def test_empty_token_refused(small_repo, how):
    args = ["--http-address", "127.0.0.1", "--model-control-mode", "explicit"]
    if how == "flag":
        rc, out = run_kiln(small_repo, *args, "--control-token=")
    else:
        rc, out = run_kiln(small_repo, *args, env={"KILN_CONTROL_TOKEN": ""})
    assert rc != 0, out
    assert "control-token" in out.lower() and "empty" in out, out
    assert "listening on" not in out


def test_load_over_bounds_is_400(make_server, small_repo):
    s = make_server(small_repo, "--model-control-mode", "explicit", "--max-model-instances", "3",
                    "--max-intra-op-threads", "2")
    status, body = load(s, "tiny", {"parameters": {"config": json.dumps({"instance_group": [{"count": 256}]})}})
    assert status == 400, body
    assert "'instance_group' asks for 256 instances" in body and "3" in body and "--max-model-instances" in body, body
    cfg = {"parameters": {"intra_op_thread_count": {"string_value": "1024"}}}
    status, body = load(s, "tiny", {"parameters": {"config": json.dumps(cfg)}})
    assert status == 400, body
    assert "intra_op_thread_count" in body and "2" in body and "--max-intra-op-threads" in body, body
    ok = {"instance_group": [{"count": 3}], "parameters": {"intra_op_thread_count": {"string_value": "2"}}}
    status, body = load(s, "tiny", {"parameters": {"config": json.dumps(ok)}})
    assert status == 200, body


def test_config_json_over_bounds_fails_that_model(make_server, small_repo):
    save_model(small_repo, "greedy", tiny_graph(), config=json.dumps({"instance_group": [{"count": 100}]}))
    s = make_server(small_repo, "--max-model-instances", "4")
    status, _, body = raw_request(s.url, "POST", "/v2/repository/index")
    index = {m["name"]: m for m in json.loads(body)}
    assert index["tiny"]["state"] == "READY"
    assert index["greedy"]["state"] == "UNAVAILABLE"
    assert "'instance_group' asks for 100 instances" in index["greedy"]["reason"]
    assert "--max-model-instances" in index["greedy"]["reason"]


# ---- hygiene ---------------------------------------------------------------------------------

FORGED = "2030-01-01T00:00:00.000Z error FORGED"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_model_name_cannot_forge_log_lines(make_server, small_repo, fmt):
    s = make_server(small_repo, "--model-control-mode", "explicit", "--log-format", fmt)
    name = "x%0a" + FORGED.replace(" ", "%20") + "%1b[31m%0d"
    for action in ("load", "unload"):
        raw_request(s.url, "POST", f"/v2/repository/models/{name}/{action}")
    raw_request(s.url, "GET", f"/v2/models/{name}")
    raw_request(s.url, "POST", f"/v2/models/{name}/infer", body=b"{}")
    s.stop()
    text = s.text()
    assert "FORGED" in text, text  # the name was logged...
    for line in text.splitlines():
        assert not line.startswith("2030-01-01"), text  # ...but never as a line of its own
        assert "\x1b" not in line and "\r" not in line, repr(line)
        if fmt == "json" and line.startswith("{"):
            json.loads(line)


def test_fifo_config_is_a_load_error(make_server, small_repo):
    d = small_repo / "piped"
    save_model(small_repo, "piped", tiny_graph())
    os.mkfifo(d / "config.json")
    s = make_server(small_repo, "--model-control-mode", "explicit", "--exit-timeout-secs", "10")
    t0 = time.monotonic()
    status, body = load(s, "piped")
    assert time.monotonic() - t0 < 10
    assert status == 400 and "config.json" in body and "regular file" in body, body
    # The control thread is free: another load works, and so does the shutdown.
    assert load(s, "tiny")[0] == 200
    t0 = time.monotonic()
    assert s.stop(timeout=20) == 0
    assert time.monotonic() - t0 < 5


def test_fifo_model_and_labels_are_load_errors(make_server, small_repo):
    d = small_repo / "pipedmodel" / "1"
    d.mkdir(parents=True)
    os.mkfifo(d / "model.onnx")
    save_model(small_repo, "pipedlabels", tiny_graph(),
               config='{"output": [{"name": "probs", "label_filename": "labels.txt"}]}')
    os.mkfifo(small_repo / "pipedlabels" / "labels.txt")
    s = make_server(small_repo, "--model-control-mode", "explicit")
    # A FIFO model.onnx is not a version at all; a FIFO label file is a clear error.
    status, body = load(s, "pipedmodel")
    assert status == 400 and "model.onnx" in body, body
    status, body = load(s, "pipedlabels")
    assert status == 400 and "regular file" in body and "labels.txt" in body, body
    assert s.stop(timeout=20) == 0


def test_no_absolute_paths_to_clients(make_server, small_repo):
    (small_repo / "noversion").mkdir()
    broken = small_repo / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"this is not protobuf")
    save_model(small_repo, "badlabels", tiny_graph(),
               config='{"output": [{"name": "probs", "label_filename": "missing.txt"}]}')
    root = str(small_repo.resolve())
    s = make_server(small_repo.resolve(), "--model-control-mode", "explicit")
    bodies = []
    for name in ("noversion", "broken", "badlabels", "absent"):
        status, body = load(s, name)
        assert status in (400, 404), body
        bodies.append(body)
    status, _, index = raw_request(s.url, "POST", "/v2/repository/index")
    bodies.append(index.decode())
    for body in bodies:
        assert root not in body and str(small_repo) not in body, body
    reasons = {m["name"]: m["reason"] for m in json.loads(index)}
    assert "broken/1/model.onnx" in reasons["broken"], reasons
    assert "noversion/1/model.onnx" in reasons["noversion"], reasons
    assert "missing.txt" in reasons["badlabels"], reasons
    # The operator's log still says where.
    assert root in s.text()


# One sample line of the Prometheus text format (0.0.4), strictly.
LABEL_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*'
                    r'(?:\{[a-zA-Z_][a-zA-Z0-9_]*=' + LABEL_VALUE + r'(?:,[a-zA-Z_][a-zA-Z0-9_]*=' + LABEL_VALUE +
                    r')*\})? [-+]?(?:[0-9.eE+-]+|NaN|Inf)(?: -?[0-9]+)?$')


def parse_metrics(text):
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        assert SAMPLE.match(line), f"not a Prometheus sample line: {line!r}"
        samples.append(line)
    return samples


def test_metrics_labels_escaped(make_server, tmp_path):
    root = tmp_path / "repo"
    save_model(root, 'q"x', tiny_graph())
    s = make_server(root)
    for name in ('q%22x',):
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
        status, _, out = raw_request(s.url, "POST", f"/v2/models/{name}/infer", body=body)
        assert status == 200, out
    status, _, text = raw_request(s.url, "GET", "/metrics")
    assert status == 200
    samples = parse_metrics(text.decode())
    assert any('model="q\\"x"' in line for line in samples), text
    assert any(line.startswith('kiln_inference_exec_count{model="q\\"x"') for line in samples), text


# ---- the control thread --------------------------------------------------------------------

FAIL_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
/* Fails the Nth pthread_create (KILN_TEST_FAIL_THREAD=N) with EAGAIN. */
int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg) {
    static atomic_int calls;
    static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    if (!real) real = dlsym(RTLD_NEXT, "pthread_create");
    const char *n = getenv("KILN_TEST_FAIL_THREAD");
    if (n && atoi(n) == atomic_fetch_add(&calls, 1) + 1) return EAGAIN;
    return real(t, a, fn, arg);
}
"""


def test_failed_thread_start_never_hangs(tmp_path, small_repo):
    src = tmp_path / "failthread.c"
    src.write_text(FAIL_SHIM)
    lib = tmp_path / "failthread.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src), "-ldl"], check=True)
    said_control = False
    for n in range(1, 7):
        # An ASan build wants its runtime first; the shim only wraps its pthread_create.
        asan = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "verify_asan_link_order=0"]))
        env = {"LD_PRELOAD": str(lib), "KILN_TEST_FAIL_THREAD": str(n), "ASAN_OPTIONS": asan}
        try:
            s = KilnServer(small_repo, "--model-control-mode", "explicit", "--http-threads", "1",
                           "--cache-size", "0", env=env)
        except RuntimeError as e:  # refused to start: with a message, never silently
            said_control |= "cannot start the control thread" in str(e)
            continue
        try:
            # Started: a load is answered (200 or an error), never left waiting.
            import http.client
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=20)
            conn.request("POST", "/v2/repository/models/tiny/load")
            assert conn.getresponse().status in (200, 400, 500, 503)
            conn.close()
        finally:
            assert s.stop(timeout=20) is not None
    assert said_control
