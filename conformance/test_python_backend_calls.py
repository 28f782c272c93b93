"""Triton's Python backend (see test_python_backend_basics.py): models that call models (Triton's
BLS). `exec()` and `async_exec()` on ONNX and Python models, with Triton's errors for a missing
model and a wrong call; calls from a decoupled model's thread after `execute` returned (and a stub
that dies mid-request); a decoupled call's responses passed on as they come, read in part,
collected, or cancelled (ResponseIterator.cancel()); a request's timeout reaches the model and its
calls; a model loads, unloads and asks after other models (pb_utils.load_model, unload_model,
is_model_ready)."""

from __future__ import annotations

import queue
import re
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import RPC_TIMEOUT
from python_backend_models import wait_for_note


def test_a_python_model_calls_other_models(python_server):
    server, _ = python_server
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    tensor = grpcclient.InferInput("X", [1, 16], "FP32")
    tensor.set_data_from_numpy(x)
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("py_calls", [tensor])
    np.testing.assert_array_equal(result.as_numpy("DOUBLED"), 2 * x)
    np.testing.assert_array_equal(result.as_numpy("BACK"), x)
    missing, wrong = (e.decode() for e in result.as_numpy("ERRORS"))
    # Triton: core src/model_lifecycle.cc, ModelLifeCycle::GetModel (prefixed by
    # ModelRepositoryManager::GetModel) and core src/infer_request.cc, InferenceRequest::Normalize.
    assert missing == "Request for unknown model: 'no_such_model' is not found"
    assert "expected 2 inputs but got 1 inputs for model 'add_sub'" in wrong, wrong


def test_a_decoupled_models_thread_calls_other_models_after_execute_returned(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for value in (1.0, 2.5, -4.0):
            x = grpcclient.InferInput("X", [1, 16], "FP32")
            x.set_data_from_numpy(np.full((1, 16), value, dtype=np.float32))
            client.async_stream_infer("py_relay", [x], request_id=str(value))
        got = {}
        for _ in range(3):
            result, error = answers.get(timeout=RPC_TIMEOUT)
            assert error is None, error
            got[result.get_response().id] = result.as_numpy("SUM")
        for value in (1.0, 2.5, -4.0):
            np.testing.assert_array_equal(got[str(value)], np.full((1, 16), 2 * value, dtype=np.float32))
        # A stub that dies mid-request: the response it sent arrives, then the request's error;
        # the next request finds the instance started again.
        x = grpcclient.InferInput("X", [1, 16], "FP32")
        x.set_data_from_numpy(np.full((1, 16), -99, dtype=np.float32))
        client.async_stream_infer("py_relay", [x], request_id="dies")
        result, error = answers.get(timeout=RPC_TIMEOUT)
        assert error is None and result.get_response().id == "dies"
        result, error = answers.get(timeout=RPC_TIMEOUT)
        assert error is not None and "is not healthy" in str(error), error
        x.set_data_from_numpy(np.full((1, 16), 3, dtype=np.float32))
        client.async_stream_infer("py_relay", [x], request_id="after")
        result, error = answers.get(timeout=RPC_TIMEOUT)
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("SUM"), np.full((1, 16), 6, dtype=np.float32))
    finally:
        client.stop_stream()


def test_a_model_loads_unloads_and_asks_after_other_models(python_server):
    server, _ = python_server
    client = httpclient.InferenceServerClient(server.http_url)
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([0], dtype=np.int32))

    def manage(action, model):
        result = client.infer("py_manager", [x], parameters={"action": action, "model": model})
        return bool(result.as_numpy("READY")[0])

    assert manage("ready", "add_sub") is True
    assert manage("ready", "py_dynamic") is False
    # Loaded from the config and model.py the model hands over, and served.
    assert manage("load", "py_dynamic") is True
    y = httpclient.InferInput("X", [1, 2], "FP32")
    y.set_data_from_numpy(np.array([[1.5, -2]], dtype=np.float32))
    np.testing.assert_array_equal(client.infer("py_dynamic", [y]).as_numpy("Y"), [[-1.5, 2]])
    # The unload is not waited for (a model may unload itself): it happens soon after.
    manage("unload", "py_dynamic")
    deadline = time.monotonic() + 10
    while client.is_model_ready("py_dynamic") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not client.is_model_ready("py_dynamic")
    # What the repository refuses reaches the model as an exception, and its client as the error.
    with pytest.raises(InferenceServerException) as refused:
        manage("load", "bad name/../x")
    # The name's refusal "invalid model name '<n>'..." (kiln's text, the rule Triton's since server
    # PR #8400: see test_triton_validation.py), wrapped as python_backend raises a model-control
    # error in the model (pb_utils.TritonModelException).
    assert "TritonModelException: invalid model name 'bad name/../x'" in str(refused.value)


def test_a_requests_timeout_reaches_the_model_and_its_calls(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    # tritonclient's `timeout` is the request's timeout parameter, in microseconds.
    result = client.infer("py_timeouts", [x], timeout=5_000_000)
    assert (int(result.as_numpy("OWN")[0]), int(result.as_numpy("INNER")[0])) == (5_000_000, 10_000_000)
    result = client.infer("py_timeouts", [x])
    assert (int(result.as_numpy("OWN")[0]), int(result.as_numpy("INNER")[0])) == (0, 60_000_000)


def test_a_model_cancels_a_decoupled_call_it_iterates(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    # A model that is not decoupled: the called model hears at once that its client left, and
    # the caller's iteration ends soon after (not when the 20 s of ticks would).
    seen = int(client.infer("py_canceller", [x], request_id="bls-cancel-1").as_numpy("SEEN")[0])
    assert 3 <= seen < 100, seen
    note = wait_for_note(server, "bls-cancel-1")
    assert re.fullmatch(r"cancelled after \d+ ticks", note) and int(note.split()[2]) < 150, note
    # A decoupled one (its stub's answers are read by a thread of kiln's), over a stream.
    got = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer("py_stream_canceller", [x], request_id="bls-cancel-2")
        result, error = got.get(timeout=RPC_TIMEOUT)
        assert error is None, error
        assert 3 <= int(result.as_numpy("SEEN")[0]) < 100
    finally:
        client.stop_stream()
    note = wait_for_note(server, "bls-cancel-2")
    assert re.fullmatch(r"cancelled after \d+ ticks", note) and int(note.split()[2]) < 150, note


def test_a_decoupled_calls_responses_reach_the_caller_as_they_come(python_server):
    server, _ = python_server
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((time.monotonic(), result, error)))
    try:
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([4], dtype=np.int32))
        client.async_stream_infer("py_forward", [n])
        arrivals = []
        for _ in range(4):
            at, result, error = got.get(timeout=RPC_TIMEOUT)
            assert error is None, error
            arrivals.append((at, int(result.as_numpy("I")[0])))
    finally:
        client.stop_stream()
    assert [value for _, value in arrivals] == [0, 1, 2, 3]
    # py_slow_count sends them 0.3 s apart: passed on as they come, they arrive spread out
    # (collected before exec returned, they would arrive together).
    assert arrivals[-1][0] - arrivals[0][0] > 0.6, arrivals
    # A model that reads part of a call's responses and goes on calling.
    for _ in range(2):
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([4], dtype=np.int32))
        result = client.infer("py_partial", [n])
        assert result.as_numpy("FIRST").tolist() == [0, 1]
        assert result.as_numpy("SUM").tolist() == [2.0] * 16


def test_a_python_model_collects_decoupled_models_responses(python_server):
    server, _ = python_server
    n = grpcclient.InferInput("N", [1], "INT32")
    n.set_data_from_numpy(np.array([4], dtype=np.int32))
    prompt = grpcclient.InferInput("PROMPT", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"The potter"], dtype=np.object_))
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("py_streams", [n, prompt])
    assert result.as_numpy("COUNTED").tolist() == [0, 1, 2, 3]
    assert result.as_numpy("EMPTY_LAST").tolist() == [True]
    # The pieces, joined, are what the generate extension answers for the same greedy request.
    body = {"text_input": "The potter", "max_tokens": 6, "temperature": 0, "exclude_input_in_output": True}
    reply = requests.post(f"http://{server.http_url}/v2/models/tiny_decoder/generate", json=body, timeout=RPC_TIMEOUT)
    pieces = [p.decode() for p in result.as_numpy("PIECES")]
    assert len(pieces) == 6 and "".join(pieces) == reply.json()["text_output"], (pieces, reply.text)
    assert result.as_numpy("MISSING")[0].decode() == "Request for unknown model: 'nowhere' is not found"
