"""Shared fixtures for the kiln conformance suite.

The suite runs the real `kiln` binary (env KILN_BIN, else target/debug/kiln) as a
subprocess and talks to it over gRPC and REST exactly like Triton/MLServer clients do.

NOTE: tritonclient and mlserver register the same protobuf names (package
`inference`), so nothing here imports mlserver; MLServer flows run in a
subprocess (see mlserver_client.py / test_mlserver.py).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from tritonclient.grpc import service_pb2, service_pb2_grpc

# The Python backend suite's server (`python_server`), defined once for all its files
# (test_python_backend_*.py): a fixture imported into each would start a kiln per file.
pytest_plugins = ["python_backend_models"]

CONFORMANCE_DIR = Path(__file__).resolve().parent
REPO_ROOT = CONFORMANCE_DIR.parent
BUNDLED_REPO = REPO_ROOT / "model_repository"
FIXTURE_REPO = REPO_ROOT / "tests" / "fixtures" / "model_repository"
README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"  # README.md's reference pages: clients.md, models.md, operations.md, ...

# Per-call deadline (seconds) for every RPC the suite makes; no pytest-timeout
# plugin is used, so each client call carries its own deadline instead.
RPC_TIMEOUT = float(os.environ.get("KILN_RPC_TIMEOUT", "30"))
STARTUP_TIMEOUT = float(os.environ.get("KILN_STARTUP_TIMEOUT", "60"))
MAX_MSG = 2**31 - 1  # what tritonclient and Triton use

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MSG),
    ("grpc.max_receive_message_length", MAX_MSG),
]


def kiln_bin() -> Path:
    env = os.environ.get("KILN_BIN")
    if env:
        p = Path(env)
        return p if p.is_absolute() else (REPO_ROOT / p)
    return REPO_ROOT / "target" / "debug" / "kiln"


# Ports handed out in this run: the kernel may offer a closed one again, and a test that asks for
# a port of its own (an OpenAI or SageMaker listener) before its server takes its three must not
# get one of them.
_HANDED_OUT: set[int] = set()


def doc_section(page: Path, title: str) -> str:
    """The section of a Markdown page under the heading `title` (## or ###), up to the next heading
    (## or deeper: a code block's `# ` comment lines do not end it). A section that moved or was
    renamed fails here, by name, not silently."""
    text = page.read_text()
    found = re.search(rf"^#{{2,3}} {re.escape(title)}\n", text, flags=re.M)
    assert found, f"no section {title!r} in {page.relative_to(REPO_ROOT)}"
    end = re.search(r"\n##+ ", text[found.end():])
    return text[found.start(): found.end() + end.start()] if end else text[found.start():]


def find_free_port() -> int:
    """A port free now and not handed out before in this run."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def _distinct_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        p = find_free_port()
        if p not in ports:
            ports.append(p)
    return ports


class KilnServer:
    """One running kiln process."""

    def __init__(self, repos: list[Path], name: str = "kiln", extra_args=(), env=None, metadata=(),
                 grpc_credentials=None):
        self.repos = [Path(r) for r in repos]
        self.name = name
        self.extra_args = list(extra_args)
        self.env = env  # extra environment variables for the process
        self.metadata = tuple(metadata)  # gRPC headers the start-up probes send (restricted health)
        self.grpc_credentials = grpc_credentials  # grpc.ChannelCredentials for a TLS gRPC port
        self.grpc_port, self.http_port, self.metrics_port = _distinct_ports(3)
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.http_url = f"127.0.0.1:{self.http_port}"
        self.metrics_url = f"127.0.0.1:{self.metrics_port}"
        fd, log = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log)
        self.proc: subprocess.Popen | None = None
        self._channel: grpc.Channel | None = None
        self._stub = None

    # -- lifecycle -------------------------------------------------------
    def start(self) -> "KilnServer":
        binary = kiln_bin()
        if not binary.exists():
            pytest.fail(f"kiln binary not found at {binary} (set KILN_BIN)", pytrace=False)
        args = [str(binary)]
        for r in self.repos:
            args += ["--model-repository", str(r)]
        args += [
            "--grpc-port", str(self.grpc_port),
            "--http-port", str(self.http_port),
            "--metrics-port", str(self.metrics_port),
        ]
        args += self.extra_args
        if os.environ.get("KILN_CONFORMANCE_VERBOSE"):
            args += ["--log-verbose", "1"]
        self.args = args
        self._log_fh = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            args,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(REPO_ROOT),
            start_new_session=True,  # own process group
            env=None if self.env is None else {**os.environ, **self.env},
        )
        self._wait_live()
        self._wait_models_settled()
        return self

    def _wait_models_settled(self) -> None:
        """Live may come before loading ends: wait until ServerReady, or until every
        model in RepositoryIndex is READY or UNAVAILABLE with at least one failed load.
        Gives up silently at the deadline: the tests then report what is wrong."""
        if self.grpc_off:
            return
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                ready = self.stub().ServerReady(
                    service_pb2.ServerReadyRequest(), timeout=5, metadata=self.metadata)
                if ready.ready:
                    return
                idx = self.stub().RepositoryIndex(
                    service_pb2.RepositoryIndexRequest(), timeout=5, metadata=self.metadata)
                # A failed load keeps a strict server unready for good: settled. Every model
                # READY is not yet ready: the server says so once its start-up load has
                # returned (a moment later), and a test that asks at once must not see false.
                states = [m.state for m in idx.models]
                if states and all(s in ("READY", "UNAVAILABLE") for s in states) \
                        and "UNAVAILABLE" in states:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)

    @property
    def grpc_off(self) -> bool:
        return "--allow-grpc=false" in self.extra_args

    def _wait_http(self) -> None:
        """A kiln started without gRPC: wait for REST to say live, then ready (or give up at
        the deadline, as `_wait_models_settled` does)."""
        deadline = time.monotonic() + STARTUP_TIMEOUT
        for path in ("/v2/health/live", "/v2/health/ready"):
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if http_request(self.http_url, "GET", path).status == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.2)
        if self.proc.poll() is not None:
            pytest.fail(f"kiln exited with code {self.proc.returncode} during startup\n"
                        f"{self.log_tail()}", pytrace=False)

    def _wait_live(self) -> None:
        if self.grpc_off:
            return self._wait_http()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        last_err = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"kiln exited with code {self.proc.returncode} during startup\n"
                    f"cmd: {' '.join(self.args)}\n{self.log_tail()}",
                    pytrace=False,
                )
            # a fresh channel per attempt: a long-lived one would sit in reconnect backoff
            with self.new_channel() as ch:
                try:
                    stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
                    live = stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=2, metadata=self.metadata)
                    if live.live:
                        return
                except grpc.RpcError as e:  # not listening yet
                    last_err = e
            time.sleep(0.2)
        self.stop()
        pytest.fail(
            f"kiln did not answer ServerLive within {STARTUP_TIMEOUT}s ({last_err})\n"
            f"{self.log_tail()}",
            pytrace=False,
        )

    def stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
            self._stub = None
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.kill(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        self._log_fh.close()

    # -- helpers ---------------------------------------------------------
    def new_channel(self, options=()) -> grpc.Channel:
        if self.grpc_credentials is None:
            return grpc.insecure_channel(self.grpc_url, options=list(options))
        return grpc.secure_channel(self.grpc_url, self.grpc_credentials, options=list(options))

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = self.new_channel(CHANNEL_OPTIONS)
        return self._channel

    def stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        if self._stub is None:
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel())
        return self._stub

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 80) -> str:
        text = self.log_text().splitlines()[-lines:]
        return f"--- {self.name} log ({self.log_path}) tail ---\n" + "\n".join(text)

    def assert_alive(self) -> None:
        """The process is still running and ServerLive answers true."""
        assert self.proc is not None
        rc = self.proc.poll()
        assert rc is None, f"kiln exited with code {rc}\n{self.log_tail()}"
        try:
            live = self.stub().ServerLive(service_pb2.ServerLiveRequest(), timeout=10).live
        except grpc.RpcError as e:
            pytest.fail(f"ServerLive failed after bad input: {e.code()} {e.details()}\n{self.log_tail()}")
        assert live is True
        self.assert_http_alive()

    def assert_http_alive(self) -> None:
        """The REST listener answers GET /v2/health/live with 200 {"live": true}."""
        try:
            reply = http_request(self.http_url, "GET", "/v2/health/live")
        except OSError as e:
            pytest.fail(f"REST health check failed after bad input: {e}\n{self.log_tail()}")
        assert (reply.status, reply.json()) == (200, {"live": True}), reply


_SERVERS: list[KilnServer] = []


_START_FAILURES: dict[str, str] = {}


def start_server(repos, name="kiln", **options) -> KilnServer:
    """Start kiln; a failed start is remembered so later tests fail fast instead of retrying.
    `options` go to KilnServer (extra_args, env, metadata)."""
    if name in _START_FAILURES:
        pytest.fail(f"(earlier start failed) {_START_FAILURES[name]}", pytrace=False)
    srv = KilnServer(repos, name=name, **options)
    _SERVERS.append(srv)
    try:
        return srv.start()
    except BaseException as e:
        _START_FAILURES[name] = str(e)[:4000]
        stop_server(srv)
        raise


def stop_server(srv: KilnServer) -> None:
    srv.stop()
    if srv in _SERVERS:
        _SERVERS.remove(srv)
    _STOPPED.append(srv)


_STOPPED: list[KilnServer] = []


@pytest.fixture(scope="session")
def server():
    """kiln serving the bundled repo and the test-only fixture repo at once."""
    srv = start_server([BUNDLED_REPO, FIXTURE_REPO], name="kiln-main")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def bundled_server():
    """A second kiln with only the bundled repository: every model loads, so it is READY."""
    srv = start_server([BUNDLED_REPO], name="kiln-bundled")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def grpc_url(server) -> str:
    return server.grpc_url


@pytest.fixture(scope="session")
def http_url(server) -> str:
    return server.http_url


@pytest.fixture(scope="session")
def stub(server):
    return server.stub()


@pytest.fixture(scope="session")
def client(server):
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture
def alive(server):
    """Use in bad-input tests: asserts the server survived the test."""
    yield server
    server.assert_alive()


def grpc_error(fn, *args, **kwargs) -> grpc.RpcError:
    """Call a raw-stub RPC expecting failure; return the RpcError."""
    kwargs.setdefault("timeout", RPC_TIMEOUT)
    with pytest.raises(grpc.RpcError) as ei:
        fn(*args, **kwargs)
    return ei.value


def assert_rpc_error(err: grpc.RpcError, code: grpc.StatusCode, *fragments: str) -> None:
    assert err.code() == code, f"expected {code}, got {err.code()}: {err.details()!r}"
    details = err.details() or ""
    for frag in fragments:
        assert frag in details, f"{frag!r} not in error message {details!r}"


def assert_triton_error(exc, code: grpc.StatusCode, *fragments: str) -> None:
    """Check an InferenceServerException raised by tritonclient.grpc."""
    assert exc.status() == str(code), f"expected {code}, got {exc.status()}: {exc.message()!r}"
    msg = exc.message() or ""
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in error message {msg!r}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for srv in list(_SERVERS):
            rep.sections.append((f"{srv.name} log", srv.log_tail(40)))


def pytest_sessionfinish(session, exitstatus):
    for srv in list(_SERVERS):
        stop_server(srv)
    # keep the server logs only when something failed
    for srv in _STOPPED:
        if exitstatus == 0 and not os.environ.get("KILN_KEEP_LOGS"):
            srv.log_path.unlink(missing_ok=True)
        else:
            print(f"\n{srv.name} log: {srv.log_path}")


# ---------------------------------------------------------------------------
# data helpers shared by the test modules
# ---------------------------------------------------------------------------
def _bf16():
    import ml_dtypes

    return ml_dtypes.bfloat16


# (Triton datatype, numpy dtype) for every type identity_types carries (BF16: ml_dtypes).
DATATYPES = [
    ("BOOL", np.bool_), ("UINT8", np.uint8), ("UINT16", np.uint16), ("UINT32", np.uint32),
    ("UINT64", np.uint64), ("INT8", np.int8), ("INT16", np.int16), ("INT32", np.int32),
    ("INT64", np.int64), ("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64),
    ("BYTES", np.object_), ("BF16", None),
]
DATATYPE_NAMES = [t for t, _ in DATATYPES]


def np_dtype(triton_type: str):
    return _bf16() if triton_type == "BF16" else dict(DATATYPES)[triton_type]


def random_array(triton_type: str, shape, rng: np.random.Generator) -> np.ndarray:
    shape = tuple(shape)
    if triton_type == "BYTES":
        pool = [b"", b"a", "h\u00e9llo".encode(), "\u2603 snow \U0001f600".encode(), b"x" * 40]
        flat = [pool[i] for i in rng.integers(0, len(pool), int(np.prod(shape, dtype=np.int64)))]
        return np.array(flat, dtype=np.object_).reshape(shape)
    if triton_type == "BOOL":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if triton_type == "BF16":
        return rng.standard_normal(shape).astype(np.float32).astype(_bf16())
    dt = np.dtype(np_dtype(triton_type))
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    return rng.standard_normal(shape).astype(dt)


def serialize_bytes(elements) -> bytes:
    """Triton's BYTES raw layout: u32-LE length + bytes per element."""
    out = []
    for e in elements:
        b = e if isinstance(e, bytes) else str(e).encode()
        out.append(struct.pack("<I", len(b)))
        out.append(b)
    return b"".join(out)


def deserialize_bytes(raw: bytes) -> list[bytes]:
    out, off = [], 0
    while off < len(raw):
        (n,) = struct.unpack_from("<I", raw, off)
        off += 4
        assert off + n <= len(raw), "BYTES framing in response runs past the end"
        out.append(raw[off:off + n])
        off += n
    return out


def raw_bytes_of(arr: np.ndarray, triton_type: str) -> bytes:
    if triton_type == "BYTES":
        return serialize_bytes(arr.flatten().tolist())
    return arr.tobytes()


def infer_request(model: str, inputs, version: str = "", outputs=(), raw=None, request_id: str = ""):
    """Build a ModelInferRequest by hand.

    inputs: (name, datatype, shape, data) where data is bytes (goes to
    raw_input_contents, in order), a dict of typed contents (e.g.
    {"fp32_contents": [...]}) or None (no data at all). `raw`, when given,
    replaces raw_input_contents wholesale.
    """
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, datatype, shape, data in inputs:
        t = req.inputs.add(name=name, datatype=datatype)
        t.shape.extend(int(d) for d in shape)
        if isinstance(data, (bytes, bytearray)):
            req.raw_input_contents.append(bytes(data))
        elif isinstance(data, dict):
            for field, values in data.items():
                getattr(t.contents, field).extend(values)
    if raw is not None:
        del req.raw_input_contents[:]
        req.raw_input_contents.extend(raw)
    for o in outputs:
        req.outputs.add(name=o)
    return req


def f32(values) -> bytes:
    return np.asarray(values, dtype=np.float32).tobytes()


# ---------------------------------------------------------------------------
# a plain HTTP client for REST tests that need exact control over the request
# ---------------------------------------------------------------------------
class HttpReply:
    """One REST response: status, headers (lower-case names) and the raw body."""

    def __init__(self, status: int, headers: dict, body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)

    def error(self) -> str:
        return self.json()["error"]

    def __repr__(self) -> str:
        return f"HttpReply({self.status}, {self.headers}, {self.body[:300]!r})"


def http_request(url: str, method: str, path: str, body: bytes = b"", headers=None) -> HttpReply:
    """Send one request with http.client: no Content-Type unless given (tritonclient sends none),
    Content-Length from the body. Every call carries RPC_TIMEOUT."""
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=RPC_TIMEOUT)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        r = conn.getresponse()
        return HttpReply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def add_sub_request_body(binary: bool):
    """An add_sub request as `tritonclient.http` builds it (INPUT0 = 0..15, INPUT1 = ones, both
    outputs asked for, JSON or binary data): (body, JSON length, INPUT0)."""
    import tritonclient.http as httpclient

    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    tensors = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    tensors[0].set_data_from_numpy(a, binary_data=binary)
    tensors[1].set_data_from_numpy(np.ones((1, 16), np.float32), binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(tensors, outputs=outputs)
    return body, json_size, a
