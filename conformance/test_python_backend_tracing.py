"""Triton's Python backend (see test_python_backend_basics.py), traced (Triton's trace file: the
server runs with --trace-config triton,file=...): a Python model's request with its queue and
compute times and its tensors; a decoupled request with each of its responses, on a gRPC stream
and on REST generate_stream; a call given its request's trace, traced as its child."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from conftest import RPC_TIMEOUT
from python_backend_models import add_sub_inputs, counted


def test_a_traced_python_request_has_its_queue_and_compute_times(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.update_trace_settings(model_name="py_add_sub", settings={
        "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1", "trace_count": "1"})
    a, b = np.full((1, 16), 2, np.float32), np.ones((1, 16), np.float32)
    client.infer("py_add_sub", add_sub_inputs(grpcclient, a, b), request_id="traced")
    trace = server.repos[0].parent / "trace.json.0"
    deadline = time.monotonic() + 10
    records = None
    while records is None:
        try:
            # Once kiln has written the whole file (it creates it, then writes).
            records = json.loads(trace.read_text())
        except (OSError, ValueError):
            assert time.monotonic() < deadline, f"{trace} was not written"
            time.sleep(0.05)
    assert {"id": 1, "model_name": "py_add_sub", "model_version": 1, "request_id": "traced"} in records
    stamps = {t["name"]: t["ns"] for r in records for t in r.get("timestamps", [])}
    core = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
            "COMPUTE_END", "REQUEST_END"]
    assert all(name in stamps for name in core), stamps
    assert [stamps[name] for name in core] == sorted(stamps[name] for name in core), stamps
    outputs = [r["tensor"] for r in records if r.get("activity") == "TENSOR_BACKEND_OUTPUT"]
    assert [(t["name"], t["data"]) for t in outputs] == [("OUTPUT0", ",".join(["3"] * 16)),
                                                         ("OUTPUT1", ",".join(["1"] * 16))], outputs


def trace_of(server, model, request_id, timeout=10.0):
    """The records of the numbered trace file (the fixture's `trace.json.<n>`) that holds the trace
    of `model`'s request `request_id`, once written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in server.repos[0].parent.glob("trace.json.*"):
            try:
                records = json.loads(path.read_text())
            except json.JSONDecodeError:
                continue  # still being written: read it again on the next pass
            if any(r.get("model_name") == model and r.get("request_id") == request_id for r in records):
                return records
        time.sleep(0.05)
    pytest.fail(f"no trace of {model} was written")


def test_a_traced_decoupled_request_has_each_of_its_responses(python_server):
    """A decoupled model's request on a gRPC stream, traced: the stream's wait for it and its read,
    its queue and compute times, its input as queued, each response's outputs with an
    INFER_RESPONSE_COMPLETE (the final flag alone is a response too), a send start and end per
    message, and REQUEST_END once execute has returned and the last response has come."""
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.update_trace_settings(model_name="py_count", settings={
        "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1", "trace_count": "1"})
    assert counted(server, 2, True, 3) == [(0, False), (1, False), (None, True)]
    assert client.get_trace_settings(model_name="py_count", as_json=True)["settings"]["trace_count"]["value"] == ["0"]
    records = trace_of(server, "py_count", "count-2")
    assert {"id": records[0]["id"], "model_name": "py_count", "model_version": 1, "request_id": "count-2"} in records
    stamps = [(t["name"], t["ns"]) for r in records for t in r.get("timestamps", [])]
    names = [name for name, _ in stamps]
    once = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
            "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
    assert sorted(names) == sorted(once + ["INFER_RESPONSE_COMPLETE", "GRPC_SEND_START", "GRPC_SEND_END"] * 3), names
    at = {name: ns for name, ns in stamps if name in once}
    assert [at[name] for name in once] == sorted(at.values()), stamps
    responded = [ns for name, ns in stamps if name == "INFER_RESPONSE_COMPLETE"]
    sent = [ns for name, ns in stamps if name == "GRPC_SEND_END"]
    # The protocol takes each response after the request started (the last may come after
    # REQUEST_END: the engine is done with the request before its client is) and sends it after.
    assert at["REQUEST_START"] <= min(responded) and min(responded) <= min(sent), stamps
    assert max(responded) <= max(sent), stamps
    tensors = [(r["activity"], r["tensor"]["name"], r["tensor"]["data"]) for r in records if "activity" in r]
    assert tensors == [("TENSOR_QUEUE_INPUT", "N", "2"), ("TENSOR_BACKEND_OUTPUT", "I", "0"),
                       ("TENSOR_BACKEND_OUTPUT", "I", "1")], tensors


def test_a_traced_generate_stream_request_stamps_each_event_it_sends(python_server):
    """REST generate_stream to a decoupled model, traced: an INFER_RESPONSE_COMPLETE per response
    (the final flag alone too) and a send start and end per event (the flag alone is none), as
    Triton stamps them."""
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.update_trace_settings(model_name="py_count", settings={
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "1"})
    events = requests.post(f"http://{server.http_url}/v2/models/py_count/generate_stream",
                           json={"N": 2, "id": "sse"}, timeout=RPC_TIMEOUT).text
    assert events.count("data: ") == 2, events
    records = trace_of(server, "py_count", "sse")
    names = [t["name"] for r in records for t in r.get("timestamps", [])]
    assert sorted(names) == sorted(["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
                                    "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
                                   + ["INFER_RESPONSE_COMPLETE"] * 3 + ["HTTP_SEND_START", "HTTP_SEND_END"] * 2), names


def test_a_call_given_its_requests_trace_is_traced_as_its_child(python_server):
    """py_timeouts calls itself with `trace=request.trace()` (Triton's BLS tracing): the call is
    a child of the request's trace (its own id, `parent_id` the request's, no request id), with
    its own queue and compute times, written with its parent."""
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.update_trace_settings(model_name="py_timeouts", settings={
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "1"})
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.zeros([1], dtype=np.int32))
    client.infer("py_timeouts", [x], request_id="caller")
    records = trace_of(server, "py_timeouts", "caller")
    described = [r for r in records if "model_name" in r]
    assert len(described) == 2, described
    caller = next(r for r in described if r.get("request_id") == "caller")
    called = next(r for r in described if r is not caller)
    assert called == {"id": called["id"], "model_name": "py_timeouts", "model_version": 1, "parent_id": caller["id"]}
    stamps = {r["id"]: {} for r in described}
    for record in records:
        for stamp in record.get("timestamps", []):
            stamps[record["id"]][stamp["name"]] = stamp["ns"]
    inner, outer = stamps[called["id"]], stamps[caller["id"]]
    core = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"]
    assert list(inner) == ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
                           "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"], inner
    assert all(name in outer for name in core), outer
    # Called while the caller's execute ran.
    assert outer["COMPUTE_START"] <= inner["REQUEST_START"] <= inner["REQUEST_END"] <= outer["COMPUTE_END"]
