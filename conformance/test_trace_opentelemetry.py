"""Triton's `opentelemetry` trace mode: kiln sends OTLP/HTTP protobuf to a collector (here a
small HTTP server in the test, decoding with OpenTelemetry's own protobuf classes), with Triton's
span layout: `InferRequest` > model span > `compute`, an ensemble's steps under the ensemble's
span, resource attributes from the flags, and the caller's W3C `traceparent` joined (and always
traced, even at rate 0)."""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from conftest import BUNDLED_REPO, FIXTURE_REPO, RPC_TIMEOUT, find_free_port, start_server, stop_server

T = RPC_TIMEOUT
TRACEPARENT = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"


class Collector:
    """Receives OTLP/HTTP trace exports and keeps their spans and resources."""

    def __init__(self):
        self.spans: list = []
        self.resources: list = []
        self.lock = threading.Lock()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                with collector.lock:
                    for resource_spans in request.resource_spans:
                        collector.resources.append(resource_spans.resource)
                        for scope_spans in resource_spans.scope_spans:
                            collector.spans.extend(scope_spans.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.port = find_free_port()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, count: int, timeout: float = 15.0) -> list:
        """Waits for `count` spans (the exporter sends every 100 ms here) and takes them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.spans) >= count:
                    spans, self.spans = self.spans, []
                    return spans
            time.sleep(0.05)
        with self.lock:
            pytest.fail(f"expected {count} spans, got {[s.name for s in self.spans]}")

    def close(self):
        self.server.shutdown()


# Answers with the OpenTelemetry context Triton gives a Python model: `request.trace().get_context()`.
PY_CONTEXT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "CONTEXT", np.array([request.trace().get_context() or ""], dtype=np.object_))]) for request in requests]
"""

PY_CONTEXT_CONFIG = """
name: "py_context"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "CONTEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    collector = Collector()
    python = tmp_path_factory.mktemp("otel") / "repo"
    (python / "py_context" / "1").mkdir(parents=True)
    (python / "py_context" / "config.pbtxt").write_text(PY_CONTEXT_CONFIG)
    (python / "py_context" / "1" / "model.py").write_text(PY_CONTEXT)
    server = start_server([BUNDLED_REPO, FIXTURE_REPO, python], name="kiln-otel", env={"KILN_PYTHON": sys.executable},
                          extra_args=[
        "--trace-config", "mode=opentelemetry",
        "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "rate=0",
        "--trace-config", f"opentelemetry,url=127.0.0.1:{collector.port}/v1/traces",
        "--trace-config", "opentelemetry,resource=test.key=test.value",
        "--trace-config", "opentelemetry,bsp_schedule_delay=100",
    ])
    yield server, collector
    stop_server(server)
    collector.close()


def add_sub_inputs(module, names=("INPUT0", "INPUT1")):
    inputs = [module.InferInput(n, [1, 16], "FP32") for n in names]
    for i in inputs:
        i.set_data_from_numpy(np.ones((1, 16), np.float32))
    return inputs


def events(span) -> list[str]:
    return [e.name for e in span.events]


def attributes(span) -> dict:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


def test_a_caller_context_is_traced_at_rate_zero_and_joined(traced):
    server, collector = traced
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.infer("add_sub", add_sub_inputs(grpcclient), headers={"traceparent": TRACEPARENT},
                 client_timeout=T)
    spans = collector.take(3)
    assert sorted(s.name for s in spans) == ["InferRequest", "add_sub", "compute"]
    by_name = {s.name: s for s in spans}
    root, model, compute = by_name["InferRequest"], by_name["add_sub"], by_name["compute"]
    assert root.trace_id.hex() == "0af7651916cd43dd8448eb211c12666c"
    assert root.parent_span_id.hex() == "b7ad6b7169242424"
    assert events(root) == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
                            "GRPC_SEND_END"]
    assert model.parent_span_id == root.span_id and compute.parent_span_id == model.span_id
    assert events(model) == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert events(compute) == ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    # Triton 2.51's attributes, and its span kind (SERVER) for every span.
    assert attributes(model) == {"triton.model_name": "add_sub", "triton.model_version": 1,
                                 "triton.trace_id": attributes(model)["triton.trace_id"], "triton.trace_parent_id": 0}
    assert {s.kind for s in spans} == {root.SPAN_KIND_SERVER}
    # Wall-clock nanoseconds, in order, within the root span.
    assert abs(root.start_time_unix_nano / 1e9 - time.time()) < 60
    assert root.start_time_unix_nano <= model.start_time_unix_nano <= compute.start_time_unix_nano
    assert compute.end_time_unix_nano <= model.end_time_unix_nano <= root.end_time_unix_nano
    resource = {a.key: a.value.string_value for a in collector.resources[-1].attributes}
    assert resource["service.name"] == "kiln" and resource["test.key"] == "test.value"


def test_sampled_requests_and_ensembles_follow_tritons_layout(traced):
    server, collector = traced
    client = httpclient.InferenceServerClient(server.http_url)
    # Rate 0: a request without a trace context is not traced...
    client.infer("add_sub", add_sub_inputs(httpclient))
    time.sleep(0.5)
    assert collector.take(0) == []
    # ... until the rate says so.
    settings = client.update_trace_settings(settings={"trace_rate": "1"})
    assert settings["trace_mode"] == "opentelemetry" and settings["trace_rate"] == "1"
    try:
        client.infer("ensemble_add_sub", add_sub_inputs(httpclient, ("A", "B")))
        spans = collector.take(6)
    finally:
        client.update_trace_settings(settings={"trace_rate": "0"})
    by_id = {s.span_id: s for s in spans}
    root = next(s for s in spans if s.name == "InferRequest")
    assert root.parent_span_id == b""
    assert events(root) == ["HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START",
                            "HTTP_SEND_END"]
    children = {}
    for span in spans:
        if span.parent_span_id in by_id:
            children.setdefault(by_id[span.parent_span_id].name, []).append(span.name)
    assert children == {
        "InferRequest": ["ensemble_add_sub"],
        "ensemble_add_sub": ["add_sub", "add_sub"],
        "add_sub": ["compute", "compute"],
    }
    steps = [s for s in spans if s.name == "add_sub"]
    ensemble = next(s for s in spans if s.name == "ensemble_add_sub")
    assert all(attributes(s)["triton.trace_parent_id"] == attributes(ensemble)["triton.trace_id"] for s in steps)
    assert len({s.trace_id for s in spans}) == 1


def test_a_python_model_is_given_its_spans_context(traced):
    """`request.trace().get_context()` in a traced request is, as in Triton, the W3C context of
    the model's span as JSON; a request not traced has none."""
    server, collector = traced
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.zeros([1], np.int32))
    answer = client.infer("py_context", [x], headers={"traceparent": TRACEPARENT}, client_timeout=T)
    context = json.loads(answer.as_numpy("CONTEXT")[0])
    spans = {s.name: s for s in collector.take(3)}
    assert context == {"traceparent": f"00-{TRACEPARENT.split('-')[1]}-{spans['py_context'].span_id.hex()}-01"}
    # Rate 0 and no context sent: not traced, no context.
    assert client.infer("py_context", [x], client_timeout=T).as_numpy("CONTEXT")[0] == b""
