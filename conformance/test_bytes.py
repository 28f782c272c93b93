"""BYTES elements are arbitrary byte strings, as in Triton: NULs, bytes that are not UTF-8, the
empty string and all 256 byte values come back unchanged from an ONNX identity model (its string
tensors filled with explicit lengths) and from a Python identity model (numpy object arrays of
bytes), over gRPC, REST binary data and REST JSON. JSON carries what it can: escaped text such as
"a\\u0000b" in, and any bytes out, written as Triton's rapidjson writes them (control characters
escaped, every other byte as it is, so a body holding non-UTF-8 bytes is not strictly UTF-8)."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import BUNDLED_REPO, RPC_TIMEOUT, deserialize_bytes, http_request, serialize_bytes, start_server, stop_server

PY_IDENTITY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "input-1").as_numpy()
            if x.dtype != np.object_ or any(type(e) is not bytes for e in x.reshape(-1)):
                raise TypeError(f"BYTES input came as {x.dtype}, not an object array of bytes")
            # Made anew from the elements, as a model would build its answer.
            y = np.array([bytes(e) for e in x.reshape(-1)], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("output-1", y.reshape(x.shape))]))
        return responses
'''

PY_IDENTITY_CONFIG = '''
name: "py_string_echo"
backend: "python"
max_batch_size: 8
input [ { name: "input-1" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "output-1" data_type: TYPE_STRING dims: [ -1 ] } ]
'''

MODELS = ["string_echo", "py_string_echo"]

# What a C string cannot hold (NULs, leading, inside, trailing), what is not UTF-8, nothing at
# all, and every byte value.
ELEMENTS = [b"\x00\xffraw", b"", b"\x00", b"a\x00b", bytes(range(256)), b"trailing\x00\x00",
            b"\xc3(", "h\u00e9llo \U0001f600".encode()]

# Text with NULs and escapes, as a JSON request can carry it.
JSON_TEXTS = ["a\u0000b", "", "\u0000", "\u0000\u00ff\u65e5\u0001\n\"\\", "plain"]


@pytest.fixture(scope="module")
def bytes_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("bytes") / "repo"
    shutil.copytree(BUNDLED_REPO / "string_echo", repo / "string_echo")
    (repo / "py_string_echo" / "1").mkdir(parents=True)
    (repo / "py_string_echo" / "config.pbtxt").write_text(textwrap.dedent(PY_IDENTITY_CONFIG))
    (repo / "py_string_echo" / "1" / "model.py").write_text(textwrap.dedent(PY_IDENTITY))
    # The Python stub runs under this interpreter (it has numpy).
    server = start_server([repo], name="kiln-bytes", env={"KILN_PYTHON": sys.executable})
    yield server
    stop_server(server)


def elements_array(elements):
    return np.array(elements, dtype=np.object_).reshape(1, -1)


@pytest.mark.parametrize("model", MODELS)
def test_grpc_bytes_round_trip_unchanged(bytes_server, model):
    client = grpcclient.InferenceServerClient(bytes_server.grpc_url)
    sent = grpcclient.InferInput("input-1", [1, len(ELEMENTS)], "BYTES")
    sent.set_data_from_numpy(elements_array(ELEMENTS))
    result = client.infer(model, [sent], client_timeout=RPC_TIMEOUT)
    assert result.as_numpy("output-1").tolist() == [ELEMENTS]
    assert deserialize_bytes(result.get_response().raw_output_contents[0]) == ELEMENTS


@pytest.mark.parametrize("model", MODELS)
def test_rest_binary_bytes_round_trip_unchanged(bytes_server, model):
    client = httpclient.InferenceServerClient(bytes_server.http_url, network_timeout=RPC_TIMEOUT)
    sent = httpclient.InferInput("input-1", [1, len(ELEMENTS)], "BYTES")
    sent.set_data_from_numpy(elements_array(ELEMENTS), binary_data=True)
    asked = httpclient.InferRequestedOutput("output-1", binary_data=True)
    result = client.infer(model, [sent], outputs=[asked])
    assert result.as_numpy("output-1").tolist() == [ELEMENTS]


def infer_json(server, model, header, blobs=b""):
    body = json.dumps(header).encode()
    headers = {"Inference-Header-Content-Length": str(len(body))} if blobs else {}
    reply = http_request(server.http_url, "POST", f"/v2/models/{model}/infer", body + blobs, headers)
    assert reply.status == 200, reply
    return reply


def rapidjson_string(element):
    """A byte string as Triton's rapidjson writer (UTF8 to UTF8, no validation) writes it: short
    escapes, other control characters as \\u00XX with upper-case digits, other bytes as they are."""
    short = {0x08: b"\\b", 0x09: b"\\t", 0x0A: b"\\n", 0x0C: b"\\f", 0x0D: b"\\r", 0x22: b'\\"',
             0x5C: b"\\\\"}
    out = bytearray(b'"')
    for b in element:
        out += short.get(b) or (b"\\u%04X" % b if b < 0x20 else bytes([b]))
    return bytes(out + b'"')


def lenient_json(body):
    """A JSON body read as Triton's clients must read one holding non-UTF-8 bytes: the bytes that
    are not UTF-8 kept aside (surrogateescape) and put back by encoding the same way."""
    return json.loads(body.decode("utf-8", "surrogateescape"))


def as_bytes(text):
    return text.encode("utf-8", "surrogateescape")


@pytest.mark.parametrize("model", MODELS)
def test_rest_json_text_with_nuls_round_trips(bytes_server, model):
    header = {"inputs": [{"name": "input-1", "datatype": "BYTES", "shape": [1, len(JSON_TEXTS)],
                          "data": JSON_TEXTS}]}
    reply = infer_json(bytes_server, model, header)
    output = reply.json()["outputs"][0]
    assert output["shape"] == [1, len(JSON_TEXTS)]
    assert output["data"] == JSON_TEXTS
    assert b'"a\\u0000b"' in reply.body


@pytest.mark.parametrize("model", MODELS)
def test_rest_json_writes_any_bytes_as_triton_does(bytes_server, model):
    # In as binary data, out as JSON: every element's bytes come back, the ones JSON must
    # escape escaped and the others (non-UTF-8 included) as they are, not replaced by U+FFFD.
    blob = serialize_bytes(ELEMENTS)
    header = {"inputs": [{"name": "input-1", "datatype": "BYTES", "shape": [1, len(ELEMENTS)],
                          "parameters": {"binary_data_size": len(blob)}}],
              "outputs": [{"name": "output-1", "parameters": {"binary_data": False}}]}
    reply = infer_json(bytes_server, model, header, blob)
    assert "inference-header-content-length" not in reply.headers
    assert b'"data":["\\u0000\xffraw","","\\u0000","a\\u0000b",' in reply.body
    assert b'"data":[' + b",".join(map(rapidjson_string, ELEMENTS)) + b"]" in reply.body
    data = lenient_json(reply.body)["outputs"][0]["data"]
    assert [as_bytes(d) for d in data] == ELEMENTS


@pytest.mark.parametrize("model", MODELS)
def test_rest_json_strings_holding_raw_bytes_round_trip(bytes_server, model):
    # Triton's reader takes a JSON string's bytes as they are, UTF-8 or not: so does kiln's.
    body = (b'{"inputs":[{"name":"input-1","datatype":"BYTES","shape":[1,3],'
            b'"data":["\xff\\u0000raw","\xc3(","a\\u0000b"]}]}')
    reply = http_request(bytes_server.http_url, "POST", f"/v2/models/{model}/infer", body)
    assert reply.status == 200, reply
    data = lenient_json(reply.body)["outputs"][0]["data"]
    assert [as_bytes(d) for d in data] == [b"\xff\x00raw", b"\xc3(", b"a\x00b"]
