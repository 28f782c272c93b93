"""Security suite (kiln issue #48, item 2): code and interpreters come from the repository.

On 61077f8 (started as Triton's QA harness starts it: explicit mode, `--load-model=*`) a load
with `config` `{"backend": "python"}` and a `file:1/model.py` override ran the client's Python as
the server's user; `EXECUTION_ENV_PATH` named any interpreter (also as
`$$TRITON_MODEL_DIRECTORY/../..`); SageMaker's `POST /models {"url": ...}` loaded any directory
but /dev, /proc and /sys. Triton 2.51 does the same. kiln's defaults are closed, each one flag
away from Triton's behaviour: `--allow-code-in-load-overrides`, `--python-env-root DIR` (`/`:
anywhere), `--sagemaker-model-root DIR` (default /opt/ml/models, where SageMaker puts models;
`/`: anywhere)."""

import json
import os
import subprocess
import sys

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import (BUNDLED_REPO, assert_triton_error, find_free_port, http_request, start_server,
                      stop_server)

pytestmark = pytest.mark.security

T = 30
FLAG = "--allow-code-in-load-overrides"
ADD_SUB_ONNX = (BUNDLED_REPO / "add_sub" / "1" / "model.onnx").read_bytes()

PY_CONFIG = {"backend": "python", "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
             "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}]}

PY_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        open(MARK, "a").write(args["model_name"] + "\\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)]) for r in requests]
'''


def py_model(mark):
    return f"MARK = {str(mark)!r}\n" + PY_MODEL


def doubles(client, name):
    x = grpcclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([21], dtype=np.float32))
    assert client.infer(name, [x], client_timeout=T).as_numpy("Y").tolist() == [42]


def add_sub_config(name):
    tensor = lambda n: {"name": n, "data_type": "TYPE_FP32", "dims": [16]}  # noqa: E731
    return json.dumps({"name": name, "backend": "onnxruntime", "max_batch_size": 8,
                       "input": [tensor("INPUT0"), tensor("INPUT1")],
                       "output": [tensor("OUTPUT0"), tensor("OUTPUT1")]})


def test_code_in_load_overrides_is_refused_unless_the_flag_allows_it(tmp_path):
    repo, backends, mark = tmp_path / "repo", tmp_path / "backends", tmp_path / "ran.txt"
    repo.mkdir()
    # A Python-based backend (Triton's <backend-directory>/<name>/model.py), the operator's.
    (backends / "pyish").mkdir(parents=True)
    (backends / "pyish" / "model.py").write_text(py_model(mark))
    model_py = {"file:1/model.py": py_model(mark).encode()}
    args = ["--model-control-mode=explicit", "--load-model=*", "--backend-directory", str(backends)]
    env = {"KILN_PYTHON": sys.executable}
    server = start_server([repo], name="kiln-security-code-closed", env=env, extra_args=args)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        refusals = [
            ("uploaded_py", dict(PY_CONFIG), model_py, "file 'file:1/model.py' is Python code"),
            ("uploaded_txt", dict(PY_CONFIG, default_model_filename="model.txt"),
             {"file:1/model.txt": py_model(mark).encode()}, "its config names the Python backend"),
            ("uploaded_pth", json.loads(add_sub_config("uploaded_pth")),
             {"file:1/model.onnx": ADD_SUB_ONNX, "file:1/evil.pth": b"import os"}, "file 'file:1/evil.pth' is Python code"),
            ("uploaded_pyish", dict(PY_CONFIG, backend="pyish"), {"file:1/model.json": b"{}"},
             "its config names the Python-based backend 'pyish'"),
        ]
        for name, config, files, why in refusals:
            with pytest.raises(InferenceServerException) as e:
                client.load_model(name, config=json.dumps(dict(config, name=name)), files=files, client_timeout=T)
            assert_triton_error(e.value, grpc.StatusCode.INVALID_ARGUMENT, f"load of model '{name}' refused: {why}",
                                "would run as the server's user", FLAG)
            assert not client.is_model_ready(name, client_timeout=T)
        assert not mark.exists(), "code sent with a load ran"
        # Overrides that bring an ONNX model and its data load as before.
        client.load_model("uploaded_onnx", config=add_sub_config("uploaded_onnx"),
                          files={"file:1/model.onnx": ADD_SUB_ONNX}, client_timeout=T)
        assert client.is_model_ready("uploaded_onnx", client_timeout=T)
    finally:
        stop_server(server)
    server = start_server([repo], name="kiln-security-code-open", env=env, extra_args=args + [FLAG])
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.load_model("uploaded_py", config=json.dumps(dict(PY_CONFIG, name="uploaded_py")), files=model_py,
                          client_timeout=T)
        doubles(client, "uploaded_py")
        client.load_model("uploaded_pyish", config=json.dumps(dict(PY_CONFIG, backend="pyish", name="uploaded_pyish")),
                          files={"file:1/model.json": b"{}"}, client_timeout=T)
        doubles(client, "uploaded_pyish")
        assert mark.read_text().split() == ["uploaded_py", "uploaded_pyish"]
    finally:
        stop_server(server)


def make_environment(env):
    """A Python environment (a venv) at `env` that reaches this interpreter's packages (numpy)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "kiln_conformance.pth").write_text(os.path.dirname(os.path.dirname(np.__file__)) + "\n")


def write_py_model(repo, name, env_path, mark):
    config = (f'name: "{name}"\nbackend: "python"\n'
              'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
              'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
              f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env_path}" }} }}\n')
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(py_model(mark))


def test_execution_env_path_must_be_in_the_repository_or_a_root_named(tmp_path):
    repo, outside, mark = tmp_path / "repo", tmp_path / "outside", tmp_path / "ran.txt"
    make_environment(outside / "env")
    write_py_model(repo, "py_absolute", outside / "env", mark)
    write_py_model(repo, "py_climbing", "$$TRITON_MODEL_DIRECTORY/../../outside/env", mark)
    # Inside the model directory (Triton's usual layout), through the operator's link.
    write_py_model(repo, "py_inside", "$$TRITON_MODEL_DIRECTORY/env", mark)
    (repo / "py_inside" / "env").symlink_to(outside / "env")
    args = ["--model-control-mode=explicit", "--load-model=*"]
    server = start_server([repo], name="kiln-security-env-closed", extra_args=args)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        index = {m.name: (m.state, m.reason) for m in client.get_model_repository_index(client_timeout=T).models}
        for name in ["py_absolute", "py_climbing"]:
            state, reason = index[name]
            assert state == "UNAVAILABLE", f"{name}: {index[name]}"
            assert f"({outside / 'env'}) is outside the model repository {repo}: kiln runs Python environments " \
                   "from the model's repository and the --python-env-root directories only" in reason, reason
        assert index["py_inside"][0] == "READY", index["py_inside"]
        doubles(client, "py_inside")
        with pytest.raises(InferenceServerException) as e:
            client.load_model("py_climbing", client_timeout=T)
        assert_triton_error(e.value, grpc.StatusCode.INVALID_ARGUMENT, "is outside the model repository")
        assert mark.read_text().split() == ["py_inside"]
    finally:
        stop_server(server)
    server = start_server([repo], name="kiln-security-env-open", extra_args=args + ["--python-env-root", str(outside)])
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        for name in ["py_absolute", "py_climbing", "py_inside"]:
            doubles(client, name)
    finally:
        stop_server(server)


def test_sagemaker_loads_only_from_the_model_roots(tmp_path):
    import shutil
    elsewhere = tmp_path / "elsewhere" / "model"
    shutil.copytree(BUNDLED_REPO / "add_sub", elsewhere)
    repo = tmp_path / "repo"
    repo.mkdir()

    def load(url, model_hash, directory):
        body = json.dumps({"model_name": model_hash, "url": str(directory)}).encode()
        return http_request(url, "POST", "/models", body, {"Content-Type": "application/json",
                                                           "X-Amzn-SageMaker-Target-Model": f"{model_hash}.tar.gz"})

    def sagemaker(name, extra):
        port = find_free_port()
        server = start_server([repo], name=name, extra_args=[
            "--allow-sagemaker=true", "--sagemaker-port", str(port), "--model-control-mode=explicit", *extra])
        return server, f"127.0.0.1:{port}"

    server, url = sagemaker("kiln-security-sagemaker-closed", [])
    try:
        for directory in [elsewhere, f"/opt/ml/models/../../..{elsewhere}"]:
            refused = load(url, "1111", directory)
            assert refused.status == 400, refused.body
            assert json.loads(refused.body)["error"] == (
                f'Invalid URL: {directory}. "url" must be a directory under /opt/ml/models (kiln\'s '
                '--sagemaker-model-root; --sagemaker-model-root=/ allows any, as Triton before 2.70)')
        assert json.loads(http_request(url, "GET", "/models").body) == {"models": []}
    finally:
        stop_server(server)
    server, url = sagemaker("kiln-security-sagemaker-open", ["--sagemaker-model-root", str(elsewhere.parent)])
    try:
        assert load(url, "1111", elsewhere).status == 200
        assert load(url, "0dev", "/proc/self").status == 400  # as Triton, whatever the roots
    finally:
        stop_server(server)
