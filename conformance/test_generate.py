"""Streamed generation from the bundled decoupled `tiny_decoder` (a decoder-only ONNX graph with
Optimum's I/O and a byte-level BPE tokenizer), as Triton's LLM clients drive it:

- greedy output equals a reference loop in Python (onnxruntime + tokenizers, full recomputation
  without a KV cache, so kiln's cache handling is checked too), over REST and gRPC;
- tritonclient `start_stream` gets one response per token, the last flagged `triton_final_response`
  (plus the empty final one when asked), or one response when `stream` is false;
- `/generate_stream` server-sent events read with `requests` and with curl;
- seeded sampling is deterministic, also while other sequences share the batch;
- a client that disconnects mid-stream stops its generation (the sequence leaves, the
  active-sequences gauge returns to 0, the request counts as CANCELED);
- bad settings get clear errors, and plain inference on a decoupled model is refused as Triton does.
"""

from __future__ import annotations

import json
import queue
import re
import shutil
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, RPC_TIMEOUT, start_server, stop_server
from tiny_decoder import Reference

MODEL = "tiny_decoder"
MODEL_DIR = BUNDLED_REPO / MODEL
PROMPTS = ["The potter", "A kiln is", "日本の陶磁器", "Wood kilns take"]


@pytest.fixture(scope="module")
def reference():
    """Greedy continuation by full recomputation with onnxruntime, as token ids and text."""
    loop = Reference()

    def generate(prompt: str, max_tokens: int) -> tuple[list[int], str]:
        out = [token for token, _ in loop.greedy(prompt, max_tokens)]
        return out, loop.decode(out)

    return generate


def generate(server, prompt: str, **settings) -> requests.Response:
    body = {"text_input": prompt, "parameters": settings}
    return requests.post(f"http://{server.http_url}/v2/models/{MODEL}/generate", json=body, timeout=RPC_TIMEOUT)


def sse_events(response: requests.Response) -> list[dict]:
    events = []
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            events.append(json.loads(line[len("data: "):]))
        else:
            assert line == "", line
    return events


def metric(server, name: str, **labels) -> float:
    text = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
    want = {"model": MODEL, "version": "1", **labels}
    total = None
    for line in text.splitlines():
        match = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        if all(found.get(k) == v for k, v in want.items()):
            total = (total or 0.0) + float(match.group(3))
    return 0.0 if total is None else total


def wait_for(predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


class Stream:
    """A tritonclient gRPC stream that collects (result, error) pairs."""

    def __init__(self, server):
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error)))

    def send(self, prompt: str, request_id: str = "", parameters=None, **inputs):
        tensors = [grpcclient.InferInput("text_input", [1], "BYTES")]
        tensors[0].set_data_from_numpy(np.array([prompt.encode()], dtype=object))
        for name, (datatype, value) in inputs.items():
            tensor = grpcclient.InferInput(name, [1], datatype)
            tensor.set_data_from_numpy(np.array([value], dtype={"INT32": np.int32, "BOOL": bool, "FP32": np.float32,
                                                                "UINT64": np.uint64}[datatype]))
            tensors.append(tensor)
        empty_final = bool(parameters and parameters.pop("enable_empty_final_response", False))
        self.client.async_stream_infer(MODEL, tensors, request_id=request_id, parameters=parameters,
                                       enable_empty_final_response=empty_final)

    def until_final(self, timeout: float = RPC_TIMEOUT) -> list[tuple[str | None, bool, str]]:
        """(text, final flag, id) of each response until one is flagged final."""
        got = []
        while True:
            result, error = self.responses.get(timeout=timeout)
            if error is not None:
                raise error
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            output = result.as_numpy("text_output")
            text = None if output is None else output[0].decode()
            got.append((text, final, response.id))
            if final:
                return got

    def close(self, cancel: bool = False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def test_greedy_output_equals_the_reference_loop(server, reference):
    for prompt in PROMPTS:
        tokens, text = reference(prompt, 32)
        reply = generate(server, prompt, max_tokens=32)
        assert reply.status_code == 200, reply.text
        assert reply.json() == {"model_name": MODEL, "model_version": "1", "text_output": prompt + text}
        alone = generate(server, prompt, max_tokens=32, exclude_input_in_output=True).json()["text_output"]
        assert alone == text


def test_concurrent_requests_share_the_batch_and_match_lone_ones(server, reference):
    expected = {p: reference(p, 48)[1] for p in PROMPTS}
    results: dict[int, str] = {}

    def run(index: int, prompt: str):
        results[index] = generate(server, prompt, max_tokens=48, exclude_input_in_output=True).json()["text_output"]

    jobs = [threading.Thread(target=run, args=(i, PROMPTS[i % len(PROMPTS)])) for i in range(16)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(RPC_TIMEOUT)
    assert {i: results.get(i) for i in range(16)} == {i: expected[PROMPTS[i % len(PROMPTS)]] for i in range(16)}
    stats = requests.get(f"http://{server.http_url}/v2/models/{MODEL}/stats", timeout=RPC_TIMEOUT).json()
    batch_sizes = [int(b["batch_size"]) for b in stats["model_stats"][0]["batch_stats"]]
    assert max(batch_sizes) > 1, f"no step ran more than one sequence: {batch_sizes}"


def test_tritonclient_stream_gets_every_token_and_a_final_response(server, reference):
    tokens, text = reference("The potter", 20)
    stream = Stream(server)
    try:
        stream.send("The potter", request_id="r1", max_tokens=("INT32", 20))
        got = stream.until_final()
        assert len(got) == len(tokens) == 20, "one response per generated token"
        assert [final for _, final, _ in got] == [False] * 19 + [True]
        assert {rid for _, _, rid in got} == {"r1"}
        assert "".join(t for t, _, _ in got) == text

        stream.send("The potter", request_id="r2", max_tokens=("INT32", 5),
                    parameters={"enable_empty_final_response": True})
        got = stream.until_final()
        assert [final for _, final, _ in got] == [False] * 5 + [True]
        assert got[-1][0] is None, "the final response alone carries no output"

        stream.send("The potter", request_id="r3", max_tokens=("INT32", 20), stream=("BOOL", False))
        got = stream.until_final()
        assert got == [("The potter" + text, True, "r3")], "stream=false: one response with the whole text"

        stream.send("The potter", request_id="r4", parameters={"max_tokens": 6, "exclude_input_in_output": True,
                                                              "stream": False})
        assert stream.until_final() == [(reference("The potter", 6)[1], True, "r4")]
    finally:
        stream.close()


def test_interleaved_requests_on_one_stream_are_told_apart_by_id(server, reference):
    stream = Stream(server)
    try:
        for index, prompt in enumerate(PROMPTS):
            stream.send(prompt, request_id=f"p{index}", max_tokens=("INT32", 12))
        texts: dict[str, str] = {}
        finished = set()
        while len(finished) < len(PROMPTS):
            result, error = stream.responses.get(timeout=RPC_TIMEOUT)
            assert error is None, error
            response = result.get_response()
            texts[response.id] = texts.get(response.id, "") + result.as_numpy("text_output")[0].decode()
            if response.parameters["triton_final_response"].bool_param:
                finished.add(response.id)
        assert texts == {f"p{i}": reference(p, 12)[1] for i, p in enumerate(PROMPTS)}
    finally:
        stream.close()


def test_sse_with_requests_and_curl(server, reference):
    tokens, text = reference("A kiln is", 10)
    url = f"http://{server.http_url}/v2/models/{MODEL}/generate_stream"
    with requests.post(url, json={"text_input": "A kiln is", "max_tokens": 10}, stream=True,
                       timeout=RPC_TIMEOUT) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = sse_events(reply)
    assert len(events) == len(tokens)
    assert all(e["model_name"] == MODEL and e["model_version"] == "1" for e in events)
    assert "".join(e["text_output"] for e in events) == text

    whole = requests.post(url, json={"text_input": "A kiln is", "parameters": {"max_tokens": 10, "stream": False}},
                          timeout=RPC_TIMEOUT)
    assert sse_events(whole) == [{"model_name": MODEL, "model_version": "1", "text_output": "A kiln is" + text}]

    curl = subprocess.run(["curl", "-sN", url, "-d", '{"text_input": "A kiln is", "max_tokens": 10}'],
                          capture_output=True, text=True, timeout=RPC_TIMEOUT, check=True)
    blocks = [b for b in curl.stdout.split("\n\n") if b]
    assert len(blocks) == len(tokens) and all(b.startswith("data: {") for b in blocks), curl.stdout
    assert "".join(json.loads(b[len("data: "):])["text_output"] for b in blocks) == text


def test_seeded_sampling_is_deterministic(server):
    settings = {"max_tokens": 40, "temperature": 1.0, "top_k": 40, "top_p": 0.95, "exclude_input_in_output": True}
    first = generate(server, "The potter", seed=1234, **settings).json()["text_output"]
    assert generate(server, "The potter", seed=1234, **settings).json()["text_output"] == first
    others = {generate(server, "The potter", seed=seed, **settings).json()["text_output"] for seed in range(1, 6)}
    assert len(others | {first}) > 1, "different seeds give different samples"
    # While other sequences share the batch, the seeded one draws the same tokens.
    background = [threading.Thread(target=generate, args=(server, p), kwargs={"max_tokens": 40, "temperature": 1.0})
                  for p in PROMPTS]
    for job in background:
        job.start()
    assert generate(server, "The potter", seed=1234, **settings).json()["text_output"] == first
    for job in background:
        job.join(RPC_TIMEOUT)


def test_stop_strings_end_the_text_before_them(server, reference):
    _, text = reference("The potter", 32)
    stop = text[5:9]
    cut = text[: text.index(stop)]
    reply = generate(server, "The potter", max_tokens=32, stop=stop, exclude_input_in_output=True)
    assert reply.json()["text_output"] == cut
    url = f"http://{server.http_url}/v2/models/{MODEL}/generate_stream"
    with requests.post(url, json={"text_input": "The potter", "max_tokens": 32, "stop": ["zzz", stop]}, stream=True,
                       timeout=RPC_TIMEOUT) as streamed:
        assert "".join(e["text_output"] for e in sse_events(streamed)) == cut


def test_a_client_that_disconnects_stops_its_generation(server):
    canceled = metric(server, "nv_inference_request_failure", reason="CANCELED")
    generated = metric(server, "kiln_generation_tokens_total")
    url = f"http://{server.http_url}/v2/models/{MODEL}/generate_stream"
    # 8000 tokens take seconds, far longer than the client takes to go away.
    reply = requests.post(url, json={"text_input": "The potter", "max_tokens": 8000}, stream=True, timeout=RPC_TIMEOUT)
    lines = reply.iter_lines()
    assert next(lines).startswith(b"data: ")
    reply.close()
    wait_for(lambda: metric(server, "nv_inference_request_failure", reason="CANCELED") == canceled + 1,
             "the SSE generation to be cancelled")
    wait_for(lambda: metric(server, "kiln_active_sequences") == 0, "the sequence to leave")
    assert metric(server, "kiln_generation_tokens_total") - generated < 8000

    stream = Stream(server)
    stream.send("The potter", request_id="gone", max_tokens=("INT32", 8000))
    result, error = stream.responses.get(timeout=RPC_TIMEOUT)
    assert error is None and result.get_response().id == "gone"
    stream.close(cancel=True)
    wait_for(lambda: metric(server, "nv_inference_request_failure", reason="CANCELED") == canceled + 2,
             "the gRPC generation to be cancelled")
    wait_for(lambda: metric(server, "kiln_active_sequences") == 0, "the sequence to leave")


def test_generation_metrics_are_exported(server):
    generate(server, "The potter", max_tokens=4)
    text = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
    for name in ("kiln_time_to_first_token_seconds_bucket", "kiln_inter_token_latency_seconds_bucket",
                 "kiln_generation_tokens_total", "kiln_prompt_tokens_total", "kiln_active_sequences"):
        assert f'{name}{{model="{MODEL}",version="1"' in text, name
    assert metric(server, "kiln_time_to_first_token_seconds_count") > 0


def test_bad_settings_get_clear_errors(server, alive):
    # kiln's texts for its generation models' settings and prompt ('max_tokens', 'temperature',
    # 'top_p', 'seed', max_sequence_length, 'text_input' must be a string, at least one token): the
    # settings are kiln's runner's, Triton has no such model. Triton's: "reserved for Triton usage"
    # (server src/grpc/infer_handler.cc and src/http_server.cc, the 'triton_' parameter check),
    # "failed to parse the request JSON" (common src/triton_json.h, TritonJson::Value::Parse),
    # "missing required input(s)" (core src/infer_request.cc, InferenceRequest::Normalize), the
    # unknown model (core src/model_lifecycle.cc, ModelLifeCycle::GetModel, prefixed by
    # ModelRepositoryManager::GetModel).
    cases = [
        ({"max_tokens": 0}, "'max_tokens' must be an integer between 1"),
        ({"temperature": -1}, "'temperature' must be a number >= 0, got -1"),
        ({"top_p": 2.5}, "'top_p' must be a number in (0, 1]"),
        ({"seed": "x"}, "'seed' must be an integer"),
        ({"max_tokens": 9000}, "exceeds the model's max_sequence_length (8192)"),
        ({"triton_foo": True}, "reserved for Triton usage"),
    ]
    url = f"http://{server.http_url}/v2/models/{MODEL}/generate_stream"
    for settings, message in cases:
        for reply in (generate(server, "The potter", **settings),
                      requests.post(url, json={"text_input": "The potter", "parameters": settings}, timeout=RPC_TIMEOUT)):
            assert reply.status_code == 400, (settings, reply.text)
            assert reply.headers["content-type"] == "application/json"
            assert message in reply.json()["error"], (settings, reply.json())
    for body, message in ((b"{", "failed to parse the request JSON"), (b'{"text_input": 3}', "'text_input' must be a string"),
                          (b'{"max_tokens": 3}', "missing required input(s) ['text_input']"),
                          (b'{"text_input": ""}', "the prompt must hold at least one token")):
        reply = requests.post(f"http://{server.http_url}/v2/models/{MODEL}/generate", data=body, timeout=RPC_TIMEOUT)
        assert reply.status_code == 400 and message in reply.json()["error"], reply.text
    missing = requests.post(f"http://{server.http_url}/v2/models/nope/generate", json={"text_input": "x"},
                            timeout=RPC_TIMEOUT)
    assert missing.status_code == 404 and missing.json() == {"error": "Request for unknown model: 'nope' is not found"}

    stream = Stream(server)
    try:
        stream.send("The potter", request_id="bad", temperature=("FP32", -2.0))
        result, error = stream.responses.get(timeout=RPC_TIMEOUT)
        assert isinstance(error, InferenceServerException) and "'temperature' must be a number >= 0" in str(error)
        stream.send("The potter", request_id="good", max_tokens=("INT32", 2))
        assert [final for _, final, _ in stream.until_final()] == [False, True], "the stream stays open"
    finally:
        stream.close()


def test_plain_inference_on_a_decoupled_model_is_refused_as_triton_does(server, client):
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"The potter"], dtype=object))
    with pytest.raises(InferenceServerException) as refused:
        client.infer(MODEL, [text])
    assert refused.value.status() == str(grpc.StatusCode.UNIMPLEMENTED)
    # Triton: server src/grpc/infer_handler.cc, ModelInferHandler, and src/http_server.cc,
    # HandleInfer (501) (read on main).
    assert refused.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    body = {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["The potter"]}]}
    reply = requests.post(f"http://{server.http_url}/v2/models/{MODEL}/infer", json=body, timeout=RPC_TIMEOUT)
    assert reply.status_code == 501
    assert reply.json() == {"error": "HTTP end point doesn't support models with decoupled transaction policy"}
    not_generating = requests.post(f"http://{server.http_url}/v2/models/add_sub/generate",
                                   json={"text_input": "x"}, timeout=RPC_TIMEOUT)
    # A model that does not generate text takes generate requests by Triton's generic mapping
    # (test_generate_mapped.py): here `text_input` is no input of add_sub, so its inputs are missing.
    assert not_generating.status_code == 400
    assert "missing required input(s) ['INPUT0','INPUT1']" in not_generating.json()["error"]


def test_generation_requests_are_traced(tmp_path):
    """REST generate and a gRPC decoupled stream are traced as Triton traces decoupled requests:
    the protocol's stamps, REQUEST_START, QUEUE_START, one INFER_RESPONSE_COMPLETE per response,
    REQUEST_END; on the stream, a send start and end per response."""
    trace_file = tmp_path / "generate.json"
    traced = start_server([BUNDLED_REPO], name="kiln-generate-trace", extra_args=[
        "--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "rate=1"])
    try:
        assert generate(traced, "The potter", max_tokens=4).status_code == 200
        stream = Stream(traced)
        try:
            stream.send("The potter", request_id="s1", max_tokens=("INT32", 3))
            responses = len(stream.until_final())
        finally:
            stream.close()
    finally:
        stop_server(traced)
    names: dict[int, list[str]] = {}
    times: dict[int, list[int]] = {}
    for record in json.loads(trace_file.read_text()):
        if "model_name" in record:
            assert record["model_name"] == MODEL
        for stamp in record.get("timestamps", []):
            names.setdefault(record["id"], []).append(stamp["name"])
            times.setdefault(record["id"], []).append(stamp["ns"])
    assert len(names) == 2, names
    rest = next(n for n in names.values() if n[0] == "HTTP_RECV_START")
    grpc_trace = next(n for n in names.values() if n[0] == "GRPC_WAITREAD_START")
    tokens = rest.count("INFER_RESPONSE_COMPLETE")
    assert 1 <= tokens <= 4
    assert rest == ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START",
                    *["INFER_RESPONSE_COMPLETE"] * tokens, "REQUEST_END", "HTTP_SEND_START", "HTTP_SEND_END"]
    # A response's send ends when the next is taken: the stamps of sending are counted apart.
    sending = [n for n in grpc_trace if n.startswith("GRPC_SEND")]
    assert sending.count("GRPC_SEND_START") == sending.count("GRPC_SEND_END") == responses, grpc_trace
    assert [n for n in grpc_trace if not n.startswith("GRPC_SEND")] == [
        "GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START", "QUEUE_START",
        *["INFER_RESPONSE_COMPLETE"] * responses, "REQUEST_END"]
    for stamps in times.values():
        assert stamps == sorted(stamps)


def test_first_response_histogram_as_triton_publishes_it(tmp_path):
    """`--metrics-config histogram_latencies=true`: Triton's nv_inference_first_response_histogram_ms
    for decoupled models, with Triton's default buckets or those the config's model_metrics sets;
    models that are not decoupled have none."""
    repo = tmp_path / "repo"
    shutil.copytree(MODEL_DIR, repo / MODEL)
    shutil.copytree(MODEL_DIR, repo / "tiny_decoder_buckets")
    config = repo / "tiny_decoder_buckets" / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{MODEL}"', 'name: "tiny_decoder_buckets"') + """
model_metrics { metric_control [ {
  metric_identifier { family: "nv_inference_first_response_histogram_ms" }
  histogram_options { buckets: [ -1, 0.0, 1, 2.5 ] } } ] }
""")
    shutil.copytree(BUNDLED_REPO / "add_sub", repo / "add_sub")
    server = start_server([repo], name="kiln-histogram", extra_args=[
        "--metrics-config", "histogram_latencies=true"])
    try:
        started = time.monotonic()
        for prompt in PROMPTS[:3]:
            assert generate(server, prompt, max_tokens=2).status_code == 200
        elapsed_ms = (time.monotonic() - started) * 1e3
        body = {"text_input": "A kiln is", "parameters": {"max_tokens": 2}}
        assert requests.post(f"http://{server.http_url}/v2/models/tiny_decoder_buckets/generate", json=body,
                             timeout=RPC_TIMEOUT).status_code == 200
        text = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
    finally:
        stop_server(server)
    family = "nv_inference_first_response_histogram_ms"
    assert f"# HELP {family} Duration from request to first response in milliseconds" in text
    assert f"# TYPE {family} histogram" in text
    series = {}
    for line in text.splitlines():
        if line.startswith(family):
            key, value = line.rsplit(" ", 1)
            series[key] = float(value)
    labels = f'model="{MODEL}",version="1"'
    assert series[f"{family}_count{{{labels}}}"] == 3
    assert 0 < series[f"{family}_sum{{{labels}}}"] <= elapsed_ms
    default = [f'{family}_bucket{{{labels},le="{le}"}}' for le in ("100", "500", "2000", "5000", "+Inf")]
    assert [key for key in series if key.startswith(f"{family}_bucket{{{labels}")] == default
    assert series[default[-1]] == 3
    custom = 'model="tiny_decoder_buckets",version="1"'
    assert [key for key in series if key.startswith(f"{family}_bucket{{{custom}")] == [
        f'{family}_bucket{{{custom},le="{le}"}}' for le in ("-1", "0", "1", "2.5", "+Inf")]
    assert series[f"{family}_count{{{custom}}}"] == 1
    assert not any('model="add_sub"' in key for key in series)
