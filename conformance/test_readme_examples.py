"""The examples of README.md and docs/ that print values, run as written and compared with what
the page says they print (the `# ...` comments under them): from README.md, MLServer's codecs and
tritonclient (gRPC); from docs/clients.md, streamed generation with curl (and its details), the generate extension
on string_echo, the OpenAI client (completion and embeddings) and grpcurl's ModelInfer; from
docs/models.md, the repository API with curl. Each points at a kiln serving the bundled
repository instead of localhost.
test_readme_curl.py does the same for "REST with curl" and tritonclient (HTTP).
"""

from __future__ import annotations

import ast
import base64
import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import BUNDLED_REPO, DOCS, RPC_TIMEOUT, find_free_port, start_server, stop_server
from test_grpcurl import GRPCURL
from test_readme_curl import CLIENTS, CURL, blocks, run_bash

MODELS = DOCS / "models.md"


def shown(block: str) -> list[str]:
    """The README's `# ` lines under a command: what it says the command prints."""
    return [line[2:] for line in block.splitlines() if line.startswith("# ")]


def commands(block: str) -> list[str]:
    """The block's commands as a shell reads them: comment lines left out, a command going on
    while a quote is open or a line ends with a backslash."""
    found: list[str] = []
    current = ""
    for line in block.splitlines():
        if not current and (line.startswith("#") or not line.strip()):
            continue
        current = f"{current}\n{line}" if current else line
        if current.count("'") % 2 == 0 and not current.endswith("\\"):
            found.append(current)
            current = ""
    assert not current, f"unterminated command: {current}"
    return found


def untagged(title: str, containing: str, page=CLIENTS) -> str:
    """The one ``` block (no language named) of section `title` of `page` that contains `containing`."""
    (block,) = [b for b in blocks(title, "", page) if containing in b]
    return textwrap.dedent(block)  # a block inside a list item is indented


def test_generation_curl_examples_print_what_the_readme_shows(bundled_server):
    block = untagged("Streamed text generation (decoupled models)", "generate_stream")
    generate, stream = commands(block)
    said = shown(block)
    # /generate: one JSON object, exactly the one shown.
    out = run_bash(generate, bundled_server.http_url)
    assert json.loads(out) == json.loads(said[0])
    # /generate_stream: the events shown (the README ends with "..." after two of three).
    out = run_bash(stream, bundled_server.http_url)
    events = [line for line in out.splitlines() if line]
    expected = [line for line in said[1:] if line.startswith("data: ")]
    assert len(expected) == 2 and said[-1] == "..."
    assert [json.loads(e[len("data: "):]) for e in events[:2]] == [json.loads(e[len("data: "):]) for e in expected]
    assert len(events) == 3  # max_tokens 3: one event per token
    assert all(e.startswith("data: ") for e in events)


def test_generation_details_example_prints_what_the_page_shows(bundled_server):
    block = untagged("Streamed text generation (decoupled models)", '"details": true')
    (command,) = commands(block)
    got, said = json.loads(run_bash(command, bundled_server.http_url)), json.loads("".join(shown(block)))
    # Log-probabilities to the float's last bits may differ between CPUs; the rest is exact.
    tokens = [(t["id"], t["text"], t["special"]) for t in got["details"]["logprobs"]]
    assert tokens == [(t["id"], t["text"], t["special"]) for t in said["details"]["logprobs"]]
    for mine, page in zip(got["details"]["logprobs"], said["details"]["logprobs"]):
        assert abs(mine["logprob"] - page["logprob"]) < 1e-4
        mine["logprob"] = page["logprob"]
    assert got == said


def test_generate_extension_example_prints_what_the_readme_shows(bundled_server):
    block = untagged("The generate extension on any model", "string_echo/generate")
    (command,) = commands(block)
    assert json.loads(run_bash(command, bundled_server.http_url)) == json.loads(shown(block)[0])


@pytest.fixture(scope="module")
def openai_server():
    port = find_free_port()
    server = start_server([BUNDLED_REPO], name="kiln-readme-openai", extra_args=["--openai-port", str(port)])
    yield server, port
    stop_server(server)


def test_openai_example_prints_what_the_readme_shows(openai_server):
    server, port = openai_server
    block = untagged("OpenAI-compatible API (`--openai-port`)", "completions.create")
    start, client = commands(block)
    assert start == "kiln --model-repository model_repository --openai-port 9000"
    code = client.split(" -c ", 1)[1].strip().strip("'").replace("localhost:9000", f"127.0.0.1:{port}")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=RPC_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    # The README's comment, with the id it elides; `created` and `system_fingerprint` are left
    # out of it (they change or say nothing), so compare the fields it does show.
    said = " ".join(line.strip() for line in shown(block))
    printed = proc.stdout.strip()
    for field in re.findall(r"(\w+=(?:'[^']*'|\d+))", said):
        if not field.startswith("id="):
            assert field in printed, (field, printed)
    assert printed.startswith("Completion(id='cmpl-")


def test_openai_embeddings_example_prints_what_the_readme_shows(openai_server):
    server, port = openai_server
    block = untagged("OpenAI-compatible API (`--openai-port`)", "embeddings.create")
    (client,) = commands(block)
    code = client.split(" -c ", 1)[1].strip().strip("'").replace("localhost:9000", f"127.0.0.1:{port}")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=RPC_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    # "384 [0.0332416..., 0.0044061..., -0.0062770...] Usage(prompt_tokens=15, total_tokens=15)":
    # the values are shown cut short, so each printed one must begin with the digits shown.
    (said,) = shown(block)
    size, values, usage = re.fullmatch(r"(\d+) \[(.*)\] (Usage\(.*\))", said).groups()
    got = re.fullmatch(r"(\d+) \[(.*)\] (Usage\(.*\))", proc.stdout.strip())
    assert got, proc.stdout
    assert got.group(1) == size == "384" and got.group(3) == usage
    printed = got.group(2).split(", ")
    prefixes = [v.removesuffix("...") for v in values.split(", ")]
    assert len(printed) == len(prefixes) == 3
    assert all(p.startswith(prefix) for p, prefix in zip(printed, prefixes)), (printed, prefixes)


def test_mlserver_example_prints_what_the_readme_shows(bundled_server):
    (code,) = blocks("MLServer's types and converters", "python")
    said = code.rsplit("# ", 1)[1].strip()
    code = code.replace("localhost:8001", bundled_server.grpc_url)
    # Its own process: mlserver and tritonclient register the same protobuf names.
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=RPC_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert ast.literal_eval(proc.stdout.strip()) == ast.literal_eval(said) == {"a": 1, "b": "x"}


@pytest.mark.skipif(GRPCURL is None, reason="grpcurl not installed (.ci/setup.sh python)")
def test_grpcurl_examples_run_and_model_infer_answers_add_sub(bundled_server):
    block = untagged("grpcurl (server reflection, v1 and v1alpha)", "grpcurl -plaintext")
    runs = []
    for command in commands(block):
        assert command.startswith("grpcurl ")
        script = command.replace("grpcurl ", f"{GRPCURL} ", 1).replace("localhost:8001", bundled_server.grpc_url)
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                              timeout=RPC_TIMEOUT)
        assert proc.returncode == 0, f"{script}\n{proc.stderr}"
        runs.append(proc.stdout)
    listed, described, inferred = runs
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= set(listed.split())
    assert "rpc ModelInfer ( .inference.ModelInferRequest ) returns ( .inference.ModelInferResponse );" in described
    # "Outputs come back in rawOutputContents (base64 of little-endian values)": add_sub's sum
    # and difference of 0..15 and ones.
    answer = json.loads(inferred)
    assert [o["name"] for o in answer["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    values = [np.frombuffer(base64.b64decode(raw), "<f4").tolist() for raw in answer["rawOutputContents"]]
    assert values == [[float(i + 1) for i in range(16)], [float(i - 1) for i in range(16)]]


def test_tritonclient_grpc_example_prints_a_plus_b_and_a_minus_b(bundled_server):
    (code,) = blocks("tritonclient (gRPC)", "python")
    assert "# a + b" in code and "# a - b" in code
    code = code.replace("localhost:8001", bundled_server.grpc_url)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=RPC_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    assert proc.stdout == f"{a + 1}\n{a - 1}\n"  # numpy prints them as the example does


@pytest.fixture(scope="module")
def explicit_server():
    server = start_server([BUNDLED_REPO], name="kiln-readme-explicit",
                          extra_args=["--model-control-mode", "explicit", "--load-model", "add_sub"])
    yield server
    stop_server(server)


def test_managing_models_curl_examples(explicit_server):
    block = untagged("Managing models", "/v2/repository/index", MODELS)
    index, load, unload = commands(block)
    said = shown(block)[0]
    # The index: the rows the README shows, then the rest it elides ("...").
    rows = json.loads(run_bash(index, explicit_server.http_url))
    shown_rows = json.loads(said.replace(",...]", "]"))
    assert said.endswith(",...]") and rows[:len(shown_rows)] == shown_rows
    # "# 200, empty body": curl -s prints nothing; the model then serves.
    assert run_bash(load.split("#")[0], explicit_server.http_url) == ""
    rows = json.loads(run_bash(index, explicit_server.http_url))
    assert {"name": "mlp_classifier", "version": "1", "state": "READY", "reason": ""} in rows
    assert run_bash(unload, explicit_server.http_url) == ""
    rows = json.loads(run_bash(index, explicit_server.http_url))
    assert all(r.get("state") != "READY" for r in rows if r["name"] == "mlp_classifier"), rows


def test_every_command_here_is_found(bundled_server):
    # The sections still hold what these tests run (a renamed section fails here, not silently).
    assert CURL
    for title, text in (("Streamed text generation (decoupled models)", "/generate_stream"),
                        ("The generate extension on any model", "string_echo/generate"),
                        ("OpenAI-compatible API (`--openai-port`)", "completions.create"),
                        ("OpenAI-compatible API (`--openai-port`)", "embeddings.create"),
                        ("grpcurl (server reflection, v1 and v1alpha)", "ModelInfer")):
        assert untagged(title, text)
