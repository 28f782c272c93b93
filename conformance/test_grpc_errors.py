"""Bad inputs over gRPC: exact status codes and the key parts of Triton's messages
(WIRE.md §f), and the server must still be alive after each one."""

from __future__ import annotations

import struct
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from conftest import (
    RPC_TIMEOUT, assert_rpc_error, assert_triton_error, f32, grpc_error, infer_request, serialize_bytes,
)

T = RPC_TIMEOUT
INV = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND

pytestmark = pytest.mark.usefixtures("alive")  # every test here re-checks liveness afterwards

ONES = f32(np.ones(16))


def add_sub_req(shape0=(1, 16), shape1=(1, 16), data0=None, data1=None, **kw):
    n0, n1 = int(np.prod(shape0)), int(np.prod(shape1))
    return infer_request("add_sub", [
        ("INPUT0", "FP32", shape0, f32(np.ones(n0)) if data0 is None else data0),
        ("INPUT1", "FP32", shape1, f32(np.ones(n1)) if data1 is None else data1)], **kw)


def infer_err(stub, req) -> grpc.RpcError:
    return grpc_error(stub.ModelInfer, req)


# --------------------------------------------------------------------------- model / version lookup

# Triton: core src/model_lifecycle.cc, ModelLifeCycle::GetModel ("'<m>' is not found", "'<m>' version
# <v> is not found", "'<m>' has no available versions", "... is not at ready state"), prefixed with
# "Request for unknown model: " by ModelRepositoryManager::GetModel
# (src/model_repository_manager/model_repository_manager.cc).

@pytest.mark.parametrize("rpc,req", [
    ("ModelInfer", service_pb2.ModelInferRequest(model_name="no_such_model")),
    ("ModelMetadata", service_pb2.ModelMetadataRequest(name="no_such_model")),
    ("ModelConfig", service_pb2.ModelConfigRequest(name="no_such_model")),
])
def test_unknown_model(stub, rpc, req):
    err = grpc_error(getattr(stub, rpc), req)
    assert_rpc_error(err, NOT_FOUND, "Request for unknown model: 'no_such_model' is not found")


def test_unknown_model_via_tritonclient(client):
    inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(np.ones((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as ei:
        client.infer("no_such_model", [inp], client_timeout=T)
    assert_triton_error(ei.value, NOT_FOUND, "Request for unknown model: 'no_such_model' is not found")


def test_empty_model_name(stub):
    # An empty name is an unknown model like any other (Triton core's model lookup).
    req = add_sub_req()
    req.model_name = ""
    err = infer_err(stub, req)
    assert (err.code(), err.details()) == (NOT_FOUND, "Request for unknown model: '' is not found")


@pytest.mark.parametrize("model,version", [("add_sub", "7"), ("versioned", "2"), ("latest_two", "1"),
                                           ("mlp_classifier", "3")])
def test_unknown_or_unserved_version(stub, model, version):
    msg = f"Request for unknown model: '{model}' version {version} is not found"
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    assert_rpc_error(infer_err(stub, req), NOT_FOUND, msg)
    err = grpc_error(stub.ModelMetadata, service_pb2.ModelMetadataRequest(name=model, version=version))
    assert_rpc_error(err, NOT_FOUND, msg)


@pytest.mark.parametrize("version", ["abc", "v1"])
def test_bad_version_string(stub, version):
    # Triton: server src/common.cc, GetModelVersionFromString (std::stol throws: "... '<v>' (details:
    # stol), version should be an integral value > 0"); the assertion holds its two fixed fragments.
    req = add_sub_req(version=version)
    assert_rpc_error(infer_err(stub, req), INV,
                     f"failed to get model version from specified version string '{version}'",
                     "version should be an integral value > 0")
    err = grpc_error(stub.ModelMetadata, service_pb2.ModelMetadataRequest(name="add_sub", version=version))
    assert_rpc_error(err, INV, f"'{version}'")


def test_negative_version(stub):
    # Triton (server src/common.cc, GetModelVersionFromString): std::stol("-1") succeeds, then
    # `*version < 0` gives this text, with its space before the comma.
    err = infer_err(stub, add_sub_req(version="-1"))
    assert (err.code(), err.details()) == (
        INV, "invalid model version specified '-1' , version should be an integral value > 0")


def test_broken_model_no_version(stub):
    req = infer_request("broken", [("INPUT0", "FP32", [1], f32([1.0]))])
    assert_rpc_error(infer_err(stub, req), NOT_FOUND, "Request for unknown model: 'broken' has no available versions")


def test_broken_model_version_not_ready(stub):
    req = infer_request("broken", [("INPUT0", "FP32", [1], f32([1.0]))], version="1")
    assert_rpc_error(infer_err(stub, req), grpc.StatusCode.UNAVAILABLE,
                     "Request for unknown model: 'broken' version 1 is not at ready state")


def test_name_mismatch_model_not_served(stub):
    # Its config names another model, so it fails to load and serves no version: answered as
    # `broken` is (test_broken_model_no_version).
    req = infer_request("name_mismatch", [("INPUT0", "FP32", [1], f32([1.0]))])
    err = infer_err(stub, req)
    assert (err.code(), err.details()) == (
        NOT_FOUND, "Request for unknown model: 'name_mismatch' has no available versions")


# --------------------------------------------------------------------------- tensor validation
# Triton, unless a test says otherwise: core src/infer_request.cc, InferenceRequest::Normalize (input
# count and "Got input(s) ..., but missing required input(s)", batch sizes, batch-size limit,
# data-type, unexpected shape with its NOTE on max_batch_size); core src/model.h/.cc,
# Model::GetInput / Model::GetOutput ("unexpected inference input/output '<n>' for model '<m>'");
# the gRPC front end's own: server src/grpc/infer_handler.cc, InferGRPCToInput ("unable to find data
# for input tensor", "contents field must not be specified when using raw_input_contents") and
# InferGRPCToInputHelper ("unexpected explicit tensor data ... of type ..., expected datatype").

def test_wrong_datatype(client):
    a = grpcclient.InferInput("INPUT0", [1, 16], "FP64")
    a.set_data_from_numpy(np.ones((1, 16), np.float64))
    b = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
    b.set_data_from_numpy(np.ones((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as ei:
        client.infer("add_sub", [a, b], client_timeout=T)
    assert_triton_error(ei.value, INV, "inference input 'INPUT0' data-type is 'FP64', but model 'add_sub' expects 'FP32'")


def test_unknown_datatype_name(stub):
    # Triton's text (TRITONSERVER_StringToDataType gives TYPE_INVALID, refused in Normalize's data-type
    # check) is not frozen here: only the input's name is asserted.
    req = add_sub_req()
    req.inputs[0].datatype = "FLOAT32"
    err = infer_err(stub, req)
    assert_rpc_error(err, INV, "INPUT0")


@pytest.mark.parametrize("model,name,shape,expected", [
    ("add_sub", "INPUT0", [1, 15], "[-1,16]"),
    ("add_sub", "INPUT0", [1, 1, 16], "[-1,16]"),
    ("reshaped", "X", [1, 4], "[-1,2,2]"),
])
def test_wrong_shape_batching_model(stub, model, name, shape, expected):
    n = int(np.prod(shape))
    inputs = [(name, "FP32", shape, f32(np.ones(n)))]
    if model == "add_sub":
        inputs.append(("INPUT1", "FP32", [1, 16], ONES))
    err = infer_err(stub, infer_request(model, inputs))
    got = "[" + ",".join(str(d) for d in shape) + "]"
    assert_rpc_error(err, INV, f"unexpected shape for input '{name}' for model '{model}'",
                     f"Expected {expected}, got {got}", "NOTE: Setting a non-zero max_batch_size")


@pytest.mark.parametrize("model,inputs,expected,got", [
    ("int_div", [("A", "INT32", [2, 2], b"\0" * 16), ("B", "INT32", [4], b"\0" * 16)], "[-1]", "[2,2]"),
    ("scalar", [("X", "FP32", [], f32(1.0))], "[1]", "[]"),
    ("nobatch_dynamic", [("X", "FP32", [2, 3], f32(np.ones(6)))], "[3,-1]", "[2,3]"),
])
def test_wrong_shape_non_batching_model(stub, model, inputs, expected, got):
    err = infer_err(stub, infer_request(model, inputs))
    name = inputs[0][0]
    assert_rpc_error(err, INV, f"unexpected shape for input '{name}' for model '{model}'",
                     f"Expected {expected}, got {got}")
    assert "NOTE: Setting a non-zero max_batch_size" not in err.details()


@pytest.mark.parametrize("model,batch,limit", [("add_sub", 9, 8), ("identity_types", 5, 4)])
def test_batch_too_large(stub, model, batch, limit):
    if model == "add_sub":
        req = add_sub_req((batch, 16), (batch, 16))
    else:
        req = infer_request(model, [(f"IN_{t}", t, [batch, 0], b"") for t in
                                    ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                                     "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16")])
    assert_rpc_error(infer_err(stub, req), INV, f"inference request batch-size must be <= {limit} for '{model}'")


def test_batch_size_differs_between_inputs(stub):
    assert_rpc_error(infer_err(stub, add_sub_req((1, 16), (2, 16))), INV, "batch size does not match other inputs")


def test_missing_input(stub):
    req = infer_request("add_sub", [("INPUT0", "FP32", [1, 16], ONES)])
    assert_rpc_error(infer_err(stub, req), INV, "expected 2 inputs but got 1 inputs for model 'add_sub'",
                     "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']")


def test_unknown_input(stub):
    req = infer_request("add_sub", [("INPUT0", "FP32", [1, 16], ONES), ("BOGUS", "FP32", [1, 16], ONES)])
    assert_rpc_error(infer_err(stub, req), INV, "unexpected inference input 'BOGUS' for model 'add_sub'")


def test_too_many_inputs(stub):
    req = add_sub_req()
    extra = req.inputs.add(name="INPUT2", datatype="FP32")
    extra.shape.extend([1, 16])
    req.raw_input_contents.append(ONES)
    assert_rpc_error(infer_err(stub, req), INV, "expected 2 inputs but got 3 inputs for model 'add_sub'")


def test_unknown_requested_output(stub):
    req = add_sub_req(outputs=["OUTPUT0", "BOGUS"])
    assert_rpc_error(infer_err(stub, req), INV, "unexpected inference output 'BOGUS' for model 'add_sub'")


@pytest.mark.parametrize("nbytes", [60, 68, 0])
def test_raw_byte_size_mismatch(stub, nbytes):
    # Triton: core src/infer_request.cc (its input byte-size check, run when the request is
    # prepared); the whole text "input byte size mismatch for input '<n>' for model '<m>'. Expected
    # <x>, got <y>" is frozen by Triton's own tests (core src/test/input_byte_size_test.cc, server
    # qa/L0_input_validation); the searched copies of core did not show the line itself.
    req = add_sub_req(data0=b"\0" * nbytes)
    assert_rpc_error(infer_err(stub, req), INV, "input byte size mismatch for input 'INPUT0' for model 'add_sub'",
                     f"Expected 64, got {nbytes}")


def test_typed_element_count_mismatch(stub):
    req = infer_request("add_sub", [("INPUT0", "FP32", [1, 16], {"fp32_contents": [1.0] * 15}),
                                    ("INPUT1", "FP32", [1, 16], {"fp32_contents": [1.0] * 16})])
    assert_rpc_error(infer_err(stub, req), INV, "'INPUT0'", "add_sub")


def test_no_data_for_input(stub):
    req = infer_request("add_sub", [("INPUT0", "FP32", [1, 16], ONES), ("INPUT1", "FP32", [1, 16], None)])
    assert_rpc_error(infer_err(stub, req), INV,
                     "unable to find data for input tensor 'INPUT1' for model 'add_sub' in request.")


def test_typed_contents_of_wrong_kind(stub):
    req = infer_request("add_sub", [("INPUT0", "FP32", [1, 16], {"int_contents": list(range(16))}),
                                    ("INPUT1", "FP32", [1, 16], {"fp32_contents": [1.0] * 16})])
    assert_rpc_error(infer_err(stub, req), INV,
                     "unexpected explicit tensor data for input tensor 'INPUT0' for model 'add_sub' of type "
                     "'INT32', expected datatype 'FP32'")


def test_typed_and_raw_mixed(stub):
    req = infer_request("add_sub", [("INPUT0", "FP32", [1, 16], {"fp32_contents": [1.0] * 16}),
                                    ("INPUT1", "FP32", [1, 16], ONES)])
    assert_rpc_error(infer_err(stub, req), INV,
                     "contents field must not be specified when using raw_input_contents for 'INPUT0' "
                     "for model 'add_sub'")


# --------------------------------------------------------------------------- BYTES framing

@pytest.mark.parametrize("shape,raw", [
    ([1, 1], struct.pack("<I", 16) + b"abc"),                 # length prefix past the end
    ([1, 1], struct.pack("<I", 2**32 - 1) + b"abc"),          # absurd length prefix
    ([1, 1], b"\x01\x00"),                                    # truncated length prefix
    ([1, 2], struct.pack("<I", 3) + b"abc"),                  # fewer elements than the shape
    ([1, 1], struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"b"),  # more elements than the shape
    ([1, 1], b""),                                            # no element at all
])
def test_malformed_bytes_framing(stub, shape, raw):
    req = infer_request("string_echo", [("input-1", "BYTES", shape, raw)])
    assert_rpc_error(infer_err(stub, req), INV, "'input-1'")


@pytest.mark.parametrize("shape,elements", [([1, 3], [b"a", b"b"]), ([1, 1], [b"a", b"b"])])
def test_bytes_element_count_mismatch(stub, shape, elements):
    # Triton: core src/infer_request.cc, InferenceRequest::ValidateBytesInputs:
    #         "expected 3 string elements for inference input 'X' for model 'M', got 2" /
    #         "unexpected number of string elements 2 for inference input 'X' ..., expecting 1"
    req = infer_request("string_echo", [("input-1", "BYTES", shape, serialize_bytes(elements))])
    assert_rpc_error(infer_err(stub, req), INV, "string elements", "'input-1'")


def test_typed_bytes_count_mismatch(stub):
    req = infer_request("string_echo", [("input-1", "BYTES", [1, 3], {"bytes_contents": [b"a", b"b"]})])
    assert_rpc_error(infer_err(stub, req), INV, "'input-1'")


# --------------------------------------------------------------------------- hostile shapes

INT64_MAX = 2**63 - 1
ID = "[request id: <id_unknown>] "
NOTE = ("NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
        "prepended to each input shape. If you want to specify the full shape including the batch dim in "
        "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
        "more info on max_batch_size.")
# Each shape with the whole answer. The texts are Triton core's (InferenceRequest::Normalize: batch
# sizes, batch-size limit, unexpected shape; server PR #8182: element count and byte size overflow;
# ValidateBytesInputs: string elements; test_triton_validation.py has their sources), except
# "invalid shape ... is negative", which is kiln's own: Triton's answer to a negative dimension is
# not recorded here. Read on core's InferenceRequest::Normalize, Triton refuses a -1 where the
# config has a variable dimension with "All input dimensions should be specified for input '<n>'
# for model '<m>', got [-1]" (a known difference, docs/compatibility.md).
HOSTILE = [
    ("add_sub", [("INPUT0", "FP32", [2**40, 2**40], ONES), ("INPUT1", "FP32", [1, 16], ONES)],
     "input 'INPUT0' batch size does not match other inputs for 'add_sub'"),
    ("add_sub", [("INPUT0", "FP32", [-5, 16], ONES), ("INPUT1", "FP32", [-5, 16], ONES)],
     "inference request batch-size must be <= 8 for 'add_sub'"),
    ("add_sub", [("INPUT0", "FP32", [1, -16], ONES), ("INPUT1", "FP32", [1, 16], ONES)],
     f"unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,-16]. {NOTE}"),
    ("int_div", [("A", "INT32", [2**62], b"\0" * 4), ("B", "INT32", [2**62], b"\0" * 4)],
     f"byte size overflow for input 'B' for model 'int_div' with shape [{2**62}]: byte size exceeds "
     f"maximum size of {INT64_MAX}"),
    ("int_div", [("A", "INT32", [2**63 - 1], b"\0" * 4), ("B", "INT32", [1], b"\0" * 4)],
     f"byte size overflow for input 'A' for model 'int_div' with shape [{INT64_MAX}]: byte size exceeds "
     f"maximum size of {INT64_MAX}"),
    ("int_div", [("A", "INT32", [-1], b""), ("B", "INT32", [-1], b"")],
     "invalid shape [-1] for input 'B' for model 'int_div': shape dimension -1 is negative"),
    ("int_div", [("A", "INT32", [-(2**63)], b""), ("B", "INT32", [1], b"\0" * 4)],
     f"invalid shape [{-(2**63)}] for input 'A' for model 'int_div': shape dimension {-(2**63)} is negative"),
    ("nobatch_dynamic", [("X", "FP32", [3, 2**62], f32(np.ones(3)))],
     f"input 'X' for model 'nobatch_dynamic' with shape [3,{2**62}] causes total element count to exceed "
     f"maximum size of {INT64_MAX}"),
    ("nobatch_dynamic", [("X", "FP32", [3, 2**61 + 1], f32(np.ones(3)))],
     f"byte size overflow for input 'X' for model 'nobatch_dynamic' with shape [3,{2**61 + 1}]: byte size "
     f"exceeds maximum size of {INT64_MAX}"),
    ("string_echo", [("input-1", "BYTES", [1, 2**40], struct.pack("<I", 1) + b"a")],
     f"expected {2**40} string elements for inference input 'input-1' for model 'string_echo', got 1"),
    ("string_echo", [("input-1", "BYTES", [64, 2**57], struct.pack("<I", 1) + b"a")],
     f"input 'input-1' for model 'string_echo' with shape [64,{2**57}] causes total element count to "
     f"exceed maximum size of {INT64_MAX}"),
    ("reshaped", [("X", "FP32", [4, 2**31, 2**31], f32(np.ones(4)))],
     f"unexpected shape for input 'X' for model 'reshaped'. Expected [-1,2,2], got [4,{2**31},{2**31}]. {NOTE}"),
]


@pytest.mark.parametrize("model,inputs,message", HOSTILE, ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(HOSTILE)])
def test_hostile_shape_rejected_fast(stub, model, inputs, message):
    t0 = time.monotonic()
    err = infer_err(stub, infer_request(model, inputs))
    elapsed = time.monotonic() - t0
    assert (err.code(), err.details()) == (INV, ID + message)
    assert elapsed < 5.0, f"rejecting a bogus shape took {elapsed:.1f}s (allocation?)"


def test_bytes_typed_huge_shape(stub):
    req = infer_request("string_echo", [("input-1", "BYTES", [1, 2**40], {"bytes_contents": [b"a"]})])
    assert_rpc_error(infer_err(stub, req), INV, "'input-1'")


# --------------------------------------------------------------------------- parameters

def test_reserved_triton_parameter(stub):
    # Triton: server src/grpc/infer_handler.cc, SetInferenceRequestMetadata (the allowed keys are
    # TRITON_RESERVED_REQUEST_PARAMS joined with spaces).
    req = add_sub_req()
    req.parameters["triton_bogus"].string_param = "x"
    assert_rpc_error(infer_err(stub, req), INV, "parameter keys starting with 'triton_' are reserved for Triton "
                     "usage. Only the following keys starting with 'triton_' are allowed: "
                     "triton_enable_empty_final_response")


# Triton 2.51's gRPC front end checks the type of each parameter (bench/triton_parity.sh --json).
# Triton: server src/grpc/infer_handler.cc, SetInferenceRequestMetadata, every text below (read on main).
@pytest.mark.parametrize("key,field,value,message", [
    ("priority", "string_param", "high", "invalid value type for 'priority' parameter, expected int64_param or "
                                         "uint64_param."),
    ("priority", "int64_param", -1, "invalid value for 'priority', expected value >= 0."),
    ("timeout", "uint64_param", 5, "invalid value type for 'timeout' parameter, expected int64_param."),
    ("sequence_id", "uint64_param", 5, "invalid value type for 'sequence_id' parameter, expected int64_param or "
                                       "string_param."),
    ("sequence_start", "int64_param", 1, "invalid value type for 'sequence_start' parameter, expected bool_param."),
    ("triton_enable_empty_final_response", "int64_param", 1,
     "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."),
    ("custom", "uint64_param", 5, "invalid value type for 'custom' parameter, expected int64_param, bool_param, "
                                  "or string_param."),
])
def test_parameters_of_the_wrong_type(stub, key, field, value, message):
    req = add_sub_req()
    setattr(req.parameters[key], field, value)
    err = infer_err(stub, req)
    assert (err.code(), err.details()) == (INV, message)


def test_parameters_of_the_right_type_pass(stub):
    req = add_sub_req()
    req.parameters["priority"].uint64_param = 1
    req.parameters["timeout"].int64_param = 10_000_000
    req.parameters["custom"].double_param = 0.5
    req.parameters["triton_enable_empty_final_response"].bool_param = True
    assert len(stub.ModelInfer(req).outputs) == 2


# --------------------------------------------------------------------------- unimplemented RPCs

def test_unimplemented_rpc(stub):
    err = grpc_error(stub.CudaSharedMemoryRegister, service_pb2.CudaSharedMemoryRegisterRequest(name="r"))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED, (err.code(), err.details())


@pytest.mark.parametrize("path", ["/inference.GRPCInferenceService/NoSuchRpc", "/no.such.Service/Call"])
def test_unknown_method(server, path):
    call = server.channel().unary_unary(path, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    err = grpc_error(call, b"")
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED, (err.code(), err.details())


def test_garbage_protobuf_body(server):
    # gRPC C++ (Triton's server) answers a body that does not parse with INTERNAL
    # (GenericDeserialize: Status(INTERNAL, msg->InitializationErrorString()), empty for proto3
    # messages); kiln's status is the same, its message is tonic's decoder's.
    call = server.channel().unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                        request_serializer=lambda b: b, response_deserializer=lambda b: b)
    err = grpc_error(call, b"\xff\xff\xff\xff\x0f\x0a")
    assert (err.code(), err.details()) == (
        grpc.StatusCode.INTERNAL, "failed to decode Protobuf message: invalid wire type value: 7")
