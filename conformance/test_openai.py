"""The OpenAI-compatible API (`--openai-port`) through OpenAI's own client (the `openai` package):
the bundled decoupled `tiny_decoder` and the sentence-embedding `all_minilm_l6_v2` are listed; the
embedding model answers `/v1/embeddings` with the vectors KServe's infer gives for the same texts
(floats or base64, any number of texts up to OpenAI's 2048) and the token usage the tokenizers
package counts; `tiny_decoder` completes prompts with the same text as Triton's
generate extension (greedy), streams chunk by chunk ending with `finish_reason` and usage, echoes
and stops as asked; with a chat template (ChatML, in a copy's tokenizer_config.json) it answers
chats with what the prompt Jinja2 renders from the same template completes to; settings kiln
cannot honour, chats without a template and models that do not generate are refused with
OpenAI's error shape and status."""

from __future__ import annotations

import base64
import json
import shutil

import jinja2
import numpy as np
import openai
import pytest
import requests
from tokenizers import Tokenizer

from conftest import BUNDLED_REPO, RPC_TIMEOUT, find_free_port, start_server, stop_server

MODEL = "tiny_decoder"
EMBEDDER = "all_minilm_l6_v2"
PROMPT = "The potter"


def serve(repo, name):
    """kiln serving `repo` with the OpenAI API on a free port, and an OpenAI client for it."""
    port = find_free_port()
    server = start_server([repo], name=name, extra_args=["--openai-port", str(port)])
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=RPC_TIMEOUT,
                           max_retries=0)
    return server, client


@pytest.fixture(scope="module")
def openai_server():
    server, client = serve(BUNDLED_REPO, "kiln-openai")
    yield server, client
    stop_server(server)


def generated(server, prompt: str, max_tokens: int) -> str:
    """What Triton's generate extension answers for the same greedy request."""
    body = {"text_input": prompt, "max_tokens": max_tokens, "temperature": 0, "exclude_input_in_output": True}
    reply = requests.post(f"http://{server.http_url}/v2/models/{MODEL}/generate", json=body, timeout=RPC_TIMEOUT)
    assert reply.status_code == 200, reply.text
    return reply.json()["text_output"]


def test_only_generation_and_embedding_models_are_listed(openai_server):
    _, client = openai_server
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    for probe in ("/health", "/health/ready"):
        assert requests.get(base + probe, timeout=RPC_TIMEOUT).status_code == 200, probe
    assert [m.id for m in client.models.list().data] == [EMBEDDER, MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    assert client.models.retrieve(EMBEDDER).id == EMBEDDER
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("add_sub")


def test_a_completion_matches_the_generate_extension(openai_server):
    server, client = openai_server
    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    choice = completion.choices[0]
    assert choice.text == generated(server, PROMPT, 8)
    assert choice.finish_reason == "length" and choice.index == 0
    assert completion.object == "text_completion" and completion.model == MODEL
    prompt_tokens = len(Tokenizer.from_file(str(BUNDLED_REPO / MODEL / "tokenizer.json")).encode(PROMPT).ids)
    assert completion.usage.prompt_tokens == prompt_tokens
    assert completion.usage.completion_tokens == 8
    assert completion.usage.total_tokens == prompt_tokens + 8


def test_a_stream_sends_chunks_then_the_reason_and_usage(openai_server):
    server, client = openai_server
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert "".join(texts) == generated(server, PROMPT, 6)
    assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])
    assert len({c.id for c in chunks}) == 1
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1 and usage[0].completion_tokens == 6
    # The raw stream ends as OpenAI's does.
    url = str(client.base_url).rstrip("/")
    raw = requests.post(f"{url}/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "stream": True},
                        timeout=RPC_TIMEOUT)
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_echo_and_stop(openai_server):
    server, client = openai_server
    whole = generated(server, PROMPT, 8)
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + whole
    stop = whole.strip().split(" ")[1]
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == whole[: whole.index(stop)]


def test_what_cannot_be_served_is_refused(openai_server):
    server, client = openai_server
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, n=2)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, logprobs=3)
    assert e.value.body["param"] == "logprobs"
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="add_sub", prompt=PROMPT)
    assert "does not generate text" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert "has no chat template" in e.value.body["message"]
    # The generation's own checks name the request by the answer's id.
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=-1)
    assert e.value.body["message"].startswith("[request id: cmpl-"), e.value.body
    # Hostile bodies get OpenAI's error shape, and the server stays up.
    url = str(client.base_url).rstrip("/")
    for body in (b"garbage", b"\xff\xfe", b"[" * 100_000, b'{"model": "tiny_decoder", "prompt": "x", "top_p": 5}'):
        reply = requests.post(f"{url}/completions", data=body, headers={"content-type": "application/json"},
                              timeout=RPC_TIMEOUT)
        assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error", reply.text
    server.assert_alive()


# ChatML, as small chat models (SmolLM, Qwen) ship it, with a check of the roles.
CHATML = ("{% for message in messages %}"
          "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
          "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'].strip() + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def rendered(messages) -> str:
    """The prompt transformers' apply_chat_template makes: Jinja2 with its settings."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message):
        raise jinja2.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(CHATML).render(messages=messages, add_generation_prompt=True,
                                          bos_token="", eos_token="")


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("chat") / "repo"
    shutil.copytree(BUNDLED_REPO / MODEL, repo / MODEL)
    (repo / MODEL / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    # A template that does not compile refuses chats only.
    shutil.copytree(BUNDLED_REPO / MODEL, repo / "broken_chat")
    config = repo / "broken_chat" / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{MODEL}"', 'name: "broken_chat"'))
    (repo / "broken_chat" / "chat_template.jinja").write_text("{% for %}")
    server, client = serve(repo, "kiln-openai-chat")
    yield server, client
    stop_server(server)


def test_a_chat_completes_the_prompt_its_template_makes(chat_server):
    _, client = chat_server
    messages = [{"role": "system", "content": "You fire pots. "}, {"role": "user", "content": "What is a kiln?"}]
    expected = client.completions.create(model=MODEL, prompt=rendered(messages), max_tokens=8, temperature=0)
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-")
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == expected.choices[0].text
    assert chat.choices[0].finish_reason == expected.choices[0].finish_reason
    assert chat.usage.prompt_tokens == expected.usage.prompt_tokens
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.choices[0].text
    assert chunks[-1].choices[0].finish_reason == expected.choices[0].finish_reason


def test_the_template_refuses_what_it_refuses(chat_server):
    server, client = chat_server
    with pytest.raises(jinja2.TemplateError, match="unknown role tool"):
        rendered([{"role": "tool", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "tool", "content": "x"}])
    assert e.value.body["message"] == "unknown role tool"
    assert client.completions.create(model="broken_chat", prompt=PROMPT, max_tokens=2).choices[0].text
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="broken_chat", messages=[{"role": "user", "content": "x"}])
    assert "the chat template of model 'broken_chat' cannot be used" in e.value.body["message"]
    server.assert_alive()


SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.", "",
             "Kilns fire clay into ceramics at temperatures above a thousand degrees. " * 3]


def kserve_embeddings(server, texts) -> np.ndarray:
    """The vectors KServe's infer answers for `texts` sent as one request."""
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts), 1], "data": texts}]}
    reply = requests.post(f"http://{server.http_url}/v2/models/{EMBEDDER}/infer", json=body, timeout=RPC_TIMEOUT)
    assert reply.status_code == 200, reply.text
    output = reply.json()["outputs"][0]
    return np.array(output["data"], dtype=np.float32).reshape(output["shape"])


def test_embeddings_are_the_models_vectors_with_their_token_usage(openai_server):
    server, client = openai_server
    expected = kserve_embeddings(server, SENTENCES)
    # Unless told otherwise the openai package asks for base64 and decodes it itself; asked for
    # base64, it hands over the text.
    for encoding in (None, "base64", "float"):
        options = {"encoding_format": encoding} if encoding else {}
        answer = client.embeddings.create(model=EMBEDDER, input=SENTENCES, **options)
        assert answer.object == "list" and answer.model == EMBEDDER
        assert [d.index for d in answer.data] == list(range(len(SENTENCES)))
        assert all(d.object == "embedding" for d in answer.data)
        if encoding == "base64":
            vectors = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in answer.data])
        else:
            vectors = np.array([d.embedding for d in answer.data], dtype=np.float32)
        assert vectors.shape == (len(SENTENCES), 384)
        np.testing.assert_allclose(vectors, expected, rtol=0, atol=1e-6, err_msg=encoding)
    tokenizer = Tokenizer.from_file(str(BUNDLED_REPO / EMBEDDER / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(256)
    tokens = sum(len(tokenizer.encode(s).ids) for s in SENTENCES)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens
    # A real sentence model: the paraphrase is nearer than the unrelated sentence.
    eating, bread, baby = vectors[0], vectors[1], vectors[2]
    assert eating @ bread > eating @ baby + 0.3
    one = client.embeddings.create(model=EMBEDDER, input=SENTENCES[0], dimensions=384)
    np.testing.assert_allclose(one.data[0].embedding, expected[0], rtol=0, atol=1e-5)


def test_more_texts_than_a_batch_are_split_and_kept_in_order(openai_server):
    server, client = openai_server
    # 100 texts: four requests of at most max_batch_size (32), each batched by the scheduler.
    texts = [f"sentence number {i} about {'clay ' * (i % 7)}" for i in range(100)]
    answer = client.embeddings.create(model=EMBEDDER, input=texts, encoding_format="float")
    vectors = np.array([d.embedding for d in answer.data], dtype=np.float32)
    for start in (0, 32, 64, 96):
        np.testing.assert_allclose(vectors[start:start + 32], kserve_embeddings(server, texts[start:start + 32]),
                                   rtol=0, atol=1e-5)


def test_what_embeddings_cannot_serve_is_refused(openai_server):
    server, client = openai_server
    for model in (MODEL, "add_sub"):
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model=model, input="x")
        assert "does not make embeddings of text" in e.value.body["message"], e.value.body
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no_such_model", input="x")
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=EMBEDDER, input=[[101, 2023, 102]])
    assert e.value.body["param"] == "input" and "token ids" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=EMBEDDER, input="x", dimensions=64)
    assert "384 dimensions, not 64" in e.value.body["message"]
    url = str(client.base_url).rstrip("/")
    for body in (b"garbage", b'{"model": "all_minilm_l6_v2", "input": ' + b'["x"' + b',"x"' * 2048 + b"]}",
                 b'{"model": "all_minilm_l6_v2", "input": "x", "encoding_format": "int8"}'):
        reply = requests.post(f"{url}/embeddings", data=body, headers={"content-type": "application/json"},
                              timeout=RPC_TIMEOUT)
        assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error", reply.text
    server.assert_alive()
