#!/usr/bin/env python3
"""Soak (issue 9, item 7): kiln at a steady mixed load for a bounded time, checking that nothing
fails unexpectedly and that memory, file descriptors and threads stay flat.

    .venv/bin/python bench/soak.py [--seconds 300] [--warmup 60] [--rate 150] [--binary target/release/kiln]

Starts kiln on the bundled model_repository in explicit model control mode (every model loaded at
start-up), then, until --seconds have passed:
  - workers send --rate requests/s in all: gRPC (tritonclient.grpc.aio) and REST
    (tritonclient.http.aio; binary and JSON tensors) inference on add_sub, string_echo,
    mlp_classifier (versions 1 and 2, checked against in-process ONNX Runtime) and identity_types
    (all 14 datatypes), and all_minilm_l6_v2 (sentences in, embeddings out, compared with the
    same graph run in this process on the same tokens); every answer is checked;
  - tiny_decoder (a decoupled generation model, greedy): REST /generate and /generate_stream
    from the workers, decoupled gRPC responses on the streams; every text must equal the text the
    same prompt got alone before the load started;
  - a streaming client takes its share of the same schedule over ModelStreamInfer, opening a new
    stream every 16 requests;
  - about 5 % of requests are deliberately bad (wrong datatype, wrong shape, garbage body, unknown
    model); each must fail with its expected status and message;
  - every --reload-every seconds: a hot reload of mlp_classifier under traffic (no request may
    fail), or an unload of identity_types (traffic to it paused; a request to it must be refused
    with "unknown model") and a load back;
  - once a second: kiln's VmRSS, open file descriptors and threads (from /proc/<pid>).
With --features, kiln serves a second repository with more of what it does, and traffic goes to
those models too:
  - py_triple, a Python model that calls add_sub (BLS) as a child of its request's trace;
  - py_ticks, a decoupled Python model (on the gRPC streams: N responses, then the final flag);
  - ensemble_add_sub (tests/fixtures: two add_sub steps);
  - accumulate (tests/fixtures: sequence batching with implicit state): whole sequences of 2 to 5
    requests, each answer the running sum;
  - add_sub_cached, add_sub with the response cache (--cache-config), a few inputs over and over;
  - every request traced at rate 10 with timestamps and tensors into rotated trace files;
  - the reload cycle also reloads py_triple under traffic (its stubs replaced);
  - the Python stubs' resident memory (kiln's child processes) is sampled and checked as kiln's.
Prints a summary and exits non-zero when any request failed unexpectedly or answered wrongly, when
resident memory grew 5 % or more from the end of the warm-up to the end, or when file descriptors
or threads grew. The load is modest on purpose: stability is measured, not throughput.
"""
import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import shutil
import tempfile
import textwrap
import time
from collections import defaultdict

import aiohttp
import ml_dtypes
import numpy as np
import onnxruntime as ort
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio
from tokenizers import Tokenizer
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPOSITORY = os.path.join(ROOT, "model_repository")
MINILM = "all_minilm_l6_v2"
DECODER = "tiny_decoder"
MODELS = ["add_sub", "string_echo", "mlp_classifier", "identity_types", MINILM, DECODER]
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "model_repository")
TICKS = "py_ticks"
# --features: the models added to a copy of the repository, and the traffic sent to them.
FEATURE_MODELS = ["py_triple", TICKS, "ensemble_add_sub", "accumulate", "add_sub_cached"]
# Decoupled models: the output each response carries a piece of, and the pieces' dtype.
DECOUPLED = {DECODER: ("text_output", np.object_), TICKS: ("I", np.int32)}
PY_TRIPLE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            answer = pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=["OUTPUT0"], trace=request.trace(),
                inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)]).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            doubled = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", doubled + x)]))
        return responses
"""
PY_TRIPLE_CONFIG = """
name: "py_triple"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { }
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
PY_TICKS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            for i in range(n):
                # The last response says it is the last (the aio client cannot ask for an
                # empty final one).
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("I", np.array([i], dtype=np.int32))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == n - 1 else 0)
        return None
"""
PY_TICKS_CONFIG = """
name: "py_ticks"
backend: "python"
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""
PROMPTS = ["The potter", "kiln", "A quick brown fox", "h\u00e9llo w\u00f6rld"]
MAX_TOKENS = 8
IDENTITY_TYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                  "FP16", "FP32", "FP64", "BYTES", "BF16"]
BAD_SHARE = 0.05
STREAM_LENGTH = 16
# Sockets kiln holds besides its clients' connections: its listeners (gRPC, REST, metrics).
LISTENERS = 3
# Samples taken less than this long after a reload began are not used for fd and thread counts:
# a reload runs old and new sessions side by side until the old ones retire.
SETTLE_SECONDS = 3
# Threads are counted again this long after the load stops: tokio's blocking pool (generation,
# tokenizing, loads) keeps a thread that has been idle for up to 10 s, so under load the count
# follows how much blocking work ran at once lately.
IDLE_SECONDS = 12


class Mismatch(Exception):
    """A request answered, but wrongly."""


class Stats:
    def __init__(self):
        self.counts = defaultdict(lambda: defaultdict(int))
        self.messages = []

    def add(self, kind, outcome, detail=None):
        self.counts[kind][outcome] += 1
        if detail and outcome in ("unexpected", "wrong") and len(self.messages) < 20:
            self.messages.append(f"{kind}: {outcome}: {detail}")

    def total(self, outcome):
        return sum(c[outcome] for c in self.counts.values())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_sample(pid):
    """(VmRSS KiB, open fds other than sockets, sockets, threads) of a process. Sockets are counted
    apart: they follow the clients' connections, which come and go (idle keep-alive connections
    are closed by the clients)."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    sockets = other = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:"):
            sockets += 1
        else:
            other += 1
    return rss, other, sockets, threads


def children_rss(pid):
    """The resident memory (KiB) of a process's children together: kiln's Python stubs."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != pid:
                    continue
            with open(f"/proc/{entry}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            continue  # gone meanwhile
    return total


def feature_repository(directory):
    """A second repository, beside the bundled one, with the --features models; returns its path."""
    repo = os.path.join(directory, "repository")
    os.makedirs(repo)
    for model in ("ensemble_add_sub", "accumulate"):
        shutil.copytree(os.path.join(FIXTURES, model), os.path.join(repo, model))
    cached = os.path.join(repo, "add_sub_cached")
    os.makedirs(os.path.join(cached, "1"))
    shutil.copy(os.path.join(REPOSITORY, "add_sub", "1", "model.onnx"), os.path.join(cached, "1", "model.onnx"))
    with open(os.path.join(REPOSITORY, "add_sub", "config.pbtxt")) as f:
        config = f.read().replace('name: "add_sub"', 'name: "add_sub_cached"')
    with open(os.path.join(cached, "config.pbtxt"), "w") as f:
        f.write(config + "response_cache { enable: true }\n")
    for name, config, code in (("py_triple", PY_TRIPLE_CONFIG, PY_TRIPLE), (TICKS, PY_TICKS_CONFIG, PY_TICKS)):
        os.makedirs(os.path.join(repo, name, "1"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(textwrap.dedent(config))
        with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
            f.write(textwrap.dedent(code))
    return repo


# ----------------------------------------------------------------------------------------- requests

def identity_arrays(rng, width):
    arrays = {}
    for t in IDENTITY_TYPES:
        shape = (1, width)
        if t == "BYTES":
            pool = [b"", b"a", "h\u00e9llo".encode(), b"x" * 40]
            a = np.array([pool[i] for i in rng.integers(0, len(pool), width)], dtype=np.object_).reshape(shape)
        elif t == "BOOL":
            a = rng.integers(0, 2, shape).astype(np.bool_)
        elif t == "BF16":
            a = rng.standard_normal(shape).astype(np.float32).astype(ml_dtypes.bfloat16)
        else:
            dt = np.dtype({"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(t, t.lower()))
            if dt.kind in "iu":
                info = np.iinfo(dt)
                a = rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
            else:
                a = rng.standard_normal(shape).astype(dt)
        arrays[f"IN_{t}"] = a
    return arrays


SENTENCES = [
    "kiln serves ONNX models over the Triton protocol.",
    "A quick brown fox jumps over the lazy dog.",
    "Sentence embeddings map text to vectors of 384 numbers.",
    "h\u00e9llo w\u00f6rld, \u4f60\u597d \U0001f600",
    "",
    "short",
]


class Cases:
    """Requests with their expected answers. mlp_classifier's and all_minilm_l6_v2's answers come
    from ONNX Runtime run in this process on the same files (the sentences one at a time, tokenized
    by the Python tokenizers package from the same tokenizer.json, truncated at 256 tokens)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.mlp = {}
        for version in ("1", "2"):
            session = ort.InferenceSession(os.path.join(REPOSITORY, "mlp_classifier", version, "model.onnx"))
            x = self.rng.standard_normal((32, 64)).astype(np.float32)
            name = session.get_inputs()[0].name
            self.mlp[version] = (x, session.run(None, {name: x})[0])
        minilm = os.path.join(REPOSITORY, MINILM)
        session = ort.InferenceSession(os.path.join(minilm, "1", "model.onnx"))
        tokenizer = Tokenizer.from_file(os.path.join(minilm, "tokenizer.json"))
        tokenizer.enable_truncation(256)
        self.embeddings = []
        for sentence in SENTENCES:
            e = tokenizer.encode(sentence)
            feed = {name: np.array([values], dtype=np.int64) for name, values in
                    [("input_ids", e.ids), ("attention_mask", e.attention_mask), ("token_type_ids", e.type_ids)]}
            self.embeddings.append(session.run(None, feed)[0][0])
        # (prompt, max_tokens) -> the text generated alone, set by Soak.decoder_references.
        self.generated = {}
        # add_sub_cached's inputs: few, so that most requests are cache hits.
        self.cached = [tuple(self.rng.standard_normal((1, 16)).astype(np.float32) for _ in range(2))
                       for _ in range(8)]

    def build(self, model):
        """(model, version, {input: array}, check(outputs: {name: array}))"""
        rng = self.rng
        if model == "add_sub":
            batch = int(rng.integers(1, 5))
            a = rng.standard_normal((batch, 16)).astype(np.float32)
            b = rng.standard_normal((batch, 16)).astype(np.float32)

            def check(out):
                exact(out["OUTPUT0"], a + b)
                exact(out["OUTPUT1"], a - b)
            return model, "", {"INPUT0": a, "INPUT1": b}, check
        if model == "string_echo":
            width = int(rng.integers(1, 8))
            s = np.array([[f"soak-{rng.integers(1 << 30)}-\u00e9".encode() for _ in range(width)]], dtype=np.object_)

            def check(out):
                got = [v if isinstance(v, bytes) else v.encode() for v in out["output-1"].flatten()]
                if got != list(s.flatten()):
                    raise Mismatch(f"echo {got!r} != {list(s.flatten())!r}")
            return model, "", {"input-1": s}, check
        if model == "mlp_classifier":
            version = str(rng.integers(1, 3))
            x, y = self.mlp[version]
            rows = rng.integers(0, len(x), int(rng.integers(1, 5)))

            def check(out):
                if not np.allclose(out["OUTPUT0"], y[rows], rtol=1e-5, atol=1e-6):
                    raise Mismatch(f"mlp version {version} differs from ONNX Runtime")
            return model, version, {"INPUT0": x[rows]}, check
        if model == "py_triple":
            x = rng.standard_normal((int(rng.integers(1, 5)), 16)).astype(np.float32)

            def check(out):
                exact(out["Y"], (x + x) + x)
            return model, "", {"X": x}, check
        if model == TICKS:
            n = int(rng.integers(1, 6))

            def check(out):
                if list(out["I"].flatten()) != list(range(n)):
                    raise Mismatch(f"{n} ticks came as {list(out['I'].flatten())}")
            return model, "", {"N": np.array([n], dtype=np.int32)}, check
        if model == "ensemble_add_sub":
            a = rng.standard_normal((int(rng.integers(1, 5)), 16)).astype(np.float32)
            b = rng.standard_normal(a.shape).astype(np.float32)

            def check(out):
                exact(out["TWICE_A"], (a + b) + (a - b))
                exact(out["TWICE_B"], (a + b) - (a - b))
            return model, "", {"A": a, "B": b}, check
        if model == "add_sub_cached":
            a, b = self.cached[int(rng.integers(len(self.cached)))]

            def check(out):
                exact(out["OUTPUT0"], a + b)
                exact(out["OUTPUT1"], a - b)
            return model, "", {"INPUT0": a, "INPUT1": b}, check
        if model == DECODER:
            prompt = PROMPTS[int(rng.integers(len(PROMPTS)))]
            tokens = int(rng.integers(1, MAX_TOKENS + 1))
            want = self.generated[(prompt, tokens)]

            def check(out):
                got = b"".join(v if isinstance(v, bytes) else v.encode() for v in out["text_output"].flatten())
                if got.decode() != want:
                    raise Mismatch(f"{prompt!r} + {tokens} tokens gave {got.decode()!r}, alone {want!r}")
            return model, "", {"text_input": np.array([prompt.encode()], dtype=np.object_),
                               "max_tokens": np.array([tokens], dtype=np.int32)}, check
        if model == MINILM:
            # Short texts, one or two per request: the point is steady load, and a 256-token text
            # costs as much as a hundred short ones (truncation is conformance's to check).
            rows = rng.integers(0, len(SENTENCES), int(rng.integers(1, 3)))
            texts = np.array([[SENTENCES[i].encode()] for i in rows], dtype=np.object_)
            want = np.stack([self.embeddings[i] for i in rows])

            def check(out):
                # Padding to the longest text of a batch moves the last digits only.
                if not np.allclose(out["embedding"], want, atol=1e-5):
                    raise Mismatch("embeddings differ from ONNX Runtime")
            return model, "", {"text": texts}, check
        arrays = identity_arrays(rng, int(rng.integers(1, 6)))

        def check(out):
            for name, a in arrays.items():
                got = out[f"OUT_{name[3:]}"]
                if a.dtype == np.object_:
                    same = [v if isinstance(v, bytes) else v.encode() for v in got.flatten()] == list(a.flatten())
                else:
                    same = got.dtype == a.dtype and got.tobytes() == a.tobytes()
                if not same or got.shape != a.shape:
                    raise Mismatch(f"identity {name} came back changed")
        return model, "", arrays, check


def exact(got, expected):
    if got is None or got.shape != expected.shape or not np.array_equal(got, expected):
        raise Mismatch(f"expected {expected.flatten()[:4]}..., got {None if got is None else got.flatten()[:4]}...")


def grpc_inputs(arrays):
    inputs = []
    for name, a in arrays.items():
        i = grpcaio.InferInput(name, list(a.shape), np_to_triton_dtype(a.dtype))
        i.set_data_from_numpy(a)
        inputs.append(i)
    return inputs


def http_inputs(arrays, binary):
    inputs = []
    for name, a in arrays.items():
        i = httpaio.InferInput(name, list(a.shape), np_to_triton_dtype(a.dtype))
        i.set_data_from_numpy(a, binary_data=binary or not json_can_carry(a.dtype))
        inputs.append(i)
    return inputs


def json_can_carry(dtype):
    """FP16 and BF16 travel binary only (as with Triton)."""
    return dtype not in (np.float16, ml_dtypes.bfloat16)


def outputs_of(result, names):
    return {n: result.as_numpy(n) for n in names}


OUTPUTS = {
    "add_sub": ["OUTPUT0", "OUTPUT1"],
    "string_echo": ["output-1"],
    "mlp_classifier": ["OUTPUT0"],
    "identity_types": [f"OUT_{t}" for t in IDENTITY_TYPES],
    MINILM: ["embedding"],
    DECODER: ["text_output"],
    "py_triple": ["Y"],
    TICKS: ["I"],
    "ensemble_add_sub": ["TWICE_A", "TWICE_B"],
    "accumulate": ["OUTPUT", "START_SEEN", "CORRID_SEEN"],
    "add_sub_cached": ["OUTPUT0", "OUTPUT1"],
}
BINARY_ONLY = {"OUT_FP16", "OUT_BF16"}


# ------------------------------------------------------------------------------------------- soak

class Soak:
    def __init__(self, args, grpc_url, http_url, pid):
        self.args = args
        self.grpc_url, self.http_url, self.pid = grpc_url, http_url, pid
        self.stats = Stats()
        self.cases = Cases(args.seed)
        self.rng = random.Random(args.seed)
        self.start = time.monotonic()
        self.end = self.start + args.seconds
        self.sent = 0
        self.paused = set()  # models unloaded on purpose: no traffic
        self.in_flight = defaultdict(int)
        self.last_reload = -1e9
        self.samples = []  # (seconds since start, rss KiB, fds, sockets, threads, stubs' rss KiB, settled)
        self.sequences = 0
        self.idle_threads = None  # threads once the load has stopped (IDLE_SECONDS)

    async def pace(self):
        """Waits for the next slot of the global schedule (--rate requests/s)."""
        slot = self.start + self.sent / self.args.rate
        self.sent += 1
        delay = slot - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        return time.monotonic() < self.end

    def pick_model(self, streamed=False):
        """A model to send the next request to: decoupled ones (but the decoder, which has REST
        generate) only on the streams, sequences only from the workers."""
        skip = self.paused | ({"accumulate"} if streamed else {TICKS})
        return self.rng.choice([m for m in self.args.models if m not in skip] or ["add_sub"])

    @contextlib.contextmanager
    def tallied(self, kind, model):
        """Counts what the good requests in its block come to (ok, a wrong answer, or any failure:
        unexpected) under `kind`, and holds them in flight to `model` meanwhile."""
        self.in_flight[model] += 1
        try:
            yield
            self.stats.add(kind, "ok")
        except Mismatch as e:
            self.stats.add(kind, "wrong", str(e))
        except Exception as e:
            self.stats.add(kind, "unexpected", f"{type(e).__name__}: {e}")
        finally:
            self.in_flight[model] -= 1

    async def checked(self, kind, model, call, check):
        """Runs one inference whose answer must be right."""
        with self.tallied(kind, model):
            check(outputs_of(await call(), OUTPUTS[model]))

    async def expect_error(self, kind, call, status, text):
        """Runs one bad request: it must fail with `status` and a message containing `text`."""
        try:
            await call()
            self.stats.add(kind, "unexpected", "a bad request succeeded")
        except InferenceServerException as e:
            if str(e.status()) == status and text in e.message():
                self.stats.add(kind, "expected")
            else:
                self.stats.add(kind, "unexpected", f"{e.status()} {e.message()}")
        except Exception as e:
            self.stats.add(kind, "unexpected", f"{type(e).__name__}: {e}")

    async def bad_request(self, grpc, http, session):
        a = np.zeros((1, 16), np.int32)
        case = self.rng.choice(["wrong_dtype", "wrong_shape", "garbage_body", "unknown_model"])
        if case == "wrong_dtype":
            await self.expect_error(
                "bad:wrong_dtype (gRPC)",
                lambda: grpc.infer("add_sub", grpc_inputs({"INPUT0": a, "INPUT1": a})),
                "StatusCode.INVALID_ARGUMENT", "data-type is 'INT32', but model 'add_sub' expects 'FP32'")
        elif case == "wrong_shape":
            f = np.zeros((1, 15), np.float32)
            await self.expect_error(
                "bad:wrong_shape (REST)",
                lambda: http.infer("add_sub", http_inputs({"INPUT0": f, "INPUT1": f}, True)),
                # Both inputs are wrong; which one is named follows Triton's order (conformance's).
                "400", "unexpected shape for input 'INPUT")
        elif case == "garbage_body":
            url = f"http://{self.http_url}/v2/models/add_sub/infer"
            try:
                async with session.post(url, data=b"\x00\xff{garbage[") as response:
                    body = await response.json(content_type=None)
                    if response.status == 400 and body.get("error"):
                        self.stats.add("bad:garbage_body (REST)", "expected")
                    else:
                        self.stats.add("bad:garbage_body (REST)", "unexpected", f"{response.status} {body}")
            except Exception as e:
                self.stats.add("bad:garbage_body (REST)", "unexpected", f"{type(e).__name__}: {e}")
        else:
            f = np.zeros((1, 16), np.float32)
            await self.expect_error(
                "bad:unknown_model (gRPC)",
                lambda: grpc.infer("no_such_model", grpc_inputs({"INPUT0": f})),
                "StatusCode.NOT_FOUND", "Request for unknown model: 'no_such_model' is not found")

    async def worker(self, n):
        grpc = grpcaio.InferenceServerClient(self.grpc_url)
        http = httpaio.InferenceServerClient(self.http_url, conn_limit=4)
        async with aiohttp.ClientSession() as session:
            # Open every connection before the warm-up ends, so that the fd count compares like
            # with like.
            await grpc.is_server_live()
            await http.is_server_live()
            async with session.get(f"http://{self.http_url}/v2/health/live") as response:
                await response.read()
            while await self.pace():
                if self.rng.random() < BAD_SHARE:
                    await self.bad_request(grpc, http, session)
                    continue
                model = self.pick_model()
                if model == "accumulate":
                    await self.sequence(grpc, http)
                    continue
                model, version, arrays, check = self.cases.build(model)
                if model == DECODER:
                    await self.generate(session, arrays, check)
                elif self.rng.random() < 0.5:
                    await self.checked(f"gRPC infer {model}", model,
                                       lambda: grpc.infer(model, grpc_inputs(arrays), model_version=version), check)
                else:
                    binary = self.rng.random() < 0.5
                    outputs = [httpaio.InferRequestedOutput(o, binary_data=binary or o in BINARY_ONLY)
                               for o in OUTPUTS[model]]
                    await self.checked(f"REST infer {model}", model,
                                       lambda: http.infer(model, http_inputs(arrays, binary),
                                                          model_version=version, outputs=outputs), check)
        await grpc.close()
        await http.close()

    async def sequence(self, grpc, http):
        """A whole sequence of accumulate, 2 to 5 requests, one protocol: each answer must be the
        running sum, START seen on the first only, the sequence's ID echoed."""
        self.sequences += 1
        sequence_id = self.sequences
        steps = self.rng.randint(2, 5)
        over_grpc = self.rng.random() < 0.5
        kind = f"{'gRPC' if over_grpc else 'REST'} sequence accumulate"
        total = 0.0
        with self.tallied(kind, "accumulate"):
            for step in range(steps):
                if step:
                    await self.pace()  # each request takes its slot; a sequence always ends
                value = float(self.rng.randint(-100, 100))
                total += value
                x = {"INPUT": np.array([[value]], dtype=np.float32)}
                flags = dict(sequence_id=sequence_id, sequence_start=step == 0, sequence_end=step == steps - 1)
                if over_grpc:
                    result = await grpc.infer("accumulate", grpc_inputs(x), **flags)
                else:
                    result = await http.infer("accumulate", http_inputs(x, True), **flags)
                out = outputs_of(result, OUTPUTS["accumulate"])
                seen = (out["OUTPUT"].item(), out["START_SEEN"].item(), out["CORRID_SEEN"].item())
                if seen != (total, int(step == 0), sequence_id):
                    raise Mismatch(f"sequence {sequence_id} step {step}: {seen}, expected "
                                   f"{(total, int(step == 0), sequence_id)}")

    async def generate(self, session, arrays, check):
        """A generation request over REST: /generate (one answer) or /generate_stream (server-sent
        events, one per token)."""
        streamed = self.rng.random() < 0.5
        kind = f"REST {'generate_stream' if streamed else 'generate'} {DECODER}"
        body = {"text_input": arrays["text_input"][0].decode(), "max_tokens": int(arrays["max_tokens"][0]),
                "exclude_input_in_output": True}
        url = f"http://{self.http_url}/v2/models/{DECODER}/{'generate_stream' if streamed else 'generate'}"
        with self.tallied(kind, DECODER):
            async with session.post(url, json=body) as response:
                text = await response.text()
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}: {text}")
            if streamed:
                events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
                pieces = [e["text_output"] for e in events]
            else:
                pieces = [json.loads(text)["text_output"]]
            check({"text_output": np.array([p.encode() for p in pieces], dtype=np.object_)})

    async def decoder_references(self):
        """The text every (prompt, max_tokens) gets alone, before any load."""
        async with aiohttp.ClientSession() as session:
            for prompt in PROMPTS:
                for tokens in range(1, MAX_TOKENS + 1):
                    body = {"text_input": prompt, "max_tokens": tokens, "exclude_input_in_output": True}
                    async with session.post(f"http://{self.http_url}/v2/models/{DECODER}/generate",
                                            json=body) as response:
                        self.cases.generated[(prompt, tokens)] = (await response.json())["text_output"]

    async def streamer(self):
        """ModelStreamInfer: a new stream for every STREAM_LENGTH requests, answers matched by id."""
        grpc = grpcaio.InferenceServerClient(self.grpc_url)
        n = 0
        while time.monotonic() < self.end:
            pending = {}

            async def requests():
                nonlocal n
                sent = 0
                while sent < STREAM_LENGTH:
                    # One sequential caller among --workers: about 1 / (workers + 1) of the slots.
                    if not await self.pace():
                        return
                    model, version, arrays, check = self.cases.build(self.pick_model(streamed=True))
                    n += 1
                    sent += 1
                    pending[str(n)] = (model, check, [])
                    self.in_flight[model] += 1
                    yield {"model_name": model, "model_version": version, "inputs": grpc_inputs(arrays),
                           "request_id": str(n)}

            try:
                async for result, error in grpc.stream_infer(requests()):
                    if error is not None:
                        self.stats.add("gRPC stream", "unexpected", str(error))
                        continue
                    response = result.get_response()
                    model, check, pieces = pending[response.id]
                    outputs = outputs_of(result, OUTPUTS[model])
                    if model in DECOUPLED:
                        # Decoupled: one response per piece; the last says triton_final_response.
                        name, dtype = DECOUPLED[model]
                        if outputs[name] is not None:
                            pieces.extend(outputs[name].flatten())
                        if not response.parameters["triton_final_response"].bool_param:
                            continue
                        outputs = {name: np.array(pieces, dtype=dtype)}
                    del pending[response.id]
                    self.in_flight[model] -= 1
                    kind = {DECODER: f"gRPC stream generate {DECODER}", TICKS: f"gRPC stream decoupled {TICKS}"}.get(
                        model, "gRPC stream infer")
                    try:
                        check(outputs)
                        self.stats.add(kind, "ok")
                    except Mismatch as e:
                        self.stats.add(kind, "wrong", str(e))
            except Exception as e:
                self.stats.add("gRPC stream", "unexpected", f"{type(e).__name__}: {e}")
            for model, _, _ in pending.values():
                self.in_flight[model] -= 1
                self.stats.add("gRPC stream", "unexpected", "no answer on the stream")
        await grpc.close()

    async def reloader(self):
        """Alternates a hot reload of mlp_classifier (traffic keeps flowing) with an unload and load
        of identity_types (traffic to it paused meanwhile), and with --features a hot reload of
        py_triple (its stubs replaced under traffic)."""
        if not self.args.reload_every:
            return
        grpc = grpcaio.InferenceServerClient(self.grpc_url)
        cycle = 0
        while True:
            await asyncio.sleep(self.args.reload_every)
            if time.monotonic() > self.end - self.args.reload_every / 2:
                break
            self.last_reload = time.monotonic()
            cycles = 3 if self.args.features else 2
            if cycle % cycles in (0, 2):
                model = "mlp_classifier" if cycle % cycles == 0 else "py_triple"
                try:
                    await grpc.load_model(model)
                    self.stats.add(f"reload {model} (under traffic)", "ok")
                except Exception as e:
                    self.stats.add(f"reload {model} (under traffic)", "unexpected", str(e))
            else:
                model = "identity_types"
                self.paused.add(model)
                while self.in_flight[model]:
                    await asyncio.sleep(0.01)
                try:
                    await grpc.unload_model(model)
                    self.stats.add("unload + load identity_types", "ok")
                except Exception as e:
                    self.stats.add("unload + load identity_types", "unexpected", str(e))
                arrays = identity_arrays(np.random.default_rng(0), 1)
                await self.expect_error(
                    "bad:unloaded model (gRPC)", lambda: grpc.infer(model, grpc_inputs(arrays)),
                    "StatusCode.NOT_FOUND", f"Request for unknown model: '{model}'")
                try:
                    await grpc.load_model(model)
                except Exception as e:
                    self.stats.add("unload + load identity_types", "unexpected", str(e))
                self.paused.discard(model)
                self.last_reload = time.monotonic()
            cycle += 1
        await grpc.close()

    async def sampler(self):
        while time.monotonic() < self.end:
            now = time.monotonic()
            settled = not self.paused and now - self.last_reload > SETTLE_SECONDS
            stubs = children_rss(self.pid) if self.args.features else 0  # no stubs otherwise
            self.samples.append((now - self.start, *process_sample(self.pid), stubs, settled))
            await asyncio.sleep(1)

    async def run(self):
        await self.decoder_references()
        self.start = time.monotonic()
        self.end = self.start + self.args.seconds
        tasks = [self.worker(n) for n in range(self.args.workers)]
        tasks += [self.streamer(), self.reloader(), self.sampler()]
        await asyncio.gather(*tasks)
        await asyncio.sleep(IDLE_SECONDS)
        self.idle_threads = process_sample(self.pid)[3]


# ---------------------------------------------------------------------------------------- summary

def window(samples, start, end):
    return [s for s in samples if start <= s[0] < end]


def summarize(soak, args):
    stats, failures = soak.stats, []
    print(f"\n{'kind':<40} {'ok':>8} {'expected':>9} {'unexpected':>11} {'wrong':>6}")
    for kind in sorted(stats.counts):
        c = stats.counts[kind]
        print(f"{kind:<40} {c['ok']:>8} {c['expected']:>9} {c['unexpected']:>11} {c['wrong']:>6}")
    ok, expected = stats.total("ok"), stats.total("expected")
    unexpected, wrong = stats.total("unexpected"), stats.total("wrong")
    print(f"{'total':<40} {ok:>8} {expected:>9} {unexpected:>11} {wrong:>6}")
    print(f"{(ok + expected) / args.seconds:.0f} requests/s answered over {args.seconds:.0f} s "
          f"(load average at the end {open('/proc/loadavg').read().split()[0]})")
    for m in stats.messages:
        print("  ", m)
    # Memory: median of the first 15 s after the warm-up against the median of the last 15 s.
    samples = soak.samples
    first = window(samples, args.warmup, args.warmup + 15)
    last = window(samples, args.seconds - 15, args.seconds + 1)
    rss0 = statistics.median(s[1] for s in first)
    rss1 = statistics.median(s[1] for s in last)
    growth = (rss1 - rss0) / rss0 * 100
    peak = max(s[1] for s in samples)
    settled_first = [s for s in first if s[6]] or first
    settled_last = [s for s in last if s[6]] or last
    fds0, fds1 = max(s[2] for s in settled_first), max(s[2] for s in settled_last)
    sockets0, sockets1 = max(s[3] for s in settled_first), max(s[3] for s in settled_last)
    th0, th1 = max(s[4] for s in settled_first), max(s[4] for s in settled_last)
    print(f"\nVmRSS after warm-up ({args.warmup:.0f} s) {rss0 / 1024:.1f} MiB, at the end {rss1 / 1024:.1f} MiB: "
          f"{growth:+.2f} % (peak {peak / 1024:.1f} MiB; at start-up {samples[0][1] / 1024:.1f} MiB)")
    print(f"open fds (not sockets) after warm-up {fds0}, at the end {fds1}; sockets {sockets0}, {sockets1} "
          f"(at most {max(s[3] for s in samples)}); threads after warm-up {th0}, at the end {th1}, "
          f"{IDLE_SECONDS} s after the load {soak.idle_threads}")
    if args.features:
        # While a reload runs, the old stubs and the new ones are up together: settled samples only.
        stubs0 = statistics.median(s[5] for s in settled_first)
        stubs1 = statistics.median(s[5] for s in settled_last)
        stubs_growth = (stubs1 - stubs0) / stubs0 * 100
        print(f"Python stubs' VmRSS together after warm-up {stubs0 / 1024:.1f} MiB, at the end {stubs1 / 1024:.1f} MiB: "
              f"{stubs_growth:+.2f} %")
        if stubs_growth >= args.max_rss_growth:
            failures.append(f"the Python stubs' resident memory grew {stubs_growth:.2f} % (limit {args.max_rss_growth} %)")
    if unexpected:
        failures.append(f"{unexpected} unexpected errors")
    if wrong:
        failures.append(f"{wrong} wrong answers")
    if growth >= args.max_rss_growth:
        failures.append(f"resident memory grew {growth:.2f} % (limit {args.max_rss_growth} %)")
    if fds1 > fds0:
        failures.append(f"open file descriptors grew from {fds0} to {fds1}")
    # Each worker holds one gRPC channel, up to 4 tritonclient HTTP connections and one aiohttp
    # connection; the streamer and the reloader one gRPC channel each.
    most_sockets = LISTENERS + args.workers * 6 + 2
    if max(s[3] for s in samples) > most_sockets:
        failures.append(f"more than {most_sockets} sockets: connections the clients closed stay open")
    # Under load the count includes the blocking pool's threads, as many as blocking work needed
    # at once lately; once idle they are gone, and what is left must not have grown.
    if soak.idle_threads > th0:
        failures.append(f"threads grew from {th0} after warm-up to {soak.idle_threads} once idle")
    if ok == 0 or expected == 0:
        failures.append("no traffic was checked")
    return failures


def check_cache_hits(http_port):
    """add_sub_cached's statistics: most of its requests must have been cache hits."""
    with socket.create_connection(("127.0.0.1", http_port), timeout=5) as s:
        s.sendall(b"GET /v2/models/add_sub_cached/stats HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n\r\n")
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    stats = json.loads(raw.split(b"\r\n\r\n", 1)[1])["model_stats"][0]
    hits, misses = stats["inference_stats"]["cache_hit"]["count"], stats["inference_stats"]["cache_miss"]["count"]
    print(f"add_sub_cached: {hits} cache hits, {misses} misses")
    return [] if hits > misses else [f"add_sub_cached: {hits} cache hits, {misses} misses"]


def check_traces(directory):
    """The rotated trace files: each a JSON array; some traces must be py_triple's calls, the
    children of their requests' traces."""
    files = [f for f in os.listdir(directory) if f.startswith("trace.json")]
    traces = []
    for name in files:
        with open(os.path.join(directory, name)) as f:
            traces += json.load(f)
    started = [t for t in traces if "model_name" in t]
    children = [t for t in started if t.get("parent_id")]
    print(f"{len(files)} trace files: {len(started)} traces, {len(children)} of them a Python model's calls "
          f"({sorted({t['model_name'] for t in children})})")
    if not children:
        return ["no trace of a Python model's call as its request's child was written"]
    return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=300, help="length of the soak (at most 600)")
    ap.add_argument("--warmup", type=float, default=60, help="seconds before the memory baseline")
    ap.add_argument("--rate", type=float, default=150, help="requests per second, all kinds together")
    ap.add_argument("--workers", type=int, default=8, help="concurrent clients (each alternates protocols)")
    ap.add_argument("--reload-every", type=float, default=10, help="seconds between two reload cycles (0: none)")
    ap.add_argument("--models", help="the models traffic goes to (comma-separated; default: all)")
    ap.add_argument("--features", action="store_true",
                    help="add Python models, an ensemble, sequences, the response cache and traces")
    ap.add_argument("--max-rss-growth", type=float, default=5, help="percent of resident memory growth that fails")
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--samples", help="write the once-a-second samples to this CSV file")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "kiln"))
    args = ap.parse_args()
    served = MODELS + (FEATURE_MODELS if args.features else [])
    args.models = args.models.split(",") if args.models else served
    if not set(args.models) <= set(served):
        sys.exit(f"--models: choose from {', '.join(served)}")
    if not 30 <= args.seconds <= 600 or args.warmup + 30 > args.seconds:
        sys.exit("--seconds must be 30 to 600, and leave 30 s after --warmup")
    if not os.path.exists(os.path.join(REPOSITORY, MINILM, "1", "model.onnx")):
        sys.exit(f"{MINILM} is not built: run .ci/setup.sh models")
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    log = tempfile.NamedTemporaryFile(prefix="kiln-soak-", suffix=".log", delete=False)
    work = tempfile.mkdtemp(prefix="kiln-soak-")
    extra, env = [], {**os.environ, "RUST_LOG": "warn"}
    if args.features:
        extra = ["--model-repository", feature_repository(work), "--cache-config", "local,size=1048576",
                 "--trace-config", f"triton,file={os.path.join(work, 'trace.json')}",
                 "--trace-config", "triton,log-frequency=100", "--trace-config", "rate=10",
                 "--trace-config", "level=TIMESTAMPS", "--trace-config", "level=TENSORS"]
        env["KILN_PYTHON"] = sys.executable  # the stubs' interpreter: this one has numpy
    server = subprocess.Popen(
        [args.binary, "--model-repository", REPOSITORY, "--model-control-mode", "explicit", "--load-model", "*",
         "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--metrics-port", str(metrics_port), *extra],
        stdout=subprocess.DEVNULL, stderr=log, env=env)
    failures = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", http_port), timeout=1) as s:
                    s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n\r\n")
                    if s.recv(64).startswith(b"HTTP/1.1 200"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                sys.exit(f"kiln did not become ready (log: {log.name})")
            time.sleep(0.2)
        print(f"kiln {args.binary} (pid {server.pid}) ready; soak of {args.seconds:.0f} s at {args.rate:.0f} "
              f"requests/s, warm-up {args.warmup:.0f} s; load average {open('/proc/loadavg').read().split()[0]}")
        soak = Soak(args, f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}", server.pid)
        asyncio.run(soak.run())
        if args.features and server.poll() is None:
            failures += check_cache_hits(http_port)
        if server.poll() is not None:
            failures.append(f"kiln exited with {server.returncode}")
        else:
            failures += summarize(soak, args)
        if args.samples:
            with open(args.samples, "w") as f:
                f.write("seconds,rss_kib,fds,sockets,threads,stubs_rss_kib,settled\n")
                for t, rss, fds, sockets, threads, stubs, settled in soak.samples:
                    f.write(f"{t:.1f},{rss},{fds},{sockets},{threads},{stubs},{int(settled)}\n")
    finally:
        server.terminate()
        code = server.wait(timeout=60)
        if code != 0:
            failures.append(f"kiln exited with {code} on SIGTERM")
        if args.features:
            failures += check_traces(work)
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"kiln log: {log.name}")
    else:
        os.unlink(log.name)
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else "")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
