"""Runs tests of conformance/test_python_backend.py against the real Triton 2.51 (the peers'
tritonserver from PyPI's nvidia-pytriton, which has the Python backend but no ONNX Runtime
backend), on a repository made from that module's fixture: what kiln answers, checked against
what Triton answers to the same models and requests.

    bench/triton_parity.sh [TEST_NAME ...]    # no names: every test that takes python_server

Prints PASS or FAIL (with the failing line) per test. Expected failures, each a known
difference (see bench/RESULTS.md, "Eighteenth session"): tests that use the bundled ONNX models
(Triton here has no onnxruntime backend), and kiln's deliberate extras (a stub that comes back,
clients gone noticed, BLS cancel, which Triton 2.51 lacks).
"""

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


def main():
    if sys.argv[1] == "make":
        print(make_repo(pathlib.Path(sys.argv[2])))
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
