"""Repository agents (`model_repository_agents`): Triton's checksum agent checks the MD5 digest of
the files its parameters name (`MD5:<path relative to the model directory>`) before the model
loads; a mismatch, or an agent kiln does not have, fails the load with the reason in the index and
in the answer to an explicit load, and the server serves on."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, RPC_TIMEOUT, start_server, stop_server


def checked_copy(repo, name: str, agents: str) -> None:
    """add_sub under another name, with `agents` as its model_repository_agents block."""
    shutil.copytree(BUNDLED_REPO / "add_sub", repo / name)
    config = repo / name / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_sub"', f'name: "{name}"')
                      + f"model_repository_agents {{ agents [ {agents} ] }}\n")


def checksum_agent(files: dict[str, str]) -> str:
    parameters = ", ".join(f'{{ key: "MD5:{path}", value: "{digest}" }}' for path, digest in files.items())
    return f'{{ name: "checksum", parameters [ {parameters} ] }}'


@pytest.fixture(scope="module")
def agents_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("agents") / "repo"
    repo.mkdir()
    digest = hashlib.md5((BUNDLED_REPO / "add_sub" / "1" / "model.onnx").read_bytes()).hexdigest()
    checked_copy(repo, "checked", checksum_agent({"1/model.onnx": digest}))
    checked_copy(repo, "tampered", checksum_agent({"1/model.onnx": "0" * 32}))
    checked_copy(repo, "escaping", checksum_agent({"../checked/1/model.onnx": digest}))
    checked_copy(repo, "decrypting", '{ name: "decrypt" }')
    server = start_server([repo], name="repository-agents", extra_args=[
        "--model-control-mode=explicit", "--load-model=checked"])
    yield server, digest
    stop_server(server)


def test_a_model_whose_files_match_loads_and_answers(agents_server):
    server, _ = agents_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "FP32")
        tensor.set_data_from_numpy(a)
        inputs.append(tensor)
    result = client.infer("checked", inputs, client_timeout=RPC_TIMEOUT)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


# "Mismatched MD5 hash for file <f>, expect: ..., got: ..." is Triton's checksum repository agent's
# (its own repository, triton-inference-server/checksum_repository_agent; server's
# qa/L0_repoagent_checksum greps the start of it); "load failed for
# model '<m>': ", the relative-path rule and the unavailable agent are kiln's texts.
@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
@pytest.mark.parametrize("model, reason", [
    ("tampered", "Mismatched MD5 hash for file 1/model.onnx, expect: 00000000000000000000000000000000, got: "),
    ("escaping", "path '../checked/1/model.onnx' must be relative and stay within the model directory"),
    ("decrypting", "repository agent 'decrypt' is not available"),
])
def test_a_failed_check_fails_the_load(agents_server, module, model, reason):
    server, digest = agents_server
    client = module.InferenceServerClient(server.grpc_url if module is grpcclient else server.http_url)
    with pytest.raises(InferenceServerException) as e:
        client.load_model(model)
    assert f"load failed for model '{model}': " in str(e.value), e.value
    assert reason in str(e.value), e.value
    if model == "tampered":
        assert str(e.value).rstrip().endswith(digest), e.value
    entry = {m["name"]: m for m in httpclient.InferenceServerClient(server.http_url)
             .get_model_repository_index()}[model]
    assert entry["state"] == "UNAVAILABLE" and reason in entry["reason"], entry
    assert client.is_model_ready("checked")
