"""What a model's code can see of the server (issue #48, finding 4), tried as a hostile `model.py`
would: kiln's environment is scrubbed from the stub's, but the stub ran as kiln's user and kiln
was dumpable, so `/proc/<kiln pid>/environ` handed the model the server's secrets (an AWS secret
key was there). Now kiln is not dumpable and stubs start without capabilities and without new
privileges, so that a stub of a root kiln cannot read it either; stubs are not dumpable, so one
model cannot read another's memory; `--python-stub-user` runs stubs as another user;
`--python-stub-drop-privileges=false --allow-ptrace=true` is Triton's behaviour."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import DOCS, start_server, stop_server

pytestmark = pytest.mark.security

SECRET = "kiln-security-test-secret-7f3a"

PEEK = '''
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read(1 << 16).decode(errors="replace")
    except Exception as e:
        return f"error: {type(e).__name__}: {e}"


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            pid = int(pb_utils.get_input_tensor_by_name(request, "PID").as_numpy().reshape(-1)[0])
            status = dict(line.split(":", 1) for line in read("/proc/self/status").splitlines() if ":" in line)
            seen = {
                "uid": os.getuid(),
                "pid": os.getpid(),
                "cap_eff": status.get("CapEff", "").strip(),
                "no_new_privs": status.get("NoNewPrivs", "").strip(),
                "environ": read(f"/proc/{pid}/environ"),
                "maps": read(f"/proc/{pid}/maps")[:200],
                "mem": read(f"/proc/{pid}/mem")[:50],
                "env": dict(os.environ),
            }
            out = np.array([json.dumps(seen).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SEEN", out)]))
        return responses
'''


def config(name):
    return textwrap.dedent(f'''
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
        output [ {{ name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
    ''')


@pytest.fixture(scope="module")
def repo():
    # World-readable, so that a stub of another user (--python-stub-user) can read model.py.
    root = Path(tempfile.mkdtemp(prefix="kiln-security-model-"))
    os.chmod(root, 0o755)
    for name in ("peek", "peek_other"):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(PEEK)
        (root / name / "config.pbtxt").write_text(config(name))
        for path in (root / name, root / name / "1"):
            os.chmod(path, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def serve(repo, name, *flags):
    return start_server([repo], name=name, env={"AWS_SECRET_ACCESS_KEY": SECRET, "KILN_PYTHON": sys.executable},
                        extra_args=["--model-control-mode=explicit", "--load-model=*", *flags])


def seen(srv, pid, model="peek"):
    client = httpclient.InferenceServerClient(srv.http_url)
    pid_input = httpclient.InferInput("PID", [1], "INT64")
    pid_input.set_data_from_numpy(np.array([pid], dtype=np.int64))
    answer = client.infer(model, [pid_input]).as_numpy("SEEN")
    return json.loads(answer.reshape(-1)[0])


@pytest.fixture(scope="module")
def kiln(repo):
    srv = serve(repo, "kiln-security-model-code")
    yield srv
    stop_server(srv)


def test_a_model_cannot_read_the_servers_environment_or_memory(kiln):
    # The secret is there, in kiln's environment: the test (root, or kiln's user) reads it only
    # through privileges a model does not have.
    got = seen(kiln, kiln.proc.pid)
    assert got["uid"] == os.getuid()
    for what in ("environ", "maps", "mem"):
        assert got[what].startswith("error: PermissionError"), (what, got[what])
    assert SECRET not in json.dumps(got)
    # What a stub may do: no capabilities, no new privileges.
    assert int(got["cap_eff"], 16) == 0, got["cap_eff"]
    assert got["no_new_privs"] == "1"


def test_a_model_cannot_read_another_models_stub(kiln):
    other = seen(kiln, kiln.proc.pid, model="peek_other")["pid"]
    got = seen(kiln, other)
    for what in ("environ", "maps", "mem"):
        assert got[what].startswith("error: PermissionError"), (what, got[what])


def test_the_servers_status_stays_readable(kiln):
    """What tests and monitoring read of kiln's /proc (VmHWM in test_hostile) is world-readable."""
    with open(f"/proc/{kiln.proc.pid}/status") as status:
        assert "VmHWM" in status.read()
    with open(f"/proc/{kiln.proc.pid}/stat") as stat:
        assert stat.read().startswith(str(kiln.proc.pid))


def runs_as(user, argv) -> bool:
    def switch():
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    try:
        return subprocess.run(argv, preexec_fn=switch, capture_output=True, timeout=60).returncode == 0
    except OSError:
        return False


@pytest.mark.skipif(os.getuid() != 0, reason="switching the stubs' user needs kiln to run as root")
def test_stubs_run_as_another_user(repo):
    nobody = pwd.getpwnam("nobody")
    srv = serve(repo, "kiln-stub-user", "--python-stub-user=nobody")
    try:
        if not runs_as(nobody, [sys.executable, "-c", "import numpy"]):
            # This machine's Python (under /root, say) is not for other users: the stub's start
            # as nobody fails, which shows that it was started as nobody.
            index = httpclient.InferenceServerClient(srv.http_url).get_model_repository_index()
            reasons = " ".join(m.get("reason", "") for m in index)
            assert "Permission denied" in reasons, index
            pytest.skip(f"nobody cannot run {sys.executable} with numpy here")
        got = seen(srv, srv.proc.pid)
        assert got["uid"] == nobody.pw_uid
        assert got["environ"].startswith("error: PermissionError"), got["environ"]
        assert SECRET not in json.dumps(got)
    finally:
        stop_server(srv)


def test_tritons_behaviour_is_two_flags_away(repo):
    srv = serve(repo, "kiln-stub-privileged", "--python-stub-drop-privileges=false", "--allow-ptrace=true")
    try:
        assert SECRET in seen(srv, srv.proc.pid)["environ"]
    finally:
        stop_server(srv)


def test_the_operations_page_says_what_a_model_can_see():
    from conftest import doc_section

    section = doc_section(DOCS / "operations.md", "What a model's code can see")
    for needed in ("--python-stub-user", "--python-stub-drop-privileges", "--allow-ptrace",
                   "--python-env-passthrough", "/proc"):
        assert needed in section, needed
