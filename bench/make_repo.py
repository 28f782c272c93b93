#!/usr/bin/env python3
"""Writes kiln's copy of the peers' model repository (same ONNX files) with the settings a
benchmark variant needs: two CPU instances, as the peers run, and optionally a dynamic batcher.

usage: make_repo.py SRC DST [--dynamic-batching] [--max-queue-delay-us N]
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
    p.add_argument("--dynamic-batching", action="store_true")
    p.add_argument("--max-queue-delay-us", type=int, default=500)
    p.add_argument("--instances", type=int, default=2)
    a = p.parse_args()
    for model in MODELS:
        src, dst = os.path.join(a.src, model), os.path.join(a.dst, model)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        path = os.path.join(dst, "config.pbtxt")
        with open(path) as f:
            text = f.read()
        text = re.sub(r"instance_group\s*\[[^\]]*\]\s*", "", text)
        text += f"instance_group [ {{ count: {a.instances} kind: KIND_CPU }} ]\n"
        if a.dynamic_batching:
            text += f"dynamic_batching {{ max_queue_delay_microseconds: {a.max_queue_delay_us} }}\n"
        with open(path, "w") as f:
            f.write(text)
    print(f"kiln repository for {', '.join(MODELS)} -> {a.dst}")


if __name__ == "__main__":
    main()
