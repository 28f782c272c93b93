"""TLS and mutual TLS on gRPC (Triton's --grpc-use-ssl flags) and REST (kiln's --http-use-ssl
flags of the same shape), with certificates the test makes with the openssl CLI and clients that
use tritonclient's own SSL options: a client trusting the test CA gets answers, a plaintext client
gets none, and with mutual TLS only a client presenting a certificate signed by the CA is served."""

import http.client
import shutil
import ssl
import subprocess

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import BUNDLED_REPO, find_free_port, http_request, start_server, stop_server

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA, a server certificate for localhost / 127.0.0.1 and a client certificate, all P-256."""
    d = tmp_path_factory.mktemp("certs")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=kiln test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    for name, usage, san in [("server", "serverAuth", "DNS:localhost,IP:127.0.0.1"),
                             ("client", "clientAuth", "DNS:kiln-test-client")]:
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
                                       f"keyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d


def tls_flags(certs, mutual):
    flags = []
    for proto in ("grpc", "http"):
        flags += [f"--{proto}-use-ssl", f"--{proto}-server-cert={certs / 'server.crt'}",
                  f"--{proto}-server-key={certs / 'server.key'}"]
        if mutual:
            flags += [f"--{proto}-use-ssl-mutual", f"--{proto}-root-cert={certs / 'ca.crt'}"]
    return flags


def credentials(certs, client_cert):
    return grpc.ssl_channel_credentials(
        root_certificates=(certs / "ca.crt").read_bytes(),
        private_key=(certs / "client.key").read_bytes() if client_cert else None,
        certificate_chain=(certs / "client.crt").read_bytes() if client_cert else None,
    )


@pytest.fixture(scope="module")
def tls_server(certs):
    srv = start_server([BUNDLED_REPO], name="kiln-tls", extra_args=tls_flags(certs, mutual=False),
                       grpc_credentials=credentials(certs, client_cert=False))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def mtls_server(certs):
    srv = start_server([BUNDLED_REPO], name="kiln-mtls", extra_args=tls_flags(certs, mutual=True),
                       grpc_credentials=credentials(certs, client_cert=True))
    yield srv
    stop_server(srv)


def infer_add_sub(client, module):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones_like(a))
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + 1)


def grpc_client(server, certs, client_cert):
    return grpcclient.InferenceServerClient(
        server.grpc_url, ssl=True, root_certificates=str(certs / "ca.crt"),
        private_key=str(certs / "client.key") if client_cert else None,
        certificate_chain=str(certs / "client.crt") if client_cert else None)


def http_client(server, certs, client_cert):
    options = {"ca_certs": str(certs / "ca.crt")}
    if client_cert:
        options.update(certfile=str(certs / "client.crt"), keyfile=str(certs / "client.key"))
    return httpclient.InferenceServerClient(server.http_url, ssl=True, ssl_options=options,
                                            connection_timeout=10, network_timeout=10)


def test_grpc_over_tls(tls_server, certs):
    client = grpc_client(tls_server, certs, client_cert=False)
    assert client.is_server_ready()
    infer_add_sub(client, grpcclient)
    client.close()
    plain = grpcclient.InferenceServerClient(tls_server.grpc_url)
    with pytest.raises(InferenceServerException):
        plain.is_server_live(client_timeout=5)
    plain.close()


def test_http_over_tls(tls_server, certs):
    client = http_client(tls_server, certs, client_cert=False)
    assert client.is_server_ready()
    infer_add_sub(client, httpclient)
    client.close()
    plain = httpclient.InferenceServerClient(tls_server.http_url, connection_timeout=5, network_timeout=5)
    with pytest.raises(Exception) as plaintext:
        plain.is_server_live()
    # The server's answer to plaintext is a TLS alert, which is no HTTP response.
    assert type(plaintext.value).__name__ == "HTTPParseError", repr(plaintext.value)
    plain.close()


def test_mutual_tls_requires_a_client_certificate(mtls_server, certs):
    client = grpc_client(mtls_server, certs, client_cert=True)
    infer_add_sub(client, grpcclient)
    client.close()
    anonymous = grpc_client(mtls_server, certs, client_cert=False)
    with pytest.raises(InferenceServerException):
        anonymous.is_server_live(client_timeout=5)
    anonymous.close()

    client = http_client(mtls_server, certs, client_cert=True)
    infer_add_sub(client, httpclient)
    client.close()
    anonymous = http_client(mtls_server, certs, client_cert=False)
    with pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED"):
        anonymous.is_server_live()
    anonymous.close()


def test_tls_flags_are_checked(certs):
    from conftest import kiln_bin
    for flags, message in [
        (["--grpc-use-ssl"], "--grpc-use-ssl needs --grpc-server-cert"),
        (["--http-use-ssl-mutual", f"--http-server-cert={certs / 'server.crt'}",
          f"--http-server-key={certs / 'server.key'}"], "--http-use-ssl-mutual needs --http-root-cert"),
        (["--http-use-ssl", f"--http-server-cert={certs / 'server.crt'}",
          f"--http-server-key={certs / 'missing.key'}"], "missing.key"),
    ]:
        proc = subprocess.run([str(kiln_bin()), "--model-repository", str(BUNDLED_REPO), "--grpc-port", "0",
                               "--http-port", "0", "--metrics-port", "0", *flags],
                              capture_output=True, timeout=60, text=True)
        assert proc.returncode != 0, proc.stderr
        assert message in proc.stderr, proc.stderr


def https_status(url, path, certs, client_cert):
    """The status of `GET path` over TLS, trusting the test CA (and presenting the client
    certificate when asked)."""
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    if client_cert:
        context.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual-tls"])
def test_the_cloud_listeners_use_the_rest_tls_settings(certs, mutual):
    """SageMaker, Vertex AI and the OpenAI-compatible API run inference on listeners of their
    own: with --http-use-ssl they speak TLS with REST's certificate (and require client
    certificates with mutual TLS), so none is a plaintext way around it."""
    ports = {name: find_free_port() for name in ("sagemaker", "vertex", "openai")}
    health = "/v1/endpoints/e/deployedModels/m"
    env = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(ports["vertex"]), "AIP_HEALTH_ROUTE": health,
           "AIP_PREDICT_ROUTE": f"{health}:predict"}
    flags = tls_flags(certs, mutual) + [
        "--allow-sagemaker=true", "--sagemaker-port", str(ports["sagemaker"]),
        "--openai-port", str(ports["openai"]), "--vertex-ai-default-model=add_sub"]
    srv = start_server([BUNDLED_REPO], name=f"kiln-cloud-{'mtls' if mutual else 'tls'}", env=env,
                       extra_args=flags, grpc_credentials=credentials(certs, client_cert=mutual))
    try:
        for name, path in [("sagemaker", "/ping"), ("vertex", health), ("openai", "/v1/models")]:
            url = f"127.0.0.1:{ports[name]}"
            assert https_status(url, path, certs, client_cert=mutual) == 200, name
            with pytest.raises(http.client.BadStatusLine):  # a TLS alert, not HTTP
                reply = http_request(url, "GET", path)
                pytest.fail(f"{name} answered plaintext HTTP: {reply.status}")
            if mutual:
                with pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED"):
                    status = https_status(url, path, certs, client_cert=False)
                    pytest.fail(f"{name} answered without a client certificate: {status}")
    finally:
        stop_server(srv)
