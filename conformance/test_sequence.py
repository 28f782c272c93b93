"""Stateful models (Triton's sequence batcher with implicit state) through tritonclient: the
fixture `accumulate` keeps a running sum per sequence. Requests carry `sequence_id`,
`sequence_start` and `sequence_end` as tritonclient sends them, over gRPC (unary and streaming)
and HTTP; the server fills the START and CORRID control inputs and the state.
"""

from __future__ import annotations

import queue
import threading
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import RPC_TIMEOUT

T = RPC_TIMEOUT
MODEL = "accumulate"


def value(module, x):
    tensor = module.InferInput("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[x]], dtype=np.float32))
    return [tensor]


def step(client, module, sequence, x, start=False, end=False):
    result = client.infer(MODEL, value(module, x), sequence_id=sequence, sequence_start=start,
                          sequence_end=end)
    return (float(result.as_numpy("OUTPUT")[0][0]), int(result.as_numpy("START_SEEN")[0][0]),
            int(result.as_numpy("CORRID_SEEN")[0][0]))


def test_running_sums_per_sequence_over_both_protocols(server):
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    http_client = httpclient.InferenceServerClient(server.http_url, network_timeout=T)
    assert step(grpc_client, grpcclient, 1011, 2, start=True) == (2.0, 1, 1011)
    assert step(http_client, httpclient, 1012, 10, start=True) == (10.0, 1, 1012)
    assert step(http_client, httpclient, 1011, 3) == (5.0, 0, 1011)
    assert step(grpc_client, grpcclient, 1012, 1) == (11.0, 0, 1012)
    assert step(grpc_client, grpcclient, 1011, 1, end=True) == (6.0, 0, 1011)
    # Ended: the next request must start it again, from zero.
    with pytest.raises(InferenceServerException) as e:
        step(grpc_client, grpcclient, 1011, 1)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "must specify the START flag on the first request of the sequence" in e.value.message()
    assert step(grpc_client, grpcclient, 1011, 4, start=True) == (4.0, 1, 1011)
    step(grpc_client, grpcclient, 1011, 0, end=True)
    step(grpc_client, grpcclient, 1012, 0, end=True)


def test_concurrent_sequences_keep_their_own_state(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    totals = {}

    def run(sequence):
        own = grpcclient.InferenceServerClient(server.grpc_url)
        last = None
        for i in range(1, 21):
            last = step(own, grpcclient, sequence, i, start=(i == 1), end=(i == 20))[0]
        totals[sequence] = last

    threads = [threading.Thread(target=run, args=(2000 + n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert totals == {2000 + n: 210.0 for n in range(4)}
    client.close()


def test_a_stream_carries_a_sequence(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), answers))
    for i, x in enumerate([1.0, 2.0, 3.0]):
        client.async_stream_infer(MODEL, value(grpcclient, x), sequence_id=3003,
                                  sequence_start=(i == 0), sequence_end=(i == 2))
    sums = []
    for _ in range(3):
        result, error = answers.get(timeout=T)
        assert error is None, error
        sums.append(float(result.as_numpy("OUTPUT")[0][0]))
    client.stop_stream()
    assert sums == [1.0, 3.0, 6.0]


# "must specify a non-zero or non-empty correlation ID": Triton's, core src/sequence_batch_scheduler/
# (SequenceBatchScheduler::Enqueue and the Sequencer of sequence_utils.h: "inference request to
# model '<m>' must specify ..."). "has a string correlation ID ..." is kiln's
# text (crates/repository/src/repository/sequence.rs); the searched Triton sources hold none for this case.
@pytest.mark.parametrize("kwargs,message", [
    ({}, "must specify a non-zero or non-empty correlation ID"),
    ({"sequence_id": "text-id", "sequence_start": True}, "string correlation ID 'text-id'"),
])
def test_requests_without_a_usable_sequence_are_refused(server, kwargs, message):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        client.infer(MODEL, value(grpcclient, 1.0), **kwargs)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and message in e.value.message()


def test_control_and_state_inputs_are_the_servers(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    metadata = client.get_model_metadata(MODEL, as_json=True)
    assert [t["name"] for t in metadata["inputs"]] == ["INPUT"]
    start = grpcclient.InferInput("START", [1, 1], "INT32")
    start.set_data_from_numpy(np.ones((1, 1), np.int32))
    with pytest.raises(InferenceServerException) as e:
        client.infer(MODEL, value(grpcclient, 1.0) + [start], sequence_id=5, sequence_start=True)
    # Triton: core src/infer_request.cc, InferenceRequest::Normalize (input count).
    assert "expected 1 inputs but got 2 inputs for model 'accumulate'" in e.value.message()
    assert "sequence" in client.get_server_metadata(as_json=True)["extensions"]
