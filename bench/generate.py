#!/usr/bin/env python3
"""Streamed generation: continuous batching on vs off, with tritonclient gRPC streams.

    cargo build --release
    .venv/bin/python bench/generate.py [--concurrency 16] [--tokens 64] [--rounds 3] [--lone 20]

Serves two copies of the bundled `tiny_decoder` from one kiln (release build): `batched`
(continuous batching, up to 64 sequences per step) and `single` (`continuous_batching: "false"`,
one sequence per step). For each: `--concurrency` clients, each on its own `start_stream`, send
one request at the same moment (`max_tokens` = `--tokens`, `ignore_eos`, greedy, distinct
prompts) and read every token; `--rounds` times. Reports aggregate tokens/s (all tokens / time
from the first request to the last final response), time to first token (TTFT) p50/p90 under
that load, and the TTFT p50 of a lone request (`--lone` requests one after another).
"""
from __future__ import annotations

import argparse
import os
import queue
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["The potter", "A kiln is", "Wood kilns take", "Electric kilns", "The temperature of", "In Japan",
           "When the firing", "The first firing", "Opening a kiln", "Most studio potters", "No two pieces",
           "A controller raises", "Earthenware fires", "The ash", "Potters have used", "The glaze melts"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_repo(path: Path) -> None:
    source = ROOT / "model_repository" / "tiny_decoder"
    config = (source / "config.pbtxt").read_text()
    for name, batching in (("batched", "true"), ("single", "false")):
        target = path / name
        shutil.copytree(source, target)
        text = config.replace('name: "tiny_decoder"', f'name: "{name}"')
        text = text.replace('key: "continuous_batching" value: { string_value: "true" }',
                            f'key: "continuous_batching" value: {{ string_value: "{batching}" }}')
        (target / "config.pbtxt").write_text(text)


class Client:
    """One gRPC stream; `run` sends one request and times its responses."""

    def __init__(self, url: str):
        self.client = grpcclient.InferenceServerClient(url)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((time.perf_counter(), result, error)))

    def run(self, model: str, prompt: str, tokens: int) -> tuple[float, float, float, int]:
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
        sent = time.perf_counter()
        self.client.async_stream_infer(model, [text], parameters={"max_tokens": tokens, "ignore_eos": True})
        first = None
        count = 0
        while True:
            at, result, error = self.responses.get(timeout=120)
            if error is not None:
                raise error
            first = first or at
            count += 1
            if result.get_response().parameters["triton_final_response"].bool_param:
                return sent, first, at, count

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def load_round(clients: list[Client], model: str, tokens: int) -> tuple[float, list[float], int]:
    barrier = threading.Barrier(len(clients))
    results: list = [None] * len(clients)

    def one(index: int) -> None:
        barrier.wait()
        results[index] = clients[index].run(model, PROMPTS[index % len(PROMPTS)], tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start = min(r[0] for r in results)
    end = max(r[2] for r in results)
    total = sum(r[3] for r in results)
    return total / (end - start), [r[1] - r[0] for r in results], total


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kiln", default=str(ROOT / "target" / "release" / "kiln"))
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lone", type=int, default=20)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="kiln-bench-generate-"))
    make_repo(workdir / "repo")
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    env = dict(os.environ, RUST_LOG="warn")
    server = subprocess.Popen([args.kiln, "--model-repository", str(workdir / "repo"), "--grpc-port", str(grpc_port),
                               "--http-port", str(http_port), "--metrics-port", str(metrics_port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=open(workdir / "kiln.log", "w"))
    try:
        deadline = time.time() + 60
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1).status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise SystemExit("kiln did not become ready; see " + str(workdir / "kiln.log"))
            time.sleep(0.2)
        url = f"127.0.0.1:{grpc_port}"
        print(f"load average before: {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores; "
              f"{args.concurrency} streams x {args.tokens} tokens, {args.rounds} rounds")
        rows = {}
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        for model in ("batched", "single"):
            clients = [Client(url) for _ in range(args.concurrency)]
            load_round(clients, model, 8)  # warm-up
            rates, ttfts = [], []
            for _ in range(args.rounds):
                rate, ttft, total = load_round(clients, model, args.tokens)
                assert total == args.concurrency * args.tokens, total
                rates.append(rate)
                ttfts += ttft
            for c in clients:
                c.close()
            lone = Client(url)
            lone.run(model, PROMPTS[0], 8)
            lone_ttft = []
            for i in range(args.lone):
                sent, first, _, _ = lone.run(model, PROMPTS[i % len(PROMPTS)], args.tokens)
                lone_ttft.append(first - sent)
            lone.close()
            rows[model] = (statistics.median(rates), pct(ttfts, 50), pct(ttfts, 90), pct(lone_ttft, 50))
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        print(f"client CPU seconds: {cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime:.1f}")
        print()
        print("| continuous batching | tokens/s (median of rounds) | TTFT p50 ms (load) | TTFT p90 ms (load) "
              "| TTFT p50 ms (lone) | TTFT load/lone |")
        print("|---|---:|---:|---:|---:|---:|")
        for model, label in (("batched", "on"), ("single", "off (1 sequence per step)")):
            rate, p50, p90, lone = rows[model]
            print(f"| {label} | {rate:.0f} | {p50:.2f} | {p90:.2f} | {lone:.2f} | {p50 / lone:.2f} |")
        print()
        print(f"throughput ratio on/off: {rows['batched'][0] / rows['single'][0]:.2f}x")
        return 0
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
