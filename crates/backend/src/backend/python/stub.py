"""kiln's Python backend stub: one instance of a Triton Python model (`model.py`), run in its own
process and driven by kiln over the process's standard input and output. kiln starts it with
`python -c` and a bootstrap that reads this module and `triton_python_backend_utils` from the
pipe first (see BOOTSTRAP in mod.rs); the model file is `sys.argv[1]`.

Every message, both ways, is a 12-byte head (the JSON header's length as a little-endian u32,
then the length of the binary part as a u64), the JSON header, then the binary part: the data
of the tensors the header lists, one after another (`sizes` gives each length). Tensor data is
raw little-endian; BYTES elements are each a 4-byte little-endian length and the bytes, as in
Triton's wire format.

kiln sends `init` (Triton's `initialize` arguments), then `execute` (a list of requests) as
often as it has work, then `finalize`. The stub answers `ready`, `responses` (one per request)
and `done`, or `error` with a message (and the call's number: `execute` calls are counted from
1). A decoupled model's answer to `execute` is instead `executed` when `execute` returns, and a
`response` message for each response its senders send (the call's number, the request's index
in it, `final`), whenever they send it: kiln sends the next `execute` as soon as `executed`
came, and a thread of its own reads every answer. `log` lines and `metric` changes (the model's
custom metrics) may come before any answer, and so may `call`s of other models (the model's
`InferenceRequest.exec()`), which kiln answers with `called` (a decoupled call with one `called`
per response as the called model sends it, then one with `end`), and `manage` requests
(`pb_utils.load_model`, `unload_model`, `is_model_ready`), answered with `managed` (for a
decoupled model, whose threads may ask while the main loop waits, an `Inbox` thread sorts
kiln's messages). With
`--auto-complete` after the model file, the stub answers one `auto_complete` with `config`.
Cancelled requests are told on a pipe of their own, descriptor 3 (see `Cancellations`).
The model's own prints go to kiln's standard error, not into the protocol.
"""

import asyncio
import collections
import functools
import importlib.util
import inspect
import json
import os
import queue
import struct
import sys
import threading
import traceback

import numpy as np

import triton_python_backend_utils as pb_utils

_HEAD = struct.Struct("<IQ")

_NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
_WIRE = {np.dtype(t): name for name, t in _NUMPY.items()}
# The wire's (little-endian) numpy types, made once.
_LITTLE = {name: np.dtype(t).newbyteorder("<") for name, t in _NUMPY.items()}
_LITTLE_WIRE = {dtype: name for name, dtype in _LITTLE.items()}


class Misuse(Exception):
    """What a model's answer gets wrong, told as is (without an exception type)."""


class Channel:
    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer
        # A model's threads may log while another sends.
        self.sending = threading.Lock()
        # Messages that go out ahead of the next one: `Metric` objects collected, whose `__del__`
        # may run inside a send (the garbage collector runs on any allocation).
        self.later = collections.deque()

    def _read_exactly(self, n):
        buffer = bytearray(n)
        view = memoryview(buffer)
        got = 0
        while got < n:
            chunk = self.reader.readinto(view[got:])
            if not chunk:
                raise EOFError("kiln closed the channel")
            got += chunk
        return buffer

    def receive(self):
        json_len, blob_len = _HEAD.unpack(self._read_exactly(_HEAD.size))
        header = json.loads(bytes(self._read_exactly(json_len)))
        blobs = memoryview(self._read_exactly(blob_len))
        parts, start = [], 0
        for size in header.get("sizes", []):
            parts.append(blobs[start:start + size])
            start += size
        return header, parts

    def send(self, header, blobs=()):
        blobs = list(blobs)
        header["sizes"] = [len(b) for b in blobs]
        encoded = json.dumps(header).encode()
        with self.sending:
            while self.later:
                before = json.dumps(dict(self.later.popleft(), sizes=[])).encode()
                self.writer.write(_HEAD.pack(len(before), 0))
                self.writer.write(before)
            self.writer.write(_HEAD.pack(len(encoded), sum(len(b) for b in blobs)))
            self.writer.write(encoded)
            for blob in blobs:
                self.writer.write(blob)
            self.writer.flush()


def to_numpy(datatype, shape, data):
    if datatype == "BYTES":
        elements, at = [], 0
        while at < len(data):
            (length,) = struct.unpack_from("<I", data, at)
            elements.append(bytes(data[at + 4:at + 4 + length]))
            at += 4 + length
        return np.array(elements, dtype=np.object_).reshape(shape)
    # The blob is a slice of a bytearray: the array is writable, as Triton's are.
    return np.frombuffer(data, dtype=_LITTLE[datatype]).reshape(shape)


def from_numpy(name, array):
    """The wire datatype and data of an output array."""
    if array.dtype == np.object_ or array.dtype.kind in "SU":
        parts = []
        for element in array.reshape(-1):
            if isinstance(element, str):
                element = element.encode()
            elif isinstance(element, np.str_):
                element = str(element).encode()
            elif not isinstance(element, (bytes, np.bytes_)):
                element = str(element).encode()
            parts.append(struct.pack("<I", len(element)))
            parts.append(bytes(element))
        return "BYTES", b"".join(parts)
    wire = _LITTLE_WIRE.get(array.dtype)
    if wire is not None and array.flags.c_contiguous:
        # Written as it is, without a copy (the view lives until the message is sent).
        return wire, memoryview(array).cast("B") if array.size else b""
    wire = _WIRE.get(array.dtype.newbyteorder("="))
    if wire is None:
        raise Misuse(f"output '{name}' has numpy type {array.dtype}, which Triton cannot carry")
    return wire, np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def describe(error):
    """An exception as Triton's stub gives it: type, message, then the model's frames."""
    if isinstance(error, Misuse):
        return str(error)
    text = f"{type(error).__name__}: {error}"
    ours = (os.path.abspath(__file__), os.path.abspath(pb_utils.__file__))
    frames = [f for f in traceback.extract_tb(error.__traceback__) if os.path.abspath(f.filename) not in ours]
    if frames:
        text += "\n\nAt:\n" + "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return text


class Cancellations:
    """Which requests kiln cancelled while the model works on them (their clients went away).
    kiln writes each as 16 bytes on file descriptor 3, the `execute` call's number (calls
    counted from 1) and the request's index in it, little-endian u64s; a thread of its own reads
    them, so the word reaches a model while it still runs. A request is open from its call until
    its last response (a decoupled model's requests outlive their call)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.call = 0
        self.open = set()  # (call, index)
        self.cancelled = set()
        try:
            os.set_inheritable(3, False)  # not for the model's own subprocesses
        except OSError:
            return  # started without the pipe (an older kiln, a test): nothing is cancelled
        threading.Thread(target=self._read, name="kiln-cancellations", daemon=True).start()

    def _read(self):
        with os.fdopen(3, "rb", buffering=0) as pipe:
            while True:
                notice = b""
                while len(notice) < 16:
                    chunk = pipe.read(16 - len(notice))
                    if not chunk:
                        return
                    notice += chunk
                key = struct.unpack("<QQ", notice)
                with self.lock:
                    # A notice may overtake its call (another pipe): kept for it.
                    if key in self.open or key[0] > self.call:
                        self.cancelled.add(key)

    def begin(self, count):
        """Counts an `execute` call of `count` requests; its number."""
        with self.lock:
            self.call += 1
            self.open.update((self.call, index) for index in range(count))
            return self.call

    def end(self, call, index):
        """The request's last response went: nothing to cancel any more."""
        with self.lock:
            self.open.discard((call, index))
            self.cancelled.discard((call, index))

    def is_cancelled(self, call, index):
        with self.lock:
            return (call, index) in self.cancelled


class Inbox:
    """A decoupled model's messages from kiln. Its threads may call other models while the
    main loop waits for the next `execute`, so one thread reads the channel and hands the calls'
    answers to the caller waiting for one and everything else to the main loop."""

    def __init__(self, channel):
        self.main = queue.SimpleQueue()
        self.answers = queue.SimpleQueue()
        threading.Thread(target=self._read, args=(channel,), name="kiln-inbox", daemon=True).start()

    def _read(self, channel):
        while True:
            try:
                header, blobs = channel.receive()
            except EOFError:
                self.main.put(None)
                self.answers.put(None)
                return
            answer = header.get("op") in ("called", "managed")
            (self.answers if answer else self.main).put((header, blobs))

    @staticmethod
    def _take(messages):
        message = messages.get()
        if message is None:
            raise EOFError("kiln closed the channel")
        return message

    def receive(self):
        return self._take(self.main)

    def receive_answer(self):
        return self._take(self.answers)


class Exchange:
    """The model's questions to kiln and kiln's answers (a model's threads may ask at once; one
    exchange at a time): `exchange(header, blobs)` sends one question and reads its answer;
    `stream(header, blobs)` sends a decoupled call and reads its answers as the caller iterates,
    up to kiln's `end`. An exchange that starts while a stream is still open first reads that
    stream's answers into it, so that it can still be iterated; so does `drain`, which a model
    that is not decoupled runs after each execute, when kiln's next message must be a request.
    `receive` reads one answer (the channel's next message, unless an Inbox sorts them)."""

    def __init__(self, channel, receive=None):
        self.channel = channel
        self.receive = receive or channel.receive
        self.lock = threading.RLock()
        self.open = None
        self.streams = 0

    def drain(self):
        with self.lock:
            stream, self.open = self.open, None
            while stream is not None and not stream.ended:
                answer, parts = self.receive()
                if answer.get("end"):
                    stream.ended = True
                else:
                    stream.early.append((answer, parts))

    def __call__(self, header, blobs=()):
        with self.lock:
            self.drain()
            self.channel.send(header, blobs)
            return self.receive()

    def stream(self, header, blobs=()):
        with self.lock:
            self.drain()
            self.streams += 1
            header["stream"] = self.streams
            self.channel.send(header, blobs)
            self.open = Answers(self, self.streams)
            return self.open


class Answers:
    """The answers to one decoupled call (numbered `stream`), as kiln sends them."""

    def __init__(self, exchange, stream):
        self.exchange = exchange
        self.stream = stream
        self.early = collections.deque()  # read by another exchange before their turn
        self.ended = False

    def cancel(self):
        """Asks kiln to cancel the call: the called model hears its client left, and the answers
        end soon (those already on their way still come)."""
        if not self.ended:
            self.exchange.channel.send({"op": "cancel", "stream": self.stream})

    def __iter__(self):
        return self

    def __next__(self):
        exchange = self.exchange
        with exchange.lock:
            if self.early:
                return self.early.popleft()
            if self.ended:
                raise StopIteration
            answer, parts = exchange.receive()
            if answer.get("end"):
                self.ended = True
                exchange.open = None
                raise StopIteration
            return answer, parts


def make_manager(exchange):
    """Loads, unloads and asks after the server's models for the model (pb_utils.load_model,
    unload_model, is_model_ready)."""

    def manage(action, model, version, config, files, unload_dependents=False):
        names = list(files)
        header = {"op": "manage", "action": action, "model": str(model), "version": version, "config": config,
                  "files": names, "unload_dependents": bool(unload_dependents)}
        answer, _ = exchange(header, [bytes(files[name]) for name in names])
        if answer.get("error") is not None:
            raise pb_utils.TritonModelException(answer["error"])
        return answer.get("ready", False)

    return manage


def call_parameters(request):
    """A call's parameters as JSON text, its sequence (correlation_id, flags) among them as
    Triton's sequence_id, sequence_start and sequence_end, so that a stateful model can be called,
    and its timeout as the `timeout` parameter (microseconds in the called model's queue)."""
    correlation_id, timeout = request.correlation_id(), request._timeout
    if not correlation_id and not timeout:
        return request.parameters()
    parameters = json.loads(request.parameters())
    if correlation_id:
        parameters["sequence_id"] = correlation_id
        parameters["sequence_start"] = bool(request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
        parameters["sequence_end"] = bool(request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    if timeout:
        parameters["timeout"] = timeout
    return json.dumps(parameters)


def make_caller(exchange):
    """Runs a model's InferenceRequest on another model through kiln."""

    def response_of(answer, parts):
        if answer.get("error") is not None:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(answer["error"], answer.get("code", 1)))
        outputs = [pb_utils.Tensor(o["name"], to_numpy(o["datatype"], o["shape"], next(parts)))
                   for o in answer["outputs"]]
        parameters = {k: v for k, v in answer.get("parameters", {}).items() if isinstance(v, (bool, int, str))}
        return pb_utils.InferenceResponse(output_tensors=outputs, parameters=parameters)

    def call(request, decoupled=False):
        inputs, blobs = [], []
        for tensor in request.inputs():
            datatype, data = from_numpy(tensor.name(), tensor.as_numpy())
            inputs.append({"name": tensor.name(), "datatype": datatype, "shape": list(tensor.as_numpy().shape)})
            blobs.append(data)
        version = request._model_version
        header = {"op": "call", "request": {
            "model": request._model_name, "version": "" if version in (-1, None) else str(version),
            "id": request.request_id(), "parameters": call_parameters(request),
            "outputs": request._requested, "inputs": inputs, "decoupled": decoupled,
            "trace": request.trace()._id}}
        if not decoupled:
            answer, parts = exchange(header, blobs)
            return response_of(answer, iter(parts))
        # Each response as the called model sends it (a failure before the first is one response
        # with the error).
        return ResponseIterator(exchange.stream(header, blobs), response_of)

    return call


class ResponseIterator:
    """A decoupled call's responses as the called model sends them (Triton's BLS
    ResponseIterator); `cancel()` cancels the call."""

    def __init__(self, answers, response_of):
        self._answers = answers
        self._response_of = response_of

    def __iter__(self):
        return self

    def __next__(self):
        answer, parts = next(self._answers)
        return self._response_of(answer, iter(parts))

    def cancel(self):
        self._answers.cancel()


def load_module(path):
    """Imports model.py as `model`, its directory first on the path (as Triton's stub does)."""
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location("model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    return module


def requests_of(header, blobs):
    requests, index = [], 0
    for request in header["requests"]:
        inputs = []
        for tensor in request["inputs"]:
            inputs.append(pb_utils.Tensor(tensor["name"], to_numpy(tensor["datatype"], tensor["shape"], blobs[index])))
            index += 1
        requests.append(pb_utils.InferenceRequest(
            inputs=inputs, requested_output_names=request["outputs"], request_id=request["id"],
            correlation_id=request.get("correlation_id", 0), flags=request.get("flags", 0),
            parameters=request["parameters"], timeout=request.get("timeout", 0),
            _trace=(request.get("trace", 0), request.get("trace_context")), _kiln=True))
    return requests


def encode_response(response):
    """A response's header fields and its tensors' data."""
    if response is None:
        return {}, []
    if not isinstance(response, pb_utils.InferenceResponse):
        raise Misuse(f"a response must be an InferenceResponse, not {type(response).__name__}")
    if response.has_error():
        error = response.error()
        message = error.message() if hasattr(error, "message") else str(error)
        code = error.code() if hasattr(error, "code") else pb_utils.TritonError.INTERNAL
        return {"error": message, "code": code}, []
    outputs, blobs = [], []
    for tensor in response.output_tensors():
        array = tensor.as_numpy()
        datatype, data = from_numpy(tensor.name(), array)
        outputs.append({"name": tensor.name(), "datatype": datatype, "shape": list(array.shape)})
        blobs.append(data)
    fields = {"outputs": outputs}
    if response._parameters:
        fields["parameters"] = response._parameters
    return fields, blobs


def stream_to(channel, cancellations):
    """What a decoupled model's response sender calls: each response goes to kiln at once."""

    def send(request, response, final):
        fields, blobs = encode_response(response)
        channel.send({"op": "response", "call": request._call, "request": request._index, "final": final,
                      **fields}, blobs)
        if final:
            cancellations.end(request._call, request._index)

    return send


def answer(channel, requests, responses):
    """Sends kiln a call's responses; a rescheduled request's is None (it is answered by a
    later call)."""
    if responses is None:
        responses = [request._sent for request in requests]
        if any(r is None and not q._rescheduled() for r, q in zip(responses, requests)):
            raise Misuse(
                "execute returned None without sending a response for every request")
    responses = list(responses)
    if len(responses) != len(requests):
        raise Misuse(
            "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
            f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(responses)}\n")
    described, blobs = [], []
    for request, response in zip(requests, responses):
        if request._rescheduled():
            if response is not None:
                raise Misuse("a rescheduled request's response must be None: a later execute answers it")
            described.append({"rescheduled": True})
            continue
        if response is None:
            raise Misuse("execute must return InferenceResponse objects, not NoneType")
        fields, data = encode_response(response)
        described.append(fields)
        blobs.extend(data)
    channel.send({"op": "responses", "responses": described}, blobs)


def auto_complete(channel, model_path):
    """Runs the model class's `auto_complete_config` on the config kiln sends, if it has one."""
    header, _ = channel.receive()
    try:
        model_class = load_module(model_path).TritonPythonModel
        if not hasattr(model_class, "auto_complete_config"):
            channel.send({"op": "config", "config": None})
            return
        completed = model_class.auto_complete_config(pb_utils.ModelConfig(header["config"]))
        if not isinstance(completed, pb_utils.ModelConfig):
            raise Misuse("auto_complete_config must return the ModelConfig it was given")
        channel.send({"op": "config", "config": completed.as_dict()})
    except BaseException as error:  # noqa: B036 - the load fails with whatever the model raised
        traceback.print_exc()
        channel.send({"op": "error", "message": describe(error)})


def not_dumpable():
    """Another model's code (a stub of the same user) may not read this one's memory: no process
    but root's may, once this process is not dumpable (exec made it dumpable again)."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        pass


def main():
    not_dumpable()
    model_path = sys.argv[1]
    # The protocol keeps the process's stdin and stdout; the model's prints go to stderr and it
    # reads nothing from kiln's pipe.
    channel = Channel(os.fdopen(os.dup(0), "rb", buffering=0), os.fdopen(os.dup(1), "wb"))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    sys.stdout.reconfigure(line_buffering=True)

    pb_utils._state["log"] = lambda level, message: channel.send(
        {"op": "log", "level": level, "message": message})
    exchange = Exchange(channel)
    pb_utils._state["call"] = make_caller(exchange)
    pb_utils._state["manage"] = make_manager(exchange)
    pb_utils._state["metric"] = lambda change: channel.send({"op": "metric", **change})
    pb_utils._state["metric_later"] = lambda change: channel.later.append({"op": "metric", **change})
    if sys.argv[2:] == ["--auto-complete"]:
        auto_complete(channel, model_path)
        return
    loop = asyncio.new_event_loop()

    header, _ = channel.receive()
    args = header["args"]
    pb_utils._state["model_dir"] = args["model_repository"]
    try:
        model = load_module(model_path).TritonPythonModel()
        if hasattr(model, "initialize"):
            model.initialize(args)
    except BaseException as error:  # noqa: B036 - the load fails with whatever the model raised
        traceback.print_exc()
        channel.send({"op": "error", "message": describe(error)})
        return
    config = json.loads(args["model_config"])
    decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
    receive = channel.receive
    if decoupled:
        # kiln sends the next `execute` while earlier requests are still answered from the
        # model's threads, which may call other models meanwhile.
        inbox = Inbox(channel)
        receive = inbox.receive
        exchange = Exchange(channel, inbox.receive_answer)
        pb_utils._state["call"] = make_caller(exchange)
        pb_utils._state["manage"] = make_manager(exchange)
    channel.send({"op": "ready"})
    cancellations = Cancellations()
    stream = stream_to(channel, cancellations)
    while True:
        try:
            header, blobs = receive()
        except EOFError:
            return
        if header["op"] == "finalize":
            try:
                if hasattr(model, "finalize"):
                    model.finalize()
            except Exception:
                traceback.print_exc()
            channel.send({"op": "done"})
            return
        requests = requests_of(header, blobs)
        call = cancellations.begin(len(requests))
        for index, request in enumerate(requests):
            request._call, request._index = call, index
            request._cancelled = functools.partial(cancellations.is_cancelled, call, index)
        try:
            if decoupled:
                for request in requests:
                    request._stream = stream
            try:
                responses = model.execute(requests)
                # An `async def execute` (to await calls to other models) runs to its end here.
                if inspect.isawaitable(responses):
                    responses = loop.run_until_complete(responses)
            finally:
                if not decoupled:
                    # A decoupled call's answers the model left unread are read now: kiln's next
                    # message on the channel must be a request.
                    exchange.drain()
            if not decoupled:
                answer(channel, requests, responses)
                for request in requests:
                    cancellations.end(call, request._index)
            elif responses is not None:
                raise Misuse("a decoupled model's execute must return None: its responses go through "
                             "the response sender")
            else:
                rescheduled = [request._index for request in requests if request._rescheduled()]
                for index in rescheduled:
                    cancellations.end(call, index)
                channel.send({"op": "executed", "call": call, "rescheduled": rescheduled})
        except Exception as error:
            traceback.print_exc()
            # kiln ends the requests with this error: their senders are closed.
            for request in requests:
                request._complete = True
                cancellations.end(call, request._index)
            channel.send({"op": "error", "call": call, "message": describe(error)})


if __name__ == "__main__":
    main()
