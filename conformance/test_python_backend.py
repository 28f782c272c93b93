"""Triton's Python backend: models whose `model.py` defines `TritonPythonModel`, written here as
Triton's own examples write them (`import triton_python_backend_utils as pb_utils`), served by
kiln and driven with tritonclient over both protocols: a Python add_sub answers what the ONNX
add_sub answers, on two instances under concurrent load; strings, request ids and parameters
reach the model; the response sender of a non-decoupled model; a response's TritonError keeps its
code, an exception fails its request with Triton's message, a stub that dies is started again
for the next request; an `initialize` that raises fails the load with its message; `finalize`
runs when the model unloads; an ensemble runs a Python step before an ONNX one."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, REPO_ROOT, RPC_TIMEOUT, doc_section, start_server, stop_server

PY_ADD_SUB = '''
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        output = pb_utils.get_output_config_by_name(self.config, "OUTPUT0")
        self.dtype = pb_utils.triton_string_to_numpy(output["data_type"])
        pb_utils.Logger.log_info(f"initialized {args['model_instance_name']} ({args['model_instance_kind']})")
        print("a print does not disturb kiln")

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype)),
            ]))
        return responses
'''

PY_ADD_SUB_CONFIG = '''
name: "py_add_sub"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { }
instance_group [ { count: 2 kind: KIND_CPU } ]
'''

# Answers through the response sender (a model that is not decoupled may), and finalize leaves a
# mark where its config says.
PY_ECHO = '''
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.mark = config["parameters"]["finalize_mark"]["string_value"]

    def execute(self, requests):
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([t.decode().upper().encode() for t in texts.reshape(-1)], dtype=np.object_)
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("UPPER", upper.reshape(texts.shape)),
                pb_utils.Tensor("ID", np.array([request.request_id()], dtype=np.object_)),
                pb_utils.Tensor("PARAMETERS", np.array([request.parameters()], dtype=np.object_)),
                pb_utils.Tensor("ASKED", np.array([",".join(sorted(request.requested_output_names()))], dtype=np.object_)),
            ]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def finalize(self):
        # Written aside and renamed, so that the mark never exists empty (a test polls for it).
        with open(self.mark + ".tmp", "w") as f:
            f.write("finalized")
        os.replace(self.mark + ".tmp", self.mark)
'''

PY_ECHO_CONFIG = '''
name: "py_echo"
backend: "python"
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "ID" data_type: TYPE_STRING dims: [ 1 ] },
         { name: "PARAMETERS" data_type: TYPE_STRING dims: [ 1 ] },
         { name: "ASKED" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "finalize_mark" value: { string_value: "MARK" } }
'''

PY_FAULTY = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_warn("faulty model starting")

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            if value == 1:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("one is refused", pb_utils.TritonError.INVALID_ARG)))
                continue
            if value == 2:
                raise ValueError("two is a bad number")
            if value == 3:
                os._exit(3)
            if value == 4:
                return []
            if value == 7:
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("Y", np.array([7.0], dtype=np.float64))]))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("Y", np.array([value * 10], dtype=np.int32))]))
        return responses
'''

PY_FAULTY_CONFIG = '''
name: "py_faulty"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

PY_BROKEN = '''
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("the weights are missing")

    def execute(self, requests):
        return []
'''

PY_BROKEN_CONFIG = '''
name: "py_broken"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

# Doubles INPUT0, then add_sub (ONNX) adds INPUT1.
PY_DOUBLE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "DOUBLED", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)]) for r in requests]
'''

PY_DOUBLE_CONFIG = '''
name: "py_double"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "DOUBLED" data_type: TYPE_FP32 dims: [ 16 ] } ]
'''

# Hands every input back, whatever its type; with parameter via=dlpack, numeric tensors go through
# DLPack (a capsule from to_dlpack(), or the array itself as the exporter).
PY_IDENTITY = '''
import json
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            dlpack = json.loads(r.parameters()).get("via") == "dlpack"
            outputs = []
            for i, t in enumerate(r.inputs()):
                name = "OUT_" + t.name()[3:]
                if dlpack and t.as_numpy().dtype != object:
                    outputs.append(pb_utils.Tensor.from_dlpack(name, t.to_dlpack() if i % 2 else t.as_numpy()))
                else:
                    outputs.append(pb_utils.Tensor(name, t.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

TYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64",
         "BYTES"]


def identity_config():
    config_type = lambda t: "TYPE_STRING" if t == "BYTES" else f"TYPE_{t}"
    inputs = ", ".join(f'{{ name: "IN_{t}" data_type: {config_type(t)} dims: [ -1 ] }}' for t in TYPES)
    outputs = ", ".join(f'{{ name: "OUT_{t}" data_type: {config_type(t)} dims: [ -1 ] }}' for t in TYPES)
    return f'name: "py_identity" backend: "python" max_batch_size: 4 input [ {inputs} ] output [ {outputs} ]'


# Calls other models (Triton's BLS): add_sub (ONNX) with exec(), py_add_sub with async_exec() from
# an async execute, and a model that does not exist.
PY_CALLS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            onnx = pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)]).exec()
            if onnx.has_error():
                raise pb_utils.TritonModelException(onnx.error().message())
            doubled = pb_utils.get_output_tensor_by_name(onnx, "OUTPUT0").as_numpy()
            python = await pb_utils.InferenceRequest(
                model_name="py_add_sub", requested_output_names=["OUTPUT1"],
                inputs=[pb_utils.Tensor("INPUT0", doubled), pb_utils.Tensor("INPUT1", x)]).async_exec()
            back = pb_utils.get_output_tensor_by_name(python, "OUTPUT1").as_numpy()
            assert pb_utils.get_output_tensor_by_name(python, "OUTPUT0") is None
            missing = pb_utils.InferenceRequest(model_name="no_such_model", requested_output_names=["Y"],
                                                inputs=[pb_utils.Tensor("X", x)]).exec()
            wrong = pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0"],
                                              inputs=[pb_utils.Tensor("INPUT0", x)]).exec()
            errors = np.array([missing.error().message(), wrong.error().message()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("DOUBLED", doubled), pb_utils.Tensor("BACK", back), pb_utils.Tensor("ERRORS", errors)]))
        return responses
'''

PY_CALLS_CONFIG = '''
name: "py_calls"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
output [ { name: "DOUBLED" data_type: TYPE_FP32 dims: [ 1, 16 ] }, { name: "BACK" data_type: TYPE_FP32 dims: [ 1, 16 ] },
         { name: "ERRORS" data_type: TYPE_STRING dims: [ 2 ] } ]
'''

# Tells each request how many requests its execute call held. A call with a request of -1 is a
# gate: it says it holds the only instance (the file `holding` in its model directory) and waits
# until the test releases it (the file `release`), so that the requests after it wait together,
# whatever the machine's load: no sleep decides an order.
PY_BATCH = '''
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"]

    def execute(self, requests):
        values = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        if any((v == -1).any() for v in values):
            holding, release = (os.path.join(self.dir, n) for n in ("holding", "release"))
            open(holding, "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.005)
            for path in (holding, release):
                if os.path.exists(path):
                    os.remove(path)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("CALL_SIZE", np.full(v.shape, len(requests), dtype=np.int32))]) for v in values]
'''

PY_BATCH_CONFIG = '''
name: "py_batch"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "CALL_SIZE" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
'''

# The batcher's settings apply to Python models as to any other (Triton's dynamic batcher serves
# every backend): a delay that gathers company, and a queue policy.
PY_DELAY_CONFIG = '''
name: "py_delay"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "CALL_SIZE" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 20000000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
'''

PY_POLICY_CONFIG = '''
name: "py_policy"
backend: "python"
max_batch_size: 1
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "CALL_SIZE" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching {
  default_queue_policy {
    max_queue_size: 1
    timeout_action: REJECT
    default_timeout_microseconds: 1000000
    allow_timeout_override: true
  }
}
instance_group [ { count: 1 kind: KIND_CPU } ]
'''

# Declares its tensors in code, as newer Triton models do; its config.pbtxt names only the backend.
PY_AUTO = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.add_output({"name": "NEGATED", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "NEGATED", -pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
'''

# Its code and its config.pbtxt disagree on a tensor's type.
PY_AUTO_CONFLICT = PY_AUTO.replace("TYPE_FP32\", \"dims\": [2]})\n        auto_complete_model_config.add_output",
                                   "TYPE_INT32\", \"dims\": [2]})\n        auto_complete_model_config.add_output")

# Decoupled: counts to N, one response each, from a thread of its own after execute has returned,
# then says "final" alone; N = 0 sends only that, N = -1 an error response first. With the config
# parameter "pause", it waits that many seconds between responses (a model streaming slowly, as an
# LLM does).
PY_COUNT = '''
import json
import os
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.pause = float(parameters.get("pause", {}).get("string_value", 0))

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            threading.Thread(target=self.count, args=(request.get_response_sender(), n)).start()
        return None

    def count(self, sender, n):
        if n == -1:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("cannot count to -1")))
        for i in range(n):
            if i:
                time.sleep(self.pause)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], dtype=np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

COUNT_IO = '''
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
'''

PY_COUNT_CONFIG = 'name: "py_count" backend: "python"' + COUNT_IO
PY_SLOW_COUNT_CONFIG = ('name: "py_slow_count" backend: "python"' + COUNT_IO
                        + 'parameters { key: "pause" value { string_value: "0.3" } }')

# Passes on each response of py_slow_count to its own client as it comes (Triton's decoupled BLS).
PY_FORWARD = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            called = pb_utils.InferenceRequest(model_name="py_slow_count", requested_output_names=["I"],
                                               inputs=[pb_utils.get_input_tensor_by_name(request, "N")])
            for response in called.exec(decoupled=True):
                sender.send(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(response, "I")]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# Reads two of py_slow_count's responses, leaves the rest, then calls add_sub: the call is answered
# (the responses left unread do not stand in its way), and so is the model's next request.
PY_PARTIAL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            called = pb_utils.InferenceRequest(model_name="py_slow_count", requested_output_names=["I"],
                                               inputs=[pb_utils.get_input_tensor_by_name(request, "N")])
            first = []
            for response in called.exec(decoupled=True):
                first.append(int(pb_utils.get_output_tensor_by_name(response, "I").as_numpy()[0]))
                if len(first) == 2:
                    break
            x = np.ones((1, 16), dtype=np.float32)
            summed = pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0"],
                                               inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)]).exec()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("FIRST", np.array(first, dtype=np.int32)),
                pb_utils.Tensor("SUM", pb_utils.get_output_tensor_by_name(summed, "OUTPUT0").as_numpy()[0])]))
        return responses
'''

PY_PARTIAL_CONFIG = '''
name: "py_partial"
backend: "python"
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "FIRST" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] } ]
'''


# Notes each execute call in a file its config names; raises on a negative input.
PY_WARM = '''
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.notes = json.loads(args["model_config"])["parameters"]["notes"]["string_value"]

    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                raise ValueError("negative warmup")
            with open(self.notes, "a") as notes:
                notes.write(f"{len(requests)} {x.tolist()}\\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros((1, 1), np.float32))]) for _ in requests]
'''


def warm_config(name, notes, data):
    return (f'name: "{name}" backend: "python" max_batch_size: 2 '
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ] '
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ] '
            f'parameters {{ key: "notes" value: {{ string_value: "{notes}" }} }} '
            'model_warmup [ { name: "ones" batch_size: 2 count: 2 '
            f'inputs {{ key: "X" value: {{ data_type: TYPE_FP32 dims: [ 1 ] input_data_file: "{data}" }} }} }} ]')


# Counts its requests and keeps its last input in custom metrics (Triton's pb_utils.MetricFamily);
# X = 0 makes a series of its own (kind "temporary") that X = 1 lets go.
PY_METRICS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        requests = pb_utils.MetricFamily("py_test_requests_total", "Requests the model saw", pb_utils.MetricFamily.COUNTER)
        last = pb_utils.MetricFamily("py_test_last_value", "The last value seen", pb_utils.MetricFamily.GAUGE)
        self.requests = requests.Metric(labels={"model": args["model_name"], "kind": "test"})
        self.last = last.Metric(labels={"model": args["model_name"]})
        # vLLM's backend names its metrics with colons, and times with histograms.
        sizes = pb_utils.MetricFamily("py_test:value_size", "Sizes of the values seen", pb_utils.MetricFamily.HISTOGRAM)
        self.sizes = sizes.Metric(labels={"model": args["model_name"]}, buckets=[1.0, 5.0, 10.0])
        # Triton deletes a family whose object goes (its metrics refuse to change from then on).
        self.families = (requests, last, sizes)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            self.requests.increment(1)
            self.last.set(x)
            self.sizes.observe(abs(x))
            if x == 0:
                self.temporary = self.families[0].Metric(labels={"model": "py_metrics", "kind": "temporary"})
                self.temporary.increment(1)
            elif x == 1:
                del self.temporary
            try:
                self.requests.increment(-1)
                refused = 0
            except pb_utils.TritonModelException:
                refused = 1
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "Y", np.array([self.requests.value(), refused], dtype=np.float32))]))
        return responses
'''

PY_METRICS_CONFIG = '''
name: "py_metrics"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
'''

# Collects decoupled models' responses: py_count's (a decoupled Python model) and tiny_decoder's
# (a generation model, streaming), then a call to a model that is not there.
# Works on a request until its client goes away, then notes how it ended in NOTES/<id>: the
# decoupled one sends a tick every 20 ms from a thread of its own (execute returns at once),
# the other answers nothing until cancelled. Neither stops on its own for 20 s.
PY_PATIENT = '''
import json
import os
import os
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.notes = config["parameters"]["notes"]["string_value"]
        self.decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)

    def note(self, request, text):
        with open(os.path.join(self.notes, request.request_id()), "w") as f:
            f.write(text)

    def execute(self, requests):
        (request,) = requests
        if self.decoupled:
            # Answered from a thread of its own: execute returns at once.
            threading.Thread(target=self.work, args=(request,)).start()
            return None
        return [self.work(request)]

    def work(self, request):
        sender = request.get_response_sender()
        # Asked to be quiet, the decoupled one sends nothing until the end.
        quiet = json.loads(request.parameters()).get("quiet", False)
        deadline, ticks = time.monotonic() + 20, 0
        tick = lambda: pb_utils.InferenceResponse([pb_utils.Tensor("TICKS", np.array([ticks], dtype=np.int32))])
        while time.monotonic() < deadline:
            if request.is_cancelled() and sender.is_cancelled():
                self.note(request, "cancelled after %d ticks" % ticks)
                if self.decoupled:
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return tick()
            if self.decoupled and not quiet:
                sender.send(tick())
            ticks += 1
            time.sleep(0.02)
        self.note(request, "never cancelled")
        error = pb_utils.TritonError("never cancelled")
        if self.decoupled:
            sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return pb_utils.InferenceResponse(error=error)
'''


# Decoupled: answers from a thread of its own after execute has returned, with what add_sub
# (ONNX) makes of its input, asked through exec() from that thread.
PY_RELAY = '''
import os
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.relay, args=(request,)).start()
        return None

    def relay(self, request):
        x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
        if x[0][0] == -99:
            # One response, then the process dies with the request still open.
            request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", x)]))
            time.sleep(0.2)
            os._exit(3)
        called = pb_utils.InferenceRequest(
            model_name="add_sub", requested_output_names=["OUTPUT0"],
            inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)]).exec()
        sender = request.get_response_sender()
        if called.has_error():
            sender.send(pb_utils.InferenceResponse(error=called.error()),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        out = pb_utils.get_output_tensor_by_name(called, "OUTPUT0").as_numpy()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", out)]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

PY_RELAY_CONFIG = '''
name: "py_relay"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] } ]
model_transaction_policy { decoupled: true }
'''


# Manages the server's models for its client (pb_utils.load_model, unload_model, is_model_ready):
# parameter "action" with "model"; answers READY (is_model_ready after the action).
PY_MANAGER = '''
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils

DYNAMIC = \'\'\'
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", -pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
\'\'\'


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            asked = json.loads(request.parameters())
            model, action = asked["model"], asked["action"]
            if action == "load":
                config = {"backend": "python", "max_batch_size": 4,
                          "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
                          "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}]}
                pb_utils.load_model(model, config=json.dumps(config), files={"file:1/model.py": DYNAMIC.encode()})
            elif action == "unload":
                pb_utils.unload_model(model)
            ready = pb_utils.is_model_ready(model)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("READY", np.array([ready]))]))
        return responses
'''

PY_MANAGER_CONFIG = '''
name: "py_manager"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "READY" data_type: TYPE_BOOL dims: [ 1 ] } ]
'''


# Stateful: adds up each sequence's values, keeping the totals itself by correlation_id(), and
# says where it ran and what the sequence batcher told it (flags and its control inputs).
PY_ACCUMULATE = '''
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]
        self.totals = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            corrid, flags = request.correlation_id(), request.flags()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.totals[corrid] = 0.0
            first = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]
            self.totals[corrid] += float(first("X"))
            total = self.totals[corrid]
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                del self.totals[corrid]
            note = json.dumps({"instance": self.instance, "flags": flags, "corrid": corrid,
                               "start": float(first("START")), "control": int(first("CORRID"))})
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TOTAL", np.array([[total]], dtype=np.float32)),
                pb_utils.Tensor("NOTE", np.array([[note.encode()]], dtype=np.object_))]))
        return responses
'''

# Calls py_accumulate for its client, in the sequence and with the flags its parameters name.
PY_SEQUENCE_CALLER = '''
import json
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            asked = json.loads(request.parameters())
            called = pb_utils.InferenceRequest(
                model_name="py_accumulate", requested_output_names=["TOTAL"],
                inputs=[pb_utils.Tensor("X", pb_utils.get_input_tensor_by_name(request, "X").as_numpy())],
                correlation_id=asked["sequence"], flags=asked["flags"]).exec()
            if called.has_error():
                raise pb_utils.TritonModelException(called.error().message())
            responses.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(called, "TOTAL")]))
        return responses
'''

PY_ACCUMULATE_CONFIG = '''
name: "py_accumulate"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "NOTE" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
'''


# A decoupled stateful model: per sequence, a running total, answered twice per request: at
# once from execute, then (ten times the total, final) from a thread half a second after
# execute returned.
PY_STREAM_ACCUMULATE = '''
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]
        self.totals = {}

    def execute(self, requests):
        for request in requests:
            corrid, flags = request.correlation_id(), request.flags()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.totals[corrid] = 0.0
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy().reshape(-1)[0]
            self.totals[corrid] += float(x)
            total = self.totals[corrid]
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                del self.totals[corrid]
            sender = request.get_response_sender()
            sender.send(self.response(total))
            threading.Thread(target=self.later, args=(sender, total * 10)).start()
        return None

    def response(self, total):
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("TOTAL", np.array([[total]], dtype=np.float32)),
            pb_utils.Tensor("INSTANCE", np.array([[self.instance.encode()]], dtype=np.object_))])

    def later(self, sender, total):
        time.sleep(0.5)
        sender.send(self.response(total), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

PY_STREAM_ACCUMULATE_CONFIG = PY_ACCUMULATE_CONFIG.replace('"py_accumulate"', '"py_stream_accumulate"').replace(
    '{ name: "NOTE" data_type: TYPE_STRING dims: [ 1 ] }', '{ name: "INSTANCE" data_type: TYPE_STRING dims: [ 1 ] }'
) + "model_transaction_policy { decoupled: true }\n"


# Counts down from N, one step per execute call, rescheduling the request until it reaches 0
# (Triton's request rescheduling, `iterative_sequence`); decoupled, each step is a response.
PY_ITERATE = '''
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)
        self.left = {}

    def execute(self, requests):
        time.sleep(0.05)
        responses = []
        for request in requests:
            key = request.correlation_id()
            if key not in self.left:
                self.left[key] = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            self.left[key] -= 1
            left = self.left[key]
            response = pb_utils.InferenceResponse([
                pb_utils.Tensor("LEFT", np.array([[left]], dtype=np.int32)),
                pb_utils.Tensor("BATCH", np.array([[len(requests)]], dtype=np.int32)),
                pb_utils.Tensor("FLAGS", np.array([[request.flags()]], dtype=np.int32))])
            if left > 0:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            else:
                del self.left[key]
            if self.decoupled:
                final = 0 if left > 0 else pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                request.get_response_sender().send(response, flags=final)
            else:
                responses.append(None if left > 0 else response)
        return None if self.decoupled else responses
'''


def iterate_config(name, decoupled, iterative=True):
    return f'''
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "LEFT" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
{"sequence_batching { iterative_sequence: true }" if iterative else ""}
model_transaction_policy {{ decoupled: {str(decoupled).lower()} }}
'''


# Answers its request's timeout() and, called without the "inner" parameter, the timeout a call
# it makes to itself (another instance) reaches that call with: twice its own, or a minute.
PY_TIMEOUTS = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            inner = 0
            if not json.loads(request.parameters()).get("inner"):
                # Triton 2.51's call options (memory, trace, flags), as models written for it pass them.
                call = pb_utils.InferenceRequest(
                    model_name="py_timeouts", requested_output_names=["OWN"],
                    inputs=[pb_utils.Tensor("X", np.zeros([1], dtype=pb_utils.TRITON_STRING_TO_NUMPY["TYPE_INT32"]))],
                    parameters={"inner": True}, timeout=request.timeout() * 2 or 60_000_000,
                    preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
                    trace=request.trace())
                call.set_flags(0)
                pb_utils.Logger.log(f"calling with trace context {request.trace().get_context()}",
                                    pb_utils.Logger.VERBOSE)
                answer = call.exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                inner = int(pb_utils.get_output_tensor_by_name(answer, "OWN").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OWN", np.array([request.timeout()], dtype=np.int64)),
                pb_utils.Tensor("INNER", np.array([inner], dtype=np.int64))]))
        return responses
'''

PY_TIMEOUTS_CONFIG = '''
name: "py_timeouts"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OWN" data_type: TYPE_INT64 dims: [ 1 ] }, { name: "INNER" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
'''


# Calls py_ticker (decoupled, a tick every 20 ms for 20 s unless cancelled), cancels the call
# after three ticks (Triton's ResponseIterator.cancel()), reads what still comes, and answers
# how many ticks it saw; decoupled or not, as its config says.
PY_CANCELLER = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)

    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="py_ticker", requested_output_names=["TICKS"],
                inputs=[pb_utils.Tensor("X", np.array([1], dtype=np.int32))],
                request_id=request.request_id())
            ticks = call.exec(decoupled=True)
            seen = 0
            for tick in ticks:
                if tick.has_error():
                    raise pb_utils.TritonModelException(tick.error().message())
                seen += 1
                if seen == 3:
                    ticks.cancel()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array([seen], dtype=np.int32))])
            if self.decoupled:
                request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                responses.append(response)
        return None if self.decoupled else responses
'''


def canceller_config(name, decoupled):
    return f'''
name: "{name}"
backend: "python"
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "SEEN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
model_transaction_policy {{ decoupled: {str(decoupled).lower()} }}
'''


def patient_config(name, notes, decoupled):
    return f'''
name: "{name}"
backend: "python"
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "TICKS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
parameters {{ key: "notes" value: {{ string_value: "{notes}" }} }}
model_transaction_policy {{ decoupled: {str(decoupled).lower()} }}
'''


PY_STREAMS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N").as_numpy()
            answers = list(pb_utils.InferenceRequest(model_name="py_count", requested_output_names=["I"],
                                                     inputs=[pb_utils.Tensor("N", n)]).exec(decoupled=True))
            # py_count sends its final flag alone: the last response, without outputs (as Triton's).
            counted = [int(pb_utils.get_output_tensor_by_name(r, "I").as_numpy()[0])
                       for r in answers if r.output_tensors()]
            empty_last = len(answers) == len(counted) + 1 and not answers[-1].output_tensors()
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
            generated = pb_utils.InferenceRequest(
                model_name="tiny_decoder", requested_output_names=["text_output"],
                inputs=[pb_utils.Tensor("text_input", prompt),
                        pb_utils.Tensor("max_tokens", np.array([6], dtype=np.int32)),
                        pb_utils.Tensor("stream", np.array([True]))],
                parameters={"temperature": 0}).exec(decoupled=True)
            pieces = [pb_utils.get_output_tensor_by_name(r, "text_output").as_numpy()[0] for r in generated]
            missing = list(pb_utils.InferenceRequest(model_name="nowhere", requested_output_names=["X"],
                                                     inputs=[pb_utils.Tensor("N", n)]).exec(decoupled=True))
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("COUNTED", np.array(counted, dtype=np.int32)),
                pb_utils.Tensor("EMPTY_LAST", np.array([empty_last])),
                pb_utils.Tensor("PIECES", np.array(pieces, dtype=np.object_)),
                pb_utils.Tensor("MISSING", np.array([missing[0].error().message()], dtype=np.object_))]))
        return responses
'''

PY_STREAMS_CONFIG = '''
name: "py_streams"
backend: "python"
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "COUNTED" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "PIECES" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "MISSING" data_type: TYPE_STRING dims: [ 1 ] }, { name: "EMPTY_LAST" data_type: TYPE_BOOL dims: [ 1 ] } ]
'''

README_CONFIG = '''
name: "py_readme"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
'''


def readme_model():
    """The model docs/models.md shows under "Python models"."""
    section = doc_section(REPO_ROOT / "docs" / "models.md", "Python models (Triton's Python backend)")
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


ENSEMBLE_CONFIG = '''
name: "double_then_add"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "Z" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "py_double" model_version: -1
    input_map { key: "X" value: "X" } output_map { key: "DOUBLED" value: "doubled" } },
  { model_name: "add_sub" model_version: -1
    input_map { key: "INPUT0" value: "doubled" } input_map { key: "INPUT1" value: "Z" }
    output_map { key: "OUTPUT0" value: "SUM" } }
] }
'''


def gate_held(server, model: str) -> None:
    """Until `model`'s gate request (-1, see PY_BATCH) holds its only instance."""
    holding = server.repos[0] / model / "holding"
    deadline = time.monotonic() + RPC_TIMEOUT
    while not holding.exists():
        assert time.monotonic() < deadline, f"{model} never took the gate request"
        time.sleep(0.01)


def release_gate(server, model: str) -> None:
    (server.repos[0] / model / "release").touch()


def wait_pending(server, model: str, count: int) -> None:
    """Until `model` has `count` requests queued (its pending-request gauge)."""
    pattern = rf'^nv_inference_pending_request_count\{{model="{model}",version="1"\}} (\S+)$'
    deadline = time.monotonic() + RPC_TIMEOUT
    while True:
        text = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
        found = re.search(pattern, text, flags=re.M)
        if found and float(found.group(1)) == count:
            return
        assert time.monotonic() < deadline, f"{model} never had {count} requests queued"
        time.sleep(0.01)


def write_model(repo, name, config, code):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


@pytest.fixture(scope="module")
def python_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("python") / "repo"
    mark = repo.parent / "finalized"
    write_model(repo, "py_add_sub", PY_ADD_SUB_CONFIG, PY_ADD_SUB)
    write_model(repo, "py_echo", PY_ECHO_CONFIG.replace("MARK", str(mark)), PY_ECHO)
    write_model(repo, "py_faulty", PY_FAULTY_CONFIG, PY_FAULTY)
    write_model(repo, "py_broken", PY_BROKEN_CONFIG, PY_BROKEN)
    write_model(repo, "py_double", PY_DOUBLE_CONFIG, PY_DOUBLE)
    write_model(repo, "py_identity", identity_config(), PY_IDENTITY)
    write_model(repo, "py_readme", README_CONFIG, readme_model())
    write_model(repo, "py_calls", PY_CALLS_CONFIG, PY_CALLS)
    write_model(repo, "py_batch", PY_BATCH_CONFIG, PY_BATCH)
    write_model(repo, "py_delay", PY_DELAY_CONFIG, PY_BATCH)
    write_model(repo, "py_policy", PY_POLICY_CONFIG, PY_BATCH)
    write_model(repo, "py_count", PY_COUNT_CONFIG, PY_COUNT)
    write_model(repo, "py_slow_count", PY_SLOW_COUNT_CONFIG, PY_COUNT)
    write_model(repo, "py_forward", 'name: "py_forward" backend: "python"' + COUNT_IO, PY_FORWARD)
    write_model(repo, "py_partial", PY_PARTIAL_CONFIG, PY_PARTIAL)
    write_model(repo, "py_metrics", PY_METRICS_CONFIG, PY_METRICS)
    notes = repo.parent / "warm_notes"
    write_model(repo, "py_warm", warm_config("py_warm", notes, "one"), PY_WARM)
    (repo / "py_warm" / "warmup").mkdir()
    (repo / "py_warm" / "warmup" / "one").write_bytes(np.array([1.5], dtype=np.float32).tobytes())
    write_model(repo, "py_warm_fail", warm_config("py_warm_fail", notes, "minus"), PY_WARM)
    (repo / "py_warm_fail" / "warmup").mkdir()
    (repo / "py_warm_fail" / "warmup" / "minus").write_bytes(np.array([-1], dtype=np.float32).tobytes())
    write_model(repo, "py_auto", 'backend: "python"', PY_AUTO)
    write_model(repo, "py_auto_conflict",
                'backend: "python" input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]', PY_AUTO_CONFLICT)
    (repo / "double_then_add" / "1").mkdir(parents=True)
    (repo / "double_then_add" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    shutil.copytree(BUNDLED_REPO / "add_sub", repo / "add_sub")
    shutil.copytree(BUNDLED_REPO / "tiny_decoder", repo / "tiny_decoder")
    write_model(repo, "py_streams", PY_STREAMS_CONFIG, PY_STREAMS)
    patient_notes = repo.parent / "patient_notes"
    patient_notes.mkdir()
    write_model(repo, "py_patient", patient_config("py_patient", patient_notes, False), PY_PATIENT)
    write_model(repo, "py_ticker", patient_config("py_ticker", patient_notes, True), PY_PATIENT)
    write_model(repo, "py_relay", PY_RELAY_CONFIG, PY_RELAY)
    write_model(repo, "py_manager", PY_MANAGER_CONFIG, PY_MANAGER)
    write_model(repo, "py_accumulate", PY_ACCUMULATE_CONFIG, PY_ACCUMULATE)
    write_model(repo, "py_stream_accumulate", PY_STREAM_ACCUMULATE_CONFIG, PY_STREAM_ACCUMULATE)
    write_model(repo, "py_iterate", iterate_config("py_iterate", True), PY_ITERATE)
    write_model(repo, "py_timeouts", PY_TIMEOUTS_CONFIG, PY_TIMEOUTS)
    write_model(repo, "py_canceller", canceller_config("py_canceller", False), PY_CANCELLER)
    write_model(repo, "py_stream_canceller", canceller_config("py_stream_canceller", True), PY_CANCELLER)
    write_model(repo, "py_iterate_unary", iterate_config("py_iterate_unary", False), PY_ITERATE)
    write_model(repo, "py_iterate_plain", iterate_config("py_iterate_plain", False, iterative=False), PY_ITERATE)
    write_model(repo, "py_sequence_caller", '''
name: "py_sequence_caller"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_FP32 dims: [ 1 ] } ]
''', PY_SEQUENCE_CALLER)
    # Implicit state is not served for Python models: the load says so.
    write_model(repo, "py_implicit_state", PY_ACCUMULATE_CONFIG.replace('"py_accumulate"', '"py_implicit_state"').replace(
        "  max_sequence_idle_microseconds: 5000000",
        '  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]'), PY_ACCUMULATE)
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


def test_a_python_model_answers_what_the_onnx_model_answers(python_server):
    server, _ = python_server
    rng = np.random.default_rng(7)
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    http_client = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    for module, client in ((grpcclient, grpc_client), (httpclient, http_client)):
        a = rng.standard_normal((3, 16), dtype=np.float32)
        b = rng.standard_normal((3, 16), dtype=np.float32)
        python = client.infer("py_add_sub", add_sub_inputs(module, a, b))
        onnx = client.infer("add_sub", add_sub_inputs(module, a, b))
        for name in ("OUTPUT0", "OUTPUT1"):
            np.testing.assert_array_equal(python.as_numpy(name), onnx.as_numpy(name))
    # Concurrent requests share the two instances and each gets its own answer.
    def one(seed):
        a = np.full((1, 16), seed, dtype=np.float32)
        b = np.arange(16, dtype=np.float32).reshape(1, 16)
        result = grpc_client.infer("py_add_sub", add_sub_inputs(grpcclient, a, b))
        return np.array_equal(result.as_numpy("OUTPUT0"), a + b)
    with ThreadPoolExecutor(16) as pool:
        assert all(pool.map(one, range(64)))
    stats = grpc_client.get_inference_statistics("py_add_sub").model_stats[0]
    # Rows: two requests of 3, then 64 of 1.
    assert stats.inference_stats.success.count == 66 and stats.inference_count == 70
    assert 0 < stats.execution_count <= 66
    config = grpc_client.get_model_config("py_add_sub").config
    assert config.backend == "python" and config.default_model_filename == "model.py"
    # Triton's metadata names the backend of a model without a platform.
    assert grpc_client.get_model_metadata("py_add_sub").platform == "python"
    assert http_client.get_model_metadata("py_add_sub")["platform"] == "python"
    assert [g.name for g in config.instance_group] == ["py_add_sub_0"]
    assert [g.name for g in grpc_client.get_model_config("py_faulty").config.instance_group] == ["py_faulty"]
    log = server.log_text()
    assert "initialized py_add_sub_0_0 (CPU)" in log and "initialized py_add_sub_0_1 (CPU)" in log
    assert "a print does not disturb kiln" in log


def test_a_python_model_calls_other_models(python_server):
    server, _ = python_server
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    tensor = grpcclient.InferInput("X", [1, 16], "FP32")
    tensor.set_data_from_numpy(x)
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("py_calls", [tensor])
    np.testing.assert_array_equal(result.as_numpy("DOUBLED"), 2 * x)
    np.testing.assert_array_equal(result.as_numpy("BACK"), x)
    missing, wrong = (e.decode() for e in result.as_numpy("ERRORS"))
    # Triton: core src/model_lifecycle.cc, ModelLifeCycle::GetModel (prefixed by
    # ModelRepositoryManager::GetModel) and core src/infer_request.cc, InferenceRequest::Normalize.
    assert missing == "Request for unknown model: 'no_such_model' is not found"
    assert "expected 2 inputs but got 1 inputs for model 'add_sub'" in wrong, wrong


def test_requests_waiting_together_go_to_one_execute_call(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def send(value, rows=1):
        x = grpcclient.InferInput("X", [rows, 1], "INT32")
        x.set_data_from_numpy(np.full((rows, 1), value, dtype=np.int32))
        return client.infer("py_batch", [x]).as_numpy("CALL_SIZE").reshape(-1).tolist()

    before = client.get_inference_statistics("py_batch").model_stats[0].execution_count
    with ThreadPoolExecutor(8) as pool:
        holding = pool.submit(send, -1)
        gate_held(server, "py_batch")
        # Three of one row queue behind it, then one of two rows: the three fill 3 of the 4 rows
        # of one call, and the two rows would pass 4, so the last goes alone.
        waiting = [pool.submit(send, 1) for _ in range(3)]
        wait_pending(server, "py_batch", 3)
        late = pool.submit(send, 2, rows=2)
        wait_pending(server, "py_batch", 4)
        release_gate(server, "py_batch")
        assert holding.result() == [1]
        sizes = [w.result() for w in waiting] + [late.result()]
    assert sizes == [[3], [3], [3], [1, 1]], sizes
    stats = client.get_inference_statistics("py_batch").model_stats[0]
    assert stats.execution_count - before == 3
    assert {b.batch_size for b in stats.batch_stats} >= {1, 3}


def test_a_request_whose_client_left_while_it_waited_does_not_run(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def send(value, timeout=None):
        x = grpcclient.InferInput("X", [1, 1], "INT32")
        x.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
        return client.infer("py_batch", [x], client_timeout=timeout).as_numpy("CALL_SIZE").reshape(-1).tolist()

    before = client.get_inference_statistics("py_batch").model_stats[0].execution_count
    with ThreadPoolExecutor(2) as pool:
        holding = pool.submit(send, -1)
        gate_held(server, "py_batch")
        with pytest.raises(InferenceServerException) as e:
            send(5, timeout=0.1)
        assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED", e.value
        wait_pending(server, "py_batch", 0)
        release_gate(server, "py_batch")
        assert holding.result() == [1]
    # Had the abandoned request stayed queued, it would share this call.
    assert send(7) == [1]
    assert client.get_inference_statistics("py_batch").model_stats[0].execution_count - before == 2


def test_a_python_models_requests_wait_the_batching_delay_for_company(python_server):
    # An idle instance, and requests one after another: each waits (up to 20 s) for company,
    # and the three share one call.
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def send(value):
        x = grpcclient.InferInput("X", [1, 1], "INT32")
        x.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
        return client.infer("py_delay", [x]).as_numpy("CALL_SIZE").reshape(-1).tolist()

    with ThreadPoolExecutor(4) as pool:
        calls = []
        for value in range(3):
            calls.append(pool.submit(send, value))
            wait_pending(server, "py_delay", value + 1)
        # A fourth fills max_batch_size (4): the call goes without waiting out the delay.
        calls.append(pool.submit(send, 3))
        assert [call.result() for call in calls] == [[4], [4], [4], [4]]
    stats = client.get_inference_statistics("py_delay").model_stats[0]
    assert stats.execution_count == 1 and stats.inference_count == 4


def test_a_python_models_queue_policy_refuses_and_times_out_as_tritons(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def send(value, **options):
        x = grpcclient.InferInput("X", [1, 1], "INT32")
        x.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
        return client.infer("py_policy", [x], **options).as_numpy("CALL_SIZE").reshape(-1).tolist()

    def pending():
        text = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
        found = re.search(r'^nv_inference_pending_request_count\{model="py_policy",version="1"\} (\S+)$', text,
                          flags=re.M)
        return float(found.group(1))

    def refused(future):
        with pytest.raises(InferenceServerException) as error:
            future.result()
        assert error.value.status() == "StatusCode.UNAVAILABLE"
        return error.value.message()

    with ThreadPoolExecutor(2) as pool:
        holding = pool.submit(send, -1)  # holds the only instance until released
        gate_held(server, "py_policy")
        # A request's own timeout longer than the policy's 1 s does not keep it queued longer
        # (Triton's rule: it may only shorten the policy's)...
        queued = pool.submit(send, 1, timeout=5_000_000)
        deadline = time.monotonic() + 0.6
        while pending() != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pending() == 1
        # ...and the queue (max_queue_size 1) has no room for another.
        with pytest.raises(InferenceServerException) as full:
            send(2)
        assert full.value.status() == "StatusCode.UNAVAILABLE"
        # Triton: core src/scheduler_utils.cc, the queue's Enqueue ("Exceeds maximum queue size",
        # UNAVAILABLE). "Request timeout expired" was not found in the searched Triton sources.
        assert "Exceeds maximum queue size" in full.value.message()
        assert "Request timeout expired" in refused(queued)
        assert not holding.done(), "refused when the policy's timeout passed, not when it would have run"
        release_gate(server, "py_policy")
        assert holding.result() == [1]
    assert pending() == 0
    # A shorter own timeout applies: a request refused after its 50 ms, while the request before
    # it holds the instance (under the policy's 1 s it would have waited longer).
    with ThreadPoolExecutor(2) as pool:
        holding = pool.submit(send, -1)
        gate_held(server, "py_policy")
        with pytest.raises(InferenceServerException) as late:
            send(3, timeout=50_000)
        assert late.value.status() == "StatusCode.UNAVAILABLE"
        assert "Request timeout expired" in late.value.message()
        release_gate(server, "py_policy")
        assert holding.result() == [1]
    stats = client.get_inference_statistics("py_policy").model_stats[0]
    assert stats.execution_count == 2  # no refused request ran


def test_a_traced_python_request_has_its_queue_and_compute_times(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.update_trace_settings(model_name="py_add_sub", settings={
        "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1", "trace_count": "1"})
    a, b = np.full((1, 16), 2, np.float32), np.ones((1, 16), np.float32)
    client.infer("py_add_sub", add_sub_inputs(grpcclient, a, b), request_id="traced")
    trace = server.repos[0].parent / "trace.json.0"
    deadline = time.monotonic() + 10
    records = None
    while records is None:
        try:
            # Once kiln has written the whole file (it creates it, then writes).
            records = json.loads(trace.read_text())
        except (OSError, ValueError):
            assert time.monotonic() < deadline, f"{trace} was not written"
            time.sleep(0.05)
    assert {"id": 1, "model_name": "py_add_sub", "model_version": 1, "request_id": "traced"} in records
    stamps = {t["name"]: t["ns"] for r in records for t in r.get("timestamps", [])}
    core = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
            "COMPUTE_END", "REQUEST_END"]
    assert all(name in stamps for name in core), stamps
    assert [stamps[name] for name in core] == sorted(stamps[name] for name in core), stamps
    outputs = [r["tensor"] for r in records if r.get("activity") == "TENSOR_BACKEND_OUTPUT"]
    assert [(t["name"], t["data"]) for t in outputs] == [("OUTPUT0", ",".join(["3"] * 16)),
                                                         ("OUTPUT1", ",".join(["1"] * 16))], outputs


def trace_of(server, model, request_id, timeout=10.0):
    """The records of the numbered trace file (the fixture's `trace.json.<n>`) that holds the trace
    of `model`'s request `request_id`, once written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in server.repos[0].parent.glob("trace.json.*"):
            try:
                records = json.loads(path.read_text())
            except json.JSONDecodeError:
                continue  # still being written: read it again on the next pass
            if any(r.get("model_name") == model and r.get("request_id") == request_id for r in records):
                return records
        time.sleep(0.05)
    pytest.fail(f"no trace of {model} was written")


def test_a_traced_decoupled_request_has_each_of_its_responses(python_server):
    """A decoupled model's request on a gRPC stream, traced: the stream's wait for it and its read,
    its queue and compute times, its input as queued, each response's outputs with an
    INFER_RESPONSE_COMPLETE (the final flag alone is a response too), a send start and end per
    message, and REQUEST_END once execute has returned and the last response has come."""
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.update_trace_settings(model_name="py_count", settings={
        "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1", "trace_count": "1"})
    assert counted(server, 2, True, 3) == [(0, False), (1, False), (None, True)]
    assert client.get_trace_settings(model_name="py_count", as_json=True)["settings"]["trace_count"]["value"] == ["0"]
    records = trace_of(server, "py_count", "count-2")
    assert {"id": records[0]["id"], "model_name": "py_count", "model_version": 1, "request_id": "count-2"} in records
    stamps = [(t["name"], t["ns"]) for r in records for t in r.get("timestamps", [])]
    names = [name for name, _ in stamps]
    once = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
            "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
    assert sorted(names) == sorted(once + ["INFER_RESPONSE_COMPLETE", "GRPC_SEND_START", "GRPC_SEND_END"] * 3), names
    at = {name: ns for name, ns in stamps if name in once}
    assert [at[name] for name in once] == sorted(at.values()), stamps
    responded = [ns for name, ns in stamps if name == "INFER_RESPONSE_COMPLETE"]
    sent = [ns for name, ns in stamps if name == "GRPC_SEND_END"]
    # The protocol takes each response after the request started (the last may come after
    # REQUEST_END: the engine is done with the request before its client is) and sends it after.
    assert at["REQUEST_START"] <= min(responded) and min(responded) <= min(sent), stamps
    assert max(responded) <= max(sent), stamps
    tensors = [(r["activity"], r["tensor"]["name"], r["tensor"]["data"]) for r in records if "activity" in r]
    assert tensors == [("TENSOR_QUEUE_INPUT", "N", "2"), ("TENSOR_BACKEND_OUTPUT", "I", "0"),
                       ("TENSOR_BACKEND_OUTPUT", "I", "1")], tensors


def test_a_traced_generate_stream_request_stamps_each_event_it_sends(python_server):
    """REST generate_stream to a decoupled model, traced: an INFER_RESPONSE_COMPLETE per response
    (the final flag alone too) and a send start and end per event (the flag alone is none), as
    Triton stamps them."""
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.update_trace_settings(model_name="py_count", settings={
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "1"})
    events = requests.post(f"http://{server.http_url}/v2/models/py_count/generate_stream",
                           json={"N": 2, "id": "sse"}, timeout=RPC_TIMEOUT).text
    assert events.count("data: ") == 2, events
    records = trace_of(server, "py_count", "sse")
    names = [t["name"] for r in records for t in r.get("timestamps", [])]
    assert sorted(names) == sorted(["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
                                    "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
                                   + ["INFER_RESPONSE_COMPLETE"] * 3 + ["HTTP_SEND_START", "HTTP_SEND_END"] * 2), names


def test_a_call_given_its_requests_trace_is_traced_as_its_child(python_server):
    """py_timeouts calls itself with `trace=request.trace()` (Triton's BLS tracing): the call is
    a child of the request's trace (its own id, `parent_id` the request's, no request id), with
    its own queue and compute times, written with its parent."""
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.update_trace_settings(model_name="py_timeouts", settings={
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "1"})
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.zeros([1], dtype=np.int32))
    client.infer("py_timeouts", [x], request_id="caller")
    records = trace_of(server, "py_timeouts", "caller")
    described = [r for r in records if "model_name" in r]
    assert len(described) == 2, described
    caller = next(r for r in described if r.get("request_id") == "caller")
    called = next(r for r in described if r is not caller)
    assert called == {"id": called["id"], "model_name": "py_timeouts", "model_version": 1, "parent_id": caller["id"]}
    stamps = {r["id"]: {} for r in described}
    for record in records:
        for stamp in record.get("timestamps", []):
            stamps[record["id"]][stamp["name"]] = stamp["ns"]
    inner, outer = stamps[called["id"]], stamps[caller["id"]]
    core = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"]
    assert list(inner) == ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
                           "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"], inner
    assert all(name in outer for name in core), outer
    # Called while the caller's execute ran.
    assert outer["COMPUTE_START"] <= inner["REQUEST_START"] <= inner["REQUEST_END"] <= outer["COMPUTE_END"]


def wait_for_note(server, request_id, timeout=10.0):
    path = server.repos[0].parent / "patient_notes" / request_id
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.02)
    pytest.fail(f"the model noted nothing for request {request_id}")


def test_a_model_hears_that_its_requests_client_went_away(python_server):
    server, _ = python_server
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    # A call whose deadline passes: the model, still in execute, sees is_cancelled() (at once:
    # well before the 20 s it would otherwise go on for).
    client = grpcclient.InferenceServerClient(server.grpc_url)
    # grpcio reports the client's own timeout as DEADLINE_EXCEEDED, or, when the timer wins the
    # race against the call, as CANCELLED "Timeout expired".
    with pytest.raises(InferenceServerException, match="(?i)deadline|timeout expired"):
        client.infer("py_patient", [x], request_id="unary-1", client_timeout=0.3)
    note = wait_for_note(server, "unary-1")
    assert re.fullmatch(r"cancelled after \d+ ticks", note) and int(note.split()[2]) < 150, note
    # A stream the client closes after three responses: the decoupled model stops sending.
    body = {"X": 1, "id": "stream-1"}
    events = []
    with requests.post(f"http://{server.http_url}/v2/models/py_ticker/generate_stream", json=body,
                       stream=True, timeout=RPC_TIMEOUT) as answer:
        for line in answer.iter_lines():
            if line.startswith(b"data: "):
                events.append(json.loads(line[len(b"data: "):]))
                if len(events) == 3:
                    break
    assert [e["TICKS"] for e in events] == [0, 1, 2]
    note = wait_for_note(server, "stream-1")
    assert re.fullmatch(r"cancelled after \d+ ticks", note) and int(note.split()[2]) < 150, note
    # A stream whose model has sent nothing yet: its client's leaving is noticed all the same.
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(f"http://{server.http_url}/v2/models/py_ticker/generate_stream",
                      json={"X": 1, "id": "quiet-1", "quiet": True}, timeout=(RPC_TIMEOUT, 0.5))
    note = wait_for_note(server, "quiet-1")
    assert re.fullmatch(r"cancelled after \d+ ticks", note) and int(note.split()[2]) < 150, note
    # Both streams count as canceled requests.
    text = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
    canceled = re.search(r'^nv_inference_request_failure\{[^}]*model="py_ticker"[^}]*reason="CANCELED"[^}]*\} (\S+)$',
                         text, flags=re.M) or re.search(
        r'^nv_inference_request_failure\{[^}]*reason="CANCELED"[^}]*model="py_ticker"[^}]*\} (\S+)$', text, flags=re.M)
    assert canceled and float(canceled.group(1)) >= 2, text
    server.assert_alive()


def test_a_decoupled_instance_takes_new_requests_while_it_answers_earlier_ones(python_server):
    # py_ticker has one instance, and a request it works on ticks until its client goes away:
    # a second request is taken (and answered) while the first still runs, as in Triton.
    server, _ = python_server
    url = f"http://{server.http_url}/v2/models/py_ticker/generate_stream"

    def ticks(lines, n):
        got = []
        for line in lines:
            if line.startswith(b"data: "):
                got.append(json.loads(line[len(b"data: "):])["TICKS"])
                if len(got) == n:
                    break
        return got

    with requests.post(url, json={"X": 1, "id": "first"}, stream=True, timeout=RPC_TIMEOUT) as first:
        first_lines = first.iter_lines()
        assert ticks(first_lines, 2) == [0, 1]
        started = time.monotonic()
        with requests.post(url, json={"X": 1, "id": "second"}, stream=True, timeout=RPC_TIMEOUT) as second:
            assert ticks(second.iter_lines(), 3) == [0, 1, 2]
        assert time.monotonic() - started < 5, "the second request waited for the first"
        # The first request streamed on meanwhile.
        later = ticks(first_lines, 1)
        assert later and later[0] >= 2, later
    for request_id in ("first", "second"):
        assert wait_for_note(server, request_id).startswith("cancelled after")


def test_a_decoupled_models_thread_calls_other_models_after_execute_returned(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for value in (1.0, 2.5, -4.0):
            x = grpcclient.InferInput("X", [1, 16], "FP32")
            x.set_data_from_numpy(np.full((1, 16), value, dtype=np.float32))
            client.async_stream_infer("py_relay", [x], request_id=str(value))
        got = {}
        for _ in range(3):
            result, error = answers.get(timeout=RPC_TIMEOUT)
            assert error is None, error
            got[result.get_response().id] = result.as_numpy("SUM")
        for value in (1.0, 2.5, -4.0):
            np.testing.assert_array_equal(got[str(value)], np.full((1, 16), 2 * value, dtype=np.float32))
        # A stub that dies mid-request: the response it sent arrives, then the request's error;
        # the next request finds the instance started again.
        x = grpcclient.InferInput("X", [1, 16], "FP32")
        x.set_data_from_numpy(np.full((1, 16), -99, dtype=np.float32))
        client.async_stream_infer("py_relay", [x], request_id="dies")
        result, error = answers.get(timeout=RPC_TIMEOUT)
        assert error is None and result.get_response().id == "dies"
        result, error = answers.get(timeout=RPC_TIMEOUT)
        assert error is not None and "is not healthy" in str(error), error
        x.set_data_from_numpy(np.full((1, 16), 3, dtype=np.float32))
        client.async_stream_infer("py_relay", [x], request_id="after")
        result, error = answers.get(timeout=RPC_TIMEOUT)
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("SUM"), np.full((1, 16), 6, dtype=np.float32))
    finally:
        client.stop_stream()


def test_a_model_loads_unloads_and_asks_after_other_models(python_server):
    server, _ = python_server
    client = httpclient.InferenceServerClient(server.http_url)
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([0], dtype=np.int32))

    def manage(action, model):
        result = client.infer("py_manager", [x], parameters={"action": action, "model": model})
        return bool(result.as_numpy("READY")[0])

    assert manage("ready", "add_sub") is True
    assert manage("ready", "py_dynamic") is False
    # Loaded from the config and model.py the model hands over, and served.
    assert manage("load", "py_dynamic") is True
    y = httpclient.InferInput("X", [1, 2], "FP32")
    y.set_data_from_numpy(np.array([[1.5, -2]], dtype=np.float32))
    np.testing.assert_array_equal(client.infer("py_dynamic", [y]).as_numpy("Y"), [[-1.5, 2]])
    # The unload is not waited for (a model may unload itself): it happens soon after.
    manage("unload", "py_dynamic")
    deadline = time.monotonic() + 10
    while client.is_model_ready("py_dynamic") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not client.is_model_ready("py_dynamic")
    # What the repository refuses reaches the model as an exception, and its client as the error.
    with pytest.raises(InferenceServerException) as refused:
        manage("load", "bad name/../x")
    # The name's refusal "invalid model name '<n>'..." (kiln's text, the rule Triton's since server
    # PR #8400: see test_triton_validation.py), wrapped as python_backend raises a model-control
    # error in the model (pb_utils.TritonModelException).
    assert "TritonModelException: invalid model name 'bad name/../x'" in str(refused.value)


def test_a_stateful_model_gets_its_sequences_in_order_each_on_one_instance(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def step(sequence, value, start=False, end=False):
        x = grpcclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[value]], dtype=np.float32))
        result = client.infer("py_accumulate", [x], sequence_id=sequence, sequence_start=start,
                              sequence_end=end)
        return float(result.as_numpy("TOTAL")[0][0]), json.loads(result.as_numpy("NOTE")[0][0])

    # Eight sequences interleaved, from threads: each adds up its own values, on one instance.
    def sequence(n):
        seen = [step(n, 1.0, start=True)]
        seen += [step(n, float(k)) for k in range(2, 5)]
        seen.append(step(n, 10.0, end=True))
        return seen

    with ThreadPoolExecutor(4) as pool:
        runs = dict(zip(range(100, 108), pool.map(sequence, range(100, 108))))
    instances = set()
    for n, seen in runs.items():
        assert [total for total, _ in seen] == [1.0, 3.0, 6.0, 10.0, 20.0], (n, seen)
        notes = [note for _, note in seen]
        assert len({note["instance"] for note in notes}) == 1, notes
        instances |= {note["instance"] for note in notes}
        assert [note["flags"] for note in notes] == [1, 0, 0, 0, 2]
        assert [note["start"] for note in notes] == [1.0, 0.0, 0.0, 0.0, 0.0]
        assert {note["corrid"] for note in notes} == {n} and {note["control"] for note in notes} == {n}
    assert instances == {"py_accumulate_0_0", "py_accumulate_0_1"}, "sequences spread over both instances"
    # With none live, two new sequences go to the two instances (the one with fewer live
    # sequences, as Triton's sequence batcher gives a new sequence a free slot).
    for pair in range(200, 208, 2):
        first, second = step(pair, 1.0, start=True)[1], step(pair + 1, 1.0, start=True)[1]
        assert first["instance"] != second["instance"], (first, second)
        step(pair, 1.0, end=True)
        step(pair + 1, 1.0, end=True)
    # A request of a sequence that never started is refused, as Triton refuses it.
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        step(999, 1.0)
    # A model calls the stateful model in a sequence of its own (InferenceRequest(correlation_id,
    # flags)).
    def relayed(value, flags):
        x = grpcclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[value]], dtype=np.float32))
        result = client.infer("py_sequence_caller", [x], parameters={"sequence": 4242, "flags": flags})
        return float(result.as_numpy("TOTAL")[0][0])

    assert [relayed(5.0, 1), relayed(2.0, 0), relayed(1.0, 2)] == [5.0, 7.0, 8.0]
    entry = next(m for m in client.get_model_repository_index().models if m.name == "py_implicit_state")
    assert entry.state == "UNAVAILABLE"
    # kiln's text: the searched Triton sources hold none.
    assert "sequence_batching state (implicit state) is not served for Python models" in entry.reason, entry.reason


def test_a_decoupled_stateful_model_streams_each_sequence_in_order_on_one_instance(python_server):
    server, _ = python_server
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        # Two sequences, all their requests sent at once on one stream.
        values = {300: [1.0, 2.0, 3.0], 301: [10.0, 20.0, 30.0]}
        for k in range(3):
            for sequence, steps in values.items():
                x = grpcclient.InferInput("X", [1, 1], "FP32")
                x.set_data_from_numpy(np.array([[steps[k]]], dtype=np.float32))
                client.async_stream_infer("py_stream_accumulate", [x], request_id=f"{sequence}-{k}",
                                          sequence_id=sequence, sequence_start=k == 0, sequence_end=k == 2)
        arrivals = []
        for _ in range(12):
            result, error = got.get(timeout=RPC_TIMEOUT)
            assert error is None, error
            response = result.get_response()
            arrivals.append((response.id, float(result.as_numpy("TOTAL")[0][0]),
                             result.as_numpy("INSTANCE")[0][0].decode(),
                             response.parameters["triton_final_response"].bool_param))
        instances = {}
        for sequence, steps in values.items():
            totals = np.cumsum(steps).tolist()
            for k, total in enumerate(totals):
                mine = [a for a in arrivals if a[0] == f"{sequence}-{k}"]
                # Its two responses, in order, the second final.
                assert [(t, final) for _, t, _, final in mine] == [(total, False), (total * 10, True)], mine
                instances.setdefault(sequence, set()).update(a[2] for a in mine)
            # The next request of the sequence ran once execute had returned, before the late
            # response of the one before it was sent (as Triton releases decoupled requests).
            order = [(a[0], a[3]) for a in arrivals]
            for k in range(2):
                assert order.index((f"{sequence}-{k + 1}", False)) < order.index((f"{sequence}-{k}", True)), order
        assert all(len(i) == 1 for i in instances.values()), instances
        assert instances[300] != instances[301], "the two sequences went to the two instances"
        # A request of a sequence that never started is refused with Triton's message (core
        # src/sequence_batch_scheduler/, SequenceBatchScheduler::Enqueue: "inference request for
        # sequence <id> to model '<m>' must specify the START flag on the first request of the
        # sequence").
        x = grpcclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
        client.async_stream_infer("py_stream_accumulate", [x], request_id="lost", sequence_id=999)
        result, error = got.get(timeout=RPC_TIMEOUT)
        assert error is not None and "must specify the START flag" in str(error), (result, error)
    finally:
        client.stop_stream()


def test_requests_a_model_reschedules_run_again_batched_with_the_others(python_server):
    server, _ = python_server
    pb_flags_start = 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def n_input(n):
        x = grpcclient.InferInput("N", [1, 1], "INT32")
        x.set_data_from_numpy(np.array([[n]], dtype=np.int32))
        return [x]

    # Decoupled, on a stream, without sequence IDs (an iterative sequence is one request): a
    # response per step, each request counting down on its own (kiln gives each its own
    # correlation ID), rescheduled requests batched with the others in later execute calls.
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer("py_iterate", n_input(4), request_id="four")
        client.async_stream_infer("py_iterate", n_input(2), request_id="two")
        steps = {"four": [], "two": []}
        flags = {"four": [], "two": []}
        batches = set()
        for _ in range(6):
            result, error = got.get(timeout=RPC_TIMEOUT)
            assert error is None, error
            response = result.get_response()
            steps[response.id].append((int(result.as_numpy("LEFT")[0][0]),
                                       response.parameters["triton_final_response"].bool_param))
            batches.add(int(result.as_numpy("BATCH")[0][0]))
            flags[response.id].append(int(result.as_numpy("FLAGS")[0][0]))
        assert steps == {"four": [(3, False), (2, False), (1, False), (0, True)],
                         "two": [(1, False), (0, True)]}, steps
        assert 2 in batches, f"a rescheduled request ran beside the other: {batches}"
        # As Triton 2.51 tells the model: its sequence's START on the first run, then nothing
        # (no END either).
        assert flags == {"four": [pb_flags_start, 0, 0, 0], "two": [pb_flags_start, 0]}, flags
    finally:
        client.stop_stream()
    # Not decoupled: the request's one response comes from the call that did not reschedule it.
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda n: client.infer("py_iterate_unary", n_input(n)), [3, 5]))
    assert [int(r.as_numpy("LEFT")[0][0]) for r in results] == [0, 0]
    # Without iterative_sequence, a rescheduled request fails with Triton's words (Triton 2.51
    # only logs them, and its client waits for ever); Triton's qa/L0_request_rescheduling freezes
    # the text, whose core line the searched sources did not show.
    with pytest.raises(InferenceServerException, match="Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE"):
        client.infer("py_iterate_plain", n_input(2))
    assert int(client.infer("py_iterate_plain", n_input(1)).as_numpy("LEFT")[0][0]) == 0


def test_a_requests_timeout_reaches_the_model_and_its_calls(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    # tritonclient's `timeout` is the request's timeout parameter, in microseconds.
    result = client.infer("py_timeouts", [x], timeout=5_000_000)
    assert (int(result.as_numpy("OWN")[0]), int(result.as_numpy("INNER")[0])) == (5_000_000, 10_000_000)
    result = client.infer("py_timeouts", [x])
    assert (int(result.as_numpy("OWN")[0]), int(result.as_numpy("INNER")[0])) == (0, 60_000_000)


def test_a_model_cancels_a_decoupled_call_it_iterates(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    # A model that is not decoupled: the called model hears at once that its client left, and
    # the caller's iteration ends soon after (not when the 20 s of ticks would).
    seen = int(client.infer("py_canceller", [x], request_id="bls-cancel-1").as_numpy("SEEN")[0])
    assert 3 <= seen < 100, seen
    note = wait_for_note(server, "bls-cancel-1")
    assert re.fullmatch(r"cancelled after \d+ ticks", note) and int(note.split()[2]) < 150, note
    # A decoupled one (its stub's answers are read by a thread of kiln's), over a stream.
    got = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer("py_stream_canceller", [x], request_id="bls-cancel-2")
        result, error = got.get(timeout=RPC_TIMEOUT)
        assert error is None, error
        assert 3 <= int(result.as_numpy("SEEN")[0]) < 100
    finally:
        client.stop_stream()
    note = wait_for_note(server, "bls-cancel-2")
    assert re.fullmatch(r"cancelled after \d+ ticks", note) and int(note.split()[2]) < 150, note


def test_auto_complete_config_declares_what_the_config_leaves_out(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    config = client.get_model_config("py_auto").config
    assert config.max_batch_size == 4 and config.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("X", 11, [2])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("NEGATED", [2])]
    x = grpcclient.InferInput("X", [3, 2], "FP32")
    x.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(3, 2))
    np.testing.assert_array_equal(client.infer("py_auto", [x]).as_numpy("NEGATED"), -np.arange(6).reshape(3, 2))
    entry = next(m for m in client.get_model_repository_index().models if m.name == "py_auto_conflict")
    assert entry.state == "UNAVAILABLE"
    # Triton 2.51's words (its index says "Internal: ValueError: unable to load model ..."):
    # python_backend src/resources/triton_python_backend_utils.py, ModelConfig's auto-complete.
    assert "ValueError: unable to load model 'py_auto_conflict', configuration expects datatype TYPE_FP32 for " \
           "input 'X', model provides TYPE_INT32" in entry.reason, entry.reason


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


def test_a_decoupled_calls_responses_reach_the_caller_as_they_come(python_server):
    server, _ = python_server
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((time.monotonic(), result, error)))
    try:
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([4], dtype=np.int32))
        client.async_stream_infer("py_forward", [n])
        arrivals = []
        for _ in range(4):
            at, result, error = got.get(timeout=RPC_TIMEOUT)
            assert error is None, error
            arrivals.append((at, int(result.as_numpy("I")[0])))
    finally:
        client.stop_stream()
    assert [value for _, value in arrivals] == [0, 1, 2, 3]
    # py_slow_count sends them 0.3 s apart: passed on as they come, they arrive spread out
    # (collected before exec returned, they would arrive together).
    assert arrivals[-1][0] - arrivals[0][0] > 0.6, arrivals
    # A model that reads part of a call's responses and goes on calling.
    for _ in range(2):
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([4], dtype=np.int32))
        result = client.infer("py_partial", [n])
        assert result.as_numpy("FIRST").tolist() == [0, 1]
        assert result.as_numpy("SUM").tolist() == [2.0] * 16


def test_a_decoupled_model_streams_its_responses(python_server):
    server, _ = python_server
    # Without empty final responses, the flag the model sends alone reaches nobody.
    assert counted(server, 3, False, 3) == [(0, False), (1, False), (2, False)]
    assert counted(server, 3, True, 4) == [(0, False), (1, False), (2, False), (None, True)]
    assert counted(server, 0, True, 1) == [(None, True)]
    error, final = counted(server, -1, True, 2)
    assert "cannot count to -1" in error[0] and final == (None, True)
    # A streamed request's statistics have its time queued and in `execute`, as its batch's do.
    stats = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics("py_count")
    inference = stats.model_stats[0].inference_stats
    assert inference.success.count >= 3
    assert inference.compute_infer.count == inference.queue.count == inference.success.count
    assert inference.compute_infer.ns > 0 and inference.queue.ns > 0
    # Unary inference is refused, as Triton refuses it.
    with pytest.raises(InferenceServerException) as e:
        x = grpcclient.InferInput("N", [1], "INT32")
        x.set_data_from_numpy(np.array([2], dtype=np.int32))
        grpcclient.InferenceServerClient(server.grpc_url).infer("py_count", [x])
    # Triton: server src/grpc/infer_handler.cc, ModelInferHandler ("ModelInfer RPC doesn't support
    # models with decoupled transaction policy", UNSUPPORTED) and src/http_server.cc, HandleInfer
    # ("HTTP end point doesn't support ...", 501).
    assert "doesn't support models with decoupled transaction policy" in e.value.message()
    reply = requests.post(f"http://{server.http_url}/v2/models/py_count/infer", timeout=RPC_TIMEOUT,
                          json={"inputs": [{"name": "N", "datatype": "INT32", "shape": [1], "data": [2]}]})
    assert reply.status_code == 501
    assert reply.json() == {"error": "HTTP end point doesn't support models with decoupled transaction policy"}


def test_warmup_samples_run_before_the_model_serves(python_server):
    server, _ = python_server
    notes = server.repos[0].parent / "warm_notes"
    # Sample "ones" (batch 2 of the file's element), twice, on the one instance: as Triton 2.51
    # sends it, two requests of one element in each execute call.
    assert notes.read_text().splitlines() == ["2 [[1.5]]"] * 4
    assert "model 'py_warm': 1 instance(s) warmed up with sample 'ones'" in server.log_text()  # kiln's log line
    client = grpcclient.InferenceServerClient(server.grpc_url)
    # The statistics count the samples, as Triton 2.51's do: 4 requests in 2 executions of 2.
    stats = client.get_inference_statistics("py_warm").model_stats[0]
    assert (stats.inference_count, stats.execution_count, stats.inference_stats.success.count) == (4, 2, 4)
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(2, 2)]
    metrics = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
    assert 'nv_inference_count{model="py_warm",version="1"} 4' in metrics
    entry = next(m for m in client.get_model_repository_index().models if m.name == "py_warm_fail")
    assert entry.state == "UNAVAILABLE"
    # "failed to warm up model ... with sample ...: " is kiln's; the rest is python_backend's (below).
    assert ("failed to warm up model 'py_warm_fail' with sample 'ones': Failed to process the request(s) for "
            "model 'py_warm_fail_0', message: ValueError: negative warmup") in entry.reason, entry.reason


def test_custom_metrics_reach_the_metrics_endpoint(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for value, count in ((2.5, 1), (-7.0, 2), (4.0, 3)):
        x = grpcclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([value], dtype=np.float32))
        # The count so far, and the refusal of a negative increment.
        assert client.infer("py_metrics", [x]).as_numpy("Y").tolist() == [count, 1]
    text = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
    assert "# HELP py_test_requests_total Requests the model saw\n# TYPE py_test_requests_total counter\n" in text
    assert 'py_test_requests_total{kind="test",model="py_metrics"} 3\n' in text, text
    assert "# TYPE py_test_last_value gauge\n" in text
    assert 'py_test_last_value{model="py_metrics"} 4\n' in text, text
    # The whole text still parses as Prometheus' exposition format.
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["py_test_requests"].type == "counter"
    assert families["py_test_last_value"].samples[0].value == 4.0
    # Observations 2.5, 7 and 4: cumulative buckets, sum and count.
    sizes = families["py_test:value_size"]
    assert sizes.type == "histogram"
    got = {(s.name, s.labels.get("le")): s.value for s in sizes.samples}
    assert got == {("py_test:value_size_bucket", "1"): 0, ("py_test:value_size_bucket", "5"): 2,
                   ("py_test:value_size_bucket", "10"): 3, ("py_test:value_size_bucket", "+Inf"): 3,
                   ("py_test:value_size_sum", None): 13.5, ("py_test:value_size_count", None): 3}, got


def custom_series(server) -> str:
    text = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
    return "\n".join(line for line in text.splitlines() if line.startswith("py_test"))


def test_custom_series_go_with_their_metric_objects_and_their_model(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def infer(value):
        x = grpcclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([value], dtype=np.float32))
        client.infer("py_metrics", [x])

    temporary = 'py_test_requests_total{kind="temporary",model="py_metrics"} 1'
    infer(0)
    assert temporary in custom_series(server)
    infer(1)  # the model deletes its Metric object: the series goes, as in Triton
    series = custom_series(server)
    assert temporary.rsplit(" ")[0] not in series and 'kind="test"' in series, series

    # Unloaded, the model's process ends and its series leave /metrics; loaded again, its
    # `initialize` makes them anew, from 0.
    client.unload_model("py_metrics")
    deadline = time.monotonic() + 30
    while custom_series(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert custom_series(server) == ""
    client.load_model("py_metrics")
    series = custom_series(server)
    assert 'py_test_requests_total{kind="test",model="py_metrics"} 0' in series, series
    assert 'py_test:value_size_count{model="py_metrics"} 0' in series, series
    infer(5.0)
    assert 'py_test_requests_total{kind="test",model="py_metrics"} 1' in custom_series(server)


def test_a_python_model_collects_decoupled_models_responses(python_server):
    server, _ = python_server
    n = grpcclient.InferInput("N", [1], "INT32")
    n.set_data_from_numpy(np.array([4], dtype=np.int32))
    prompt = grpcclient.InferInput("PROMPT", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"The potter"], dtype=np.object_))
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("py_streams", [n, prompt])
    assert result.as_numpy("COUNTED").tolist() == [0, 1, 2, 3]
    assert result.as_numpy("EMPTY_LAST").tolist() == [True]
    # The pieces, joined, are what the generate extension answers for the same greedy request.
    body = {"text_input": "The potter", "max_tokens": 6, "temperature": 0, "exclude_input_in_output": True}
    reply = requests.post(f"http://{server.http_url}/v2/models/tiny_decoder/generate", json=body, timeout=RPC_TIMEOUT)
    pieces = [p.decode() for p in result.as_numpy("PIECES")]
    assert len(pieces) == 6 and "".join(pieces) == reply.json()["text_output"], (pieces, reply.text)
    assert result.as_numpy("MISSING")[0].decode() == "Request for unknown model: 'nowhere' is not found"


def test_the_readme_model_runs(python_server):
    server, _ = python_server
    x = httpclient.InferInput("INPUT0", [3], "FP32")
    x.set_data_from_numpy(np.array([1, 2.5, -4], dtype=np.float32))
    result = httpclient.InferenceServerClient(server.http_url).infer("py_readme", [x])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [2, 5, -8])


@pytest.mark.parametrize("via", ["numpy", "dlpack"])
def test_every_datatype_goes_through_numpy_and_back(python_server, via):
    server, _ = python_server
    rng = np.random.default_rng(3)
    inputs, expected = [], {}
    for t in TYPES:
        if t == "BYTES":
            value = np.array([[b"a", b"\x00\xff", b""], [b"kiln", b"x" * 300, "\u00e9".encode()]], dtype=np.object_)
        elif t == "BOOL":
            value = rng.integers(0, 2, (2, 3)).astype(bool)
        else:
            dtype = np.dtype({"FP16": "float16", "FP32": "float32", "FP64": "float64"}.get(t, t.lower()))
            info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
            value = np.array([[info.min, info.max, 0], [1, 2, 3]], dtype=dtype)
        tensor = grpcclient.InferInput(f"IN_{t}", list(value.shape), t)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
        expected[f"OUT_{t}"] = value
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("py_identity", inputs, parameters={"via": via})
    for name, value in expected.items():
        np.testing.assert_array_equal(result.as_numpy(name), value, err_msg=name)


@pytest.mark.parametrize("sent, listed", [
    (TYPES, "BOOL INT8 INT16 INT64 UINT8 UINT16 BYTES UINT32 UINT64 INT32 FP16 FP32 FP64"),
    (TYPES[::-1], "BYTES UINT16 FP64 FP32 FP16 INT64 INT16 INT8 BOOL INT32 UINT64 UINT32 UINT8"),
])
def test_request_inputs_come_in_tritons_order(python_server, sent, listed):
    # Triton's request.inputs() walks its core's hash maps of the request's inputs, so its order
    # follows the order the client sent them in (first list checked against Triton 2.51; see
    # bench/triton_parity.sh). py_identity answers in the order it was given its inputs.
    server, _ = python_server
    inputs = []
    for t in sent:
        tensor = grpcclient.InferInput(f"IN_{t}", [1, 1], t)
        tensor.set_data_from_numpy(np.array([[b"x" if t == "BYTES" else 1]], dtype=object if t == "BYTES" else
                                            bool if t == "BOOL" else t.lower().replace("fp", "float")))
        inputs.append(tensor)
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("py_identity", inputs)
    assert " ".join(o.name[4:] for o in result.get_response().outputs) == listed


def test_strings_ids_parameters_and_the_response_sender_reach_the_model(python_server):
    server, _ = python_server
    client = httpclient.InferenceServerClient(server.http_url)
    text = httpclient.InferInput("TEXT", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"kiln", "f\u00fcr".encode()], dtype=np.object_))
    outputs = [httpclient.InferRequestedOutput(n) for n in ("UPPER", "ID", "PARAMETERS", "ASKED")]
    # The parameters the server acts on (the schedule policy's, a sequence's) are not the
    # model's, as Triton takes them out.
    result = client.infer("py_echo", [text], outputs=outputs[::-1], request_id="req-7", priority=1,
                          timeout=60_000_000, parameters={"mode": "loud", "level": 3})
    assert [t.decode() for t in result.as_numpy("UPPER")] == ["KILN", "F\u00dcR"]
    assert result.as_numpy("ID")[0] == b"req-7"
    # In the order the client sent them, as Triton's (bench/triton_parity.sh --json).
    assert result.as_numpy("PARAMETERS")[0] == b'{"mode":"loud","level":3}'
    # requested_output_names() is a set, as Triton's (the model sorts it).
    assert result.as_numpy("ASKED")[0] == b"ASKED,ID,PARAMETERS,UPPER"
    # Asking for none is asking for every output, as Triton tells the model.
    every = client.infer("py_echo", [text])
    assert every.as_numpy("ASKED")[0] == b"ASKED,ID,PARAMETERS,UPPER"
    # Only what was asked for comes back.
    only = client.infer("py_echo", [text], outputs=[httpclient.InferRequestedOutput("UPPER")])
    assert only.get_output("ID") is None and only.as_numpy("UPPER").shape == (2,)


def faulty(client, value):
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([value], dtype=np.int32))
    return client.infer("py_faulty", [x])


def test_errors_keep_their_code_and_a_dead_stub_comes_back(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert faulty(client, 5).as_numpy("Y")[0] == 50
    with pytest.raises(InferenceServerException) as e:
        faulty(client, 1)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "one is refused" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        faulty(client, 2)
    assert e.value.status() == "StatusCode.INTERNAL"
    # Triton's text: the instance, the exception, then where the model raised it (python_backend
    # src/pb_stub.cc, Stub::ProcessRequests; "Number of InferenceResponse objects do not match ..."
    # is from the same stub; "Stub process '<instance>' is not healthy" from src/stub_launcher.cc,
    # StubLauncher's health check; "exit status: 3" is kiln's addition).
    assert e.value.message().startswith(
        "Failed to process the request(s) for model 'py_faulty_0', message: ValueError: two is a bad number\n\nAt:\n")
    assert "/py_faulty/1/model.py(20): execute" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        faulty(client, 4)
    assert ("Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
            "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0") in e.value.message()
    # As in Triton, an output keeps the type the model gave it.
    seven = faulty(client, 7)
    assert seven.get_output("Y").datatype == "FP64" and seven.as_numpy("Y")[0] == 7.0
    with pytest.raises(InferenceServerException) as e:
        faulty(client, 3)
    assert "Stub process 'py_faulty_0' is not healthy" in e.value.message()
    assert "exit status: 3" in e.value.message()
    # The next request starts the instance again, initialize and all.
    assert faulty(client, 6).as_numpy("Y")[0] == 60
    assert server.log_text().count("faulty model starting") == 2
    # Over REST a TritonError's code picks the status.
    reply = requests.post(f"http://{server.http_url}/v2/models/py_faulty/infer", timeout=RPC_TIMEOUT,
                          json={"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}]})
    assert reply.status_code == 400 and reply.json() == {"error": "one is refused"}
    server.assert_alive()


def test_failures_count_as_triton_counts_them(python_server):
    """Triton 2.51's counts (bench/triton_parity.sh --json, "counts after the probes"): a request
    refused before its model's scheduler has it counts nowhere; a model's error response is a
    response sent, a success; an exception in execute a BACKEND failure."""
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def counts():
        stats = client.get_inference_statistics("py_faulty", as_json=True)["model_stats"][0]["inference_stats"]
        text = requests.get(f"http://{server.metrics_url}/metrics", timeout=RPC_TIMEOUT).text
        backend = re.search(r'^nv_inference_request_failure\{[^}]*model="py_faulty"[^}]*reason="BACKEND"[^}]*\} (\S+)$',
                            text, flags=re.M)
        return (int(stats["success"].get("count", 0)), int(stats["fail"].get("count", 0)),
                float(backend.group(1)) if backend else 0.0)

    before = counts()
    with pytest.raises(InferenceServerException):
        faulty(client, 1)
    assert counts() == (before[0] + 1, before[1], before[2]), "an error response is a success"
    with pytest.raises(InferenceServerException):
        faulty(client, 2)
    assert counts() == (before[0] + 1, before[1] + 1, before[2] + 1), "an exception is a BACKEND failure"
    wrong = grpcclient.InferInput("X", [1], "FP32")
    wrong.set_data_from_numpy(np.array([1], dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("py_faulty", [wrong])
    assert "data-type is 'FP32'" in e.value.message()
    with pytest.raises(InferenceServerException):
        client.infer("py_faulty", [wrong], outputs=[grpcclient.InferRequestedOutput("NOPE")])
    assert counts() == (before[0] + 1, before[1] + 1, before[2] + 1), "refusals count nowhere"


def test_an_initialize_that_raises_fails_the_load_with_its_message(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    entry = next(m for m in client.get_model_repository_index().models if m.name == "py_broken")
    assert entry.state == "UNAVAILABLE"
    # kiln's wording around the model's exception (the searched Triton sources hold no
    # "initialize of model instance"); the exception and traceback are the model's.
    assert "initialize of model instance 'py_broken_0' failed: RuntimeError: the weights are missing" in entry.reason
    assert "/py_broken/1/model.py(4): initialize" in entry.reason
    with pytest.raises(InferenceServerException) as e:
        client.load_model("py_broken")
    assert "the weights are missing" in e.value.message()


def test_an_ensemble_runs_a_python_step_then_an_onnx_one(python_server):
    server, _ = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    z = np.ones((2, 16), dtype=np.float32)
    inputs = [grpcclient.InferInput("X", [2, 16], "FP32"), grpcclient.InferInput("Z", [2, 16], "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(z)
    np.testing.assert_array_equal(client.infer("double_then_add", inputs).as_numpy("SUM"), 2 * x + z)


def test_finalize_runs_when_the_model_unloads(python_server):
    server, mark = python_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert not mark.exists()
    client.unload_model("py_echo")
    assert not client.is_model_ready("py_echo")
    # The version stops (finalize, then its processes end) once its last request is done.
    deadline = time.monotonic() + 10
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mark.read_text() == "finalized"
    client.load_model("py_echo")
    assert client.is_model_ready("py_echo")


def test_a_missing_interpreter_or_numpy_fails_the_load_with_the_reason(tmp_path):
    write_model(tmp_path, "py_faulty", PY_FAULTY_CONFIG, PY_FAULTY)
    server = start_server([tmp_path], name="kiln-python-missing", env={"KILN_PYTHON": "/nonexistent/python3"})
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        entry = client.get_model_repository_index().models[0]
        assert entry.state == "UNAVAILABLE"
        assert "cannot start Python ('/nonexistent/python3')" in entry.reason  # kiln's text
    finally:
        stop_server(server)


PY_ENV_CONFIG = '''
name: "py_env"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "WHERE" data_type: TYPE_STRING dims: [ 4 ] } ]
parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }
'''

PY_ENV = '''
import os, sys
import numpy as np
import triton_python_backend_utils as pb_utils
import envmark  # only the packed environment has it

class TritonPythonModel:
    def execute(self, requests):
        where = [sys.prefix, os.environ.get("VIRTUAL_ENV", ""),
                 os.environ.get("LD_LIBRARY_PATH", "").split(":")[0], envmark.VALUE]
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("WHERE", np.array([w.encode() for w in where], dtype=object))])
            for _ in requests]
'''


def pack_environment(archive, value, scratch):
    """A packed environment as venv-pack makes one: a venv (its `bin/python3`, `pyvenv.cfg`,
    `bin/activate`) whose site-packages has a module of its own, `envmark` (VALUE = `value`),
    and reaches this interpreter's packages (numpy) through a .pth file; tarred and gzipped,
    entries relative to the environment's root as conda-pack writes them."""
    env = scratch / f"env-{value}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "envmark.py").write_text(f"VALUE = {value!r}\n")
    (site / "kiln_conformance.pth").write_text(os.path.dirname(os.path.dirname(np.__file__)) + "\n")
    with tarfile.open(archive, "w:gz") as tar:
        for child in sorted(env.iterdir()):
            tar.add(child, arcname=child.name)
    shutil.rmtree(env)


def test_a_packed_environment_is_unpacked_activated_and_removed_at_exit(tmp_path):
    repo, temp = tmp_path / "repo", tmp_path / "temp"
    temp.mkdir()
    write_model(repo, "py_env", PY_ENV_CONFIG, PY_ENV)
    archive = repo / "py_env" / "env.tar.gz"
    pack_environment(archive, "first", tmp_path)
    write_model(repo, "py_bad_env", PY_ENV_CONFIG.replace('"py_env"', '"py_bad_env"'), PY_ENV)
    (repo / "py_bad_env" / "env.tar.gz").write_bytes(b"\x1f\x8b not really gzip")
    server = start_server([repo], name="kiln-python-env", env={"TMPDIR": str(temp)},
                          extra_args=["--model-control-mode", "explicit", "--load-model", "*"])
    try:
        # One private directory (mode 0700, a random name) holds this server's environments.
        made = [p for p in temp.iterdir() if p.name.startswith("kiln_python_env_")]
        assert len(made) == 1, made
        unpacked = made[0]
        assert unpacked.name != f"kiln_python_env_{server.proc.pid}"
        assert unpacked.stat().st_mode & 0o777 == 0o700
        client = grpcclient.InferenceServerClient(server.grpc_url)

        def where():
            x = grpcclient.InferInput("X", [1], "FP32")
            x.set_data_from_numpy(np.array([1], dtype=np.float32))
            prefix, virtual_env, library, value = (
                w.decode() for w in client.infer("py_env", [x]).as_numpy("WHERE"))
            return prefix, virtual_env, library, value

        prefix, virtual_env, library, value = where()
        # The stub runs the unpacked environment's Python, after its bin/activate (which sets
        # VIRTUAL_ENV), with its lib first on LD_LIBRARY_PATH, as Triton starts its stubs.
        assert os.path.dirname(prefix) == str(unpacked), prefix
        assert virtual_env
        assert library == f"{prefix}/lib"
        assert value == "first"
        bad = {m.name: m for m in client.get_model_repository_index().models}["py_bad_env"]
        assert bad.state == "UNAVAILABLE"
        assert "EXECUTION_ENV_PATH" in bad.reason and "could not be unpacked" in bad.reason, bad.reason

        # A new archive in its place is unpacked again when the model loads again.
        pack_environment(archive, "second", tmp_path)
        later = time.time() + 5
        os.utime(archive, (later, later))
        client.load_model("py_env")
        prefix2, _, _, value2 = where()
        assert value2 == "second"
        assert prefix2 != prefix and os.path.dirname(prefix2) == str(unpacked)
    finally:
        stop_server(server)
    assert not unpacked.exists(), "kiln left its unpacked environments behind"


PY_ENVIRON_CONFIG = '''
name: "py_environ"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "ENV" data_type: TYPE_STRING dims: [ -1 ] } ]
'''

PY_ENVIRON = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        seen = np.array([f"{k}={v}".encode() for k, v in sorted(os.environ.items())], dtype=object)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("ENV", seen)]) for _ in requests]
'''


def test_stubs_see_no_server_secret_but_path_and_passthrough_variables(tmp_path):
    """Model code runs in stubs that see a short list of kiln's variables (PATH, PYTHON*, ...)
    and those named by --python-env-passthrough: not the bearer token or cloud credentials kiln
    itself was started with."""
    write_model(tmp_path, "py_environ", PY_ENVIRON_CONFIG, PY_ENVIRON)
    secrets = {"KILN_INFERENCE_BEARER_TOKEN": "bearer-secret-value",
               "AWS_ACCESS_KEY_ID": "aws-key-id-value", "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
               "GOOGLE_APPLICATION_CREDENTIALS": "/google-secret-path.json",
               "AZURE_STORAGE_ACCOUNT_KEY": "azure-secret-value"}
    env = {**secrets, "KILN_PYTHON": sys.executable, "KILN_TEST_PASSED": "passed", "KILN_TEST_KEPT_BACK": "kept"}
    server = start_server([tmp_path], name="kiln-python-environ", env=env,
                          extra_args=["--python-env-passthrough", "KILN_TEST_PASSED"])
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        x = grpcclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([1], dtype=np.float32))
        bearer = {"authorization": f"Bearer {secrets['KILN_INFERENCE_BEARER_TOKEN']}"}
        result = client.infer("py_environ", [x], headers=bearer, client_timeout=RPC_TIMEOUT)
        seen = dict(item.decode().split("=", 1) for item in result.as_numpy("ENV"))
        for name, value in secrets.items():
            assert name not in seen
            assert not any(value in v for v in seen.values()), f"{name}'s value reached the model"
        assert seen["PATH"] == os.environ["PATH"]
        assert seen["KILN_TEST_PASSED"] == "passed"
        assert "KILN_TEST_KEPT_BACK" not in seen and "KILN_PYTHON" not in seen
        client.close()
    finally:
        stop_server(server)
