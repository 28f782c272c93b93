"""Triton's Python backend (see test_python_backend_basics.py): custom metrics
(pb_utils.MetricFamily: counters, gauges, histograms) reach kiln's /metrics in Prometheus' format,
a series goes with its Metric object and with its model, and starts again from 0 when the model
loads again."""

from __future__ import annotations

import time

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
import requests
import tritonclient.grpc as grpcclient

from conftest import RPC_TIMEOUT


def test_custom_metrics_reach_the_metrics_endpoint(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for value, count in ((2.5, 1), (-7.0, 2), (4.0, 3)):
        x = grpcclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([value], dtype=np.float32))
        # The count so far, and the refusal of a negative increment.
        assert client.infer("py_metrics", [x]).as_numpy("Y").tolist() == [count, 1]
    text = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
    assert "# HELP py_test_requests_total Requests the model saw\n# TYPE py_test_requests_total counter\n" in text
    assert 'py_test_requests_total{kind="test",model="py_metrics"} 3\n' in text, text
    assert "# TYPE py_test_last_value gauge\n" in text
    assert 'py_test_last_value{model="py_metrics"} 4\n' in text, text
    # The whole text still parses as Prometheus' exposition format.
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["py_test_requests"].type == "counter"
    assert families["py_test_last_value"].samples[0].value == 4.0
    # Observations 2.5, 7 and 4: cumulative buckets, sum and count.
    sizes = families["py_test:value_size"]
    assert sizes.type == "histogram"
    got = {(s.name, s.labels.get("le")): s.value for s in sizes.samples}
    assert got == {("py_test:value_size_bucket", "1"): 0, ("py_test:value_size_bucket", "5"): 2,
                   ("py_test:value_size_bucket", "10"): 3, ("py_test:value_size_bucket", "+Inf"): 3,
                   ("py_test:value_size_sum", None): 13.5, ("py_test:value_size_count", None): 3}, got


def custom_series(server) -> str:
    text = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
    return "\n".join(line for line in text.splitlines() if line.startswith("py_test"))


def test_custom_series_go_with_their_metric_objects_and_their_model(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def infer(value):
        x = grpcclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([value], dtype=np.float32))
        client.infer("py_metrics", [x])

    temporary = 'py_test_requests_total{kind="temporary",model="py_metrics"} 1'
    infer(0)
    assert temporary in custom_series(server)
    infer(1)  # the model deletes its Metric object: the series goes, as in Triton
    series = custom_series(server)
    assert temporary.rsplit(" ")[0] not in series and 'kind="test"' in series, series

    # Unloaded, the model's process ends and its series leave /metrics; loaded again, its
    # `initialize` makes them anew, from 0.
    client.unload_model("py_metrics")
    deadline = time.monotonic() + 30
    while custom_series(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert custom_series(server) == ""
    client.load_model("py_metrics")
    series = custom_series(server)
    assert 'py_test_requests_total{kind="test",model="py_metrics"} 0' in series, series
    assert 'py_test:value_size_count{model="py_metrics"} 0' in series, series
    infer(5.0)
    assert 'py_test_requests_total{kind="test",model="py_metrics"} 1' in custom_series(server)
