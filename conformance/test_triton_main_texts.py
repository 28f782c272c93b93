"""Texts and statuses of Triton's current main (issue 44) that its QA tests and client examples
expect, through the real binary with tritonclient (gRPC and HTTP) and raw HTTP requests.

Each test names the Triton test it mirrors and the source the text comes from: core
src/model_repository_manager/model_repository_manager.cc (`ValidateModelName`,
`LoadUnloadModel`, `InitializeModelInfo`), server src/http_server.cc and src/classification.cc.
Where kiln's own reason follows Triton's text, the test checks Triton's part exactly.
"""

from __future__ import annotations

import json
import shutil

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, FIXTURE_REPO, RPC_TIMEOUT, http_request, start_server, stop_server

T = RPC_TIMEOUT
EMPTY = "Model name cannot be empty. Please enter a valid name to deploy."
TRAVERSAL = "model name must not contain path traversal characters"
POLL = "failed to load 'simple', failed to poll from model repository"

# qa/L0_input_validation/input_validation_test.py, ModelNameValidationTest.
INVALID_TRAVERSAL_NAMES = ["../etc", "a/../b", "../../etc/passwd", "../../../../etc", "model/..", "..",
                           "/etc/passwd", "model/subdir", "model/", " ..", ".. "]
WHITESPACE_NAMES = [" ", "   ", "\t", "\n", "\r", "\f", "\v", " \t \n "]
VALID_MODEL_NAMES = ["model123", "model.version1", "...", "..my_model", "model..1", "model....1"]


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    """kiln in explicit mode (as the QA runs Triton) with `simple` (add_sub under the name of
    Triton's client examples) and int_div (variable-length INT32) loaded."""
    repo = tmp_path_factory.mktemp("main-texts-repo")
    shutil.copytree(BUNDLED_REPO / "add_sub", repo / "simple")
    config = repo / "simple" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_sub"', 'name: "simple"'))
    shutil.copytree(FIXTURE_REPO / "int_div", repo / "int_div")
    srv = start_server([repo], name="kiln-main-texts",
                       extra_args=["--model-control-mode", "explicit", "--load-model", "simple",
                                   "--load-model", "int_div"])
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def gclient(explicit):
    c = grpcclient.InferenceServerClient(explicit.grpc_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def hclient(explicit):
    c = httpclient.InferenceServerClient(explicit.http_url, network_timeout=T)
    yield c
    c.close()


def refusal(call, *args, **kwargs) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as e:
        call(*args, **kwargs)
    return e.value.status(), e.value.message()


def simple_infer(client, module):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        inp = module.InferInput(name, [1, 16], "FP32")
        inp.set_data_from_numpy(a)
        inputs.append(inp)
    np.testing.assert_allclose(client.infer("simple", inputs).as_numpy("OUTPUT0"), a + a)


# --------------------------------------------------------------------------- model names

def test_loading_an_empty_or_blank_name_answers_tritons_text(gclient, hclient):
    # qa/L0_input_validation test_model_name_empty_load, test_model_name_whitespace_only_load;
    # core ValidateModelName trims the name (boost::trim_copy) and refuses what is left empty,
    # INVALID_ARG.
    for name in [""] + WHITESPACE_NAMES:
        assert refusal(gclient.load_model, name, client_timeout=T) == (
            str(grpc.StatusCode.INVALID_ARGUMENT), EMPTY), repr(name)
    # Over REST kiln decodes the name (tritonclient quotes it: %20), then checks it the same way.
    for name in (" ", "\t", " \t \n "):
        assert refusal(hclient.load_model, name) == ("400", EMPTY), repr(name)


def test_loading_a_name_that_escapes_after_trimming_is_refused(gclient, hclient):
    # qa/L0_input_validation test_model_name_invalid_load: " .." and ".. " are ".." once trimmed
    # (core ValidateModelName: the trimmed name "..", or any '/'), INVALID_ARG.
    for name in INVALID_TRAVERSAL_NAMES:
        assert refusal(gclient.load_model, name, client_timeout=T) == (
            str(grpc.StatusCode.INVALID_ARGUMENT), f"invalid model name '{name}', {TRAVERSAL}"), repr(name)
    for name in (" ..", ".. "):
        assert refusal(hclient.load_model, name) == ("400", f"invalid model name '{name}', {TRAVERSAL}")
    # test_model_name_valid: dots elsewhere are names, which no repository holds here.
    for name in VALID_MODEL_NAMES:
        assert refusal(gclient.load_model, name, client_timeout=T) == (
            str(grpc.StatusCode.INTERNAL), f"failed to load '{name}', failed to poll from model repository")


def test_unloading_any_name_is_not_a_traversal_refusal(explicit, gclient):
    # qa/L0_input_validation test_model_name_invalid_unload: core LoadUnloadModel validates the
    # names it loads only; unloading a model it does not have succeeds.
    for name in INVALID_TRAVERSAL_NAMES + ["", " "]:
        gclient.unload_model(name, client_timeout=T)
    for path in ("/v2/repository/models/..%2Fetc/unload", "/v2/repository/models/%20../unload"):
        reply = http_request(explicit.http_url, "POST", path)
        assert (reply.status, reply.body) == (200, b""), reply
    assert gclient.is_model_ready("simple")


# --------------------------------------------------------------------------- load overrides

def test_a_malformed_config_override_fails_to_poll(gclient, hclient):
    # Triton's client examples simple_grpc_model_control.py / simple_http_model_control.py: the
    # override is read while polling the model (core InitializeModelInfo: "Invalid config
    # override: ..." goes to the log), and LoadUnloadModel answers INTERNAL "failed to load
    # 'simple', failed to poll from model repository". kiln's reason follows.
    config = '"parameters": {"config": {{"max_batch_size": "16"}}}'
    status, message = refusal(gclient.load_model, "simple", config=config, client_timeout=T)
    assert (status, message.split(": ", 1)[0]) == (str(grpc.StatusCode.INTERNAL), POLL), message
    assert message.startswith(f"{POLL}: Invalid config override: "), message
    status, message = refusal(hclient.load_model, "simple", config=config)
    assert (status, message.split(": ", 1)[0]) == ("500", POLL), message
    assert message.startswith(f"{POLL}: Invalid config override: "), message
    # The loaded model keeps serving, and a good override still loads (the examples go on so).
    simple_infer(gclient, grpcclient)
    gclient.load_model("simple", config='{"max_batch_size":"16"}', client_timeout=T)
    assert gclient.get_model_config("simple", client_timeout=T).config.max_batch_size == 16


def test_an_oversized_file_parameter_fails_to_poll_and_the_server_stays(explicit, gclient):
    # qa/L0_http test_load_oversized_file_parameter (REST, 500) and simple_grpc_model_control.py
    # (gRPC, INTERNAL): a path component of 256 bytes, past NAME_MAX; Triton's poll failure.
    long_path = "file:" + "A" * 256
    body = json.dumps({"parameters": {long_path: "YQ==", "config": "{}"}}).encode()
    reply = http_request(explicit.http_url, "POST", "/v2/repository/models/simple/load", body,
                         {"Content-Type": "application/json"})
    assert reply.status == 500, reply
    assert reply.error().startswith(f"{POLL}: "), reply
    status, message = refusal(gclient.load_model, "simple", config="{}", files={long_path: b"a"},
                              client_timeout=T)
    assert status == str(grpc.StatusCode.INTERNAL)
    assert message.startswith(f"{POLL}: "), message
    assert http_request(explicit.http_url, "GET", "/v2/health/ready").status == 200
    explicit.assert_alive()


# --------------------------------------------------------------------------- REST bodies

def test_negative_dimensions_are_tritons_500(explicit):
    # qa/L0_http test_negative_dimensions; server src/http_server.cc reads each dimension with
    # TritonJson's IndexAsUInt (its errors are INTERNAL) under "Unable to parse 'shape'".
    payload = {"inputs": [{"name": "INPUT0", "shape": [2, -5], "datatype": "FP32", "data": [1.0]}]}
    for shape in ([2, -5], [1.5, 16], ["1", 16]):
        payload["inputs"][0]["shape"] = shape
        reply = http_request(explicit.http_url, "POST", "/v2/models/simple/infer", json.dumps(payload).encode(),
                             {"Content-Type": "application/json"})
        assert (reply.status, reply.error()) == (
            500, "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"), shape
    explicit.assert_alive()


def test_repository_index_deeply_nested_json(explicit):
    # qa/L0_http test_repository_index_deeply_nested_json; server src/http_server.cc,
    # HandleRepositoryIndex: a "ready" that is not a boolean, INVALID_ARG.
    depth = 250_000
    payload = '{"ready":' + "[" * depth + "true" + "]" * depth + "}"
    reply = http_request(explicit.http_url, "POST", "/v2/repository/index", payload.encode(),
                         {"Content-Type": "application/json"})
    assert (reply.status, reply.error()) == (400, "Invalid value for 'ready': expected a boolean"), reply
    reply = http_request(explicit.http_url, "POST", "/v2/repository/index", b'{"ready": 1}')
    assert (reply.status, reply.error()) == (400, "Invalid value for 'ready': expected a boolean"), reply
    # Members other than "ready" are not read, however many values they hold.
    many = '{"other": [' + ",".join(["0"] * 100_000) + '], "ready": true}'
    reply = http_request(explicit.http_url, "POST", "/v2/repository/index", many.encode())
    assert reply.status == 200, reply
    assert {m["name"] for m in reply.json()} == {"simple", "int_div"}
    explicit.assert_alive()


# --------------------------------------------------------------------------- classification

@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_classification_output_tensor_too_large(explicit, module, gclient, hclient):
    # qa/L0_parameters/class_count_test.py test_classification_output_tensor_too_large; server
    # src/classification.cc, TopkClassifications: more than 1,000,000 elements (per batch item),
    # INVALID_ARG.
    client = gclient if module is grpcclient else hclient
    for n, refused in ((1_000_001, True), (1_000_000, False)):
        a = np.ones(n, dtype=np.int32)
        inputs = [module.InferInput(name, [n], "INT32") for name in ("A", "B")]
        for inp in inputs:
            inp.set_data_from_numpy(a)
        outputs = [module.InferRequestedOutput("C", class_count=5)]
        if refused:
            status, message = refusal(client.infer, "int_div", inputs, outputs=outputs)
            expected = str(grpc.StatusCode.INVALID_ARGUMENT) if module is grpcclient else "400"
            assert (status, message) == (expected, "classification output tensor too large")
        else:
            result = client.infer("int_div", inputs, outputs=outputs).as_numpy("C")
            assert result.shape == (5,) and result[0] == b"2:0"
    explicit.assert_alive()
