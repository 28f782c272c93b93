//! Checking an inference request against a model version's [`IoSpec`], with Triton's error texts,
//! and mapping shapes between what clients send and what the ONNX graph takes. Pure functions.

use super::visit_order::visit_order;
use super::{IoSpec, TensorSpec};
use crate::core::tensor::{
    check_bytes_framing, format_dims, shape_refusal, sized_element_count, BytesElements,
    FramingError,
};
use crate::core::{Error, InferRequest, Tensor};
use crate::invalid_arg;

/// Triton's request prefix for errors found while normalising a request.
pub fn request_prefix(id: &str) -> String {
    let id = if id.is_empty() { "<id_unknown>" } else { id };
    format!("[request id: {id}] ")
}

fn quoted_list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let quoted: Vec<String> = names.map(|n| format!("'{n}'")).collect();
    format!("[{}]", quoted.join(","))
}

/// Validates the request's inputs and requested outputs, and returns the inputs reshaped for the
/// model, in the model's order.
///
/// The checks follow Triton's: requested outputs, the input count, then a pass over the inputs
/// for their names and batch dimension, one for datatype and shape, one for their data. Where
/// several inputs are wrong, the one reported is the one Triton's core meets first
/// ([`visit_order`]).
///
/// # Errors
/// [`Error::InvalidArgument`] with Triton's message for the first problem found.
pub fn prepare_inputs(
    model: &str,
    io: &IoSpec,
    request: &mut InferRequest,
) -> Result<Vec<Tensor>, Error> {
    let prefix = request_prefix(&request.id);
    check_outputs(model, io, request, &prefix)?;
    let required = io.inputs.iter().filter(|spec| !spec.optional).count();
    // The required inputs the request leaves out.
    let missing = |request: &InferRequest| {
        io.inputs
            .iter()
            .filter(|spec| !spec.optional && !request.inputs.iter().any(|i| i.name == spec.name))
            .map(|spec| spec.name.as_str())
            .collect::<Vec<_>>()
    };
    let count_error = |request: &InferRequest| {
        // Triton's words: an exact count unless the model has optional inputs.
        let expected = if required == io.inputs.len() {
            format!("expected {required} inputs")
        } else {
            format!(
                "expected number of inputs between {required} and {}",
                io.inputs.len()
            )
        };
        let names: Vec<&str> = request.inputs.iter().map(|i| i.name.as_str()).collect();
        let got = visit_order(&names).into_iter().map(|i| names[i]);
        invalid_arg!(
            "{prefix}{expected} but got {} inputs for model '{model}'. Got input(s) {}, but missing \
             required input(s) {}. Please provide all required input(s).",
            request.inputs.len(),
            quoted_list(got),
            // Triton 2.51 writes an empty list of missing inputs as "]" (its "[" is taken off
            // with the trailing comma that is not there); clients may match its text.
            Some(quoted_list(missing(request).into_iter()))
                .filter(|m| m != "[]")
                .unwrap_or_else(|| "]".into())
        )
    };
    if request.inputs.len() > io.inputs.len() || request.inputs.len() < required {
        return Err(count_error(request));
    }
    for (index, input) in request.inputs.iter().enumerate() {
        if request.inputs[..index]
            .iter()
            .any(|earlier| earlier.name == input.name)
        {
            return Err(invalid_arg!(
                "{prefix}input '{}' is specified more than once for model '{model}'",
                input.name
            ));
        }
    }
    let batched = io.max_batch_size > 0;
    let batch = if batched {
        in_triton_order(&request.inputs, |inputs| {
            batch_size(model, io, inputs, &prefix)
        })?
    } else {
        None
    };
    if let Some(b) = batch {
        if b < 0 || b as u64 > io.max_batch_size as u64 {
            return Err(invalid_arg!(
                "{prefix}inference request batch-size must be <= {} for '{model}'",
                io.max_batch_size
            ));
        }
    }
    in_triton_order(&request.inputs, |inputs| {
        for input in inputs {
            check_declared(model, batched, io, input, &prefix)?;
        }
        Ok(())
    })?;
    // With optional inputs the count can be right and a required input still missing.
    if !missing(request).is_empty() {
        return Err(count_error(request));
    }
    in_triton_order(&request.inputs, |inputs| {
        for input in inputs {
            check_data(model, io, input, &prefix)?;
        }
        Ok(())
    })?;
    let mut inputs = std::mem::take(&mut request.inputs);
    // The model's order, so that requests batch input by input.
    inputs.sort_by_key(|input| io.inputs.iter().position(|spec| spec.name == input.name));
    Ok(inputs
        .into_iter()
        .map(|input| {
            let spec = io.input(&input.name).expect("checked above");
            to_model_shape(input, spec, batch)
        })
        .collect())
}

/// The requested outputs: each named once, each the model's.
///
/// A name asked for twice is refused first, as Triton's core refuses it while the request is
/// built (core PR #493, `InferenceRequest::AddOriginalRequestedOutput` in src/infer_request.cc;
/// the text follows its twin for inputs, `AddOriginalInput`), before normalisation finds unknown
/// names.
fn check_outputs(
    model: &str,
    io: &IoSpec,
    request: &InferRequest,
    prefix: &str,
) -> Result<(), Error> {
    for (index, output) in request.outputs.iter().enumerate() {
        if request.outputs[..index]
            .iter()
            .any(|earlier| earlier.name == output.name)
        {
            return Err(invalid_arg!(
                "{prefix}output '{}' already exists in request",
                output.name
            ));
        }
    }
    for output in &request.outputs {
        if io.output(&output.name).is_none() {
            return Err(invalid_arg!(
                "unexpected inference output '{}' for model '{model}'",
                output.name
            ));
        }
    }
    Ok(())
}

/// Runs a pass over the inputs in request order; when it finds a problem, runs it again in the
/// order Triton's core visits them, to report the problem Triton reports.
fn in_triton_order<T>(
    inputs: &[Tensor],
    pass: impl Fn(Inputs<'_, '_>) -> Result<T, Error>,
) -> Result<T, Error> {
    pass(&mut inputs.iter()).or_else(|first| {
        let names: Vec<&str> = inputs.iter().map(|input| input.name.as_str()).collect();
        let order = visit_order(&names);
        pass(&mut order.into_iter().map(|index| &inputs[index])).and(Err(first))
    })
}

/// The inputs as one pass walks them.
type Inputs<'p, 'a> = &'p mut dyn Iterator<Item = &'a Tensor>;

/// Rows a validated request adds to a batch: its batch size, or 1 for models without batching.
pub fn rows(io: &IoSpec, inputs: &[Tensor]) -> usize {
    if io.max_batch_size == 0 {
        return 1;
    }
    inputs
        .first()
        .and_then(|t| t.shape.first())
        .map_or(1, |&b| b.max(0) as usize)
}

/// The batch size the inputs of a batching model agree on, checking each is the model's: the
/// first pass of Triton's normalisation.
fn batch_size(
    model: &str,
    io: &IoSpec,
    inputs: Inputs<'_, '_>,
    prefix: &str,
) -> Result<Option<i64>, Error> {
    let mut batch = None;
    for input in inputs {
        known(model, io, input)?;
        let Some(&first) = input.shape.first() else {
            return Err(invalid_arg!(
                "{prefix}input '{}' has no shape but model requires batch dimension for '{model}'",
                input.name
            ));
        };
        match batch {
            None => batch = Some(first),
            Some(b) if b != first => {
                return Err(invalid_arg!(
                    "{prefix}input '{}' batch size does not match other inputs for '{model}'",
                    input.name
                ))
            }
            Some(_) => {}
        }
    }
    Ok(batch)
}

/// The model's spec of `input`, or Triton's refusal of a name the model does not have.
fn known<'s>(model: &str, io: &'s IoSpec, input: &Tensor) -> Result<&'s TensorSpec, Error> {
    io.input(&input.name).ok_or_else(|| {
        invalid_arg!(
            "unexpected inference input '{}' for model '{model}'",
            input.name
        )
    })
}

/// An input's name, datatype and shape against the model's: the second pass.
fn check_declared(
    model: &str,
    batched: bool,
    io: &IoSpec,
    input: &Tensor,
    prefix: &str,
) -> Result<(), Error> {
    let spec = known(model, io, input)?;
    let name = &input.name;
    if input.datatype != spec.datatype {
        return Err(invalid_arg!(
            "{prefix}inference input '{name}' data-type is '{}', but model '{model}' expects '{}'",
            input.datatype,
            spec.datatype
        ));
    }
    let dims = if batched {
        &input.shape[1..]
    } else {
        &input.shape[..]
    };
    let matches = dims.len() == spec.dims.len()
        && dims
            .iter()
            .zip(&spec.dims)
            .all(|(&got, &want)| want == -1 || got == want);
    if !matches {
        let note = if batched {
            "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be \
             prepended to each input shape. If you want to specify the full shape including the batch dim \
             in your input dims config, try setting max_batch_size to zero. See the model configuration \
             docs for more info on max_batch_size."
        } else {
            ""
        };
        let expected: Vec<i64> = batched
            .then_some(-1)
            .into_iter()
            .chain(spec.dims.iter().copied())
            .collect();
        return Err(invalid_arg!(
            "{prefix}unexpected shape for input '{name}' for model '{model}'. Expected {}, got {}. {note}",
            format_dims(&expected),
            format_dims(&input.shape)
        ));
    }
    Ok(())
}

/// An input's data against its shape (and UTF-8 for a text model's input): the third pass.
fn check_data(model: &str, io: &IoSpec, input: &Tensor, prefix: &str) -> Result<(), Error> {
    let spec = known(model, io, input)?;
    let name = &input.name;
    let count = sized_element_count(&input.shape, input.datatype.element_size())
        .map_err(|e| invalid_arg!("{prefix}{}", shape_refusal(&e, name, model, &input.shape)))?;
    match input.datatype.element_size() {
        Some(size) => {
            let expected = count as u64 * size as u64;
            if input.data.len() as u64 != expected {
                return Err(byte_size_mismatch(
                    prefix,
                    name,
                    model,
                    expected,
                    input.data.len() as u64,
                ));
            }
        }
        None => check_bytes_framing(&input.data, count).map_err(|e| match e {
            // Triton's two texts (core src/infer_request.cc, InferenceRequest::ValidateBytesInputs;
            // frozen by its qa/L0_input_validation test_input_string_shape_validation): one
            // element too many is refused as soon as it is met.
            FramingError::Count { expected, found } if found > expected => invalid_arg!(
                "{prefix}unexpected number of string elements {} for inference input '{name}' for model '{model}', expecting {expected}",
                expected + 1
            ),
            FramingError::Count { expected, found } => invalid_arg!(
                "{prefix}expected {expected} string elements for inference input '{name}' for model '{model}', got {found}"
            ),
            truncated => invalid_arg!(
                "{prefix}element byte size indicator exceeds the end of the buffer for inference input '{name}' \
                 for model '{model}' ({truncated})"
            ),
        })?,
    }
    if spec.text {
        for (index, element) in BytesElements::new(&input.data).flatten().enumerate() {
            if let Err(e) = std::str::from_utf8(element) {
                return Err(invalid_arg!(
                    "{prefix}element {index} of inference input '{name}' for model '{model}' is not valid \
                     UTF-8 text: {e}"
                ));
            }
        }
    }
    Ok(())
}

/// A fixed-size input whose data is not the size its shape says.
pub fn byte_size_mismatch(prefix: &str, name: &str, model: &str, expected: u64, got: u64) -> Error {
    invalid_arg!(
        "{prefix}input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, got {got}"
    )
}

/// Replaces the client's dims with the model's own (`reshape`, scalars), keeping the batch dim.
fn to_model_shape(mut input: Tensor, spec: &TensorSpec, batch: Option<i64>) -> Tensor {
    if let Some(model_dims) = &spec.model_dims {
        let mut shape = Vec::with_capacity(model_dims.len() + 1);
        shape.extend(batch);
        shape.extend(model_dims.iter().copied());
        input.shape = resolve_variable_dims(shape, &input.shape);
    }
    input
}

/// Fills a single -1 in a reshape target from the element count of the original shape.
fn resolve_variable_dims(mut shape: Vec<i64>, original: &[i64]) -> Vec<i64> {
    let Some(slot) = shape.iter().position(|&d| d == -1) else {
        return shape;
    };
    let total: i64 = original.iter().product();
    let known: i64 = shape.iter().filter(|&&d| d != -1).product();
    shape[slot] = if known == 0 { 0 } else { total / known };
    shape
}

/// Maps a model output back to the dims clients see (`reshape`, scalars).
pub fn to_client_shape(mut output: Tensor, spec: &TensorSpec, batched: bool) -> Tensor {
    if spec.model_dims.is_some() {
        let batch = if batched {
            output.shape.first().copied()
        } else {
            None
        };
        let mut shape: Vec<i64> = batch.into_iter().chain(spec.dims.iter().copied()).collect();
        if shape.contains(&-1) {
            shape = resolve_variable_dims(shape, &output.shape);
        }
        output.shape = shape;
    }
    output
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tensor::element_count;
    use crate::core::tensor::frame_bytes;
    use crate::core::{DataType, RequestedOutput};
    use bytes::Bytes;

    fn add_sub() -> IoSpec {
        IoSpec {
            max_batch_size: 8,
            inputs: vec![
                TensorSpec::new("INPUT0", DataType::Fp32, &[16]),
                TensorSpec::new("INPUT1", DataType::Fp32, &[16]),
            ],
            outputs: vec![
                TensorSpec::new("OUTPUT0", DataType::Fp32, &[16]),
                TensorSpec::new("OUTPUT1", DataType::Fp32, &[16]),
            ],
        }
    }

    fn fp32(name: &str, shape: &[i64]) -> Tensor {
        let count = element_count(shape).unwrap();
        Tensor::new(
            name,
            DataType::Fp32,
            shape.to_vec(),
            Bytes::from(vec![0u8; count * 4]),
        )
    }

    fn request(inputs: Vec<Tensor>) -> InferRequest {
        InferRequest {
            model_name: "add_sub".into(),
            inputs,
            ..Default::default()
        }
    }

    fn err(io: &IoSpec, mut req: InferRequest) -> String {
        prepare_inputs("add_sub", io, &mut req)
            .unwrap_err()
            .message()
            .to_string()
    }

    #[test]
    fn valid_request_passes() {
        let mut req = request(vec![fp32("INPUT1", &[2, 16]), fp32("INPUT0", &[2, 16])]);
        let inputs = prepare_inputs("add_sub", &add_sub(), &mut req).unwrap();
        let names: Vec<&str> = inputs.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, vec!["INPUT0", "INPUT1"], "model order");
        assert_eq!(inputs[0].shape, vec![2, 16]);
        assert_eq!(rows(&add_sub(), &inputs), 2);
        let unbatched = IoSpec {
            max_batch_size: 0,
            ..add_sub()
        };
        assert_eq!(rows(&unbatched, &inputs), 1);
    }

    #[test]
    fn optional_inputs_may_be_left_out() {
        let mut io = add_sub();
        io.inputs[1].optional = true;
        let mut req = request(vec![fp32("INPUT0", &[1, 16])]);
        let inputs = prepare_inputs("add_sub", &io, &mut req).unwrap();
        assert_eq!(inputs.len(), 1);
        assert_eq!(
            err(&io, request(vec![fp32("INPUT1", &[1, 16])])),
            "[request id: <id_unknown>] expected number of inputs between 1 and 2 but got 1 inputs \
             for model 'add_sub'. Got input(s) ['INPUT1'], but missing required input(s) \
             ['INPUT0']. Please provide all required input(s)."
        );
        assert!(err(&io, request(vec![])).starts_with(
            "[request id: <id_unknown>] expected number of inputs between 1 and 2 but got 0"
        ));
    }

    #[test]
    fn unknown_and_missing_inputs() {
        let io = add_sub();
        assert_eq!(
            err(
                &io,
                request(vec![fp32("INPUT0", &[1, 16]), fp32("Z", &[1, 16])])
            ),
            "unexpected inference input 'Z' for model 'add_sub'"
        );
        assert_eq!(
            err(&io, request(vec![fp32("INPUT0", &[1, 16])])),
            "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) \
             ['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all required input(s)."
        );
        assert!(err(&io, request(vec![]))
            .contains("Got input(s) [], but missing required input(s) ['INPUT0','INPUT1']"));
        assert!(err(
            &io,
            request(vec![fp32("INPUT0", &[1, 16]), fp32("INPUT0", &[1, 16])])
        )
        .contains("more than once"));
        let three = vec![
            fp32("INPUT0", &[1, 16]),
            fp32("INPUT1", &[1, 16]),
            fp32("INPUT2", &[1, 16]),
        ];
        assert!(err(&io, request(three)).starts_with(
            "[request id: <id_unknown>] expected 2 inputs but got 3 inputs for model 'add_sub'. \
             Got input(s) ['INPUT2','INPUT1','INPUT0'], but missing required input(s) ]."
        ));
    }

    #[test]
    fn unknown_output() {
        let mut req = request(vec![fp32("INPUT0", &[1, 16]), fp32("INPUT1", &[1, 16])]);
        req.outputs.push(RequestedOutput {
            name: "NOPE".into(),
            ..Default::default()
        });
        assert_eq!(
            err(&add_sub(), req),
            "unexpected inference output 'NOPE' for model 'add_sub'"
        );
    }

    #[test]
    fn an_output_asked_for_twice_is_refused_before_unknown_ones() {
        let mut req = request(vec![fp32("INPUT0", &[1, 16]), fp32("INPUT1", &[1, 16])]);
        for name in ["OUTPUT1", "NOPE", "OUTPUT1"] {
            req.outputs.push(RequestedOutput {
                name: name.into(),
                ..Default::default()
            });
        }
        req.id = "r1".into();
        assert_eq!(
            err(&add_sub(), req),
            "[request id: r1] output 'OUTPUT1' already exists in request"
        );
    }

    #[test]
    fn datatype_mismatch_uses_request_id() {
        let mut req = request(vec![fp32("INPUT0", &[1, 16]), fp32("INPUT1", &[1, 16])]);
        req.id = "r7".into();
        req.inputs[1].datatype = DataType::Fp64;
        req.inputs[1].data = Bytes::from(vec![0u8; 128]);
        assert_eq!(
            err(&add_sub(), req),
            "[request id: r7] inference input 'INPUT1' data-type is 'FP64', but model 'add_sub' expects 'FP32'"
        );
    }

    #[test]
    fn shape_mismatch_has_batch_note() {
        let message = err(
            &add_sub(),
            request(vec![fp32("INPUT0", &[1, 4]), fp32("INPUT1", &[1, 16])]),
        );
        assert!(message.starts_with(
            "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,4]. NOTE: Setting a non-zero max_batch_size"
        ));
        let message = err(
            &add_sub(),
            request(vec![fp32("INPUT0", &[2]), fp32("INPUT1", &[2])]),
        );
        assert!(message.contains("Expected [-1,16], got [2]"));
    }

    #[test]
    fn batch_limits() {
        let io = add_sub();
        assert_eq!(
            err(
                &io,
                request(vec![fp32("INPUT0", &[9, 16]), fp32("INPUT1", &[9, 16])])
            ),
            "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'add_sub'"
        );
        assert!(err(
            &io,
            request(vec![fp32("INPUT0", &[2, 16]), fp32("INPUT1", &[3, 16])])
        )
        .contains("batch size does not match"));
        let scalar = Tensor::new("INPUT0", DataType::Fp32, vec![], Bytes::new());
        assert!(err(&io, request(vec![scalar, fp32("INPUT1", &[1, 16])]))
            .contains("has no shape but model requires batch dimension"));
        let mut req = request(vec![fp32("INPUT0", &[0, 16]), fp32("INPUT1", &[0, 16])]);
        assert!(prepare_inputs("add_sub", &io, &mut req).is_ok());
    }

    #[test]
    fn of_several_wrong_inputs_the_one_triton_meets_first_is_named() {
        let fp64 = |name: &str| {
            let mut t = fp32(name, &[1, 16]);
            t.datatype = DataType::Fp64;
            t.data = Bytes::from(vec![0u8; 128]);
            t
        };
        // Both FP64: Triton's core (its hash map) visits the input added last first here.
        for (inputs, named) in [
            (vec![fp64("INPUT0"), fp64("INPUT1")], "INPUT1"),
            (vec![fp64("INPUT1"), fp64("INPUT0")], "INPUT0"),
        ] {
            assert!(err(&add_sub(), request(inputs))
                .contains(&format!("inference input '{named}' data-type is 'FP64'")));
        }
        // Datatype and shape are checked on every input before any input's data.
        let mut short = fp32("INPUT0", &[1, 16]);
        short.data = Bytes::from(vec![0u8; 60]);
        assert!(
            err(&add_sub(), request(vec![short, fp32("INPUT1", &[1, 15])]))
                .contains("unexpected shape for input 'INPUT1'")
        );
        // Batch sizes: the input met second is the odd one.
        assert!(err(
            &add_sub(),
            request(vec![fp32("INPUT0", &[2, 16]), fp32("INPUT1", &[1, 16])])
        )
        .contains("input 'INPUT0' batch size does not match other inputs"));
    }

    #[test]
    fn byte_size_mismatch() {
        let mut short = fp32("INPUT1", &[1, 16]);
        short.data = Bytes::from(vec![0u8; 60]);
        assert_eq!(
            err(&add_sub(), request(vec![fp32("INPUT0", &[1, 16]), short])),
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model 'add_sub'. Expected 64, got 60"
        );
    }

    #[test]
    fn overflowing_and_negative_shapes_never_allocate() {
        let io = IoSpec {
            max_batch_size: 0,
            inputs: vec![TensorSpec::new("X", DataType::Fp32, &[-1, -1])],
            outputs: vec![],
        };
        let huge = Tensor::new(
            "X",
            DataType::Fp32,
            vec![1 << 40, 1 << 40],
            Bytes::from_static(&[0; 4]),
        );
        assert_eq!(
            err(&io, request(vec![huge])),
            "[request id: <id_unknown>] input 'X' for model 'add_sub' with shape \
             [1099511627776,1099511627776] causes total element count to exceed maximum size of \
             9223372036854775807"
        );
        let wide = Tensor::new("X", DataType::Fp32, vec![1, 1 << 62], Bytes::new());
        assert_eq!(
            err(&io, request(vec![wide])),
            "[request id: <id_unknown>] byte size overflow for input 'X' for model 'add_sub' with \
             shape [1,4611686018427387904]: byte size exceeds maximum size of 9223372036854775807"
        );
        let negative = Tensor::new("X", DataType::Fp32, vec![-5, 16], Bytes::new());
        assert!(err(&io, request(vec![negative])).contains("negative"));
        let io = add_sub();
        let neg_batch = vec![fp32("INPUT0", &[0, 16]), fp32("INPUT1", &[0, 16])]
            .into_iter()
            .map(|mut t| {
                t.shape[0] = -3;
                t
            })
            .collect();
        assert!(err(&io, request(neg_batch)).contains("batch-size must be <= 8"));
    }

    #[test]
    fn bytes_inputs_are_checked_for_framing() {
        let io = IoSpec {
            max_batch_size: 0,
            inputs: vec![TensorSpec::new("S", DataType::Bytes, &[-1])],
            outputs: vec![],
        };
        let good = Tensor::new(
            "S",
            DataType::Bytes,
            vec![2],
            frame_bytes([&b"a"[..], b"bc"]),
        );
        assert!(prepare_inputs("m", &io, &mut request(vec![good])).is_ok());
        let short = Tensor::new(
            "S",
            DataType::Bytes,
            vec![3],
            frame_bytes([&b"a"[..], b"bc"]),
        );
        assert!(err(&io, request(vec![short])).contains(
            "expected 3 string elements for inference input 'S' for model 'add_sub', got 2"
        ));
        let long = Tensor::new(
            "S",
            DataType::Bytes,
            vec![1],
            frame_bytes([&b"a"[..], b"bc", b"d"]),
        );
        assert_eq!(
            err(&io, request(vec![long])),
            "[request id: <id_unknown>] unexpected number of string elements 2 for inference \
             input 'S' for model 'add_sub', expecting 1"
        );
        let truncated = Tensor::new(
            "S",
            DataType::Bytes,
            vec![1],
            Bytes::from_static(&[9, 0, 0, 0, b'x']),
        );
        assert!(err(&io, request(vec![truncated])).contains("declares 9 bytes"));
    }

    #[test]
    fn reshape_and_scalar_mapping() {
        let mut reshaped = TensorSpec::new("X", DataType::Fp32, &[2, 2]);
        reshaped.model_dims = Some(vec![4]);
        let io = IoSpec {
            max_batch_size: 4,
            inputs: vec![reshaped.clone()],
            outputs: vec![],
        };
        let mut req = request(vec![fp32("X", &[3, 2, 2])]);
        assert_eq!(
            prepare_inputs("m", &io, &mut req).unwrap()[0].shape,
            vec![3, 4]
        );
        let out = to_client_shape(fp32("X", &[3, 4]), &reshaped, true);
        assert_eq!(out.shape, vec![3, 2, 2]);

        let mut scalar = TensorSpec::new("S", DataType::Fp32, &[1]);
        scalar.model_dims = Some(vec![]);
        let io = IoSpec {
            max_batch_size: 0,
            inputs: vec![scalar.clone()],
            outputs: vec![],
        };
        let mut req = request(vec![fp32("S", &[1])]);
        assert_eq!(
            prepare_inputs("m", &io, &mut req).unwrap()[0].shape,
            Vec::<i64>::new()
        );
        assert_eq!(
            to_client_shape(fp32("S", &[]), &scalar, false).shape,
            vec![1]
        );
    }
}
