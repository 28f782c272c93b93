"""The REST examples, run as written: every ```bash block of README.md's "### REST with curl"
(curl is /usr/bin/curl) and the ```python block of docs/clients.md's "## tritonclient (HTTP)",
against a kiln serving only the bundled repository, with `localhost:8000` pointed at it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from conftest import DOCS, README, RPC_TIMEOUT, doc_section

CLIENTS = DOCS / "clients.md"
CURL = shutil.which("curl") or "/usr/bin/curl"


def section(title: str, page=README) -> str:
    return doc_section(page, title)


def blocks(title: str, language: str, page=README) -> list[str]:
    """The ``` blocks of `language` in section `title` of `page` (README.md or a docs/ page), read
    fence by fence (a block's closing fence never opens another)."""
    found, current, opened = [], None, None
    for line in section(title, page).splitlines(keepends=True):
        fence = line.strip()
        if current is None and fence.startswith("```"):
            current, opened = [], fence[3:]
        elif current is not None and fence == "```":
            if opened == language:
                found.append("".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return found


def run_bash(script: str, url: str) -> str:
    script = script.replace("localhost:8000", url)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, timeout=RPC_TIMEOUT,
                          env={"PATH": f"{CURL.rsplit('/', 1)[0]}:/usr/bin:/bin"})
    assert proc.returncode == 0, f"{script}\nstderr: {proc.stderr.decode(errors='replace')}"
    return proc.stdout.decode()


def check_health(out):
    assert json.loads(out) == {"ready": True}


def check_metadata(out):
    md = json.loads(out)
    assert md["name"] == "add_sub" and md["versions"] == ["1"] and md["platform"] == "onnxruntime_onnx"
    assert md["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}


def check_json_infer(out):
    body = json.loads(out)
    assert body["model_name"] == "add_sub" and body["model_version"] == "1"
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["OUTPUT0"]["data"] == [float(i + 1) for i in range(16)]
    assert outputs["OUTPUT1"]["data"] == [float(i - 1) for i in range(16)]


def check_binary_classification(out):
    body = json.loads(out)
    output = body["outputs"][0]
    assert output["datatype"] == "BYTES" and output["shape"] == [1, 3]
    values = [float(entry.split(":")[0]) for entry in output["data"]]
    assert values == sorted(values, reverse=True)
    labels = {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"}
    assert all(entry.split(":")[2] in labels for entry in output["data"])
    # The README shows the actual answer; keep it true.
    shown = re.search(r'"data":\["([^]]*)"\]', section("REST with curl").split("classification")[-1])
    assert shown and output["data"] == shown.group(1).split('","')


CHECKS = [
    ("/v2/health/ready", check_health),
    ("/v2/models/add_sub/infer", check_json_infer),
    ("/v2/models/add_sub", check_metadata),
    ("Inference-Header-Content-Length", check_binary_classification),
]


def check_for(script: str):
    for marker, check in CHECKS:
        if marker in script:
            return check
    pytest.fail(f"README example without a check in test_readme_curl.py:\n{script}")


def test_readme_has_the_rest_examples():
    scripts = blocks("REST with curl", "bash")
    assert len(scripts) == len(CHECKS)
    assert {check_for(s) for s in scripts} == {check for _, check in CHECKS}


@pytest.mark.parametrize("index", range(len(CHECKS)))
def test_readme_curl_example(bundled_server, index):
    script = blocks("REST with curl", "bash")[index]
    check_for(script)(run_bash(script, bundled_server.http_url))


def test_readme_tritonclient_http_example(bundled_server):
    (code,) = blocks("tritonclient (HTTP)", "python", CLIENTS)
    code = code.replace("localhost:8000", bundled_server.http_url)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=RPC_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("[[ 1.  2.  3.") and "bird" in proc.stdout
