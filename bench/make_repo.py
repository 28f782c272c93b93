#!/usr/bin/env python3
"""Writes kiln's copy of the peers' model repository (same ONNX files) with the settings a
benchmark variant needs: two CPU instances, as the peers run, and optionally a dynamic batcher.

usage: make_repo.py SRC DST [--dynamic-batching [MODEL,...]] [--max-queue-delay-us N]
                    [--instances N] [--instances-for MODEL=N ...]

`--dynamic-batching` alone batches every model; with a list, only those.

With one instance a model gets every core for its intra-op threads (kiln gives each instance
cores / instances threads): the better setting for a memory-bound model such as matmul_stack,
whose weights are read once per batch, so one instance running larger batches beats two running
small ones.
"""
import argparse
import os
import re
import shutil

MODELS = ("add_sub", "mlp", "matmul_stack")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--dynamic-batching", nargs="?", const=",".join(MODELS), default="",
                   metavar="MODEL,...")
    p.add_argument("--max-queue-delay-us", type=int, default=500)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--instances-for", action="append", default=[], metavar="MODEL=N")
    a = p.parse_args()
    per_model = {k: int(v) for k, v in (item.split("=", 1) for item in a.instances_for)}
    batched = set(filter(None, a.dynamic_batching.split(",")))
    for model in MODELS:
        src, dst = os.path.join(a.src, model), os.path.join(a.dst, model)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        path = os.path.join(dst, "config.pbtxt")
        with open(path) as f:
            text = f.read()
        text = re.sub(r"instance_group\s*\[[^\]]*\]\s*", "", text)
        count = per_model.get(model, a.instances)
        text += f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n"
        if model in batched:
            text += f"dynamic_batching {{ max_queue_delay_microseconds: {a.max_queue_delay_us} }}\n"
        with open(path, "w") as f:
            f.write(text)
    print(f"kiln repository for {', '.join(MODELS)} -> {a.dst}")


if __name__ == "__main__":
    main()
