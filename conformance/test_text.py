"""Text models: the bundled all_minilm_l6_v2 and kiln's server-side tokenization.

- kiln's embeddings over tritonclient gRPC and HTTP and MLServer's StringRequestCodec match a numpy forward
  pass of the same weights (model_repository/build_minilm.reference), cosine >= 0.999;
- the token tensors kiln builds from MiniLM's tokenizer.json (seen through a graph that echoes them) equal
  those of the Python `tokenizers` package: defaults from tokenizer.json, truncation, special tokens, padding;
- concurrent requests are merged into fewer executions and each gets its own rows back;
- text that is not UTF-8, or a tensor of the wrong type or shape, is refused with a clear error.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tokenizers import Tokenizer
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, CONFORMANCE_DIR, REPO_ROOT, RPC_TIMEOUT, doc_section, start_server, stop_server

sys.path.insert(0, str(REPO_ROOT / "model_repository"))
import build_minilm  # noqa: E402

MODEL = "all_minilm_l6_v2"
MODEL_DIR = BUNDLED_REPO / MODEL
WEIGHTS = REPO_ROOT / ".kiln" / "minilm"
SENTENCES = [
    "kiln serves ONNX models over the Triton protocol.",
    "A quick brown fox jumps over the lazy dog.",
    "Sentence embeddings map text to vectors of 384 numbers.",
    "h\u00e9llo w\u00f6rld, \u4f60\u597d \U0001f600",
    "",
    "short",
]


class Reference:
    """Reference embeddings (float64 numpy forward pass of the package's weights), one sentence at a time and
    unpadded, truncated at 256 tokens as the model's config asks."""

    def __init__(self):
        if not (WEIGHTS / "model.safetensors").exists():
            pytest.fail(f"{WEIGHTS} is missing: run `.ci/setup.sh models`", pytrace=False)
        self.weights = build_minilm.read_safetensors(str(WEIGHTS / "model.safetensors"))
        self.cfg = build_minilm.BertConfig.from_json(str(WEIGHTS / "config.json"))
        self.cache = {}

    def __getitem__(self, sentence):
        if sentence not in self.cache:
            ids, mask, types = build_minilm.encode(str(MODEL_DIR / "tokenizer.json"), [sentence], 256)
            self.cache[sentence] = build_minilm.reference(self.weights, self.cfg, ids, mask, types)[0]
        return self.cache[sentence]


@pytest.fixture(scope="module")
def reference():
    return Reference()


def _cosines(got, sentences, reference):
    want = np.stack([reference[s] for s in sentences])
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)


def _texts(sentences):
    return np.array([[s.encode("utf-8")] for s in sentences], dtype=np.object_)


def test_metadata_shows_the_text_input(client):
    md = client.get_model_metadata(MODEL, as_json=True)
    assert [(i["name"], i["datatype"], i["shape"]) for i in md["inputs"]] == [("text", "BYTES", ["-1", "1"])]
    assert [(o["name"], o["datatype"], o["shape"]) for o in md["outputs"]] == [("embedding", "FP32", ["-1", "384"])]


def test_grpc_embeddings_match_the_numpy_reference(client, reference):
    x = grpcclient.InferInput("text", [len(SENTENCES), 1], "BYTES")
    x.set_data_from_numpy(_texts(SENTENCES))
    got = client.infer(MODEL, [x], client_timeout=RPC_TIMEOUT).as_numpy("embedding")
    assert got.dtype == np.float32
    assert _cosines(got, SENTENCES, reference).min() >= 0.999
    np.testing.assert_allclose(np.linalg.norm(got[:4], axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("binary", [True, False])
def test_http_embeddings_match_the_numpy_reference(http_url, reference, binary):
    client = httpclient.InferenceServerClient(http_url, network_timeout=RPC_TIMEOUT)
    x = httpclient.InferInput("text", [len(SENTENCES), 1], "BYTES")
    x.set_data_from_numpy(_texts(SENTENCES), binary_data=binary)
    out = httpclient.InferRequestedOutput("embedding", binary_data=binary)
    got = client.infer(MODEL, [x], outputs=[out]).as_numpy("embedding")
    assert _cosines(got, SENTENCES, reference).min() >= 0.999


@pytest.mark.parametrize("flow", ["embeddings_typed", "embeddings_raw"])
def test_mlserver_string_codec_sends_sentences(server, reference, flow):
    proc = subprocess.run([sys.executable, str(CONFORMANCE_DIR / "mlserver_client.py"), server.grpc_url, flow],
                          capture_output=True, text=True, timeout=180, cwd=str(CONFORMANCE_DIR))
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout)[flow]
    assert r.get("ok"), r
    assert r["sent_shape"] == [len(r["sentences"]), 1] and r["name"] == "embedding"
    assert _cosines(r["embedding"], r["sentences"], reference).min() >= 0.999


def test_concurrent_requests_are_merged_and_split_back(server, client):
    """8 clients x 3 requests of 1-3 sentences: fewer executions than requests, and every request gets the
    rows of its own sentences (as kiln embeds them in one request of all the sentences)."""
    sentences = [f"request {i}: " + " ".join(["text"] * (i % 5 + 1)) for i in range(26)]
    requests = [sentences[i:i + 1 + i % 3] for i in range(24)]
    x = grpcclient.InferInput("text", [len(sentences), 1], "BYTES")
    x.set_data_from_numpy(_texts(sentences))
    alone = dict(zip(sentences, client.infer(MODEL, [x], client_timeout=RPC_TIMEOUT).as_numpy("embedding")))

    def stats():
        c = grpcclient.InferenceServerClient(server.grpc_url)
        s = c.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
        return int(s.get("inference_count", 0)), int(s.get("execution_count", 0))

    before = stats()
    results, errors = {}, []

    def worker(indices):
        c = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            for i in indices:
                x = grpcclient.InferInput("text", [len(requests[i]), 1], "BYTES")
                x.set_data_from_numpy(_texts(requests[i]))
                results[i] = c.infer(MODEL, [x], client_timeout=RPC_TIMEOUT).as_numpy("embedding")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(range(t, 24, 8),)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert sorted(results) == list(range(24))
    for i, got in results.items():
        assert _cosines(got, requests[i], alone).min() >= 0.9999, i
    after = stats()
    rows = sum(len(r) for r in requests)
    assert after[0] - before[0] == rows
    assert after[1] - before[1] < len(requests), f"{after[1] - before[1]} executions for {len(requests)} requests"


def test_text_that_is_not_utf8_is_refused(http_url, client):
    x = httpclient.InferInput("text", [2, 1], "BYTES")
    x.set_data_from_numpy(np.array([[b"fine"], [b"\xff\xfe bad"]], dtype=np.object_), binary_data=True)
    with pytest.raises(InferenceServerException) as err:
        httpclient.InferenceServerClient(http_url).infer(MODEL, [x])
    # kiln's text (its tokenizer needs UTF-8; Triton has no text models of this kind).
    assert "element 1 of inference input 'text' for model 'all_minilm_l6_v2' is not valid UTF-8" in str(err.value)
    y = grpcclient.InferInput("text", [1, 1], "FP32")
    y.set_data_from_numpy(np.ones((1, 1), np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer(MODEL, [y], client_timeout=RPC_TIMEOUT)
    # Triton: core src/infer_request.cc, InferenceRequest::Normalize.
    assert "data-type is 'FP32', but model 'all_minilm_l6_v2' expects 'BYTES'" in str(err.value)


# -------------------------------------------------------------------------------- tokenization vs Python

TOKEN_TEXTS = SENTENCES + [
    " ".join(["tokenization"] * 100),  # past tokenizer.json's 128 tokens
    "Don't  split\tcontractions, URLs (https://example.com) or 3.14159!",
    "   ",
]


def _echo_model():
    t = lambda n: helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])  # noqa: E731
    graph = helper.make_graph(
        [helper.make_node("Identity", [i], [o]) for i, o in
         (("input_ids", "ids"), ("attention_mask", "mask"), ("token_type_ids", "types"))],
        "echo", [t("input_ids"), t("attention_mask"), t("token_type_ids")], [t("ids"), t("mask"), t("types")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


ECHO_MODELS = {
    # name: (extra parameters, python setup)
    "echo_defaults": ({}, lambda tok: tok.enable_padding()),  # tokenizer.json truncates at 128
    "echo_short": ({"tokenizer_max_length": "10"}, lambda tok: (tok.enable_truncation(10), tok.enable_padding())),
    "echo_fixed": ({"tokenizer_max_length": "24", "tokenizer_padding": "max_length",
                    "tokenizer_add_special_tokens": "false"},
                   lambda tok: (tok.enable_truncation(24), tok.enable_padding(length=24))),
}


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("text-echo")
    graph = _echo_model()
    tokenizer = (MODEL_DIR / "tokenizer.json").read_bytes()
    for name, (params, _) in ECHO_MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.onnx").write_bytes(graph)
        (repo / name / "tokenizer.json").write_bytes(tokenizer)
        params = {"tokenizer_text_input": "text", **params}
        (repo / name / "config.pbtxt").write_text(
            'backend: "onnxruntime"\nmax_batch_size: 16\n' + "".join(
                f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in params.items()))
    srv = start_server([repo], name="kiln-text-echo")
    yield srv
    stop_server(srv)


@pytest.mark.parametrize("name", sorted(ECHO_MODELS))
def test_minilm_tokens_equal_the_python_tokenizers_package(echo_server, name):
    tok = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    ECHO_MODELS[name][1](tok)
    special = ECHO_MODELS[name][0].get("tokenizer_add_special_tokens") != "false"
    want = tok.encode_batch(TOKEN_TEXTS, add_special_tokens=special)
    client = grpcclient.InferenceServerClient(echo_server.grpc_url)
    x = grpcclient.InferInput("text", [len(TOKEN_TEXTS), 1], "BYTES")
    x.set_data_from_numpy(_texts(TOKEN_TEXTS))
    got = client.infer(name, [x], client_timeout=RPC_TIMEOUT)
    assert got.as_numpy("ids").tolist() == [e.ids for e in want]
    assert got.as_numpy("mask").tolist() == [e.attention_mask for e in want]
    assert got.as_numpy("types").tolist() == [e.type_ids for e in want]


# -------------------------------------------------------------------------------- the README's examples


def _readme_blocks(language):
    section = doc_section(REPO_ROOT / "docs" / "models.md", "Text models: sentence embeddings")
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def _numbers(text):
    return [float(v) for v in re.findall(r"-?\d+\.\d*(?:e-?\d+)?", text)]


def test_readme_python_example_prints_what_it_shows(server):
    (block,) = _readme_blocks("python")
    proc = subprocess.run([sys.executable, "-c", block.replace("localhost:8001", server.grpc_url)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = block.split("print(np.round(embedding @ embedding.T, 2))")[1].split("\n")[0]
    assert _numbers(proc.stdout) == _numbers(shown), proc.stdout


def test_readme_curl_example_answers_what_it_shows(server):
    (block,) = _readme_blocks("bash")
    script = block.replace("localhost:8000", server.http_url)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, timeout=RPC_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    out = body["outputs"][0]
    assert (out["name"], out["datatype"], out["shape"]) == ("embedding", "FP32", [1, 384])
    shown = _numbers(block.split('"data":[')[1])
    np.testing.assert_allclose(out["data"][:len(shown)], shown, atol=1e-6)
