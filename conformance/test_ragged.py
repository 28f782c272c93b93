"""Triton's ragged batching through tritonclient: requests whose ragged input has different
lengths share one execution, the model gets their elements as one 1-D tensor plus the batch inputs
(accumulated counts with zero, INT32; element counts, FP32), and each request gets its own SUM and
LENGTH and its DOUBLED scattered back in its own shape. Model: tests/fixtures/.../ragged_sum
(a batch of 3 goes as soon as 3 requests wait)."""

from __future__ import annotations

import shutil
import threading

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import FIXTURE_REPO, RPC_TIMEOUT, start_server, stop_server

T = RPC_TIMEOUT
MODEL = "ragged_sum"


def infer(url: str, values: np.ndarray):
    client = grpcclient.InferenceServerClient(url)
    data = values.reshape(1, -1).astype(np.float32)
    x = grpcclient.InferInput("INPUT", list(data.shape), "FP32")
    x.set_data_from_numpy(data)
    result = client.infer(MODEL, [x], client_timeout=T)
    return {name: result.as_numpy(name) for name in ("SUM", "LENGTH", "DOUBLED")}


def batch_sizes(url: str) -> dict[int, int]:
    stats = httpclient.InferenceServerClient(url).get_inference_statistics(MODEL)["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats.get("batch_stats", [])}


def test_requests_of_different_lengths_share_a_batch_and_get_their_own_answers(server):
    before = batch_sizes(server.http_url)
    inputs = [np.arange(n, dtype=np.float32) + n for n in (3, 4, 5)]
    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def send(index: int) -> None:
        try:
            results[index] = infer(server.grpc_url, inputs[index])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(T)
    assert not errors, errors
    for index, values in enumerate(inputs):
        got = results[index]
        assert got["SUM"].shape == (1, 1) and got["SUM"][0, 0] == values.sum()
        assert got["LENGTH"].shape == (1, 1) and got["LENGTH"][0, 0] == len(values)
        assert got["DOUBLED"].shape == (1, len(values))
        np.testing.assert_array_equal(got["DOUBLED"][0], 2 * values)
    after = batch_sizes(server.http_url)
    # The three requests ran as one batch of 3 (the model waits up to 2 s for a third).
    assert after.get(3, 0) == before.get(3, 0) + 1, (before, after)


def test_a_lone_request_runs_with_the_same_layout(server):
    got = infer(server.grpc_url, np.array([1.5, 2.5], np.float32))
    # Alone it waits for company that does not come; the delay is 2 s, then it runs by itself.
    assert got["SUM"][0, 0] == 4.0 and got["LENGTH"][0, 0] == 2.0
    np.testing.assert_array_equal(got["DOUBLED"], [[3.0, 5.0]])


def test_the_config_reports_ragged_batching(server):
    config = httpclient.InferenceServerClient(server.http_url).get_model_config(MODEL)
    assert config["input"][0]["allow_ragged_batch"] is True
    kinds = [(b["kind"], b["target_name"], b["data_type"]) for b in config["batch_input"]]
    assert kinds == [("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", ["INDEX"], "TYPE_INT32"),
                     ("BATCH_ELEMENT_COUNT", ["COUNTS"], "TYPE_FP32")]
    assert config["batch_output"][0]["kind"] == "BATCH_SCATTER_WITH_INPUT_SHAPE"
    # Batch inputs are the server's: clients see only INPUT.
    metadata = httpclient.InferenceServerClient(server.http_url).get_model_metadata(MODEL)
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT"]


def test_a_batch_input_the_graph_does_not_match_fails_the_load(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE_REPO / MODEL, repo / MODEL)
    config = repo / MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace(
        'target_name: "INDEX" data_type: TYPE_INT32', 'target_name: "INDEX" data_type: TYPE_FP32'))
    server = start_server([repo], name="ragged-mismatch")
    try:
        index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
        (entry,) = [m for m in index if m["name"] == MODEL]
        assert entry["state"] == "UNAVAILABLE"
        assert "batch_input 'INDEX' is FP32 but the model input is INT32" in entry["reason"], entry
    finally:
        stop_server(server)
