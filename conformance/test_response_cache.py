"""Triton's response cache through tritonclient: `--cache-config local,size=N` on the server,
`response_cache { enable: true }` on a model. A request identical to an earlier one (model,
version, inputs) is answered without running, over either protocol; its statistics and metrics
say so; requested outputs are still chosen per request; models without the setting never hit.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import BUNDLED_REPO, RPC_TIMEOUT, start_server, stop_server

T = RPC_TIMEOUT


@pytest.fixture(scope="module")
def cached():
    srv = start_server([BUNDLED_REPO], name="kiln-cache", env={"KILN_PYTHON": sys.executable},
                       extra_args=["--model-control-mode", "explicit", "--load-model", "mlp_classifier",
                                   "--allow-code-in-load-overrides",  # a model.py comes with a load
                                   "--cache-config", "local,size=1048576",
                                   "--metrics-config", "summary_latencies=true"])
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
    # With summary_latencies, Triton's cache summaries; no request summary (hits would read as
    # impossibly fast executions).
    assert metric(cached, "nv_cache_hit_summary_per_model_count", "add_sub") == 2
    assert metric(cached, "nv_cache_miss_summary_per_model_count", "add_sub") == 2
    assert metric(cached, "nv_inference_queue_summary_us_count", "add_sub") == 4
    assert metric(cached, "nv_inference_request_summary_us_count", "add_sub") == 0
    # A hit counts as queued, as Triton counts it (bench/triton_parity.sh --json).
    queue = http.get_inference_statistics("add_sub")["model_stats"][-1]["inference_stats"]["queue"]["count"]
    assert queue == 4
    # The whole cache's gauges, Triton's names.
    with urllib.request.urlopen(f"http://{cached.metrics_url}/metrics", timeout=T) as response:
        text = response.read().decode()
    gauges = dict(re.findall(r"^(nv_cache_[a-z_]+) (\S+)$", text, flags=re.M))
    assert {"nv_cache_util", "nv_cache_num_entries", "nv_cache_num_lookups", "nv_cache_num_evictions",
            "nv_cache_lookup_duration", "nv_cache_insertion_duration"} <= set(gauges), gauges
    assert float(gauges["nv_cache_num_hits"]) >= 2 and float(gauges["nv_cache_num_misses"]) >= 2
    assert float(gauges["nv_cache_num_entries"]) >= 2 and 0 < float(gauges["nv_cache_util"]) < 1


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


# Counts its executions: a cached answer repeats the count of the execution that made it. With
# parameter "also" it answers only what was asked, and with "tag" it gives its response a
# parameter of its own.
PY_COUNTING = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.runs += 1
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            outputs = [pb_utils.Tensor("RUNS", np.array([[self.runs]], dtype=np.int32)),
                       pb_utils.Tensor("TWICE", 2 * x)]
            asked = request.requested_output_names()
            outputs = [o for o in outputs if o.name() in asked]
            tag = json.loads(request.parameters()).get("tag")
            responses.append(pb_utils.InferenceResponse(outputs, parameters={"tag": tag} if tag else None))
        return responses
'''


def test_a_python_models_answers_are_cached_too(cached):
    http = httpclient.InferenceServerClient(cached.http_url, network_timeout=T)
    http.load_model("py_counting", config=json.dumps({
        "name": "py_counting", "backend": "python", "max_batch_size": 4,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
        "output": [{"name": "RUNS", "data_type": "TYPE_INT32", "dims": [1]},
                   {"name": "TWICE", "data_type": "TYPE_FP32", "dims": [2]}],
        "response_cache": {"enable": True},
    }), files={"file:1/model.py": PY_COUNTING.encode()})

    def ask(value, outputs=None, parameters=None):
        x = httpclient.InferInput("X", [1, 2], "FP32")
        x.set_data_from_numpy(np.full((1, 2), value, dtype=np.float32))
        wanted = [httpclient.InferRequestedOutput(o) for o in outputs] if outputs else None
        return http.infer("py_counting", [x], outputs=wanted, parameters=parameters)

    # Asking for one output: the model leaves the other out, so that answer is not cached.
    assert ask(1.0, outputs=["TWICE"]).as_numpy("TWICE").tolist() == [[2.0, 2.0]]
    assert ask(1.0).as_numpy("RUNS").tolist() == [[2]]
    # The whole answer is: the same request again is the cache's, the run count unchanged.
    again = ask(1.0)
    assert again.as_numpy("RUNS").tolist() == [[2]] and again.as_numpy("TWICE").tolist() == [[2.0, 2.0]]
    assert ask(1.0, outputs=["TWICE"]).get_response()["outputs"][0]["name"] == "TWICE"
    assert stats(http, "py_counting")["hit"] == 2
    # Its cache series too, as any cached model's.
    assert metric(cached, "nv_cache_num_hits_per_model", "py_counting") == 2
    # A response with parameters of its own is not cached (the cache keeps tensors only).
    assert ask(3.0, parameters={"tag": "t"}).get_response()["parameters"] == {"tag": "t"}
    assert ask(3.0).as_numpy("RUNS").tolist() == [[4]]


PY_SLOW = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.3)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
'''


def test_a_miss_costs_its_lookup_and_insertion_not_the_run(tmp_path):
    """Triton's cache_miss time is the lookup and the insertion of a miss: the model's run between
    them is compute time, not the cache's. A model that takes 300 ms shows it: the miss costs a
    small part of the compute time (a miss that counted the run would cost more than it)."""
    repo = tmp_path / "repo"
    (repo / "py_slow" / "1").mkdir(parents=True)
    (repo / "py_slow" / "1" / "model.py").write_text(PY_SLOW)
    (repo / "py_slow" / "config.pbtxt").write_text(
        'name: "py_slow" backend: "python" max_batch_size: 0 response_cache { enable: true }\n'
        'input [{ name: "X" data_type: TYPE_FP32 dims: [1] }]\n'
        'output [{ name: "Y" data_type: TYPE_FP32 dims: [1] }]\n')
    srv = start_server([repo], name="kiln-cache-slow", env={"KILN_PYTHON": sys.executable},
                       extra_args=["--cache-config", "local,size=1048576"])
    try:
        http = httpclient.InferenceServerClient(srv.http_url, network_timeout=T)
        x = httpclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.ones(1, np.float32))
        for _ in range(2):
            assert http.infer("py_slow", [x]).as_numpy("Y").tolist() == [1.0]
        s = http.get_inference_statistics("py_slow")["model_stats"][0]["inference_stats"]
        assert (s["cache_miss"]["count"], s["cache_hit"]["count"]) == (1, 1)
        assert int(s["cache_miss"]["ns"]) * 2 < int(s["compute_infer"]["ns"]), s
    finally:
        stop_server(srv)
