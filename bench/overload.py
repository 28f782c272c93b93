#!/usr/bin/env python3
"""Overload soak (issue 9, item 2): kiln under ~10x the load it can sustain, for a bounded time.

    .venv/bin/python bench/overload.py [--seconds 60] [--binary target/release/kiln]

1. baseline: CONCURRENCY closed-loop gRPC clients on mlp_classifier measure what the server
   sustains (requests/s) and record the exact answer for each input;
2. overload: 10x as many clients, each sending again as soon as it is answered, against a server
   started with --max-inflight-requests LIMIT: most are refused at once with RESOURCE_EXHAUSTED;
   every accepted answer must be bit-identical to the baseline's; kiln's resident memory (VmRSS)
   is sampled every second;
3. recovery: back to CONCURRENCY clients: throughput must return to >= 80 % of the baseline at once.

Prints one line per phase and exits non-zero when a check fails. Uses tritonclient's asyncio gRPC
client, so one Python process can hold hundreds of requests in flight.
"""
import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONCURRENCY = 8
LIMIT = 32


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def inputs(i):
    x = np.full((1, 64), (i % 16) / 16.0, dtype=np.float32)
    t = grpcaio.InferInput("INPUT0", [1, 64], "FP32")
    t.set_data_from_numpy(x)
    return [t]


async def phase(url, clients, seconds, expected=None, sample=None):
    """Closed loop: each client sends again as soon as it is answered. Returns (ok, refused,
    other errors, wrong answers, answers by input)."""
    stats = {"ok": 0, "refused": 0, "errors": 0, "wrong": 0}
    answers = {}
    end = time.monotonic() + seconds

    async def client(n):
        c = grpcaio.InferenceServerClient(url)
        i = n
        while time.monotonic() < end:
            try:
                result = await c.infer("mlp_classifier", inputs(i), model_version="1")
                out = result.as_numpy("OUTPUT0").tobytes()
                key = i % 16
                if expected is not None and expected.get(key, out) != out:
                    stats["wrong"] += 1
                answers.setdefault(key, out)
                stats["ok"] += 1
            except InferenceServerException as e:
                if e.status() == "StatusCode.RESOURCE_EXHAUSTED":
                    stats["refused"] += 1
                else:
                    stats["errors"] += 1
                    if stats["errors"] <= 3:
                        print(f"  unexpected error: {e.status()} {e.message()}")
            i += clients
        await c.close()

    async def sampler():
        while time.monotonic() < end:
            sample()
            await asyncio.sleep(1)

    tasks = [client(n) for n in range(clients)] + ([sampler()] if sample else [])
    await asyncio.gather(*tasks)
    return stats, answers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60, help="length of the overload phase")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "kiln"))
    args = ap.parse_args()
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    server = subprocess.Popen(
        [args.binary, "--model-repository", os.path.join(ROOT, "model_repository"),
         "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--metrics-port", str(metrics_port),
         "--max-inflight-requests", str(LIMIT)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"127.0.0.1:{grpc_port}"
    failures = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", grpc_port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit("kiln did not start")
                time.sleep(0.2)
        time.sleep(1)
        asyncio.run(phase(url, CONCURRENCY, 2))  # warm-up
        base, answers = asyncio.run(phase(url, CONCURRENCY, 10))
        base_rate = base["ok"] / 10
        print(f"baseline : {CONCURRENCY} clients, {base_rate:.0f} req/s, errors {base['errors']}")

        samples = []
        over, _ = asyncio.run(phase(url, 10 * CONCURRENCY, args.seconds, answers,
                                    lambda: samples.append(rss_kib(server.pid))))
        rate = over["ok"] / args.seconds
        settled = samples[len(samples) // 4:] or samples
        growth = (max(settled) - settled[0]) / settled[0] * 100 if settled else 0
        print(f"overload : {10 * CONCURRENCY} clients for {args.seconds:.0f} s, {rate:.0f} req/s accepted, "
              f"{over['refused']} refused (RESOURCE_EXHAUSTED), {over['errors']} other errors, "
              f"{over['wrong']} wrong answers; VmRSS {min(samples) // 1024}-{max(samples) // 1024} MiB, "
              f"{growth:+.1f} % after the first quarter")
        after, _ = asyncio.run(phase(url, CONCURRENCY, 10, answers))
        after_rate = after["ok"] / 10
        print(f"recovery : {CONCURRENCY} clients, {after_rate:.0f} req/s ({after_rate / base_rate * 100:.0f} % of baseline)")
        if over["wrong"] or after["wrong"]:
            failures.append("accepted requests returned wrong answers")
        if over["errors"] or after["errors"] or base["errors"]:
            failures.append("errors other than RESOURCE_EXHAUSTED")
        if over["refused"] == 0:
            failures.append("the overload was never refused: raise the client count")
        if growth > 10:
            failures.append(f"resident memory grew {growth:.1f} % under sustained overload")
        if after_rate < 0.8 * base_rate:
            failures.append("throughput did not recover")
    finally:
        server.terminate()
        server.wait(timeout=60)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
