"""Triton's Vertex AI service (on with AIP_MODE=PREDICTION, as in Triton): the health route
follows readiness, the predict route runs the default model with the infer endpoint's body (JSON
or Vertex AI's binary content type, through tritonclient's builder and parser), and
`X-Vertex-Ai-Triton-Redirect` sends a prediction request to any REST endpoint with the method
that endpoint takes, or to the metrics. Without the routes the server does not start, with Triton's message."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import tritonclient.http as httpclient

from conftest import (BUNDLED_REPO, STARTUP_TIMEOUT, add_sub_request_body, find_free_port, http_request,
                      kiln_bin, start_server, stop_server)

BINARY = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
ROUTES = {"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "/v1/endpoints/e/deployedModels/m:predict",
          "AIP_HEALTH_ROUTE": "/v1/endpoints/e/deployedModels/m"}


def test_health_predict_and_redirects():
    port = find_free_port()
    url = f"127.0.0.1:{port}"
    env = dict(ROUTES, AIP_HTTP_PORT=str(port))
    server = start_server([BUNDLED_REPO], name="vertex", env=env,
                          extra_args=["--vertex-ai-default-model=add_sub"])
    try:
        health = http_request(url, "GET", ROUTES["AIP_HEALTH_ROUTE"])
        assert health.status == 200 and json.loads(health.body) == {"ready": True}
        predict = ROUTES["AIP_PREDICT_ROUTE"]
        body, _, a = add_sub_request_body(binary=False)
        reply = http_request(url, "POST", predict, body, {"Content-Type": "application/json"})
        assert reply.status == 200, reply.body
        assert json.loads(reply.body)["outputs"][0]["data"] == (a + 1).ravel().tolist()
        body, json_size, a = add_sub_request_body(binary=True)
        reply = http_request(url, "POST", predict, body, {"Content-Type": f"{BINARY}{json_size}"})
        assert reply.status == 200, reply.body
        content_type = reply.headers["content-type"]
        assert content_type.startswith(BINARY)
        result = httpclient.InferenceServerClient.parse_response_body(
            reply.body, header_length=int(content_type[len(BINARY):]))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 1)
        # Redirects: a read (GET behind Vertex AI's POST) and another model's infer.
        config = http_request(url, "POST", predict, b"",
                              {"X-Vertex-Ai-Triton-Redirect": "v2/models/mlp_classifier/config"})
        assert config.status == 200 and json.loads(config.body)["name"] == "mlp_classifier"
        body, _, a = add_sub_request_body(binary=False)
        redirected = http_request(url, "POST", predict, body,
                                  {"X-Vertex-Ai-Triton-Redirect": "v2/models/add_sub/versions/1/infer"})
        assert redirected.status == 200 and json.loads(redirected.body)["model_version"] == "1"
        missing = http_request(url, "POST", predict, body,
                               {"X-Vertex-Ai-Triton-Redirect": "v2/models/nope/infer"})
        assert missing.status == 404
        # The metrics, as the metrics port publishes them.
        metrics = http_request(url, "POST", predict, b"", {"X-Vertex-Ai-Triton-Redirect": "metrics"})
        assert metrics.status == 200 and metrics.headers["content-type"].startswith("text/plain")
        assert 'nv_inference_request_success{model="add_sub",version="1"}' in metrics.body.decode()
        # Errors keep the REST API's status codes.
        bad = http_request(url, "POST", predict, b'{"inputs": []}')
        assert bad.status == 400 and "expected 2 inputs" in json.loads(bad.body)["error"]
    finally:
        stop_server(server)


def test_the_routes_are_required():
    env = {"AIP_MODE": "PREDICTION", "PATH": "/usr/bin:/bin"}
    failed = subprocess.run(
        [str(kiln_bin()), "--model-repository", str(BUNDLED_REPO), "--grpc-port", "0",
         "--http-port", "0", "--allow-metrics=false", "--vertex-ai-port", "0"],
        capture_output=True, timeout=STARTUP_TIMEOUT, env=env)
    assert failed.returncode == 1
    assert b"API_PREDICT_ROUTE is not defined for Vertex AI endpoint" in failed.stderr
