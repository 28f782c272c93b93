"""The models of the Python backend suite (`test_python_backend_*.py`) and the one kiln that serves
them: the session fixture `python_server` (registered by conftest.py's `pytest_plugins`, so that
every file of the suite shares one server per test session; imported into each file, it would
start one per file), the repository it serves, and the helpers more than one file uses.

Each model is a directory of `fixtures/python_backend/` laid out as in a model repository
(`config.pbtxt`, `1/model.py`), holding the bytes the suite writes, copied as they are but for:
the models that run another's `model.py` (SAME_CODE_AS), the paths known only once the temporary
directory exists (PLACEHOLDERS, quoted in the configs that hold one), and `py_readme`, whose
`model.py` is taken from docs/models.md when the repository is made (the test is that the page's
model runs).

The server carries state from test to test (statistics, traces, unloaded models). Each file passes
alone, and together they pass in their names' order, as pytest runs them (`pytest conformance`);
another order may not: `test_python_backend_basics.py`'s first test counts py_add_sub's requests
from the first (calls and tracing send it some), and `test_python_backend_tracing.py`'s first test
expects the server's first trace.
bench/triton_parity.py runs these tests against Triton on the same repository (`make_repository`).
"""

from __future__ import annotations

import queue
import re
import shutil
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import BUNDLED_REPO, CONFORMANCE_DIR, REPO_ROOT, RPC_TIMEOUT, doc_section, start_server, stop_server

FIXTURES = CONFORMANCE_DIR / "fixtures" / "python_backend"

# The shared server's models, in the order the repository is made. Each is its fixture directory
# unless BUNDLED names it (from model_repository/).
SERVED = [
    # add_sub in Python (two instances, dynamic batching): answers what the ONNX add_sub answers.
    "py_add_sub",
    # Answers through the response sender (a model that is not decoupled may), and finalize leaves
    # a mark where its config says (MARK).
    "py_echo",
    # Answers 10 times X, or for X = 1 an error response, 2 an exception, 3 a dying process, 4 no
    # response, 7 an output of another type than its config's.
    "py_faulty",
    # Its initialize raises.
    "py_broken",
    # Doubles X: the ensemble double_then_add's first step, before add_sub (ONNX) adds Z.
    "py_double",
    # Hands every input back, whatever its type (IN_<type> to OUT_<type>, for each of the TYPES of
    # test_python_backend_basics.py); with parameter via=dlpack, numeric tensors go through DLPack
    # (a capsule from to_dlpack(), or the array itself as the exporter).
    "py_identity",
    # The model docs/models.md shows under "Python models" (its model.py: readme_model()).
    "py_readme",
    # Calls other models (Triton's BLS): add_sub (ONNX) with exec(), py_add_sub with async_exec()
    # from an async execute, and a model that does not exist.
    "py_calls",
    # Tells each request how many requests its execute call held. A call with a request of -1 is a
    # gate: it says it holds the only instance (the file `holding` in its model directory) and
    # waits until the test releases it (the file `release`), so that the requests after it wait
    # together, whatever the machine's load: no sleep decides an order.
    "py_batch",
    # py_batch's code under the batcher's settings, which apply to Python models as to any other
    # (Triton's dynamic batcher serves every backend): a delay that gathers company, and a queue
    # policy.
    "py_delay",
    "py_policy",
    # Decoupled: counts to N, one response each, from a thread of its own after execute has
    # returned, then says "final" alone; N = 0 sends only that, N = -1 an error response first.
    # With the config parameter "pause" (py_slow_count: 0.3), it waits that many seconds between
    # responses (a model streaming slowly, as an LLM does).
    "py_count",
    "py_slow_count",
    # Passes on each response of py_slow_count to its own client as it comes (Triton's decoupled
    # BLS).
    "py_forward",
    # Reads two of py_slow_count's responses, leaves the rest, then calls add_sub: the call is
    # answered (the responses left unread do not stand in its way), and so is the model's next
    # request.
    "py_partial",
    # Counts its requests and keeps its last input in custom metrics (Triton's
    # pb_utils.MetricFamily); X = 0 makes a series of its own (kind "temporary") that X = 1 lets go.
    "py_metrics",
    # Note each execute call in a file their configs name (WARM_NOTES); raise on a negative input.
    # Their warmup samples (warmup/one: 1.5, warmup/minus: -1, as float32) run at load.
    "py_warm",
    "py_warm_fail",
    # Declares its tensors in code, as newer Triton models do; its config.pbtxt names only the
    # backend. py_auto_conflict's code and config.pbtxt disagree on a tensor's type (its model.py
    # is py_auto's with TYPE_INT32 for X).
    "py_auto",
    "py_auto_conflict",
    # An ensemble: py_double, then add_sub (ONNX).
    "double_then_add",
    "add_sub",
    "tiny_decoder",
    # Collects decoupled models' responses: py_count's (a decoupled Python model) and
    # tiny_decoder's (a generation model, streaming), then a call to a model that is not there.
    "py_streams",
    # Work on a request until its client goes away, then note how it ended in PATIENT_NOTES/<id>:
    # the decoupled one (py_ticker) sends a tick every 20 ms from a thread of its own (execute
    # returns at once), the other (py_patient) answers nothing until cancelled. Neither stops on
    # its own for 20 s.
    "py_patient",
    "py_ticker",
    # Decoupled: answers from a thread of its own after execute has returned, with what add_sub
    # (ONNX) makes of its input, asked through exec() from that thread.
    "py_relay",
    # Manages the server's models for its client (pb_utils.load_model, unload_model,
    # is_model_ready): parameter "action" with "model"; answers READY (is_model_ready after the
    # action).
    "py_manager",
    # Stateful: adds up each sequence's values, keeping the totals itself by correlation_id(), and
    # says where it ran and what the sequence batcher told it (flags and its control inputs).
    "py_accumulate",
    # A decoupled stateful model: per sequence, a running total, answered twice per request: at
    # once from execute, then (ten times the total, final) from a thread half a second after
    # execute returned.
    "py_stream_accumulate",
    # Count down from N, one step per execute call, rescheduling the request until it reaches 0
    # (Triton's request rescheduling, `iterative_sequence`); decoupled (py_iterate), each step is a
    # response. py_iterate_unary is not decoupled; py_iterate_plain has no iterative_sequence.
    "py_iterate",
    # Answers its request's timeout() and, called without the "inner" parameter, the timeout a
    # call it makes to itself (another instance) reaches that call with: twice its own, or a
    # minute.
    "py_timeouts",
    # Call py_ticker (decoupled, a tick every 20 ms for 20 s unless cancelled), cancel the call
    # after three ticks (Triton's ResponseIterator.cancel()), read what still comes, and answer
    # how many ticks they saw; py_stream_canceller is decoupled.
    "py_canceller",
    "py_stream_canceller",
    "py_iterate_unary",
    "py_iterate_plain",
    # Calls py_accumulate for its client, in the sequence and with the flags its parameters name.
    "py_sequence_caller",
    # py_accumulate with implicit state, which is not served for Python models: the load says so.
    "py_implicit_state",
]
BUNDLED = {"add_sub", "tiny_decoder"}

# Models whose fixture directory holds only their config.pbtxt: they run this model's model.py.
SAME_CODE_AS = {
    "py_delay": "py_batch",
    "py_policy": "py_batch",
    "py_slow_count": "py_count",
    "py_warm_fail": "py_warm",
    "py_ticker": "py_patient",
    "py_stream_canceller": "py_canceller",
    "py_iterate_unary": "py_iterate",
    "py_iterate_plain": "py_iterate",
    "py_implicit_state": "py_accumulate",
}

# What a config's quoted placeholder becomes: a path beside the repository.
PLACEHOLDERS = {
    "MARK": "finalized",  # py_echo's finalize writes it
    "WARM_NOTES": "warm_notes",  # py_warm's and py_warm_fail's notes
    "PATIENT_NOTES": "patient_notes",  # a folder: py_patient's and py_ticker's notes
}


def fixture_text(model: str, name: str) -> str:
    """A file of `model`'s fixture directory, e.g. fixture_text("py_faulty", "1/model.py")."""
    return (FIXTURES / model / name).read_text()


# For the tests that write a repository of their own.
PY_FAULTY = fixture_text("py_faulty", "1/model.py")
PY_FAULTY_CONFIG = fixture_text("py_faulty", "config.pbtxt")


def readme_model():
    """The model docs/models.md shows under "Python models"."""
    section = doc_section(REPO_ROOT / "docs" / "models.md", "Python models (Triton's Python backend)")
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


def write_model(repo, name, config, code):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


def make_repository(root: Path) -> Path:
    """The shared server's repository, `root`/repo, made of the SERVED models; beside it, what
    PLACEHOLDERS name (the folder patient_notes made)."""
    repo = root / "repo"
    for name in SERVED:
        if name in BUNDLED:
            shutil.copytree(BUNDLED_REPO / name, repo / name)
            continue
        # copyfile: new files, as a test writes them (not the checkout's times and modes).
        shutil.copytree(FIXTURES / name, repo / name, copy_function=shutil.copyfile)
        (repo / name / "1").mkdir(exist_ok=True)  # git keeps no empty folder (double_then_add's)
        if name in SAME_CODE_AS:
            shutil.copyfile(FIXTURES / SAME_CODE_AS[name] / "1" / "model.py", repo / name / "1" / "model.py")
        if name == "py_readme":
            # Generated: the test is that the page's model runs as the page writes it.
            (repo / name / "1" / "model.py").write_text(textwrap.dedent(readme_model()))
        config = repo / name / "config.pbtxt"
        text = config.read_text()
        for token, path in PLACEHOLDERS.items():
            text = text.replace(f'"{token}"', f'"{root / path}"')
        config.write_text(text)
    (root / "patient_notes").mkdir()
    return repo


@pytest.fixture(scope="session")
def python_server(tmp_path_factory):
    """kiln serving make_repository's models, for the whole session; with the file py_echo's
    finalize writes (it exists once py_echo has unloaded)."""
    root = tmp_path_factory.mktemp("python")
    repo = make_repository(root)
    mark = root / "finalized"
    # The stubs run under this interpreter (it has numpy).
    # --allow-code-in-load-overrides: a model here loads a model.py through the load API.
    server = start_server([repo], name="kiln-python", env={"KILN_PYTHON": sys.executable},
                          extra_args=["--model-control-mode", "explicit", "--load-model", "*",
                                      "--allow-code-in-load-overrides",
                                      "--trace-config", f"triton,file={repo.parent / 'trace.json'}"])
    yield server, mark
    stop_server(server)


def add_sub_inputs(module, a, b):
    inputs = [module.InferInput("INPUT0", list(a.shape), "FP32"), module.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def counted(server, n, empty_final, expected):
    """The responses py_count streams for `n`: (values or error, final flag) each."""
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        x = grpcclient.InferInput("N", [1], "INT32")
        x.set_data_from_numpy(np.array([n], dtype=np.int32))
        client.async_stream_infer("py_count", [x], request_id=f"count-{n}", enable_empty_final_response=empty_final)
        answers = []
        for _ in range(expected):
            result, error = got.get(timeout=RPC_TIMEOUT)
            if error is not None:
                answers.append((str(error), None))
                continue
            response = result.get_response()
            assert response.id == f"count-{n}"
            final = response.parameters["triton_final_response"].bool_param
            value = result.as_numpy("I")
            answers.append((None if value is None else int(value[0]), final))
        time.sleep(0.2)
        assert got.empty(), "more responses than expected"
        return answers
    finally:
        client.stop_stream()


def wait_for_note(server, request_id, timeout=10.0):
    path = server.repos[0].parent / "patient_notes" / request_id
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.02)
    pytest.fail(f"the model noted nothing for request {request_id}")
