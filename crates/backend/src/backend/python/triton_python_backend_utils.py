"""kiln's `triton_python_backend_utils`: the module Triton's Python models import as `pb_utils`.

kiln writes this file beside its stub (see stub.py) and serves the part of Triton's module that
models running on CPU use: tensors as numpy arrays, requests and responses, errors, the response
sender, calls to other models (`InferenceRequest(...).exec()`, Triton's BLS, decoupled calls
included), request rescheduling, custom metrics, the logger, DLPack and the config helpers.
"""

from __future__ import annotations

import enum
import json
import math
import re
import struct
import sys

import numpy as np

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class MemoryType(enum.IntEnum):
    """Where a call's outputs should be (kiln's are on the CPU whatever is asked)."""
    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """A call's preferred output memory (`InferenceRequest(..., preferred_memory=...)`): taken,
    and the outputs are on the CPU, as kiln's tensors always are."""

    def __init__(self, preferred_memory_type, preferred_device_id=0):
        self._type = preferred_memory_type
        self._device = preferred_device_id


class InferenceTrace:
    """A request's trace, for the calls it makes (`InferenceRequest(..., trace=request.trace())`):
    a call given its request's trace is traced as a child of it, when that request is traced.
    In OpenTelemetry mode `get_context()` is the W3C context of the request's span, as JSON
    (`{"traceparent": "00-..."}`), for spans of the model's own; else None."""

    def __init__(self, _id=0, _context=None):
        self._id = _id
        self._context = _context

    def get_context(self):
        return self._context

# Triton's name for it, which models use too.
TRITON_STRING_TO_NUMPY = _NUMPY_OF_TRITON = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


class TritonModelException(Exception):
    """What a model raises to fail the requests of an execute call (or its load)."""


class TritonError:
    """An error a response carries: the request it answers fails with `message`."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message, code=INTERNAL):
        self._message = str(message)
        self._code = code

    def message(self):
        return self._message

    def code(self):
        return self._code

    def __repr__(self):
        return f"TritonError({self._message!r})"


class Tensor:
    """A named tensor: a numpy array on the CPU."""

    def __init__(self, name, data, *_):
        if not isinstance(data, np.ndarray):
            raise TritonModelException(f"tensor '{name}' must be a numpy array, not {type(data).__name__}")
        self._name = str(name)
        self._data = data

    def name(self):
        return self._name

    def as_numpy(self):
        return self._data

    def shape(self):
        return list(self._data.shape)

    def triton_dtype(self):
        return numpy_to_triton_type(self._data.dtype)

    def is_cpu(self):
        return True

    def to_dlpack(self):
        """The tensor as a DLPack capsule, sharing its memory (e.g. for torch.from_dlpack)."""
        if self._data.dtype == np.object_:
            raise TritonModelException(f"tensor '{self._name}': DLPack cannot carry BYTES tensors")
        return self._data.__dlpack__()

    @staticmethod
    def from_dlpack(name, capsule):
        """A tensor sharing the memory of a DLPack capsule, or of an object that exports one (a
        torch tensor, ...). kiln's tensors live on the CPU: a GPU tensor must be moved first."""
        exporter = capsule if hasattr(capsule, "__dlpack__") else _Capsule(capsule)
        if not hasattr(np, "from_dlpack"):
            raise TritonModelException("DLPack needs numpy 1.22 or later")
        try:
            return Tensor(name, np.from_dlpack(exporter))
        except (BufferError, RuntimeError, TypeError, ValueError) as error:
            raise TritonModelException(f"tensor '{name}' cannot be read from DLPack: {error}") from None

    def __repr__(self):
        return f"Tensor({self._name!r}, {self._data!r})"


class _Capsule:
    """A bare DLPack capsule as the exporter numpy's from_dlpack asks for (CPU memory)."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, stream=None, **_):
        return self._capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU, device 0


class InferenceResponse:
    """A request's answer: its output tensors (and parameters for the client: a dict, or its JSON
    text, of str keys and bool, int or str values), or an error."""

    def __init__(self, output_tensors=None, error=None, parameters=None):
        self._outputs = list(output_tensors or [])
        self._error = error
        if parameters is None:
            parameters = {}
        elif isinstance(parameters, str):
            parameters = json.loads(parameters)
        if not isinstance(parameters, dict):
            raise TritonModelException(
                f"Expect parameters to be a dict or its JSON string, found type {type(parameters)}")
        for key, value in parameters.items():
            if not isinstance(key, str):
                raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
            if not isinstance(value, (bool, int, str)):
                raise TritonModelException(
                    f"Expect parameters values to have type bool/int/str, found type {type(value)}")
        self._parameters = parameters

    def output_tensors(self):
        return self._outputs

    def parameters(self):
        return json.dumps(self._parameters)

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error


class InferenceResponseSender:
    """Sends a request's responses: a decoupled model's any number of them, from any thread, the
    last with the flag TRITONSERVER_RESPONSE_COMPLETE_FINAL (alone or with a response); a model
    that is not decoupled sends its one response (and returns None from execute)."""

    def __init__(self, request):
        self._request = request

    def send(self, response=None, flags=0):
        request = self._request
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if request._complete:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if request._stream is not None:
            request._complete = final
            request._stream(request, response, final)
            return
        if response is not None:
            if request._sent is not None:
                raise TritonModelException(
                    "a model that is not decoupled sends one response per request")
            request._sent = response
        request._complete = final

    def is_cancelled(self):
        """Whether the request's client went away: the model may stop working on it."""
        return self._request.is_cancelled()


class InferenceRequest:
    """A request to the model: its inputs, id, parameters and the outputs it asks for.

    Built by a model with `model_name=...`, it calls that model (Triton's BLS): `exec()` answers
    an InferenceResponse, whose error (if any) is the called model's.
    """

    def __init__(self, model_name=None, inputs=None, requested_output_names=None, request_id="",
                 correlation_id=0, flags=0, parameters=None, model_version=-1, timeout=0, trace=None, _kiln=None,
                 _trace=(0, None), **_):
        self._inputs = list(inputs or [])
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._requested = list(requested_output_names or [])
        self._model_name = model_name
        self._model_version = model_version
        self._timeout = int(timeout or 0)
        # A request kiln sends has its own trace (`_trace`: its id, 0 when not traced, and its
        # OpenTelemetry context); a call a model builds, the one it is given.
        self._trace = trace if isinstance(trace, InferenceTrace) else InferenceTrace(*_trace)
        if parameters is None:
            parameters = "{}"
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters)
        self._kiln = _kiln
        self._sent = None
        self._complete = False
        # Where a decoupled model's responses go (set by the stub).
        self._stream = None
        self._call = 0
        self._index = 0
        # Asks kiln's word on cancellation (set by the stub for the requests kiln sends).
        self._cancelled = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    def inputs(self):
        return self._inputs

    def request_id(self):
        return self._request_id

    def correlation_id(self):
        return self._correlation_id

    def flags(self):
        return self._flags

    def parameters(self):
        return self._parameters

    def requested_output_names(self):
        # A set, as Triton's (its C++ std::set made a Python set): no order to rely on.
        return set(self._requested)

    def is_cancelled(self):
        """Whether the request's client went away (a closed connection, a cancelled stream or
        call): the model may stop working on it. Requests a model builds are never cancelled."""
        return self._cancelled is not None and self._cancelled()

    def timeout(self):
        """The request's timeout in microseconds (0: none): a client's `timeout` parameter, or
        what a model gave the request it built (for a call, the time it may wait in the called
        model's queue)."""
        return self._timeout

    def get_response_sender(self):
        return InferenceResponseSender(self)

    def set_flags(self, flags):
        """The request's sequence flags, for a call to a stateful model."""
        self._flags = flags

    def trace(self):
        return self._trace

    def set_release_flags(self, flags):
        """With TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, the request runs again in a later
        `execute` call once this one returns (a model with `sequence_batching {
        iterative_sequence: true }`); a model that is not decoupled returns None for it."""
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(f"unknown request release flags: {flags}")
        self._release_flags = flags

    def _rescheduled(self):
        return self._release_flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE

    def exec(self, decoupled=False):
        """Runs the request on model `model_name`: its InferenceResponse, or with `decoupled`
        an iterator over the responses a decoupled model sends, each as it comes."""
        if not self._model_name:
            raise TritonModelException("an InferenceRequest needs a model_name to be run")
        if decoupled:
            return _state["call"](self, True)
        return _state["call"](self)

    async def async_exec(self, decoupled=False):
        return self.exec(decoupled)


class ModelConfig:
    """The config a model's `auto_complete_config(auto_complete_model_config)` completes."""

    def __init__(self, model_config):
        self._model_config = model_config

    def as_dict(self):
        return self._model_config

    def _name(self):
        return self._model_config.get("name", "")

    def set_max_batch_size(self, max_batch_size):
        """Sets max_batch_size; a config that asks for a larger one refuses it."""
        current = self._model_config.get("max_batch_size", 0)
        if current > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {current}, but in auto-complete-config "
                             f"function for model '{self._name()}' specified max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        """Makes dynamic batching the scheduler, unless the config chose another one."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(f"Configuration specified scheduling_choice as '{other}', but auto-complete-config "
                                 f"function for model '{self._name()}' tries to set scheduling_choice as "
                                 f"'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict):
        """Sets `decoupled`, unless the config says otherwise."""
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(f"model transaction property in auto-complete-config function for model "
                                 f"'{self._name()}' contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            if "decoupled" in policy and policy["decoupled"] != transaction_policy_dict["decoupled"]:
                raise ValueError(f"trying to change decoupled property in auto-complete-config for model "
                                 f"'{self._name()}', which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = transaction_policy_dict["decoupled"]

    def _add(self, kind, tensor, properties):
        """Adds an input or output the model declares (Triton 2.51's rules and words): a tensor
        the config declares too must agree with it in type, dims (when the config has any) and,
        for inputs, optional."""
        for key in tensor:
            if key not in properties:
                listed = ", ".join(f"'{p}'" for p in properties[:-1]) + f" and '{properties[-1]}'"
                raise ValueError(f"{kind} '{tensor['name']}' in auto-complete-config function for model "
                                 f"'{self._name()}' contains property other than {listed}.")
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model '{self._name()}' is missing "
                             f"'name' property.")
        for needed in ("data_type", "dims"):
            if needed not in tensor:
                raise ValueError(f"{kind} '{tensor['name']}' in auto-complete-config function for model "
                                 f"'{self._name()}' is missing '{needed}' property.")
        tensors = self._model_config.setdefault(kind, [])
        for current in tensors:
            if current["name"] != tensor["name"]:
                continue
            declared = current.get("data_type", "TYPE_INVALID")
            if declared != "TYPE_INVALID" and declared != tensor["data_type"]:
                raise ValueError(f"unable to load model '{self._name()}', configuration expects datatype "
                                 f"{declared} for {kind} '{tensor['name']}', model provides {tensor['data_type']}")
            if current.get("dims") and current["dims"] != tensor["dims"]:
                raise ValueError(f"model '{self._name()}', tensor '{tensor['name']}': the model expects dims "
                                 f"{tensor['dims']} but the model configuration specifies dims {current['dims']}")
            if "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
                raise ValueError(f"model '{self._name()}', tensor '{tensor['name']}': the model expects optional "
                                 f"{tensor['optional']} but the model configuration specifies optional "
                                 f"{current['optional']}")
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        tensors.append(tensor)

    def add_input(self, input):
        self._add("input", input, ["name", "data_type", "dims", "optional"])

    def add_output(self, output):
        self._add("output", output, ["name", "data_type", "dims"])


def get_input_tensor_by_name(request, name):
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response, name):
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config, name):
    return next((i for i in model_config.get("input", []) if i.get("name") == name), None)


def get_output_config_by_name(model_config, name):
    return next((o for o in model_config.get("output", []) if o.get("name") == name), None)


def triton_string_to_numpy(triton_type_string):
    return _NUMPY_OF_TRITON[triton_type_string]


# TRITONSERVER_DataType numbering (BOOL 1 ... FP64 12, BYTES 13).
_TRITON_TYPE_NUMBERS = [np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32,
                        np.int64, np.float16, np.float32, np.float64, np.object_]


def triton_to_numpy_type(data_type):
    """The numpy type of a TRITONSERVER_DataType number (None for one numpy has no type for)."""
    if isinstance(data_type, int) and 1 <= data_type <= len(_TRITON_TYPE_NUMBERS):
        return _TRITON_TYPE_NUMBERS[data_type - 1]
    return None


def numpy_to_triton_type(data_type):
    """The TRITONSERVER_DataType number of a numpy type (np.bytes_ is BYTES too)."""
    if data_type in (np.bytes_, np.dtype(np.bytes_).type):
        return 13
    for number, known in enumerate(_TRITON_TYPE_NUMBERS, start=1):
        if np.dtype(data_type) == np.dtype(known):
            return number
    return None


def serialize_byte_tensor(input_tensor):
    """A BYTES tensor in Triton's wire form (a 0-d object array holding it, as Triton's utilities
    give it): each element (bytes as they are, anything else as its UTF-8 text) after its 4-byte
    little-endian length, in C order; None for an empty tensor or one that is not bytes or
    objects."""
    if input_tensor.size == 0 or not (input_tensor.dtype == np.object_ or input_tensor.dtype.type == np.bytes_):
        return None
    parts = []
    for element in input_tensor.flatten(order="C"):
        data = element if isinstance(element, bytes) else str(element).encode("utf-8")
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return np.asarray(b"".join(parts), dtype=np.object_)


def deserialize_bytes_tensor(encoded_tensor):
    """The elements of a BYTES tensor in Triton's wire form (bytes, or an array holding them), as
    a 1-D object array of bytes."""
    if isinstance(encoded_tensor, np.ndarray):
        encoded_tensor = encoded_tensor.item() if encoded_tensor.dtype == np.object_ else encoded_tensor.tobytes()
    data = bytes(encoded_tensor)
    elements, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + length > len(data):
            raise TritonModelException("a BYTES element runs past the end of the tensor")
        elements.append(data[offset:offset + length])
        offset += length
    return np.array(elements, dtype=np.object_)


def using_decoupled_model_transaction_policy(model_config):
    """Whether the model's config makes it decoupled."""
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def load_model(model_name, config="", files=None):
    """Loads (or reloads) a model of the server, as the repository API's load does: `config` a
    JSON config to use instead of the model's own, `files` {"file:<version>/<name>": bytes}.
    Needs the server in explicit model control mode."""
    _state["manage"]("load", model_name, "", config or "", files or {})


def unload_model(model_name, unload_dependents=False):
    """Unloads a model of the server, as the repository API's unload does."""
    _state["manage"]("unload", model_name, "", "", {}, unload_dependents)


def is_model_ready(model_name, model_version=""):
    """Whether a model (version) of the server is ready."""
    return bool(_state["manage"]("ready", model_name, str(model_version), "", {}))


def get_model_dir():
    return _state.get("model_dir", "")


class MetricFamily:
    """A family of custom metrics on kiln's /metrics (Triton's custom metrics API)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    _KINDS = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}

    def __init__(self, name, description, kind):
        if kind not in MetricFamily._KINDS:
            raise TritonModelException(f"'{kind}' is not a metric family kind (COUNTER, GAUGE or HISTOGRAM)")
        if not isinstance(name, str) or not _METRIC_NAME.fullmatch(name):
            raise TritonModelException(f"'{name}' is not a valid metric name")
        self._name = name
        self._description = str(description)
        self._kind = MetricFamily._KINDS[kind]

    def Metric(self, labels=None, buckets=None):
        return Metric(self, dict(labels or {}), buckets)


class Metric:
    """One series of a MetricFamily, by its labels (a histogram's with its buckets' upper bounds).
    `value()` is what this instance has counted."""

    def __init__(self, family, labels, buckets=None):
        for key in labels:
            if not isinstance(key, str) or not _METRIC_NAME.fullmatch(key):
                raise TritonModelException(f"'{key}' is not a valid label name")
        self._family = family
        self._labels = {key: str(value) for key, value in labels.items()}
        self._value = 0.0
        extra = {}
        if family._kind == "histogram":
            if buckets is None:
                raise TritonModelException("a histogram metric needs its buckets")
            bounds = [float(b) for b in buckets]
            if any(a >= b for a, b in zip(bounds, bounds[1:])) or not all(map(math.isfinite, bounds)):
                raise TritonModelException("histogram buckets must be finite and increasing")
            extra["buckets"] = bounds
        elif buckets is not None:
            raise TritonModelException("only a histogram metric has buckets")
        self._send("create", 0.0, **extra)

    def _change(self, action, value, **extra):
        family = self._family
        return {"name": family._name, "description": family._description, "kind": family._kind,
                "labels": self._labels, "action": action, "value": value, **extra}

    def _send(self, action, value, **extra):
        _state["metric"](self._change(action, value, **extra))

    def __del__(self):
        # As Triton's: the series leaves /metrics once no Metric object of its labels is left
        # (kiln hears it with the process's next message; all of them go when the process ends).
        try:
            _state["metric_later"](self._change("delete", 0.0))
        except Exception:  # noqa: BLE001 - a half-made Metric, or the interpreter shutting down
            pass

    def increment(self, value):
        value = float(value)
        if self._family._kind == "histogram":
            raise TritonModelException("a histogram can only observe values")
        if self._family._kind == "counter" and value < 0:
            raise TritonModelException("a counter can only be incremented by a non-negative value")
        self._value += value
        self._send("increment", value)

    def set(self, value):
        if self._family._kind != "gauge":
            raise TritonModelException(f"a {self._family._kind} cannot be set")
        self._value = float(value)
        self._send("set", self._value)

    def observe(self, value):
        if self._family._kind != "histogram":
            raise TritonModelException(f"a {self._family._kind} cannot observe values")
        self._send("observe", float(value))

    def value(self):
        if self._family._kind == "histogram":
            raise TritonModelException("a histogram has no single value")
        return self._value


_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    """Lines in kiln's log, at their level (`Logger.log(message, Logger.WARNING)`, as Triton's)."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message, level=LogLevel.INFO):
        _state["log"](level, str(message))

    @staticmethod
    def log_info(message):
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message):
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message):
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message):
        Logger.log(message, LogLevel.VERBOSE)


def _no_calls(request, decoupled=False):
    raise TritonModelException("calls to other models are served only inside kiln")


def _no_management(*_):
    raise TritonModelException("managing models is served only inside kiln")


# Filled by the stub: the model directory, where log lines, calls to other models and metric
# changes go.
_state = {"log": lambda level, message: print(message, file=sys.stderr), "call": _no_calls,
          "manage": _no_management, "metric": lambda change: None}
