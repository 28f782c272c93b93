"""Triton's SageMaker service (`--allow-sagemaker=true`): `/ping` follows readiness and
`/invocations` runs one model with the infer endpoint's body, JSON or binary (SageMaker's
`application/vnd.sagemaker-triton.binary+json;json-header-size=N` content type), through
tritonclient's own request builder and response parser; errors are 400 as Triton answers them.
Multi-model endpoints (`/models`): SageMaker's model manager loads a model directory or an
ensemble's repository, lists, invokes and unloads them, as Triton's SageMaker service serves it."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import tritonclient.http as httpclient

from conftest import (BUNDLED_REPO, FIXTURE_REPO, add_sub_request_body, find_free_port, http_request,
                      start_server, stop_server)

BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size="


def sagemaker_server(repo, name, env=None):
    port = find_free_port()
    server = start_server([repo], name=name, env=env, extra_args=[
        "--allow-sagemaker=true", "--sagemaker-port", str(port)])
    return server, f"127.0.0.1:{port}"


def test_ping_and_invocations_serve_the_one_model(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(BUNDLED_REPO / "add_sub", repo / "add_sub")
    server, url = sagemaker_server(repo, "sagemaker-one")
    try:
        ping = http_request(url, "GET", "/ping")
        assert ping.status == 200 and ping.body == b""
        # JSON in, JSON out: the only model served answers.
        body, _, a = add_sub_request_body(binary=False)
        reply = http_request(url, "POST", "/invocations", body, {"Content-Type": "application/json"})
        assert reply.status == 200, reply.body
        assert reply.headers["content-type"] == "application/json"
        result = json.loads(reply.body)
        assert result["model_name"] == "add_sub"
        assert result["outputs"][0]["data"] == (a + 1).ravel().tolist()
        # Binary tensors, the JSON's length in SageMaker's content type, both ways.
        body, json_size, a = add_sub_request_body(binary=True)
        reply = http_request(url, "POST", "/invocations", body, {"Content-Type": f"{BINARY}{json_size}"})
        assert reply.status == 200, reply.body
        content_type = reply.headers["content-type"]
        assert content_type.startswith(BINARY)
        result = httpclient.InferenceServerClient.parse_response_body(
            reply.body, header_length=int(content_type[len(BINARY):]))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 1)
        # Errors are 400 with Triton's JSON body.
        bad = http_request(url, "POST", "/invocations", b'{"inputs": []}')
        assert bad.status == 400 and "expected 2 inputs" in json.loads(bad.body)["error"]
        assert http_request(url, "POST", "/invocations", body, {"Content-Type": f"{BINARY}x"}).status == 400
        # No multi-model endpoint model was loaded.
        assert json.loads(http_request(url, "GET", "/models").body) == {"models": []}
    finally:
        stop_server(server)


def test_the_model_comes_from_the_environment_when_several_are_served():
    server, url = sagemaker_server(BUNDLED_REPO, "sagemaker-env",
                                   env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"})
    unset, unset_url = sagemaker_server(BUNDLED_REPO, "sagemaker-unset")
    try:
        body, _, _ = add_sub_request_body(binary=False)
        reply = http_request(url, "POST", "/invocations", body)
        assert reply.status == 200 and json.loads(reply.body)["model_name"] == "add_sub"
        refused = http_request(unset_url, "POST", "/invocations", body)
        assert refused.status == 400
        assert "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME is not set" in json.loads(refused.body)["error"]
    finally:
        stop_server(server)
        stop_server(unset)


TARGET = "X-Amzn-SageMaker-Target-Model"


def mme_load(url, model_hash, directory, target):
    body = json.dumps({"model_name": model_hash, "url": str(directory)}).encode()
    return http_request(url, "POST", "/models", body, {"Content-Type": "application/json", TARGET: target})


def test_multi_model_endpoints_load_invoke_and_unload(tmp_path):
    models = tmp_path / "opt" / "ml" / "models"
    # A model directory itself (its config.pbtxt at the url), as SageMaker unpacks model.tar.gz.
    single = models / "4a8f" / "model"
    shutil.copytree(BUNDLED_REPO / "add_sub", single)
    # A repository of an ensemble and its composing model.
    pipeline = models / "9c1e" / "model"
    shutil.copytree(FIXTURE_REPO / "ensemble_add_sub", pipeline / "ensemble_add_sub")
    shutil.copytree(BUNDLED_REPO / "add_sub", pipeline / "add_sub")
    broken = models / "0bad" / "model"
    shutil.copytree(FIXTURE_REPO / "broken", broken)
    repo = tmp_path / "repo"
    repo.mkdir()
    port = find_free_port()
    server = start_server([repo], name="sagemaker-mme", extra_args=[
        "--allow-sagemaker=true", "--sagemaker-port", str(port), "--model-control-mode=explicit",
        "--sagemaker-model-root", str(models)])
    url = f"127.0.0.1:{port}"
    try:
        loaded = mme_load(url, "4a8f", single, "resnet.tar.gz")
        assert loaded.status == 200, loaded.body
        listing = {"modelName": "4a8f", "modelUrl": str(single.parent)}
        assert json.loads(http_request(url, "GET", "/models").body) == {"models": [listing]}
        assert json.loads(http_request(url, "GET", "/models/4a8f").body) == listing
        assert http_request(url, "GET", "/models/ffff").status == 404
        # Invoked under its target name, with the infer body, binary tensors included.
        body, json_size, a = add_sub_request_body(binary=True)
        reply = http_request(url, "POST", "/models/4a8f/invoke", body,
                             {"Content-Type": f"{BINARY}{json_size}", TARGET: "resnet.tar.gz"})
        assert reply.status == 200, reply.body
        content_type = reply.headers["content-type"]
        result = httpclient.InferenceServerClient.parse_response_body(
            reply.body, header_length=int(content_type[len(BINARY):]))
        assert result.get_response()["model_name"] == "resnet.tar.gz"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
        # The same model through the v2 API, under the same name.
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("resnet.tar.gz")
        # A hash or a target that is taken.
        assert mme_load(url, "4a8f", single, "resnet.tar.gz").status == 409
        assert mme_load(url, "5b00", single, "resnet.tar.gz").status == 409

        # An ensemble's repository: the ensemble answers under the target name, its step under
        # its own.
        assert mme_load(url, "9c1e", pipeline, "pipeline.tar.gz").status == 200
        body, _, a = add_sub_request_body(binary=False)
        request = json.loads(body)
        for tensor, name in zip(request["inputs"], ("A", "B")):
            tensor["name"] = name
        request.pop("outputs", None)
        reply = http_request(url, "POST", "/models/9c1e/invoke", json.dumps(request).encode(),
                             {"Content-Type": "application/json", TARGET: "pipeline.tar.gz"})
        assert reply.status == 200, reply.body
        outputs = {o["name"]: o["data"] for o in json.loads(reply.body)["outputs"]}
        assert outputs["TWICE_A"] == (2 * a).ravel().tolist()
        assert client.is_model_ready("add_sub")

        # Loads that fail: a system path, a directory without a model, a model that fails to
        # load (its repository is unregistered again, so the hash stays free).
        assert mme_load(url, "0dev", "/proc/self", "x.tar.gz").status == 400
        empty = models / "0000" / "model"
        empty.mkdir(parents=True)
        assert "no model directory" in json.loads(mme_load(url, "0000", empty, "e.tar.gz").body)["error"]
        failed = mme_load(url, "0bad", broken, "broken.tar.gz")
        assert failed.status == 400 and "load failed for model 'broken.tar.gz'" in json.loads(failed.body)["error"]
        assert http_request(url, "GET", "/models/0bad").status == 404

        # Unloads: the model, then the ensemble with its step.
        assert http_request(url, "DELETE", "/models/4a8f").status == 200
        assert http_request(url, "GET", "/models/4a8f").status == 404
        assert http_request(url, "POST", "/models/4a8f/invoke", body, {TARGET: "resnet.tar.gz"}).status == 404
        assert http_request(url, "DELETE", "/models/4a8f").status == 404
        assert not client.is_model_ready("resnet.tar.gz")
        assert http_request(url, "DELETE", "/models/9c1e").status == 200
        assert not client.is_model_ready("pipeline.tar.gz") and not client.is_model_ready("add_sub")
        assert json.loads(http_request(url, "GET", "/models").body) == {"models": []}
        # Loaded again after its unload: its repository was unregistered with it.
        assert mme_load(url, "4a8f", single, "resnet.tar.gz").status == 200
        server.assert_alive()
    finally:
        stop_server(server)


# A Python model that fails as asked: X = 1 raises MemoryError, X = 2 answers a TritonError that
# says CUDA ran out of memory, X = 3 raises another exception.
PY_FAILING = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            if value == 1:
                raise MemoryError("the arena is exhausted")
            if value == 2:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "CUDA out of memory. Tried to allocate 2.00 GiB")))
                continue
            if value == 3:
                raise ValueError("three is a bad number")
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("Y", np.array([value], dtype=np.int32))]))
        return responses
'''

PY_FAILING_CONFIG = '''
name: "py_failing"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''


def test_multi_model_invocations_that_run_out_of_memory_are_507(tmp_path):
    """As Triton's SageMaker service: an invocation whose error says memory ran out is 507
    (SageMaker unloads other models and tries again), any other failure 400, each with the
    error's own JSON body."""
    model = tmp_path / "opt" / "ml" / "models" / "7e57" / "model"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(PY_FAILING_CONFIG)
    (model / "1" / "model.py").write_text(PY_FAILING)
    repo = tmp_path / "repo"
    repo.mkdir()
    port = find_free_port()
    # The stub runs under this interpreter (it has numpy).
    server = start_server([repo], name="sagemaker-mme-oom", env={"KILN_PYTHON": sys.executable}, extra_args=[
        "--allow-sagemaker=true", "--sagemaker-port", str(port), "--model-control-mode=explicit",
        "--sagemaker-model-root", str(model.parent.parent)])
    url = f"127.0.0.1:{port}"

    def invoke(value):
        request = {"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [value]}]}
        reply = http_request(url, "POST", "/models/7e57/invoke", json.dumps(request).encode(),
                             {"Content-Type": "application/json", TARGET: "failing.tar.gz"})
        return reply.status, json.loads(reply.body)

    try:
        loaded = mme_load(url, "7e57", model, "failing.tar.gz")
        assert loaded.status == 200, loaded.body
        status, body = invoke(5)
        assert status == 200 and body["outputs"][0]["data"] == [5], body
        status, body = invoke(1)
        assert status == 507 and "MemoryError: the arena is exhausted" in body["error"], body
        assert invoke(2) == (507, {"error": "CUDA out of memory. Tried to allocate 2.00 GiB"})
        status, body = invoke(3)
        assert status == 400 and "ValueError: three is a bad number" in body["error"], body
        # A request the model never sees is 400 too.
        refused = http_request(url, "POST", "/models/7e57/invoke", b'{"inputs": []}',
                               {"Content-Type": "application/json", TARGET: "failing.tar.gz"})
        assert refused.status == 400, refused.body
        server.assert_alive()
    finally:
        stop_server(server)
