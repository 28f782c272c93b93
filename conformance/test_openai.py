"""The OpenAI-compatible API (`--openai-port`) through OpenAI's own client (the `openai` package):
the bundled decoupled `tiny_decoder` is listed, completes prompts with the same text as Triton's
generate extension (greedy), streams chunk by chunk ending with `finish_reason` and usage, echoes
and stops as asked; with a chat template (ChatML, in a copy's tokenizer_config.json) it answers
chats with what the prompt Jinja2 renders from the same template completes to; settings kiln
cannot honour, chats without a template and models that do not generate are refused with
OpenAI's error shape and status."""

from __future__ import annotations

import json
import shutil

import jinja2
import openai
import pytest
import requests
from tokenizers import Tokenizer

from conftest import BUNDLED_REPO, RPC_TIMEOUT, find_free_port, start_server, stop_server

MODEL = "tiny_decoder"
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


def test_only_generation_models_are_listed(openai_server):
    _, client = openai_server
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    for probe in ("/health", "/health/ready"):
        assert requests.get(base + probe, timeout=RPC_TIMEOUT).status_code == 200, probe
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
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
