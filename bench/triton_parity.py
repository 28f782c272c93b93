"""Runs tests of conformance/test_python_backend.py against the real Triton 2.51 (the peers'
tritonserver from PyPI's nvidia-pytriton, which has the Python backend but no ONNX Runtime
backend), on a repository made from that module's fixture: what kiln answers, checked against
what Triton answers to the same models and requests.

    bench/triton_parity.sh [TEST_NAME ...]    # no names: every test that takes python_server
    bench/triton_parity.sh --json             # REST JSON of both servers, byte for byte

Prints PASS or FAIL (with the failing line) per test. Expected failures, each a known
difference (see bench/RESULTS.md, "Eighteenth session"): tests that use the bundled ONNX models
(Triton here has no onnxruntime backend), and kiln's deliberate extras (a stub that comes back,
clients gone noticed, BLS cancel, which Triton 2.51 lacks).
"""

import json
import pathlib
import shutil
import sys
import traceback

CONFORMANCE = pathlib.Path(__file__).resolve().parent.parent / "conformance"
sys.path.insert(0, str(CONFORMANCE))
import test_python_backend as t  # noqa: E402


def make_repo(base: pathlib.Path) -> pathlib.Path:
    """The python_server fixture's repository under `base`, each model.py first putting the
    peers' site-packages (numpy, onnxruntime) on the path: Triton's stub ignores PYTHONPATH."""
    source = (CONFORMANCE / "test_python_backend.py").read_text().split("\n")
    start = next(i for i, line in enumerate(source) if line.startswith("def python_server("))
    end = next(i for i in range(start, len(source)) if "# The stubs run under this interpreter" in source[i])
    body = "\n".join(source[start + 1:end])
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)

    class Factory:
        def mktemp(self, name):
            path = base / name
            path.mkdir()
            return path

    namespace = dict(vars(t))
    namespace["tmp_path_factory"] = Factory()
    exec("def _fixture():\n" + body + "\n    return repo\n_repo = _fixture()\n", namespace)
    repo = namespace["_repo"]
    for model in repo.glob("*/1/model.py"):
        model.write_text("import os, sys\nsys.path.insert(0, os.environ['PEER_SITE_PACKAGES'])\n" + model.read_text())
    return repo


class Triton:
    """What the tests read of a server: Triton's ports (see triton_parity.sh)."""

    def __init__(self, repo, ports):
        self.repos = [repo]
        self.http_url, self.grpc_url, self.metrics_url = (f"127.0.0.1:{p}" for p in ports)

    def assert_alive(self):
        pass


def stream_count(http: str, n: int) -> None:
    """py_count's `n` responses (and the final flag) over a gRPC stream; gRPC is the next port."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    host, port = http.rsplit(":", 1)
    client = grpcclient.InferenceServerClient(f"{host}:{int(port) + 1}")
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    x = grpcclient.InferInput("N", [1], "INT32")
    x.set_data_from_numpy(np.array([n], dtype=np.int32))
    client.async_stream_infer("py_count", [x], enable_empty_final_response=True)
    while True:
        result, error = answers.get(timeout=30)
        if error or result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()


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
    paths = ["/v2"] + [f"/v2/models/{m}{tail}" for m in sorted(ready(triton_http) & ready(kiln_http))
                       for tail in ("", "/config", "/stats")]
    for path in paths:
        theirs, ours = get(triton_http, path), get(kiln_http, path)
        if path.endswith("/stats"):
            equal = json.dumps(blank(theirs.json())) == json.dumps(blank(ours.json()))
        elif path == "/v2":
            equal = list(theirs.json()) == list(ours.json())
        else:
            equal = theirs.content == ours.content
        same += equal
        differ += not equal
        if not equal:
            print("DIFFER", path)
            print("  triton:", theirs.text[:1500])
            print("  kiln:  ", ours.text[:1500])
    print(f"{same} identical, {differ} different")


def main():
    if sys.argv[1] == "make":
        print(make_repo(pathlib.Path(sys.argv[2])))
        return
    if sys.argv[1] == "json":
        compare_json(sys.argv[2], sys.argv[3])
        return
    repo, ports, names = pathlib.Path(sys.argv[2]), sys.argv[3].split(","), sys.argv[4:]
    if not names:
        names = [name for name in dir(t) if name.startswith("test_")
                 and getattr(t, name).__code__.co_varnames[:1] == ("python_server",)
                 and getattr(t, name).__code__.co_argcount == 1]
    server = Triton(repo, ports)
    for name in names:
        try:
            getattr(t, name)((server, None))
            print("PASS", name)
        except BaseException as error:  # noqa: B036 - a test's failure is its report
            frames = [f"line {f.lineno}: {f.line}" for f in traceback.extract_tb(error.__traceback__)
                      if f.filename.endswith("test_python_backend.py")]
            print("FAIL", name, f"{type(error).__name__}: {str(error)[:300]}", frames[-1:] if frames else "")


if __name__ == "__main__":
    main()
