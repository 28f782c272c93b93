"""Triton's Python backend (see test_python_backend_basics.py): the stubs' interpreter and
environment, each test with a kiln of its own. A missing interpreter fails the load with the
reason; a packed environment (EXECUTION_ENV_PATH) is unpacked into a private folder, activated,
unpacked again when its archive changes, and removed when kiln exits; stubs see none of the
server's secrets, only PATH and the like and what --python-env-passthrough names."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time

import numpy as np
import tritonclient.grpc as grpcclient

from conftest import RPC_TIMEOUT, start_server, stop_server
from python_backend_models import PY_FAULTY, PY_FAULTY_CONFIG, fixture_text, write_model


def test_a_missing_interpreter_or_numpy_fails_the_load_with_the_reason(tmp_path):
    write_model(tmp_path, "py_faulty", PY_FAULTY_CONFIG, PY_FAULTY)
    server = start_server([tmp_path], name="kiln-python-missing", env={"KILN_PYTHON": "/nonexistent/python3"})
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        entry = client.get_model_repository_index().models[0]
        assert entry.state == "UNAVAILABLE"
        assert "cannot start Python ('/nonexistent/python3')" in entry.reason  # kiln's text
    finally:
        stop_server(server)


# py_env (and py_bad_env, its config renamed), written into the test's repository.
PY_ENV_CONFIG = fixture_text("py_env", "config.pbtxt")
PY_ENV = fixture_text("py_env", "1/model.py")


def pack_environment(archive, value, scratch):
    """A packed environment as venv-pack makes one: a venv (its `bin/python3`, `pyvenv.cfg`,
    `bin/activate`) whose site-packages has a module of its own, `envmark` (VALUE = `value`),
    and reaches this interpreter's packages (numpy) through a .pth file; tarred and gzipped,
    entries relative to the environment's root as conda-pack writes them."""
    env = scratch / f"env-{value}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "envmark.py").write_text(f"VALUE = {value!r}\n")
    (site / "kiln_conformance.pth").write_text(os.path.dirname(os.path.dirname(np.__file__)) + "\n")
    with tarfile.open(archive, "w:gz") as tar:
        for child in sorted(env.iterdir()):
            tar.add(child, arcname=child.name)
    shutil.rmtree(env)


def test_a_packed_environment_is_unpacked_activated_and_removed_at_exit(tmp_path):
    repo, temp = tmp_path / "repo", tmp_path / "temp"
    temp.mkdir()
    write_model(repo, "py_env", PY_ENV_CONFIG, PY_ENV)
    archive = repo / "py_env" / "env.tar.gz"
    pack_environment(archive, "first", tmp_path)
    write_model(repo, "py_bad_env", PY_ENV_CONFIG.replace('"py_env"', '"py_bad_env"'), PY_ENV)
    (repo / "py_bad_env" / "env.tar.gz").write_bytes(b"\x1f\x8b not really gzip")
    server = start_server([repo], name="kiln-python-env", env={"TMPDIR": str(temp)},
                          extra_args=["--model-control-mode", "explicit", "--load-model", "*"])
    try:
        # One private directory (mode 0700, a random name) holds this server's environments.
        made = [p for p in temp.iterdir() if p.name.startswith("kiln_python_env_")]
        assert len(made) == 1, made
        unpacked = made[0]
        assert unpacked.name != f"kiln_python_env_{server.proc.pid}"
        assert unpacked.stat().st_mode & 0o777 == 0o700
        client = grpcclient.InferenceServerClient(server.grpc_url)

        def where():
            x = grpcclient.InferInput("X", [1], "FP32")
            x.set_data_from_numpy(np.array([1], dtype=np.float32))
            prefix, virtual_env, library, value = (
                w.decode() for w in client.infer("py_env", [x]).as_numpy("WHERE"))
            return prefix, virtual_env, library, value

        prefix, virtual_env, library, value = where()
        # The stub runs the unpacked environment's Python, after its bin/activate (which sets
        # VIRTUAL_ENV), with its lib first on LD_LIBRARY_PATH, as Triton starts its stubs.
        assert os.path.dirname(prefix) == str(unpacked), prefix
        assert virtual_env
        assert library == f"{prefix}/lib"
        assert value == "first"
        bad = {m.name: m for m in client.get_model_repository_index().models}["py_bad_env"]
        assert bad.state == "UNAVAILABLE"
        assert "EXECUTION_ENV_PATH" in bad.reason and "could not be unpacked" in bad.reason, bad.reason

        # A new archive in its place is unpacked again when the model loads again.
        pack_environment(archive, "second", tmp_path)
        later = time.time() + 5
        os.utime(archive, (later, later))
        client.load_model("py_env")
        prefix2, _, _, value2 = where()
        assert value2 == "second"
        assert prefix2 != prefix and os.path.dirname(prefix2) == str(unpacked)
    finally:
        stop_server(server)
    assert not unpacked.exists(), "kiln left its unpacked environments behind"


# py_environ, written into the test's repository.
PY_ENVIRON_CONFIG = fixture_text("py_environ", "config.pbtxt")
PY_ENVIRON = fixture_text("py_environ", "1/model.py")


def test_stubs_see_no_server_secret_but_path_and_passthrough_variables(tmp_path):
    """Model code runs in stubs that see a short list of kiln's variables (PATH, PYTHON*, ...)
    and those named by --python-env-passthrough: not the bearer token or cloud credentials kiln
    itself was started with."""
    write_model(tmp_path, "py_environ", PY_ENVIRON_CONFIG, PY_ENVIRON)
    secrets = {"KILN_INFERENCE_BEARER_TOKEN": "bearer-secret-value",
               "AWS_ACCESS_KEY_ID": "aws-key-id-value", "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
               "GOOGLE_APPLICATION_CREDENTIALS": "/google-secret-path.json",
               "AZURE_STORAGE_ACCOUNT_KEY": "azure-secret-value"}
    env = {**secrets, "KILN_PYTHON": sys.executable, "KILN_TEST_PASSED": "passed", "KILN_TEST_KEPT_BACK": "kept"}
    server = start_server([tmp_path], name="kiln-python-environ", env=env,
                          extra_args=["--python-env-passthrough", "KILN_TEST_PASSED"])
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        x = grpcclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([1], dtype=np.float32))
        bearer = {"authorization": f"Bearer {secrets['KILN_INFERENCE_BEARER_TOKEN']}"}
        result = client.infer("py_environ", [x], headers=bearer, client_timeout=RPC_TIMEOUT)
        seen = dict(item.decode().split("=", 1) for item in result.as_numpy("ENV"))
        for name, value in secrets.items():
            assert name not in seen
            assert not any(value in v for v in seen.values()), f"{name}'s value reached the model"
        assert seen["PATH"] == os.environ["PATH"]
        assert seen["KILN_TEST_PASSED"] == "passed"
        assert "KILN_TEST_KEPT_BACK" not in seen and "KILN_PYTHON" not in seen
        client.close()
    finally:
        stop_server(server)
