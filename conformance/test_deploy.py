"""The deployment manifests in deploy/ against the real binary: kiln starts with each container's
args (its ports moved to free ones, the repository to the bundled one), and every port, probe
and path the manifests rely on answers as Kubernetes and KServe expect (HTTP probes 200, the gRPC
probe SERVING, KServe's v2 paths), so the manifests cannot drift from the server."""

from __future__ import annotations

import http.client

import grpc
import pytest
import yaml

from conftest import BUNDLED_REPO, REPO_ROOT, RPC_TIMEOUT, KilnServer, _SERVERS, stop_server

DEPLOY = REPO_ROOT / "deploy"


def documents(path):
    return list(yaml.safe_load_all(path.read_text()))


def started(container, name):
    """kiln with `container`'s args, each port flag moved to the server's free port; returns the
    server and the manifest's port numbers mapped to the server's."""
    server = KilnServer([BUNDLED_REPO], name=name)
    moved = {"--http-port": server.http_port, "--grpc-port": server.grpc_port,
             "--metrics-port": server.metrics_port}
    ports, args = {}, []
    for arg in container["args"]:
        flag, _, value = arg.partition("=")
        if flag in moved:
            ports[int(value)] = moved[flag]
            continue
        if flag in ("--model-repository", "--model-store"):
            continue  # the bundled repository instead of the volume
        args.append(arg)
    server.extra_args = args
    _SERVERS.append(server)
    server.start()
    return server, ports


def http_status(port, path):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=RPC_TIMEOUT)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


def grpc_serving(port):
    """grpc.health.v1.Health/Check with the empty service name, as Kubernetes' gRPC probe sends
    it: the request is empty on the wire, and SERVING is field 1 = 1."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw)
        return check(b"", timeout=RPC_TIMEOUT) == b"\x08\x01"


def test_the_kubernetes_deployment_probes_and_ports():
    deployment, service = documents(DEPLOY / "kubernetes" / "kiln.yaml")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    server, ports = started(container, "deploy-kubernetes")
    try:
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        # Every container port is one kiln listens on, and the Service targets them by name.
        assert sorted(named.values()) == sorted(ports), (named, ports)
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(named)
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert http_status(ports[int(annotations["prometheus.io/port"])], annotations["prometheus.io/path"]) == 200
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            probe = container[kind]
            if "httpGet" in probe:
                port = probe["httpGet"]["port"]
                port = ports[named.get(port, port)]
                assert http_status(port, probe["httpGet"]["path"]) == 200, kind
            else:
                assert grpc_serving(ports[probe["grpc"]["port"]]), kind
    finally:
        stop_server(server)


def test_the_kserve_serving_runtime():
    runtime, service = documents(DEPLOY / "kserve" / "servingruntime.yaml")
    container = runtime["spec"]["containers"][0]
    server, ports = started(container, "deploy-kserve")
    try:
        # KServe's ports: REST 8080, gRPC 9000 (the h2c port it routes gRPC-v2 to).
        assert set(ports) == {8080, 9000}
        assert [p["containerPort"] for p in container["ports"] if p["name"] == "h2c"] == [9000]
        rest = ports[8080]
        model = "add_sub"
        assert service["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]
        for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{model}/ready", f"/v2/models/{model}"):
            assert http_status(rest, path) == 200, path
        assert grpc_serving(ports[9000])
        # The metrics annotation names kiln's default metrics port (the runtime does not move it).
        assert runtime["spec"]["annotations"]["prometheus.kserve.io/port"] == "8002"
        assert not any(arg.startswith("--metrics-port") for arg in container["args"])
    finally:
        stop_server(server)
