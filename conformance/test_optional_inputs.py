"""Optional inputs (`optional: true`) through tritonclient: a request may leave out an input the
model gives a default value (an ONNX initializer the graph also lists as an input), and gets the
default; a required input still has to come, with Triton's message. Model:
tests/fixtures/model_repository/optional_bias (Y = X + BIAS, BIAS defaults to [10, 20])."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

MODEL = "optional_bias"


def tensor(module, name, values):
    data = np.array(values, np.float32)
    t = module.InferInput(name, list(data.shape), "FP32")
    t.set_data_from_numpy(data)
    return t


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_an_optional_input_may_be_left_out(server, module):
    url = server.grpc_url if module is grpcclient else server.http_url
    client = module.InferenceServerClient(url)
    x = tensor(module, "X", [1.0, 2.0])
    without = client.infer(MODEL, [x]).as_numpy("Y")
    np.testing.assert_array_equal(without, [11.0, 22.0])
    given = client.infer(MODEL, [x, tensor(module, "BIAS", [0.5, 0.5])]).as_numpy("Y")
    np.testing.assert_array_equal(given, [1.5, 2.5])
    with pytest.raises(InferenceServerException) as e:
        client.infer(MODEL, [tensor(module, "BIAS", [0.5, 0.5])])
    # Triton: core src/infer_request.cc, InferenceRequest::Normalize (the optional-inputs branch of
    # its input count; Triton's qa/L0_input_validation freezes the "input(s)" wording).
    assert ("expected number of inputs between 1 and 2 but got 1 inputs for model 'optional_bias'. "
            "Got input(s) ['BIAS'], but missing required input(s) ['X']") in str(e.value)


def test_the_config_and_metadata_show_both_inputs(server):
    client = httpclient.InferenceServerClient(server.http_url)
    config = client.get_model_config(MODEL)
    assert [(i["name"], i["optional"]) for i in config["input"]] == [("X", False), ("BIAS", True)]
    assert [i["name"] for i in client.get_model_metadata(MODEL)["inputs"]] == ["X", "BIAS"]
