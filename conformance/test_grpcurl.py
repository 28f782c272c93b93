"""grpcurl 1.8.6 (reflection v1alpha, protojson) against kiln."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import REPO_ROOT


def _grpcurl() -> str | None:
    for cand in (REPO_ROOT / ".venv" / "bin" / "grpcurl", REPO_ROOT / ".kiln" / "bin" / "grpcurl"):
        if cand.exists() and os.access(cand, os.X_OK):
            return str(cand)
    return shutil.which("grpcurl")


GRPCURL = _grpcurl()
pytestmark = pytest.mark.skipif(GRPCURL is None, reason="grpcurl not installed (.ci/setup.sh python)")


def grpcurl(addr: str, *args: str, data=None, check=True) -> subprocess.CompletedProcess:
    cmd = [GRPCURL, "-plaintext", "-max-time", "30"]
    if data is not None:
        cmd += ["-d", data if isinstance(data, str) else json.dumps(data)]
    cmd += [addr, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if check:
        assert proc.returncode == 0, f"{' '.join(cmd)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def call(addr: str, method: str, data=None) -> dict:
    return json.loads(grpcurl(addr, f"inference.GRPCInferenceService/{method}", data=data or {}).stdout)


def test_list_services(grpc_url):
    services = grpcurl(grpc_url, "list").stdout.split()
    assert "inference.GRPCInferenceService" in services
    assert "grpc.health.v1.Health" in services


def test_list_methods(grpc_url):
    methods = grpcurl(grpc_url, "list", "inference.GRPCInferenceService").stdout.split()
    for rpc in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
                "ModelStreamInfer", "ModelConfig", "ModelStatistics", "RepositoryIndex",
                "RepositoryModelLoad", "RepositoryModelUnload"):
        assert f"inference.GRPCInferenceService.{rpc}" in methods, (rpc, methods)


def test_describe_service(grpc_url):
    out = grpcurl(grpc_url, "describe", "inference.GRPCInferenceService").stdout
    assert "inference.GRPCInferenceService is a service" in out
    assert "rpc ModelInfer ( .inference.ModelInferRequest ) returns ( .inference.ModelInferResponse );" in out
    assert ("rpc ModelStreamInfer ( stream .inference.ModelInferRequest ) returns "
            "( stream .inference.ModelStreamInferResponse );") in out


def test_describe_messages(grpc_url):
    out = grpcurl(grpc_url, "describe", "inference.ModelInferRequest").stdout
    assert "repeated bytes raw_input_contents = 7;" in out
    out = grpcurl(grpc_url, "describe", "inference.ModelConfig").stdout  # model_config.proto is reachable too
    assert "int32 max_batch_size = 4;" in out
    out = grpcurl(grpc_url, "describe", "inference.ModelMetadataResponse").stdout
    assert "repeated .inference.ModelMetadataResponse.TensorMetadata inputs = 4;" in out
    assert "= 6;" not in out, "Triton's ModelMetadataResponse has no field 6"


def test_server_live_and_metadata(grpc_url):
    assert call(grpc_url, "ServerLive") == {"live": True}
    md = call(grpc_url, "ServerMetadata")
    assert md["name"] == "kiln" and md["version"]


def test_model_infer_typed_json(grpc_url):
    a = np.arange(16, dtype=np.float32) / 4
    b = np.full(16, 0.5, np.float32)
    body = {
        "model_name": "add_sub",
        "id": "grpcurl-1",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "contents": {"fp32_contents": a.tolist()}},
            {"name": "INPUT1", "datatype": "FP32", "shape": ["1", "16"], "contents": {"fp32Contents": b.tolist()}},
        ],
    }
    resp = call(grpc_url, "ModelInfer", body)
    assert resp["modelName"] == "add_sub" and resp["modelVersion"] == "1" and resp["id"] == "grpcurl-1"
    assert [o["name"] for o in resp["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    for o in resp["outputs"]:
        assert o["datatype"] == "FP32" and o["shape"] == ["1", "16"]  # int64 -> JSON strings
        assert "contents" not in o
    raw = [np.frombuffer(base64.b64decode(r), dtype="<f4") for r in resp["rawOutputContents"]]
    np.testing.assert_array_equal(raw[0], a + b)
    np.testing.assert_array_equal(raw[1], a - b)


def test_model_infer_raw_json_bytes(grpc_url):
    payload = "h\u00e9llo".encode()
    raw = base64.b64encode(len(payload).to_bytes(4, "little") + payload).decode()
    body = {"model_name": "string_echo", "inputs": [{"name": "input-1", "datatype": "BYTES", "shape": [1, 1]}],
            "raw_input_contents": [raw]}
    resp = call(grpc_url, "ModelInfer", body)
    out = base64.b64decode(resp["rawOutputContents"][0])
    assert out == len(payload).to_bytes(4, "little") + payload


def test_model_config_json(grpc_url):
    cfg = call(grpc_url, "ModelConfig", {"name": "mlp_classifier", "version": "1"})["config"]
    assert cfg["name"] == "mlp_classifier" and cfg["maxBatchSize"] == 32
    assert cfg["input"][0]["dataType"] == "TYPE_FP32" and cfg["input"][0]["dims"] == ["64"]


def test_repository_index_json(grpc_url):
    models = call(grpc_url, "RepositoryIndex")["models"]
    by = {(m["name"], m.get("version", "")): m for m in models}
    assert by[("add_sub", "1")]["state"] == "READY"
    assert by[("broken", "1")]["state"] == "UNAVAILABLE" and by[("broken", "1")]["reason"]


def test_error_status_surfaces(grpc_url):
    proc = grpcurl(grpc_url, "inference.GRPCInferenceService/ModelInfer", data={"model_name": "no_such_model"},
                   check=False)
    assert proc.returncode != 0
    assert "Code: NotFound" in proc.stderr
    assert "Request for unknown model: 'no_such_model' is not found" in proc.stderr


def test_health_not_serving_when_not_ready(grpc_url):
    # the main server is not ready (broken models) -> NOT_SERVING, answered with OK status
    for data in ({}, {"service": "inference.GRPCInferenceService"}):
        out = json.loads(grpcurl(grpc_url, "grpc.health.v1.Health/Check", data=data).stdout)
        assert out == {"status": "NOT_SERVING"}, (data, out)


def test_health_serving_when_ready(bundled_server):
    addr = bundled_server.grpc_url
    assert call(addr, "ServerReady") == {"ready": True}
    for data in ({}, {"service": "inference.GRPCInferenceService"}):
        out = json.loads(grpcurl(addr, "grpc.health.v1.Health/Check", data=data).stdout)
        assert out == {"status": "SERVING"}, (data, out)
