"""Loading models on their first request (`--load-on-demand`, kiln's own, off by default): with
tritonclient over gRPC and REST, a model the repository holds but has not loaded loads on its
first inference, metadata or config request; requests that come together wait on one load; a
model that fails to load is answered with its load error, and not loaded again for every request
(a backoff); names no repository holds are answered NOT_FOUND, a flood of them leaves the server
up; in poll mode, polls reload and unload only what requests loaded; the flag is refused in mode
none."""

from __future__ import annotations

import json
import queue
import re
import shutil
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, RPC_TIMEOUT, http_request, kiln_bin, start_server, stop_server

NAMES = ["first", "meta", "conf", "crowd"]


@pytest.fixture(scope="module")
def on_demand(tmp_path_factory):
    """kiln in explicit mode with --load-on-demand, over copies of add_sub and a broken model;
    nothing is loaded at start."""
    repo = tmp_path_factory.mktemp("on-demand")
    config = (BUNDLED_REPO / "add_sub" / "config.pbtxt").read_text()
    for name in NAMES:
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(BUNDLED_REPO / "add_sub" / "1" / "model.onnx", repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(config.replace('name: "add_sub"', f'name: "{name}"'))
    # A generation model (decoupled), for a stream's first request.
    shutil.copytree(BUNDLED_REPO / "tiny_decoder", repo / "talker")
    talker = repo / "talker" / "config.pbtxt"
    talker.write_text(talker.read_text().replace('name: "tiny_decoder"', 'name: "talker"'))
    # Its model file is not an ONNX graph: every load fails.
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not a graph")
    (repo / "broken" / "config.pbtxt").write_text(config.replace('name: "add_sub"', 'name: "broken"'))
    srv = start_server([repo], name="kiln-on-demand",
                       extra_args=["--model-control-mode", "explicit", "--load-on-demand", "true"])
    yield srv
    stop_server(srv)


def inputs(module):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    made = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    for tensor in made:
        tensor.set_data_from_numpy(a)
    return made


def loads(server, name: str) -> int:
    """Load attempts of `name` in the server's log."""
    return len(re.findall(rf"loading model={re.escape(name)}\b", server.log_text()))


def test_a_model_loads_on_its_first_inference_metadata_or_config_request(on_demand):
    grpc = grpcclient.InferenceServerClient(on_demand.grpc_url)
    http = httpclient.InferenceServerClient(on_demand.http_url)
    assert not grpc.is_model_ready("first")
    result = grpc.infer("first", inputs(grpcclient), client_timeout=RPC_TIMEOUT)
    assert (result.as_numpy("OUTPUT0") == 2 * np.arange(16, dtype=np.float32)).all()
    assert http.get_model_metadata("meta")["name"] == "meta"
    assert grpc.get_model_config("conf").config.name == "conf"
    ready = {m["name"] for m in http.get_model_repository_index() if m.get("state") == "READY"}
    assert {"first", "meta", "conf"} <= ready
    assert "crowd" not in ready and "broken" not in ready


def test_requests_that_come_together_wait_on_one_load(on_demand):
    def infer(_):
        client = httpclient.InferenceServerClient(on_demand.http_url)
        return client.infer("crowd", inputs(httpclient)).as_numpy("OUTPUT1")

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(infer, range(16)))
    assert all((answer == 0).all() for answer in answers)
    assert loads(on_demand, "crowd") == 1


def test_a_failing_load_is_answered_with_its_error_and_not_tried_for_every_request(on_demand):
    client = grpcclient.InferenceServerClient(on_demand.grpc_url)
    errors = set()
    for _ in range(5):
        with pytest.raises(InferenceServerException) as raised:
            client.infer("broken", inputs(grpcclient), client_timeout=RPC_TIMEOUT)
        errors.add(raised.value.message())
    assert len(errors) == 1, errors
    assert "load failed for model 'broken'" in errors.pop()
    # Five requests within the backoff: one load attempt.
    assert loads(on_demand, "broken") == 1


def test_a_streams_first_request_to_a_decoupled_model_loads_it_and_streams(on_demand):
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(on_demand.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    prompt = grpcclient.InferInput("text_input", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"the cat"], dtype=object))
    steps = grpcclient.InferInput("max_tokens", [1], "INT32")
    steps.set_data_from_numpy(np.array([3], dtype=np.int32))
    try:
        for _ in range(2):
            client.async_stream_infer("talker", [prompt, steps])
            pieces = []
            while True:
                result, error = answers.get(timeout=RPC_TIMEOUT)
                assert error is None, error
                response = result.get_response()
                pieces.append(result.as_numpy("text_output"))
                if response.parameters["triton_final_response"].bool_param:
                    break
            assert len(pieces) == 3, pieces
    finally:
        client.stop_stream()
        client.close()
    assert loads(on_demand, "talker") == 1


def test_unknown_names_are_not_found_and_a_flood_of_them_leaves_the_server_up(on_demand):
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                                   "data": [0.0] * 16}]}).encode()
    for _ in range(300):
        name = f"nope-{uuid.uuid4().hex[:12]}"
        reply = http_request(on_demand.http_url, "POST", f"/v2/models/{name}/infer", body)
        assert reply.status == 404, reply.status
        assert f"Request for unknown model: '{name}' is not found" in reply.body.decode()
    grpc = grpcclient.InferenceServerClient(on_demand.grpc_url)
    assert grpc.is_server_live()
    assert grpc.infer("first", inputs(grpcclient), client_timeout=RPC_TIMEOUT) is not None


def test_the_flag_needs_explicit_or_poll_mode(tmp_path):
    done = subprocess.run([str(kiln_bin()), "--model-repository", str(tmp_path), "--load-on-demand"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--load-on-demand needs --model-control-mode=explicit or poll" in done.stderr


def test_in_poll_mode_polls_reload_what_requests_loaded_and_load_nothing_else(tmp_path):
    config = (BUNDLED_REPO / "add_sub" / "config.pbtxt").read_text()
    for name in ["asked", "left"]:
        (tmp_path / name / "1").mkdir(parents=True)
        shutil.copy(BUNDLED_REPO / "add_sub" / "1" / "model.onnx", tmp_path / name / "1" / "model.onnx")
        (tmp_path / name / "config.pbtxt").write_text(config.replace('name: "add_sub"', f'name: "{name}"'))
    srv = start_server([tmp_path], name="kiln-on-demand-poll",
                       extra_args=["--model-control-mode", "poll", "--repository-poll-secs", "1",
                                   "--load-on-demand"])
    try:
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        assert not client.is_model_ready("asked") and not client.is_model_ready("left")
        client.infer("asked", inputs(grpcclient), client_timeout=RPC_TIMEOUT)
        # A change to the loaded model's files: the next poll reloads it.
        config_file = tmp_path / "asked" / "config.pbtxt"
        config_file.write_text(config_file.read_text() + "\n# changed\n")
        deadline = time.monotonic() + 60
        while loads(srv, "asked") < 2:
            assert time.monotonic() < deadline, srv.log_text()[-2000:]
            time.sleep(0.1)
        assert client.is_model_ready("asked")
        # The polls that saw `left` did not load it.
        assert loads(srv, "left") == 0 and not client.is_model_ready("left")
    finally:
        stop_server(srv)


def test_loads_on_demand_are_counted_and_timed(on_demand):
    text = http_request(on_demand.metrics_url, "GET", "/metrics").body.decode()
    count = lambda outcome: sum(float(line.split()[-1]) for line in text.splitlines()  # noqa: E731
                                if line.startswith(f'kiln_model_loads_on_demand_total{{outcome="{outcome}"}}'))
    # first, meta, conf, crowd, talker; broken once, then answered from its backoff.
    assert count("success") == 5 and count("failure") == 1 and count("backoff") >= 4, text
    assert "kiln_model_load_on_demand_seconds_count 6" in text, text

