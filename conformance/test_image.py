"""kiln's container image (deploy/image/build.sh) as podman runs it: a model repository mounted
read-only, a read-only root filesystem, Triton's ports published on loopback. tritonclient infers
over gRPC and HTTP, health and metrics answer, the process inside is not root and cannot write its
root, SIGTERM drains what is in flight and exits 0, and each manifest's container args (deploy/)
start the image as Kubernetes and KServe would start it.

The image is `$KILN_IMAGE` (default kiln:latest), built beforehand (.ci/test.sh builds it). podman
runs with deploy/image/containers.conf (runc, no default ulimits) unless CONTAINERS_CONF is set.
Skipped only where podman is not installed (`.ci/setup.sh image` installs it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import BUNDLED_REPO, REPO_ROOT, RPC_TIMEOUT, STARTUP_TIMEOUT, find_free_port, http_request
from test_deploy import DEPLOY, cargo_version, documents, flag, grpc_serving, probe_passes

PODMAN = shutil.which("podman")
pytestmark = pytest.mark.skipif(
    PODMAN is None, reason="podman is not installed (.ci/setup.sh image installs podman, runc and mmdebstrap)")

IMAGE = os.environ.get("KILN_IMAGE", "kiln:latest")
PODMAN_ENV = {**os.environ,
              "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(DEPLOY / "image" / "containers.conf"))}
ADD_SUB = BUNDLED_REPO / "add_sub"
SLOW = REPO_ROOT / "tests" / "fixtures" / "drain_repository" / "slow_compute"
TRITON_PORTS = (8000, 8001, 8002)
CPU_IMAGE_LIMIT = 150_000_000  # bytes, uncompressed (the limit for the CPU image)


def podman(*args, timeout=120, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run([PODMAN, *args], env=PODMAN_ENV, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        pytest.fail(f"podman {' '.join(args)}: exit {done.returncode}\n{done.stderr}", pytrace=False)
    return done


class Container:
    """One `podman run --detach` of the image with a read-only root filesystem: `ports` (the
    container's) published on free loopback ports, each (host folder, container path) of `mounts`
    mounted read-only, `args` after the image's entrypoint."""

    def __init__(self, name, mounts, args=(), ports=TRITON_PORTS, user=None):
        self.name = f"kiln-test-{name}-{os.getpid()}"
        self.ports = {port: find_free_port() for port in ports}
        command = ["run", "--detach", "--name", self.name, "--read-only"]
        if user is not None:
            command += ["--user", str(user)]
        for port, host in self.ports.items():
            command += ["--publish", f"127.0.0.1:{host}:{port}"]
        for source, target in mounts:
            command += ["--volume", f"{source}:{target}:ro"]
        podman("rm", "--force", "--time", "0", self.name, check=False)
        podman(*command, IMAGE, *args)

    def url(self, port) -> str:
        return f"127.0.0.1:{self.ports[port]}"

    def inspect(self) -> dict:
        return json.loads(podman("container", "inspect", self.name).stdout)[0]

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return (done.stdout + done.stderr)[-6000:]

    def wait_ready(self, http_port=8000) -> "Container":
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if not self.inspect()["State"]["Running"]:
                pytest.fail(f"the container exited while starting\n{self.logs()}", pytrace=False)
            try:
                if http_request(self.url(http_port), "GET", "/v2/health/ready").status == 200:
                    return self
            except OSError:
                pass  # the published port answers once kiln listens
            time.sleep(0.2)
        pytest.fail(f"not ready after {STARTUP_TIMEOUT} s\n{self.logs()}", pytrace=False)

    def remove(self) -> None:
        podman("rm", "--force", "--time", "0", self.name, check=False)


@pytest.fixture(scope="module")
def image() -> dict:
    found = podman("image", "inspect", IMAGE, check=False)
    if found.returncode != 0:
        pytest.fail(f"the image {IMAGE} is not in podman's store: build it with deploy/image/build.sh "
                    f"(KILN_BINARY names the release binary)\n{found.stderr}", pytrace=False)
    return json.loads(found.stdout)[0]


@pytest.fixture(scope="module")
def served(image):
    """The image with its defaults (repository /models, Triton's ports): add_sub and slow_compute
    mounted read-only into /models."""
    container = Container("serve", [(ADD_SUB, "/models/add_sub"), (SLOW, "/models/slow_compute")])
    try:
        yield container.wait_ready()
    finally:
        container.remove()


def add_sub_inputs(module):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2.0, dtype=np.float32)
    tensors = [module.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    tensors[0].set_data_from_numpy(a)
    tensors[1].set_data_from_numpy(b)
    return tensors, a, b


def test_the_image_is_configured_as_built(image):
    config = image["Config"]
    user, _, group = config["User"].partition(":")
    assert int(user) != 0 and int(group) != 0, config["User"]
    assert config["StopSignal"] == "SIGTERM"
    assert sorted(config["ExposedPorts"]) == [f"{port}/tcp" for port in TRITON_PORTS]
    assert "KILN_MODEL_REPOSITORY=/models" in config["Env"]
    assert config["Entrypoint"] == ["/usr/local/bin/kiln"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == cargo_version()
    assert re.fullmatch(r"[0-9a-f]{40}", labels["org.opencontainers.image.revision"])
    assert labels["org.opencontainers.image.source"]
    # Two layers, the Debian base and kiln with ONNX Runtime: nothing else was added.
    assert len(image["RootFS"]["Layers"]) == 2


def test_the_cpu_image_is_at_most_150_mb(image):
    if "ORT_DYLIB_PATH=/usr/local/lib/libonnxruntime.so" not in image["Config"]["Env"]:
        pytest.skip(f"{IMAGE} is the GPU variant (its size is stated in docs/operations.md, not bounded)")
    assert image["Size"] <= CPU_IMAGE_LIMIT, f"{image['Size']} bytes"


def test_tritonclient_infers_over_grpc_and_http(served):
    with grpcclient.InferenceServerClient(served.url(8001)) as client:
        tensors, a, b = add_sub_inputs(grpcclient)
        result = client.infer("add_sub", tensors, client_timeout=RPC_TIMEOUT)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    client = httpclient.InferenceServerClient(served.url(8000), network_timeout=RPC_TIMEOUT)
    try:
        tensors, a, b = add_sub_inputs(httpclient)
        result = client.infer("add_sub", tensors)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    finally:
        client.close()


def test_health_and_metrics_answer(served):
    assert http_request(served.url(8000), "GET", "/v2/health/live").status == 200
    assert http_request(served.url(8000), "GET", "/v2/health/ready").status == 200
    assert http_request(served.url(8000), "GET", "/v2/models/add_sub/ready").status == 200
    assert grpc_serving(served.ports[8001])
    tensors, _, _ = add_sub_inputs(httpclient)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(tensors)
    headers = {"Inference-Header-Content-Length": str(json_size)} if json_size else {}
    assert http_request(served.url(8000), "POST", "/v2/models/add_sub/infer", body, headers).status == 200
    metrics = http_request(served.url(8002), "GET", "/metrics")
    assert metrics.status == 200
    text = metrics.body.decode()
    assert re.search(r'^nv_inference_request_success\{model="add_sub",version="1"\} [1-9]', text, re.M), text[:2000]
    assert 'nv_inference_pending_request_count{model="slow_compute",version="1"}' in text


def test_kiln_runs_as_non_root_on_a_read_only_root(served):
    """Read from the running process itself (its /proc entries, seen from the host), not from the
    configuration podman was given."""
    pid = served.inspect()["State"]["Pid"]
    with open(f"/proc/{pid}/status") as status:
        uids = next(line for line in status if line.startswith("Uid:")).split()[1:]
    assert set(uids) == {"1000"}, uids
    with open(f"/proc/{pid}/mountinfo") as mountinfo:
        mounts = {fields[4]: fields[5].split(",") for fields in (line.split() for line in mountinfo)}
    assert "ro" in mounts["/"], mounts["/"]
    assert "ro" in mounts["/models/add_sub"], mounts["/models/add_sub"]


def infer_slow(url, x, signalled, outcomes):
    """One slow_compute request over REST; records (status, answered after `signalled` was set)."""
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [x]}]}).encode()
    reply = http_request(url, "POST", "/v2/models/slow_compute/infer", body)
    after = signalled.is_set()
    if reply.status == 200:
        assert json.loads(reply.body)["outputs"][0]["data"] == [x + 1.0]
    else:
        assert (reply.status, json.loads(reply.body)["error"]) == (503, "Server exiting"), reply.body
    outcomes.append((reply.status, after))


def pending(container) -> float:
    text = http_request(container.url(8002), "GET", "/metrics").body.decode()
    found = re.search(r'^nv_inference_pending_request_count\{model="slow_compute",version="1"\} (\S+)', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_sigterm_drains_in_flight_requests_and_exits_0(image):
    """podman stop sends the image's STOPSIGNAL (SIGTERM): the requests queued then are answered,
    and kiln exits 0 on its own, well before podman would kill it."""
    container = Container("drain", [(SLOW, "/models/slow_compute")])
    try:
        container.wait_ready()
        signalled, outcomes, count = threading.Event(), [], 40
        threads = [threading.Thread(target=infer_slow, args=(container.url(8000), float(i), signalled, outcomes))
                   for i in range(count)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + RPC_TIMEOUT
        while pending(container) < count / 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        queued = pending(container)
        assert queued > 0, "no request was queued"
        signalled.set()
        podman("stop", "--time", "60", container.name)
        for thread in threads:
            thread.join(RPC_TIMEOUT)
        state = container.inspect()["State"]
        assert (state["Status"], state["ExitCode"]) == ("exited", 0), container.logs()
        assert len(outcomes) == count, "a request got no answer (see the assertion above it)"
        # Half the requests or more were queued when `podman stop` began: those answered after
        # that moment were in flight when SIGTERM arrived, and kiln answered them.
        drained = [status for status, after in outcomes if status == 200 and after]
        assert drained, outcomes
        assert "received SIGTERM" in container.logs(), container.logs()
    finally:
        container.remove()


def manifest_containers():
    for path in sorted(DEPLOY.glob("*/*.yaml")):
        for document in documents(path):
            spec = document.get("spec", {})
            pod = spec.get("template", {}).get("spec", spec)
            for container in pod.get("containers", []):
                security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
                yield pytest.param(container, security, id=f"{path.parent.name}-{document['kind']}")


@pytest.mark.parametrize("container,security", list(manifest_containers()))
def test_the_manifests_args_start_the_image(image, container, security):
    """The image started as the manifest starts it (its args, its user, a read-only root), the
    repository at the path the args name: kiln accepts every flag, and every probe passes."""
    args = container["args"]
    repository = flag(args, "--model-repository") or flag(args, "--model-store")
    ports = {int(flag(args, "--http-port")), int(flag(args, "--grpc-port")), int(flag(args, "--metrics-port") or 8002)}
    started = Container(container["name"], [(ADD_SUB, f"{repository}/add_sub")], args=args, ports=sorted(ports),
                        user=security.get("runAsUser"))
    try:
        started.wait_ready(int(flag(args, "--http-port")))
        named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            if kind in container:
                assert probe_passes(container[kind], started.ports, named), kind
        assert http_request(started.url(int(flag(args, "--http-port"))), "GET",
                            "/v2/models/add_sub/ready").status == 200
    finally:
        started.remove()
