#!/usr/bin/env python3
"""Open-loop benchmark of the dynamic batcher: requests sent on a Poisson schedule at a fixed
rate (perf_analyzer's `--request-rate-range R --request-distribution poisson`), as independent
users send them, not by closed-loop clients that wait for each answer.

For each target in turn (alone on the machine): its closed-loop capacity at `--concurrency`
(the first row), then open-loop runs at `--fractions` of that capacity. Each row: the offered
rate, the throughput achieved, the mean batch the model ran (from the server's own statistics:
inference_count / execution_count over the run) and perf_analyzer's p50/p99 latency.

Targets, all with the same model config (the peers' model, `--instances` CPU instances,
`dynamic_batching { max_queue_delay_microseconds: --delay-us }`):
  kiln           kiln's default, Triton's batcher
  kiln-adaptive  the same with --adaptive-batching (kiln's opt-in shortcuts)
  triton         Triton 2.51 (../shared/peers, Python backend running ONNX Runtime)

usage: bench/open_loop.py [--model mlp] [--fractions 0.5,0.8,0.95] [--duration 8]
                          [--targets kiln,kiln-adaptive,triton] [--binary target/release/kiln]
Needs: ../shared/peers/setup.sh --only triton,perf_analyzer (once), a release build of kiln.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS_CODE = Path(os.environ.get("PEERS_CODE", ROOT.parent / "shared" / "peers")).resolve()
PEERS_HOME = Path(os.environ.get("PEERS_HOME", Path.home() / ".cache" / "kiln-peers"))
PERF_ANALYZER = PEERS_CODE / "bin" / "perf_analyzer"
KILN_PORTS = (8520, 8521, 8522)
TRITON_PORTS = (8530, 8531, 8532)


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)


def wait_ready(http: str, model: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{http}/v2/models/{model}/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{model} not ready at {http} after {seconds} s")


def counts(http: str, model: str) -> tuple[int, int]:
    stats = get_json(f"http://{http}/v2/models/{model}/stats")["model_stats"]
    return (sum(int(s.get("inference_count", 0)) for s in stats),
            sum(int(s.get("execution_count", 0)) for s in stats))


class Target:
    def __init__(self, name: str, args, model: str):
        self.name, self.args, self.model = name, args, model
        self.proc = None
        ports = TRITON_PORTS if name == "triton" else KILN_PORTS
        self.http, self.grpc = f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"
        self.ports = ports

    def start(self) -> None:
        if self.name == "triton":
            env = {**os.environ, "PEERS_HOME": str(PEERS_HOME), "TRITON_HTTP": str(self.ports[0]),
                   "TRITON_GRPC": str(self.ports[1]), "TRITON_METRICS": str(self.ports[2])}
            subprocess.run([str(PEERS_CODE / "peers/triton/start.sh"), "--name", "triton-open-loop",
                            "--dynamic-batching", "--max-queue-delay-us", str(self.args.delay_us),
                            "--instances", str(self.args.instances), "--models", self.model],
                           env=env, check=True, stdout=subprocess.DEVNULL)
            return
        repo = Path(self.args.work) / "kiln-repo"
        argv = [self.args.binary, "--model-repository", str(repo),
                "--http-port", str(self.ports[0]), "--grpc-port", str(self.ports[1]),
                "--metrics-port", str(self.ports[2])]
        if self.name == "kiln-adaptive":
            argv.append("--adaptive-batching")
        env = {**os.environ, "ORT_INTRA_OP_THREADS": "1"}
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True, env=env)
        wait_ready(self.http, self.model)

    def stop(self) -> None:
        if self.name == "triton":
            env = {**os.environ, "PEERS_HOME": str(PEERS_HOME)}
            subprocess.run([str(PEERS_CODE / "peers/triton/stop.sh"), "--name", "triton-open-loop"],
                           env=env, check=False, stdout=subprocess.DEVNULL)
        elif self.proc:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)


def perf_analyzer(target: Target, mode: list[str], duration_ms: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".csv") as out:
        cmd = [str(PERF_ANALYZER), "-m", target.model, "-u", target.grpc, "-i", "grpc",
               "--measurement-interval", str(duration_ms), "--stability-percentage", "100",
               "--max-trials", "6", "-f", out.name, *mode]
        env = {**os.environ, "PEERS_HOME": str(PEERS_HOME)}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            # Under overload a server refuses requests and perf_analyzer stops: say why.
            lines = (done.stdout + done.stderr).splitlines()
            why = next((l.split("error: ", 1)[-1] for l in lines if "had error" in l),
                       lines[-1] if lines else "no output")
            return {"error": why}
        rows = list(csv.DictReader(io.StringIO(Path(out.name).read_text())))
    return rows[-1]


def measure(target: Target, mode: list[str], duration_ms: int) -> dict:
    before = counts(target.http, target.model)
    row = perf_analyzer(target, mode, duration_ms)
    after = counts(target.http, target.model)
    inferences, executions = after[0] - before[0], after[1] - before[1]
    if "error" in row:
        return {"throughput": None, "batch": inferences / executions if executions else 0.0,
                "p50_us": None, "p99_us": None, "error": row["error"]}
    return {
        "throughput": float(row["Inferences/Second"]),
        "batch": inferences / executions if executions else 0.0,
        "p50_us": int(row["p50 latency"]),
        "p99_us": int(row["p99 latency"]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mlp")
    p.add_argument("--targets", default="kiln,kiln-adaptive,triton")
    p.add_argument("--fractions", default="0.5,0.8,0.95")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--duration", type=float, default=8.0, help="seconds per measurement window")
    p.add_argument("--delay-us", type=int, default=500)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--binary", default=str(ROOT / "target" / "release" / "kiln"))
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    duration_ms = int(args.duration * 1000)
    with tempfile.TemporaryDirectory() as work:
        args.work = work
        subprocess.run([sys.executable, str(ROOT / "bench" / "make_repo.py"),
                        str(PEERS_HOME / "model_repository"), str(Path(work) / "kiln-repo"),
                        "--dynamic-batching", args.model, "--max-queue-delay-us", str(args.delay_us),
                        "--instances", str(args.instances)], check=True, stdout=subprocess.DEVNULL)
        rows = []
        for name in args.targets.split(","):
            target = Target(name, args, args.model)
            target.start()
            try:
                closed = measure(target, ["--concurrency-range", str(args.concurrency)], duration_ms)
                if closed.get("error"):
                    raise SystemExit(f"{name}: closed loop failed: {closed['error']}")
                rows.append({"target": name, "load": f"closed c={args.concurrency}",
                             "offered": None, **closed})
                print(json.dumps(rows[-1]), flush=True)
                for fraction in map(float, args.fractions.split(",")):
                    rate = max(1, int(closed["throughput"] * fraction))
                    # Asynchronous sends: a request goes at its scheduled time whether or not
                    # earlier ones were answered (sync threads would wait, closing the loop).
                    mode = ["--request-rate-range", str(rate), "--request-distribution", "poisson",
                            "--async", "--max-threads", "4"]
                    rows.append({"target": name, "load": f"open {fraction:.0%}", "offered": rate,
                                 **measure(target, mode, duration_ms)})
                    print(json.dumps(rows[-1]), flush=True)
            finally:
                target.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"\n{args.model}, dynamic_batching {{ max_queue_delay_microseconds: {args.delay_us} }}, "
          f"{args.instances} instances, gRPC, perf_analyzer\n")
    print("| target | load | offered req/s | achieved infer/s | mean batch | p50 µs | p99 µs |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        offered = "" if r["offered"] is None else str(r["offered"])
        if r.get("error"):
            print(f"| {r['target']} | {r['load']} | {offered} | failed: {r['error']} | "
                  f"{r['batch']:.2f} | | |")
            continue
        print(f"| {r['target']} | {r['load']} | {offered} | {r['throughput']:.0f} | "
              f"{r['batch']:.2f} | {r['p50_us']} | {r['p99_us']} |")


if __name__ == "__main__":
    main()
