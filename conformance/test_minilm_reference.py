"""all_minilm_l6_v2 against figures others published for sentence-transformers/all-MiniLM-L6-v2 (issue #40).

test_text.py compares kiln with a numpy forward pass written beside the graph builder
(model_repository/build_minilm.py), so a mistake the two share agrees with itself. This file shares no code with
the builder: its reference is minilm_reference.json, figures printed by others for this model, each with its
source: sentence-transformers' documentation (cosine similarity matrices, Manhattan distances, semantic-search
scores), Simon Willison's blog (leading embedding values, sentence-transformers), fastembed's tests (its own
ONNX export) and DJL's demo (PyTorch). kiln embeds every published text (the text input, over gRPC and REST
JSON) and the test computes the similarities itself.

Tolerance: a figure printed with d decimals stands for a value within half a unit of its last digit (0.00005
for 0.6660); on top of that, SLACK for float32 arithmetic done in another runtime (kiln: ONNX Runtime; the
sources: PyTorch, or fastembed's own ONNX graph). The slack is small next to the half unit of the 4-decimal
figures, so they are checked at the precision printed, not looser. Cosine similarity ignores the length of the
vectors, so the Manhattan distances and the leading values are what check the L2 normalisation.

The last test shows the reference can fail: it serves four broken copies of the bundled model (a tokenizer
that does not lower-case, a graph without the L2 normalisation, the two token-type embeddings swapped, LayerNorm
with PyTorch's default epsilon) and expects each to miss published figures.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import helper, numpy_helper

from conftest import BUNDLED_REPO, CONFORMANCE_DIR, RPC_TIMEOUT, start_server, stop_server

MODEL = "all_minilm_l6_v2"
REFERENCE = json.loads((CONFORMANCE_DIR / "minilm_reference.json").read_text())
# Float32 noise between runtimes, beyond the rounding of the printed digits. Embedding values: kiln is within
# 1.1e-7 of the full-precision ones (willison) and within 2.4e-7 of the rounding interval of the others. A
# cosine of vectors whose values move by ~1e-7 moves by ~1e-7; a Manhattan distance adds 384 such moves (~2e-6
# when they are independent). kiln's 4-decimal figures all lie inside their rounding intervals.
SLACK = {"cosine": 1e-6, "manhattan": 1e-5, "value": 1e-6}


@dataclass
class Figure:
    source: str
    what: str
    printed: str
    got: float
    kind: str

    @property
    def tolerance(self) -> float:
        decimals = len(self.printed.split(".")[1]) if "." in self.printed else 0
        return 0.5 * 10.0 ** -decimals + SLACK[self.kind]

    @property
    def error(self) -> float:
        return abs(self.got - float(self.printed))

    def __str__(self):
        return (f"{self.source}: {self.what}: published {self.printed}, kiln {self.got:.8f} "
                f"(|diff| {self.error:.2e} > {self.tolerance:.2e})")


def published_texts() -> list[str]:
    texts = []
    for m in REFERENCE["similarities"]:
        texts += m["rows"] + m["columns"]
    for s in REFERENCE["searches"]:
        texts += s["corpus"] + list(s["top"])
    texts += [v["text"] for v in REFERENCE["leading_values"]]
    return list(dict.fromkeys(texts))


def similarity(metric: str, a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    if metric == "cosine":
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    assert metric == "manhattan", metric  # sentence-transformers: minus the L1 distance, of the vectors as served
    return float(-np.abs(a - b).sum())


def matrix_figures(vec) -> list[Figure]:
    figures = []
    for m in REFERENCE["similarities"]:
        for row, printed_row in zip(m["rows"], m["values"]):
            for column, printed in zip(m["columns"], printed_row):
                got = similarity(m["metric"], vec[row], vec[column])
                figures.append(Figure(m["source"], f"{m['metric']}({row!r}, {column!r})", printed, got, m["metric"]))
    return figures


def search_figures(vec) -> tuple[list[Figure], list[str]]:
    """Each published top-5 score, and the ranking: the corpus entries kiln ranks first must be the published."""
    figures, rankings = [], []
    for s in REFERENCE["searches"]:
        for query, hits in s["top"].items():
            scores = [similarity(s["metric"], vec[query], vec[doc]) for doc in s["corpus"]]
            ranked = [int(i) for i in np.argsort(scores)[::-1][:len(hits)]]
            if ranked != [i for _, i in hits]:
                rankings.append(f"{s['source']}: {query!r} ranks {ranked}, published {[i for _, i in hits]}")
            figures += [Figure(s["source"], f"{s['metric']}({query!r}, corpus[{i}])", printed, scores[i], s["metric"])
                        for printed, i in hits]
    return figures, rankings


def value_figures(vec) -> list[Figure]:
    return [Figure(v["source"], f"embedding({v['text']!r})[{k}]", printed, float(vec[v["text"]][k]), "value")
            for v in REFERENCE["leading_values"] for k, printed in enumerate(v["values"])]


def compare(embed) -> tuple[list[Figure], list[str]]:
    """Every published figure with kiln's value, and what does not hold besides the figures (shape, ranking).
    All texts go in one request, so the short ones are padded to the longest (as a batch of clients would be)."""
    texts = published_texts()
    got = embed(texts)
    if got.shape != (len(texts), REFERENCE["dimension"]["value"]):
        return [], [f"embeddings of shape {got.shape} for {len(texts)} texts, published dimension "
                    f"{REFERENCE['dimension']['value']} ({REFERENCE['dimension']['source']})"]
    vec = dict(zip(texts, got))
    searched, rankings = search_figures(vec)
    return matrix_figures(vec) + searched + value_figures(vec), rankings


def _texts(texts):
    return np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)


def grpc_embedder(url, model=MODEL):
    def embed(texts):
        client = grpcclient.InferenceServerClient(url)
        x = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
        x.set_data_from_numpy(_texts(texts))
        return client.infer(model, [x], client_timeout=RPC_TIMEOUT).as_numpy("embedding")
    return embed


def rest_embedder(url, model=MODEL):
    def embed(texts):
        client = httpclient.InferenceServerClient(url, network_timeout=RPC_TIMEOUT)
        x = httpclient.InferInput("text", [len(texts), 1], "BYTES")
        x.set_data_from_numpy(_texts(texts), binary_data=False)
        out = httpclient.InferRequestedOutput("embedding", binary_data=False)
        return client.infer(model, [x], outputs=[out]).as_numpy("embedding")
    return embed


def test_the_reference_names_a_source_for_every_figure():
    sources = REFERENCE["sources"]
    entries = REFERENCE["similarities"] + REFERENCE["searches"] + REFERENCE["leading_values"] + [
        REFERENCE["dimension"]]
    assert {e["source"] for e in entries} == set(sources)
    for name, s in sources.items():
        assert s.get("url") or (s.get("repo") and s.get("path") and re.fullmatch(r"[0-9a-f]{40}", s["commit"])), name
        assert s["made_with"], name


@pytest.mark.parametrize("protocol", ["grpc", "rest"])
def test_kiln_matches_the_published_figures(server, protocol):
    embed = (grpc_embedder if protocol == "grpc" else rest_embedder)(
        server.grpc_url if protocol == "grpc" else server.http_url)
    figures, problems = compare(embed)
    assert len(figures) == 9 + 9 + 9 + 15 + 12
    assert not problems, problems
    bad = [str(f) for f in figures if f.error > f.tolerance]
    assert not bad, "\n".join(bad)
    worst = {k: max(f.error for f in figures if f.kind == k) for k in SLACK}
    print(f"\n{protocol}: largest |kiln - published| by kind: {worst}")


# ---------------------------------------------------------------------------------- the reference can fail


def _unnormalised(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph without its last step, the division of the pooled vector by its L2 norm."""
    (last,) = [n for n in model.graph.node if "embedding" in n.output]
    assert last.op_type == "Div", last
    last.output[0] = "embedding_normalised"
    model.graph.node.append(helper.make_node("Identity", [last.input[0]], ["embedding"]))
    return model


def _token_types_swapped(model: onnx.ModelProto) -> onnx.ModelProto:
    """Token type 0 gets type 1's embedding (the table is the one [2, 384] initializer)."""
    (table,) = [t for t in model.graph.initializer if list(t.dims) == [2, 384]]
    table.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(table)[::-1].copy(), table.name))
    return model


def _layer_norm_eps(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every LayerNormalization with epsilon 1e-5 (PyTorch's default) instead of BERT's 1e-12: a slip that moves
    the cosines by less than 1e-4, so only figures checked at their printed precision can see it."""
    norms = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    assert len(norms) == 13, len(norms)  # the embeddings' and two per layer
    for node in norms:
        (eps,) = [a for a in node.attribute if a.name == "epsilon"]
        eps.f = 1e-5
    return model


def _not_lower_case(tokenizer: dict) -> dict:
    assert tokenizer["normalizer"]["lowercase"] is True
    tokenizer["normalizer"]["lowercase"] = False
    return tokenizer


BROKEN = {
    # name: (graph change, tokenizer change, published figures it must still match: sources or metrics)
    "broken_lowercase": (None, _not_lower_case, set()),
    "broken_unnormalised": (_unnormalised, None, {"cosine"}),
    "broken_token_types": (_token_types_swapped, None, set()),
    "broken_layer_norm_eps": (_layer_norm_eps, None, set()),
}


@pytest.fixture(scope="module")
def broken_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("minilm-broken")
    source = BUNDLED_REPO / MODEL
    graph = onnx.load(str(source / "1" / "model.onnx"))
    config = (source / "config.pbtxt").read_text()
    for name, (change_graph, change_tokenizer, _) in BROKEN.items():
        (repo / name / "1").mkdir(parents=True)
        if change_graph:
            changed = change_graph(onnx.ModelProto.FromString(graph.SerializeToString()))
            onnx.save(changed, str(repo / name / "1" / "model.onnx"))
        else:
            shutil.copyfile(source / "1" / "model.onnx", repo / name / "1" / "model.onnx")
        tokenizer = json.loads((source / "tokenizer.json").read_text())
        (repo / name / "tokenizer.json").write_text(json.dumps(change_tokenizer(tokenizer) if change_tokenizer
                                                               else tokenizer))
        (repo / name / "config.pbtxt").write_text(config.replace(f'name: "{MODEL}"', f'name: "{name}"'))
    srv = start_server([repo], name="kiln-minilm-broken")
    yield srv
    stop_server(srv)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_model_misses_published_figures(broken_server, name):
    figures, problems = compare(grpc_embedder(broken_server.grpc_url, name))
    bad = [f for f in figures if f.error > f.tolerance]
    assert bad or problems, f"{name} matched every published figure: the reference cannot tell it apart"
    still = BROKEN[name][2]
    # A broken model may match some figures by chance of rounding, but those its breakage cannot change must hold.
    assert not [str(f) for f in bad if f.kind in still], name
    kinds = {k: sum(f.kind == k for f in bad) for k in SLACK}
    print(f"\n{name}: misses {len(bad)} of {len(figures)} figures {kinds}, {len(problems)} rankings; e.g. "
          f"{bad[0] if bad else problems[0]}")
