"""`--http-max-input-size` as Triton's current release has it: 64 MiB by default, it also caps a
compressed body's decompressed size (400 in Triton's words past it), and it must be greater
than 0. Triton: server src/command_line_parser.cc (the flag, its default and its check),
src/data_compressor.h (DataCompressor::DecompressData), read at e1db8a603.

kiln also holds the body on the wire to the limit while reading it (413, kiln's own: see
docs/compatibility.md), which conformance/test_http_wire.py checks."""

from __future__ import annotations

import gzip
import json
import subprocess
import zlib

import pytest

from conftest import BUNDLED_REPO, http_request, kiln_bin, start_server, stop_server

INFER = "/v2/models/add_sub/infer"


def decompressed_message(limit: int) -> str:
    return (f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. "
            "Use --http-max-input-size to increase the limit.")


def add_sub_body(size: int) -> bytes:
    """An add_sub request of exactly `size` bytes (padded with spaces)."""
    row = list(range(16))
    body = json.dumps({"inputs": [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": row}
                                  for n in ("INPUT0", "INPUT1")]}).encode()
    assert len(body) <= size
    return body + b" " * (size - len(body))


@pytest.fixture(scope="module")
def small():
    srv = start_server([BUNDLED_REPO], name="kiln-max-input-4096", extra_args=["--http-max-input-size=4096"])
    yield srv
    stop_server(srv)


@pytest.mark.parametrize("encoding,compress", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_the_decompressed_size_is_capped_in_tritons_words(small, encoding, compress):
    over = http_request(small.http_url, "POST", INFER, compress(add_sub_body(4097)), {"Content-Encoding": encoding})
    assert (over.status, over.error()) == (400, decompressed_message(4096))
    exact = http_request(small.http_url, "POST", INFER, compress(add_sub_body(4096)), {"Content-Encoding": encoding})
    assert exact.status == 200, exact.body
    small.assert_alive()


def test_the_default_is_64_mib_decompressed_too(server):
    bomb = gzip.compress(b" " * (64 * 1024 * 1024 + 1))
    answer = http_request(server.http_url, "POST", INFER, bomb, {"Content-Encoding": "gzip"})
    assert (answer.status, answer.error()) == (400, decompressed_message(64 * 1024 * 1024))


@pytest.mark.parametrize("value", ["0", "-1"])
def test_the_limit_must_be_greater_than_0(value):
    run = subprocess.run([str(kiln_bin()), f"--model-repository={BUNDLED_REPO}", f"--http-max-input-size={value}"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "--http-max-input-size must be greater than 0." in run.stderr, run.stderr
