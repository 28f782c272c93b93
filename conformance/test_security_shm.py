"""Issue #48, item 3: with client shared memory on, a client must not reach /dev/shm objects it
could not have shared. The reproduction: a process (this test) makes an object that kiln's
client never registered; the client registers its key, infers with it as an input (reading the
object's bytes) and as an output (overwriting them). kiln refuses an object of another user
than its own (`--client-shm-any-owner=true` gives Triton's behaviour), a key outside
`--client-shm-prefix`, keys Triton's current release refuses (all slashes, its Python backend's
reserved prefix), and never follows a key out of /dev/shm (a symbolic link, `..`).

What stays reachable, the objects of kiln's own user, is docs/operations.md's "Security model".
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, start_server, stop_server

BYTES = 16 * 4  # one add_sub row of FP32
SECRET = np.arange(100, 116, dtype=np.float32)


@pytest.fixture(scope="module")
def servers():
    """kiln with client shared memory on (its checks by default), with a prefix, and with Triton's
    openness (`--client-shm-any-owner=true`)."""
    started = {
        "default": start_server([BUNDLED_REPO], name="kiln-shm-default", extra_args=["--allow-client-shm=true"]),
        "prefix": start_server([BUNDLED_REPO], name="kiln-shm-prefix",
                               extra_args=["--allow-client-shm=true", "--client-shm-prefix=/kiln_client_"]),
        "any_owner": start_server([BUNDLED_REPO], name="kiln-shm-any-owner",
                                  extra_args=["--allow-client-shm=true", "--client-shm-any-owner=true"]),
    }
    yield started
    for srv in started.values():
        stop_server(srv)


@pytest.fixture(params=["grpc", "http"])
def protocol(request):
    return request.param


def client_of(server, protocol):
    if protocol == "grpc":
        return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)
    return httpclient, httpclient.InferenceServerClient(server.http_url)


class Victim:
    """Another process's object in /dev/shm: SECRET as its first row, never shared with kiln."""

    def __init__(self, name: str, owner: int | None = None):
        self.key = f"/{name}"
        self.path = f"/dev/shm/{name}"
        with open(self.path, "wb") as f:
            f.write(SECRET.tobytes() + b"\0" * BYTES)
        os.chmod(self.path, 0o666)  # opening it is not what stops kiln
        if owner is not None:
            os.chown(self.path, owner, -1)

    def contents(self) -> bytes:
        with open(self.path, "rb") as f:
            return f.read()

    def remove(self):
        os.unlink(self.path)


def steal_and_overwrite(module, client, key):
    """What issue #48 reports: register the key, read the object as an input, overwrite it as an
    output. Returns what the input read."""
    region = f"stolen_{uuid.uuid4().hex[:8]}"
    client.register_system_shared_memory(region, key, 2 * BYTES)
    try:
        inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
        inputs[0].set_shared_memory(region, BYTES)
        inputs[1].set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
        output = module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(region, BYTES, offset=BYTES)
        client.infer("add_sub", inputs, outputs=[output])
        read = client.infer("add_sub", inputs).as_numpy("OUTPUT0")
        return read
    finally:
        client.unregister_system_shared_memory(region)


def refused(module, client, key, code="400") -> str:
    """Registers `key`, which must be refused with `code` (REST's; gRPC's counterpart) and leave
    no region; the message."""
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory(f"r_{uuid.uuid4().hex[:8]}", key, 2 * BYTES)
    grpc_code = {"400": "StatusCode.INVALID_ARGUMENT", "500": "StatusCode.INTERNAL"}[code]
    assert e.value.status() == (grpc_code if module is grpcclient else code), (e.value.status(), str(e.value))
    status = client.get_system_shared_memory_status()
    assert (len(status.regions) if module is grpcclient else len(status)) == 0, "a region was kept"
    return str(e.value)


def test_another_users_object_is_refused(servers, protocol):
    if os.geteuid() != 0:
        pytest.skip("needs root: an object of another user (chowned to nobody) is made by the test")
    nobody = 65534
    victim = Victim(f"kiln_victim_{os.getpid()}_{protocol}", owner=nobody)
    try:
        module, client = client_of(servers["default"], protocol)
        message = refused(module, client, victim.key)
        assert f": the object '{victim.key}' belongs to another user than the server's " \
               "(--client-shm-any-owner)" in message, message
        assert victim.contents() == SECRET.tobytes() + b"\0" * BYTES, "the object was written"
        # Triton's behaviour, one flag away: read and overwritten.
        module, client = client_of(servers["any_owner"], protocol)
        read = steal_and_overwrite(module, client, victim.key)
        np.testing.assert_array_equal(read, SECRET.reshape(1, 16))
        assert victim.contents()[BYTES:] == SECRET.tobytes()
    finally:
        victim.remove()


def test_a_key_outside_the_prefix_is_refused(servers, protocol):
    victim = Victim(f"kiln_victim_{os.getpid()}_{protocol}")
    mine = Victim(f"kiln_client_{os.getpid()}_{protocol}")
    try:
        module, client = client_of(servers["prefix"], protocol)
        message = refused(module, client, victim.key)
        assert f"with key '{victim.key}': this server accepts only keys starting with '/kiln_client_' " \
               "(--client-shm-prefix)" in message, message
        assert victim.contents() == SECRET.tobytes() + b"\0" * BYTES
        # Under the prefix, the client's own object serves.
        np.testing.assert_array_equal(steal_and_overwrite(module, client, mine.key), SECRET.reshape(1, 16))
        np.testing.assert_array_equal(steal_and_overwrite(module, client, mine.key[1:]), SECRET.reshape(1, 16))
    finally:
        victim.remove()
        mine.remove()


@pytest.mark.parametrize("key,message", [
    # Triton's current release: server src/common.cc, ValidateSharedMemoryKey (PR #8336).
    ("/", "- invalid shm key '/'"),
    ("///", "- invalid shm key '///'"),
    ("/triton_python_backend_shm_region_{pid}",
     "as the key contains the reserved prefix 'triton_python_backend_shm_region_'"),
])
def test_keys_tritons_current_release_refuses(servers, protocol, key, message):
    key = key.format(pid=os.getpid())
    victim = Victim(key[1:]) if key.strip("/") else None
    try:
        module, client = client_of(servers["default"], protocol)
        text = refused(module, client, key)
        assert "cannot register shared memory region 'r_" in text and message in text, text
    finally:
        if victim:
            victim.remove()


def test_no_key_leads_out_of_dev_shm(servers, protocol, tmp_path):
    """A symbolic link in /dev/shm to a file of kiln's user, and `..` in a key, reach nothing:
    kiln opens with O_NOFOLLOW and takes a key as one name of /dev/shm. (The C library already
    refuses both; kiln does not rely on it.)"""
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET.tobytes() + b"\0" * BYTES)
    link = f"/dev/shm/kiln_link_{os.getpid()}_{protocol}"
    os.symlink(secret, link)
    try:
        module, client = client_of(servers["any_owner"], protocol)
        for key in (link[len("/dev/shm"):], f"/../../{secret}", "/.."):
            message = refused(module, client, key, code="500")
            assert f"Unable to open shared memory region: '{key}'" in message, message
        assert secret.read_bytes() == SECRET.tobytes() + b"\0" * BYTES
    finally:
        os.unlink(link)


def test_objects_of_kilns_own_user_stay_reachable(servers, protocol):
    """The documented rest (docs/operations.md, Security model): without a prefix, an object of
    kiln's own user that its client never shared is still read and written. This is what
    --client-shm-prefix is for."""
    victim = Victim(f"kiln_same_user_{os.getpid()}_{protocol}")
    try:
        module, client = client_of(servers["default"], protocol)
        np.testing.assert_array_equal(steal_and_overwrite(module, client, victim.key), SECRET.reshape(1, 16))
        assert victim.contents()[BYTES:] == SECRET.tobytes()
    finally:
        victim.remove()
