"""The reference the generation tests compare kiln with: greedy decoding of the bundled
`tiny_decoder` by full recomputation with onnxruntime (no KV cache, so kiln's cache handling is
checked too), each token with its log-probability (the log-softmax of the raw logits)."""

from __future__ import annotations

import math

import numpy as np

from conftest import BUNDLED_REPO

MODEL_DIR = BUNDLED_REPO / "tiny_decoder"
EOS = 0  # <|endoftext|>, the tokenizer's one special token


class Reference:
    def __init__(self):
        import onnxruntime
        from tokenizers import Tokenizer

        self.session = onnxruntime.InferenceSession(str(MODEL_DIR / "1" / "model.onnx"),
                                                    providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
        inputs = self.session.get_inputs()
        self.layers = sum(1 for i in inputs if i.name.endswith(".key"))
        self.heads, self.head_dim = inputs[3].shape[1], inputs[3].shape[3]

    def greedy(self, prompt: str, max_tokens: int) -> list[tuple[int, float]]:
        """Up to `max_tokens` tokens after `prompt` (the end-of-sequence token included, last),
        each as (id, log-probability)."""
        ids = self.tokenizer.encode(prompt).ids
        out = []
        for _ in range(max_tokens):
            n = len(ids)
            feeds = {
                "input_ids": np.array([ids], dtype=np.int64),
                "attention_mask": np.ones((1, n), dtype=np.int64),
                "position_ids": np.arange(n, dtype=np.int64)[None],
            }
            for layer in range(self.layers):
                for kind in ("key", "value"):
                    feeds[f"past_key_values.{layer}.{kind}"] = np.zeros((1, self.heads, 0, self.head_dim),
                                                                        dtype=np.float32)
            logits = self.session.run(["logits"], feeds)[0][0, -1].astype(np.float64)
            token = int(np.argmax(logits))
            top = logits.max()
            out.append((token, float(logits[token] - top - math.log(np.exp(logits - top).sum()))))
            if token == EOS:
                break
            ids.append(token)
        return out

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)
