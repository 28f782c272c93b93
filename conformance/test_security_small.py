"""Smaller security findings of issue #48 (item 5), each through the real binary:

- a trace file's numbered files are opened without following a link planted at their path (the
  link's target is not truncated), and wrap after `triton,file-limit=N` files, so a client that
  sets `log_frequency` 1 through the trace API does not make a file per request without bound;
- a warmup `count` of 4294967295 in a load's config override fails the load at once with a reason
  (it kept a core busy for good, the load unanswered) and the server answers throughout; the
  repository's own config.pbtxt is the operator's and keeps Triton's unbounded count;
- a model name with a control character is refused at load (REST, gRPC and a repository scan),
  and the log escapes the control characters of what it prints, so a name cannot forge a line;
- `GET /console/status`, which lists every model and its failure text, needs the
  model-repository API's header when that API is restricted;
- the console pages carry a strict Content-Security-Policy (their inline script and style by
  hash) and every REST response `X-Content-Type-Options: nosniff`.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
import shutil
import time
import urllib.parse
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2

from conftest import BUNDLED_REPO, RPC_TIMEOUT, add_sub_request_body, http_request, start_server, stop_server

ADD_SUB_ONNX = (BUNDLED_REPO / "add_sub" / "1" / "model.onnx").read_bytes()
# A line of kiln's default log format, as a name would forge it.
FORGED = "E1207 00:00:00.000000 1 forged.cc:1] forged"


def add_sub_config(name: str, **extra) -> str:
    config = {
        "name": name, "backend": "onnxruntime", "max_batch_size": 8,
        "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
        "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")],
        **extra,
    }
    return json.dumps(config)


def load_body(name: str, **extra) -> bytes:
    """A REST load with a config override and add_sub's model file."""
    return json.dumps({"parameters": {
        "config": add_sub_config(name, **extra),
        "file:1/model.onnx": base64.b64encode(ADD_SUB_ONNX).decode(),
    }}).encode()


def infer_add_sub(server) -> int:
    body, json_length, _ = add_sub_request_body(binary=False)
    return http_request(server.http_url, "POST", "/v2/models/add_sub/infer", body).status


def wait_for(check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


# --------------------------------------------------------------------------- trace files

def traced(directory: Path, *extra: str):
    """kiln tracing every add_sub request to trace.json in `directory`, a file per trace once a
    client sets log_frequency 1 (as any client may, unless the trace API is restricted)."""
    srv = start_server([BUNDLED_REPO], name=f"kiln-security-trace-{len(extra)}", extra_args=[
        f"--trace-config=triton,file={directory / 'trace.json'}", "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=1", *extra])
    answer = http_request(srv.http_url, "POST", "/v2/trace/setting", json.dumps({"log_frequency": "1"}).encode())
    assert answer.status == 200, answer
    return srv


def test_a_numbered_trace_file_does_not_follow_a_planted_link(tmp_path):
    srv, directory = traced(tmp_path), tmp_path
    precious = directory / "precious"
    precious.write_text("keep me")
    (directory / "trace.json.0").symlink_to(precious)
    for _ in range(2):
        assert infer_add_sub(srv) == 200
    # The second trace goes to trace.json.1: the first one has been dealt with by then.
    assert wait_for(lambda: (directory / "trace.json.1").is_file() and (directory / "trace.json.1").read_text())
    assert precious.read_text() == "keep me"
    assert (directory / "trace.json.0").is_symlink()
    assert wait_for(lambda: "cannot write the trace file" in srv.log_text()), srv.log_tail()
    stop_server(srv)


def test_numbered_trace_files_wrap_at_the_file_limit(tmp_path):
    srv, directory = traced(tmp_path, "--trace-config=triton,file-limit=3"), tmp_path
    for _ in range(5):
        assert infer_add_sub(srv) == 200

    def written():
        """The trace ids in the numbered files (None while one is being written)."""
        try:
            return {record["id"] for path in directory.glob("trace.json.*")
                    for record in json.loads(path.read_text())}
        except ValueError:
            return None

    # Files 0, 1, 2, then 0 and 1 again: the newest three traces (ids 3, 4 and 5) are what is left.
    assert wait_for(lambda: written() == {3, 4, 5}), written()
    assert sorted(p.name for p in directory.glob("trace.json.*")) == ["trace.json.0", "trace.json.1", "trace.json.2"]
    stop_server(srv)


# --------------------------------------------------------------------------- warmup count

WARM_COUNT = 12000  # above the bound on a client's config override


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    repo = tmp_path_factory.mktemp("security-repo")
    shutil.copytree(BUNDLED_REPO / "add_sub", repo / "add_sub")
    shutil.copytree(BUNDLED_REPO / "add_sub", repo / "warm_many")
    config = repo / "warm_many" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_sub"', 'name: "warm_many"') + f"""
model_warmup {{
  name: "many" batch_size: 1 count: {WARM_COUNT}
  inputs {{ key: "INPUT0" value {{ data_type: TYPE_FP32 dims: [ 16 ] zero_data: true }} }}
  inputs {{ key: "INPUT1" value {{ data_type: TYPE_FP32 dims: [ 16 ] zero_data: true }} }}
}}
""")
    srv = start_server([repo], name="kiln-security-explicit",
                       extra_args=["--model-control-mode=explicit", "--load-model=add_sub"])
    yield srv
    stop_server(srv)


def post_load(server, name: str, body: bytes, timeout: float = 60):
    host, port = server.http_url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request("POST", f"/v2/repository/models/{name}/load", body=body)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def test_a_huge_warmup_count_fails_the_load_and_the_server_answers(explicit):
    zeros = {"data_type": "TYPE_FP32", "dims": [16], "zero_data": True}
    warmup = [{"name": "forever", "batch_size": 1, "count": 4294967295,
               "inputs": {"INPUT0": zeros, "INPUT1": zeros}}]
    started = time.monotonic()
    try:
        status, text = post_load(explicit, "warm_forever", load_body("warm_forever", model_warmup=warmup))
    except TimeoutError:
        pytest.fail("the load did not answer within 60 s")
    assert status == 400, text
    assert ("failed to warm up model 'warm_forever' with sample 'forever': count 4294967295 is more than "
            "the 10000 runs kiln allows a sample") in text, text
    assert time.monotonic() - started < 30
    assert http_request(explicit.http_url, "GET", "/v2/health/live").status == 200
    assert infer_add_sub(explicit) == 200


def test_the_repository_config_keeps_tritons_unbounded_warmup_count(explicit):
    status, text = post_load(explicit, "warm_many", b"")
    assert status == 200, text
    stats = json.loads(http_request(explicit.http_url, "GET", "/v2/models/warm_many/stats").body)
    # Each warmup run is counted as an execution of the model, as Triton counts it, on each of the
    # two instances the default instance group gives it.
    assert stats["model_stats"][0]["execution_count"] == 2 * WARM_COUNT, stats


# --------------------------------------------------------------------------- model names

BAD_NAMES = ["bad\n" + FORGED, "ansi\x1b[2Jname", "nul\rreturn"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_model_name_with_control_characters_is_refused_at_load(explicit, name):
    status, text = post_load(explicit, urllib.parse.quote(name, safe=""), load_body(name))
    assert status == 400, text
    assert "model name must not contain control characters" in json.loads(text)["error"], text
    with pytest.raises(grpc.RpcError) as error:
        explicit.stub().RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name=name),
                                            timeout=RPC_TIMEOUT)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "model name must not contain control characters" in error.value.details()
    index = explicit.stub().RepositoryIndex(service_pb2.RepositoryIndexRequest(), timeout=RPC_TIMEOUT)
    assert not any(m.name == name for m in index.models)


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    """kiln on a repository whose second model's directory name forges a log line."""
    repo = tmp_path_factory.mktemp("security-scan")
    shutil.copytree(BUNDLED_REPO / "add_sub", repo / "add_sub")
    bad = repo / ("x\x1b[31m\n" + FORGED)
    shutil.copytree(BUNDLED_REPO / "add_sub", bad)
    (bad / "config.pbtxt").write_text((bad / "config.pbtxt").read_text().replace('name: "add_sub"', ""))
    srv = start_server([repo], name="kiln-security-scan", extra_args=["--strict-readiness=false"])
    yield srv, bad.name
    stop_server(srv)


def test_a_scanned_model_name_with_control_characters_is_refused(scanned):
    srv, name = scanned
    index = srv.stub().RepositoryIndex(service_pb2.RepositoryIndexRequest(), timeout=RPC_TIMEOUT)
    states = {m.name: (m.state, m.reason) for m in index.models}
    assert states["add_sub"][0] == "READY"
    state, reason = states[name]
    assert state == "UNAVAILABLE" and "model name must not contain control characters" in reason, reason
    assert "\\n" + FORGED in reason and "\n" not in reason and "\x1b" not in reason, reason


def test_the_log_escapes_control_characters(scanned):
    srv, name = scanned
    log = srv.log_text()
    assert "forged" in log, log  # the name is in the log, escaped
    assert not any(line.startswith(FORGED) for line in log.splitlines()), log
    assert "\x1b" not in log and "\r" not in log


# --------------------------------------------------------------------------- the console

@pytest.fixture(scope="module")
def restricted():
    srv = start_server([BUNDLED_REPO], name="kiln-security-restricted",
                       extra_args=["--http-restricted-api=model-repository:admin-key=admin-value"])
    yield srv
    stop_server(srv)


def test_console_status_needs_the_repository_apis_header(restricted):
    index = http_request(restricted.http_url, "POST", "/v2/repository/index")
    assert index.status == 403
    status = http_request(restricted.http_url, "GET", "/console/status")
    assert status.status == 403, status
    assert status.error() == "This API is restricted, expecting header 'admin-key'"
    allowed = http_request(restricted.http_url, "GET", "/console/status", headers={"admin-key": "admin-value"})
    assert allowed.status == 200 and allowed.json()["models"], allowed
    # The page itself holds nothing: it stays open.
    assert http_request(restricted.http_url, "GET", "/console").status == 200


def inline_hash(page: str, tag: str) -> str:
    body = re.search(f"<{tag}>(.*?)</{tag}>", page, re.S).group(1)
    return "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"


@pytest.mark.parametrize("path", ["/console", "/console/docs"])
def test_console_pages_carry_a_strict_content_security_policy(restricted, path):
    answer = http_request(restricted.http_url, "GET", path)
    assert answer.status == 200
    policy = {d.split()[0]: d.split()[1:] for d in answer.headers["content-security-policy"].split("; ")}
    page = answer.body.decode()
    assert policy["default-src"] == ["'none'"]
    assert policy["script-src"] == [inline_hash(page, "script")]
    assert policy["style-src"] == [inline_hash(page, "style")]
    assert policy["frame-ancestors"] == ["'none'"] and policy["base-uri"] == ["'none'"]
    assert "unsafe-inline" not in answer.headers["content-security-policy"]
    # What a hash does not cover: style attributes, event handler attributes.
    assert not re.search(r"<[^>]+\s(style|on[a-z]+)=", page), re.search(r"<[^>]+\s(style|on[a-z]+)=", page)


def test_every_rest_response_says_nosniff(restricted):
    body, _, _ = add_sub_request_body(binary=False)
    answers = [
        http_request(restricted.http_url, "GET", "/v2"),
        http_request(restricted.http_url, "GET", "/v2/health/live"),
        http_request(restricted.http_url, "POST", "/v2/models/add_sub/infer", body),
        http_request(restricted.http_url, "GET", "/v2/models/add_sub/config"),
        http_request(restricted.http_url, "GET", "/no/such/path"),
        http_request(restricted.http_url, "POST", "/v2/repository/index"),  # refused
        http_request(restricted.http_url, "GET", "/console"),
        http_request(restricted.http_url, "GET", "/v2/openapi.json"),
    ]
    assert [a.status for a in answers] == [200, 200, 200, 200, 404, 403, 200, 200]
    for answer in answers:
        assert answer.headers.get("x-content-type-options") == "nosniff", answer
