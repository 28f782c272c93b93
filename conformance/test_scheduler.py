"""Scheduling seen from Triton's clients: dynamic batching under concurrent tritonclient load,
streaming with many requests in flight, ModelStatistics, deadlines and the Prometheus text."""

from __future__ import annotations

import queue
import shutil
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, FIXTURE_REPO, start_server, stop_server

T = 30  # client timeout, seconds


# mlp_classifier version 2 behind a batcher that batches deterministically: a batch goes when it
# holds 16 rows (the preferred size) and waits up to 10 s for them, with one instance.
BATCHED_CONFIG = """name: "mlp_batched"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { preferred_batch_size: [ 16 ] max_queue_delay_microseconds: 10000000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A server of its own, so that statistics start from zero."""
    repo = tmp_path_factory.mktemp("scheduler") / "repo"
    (repo / "mlp_batched" / "1").mkdir(parents=True)
    shutil.copy(BUNDLED_REPO / "mlp_classifier" / "2" / "model.onnx", repo / "mlp_batched" / "1")
    (repo / "mlp_batched" / "config.pbtxt").write_text(BATCHED_CONFIG)
    s = start_server([BUNDLED_REPO, FIXTURE_REPO, repo], name="kiln-scheduler")
    yield s
    stop_server(s)


def _stats(url: str, model: str, version: str = "") -> dict:
    return grpcclient.InferenceServerClient(url).get_inference_statistics(
        model, version, as_json=True, client_timeout=T)["model_stats"][0]


def _batches(stats: dict) -> dict[int, int]:
    """{batch size: executions} from a model's statistics."""
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}


def _mlp_input(x):
    i = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


def _mlp_reference(version, x):
    import onnxruntime as ort

    session = ort.InferenceSession(f"{BUNDLED_REPO}/mlp_classifier/{version}/model.onnx",
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"INPUT0": x})[0]


def test_concurrent_clients_are_batched_with_correct_results(fresh):
    # Eight clients send six requests each, one after another, of 1 to 3 rows: each round of eight
    # holds exactly 16 rows (the preferred size) and none can start the next round before its
    # answer, so Triton's batcher runs six batches of 16, each split back to its eight callers.
    rows = [1, 2, 3, 1, 2, 3, 1, 3]
    assert sum(rows) == 16
    rng = np.random.default_rng(7)
    inputs = {(k, r): rng.standard_normal((rows[k], 64)).astype(np.float32)
              for k in range(8) for r in range(6)}
    results: dict[tuple[int, int], np.ndarray] = {}
    errors: list[Exception] = []

    def worker(k):
        client = grpcclient.InferenceServerClient(fresh.grpc_url)
        for r in range(6):
            try:
                answer = client.infer("mlp_batched", [_mlp_input(inputs[k, r])], client_timeout=T)
                results[k, r] = answer.as_numpy("OUTPUT0")
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for key, x in inputs.items():
        np.testing.assert_allclose(results[key], _mlp_reference(2, x), rtol=1e-5, atol=1e-6)

    stats = _stats(fresh.grpc_url, "mlp_batched")
    assert int(stats["inference_count"]) == 6 * 16
    assert int(stats["inference_stats"]["success"]["count"]) == 48
    assert int(stats["execution_count"]) == 6
    assert _batches(stats) == {16: 6}


def test_stream_with_many_requests_in_flight(fresh):
    client = grpcclient.InferenceServerClient(fresh.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)), stream_timeout=60)
    rng = np.random.default_rng(3)
    sent = {}
    try:
        for i in range(40):
            x = rng.standard_normal((2, 64)).astype(np.float32)
            sent[f"m{i}"] = x
            client.async_stream_infer("mlp_classifier", [_mlp_input(x)], request_id=f"m{i}",
                                      model_version="1")
        order = []
        for _ in range(40):
            result, error = got.get(timeout=T)
            assert error is None, error
            rid = result.get_response().id
            order.append(rid)
            np.testing.assert_allclose(result.as_numpy("OUTPUT0"), _mlp_reference(1, sent[rid]),
                                       rtol=1e-5, atol=1e-6)
        assert order == [f"m{i}" for i in range(40)], "answers follow request order"
    finally:
        client.stop_stream()


def test_statistics_shape_and_scope(fresh):
    client = grpcclient.InferenceServerClient(fresh.grpc_url)
    everything = client.get_inference_statistics(as_json=True, client_timeout=T)["model_stats"]
    names = {(s["name"], s["version"]) for s in everything}
    assert ("mlp_classifier", "1") in names and ("mlp_classifier", "2") in names
    assert not any(name == "broken" for name, _ in names)
    one = client.get_inference_statistics("add_sub", as_json=True, client_timeout=T)["model_stats"]
    assert [(s["name"], s["version"]) for s in one] == [("add_sub", "1")]
    with pytest.raises(InferenceServerException) as e:
        client.get_inference_statistics("no_such_model", client_timeout=T)
    # Triton 2.51's answer (bench/triton_parity.sh --json); the text: core src/tritonserver.cc,
    # TRITONSERVER_ServerModelStatistics.
    assert (e.value.status(), e.value.message()) == ("StatusCode.INVALID_ARGUMENT",
                                                     "requested model 'no_such_model' is not available")


def test_client_deadline_expires_in_queue_without_running(fresh):
    client = grpcclient.InferenceServerClient(fresh.grpc_url)
    x = grpcclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.0]], np.float32))
    before = client.get_inference_statistics("slow_batcher", as_json=True, client_timeout=T)["model_stats"][0]
    with pytest.raises(InferenceServerException) as e:
        # slow_batcher waits up to 2 s for a batch of 4; the client gives up after 0.2 s
        client.infer("slow_batcher", [x], client_timeout=0.2)
    assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    # The failure is counted once the server gives the request up: polled for, not slept for.
    failed = int(before["inference_stats"].get("fail", {}).get("count", 0)) + 1
    deadline = time.monotonic() + T
    while int(_stats(fresh.grpc_url, "slow_batcher")["inference_stats"].get("fail", {}).get("count", 0)) < failed:
        assert time.monotonic() < deadline, "the expired request was never counted as failed"
        time.sleep(0.05)
    after = _stats(fresh.grpc_url, "slow_batcher")
    assert int(after["inference_stats"]["fail"]["count"]) == failed
    assert int(after.get("execution_count", 0)) == int(before.get("execution_count", 0))
    # The next request waits out the 2 s delay and runs alone: had the expired one stayed queued,
    # they would have run as a batch of 2.
    y = client.infer("slow_batcher", [x], client_timeout=T).as_numpy("Y")
    assert y.tolist() == [[2.0]]
    ran = _batches(_stats(fresh.grpc_url, "slow_batcher"))
    earlier = _batches(before)
    assert {size: n - earlier.get(size, 0) for size, n in ran.items() if n != earlier.get(size, 0)} == {1: 1}, ran


def test_a_timeout_parameter_without_a_policy_timeout_is_ignored_as_in_triton(fresh):
    # slow_batcher's queue policy has no timeout: a request's own `timeout` cannot give it one
    # (Triton 2.51 runs such a request after its batch delay too; it may only shorten a
    # policy's timeout, where allow_timeout_override says so: test_python_backend_batching.py).
    client = grpcclient.InferenceServerClient(fresh.grpc_url)
    x = grpcclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.0]], np.float32))
    result = client.infer("slow_batcher", [x], timeout=100_000, request_id="t1", client_timeout=T)
    assert result.get_response().id == "t1"
    assert result.as_numpy("Y").tolist() == [[2.0]]  # Y = X + 1: it ran


def test_prometheus_text_uses_triton_names(fresh):
    client = grpcclient.InferenceServerClient(fresh.grpc_url)
    a = np.ones((1, 16), np.float32)
    inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    for _ in range(2):
        client.infer("add_sub", inputs, client_timeout=T)
    with urllib.request.urlopen(f"http://{fresh.metrics_url}/metrics", timeout=T) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    labels = '{model="add_sub",version="1"}'
    assert samples[f"nv_inference_request_success{labels}"] >= 2
    assert samples[f"nv_inference_count{labels}"] >= 2
    assert samples[f"nv_inference_exec_count{labels}"] >= 1
    assert samples[f"nv_inference_pending_request_count{labels}"] == 0
    assert samples[f"nv_inference_request_duration_us{labels}"] > 0
    assert 'nv_inference_request_failure{model="add_sub",reason="REJECTED",version="1"}' in samples
    for name in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert f"nv_inference_{name}_duration_us{labels}" in samples
    # Latency summaries are off unless --metrics-config asks for them, as in Triton.
    assert "nv_inference_request_summary_us" not in text
