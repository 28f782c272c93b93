//! Conversions between Triton's gRPC messages and the engine's types: request tensors from raw
//! (`raw_input_contents`) or typed (`contents`) data, responses always raw (one entry per output,
//! in order), and parameters of all five kinds.

use crate::core::{
    DataType, Error, InferRequest, InferResponse, ParamValue, Parameters, RequestedOutput, Tensor,
};
use crate::engine::shared_memory;
use crate::invalid_arg;
use crate::proto::inference::{
    infer_parameter::ParameterChoice, model_infer_request::InferInputTensor,
    model_infer_response::InferOutputTensor, InferParameter, InferTensorContents,
    ModelInferRequest, ModelInferResponse,
};
use bytes::{BufMut, Bytes, BytesMut};
use std::collections::HashMap;

/// Wire parameters → engine parameters. A parameter whose oneof is unset carries no value and is
/// dropped.
pub fn params_from_wire(params: HashMap<String, InferParameter>) -> Parameters {
    params
        .into_iter()
        .filter_map(|(key, param)| {
            let value = match param.parameter_choice? {
                ParameterChoice::BoolParam(v) => ParamValue::Bool(v),
                ParameterChoice::Int64Param(v) => ParamValue::Int64(v),
                ParameterChoice::StringParam(v) => ParamValue::String(v),
                ParameterChoice::DoubleParam(v) => ParamValue::Double(v),
                ParameterChoice::Uint64Param(v) => ParamValue::Uint64(v),
            };
            Some((key, value))
        })
        .collect()
}

/// The request parameters Triton's gRPC front end refuses, in its words (checked against 2.51):
/// the sequence, priority and timeout keys of another type, a negative priority, `triton_*` keys
/// but `triton_enable_empty_final_response` (a bool), and `uint64_param` for any other key.
fn check_parameter_types(params: &HashMap<String, InferParameter>) -> Result<(), Error> {
    use crate::core::reserved::{self, Reserved, EMPTY_FINAL_RESPONSE as EMPTY_FINAL};
    use ParameterChoice::{BoolParam, DoubleParam, Int64Param, StringParam, Uint64Param};
    for (key, param) in params {
        let choice = param.parameter_choice.as_ref();
        let expected = match reserved::reserved(key) {
            Some(Reserved::SequenceId) => (!matches!(choice, Some(Int64Param(_) | StringParam(_))))
                .then_some("int64_param or string_param"),
            Some(Reserved::SequenceFlag | Reserved::EmptyFinal) => {
                (!matches!(choice, Some(BoolParam(_)))).then_some("bool_param")
            }
            Some(Reserved::Priority) => match choice {
                Some(Int64Param(p)) if *p < 0 => {
                    return Err(invalid_arg!(
                        "invalid value for 'priority', expected value >= 0."
                    ))
                }
                Some(Int64Param(_) | Uint64Param(_)) => None,
                _ => Some("int64_param or uint64_param"),
            },
            Some(Reserved::Timeout) => {
                (!matches!(choice, Some(Int64Param(_)))).then_some("int64_param")
            }
            None if reserved::has_triton_prefix(key) => {
                return Err(invalid_arg!(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. Only \
                     the following keys starting with 'triton_' are allowed: {EMPTY_FINAL}"
                ))
            }
            None => (!matches!(
                choice,
                Some(Int64Param(_) | BoolParam(_) | StringParam(_) | DoubleParam(_))
            ))
            .then_some("int64_param, bool_param, or string_param"),
        };
        if let Some(expected) = expected {
            return Err(invalid_arg!(
                "invalid value type for '{key}' parameter, expected {expected}."
            ));
        }
    }
    Ok(())
}

/// Engine parameters → wire parameters.
pub fn params_to_wire(params: Parameters) -> HashMap<String, InferParameter> {
    params
        .into_iter()
        .map(|(key, value)| {
            let choice = match value {
                ParamValue::Bool(v) => ParameterChoice::BoolParam(v),
                ParamValue::Int64(v) => ParameterChoice::Int64Param(v),
                ParamValue::String(v) => ParameterChoice::StringParam(v),
                ParamValue::Double(v) => ParameterChoice::DoubleParam(v),
                ParamValue::Uint64(v) => ParameterChoice::Uint64Param(v),
            };
            (
                key,
                InferParameter {
                    parameter_choice: Some(choice),
                },
            )
        })
        .collect()
}

/// Decodes a `ModelInferRequest`. Raw entries are matched to inputs in order, skipping inputs that
/// carry typed contents or name a shared-memory region; mixing raw and typed is rejected, as
/// Triton does.
///
/// # Errors
/// INVALID_ARGUMENT with Triton's message for missing data, mixed raw/typed data, a typed field
/// that does not match the datatype, typed contents beside shared memory, or an unknown datatype.
pub fn request_from_wire(request: ModelInferRequest) -> Result<InferRequest, Error> {
    check_parameter_types(&request.parameters)?;
    let model = request.model_name;
    let uses_raw = !request.raw_input_contents.is_empty();
    // Clients such as MLServer's converter send an empty `contents` beside raw data: only a
    // populated typed field counts as typed data.
    if uses_raw {
        if let Some(typed) = request.inputs.iter().find(|i| {
            i.contents
                .as_ref()
                .is_some_and(|c| populated_field(c).is_some())
        }) {
            return Err(invalid_arg!(
                "contents field must not be specified when using raw_input_contents for '{}' for model '{model}'",
                typed.name
            ));
        }
    }
    let mut raw = request.raw_input_contents.into_iter();
    let mut inputs = Vec::with_capacity(request.inputs.len());
    for input in request.inputs {
        inputs.push(input_from_wire(input, &model, uses_raw, &mut raw)?);
    }
    let extra = raw.count();
    if extra > 0 {
        return Err(invalid_arg!(
            "{extra} raw_input_contents entries do not match any input for model '{model}'"
        ));
    }
    let outputs = request
        .outputs
        .into_iter()
        .map(|o| RequestedOutput {
            name: o.name,
            parameters: params_from_wire(o.parameters),
        })
        .collect();
    Ok(InferRequest {
        model_name: model,
        model_version: request.model_version,
        id: request.id,
        parameters: params_from_wire(request.parameters),
        inputs,
        outputs,
    })
}

fn input_from_wire(
    input: InferInputTensor,
    model: &str,
    uses_raw: bool,
    raw: &mut impl Iterator<Item = Bytes>,
) -> Result<Tensor, Error> {
    let name = input.name;
    let datatype = DataType::from_wire(&input.datatype).ok_or_else(|| {
        invalid_arg!(
            "invalid datatype '{}' for input '{name}' for model '{model}'",
            input.datatype
        )
    })?;
    let parameters = params_from_wire(input.parameters);
    // The engine reads a shared-memory input's data out of its region; it takes no raw entry.
    let in_shared_memory = parameters.contains_key(shared_memory::REGION);
    let data = match input.contents {
        _ if in_shared_memory => {
            if input
                .contents
                .as_ref()
                .is_some_and(|c| populated_field(c).is_some())
            {
                return Err(invalid_arg!(
                    "unexpected 'content' provided when using shared memory for input tensor \
                     '{name}' for model '{model}'"
                ));
            }
            Bytes::new()
        }
        Some(contents) if !uses_raw => typed_to_raw(contents, datatype, &name, model)?,
        _ => raw.next().ok_or_else(|| {
            invalid_arg!(
                "unable to find data for input tensor '{name}' for model '{model}' in request."
            )
        })?,
    };
    Ok(Tensor {
        name,
        datatype,
        shape: input.shape,
        data,
        parameters,
    })
}

/// The datatype name of the first non-empty typed field, as Triton reports it.
fn populated_field(c: &InferTensorContents) -> Option<&'static str> {
    [
        (!c.bool_contents.is_empty(), "BOOL"),
        (!c.int_contents.is_empty(), "INT32"),
        (!c.int64_contents.is_empty(), "INT64"),
        (!c.uint_contents.is_empty(), "UINT32"),
        (!c.uint64_contents.is_empty(), "UINT64"),
        (!c.fp32_contents.is_empty(), "FP32"),
        (!c.fp64_contents.is_empty(), "FP64"),
        (!c.bytes_contents.is_empty(), "BYTES"),
    ]
    .into_iter()
    .find_map(|(set, name)| set.then_some(name))
}

/// Packs little-endian values of the given width.
fn pack<T: Copy>(values: &[T], width: usize, put: impl Fn(&mut BytesMut, T)) -> Bytes {
    let mut out = BytesMut::with_capacity(values.len() * width);
    for &v in values {
        put(&mut out, v);
    }
    out.freeze()
}

/// Converts typed contents to the raw layout of `datatype`. Narrow integer types travel in the
/// 32-bit fields; their low bytes are kept, as Triton does.
fn typed_to_raw(
    c: InferTensorContents,
    datatype: DataType,
    name: &str,
    model: &str,
) -> Result<Bytes, Error> {
    let expected_field = match datatype {
        DataType::Bool => "BOOL",
        DataType::Int8 | DataType::Int16 | DataType::Int32 => "INT32",
        DataType::Int64 => "INT64",
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => "UINT32",
        DataType::Uint64 => "UINT64",
        DataType::Fp32 => "FP32",
        DataType::Fp64 => "FP64",
        DataType::Bytes => "BYTES",
        // No typed field exists for these: only an empty (zero-element) typed tensor is valid.
        DataType::Fp16 | DataType::Bf16 => match populated_field(&c) {
            None => return Ok(Bytes::new()),
            Some(_) => {
                return Err(invalid_arg!(
                    "{datatype} input '{name}' for model '{model}' must be sent in raw_input_contents: \
                     the protocol has no typed field for {datatype}"
                ))
            }
        },
    };
    if let Some(found) = populated_field(&c) {
        if found != expected_field {
            return Err(invalid_arg!(
                "unexpected explicit tensor data for input tensor '{name}' for model '{model}' of type '{found}', \
                 expected datatype '{datatype}'"
            ));
        }
    }
    Ok(match datatype {
        DataType::Bool => pack(&c.bool_contents, 1, |b, v| b.put_u8(u8::from(v))),
        DataType::Int8 => pack(&c.int_contents, 1, |b, v| b.put_i8(v as i8)),
        DataType::Int16 => pack(&c.int_contents, 2, |b, v| b.put_i16_le(v as i16)),
        DataType::Int32 => pack(&c.int_contents, 4, |b, v| b.put_i32_le(v)),
        DataType::Int64 => pack(&c.int64_contents, 8, |b, v| b.put_i64_le(v)),
        DataType::Uint8 => pack(&c.uint_contents, 1, |b, v| b.put_u8(v as u8)),
        DataType::Uint16 => pack(&c.uint_contents, 2, |b, v| b.put_u16_le(v as u16)),
        DataType::Uint32 => pack(&c.uint_contents, 4, |b, v| b.put_u32_le(v)),
        DataType::Uint64 => pack(&c.uint64_contents, 8, |b, v| b.put_u64_le(v)),
        DataType::Fp32 => pack(&c.fp32_contents, 4, |b, v| b.put_f32_le(v)),
        DataType::Fp64 => pack(&c.fp64_contents, 8, |b, v| b.put_f64_le(v)),
        DataType::Bytes => c.bytes_contents.into_framed(),
        DataType::Fp16 | DataType::Bf16 => unreachable!("rejected above"),
    })
}

/// Encodes a response: outputs in order, data only in `raw_output_contents`.
pub fn response_to_wire(response: InferResponse) -> ModelInferResponse {
    let mut outputs = Vec::with_capacity(response.outputs.len());
    let mut raw = Vec::with_capacity(response.outputs.len());
    for output in response.outputs {
        // An output written to shared memory goes with an empty raw entry and no parameters,
        // as Triton writes it.
        let parameters = if output.parameters.contains_key(shared_memory::REGION) {
            HashMap::new()
        } else {
            params_to_wire(output.parameters)
        };
        outputs.push(InferOutputTensor {
            name: output.name,
            datatype: output.datatype.as_wire().to_string(),
            shape: output.shape,
            parameters,
            contents: None,
        });
        raw.push(output.data);
    }
    ModelInferResponse {
        model_name: response.model_name,
        model_version: response.model_version,
        id: response.id,
        parameters: params_to_wire(response.parameters),
        outputs,
        raw_output_contents: raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tensor::{frame_bytes, BytesElements};

    fn input(
        name: &str,
        datatype: &str,
        shape: &[i64],
        contents: Option<InferTensorContents>,
    ) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
            parameters: HashMap::new(),
            contents,
        }
    }

    fn request(inputs: Vec<InferInputTensor>, raw: Vec<Bytes>) -> ModelInferRequest {
        ModelInferRequest {
            model_name: "m".into(),
            inputs,
            raw_input_contents: raw,
            ..Default::default()
        }
    }

    fn message(result: Result<InferRequest, Error>) -> String {
        result.unwrap_err().message().to_string()
    }

    #[test]
    fn shared_memory_inputs_take_no_raw_entry_and_no_contents() {
        let in_region = |contents| {
            let mut tensor = input("a", "FP32", &[1], contents);
            tensor.parameters.insert(
                shared_memory::REGION.into(),
                InferParameter {
                    parameter_choice: Some(ParameterChoice::StringParam("r".into())),
                },
            );
            tensor
        };
        let raw = Bytes::from_static(&[0, 0, 128, 63]);
        let decoded = request_from_wire(request(
            vec![in_region(None), input("b", "FP32", &[1], None)],
            vec![raw.clone()],
        ))
        .unwrap();
        assert!(decoded.inputs[0].data.is_empty());
        assert!(decoded.inputs[0]
            .parameters
            .contains_key(shared_memory::REGION));
        assert_eq!(decoded.inputs[1].data, raw);

        let typed = InferTensorContents {
            fp32_contents: vec![1.0],
            ..Default::default()
        };
        assert_eq!(
            message(request_from_wire(request(
                vec![in_region(Some(typed))],
                vec![]
            ))),
            "unexpected 'content' provided when using shared memory for input tensor 'a' for \
             model 'm'"
        );
    }

    #[test]
    fn raw_inputs_map_in_order() {
        let req = request(
            vec![
                input("a", "FP32", &[1], None),
                input("b", "BYTES", &[1], None),
            ],
            vec![Bytes::from_static(&[0, 0, 128, 63]), frame_bytes([b"hi"])],
        );
        let decoded = request_from_wire(req).unwrap();
        assert_eq!(decoded.inputs[0].data, Bytes::from_static(&[0, 0, 128, 63]));
        assert_eq!(decoded.inputs[1].datatype, DataType::Bytes);
        assert_eq!(decoded.inputs[1].data.len(), 6);
    }

    #[test]
    fn typed_contents_for_every_datatype() {
        let c = |f: fn(&mut InferTensorContents)| {
            let mut contents = InferTensorContents::default();
            f(&mut contents);
            Some(contents)
        };
        let cases: Vec<(&str, Option<InferTensorContents>, Vec<u8>)> = vec![
            (
                "BOOL",
                c(|c| c.bool_contents = vec![true, false]),
                vec![1, 0],
            ),
            ("INT8", c(|c| c.int_contents = vec![-1, 2]), vec![255, 2]),
            ("INT16", c(|c| c.int_contents = vec![-2]), vec![254, 255]),
            ("INT32", c(|c| c.int_contents = vec![7]), vec![7, 0, 0, 0]),
            ("INT64", c(|c| c.int64_contents = vec![-1]), vec![255; 8]),
            ("UINT8", c(|c| c.uint_contents = vec![200]), vec![200]),
            ("UINT16", c(|c| c.uint_contents = vec![258]), vec![2, 1]),
            ("UINT32", c(|c| c.uint_contents = vec![1]), vec![1, 0, 0, 0]),
            (
                "UINT64",
                c(|c| c.uint64_contents = vec![2]),
                vec![2, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                "FP32",
                c(|c| c.fp32_contents = vec![1.0]),
                1.0f32.to_le_bytes().to_vec(),
            ),
            (
                "FP64",
                c(|c| c.fp64_contents = vec![-2.5]),
                (-2.5f64).to_le_bytes().to_vec(),
            ),
            (
                "BYTES",
                c(|c| c.bytes_contents = vec![Bytes::from_static(b"xy")].into()),
                vec![2, 0, 0, 0, b'x', b'y'],
            ),
        ];
        for (datatype, contents, expected) in cases {
            let decoded =
                request_from_wire(request(vec![input("a", datatype, &[1], contents)], vec![]))
                    .unwrap();
            assert_eq!(&decoded.inputs[0].data[..], &expected[..], "{datatype}");
        }
    }

    #[test]
    fn typed_field_must_match_datatype() {
        let contents = InferTensorContents {
            int_contents: vec![1],
            ..Default::default()
        };
        let err = message(request_from_wire(request(
            vec![input("a", "FP32", &[1], Some(contents))],
            vec![],
        )));
        assert_eq!(
            err,
            "unexpected explicit tensor data for input tensor 'a' for model 'm' of type 'INT32', expected datatype 'FP32'"
        );
        let fp16 = InferTensorContents {
            fp32_contents: vec![1.0],
            ..Default::default()
        };
        let err = message(request_from_wire(request(
            vec![input("h", "FP16", &[1], Some(fp16))],
            vec![],
        )));
        assert!(err.contains("must be sent in raw_input_contents"));
        let empty = request_from_wire(request(
            vec![input(
                "h",
                "FP16",
                &[2, 0],
                Some(InferTensorContents::default()),
            )],
            vec![],
        ))
        .unwrap();
        assert!(empty.inputs[0].data.is_empty());
    }

    #[test]
    fn missing_extra_and_mixed_data() {
        let err = message(request_from_wire(request(
            vec![input("a", "FP32", &[1], None)],
            vec![],
        )));
        assert_eq!(
            err,
            "unable to find data for input tensor 'a' for model 'm' in request."
        );
        let typed = InferTensorContents {
            fp32_contents: vec![1.0],
            ..Default::default()
        };
        let mixed = request(
            vec![
                input("a", "FP32", &[1], Some(typed)),
                input("b", "FP32", &[1], None),
            ],
            vec![Bytes::from_static(&[0; 4])],
        );
        // An empty `contents` beside raw data (MLServer's converter) is not typed data.
        let empty_typed = request(
            vec![input(
                "a",
                "FP32",
                &[1],
                Some(InferTensorContents::default()),
            )],
            vec![Bytes::from_static(&[0; 4])],
        );
        assert_eq!(
            request_from_wire(empty_typed).unwrap().inputs[0].data.len(),
            4
        );
        assert_eq!(
            message(request_from_wire(mixed)),
            "contents field must not be specified when using raw_input_contents for 'a' for model 'm'"
        );
        let extra = request(
            vec![input("a", "FP32", &[1], None)],
            vec![Bytes::new(), Bytes::new()],
        );
        assert!(message(request_from_wire(extra)).contains("do not match any input"));
        let bad_type = request(vec![input("a", "FLOAT", &[1], None)], vec![Bytes::new()]);
        assert_eq!(
            message(request_from_wire(bad_type)),
            "invalid datatype 'FLOAT' for input 'a' for model 'm'"
        );
    }

    #[test]
    fn parameters_of_every_kind_round_trip() {
        let mut params = Parameters::new();
        params.insert("b".into(), ParamValue::Bool(true));
        params.insert("i".into(), ParamValue::Int64(-3));
        params.insert("u".into(), ParamValue::Uint64(u64::MAX));
        params.insert("d".into(), ParamValue::Double(0.25));
        params.insert("s".into(), ParamValue::String("str".into()));
        assert_eq!(params_from_wire(params_to_wire(params.clone())), params);
        let mut empty = HashMap::new();
        empty.insert(
            "none".to_string(),
            InferParameter {
                parameter_choice: None,
            },
        );
        assert!(params_from_wire(empty).is_empty());
    }

    #[test]
    fn responses_are_raw_only_and_ordered() {
        let response = InferResponse {
            model_name: "m".into(),
            model_version: "1".into(),
            id: "x".into(),
            parameters: Parameters::new(),
            outputs: vec![
                Tensor::new(
                    "o1",
                    DataType::Bytes,
                    vec![2],
                    frame_bytes([&b"a"[..], b""]),
                ),
                Tensor::new("o0", DataType::Fp16, vec![1], Bytes::from_static(&[0, 60])),
            ],
        };
        let wire = response_to_wire(response);
        assert_eq!(wire.outputs.len(), 2);
        assert_eq!(wire.raw_output_contents.len(), 2);
        assert!(wire.outputs.iter().all(|o| o.contents.is_none()));
        assert_eq!(wire.outputs[1].datatype, "FP16");
        let elements: Vec<&[u8]> = BytesElements::new(&wire.raw_output_contents[0])
            .map(Result::unwrap)
            .collect();
        assert_eq!(elements, vec![&b"a"[..], &b""[..]]);
    }

    #[test]
    fn parameter_types_are_checked_as_triton_checks_them() {
        let request = |key: &str, choice: ParameterChoice| ModelInferRequest {
            parameters: HashMap::from([(
                key.to_string(),
                InferParameter {
                    parameter_choice: Some(choice),
                },
            )]),
            ..Default::default()
        };
        let refusal = |key, choice| {
            request_from_wire(request(key, choice))
                .unwrap_err()
                .message()
                .to_string()
        };
        use ParameterChoice::{BoolParam, DoubleParam, Int64Param, StringParam, Uint64Param};
        assert_eq!(
            refusal("timeout", Uint64Param(1)),
            "invalid value type for 'timeout' parameter, expected int64_param."
        );
        assert_eq!(
            refusal("priority", Int64Param(-1)),
            "invalid value for 'priority', expected value >= 0."
        );
        assert!(refusal("priority", BoolParam(true)).ends_with("int64_param or uint64_param."));
        assert!(refusal("sequence_id", Uint64Param(1)).ends_with("int64_param or string_param."));
        assert!(refusal("sequence_end", StringParam("y".into())).ends_with("bool_param."));
        assert!(refusal("triton_x", BoolParam(true)).contains("are allowed: triton_enable_empty"));
        assert!(refusal("k", Uint64Param(1)).ends_with("int64_param, bool_param, or string_param."));
        for (key, choice) in [
            ("priority", Uint64Param(3)),
            ("priority", Int64Param(3)),
            ("timeout", Int64Param(5)),
            ("sequence_id", StringParam("s".into())),
            ("sequence_start", BoolParam(true)),
            ("triton_enable_empty_final_response", BoolParam(true)),
            ("k", DoubleParam(0.5)),
        ] {
            assert!(request_from_wire(request(key, choice)).is_ok(), "{key}");
        }
    }
}
