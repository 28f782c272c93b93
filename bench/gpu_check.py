#!/usr/bin/env python3
"""GPU check, run by bench/gpu_check.sh on a machine with an NVIDIA GPU (Python standard library only).

1. Writes a model repository with two copies of each bundled model (model_repository/*, skipping
   all_minilm_l6_v2 where setup has not built it, plus the fixtures slow_compute and tiny_embed, the
   latter a random-weight BERT like all_minilm_l6_v2): `<model>_cpu` (KIND_CPU, Triton's default
   count) and `<model>_gpu` (KIND_GPU on GPU 0, one instance), both with dynamic batching when the
   model batches. mlp_classifier_gpu also sets CUDA options (a "cuda" execution accelerator and a
   model parameter) so that ONNX Runtime itself accepts what kiln passes.
2. Starts kiln on it and checks that every copy is READY with no reason, that the GPU copies run on
   the GPU (their inference metrics carry a gpu_uuid label) and that NVML's GPU gauges are there.
3. Compares outputs, GPU against CPU, for the same seeded inputs (batch 1 and 4 where the model
   batches): integers, booleans and BYTES must be equal; floating-point outputs must satisfy
   |gpu - cpu| <= ATOL + RTOL * |cpu| (TF32 matrix products on the GPU round to 10-bit mantissas).
4. Measures throughput (closed loop, REST with binary tensors, one request = one row) at the given
   concurrencies, CPU copy against GPU copy, and writes a markdown table.

--cpu-smoke checks this script where there is no GPU: kiln runs with --gpu-fallback-to-cpu, so the
"GPU" copies run on CPU; the GPU-only checks are reported but not enforced.
"""
import argparse
import http.client
import json
import math
import multiprocessing
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import time

ATOL = 1e-4
RTOL = 2e-3
FLOATS = {"FP16": "e", "FP32": "f", "FP64": "d", "BF16": None}
FORMATS = {"BOOL": "?", "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q", "INT8": "b", "INT16": "h",
           "INT32": "i", "INT64": "q", "FP16": "e", "FP32": "f", "FP64": "d"}
# mlp_classifier_gpu exercises the CUDA options end to end.
CUDA_OPTIONS = """
parameters { key: "gpu_mem_limit" value: { string_value: "4294967296" } }
optimization { execution_accelerators { gpu_execution_accelerator [ {
  name: "cuda"
  parameters { key: "cudnn_conv_algo_search" value: "HEURISTIC" }
  parameters { key: "arena_extend_strategy" value: "kSameAsRequested" }
} ] } }
"""


def strip_block(text, key):
    """Removes `key [ ... ]` or `key { ... }` (bracket-matched, also `key: ...`) from config text."""
    while True:
        m = re.search(r"(^|\n)\s*" + key + r"\s*:?\s*([\[{])", text)
        if not m:
            return text
        open_ch = m.group(2)
        close_ch = "]" if open_ch == "[" else "}"
        depth, i = 0, m.end() - 1
        while i < len(text):
            if text[i] == open_ch:
                depth += 1
            elif text[i] == close_ch:
                depth -= 1
                if depth == 0:
                    break
            i += 1
        text = text[:m.start()] + "\n" + text[i + 1:]


def built(d):
    """Whether model folder d has a version folder holding a file (all_minilm_l6_v2's weights are built by
    `.ci/setup.sh models` and are not committed, so a machine that cannot download has none)."""
    return any(n.isdigit() and os.path.isdir(os.path.join(d, n)) and os.listdir(os.path.join(d, n))
               for n in os.listdir(d))


def make_repo(model_dirs, dst):
    """The `<model>_cpu` / `<model>_gpu` repository of the built models among model_dirs; returns
    ({model: max_batch_size}, [models skipped: nothing built in their folder, or a generation model])."""
    if os.path.exists(dst):
        shutil.rmtree(dst)
    models, skipped = {}, []
    for d in model_dirs:
        name = os.path.basename(d)
        if not built(d):
            skipped.append(name)
            continue
        cfg_path = os.path.join(d, "config.pbtxt")
        text = open(cfg_path).read() if os.path.exists(cfg_path) else ""
        text = "\n".join(l for l in text.splitlines() if not l.startswith("#"))
        text = re.sub(r'(^|\n)\s*name\s*:\s*"[^"]*"', "\n", text, count=1)
        for key in ("instance_group", "dynamic_batching"):
            text = strip_block(text, key)
        m = re.search(r"max_batch_size\s*:\s*(\d+)", text)
        # identity_types has no config: auto-complete makes it batchable (max_batch_size 4).
        max_batch = int(m.group(1)) if m else (4 if not text.strip() else 0)
        if re.search(r"decoupled\s*:\s*true", text):
            # kiln's generation models (continuous batching over a KV cache) run on CPU only and refuse KIND_GPU.
            skipped.append(f"{name} (generation model: CPU only)")
            continue
        models[name] = max_batch
        for device in ("cpu", "gpu"):
            out = os.path.join(dst, f"{name}_{device}")
            shutil.copytree(d, out, ignore=shutil.ignore_patterns("config.pbtxt"))
            extra = f'name: "{name}_{device}"\n'
            extra += ('instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n' if device == "gpu"
                      else 'instance_group [ { kind: KIND_CPU } ]\n')
            if max_batch > 0:
                extra += "dynamic_batching { max_queue_delay_microseconds: 100 }\n"
            if device == "gpu" and name == "mlp_classifier":
                extra += CUDA_OPTIONS
            with open(os.path.join(out, "config.pbtxt"), "w") as f:
                f.write(extra + text)
    return models, skipped


def describe_gpus():
    """The GPUs as nvidia-smi names them, with the driver, or 'no nvidia-smi'."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "no nvidia-smi"
    return "; ".join(f"{name.strip()} (driver {driver.strip()})" for name, driver in
                     (line.split(",", 1) for line in out.splitlines() if "," in line)) or "no GPU listed"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, headers=None, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), data


def element_size(dtype):
    return {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2, "UINT32": 4,
            "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}[dtype]


def gen_input(dtype, shape, rng):
    n = math.prod(shape)
    if dtype == "BYTES":
        out = b""
        for i in range(n):
            s = f"s{i}-{rng.randrange(1000)}\u00e9".encode()
            out += struct.pack("<I", len(s)) + s
        return out
    if dtype == "BOOL":
        return bytes(rng.randrange(2) for _ in range(n))
    if dtype == "BF16":
        return b"".join(struct.pack("<f", rng.gauss(0, 1))[2:] for _ in range(n))
    if dtype in FLOATS:
        return struct.pack(f"<{n}{FORMATS[dtype]}", *(rng.gauss(0, 1) for _ in range(n)))
    size = element_size(dtype)
    return bytes(rng.randrange(256) for _ in range(n * size))


def infer_body(inputs, outputs):
    header = {
        "inputs": [{"name": name, "datatype": dt, "shape": shape, "parameters": {"binary_data_size": len(data)}}
                   for name, dt, shape, data in inputs],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in outputs],
    }
    h = json.dumps(header).encode()
    return h + b"".join(data for *_, data in inputs), {"Inference-Header-Content-Length": str(len(h))}


def parse_response(headers, data):
    length = int({k.lower(): v for k, v in headers.items()}["inference-header-content-length"])
    header = json.loads(data[:length])
    at, outputs = length, {}
    for o in header["outputs"]:
        size = o["parameters"]["binary_data_size"]
        outputs[o["name"]] = (o["datatype"], o["shape"], data[at:at + size])
        at += size
    return outputs


def floats(dtype, data):
    if dtype == "BF16":
        return [struct.unpack("<f", b"\0\0" + data[i:i + 2])[0] for i in range(0, len(data), 2)]
    fmt = FORMATS[dtype]
    return list(struct.unpack(f"<{len(data) // struct.calcsize(fmt)}{fmt}", data))


def compare(dtype, cpu, gpu):
    """(ok, max abs diff, max rel diff) of two outputs' raw bytes."""
    if dtype not in FLOATS:
        return cpu == gpu, 0.0, 0.0
    a, b = floats(dtype, cpu), floats(dtype, gpu)
    if len(a) != len(b):
        return False, math.inf, math.inf
    worst_abs = worst_rel = 0.0
    ok = True
    for x, y in zip(a, b):
        d = abs(x - y)
        worst_abs = max(worst_abs, d)
        worst_rel = max(worst_rel, d / abs(x) if x else 0.0)
        ok = ok and d <= ATOL + RTOL * abs(x)
    return ok, worst_abs, worst_rel


def model_inputs(port, model, batch, rng):
    status, _, data = request(port, "GET", f"/v2/models/{model}")
    assert status == 200, (model, status, data)
    meta = json.loads(data)
    inputs = []
    for t in meta["inputs"]:
        shape = list(t["shape"])
        if shape and shape[0] == -1:
            shape[0] = batch
        shape = [3 if d == -1 else d for d in shape]
        inputs.append((t["name"], t["datatype"], shape, gen_input(t["datatype"], shape, rng)))
    return inputs, [t["name"] for t in meta["outputs"]]


def closed_loop(args):
    port, model, body, headers, seconds, seed = args
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    latencies, errors = [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            conn.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers)
            r = conn.getresponse()
            r.read()
            ok = r.status == 200
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            ok = False
        if ok:
            latencies.append(time.monotonic() - t0)
        else:
            errors += 1
    conn.close()
    return latencies, errors


def throughput(pool, port, model, batch_rows, concurrency, seconds, warmup):
    rng = random.Random(7)
    inputs, outputs = model_inputs(port, model, batch_rows, rng)
    body, headers = infer_body(inputs, outputs)
    pool.map(closed_loop, [(port, model, body, headers, warmup, i) for i in range(concurrency)])
    results = pool.map(closed_loop, [(port, model, body, headers, seconds, i) for i in range(concurrency)])
    latencies = sorted(l for ls, _ in results for l in ls)
    errors = sum(e for _, e in results)
    if not latencies:
        return 0.0, math.nan, math.nan, errors
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3
    return len(latencies) / seconds, pick(0.5), pick(0.99), errors


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kiln", required=True, help="kiln binary built with --features cuda")
    p.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument("--work", required=True, help="scratch folder (repository, kiln log)")
    p.add_argument("--out", required=True, help="markdown results file")
    p.add_argument("--seconds", type=float, default=6.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--bench", default="add_sub,mlp_classifier,slow_compute", help="models to measure")
    p.add_argument("--cpu-smoke", action="store_true", help="no GPU here: check the script itself")
    args = p.parse_args()
    failures, lines = [], []
    gpu_failure = (lambda text: lines.append(f"- (not enforced, --cpu-smoke) {text}")) if args.cpu_smoke \
        else (lambda text: failures.append(text))

    bundled = os.path.join(args.root, "model_repository")
    model_dirs = sorted(os.path.join(bundled, n) for n in os.listdir(bundled) if os.path.isdir(os.path.join(bundled, n)))
    # slow_compute: a heavier graph to measure; tiny_embed: the BERT graph of all_minilm_l6_v2 (random weights,
    # tokenized server-side), committed, so it runs where all_minilm_l6_v2 could not be built.
    model_dirs += [os.path.join(args.root, "tests/fixtures/drain_repository/slow_compute"),
                   os.path.join(args.root, "tests/fixtures/model_repository/tiny_embed")]
    repo = os.path.join(args.work, "repository")
    models, skipped = make_repo(model_dirs, repo)
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log_path = os.path.join(args.work, "kiln.log")
    log = open(log_path, "w")
    server = subprocess.Popen(
        [args.kiln, "--model-repository", repo, "--http-address", "127.0.0.1", "--http-port", str(http_port),
         "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port), "--metrics-address", "127.0.0.1",
         "--metrics-port", str(metrics_port)] + (["--gpu-fallback-to-cpu"] if args.cpu_smoke else []),
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info,ort=warn")))
    lines.append(f"# GPU check, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {describe_gpus()}, "
                 f"{os.cpu_count()} cores\n")
    if args.cpu_smoke:
        lines.append("CPU SMOKE RUN: no GPU; the \"GPU\" copies ran on CPU\n")
    try:
        # Wait until every copy has settled (READY or UNAVAILABLE): readiness alone would wait out the deadline
        # when a copy fails to load.
        expected = {f"{name}_{device}" for name in models for device in ("cpu", "gpu")}
        deadline = time.monotonic() + 300
        index = []
        while True:
            if server.poll() is not None:
                raise SystemExit(f"kiln exited with {server.returncode}; log: {log_path}")
            try:
                status, _, data = request(http_port, "POST", "/v2/repository/index", b"", timeout=5)
                index = json.loads(data) if status == 200 else []
            except OSError:
                pass
            settled = all(e.get("state") in ("READY", "UNAVAILABLE") for e in index)
            if (settled and {e["name"] for e in index} >= expected) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        lines.append("## Repository index\n")
        if skipped:
            lines.append(f"Skipped: {', '.join(skipped)}\n")
        for e in index:
            lines.append(f"- {e['name']} v{e.get('version', '')}: {e.get('state', '')} {e.get('reason', '')}".rstrip())
            if e.get("state") != "READY":
                failures.append(f"{e['name']} is {e.get('state')} ({e.get('reason', '')})")
            elif e.get("reason"):
                gpu_failure(f"{e['name']} does not run where it should: {e['reason']}")
        if failures:
            raise SystemExit("\n".join(failures) + f"\nlog: {log_path}")

        lines.append("\n## GPU outputs against CPU outputs\n")
        lines.append(f"Floating point: |gpu - cpu| <= {ATOL} + {RTOL} * |cpu|; everything else bit-exact.\n")
        lines.append("| model | batch | output | datatype | max abs diff | max rel diff | ok |")
        lines.append("|---|---|---|---|---|---|---|")
        for name, max_batch in sorted(models.items()):
            for batch in ([1, 4] if max_batch >= 4 else [1]):
                rng = random.Random(f"{name}-{batch}")
                inputs, outputs = model_inputs(http_port, f"{name}_cpu", batch, rng)
                body, headers = infer_body(inputs, outputs)
                got = {}
                for device in ("cpu", "gpu"):
                    status, h, data = request(http_port, "POST", f"/v2/models/{name}_{device}/infer", body, headers)
                    if status != 200:
                        failures.append(f"{name}_{device} batch {batch}: HTTP {status} {data[:300]!r}")
                        break
                    got[device] = parse_response(h, data)
                if len(got) < 2:
                    continue
                for out in outputs:
                    dt, shape_c, cpu = got["cpu"][out]
                    _, shape_g, gpu = got["gpu"][out]
                    ok, d_abs, d_rel = compare(dt, cpu, gpu)
                    ok = ok and shape_c == shape_g
                    lines.append(f"| {name} | {batch} | {out} | {dt} | {d_abs:.3g} | {d_rel:.3g} | {'yes' if ok else 'NO'} |")
                    if not ok:
                        failures.append(f"{name} batch {batch} output {out} differs (abs {d_abs}, rel {d_rel})")

        _, _, data = request(metrics_port, "GET", "/metrics")
        metrics = data.decode()
        uuids = sorted(set(re.findall(r'nv_gpu_utilization\{gpu_uuid="([^"]+)"\}', metrics)))
        lines.append("\n## Metrics\n")
        lines.append(f"- nv_gpu_utilization / nv_gpu_memory_*_bytes for: {', '.join(uuids) or 'NONE'}")
        if not uuids:
            gpu_failure("no nv_gpu_utilization gauge (NVML)")
        # Power and energy: reported where the driver has them (datacenter GPUs do); recorded,
        # not required.
        for family in ("nv_gpu_power_usage", "nv_gpu_power_limit", "nv_energy_consumption"):
            values = re.findall(rf'^{family}\{{gpu_uuid="[^"]+"\}} (\S+)$', metrics, re.M)
            lines.append(f"- {family}: {', '.join(values) or 'absent'}")
        for name in sorted(models):
            counted = 0
            for line in metrics.splitlines():
                if (line.startswith("nv_inference_count{") and f'model="{name}_gpu"' in line
                        and 'gpu_uuid="' in line):
                    counted += int(float(line.rsplit(" ", 1)[1]))
            lines.append(f"- {name}_gpu: nv_inference_count under a gpu_uuid label = {counted}")
            if counted == 0:
                gpu_failure(f"{name}_gpu has no inference count under a gpu_uuid label: did it run on the GPU?")

        lines.append("\n## Throughput (closed loop, REST binary tensors, one row per request, dynamic batching)\n")
        lines.append(f"{args.seconds:g} s per point after {args.warmup:g} s of warm-up; CPU copy: 2 instances "
                     f"(Triton's default) on {os.cpu_count()} cores; GPU copy: 1 instance on GPU 0.\n")
        lines.append("| model | concurrency | CPU req/s | CPU p50 / p99 ms | GPU req/s | GPU p50 / p99 ms | GPU / CPU |")
        lines.append("|---|---|---|---|---|---|---|")
        levels = [int(c) for c in args.concurrency.split(",")]
        with multiprocessing.get_context("fork").Pool(max(levels)) as pool:
            for name in args.bench.split(","):
                if name not in models:
                    continue
                for c in levels:
                    cpu = throughput(pool, http_port, f"{name}_cpu", 1, c, args.seconds, args.warmup)
                    gpu = throughput(pool, http_port, f"{name}_gpu", 1, c, args.seconds, args.warmup)
                    ratio = gpu[0] / cpu[0] if cpu[0] else math.nan
                    lines.append(f"| {name} | {c} | {cpu[0]:.0f} | {cpu[1]:.2f} / {cpu[2]:.2f} | {gpu[0]:.0f} | "
                                 f"{gpu[1]:.2f} / {gpu[2]:.2f} | {ratio:.2f}x |")
                    if cpu[3] or gpu[3]:
                        failures.append(f"{name} c={c}: {cpu[3]} CPU and {gpu[3]} GPU requests failed")
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
            if failures:
                f.write("\n## FAILURES\n\n" + "\n".join(f"- {x}" for x in failures) + "\n")
        print("\n".join(lines))
    if failures:
        print("\nFAILURES:\n" + "\n".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
