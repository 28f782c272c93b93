"""deploy/grafana/kiln.json, the Grafana dashboard of kiln's metrics, against what a running kiln
exports: every metric a query (or the model variable) names is in /metrics after inference,
generation and a failed request, and every label a query groups by or matches on is on that
metric's series. The summaries need `--metrics-config summary_latencies=true`, which the server
here runs with. GPU gauges exist only on machines with NVIDIA GPUs: where /metrics has none, their
names are checked against what the GPU exporter (crates/telemetry/src/metrics/gpu.rs) registers instead.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import defaultdict

import pytest

from conftest import BUNDLED_REPO, REPO_ROOT, http_request, start_server, stop_server

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "kiln.json"
GPU_SOURCE = REPO_ROOT / "crates" / "telemetry" / "src" / "metrics" / "gpu.rs"
METRIC = re.compile(r"\b((?:nv|kiln)_[a-z0-9_]+)\b")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, set[str]]:
    """Each metric name in /metrics with the label names its series carry."""
    repo = tmp_path_factory.mktemp("grafana-repo")
    for model in ("add_sub", "tiny_decoder"):
        shutil.copytree(BUNDLED_REPO / model, repo / model)
    srv = start_server([repo], name="kiln-grafana", extra_args=[
        "--metrics-config", "summary_latencies=true", "--metrics-interval-ms", "100"])
    try:
        body = json.dumps({"inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [2.0] * 16}]}).encode()
        assert http_request(srv.http_url, "POST", "/v2/models/add_sub/infer", body).status == 200
        bad = http_request(srv.http_url, "POST", "/v2/models/add_sub/infer", b'{"inputs": []}')
        assert bad.status == 400, bad
        generate = json.dumps({"text_input": "A kiln is", "parameters": {"max_tokens": 4}}).encode()
        assert http_request(srv.http_url, "POST", "/v2/models/tiny_decoder/generate", generate).status == 200
        text = http_request(srv.metrics_url, "GET", "/metrics").body.decode()
    finally:
        stop_server(srv)
    series: dict[str, set[str]] = defaultdict(set)
    for line in text.splitlines():
        match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s", line)
        if line.startswith("#") or not match:
            continue
        labels = re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', match.group(3) or "")
        series[match.group(1)].update(labels)
    return series


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target."""
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"]
            for target in panel.get("targets", [])]


def labels_of(expr: str) -> set[str]:
    """Label names a query groups by or matches on."""
    names = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        names.update(n.strip() for n in group.split(",") if n.strip())
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        names.update(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    return names


def gpu_names() -> set[str]:
    return set(re.findall(r'"((?:nv)_[a-z_]+)"', GPU_SOURCE.read_text()))


def test_every_query_names_exported_metrics_and_labels(dashboard, exported):
    has_gpu = any(name.startswith("nv_gpu_") for name in exported)
    checked = 0
    for title, expr in queries(dashboard):
        metrics = set(METRIC.findall(expr))
        assert metrics, f"{title}: {expr} names no kiln metric"
        gpu = {m for m in metrics if m.startswith(("nv_gpu_", "nv_energy_"))}
        if gpu and not has_gpu:
            assert gpu <= gpu_names(), f"{title}: {gpu - gpu_names()} not registered by crates/telemetry/src/metrics/gpu.rs"
            assert labels_of(expr) <= {"gpu_uuid"} and "gpu_uuid" in GPU_SOURCE.read_text()
            continue
        missing = metrics - exported.keys()
        assert not missing, f"{title}: {expr} names {missing}, which kiln does not export"
        carried = set().union(*(exported[m] for m in metrics))
        unknown = labels_of(expr) - carried
        assert not unknown, f"{title}: {expr} uses labels {unknown} that {metrics} do not carry"
        checked += 1
    assert checked >= 20


def test_the_model_variable_reads_an_exported_label(dashboard, exported):
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "model")
    metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["definition"]).groups()
    assert label in exported[metric]
    assert variable["query"]["query"] == variable["definition"]


def test_the_dashboard_covers_what_operators_ask_for(dashboard):
    exprs = " ".join(expr for _, expr in queries(dashboard))
    for needed in ("nv_inference_request_success", "nv_inference_queue_duration_us",
                   "nv_inference_compute_infer_duration_us", "by (model, reason)", "nv_inference_exec_count",
                   "nv_gpu_utilization", "kiln_generation_tokens_total", "kiln_time_to_first_token_seconds_bucket"):
        assert needed in exprs, needed
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
