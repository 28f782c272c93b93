"""Triton's Python backend (see test_python_backend_basics.py): errors. A response's TritonError
keeps its code, an exception fails its request with Triton's message, so does a wrong number of
responses, and a stub that dies is started again for the next request; failures count as
Triton counts them; an `initialize` that raises fails the load with its message; `finalize` runs
when the model unloads."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import RPC_TIMEOUT


def faulty(client, value):
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([value], dtype=np.int32))
    return client.infer("py_faulty", [x])


def test_errors_keep_their_code_and_a_dead_stub_comes_back(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert faulty(client, 5).as_numpy("Y")[0] == 50
    with pytest.raises(InferenceServerException) as e:
        faulty(client, 1)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "one is refused" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        faulty(client, 2)
    assert e.value.status() == "StatusCode.INTERNAL"
    # Triton's text: the instance, the exception, then where the model raised it (python_backend
    # src/pb_stub.cc, Stub::ProcessRequests; "Number of InferenceResponse objects do not match ..."
    # is from the same stub; "Stub process '<instance>' is not healthy" from src/stub_launcher.cc,
    # StubLauncher's health check; "exit status: 3" is kiln's addition).
    assert e.value.message().startswith(
        "Failed to process the request(s) for model 'py_faulty_0', message: ValueError: two is a bad number\n\nAt:\n")
    assert "/py_faulty/1/model.py(20): execute" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        faulty(client, 4)
    assert ("Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
            "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0") in e.value.message()
    # As in Triton, an output keeps the type the model gave it.
    seven = faulty(client, 7)
    assert seven.get_output("Y").datatype == "FP64" and seven.as_numpy("Y")[0] == 7.0
    with pytest.raises(InferenceServerException) as e:
        faulty(client, 3)
    assert "Stub process 'py_faulty_0' is not healthy" in e.value.message()
    assert "exit status: 3" in e.value.message()
    # The next request starts the instance again, initialize and all.
    assert faulty(client, 6).as_numpy("Y")[0] == 60
    assert server.log_text().count("faulty model starting") == 2
    # Over REST a TritonError's code picks the status.
    reply = requests.post(f"http://{server.http_url}/v2/models/py_faulty/infer", timeout=RPC_TIMEOUT,
                          json={"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}]})
    assert reply.status_code == 400 and reply.json() == {"error": "one is refused"}
    server.assert_alive()


def test_failures_count_as_triton_counts_them(python_server):
    """Triton 2.51's counts (bench/triton_parity.sh --json, "counts after the probes"): a request
    refused before its model's scheduler has it counts nowhere; a model's error response is a
    response sent, a success; an exception in execute a BACKEND failure."""
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def counts():
        stats = client.get_inference_statistics("py_faulty", as_json=True)["model_stats"][0]["inference_stats"]
        text = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
        backend = re.search(r'^nv_inference_request_failure\{[^}]*model="py_faulty"[^}]*reason="BACKEND"[^}]*\} (\S+)$',
                            text, flags=re.M)
        return (int(stats["success"].get("count", 0)), int(stats["fail"].get("count", 0)),
                float(backend.group(1)) if backend else 0.0)

    before = counts()
    with pytest.raises(InferenceServerException):
        faulty(client, 1)
    assert counts() == (before[0] + 1, before[1], before[2]), "an error response is a success"
    with pytest.raises(InferenceServerException):
        faulty(client, 2)
    assert counts() == (before[0] + 1, before[1] + 1, before[2] + 1), "an exception is a BACKEND failure"
    wrong = grpcclient.InferInput("X", [1], "FP32")
    wrong.set_data_from_numpy(np.array([1], dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("py_faulty", [wrong])
    assert "data-type is 'FP32'" in e.value.message()
    with pytest.raises(InferenceServerException):
        client.infer("py_faulty", [wrong], outputs=[grpcclient.InferRequestedOutput("NOPE")])
    assert counts() == (before[0] + 1, before[1] + 1, before[2] + 1), "refusals count nowhere"


def test_an_initialize_that_raises_fails_the_load_with_its_message(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    entry = next(m for m in client.get_model_repository_index().models if m.name == "py_broken")
    assert entry.state == "UNAVAILABLE"
    # kiln's wording around the model's exception (the searched Triton sources hold no
    # "initialize of model instance"); the exception and traceback are the model's.
    assert "initialize of model instance 'py_broken_0' failed: RuntimeError: the weights are missing" in entry.reason
    assert "/py_broken/1/model.py(4): initialize" in entry.reason
    with pytest.raises(InferenceServerException) as e:
        client.load_model("py_broken")
    assert "the weights are missing" in e.value.message()


def test_finalize_runs_when_the_model_unloads(python_server):
    server, mark = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert not mark.exists()
    client.unload_model("py_echo")
    assert not client.is_model_ready("py_echo")
    # The version stops (finalize, then its processes end) once its last request is done.
    deadline = time.monotonic() + 10
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mark.read_text() == "finalized"
    client.load_model("py_echo")
    assert client.is_model_ready("py_echo")
