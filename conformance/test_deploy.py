"""The deployment manifests in deploy/ against the real binary: kiln starts with each container's
args (its ports moved to free ones, the repository to the bundled one), and every port, probe
and path the manifests rely on answers as Kubernetes and KServe expect (HTTP probes 200, the gRPC
probe SERVING, KServe's v2 paths), so the manifests cannot drift from the server. Every document
is valid for Kubernetes' schemas (kubernetes-validate, strict: no unknown field) and KServe's
(deploy/kserve/schema/), and the shutdown settings cover kiln's drain. conformance/test_image.py
runs the image with the same args."""

from __future__ import annotations

import http.client
import json
import re

import grpc
import jsonschema
import kubernetes_validate
import pytest
import yaml

from conftest import BUNDLED_REPO, REPO_ROOT, RPC_TIMEOUT, KilnServer, _SERVERS, stop_server

DEPLOY = REPO_ROOT / "deploy"
MANIFESTS = sorted(DEPLOY.glob("*/*.yaml"))
KSERVE_SCHEMA = json.loads((DEPLOY / "kserve" / "schema" / "kserve.schema.json").read_text())
# The oldest Kubernetes the manifests are for (the preStop `sleep` action is on by default from
# 1.30) and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.latest_version())
# PredictorSpec's own fields and its ComponentExtensionSpec's; the rest are a PodSpec's.
KSERVE_PREDICTOR_FIELDS = {"model", "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric",
                           "containerConcurrency", "timeout", "canaryTrafficPercent", "labels",
                           "annotations", "deploymentStrategy"}
KSERVE_MODEL_FIELDS = {"modelFormat", "runtime", "storageUri", "runtimeVersion", "protocolVersion"}


def documents(path):
    return list(yaml.safe_load_all(path.read_text()))


def of_kind(path, kind):
    found = [d for d in documents(path) if d["kind"] == kind]
    assert len(found) == 1, (path, kind)
    return found[0]


def cargo_version():
    return re.search(r'^version = "(.*)"$', (REPO_ROOT / "Cargo.toml").read_text(), re.M).group(1)


def flag(args, name):
    """The value of `--name=value` in a container's args, or None."""
    values = [a.partition("=")[2] for a in args if a.partition("=")[0] == name]
    return values[-1] if values else None


def validate_kubernetes(document):
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{document['kind']} {document['metadata']['name']} is not valid for Kubernetes "
                        f"{version}: {error.message} at {list(error.path)}", pytrace=False)


def as_pod(name, pod_fields, containers):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {**pod_fields, "containers": containers}}


def validate_kserve(document):
    """KServe's own fields against the schema in deploy/kserve/schema/, and what KServe embeds of
    Kubernetes (containers, a predictor's pod fields and the model's container fields) against
    Kubernetes' schemas, as a Pod."""
    jsonschema.Draft7Validator(KSERVE_SCHEMA).validate(document)
    name = document["metadata"]["name"]
    if document["kind"] == "InferenceService":
        predictor = document["spec"]["predictor"]
        pod = {k: v for k, v in predictor.items() if k not in KSERVE_PREDICTOR_FIELDS}
        model = {k: v for k, v in predictor["model"].items() if k not in KSERVE_MODEL_FIELDS}
        validate_kubernetes(as_pod(name, pod, [{"name": "kserve-container", "image": "kiln", **model}]))
    else:
        validate_kubernetes(as_pod(name, {}, document["spec"]["containers"]))


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_manifest_is_valid_for_kubernetes_and_kserve(path):
    for document in documents(path):
        if document["apiVersion"].startswith("serving.kserve.io/"):
            validate_kserve(document)
        else:
            validate_kubernetes(document)


def test_the_schemas_refuse_a_misspelt_field():
    """The validation above can fail: an unknown field is refused by both schemas."""
    deployment = of_kind(DEPLOY / "kubernetes" / "kiln.yaml", "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)
    runtime = of_kind(DEPLOY / "kserve" / "servingruntime.yaml", "ClusterServingRuntime")
    runtime["spec"]["supportedModelFormat"] = runtime["spec"].pop("supportedModelFormats")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(KSERVE_SCHEMA).validate(runtime)


def test_the_manifests_name_the_image_build_sh_tags():
    for path in MANIFESTS:
        for document in documents(path):
            spec = document.get("spec", {})
            pod = spec.get("template", {}).get("spec", spec)
            for container in pod.get("containers", []):
                assert container["image"] == f"kiln:{cargo_version()}", (path, container["name"])


def test_shutdown_settings_cover_the_drain():
    """Kubernetes kills a terminating container after terminationGracePeriodSeconds, counted from
    the start of its preStop hook: the grace must cover the hook and kiln's --exit-timeout-secs."""
    deployment = of_kind(DEPLOY / "kubernetes" / "kiln.yaml", "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pause + int(flag(container["args"], "--exit-timeout-secs"))
    runtime = of_kind(DEPLOY / "kserve" / "servingruntime.yaml", "ClusterServingRuntime")
    service = of_kind(DEPLOY / "kserve" / "servingruntime.yaml", "InferenceService")
    exit_timeout = int(flag(runtime["spec"]["containers"][0]["args"], "--exit-timeout-secs"))
    assert service["spec"]["predictor"]["terminationGracePeriodSeconds"] > exit_timeout
    # A rolling update never takes a ready replica away before its successor is ready.
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_the_autoscaler_and_disruption_budget_target_the_deployment():
    path = DEPLOY / "kubernetes" / "kiln.yaml"
    deployment, autoscaler, budget = (of_kind(path, kind) for kind in
                                      ("Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget"))
    target = autoscaler["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["minAvailable"] < autoscaler["spec"]["minReplicas"] <= deployment["spec"]["replicas"]


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


def http_body(port, path):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=RPC_TIMEOUT)
    try:
        connection.request("GET", path)
        return connection.getresponse().read().decode()
    finally:
        connection.close()


def grpc_serving(port):
    """grpc.health.v1.Health/Check with the empty service name, as Kubernetes' gRPC probe sends
    it: the request is empty on the wire, and SERVING is field 1 = 1."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw)
        return check(b"", timeout=RPC_TIMEOUT) == b"\x08\x01"


def probe_passes(probe, ports, named):
    """`probe` (an HTTP or gRPC probe naming a port by number or by name) against the server whose
    ports `ports` maps from the manifest's."""
    if "httpGet" in probe:
        port = probe["httpGet"]["port"]
        return http_status(ports[named.get(port, port)], probe["httpGet"]["path"]) == 200
    return grpc_serving(ports[probe["grpc"]["port"]])


def test_the_kubernetes_deployment_probes_and_ports():
    path = DEPLOY / "kubernetes" / "kiln.yaml"
    deployment, service, autoscaler = (of_kind(path, kind) for kind in
                                       ("Deployment", "Service", "HorizontalPodAutoscaler"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    server, ports = started(container, "deploy-kubernetes")
    try:
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        # Every container port is one kiln listens on, and the Service targets them by name.
        assert sorted(named.values()) == sorted(ports), (named, ports)
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(named)
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        metrics_port = ports[int(annotations["prometheus.io/port"])]
        assert http_status(metrics_port, annotations["prometheus.io/path"]) == 200
        # The autoscaler's per-pod metric is one kiln exports.
        exported = http_body(metrics_port, annotations["prometheus.io/path"])
        for metric in autoscaler["spec"]["metrics"]:
            if metric["type"] == "Pods":
                assert f"\n{metric['pods']['metric']['name']}{{" in exported, metric
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert probe_passes(container[kind], ports, named), kind
    finally:
        stop_server(server)


def test_the_kserve_serving_runtime():
    path = DEPLOY / "kserve" / "servingruntime.yaml"
    runtime, service = of_kind(path, "ClusterServingRuntime"), of_kind(path, "InferenceService")
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
        for kind in ("livenessProbe", "readinessProbe"):
            assert probe_passes(container[kind], ports, {}), kind
        # The metrics annotation names kiln's default metrics port (the runtime does not move it).
        assert runtime["spec"]["annotations"]["prometheus.kserve.io/port"] == "8002"
        assert not any(arg.startswith("--metrics-port") for arg in container["args"])
    finally:
        stop_server(server)
