"""`--allow-client-shm` as Triton's current release has it (server PR #8721): off by default,
registering and unregistering system and CUDA shared-memory regions are refused (UNSUPPORTED:
gRPC UNIMPLEMENTED, REST 501) with Triton's text, status answers (no regions), and an inference
that names a region finds none. `--allow-client-shm=true` serves them.

Triton: server src/common.h (kClientShmDisabledErrorStr), src/http_server.cc
(HandleSystemSharedMemory, HandleCudaSharedMemory) and src/grpc/grpc_server.cc (the
SystemSharedMemory* and CudaSharedMemory* handlers), read at e1db8a603; its own test is
qa/L0_shared_memory/shared_memory_test.py, test_client_shm_disabled_by_default.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, RPC_TIMEOUT, start_server, stop_server

DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
BYTES = 16 * 4


@pytest.fixture(scope="module")
def off():
    """kiln as started by default."""
    srv = start_server([BUNDLED_REPO], name="kiln-shm-off")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def on():
    srv = start_server([BUNDLED_REPO], name="kiln-shm-on", extra_args=["--allow-client-shm=true"])
    yield srv
    stop_server(srv)


@pytest.fixture(params=["grpc", "http"])
def protocol(request):
    return request.param


def client_of(server, protocol):
    if protocol == "grpc":
        return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)
    return httpclient, httpclient.InferenceServerClient(server.http_url)


@pytest.fixture
def region():
    """An object the client made, with SECRET as its first row."""
    name = f"kiln_flag_{os.getpid()}_{os.urandom(4).hex()}"
    handle = shm.create_shared_memory_region(name, f"/{name}", 2 * BYTES)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.float32).reshape(1, 16)])
    yield name, f"/{name}"
    shm.destroy_shared_memory_region(handle)


def assert_disabled(module, call):
    with pytest.raises(InferenceServerException) as e:
        call()
    assert DISABLED in str(e.value), str(e.value)
    assert e.value.status() == ("StatusCode.UNIMPLEMENTED" if module is grpcclient else "501"), e.value.status()


def regions(module, status):
    return len(status.regions) if module is grpcclient else len(status)


def test_off_by_default_register_and_unregister_are_refused(off, protocol, region):
    module, client = client_of(off, protocol)
    name, key = region
    assert regions(module, client.get_system_shared_memory_status()) == 0
    assert regions(module, client.get_cuda_shared_memory_status()) == 0
    assert_disabled(module, lambda: client.register_system_shared_memory(name, key, 2 * BYTES))
    assert_disabled(module, lambda: client.unregister_system_shared_memory(name))
    assert_disabled(module, lambda: client.unregister_system_shared_memory())
    assert_disabled(module, lambda: client.register_cuda_shared_memory(name, b"\0" * 64, 0, BYTES))
    assert_disabled(module, lambda: client.unregister_cuda_shared_memory(name))
    assert_disabled(module, lambda: client.unregister_cuda_shared_memory())
    assert regions(module, client.get_system_shared_memory_status()) == 0


def test_off_an_inference_naming_a_region_finds_none(off, protocol, region):
    module, client = client_of(off, protocol)
    name, _ = region
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_shared_memory(name, BYTES)
    inputs[1].set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", inputs)
    assert f"Unable to find shared memory region: '{name}'" in str(e.value)


def test_off_rest_refuses_before_reading_the_body(off):
    # Triton checks the flag first: a register body without its key is answered the same.
    url = f"http://{off.http_url}"
    for path, body in [("/v2/systemsharedmemory/region/r/register", {"byte_size": 8}),
                       ("/v2/systemsharedmemory/region/r/register", "not json"),
                       ("/v2/cudasharedmemory/region/r/register", {}),
                       ("/v2/systemsharedmemory/unregister", None),
                       ("/v2/cudasharedmemory/region/r/unregister", None)]:
        answer = requests.post(url + path, json=body, timeout=RPC_TIMEOUT)
        assert (answer.status_code, answer.json()) == (501, {"error": DISABLED}), path
    assert requests.get(url + "/v2/systemsharedmemory/status", timeout=RPC_TIMEOUT).json() == []
    assert requests.get(url + "/v2/cudasharedmemory/status", timeout=RPC_TIMEOUT).json() == []


def test_on_regions_serve(on, protocol, region):
    module, client = client_of(on, protocol)
    name, key = region
    client.register_system_shared_memory(name, key, 2 * BYTES)
    try:
        assert regions(module, client.get_system_shared_memory_status()) == 1
        inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
        inputs[0].set_shared_memory(name, BYTES)
        inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
        np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"),
                                      np.arange(1, 17, dtype=np.float32).reshape(1, 16))
    finally:
        client.unregister_system_shared_memory(name)
    assert regions(module, client.get_system_shared_memory_status()) == 0
    # CUDA: as Triton built without GPUs, once on.
    client.unregister_cuda_shared_memory()
    with pytest.raises(InferenceServerException) as e:
        client.register_cuda_shared_memory(name, b"\0" * 64, 0, BYTES)
    assert "kiln does not serve CUDA shared memory" in str(e.value)
