"""Model lifecycle with tritonclient (grpc and http): get_model_repository_index, load_model (plain,
with a config override, with file overrides) and unload_model against kiln in explicit
model-control mode; the mode rules and Triton's error texts.
"""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import (BUNDLED_REPO, RPC_TIMEOUT, assert_triton_error, http_request, kiln_bin, start_server,
                      stop_server)

import grpc

T = RPC_TIMEOUT
ADD_SUB_ONNX = (BUNDLED_REPO / "add_sub" / "1" / "model.onnx").read_bytes()


def add_sub_config(name: str, max_batch_size: int = 8, instances: int = 1) -> str:
    """add_sub's config as the JSON the load API takes."""
    tensor = lambda n: {"name": n, "data_type": "TYPE_FP32", "dims": [16]}  # noqa: E731
    return json.dumps({
        "name": name,
        "backend": "onnxruntime",
        "max_batch_size": max_batch_size,
        "input": [tensor("INPUT0"), tensor("INPUT1")],
        "output": [tensor("OUTPUT0"), tensor("OUTPUT1")],
        "instance_group": [{"count": instances, "kind": "KIND_CPU"}],
    })


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    """kiln in explicit mode over a copy of add_sub and string_echo, nothing loaded at start."""
    repo = tmp_path_factory.mktemp("explicit-repo")
    for model in ("add_sub", "string_echo"):
        shutil.copytree(BUNDLED_REPO / model, repo / model)
    srv = start_server([repo], name="kiln-explicit", extra_args=["--model-control-mode", "explicit"])
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def grpc_client(explicit):
    c = grpcclient.InferenceServerClient(explicit.grpc_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def http_client(explicit):
    c = httpclient.InferenceServerClient(explicit.http_url, network_timeout=T)
    yield c
    c.close()


def add_sub_grpc(client, model: str):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 0.5, dtype=np.float32)
    inputs = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        inp = grpcclient.InferInput(name, list(arr.shape), "FP32")
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    result = client.infer(model, inputs, client_timeout=T)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)


def add_sub_http(client, model: str):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 0.5, dtype=np.float32)
    inputs = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        inp = httpclient.InferInput(name, list(arr.shape), "FP32")
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    result = client.infer(model, inputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)


def wait_for(predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def states(grpc_client) -> dict:
    idx = grpc_client.get_model_repository_index(client_timeout=T)
    return {(m.name, m.version): (m.state, m.reason) for m in idx.models}


def test_index_lists_models_never_loaded_by_name_only(grpc_client, http_client):
    grpc_index = grpc_client.get_model_repository_index(as_json=True, client_timeout=T)
    assert grpc_index["models"] == [{"name": "add_sub"}, {"name": "string_echo"}]
    assert http_client.get_model_repository_index() == [{"name": "add_sub"}, {"name": "string_echo"}]
    assert grpc_client.is_server_ready(client_timeout=T) is True


def test_load_and_unload_over_grpc_and_http(grpc_client, http_client):
    grpc_client.load_model("add_sub", client_timeout=T)
    assert grpc_client.is_model_ready("add_sub", client_timeout=T) is True
    add_sub_grpc(grpc_client, "add_sub")
    http_client.load_model("string_echo")
    assert http_client.is_model_ready("string_echo") is True
    assert states(grpc_client)[("add_sub", "1")] == ("READY", "")

    http_client.unload_model("add_sub", unload_dependents=True)
    wait_for(lambda: states(grpc_client).get(("add_sub", "1")) == ("UNAVAILABLE", "unloaded"),
             "add_sub to be unloaded")
    assert grpc_client.is_model_ready("add_sub", client_timeout=T) is False
    grpc_client.unload_model("string_echo", unload_dependents=True, client_timeout=T)
    wait_for(lambda: states(grpc_client).get(("string_echo", "1")) == ("UNAVAILABLE", "unloaded"),
             "string_echo to be unloaded")
    http_index = http_client.get_model_repository_index()
    assert {"name": "add_sub", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in http_index
    assert http_client.is_server_ready() is True


def test_config_override_reloads_without_downtime(grpc_client, http_client):
    grpc_client.load_model("add_sub", config=add_sub_config("add_sub", max_batch_size=4), client_timeout=T)
    assert grpc_client.get_model_config("add_sub", as_json=True, client_timeout=T)["config"]["max_batch_size"] == 4
    http_client.load_model("add_sub", config=add_sub_config("add_sub", max_batch_size=2, instances=2))
    config = http_client.get_model_config("add_sub")
    assert (config["max_batch_size"], config["instance_group"][0]["count"]) == (2, 2)
    add_sub_http(http_client, "add_sub")
    with pytest.raises(InferenceServerException) as e:
        grpc_client.load_model("add_sub", config="{not json", client_timeout=T)
    # Triton main: core InitializeModelInfo reads the override while polling, and LoadUnloadModel
    # answers its poll failure (conformance/test_triton_main_texts.py); kiln's reason follows.
    assert_triton_error(e.value, grpc.StatusCode.INTERNAL,
                        "failed to load 'add_sub', failed to poll from model repository: Invalid config override")
    add_sub_grpc(grpc_client, "add_sub")  # the loaded model still serves


def test_file_overrides_make_new_models(grpc_client, http_client):
    files = {"file:1/model.onnx": ADD_SUB_ONNX}
    grpc_client.load_model("uploaded_grpc", config=add_sub_config("uploaded_grpc"), files=files, client_timeout=T)
    add_sub_grpc(grpc_client, "uploaded_grpc")
    # tritonclient.http base64-encodes the bytes (rapidjson writes them as a string).
    http_client.load_model("uploaded_http", config=add_sub_config("uploaded_http"), files=files)
    add_sub_http(http_client, "uploaded_http")
    names = {m["name"] for m in http_client.get_model_repository_index()}
    assert {"uploaded_grpc", "uploaded_http"} <= names
    with pytest.raises(InferenceServerException) as e:
        grpc_client.load_model("lonely", files=files, client_timeout=T)
    # Triton: core src/model_repository_manager/model_repository_manager.cc, its handling of the
    # "file:" load parameters (a file override without a "config" parameter).
    assert_triton_error(e.value, grpc.StatusCode.INVALID_ARGUMENT,
                        "Load parameter 'config' must be specified for model file override")
    with pytest.raises(InferenceServerException) as e:
        grpc_client.load_model("evil", config=add_sub_config("evil"),
                               files={"file:../../evil/1/model.onnx": ADD_SUB_ONNX}, client_timeout=T)
    assert_triton_error(e.value, grpc.StatusCode.INVALID_ARGUMENT, "must stay within model directory")


def test_override_files_never_go_through_a_planted_path(tmp_path, monkeypatch):
    """Override files used to be written to `$TMPDIR/kiln-override-<pid>-<n>`, made with
    create_dir_all: a local user who planted a link there had the model written into a directory
    of theirs, to read or to swap. Each load now writes to a fresh private directory (mode 0700,
    a random name): the planted links are left alone, the load works, and the directory is gone
    once the load has read it."""
    temp, attacker, repo = tmp_path / "temp", tmp_path / "attacker", tmp_path / "repo"
    for d in (temp, attacker, repo):
        d.mkdir()
    # kiln keeps the script's process ID ($$): the links are at the names kiln would have chosen.
    wrapper = tmp_path / "plant.sh"
    wrapper.write_text('#!/bin/sh\nfor n in 0 1 2; do ln -s "$ATTACKER" "$TMPDIR/kiln-override-$$-$n" || exit 1; done\n'
                       'exec "$KILN_REAL_BIN" "$@"\n')
    wrapper.chmod(0o755)
    env = {"TMPDIR": str(temp), "ATTACKER": str(attacker), "KILN_REAL_BIN": str(kiln_bin())}
    monkeypatch.setenv("KILN_BIN", str(wrapper))
    srv = start_server([repo], name="kiln-planted-override", env=env, extra_args=["--model-control-mode", "explicit"])
    try:
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        for _ in range(2):
            client.load_model("planted", config=add_sub_config("planted"),
                              files={"file:1/model.onnx": ADD_SUB_ONNX}, client_timeout=T)
        add_sub_grpc(client, "planted")
        client.close()
        assert list(attacker.iterdir()) == [], "files were written through the planted link"
        links = sorted(p.name for p in temp.iterdir() if p.name.startswith("kiln"))
        assert links == [f"kiln-override-{srv.proc.pid}-{n}" for n in range(3)], links
    finally:
        stop_server(srv)


def model_series(server, model: str) -> dict[str, float]:
    """The series of `model` on /metrics, by family and labels."""
    reply = http_request(server.metrics_url, "GET", "/metrics")
    assert reply.status == 200
    found = {}
    for line in reply.body.decode().splitlines():
        series, _, value = line.rpartition(" ")
        if not line.startswith("#") and f'model="{model}"' in series:
            found[series] = float(value)
    return found


def test_a_models_series_go_with_it_and_come_back_from_zero(explicit, grpc_client, http_client):
    # As Triton's: a reload (the old copy serves until the new one is ready) keeps counting; an
    # unload takes the model's series off /metrics; loaded again, they count from 0.
    files = {"file:1/model.onnx": ADD_SUB_ONNX}
    success = 'nv_inference_request_success{model="counted",version="1"}'
    grpc_client.load_model("counted", config=add_sub_config("counted"), files=files, client_timeout=T)
    for _ in range(2):
        add_sub_grpc(grpc_client, "counted")
    series = model_series(explicit, "counted")
    assert series[success] == 2
    assert series['nv_inference_count{model="counted",version="1"}'] == 2
    assert series['nv_inference_request_failure{model="counted",reason="BACKEND",version="1"}'] == 0
    assert 'nv_model_load_duration_secs{model="counted",version="1"}' in series

    grpc_client.load_model("counted", config=add_sub_config("counted", max_batch_size=4), files=files,
                           client_timeout=T)
    add_sub_grpc(grpc_client, "counted")
    assert model_series(explicit, "counted")[success] == 3
    assert http_client.get_inference_statistics("counted")["model_stats"][0]["inference_count"] == 1

    grpc_client.unload_model("counted", client_timeout=T)
    wait_for(lambda: not model_series(explicit, "counted"), "counted's series to leave /metrics")
    grpc_client.load_model("counted", config=add_sub_config("counted"), files=files, client_timeout=T)
    series = model_series(explicit, "counted")
    assert (series[success], series['nv_inference_exec_count{model="counted",version="1"}']) == (0, 0)
    add_sub_grpc(grpc_client, "counted")
    assert model_series(explicit, "counted")[success] == 1


def test_load_errors_follow_triton(grpc_client, http_client):
    with pytest.raises(InferenceServerException) as e:
        grpc_client.load_model("missing", client_timeout=T)
    # Triton: core src/model_repository_manager/model_repository_manager.cc,
    # ModelRepositoryManager::LoadUnloadModel (INTERNAL).
    assert_triton_error(e.value, grpc.StatusCode.INTERNAL,
                        "failed to load 'missing', failed to poll from model repository")
    with pytest.raises(InferenceServerException) as e:
        http_client.load_model("missing")
    assert e.value.status() == "500"
    with pytest.raises(InferenceServerException) as e:
        grpc_client.load_model("../add_sub", client_timeout=T)
    assert_triton_error(e.value, grpc.StatusCode.INVALID_ARGUMENT,
                        "model name must not contain path traversal characters")
    with pytest.raises(InferenceServerException) as e:
        http_client.load_model("..")
    assert e.value.status() == "400"
    assert "path traversal" in e.value.message()
    # Names are kept (load locks, the index): no longer than a directory's name may be.
    with pytest.raises(InferenceServerException) as e:
        grpc_client.load_model("m" * (1 << 20), client_timeout=T)
    assert_triton_error(e.value, grpc.StatusCode.INVALID_ARGUMENT,
                        "invalid model name: it is 1048576 bytes, longer than the 255")
    assert len(e.value.message()) < 1000


def test_server_metadata_lists_the_extension(grpc_client):
    extensions = grpc_client.get_server_metadata(as_json=True, client_timeout=T)["extensions"]
    assert "model_repository" in extensions and "model_repository(unload_dependents)" in extensions


def test_load_unload_refused_outside_explicit_mode(client):
    for call in (lambda: client.load_model("add_sub", client_timeout=T),
                 lambda: client.unload_model("add_sub", client_timeout=T)):
        with pytest.raises(InferenceServerException) as e:
            call()
        assert_triton_error(e.value, grpc.StatusCode.UNAVAILABLE,
                            "explicit model load / unload is not allowed if polling is enabled")


# --------------------------------------------------------------------------- model_warmup

def warmup_config(name: str, *samples) -> str:
    config = json.loads(add_sub_config(name, instances=2))
    config["model_warmup"] = list(samples)
    return json.dumps(config)


def warmup_sample(name: str, batch_size: int, input1: dict) -> dict:
    zeros = {"data_type": "TYPE_FP32", "dims": [16], "zero_data": True}
    return {"name": name, "batch_size": batch_size, "count": 2,
            "inputs": {"INPUT0": zeros, "INPUT1": input1}}


def test_warmup_runs_before_the_model_serves(http_client, explicit):
    data = np.arange(16, dtype=np.float32).tobytes()
    config = warmup_config(
        "warm",
        warmup_sample("from_file", 4, {"data_type": "TYPE_FP32", "dims": [16], "input_data_file": "one.bin"}),
        warmup_sample("random", 1, {"data_type": "TYPE_FP32", "dims": [16], "random_data": True}))
    http_client.load_model("warm", config=config,
                           files={"file:1/model.onnx": ADD_SUB_ONNX, "file:warmup/one.bin": data})
    assert http_client.is_model_ready("warm")
    log = explicit.log_text()
    for sample in ("from_file", "random"):
        # kiln's log line, not a Triton text.
        assert f"model 'warm': 2 instance(s) warmed up with sample '{sample}'" in log, log
    # As in Triton, the samples count in the statistics: each of the 2 instances ran "from_file"
    # (4 one-row requests in one execution) twice and "random" (1) twice.
    stats = http_client.get_inference_statistics("warm")["model_stats"][0]
    assert stats["execution_count"] == 8 and stats["inference_count"] == 20
    assert stats["inference_stats"]["success"]["count"] == 20
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(1, 4), (4, 4)]
    http_client.unload_model("warm")


# "failed to warm up model ... with sample ...", "holds 8 bytes ..." and "must be relative and stay
# within the model directory" are kiln's texts; the last two rows carry Triton's validation texts
# (core src/infer_request.cc, InferenceRequest::Normalize) as kiln runs a sample as a request.
@pytest.mark.parametrize("input1,files,message", [
    ({"data_type": "TYPE_FP32", "dims": [16], "input_data_file": "short.bin"}, {"file:warmup/short.bin": b"\0" * 8},
     "holds 8 bytes, one batch element takes 64"),
    ({"data_type": "TYPE_FP32", "dims": [16], "input_data_file": "../1/model.onnx"}, {},
     "must be relative and stay within the model directory"),
    ({"data_type": "TYPE_INT32", "dims": [16], "zero_data": True}, {}, "inference input 'INPUT1' data-type is 'INT32'"),
    ({"data_type": "TYPE_FP32", "dims": [4], "zero_data": True}, {}, "unexpected shape for input 'INPUT1'"),
])
def test_a_bad_warmup_sample_fails_the_load(http_client, input1, files, message):
    config = warmup_config("cold", warmup_sample("bad", 1, input1))
    with pytest.raises(InferenceServerException) as e:
        http_client.load_model("cold", config=config, files={"file:1/model.onnx": ADD_SUB_ONNX, **files})
    text = e.value.message()
    assert "failed to warm up model 'cold' with sample 'bad': " in text and message in text, text
    assert not http_client.is_model_ready("cold")
