"""MLServer 1.7.1 codecs + converters + generated stub against kiln.

mlserver cannot share a process with tritonclient (same protobuf names), so
mlserver_client.py runs in a subprocess and prints JSON facts; the asserts are here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import BUNDLED_REPO, CONFORMANCE_DIR

CLIENT = CONFORMANCE_DIR / "mlserver_client.py"


@pytest.fixture(scope="module")
def flows(server):
    proc = subprocess.run([sys.executable, str(CLIENT), server.grpc_url], capture_output=True, text=True,
                          timeout=180, cwd=str(CONFORMANCE_DIR))
    assert proc.returncode == 0, f"mlserver_client.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"mlserver_client.py printed no JSON:\nstdout={proc.stdout[-2000:]}\nstderr={proc.stderr[-2000:]}")


def flow(flows, name) -> dict:
    r = flows[name]
    assert r.get("ok"), f"{name}: {r.get('error')}\n{r.get('traceback', '')}"
    return r


@pytest.mark.parametrize("name,raw", [("string_typed", False), ("string_raw", True)])
def test_readme_string_flow(flows, name, raw):
    r = flow(flows, name)
    assert r["sent_raw_entries"] == (1 if raw else 0) and r["sent_typed"] == (not raw)
    assert r["decoded"] == r["expected"]
    assert r["roundtrip_json"] is True
    assert r["model_name"] == "string_echo" and r["model_version"] == "1"
    assert r["output_name"] == "output-1" and r["output_datatype"] == "BYTES"
    assert r["output_shape"] == [1, 1]
    assert r["raw_output_entries"] == 1 and r["typed_output"] is False, "outputs must be raw only"


@pytest.mark.parametrize("name,raw", [("numpy_typed", False), ("numpy_raw", True)])
def test_numpy_codec_add_sub(flows, name, raw):
    r = flow(flows, name)
    assert r["sent_typed"] == (not raw) and r["sent_raw_entries"] == (2 if raw else 0)
    assert r["outputs"] == ["OUTPUT0", "OUTPUT1"]
    assert r["shapes"] == {"OUTPUT0": [2, 16], "OUTPUT1": [2, 16]}
    assert r["dtypes"] == {"OUTPUT0": "float32", "OUTPUT1": "float32"}
    assert r["add_ok"] and r["sub_ok"]
    assert r["model_version"] == "1"


def test_numpy_request_codec_mlp(flows):
    import onnxruntime as ort

    r = flow(flows, "numpy_request_codec")
    assert r["shape"] == [3, 10] and r["dtype"] == "float32" and r["model_version"] == "1"
    x = np.asarray(r["x"], dtype=np.float32)
    sess = ort.InferenceSession(str(BUNDLED_REPO / "mlp_classifier" / "1" / "model.onnx"),
                                providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(np.asarray(r["y"], np.float32), sess.run(None, {"INPUT0": x})[0],
                               rtol=1e-5, atol=1e-7)


def test_content_type_parameters(flows):
    r = flow(flows, "content_type")
    assert r["request_input_content_type"] == "str"
    assert r["decoded_output"] == ["one", "zw\u00f6i"]
    assert r["decoded_response"] == ["one", "zw\u00f6i"]
    # carrying content_type to the output is optional; if present it must be the input's
    assert r["output_content_type"] in (None, "str"), r["output_content_type"]
    assert r["response_content_type"] in (None, "str"), r["response_content_type"]


def test_metadata_and_health_via_mlserver_stub(flows):
    r = flow(flows, "metadata")
    assert r["server"]["name"] == "kiln" and r["server"]["version"]
    assert isinstance(r["server"]["extensions"], list)
    assert r["live"] is True
    assert r["ready"] is False  # broken / name_mismatch fail to load
    assert r["model_ready"] == {"add_sub": True, "string_echo": True}
    m = r["models"]
    assert m["add_sub"]["name"] == "add_sub" and m["add_sub"]["versions"] == ["1"]
    assert m["add_sub"]["platform"] == "onnxruntime_onnx"
    assert m["add_sub"]["inputs"] == [["INPUT0", "FP32", [-1, 16]], ["INPUT1", "FP32", [-1, 16]]]
    assert m["add_sub"]["outputs"] == [["OUTPUT0", "FP32", [-1, 16]], ["OUTPUT1", "FP32", [-1, 16]]]
    assert m["string_echo"]["inputs"] == [["input-1", "BYTES", [-1, -1]]]
    assert sorted(m["mlp_classifier"]["versions"]) == ["1", "2"]
    assert m["identity_types"]["n_inputs"] >= 13
    for name, md in m.items():
        assert md["has_field6"] is False, f"{name}: ModelMetadataResponse field 6 must never be sent"


def test_repository_index_via_mlserver_types(flows):
    r = flow(flows, "repository_index")
    states = {}
    for name, version, state in r["models"]:
        states.setdefault(name, set()).add(state)
    assert "READY" in states["add_sub"] and "READY" in states["string_echo"]
    assert states["broken"] == {"UNAVAILABLE"}


def test_unknown_model_error_code(flows):
    r = flow(flows, "unknown_model")
    assert r["code"] == "NOT_FOUND"
    assert "Request for unknown model: 'no_such_model' is not found" in r["details"]
