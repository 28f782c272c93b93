"""Triton's `trace` and `logging` extensions, through tritonclient (gRPC and HTTP) and plain
HTTP: the settings APIs with Triton's answers and errors, the trace files kiln writes (Triton's
JSON layout, timestamps in order, numbered files by count and log frequency, TENSORS records),
and log settings that change what the log holds and how its lines look.

Each test has a kiln of its own: log settings are process-wide, and traces need a file.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, RPC_TIMEOUT, http_request, start_server, stop_server

T = RPC_TIMEOUT


def add_sub_inputs(module, value=1.0):
    a = np.full((1, 16), value, dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    return inputs


def post(server, path, doc):
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return http_request(server.http_url, "POST", path, body)


def wait_for(path: Path, timeout=10.0) -> Path:
    """`path` once it holds a whole JSON document (kiln creates a trace file, then writes it)."""
    deadline = time.monotonic() + timeout
    while not complete_json(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert complete_json(path), f"{path} was not written"
    return path


def complete_json(path: Path) -> bool:
    try:
        json.loads(path.read_text())
        return True
    except (OSError, ValueError):
        return False


def records_by_trace(*files: Path) -> dict[int, list[dict]]:
    """Every record of the given trace files, grouped by trace id, in file order."""
    traces: dict[int, list[dict]] = {}
    for f in files:
        for record in json.loads(f.read_text()):
            traces.setdefault(record["id"], []).append(record)
    return traces


def timestamps(records: list[dict]) -> dict[str, int]:
    return {ts["name"]: ts["ns"] for r in records for ts in r.get("timestamps", [])}


def assert_in_order(stamps: dict[str, int], names: list[str]) -> None:
    assert list(stamps) == names, list(stamps)
    values = [stamps[n] for n in names]
    assert values == sorted(values), stamps


CORE = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]


@pytest.fixture
def traced(tmp_path):
    srv = start_server([BUNDLED_REPO], name="kiln-trace",
                       extra_args=["--trace-config", f"triton,file={tmp_path / 'trace.json'}"])
    yield srv, tmp_path
    stop_server(srv)


def test_trace_settings_and_files(traced):
    server, tmp = traced
    trace_file = str(tmp / "trace.json")
    default = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
               "trace_file": trace_file, "trace_mode": "triton"}
    http = httpclient.InferenceServerClient(server.http_url)
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    assert http.get_trace_settings() == default
    # Byte for byte as Triton writes it: its key order, no spaces.
    raw = http_request(server.http_url, "GET", "/v2/trace/setting").body
    assert raw == json.dumps(default, separators=(",", ":")).encode(), raw
    assert http.get_trace_settings(model_name="add_sub") == default

    # Model add_sub: every request, two traces.
    answer = grpc_client.update_trace_settings(
        model_name="add_sub", settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "2"},
        as_json=True)
    assert answer["settings"]["trace_level"]["value"] == ["TIMESTAMPS"]
    assert answer["settings"]["trace_count"]["value"] == ["2"]
    assert http.get_trace_settings()["trace_level"] == ["OFF"]  # the global ones are untouched

    http.infer("add_sub", add_sub_inputs(httpclient), request_id="h1")
    grpc_client.infer("add_sub", add_sub_inputs(grpcclient), request_id="g1")
    grpc_client.infer("add_sub", add_sub_inputs(grpcclient), request_id="not traced")
    assert http.get_trace_settings(model_name="add_sub")["trace_count"] == "0"

    # The count reached, its traces go to the first numbered file.
    traces = records_by_trace(wait_for(tmp / "trace.json.0"))
    assert sorted(traces) == [1, 2], traces
    http_trace, grpc_trace = traces[1], traces[2]
    assert {"id": 1, "model_name": "add_sub", "model_version": 1, "request_id": "h1"} in http_trace
    assert {"id": 2, "model_name": "add_sub", "model_version": 1, "request_id": "g1"} in grpc_trace
    assert_in_order(timestamps(http_trace),
                    ["HTTP_RECV_START", "HTTP_RECV_END", *CORE, "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START",
                     "HTTP_SEND_END"])
    assert_in_order(timestamps(grpc_trace), ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *CORE, "INFER_RESPONSE_COMPLETE",
                                             "GRPC_SEND_START", "GRPC_SEND_END"])

    # Global: every request, two traces per numbered file. add_sub keeps its own level, rate and
    # count, and mirrors the new log frequency.
    settings = post(server, "/v2/trace/setting",
                    {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "2"}).json()
    assert settings == {**default, "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "2"}
    assert http.get_trace_settings(model_name="add_sub")["log_frequency"] == "2"
    for i in range(3):
        http.infer("add_sub", add_sub_inputs(httpclient))  # count spent: not traced
        mlp = httpclient.InferInput("INPUT0", [1, 64], "FP32")
        mlp.set_data_from_numpy(np.full((1, 64), i, dtype=np.float32))
        http.infer("mlp_classifier", [mlp], request_id=f"m{i}")
    pair = records_by_trace(wait_for(tmp / "trace.json.1"))
    assert sorted(pair) == [3, 4]
    assert [r["request_id"] for t in pair.values() for r in t if "model_name" in r] == ["m0", "m1"]
    # Replacing the setting writes what it still held (with its log frequency: numbered).
    post(server, "/v2/trace/setting", {"log_frequency": None})
    assert sorted(records_by_trace(wait_for(tmp / "trace.json.2"))) == [5]

    # TENSORS alone on add_sub, one trace: the inputs as queued and the outputs, no timestamps.
    post(server, "/v2/models/add_sub/trace/setting", {"trace_level": ["TENSORS"], "trace_count": "1"})
    http.infer("add_sub", add_sub_inputs(httpclient, value=2.5))
    tensors = records_by_trace(wait_for(tmp / "trace.json.3"))[6]
    activities = [(r["activity"], r["tensor"]["name"]) for r in tensors if "activity" in r]
    assert activities == [("TENSOR_QUEUE_INPUT", "INPUT0"), ("TENSOR_QUEUE_INPUT", "INPUT1"),
                          ("TENSOR_BACKEND_OUTPUT", "OUTPUT0"), ("TENSOR_BACKEND_OUTPUT", "OUTPUT1")]
    sums = [r["tensor"] for r in tensors if r.get("activity") == "TENSOR_BACKEND_OUTPUT"][0]
    assert sums == {"name": "OUTPUT0", "data": ",".join(["3.5"] * 16), "shape": "1,16", "dtype": "FP32"}
    assert not timestamps(tensors)

    # Without a log frequency, traces wait for the end: one more mlp trace, then stop.
    mlp = httpclient.InferInput("INPUT0", [1, 64], "FP32")
    mlp.set_data_from_numpy(np.zeros((1, 64), dtype=np.float32))
    http.infer("mlp_classifier", [mlp], request_id="last")
    assert not (tmp / "trace.json").exists()
    stop_server(server)
    last = records_by_trace(tmp / "trace.json")
    assert list(last) == [7] and any(r.get("request_id") == "last" for r in last[7])


def test_trace_setting_errors(traced):
    # Triton: server src/http_server.cc, HandleTrace (trace_file UNSUPPORTED, the level / rate / count
    # parsing, "Request for unknown model : <m>" with its space, read on main) and its gRPC twin in
    # src/grpc/grpc_server.cc (TraceSetting, "expect only 1 value for ..."); "Attempting to set invalid
    # trace setting :<reason>" server src/tracer.cc, TraceManager::UpdateTraceSetting; the parse error
    # common src/triton_json.h.
    server, _ = traced
    cases = [
        ("/v2/trace/setting", {"trace_file": "/tmp/elsewhere.json"}, 501,
         "trace file location can not be updated through network protocol"),
        ("/v2/trace/setting", {"trace_level": ["OFF", "TIMESTAMPS"]}, 400,
         "Expect only one trace level 'OFF' is specified"),
        ("/v2/trace/setting", {"trace_rate": "abc"}, 400, "Unable to parse 'trace_rate', got: abc"),
        ("/v2/trace/setting", {"trace_count": "-2"}, 400,
         "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"),
        ("/v2/trace/setting", {"trace_level": ["TIMESTAMPS"], "trace_rate": "0"}, 400,
         "Attempting to set invalid trace setting :sample rate must be non-zero"),
        ("/v2/trace/setting", {"trace_rate": 5}, 400, "expect a string for 'trace_rate'"),
        ("/v2/trace/setting", b"not json", 400, "failed to parse the request JSON buffer"),
        ("/v2/models/nope/trace/setting", {}, 400, "Request for unknown model : nope"),
    ]
    for path, doc, status, message in cases:
        r = post(server, path, doc)
        assert (r.status, r.headers["content-type"]) == (status, "application/json"), (doc, r)
        assert message in r.error(), (doc, r)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        client.update_trace_settings(settings={"trace_file": "x"})
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    with pytest.raises(InferenceServerException) as e:
        client.update_trace_settings(settings={"trace_rate": ["1", "2"]})
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "expect only 1 value for 'trace_rate'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.get_trace_settings(model_name="nope")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    # None of that changed anything.
    assert client.get_trace_settings(as_json=True)["settings"]["trace_level"]["value"] == ["OFF"]
    server.assert_alive()


@pytest.fixture
def logged(tmp_path):
    log_file = tmp_path / "kiln.log"
    srv = start_server([BUNDLED_REPO], name="kiln-logging",
                       extra_args=["--log-file", str(log_file), "--log-format", "ISO8601",
                                   "--model-control-mode", "explicit", "--load-model", "add_sub",
                                   "--allow-client-shm=true"])
    yield srv, log_file
    stop_server(srv)


ISO_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [EWI] \d+ \S+\] ")
DEFAULT_LINE = re.compile(r"^[EWI]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ \S+\] ")


def test_log_settings_change_the_log(logged):
    server, log_file = logged
    http = httpclient.InferenceServerClient(server.http_url)
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    expected = {"log_file": str(log_file), "log_info": True, "log_warning": True, "log_error": True,
                "log_verbose_level": 0, "log_format": "ISO8601"}
    assert http.get_log_settings() == expected
    raw = http_request(server.http_url, "GET", "/v2/logging").body
    assert raw == json.dumps(expected, separators=(",", ":")).encode(), raw
    lines = log_file.read_text().splitlines()
    assert any("Started HTTPService at" in line for line in lines), lines
    assert all(ISO_LINE.match(line) for line in lines), lines

    # A failed shared-memory open is a verbose (debug) message: absent at level 0, present at 1.
    # The quiet attempt comes first and the loud one is waited for: the log is written in order,
    # so once the loud line is there a quiet line would be there too (no sleep decides it).
    def open_missing_region(name):
        with pytest.raises(InferenceServerException):
            grpc_client.register_system_shared_memory(name, f"/kiln-no-such-key-{name}", 8)

    def lines_with_key(name):
        return [line for line in log_file.read_text().splitlines() if f"kiln-no-such-key-{name}" in line]

    open_missing_region("quiet")
    answer = grpc_client.update_log_settings({"log_verbose_level": 1, "log_format": "default"}, as_json=True)
    assert answer["settings"]["log_verbose_level"] == {"uint32_param": 1}
    assert answer["settings"]["log_format"] == {"string_param": "default"}
    open_missing_region("loud")
    deadline = time.monotonic() + 10
    while not lines_with_key("loud") and time.monotonic() < deadline:
        time.sleep(0.05)
    verbose = lines_with_key("loud")
    assert len(verbose) == 1 and DEFAULT_LINE.match(verbose[0]), verbose
    assert lines_with_key("quiet") == []

    # The severity switches: (un)loading logs at INFO, a failed reload warns.
    def lines_with(text):
        return [line for line in log_file.read_text().splitlines() if text in line]

    http.unload_model("add_sub")
    deadline = time.monotonic() + 10  # the instances stop in the background
    while not lines_with("successfully unloaded 'add_sub'") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lines_with("successfully unloaded 'add_sub'"), log_file.read_text()
    assert http.update_log_settings({"log_verbose_level": 0, "log_info": False}) == {
        **expected, "log_format": "default", "log_info": False}
    loaded = len(lines_with("successfully loaded 'add_sub'"))  # at start-up
    http.load_model("add_sub")
    assert len(lines_with("successfully loaded 'add_sub'")) == loaded
    bad = json.dumps({"name": "add_sub", "backend": "onnxruntime", "max_batch_size": 8,
                      "input": [{"name": "NOPE", "data_type": "TYPE_FP32", "dims": [16]}]})
    with pytest.raises(InferenceServerException):
        http.load_model("add_sub", config=bad)
    assert len(lines_with("reload failed")) == 1
    grpc_client.update_log_settings({"log_warning": False})
    with pytest.raises(InferenceServerException):
        http.load_model("add_sub", config=bad)
    assert len(lines_with("reload failed")) == 1
    assert grpc_client.get_log_settings(as_json=True)["settings"]["log_warning"] == {"bool_param": False}


def test_log_setting_errors(logged):
    server, _ = logged
    for doc, status, message in [
        ({"log_file": "/tmp/other.log"}, 501, "log file location can not be updated through network protocol"),
        ({"log_info": "false"}, 400, "expect boolean for 'log_info'"),
        ({"log_verbose_level": -1}, 400, "expect uint32 for 'log_verbose_level'"),
        ({"log_verbose_level": "1"}, 400, "expect uint32 for 'log_verbose_level'"),
        ({"log_format": "json"}, 400, "invalid argument for --log_format, got: json"),
        (b"", 400, "failed to parse the request JSON buffer"),
        # One bad value and nothing is applied, not even the good ones before it.
        ({"log_info": False, "log_error": 1}, 400, "expect boolean for 'log_error'"),
    ]:
        r = post(server, "/v2/logging", doc)
        assert (r.status, r.error().startswith(message)) == (status, True), (doc, r)
    assert http_request(server.http_url, "GET", "/v2/logging").json()["log_info"] is True
    # Over gRPC each value carries its kind; tritonclient always sends the right one, so the
    # wrong ones are built by hand.
    def request(key, kind, value):
        req = service_pb2.LogSettingsRequest()
        setattr(req.settings[key], kind, value)
        return req

    for req, code, message in [
        (request("log_file", "string_param", "x"), grpc.StatusCode.UNIMPLEMENTED,
         "log file location can not be updated through network protocol"),
        (request("log_info", "uint32_param", 1), grpc.StatusCode.INVALID_ARGUMENT, "expect boolean for 'log_info'"),
        (service_pb2.LogSettingsRequest(settings={"log_error": service_pb2.LogSettingsRequest.SettingValue()}),
         grpc.StatusCode.INVALID_ARGUMENT, "expect boolean for 'log_error'"),
        (request("log_verbose_level", "bool_param", True), grpc.StatusCode.INVALID_ARGUMENT,
         "expect int32 for 'log_verbose_level'"),
        (request("log_format", "string_param", "json"), grpc.StatusCode.INVALID_ARGUMENT,
         "invalid argument for --log_format, got: json"),
    ]:
        with pytest.raises(grpc.RpcError) as e:
            server.stub().LogSettings(req, timeout=T)
        assert (e.value.code(), e.value.details()) == (code, message), req
    assert grpcclient.InferenceServerClient(server.grpc_url).get_log_settings(as_json=True)["settings"][
        "log_info"] == {"bool_param": True}
    server.assert_alive()
