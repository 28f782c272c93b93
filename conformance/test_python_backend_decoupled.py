"""Triton's Python backend (see test_python_backend_basics.py): decoupled models and clients that
go away. A decoupled model streams its responses (with or without the empty final one, an error
response among them), with its statistics, and unary inference is refused as Triton refuses it;
a decoupled instance takes new requests while it answers earlier ones; a model hears that its
request's client went away (a deadline passed, a stream closed after some responses or before
the first), and those requests count as canceled."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import RPC_TIMEOUT
from python_backend_models import counted, wait_for_note


def test_a_model_hears_that_its_requests_client_went_away(python_server):
    server, _ = python_server
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    # A call whose deadline passes: the model, still in execute, sees is_cancelled() (at once:
    # well before the 20 s it would otherwise go on for).
    client = grpcclient.InferenceServerClient(server.grpc_url)
    # grpcio reports the client's own timeout as DEADLINE_EXCEEDED, or, when the timer wins the
    # race against the call, as CANCELLED "Timeout expired".
    with pytest.raises(InferenceServerException, match="(?i)deadline|timeout expired"):
        client.infer("py_patient", [x], request_id="unary-1", client_timeout=0.3)
    note = wait_for_note(server, "unary-1")
    assert re.fullmatch(r"cancelled after \d+ ticks", note) and int(note.split()[2]) < 150, note
    # A stream the client closes after three responses: the decoupled model stops sending.
    body = {"X": 1, "id": "stream-1"}
    events = []
    with requests.post(f"http://{server.http_url}/v2/models/py_ticker/generate_stream", json=body,
                       stream=True, timeout=RPC_TIMEOUT) as answer:
        for line in answer.iter_lines():
            if line.startswith(b"data: "):
                events.append(json.loads(line[len(b"data: "):]))
                if len(events) == 3:
                    break
    assert [e["TICKS"] for e in events] == [0, 1, 2]
    note = wait_for_note(server, "stream-1")
    assert re.fullmatch(r"cancelled after \d+ ticks", note) and int(note.split()[2]) < 150, note
    # A stream whose model has sent nothing yet: its client's leaving is noticed all the same.
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(f"http://{server.http_url}/v2/models/py_ticker/generate_stream",
                      json={"X": 1, "id": "quiet-1", "quiet": True}, timeout=(RPC_TIMEOUT, 0.5))
    note = wait_for_note(server, "quiet-1")
    assert re.fullmatch(r"cancelled after \d+ ticks", note) and int(note.split()[2]) < 150, note
    # Both streams count as canceled requests.
    text = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
    canceled = re.search(r'^nv_inference_request_failure\{[^}]*model="py_ticker"[^}]*reason="CANCELED"[^}]*\} (\S+)$',
                         text, flags=re.M) or re.search(
        r'^nv_inference_request_failure\{[^}]*reason="CANCELED"[^}]*model="py_ticker"[^}]*\} (\S+)$', text, flags=re.M)
    assert canceled and float(canceled.group(1)) >= 2, text
    server.assert_alive()


def test_a_decoupled_instance_takes_new_requests_while_it_answers_earlier_ones(python_server):
    # py_ticker has one instance, and a request it works on ticks until its client goes away:
    # a second request is taken (and answered) while the first still runs, as in Triton.
    server, _ = python_server
    url = f"http://{server.http_url}/v2/models/py_ticker/generate_stream"

    def ticks(lines, n):
        got = []
        for line in lines:
            if line.startswith(b"data: "):
                got.append(json.loads(line[len(b"data: "):])["TICKS"])
                if len(got) == n:
                    break
        return got

    with requests.post(url, json={"X": 1, "id": "first"}, stream=True, timeout=RPC_TIMEOUT) as first:
        first_lines = first.iter_lines()
        assert ticks(first_lines, 2) == [0, 1]
        started = time.monotonic()
        with requests.post(url, json={"X": 1, "id": "second"}, stream=True, timeout=RPC_TIMEOUT) as second:
            assert ticks(second.iter_lines(), 3) == [0, 1, 2]
        assert time.monotonic() - started < 5, "the second request waited for the first"
        # The first request streamed on meanwhile.
        later = ticks(first_lines, 1)
        assert later and later[0] >= 2, later
    for request_id in ("first", "second"):
        assert wait_for_note(server, request_id).startswith("cancelled after")


def test_a_decoupled_model_streams_its_responses(python_server):
    server, _ = python_server
    # Without empty final responses, the flag the model sends alone reaches nobody.
    assert counted(server, 3, False, 3) == [(0, False), (1, False), (2, False)]
    assert counted(server, 3, True, 4) == [(0, False), (1, False), (2, False), (None, True)]
    assert counted(server, 0, True, 1) == [(None, True)]
    error, final = counted(server, -1, True, 2)
    assert "cannot count to -1" in error[0] and final == (None, True)
    # A streamed request's statistics have its time queued and in `execute`, as its batch's do.
    stats = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics("py_count")
    inference = stats.model_stats[0].inference_stats
    assert inference.success.count >= 3
    assert inference.compute_infer.count == inference.queue.count == inference.success.count
    assert inference.compute_infer.ns > 0 and inference.queue.ns > 0
    # Unary inference is refused, as Triton refuses it.
    with pytest.raises(InferenceServerException) as e:
        x = grpcclient.InferInput("N", [1], "INT32")
        x.set_data_from_numpy(np.array([2], dtype=np.int32))
        grpcclient.InferenceServerClient(server.grpc_url).infer("py_count", [x])
    # Triton: server src/grpc/infer_handler.cc, ModelInferHandler ("ModelInfer RPC doesn't support
    # models with decoupled transaction policy", UNSUPPORTED) and src/http_server.cc, HandleInfer
    # ("HTTP end point doesn't support ...", 501).
    assert "doesn't support models with decoupled transaction policy" in e.value.message()
    reply = requests.post(f"http://{server.http_url}/v2/models/py_count/infer", timeout=RPC_TIMEOUT,
                          json={"inputs": [{"name": "N", "datatype": "INT32", "shape": [1], "data": [2]}]})
    assert reply.status_code == 501
    assert reply.json() == {"error": "HTTP end point doesn't support models with decoupled transaction policy"}
