"""tritonclient.http (sync and asyncio) against kiln's REST API: health, metadata, config,
repository index, inference in binary and JSON, every datatype, classification, compression,
and Triton's error statuses. Raw-HTTP and hostile-input tests live in test_http_wire.py.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from conftest import DATATYPE_NAMES, np_dtype, random_array

LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


@pytest.fixture(scope="module")
def hclient(server):
    c = httpclient.InferenceServerClient(server.http_url, connection_timeout=30, network_timeout=30)
    yield c
    c.close()


@pytest.fixture(scope="module")
def ready_client(bundled_server):
    c = httpclient.InferenceServerClient(bundled_server.http_url, connection_timeout=30, network_timeout=30)
    yield c
    c.close()


def make_input(name, arr, binary=True, datatype=None):
    datatype = datatype or httpclient.np_to_triton_dtype(arr.dtype)
    inp = httpclient.InferInput(name, list(arr.shape), datatype)
    inp.set_data_from_numpy(arr, binary_data=binary)
    return inp


def infer(client, model, arrays: dict, binary=True, outputs=None, binary_outputs=True, **kw):
    inputs = [make_input(n, a, binary) for n, a in arrays.items()]
    outs = None if outputs is None else [
        httpclient.InferRequestedOutput(o, binary_data=binary_outputs) for o in outputs
    ]
    return client.infer(model, inputs, outputs=outs, **kw)


def add_sub_arrays(batch=1):
    a = np.arange(16 * batch, dtype=np.float32).reshape(batch, 16)
    b = np.full((batch, 16), 0.5, dtype=np.float32)
    return {"INPUT0": a, "INPUT1": b}


# --------------------------------------------------------------------------- health / metadata

def test_health(hclient, ready_client):
    assert hclient.is_server_live() is True
    assert hclient.is_server_ready() is False  # `broken` and `name_mismatch` fail to load
    assert ready_client.is_server_ready() is True
    assert hclient.is_model_ready("add_sub") is True
    assert hclient.is_model_ready("mlp_classifier", "2") is True
    assert hclient.is_model_ready("nope") is False
    assert hclient.is_model_ready("broken", "1") is False


def test_server_metadata(hclient):
    md = hclient.get_server_metadata()
    assert md["name"] == "kiln"
    for ext in ("binary_tensor_data", "classification", "model_configuration", "statistics", "schedule_policy"):
        assert ext in md["extensions"]


def test_model_metadata_and_config(hclient):
    md = hclient.get_model_metadata("mlp_classifier")
    assert md["versions"] == ["1", "2"] and md["platform"] == "onnxruntime_onnx"
    assert md["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 64]}]
    assert hclient.get_model_metadata("mlp_classifier", "1")["versions"] == ["1"]
    cfg = hclient.get_model_config("mlp_classifier")
    assert cfg["max_batch_size"] == 32
    assert cfg["output"][0]["label_filename"] == "labels.txt"
    assert cfg["input"][0]["dims"] == [64] and cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert cfg["version_policy"] == {"all": {}}
    auto = hclient.get_model_config("identity_types")
    assert auto["max_batch_size"] == 4 and len(auto["input"]) == 14


def test_model_metadata_is_written_as_triton_writes_it(server):
    # Written as Triton 2.51's REST front end writes model metadata (keys in its order, no
    # spaces): byte for byte the same on a Python model served by both. Triton builds it in core
    # src/tritonserver.cc, TRITONSERVER_ServerModelMetadata, and server src/http_server.cc,
    # HandleModelMetadata, writes it out.
    body = requests.get(f"http://{server.http_url}/v2/models/mlp_classifier/versions/1", timeout=30).text
    assert body == ('{"name":"mlp_classifier","versions":["1"],"platform":"onnxruntime_onnx",'
                    '"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[-1,64]}],'
                    '"outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[-1,10]}]}'), body


def test_metadata_matches_grpc(hclient, client):
    for model in ("add_sub", "string_echo", "identity_types", "mlp_classifier"):
        rest = hclient.get_model_metadata(model)
        grpc_md = client.get_model_metadata(model, as_json=True)
        assert rest["name"] == grpc_md["name"] and rest["platform"] == grpc_md["platform"]
        assert rest["versions"] == grpc_md["versions"]
        for kind in ("inputs", "outputs"):
            assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in rest[kind]] == \
                   [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in grpc_md[kind]]


def test_repository_index(hclient):
    index = hclient.get_model_repository_index()
    assert isinstance(index, list)
    broken = next(m for m in index if m["name"] == "broken")
    assert broken["state"] == "UNAVAILABLE" and broken["reason"]
    ready = [m for m in index if m.get("state") == "READY"]
    # kiln's row: Triton (core src/tritonserver.cc, TRITONSERVER_ServerModelIndex) leaves "reason"
    # out when it is empty; kiln writes "reason": "" on READY rows, a known difference
    # (docs/compatibility.md).
    assert {"name": "add_sub", "version": "1", "state": "READY", "reason": ""} in ready


def test_unknown_model_is_404(hclient):
    with pytest.raises(InferenceServerException) as e:
        hclient.get_model_metadata("nope")
    assert e.value.status() == "404"
    # Triton: core src/model_lifecycle.cc, ModelLifeCycle::GetModel, prefixed by
    # ModelRepositoryManager::GetModel (see test_grpc_errors.py).
    assert e.value.message() == "Request for unknown model: 'nope' is not found"


# --------------------------------------------------------------------------- inference

@pytest.mark.parametrize("binary_in,binary_out", [(True, True), (False, False), (True, False), (False, True)])
def test_add_sub(hclient, binary_in, binary_out):
    arrays = add_sub_arrays(batch=3)
    res = infer(hclient, "add_sub", arrays, binary=binary_in, outputs=["OUTPUT0", "OUTPUT1"],
                binary_outputs=binary_out)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), arrays["INPUT0"] + arrays["INPUT1"])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), arrays["INPUT0"] - arrays["INPUT1"])
    resp = res.get_response()
    assert resp["model_name"] == "add_sub" and resp["model_version"] == "1"
    assert ("data" in resp["outputs"][0]) is (not binary_out)


def test_default_request_is_binary_both_ways(hclient):
    res = infer(hclient, "add_sub", add_sub_arrays())
    outputs = res.get_response()["outputs"]
    assert [o["name"] for o in outputs] == ["OUTPUT0", "OUTPUT1"]
    assert all(o["parameters"]["binary_data_size"] == 64 and "data" not in o for o in outputs)


def test_requested_output_id_and_parameters(hclient):
    res = infer(hclient, "add_sub", add_sub_arrays(), outputs=["OUTPUT1"], request_id="abc-1",
                priority=1, timeout=10_000_000, parameters={"custom": "x", "n": 3, "f": 0.5, "b": True})
    resp = res.get_response()
    assert resp["id"] == "abc-1"
    assert [o["name"] for o in resp["outputs"]] == ["OUTPUT1"]
    assert res.as_numpy("OUTPUT0") is None


@pytest.mark.parametrize("request_compression,response_compression",
                         [("gzip", None), ("deflate", None), (None, "gzip"), (None, "deflate"), ("gzip", "gzip")])
def test_compression(hclient, request_compression, response_compression):
    arrays = add_sub_arrays(batch=2)
    res = infer(hclient, "add_sub", arrays, request_compression_algorithm=request_compression,
                response_compression_algorithm=response_compression)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), arrays["INPUT0"] + arrays["INPUT1"])


def _identity_arrays(rng, batch, width, names=DATATYPE_NAMES):
    return {f"IN_{t}": random_array(t, (batch, width), rng) for t in names}


def _check_identity(res, arrays, binary_outputs=True):
    for name, a in arrays.items():
        t = name[3:]
        out = res.as_numpy(f"OUT_{t}")
        assert out is not None and out.shape == a.shape, t
        if t == "BYTES":
            got = out.tolist()
            if not binary_outputs:  # JSON BYTES come back as str, as with Triton
                got = [[s.encode() for s in row] for row in got]
            assert got == a.tolist(), t
        else:
            assert out.dtype == np.dtype(np_dtype(t)), (t, out.dtype)
            assert out.tobytes() == a.tobytes(), t


@pytest.mark.parametrize("batch,width", [(1, 1), (2, 7), (4, 300), (1, 0)])
def test_identity_every_datatype_binary(hclient, batch, width):
    arrays = _identity_arrays(np.random.default_rng(batch * 100 + width), batch, width)
    _check_identity(infer(hclient, "identity_types", arrays), arrays)


def test_identity_json_where_json_can_carry_it(hclient):
    """FP16/BF16 go binary (Triton accepts them only so); every other type travels as JSON."""
    rng = np.random.default_rng(7)
    arrays = _identity_arrays(rng, 2, 5)
    for t in ("BYTES",):  # JSON strings must be UTF-8
        arrays[f"IN_{t}"] = np.array([[b"a", "h\u00e9".encode(), b"", b"xyz", b"q"]] * 2, dtype=np.object_)
    inputs = [make_input(n, a, binary=n[3:] in ("FP16", "BF16")) for n, a in arrays.items()]
    outputs = [httpclient.InferRequestedOutput(f"OUT_{t}", binary_data=t in ("FP16", "BF16"))
               for t in DATATYPE_NAMES]
    res = hclient.infer("identity_types", inputs, outputs=outputs)
    json_out = {o["name"]: o for o in res.get_response()["outputs"] if "data" in o}
    assert len(json_out) == 12
    for name, out in json_out.items():
        assert isinstance(out["data"], list) and all(not isinstance(v, list) for v in out["data"]), \
            f"{name}: JSON data must be flat"
    _check_identity(res, {k: v for k, v in arrays.items() if k[3:] in ("FP16", "BF16")})
    for name, a in arrays.items():
        t = name[3:]
        if t in ("FP16", "BF16", "BYTES"):
            continue
        out = res.as_numpy(f"OUT_{t}")
        assert out.dtype == np.dtype(np_dtype(t)) and out.tobytes() == a.tobytes(), t
    assert res.as_numpy("OUT_BYTES").tolist() == [[s.decode() for s in row] for row in arrays["IN_BYTES"].tolist()]


def test_non_finite_floats_as_json_tokens(hclient):
    rng = np.random.default_rng(3)
    arrays = _identity_arrays(rng, 1, 4)
    for t in ("FP32", "FP64"):
        arrays[f"IN_{t}"] = np.array([[np.nan, np.inf, -np.inf, -0.0]], dtype=np_dtype(t))
    inputs = [make_input(n, a, binary=n[3:] in ("FP16", "BF16")) for n, a in arrays.items()]
    outputs = [httpclient.InferRequestedOutput(f"OUT_{t}", binary_data=False) for t in ("FP32", "FP64")]
    res = hclient.infer("identity_types", inputs, outputs=outputs)
    for t in ("FP32", "FP64"):
        out = res.as_numpy(f"OUT_{t}")
        assert np.isnan(out[0, 0]) and out[0, 1] == np.inf and out[0, 2] == -np.inf, out


def test_fp16_as_json_is_refused_like_triton(hclient):
    rng = np.random.default_rng(4)
    arrays = _identity_arrays(rng, 1, 2)
    inputs = [make_input(n, a, binary=n[3:] == "BF16") for n, a in arrays.items()]
    with pytest.raises(InferenceServerException) as e:
        hclient.infer("identity_types", inputs)
    assert e.value.status() == "400"
    assert "receiving FP16 data via JSON is not supported" in e.value.message()


def test_bytes_echo_binary_keeps_bytes(hclient):
    a = np.array([[b"\xff\xfe\x80", b"ok", "h\u00e9llo".encode()]], dtype=np.object_)
    res = infer(hclient, "string_echo", {"input-1": a})
    assert res.as_numpy("output-1").tolist() == a.tolist()


# --------------------------------------------------------------------------- classification

def _mlp_input(batch=2):
    rng = np.random.default_rng(11)
    return rng.standard_normal((batch, 64)).astype(np.float32)


def test_classification_http_matches_grpc(hclient, client):
    x = _mlp_input()
    inp = make_input("INPUT0", x)
    res = hclient.infer("mlp_classifier", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    http_classes = res.as_numpy("OUTPUT0")
    assert http_classes.shape == (2, 3)
    ginp = grpcclient.InferInput("INPUT0", [2, 64], "FP32")
    ginp.set_data_from_numpy(x)
    gres = client.infer("mlp_classifier", [ginp], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    assert gres.as_numpy("OUTPUT0").tolist() == http_classes.tolist()

    probabilities = infer(hclient, "mlp_classifier", {"INPUT0": x}).as_numpy("OUTPUT0")
    for row, classes in zip(probabilities, http_classes):
        top = np.argsort(-row, kind="stable")[:3]
        expected = [f"{row[i]:f}:{i}:{LABELS[i]}".encode() for i in top]
        assert classes.tolist() == expected


def test_classification_as_json_of_every_class(hclient):
    # A count beyond the 10 classes is refused (test_triton_validation.py).
    x = _mlp_input(1)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False, class_count=10)
    res = hclient.infer("mlp_classifier", [make_input("INPUT0", x)], outputs=[out])
    meta = res.get_response()["outputs"][0]
    assert meta["datatype"] == "BYTES" and meta["shape"] == [1, 10]
    values = [float(s.split(":")[0]) for s in meta["data"]]
    assert values == sorted(values, reverse=True)
    assert {s.split(":")[2] for s in meta["data"]} == set(LABELS)


def test_classification_of_unsupported_type(hclient):
    a = np.array([[b"x"]], dtype=np.object_)
    out = httpclient.InferRequestedOutput("output-1", class_count=1)
    with pytest.raises(InferenceServerException) as e:
        hclient.infer("string_echo", [make_input("input-1", a)], outputs=[out])
    assert e.value.status() == "400"
    # Triton: server src/classification.cc, the default case of its per-datatype switch (the text
    # is also frozen by Triton's qa classification tests).
    assert e.value.message() == "class result not available for output due to unsupported type 'BYTES'"


# --------------------------------------------------------------------------- errors

def test_validation_errors_have_triton_statuses(hclient):
    with pytest.raises(InferenceServerException) as e:
        infer(hclient, "nope", add_sub_arrays())
    assert e.value.status() == "404"
    bad = {"INPUT0": np.zeros((1, 15), np.float32), "INPUT1": np.zeros((1, 16), np.float32)}
    with pytest.raises(InferenceServerException) as e:
        infer(hclient, "add_sub", bad)
    assert e.value.status() == "400"
    assert "unexpected shape for input 'INPUT0' for model 'add_sub'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        infer(hclient, "add_sub", add_sub_arrays(batch=9))
    assert e.value.status() == "400" and "batch-size must be <= 8" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        hclient.infer("broken", [make_input("x", np.zeros(1, np.float32))], model_version="1")
    assert e.value.status() == "503"
    # Statistics of a model without a ready version: Triton 2.51's words and status (core
    # src/tritonserver.cc, TRITONSERVER_ServerModelStatistics, both texts).
    with pytest.raises(InferenceServerException) as e:
        hclient.get_inference_statistics("nope")
    assert (e.value.status(), e.value.message()) == ("400", "requested model 'nope' is not available")
    with pytest.raises(InferenceServerException) as e:
        hclient.get_inference_statistics("add_sub", model_version="7")
    assert (e.value.status(), e.value.message()) == (
        "400", "requested model version is not available for model 'add_sub'")


def test_statistics_match_grpc(hclient, client):
    infer(hclient, "add_sub", add_sub_arrays())
    rest = hclient.get_inference_statistics("add_sub")["model_stats"]
    grpc_stats = client.get_inference_statistics("add_sub", as_json=True)["model_stats"]
    assert [s["name"] for s in rest] == [s["name"] for s in grpc_stats] == ["add_sub"]
    assert rest[0]["version"] == "1" and rest[0]["inference_count"] >= 1
    assert int(grpc_stats[0]["inference_count"]) >= rest[0]["inference_count"]
    assert set(rest[0]["inference_stats"]) >= {"success", "fail", "queue", "compute_input", "compute_infer",
                                                "compute_output"}
    everything = hclient.get_inference_statistics()["model_stats"]
    assert {"add_sub", "mlp_classifier", "string_echo"} <= {s["name"] for s in everything}


# --------------------------------------------------------------------------- asyncio client

def test_aio_client_end_to_end(server):
    async def flow():
        client = aioclient.InferenceServerClient(server.http_url, conn_timeout=30)
        try:
            assert await client.is_server_live()
            assert await client.is_model_ready("add_sub")
            md = await client.get_model_metadata("add_sub")
            assert md["name"] == "add_sub"
            arrays = add_sub_arrays(batch=2)
            results = await asyncio.gather(*[
                client.infer("add_sub", [make_input(n, a, binary) for n, a in arrays.items()],
                             outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
                for binary in (True, False, True, False)
            ])
            for res in results:
                np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), arrays["INPUT0"] + arrays["INPUT1"])
            x = _mlp_input(1)
            res = await client.infer("mlp_classifier", [make_input("INPUT0", x)],
                                     outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=2)])
            assert res.as_numpy("OUTPUT0").shape == (1, 2)
            with pytest.raises(InferenceServerException) as e:
                await client.get_model_metadata("nope")
            assert e.value.status() == "404"
        finally:
            await client.close()

    asyncio.run(flow())
