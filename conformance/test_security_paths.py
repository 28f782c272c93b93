"""Security suite (kiln issue #48, item 6): whose paths are checked.

The repository is the operator's: its links are followed as the kernel follows them, never
canonicalised (a model directory linked in from a cache, a model file linked to a shared volume,
KServe's OCI "modelcar", which mounts models at `/mnt/models -> /proc/<pid>/root/models`, a link
that only resolves through `/proc` in another container's mount namespace: kserve/kserve#4753,
"modelcar does not work with triton, as triton does not support symlinks"). What a client sends
(model names, override file names, a config override's paths) is checked lexically, so that it
can never leave the model directory, whatever links the operator put there.

Servers start as Triton's QA harness starts them: explicit mode, `--load-model=*`. On 61077f8 the
linked model directories were refused ("resolves to ... outside the model repository", or "not
found" through another mount namespace) and a linked model file too, while a link inside a
directory-form `model.onnx/` was served."""

import shutil
import subprocess

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, assert_triton_error, start_server, stop_server

pytestmark = pytest.mark.security

T = 30
ADD_SUB = BUNDLED_REPO / "add_sub"
EXPLICIT_ALL = ["--model-control-mode=explicit", "--load-model=*"]


def add_sub_copy(where, name):
    """add_sub's directory copied to `where/name`, its config renamed."""
    target = where / name
    shutil.copytree(ADD_SUB, target)
    config = target / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_sub"', f'name: "{name}"'))
    return target


def serves(client, name):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 0.5, dtype=np.float32)
    inputs = []
    for tensor, value in (("INPUT0", a), ("INPUT1", b)):
        inp = grpcclient.InferInput(tensor, [1, 16], "FP32")
        inp.set_data_from_numpy(value)
        inputs.append(inp)
    result = client.infer(name, inputs, client_timeout=T)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)


def index(client):
    return {m.name: (m.state, m.reason) for m in client.get_model_repository_index(client_timeout=T).models}


def ready_and_serving(client, *names):
    states = index(client)
    for name in names:
        assert states[name][0] == "READY", f"{name}: {states.get(name)}"
        serves(client, name)


@pytest.fixture
def sleeper():
    """A process whose `/proc/<pid>/root` the modelcar links go through."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def test_linked_model_directories_and_files_are_followed(tmp_path):
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    repo.mkdir()
    outside.mkdir()
    # A model directory linked in from elsewhere (a cache, another volume).
    (repo / "linked_dir").symlink_to(add_sub_copy(outside, "linked_dir"))
    # A model file linked to a shared copy outside the model directory.
    shutil.copy(ADD_SUB / "1" / "model.onnx", outside / "model.onnx")
    linked_file = add_sub_copy(repo, "linked_file")
    (linked_file / "1" / "model.onnx").unlink()
    (linked_file / "1" / "model.onnx").symlink_to(outside / "model.onnx")
    # The same link inside a directory-form model.onnx/ (served on 61077f8 already).
    directory_form = add_sub_copy(repo, "directory_form")
    (directory_form / "1" / "model.onnx").unlink()
    (directory_form / "1" / "model.onnx").mkdir()
    (directory_form / "1" / "model.onnx" / "model.onnx").symlink_to(outside / "model.onnx")
    server = start_server([repo], name="kiln-security-linked", extra_args=EXPLICIT_ALL)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        ready_and_serving(client, "linked_dir", "linked_file", "directory_form")
        # Loaded again through the API, the same way.
        client.load_model("linked_dir", client_timeout=T)
        serves(client, "linked_dir")
    finally:
        stop_server(server)


def test_a_modelcar_link_through_proc_is_followed_as_written(tmp_path, sleeper):
    """`repo/m -> /proc/<pid>/root/<dir>/m`: canonicalised, that is `<dir>/m`, outside the
    repository (refused on 61077f8); followed as written, it is the model."""
    repo, image = tmp_path / "repo", tmp_path / "image"
    repo.mkdir()
    image.mkdir()
    model = add_sub_copy(image, "modelcar")
    (repo / "modelcar").symlink_to(f"/proc/{sleeper.pid}/root{model}")
    server = start_server([repo], name="kiln-security-modelcar", extra_args=EXPLICIT_ALL)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        ready_and_serving(client, "modelcar")
    finally:
        stop_server(server)


def unshared_model(mount_point, source):
    """A process in a mount namespace of its own where `mount_point` is a tmpfs holding a copy
    of `source` as `m` (KServe's modelcar: the model is in another container's file system);
    None where this machine cannot make one (not root, no CAP_SYS_ADMIN)."""
    if shutil.which("unshare") is None:
        return None
    script = 'mount -t tmpfs kiln-modelcar "$1" && cp -r "$2" "$1/m" && echo ready && exec sleep 600'
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                             str(mount_point), str(source)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if proc.stdout.readline().strip() != b"ready":
        proc.kill()
        proc.wait()
        return None
    return proc


def test_a_modelcar_in_another_mount_namespace_is_followed(tmp_path):
    """The model exists only in another mount namespace, reached through `/proc/<pid>/root`:
    canonicalised, the path names a directory of this namespace, which is empty (on 61077f8:
    "not found"); followed as written, it is the other namespace's model."""
    repo, source, mount_point = tmp_path / "repo", tmp_path / "source", tmp_path / "mnt"
    for d in (repo, source, mount_point):
        d.mkdir()
    model = add_sub_copy(source, "modelcar_ns")
    car = unshared_model(mount_point, model)
    if car is None:
        pytest.skip("unshare --mount is not available here (needs root or CAP_SYS_ADMIN)")
    try:
        assert list(mount_point.iterdir()) == [], "the model must be in the other namespace only"
        (repo / "modelcar_ns").symlink_to(f"/proc/{car.pid}/root{mount_point}/m")
        server = start_server([repo], name="kiln-security-modelcar-ns", extra_args=EXPLICIT_ALL)
        try:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            ready_and_serving(client, "modelcar_ns")
        finally:
            stop_server(server)
    finally:
        car.kill()
        car.wait()


def config_json(name, **fields):
    import json
    tensor = lambda n: {"name": n, "data_type": "TYPE_FP32", "dims": [16]}  # noqa: E731
    config = {"name": name, "backend": "onnxruntime", "max_batch_size": 8,
              "input": [tensor("INPUT0"), tensor("INPUT1")], "output": [tensor("OUTPUT0"), tensor("OUTPUT1")]}
    config.update(fields)
    return json.dumps(config)


def test_what_a_client_names_is_checked_lexically(tmp_path):
    """A client's names and paths never leave the model directory, whatever the links in it;
    the operator's links stay usable to a client's config. (Refused on 61077f8 as well: kept
    here as the other half of the rule.)"""
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    repo.mkdir()
    outside.mkdir()
    target = add_sub_copy(repo, "target")
    add_sub_copy(repo, "other")
    (outside / "labels.txt").write_text("a\n" * 16)
    (target / "shared").symlink_to(outside)  # the operator's link
    server = start_server([repo], name="kiln-security-client-paths", extra_args=["--model-control-mode=explicit"])
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        for name in ["../other", "target/1", "..", "a\\b"]:
            with pytest.raises(InferenceServerException) as e:
                client.load_model(name, client_timeout=T)
            assert_triton_error(e.value, grpc.StatusCode.INVALID_ARGUMENT, "path traversal characters")
        for fields in [{"default_model_filename": "../../other/1/model.onnx"},
                       {"default_model_filename": "/etc/hostname"}]:
            with pytest.raises(InferenceServerException) as e:
                client.load_model("target", config=config_json("target", **fields), client_timeout=T)
            assert_triton_error(e.value, grpc.StatusCode.INVALID_ARGUMENT,
                                "must be a relative path inside the version directory")
        for label in ["../other/config.pbtxt", "/etc/hostname", "shared/../../other/config.pbtxt"]:
            output = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16], "label_filename": label},
                      {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [16]}]
            with pytest.raises(InferenceServerException) as e:
                client.load_model("target", config=config_json("target", output=output), client_timeout=T)
            assert_triton_error(e.value, grpc.StatusCode.INVALID_ARGUMENT,
                                "must be relative and stay within the model directory")
        onnx = (ADD_SUB / "1" / "model.onnx").read_bytes()
        for path in ["file:../escaped/1/model.onnx", "file:/tmp/escaped.onnx", "file:1/../../x", "file:1/a\0b"]:
            with pytest.raises(InferenceServerException) as e:
                client.load_model("uploaded", config=config_json("uploaded"),
                                  files={path: onnx}, client_timeout=T)
            assert_triton_error(e.value, grpc.StatusCode.INVALID_ARGUMENT, "must stay within model directory")
        assert not (repo / "escaped").exists() and not (tmp_path / "escaped").exists()
        # The operator's link inside the model directory is followed for a client's config.
        output = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16], "label_filename": "shared/labels.txt"},
                  {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [16]}]
        client.load_model("target", config=config_json("target", output=output), client_timeout=T)
        serves(client, "target")
    finally:
        stop_server(server)
