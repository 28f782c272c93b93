"""kiln's pages in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`,
installed by `.ci/setup.sh browser`) driven through selenium, against the real binary with gRPC-Web
on and the status page's origin allowed:

- the status page shows the server's version and uptime and every model READY, and after
  requests the row's request rate and latency percentiles;
- its "try it" form runs add_sub through gRPC-Web (the numbers are a + b and a - b) and through
  REST, and streams tiny_decoder's generation token by token (through REST's generate_stream and
  gRPC-Web's ModelStreamInfer: one response per token, shown as read, the text what a Python
  client gets);
- a model unloaded through the API turns UNAVAILABLE on the page;
- the documentation page renders every operation of /v2/openapi.json;
- each page's screenshot is checked not to be blank.

gRPC-Web itself is checked without a browser too: off by default, CORS only for the allowed
origin, access restrictions and the message size limit as for gRPC, TLS the gRPC listener's (over
HTTP/2, as browsers negotiate it, with curl).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
import urllib.parse
import zlib
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests

from conftest import BUNDLED_REPO, RPC_TIMEOUT, KilnServer, http_request, start_server, stop_server
from test_tls import certs, credentials  # noqa: F401 (certs is a fixture)

CHROMIUM = Path(os.environ.get("KILN_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("KILN_CHROMEDRIVER", "/usr/bin/chromedriver"))
MODELS = ("add_sub", "string_echo", "tiny_decoder")
PROMPT = "A kiln is"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("browser-repo")
    for model in MODELS:
        shutil.copytree(BUNDLED_REPO / model, repo / model)
    return repo


@pytest.fixture(scope="module")
def kiln(repo):
    srv = KilnServer([repo], name="kiln-browser",
                     extra_args=["--model-control-mode=explicit", "--load-model=*", "--grpc-web=true"])
    # The page's origin is the REST listener's, known once the ports are.
    srv.extra_args += ["--grpc-web-cors-origin", f"http://127.0.0.1:{srv.http_port}"]
    try:
        yield srv.start()
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail(f"{CHROMIUM} and {CHROMEDRIVER} are needed (.ci/setup.sh browser)", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="kiln-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1280,900", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_script_timeout(RPC_TIMEOUT)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(predicate, what: str, timeout: float = RPC_TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def js(driver, script: str, *args):
    return driver.execute_script(script, *args)


def row(driver, model: str) -> dict | None:
    """The status page's row of `model`: its cells by class, and its state."""
    return js(driver, """
        const row = document.querySelector(`#models tbody tr[data-model="${arguments[0]}"]`);
        if (!row) return null;
        const cells = {};
        for (const td of row.children) cells[td.className.split(" ").pop()] = td.textContent;
        cells.state = row.dataset.state;
        return cells;""", model)


# ---- screenshots --------------------------------------------------------------------------------
def png_pixels(png: bytes) -> tuple[int, int, np.ndarray]:
    """Width, height and RGB(A) pixels of an 8-bit truecolour PNG (what Chromium writes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at, idat, header = 8, b"", None
    while at < len(png):
        length, kind = struct.unpack(">I4s", png[at:at + 8])
        data = png[at + 8:at + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data)
        elif kind == b"IDAT":
            idat += data
        at += 12 + length
    width, height, depth, colour = header[:4]
    assert depth == 8 and colour in (2, 6), header
    channels = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, 1 + width * channels)
    stride = width * channels
    out = np.zeros((height, stride), dtype=np.int32)
    for y in range(height):  # undo the scanline filters (PNG spec, section 9)
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        prior = out[y - 1] if y else np.zeros(stride, dtype=np.int32)
        if kind == 0:
            out[y] = line
        elif kind == 2:
            out[y] = (line + prior) & 255
        else:
            current = np.zeros(stride, dtype=np.int32)
            for x in range(stride):
                left = current[x - channels] if x >= channels else 0
                up, corner = prior[x], (prior[x - channels] if x >= channels else 0)
                if kind == 1:
                    predictor = left
                elif kind == 3:
                    predictor = (left + up) // 2
                else:
                    p = left + up - corner
                    pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                    predictor = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                current[x] = (line[x] + predictor) & 255
            out[y] = current
    return width, height, out.reshape(height, width, channels)[:, :, :3]


def screenshot(driver, name: str) -> None:
    """Take a screenshot and check it is not blank: many colours, and a good share of pixels
    that are not the background's. Kept under $KILN_SCREENSHOT_DIR when set."""
    png = driver.get_screenshot_as_png()
    directory = os.environ.get("KILN_SCREENSHOT_DIR")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"{name}.png").write_bytes(png)
    width, height, pixels = png_pixels(png)
    assert width >= 800 and height >= 600, (width, height)
    flat = pixels.reshape(-1, 3)
    colours, counts = np.unique(flat, axis=0, return_counts=True)
    background_share = counts.max() / len(flat)
    assert len(colours) > 50, f"{name}: only {len(colours)} colours, a blank page"
    assert background_share < 0.97, f"{name}: {background_share:.1%} of the pixels are the background"


# ---- the status page ----------------------------------------------------------------------------
def open_console(driver, kiln, grpc_web: bool = False):
    query = f"?grpc=http://127.0.0.1:{kiln.grpc_port}" if grpc_web else ""
    driver.get(f"http://{kiln.http_url}/console{query}")
    wait_for(lambda: all((row(driver, m) or {}).get("state") == "READY" for m in MODELS),
             "every model READY on the status page")


def test_status_page_shows_the_server_and_every_model(kiln, browser):
    open_console(browser, kiln)
    version = http_request(kiln.http_url, "GET", "/v2").json()["version"]
    assert js(browser, "return document.getElementById('server-version').textContent") == version
    assert js(browser, "return document.getElementById('readiness').textContent") == "ready"
    uptime = js(browser, "return document.getElementById('uptime').textContent")
    assert uptime.endswith("s") and uptime != "…"
    add_sub = row(browser, "add_sub")
    assert (add_sub["version"], add_sub["state"]) == ("1", "READY")


def test_status_page_shows_request_rate_and_latency_percentiles(kiln, browser):
    open_console(browser, kiln)
    body = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [2.0] * 16}]}).encode()
    time.sleep(1.2)  # a reading before the requests, so the window holds them
    for _ in range(40):
        assert http_request(kiln.http_url, "POST", "/v2/models/add_sub/infer", body).status == 200
    cells = wait_for(lambda: (lambda r: r if r and r["rate"] != "–" and r["p50"] != "–" else None)(
        row(browser, "add_sub")), "add_sub's rate and percentiles")
    assert float(cells["rate"]) > 0
    p50, p90, p99 = float(cells["p50"]), float(cells["p90"]), float(cells["p99"])
    assert 0 < p50 <= p90 <= p99
    assert float(cells["queue"]) >= 0 and float(cells["compute"]) > 0
    assert int(cells["requests"]) >= 40
    screenshot(browser, "status")


def send_from_form(driver, model: str, transport: str, text: str | None = None) -> str:
    """Choose `model` and `transport`, optionally replace the input, press Send; the answer."""
    js(driver, """
        const select = document.getElementById('try-model');
        select.value = arguments[0];
        select.dispatchEvent(new Event('change'));
        document.getElementById('try-transport').value = arguments[1];""", model, transport)
    wait_for(lambda: js(driver, "const f = document.getElementById('try');"
                                "return !f.dataset.pending && selected && selected.name") == model,
             f"the form to load {model}")
    if text is not None:
        js(driver, "document.getElementById('try-input').value = arguments[0]", text)
    # Every text the answer shows, recorded as it changes (streamed tokens).
    js(driver, """
        window.seen = [];
        const out = document.getElementById('try-output');
        if (window.watcher) window.watcher.disconnect();
        window.watcher = new MutationObserver(() => window.seen.push(out.textContent));
        window.watcher.observe(out, {childList: true, characterData: true, subtree: true});
        document.getElementById('try-send').click();""")
    done = wait_for(lambda: js(driver, "return document.getElementById('try-status').dataset.done"),
                    f"{model}'s answer through {transport}")
    answer = js(driver, "return document.getElementById('try-output').textContent")
    assert done == "ok", answer
    return answer


def outputs_of(answer: str) -> dict[str, list]:
    """The form's answer: `NAME TYPE [shape]` then the JSON data, per output."""
    outputs = {}
    for block in answer.split("\n\n"):
        title, data = block.split("\n", 1)
        outputs[title.split(" ")[0]] = json.loads(data)
    return outputs


ADD_SUB_REQUEST = json.dumps({"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]})


@pytest.mark.parametrize("transport", ["grpc-web", "rest"])
def test_try_it_runs_add_sub(kiln, browser, transport):
    open_console(browser, kiln, grpc_web=True)
    outputs = outputs_of(send_from_form(browser, "add_sub", transport, ADD_SUB_REQUEST))
    a = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(np.array(outputs["OUTPUT0"], dtype=np.float32).ravel(), a + 0.5)
    np.testing.assert_array_equal(np.array(outputs["OUTPUT1"], dtype=np.float32).ravel(), a - 0.5)


def test_try_it_sends_text_to_a_text_model_through_grpc_web(kiln, browser):
    open_console(browser, kiln, grpc_web=True)
    outputs = outputs_of(send_from_form(browser, "string_echo", "grpc-web", "héllo, kiln"))
    assert outputs["output-1"] == ["héllo, kiln"]


def streamed_events(kiln) -> list[dict]:
    """The events a Python client reads from generate_stream for the page's request."""
    body = {"text_input": PROMPT, "parameters": {"max_tokens": 32}}
    with requests.post(f"http://{kiln.http_url}/v2/models/tiny_decoder/generate_stream", json=body,
                       stream=True, timeout=RPC_TIMEOUT) as answer:
        assert answer.status_code == 200, answer.text
        events = [json.loads(line[5:]) for line in answer.iter_lines(decode_unicode=True)
                  if line.startswith("data:")]
    return events


@pytest.mark.parametrize("transport", ["rest", "grpc-web"])
def test_try_it_streams_generated_tokens(kiln, browser, transport):
    open_console(browser, kiln, grpc_web=True)
    answer = send_from_form(browser, "tiny_decoder", transport, PROMPT)
    events = streamed_events(kiln)
    assert answer == "".join(e["text_output"] for e in events) and answer
    # One response per token, each shown when read: how many frames the network coalesced them
    # into depends on timing, so the page counts responses, not screen updates.
    shown = js(browser, "return document.getElementById('try-output').dataset.messages")
    assert int(shown) == len(events) == 32
    seen = [text for text in js(browser, "return window.seen") if text]
    assert seen and all(answer.startswith(text) for text in seen)
    screenshot(browser, f"stream-{transport}")


def test_a_model_unloaded_through_the_api_turns_unavailable(kiln, browser):
    open_console(browser, kiln)
    assert http_request(kiln.http_url, "POST", "/v2/repository/models/string_echo/unload").status == 200
    try:
        cells = wait_for(lambda: (lambda r: r if r and r["state"] == "UNAVAILABLE" else None)(
            row(browser, "string_echo")), "string_echo UNAVAILABLE on the status page")
        assert cells["reason"] == "unloaded"
        assert (cells["rate"], cells["requests"]) == ("–", "–"), "an unloaded version has no statistics"
        assert "string_echo" not in js(browser, "return [...document.getElementById('try-model').options].map(o => o.value)")
        screenshot(browser, "unloaded")
    finally:
        assert http_request(kiln.http_url, "POST", "/v2/repository/models/string_echo/load").status == 200


def test_docs_page_renders_every_operation(kiln, browser):
    document = http_request(kiln.http_url, "GET", "/v2/openapi.json").json()
    operations = sum(1 for item in document["paths"].values()
                     for method in item if method in ("get", "post", "delete", "put", "patch"))
    browser.get(f"http://{kiln.http_url}/console/docs")
    rendered = wait_for(lambda: js(browser, "return document.body.dataset.rendered"), "the document rendered")
    assert int(rendered) == operations
    paths = js(browser, "return [...document.querySelectorAll('summary .path')].map(e => e.textContent)")
    assert "/v2/models/{model}/infer" in paths and "/v1/chat/completions" in paths
    js(browser, "document.querySelector('[data-operation=modelInfer]').open = true")
    screenshot(browser, "docs")


# ---- gRPC-Web without a browser: the default, CORS, restrictions ---------------------------------
def grpc_web_call(url: str, method: str, message: bytes = b"", headers=None) -> http.client.HTTPResponse:
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=RPC_TIMEOUT)
    frame = b"\x00" + struct.pack(">I", len(message)) + message
    conn.request("POST", f"/inference.GRPCInferenceService/{method}", body=frame,
                 headers={"Content-Type": "application/grpc-web+proto", **(headers or {})})
    return conn.getresponse()


def grpc_status(answer: http.client.HTTPResponse) -> tuple[str, str]:
    """grpc-status and grpc-message of a gRPC-Web answer (headers, or the trailer frame)."""
    message = urllib.parse.unquote(answer.getheader("grpc-message") or "")
    return trailers(answer.getheader("grpc-status"), message, answer.read())


def trailers(status: str | None, message: str, body: bytes) -> tuple[str, str]:
    """The status a gRPC-Web body's trailer frame gives, else the headers' (`status`, `message`)."""
    at = 0
    while at + 5 <= len(body):
        flag, length = body[at], struct.unpack(">I", body[at + 1:at + 5])[0]
        if flag & 0x80:
            for line in body[at + 5:at + 5 + length].decode().split("\r\n"):
                key, _, value = line.partition(":")
                if key.strip().lower() == "grpc-status":
                    status = value.strip()
                elif key.strip().lower() == "grpc-message":
                    message = urllib.parse.unquote(value.strip())
        at += 5 + length
    return status, message


def test_grpc_web_is_off_by_default(repo):
    srv = start_server([repo], name="kiln-no-grpc-web", extra_args=["--model-control-mode=explicit"])
    try:
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            answer = grpc_web_call(srv.grpc_url, "ServerLive")
            answer.read()
            # An HTTP/2-only listener cannot answer an HTTP/1.1 request with a status line.
            raise http.client.HTTPException(f"answered {answer.status}")
    finally:
        stop_server(srv)


def test_grpc_web_cors_answers_only_the_allowed_origin(kiln):
    allowed = f"http://127.0.0.1:{kiln.http_port}"
    host, port = kiln.grpc_url.rsplit(":", 1)
    for origin, expected in [(allowed, allowed), ("http://elsewhere.example", None)]:
        conn = http.client.HTTPConnection(host, int(port), timeout=RPC_TIMEOUT)
        conn.request("OPTIONS", "/inference.GRPCInferenceService/ModelInfer", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-grpc-web"})
        answer = conn.getresponse()
        answer.read()
        assert answer.getheader("access-control-allow-origin") == expected, origin
        conn.close()
    answer = grpc_web_call(kiln.grpc_url, "ServerLive", headers={"Origin": allowed})
    assert answer.getheader("access-control-allow-origin") == allowed
    assert "grpc-status" in (answer.getheader("access-control-expose-headers") or "")
    assert grpc_status(answer) == ("0", "")


def test_grpc_web_text_is_answered_in_base64(kiln):
    """application/grpc-web-text: frames in base64 both ways (for clients that cannot read binary)."""
    from tritonclient.grpc import service_pb2

    message = service_pb2.ModelMetadataRequest(name="add_sub").SerializeToString()
    frame = base64.b64encode(b"\x00" + struct.pack(">I", len(message)) + message)
    host, port = kiln.grpc_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=RPC_TIMEOUT)
    conn.request("POST", "/inference.GRPCInferenceService/ModelMetadata", body=frame,
                 headers={"Content-Type": "application/grpc-web-text", "Accept": "application/grpc-web-text"})
    answer = conn.getresponse()
    assert answer.getheader("content-type").startswith("application/grpc-web-text")
    body = base64.b64decode(answer.read())
    length = struct.unpack(">I", body[1:5])[0]
    metadata = service_pb2.ModelMetadataResponse.FromString(body[5:5 + length])
    assert (metadata.name, [t.name for t in metadata.inputs]) == ("add_sub", ["INPUT0", "INPUT1"])
    assert trailers(None, "", body[5 + length:]) == ("0", "")


def test_grpc_web_is_restricted_as_grpc(repo):
    srv = start_server([repo], name="kiln-grpc-web-restricted", extra_args=[
        "--model-control-mode=explicit", "--grpc-web=true",
        "--grpc-restricted-protocol=inference:secret-key=yes", "--grpc-web-cors-origin=*",
        "--grpc-max-message-bytes=4096"])
    try:
        status, message = grpc_status(grpc_web_call(srv.grpc_url, "ModelInfer"))
        assert status == "14" and "restricted" in message, (status, message)
        # The expected header lets the call through (to the model's own answer: none is loaded).
        status, message = grpc_status(grpc_web_call(srv.grpc_url, "ModelInfer", headers={"triton-grpc-protocol-secret-key": "yes"}))
        assert status != "14", message
        # Health is not restricted.
        assert grpc_status(grpc_web_call(srv.grpc_url, "ServerLive")) == ("0", "")
        # gRPC's message size limit holds: 8 KB of raw input in a 4 KB world.
        big = b"\x0a\x07add_sub" + b"\x3a\x80\x40" + bytes(8192)  # model_name, raw_input_contents
        status, message = grpc_status(grpc_web_call(srv.grpc_url, "ModelInfer", big,
                                                    headers={"triton-grpc-protocol-secret-key": "yes"}))
        call = srv.channel().unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                         request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as native:
            call(big, metadata=[("triton-grpc-protocol-secret-key", "yes")], timeout=RPC_TIMEOUT)
        assert (status, message) == (str(native.value.code().value[0]), native.value.details())
        assert "too large" in message
    finally:
        stop_server(srv)


def test_grpc_web_uses_the_grpc_listeners_tls(repo, certs, tmp_path):
    srv = start_server([repo], name="kiln-grpc-web-tls", grpc_credentials=credentials(certs, client_cert=False),
                       extra_args=["--model-control-mode=explicit", "--grpc-web=true", "--grpc-use-ssl",
                                   f"--grpc-server-cert={certs / 'server.crt'}",
                                   f"--grpc-server-key={certs / 'server.key'}"])
    try:
        # A browser offers HTTP/2 by ALPN, which the TLS listener takes: gRPC-Web over it.
        (tmp_path / "frame").write_bytes(b"\x00\x00\x00\x00\x00")
        headers, body = tmp_path / "headers", tmp_path / "body"
        curl = subprocess.run(
            ["curl", "-s", "--http2", "--cacert", str(certs / "ca.crt"), "-D", str(headers), "-o", str(body),
             "-H", "content-type: application/grpc-web+proto", "--data-binary", f"@{tmp_path / 'frame'}",
             f"https://127.0.0.1:{srv.grpc_port}/inference.GRPCInferenceService/ServerLive"],
            capture_output=True, timeout=RPC_TIMEOUT)
        assert curl.returncode == 0, curl.stderr
        lines = headers.read_text().lower().splitlines()
        assert lines[0].startswith("http/2 200"), lines
        assert "content-type: application/grpc-web+proto" in lines
        assert trailers(None, "", body.read_bytes()) == ("0", "")
        # Without TLS there is no answer.
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            grpc_status(grpc_web_call(srv.grpc_url, "ServerLive"))
    finally:
        stop_server(srv)
