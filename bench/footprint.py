#!/usr/bin/env python3
"""Footprint: time from process start to ready, and resident memory once the models are loaded,
for kiln and for Triton (../shared/peers) serving the same models.

usage: bench/footprint.py [--rounds 3] [--triton] [--repo DIR]

kiln runs from target/release/kiln on the peers' model repository (add_sub, mlp, matmul_stack:
the models Triton serves there) and on the bundled model_repository/. Time to ready is measured
from spawning the process to the first `200` from /v2/health/ready, polled every 5 ms. Resident
memory is the sum of VmRSS over the server's whole process group (Triton's Python-backend stubs
included), read 1 s after ready. Triton's time includes its start script (a few ms of bash).
Medians over the rounds are printed as a markdown table.
"""
import argparse
import os
import signal
import socket
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS_CODE = Path(os.environ.get("PEERS_CODE", ROOT.parent / "shared" / "peers")).resolve()
PEERS_HOME = Path(os.environ.get("PEERS_HOME", Path.home() / ".cache" / "kiln-peers"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def group_rss_kib(pgid):
    """Sum of VmRSS over every process whose process group is `pgid`."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            # Fields after the command name (which may hold spaces): state ppid pgrp ...
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) != pgid:
                continue
            for line in Path(f"/proc/{entry}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total


def kiln_round(repo):
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = dict(os.environ, ORT_DYLIB_PATH=str(ROOT / ".kiln/onnxruntime/libonnxruntime.so"))
    started = time.perf_counter()
    proc = subprocess.Popen(
        [str(ROOT / "target/release/kiln"), "--model-repository", str(repo),
         "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    try:
        while not ready(http):
            if proc.poll() is not None or time.perf_counter() - started > 120:
                raise RuntimeError(f"kiln did not become ready on {repo}")
            time.sleep(0.005)
        to_ready = time.perf_counter() - started
        time.sleep(1)
        return to_ready, group_rss_kib(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def triton_round():
    ports = {"TRITON_HTTP": free_port(), "TRITON_GRPC": free_port(), "TRITON_METRICS": free_port()}
    env = dict(os.environ, PEERS_HOME=str(PEERS_HOME), **{k: str(v) for k, v in ports.items()})
    name = "triton-footprint"
    started = time.perf_counter()
    subprocess.run([str(PEERS_CODE / "peers/triton/start.sh"), "--instances", "2", "--name", name],
                   cwd=PEERS_CODE, env=env, check=True, stdout=subprocess.DEVNULL)
    try:
        to_ready = time.perf_counter() - started
        time.sleep(1)
        pgid = int((PEERS_HOME / "run" / f"{name}.pid").read_text())
        return to_ready, group_rss_kib(pgid)
    finally:
        subprocess.run([str(PEERS_CODE / "peers/triton/stop.sh"), "--name", name], cwd=PEERS_CODE,
                       env=env, check=False, stdout=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--triton", action="store_true", help="also measure Triton (peers set up)")
    a = ap.parse_args()
    cases = [("kiln", "peers' repository (add_sub, mlp, matmul_stack)",
              lambda: kiln_round(PEERS_HOME / "model_repository")),
             ("kiln", "bundled model_repository/", lambda: kiln_round(ROOT / "model_repository"))]
    if a.triton:
        cases.append(("triton 2.51", "peers' repository (add_sub, mlp, matmul_stack)", triton_round))
    rows = []
    for server, repo, run in cases:
        results = [run() for _ in range(a.rounds)]
        rows.append((server, repo, statistics.median(r[0] for r in results),
                     statistics.median(r[1] for r in results) / 1024))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}; medians of {a.rounds} rounds\n")
    print("| server | models | start to ready (s) | resident memory (MiB) |")
    print("|---|---|---:|---:|")
    for server, repo, to_ready, rss in rows:
        print(f"| {server} | {repo} | {to_ready:.2f} | {rss:.0f} |")


if __name__ == "__main__":
    main()
