"""The OpenAPI 3.1 document kiln serves at /v2/openapi.json:

- it is the committed document (crates/protocol/src/protocol/http/openapi.json) and a valid OpenAPI 3.1 document
  for openapi-spec-validator (pinned in requirements.txt);
- what a running kiln answers matches the document's schemas: every GET route without a body
  that answers 200 for the bundled models, and inference, generation, repository index, log and
  trace settings, errors;
- with --console=false the pages answer Triton's 404 and the document stays;
- (the unit test protocol::http::openapi::tests checks both ways that every route the REST and
  OpenAI routers register is in the document and every documented operation is routed.)
"""

from __future__ import annotations

import json
import shutil

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from conftest import BUNDLED_REPO, REPO_ROOT, http_request, start_server, stop_server

DOCUMENT = REPO_ROOT / "crates" / "protocol" / "src" / "protocol" / "http" / "openapi.json"


@pytest.fixture(scope="module")
def kiln(tmp_path_factory):
    repo = tmp_path_factory.mktemp("openapi-repo")
    for model in ("add_sub", "string_echo", "tiny_decoder"):
        shutil.copytree(BUNDLED_REPO / model, repo / model)
    srv = start_server([repo], name="kiln-openapi")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def document(kiln):
    reply = http_request(kiln.http_url, "GET", "/v2/openapi.json")
    assert reply.status == 200, reply
    assert reply.headers["content-type"] == "application/json"
    return reply.json()


def check(document, schema_name: str, instance) -> None:
    """Validate `instance` against components/schemas/`schema_name` (JSON Schema 2020-12, the
    dialect of OpenAPI 3.1), the document's other schemas reachable by $ref."""
    schema = {"$ref": f"#/components/schemas/{schema_name}", "components": document["components"]}
    errors = sorted(Draft202012Validator(schema).iter_errors(instance), key=str)
    assert not errors, f"{schema_name}: {[e.message for e in errors][:5]} in {json.dumps(instance)[:500]}"


def response_schema(document, method: str, path: str, status: str = "200") -> str:
    """The schema name the document gives a route's JSON answer."""
    answer = document["paths"][path][method]["responses"][status]
    if "$ref" in answer:
        answer = document["components"]["responses"][answer["$ref"].rsplit("/", 1)[1]]
    schema = answer["content"]["application/json"]["schema"]
    if schema.get("type") == "array":
        schema = schema["items"]
    return schema["$ref"].rsplit("/", 1)[1]


def test_the_served_document_is_the_committed_one_and_valid_openapi_3_1(document):
    assert document == json.loads(DOCUMENT.read_text())
    assert document["openapi"] == "3.1.0"
    validate(document)  # raises on any violation of the OpenAPI 3.1 schema


@pytest.mark.parametrize(
    "path, template",
    [
        ("/v2", "/v2"),
        ("/v2/health/live", "/v2/health/live"),
        ("/v2/health/ready", "/v2/health/ready"),
        ("/v2/models/stats", "/v2/models/stats"),
        ("/v2/models/add_sub", "/v2/models/{model}"),
        ("/v2/models/add_sub/versions/1", "/v2/models/{model}/versions/{version}"),
        ("/v2/models/tiny_decoder/config", "/v2/models/{model}/config"),
        ("/v2/models/add_sub/versions/1/stats", "/v2/models/{model}/versions/{version}/stats"),
        ("/v2/trace/setting", "/v2/trace/setting"),
        ("/v2/models/add_sub/trace/setting", "/v2/models/{model}/trace/setting"),
        ("/v2/logging", "/v2/logging"),
        ("/v2/systemsharedmemory/status", "/v2/systemsharedmemory/status"),
        ("/console/status", "/console/status"),
    ],
)
def test_get_answers_match_their_schemas(kiln, document, path, template):
    reply = http_request(kiln.http_url, "GET", path)
    assert reply.status == 200, reply
    name = response_schema(document, "get", template)
    body = reply.json()
    for item in body if isinstance(body, list) else [body]:
        check(document, name, item)


def test_inference_generation_and_repository_answers_match(kiln, document):
    request = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1] * 16},
        ]
    }
    check(document, "InferenceRequest", request)
    reply = http_request(kiln.http_url, "POST", "/v2/models/add_sub/infer", json.dumps(request).encode())
    assert reply.status == 200, reply
    check(document, response_schema(document, "post", "/v2/models/{model}/infer"), reply.json())

    generate = {"text_input": "A kiln is", "parameters": {"max_tokens": 4}}
    check(document, "GenerateRequest", generate)
    reply = http_request(kiln.http_url, "POST", "/v2/models/tiny_decoder/generate", json.dumps(generate).encode())
    assert reply.status == 200, reply
    check(document, "GenerateResponse", reply.json())
    assert isinstance(reply.json()["text_output"], str)

    reply = http_request(kiln.http_url, "POST", "/v2/repository/index", b"{}")
    assert reply.status == 200, reply
    for entry in reply.json():
        check(document, response_schema(document, "post", "/v2/repository/index"), entry)

    reply = http_request(kiln.http_url, "POST", "/v2/logging", b'{"log_verbose_level": 0}')
    assert reply.status == 200, reply
    check(document, response_schema(document, "post", "/v2/logging"), reply.json())


def test_errors_match_the_error_schema(kiln, document):
    for method, path in [("GET", "/v2/models/no_such_model"), ("POST", "/v2/models/add_sub/infer")]:
        reply = http_request(kiln.http_url, method, path, b"{" if method == "POST" else b"")
        assert reply.status in (400, 404), reply
        check(document, "Error", reply.json())


def test_without_the_console_its_pages_are_gone_and_the_document_stays(tmp_path):
    shutil.copytree(BUNDLED_REPO / "add_sub", tmp_path / "add_sub")
    srv = start_server([tmp_path], name="kiln-no-console", extra_args=["--console=false"])
    try:
        for path in ("/console", "/console/docs", "/console/status"):
            reply = http_request(srv.http_url, "GET", path)
            assert (reply.status, reply.json()) == (404, {"error": "Not Found"}), path
        assert http_request(srv.http_url, "GET", "/v2/openapi.json").status == 200
    finally:
        stop_server(srv)
