"""Large tensors inline vs through system shared memory, with tritonclient (gRPC and REST).

Runs the bundled `identity_types` model (every input echoed to its output) with one large FP32
tensor and tiny tensors for its other inputs, and asks for the FP32 output only. Each round
interleaves the modes; the table gives medians of per-request latency over all rounds.

    .venv/bin/python bench/shared_memory.py --grpc 127.0.0.1:8001 --http 127.0.0.1:8000 \
        [--elements 1048576] [--requests 50] [--rounds 3]

The server must serve client shared memory: start kiln (or Triton's current release) with
`--allow-client-shm=true`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import ml_dtypes
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

SMALL = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP64": np.float64, "BF16": ml_dtypes.bfloat16,
    "BYTES": np.object_,
}


def requests(module, big, shm_names):
    """The inputs and requested output of one request; FP32 inline or in shared memory."""
    # REST sends every tensor as binary data (BF16 has no JSON form).
    binary = {"binary_data": True} if module is httpclient else {}
    inputs = []
    for dtype, np_type in SMALL.items():
        tensor = module.InferInput(f"IN_{dtype}", [1, 1], dtype)
        value = np.array([[b"x"]], dtype=np_type) if dtype == "BYTES" else np.zeros((1, 1), np_type)
        tensor.set_data_from_numpy(value, **binary)
        inputs.append(tensor)
    fp32 = module.InferInput("IN_FP32", list(big.shape), "FP32")
    output = module.InferRequestedOutput("OUT_FP32", **binary)
    if shm_names:
        fp32.set_shared_memory(shm_names[0], big.nbytes)
        output.set_shared_memory(shm_names[1], big.nbytes)
    else:
        fp32.set_data_from_numpy(big, **binary)
    inputs.append(fp32)
    return inputs, [output]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc", required=True)
    parser.add_argument("--http", required=True)
    parser.add_argument("--elements", type=int, default=1 << 20)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    big = np.random.default_rng(0).random((1, args.elements), dtype=np.float32)
    tag = str(os.getpid())
    handles = [
        shm.create_shared_memory_region(f"bench_in_{tag}", f"/bench_in_{tag}", big.nbytes),
        shm.create_shared_memory_region(f"bench_out_{tag}", f"/bench_out_{tag}", big.nbytes),
    ]
    shm.set_shared_memory_region(handles[0], [big])
    clients = {
        "gRPC": (grpcclient, grpcclient.InferenceServerClient(args.grpc)),
        "REST": (httpclient, httpclient.InferenceServerClient(args.http)),
    }
    names = (f"bench_in_{tag}", f"bench_out_{tag}")
    clients["gRPC"][1].unregister_system_shared_memory()
    clients["gRPC"][1].register_system_shared_memory(names[0], f"/bench_in_{tag}", big.nbytes)
    clients["gRPC"][1].register_system_shared_memory(names[1], f"/bench_out_{tag}", big.nbytes)
    latencies: dict[tuple[str, str], list[float]] = {}
    try:
        for _ in range(args.rounds):
            for protocol, (module, client) in clients.items():
                for mode in ("inline", "shared memory"):
                    inputs, outputs = requests(module, big, names if mode != "inline" else None)
                    client.infer("identity_types", inputs, outputs=outputs)  # warm-up
                    for _ in range(args.requests):
                        start = time.perf_counter()
                        result = client.infer("identity_types", inputs, outputs=outputs)
                        if mode == "inline":
                            got = result.as_numpy("OUT_FP32")
                        else:
                            got = shm.get_contents_as_numpy(handles[1], np.float32, big.shape)
                        latencies.setdefault((protocol, mode), []).append(
                            time.perf_counter() - start
                        )
                    assert np.array_equal(got, big)
        print(f"| protocol | tensor | mode | median ms | requests/s |")
        print("|---|---|---|---:|---:|")
        for (protocol, mode), values in latencies.items():
            median = statistics.median(values)
            print(
                f"| {protocol} | {big.nbytes / 2**20:.0f} MiB FP32 in and out | {mode} | "
                f"{median * 1e3:.2f} | {1 / median:.0f} |"
            )
    finally:
        clients["gRPC"][1].unregister_system_shared_memory()
        for handle in handles:
            shm.destroy_shared_memory_region(handle)


if __name__ == "__main__":
    main()
