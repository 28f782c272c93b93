"""What a web page may do with kiln (issue #48, finding 1), tried as an attacker would, against the
real binary started as the QA harness starts it (explicit mode, `--load-model=*`).

A browser sends any site's `POST` with `Content-Type: text/plain` without asking first (a CORS
"simple request"), and DNS rebinding lets the page read the answers. So a request that carries an
`Origin` other than the server's own may not change state (load, unload, logging, trace settings,
shared memory, inference) on any listener: 403 on REST, SageMaker and OpenAI, PERMISSION_DENIED on
gRPC(-Web); a page under a Host name that is not an IP address, localhost or listed is refused
even same-origin (rebinding). Clients that send no Origin (tritonclient, curl, the SDKs, probes
with service names as Host) work as before; `--http-allowed-origin='*'` restores Triton's
behaviour; `--http-allowed-origin` and `--http-allowed-host` let chosen pages and names in."""

from __future__ import annotations

import json
import shutil
import struct
import urllib.parse
import http.client

import grpc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import (BUNDLED_REPO, DOCS, RPC_TIMEOUT, add_sub_request_body, doc_section,
                      find_free_port, http_request, start_server, stop_server)

pytestmark = pytest.mark.security

EVIL = "http://evil.example"
REBIND = "rebind.evil.example"
APP = "https://app.example"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("security-access-repo")
    shutil.copytree(BUNDLED_REPO / "add_sub", repo / "add_sub")
    return repo


def explicit(repo, name, *flags, **options):
    return start_server([repo], name=name, extra_args=[
        "--model-control-mode=explicit", "--load-model=*", *flags], **options)


@pytest.fixture(scope="module")
def kiln(repo):
    sagemaker, openai = find_free_port(), find_free_port()
    srv = explicit(repo, "kiln-security-access", "--grpc-web=true", f"--grpc-web-cors-origin={APP}",
                   "--allow-sagemaker=true", "--sagemaker-port", str(sagemaker),
                   "--openai-port", str(openai))
    srv.sagemaker_url, srv.openai_url = f"127.0.0.1:{sagemaker}", f"127.0.0.1:{openai}"
    yield srv
    stop_server(srv)


@pytest.fixture
def loaded(kiln):
    """add_sub loaded before and after each test, by a client without an Origin."""
    client = httpclient.InferenceServerClient(kiln.http_url)
    client.load_model("add_sub")
    yield client
    client.load_model("add_sub")


def page(origin, host=None, **headers):
    """The headers a browser sends with a page's simple request."""
    sent = {"Origin": origin, "Content-Type": "text/plain;charset=UTF-8", **headers}
    if host:
        sent["Host"] = host
    return sent


def refused(reply, *fragments):
    assert reply.status == 403, reply
    for fragment in fragments:
        assert fragment in reply.error(), reply


def test_a_foreign_page_cannot_load_or_unload_models(kiln, loaded):
    # The request: another site's page, under a rebinding name.
    for host in (f"{REBIND}:{kiln.http_port}", kiln.http_url):
        for action in ("unload", "load"):
            reply = http_request(kiln.http_url, "POST", f"/v2/repository/models/add_sub/{action}",
                                 b"{}", page(EVIL, host))
            refused(reply, "refused")
        assert loaded.is_model_ready("add_sub")
    reply = http_request(kiln.http_url, "POST", "/v2/repository/models/add_sub/unload", b"",
                         page(EVIL, kiln.http_url))
    refused(reply, "Cross-origin request refused", EVIL, "--http-allowed-origin")
    assert loaded.is_model_ready("add_sub")


def test_a_foreign_page_cannot_change_settings_or_run_inference(kiln, loaded):
    before = loaded.get_log_settings()
    tries = [
        ("/v2/logging", {"log_verbose_level": 3, "log_info": False}),
        ("/v2/trace/setting", {"trace_rate": "7"}),
        ("/v2/models/add_sub/trace/setting", {"trace_rate": "7"}),
        ("/v2/systemsharedmemory/region/r/register", {"key": "/kiln_security", "offset": 0, "byte_size": 8}),
        ("/v2/systemsharedmemory/unregister", {}),
        ("/v2/repository/index", {}),
    ]
    for path, body in tries:
        reply = http_request(kiln.http_url, "POST", path, json.dumps(body).encode(), page(EVIL))
        refused(reply, "Cross-origin request refused")
    assert loaded.get_log_settings() == before
    assert loaded.get_trace_settings()["trace_rate"] != "7"
    body, json_size, _ = add_sub_request_body(binary=False)
    reply = http_request(kiln.http_url, "POST", "/v2/models/add_sub/infer", body, page(EVIL))
    refused(reply, "run inference")
    # Sec-Fetch-Site tells a page's request apart too, Origin or not.
    reply = http_request(kiln.http_url, "POST", "/v2/models/add_sub/infer", body,
                         {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"})
    refused(reply)


def test_the_cloud_listeners_refuse_foreign_pages(kiln, loaded):
    body, _, _ = add_sub_request_body(binary=False)
    for url, path in [(kiln.sagemaker_url, "/invocations"), (kiln.sagemaker_url, "/models"),
                      (kiln.openai_url, "/v1/completions"), (kiln.openai_url, "/v1/embeddings")]:
        reply = http_request(url, "POST", path, body, page(EVIL))
        assert reply.status == 403 and b"Cross-origin request refused" in reply.body, (url, path, reply)


def test_clients_without_an_origin_work_as_before(kiln, loaded):
    loaded.unload_model("add_sub")
    assert not loaded.is_model_ready("add_sub")
    loaded.load_model("add_sub")
    body, _, _ = add_sub_request_body(binary=False)
    # In-cluster clients and probes send service names as Host: answered, as by Triton.
    for host in ("kiln.default.svc.cluster.local:8000", "anything.example", kiln.http_url):
        reply = http_request(kiln.http_url, "POST", "/v2/models/add_sub/infer", body, {"Host": host})
        assert reply.status == 200, (host, reply)
        assert http_request(kiln.http_url, "GET", "/v2/health/ready", headers={"Host": host}).status == 200
    grpc_client = grpcclient.InferenceServerClient(kiln.grpc_url)
    grpc_client.unload_model("add_sub")
    grpc_client.load_model("add_sub")
    assert grpc_client.is_model_ready("add_sub")
    # A foreign page may still read what it cannot read anyway (no CORS): GETs are not refused.
    assert http_request(kiln.http_url, "GET", "/v2/models/add_sub", headers=page(EVIL)).status == 200


def test_the_servers_own_pages_may_act(kiln, loaded):
    """The status page's "try it" form is same-origin: Origin is the address the page came from."""
    body, _, _ = add_sub_request_body(binary=False)
    for host in (kiln.http_url, f"localhost:{kiln.http_port}"):
        reply = http_request(kiln.http_url, "POST", "/v2/models/add_sub/infer", body,
                             page(f"http://{host}", host, **{"Sec-Fetch-Site": "same-origin"}))
        assert reply.status == 200, (host, reply)
    # Another port of the same machine is another origin.
    reply = http_request(kiln.http_url, "POST", "/v2/models/add_sub/infer", body,
                         page(f"http://127.0.0.1:{kiln.grpc_port}"))
    refused(reply)


def test_a_rebinding_page_is_refused_even_same_origin(kiln, loaded):
    host = f"{REBIND}:{kiln.http_port}"
    origin = f"http://{host}"
    reply = http_request(kiln.http_url, "POST", "/v2/repository/models/add_sub/unload", b"",
                         page(origin, host))
    refused(reply, "Browser request refused", REBIND, "--http-allowed-host")
    assert loaded.is_model_ready("add_sub")
    # Its reads too: a same-origin fetch under the attacker's name.
    reply = http_request(kiln.http_url, "GET", "/v2/models/add_sub/config",
                         headers={"Host": host, "Sec-Fetch-Site": "same-origin"})
    refused(reply, REBIND)


def test_grpc_web_calls_of_foreign_pages_are_refused(kiln, loaded):
    def call(method, message, origin):
        host, port = kiln.grpc_url.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=RPC_TIMEOUT)
        frame = b"\x00" + struct.pack(">I", len(message)) + message
        conn.request("POST", f"/inference.GRPCInferenceService/{method}", body=frame,
                     headers={"Content-Type": "application/grpc-web+proto", "Origin": origin})
        answer = conn.getresponse()
        status = answer.getheader("grpc-status")
        message = urllib.parse.unquote(answer.getheader("grpc-message") or "")
        body = answer.read()
        conn.close()
        if status is None:  # the trailer frame
            trailer = body[body.rfind(b"grpc-status"):].decode(errors="replace")
            status = trailer.split(":", 1)[1].split("\r\n")[0].strip()
            message = urllib.parse.unquote(trailer.partition("grpc-message:")[2].split("\r\n")[0].strip())
        return status, message

    unload = b"\x12\x07add_sub"  # RepositoryModelUnloadRequest.model_name
    status, message = call("RepositoryModelUnload", unload, EVIL)
    assert status == str(grpc.StatusCode.PERMISSION_DENIED.value[0]), (status, message)
    assert "--grpc-web-cors-origin" in message, message
    assert loaded.is_model_ready("add_sub")
    # The origin --grpc-web-cors-origin lists may.
    assert call("ServerLive", b"", APP) == ("0", "")


def test_tritons_behaviour_is_one_flag_away(repo):
    srv = explicit(repo, "kiln-any-origin", "--http-allowed-origin=*")
    try:
        for action in ("unload", "load"):
            reply = http_request(srv.http_url, "POST", f"/v2/repository/models/add_sub/{action}",
                                 b"", page(EVIL, f"{REBIND}:{srv.http_port}"))
            assert reply.status == 200, reply
        reply = http_request(srv.http_url, "POST", "/v2/logging", b'{"log_verbose_level": 1}', page(EVIL))
        assert reply.status == 200, reply
    finally:
        stop_server(srv)


def test_listed_origins_and_hosts(repo):
    srv = explicit(repo, "kiln-listed", f"--http-allowed-origin={APP}",
                   "--http-allowed-host=kiln.test", "--http-allowed-host=*.kiln.test")
    try:
        body, _, _ = add_sub_request_body(binary=False)
        infer = lambda headers: http_request(srv.http_url, "POST", "/v2/models/add_sub/infer", body, headers)
        assert infer(page(APP, "somewhere.else")).status == 403  # listed origin, unlisted Host
        assert infer(page(APP, "kiln.test")).status == 200
        refused(infer(page(EVIL, "kiln.test")), "Cross-origin")
        # A listed name is trusted: its own pages may act.
        host = f"a.kiln.test:{srv.http_port}"
        assert infer(page(f"http://{host}", host)).status == 200
        # With a host list, other names are refused to every client; addresses stay answered.
        refused(infer({"Host": "other.example"}), "other.example", "--http-allowed-host")
        assert infer({"Host": srv.http_url}).status == 200
        assert infer({"Host": f"localhost:{srv.http_port}"}).status == 200
    finally:
        stop_server(srv)


def test_bad_flag_values_are_refused_at_start(repo):
    from conftest import kiln_bin
    import subprocess

    for flag, fragment in [("--http-allowed-origin=evil.example", "--http-allowed-origin"),
                           ("--http-allowed-host=kiln:8000", "--http-allowed-host")]:
        done = subprocess.run([str(kiln_bin()), "--model-repository", str(repo), flag],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and fragment in done.stderr + done.stdout, done


def test_the_operations_page_says_who_may_reach_which_api():
    section = doc_section(DOCS / "operations.md", "Who may reach which API")
    for needed in ("--http-allowed-origin", "--http-allowed-host", "--grpc-web-cors-origin",
                   "--http-restricted-api", "DNS rebinding"):
        assert needed in section, needed
    compatibility = (DOCS / "compatibility.md").read_text()
    assert "--http-allowed-origin='*'" in compatibility
