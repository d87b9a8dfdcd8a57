"""`kiln bench` against the real kiln: the counts it reports match the server's
own statistics, a budget that cannot be met exits 1, one that is met exits 0,
the open loop measures from the schedule, and --protocol grpc drives the same
model through ModelInfer."""
import json
import subprocess

from conftest import KILN


def bench(server, *args, timeout=120):
    return subprocess.run([str(KILN), "bench", "-u", server.url, "--no-progress", *args],
                          capture_output=True, text=True, timeout=timeout)


def success_count(client, model):
    s = client.get_inference_statistics(model)["model_stats"][0]
    return int(s["inference_stats"]["success"]["count"])


def test_counts_match_server_statistics(server, client, tmp_path):
    before = success_count(client, "tiny")
    out = tmp_path / "r.json"
    r = bench(server, "-m", "tiny", "-c", "1,4", "-d", "1.5", "--warmup", "0", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    levels = rep["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 4]
    sent = sum(lv["requests"] + lv["errors"] for lv in levels)
    assert all(lv["errors"] == 0 and lv["requests"] > 0 for lv in levels)
    # Every request kiln bench completed is one the server counted, and no more.
    assert success_count(client, "tiny") - before == sent
    # The server-side split is read from /stats for each level.
    assert all(lv["server_requests"] == lv["requests"] for lv in levels)
    assert "p99" in r.stdout and "c=4" in r.stdout


def test_grpc_counts_match_server_statistics(server, client, tmp_path):
    before = success_count(client, "tiny")
    out = tmp_path / "g.json"
    r = bench(server, "-i", "grpc", "--grpc-url", server.grpc_url(), "-m", "tiny", "-b", "2", "-c", "1,8",
              "-d", "1.5", "--warmup", "0", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "grpc://" in r.stdout
    rep = json.loads(out.read_text())
    assert rep["protocol"] == "grpc"
    levels = rep["levels"]
    assert all(lv["errors"] == 0 and lv["requests"] > 0 for lv in levels)
    sent = sum(lv["requests"] for lv in levels)
    assert success_count(client, "tiny") - before == sent
    # A request the server refuses is a failure with its grpc-status and message.
    r = bench(server, "-i", "grpc", "--grpc-url", server.grpc_url(), "-m", "tiny", "-x", "1", "--shape", "x:1,5",
              "-c", "1", "-n", "5", "--warmup", "0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "failed with grpc-status 3" in r.stdout and "shape" in r.stdout
    # Nobody listening: connection errors, and the run ends.
    r = bench(server, "-i", "grpc", "--grpc-url", "127.0.0.1:1", "-m", "tiny", "-c", "2", "-d", "1", "--warmup", "0")
    assert r.returncode == 1 and "connection error" in r.stdout, r.stdout + r.stderr


def test_latency_budget_gate(server):
    r = bench(server, "-m", "tiny", "-c", "2", "-d", "1", "--warmup", "0", "--latency-budget", "p50=1ns")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "NOT met" in r.stdout
    r = bench(server, "-m", "tiny", "-c", "2", "-d", "1", "--warmup", "0", "--latency-budget", "p99=60s")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "latency budget met" in r.stdout


def test_open_loop_rate_and_csv(server, tmp_path):
    csv = tmp_path / "r.csv"
    r = bench(server, "-m", "tiny", "-r", "200", "--poisson", "-d", "2", "--warmup", "0", "--csv", str(csv))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = csv.read_text().splitlines()
    assert rows[0].startswith("model,mode,concurrency,rate")
    fields = dict(zip(rows[0].split(","), rows[1].split(",")))
    assert fields["mode"] == "poisson"
    # About 200/s for 2 s, whatever the server's speed: arrivals follow the schedule.
    assert 250 <= int(fields["requests"]) <= 550, fields
    assert float(fields["throughput"]) > 120


def test_help_documents_the_options():
    r = subprocess.run([str(KILN), "bench", "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    for opt in ("--concurrency", "--rate", "--poisson", "--latency-budget", "--csv", "--json", "--input-data",
                "--json-data", "-b, --batch-size", "--protocol http|grpc", "--grpc-url"):
        assert opt in r.stdout, opt


def test_shared_memory_mode(server, make_server, tmp_path):
    """--shared-memory: the inputs travel in registered shared-memory objects
    (each connection registers them for itself), every request succeeds, and
    nothing is left registered or in /dev/shm. A server without
    --allow-client-shm refuses, and bench says so."""
    import os
    import tritonclient.http as httpclient
    r = bench(server, "-m", "tiny", "-n", "1", "--shared-memory")
    assert r.returncode == 2 and "--allow-client-shm" in r.stderr, r.stderr
    server = make_server(server.repo_path, "--allow-client-shm")
    client = httpclient.InferenceServerClient(server.url)
    before = success_count(client, "tiny")
    out = tmp_path / "r.json"
    r = bench(server, "-m", "tiny", "-b", "2", "-c", "2", "-n", "200", "--warmup", "0", "--unique", "3",
              "--shared-memory", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "shared-memory requests" in r.stdout
    lv = json.loads(out.read_text())["levels"][0]
    assert lv["errors"] == 0 and lv["requests"] >= 200
    assert success_count(client, "tiny") - before == lv["requests"]
    assert client.get_system_shared_memory_status() == []
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("kiln_bench_")]
    r = bench(server, "-m", "tiny", "--shared-memory", "--json-data", "-n", "1")
    assert r.returncode == 2 and "exclude each other" in r.stderr
    client.close()
