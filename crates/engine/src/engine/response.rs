//! Shaping a model's outputs into the response clients see: the requested outputs (all when none
//! were named) in client shapes, the classification extension applied, and MLServer's
//! `content_type` carried over. Shared by every protocol through the engine.

use super::{classification, validate};
use crate::core::{DataType, Error, InferRequest, InferResponse, ParamValue, Tensor};
use crate::repository::{Model, ServingVersion};

/// Shapes the model's outputs for the client: keeps the requested ones (all when none were
/// named), restores client shapes, applies the classification extension, and stamps MLServer
/// content types.
pub(super) fn response(
    model: &Model,
    serving: &ServingVersion,
    request: InferRequest,
    outputs: Vec<Tensor>,
) -> Result<InferResponse, Error> {
    let batched = serving.io.max_batch_size > 0;
    let mut kept = Vec::with_capacity(outputs.len());
    for output in outputs {
        let Some(spec) = serving.io.output(&output.name) else {
            continue;
        };
        let requested = request.outputs.iter().find(|r| r.name == output.name);
        if requested.is_none() && !request.outputs.is_empty() {
            continue;
        }
        let mut output = validate::to_client_shape(output, spec, batched);
        let classes = requested.map(|r| r.parameters.get(classification::CLASSIFICATION));
        if let Some(k) = classification::requested_count(classes.flatten(), &output.name)? {
            let labels = model.labels.get(&output.name).map(Vec::as_slice);
            output = classification::classify(&output, k, batched, labels)?;
        }
        let content_type = output_content_type(
            requested.and_then(|r| r.parameters.get(CONTENT_TYPE)),
            request.parameters.get(CONTENT_TYPE),
            output.datatype,
        );
        if let Some(content_type) = content_type {
            output
                .parameters
                .insert(CONTENT_TYPE.into(), content_type.clone());
        }
        kept.push(output);
    }
    let mut parameters = crate::core::Parameters::new();
    if let Some(content_type) = request.parameters.get(CONTENT_TYPE) {
        parameters.insert(CONTENT_TYPE.into(), content_type.clone());
    }
    Ok(InferResponse {
        model_name: model.name.clone(),
        model_version: serving.version.to_string(),
        id: request.id,
        parameters,
        outputs: kept,
    })
}

/// MLServer's codec selector, carried from requests to responses.
const CONTENT_TYPE: &str = "content_type";

/// The `content_type` to stamp on an output so MLServer's codecs decode it: the one the client
/// asked for on that output, else the request's own when that codec can decode this datatype
/// (`np` any; `str`, `base64`, `datetime` only BYTES). Other request codecs (`pd`, ...) are
/// request-level only and are echoed on the response, not on outputs.
fn output_content_type<'a>(
    requested: Option<&'a ParamValue>,
    request_level: Option<&'a ParamValue>,
    datatype: DataType,
) -> Option<&'a ParamValue> {
    if requested.is_some() {
        return requested;
    }
    let codec = request_level?.as_str()?;
    let decodes = match codec {
        "np" => true,
        "str" | "base64" | "datetime" => datatype == DataType::Bytes,
        _ => false,
    };
    decodes.then_some(request_level?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_follow_mlserver_codecs() {
        let s = |v: &str| ParamValue::String(v.into());
        let (np, text, pd, asked) = (s("np"), s("str"), s("pd"), s("base64"));
        assert_eq!(
            output_content_type(Some(&asked), Some(&text), DataType::Fp32),
            Some(&asked)
        );
        assert_eq!(
            output_content_type(None, Some(&text), DataType::Bytes),
            Some(&text)
        );
        assert_eq!(output_content_type(None, Some(&text), DataType::Fp32), None);
        assert_eq!(
            output_content_type(None, Some(&np), DataType::Int8),
            Some(&np)
        );
        assert_eq!(output_content_type(None, Some(&pd), DataType::Bytes), None);
        assert_eq!(
            output_content_type(None, Some(&ParamValue::Bool(true)), DataType::Bytes),
            None
        );
        assert_eq!(output_content_type(None, None, DataType::Bytes), None);
    }
}
