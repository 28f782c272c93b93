"""System shared memory with Triton's own client tooling: regions made by
tritonclient.utils.shared_memory, registered and used through tritonclient.grpc and
tritonclient.http exactly as Triton's simple_*_shm_client examples do."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

from conftest import BUNDLED_REPO, FIXTURE_REPO, RPC_TIMEOUT, start_server, stop_server

T = RPC_TIMEOUT
BYTES = 16 * 4  # one add_sub row of FP32


@pytest.fixture(scope="module")
def server():
    """The session's server, with client shared memory on (off by default, as in Triton)."""
    srv = start_server([BUNDLED_REPO, FIXTURE_REPO], name="kiln-shm", extra_args=["--allow-client-shm=true"])
    yield srv
    stop_server(srv)


@pytest.fixture(params=["grpc", "http"])
def triton(request, server):
    if request.param == "grpc":
        client = grpcclient.InferenceServerClient(server.grpc_url)
        yield grpcclient, client
    else:
        client = httpclient.InferenceServerClient(server.http_url)
        yield httpclient, client
        client.close()


@pytest.fixture
def regions(triton):
    """Input and output regions, as tritonclient makes them; all removed afterwards."""
    _, client = triton
    tag = f"{os.getpid()}_{id(client)}"
    handles = {
        "input": shm.create_shared_memory_region(f"in_{tag}", f"/kiln_in_{tag}", 2 * BYTES),
        "output": shm.create_shared_memory_region(f"out_{tag}", f"/kiln_out_{tag}", 2 * BYTES),
    }
    client.unregister_system_shared_memory()
    client.register_system_shared_memory(f"in_{tag}", f"/kiln_in_{tag}", 2 * BYTES)
    client.register_system_shared_memory(f"out_{tag}", f"/kiln_out_{tag}", 2 * BYTES)
    yield tag, handles
    client.unregister_system_shared_memory()
    for handle in handles.values():
        shm.destroy_shared_memory_region(handle)


def test_inputs_and_outputs_in_shared_memory(triton, regions):
    module, client = triton
    tag, handles = regions
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2.0, dtype=np.float32)
    shm.set_shared_memory_region(handles["input"], [a, b])

    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_shared_memory(f"in_{tag}", BYTES)
    inputs[1].set_shared_memory(f"in_{tag}", BYTES, offset=BYTES)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory(f"out_{tag}", BYTES)
    outputs[1].set_shared_memory(f"out_{tag}", BYTES, offset=BYTES)
    result = client.infer("add_sub", inputs, outputs=outputs)

    for index, (name, offset, expected) in enumerate(
        (("OUTPUT0", 0, a + b), ("OUTPUT1", BYTES, a - b))
    ):
        output = result.get_output(name)
        # The data is in the region, not in the response, and nothing else is (as Triton answers:
        # its C++ HTTP client reads `binary_data_size` from any output `parameters`).
        if module is grpcclient:
            shape = list(output.shape)
            assert not output.parameters
            assert result.get_response().raw_output_contents[index] == b""
        else:
            shape = output["shape"]
            assert set(output) == {"name", "datatype", "shape"}
        assert (output.datatype if module is grpcclient else output["datatype"]) == "FP32"
        assert shape == [1, 16]
        got = shm.get_contents_as_numpy(handles["output"], np.float32, shape, offset=offset)
        np.testing.assert_array_equal(got, expected)

    # Mixed: one input inline, one output inline.
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(b)
    inputs[1].set_shared_memory(f"in_{tag}", BYTES)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[1].set_shared_memory(f"out_{tag}", BYTES)
    result = client.infer("add_sub", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), b + a)
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(handles["output"], np.float32, [1, 16]), b - a
    )


def test_status_and_unregister(triton, regions):
    module, client = triton
    tag, _ = regions
    status = client.get_system_shared_memory_status()
    if module is grpcclient:
        found = {name: (r.key, r.offset, r.byte_size) for name, r in status.regions.items()}
    else:
        found = {r["name"]: (r["key"], r["offset"], r["byte_size"]) for r in status}
    assert found == {
        f"in_{tag}": (f"/kiln_in_{tag}", 0, 2 * BYTES),
        f"out_{tag}": (f"/kiln_out_{tag}", 0, 2 * BYTES),
    }
    client.unregister_system_shared_memory(f"in_{tag}")
    # Triton: server src/shared_memory_manager.cc, SharedMemoryManager::GetStatus ("Unable to find
    # system shared memory region") and GetMemoryInfo ("Unable to find shared memory region").
    with pytest.raises(InferenceServerException) as e:
        client.get_system_shared_memory_status(f"in_{tag}")
    assert f"Unable to find system shared memory region: 'in_{tag}'" in str(e.value)

    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    for i in inputs:
        i.set_shared_memory(f"in_{tag}", BYTES)
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", inputs)
    assert f"Unable to find shared memory region: 'in_{tag}'" in str(e.value)


def test_bad_registrations_and_windows(triton, regions):
    # Triton: server src/shared_memory_manager.cc: RegisterSystemSharedMemory ("already in manager"),
    # OpenSharedMemoryRegion ("Unable to open shared memory region"), the region-size check after
    # GetSharedMemoryRegionSize ("failed to register shared memory region '<n>': invalid args"),
    # GetMemoryInfo ("Invalid offset + byte size for shared memory region"); the output-size text:
    # server src/grpc/infer_handler.cc and src/http_server.cc, their response allocators.
    module, client = triton
    tag, _ = regions
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory(f"in_{tag}", f"/kiln_in_{tag}", BYTES)
    assert f"shared memory region 'in_{tag}' already in manager" in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory("ghost", "/kiln_no_such_object", BYTES)
    assert "Unable to open shared memory region: '/kiln_no_such_object'" in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory("too_big", f"/kiln_in_{tag}", 4 * BYTES)
    assert "failed to register shared memory region 'too_big': invalid args" in str(e.value)

    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_shared_memory(f"in_{tag}", BYTES)
    inputs[1].set_shared_memory(f"in_{tag}", BYTES, offset=BYTES + 4)
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", inputs)
    assert f"Invalid offset + byte size for shared memory region: 'in_{tag}'" in str(e.value)

    inputs[1] = module.InferInput("INPUT1", [1, 16], "FP32")
    inputs[1].set_shared_memory(f"in_{tag}", BYTES)
    small = module.InferRequestedOutput("OUTPUT0")
    small.set_shared_memory(f"out_{tag}", BYTES // 2)
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", inputs, outputs=[small])
    assert (
        f"shared memory size specified with the request for output 'OUTPUT0' ({BYTES // 2} bytes) "
        f"should be at least {BYTES} bytes to hold the results"
    ) in str(e.value)
    assert client.is_server_live()


def test_bytes_tensors_in_shared_memory(triton, regions):
    """BYTES travel in Triton's length-prefixed layout, both ways."""
    module, client = triton
    tag, handles = regions
    words = np.array([[b"kiln", b"", b"shared memory"]], dtype=np.object_)
    serialized = serialize_byte_tensor(words)
    size = serialized_byte_size(serialized)
    shm.set_shared_memory_region(handles["input"], [serialized])

    text = module.InferInput("input-1", [1, 3], "BYTES")
    text.set_shared_memory(f"in_{tag}", size)
    echo = module.InferRequestedOutput("output-1")
    echo.set_shared_memory(f"out_{tag}", 2 * BYTES)
    client.infer("string_echo", [text], outputs=[echo])
    got = shm.get_contents_as_numpy(handles["output"], np.object_, [1, 3])
    assert got.tolist() == words.tolist()

    # A frame that runs past the window is refused, not read past.
    torn = module.InferInput("input-1", [1, 3], "BYTES")
    torn.set_shared_memory(f"in_{tag}", size - 1)
    with pytest.raises(InferenceServerException) as e:
        client.infer("string_echo", [torn])
    assert "element byte size indicator exceeds the end of the buffer" in str(e.value)


def test_a_shrunken_object_fails_the_request_not_the_server(triton, regions):
    """A client that truncates its object under a registered region (a mapped server would take
    SIGBUS on its next access) gets an error; the server answers the next request."""
    module, client = triton
    tag, handles = regions
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_shared_memory(f"in_{tag}", BYTES)
    inputs[1].set_shared_memory(f"in_{tag}", BYTES, offset=BYTES)
    fd = os.open(f"/dev/shm/kiln_in_{tag}", os.O_RDWR)
    try:
        os.ftruncate(fd, BYTES + 8)
    finally:
        os.close(fd)
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", inputs)
    # kiln's text (its own guard against a region shrunk after registration); the searched Triton
    # sources hold none.
    assert (
        f"shared memory region 'in_{tag}' is smaller than when it was registered "
        f"(key '/kiln_in_{tag}')"
    ) in str(e.value)

    output = module.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory(f"out_{tag}", BYTES, offset=BYTES)
    fd = os.open(f"/dev/shm/kiln_out_{tag}", os.O_RDWR)
    try:
        os.ftruncate(fd, BYTES)
    finally:
        os.close(fd)
    inline = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    for tensor in inline:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", inline, outputs=[output])
    assert f"shared memory region 'out_{tag}' is smaller than when it was registered" in str(e.value)
    assert os.stat(f"/dev/shm/kiln_out_{tag}").st_size == BYTES  # not grown back
    assert client.is_server_live()
    np.testing.assert_array_equal(client.infer("add_sub", inline).as_numpy("OUTPUT0"), 2 * np.ones((1, 16)))


def test_cuda_shared_memory_answers_as_triton_without_gpus(triton):
    """No CUDA regions: status is empty and unregistering succeeds (perf_analyzer unregisters both
    kinds on exit); registering is refused."""
    module, client = triton
    status = client.get_cuda_shared_memory_status()
    assert (len(status.regions) if module is grpcclient else len(status)) == 0
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("anything")
    with pytest.raises(InferenceServerException) as e:
        client.get_cuda_shared_memory_status("r")
    # Triton: server src/shared_memory_manager.cc, SharedMemoryManager::GetStatus.
    assert "Unable to find cuda shared memory region: 'r'" in str(e.value)


def test_rest_refusals_in_tritons_words(server):
    """What Triton's REST front end refuses before it looks at a region: a register body without
    its key or size, and an output to shared memory asked for as binary data or classified."""
    # Triton: server src/http_server.cc, HandleSystemSharedMemory ("Shared memory register request
    # has no 'key' field", and the same for 'byte_size') and the output parsing of its infer
    # request ("Output can't set both 'shared_memory_region' and '...'", read on main).
    import requests

    url = f"http://{server.http_url}"
    for body, field in [({"byte_size": 64}, "key"), ({"key": "/kiln_anything"}, "byte_size")]:
        answer = requests.post(f"{url}/v2/systemsharedmemory/region/r/register", json=body, timeout=T)
        assert (answer.status_code, answer.json()) == (
            400, {"error": f"Shared memory register request has no '{field}' field"})
    row = {"datatype": "FP32", "shape": [1, 16], "data": list(range(16))}
    for parameter, refused in [({"binary_data": True}, "binary_data"), ({"classification": 2}, "classification")]:
        body = {"inputs": [dict(row, name="INPUT0"), dict(row, name="INPUT1")],
                "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "unregistered",
                                                               "shared_memory_byte_size": 64, **parameter}}]}
        answer = requests.post(f"{url}/v2/models/add_sub/infer", json=body, timeout=T)
        assert (answer.status_code, answer.json()) == (
            400, {"error": f"Output can't set both 'shared_memory_region' and '{refused}'"})


@pytest.mark.parametrize("field,length", [("name", 300), ("name", 60 << 20), ("key", 300), ("key", 60 << 20)])
def test_names_and_keys_too_long_to_keep_are_refused(triton, field, length):
    """A region's name and key are kept while it is registered and listed by every status call:
    one longer than NAME_MAX-sized bounds (255-byte names, 256-byte keys) is refused with an
    error that says so without repeating it, and status never shows it."""
    module, client = triton
    if module is httpclient and field == "name" and length > 300:
        pytest.skip("a 60 MB name does not fit in a URL path")
    tag = f"long_{os.getpid()}_{id(client)}"
    handle = shm.create_shared_memory_region(tag, f"/kiln_{tag}", BYTES)
    name, key = tag, f"/kiln_{tag}"
    if field == "name":
        name = "n" * length
    else:
        key = "/" * length
    try:
        with pytest.raises(InferenceServerException) as e:
            client.register_system_shared_memory(name, key, BYTES)
        message = str(e.value)
        assert f"its {field} is {length} bytes, longer than the" in message, message[:300]
        assert len(message) < 1000, f"the error repeats the {field}: {len(message)} characters"
        status = client.get_system_shared_memory_status()
        if module is grpcclient:
            kept = [(r.name, r.key) for r in status.regions.values()]
        else:
            kept = [(r["name"], r["key"]) for r in status]
        assert all(len(n) <= 255 and len(k) <= 256 for n, k in kept), "a long name or key was kept"
    finally:
        client.unregister_system_shared_memory(name)
        shm.destroy_shared_memory_region(handle)
