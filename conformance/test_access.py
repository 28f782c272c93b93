"""Restricted APIs and the inference bearer token, checked with tritonclient's `headers=` option
the way Triton's own L0_grpc / L0_http restricted-API tests do: a restricted group without its
header is refused with Triton's text (gRPC UNAVAILABLE "This protocol is restricted, expecting
header 'triton-grpc-protocol-<key>'", HTTP 403 "This API is restricted, expecting header '<key>'"),
the right header lets the call through to its real answer, unrestricted groups need nothing, and
no key value ever reaches the log."""

import queue
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, http_request, start_server, stop_server

GRPC_PREFIX = "triton-grpc-protocol-"
ADMIN = {"admin-key": "admin-value"}
INFER = {"infer-key": "infer-value"}


def grpc_headers(headers):
    return {GRPC_PREFIX + k: v for k, v in headers.items()}


@pytest.fixture(scope="module")
def restricted():
    srv = start_server(
        [BUNDLED_REPO],
        name="kiln-restricted",
        extra_args=[
            "--grpc-restricted-protocol=model-repository:admin-key=admin-value",
            "--grpc-restricted-protocol=inference,health:infer-key=infer-value",
            "--http-restricted-api=model-repository,statistics:admin-key=admin-value",
            "--http-restricted-api=inference,metadata:infer-key=infer-value",
        ],
        metadata=tuple(grpc_headers(INFER).items()),
    )
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def bearer():
    srv = start_server([BUNDLED_REPO], name="kiln-bearer", env={"KILN_INFERENCE_BEARER_TOKEN": "s3cr3t-t0ken"})
    yield srv
    stop_server(srv)


def add_sub_inputs(module):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones_like(a))
    return inputs, a + 1


def refused(fn, fragment, status=None):
    with pytest.raises(InferenceServerException) as ei:
        fn()
    assert fragment in ei.value.message(), ei.value.message()
    if status is not None:
        assert ei.value.status() == status, (ei.value.status(), ei.value.message())
    return ei.value


def test_grpc_groups_like_triton(restricted):
    client = grpcclient.InferenceServerClient(restricted.grpc_url)
    infer = grpc_headers(INFER)
    # health is restricted to the infer key
    refused(client.is_server_live,
            "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'",
            "StatusCode.UNAVAILABLE")
    assert client.is_server_live(headers=infer)
    # statistics is not restricted on gRPC
    client.get_inference_statistics("add_sub")
    client.get_inference_statistics("add_sub", headers=infer)
    # model-repository needs the admin key; with it, the call gets its real answer
    refused(lambda: client.unload_model("add_sub", headers=infer), "This protocol is restricted")
    refused(lambda: client.unload_model("add_sub", headers=grpc_headers(ADMIN)),
            "explicit model load / unload is not allowed")
    # inference
    inputs, expected = add_sub_inputs(grpcclient)
    refused(lambda: client.infer("add_sub", inputs, headers={"test": "1"}), "This protocol is restricted")
    wrong = {GRPC_PREFIX + "infer-key": "infer-valuE"}
    refused(lambda: client.infer("add_sub", inputs, headers=wrong), "This protocol is restricted")
    result = client.infer("add_sub", inputs, headers=infer)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    client.close()


def test_grpc_stream_is_refused_at_start(restricted):
    client = grpcclient.InferenceServerClient(restricted.grpc_url)
    inputs, expected = add_sub_inputs(grpcclient)
    answers = queue.Queue()

    def callback(answers, result, error):
        answers.put(error if error else result)

    client.start_stream(partial(callback, answers), headers={"test": "1"})
    first = answers.get(timeout=30)
    assert isinstance(first, InferenceServerException), first
    # Triton: server src/grpc/infer_handler.cc and grpc_server.cc, each handler's ExecutePrecondition
    # failure ("This protocol is restricted, expecting header '<key>'", UNAVAILABLE).
    assert "This protocol is restricted" in first.message()
    client.stop_stream()
    client.start_stream(partial(callback, answers), headers=grpc_headers(INFER))
    client.async_stream_infer("add_sub", inputs)
    result = answers.get(timeout=30)
    assert not isinstance(result, InferenceServerException), result
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    client.stop_stream()
    client.close()


def test_http_apis_like_triton(restricted):
    client = httpclient.InferenceServerClient(restricted.http_url)
    # health is not restricted on HTTP
    assert client.is_server_live()
    # Triton: server src/http_server.cc, RETURN_AND_RESPOND_IF_RESTRICTED (403); the searched copies
    # did not show the text's line itself, which Triton's L0_http restricted-API test freezes.
    exc = refused(lambda: client.get_inference_statistics("add_sub"),
                  "This API is restricted, expecting header 'admin-key'")
    assert exc.status() == "403"
    client.get_inference_statistics("add_sub", headers=ADMIN)
    refused(lambda: client.unload_model("add_sub", headers=INFER), "This API is restricted")
    refused(lambda: client.unload_model("add_sub", headers=ADMIN), "explicit model load / unload is not allowed")
    refused(lambda: client.get_model_metadata("add_sub"), "expecting header 'infer-key'")
    assert client.get_model_metadata("add_sub", headers=INFER)["name"] == "add_sub"
    inputs, expected = add_sub_inputs(httpclient)
    refused(lambda: client.infer("add_sub", inputs), "This API is restricted")
    result = client.infer("add_sub", inputs, headers=INFER)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    client.close()


def test_keys_never_reach_the_log(restricted):
    log = restricted.log_text()
    assert "admin-value" not in log and "infer-value" not in log
    assert "requires header 'admin-key'" in log  # the start-up log names headers, not values


def test_restriction_flags_are_validated_like_triton():
    import subprocess
    from conftest import kiln_bin
    for flags, message in [
        (["--grpc-restricted-protocol=model-repository,health:k1=v1",
          "--grpc-restricted-protocol=metadata,health:k2=v2"],
         "protocol 'health' can not be specified in multiple config groups"),
        (["--grpc-restricted-protocol=model-reposit,health:k1=v1"], "unknown restricted protocol 'model-reposit'"),
        (["--http-restricted-api=health:no-value-here"], "--http-restricted-api expects"),
    ]:
        proc = subprocess.run([str(kiln_bin()), "--model-repository", str(BUNDLED_REPO),
                               "--grpc-port", "0", "--http-port", "0", "--metrics-port", "0", *flags],
                              capture_output=True, timeout=60, text=True)
        assert proc.returncode != 0
        assert message in proc.stderr, proc.stderr
        assert "no-value-here" not in proc.stderr


def test_bearer_token_guards_inference(bearer):
    inputs, expected = add_sub_inputs(grpcclient)
    client = grpcclient.InferenceServerClient(bearer.grpc_url)
    assert client.is_server_ready()  # health and metadata stay open
    assert client.get_model_metadata("add_sub").name == "add_sub"
    for headers in [None, {"authorization": "Bearer wrong"}, {"authorization": "s3cr3t-t0ken"}]:
        exc = refused(lambda: client.infer("add_sub", inputs, headers=headers), "Bearer", "StatusCode.UNAUTHENTICATED")
        assert "s3cr3t" not in exc.message()
    result = client.infer("add_sub", inputs, headers={"authorization": "Bearer s3cr3t-t0ken"})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    client.close()

    http = httpclient.InferenceServerClient(bearer.http_url)
    exc = refused(lambda: http.infer("add_sub", inputs=add_sub_inputs(httpclient)[0]), "Bearer")
    assert exc.status() == "401"
    result = http.infer("add_sub", add_sub_inputs(httpclient)[0], headers={"Authorization": "Bearer s3cr3t-t0ken"})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    http.close()
    raw = http_request(bearer.http_url, "POST", "/v2/models/add_sub/infer", b"{}")
    assert raw.status == 401 and raw.headers.get("www-authenticate") == "Bearer", raw
    assert "s3cr3t" not in bearer.log_text()
