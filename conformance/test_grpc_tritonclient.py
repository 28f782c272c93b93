"""tritonclient.grpc against kiln: health, metadata, config, repository index, inference.

Bad-input tests live in test_grpc_errors.py.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import (
    BUNDLED_REPO,
    DATATYPE_NAMES,
    RPC_TIMEOUT,
    assert_triton_error,
    deserialize_bytes,
    infer_request,
    np_dtype,
    random_array,
)

T = RPC_TIMEOUT
ALL_MODELS = {
    "add_sub", "string_echo", "mlp_classifier", "identity_types", "scalar", "reshaped", "versioned",
    "latest_two", "broken", "name_mismatch", "nobatch_dynamic", "int_div",
}
GOOD_MODELS = ALL_MODELS - {"broken", "name_mismatch"}


def make_input(name, arr, datatype=None):
    datatype = datatype or grpcclient.np_to_triton_dtype(arr.dtype)
    inp = grpcclient.InferInput(name, list(arr.shape), datatype)
    inp.set_data_from_numpy(arr)
    return inp


def infer(client, model, arrays: dict, version="", outputs=None, **kw):
    inputs = [make_input(n, a) for n, a in arrays.items()]
    outs = None if outputs is None else [grpcclient.InferRequestedOutput(o) for o in outputs]
    return client.infer(model, inputs, model_version=version, outputs=outs, client_timeout=T, **kw)


def not_ready(call):
    """A not-ready or unknown model: Triton's core (InferenceServer::ModelIsReady) answers OK with
    ready=false rather than an error, so tritonclient returns False."""
    return call() is False


# --------------------------------------------------------------------------- health / metadata

def test_server_live(client):
    assert client.is_server_live(client_timeout=T) is True


def test_server_not_ready_because_models_failed(client):
    # strict readiness: `broken` and `name_mismatch` fail to load
    assert client.is_server_ready(client_timeout=T) is False


def test_server_metadata(client):
    md = client.get_server_metadata(client_timeout=T)
    assert md.name == "kiln"
    assert md.version.strip() != ""
    ext = list(md.extensions)
    assert len(ext) == len(set(ext)) and all(e.strip() for e in ext)
    assert "model_configuration" in ext, ext  # the ModelConfig RPC is served
    # perf_analyzer asks for the server's statistics only when "statistics" is listed.
    assert "statistics" in ext and "schedule_policy" in ext, ext
    assert "system_shared_memory" in ext, ext
    assert "trace" in ext and "logging" in ext, ext
    assert "sequence" in ext, ext
    for unserved in ("cuda_shared_memory",):
        assert unserved not in ext, ext
    as_json = client.get_server_metadata(as_json=True, client_timeout=T)
    assert as_json["name"] == "kiln"


@pytest.mark.parametrize("model,version", [
    ("add_sub", ""), ("add_sub", "1"), ("string_echo", ""), ("identity_types", ""),
    ("mlp_classifier", "1"), ("mlp_classifier", "2"), ("mlp_classifier", ""),
    ("scalar", ""), ("reshaped", ""), ("nobatch_dynamic", ""), ("int_div", ""),
    ("versioned", "1"), ("versioned", "3"), ("versioned", ""),
    ("latest_two", "2"), ("latest_two", "3"), ("latest_two", ""),
])
def test_model_ready(client, model, version):
    assert client.is_model_ready(model, version, client_timeout=T) is True


@pytest.mark.parametrize("model,version", [
    ("broken", ""), ("broken", "1"), ("name_mismatch", ""), ("no_such_model", ""),
    ("versioned", "2"), ("latest_two", "1"), ("add_sub", "2"), ("add_sub", "abc"),
])
def test_model_not_ready(client, model, version):
    assert not_ready(lambda: client.is_model_ready(model, version, client_timeout=T))


def _meta_tensors(tensors):
    return {t.name: (t.datatype, list(t.shape)) for t in tensors}


def test_model_metadata_add_sub(client):
    md = client.get_model_metadata("add_sub", client_timeout=T)
    assert md.name == "add_sub"
    assert list(md.versions) == ["1"]
    assert md.platform == "onnxruntime_onnx"
    assert [t.name for t in md.inputs] == ["INPUT0", "INPUT1"]
    assert [t.name for t in md.outputs] == ["OUTPUT0", "OUTPUT1"]
    for t in list(md.inputs) + list(md.outputs):
        assert (t.datatype, list(t.shape)) == ("FP32", [-1, 16])
    js = client.get_model_metadata("add_sub", "1", as_json=True, client_timeout=T)
    assert js["name"] == "add_sub" and js["inputs"][0]["shape"] == ["-1", "16"]


@pytest.mark.parametrize("model,platform,inputs,outputs", [
    ("string_echo", "onnxruntime_onnx", {"input-1": ("BYTES", [-1, -1])}, {"output-1": ("BYTES", [-1, -1])}),
    ("mlp_classifier", "onnxruntime_onnx", {"INPUT0": ("FP32", [-1, 64])}, {"OUTPUT0": ("FP32", [-1, 10])}),
    ("scalar", "onnxruntime_onnx", {"X": ("FP32", [1])}, {"Y": ("FP32", [1])}),
    ("reshaped", "onnxruntime_onnx", {"X": ("FP32", [-1, 2, 2])}, {"Y": ("FP32", [-1, 2, 2])}),
    ("nobatch_dynamic", "onnxruntime_onnx", {"X": ("FP32", [3, -1])}, {"Y": ("FP32", [3, -1])}),
    ("int_div", "onnxruntime_onnx", {"A": ("INT32", [-1]), "B": ("INT32", [-1])}, {"C": ("INT32", [-1])}),
])
def test_model_metadata(client, model, platform, inputs, outputs):
    md = client.get_model_metadata(model, client_timeout=T)
    assert md.name == model and md.platform == platform
    assert _meta_tensors(md.inputs) == inputs
    assert _meta_tensors(md.outputs) == outputs


def test_model_metadata_identity_types(client):
    md = client.get_model_metadata("identity_types", client_timeout=T)
    assert _meta_tensors(md.inputs) == {f"IN_{t}": (t, [-1, -1]) for t in DATATYPE_NAMES}
    assert _meta_tensors(md.outputs) == {f"OUT_{t}": (t, [-1, -1]) for t in DATATYPE_NAMES}


@pytest.mark.parametrize("model,version,versions", [
    ("mlp_classifier", "", ["1", "2"]), ("mlp_classifier", "2", ["2"]),
    ("versioned", "", ["1", "3"]), ("latest_two", "", ["2", "3"]), ("versioned", "1", ["1"]),
])
def test_model_metadata_versions(client, model, version, versions):
    md = client.get_model_metadata(model, version, client_timeout=T)
    assert sorted(md.versions) == versions


def _cfg(client, model, version=""):
    return client.get_model_config(model, version, as_json=True, client_timeout=T)["config"]


def _io(entries):
    return {e["name"]: (e["data_type"], [int(d) for d in e.get("dims", [])]) for e in entries}


def test_model_config_add_sub(client):
    cfg = _cfg(client, "add_sub")
    assert cfg["name"] == "add_sub"
    assert cfg["max_batch_size"] == 8
    assert cfg.get("backend") == "onnxruntime" and cfg.get("platform") == "onnxruntime_onnx"
    assert _io(cfg["input"]) == {"INPUT0": ("TYPE_FP32", [16]), "INPUT1": ("TYPE_FP32", [16])}
    assert _io(cfg["output"]) == {"OUTPUT0": ("TYPE_FP32", [16]), "OUTPUT1": ("TYPE_FP32", [16])}
    groups = cfg.get("instance_group")
    assert groups and all(g.get("count", 0) >= 1 for g in groups), groups


def test_model_config_mlp_classifier(client):
    cfg = _cfg(client, "mlp_classifier", "1")
    assert cfg["name"] == "mlp_classifier" and cfg["max_batch_size"] == 32
    assert "all" in cfg["version_policy"]
    assert "dynamic_batching" in cfg
    assert cfg["output"][0]["label_filename"] == "labels.txt"
    assert [(g["kind"], g["count"]) for g in cfg["instance_group"]] == [("KIND_CPU", 2)]


def test_model_config_identity_types_autocomplete(client):
    cfg = _cfg(client, "identity_types")
    assert cfg["name"] == "identity_types"
    assert cfg["max_batch_size"] == 4
    assert "dynamic_batching" in cfg
    assert cfg.get("instance_group"), "auto-complete must default instance_group"
    assert cfg.get("backend") == "onnxruntime" or cfg.get("platform") == "onnxruntime_onnx"

    def cfgtype(t):
        return "TYPE_STRING" if t == "BYTES" else f"TYPE_{t}"

    assert _io(cfg["input"]) == {f"IN_{t}": (cfgtype(t), [-1]) for t in DATATYPE_NAMES}
    assert _io(cfg["output"]) == {f"OUT_{t}": (cfgtype(t), [-1]) for t in DATATYPE_NAMES}


def test_model_config_nobatch_dynamic_autocomplete(client):
    cfg = _cfg(client, "nobatch_dynamic")
    assert cfg.get("max_batch_size", 0) == 0
    assert "dynamic_batching" not in cfg
    assert _io(cfg["input"]) == {"X": ("TYPE_FP32", [3, -1])}
    assert _io(cfg["output"]) == {"Y": ("TYPE_FP32", [3, -1])}


def test_model_config_reshape_and_optional_name(client):
    cfg = _cfg(client, "reshaped")
    assert cfg["name"] == "reshaped"  # name omitted in config.pbtxt -> directory name
    assert cfg["max_batch_size"] == 4
    assert [int(d) for d in cfg["input"][0]["dims"]] == [2, 2]
    assert [int(d) for d in cfg["input"][0]["reshape"]["shape"]] == [4]


def test_model_config_versioned_policy(client):
    cfg = _cfg(client, "versioned")
    assert sorted(int(v) for v in cfg["version_policy"]["specific"]["versions"]) == [1, 3]
    cfg = _cfg(client, "latest_two")
    assert cfg["version_policy"]["latest"]["num_versions"] == 2


def test_repository_index(client):
    idx = client.get_model_repository_index(client_timeout=T)
    entries = list(idx.models)
    names = {m.name for m in entries}
    assert ALL_MODELS <= names, ALL_MODELS - names
    by = {}
    for m in entries:
        by.setdefault(m.name, []).append(m)
    for name in GOOD_MODELS:
        assert any(m.state == "READY" for m in by[name]), (name, by[name])
    ready = {(m.name, m.version) for m in entries if m.state == "READY"}
    assert {("mlp_classifier", "1"), ("mlp_classifier", "2"), ("versioned", "1"), ("versioned", "3"),
            ("latest_two", "2"), ("latest_two", "3"), ("add_sub", "1")} <= ready
    assert ("versioned", "2") not in ready and ("latest_two", "1") not in ready
    for name in ("broken", "name_mismatch"):
        assert by[name], name
        for m in by[name]:
            assert m.state == "UNAVAILABLE", m
            assert m.reason.strip(), f"{name}: UNAVAILABLE needs a reason"
    assert any(m.version == "1" for m in by["broken"])


def test_repository_index_ready_filter(server):
    from tritonclient.grpc import service_pb2

    resp = server.stub().RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True), timeout=T)
    names = {m.name for m in resp.models}
    assert "add_sub" in names and "broken" not in names and "name_mismatch" not in names
    assert all(m.state == "READY" for m in resp.models)


# --------------------------------------------------------------------------- inference

@pytest.mark.parametrize("batch", [1, 3, 8])
def test_add_sub(client, batch):
    rng = np.random.default_rng(batch)
    a = rng.standard_normal((batch, 16)).astype(np.float32)
    b = rng.standard_normal((batch, 16)).astype(np.float32)
    res = infer(client, "add_sub", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
    resp = res.get_response()
    assert resp.model_name == "add_sub" and resp.model_version == "1"
    assert [o.name for o in resp.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert len(resp.raw_output_contents) == 2
    for o in resp.outputs:
        assert o.datatype == "FP32" and list(o.shape) == [batch, 16]
        assert not o.HasField("contents"), "outputs must be raw only"


def test_requested_output_filtering(client):
    a = np.ones((2, 16), np.float32)
    b = np.full((2, 16), 0.5, np.float32)
    res = infer(client, "add_sub", {"INPUT0": a, "INPUT1": b}, outputs=["OUTPUT1"])
    resp = res.get_response()
    assert [o.name for o in resp.outputs] == ["OUTPUT1"]
    assert len(resp.raw_output_contents) == 1
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
    assert res.as_numpy("OUTPUT0") is None


def test_request_id_echoed_and_parameters_accepted(client):
    a = np.zeros((1, 16), np.float32)
    res = infer(client, "add_sub", {"INPUT0": a, "INPUT1": a}, request_id="req-42 \u00e9",
                priority=1, parameters={"s": "x", "b": True, "i": 3, "f": 1.5})
    assert res.get_response().id == "req-42 \u00e9"
    res = infer(client, "add_sub", {"INPUT0": a, "INPUT1": a})
    assert res.get_response().id == ""


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_compressed_request(client, compression):
    a = np.arange(4 * 16, dtype=np.float32).reshape(4, 16)
    res = infer(client, "add_sub", {"INPUT0": a, "INPUT1": a}, compression_algorithm=compression)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a * 2)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), np.zeros_like(a))


def _identity_arrays(rng, batch, widths):
    return {f"IN_{t}": random_array(t, (batch, widths[t]), rng) for t in DATATYPE_NAMES}


def _check_identity(res, arrays):
    resp = res.get_response()
    assert len(resp.raw_output_contents) == len(resp.outputs) == len(arrays)
    for name, a in arrays.items():
        t = name[3:]
        out = res.as_numpy(f"OUT_{t}")
        assert out is not None, f"OUT_{t} missing"
        assert out.shape == a.shape, (t, out.shape, a.shape)
        if t == "BYTES":
            assert out.tolist() == a.tolist(), t
        else:
            assert out.dtype == np.dtype(np_dtype(t)), (t, out.dtype)
            assert out.tobytes() == a.tobytes(), t  # bit exact (NaN-safe)
        meta = next(o for o in resp.outputs if o.name == f"OUT_{t}")
        assert meta.datatype == t


@pytest.mark.parametrize("batch", [1, 4])
def test_identity_all_datatypes(client, batch):
    rng = np.random.default_rng(batch)
    widths = {t: i + 1 for i, t in enumerate(DATATYPE_NAMES)}  # every symbolic dim differs
    arrays = _identity_arrays(rng, batch, widths)
    _check_identity(infer(client, "identity_types", arrays), arrays)


@pytest.mark.parametrize("dtype", DATATYPE_NAMES)
def test_identity_one_datatype_wide(client, dtype):
    """One datatype gets a large random tensor, the others a single element."""
    rng = np.random.default_rng(DATATYPE_NAMES.index(dtype))
    widths = {t: (1000 if t == dtype else 1) for t in DATATYPE_NAMES}
    arrays = _identity_arrays(rng, 2, widths)
    _check_identity(infer(client, "identity_types", arrays), arrays)


def test_identity_zero_element_tensors(client):
    rng = np.random.default_rng(0)
    arrays = _identity_arrays(rng, 1, {t: 0 for t in DATATYPE_NAMES})
    _check_identity(infer(client, "identity_types", arrays), arrays)


def test_identity_special_float_values(client):
    rng = np.random.default_rng(5)
    arrays = _identity_arrays(rng, 1, {t: 6 for t in DATATYPE_NAMES})
    for t in ("FP16", "FP32", "FP64", "BF16"):
        arrays[f"IN_{t}"] = np.array([[np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-3]],
                                     dtype=np.float32).astype(np_dtype(t))
    _check_identity(infer(client, "identity_types", arrays), arrays)


def test_bytes_echo_utf8_and_empty(client):
    a = np.array([[b"", "h\u00e9llo w\u00f6rld".encode(), "\u65e5\u672c\u8a9e".encode()],
                  ["\U0001f600".encode(), b"", b"plain"]], dtype=np.object_)
    res = infer(client, "string_echo", {"input-1": a})
    out = res.as_numpy("output-1")
    assert out.shape == (2, 3) and out.tolist() == a.tolist()
    assert deserialize_bytes(res.get_response().raw_output_contents[0]) == a.flatten().tolist()


def test_bytes_echo_non_utf8(client):
    """BYTES are arbitrary bytes, not text (NULs too: conformance/test_bytes.py)."""
    a = np.array([[b"\xff\xfe\x80", b"ok", b"\xc3("]], dtype=np.object_)
    out = infer(client, "string_echo", {"input-1": a}).as_numpy("output-1")
    assert out.tolist() == a.tolist()


def test_large_bytes_message(client):
    """~8 MiB in one element: above tonic's 4 MiB default decode/encode limit."""
    big = (np.arange(8 * 1024 * 1024 + 7, dtype=np.uint32) % 26 + 97).astype(np.uint8).tobytes()
    a = np.array([[big]], dtype=np.object_)
    out = infer(client, "string_echo", {"input-1": a}).as_numpy("output-1")
    assert out.shape == (1, 1) and out[0, 0] == big


def test_scalar_model(client):
    res = infer(client, "scalar", {"X": np.array([1.25], np.float32)})
    y = res.as_numpy("Y")
    assert y.shape == (1,) and y.dtype == np.float32 and y[0] == np.float32(2.5)


def test_reshaped_model(client):
    x = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    y = infer(client, "reshaped", {"X": x}).as_numpy("Y")
    assert y.shape == (3, 2, 2)
    np.testing.assert_array_equal(y, x + 1)


@pytest.mark.parametrize("n", [5, 0])
def test_nobatch_dynamic(client, n):
    x = np.arange(3 * n, dtype=np.float32).reshape(3, n)
    y = infer(client, "nobatch_dynamic", {"X": x}).as_numpy("Y")
    assert y.shape == (3, n)
    np.testing.assert_array_equal(y, x * 3)


@pytest.mark.parametrize("n", [4, 1, 0])
def test_int_model(client, n):
    a = np.array([1, -2, 2147483000, 7][:n], np.int32)
    b = np.array([10, 20, 600, -7][:n], np.int32)
    c = infer(client, "int_div", {"A": a, "B": b}).as_numpy("C")
    assert c.dtype == np.int32 and c.shape == (n,)
    np.testing.assert_array_equal(c, a + b)


@pytest.mark.parametrize("model,version,expect_version", [
    ("versioned", "", 3), ("versioned", "1", 1), ("versioned", "3", 3),
    ("latest_two", "", 3), ("latest_two", "2", 2), ("latest_two", "3", 3),
])
def test_version_routing(client, model, version, expect_version):
    x = np.array([10.0], np.float32)
    res = infer(client, model, {"INPUT0": x}, version=version)
    assert res.as_numpy("OUTPUT0").tolist() == [10.0 + expect_version]
    assert res.get_response().model_version == str(expect_version)


@pytest.mark.parametrize("model,version", [("versioned", "2"), ("latest_two", "1")])
def test_version_not_served(client, model, version):
    with pytest.raises(InferenceServerException) as ei:
        infer(client, model, {"INPUT0": np.array([1.0], np.float32)}, version=version)
    # Triton: core src/model_lifecycle.cc, ModelLifeCycle::GetModel, prefixed by
    # ModelRepositoryManager::GetModel (see test_grpc_errors.py).
    assert_triton_error(ei.value, grpc.StatusCode.NOT_FOUND,
                        f"Request for unknown model: '{model}' version {version} is not found")


def _ort_reference(version, x):
    import onnxruntime as ort

    path = BUNDLED_REPO / "mlp_classifier" / str(version) / "model.onnx"
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"INPUT0": x})[0]


def test_mlp_classifier_versions_match_onnxruntime(client):
    x = np.random.default_rng(7).standard_normal((5, 64)).astype(np.float32)
    got = {}
    for v in ("1", "2"):
        res = infer(client, "mlp_classifier", {"INPUT0": x}, version=v)
        assert res.get_response().model_version == v
        got[v] = res.as_numpy("OUTPUT0")
        assert got[v].shape == (5, 10) and got[v].dtype == np.float32
        np.testing.assert_allclose(got[v], _ort_reference(int(v), x), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got[v].sum(axis=1), 1.0, rtol=1e-5)
    assert not np.allclose(got["1"], got["2"], atol=1e-3), "versions 1 and 2 must differ"
    res = infer(client, "mlp_classifier", {"INPUT0": x})  # policy all: latest = 2
    assert res.get_response().model_version == "2"
    np.testing.assert_allclose(res.as_numpy("OUTPUT0"), got["2"], rtol=1e-5, atol=1e-7)


def test_mlp_classifier_max_batch(client):
    x = np.random.default_rng(9).standard_normal((32, 64)).astype(np.float32)
    y = infer(client, "mlp_classifier", {"INPUT0": x}, version="1").as_numpy("OUTPUT0")
    np.testing.assert_allclose(y, _ort_reference(1, x), rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------- typed (non-raw) inputs

TYPED_FIELD = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def test_typed_vs_raw_add_sub(stub):
    a = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((2, 16)).astype(np.float32)
    typed = infer_request("add_sub", [("INPUT0", "FP32", [2, 16], {"fp32_contents": a.flatten().tolist()}),
                                      ("INPUT1", "FP32", [2, 16], {"fp32_contents": b.flatten().tolist()})])
    raw = infer_request("add_sub", [("INPUT0", "FP32", [2, 16], a.tobytes()),
                                    ("INPUT1", "FP32", [2, 16], b.tobytes())])
    r_typed = stub.ModelInfer(typed, timeout=T)
    r_raw = stub.ModelInfer(raw, timeout=T)
    assert list(r_typed.raw_output_contents) == list(r_raw.raw_output_contents)
    assert np.frombuffer(r_typed.raw_output_contents[0], np.float32).tolist() == (a + b).flatten().tolist()
    for o in r_typed.outputs:
        assert not o.HasField("contents"), "typed request must still get raw outputs"


def test_typed_contents_every_datatype(stub):
    """Typed `contents` for every datatype that has a typed field (MLServer's default
    and what grpcurl users send), narrowing included (UINT8 from uint_contents...).

    identity_types needs all 14 inputs, but FP16/BF16 have no typed field and raw
    must not be mixed with typed, so they go as zero-element [2, 0] tensors: first
    with a present-but-empty `contents` (valid for Triton: has_contents(), 0 bytes
    expected), and if the server refuses exactly that, with no data at all."""
    rng = np.random.default_rng(11)
    expect = {t: random_array(t, (2, 3), rng) for t in TYPED_FIELD}

    def build(empty_contents: bool):
        req = infer_request("identity_types", [
            (f"IN_{t}", t, [2, 3], {TYPED_FIELD[t]: expect[t].flatten().tolist()}) for t in TYPED_FIELD])
        for t in ("FP16", "BF16"):
            inp = req.inputs.add(name=f"IN_{t}", datatype=t)
            inp.shape.extend([2, 0])
            if empty_contents:
                inp.contents.SetInParent()
        assert not req.raw_input_contents
        return req

    try:
        r = stub.ModelInfer(build(True), timeout=T)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and ("IN_FP16" in e.details() or "IN_BF16" in e.details()), \
            (e.code(), e.details())
        r = stub.ModelInfer(build(False), timeout=T)
    assert len(r.raw_output_contents) == len(r.outputs) == len(DATATYPE_NAMES)
    seen = set()
    for i, o in enumerate(r.outputs):
        t = o.name[4:]
        seen.add(t)
        raw = r.raw_output_contents[i]
        assert not o.HasField("contents"), "outputs must be raw only"
        assert o.datatype == t
        if t in ("FP16", "BF16"):
            assert list(o.shape) == [2, 0] and raw == b""
            continue
        assert list(o.shape) == [2, 3], (t, list(o.shape))
        if t == "BYTES":
            assert deserialize_bytes(raw) == expect[t].flatten().tolist()
        else:
            got = np.frombuffer(raw, np_dtype(t)).reshape(2, 3)
            assert got.tobytes() == expect[t].tobytes(), t
    assert seen == set(DATATYPE_NAMES)
