#!/usr/bin/env python3
"""Sentence-embedding throughput of the bundled all_minilm_l6_v2: kiln (tokenization in the server, dynamic
batching) at concurrency 1 and N, against in-process ONNX Runtime + the Python `tokenizers` package.

    .venv/bin/python bench/embed.py [--kiln target/release/kiln] [-c 8] [-d 10]

Needs `.ci/setup.sh models` and a release build (`cargo build --release`). Every request carries one sentence
(gRPC, tritonclient), from a fixed set of 64 sentences of 6 to 40 words (--words N: all of N words); each client thread sends its next
request as soon as the last is answered. Prints a Markdown table: sentences/s, p50/p99 latency, and the mean
batch the model ran (inference_count / execution_count from kiln's statistics). Only ratios measured in one run
on an otherwise idle machine mean anything.
"""
import argparse
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "all_minilm_l6_v2"
MODEL_DIR = os.path.join(ROOT, "model_repository", MODEL)
WORDS = ("kiln serves sentence embeddings over the triton protocol while the dynamic batcher merges "
         "concurrent requests and each instance tokenizes its batch before onnx runtime runs the encoder").split()


def sentences(words=None):
    """64 sentences of 6 to 40 words, or all of `words` words."""
    return [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(words or 6 + (i * 11) % 35)) + "."
            for i in range(64)]


SENTENCES = sentences()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_kiln(binary):
    grpc, http, metrics = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [binary, "--model-repository", os.path.join(ROOT, "model_repository"), "--grpc-port", str(grpc),
         "--http-port", str(http), "--metrics-port", str(metrics)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{MODEL}/ready", timeout=1) as r:
                if r.status == 200:
                    return proc, f"127.0.0.1:{grpc}"
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    sys.exit("kiln did not get ready in 120 s")


def stats(client):
    s = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    return int(s.get("inference_count", 0)), int(s.get("execution_count", 0))


def load(url, concurrency, seconds):
    import tritonclient.grpc as grpcclient

    stop = time.time() + seconds
    latencies, errors = [], []

    def worker(offset):
        client = grpcclient.InferenceServerClient(url)
        i, mine = offset, []
        try:
            while time.time() < stop:
                x = grpcclient.InferInput("text", [1, 1], "BYTES")
                x.set_data_from_numpy(np.array([[SENTENCES[i % len(SENTENCES)].encode()]], dtype=np.object_))
                t0 = time.perf_counter()
                client.infer(MODEL, [x])
                mine.append(time.perf_counter() - t0)
                i += concurrency
        except Exception as e:  # noqa: BLE001 - reported
            errors.append(e)
        latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit(f"errors: {errors[:3]}")
    return len(latencies) / seconds, np.percentile(latencies, 50) * 1e6, np.percentile(latencies, 99) * 1e6


def in_process(batch, seconds):
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(MODEL_DIR, "tokenizer.json"))
    tok.enable_truncation(256)
    tok.enable_padding()
    options = ort.SessionOptions()
    # kiln's session options for a model with one instance: all cores, one inter-op thread, no spinning.
    options.intra_op_num_threads = os.cpu_count()
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(os.path.join(MODEL_DIR, "1", "model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    stop, done, i, latencies = time.time() + seconds, 0, 0, []
    while time.time() < stop:
        texts = [SENTENCES[(i + k) % len(SENTENCES)] for k in range(batch)]
        t0 = time.perf_counter()
        enc = tok.encode_batch(texts)
        feed = {name: np.array([getattr(e, field) for e in enc], dtype=np.int64) for name, field in
                (("input_ids", "ids"), ("attention_mask", "attention_mask"), ("token_type_ids", "type_ids"))}
        session.run(None, feed)
        latencies.append(time.perf_counter() - t0)
        done += batch
        i += batch
    return done / seconds, np.percentile(latencies, 50) * 1e6, np.percentile(latencies, 99) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "target", "release", "kiln"))
    ap.add_argument("-c", "--concurrency", type=int, default=8)
    ap.add_argument("-d", "--duration", type=float, default=10.0, help="seconds per measurement")
    ap.add_argument("--words", type=int, help="every sentence this many words (no padding within a batch)")
    args = ap.parse_args()
    SENTENCES[:] = sentences(args.words)
    import tritonclient.grpc as grpcclient

    print(f"load before the run: {open('/proc/loadavg').read().split()[:3]}", file=sys.stderr)
    rows = []
    proc, url = start_kiln(args.kiln)
    try:
        client = grpcclient.InferenceServerClient(url)
        load(url, args.concurrency, 2.0)  # warm-up
        for c in (1, args.concurrency):
            before = stats(client)
            rate, p50, p99 = load(url, c, args.duration)
            after = stats(client)
            batch = (after[0] - before[0]) / max(after[1] - before[1], 1)
            rows.append((f"kiln, gRPC, concurrency {c}", rate, p50, p99, batch))
    finally:
        proc.terminate()
        proc.wait()
    for batch in (1, args.concurrency):
        rate, p50, p99 = in_process(batch, args.duration)
        rows.append((f"in-process ORT + tokenizers, batch {batch}", rate, p50, p99, batch))
    print("| client | sentences/s | p50 us | p99 us | mean batch run |\n|---|---:|---:|---:|---:|")
    for name, rate, p50, p99, batch in rows:
        print(f"| {name} | {rate:.1f} | {p50:.0f} | {p99:.0f} | {batch:.2f} |")


if __name__ == "__main__":
    main()
