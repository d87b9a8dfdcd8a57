"""Configuration of `kiln serve`: --help, flags, KILN_* environment, the JSON
file, their precedence, and the backend choice."""
import json
import re
import subprocess

import pytest
import tritonclient.http as httpclient

from conftest import KILN, save_model, tiny_graph

FLAGS = ["--model-repository", "--http-port", "--http-address", "--http-threads", "--backend", "--log-level",
         "--log-format", "--max-request-size", "--exit-timeout-secs", "--model-control-mode", "--load-model",
         "--control-token", "--allow-unauthenticated-control", "--max-model-instances", "--max-intra-op-threads",
         "--cache-size", "--redis-url", "--cache-ttl-secs", "--cache-secret", "--config"]


@pytest.fixture()
def small_repo(tmp_path):
    root = tmp_path / "repo"
    save_model(root, "tiny", tiny_graph())
    return root


def run_kiln(*args, env=None, timeout=30):
    import os
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([str(KILN), "serve", *args], capture_output=True, text=True, timeout=timeout, env=e)


def test_help_documents_every_flag():
    p = run_kiln("--help")
    assert p.returncode == 0
    for f in FLAGS:
        assert f in p.stdout, f
    assert "KILN_" in p.stdout and "flag > environment > file > default" in p.stdout


@pytest.mark.parametrize("args,words", [
    (["--no-such-flag", "1"], ["--no-such-flag"]),
    (["--http-port", "99999"], ["http-port", "99999"]),
    (["--backend", "tpu"], ["backend", "auto, cpu or cuda"]),
    (["--model-control-mode", "sometimes"], ["model-control-mode"]),
    (["--max-request-size", "lots"], ["max-request-size"]),
    (["--load-model", "tiny"], ["--load-model", "explicit"]),
    (["--http-port"], ["--http-port", "needs a value"]),
])
def test_bad_flags_exit_2_naming_the_flag(args, words):
    p = run_kiln(*args)
    assert p.returncode == 2
    for w in words:
        assert w in p.stderr, (w, p.stderr)


def test_bad_env_and_file_values_name_their_source(tmp_path):
    p = run_kiln(env={"KILN_HTTP_THREADS": "many"})
    assert p.returncode == 2 and "KILN_HTTP_THREADS" in p.stderr
    cfg = tmp_path / "kiln.json"
    cfg.write_text('{"http_port": "x"}')
    p = run_kiln("--config", str(cfg))
    assert p.returncode == 2 and "http_port" in p.stderr and "kiln.json" in p.stderr
    cfg.write_text('{"not_a_setting": 1}')
    p = run_kiln("--config", str(cfg))
    assert p.returncode == 2 and "not_a_setting" in p.stderr
    cfg.write_text('{"http_port": ')
    p = run_kiln("--config", str(cfg))
    assert p.returncode == 2 and "JSON" in p.stderr


def test_precedence_flag_env_file_default(make_server, small_repo, tmp_path):
    cfg = tmp_path / "kiln.json"
    cfg.write_text(json.dumps({"http_threads": 3, "log_format": "json", "model_control_mode": "explicit",
                               "load_model": ["tiny"], "cache_size": "1M"}))
    # File only: 3 threads, JSON logs, explicit mode with tiny loaded.
    s = make_server(small_repo, "--config", str(cfg))
    text = s.text()
    lines = [json.loads(l) for l in text.splitlines() if l.startswith("{")]
    assert any("listening on" in l["msg"] for l in lines), text
    # conftest passes --http-threads 2 as a flag: the flag beats the file.
    assert any(re.search(r"\(2 I/O threads", l["msg"]) for l in lines)
    c = httpclient.InferenceServerClient(s.url)
    assert c.is_model_ready("tiny")
    c.close()
    # Environment beats the file; the flag beats the environment.
    s2 = make_server(small_repo, "--config", str(cfg), env={"KILN_LOG_FORMAT": "text"})
    assert "listening on" in s2.text() and not s2.text().lstrip().startswith("{")
    s3 = make_server(small_repo, "--config", str(cfg), "--log-format", "json", env={"KILN_LOG_FORMAT": "text"})
    assert s3.text().lstrip().startswith("{")


def test_backend_auto_falls_back_with_one_line(make_server, small_repo):
    s = make_server(small_repo, "--backend", "auto")
    lines = [l for l in s.text().splitlines() if "backend auto:" in l or "backend: cuda" in l]
    assert len(lines) == 1, s.text()


def test_backend_cuda_without_gpu_exits_nonzero(small_repo):
    p = run_kiln("--model-repository", str(small_repo), "--http-port", "0", "--http-address", "127.0.0.1",
                 "--backend", "cuda", timeout=20) if not _has_gpu() else None
    if p is None:
        pytest.skip("a GPU is usable here")
    assert p.returncode != 0
    assert "cuda" in p.stderr.lower()


def _has_gpu():
    p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True) if _which("nvidia-smi") else None
    return bool(p and p.returncode == 0 and "GPU" in p.stdout)


def _which(cmd):
    import shutil
    return shutil.which(cmd)


def test_missing_repository_exits_nonzero(tmp_path):
    p = run_kiln("--model-repository", str(tmp_path / "nope"), "--http-port", "0")
    assert p.returncode != 0 and "nope" in p.stderr


def test_port_in_use_is_an_error(make_server, small_repo):
    s = make_server(small_repo)
    p = run_kiln("--model-repository", str(small_repo), "--http-address", "127.0.0.1", "--http-port", str(s.port))
    assert p.returncode != 0
    assert "already in use" in p.stderr and str(s.port) in p.stderr
