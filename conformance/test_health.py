"""grpc.health.v1 and server reflection (v1 + v1alpha) with plain grpcio.

grpcio-health-checking / grpcio-reflection are not in the venv, so the few
messages involved are encoded by hand (they are tiny) and descriptors are
parsed with protobuf's descriptor_pb2.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor_pb2

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
