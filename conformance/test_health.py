"""grpc.health.v1 and server reflection (v1 + v1alpha).

Each is checked twice: with the few messages involved encoded by hand (tiny; this pins the wire
fields) and with the real clients, grpcio-health-checking's HealthStub and grpcio-reflection's
ProtoReflectionDescriptorDatabase behind a protobuf DescriptorPool (as a Python tool resolves
kiln's services). grpcio-reflection's client speaks v1alpha only, and grpcurl 1.8.6 too
(test_grpcurl.py); for v1 the same client is pointed at the v1 method: the v1 messages are the
v1alpha ones field for field, only the service's package differs.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from conftest import RPC_TIMEOUT

SERVING, NOT_SERVING = 1, 2

TRITON_RPCS = [
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
    "ModelStreamInfer", "ModelConfig", "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad",
    "RepositoryModelUnload", "SystemSharedMemoryStatus", "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus", "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings",
]


# --------------------------------------------------------------------------- tiny protobuf wire codec

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, payload: bytes) -> bytes:  # length-delimited field
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _decode(buf: bytes) -> list[tuple[int, object]]:
    out, i = [], 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, i = _read_varint(buf, i)
        elif wt == 2:
            n, i = _read_varint(buf, i)
            val, i = buf[i:i + n], i + n
        elif wt == 1:
            val, i = buf[i:i + 8], i + 8
        elif wt == 5:
            val, i = buf[i:i + 4], i + 4
        else:
            raise AssertionError(f"unexpected wire type {wt}")
        out.append((num, val))
    return out


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


def _ident(b):
    return b


# --------------------------------------------------------------------------- health

def health_check(srv, service: str = "") -> int:
    call = srv.channel().unary_unary("/grpc.health.v1.Health/Check", request_serializer=_ident,
                                     response_deserializer=_ident)
    resp = call(_field(1, service.encode()) if service else b"", timeout=RPC_TIMEOUT)
    fields = dict(_decode(resp))
    return int(fields.get(1, 0))


@pytest.mark.parametrize("service", ["", "inference.GRPCInferenceService"])
def test_health_not_serving_while_models_failed(server, service):
    assert health_check(server, service) == NOT_SERVING


@pytest.mark.parametrize("service", ["", "inference.GRPCInferenceService"])
def test_health_serving_when_ready(bundled_server, service):
    from tritonclient.grpc import service_pb2

    assert bundled_server.stub().ServerReady(service_pb2.ServerReadyRequest(), timeout=RPC_TIMEOUT).ready is True
    assert health_check(bundled_server, service) == SERVING


# --------------------------------------------------------------------------- reflection

REFLECTION = ["grpc.reflection.v1", "grpc.reflection.v1alpha"]


def reflect(srv, package: str, request: bytes) -> list[tuple[int, object]]:
    call = srv.channel().stream_stream(f"/{package}.ServerReflection/ServerReflectionInfo",
                                       request_serializer=_ident, response_deserializer=_ident)
    responses = list(call(iter([request]), timeout=RPC_TIMEOUT))
    assert len(responses) == 1
    return _decode(responses[0])


@pytest.mark.parametrize("package", REFLECTION)
def test_reflection_list_services(server, package):
    resp = dict(reflect(server, package, _field(7, b"*")))
    assert 6 in resp, f"no list_services_response: {resp}"
    names = {dict(_decode(svc))[1].decode() for num, svc in _decode(resp[6]) if num == 1}
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= names, names


def _files_for_symbol(srv, package, symbol) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    resp = dict(reflect(srv, package, _field(4, symbol.encode())))
    assert 4 in resp, f"no file_descriptor_response for {symbol}: {resp}"
    files = {}
    for num, raw in _decode(resp[4]):
        if num == 1:
            fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
            files[fd.name] = fd
    return files


@pytest.mark.parametrize("package", REFLECTION)
def test_reflection_service_descriptor(server, package):
    files = _files_for_symbol(server, package, "inference.GRPCInferenceService")
    svc = [s for fd in files.values() if fd.package == "inference" for s in fd.service
           if s.name == "GRPCInferenceService"]
    assert len(svc) == 1, list(files)
    methods = {m.name: m for m in svc[0].method}
    assert list(methods) == TRITON_RPCS
    stream = methods["ModelStreamInfer"]
    assert stream.client_streaming and stream.server_streaming
    assert stream.output_type == ".inference.ModelStreamInferResponse"
    assert methods["ModelInfer"].output_type == ".inference.ModelInferResponse"


def test_reflection_model_config_symbol(server):
    files = _files_for_symbol(server, "grpc.reflection.v1alpha", "inference.ModelConfig")
    msgs = {m.name: m for fd in files.values() if fd.package == "inference" for m in fd.message_type}
    assert "ModelConfig" in msgs
    fields = {f.name: f.number for f in msgs["ModelConfig"].field}
    assert fields["max_batch_size"] == 4 and fields["instance_group"] == 7 and fields["dynamic_batching"] == 11


def test_model_metadata_response_has_no_field_6(server):
    files = _files_for_symbol(server, "grpc.reflection.v1alpha", "inference.ModelMetadataResponse")
    msg = next(m for fd in files.values() if fd.package == "inference" for m in fd.message_type
               if m.name == "ModelMetadataResponse")
    assert sorted(f.number for f in msg.field) == [1, 2, 3, 4, 5]


def test_reflection_unknown_symbol(server):
    """The reflection spec answers with error_response (code 5); tonic-reflection ends
    the stream with status NOT_FOUND instead. Either is a clean NOT_FOUND."""
    try:
        resp = dict(reflect(server, "grpc.reflection.v1alpha", _field(4, b"no.such.Symbol")))
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, (e.code(), e.details())
        return
    assert 7 in resp, f"expected error_response, got fields {sorted(resp)}"
    err = dict(_decode(resp[7]))
    assert err.get(1) == grpc.StatusCode.NOT_FOUND.value[0]


# --------------------------------------------------------------------------- real clients

def test_health_client_not_serving_while_models_failed(server):
    stub = health_pb2_grpc.HealthStub(server.channel())
    for service in ("", "inference.GRPCInferenceService"):
        answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT)
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING, service


def test_health_client_serving_when_ready(bundled_server):
    stub = health_pb2_grpc.HealthStub(bundled_server.channel())
    for service in ("", "inference.GRPCInferenceService"):
        answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as unknown:
        stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=RPC_TIMEOUT)
    # The health protocol's answer for a service the server does not know.
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def reflection_database(srv, package: str) -> ProtoReflectionDescriptorDatabase:
    database = ProtoReflectionDescriptorDatabase(srv.channel())
    if package == "grpc.reflection.v1":
        database._stub.ServerReflectionInfo = srv.channel().stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    return database


@pytest.mark.parametrize("package", REFLECTION)
def test_reflection_client_resolves_the_services(server, package):
    database = reflection_database(server, package)
    services = set(database.get_services())
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= services, services
    pool = descriptor_pool.DescriptorPool(database)
    service = pool.FindServiceByName("inference.GRPCInferenceService")
    assert [m.name for m in service.methods] == TRITON_RPCS
    stream = service.methods_by_name["ModelStreamInfer"]
    assert stream.client_streaming and stream.server_streaming
    assert stream.output_type.full_name == "inference.ModelStreamInferResponse"
    # model_config.proto comes along as a dependency of grpc_service.proto.
    config = pool.FindMessageTypeByName("inference.ModelConfig")
    fields = {f.name: f.number for f in config.fields}
    assert fields["max_batch_size"] == 4 and fields["instance_group"] == 7 and fields["dynamic_batching"] == 11
    health = pool.FindServiceByName("grpc.health.v1.Health")
    assert {m.name for m in health.methods} >= {"Check", "Watch"}


@pytest.mark.xfail(strict=True, raises=grpc.RpcError,
                   reason="tonic-reflection ends the stream with NOT_FOUND where the reflection protocol "
                          "(and gRPC C++'s, Triton's) answers an error_response; grpcio-reflection's "
                          "client then raises the RpcError instead of KeyError")
@pytest.mark.parametrize("package", REFLECTION)
def test_reflection_client_unknown_symbol(server, package):
    # A lookup of a symbol the server does not have is a KeyError to the descriptor pool.
    pool = descriptor_pool.DescriptorPool(reflection_database(server, package))
    with pytest.raises(KeyError):
        pool.FindMessageTypeByName("no.such.Symbol")
