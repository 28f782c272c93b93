//! Completions from models that take Triton's LLM tensors rather than kiln's generation loop: a
//! vLLM-style Python model (`text_input`, `stream`, `sampling_parameters` as JSON text,
//! `exclude_input_in_output`, `return_num_input_tokens`...), or a TensorRT-LLM-style ensemble
//! (`text_input`, `max_tokens`, `temperature`, `stop_words`... each its own input), as Triton's
//! OpenAI frontend drives them. The request is written as a generate body and laid into the
//! model's inputs by Triton's generic mapping (see [`mapped`]), so each setting takes the
//! datatype and shape the model declares; settings the model has no input for are left out.
//! Each response's `text_output` is a piece of the answer; `num_input_tokens`,
//! `num_output_tokens` and `finish_reason`, when the model gives them, make the usage and the
//! finish reason.

use super::super::generate::mapped;
use crate::core::tensor::BytesElements;
use crate::core::{DataType, Error, InferRequest, InferResponse, ParamValue, Tensor};
use crate::engine::generate::{Chunk, Finish, Finished};
use crate::engine::{StreamedResponse, Target};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

/// What a completion asks of the model.
pub(super) struct Ask<'a> {
    pub id: &'a str,
    pub prompt: &'a str,
    pub stream: bool,
    /// Settings by Triton's names (`max_tokens`, `temperature`, `top_p`, `seed`...).
    pub parameters: &'a [(&'static str, ParamValue)],
    pub stop: &'a [String],
}

/// A running completion: the model's responses as pieces of text.
pub(super) struct Texts {
    responses: Responses,
    prompt_tokens: usize,
    generated_tokens: usize,
    finish: Finish,
    done: bool,
}

enum Responses {
    /// A model that answers once (it is not decoupled): its answer, until read.
    One(Option<InferResponse>),
    /// A decoupled model's responses as it sends them.
    Stream(mpsc::UnboundedReceiver<StreamedResponse>),
}

/// The request `ask` makes of `target`.
///
/// # Errors
/// INVALID_ARGUMENT when a setting does not fit the model's input.
pub(super) fn request(target: &Target, ask: &Ask<'_>) -> Result<InferRequest, Error> {
    let metadata = target.metadata(false);
    let has = |name: &str| metadata.inputs.iter().any(|input| input.name == name);
    let mut body = Map::new();
    body.insert("text_input".into(), json!(ask.prompt));
    let flags = [
        ("stream", ask.stream),
        // kiln adds the prompt itself when the client asks for it (`echo`).
        ("exclude_input_in_output", true),
        ("return_num_input_tokens", true),
        ("return_num_output_tokens", true),
        ("return_finish_reason", true),
    ];
    for (name, value) in flags {
        if has(name) {
            body.insert(name.into(), json!(value));
        }
    }
    if has("sampling_parameters") {
        // vLLM's way: every setting in one JSON text.
        let mut sampling: Map<String, Value> = ask
            .parameters
            .iter()
            .map(|(key, value)| ((*key).to_string(), value.to_json()))
            .collect();
        if !ask.stop.is_empty() {
            sampling.insert("stop".into(), json!(ask.stop));
        }
        body.insert(
            "sampling_parameters".into(),
            json!(Value::Object(sampling).to_string()),
        );
    } else {
        // TensorRT-LLM's way: each setting its own input.
        for (key, value) in ask.parameters.iter().filter(|(key, _)| has(key)) {
            body.insert((*key).to_string(), value.to_json());
        }
        if let Some(name) = ["stop_words", "stop"].into_iter().find(|name| has(name)) {
            if !ask.stop.is_empty() {
                body.insert(name.into(), json!(ask.stop));
            }
        }
    }
    let encoded = serde_json::to_vec(&Value::Object(body))
        .map_err(|e| Error::Internal(format!("cannot write JSON: {e}")))?;
    let mut request = mapped::request(&metadata, "", &encoded)?;
    request.id = ask.id.to_string();
    Ok(request)
}

impl Texts {
    /// The one answer of a model that answers once.
    pub(super) fn once(response: InferResponse) -> Texts {
        Texts::of(Responses::One(Some(response)))
    }

    /// A decoupled model's responses.
    pub(super) fn streamed(responses: mpsc::UnboundedReceiver<StreamedResponse>) -> Texts {
        Texts::of(Responses::Stream(responses))
    }

    fn of(responses: Responses) -> Texts {
        Texts {
            responses,
            prompt_tokens: 0,
            generated_tokens: 0,
            finish: Finish::Stop,
            done: false,
        }
    }

    /// The next piece of text; the last carries how the answer finished. `None` after it.
    ///
    /// # Errors
    /// The model's error; UNAVAILABLE when the model stopped before its last response.
    pub async fn next(&mut self) -> Option<Result<Chunk, Error>> {
        if self.done {
            return None;
        }
        let (response, last) = match &mut self.responses {
            Responses::One(response) => (response.take(), true),
            Responses::Stream(responses) => match responses.recv().await {
                Some(StreamedResponse {
                    response: Ok(response),
                    last,
                }) => (response, last),
                Some(StreamedResponse {
                    response: Err(error),
                    ..
                }) => {
                    self.done = true;
                    return Some(Err(error));
                }
                None => {
                    self.done = true;
                    return Some(Err(Error::Unavailable(
                        "the model stopped before its last response".into(),
                    )));
                }
            },
        };
        let text = response.map_or_else(String::new, |response| self.read(&response));
        self.done = last;
        let finished = last.then_some(Finished {
            reason: self.finish,
            prompt_tokens: self.prompt_tokens,
            generated_tokens: self.generated_tokens,
        });
        Some(Ok(Chunk {
            text,
            finished,
            details: None,
        }))
    }

    /// A response's piece of text; its counts and finish reason noted.
    fn read(&mut self, response: &InferResponse) -> String {
        let output = |name: &str| response.outputs.iter().find(|t| t.name == name);
        if let Some(tokens) = output("num_input_tokens").and_then(first_count) {
            self.prompt_tokens = tokens;
        }
        if let Some(tokens) = output("num_output_tokens").and_then(first_count) {
            self.generated_tokens += tokens;
        }
        if let Some(reason) = output("finish_reason").and_then(first_text) {
            if reason == "length" {
                self.finish = Finish::Length;
            }
        }
        output("text_output")
            .and_then(first_text)
            .unwrap_or_default()
    }
}

/// The first element of a BYTES tensor, as text.
fn first_text(tensor: &Tensor) -> Option<String> {
    if tensor.datatype != DataType::Bytes {
        return None;
    }
    BytesElements::new(&tensor.data)
        .next()
        .and_then(Result::ok)
        .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
}

/// The first element of an integer tensor, as a count.
fn first_count(tensor: &Tensor) -> Option<usize> {
    let bytes = &tensor.data;
    let value = match tensor.datatype {
        DataType::Uint32 => u64::from(u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?)),
        DataType::Int32 => {
            u64::try_from(i32::from_le_bytes(bytes.get(..4)?.try_into().ok()?)).ok()?
        }
        DataType::Uint64 => u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?),
        DataType::Int64 => {
            u64::try_from(i64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?
        }
        _ => return None,
    };
    usize::try_from(value).ok()
}
