"""kiln's REST API on the wire, with a plain HTTP client: KServe-style health bodies, Triton's
routes, statuses and headers, the binary tensor data extension byte by byte, and every kind of
bad input from the REST issue, each followed by a check that the server is still up.
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib

import numpy as np
import pytest

from conftest import http_request

INFER = "/v2/models/add_sub/infer"
IHCL = "Inference-Header-Content-Length"


def post(url, path, body=b"", headers=None):
    return http_request(url, "POST", path, body, headers)


def get(url, path):
    return http_request(url, "GET", path)


def add_sub_json(a=None, b=None):
    a = list(range(16)) if a is None else a
    b = [1.0] * 16 if b is None else b
    return {"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": a},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": b},
    ]}


# --------------------------------------------------------------------------- health (KServe)

def test_kserve_health_bodies(server, bundled_server):
    # Statuses: Triton's (server src/http_server.cc, HTTPAPIServer::HandleServerHealth: 200, or 400
    # when not ready, no body). The {"live": ...} / {"ready": ...} bodies are kiln's own, a known
    # difference (docs/compatibility.md). Model readiness: HandleModelReady, an empty 200 or 400
    # "Model version not ready" (read on Triton's main).
    live = get(server.http_url, "/v2/health/live")
    assert (live.status, live.json()) == (200, {"live": True})
    assert live.headers["content-type"] == "application/json"
    not_ready = get(server.http_url, "/v2/health/ready")
    assert (not_ready.status, not_ready.json()) == (400, {"ready": False})
    ready = get(bundled_server.http_url, "/v2/health/ready")
    assert (ready.status, ready.json()) == (200, {"ready": True})
    model = get(server.http_url, "/v2/models/add_sub/ready")
    assert (model.status, model.body) == (200, b"")
    missing = get(server.http_url, "/v2/models/nope/ready")
    assert (missing.status, missing.error()) == (400, "Model version not ready")


# --------------------------------------------------------------------------- routes

def test_unknown_paths_and_methods(server):
    # 405 {"error":"Method Not Allowed"}: Triton's, server src/http_server.cc, each Handle* method
    # (RETURN_AND_RESPOND_WITH_ERR(req, EVHTP_RES_METHNALLOWED, "Method Not Allowed")). 404
    # {"error":"Not Found"} is kiln's reading of Triton 2.51's answer (crates/protocol/src/protocol/http/mod.rs);
    # the searched copies of HTTPAPIServer::Handle end with a bare evhtp_send_reply(EVHTP_RES_BADREQ)
    # instead, so this text is not confirmed on Triton's main.
    for path in ("/", "/v2/nothing", "/v2/models", "/v2/models/add_sub/versions/x", "/v2/models/add_sub/infer/x"):
        r = get(server.http_url, path)
        assert (r.status, r.json()) == (404, {"error": "Not Found"}), path
    for method, path in (("POST", "/v2"), ("PUT", "/v2/health/live"), ("GET", INFER), ("DELETE", "/v2/models/add_sub"),
                         ("GET", "/v2/repository/index")):
        r = http_request(server.http_url, method, path)
        assert (r.status, r.json()) == (405, {"error": "Method Not Allowed"}), (method, path)


def test_stats_route_is_not_a_model_and_placeholders_are_501(server):
    r = get(server.http_url, "/v2/models/stats")
    assert r.status == 200 and {"add_sub", "string_echo"} <= {s["name"] for s in r.json()["model_stats"]}
    r = get(server.http_url, "/v2/models/add_sub/versions/1/stats")
    assert r.status == 200 and [s["version"] for s in r.json()["model_stats"]] == ["1"]
    r = http_request(server.http_url, "POST", "/v2/cudasharedmemory/region/r/register")
    assert r.status == 501 and r.headers["content-type"] == "application/json", r
    # Triton: core src/model_repository_manager/model_repository_manager.cc,
    # ModelRepositoryManager::LoadUnloadModel ("explicit model load / unload is not allowed if
    # polling is enabled", UNAVAILABLE); server src/http_server.cc, HandleRepositoryControl
    # ("'repository_name' specification is not supported", UNSUPPORTED).
    load = post(server.http_url, "/v2/repository/models/add_sub/load")
    assert load.status == 503 and "explicit model load / unload is not allowed" in load.error()
    named = post(server.http_url, "/v2/repository/x/models/add_sub/unload", b"{}")
    assert (named.status, named.error()) == (501, "'repository_name' specification is not supported")


def test_repository_index_bodies(server):
    empty = post(server.http_url, "/v2/repository/index")
    assert empty.status == 200 and isinstance(empty.json(), list)
    # `ready: true` leaves out exactly the rows that are not READY (broken and name_mismatch failed
    # to load) and keeps every other row as it is.
    ready = post(server.http_url, "/v2/repository/index", b'{"ready": true}')
    assert ready.status == 200
    assert {m["name"] for m in empty.json() if m["state"] != "READY"} == {"broken", "name_mismatch"}
    assert ready.json() == [m for m in empty.json() if m["state"] == "READY"]
    assert {"add_sub", "string_echo", "mlp_classifier"} <= {m["name"] for m in ready.json()}
    bad = post(server.http_url, "/v2/repository/index", b'{"ready": 1}')
    assert bad.status == 400


def test_config_json_like_triton(server):
    cfg = get(server.http_url, "/v2/models/add_sub/config").json()
    assert cfg["name"] == "add_sub" and cfg["backend"] == "onnxruntime" and cfg["platform"] == "onnxruntime_onnx"
    assert cfg["input"][0] == {"name": "INPUT0", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [16],
                               "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False,
                               "is_non_linear_format_io": False}
    assert cfg["max_batch_size"] == 8 and isinstance(cfg["max_batch_size"], int)


# --------------------------------------------------------------------------- JSON and binary on the wire

def test_json_request_without_content_type(server):
    r = post(server.http_url, INFER, json.dumps(add_sub_json()).encode())
    assert r.status == 200, r
    assert r.headers["content-type"] == "application/json" and IHCL.lower() not in r.headers
    body = r.json()
    assert body["model_name"] == "add_sub" and body["model_version"] == "1" and "id" not in body
    assert body["outputs"][0]["data"] == [float(i + 1) for i in range(16)]


def test_nested_data(server):
    req = {"inputs": [
        {"name": "INPUT0", "shape": [2, 16], "datatype": "FP32", "data": [list(range(16)), list(range(16, 32))]},
        {"name": "INPUT1", "shape": [2, 16], "datatype": "FP32", "data": [[[0.0] * 16], [[1.0] * 16]]},
    ], "outputs": [{"name": "OUTPUT0"}]}
    r = post(server.http_url, INFER, json.dumps(req).encode())
    assert r.status == 200, r
    out = r.json()["outputs"][0]
    assert out["shape"] == [2, 16] and out["data"] == [float(i) for i in range(16)] + [float(i + 1) for i in range(16, 32)]


def test_binary_extension_bytes_exactly(server):
    header = json.dumps({
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}},
        ],
        "outputs": [{"name": "OUTPUT1", "parameters": {"binary_data": True}}],
    }).encode()
    a = np.arange(16, dtype=np.float32)
    body = header + a.tobytes() + np.ones(16, np.float32).tobytes()
    r = post(server.http_url, INFER, body, {IHCL: str(len(header))})
    assert r.status == 200, r
    assert r.headers["content-type"] == "application/octet-stream"
    n = int(r.headers[IHCL.lower()])
    meta = json.loads(r.body[:n])
    assert meta["outputs"] == [{"name": "OUTPUT1", "datatype": "FP32", "shape": [1, 16],
                                "parameters": {"binary_data_size": 64}}]
    assert len(r.body) == n + 64 == int(r.headers["content-length"])
    np.testing.assert_array_equal(np.frombuffer(r.body[n:], np.float32), a - 1)


def test_raw_binary_request(server):
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    r = post(server.http_url, "/v2/models/mlp_classifier/infer", x.tobytes(), {IHCL: "0"})
    assert r.status == 200, r
    n = int(r.headers[IHCL.lower()])
    meta = json.loads(r.body[:n])
    assert meta["outputs"][0]["shape"] == [1, 10] and meta["model_version"] == "2"
    probabilities = np.frombuffer(r.body[n:], np.float32)
    assert abs(probabilities.sum() - 1) < 1e-4
    # A string input of shape [1] takes the body as its one string, as Triton takes it (the
    # server frames it); an empty body without the header is a raw request too.
    text = "h\u00e9llo wörld".encode()
    r = post(server.http_url, "/v2/models/all_minilm_l6_v2/infer", text, {IHCL: "0"})
    assert r.status == 200, r
    n = int(r.headers[IHCL.lower()])
    meta = json.loads(r.body[:n])
    assert meta["outputs"][0]["shape"] == [1, 384]
    embedding = np.frombuffer(r.body[n:], np.float32)
    framed = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1],
                                     "data": ["h\u00e9llo wörld"]}]}).encode()
    r = post(server.http_url, "/v2/models/all_minilm_l6_v2/infer", framed)
    np.testing.assert_allclose(embedding, np.array(json.loads(r.body)["outputs"][0]["data"], np.float32), atol=1e-6)
    # Triton's rule for strings: shape [1] only (string_echo's is [-1]). Both texts: core
    # src/infer_request.cc, InferenceRequest::Normalize (raw input; "For BYTE datatype raw input
    # '<n>', the model must have input shape [1]" is frozen by Triton's qa/L0_http raw-input
    # tests) and its input byte-size check (see test_grpc_errors.py).
    r = post(server.http_url, "/v2/models/string_echo/infer", text, {IHCL: "0"})
    assert (r.status, r.error()) == (400, "[request id: <id_unknown>] For BYTE datatype raw input 'input-1', "
                                          "the model must have input shape [1]")
    r = post(server.http_url, "/v2/models/mlp_classifier/infer", b"")
    assert (r.status, r.error()) == (400, "[request id: <id_unknown>] input byte size mismatch for input "
                                          "'raw_input' for model 'mlp_classifier'. Expected 256, got 0")


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_request_and_response(server, encoding):
    body = json.dumps(add_sub_json()).encode()
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    r = post(server.http_url, INFER, packed, {"Content-Encoding": encoding, "Accept-Encoding": encoding})
    assert r.status == 200, r
    assert r.headers["content-encoding"] == encoding
    plain = gzip.decompress(r.body) if encoding == "gzip" else zlib.decompress(r.body)
    assert json.loads(plain)["outputs"][1]["data"][0] == -1.0


def test_chunked_request_body(server):
    body = json.dumps(add_sub_json()).encode()
    host, port = server.http_url.rsplit(":", 1)
    import http.client
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", INFER, body=iter([body[:10], body[10:100], body[100:]]),
                     headers={"Transfer-Encoding": "chunked"}, encode_chunked=True)
        r = conn.getresponse()
        assert r.status == 200
        assert json.loads(r.read())["outputs"][0]["data"][15] == 16.0
    finally:
        conn.close()


# --------------------------------------------------------------------------- bad inputs

def _input(shape, datatype="FP32", **source):
    return json.dumps({"inputs": [dict(name="INPUT0", shape=shape, datatype=datatype, **source)]}).encode()


# Sources, server src/http_server.cc unless named: "failed to parse the request JSON buffer: <rapidjson
# error> at <offset>" common src/triton_json.h, TritonJson::Value::Parse; "Raw request must only have
# 1 input ..." core InferenceRequest::Normalize; "Unable to parse 'shape'" and "unexpected size for
# input ..., expecting N additional bytes for model" HTTPAPIServer::EVBufferToInput; "Input must set
# only one of the following fields" its input-content check; "causes total element count to exceed
# maximum size" server PR #8182 (see test_triton_validation.py); "invalid datatype for input" and
# "receiving FP16 data via JSON is not supported" ReadDataFromJson; "Shape does not match true shape
# of 'data' field" ReadDataFromJsonHelper. kiln's own wording, for which the searched Triton sources
# hold no text: "must be a JSON object", "more than 1000000 values" (kiln's limit), "expected a
# number for FP32 input" and "signed integer in range" (the assertions hold only these fragments).
BAD_JSON = [
    ("garbage", b"\x00\xff\xfe garbage", "failed to parse the request JSON buffer"),
    ("empty body", b"", "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs"),
    ("json array", b"[]", "must be a JSON object"),
    ("negative shape", _input([-1, 16], data=[1]), "Unable to parse 'shape'"),
    ("overflowing shape", _input([2**32, 2**32, 2**32], data=[1]),
     "causes total element count to exceed maximum size of 9223372036854775807"),
    ("shape past int64", _input([2**64 - 1], data=[1]), "Unable to parse 'shape'"),
    # Read to the end without recursing (as Triton's iterative parser), then refused where it stops.
    ("nested depth bomb", b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":' + b"[" * 200_000,
     "failed to parse the request JSON buffer: Invalid value. at 200065"),
    ("object depth bomb", b'{"a":' * 200_000, "failed to parse the request JSON buffer: Invalid value. at 1000000"),
    ("value count bomb", b'{"inputs":[],"x":[' + b"0," * 1_100_000 + b"0]}", "more than 1000000 values"),
    ("unknown datatype", _input([1, 16], "FLOAT", data=[1]), "invalid datatype for input INPUT0"),
    ("data of the wrong kind", _input([1, 1], data=["1"]), "expected a number for FP32 input 'INPUT0'"),
    ("int out of range", _input([1, 1], "INT8", data=[300]), "signed integer in range"),
    ("too little data", _input([1, 16], data=[1, 2]), "Shape does not match true shape of 'data' field"),
    ("fp16 as json", _input([1, 1], "FP16", data=[1.0]), "receiving FP16 data via JSON is not supported"),
    ("data and binary", _input([1, 16], data=[1], parameters={"binary_data_size": 64}),
     "Input must set only one of the following fields"),
    ("binary without header", _input([1, 16], parameters={"binary_data_size": 64}),
     "unexpected size for input 'INPUT0', expecting 64 additional bytes for model 'add_sub'"),
]


# Triton main's INTERNAL, 500: a dimension that is not an unsigned integer (TritonJson's
# IndexAsUInt; qa/L0_http test_negative_dimensions, conformance/test_triton_main_texts.py).
INTERNAL_JSON = {"negative shape"}


@pytest.mark.parametrize("what,body,expected", BAD_JSON, ids=[c[0] for c in BAD_JSON])
def test_bad_json_bodies(alive, what, body, expected):
    r = post(alive.http_url, INFER, body)
    assert r.status == (500 if what in INTERNAL_JSON else 400), r
    assert r.headers["content-type"] == "application/json"
    assert expected in r.error(), r.error()


def test_wrong_datatype_is_validation(alive):
    # Triton: core src/infer_request.cc, InferenceRequest::Normalize (read on main).
    req = add_sub_json()
    req["inputs"][0]["datatype"] = "FP64"
    r = post(alive.http_url, INFER, json.dumps(req).encode())
    assert r.status == 400
    assert r.error() == "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'FP64', " \
                        "but model 'add_sub' expects 'FP32'"


def test_header_length_larger_than_body(alive):
    # Triton: server src/http_server.cc, HTTPAPIServer::GetInferenceHeaderLength.
    body = json.dumps(add_sub_json()).encode()
    r = post(alive.http_url, INFER, body, {IHCL: str(len(body) + 1)})
    assert r.status == 400
    assert r.error() == f"inference header size should be in range (0, {len(body)}), got: {len(body) + 1}"
    for bad in ("-1", "ten", "1" * 40):
        r = post(alive.http_url, INFER, body, {IHCL: bad})
        assert r.status == 400, bad


def test_huge_binary_data_size(alive):
    header = _input([1, 16], parameters={"binary_data_size": 2**64 - 1})
    r = post(alive.http_url, INFER, header + b"\0" * 64, {IHCL: str(len(header))})
    # Triton's words name the bytes missing (server src/http_server.cc, EVBufferToInput).
    assert r.status == 400 and f"expecting {2**64 - 1 - 64} additional bytes" in r.error(), r
    header = _input([1, 16], parameters={"binary_data_size": 2**40})
    r = post(alive.http_url, INFER, header + b"\0" * 64, {IHCL: str(len(header))})
    assert (r.status, r.error()) == (400, f"unexpected size for input 'INPUT0', expecting {2**40 - 64} "
                                          "additional bytes for model 'add_sub'"), r


def test_extra_binary_data(alive):
    # Triton: server src/http_server.cc, EVBufferToInput ("unexpected additional input data").
    header = json.dumps({"inputs": [
        {"name": n, "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}
        for n in ("INPUT0", "INPUT1")]}).encode()
    r = post(alive.http_url, INFER, header + b"\0" * 129, {IHCL: str(len(header))})
    assert (r.status, r.error()) == (400, "unexpected additional input data for model 'add_sub'")


def test_bad_encodings(alive):
    # 501 "Unsupported compression type" with Accept-Encoding: kiln's reading of Triton's answer
    # (crates/protocol/src/protocol/http/body.rs); the text was not found in the searched Triton sources.
    # "failed to decompress" is kiln's wording.
    r = post(alive.http_url, INFER, b"{}", {"Content-Encoding": "br"})
    assert (r.status, r.error()) == (501, "Unsupported compression type")
    assert r.headers["accept-encoding"] == "gzip, deflate"
    r = post(alive.http_url, INFER, b"not gzip", {"Content-Encoding": "gzip"})
    assert r.status == 400 and "failed to decompress" in r.error()


def test_body_over_the_default_limit(alive):
    """Triton's default --http-max-input-size is 64 MiB; a larger declared body is refused up front."""
    # The 413 and its text ("request body exceeds the maximum input size of N bytes ...") are
    # kiln's own; the searched Triton sources hold no such text.
    host, port = alive.http_url.rsplit(":", 1)
    import http.client
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("POST", INFER)
        conn.putheader("Content-Length", str(64 * 1024 * 1024 + 1))
        conn.endheaders()
        r = conn.getresponse()
        assert r.status == 413 and "maximum input size of 67108864 bytes" in json.loads(r.read())["error"]
    finally:
        conn.close()


def test_unknown_model_and_version(alive):
    # Triton: core src/model_lifecycle.cc, ModelLifeCycle::GetModel, prefixed by
    # ModelRepositoryManager::GetModel (see test_grpc_errors.py).
    body = json.dumps(add_sub_json()).encode()
    r = post(alive.http_url, "/v2/models/nope/infer", body)
    assert (r.status, r.error()) == (404, "Request for unknown model: 'nope' is not found")
    r = post(alive.http_url, "/v2/models/add_sub/versions/4/infer", body)
    assert r.status == 404 and "version 4 is not found" in r.error()
