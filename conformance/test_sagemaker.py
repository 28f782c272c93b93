"""Triton's SageMaker service (`--allow-sagemaker=true`): `/ping` follows readiness and
`/invocations` runs one model with the infer endpoint's body, JSON or binary (SageMaker's
`application/vnd.sagemaker-triton.binary+json;json-header-size=N` content type), through
tritonclient's own request builder and response parser; errors are 400 as Triton answers them."""

from __future__ import annotations

import json
import shutil

import numpy as np
import tritonclient.http as httpclient

from conftest import (BUNDLED_REPO, add_sub_request_body, find_free_port, http_request, start_server,
                      stop_server)

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
        assert http_request(url, "GET", "/models").status == 404
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
