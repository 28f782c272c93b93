"""The dynamic batcher does what the config says, as Triton's does, seen the way a user sees it:
response times of a lone request, how requests sent together are batched (the statistics'
batch counts), and queue policies that apply while a request waits. kiln's adaptive shortcuts
are an opt-in (`adaptive_batching_delay: "true"`, `--adaptive-batching`); checked here too.

Also Triton's ONNX Runtime backend rule for scalar (rank-0) tensors: any all-ones `dims` in a
config without batching."""

from __future__ import annotations

import shutil
import threading
import time
import urllib.request

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from conftest import FIXTURE_REPO, start_server, stop_server

T = 60  # client timeout, seconds


def plus_one_model(repo, name: str, batching: str, parameters: str = "") -> None:
    """Y = X + 1, X and Y FP32 [batch, 1], behind `dynamic_batching { <batching> }`."""
    node = helper.make_node("Add", ["X", "one"], ["Y"])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 1]) for n in ("X", "Y")]
    graph = helper.make_graph([node], name, io[:1], io[1:], [one])
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, repo / name / "1" / "model.onnx")
    (repo / name / "config.pbtxt").write_text(
        f'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"dynamic_batching {{ {batching} }}\n"
        'instance_group [ { count: 1 kind: KIND_CPU } ]\n' + parameters)


ADAPTIVE = 'parameters { key: "adaptive_batching_delay" value: { string_value: "true" } }\n'
NOT_ADAPTIVE = 'parameters { key: "adaptive_batching_delay" value: { string_value: "false" } }\n'


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("batcher") / "repo"
    # The configs: a lone request reaches no preferred size and waits out the delay.
    plus_one_model(repo, "preferred_2_6", "preferred_batch_size: [ 2, 6 ] "
                   "max_queue_delay_microseconds: 3000000")
    plus_one_model(repo, "together", "preferred_batch_size: [ 2, 6 ] "
                   "max_queue_delay_microseconds: 3000000")
    plus_one_model(repo, "queue_of_one", "preferred_batch_size: [ 8 ] "
                   "max_queue_delay_microseconds: 3000000 default_queue_policy { max_queue_size: 1 }")
    # kiln's shortcuts, opted into: a lone request goes after a tenth of the delay at most.
    plus_one_model(repo, "adaptive", "preferred_batch_size: [ 2, 6 ] "
                   "max_queue_delay_microseconds: 30000000", ADAPTIVE)
    plus_one_model(repo, "never_adaptive", "preferred_batch_size: [ 2, 6 ] "
                   "max_queue_delay_microseconds: 3000000", NOT_ADAPTIVE)
    plus_one_model(repo, "by_flag", "preferred_batch_size: [ 2, 6 ] "
                   "max_queue_delay_microseconds: 30000000")
    # A scalar ONNX tensor (rank 0) declared with all-ones dims, without batching.
    for name, dims in (("scalar_1", "[ 1 ]"), ("scalar_1_1", "[ 1, 1 ]"), ("scalar_1_1_1", "[ 1, 1, 1 ]")):
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(FIXTURE_REPO / "scalar" / "1" / "model.onnx", repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(
            'backend: "onnxruntime"\nmax_batch_size: 0\n'
            f'input [ {{ name: "X" data_type: TYPE_FP32 dims: {dims} }} ]\n'
            f'output [ {{ name: "Y" data_type: TYPE_FP32 dims: {dims} }} ]\n')
    return repo


@pytest.fixture(scope="module")
def server(repo):
    s = start_server([repo], name="kiln-triton-batcher")
    yield s
    stop_server(s)


def one_row(value: float):
    x = grpcclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[value]], np.float32))
    return [x]


def timed_infer(url: str, model: str, value: float) -> tuple[float, np.ndarray]:
    client = grpcclient.InferenceServerClient(url)
    start = time.monotonic()
    result = client.infer(model, one_row(value), client_timeout=T)
    return time.monotonic() - start, result.as_numpy("Y")


def batch_counts(url: str, model: str) -> dict[int, int]:
    stats = grpcclient.InferenceServerClient(url).get_inference_statistics(
        model, as_json=True, client_timeout=T)["model_stats"][0]
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}


def pending(metrics_url: str, model: str) -> float:
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=T).read().decode()
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_until_queued(metrics_url: str, model: str, sender: threading.Thread) -> None:
    """Until `model` has a request queued (the pending-request gauge), while `sender` waits."""
    deadline = time.monotonic() + T
    while pending(metrics_url, model) < 1:
        assert sender.is_alive(), f"{model} answered a request that should have queued"
        assert time.monotonic() < deadline, f"{model} never had a request queued"
        time.sleep(0.01)


def test_a_lone_request_waits_out_the_delay(server):
    # preferred_batch_size [2, 6], max_queue_delay 3 s: a batch of 1 reaches no preferred size,
    # so Triton holds it for the whole delay. (kiln before: answered in ~13 ms.)
    for value in (1.0, 2.0):
        took, y = timed_infer(server.grpc_url, "preferred_2_6", value)
        assert y.tolist() == [[value + 1]]
        assert took >= 3.0, f"answered after {took:.3f} s, before the 3 s delay"
    assert batch_counts(server.grpc_url, "preferred_2_6") == {1: 2}


def test_requests_sent_together_run_as_one_batch(server):
    # A lone request first: it waits out the delay (kiln's shortcuts, once a batch had gone
    # alone, ran the next lone request at once, so requests stopped meeting).
    took, y = timed_infer(server.grpc_url, "together", 0.0)
    assert y.tolist() == [[1.0]] and took >= 3.0, took
    # Two clients, one request of batch 1 each, at the same moment: one batch of 2 (a preferred
    # size, sent at once), not two batches of 1.
    barrier = threading.Barrier(2)
    answers: dict[float, list] = {}

    def client(value: float) -> None:
        c = grpcclient.InferenceServerClient(server.grpc_url)
        inputs = one_row(value)
        barrier.wait()
        answers[value] = c.infer("together", inputs, client_timeout=T).as_numpy("Y").tolist()

    threads = [threading.Thread(target=client, args=(v,)) for v in (10.0, 20.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == {10.0: [[11.0]], 20.0: [[21.0]]}
    assert batch_counts(server.grpc_url, "together") == {1: 1, 2: 1}


def test_a_full_queue_refuses_while_a_request_waits(server):
    # max_queue_size 1: while a request waits for a batch of 8 (3 s at most), another is
    # refused with Triton's UNAVAILABLE / 503 "Exceeds maximum queue size". Every lone request
    # waits, the first as the later ones (kiln's shortcuts ran later ones at once, so nothing
    # ever queued and the policy never applied).
    took, y = timed_infer(server.grpc_url, "queue_of_one", 0.0)
    assert y.tolist() == [[1.0]] and took >= 3.0, took
    first: dict = {}

    def waiting() -> None:
        c = grpcclient.InferenceServerClient(server.grpc_url)
        first["y"] = c.infer("queue_of_one", one_row(5.0), client_timeout=T).as_numpy("Y").tolist()

    thread = threading.Thread(target=waiting)
    thread.start()
    try:
        wait_until_queued(server.metrics_url, "queue_of_one", thread)
        with pytest.raises(InferenceServerException) as refused:
            grpcclient.InferenceServerClient(server.grpc_url).infer(
                "queue_of_one", one_row(6.0), client_timeout=T)
        # Triton prefixes an inference error with the request's id (none given here): core
        # src/infer_request.cc, InferenceRequest::LogRequest; the text: core src/scheduler_utils.cc,
        # the queue's Enqueue ("Exceeds maximum queue size", UNAVAILABLE).
        assert (refused.value.status(), refused.value.message()) == (
            "StatusCode.UNAVAILABLE", "[request id: <id_unknown>] Exceeds maximum queue size")
        x = httpclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[7.0]], np.float32))
        with pytest.raises(InferenceServerException) as refused:
            httpclient.InferenceServerClient(server.http_url).infer("queue_of_one", [x])
        assert refused.value.status() == "503"
        assert refused.value.message() == "[request id: <id_unknown>] Exceeds maximum queue size"
    finally:
        thread.join()
    assert first["y"] == [[6.0]]
    assert batch_counts(server.grpc_url, "queue_of_one") == {1: 2}


def test_adaptive_batching_is_an_opt_in_per_model(server):
    # With the parameter, a lone request goes once nobody has joined it for a tenth of the delay
    # (3 s of 30), and later lone requests at once: far inside the delay.
    for value in (1.0, 2.0, 3.0):
        took, y = timed_infer(server.grpc_url, "adaptive", value)
        assert y.tolist() == [[value + 1]]
        assert took < 15.0, f"the adaptive batcher waited {took:.3f} s of a 30 s delay"
    assert batch_counts(server.grpc_url, "adaptive") == {1: 3}


def test_the_server_flag_turns_adaptive_batching_on_where_configs_do_not_say(repo):
    s = start_server([repo], name="kiln-adaptive-flag", extra_args=["--adaptive-batching"])
    try:
        took, y = timed_infer(s.grpc_url, "by_flag", 4.0)
        assert y.tolist() == [[5.0]]
        assert took < 15.0, f"--adaptive-batching: waited {took:.3f} s of a 30 s delay"
        # A config that says "false" keeps Triton's batcher under the flag.
        took, y = timed_infer(s.grpc_url, "never_adaptive", 4.0)
        assert y.tolist() == [[5.0]]
        assert took >= 3.0, f"adaptive_batching_delay false: answered after {took:.3f} s"
    finally:
        stop_server(s)


@pytest.mark.parametrize("model,dims", [("scalar_1", [1]), ("scalar_1_1", [1, 1]),
                                        ("scalar_1_1_1", [1, 1, 1])])
def test_scalar_tensors_take_any_all_ones_dims(server, model, dims):
    # The model's X and Y are rank 0 (Y = 2X); Triton's ONNX Runtime backend loads it with any
    # all-ones dims and answers in the config's shape.
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_model_ready(model)
    x = grpcclient.InferInput("X", dims, "FP32")
    x.set_data_from_numpy(np.full(dims, 1.25, np.float32))
    y = client.infer(model, [x], client_timeout=T).as_numpy("Y")
    assert y.shape == tuple(dims) and y.dtype == np.float32
    assert y.flatten().tolist() == [2.5]
    # The config's dims are the contract: another shape is refused, as for any tensor.
    wrong = grpcclient.InferInput("X", [2], "FP32")
    wrong.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
    with pytest.raises(InferenceServerException) as refused:
        client.infer(model, [wrong], client_timeout=T)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_the_server_is_ready_with_scalar_models(server):
    assert grpcclient.InferenceServerClient(server.grpc_url).is_server_ready()
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=T) as reply:
        assert reply.status == 200
