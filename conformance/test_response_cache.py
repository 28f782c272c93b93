"""Triton's response cache through tritonclient: `--cache-config local,size=N` on the server,
`response_cache { enable: true }` on a model. A request identical to an earlier one (model,
version, inputs) is answered without running, over either protocol; its statistics and metrics
say so; requested outputs are still chosen per request; models without the setting never hit.
"""

from __future__ import annotations

import json
import re
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import BUNDLED_REPO, RPC_TIMEOUT, start_server, stop_server

T = RPC_TIMEOUT


@pytest.fixture(scope="module")
def cached():
    srv = start_server([BUNDLED_REPO], name="kiln-cache",
                       extra_args=["--model-control-mode", "explicit", "--load-model", "mlp_classifier",
                                   "--cache-config", "local,size=1048576"])
    http = httpclient.InferenceServerClient(srv.http_url, network_timeout=T)
    tensor = lambda n: {"name": n, "data_type": "TYPE_FP32", "dims": [16]}  # noqa: E731
    http.load_model("add_sub", config=json.dumps({
        "name": "add_sub", "backend": "onnxruntime", "max_batch_size": 8,
        "input": [tensor("INPUT0"), tensor("INPUT1")], "output": [tensor("OUTPUT0"), tensor("OUTPUT1")],
        "response_cache": {"enable": True},
    }))
    yield srv
    stop_server(srv)


def add_sub(client, module, a, outputs=None):
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    requested = None if outputs is None else [module.InferRequestedOutput(o) for o in outputs]
    return client.infer("add_sub", inputs, outputs=requested)


def stats(http, model, version=""):
    s = http.get_inference_statistics(model, version)["model_stats"][-1]  # the latest version
    inference = s["inference_stats"]
    return {"hit": inference["cache_hit"]["count"], "miss": inference["cache_miss"]["count"],
            "success": inference["success"]["count"], "executions": s["execution_count"],
            "inferences": s["inference_count"]}


def metric(server, name, model) -> float:
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=T) as response:
        text = response.read().decode()
    found = re.search(rf'^{name}{{[^}}]*model="{model}"[^}}]*}} (\S+)$', text, flags=re.M)
    return float(found.group(1)) if found else 0.0


def test_identical_requests_are_answered_from_the_cache(cached):
    http = httpclient.InferenceServerClient(cached.http_url, network_timeout=T)
    grpc_client = grpcclient.InferenceServerClient(cached.grpc_url)
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    first = add_sub(http, httpclient, a)
    second = add_sub(http, httpclient, a)
    for result in (first, second):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 1)
    assert stats(http, "add_sub") == {"hit": 1, "miss": 1, "success": 2, "executions": 1, "inferences": 1}

    # The same inputs over gRPC, asking for one output only: still a hit, still that output only.
    only = add_sub(grpc_client, grpcclient, a, outputs=["OUTPUT1"])
    assert [o.name for o in only.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(only.as_numpy("OUTPUT1"), a - 1)

    # Other data is another entry.
    b = a * 2
    np.testing.assert_array_equal(add_sub(http, httpclient, b).as_numpy("OUTPUT0"), b + 1)
    assert stats(http, "add_sub") == {"hit": 2, "miss": 2, "success": 4, "executions": 2, "inferences": 2}
    assert metric(cached, "nv_cache_num_hits_per_model", "add_sub") == 2
    assert metric(cached, "nv_cache_num_misses_per_model", "add_sub") == 2
    assert metric(cached, "nv_inference_request_success", "add_sub") == 4
    assert metric(cached, "nv_inference_count", "add_sub") == 2


def test_models_without_the_setting_always_run(cached):
    http = httpclient.InferenceServerClient(cached.http_url, network_timeout=T)
    x = httpclient.InferInput("INPUT0", [1, 64], "FP32")
    x.set_data_from_numpy(np.ones((1, 64), dtype=np.float32))
    before = stats(http, "mlp_classifier")
    results = [http.infer("mlp_classifier", [x]).as_numpy("OUTPUT0") for _ in range(3)]
    np.testing.assert_array_equal(results[0], results[2])
    after = stats(http, "mlp_classifier")
    assert (after["hit"], after["miss"], after["executions"] - before["executions"]) == (0, 0, 3)
    assert metric(cached, "nv_cache_num_hits_per_model", "mlp_classifier") == 0
