"""MLServer 1.7.1 client flows against a gRPC server, run as a separate process.

    python mlserver_client.py HOST:PORT  ->  one JSON object on stdout

mlserver and tritonclient register the same protobuf names (package `inference`),
so this must never be imported by the pytest process; test_mlserver.py runs it.
Every flow is independent: it records {"ok": true, ...facts} or
{"ok": false, "error": "..."}; the test module decides what must hold.
"""

from __future__ import annotations

import json
import sys
import traceback

import grpc
import numpy as np
from mlserver import types
from mlserver.codecs import NumpyCodec, NumpyRequestCodec, StringCodec, StringRequestCodec
from mlserver.grpc import dataplane_pb2 as pb
from mlserver.grpc import dataplane_pb2_grpc
from mlserver.grpc.converters import (
    ModelInferRequestConverter,
    ModelInferResponseConverter,
    ModelMetadataResponseConverter,
    ServerMetadataResponseConverter,
)

TIMEOUT = 30
PAYLOAD = {"a": 1, "b": "x", "text": "h\u00e9llo \u2603", "nested": {"list": [1, 2.5, None]}}


def _params(p) -> dict:
    if p is None:
        return {}
    return {k: v for k, v in p.model_dump(exclude_none=True).items()} if hasattr(p, "model_dump") else dict(p)


def string_flow(stub, use_raw: bool) -> dict:
    doc = json.dumps(PAYLOAD)
    req = StringRequestCodec.encode_request([doc])
    pb_req = ModelInferRequestConverter.from_types(req, model_name="string_echo", model_version="", use_raw=use_raw)
    sent_raw = len(pb_req.raw_input_contents)
    pb_resp = stub.ModelInfer(pb_req, timeout=TIMEOUT)
    resp = ModelInferResponseConverter.to_types(pb_resp)
    strs = StringRequestCodec.decode_response(resp)
    out = resp.outputs[0]
    return {
        "ok": True,
        "sent_raw_entries": sent_raw,
        "sent_typed": any(len(i.contents.bytes_contents) for i in pb_req.inputs),
        "decoded": strs,
        "expected": [doc],
        "roundtrip_json": json.loads(strs[0]) == PAYLOAD,
        "model_name": resp.model_name,
        "model_version": resp.model_version,
        "output_name": out.name,
        "output_shape": list(out.shape),
        "output_datatype": str(out.datatype.value if hasattr(out.datatype, "value") else out.datatype),
        "output_parameters": _params(out.parameters),
        "response_parameters": _params(resp.parameters),
        "raw_output_entries": len(pb_resp.raw_output_contents),
        "typed_output": any(o.HasField("contents") for o in pb_resp.outputs),
    }


def numpy_flow(stub, use_raw: bool) -> dict:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 16)).astype(np.float32)
    b = rng.standard_normal((2, 16)).astype(np.float32)
    req = types.InferenceRequest(inputs=[NumpyCodec.encode_input("INPUT0", a), NumpyCodec.encode_input("INPUT1", b)])
    pb_req = ModelInferRequestConverter.from_types(req, model_name="add_sub", use_raw=use_raw)
    pb_resp = stub.ModelInfer(pb_req, timeout=TIMEOUT)
    resp = ModelInferResponseConverter.to_types(pb_resp)
    outs = {o.name: NumpyCodec.decode_output(o) for o in resp.outputs}
    return {
        "ok": True,
        "sent_typed": any(len(i.contents.fp32_contents) for i in pb_req.inputs),
        "sent_raw_entries": len(pb_req.raw_input_contents),
        "outputs": sorted(outs),
        "shapes": {k: list(v.shape) for k, v in outs.items()},
        "dtypes": {k: str(v.dtype) for k, v in outs.items()},
        "add_ok": bool(np.array_equal(outs["OUTPUT0"], a + b)),
        "sub_ok": bool(np.array_equal(outs["OUTPUT1"], a - b)),
        "model_version": resp.model_version,
    }


def numpy_request_codec_flow(stub) -> dict:
    """NumpyRequestCodec: one input named input-1... not add_sub's names, so use mlp_classifier
    by renaming the single input; decode_response needs exactly one output."""
    x = np.random.default_rng(5).standard_normal((3, 64)).astype(np.float32)
    req = NumpyRequestCodec.encode_request(x)
    req.inputs[0].name = "INPUT0"
    pb_req = ModelInferRequestConverter.from_types(req, model_name="mlp_classifier", model_version="1")
    pb_resp = stub.ModelInfer(pb_req, timeout=TIMEOUT)
    resp = ModelInferResponseConverter.to_types(pb_resp)
    y = NumpyRequestCodec.decode_response(resp)
    return {"ok": True, "shape": list(y.shape), "dtype": str(y.dtype),
            "row_sums": [float(s) for s in y.sum(axis=1)], "x": x.tolist(), "y": y.tolist(),
            "model_version": resp.model_version}


def content_type_flow(stub) -> dict:
    """A str input (content_type "str") and a requested output carrying content_type."""
    req = StringRequestCodec.encode_request(["one", "zw\u00f6i"])
    req.outputs = [types.RequestOutput(name="output-1", parameters=types.Parameters(content_type="str"))]
    pb_req = ModelInferRequestConverter.from_types(req, model_name="string_echo")
    pb_resp = stub.ModelInfer(pb_req, timeout=TIMEOUT)
    resp = ModelInferResponseConverter.to_types(pb_resp)
    out = resp.outputs[0]
    return {
        "ok": True,
        "request_input_content_type": pb_req.inputs[0].parameters["content_type"].string_param,
        "output_content_type": (out.parameters.content_type if out.parameters else None),
        "response_content_type": (resp.parameters.content_type if resp.parameters else None),
        "decoded_output": StringCodec.decode_output(out),
        "decoded_response": StringRequestCodec.decode_response(resp),
    }


def metadata_flow(stub) -> dict:
    md = ServerMetadataResponseConverter.to_types(stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=TIMEOUT))
    models = {}
    for name in ("add_sub", "string_echo", "mlp_classifier"):
        pb_md = stub.ModelMetadata(pb.ModelMetadataRequest(name=name), timeout=TIMEOUT)
        m = ModelMetadataResponseConverter.to_types(pb_md)
        models[name] = {
            "name": m.name, "platform": m.platform, "versions": m.versions,
            "inputs": [[t.name, str(getattr(t.datatype, "value", t.datatype)), list(t.shape)] for t in m.inputs or []],
            "outputs": [[t.name, str(getattr(t.datatype, "value", t.datatype)), list(t.shape)] for t in m.outputs or []],
            "has_field6": len(pb_md.parameters) > 0,
        }
    # identity_types carries BF16, which MLServer's pydantic Datatype lacks: only the protobuf parse
    # (no DecodeError from a stray field 6) is checked for it, not the conversion.
    pb_md = stub.ModelMetadata(pb.ModelMetadataRequest(name="identity_types"), timeout=TIMEOUT)
    models["identity_types"] = {"name": pb_md.name, "n_inputs": len(pb_md.inputs), "has_field6": len(pb_md.parameters) > 0}
    return {
        "ok": True,
        "server": {"name": md.name, "version": md.version, "extensions": md.extensions},
        "live": stub.ServerLive(pb.ServerLiveRequest(), timeout=TIMEOUT).live,
        "ready": stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT).ready,
        "model_ready": {n: stub.ModelReady(pb.ModelReadyRequest(name=n), timeout=TIMEOUT).ready
                        for n in ("add_sub", "string_echo")},
        "models": models,
    }


def repository_index_flow(stub) -> dict:
    resp = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=TIMEOUT)
    items = [types.RepositoryIndexResponseItem(name=m.name, version=m.version or None,
                                               state=types.State(m.state), reason=m.reason) for m in resp.models]
    return {"ok": True, "models": [[i.name, i.version, getattr(i.state, "value", i.state)] for i in items]}


def error_flow(stub) -> dict:
    req = StringRequestCodec.encode_request(["x"])
    pb_req = ModelInferRequestConverter.from_types(req, model_name="no_such_model")
    try:
        stub.ModelInfer(pb_req, timeout=TIMEOUT)
    except grpc.RpcError as e:
        return {"ok": True, "code": e.code().name, "details": e.details()}
    return {"ok": False, "error": "unknown model answered OK"}


EMBED_SENTENCES = ["kiln serves sentence embeddings.", "MLServer's StringRequestCodec sends these strings.",
                   "h\u00e9llo w\u00f6rld \u2603"]


def embeddings_flow(stub, use_raw: bool) -> dict:
    """StringRequestCodec encodes sentences as one BYTES input [n, 1] (named input-1; renamed to the model's
    text input); NumpyCodec decodes the FP32 embeddings."""
    req = StringRequestCodec.encode_request(EMBED_SENTENCES)
    req.inputs[0].name = "text"
    pb_req = ModelInferRequestConverter.from_types(req, model_name="all_minilm_l6_v2", use_raw=use_raw)
    pb_resp = stub.ModelInfer(pb_req, timeout=TIMEOUT)
    resp = ModelInferResponseConverter.to_types(pb_resp)
    out = resp.outputs[0]
    return {"ok": True, "sentences": EMBED_SENTENCES, "sent_shape": list(req.inputs[0].shape), "name": out.name,
            "embedding": NumpyCodec.decode_output(out).tolist()}


def main() -> None:
    addr = sys.argv[1]
    channel = grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 2**31 - 1),
                                                   ("grpc.max_send_message_length", 2**31 - 1)])
    stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
    flows = {
        "string_typed": lambda: string_flow(stub, use_raw=False),
        "string_raw": lambda: string_flow(stub, use_raw=True),
        "numpy_typed": lambda: numpy_flow(stub, use_raw=False),
        "numpy_raw": lambda: numpy_flow(stub, use_raw=True),
        "numpy_request_codec": lambda: numpy_request_codec_flow(stub),
        "content_type": lambda: content_type_flow(stub),
        "metadata": lambda: metadata_flow(stub),
        "repository_index": lambda: repository_index_flow(stub),
        "unknown_model": lambda: error_flow(stub),
        "embeddings_typed": lambda: embeddings_flow(stub, use_raw=False),
        "embeddings_raw": lambda: embeddings_flow(stub, use_raw=True),
    }
    only = sys.argv[2:] or list(flows)
    result = {}
    for name in only:
        try:
            result[name] = flows[name]()
        except grpc.RpcError as e:
            result[name] = {"ok": False, "error": f"RpcError {e.code().name}: {e.details()}"}
        except Exception as e:  # noqa: BLE001 - reported to the test
            result[name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc(limit=6)}
    channel.close()
    json.dump(result, sys.stdout, default=str)


if __name__ == "__main__":
    main()
