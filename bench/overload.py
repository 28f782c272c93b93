#!/usr/bin/env python3
"""Overload soak (issue 9, item 2): kiln under ~10x the load it can sustain, for a bounded time.

    .venv/bin/python bench/overload.py [--seconds 60] [--binary target/release/kiln]

1. baseline: CONCURRENCY closed-loop gRPC clients on slow_compute (tests/fixtures/drain_repository:
   a 1024 x 1024 matrix product per request on one instance, so the server, not this Python
   client, is the bottleneck) measure what the server sustains (requests/s);
2. overload: 10x as many clients, each sending again as soon as it is answered, against a server
   started with --max-inflight-requests LIMIT: the excess is refused at once with
   RESOURCE_EXHAUSTED; every accepted answer must be exact (Y = X + 1); kiln's resident memory
   (VmRSS) is sampled every second;
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
LIMIT = 16
MODEL = "slow_compute"


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
    t = grpcaio.InferInput("X", [1, 1], "FP32")
    t.set_data_from_numpy(np.array([[float(i)]], dtype=np.float32))
    return [t]


async def phase(url, clients, seconds, sample=None):
    """Closed loop: each client sends again as soon as it is answered. Returns the counts of
    answers, refusals, other errors and wrong answers."""
    stats = {"ok": 0, "refused": 0, "errors": 0, "wrong": 0}
    end = time.monotonic() + seconds

    async def client(n):
        c = grpcaio.InferenceServerClient(url)
        i = n
        while time.monotonic() < end:
            try:
                result = await c.infer(MODEL, inputs(i))
                if result.as_numpy("Y")[0, 0] != i + 1:
                    stats["wrong"] += 1
                stats["ok"] += 1
            except InferenceServerException as e:
                if e.status() == "StatusCode.RESOURCE_EXHAUSTED":
                    stats["refused"] += 1
                else:
                    stats["errors"] += 1
                    if stats["errors"] <= 3:
                        print(f"  unexpected error: {e.status()} {e.message()}")
            i = (i + clients) % 1_000_000
        await c.close()

    async def sampler():
        while time.monotonic() < end:
            sample()
            await asyncio.sleep(1)

    tasks = [client(n) for n in range(clients)] + ([sampler()] if sample else [])
    await asyncio.gather(*tasks)
    return stats


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60, help="length of the overload phase")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "kiln"))
    ap.add_argument("--min-recovery", type=float, default=0.8,
                    help="throughput after the overload, as a share of the baseline, that passes")
    args = ap.parse_args()
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    server = subprocess.Popen(
        [args.binary, "--model-repository", os.path.join(ROOT, "tests", "fixtures", "drain_repository"),
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
        base = asyncio.run(phase(url, CONCURRENCY, 10))
        base_rate = base["ok"] / 10
        print(f"baseline : {CONCURRENCY} clients, {base_rate:.0f} req/s, errors {base['errors']}; "
              f"load average {open('/proc/loadavg').read().split()[0]}")

        samples = []
        over = asyncio.run(phase(url, 10 * CONCURRENCY, args.seconds,
                                 lambda: samples.append(rss_kib(server.pid))))
        rate = over["ok"] / args.seconds
        settled = samples[len(samples) // 4:] or samples
        growth = (max(settled) - settled[0]) / settled[0] * 100 if settled else 0
        print(f"overload : {10 * CONCURRENCY} clients for {args.seconds:.0f} s, {rate:.0f} req/s accepted, "
              f"{over['refused']} refused (RESOURCE_EXHAUSTED), {over['errors']} other errors, "
              f"{over['wrong']} wrong answers; VmRSS {min(samples) // 1024}-{max(samples) // 1024} MiB, "
              f"{growth:+.1f} % after the first quarter")
        after = asyncio.run(phase(url, CONCURRENCY, 10))
        after_rate = after["ok"] / 10
        print(f"recovery : {CONCURRENCY} clients, {after_rate:.0f} req/s ({after_rate / base_rate * 100:.0f} % of baseline), "
              f"{after['refused']} refused; load average {open('/proc/loadavg').read().split()[0]}")
        if over["wrong"] or after["wrong"]:
            failures.append("accepted requests returned wrong answers")
        if over["errors"] or after["errors"] or base["errors"]:
            failures.append("errors other than RESOURCE_EXHAUSTED")
        if over["refused"] == 0:
            failures.append("the overload was never refused: raise the client count")
        if growth > 10:
            failures.append(f"resident memory grew {growth:.1f} % under sustained overload")
        if after["refused"]:
            failures.append("requests were still refused after the overload ended")
        if after_rate < args.min_recovery * base_rate:
            failures.append("throughput did not recover (on a shared machine, check the load average)")
    finally:
        server.terminate()
        server.wait(timeout=60)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
