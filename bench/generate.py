#!/usr/bin/env python3
"""Streamed generation: continuous batching on vs off, over gRPC decoupled streams.

    cargo build --release
    .venv/bin/python bench/generate.py [--concurrency 16] [--tokens 64] [--rounds 3] [--lone 20]

Serves two copies of the bundled `tiny_decoder` from one kiln (release build): `batched`
(continuous batching, up to 64 sequences per step) and `single` (`continuous_batching: "false"`,
one sequence per step). For each: `--concurrency` gRPC `ModelStreamInfer` streams (Triton's
messages, from tritonclient's generated stubs, on one asyncio loop so the client adds little)
send one request each at the same moment (`max_tokens` = `--tokens`, `ignore_eos`, greedy,
distinct prompts) and read every token; `--rounds` times. Reports aggregate tokens/s (all tokens /
time from the first request to the last final response), time to first token (TTFT) p50/p90 under
that load as the client sees it, the TTFT p50 of a lone request (`--lone` requests one after
another), and kiln's own mean TTFT in both cases (its `kiln_time_to_first_token_seconds`
histogram: from the request reaching the generation loop to its first token).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

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


def request(model: str, prompt: str, tokens: int) -> service_pb2.ModelInferRequest:
    encoded = prompt.encode()
    req = service_pb2.ModelInferRequest(model_name=model)
    tensor = req.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    req.raw_input_contents.append(struct.pack("<I", len(encoded)) + encoded)
    req.parameters["max_tokens"].int64_param = tokens
    req.parameters["ignore_eos"].bool_param = True
    del tensor
    return req


async def one(stub, model: str, prompt: str, tokens: int, start: asyncio.Event) -> tuple[float, float, float, int]:
    """One request on its own stream: (sent, first response, final response, responses)."""
    call = stub.ModelStreamInfer()
    await start.wait()
    sent = time.perf_counter()
    await call.write(request(model, prompt, tokens))
    first, count = None, 0
    async for response in call:
        if response.error_message:
            raise RuntimeError(response.error_message)
        now = time.perf_counter()
        first = first or now
        count += 1
        if response.infer_response.parameters["triton_final_response"].bool_param:
            await call.done_writing()
            return sent, first, now, count
    raise RuntimeError("the stream ended before the final response")


async def load_round(stub, model: str, clients: int, tokens: int) -> tuple[float, list[float], int]:
    start = asyncio.Event()
    tasks = [asyncio.create_task(one(stub, model, PROMPTS[i % len(PROMPTS)], tokens, start)) for i in range(clients)]
    await asyncio.sleep(0.05)  # every stream open and waiting
    start.set()
    results = await asyncio.gather(*tasks)
    begin = min(r[0] for r in results)
    end = max(r[2] for r in results)
    total = sum(r[3] for r in results)
    return total / (end - begin), [r[1] - r[0] for r in results], total


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000.0


def server_ttft(metrics_url: str, model: str) -> tuple[float, float]:
    """kiln's own time-to-first-token histogram of `model`: (sum in seconds, count)."""
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        for field in ("sum", "count"):
            if line.startswith(f'kiln_time_to_first_token_seconds_{field}{{model="{model}"'):
                values[field] = float(line.rsplit(" ", 1)[1])
    return values.get("sum", 0.0), values.get("count", 0.0)


async def measure(url: str, metrics_url: str, args) -> dict:
    """Per model: tokens/s, client TTFT p50/p90 under load, client TTFT p50 alone, and kiln's
    mean TTFT (from its histogram) under load and alone."""
    rows = {}
    async with grpc.aio.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for model in ("batched", "single"):
            await load_round(stub, model, args.concurrency, 8)  # warm-up
            before = server_ttft(metrics_url, model)
            rates, ttfts = [], []
            for _ in range(args.rounds):
                rate, ttft, total = await load_round(stub, model, args.concurrency, args.tokens)
                assert total == args.concurrency * args.tokens, total
                rates.append(rate)
                ttfts += ttft
            loaded = server_ttft(metrics_url, model)
            lone = []
            for i in range(args.lone):
                _, ttft, _ = await load_round(stub, model, 1, args.tokens)
                lone += ttft
            alone = server_ttft(metrics_url, model)
            mean = lambda a, b: (b[0] - a[0]) / max(b[1] - a[1], 1) * 1000.0
            rows[model] = (statistics.median(rates), pct(ttfts, 50), pct(ttfts, 90), pct(lone, 50),
                           mean(before, loaded), mean(loaded, alone))
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
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        rows = asyncio.run(measure(url, f"127.0.0.1:{metrics_port}", args))
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        print(f"client CPU seconds: {cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime:.1f}")
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
