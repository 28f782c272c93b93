"""Triton's reserved request parameters, as its current release treats them (server PR #8763,
read at e1db8a603). Its docs (docs/protocol/extension_parameters.md) reserve `sequence_id`,
`sequence_start`, `sequence_end`, `priority`, `timeout`, `headers`, `binary_data_output` and
every key starting with `triton_`. The server refuses only the `triton_` ones in a request's
parameters: REST every one (src/http_server.cc, ParseJsonTritonParams), gRPC all but
`triton_enable_empty_final_response` (src/grpc/infer_handler.cc, SetInferenceRequestMetadata);
the others are its own settings, read as such, and `headers` is a custom parameter to the
server (tritonclient refuses the reserved names before sending). #8763's other refusal, of
forwarded headers with reserved names, has nothing to refuse in kiln, which forwards no headers
(--http-header-forward-pattern and --grpc-header-forward-pattern have no effect)."""

from __future__ import annotations

import json

import grpc
import pytest

from conftest import assert_rpc_error, http_request, infer_request, f32

REST = "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
GRPC = ("parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
        "starting with 'triton_' are allowed: triton_enable_empty_final_response")


def rest_infer(server, parameters):
    body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": list(range(16))}
                       for n in ("INPUT0", "INPUT1")], "parameters": parameters}
    return http_request(server.http_url, "POST", "/v2/models/add_sub/infer", json.dumps(body).encode())


def grpc_infer(server, parameters):
    req = infer_request("add_sub", [("INPUT0", "FP32", [1, 16], f32(range(16))),
                                    ("INPUT1", "FP32", [1, 16], f32(range(16)))])
    for key, value in parameters.items():
        field = {bool: "bool_param", int: "int64_param", str: "string_param"}[type(value)]
        setattr(req.parameters[key], field, value)
    return server.stub().ModelInfer(req, timeout=30)


@pytest.mark.parametrize("key", ["triton_enable_empty_final_response", "triton_x", "triton_"])
def test_rest_refuses_every_triton_key(server, key):
    answer = rest_infer(server, {key: True})
    assert (answer.status, answer.error()) == (400, REST)


def test_grpc_refuses_triton_keys_but_the_empty_final_response(server):
    with pytest.raises(grpc.RpcError) as e:
        grpc_infer(server, {"triton_x": True})
    assert_rpc_error(e.value, grpc.StatusCode.INVALID_ARGUMENT, GRPC)
    assert len(grpc_infer(server, {"triton_enable_empty_final_response": True}).outputs) == 2


def test_the_other_reserved_keys_are_tritons_settings(server):
    for parameters in [{"sequence_id": 0, "sequence_start": False, "sequence_end": False},
                       {"priority": 1, "timeout": 10_000_000}, {"binary_data_output": False}, {"headers": "h"}]:
        answer = rest_infer(server, parameters)
        assert answer.status == 200, (parameters, answer)
        assert len(grpc_infer(server, {k: v for k, v in parameters.items() if k != "binary_data_output"})
                   .outputs) == 2
