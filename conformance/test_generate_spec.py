"""The Open Inference Protocol's generate extension (kserve/open-inference-protocol,
`specification/protocol/generate_rest.yaml`) against the bundled `tiny_decoder`:

- `parameters` as the spec writes them: `stop` an array of strings, `max_tokens` beside it (kiln
  answered 400 `parameter 'stop' must be a string, a number or a boolean`);
- `"details": true` adds `details`: `finish_reason` (`length`, `stop_sequence`, `eos_token`) and
  `logprobs` (each token's id, text, log-probability and whether it is special) on a whole text,
  `finish_reason` and `token` on each streamed event; ids and log-probabilities equal a reference
  loop's (onnxruntime, full recomputation, log-softmax of the raw logits);
- without `details` every answer stays what it was, byte for byte of its JSON.
"""

from __future__ import annotations

import json

import pytest
import requests

from conftest import RPC_TIMEOUT
from tiny_decoder import EOS, Reference

MODEL = "tiny_decoder"


@pytest.fixture(scope="module")
def reference():
    """Greedy continuation by full recomputation, as (token id, log-probability) pairs."""
    loop = Reference()

    def generate(prompt: str, max_tokens: int) -> list[tuple[int, float]]:
        return loop.greedy(prompt, max_tokens)

    generate.decode = loop.decode
    generate.token_text = loop.token_text
    return generate


def url(server, endpoint: str = "generate") -> str:
    return f"http://{server.http_url}/v2/models/{MODEL}/versions/1/{endpoint}"


def events(reply: requests.Response) -> list[dict]:
    assert reply.status_code == 200, reply.text
    return [json.loads(line[len("data: "):]) for line in reply.iter_lines(decode_unicode=True)
            if line.startswith("data: ")]


def test_the_spec_request_with_stop_as_an_array_is_answered(server, reference):
    # The request, exactly as the spec writes it.
    body = {"text_input": "The potter", "parameters": {"max_tokens": 4, "stop": ["zzz", "yyy"]}}
    reply = requests.post(url(server), json=body, timeout=RPC_TIMEOUT)
    assert reply.status_code == 200, reply.text
    tokens = [t for t, _ in reference("The potter", 4)]
    assert reply.json() == {"model_name": MODEL, "model_version": "1",
                            "text_output": "The potter" + reference.decode(tokens)}
    # A stop string in `parameters`' array ends the text, as the same string at the top level does.
    text = reference.decode([t for t, _ in reference("The potter", 32)])
    stop = text[5:9]
    cut = text[: text.index(stop)]
    for body in ({"text_input": "The potter", "parameters": {"max_tokens": 32, "stop": ["zzz", stop]}},
                 {"text_input": "The potter", "max_tokens": 32, "stop": ["zzz", stop]}):
        reply = requests.post(url(server), json=body, timeout=RPC_TIMEOUT)
        assert reply.json()["text_output"] == "The potter" + cut, body
    # A list that is not of strings, and `stop` given twice, are named.
    reply = requests.post(url(server), json={"text_input": "x", "parameters": {"stop": [1]}}, timeout=RPC_TIMEOUT)
    assert reply.status_code == 400 and "'stop' must be a list of strings" in reply.json()["error"]
    reply = requests.post(url(server), json={"text_input": "x", "stop": ["a"], "parameters": {"stop": ["b"]}},
                          timeout=RPC_TIMEOUT)
    assert reply.status_code == 400 and "'stop' is specified more than once" in reply.json()["error"]


def test_details_of_a_whole_text_match_the_reference(server, reference):
    expected = reference("A kiln is", 6)
    body = {"text_input": "A kiln is", "parameters": {"max_tokens": 6, "details": True}}
    reply = requests.post(url(server), json=body, timeout=RPC_TIMEOUT).json()
    assert set(reply) == {"model_name", "model_version", "text_output", "details"}
    assert reply["text_output"] == "A kiln is" + reference.decode([t for t, _ in expected])
    details = reply["details"]
    assert details["finish_reason"] == "length"
    assert [t["id"] for t in details["logprobs"]] == [t for t, _ in expected]
    for got, (token, logprob) in zip(details["logprobs"], expected):
        assert set(got) == {"id", "text", "logprob", "special"}
        assert got["text"] == reference.token_text(token) and got["special"] is False
        assert got["logprob"] <= 0 and abs(got["logprob"] - logprob) < 1e-3, (got, logprob)
    # The same on generate_stream with "stream": false: one event, the whole text and its details.
    body["parameters"]["stream"] = False
    with requests.post(url(server, "generate_stream"), json=body, stream=True, timeout=RPC_TIMEOUT) as streamed:
        assert events(streamed) == [reply]


def test_each_streamed_token_carries_its_details(server, reference):
    expected = reference("Wood kilns take", 5)
    body = {"text_input": "Wood kilns take", "parameters": {"max_tokens": 5, "details": True}}
    with requests.post(url(server, "generate_stream"), json=body, stream=True, timeout=RPC_TIMEOUT) as streamed:
        got = events(streamed)
    assert len(got) == len(expected)
    assert [e["details"]["token"]["id"] for e in got] == [t for t, _ in expected]
    assert [e["details"]["finish_reason"] for e in got] == [None] * (len(got) - 1) + ["length"]
    for event, (_, logprob) in zip(got, expected):
        assert abs(event["details"]["token"]["logprob"] - logprob) < 1e-3
        assert set(event) == {"model_name", "model_version", "text_output", "details"}


def test_finish_reasons_name_the_stop_string_and_the_eos_token(server, reference):
    text = reference.decode([t for t, _ in reference("The potter", 32)])
    stop = text[5:9]
    body = {"text_input": "The potter", "parameters": {"max_tokens": 32, "stop": [stop], "details": True}}
    assert requests.post(url(server), json=body, timeout=RPC_TIMEOUT).json()["details"]["finish_reason"] \
        == "stop_sequence"
    # After ".", <|endoftext|> is the model's second choice: with two candidates and a seed, some
    # of these seeds draw it (the draws are kiln's own PRNG, the same on every run).
    ended = []
    for seed in range(64):
        body = {"text_input": ".", "parameters": {"max_tokens": 8, "top_k": 2, "temperature": 1.0, "seed": seed,
                                                   "details": True, "exclude_input_in_output": True}}
        reply = requests.post(url(server), json=body, timeout=RPC_TIMEOUT).json()
        details = reply["details"]
        if details["finish_reason"] == "eos_token":
            ended.append(seed)
            last = details["logprobs"][-1]
            assert (last["id"], last["text"], last["special"]) == (EOS, "<|endoftext|>", True)
            assert "<|endoftext|>" not in reply["text_output"]
            assert all(not t["special"] for t in details["logprobs"][:-1])
        else:
            assert details["finish_reason"] == "length" and len(details["logprobs"]) == 8
    assert ended, "no seed drew the end-of-sequence token"


def test_without_details_the_answers_are_unchanged(server, reference):
    tokens = [t for t, _ in reference("A kiln is", 3)]
    for details in ({}, {"details": False}):
        body = {"text_input": "A kiln is", "parameters": {"max_tokens": 3, **details}}
        reply = requests.post(url(server), json=body, timeout=RPC_TIMEOUT)
        assert reply.content == json.dumps({"model_name": MODEL, "model_version": "1",
                                            "text_output": "A kiln is" + reference.decode(tokens)},
                                           separators=(",", ":"), ensure_ascii=False).encode()
        with requests.post(url(server, "generate_stream"), json=body, stream=True, timeout=RPC_TIMEOUT) as streamed:
            assert all(set(e) == {"model_name", "model_version", "text_output"} for e in events(streamed))
    reply = requests.post(url(server), json={"text_input": "x", "parameters": {"details": "yes"}}, timeout=RPC_TIMEOUT)
    assert reply.status_code == 400 and "'details' must be a boolean" in reply.json()["error"]
