"""Limits that never refuse what Triton answers (issue 44): a BYTES tensor of ten million strings,
over gRPC `bytes_contents` (Triton's QA, L0_grpc/python_unit_test.py
`test_bytes_contents_many_elements_serialization`, run as it is written), REST binary data and
REST JSON. kiln once refused any gRPC message of more than 16,384 entries; its decode is now
bounded by the memory it would take (`--grpc-max-decode-bytes`, crates/protocol/src/protocol/grpc_codec.rs), and
`bytes_contents` decodes into one buffer in Triton's BYTES layout (crates/core/src/proto/contents.rs).
The hostile side of the same limit (millions of empty tensors) is in test_hostile.py."""

from __future__ import annotations

import json
import struct

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

import http.client

from conftest import HttpReply, deserialize_bytes, start_server, stop_server

# Triton's figures: 10,485,760 elements * (4-byte length + 1-byte payload) = 50 MiB of serialized
# BYTES data on both the request and response sides.
ELEMENTS = 10 * 1024 * 1024
PAYLOAD = b"A"
SERIALIZED = ELEMENTS * (4 + len(PAYLOAD))

CONFIG = """
name: "string_identity"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


def post(url: str, path: str, body: bytes) -> HttpReply:
    """A POST with two minutes to answer: tens of megabytes of JSON each way, on a debug build
    and a busy machine, may take longer than the suite's 30 s per call."""
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return HttpReply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


@pytest.fixture(scope="module")
def identity(tmp_path_factory):
    """kiln serving Triton's `string_identity` (a 1-D string Identity, as Triton's QA model)."""
    import onnx
    from onnx import TensorProto, helper

    repo = tmp_path_factory.mktemp("limits_repo")
    model = repo / "string_identity"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "string_identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, ["n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, ["n"])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), model / "1" / "model.onnx")
    srv = start_server([repo], name="kiln-limits")
    yield srv
    stop_server(srv)


def test_bytes_contents_many_elements_serialization(identity):
    """Triton's QA test, unchanged but for the server's address: the raw stub, 10,485,760
    one-byte `bytes_contents` elements, 256 MiB channel limits, a 120 s deadline."""
    request = service_pb2.ModelInferRequest()
    request.model_name = "string_identity"
    input_tensor = request.inputs.add()
    input_tensor.name = "INPUT0"
    input_tensor.datatype = "BYTES"
    input_tensor.shape.extend([ELEMENTS])
    input_tensor.contents.bytes_contents.extend([PAYLOAD] * ELEMENTS)
    request.outputs.add().name = "OUTPUT0"
    channel_options = [
        ("grpc.max_send_message_length", 256 * 1024 * 1024),
        ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ]
    with grpc.insecure_channel(identity.grpc_url, options=channel_options) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=120)
    del request
    assert list(response.outputs[0].shape) == [ELEMENTS]
    raw = response.raw_output_contents[0]
    assert len(raw) == SERIALIZED
    # Every element round-tripped: the framed output is PAYLOAD's frame, ten million times.
    assert raw == (struct.pack("<I", len(PAYLOAD)) + PAYLOAD) * ELEMENTS
    client = grpcclient.InferenceServerClient(url=identity.grpc_url)
    assert client.is_server_live()
    assert client.is_model_ready("string_identity")


def test_many_strings_over_grpc_with_tritonclient(identity):
    """16,385 strings, one past the old entry cap, through tritonclient's usual path (raw
    contents) and through `bytes_contents` (typed contents)."""
    values = np.array([f"s{i}".encode() for i in range(16_385)], dtype=np.object_)
    client = grpcclient.InferenceServerClient(url=identity.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [len(values)], "BYTES")
    tensor.set_data_from_numpy(values)
    result = client.infer("string_identity", [tensor], client_timeout=60)
    assert list(result.as_numpy("OUTPUT0")) == list(values)

    request = service_pb2.ModelInferRequest(model_name="string_identity")
    typed = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[len(values)])
    typed.contents.bytes_contents.extend(list(values))
    response = identity.stub().ModelInfer(request, timeout=60)
    assert deserialize_bytes(response.raw_output_contents[0]) == list(values)


def test_ten_million_strings_as_rest_binary_data(identity):
    """The same tensor in Triton's binary tensor extension (50 MiB, under the 64 MiB body limit)."""
    client = httpclient.InferenceServerClient(url=identity.http_url, connection_timeout=120, network_timeout=120)
    values = np.full(ELEMENTS, PAYLOAD, dtype=np.object_)
    tensor = httpclient.InferInput("INPUT0", [ELEMENTS], "BYTES")
    tensor.set_data_from_numpy(values, binary_data=True)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    result = client.infer("string_identity", [tensor], outputs=[output])
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (ELEMENTS,)
    assert bool(np.all(got == PAYLOAD))


def test_ten_million_strings_as_rest_json(identity):
    """And as JSON `data`: 40 MB of `"A",`, decoded in place (not counted as JSON values)."""
    body = (
        b'{"inputs":[{"name":"INPUT0","datatype":"BYTES","shape":[' + str(ELEMENTS).encode()
        + b'],"data":[' + b",".join([b'"A"'] * ELEMENTS) + b"]}],"
        + b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":false}}]}'
    )
    assert len(body) < 64 * 1024 * 1024
    reply = post(identity.http_url, "/v2/models/string_identity/infer", body)
    assert reply.status == 200, reply.body[:300]
    output = json.loads(reply.body)["outputs"][0]
    assert output["shape"] == [ELEMENTS]
    assert len(output["data"]) == ELEMENTS and set(output["data"]) == {"A"}


def test_two_million_strings_through_generate(identity):
    """Triton's generate turns a key naming an input into that input, whatever its length (its
    body is bounded by --http-max-input-size alone); kiln once refused a generate body of more
    than 1,000,000 JSON values. Its tree now has a memory budget (512 MiB: 3.7 million values)."""
    count = 2_000_000
    body = b'{"INPUT0":[' + b",".join([b'"A"'] * count) + b"]}"
    reply = post(identity.http_url, "/v2/models/string_identity/generate", body)
    assert reply.status == 200, reply.body[:300]
    output = json.loads(reply.body)["OUTPUT0"]
    assert len(output) == count and set(output) == {"A"}
