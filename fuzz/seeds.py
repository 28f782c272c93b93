#!/usr/bin/env python3
"""(Re)write the committed seed corpus under fuzz/corpus/<target>/: a few valid and nearly valid
inputs per target, so libFuzzer starts from the real formats instead of from nothing.

    .venv/bin/python fuzz/seeds.py

Needs tritonclient (for the gRPC message classes); the files are deterministic.
"""
import glob
import json
import os
import struct

from tritonclient.grpc import service_pb2 as pb

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    path = os.path.join(CORPUS, target, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(path, "wb") as f:
        f.write(data)


def frame(*elements):
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def f32(*values):
    return struct.pack(f"<{len(values)}f", *values)


# Selector bytes pick the fuzz contract (fuzz_targets/spec.rs): 0 batched FP32 [2] + BYTES [-1],
# 1 unbatched INT64 [-1, 3], 2 FP16 [2, 2] with reshape.
def bytes_framing():
    put("bytes_framing", "two", b"\x02" + frame(b"ab", b""))
    put("bytes_framing", "empty", b"\x00")
    put("bytes_framing", "truncated", b"\x01" + b"\x05\x00\x00\x00ab")
    put("bytes_framing", "huge_len", b"\x01" + b"\xff\xff\xff\xff")


def grpc_infer_request():
    def req(inputs, raw=(), **kw):
        r = pb.ModelInferRequest(model_name="m", id="seed", **kw)
        for name, datatype, shape, contents in inputs:
            t = r.inputs.add(name=name, datatype=datatype, shape=shape)
            if contents is not None:
                t.contents.CopyFrom(contents)
        r.raw_input_contents.extend(raw)
        return r.SerializeToString()

    put("grpc_infer_request", "batched_raw", b"\x00" + req(
        [("F", "FP32", [1, 2], None), ("S", "BYTES", [1, 2], None)],
        [f32(1.0, 2.0), frame(b"x", b"yz")]))
    typed = pb.InferTensorContents(fp32_contents=[1.0, 2.0, 3.0, 4.0])
    strings = pb.InferTensorContents(bytes_contents=[b"a", b"b"])
    put("grpc_infer_request", "batched_typed", b"\x00" + req(
        [("F", "FP32", [2, 2], typed), ("S", "BYTES", [2, 1], strings)]))
    ints = pb.InferTensorContents(int64_contents=[1, 2, 3, -4, 5, 6])
    r = req([("I", "INT64", [2, 3], ints)])
    put("grpc_infer_request", "unbatched_typed", b"\x01" + r)
    put("grpc_infer_request", "fp16_reshape", b"\x02" + req([("H", "FP16", [1, 2, 2], None)], [b"\x00\x3c" * 4]))
    params = pb.ModelInferRequest(model_name="m")
    params.parameters["priority"].uint64_param = 1
    params.parameters["s"].string_param = "v"
    params.inputs.add(name="I", datatype="INT64", shape=[1, 3]).parameters["p"].bool_param = True
    params.raw_input_contents.append(struct.pack("<3q", 1, 2, 3))
    params.outputs.add(name="O").parameters["classification"].int64_param = 2
    put("grpc_infer_request", "parameters", b"\x01" + params.SerializeToString())
    put("grpc_infer_request", "huge_shape", b"\x01" + req([("I", "INT64", [1 << 40, 1 << 40], None)], [b""]))


def grpc_compressed_request():
    """The grpc_infer_request seeds, plain (0), gzip (1) and zlib (2), and an entry bomb."""
    import gzip
    import zlib

    source = os.path.join(CORPUS, "grpc_infer_request")
    for name in sorted(os.listdir(source)):
        with open(os.path.join(source, name), "rb") as f:
            selector, message = f.read(1), f.read()
        put("grpc_compressed_request", f"{name}_plain", b"\x00" + selector + message)
        put("grpc_compressed_request", f"{name}_gzip", b"\x01" + selector + gzip.compress(message, mtime=0))
        put("grpc_compressed_request", f"{name}_zlib", b"\x02" + selector + zlib.compress(message))
    put("grpc_compressed_request", "empty_inputs", b"\x01\x00" + gzip.compress(b"\x2a\x00" * 100_000, mtime=0))


def rest_json():
    put("rest_json", "data_fp32", b"\x0b\x04" + b"[[1.5, -2], [NaN, Infinity]]")
    put("rest_json", "data_bytes", b"\x0d\x02" + b'["a\\u00e9", "\\n"]')
    put("rest_json", "data_bool", b"\x00\x03" + b"[true, false, true]")
    put("rest_json", "data_int64", b"\x08\x02" + b"[-9223372036854775808, 9223372036854775807]")
    put("rest_json", "document", b"\x00\x00" + json.dumps(
        {"id": "x", "inputs": [{"name": "a", "data": [1, 2.5e3, -0.0]}], "parameters": {"k": None}}).encode())
    put("rest_json", "deep", b"\x00\x01" + b"[" * 70 + b"1" + b"]" * 70)


def rest_infer_request():
    header = {"id": "r1", "parameters": {"binary_data_output": True},
              "inputs": [{"name": "F", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}},
                         {"name": "S", "datatype": "BYTES", "shape": [1, 1], "data": ["hello"]}],
              "outputs": [{"name": "O", "parameters": {"binary_data": False}}]}
    text = json.dumps(header).encode()
    put("rest_infer_request", "binary", b"\x00" + struct.pack(">H", len(text)) + text + f32(1.0, 2.0))
    js = {"inputs": [{"name": "I", "datatype": "INT64", "shape": [2, 3], "data": [[1, 2, 3], [4, 5, 6]]}]}
    put("rest_infer_request", "json", b"\x01\xff\xff" + json.dumps(js).encode())
    put("rest_infer_request", "raw", b"\x01\x00\x00" + struct.pack("<6q", *range(6)))
    put("rest_infer_request", "fp16_binary", b"\x02" + struct.pack(">H", 0) + b"\x00\x3c" * 4)
    bad = {"inputs": [{"name": "F", "datatype": "FP32", "shape": [1, 2],
                       "data": [1], "parameters": {"binary_data_size": 8}}]}
    put("rest_infer_request", "both_data", b"\x00\xff\xff" + json.dumps(bad).encode())


def config_pbtxt():
    for path in sorted(glob.glob(os.path.join(ROOT, "model_repository", "*", "config.pbtxt"))
                       + glob.glob(os.path.join(ROOT, "tests", "fixtures", "model_repository", "*", "config.pbtxt"))):
        with open(path, "rb") as f:
            put("config_pbtxt", os.path.basename(os.path.dirname(path)), f.read())
    put("config_pbtxt", "all_fields", """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 4
version_policy: { specific { versions: [1, 3] } }
input [ { name: "a" data_type: TYPE_STRING dims: [ -1 ] reshape: { shape: [ ] } } ]
output [ { name: "b" data_type: TYPE_FP16 dims: [ 2, 2 ] label_filename: "l.txt" } ]
instance_group [ { count: 3 kind: KIND_AUTO }, { kind: KIND_MODEL } ]
dynamic_batching { preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 10
  priority_levels: 2 default_priority_level: 1
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5 allow_timeout_override: true max_queue_size: 3 }
  priority_queue_policy { key: 2 value: { max_queue_size: 1 } } }
parameters { key: "max_inflight_requests" value: { string_value: "8" } }
# a comment with "quotes" and [brackets
""")


# Selector byte: % 3 picks the path (fuzz_targets/generate_request.rs): 0 the generic mapping, whose
# contract is (selector / 3) % 3 (0 FP32/INT32/BOOL batched, 1 BYTES + UINT64 [2, -1], 2 zero-sized
# and two variable dimensions); 1 a generation model's REST body; 2 a gRPC request to one.
def generate_request():
    put("generate_request", "mapped_batched", b"\x00" + json.dumps(
        {"x": [1.5, 2, -3, 4], "n": 7, "parameters": {"flag": True, "k": 3}, "id": "a"}).encode())
    put("generate_request", "mapped_unbatched", b"\x03" + json.dumps(
        {"text": ["kiln", "\u00e9"], "ids": [1, 2, 3, 4], "tag": "x"}).encode())
    put("generate_request", "mapped_zero", b"\x06" + json.dumps({"empty": [], "grid": [1, -2, 3, 4]}).encode())
    put("generate_request", "text", b"\x01" + json.dumps(
        {"text_input": "The potter", "max_tokens": 8, "stop": ["\n"],
         "parameters": {"temperature": 0.5, "top_k": 4, "seed": 1}}).encode())
    sampling = json.dumps({"max_tokens": 3, "top_p": 0.9, "stop": "x", "stream": False})
    r = pb.ModelInferRequest(model_name="m", id="seed")
    r.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    r.inputs.add(name="sampling_parameters", datatype="BYTES", shape=[1])
    r.inputs.add(name="max_tokens", datatype="INT32", shape=[1])
    r.raw_input_contents.extend([frame(b"The potter"), frame(sampling.encode()), struct.pack("<i", 4)])
    r.parameters["temperature"].double_param = 0.7
    put("generate_request", "grpc", b"\x02" + r.SerializeToString())


if __name__ == "__main__":
    bytes_framing()
    grpc_infer_request()
    grpc_compressed_request()
    rest_json()
    rest_infer_request()
    config_pbtxt()
    generate_request()
    for target in sorted(os.listdir(CORPUS)):
        print(f"{target}: {len(os.listdir(os.path.join(CORPUS, target)))} seeds")
