"""ModelStreamInfer through tritonclient (ModelStreamInferResponse framing, in-stream
errors) and the process lifecycle (SIGTERM shuts down cleanly)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import BUNDLED_REPO, FIXTURE_REPO, start_server, stop_server


def _inputs(a, b):
    i0 = grpcclient.InferInput("INPUT0", list(a.shape), "FP32")
    i0.set_data_from_numpy(a)
    i1 = grpcclient.InferInput("INPUT1", list(b.shape), "FP32")
    i1.set_data_from_numpy(b)
    return [i0, i1]


def test_stream_infer_responses_and_inline_error(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)), stream_timeout=60)
    try:
        rng = np.random.default_rng(4)
        sent = {}
        for i in range(3):
            a = rng.standard_normal((1, 16)).astype(np.float32)
            b = rng.standard_normal((1, 16)).astype(np.float32)
            sent[f"s{i}"] = (a, b)
            client.async_stream_infer("add_sub", _inputs(a, b), request_id=f"s{i}")
        # a bad request on the same stream: reported in error_message, the stream stays open
        client.async_stream_infer("no_such_model", _inputs(*sent["s0"]), request_id="bad")
        a = np.ones((2, 16), np.float32)
        sent["after"] = (a, a)
        client.async_stream_infer("add_sub", _inputs(a, a), request_id="after")

        results, errors = {}, []
        for _ in range(5):
            result, error = got.get(timeout=30)
            if error is not None:
                errors.append(error)
            else:
                results[result.get_response().id] = result
    finally:
        client.stop_stream()
        client.close()

    assert sorted(results) == ["after", "s0", "s1", "s2"]
    for rid, (a, b) in sent.items():
        np.testing.assert_array_equal(results[rid].as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(results[rid].as_numpy("OUTPUT1"), a - b)
        assert results[rid].get_response().model_version == "1"
    assert len(errors) == 1
    # Triton: core src/model_lifecycle.cc, ModelLifeCycle::GetModel, prefixed by
    # ModelRepositoryManager::GetModel (see test_grpc_errors.py).
    assert "Request for unknown model: 'no_such_model' is not found" in errors[0].message()
    # As Triton 2.51 writes them: a response flagged final, a refusal carrying the id alone.
    assert results["s0"].get_response().parameters["triton_final_response"].bool_param is True


def test_stream_answers_are_shaped_as_tritons(server):
    """A refused request's answer carries its id alone; a response, the final flag (compared with
    Triton 2.51 by bench/triton_parity.sh --json)."""
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    stub = service_pb2_grpc.GRPCInferenceServiceStub(server.channel())
    good = service_pb2.ModelInferRequest(model_name="add_sub", id="good")
    for name in ("INPUT0", "INPUT1"):
        good.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        good.raw_input_contents.append(np.ones(16, np.float32).tobytes())
    wrong = service_pb2.ModelInferRequest()
    wrong.CopyFrom(good)
    wrong.id, wrong.inputs[0].datatype = "wrong", "FP64"
    answers = list(stub.ModelStreamInfer(iter([good, wrong]), timeout=30))
    by_id = {a.infer_response.id: a for a in answers}
    assert by_id["good"].infer_response.parameters["triton_final_response"].bool_param is True
    refused = by_id["wrong"]
    assert refused.error_message == ("[request id: wrong] inference input 'INPUT0' data-type is 'FP64', but model "
                                     "'add_sub' expects 'FP32'")
    assert refused.infer_response == service_pb2.ModelInferResponse(id="wrong")


def test_sigterm_exits_cleanly():
    srv = start_server([BUNDLED_REPO, FIXTURE_REPO], name="kiln-sigterm")
    try:
        srv.assert_alive()
        os.kill(srv.proc.pid, signal.SIGTERM)
        try:
            rc = srv.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("kiln did not exit within 20 s of SIGTERM")
        assert rc == 0, f"exit code {rc} after SIGTERM\n{srv.log_tail()}"
    finally:
        stop_server(srv)
