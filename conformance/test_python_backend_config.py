"""Triton's Python backend (see test_python_backend_basics.py): a model's configuration. Its code
completes what config.pbtxt leaves out (`auto_complete_config`), and the load fails where the two
disagree; `model_warmup` samples run before the model serves, counted as Triton 2.51 counts them,
and a sample that fails fails the load."""

from __future__ import annotations

import numpy as np
import requests
import tritonclient.grpc as grpcclient

from conftest import RPC_TIMEOUT


def test_auto_complete_config_declares_what_the_config_leaves_out(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    config = client.get_model_config("py_auto").config
    assert config.max_batch_size == 4 and config.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("X", 11, [2])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("NEGATED", [2])]
    x = grpcclient.InferInput("X", [3, 2], "FP32")
    x.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(3, 2))
    np.testing.assert_array_equal(client.infer("py_auto", [x]).as_numpy("NEGATED"), -np.arange(6).reshape(3, 2))
    entry = next(m for m in client.get_model_repository_index().models if m.name == "py_auto_conflict")
    assert entry.state == "UNAVAILABLE"
    # Triton 2.51's words (its index says "Internal: ValueError: unable to load model ..."):
    # python_backend src/resources/triton_python_backend_utils.py, ModelConfig's auto-complete.
    assert "ValueError: unable to load model 'py_auto_conflict', configuration expects datatype TYPE_FP32 for " \
           "input 'X', model provides TYPE_INT32" in entry.reason, entry.reason


def test_warmup_samples_run_before_the_model_serves(python_server):
    server, _ = python_server
    notes = server.repos[0].parent / "warm_notes"
    # Sample "ones" (batch 2 of the file's element), twice, on the one instance: as Triton 2.51
    # sends it, two requests of one element in each execute call.
    assert notes.read_text().splitlines() == ["2 [[1.5]]"] * 4
    assert "model 'py_warm': 1 instance(s) warmed up with sample 'ones'" in server.log_text()  # kiln's log line
    client = grpcclient.InferenceServerClient(server.grpc_url)
    # The statistics count the samples, as Triton 2.51's do: 4 requests in 2 executions of 2.
    stats = client.get_inference_statistics("py_warm").model_stats[0]
    assert (stats.inference_count, stats.execution_count, stats.inference_stats.success.count) == (4, 2, 4)
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(2, 2)]
    metrics = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
    assert 'nv_inference_count{model="py_warm",version="1"} 4' in metrics
    entry = next(m for m in client.get_model_repository_index().models if m.name == "py_warm_fail")
    assert entry.state == "UNAVAILABLE"
    # "failed to warm up model ... with sample ...: " is kiln's; the rest is python_backend's (below).
    assert ("failed to warm up model 'py_warm_fail' with sample 'ones': Failed to process the request(s) for "
            "model 'py_warm_fail_0', message: ValueError: negative warmup") in entry.reason, entry.reason
