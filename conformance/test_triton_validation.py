"""Validation that Triton's current release does and Triton 2.51 did not (issue 34), through the
real binary with tritonclient (gRPC and HTTP) and raw HTTP requests.

Each test checks the status code and the whole message. Where a text comes from Triton, the
comment next to it names the file and function (or Triton's own test that freezes it); where the
searched sources did not hold the new text, the comment says which part is Triton's and which
kiln's.
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

from conftest import (
    BUNDLED_REPO,
    RPC_TIMEOUT,
    assert_rpc_error,
    grpc_error,
    http_request,
    infer_request,
    serialize_bytes,
    start_server,
    stop_server,
)

T = RPC_TIMEOUT
INT64_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def hclient(server):
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=T)
    yield c
    c.close()


@pytest.fixture(scope="module")
def gclient(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def add_sub_inputs(module, batch=1):
    a = np.arange(16 * batch, dtype=np.float32).reshape(batch, 16)
    inputs = []
    for name, arr in (("INPUT0", a), ("INPUT1", np.ones_like(a))):
        inp = module.InferInput(name, list(arr.shape), "FP32")
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs, a


def http_error(reply) -> str:
    return json.loads(reply.body)["error"]


def post_json(server, path: str, body):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    data = data.encode() if isinstance(data, str) else data
    return http_request(server.http_url, "POST", path, data, {"Content-Type": "application/json"})


# --------------------------------------------------------------------------- requested outputs

def test_an_output_asked_for_twice_is_refused(gclient, hclient, alive):
    # Triton's core refuses it while building the request (core PR #493,
    # InferenceRequest::AddOriginalRequestedOutput in src/infer_request.cc; server PR #8741 tests
    # both protocols). The sources searched predate the change: the text is that of its twin for
    # inputs in the same file (AddOriginalInput: "input '<name>' already exists in request").
    expected = "[request id: twice] output 'OUTPUT0' already exists in request"
    inputs, _ = add_sub_inputs(grpcclient)
    outputs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1", "OUTPUT0")]
    with pytest.raises(InferenceServerException) as e:
        gclient.infer("add_sub", inputs, outputs=outputs, request_id="twice", client_timeout=T)
    assert (e.value.status(), e.value.message()) == (str(grpc.StatusCode.INVALID_ARGUMENT), expected)

    inputs, _ = add_sub_inputs(httpclient)
    outputs = [httpclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1", "OUTPUT0")]
    with pytest.raises(InferenceServerException) as e:
        hclient.infer("add_sub", inputs, outputs=outputs, request_id="twice")
    assert (e.value.status(), e.value.message()) == ("400", expected)


# --------------------------------------------------------------------------- classification

def test_class_count_beyond_the_output_is_refused(gclient, hclient, alive):
    # mlp_classifier's OUTPUT0 has 10 elements per batch item. Triton 2.51 answered min(k, 10)
    # (server src/classification.cc, AddClassResults); its current release refuses the count.
    # The searched sources predate the change: the text is kiln's.
    expected = "requested class count 11 exceeds the 10 elements of output 'OUTPUT0'"
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    for module, client, status in ((grpcclient, gclient, str(grpc.StatusCode.INVALID_ARGUMENT)),
                                   (httpclient, hclient, "400")):
        inp = module.InferInput("INPUT0", [2, 64], "FP32")
        inp.set_data_from_numpy(x)
        every = client.infer("mlp_classifier", [inp],
                             outputs=[module.InferRequestedOutput("OUTPUT0", class_count=10)])
        assert every.as_numpy("OUTPUT0").shape == (2, 10)
        with pytest.raises(InferenceServerException) as e:
            client.infer("mlp_classifier", [inp],
                         outputs=[module.InferRequestedOutput("OUTPUT0", class_count=11)])
        assert (e.value.status(), e.value.message()) == (status, expected)


# --------------------------------------------------------------------------- model names

@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """kiln in explicit mode over add_sub under names with dots and spaces."""
    repo = tmp_path_factory.mktemp("names-repo")
    for name in ("a..b", "my model", "..."):
        shutil.copytree(BUNDLED_REPO / "add_sub", repo / name)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "add_sub"', f'name: "{name}"'))
    srv = start_server([repo], name="kiln-names", extra_args=["--model-control-mode", "explicit"])
    yield srv
    stop_server(srv)


def test_names_that_cannot_leave_the_repository_are_models(named):
    # Triton refuses only what escapes the repository once joined to its path (server PR #8400);
    # dots and spaces are parts of names. ("..." starts with a dot: kiln's listing skips hidden
    # directories, so it is loaded by name here and not looked for in the index.)
    g = grpcclient.InferenceServerClient(named.grpc_url)
    h = httpclient.InferenceServerClient(named.http_url, network_timeout=T)
    try:
        listed = {m["name"] for m in h.get_model_repository_index()}
        assert {"a..b", "my model"} <= listed
        g.load_model("a..b", client_timeout=T)
        g.load_model("...", client_timeout=T)
        h.load_model("my model")  # tritonclient quotes it: my%20model
        for client, module in ((g, grpcclient), (h, httpclient)):
            for model in ("a..b", "...", "my model"):
                inputs, a = add_sub_inputs(module)
                result = client.infer(model, inputs)
                np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + 1)
        h.unload_model("a..b")
        g.unload_model("my model", client_timeout=T)
    finally:
        g.close()
        h.close()


def test_only_names_that_escape_are_refused_with_tritons_texts(named):
    # kiln's texts since the lifecycle work (tests/integration/lifecycle_overrides.rs); the rule
    # is Triton's: separators, '.' or '..' as the whole name once trimmed, NUL. Triton main (core
    # src/model_repository_manager/model_repository_manager.cc, ValidateModelName) trims the name
    # and has its own text for one left empty; it checks the names it loads only, so unloading
    # any of them succeeds (qa/L0_input_validation; conformance/test_triton_main_texts.py).
    g = grpcclient.InferenceServerClient(named.grpc_url)
    h = httpclient.InferenceServerClient(named.http_url, network_timeout=T)
    try:
        empty = "Model name cannot be empty. Please enter a valid name to deploy."
        refused = {
            "..": "invalid model name '..', model name must not contain path traversal characters",
            ".": "invalid model name '.', model name must not contain path traversal characters",
            " ..": "invalid model name ' ..', model name must not contain path traversal characters",
            "../a..b": "invalid model name '../a..b', model name must not contain path traversal characters",
            "a\\b": "invalid model name 'a\\b', model name must not contain path traversal characters",
            "": empty,
            " \t ": empty,
        }
        for name, message in refused.items():
            with pytest.raises(InferenceServerException) as e:
                g.load_model(name, client_timeout=T)
            assert (e.value.status(), e.value.message()) == (
                str(grpc.StatusCode.INVALID_ARGUMENT), message), name
            g.unload_model(name, client_timeout=T)
        for name in ("..", "a\\b"):
            with pytest.raises(InferenceServerException) as e:
                h.load_model(name)
            assert (e.value.status(), e.value.message()) == ("400", refused[name])
    finally:
        g.close()
        h.close()


def test_a_valid_name_not_in_the_repository_is_an_unknown_model(named):
    # Unloading a model that is not there succeeds in Triton; loading it fails to poll
    # (core src/model_repository_manager/, as conformance/test_lifecycle.py freezes for
    # 'missing'). Names with '..' inside used to be refused as traversal instead.
    g = grpcclient.InferenceServerClient(named.grpc_url)
    h = httpclient.InferenceServerClient(named.http_url, network_timeout=T)
    try:
        g.unload_model("x..y", client_timeout=T)
        h.unload_model("x..y")
        g.unload_model("no such model", client_timeout=T)
        with pytest.raises(InferenceServerException) as e:
            g.load_model("x..y", client_timeout=T)
        assert (e.value.status(), e.value.message()) == (
            str(grpc.StatusCode.INTERNAL), "failed to load 'x..y', failed to poll from model repository")
        with pytest.raises(InferenceServerException) as e:
            h.load_model("x..y")
        assert (e.value.status(), e.value.message()) == (
            "500", "failed to load 'x..y', failed to poll from model repository")
    finally:
        g.close()
        h.close()


# --------------------------------------------------------------------------- shapes and strings

HUGE = 2**60 + 2  # Triton's qa/L0_http/http_test.py test_buffer_size_overflow


@pytest.mark.parametrize("shape,message", [
    # Triton's texts (its HTTP frontend, server PR #8182) are the fragments its test_buffer_size_overflow
    # matches: "causes total element count to exceed maximum size of" and "byte size overflow for
    # input"; the rest (input, model, shape, the limit) is kiln's.
    ([16, HUGE], f"input 'INPUT0' for model 'add_sub' with shape [16,{HUGE}] causes total element "
                 f"count to exceed maximum size of {INT64_MAX}"),
    ([4, HUGE], f"byte size overflow for input 'INPUT0' for model 'add_sub' with shape [4,{HUGE}]: "
                f"byte size exceeds maximum size of {INT64_MAX}"),
])
def test_shapes_whose_size_overflows_over_http(server, alive, shape, message):
    body = {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1.0]},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}]}
    reply = post_json(server, "/v2/models/add_sub/infer", body)
    assert (reply.status, http_error(reply)) == (400, message)


def test_shapes_whose_size_overflows_over_grpc(stub, alive):
    # The same checks on tensors that reach the core: string_echo and ragged_sum take [-1].
    err = grpc_error(stub.ModelInfer, infer_request("string_echo", [("input-1", "BYTES", [2, 2**62], b"")]))
    assert_rpc_error(err, grpc.StatusCode.INVALID_ARGUMENT)
    assert err.details() == (
        f"[request id: <id_unknown>] input 'input-1' for model 'string_echo' with shape [2,{2**62}] "
        f"causes total element count to exceed maximum size of {INT64_MAX}")
    err = grpc_error(stub.ModelInfer, infer_request("ragged_sum", [("INPUT", "FP32", [1, 2**62], b"")]))
    assert_rpc_error(err, grpc.StatusCode.INVALID_ARGUMENT)
    assert err.details() == (
        f"[request id: <id_unknown>] byte size overflow for input 'INPUT' for model 'ragged_sum' "
        f"with shape [1,{2**62}]: byte size exceeds maximum size of {INT64_MAX}")


def test_wrong_number_of_string_elements(gclient, hclient, alive):
    # Triton's texts: core src/infer_request.cc, InferenceRequest::ValidateBytesInputs, frozen
    # by its qa/L0_input_validation/input_validation_test.py test_input_string_shape_validation
    # (one element too many is refused when it is met, so it says 3 of 2).
    strings = np.array([[b"a", b"bc", b"def"]], dtype=np.object_)
    for module, client, status in ((grpcclient, gclient, str(grpc.StatusCode.INVALID_ARGUMENT)),
                                   (httpclient, hclient, "400")):
        inp = module.InferInput("input-1", [1, 3], "BYTES")
        inp.set_data_from_numpy(strings)
        inp.set_shape([1, 2])
        with pytest.raises(InferenceServerException) as e:
            client.infer("string_echo", [inp], request_id="s1")
        assert (e.value.status(), e.value.message()) == (
            status, "[request id: s1] unexpected number of string elements 3 for inference input "
                    "'input-1' for model 'string_echo', expecting 2")
        inp.set_shape([1, 5])
        with pytest.raises(InferenceServerException) as e:
            client.infer("string_echo", [inp], request_id="s2")
        assert (e.value.status(), e.value.message()) == (
            status, "[request id: s2] expected 5 string elements for inference input 'input-1' "
                    "for model 'string_echo', got 3")


# --------------------------------------------------------------------------- JSON nesting

def nested(depth: int, value: str) -> str:
    return "[" * depth + value + "]" * depth


def test_tensor_data_nests_at_most_100_levels(server, alive):
    # Triton's limit and text: server src/http_server.cc, ReadDataFromJson around
    # ReadDataFromJsonHelper's depth check (server PR #8172), frozen by its
    # qa/L0_http/http_test.py test_json_recursion_depth_limit (50 levels pass, 120 fail).
    expected = "Unable to parse 'data': JSON nesting depth exceeds maximum allowed limit (100)"
    values = ",".join(str(float(v)) for v in range(16))
    for depth, ok in ((50, True), (100, True), (101, False), (120, False)):
        strings = ('{"inputs":[{"name":"input-1","shape":[1,1],"datatype":"BYTES","data":%s}]}'
                   % nested(depth, '"hello"'))
        numbers = ('{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":%s},'
                   '{"name":"INPUT1","shape":[1,16],"datatype":"FP32","data":%s}]}'
                   % (nested(depth, values), nested(depth, values)))
        for model, body, output, data in (("string_echo", strings, "output-1", ["hello"]),
                                          ("add_sub", numbers, "OUTPUT1", [0.0] * 16)):
            reply = post_json(server, f"/v2/models/{model}/infer", body)
            if ok:
                assert reply.status == 200, (depth, reply.body[:300])
                out = {o["name"]: o for o in json.loads(reply.body)["outputs"]}[output]
                assert out["data"] == data
            else:
                assert (reply.status, http_error(reply)) == (400, expected), (model, depth)


def test_a_deeply_nested_body_on_the_repository_index(server, alive):
    # Triton parses any depth (rapidjson's iterative mode: common PR #156, TritonJson::Value::Parse
    # in include/triton/common/triton_json.h) and its index reads only a top-level "ready"
    # (server src/http_server.cc, HandleRepositoryIndex): the answer is the index.
    deep = nested(10_000, "1")
    for body, same_as in ((deep, b""), ('{"ready": true, "x": %s}' % deep, b'{"ready": true}'),
                          ('{"ready": false, "x": {"y": %s}}' % deep, b'{"ready": false}')):
        reply = post_json(server, "/v2/repository/index", body)
        plain = post_json(server, "/v2/repository/index", same_as)
        assert (reply.status, plain.status) == (200, 200), reply.body[:300]
        assert json.loads(reply.body) == json.loads(plain.body)
    ready = json.loads(post_json(server, "/v2/repository/index", '{"ready": true}').body)
    assert ready and all(m["state"] == "READY" for m in ready)
