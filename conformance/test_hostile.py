"""Hostile clients (issue 35): one test per attack class, each against its own kiln with small
limits given by flag so that it is quick. Every test checks that the server is the same live
process afterwards (same PID, still answering), that a legitimate inference answers correctly
during and after the attack, and that peak RSS (VmHWM) grew less than 512 MiB over idle.

Attacks: a gRPC message of millions of empty entries, and a gzip bomb (gRPC); JSON of millions of
tiny values (REST management and generate routes); bodies that stall after one byte; headers
sent by half; HTTP/2 rapid reset, MadeYouReset and the advertised stream limit (both
listeners); a decoupled stream that is written and never read.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import struct
import threading
import time

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from conftest import BUNDLED_REPO, f32, http_request, infer_request, start_server, stop_server

MIB = 1024 * 1024
GROWTH_LIMIT = 512 * MIB
# How many attackers at once (bench: KILN_HOSTILE_SCALE=10 runs the suite at ten times the
# connections, bodies, floods and bombs, for bench/RESULTS.md).
SCALE = int(os.environ.get("KILN_HOSTILE_SCALE", "1"))
A = np.arange(16, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# the server, its memory, and the legitimate client
# ---------------------------------------------------------------------------------------------
def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in bytes."""
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * 1024
    return values


class Hostile:
    """A kiln serving add_sub (and what else is asked) from the bundled repository, its PID and
    its idle memory."""

    def __init__(self, name: str, flags=(), models=("add_sub",)):
        args = ["--model-control-mode=explicit", *(f"--load-model={m}" for m in models), *flags]
        self.srv = start_server([BUNDLED_REPO], name=name, extra_args=args)
        self.pid = self.srv.proc.pid
        self.idle = memory(self.pid)["VmRSS"]

    def infer_grpc(self) -> None:
        request = infer_request("add_sub", [("INPUT0", "FP32", [1, 16], f32(A)),
                                            ("INPUT1", "FP32", [1, 16], f32(np.ones(16)))])
        reply = self.srv.stub().ModelInfer(request, timeout=30)
        out0 = np.frombuffer(reply.raw_output_contents[0], np.float32)
        out1 = np.frombuffer(reply.raw_output_contents[1], np.float32)
        assert (out0 == A + 1).all() and (out1 == A - 1).all(), (out0, out1)

    def infer_rest(self) -> None:
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": A.tolist()},
                           {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}
        reply = http_request(self.srv.http_url, "POST", "/v2/models/add_sub/infer", json.dumps(body).encode())
        assert reply.status == 200, reply
        outputs = {o["name"]: o["data"] for o in reply.json()["outputs"]}
        assert outputs["OUTPUT0"] == (A + 1).tolist() and outputs["OUTPUT1"] == (A - 1).tolist()

    def infer(self) -> None:
        self.infer_grpc()
        self.infer_rest()

    def during(self, attack) -> None:
        """Runs `attack` in a thread while legitimate inferences run (at least one), then checks
        that the attack itself raised nothing."""
        failure = []

        def run():
            try:
                attack()
            except BaseException as e:  # reported below, in the test's thread
                failure.append(e)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.infer()
        while thread.is_alive():
            self.infer()
            thread.join(timeout=0.2)
        if failure:
            raise failure[0]

    def survived(self) -> None:
        """Same process, still answering, and the peak RSS within bounds."""
        assert self.srv.proc.poll() is None, f"kiln exited\n{self.srv.log_tail()}"
        assert self.srv.proc.pid == self.pid
        self.infer()
        peak = memory(self.pid)["VmHWM"]
        print(f"{self.srv.name}: idle {self.idle / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB")  # with -s
        assert peak - self.idle < GROWTH_LIMIT, \
            f"peak RSS {peak / MIB:.0f} MiB, idle {self.idle / MIB:.0f} MiB"

    def stop(self) -> None:
        stop_server(self.srv)


@pytest.fixture
def hostile(request):
    made = []

    def start(flags=(), models=("add_sub",)) -> Hostile:
        server = Hostile(f"kiln-hostile-{request.node.name}", flags, models)
        made.append(server)
        return server

    yield start
    for server in made:
        server.stop()


# ---------------------------------------------------------------------------------------------
# 1. gRPC amplification
# ---------------------------------------------------------------------------------------------
def raw_model_infer(srv, payload: bytes, compression=grpc.Compression.Gzip) -> grpc.RpcError:
    """Sends `payload` as the bytes of a ModelInfer request; returns the error it must get."""
    call = srv.channel().unary_unary("/inference.GRPCInferenceService/ModelInfer")
    with pytest.raises(grpc.RpcError) as caught:
        call(payload, timeout=120, compression=compression)
    return caught.value


def test_grpc_empty_entries_and_gzip_bombs_are_refused_before_they_are_built(hostile):
    server = hostile(["--grpc-max-decompressed-bytes=67108864"])
    # 8 million empty `inputs` entries: 16 MB, ~40 KB gzipped; prost would build 2.5 GB (5 GB
    # with its Vec growing), refused by the decode budget before any is built.
    entries = b"\x2a\x00" * 8_000_000
    # A 100 MB model name: zeros, ~100 KB gzipped; past the 64 MiB decompressed cap.
    name = 100_000_000
    bomb = b"\x0a" + bytes([0x80 | (name & 0x7F), 0x80 | ((name >> 7) & 0x7F), 0x80 | ((name >> 14) & 0x7F),
                            name >> 21]) + bytes(name)

    def attack():
        for _ in range(SCALE - 1):  # the other attackers, at once
            threading.Thread(target=raw_model_infer, args=(server.srv, entries), daemon=True).start()
        errors = [raw_model_infer(server.srv, entries), raw_model_infer(server.srv, bomb)]
        assert errors[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED, errors[0]
        assert "--grpc-max-decode-bytes" in errors[0].details()
        assert errors[1].code() == grpc.StatusCode.RESOURCE_EXHAUSTED, errors[1]
        assert "--grpc-max-decompressed-bytes" in errors[1].details()
        # Uncompressed, the same entries are charged too.
        plain = raw_model_infer(server.srv, entries, compression=grpc.Compression.NoCompression)
        assert plain.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, plain

    server.during(attack)
    server.survived()


def varint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out += bytes([0x80 | (n & 0x7F)])
        n >>= 7
    return out + bytes([n])


def test_grpc_millions_of_empty_strings_cost_their_framed_bytes(hostile):
    """BYTES strings are not charged to the decode budget (Triton answers ten million of them):
    31 million empty `bytes_contents` elements (62 MB inflated, under the 64 MiB cap, 60 KB of
    gzip) decode into one 124 MB framed buffer, not 31 million structs (2 GB), and the request
    is then refused for its shape."""
    server = hostile(["--grpc-max-decompressed-bytes=67108864"])
    strings = b"\x42\x00" * 31_000_000
    contents = b"\x2a" + varint(len(strings)) + strings
    tensor = b"\x0a\x06INPUT0\x12\x05BYTES\x1a\x02\x01\x10" + contents
    message = b"\x0a\x07add_sub" + b"\x2a" + varint(len(tensor)) + tensor

    def attack():
        for _ in range(SCALE):
            error = raw_model_infer(server.srv, message)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
            assert "INPUT0" in error.details(), error.details()

    server.during(attack)
    server.survived()


# ---------------------------------------------------------------------------------------------
# 2. REST JSON amplification
# ---------------------------------------------------------------------------------------------
def test_rest_json_of_tiny_values_is_refused_before_it_becomes_a_tree(hostile):
    server = hostile()
    values = 33_000_000  # 66 MB of `0,` (62.9 MiB: under the 64 MiB body limit once inflated)
    body = gzip.compress(b"[" + b"0," * (values - 1) + b"0]", compresslevel=6)
    assert len(body) < 1 * MIB
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    replies = []

    def post(path):
        replies.append(http_request(server.srv.http_url, "POST", path, body, headers))

    def attack():
        paths = ["/v2/repository/index", "/v2/repository/index", "/v2/models/add_sub/generate",
                 "/v2/logging"] * SCALE
        threads = [threading.Thread(target=post, args=(p,)) for p in paths]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    server.during(attack)
    assert len(replies) == 4 * SCALE
    for reply in replies:
        # Counted and refused; or, past what inflated bodies may take together, refused before
        # inflating further (429: four of these fit the default budget, forty do not).
        if SCALE > 1 and reply.status == 429:
            assert "--http-max-inflated-bytes" in reply.json()["error"], reply
            continue
        assert reply.status == 400, reply
        assert "values" in reply.json()["error"], reply
    server.survived()


# ---------------------------------------------------------------------------------------------
# 3. stalled bodies and half-sent headers
# ---------------------------------------------------------------------------------------------
def connect(url: str, timeout: float = 20.0) -> socket.socket:
    host, port = url.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; raises socket.timeout if it never does."""
    got = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return got
        got += chunk


def test_stalled_bodies_hold_no_request_slot_and_time_out(hostile):
    server = hostile(["--max-inflight-requests=16", "--http-body-timeout-secs=2"])
    stalled = []
    for _ in range(40 * SCALE):
        sock = connect(server.srv.http_url)
        sock.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: kiln\r\n"
                     b"Content-Length: 1000\r\n\r\n{")
        stalled.append(sock)
    # 40 stalled requests, 16 slots: legitimate requests are still admitted.
    server.infer()
    for sock in stalled:
        answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"--http-body-timeout-secs" in answer
        sock.close()
    server.survived()


def test_half_sent_headers_and_idle_connections_are_closed_and_lock_nobody_out(hostile):
    server = hostile(["--http-header-timeout-secs=1", "--max-connections=24"])
    attackers = []
    for i in range(40 * SCALE):
        sock = connect(server.srv.http_url)
        if i % 2 == 0:
            sock.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: kiln\r\nContent-Le")
        attackers.append(sock)
    for i in range(10 * SCALE):  # on gRPC: nothing, or half the HTTP/2 preface
        sock = connect(server.srv.grpc_url)
        if i % 2 == 0:
            sock.sendall(PREFACE[:10])
        attackers.append(sock)
    # 50 attackers against 24 connection slots on both listeners: the timeout clears them and
    # the legitimate client (waiting in the backlog meanwhile) is answered.
    server.infer()
    for sock in attackers:
        read_until_closed(sock)
        sock.close()
    server.survived()


# ---------------------------------------------------------------------------------------------
# 4. HTTP/2 limits: advertised streams, rapid reset, MadeYouReset
# ---------------------------------------------------------------------------------------------
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0, 1, 3, 4, 7
SETTINGS_MAX_CONCURRENT_STREAMS = 3
CANCEL = struct.pack(">I", 8)
ENHANCE_YOUR_CALM = 11
MAX_STREAMS = 5


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman (lengths < 127)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def request_headers(path: bytes) -> bytes:
    return b"".join(literal(n, v) for n, v in [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"kiln"),
        (b"content-type", b"application/grpc"), (b"te", b"trailers")])


class H2:
    """A raw HTTP/2 connection (prior knowledge)."""

    def __init__(self, url: str):
        self.sock = connect(url)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        self.buffer = b""

    def frames(self):
        """The server's frames as (type, flags, stream, payload) until it closes."""
        while True:
            while len(self.buffer) >= 9:
                length = int.from_bytes(self.buffer[:3], "big")
                if len(self.buffer) < 9 + length:
                    break
                kind, flags = self.buffer[3], self.buffer[4]
                stream = int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF
                payload = self.buffer[9:9 + length]
                self.buffer = self.buffer[9 + length:]
                yield kind, flags, stream, payload
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return
            if not chunk:
                return
            self.buffer += chunk

    def settings(self) -> dict[int, int]:
        for kind, flags, _, payload in self.frames():
            if kind == SETTINGS and not flags & 1:
                return {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
                        for i in range(0, len(payload), 6)}
        raise AssertionError("no SETTINGS from the server")

    def goaway(self) -> int | None:
        """The error code of the server's GOAWAY, or None if it closed without one."""
        for kind, _, _, payload in self.frames():
            if kind == GOAWAY:
                return int.from_bytes(payload[4:8], "big")
        return None

    def flood(self, count: int, headers: bytes, then) -> None:
        """Opens `count` streams with `headers`, each followed at once by the frames
        `then(stream)`; stops early if the server has closed."""
        batch = b""
        for i in range(count):
            stream = 2 * i + 1
            batch += frame(HEADERS, 0x4, stream, headers) + then(stream)
            if len(batch) > 16384 or i == count - 1:
                try:
                    self.sock.sendall(batch)
                except (BrokenPipeError, ConnectionResetError):
                    return
                batch = b""


def test_http2_stream_and_reset_limits_on_both_listeners(hostile):
    server = hostile([f"--http2-max-concurrent-streams={MAX_STREAMS}",
                      "--http2-max-pending-reset-streams=10", "--http2-max-local-error-reset-streams=20"])
    paths = {server.srv.grpc_url: b"/inference.GRPCInferenceService/ModelInfer",
             server.srv.http_url: b"/v2/models/add_sub/infer"}
    for url in paths:
        settings = H2(url).settings()
        assert settings.get(SETTINGS_MAX_CONCURRENT_STREAMS) == MAX_STREAMS, (url, settings)

    def rapid_reset():
        # Streams opened and cancelled at once, faster than the server accepts them.
        for url, path in paths.items():
            for _ in range(SCALE):
                h2 = H2(url)
                h2.flood(5000, request_headers(path), lambda stream: frame(RST_STREAM, 0, stream, CANCEL))
                assert h2.goaway() == ENHANCE_YOUR_CALM, f"rapid reset on {url}"

    def made_you_reset():
        # `content-length: 0` and then data: a stream error, so the server resets each stream
        # itself (a zero WINDOW_UPDATE would end the whole connection at once instead).
        for url, path in paths.items():
            for _ in range(SCALE):
                h2 = H2(url)
                headers = request_headers(path) + literal(b"content-length", b"0")
                h2.flood(2000, headers, lambda stream: frame(DATA, 0, stream, b"x" * 10))
                assert h2.goaway() == ENHANCE_YOUR_CALM, f"MadeYouReset on {url}"

    server.during(rapid_reset)
    server.during(made_you_reset)
    server.survived()


def test_an_idle_connection_is_closed_after_its_request(hostile):
    # HTTP/2 (prior knowledge), where hyper's header timeout does not apply between requests.
    server = hostile(["--http-idle-timeout-secs=1"])
    h2 = H2(server.srv.http_url)
    get = b"".join(literal(n, v) for n, v in [
        (b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/v2/health/live"), (b":authority", b"kiln")])
    h2.sock.sendall(frame(HEADERS, 0x5, 1, get))
    answered = False
    for kind, flags, stream, _ in h2.frames():
        if stream == 1 and kind in (DATA, HEADERS) and flags & 0x1:
            answered = True
        if kind == GOAWAY:
            break
    assert answered, "the request was not answered before the connection closed"
    server.survived()


# ---------------------------------------------------------------------------------------------
# 6. a decoupled stream written and never read
# ---------------------------------------------------------------------------------------------
def test_a_decoupled_stream_that_is_never_read_stops_being_read(hostile):
    server = hostile(models=("add_sub", "tiny_decoder"))
    total, sent = 3000 * SCALE, [0]
    padding = "x" * 4096  # fills the flow-control windows in fewer requests

    def requests():
        for i in range(total):
            request = service_pb2.ModelInferRequest(model_name="tiny_decoder", id=f"{i}-{padding}")
            tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
            tensor.contents.bytes_contents.append(b"The potter")
            request.parameters["max_tokens"].int64_param = 4
            sent[0] += 1
            yield request

    channel = server.srv.new_channel()
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    responses = stub.ModelStreamInfer(requests(), timeout=120)  # never read
    try:
        def wait():
            # The server reads at most its per-stream cap plus what the flow-control windows
            # hold; the client's sends then block.
            time.sleep(8)

        server.during(wait)
        assert sent[0] < total, f"the server read all {total} requests of a stream never read"
        server.survived()
    finally:
        responses.cancel()
        channel.close()
