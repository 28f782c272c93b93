"""MLServer 1.7.1 REST-side flows against kiln's REST API, run as a separate process.

    python mlserver_rest_client.py HOST:PORT  ->  one JSON object on stdout

Requests are MLServer's pydantic types (`InferenceRequest`, built with its codecs) posted as JSON
with `Content-Type: application/json` and `Accept-Encoding: gzip, deflate`, as MLServer's REST
users do with `requests`; answers are validated into MLServer's types and decoded with its codecs.
The HTTP client is urllib3 (pinned in conformance/requirements.txt; it is what `requests` wraps):
`requests` itself is not in the lock. mlserver and tritonclient register the same protobuf names,
so this never runs inside the pytest process; test_mlserver_rest.py runs it.
"""

from __future__ import annotations

import json
import sys
import traceback

import numpy as np
import urllib3
from mlserver import types
from mlserver.codecs import NumpyCodec, StringRequestCodec

TIMEOUT = 30
PAYLOAD = {"a": 1, "b": "x", "text": "h\u00e9llo \u2603", "nested": {"list": [1, 2.5, None]}}
HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "gzip, deflate"}


def enum_str(value) -> str:
    """MLServer's types keep enum values as plain strings (use_enum_values); accept both."""
    return str(getattr(value, "value", value))


class Rest:
    def __init__(self, address: str):
        self.base = f"http://{address}"
        self.pool = urllib3.PoolManager(timeout=TIMEOUT, retries=False)

    def get(self, path: str):
        return self.pool.request("GET", self.base + path, headers=HEADERS)

    def post(self, path: str, body: str):
        return self.pool.request("POST", self.base + path, body=body.encode(), headers=HEADERS)


def string_flow(rest: Rest) -> dict:
    doc = json.dumps(PAYLOAD)
    request = StringRequestCodec.encode_request([doc])
    reply = rest.post("/v2/models/string_echo/infer", request.model_dump_json())
    response = types.InferenceResponse.model_validate(reply.json())
    decoded = StringRequestCodec.decode_response(response)
    out = response.outputs[0]
    return {
        "ok": True,
        "status": reply.status,
        "content_encoding": reply.headers.get("Content-Encoding"),
        "decoded": decoded,
        "expected": [doc],
        "roundtrip_json": json.loads(decoded[0]) == PAYLOAD,
        "model_name": response.model_name,
        "model_version": response.model_version,
        "output_name": out.name,
        "output_shape": list(out.shape),
        "output_datatype": enum_str(out.datatype),
        "output_content_type": (out.parameters.content_type if out.parameters else None),
        "response_content_type": (response.parameters.content_type if response.parameters else None),
    }


def numpy_flow(rest: Rest) -> dict:
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 0.25, dtype=np.float32)
    request = types.InferenceRequest(
        id="mlserver-1",
        inputs=[NumpyCodec.encode_input("INPUT0", a), NumpyCodec.encode_input("INPUT1", b)],
    )
    reply = rest.post("/v2/models/add_sub/infer", request.model_dump_json())
    response = types.InferenceResponse.model_validate(reply.json())
    outputs = {o.name: NumpyCodec.decode_output(o) for o in response.outputs}
    return {
        "ok": True,
        "id": response.id,
        "outputs": sorted(outputs),
        "shapes": {k: list(v.shape) for k, v in outputs.items()},
        "dtypes": {k: str(v.dtype) for k, v in outputs.items()},
        "add_ok": bool(np.array_equal(outputs["OUTPUT0"], a + b)),
        "sub_ok": bool(np.array_equal(outputs["OUTPUT1"], a - b)),
    }


def int_types_flow(rest: Rest) -> dict:
    """MLServer's plain RequestInput (no codec) for INT32 data against int_div (dims [-1]: NumpyCodec
    would make a 1-D array [N, 1]), decoded with NumpyCodec."""
    md = types.MetadataModelResponse.model_validate(rest.get("/v2/models/int_div").json())
    inputs = [types.RequestInput(name=t.name, shape=[3], datatype="INT32", data=values)
              for t, values in zip(md.inputs, ([7, -9, 100], [2, 3, -7]))]
    reply = rest.post("/v2/models/int_div/infer", types.InferenceRequest(inputs=inputs).model_dump_json())
    response = types.InferenceResponse.model_validate(reply.json())
    return {"ok": True, "status": reply.status,
            "datatypes": [enum_str(o.datatype) for o in response.outputs],
            "decoded": {o.name: NumpyCodec.decode_output(o).tolist() for o in response.outputs}}


def metadata_flow(rest: Rest) -> dict:
    server = types.MetadataServerResponse.model_validate(rest.get("/v2").json())
    model = types.MetadataModelResponse.model_validate(rest.get("/v2/models/add_sub").json())
    return {
        "ok": True,
        "server_name": server.name,
        "extensions": server.extensions,
        "model_name": model.name,
        "platform": model.platform,
        "versions": model.versions,
        "inputs": [(t.name, enum_str(t.datatype), t.shape) for t in model.inputs],
    }


def repository_index_flow(rest: Rest) -> dict:
    reply = rest.post("/v2/repository/index", types.RepositoryIndexRequest(ready=True).model_dump_json())
    index = types.RepositoryIndexResponse.model_validate(reply.json())
    return {"ok": True, "models": [(m.name, m.version, enum_str(m.state), m.reason) for m in index.root]}


def error_flow(rest: Rest) -> dict:
    request = StringRequestCodec.encode_request(["x"])
    reply = rest.post("/v2/models/nope/infer", request.model_dump_json())
    error = types.InferenceErrorResponse.model_validate(reply.json())
    return {"ok": True, "status": reply.status, "error": error.error}


def main() -> None:
    rest = Rest(sys.argv[1])
    flows = {
        "string": lambda: string_flow(rest),
        "numpy": lambda: numpy_flow(rest),
        "int_types": lambda: int_types_flow(rest),
        "metadata": lambda: metadata_flow(rest),
        "repository_index": lambda: repository_index_flow(rest),
        "unknown_model": lambda: error_flow(rest),
    }
    result = {}
    for name in sys.argv[2:] or list(flows):
        try:
            result[name] = flows[name]()
        except Exception as e:  # noqa: BLE001 - reported to the test
            result[name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc(limit=6)}
    json.dump(result, sys.stdout, default=str)


if __name__ == "__main__":
    main()
