"""Custom-operator libraries (`model_operations { op_library_filename }`), as Triton's ONNX Runtime
backend registers them: a graph using an operator from onnx-extended's tutorial library
(`MyCustomOp`, Z = X + Y, domain onnx_extended.ortops.tutorial.cpu; `.ci/setup.sh ortops`) loads
and answers through tritonclient once its config names the library and kiln was started with
`--allowed-op-library`; the same graph without the library fails with ONNX Runtime's message, and a
library outside the allowed directory is refused before anything is loaded."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from conftest import REPO_ROOT, RPC_TIMEOUT, start_server, stop_server

LIBRARY_DIR = REPO_ROOT / ".kiln" / "ortops" / "onnx_extended" / "ortops" / "tutorial" / "cpu"
LIBRARY = LIBRARY_DIR / "libortops_tutorial_cpu.so"
DOMAIN = "onnx_extended.ortops.tutorial.cpu"


def custom_add_model(repo, name: str, libraries: list[str]) -> None:
    """`name`: Z = MyCustomOp(X, Y) on [batch, 4] FP32 tensors; the config names `libraries`
    (no model_operations when empty) and leaves the rest to auto-complete."""
    node = helper.make_node("MyCustomOp", ["X", "Y"], ["Z"], domain=DOMAIN)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 4]) for n in ("X", "Y", "Z")]
    graph = helper.make_graph([node], name, io[:2], io[2:])
    model = helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, repo / name / "1" / "model.onnx")
    operations = " ".join(f'op_library_filename: "{lib}"' for lib in libraries)
    (repo / name / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 8\ndynamic_batching { }\n'
        + (f"model_operations {{ {operations} }}\n" if libraries else ""))


@pytest.fixture(scope="module")
def ops_server(tmp_path_factory):
    assert LIBRARY.is_file(), f"{LIBRARY} is missing: run .ci/setup.sh ortops"
    root = tmp_path_factory.mktemp("custom-ops")
    repo = root / "repo"
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(LIBRARY, elsewhere / LIBRARY.name)
    custom_add_model(repo, "custom_add", [str(LIBRARY)])
    custom_add_model(repo, "custom_add_by_name", [LIBRARY.name])
    custom_add_model(repo, "custom_add_no_library", [])
    custom_add_model(repo, "custom_add_elsewhere", [str(elsewhere / LIBRARY.name)])
    for n in range(6):  # loaded in parallel with the others: ONNX Runtime's registration races
        custom_add_model(repo, f"custom_add_copy{n}", [str(LIBRARY)])
    server = start_server([repo], name="custom-ops",
                          extra_args=["--allowed-op-library", str(LIBRARY_DIR)])
    yield server
    stop_server(server)


def test_models_sharing_a_library_all_load(ops_server):
    """ONNX Runtime adds a library's operator domain to a process-wide map without a lock; kiln
    creates such sessions one at a time, so models loading in parallel all load."""
    entries = index(ops_server)
    names = ["custom_add", "custom_add_by_name"] + [f"custom_add_copy{n}" for n in range(6)]
    assert {name: entries[name].get("state") for name in names} == {name: "READY" for name in names}, entries


def index(server) -> dict:
    client = httpclient.InferenceServerClient(server.http_url)
    return {m["name"]: m for m in client.get_model_repository_index()}


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
@pytest.mark.parametrize("model", ["custom_add", "custom_add_by_name"])
def test_a_model_with_custom_operators_answers(ops_server, module, model):
    if module is grpcclient:
        client, timeout = grpcclient.InferenceServerClient(ops_server.grpc_url), {"client_timeout": RPC_TIMEOUT}
    else:
        client, timeout = httpclient.InferenceServerClient(
            ops_server.http_url, connection_timeout=RPC_TIMEOUT, network_timeout=RPC_TIMEOUT), {}
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = np.full((2, 4), 10, np.float32)
    inputs = []
    for name, data in (("X", x), ("Y", y)):
        tensor = module.InferInput(name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    result = client.infer(model, inputs, **timeout)
    np.testing.assert_array_equal(result.as_numpy("Z"), x + y)


def test_the_config_keeps_model_operations(ops_server):
    config = httpclient.InferenceServerClient(ops_server.http_url).get_model_config("custom_add")
    assert config["model_operations"] == {"op_library_filename": [str(LIBRARY)]}
    # auto-complete read the graph through a session that had the library too
    assert [i["name"] for i in config["input"]] == ["X", "Y"]


def test_without_the_library_onnx_runtime_does_not_know_the_operator(ops_server):
    entry = index(ops_server)["custom_add_no_library"]
    assert entry["state"] == "UNAVAILABLE"
    assert "MyCustomOp" in entry["reason"] and "is not a registered function/op" in entry["reason"], entry


def test_a_library_outside_the_allowed_ones_is_refused(ops_server):
    entry = index(ops_server)["custom_add_elsewhere"]
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"].startswith(
        "model_operations of model 'custom_add_elsewhere': op library '"), entry
    assert "is not allowed" in entry["reason"] and "--allowed-op-library" in entry["reason"], entry
    ops_server.assert_alive()
