"""Triton's rate limiter (`--rate-limit=execution_count`): two models whose instances need the
one copy of a global resource never execute at the same time, which the request traces show
(their COMPUTE_START..COMPUTE_END intervals are disjoint), while every request still gets its
answer; an instance that needs more copies than `--rate-limit-resource` gives fails its load.
A Python model's instances are limited alike."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import REPO_ROOT, RPC_TIMEOUT, start_server, stop_server

T = RPC_TIMEOUT
SLOW = REPO_ROOT / "tests" / "fixtures" / "drain_repository" / "slow_compute"


def limited_copy(repo, name: str, count: int) -> None:
    """slow_compute (tens of ms a run, one instance) under another name, needing `count` copies
    of the global resource R."""
    shutil.copytree(SLOW, repo / name)
    config = repo / name / "config.pbtxt"
    config.write_text(config.read_text()
                      .replace('name: "slow_compute"', f'name: "{name}"')
                      .replace("instance_group [ { count: 1 kind: KIND_CPU } ]",
                               "instance_group [ { count: 1 kind: KIND_CPU rate_limiter { "
                               f'resources [ {{ name: "R" global: true count: {count} }} ] }} }} ]'))


def test_instances_sharing_a_resource_take_turns(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    limited_copy(repo, "slow_a", 1)
    limited_copy(repo, "slow_b", 1)
    limited_copy(repo, "too_greedy", 2)
    trace = tmp_path / "trace.json"
    server = start_server([repo], name="rate-limit", extra_args=[
        "--rate-limit=execution_count", "--rate-limit-resource=R:1",
        "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
        "--trace-config", f"triton,file={trace}",
    ])
    errors: list[BaseException] = []

    def send(model: str, value: float) -> None:
        try:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            for i in range(3):
                x = np.full((1, 1), value + i, np.float32)
                request = grpcclient.InferInput("X", [1, 1], "FP32")
                request.set_data_from_numpy(x)
                y = client.infer(model, [request], client_timeout=T).as_numpy("Y")
                np.testing.assert_array_equal(y, x + 1)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    try:
        index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
        greedy = next(m for m in index if m["name"] == "too_greedy")
        assert greedy["state"] == "UNAVAILABLE"
        assert "'R' (global) is asked for 2 times, but --rate-limit-resource makes only 1" in greedy["reason"]
        threads = [threading.Thread(target=send, args=(model, 10.0 * n))
                   for n, model in enumerate(["slow_a", "slow_b"] * 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(T)
        assert not errors, errors
    finally:
        stop_server(server)
    runs = []
    stamps: dict[int, dict[str, int]] = {}
    models: dict[int, str] = {}
    for record in json.loads(trace.read_text()):
        if "model_name" in record:
            models[record["id"]] = record["model_name"]
        for stamp in record.get("timestamps", []):
            stamps.setdefault(record["id"], {})[stamp["name"]] = stamp["ns"]
    for trace_id, named in stamps.items():
        runs.append((named["COMPUTE_START"], named["COMPUTE_END"], models[trace_id]))
    assert len(runs) == 18 and {m for _, _, m in runs} == {"slow_a", "slow_b"}
    runs.sort()
    for (start, end, model), (next_start, _, next_model) in zip(runs, runs[1:]):
        assert end <= next_start, f"{model} and {next_model} ran at once"


# Each execute notes when it ran (CLOCK_MONOTONIC is the machine's: the stubs' notes compare).
PY_LIMITED = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = args["model_repository"] + "/runs"

    def execute(self, requests):
        start = time.monotonic_ns()
        time.sleep(0.03)
        end = time.monotonic_ns()
        with open(self.runs, "a") as runs:
            runs.write(f"{start} {end}\\n")
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)]) for r in requests]
"""

PY_LIMITED_CONFIG = """
name: "py_limited"
backend: "python"
max_batch_size: 1
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "R" global: true count: 1 } ] } } ]
"""


def test_a_python_models_instances_sharing_a_resource_take_turns(tmp_path):
    repo = tmp_path / "repo"
    (repo / "py_limited" / "1").mkdir(parents=True)
    (repo / "py_limited" / "config.pbtxt").write_text(PY_LIMITED_CONFIG)
    (repo / "py_limited" / "1" / "model.py").write_text(PY_LIMITED)
    server = start_server([repo], name="rate-limit-python", env={"KILN_PYTHON": sys.executable},
                          extra_args=["--rate-limit=execution_count", "--rate-limit-resource=R:1"])
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def send(value: float) -> None:
        x = np.full((1, 1), value, np.float32)
        request = grpcclient.InferInput("X", [1, 1], "FP32")
        request.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("py_limited", [request], client_timeout=T).as_numpy("Y"), x + 1)

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(send, range(8)))
    finally:
        stop_server(server)
    runs = sorted(tuple(map(int, line.split())) for line in (repo / "py_limited" / "runs").read_text().split("\n")
                  if line)
    assert len(runs) == 8, runs
    for (start, end), (next_start, _) in zip(runs, runs[1:]):
        assert end <= next_start, "the two instances ran at once"
