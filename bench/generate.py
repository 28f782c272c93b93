#!/usr/bin/env python3
"""Streamed generation: continuous batching on vs off, over gRPC decoupled streams.

    cargo build --release && cargo bench --no-run --bench generate_load
    .venv/bin/python bench/generate.py [--concurrency 16] [--tokens 64] [--rounds 3] [--lone 20]

Serves two copies of the bundled `tiny_decoder` from one kiln (release build): `batched`
(continuous batching, up to 64 sequences per step) and `single` (`continuous_batching: "false"`,
one sequence per step). For each, bench/generate_load.rs (Rust, a few microseconds per response,
so the client leaves the server its cores) opens `--concurrency` gRPC `ModelStreamInfer` streams
that send one request each at the same moment (`max_tokens` = `--tokens`, `ignore_eos`, greedy,
distinct prompts) and read every token; `--rounds` times. Reports aggregate tokens/s (all tokens /
time from the first request to the last final response), time to first token (TTFT) p50/p90 under
that load as the client sees it, the TTFT p50 of a lone request (`--lone` requests one after
another), and kiln's own mean TTFT under load and alone (its `kiln_time_to_first_token_seconds`
histogram: from the request reaching the generation loop to its first token).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


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


def load(url: str, model: str, args, rounds: int, lone: int) -> dict:
    """Runs the Rust load generator (bench/generate_load.rs) against `model`."""
    command = ["cargo", "bench", "--quiet", "--manifest-path", str(ROOT / "Cargo.toml"), "--bench", "generate_load",
               "--", "--url", url, "--model", model, "--concurrency", str(args.concurrency),
               "--tokens", str(args.tokens), "--rounds", str(rounds), "--lone", str(lone)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def server_ttft(metrics_url: str, model: str) -> tuple[float, float]:
    """kiln's own time-to-first-token histogram of `model`: (sum in seconds, count)."""
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        for field in ("sum", "count"):
            if line.startswith(f'kiln_time_to_first_token_seconds_{field}{{model="{model}"'):
                values[field] = float(line.rsplit(" ", 1)[1])
    return values.get("sum", 0.0), values.get("count", 0.0)


def measure(url: str, metrics_url: str, args) -> dict:
    """Per model: tokens/s, client TTFT p50/p90 under load and p50 alone, and kiln's mean TTFT
    (from its histogram) under load and alone."""
    rows = {}
    mean = lambda a, b: (b[0] - a[0]) / max(b[1] - a[1], 1) * 1000.0
    for model in ("batched", "single"):
        start = server_ttft(metrics_url, model)
        loaded = load(url, model, args, args.rounds, 0)
        middle = server_ttft(metrics_url, model)
        alone = load(url, model, args, 0, args.lone)
        end = server_ttft(metrics_url, model)
        ttft, lone = loaded["ttft_ms"], alone["lone_ttft_ms"]
        rows[model] = (statistics.median(loaded["rounds"]), float(np.percentile(ttft, 50)),
                       float(np.percentile(ttft, 90)), float(np.percentile(lone, 50)),
                       mean(start, middle), mean(middle, end))
    return rows


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
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows = measure(url, f"127.0.0.1:{metrics_port}", args)
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"load generator (with cargo) CPU seconds: {cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime:.1f}")
        print()
        print("| continuous batching | tokens/s (median of rounds) | TTFT p50 ms (load) | TTFT p90 ms (load) "
              "| TTFT p50 ms (lone) | TTFT p50 load/lone | kiln's mean TTFT ms, load / lone |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for model, label in (("batched", "on"), ("single", "off (1 sequence per step)")):
            rate, p50, p90, lone, server_load, server_lone = rows[model]
            print(f"| {label} | {rate:.0f} | {p50:.2f} | {p90:.2f} | {lone:.2f} | {p50 / lone:.2f} "
                  f"| {server_load:.2f} / {server_lone:.2f} |")
        print()
        print(f"throughput ratio on/off: {rows['batched'][0] / rows['single'][0]:.2f}x")
        return 0
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
