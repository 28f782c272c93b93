"""Triton's Python backend: models whose `model.py` defines `TritonPythonModel`, written as Triton's
own examples write them (`import triton_python_backend_utils as pb_utils`), served by kiln and
driven with tritonclient over both protocols. The basics: a Python add_sub answers what the ONNX
add_sub answers, on two instances under concurrent load; the model docs/models.md shows runs;
every datatype goes through numpy (and DLPack) and back; a request's inputs come in Triton's
order; strings, request ids and parameters reach the model; the response sender of a
non-decoupled model; an ensemble runs a Python step before an ONNX one.

The suite's files, test_python_backend_<feature>.py (basics, batching, calls, config, decoupled,
environment, errors, metrics, tracing), share one server, `python_server`: one kiln for the
session, serving the models of fixtures/python_backend/ (see python_backend_models.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from python_backend_models import add_sub_inputs

# py_identity's inputs and outputs: IN_<type> and OUT_<type> (its config.pbtxt; BYTES is TYPE_STRING).
TYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64",
         "BYTES"]


def test_a_python_model_answers_what_the_onnx_model_answers(python_server):
    server, _ = python_server
    rng = np.random.default_rng(7)
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    http_client = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    for module, client in ((grpcclient, grpc_client), (httpclient, http_client)):
        a = rng.standard_normal((3, 16), dtype=np.float32)
        b = rng.standard_normal((3, 16), dtype=np.float32)
        python = client.infer("py_add_sub", add_sub_inputs(module, a, b))
        onnx = client.infer("add_sub", add_sub_inputs(module, a, b))
        for name in ("OUTPUT0", "OUTPUT1"):
            np.testing.assert_array_equal(python.as_numpy(name), onnx.as_numpy(name))
    # Concurrent requests share the two instances and each gets its own answer.
    def one(seed):
        a = np.full((1, 16), seed, dtype=np.float32)
        b = np.arange(16, dtype=np.float32).reshape(1, 16)
        result = grpc_client.infer("py_add_sub", add_sub_inputs(grpcclient, a, b))
        return np.array_equal(result.as_numpy("OUTPUT0"), a + b)
    with ThreadPoolExecutor(16) as pool:
        assert all(pool.map(one, range(64)))
    stats = grpc_client.get_inference_statistics("py_add_sub").model_stats[0]
    # Rows: two requests of 3, then 64 of 1.
    assert stats.inference_stats.success.count == 66 and stats.inference_count == 70
    assert 0 < stats.execution_count <= 66
    config = grpc_client.get_model_config("py_add_sub").config
    assert config.backend == "python" and config.default_model_filename == "model.py"
    # Triton's metadata names the backend of a model without a platform.
    assert grpc_client.get_model_metadata("py_add_sub").platform == "python"
    assert http_client.get_model_metadata("py_add_sub")["platform"] == "python"
    assert [g.name for g in config.instance_group] == ["py_add_sub_0"]
    assert [g.name for g in grpc_client.get_model_config("py_faulty").config.instance_group] == ["py_faulty"]
    log = server.log_text()
    assert "initialized py_add_sub_0_0 (CPU)" in log and "initialized py_add_sub_0_1 (CPU)" in log
    assert "a print does not disturb kiln" in log


def test_the_readme_model_runs(python_server):
    server, _ = python_server
    x = httpclient.InferInput("INPUT0", [3], "FP32")
    x.set_data_from_numpy(np.array([1, 2.5, -4], dtype=np.float32))
    result = httpclient.InferenceServerClient(server.http_url).infer("py_readme", [x])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [2, 5, -8])


@pytest.mark.parametrize("via", ["numpy", "dlpack"])
def test_every_datatype_goes_through_numpy_and_back(python_server, via):
    server, _ = python_server
    rng = np.random.default_rng(3)
    inputs, expected = [], {}
    for t in TYPES:
        if t == "BYTES":
            value = np.array([[b"a", b"\x00\xff", b""], [b"kiln", b"x" * 300, "\u00e9".encode()]], dtype=np.object_)
        elif t == "BOOL":
            value = rng.integers(0, 2, (2, 3)).astype(bool)
        else:
            dtype = np.dtype({"FP16": "float16", "FP32": "float32", "FP64": "float64"}.get(t, t.lower()))
            info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
            value = np.array([[info.min, info.max, 0], [1, 2, 3]], dtype=dtype)
        tensor = grpcclient.InferInput(f"IN_{t}", list(value.shape), t)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
        expected[f"OUT_{t}"] = value
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("py_identity", inputs, parameters={"via": via})
    for name, value in expected.items():
        np.testing.assert_array_equal(result.as_numpy(name), value, err_msg=name)


@pytest.mark.parametrize("sent, listed", [
    (TYPES, "BOOL INT8 INT16 INT64 UINT8 UINT16 BYTES UINT32 UINT64 INT32 FP16 FP32 FP64"),
    (TYPES[::-1], "BYTES UINT16 FP64 FP32 FP16 INT64 INT16 INT8 BOOL INT32 UINT64 UINT32 UINT8"),
])
def test_request_inputs_come_in_tritons_order(python_server, sent, listed):
    # Triton's request.inputs() walks its core's hash maps of the request's inputs, so its order
    # follows the order the client sent them in (first list checked against Triton 2.51; see
    # bench/triton_parity.sh). py_identity answers in the order it was given its inputs.
    server, _ = python_server
    inputs = []
    for t in sent:
        tensor = grpcclient.InferInput(f"IN_{t}", [1, 1], t)
        tensor.set_data_from_numpy(np.array([[b"x" if t == "BYTES" else 1]], dtype=object if t == "BYTES" else
                                            bool if t == "BOOL" else t.lower().replace("fp", "float")))
        inputs.append(tensor)
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("py_identity", inputs)
    assert " ".join(o.name[4:] for o in result.get_response().outputs) == listed


def test_strings_ids_parameters_and_the_response_sender_reach_the_model(python_server):
    server, _ = python_server
    client = httpclient.InferenceServerClient(server.http_url)
    text = httpclient.InferInput("TEXT", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"kiln", "f\u00fcr".encode()], dtype=np.object_))
    outputs = [httpclient.InferRequestedOutput(n) for n in ("UPPER", "ID", "PARAMETERS", "ASKED")]
    # The parameters the server acts on (the schedule policy's, a sequence's) are not the
    # model's, as Triton takes them out.
    result = client.infer("py_echo", [text], outputs=outputs[::-1], request_id="req-7", priority=1,
                          timeout=60_000_000, parameters={"mode": "loud", "level": 3})
    assert [t.decode() for t in result.as_numpy("UPPER")] == ["KILN", "F\u00dcR"]
    assert result.as_numpy("ID")[0] == b"req-7"
    # In the order the client sent them, as Triton's (bench/triton_parity.sh --json).
    assert result.as_numpy("PARAMETERS")[0] == b'{"mode":"loud","level":3}'
    # requested_output_names() is a set, as Triton's (the model sorts it).
    assert result.as_numpy("ASKED")[0] == b"ASKED,ID,PARAMETERS,UPPER"
    # Asking for none is asking for every output, as Triton tells the model.
    every = client.infer("py_echo", [text])
    assert every.as_numpy("ASKED")[0] == b"ASKED,ID,PARAMETERS,UPPER"
    # Only what was asked for comes back.
    only = client.infer("py_echo", [text], outputs=[httpclient.InferRequestedOutput("UPPER")])
    assert only.get_output("ID") is None and only.as_numpy("UPPER").shape == (2,)


def test_an_ensemble_runs_a_python_step_then_an_onnx_one(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    z = np.ones((2, 16), dtype=np.float32)
    inputs = [grpcclient.InferInput("X", [2, 16], "FP32"), grpcclient.InferInput("Z", [2, 16], "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(z)
    np.testing.assert_array_equal(client.infer("double_then_add", inputs).as_numpy("SUM"), 2 * x + z)
