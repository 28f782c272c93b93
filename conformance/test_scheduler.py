"""Scheduling seen from Triton's clients: dynamic batching under concurrent tritonclient load,
streaming with many requests in flight, ModelStatistics, deadlines and the Prometheus text."""

from __future__ import annotations

import queue
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, FIXTURE_REPO, start_server, stop_server

T = 30  # client timeout, seconds


@pytest.fixture(scope="module")
def fresh():
    """A server of its own, so that statistics start from zero."""
    s = start_server([BUNDLED_REPO, FIXTURE_REPO], name="kiln-scheduler")
    yield s
    stop_server(s)


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
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((1 + i % 3, 64)).astype(np.float32) for i in range(48)]
    results: dict[int, np.ndarray] = {}
    errors: list[Exception] = []

    def worker(indices):
        client = grpcclient.InferenceServerClient(fresh.grpc_url)
        for i in indices:
            try:
                r = client.infer("mlp_classifier", [_mlp_input(inputs[i])], client_timeout=T)
                results[i] = r.as_numpy("OUTPUT0")
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    threads = [threading.Thread(target=worker, args=(range(k, 48, 8),)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, x in enumerate(inputs):
        np.testing.assert_allclose(results[i], _mlp_reference(2, x), rtol=1e-5, atol=1e-6)

    stats = grpcclient.InferenceServerClient(fresh.grpc_url).get_inference_statistics(
        "mlp_classifier", "2", as_json=True, client_timeout=T)["model_stats"][0]
    rows = sum(x.shape[0] for x in inputs)
    assert int(stats["inference_count"]) == rows
    assert int(stats["inference_stats"]["success"]["count"]) == 48
    executions = int(stats["execution_count"])
    assert executions <= 48
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    assert sum(size * count for size, count in sizes.items()) == rows
    assert sum(sizes.values()) == executions


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
    # Triton 2.51's answer (bench/triton_parity.sh --json).
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
    time.sleep(0.3)
    after = client.get_inference_statistics("slow_batcher", as_json=True, client_timeout=T)["model_stats"][0]
    assert int(after.get("execution_count", 0)) == int(before.get("execution_count", 0)), "it never ran"
    assert int(after["inference_stats"]["fail"].get("count", 0)) == \
        int(before["inference_stats"].get("fail", {}).get("count", 0)) + 1


def test_a_timeout_parameter_without_a_policy_timeout_is_ignored_as_in_triton(fresh):
    # slow_batcher's queue policy has no timeout: a request's own `timeout` cannot give it one
    # (Triton 2.51 runs such a request after its batch delay too; it may only shorten a
    # policy's timeout, where allow_timeout_override says so: test_python_backend.py).
    client = grpcclient.InferenceServerClient(fresh.grpc_url)
    x = grpcclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.0]], np.float32))
    result = client.infer("slow_batcher", [x], timeout=100_000, request_id="t1", client_timeout=T)
    assert result.as_numpy("Y").shape == (1, 1)


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
