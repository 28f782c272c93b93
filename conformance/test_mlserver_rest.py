"""MLServer 1.7.1's REST-side types and codecs against kiln's REST API.

mlserver cannot share a process with tritonclient (same protobuf names), so
mlserver_rest_client.py runs in a subprocess and prints JSON facts; the asserts are here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import CONFORMANCE_DIR

CLIENT = CONFORMANCE_DIR / "mlserver_rest_client.py"


@pytest.fixture(scope="module")
def flows(server):
    proc = subprocess.run([sys.executable, str(CLIENT), server.http_url], capture_output=True, text=True,
                          timeout=180, cwd=str(CONFORMANCE_DIR))
    assert proc.returncode == 0, f"mlserver_rest_client.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"mlserver_rest_client.py printed no JSON:\nstdout={proc.stdout[-2000:]}\n"
                    f"stderr={proc.stderr[-2000:]}")


def flow(flows, name) -> dict:
    r = flows[name]
    assert r.get("ok"), f"{name}: {r.get('error')}\n{r.get('traceback', '')}"
    return r


def test_string_request_codec_round_trip(flows):
    r = flow(flows, "string")
    assert r["status"] == 200
    assert r["decoded"] == r["expected"] and r["roundtrip_json"] is True
    assert (r["model_name"], r["model_version"]) == ("string_echo", "1")
    assert (r["output_name"], r["output_datatype"], r["output_shape"]) == ("output-1", "BYTES", [1, 1])
    # MLServer's content types are carried through, so its codecs pick the right decoder.
    assert r["output_content_type"] == "str" and r["response_content_type"] == "str"
    # `requests` asks for gzip by default; the answer is compressed and decodes transparently.
    assert r["content_encoding"] == "gzip"


def test_numpy_codec_add_sub(flows):
    r = flow(flows, "numpy")
    assert r["id"] == "mlserver-1"
    assert r["outputs"] == ["OUTPUT0", "OUTPUT1"]
    assert r["shapes"] == {"OUTPUT0": [2, 16], "OUTPUT1": [2, 16]}
    assert r["dtypes"] == {"OUTPUT0": "float32", "OUTPUT1": "float32"}
    assert r["add_ok"] and r["sub_ok"]


def test_plain_request_input_int32(flows):
    r = flow(flows, "int_types")
    assert r["status"] == 200 and r["datatypes"] == ["INT32"]
    assert r["decoded"] == {"C": [9, -6, 93]}


def test_metadata_types_validate(flows):
    r = flow(flows, "metadata")
    assert r["server_name"] == "kiln" and "binary_tensor_data" in r["extensions"]
    assert (r["model_name"], r["platform"], r["versions"]) == ("add_sub", "onnxruntime_onnx", ["1"])
    assert r["inputs"] == [["INPUT0", "FP32", [-1, 16]], ["INPUT1", "FP32", [-1, 16]]]


def test_repository_index_types_validate(flows):
    r = flow(flows, "repository_index")
    assert ["add_sub", "1", "READY", ""] in r["models"]
    assert all(state == "READY" for _, _, state, _ in r["models"])


def test_error_response_type(flows):
    r = flow(flows, "unknown_model")
    assert (r["status"], r["error"]) == (404, "Request for unknown model: 'nope' is not found")
