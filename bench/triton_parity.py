"""Runs tests of conformance/test_python_backend_*.py against the real Triton 2.51 (the peers'
tritonserver from PyPI's nvidia-pytriton, which has the Python backend but no ONNX Runtime
backend), on the repository their fixture serves (conformance/python_backend_models.py): what
kiln answers, checked against what Triton answers to the same models and requests.

    bench/triton_parity.sh [TEST_NAME ...]    # no names: every test that takes python_server
    bench/triton_parity.sh --json             # kiln started beside it: what both answer, compared
                                              # (REST JSON byte for byte, metrics, gRPC, streams,
                                              # bad requests, a model's life, shared memory,
                                              # sequences, versions, the cache, ensembles,
                                              # settings, traces, every count, the repository
                                              # API)

Prints PASS or FAIL (with the failing line) per test. Expected failures, each a known
difference (see bench/RESULTS.md, "Eighteenth session"): tests that use the bundled ONNX models
(Triton here has no onnxruntime backend), and kiln's deliberate extras (a stub that comes back,
clients gone noticed, BLS cancel, which Triton 2.51 lacks).
"""

import importlib
import itertools
import json
import os
import pathlib
import shutil
import sys
import time
import traceback

CONFORMANCE = pathlib.Path(__file__).resolve().parent.parent / "conformance"
# What each comparison found that is neither identical nor a known difference: (title, count). Any
# makes the run exit 1, so CI fails when kiln and Triton disagree.
OTHER: list[tuple[str, int]] = []


def disagreed(title: str, count: int) -> None:
    """Notes `count` differences of comparison `title` that no KNOWN list names."""
    if count:
        OTHER.append((title, count))
sys.path.insert(0, str(CONFORMANCE))
import python_backend_models  # noqa: E402

# The suite's tests by name, in the order pytest runs them: its files in their names' order, each
# file's tests in the file's order.
TESTS = {}
for _path in sorted(CONFORMANCE.glob("test_python_backend_*.py")):
    _module = importlib.import_module(_path.stem)
    for _name in sorted((n for n in dir(_module) if n.startswith("test_")),
                        key=lambda n: getattr(_module, n).__code__.co_firstlineno):
        TESTS[_name] = getattr(_module, _name)


# Tests of test_python_backend_*.py that fail on Triton 2.51, each for its reason (bench/RESULTS.md,
# "Eighteenth session" and "Twentieth session"): the plain run's verdict fails on any other failure.
ONNX = "uses the bundled ONNX models (add_sub, tiny_decoder): Triton here has no onnxruntime backend"
FAILS_ON_TRITON = {
    "test_a_decoupled_models_thread_calls_other_models_after_execute_returned": ONNX,
    "test_a_model_loads_unloads_and_asks_after_other_models": ONNX,
    "test_a_python_model_answers_what_the_onnx_model_answers": ONNX,
    "test_a_python_model_calls_other_models": ONNX,
    "test_an_ensemble_runs_a_python_step_then_an_onnx_one": ONNX,
    "test_a_decoupled_calls_responses_reach_the_caller_as_they_come": ONNX,
    "test_a_python_model_collects_decoupled_models_responses": ONNX,
    "test_a_model_cancels_a_decoupled_call_it_iterates": "ResponseIterator.cancel() is newer than Triton 2.51",
    "test_a_model_hears_that_its_requests_client_went_away": "kiln's own: a model hears that its client left "
                                                             "(Triton 2.51 does not notice)",
    "test_a_request_whose_client_left_while_it_waited_does_not_run": "kiln's own: a queued request whose client "
                                                                     "left is dropped (Triton runs it)",
    "test_errors_keep_their_code_and_a_dead_stub_comes_back": "kiln's own: a stub that dies is started again "
                                                              "(Triton: 'Stub process ... is not healthy.')",
    "test_an_initialize_that_raises_fails_the_load_with_its_message": "kiln's reason names the instance whose "
                                                                      "initialize failed; Triton's says 'Internal: '",
    "test_a_stateful_model_gets_its_sequences_in_order_each_on_one_instance":
        "Triton's sequence batcher pads a batch with null requests (correlation ID 0), which the model fails on",
    "test_warmup_samples_run_before_the_model_serves": "reads kiln's log line of the warmup (and py_warm_fail, "
                                                       "which Triton does not load here: triton_parity.sh)",
    "test_a_traced_decoupled_request_has_each_of_its_responses": "Triton 2.51 traces a decoupled request's "
                                                                 "first response only (TRACE_KNOWN)",
    "test_custom_series_go_with_their_metric_objects_and_their_model":
        "Triton 2.51 keeps the series of a Metric object the model deleted on /metrics (the test says the series "
        "goes 'as in Triton')",
}
# Tests that pass on Triton 2.51 in some runs and fail in others (either is accepted), each with
# what is known of why.
FLAKY_ON_TRITON = {
    "test_requests_waiting_together_go_to_one_execute_call":
        "passes alone (4 runs of 4); in the whole run Triton sometimes counts another execution of py_batch "
        "while the test reads its statistics (its batches, the test's other check, are right): not explained yet",
}
# Tests during which Triton 2.51 may die (its bugs; not every run), each with what kills it; the
# tests after it run on a Triton started again. When Triton lives, the test must pass (or be listed
# in FAILS_ON_TRITON too).
DIES_ON_TRITON = {
    "test_custom_metrics_reach_the_metrics_endpoint": "py_metrics' custom metrics: the Python backend throws "
                                                      "boost::interprocess::lock_exception in execute and "
                                                      "Triton aborts",
    "test_custom_series_go_with_their_metric_objects_and_their_model": "py_metrics' custom metrics, as above",
}
# Tests not run on Triton 2.51: it never answers them (a hung test costs PARITY_TEST_TIMEOUT).
HANGS_ON_TRITON = {
    "test_requests_a_model_reschedules_run_again_batched_with_the_others":
        "a model that reschedules a request of a model without iterative_sequence: Triton logs it and the "
        "client waits for ever",
}

def make_repo(base: pathlib.Path) -> pathlib.Path:
    """The python_server fixture's repository, made in `base`/python as the fixture makes it in
    its temporary folder, each model.py first putting the peers' site-packages (numpy,
    onnxruntime) on the path: Triton's stub ignores PYTHONPATH."""
    shutil.rmtree(base, ignore_errors=True)
    (base / "python").mkdir(parents=True)
    repo = python_backend_models.make_repository(base / "python")
    for name, (config, versions) in EXTRA_MODELS.items():
        (repo / name).mkdir()
        (repo / name / "config.pbtxt").write_text(config)
        for version, code in versions.items():
            (repo / name / version).mkdir()
            if code:
                (repo / name / version / "model.py").write_text(code)
    for model in repo.glob("*/*/model.py"):
        model.write_text("import os, sys\nsys.path.insert(0, os.environ['PEER_SITE_PACKAGES'])\n" + model.read_text())
    return repo


# Models only the comparison serves (`compare_extras`): versions, the response cache, ensembles.
VERSIONED = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("V", np.array([self.version], dtype=np.int32))])
                for _ in requests]
"""
DOUBLING = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", 2 * pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
"""
def one_step_ensemble(name: str, model: str, input_: str, output: str) -> str:
    """The config of an ensemble of one step: `model`, one INT32 [1] input and output."""
    return f"""name: "{name}"
platform: "ensemble"
input [ {{ name: "{input_}" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "{output}" data_type: TYPE_INT32 dims: [ 1 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "{model}" model_version: -1 input_map {{ key: "{input_}" value: "{input_}" }}
    output_map {{ key: "{output}" value: "{output}" }} }}
] }}
"""


EXTRA_MODELS = {
    "pversions": ("""name: "pversions"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "V" data_type: TYPE_INT32 dims: [ 1 ] } ]
version_policy { latest { num_versions: 2 } }
""", {"1": VERSIONED, "2": VERSIONED, "3": VERSIONED}),
    "pcached": ("""name: "pcached"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
response_cache { enable: true }
""", {"1": DOUBLING}),
    "pchain": ("""name: "pchain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "A2" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B2" data_type: TYPE_FP32 dims: [ 16 ] },
         { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "py_add_sub" model_version: -1
    input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
    output_map { key: "OUTPUT0" value: "SUM" } output_map { key: "OUTPUT1" value: "diff" } },
  { model_name: "py_add_sub" model_version: -1
    input_map { key: "INPUT0" value: "SUM" } input_map { key: "INPUT1" value: "diff" }
    output_map { key: "OUTPUT0" value: "A2" } output_map { key: "OUTPUT1" value: "B2" } }
] }
""", {"1": None}),
    "pfaulty_chain": (one_step_ensemble("pfaulty_chain", "py_faulty", "X", "Y"), {"1": None}),
    "pcount_chain": (one_step_ensemble("pcount_chain", "py_count", "N", "I"), {"1": None}),
}


class Triton:
    """What the tests read of a server: Triton's ports (see triton_parity.sh)."""

    def __init__(self, repo, ports):
        self.repos = [repo]
        self.http_url, self.grpc_url, self.metrics_url = (f"127.0.0.1:{p}" for p in ports)

    def assert_alive(self):
        pass


def compare_metrics(triton_metrics: str, kiln_metrics: str, models: set[str]) -> None:
    """The Prometheus families both servers write: HELP and TYPE lines, and the label sets of
    the models both serve (values differ)."""
    import re

    import requests

    def parse(base):
        text = requests.get(f"http://{base}/metrics", timeout=30).text
        meta, series = {}, set()
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                meta[(line[2:6], line.split()[2])] = line
            elif line and not line.startswith("#"):
                name_labels = line.rsplit(" ", 1)[0]
                model = re.search(r'model="([^"]*)"', name_labels)
                if model and model.group(1) in models:
                    series.add(name_labels)
        return meta, series

    (their_meta, their_series), (our_meta, our_series) = parse(triton_metrics), parse(kiln_metrics)
    families = {key[1] for key in their_meta} & {key[1] for key in our_meta}
    same = differ = 0
    for key in sorted(k for k in their_meta if k[1] in families):
        if their_meta[key] == our_meta.get(key):
            same += 1
        else:
            differ += 1
            print("DIFFER metrics", key[0], key[1])
            print("  triton:", their_meta[key])
            print("  kiln:  ", our_meta.get(key))
    family = lambda series: series.split("{")[0]  # noqa: E731
    theirs = {s for s in their_series if family(s) in families}
    ours = {s for s in our_series if family(s) in families}
    for missing in sorted(theirs - ours):
        differ += 1
        print("DIFFER metrics: only Triton writes", missing)
    for extra in sorted(ours - theirs):
        differ += 1
        print("DIFFER metrics: only kiln writes", extra)
    same += len(theirs & ours)
    only = sorted({key[1] for key in their_meta} - families)
    for key in sorted(k for k in their_meta if k[1] in only):
        print("  only Triton:", their_meta[key])
    ours_only = sorted({key[1] for key in our_meta} - families)
    print(f"metrics: {same} HELP/TYPE lines and series identical, {differ} different; "
          f"families only Triton writes: {', '.join(only) or 'none'}; "
          f"only kiln: {', '.join(ours_only) or 'none'}")
    disagreed("metrics", differ)


def stream_count(http: str, n: int, model: str = "py_count") -> None:
    """py_count's `n` responses (and the final flag) over a gRPC stream (or those of `model`, an
    ensemble of it); gRPC is the next port."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    host, port = http.rsplit(":", 1)
    client = grpcclient.InferenceServerClient(f"{host}:{int(port) + 1}")
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    x = grpcclient.InferInput("N", [1], "INT32")
    x.set_data_from_numpy(np.array([n], dtype=np.int32))
    client.async_stream_infer(model, [x], enable_empty_final_response=True)
    while True:
        result, error = answers.get(timeout=30)
        if error or result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()


def grpc_port(http: str) -> str:
    """A server's gRPC address from its REST one (the ports follow each other)."""
    host, port = http.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


def metrics_port(http: str) -> str:
    """A server's metrics address from its REST one."""
    host, port = http.rsplit(":", 1)
    return f"{host}:{int(port) + 2}"


def ensemble_config(text: str) -> str:
    """An ensemble's config JSON with each step's maps by key, and without kiln's
    `ensemble_scheduling.max_inflight_requests` when 0: Triton writes protobuf maps in its hash
    map's order, which changes from start to start, and its 2.51 protocol has no such field
    (kiln's, from later Triton releases, does). Other configs as they are."""
    try:
        config = json.loads(text)
    except ValueError:
        return text
    scheduling = config.get("ensemble_scheduling") if isinstance(config, dict) else None
    if not scheduling:
        return text
    if scheduling.get("max_inflight_requests") == 0:
        del scheduling["max_inflight_requests"]
    for step in scheduling.get("step", []):
        for key in ("input_map", "output_map"):
            step[key] = dict(sorted(step.get(key, {}).items()))
    return json.dumps(config, separators=(",", ":"))


def compare_json(triton_http: str, kiln_http: str) -> None:
    """Every model both servers have ready: metadata and `/config` byte for byte, `/stats` after
    the same requests with its times blanked (counts must agree), and `/v2`'s keys."""
    import numpy as np
    import requests
    import tritonclient.http as httpclient

    def get(base, path):
        return requests.get(f"http://{base}{path}", timeout=30)

    def blank(value):
        """Times (durations, the last inference's) as 0: the counts must agree."""
        if isinstance(value, list):
            return [blank(v) for v in value]
        if isinstance(value, dict):
            return {k: 0 if k in ("ns", "last_inference") else blank(v) for k, v in value.items()}
        return value

    def ready(base):
        index = requests.post(f"http://{base}/v2/repository/index", json={}, timeout=30).json()
        return {m["name"] for m in index if m.get("state") == "READY"}

    for base in (triton_http, kiln_http):
        client = httpclient.InferenceServerClient(base)
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        for _ in range(3):
            client.infer("py_add_sub", inputs)
        stream_count(base, 3)
        stream_count(base, 0)
    same = differ = 0
    paths = (["/v2", "/v2/repository/index", "/v2/health/live", "/v2/health/ready", "/v2/trace/setting",
              "/v2/logging", "/v2/models/py_add_sub/trace/setting", "/v2/models/py_add_sub/ready",
              "/v2/systemsharedmemory/status", "/v2/cudasharedmemory/status"]
             + [f"/v2/models/{m}{tail}" for m in sorted(ready(triton_http) & ready(kiln_http))
                for tail in ("", "/config", "/stats")])
    for path in paths:
        if path == "/v2/repository/index":
            theirs, ours = (requests.post(f"http://{base}{path}", json={}, timeout=30)
                            for base in (triton_http, kiln_http))
        else:
            theirs, ours = get(triton_http, path), get(kiln_http, path)
        if path == "/v2/repository/index":
            # Kept on purpose: kiln writes `"reason": ""` for a READY version too (MLServer's
            # RepositoryIndexResponseItem requires it; Triton leaves it out). Else the same.
            both = ready(triton_http) & ready(kiln_http)
            entries = [[{k: v for k, v in e.items() if v != "" or k != "reason"} for e in answer.json()
                        if e["name"] in both] for answer in (theirs, ours)]
            equal = entries[0] == entries[1]
            print("KNOWN /v2/repository/index: kiln adds \"reason\": \"\" to READY entries")
        elif path.endswith("/stats"):
            equal = json.dumps(blank(theirs.json())) == json.dumps(blank(ours.json()))
        elif path.startswith("/v2/health/"):
            # Kept on purpose: kiln's health answers carry {"live": true} / {"ready": true}
            # (KServe's Python client reads them); Triton's bodies are empty. Statuses agree.
            equal = theirs.status_code == ours.status_code
            print(f"KNOWN {path}: kiln answers with a JSON body, Triton with none")
        elif path == "/v2":
            # The version and the extensions differ on purpose (kiln's own, and its extras).
            equal = list(theirs.json()) == list(ours.json())
        elif path.endswith("/config") and "ensemble_scheduling" in theirs.text:
            equal = (theirs.status_code, ensemble_config(theirs.text)) == (ours.status_code, ensemble_config(ours.text))
        else:
            equal = (theirs.status_code, theirs.content) == (ours.status_code, ours.content)
        same += equal
        differ += not equal
        if not equal:
            print("DIFFER", path)
            print("  triton:", theirs.text[:1500])
            print("  kiln:  ", ours.text[:1500])
    print(f"REST JSON: {same} identical, {differ} different")
    disagreed("REST JSON", differ)
    compare_metrics(metrics_port(triton_http), metrics_port(kiln_http), ready(triton_http) & ready(kiln_http))
    compare_grpc_replies(grpc_port(triton_http), grpc_port(kiln_http), ready(triton_http) & ready(kiln_http))
    compare_grpc_answers(grpc_port(triton_http), grpc_port(kiln_http))
    compare_streams(grpc_port(triton_http), grpc_port(kiln_http))
    compare_lifecycle(triton_http, kiln_http)
    compare_rest_answers(triton_http, kiln_http)
    compare_shared_memory(triton_http, kiln_http)
    compare_sequences(triton_http, kiln_http)
    compare_extras(triton_http, kiln_http)
    compare_settings(triton_http, kiln_http)
    compare_counts(triton_http, kiln_http, ready(triton_http) & ready(kiln_http))
    # After the counts: tracing and unloading and loading models count requests too.
    compare_traces(triton_http, kiln_http)
    compare_repository(triton_http, kiln_http)
    # Last: these end Triton.
    compare_rest_answers(triton_http, kiln_http, fatal=True)


class Tally:
    """Counts one comparison's outcomes: identical, known differences (kept on purpose, printed
    with their reason), and others (printed with both answers)."""

    def __init__(self, title: str, known: dict[str, str]):
        self.title, self.known = title, known
        self.same = self.kept = self.differ = 0

    def compare(self, name: str, what: str, theirs, ours) -> None:
        if theirs == ours:
            self.same += 1
        else:
            known = name in self.known
            if known:
                self.kept += 1
                print(f"KNOWN {self.title} {name}: {self.known[name]}")
            else:
                self.differ += 1
                print(f"DIFFER {self.title} {name}: {what}")
            # PARITY_SHOW_KNOWN=1: the answers of known differences too.
            if not known or os.environ.get("PARITY_SHOW_KNOWN"):
                show = lambda answer: " ".join(  # noqa: E731
                    part.decode(errors="replace")[:3000] if isinstance(part, bytes) else str(part) for part in answer)
                print("  triton:", show(theirs))
                print("  kiln:  ", show(ours))

    def summary(self) -> None:
        print(f"{self.title}: {self.same} identical, {self.kept} known differences, {self.differ} other")
        disagreed(self.title, self.differ)


# Loaded on both servers (explicit mode) for the probes: one input each, for raw binary requests.
ECHO_MODEL = """import os, sys
sys.path.insert(0, os.environ["PEER_SITE_PACKAGES"])
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
"""
PROBE_MODELS = {
    "raw_text": {"backend": "python", "max_batch_size": 0,
                 "input": [{"name": "IN", "data_type": "TYPE_STRING", "dims": [1]}],
                 "output": [{"name": "OUT", "data_type": "TYPE_STRING", "dims": [1]}]},
    "raw_vec": {"backend": "python", "max_batch_size": 4,
                "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [-1]}],
                "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]}]},
    "raw_grid": {"backend": "python", "max_batch_size": 0,
                 "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [-1, -1]}],
                 "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1, -1]}]},
}


def load_probe_models(http: str) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(http)
    for name, config in PROBE_MODELS.items():
        client.load_model(name, config=json.dumps(dict(config, name=name)),
                          files={"file:1/model.py": ECHO_MODEL.encode()})


def rest_probes():
    """(name, method, path, body, headers) of requests whose answers (mostly refusals) both
    servers should give alike: the REST API's error statuses and texts."""
    add = "/v2/models/py_add_sub"
    row = list(range(16))

    def infer(inputs, **extra):
        return json.dumps({"inputs": inputs, **extra})

    def tensor(name="INPUT0", datatype="FP32", shape=(1, 16), data=row):
        return {"name": name, "datatype": datatype, "shape": list(shape), "data": data}

    both = [tensor("INPUT0"), tensor("INPUT1")]
    types = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES"]
    sample = {"BOOL": [True], "BYTES": ["a"], "FP16": [1.0], "FP32": [1.0], "FP64": [1.0]}
    identity = [tensor(f"IN_{t}", t, shape=(1, 1), data=sample.get(t, [1])) for t in types]
    def with_fp16(inputs):
        """Every input as JSON but FP16 (which JSON cannot carry): binary, 1.0."""
        listed = [t if t["datatype"] != "FP16" else
                  {k: v for k, v in t.items() if k != "data"} | {"parameters": {"binary_data_size": 2}}
                  for t in inputs]
        # FP16 cannot go out as JSON either: that output binary, the others JSON.
        outputs = [{"name": "OUT" + t["name"][2:], "parameters": {"binary_data": t["datatype"] == "FP16"}}
                   for t in inputs]
        header = infer(listed, outputs=outputs).encode()
        return header + b"\x00\x3c", {"Inference-Header-Content-Length": str(len(header))}

    extreme = {"UINT64": [2**64 - 1], "INT64": [-2**63], "UINT32": [2**32 - 1], "INT8": [-128], "FP32": [3.4e38],
               "FP64": [1.7976931348623157e308], "BOOL": [False]}
    j = {"Content-Type": "application/json"}
    binary = json.dumps({"inputs": [dict(tensor("INPUT0"), data=None, parameters={"binary_data_size": 64}),
                                    tensor("INPUT1")]}).replace(', "data": null', "")
    return [
        ("unknown model", "GET", "/v2/models/nope", None, {}),
        ("unknown model config", "GET", "/v2/models/nope/config", None, {}),
        ("unknown model stats", "GET", "/v2/models/nope/stats", None, {}),
        ("unknown version stats", "GET", f"{add}/versions/7/stats", None, {}),
        ("triton_ parameter", "POST", f"{add}/infer", infer(both, parameters={"triton_x": 1}), j),
        ("unknown model ready", "GET", "/v2/models/nope/ready", None, {}),
        ("unknown version", "GET", f"{add}/versions/7", None, {}),
        ("bad version", "GET", f"{add}/versions/x", None, {}),
        ("ready", "GET", f"{add}/ready", None, {}),
        ("version ready", "GET", f"{add}/versions/1/ready", None, {}),
        ("unknown path", "GET", "/v2/nope", None, {}),
        ("GET infer", "GET", f"{add}/infer", None, {}),
        ("infer unknown model", "POST", "/v2/models/nope/infer", infer(both), j),
        ("garbage body", "POST", f"{add}/infer", "garbage", j),
        ("empty body", "POST", f"{add}/infer", "", j),
        ("no inputs", "POST", f"{add}/infer", "{}", j),
        ("inputs not a list", "POST", f"{add}/infer", '{"inputs": 3}', j),
        ("missing input", "POST", f"{add}/infer", infer([tensor("INPUT0")]), j),
        ("unknown input", "POST", f"{add}/infer", infer(both + [tensor("EXTRA")]), j),
        ("wrong datatype", "POST", f"{add}/infer", infer([tensor("INPUT0", "INT32"), tensor("INPUT1")]), j),
        ("unknown datatype", "POST", f"{add}/infer", infer([tensor("INPUT0", "FP99"), tensor("INPUT1")]), j),
        ("wrong shape", "POST", f"{add}/infer", infer([tensor(shape=(1, 15), data=row[:15]), tensor("INPUT1")]), j),
        ("too few elements", "POST", f"{add}/infer", infer([tensor(data=row[:15]), tensor("INPUT1")]), j),
        ("too many elements", "POST", f"{add}/infer", infer([tensor(data=row + [1]), tensor("INPUT1")]), j),
        ("batch too large", "POST", f"{add}/infer",
         infer([tensor(shape=(9, 16), data=row * 9), tensor("INPUT1", shape=(9, 16), data=row * 9)]), j),
        ("batches disagree", "POST", f"{add}/infer",
         infer([tensor(shape=(2, 16), data=row * 2), tensor("INPUT1")]), j),
        ("negative dim", "POST", f"{add}/infer", infer([tensor(shape=(-1, 16)), tensor("INPUT1")]), j),
        ("string data for FP32", "POST", f"{add}/infer", infer([tensor(data=["a"] * 16), tensor("INPUT1")]), j),
        ("no data", "POST", f"{add}/infer", infer([{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]},
                                                   tensor("INPUT1")]), j),
        ("unknown output", "POST", f"{add}/infer", infer(both, outputs=[{"name": "NOPE"}]), j),
        ("binary size without data", "POST", f"{add}/infer", binary, j),
        ("header length past body", "POST", f"{add}/infer", infer(both),
         {"Inference-Header-Content-Length": "100000"}),
        ("bad priority", "POST", f"{add}/infer", infer(both, parameters={"priority": "high"}), j),
        ("bad timeout", "POST", f"{add}/infer", infer(both, parameters={"timeout": -5}), j),
        ("sequence without id", "POST", "/v2/models/py_accumulate/infer",
         infer([tensor("X", shape=(1, 1), data=[1.0])]), j),
        ("sequence never started", "POST", "/v2/models/py_accumulate/infer",
         infer([tensor("X", shape=(1, 1), data=[1.0])], parameters={"sequence_id": 4242}), j),
        ("decoupled over REST", "POST", "/v2/models/py_count/infer",
         infer([tensor("N", "INT32", shape=(1,), data=[1])]), j),
        ("load unknown model", "POST", "/v2/repository/models/nope/load", "", j),
        ("unload unknown model", "POST", "/v2/repository/models/nope/unload", "", j),
        ("index garbage", "POST", "/v2/repository/index", "garbage", j),
        ("trace settings unknown model", "GET", "/v2/models/nope/trace/setting", None, {}),
        ("log settings bad body", "POST", "/v2/logging", '{"log_verbose_level": "x"}', j),
        ("system shm status unknown region", "GET", "/v2/systemsharedmemory/region/nope/status", None, {}),
        ("register shm bad key", "POST", "/v2/systemsharedmemory/region/r/register",
         '{"key": "/no_such_region", "offset": 0, "byte_size": 64}', j),
        # Good requests: the whole response body (JSON numbers, strings, binary outputs).
        ("add_sub JSON", "POST", f"{add}/infer",
         infer([tensor(data=[i / 3 for i in range(16)]), tensor("INPUT1", data=[1e-7 * i for i in range(16)])],
               id="req-1"), j),
        ("add_sub one output binary", "POST", f"{add}/infer",
         infer(both, outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}]), j),
        ("add_sub all binary", "POST", f"{add}/infer", infer(both, parameters={"binary_data_output": True}), j),
        ("add_sub classification", "POST", f"{add}/infer",
         infer(both, outputs=[{"name": "OUTPUT0", "parameters": {"classification": 3}}]), j),
        ("identity every type", "POST", "/v2/models/py_identity/infer", *with_fp16(identity)),
        ("identity extremes", "POST", "/v2/models/py_identity/infer",
         *with_fp16([dict(t, data=extreme.get(t["datatype"], t["data"])) for t in identity])),
        ("echo strings", "POST", "/v2/models/py_echo/infer",
         infer([tensor("TEXT", "BYTES", shape=(3,), data=["héllo", "", "a \"quoted\" \\ line\n"])]), j),
        ("echo parameters in order", "POST", "/v2/models/py_echo/infer",
         infer([tensor("TEXT", "BYTES", shape=(1,), data=["p"])],
               parameters={"zeta": 1, "alpha": "x", "mid": True, "beta": 0.5, "priority": 1}), j),
        # Several inputs wrong: which one the answer names (Triton's hash map order).
        ("both FP64", "POST", f"{add}/infer", infer([tensor("INPUT0", "FP64"), tensor("INPUT1", "FP64")]), j),
        ("both FP64, reversed", "POST", f"{add}/infer", infer([tensor("INPUT1", "FP64"), tensor("INPUT0", "FP64")]), j),
        ("five of thirteen", "POST", "/v2/models/py_identity/infer", infer(identity[:5]), j),
        ("thirteen and one more", "POST", "/v2/models/py_identity/infer",
         infer(identity + [tensor("EXTRA", "INT8", shape=(1, 1), data=[1])]), j),
        ("thirteen all INT8", "POST", "/v2/models/py_identity/infer",
         infer([dict(t, datatype="INT8", data=[1]) for t in identity if t["datatype"] != "INT8"]
               + [t for t in identity if t["datatype"] == "INT8"]), j),
        ("raw string", "POST", "/v2/models/raw_text/infer", b"hello", {"Inference-Header-Content-Length": "0"}),
        ("raw empty string", "POST", "/v2/models/raw_text/infer", b"", {}),
        ("raw string, variable dims", "POST", "/v2/models/py_echo/infer", b"hello",
         {"Inference-Header-Content-Length": "0"}),
        ("raw floats", "POST", "/v2/models/raw_vec/infer", b"\0" * 12, {"Inference-Header-Content-Length": "0"}),
        ("raw floats, partial element", "POST", "/v2/models/raw_vec/infer", b"\0" * 10,
         {"Inference-Header-Content-Length": "0"}),
        ("raw floats, two variable dims", "POST", "/v2/models/raw_grid/infer", b"\0" * 8,
         {"Inference-Header-Content-Length": "0"}),
        ("raw to a model of two inputs", "POST", f"{add}/infer", b"\0" * 64, {"Inference-Header-Content-Length": "0"}),
        # The front end's own answers, whatever the backend (conformance/test_http_wire.py freezes them).
        *front_end_probes(add, infer, tensor, both, identity, with_fp16, j),
        # Last: Triton 2.51 aborts on it (kiln refuses it, 400).
        ("huge shape", "POST", f"{add}/infer",
         infer([tensor(shape=(9223372036854775807, 16)), tensor("INPUT1")]), j),
    ]


def front_end_probes(add, infer, tensor, both, identity, with_fp16, j):
    """REST requests the HTTP front end answers before any backend has them: routes and methods,
    encodings, the binary extension's sizes, shapes and JSON data it cannot read (the texts
    conformance/test_http_wire.py and test_grpc_errors.py freeze, on a Python model)."""
    import gzip
    import struct

    body = infer(both).encode()
    binary = json.dumps({"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 16],
                                     "parameters": {"binary_data_size": 64}} for n in ("INPUT0", "INPUT1")]})
    sized = lambda size: json.dumps({"inputs": [  # noqa: E731
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": size}},
        tensor("INPUT1")]})
    row = struct.pack("<16f", *range(16))
    length = lambda header: {"Inference-Header-Content-Length": str(len(header))}  # noqa: E731
    swap = lambda datatype, data: [dict(t, data=data) if t["datatype"] == datatype else t for t in identity]  # noqa: E731
    return [
        ("root path", "GET", "/", None, {}),
        ("models path", "GET", "/v2/models", None, {}),
        ("past infer", "GET", f"{add}/infer/x", None, {}),
        ("POST /v2", "POST", "/v2", "", j),
        ("PUT live", "PUT", "/v2/health/live", "", j),
        ("DELETE a model", "DELETE", add, None, {}),
        ("GET index", "GET", "/v2/repository/index", None, {}),
        ("infer unknown version", "POST", f"{add}/versions/4/infer", infer(both), j),
        ("infer bad version", "POST", f"{add}/versions/x/infer", infer(both), j),
        ("named repository", "POST", "/v2/repository/x/models/py_add_sub/unload", "{}", j),
        ("cuda shm register", "POST", "/v2/cudasharedmemory/region/r/register", "{}", j),
        ("cuda shm status", "GET", "/v2/cudasharedmemory/region/r/status", None, {}),
        ("gzip body", "POST", f"{add}/infer", gzip.compress(body), {**j, "Content-Encoding": "gzip"}),
        ("unsupported encoding", "POST", f"{add}/infer", body, {**j, "Content-Encoding": "br"}),
        ("not gzip", "POST", f"{add}/infer", b"not gzip", {**j, "Content-Encoding": "gzip"}),
        ("header length one past", "POST", f"{add}/infer", body,
         {"Inference-Header-Content-Length": str(len(body) + 1)}),
        ("header length negative", "POST", f"{add}/infer", body, {"Inference-Header-Content-Length": "-1"}),
        ("header length not a number", "POST", f"{add}/infer", body, {"Inference-Header-Content-Length": "ten"}),
        ("binary size past the body", "POST", f"{add}/infer", sized(2**40).encode() + row, length(sized(2**40))),
        ("binary size of 2^64-1", "POST", f"{add}/infer", sized(2**64 - 1).encode() + row,
         length(sized(2**64 - 1))),
        ("extra binary data", "POST", f"{add}/infer", binary.encode() + row * 2 + b"\0", length(binary)),
        ("data and binary size", "POST", f"{add}/infer",
         infer([dict(tensor("INPUT0"), parameters={"binary_data_size": 64}), tensor("INPUT1")]), j),
        ("body a JSON array", "POST", f"{add}/infer", "[]", j),
        ("shape past int64", "POST", f"{add}/infer", infer([tensor(shape=(2**64 - 1,)), tensor("INPUT1")]), j),
        ("nested data", "POST", f"{add}/infer",
         infer([tensor(data=[list(range(16))]), tensor("INPUT1", data=[list(range(16))])]), j),
        # The other inputs good (FP16 binary), so that the answer is about this one.
        ("INT8 out of range", "POST", "/v2/models/py_identity/infer", *with_fp16(swap("INT8", [300]))),
        ("BOOL as a number", "POST", "/v2/models/py_identity/infer", *with_fp16(swap("BOOL", [1]))),
        ("FP16 as JSON", "POST", "/v2/models/py_identity/infer", infer(swap("FP16", [1.0])), j),
    ]


# Differences kept on purpose (bench/RESULTS.md, "Nineteenth session").
MALFORMED = "400, not Triton's 500 (its JSON reader's errors are INTERNAL): the client's mistake"
WORDED = MALFORMED + "; kiln's own words (naming the input) where Triton's are rapidjson's"
KNOWN = {
    "garbage body": MALFORMED,
    "index garbage": MALFORMED,
    "no inputs": WORDED,
    "inputs not a list": WORDED,
    "too few elements": MALFORMED + "; kiln adds the input's name",
    "too many elements": MALFORMED + "; kiln adds the input's name",
    "string data for FP32": WORDED,
    "bad priority": WORDED,
    "bad timeout": WORDED,
    "log settings bad body": WORDED,
    "huge shape": "Triton 2.51 aborts (the process dies); kiln refuses it, 400",
    "add_sub JSON": "FP32 data: kiln writes the shortest digits that read back as the same FP32 (0.33333343), "
                    "Triton the value widened to double (0.33333343267440798); the same FP32 values",
    "identity extremes": "FP32 digits, as 'add_sub JSON'",
    "BOOL as a number": WORDED,
    "INT8 out of range": "Triton 2.51 wraps the number into the type (300 runs as 44); kiln refuses it, 400 naming "
                         "the input and the value",
    "shape past int64": "Triton 2.51 dies (the process is gone); kiln refuses it, 400 'Unable to parse 'shape''",
    "body a JSON array": WORDED,
    "not gzip": "Triton 2.51 answers a body it cannot inflate as an empty one (a raw request); kiln: 400 "
                "'failed to decompress the request body'",
    "header length not a number": "Triton 2.51 reads it as 0 (atoi: a raw request); kiln refuses it, 400 naming "
                                  "the header",
    "cuda shm register": "Triton here is a GPU build (no GPU): 400, the body's first missing field; kiln answers "
                         "as a build without GPU support, 501",
}


def lifecycle_probes():
    """(name, method, path, body) REST calls, in order, that load, unload and use a model of
    their own: what both servers answer as the model's life goes on."""
    import base64

    config = dict(PROBE_MODELS["raw_vec"], name="probe_life")
    model_py = base64.b64encode(ECHO_MODEL.encode()).decode()
    raising = base64.b64encode(ECHO_MODEL.split("class ")[0].encode()
                               + b"class TritonPythonModel:\n    def initialize(self, args):\n"
                               b"        raise RuntimeError('cannot start')\n").decode()
    load = "/v2/repository/models/probe_life/load"
    body = lambda **parameters: json.dumps({"parameters": parameters})  # noqa: E731
    infer = json.dumps({"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})
    return [
        ("load without files", "POST", load, ""),
        ("config not JSON", "POST", load, body(config="{nope")),
        ("config not a string", "POST", load, json.dumps({"parameters": {"config": 5}})),
        ("file not base64", "POST", load, body(config=json.dumps(config), **{"file:1/model.py": "%%%"})),
        ("file without config", "POST", load, body(**{"file:1/model.py": model_py})),
        ("load", "POST", load, body(config=json.dumps(config), **{"file:1/model.py": model_py})),
        ("infer", "POST", "/v2/models/probe_life/infer", infer),
        ("index entry", "POST", "/v2/repository/index", "{}"),
        ("unload", "POST", "/v2/repository/models/probe_life/unload", ""),
        ("infer after unload", "POST", "/v2/models/probe_life/infer", infer),
        ("ready after unload", "GET", "/v2/models/probe_life/ready", None),
        ("metadata after unload", "GET", "/v2/models/probe_life", None),
        ("unload again", "POST", "/v2/repository/models/probe_life/unload", ""),
        ("load a model that raises", "POST", load, body(config=json.dumps(config), **{"file:1/model.py": raising})),
        ("ready after a failed load", "GET", "/v2/models/probe_life/ready", None),
        ("infer after a failed load", "POST", "/v2/models/probe_life/infer", infer),
    ]


# Lifecycle differences kept on purpose (bench/RESULTS.md, "Nineteenth session").
LIFECYCLE_KNOWN = {
    "config not JSON": "Triton's 500 'failed to load ..., failed to poll from model repository', and kiln's "
                       "reason after it (': Invalid config override: ...')",
    "config not a string": "400 'Config parameter 'config' must have string type for its value'; Triton: 500, "
                           "rapidjson's words",
    "file not base64": "400 naming the bad parameter; Triton decodes what it can and loads that",
    "file without config": "400 'Load parameter 'config' must be specified for model file override'; Triton: "
                           "500 'failed to poll'",
    "index entry": "a model loaded from files sent with the load request is in kiln's index; Triton's index "
                   "lists the repository's directories only",
    "load a model that raises": "kiln's reason names the instance whose initialize failed, Triton's says "
                                "'Internal: '; the files' temporary directories differ anyway",
}


def sequence_probes():
    """(name, method, path, body) REST calls, in order, to py_accumulate (a running total per
    sequence; START and a UINT64 CORRID control): sequences started, continued, ended, misused,
    and the model's statistics after."""
    def step(x, **parameters):
        body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [x]}]}
        if parameters:
            body["parameters"] = parameters
        return "POST", "/v2/models/py_accumulate/infer", json.dumps(body)

    return [
        # One sequence at a time: each has the instance's first slot.
        ("start", *step(1, sequence_id=71, sequence_start=True)),
        ("continue", *step(2, sequence_id=71)),
        ("end", *step(4, sequence_id=71, sequence_end=True)),
        ("continue after the end", *step(5, sequence_id=71)),
        ("start and end at once", *step(8, sequence_id=73, sequence_start=True, sequence_end=True)),
        ("end one never started", *step(9, sequence_id=74, sequence_end=True)),
        ("id zero", *step(1, sequence_id=0, sequence_start=True, sequence_end=True)),
        ("negative id", *step(1, sequence_id=-3, sequence_start=True, sequence_end=True)),
        ("start without an id", *step(1, sequence_start=True)),
        ("end without an id", *step(1, sequence_end=True)),
        ("batch of two", "POST", "/v2/models/py_accumulate/infer", json.dumps(
            {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 1], "data": [1, 2]}],
             "parameters": {"sequence_id": 75, "sequence_start": True}})),
        ("start while live", *step(6, sequence_id=76, sequence_start=True)),
        ("start it again", *step(7, sequence_id=76, sequence_start=True)),
        ("end it", *step(1, sequence_id=76, sequence_end=True)),
        ("statistics", "GET", "/v2/models/py_accumulate/stats", None),
        # Two live at once.
        ("first of two", *step(1, sequence_id=81, sequence_start=True)),
        ("second of two", *step(10, sequence_id=82, sequence_start=True)),
        ("the first goes on", *step(2, sequence_id=81)),
        ("the second ends", *step(20, sequence_id=82, sequence_end=True)),
        ("the first ends", *step(3, sequence_id=81, sequence_end=True)),
        # Last: Triton runs it (a slot taken and freed), kiln refuses it.
        ("string id", *step(1, sequence_id="abc", sequence_start=True, sequence_end=True)),
    ]


def blank_times(value):
    """`value` (JSON) with every "ns" and "last_inference" zeroed: times differ run to run."""
    if isinstance(value, dict):
        return {k: 0 if k in ("ns", "last_inference") else blank_times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [blank_times(v) for v in value]
    return value


def compare_sequences(triton_http: str, kiln_http: str) -> None:
    """`sequence_probes` on both servers: status and body (statistics with times blanked). The
    instances a model's answers name are lettered in the order each server's answers first name
    them: which of its instances Triton 2.51 gives the first free sequence slot changes from one
    start to the next (its instances load in parallel), the order of the others follows."""
    import re

    letters = {}

    def letter(side, text):
        names = letters.setdefault(side, {})
        return re.sub(r"py_accumulate_0_\d+", lambda m: names.setdefault(m.group(0), "ABCDEFGH"[len(names)]), text)

    compare_calls("sequences", SEQUENCE_KNOWN, sequence_probes(), triton_http, kiln_http, rewrite=letter)


def compare_counts(triton_http: str, kiln_http: str, models: set[str]) -> None:
    """After every probe: the counts both servers keep of `models`' requests (statistics and
    Prometheus counters), which say how each refusal and failure was counted."""
    import requests

    counters = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                "nv_inference_exec_count")

    def counts(http):
        text = requests.get(f"http://{metrics_port(http)}/metrics", timeout=30).text
        found = {}
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if series.split("{")[0] in counters and any(f'model="{m}"' in series for m in models):
                found[series] = value
        for entry in requests.get(f"http://{http}/v2/models/stats", timeout=30).json()["model_stats"]:
            if entry["name"] in models:
                stats = entry["inference_stats"]
                found[f"stats {entry['name']}"] = (
                    entry["inference_count"], entry["execution_count"],
                    {k: v["count"] for k, v in stats.items() if v["count"]})
        return found

    theirs, ours = counts(triton_http), counts(kiln_http)
    keys = sorted(set(theirs) | set(ours))
    model = lambda key: key.split()[1] if key.startswith("stats ") else key.split('model="')[1].split('"')[0]  # noqa: E731
    tally = Tally("counts after the probes", {k: COUNT_KNOWN[model(k)] for k in keys if model(k) in COUNT_KNOWN})
    for key in keys:
        tally.compare(key, "", (theirs.get(key),), (ours.get(key),))
    tally.summary()


# Count differences kept on purpose, by model: probes one server runs and the other refuses.
COUNT_KNOWN = {
    "pfaulty_chain": "Triton counts each failed ensemble request twice; kiln once",
    "py_add_sub": "kiln refuses two requests Triton runs: 'infer out past its offset' (shared memory) and "
                  "'more raw entries' (gRPC)",
    "py_accumulate": "kiln refuses 'string id' (sequences), which Triton runs",
    "py_identity": "kiln refuses 'INT8 out of range' (REST answers), which Triton runs",
    "py_echo": "two BYTES requests whose strings do not match their shape ('bytes fewer than the shape', 'bytes "
               "typed count mismatch', gRPC): Triton 2.51 finds it in the backend and counts a BACKEND failure; "
               "kiln refuses them before the scheduler, as Triton core's later ValidateBytesInputs does (counted "
               "nowhere). The answers are the same",
}


def extra_probes():
    """(name, method, path, body) REST calls, in order, to the models only the comparison serves
    (`EXTRA_MODELS`): a model's versions, the response cache, ensembles."""
    def infer(model, inputs, version=None):
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        return "POST", path, json.dumps({"inputs": inputs})

    x = lambda value, datatype="INT32": [{"name": "X", "datatype": datatype, "shape": [1], "data": [value]}]  # noqa: E731
    row = [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": list(range(16))} for n in ("A", "B")]
    return [
        ("versions metadata", "GET", "/v2/models/pversions", None),
        ("version 1 ready", "GET", "/v2/models/pversions/versions/1/ready", None),
        ("version 2 ready", "GET", "/v2/models/pversions/versions/2/ready", None),
        ("version 3 ready", "GET", "/v2/models/pversions/versions/3/ready", None),
        ("version 1 metadata", "GET", "/v2/models/pversions/versions/1", None),
        ("version 2 metadata", "GET", "/v2/models/pversions/versions/2", None),
        ("infer the latest", *infer("pversions", x(1))),
        ("infer version 2", *infer("pversions", x(1), 2)),
        ("infer version 1", *infer("pversions", x(1), 1)),
        ("versions statistics", "GET", "/v2/models/pversions/stats", None),
        ("version 2 statistics", "GET", "/v2/models/pversions/versions/2/stats", None),
        ("version 1 statistics", "GET", "/v2/models/pversions/versions/1/stats", None),
        ("versions config", "GET", "/v2/models/pversions/config", None),
        ("version 2 config", "GET", "/v2/models/pversions/versions/2/config", None),
        ("cache miss", *infer("pcached", x(1.5, "FP32"))),
        ("cache hit", *infer("pcached", x(1.5, "FP32"))),
        ("cache another miss", *infer("pcached", x(2.5, "FP32"))),
        ("cache statistics", "GET", "/v2/models/pcached/stats", None),
        ("ensemble metadata", "GET", "/v2/models/pchain", None),
        ("ensemble config", "GET", "/v2/models/pchain/config", None),
        ("ensemble infer", *infer("pchain", row)),
        ("ensemble wrong shape", *infer("pchain", [dict(row[0], shape=[1, 8], data=list(range(8))), row[1]])),
        ("ensemble missing input", *infer("pchain", row[:1])),
        ("ensemble statistics", "GET", "/v2/models/pchain/stats", None),
        ("failing step runs", *infer("pfaulty_chain", x(5))),
        ("failing step refuses", *infer("pfaulty_chain", x(1))),
        ("failing step raises", *infer("pfaulty_chain", x(2))),
        ("failing step statistics", "GET", "/v2/models/pfaulty_chain/stats", None),
        ("decoupled model over REST", *infer("py_count", [{"name": "N", "datatype": "INT32", "shape": [1],
                                                             "data": [2]}])),
        ("decoupled ensemble over REST", *infer("pcount_chain", [{"name": "N", "datatype": "INT32", "shape": [1],
                                                                   "data": [2]}])),
        ("decoupled ensemble statistics", "GET", "/v2/models/pcount_chain/stats", None),
    ]


def compare_extras(triton_http: str, kiln_http: str) -> None:
    """`extra_probes` on both servers: status and body (statistics with times blanked)."""
    rewrite = lambda side, text: ensemble_config(text)  # noqa: E731
    compare_calls("versions, cache, ensembles", EXTRA_KNOWN, extra_probes(), triton_http, kiln_http, rewrite)


# Differences kept on purpose in `extra_probes`.
ENSEMBLE_PARAMETERS = ("Triton's ensemble response carries its steps' sequence parameters (sequence_id 0, "
                       "sequence_start and sequence_end false; in REST once per ensemble output, as duplicate "
                       "JSON keys); kiln's has none")
EXTRA_KNOWN = {
    "ensemble infer": ENSEMBLE_PARAMETERS,
    "failing step runs": ENSEMBLE_PARAMETERS,
    "failing step statistics": "Triton counts each failed ensemble request twice (fail 4 after 2 failures); "
                               "kiln once",
}


def settings_probes():
    """(name, method, path, body) REST calls, in order, that read and change the trace and log
    settings, globally and for one model, then put them back."""
    trace, model_trace, logging = "/v2/trace/setting", "/v2/models/py_add_sub/trace/setting", "/v2/logging"
    post = lambda path, **body: ("POST", path, json.dumps(body))  # noqa: E731
    return [
        ("trace rate", *post(trace, trace_rate="10")),
        ("trace count", *post(trace, trace_count="5")),
        ("log frequency", *post(trace, log_frequency="2")),
        ("trace level", *post(trace, trace_level=["TIMESTAMPS"])),
        ("trace rate as a number", *post(trace, trace_rate=10)),
        ("trace level not a list", *post(trace, trace_level="TIMESTAMPS")),
        ("trace level unknown", *post(trace, trace_level=["LOUD"])),
        ("unknown trace setting", *post(trace, trace_speed="1")),
        ("model trace rate", *post(model_trace, trace_rate="20")),
        ("model trace settings", "GET", model_trace, None),
        ("model trace rate cleared", *post(model_trace, trace_rate=None)),
        ("model trace settings after", "GET", model_trace, None),
        ("trace settings", "GET", trace, None),
        ("trace off again", *post(trace, trace_level=["OFF"], trace_rate="1000", trace_count="-1",
                                  log_frequency="0")),
        ("log verbose", *post(logging, log_verbose_level=1)),
        ("log info off", *post(logging, log_info=False)),
        ("log format", *post(logging, log_format="ISO8601")),
        ("log format unknown", *post(logging, log_format="fancy")),
        ("log verbose negative", *post(logging, log_verbose_level=-1)),
        ("log info as a string", *post(logging, log_info="no")),
        ("unknown log setting", *post(logging, log_colour=True)),
        ("log settings", "GET", logging, None),
        ("log settings back", *post(logging, log_verbose_level=0, log_info=True, log_format="default")),
    ]


def compare_settings(triton_http: str, kiln_http: str) -> None:
    """`settings_probes` on both servers: status and body."""
    compare_calls("trace and log settings", SETTINGS_KNOWN, settings_probes(), triton_http, kiln_http)


def trace_probes():
    """(name, call(http)) requests traced on both servers, one after the other: py_add_sub over
    REST, gRPC and a gRPC stream, an ensemble of two Python steps, a decoupled model on a gRPC
    stream, a model's call to another (BLS, passing its trace on), a request refused, a model's
    error response, a cached model's miss and hit."""
    import queue

    import numpy as np
    import requests
    import tritonclient.grpc as grpcclient

    row = list(range(16))

    def generate_stream(model, body):
        def call(http):
            answer = requests.post(f"http://{http}/v2/models/{model}/generate_stream", json=body, timeout=30)
            assert answer.ok, answer.text
        return call

    def rest(model, inputs, ok=True, times=1):
        def call(http):
            body = {"id": "traced", "inputs": inputs}
            for _ in range(times):
                answer = requests.post(f"http://{http}/v2/models/{model}/infer", json=body, timeout=30)
                assert answer.ok == ok, answer.text
        return call

    def grpc_add_sub(stream):
        def call(http):
            client = grpcclient.InferenceServerClient(grpc_port(http))
            inputs = []
            for name in ("INPUT0", "INPUT1"):
                tensor = grpcclient.InferInput(name, [1, 16], "FP32")
                tensor.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
                inputs.append(tensor)
            if stream:
                answers = queue.Queue()
                client.start_stream(callback=lambda result, error: answers.put(error))
                client.async_stream_infer("py_add_sub", inputs, request_id="traced")
                assert answers.get(timeout=30) is None
                client.stop_stream()
            else:
                client.infer("py_add_sub", inputs, request_id="traced")
            client.close()
        return call

    tensors = lambda *names: [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": row} for n in names]  # noqa: E731
    return [
        ("REST request", rest("py_add_sub", tensors("INPUT0", "INPUT1"))),
        ("gRPC request", grpc_add_sub(stream=False)),
        ("gRPC stream request", grpc_add_sub(stream=True)),
        ("ensemble", rest("pchain", tensors("A", "B"))),
        ("decoupled stream", lambda http: stream_count(http, 2)),
        ("decoupled ensemble stream", lambda http: stream_count(http, 2, "pcount_chain")),
        ("decoupled generate_stream", generate_stream("py_count", {"N": 2})),
        ("BLS call", rest("py_timeouts", [{"name": "X", "datatype": "INT32", "shape": [1], "data": [0]}])),
        ("refused request", rest("py_add_sub", [{"name": n, "datatype": "FP32", "shape": [1, 15], "data": row[:15]}
                                                for n in ("INPUT0", "INPUT1")], ok=False)),
        ("model error", rest("py_faulty", [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}], ok=False)),
        ("cache miss and hit", rest("pcached", [{"name": "X", "datatype": "FP32", "shape": [1], "data": [4242]}],
                                    times=2)),
    ]


def trace_records(directory: pathlib.Path) -> tuple:
    """What the trace files in `directory` (`trace.json.<n>`) hold, as compared: how many files,
    then each trace as its records without its id and times, sorted (the order in which a server
    writes a trace's records is its own; tools order them by time), a step naming its parent by
    the parent's model; the traces sorted."""
    files = sorted(directory.glob("trace.json.*"), key=lambda f: int(f.suffix[1:]))
    traces = {}
    for file in files:
        for record in json.loads(file.read_text() or "[]"):
            record = dict(record)
            if "timestamps" in record:
                record["timestamps"] = [stamp["name"] for stamp in record["timestamps"]]
            traces.setdefault(record.pop("id"), []).append(record)
    models = {id: record["model_name"] for id, records in traces.items() for record in records if "model_name" in record}
    for records in traces.values():
        for record in records:
            if "parent_id" in record:
                record["parent_id"] = models.get(record["parent_id"], "?")
    return (f"{len(files)} files", *sorted(json.dumps(sorted(map(json.dumps, records))) for records in traces.values()))


def sampling_probes():
    """(name, call(http), settings) which of several requests a rate or a count traces: REST
    requests to py_add_sub with ids 1, 2, ..."""
    import requests

    def several(count):
        def call(http):
            for i in range(1, count + 1):
                body = {"id": str(i), "inputs": [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": list(range(16))}
                                                  for n in ("INPUT0", "INPUT1")]}
                requests.post(f"http://{http}/v2/models/py_add_sub/infer", json=body, timeout=30).raise_for_status()
        return call

    return [
        ("rate 3 of 7 requests", several(7), {"trace_rate": "3", "trace_level": ["TIMESTAMPS"]}),
        ("count 2 of 3 requests", several(3), {"trace_count": "2", "trace_level": ["TIMESTAMPS"]}),
        ("log frequency 2 of 5 requests", several(5), {"log_frequency": "2", "trace_level": ["TIMESTAMPS"]}),
    ]


# The traces each server writes for a probe of `trace_probes` or `sampling_probes` before its
# settings change (Triton's, kiln's; one each when not named): a trace is written once its request
# and responses are released, after the client has its answer.
TRACES_WRITTEN = {
    "ensemble": (3, 3), "decoupled ensemble stream": (2, 2), "BLS call": (2, 2), "refused request": (0, 1),
    "cache miss and hit": (2, 2), "rate 3 of 7 requests": (2, 2), "count 2 of 3 requests": (2, 2),
    # The fifth trace waits for the settings to change, in a group of its own.
    "log frequency 2 of 5 requests": (4, 4),
}


def written(directory: pathlib.Path, count: int) -> None:
    """Waits (at most 60 s) until the trace files in `directory` hold `count` traces, each file
    whole: what ends the wait is the traces themselves, never a time without news."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ids = set()
        try:
            for file in directory.glob("trace.json.*"):
                ids.update(record["id"] for record in json.loads(file.read_text() or "[]"))
        except ValueError:  # a file being written
            pass
        else:
            if len(ids) >= count:
                return
        time.sleep(0.05)
    print(f"    {directory}: fewer than {count} traces written within 60 s")


def compare_traces(triton_http: str, kiln_http: str) -> None:
    """`trace_probes` traced (TIMESTAMPS and TENSORS, every request, a file per trace) on both
    servers, which write `trace.json` in their own working directories (PARITY_TRACES: Triton's,
    kiln's), then `sampling_probes` with their settings: the rate and count the settings answer
    after, and the files compared as `trace_records` has them."""

    import requests

    directories = [pathlib.Path(d) for d in os.environ["PARITY_TRACES"].split(",")]
    on = {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1", "trace_count": "-1", "log_frequency": "1"}
    off = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0"}
    tally = Tally("traces", TRACE_KNOWN)
    for name, call, settings in [(*probe, {}) for probe in trace_probes()] + sampling_probes():
        answers = []
        for http, directory in zip((triton_http, kiln_http), directories):
            for old in directory.glob("trace.json*"):
                old.unlink()
            requests.post(f"http://{http}/v2/trace/setting", json={**on, **settings}, timeout=30).raise_for_status()
            call(http)
            written(directory, TRACES_WRITTEN.get(name, (1, 1))[http == kiln_http])
            answers.append(tuple(requests.get(f"http://{http}/v2/trace/setting", timeout=30).json()[key]
                                 for key in ("trace_rate", "trace_count")))
            requests.post(f"http://{http}/v2/trace/setting", json=off, timeout=30).raise_for_status()
            answers[-1] += trace_records(directory)
        tally.compare(name, "", answers[0], answers[1])
        if answers[0] != answers[1] and name not in TRACE_KNOWN:
            for theirs, ours in itertools.zip_longest(*answers):
                if theirs != ours:
                    print("    triton:", theirs)
                    print("    kiln:  ", ours)
    tally.summary()


# Trace differences kept on purpose.
TRACE_KNOWN = {
    "decoupled stream": "Triton 2.51 traces a decoupled request's outputs only until its request is released (here "
                        "the first response's) and records one INFER_RESPONSE_COMPLETE on a gRPC stream; kiln each "
                        "response's outputs and one INFER_RESPONSE_COMPLETE per response (the final flag alone too: "
                        "3 for N=2), as it traces generation requests",
    "decoupled ensemble stream": "Triton 2.51 records one INFER_RESPONSE_COMPLETE on a gRPC stream (the first "
                                 "response's) and the decoupled step's outputs only until the step's request is "
                                 "released (none, or the first response's); kiln one per response and all the "
                                 "step's outputs",
    "decoupled generate_stream": "Triton 2.51 writes no outputs for a generate_stream request; kiln each response's",
    "refused request": "Triton 2.51 writes no trace for a request refused before its model has it (a wrong shape); "
                       "kiln writes what it did: the protocol's stamps, REQUEST_START, REQUEST_END and the error "
                       "response's INFER_RESPONSE_COMPLETE and send",
    "cache miss and hit": "Triton 2.51 writes a cache miss's outputs twice (as the model made them and as it cached "
                          "them); kiln once. The hit is the same: QUEUE_START and the cached outputs, no compute",
}


class Collector:
    """An OTLP/HTTP trace collector on `port`: keeps the spans (with their scope) and resources it
    is sent, protobuf or JSON (Triton 2.51 sends JSON)."""

    def __init__(self, port: int):
        import http.server
        import threading

        from google.protobuf.json_format import Parse
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self.spans, self.resources, self.lock = [], [], threading.Lock()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = trace_service_pb2.ExportTraceServiceRequest()
                if "json" in (self.headers.get("Content-Type") or ""):
                    Parse(body, request, ignore_unknown_fields=True)
                else:
                    request.ParseFromString(body)
                with collector.lock:
                    for resource_spans in request.resource_spans:
                        collector.resources.append(resource_spans.resource)
                        for scope_spans in resource_spans.scope_spans:
                            collector.spans.extend((scope_spans.scope, span) for span in scope_spans.spans)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, count: int) -> list:
        """The spans sent, once there are `count` (at most 60 s): what ends the wait is the spans
        a probe makes (OTEL_SPANS), never a time without news (a server may export one
        request's spans in two batches)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.spans) >= count:
                    break
            time.sleep(0.05)
        else:
            print(f"    collector: fewer than {count} spans within 60 s")
        with self.lock:
            spans, self.spans = self.spans, []
        return spans


# The spans each server sends for a probe of `trace_probes` (Triton's, kiln's): a request, its
# compute and its model's span, and for an ensemble or a BLS call those of its steps.
OTEL_SPANS = {
    "REST request": (3, 3), "gRPC request": (3, 3), "gRPC stream request": (3, 3), "ensemble": (6, 6),
    "decoupled stream": (3, 3), "decoupled ensemble stream": (4, 4), "decoupled generate_stream": (3, 3),
    "BLS call": (5, 5), "refused request": (0, 2), "model error": (3, 3), "cache miss and hit": (5, 5),
}


def otel_spans(spans: list, ordered: bool = True) -> tuple:
    """Spans as compared: each as its name, kind, events (in order, or sorted when not `ordered`),
    attributes (the trace ids as the model the id is of, 0 kept) and the name of its parent span
    ("-" for a root, "caller" for one whose parent came with the request); sorted."""
    from google.protobuf.json_format import MessageToDict

    by_id = {span.span_id: span for _, span in spans}
    models = {}
    for _, span in spans:
        for a in span.attributes:
            if a.key.endswith("trace_id") and a.key != "triton.trace_parent_id":
                models[a.value.int_value] = span.name
    shown = []
    for _, span in spans:
        attributes = {}
        for a in span.attributes:
            value = MessageToDict(a.value)
            if a.key in ("triton.trace_id", "triton.trace_parent_id") and a.value.int_value:
                value = models.get(a.value.int_value, "?")
            attributes[a.key] = value
        parent = by_id[span.parent_span_id].name if span.parent_span_id in by_id else (
            "caller" if span.parent_span_id else "-")
        shown.append(json.dumps({"name": span.name, "kind": span.kind, "parent": parent,
                                 "events": [e.name for e in span.events] if ordered else sorted(e.name for e in span.events),
                                 "attributes": attributes}))
    return tuple(sorted(shown))


def compare_otel(triton_http: str, kiln_http: str, ports: str) -> None:
    """Triton's `opentelemetry` trace mode on both servers (started so, each exporting to a
    collector of its own on `ports`): `trace_probes` traced one at a time, their spans compared
    as `otel_spans` has them; then the resource and the instrumentation scope."""
    import requests

    collectors = [Collector(int(port)) for port in ports.split(",")]
    servers = (triton_http, kiln_http)
    for http in servers:
        requests.post(f"http://{http}/v2/trace/setting", json={"trace_rate": "1"}, timeout=30).raise_for_status()
    tally = Tally("OpenTelemetry spans", OTEL_KNOWN)
    scopes = [set(), set()]
    for name, call in trace_probes():
        answers = []
        for index, (http, collector) in enumerate(zip(servers, collectors)):
            call(http)
            spans = collector.take(OTEL_SPANS[name][index])
            scopes[index].update(f"{scope.name} {scope.version}".strip() for scope, _ in spans)
            answers.append(otel_spans(spans, ordered=name not in OTEL_UNORDERED))
        tally.compare(name, "", answers[0], answers[1])
    resources = [sorted(f"{a.key}={a.value.string_value}" for r in c.resources[:1] for a in r.attributes)
                 for c in collectors]
    tally.compare("resource and scope", "", (*resources[0], *sorted(scopes[0])), (*resources[1], *sorted(scopes[1])))
    tally.summary()
    for collector in collectors:
        collector.server.shutdown()


# Probes whose span events are compared as a set: their order races on either server. A
# generate_stream's last event (the final flag alone, INFER_RESPONSE_COMPLETE with nothing to send)
# and the send of the response before it happen on two tasks, in either order (the same builds
# agreed in earlier runs and not in a CI rehearsal's).
OTEL_UNORDERED = {"decoupled generate_stream"}

# OpenTelemetry differences kept on purpose.
OTEL_KNOWN = {
    "decoupled stream": TRACE_KNOWN["decoupled stream"],
    "decoupled ensemble stream": TRACE_KNOWN["decoupled ensemble stream"],
    "refused request": "Triton 2.51 traces no request refused before its model has it; kiln does",
    "resource and scope": "kiln names itself (service.name kiln, as its --id, which server metadata answers; scope "
                          "kiln and its version) and writes no telemetry.sdk.* (its exporter is its own); Triton: "
                          "triton-inference-server, triton-server, opentelemetry-cpp's telemetry.sdk.*. kiln sends "
                          "OTLP protobuf, Triton 2.51 OTLP JSON: collectors take both",
}


# Differences kept on purpose in `settings_probes`.
SETTINGS_WORDED = "400 naming the setting and the type it takes, not Triton's 500 (its JSON reader's words)"
SETTINGS_KNOWN = {
    "trace rate as a number": SETTINGS_WORDED,
    "trace level not a list": SETTINGS_WORDED,
    "log verbose negative": SETTINGS_WORDED,
    "log info as a string": SETTINGS_WORDED,
    "trace level unknown": "kiln refuses an unknown trace level, 400 naming the levels; Triton turns tracing off "
                           "and answers 200",
    "unknown trace setting": "kiln refuses an unknown setting, 400 naming the settings; Triton ignores it",
    "log format unknown": "400, not Triton's 503 (UNAVAILABLE, which tells a client to try again); the same words",
}


def repository_probes():
    """(name, method, path, body) REST calls, in order, of the repository API on the models only
    the comparison serves: unload, index states, load again, a config override, dependents; and
    (method METRICS, path the model) the models' series on /metrics before and after."""
    repo = "/v2/repository"
    index = ("POST", f"{repo}/index", "{}")
    body = lambda **parameters: json.dumps({"parameters": parameters})  # noqa: E731
    override = json.dumps({"name": "pcached", "backend": "python",
                           "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
                           "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}]})
    return [
        ("ready index", "POST", f"{repo}/index", json.dumps({"ready": True})),
        ("series before unload", "METRICS", "pversions", None),
        ("unload versions", "POST", f"{repo}/models/pversions/unload", ""),
        ("index after unload", *index),
        ("ready after unload", "GET", "/v2/models/pversions/ready", None),
        ("series after unload", "METRICS", "pversions", "gone"),
        ("load versions again", "POST", f"{repo}/models/pversions/load", ""),
        ("index after load", *index),
        ("series after load", "METRICS", "pversions", None),
        ("series before a reload", "METRICS", "pcached", None),
        ("override a config", "POST", f"{repo}/models/pcached/load", body(config=override)),
        ("series after a reload", "METRICS", "pcached", None),
        ("overridden config", "GET", "/v2/models/pcached/config", None),
        ("load the repository's config again", "POST", f"{repo}/models/pcached/load", ""),
        ("config again", "GET", "/v2/models/pcached/config", None),
        ("unload an ensemble's step", "POST", f"{repo}/models/py_faulty/unload", ""),
        ("the ensemble after", "GET", "/v2/models/pfaulty_chain/ready", None),
        ("the ensemble's metadata after", "GET", "/v2/models/pfaulty_chain", None),
        ("the ensemble's statistics after", "GET", "/v2/models/pfaulty_chain/stats", None),
        ("index with the step unloaded", *index),
        ("infer the ensemble after", "POST", "/v2/models/pfaulty_chain/infer",
         json.dumps({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [5]}]})),
        ("load the step again", "POST", f"{repo}/models/py_faulty/load", ""),
        ("unload with dependents", "POST", f"{repo}/models/py_count/unload", body(unload_dependents=True)),
        ("index after unloading dependents", *index),
        ("load the decoupled step again", "POST", f"{repo}/models/py_count/load", ""),
        ("load the ensemble again", "POST", f"{repo}/models/pcount_chain/load", ""),
        ("unknown model unload", "POST", f"{repo}/models/nope/unload", ""),
        ("unknown model load", "POST", f"{repo}/models/nope/load", ""),
    ]


# The models whose index entries the repository probes compare (not the steps they unload, which
# both servers may still be unloading).
EXTRA_NAMES = ("pversions", "pcached", "pchain", "pfaulty_chain", "pcount_chain")


def compare_repository(triton_http: str, kiln_http: str) -> None:
    """`repository_probes` on both servers: status and body (index answers: the entries of the
    models involved)."""
    def entries(side, text):
        try:
            index = json.loads(text)
        except ValueError:
            return text
        if not isinstance(index, list):
            return text
        return json.dumps([e for e in index if e.get("name") in EXTRA_NAMES])

    compare_calls("repository API", REPOSITORY_KNOWN, repository_probes(), triton_http, kiln_http, entries)


# Differences kept on purpose in `repository_probes`.
REPOSITORY_KNOWN = {
    "series after unload": "Triton 2.51 leaves a model's nv_inference_request_failure series on /metrics when it "
                           "unloads (its reporter takes the other families away); kiln takes them all",
    "config again": "a load without a config after one with an override: kiln loads the repository's config "
                    "again; Triton keeps the override (its files did not change)",
}


# REST probes after which Triton 2.51 is gone (the first one run ends it: the other is not answered).
FATAL = {"huge shape", "shape past int64"}


# Sequence differences kept on purpose.
SEQUENCE_KNOWN = {
    "string id": "a string correlation ID for a model whose CORRID control is UINT64: kiln refuses it, 400; "
                 "Triton runs it with the string's serialized bytes read as the number (27974191445704707)",
    "negative id": "400 'Unable to parse 'sequence_id'', not Triton's 500 (its JSON reader's words)",
}


# The per-model families `model_series` reads, with their values (the others: whether present;
# not kiln's nv_model_load_duration_secs, which Triton 2.51 does not have).
COUNTED = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
           "nv_inference_exec_count", "nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model")
PRESENT = ("nv_inference_pending_request_count", "nv_inference_request_duration_us",
           "nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us",
           "nv_cache_hit_duration_per_model")


def model_series(http: str, model: str, until_gone: bool = False) -> str:
    """The series of `model` on a server's /metrics: counts with their values, the others by name
    (their values are times), sorted. `until_gone`: read again for up to 20 s until there are
    none but failure counts (an unload answers before the model is gone, in Triton as in kiln;
    Triton 2.51 keeps the failure counts: REPOSITORY_KNOWN)."""
    import requests

    deadline = time.monotonic() + 20
    while True:
        text = requests.get(f"http://{metrics_port(http)}/metrics", timeout=30).text
        found = []
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            family = series.split("{")[0]
            if f'model="{model}"' in series and family in COUNTED + PRESENT:
                found.append(f"{series} {value}" if family in COUNTED else series)
        lasting = [series for series in found if not series.startswith("nv_inference_request_failure")]
        if not (until_gone and lasting and time.monotonic() < deadline):
            return "\n".join(sorted(found)) or "(none)"
        time.sleep(0.2)


def compare_calls(title: str, known: dict[str, str], calls, triton_http: str, kiln_http: str,
                  rewrite=lambda side, text: text) -> None:
    """Each of `calls` ((name, method, path, body), in order) to both servers: status and body
    compared (the index: probe_life's entry; statistics: times blanked), each body through
    `rewrite(side, text)` first."""
    import requests

    tally = Tally(title, known)
    for name, method, path, body in calls:
        answers = []
        for base, side in ((triton_http, "triton"), (kiln_http, "kiln")):
            if method == "METRICS":
                answers.append((200, model_series(base, path, until_gone=body == "gone")))
                continue
            answer = requests.request(method, f"http://{base}{path}", data=body, timeout=120)
            text = answer.text.strip()
            if path.endswith("/index"):
                text = json.dumps([e for e in answer.json() if e["name"] == "probe_life"])
            elif path.endswith("/stats") and answer.ok:
                text = json.dumps(blank_times(answer.json()))
            answers.append((answer.status_code, rewrite(side, text)))
        tally.compare(name, f"{method} {path}", *answers)
    tally.summary()


def compare_lifecycle(triton_http: str, kiln_http: str) -> None:
    """`lifecycle_probes` on both servers: status and body (the index: probe_life's entry)."""
    compare_calls("model lifecycle", LIFECYCLE_KNOWN, lifecycle_probes(), triton_http, kiln_http)


def compare_rest_answers(triton_http: str, kiln_http: str, fatal: bool = False) -> None:
    """Each of `rest_probes` to both servers: status and body compared; the differences kept
    on purpose are listed as KNOWN, the others as DIFFER with both answers. `fatal`: only the
    probes that end Triton (`FATAL`), else all the others."""
    import requests

    if not fatal:
        for base in (triton_http, kiln_http):
            load_probe_models(base)
    tally = Tally("REST answers to requests that end Triton" if fatal else "REST answers to bad requests", KNOWN)
    for name, method, path, body, headers in rest_probes():
        if (name in FATAL) != fatal:
            continue
        answers = []
        for base in (triton_http, kiln_http):
            try:
                answer = requests.request(method, f"http://{base}{path}", data=body, headers=headers, timeout=30)
                answers.append((answer.status_code, answer.content.strip()))
            except requests.RequestException as error:
                answers.append((0, f"no answer: {type(error).__name__}".encode()))
        tally.compare(name, f"{method} {path}", *answers)
    tally.summary()


def shared_memory_probes(keys: dict[str, str]):
    """(name, method, path, body) REST calls, in order, that register system shared memory
    regions (in object A, 256 bytes: py_add_sub's INPUT0, INPUT1, OUTPUT0, OUTPUT1 in turn; in
    object B, 8 KiB: a region from 4096 on), infer through them, misuse them and unregister
    them. `keys`: the objects' keys."""
    region = "/v2/systemsharedmemory/region"

    def register(name, key="A", offset=0, size=256, **fields):
        body = {"key": keys[key], "offset": offset, "byte_size": size} | fields
        return "POST", f"{region}/{name}/register", json.dumps({k: v for k, v in body.items() if v is not None})

    def shm(name, at, size=64, region_name="io"):
        parameters = {"shared_memory_region": region_name, "shared_memory_byte_size": size}
        if at:
            parameters["shared_memory_offset"] = at
        return {"name": name, "parameters": parameters}

    def infer(inputs=None, outputs=None):
        inputs = inputs or [shm("INPUT0", 0), shm("INPUT1", 64)]
        for tensor in inputs:
            tensor.update(datatype="FP32", shape=[1, 16])
        body = {"inputs": inputs} | ({} if outputs is None else {"outputs": outputs})
        return "POST", "/v2/models/py_add_sub/infer", json.dumps(body)

    binary = shm("OUTPUT0", 128)
    binary["parameters"]["binary_data"] = True
    return [
        ("status before", "GET", "/v2/systemsharedmemory/status", None),
        ("register past the end", *register("io", offset=128)),
        ("register", *register("io")),
        ("register again", *register("io")),
        ("register a page on", *register("part", key="B", offset=4096, size=4096)),
        ("register without key", "POST", f"{region}/x/register", json.dumps({"byte_size": 64})),
        ("register without byte size", *register("x", size=None)),
        ("register a list", "POST", f"{region}/x/register", "[1]"),
        ("status", "GET", "/v2/systemsharedmemory/status", None),
        ("status of one", "GET", f"{region}/part/status", None),
        ("infer in and out", *infer(outputs=[shm("OUTPUT0", 128), shm("OUTPUT1", 192)])),
        ("infer in, out as JSON", *infer()),
        ("infer out to the page", *infer(outputs=[shm("OUTPUT0", 0, region_name="part")])),
        ("infer out past its offset", *infer(outputs=[shm("OUTPUT0", 4096, region_name="part")])),
        ("output region too small", *infer(outputs=[shm("OUTPUT0", 128, size=32)])),
        ("output past the region", *infer(outputs=[shm("OUTPUT0", 224)])),
        ("input past the region", *infer([shm("INPUT0", 224), shm("INPUT1", 64)])),
        ("input byte size wrong", *infer([shm("INPUT0", 0, size=60), shm("INPUT1", 64)])),
        ("input region unknown", *infer([shm("INPUT0", 0, region_name="nope"), shm("INPUT1", 64)])),
        ("input with data too", *infer([dict(shm("INPUT0", 0), data=list(range(16))), shm("INPUT1", 64)])),
        ("binary output to shm", *infer(outputs=[binary])),
        ("classified output to shm", *infer(outputs=[dict(shm("OUTPUT0", 128), parameters=dict(
            shm("OUTPUT0", 128)["parameters"], classification=2))])),
        ("gRPC status", "gRPC", "SystemSharedMemoryStatus", {}),
        ("gRPC register again", "gRPC", "SystemSharedMemoryRegister",
         {"name": "io", "key": keys["A"], "byte_size": 256}),
        ("gRPC infer in and out", "gRPC", "ModelInfer", grpc_shm_infer(["OUTPUT0", 128, 64], ["OUTPUT1", 192, 64])),
        ("gRPC output too small", "gRPC", "ModelInfer", grpc_shm_infer(["OUTPUT0", 128, 32])),
        ("gRPC classified output to shm", "gRPC", "ModelInfer",
         grpc_shm_infer(["OUTPUT0", 128, 64, {"classification": 2}])),
        ("unregister one", "POST", f"{region}/part/unregister", ""),
        ("unregister it again", "POST", f"{region}/part/unregister", ""),
        ("infer after unregister", *infer(outputs=[shm("OUTPUT0", 0, region_name="part")])),
        ("register the same key again", *register("again")),
        ("register an unaligned offset", *register("odd", key="B", offset=100, size=64)),
        ("unregister all", "POST", "/v2/systemsharedmemory/unregister", ""),
        ("status after", "GET", "/v2/systemsharedmemory/status", None),
    ]


def grpc_shm_infer(*outputs):
    """A ModelInferRequest (as a dict) to py_add_sub with its inputs from region "io" (0 and 64)
    and `outputs` ([name, offset, byte size, other parameters]) to it."""
    def shm(offset, size, **more):
        parameters = {"shared_memory_region": {"string_param": "io"},
                      "shared_memory_byte_size": {"int64_param": size}}
        if offset:
            parameters["shared_memory_offset"] = {"int64_param": offset}
        return parameters | {k: {"int64_param": v} for k, v in more.items()}

    return {"model_name": "py_add_sub",
            "inputs": [{"name": name, "datatype": "FP32", "shape": [1, 16], "parameters": shm(at, 64)}
                       for name, at in (("INPUT0", 0), ("INPUT1", 64))],
            "outputs": [{"name": name, "parameters": shm(at, size, **(more[0] if more else {}))}
                        for name, at, size, *more in outputs]}


def compare_shared_memory(triton_http: str, kiln_http: str) -> None:
    """`shared_memory_probes` on both servers, each with objects of its own (the same region
    names, its own keys): answers compared, and after each call the outputs' bytes."""
    import struct
    from multiprocessing import shared_memory

    import requests

    objects = {}
    inputs = struct.pack("<32f", *range(16), *([2.0] * 16)) + bytes(128)
    try:
        for side in ("triton", "kiln"):
            objects[side] = {"A": shared_memory.SharedMemory(name=f"kiln_parity_a_{side}", create=True, size=256),
                             "B": shared_memory.SharedMemory(name=f"kiln_parity_b_{side}", create=True, size=8192)}
            objects[side]["A"].buf[:] = inputs
        tally = Tally("shared memory", SHARED_MEMORY_KNOWN)
        calls = {side: shared_memory_probes({k: f"/{o.name}" for k, o in made.items()})
                 for side, made in objects.items()}
        for index, (name, *_) in enumerate(calls["triton"]):
            answers = []
            for base, side in ((triton_http, "triton"), (kiln_http, "kiln")):
                _, method, path, body = calls[side][index]
                if method == "gRPC":
                    status, text = grpc_call(grpc_port(base), path, body)
                else:
                    answer = requests.request(method, f"http://{base}{path}", data=body, timeout=30)
                    status, text = answer.status_code, answer.text.strip()
                for made in objects[side].values():
                    text = text.replace(made.name, "<key>")
                # Both objects whole (a write out of place shows), then as they were.
                a, b = objects[side]["A"].buf, objects[side]["B"].buf
                answers.append((status, text, bytes(a).hex(), bytes(b).hex()))
                a[:], b[:] = inputs, bytes(len(b))
            tally.compare(name, "", *answers)
        tally.summary()
    finally:
        for made in objects.values():
            for region in made.values():
                region.close()
                region.unlink()


def grpc_call(url: str, method: str, fields: dict) -> tuple[str, str]:
    """`method` of the inference service called with a request made of `fields`: its status
    code's name and the reply (as protobuf text on one line) or the error's details."""
    import grpc
    from google.protobuf import json_format
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(url))
    request = json_format.ParseDict(fields, getattr(service_pb2, f"{method}Request")())
    try:
        return "OK", str(getattr(stub, method)(request, timeout=30)).replace("\n", " ")
    except grpc.RpcError as error:
        return error.code().name, error.details()


# Shared memory differences kept on purpose.
SHARED_MEMORY_KNOWN = {
    "register the same key again": "Triton reuses the descriptor of the region registered with that key, "
                                   "which it has closed (a FIXME in its code): 500 'Invalid shared memory "
                                   "region'; kiln registers it",
    "infer out to the page": "a region that starts 4096 bytes into its object: kiln writes the output there; "
                             "Triton 2.51 answers 200 and writes it into the other region's object (over "
                             "io's inputs), nothing into its own",
    "infer out past its offset": "an offset past the region's end (4096 in a region of 4096 bytes): kiln "
                                 "refuses it; Triton checks offsets as if they counted from the object's start "
                                 "and answers 200 (its write lands in neither object)",
    "register an unaligned offset": "Triton maps the region at its offset, which mmap refuses unless it is a "
                                    "multiple of the page size: 400 'unable to process address space'; kiln "
                                    "maps the object and registers any offset within it",
}


class U64(int):
    """A parameter sent as `uint64_param`."""


class F64(float):
    """A parameter sent as `double_param`."""


def grpc_probes():
    """(name, method, request) gRPC calls whose answers (mostly refusals) both servers should
    give alike: status codes and texts."""
    import struct

    from tritonclient.grpc import service_pb2 as pb

    def tensor(name="INPUT0", datatype="FP32", shape=(1, 16), **contents):
        t = pb.ModelInferRequest().InferInputTensor(name=name, datatype=datatype, shape=list(shape))
        for field, values in contents.items():
            getattr(t.contents, field).extend(values)
        return t

    row = [float(i) for i in range(16)]
    raw = struct.pack("<16f", *row)

    def infer(model="py_add_sub", inputs=None, raw_contents=None, **fields):
        inputs = [tensor("INPUT0"), tensor("INPUT1")] if inputs is None else inputs
        request = pb.ModelInferRequest(model_name=model, inputs=inputs, **fields)
        if raw_contents is None and all(not t.HasField("contents") for t in inputs):
            raw_contents = [raw] * len(inputs)
        request.raw_input_contents.extend(raw_contents or [])
        return request

    def with_params(request, **params):
        for key, value in params.items():
            field = {str: "string_param", int: "int64_param", bool: "bool_param", U64: "uint64_param",
                     F64: "double_param"}[type(value)]
            setattr(request.parameters[key], field, value)
        return request

    def echo(raw_contents, shape=(1,)):
        """py_echo's one BYTES input (dims [-1]) of `shape`, its raw bytes `raw_contents`."""
        return infer("py_echo", [tensor("TEXT", "BYTES", shape=shape)], raw_contents)

    seq = infer("py_accumulate", [tensor("X", shape=(1, 1))], [struct.pack("<f", 1.0)])
    return [
        ("infer unknown model", "ModelInfer", infer("nope")),
        ("infer unknown version", "ModelInfer", infer(model_version="7")),
        ("infer bad version", "ModelInfer", infer(model_version="x")),
        ("no inputs", "ModelInfer", infer(inputs=[], raw_contents=[])),
        ("missing input", "ModelInfer", infer(inputs=[tensor("INPUT0")])),
        ("unknown input", "ModelInfer", infer(inputs=[tensor("INPUT0"), tensor("INPUT1"), tensor("EXTRA")])),
        ("wrong datatype", "ModelInfer", infer(inputs=[tensor("INPUT0", "INT32"), tensor("INPUT1")])),
        ("unknown datatype", "ModelInfer", infer(inputs=[tensor("INPUT0", "FP99"), tensor("INPUT1")])),
        ("wrong shape", "ModelInfer", infer(inputs=[tensor(shape=(1, 15)), tensor("INPUT1")],
                                            raw_contents=[raw[:60], raw])),
        ("raw size mismatch", "ModelInfer", infer(raw_contents=[raw[:60], raw])),
        ("short data and wrong shape", "ModelInfer",
         infer(inputs=[tensor(), tensor("INPUT1", shape=(1, 15))], raw_contents=[raw[:60], raw[:60]])),
        ("both FP64", "ModelInfer", infer(inputs=[tensor(datatype="FP64"), tensor("INPUT1", "FP64")],
                                          raw_contents=[raw * 2, raw * 2])),
        ("fewer raw entries", "ModelInfer", infer(raw_contents=[raw])),
        ("more raw entries", "ModelInfer", infer(raw_contents=[raw, raw, raw])),
        ("typed count mismatch", "ModelInfer",
         infer(inputs=[tensor(fp32_contents=row[:15]), tensor("INPUT1", fp32_contents=row)])),
        ("typed and raw", "ModelInfer",
         infer(inputs=[tensor(fp32_contents=row), tensor("INPUT1")], raw_contents=[raw])),
        ("typed wrong field", "ModelInfer",
         infer(inputs=[tensor(int_contents=[1] * 16), tensor("INPUT1", fp32_contents=row)])),
        ("no data", "ModelInfer", infer(raw_contents=[])),
        ("batch too large", "ModelInfer",
         infer(inputs=[tensor(shape=(9, 16)), tensor("INPUT1", shape=(9, 16))], raw_contents=[raw * 9] * 2)),
        ("negative dim", "ModelInfer", infer(inputs=[tensor(shape=(-1, 16)), tensor("INPUT1")])),
        ("unknown output", "ModelInfer",
         infer(outputs=[pb.ModelInferRequest().InferRequestedOutputTensor(name="NOPE")])),
        ("priority as string", "ModelInfer", with_params(infer(), priority="high")),
        ("negative priority", "ModelInfer", with_params(infer(), priority=-1)),
        ("priority as uint64", "ModelInfer", with_params(infer(), priority=U64(1))),
        ("timeout as string", "ModelInfer", with_params(infer(), timeout="soon")),
        ("timeout as uint64", "ModelInfer", with_params(infer(), timeout=U64(1000))),
        ("sequence_id as bool", "ModelInfer", with_params(infer(), sequence_id=True)),
        ("sequence_id as uint64", "ModelInfer", with_params(infer(), sequence_id=U64(5))),
        ("sequence_start as int", "ModelInfer", with_params(infer(), sequence_start=1)),
        ("sequence_end as string", "ModelInfer", with_params(infer(), sequence_end="yes")),
        ("custom double", "ModelInfer", with_params(infer(), custom=F64(0.5))),
        ("custom uint64", "ModelInfer", with_params(infer(), custom=U64(5))),
        ("reserved triton_ key", "ModelInfer", with_params(infer(), triton_x=1)),
        ("empty final response as int", "ModelInfer", with_params(infer(), triton_enable_empty_final_response=1)),
        ("sequence without id", "ModelInfer", seq),
        ("sequence never started", "ModelInfer", with_params(infer("py_accumulate", [tensor("X", shape=(1, 1))],
                                                                   [struct.pack("<f", 1.0)]), sequence_id=4242)),
        ("decoupled over ModelInfer", "ModelInfer",
         infer("py_count", [tensor("N", "INT32", shape=(1,))], [struct.pack("<i", 1)])),
        ("metadata unknown model", "ModelMetadata", pb.ModelMetadataRequest(name="nope")),
        ("metadata unknown version", "ModelMetadata", pb.ModelMetadataRequest(name="py_add_sub", version="7")),
        ("config unknown model", "ModelConfig", pb.ModelConfigRequest(name="nope")),
        ("ready unknown model", "ModelReady", pb.ModelReadyRequest(name="nope")),
        ("stats unknown model", "ModelStatistics", pb.ModelStatisticsRequest(name="nope")),
        ("stats unknown version", "ModelStatistics", pb.ModelStatisticsRequest(name="py_add_sub", version="7")),
        ("stats bad version", "ModelStatistics", pb.ModelStatisticsRequest(name="py_add_sub", version="x")),
        ("stats unknown model and version", "ModelStatistics", pb.ModelStatisticsRequest(name="nope", version="1")),
        ("stats of a model that failed", "ModelStatistics", pb.ModelStatisticsRequest(name="py_broken")),
        ("load unknown model", "RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="nope")),
        ("unload unknown model", "RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="nope")),
        ("index of a named repository", "RepositoryIndex", pb.RepositoryIndexRequest(repository_name="r")),
        ("shm status unknown region", "SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name="nope")),
        ("shm register bad key", "SystemSharedMemoryRegister",
         pb.SystemSharedMemoryRegisterRequest(name="r", key="/no_such_region", byte_size=64)),
        ("trace settings unknown model", "TraceSetting", pb.TraceSettingRequest(model_name="nope")),
        ("empty model name", "ModelInfer", infer("")),
        ("negative version", "ModelInfer", infer(model_version="-1")),
        ("metadata bad version", "ModelMetadata", pb.ModelMetadataRequest(name="py_add_sub", version="x")),
        ("cuda shm register", "CudaSharedMemoryRegister", pb.CudaSharedMemoryRegisterRequest(name="r")),
        ("bytes length past the end", "ModelInfer", echo([struct.pack("<I", 16) + b"abc"])),
        ("bytes length absurd", "ModelInfer", echo([struct.pack("<I", 2**32 - 1) + b"abc"])),
        ("bytes length truncated", "ModelInfer", echo([b"\x01\x00"])),
        ("bytes fewer than the shape", "ModelInfer", echo([struct.pack("<I", 1) + b"a"], shape=(2,))),
        ("bytes more than the shape", "ModelInfer", echo([struct.pack("<I", 1) + b"a" * 2], shape=(1,))),
        ("bytes typed count mismatch", "ModelInfer",
         infer("py_echo", [tensor("TEXT", "BYTES", shape=(3,), bytes_contents=[b"a", b"b"])])),
        # Not a method of the service, and a body that is not a request: gRPC's own answers.
        ("unknown method", "/inference.GRPCInferenceService/NoSuchRpc", b""),
        ("unknown service", "/no.such.Service/Call", b""),
        ("garbage body", "/inference.GRPCInferenceService/ModelInfer", b"\xff\xff\xff\xff\x0f\x0a"),
        # Last: Triton 2.51 may abort on it.
        ("huge shape", "ModelInfer", infer(inputs=[tensor(shape=(9223372036854775807, 16)), tensor("INPUT1")])),
    ]


# BYTES data whose framing is broken, over gRPC: Triton 2.51's gRPC front end refuses it in its own
# words ("incomplete string data ...", "incomplete string length indicator ..."); kiln answers with
# Triton core's later check, InferenceRequest::ValidateBytesInputs ("element byte size indicator
# exceeds the end of the buffer", its input_byte_size_test), which later front ends leave it to.
BYTES_FRAMING = ("Triton 2.51's gRPC front end words it ('incomplete string data/length indicator'); kiln: "
                 "Triton core's later 'element byte size indicator exceeds the end of the buffer'")
# gRPC differences kept on purpose (bench/RESULTS.md, "Nineteenth session").
GRPC_KNOWN = {
    "unknown datatype": "kiln refuses an unknown datatype as it decodes the request, naming it; Triton "
                        "reads it as INVALID and refuses it later as a datatype mismatch",
    "more raw entries": "kiln refuses raw_input_contents that match no input; Triton ignores them",
    "cuda shm register": KNOWN["cuda shm register"] + " (gRPC: INVALID_ARGUMENT 'invalid args' / UNIMPLEMENTED)",
    "bytes length past the end": BYTES_FRAMING,
    "bytes length absurd": BYTES_FRAMING,
    "bytes length truncated": BYTES_FRAMING,
    "bytes more than the shape": BYTES_FRAMING,
    "garbage body": "gRPC's own answer, INTERNAL in both: Triton (gRPC C++) 'Unable to parse request', kiln "
                    "tonic's decoder's words",
    "huge shape": KNOWN["huge shape"],
}


def compare_grpc_replies(triton_grpc: str, kiln_grpc: str, models: set[str]) -> None:
    """The answers to good calls, as parsed messages: metadata, config and statistics (times
    blanked) of every model both serve, the index entries of those, settings, shared memory."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    def blank(message):
        """Durations and the last inference time as 0: the counts must agree."""
        for field, value in message.ListFields():
            if field.name in ("ns", "last_inference"):
                message.ClearField(field.name)
            elif field.message_type is not None:
                if field.message_type.GetOptions().map_entry:
                    for entry in value.values():
                        blank(entry) if hasattr(entry, "ListFields") else None
                elif not hasattr(value, "ListFields"):  # a repeated field
                    for item in value:
                        blank(item)
                else:
                    blank(value)
        return message

    calls = [("ServerLive", pb.ServerLiveRequest()), ("ServerReady", pb.ServerReadyRequest()),
             ("TraceSetting", pb.TraceSettingRequest()), ("LogSettings", pb.LogSettingsRequest()),
             ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest()),
             ("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest())]
    for model in sorted(models):
        calls += [("ModelReady", pb.ModelReadyRequest(name=model)),
                  ("ModelMetadata", pb.ModelMetadataRequest(name=model)),
                  ("ModelConfig", pb.ModelConfigRequest(name=model)),
                  ("ModelStatistics", pb.ModelStatisticsRequest(name=model))]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(url)) for url in (triton_grpc, kiln_grpc)]
    same = differ = 0
    for method, request in calls:
        answers = []
        for stub in stubs:
            try:
                answers.append(blank(getattr(stub, method)(request, timeout=30)))
            except grpc.RpcError as error:
                answers.append(f"{error.code().name}: {error.details()}")
        if answers[0] == answers[1]:
            same += 1
        else:
            differ += 1
            print(f"DIFFER gRPC reply {method} {getattr(request, 'name', '')}")
            print("  triton:", str(answers[0]).replace("\n", " ")[:600])
            print("  kiln:  ", str(answers[1]).replace("\n", " ")[:600])
    index = [stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30) for stub in stubs]
    entries = [[m for m in answer.models if m.name in models] for answer in index]
    same += entries[0] == entries[1]
    differ += entries[0] != entries[1]
    if entries[0] != entries[1]:
        print("DIFFER gRPC reply RepositoryIndex")
    print(f"gRPC replies: {same} identical, {differ} different")
    disagreed("gRPC replies", differ)


def stream_probes():
    """(name, requests) sent one after another on one ModelStreamInfer stream."""
    import struct

    from tritonclient.grpc import service_pb2 as pb

    def request(model, name, datatype, shape, data, **params):
        r = pb.ModelInferRequest(model_name=model, id=f"{model}-1")
        r.inputs.add(name=name, datatype=datatype, shape=list(shape))
        r.raw_input_contents.append(data)
        for key, value in params.items():
            field = {bool: "bool_param", int: "int64_param", str: "string_param"}[type(value)]
            setattr(r.parameters[key], field, value)
        return r

    def count(n, **params):
        return request("py_count", "N", "INT32", [1], struct.pack("<i", n), **params)

    add = pb.ModelInferRequest(model_name="py_add_sub", id="add")
    for name in ("INPUT0", "INPUT1"):
        add.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        add.raw_input_contents.append(struct.pack("<16f", *range(16)))
    return [
        ("count 3, empty final", [count(3, triton_enable_empty_final_response=True)]),
        ("count 3", [count(3)]),
        ("count 0, empty final", [count(0, triton_enable_empty_final_response=True)]),
        ("count fails", [count(-1, triton_enable_empty_final_response=True)]),
        ("unknown model", [request("nope", "N", "INT32", [1], struct.pack("<i", 1))]),
        ("wrong datatype", [request("py_count", "N", "FP32", [1], struct.pack("<f", 1))]),
        ("not decoupled", [add]),
        ("decoupled after not decoupled", [add, count(1)]),
        ("sequence without id", [request("py_accumulate", "X", "FP32", [1, 1], struct.pack("<f", 1))]),
        ("model refuses (not decoupled)", [request("py_faulty", "X", "INT32", [1], struct.pack("<i", 1))]),
        ("model raises (not decoupled)", [request("py_faulty", "X", "INT32", [1], struct.pack("<i", 2))]),
        ("unknown version", [pb.ModelInferRequest(model_name="py_count", model_version="9", id="v")]),
        ("decoupled ensemble", [request("pcount_chain", "N", "INT32", [1], struct.pack("<i", 3))]),
        ("decoupled ensemble, empty final", [request("pcount_chain", "N", "INT32", [1], struct.pack("<i", 2),
                                                     triton_enable_empty_final_response=True)]),
        ("decoupled ensemble fails", [request("pcount_chain", "N", "INT32", [1], struct.pack("<i", -1))]),
        ("ensemble step refuses", [request("pfaulty_chain", "X", "INT32", [1], struct.pack("<i", 1))]),
    ]


def compare_streams(triton_grpc: str, kiln_grpc: str) -> None:
    """Each of `stream_probes` on a stream to both servers: every response, in order within its
    request, compared as a parsed message. The client closes its side once it has sent the
    requests, and reads until the server ends the stream: both end it only once every request has
    ended (its final flag, or its one response; a decoupled request sent without
    `triton_enable_empty_final_response` ends with no response saying so), so no wait is a guess
    at how long a slow model takes. A stream not ended within 60 s answers `STREAM_DEADLINE`."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    def run(url, requests_):
        with grpc.insecure_channel(url) as channel:
            call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(requests_), timeout=60)
            answers = []
            try:
                answers.extend(call)
            except grpc.RpcError as error:
                answers.append(f"STREAM_{error.code().name}: {error.details()}")
            return answers

    def by_request(answers):
        """Responses of different requests may interleave: in order within each request."""
        return sorted(answers, key=lambda a: "" if isinstance(a, str) else a.infer_response.id)  # a stable sort

    def without_sequence_parameters(answers):
        """The answers without the sequence parameters Triton's ensembles copy into theirs."""
        stripped = []
        for answer in answers:
            if isinstance(answer, str):
                stripped.append(answer)
                continue
            copy = type(answer)()
            copy.CopyFrom(answer)
            for key in ("sequence_id", "sequence_start", "sequence_end"):
                copy.infer_response.parameters.pop(key, None)
            stripped.append(copy)
        return stripped

    same = kept = differ = 0
    for name, requests_ in stream_probes():
        theirs, ours = by_request(run(triton_grpc, requests_)), by_request(run(kiln_grpc, requests_))
        ended = not any(isinstance(answer, str) for answer in theirs + ours)  # a stream cut off compares as nothing
        if ended and theirs == ours:
            same += 1
            continue
        if ended and without_sequence_parameters(theirs) == ours:
            kept += 1
            print(f"KNOWN stream {name}: {ENSEMBLE_PARAMETERS}")
            continue
        differ += 1
        print(f"DIFFER stream {name}: {len(theirs)} responses from Triton, {len(ours)} from kiln")
        for label, answers in (("triton", theirs), ("kiln", ours)):
            for answer in answers:
                print(f"  {label}:", str(answer).replace("\n", " ")[:400])
    print(f"gRPC streams: {same} identical, {kept} known differences, {differ} other")
    disagreed("gRPC streams", differ)


def compare_grpc_answers(triton_grpc: str, kiln_grpc: str) -> None:
    """Each of `grpc_probes` to both servers: status code and message compared."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(url)) for url in (triton_grpc, kiln_grpc)]
    tally = Tally("gRPC answers to bad calls", GRPC_KNOWN)
    channels = [grpc.insecure_channel(url) for url in (triton_grpc, kiln_grpc)]
    for name, method, request in grpc_probes():
        answers = []
        for stub, channel in zip(stubs, channels):
            # A path: the bytes sent as they are to that method, whatever it is.
            call = (channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
                    if method.startswith("/") else getattr(stub, method))
            try:
                reply = call(request, timeout=30)
                answers.append(("OK", str(reply).replace("\n", " ")[:300]))
            except grpc.RpcError as error:
                answers.append((error.code().name, error.details()))
        tally.compare(name, method, *answers)
    tally.summary()


def main():
    if sys.argv[1] == "make":
        print(make_repo(pathlib.Path(sys.argv[2])))
        return
    if sys.argv[1] in ("json", "otel"):
        if sys.argv[1] == "json":
            compare_json(sys.argv[2], sys.argv[3])
        else:
            compare_otel(sys.argv[2], sys.argv[3], sys.argv[4])
        if OTHER:
            print("PARITY FAILED: kiln and Triton disagree where no KNOWN list says why: "
                  + ", ".join(f"{title} {count}" for title, count in OTHER))
            sys.exit(1)
        print("PARITY OK: every difference is a known one")
        return
    if sys.argv[1] == "loaded":
        sys.exit(0 if loaded(sys.argv[2], pathlib.Path(sys.argv[3])) else 1)
    if sys.argv[1] == "verdict":
        sys.exit(verdict(sys.argv[2:]))
    run_tests(pathlib.Path(sys.argv[2]), sys.argv[3].split(","), sys.argv[4:])


def loaded(http: str, repo: pathlib.Path) -> bool:
    """Whether every model of `repo` but py_warm_fail (which triton_parity.sh does not load) has
    ended its load on the server at `http`: the repository index lists each, none LOADING (an
    ensemble whose step failed has no state: Triton 2.51 does not try it)."""
    import requests

    try:
        index = requests.post(f"http://{http}/v2/repository/index", json={}, timeout=10).json()
    except (requests.RequestException, ValueError):
        return False
    states = {}
    for entry in index:
        states.setdefault(entry["name"], set()).add(entry.get("state"))
    wanted = {model.name for model in repo.iterdir() if model.is_dir()} - {"py_warm_fail"}
    return all(name in states and "LOADING" not in states[name] for name in wanted)


def test_names(names: list[str]) -> list[str]:
    """`names`, or when none: every test of test_python_backend_*.py that takes python_server
    alone, in pytest's order (a test may count on what the ones before it did, e.g. trace ids)."""
    return names or [name for name, test in TESTS.items()
                     if test.__code__.co_varnames[:1] == ("python_server",) and test.__code__.co_argcount == 1]


def outcomes() -> dict[str, str]:
    """Each test run so far (PARITY_RESULTS, a JSON line per test): PASS, FAIL, HUNG or DIED."""
    path = pathlib.Path(os.environ.get("PARITY_RESULTS", "/dev/null"))
    lines = path.read_text().splitlines() if path.is_file() else []
    return {name: outcome for name, outcome in map(json.loads, lines)}


def triton_alive(server: "Triton") -> bool:
    import requests

    try:
        return requests.get(f"http://{server.http_url}/v2/health/live", timeout=10).ok
    except requests.RequestException:
        return False


def run_test(name: str, server: "Triton", mark: pathlib.Path) -> str:
    """Test `name` against `server`, in a thread given PARITY_TEST_TIMEOUT seconds (default 180: a
    test can wait on Triton for ever, e.g. for a response it never sends): PASS, FAIL, HUNG, or
    DIED (Triton is gone after it failed); printed with the failing line."""
    import threading

    failure = []

    def body():
        try:
            TESTS[name]((server, mark))
        except BaseException as error:  # noqa: B036 - a test's failure is its report
            failure.append(error)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(float(os.environ.get("PARITY_TEST_TIMEOUT", "180")))
    if thread.is_alive():
        print("HUNG", name, "did not finish in time")
        return "HUNG"
    if not failure:
        print("PASS", name)
        return "PASS"
    error = failure[0]
    frames = [f"{pathlib.Path(f.filename).name} line {f.lineno}: {f.line}"
              for f in traceback.extract_tb(error.__traceback__)
              if pathlib.Path(f.filename).name.startswith(("test_python_backend_", "python_backend_models"))]
    outcome = "FAIL" if triton_alive(server) else "DIED"
    print(outcome, name, f"{type(error).__name__}: {str(error)[:300]}", frames[-1:] if frames else "")
    return outcome


def run_tests(repo: pathlib.Path, ports: list[str], names: list[str]) -> None:
    """The tests not run yet, in order, each outcome kept in PARITY_RESULTS. Exits 3 when Triton
    died during a test (triton_parity.sh starts it again for the others). A hung test's thread
    is left behind: the process ends with os._exit."""
    server, done = Triton(repo, ports), outcomes()
    results, code = os.environ.get("PARITY_RESULTS"), 0
    for name in test_names(names):
        if name in done:
            continue
        if name in HANGS_ON_TRITON:
            print("SKIP", name, HANGS_ON_TRITON[name])
            continue
        # As the fixture gives them: the server, and the file py_echo's finalize writes.
        outcome = run_test(name, server, repo.parent / "finalized")
        if results:
            with open(results, "a") as f:
                f.write(json.dumps([name, outcome]) + "\n")
        if outcome == "DIED":
            print(f"Triton died during {name}")
            code = 3
            break
    sys.stdout.flush()
    os._exit(code)


def verdict(names: list[str]) -> int:
    """1 when a test failed or hung on Triton that FAILS_ON_TRITON does not list (or Triton died during one
    DIES_ON_TRITON does not), or a test did not run; else 0. A listed test that passes is noted."""
    done, unexpected = outcomes(), []
    for name in test_names(names):
        outcome = done.get(name, "NOT RUN")
        if name in HANGS_ON_TRITON:
            continue
        if outcome == "PASS" and name in FAILS_ON_TRITON:
            print(f"NOTE {name} passes on Triton now: take it out of FAILS_ON_TRITON")
        elif outcome in ("FAIL", "HUNG") and name not in FAILS_ON_TRITON | FLAKY_ON_TRITON:
            unexpected.append(f"{name} {'fails' if outcome == 'FAIL' else 'hangs'}")
        elif outcome == "DIED" and name not in DIES_ON_TRITON:
            unexpected.append(f"Triton died during {name}")
        elif outcome == "NOT RUN":
            unexpected.append(f"{name} did not run")
    counts = {o: sum(1 for n in test_names(names) if done.get(n) == o) for o in ("PASS", "FAIL", "HUNG", "DIED")}
    print(f"tests on Triton: {counts['PASS']} pass, {counts['FAIL']} fail, {counts['HUNG']} hang, "
          f"Triton died during {counts['DIED']}, {len(HANGS_ON_TRITON)} not run (they hang); "
          f"unexpected: {len(unexpected)}")
    for line in unexpected:
        print("UNEXPECTED", line)
    return 1 if unexpected else 0

if __name__ == "__main__":
    main()
