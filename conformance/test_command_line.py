"""tritonserver's command line on kiln: a Triton deployment's flags start it unchanged, the flags
kiln honours do what Triton's do (endpoints on and off, SO_REUSEPORT, --id, --exit-on-error,
--model-config-name, --backend-config default-max-batch-size, the older trace flags, response
compression), and the metrics flags give Triton's series (CPU gauges, latency summaries with the
chosen quantiles, counters off). Every flag of tritonserver's parser (tritonserver_flags.txt) is
known to kiln, documented, and either honoured or logged as having no effect. Every test starts a
kiln of its own.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import (
    BUNDLED_REPO,
    FIXTURE_REPO,
    KilnServer,
    RPC_TIMEOUT,
    STARTUP_TIMEOUT,
    doc_section,
    http_request,
    kiln_bin,
    start_server,
    stop_server,
)

T = RPC_TIMEOUT
LABELS = '{model="add_sub",version="1"}'


def add_sub_inputs(module):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    return inputs, a


def metrics_text(server) -> str:
    reply = http_request(server.metrics_url, "GET", "/metrics")
    assert reply.status == 200
    return reply.body.decode()


def samples(text: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            found[key] = float(value)
    return found


def refuses_connections(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


def add_sub_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(BUNDLED_REPO / "add_sub", repo / "add_sub")
    return repo


def test_a_triton_command_line_serves_and_notes_what_it_does_not_use(tmp_path):
    trace = tmp_path / "trace.json"
    server = start_server([BUNDLED_REPO], name="triton-flags", extra_args=[
        "--strict-model-config=false",
        "--backend-directory=/opt/tritonserver/backends",
        "--pinned-memory-pool-byte-size=268435456",
        "--cuda-memory-pool-byte-size=0:67108864",
        "--grpc-keepalive-time=10000",
        "--grpc-keepalive-timeout=5000",
        "--grpc-infer-response-compression-level=high",
        "--model-load-thread-count=2",
        "--exit-on-error=false",
        "--log-verbose=0",
        "--id=triton-7",
        "--allow-cpu-metrics=false",
        f"--trace-file={trace}",
        "--trace-level=TIMESTAMPS",
        "--trace-rate=1",
    ])
    try:
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        inputs, a = add_sub_inputs(grpcclient)
        # Responses are gzip-compressed for grpcio, which accepts gzip; they decode unchanged.
        result = grpc.infer("add_sub", inputs, client_timeout=T)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 1)
        assert grpc.get_server_metadata().name == "triton-7"
        http = httpclient.InferenceServerClient(server.http_url)
        assert http.get_server_metadata()["name"] == "triton-7"
        log = server.log_text()
        for flag in ("pinned-memory-pool-byte-size", "cuda-memory-pool-byte-size"):
            assert f"--{flag} has no effect: " in log, flag
        assert "nv_cpu_utilization" not in metrics_text(server)
    finally:
        stop_server(server)
    # --trace-file/--trace-level/--trace-rate are --trace-config's older spelling: the request
    # was traced, and the file was written at exit.
    records = json.loads(trace.read_text())
    assert any(r.get("model_name") == "add_sub" for r in records), records


def test_metrics_flags_give_tritons_series(tmp_path):
    server = start_server([BUNDLED_REPO], name="metrics-flags", extra_args=[
        "--metrics-config", "summary_latencies=true",
        "--metrics-config", "counter_latencies=false",
        "--metrics-config", "summary_quantiles=0.5:0.05,0.99:0.001",
        "--metrics-interval-ms", "100",
    ])
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        inputs, _ = add_sub_inputs(grpcclient)
        for _ in range(3):
            client.infer("add_sub", inputs, client_timeout=T)
        time.sleep(0.3)  # two CPU readings
        text = metrics_text(server)
    finally:
        stop_server(server)
    found = samples(text)
    assert found[f"nv_inference_request_success{LABELS}"] == 3
    assert "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes" in text
    # counter_latencies=false: no duration counters.
    assert "_duration_us" not in text
    for name in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        family = f"nv_inference_{name}_summary_us"
        assert f"# TYPE {family} summary" in text
        assert found[f"{family}_count{LABELS}"] == 3
        quantiles = sorted(
            key.split('quantile="')[1].rstrip('"}') for key in found if key.startswith(family + "{") and "add_sub" in key
        )
        assert quantiles == ["0.5", "0.99"], quantiles
    assert found[f"nv_inference_request_summary_us_sum{LABELS}"] > 0
    # The machine's CPU gauges, from /proc.
    assert 0.0 <= found["nv_cpu_utilization"] <= 1.0
    assert 0 < found["nv_cpu_memory_used_bytes"] <= found["nv_cpu_memory_total_bytes"]
    assert "# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes" in text


def test_grpc_or_http_can_be_turned_off():
    rest_only = start_server([BUNDLED_REPO], name="no-grpc", extra_args=["--allow-grpc=false"])
    try:
        assert refuses_connections(rest_only.grpc_port)
        client = httpclient.InferenceServerClient(rest_only.http_url)
        assert client.is_server_ready()
        inputs, a = add_sub_inputs(httpclient)
        np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + 1)
        assert "gRPC is off (--allow-grpc=false)" in rest_only.log_text()
    finally:
        stop_server(rest_only)
    grpc_only = start_server([BUNDLED_REPO], name="no-http", extra_args=["--allow-http=false"])
    try:
        assert refuses_connections(grpc_only.http_port)
        assert grpcclient.InferenceServerClient(grpc_only.grpc_url).is_server_ready()
    finally:
        stop_server(grpc_only)


def test_reused_ports_are_shared_by_servers_that_all_ask_for_it():
    reuse = ["--reuse-grpc-port=true", "--reuse-http-port=true"]
    first = start_server([BUNDLED_REPO], name="reuse-1", extra_args=reuse)
    try:
        second = KilnServer([BUNDLED_REPO], name="reuse-2", extra_args=reuse)
        second.grpc_port, second.grpc_url = first.grpc_port, first.grpc_url
        second.http_port, second.http_url = first.http_port, first.http_url
        second.start()
        try:
            assert second.proc.poll() is None and first.proc.poll() is None
            for _ in range(4):
                assert grpcclient.InferenceServerClient(first.grpc_url).is_server_live()
            # A server that does not ask for SO_REUSEPORT cannot take the port.
            refused = subprocess.run(
                [str(kiln_bin()), "--model-repository", str(BUNDLED_REPO), "--allow-metrics=false",
                 "--grpc-port", str(first.grpc_port), "--http-port", "0"],
                capture_output=True, timeout=STARTUP_TIMEOUT,
            )
            assert refused.returncode == 1
            assert b"cannot bind gRPC address" in refused.stderr
        finally:
            stop_server(second)
    finally:
        stop_server(first)


def test_model_config_name_and_default_max_batch_size(tmp_path):
    repo = add_sub_repo(tmp_path)
    configs = repo / "add_sub" / "configs"
    configs.mkdir()
    text = (repo / "add_sub" / "config.pbtxt").read_text().replace("max_batch_size: 8", "max_batch_size: 2")
    (configs / "small.pbtxt").write_text(text)
    # A model without configs/small.pbtxt uses its config.pbtxt; one without any config is
    # completed from its graph with --backend-config's default-max-batch-size.
    shutil.copytree(BUNDLED_REPO / "add_sub", repo / "plain")
    (repo / "plain" / "config.pbtxt").write_text(
        (repo / "plain" / "config.pbtxt").read_text().replace('name: "add_sub"', 'name: "plain"'))
    (repo / "bare" / "1").mkdir(parents=True)
    shutil.copy(BUNDLED_REPO / "add_sub" / "1" / "model.onnx", repo / "bare" / "1" / "model.onnx")
    server = start_server([repo], name="config-name", extra_args=[
        "--model-config-name=small", "--backend-config=onnxruntime,default-max-batch-size=3",
    ])
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.get_model_config("add_sub")["max_batch_size"] == 2
        assert client.get_model_config("plain")["max_batch_size"] == 8
        bare = client.get_model_config("bare")
        assert bare["max_batch_size"] == 3 and "dynamic_batching" in bare
        inputs = [httpclient.InferInput(n, [3, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(np.ones((3, 16), np.float32))
        assert client.infer("bare", inputs).as_numpy("OUTPUT0").shape == (3, 16)
        with pytest.raises(Exception, match="batch"):
            big = [httpclient.InferInput(n, [3, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            for i in big:
                i.set_data_from_numpy(np.ones((3, 16), np.float32))
            client.infer("add_sub", big)
    finally:
        stop_server(server)


def test_exit_on_error_stops_a_server_whose_models_fail_to_load(tmp_path):
    repo = add_sub_repo(tmp_path)
    shutil.copytree(FIXTURE_REPO / "broken", repo / "broken")
    args = [str(kiln_bin()), "--model-repository", str(repo), "--grpc-port", "0", "--http-port", "0",
            "--allow-metrics=false"]
    failed = subprocess.run(args + ["--exit-on-error=true"], capture_output=True, timeout=STARTUP_TIMEOUT)
    assert failed.returncode == 1, failed.stderr.decode()[-2000:]
    log = failed.stderr.decode()
    assert "failed to load all models (--exit-on-error)" in log and "'broken'" in log, log[-2000:]
    # Without it (kiln's default) the same repository serves, not ready, with the reason indexed.
    server = start_server([repo], name="no-exit-on-error")
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_server_live() and not client.is_server_ready()
        assert client.is_model_ready("add_sub") and not client.is_model_ready("broken")
    finally:
        stop_server(server)


# --------------------------------------------------------------------------- every tritonserver flag

TRITON_FLAGS = [line.strip() for line in (Path(__file__).parent / "tritonserver_flags.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#")]

# The flags kiln accepts without effect, each with a value a Triton deployment might give it.
NO_EFFECT = {
    "enable-peer-access": "true",
    "http-header-forward-pattern": "x-.*",
    "http-thread-count": "8",
    "grpc-header-forward-pattern": "x-.*",
    "grpc-infer-thread-count": "2",
    "grpc-infer-allocation-pool-size": "8",
    "grpc-max-response-pool-size": "8",
    "grpc-keepalive-permit-without-calls": "true",
    "grpc-http2-max-pings-without-data": "2",
    "grpc-http2-min-recv-ping-interval-without-data": "300000",
    "grpc-http2-max-ping-strikes": "2",
    "sagemaker-safe-port-range": "8000-8002",
    "sagemaker-thread-count": "8",
    "vertex-ai-thread-count": "8",
    "cache-directory": "/opt/tritonserver/caches",
    "pinned-memory-pool-byte-size": "268435456",
    "cuda-memory-pool-byte-size": "0:67108864",
    "cuda-virtual-address-size": "0:1073741824",
    "min-supported-compute-capability": "6.0",
    "buffer-manager-thread-count": "0",
    "host-policy": "gpu0,numa-node=0",
    "model-load-gpu-limit": "0:0.8",
    "repoagent-directory": "/opt/tritonserver/repoagents",
}


def readme_command_line() -> tuple[str, str]:
    """docs/operations.md's Command line section, and its paragraph on the flags without effect."""
    section = doc_section(Path(__file__).parent.parent / "docs" / "operations.md", "Command line")
    return section, section.split("Flags of `tritonserver` about parts", 1)[1]


def mentions(text: str, flag: str) -> bool:
    return re.search(rf"--{re.escape(flag)}(?![\w-])", text) is not None


def test_the_flag_list_is_tritons_and_every_flag_is_documented():
    assert len(TRITON_FLAGS) == len(set(TRITON_FLAGS)) == 91
    # The named flags are there.
    assert {"response-cache-byte-size", "grpc-max-message-bytes", "log-info", "log-warning",
            "log-error"} <= set(TRITON_FLAGS)
    section, no_effect = readme_command_line()
    assert [f for f in TRITON_FLAGS if not mentions(section, f)] == [], "not in docs/operations.md's Command line"
    assert set(NO_EFFECT) <= set(TRITON_FLAGS)
    assert [f for f in NO_EFFECT if not mentions(no_effect, f)] == [], "not among docs/operations.md's flags without effect"


def test_kiln_knows_every_tritonserver_flag():
    # clap lists every flag it accepts in --help (the alias `model-store` too: see below).
    text = subprocess.run([str(kiln_bin()), "--help"], capture_output=True, text=True, timeout=60).stdout
    known = set(re.findall(r"^\s+(?:-\w, )?--([a-z0-9-]+)", text, re.M))
    assert [f for f in TRITON_FLAGS if f not in known and f != "model-store"] == []


def test_flags_without_effect_are_accepted_and_logged(tmp_path):
    repo = add_sub_repo(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    # Namespacing off is kiln's only way, so `false` is honoured silently.
    args = [f"--{flag}={value}" for flag, value in NO_EFFECT.items()] + [f"--model-store={other}",
                                                                          "--model-namespacing=false"]
    server = start_server([repo], name="no-effect-flags", extra_args=args)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        inputs, a = add_sub_inputs(grpcclient)
        np.testing.assert_array_equal(client.infer("add_sub", inputs, client_timeout=T).as_numpy("OUTPUT0"), a + 1)
        log = server.log_text()
    finally:
        stop_server(server)
    assert [flag for flag in NO_EFFECT if f"--{flag} has no effect: " not in log] == []
    assert "model-namespacing" not in log and "model-store" not in log


def test_model_namespacing_is_refused(tmp_path):
    # It would change which model a name reaches: refused at start-up, not ignored.
    run = subprocess.run([str(kiln_bin()), "--model-repository", str(add_sub_repo(tmp_path)),
                          "--model-namespacing=true", "--grpc-port=0", "--http-port=0", "--metrics-port=0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "--model-namespacing=true is not supported: model names must be unique across repositories" in run.stderr
